// tensor_ops.h: the tensor-level operations that the layers of nn.h are made of.
//
// Each operation makes the CPU/GPU choice once, inside: OpenMP loops on the
// rank's threads (results independent of the thread count: no shared sums,
// every reduction in a fixed order) or one CUDA kernel (kernels.cu) on the
// compute stream. The layers above (nn.c) are then plain math over these and
// tensor.h's gemm, with no #if HAVE_CUDA. Any scratch memory an operation
// needs on the GPU is its own (grown to the largest call), not its caller's.
//
// Layers: above tensor (and device), below nn.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "tensor.h"

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
// SGD without momentum: param -= lr * grad.
void sgd_update(Tensor *param, const Tensor *grad, float lr);
