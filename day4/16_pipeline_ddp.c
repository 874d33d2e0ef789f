// Step 16: the model split across ranks, pipelined, under DDP.
//                        PyTorch twin: torch.distributed.pipelining (PipelineStage, ScheduleGPipe,
//                        Schedule1F1B) with each stage wrapped in DDP over its data-parallel group
//
// What it changes from step 6: no rank holds the whole model (step 6's
// forward, loss and backward become pipeline_step, which every stage runs on
// its own layers). The MLP's Linear layers are cut into --pp P stages, each on its own
// rank: stage 0 takes the images, the last stage computes the loss, and in
// between the activations go forward and their gradients come back, rank to
// rank. A batch is cut into --micro_batches M micro-batches, so that stage 1
// works on micro-batch 0 while stage 0 goes on with micro-batch 1; the
// --schedule says in which order each stage runs its forwards and backwards:
//   gpipe: every forward, then every backward (all M micro-batches' activations held);
//   1f1b:  after a warm-up of P - s - 1 forwards, one forward, one backward (at most P - s held).
// Either way a stage waits at the start and the end of each step (the bubble):
// (P - 1) / (M + P - 1) of the time for equal stages. Gradients accumulate over
// the micro-batches, each weighted by its share of the batch, so the step is
// the same for every M and schedule. The world is P stages x D = world / P
// replicas of the whole pipeline; each stage is wrapped in DDP over its D
// replicas (a process group per stage, common/comm/group.h), which average that
// stage's gradients during the last micro-batch's backward.
//
// With the same seed and flags, P stages x D replicas take the steps of step 6
// on D ranks (with M = 1, bit for bit: the same operations in the same order).
// Checkpoints (--checkpoint DIR) are sharded, as step 18's: every stage writes its
// own layers and Adam's moments of them (its D replicas sharing the rows), beside
// an index of where each piece lies; the same command resumes mid-epoch, bit for
// bit, and another --pp resumes it too, each stage reading the layers it now holds
// (common/records/sharded_checkpoint.h). --async_save and --save_errors as step 18's.
//
// Build and run:
//   make day4/16_pipeline_ddp
//   mpirun -np 2 day4/16_pipeline_ddp --pp 2                     (add --oversubscribe on fewer cores)
//   mpirun -np 2 day4/16_pipeline_ddp --pp 2 --micro_batches 4 --schedule gpipe
//   mpirun -np 4 day4/16_pipeline_ddp --pp 4 --hidden 512,512,512 --micro_batches 8 --print_schedule
//   mpirun -np 2 day4/16_pipeline_ddp --pp 2 --hidden 1024,1024,1024 --micro_batches 4 --timeline img/16_timeline.png
//   mpirun -np 2 day4/16_pipeline_ddp --pp 2 --max_steps 12 --checkpoint checkpoints/pp
//   mpirun -np 1 day4/16_pipeline_ddp --pp 1 --checkpoint checkpoints/pp      # resumed as one stage
//
// Expected output (2 ranks on 2 cores; times and idle shares vary):
//   Step 16: 2 pipeline stages x 1 replica: MLP 784-128-10, 101770 weights; 1f1b schedule, 1 micro-batch of 6400 rows; Adam lr 0.001; batch 6400 per replica; 5 epochs; shuffle on (seed 0); cpu, 1 thread per rank, ...
//   rank 0: stage 0 of 2 (fc.0), replica 0 of 1
//   rank 1: stage 1 of 2 (fc.2), replica 0 of 1
//   epoch 1/5: mean loss 1.9859 over 10 steps, 0.28 s, 211557 samples/s; idle: stage 0 10%, stage 1 91%
//   ...
//   epoch 5/5: mean loss 0.4724 over 10 steps, 0.24 s, 246214 samples/s; idle: stage 0 11%, stage 1 93%
//   World Size: 2. Training completed in 1.25 seconds. Test accuracy: 89.14% (8914 of 10000)
//   Pipeline: 1f1b, 1 micro-batch; the bubble of equal stages: (P - 1) / (M + P - 1) = 50%
//   stage  layers           work    forward   backward   idle  predicted  activations held at most
//       0  fc.0            98.7%    9.97 ms   10.17 ms    11%         8%  1 micro-batch, 3.28 MB
//       1  fc.2             1.3%    0.84 ms    0.86 ms    93%        92%  1 micro-batch, 3.79 MB
//   [rank 1] parameter checksum 9813245f45e0e358 (the whole model: stages 0 to 1 of replica 0)
//   Loss curve: img/16_pipeline_ddp.png
// (Step 2's losses, accuracy and weights: the checksum is step 2's and step 6's on one rank.)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"                // args_parse: the flags and --help
#include "base/check.h"               // CHECK, xmalloc, usage_error: fail fast, on every rank
#include "base/timer.h"               // wall_seconds
#include "comm/collectives.h"         // group_exchange: activations and gradients, stage to stage
#include "comm/group.h"               // group_split, group_gather_figures: the groups, the per-stage tables
#include "data/mnist.h"               // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"                // mlp_sizes_from_hidden, mlp_name_layer: the MLP's widths and names
#include "parallel/ddp.h"             // ddp_wrap_group: DistributedDataParallel over a process group
#include "parallel/pipeline_stage.h"  // Stage: this rank's layers, forward and backward per micro-batch
#include "parallel/schedule.h"        // Schedule: GPipe and 1F1B as lists of actions
#include "parallel/stage_timer.h"     // StageTimer: each action's compute and the idle time, on the GPU's clock there
#include "records/h5.h"               // h5_load_params: weights as HDF5 (--init)
#include "records/loss_log.h"         // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/plot.h"             // plot_timeline_png: the schedule, stage by stage
#include "records/sharded_checkpoint.h"  // sharded_checkpoint_save_step, _resume: each rank its shards, any layout resumes
#include "records/tracking.h"         // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "records/whole_model.h"      // whole_model_gather: the whole model's checksum and --save
#include "runtime/dist.h"             // dist_init, dist_rank, print0: the world
#include "runtime/memory_budget.h"    // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/profile.h"          // profile_start, profile_push: named time ranges (--trace)
#include "runtime/threads.h"          // threads_init: this rank's CPU threads
#include "train/accum.h"              // rows_in_batches: the samples of the batches done (the data position)
#include "train/divergence.h"         // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_losses.h"        // StepLosses: each step's loss, read when the program needs it
#include "train/train_options.h"      // TrainOptions, TRAIN_FLAGS: the flags every training program takes

