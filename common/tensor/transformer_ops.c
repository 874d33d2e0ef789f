// transformer_ops.c: LayerNorm, causal attention, GELU and the embeddings, on the CPU or the GPU. See transformer_ops.h.
#include "tensor/transformer_ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/check.h"
#include "base/cpu_dispatch.h"
#include "base/philox.h"
#if HAVE_CUDA
#include "tensor/kernels.h"
#endif

#define LAYERNORM_EPS 1e-5f

// A row's sums in a fixed order that vectorises: LANES running sums, lane j taking the columns
// j, j + LANES, ..., then the lanes added pairwise (a tree of fixed shape), then the last
// cols % LANES columns in order. A plain `sum += x[c]` is one chain of dependent additions the
// compiler may not reorder (no -ffast-math), 4 cycles each: 128 columns took 1000 cycles a row
// for a LayerNorm's mean and variance (step 19 at 1 thread: layernorm_forward 3.7% of the step,
// now 1.4%). The order depends on n alone, so every thread count and every CPU_DISPATCHED clone
// give the same bits.
enum { LANES = 16 };

static inline float sum_of_lanes(float lane[LANES]) {
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) lane[j] += lane[j + width];
    return lane[0];
}

static inline float row_sum(const float *restrict x, int n) {
    float lane[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANES; j++) lane[j] += x[c + j];
    float sum = sum_of_lanes(lane);
    for (; c < n; c++) sum += x[c];
    return sum;
}

// sum over c of a[c] b[c], in row_sum's order.
static inline float row_dot(const float *restrict a, const float *restrict b, int n) {
    float lane[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANES; j++) lane[j] += a[c + j] * b[c + j];
    float sum = sum_of_lanes(lane);
    for (; c < n; c++) sum += a[c] * b[c];
    return sum;
}

// sum over c of (g[c] w[c]) ((x[c] - m) s), in row_sum's order: LayerNorm backward's g * x_hat.
static inline float row_dot_normalised(const float *restrict g, const float *restrict w, const float *restrict x,
                                       float m, float s, int n) {
    float lane[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANES; j++) lane[j] += (g[c + j] * w[c + j]) * ((x[c + j] - m) * s);
    float sum = sum_of_lanes(lane);
    for (; c < n; c++) sum += (g[c] * w[c]) * ((x[c] - m) * s);
    return sum;
}

// sum over c of (x[c] - m)^2: the biased variance's numerator.
static inline float row_sum_of_squares(const float *restrict x, float m, int n) {
    float lane[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANES; j++) {
            float d = x[c + j] - m;
            lane[j] += d * d;
        }
    float sum = sum_of_lanes(lane);
    for (; c < n; c++) sum += (x[c] - m) * (x[c] - m);
    return sum;
}

// Rows are independent: each thread takes whole rows, and a row's statistics are summed in
// an order fixed by cols (row_sum), whatever thread computes them.
CPU_DISPATCHED static void cpu_layernorm_forward(const float *x, const float *weight, const float *bias, int rows,
                                                 int cols, float *y, float *mean, float *rstd) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * cols;
        float *restrict yr = y + (size_t)r * cols;
        float m = row_sum(xr, cols) / (float)cols;
        float s = 1.0f / sqrtf(row_sum_of_squares(xr, m, cols) / (float)cols + LAYERNORM_EPS);
        if (bias)
            for (int c = 0; c < cols; c++) yr[c] = (xr[c] - m) * s * weight[c] + bias[c];
        else
            for (int c = 0; c < cols; c++) yr[c] = (xr[c] - m) * s * weight[c];
        mean[r] = m;
        rstd[r] = s;
    }
}

// Blocks of this many columns per thread for the weights' gradients: a cache line of each row.
enum { COLUMN_BLOCK = 16 };

CPU_DISPATCHED static void cpu_layernorm_backward(const float *x, const float *weight, const float *mean,
                                                  const float *rstd, const float *grad_y, int rows, int cols,
                                                  float *grad_x, float *grad_weight, float *grad_bias) {
    // grad_x, row by row: with x_hat = (x - mean) * rstd and g = grad_y * weight,
    // dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)).
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * cols, *restrict gy = grad_y + (size_t)r * cols;
        float *restrict gx = grad_x + (size_t)r * cols;
        float m = mean[r], s = rstd[r];
        // The two means in row_sum's order, one loop each (gcc vectorised the two sums in one
        // loop into a tangle of shuffles and spills, 6x layernorm_forward's time).
        float g_mean = row_dot(gy, weight, cols) / (float)cols;
        float g_xhat_mean = row_dot_normalised(gy, weight, xr, m, s, cols) / (float)cols;
        for (int c = 0; c < cols; c++) {
            float x_hat = (xr[c] - m) * s;
            gx[c] += s * (gy[c] * weight[c] - g_mean - x_hat * g_xhat_mean);
        }
    }
    // The weights' gradients: sums over the rows, each column summed in row order (a thread
    // owns a block of columns), so any thread count gives the same bits.
    int blocks = (cols + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int first = block * COLUMN_BLOCK, n = cols - first < COLUMN_BLOCK ? cols - first : COLUMN_BLOCK;
        float dw[COLUMN_BLOCK] = {0}, db[COLUMN_BLOCK] = {0};
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * cols + first, *gy = grad_y + (size_t)r * cols + first;
            float m = mean[r], s = rstd[r];
            // A constant trip count keeps dw and db in vector registers across the rows (with
            // n the sums went through memory, a store and a load per value and row: this loop
            // took 6x layernorm_forward's time). The same operations either way.
            if (n == COLUMN_BLOCK)
                for (int c = 0; c < COLUMN_BLOCK; c++) {
                    dw[c] += gy[c] * ((xr[c] - m) * s);
                    db[c] += gy[c];
                }
            else
                for (int c = 0; c < n; c++) {
                    dw[c] += gy[c] * ((xr[c] - m) * s);
                    db[c] += gy[c];
                }
        }
        for (int c = 0; c < n; c++) {
            grad_weight[first + c] += dw[c];
            if (grad_bias) grad_bias[first + c] += db[c];
        }
    }
}

