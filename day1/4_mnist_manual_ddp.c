// Step 4: data parallelism by hand.                          PyTorch twin: 4_mnist_manual_ddp.py
//
// What it adds over step 2 (diff the two files):
//   - a DistributedSampler: rank r of W takes positions r, r + W, ... of the
//     epoch's (shuffled) order, so an epoch takes 1/W of the steps per rank;
//   - every rank starts from rank 0's weights (one broadcast per parameter);
//   - after backward, every gradient is summed over the ranks (allreduce) and
//     divided by W: each rank then holds the gradient of the global batch of
//     W x batch_size samples, takes the same optimizer step, and the models
//     stay identical;
//   - lr = 0.001 x W, as in the original: the global batch is W times larger.
// With --no-shuffle, W ranks with batch B take the steps of one process with
// batch W x B and lr W x 0.001, up to float rounding (tests/test_integration.sh
// checks it).
//
// Build and run:
//   make day1/4_mnist_manual_ddp
//   mpirun -np 2 day1/4_mnist_manual_ddp           (add --oversubscribe on fewer cores)
//
// Expected output (times vary):
//   Step 4: manual DDP on 2 ranks: MLP 784-128-10, ...; Adam lr 0.001 x 2 = 0.002; batch 6400 per rank; ...
//   epoch 1/5: mean loss 2.0330 over 5 steps, 0.18 s, 334332 samples/s
//   ...
//   Training completed in 0.84 s. Test accuracy: 88.16% (8816 of 10000)
//   [rank 0] parameter checksum 8624562136a88287
//   [rank 1] parameter checksum 8624562136a88287
//   Loss curve: img/4_mnist_manual_ddp.png
#include <stdio.h>
#include <stdlib.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "comm/collectives.h"       // dist_all_reduce, dist_broadcast_tensor: collectives on tensors
#include "data/mnist.h"             // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"              // Mlp, its forward and backward, Adam, SGD: model and optimizer
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"       // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "train/divergence.h"       // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_losses.h"      // step_losses_take_all: each step's loss, read when the program prints
#include "train/train_options.h"    // TrainOptions, TRAIN_FLAGS: the flags every training program takes

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/4_mnist_manual_ddp.png");
    ArgSpec flags[] = {TRAIN_FLAGS(opt)};
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 4: data-parallel training with a hand-written gradient allreduce (lr is scaled by the world size).");
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES};
    MemoryNeed need = memory_need("--batch_size %d", opt.batch_size);
    mlp_add_memory_need(&need, sizes, ARRAY_LEN(sizes), opt.batch_size, 2);  // Adam: 2 moments per weight
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);
    Tracking *run = tracking_start(&opt.tracking, "day1/4_mnist_manual_ddp.c", device_name(device), NULL, args_values());  // mlflow.start_run(); mlflow.log_params(vars(args))
    int rank = dist_rank(), world = dist_world_size();

    // Data: 60000 training and 10000 test images, pixels / 255 as float32.
    MnistSplit train = mnist_load(opt.data, MNIST_TRAIN);
    MnistSplit test = mnist_load(opt.data, MNIST_TEST);
    // Each rank takes its 1/W share: positions rank, rank + W, rank + 2W, ...
    DistributedSampler sampler = sampler_new(train.n, world, rank, !opt.no_shuffle, (uint64_t)opt.seed);

    // Model and optimizer.
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);  // torch.manual_seed(seed)
    Mlp model = mlp_new(sizes, ARRAY_LEN(sizes), opt.batch_size, &rng, device);
    if (opt.init) h5_load_params(opt.init, model.params, model.n_params);
    for (int i = 0; i < model.n_params; i++)  // start equal: everyone takes rank 0's weights
        dist_broadcast_tensor(model.params[i].value, 0);
    double lr = opt.lr * world;  // W times the samples per step: W times the learning rate
    Adam optimizer = adam_new(model.params, model.n_params, lr);

    print0("Step 4: manual DDP on %d rank%s: MLP 784-128-10, %zu weights; Adam lr %g x %d = %g; batch %d per rank; %d epoch%s; shuffle %s (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", mlp_num_weights(&model), opt.lr, world, lr, opt.batch_size, opt.epochs, opt.epochs == 1 ? "" : "s", opt.no_shuffle ? "off" : "on", opt.seed,
           device_name(device), threads_describe());

    Tensor batch_images = tensor_zeros(opt.batch_size, MNIST_PIXELS, device);  // [B, 784]
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]
    LossLog losses = {0};
    // Each step's loss stays on the GPU until the epoch's end (step_losses.h): no step waits for it.
    StepLosses pending = step_losses_new(sampler_num_batches(&sampler, opt.batch_size), device);

    double train_start = wall_seconds();
    for (int epoch = 0; epoch < opt.epochs; epoch++) {
        double epoch_start = wall_seconds();
        sampler_set_epoch(&sampler, epoch);
        int n_batches = sampler_num_batches(&sampler, opt.batch_size);
        double loss_sum = 0.0;
        for (int b = 0; b < n_batches; b++) {
            Tensor x = mnist_batch(&train, &sampler, b, opt.batch_size, &batch_images, batch_labels);  // [rows, 784]
            mlp_zero_grad(&model);                         // optimizer.zero_grad()
            mlp_forward(&model, &x);                       // output = model(data)
            mlp_loss_to(&model, batch_labels, mnist_batch_device_labels(&train),  // loss = criterion(output, target)
                        step_losses_next(&pending));
            mlp_backward(&model, &x, NULL, NULL);          // loss.backward()
            for (int i = 0; i < model.n_params; i++) {     // the hand-written DDP:
                Tensor *grad = model.params[i].grad;
                dist_all_reduce(grad);                     // dist.all_reduce(param.grad, op=SUM)
                tensor_divide(grad, (float)world);         // param.grad /= world_size
            }
            adam_step(&optimizer);                         // optimizer.step()
            // loss.item(): at once on a CPU, for the whole epoch at its end on a GPU.
            float *taken;
            int n_taken = step_losses_take_all(&pending, b == n_batches - 1, &taken);
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
        print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s\n", epoch + 1, opt.epochs,
               loss_sum / n_batches, n_batches, n_batches == 1 ? "" : "s", seconds, (double)sampler.num_samples * world / seconds);
        tracking_log_metric(run, "epoch_mean_loss", loss_sum / n_batches, epoch);
        tracking_log_metric(run, "samples_per_second", (double)sampler.num_samples * world / seconds, epoch);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    check_weights_finite(model.params, model.n_params, losses.n, opt.epochs, run);  // the last step's update

    Tensor test_images = mnist_images(&test, device);  // [10000, 784]
    double accuracy = mlp_accuracy(&model, &test_images, test.labels);
    print0("Training completed in %.2f s. Test accuracy: %.2f%% (%.0f of %d)\n", train_seconds, 100 * accuracy,
           accuracy * test.n, test.n);
    tracking_log_metric(run, "test_accuracy", accuracy, opt.epochs);
    print_rank("parameter checksum %016llx\n", params_checksum(model.params, model.n_params));

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.save) h5_save_params(opt.save, model.params, model.n_params);
    if (rank == 0 && opt.plot && *opt.plot) {
        char title[64], label[32];
        snprintf(title, sizeof title, "Step 4: MNIST training loss, manual DDP on %d rank%s", world, world == 1 ? "" : "s");
        snprintf(label, sizeof label, "%d rank%s (mean loss)", world, world == 1 ? "" : "s");
        loss_log_plot(&losses, opt.plot, title, label);
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
    adam_free(&optimizer);
    mlp_free(&model);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    dist_finalize();
    return 0;
}
