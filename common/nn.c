// nn.c: layers, MLP, Adam and SGD on the CPU. See nn.h.
#include "nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "profile.h"
#if HAVE_CUDA
#include "kernels.h"
#endif

// ------------------------------------------------------------------ layers

void linear_init(Linear *layer, int in, int out, Rng *rng, Device device) {
    layer->weight = tensor_zeros(out, in, device);
    layer->bias = tensor_zeros(1, out, device);
    layer->grad_weight = tensor_zeros(out, in, device);
    layer->grad_bias = tensor_zeros(1, out, device);
    // kaiming_uniform_(a=sqrt(5)) works out to U(-1/sqrt(in), 1/sqrt(in)); torch
    // computes the bound in double and draws the weight, then the bias.
    // The draws happen on the host, wherever the tensors live.
    float bound = (float)(1.0 / sqrt((double)in));
    float *values = xmalloc(tensor_numel(&layer->weight) * sizeof(float));
    for (size_t i = 0; i < tensor_numel(&layer->weight); i++) values[i] = rng_uniform(rng, -bound, bound);
    tensor_from_host(&layer->weight, values);
    for (int i = 0; i < out; i++) values[i] = rng_uniform(rng, -bound, bound);
    tensor_from_host(&layer->bias, values);
    free(values);
}

void linear_free(Linear *layer) {
    tensor_free(&layer->weight);
    tensor_free(&layer->bias);
    tensor_free(&layer->grad_weight);
    tensor_free(&layer->grad_bias);
}

void linear_forward(const Linear *layer, const Tensor *x, Tensor *y, bool relu) {
    gemm(false, true, 1.0f, x, &layer->weight, 0.0f, y);  // [B, in] @ [in, out]
    const float *bias = layer->bias.data;
    if (tensor_on_gpu(y)) {
#if HAVE_CUDA
        gpu_bias_relu(y->data, bias, y->rows, y->cols, relu, device_stream());
#endif
        return;
    }
#pragma omp parallel for
    for (int r = 0; r < y->rows; r++) {
        float *row = y->data + (size_t)r * y->cols;
        for (int c = 0; c < y->cols; c++) row[c] += bias[c];
        if (relu)
            for (int c = 0; c < y->cols; c++) row[c] = row[c] > 0.0f ? row[c] : 0.0f;
    }
}

void linear_backward(Linear *layer, const Tensor *x, const Tensor *grad_y, Tensor *grad_x) {
    gemm(true, false, 1.0f, grad_y, x, 1.0f, &layer->grad_weight);  // [out, B] @ [B, in]
    add_sum_over_rows(grad_y, &layer->grad_bias);
    if (grad_x) gemm(false, false, 1.0f, grad_y, &layer->weight, 0.0f, grad_x);  // [B, out] @ [out, in]
}

void relu_forward(Tensor *x) {
    CHECK(!tensor_on_gpu(x), "relu_forward: CPU tensors only (linear_forward fuses the ReLU on the GPU)");
    float *v = x->data;
    size_t n = tensor_numel(x);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) v[i] = v[i] > 0.0f ? v[i] : 0.0f;
}

