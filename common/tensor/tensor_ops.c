// tensor_ops.c: tensor-level operations, each on the CPU's threads or as one
// CUDA kernel, the choice made once per operation. See tensor_ops.h.
#include "tensor/tensor_ops.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/cpu_dispatch.h"
#if HAVE_CUDA
#include "tensor/kernels.h"
#endif

// ------------------------------------------------------------------ the MLP's operations

// Where a writer of t that can keep its rounded copy (tensor.h) writes it: t's room, if it has one,
// with bfloat16 matmuls; NULL otherwise. t's copy is then that (valid once the writer is queued).
static uint16_t *kept_copy(Tensor *t) {
    uint16_t *room = matmul_dtype() == MATMUL_BFLOAT16 ? t->bfloat16_room : NULL;
    t->bfloat16_copy = room;
    return room;
}

CPU_DISPATCHED void add_column_bias(Tensor *y, const Tensor *bias, bool relu) {
    CHECK(bias->rows == 1 && bias->cols == y->cols && bias->device == y->device, "column bias [%d, %d] for [%d, %d]",
          bias->rows, bias->cols, y->rows, y->cols);
    uint16_t *rounded = kept_copy(y);
    if (tensor_on_gpu(y)) {
#if HAVE_CUDA
        gpu_bias_relu(y->data, bias->data, y->rows, y->cols, relu, rounded, device_stream());
#endif
        return;
    }
    (void)rounded;  // (a CPU tensor has no room: tensor_keep_bfloat16)
    const float *b = bias->data;
#pragma omp parallel for
    for (int r = 0; r < y->rows; r++) {
        float *row = y->data + (size_t)r * y->cols;
        for (int c = 0; c < y->cols; c++) row[c] += b[c];
        // ReLU as torch.relu: a NaN passes (v <= 0 is false for it), so that a diverged layer shows in
        // the loss (divergence.h) instead of hiding behind zeros; every other value as max(v, 0).
        if (relu)
            for (int c = 0; c < y->cols; c++) row[c] = row[c] <= 0.0f ? 0.0f : row[c];
    }
}

CPU_DISPATCHED void relu_forward(Tensor *x) {
    CHECK(!tensor_on_gpu(x), "relu_forward: CPU tensors only (on the GPU, add_column_bias fuses the ReLU)");
    float *v = x->data;
    size_t n = tensor_numel(x);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) v[i] = v[i] <= 0.0f ? 0.0f : v[i];  // a NaN passes (add_column_bias)
}

