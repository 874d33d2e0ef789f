// tensor_ops.c: tensor-level operations, each on the CPU's threads or as one
// CUDA kernel, the choice made once per operation. See tensor_ops.h.
#include "tensor_ops.h"

#include <math.h>
#include <stdlib.h>

#include "check.h"
#if HAVE_CUDA
#include "kernels.h"
#endif

// ------------------------------------------------------------------ the MLP's operations

void add_column_bias(Tensor *y, const Tensor *bias, bool relu) {
    CHECK(bias->rows == 1 && bias->cols == y->cols && bias->device == y->device, "column bias [%d, %d] for [%d, %d]",
          bias->rows, bias->cols, y->rows, y->cols);
    if (tensor_on_gpu(y)) {
#if HAVE_CUDA
        gpu_bias_relu(y->data, bias->data, y->rows, y->cols, relu, device_stream());
#endif
        return;
    }
    const float *b = bias->data;
#pragma omp parallel for
    for (int r = 0; r < y->rows; r++) {
        float *row = y->data + (size_t)r * y->cols;
        for (int c = 0; c < y->cols; c++) row[c] += b[c];
        if (relu)
            for (int c = 0; c < y->cols; c++) row[c] = row[c] > 0.0f ? row[c] : 0.0f;
    }
}

void relu_forward(Tensor *x) {
    CHECK(!tensor_on_gpu(x), "relu_forward: CPU tensors only (on the GPU, add_column_bias fuses the ReLU)");
    float *v = x->data;
    size_t n = tensor_numel(x);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) v[i] = v[i] > 0.0f ? v[i] : 0.0f;
}

void relu_backward(const Tensor *y, Tensor *grad) {
    CHECK(tensor_numel(y) == tensor_numel(grad) && y->device == grad->device, "relu_backward: y [%d, %d], grad [%d, %d]",
          y->rows, y->cols, grad->rows, grad->cols);
    if (tensor_on_gpu(grad)) {
#if HAVE_CUDA
        gpu_relu_backward(y->data, grad->data, tensor_numel(grad), device_stream());
#endif
        return;
    }
    const float *out = y->data;
    float *g = grad->data;
    size_t n = tensor_numel(grad);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) g[i] = out[i] > 0.0f ? g[i] : 0.0f;
}

// A sum of per-row (or per-element) terms in index order: the reductions are
// the one place where a thread count could change the bits, so they are not
// shared out.
static double sum_in_order(const double *terms, size_t n) {
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += terms[i];
    return total;
}

#if HAVE_CUDA
// The losses' and argmax's scratch on the GPU: labels or predictions, per-row
// or per-element terms, and their sum. Grown to the largest call, as tensor.c
// keeps its GEMM scratch, and kept for the process's life.
static int *g_indices;
static size_t g_indices_count;
static float *g_terms;
static size_t g_terms_count;
static double *g_sum;

static int *scratch_indices(size_t count) {
    if (count > g_indices_count) {
        device_free(g_indices);
        g_indices = device_alloc(count * sizeof(int));
        g_indices_count = count;
    }
    return g_indices;
}

static float *scratch_terms(size_t count) {
    if (count > g_terms_count) {
        device_free(g_terms);
        g_terms = device_alloc(count * sizeof(float));
        g_terms_count = count;
    }
    if (!g_sum) g_sum = device_alloc(sizeof(double));
    return g_terms;
}

// gpu_sum's result in g_sum, read by the host: like PyTorch's loss.item(), it
// waits for the GPU to get there.
static double read_sum(void) {
    double sum = 0.0;
    CHECK_CUDA(cudaMemcpyAsync(&sum, g_sum, sizeof sum, cudaMemcpyDeviceToHost, device_stream()));
    device_wait_stream(device_stream());
    return sum;
}
#endif

float softmax_cross_entropy(const Tensor *logits, const int *labels, Tensor *grad_logits) {
    CHECK(grad_logits->rows == logits->rows && grad_logits->cols == logits->cols &&
          grad_logits->device == logits->device,
          "cross-entropy: logits [%d, %d], gradient [%d, %d]", logits->rows, logits->cols, grad_logits->rows,
          grad_logits->cols);
    const int rows = logits->rows, classes = logits->cols;
    for (int r = 0; r < rows; r++)
        CHECK(labels[r] >= 0 && labels[r] < classes, "label %d of row %d: not a class of %d", labels[r], r, classes);
    if (tensor_on_gpu(logits)) {
        double total = 0.0;
#if HAVE_CUDA
        cudaStream_t stream = device_stream();
        int *device_labels = scratch_indices((size_t)rows);
        float *row_loss = scratch_terms((size_t)rows);
        CHECK_CUDA(cudaMemcpyAsync(device_labels, labels, (size_t)rows * sizeof(int), cudaMemcpyHostToDevice, stream));
        gpu_cross_entropy(logits->data, device_labels, rows, classes, grad_logits->data, row_loss, stream);
        gpu_sum(row_loss, (size_t)rows, 0, g_sum, stream);
        total = read_sum();
#endif
        return (float)(total / rows);
    }
    // Each row's term on any thread; their sum in row order on one, so that the
    // loss is the same bits whatever the thread count.
    double *terms = xmalloc((size_t)rows * sizeof(double));
    float inv_batch = 1.0f / (float)rows;
#pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        const float *z = logits->data + (size_t)r * classes;
        float *g = grad_logits->data + (size_t)r * classes;
        float max = z[0];
        for (int c = 1; c < classes; c++) max = z[c] > max ? z[c] : max;
        float sum = 0.0f;
        for (int c = 0; c < classes; c++) sum += g[c] = expf(z[c] - max);
        for (int c = 0; c < classes; c++) g[c] = (g[c] / sum) * inv_batch;  // softmax, then / B
        g[labels[r]] -= inv_batch;
        // -log softmax[label] = log-sum-exp - logit, in log_softmax's order:
        // (z - max) first, so large logits lose no digits.
        terms[r] = (double)(logf(sum) - (z[labels[r]] - max));
    }
    double total = sum_in_order(terms, (size_t)rows);
    free(terms);
    return (float)(total / rows);
}

