// kernels.cu: the CUDA kernels behind tensor, tensor_ops, transformer_ops, mf, ddp and mnist. See kernels.h.
//
// Plain CUDA, no libraries: one thread per element (grid-stride loops) for
// the elementwise work, one thread per row where a row is a unit (softmax over
// 10 classes), and for the reductions blocks that each sum a fixed range in a
// fixed tree (one block, or a block per chunk of a row and then a pass over the
// chunks' sums in order): no atomics, so every sum adds in the same order.
#include "tensor/kernels.h"

#include "base/philox.h"

// check.h's, declared here so that this file needs no MPI headers.
extern "C" void fatal_at(const char *file, int line, int code, const char *fmt, ...);

#define CHECK_LAUNCH(kernel)                                                                      \
    do {                                                                                          \
        cudaError_t launch_status_ = cudaGetLastError();                                          \
        if (launch_status_ != cudaSuccess)                                                        \
            fatal_at(__FILE__, __LINE__, 1, "launching %s failed: %s", kernel,                     \
                     cudaGetErrorString(launch_status_));                                         \
    } while (0)

static const int THREADS = 256;
static const unsigned MAX_BLOCKS = 8192;

// Enough blocks to cover n, capped: the grid-stride loops do the rest.
static unsigned blocks_for(size_t n) {
    size_t blocks = (n + THREADS - 1) / THREADS;
    return (unsigned)(blocks < 1 ? 1 : blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks);
}

// Each grid-stride kernel is a template on its index type, Index: uint32_t
// where the element count allows, size_t beyond, chosen by its launcher. Why:
// a GPU has no integer divide instruction, so i / cols and i % cols (a bias's
// row or column, an image's pixel) are a routine of about a dozen
// instructions in 32 bits and a much longer one in 64 (for sm_90, bias +
// ReLU's kernel is 88 instructions with 32-bit indices, 200 with 64). The
// kernels without a division gain little (a 64-bit counter takes two
// instructions to add or compare) but follow the same rule, to read alike.
// 32 bits are safe while n plus the whole grid's stride fits in them: the
// loop's last step, i += stride from some i < n, then cannot wrap around to a
// small i and start over. (The stride is at most MAX_BLOCKS x THREADS: every
// grid-stride launch takes blocks_for's grid.)
static bool force_64_bit_indices;  // tests only: gpu_force_64_bit_indices
static bool index_fits_32_bits(size_t n) {
    return !force_64_bit_indices && n <= UINT32_MAX - (size_t)MAX_BLOCKS * THREADS;
}

#define FOR_EACH_INDEX(Index, i, n) \
    for (Index i = (Index)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (Index)gridDim.x * blockDim.x)

// ------------------------------------------------------------------ elementwise

template <typename Index>
__global__ void fill_kernel(float *x, Index n, float value) {
    FOR_EACH_INDEX(Index, i, n) x[i] = value;
}

template <typename Index>
__global__ void scale_kernel(float *x, Index n, float factor) {
    FOR_EACH_INDEX(Index, i, n) x[i] *= factor;
}

// x *= *coef where *coef < 1 (the gradients' clip, its coefficient computed on the GPU).
template <typename Index>
__global__ void clip_scale_kernel(float *x, Index n, const float *coef) {
    const float c = *coef;
    if (c >= 1.0f) return;
    FOR_EACH_INDEX(Index, i, n) x[i] *= c;
}

// tensor.c's round_to_bfloat16 on the bits, kept as the upper 16: to nearest, ties to even; NaN kept.
__device__ static uint16_t bfloat16_bits(float x) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits |= 0x00400000u;
    else bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

template <typename Index>
__global__ void round_to_bfloat16_kernel(const float *x, Index n, uint16_t *out) {
    FOR_EACH_INDEX(Index, i, n) out[i] = bfloat16_bits(x[i]);
}

// A product's two operands in one launch: a's n_a values, then b's.
template <typename Index>
__global__ void round_two_to_bfloat16_kernel(const float *a, Index n_a, uint16_t *out_a, const float *b, Index n_b,
                                             uint16_t *out_b) {
    FOR_EACH_INDEX(Index, i, n_a + n_b) {
        if (i < n_a) out_a[i] = bfloat16_bits(a[i]);
        else out_b[i - n_a] = bfloat16_bits(b[i - n_a]);
    }
}

template <typename Index>
__global__ void divide_kernel(float *dst, const float *src, Index n, float divisor) {
    FOR_EACH_INDEX(Index, i, n) dst[i] = src[i] / divisor;
}

template <typename Index>
__global__ void bias_relu_kernel(float *y, const float *bias, Index n, int cols, int relu, uint16_t *rounded) {
    FOR_EACH_INDEX(Index, i, n) {
        float v = y[i] + bias[i % cols];
        v = relu ? (v <= 0.0f ? 0.0f : v) : v;  // a NaN passes, as torch.relu's (tensor_ops.c)
        y[i] = v;
        if (rounded) rounded[i] = bfloat16_bits(v);
    }
}

template <typename Index>
__global__ void relu_backward_kernel(const float *y, float *grad, Index n, uint16_t *rounded) {
    FOR_EACH_INDEX(Index, i, n) {
        float g = y[i] > 0.0f ? grad[i] : 0.0f;
        grad[i] = g;
        if (rounded) rounded[i] = bfloat16_bits(g);
    }
}

template <typename Index>
__global__ void mse_kernel(const float *output, const float *target, Index n, float *grad, float *diff) {
    FOR_EACH_INDEX(Index, i, n) {
        float d = output[i] - target[i];
        diff[i] = d;
        grad[i] = 2.0f * d / (float)n;
    }
}

// One value's Adam update (adam_update's order and roundings).
__device__ static void adam_value(float *param, const float *grad, float *m, float *v, size_t i, float step_size,
                                  float bias_correction2_sqrt, float one_minus_beta1, float beta2, float one_minus_beta2,
                                  float eps) {
    float g = grad[i];
    float m_i = m[i] + one_minus_beta1 * (g - m[i]);      // exp_avg.lerp_(grad, 1 - beta1)
    float v_i = v[i] * beta2 + one_minus_beta2 * (g * g);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
    float denom = sqrtf(v_i) / bias_correction2_sqrt + eps;
    param[i] = param[i] - step_size * (m_i / denom);       // param.addcdiv_(m, denom, -step_size)
    m[i] = m_i;
    v[i] = v_i;
}

template <typename Index>
__global__ void adam_kernel(float *param, const float *grad, float *m, float *v, Index n, float step_size,
                            float bias_correction2_sqrt, float one_minus_beta1, float beta2, float one_minus_beta2,
                            float eps) {
    FOR_EACH_INDEX(Index, i, n) {
        adam_value(param, grad, m, v, i, step_size, bias_correction2_sqrt, one_minus_beta1, beta2, one_minus_beta2, eps);
    }
}

// A launch over many tensors (a model's: gpu_adam_tensors, gpu_fill_spans) gives each SPAN_CHUNK
// values a block, tensor after tensor: a block finds its tensor as the last whose first block is at
// or before its own (a binary search over the tensors' table, the same loads in all its threads).
#define SPAN_CHUNK (8 * THREADS)
template <class Span> __device__ static int block_span(const Span *spans, int count) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (spans[mid].first_block <= (int)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Adam's update of a block's chunk with adam_value, a decaying tensor's value first scaled by `keep`
// as scale_kernel would (a product of its own, rounded: __fmul_rn, never fused into the update's
// FMA). The six coefficients are read from device memory (c, in AdamCoefficients' order): a CUDA
// graph's kernel, whose arguments are those of its capture, reads each step's there.
__global__ void adam_tensors_kernel(const AdamTensor *tensors, int count, const float *c, float keep) {
    const AdamTensor t = tensors[block_span(tensors, count)];
    const size_t begin = (size_t)(blockIdx.x - t.first_block) * SPAN_CHUNK;
    if (begin >= t.n) return;  // (a grid larger than the table's blocks: none past its last tensor)
    const unsigned values = (unsigned)(t.n - begin < SPAN_CHUNK ? t.n - begin : SPAN_CHUNK);
    float *param = t.param + begin, *m = t.exp_avg + begin, *v = t.exp_avg_sq + begin;
    const float *grad = t.grad + begin;
    const float step_size = c[0], bias_correction2_sqrt = c[1], one_minus_beta1 = c[2], beta2 = c[3];
    const float one_minus_beta2 = c[4], eps = c[5];
    for (unsigned i = threadIdx.x; i < values; i += blockDim.x) {
        if (t.decays) param[i] = __fmul_rn(param[i], keep);  // param.mul_(1 - lr * weight_decay)
        adam_value(param, grad, m, v, i, step_size, bias_correction2_sqrt, one_minus_beta1, beta2, one_minus_beta2, eps);
    }
}

__global__ void fill_spans_kernel(const FillSpan *spans, int count, float value) {
    const FillSpan span = spans[block_span(spans, count)];
    const size_t begin = (size_t)(blockIdx.x - span.first_block) * SPAN_CHUNK;
    if (begin >= span.n) return;  // (as in adam_tensors_kernel)
    const unsigned values = (unsigned)(span.n - begin < SPAN_CHUNK ? span.n - begin : SPAN_CHUNK);
    for (unsigned i = threadIdx.x; i < values; i += blockDim.x) span.data[begin + i] = value;
}

template <typename Index>
__global__ void sgd_kernel(float *param, const float *grad, Index n, float lr) {
    FOR_EACH_INDEX(Index, i, n) param[i] -= lr * grad[i];
}

template <typename Index>
__global__ void pixels_to_float_kernel(const uint8_t *pixels, Index n, float *out) {
    FOR_EACH_INDEX(Index, i, n) out[i] = (float)pixels[i] / 255.0f;
}

__global__ void gather_pixels_kernel(const uint8_t *images, const int *indices, int rows, int pixels, float *out) {
    // blockIdx.y walks the rows; blockIdx.x and the threads walk a row's pixels.
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const uint8_t *src = images + (size_t)indices[r] * pixels;
        float *dst = out + (size_t)r * pixels;
        for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < pixels; k += gridDim.x * blockDim.x)
            dst[k] = (float)src[k] / 255.0f;
    }
}

// The same, four pixels a thread, where a row's pixels come in fours and the pointers are aligned
// for it (MNIST's 784 = 196 x 4): a 4-byte load and a 16-byte store, a thread per quad of the batch.
// A thread per pixel loaded one byte, and its grid, a block row per image, left a quarter of its
// threads idle (784 of 1,024): 31 us of step 2's step on an H200 (ncu), 0.8 TB/s.
// Where asked, in the same pass: the pixels rounded to bfloat16 (`rounded`, an 8-byte store: what a
// bfloat16 product would round again at each product that reads the batch) and the batch's labels
// (the thread of a row's first quad), each of which was a launch of its own.
template <typename Index>
__global__ void gather_pixel_quads_kernel(const uchar4 *images, const int *labels, const int *indices, Index rows,
                                          Index quads, float4 *out, ushort4 *rounded, int *out_labels) {
    FOR_EACH_INDEX(Index, i, rows * quads) {
        const Index row = i / quads, quad = i % quads;
        const int sample = indices[row];
        const uchar4 p = images[(size_t)sample * quads + quad];
        const float4 v = float4{(float)p.x / 255.0f, (float)p.y / 255.0f, (float)p.z / 255.0f, (float)p.w / 255.0f};
        out[i] = v;
        if (rounded) rounded[i] = ushort4{bfloat16_bits(v.x), bfloat16_bits(v.y), bfloat16_bits(v.z), bfloat16_bits(v.w)};
        if (out_labels && quad == 0) out_labels[row] = labels[sample];
    }
}

