// Step 18: sharded data parallelism, ZeRO stages 1 to 3 (FSDP).
//                        PyTorch twin: DeepSpeed's ZeRO (zero_optimization.stage 1, 2, 3) and
//                        torch.distributed.fsdp (SHARD_GRAD_OP, FULL_SHARD)
//
// What it changes from step 6: DDP keeps on every rank a whole copy of the
// parameters (4 bytes each in float32), their gradients (4) and Adam's two
// moments (8): 16 bytes per parameter, whatever the world size N. Each --zero
// stage keeps only rank r's 1/N of one more of them:
//   0: plain DDP (step 6's library): 16 bytes per parameter;
//   1: Adam's moments sharded: gradients are reduce-scattered (rank r gets the
//      sum of its block), each rank updates its block of the parameters, and
//      the parameters are all-gathered: 4 + 4 + 8/N bytes;
//   2: as 1, and only the gradients' block is kept: each layer's whole gradient
//      lives from its backward to its reduce-scatter, started at once, as DDP's
//      buckets are, while backward goes on: 4 + 12/N bytes;
//   3: the parameters sharded too (FSDP's FULL_SHARD): each layer's weights are
//      all-gathered just before its forward and again before its backward, and
//      dropped after use (--prefetch gathers the next layer while this one
//      computes): 16/N bytes, and one layer gathered.
// The blocks follow a flat buffer per layer (its weight, then its bias), padded
// to a multiple of N as FSDP's FlatParameter is: rank r owns elements
// [r * ceil(n/N), (r + 1) * ceil(n/N)) of every layer. Adam is elementwise, so
// Adam on the blocks is Adam on the whole: every stage takes step 6's steps
// (bit for bit on 2 ranks; on more, MPI may sum the ranks' gradients in another
// order, and the losses agree to 1e-5). What it costs: stages 1 and 2 send what
// DDP's allreduce sends (a reduce-scatter and an all-gather are its two halves),
// stage 3 half as much again (a second all-gather, for backward).
// Checkpoints (--checkpoint DIR) are sharded too, as torch.distributed.checkpoint's:
// no rank gathers the model to save it. Every rank writes its blocks of the
// weights and of Adam's moments to a file of its own, beside an index of where
// each piece lies (common/records/sharded_checkpoint.h), every --save_every
// steps and after the last (--async_save: copied to host memory, then written
// by a thread while training goes on; a save that fails, on a full disk, ends the
// run, or with --save_errors continue warns and trains on, the last good checkpoint
// current); the same command resumes from DIR's current one,
// mid-epoch, bit for bit. Another --zero stage or world size resumes it too,
// each rank reading only the slices its own blocks need (at the same global
// batch, --batch_size x ranks, it takes the same steps, within 1e-5).
//
// Build and run:
//   make day4/18_zero_sharding
//   mpirun -np 2 day4/18_zero_sharding --zero 1                  (add --oversubscribe on fewer cores)
//   mpirun -np 4 day4/18_zero_sharding --zero 3 --hidden 4096,4096,4096,4096 --batch_size 64 --max_steps 5 --prefetch
//   mpirun -np 2 day4/18_zero_sharding --zero 3 --epochs 1 --trace log_zero/18.json   # gathers in Perfetto
//   mpirun -np 4 day4/18_zero_sharding --zero 3 --batch_size 3000 --max_steps 4 --checkpoint checkpoints/zero
//   mpirun -np 2 day4/18_zero_sharding --zero 0 --batch_size 6000 --checkpoint checkpoints/zero   # resumed as DDP
//
// Expected output (2 ranks on 2 cores; times and the peak resident set vary):
//   Step 18: ZeRO-1 on 2 ranks: MLP 784-128-10, 101770 weights in 2 flat units padded to 101770 (a block of 50885 per rank); Adam lr 0.001; batch 6400 per rank; 5 epochs; shuffle on (seed 0); cpu, 1 thread per rank, OpenBLAS 0.3.21 (SkylakeX kernels)
//   epoch 1/5: mean loss 2.1628 over 5 steps, 0.25 s, 240000 samples/s
//   ...
//   epoch 5/5: mean loss 0.9127 over 5 steps, 0.17 s, 352941 samples/s
//   World Size: 2. Training completed in 1.00 seconds. Test accuracy: 84.54% (8454 of 10000)
//   Step time: 35.0 ms (the mean after the first step, which took 106.4 ms)
//   Memory per rank (MB): parameters + gradients + Adam = model state, beside the theory 4 + 4 + 8/N B/param x 101770 (N = 2); working buffers (none); peak resident set
//   rank  parameters  gradients     Adam  model state   theory         working   peak RSS
//      0        0.41       0.41     0.41         1.22     1.22 (+0.0%)     0.00  ...
//      1        0.41       0.41     0.41         1.22     1.22 (+0.0%)     0.00  ...
//   Sent per step by each rank (MB): allreduce 0.00, reduce-scatter 0.20, all-gather 0.20; 0.41 in all, 1.00x DDP's allreduce; theory 2 x (N - 1)/N x 0.41 MB of weights = 0.41 (1.00x DDP's)
//   [rank 0] parameter checksum 8645f4bc5a3ea343
//   [rank 1] parameter checksum 8645f4bc5a3ea343
//   Loss curve: img/18_zero_sharding.png
// (Step 6's losses, accuracy and weights on 2 ranks: its checksum is 8645f4bc5a3ea343 too.)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc, usage_error: fail fast, on every rank
#include "base/timer.h"             // wall_seconds
#include "comm/collectives.h"       // group_reduce_scatter, group_all_gather: the shards' two collectives
#include "comm/group.h"             // group_world, group_gather_figures: the per-rank table
#include "data/mnist.h"             // mnist_load, DistributedSampler, mnist_batch: the data
#include "models/nn.h"              // Linear, linear_forward, linear_backward, adam_new: the layers and DDP's Adam
#include "parallel/ddp.h"           // ddp_wrap: --zero 0 is step 6's DDP
#include "records/h5.h"             // h5_load_params: weights as HDF5 (--init)
#include "records/loss_log.h"       // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "records/sharded_checkpoint.h"  // sharded_checkpoint_save_step, _load: each rank its shards, any layout resumes
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