// exp(x) for x <= 0 (GELU's -x^2 / 2, softmax's score - max): 2^n e^r with n the nearest integer to x / ln 2 (the
// 1.5 * 2^23 trick rounds without a call), r = x - n ln 2 in two parts (Cody and Waite), e^r by
// its Taylor series to degree 7 (|r| <= ln 2 / 2: error below 1e-8), 2^n built in the exponent bits.
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;  // e^-87 is near float's smallest normal; the GELU's term is 0 there anyway
    const float round_magic = 12582912.0f;
    float n = (x * 1.44269504088896341f + round_magic) - round_magic;
    float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    // n is in [-126, 0]. A NaN x (a diverged run's scores) makes n NaN, which C leaves undefined to
    // convert (UBSan: a shift of INT_MIN + 127): it takes -127 instead, and p, NaN too, keeps the
    // result NaN, as the caller's check of the loss needs.
    int32_t k = n >= -126.0f ? (int32_t)n : -127;
    union { uint32_t bits; float value; } two_to_n = {.bits = (uint32_t)(k + 127) << 23};
    return p * two_to_n.value;
}

// The end of row t's work in a causal [T, T] block: n = t + 1 positions rounded up to whole
// chunks of LANES, at most T. The loops below run over whole chunks and mask the positions past t
// inside the last one, so that none has a variable tail: with tails, the softmax of a [64, 64]
// block took longer than its two sgemms (48 blocks: 285 us, now 198 us; attention_forward on
// step 19's [768, 384], 1 thread: 440 us, now 345 us).
static inline int causal_end(int n, int T) {
    int end = (n + LANES - 1) / LANES * LANES;
    return end < T ? end : T;
}

// Row t of the causal softmax, in place: row[0..n) (n = t + 1, the positions t sees) becomes
// softmax(row[0..n)), row[n..T) 0 (their -inf, which softmax makes 0). The max is exact in any
// order; the sum runs in LANES as row_sum's (masked values 0, adding nothing), its order fixed by
// n and T; exp is exp_nonpositive (score - max <= 0), vectorised where libm's expf was a call per value.
static inline void causal_softmax_row(float *restrict row, int n, int T) {
    const int end = causal_end(n, T);
    float lane[LANES];
    for (int j = 0; j < LANES; j++) lane[j] = -INFINITY;
    int u = 0;
    for (; u + LANES <= end; u += LANES)
        for (int j = 0; j < LANES; j++) {
            float value = u + j < n ? row[u + j] : -INFINITY;
            lane[j] = value > lane[j] ? value : lane[j];
        }
    float max = lane[0];
    for (int j = 1; j < LANES; j++) max = lane[j] > max ? lane[j] : max;
    for (; u < n; u++) max = row[u] > max ? row[u] : max;  // (T not a multiple of LANES)
    float sums[LANES] = {0};
    for (u = 0; u + LANES <= end; u += LANES)
        for (int j = 0; j < LANES; j++) {
            float e = u + j < n ? exp_nonpositive(row[u + j] - max) : 0.0f;
            row[u + j] = e;
            sums[j] += e;
        }
    float sum = sum_of_lanes(sums);
    for (; u < end; u++) {  // a last, partial chunk (T not a multiple of LANES)
        float e = u < n ? exp_nonpositive(row[u] - max) : 0.0f;
        row[u] = e;
        sum += e;
    }
    float inv_sum = 1.0f / sum;
    for (u = 0; u < end; u++) row[u] *= inv_sum;  // (0 past t stays 0)
    for (; u < T; u++) row[u] = 0.0f;
}

// With bfloat16 matmuls (tensor.h) the attention's products on the CPU take rounded copies of their
// operands, as the GPU's cublasGemmBatchedEx does: qkv and grad_y whole, before the pairs' loop, and
// a pair's [T, T] probabilities (or their gradient) into its thread's own block of g_pair_rounded.
static float *g_rounded_qkv, *g_rounded_grad_y, *g_pair_rounded;
static size_t g_rounded_qkv_count, g_rounded_grad_y_count, g_pair_rounded_count;