// out[r] = values[indices[r]]: a batch's labels, gathered from the resident set. (n < 2^31:
// 32-bit indices always fit, index_fits_32_bits.)
__global__ void gather_ints_kernel(const int *values, const int *indices, uint32_t n, int *out) {
    FOR_EACH_INDEX(uint32_t, r, n) out[r] = values[indices[r]];
}

// *slot = weight * (float)(*sum / rows), or *slot + that: a step's mean loss (or a micro-batch's
// share of it) where it stays, on the GPU, with the host's operations in the host's order (no FMA).

// torch.nn.utils.clip_grad_norm_'s coefficient from the tensors' sums of squares, as the host
// computes it (adamw.c): their sum in order, in double; max_norm / (norm + 1e-6), norm rounded to float.
__global__ void clip_coef_kernel(const double *sums, int n, double max_norm, float *coef) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double total = 0.0;
    for (int i = 0; i < n; i++) total += sums[i];  // (no product here for nvcc to fuse: the host's bits)
    *coef = (float)(max_norm / ((double)(float)sqrt(total) + 1e-6));
}

// *total = x[0] + x[1] + ... in order, in double: a sum of per-tensor sums as the host's sum_in_order.
__global__ void sum_in_order_kernel(const double *x, int n, double *total) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += x[i];
    *total = sum;
}

// ------------------------------------------------------------------ a thread per row

__global__ void cross_entropy_kernel(const float *logits, const int *labels, int rows, int cols, float *grad,
                                     uint16_t *grad_rounded, float *row_loss) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *z = logits + (size_t)r * cols;
    float *g = grad + (size_t)r * cols;
    float max = z[0];
    for (int c = 1; c < cols; c++) max = z[c] > max ? z[c] : max;
    float sum = 0.0f;
    for (int c = 0; c < cols; c++) sum += expf(z[c] - max);
    float inv_batch = 1.0f / (float)rows;
    int label = labels[r];
    for (int c = 0; c < cols; c++) {  // softmax / B, less 1 / B at the label: two roundings (no fused multiply-add)
        float v = __fmul_rn(expf(z[c] - max) / sum, inv_batch);
        if (c == label) v = __fsub_rn(v, inv_batch);
        g[c] = v;
        if (grad_rounded) grad_rounded[(size_t)r * cols + c] = bfloat16_bits(v);
    }
    row_loss[r] = logf(sum) - (z[label] - max);  // log_softmax's order, as in tensor_ops.c
}

__global__ void argmax_kernel(const float *logits, int rows, int cols, int *prediction) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *z = logits + (size_t)r * cols;
    int best = 0;
    for (int c = 1; c < cols; c++) best = z[c] > z[best] ? c : best;
    prediction[r] = best;
}

// ------------------------------------------------------------------ one-block reduction

static const int SUM_THREADS = 1024;

// The block's sum of x[0..n) (or of its squares): thread t's running sum of x[t], x[t + 1024], ...,
// then a fixed tree over the threads. Deterministic: the same bits every run.
__device__ static double block_sum(const float *x, size_t n, int squares, double *partial) {
    double total = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) total += squares ? (double)x[i] * x[i] : (double)x[i];
    partial[threadIdx.x] = total;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    return partial[0];
}

__global__ void sum_kernel(const float *x, size_t n, int squares, double *result) {
    __shared__ double partial[SUM_THREADS];
    double total = block_sum(x, n, squares, partial);
    if (threadIdx.x == 0) *result = total;
}

// The rows' losses summed as sum_kernel sums them, then the step's loss into its slot:
// weight * (float)(sum / rows), added to the slot's value where it accumulates.
__global__ void loss_to_slot_kernel(const float *row_loss, int rows, float weight, int accumulate, float *slot) {
    __shared__ double partial[SUM_THREADS];
    double total = block_sum(row_loss, (size_t)rows, 0, partial);
    if (threadIdx.x != 0) return;
    float term = __fmul_rn(weight, (float)(total / rows));
    *slot = accumulate ? __fadd_rn(*slot, term) : term;
}

// Block i sums span i's squares, as sum_kernel would: the tensors side by side on the GPU's
// multiprocessors, where a launch per tensor took one multiprocessor at a time.
__global__ void sum_squares_each_kernel(const FloatSpan *spans, double *results) {
    __shared__ double partial[SUM_THREADS];
    const FloatSpan span = spans[blockIdx.x];
    double total = block_sum(span.data, span.n, 1, partial);
    if (threadIdx.x == 0) results[blockIdx.x] = total;
}

// ------------------------------------------------------------------ the CNN's operations

template <typename Index>  // indexes columns, the larger (x's index stays size_t: no division)
__global__ void im2col_kernel(const float *x, int channels, int batch, int height, int width, int kernel,
                              int padding, int out_h, int out_w, float *columns) {
    Index cols = (Index)batch * out_h * out_w, n = (Index)channels * kernel * kernel * cols;
    FOR_EACH_INDEX(Index, i, n) {
        int row = (int)(i / cols);
        Index col = i % cols;
        int b = (int)(col / ((Index)out_h * out_w)), pixel = (int)(col % ((Index)out_h * out_w));
        int c = row / (kernel * kernel), dy = row / kernel % kernel, dx = row % kernel;
        int in_y = pixel / out_w + dy - padding, in_x = pixel % out_w + dx - padding;
        columns[i] = in_y >= 0 && in_y < height && in_x >= 0 && in_x < width
                         ? x[(((size_t)c * batch + b) * height + in_y) * width + in_x]
                         : 0.0f;
    }
}

template <typename Index>  // indexes x; columns, k x k times larger, in size_t
__global__ void col2im_kernel(const float *columns, int channels, int batch, int height, int width, int kernel,
                              int padding, int out_h, int out_w, float *x) {
    size_t cols = (size_t)batch * out_h * out_w;
    Index n = (Index)channels * batch * height * width;
    FOR_EACH_INDEX(Index, i, n) {
        int in_x = (int)(i % width), in_y = (int)(i / width % height);
        int b = (int)(i / ((Index)width * height) % batch), c = (int)(i / ((Index)width * height * batch));
        float sum = 0.0f;
        for (int dy = 0; dy < kernel; dy++) {
            int y = in_y - dy + padding;
            if (y < 0 || y >= out_h) continue;
            for (int dx = 0; dx < kernel; dx++) {
                int x_ = in_x - dx + padding;
                if (x_ < 0 || x_ >= out_w) continue;
                int row = (c * kernel + dy) * kernel + dx;
                sum += columns[(size_t)row * cols + ((size_t)b * out_h + y) * out_w + x_];
            }
        }
        x[i] = sum;
    }
}

template <typename Index>
__global__ void add_row_bias_kernel(float *y, const float *bias, Index n, int cols, int relu) {
    FOR_EACH_INDEX(Index, i, n) {
        float v = y[i] + bias[i / cols];
        y[i] = relu ? (v <= 0.0f ? 0.0f : v) : v;  // a NaN passes, as torch.relu's (tensor_ops.c)
    }
}

// The sums of rows (a convolution's bias gradient: 32 or 64 rows of B x 784
// or B x 196 values) in two passes, so that a few long rows still fill the
// GPU: a block per row alone would be 32 or 64 blocks on 132 SMs. Pass 1 cuts
// each row into chunks and gives each chunk a block, which sums it in double
// in a fixed tree; pass 2 adds each row's chunk sums in chunk order. The
// chunks come from the row length alone, never from the GPU or a timing, so
// every run (and every GPU) adds the same numbers in the same order: the same
// bits, and no atomics. A row of one chunk takes pass 1 alone, straight into
// sums: one launch, as small rows need.
static const int ROW_SUM_THREADS = 256;
static const int ROW_SUM_CHUNK = 2048;     // values per chunk at least: 8 per thread, enough to be worth a block
static const int ROW_SUM_MAX_CHUNKS = 64;  // longer rows get longer chunks: pass 2 stays short

__global__ void row_chunk_sums_kernel(const float *x, int cols, int chunk_length, float *sums, double *partials) {
    __shared__ double partial[ROW_SUM_THREADS];
    int row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
    int begin = chunk * chunk_length;  // < cols: no chunk is empty (gpu_row_sum_chunks)
    int count = cols - begin < chunk_length ? cols - begin : chunk_length;  // the last chunk may be shorter
    const float *values = x + (size_t)row * cols + begin;
    double total = 0.0;
    for (int c = threadIdx.x; c < count; c += blockDim.x) total += values[c];
    partial[threadIdx.x] = total;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {  // a fixed tree: deterministic
        if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    if (chunks == 1) sums[row] = (float)((double)sums[row] + partial[0]);  // the whole row: done in one pass
    else partials[(size_t)chunk * gridDim.x + row] = partial[0];  // [chunks, rows]: pass 2's threads read side by side
}

__global__ void add_chunk_sums_kernel(const double *partials, int rows, int chunks, float *sums) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    double total = 0.0;
    for (int chunk = 0; chunk < chunks; chunk++) total += partials[(size_t)chunk * rows + row];  // in chunk order
    sums[row] = (float)((double)sums[row] + total);
}

template <typename Index>  // indexes y; x, size x size times larger, in size_t
__global__ void max_pool2d_kernel(const float *x, int planes, int height, int width, int size, float *y,
                                  int *argmax) {
    int out_h = height / size, out_w = width / size;
    Index n = (Index)planes * out_h * out_w;
    FOR_EACH_INDEX(Index, i, n) {
        int ox = (int)(i % out_w), oy = (int)(i / out_w % out_h);
        size_t plane = i / ((Index)out_w * out_h);
        const float *in = x + plane * height * width;
        int best = oy * size * width + ox * size;
        float best_value = -INFINITY;
        for (int dy = 0; dy < size; dy++)
            for (int dx = 0; dx < size; dx++) {
                int index = (oy * size + dy) * width + ox * size + dx;
                float value = in[index];
                if (value > best_value || isnan(value)) best_value = value, best = index;
            }
        y[i] = best_value;
        argmax[i] = (int)(plane * height * width + best);
    }
}

template <typename Index>
__global__ void max_pool2d_backward_kernel(const float *grad_y, const int *argmax, Index n, float *grad_x) {
    FOR_EACH_INDEX(Index, i, n) grad_x[argmax[i]] = grad_y[i];
}

template <typename Index>
__global__ void swap_outer_axes_kernel(const float *x, int a, int b, int inner, float *y) {
    Index n = (Index)a * b * inner;
    FOR_EACH_INDEX(Index, i, n) {  // i indexes y [b, a, inner]
        Index k = i % inner, ai = i / inner % a, bj = i / ((Index)inner * a);
        y[i] = x[(ai * b + bj) * inner + k];
    }
}

// ------------------------------------------------------------------ launchers

