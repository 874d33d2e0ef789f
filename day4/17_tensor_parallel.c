// Step 17: every Linear split across ranks (Megatron's tensor parallelism), under DDP.
//                        PyTorch twin: Megatron-LM's ColumnParallelLinear and RowParallelLinear
//                        (picotron's tensor_parallel.py), each shard wrapped in DDP over its
//                        data-parallel group
//
// What it changes from step 16: step 16 gave each rank whole layers; here each
// rank holds 1/T of every layer, and all T ranks compute every layer together.
// The MLP's Linears go in pairs, as Megatron splits a transformer's MLP:
//   the first of a pair is column-parallel: rank t holds rows [t w/T, (t+1) w/T) of
//     its weight and bias (1/T of the hidden units), computes them from the whole
//     input, and applies the ReLU to them (elementwise: no communication);
//   the second is row-parallel: rank t holds the matching columns of its weight,
//     multiplies its 1/T of the hidden units, and the T partial products are summed
//     by an allreduce; its bias, whole on every rank, is added once, after the sum.
// Megatron calls the two communication points f and g:
//   f, at a column-parallel layer's input: identity in forward, allreduce in backward
//     (each rank's input gradient covers only its hidden units);
//   g, at a row-parallel layer's output: allreduce in forward, identity in backward.
// So a pair costs one allreduce of [B, pair's output width] in forward and one of
// [B, pair's input width] in backward, and none for the first pair's f: its input
// is the data, which needs no gradient. A deeper --hidden alternates column and
// row (784-512-512-512-10: two pairs); an odd last Linear (the one to the 10
// classes) is kept whole on every rank. Every rank of a tensor-parallel group
// reads the same batch. The world is T tensor-parallel ranks x D = world / T
// replicas; each shard's gradients are averaged over its D replicas by DDP
// over its data-parallel group, as in step 16.
//
// With the same seed and flags, T x D ranks take the steps of step 6 on D ranks:
// bit for bit at T = 1; within 1e-5 at T > 1, where the row-parallel layer adds
// its T partial sums in another order than one GEMM does.
// Checkpoints (--checkpoint DIR) are sharded, as step 18's: every rank writes its
// part of each layer (the replicas of a part share its rows) and Adam's moments of
// it, beside an index of where each part lies in the whole layer; the same command
// resumes mid-epoch, bit for bit, and another --tp resumes it too, each rank
// reading only the rows or columns its new part needs (common/records/sharded_checkpoint.h).
// --async_save and --save_errors as step 18's.
//
// Build and run:
//   make day4/17_tensor_parallel
//   mpirun -np 2 day4/17_tensor_parallel --tp 2                       (add --oversubscribe on fewer cores)
//   mpirun -np 4 day4/17_tensor_parallel --tp 2                       (2 x 2: step 6's steps on 2 ranks)
//   mpirun -np 2 day4/17_tensor_parallel --tp 2 --hidden 4096,4096,4096,4096 --max_steps 5 --plot ''
//   mpirun -np 2 day4/17_tensor_parallel --tp 2 --max_steps 12 --checkpoint checkpoints/tp
//   mpirun -np 1 day4/17_tensor_parallel --tp 1 --checkpoint checkpoints/tp      # resumed whole
//
// Expected output (2 ranks on 2 cores; times vary):
//   Step 17: 2 tensor-parallel ranks x 1 replica: MLP 784-128-10, 101770 weights; Adam lr 0.001; batch 6400 per replica; 5 epochs; shuffle on (seed 0); cpu, 1 thread per rank, ...
//   rank 0: tensor-parallel rank 0 of 2, replica 0 of 1: fc.0 rows 0-63, fc.2 columns 0-63
//   rank 1: tensor-parallel rank 1 of 2, replica 0 of 1: fc.0 rows 64-127, fc.2 columns 64-127
//   epoch 1/5: mean loss 1.9859 over 10 steps, 0.42 s, 142342 samples/s
//   ...
//   epoch 5/5: mean loss 0.4724 over 10 steps, 0.37 s, 162546 samples/s
//   World Size: 2. Training completed in 1.91 seconds (50 steps). Test accuracy: 89.14% (8914 of 10000)
//   Memory per rank (MB): the model's state held, its theory 16 B x (101760 / T + 10) weights, DDP's 16 B x 101770
//   rank  parameters  gradients  Adam's moments    total   theory    DDP's  peak resident
//      0        0.20       0.20            0.41     0.81     0.81     1.63  ...
//      1        0.20       0.20            0.41     0.81     0.81     1.63  ...
//   Communication per step of 6400 rows, per rank (MB; a ring allreduce of S sends 2 (n - 1) / n x S):
//   collective                                  calls  allreduced   theory  a ring sends
//   g: forward, the row-parallel outputs            1        0.26     0.26          0.26
//   f: backward, the column-parallel inputs         0        0.00     0.00          0.00
//   DDP: the gradients, over 1 replica              0        0.00     0.00          0.00
//   [rank 0] parameter checksum 888e5337267cbace (the whole model, from tensor-parallel ranks 0 to 1 of replica 0)
//   Loss curve: img/17_tensor_parallel.png
// (Step 2's losses and accuracy; its weights in all but their last bits, so another checksum: at T = 1, step 2's.)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc, usage_error: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "comm/collectives.h"       // group_all_reduce: Megatron's f and g
#include "comm/group.h"             // group_split, group_gather_figures: the groups, the per-rank table
#include "data/mnist.h"             // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"              // Linear, linear_forward, linear_backward, Adam
#include "parallel/ddp.h"           // ddp_wrap_group: DistributedDataParallel over a process group
#include "records/h5.h"             // h5_load_params: weights as HDF5 (--init)
#include "records/loss_log.h"       // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/sharded_checkpoint.h"  // sharded_checkpoint_save_step, _resume: each rank its shards, any layout resumes
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "records/whole_model.h"    // whole_model_gather: the whole model's checksum and --save
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the world
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/profile.h"        // profile_start, profile_push: named time ranges (--trace)
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "train/accum.h"            // rows_in_batches: the samples of the batches done (the data position)
#include "train/divergence.h"       // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_losses.h"      // step_losses_take_all: each step's loss, read when the program needs it
#include "train/train_options.h"    // TrainOptions, TRAIN_FLAGS: the flags every training program takes

