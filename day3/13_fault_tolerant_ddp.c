// Step 13: fault-tolerant DDP.     PyTorch twin: the DDP tutorial series' multigpu_torchrun.py
//
// What it adds to step 10 (diff the two files): snapshots. A job that dies (a
// node fails, Slurm's time limit hits) must not lose its work. As the
// tutorial's Trainer does, the run loads its snapshot at start if there is one
// ("Resuming training from snapshot at Epoch N") and rank 0 saves one every
// --save_every epochs; whatever restarts the job (torchrun --max-restarts,
// slurm/run_with_restarts.sh, Slurm's --requeue) just runs the same command
// again. Unlike the tutorial's, the snapshot holds everything an exact resume
// needs (common/records/snapshot.h): Adam's moments and step, the sampler's position,
// the generator, the losses so far. A run killed anywhere and started again
// ends with the weights and the per-step losses of a run that never stopped,
// bit for bit.
//   --fail_at_epoch E   rank --fail_rank (the last) dies by SIGKILL during epoch E,
//                       as a dead node would; a resumed run does not fail again
//   SIGUSR1, SIGTERM    (Slurm's warning, or the time limit) every rank saves at
//                       the end of the same step and exits with status 75; the
//                       same command resumes mid-epoch, still exactly
//   --checkpoint DIR    the sharded form instead of --snapshot (Day 4's, common/records/
//                       sharded_checkpoint.h): every rank writes 1/W of every tensor, no
//                       rank writes the whole model, and any world size resumes it, mid-epoch
//                       too; --save_every still counts epochs (the tutorial's), --keep,
//                       --async_save and --save_errors are steps 16-19's
//
// Run it (day3/README.md):
//   mpirun -np 2 day3/13_fault_tolerant_ddp --total_epochs 5        # saves checkpoints/snapshot.h5
//   mpirun -np 2 day3/13_fault_tolerant_ddp --total_epochs 8        # resumes: epochs 6 to 8
//   # rank 1 dies in epoch 3, the second attempt resumes from epoch 2's snapshot:
//   slurm/run_with_restarts.sh --max-restarts 3 -- mpirun -np 2 day3/13_fault_tolerant_ddp --fail_at_epoch 3 --snapshot checkpoints/restarts.h5
//   sbatch slurm/day3.sbatch                                        # under Slurm, requeued at the time limit
//   mpirun -np 2 day3/13_fault_tolerant_ddp --total_epochs 3 --checkpoint checkpoints/ddp   # sharded
//   mpirun -np 4 day3/13_fault_tolerant_ddp --total_epochs 5 --checkpoint checkpoints/ddp   # resumed on 4
//
// Expected output (the first run; times vary):
//   Step 13: DDP on 2 ranks (1 node, 2 ranks on vm): MLP 784-128-10, ...; 5 epochs; snapshot checkpoints/snapshot.h5 every 1 epoch; ...
//   No snapshot at checkpoints/snapshot.h5: training from the start
//   epoch 1/5: mean loss 2.0330 over 5 steps, 0.74 s, 81126 samples/s
//   Epoch 1 | Training snapshot saved at checkpoints/snapshot.h5 (1.23 MB in 15.1 ms)
//   ...
//   World Size: 2. Training completed in 3.66 seconds. Test accuracy: 88.16% (8816 of 10000)
//   Snapshots: 5 written, 1.23 MB each, 16.7 ms on average: 2.3% of an epoch (0.72 s)
//   DDP: gradient allreduce ...
//   [rank 0] parameter checksum 8624562136a88287   (step 10's, on every rank, and after any resume)
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "data/mnist.h"             // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"              // Mlp, its forward and backward, Adam, SGD: model and optimizer
#include "parallel/ddp.h"           // ddp_wrap, ddp_grad_ready, ddp_finish: DistributedDataParallel
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"       // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/sharded_checkpoint.h"  // sharded_checkpoint_resume, _save_step: each rank writes 1/W (--checkpoint)
#include "records/snapshot.h"       // snapshot_save, snapshot_load: everything an exact resume needs
#include "records/stop_signal.h"    // stop_signal_agreed: SIGUSR1/SIGTERM become a stop every rank agrees on
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "train/accum.h"            // micro_batch, rows_in_batches: --accum_steps micro-batches make a step
#include "train/divergence.h"       // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_losses.h"      // step_losses_take_all: each step's loss, read when the program prints
#include "train/train_options.h"    // TrainOptions, TRAIN_FLAGS: the flags every training program takes

