// cnn.c: SimpleCNN's forward and backward, layer by layer. See cnn.h.
#include "models/cnn.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/check.h"
#include "runtime/profile.h"

#define ARRAY_SIZE(a) ((int)(sizeof(a) / sizeof((a)[0])))

enum { SIDE = 28, CLASSES = 10, C1 = 32, C2 = 64, HIDDEN = 128, FLAT = C2 * (SIDE / 4) * (SIDE / 4) };

// A named parameter: its state_dict key and, for a conv weight, its 4-D shape.
static Param param(const char *name, Tensor *value, Tensor *grad, int d0, int d1, int d2, int d3) {
    Param p = {.value = value, .grad = grad, .dims = {d0, d1, d2, d3}};
    snprintf(p.name, sizeof p.name, "%s", name);
    return p;
}

// What one sample of a batch holds on the CPU, in 4-byte words: every
// activation and its gradient (cnn_new's buffers), both convolutions' columns
// and their gradients (3x3 kernels: 9 and 9 x C1 rows, one column per output
// pixel), and the pools' argmax. About 1 MB: a batch of 2^20 would take a TB.
static double words_per_sample(void) {
    const double pixels = SIDE * SIDE;
    double activations = 2 * (C1 * pixels + C1 * pixels / 4 + C2 * pixels / 4 + C2 * pixels / 16 + FLAT + HIDDEN + CLASSES);
    double columns = 2 * (9 * 1 * pixels + 9 * C1 * pixels / 4);
    double argmax = C1 * pixels / 4 + C2 * pixels / 16;
    return activations + columns + argmax;
}

// The first pool's argmax are int indices into its C1 x batch x 28 x 28 input:
// past INT_MAX they would wrap, and its backward write out of bounds. A limit of
// the model, whatever the memory (a GPU of 141 GB holds that batch), so it is
// checked before the memory estimate, which would otherwise refuse the batch on
// smaller machines for another reason.
static void require_int_pooling_indexes(int max_batch) {
    char too_large[128];
    int most = (int)(INT_MAX / ((long)C1 * SIDE * SIDE));
    snprintf(too_large, sizeof too_large, "--batch_size %d: the SimpleCNN takes at most %d (its pooling indexes are ints)",
             max_batch, most);
    check_all_ranks(max_batch <= most, too_large);
}

void cnn_add_memory_need(MemoryNeed *need, int max_batch) {
    require_int_pooling_indexes(max_batch);
    const double weights = (9.0 * 1 * C1 + C1) + (9.0 * C1 * C2 + C2) + ((double)FLAT * HIDDEN + HIDDEN) +
                           ((double)HIDDEN * CLASSES + CLASSES);  // conv1, conv2, fc1, fc2: cnn_num_weights's
    memory_need_add(need, "parameters", weights * sizeof(float));
    memory_need_add(need, "gradients", weights * sizeof(float));
    memory_need_add(need, "Adam's moments", 2 * weights * sizeof(float));
    memory_need_add(need, "activations", words_per_sample() * 4.0 * max_batch);
    // --dtype bfloat16: the largest product's operands are conv2's columns [9 C1, B x 14 x 14] or fc1's weight.
    matmul_add_memory_need(need, fmax(9.0 * C1 * (SIDE / 2) * (SIDE / 2) * max_batch, (double)FLAT * HIDDEN));
}

