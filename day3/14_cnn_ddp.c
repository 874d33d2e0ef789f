// Step 14: a convolutional network under DDP.      PyTorch twin: the torchrun tutorial's train.py
//
// What it changes from step 6 (diff the two files): the model. DDP does not
// care what it trains: ddp_wrap() takes the CNN's parameter list as it took
// the MLP's, and backward starts each bucket's allreduce as it goes. The
// model is the tutorial's SimpleCNN (common/models/cnn.h):
//   nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
//                 nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
//                 nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
// trained with Adam (lr 1e-3) at batch 64 per rank for one epoch. Each
// convolution is im2col + one GEMM (common/models/conv.h). At the end, every rank
// evaluates its share of the test set and rank 0 prints what the tutorial's
// Trainer reports: test loss and accuracy, per-class precision, recall and
// F1, and the confusion matrix. --max_steps N stops after N optimizer steps
// (Hugging Face's max_steps: it overrides --epochs). On GPUs the step is
// replayed from a CUDA graph (--cuda_graph, as in steps 2 and 15), DDP's
// NCCL allreduces on their own stream inside it.
//
// Build and run:
//   make day3/14_cnn_ddp
//   mpirun -np 2 day3/14_cnn_ddp                     (add --oversubscribe on fewer cores)
//   day3/14_cnn_ddp                                  # one process, on every core
//   day3/14_cnn_ddp --max_steps 100 --plot ''        # a quick look
//
// Expected output (2 ranks on 2 cores, OpenBLAS's SkylakeX kernels: after a whole epoch
// the losses and the metrics depend on the kernels too; times vary):
//   Step 14: DDP on 2 ranks: SimpleCNN, 421642 weights in 1 bucket: [network.9.bias .. network.0.weight, 1.69 MB]; Adam lr 0.001; batch 64 per rank; 1 epoch; shuffle on (seed 0); cpu, 1 thread per rank, ...
//   epoch 1/1: mean loss 0.2207 over 469 steps, 21.30 s, 2818 samples/s
//   World Size: 2. Training completed in 21.30 seconds (469 steps). Test loss 0.0601, accuracy 98.01% (9801 of 10000)
//          class  precision     recall   f1-score  support
//              0     0.9857     0.9878     0.9867      980
//   ...
//       accuracy                           0.9801    10000
//      macro avg     0.9800     0.9801     0.9799    10000
//   weighted avg     0.9803     0.9801     0.9801    10000
//   Confusion matrix (rows: the true class, columns: the predicted one):
//    true \ pred     0     1     2     3     4     5     6     7     8     9
//              0   968     0     3     0     0     3     4     1     1     0
//   ...
//   DDP: gradient allreduce 2.13 ms per step in 1 bucket, 0.26 ms (12%) of it hidden behind backward; the step waited 1.89 ms for it
//   [rank 0] parameter checksum 6d7934d850dfa7d4
//   [rank 1] parameter checksum 6d7934d850dfa7d4
//   Loss curve: img/14_cnn_ddp.png
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK_MPI, xmalloc: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "data/mnist.h"             // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/cnn.h"             // Cnn, its forward, loss, backward and evaluation; Adam (nn.h): model and optimizer
#include "parallel/ddp.h"           // ddp_wrap, ddp_grad_ready, ddp_finish: DistributedDataParallel
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"       // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "train/divergence.h"       // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_graph.h"       // StepGraph: the step replayed from a CUDA graph on a GPU (--cuda_graph)
#include "train/step_losses.h"      // step_losses_take_all: each step's loss, read when the program prints
#include "train/metrics.h"          // ConfusionMatrix, classification_report: the evaluation's tables
#include "train/train_options.h"    // TrainOptions, TRAIN_FLAGS: the flags every training program takes

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/14_cnn_ddp.png");
    opt.epochs = 1;       // the tutorial's train.py: one epoch
    opt.batch_size = 64;  // of 64 images per rank
    double bucket_mb = 25.0;  // PyTorch's default bucket_cap_mb
    int max_steps = -1;
    const char *cuda_graph = "on";
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "gradient bucket size, as PyTorch's bucket_cap_mb; 0: one bucket per tensor", 0, NULL},
        {"max_steps", ARG_INT, &max_steps, "N", "stop after N optimizer steps, overriding --epochs (-1: --epochs decides)", -1, NULL},
        {"cuda_graph", ARG_STRING, &cuda_graph, "on|off", "on a GPU, each step replayed from a CUDA graph captured once (torch.cuda.graphs)", 0, "on|off"},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 14: a convolutional network (the torchrun tutorial's SimpleCNN) under DDP, with evaluation metrics.");
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    MemoryNeed need = memory_need("--batch_size %d", opt.batch_size);
    cnn_add_memory_need(&need, opt.batch_size);  // about 1 MB a sample
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);
    Tracking *run = tracking_start(&opt.tracking, "day3/14_cnn_ddp.c", device_name(device), NULL, args_values());  // mlflow.start_run(); mlflow.log_params(vars(args))
    int rank = dist_rank(), world = dist_world_size();

    // Data: 60000 training and 10000 test images, pixels / 255 as float32.
    MnistSplit train = mnist_load(opt.data, MNIST_TRAIN);
    MnistSplit test = mnist_load(opt.data, MNIST_TEST);
    // Each rank takes its 1/W share: positions rank, rank + W, rank + 2W, ...
    DistributedSampler sampler = sampler_new(train.n, world, rank, !opt.no_shuffle, (uint64_t)opt.seed);
    int steps_per_epoch = sampler_num_batches(&sampler, opt.batch_size);
    int epochs = max_steps < 0 ? opt.epochs : (max_steps + steps_per_epoch - 1) / steps_per_epoch;

    // Model and optimizer.
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);  // torch.manual_seed(seed)
    Cnn *model = cnn_new(opt.batch_size, &rng, device);  // model = SimpleCNN()
    if (opt.init) h5_load_params(opt.init, model->params, model->n_params);
    Ddp ddp = ddp_wrap(model->params, model->n_params, bucket_mb);  // model = DDP(model)
    Adam optimizer = adam_new(model->params, model->n_params, opt.lr);

    char buckets[512], steps_text[64] = "";
    ddp_describe_buckets(&ddp, buckets, sizeof buckets);
    if (max_steps >= 0) snprintf(steps_text, sizeof steps_text, " (--max_steps %d)", max_steps);
    print0("Step 14: DDP on %d rank%s: SimpleCNN, %zu weights in %s; Adam lr %g; batch %d per rank; %d epoch%s%s; shuffle %s (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", cnn_num_weights(model), buckets, opt.lr, opt.batch_size, epochs, epochs == 1 ? "" : "s", steps_text, opt.no_shuffle ? "off" : "on", opt.seed,
           device_name(device), threads_describe());

    Tensor batch_images = tensor_zeros(opt.batch_size, MNIST_PIXELS, device);  // [B, 784]: B images of 1 x 28 x 28
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]
    LossLog losses = {0};
    // Each step's loss stays on the GPU until the epoch's end (step_losses.h): no step waits for it.
    StepLosses pending = step_losses_new(steps_per_epoch, device);
    // On a GPU the step is captured into a CUDA graph and replayed: one launch a step, not ~50
    // (step_graph.h: the epoch's last, shorter batch runs eagerly, and so does the first, a warm-up).
    // DDP's NCCL allreduces are captured with it, on their stream (as torch.cuda.graphs allows);
    // where ranks share a GPU, DDP reduces through MPI on host copies, which no graph can hold:
    // those steps run eagerly.
    bool graph_wanted = strcmp(cuda_graph, "on") == 0 && device == DEVICE_CUDA;
    StepGraph graph = step_graph_new(device, graph_wanted && (world == 1 || ddp.nccl), world > 1);

    int steps = 0;
    double train_start = wall_seconds();
    for (int epoch = 0; epoch < epochs; epoch++) {
        double epoch_start = wall_seconds();
        sampler_set_epoch(&sampler, epoch);
        int epoch_steps = 0;
        long samples = 0;
        double loss_sum = 0.0;
        for (int b = 0; b < steps_per_epoch && steps != max_steps; b++) {
            Tensor x = mnist_batch(&train, &sampler, b, opt.batch_size, &batch_images, batch_labels);  // [rows, 784]
            adam_prepare_step(&optimizer);                // (the step's Adam coefficients, on the GPU before the graph)
            if (!step_graph_replay(&graph, x.rows)) {     // g.replay(), where the graph holds this batch's shape
                step_graph_begin(&graph, x.rows);         // (with torch.cuda.graph(g): once, after a warm-up step)
                cnn_zero_grad(model);                     // optimizer.zero_grad()
                cnn_forward(model, &x);                   // output = model(data)
                cnn_loss_to(model, batch_labels, mnist_batch_device_labels(&train),  // loss = criterion(output, target)
                            step_graph_loss(&graph));
                cnn_backward(model, ddp_grad_ready, &ddp);  // loss.backward(): buckets start here
                ddp_finish(&ddp);                         // all buckets reduced, grads averaged
                adam_apply_step(&optimizer);              // optimizer.step()
                step_graph_end(&graph);
            }
            step_graph_hand_loss(&graph, step_losses_next(&pending));  // losses.append(loss.detach())
            samples += (long)x.rows * world;
            epoch_steps++;
            steps++;
            // loss.item(): at once on a CPU, for the whole epoch at its end on a GPU.
            float *taken;
            int n_taken = step_losses_take_all(&pending, b == steps_per_epoch - 1 || steps == max_steps, &taken);
            dist_allreduce_sum(taken, (size_t)n_taken);  // for the log: each step's loss of the global batch, in one call
            for (int i = 0; i < n_taken; i++) {
                float loss = taken[i] / (float)world;
                check_loss_finite(loss, losses.n + 1, epoch + 1, run);  // the sum above spread any nan to every rank
                loss_log_add(&losses, epoch, loss);
                tracking_log_metric(run, "loss", loss, losses.n - 1);  // mlflow.log_metric("loss", loss, step=step)
                loss_sum += loss;
            }
        }
        double seconds = wall_seconds() - epoch_start;
        print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s\n", epoch + 1, epochs,
               epoch_steps ? loss_sum / epoch_steps : 0.0, epoch_steps, epoch_steps == 1 ? "" : "s", seconds, samples / seconds);
        tracking_log_metric(run, "epoch_mean_loss", epoch_steps ? loss_sum / epoch_steps : 0.0, epoch);
        tracking_log_metric(run, "samples_per_second", samples / seconds, epoch);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    step_graph_report(&graph, graph_wanted, steps, world, "DDP's allreduces");
    check_weights_finite(model->params, model->n_params, losses.n, epochs, run);  // the last step's update

    // Evaluation: rank r takes test images [r N / W, (r + 1) N / W), and the
    // counts and loss sums are added up on rank 0 (torch.distributed.reduce).
    Tensor test_images = mnist_images(&test, device);  // [10000, 784]
    int first = (int)((long)test.n * rank / world), end = (int)((long)test.n * (rank + 1) / world);
    Tensor shard = {.data = test_images.data + (size_t)first * MNIST_PIXELS, .rows = end - first,
                    .cols = MNIST_PIXELS, .device = device};  // [N / W, 784]: this rank's images
    int *predictions = xmalloc((size_t)(end - first + 1) * sizeof(int));
    double test_loss = cnn_evaluate(model, &shard, test.labels + first, predictions);  // with torch.no_grad()
    ConfusionMatrix confusion = confusion_new(MNIST_CLASSES);
    confusion_add(&confusion, test.labels + first, predictions, end - first);
    CHECK_MPI(MPI_Reduce(rank == 0 ? MPI_IN_PLACE : &test_loss, &test_loss, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Reduce(rank == 0 ? MPI_IN_PLACE : confusion.counts, confusion.counts, MNIST_CLASSES * MNIST_CLASSES,
                         MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD));
    long correct = confusion_correct(&confusion);
    check_result_finite(test_loss / test.n, "test loss", epochs, run);  // rank 0's sum; collective
    print0("World Size: %d. Training completed in %.2f seconds (%d step%s). Test loss %.4f, accuracy %.2f%% (%ld of %d)\n",
           world, train_seconds, steps, steps == 1 ? "" : "s", test_loss / test.n, 100.0 * correct / test.n, correct, test.n);
    tracking_log_metric(run, "test_loss", test_loss / test.n, epochs);  // rank 0's sums are the world's
    tracking_log_metric(run, "test_accuracy", (double)correct / test.n, epochs);
    if (rank == 0) {
        char table[2048];
        classification_report(&confusion, table, sizeof table);
        print0("%s", table);
        confusion_table(&confusion, table, sizeof table);
        print0("Confusion matrix (rows: the true class, columns: the predicted one):\n%s", table);
    }
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    print0("DDP: %s\n", overlap);
    print_rank("parameter checksum %016llx\n", params_checksum(model->params, model->n_params));

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.save) h5_save_params(opt.save, model->params, model->n_params);
    if (rank == 0 && opt.plot && *opt.plot && losses.n > 0) {
        char title[80], label[32];
        snprintf(title, sizeof title, "Step 14: SimpleCNN training loss, DDP on %d rank%s", world, world == 1 ? "" : "s");
        snprintf(label, sizeof label, "%d rank%s (mean loss)", world, world == 1 ? "" : "s");
        loss_log_plot(&losses, opt.plot, title, label);
        print0("Loss curve: %s\n", opt.plot);
    }
    tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
    tracking_log_artifact(run, opt.save);
    tracking_log_artifact(run, opt.plot);
    tracking_end(run, TRACKING_FINISHED);    // mlflow.end_run()

    confusion_free(&confusion);
    free(predictions);
    tensor_free(&test_images);
    tensor_free(&batch_images);
    free(batch_labels);
    loss_log_free(&losses);
    step_losses_free(&pending);
    step_graph_free(&graph);
    adam_free(&optimizer);
    ddp_free(&ddp);
    cnn_free(model);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    dist_finalize();
    return 0;
}