void relu_backward(const Tensor *y, Tensor *grad) {
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

float cross_entropy_forward(const Tensor *logits, const int *labels, Tensor *probs) {
    CHECK(!tensor_on_gpu(logits), "cross_entropy_forward: CPU tensors only (mlp_loss serves the GPU)");
    CHECK(logits->rows == probs->rows && logits->cols == probs->cols, "cross_entropy: probs shape");
    // Each row's term on any thread; their sum in row order on one, so that the
    // loss is the same bits whatever the thread count.
    double *terms = xmalloc((size_t)logits->rows * sizeof(double));
#pragma omp parallel for
    for (int r = 0; r < logits->rows; r++) {
        const float *z = logits->data + (size_t)r * logits->cols;
        float *p = probs->data + (size_t)r * probs->cols;
        float max = z[0];
        for (int c = 1; c < logits->cols; c++) max = z[c] > max ? z[c] : max;
        float sum = 0.0f;
        for (int c = 0; c < logits->cols; c++) sum += p[c] = expf(z[c] - max);
        for (int c = 0; c < logits->cols; c++) p[c] /= sum;
        // -log softmax[label] = log-sum-exp - logit, in log_softmax's order:
        // (z - max) first, so large logits lose no digits.
        terms[r] = (double)(logf(sum) - (z[labels[r]] - max));
    }
    double total = sum_in_order(terms, (size_t)logits->rows);
    free(terms);
    return (float)(total / logits->rows);
}

void cross_entropy_backward(const Tensor *probs, const int *labels, Tensor *grad_logits) {
    CHECK(!tensor_on_gpu(probs), "cross_entropy_backward: CPU tensors only (mlp_loss serves the GPU)");
    float inv_batch = 1.0f / (float)probs->rows;
#pragma omp parallel for
    for (int r = 0; r < probs->rows; r++) {
        const float *p = probs->data + (size_t)r * probs->cols;
        float *g = grad_logits->data + (size_t)r * grad_logits->cols;
        for (int c = 0; c < probs->cols; c++) g[c] = p[c] * inv_batch;
        g[labels[r]] -= inv_batch;
    }
}

// ------------------------------------------------------------------ MLP

Mlp mlp_new(const int *sizes, int n_sizes, int max_batch, Rng *rng, Device device) {
    CHECK(n_sizes >= 2, "an MLP needs at least an input and an output size");
    Mlp model = {.n_layers = n_sizes - 1, .max_batch = max_batch};
    model.layers = xcalloc((size_t)model.n_layers, sizeof(Linear));
    model.outputs = xcalloc((size_t)model.n_layers, sizeof(Tensor));
    model.grad_outputs = xcalloc((size_t)model.n_layers, sizeof(Tensor));
    model.n_params = 2 * model.n_layers;
    model.params = xcalloc((size_t)model.n_params, sizeof(Param));
    for (int i = 0; i < model.n_layers; i++) {
        Linear *layer = &model.layers[i];
        linear_init(layer, sizes[i], sizes[i + 1], rng, device);
        model.outputs[i] = tensor_zeros(max_batch, sizes[i + 1], device);
        model.grad_outputs[i] = tensor_zeros(max_batch, sizes[i + 1], device);
        // nn.Sequential counts the ReLUs too: the Linears are fc.0, fc.2, fc.4...
        Param *w = &model.params[2 * i], *b = &model.params[2 * i + 1];
        *w = (Param){.value = &layer->weight, .grad = &layer->grad_weight};
        *b = (Param){.value = &layer->bias, .grad = &layer->grad_bias};
        snprintf(w->name, sizeof w->name, "fc.%d.weight", 2 * i);
        snprintf(b->name, sizeof b->name, "fc.%d.bias", 2 * i);
    }
    model.probs = tensor_zeros(max_batch, sizes[n_sizes - 1], DEVICE_CPU);
    if (device == DEVICE_CUDA) {
        model.loss_terms = tensor_zeros(max_batch, sizes[n_sizes - 1], device);
        model.loss_sum = device_alloc(sizeof(double));
        model.labels = device_alloc((size_t)max_batch * sizeof(int));
    }
    return model;
}

void mlp_free(Mlp *model) {
    for (int i = 0; i < model->n_layers; i++) {
        linear_free(&model->layers[i]);
        tensor_free(&model->outputs[i]);
        tensor_free(&model->grad_outputs[i]);
    }
    tensor_free(&model->probs);
    tensor_free(&model->loss_terms);
    device_free(model->loss_sum);
    device_free(model->labels);
    free(model->layers);
    free(model->outputs);
    free(model->grad_outputs);
    free(model->params);
    *model = (Mlp){0};
}

const Tensor *mlp_forward(Mlp *model, const Tensor *x) {
    CHECK(x->rows <= model->max_batch, "batch of %d rows, model built for %d", x->rows, model->max_batch);
    profile_push("forward");
    const Tensor *input = x;
    for (int i = 0; i < model->n_layers; i++) {
        model->outputs[i].rows = x->rows;  // this batch's rows of the buffer
        bool relu = i + 1 < model->n_layers;  // a ReLU after every Linear but the last
        linear_forward(&model->layers[i], input, &model->outputs[i], relu);
        input = &model->outputs[i];
    }
    profile_pop();
    return input;
}

#if HAVE_CUDA
// The sum that gpu_sum left in model->loss_sum, read by the host: like
// PyTorch's loss.item(), it waits for the GPU to get there.
static double read_loss_sum(const Mlp *model) {
    double sum = 0.0;
    CHECK_CUDA(cudaMemcpyAsync(&sum, model->loss_sum, sizeof sum, cudaMemcpyDeviceToHost, device_stream()));
    device_wait_stream(device_stream());
    return sum;
}
#endif

float mlp_loss(Mlp *model, const int *labels) {
    profile_push("loss");
    const Tensor *logits = &model->outputs[model->n_layers - 1];
    Tensor *grad_logits = &model->grad_outputs[model->n_layers - 1];
    grad_logits->rows = logits->rows;
    float loss = 0.0f;
    if (tensor_on_gpu(logits)) {
#if HAVE_CUDA
        cudaStream_t stream = device_stream();
        CHECK_CUDA(cudaMemcpyAsync(model->labels, labels, (size_t)logits->rows * sizeof(int), cudaMemcpyHostToDevice,
                                   stream));
        gpu_cross_entropy(logits->data, model->labels, logits->rows, logits->cols, grad_logits->data,
                          model->loss_terms.data, stream);
        gpu_sum(model->loss_terms.data, (size_t)logits->rows, 0, model->loss_sum, stream);
        loss = (float)(read_loss_sum(model) / logits->rows);
#endif
    } else {
        Tensor probs = tensor_rows(&model->probs, logits->rows);
        loss = cross_entropy_forward(logits, labels, &probs);
        cross_entropy_backward(&probs, labels, grad_logits);
    }
    profile_pop();
    return loss;
}

float mlp_mse_loss(Mlp *model, const Tensor *target) {
    profile_push("loss");
    const Tensor *output = &model->outputs[model->n_layers - 1];
    CHECK(output->rows == target->rows && output->cols == target->cols, "mse: output [%d, %d], target [%d, %d]",
          output->rows, output->cols, target->rows, target->cols);
    Tensor *grad = &model->grad_outputs[model->n_layers - 1];
    grad->rows = output->rows;
    size_t n = tensor_numel(output);
    double total = 0.0;
    if (tensor_on_gpu(output)) {
#if HAVE_CUDA
        CHECK(n <= tensor_numel(&model->loss_terms), "mse: %zu elements, room for %zu", n,
              tensor_numel(&model->loss_terms));
        gpu_mse(output->data, target->data, n, grad->data, model->loss_terms.data, device_stream());
        gpu_sum(model->loss_terms.data, n, 1, model->loss_sum, device_stream());
        total = read_loss_sum(model);
#endif
    } else {
        double *terms = xmalloc(n * sizeof(double));
#pragma omp parallel for
        for (size_t i = 0; i < n; i++) {
            float diff = output->data[i] - target->data[i];
            terms[i] = (double)diff * diff;
            grad->data[i] = 2.0f * diff / (float)n;
        }
        total = sum_in_order(terms, n);
        free(terms);
    }
    profile_pop();
    return (float)(total / (double)n);
}

void mlp_scale_loss(Mlp *model, float factor) {
    tensor_scale(&model->grad_outputs[model->n_layers - 1], factor);
}

void mlp_backward(Mlp *model, const Tensor *x, GradReadyHook hook, void *context) {
    profile_push("backward");
    const Tensor *grad_y = &model->grad_outputs[model->n_layers - 1];  // set by mlp_loss
    for (int i = model->n_layers - 1; i >= 0; i--) {
        const Tensor *input = i > 0 ? &model->outputs[i - 1] : x;
        Tensor *grad_x = NULL;
        if (i > 0) {
            grad_x = &model->grad_outputs[i - 1];
            grad_x->rows = x->rows;
        }
        linear_backward(&model->layers[i], input, grad_y, grad_x);
        if (hook) {  // layer i's gradients are final: DDP may send them now
            hook(context, 2 * i + 1);  // fc.<2i>.bias
            hook(context, 2 * i);      // fc.<2i>.weight
        }
        if (grad_x) relu_backward(input, grad_x);
        grad_y = grad_x;
    }
    profile_pop();
}

void mlp_zero_grad(Mlp *model) {
    for (int i = 0; i < model->n_params; i++) tensor_fill(model->params[i].grad, 0.0f);
}

double mlp_accuracy(Mlp *model, const Tensor *x, const int *labels) {
    long correct = 0;
    int *predictions = xmalloc((size_t)model->max_batch * sizeof(int));
    for (int start = 0; start < x->rows; start += model->max_batch) {
        int rows = x->rows - start < model->max_batch ? x->rows - start : model->max_batch;
        Tensor chunk = {.data = x->data + (size_t)start * x->cols, .rows = rows, .cols = x->cols, .device = x->device};
        const Tensor *logits = mlp_forward(model, &chunk);
        if (tensor_on_gpu(logits)) {
#if HAVE_CUDA
            // argmax on the GPU, into the label buffer; only the predictions travel.
            gpu_argmax(logits->data, rows, logits->cols, model->labels, device_stream());
            CHECK_CUDA(cudaMemcpyAsync(predictions, model->labels, (size_t)rows * sizeof(int),
                                       cudaMemcpyDeviceToHost, device_stream()));
            device_wait_stream(device_stream());
            for (int r = 0; r < rows; r++) correct += predictions[r] == labels[start + r];
#endif
            continue;
        }
#pragma omp parallel for reduction(+ : correct)  // an integer count: exact in any order
        for (int r = 0; r < rows; r++) {
            const float *z = logits->data + (size_t)r * logits->cols;
            int best = 0;
            for (int c = 1; c < logits->cols; c++) best = z[c] > z[best] ? c : best;
            correct += best == labels[start + r];
        }
    }
    free(predictions);
    return x->rows ? (double)correct / x->rows : 0.0;
}

size_t mlp_num_weights(const Mlp *model) {
    size_t total = 0;
    for (int i = 0; i < model->n_params; i++) total += tensor_numel(model->params[i].value);
    return total;
}

unsigned long long params_checksum(const Param *params, int n_params) {
    unsigned long long hash = 1469598103934665603ULL;  // FNV-1a, over the raw float bits
    for (int i = 0; i < n_params; i++) {
        float *values = xmalloc(tensor_numel(params[i].value) * sizeof(float));
        tensor_to_host(params[i].value, values);
        const unsigned char *bytes = (const unsigned char *)values;
        for (size_t k = 0; k < tensor_numel(params[i].value) * sizeof(float); k++)
            hash = (hash ^ bytes[k]) * 1099511628211ULL;
        free(values);
    }
    return hash;
}

// ------------------------------------------------------------------ optimizers

Adam adam_new(Param *params, int n_params, double lr) {
    Adam adam = {.params = params, .n_params = n_params, .lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    adam.exp_avg = xcalloc((size_t)n_params, sizeof(Tensor));
    adam.exp_avg_sq = xcalloc((size_t)n_params, sizeof(Tensor));
    for (int i = 0; i < n_params; i++) {
        const Tensor *p = params[i].value;
        adam.exp_avg[i] = tensor_zeros(p->rows, p->cols, p->device);
        adam.exp_avg_sq[i] = tensor_zeros(p->rows, p->cols, p->device);
    }
    return adam;
}

void adam_step(Adam *adam) {
    profile_push("optimizer");
    adam->step++;
    // Scalars in double, as Python computes them; each is rounded to float once
    // where PyTorch hands it to a float32 kernel.
    double bias_correction1 = 1.0 - pow(adam->beta1, (double)adam->step);
    double bias_correction2 = 1.0 - pow(adam->beta2, (double)adam->step);
    const float step_size = (float)(adam->lr / bias_correction1);
    const float bias_correction2_sqrt = (float)sqrt(bias_correction2);
    const float one_minus_beta1 = (float)(1.0 - adam->beta1);
    const float beta2 = (float)adam->beta2, one_minus_beta2 = (float)(1.0 - adam->beta2);
    const float eps = (float)adam->eps;
    for (int i = 0; i < adam->n_params; i++) {
        if (tensor_on_gpu(adam->params[i].value)) {
#if HAVE_CUDA
            gpu_adam(adam->params[i].value->data, adam->params[i].grad->data, adam->exp_avg[i].data,
                     adam->exp_avg_sq[i].data, tensor_numel(adam->params[i].value), step_size,
                     bias_correction2_sqrt, one_minus_beta1, beta2, one_minus_beta2, eps, device_stream());
#endif
            continue;
        }
        float *p = adam->params[i].value->data;
        const float *g = adam->params[i].grad->data;
        float *m = adam->exp_avg[i].data, *v = adam->exp_avg_sq[i].data;
        size_t n = tensor_numel(adam->params[i].value);
#pragma omp parallel for
        for (size_t k = 0; k < n; k++) {
            m[k] = m[k] + one_minus_beta1 * (g[k] - m[k]);         // exp_avg.lerp_(grad, 1 - beta1)
            v[k] = v[k] * beta2 + one_minus_beta2 * (g[k] * g[k]);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
            float denom = sqrtf(v[k]) / bias_correction2_sqrt + eps;
            p[k] = p[k] - step_size * (m[k] / denom);               // param.addcdiv_(m, denom, -step_size)
        }
    }
    profile_pop();
}

void adam_free(Adam *adam) {
    for (int i = 0; i < adam->n_params; i++) {
        tensor_free(&adam->exp_avg[i]);
        tensor_free(&adam->exp_avg_sq[i]);
    }
    free(adam->exp_avg);
    free(adam->exp_avg_sq);
}

void sgd_step(const Param *params, int n_params, double lr) {
    profile_push("optimizer");
    const float rate = (float)lr;
    for (int i = 0; i < n_params; i++) {
        if (tensor_on_gpu(params[i].value)) {
#if HAVE_CUDA
            gpu_sgd(params[i].value->data, params[i].grad->data, tensor_numel(params[i].value), rate, device_stream());
#endif
            continue;
        }
        float *p = params[i].value->data;
        const float *g = params[i].grad->data;
        size_t n = tensor_numel(params[i].value);
#pragma omp parallel for
        for (size_t k = 0; k < n; k++) p[k] -= rate * g[k];
    }
    profile_pop();
}
