// Step 11: DDP across nodes, streaming the data from HDF5.  PyTorch twin: 11_mnist_ddp_pt_multinode_streaming.py
//
// What it changes from step 10 (diff the two files): only where the data comes
// from. Step 10 loads all of MNIST into every rank's memory; a data set that
// does not fit there must be read from disk as training goes. Here each rank
// reads only the samples it trains on, one batch ahead, from an HDF5 file
// chunked in groups of 100 samples (day2/create_mnist_h5 writes it):
//   - the DistributedSampler shuffles and shards GROUPS (600 of them), not
//     samples, as the original's Dataset of groups does; a batch is
//     --batch_size / 100 whole groups (64 at the default 6400), so
//     --batch_size counts samples and must be a multiple of 100;
//   - reader workers (--workers W, --prefetch K: the DataLoader's num_workers
//     and prefetch_factor) read the batches ahead, each group one chunk,
//     into W x K batch slots: a rank holds those, not the data set. On a GPU
//     the slots are page-locked and batch b+1 is copied while batch b
//     computes (pin_memory=True, non_blocking=True);
//   - the end of the run says what each worker read, and how long training
//     waited for them.
// The test set is streamed the same way, in batches, by every rank.
//
// Run it under Slurm (day2/README.md):
//   day2/create_mnist_h5                          # once: data/mnist -> data/mnist.h5
//   salloc --nodes 2 --ntasks-per-node=4 ...
//   ./slurm/multinode_setup_and_run.sh day2/11_multinode_streaming
// or on one machine:  mpirun -np 2 day2/11_multinode_streaming [--h5 FILE.h5]
//
// Expected output (times vary; 2 ranks on a 2-core laptop):
//   Step 11: DDP on 2 ranks (1 node, 2 ranks on vm): MLP 784-128-10, 101770 weights in 1 bucket: [fc.2.bias .. fc.0.weight, 407.1 kB]; Adam lr 0.001 x 2 = 0.002; batch 6400 per rank x 1 micro-batch; 5 epochs; shuffle on (seed 0); cpu, 1 thread per rank, OpenBLAS 0.3.21 (SkylakeX kernels)
//   Data: data/mnist.h5, uint8 pixels, 600 training groups of 100 (300 per rank, 64 per batch), read by 1 worker per rank, 2 batches ahead each
//   epoch 1/5: mean loss 2.0357 over 5 steps, 0.31 s, 190526 samples/s
//   ...
//   epoch 5/5: mean loss 0.4948 over 5 steps, 0.23 s, 259155 samples/s
//   World Size: 2. Training completed in 1.34 seconds. Test accuracy: 88.13% (8813 of 10000)
//   DDP: gradient allreduce 0.32 ms per step in 1 bucket, 0.20 ms (61%) of it hidden behind backward; the step waited 0.19 ms for it
//   Data: read 150000 samples (470.4 MB of float32 pixels) from uint8 chunks, 1 worker busy 0.11 s in all: 4276 MB/s per worker; the loop waited 0.02 s for data (1% of 1.34 s), means over ranks
//   Data: rank 0's worker 0: 25 batches (150000 samples), busy 0.11 s, 0.09 s of it in HDF5: 4276 MB/s
//   [rank 0] parameter checksum fd647fd019b90060
//   [rank 1] parameter checksum fd647fd019b90060
//   Loss curve: img/11_multinode_streaming.png
// Reading takes CPU time: where no core is spare (this laptop), training
// slows down by that much; uncompressed uint8 chunks (the default file) make
// it little.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "data/h5_stream.h"         // h5_stream_next: batches streamed from HDF5 by reader threads
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