CPU_DISPATCHED void relu_backward(const Tensor *y, Tensor *grad) {
    CHECK(tensor_numel(y) == tensor_numel(grad) && y->device == grad->device, "relu_backward: y [%d, %d], grad [%d, %d]",
          y->rows, y->cols, grad->rows, grad->cols);
    uint16_t *rounded = kept_copy(grad);
    if (tensor_on_gpu(grad)) {
#if HAVE_CUDA
        gpu_relu_backward(y->data, grad->data, tensor_numel(grad), rounded, device_stream());
#endif
        return;
    }
    (void)rounded;
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
static DeviceBuffer g_indices, g_terms;
static double *g_sum;

static int *scratch_indices(size_t count) { return device_buffer_reserve(&g_indices, count * sizeof(int)); }

static float *scratch_terms(size_t count) {
    if (!g_sum) g_sum = device_alloc(sizeof(double));
    return device_buffer_reserve(&g_terms, count * sizeof(float));
}

// gpu_sum's result in g_sum, read by the host: like PyTorch's loss.item(), it
// waits for the GPU to get there.
static double read_sum(void) {
    double sum = 0.0;
    device_read_to_host(&sum, g_sum, sizeof sum, "the loss");
    return sum;
}
#endif

CPU_DISPATCHED float softmax_cross_entropy(const Tensor *logits, const int *labels, Tensor *grad_logits) {
    CHECK(grad_logits->rows == logits->rows && grad_logits->cols == logits->cols &&
          grad_logits->device == logits->device,
          "cross-entropy: logits [%d, %d], gradient [%d, %d]", logits->rows, logits->cols, grad_logits->rows,
          grad_logits->cols);
    const int rows = logits->rows, classes = logits->cols;
    for (int r = 0; r < rows; r++)
        CHECK(labels[r] >= 0 && labels[r] < classes, "label %d of row %d: not a class of %d", labels[r], r, classes);
    tensor_drop_bfloat16(grad_logits);
    if (tensor_on_gpu(logits)) {
        double total = 0.0;
#if HAVE_CUDA
        cudaStream_t stream = device_stream();
        int *device_labels = scratch_indices((size_t)rows);
        float *row_loss = scratch_terms((size_t)rows);
        CHECK_CUDA(cudaMemcpyAsync(device_labels, labels, (size_t)rows * sizeof(int), cudaMemcpyHostToDevice, stream));
        gpu_cross_entropy(logits->data, device_labels, rows, classes, grad_logits->data, NULL, row_loss, stream);
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

void softmax_cross_entropy_to(const Tensor *logits, const int *labels, const int *device_labels, Tensor *grad_logits,
                              LossSlot slot) {
    if (!tensor_on_gpu(logits)) {
        float loss = softmax_cross_entropy(logits, labels, grad_logits);
        float term = slot.weight * loss;
        *slot.value = slot.accumulate ? *slot.value + term : term;
        return;
    }
#if HAVE_CUDA
    CHECK(grad_logits->rows == logits->rows && grad_logits->cols == logits->cols &&
          grad_logits->device == logits->device,
          "cross-entropy: logits [%d, %d], gradient [%d, %d]", logits->rows, logits->cols, grad_logits->rows,
          grad_logits->cols);
    const int rows = logits->rows, classes = logits->cols;
    cudaStream_t stream = device_stream();
    float *row_loss = scratch_terms((size_t)rows);
    if (!device_labels) {
        for (int r = 0; r < rows; r++)
            CHECK(labels[r] >= 0 && labels[r] < classes, "label %d of row %d: not a class of %d", labels[r], r, classes);
        int *uploaded = scratch_indices((size_t)rows);
        device_upload(uploaded, labels, (size_t)rows * sizeof(int), "a batch's labels");
        device_labels = uploaded;
    }
    gpu_cross_entropy(logits->data, device_labels, rows, classes, grad_logits->data, kept_copy(grad_logits), row_loss,
                      stream);
    gpu_loss_to_slot(row_loss, rows, slot.weight, slot.accumulate, slot.value, stream);
#else
    (void)labels, (void)device_labels, (void)grad_logits, (void)slot;
#endif
}

CPU_DISPATCHED float mse_loss(const Tensor *output, const Tensor *target, Tensor *grad) {
    CHECK(output->rows == target->rows && output->cols == target->cols, "mse: output [%d, %d], target [%d, %d]",
          output->rows, output->cols, target->rows, target->cols);
    CHECK(grad->rows == output->rows && grad->cols == output->cols && grad->device == output->device &&
              target->device == output->device,
          "mse: output [%d, %d], gradient [%d, %d]", output->rows, output->cols, grad->rows, grad->cols);
    size_t n = tensor_numel(output);
    double total = 0.0;
    tensor_drop_bfloat16(grad);
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
        device_read_to_host(predictions, device_predictions, (size_t)logits->rows * sizeof(int), "the predictions");
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

CPU_DISPATCHED void adam_update(Tensor *param, const Tensor *grad, Tensor *exp_avg, Tensor *exp_avg_sq, const AdamCoefficients *c) {
    size_t n = tensor_numel(param);
    CHECK(tensor_numel(grad) == n && tensor_numel(exp_avg) == n && tensor_numel(exp_avg_sq) == n,
          "adam: parameter [%d, %d], gradient [%d, %d]", param->rows, param->cols, grad->rows, grad->cols);
    tensor_drop_bfloat16(param);
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

// The kernel reads AdamCoefficients as six floats in its fields' order.
_Static_assert(sizeof(AdamCoefficients) == 6 * sizeof(float) && offsetof(AdamCoefficients, eps) == 5 * sizeof(float),
               "AdamCoefficients: six floats, eps last");

#if HAVE_CUDA
struct AdamTensors {
    DeviceTable table;  // gpu_adam_tensors' (device.h)
};
#else
struct AdamTensors {
    int unused;
};
#endif

void adam_update_tensors(AdamTensors **table, Tensor *const *params, Tensor *const *grads, Tensor *exp_avg,
                         Tensor *exp_avg_sq, const bool *decays, int n, const AdamCoefficients *device_c, float keep) {
    if (!*table) *table = xcalloc(1, sizeof **table);
    for (int i = 0; i < n; i++) tensor_drop_bfloat16(params[i]);
#if HAVE_CUDA
    CHECK(!decays || !device_graph_capturing(),
          "adam_update_tensors: AdamW's decay factor is the launch's argument, which a CUDA graph would replay");
    AdamTensor *tensors = xcalloc((size_t)(n > 0 ? n : 1), sizeof *tensors);  // (zeroed, set field by field: device.h)
    size_t blocks = 0;
    for (int i = 0; i < n; i++) {
        size_t count = tensor_numel(params[i]);
        CHECK(tensor_on_gpu(params[i]) && tensor_numel(grads[i]) == count && tensor_numel(&exp_avg[i]) == count &&
                  tensor_numel(&exp_avg_sq[i]) == count,
              "adam_update_tensors: parameter %d [%d, %d] on a GPU, gradient [%d, %d]", i, params[i]->rows,
              params[i]->cols, grads[i]->rows, grads[i]->cols);
        AdamTensor *entry = &tensors[i];
        entry->param = params[i]->data, entry->grad = grads[i]->data, entry->exp_avg = exp_avg[i].data;
        entry->exp_avg_sq = exp_avg_sq[i].data, entry->n = count, entry->first_block = (int)blocks;
        entry->decays = decays && decays[i];
        blocks += gpu_span_blocks(count);
        CHECK(blocks <= INT_MAX, "adam_update_tensors: %zu blocks of values in one launch", blocks);
    }
    const AdamTensor *device_tensors =
        device_table_send(&(*table)->table, tensors, (size_t)n * sizeof *tensors, "adam_update_tensors");
    free(tensors);
    gpu_adam_tensors(device_tensors, n, (int)blocks, (const float *)device_c, keep, device_stream());
#else
    (void)params, (void)grads, (void)exp_avg, (void)exp_avg_sq, (void)decays, (void)n, (void)device_c, (void)keep;
#endif
}

void adam_tensors_free(AdamTensors **table) {
    if (!*table) return;
#if HAVE_CUDA
    device_table_free(&(*table)->table);
#endif
    free(*table);
    *table = NULL;
}

CPU_DISPATCHED void sgd_update(Tensor *param, const Tensor *grad, float lr) {
    size_t n = tensor_numel(param);
    CHECK(tensor_numel(grad) == n, "sgd: parameter [%d, %d], gradient [%d, %d]", param->rows, param->cols, grad->rows,
          grad->cols);
    tensor_drop_bfloat16(param);
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

#if HAVE_CUDA
// sum_of_squares's per-tensor sums on the GPU, grown to the most tensors seen, as scratch_terms.
static DeviceBuffer g_tensor_sums;
// The tensors' spans on the GPU for gpu_sum_squares_each (device.h): a model's gradients, the same
// tensors every step, go over once.
static DeviceTable g_spans;

// device_sums[i] = the sum of tensor i's squares, for every tensor in one launch (queued: no wait).
static void squares_each_on_gpu(Tensor *const *tensors, int n, double *device_sums) {
    FloatSpan *spans = xcalloc((size_t)n, sizeof *spans);  // (zeroed, set field by field: device.h)
    for (int i = 0; i < n; i++) spans[i].data = tensors[i]->data, spans[i].n = tensor_numel(tensors[i]);
    const FloatSpan *device_spans = device_table_send(&g_spans, spans, (size_t)n * sizeof *spans, "the gradients' norm");
    free(spans);
    gpu_sum_squares_each(device_spans, n, device_sums, device_stream());
}
#endif

// Blocks of a fixed size, each a thread's, summed in block order: the same bits on any number of threads.
enum { SQUARES_BLOCK = 4096 };

// The sum of squares of x[0..n) in double, in an order fixed by n: 8 running sums (sum j takes
// x[j], x[j + 8], ...), added pairwise, then the last n % 8 values. One running sum was a chain
// of dependent additions, 4 cycles a value (without -ffast-math the compiler may not reorder
// them): 3% of step 19's training step at 1 thread (perf); 8 lanes vectorise.
CPU_DISPATCHED static double block_sum_of_squares(const float *restrict x, size_t n) {
    enum { LANES = 8 };
    double lane[LANES] = {0};
    size_t k = 0;
    for (; k + LANES <= n; k += LANES)
        for (int j = 0; j < LANES; j++) lane[j] += (double)x[k + j] * x[k + j];
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) lane[j] += lane[j + width];
    double sum = lane[0];
    for (; k < n; k++) sum += (double)x[k] * x[k];
    return sum;
}

double sum_of_squares(Tensor *const *tensors, int n) {
    for (int i = 0; i < n; i++)
        CHECK(tensors[i]->device == tensors[0]->device, "sum_of_squares: tensor %d is on another device than tensor 0", i);
    if (n > 0 && tensor_on_gpu(tensors[0])) {
        double total = 0.0;
#if HAVE_CUDA
        double *device_sums = device_buffer_reserve(&g_tensor_sums, (size_t)n * sizeof(double));
        squares_each_on_gpu(tensors, n, device_sums);
        double *sums = xmalloc((size_t)n * sizeof(double));
        device_read_to_host(sums, device_sums, (size_t)n * sizeof(double), "the gradients' norm");
        total = sum_in_order(sums, (size_t)n);
        free(sums);
#endif
        return total;
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        const float *values = tensors[i]->data;
        size_t count = tensor_numel(tensors[i]);
        long blocks = (long)((count + SQUARES_BLOCK - 1) / SQUARES_BLOCK);
        double *partial = xmalloc((size_t)(blocks ? blocks : 1) * sizeof(double));
#pragma omp parallel for schedule(static)
        for (long b = 0; b < blocks; b++) {
            size_t start = (size_t)b * SQUARES_BLOCK, end = start + SQUARES_BLOCK < count ? start + SQUARES_BLOCK : count;
            partial[b] = block_sum_of_squares(values + start, end - start);
        }
        for (long b = 0; b < blocks; b++) total += partial[b];  // one running sum over every tensor's blocks
        free(partial);
    }
    return total;
}

#if HAVE_CUDA
static DeviceBuffer g_clip_coef;  // scale_to_norm_on_gpu's coefficient (a float), apart from the sums it reads
#endif

double *sum_of_squares_on_gpu(Tensor *const *tensors, int n) {
    CHECK(n > 0 && tensor_on_gpu(tensors[0]), "sum_of_squares_on_gpu: %d tensors, on a GPU", n);
#if HAVE_CUDA
    for (int i = 0; i < n; i++)
        CHECK(tensors[i]->device == tensors[0]->device, "sum_of_squares_on_gpu: tensor %d is on another device than tensor 0", i);
    // The per-tensor sums, then their sum, in one buffer: n doubles and the total after them.
    double *device_sums = device_buffer_reserve(&g_tensor_sums, (size_t)(n + 1) * sizeof(double));
    cudaStream_t stream = device_stream();
    squares_each_on_gpu(tensors, n, device_sums);
    gpu_sum_in_order(device_sums, n, device_sums + n, stream);
    return device_sums + n;
#else
    return NULL;
#endif
}

void scale_to_norm_on_gpu(Tensor *const *tensors, int n, const double *device_squares, double max_norm) {
    CHECK(n > 0 && tensor_on_gpu(tensors[0]), "scale_to_norm_on_gpu: %d tensors, on a GPU", n);
#if HAVE_CUDA
    for (int i = 0; i < n; i++)
        CHECK(tensors[i]->device == tensors[0]->device, "scale_to_norm_on_gpu: tensor %d is on another device than tensor 0", i);
    float *coef = device_buffer_reserve(&g_clip_coef, sizeof(float));
    cudaStream_t stream = device_stream();
    gpu_clip_coef(device_squares, 1, max_norm, coef, stream);  // (a sum of one: the value itself)
    for (int i = 0; i < n; i++) gpu_clip_scale(tensors[i]->data, tensor_numel(tensors[i]), coef, stream);
#else
    (void)device_squares, (void)max_norm;
#endif
}

// ------------------------------------------------------------------ the CNN's operations

Tensor tensor_view(const Tensor *t, int rows, int cols) {
    CHECK(rows >= 0 && cols >= 0 && (size_t)rows * (size_t)cols <= tensor_numel(t),
          "a [%d, %d] view of a [%d, %d] tensor", rows, cols, t->rows, t->cols);
    Tensor view = *t;
    view.rows = rows;
    view.cols = cols;
    return view;
}

IntBuffer int_buffer_new(size_t count, Device device) {
    IntBuffer buffer = {.count = count, .device = device};
    if (HAVE_CUDA && device == DEVICE_CUDA) buffer.data = device_alloc(count * sizeof(int));
    else buffer.data = xcalloc(count ? count : 1, sizeof(int));
    return buffer;
}

void int_buffer_free(IntBuffer *buffer) {
    if (HAVE_CUDA && buffer->device == DEVICE_CUDA) device_free(buffer->data);
    else free(buffer->data);
    *buffer = (IntBuffer){0};
}

void int_buffer_from_host(IntBuffer *buffer, const int *host, size_t n) {
    CHECK(n <= buffer->count, "int_buffer_from_host: %zu values into a buffer of %zu", n, buffer->count);
    if (n == 0) return;
    if (HAVE_CUDA && buffer->device == DEVICE_CUDA) {
#if HAVE_CUDA
        device_upload(buffer->data, host, n * sizeof(int), "a batch's tokens");
#endif
        return;
    }
    memcpy(buffer->data, host, n * sizeof(int));
}

int conv_out_height(const ConvGeometry *g) { return g->height + 2 * g->padding - g->kernel + 1; }
int conv_out_width(const ConvGeometry *g) { return g->width + 2 * g->padding - g->kernel + 1; }

static void check_geometry(const Tensor *x, const ConvGeometry *g, const Tensor *columns, const char *what) {
    int out_h = conv_out_height(g), out_w = conv_out_width(g);
    CHECK(out_h > 0 && out_w > 0, "%s: a %dx%d kernel with padding %d on %dx%d images", what, g->kernel, g->kernel,
          g->padding, g->height, g->width);
    CHECK(x->rows == g->channels && x->cols == g->batch * g->height * g->width,
          "%s: images [%d, %d], expected [%d, %d x %d x %d]", what, x->rows, x->cols, g->channels, g->batch,
          g->height, g->width);
    CHECK(columns->rows == g->channels * g->kernel * g->kernel && columns->cols == g->batch * out_h * out_w,
          "%s: columns [%d, %d], expected [%d, %d]", what, columns->rows, columns->cols,
          g->channels * g->kernel * g->kernel, g->batch * out_h * out_w);
    CHECK(x->device == columns->device, "%s: operands on different devices", what);
}

// ------------------------------------------------------------------ im2col, col2im

// Short rows (14 or 28 floats): loops the compiler vectorises without a call
// or a run-time overlap check (restrict: the two never overlap).
static inline void copy_floats(float *restrict out, const float *restrict in, int n) {
    for (int i = 0; i < n; i++) out[i] = in[i];
}
static inline void add_floats(float *restrict out, const float *restrict in, int n) {
    for (int i = 0; i < n; i++) out[i] += in[i];
}

CPU_DISPATCHED void im2col(const Tensor *x, const ConvGeometry *g, Tensor *columns) {
    check_geometry(x, g, columns, "im2col");
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_im2col(x->data, g->channels, g->batch, g->height, g->width, g->kernel, g->padding, columns->data,
                   device_stream());
#endif
        return;
    }
    const int k = g->kernel, h = g->height, w = g->width, out_h = conv_out_height(g), out_w = conv_out_width(g);
    const int rows = g->channels * k * k;
    // One task per (column row, image): out_h x out_w values, a shifted copy
    // of one image's channel with zeros where the window leaves it.
#pragma omp parallel for collapse(2) schedule(static)
    for (int row = 0; row < rows; row++) {
        for (int b = 0; b < g->batch; b++) {
            int c = row / (k * k), dy = row / k % k, dx = row % k;
            const float *image = x->data + ((size_t)c * g->batch + b) * h * w;
            float *out = columns->data + (size_t)row * columns->cols + (size_t)b * out_h * out_w;
            // Output column x reads image column x + dx - padding: inside the
            // image for x in [x0, x1), a straight copy; zeros on either side.
            int x0 = g->padding - dx > 0 ? g->padding - dx : 0;
            int x1 = w + g->padding - dx < out_w ? w + g->padding - dx : out_w;
            for (int y = 0; y < out_h; y++) {
                int in_y = y + dy - g->padding;
                float *out_row = out + (size_t)y * out_w;
                if (in_y < 0 || in_y >= h || x1 <= x0) {
                    memset(out_row, 0, (size_t)out_w * sizeof(float));
                    continue;
                }
                const float *in_row = image + (size_t)in_y * w + (dx - g->padding);
                for (int x_ = 0; x_ < x0; x_++) out_row[x_] = 0.0f;
                copy_floats(out_row + x0, in_row + x0, x1 - x0);
                for (int x_ = x1; x_ < out_w; x_++) out_row[x_] = 0.0f;
            }
        }
    }
}

CPU_DISPATCHED void col2im(const Tensor *columns, const ConvGeometry *g, Tensor *x) {
    check_geometry(x, g, columns, "col2im");
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_col2im(columns->data, g->channels, g->batch, g->height, g->width, g->kernel, g->padding, x->data,
                   device_stream());
#endif
        return;
    }
    const int k = g->kernel, h = g->height, w = g->width, out_h = conv_out_height(g), out_w = conv_out_width(g);
    // One task per image plane (channel, image): it alone writes the plane, and
    // adds the k x k shifted column planes into it in (dy, dx) order, so every
    // pixel's sum has the same order as the GPU's (a pixel per thread).
#pragma omp parallel for collapse(2) schedule(static)
    for (int c = 0; c < g->channels; c++) {
        for (int b = 0; b < g->batch; b++) {
            float *image = x->data + ((size_t)c * g->batch + b) * h * w;
            memset(image, 0, (size_t)h * w * sizeof(float));
            for (int dy = 0; dy < k; dy++) {
                for (int dx = 0; dx < k; dx++) {
                    int row = (c * k + dy) * k + dx;
                    const float *in = columns->data + (size_t)row * columns->cols + (size_t)b * out_h * out_w;
                    // Output pixel (y, x) of this window offset came from image
                    // pixel (y + dy - padding, x + dx - padding).
                    int y0 = g->padding - dy > 0 ? g->padding - dy : 0;
                    int y1 = h + g->padding - dy < out_h ? h + g->padding - dy : out_h;
                    int x0 = g->padding - dx > 0 ? g->padding - dx : 0;
                    int x1 = w + g->padding - dx < out_w ? w + g->padding - dx : out_w;
                    for (int y = y0; y < y1; y++) {
                        float *image_row = image + (size_t)(y + dy - g->padding) * w + (dx - g->padding);
                        const float *in_row = in + (size_t)y * out_w;
                        add_floats(image_row + x0, in_row + x0, x1 - x0);
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------ per-row bias and sums

CPU_DISPATCHED void add_row_bias(Tensor *y, const Tensor *bias, bool relu) {
    CHECK(bias->rows == 1 && bias->cols == y->rows && bias->device == y->device,
          "row bias [%d, %d] for [%d, %d]", bias->rows, bias->cols, y->rows, y->cols);
    if (tensor_on_gpu(y)) {
#if HAVE_CUDA
        gpu_add_row_bias(y->data, bias->data, y->rows, y->cols, relu, device_stream());
#endif
        return;
    }
    // Blocks of 4096 values, so that a few rows still feed many threads.
    enum { BLOCK = 4096 };
    int blocks = (y->cols + BLOCK - 1) / BLOCK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < y->rows; r++) {
        for (int block = 0; block < blocks; block++) {
            float *row = y->data + (size_t)r * y->cols;
            int end = (block + 1) * BLOCK < y->cols ? (block + 1) * BLOCK : y->cols;
            float b = bias->data[r];
            if (relu)
                for (int c = block * BLOCK; c < end; c++) row[c] = row[c] + b <= 0.0f ? 0.0f : row[c] + b;  // a NaN passes
            else
                for (int c = block * BLOCK; c < end; c++) row[c] += b;
        }
    }
}

#if HAVE_CUDA
// The GPU's sums of long rows leave a sum per chunk of each row here between
// their two kernels (kernels.h): grown to the largest call, as scratch_terms.
static DeviceBuffer g_row_partials;

static double *scratch_row_partials(size_t count) {
    return device_buffer_reserve(&g_row_partials, count * sizeof(double));
}
#endif

CPU_DISPATCHED void add_sum_of_rows(const Tensor *x, Tensor *sums) {
    CHECK(sums->rows == 1 && sums->cols == x->rows && sums->device == x->device,
          "sums of the rows of [%d, %d] into [%d, %d]", x->rows, x->cols, sums->rows, sums->cols);
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        int chunks = gpu_row_sum_chunks(x->cols);
        double *partials = chunks > 1 ? scratch_row_partials((size_t)x->rows * chunks) : NULL;
        gpu_add_sum_of_rows(x->data, x->rows, x->cols, partials, sums->data, device_stream());
#endif
        return;
    }
    // A row per task, summed in double into 16 fixed lanes (vectorised, and
    // the same bits at any thread count), then the lanes in order.
    enum { LANES = 16 };
#pragma omp parallel for schedule(static)
    for (int r = 0; r < x->rows; r++) {
        const float *row = x->data + (size_t)r * x->cols;
        double lane[LANES] = {0};
        int c = 0;
        for (; c + LANES <= x->cols; c += LANES)
            for (int l = 0; l < LANES; l++) lane[l] += row[c + l];
        for (int l = 0; c < x->cols; c++, l++) lane[l] += row[c];
        double total = 0.0;
        for (int l = 0; l < LANES; l++) total += lane[l];
        sums->data[r] = (float)((double)sums->data[r] + total);
    }
}

// ------------------------------------------------------------------ max pooling

// MaxPool2d(2) of one plane, the network's case, written out: four values per
// output, compared in the window's order with the same rule as below.
static void max_pool_2x2_plane(const float *in, int height, int width, int offset, float *out, int *out_index) {
    int out_h = height / 2, out_w = width / 2;
    for (int oy = 0; oy < out_h; oy++) {
        const float *row0 = in + (size_t)(2 * oy) * width, *row1 = row0 + width;
        float *y = out + (size_t)oy * out_w;
        int *index = out_index + (size_t)oy * out_w;
        for (int ox = 0; ox < out_w; ox++) {
            float v[4] = {row0[2 * ox], row0[2 * ox + 1], row1[2 * ox], row1[2 * ox + 1]};
            int at[4] = {2 * oy * width + 2 * ox, 2 * oy * width + 2 * ox + 1, (2 * oy + 1) * width + 2 * ox,
                         (2 * oy + 1) * width + 2 * ox + 1};
            float best_value = v[0];  // v[0] > -inf, or a NaN: taken either way, unless it is -inf itself
            int best = at[0];
            for (int k = 1; k < 4; k++) {
                bool take = v[k] > best_value || v[k] != v[k];
                best_value = take ? v[k] : best_value;
                best = take ? at[k] : best;
            }
            y[ox] = best_value;
            index[ox] = offset + best;
        }
    }
}

CPU_DISPATCHED void max_pool2d(const Tensor *x, int height, int width, int size, Tensor *y, IntBuffer *argmax) {
    int out_h = height / size, out_w = width / size;
    CHECK(size > 0 && out_h > 0 && out_w > 0 && x->cols % (height * width) == 0, "max_pool2d(%d) on %dx%d planes",
          size, height, width);
    int planes = (int)(tensor_numel(x) / ((size_t)height * width));
    size_t n_out = (size_t)planes * out_h * out_w;
    CHECK(tensor_numel(y) == n_out && argmax->count >= n_out && y->device == x->device && argmax->device == x->device,
          "max_pool2d: %d planes of %dx%d into %zu values (%zu indices)", planes, out_h, out_w, tensor_numel(y),
          argmax->count);
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_max_pool2d(x->data, planes, height, width, size, y->data, argmax->data, device_stream());
#endif
        return;
    }
#pragma omp parallel for schedule(static)
    for (int p = 0; p < planes; p++) {
        const float *in = x->data + (size_t)p * height * width;
        if (size == 2) {
            size_t first_out = (size_t)p * out_h * out_w;
            max_pool_2x2_plane(in, height, width, (int)((size_t)p * height * width), y->data + first_out,
                               argmax->data + first_out);
            continue;
        }
        for (int oy = 0; oy < out_h; oy++) {
            float *out = y->data + ((size_t)p * out_h + oy) * out_w;
            int *out_index = argmax->data + ((size_t)p * out_h + oy) * out_w;
            for (int ox = 0; ox < out_w; ox++) {
                // aten's cpu_max_pool: start from the first pixel at -inf, take a
                // larger value or a NaN. Selects, not branches: the compiler
                // vectorises them, and random data mispredicts no branch.
                int best = oy * size * width + ox * size;
                float best_value = -INFINITY;
                for (int dy = 0; dy < size; dy++) {
                    for (int dx = 0; dx < size; dx++) {
                        int index = (oy * size + dy) * width + ox * size + dx;
                        float value = in[index];
                        bool take = value > best_value || value != value;  // value != value: a NaN
                        best_value = take ? value : best_value;
                        best = take ? index : best;
                    }
                }
                out[ox] = best_value;
                out_index[ox] = (int)((size_t)p * height * width + (size_t)best);
            }
        }
    }
}

CPU_DISPATCHED void max_pool2d_backward(const Tensor *grad_y, const IntBuffer *argmax, Tensor *grad_x) {
    CHECK(argmax->count >= tensor_numel(grad_y) && grad_y->device == grad_x->device,
          "max_pool2d_backward: %zu gradients, %zu indices", tensor_numel(grad_y), argmax->count);
    if (tensor_on_gpu(grad_x)) {
#if HAVE_CUDA
        CHECK_CUDA(cudaMemsetAsync(grad_x->data, 0, tensor_numel(grad_x) * sizeof(float), device_stream()));
        gpu_max_pool2d_backward(grad_y->data, argmax->data, tensor_numel(grad_y), grad_x->data, device_stream());
#endif
        return;
    }
    size_t n_in = tensor_numel(grad_x), n_out = tensor_numel(grad_y);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n_in; i++) grad_x->data[i] = 0.0f;
    // Each input pixel is in one window at most: no two writes collide.
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n_out; i++) grad_x->data[argmax->data[i]] = grad_y->data[i];
}

// ------------------------------------------------------------------ flatten

CPU_DISPATCHED void swap_outer_axes(const Tensor *x, int a, int b, int inner, Tensor *y) {
    size_t n = (size_t)a * b * inner;
    CHECK(tensor_numel(x) == n && tensor_numel(y) == n && x->device == y->device,
          "swap_outer_axes: [%d, %d, %d] from %zu into %zu values", a, b, inner, tensor_numel(x), tensor_numel(y));
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        gpu_swap_outer_axes(x->data, a, b, inner, y->data, device_stream());
#endif
        return;
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int j = 0; j < b; j++)
        for (int i = 0; i < a; i++)
            memcpy(y->data + ((size_t)j * a + i) * inner, x->data + ((size_t)i * b + j) * inner,
                   (size_t)inner * sizeof(float));
}