// ------------------------------------------------------------------ the flat units

// One Linear layer as FSDP's FlatParameter: its weight [out, in] and its bias
// [out], one after the other in a flat buffer of `padded` floats (zeros past
// `numel`), cut into `shards` blocks of `block` floats; rank r owns block r.
typedef struct {
    int in, out;
    size_t numel, block, padded;
    Tensor full;        // [1, padded]: the whole layer (stages 0-2 always; 3: a gathered buffer, in use)
    Tensor grad;        // [1, padded]: its whole gradient (stages 0-1 always; 2-3: a buffer, in use)
    Tensor param_block; // [1, block]: this rank's block (stages 1-2: of `full`; 3: its own)
    Tensor grad_block;  // [1, block]: its gradient's block (stage 1: of `grad`; 2-3: its own)
    Tensor exp_avg, exp_avg_sq;  // [1, block]: Adam's moments of the block (stages 1-3)
    GroupRequest reduce;         // the gradient's reduce-scatter in flight
} Unit;

typedef struct {
    int zero, world, rank, n_units;
    bool prefetch;
    Unit *units;
    // Buffers lent to a unit while in use (stages 2-3): gathered weights (one,
    // or two with --prefetch) and whole gradients (two: one layer's is reduced
    // while the next one's backward fills the other). Two layers in use at once
    // are neighbours, so layer i takes buffer i % 2, each sized for its layers.
    Tensor gathered[2], grads[2];
    int gathered_unit[2];    // which unit each gathered buffer holds (-1: none)
    GroupRequest gathering[2];
    Tensor *outputs, *grad_outputs;  // [units] of [max_batch, out]: the activations, as mlp's
    Param *params;                   // fc.0.weight, fc.0.bias, ...: views of `full` (stages 0-2)
    // Counters: what the collectives sent (per rank, a ring's (N - 1)/N of each buffer per pass).
    double sent_allreduce, sent_reduce_scatter, sent_all_gather;
    bool counting;     // count what is sent (training, not the evaluation or the reports)
} Sharded;

// A flat [1, n] view of t's floats [offset, offset + n).
static Tensor flat_view(const Tensor *t, size_t offset, size_t n) {
    return (Tensor){.data = t->data + offset, .rows = 1, .cols = (int)n, .device = t->device};
}

// Unit u as a Linear: its weight and bias are views of `values`, its gradients of `grads`.
static Linear unit_linear(const Unit *u, const Tensor *values, const Tensor *grads) {
    Linear layer = {0};
    layer.weight = (Tensor){.data = values->data, .rows = u->out, .cols = u->in, .device = values->device};
    layer.bias = flat_view(values, (size_t)u->out * u->in, (size_t)u->out);
    if (grads) {
        layer.grad_weight = (Tensor){.data = grads->data, .rows = u->out, .cols = u->in, .device = grads->device};
        layer.grad_bias = flat_view(grads, (size_t)u->out * u->in, (size_t)u->out);
    }
    return layer;
}

// nn.Linear's init (linear_init's draws: the weight, then the bias, in order),
// keeping only this rank's block (stage 3) or the whole unit.
static void unit_init(Unit *u, Rng *rng, Tensor *into, size_t first) {
    float bound = (float)(1.0 / sqrt((double)u->in));
    size_t n = tensor_numel(into);
    float *values = xcalloc(n, sizeof(float));  // the padding stays 0
    for (size_t k = 0; k < u->numel; k++) {
        float v = rng_uniform(rng, -bound, bound);
        if (k >= first && k < first + n) values[k - first] = v;
    }
    tensor_from_host(into, values);
    free(values);
}

static Sharded sharded_new(const int *sizes, int n_sizes, int zero, bool prefetch, int max_batch, Rng *rng,
                           Device device) {
    Sharded s = {.zero = zero, .world = dist_world_size(), .rank = dist_rank(), .n_units = n_sizes - 1,
                 .prefetch = prefetch, .gathered_unit = {-1, -1}, .counting = true};
    int shards = zero == 0 ? 1 : s.world;  // DDP: no blocks, no padding
    s.units = xcalloc((size_t)s.n_units, sizeof(Unit));
    s.outputs = xcalloc((size_t)s.n_units, sizeof(Tensor));
    s.grad_outputs = xcalloc((size_t)s.n_units, sizeof(Tensor));
    s.params = xcalloc((size_t)(2 * s.n_units), sizeof(Param));
    size_t largest[2] = {0, 0};  // of the even and the odd layers
    for (int i = 0; i < s.n_units; i++) {
        Unit *u = &s.units[i];
        u->in = sizes[i], u->out = sizes[i + 1];
        u->numel = (size_t)u->out * u->in + u->out;
        u->block = (u->numel + shards - 1) / shards;
        u->padded = u->block * shards;
        largest[i % 2] = u->padded > largest[i % 2] ? u->padded : largest[i % 2];
        size_t first = zero == 0 ? 0 : (size_t)s.rank * u->block;
        if (zero <= 2) {
            u->full = tensor_zeros(1, (int)u->padded, device);
            unit_init(u, rng, &u->full, 0);
            u->param_block = flat_view(&u->full, first, u->block);
        } else {
            u->param_block = tensor_zeros(1, (int)u->block, device);
            unit_init(u, rng, &u->param_block, first);
        }
        if (zero <= 1) {
            u->grad = tensor_zeros(1, (int)u->padded, device);
            u->grad_block = flat_view(&u->grad, first, u->block);
        } else {
            u->grad_block = tensor_zeros(1, (int)u->block, device);
        }
        if (zero >= 1) {
            u->exp_avg = tensor_zeros(1, (int)u->block, device);
            u->exp_avg_sq = tensor_zeros(1, (int)u->block, device);
        }
        s.outputs[i] = tensor_zeros(max_batch, u->out, device);
        s.grad_outputs[i] = tensor_zeros(max_batch, u->out, device);
        if (zero <= 2) {  // named views, for DDP, Adam (stage 0), --init, --save and the checksum
            Linear layer = unit_linear(u, &u->full, zero <= 1 ? &u->grad : NULL);
            Param *pair = &s.params[2 * i];  // its weight and bias
            for (int k = 0; k < 2; k++)
                pair[k] = (Param){.value = xmalloc(sizeof(Tensor)), .grad = zero <= 1 ? xmalloc(sizeof(Tensor)) : NULL};
            *pair[0].value = layer.weight, *pair[1].value = layer.bias;
            if (zero <= 1) *pair[0].grad = layer.grad_weight, *pair[1].grad = layer.grad_bias;
            mlp_name_layer(pair, i);
        }
    }
    size_t any = largest[0] > largest[1] ? largest[0] : largest[1];
    for (int k = 0; k < 2; k++) {
        if (zero >= 2) s.grads[k] = tensor_zeros(1, (int)largest[k], device);
        if (zero == 3 && (k == 0 || prefetch)) s.gathered[k] = tensor_zeros(1, (int)(prefetch ? largest[k] : any), device);
    }
    return s;
}