// This thread's number in the pairs' loop, and how many there can be (1 and 0 in a build without OpenMP).
static int thread_slots(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static int thread_slot(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static float *grown(float **buffer, size_t *count, size_t n) {
    if (n > *count) {
        free(*buffer);
        *buffer = xmalloc(n * sizeof(float));
        *count = n;
    }
    return *buffer;
}

// The calling thread's [T, T] block holding x rounded (x itself with float32 matmuls).
static const float *pair_operand(const float *x, int T, bool bf16) {
    if (!bf16) return x;
    float *mine = g_pair_rounded + (size_t)thread_slot() * T * T;
    for (int i = 0; i < T * T; i++) mine[i] = round_to_bfloat16(x[i]);
    return mine;
}

// One (sequence, head) pair per iteration: its q, k and v are its own columns of qkv, its
// scores its own [T, T] block of att, so the pairs run on any threads without sharing a value.
// Each pair's products are single-threaded sgemms on strided views (row stride 3C for q, k, v;
// C for y), as llm.c's CPU attention loops but with BLAS's kernels: the whole [T, T] block is
// computed and the part above the diagonal then masked, which costs 2x the causal FLOPs of the
// scores but runs at GEMM speed.
CPU_DISPATCHED static void cpu_attention_forward(const float *qkv, int B, int T, int C, int n_head, float *att,
                                                 const float *dropout_mask, float *att_dropped, float *y) {
    const int head_dim = C / n_head, stride = 3 * C;
    const float scale = 1.0f / sqrtf((float)head_dim);
    const bool bf16 = matmul_dtype() == MATMUL_BFLOAT16;
    if (bf16) {
        qkv = rounded_to_bfloat16(&g_rounded_qkv, &g_rounded_qkv_count, qkv, (size_t)B * T * stride);
        grown(&g_pair_rounded, &g_pair_rounded_count, (size_t)thread_slots() * T * T);
    }
#pragma omp parallel for schedule(static)
    for (int pair = 0; pair < B * n_head; pair++) {
        int b = pair / n_head, h = pair % n_head;
        const float *q = qkv + (size_t)b * T * stride + h * head_dim, *k = q + C, *v = q + 2 * C;
        float *scores = att + (size_t)pair * T * T;
        // scores = q k^T / sqrt(head_dim)                                       [T, T]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, scale, q, stride, k, stride, 0.0f, scores, T);
        for (int t = 0; t < T; t++) causal_softmax_row(scores + (size_t)t * T, t + 1, T);
        const float *weights = scores;  // what multiplies v: att, or att * mask under dropout
        if (dropout_mask) {
            const float *mask = dropout_mask + (size_t)pair * T * T;
            float *dropped = att_dropped + (size_t)pair * T * T;
            for (int i = 0; i < T * T; i++) dropped[i] = scores[i] * mask[i];
            weights = dropped;
        }
        // y = att v                                                            [T, head_dim]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, 1.0f, pair_operand(weights, T, bf16), T, v,
                    stride, 0.0f, y + (size_t)b * T * C + h * head_dim, C);
    }
}

CPU_DISPATCHED static void cpu_attention_backward(const float *qkv, const float *att, const float *dropout_mask,
                                                  const float *att_dropped, const float *grad_y, int B, int T, int C,
                                                  int n_head, float *grad_att, float *grad_qkv) {
    const int head_dim = C / n_head, stride = 3 * C;
    const float scale = 1.0f / sqrtf((float)head_dim);
    const bool bf16 = matmul_dtype() == MATMUL_BFLOAT16;
    if (bf16) {  // (the products' operands; the softmax's backward reads qkv's att, not these)
        qkv = rounded_to_bfloat16(&g_rounded_qkv, &g_rounded_qkv_count, qkv, (size_t)B * T * stride);
        grad_y = rounded_to_bfloat16(&g_rounded_grad_y, &g_rounded_grad_y_count, grad_y, (size_t)B * T * C);
        grown(&g_pair_rounded, &g_pair_rounded_count, (size_t)thread_slots() * T * T);
    }
#pragma omp parallel for schedule(static)
    for (int pair = 0; pair < B * n_head; pair++) {
        float *grad_scores = grad_att + (size_t)pair * T * T;  // this pair's [T, T]
        int b = pair / n_head, h = pair % n_head;
        const float *q = qkv + (size_t)b * T * stride + h * head_dim, *k = q + C, *v = q + 2 * C;
        float *grad_q = grad_qkv + (size_t)b * T * stride + h * head_dim, *grad_k = grad_q + C, *grad_v = grad_q + 2 * C;
        const float *scores = att + (size_t)pair * T * T;
        const float *weights = dropout_mask ? att_dropped + (size_t)pair * T * T : scores;  // what multiplied v
        const float *gy = grad_y + (size_t)b * T * C + h * head_dim;
        // y = weights v: d weights = dy v^T, dv = weights^T dy; under dropout, d att = d weights * mask
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, 1.0f, gy, C, v, stride, 0.0f, grad_scores, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, 1.0f, pair_operand(weights, T, bf16), T, gy, C,
                    0.0f, grad_v, stride);
        if (dropout_mask) {
            const float *mask = dropout_mask + (size_t)pair * T * T;
            for (int i = 0; i < T * T; i++) grad_scores[i] *= mask[i];
        }
        // Softmax's backward, then the scale: d score = att (d att - sum_u att d att) / sqrt(head_dim);
        // 0 above the diagonal, where att is 0.
        for (int t = 0; t < T; t++) {
            const float *row = scores + (size_t)t * T;
            float *g = grad_scores + (size_t)t * T;
            // Over causal_end's whole chunks: att is 0 past t, so the dot product is
            // row_dot's over t + 1 values, in the order row_dot fixes for `end`.
            const int n = t + 1, end = causal_end(n, T);
            float weighted = row_dot(row, g, end);
            for (int u = 0; u < end; u++) g[u] = u < n ? row[u] * (g[u] - weighted) * scale : 0.0f;
            for (int u = end; u < T; u++) g[u] = 0.0f;
        }
        // scores = q k^T: dq = d score k, dk = d score^T q
        const float *grad_scores_used = pair_operand(grad_scores, T, bf16);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, 1.0f, grad_scores_used, T, k, stride, 0.0f,
                    grad_q, stride);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, 1.0f, grad_scores_used, T, q, stride, 0.0f,
                    grad_k, stride);
    }
}

