// kernels.h: the CUDA kernels behind tensor, tensor_ops, transformer_ops, mf, ddp and mnist, callable from C.
//
// Each function launches its kernel (two for long rows' sums) on `stream` and
// returns at once; errors in the launch end the job (check.h's fatal_at).
// Pointers are device memory.
// The arithmetic mirrors the CPU code in tensor_ops.c operation for operation,
// so the two agree to rounding: bit for bit where each result is one IEEE
// operation or a copy (the gather's division, bias + ReLU, im2col, col2im,
// pooling, scaling), to the last bits elsewhere: nvcc fuses a * b + c into one
// FMA (Adam's and SGD's updates) where the CPU build rounds twice, and expf and
// logf are CUDA's own. tests/unit/test_gpu.c checks each at its own tolerance.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// For tests: force != 0 makes each grid-stride kernel index in 64 bits, which
// otherwise only tensors of over 4 G elements take (32 bits are faster).
void gpu_force_64_bit_indices(int force);

void gpu_fill(float *x, size_t n, float value, cudaStream_t stream);
// out[i] = x[i] rounded to bfloat16 (its bits: round_to_bfloat16's, tensor.h), for a bf16 GEMM.
void gpu_round_to_bfloat16(const float *x, size_t n, uint16_t *out, cudaStream_t stream);
// The same for a product's two operands in one launch: a [n_a] into out_a, b [n_b] into out_b.
void gpu_round_two_to_bfloat16(const float *a, size_t n_a, uint16_t *out_a, const float *b, size_t n_b,
                               uint16_t *out_b, cudaStream_t stream);
void gpu_scale(float *x, size_t n, float factor, cudaStream_t stream);          // x *= factor
void gpu_divide(float *dst, const float *src, size_t n, float divisor, cudaStream_t stream);  // dst = src / divisor

// y[r, c] += bias[c], then y = max(y, 0) when relu: Linear's bias and the
// ReLU after it in one pass over y [rows, cols]; where `rounded` is set, y's
// values rounded to bfloat16 there too (gpu_round_to_bfloat16's bits).
void gpu_bias_relu(float *y, const float *bias, int rows, int cols, int relu, uint16_t *rounded, cudaStream_t stream);
// grad *= (y > 0), where y is the ReLU's output; grad's rounded values into
// `rounded` where it is set.
void gpu_relu_backward(const float *y, float *grad, size_t n, uint16_t *rounded, cudaStream_t stream);

// Softmax cross-entropy, forward and backward in one kernel, a thread per row:
// row_loss[r] = logsumexp(logits[r]) - logits[r, label], and
// grad[r] = (softmax(logits[r]) - onehot(label)) / rows, and rounded to
// bfloat16 into `grad_rounded` where it is set.
void gpu_cross_entropy(const float *logits, const int *labels, int rows, int cols, float *grad, uint16_t *grad_rounded,
                       float *row_loss, cudaStream_t stream);
// MSE's per-element terms: diff = output - target, grad = 2 diff / n.
void gpu_mse(const float *output, const float *target, size_t n, float *grad, float *diff, cudaStream_t stream);
// *result = sum of x[i] (or of x[i]^2), accumulated in double by one block in
// a fixed order: the same bits every run.
void gpu_sum(const float *x, size_t n, int squares, double *result, cudaStream_t stream);
// results[i] = the sum of the squares of spans[i] (device memory: count of them), each as gpu_sum
// sums it, the same bits; one block a span, all in one launch.
typedef struct {
    const float *data;
    size_t n;
} FloatSpan;
void gpu_sum_squares_each(const FloatSpan *spans, int count, double *results, cudaStream_t stream);
// *total = x[0] + ... + x[n - 1] in double, in that order (one thread: n is a few hundred at most).
void gpu_sum_in_order(const double *x, int n, double *total, cudaStream_t stream);
// The gradients' clip without the host: *coef = max_norm / (norm + 1e-6) from the tensors' n sums of
// squares (gpu_sum's), in clip_grad_norm's arithmetic; then x *= *coef where *coef < 1, per tensor.
void gpu_clip_coef(const double *sums, int n, double max_norm, float *coef, cudaStream_t stream);
void gpu_clip_scale(float *x, size_t n, const float *coef, cudaStream_t stream);

// torch.optim.Adam's update of one tensor, in tensor_ops.c's (PyTorch's) operation order.
void gpu_adam(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t n, float step_size,
              float bias_correction2_sqrt, float one_minus_beta1, float beta2, float one_minus_beta2, float eps,
              cudaStream_t stream);