static void sharded_free(Sharded *s) {
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        tensor_free(&u->full);
        tensor_free(&u->grad);
        if (s->zero == 3) tensor_free(&u->param_block);
        if (s->zero >= 2) tensor_free(&u->grad_block);
        tensor_free(&u->exp_avg);
        tensor_free(&u->exp_avg_sq);
        tensor_free(&s->outputs[i]);
        tensor_free(&s->grad_outputs[i]);
    }
    for (int p = 0; p < 2 * s->n_units; p++) free(s->params[p].value), free(s->params[p].grad);
    for (int k = 0; k < 2; k++) tensor_free(&s->grads[k]), tensor_free(&s->gathered[k]);
    free(s->units), free(s->outputs), free(s->grad_outputs), free(s->params);
}

// ------------------------------------------------------------------ stage 3: gathering the weights

// Starts gathering unit i's weights into a free buffer (FSDP's unshard).
static void gather_start(Sharded *s, int i) {
    if (s->zero < 3 || i < 0 || i >= s->n_units) return;
    int k = s->prefetch ? i % 2 : 0;
    CHECK(s->gathered_unit[k] == -1, "no free buffer to gather fc.%d into", 2 * i);
    Tensor into = flat_view(&s->gathered[k], 0, s->units[i].padded);
    profile_push("all-gather");
    s->gathering[k] = group_all_gather_start(group_world(), &s->units[i].param_block, &into);
    profile_pop();
    s->gathered_unit[k] = i;
    if (s->counting) s->sent_all_gather += (double)(s->world - 1) / s->world * (double)s->units[i].padded * sizeof(float);
}

// Unit i's whole weights: its own (stages 0-2), or gathered (stage 3: waits
// for the gather, which is started here unless --prefetch started it).
static Tensor unit_weights(Sharded *s, int i) {
    if (s->zero < 3) return s->units[i].full;
    int k = s->gathered_unit[0] == i ? 0 : s->gathered_unit[1] == i ? 1 : -1;
    if (k < 0) {
        gather_start(s, i);
        k = s->prefetch ? i % 2 : 0;
    }
    profile_push("all-gather wait");
    group_wait(&s->gathering[k]);
    profile_pop();
    return flat_view(&s->gathered[k], 0, s->units[i].padded);
}

// Drops unit i's gathered weights (FSDP's reshard): the buffer is free again.
static void reshard(Sharded *s, int i) {
    for (int k = 0; k < 2; k++)
        if (s->gathered_unit[k] == i) s->gathered_unit[k] = -1;
}

// ------------------------------------------------------------------ forward, loss, backward

// output = model(x): as mlp_forward, layer by layer; under stage 3 each
// layer's weights are gathered before and dropped after.
static const Tensor *sharded_forward(Sharded *s, const Tensor *x) {
    profile_push("forward");
    const Tensor *input = x;
    gather_start(s, 0);
    for (int i = 0; i < s->n_units; i++) {
        Tensor weights = unit_weights(s, i);
        if (s->prefetch) gather_start(s, i + 1);  // the next layer's gather runs while this one computes
        Linear layer = unit_linear(&s->units[i], &weights, NULL);
        s->outputs[i].rows = x->rows;
        if (x->rows > 0)  // (none: a rank past its share of the test set still takes part in the gathers)
            linear_forward(&layer, input, &s->outputs[i], i + 1 < s->n_units);  // a ReLU after every Linear but the last
        reshard(s, i);
        input = &s->outputs[i];
    }
    profile_pop();
    return input;
}

// Cross-entropy of the last forward's logits (mlp_loss_to): the mean over the batch, into `slot`
// (on a GPU it stays there: step_losses.h).
static void sharded_loss_to(Sharded *s, const int *labels, const int *device_labels, LossSlot slot) {
    const Tensor *logits = &s->outputs[s->n_units - 1];
    Tensor *grad_logits = &s->grad_outputs[s->n_units - 1];
    grad_logits->rows = logits->rows;
    softmax_cross_entropy_to(logits, labels, device_labels, grad_logits, slot);
}

// Waits for unit i's reduce-scatter; its whole gradient's buffer is free again.
static void reduce_wait(Sharded *s, int i) {
    if (i >= s->n_units) return;
    profile_push("reduce-scatter wait");
    group_wait(&s->units[i].reduce);
    profile_pop();
}

// loss.backward(), as mlp_backward, and as each layer's gradient is final:
// stage 0 hands it to DDP (a bucket's allreduce), stages 1-3 start its
// reduce-scatter; stages 2-3 keep only the block.
static void sharded_backward(Sharded *s, const Tensor *x, Ddp *ddp) {
    profile_push("backward");
    const Tensor *grad_y = &s->grad_outputs[s->n_units - 1];
    if (s->prefetch) gather_start(s, s->n_units - 1);
    for (int i = s->n_units - 1; i >= 0; i--) {
        Unit *u = &s->units[i];
        Tensor weights = unit_weights(s, i);
        if (s->prefetch) gather_start(s, i - 1);
        Tensor grad = s->zero <= 1 ? u->grad : flat_view(&s->grads[i % 2], 0, u->padded);
        if (s->zero >= 2) tensor_fill(&grad, 0.0f);  // a fresh whole gradient (zero_grad)
        Linear layer = unit_linear(u, &weights, &grad);
        const Tensor *input = i > 0 ? &s->outputs[i - 1] : x;
        Tensor *grad_x = NULL;
        if (i > 0) {
            grad_x = &s->grad_outputs[i - 1];
            grad_x->rows = x->rows;
        }
        linear_backward(&layer, input, grad_y, grad_x);
        reshard(s, i);
        if (s->zero == 0) {  // DDP's hooks: the bias, then the weight
            ddp_grad_ready(ddp, 2 * i + 1);
            ddp_grad_ready(ddp, 2 * i);
        } else {
            profile_push("reduce-scatter");
            u->reduce = group_reduce_scatter_start(group_world(), &grad, &u->grad_block);
            profile_pop();
            if (s->counting) s->sent_reduce_scatter += (double)(s->world - 1) / s->world * (double)u->padded * sizeof(float);
            if (s->zero >= 2) reduce_wait(s, i + 1);  // the layer after's buffer is needed again next
        }
        if (grad_x) relu_backward(input, grad_x);
        grad_y = grad_x;
    }
    profile_pop();
}