// Stage s of P takes layers [first, end): an even share of the Linears, as
// torch.distributed.pipelining's split points at equal layer counts would.
static int stage_first_layer(int stage, int stages, int layers) { return stage * layers / stages; }

// "fc.0" or "fc.2 to fc.6": a stage's layers by their state_dict names.
static void describe_layers(int first, int end, char *out, size_t size) {
    if (end - first == 1) snprintf(out, size, "fc.%d", 2 * first);
    else snprintf(out, size, "fc.%d to fc.%d", 2 * first, 2 * (end - 1));
}

// A batch of `rows` rows in M micro-batches: the first rows % M take one row more.
static int micro_rows(int rows, int micro_batches, int i) { return rows / micro_batches + (i < rows % micro_batches); }
static int micro_offset(int rows, int micro_batches, int i) {
    int offset = 0;
    for (int j = 0; j < i; j++) offset += micro_rows(rows, micro_batches, j);
    return offset;
}

// One optimizer step's forwards and backwards on this stage, in the order the
// schedule gives them (torch's schedule.step(x) / step(target=y, losses=...)).
// Before each action, one exchange with the neighbouring stages: what the
// last action produced goes out, what this one needs comes in. The last stage
// writes the batch's loss into `losses` (its micro-batches' shares: on a GPU it
// stays there). The timer times each action's compute and the step, on the GPU's
// own clock on a GPU (stage_timer.h): nothing here waits for the GPU.
static void pipeline_step(Stage *stage, const Schedule *schedule, int stage_index, const Group *pipeline,
                          const Tensor *images, const int *labels, const int *device_labels, int rows, Ddp *ddp,
                          StepLosses *losses, StageTimer *timer, bool keep_timeline) {
    int m = schedule->micro_batches;
    const Action *actions = schedule_actions(schedule, stage_index);
    P2pSend send = {0};
    int n_send = 0, n_losses = 0;
    stage_timer_step_start(timer);
    for (int k = 0; k < 2 * m; k++) {
        int i = actions[k].micro_batch, rows_i = micro_rows(rows, m, i), offset = micro_offset(rows, m, i);
        bool forward = actions[k].kind == ACTION_FORWARD;
        // Receive: activations from the stage before, or gradients from the stage after.
        P2pReceive receive = {0};
        int n_receive = 0;
        if (forward && !stage->is_first) receive = (P2pReceive){stage_input(stage, i, rows_i), stage_index - 1}, n_receive = 1;
        if (!forward && !stage->is_last) receive = (P2pReceive){stage_grad_output(stage, rows_i), stage_index + 1}, n_receive = 1;
        profile_push("exchange");
        group_exchange(pipeline, &send, n_send, &receive, n_receive);
        profile_pop();
        n_send = 0;
        stage_timer_compute_start(timer, k);  // (on a GPU, marked once what came in is there)

        if (forward) {
            // The first stage's input is micro-batch i's rows of the batch; the others', what came in.
            Tensor rows_of_batch = stage->is_first ? tensor_row_range(images, offset, rows_i) : (Tensor){0};
            const Tensor *out = stage_forward(stage, i, stage->is_first ? &rows_of_batch : receive.tensor);
            if (stage->is_last) {
                float weight = (float)rows_i / (float)rows;  // its share of the batch
                stage_loss_to(stage, i, labels + offset, device_labels ? device_labels + offset : NULL, weight,
                              step_losses_next_share(losses, weight, n_losses++ == 0));  // loss += weight * criterion(output, target)
            } else {
                send = (P2pSend){out, stage_index + 1}, n_send = 1;
            }
        } else {
            // DDP averages this stage's gradients over its replicas during the
            // last micro-batch's backward (model.no_sync() for the others).
            ddp_set_sync(ddp, i == m - 1);
            const Tensor *grad_input = stage_backward(stage, i, ddp_grad_ready, ddp);
            if (!stage->is_first) send = (P2pSend){grad_input, stage_index - 1}, n_send = 1;
        }
        stage_timer_compute_end(timer, k, forward);
    }
    group_exchange(pipeline, &send, n_send, NULL, 0);  // the last action's output
    stage_timer_step_end(timer, keep_timeline);
}

