// conv.c: Conv2d, MaxPool2d and Flatten as plain math over tensor operations
// (im2col, GEMM, col2im, pooling). See conv.h.
#include "models/conv.h"

#include <math.h>
#include <stdlib.h>

#include "base/check.h"

// ------------------------------------------------------------------ Conv2d

// U(-bound, bound) into t, drawn on the host (wherever t lives) in index order.
static void init_uniform(Tensor *t, float bound, Rng *rng) {
    float *values = xmalloc(tensor_numel(t) * sizeof(float));
    for (size_t i = 0; i < tensor_numel(t); i++) values[i] = rng_uniform(rng, -bound, bound);
    tensor_from_host(t, values);
    free(values);
}

static ConvGeometry geometry(const Conv2d *conv, int batch) {
    return (ConvGeometry){.channels = conv->in_channels, .batch = batch, .height = conv->height,
                          .width = conv->width, .kernel = conv->kernel, .padding = conv->padding};
}

int conv2d_out_height(const Conv2d *conv) { return conv->height + 2 * conv->padding - conv->kernel + 1; }
int conv2d_out_width(const Conv2d *conv) { return conv->width + 2 * conv->padding - conv->kernel + 1; }

void conv2d_init(Conv2d *conv, int in_channels, int out_channels, int kernel, int padding, int height, int width,
                 int max_batch, Rng *rng, Device device) {
    *conv = (Conv2d){.in_channels = in_channels, .out_channels = out_channels, .kernel = kernel,
                     .padding = padding, .height = height, .width = width, .max_batch = max_batch};
    CHECK(in_channels > 0 && out_channels > 0 && kernel > 0 && padding >= 0 && max_batch > 0 &&
              conv2d_out_height(conv) > 0 && conv2d_out_width(conv) > 0,
          "Conv2d(%d, %d, %d, padding=%d) on %dx%d images", in_channels, out_channels, kernel, padding, height, width);
    int fan_in = in_channels * kernel * kernel;
    int positions = max_batch * conv2d_out_height(conv) * conv2d_out_width(conv);
    conv->weight = tensor_zeros(out_channels, fan_in, device);
    conv->bias = tensor_zeros(1, out_channels, device);
    conv->grad_weight = tensor_zeros(out_channels, fan_in, device);
    conv->grad_bias = tensor_zeros(1, out_channels, device);
    conv->columns = tensor_zeros(fan_in, positions, device);
    conv->grad_columns = tensor_zeros(fan_in, positions, device);
    // torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5)), in Python's double
    // arithmetic: gain = sqrt(2 / (1 + a^2)), bound = sqrt(3) * gain / sqrt(fan_in)
    // (1 / sqrt(fan_in) up to rounding; torch rounds it to float). Then the
    // bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    double a = sqrt(5.0);
    double gain = sqrt(2.0 / (1.0 + pow(a, 2.0)));
    double weight_bound = sqrt(3.0) * (gain / sqrt((double)fan_in));
    init_uniform(&conv->weight, (float)weight_bound, rng);
    init_uniform(&conv->bias, (float)(1.0 / sqrt((double)fan_in)), rng);
}

void conv2d_free(Conv2d *conv) {
    tensor_free(&conv->weight);
    tensor_free(&conv->bias);
    tensor_free(&conv->grad_weight);
    tensor_free(&conv->grad_bias);
    tensor_free(&conv->columns);
    tensor_free(&conv->grad_columns);
}

void conv2d_forward(Conv2d *conv, const Tensor *x, int batch, Tensor *y, bool relu) {
    CHECK(batch > 0 && batch <= conv->max_batch, "Conv2d: batch of %d, built for %d", batch, conv->max_batch);
    ConvGeometry g = geometry(conv, batch);
    int positions = batch * conv2d_out_height(conv) * conv2d_out_width(conv);
    Tensor columns = tensor_view(&conv->columns, conv->columns.rows, positions);
    im2col(x, &g, &columns);                                 // [in * k * k, B * out_h * out_w]
    gemm(false, false, 1.0f, &conv->weight, &columns, 0.0f, y);  // [out, in*k*k] @ [in*k*k, B*out_h*out_w]
    add_row_bias(y, &conv->bias, relu);                      // + bias[out], then ReLU
    conv->batch = batch;
}

void conv2d_backward(Conv2d *conv, const Tensor *grad_y, Tensor *grad_x) {
    int positions = conv->batch * conv2d_out_height(conv) * conv2d_out_width(conv);
    Tensor columns = tensor_view(&conv->columns, conv->columns.rows, positions);
    gemm_hold_rounded(grad_y);  // (--dtype bfloat16: rounded once for both products)
    gemm(false, true, 1.0f, grad_y, &columns, 1.0f, &conv->grad_weight);  // [out, B*hw] @ [B*hw, in*k*k]
    add_sum_of_rows(grad_y, &conv->grad_bias);                            // sum over images and pixels
    Tensor grad_columns = tensor_view(&conv->grad_columns, conv->grad_columns.rows, positions);
    if (grad_x) gemm(true, false, 1.0f, &conv->weight, grad_y, 0.0f, &grad_columns);  // [in*k*k, out] @ [out, B*hw]
    gemm_release_rounded();
    if (!grad_x) return;
    ConvGeometry g = geometry(conv, conv->batch);
    col2im(&grad_columns, &g, grad_x);  // each pixel: the sum over the windows it was in
}

// ------------------------------------------------------------------ MaxPool2d

void maxpool2d_init(MaxPool2d *pool, int size, int channels, int height, int width, int max_batch, Device device) {
    CHECK(size > 0 && height / size > 0 && width / size > 0, "MaxPool2d(%d) on %dx%d images", size, height, width);
    *pool = (MaxPool2d){.size = size, .height = height, .width = width};
    pool->argmax = int_buffer_new((size_t)channels * max_batch * (height / size) * (width / size), device);
}

void maxpool2d_free(MaxPool2d *pool) { int_buffer_free(&pool->argmax); }

void maxpool2d_forward(MaxPool2d *pool, const Tensor *x, Tensor *y) {
    max_pool2d(x, pool->height, pool->width, pool->size, y, &pool->argmax);
}

void maxpool2d_backward(const MaxPool2d *pool, const Tensor *grad_y, Tensor *grad_x) {
    max_pool2d_backward(grad_y, &pool->argmax, grad_x);
}

// ------------------------------------------------------------------ Flatten

void flatten_forward(const Tensor *x, int batch, Tensor *y) {
    CHECK(y->rows == batch && x->cols % batch == 0, "Flatten: [%d, %d] into [%d, %d] for a batch of %d", x->rows,
          x->cols, y->rows, y->cols, batch);
    swap_outer_axes(x, x->rows, batch, x->cols / batch, y);  // [C, B, pixels] -> [B, C, pixels]
}

void flatten_backward(const Tensor *grad_y, int batch, Tensor *grad_x) {
    CHECK(grad_y->rows == batch && grad_x->cols % batch == 0, "Flatten backward: [%d, %d] into [%d, %d]",
          grad_y->rows, grad_y->cols, grad_x->rows, grad_x->cols);
    swap_outer_axes(grad_y, batch, grad_x->rows, grad_x->cols / batch, grad_x);  // [B, C, pixels] -> [C, B, pixels]
}