// Stages 1-2: every rank's updated blocks gathered back into every rank's whole layers, in place.
static void gather_blocks(Sharded *s) {
    profile_push("all-gather");
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        u->reduce = group_all_gather_start(group_world(), &u->param_block, &u->full);  // in place
        if (s->counting) s->sent_all_gather += (double)(s->world - 1) / s->world * (double)u->padded * sizeof(float);
    }
    for (int i = 0; i < s->n_units; i++) group_wait(&s->units[i].reduce);
    profile_pop();
}

// optimizer.step() on the blocks: the reduced gradients divided by N (DDP's
// mean), Adam on this rank's block of every layer with the scalars of
// adam_step, then (stages 1-2) every rank's blocks gathered back in place.
static void sharded_adam_step(Sharded *s, long step, double lr) {
    for (int i = 0; i < s->n_units; i++) reduce_wait(s, i);
    profile_push("optimizer");
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double bias_correction1 = 1.0 - pow(beta1, (double)step), bias_correction2 = 1.0 - pow(beta2, (double)step);
    const AdamCoefficients coefficients = {
        .step_size = (float)(lr / bias_correction1),
        .bias_correction2_sqrt = (float)sqrt(bias_correction2),
        .one_minus_beta1 = (float)(1.0 - beta1),
        .beta2 = (float)beta2,
        .one_minus_beta2 = (float)(1.0 - beta2),
        .eps = (float)eps,
    };
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        if (s->world > 1) tensor_divide(&u->grad_block, (float)s->world);  // grad / N, as DDP divides
        adam_update(&u->param_block, &u->grad_block, &u->exp_avg, &u->exp_avg_sq, &coefficients);
    }
    profile_pop();
    if (s->zero <= 2) gather_blocks(s);
    device_mark_step();  // the step is queued (the simulated GPU counts per step), as adam_step's
}

// The test set, each rank its 1/N share in chunks of the batch size (every
// rank runs as many chunks, for stage 3's gathers), the correct predictions
// summed over the ranks: the share of the whole set that is right.
static double sharded_accuracy(Sharded *s, const Tensor *images, const int *labels, int chunk) {
    long n = images->rows, first = n * s->rank / s->world, end = n * (s->rank + 1) / s->world, correct = 0;
    long most = (n + s->world - 1) / s->world, chunks = (most + chunk - 1) / chunk;
    int *predictions = xmalloc((size_t)chunk * sizeof(int));
    for (long c = 0, start = first; c < chunks; c++, start += chunk) {
        int rows = (int)(start >= end ? 0 : end - start < chunk ? end - start : chunk);
        Tensor x = tensor_row_range(images, rows ? (int)start : 0, rows);
        const Tensor *logits = sharded_forward(s, &x);
        if (rows == 0) continue;
        argmax_rows(logits, predictions);
        for (int r = 0; r < rows; r++) correct += predictions[r] == labels[start + r];
    }
    free(predictions);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &correct, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    return n ? (double)correct / n : 0.0;
}

// The memory check and the reports, after main.
static void add_memory_need(MemoryNeed *need, const int *sizes, int n_sizes, int zero, bool prefetch, int world,
                            int max_batch);  // the memory check, beside report_memory's theory
