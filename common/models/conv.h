// conv.h: Conv2d, MaxPool2d and Flatten, with PyTorch's semantics.
//
// Images are channel-major, [channels, batch * height * width] (tensor_ops.h
// says why). Like nn.h's Linear, gradients ACCUMULATE into grad_weight and
// grad_bias, and each layer keeps from its forward what its backward needs.
//
//   Conv2d conv;                                         // nn.Conv2d(32, 64, 3, padding=1)
//   conv2d_init(&conv, 32, 64, 3, 1, 14, 14, max_batch, &rng, device);
//   conv2d_forward(&conv, &x, batch, &y, true);          // y = relu(conv(x))
//   relu_backward(&y, &grad_y);                          // (nn.h) through the ReLU
//   conv2d_backward(&conv, &grad_y, &grad_x);            // weights, bias, input
#pragma once
#include "models/nn.h"
#include "tensor/tensor_ops.h"

// nn.Conv2d(in, out, kernel, padding=padding), stride 1. The weight
// [out, in, k, k] is the tensor [out, in * k * k], in PyTorch's memory order.
typedef struct {
    int in_channels, out_channels, kernel, padding;
    int height, width, max_batch;  // the input images' size, and the most of them at once
    Tensor weight;       // [out, in * k * k]
    Tensor bias;         // [1, out]
    Tensor grad_weight;  // [out, in * k * k]
    Tensor grad_bias;    // [1, out]
    Tensor columns;      // [in * k * k, max_batch * out_h * out_w]: im2col of the last input
    Tensor grad_columns; // [in * k * k, max_batch * out_h * out_w]
    int batch;           // the last forward's batch
} Conv2d;

// PyTorch's reset_parameters(): weight ~ kaiming_uniform_(a=sqrt(5)), which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in * k * k, then bias from the
// same bound; drawn from rng in that order, as torch draws them.
void conv2d_init(Conv2d *conv, int in_channels, int out_channels, int kernel, int padding, int height, int width,
                 int max_batch, Rng *rng, Device device);
void conv2d_free(Conv2d *conv);
int conv2d_out_height(const Conv2d *conv);
int conv2d_out_width(const Conv2d *conv);
// y [out, batch * out_h * out_w] = weight @ im2col(x) + bias, then ReLU in the
// same pass when relu. x is [in, batch * h * w].
void conv2d_forward(Conv2d *conv, const Tensor *x, int batch, Tensor *y, bool relu);
// For the last forward's input: grad_weight += grad_y @ im2col(x)^T; grad_bias
// += the sums of grad_y's rows; grad_x = col2im(weight^T @ grad_y) (skipped when
// grad_x is NULL: the network's input needs none).
void conv2d_backward(Conv2d *conv, const Tensor *grad_y, Tensor *grad_x);

// nn.MaxPool2d(size): windows of size x size, stride size.
typedef struct {
    int size, height, width;  // the input planes' size
    IntBuffer argmax;         // [outputs]: where each output's maximum came from, for backward
} MaxPool2d;

void maxpool2d_init(MaxPool2d *pool, int size, int channels, int height, int width, int max_batch, Device device);
void maxpool2d_free(MaxPool2d *pool);
// y [channels, batch * (h / size) * (w / size)] = the maximum of each window of x.
void maxpool2d_forward(MaxPool2d *pool, const Tensor *x, Tensor *y);
// grad_x: grad_y where each maximum was, 0 elsewhere.
void maxpool2d_backward(const MaxPool2d *pool, const Tensor *grad_y, Tensor *grad_x);

// nn.Flatten(): channel-major x [channels, batch * pixels] -> y [batch,
// channels * pixels], PyTorch's order (channel, then row, then column).
void flatten_forward(const Tensor *x, int batch, Tensor *y);
// grad_y [batch, channels * pixels] -> grad_x [channels, batch * pixels].
void flatten_backward(const Tensor *grad_y, int batch, Tensor *grad_x);