// The test set through the pipeline, forward only, in chunks of `chunk` rows:
// the last stage counts the correct predictions; every stage returns the count.
static long pipeline_correct(Stage *stage, int stage_index, const Group *pipeline, const Tensor *images,
                             const int *labels, int n, int chunk) {
    long correct = 0;
    int *predictions = xmalloc((size_t)chunk * sizeof(int));
    for (int start = 0, c = 0; start < n; start += chunk, c++) {
        int rows = n - start < chunk ? n - start : chunk;
        Tensor rows_of_set = {0};
        const Tensor *x = &rows_of_set;
        if (stage->is_first)
            rows_of_set = (Tensor){.data = images->data + (size_t)start * images->cols, .rows = rows,
                                   .cols = images->cols, .device = images->device};
        else {
            P2pReceive receive = {stage_input(stage, c, rows), stage_index - 1};
            group_exchange(pipeline, NULL, 0, &receive, 1);
            x = receive.tensor;
        }
        const Tensor *out = stage_forward(stage, c, x);
        if (stage->is_last) {
            argmax_rows(out, predictions);
            for (int r = 0; r < rows; r++) correct += predictions[r] == labels[start + r];
        } else {
            P2pSend send = {out, stage_index + 1};
            group_exchange(pipeline, &send, 1, NULL, 0);
            // As in training, the exchange is waited for before the host goes on (to an MPI call
            // below): a GPU sends by itself, but tests/fake_gpu runs a stream only when waited for.
            device_synchronize();
        }
        stage_release(stage, c);
    }
    free(predictions);
    float count = (float)correct;  // exact: at most 10000
    dist_broadcast_over(pipeline->mpi, &count, 1, pipeline->size - 1);
    return (long)count;
}