static void report_memory(const Sharded *s, const Ddp *ddp, size_t weights, Device device);
static void report_traffic(const Sharded *s, long steps, size_t weights, const Ddp *ddp);
static void load_whole(Sharded *s, const char *path);
static void gather_unit(void *sharded, int layer, Param pair[2]);
static void check_held_weights_finite(Sharded *s, long steps, int epochs, Tracking *run);
static int checkpoint_pieces(Sharded *s, Adam *optimizer, bool saving, CheckpointPiece *pieces);

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/18_zero_sharding.png");
    int zero = 0, prefetch = 0, max_steps = -1;
    const char *hidden = "128", *trace = NULL, *checkpoint = NULL, *save_errors = "stop";
    int save_every = 0, keep = 2, async_save = 0;
    double bucket_mb = 25.0;
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"zero", ARG_INT, &zero, "STAGE", "0: DDP; 1: Adam's moments sharded; 2: and the gradients; 3: and the parameters (FSDP)", 0, NULL},
        {"prefetch", ARG_SWITCH, &prefetch, NULL, "--zero 3: gather the next layer's weights while this one computes", 0, NULL},
        {"hidden", ARG_STRING, &hidden, "W,W,...", "the hidden layers' widths (4096,4096: three Linears)", 0, NULL},
        {"max_steps", ARG_INT, &max_steps, "N", "stop after N optimizer steps, overriding --epochs (-1: --epochs decides)", -1, NULL},
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MiB", "--zero 0: DDP's gradient bucket size; 0: one bucket per tensor", 0, NULL},
        {"trace", ARG_OUTPUT_OR_NONE, &trace, "FILE.json", "Chrome trace of every rank's ranges (see step 5; '' for none)", 0, NULL},
        {"checkpoint", ARG_STRING, &checkpoint, "DIR", CHECKPOINT_HELP_DIR, 0, NULL},
        {"save_every", ARG_INT, &save_every, "N", CHECKPOINT_HELP_SAVE_EVERY, 0, NULL},
        {"keep", ARG_INT, &keep, "N", CHECKPOINT_HELP_KEEP, 1, NULL},
        {"async_save", ARG_SWITCH, &async_save, NULL, CHECKPOINT_HELP_ASYNC_SAVE, 0, NULL},
        {"save_errors", ARG_STRING, &save_errors, "WHAT", CHECKPOINT_HELP_SAVE_ERRORS, 0, "stop|continue"},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 18: sharded data parallelism, ZeRO stages 1-3 (FSDP): the optimizer state, gradients and parameters split across ranks.");
    if (zero > 3) usage_error("--zero %d: expected 0 (DDP), 1 (Adam's moments sharded), 2 (and the gradients) or 3 (and the parameters)", zero);
    if (prefetch && zero != 3) usage_error("--prefetch: only --zero 3 gathers weights before each layer (got --zero %d)", zero);
    if (args_given("bucket_mb") && zero != 0) usage_error("--bucket_mb: only --zero 0 (DDP) has buckets; stages 1-3 reduce layer by layer");
    checkpoint_flags_check(checkpoint);  // --save_every, --keep, --async_save, --save_errors: only with --checkpoint
    bool save_errors_continue = strcmp(save_errors, "continue") == 0;
    int sizes[MLP_MAX_SIZES];
    int n_sizes = mlp_sizes_from_hidden(hidden, MNIST_PIXELS, MNIST_CLASSES, sizes);
    char model_name[128];
    mlp_describe_sizes(sizes, n_sizes, model_name, sizeof model_name);
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    matmul_set_dtype(matmul_dtype_from_flag(opt.dtype));  // with torch.autocast(device_type, dtype=torch.bfloat16):
    // Memory: what this stage keeps on each rank (the theory the report shows at the end), refused
    // now if it would not fit (exit 2).
    MemoryNeed need = memory_need("--hidden %s --zero %d%s --batch_size %d (%d rank%s)", hidden, zero,
                                  prefetch ? " --prefetch" : "", opt.batch_size, dist_world_size(), dist_world_size() == 1 ? "" : "s");
    add_memory_need(&need, sizes, n_sizes, zero, prefetch, dist_world_size(), opt.batch_size);
    mnist_add_memory_need(&need, opt.batch_size);
    memory_require(&need, device);
    int rank = dist_rank(), world = dist_world_size();

    // Data: 60000 training and 10000 test images, pixels / 255 as float32.
    MnistSplit train = mnist_load(opt.data, MNIST_TRAIN);
    MnistSplit test = mnist_load(opt.data, MNIST_TEST);
    // Each rank takes its 1/W share: positions rank, rank + W, rank + 2W, ...
    DistributedSampler sampler = sampler_new(train.n, world, rank, !opt.no_shuffle, (uint64_t)opt.seed);
    int steps_per_epoch = sampler_num_batches(&sampler, opt.batch_size);
    int epochs = max_steps < 0 ? opt.epochs : (max_steps + steps_per_epoch - 1) / steps_per_epoch;

    // Model and optimizer: each layer a flat unit; this rank keeps what its stage keeps.
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);  // torch.manual_seed(seed)
    Sharded model = sharded_new(sizes, n_sizes, zero, prefetch, opt.batch_size, &rng, device);
    if (opt.init) load_whole(&model, opt.init);
    size_t weights = 0, padded = 0, block = 0;
    for (int i = 0; i < model.n_units; i++)
        weights += model.units[i].numel, padded += model.units[i].padded, block += model.units[i].block;
    Ddp ddp = {0};
    Adam optimizer = {0};
    if (zero == 0) {
        ddp = ddp_wrap(model.params, 2 * model.n_units, bucket_mb);  // model = DDP(model)
        optimizer = adam_new(model.params, 2 * model.n_units, opt.lr);
    }

    char layout[512], steps_text[64] = "";
    if (zero == 0) ddp_describe_buckets(&ddp, layout, sizeof layout);
    else snprintf(layout, sizeof layout, "%d flat unit%s padded to %zu (a block of %zu per rank)", model.n_units,
                  model.n_units == 1 ? "" : "s", padded, block);
    if (max_steps >= 0) snprintf(steps_text, sizeof steps_text, " (--max_steps %d)", max_steps);
    const char *stage_name[] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
    print0("Step 18: %s%s on %d rank%s: MLP %s, %zu weights in %s; Adam lr %g; batch %d per rank; %d epoch%s%s; shuffle %s (seed %d); %s, %s\n",
           stage_name[zero], prefetch ? " with prefetch" : "", world, world == 1 ? "" : "s", model_name, weights, layout,
           opt.lr, opt.batch_size, epochs, epochs == 1 ? "" : "s", steps_text, opt.no_shuffle ? "off" : "on", opt.seed,
           device_name(device), threads_describe());

    // --checkpoint: resume from DIR's current checkpoint, whatever layout saved it. Each rank
    // reads the slices of the saved shards that its own blocks (or, under DDP, whole layers) need.
    LossLog losses = {0};
    CheckpointState state = {.program = "day4/18_zero_sharding", .world_size = world,
                             .global_batch = (long)opt.batch_size * world, .seed = opt.seed, .shuffle = !opt.no_shuffle,
                             .train_samples = train.n, .lr = opt.lr, .generator = rng, .losses = &losses};
    snprintf(state.layout, sizeof state.layout, "%s on %d rank%s", stage_name[zero], world, world == 1 ? "" : "s");
    CheckpointPiece *pieces = xcalloc((size_t)(12 * model.n_units), sizeof(CheckpointPiece));
    long steps = 0, resumed_step = -1;
    int first_epoch = 0;
    long first_position = 0;  // of first_epoch's sampler order, trained on before a resume
    if (checkpoint && sharded_checkpoint_resume(checkpoint, pieces, checkpoint_pieces(&model, &optimizer, false, pieces), &state, opt.init)) {
        steps = resumed_step = state.step, first_epoch = state.epoch, first_position = state.samples_done;
        optimizer.step = steps;  // (stages 1-3 count Adam's steps with `steps`)
        if (zero == 1 || zero == 2) {  // each rank read its blocks; every rank holds them all
            model.counting = false;  // (not training's traffic)
            gather_blocks(&model);
            model.counting = true;
        }
        rng = state.generator;
    }
    // The MLflow run: a resume logs into the checkpoint's, its losses so far sent again where the
    // store lacks them (the process that saved it may have died with them queued).
    Tracking *run = tracking_start(&opt.tracking, "day4/18_zero_sharding.c", device_name(device),
                                   state.mlflow_run_id, args_values());  // mlflow.start_run(run_id=...); mlflow.log_params(vars(args))
    snprintf(state.mlflow_run_id, sizeof state.mlflow_run_id, "%s", tracking_run_id(run));
    for (int i = 0; i < losses.n; i++) tracking_log_metric(run, "loss", losses.loss[i], i);

    Tensor batch_images = tensor_zeros(opt.batch_size, MNIST_PIXELS, device);  // [B, 784]
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]
    // Each step's loss stays on the GPU until the host needs it (step_losses.h): at an epoch's end, the
    // last step, or a checkpoint (which keeps the losses so far). No step waits for it.
    StepLosses pending = step_losses_new(steps_per_epoch, device);

    if (trace) profile_start(trace);
    long first_steps = steps;
    CheckpointSave *in_flight = NULL;  // --async_save: the save a thread is writing
    double train_start = wall_seconds(), first_step_seconds = 0;
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
            if (zero <= 1)  // optimizer.zero_grad() (stages 2-3: each layer's gradient starts at zero in backward)
                for (int i = 0; i < model.n_units; i++) tensor_fill(&model.units[i].grad, 0.0f);
            sharded_forward(&model, &x);                    // output = model(data)
            sharded_loss_to(&model, batch_labels, mnist_batch_device_labels(&train),  // loss = criterion(output, target)
                            step_losses_next(&pending));
            sharded_backward(&model, &x, &ddp);             // loss.backward(): buckets or reduce-scatters start here
            if (zero == 0) {
                ddp_finish(&ddp);                           // all buckets reduced, grads averaged
                adam_step(&optimizer);                      // optimizer.step()
            } else {
                sharded_adam_step(&model, steps + 1, opt.lr);  // optimizer.step() on this rank's blocks
            }
            samples += (long)x.rows * world;
            epoch_steps++;
            if (++steps == first_steps + 1) {  // (the first step's time: its work done, on a GPU too)
                device_synchronize();
                first_step_seconds = wall_seconds() - train_start;
            }
            bool epoch_done = b + 1 == n_batches, save_now = checkpoint && save_every > 0 && steps % save_every == 0;
            // loss.item(): at once on a CPU; on a GPU the steps' losses since the last hand-over, when due.
            float *taken;
            int n_taken = step_losses_take_all(&pending, epoch_done || steps == max_steps || save_now, &taken);
            dist_allreduce_sum(taken, (size_t)n_taken);     // for the log: each step's loss of the global batch
            for (int i = 0; i < n_taken; i++) {
                float loss = taken[i] / (float)world;
                check_loss_finite(loss, losses.n + 1, epoch + 1, run);  // the sum above spread any nan to every rank
                loss_log_add(&losses, epoch, loss);
                tracking_log_metric(run, "loss", loss, losses.n - 1);  // mlflow.log_metric("loss", loss, step=step)
                loss_sum += loss;
            }
            // Where the run stands: the data position is the sampler positions of the batches done.
            state.step = steps, state.epoch = epoch_done ? epoch + 1 : epoch, state.generator = rng;
            state.samples_done = epoch_done ? 0 : skipped + (long)world * rows_in_batches(sampler.num_samples, opt.batch_size, 0, b + 1);
            if (save_now) {
                check_held_weights_finite(&model, steps, epoch + 1, run);  // never a NaN checkpoint over a good one
                int n_pieces = checkpoint_pieces(&model, &optimizer, true, pieces);
                sharded_checkpoint_save_step(async_save ? &in_flight : NULL, checkpoint, keep, save_errors_continue, pieces, n_pieces,
                                             &state);
            }
        }
        double seconds = wall_seconds() - epoch_start;
        if (samples == 0) continue;  // (a resume at the end of an epoch)
        print0("epoch %d/%d: mean loss %.4f over %d step%s, %.2f s, %.0f samples/s\n", epoch + 1, epochs,
               epoch_steps ? loss_sum / epoch_steps : 0.0, epoch_steps, epoch_steps == 1 ? "" : "s", seconds, samples / seconds);
        tracking_log_metric(run, "epoch_mean_loss", epoch_steps ? loss_sum / epoch_steps : 0.0, epoch);
        tracking_log_metric(run, "samples_per_second", samples / seconds, epoch);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    model.counting = false;
    double train_seconds = wall_seconds() - train_start;
    check_held_weights_finite(&model, losses.n, epochs, run);  // the last step's update
    bool end_saved = true;  // false: the last step's checkpoint failed twice (--save_errors continue)
    // The end of training saved, where no --save_every save holds it (--async_save: the one in flight finished first).
    if (checkpoint && steps == resumed_step) print0("Nothing left to train: the checkpoint is at step %ld\n", steps);
    else if (checkpoint)
        end_saved = sharded_checkpoint_save_last(&in_flight, checkpoint, keep, save_errors_continue, pieces,
                                                 checkpoint_pieces(&model, &optimizer, true, pieces), &state);

    Tensor test_images = mnist_images(&test, device);  // [10000, 784]
    profile_push("evaluation");  // in a trace, the test set's forwards (and gathers) apart from training's
    double accuracy = sharded_accuracy(&model, &test_images, test.labels, opt.batch_size);
    profile_pop();
    print0("World Size: %d. Training completed in %.2f seconds. Test accuracy: %.2f%% (%.0f of %d)\n", world,
           train_seconds, 100 * accuracy, accuracy * test.n, test.n);
    tracking_log_metric(run, "test_accuracy", accuracy, epochs);
    long taken = steps - first_steps;  // by this run (a resumed one took the others before)
    if (taken > 1)
        print0("Step time: %.1f ms (the mean after the first step, which took %.1f ms)\n",
               1e3 * (train_seconds - first_step_seconds) / (double)(taken - 1), 1e3 * first_step_seconds);
    report_memory(&model, zero == 0 ? &ddp : NULL, weights, device);
    report_traffic(&model, taken, weights, zero == 0 ? &ddp : NULL);
    // The checksum, each rank's of its whole copy (gathered layer by layer at stage 3), and --save: the
    // whole state_dict, written by rank 0.
    unsigned long long checksum = whole_model_gather(group_world(), sizes, n_sizes, WHOLE_ON_EVERY_RANK, gather_unit,
                                                     &model, opt.save);
    print_rank("parameter checksum %016llx\n", checksum);

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.plot && *opt.plot) {
        char title[96];
        snprintf(title, sizeof title, "Step 18: MNIST training loss, %s on %d rank%s", stage_name[zero], world,
                 world == 1 ? "" : "s");
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
    free(pieces);
    if (zero == 0) adam_free(&optimizer), ddp_free(&ddp);
    sharded_free(&model);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    sharded_checkpoint_check_end_saved(end_saved, checkpoint);  // the outputs written: exit 1 if the end is not checkpointed
    dist_finalize();
    return 0;
}