extern "C" {

void gpu_force_64_bit_indices(int force) { force_64_bit_indices = force != 0; }

void gpu_fill(float *x, size_t n, float value, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        fill_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(x, (uint32_t)n, value);
    else
        fill_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(x, n, value);
    CHECK_LAUNCH("fill_kernel");
}

void gpu_scale(float *x, size_t n, float factor, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        scale_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(x, (uint32_t)n, factor);
    else
        scale_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(x, n, factor);
    CHECK_LAUNCH("scale_kernel");
}

void gpu_sum_in_order(const double *x, int n, double *total, cudaStream_t stream) {
    sum_in_order_kernel<<<1, 1, 0, stream>>>(x, n, total);
    CHECK_LAUNCH("sum_in_order_kernel");
}

void gpu_clip_coef(const double *sums, int n, double max_norm, float *coef, cudaStream_t stream) {
    clip_coef_kernel<<<1, 1, 0, stream>>>(sums, n, max_norm, coef);
    CHECK_LAUNCH("clip_coef_kernel");
}

void gpu_round_to_bfloat16(const float *x, size_t n, uint16_t *out, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        round_to_bfloat16_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(x, (uint32_t)n, out);
    else
        round_to_bfloat16_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(x, n, out);
    CHECK_LAUNCH("round_to_bfloat16_kernel");
}

void gpu_round_two_to_bfloat16(const float *a, size_t n_a, uint16_t *out_a, const float *b, size_t n_b,
                               uint16_t *out_b, cudaStream_t stream) {
    const size_t n = n_a + n_b;
    if (n == 0) return;
    if (index_fits_32_bits(n))
        round_two_to_bfloat16_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(a, (uint32_t)n_a, out_a, b,
                                                                                       (uint32_t)n_b, out_b);
    else
        round_two_to_bfloat16_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(a, n_a, out_a, b, n_b, out_b);
    CHECK_LAUNCH("round_two_to_bfloat16_kernel");
}

void gpu_clip_scale(float *x, size_t n, const float *coef, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        clip_scale_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(x, (uint32_t)n, coef);
    else
        clip_scale_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(x, n, coef);
    CHECK_LAUNCH("clip_scale_kernel");
}

void gpu_divide(float *dst, const float *src, size_t n, float divisor, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        divide_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(dst, src, (uint32_t)n, divisor);
    else
        divide_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(dst, src, n, divisor);
    CHECK_LAUNCH("divide_kernel");
}

void gpu_bias_relu(float *y, const float *bias, int rows, int cols, int relu, uint16_t *rounded, cudaStream_t stream) {
    size_t n = (size_t)rows * cols;
    if (n == 0) return;
    if (index_fits_32_bits(n))
        bias_relu_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(y, bias, (uint32_t)n, cols, relu, rounded);
    else
        bias_relu_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(y, bias, n, cols, relu, rounded);
    CHECK_LAUNCH("bias_relu_kernel");
}

void gpu_relu_backward(const float *y, float *grad, size_t n, uint16_t *rounded, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        relu_backward_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(y, grad, (uint32_t)n, rounded);
    else
        relu_backward_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(y, grad, n, rounded);
    CHECK_LAUNCH("relu_backward_kernel");
}

void gpu_cross_entropy(const float *logits, const int *labels, int rows, int cols, float *grad, uint16_t *grad_rounded,
                       float *row_loss, cudaStream_t stream) {
    if (rows == 0) return;
    cross_entropy_kernel<<<(rows + THREADS - 1) / THREADS, THREADS, 0, stream>>>(logits, labels, rows, cols, grad,
                                                                                  grad_rounded, row_loss);
    CHECK_LAUNCH("cross_entropy_kernel");
}

void gpu_mse(const float *output, const float *target, size_t n, float *grad, float *diff, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        mse_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(output, target, (uint32_t)n, grad, diff);
    else
        mse_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(output, target, n, grad, diff);
    CHECK_LAUNCH("mse_kernel");
}

void gpu_sum(const float *x, size_t n, int squares, double *result, cudaStream_t stream) {
    sum_kernel<<<1, SUM_THREADS, 0, stream>>>(x, n, squares, result);
    CHECK_LAUNCH("sum_kernel");
}

void gpu_sum_squares_each(const FloatSpan *spans, int count, double *results, cudaStream_t stream) {
    if (count <= 0) return;
    sum_squares_each_kernel<<<(unsigned)count, SUM_THREADS, 0, stream>>>(spans, results);
    CHECK_LAUNCH("sum_squares_each_kernel");
}

void gpu_adam(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t n, float step_size,
              float bias_correction2_sqrt, float one_minus_beta1, float beta2, float one_minus_beta2, float eps,
              cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        adam_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, (uint32_t)n,
                                                                     step_size, bias_correction2_sqrt, one_minus_beta1,
                                                                     beta2, one_minus_beta2, eps);
    else
        adam_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, step_size,
                                                                   bias_correction2_sqrt, one_minus_beta1, beta2,
                                                                   one_minus_beta2, eps);
    CHECK_LAUNCH("adam_kernel");
}

size_t gpu_span_blocks(size_t n) { return (n + SPAN_CHUNK - 1) / SPAN_CHUNK; }

void gpu_adam_tensors(const AdamTensor *tensors, int count, int blocks, const float *coefficients, float keep,
                      cudaStream_t stream) {
    if (blocks == 0) return;
    adam_tensors_kernel<<<blocks, THREADS, 0, stream>>>(tensors, count, coefficients, keep);
    CHECK_LAUNCH("adam_tensors_kernel");
}

void gpu_fill_spans(const FillSpan *spans, int count, int blocks, float value, cudaStream_t stream) {
    if (blocks == 0) return;
    fill_spans_kernel<<<blocks, THREADS, 0, stream>>>(spans, count, value);
    CHECK_LAUNCH("fill_spans_kernel");
}

void gpu_sgd(float *param, const float *grad, size_t n, float lr, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        sgd_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(param, grad, (uint32_t)n, lr);
    else
        sgd_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(param, grad, n, lr);
    CHECK_LAUNCH("sgd_kernel");
}

void gpu_argmax(const float *logits, int rows, int cols, int *prediction, cudaStream_t stream) {
    if (rows == 0) return;
    argmax_kernel<<<(rows + THREADS - 1) / THREADS, THREADS, 0, stream>>>(logits, rows, cols, prediction);
    CHECK_LAUNCH("argmax_kernel");
}

void gpu_gather_batch(const uint8_t *images, const int *labels, const int *indices, int rows, int pixels, float *out,
                      uint16_t *rounded, int *out_labels, cudaStream_t stream) {
    if (rows == 0) return;
    if (pixels > 0 && pixels % 4 == 0 && (uintptr_t)images % alignof(uchar4) == 0 && (uintptr_t)out % alignof(float4) == 0 &&
        (uintptr_t)rounded % alignof(ushort4) == 0) {
        const size_t quads = (size_t)rows * (pixels / 4);
        if (index_fits_32_bits(quads))
            gather_pixel_quads_kernel<uint32_t><<<blocks_for(quads), THREADS, 0, stream>>>(
                (const uchar4 *)images, labels, indices, (uint32_t)rows, (uint32_t)(pixels / 4), (float4 *)out,
                (ushort4 *)rounded, out_labels);
        else
            gather_pixel_quads_kernel<size_t><<<blocks_for(quads), THREADS, 0, stream>>>(
                (const uchar4 *)images, labels, indices, (size_t)rows, (size_t)(pixels / 4), (float4 *)out,
                (ushort4 *)rounded, out_labels);
        CHECK_LAUNCH("gather_pixel_quads_kernel");
        return;
    }
    // Any other shape: the same values, a launch each.
    if (pixels > 0) {
        dim3 grid((unsigned)((pixels + THREADS - 1) / THREADS), (unsigned)(rows < 65535 ? rows : 65535));
        gather_pixels_kernel<<<grid, THREADS, 0, stream>>>(images, indices, rows, pixels, out);
        CHECK_LAUNCH("gather_pixels_kernel");
    }
    if (rounded) gpu_round_to_bfloat16(out, (size_t)rows * (size_t)pixels, rounded, stream);
    if (out_labels) gpu_gather_ints(labels, indices, rows, out_labels, stream);
}

void gpu_gather_ints(const int *values, const int *indices, int n, int *out, cudaStream_t stream) {
    if (n <= 0) return;
    gather_ints_kernel<<<blocks_for((size_t)n), THREADS, 0, stream>>>(values, indices, (uint32_t)n, out);
    CHECK_LAUNCH("gather_ints_kernel");
}

void gpu_loss_to_slot(const float *row_loss, int rows, float weight, int accumulate, float *slot, cudaStream_t stream) {
    loss_to_slot_kernel<<<1, SUM_THREADS, 0, stream>>>(row_loss, rows, weight, accumulate, slot);
    CHECK_LAUNCH("loss_to_slot_kernel");
}

void gpu_pixels_to_float(const uint8_t *pixels, size_t n, float *out, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        pixels_to_float_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(pixels, (uint32_t)n, out);
    else
        pixels_to_float_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(pixels, n, out);
    CHECK_LAUNCH("pixels_to_float_kernel");
}

void gpu_im2col(const float *x, int channels, int batch, int height, int width, int kernel, int padding,
                float *columns, cudaStream_t stream) {
    int out_h = height + 2 * padding - kernel + 1, out_w = width + 2 * padding - kernel + 1;
    size_t n = (size_t)channels * kernel * kernel * batch * out_h * out_w;
    if (n == 0) return;
    if (index_fits_32_bits(n))
        im2col_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(x, channels, batch, height, width, kernel,
                                                                       padding, out_h, out_w, columns);
    else
        im2col_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(x, channels, batch, height, width, kernel,
                                                                     padding, out_h, out_w, columns);
    CHECK_LAUNCH("im2col_kernel");
}

void gpu_col2im(const float *columns, int channels, int batch, int height, int width, int kernel, int padding,
                float *x, cudaStream_t stream) {
    int out_h = height + 2 * padding - kernel + 1, out_w = width + 2 * padding - kernel + 1;
    size_t n = (size_t)channels * batch * height * width;
    if (n == 0) return;
    if (index_fits_32_bits(n))
        col2im_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(columns, channels, batch, height, width, kernel,
                                                                       padding, out_h, out_w, x);
    else
        col2im_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(columns, channels, batch, height, width, kernel,
                                                                     padding, out_h, out_w, x);
    CHECK_LAUNCH("col2im_kernel");
}

void gpu_add_row_bias(float *y, const float *bias, int rows, int cols, int relu, cudaStream_t stream) {
    size_t n = (size_t)rows * cols;
    if (n == 0) return;
    if (index_fits_32_bits(n))
        add_row_bias_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(y, bias, (uint32_t)n, cols, relu);
    else
        add_row_bias_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(y, bias, n, cols, relu);
    CHECK_LAUNCH("add_row_bias_kernel");
}

// A row's chunks: ROW_SUM_CHUNK values each, or, for a row of more than
// ROW_SUM_MAX_CHUNKS of those, ROW_SUM_MAX_CHUNKS longer ones. The length comes
// first and the count is rounded up, so only the last chunk may be shorter,
// and none is empty.
static int row_sum_chunk_length(int cols) {
    int longer = (int)(((long long)cols + ROW_SUM_MAX_CHUNKS - 1) / ROW_SUM_MAX_CHUNKS);
    return longer > ROW_SUM_CHUNK ? longer : ROW_SUM_CHUNK;
}

int gpu_row_sum_chunks(int cols) {
    int length = row_sum_chunk_length(cols);
    int chunks = (int)(((long long)cols + length - 1) / length);
    return chunks < 1 ? 1 : chunks;  // cols = 0: one empty chunk, sums unchanged
}

void gpu_add_sum_of_rows(const float *x, int rows, int cols, double *partials, float *sums, cudaStream_t stream) {
    if (rows == 0) return;
    int chunks = gpu_row_sum_chunks(cols), chunk_length = row_sum_chunk_length(cols);
    if (chunks > 1 && !partials) fatal_at(__FILE__, __LINE__, 1, "gpu_add_sum_of_rows: %d chunks, no partials", chunks);
    row_chunk_sums_kernel<<<dim3((unsigned)rows, (unsigned)chunks), ROW_SUM_THREADS, 0, stream>>>(x, cols, chunk_length,
                                                                                                   sums, partials);
    CHECK_LAUNCH("row_chunk_sums_kernel");
    if (chunks == 1) return;
    add_chunk_sums_kernel<<<(rows + THREADS - 1) / THREADS, THREADS, 0, stream>>>(partials, rows, chunks, sums);
    CHECK_LAUNCH("add_chunk_sums_kernel");
}