// The reports, after main: the whole model, its layers brought to stage 0 one by
// one (for the checksum and --save), and --timeline.
typedef struct {
    const Stage *stage;
    const Group *pipeline;
    int n_layers;  // the whole model's
} StageOfModel;
static void gather_stage_layer(void *stage_of_model, int layer, Param pair[2]);
static void draw_timeline(const char *path, const Schedule *schedule, const StageTimer *timer, const Group *pipeline,
                          int replica, const double *forward_of, const double *backward_of);

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/16_pipeline_ddp.png");
    int pp = 1, micro_batches = 1, print_schedule = 0, max_steps = -1;
    const char *hidden = "128", *schedule_flag = "1f1b", *trace = NULL, *timeline = NULL, *checkpoint = NULL, *save_errors = "stop";
    int save_every = 0, keep = 2, async_save = 0;
    double bucket_mb = 25.0;
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"pp", ARG_INT, &pp, "P", "pipeline stages (the world is P stages x world / P replicas)", 1, NULL},
        {"micro_batches", ARG_INT, &micro_batches, "M", "micro-batches a batch is cut into (a divisor of --batch_size)", 1, NULL},
        {"schedule", ARG_STRING, &schedule_flag, "NAME", "the order of each stage's forwards and backwards", 0, "gpipe|1f1b"},
        {"hidden", ARG_STRING, &hidden, "W,W,...", "the hidden layers' widths (512,512,512: four Linears)", 0, NULL},
        {"max_steps", ARG_INT, &max_steps, "N", "stop after N optimizer steps, overriding --epochs (-1: --epochs decides)", -1, NULL},
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "gradient bucket size of each stage's DDP; 0: one bucket per tensor", 0, NULL},
        {"print_schedule", ARG_SWITCH, &print_schedule, NULL, "print each stage's actions", 0, NULL},
        {"timeline", ARG_OUTPUT_OR_NONE, &timeline, "FILE.png", "the last full step's timeline, and both schedules replayed", 0, NULL},
        {"trace", ARG_OUTPUT_OR_NONE, &trace, "FILE.json", "Chrome trace of every rank's ranges (see step 5; '' for none)", 0, NULL},
        {"checkpoint", ARG_STRING, &checkpoint, "DIR", CHECKPOINT_HELP_DIR, 0, NULL},
        {"save_every", ARG_INT, &save_every, "N", CHECKPOINT_HELP_SAVE_EVERY, 0, NULL},
        {"keep", ARG_INT, &keep, "N", CHECKPOINT_HELP_KEEP, 1, NULL},
        {"async_save", ARG_SWITCH, &async_save, NULL, CHECKPOINT_HELP_ASYNC_SAVE, 0, NULL},
        {"save_errors", ARG_STRING, &save_errors, "WHAT", CHECKPOINT_HELP_SAVE_ERRORS, 0, "stop|continue"},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 16: the MLP split into pipeline stages across ranks (GPipe, 1F1B), each stage under DDP.");
    checkpoint_flags_check(checkpoint);  // --save_every, --keep, --async_save, --save_errors: only with --checkpoint
    bool save_errors_continue = strcmp(save_errors, "continue") == 0;
    int rank = dist_rank(), world = dist_world_size();
    int sizes[MLP_MAX_SIZES];
    int n_sizes = mlp_sizes_from_hidden(hidden, MNIST_PIXELS, MNIST_CLASSES, sizes), n_layers = n_sizes - 1;
    char model_name[128];
    mlp_describe_sizes(sizes, n_sizes, model_name, sizeof model_name);
    size_t weights = 0;  // the whole model's, though no rank holds them all
    for (int l = 0; l < n_layers; l++) weights += (size_t)sizes[l] * sizes[l + 1] + sizes[l + 1];
    ScheduleKind kind;
    if (!schedule_kind_from_name(schedule_flag, &kind)) usage_error("--schedule %s: expected gpipe or 1f1b", schedule_flag);
    if (world % pp != 0)
        usage_error("--pp %d: the world size %d is not a multiple of it (the world is P stages x D replicas)", pp, world);
    if (pp > n_layers)
        usage_error("--pp %d: the MLP %s has %d Linear layer%s, so at most %d stage%s (--hidden 512,512,512 makes 4)", pp,
                    model_name, n_layers, n_layers == 1 ? "" : "s", n_layers, n_layers == 1 ? "" : "s");
    if (micro_batches > opt.batch_size || opt.batch_size % micro_batches != 0)
        usage_error("--micro_batches %d: expected a divisor of --batch_size %d", micro_batches, opt.batch_size);
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory: this rank's stage, refused now if it would not fit (exit 2): its layers' state, and as
    // many micro-batches' activations as the schedule keeps in flight on it (GPipe M, 1F1B P - stage).
    Schedule schedule = schedule_new(kind, pp, micro_batches);
    int my_stage = rank % pp;  // (the grid, below)
    MemoryNeed need = memory_need("--hidden %s --pp %d --micro_batches %d --batch_size %d --schedule %s", hidden, pp,
                                  micro_batches, opt.batch_size, schedule_kind_name(kind));
    stage_add_memory_need(&need, sizes, n_sizes, stage_first_layer(my_stage, pp, n_layers),
                          stage_first_layer(my_stage + 1, pp, n_layers),
                          opt.batch_size / micro_batches, schedule_max_in_flight(&schedule, my_stage));
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);

    // The grid: rank = replica x P + stage. A replica's stages are neighbours,
    // so on a node its activations go through shared memory (or NVLink).
    int stage_index = rank % pp, replica = rank / pp, replicas = world / pp;
    Group pipeline = group_split(replica, stage_index);       // my replica's stages, in order
    Group data_parallel = group_split(stage_index, replica);  // my stage's replicas

    // Data: replica d takes positions d, d + D, ... (a sampler over D, not the world);
    // every stage of a replica walks the same batches.
    MnistSplit train = mnist_load(opt.data, MNIST_TRAIN);
    MnistSplit test = mnist_load(opt.data, MNIST_TEST);
    DistributedSampler sampler = sampler_new(train.n, replicas, replica, !opt.no_shuffle, (uint64_t)opt.seed);
    int last_rows = sampler.num_samples - (sampler_num_batches(&sampler, opt.batch_size) - 1) * opt.batch_size;
    if (last_rows < micro_batches)
        usage_error("--micro_batches %d: each replica's last batch has %d rows (%d samples in batches of %d), fewer "
                    "than the micro-batches", micro_batches, last_rows, sampler.num_samples, opt.batch_size);
    int steps_per_epoch = sampler_num_batches(&sampler, opt.batch_size);
    int epochs = max_steps < 0 ? opt.epochs : (max_steps + steps_per_epoch - 1) / steps_per_epoch;

    // Model: this rank's stage, layers [first, end) of the MLP, initialised as
    // the whole model would be (every rank draws every layer's weights in order).
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);  // torch.manual_seed(seed)
    int first = stage_first_layer(stage_index, pp, n_layers), end = stage_first_layer(stage_index + 1, pp, n_layers);
    Stage stage = stage_new(sizes, n_sizes, first, end, opt.batch_size / micro_batches, &rng, device);
    if (opt.init) h5_load_params(opt.init, stage.params, stage.n_params);  // its own layers, by name
    Ddp ddp = ddp_wrap_group(stage.params, stage.n_params, bucket_mb, &data_parallel);  // DDP(stage, process_group)
    Adam optimizer = adam_new(stage.params, stage.n_params, opt.lr);

    char steps_text[64] = "";
    if (max_steps >= 0) snprintf(steps_text, sizeof steps_text, " (--max_steps %d)", max_steps);
    print0("Step 16: %d pipeline stage%s x %d replica%s: MLP %s, %zu weights; %s schedule, %d micro-batch%s of %d "
           "rows; Adam lr %g; batch %d per replica; %d epoch%s%s; shuffle %s (seed %d); %s, %s\n",
           pp, pp == 1 ? "" : "s", replicas, replicas == 1 ? "" : "s", model_name, weights, schedule_kind_name(kind),
           micro_batches, micro_batches == 1 ? "" : "es", opt.batch_size / micro_batches, opt.lr, opt.batch_size,
           epochs, epochs == 1 ? "" : "s", steps_text, opt.no_shuffle ? "off" : "on", opt.seed, device_name(device),
           threads_describe());
    for (int r = 0; r < world; r++) {  // rank 0 knows the grid: it is arithmetic
        char layers[64];
        int s = r % pp;
        describe_layers(stage_first_layer(s, pp, n_layers), stage_first_layer(s + 1, pp, n_layers), layers, sizeof layers);
        print0("rank %d: stage %d of %d (%s), replica %d of %d\n", r, s, pp, layers, r / pp, replicas);
    }
    if (print_schedule) {
        char text[8192];
        schedule_format(&schedule, text, sizeof text);
        print0("%s", text);
    }

    // --checkpoint: resume from DIR's current checkpoint, whatever --pp saved it. Each stage reads
    // the layers it holds now; saving, each writes its own layers and Adam's moments of them, its
    // D replicas sharing the writing (each its 1/D of every tensor's rows).
    LossLog losses = {0};
    CheckpointState state = {.program = "day4/16_pipeline_ddp", .world_size = world,
                             .global_batch = (long)opt.batch_size * replicas, .seed = opt.seed, .shuffle = !opt.no_shuffle,
                             .train_samples = train.n, .lr = opt.lr, .generator = rng, .losses = &losses};
    snprintf(state.layout, sizeof state.layout, "%d pipeline stage%s x %d replica%s", pp, pp == 1 ? "" : "s", replicas,
             replicas == 1 ? "" : "s");
    CheckpointBox *boxes = xcalloc((size_t)stage.n_params + 1, sizeof(CheckpointBox));
    for (int i = 0; i < stage.n_params; i++) boxes[i] = checkpoint_whole_box(stage.params[i].value, replica, replicas);
    CheckpointPieces wanted = checkpoint_param_pieces(stage.params, optimizer.exp_avg, optimizer.exp_avg_sq, stage.n_params, boxes, false);
    CheckpointPieces saved = checkpoint_param_pieces(stage.params, optimizer.exp_avg, optimizer.exp_avg_sq, stage.n_params, boxes, true);
    long steps = 0, resumed_step = -1;
    int first_epoch = 0;
    long first_position = 0;  // of first_epoch's sampler order, trained on before a resume
    if (checkpoint && sharded_checkpoint_resume(checkpoint, wanted.piece, wanted.n, &state, opt.init)) {
        steps = resumed_step = state.step, first_epoch = state.epoch, first_position = state.samples_done;
        optimizer.step = steps;
        rng = state.generator;
    }
    // The MLflow run: a resume logs into the checkpoint's, its losses so far sent again where the
    // store lacks them (the process that saved it may have died with them queued).
    Tracking *run = tracking_start(&opt.tracking, "day4/16_pipeline_ddp.c", device_name(device),
                                   state.mlflow_run_id, args_values());  // mlflow.start_run(run_id=...); mlflow.log_params(vars(args))
    snprintf(state.mlflow_run_id, sizeof state.mlflow_run_id, "%s", tracking_run_id(run));
    for (int i = 0; i < losses.n; i++) tracking_log_metric(run, "loss", losses.loss[i], i);

    Tensor batch_images = tensor_zeros(stage.is_first ? opt.batch_size : 0, MNIST_PIXELS, device);  // [B, 784]
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));                               // [B]
    // The last stage's loss of each step stays on the GPU until the host needs it (step_losses.h): at an
    // epoch's end, the last step, or a checkpoint (which keeps the losses so far). No step waits for it.
    StepLosses pending = step_losses_new(steps_per_epoch, device);
    float *told = xmalloc((size_t)steps_per_epoch * sizeof(float));  // those losses, told to every stage
    int untold = 0;                                                   // steps since they last were
    // Each action's compute and the idle time, timed on the GPU's clock on a GPU (stage_timer.h); with
    // --timeline each step's start on the host's clock too, to line the stages up.
    StageTimer *timer = stage_timer_new(2 * micro_batches, device, timeline && *timeline);
    double total_forward = 0, total_backward = 0, total_idle = 0, total_all = 0;
    long total_steps = 0;

    if (trace) profile_start(trace);
    CheckpointSave *in_flight = NULL;  // --async_save: the save a thread is writing
    double train_start = wall_seconds();
    for (int epoch = first_epoch; epoch < epochs && (max_steps < 0 || steps < max_steps); epoch++) {
        double epoch_start = wall_seconds();
        long skipped = epoch == first_epoch ? first_position : 0;  // a resumed epoch goes on where it stopped
        sampler_set_epoch_from(&sampler, epoch, skipped);
        int n_batches = sampler_num_batches(&sampler, opt.batch_size), epoch_steps = 0, taken = 0;
        long samples = 0;
        double loss_sum = 0.0;  // over this epoch's steps, those before a resume included
        for (int i = 0; i < losses.n; i++)
            if (losses.epoch[i] == epoch) loss_sum += losses.loss[i], epoch_steps++;
        for (int b = 0; b < n_batches && (max_steps < 0 || steps < max_steps); b++) {
            Tensor x = {0};
            int rows = stage.is_first ? (x = mnist_batch(&train, &sampler, b, opt.batch_size, &batch_images, batch_labels)).rows
                                      : mnist_batch_labels(&train, &sampler, b, opt.batch_size, batch_labels,
                                                           stage.is_last ? device : DEVICE_CPU);
            stage_zero_grad(&stage);  // optimizer.zero_grad()
            pipeline_step(&stage, &schedule, stage_index, &pipeline, &x, batch_labels, mnist_batch_device_labels(&train),
                          rows, &ddp, &pending, timer, rows == opt.batch_size);
            ddp_finish(&ddp);         // this stage's gradients averaged over its replicas
            adam_step(&optimizer);    // optimizer.step(): each stage steps its own layers
            steps++, untold++;
            bool epoch_done = b + 1 == n_batches, save_now = checkpoint && save_every > 0 && steps % save_every == 0;
            // loss.item(): at once on a CPU; on a GPU the steps' losses since the last hand-over, when due. The
            // last stage holds them: summed over its replicas, divided, then told to every stage.
            if (device == DEVICE_CPU || epoch_done || steps == max_steps || save_now) {
                // Every stage's queued work runs before the host's collectives: what the last stage waits
                // for includes this stage's sends (a GPU runs them by itself, tests/fake_gpu when waited for).
                device_synchronize();
                if (stage.is_last) {
                    float *held;
                    int n_held = step_losses_take_all(&pending, true, &held);
                    CHECK(n_held == untold, "pipeline: %d step losses for %d steps", n_held, untold);
                    dist_allreduce_sum_over(data_parallel.mpi, held, (size_t)n_held);
                    for (int i = 0; i < n_held; i++) told[i] = held[i] / (float)replicas;
                }
                dist_broadcast_over(pipeline.mpi, told, (size_t)untold, pp - 1);
                for (int i = 0; i < untold; i++) {
                    float loss = told[i];
                    check_loss_finite(loss, losses.n + 1, epoch + 1, run);  // the same on every rank: summed, then broadcast
                    loss_log_add(&losses, epoch, loss);
                    tracking_log_metric(run, "loss", loss, losses.n - 1);  // mlflow.log_metric("loss", loss, step=step)
                    loss_sum += loss;
                }
                untold = 0;
            }
            samples += (long)rows * replicas;
            epoch_steps++, taken++;
            // Where the run stands: the data position is the sampler positions of the batches done.
            state.step = steps, state.epoch = epoch_done ? epoch + 1 : epoch, state.generator = rng;
            state.samples_done = epoch_done ? 0 : skipped + (long)replicas * rows_in_batches(sampler.num_samples, opt.batch_size, 0, b + 1);
            if (save_now) {
                check_weights_finite(stage.params, stage.n_params, steps, epoch + 1, run);  // never a NaN checkpoint over a good one
                sharded_checkpoint_save_step(async_save ? &in_flight : NULL, checkpoint, keep, save_errors_continue, saved.piece,
                                             saved.n, &state);
            }
        }
        double seconds = wall_seconds() - epoch_start;
        if (samples == 0) continue;  // (a resume at the end of an epoch)
        // Each stage's idle share this epoch: the bubble, measured.
        StageTimes times = stage_timer_take(timer);
        double idle = times.all > 0 ? times.idle / times.all : 0, *idle_of = group_gather_figures(&pipeline, &idle, 1, false);
        char shares[256] = "";
        for (int s = 0, used = 0; idle_of && s < pp && used < (int)sizeof shares; s++)
            used += snprintf(shares + used, sizeof shares - used, "%sstage %d %.0f%%", s ? ", " : "", s, 100 * idle_of[s]);
        free(idle_of);
        print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s; idle: %s\n", epoch + 1, epochs,
               loss_sum / epoch_steps, epoch_steps, epoch_steps == 1 ? "" : "s", seconds, samples / seconds, shares);
        tracking_log_metric(run, "epoch_mean_loss", loss_sum / epoch_steps, epoch);
        tracking_log_metric(run, "samples_per_second", samples / seconds, epoch);
        total_forward += times.forward, total_backward += times.backward, total_idle += times.idle, total_all += times.all;
        total_steps += taken;
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    check_weights_finite(stage.params, stage.n_params, losses.n, epochs, run);  // the last step's update
    bool end_saved = true;  // false: the last step's checkpoint failed twice (--save_errors continue)
    // The end of training saved, where no --save_every save holds it (--async_save: the one in flight finished first).
    if (checkpoint && steps == resumed_step) print0("Nothing left to train: the checkpoint is at step %ld\n", steps);
    else if (checkpoint)
        end_saved = sharded_checkpoint_save_last(&in_flight, checkpoint, keep, save_errors_continue, saved.piece, saved.n,
                                                 &state);
    size_t peak_activations = stage_peak_activation_bytes(&stage);  // before the evaluation's own slots

    Tensor test_images = mnist_images(&test, stage.is_first ? device : DEVICE_CPU);  // [10000, 784]
    profile_push("evaluation");  // in a trace, the test set's forwards apart from training's
    long correct = pipeline_correct(&stage, stage_index, &pipeline, &test_images, test.labels, test.n, opt.batch_size);
    profile_pop();
    print0("World Size: %d. Training completed in %.2f seconds. Test accuracy: %.2f%% (%ld of %d)\n", world,
           train_seconds, 100.0 * correct / test.n, correct, test.n);
    tracking_log_metric(run, "test_accuracy", (double)correct / test.n, epochs);

    // Per stage: its share of the work, its times per micro-batch, and its idle
    // share measured beside the replay's prediction and the textbook's.
    double per_micro = total_steps ? 1.0 / ((double)total_steps * micro_batches) : 0;  // (0: a resume with nothing left)
    enum { FIGURES = 6 };
    double mine[FIGURES] = {stage_flops_per_sample(&stage), total_forward * per_micro, total_backward * per_micro,
                            total_all ? total_idle / total_all : 0, stage.peak_live, (double)peak_activations};
    double *all = group_gather_figures(&pipeline, mine, FIGURES, true);  // every stage replays the schedule
    double *forward_of = xmalloc((size_t)pp * sizeof(double)), *backward_of = xmalloc((size_t)pp * sizeof(double));
    double flops = 0;
    for (int s = 0; s < pp; s++)
        forward_of[s] = all[FIGURES * s + 1], backward_of[s] = all[FIGURES * s + 2], flops += all[FIGURES * s];
    Replay replay;
    char why[256];
    CHECK(schedule_replay(&schedule, forward_of, backward_of, &replay, why, sizeof why), "schedule replay: %s", why);
    print0("Pipeline: %s, %d micro-batch%s; the bubble of equal stages: (P - 1) / (M + P - 1) = %.0f%%\n",
           schedule_kind_name(kind), micro_batches, micro_batches == 1 ? "" : "es",
           100 * schedule_bubble(pp, micro_batches));
    // Per micro-batch: forward and backward times; idle: measured, and the
    // replay of this schedule with those times; the activations' peak, measured.
    print0("stage  layers           work    forward   backward   idle  predicted  activations held at most\n");
    for (int s = 0; s < pp; s++) {
        char layers[64];
        const double *f = &all[FIGURES * s];
        describe_layers(stage_first_layer(s, pp, n_layers), stage_first_layer(s + 1, pp, n_layers), layers, sizeof layers);
        double predicted = replay.idle_share[s] > 0 ? replay.idle_share[s] : 0;  // not "-0%" from rounding
        print0("%5d  %-14s %5.1f%%  %6.2f ms  %6.2f ms  %4.0f%%  %8.0f%%  %.0f micro-batch%s, %.2f MB\n", s, layers,
               100 * f[0] / flops, 1e3 * f[1], 1e3 * f[2], 100 * f[3], 100 * predicted, f[4], f[4] == 1 ? "" : "es",
               f[5] / 1e6);
    }
    if (timeline && *timeline) draw_timeline(timeline, &schedule, timer, &pipeline, replica, forward_of, backward_of);
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    if (replicas > 1) print0("DDP (stage 0's): %s\n", overlap);
    // The whole model's checksum (step 6's for the same weights) and --save (replica 0's file, in step
    // 6's layout, so that weights go freely between the two programs).
    StageOfModel of_model = {&stage, &pipeline, n_layers};
    unsigned long long checksum = whole_model_gather(&pipeline, sizes, n_sizes, WHOLE_ON_ROOT, gather_stage_layer,
                                                     &of_model, replica == 0 ? opt.save : NULL);
    if (stage.is_last)
        print_rank("parameter checksum %016llx (the whole model: stages 0 to %d of replica %d)\n", checksum, pp - 1,
                   replica);

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.plot && *opt.plot) {
        char title[96];
        snprintf(title, sizeof title, "Step 16: MNIST training loss, %d stage%s x %d replica%s", pp, pp == 1 ? "" : "s",
                 replicas, replicas == 1 ? "" : "s");
        loss_log_plot(&losses, opt.plot, title, "mean loss");
        print0("Loss curve: %s\n", opt.plot);
    }
    tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
    tracking_log_artifact(run, opt.save);
    tracking_log_artifact(run, opt.plot);
    tracking_end(run, TRACKING_FINISHED);    // mlflow.end_run()

    replay_free(&replay);
    free(all), free(forward_of), free(backward_of);
    stage_timer_free(timer);
    step_losses_free(&pending);
    free(told);
    tensor_free(&test_images);
    tensor_free(&batch_images);
    free(batch_labels);
    loss_log_free(&losses);
    checkpoint_pieces_free(&wanted), checkpoint_pieces_free(&saved), free(boxes);
    schedule_free(&schedule);
    adam_free(&optimizer);
    ddp_free(&ddp);
    stage_free(&stage);
    group_free(&data_parallel);
    group_free(&pipeline);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    sharded_checkpoint_check_end_saved(end_saved, checkpoint);  // the outputs written: exit 1 if the end is not checkpointed
    dist_finalize();
    return 0;
}