// ------------------------------------------------------------------ the reports

// --init: each layer read whole, by name, into the unit (stages 0-2) or its gathered copy, of
// which stage 3 keeps this rank's block. Collective.
static void load_whole(Sharded *s, const char *path) {
    for (int i = 0; i < s->n_units; i++) {
        const Unit *u = &s->units[i];
        Tensor whole = unit_weights(s, i);
        Linear layer = unit_linear(u, &whole, NULL);
        Param pair[2] = {{.value = &layer.weight}, {.value = &layer.bias}};
        mlp_name_layer(pair, i);
        h5_load_params(path, pair, 2);
        if (s->zero == 3) {
            Tensor mine = flat_view(&whole, (size_t)s->rank * u->block, u->block);
            tensor_copy(&s->units[i].param_block, &mine);
        }
        reshard(s, i);
    }
}

// whole_model_gather's: layer `layer` whole on every rank (its own at stages 0-2, all-gathered at
// stage 3), copied into pair's host tensors. Collective.
static void gather_unit(void *sharded, int layer, Param pair[2]) {
    Sharded *s = sharded;
    Tensor whole = unit_weights(s, layer);
    Linear view = unit_linear(&s->units[layer], &whole, NULL);
    tensor_copy(pair[0].value, &view.weight);
    tensor_copy(pair[1].value, &view.bias);
    reshard(s, layer);
}