void dropout_mask(Rng *rng, double p, long n, float *mask) {
    const double keep = 1.0 - p;
    const float scale = 1.0f / (float)keep;  // noise.div_(1 - p): 1 / (1 - p) as a float division
    for (long i = 0; i < n; i++) {
        uint64_t high = rng_next_u32(rng), low = rng_next_u32(rng);
        double u = (double)(((high << 32) | low) & ((1ULL << 53) - 1)) * 0x1p-53;  // uniform_real_distribution<double>
        mask[i] = u < keep ? scale : 0.0f;
    }
}

CPU_DISPATCHED static void cpu_multiply(float *x, const float *mask, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) x[i] *= mask[i];
}

CPU_DISPATCHED static void cpu_add(const float *a, const float *b, long n, float *out) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) out[i] = a[i] + b[i];
}

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

// erf and exp as plain arithmetic that the compiler vectorises (libm's erff and expf are calls,
// one value at a time, and were a fifth of a training step). PyTorch's own vectorised GELU does
// the same with its approximations (Vectorized<float>::erf).
//
// erf: the rational approximation of Eigen and XLA (an odd polynomial of degree 13 over an even
// one of degree 8, x clamped to [-4, 4], beyond which erf is +-1 in float): within 4.2e-7 of erf
// over the floats in [-10, 10] (libm's erff: 4.5e-8; the twin's losses agree within 1e-7 either way).
static inline float erf_rational(float a) {
    float x = a > 4.0f ? 4.0f : (a < -4.0f ? -4.0f : a);
    float x2 = x * x;
    float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = x2 * p + -2.10102402082508e-06f;
    p = x2 * p + -5.69250639462346e-05f;
    p = x2 * p + -7.34990630326855e-04f;
    p = x2 * p + -2.95459980854025e-03f;
    p = x2 * p + -1.60960333262415e-02f;
    float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
    q = x2 * q + -1.68282697438203e-03f;
    q = x2 * q + -7.37332916720468e-03f;
    q = x2 * q + -1.42647390514189e-02f;
    return x * p / q;
}

CPU_DISPATCHED static void cpu_gelu_forward(const float *x, long n, float *y) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erf_rational(x[i] * INV_SQRT2));
}

CPU_DISPATCHED static void cpu_gelu_backward(const float *x, const float *grad_y, long n, float *grad_x) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float cdf = 0.5f * (1.0f + erf_rational(x[i] * INV_SQRT2));
        float pdf = INV_SQRT_2PI * exp_nonpositive(-0.5f * x[i] * x[i]);
        grad_x[i] = grad_y[i] * (cdf + x[i] * pdf);
    }
}

CPU_DISPATCHED static void cpu_embedding_forward(const int *tokens, const float *wte, const float *wpe, int B, int T,
                                                 int C, float *x) {
#pragma omp parallel for schedule(static)
    for (int row = 0; row < B * T; row++) {
        const float *token = wte + (size_t)tokens[row] * C, *position = wpe + (size_t)(row % T) * C;
        float *out = x + (size_t)row * C;
        for (int c = 0; c < C; c++) out[c] = token[c] + position[c];
    }
}

// Threads own blocks of columns of both tables and walk every row in order: each table row's
// sum over its tokens is then in token order, whatever the thread count, and no two threads
// write one value (a thread per token row would race where a character repeats).
CPU_DISPATCHED static void cpu_embedding_backward(const int *tokens, const float *grad_x, int B, int T, int C,
                                                  float *grad_wte, float *grad_wpe) {
    int blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int first = block * COLUMN_BLOCK, n = C - first < COLUMN_BLOCK ? C - first : COLUMN_BLOCK;
        for (int row = 0; row < B * T; row++) {
            const float *g = grad_x + (size_t)row * C + first;
            float *token = grad_wte + (size_t)tokens[row] * C + first;
            float *position = grad_wpe + (size_t)(row % T) * C + first;
            for (int c = 0; c < n; c++) {
                token[c] += g[c];
                position[c] += g[c];
            }
        }
    }
}

// ------------------------------------------------------------------ the operations on Tensors: CPU or GPU

static bool same_device(const Tensor *a, const Tensor *b) { return !b || a->device == b->device; }

void layernorm_forward(const Tensor *x, const Tensor *weight, const Tensor *bias, Tensor *y, Tensor *mean,
                       Tensor *rstd) {
    const int rows = x->rows, cols = x->cols;
    CHECK(tensor_numel(weight) == (size_t)cols && (!bias || tensor_numel(bias) == (size_t)cols) &&
              y->rows == rows && y->cols == cols && tensor_numel(mean) >= (size_t)rows && tensor_numel(rstd) >= (size_t)rows,
          "layernorm_forward: x [%d, %d], weight %zu, y [%d, %d], mean %zu", rows, cols, tensor_numel(weight), y->rows,
          y->cols, tensor_numel(mean));
    CHECK(same_device(x, weight) && same_device(x, bias) && same_device(x, y) && same_device(x, mean) &&
              same_device(x, rstd), "layernorm_forward: operands on different devices");
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_layernorm_forward(x->data, weight->data, bias ? bias->data : NULL, rows, cols, y->data, mean->data,
                              rstd->data, device_stream());
#endif
        return;
    }
    cpu_layernorm_forward(x->data, weight->data, bias ? bias->data : NULL, rows, cols, y->data, mean->data, rstd->data);
}