void gpu_max_pool2d(const float *x, int planes, int height, int width, int size, float *y, int *argmax,
                    cudaStream_t stream) {
    size_t n = (size_t)planes * (height / size) * (width / size);
    if (n == 0) return;
    if (index_fits_32_bits(n))
        max_pool2d_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(x, planes, height, width, size, y, argmax);
    else
        max_pool2d_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(x, planes, height, width, size, y, argmax);
    CHECK_LAUNCH("max_pool2d_kernel");
}

void gpu_max_pool2d_backward(const float *grad_y, const int *argmax, size_t n, float *grad_x, cudaStream_t stream) {
    if (n == 0) return;
    if (index_fits_32_bits(n))
        max_pool2d_backward_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(grad_y, argmax, (uint32_t)n,
                                                                                    grad_x);
    else
        max_pool2d_backward_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(grad_y, argmax, n, grad_x);
    CHECK_LAUNCH("max_pool2d_backward_kernel");
}

void gpu_swap_outer_axes(const float *x, int a, int b, int inner, float *y, cudaStream_t stream) {
    size_t n = (size_t)a * b * inner;
    if (n == 0) return;
    if (index_fits_32_bits(n))
        swap_outer_axes_kernel<uint32_t><<<blocks_for(n), THREADS, 0, stream>>>(x, a, b, inner, y);
    else
        swap_outer_axes_kernel<size_t><<<blocks_for(n), THREADS, 0, stream>>>(x, a, b, inner, y);
    CHECK_LAUNCH("swap_outer_axes_kernel");
}

}  // extern "C"

// ------------------------------------------------------------------ step 15's embeddings (mf.c)
// The arithmetic of mf.c's CPU loops, operation for operation, with __fmul_rn
// and __fadd_rn where nvcc would fuse a * b + c into one FMA (the CPU build
// rounds twice: -ffp-contract=off): the same bits as the CPU. Every sum adds
// in a fixed order (a thread per output element, its terms in turn): no atomics.
//
// How many rows a batch touches is found on the GPU (gpu_sort_groups), and the
// host never reads it: a kernel that works on those rows takes the count in
// device memory, its grid covers the host's bound n_max, and its threads past
// the count do nothing.
__device__ static int counted(const int *count, int n_max) {
    if (!count) return n_max;
    const int n = *count;
    return n < n_max ? n : n_max;
}

// The bits of a position p < n (0 for n <= 1): the host's count and the sort kernel's.
__host__ __device__ static int bits_below(int n) {
    int bits = 0;
    while ((1L << bits) < n) bits++;
    return bits;
}

// Exclusive prefix sum over the block of each thread's `value`, and the block's total: Hillis and
// Steele's scan in shared memory, log2(blockDim.x) rounds, for blocks of up to SORT_MAX_THREADS (a
// power of two); every thread of the block calls it.
#define SORT_THREADS 256
#define SORT_MAX_THREADS 1024
__device__ static int block_exclusive_scan(int value, int *total) {
    __shared__ int scan[2][SORT_MAX_THREADS];
    const int t = threadIdx.x, threads = blockDim.x;
    int in = 0;
    __syncthreads();  // the last call's readers are done with `scan`
    scan[0][t] = value;
    __syncthreads();
    for (int offset = 1; offset < threads; offset *= 2) {
        scan[1 - in][t] = scan[in][t] + (t >= offset ? scan[in][t - offset] : 0);
        in = 1 - in;
        __syncthreads();
    }
    *total = scan[in][threads - 1];
    return scan[in][t] - value;
}

// One block. The valid entries (p < *n_valid, keys[p] >= 0) compacted in order, then sorted by key
// with a least-significant-digit radix sort, RADIX_BITS bits a pass (each pass a stable counting
// sort: the entries of each digit in their order), so entries of one key keep their order p; then
// a group per key. Each thread owns a contiguous chunk of entries; a pass counts each chunk's
// digits, and one scan of those counts, digit-major (digit d's count in thread t's chunk at
// d * SORT_THREADS + t), says where each chunk writes each digit: the result is the same whatever
// the thread count or the GPU's timing.
#define RADIX_BITS 4
#define RADIX (1 << RADIX_BITS)
__global__ void sort_groups_kernel(const int *keys, const int *const *keys_at, int n, const int *n_valid, int key_bits,
                                   int block, int block_stride, int *key_a, int *pos_a, int *key_b, int *pos_b,
                                   int *order, int *n_groups, int *group_key, int *group_start, int *group_of) {
    __shared__ int digit_counts[RADIX * SORT_THREADS];
    if (keys_at) keys = *keys_at;
    const int t = threadIdx.x, limit = counted(n_valid, n);
    int chunk = (n + SORT_THREADS - 1) / SORT_THREADS;
    int lo = t * chunk < n ? t * chunk : n, hi = lo + chunk < n ? lo + chunk : n;
    int mine = 0;
    for (int p = lo; p < hi; p++) mine += p < limit && keys[p] >= 0;
    int m, at = block_exclusive_scan(mine, &m);
    for (int p = lo; p < hi; p++)
        if (p < limit && keys[p] >= 0) key_a[at] = keys[p], pos_a[at] = p, at++;
    chunk = (m + SORT_THREADS - 1) / SORT_THREADS;
    lo = t * chunk < m ? t * chunk : m, hi = lo + chunk < m ? lo + chunk : m;
    for (int shift = 0; shift < key_bits; shift += RADIX_BITS) {
        __syncthreads();  // the last pass's writes are in, and its reads of digit_counts done
        int count[RADIX];
        for (int d = 0; d < RADIX; d++) count[d] = 0;
        for (int k = lo; k < hi; k++) count[(key_a[k] >> shift) & (RADIX - 1)]++;
        for (int d = 0; d < RADIX; d++) digit_counts[d * SORT_THREADS + t] = count[d];
        __syncthreads();
        // The exclusive scan of digit_counts: thread t owns its RADIX consecutive entries.
        int own = 0;
        for (int i = 0; i < RADIX; i++) own += digit_counts[RADIX * t + i];
        int all, before = block_exclusive_scan(own, &all);
        for (int i = 0; i < RADIX; i++) {
            const int value = digit_counts[RADIX * t + i];
            digit_counts[RADIX * t + i] = before;
            before += value;
        }
        __syncthreads();
        for (int d = 0; d < RADIX; d++) count[d] = digit_counts[d * SORT_THREADS + t];  // where this chunk's digit d goes
        for (int k = lo; k < hi; k++) {
            const int key = key_a[k], to = count[(key >> shift) & (RADIX - 1)]++;
            key_b[to] = key, pos_b[to] = pos_a[k];
        }
        int *swap = key_a;
        key_a = key_b, key_b = swap;
        swap = pos_a, pos_a = pos_b, pos_b = swap;
    }
    __syncthreads();
    int starts = 0;
    for (int k = lo; k < hi; k++) starts += k == 0 || key_a[k] != key_a[k - 1];
    int groups, g = block_exclusive_scan(starts, &groups) - 1;  // the group of the entry before lo
    for (int k = lo; k < hi; k++) {
        if (k == 0 || key_a[k] != key_a[k - 1]) {
            g++;
            group_key[g] = key_a[k], group_start[g] = k;
        }
        const int p = pos_a[k];
        group_of[p] = g;
        order[k] = p / block * block_stride + p % block;
    }
    if (t == 0) *n_groups = groups, group_start[groups] = m;
}

// gpu_sort_groups for a batch's sizes (n <= SORT_SMALL_MAX, a key and a position in 31 bits), in
// two launches. Entry p is one word, key << position_bits | p if it is valid, INVALID | p (above
// every valid word) if not: the words are distinct and their order is (key, p)'s, so sorting them
// sorts the valid entries stably, the invalid ones after them. A word's place is the number of
// words below it, which sort_rank_kernel counts, a word by RANK_SPLIT threads, each over every
// RANK_SPLIT-th word (n / 8 compares, reads of shared memory that the warp's threads share), on as
// many blocks as a batch has words by RANK_ENTRIES: 64 multiprocessors a sort for a batch of 1,024
// (a batch's two sorts take 128 of an H100's 132). Then
// sort_groups_of_sorted_kernel, a block per sort, finds the groups of the sorted words with one
// scan, as sort_groups_kernel does. The sort they replace ranked by merging in one block of 1,024
// threads, ten rounds of binary searches, whose instructions one multiprocessor issued: 10 us of
// step 15's step on an H200 (ncu), its longest kernel. Each word's place depends on the keys alone:
// the same result whatever the GPU's timing.
#define SORT_SMALL_THREADS 1024
#define SORT_SMALL_MAX 4096  // words of 4 bytes in shared memory: 16 KiB, and the scan's 8 KiB
#define RANK_THREADS 128     // sort_rank_kernel's blocks: a warp on each of a multiprocessor's 4 schedulers
#define RANK_SPLIT 8         // threads counting the words below one word
#define RANK_ENTRIES (RANK_THREADS / RANK_SPLIT)
#define SORT_INVALID (1u << 31)
// The sorts of one launch, a row of blocks each (blockIdx.y, or blockIdx.x where a block does one):
// the batch's users and movies at once.
struct SmallSorts {
    SortGroups job[2];
};

__device__ static const int *sort_keys(const SortGroups &sort) { return sort.keys_at ? *sort.keys_at : sort.keys; }

// Each block: the words of the entries blockIdx.x * RANK_ENTRIES .. (RANK_ENTRIES of them) placed
// in the sort's scratch, sorted[place] = word.
__global__ void sort_rank_kernel(SmallSorts jobs) {
    const SortGroups &sort = jobs.job[blockIdx.y];
    const int n = sort.n, first = blockIdx.x * RANK_ENTRIES;
    if (first >= n) return;  // (the whole block: a shorter sort than the launch's longest)
    const int *keys = sort_keys(sort), limit = counted(sort.n_valid, n), position_bits = bits_below(n);
    __shared__ unsigned words[SORT_SMALL_MAX];
    __shared__ int below_part[RANK_THREADS];
    const int t = threadIdx.x;
    for (int p = t; p < n; p += RANK_THREADS) {
        const int key = keys[p];  // (read whatever its validity: the loads of a thread's words then go together)
        words[p] = (p < limit && key >= 0 ? (unsigned)key << position_bits : SORT_INVALID) | (unsigned)p;
    }
    __syncthreads();
    // Thread t counts, for entry e, the words q = part, part + RANK_SPLIT, ... below it: the
    // RANK_SPLIT threads of an entry read adjacent words, in different banks.
    const int e = first + t / RANK_SPLIT, part = t % RANK_SPLIT;
    int below = 0;
    if (e < n) {
        const unsigned mine = words[e];
        for (int q = part; q < n; q += RANK_SPLIT) below += words[q] < mine;
    }
    below_part[t] = below;
    __syncthreads();
    if (part == 0 && e < n) {
        int place = 0;
        for (int k = 0; k < RANK_SPLIT; k++) place += below_part[t + k];
        ((unsigned *)sort.scratch)[place] = words[e];
    }
}

