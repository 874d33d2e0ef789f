// nn.c: layers, MLP, Adam and SGD, as math over tensor_ops.h and gemm: the
// CPU/GPU choice is made in those operations, not here. See nn.h.
#include "models/nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/check.h"
#include "runtime/device.h"   // device_upload: Adam's coefficients for a CUDA graph's step
#include "runtime/profile.h"

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
    add_column_bias(y, &layer->bias, relu);
}

void linear_backward(Linear *layer, const Tensor *x, const Tensor *grad_y, Tensor *grad_x) {
    gemm_hold_rounded(grad_y);  // (--dtype bfloat16: rounded once for both products)
    gemm(true, false, 1.0f, grad_y, x, 1.0f, &layer->grad_weight);  // [out, B] @ [B, in]
    add_sum_over_rows(grad_y, &layer->grad_bias);
    if (grad_x) gemm(false, false, 1.0f, grad_y, &layer->weight, 0.0f, grad_x);  // [B, out] @ [out, in]
    gemm_release_rounded();
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
        // --dtype bfloat16 on a GPU: each product's operands kept rounded by what writes them (the
        // weights before a pass, a hidden layer's output, each output gradient), no rounding launch.
        tensor_keep_bfloat16(&layer->weight);
        if (i + 1 < model.n_layers) tensor_keep_bfloat16(&model.outputs[i]);
        tensor_keep_bfloat16(&model.grad_outputs[i]);
        Param *pair = &model.params[2 * i];  // its weight and bias
        pair[0] = (Param){.value = &layer->weight, .grad = &layer->grad_weight};
        pair[1] = (Param){.value = &layer->bias, .grad = &layer->grad_bias};
        mlp_name_layer(pair, i);
    }
    return model;
}

int mlp_sizes_from_hidden(const char *hidden, int inputs, int outputs, int sizes[MLP_MAX_SIZES]) {
    enum { MAX_WIDTH = 1 << 20 };
    int n = 0;
    sizes[n++] = inputs;
    for (const char *p = hidden; *p;) {
        char *end = NULL;
        long width = strtol(p, &end, 10);
        if (end == p || width < 1 || width > MAX_WIDTH || (*end != ',' && *end != '\0') || (*end == ',' && !end[1]) ||
            n == MLP_MAX_SIZES - 1)
            usage_error("--hidden %s: expected up to %d layer widths from 1 to %d, separated by commas (e.g. 512,512,512)",
                        hidden, MLP_MAX_SIZES - 2, MAX_WIDTH);
        sizes[n++] = (int)width;
        p = *end ? end + 1 : end;
    }
    if (n == 1) usage_error("--hidden '': expected at least one layer width (e.g. 128)");
    sizes[n++] = outputs;
    return n;
}