// ------------------------------------------------------------------ the tensor-parallel MLP

typedef enum { COLUMN_PARALLEL, ROW_PARALLEL, WHOLE } SplitKind;

// Layer l of n: pairs of column- then row-parallel layers; an odd last one whole.
static SplitKind split_kind(int layer, int n_layers) {
    if (n_layers % 2 == 1 && layer == n_layers - 1) return WHOLE;
    return layer % 2 == 0 ? COLUMN_PARALLEL : ROW_PARALLEL;
}

// What a rank sends per step, counted where it calls the collective.
typedef struct {
    long calls;
    double bytes;  // handed to the allreduce
} CommCount;

// One Linear of the MLP: this rank's part of it.
typedef struct {
    SplitKind kind;
    int in, out;         // the whole layer's
    int first, count;    // column-parallel: its rows [first, first + count) of the weight and bias;
                         // row-parallel: its columns of the weight (the bias is whole)
    Linear part;         // column: weight [out/T, in], bias [1, out/T]; row: weight [out, in/T], bias [1, out]
    Tensor output;       // [B, out/T] (column) or [B, out]: kept for backward
    Tensor grad_output;  // its shape
} TpLayer;

typedef struct {
    int n_layers;
    TpLayer *layers;
    int n_params;
    Param *params;        // fc.<2l>.weight, fc.<2l>.bias: this rank's parts, in model.parameters() order
    int max_batch;
    const Group *tp;      // the ranks that hold the other parts
    CommCount f, g;       // this step's allreduces at f (backward) and g (forward)
} TpMlp;

// The whole model's initialisation, nn.Linear's, drawn in order from rng on every
// rank (so that every T makes the same model); each rank keeps its part.
static TpMlp tp_mlp_new(const int *sizes, int n_sizes, int max_batch, const Group *tp, Rng *rng, Device device) {
    int t = tp->rank, T = tp->size;
    TpMlp model = {.n_layers = n_sizes - 1, .max_batch = max_batch, .tp = tp};
    model.layers = xcalloc((size_t)model.n_layers, sizeof(TpLayer));
    model.n_params = 2 * model.n_layers;
    model.params = xcalloc((size_t)model.n_params, sizeof(Param));
    for (int l = 0; l < model.n_layers; l++) {
        TpLayer *layer = &model.layers[l];
        int in = sizes[l], out = sizes[l + 1];
        SplitKind kind = split_kind(l, model.n_layers);
        int split = kind == COLUMN_PARALLEL ? out : kind == ROW_PARALLEL ? in : 0;  // the width split T ways
        *layer = (TpLayer){.kind = kind, .in = in, .out = out, .first = split ? t * (split / T) : 0,
                           .count = split ? split / T : 0};
        int rows = kind == COLUMN_PARALLEL ? layer->count : out, cols = kind == ROW_PARALLEL ? layer->count : in;
        layer->part.weight = tensor_zeros(rows, cols, device);
        layer->part.bias = tensor_zeros(1, rows, device);
        layer->part.grad_weight = tensor_zeros(rows, cols, device);
        layer->part.grad_bias = tensor_zeros(1, rows, device);
        layer->output = tensor_zeros(max_batch, rows, device);
        layer->grad_output = tensor_zeros(max_batch, rows, device);
        // As linear_init: U(-1/sqrt(in), 1/sqrt(in)), the weight [out, in] row by row, then the bias.
        float bound = (float)(1.0 / sqrt((double)in));
        float *weight = xmalloc(tensor_numel(&layer->part.weight) * sizeof(float)), *bias = xmalloc((size_t)out * sizeof(float));
        size_t kept = 0;
        for (int r = 0; r < out; r++)
            for (int c = 0; c < in; c++) {
                float value = rng_uniform(rng, -bound, bound);
                bool mine = kind == COLUMN_PARALLEL ? r >= layer->first && r < layer->first + layer->count
                          : kind == ROW_PARALLEL    ? c >= layer->first && c < layer->first + layer->count
                                                    : true;
                if (mine) weight[kept++] = value;
            }
        kept = 0;
        for (int r = 0; r < out; r++) {
            float value = rng_uniform(rng, -bound, bound);
            if (kind != COLUMN_PARALLEL || (r >= layer->first && r < layer->first + layer->count)) bias[kept++] = value;
        }
        tensor_from_host(&layer->part.weight, weight);
        tensor_from_host(&layer->part.bias, bias);
        free(weight), free(bias);
        Param *pair = &model.params[2 * l];  // its weight and bias
        pair[0] = (Param){.value = &layer->part.weight, .grad = &layer->part.grad_weight};
        pair[1] = (Param){.value = &layer->part.bias, .grad = &layer->part.grad_bias};
        mlp_name_layer(pair, l);
    }
    return model;
}