float mse_loss(const Tensor *output, const Tensor *target, Tensor *grad) {
    CHECK(output->rows == target->rows && output->cols == target->cols, "mse: output [%d, %d], target [%d, %d]",
          output->rows, output->cols, target->rows, target->cols);
    CHECK(grad->rows == output->rows && grad->cols == output->cols && grad->device == output->device &&
              target->device == output->device,
          "mse: output [%d, %d], gradient [%d, %d]", output->rows, output->cols, grad->rows, grad->cols);
    size_t n = tensor_numel(output);
    double total = 0.0;
    if (tensor_on_gpu(output)) {
#if HAVE_CUDA
        float *diff = scratch_terms(n);
        gpu_mse(output->data, target->data, n, grad->data, diff, device_stream());
        gpu_sum(diff, n, 1, g_sum, device_stream());
        total = read_sum();
#endif
        return (float)(total / (double)n);
    }
    double *terms = xmalloc(n * sizeof(double));
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float diff = output->data[i] - target->data[i];
        terms[i] = (double)diff * diff;
        grad->data[i] = 2.0f * diff / (float)n;
    }
    total = sum_in_order(terms, n);
    free(terms);
    return (float)(total / (double)n);
}

void argmax_rows(const Tensor *logits, int *predictions) {
    if (tensor_on_gpu(logits)) {
#if HAVE_CUDA
        // argmax on the GPU; only the predictions travel.
        int *device_predictions = scratch_indices((size_t)logits->rows);
        gpu_argmax(logits->data, logits->rows, logits->cols, device_predictions, device_stream());
        CHECK_CUDA(cudaMemcpyAsync(predictions, device_predictions, (size_t)logits->rows * sizeof(int),
                                   cudaMemcpyDeviceToHost, device_stream()));
        device_wait_stream(device_stream());
#endif
        return;
    }
#pragma omp parallel for
    for (int r = 0; r < logits->rows; r++) {
        const float *z = logits->data + (size_t)r * logits->cols;
        int best = 0;
        for (int c = 1; c < logits->cols; c++) best = z[c] > z[best] ? c : best;
        predictions[r] = best;
    }
}

void adam_update(Tensor *param, const Tensor *grad, Tensor *exp_avg, Tensor *exp_avg_sq, const AdamCoefficients *c) {
    size_t n = tensor_numel(param);
    CHECK(tensor_numel(grad) == n && tensor_numel(exp_avg) == n && tensor_numel(exp_avg_sq) == n,
          "adam: parameter [%d, %d], gradient [%d, %d]", param->rows, param->cols, grad->rows, grad->cols);
    if (tensor_on_gpu(param)) {
#if HAVE_CUDA
        gpu_adam(param->data, grad->data, exp_avg->data, exp_avg_sq->data, n, c->step_size, c->bias_correction2_sqrt,
                 c->one_minus_beta1, c->beta2, c->one_minus_beta2, c->eps, device_stream());
#endif
        return;
    }
    const float step_size = c->step_size, bias_correction2_sqrt = c->bias_correction2_sqrt;
    const float one_minus_beta1 = c->one_minus_beta1, beta2 = c->beta2, one_minus_beta2 = c->one_minus_beta2;
    const float eps = c->eps;
    float *p = param->data, *m = exp_avg->data, *v = exp_avg_sq->data;
    const float *g = grad->data;
#pragma omp parallel for
    for (size_t k = 0; k < n; k++) {
        m[k] = m[k] + one_minus_beta1 * (g[k] - m[k]);         // exp_avg.lerp_(grad, 1 - beta1)
        v[k] = v[k] * beta2 + one_minus_beta2 * (g[k] * g[k]);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
        float denom = sqrtf(v[k]) / bias_correction2_sqrt + eps;
        p[k] = p[k] - step_size * (m[k] / denom);               // param.addcdiv_(m, denom, -step_size)
    }
}

void sgd_update(Tensor *param, const Tensor *grad, float lr) {
    size_t n = tensor_numel(param);
    CHECK(tensor_numel(grad) == n, "sgd: parameter [%d, %d], gradient [%d, %d]", param->rows, param->cols, grad->rows,
          grad->cols);
    if (tensor_on_gpu(param)) {
#if HAVE_CUDA
        gpu_sgd(param->data, grad->data, n, lr, device_stream());
#endif
        return;
    }
    float *p = param->data;
    const float *g = grad->data;
#pragma omp parallel for
    for (size_t k = 0; k < n; k++) p[k] -= lr * g[k];
}