// ------------------------------------------------------------------ the reports

// whole_model_gather's: layer `layer` from the stage that holds it, sent to stage 0 (the
// pipeline's rank 0), which keeps its own.
static void gather_stage_layer(void *stage_of_model, int layer, Param pair[2]) {
    const StageOfModel *of = stage_of_model;
    const Stage *stage = of->stage;
    int holder = 0;  // the stage whose layers [first, end) include `layer`
    while (stage_first_layer(holder + 1, of->pipeline->size, of->n_layers) <= layer) holder++;
    bool mine = holder == of->pipeline->rank;
    for (int k = 0; k < 2; k++) {  // the weight, then the bias
        if (mine) {
            const Linear *held = &stage->layers[layer - stage->first_layer];
            const Tensor *value = k ? &held->bias : &held->weight;
            if (pair[k].value) {
                tensor_copy(pair[k].value, value);
                continue;
            }
            float *values = xmalloc(tensor_numel(value) * sizeof(float));
            tensor_to_host(value, values);
            CHECK_MPI(MPI_Send(values, (int)tensor_numel(value), MPI_FLOAT, 0, 2, of->pipeline->mpi));
            free(values);
        } else if (pair[k].value) {
            CHECK_MPI(MPI_Recv(pair[k].value->data, (int)tensor_numel(pair[k].value), MPI_FLOAT, holder, 2,
                               of->pipeline->mpi, MPI_STATUS_IGNORE));
        }
    }
}