static void tp_mlp_free(TpMlp *model) {
    for (int l = 0; l < model->n_layers; l++) {
        linear_free(&model->layers[l].part);
        tensor_free(&model->layers[l].output);
        tensor_free(&model->layers[l].grad_output);
    }
    free(model->layers);
    free(model->params);
}

// An allreduce over the tensor-parallel group, counted (what a step sends, below).
static void tp_all_reduce(TpMlp *model, Tensor *t, CommCount *count, const char *range) {
    if (model->tp->size == 1) return;
    profile_push(range);
    group_all_reduce(model->tp, t);
    profile_pop();
    count->calls++;
    count->bytes += (double)tensor_numel(t) * sizeof(float);
}

// model(x): the logits [B, classes], whole on every rank of the group.
static const Tensor *tp_forward(TpMlp *model, const Tensor *x) {
    CHECK(x->rows <= model->max_batch, "batch of %d rows, model built for %d", x->rows, model->max_batch);
    profile_push("forward");
    const Tensor *input = x;
    for (int l = 0; l < model->n_layers; l++) {
        TpLayer *layer = &model->layers[l];
        layer->output.rows = x->rows;
        bool relu = l + 1 < model->n_layers;
        if (layer->kind == ROW_PARALLEL) {
            // [B, in/T] @ [in/T, out]: this rank's share of every output, summed over its hidden units only.
            gemm(false, true, 1.0f, input, &layer->part.weight, 0.0f, &layer->output);
            tp_all_reduce(model, &layer->output, &model->g, "g: allreduce");  // g: allreduce in forward
            add_column_bias(&layer->output, &layer->part.bias, relu);  // the bias once, after the sum (not T times)
        } else {
            // Column-parallel (f: identity in forward, every rank holds the whole input): [B, in] @ [in, out/T],
            // its hidden units, and their ReLU; or the whole last layer.
            linear_forward(&layer->part, input, &layer->output, relu);
        }
        input = &layer->output;
    }
    profile_pop();
    return input;
}

// criterion(output, target): every rank of the group computes it on the same logits, into `slot`
// (on a GPU it stays there: step_losses.h).
static void tp_loss_to(TpMlp *model, const int *labels, const int *device_labels, LossSlot slot) {
    TpLayer *last = &model->layers[model->n_layers - 1];
    last->grad_output.rows = last->output.rows;
    softmax_cross_entropy_to(&last->output, labels, device_labels, &last->grad_output, slot);
}

// loss.backward(): from the last layer to the first, each layer's gradients
// final as soon as it is done (the hook starts DDP's bucket).
static void tp_backward(TpMlp *model, const Tensor *x, GradReadyHook hook, void *context) {
    profile_push("backward");
    for (int l = model->n_layers - 1; l >= 0; l--) {
        TpLayer *layer = &model->layers[l];
        const Tensor *input = l > 0 ? &model->layers[l - 1].output : x;
        Tensor *grad_x = NULL;  // the first layer's input is the data: no gradient, so no f allreduce either
        if (l > 0) {
            grad_x = &model->layers[l - 1].grad_output;
            grad_x->rows = x->rows;
        }
        // Row-parallel (g: identity in backward): d loss / d output is whole on every rank, and
        // its input gradient is d loss / d (its hidden units), all this rank needs.
        linear_backward(&layer->part, input, &layer->grad_output, grad_x);
        if (hook) {
            hook(context, 2 * l + 1);  // fc.<2l>.bias
            hook(context, 2 * l);      // fc.<2l>.weight
        }
        if (layer->kind == COLUMN_PARALLEL && grad_x)
            tp_all_reduce(model, grad_x, &model->f, "f: allreduce");  // f: allreduce in backward (its units' share)
        if (grad_x) relu_backward(input, grad_x);
    }
    profile_pop();
}

static void tp_zero_grad(TpMlp *model) { params_zero_grad(model->params, model->n_params); }

// Correct predictions on x (no gradients), in chunks of max_batch rows: every rank of the group takes part.
static long tp_correct(TpMlp *model, const Tensor *x, const int *labels) {
    long correct = 0;
    int *predictions = xmalloc((size_t)model->max_batch * sizeof(int));
    for (int start = 0; start < x->rows; start += model->max_batch) {
        int rows = x->rows - start < model->max_batch ? x->rows - start : model->max_batch;
        Tensor chunk = tensor_row_range(x, start, rows);
        argmax_rows(tp_forward(model, &chunk), predictions);
        for (int r = 0; r < rows; r++) correct += predictions[r] == labels[start + r];
    }
    free(predictions);
    return correct;
}