// A launch over many tensors (a model's), where a launch per tensor made a row of small kernels
// that their launches bound (PyTorch's foreach implementation): each tensor's values are cut into
// gpu_span_blocks(n) blocks, tensor after tensor, and each tensor in the table (device memory, in
// order) carries its first block: the sum of the blocks of the tensors before it. `blocks` is the
// sum of all of them.
size_t gpu_span_blocks(size_t n);
// gpu_adam's update of each tensor, each value's arithmetic the same (the same bits); where a tensor
// `decays`, param *= keep before it (AdamW's decoupled weight decay, gpu_scale's product). The six
// coefficients (step_size, bias_correction2_sqrt, one_minus_beta1, beta2, one_minus_beta2, eps)
// are read from device memory when it runs: a CUDA graph's step reads each step's.
typedef struct {
    float *param;
    const float *grad;
    float *exp_avg, *exp_avg_sq;
    size_t n;         // its values
    int first_block;  // its first block in the launch
    int decays;       // param *= keep first
} AdamTensor;
void gpu_adam_tensors(const AdamTensor *tensors, int count, int blocks, const float *coefficients, float keep,
                      cudaStream_t stream);
// gpu_fill of each span: a model's zero_grad in one launch.
typedef struct {
    float *data;
    size_t n;
    int first_block;
    int unused;  // (no padding: tables of spans are compared with memcmp)
} FillSpan;
void gpu_fill_spans(const FillSpan *spans, int count, int blocks, float value, cudaStream_t stream);
void gpu_sgd(float *param, const float *grad, size_t n, float lr, cudaStream_t stream);  // param -= lr * grad

// prediction[r] = argmax over c of logits[r, c] (the first, on ties).
void gpu_argmax(const float *logits, int rows, int cols, int *prediction, cudaStream_t stream);

// out[r] = images[indices[r]] / 255 as float32: a batch gathered from the uint8 training set on the
// GPU (the same correctly rounded division as numpy), in one launch with, where not NULL, rounded[r]
// = out[r] rounded to bfloat16 (gpu_round_to_bfloat16's bits) and out_labels[r] = labels[indices[r]].
void gpu_gather_batch(const uint8_t *images, const int *labels, const int *indices, int rows, int pixels, float *out,
                      uint16_t *rounded, int *out_labels, cudaStream_t stream);

// out[r] = values[indices[r]] for r < n: a batch's labels gathered on the GPU from the resident set,
// step 15's epoch through its permutation (rating_sampler.c; its ratings' floats as their bits).
void gpu_gather_ints(const int *values, const int *indices, int n, int *out, cudaStream_t stream);
// *slot = weight * (float)(sum / rows) (accumulate: *slot += that), where sum is row_loss[0 .. rows)
// summed as gpu_sum sums it, in float as the host computes a step's loss from gpu_sum's result: the
// loss stays on the GPU until the host prints it. One launch: the sum, then the slot.
void gpu_loss_to_slot(const float *row_loss, int rows, float weight, int accumulate, float *slot, cudaStream_t stream);

// out[i] = pixels[i] / 255 as float32: a streamed batch, copied to the GPU as
// uint8 (4x fewer bytes over PCIe), converted there.
void gpu_pixels_to_float(const uint8_t *pixels, size_t n, float *out, cudaStream_t stream);

// ------------------------------------------------------------------ the CNN's operations (tensor_ops.c)
// Images are channel-major [channels, batch * height * width] (tensor_ops.h).

// columns [channels * k * k, batch * out_h * out_w] = every k x k window of x
// (stride 1, `padding` zeros around each image), a thread per column entry.
void gpu_im2col(const float *x, int channels, int batch, int height, int width, int kernel, int padding,
                float *columns, cudaStream_t stream);
// x = im2col's adjoint of columns: a thread per pixel sums its k x k entries in
// (dy, dx) order, as the CPU does (no atomics: the same bits every run).
void gpu_col2im(const float *columns, int channels, int batch, int height, int width, int kernel, int padding,
                float *x, cudaStream_t stream);