void mlp_describe_sizes(const int *sizes, int n_sizes, char *out, size_t size) {
    size_t used = 0;
    if (size > 0) out[0] = '\0';
    for (int i = 0; i < n_sizes && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%d", i ? "-" : "", sizes[i]);
}

void mlp_name_layer(Param pair[2], int layer) {
    // nn.Sequential counts the ReLUs too: the Linears are fc.0, fc.2, fc.4...
    snprintf(pair[0].name, sizeof pair[0].name, "fc.%d.weight", 2 * layer);
    snprintf(pair[1].name, sizeof pair[1].name, "fc.%d.bias", 2 * layer);
}

void mlp_free(Mlp *model) {
    for (int i = 0; i < model->n_layers; i++) {
        linear_free(&model->layers[i]);
        tensor_free(&model->outputs[i]);
        tensor_free(&model->grad_outputs[i]);
    }
    free(model->layers);
    free(model->outputs);
    free(model->grad_outputs);
    free(model->params);
    *model = (Mlp){0};
}

// The weights as the forward's and the backward's products read them: with --dtype bfloat16 on a
// GPU, rounded once a pass (two a launch) and kept until the backward is done (the weights do not
// change in between), where each product would round its weight itself.
static void round_weights(Mlp *model) {
    if (matmul_dtype() != MATMUL_BFLOAT16) return;
    Tensor **weights = xmalloc((size_t)model->n_layers * sizeof(Tensor *));
    for (int i = 0; i < model->n_layers; i++) weights[i] = &model->layers[i].weight;
    tensors_round_bfloat16(weights, model->n_layers);
    free(weights);
}

static void forget_rounded_weights(Mlp *model) {
    for (int i = 0; i < model->n_layers; i++) tensor_drop_bfloat16(&model->layers[i].weight);
}

const Tensor *mlp_forward(Mlp *model, const Tensor *x) {
    CHECK(x->rows <= model->max_batch, "batch of %d rows, model built for %d", x->rows, model->max_batch);
    profile_push("forward");
    round_weights(model);
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

float mlp_loss(Mlp *model, const int *labels) {
    profile_push("loss");
    const Tensor *logits = &model->outputs[model->n_layers - 1];
    Tensor *grad_logits = &model->grad_outputs[model->n_layers - 1];  // kept for backward
    grad_logits->rows = logits->rows;
    float loss = softmax_cross_entropy(logits, labels, grad_logits);
    profile_pop();
    return loss;
}

void mlp_loss_to(Mlp *model, const int *labels, const int *device_labels, LossSlot slot) {
    profile_push("loss");
    const Tensor *logits = &model->outputs[model->n_layers - 1];
    Tensor *grad_logits = &model->grad_outputs[model->n_layers - 1];  // kept for backward
    grad_logits->rows = logits->rows;
    softmax_cross_entropy_to(logits, labels, device_labels, grad_logits, slot);
    profile_pop();
}

float mlp_mse_loss(Mlp *model, const Tensor *target) {
    profile_push("loss");
    const Tensor *output = &model->outputs[model->n_layers - 1];
    Tensor *grad = &model->grad_outputs[model->n_layers - 1];  // kept for backward
    grad->rows = output->rows;
    float loss = mse_loss(output, target, grad);
    profile_pop();
    return loss;
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
    forget_rounded_weights(model);  // the optimizer writes them next
    profile_pop();
}

void mlp_zero_grad(Mlp *model) { params_zero_grad(model->params, model->n_params); }

void params_zero_grad(const Param *params, int n_params) {
    Tensor **grads = xmalloc((size_t)(n_params > 0 ? n_params : 1) * sizeof(Tensor *));
    for (int i = 0; i < n_params; i++) grads[i] = params[i].grad;
    tensors_fill(grads, n_params, 0.0f);
    free(grads);
}

double mlp_accuracy(Mlp *model, const Tensor *x, const int *labels) {
    long correct = 0;
    int *predictions = xmalloc((size_t)model->max_batch * sizeof(int));
    for (int start = 0; start < x->rows; start += model->max_batch) {
        int rows = x->rows - start < model->max_batch ? x->rows - start : model->max_batch;
        Tensor chunk = tensor_row_range(x, start, rows);
        const Tensor *logits = mlp_forward(model, &chunk);
        argmax_rows(logits, predictions);
        for (int r = 0; r < rows; r++) correct += predictions[r] == labels[start + r];
    }
    forget_rounded_weights(model);  // no backward follows these forwards
    free(predictions);
    return x->rows ? (double)correct / x->rows : 0.0;
}

size_t mlp_num_weights(const Mlp *model) {
    size_t total = 0;
    for (int i = 0; i < model->n_params; i++) total += tensor_numel(model->params[i].value);
    return total;
}

void mlp_add_memory_need(MemoryNeed *need, const int *sizes, int n_sizes, int max_batch, int state_floats) {
    double weights = 0, activations = 0;
    for (int i = 0; i + 1 < n_sizes; i++) {
        weights += (double)sizes[i] * sizes[i + 1] + sizes[i + 1];  // Linear(sizes[i], sizes[i + 1])
        activations += 2.0 * max_batch * sizes[i + 1];               // outputs[i], grad_outputs[i]
    }
    memory_need_add(need, "parameters", weights * sizeof(float));
    memory_need_add(need, "gradients", weights * sizeof(float));
    if (state_floats) memory_need_add(need, state_floats == 2 ? "Adam's moments" : "optimizer state",
                                      state_floats * weights * sizeof(float));
    memory_need_add(need, "activations", activations * sizeof(float));
    matmul_add_memory_need(need, mlp_largest_operand(sizes, 0, n_sizes - 1, max_batch));  // --dtype bfloat16's copies
    if (matmul_dtype() == MATMUL_BFLOAT16) {  // the copies kept (mlp_new): weights, hidden outputs, output gradients
        double kept = 0;
        for (int i = 0; i + 1 < n_sizes; i++)
            kept += (double)sizes[i] * sizes[i + 1] + (double)max_batch * sizes[i + 1] * (i + 2 < n_sizes ? 2 : 1);
        memory_need_add(need, "bfloat16 copies", kept * sizeof(uint16_t));
    }
}

double mlp_largest_operand(const int *sizes, int first_layer, int end_layer, int rows) {
    double largest = 0;
    for (int l = first_layer; l < end_layer; l++)
        largest = fmax(largest, fmax((double)sizes[l] * sizes[l + 1], (double)rows * fmax(sizes[l], sizes[l + 1])));
    return largest;
}

unsigned long long params_checksum(const Param *params, int n_params) {
    return params_checksum_continue(PARAMS_CHECKSUM_START, params, n_params);
}

unsigned long long params_checksum_continue(unsigned long long hash, const Param *params, int n_params) {
    for (int i = 0; i < n_params; i++) {  // FNV-1a, over the raw float bits
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

// The next step's scalars in double, as Python computes them; each is rounded to float once where
// PyTorch hands it to a float32 kernel.
static AdamCoefficients next_coefficients(Adam *adam) {
    adam->step++;
    double bias_correction1 = 1.0 - pow(adam->beta1, (double)adam->step);
    double bias_correction2 = 1.0 - pow(adam->beta2, (double)adam->step);
    return (AdamCoefficients){
        .step_size = (float)(adam->lr / bias_correction1),
        .bias_correction2_sqrt = (float)sqrt(bias_correction2),
        .one_minus_beta1 = (float)(1.0 - adam->beta1),
        .beta2 = (float)adam->beta2,
        .one_minus_beta2 = (float)(1.0 - adam->beta2),
        .eps = (float)adam->eps,
    };
}

void adam_prepare_step(Adam *adam) {
    AdamCoefficients coefficients = next_coefficients(adam);
    if (adam->n_params == 0 || !tensor_on_gpu(adam->params[0].value)) {
        adam->prepared = coefficients;
        return;
    }
#if HAVE_CUDA
    if (!adam->device_coefficients) adam->device_coefficients = device_alloc(sizeof(AdamCoefficients));
    device_upload(adam->device_coefficients, &coefficients, sizeof coefficients, "Adam's coefficients");
#endif
}

// Every tensor's update on a GPU in one launch, with the coefficients adam_prepare_step left there;
// where decays[i] (decays NULL: none), params[i] *= keep first.
static void update_on_gpu(Adam *adam, const bool *decays, float keep) {
    CHECK(adam->device_coefficients, "Adam on a GPU: no adam_prepare_step before its update");
    Tensor **values = xmalloc(2 * (size_t)adam->n_params * sizeof(Tensor *)), **grads = values + adam->n_params;
    for (int i = 0; i < adam->n_params; i++) values[i] = adam->params[i].value, grads[i] = adam->params[i].grad;
    adam_update_tensors(&adam->gpu_tensors, values, grads, adam->exp_avg, adam->exp_avg_sq, decays, adam->n_params,
                        adam->device_coefficients, keep);
    free(values);
}

static bool on_gpu(const Adam *adam) { return adam->n_params > 0 && tensor_on_gpu(adam->params[0].value); }

void adam_apply_step(Adam *adam) {
    profile_push("optimizer");
    if (on_gpu(adam))
        update_on_gpu(adam, NULL, 1.0f);
    else
        for (int i = 0; i < adam->n_params; i++)
            adam_update(adam->params[i].value, adam->params[i].grad, &adam->exp_avg[i], &adam->exp_avg_sq[i],
                        &adam->prepared);
    profile_pop();
}

void adam_step(Adam *adam) { adam_step_decayed(adam, NULL, 1.0f); }

void adam_step_decayed(Adam *adam, const bool *decays, float keep) {
    profile_push("optimizer");
    if (on_gpu(adam)) {
        adam_prepare_step(adam);  // the coefficients to device memory (an asynchronous copy)
        update_on_gpu(adam, decays, keep);
    } else {
        const AdamCoefficients coefficients = next_coefficients(adam);
        for (int i = 0; i < adam->n_params; i++) {
            if (decays && decays[i]) tensor_scale(adam->params[i].value, keep);
            adam_update(adam->params[i].value, adam->params[i].grad, &adam->exp_avg[i], &adam->exp_avg_sq[i],
                        &coefficients);
        }
    }
    profile_pop();
    device_mark_step();  // the step is queued (the simulated GPU counts per step)
}

void adam_free(Adam *adam) {
#if HAVE_CUDA
    if (adam->device_coefficients) device_free(adam->device_coefficients);
#endif
    adam_tensors_free(&adam->gpu_tensors);
    for (int i = 0; i < adam->n_params; i++) {
        tensor_free(&adam->exp_avg[i]);
        tensor_free(&adam->exp_avg_sq[i]);
    }
    free(adam->exp_avg);
    free(adam->exp_avg_sq);
}

void sgd_step(const Param *params, int n_params, double lr) {
    profile_push("optimizer");
    for (int i = 0; i < n_params; i++) sgd_update(params[i].value, params[i].grad, (float)lr);
    profile_pop();
    device_mark_step();  // the step is queued (the simulated GPU counts per step)
}