// A block per sort: the groups of the words sort_rank_kernel sorted into its scratch.
__global__ void sort_groups_of_sorted_kernel(SmallSorts jobs) {
    const SortGroups &sort = jobs.job[blockIdx.x];
    const int n = sort.n, block = sort.block, block_stride = sort.block_stride, position_bits = bits_below(n);
    int *order = sort.order, *n_groups = sort.n_groups, *group_key = sort.group_key, *group_start = sort.group_start;
    int *group_of = sort.group_of;
    __shared__ unsigned sorted[SORT_SMALL_MAX];
    __shared__ int valid;  // the valid entries: the first invalid word's place
    const int t = threadIdx.x;
    if (t == 0) valid = 0;
    for (int k = t; k < n; k += SORT_SMALL_THREADS) sorted[k] = ((const unsigned *)sort.scratch)[k];
    __syncthreads();
    for (int k = t; k < n; k += SORT_SMALL_THREADS)
        if (sorted[k] < SORT_INVALID && (k + 1 == n || sorted[k + 1] >= SORT_INVALID)) valid = k + 1;
    __syncthreads();
    // The groups: each thread a contiguous chunk of the sorted entries, its starts numbered by a scan.
    const int m = valid, chunk = (m + SORT_SMALL_THREADS - 1) / SORT_SMALL_THREADS;
    const int lo = t * chunk < m ? t * chunk : m, hi = lo + chunk < m ? lo + chunk : m;
    int starts = 0;
    for (int k = lo; k < hi; k++) starts += k == 0 || (sorted[k] ^ sorted[k - 1]) >> position_bits != 0;
    int groups, g = block_exclusive_scan(starts, &groups) - 1;  // the group of the entry before lo
    for (int k = lo; k < hi; k++) {
        const int key = (int)(sorted[k] >> position_bits), p = (int)(sorted[k] & ((1u << position_bits) - 1));
        if (k == 0 || (sorted[k] ^ sorted[k - 1]) >> position_bits != 0) {
            g++;
            group_key[g] = key, group_start[g] = k;
        }
        group_of[p] = g;
        order[k] = p / block * block_stride + p % block;
    }
    if (t == 0) *n_groups = groups, group_start[groups] = m;
}

// Step 15's tables pass through one launch of each kind of kernel, a row of blocks per table
// (blockIdx.y), each table's pointers and sizes in a job of the kernel's arguments: one launch where
// there were four, in a step made of small kernels, which their launches bound.
struct EmbeddingGrads {
    EmbeddingGrad job[MF_TABLES];
};
struct SparseAdamTables {
    SparseAdamRows job[MF_TABLES];
};

__global__ void copy_rows_kernel(const float *src, const int *src_index, float *dst, const int *dst_index,
                                 float *dst_flags, const int *count, int n_max, int dim) {
    const size_t total = (size_t)counted(count, n_max) * dim;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / dim, d = i % dim;
        const size_t from = src_index ? (size_t)src_index[j] : j, to = dst_index ? (size_t)dst_index[j] : j;
        dst[to * dim + d] = src[from * dim + d];
        if (dst_flags && d == 0) dst_flags[to] = 1.0f;
    }
}

__global__ void keyed_rows_kernel(const float *table, const int *keys, int n, int dim, float *out) {
    const size_t total = (size_t)n * dim;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int key = keys[i / dim];
        out[i] = key >= 0 ? table[(size_t)key * dim + i % dim] : 0.0f;
    }
}

__global__ void pack_ids_kernel(const int *ids, const int *count, int n_max, int *out) {
    const int n = counted(count, n_max);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= n; i += gridDim.x * blockDim.x) out[i] = i == 0 ? n : ids[i - 1];
}

__global__ void block_keys_kernel(const int *blocks, int n_blocks, int block_ints, int per_block, int *keys) {
    const int total = n_blocks * per_block;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < total; p += gridDim.x * blockDim.x) {
        const int *ids = blocks + (size_t)(p / per_block) * block_ints, i = p % per_block;
        keys[p] = i < ids[0] ? ids[1 + i] : -1;
    }
}

__global__ void owner_keys_kernel(const int *rows, const int *count, int n_max, int world, int *keys) {
    const int n = counted(count, n_max);
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n_max; j += gridDim.x * blockDim.x)
        keys[j] = j < n ? rows[j] % world : -1;
}

__global__ void ask_owners_kernel(const int *rows, const int *count, int n_max, int world, const int *order,
                                  const int *n_groups, const int *group_key, const int *group_start, const int *group_of,
                                  int per_owner, int *send_ids, int *place) {
    const int n = counted(count, n_max), span = n_max > world ? n_max : world;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < span; i += gridDim.x * blockDim.x) {
        if (i < n) {  // the i-th touched row in owner order: its place in the owner's block
            const int j = order[i], owner = rows[j] % world, k = i - group_start[group_of[j]];
            place[i] = owner * per_owner + k;
            send_ids[(size_t)owner * (per_owner + 1) + 1 + k] = rows[j] / world;
        }
        if (i < world) {  // owner i's count: its group's size, or 0
            int asked = 0;
            for (int g = 0; g < *n_groups; g++)
                if (group_key[g] == i) asked = group_start[g + 1] - group_start[g];
            send_ids[(size_t)i * (per_owner + 1)] = asked;
        }
    }
}

// A row's terms (its samples in the batch, its blocks from the ranks) are summed in order by one
// thread, ROW_TERMS at a time: first the terms' indices, then what they index, each round's loads
// issued together, then the terms added in order (the CPU's bits). Past the row's end a round loads
// its last term again, which is not added: no branch between the loads. Loaded term by term, the sum
// of a popular row waited on memory two or three times a term: the most rated movie of a batch of
// 1,024 skewed ratings (--synthetic) has ~45 of them, and its thread set the kernel's time. At 8
// terms a round it still waited 6 rounds of three dependent loads: step 15's backward took 10 us of
// a 43 us step on an H200 (ncu, caches kept); at 16 it takes 5.8 us.
#define ROW_TERMS 16

__global__ void sum_rows_kernel(const float *rows, const int *start, const int *source, const int *count, int n_max,
                                int dim, float *out) {
    const size_t total = (size_t)counted(count, n_max) * dim;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t j = i / dim, d = i % dim;
        const int end = start[j + 1];
        float sum = 0.0f;
        for (int k = start[j]; k < end; k += ROW_TERMS) {
            int from[ROW_TERMS];
            float term[ROW_TERMS];
            for (int t = 0; t < ROW_TERMS; t++) from[t] = source[k + t < end ? k + t : end - 1];
            for (int t = 0; t < ROW_TERMS; t++) term[t] = rows[(size_t)from[t] * dim + d];
            for (int t = 0; t < ROW_TERMS; t++) sum = k + t < end ? __fadd_rn(sum, term[t]) : sum;
        }
        out[i] = sum;
    }
}

#define MF_SAMPLE_THREADS 32  // gpu_mf_forward's blocks: a warp each
__global__ void mf_forward_kernel(const float *p_rows, const int *p_slot, const float *q_rows, const int *q_slot,
                                  const float *user_bias, const int *user_slot, const float *item_bias,
                                  const int *item_slot, MfSamples b, int n, int dim, float mean, float *out) {
    const int *user = b.take ? b.take->user : b.user, *item = b.take ? b.take->item : b.item;
    const float *rating = b.take ? b.take->rating : b.rating;
    for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n; s += gridDim.x * blockDim.x) {
        const int u = user[s], i = item[s];
        if (b.take) {  // the step's copy, for its backward
            b.user[s] = u, b.item[s] = i;
            if (b.rating) b.rating[s] = rating[s];
        }
        const float *p = p_rows + (size_t)(p_slot ? p_slot[s] : u) * dim, *q = q_rows + (size_t)(q_slot ? q_slot[s] : i) * dim;
        float dot = 0.0f, p_norm = 0.0f, q_norm = 0.0f;
        for (int d = 0; d < dim; d++) {
            dot = __fadd_rn(dot, __fmul_rn(p[d], q[d]));
            p_norm = __fadd_rn(p_norm, __fmul_rn(p[d], p[d]));
            q_norm = __fadd_rn(q_norm, __fmul_rn(q[d], q[d]));
        }
        const float bias_u = user_bias[user_slot ? user_slot[s] : u], bias_i = item_bias[item_slot ? item_slot[s] : i];
        float prediction = __fadd_rn(__fadd_rn(__fadd_rn(dot, bias_u), bias_i), mean);
        out[4 * (size_t)s] = prediction;
        out[4 * (size_t)s + 1] = rating ? prediction - rating[s] : 0.0f;
        out[4 * (size_t)s + 2] = p_norm;
        out[4 * (size_t)s + 3] = q_norm;
    }
}

// The CPU's sum in double, sample after sample (__dadd_rn, __dmul_rn: no FMA). One block: each
// sample's term computed by a thread of its own, a chunk of MF_LOSS_THREADS samples at a time, then
// added by thread 0 in the samples' order: the one thread's sequential sum of before, with the
// same bits, that no longer waits for memory at every sample. A default batch (1,024) is one chunk:
// its terms loaded in one round, where chunks of 256 waited four times (on an H200: 7.1 us, not 8.1).
#define MF_LOSS_THREADS 1024
__global__ void mf_loss_kernel(const float *forward, int n, float weight_decay, double global_n, double *const *loss_at) {
    __shared__ double terms[MF_LOSS_THREADS];
    const int t = threadIdx.x;
    double sum = 0.0;  // (thread 0's)
    for (int base = 0; base < n; base += MF_LOSS_THREADS) {
        const int s = base + t;
        if (s < n) {
            const double error = forward[4 * (size_t)s + 1];
            const double norms = __dadd_rn((double)forward[4 * (size_t)s + 2], (double)forward[4 * (size_t)s + 3]);
            terms[t] = __dadd_rn(__dmul_rn(error, error), __dmul_rn((double)weight_decay, norms));
        }
        __syncthreads();
        if (t == 0) {
            const int chunk = n - base < MF_LOSS_THREADS ? n - base : MF_LOSS_THREADS;
            for (int k = 0; k < chunk; k++) sum = __dadd_rn(sum, terms[k]);
        }
        __syncthreads();  // thread 0 is done with the chunk before it is written again
    }
    if (t == 0) **loss_at = __ddiv_rn(sum, global_n);
}

// A row's gradient: its samples' terms added in the batch's order (mf.c's backward on the CPU),
// ROW_TERMS at a time as in sum_rows_kernel; a table a row of blocks.
__global__ void embedding_backward_kernel(const float *forward, float scale, float decay, EmbeddingGrads jobs) {
    const EmbeddingGrad e = jobs.job[blockIdx.y];
    const int dim = e.dim;
    const size_t total = (size_t)counted(e.count, e.n_max) * dim;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t j = i / dim, d = i % dim;
        const int end = e.start[j + 1];
        const size_t self_at = (e.self_row ? (size_t)e.self_row[j] : j) * dim + d;
        const float own = e.self ? __fmul_rn(decay, e.self[self_at]) : 0.0f;  // the weight decay's term, the same for each sample
        float sum = 0.0f;
        for (int k = e.start[j]; k < end; k += ROW_TERMS) {
            int s[ROW_TERMS], slot[ROW_TERMS];
            float error[ROW_TERMS], o[ROW_TERMS];
            for (int t = 0; t < ROW_TERMS; t++) s[t] = e.sample[k + t < end ? k + t : end - 1];
            for (int t = 0; t < ROW_TERMS; t++) error[t] = forward[4 * (size_t)s[t] + 1];
            if (e.self) {  // the other table's row of each sample
                for (int t = 0; t < ROW_TERMS; t++) slot[t] = e.other_slot[s[t]];
                for (int t = 0; t < ROW_TERMS; t++) o[t] = e.other[(size_t)slot[t] * dim + d];
            }
            for (int t = 0; t < ROW_TERMS; t++) {
                const float g = __fmul_rn(scale, error[t]);
                const float term = e.self ? __fadd_rn(__fmul_rn(g, o[t]), own) : g;
                sum = k + t < end ? __fadd_rn(sum, term) : sum;
            }
        }
        e.grad[i] = sum;
    }
}