// y[r, c] += bias[r], then y = max(y, 0) when relu.
void gpu_add_row_bias(float *y, const float *bias, int rows, int cols, int relu, cudaStream_t stream);
// sums[r] += the sum of row r of x [rows, cols], in double, the same bits every
// run. Each row is cut into gpu_row_sum_chunks(cols) chunks, chosen from cols
// alone: a block sums each chunk in a fixed tree into `partials` (device
// scratch of rows x chunks doubles, the caller's), then a thread per row adds
// its chunks' sums in order (a second kernel). A row of one chunk goes straight
// into sums: one kernel, and partials may be NULL.
int gpu_row_sum_chunks(int cols);
void gpu_add_sum_of_rows(const float *x, int rows, int cols, double *partials, float *sums, cudaStream_t stream);
// Max pooling over planes of height x width, windows size x size with stride
// size: y and argmax (the index in x) per output, aten's rule on ties and NaNs.
void gpu_max_pool2d(const float *x, int planes, int height, int width, int size, float *y, int *argmax,
                    cudaStream_t stream);
// grad_x[argmax[i]] = grad_y[i] for i < n (grad_x zeroed by the caller).
void gpu_max_pool2d_backward(const float *grad_y, const int *argmax, size_t n, float *grad_x, cudaStream_t stream);
// y [b, a, inner] = x [a, b, inner] with the outer two axes swapped.
void gpu_swap_outer_axes(const float *x, int a, int b, int inner, float *y, cudaStream_t stream);

// ------------------------------------------------------------------ step 15's embeddings (mf.c)
// mf.c's loops on the GPU, the same bits as the CPU's (no FMA contraction: __fmul_rn,
// __fadd_rn), each sum in a fixed order. Rows are [*, dim], row-major. How many rows a batch
// touches is found on the GPU and stays there: `count` (device memory) bounds the work of the
// kernels that take it, up to the host's n_max (NULL: n_max itself), so that the host never waits
// to read it.
//
// A sort of the entries p < n that are valid (p < *n_valid, NULL: all; keys[p] >= 0) by
// key (keys < 2^key_bits), stably: entries of one key keep their order p. Out: *n_groups, the
// distinct keys; group g has key group_key[g] and the sorted entries group_start[g] ..
// group_start[g + 1] (group_start[*n_groups]: the valid entries); order[k]: the k-th sorted
// entry p, written as (p / block) * block_stride + p % block (block = block_stride: p itself),
// for entries gathered in blocks of a larger stride; group_of[p]: the group of valid entry p.
// scratch: 4 max(n, 1) ints. keys[p] may be read for every p < n, valid or not. Deterministic:
// the same result whatever the GPU's timing.
// gpu_sort_groups does one or two such sorts (the batch's users and its movies): those of a batch's
// size together, in two launches. The keys are `keys`, or, where keys_at is set, the array whose
// address it holds in device memory, read by the kernel: a step replayed from a CUDA graph sorts
// its own batch where the step's inputs say it is (MfStepInputs).
typedef struct {
    const int *keys;
    const int *const *keys_at;
    int n;
    const int *n_valid;
    int key_bits, block, block_stride;
    int *scratch, *order, *n_groups, *group_key, *group_start, *group_of;
} SortGroups;
void gpu_sort_groups(const SortGroups *sorts, int n_sorts, cudaStream_t stream);
// Step 15's four tables (the user and movie embeddings, their biases): the kernels below that take
// an array of jobs, one per table, do up to MF_TABLES tables' work in one launch.
enum { MF_TABLES = 4 };
// dst[dst_index[j]] = src[src_index[j]] (a NULL index: j) for j < *count (NULL: n_max), rows of
// dim; with dst_flags, dst_flags[dst_index[j]] = 1 too (dense: which rows were touched).
void gpu_copy_rows(const float *src, const int *src_index, float *dst, const int *dst_index, float *dst_flags,
                   const int *count, int n_max, int dim, cudaStream_t stream);
// out[p] = table[keys[p]] for p < n, zeros where keys[p] < 0.
void gpu_keyed_rows(const float *table, const int *keys, int n, int dim, float *out, cudaStream_t stream);
// out[0] = *count, out[1 + i] = ids[i] for i < *count: a block of ids that travels with its count.
void gpu_pack_ids(const int *ids, const int *count, int n_max, int *out, cudaStream_t stream);
// keys[r * per_block + i] = block r's id i (block r at blocks + r * block_ints, as gpu_pack_ids
// wrote it), or -1 past its count.
void gpu_block_keys(const int *blocks, int n_blocks, int block_ints, int per_block, int *keys, cudaStream_t stream);
// keys[j] = rows[j] % world for j < *count (a row's owner when sharded), -1 up to n_max.
void gpu_owner_keys(const int *rows, const int *count, int n_max, int world, int *keys, cudaStream_t stream);
// Sharded: from the touched rows sorted by owner (gpu_sort_groups of gpu_owner_keys), each owner's
// block of send_ids [world, per_owner + 1] (its count, then the local indices asked of it, as
// gpu_pack_ids), and place[k] = owner * per_owner + (k's place in its owner's block).
void gpu_ask_owners(const int *rows, const int *count, int n_max, int world, const int *order, const int *n_groups,
                    const int *group_key, const int *group_start, const int *group_of, int per_owner, int *send_ids,
                    int *place, cudaStream_t stream);