Cnn *cnn_new(int max_batch, Rng *rng, Device device) {
    CHECK(max_batch > 0, "SimpleCNN for batches of %d", max_batch);
    require_int_pooling_indexes(max_batch);
    Cnn *m = xcalloc(1, sizeof(Cnn));
    m->max_batch = max_batch;
    m->n_params = CNN_PARAMS;
    const int B = max_batch, pixels = SIDE * SIDE;
    // Created in nn.Sequential's order: each draws its weight, then its bias.
    conv2d_init(&m->conv1, 1, C1, 3, 1, SIDE, SIDE, B, rng, device);
    maxpool2d_init(&m->pool1, 2, C1, SIDE, SIDE, B, device);
    conv2d_init(&m->conv2, C1, C2, 3, 1, SIDE / 2, SIDE / 2, B, rng, device);
    maxpool2d_init(&m->pool2, 2, C2, SIDE / 2, SIDE / 2, B, device);
    linear_init(&m->fc1, FLAT, HIDDEN, rng, device);
    linear_init(&m->fc2, HIDDEN, CLASSES, rng, device);

    Tensor *buffers[] = {&m->conv1_out, &m->grad_conv1_out, &m->pool1_out, &m->grad_pool1_out,
                         &m->conv2_out, &m->grad_conv2_out, &m->pool2_out, &m->grad_pool2_out,
                         &m->flat, &m->grad_flat, &m->fc1_out, &m->grad_fc1_out, &m->logits, &m->grad_logits};
    const int shapes[][2] = {{C1, B * pixels}, {C1, B * pixels}, {C1, B * pixels / 4}, {C1, B * pixels / 4},
                             {C2, B * pixels / 4}, {C2, B * pixels / 4}, {C2, B * pixels / 16}, {C2, B * pixels / 16},
                             {B, FLAT}, {B, FLAT}, {B, HIDDEN}, {B, HIDDEN}, {B, CLASSES}, {B, CLASSES}};
    for (int i = 0; i < ARRAY_SIZE(buffers); i++) *buffers[i] = tensor_zeros(shapes[i][0], shapes[i][1], device);

    m->params[0] = param("network.0.weight", &m->conv1.weight, &m->conv1.grad_weight, C1, 1, 3, 3);
    m->params[1] = param("network.0.bias", &m->conv1.bias, &m->conv1.grad_bias, 0, 0, 0, 0);
    m->params[2] = param("network.3.weight", &m->conv2.weight, &m->conv2.grad_weight, C2, C1, 3, 3);
    m->params[3] = param("network.3.bias", &m->conv2.bias, &m->conv2.grad_bias, 0, 0, 0, 0);
    m->params[4] = param("network.7.weight", &m->fc1.weight, &m->fc1.grad_weight, 0, 0, 0, 0);
    m->params[5] = param("network.7.bias", &m->fc1.bias, &m->fc1.grad_bias, 0, 0, 0, 0);
    m->params[6] = param("network.9.weight", &m->fc2.weight, &m->fc2.grad_weight, 0, 0, 0, 0);
    m->params[7] = param("network.9.bias", &m->fc2.bias, &m->fc2.grad_bias, 0, 0, 0, 0);
    return m;
}

void cnn_free(Cnn *m) {
    conv2d_free(&m->conv1);
    maxpool2d_free(&m->pool1);
    conv2d_free(&m->conv2);
    maxpool2d_free(&m->pool2);
    linear_free(&m->fc1);
    linear_free(&m->fc2);
    Tensor *buffers[] = {&m->conv1_out, &m->grad_conv1_out, &m->pool1_out, &m->grad_pool1_out, &m->conv2_out,
                         &m->grad_conv2_out, &m->pool2_out, &m->grad_pool2_out, &m->flat, &m->grad_flat,
                         &m->fc1_out, &m->grad_fc1_out, &m->logits, &m->grad_logits};
    for (int i = 0; i < ARRAY_SIZE(buffers); i++) tensor_free(buffers[i]);
    free(m);
}

size_t cnn_num_weights(const Cnn *m) {
    size_t total = 0;
    for (int i = 0; i < m->n_params; i++) total += tensor_numel(m->params[i].value);
    return total;
}

// The current batch's part of a layer's buffer: channel-major images
// [channels, B * pixels], or rows [B, features].
static Tensor images(const Tensor *buffer, int batch, int pixels) {
    return tensor_view(buffer, buffer->rows, batch * pixels);
}
static Tensor rows(const Tensor *buffer, int batch) { return tensor_rows(buffer, batch); }

const Tensor *cnn_forward(Cnn *m, const Tensor *x) {
    const int B = x->rows, pixels = SIDE * SIDE;
    CHECK(B > 0 && B <= m->max_batch && x->cols == pixels, "SimpleCNN: input [%d, %d], expected at most [%d, %d]",
          x->rows, x->cols, m->max_batch, pixels);
    profile_push("forward");
    m->batch = B;
    Tensor input = tensor_view(x, 1, B * pixels);  // [1, B * 28 * 28]: one channel, the same memory
    Tensor conv1_out = images(&m->conv1_out, B, pixels), pool1_out = images(&m->pool1_out, B, pixels / 4);
    Tensor conv2_out = images(&m->conv2_out, B, pixels / 4), pool2_out = images(&m->pool2_out, B, pixels / 16);
    Tensor flat = rows(&m->flat, B), fc1_out = rows(&m->fc1_out, B), logits = rows(&m->logits, B);

    conv2d_forward(&m->conv1, &input, B, &conv1_out, true);    // network.0, .1: Conv2d(1, 32, 3, padding=1), ReLU
    maxpool2d_forward(&m->pool1, &conv1_out, &pool1_out);      // network.2: MaxPool2d(2)
    conv2d_forward(&m->conv2, &pool1_out, B, &conv2_out, true);  // network.3, .4: Conv2d(32, 64, 3, padding=1), ReLU
    maxpool2d_forward(&m->pool2, &conv2_out, &pool2_out);      // network.5: MaxPool2d(2)
    flatten_forward(&pool2_out, B, &flat);                     // network.6: Flatten()
    linear_forward(&m->fc1, &flat, &fc1_out, true);            // network.7, .8: Linear(3136, 128), ReLU
    linear_forward(&m->fc2, &fc1_out, &logits, false);         // network.9: Linear(128, 10)
    profile_pop();
    m->output = logits;
    return &m->output;
}