__global__ void sparse_adam_kernel(SparseAdamTables jobs, const MfStepInputs *inputs, float one_minus_beta1,
                                   float one_minus_beta2, float eps) {
    const SparseAdamRows a = jobs.job[blockIdx.y];
    const int dim = a.dim;
    const size_t total = (size_t)counted(a.count, a.n_max) * dim;
    const float minus_step_size = inputs->minus_step_size;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        if (a.flags && a.flags[i / dim] == 0.0f) continue;  // (dense) a row no rank touched
        size_t at = (a.rows ? (size_t)a.rows[i / dim] : i / dim) * dim + i % dim;
        float g = a.grad[i], m_old = a.exp_avg[at], v_old = a.exp_avg_sq[at];
        float m_update = __fmul_rn(g - m_old, one_minus_beta1);
        a.exp_avg[at] = m_old + m_update;
        float v_update = __fmul_rn(__fmul_rn(g, g) - v_old, one_minus_beta2);
        a.exp_avg_sq[at] = v_old + v_update;
        float numerator = m_update + m_old, denominator = __fadd_rn(__fsqrt_rn(v_update + v_old), eps);
        a.weight[at] = __fadd_rn(a.weight[at], __fmul_rn(minus_step_size, __fdiv_rn(numerator, denominator)));
    }
}

// A launch's jobs (Jobs: a kernel's argument, `job[MF_TABLES]`) from n tables, and its grid, a row
// of blocks per table for at most max(n_max x dim) elements; false where there are none.
template <class Jobs, class Job> static bool table_jobs(const Job *tables, int n, Jobs *jobs, dim3 *grid) {
    if (n < 1 || n > MF_TABLES)
        fatal_at(__FILE__, __LINE__, 1, "step 15's kernels: %d tables in one launch (1 to %d)", n, (int)MF_TABLES);
    *jobs = Jobs{};
    size_t most = 0;
    for (int t = 0; t < n; t++) {
        if (tables[t].n_max < 0 || tables[t].dim < 1)  // (the kernels' counted() would take a negative bound as huge)
            fatal_at(__FILE__, __LINE__, 1, "step 15's kernels: table %d of %d rows of %d", t, tables[t].n_max,
                     tables[t].dim);
        size_t elements = (size_t)tables[t].n_max * tables[t].dim;
        most = elements > most ? elements : most;
        jobs->job[t] = tables[t];
    }
    *grid = dim3(blocks_for(most), (unsigned)n);
    return most > 0;
}

// gpu_sort_groups' pick: the sort in shared memory (sort_rank_kernel and the groups), where it fits.
static bool sort_is_small(const SortGroups *sort) {
    return sort->n <= SORT_SMALL_MAX && sort->key_bits + bits_below(sort->n) <= 31;
}

void gpu_sort_groups(const SortGroups *sorts, int n_sorts, cudaStream_t stream) {
    if (n_sorts < 1 || n_sorts > 2) fatal_at(__FILE__, __LINE__, 1, "gpu_sort_groups: %d sorts (1 or 2)", n_sorts);
    SmallSorts small = {};
    int n_small = 0;
    for (int i = 0; i < n_sorts; i++) {
        // Launched even for n == 0: *n_groups must say 0.
        SortGroups sort = sorts[i];
        if (sort.block <= 0) sort.block = sort.block_stride = 1;
        if (sort_is_small(&sort)) {
            small.job[n_small++] = sort;
            continue;
        }
        // Too many entries for shared memory, or keys too wide to share a word with their position:
        // the radix sort, in global memory.
        const int n = sort.n;
        size_t quarter = (size_t)(n > 0 ? n : 1);
        sort_groups_kernel<<<1, SORT_THREADS, 0, stream>>>(sort.keys, sort.keys_at, n, sort.n_valid, sort.key_bits, sort.block,
                                                           sort.block_stride, sort.scratch, sort.scratch + quarter,
                                                           sort.scratch + 2 * quarter, sort.scratch + 3 * quarter,
                                                           sort.order, sort.n_groups, sort.group_key, sort.group_start,
                                                           sort.group_of);
        CHECK_LAUNCH("sort_groups_kernel");
    }
    if (n_small == 0) return;
    int most = 0;  // the longest sort's entries, and blocks of RANK_ENTRIES for them (at least one)
    for (int i = 0; i < n_small; i++) most = small.job[i].n > most ? small.job[i].n : most;
    sort_rank_kernel<<<dim3((unsigned)((most + RANK_ENTRIES - 1) / RANK_ENTRIES) + (most == 0), (unsigned)n_small),
                       RANK_THREADS, 0, stream>>>(small);
    CHECK_LAUNCH("sort_rank_kernel");
    sort_groups_of_sorted_kernel<<<n_small, SORT_SMALL_THREADS, 0, stream>>>(small);
    CHECK_LAUNCH("sort_groups_of_sorted_kernel");
}

void gpu_copy_rows(const float *src, const int *src_index, float *dst, const int *dst_index, float *dst_flags,
                   const int *count, int n_max, int dim, cudaStream_t stream) {
    if (n_max < 0 || dim < 1) fatal_at(__FILE__, __LINE__, 1, "gpu_copy_rows: %d rows of %d", n_max, dim);
    if (n_max == 0) return;
    copy_rows_kernel<<<blocks_for((size_t)n_max * dim), THREADS, 0, stream>>>(src, src_index, dst, dst_index,
                                                                               dst_flags, count, n_max, dim);
    CHECK_LAUNCH("copy_rows_kernel");
}

void gpu_keyed_rows(const float *table, const int *keys, int n, int dim, float *out, cudaStream_t stream) {
    if (n <= 0) return;
    keyed_rows_kernel<<<blocks_for((size_t)n * dim), THREADS, 0, stream>>>(table, keys, n, dim, out);
    CHECK_LAUNCH("keyed_rows_kernel");
}

void gpu_pack_ids(const int *ids, const int *count, int n_max, int *out, cudaStream_t stream) {
    pack_ids_kernel<<<blocks_for((size_t)n_max + 1), THREADS, 0, stream>>>(ids, count, n_max, out);
    CHECK_LAUNCH("pack_ids_kernel");
}

void gpu_block_keys(const int *blocks, int n_blocks, int block_ints, int per_block, int *keys, cudaStream_t stream) {
    if (n_blocks * per_block <= 0) return;
    block_keys_kernel<<<blocks_for((size_t)n_blocks * per_block), THREADS, 0, stream>>>(blocks, n_blocks, block_ints,
                                                                                        per_block, keys);
    CHECK_LAUNCH("block_keys_kernel");
}

void gpu_owner_keys(const int *rows, const int *count, int n_max, int world, int *keys, cudaStream_t stream) {
    if (n_max <= 0) return;
    owner_keys_kernel<<<blocks_for((size_t)n_max), THREADS, 0, stream>>>(rows, count, n_max, world, keys);
    CHECK_LAUNCH("owner_keys_kernel");
}

void gpu_ask_owners(const int *rows, const int *count, int n_max, int world, const int *order, const int *n_groups,
                    const int *group_key, const int *group_start, const int *group_of, int per_owner, int *send_ids,
                    int *place, cudaStream_t stream) {
    size_t span = (size_t)(n_max > world ? n_max : world);
    ask_owners_kernel<<<blocks_for(span), THREADS, 0, stream>>>(rows, count, n_max, world, order, n_groups, group_key,
                                                                group_start, group_of, per_owner, send_ids, place);
    CHECK_LAUNCH("ask_owners_kernel");
}

void gpu_sum_rows(const float *rows, const int *start, const int *source, const int *count, int n_max, int dim,
                  float *out, cudaStream_t stream) {
    if (n_max <= 0) return;
    sum_rows_kernel<<<blocks_for((size_t)n_max * dim), THREADS, 0, stream>>>(rows, start, source, count, n_max, dim, out);
    CHECK_LAUNCH("sum_rows_kernel");
}

void gpu_mf_forward(const float *p_rows, const int *p_slot, const float *q_rows, const int *q_slot,
                    const float *user_bias, const int *user_slot, const float *item_bias, const int *item_slot,
                    MfSamples samples, int n, int dim, float mean, float *out, cudaStream_t stream) {
    if (n <= 0) return;
    // Blocks of one warp: a batch of 1,024 samples on 32 multiprocessors, not 4 (THREADS a block).
    // Each thread reads two rows of its own, 32 rows a warp per load, which an SM's path to L2
    // serves in turn: on 4 of them the forward took 11 us of a step's 43 on an H200 (ncu, caches
    // kept), on 32 it takes 5.7 us.
    const unsigned blocks = (unsigned)((n + MF_SAMPLE_THREADS - 1) / MF_SAMPLE_THREADS);
    mf_forward_kernel<<<blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS, MF_SAMPLE_THREADS, 0, stream>>>(
        p_rows, p_slot, q_rows, q_slot, user_bias, user_slot, item_bias, item_slot, samples, n, dim, mean, out);
    CHECK_LAUNCH("mf_forward_kernel");
}

__global__ void mf_take_step_inputs_kernel(MfQueuedInputs *queued, MfStepInputs *current) {
    if (queued->next < queued->count) *current = queued->entry[queued->next++];
}

void gpu_mf_take_step_inputs(MfQueuedInputs *queued, MfStepInputs *current, cudaStream_t stream) {
    mf_take_step_inputs_kernel<<<1, 1, 0, stream>>>(queued, current);
    CHECK_LAUNCH("mf_take_step_inputs_kernel");
}

void gpu_mf_loss(const float *forward, int n, float weight_decay, double global_n, double *const *loss_at,
                 cudaStream_t stream) {
    mf_loss_kernel<<<1, MF_LOSS_THREADS, 0, stream>>>(forward, n, weight_decay, global_n, loss_at);
    CHECK_LAUNCH("mf_loss_kernel");
}

void gpu_embedding_backward(const float *forward, float scale, float decay, const EmbeddingGrad *tables, int n,
                            cudaStream_t stream) {
    EmbeddingGrads jobs;
    dim3 grid;
    if (!table_jobs(tables, n, &jobs, &grid)) return;
    embedding_backward_kernel<<<grid, THREADS, 0, stream>>>(forward, scale, decay, jobs);
    CHECK_LAUNCH("embedding_backward_kernel");
}

void gpu_sparse_adam(const SparseAdamRows *tables, int n, const MfStepInputs *inputs, float one_minus_beta1,
                     float one_minus_beta2, float eps, cudaStream_t stream) {
    SparseAdamTables jobs;
    dim3 grid;
    if (!table_jobs(tables, n, &jobs, &grid)) return;
    sparse_adam_kernel<<<grid, THREADS, 0, stream>>>(jobs, inputs, one_minus_beta1, one_minus_beta2, eps);
    CHECK_LAUNCH("sparse_adam_kernel");
}

// ------------------------------------------------------------------ step 19's transformer (transformer_ops.c)
// transformer_ops.c's loops, operation for operation: __fmul_rn and __fadd_rn wherever a product
// meets a sum (nvcc would fuse them into one FMA; the CPU build rounds twice), IEEE division and
// square root (nvcc's defaults without --use_fast_math): the same bits as the CPU. A thread, or a
// team of threads in the CPU's lanes, owns each sum and adds its terms in the CPU's order: no
// atomics, the same bits every run.

// transformer_ops.c's fixed-order row sums: LANES running sums (lane j takes the values j,
// j + LANES, ... of the whole chunks), the lanes added pairwise, then the rest in order.
#define LANES 16

__device__ static float sum_of_lanes(float *lane) {
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) lane[j] = __fadd_rn(lane[j], lane[j + width]);
    return lane[0];
}

// A team of LANES threads per row, TEAM_ROWS teams per block: thread j of a team is lane j of the
// CPU's sums (it adds the values j, j + LANES, ... of the row's whole chunks, in order, as the CPU's
// lane j does), the team's lanes are added in the CPU's tree (sum_of_lanes) by each of its threads
// alike, from shared memory, and the rest of the row after them in order: the CPU's bits. A team
// reads LANES consecutive floats at a time, where a thread per row read one float from each of 32
// rows, and a row's work is spread over LANES threads. Every thread of a block meets the same
// barriers: a team past the last row (live false) runs the loops with no values.
#define TEAM_ROWS (256 / LANES)  // THREADS / LANES

