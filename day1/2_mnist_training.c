// Step 2: train the MLP on MNIST in one process.             PyTorch twin: 2_mnist_training.py
//
// What it teaches: the training loop that every later step distributes.
//   for each epoch, for each batch: zero_grad, forward, loss, backward, step
// The model is the workshop's Net, Linear(784, 128), ReLU, Linear(128, 10),
// trained with Adam (lr 1e-3) on batches of 6400 images for 5 epochs, the data
// reshuffled every epoch. Weights and data order are drawn exactly as PyTorch
// draws them after torch.manual_seed(seed).
//
// Build and run:
//   make day1/2_mnist_training
//   day1/2_mnist_training                          # no mpirun needed: one process
//   day1/2_mnist_training --epochs 1 --losses losses.csv --save weights.h5
//
// Expected output (times vary with the machine):
//   Step 2: MLP 784-128-10, 101770 weights; Adam lr 0.001; batch 6400; 5 epochs; shuffle on (seed 0); cpu, 2 threads, OpenBLAS 0.3.21 (SkylakeX kernels)
//   epoch 1/5: mean loss 1.9859 over 10 steps, 0.11 s, 545760 samples/s
//   ...
//   epoch 5/5: mean loss 0.4724 over 10 steps, 0.10 s, 577285 samples/s
//   Training completed in 0.52 s. Test accuracy: 89.14% (8914 of 10000)
//   Loss curve: img/2_mnist_training.png
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "data/mnist.h"             // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"              // Mlp, its forward and backward, Adam, SGD: model and optimizer
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"       // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "train/divergence.h"       // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_graph.h"       // StepGraph: the step replayed from a CUDA graph on a GPU (--cuda_graph)
#include "train/step_losses.h"      // step_losses_take: each step's loss, read when the program prints
#include "train/train_options.h"    // TrainOptions, TRAIN_FLAGS: the flags every training program takes