void layernorm_backward(const Tensor *x, const Tensor *weight, const Tensor *mean, const Tensor *rstd,
                        const Tensor *grad_y, Tensor *grad_x, Tensor *grad_weight, Tensor *grad_bias) {
    const int rows = x->rows, cols = x->cols;
    CHECK(tensor_numel(weight) == (size_t)cols && tensor_numel(grad_weight) == (size_t)cols &&
              (!grad_bias || tensor_numel(grad_bias) == (size_t)cols) && grad_y->rows == rows && grad_y->cols == cols &&
              grad_x->rows == rows && grad_x->cols == cols && tensor_numel(mean) >= (size_t)rows &&
              tensor_numel(rstd) >= (size_t)rows,
          "layernorm_backward: x [%d, %d], grad_y [%d, %d], grad_x [%d, %d]", rows, cols, grad_y->rows, grad_y->cols,
          grad_x->rows, grad_x->cols);
    CHECK(same_device(x, weight) && same_device(x, mean) && same_device(x, rstd) && same_device(x, grad_y) &&
              same_device(x, grad_x) && same_device(x, grad_weight) && same_device(x, grad_bias),
          "layernorm_backward: operands on different devices");
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_layernorm_backward(x->data, weight->data, mean->data, rstd->data, grad_y->data, rows, cols, grad_x->data,
                               grad_weight->data, grad_bias ? grad_bias->data : NULL, device_stream());
#endif
        return;
    }
    cpu_layernorm_backward(x->data, weight->data, mean->data, rstd->data, grad_y->data, rows, cols, grad_x->data,
                           grad_weight->data, grad_bias ? grad_bias->data : NULL);
}

static void check_attention(const char *what, const Tensor *qkv, int B, int T, int n_head, const Tensor *att,
                            const Tensor *dropout_mask, const Tensor *att_dropped, const Tensor *y) {
    const size_t scores = (size_t)B * n_head * T * T;
    CHECK(qkv->rows == B * T && qkv->cols % 3 == 0 && (qkv->cols / 3) % n_head == 0 && y->rows == B * T &&
              y->cols == qkv->cols / 3 && tensor_numel(att) >= scores && (!dropout_mask) == (!att_dropped) &&
              (!dropout_mask || (tensor_numel(dropout_mask) >= scores && tensor_numel(att_dropped) >= scores)),
          "%s: qkv [%d, %d], y [%d, %d], %d heads of %d sequences of %d, attention buffer of %zu", what, qkv->rows,
          qkv->cols, y->rows, y->cols, n_head, B, T, tensor_numel(att));
    CHECK(same_device(qkv, att) && same_device(qkv, y) && same_device(qkv, dropout_mask) && same_device(qkv, att_dropped),
          "%s: operands on different devices", what);
}

#if HAVE_CUDA
// Row-major C_p = alpha op(A_p) op(B_p) + beta C_p for every (sequence, head) pair p = b n_head + h
// of a batch, in one cuBLAS call: operand X_p at x + b x_outer + h x_inner (head h's q, k, v and y
// are the columns h * head_dim .. of their sequence's rows; its probabilities a T x T square), its
// address written on the GPU by a kernel into cuBLAS's pointer arrays (pair_pointers, one scratch:
// the calls are in stream order). The operands swapped as tensor.c's gemm swaps them (a row-major
// matrix is its column-major transpose). One call for the B n_head products, where a batch of heads
// per sequence took B calls: at nanoGPT's B = 64, the launches were most of the attention's time.
// With bfloat16 matmuls (tensor.h) A and B are bfloat16 copies (element_bytes 2), which the caller
// rounds (gpu_pair_operand), each tensor once for all the products that read it, and
// cublasGemmBatchedEx multiplies them with float32 sums, as tensor.c's gemm does.
static DeviceBuffer g_pair_pointers;