// The weights this rank holds, checked finite (collective): whole at stages 0-2, its blocks at stage 3,
// where no rank holds a whole layer outside a gather.
static void check_held_weights_finite(Sharded *s, long steps, int epochs, Tracking *run) {
    if (s->zero <= 2) {
        check_weights_finite(s->params, 2 * s->n_units, steps, epochs, run);
        return;
    }
    Param *blocks = xcalloc((size_t)s->n_units, sizeof(Param));
    for (int i = 0; i < s->n_units; i++) {
        blocks[i].value = &s->units[i].param_block;
        snprintf(blocks[i].name, sizeof blocks[i].name, "fc.%d.weight and bias", 2 * i);
    }
    check_weights_finite(blocks, s->n_units, steps, epochs, run);
    free(blocks);
}

// The theory of each stage, per weight: the bytes of its value, its gradient
// and Adam's two moments that a rank keeps, on N ranks (16 / N and so on:
// report_memory's "theory" column and the memory check before training).
static void state_bytes_per_weight(int zero, double n, double bytes[3]) {
    bytes[0] = zero <= 2 ? 4 : 4 / n;  // parameters: whole until stage 3
    bytes[1] = zero <= 1 ? 4 : 4 / n;  // gradients: whole until stage 2
    bytes[2] = zero == 0 ? 8 : 8 / n;  // Adam's moments: sharded from stage 1
}

// What sharded_new and the training will hold on this rank, added to `need`
// before anything is allocated: the theory's model state, the working buffers
// (DDP's copy of the gradients; stages 2-3: two layers' whole gradients, and on
// stage 3 one layer gathered, or two with --prefetch), every layer's output and
// its gradient for max_batch rows.
static void add_memory_need(MemoryNeed *need, const int *sizes, int n_sizes, int zero, bool prefetch, int world,
                            int max_batch) {
    double weights = 0, activations = 0, largest[2] = {0, 0};  // of the even and the odd layers
    for (int i = 0; i + 1 < n_sizes; i++) {
        double numel = (double)sizes[i] * sizes[i + 1] + sizes[i + 1];
        weights += numel;
        largest[i % 2] = numel > largest[i % 2] ? numel : largest[i % 2];
        activations += 2.0 * max_batch * sizes[i + 1];
    }
    double per_weight[3], both = largest[0] + largest[1], any = largest[0] > largest[1] ? largest[0] : largest[1];
    state_bytes_per_weight(zero, world, per_weight);
    memory_need_add(need, "parameters", per_weight[0] * weights);
    memory_need_add(need, "gradients", per_weight[1] * weights);
    memory_need_add(need, "Adam's moments", per_weight[2] * weights);
    double working = zero == 0 ? weights : zero == 1 ? 0 : both + (zero == 3 ? (prefetch ? both : any) : 0);
    memory_need_add(need, "working buffers", working * sizeof(float));
    memory_need_add(need, "activations", activations * sizeof(float));
    matmul_add_memory_need(need, mlp_largest_operand(sizes, 0, n_sizes - 1, max_batch));  // --dtype bfloat16's copies
}

