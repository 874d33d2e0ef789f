// Step 10: DDP across nodes.                 PyTorch twin: 10_mnist_ddp_pt_multinode.py
//
// What it changes from step 8 (diff the two files): nothing in the training.
// MPI does not care whether two ranks share a node: the same program runs on
// 2 nodes x 4 ranks under Slurm. Each node's ranks get their local rank from
// MPI's shared-memory split (the GPU they would use), the lr is scaled by the
// world size as in step 8, and rank 0 reports the layout it runs on.
//
// Run it under Slurm (day2/README.md):
//   salloc --nodes 2 --ntasks-per-node=4 ...
//   ./slurm/multinode_setup_and_run.sh day2/10_mnist_ddp_multinode
// or on one machine:  mpirun -np 4 day2/10_mnist_ddp_multinode
//
// Expected output (times vary):
//   Step 10: DDP on 4 ranks (1 node, 4 ranks on vm): MLP 784-128-10, ...
//   epoch 1/5: mean loss 2.0545 over 3 steps, 0.19 s, 316048 samples/s
//   ...
//   epoch 5/5: mean loss 0.4691 over 3 steps, 0.17 s, 357511 samples/s
//   World Size: 4. Training completed in 0.86 seconds. Test accuracy: 88.12% (8812 of 10000)
//   DDP: gradient allreduce 2.47 ms per step in 1 bucket, 0.05 ms (2%) of it hidden behind backward; the step waited 2.44 ms for it
//   [rank 0] parameter checksum 1e5063ae55fe1fbe   (the same on every rank)
#include <stdio.h>
#include <stdlib.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "data/mnist.h"             // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"              // Mlp, its forward and backward, Adam, SGD: model and optimizer
#include "parallel/ddp.h"           // ddp_wrap, ddp_grad_ready, ddp_finish: DistributedDataParallel
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"       // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "train/accum.h"            // micro_batch: which micro-batches make one optimizer step
#include "train/divergence.h"       // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_losses.h"      // step_losses_take_all: each step's loss, read when the program prints
#include "train/train_options.h"    // TrainOptions, TRAIN_FLAGS: the flags every training program takes

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/10_mnist_ddp_multinode.png");
    double bucket_mb = 25.0;  // PyTorch's default bucket_cap_mb
    int accum_steps = 1;
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "gradient bucket size, as PyTorch's bucket_cap_mb; 0: one bucket per tensor", 0, NULL},
        {"accum_steps", ARG_INT, &accum_steps, "K", "micro-batches per optimizer step (no_sync on all but the last)", 1, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 10: DDP across nodes (lr x world size).");
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES};
    MemoryNeed need = memory_need("--batch_size %d", opt.batch_size);
    mlp_add_memory_need(&need, sizes, ARRAY_LEN(sizes), opt.batch_size, 2);  // Adam: 2 moments per weight
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);
    Tracking *run = tracking_start(&opt.tracking, "day2/10_mnist_ddp_multinode.c", device_name(device), NULL, args_values());  // mlflow.start_run(); mlflow.log_params(vars(args))
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
    Ddp ddp = ddp_wrap(model.params, model.n_params, bucket_mb);  // model = DDP(model)
    double lr = opt.lr * world;  // W times the samples per step: W times the learning rate
    Adam optimizer = adam_new(model.params, model.n_params, lr);

    char buckets[512];
    ddp_describe_buckets(&ddp, buckets, sizeof buckets);
    int nodes = dist_num_nodes();
    print0("Step 10: DDP on %d rank%s (%d node%s, %d rank%s on %s): MLP 784-128-10, %zu weights in %s; Adam lr %g x %d = %g; batch %d per rank x %d micro-batch%s; %d epoch%s; shuffle %s (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", dist_local_world_size(), dist_local_world_size() == 1 ? "" : "s", dist_hostname(), mlp_num_weights(&model), buckets, opt.lr, world, lr, opt.batch_size, accum_steps, accum_steps == 1 ? "" : "es", opt.epochs, opt.epochs == 1 ? "" : "s", opt.no_shuffle ? "off" : "on", opt.seed,
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
        int n_steps = (n_batches + accum_steps - 1) / accum_steps;
        double loss_sum = 0.0;
        for (int b = 0; b < n_batches; b++) {
            Tensor x = mnist_batch(&train, &sampler, b, opt.batch_size, &batch_images, batch_labels);  // [rows, 784]
            // accum_steps micro-batches make a step; each weighs by its share of the step's samples.
            MicroBatch micro = micro_batch(b, accum_steps, sampler.num_samples, opt.batch_size);
            if (micro.first) mlp_zero_grad(&model);        // optimizer.zero_grad()
            ddp_set_sync(&ddp, micro.last);                // with model.no_sync() on the others
            mlp_forward(&model, &x);                       // output = model(data)
            mlp_loss_to(&model, batch_labels, mnist_batch_device_labels(&train),  // loss = criterion(output, target)
                        step_losses_next_share(&pending, micro.weight, micro.first));  // (its share of the step's)
            mlp_scale_loss(&model, micro.weight);
            mlp_backward(&model, &x, ddp_grad_ready, &ddp);  // loss.backward(): buckets start here
            if (micro.last) {
                ddp_finish(&ddp);                          // all buckets reduced, grads averaged
                adam_step(&optimizer);                     // optimizer.step()
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
        }
        double seconds = wall_seconds() - epoch_start;
        print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s\n", epoch + 1, opt.epochs,
               loss_sum / n_steps, n_steps, n_steps == 1 ? "" : "s", seconds, (double)sampler.num_samples * world / seconds);
        tracking_log_metric(run, "epoch_mean_loss", loss_sum / n_steps, epoch);
        tracking_log_metric(run, "samples_per_second", (double)sampler.num_samples * world / seconds, epoch);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    check_weights_finite(model.params, model.n_params, losses.n, opt.epochs, run);  // the last step's update

    Tensor test_images = mnist_images(&test, device);  // [10000, 784]
    double accuracy = mlp_accuracy(&model, &test_images, test.labels);
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    print0("World Size: %d. Training completed in %.2f seconds. Test accuracy: %.2f%% (%.0f of %d)\n", world,
           train_seconds, 100 * accuracy, accuracy * test.n, test.n);
    tracking_log_metric(run, "test_accuracy", accuracy, opt.epochs);
    print0("DDP: %s\n", overlap);
    print_rank("parameter checksum %016llx\n", params_checksum(model.params, model.n_params));

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.save) h5_save_params(opt.save, model.params, model.n_params);
    if (rank == 0 && opt.plot && *opt.plot) {
        char title[80], label[64];
        snprintf(title, sizeof title, "Step 10: MNIST training loss, DDP on %d rank%s, %d node%s", world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s");
        snprintf(label, sizeof label, "%d rank%s, lr %g", world, world == 1 ? "" : "s", lr);
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
    ddp_free(&ddp);
    mlp_free(&model);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    dist_finalize();
    return 0;
}
