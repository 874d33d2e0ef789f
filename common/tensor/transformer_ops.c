// transformer_ops.c: LayerNorm, causal attention, GELU and the embeddings on the CPU. See transformer_ops.h.
#include "tensor/transformer_ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "base/check.h"
#include "base/cpu_dispatch.h"

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
CPU_DISPATCHED void layernorm_forward(const float *x, const float *weight, const float *bias, int rows, int cols,
                                      float *y, float *mean, float *rstd) {
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

CPU_DISPATCHED void layernorm_backward(const float *x, const float *weight, const float *mean, const float *rstd,
                                       const float *grad_y, int rows, int cols, float *grad_x, float *grad_weight,
                                       float *grad_bias) {
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
    union { int32_t bits; float value; } two_to_n = {.bits = ((int32_t)n + 127) << 23};
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

// One (sequence, head) pair per iteration: its q, k and v are its own columns of qkv, its
// scores its own [T, T] block of att, so the pairs run on any threads without sharing a value.
// Each pair's products are single-threaded sgemms on strided views (row stride 3C for q, k, v;
// C for y), as llm.c's CPU attention loops but with BLAS's kernels: the whole [T, T] block is
// computed and the part above the diagonal then masked, which costs 2x the causal FLOPs of the
// scores but runs at GEMM speed.
CPU_DISPATCHED void attention_forward(const float *qkv, int B, int T, int C, int n_head, float *att, const float *dropout_mask,
                       float *att_dropped, float *y) {
    const int head_dim = C / n_head, stride = 3 * C;
    const float scale = 1.0f / sqrtf((float)head_dim);
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, 1.0f, weights, T, v, stride, 0.0f,
                    y + (size_t)b * T * C + h * head_dim, C);
    }
}

CPU_DISPATCHED void attention_backward(const float *qkv, const float *att, const float *dropout_mask, const float *att_dropped,
                        const float *grad_y, int B, int T, int C, int n_head, float *grad_qkv) {
    const int head_dim = C / n_head, stride = 3 * C;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel
    {
        float *grad_scores = malloc((size_t)T * T * sizeof(float));  // this thread's [T, T]
        CHECK(grad_scores, "out of memory: attention's scores");
#pragma omp for schedule(static)
        for (int pair = 0; pair < B * n_head; pair++) {
            int b = pair / n_head, h = pair % n_head;
            const float *q = qkv + (size_t)b * T * stride + h * head_dim, *k = q + C, *v = q + 2 * C;
            float *grad_q = grad_qkv + (size_t)b * T * stride + h * head_dim, *grad_k = grad_q + C, *grad_v = grad_q + 2 * C;
            const float *scores = att + (size_t)pair * T * T;
            const float *weights = dropout_mask ? att_dropped + (size_t)pair * T * T : scores;  // what multiplied v
            const float *gy = grad_y + (size_t)b * T * C + h * head_dim;
            // y = weights v: d weights = dy v^T, dv = weights^T dy; under dropout, d att = d weights * mask
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, 1.0f, gy, C, v, stride, 0.0f, grad_scores, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, 1.0f, weights, T, gy, C, 0.0f, grad_v, stride);
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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, 1.0f, grad_scores, T, k, stride, 0.0f, grad_q, stride);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, 1.0f, grad_scores, T, q, stride, 0.0f, grad_k, stride);
        }
        free(grad_scores);
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

CPU_DISPATCHED void multiply_by_mask(float *x, const float *mask, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) x[i] *= mask[i];
}

CPU_DISPATCHED void add_elementwise(const float *a, const float *b, long n, float *out) {
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

CPU_DISPATCHED void gelu_forward(const float *x, long n, float *y) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erf_rational(x[i] * INV_SQRT2));
}

CPU_DISPATCHED void gelu_backward(const float *x, const float *grad_y, long n, float *grad_x) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float cdf = 0.5f * (1.0f + erf_rational(x[i] * INV_SQRT2));
        float pdf = INV_SQRT_2PI * exp_nonpositive(-0.5f * x[i] * x[i]);
        grad_x[i] = grad_y[i] * (cdf + x[i] * pdf);
    }
}

CPU_DISPATCHED void embedding_forward(const int *tokens, const float *wte, const float *wpe, int B, int T, int C,
                                      float *x) {
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
CPU_DISPATCHED void embedding_backward(const int *tokens, const float *grad_x, int B, int T, int C, float *grad_wte,
                                       float *grad_wpe) {
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
