// Step 7: what does scaling buy? Time the training loop.    PyTorch twin: 7_mnist_ddp_pt_timing.py
//
// What it adds over step 6: every rank times its training loop, rank 0
// reports the slowest (the job is as fast as its slowest rank), and with
// --results FILE.csv each run appends "world_size,seconds" and prints the
// table of every run in the file so far: per world size, the median time and
// the fastest..slowest run, and the speed-up over one rank from the medians,
// with its range from the extremes. It draws the same (--chart). One run per
// world size is no measurement on a shared machine, where one 1-rank run took
// 0.64 s and another 3.24 s: repeat each, and trust a speed-up only where its
// range does not span 1.00x. A results file with a malformed row is refused
// before training, and left as it is. The companion script runs it 3 times
// at each of 1, 2 and 4 ranks, interleaved (1, 2, 4, 1, 2, 4, ...) so that
// the machine's noise hits every world size alike:
//   day1/7_scaling.sh                  (or: make scaling; REPEATS=5 for more)
// The batch is per rank, so W ranks take 1/W of the steps per epoch, each of
// them as expensive as before: ideally the loop is W times faster. On one CPU
// node it is not: one rank already computes on every core, and W ranks divide
// the same cores among them (each takes cores / W threads). More ranks bring
// more hardware only across nodes, or with a GPU each.
//
// Build and run:
//   make day1/7_mnist_ddp_timing
//   mpirun -np 2 day1/7_mnist_ddp_timing --results scaling.csv   (add --oversubscribe on fewer cores)
//
// Expected output (times vary; the table with --results, after 3 runs at 1 rank and 3 at 2):
//   Step 7: DDP on 2 ranks: MLP 784-128-10, ...
//   epoch 1/5: mean loss 2.1628 over 5 steps, 0.10 s, 598130 samples/s
//   ...
//   [rank 1] training loop: 0.503 s
//   [rank 0] training loop: 0.503 s
//   World Size: 2. Training completed in 0.50 seconds (slowest rank). Test accuracy: 84.54% (8454 of 10000)
//   DDP: gradient allreduce 1.56 ms per step in 1 bucket, 0.07 ms (4%) of it hidden behind backward; the step waited 1.52 ms for it
//
//   world size  runs  median s      min..max s  speed-up      min..max  efficiency
//            1     3     0.606    0.602..0.633     1.00x   0.95..1.05x        100%
//            2     3     0.711    0.709..0.719     0.85x   0.84..0.89x         43%
//   speed-up: median time at 1 rank / median at W; min..max: fastest 1-rank run / slowest W-rank run
//   to slowest / fastest. Where it spans 1.00x, these runs cannot tell whether W ranks are faster.
//   Speed-up chart: img/7_scaling.png
#include <stdio.h>
#include <stdlib.h>

#include "base/args.h"                // args_parse: the flags and --help
#include "base/check.h"               // CHECK, xmalloc: fail fast, on every rank
#include "base/timer.h"               // wall_seconds
#include "data/mnist.h"               // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"                // Mlp, its forward and backward, Adam, SGD: model and optimizer
#include "parallel/ddp.h"             // ddp_wrap, ddp_grad_ready, ddp_finish: DistributedDataParallel
#include "records/h5.h"               // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"         // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/scaling_results.h"  // --results: the speed-up table over world sizes, and its chart
#include "records/tracking.h"         // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"             // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"    // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"          // threads_init: this rank's CPU threads
#include "train/accum.h"              // micro_batch: which micro-batches make one optimizer step
#include "train/divergence.h"         // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_losses.h"      // step_losses_take_all: each step's loss, read when the program prints
#include "train/train_options.h"      // TrainOptions, TRAIN_FLAGS: the flags every training program takes

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/7_mnist_ddp_timing.png");
    double bucket_mb = 25.0;  // PyTorch's default bucket_cap_mb
    int accum_steps = 1;
    const char *results = NULL, *chart = "img/7_scaling.png";
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "gradient bucket size, as PyTorch's bucket_cap_mb; 0: one bucket per tensor", 0, NULL},
        {"accum_steps", ARG_INT, &accum_steps, "K", "micro-batches per optimizer step (no_sync on all but the last)", 1, NULL},
        {"results", ARG_OUTPUT, &results, "FILE.csv", "append world_size,seconds; print the speed-up table of the file (median, min..max of repeats)", 0, NULL},
        {"chart", ARG_OUTPUT_OR_NONE, &chart, "FILE.png", "speed-up chart of --results ('' for none)", 0, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 7: time DDP training; --results collects a speed-up table across world sizes.");
    if (args_given("chart") && *chart && !results) usage_error("--chart draws the table of --results: give --results too");
    if (results) scaling_results_check(results);  // a corrupt file is refused before the run, not after it
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES};
    MemoryNeed need = memory_need("--batch_size %d", opt.batch_size);
    mlp_add_memory_need(&need, sizes, ARRAY_LEN(sizes), opt.batch_size, 2);  // Adam: 2 moments per weight
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);
    Tracking *run = tracking_start(&opt.tracking, "day1/7_mnist_ddp_timing.c", device_name(device), NULL, args_values());  // mlflow.start_run(); mlflow.log_params(vars(args))
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
    double lr = opt.lr;
    Adam optimizer = adam_new(model.params, model.n_params, lr);

    char buckets[512];
    ddp_describe_buckets(&ddp, buckets, sizeof buckets);
    print0("Step 7: DDP on %d rank%s: MLP 784-128-10, %zu weights in %s; Adam lr %g; batch %d per rank x %d micro-batch%s; %d epoch%s; shuffle %s (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", mlp_num_weights(&model), buckets, lr, opt.batch_size, accum_steps, accum_steps == 1 ? "" : "es", opt.epochs, opt.epochs == 1 ? "" : "s", opt.no_shuffle ? "off" : "on", opt.seed,
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
    print_rank("training loop: %.3f s\n", train_seconds);
    double slowest = train_seconds;  // the job is as fast as its slowest rank
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));

    Tensor test_images = mnist_images(&test, device);  // [10000, 784]
    double accuracy = mlp_accuracy(&model, &test_images, test.labels);
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    print0("World Size: %d. Training completed in %.2f seconds (slowest rank). Test accuracy: %.2f%% (%.0f of %d)\n",
           world, slowest, 100 * accuracy, accuracy * test.n, test.n);
    tracking_log_metric(run, "test_accuracy", accuracy, opt.epochs);
    print0("DDP: %s\n", overlap);
    dist_barrier();  // let every rank's lines out before rank 0's table

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.save) h5_save_params(opt.save, model.params, model.n_params);
    if (rank == 0 && opt.plot && *opt.plot) {
        char title[64], label[32];
        snprintf(title, sizeof title, "Step 7: MNIST training loss, DDP on %d rank%s", world, world == 1 ? "" : "s");
        snprintf(label, sizeof label, "%d rank%s (mean loss)", world, world == 1 ? "" : "s");
        loss_log_plot(&losses, opt.plot, title, label);
        print0("Loss curve: %s\n", opt.plot);
    }
    tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
    tracking_log_artifact(run, opt.save);
    tracking_log_artifact(run, opt.plot);
    tracking_end(run, TRACKING_FINISHED);    // mlflow.end_run()

    if (rank == 0 && results) scaling_results_report(results, world, slowest, chart);

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