// whole_model_gather's: layer `layer`'s weight and bias whole on the group's rank 0 (pair's values
// there), from every rank's part. Collective over the tensor-parallel group.
static void gather_layer(void *tp_mlp, int layer, Param pair[2]) {
    const TpMlp *model = tp_mlp;
    const TpLayer *part = &model->layers[layer];
    int T = model->tp->size;
    for (int k = 0; k < 2; k++) {  // the weight, then the bias
        const Tensor *mine = k ? &part->part.bias : &part->part.weight;
        bool bias = k == 1, split = part->kind == COLUMN_PARALLEL || (part->kind == ROW_PARALLEL && !bias);
        Tensor *whole = pair[k].value;  // NULL but on the group's rank 0
        if (!split) {                   // whole on every rank
            if (whole) tensor_copy(whole, mine);
            continue;
        }
        size_t n = tensor_numel(mine);
        CHECK(n <= 1u << 30, "%s: %zu floats in one message", model->params[2 * layer + k].name, n);
        float *values = xmalloc(n * sizeof(float)), *parts = whole ? xmalloc(n * T * sizeof(float)) : NULL;
        tensor_to_host(mine, values);
        CHECK_MPI(MPI_Gather(values, (int)n, MPI_FLOAT, parts, (int)n, MPI_FLOAT, 0, model->tp->mpi));
        if (whole && part->kind == COLUMN_PARALLEL) {  // rows: the parts follow each other
            memcpy(whole->data, parts, n * T * sizeof(float));
        } else if (whole) {  // a row-parallel weight: rank t's part is columns [t in/T, (t+1) in/T) of every row
            int cols = part->in / T;
            for (int t = 0; t < T; t++)
                for (int r = 0; r < part->out; r++)
                    memcpy(&whole->data[(size_t)r * part->in + (size_t)t * cols], &parts[((size_t)t * part->out + r) * cols],
                           (size_t)cols * sizeof(float));
        }
        free(values), free(parts);
    }
}

// --init: each layer read whole from a state_dict file, every rank keeping its part.
static void load_parts(const char *path, TpMlp *model) {
    for (int l = 0; l < model->n_layers; l++) {
        TpLayer *layer = &model->layers[l];
        Tensor weight = tensor_zeros(layer->out, layer->in, DEVICE_CPU), bias = tensor_zeros(1, layer->out, DEVICE_CPU);
        Param whole[2] = {{.value = &weight}, {.value = &bias}};
        mlp_name_layer(whole, l);
        h5_load_params(path, whole, 2);
        float *part = xmalloc(tensor_numel(&layer->part.weight) * sizeof(float));
        size_t kept = 0;
        for (int r = 0; r < layer->out; r++)
            for (int c = 0; c < layer->in; c++)
                if (layer->kind == WHOLE || (layer->kind == COLUMN_PARALLEL && r >= layer->first && r < layer->first + layer->count) ||
                    (layer->kind == ROW_PARALLEL && c >= layer->first && c < layer->first + layer->count))
                    part[kept++] = weight.data[(size_t)r * layer->in + c];
        tensor_from_host(&layer->part.weight, part);
        tensor_from_host(&layer->part.bias, bias.data + (layer->kind == COLUMN_PARALLEL ? layer->first : 0));
        free(part);
        tensor_free(&weight), tensor_free(&bias);
    }
}

// Where each parameter of this rank's part lies in the whole layer's (the checkpoint's index): a
// column-parallel weight and bias from row `first`, a row-parallel weight from column `first`, each
// held by the D replicas; a tensor the layer does not split (a row-parallel bias, a whole layer),
// by every rank. The ranks that hold the same box share its writing.
static CheckpointBox *part_boxes(const TpMlp *model, int replica, int replicas) {
    CheckpointBox *boxes = xcalloc((size_t)model->n_params, sizeof(CheckpointBox));
    int rank = dist_rank(), world = dist_world_size();
    for (int l = 0; l < model->n_layers; l++) {
        const TpLayer *layer = &model->layers[l];
        CheckpointBox *weight = &boxes[2 * l], *bias = &boxes[2 * l + 1];
        *weight = checkpoint_whole_box(&layer->part.weight, rank, world);
        *bias = checkpoint_whole_box(&layer->part.bias, rank, world);
        weight->shape[0] = bias->shape[0] = layer->out, weight->shape[1] = layer->in;  // the whole layer's
        if (layer->kind == COLUMN_PARALLEL) {
            weight->offset[0] = bias->offset[0] = layer->first;
            weight->writer = bias->writer = replica, weight->writers = bias->writers = replicas;
        } else if (layer->kind == ROW_PARALLEL) {
            weight->offset[1] = layer->first;
            weight->writer = replica, weight->writers = replicas;
        }
    }
    return boxes;
}