// Accuracy on the test groups, streamed in batches like the training data
// (every rank reads all of them: the test set is not sharded, as in step 10).
static double test_accuracy(Mlp *model, const H5Part *test, int groups_per_batch, int *labels, Device device,
                            int workers, int prefetch) {
    DistributedSampler all_groups = sampler_new(test->n_groups, 1, 0, false, 0);  // in file order
    H5Stream *stream = h5_stream_start(test, &all_groups, groups_per_batch, 1, device, workers, prefetch);
    long correct = 0;
    for (int b = 0; b < sampler_num_batches(&all_groups, groups_per_batch); b++) {
        Tensor x = h5_stream_next(stream, 0, b, labels);  // [rows, 784]
        correct += lround(mlp_accuracy(model, &x, labels) * x.rows);
    }
    h5_stream_stop(stream);
    sampler_free(&all_groups);
    return (double)correct / ((double)test->n_groups * H5_GROUP_SIZE);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/11_multinode_streaming.png");
    const char *h5_path = H5_DEFAULT_FILE;
    double bucket_mb = 25.0;  // PyTorch's default bucket_cap_mb
    int accum_steps = 1;
    int workers = 0, prefetch = 2;  // DataLoader's num_workers (0 here: pick from the cores) and prefetch_factor
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"h5", ARG_PATH, &h5_path, "FILE.h5", "MNIST in groups of 100 (day2/create_mnist_h5); --data is not read", 0, NULL},
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "gradient bucket size, as PyTorch's bucket_cap_mb; 0: one bucket per tensor", 0, NULL},
        {"accum_steps", ARG_INT, &accum_steps, "K", "micro-batches per optimizer step (no_sync on all but the last)", 1, NULL},
        {"workers", ARG_INT, &workers, "N", "reader threads per rank, as DataLoader's num_workers (0: the cores the rank does not compute with, at least 1)", 0, NULL},
        {"prefetch", ARG_INT, &prefetch, "K", "batches each worker reads ahead, as DataLoader's prefetch_factor", 1, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 11: DDP across nodes, streaming MNIST from HDF5.");
    if (opt.batch_size % H5_GROUP_SIZE != 0)
        usage_error("--batch_size %d is not a multiple of %d: batches are whole groups of the HDF5 file",
                    opt.batch_size, H5_GROUP_SIZE);
    int groups_per_batch = opt.batch_size / H5_GROUP_SIZE;  // 64 groups of 100 samples
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    if (workers == 0) workers = h5_stream_default_workers(device);
    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES};
    MemoryNeed need = memory_need("--batch_size %d --workers %d --prefetch %d", opt.batch_size, workers, prefetch);
    mlp_add_memory_need(&need, sizes, ARRAY_LEN(sizes), opt.batch_size, 2);  // Adam: 2 moments per weight
    h5_stream_add_memory_need(&need, opt.batch_size, workers, prefetch);
    memory_require(&need, device);
    Tracking *run = tracking_start(&opt.tracking, "day2/11_multinode_streaming.c", device_name(device), NULL, args_values());  // mlflow.start_run(); mlflow.log_params(vars(args))
    int rank = dist_rank(), world = dist_world_size();

    // Data: groups of 100 samples in HDF5, read batch by batch as float32 pixels / 255.
    H5Mnist data = h5_mnist_open(h5_path);  // checks the file's whole layout before anything runs
    // Each rank takes its 1/W share of the groups: positions rank, rank + W, rank + 2W, ...
    DistributedSampler sampler = sampler_new(data.train.n_groups, world, rank, !opt.no_shuffle, (uint64_t)opt.seed);
    int rank_samples = sampler.num_samples * H5_GROUP_SIZE;

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
    print0("Step 11: DDP on %d rank%s (%d node%s, %d rank%s on %s): MLP 784-128-10, %zu weights in %s; Adam lr %g x %d = %g; batch %d per rank x %d micro-batch%s; %d epoch%s; shuffle %s (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", dist_local_world_size(), dist_local_world_size() == 1 ? "" : "s", dist_hostname(), mlp_num_weights(&model), buckets, opt.lr, world, lr, opt.batch_size, accum_steps, accum_steps == 1 ? "" : "es", opt.epochs, opt.epochs == 1 ? "" : "s", opt.no_shuffle ? "off" : "on", opt.seed,
           device_name(device), threads_describe());
    print0("Data: %s, %s pixels, %d training groups of %d (%d per rank, %d per batch), read by %d worker%s per rank, %d batch%s ahead each%s\n",
           h5_path, data.train.pixels == H5_PIXELS_UINT8 ? "uint8" : "float32", data.train.n_groups, H5_GROUP_SIZE,
           sampler.num_samples, groups_per_batch, workers, workers == 1 ? "" : "s", prefetch, prefetch == 1 ? "" : "es",
           device == DEVICE_CPU ? "" : ", copied to the GPU from page-locked memory");

    // DataLoader(dataset, batch_size, sampler=sampler, num_workers=workers, prefetch_factor=prefetch, pin_memory=True).
    // The workers start now (not earlier: --init's HDF5 calls are done) and walk the same epochs.
    H5Stream *stream = h5_stream_start(&data.train, &sampler, groups_per_batch, opt.epochs, device, workers, prefetch);
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]
    LossLog losses = {0};
    // Each step's loss stays on the GPU until the epoch's end (step_losses.h): no step waits for it.
    StepLosses pending = step_losses_new(sampler_num_batches(&sampler, groups_per_batch), device);

    double train_start = wall_seconds();
    for (int epoch = 0; epoch < opt.epochs; epoch++) {
        double epoch_start = wall_seconds();
        sampler_set_epoch(&sampler, epoch);
        int n_batches = sampler_num_batches(&sampler, groups_per_batch);
        int n_steps = (n_batches + accum_steps - 1) / accum_steps;
        double loss_sum = 0.0;
        for (int b = 0; b < n_batches; b++) {
            Tensor x = h5_stream_next(stream, epoch, b, batch_labels);  // [rows, 784], read while b - 1 trained
            // accum_steps micro-batches make a step; each weighs by its share of the step's samples.
            MicroBatch micro = micro_batch(b, accum_steps, rank_samples, opt.batch_size);
            if (micro.first) mlp_zero_grad(&model);        // optimizer.zero_grad()
            ddp_set_sync(&ddp, micro.last);                // with model.no_sync() on the others
            mlp_forward(&model, &x);                       // output = model(data)
            mlp_loss_to(&model, batch_labels, NULL,        // loss = criterion(output, target): labels from the host
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
               loss_sum / n_steps, n_steps, n_steps == 1 ? "" : "s", seconds, (double)rank_samples * world / seconds);
        tracking_log_metric(run, "epoch_mean_loss", loss_sum / n_steps, epoch);
        tracking_log_metric(run, "samples_per_second", (double)rank_samples * world / seconds, epoch);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    check_weights_finite(model.params, model.n_params, losses.n, opt.epochs, run);  // the last step's update
    char reading[512 + 128 * workers];
    h5_stream_describe_all_ranks(stream, train_seconds, reading, sizeof reading);
    h5_stream_stop(stream);

    double accuracy = test_accuracy(&model, &data.test, groups_per_batch, batch_labels, device, workers, prefetch);
    int test_n = data.test.n_groups * H5_GROUP_SIZE;
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    print0("World Size: %d. Training completed in %.2f seconds. Test accuracy: %.2f%% (%.0f of %d)\n", world,
           train_seconds, 100 * accuracy, accuracy * test_n, test_n);
    tracking_log_metric(run, "test_accuracy", accuracy, opt.epochs);
    print0("DDP: %s\n", overlap);
    print0("%s", reading);
    print_rank("parameter checksum %016llx\n", params_checksum(model.params, model.n_params));

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.save) h5_save_params(opt.save, model.params, model.n_params);
    if (rank == 0 && opt.plot && *opt.plot) {
        char title[80], label[64];
        snprintf(title, sizeof title, "Step 11: MNIST training loss, DDP from HDF5 on %d rank%s, %d node%s", world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s");
        snprintf(label, sizeof label, "%d rank%s, lr %g", world, world == 1 ? "" : "s", lr);
        loss_log_plot(&losses, opt.plot, title, label);
        print0("Loss curve: %s\n", opt.plot);
    }
    tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
    tracking_log_artifact(run, opt.save);
    tracking_log_artifact(run, opt.plot);
    tracking_end(run, TRACKING_FINISHED);    // mlflow.end_run()

    free(batch_labels);
    loss_log_free(&losses);
    step_losses_free(&pending);
    adam_free(&optimizer);
    ddp_free(&ddp);
    mlp_free(&model);
    sampler_free(&sampler);
    h5_mnist_close(&data);
    dist_finalize();
    return 0;
}