int main(int argc, char **argv) {
    dist_init(&argc, &argv);  // a world of one: MPI only so that every step shares one skeleton
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/2_mnist_training.png");
    const char *cuda_graph = "on";
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"cuda_graph", ARG_STRING, &cuda_graph, "on|off", "on a GPU, each step replayed from a CUDA graph captured once (torch.cuda.graphs)", 0, "on|off"},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 2: train the MLP on MNIST in one process.");
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES};
    MemoryNeed need = memory_need("--batch_size %d", opt.batch_size);
    mlp_add_memory_need(&need, sizes, ARRAY_LEN(sizes), opt.batch_size, 2);  // Adam: 2 moments per weight
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);
    Tracking *run = tracking_start(&opt.tracking, "day1/2_mnist_training.c", device_name(device), NULL, args_values());  // mlflow.start_run(); mlflow.log_params(vars(args))

    // Data: 60000 training and 10000 test images, pixels / 255 as float32.
    MnistSplit train = mnist_load(opt.data, MNIST_TRAIN);
    MnistSplit test = mnist_load(opt.data, MNIST_TEST);
    // One rank: the distributed sampler is a plain per-epoch shuffle.
    DistributedSampler sampler = sampler_new(train.n, 1, 0, !opt.no_shuffle, (uint64_t)opt.seed);

    // Model and optimizer.
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);  // torch.manual_seed(seed)
    Mlp model = mlp_new(sizes, ARRAY_LEN(sizes), opt.batch_size, &rng, device);
    if (opt.init) h5_load_params(opt.init, model.params, model.n_params);
    Adam optimizer = adam_new(model.params, model.n_params, opt.lr);

    print0("Step 2: MLP 784-128-10, %zu weights; Adam lr %g; batch %d; %d epoch%s; shuffle %s (seed %d); %s, %s%s\n",
           mlp_num_weights(&model), opt.lr, opt.batch_size, opt.epochs, opt.epochs == 1 ? "" : "s", opt.no_shuffle ? "off" : "on", opt.seed,
           device_name(device), threads_describe(), matmul_dtype() == MATMUL_BFLOAT16 ? "; matmuls in bfloat16" : "");

    Tensor batch_images = tensor_zeros(opt.batch_size, MNIST_PIXELS, device);  // [B, 784]
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]
    LossLog losses = {0};
    // Each step's loss stays on the GPU until the epoch's end (step_losses.h): no step waits for it.
    StepLosses pending = step_losses_new(sampler_num_batches(&sampler, opt.batch_size), device);
    // On a GPU the step is captured once into a CUDA graph and replayed: one launch a step, not ~20
    // (step_graph.h: the epoch's last, shorter batch runs eagerly, and so does the first, a warm-up).
    StepGraph graph = step_graph_new(device, strcmp(cuda_graph, "on") == 0, false);

    double train_start = wall_seconds();
    for (int epoch = 0; epoch < opt.epochs; epoch++) {
        double epoch_start = wall_seconds();
        sampler_set_epoch(&sampler, epoch);
        int n_batches = sampler_num_batches(&sampler, opt.batch_size);
        double loss_sum = 0.0;
        for (int b = 0; b < n_batches; b++) {
            Tensor x = mnist_batch(&train, &sampler, b, opt.batch_size, &batch_images, batch_labels);  // [rows, 784]
            adam_prepare_step(&optimizer);                 // (the step's Adam coefficients, on the GPU before the graph)
            if (!step_graph_replay(&graph, x.rows)) {      // g.replay(), where the graph holds this batch's shape
                step_graph_begin(&graph, x.rows);          // (with torch.cuda.graph(g): once, after a warm-up step)
                mlp_zero_grad(&model);                     // optimizer.zero_grad()
                mlp_forward(&model, &x);                   // output = model(data)
                mlp_loss_to(&model, batch_labels, mnist_batch_device_labels(&train),  // loss = criterion(output, target)
                            step_graph_loss(&graph));
                mlp_backward(&model, &x, NULL, NULL);      // loss.backward()
                adam_apply_step(&optimizer);               // optimizer.step()
                step_graph_end(&graph);
            }
            step_graph_hand_loss(&graph, step_losses_next(&pending));  // losses.append(loss.detach())
            // loss.item(): at once on a CPU, for the whole epoch at its end on a GPU.
            for (float loss; step_losses_take(&pending, b == n_batches - 1, &loss);) {
                check_loss_finite_agreed(loss, losses.n + 1, epoch + 1, run);  // PyTorch would go on with nan
                loss_log_add(&losses, epoch, loss);
                tracking_log_metric(run, "loss", loss, losses.n - 1);  // mlflow.log_metric("loss", loss, step=step)
                loss_sum += loss;
            }
        }
        double seconds = wall_seconds() - epoch_start;
        print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s\n", epoch + 1, opt.epochs,
               loss_sum / n_batches, n_batches, n_batches == 1 ? "" : "s", seconds, sampler.num_samples / seconds);
        tracking_log_metric(run, "epoch_mean_loss", loss_sum / n_batches, epoch);
        tracking_log_metric(run, "samples_per_second", sampler.num_samples / seconds, epoch);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    if (graph.enabled)
        print0("CUDA graph: %ld of %ld steps replayed from one capture (--cuda_graph off: each kernel launched by itself)\n",
               graph.replays, optimizer.step);
    check_weights_finite(model.params, model.n_params, losses.n, opt.epochs, run);  // the last step's update

    Tensor test_images = mnist_images(&test, device);  // [10000, 784]
    double accuracy = mlp_accuracy(&model, &test_images, test.labels);
    print0("Training completed in %.2f s. Test accuracy: %.2f%% (%.0f of %d)\n", train_seconds, 100 * accuracy,
           accuracy * test.n, test.n);
    tracking_log_metric(run, "test_accuracy", accuracy, opt.epochs);

    if (opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (opt.save) h5_save_params(opt.save, model.params, model.n_params);
    if (opt.plot && *opt.plot) {
        loss_log_plot(&losses, opt.plot, "Step 2: MNIST training loss, one process", "1 process");
        print0("Loss curve: %s\n", opt.plot);
    }
    tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
    tracking_log_artifact(run, opt.save);
    tracking_log_artifact(run, opt.plot);
    tracking_end(run, TRACKING_FINISHED);    // mlflow.end_run()

    tensor_free(&test_images);
    tensor_free(&batch_images);
    free(batch_labels);
    loss_log_free(&losses);
    step_losses_free(&pending);
    step_graph_free(&graph);
    adam_free(&optimizer);
    mlp_free(&model);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    dist_finalize();
    return 0;
}