static void gemm_pairs(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const void *a, int lda,
                       long long a_outer, long long a_inner, const void *b, int ldb, long long b_outer,
                       long long b_inner, float beta, float *c, int ldc, long long c_outer, long long c_inner, int B,
                       int n_head) {
    const int pairs = B * n_head;
    const bool bf16 = matmul_dtype() == MATMUL_BFLOAT16;
    cudaStream_t stream = device_stream();
    const void **pointers = device_buffer_reserve(&g_pair_pointers, 3 * (size_t)pairs * sizeof(void *));
    const void **a_array = pointers, **b_array = pointers + pairs;
    float **c_array = (float **)(pointers + 2 * pairs);
    gpu_pair_pointers(a, a_outer, a_inner, b, b_outer, b_inner, bf16 ? 2 : 4, c, c_outer, c_inner, n_head, pairs,
                      a_array, b_array, c_array, stream);
    if (bf16)
        CHECK_CUBLAS(cublasGemmBatchedEx(device_cublas(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b_array, CUDA_R_16BF,
                                         ldb, a_array, CUDA_R_16BF, lda, &beta, (void *const *)c_array, CUDA_R_32F, ldc,
                                         pairs, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        CHECK_CUBLAS(cublasSgemmBatched(device_cublas(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
                                        (const float *const *)b_array, ldb, (const float *const *)a_array, lda, &beta,
                                        c_array, ldc, pairs));
}

// The batched products' operands with bfloat16 matmuls: slot 0 qkv's copy, 1 the probabilities' (or
// their gradient's), 2 y's gradient's. Each is rounded once per attention_forward or _backward:
// qkv's once for q, k and v, where each product rounded both of its operands (q's and k's extents
// each nearly the whole of qkv), which made the rounding about a third of a bfloat16 step's time.
static DeviceBuffer g_pair_bf16[3];

// x [n] as the products read it: x itself with float32 matmuls, else its bfloat16 copy in `slot`.
static const void *gpu_pair_operand(int slot, const float *x, size_t n) {
    if (matmul_dtype() != MATMUL_BFLOAT16) return x;
    uint16_t *copy = device_buffer_reserve(&g_pair_bf16[slot], n * sizeof(uint16_t));
    gpu_round_to_bfloat16(x, n, copy, device_stream());
    return copy;
}

// The element `offset` floats into an operand of gpu_pair_operand's.
static const void *operand_at(const void *x, size_t offset) {
    return (const char *)x + offset * (matmul_dtype() == MATMUL_BFLOAT16 ? 2 : 4);
}
#endif

void attention_forward(const Tensor *qkv, int B, int T, int n_head, Tensor *att, const Tensor *dropout_mask,
                       Tensor *att_dropped, Tensor *y) {
    check_attention("attention_forward", qkv, B, T, n_head, att, dropout_mask, att_dropped, y);
    const int C = y->cols;
    if (tensor_on_gpu(qkv)) {
#if HAVE_CUDA
        // The CPU's products, per sequence a batch of its heads: scores = q k^T / sqrt(head_dim),
        // the causal softmax over every row at once, then y = att v (or (att * mask) v).
        const int head_dim = C / n_head, stride = 3 * C;
        const float scale = 1.0f / sqrtf((float)head_dim);
        const long long square = (long long)T * T, sequence = (long long)T * stride;  // a pair's [T, T]; a sequence's qkv
        const void *q = gpu_pair_operand(0, qkv->data, tensor_numel(qkv)), *k = operand_at(q, C), *v = operand_at(q, 2 * C);
        gemm_pairs(false, true, T, T, head_dim, scale, q, stride, sequence, head_dim, k, stride, sequence, head_dim, 0.0f,
                   att->data, T, n_head * square, square, B, n_head);
        gpu_causal_softmax(att->data, B * n_head, T, device_stream());
        const size_t scores = (size_t)B * n_head * square;
        const float *weights = att->data;
        if (dropout_mask) {
            gpu_multiply(att->data, dropout_mask->data, scores, att_dropped->data, device_stream());
            weights = att_dropped->data;
        }
        gemm_pairs(false, false, T, head_dim, T, 1.0f, gpu_pair_operand(1, weights, scores), T, n_head * square, square,
                   v, stride, sequence, head_dim, 0.0f, y->data, C, (long long)T * C, head_dim, B, n_head);
#endif
        return;
    }
    cpu_attention_forward(qkv->data, B, T, C, n_head, att->data, dropout_mask ? dropout_mask->data : NULL,
                          att_dropped ? att_dropped->data : NULL, y->data);
}

void attention_backward(const Tensor *qkv, const Tensor *att, const Tensor *dropout_mask, const Tensor *att_dropped,
                        const Tensor *grad_y, int B, int T, int n_head, Tensor *grad_att, Tensor *grad_qkv) {
    check_attention("attention_backward", qkv, B, T, n_head, att, dropout_mask, att_dropped, grad_y);
    CHECK(grad_qkv->rows == qkv->rows && grad_qkv->cols == qkv->cols && tensor_numel(grad_att) >= (size_t)B * n_head * T * T &&
              same_device(qkv, grad_qkv) && same_device(qkv, grad_att),
          "attention_backward: grad_qkv [%d, %d] for qkv [%d, %d], scratch of %zu", grad_qkv->rows, grad_qkv->cols,
          qkv->rows, qkv->cols, tensor_numel(grad_att));
    const int C = grad_y->cols;
    if (tensor_on_gpu(qkv)) {
#if HAVE_CUDA
        const int head_dim = C / n_head, stride = 3 * C;
        const float scale = 1.0f / sqrtf((float)head_dim);
        const long long square = (long long)T * T, sequence = (long long)T * stride, pairs_square = n_head * square;
        const size_t n = (size_t)B * pairs_square;
        // What multiplied v, and q, k, v, and dy: each rounded once with bfloat16 matmuls.
        const void *weights = gpu_pair_operand(1, dropout_mask ? att_dropped->data : att->data, n);
        const void *q = gpu_pair_operand(0, qkv->data, tensor_numel(qkv)), *k = operand_at(q, C), *v = operand_at(q, 2 * C);
        const void *gy = gpu_pair_operand(2, grad_y->data, tensor_numel(grad_y));
        float *grad_q = grad_qkv->data, *grad_k = grad_q + C, *grad_v = grad_q + 2 * C;
        // y = weights v: d weights = dy v^T, dv = weights^T dy.
        gemm_pairs(false, true, T, T, head_dim, 1.0f, gy, C, (long long)T * C, head_dim, v, stride, sequence, head_dim,
                   0.0f, grad_att->data, T, pairs_square, square, B, n_head);
        gemm_pairs(true, false, T, head_dim, T, 1.0f, weights, T, pairs_square, square, gy, C, (long long)T * C,
                   head_dim, 0.0f, grad_v, stride, sequence, head_dim, B, n_head);
        if (dropout_mask) gpu_multiply(grad_att->data, dropout_mask->data, n, grad_att->data, device_stream());
        gpu_causal_softmax_backward(att->data, grad_att->data, B * n_head, T, scale, device_stream());
        // scores = q k^T: dq = d score k, dk = d score^T q (d score rounded where the weights were).
        const void *grad_scores = gpu_pair_operand(1, grad_att->data, n);
        gemm_pairs(false, false, T, head_dim, T, 1.0f, grad_scores, T, pairs_square, square, k, stride, sequence,
                   head_dim, 0.0f, grad_q, stride, sequence, head_dim, B, n_head);
        gemm_pairs(true, false, T, head_dim, T, 1.0f, grad_scores, T, pairs_square, square, q, stride, sequence,
                   head_dim, 0.0f, grad_k, stride, sequence, head_dim, B, n_head);
#endif
        return;
    }
    cpu_attention_backward(qkv->data, att->data, dropout_mask ? dropout_mask->data : NULL,
                           att_dropped ? att_dropped->data : NULL, grad_y->data, B, T, C, n_head, grad_att->data,
                           grad_qkv->data);
}

// dropout_draw's host copy of a mask on its way to the GPU, grown to the largest.
static float *g_mask_staging;
static long g_mask_staging_count;

void dropout_draw(Rng *rng, double p, long n, Tensor *mask) {
    CHECK(n >= 0 && (size_t)n <= tensor_numel(mask), "dropout_draw: %ld values into a mask of %zu", n, tensor_numel(mask));
    if (!tensor_on_gpu(mask)) {
        dropout_mask(rng, p, n, mask->data);
        return;
    }
    if (n > g_mask_staging_count) {
        free(g_mask_staging);
        g_mask_staging = xmalloc((size_t)n * sizeof(float));
        g_mask_staging_count = n;
    }
    dropout_mask(rng, p, n, g_mask_staging);
    Tensor drawn = tensor_view(mask, 1, (int)n);
    tensor_from_host(&drawn, g_mask_staging);
}

CPU_DISPATCHED static void cpu_dropout_philox(uint32_t key0, uint32_t key1, uint64_t stream, float keep, float scale,
                                              long first, long length, long stride, long runs, float *mask) {
    const long evaluations = runs * (long)philox_run_evaluations((uint64_t)length);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < evaluations; i++)  // four values per evaluation
        philox_dropout_part_evaluation((uint64_t)i, (uint64_t)runs, key0, key1, stream, keep, scale, (uint64_t)first,
                                       (uint64_t)length, (uint64_t)stride, mask);
}

void dropout_philox_part(uint64_t seed, uint64_t stream, double p, long first, long length, long stride, long runs,
                         Tensor *mask) {
    CHECK(first >= 0 && length >= 0 && runs >= 0 && (runs <= 1 || stride >= length) &&
              (size_t)(length * runs) <= tensor_numel(mask),
          "dropout_philox: %ld runs of %ld values (from %ld, every %ld) into a mask of %zu", runs, length, first, stride,
          tensor_numel(mask));
    const float keep = (float)(1.0 - p), scale = 1.0f / (float)(1.0 - p);  // as dropout_mask's
    if (tensor_on_gpu(mask)) {
#if HAVE_CUDA
        gpu_dropout_philox((uint32_t)seed, (uint32_t)(seed >> 32), stream, keep, scale, (uint64_t)first,
                           (uint64_t)length, (uint64_t)stride, (size_t)runs, mask->data, device_stream());
#endif
        return;
    }
    cpu_dropout_philox((uint32_t)seed, (uint32_t)(seed >> 32), stream, keep, scale, first, length, stride, runs,
                       mask->data);
}

void dropout_philox(uint64_t seed, uint64_t stream, double p, long n, Tensor *mask) {
    dropout_philox_part(seed, stream, p, 0, n, n, 1, mask);
}

void multiply_by_mask(Tensor *x, const Tensor *mask) {
    size_t n = tensor_numel(x);
    CHECK(tensor_numel(mask) >= n && same_device(x, mask), "multiply_by_mask: %zu values, a mask of %zu", n,
          tensor_numel(mask));
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_multiply(x->data, mask->data, n, x->data, device_stream());
#endif
        return;
    }
    cpu_multiply(x->data, mask->data, (long)n);
}

void add_elementwise(const Tensor *a, const Tensor *b, Tensor *out) {
    size_t n = tensor_numel(out);
    CHECK(tensor_numel(a) == n && tensor_numel(b) == n && same_device(out, a) && same_device(out, b),
          "add_elementwise: %zu + %zu values into %zu", tensor_numel(a), tensor_numel(b), n);
    if (tensor_on_gpu(out)) {
#if HAVE_CUDA
        gpu_add(a->data, b->data, n, out->data, device_stream());
#endif
        return;
    }
    cpu_add(a->data, b->data, (long)n, out->data);
}

void gelu_forward(const Tensor *x, Tensor *y) {
    size_t n = tensor_numel(x);
    CHECK(tensor_numel(y) == n && same_device(x, y), "gelu_forward: %zu values into %zu", n, tensor_numel(y));
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_gelu_forward(x->data, n, y->data, device_stream());
#endif
        return;
    }
    cpu_gelu_forward(x->data, (long)n, y->data);
}

void gelu_backward(const Tensor *x, const Tensor *grad_y, Tensor *grad_x) {
    size_t n = tensor_numel(x);
    CHECK(tensor_numel(grad_y) == n && tensor_numel(grad_x) == n && same_device(x, grad_y) && same_device(x, grad_x),
          "gelu_backward: %zu values, gradients of %zu and %zu", n, tensor_numel(grad_y), tensor_numel(grad_x));
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_gelu_backward(x->data, grad_y->data, n, grad_x->data, device_stream());
#endif
        return;
    }
    cpu_gelu_backward(x->data, grad_y->data, (long)n, grad_x->data);
}