// out[j] = 0 + rows[source[start[j]]] + rows[source[start[j] + 1]] + ... up to start[j + 1], in that order, j < *count.
void gpu_sum_rows(const float *rows, const int *start, const int *source, const int *count, int n_max, int dim,
                  float *out, cudaStream_t stream);
// What changes from one training step to the next, in device memory written before the step
// (mf_prepare_step), so that a step replayed from a CUDA graph reads it there, not in its kernels'
// captured arguments: where the batch's samples are (its slice of the epoch's ratings on the GPU),
// SparseAdam's step size, -lr sqrt(1 - beta2^t) / (1 - beta1^t), computed on the host, and where
// the step's loss goes (the next of those kept on the GPU until the host reads them).
typedef struct MfStepInputs {
    const int *user, *item;
    const float *rating;
    float minus_step_size;
    double *loss;
} MfStepInputs;
// The inputs of the steps ahead, queued on the GPU in one copy (mf_prepare_step: up to 256 of an
// epoch's steps; at batch 1,024 of 5 M ratings, 18 copies an epoch of 4,395 steps).
enum { MF_QUEUED_STEPS = 256 };
typedef struct MfQueuedInputs {
    int next, count;  // the entry the next step takes, of those queued
    MfStepInputs entry[MF_QUEUED_STEPS];
} MfQueuedInputs;
// *current = queued->entry[queued->next++], in one thread (none past queued->count): a step's
// first kernel takes its inputs, so a step replayed from a CUDA graph needs no copy before it.
void gpu_mf_take_step_inputs(MfQueuedInputs *queued, MfStepInputs *current, cudaStream_t stream);
// The samples a forward reads: the step's own buffers (user and item ids; rating NULL: none, the
// predictions only), or, where `take` is set, the epoch's ratings where take says the step's batch
// is (ratings included), which the forward copies into those buffers as it reads them (for the
// backward; the ratings where rating is set): the batch taken without a launch of its own.
typedef struct {
    const MfStepInputs *take;
    int *user, *item;
    float *rating;
} MfSamples;
// Per sample s < n, a thread: out[4s..4s+3] = the prediction (dot + user bias + item bias + mean),
// its error (prediction - its rating; 0 without ratings), |p|^2 and |q|^2. A sample's row of
// p_rows is p_slot[s], or (p_slot NULL) its user id; likewise q_slot (its item), user_slot and
// item_slot.
void gpu_mf_forward(const float *p_rows, const int *p_slot, const float *q_rows, const int *q_slot,
                    const float *user_bias, const int *user_slot, const float *item_bias, const int *item_slot,
                    MfSamples samples, int n, int dim, float mean, float *out, cudaStream_t stream);
// **loss_at = the sum over s < n of error^2 + weight_decay (|p|^2 + |q|^2), in double and in the
// samples' order, / global_n: mf.c's arithmetic (the terms in parallel, their sum by one thread).
// loss_at (device memory) holds where the loss goes: a replayed step writes where its inputs say.
void gpu_mf_loss(const float *forward, int n, float weight_decay, double global_n, double *const *loss_at,
                 cudaStream_t stream);
// A table's gradient rows j < *count, a thread per element: row j sums, over its samples
// sample[start[j]] .. in the batch's order, g * other[other_slot[s]] + decay * self[self_row[j]]
// (self_row NULL: self[j]) with g = scale * the sample's error (forward's out); a bias table (self
// NULL) sums g.
typedef struct {
    const int *start, *sample, *count;
    int n_max, dim;
    const float *self;
    const int *self_row;
    const float *other;
    const int *other_slot;
    float *grad;
} EmbeddingGrad;
void gpu_embedding_backward(const float *forward, float scale, float decay, const EmbeddingGrad *tables, int n,
                            cudaStream_t stream);
// torch.optim.SparseAdam on rows[j] (NULL: j) of weight and its moments with gradient row grad[j],
// j < *count (NULL: n_max), skipping the rows whose flags[j] is 0 (flags NULL: none skipped);
// mf.c's arithmetic, the step size read from inputs->minus_step_size.
typedef struct {
    float *weight, *exp_avg, *exp_avg_sq;
    const int *rows;
    const float *flags;
    const float *grad;
    const int *count;
    int n_max, dim;
} SparseAdamRows;
void gpu_sparse_adam(const SparseAdamRows *tables, int n, const MfStepInputs *inputs, float one_minus_beta1,
                     float one_minus_beta2, float eps, cudaStream_t stream);

