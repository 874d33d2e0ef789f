// tensor_ops.h: the tensor-level operations that the layers of nn.h and conv.h are made of.
//
// Each operation makes the CPU/GPU choice once, inside: OpenMP loops on the
// rank's threads (results independent of the thread count: no shared sums,
// every reduction in a fixed order) or one CUDA kernel (kernels.cu; two for
// the sums of long rows) on the compute stream. The layers above (nn.c,
// conv.c) are then plain math over these and tensor.h's gemm, with no #if
// HAVE_CUDA. Any scratch memory an operation needs on the GPU is its own
// (grown to the largest call), not its caller's.
//
// Layers: above tensor (and device), below nn and conv.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "tensor/tensor.h"

// ------------------------------------------------------------------ the MLP's operations
//
// Linear's bias and the ReLU after it, ReLU's backward, the two losses,
// argmax, and the optimizers' updates. The CPU arithmetic is PyTorch's, in its
// order (see nn.h); the kernels do the same operations per element.

// y [rows, cols] += bias [1, cols] in every row (a Linear's bias: one per
// output feature), then y = max(y, 0) when relu: one pass over y.
void add_column_bias(Tensor *y, const Tensor *bias, bool relu);

// ReLU: x = max(x, 0), in place. CPU tensors only: on the GPU the ReLU after a
// Linear is add_column_bias's.
void relu_forward(Tensor *x);
// grad *= (y > 0), in place, where y is the ReLU's output (at y = 0 no
// gradient passes, as in PyTorch's threshold_backward).
void relu_backward(const Tensor *y, Tensor *grad);

// nn.CrossEntropyLoss on logits [B, classes] against labels [B] (host memory):
// returns the mean over the rows of -log softmax[label], and sets grad_logits
// = (softmax - onehot(label)) / B. The per-row terms are summed in double in a
// fixed order. On the GPU the host waits for the sum, like loss.item().
float softmax_cross_entropy(const Tensor *logits, const int *labels, Tensor *grad_logits);
// Where a step's loss goes when the host is not to wait for it: on a GPU rank device memory that
// the host reads when it prints (train/step_losses.h), on a CPU rank host memory. The loss written
// is weight * loss, or added to the value there when `accumulate` (micro-batches' shares of a step).
typedef struct {
    float *value;
    float weight;
    bool accumulate;
} LossSlot;
// The same cross-entropy with the loss written to `slot` (float arithmetic, as the caller of
// softmax_cross_entropy would do it: the same bits); the host never waits. device_labels: the labels
// already on the GPU (mnist_batch_device_labels), or NULL to copy `labels` there. On a CPU rank the
// plain function and a store.
void softmax_cross_entropy_to(const Tensor *logits, const int *labels, const int *device_labels, Tensor *grad_logits,
                              LossSlot slot);
// nn.MSELoss: returns the mean over all elements of (output - target)^2 (the
// terms summed in double in a fixed order), and sets grad = 2 (output -
// target) / numel.
float mse_loss(const Tensor *output, const Tensor *target, Tensor *grad);
// predictions[r] = argmax over c of logits[r, c], the first on ties (host memory).
void argmax_rows(const Tensor *logits, int *predictions);

// One torch.optim.Adam step's scalars, each rounded to float once where
// PyTorch hands it to a float32 kernel (adam_step in nn.c computes them).
typedef struct {
    float step_size;              // lr / (1 - beta1^step)
    float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
    float one_minus_beta1, beta2, one_minus_beta2, eps;
} AdamCoefficients;
// Adam's update of one parameter, in PyTorch's single-tensor operation order:
// exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad,
// 1 - beta2); param.addcdiv_(exp_avg, sqrt(exp_avg_sq) / bc2_sqrt + eps, -step_size).
void adam_update(Tensor *param, const Tensor *grad, Tensor *exp_avg, Tensor *exp_avg_sq, const AdamCoefficients *c);
// adam_update of n tensors on a GPU in one launch, where a launch per tensor made a model's optimizer
// step a row of small kernels that their launches bound (PyTorch's foreach implementation): each
// value's bits are adam_update's on the GPU, and where decays[i] (decays NULL: none), params[i] *=
// keep first (AdamW's decoupled weight decay, tensor_scale's bits). The coefficients are read from
// device memory when the kernel runs (`device_c`, an AdamCoefficients there): a step replayed from
// a CUDA graph reads each step's (nn.h's adam_apply_step). The tensors' addresses go to the GPU in
// a table that *table holds (made at the first call, NULL before it; adam_tensors_free frees it),
// sent again only when they change, which may not happen during a graph's capture.
typedef struct AdamTensors AdamTensors;
void adam_update_tensors(AdamTensors **table, Tensor *const *params, Tensor *const *grads, Tensor *exp_avg,
                         Tensor *exp_avg_sq, const bool *decays, int n, const AdamCoefficients *device_c, float keep);