TokenBatch token_batch_new(int capacity, int vocab_size, Device device) {
    TokenBatch batch = {.capacity = capacity, .vocab_size = vocab_size, .device = device};
    bool gpu = HAVE_CUDA && device == DEVICE_CUDA;
    size_t count = gpu ? 2 * (size_t)capacity + (size_t)vocab_size + 1 : (size_t)capacity;
    batch.index = int_buffer_new(count, device);
    if (gpu) batch.host_index = xmalloc(count * sizeof(int));
    batch.tokens = batch.index.data;
    return batch;
}

void token_batch_set(TokenBatch *batch, const int *tokens, int n) {
    CHECK(n >= 0 && n <= batch->capacity, "token_batch_set: %d tokens, room for %d", n, batch->capacity);
    for (int i = 0; i < n; i++)
        CHECK(tokens[i] >= 0 && tokens[i] < batch->vocab_size, "token %d at %d: not in the vocabulary of %d", tokens[i],
              i, batch->vocab_size);
    batch->n = n;
    if (!batch->host_index) {  // the CPU's backward walks the tokens themselves
        int_buffer_from_host(&batch->index, tokens, (size_t)n);
        return;
    }
    // [tokens | row_start | positions]: a stable counting sort of the positions by token, row_start
    // from the counts, then each position in increasing order into its token's run.
    const int V = batch->vocab_size;
    int *host = batch->host_index, *row_start = host + n, *positions = row_start + V + 1;
    memcpy(host, tokens, (size_t)n * sizeof(int));
    memset(row_start, 0, ((size_t)V + 1) * sizeof(int));
    for (int i = 0; i < n; i++) row_start[tokens[i] + 1]++;
    for (int v = 0; v < V; v++) row_start[v + 1] += row_start[v];
    for (int i = 0; i < n; i++) positions[row_start[tokens[i]]++] = i;
    for (int v = V; v > 0; v--) row_start[v] = row_start[v - 1];  // each run's end back to its start
    row_start[0] = 0;
    int_buffer_from_host(&batch->index, host, 2 * (size_t)n + (size_t)V + 1);  // one copy, no host wait
    batch->row_start = batch->index.data + n;
    batch->positions = batch->row_start + V + 1;
}