__device__ static int whole_chunks_end(int n) { return n / LANES * LANES; }

// The team's sum of its threads' lane partials, in sum_of_lanes' tree (every thread of the block calls it).
__device__ static float team_lanes_sum(float (*slots)[LANES], float partial) {
    const int team = threadIdx.x / LANES;
    __syncthreads();  // the slots' last reading is over
    slots[team][threadIdx.x % LANES] = partial;
    __syncthreads();
    float lane[LANES];
    for (int k = 0; k < LANES; k++) lane[k] = slots[team][k];
    return sum_of_lanes(lane);
}

// The CPU's fixed-order sum of term(c) over c < n, for the team's row: lane j's partial over the
// whole chunks, the lanes added in sum_of_lanes' tree (team_lanes_sum), then the rest in order.
template <typename Term>
__device__ static float team_row_sum(float (*slots)[LANES], int n, Term term) {
    const int whole = whole_chunks_end(n);
    float partial = 0.0f;
    for (int c = threadIdx.x % LANES; c < whole; c += LANES) partial = __fadd_rn(partial, term(c));
    float sum = team_lanes_sum(slots, partial);
    for (int c = whole; c < n; c++) sum = __fadd_rn(sum, term(c));
    return sum;
}

__global__ void layernorm_forward_kernel(const float *x, const float *weight, const float *bias, int rows, int cols,
                                         float *y, float *mean, float *rstd) {
    __shared__ float slots[TEAM_ROWS][LANES];
    const int j = threadIdx.x % LANES;
    for (size_t base = (size_t)blockIdx.x * TEAM_ROWS; base < (size_t)rows; base += (size_t)gridDim.x * TEAM_ROWS) {
        const size_t r = base + threadIdx.x / LANES;
        const bool live = r < (size_t)rows;
        const int n = live ? cols : 0;
        const float *xr = x + (live ? r : 0) * cols;
        const float m = __fdiv_rn(team_row_sum(slots, n, [=](int c) { return xr[c]; }), (float)cols);
        const float squares =
            team_row_sum(slots, n, [=](int c) { return __fmul_rn(__fsub_rn(xr[c], m), __fsub_rn(xr[c], m)); });
        const float s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(squares, (float)cols), 1e-5f)));
        __syncthreads();  // every thread of the team has read the row's rest (y may be x)
        float *yr = y + (live ? r : 0) * cols;
        for (int c = j; c < n; c += LANES) {
            float scaled = __fmul_rn(__fmul_rn(__fsub_rn(xr[c], m), s), weight[c]);
            yr[c] = bias ? __fadd_rn(scaled, bias[c]) : scaled;
        }
        if (live && j == 0) mean[r] = m, rstd[r] = s;
    }
}

// dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), g = grad_y * weight, a team per row.
__global__ void layernorm_backward_rows_kernel(const float *x, const float *weight, const float *mean,
                                               const float *rstd, const float *grad_y, int rows, int cols,
                                               float *grad_x) {
    __shared__ float slots[TEAM_ROWS][LANES];
    const int j = threadIdx.x % LANES;
    for (size_t base = (size_t)blockIdx.x * TEAM_ROWS; base < (size_t)rows; base += (size_t)gridDim.x * TEAM_ROWS) {
        const size_t r = base + threadIdx.x / LANES;
        const bool live = r < (size_t)rows;
        const int n = live ? cols : 0;
        const float *xr = x + (live ? r : 0) * cols, *gy = grad_y + (live ? r : 0) * cols;
        const float m = live ? mean[r] : 0.0f, s = live ? rstd[r] : 0.0f;
        const float g_sum = team_row_sum(slots, n, [=](int c) { return __fmul_rn(gy[c], weight[c]); });
        const float g_xhat_sum = team_row_sum(
            slots, n, [=](int c) { return __fmul_rn(__fmul_rn(gy[c], weight[c]), __fmul_rn(__fsub_rn(xr[c], m), s)); });
        const float g_mean = __fdiv_rn(g_sum, (float)cols), g_xhat_mean = __fdiv_rn(g_xhat_sum, (float)cols);
        __syncthreads();  // every thread of the team has read the row's rest (grad_x may be grad_y)
        float *gx = grad_x + (live ? r : 0) * cols;
        for (int c = j; c < n; c += LANES) {
            float x_hat = __fmul_rn(__fsub_rn(xr[c], m), s);
            float inner = __fsub_rn(__fsub_rn(__fmul_rn(gy[c], weight[c]), g_mean), __fmul_rn(x_hat, g_xhat_mean));
            gx[c] = __fadd_rn(gx[c], __fmul_rn(s, inner));
        }
    }
}

// The weights' gradients, each column summed over the rows in row order, then added to the gradient
// (the CPU's block of columns does the same per column). A block takes COLUMN_TILE columns: its
// threads compute a tile of ROW_TILE rows' terms (gy x_hat for the weight, gy for the bias) into
// shared memory, coalesced and all at once, then one thread per column adds the tile's terms to its
// running sums in row order, and so on down the rows. The serial part is then additions from shared
// memory alone; a thread per column that also loaded its terms waited on memory at every row.
// Each thread loads its TERMS terms before it stores any, so that their loads are in flight together:
// a loop that stored each term before loading the next waited on memory once a term, 8 times a tile
// of 64 rows by 32 columns (a LayerNorm's backward took 1.6 ms on an H100 at nanoGPT's shape, 16,384
// rows). Tiles of 8 columns (a 32-byte sector of a row) give a C = 384 LayerNorm 48 blocks, not 12,
// and 256 rows a tile, a quarter as many tiles. The loads of the next tile are in flight while
// thread 0..7 add up this one.
#define COLUMN_TILE 8
#define ROW_TILE 256
enum { COLUMN_TERMS = ROW_TILE * COLUMN_TILE / THREADS };  // terms a thread loads per tile

__global__ void layernorm_backward_columns_kernel(const float *x, const float *mean, const float *rstd,
                                                  const float *grad_y, int rows, int cols, float *grad_weight,
                                                  float *grad_bias) {
    static_assert(ROW_TILE * COLUMN_TILE == COLUMN_TERMS * THREADS, "a tile is THREADS x COLUMN_TERMS terms");
    __shared__ float weight_terms[ROW_TILE][COLUMN_TILE], bias_terms[ROW_TILE][COLUMN_TILE];
    for (int first = blockIdx.x * COLUMN_TILE; first < cols; first += gridDim.x * COLUMN_TILE) {
        float dw = 0.0f, db = 0.0f;  // thread t < COLUMN_TILE's column first + t
        for (int top = 0; top < rows; top += ROW_TILE) {
            float gy[COLUMN_TERMS], xv[COLUMN_TERMS], m[COLUMN_TERMS], s[COLUMN_TERMS];
            for (int t = 0; t < COLUMN_TERMS; t++) {  // the loads, all issued before any is used
                int k = threadIdx.x + t * THREADS, r = top + k / COLUMN_TILE, c = first + k % COLUMN_TILE;
                bool live = r < rows && c < cols;
                gy[t] = live ? grad_y[(size_t)r * cols + c] : 0.0f;
                xv[t] = live ? x[(size_t)r * cols + c] : 0.0f;
                m[t] = live ? mean[r] : 0.0f;
                s[t] = live ? rstd[r] : 0.0f;
            }
            __syncthreads();  // the last tile's terms are added
            for (int t = 0; t < COLUMN_TERMS; t++) {
                int k = threadIdx.x + t * THREADS;
                weight_terms[k / COLUMN_TILE][k % COLUMN_TILE] = __fmul_rn(gy[t], __fmul_rn(__fsub_rn(xv[t], m[t]), s[t]));
                bias_terms[k / COLUMN_TILE][k % COLUMN_TILE] = gy[t];
            }
            __syncthreads();
            if (threadIdx.x < COLUMN_TILE)
                for (int k = 0; k < ROW_TILE && top + k < rows; k++) {
                    dw = __fadd_rn(dw, weight_terms[k][threadIdx.x]);
                    db = __fadd_rn(db, bias_terms[k][threadIdx.x]);
                }
        }
        int c = first + threadIdx.x;
        if (threadIdx.x < COLUMN_TILE && c < cols) {
            grad_weight[c] = __fadd_rn(grad_weight[c], dw);
            if (grad_bias) grad_bias[c] = __fadd_rn(grad_bias[c], db);
        }
    }
}

// transformer_ops.c's exp_nonpositive (that file says why not libm's), rounding for rounding: the
// softmax's and GELU's exp.
__device__ static float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float round_magic = 12582912.0f;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), round_magic), round_magic);
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693145751953125f)), __fmul_rn(n, 1.428606765330187045e-06f));
    float p = 1.0f / 5040.0f;
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 720.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6.0f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    int k = n >= -126.0f ? (int)n : -127;  // a NaN x: as transformer_ops.c's, the result NaN
    return __fmul_rn(p, __int_as_float((k + 127) << 23));
}

// The end of row t's work (n = t + 1 positions): whole chunks of LANES, at most T (causal_end).
__device__ static int causal_end(int n, int T) {
    int end = (n + LANES - 1) / LANES * LANES;
    return end < T ? end : T;
}

// transformer_ops.c's causal_softmax_row, a team per row: the max (exact in any order: each lane's
// from its first value on, as the CPU's from row[0], then the lanes'), exp_nonpositive, the sum in
// LANES over whole chunks (the positions past t adding 0), then the last partial chunk in order.
__global__ void causal_softmax_kernel(float *att, int pairs, int T) {
    __shared__ float slots[TEAM_ROWS][LANES];
    const int j = threadIdx.x % LANES, team = threadIdx.x / LANES;
    const size_t rows = (size_t)pairs * T;
    for (size_t base = (size_t)blockIdx.x * TEAM_ROWS; base < rows; base += (size_t)gridDim.x * TEAM_ROWS) {
        const size_t i = base + team;
        const bool live = i < rows;
        const int n = live ? (int)(i % T) + 1 : 0, end = live ? causal_end(n, T) : 0, whole = whole_chunks_end(end);
        float *row = att + (live ? i : 0) * T;  // row t of pair i / T: rows of T are contiguous
        float lane_max = j < n ? row[j] : 0.0f;
        for (int u = j + LANES; u < n; u += LANES) lane_max = row[u] > lane_max ? row[u] : lane_max;
        __syncthreads();
        slots[team][j] = lane_max;
        __syncthreads();
        float max = slots[team][0];  // lane 0 holds row[0], as the CPU's max starts
        for (int k = 1; k < LANES && k < n; k++) max = slots[team][k] > max ? slots[team][k] : max;
        float partial = 0.0f;
        for (int u = j; u < whole; u += LANES) {
            float e = u < n ? exp_nonpositive(__fsub_rn(row[u], max)) : 0.0f;
            row[u] = e;
            partial = __fadd_rn(partial, e);
        }
        float sum = team_lanes_sum(slots, partial);
        for (int u = whole; u < end; u++) sum = __fadd_rn(sum, u < n ? exp_nonpositive(__fsub_rn(row[u], max)) : 0.0f);
        const float inv_sum = __fdiv_rn(1.0f, sum);
        __syncthreads();  // every thread of the team has read the last partial chunk
        for (int u = j; live && u < T; u += LANES)
            row[u] = u < whole ? __fmul_rn(row[u], inv_sum)
                   : u < end   ? __fmul_rn(u < n ? exp_nonpositive(__fsub_rn(row[u], max)) : 0.0f, inv_sum)
                               : 0.0f;
    }
}