// Per rank: the bytes of parameters, gradients and Adam's moments it holds,
// beside the stage's theory; the working buffers; the peak resident set (on a GPU, the allocator's peak).
static void report_memory(const Sharded *s, const Ddp *ddp, size_t weights, Device device) {
    double params = 0, grads = 0, adam = 0, working = 0, n = s->world;
    for (int i = 0; i < s->n_units; i++) {
        const Unit *u = &s->units[i];
        params += (s->zero <= 2 ? u->padded : u->block) * sizeof(float);
        grads += (s->zero <= 1 ? u->padded : u->block) * sizeof(float);
        adam += 2.0 * (s->zero == 0 ? u->padded : u->block) * sizeof(float);
    }
    for (int k = 0; k < 2; k++)
        working += (double)(tensor_numel(&s->grads[k]) + tensor_numel(&s->gathered[k])) * sizeof(float);
    if (ddp)
        for (int b = 0; b < ddp->n_buckets; b++) working += (double)ddp->buckets[b].count * sizeof(float);
    double per_weight[3];  // the theory: what a stage keeps of each weight
    state_bytes_per_weight(s->zero, n, per_weight);
    const char *formula[] = {"16", "4 + 4 + 8/N", "4 + 12/N", "16/N"};
    const char *working_is[] = {"DDP's buckets: a copy of the gradients", "none", "2 layers' whole gradients",
                                s->prefetch ? "2 layers gathered, 2 layers' whole gradients"
                                            : "1 layer gathered, 2 layers' whole gradients"};
    double mine[5] = {params, grads, adam, working, device_peak_memory_bytes(device)};
    double *all = group_gather_figures(group_world(), mine, 5, false);
    double theory = (per_weight[0] + per_weight[1] + per_weight[2]) * (double)weights;
    print0("Memory per rank (MB): parameters + gradients + Adam = model state, beside the theory %s B/param x %zu "
           "(N = %d); working buffers (%s); peak resident set\n", formula[s->zero], weights, s->world,
           working_is[s->zero]);
    print0("rank  parameters  gradients     Adam  model state   theory         working   %s\n",
           device == DEVICE_CUDA ? "GPU peak" : "peak RSS");
    for (int r = 0; r < s->world && s->rank == 0; r++) {
        const double *f = &all[5 * r];
        double state = f[0] + f[1] + f[2];
        print0("%4d  %10.2f  %9.2f  %7.2f  %11.2f  %7.2f (%+.1f%%)  %7.2f  %9.1f\n", r, f[0] / 1e6, f[1] / 1e6,
               f[2] / 1e6, state / 1e6, theory / 1e6, 100 * (state / theory - 1), f[3] / 1e6, f[4] / 1e6);
    }
    free(all);
}

// What each rank sent per step through each collective (a ring sends (N - 1)/N
// of the buffer per pass; an allreduce is two passes), beside the theory:
// S (N - 1)/N for each pass over the model's S bytes.
static void report_traffic(const Sharded *s, long steps, size_t weights, const Ddp *ddp) {
    if (steps == 0 || s->world == 1) return;
    double ring = (double)(s->world - 1) / s->world, model_bytes = (double)weights * sizeof(float);
    double allreduce = 0;
    if (ddp)
        for (int b = 0; b < ddp->n_buckets; b++) allreduce += 2 * ring * (double)ddp->buckets[b].count * sizeof(float);
    double reduce_scatter = s->sent_reduce_scatter / steps;
    double all_gather = s->sent_all_gather / steps;
    double total = allreduce + reduce_scatter + all_gather, passes[] = {2, 2, 2, 3};
    print0("Sent per step by each rank (MB): allreduce %.2f, reduce-scatter %.2f, all-gather %.2f; %.2f in all, "
           "%.2fx DDP's allreduce; theory %.0f x (N - 1)/N x %.2f MB of weights = %.2f (%.2fx DDP's)\n",
           allreduce / 1e6, reduce_scatter / 1e6, all_gather / 1e6, total / 1e6, total / (2 * ring * model_bytes),
           passes[s->zero], model_bytes / 1e6, passes[s->zero] * ring * model_bytes / 1e6, passes[s->zero] / 2);
}

// ------------------------------------------------------------------ the sharded checkpoint

// This rank's pieces of the model and of Adam's moments, as boxes of the state_dict's tensors
// (sharded_checkpoint.h): saving, its 1/N of every flat unit (its block at stages 1-3; under DDP,
// where every rank holds everything, the same split, so that the ranks share the writing);
// loading, the blocks it holds (stages 1-3) or the whole layers (DDP). Returns their count.
static int checkpoint_pieces(Sharded *s, Adam *optimizer, bool saving, CheckpointPiece *pieces) {
    static char names[MLP_MAX_SIZES][6][64];  // fc.0.weight, fc.0.bias, optimizer/exp_avg/..., .../exp_avg_sq/...
    int n = 0;
    for (int i = 0; i < s->n_units; i++) {
        const Unit *u = &s->units[i];
        for (int k = 0; k < 6; k++)
            snprintf(names[i][k], sizeof names[i][k], "%sfc.%d.%s", k < 2 ? "" : k < 4 ? "optimizer/exp_avg/" : "optimizer/exp_avg_sq/",
                     2 * i, k % 2 ? "bias" : "weight");
        size_t weight_numel = (size_t)u->out * u->in, share = s->zero == 0 ? (u->numel + s->world - 1) / s->world : u->block;
        size_t first = s->zero == 0 && !saving ? 0 : (size_t)s->rank * share;
        size_t end = s->zero == 0 && !saving ? u->numel : first + share < u->numel ? first + share : u->numel;
        if (first >= end) continue;  // (a rank past the last element: a padded unit on many ranks)
        // Where flat element k of each state lies: stages 1-3 in the rank's blocks (from `first`);
        // DDP in the whole unit (values) and in Adam's tensors, one per parameter.
        const Tensor *values = s->zero == 0 ? &u->full : &u->param_block;
        size_t base = s->zero == 0 ? 0 : first;
        const Tensor *sources[3][2] = {
            {values, values},
            {s->zero == 0 ? &optimizer->exp_avg[2 * i] : &u->exp_avg, s->zero == 0 ? &optimizer->exp_avg[2 * i + 1] : &u->exp_avg},
            {s->zero == 0 ? &optimizer->exp_avg_sq[2 * i] : &u->exp_avg_sq, s->zero == 0 ? &optimizer->exp_avg_sq[2 * i + 1] : &u->exp_avg_sq},
        };
        for (int state = 0; state < 3; state++) {
            bool separate = s->zero == 0 && state > 0;  // DDP's Adam: the bias's moments in a tensor of their own
            if (first < weight_numel)
                n += checkpoint_flat_pieces(names[i][2 * state], u->out, u->in, first, end < weight_numel ? end : weight_numel,
                                            sources[state][0], first - (separate ? 0 : base), &pieces[n]);
            if (end > weight_numel) {
                size_t from = first > weight_numel ? first : weight_numel;
                n += checkpoint_flat_pieces(names[i][2 * state + 1], u->out, 0, from - weight_numel, end - weight_numel,
                                            sources[state][1], separate ? from - weight_numel : from - base, &pieces[n]);
            }
        }
    }
    return n;
}