void token_batch_free(TokenBatch *batch) {
    int_buffer_free(&batch->index);
    free(batch->host_index);
    *batch = (TokenBatch){0};
}

static void check_embedding(const char *what, const TokenBatch *tokens, const Tensor *wte, const Tensor *wpe, int B,
                            int T, const Tensor *x) {
    CHECK(tokens->n == B * T && x->rows == B * T && wte->cols == x->cols && wpe->cols == x->cols &&
              wte->rows == tokens->vocab_size && wpe->rows >= T,
          "%s: %d tokens for [%d, %d], x [%d, %d], wte [%d, %d], wpe [%d, %d]", what, tokens->n, B, T, x->rows, x->cols,
          wte->rows, wte->cols, wpe->rows, wpe->cols);
    CHECK(tokens->device == x->device && same_device(x, wte) && same_device(x, wpe), "%s: operands on different devices",
          what);
}

void embedding_forward(const TokenBatch *tokens, const Tensor *wte, const Tensor *wpe, int B, int T, Tensor *x) {
    check_embedding("embedding_forward", tokens, wte, wpe, B, T, x);
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_embedding_forward(tokens->tokens, wte->data, wpe->data, B, T, x->cols, x->data, device_stream());
#endif
        return;
    }
    cpu_embedding_forward(tokens->tokens, wte->data, wpe->data, B, T, x->cols, x->data);
}

void embedding_backward(const TokenBatch *tokens, const Tensor *grad_x, int B, int T, Tensor *grad_wte,
                        Tensor *grad_wpe) {
    check_embedding("embedding_backward", tokens, grad_wte, grad_wpe, B, T, grad_x);
    if (tensor_on_gpu(grad_x)) {
#if HAVE_CUDA
        gpu_embedding_backward_tables(grad_x->data, tokens->row_start, tokens->positions, tokens->vocab_size, B,
                                      T, grad_x->cols, grad_wte->data, grad_wpe->data, device_stream());
#endif
        return;
    }
    cpu_embedding_backward(tokens->tokens, grad_x->data, B, T, grad_x->cols, grad_wte->data, grad_wpe->data);
}