static size_t params_bytes(const Param *params, int n) {
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += tensor_numel(params[i].value) * sizeof(float);
    return bytes;
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/17_tensor_parallel.png");
    int tp = 1, max_steps = -1;
    const char *hidden = "128", *trace = NULL, *checkpoint = NULL, *save_errors = "stop";
    int save_every = 0, keep = 2, async_save = 0;
    double bucket_mb = 25.0;
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"tp", ARG_INT, &tp, "T", "tensor-parallel ranks (the world is T x world / T replicas)", 1, NULL},
        {"hidden", ARG_STRING, &hidden, "W,W,...", "the hidden layers' widths, each a multiple of T", 0, NULL},
        {"max_steps", ARG_INT, &max_steps, "N", "stop after N optimizer steps, overriding --epochs (-1: --epochs decides)", -1, NULL},
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "gradient bucket size of each shard's DDP; 0: one bucket per tensor", 0, NULL},
        {"trace", ARG_OUTPUT_OR_NONE, &trace, "FILE.json", "Chrome trace of every rank's ranges (see step 5; '' for none)", 0, NULL},
        {"checkpoint", ARG_STRING, &checkpoint, "DIR", CHECKPOINT_HELP_DIR, 0, NULL},
        {"save_every", ARG_INT, &save_every, "N", CHECKPOINT_HELP_SAVE_EVERY, 0, NULL},
        {"keep", ARG_INT, &keep, "N", CHECKPOINT_HELP_KEEP, 1, NULL},
        {"async_save", ARG_SWITCH, &async_save, NULL, CHECKPOINT_HELP_ASYNC_SAVE, 0, NULL},
        {"save_errors", ARG_STRING, &save_errors, "WHAT", CHECKPOINT_HELP_SAVE_ERRORS, 0, "stop|continue"},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 17: the MLP's Linears split across ranks (Megatron's tensor parallelism), each shard under DDP.");
    checkpoint_flags_check(checkpoint);  // --save_every, --keep, --async_save, --save_errors: only with --checkpoint
    bool save_errors_continue = strcmp(save_errors, "continue") == 0;
    int rank = dist_rank(), world = dist_world_size();
    int sizes[MLP_MAX_SIZES];
    int n_sizes = mlp_sizes_from_hidden(hidden, MNIST_PIXELS, MNIST_CLASSES, sizes), n_layers = n_sizes - 1;
    char model_name[128];
    mlp_describe_sizes(sizes, n_sizes, model_name, sizeof model_name);
    size_t weights = 0, split_weights = 0;  // the whole model's, and of those the ones split T ways
    for (int l = 0; l < n_layers; l++) {
        size_t layer = (size_t)sizes[l] * sizes[l + 1] + sizes[l + 1];
        weights += layer;
        split_weights += split_kind(l, n_layers) == COLUMN_PARALLEL ? layer
                       : split_kind(l, n_layers) == ROW_PARALLEL    ? layer - sizes[l + 1]
                                                                    : 0;
    }
    if (world % tp != 0)
        usage_error("--tp %d: the world size %d is not a multiple of it (the world is T tensor-parallel ranks x D replicas)",
                    tp, world);
    for (int l = 0; l < n_layers; l++)
        if (split_kind(l, n_layers) == COLUMN_PARALLEL && sizes[l + 1] % tp != 0)
            usage_error("--tp %d: the hidden width %d (fc.%d's outputs, split across the tensor-parallel ranks) is not a "
                        "multiple of it", tp, sizes[l + 1], 2 * l);
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory, per rank, refused now if it would not fit (exit 2): the model's state as the report
    // at the end counts it (16 B a weight of its share: value, gradient, Adam's two moments), DDP's
    // copy of the gradients, and every layer's output and its gradient (its 1/T of a split layer's).
    double split_share = (double)split_weights / tp + (double)(weights - split_weights);  // weights a rank holds
    double activations = 0;
    for (int l = 0; l < n_layers; l++)
        activations += 2.0 * opt.batch_size * (split_kind(l, n_layers) == COLUMN_PARALLEL ? sizes[l + 1] / tp : sizes[l + 1]);
    MemoryNeed need = memory_need("--hidden %s --tp %d --batch_size %d", hidden, tp, opt.batch_size);
    memory_need_add(&need, "parameters", 4 * split_share);
    memory_need_add(&need, "gradients", 4 * split_share);
    memory_need_add(&need, "Adam's moments", 8 * split_share);
    memory_need_add(&need, "DDP's buckets", 4 * split_share);
    memory_need_add(&need, "activations", activations * sizeof(float));
    matmul_add_memory_need(&need, mlp_largest_operand(sizes, 0, n_layers, opt.batch_size));  // --dtype bfloat16's copies
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);

    // The grid, as Megatron's and picotron's: rank = replica x T + tensor-parallel rank,
    // so that a group's ranks, which talk at every layer, are neighbours (one node, NVLink).
    int tp_rank = rank % tp, replica = rank / tp, replicas = world / tp;
    Group tensor_parallel = group_split(replica, tp_rank);  // my replica's T ranks
    Group data_parallel = group_split(tp_rank, replica);    // the ranks that hold my part, one per replica

    // Data: replica d takes positions d, d + D, ... (a sampler over D, not the world);
    // every rank of a replica reads the same batches.
    MnistSplit train = mnist_load(opt.data, MNIST_TRAIN);
    MnistSplit test = mnist_load(opt.data, MNIST_TEST);
    DistributedSampler sampler = sampler_new(train.n, replicas, replica, !opt.no_shuffle, (uint64_t)opt.seed);
    int steps_per_epoch = sampler_num_batches(&sampler, opt.batch_size);
    int epochs = max_steps < 0 ? opt.epochs : (max_steps + steps_per_epoch - 1) / steps_per_epoch;

    // Model: this rank's part of every layer, initialised as the whole model would be.
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);  // torch.manual_seed(seed)
    TpMlp model = tp_mlp_new(sizes, n_sizes, opt.batch_size, &tensor_parallel, &rng, device);
    if (opt.init) load_parts(opt.init, &model);
    Ddp ddp = ddp_wrap_group(model.params, model.n_params, bucket_mb, &data_parallel);  // DDP(model, process_group)
    Adam optimizer = adam_new(model.params, model.n_params, opt.lr);

    char steps_text[64] = "";
    if (max_steps >= 0) snprintf(steps_text, sizeof steps_text, " (--max_steps %d)", max_steps);
    print0("Step 17: %d tensor-parallel rank%s x %d replica%s: MLP %s, %zu weights; Adam lr %g; batch %d per replica; "
           "%d epoch%s%s; shuffle %s (seed %d); %s, %s\n",
           tp, tp == 1 ? "" : "s", replicas, replicas == 1 ? "" : "s", model_name, weights, opt.lr, opt.batch_size,
           epochs, epochs == 1 ? "" : "s", steps_text, opt.no_shuffle ? "off" : "on", opt.seed, device_name(device),
           threads_describe());
    for (int r = 0; r < world; r++) {  // rank 0 knows the grid: it is arithmetic
        char parts[512];
        int used = 0, t = r % tp;
        for (int l = 0; l < n_layers && used < (int)sizeof parts; l++) {
            SplitKind kind = split_kind(l, n_layers);
            int width = kind == COLUMN_PARALLEL ? sizes[l + 1] : sizes[l];
            if (kind == WHOLE) used += snprintf(parts + used, sizeof parts - used, ", fc.%d whole", 2 * l);
            else used += snprintf(parts + used, sizeof parts - used, ", fc.%d %s %d-%d", 2 * l,
                                  kind == COLUMN_PARALLEL ? "rows" : "columns", t * (width / tp), (t + 1) * (width / tp) - 1);
        }
        print0("rank %d: tensor-parallel rank %d of %d, replica %d of %d: %s\n", r, t, tp, r / tp, replicas, parts + 2);
    }

    // --checkpoint: resume from DIR's current checkpoint, whatever --tp saved it. Each rank reads
    // the rows or columns of the saved parts that its own part needs; saving, each writes its part
    // and Adam's moments of it, sharing the writing with the ranks that hold the same (part_boxes).
    LossLog losses = {0};
    CheckpointState state = {.program = "day4/17_tensor_parallel", .world_size = world,
                             .global_batch = (long)opt.batch_size * replicas, .seed = opt.seed, .shuffle = !opt.no_shuffle,
                             .train_samples = train.n, .lr = opt.lr, .generator = rng, .losses = &losses};
    snprintf(state.layout, sizeof state.layout, "%d tensor-parallel rank%s x %d replica%s", tp, tp == 1 ? "" : "s",
             replicas, replicas == 1 ? "" : "s");
    CheckpointBox *boxes = part_boxes(&model, replica, replicas);
    CheckpointPieces wanted = checkpoint_param_pieces(model.params, optimizer.exp_avg, optimizer.exp_avg_sq, model.n_params, boxes, false);
    CheckpointPieces saved = checkpoint_param_pieces(model.params, optimizer.exp_avg, optimizer.exp_avg_sq, model.n_params, boxes, true);
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
    Tracking *run = tracking_start(&opt.tracking, "day4/17_tensor_parallel.c", device_name(device),
                                   state.mlflow_run_id, args_values());  // mlflow.start_run(run_id=...); mlflow.log_params(vars(args))
    snprintf(state.mlflow_run_id, sizeof state.mlflow_run_id, "%s", tracking_run_id(run));
    for (int i = 0; i < losses.n; i++) tracking_log_metric(run, "loss", losses.loss[i], i);

    Tensor batch_images = tensor_zeros(opt.batch_size, MNIST_PIXELS, device);  // [B, 784]
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]
    // Each step's loss stays on the GPU until the host needs it (step_losses.h): at an epoch's end, the
    // last step, or a checkpoint (which keeps the losses so far). No step waits for it.
    StepLosses pending = step_losses_new(steps_per_epoch, device);
    CommCount shown_f = {0}, shown_g = {0};  // the last full step's

    if (trace) profile_start(trace);
    CheckpointSave *in_flight = NULL;  // --async_save: the save a thread is writing
    double train_start = wall_seconds();
    for (int epoch = first_epoch; epoch < epochs && (max_steps < 0 || steps < max_steps); epoch++) {
        double epoch_start = wall_seconds();
        long skipped = epoch == first_epoch ? first_position : 0;  // a resumed epoch goes on where it stopped
        sampler_set_epoch_from(&sampler, epoch, skipped);
        int n_batches = sampler_num_batches(&sampler, opt.batch_size), epoch_steps = 0;
        long samples = 0;
        double loss_sum = 0.0;  // over this epoch's steps, those before a resume included
        for (int i = 0; i < losses.n; i++)
            if (losses.epoch[i] == epoch) loss_sum += losses.loss[i], epoch_steps++;
        for (int b = 0; b < n_batches && (max_steps < 0 || steps < max_steps); b++) {
            Tensor x = mnist_batch(&train, &sampler, b, opt.batch_size, &batch_images, batch_labels);  // [rows, 784]
            model.f = model.g = (CommCount){0};
            tp_zero_grad(&model);                         // optimizer.zero_grad()
            tp_forward(&model, &x);                       // output = model(data)
            tp_loss_to(&model, batch_labels, mnist_batch_device_labels(&train),  // loss = criterion(output, target)
                       step_losses_next(&pending));
            tp_backward(&model, &x, ddp_grad_ready, &ddp);  // loss.backward(): DDP's buckets start here
            ddp_finish(&ddp);                             // each part's gradients averaged over its replicas
            adam_step(&optimizer);                        // optimizer.step(): each rank steps its parts
            if (x.rows == opt.batch_size) shown_f = model.f, shown_g = model.g;
            samples += (long)x.rows * replicas;
            epoch_steps++;
            steps++;
            bool epoch_done = b + 1 == n_batches, save_now = checkpoint && save_every > 0 && steps % save_every == 0;
            // loss.item(): at once on a CPU; on a GPU the steps' losses since the last hand-over, when due.
            float *taken;
            int n_taken = step_losses_take_all(&pending, epoch_done || steps == max_steps || save_now, &taken);
            dist_allreduce_sum_over(data_parallel.mpi, taken, (size_t)n_taken);  // for the log: each step's loss of the global batch
            for (int i = 0; i < n_taken; i++) {
                float loss = taken[i] / (float)replicas;
                check_loss_finite(loss, losses.n + 1, epoch + 1, run);  // the same on every rank: whole logits, then the sum
                loss_log_add(&losses, epoch, loss);
                tracking_log_metric(run, "loss", loss, losses.n - 1);  // mlflow.log_metric("loss", loss, step=step)
                loss_sum += loss;
            }
            // Where the run stands: the data position is the sampler positions of the batches done.
            state.step = steps, state.epoch = epoch_done ? epoch + 1 : epoch, state.generator = rng;
            state.samples_done = epoch_done ? 0 : skipped + (long)replicas * rows_in_batches(sampler.num_samples, opt.batch_size, 0, b + 1);
            if (save_now) {
                check_weights_finite(model.params, model.n_params, steps, epoch + 1, run);  // never a NaN checkpoint over a good one
                sharded_checkpoint_save_step(async_save ? &in_flight : NULL, checkpoint, keep, save_errors_continue, saved.piece,
                                             saved.n, &state);
            }
        }
        double seconds = wall_seconds() - epoch_start;
        if (samples == 0) continue;  // (a resume at the end of an epoch)
        print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s\n", epoch + 1, epochs,
               epoch_steps ? loss_sum / epoch_steps : 0.0, epoch_steps, epoch_steps == 1 ? "" : "s", seconds,
               samples / seconds);
        tracking_log_metric(run, "epoch_mean_loss", epoch_steps ? loss_sum / epoch_steps : 0.0, epoch);
        tracking_log_metric(run, "samples_per_second", samples / seconds, epoch);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    check_weights_finite(model.params, model.n_params, losses.n, epochs, run);  // the last step's update
    bool end_saved = true;  // false: the last step's checkpoint failed twice (--save_errors continue)
    // The end of training saved, where no --save_every save holds it (--async_save: the one in flight finished first).
    if (checkpoint && steps == resumed_step) print0("Nothing left to train: the checkpoint is at step %ld\n", steps);
    else if (checkpoint)
        end_saved = sharded_checkpoint_save_last(&in_flight, checkpoint, keep, save_errors_continue, saved.piece, saved.n,
                                                 &state);

    Tensor test_images = mnist_images(&test, device);  // [10000, 784]: every rank of a replica takes part
    long correct = tp_correct(&model, &test_images, test.labels);
    print0("World Size: %d. Training completed in %.2f seconds (%ld step%s). Test accuracy: %.2f%% (%ld of %d)\n", world,
           train_seconds, steps, steps == 1 ? "" : "s", 100.0 * correct / test.n, correct, test.n);
    tracking_log_metric(run, "test_accuracy", (double)correct / test.n, epochs);

    // Memory, per rank: what it holds of the model's state, beside the theory
    // (16 bytes a weight: the value, its gradient, Adam's two moments; the split
    // layers' weights divided by T) and DDP's whole copy, and the peak resident set.
    double mine[4] = {(double)params_bytes(model.params, model.n_params), 0, 0, device_peak_memory_bytes(device)};
    mine[1] = mine[0];  // a gradient per parameter, its shape
    for (int i = 0; i < optimizer.n_params; i++)
        mine[2] += (double)(tensor_numel(&optimizer.exp_avg[i]) + tensor_numel(&optimizer.exp_avg_sq[i])) * sizeof(float);
    double *all = group_gather_figures(group_world(), mine, 4, false);
    print0("Memory per rank (MB): the model's state held, its theory 16 B x (%zu / T + %zu) weights, DDP's 16 B x %zu\n",
           split_weights, weights - split_weights, weights);
    print0("rank  parameters  gradients  Adam's moments    total   theory    DDP's  %s\n",
           device == DEVICE_CUDA ? "     GPU peak" : "peak resident");
    for (int r = 0; r < world && rank == 0; r++) {
        const double *f = &all[4 * r];
        print0("%4d  %10.2f  %9.2f  %14.2f  %7.2f  %7.2f  %7.2f  %13.0f\n", r, f[0] / 1e6, f[1] / 1e6, f[2] / 1e6,
               (f[0] + f[1] + f[2]) / 1e6, 16 * split_share / 1e6, 16.0 * weights / 1e6, f[3] / 1e6);
    }
    free(all);

    // Communication per step (a full batch of B rows), per rank, counted at the
    // call beside the theory: g, one [B, out] per row-parallel layer; f, one
    // [B, in] per column-parallel layer but the first; DDP, every gradient of
    // the rank's parts. An allreduce of S bytes on a ring of n sends 2 (n - 1) / n x S.
    double g_theory = 0, f_theory = 0, B = opt.batch_size;
    for (int l = 0; l < n_layers; l++) {
        if (split_kind(l, n_layers) == ROW_PARALLEL) g_theory += B * sizes[l + 1] * sizeof(float);
        if (split_kind(l, n_layers) == COLUMN_PARALLEL && l > 0) f_theory += B * sizes[l] * sizeof(float);
    }
    if (tp == 1) g_theory = f_theory = 0;
    double ddp_bytes = replicas > 1 ? (double)params_bytes(model.params, model.n_params) : 0;
    double ddp_theory = replicas > 1 ? sizeof(float) * split_share : 0;  // every weight of its parts
    double ring_tp = tp > 1 ? 2.0 * (tp - 1) / tp : 0, ring_dp = replicas > 1 ? 2.0 * (replicas - 1) / replicas : 0;
    print0("Communication per step of %d rows, per rank (MB; a ring allreduce of S sends 2 (n - 1) / n x S):\n", opt.batch_size);
    char ddp_name[64];
    snprintf(ddp_name, sizeof ddp_name, "DDP: the gradients, over %d replica%s", replicas, replicas == 1 ? "" : "s");
    print0("collective                                  calls  allreduced   theory  a ring sends\n");
    print0("%-42s  %5ld  %10.2f  %7.2f  %12.2f\n", "g: forward, the row-parallel outputs", shown_g.calls,
           shown_g.bytes / 1e6, g_theory / 1e6, ring_tp * shown_g.bytes / 1e6);
    print0("%-42s  %5ld  %10.2f  %7.2f  %12.2f\n", "f: backward, the column-parallel inputs", shown_f.calls,
           shown_f.bytes / 1e6, f_theory / 1e6, ring_tp * shown_f.bytes / 1e6);
    print0("%-42s  %5d  %10.2f  %7.2f  %12.2f\n", ddp_name, ddp.n_buckets * (replicas > 1), ddp_bytes / 1e6,
           ddp_theory / 1e6, ring_dp * ddp_bytes / 1e6);
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    if (replicas > 1) print0("DDP (rank 0's): %s\n", overlap);
    // The whole model's checksum and --save (replica 0's file, in step 6's layout, so that weights go
    // freely between steps 6, 16 and 17), from the parts gathered on the group's rank 0 layer by layer.
    unsigned long long checksum = whole_model_gather(&tensor_parallel, sizes, n_sizes, WHOLE_ON_ROOT, gather_layer,
                                                     &model, replica == 0 ? opt.save : NULL);
    if (tp_rank == 0)
        print_rank("parameter checksum %016llx (the whole model, from tensor-parallel ranks 0 to %d of replica %d)\n",
                   checksum, tp - 1, replica);

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.plot && *opt.plot && losses.n > 0) {
        char title[96];
        snprintf(title, sizeof title, "Step 17: MNIST training loss, %d tensor-parallel x %d replica%s", tp, replicas,
                 replicas == 1 ? "" : "s");
        loss_log_plot(&losses, opt.plot, title, "mean loss");
        print0("Loss curve: %s\n", opt.plot);
    }
    tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
    tracking_log_artifact(run, opt.save);
    tracking_log_artifact(run, opt.plot);
    tracking_end(run, TRACKING_FINISHED);    // mlflow.end_run()

    tensor_free(&test_images);
    tensor_free(&batch_images);
    free(batch_labels);
    step_losses_free(&pending);
    loss_log_free(&losses);
    checkpoint_pieces_free(&wanted), checkpoint_pieces_free(&saved), free(boxes);
    adam_free(&optimizer);
    ddp_free(&ddp);
    tp_mlp_free(&model);
    group_free(&data_parallel);
    group_free(&tensor_parallel);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    sharded_checkpoint_check_end_saved(end_saved, checkpoint);  // the outputs written: exit 1 if the end is not checkpointed
    dist_finalize();
    return 0;
}