void adam_tensors_free(AdamTensors **table);
// SGD without momentum: param -= lr * grad.
void sgd_update(Tensor *param, const Tensor *grad, float lr);
// The sum of the squares of every value of tensors[0 .. n), in double (clip_grad_norm's norm), all
// on one device: on the CPU each tensor in blocks of 4096 values, each block in 8 fixed lanes, then
// one running sum over the blocks of every tensor in turn (the same bits at any thread count); on the GPU gpu_sum's
// fixed tree per tensor, the tensors in order, read back once (the host waits, as for a loss).
double sum_of_squares(Tensor *const *tensors, int n);
// sum_of_squares on a GPU without the host: the same per-tensor sums, summed in order into one double
// that stays on the GPU. Returns its device address, valid until the next call (a split model's
// ranks then sum theirs over a group there: clip_grad_norm_split_queued).
double *sum_of_squares_on_gpu(Tensor *const *tensors, int n);
// The tensors (on a GPU) scaled by max_norm / (sqrt(*device_squares) + 1e-6) where that is below 1,
// clip_grad_norm's rule and arithmetic (adamw.h), the norm never read by the host: one kernel
// computes the coefficient from the sum of squares on the GPU, and each tensor's scale reads it there.
void scale_to_norm_on_gpu(Tensor *const *tensors, int n, const double *device_squares, double max_norm);

// ------------------------------------------------------------------ the CNN's operations
//
// For the layers of conv.h. Images are kept channel-major: a batch of B
// images of C channels, H x W, is the tensor [C, B * H * W] (C rows; each row
// holds channel c of every image, image after image). That is exactly what a
// convolution's GEMM
//     W [C_out, C_in * k * k] @ im2col(x) [C_in * k * k, B * H * W]
// produces, so no layer transposes its output. Only Flatten reorders, into
// PyTorch's [B, C * H * W]. A one-channel batch [1, B * H * W] is the same
// memory as MNIST's [B, 784].

// The first rows * cols elements of t's storage, seen as [rows, cols]: a layer's
// buffer, sized for the largest batch, holding a smaller one.
Tensor tensor_view(const Tensor *t, int rows, int cols);

// Integers (argmax positions, labels) on a device, as a Tensor holds floats.
typedef struct {
    int *data;
    size_t count;
    Device device;
} IntBuffer;
IntBuffer int_buffer_new(size_t count, Device device);
void int_buffer_free(IntBuffer *buffer);
// buffer's first n = host's n (a batch's tokens): queued on the compute stream on a GPU, the host
// array free to reuse on return, no host wait (device_upload).
void int_buffer_from_host(IntBuffer *buffer, const int *host, size_t n);

// A convolution's geometry: stride 1, a kernel x kernel window, `padding`
// zeros around each image (padding = (kernel - 1) / 2 keeps H x W).
typedef struct {
    int channels, batch, height, width;  // the input [channels, batch * height * width]
    int kernel, padding;
} ConvGeometry;
int conv_out_height(const ConvGeometry *g);
int conv_out_width(const ConvGeometry *g);

// im2col: every window of x as a column. columns [channels * k * k, batch *
// out_h * out_w]; row (c, dy, dx), column (b, y, x) holds x[c, b, y + dy -
// padding, x + dx - padding], or 0 outside the image.
void im2col(const Tensor *x, const ConvGeometry *g, Tensor *columns);
// col2im, im2col's adjoint: x [channels, batch * h * w] = for each pixel, the
// sum of the column entries that im2col copied it to, in (dy, dx) order.
// Overwrites x.
void col2im(const Tensor *columns, const ConvGeometry *g, Tensor *x);

// y [rows, cols] += bias[row] for each row (a convolution's bias: one per
// output channel), then y = max(y, 0) when relu.
void add_row_bias(Tensor *y, const Tensor *bias, bool relu);
// sums [1, rows] += the sum of each row of x [rows, cols] (the bias gradient).
void add_sum_of_rows(const Tensor *x, Tensor *sums);

// MaxPool2d(size): x [planes, h * w] as planes of h x w (planes = channels x
// batch), windows of size x size with stride size (out h / size x w / size,
// rounded down). argmax[i] = the index in x of output i's maximum: the first
// one in the window's row-major order, a NaN if there is one (PyTorch's rule).
void max_pool2d(const Tensor *x, int height, int width, int size, Tensor *y, IntBuffer *argmax);
// grad_x = 0 except grad_x[argmax[i]] = grad_y[i] (windows do not overlap).
void max_pool2d_backward(const Tensor *grad_y, const IntBuffer *argmax, Tensor *grad_x);

// x seen as [a, b, inner] -> y [b, a, inner]: channel-major images [C, B, H*W]
// to PyTorch's flattened [B, C * H*W] (a = C, b = B), and back (a = B, b = C).
void swap_outer_axes(const Tensor *x, int a, int b, int inner, Tensor *y);