// --fail_at_epoch: this rank vanishes as a node that loses power does: no
// message to the other ranks, no cleanup (SIGKILL cannot be caught). The
// launcher notices, and takes the job down.
static void die_like_a_dead_node(int fail_at_epoch, int step) {
    print_rank("--fail_at_epoch %d: this rank dies now, in step %d of epoch %d (SIGKILL), as a dead node would\n",
               fail_at_epoch, step + 1, fail_at_epoch);
    raise(SIGKILL);
}

int main(int argc, char **argv) {
    // From the very start, before MPI_Init even: a stop that comes while MPI, the
    // data or the snapshot load is honoured after the first step, instead of killing the rank.
    stop_signal_install();  // SIGUSR1 and SIGTERM now mean: save a snapshot, then stop
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/13_fault_tolerant_ddp.png");
    opt.epochs = 10;  // the tutorial's --total_epochs default
    double bucket_mb = 25.0;  // PyTorch's default bucket_cap_mb
    int accum_steps = 1;
    const char *snapshot_path = "checkpoints/snapshot.h5", *checkpoint = NULL, *save_errors = "stop";
    int save_every = 1, fail_at_epoch = 0, fail_rank = -1, keep = 2, async_save = 0;
    ArgSpec flags[] = {
        TRAIN_FLAGS_WITH_EPOCHS(opt, "total_epochs"),
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "gradient bucket size, as PyTorch's bucket_cap_mb; 0: one bucket per tensor", 0, NULL},
        {"accum_steps", ARG_INT, &accum_steps, "K", "micro-batches per optimizer step (no_sync on all but the last)", 1, NULL},
        {"snapshot", ARG_OUTPUT, &snapshot_path, "FILE.h5", "resume from it if it exists; rank 0 saves it", 0, NULL},
        {"save_every", ARG_INT, &save_every, "N", "epochs between snapshots, or --checkpoint saves (and one after the last)", 1, NULL},
        {"fail_at_epoch", ARG_INT, &fail_at_epoch, "E", "a rank dies during epoch E, as a dead node (0: never; not after a resume)", 0, NULL},
        {"fail_rank", ARG_INT, &fail_rank, "R", "the rank that --fail_at_epoch kills (-1: the last)", -1, NULL},
        {"checkpoint", ARG_STRING, &checkpoint, "DIR", CHECKPOINT_HELP_DIR " (sharded; instead of --snapshot)", 0, NULL},
        {"keep", ARG_INT, &keep, "N", CHECKPOINT_HELP_KEEP, 1, NULL},
        {"async_save", ARG_SWITCH, &async_save, NULL, CHECKPOINT_HELP_ASYNC_SAVE, 0, NULL},
        {"save_errors", ARG_STRING, &save_errors, "WHAT", CHECKPOINT_HELP_SAVE_ERRORS, 0, "stop|continue"},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 13: DDP with snapshots, exact resume and failure injection.");
    checkpoint_flags_check_own_interval(checkpoint);  // --keep, --async_save, --save_errors: only with --checkpoint
    if (checkpoint && args_given("snapshot"))  // one form of saving per run: which would a restart resume?
        usage_error("--snapshot and --checkpoint: give one (a whole-model snapshot by rank 0, or a sharded checkpoint)");
    bool save_errors_continue = strcmp(save_errors, "continue") == 0;
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    int rank = dist_rank(), world = dist_world_size();
    if (fail_rank == -1) fail_rank = world - 1;
    if (fail_rank >= world) usage_error("--fail_rank %d: the ranks are 0 to %d", fail_rank, world - 1);
    if (fail_at_epoch > opt.epochs) usage_error("--fail_at_epoch %d is past --total_epochs %d", fail_at_epoch, opt.epochs);
    if (fail_at_epoch && fail_at_epoch <= save_every)  // the restarted run would find no snapshot, and die again
        usage_error("--fail_at_epoch %d strikes before the first snapshot (after epoch %d, --save_every %d): a restart "
                    "would start over and fail again; choose an epoch after %d", fail_at_epoch, save_every, save_every,
                    save_every);

    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES};
    MemoryNeed need = memory_need("--batch_size %d", opt.batch_size);
    mlp_add_memory_need(&need, sizes, ARRAY_LEN(sizes), opt.batch_size, 2);  // Adam: 2 moments per weight
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);
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

    char buckets[512], saving[PATH_MAX + 64];
    ddp_describe_buckets(&ddp, buckets, sizeof buckets);
    int nodes = dist_num_nodes();
    if (checkpoint) snprintf(saving, sizeof saving, "sharded checkpoint in %s%s", checkpoint, async_save ? " (written by a thread)" : "");
    else snprintf(saving, sizeof saving, "snapshot %s", snapshot_path);
    print0("Step 13: DDP on %d rank%s (%d node%s, %d rank%s on %s): MLP 784-128-10, %zu weights in %s; Adam lr %g x %d = %g; batch %d per rank x %d micro-batch%s; %d epoch%s; %s every %d epoch%s; shuffle %s (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", dist_local_world_size(), dist_local_world_size() == 1 ? "" : "s", dist_hostname(), mlp_num_weights(&model), buckets, opt.lr, world, lr, opt.batch_size, accum_steps, accum_steps == 1 ? "" : "es", opt.epochs, opt.epochs == 1 ? "" : "s", saving, save_every, save_every == 1 ? "" : "s", opt.no_shuffle ? "off" : "on", opt.seed,
           device_name(device), threads_describe());

    // The snapshot (or the sharded checkpoint, below), if there is one: every rank loads it (the
    // tutorial's _load_snapshot).
    SnapshotSettings settings = {.world_size = world, .batch_size = opt.batch_size, .accum_steps = accum_steps,
                                 .lr = opt.lr, .seed = opt.seed, .shuffle = !opt.no_shuffle, .train_samples = train.n,
                                 .n_sizes = ARRAY_LEN(sizes)};
    memcpy(settings.sizes, sizes, sizeof sizes);
    SnapshotSettings saved;
    SnapshotProgress progress = {0};  // epochs done, and samples done of the next
    LossLog losses = {0};
    // Each step's loss stays on the GPU until the epoch's end (step_losses.h): no step waits for it.
    StepLosses pending = step_losses_new(sampler_num_batches(&sampler, opt.batch_size), device);
    // --checkpoint, the sharded form: what a snapshot holds, as pieces. Every rank holds the whole
    // model (DDP) and writes its 1/W of each tensor's rows and of Adam's moments (the ranks are the
    // box's writers); a load reads the whole tensors, from however many files a layout left.
    CheckpointState state = {.program = "day3/13_fault_tolerant_ddp", .world_size = world,
                             .global_batch = (long)opt.batch_size * accum_steps * world, .lr_follows_world = true, .seed = opt.seed,
                             .shuffle = !opt.no_shuffle, .train_samples = train.n, .lr = opt.lr, .generator = rng,
                             .losses = &losses};
    snprintf(state.layout, sizeof state.layout, "DDP on %d rank%s", world, world == 1 ? "" : "s");
    CheckpointBox *boxes = xcalloc((size_t)model.n_params, sizeof(CheckpointBox));
    for (int i = 0; i < model.n_params; i++) boxes[i] = checkpoint_whole_box(model.params[i].value, rank, world);
    CheckpointPieces wanted = checkpoint_param_pieces(model.params, optimizer.exp_avg, optimizer.exp_avg_sq, model.n_params, boxes, false);
    CheckpointPieces shares = checkpoint_param_pieces(model.params, optimizer.exp_avg, optimizer.exp_avg_sq, model.n_params, boxes, true);
    CheckpointSave *in_flight = NULL;  // --async_save: the save a thread is writing
    bool resumed;
    if (checkpoint) {  // "Resumed from DIR/step-..." or "No checkpoint in DIR", said by the module
        resumed = sharded_checkpoint_resume(checkpoint, wanted.piece, wanted.n, &state, opt.init);
        if (resumed) {
            optimizer.step = state.step, rng = state.generator;
            progress.epochs_done = state.epoch, progress.samples_done = state.samples_done;
            snprintf(progress.mlflow_run_id, sizeof progress.mlflow_run_id, "%s", state.mlflow_run_id);
            if (progress.epochs_done >= opt.epochs)
                print0("Nothing left to train: %d of --total_epochs %d done\n", progress.epochs_done, opt.epochs);
        }
    } else if ((resumed = snapshot_load(snapshot_path, &settings, &saved, &progress, &optimizer, &losses, &rng))) {
        if (progress.samples_done == 0)
            print0("Resuming training from snapshot at Epoch %d\n", progress.epochs_done);
        else
            print0("Resuming training from snapshot at Epoch %d, %ld of epoch %d's %d samples done\n",
                   progress.epochs_done, progress.samples_done, progress.epochs_done + 1, train.n);
        if (saved.world_size != world)
            print0("The snapshot was made on %d rank%s, this run has %d: the data order now differs from an "
                   "uninterrupted run (each epoch's samples are the same, their global batches are not)\n",
                   saved.world_size, saved.world_size == 1 ? "" : "s", world);
        if (opt.init) print0("--init %s is not used: the snapshot's weights are the run's\n", opt.init);
        if (progress.epochs_done >= opt.epochs)
            print0("Nothing left to train: %d of --total_epochs %d done\n", progress.epochs_done, opt.epochs);
    } else {
        print0("No snapshot at %s: training from the start\n", snapshot_path);
    }
    long first_step = optimizer.step;  // (a resumed run's)
    // The MLflow run: a resume logs into the snapshot's, its metrics continuing at the snapshot's step.
    Tracking *run = tracking_start(&opt.tracking, "day3/13_fault_tolerant_ddp.c", device_name(device),
                                   progress.mlflow_run_id, args_values());  // mlflow.start_run(run_id=...); mlflow.log_params(vars(args))
    snprintf(progress.mlflow_run_id, sizeof progress.mlflow_run_id, "%s", tracking_run_id(run));
    snprintf(state.mlflow_run_id, sizeof state.mlflow_run_id, "%s", tracking_run_id(run));
    // What the snapshot holds, logged again: the process that saved it may have died (SIGKILL) with
    // these values still queued for the store. Tracking sends only the steps the store lacks. The
    // epoch means are the loop's own sums, in its order, so the values are the ones it logged; an
    // epoch's samples per second is a timing that the snapshot does not keep: tracking names those the
    // store lacks at the end.
    for (int i = 0; i < losses.n; i++) tracking_log_metric(run, "loss", losses.loss[i], i);
    for (int epoch = 0, i = 0; epoch < progress.epochs_done; epoch++) {
        double sum = 0.0;
        int steps = 0;
        for (; i < losses.n && losses.epoch[i] == epoch; i++) sum += losses.loss[i], steps++;
        if (steps) tracking_log_metric(run, "epoch_mean_loss", sum / steps, epoch);
        tracking_metric_lost(run, "samples_per_second", epoch);
    }

    Tensor batch_images = tensor_zeros(opt.batch_size, MNIST_PIXELS, device);  // [B, 784]
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]

    double train_start = wall_seconds(), snapshot_seconds = 0.0, snapshot_megabytes = 0.0;
    int snapshots = 0, epochs_run = 0, stopped_by = 0;
    for (int epoch = progress.epochs_done; epoch < opt.epochs && !stopped_by; epoch++) {
        double epoch_start = wall_seconds();
        long first_position = progress.samples_done;  // a resumed epoch skips what it already trained on
        sampler_set_epoch_from(&sampler, epoch, first_position);
        int n_batches = sampler_num_batches(&sampler, opt.batch_size);
        int n_steps = (n_batches + accum_steps - 1) / accum_steps;
        double loss_sum = 0.0;  // over this epoch's steps, those before a resume included
        int epoch_steps = 0;
        for (int i = 0; i < losses.n; i++)
            if (losses.epoch[i] == epoch) loss_sum += losses.loss[i], epoch_steps++;
        for (int b = 0; b < n_batches; b++) {
            if (epoch + 1 == fail_at_epoch && !resumed && rank == fail_rank && b == n_steps / 2 * accum_steps)
                die_like_a_dead_node(fail_at_epoch, n_steps / 2);
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
                epoch_steps++;
                // SIGUSR1/SIGTERM on any rank: all ranks stop after this same step, with the samples it took.
                stopped_by = stop_signal_agreed();
                if (async_save) sharded_checkpoint_poll(&in_flight);  // a checkpoint whose threads are done becomes current
                // loss.item(): at once on a CPU; on a GPU for the whole epoch at its end, or at a stop
                // (the snapshot holds every step's loss).
                float *taken;
                int n_taken = step_losses_take_all(&pending, b == n_batches - 1 || stopped_by, &taken);
                dist_allreduce_sum(taken, (size_t)n_taken);  // for the log: each step's loss of the global batch, in one call
                for (int i = 0; i < n_taken; i++) {
                    float loss = taken[i] / (float)world;
                    check_loss_finite(loss, losses.n + 1, epoch + 1, run);  // the sum above spread any nan to every rank
                    loss_log_add(&losses, epoch, loss);
                    tracking_log_metric(run, "loss", loss, losses.n - 1);  // mlflow.log_metric("loss", loss, step=step)
                    loss_sum += loss;
                }
                if (stopped_by) {
                    progress.samples_done =
                        first_position + (long)world * rows_in_batches(sampler.num_samples, opt.batch_size, 0, b + 1);
                    break;
                }
            }
        }
        bool epoch_done = !stopped_by || progress.samples_done >= train.n;
        if (epoch_done) progress.epochs_done = epoch + 1, progress.samples_done = 0;
        if (epoch_done) {
            double seconds = wall_seconds() - epoch_start;
            epochs_run++;
            print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s\n", epoch + 1, opt.epochs,
                   loss_sum / epoch_steps, epoch_steps, epoch_steps == 1 ? "" : "s", seconds, (double)sampler.num_samples * world / seconds);
            tracking_log_metric(run, "epoch_mean_loss", loss_sum / epoch_steps, epoch);
            tracking_log_metric(run, "samples_per_second", (double)sampler.num_samples * world / seconds, epoch);
        }
        // The tutorial's _save_snapshot, from rank 0, every save_every epochs; also after the last, and on a stop.
        if (stopped_by || (epoch + 1) % save_every == 0 || epoch + 1 == opt.epochs) {
            check_weights_finite(model.params, model.n_params, losses.n, epoch + 1, run);  // never a NaN snapshot over a good one
            if (checkpoint) {  // every rank its shares; the module says "Checkpoint of step N saved in DIR/..."
                state.step = optimizer.step, state.epoch = progress.epochs_done, state.samples_done = progress.samples_done;
                state.generator = rng;
                sharded_checkpoint_save_step(async_save ? &in_flight : NULL, checkpoint, keep, save_errors_continue,
                                             shares.piece, shares.n, &state);
            } else {
                SnapshotWrite written = snapshot_save(snapshot_path, &settings, &progress, &optimizer, &losses, &rng);
                snapshot_seconds += written.seconds, snapshot_megabytes = written.megabytes, snapshots++;
                if (epoch_done)
                    print0("Epoch %d | Training snapshot saved at %s (%.2f MB in %.1f ms)\n", epoch + 1, snapshot_path,
                           written.megabytes, 1e3 * written.seconds);
                else
                    print0("Step %d of epoch %d | Training snapshot saved at %s (%.2f MB in %.1f ms)\n", epoch_steps,
                           epoch + 1, snapshot_path, written.megabytes, 1e3 * written.seconds);
            }
        }
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    // --checkpoint: the save a thread still writes finished (--async_save), and the last step's
    // saved again if its save failed (--save_errors continue): the end, or the stop, must be saved.
    bool end_saved = true;
    if (checkpoint && optimizer.step > first_step)
        end_saved = sharded_checkpoint_save_last(&in_flight, checkpoint, keep, save_errors_continue, shares.piece,
                                                 shares.n, &state);

    int status = 0;
    if (stopped_by && progress.epochs_done < opt.epochs) {
        print0("Stopped by %s after %d of %d epoch%s and %ld samples: exiting with status %d; the same command "
               "resumes from %s\n", stopped_by == SIGUSR1 ? "SIGUSR1" : "SIGTERM", progress.epochs_done,
               opt.epochs, opt.epochs == 1 ? "" : "s", progress.samples_done, EXIT_STOPPED, checkpoint ? checkpoint : snapshot_path);
        status = EXIT_STOPPED;
    } else {
        Tensor test_images = mnist_images(&test, device);  // [10000, 784]
        double accuracy = mlp_accuracy(&model, &test_images, test.labels);
        char overlap[256];
        ddp_describe_overlap(&ddp, overlap, sizeof overlap);
        print0("World Size: %d. Training completed in %.2f seconds. Test accuracy: %.2f%% (%.0f of %d)\n", world,
               train_seconds, 100 * accuracy, accuracy * test.n, test.n);
        tracking_log_metric(run, "test_accuracy", accuracy, opt.epochs);
        if (snapshots > 0 && epochs_run > 0) {
            double epoch_seconds = (train_seconds - snapshot_seconds) / epochs_run;
            print0("Snapshots: %d written, %.2f MB each, %.1f ms on average: %.1f%% of an epoch (%.2f s)\n", snapshots,
                   snapshot_megabytes, 1e3 * snapshot_seconds / snapshots, 100 * snapshot_seconds / snapshots / epoch_seconds,
                   epoch_seconds);
        }
        if (epochs_run > 0) print0("DDP: %s\n", overlap);  // (none after "Nothing left to train")
        print_rank("parameter checksum %016llx\n", params_checksum(model.params, model.n_params));

        if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
        if (rank == 0 && opt.save) h5_save_params(opt.save, model.params, model.n_params);
        if (rank == 0 && opt.plot && *opt.plot && losses.n > 0) {
            char title[80], label[64];
            snprintf(title, sizeof title, "Step 13: MNIST training loss, DDP on %d rank%s, %d node%s", world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s");
            snprintf(label, sizeof label, "%d rank%s, lr %g", world, world == 1 ? "" : "s", lr);
            loss_log_plot(&losses, opt.plot, title, label);
            print0("Loss curve: %s\n", opt.plot);
        }
        tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
        tracking_log_artifact(run, opt.save);
        tracking_log_artifact(run, opt.plot);
        tensor_free(&test_images);
    }
    tracking_log_artifact(run, checkpoint ? NULL : snapshot_path);  // (a checkpoint is a folder of shards)
    tracking_end(run, status == EXIT_STOPPED ? TRACKING_KILLED : TRACKING_FINISHED);  // mlflow.end_run(status)

    tensor_free(&batch_images);
    free(batch_labels);
    loss_log_free(&losses);
    step_losses_free(&pending);
    checkpoint_pieces_free(&wanted), checkpoint_pieces_free(&shares), free(boxes);
    adam_free(&optimizer);
    ddp_free(&ddp);
    mlp_free(&model);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    sharded_checkpoint_check_end_saved(end_saved, checkpoint);  // the outputs written: exit 1 if the end is not saved
    dist_finalize();
    return status;
}