// --timeline: the last step of every stage of replica 0, as measured, above
// both schedules replayed with the stages' measured times per micro-batch
// (schedule_replay): where the bubble is, and what 1F1B changes.
static void draw_timeline(const char *path, const Schedule *schedule, const StageTimer *timer, const Group *pipeline,
                          int replica, const double *forward_of, const double *backward_of) {
    if (replica != 0) return;
    int p = schedule->stages, m = schedule->micro_batches, n = 2 * m;
    double *mine = xcalloc((size_t)(2 * n + 1), sizeof(double));  // (zeros: no full step was timed)
    stage_timer_kept(timer, &mine[0], &mine[1], &mine[1 + n]);
    double *all = group_gather_figures(pipeline, mine, 2 * n + 1, false);
    if (pipeline->rank == 0) {
        double first_start = all[0];
        for (int s = 1; s < p; s++) first_start = all[s * (2 * n + 1)] < first_start ? all[s * (2 * n + 1)] : first_start;
        PlotBlock *blocks = xmalloc((size_t)3 * p * n * sizeof(PlotBlock));
        PlotTimelinePanel panels[3];
        char titles[3][96];
        snprintf(titles[0], sizeof titles[0], "%s, measured: the last full step", schedule_kind_name(schedule->kind));
        for (int s = 0; s < p; s++) {
            const double *row = &all[s * (2 * n + 1)], shift = row[0] - first_start;
            const Action *actions = schedule_actions(schedule, s);
            for (int k = 0; k < n; k++)
                blocks[s * n + k] = (PlotBlock){.row = s, .start = 1e3 * (shift + row[1 + k]),
                                                .end = 1e3 * (shift + row[1 + n + k]), .label = actions[k].micro_batch,
                                                .kind = actions[k].kind == ACTION_FORWARD ? PLOT_FORWARD : PLOT_BACKWARD};
        }
        panels[0] = (PlotTimelinePanel){.title = titles[0], .n_rows = p, .blocks = blocks, .n_blocks = p * n};
        ScheduleKind kinds[2] = {SCHEDULE_GPIPE, SCHEDULE_1F1B};
        for (int j = 0; j < 2; j++) {
            Schedule other = schedule_new(kinds[j], p, m);
            Replay replay;
            char why[256];
            CHECK(schedule_replay(&other, forward_of, backward_of, &replay, why, sizeof why), "replay: %s", why);
            PlotBlock *panel_blocks = blocks + (size_t)(1 + j) * p * n;
            for (int s = 0; s < p; s++) {
                const Action *actions = schedule_actions(&other, s);
                for (int k = 0; k < n; k++)
                    panel_blocks[s * n + k] = (PlotBlock){.row = s, .start = 1e3 * replay.intervals[s * n + k].start,
                                                          .end = 1e3 * replay.intervals[s * n + k].end,
                                                          .label = actions[k].micro_batch,
                                                          .kind = actions[k].kind == ACTION_FORWARD ? PLOT_FORWARD
                                                                                                    : PLOT_BACKWARD};
            }
            snprintf(titles[1 + j], sizeof titles[1 + j], "%s, replayed with these stages' times: idle %.0f%% on stage 0",
                     schedule_kind_name(kinds[j]), 100 * replay.idle_share[0]);
            panels[1 + j] = (PlotTimelinePanel){.title = titles[1 + j], .n_rows = p, .blocks = panel_blocks,
                                                .n_blocks = p * n};
            replay_free(&replay);
            schedule_free(&other);
        }
        char title[128];
        snprintf(title, sizeof title, "Step 16: %d stage%s, %d micro-batch%s", p, p == 1 ? "" : "s", m, m == 1 ? "" : "es");
        plot_timeline_png(path, title, "time in the step (ms)", panels, 3);
        print0("Timeline: %s\n", path);
        free(blocks);
    }
    free(mine);
    free(all);
}