// ------------------------------------------------------------------ step 19's transformer (transformer_ops.c)
// transformer_ops.c's CPU loops, operation for operation, with __fmul_rn and __fadd_rn where nvcc
// would fuse a * b + c into one FMA (the CPU build rounds twice), IEEE division and square root
// (nvcc's defaults), the CPU's own exp and erf (transformer_ops.c's rational functions, not CUDA's
// expf): the same bits as the CPU's. Every sum adds in the CPU's order (its fixed lanes, then the
// rest): no atomics. The attention's products are cuBLAS's (transformer_ops.c), not kernels.
// LayerNorm over each row of x [rows, cols] (bias NULL: none), a thread per row: y, and each
// row's mean and 1 / sqrt(var + 1e-5).
void gpu_layernorm_forward(const float *x, const float *weight, const float *bias, int rows, int cols, float *y,
                           float *mean, float *rstd, cudaStream_t stream);
// Its backward: grad_x += d/dx (a thread per row), grad_weight and grad_bias (NULL: none) += the
// sums over the rows (a thread per column, the rows in order).
void gpu_layernorm_backward(const float *x, const float *weight, const float *mean, const float *rstd,
                            const float *grad_y, int rows, int cols, float *grad_x, float *grad_weight,
                            float *grad_bias, cudaStream_t stream);
// The causal softmax of each row t of the [T, T] score blocks of `pairs` (sequence, head) pairs, in
// place, a thread per row: positions u <= t softmaxed, u > t set to 0 (transformer_ops.c's
// causal_softmax_row, its sum in the same lanes).
void gpu_causal_softmax(float *att, int pairs, int T, cudaStream_t stream);
// Its backward, in place on grad (d att in, d scores out): grad = att (grad - sum_u att grad) * scale
// on u <= t, 0 beyond.
void gpu_causal_softmax_backward(const float *att, float *grad, int pairs, int T, float scale, cudaStream_t stream);
// GELU (exact: erf) and its backward over n values, as transformer_ops.c's rational erf and exp;
// grad_x may be grad_y.
void gpu_gelu_forward(const float *x, size_t n, float *y, cudaStream_t stream);
void gpu_gelu_backward(const float *x, const float *grad_y, size_t n, float *grad_x, cudaStream_t stream);
// out = a + b and out = a * b, elementwise over n values (out may be a).
void gpu_add(const float *a, const float *b, size_t n, float *out, cudaStream_t stream);
void gpu_multiply(const float *a, const float *b, size_t n, float *out, cudaStream_t stream);
// The operands of the attention's batched GEMMs (cuBLAS's pointer arrays): for pair p < count of
// (sequence, head), p = sequence * per_sequence + head, its matrix of each operand at base +
// sequence * outer + head * inner (in elements of operand_bytes: 4 for float, 2 for bfloat16 A and B;
// C is float), written into a_out, b_out and c_out.
void gpu_pair_pointers(const void *a, long long a_outer, long long a_inner, const void *b, long long b_outer,
                       long long b_inner, int operand_bytes, float *c, long long c_outer, long long c_inner,
                       int per_sequence, int count, const void **a_out, const void **b_out, float **c_out,
                       cudaStream_t stream);
// transformer_ops.h's dropout_philox_part: mask [runs, length], run r the whole mask's values
// first + r stride .., each scale or 0, from Philox4x32-10 (base/philox.h).
void gpu_dropout_philox(uint32_t key0, uint32_t key1, uint64_t stream_id, float keep, float scale, uint64_t first,
                        uint64_t length, uint64_t stride, size_t runs, float *mask, cudaStream_t stream);
// x [B * T, C] = wte[tokens] + wpe[position].
void gpu_embedding_forward(const int *tokens, const float *wte, const float *wpe, int B, int T, int C, float *x,
                           cudaStream_t stream);
// grad_wte[v] += the rows of grad_x at positions[row_start[v] .. row_start[v + 1]) in that order
// (where token v occurs), a thread per element of the table; grad_wpe[t] += rows b * T + t of
// grad_x for b = 0, 1, ..., B - 1 in order.
void gpu_embedding_backward_tables(const float *grad_x, const int *row_start, const int *positions, int vocab_size,
                                   int B, int T, int C, float *grad_wte, float *grad_wpe, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