// Its backward, a team per row: the dot product as row_dot's over causal_end's chunks (att is 0 past t).
__global__ void causal_softmax_backward_kernel(const float *att, float *grad, int pairs, int T, float scale) {
    __shared__ float slots[TEAM_ROWS][LANES];
    const int j = threadIdx.x % LANES;
    const size_t rows = (size_t)pairs * T;
    for (size_t base = (size_t)blockIdx.x * TEAM_ROWS; base < rows; base += (size_t)gridDim.x * TEAM_ROWS) {
        const size_t i = base + threadIdx.x / LANES;
        const bool live = i < rows;
        const int n = live ? (int)(i % T) + 1 : 0, end = live ? causal_end(n, T) : 0;
        const float *row = att + (live ? i : 0) * T;
        float *g = grad + (live ? i : 0) * T;
        const float weighted = team_row_sum(slots, end, [=](int u) { return __fmul_rn(row[u], g[u]); });
        __syncthreads();  // every thread of the team has read the last partial chunk
        for (int u = j; live && u < T; u += LANES)
            g[u] = u < n ? __fmul_rn(__fmul_rn(row[u], __fsub_rn(g[u], weighted)), scale) : 0.0f;
    }
}

// transformer_ops.c's erf_rational, rounding for rounding (that file says why a rational function
// and not libm's).
__device__ static float erf_rational(float a) {
    float x = a > 4.0f ? 4.0f : (a < -4.0f ? -4.0f : a);
    float x2 = __fmul_rn(x, x);
    float p = __fadd_rn(__fmul_rn(x2, -2.72614225801306e-10f), 2.77068142495902e-08f);
    p = __fadd_rn(__fmul_rn(x2, p), -2.10102402082508e-06f);
    p = __fadd_rn(__fmul_rn(x2, p), -5.69250639462346e-05f);
    p = __fadd_rn(__fmul_rn(x2, p), -7.34990630326855e-04f);
    p = __fadd_rn(__fmul_rn(x2, p), -2.95459980854025e-03f);
    p = __fadd_rn(__fmul_rn(x2, p), -1.60960333262415e-02f);
    float q = __fadd_rn(__fmul_rn(x2, -1.45660718464996e-05f), -2.13374055278905e-04f);
    q = __fadd_rn(__fmul_rn(x2, q), -1.68282697438203e-03f);
    q = __fadd_rn(__fmul_rn(x2, q), -7.37332916720468e-03f);
    q = __fadd_rn(__fmul_rn(x2, q), -1.42647390514189e-02f);
    return __fdiv_rn(__fmul_rn(x, p), q);
}

#define GELU_INV_SQRT2 0.70710678118654752440f
#define GELU_INV_SQRT_2PI 0.39894228040143267794f

__global__ void gelu_forward_kernel(const float *x, size_t n, float *y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fmul_rn(__fmul_rn(0.5f, x[i]), __fadd_rn(1.0f, erf_rational(__fmul_rn(x[i], GELU_INV_SQRT2))));
}

__global__ void gelu_backward_kernel(const float *x, const float *grad_y, size_t n, float *grad_x) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erf_rational(__fmul_rn(x[i], GELU_INV_SQRT2))));
        float pdf = __fmul_rn(GELU_INV_SQRT_2PI, exp_nonpositive(__fmul_rn(__fmul_rn(-0.5f, x[i]), x[i])));
        grad_x[i] = __fmul_rn(grad_y[i], __fadd_rn(cdf, __fmul_rn(x[i], pdf)));
    }
}

__global__ void add_kernel(const float *a, const float *b, size_t n, float *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void multiply_kernel(const float *a, const float *b, size_t n, float *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] * b[i];
}

__global__ void embedding_forward_kernel(const int *tokens, const float *wte, const float *wpe, int T, int C,
                                         size_t n, float *x) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / C, c = i % C;
        x[i] = wte[(size_t)tokens[row] * C + c] + wpe[(row % T) * C + c];
    }
}

__global__ void embedding_backward_wte_kernel(const float *grad_x, const int *row_start, const int *positions,
                                              int vocab_size, int C, float *grad_wte) {
    size_t n = (size_t)vocab_size * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t v = i / C, c = i % C;
        float sum = grad_wte[i];
        for (int k = row_start[v]; k < row_start[v + 1]; k++) sum = __fadd_rn(sum, grad_x[(size_t)positions[k] * C + c]);
        grad_wte[i] = sum;
    }
}

__global__ void embedding_backward_wpe_kernel(const float *grad_x, int B, int T, int C, float *grad_wpe) {
    size_t n = (size_t)T * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float sum = grad_wpe[i];
        for (int b = 0; b < B; b++) sum = __fadd_rn(sum, grad_x[(size_t)b * T * C + i]);  // row b * T + t, column c
        grad_wpe[i] = sum;
    }
}

void gpu_layernorm_forward(const float *x, const float *weight, const float *bias, int rows, int cols, float *y,
                           float *mean, float *rstd, cudaStream_t stream) {
    if (rows <= 0) return;
    layernorm_forward_kernel<<<blocks_for((size_t)rows * LANES), THREADS, 0, stream>>>(x, weight, bias, rows, cols, y, mean, rstd);
    CHECK_LAUNCH("layernorm_forward_kernel");
}

void gpu_layernorm_backward(const float *x, const float *weight, const float *mean, const float *rstd,
                            const float *grad_y, int rows, int cols, float *grad_x, float *grad_weight,
                            float *grad_bias, cudaStream_t stream) {
    if (rows <= 0) return;
    layernorm_backward_rows_kernel<<<blocks_for((size_t)rows * LANES), THREADS, 0, stream>>>(x, weight, mean, rstd, grad_y,
                                                                                     rows, cols, grad_x);
    CHECK_LAUNCH("layernorm_backward_rows_kernel");
    const unsigned column_tiles = (unsigned)((cols + COLUMN_TILE - 1) / COLUMN_TILE);
    layernorm_backward_columns_kernel<<<column_tiles < MAX_BLOCKS ? column_tiles : MAX_BLOCKS, THREADS, 0, stream>>>(
        x, mean, rstd, grad_y, rows, cols, grad_weight, grad_bias);
    CHECK_LAUNCH("layernorm_backward_columns_kernel");
}

void gpu_causal_softmax(float *att, int pairs, int T, cudaStream_t stream) {
    if (pairs <= 0) return;
    causal_softmax_kernel<<<blocks_for((size_t)pairs * T * LANES), THREADS, 0, stream>>>(att, pairs, T);
    CHECK_LAUNCH("causal_softmax_kernel");
}

void gpu_causal_softmax_backward(const float *att, float *grad, int pairs, int T, float scale, cudaStream_t stream) {
    if (pairs <= 0) return;
    causal_softmax_backward_kernel<<<blocks_for((size_t)pairs * T * LANES), THREADS, 0, stream>>>(att, grad, pairs, T, scale);
    CHECK_LAUNCH("causal_softmax_backward_kernel");
}

void gpu_gelu_forward(const float *x, size_t n, float *y, cudaStream_t stream) {
    if (n == 0) return;
    gelu_forward_kernel<<<blocks_for(n), THREADS, 0, stream>>>(x, n, y);
    CHECK_LAUNCH("gelu_forward_kernel");
}

void gpu_gelu_backward(const float *x, const float *grad_y, size_t n, float *grad_x, cudaStream_t stream) {
    if (n == 0) return;
    gelu_backward_kernel<<<blocks_for(n), THREADS, 0, stream>>>(x, grad_y, n, grad_x);
    CHECK_LAUNCH("gelu_backward_kernel");
}

void gpu_add(const float *a, const float *b, size_t n, float *out, cudaStream_t stream) {
    if (n == 0) return;
    add_kernel<<<blocks_for(n), THREADS, 0, stream>>>(a, b, n, out);
    CHECK_LAUNCH("add_kernel");
}

__global__ void pair_pointers_kernel(const char *a, long long a_outer, long long a_inner, const char *b,
                                     long long b_outer, long long b_inner, int operand_bytes, float *c,
                                     long long c_outer, long long c_inner, int per_sequence, int count,
                                     const void **a_out, const void **b_out, float **c_out) {
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < count; p += gridDim.x * blockDim.x) {
        long long sequence = p / per_sequence, head = p % per_sequence;
        a_out[p] = a + (sequence * a_outer + head * a_inner) * operand_bytes;
        b_out[p] = b + (sequence * b_outer + head * b_inner) * operand_bytes;
        c_out[p] = c + sequence * c_outer + head * c_inner;
    }
}

void gpu_pair_pointers(const void *a, long long a_outer, long long a_inner, const void *b, long long b_outer,
                       long long b_inner, int operand_bytes, float *c, long long c_outer, long long c_inner,
                       int per_sequence, int count, const void **a_out, const void **b_out, float **c_out,
                       cudaStream_t stream) {
    if (count <= 0) return;
    pair_pointers_kernel<<<blocks_for((size_t)count), THREADS, 0, stream>>>(
        (const char *)a, a_outer, a_inner, (const char *)b, b_outer, b_inner, operand_bytes, c, c_outer, c_inner,
        per_sequence, count, a_out, b_out, c_out);
    CHECK_LAUNCH("pair_pointers_kernel");
}

// A thread per four values, as the CPU's loop takes them: one Philox evaluation each.
__global__ void dropout_philox_kernel(uint32_t key0, uint32_t key1, uint64_t stream_id, float keep, float scale,
                                      uint64_t first, uint64_t length, uint64_t stride, size_t runs, float *mask) {
    const size_t evaluations = runs * philox_run_evaluations(length);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < evaluations; i += (size_t)gridDim.x * blockDim.x)
        philox_dropout_part_evaluation(i, runs, key0, key1, stream_id, keep, scale, first, length, stride, mask);
}

void gpu_dropout_philox(uint32_t key0, uint32_t key1, uint64_t stream_id, float keep, float scale, uint64_t first,
                        uint64_t length, uint64_t stride, size_t runs, float *mask, cudaStream_t stream) {
    if (length == 0 || runs == 0) return;
    dropout_philox_kernel<<<blocks_for(runs * philox_run_evaluations(length)), THREADS, 0, stream>>>(
        key0, key1, stream_id, keep, scale, first, length, stride, runs, mask);
    CHECK_LAUNCH("dropout_philox_kernel");
}

void gpu_multiply(const float *a, const float *b, size_t n, float *out, cudaStream_t stream) {
    if (n == 0) return;
    multiply_kernel<<<blocks_for(n), THREADS, 0, stream>>>(a, b, n, out);
    CHECK_LAUNCH("multiply_kernel");
}

void gpu_embedding_forward(const int *tokens, const float *wte, const float *wpe, int B, int T, int C, float *x,
                           cudaStream_t stream) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    embedding_forward_kernel<<<blocks_for(n), THREADS, 0, stream>>>(tokens, wte, wpe, T, C, n, x);
    CHECK_LAUNCH("embedding_forward_kernel");
}

void gpu_embedding_backward_tables(const float *grad_x, const int *row_start, const int *positions, int vocab_size,
                                   int B, int T, int C, float *grad_wte, float *grad_wpe, cudaStream_t stream) {
    if ((size_t)B * T * C == 0) return;
    embedding_backward_wte_kernel<<<blocks_for((size_t)vocab_size * C), THREADS, 0, stream>>>(grad_x, row_start, positions,
                                                                                              vocab_size, C, grad_wte);
    CHECK_LAUNCH("embedding_backward_wte_kernel");
    embedding_backward_wpe_kernel<<<blocks_for((size_t)T * C), THREADS, 0, stream>>>(grad_x, B, T, C, grad_wpe);
    CHECK_LAUNCH("embedding_backward_wpe_kernel");
}
