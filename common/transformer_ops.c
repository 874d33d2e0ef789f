// transformer_ops.c: LayerNorm, causal attention, GELU and the embeddings on the CPU. See transformer_ops.h.
#include "transformer_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_dispatch.h"

#define LAYERNORM_EPS 1e-5f

// Rows are independent: each thread takes whole rows, and a row's statistics are summed in
// column order, whatever thread computes them.
CPU_DISPATCHED void layernorm_forward(const float *x, const float *weight, const float *bias, int rows, int cols,
                                      float *y, float *mean, float *rstd) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        float *yr = y + (size_t)r * cols;
        float sum = 0.0f;
        for (int c = 0; c < cols; c++) sum += xr[c];
        float m = sum / (float)cols;
        float var = 0.0f;
        for (int c = 0; c < cols; c++) {
            float d = xr[c] - m;
            var += d * d;
        }
        float s = 1.0f / sqrtf(var / (float)cols + LAYERNORM_EPS);
        for (int c = 0; c < cols; c++) {
            float normalised = (xr[c] - m) * s;
            yr[c] = normalised * weight[c] + (bias ? bias[c] : 0.0f);
        }
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
        const float *xr = x + (size_t)r * cols, *gy = grad_y + (size_t)r * cols;
        float *gx = grad_x + (size_t)r * cols;
        float m = mean[r], s = rstd[r];
        float g_mean = 0.0f, g_xhat_mean = 0.0f;
        for (int c = 0; c < cols; c++) {
            float g = gy[c] * weight[c];
            g_mean += g;
            g_xhat_mean += g * ((xr[c] - m) * s);
        }
        g_mean /= (float)cols;
        g_xhat_mean /= (float)cols;
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

// One (sequence, head) pair per iteration: its q, k and v are its own columns of qkv, its
// scores its own [T, T] block of att, so the pairs run on any threads without sharing a value.
void attention_forward(const float *qkv, int B, int T, int C, int n_head, float *att, float *y) {
    const int head_dim = C / n_head, stride = 3 * C;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for schedule(static)
    for (int pair = 0; pair < B * n_head; pair++) {
        int b = pair / n_head, h = pair % n_head;
        const float *base = qkv + (size_t)b * T * stride + h * head_dim;  // q of (b, 0); k at + C, v at + 2C
        float *scores = att + (size_t)pair * T * T;
        for (int t = 0; t < T; t++) {
            const float *q = base + (size_t)t * stride;
            float *row = scores + (size_t)t * T;
            float max = -INFINITY;
            for (int u = 0; u <= t; u++) {  // the mask: u > t is -inf, which softmax makes 0
                const float *k = base + (size_t)u * stride + C;
                float dot = 0.0f;
                for (int d = 0; d < head_dim; d++) dot += q[d] * k[d];
                row[u] = dot * scale;
                max = row[u] > max ? row[u] : max;
            }
            float sum = 0.0f;
            for (int u = 0; u <= t; u++) sum += row[u] = expf(row[u] - max);
            float inv_sum = 1.0f / sum;
            for (int u = 0; u <= t; u++) row[u] *= inv_sum;
            for (int u = t + 1; u < T; u++) row[u] = 0.0f;
            float *out = y + ((size_t)b * T + t) * C + h * head_dim;
            for (int d = 0; d < head_dim; d++) out[d] = 0.0f;
            for (int u = 0; u <= t; u++) {
                const float *v = base + (size_t)u * stride + 2 * C;
                for (int d = 0; d < head_dim; d++) out[d] += row[u] * v[d];
            }
        }
    }
}

void attention_backward(const float *qkv, const float *att, const float *grad_y, int B, int T, int C, int n_head,
                        float *grad_qkv) {
    const int head_dim = C / n_head, stride = 3 * C;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for schedule(static)
    for (int pair = 0; pair < B * n_head; pair++) {
        int b = pair / n_head, h = pair % n_head;
        const float *base = qkv + (size_t)b * T * stride + h * head_dim;
        float *grad_base = grad_qkv + (size_t)b * T * stride + h * head_dim;
        const float *scores = att + (size_t)pair * T * T;
        float *grad_scores = malloc((size_t)T * sizeof(float));
        CHECK(grad_scores, "out of memory: attention's scores");
        for (int t = 0; t < T; t++)  // this head's q, k and v columns of every position: sums start at 0
            for (int part = 0; part < 3; part++) memset(grad_base + (size_t)t * stride + part * C, 0, head_dim * sizeof(float));
        for (int t = 0; t < T; t++) {
            const float *row = scores + (size_t)t * T;
            const float *gy = grad_y + ((size_t)b * T + t) * C + h * head_dim;
            // y_t = sum_u att[t, u] v_u: d att[t, u] = gy . v_u, and d v_u += att[t, u] gy.
            float weighted = 0.0f;  // sum_u att[t, u] * d att[t, u], for the softmax's backward
            for (int u = 0; u <= t; u++) {
                const float *v = base + (size_t)u * stride + 2 * C;
                float *gv = grad_base + (size_t)u * stride + 2 * C;
                float dot = 0.0f;
                for (int d = 0; d < head_dim; d++) {
                    dot += gy[d] * v[d];
                    gv[d] += row[u] * gy[d];
                }
                grad_scores[u] = dot;
                weighted += row[u] * dot;
            }
            // Softmax's backward, then the scale: d score[t, u] = att (d att - weighted) / sqrt(head_dim).
            const float *q = base + (size_t)t * stride;
            float *gq = grad_base + (size_t)t * stride;
            for (int u = 0; u <= t; u++) {
                float g = row[u] * (grad_scores[u] - weighted) * scale;
                const float *k = base + (size_t)u * stride + C;
                float *gk = grad_base + (size_t)u * stride + C;
                for (int d = 0; d < head_dim; d++) {
                    gq[d] += g * k[d];
                    gk[d] += g * q[d];
                }
            }
        }
        free(grad_scores);
    }
}

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

CPU_DISPATCHED void gelu_forward(const float *x, long n, float *y) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * INV_SQRT2));
}

CPU_DISPATCHED void gelu_backward(const float *x, const float *grad_y, long n, float *grad_x) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float cdf = 0.5f * (1.0f + erff(x[i] * INV_SQRT2));
        float pdf = INV_SQRT_2PI * expf(-0.5f * x[i] * x[i]);
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