float cnn_loss(Cnn *m, const int *labels) {
    profile_push("loss");
    Tensor logits = rows(&m->logits, m->batch), grad_logits = rows(&m->grad_logits, m->batch);
    float loss = softmax_cross_entropy(&logits, labels, &grad_logits);  // nn.CrossEntropyLoss()
    profile_pop();
    return loss;
}

void cnn_loss_to(Cnn *m, const int *labels, const int *device_labels, LossSlot slot) {
    profile_push("loss");
    Tensor logits = rows(&m->logits, m->batch), grad_logits = rows(&m->grad_logits, m->batch);
    softmax_cross_entropy_to(&logits, labels, device_labels, &grad_logits, slot);  // nn.CrossEntropyLoss()
    profile_pop();
}

// The i-th layer with parameters (conv1, conv2, fc1, fc2) is done: its bias
// (params[2i + 1]) and weight (params[2i]) gradients are final.
static void gradients_ready(GradReadyHook hook, void *context, int layer) {
    if (!hook) return;
    hook(context, 2 * layer + 1);
    hook(context, 2 * layer);
}

void cnn_backward(Cnn *m, GradReadyHook hook, void *context) {
    const int B = m->batch, pixels = SIDE * SIDE;
    profile_push("backward");
    Tensor conv1_out = images(&m->conv1_out, B, pixels), grad_conv1_out = images(&m->grad_conv1_out, B, pixels);
    Tensor grad_pool1_out = images(&m->grad_pool1_out, B, pixels / 4);
    Tensor conv2_out = images(&m->conv2_out, B, pixels / 4), grad_conv2_out = images(&m->grad_conv2_out, B, pixels / 4);
    Tensor grad_pool2_out = images(&m->grad_pool2_out, B, pixels / 16);
    Tensor flat = rows(&m->flat, B), grad_flat = rows(&m->grad_flat, B);
    Tensor fc1_out = rows(&m->fc1_out, B), grad_fc1_out = rows(&m->grad_fc1_out, B);
    Tensor grad_logits = rows(&m->grad_logits, B);  // set by cnn_loss

    // The layers in reverse; after each layer with parameters, DDP hears that
    // its gradients are final.
    linear_backward(&m->fc2, &fc1_out, &grad_logits, &grad_fc1_out);  // network.9
    gradients_ready(hook, context, 3);
    relu_backward(&fc1_out, &grad_fc1_out);                            // network.8
    linear_backward(&m->fc1, &flat, &grad_fc1_out, &grad_flat);        // network.7
    gradients_ready(hook, context, 2);
    flatten_backward(&grad_flat, B, &grad_pool2_out);                  // network.6
    maxpool2d_backward(&m->pool2, &grad_pool2_out, &grad_conv2_out);   // network.5
    relu_backward(&conv2_out, &grad_conv2_out);                        // network.4
    conv2d_backward(&m->conv2, &grad_conv2_out, &grad_pool1_out);      // network.3
    gradients_ready(hook, context, 1);
    maxpool2d_backward(&m->pool1, &grad_pool1_out, &grad_conv1_out);   // network.2
    relu_backward(&conv1_out, &grad_conv1_out);                        // network.1
    conv2d_backward(&m->conv1, &grad_conv1_out, NULL);                 // network.0: the input needs no gradient
    gradients_ready(hook, context, 0);
    profile_pop();
}

void cnn_zero_grad(Cnn *m) { params_zero_grad(m->params, m->n_params); }

double cnn_evaluate(Cnn *m, const Tensor *x, const int *labels, int *predictions) {
    double loss_sum = 0.0;
    for (int start = 0; start < x->rows; start += m->max_batch) {
        int n = x->rows - start < m->max_batch ? x->rows - start : m->max_batch;
        Tensor chunk = tensor_row_range(x, start, n);
        const Tensor *logits = cnn_forward(m, &chunk);
        loss_sum += (double)cnn_loss(m, labels + start) * n;  // the batch's mean, weighed by its rows
        argmax_rows(logits, predictions + start);
    }
    return loss_sum;
}
