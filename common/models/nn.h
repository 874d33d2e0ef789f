// nn.h: the layers, the MLP and the optimizers, with PyTorch's semantics.
//
// Shapes follow torch.nn: a Linear layer holds weight [out, in] and bias [out]
// (stored [1, out]) and computes y = x @ weight^T + bias for x [B, in].
// Gradients ACCUMULATE, as in PyTorch: call mlp_zero_grad() before each
// backward (or don't, to accumulate over micro-batches).
//
// Everything here is plain math over tensor_ops.h (ReLU, the losses, the
// optimizers' updates) and tensor.h's gemm; those operations choose between
// the CPU and the GPU, so these layers hold no device-specific code or state.
#pragma once
#include "base/rng.h"
#include "runtime/memory_budget.h"  // MemoryNeed
#include "tensor/tensor.h"
#include "tensor/tensor_ops.h"      // relu_forward, relu_backward, softmax_cross_entropy, mse_loss, ...

// A named parameter and its gradient, as model.named_parameters() yields them.
// Names are the PyTorch state_dict keys ("fc.0.weight"), which the HDF5
// checkpoints use too.
typedef struct {
    char name[64];  // room for nanoGPT's longest: "transformer.h.11.attn.c_attn.weight"
    Tensor *value;
    Tensor *grad;
    // The state_dict shape where it is not the tensor's own (a Conv2d weight
    // [64, 32, 3, 3] is the tensor [64, 288]); all 0: [rows, cols], a bias [cols].
    int dims[4];
} Param;

typedef struct {
    Tensor weight;       // [out, in]
    Tensor bias;         // [1, out]
    Tensor grad_weight;  // [out, in]
    Tensor grad_bias;    // [1, out]
} Linear;

// nn.Linear's default init: weight, then bias, each ~ U(-1/sqrt(in), 1/sqrt(in)).
void linear_init(Linear *layer, int in, int out, Rng *rng, Device device);
void linear_free(Linear *layer);
// y [B, out] = x @ weight^T + bias, and then ReLU in the same pass when relu.
void linear_forward(const Linear *layer, const Tensor *x, Tensor *y, bool relu);
// grad_weight += grad_y^T @ x; grad_bias += sum over rows of grad_y;
// grad_x = grad_y @ weight (skipped when grad_x is NULL: the input needs none).
void linear_backward(Linear *layer, const Tensor *x, const Tensor *grad_y, Tensor *grad_x);

// ReLU is an elementwise operation of tensor_ops.h: relu_forward (in place)
// and relu_backward. So are the losses: softmax_cross_entropy (nn.CrossEntropyLoss,
// forward and gradient in one pass) and mse_loss (nn.MSELoss).

// The workshop's Net: Linear, ReLU, Linear, ... (nn.Sequential named "fc", so
// layer i is "fc.<2i>" in the state_dict: fc.0, fc.2).
typedef struct {
    int n_layers;
    Linear *layers;
    Tensor *outputs;       // [n_layers] of [max_batch, out_i]: kept for backward
    Tensor *grad_outputs;  // [n_layers] of [max_batch, out_i]
    // With --dtype bfloat16 on a GPU (matmul_set_dtype before mlp_new), the products' operands
    // are kept rounded (tensor.h's bfloat16_room) by what writes them: the weights, rounded in
    // one launch as a forward begins and kept until its backward ends; the hidden outputs (bias
    // + ReLU); the output gradients (the loss, ReLU's backward). No product rounds its own.
    int max_batch;
    int n_params;
    Param *params;         // fc.0.weight, fc.0.bias, fc.2.weight, ... (model.parameters() order)
} Mlp;

// Called by mlp_backward as soon as params[index]'s gradient is final (the last
// layer's first), like autograd's per-parameter hooks: it lets DDP start
// communicating while backward goes on.
typedef void (*GradReadyHook)(void *context, int index);

// sizes = {784, 128, 10}: Linear(784,128), ReLU, Linear(128,10).
enum { MLP_MAX_SIZES = 17 };  // the input, up to 15 hidden widths, the output
// The widths of --hidden W,W,...: "512,512,512" -> {inputs, 512, 512, 512, outputs}; returns
// how many. A malformed list is a usage error that names the flag (usage_error: exit 2, every rank).
int mlp_sizes_from_hidden(const char *hidden, int inputs, int outputs, int sizes[MLP_MAX_SIZES]);
// The MLP's name in the programs' settings lines: "784-512-512-10".
void mlp_describe_sizes(const int *sizes, int n_sizes, char *out, size_t size);
// Layer i's state_dict names, which the HDF5 files use too: pair[0] "fc.<2i>.weight", pair[1]
// "fc.<2i>.bias". Every model made of the MLP's layers, whole or split (Day 4), names them here.
void mlp_name_layer(Param pair[2], int layer);
Mlp mlp_new(const int *sizes, int n_sizes, int max_batch, Rng *rng, Device device);
void mlp_free(Mlp *model);
const Tensor *mlp_forward(Mlp *model, const Tensor *x);  // returns the logits [B, classes]
// Cross-entropy of the last forward's logits against labels (the mean over the
// batch). Like autograd's graph, the model keeps d loss / d logits for backward.
float mlp_loss(Mlp *model, const int *labels);
// The same, with the loss written to `slot` instead of returned (on a GPU rank the host does not
// wait for it: train/step_losses.h reads the step's losses when the program prints). device_labels:
// the batch's labels on the GPU (mnist_batch_device_labels), or NULL.
void mlp_loss_to(Mlp *model, const int *labels, const int *device_labels, LossSlot slot);
// nn.MSELoss(): the mean over all elements of (output - target)^2, against the
// last forward's output; keeps d loss / d output = 2 (output - target) / numel.
float mlp_mse_loss(Mlp *model, const Tensor *target);
// (loss * factor).backward() instead of loss.backward(): scales the gradient
// that the next mlp_backward starts from (gradient accumulation weights each
// micro-batch by its share of the step's samples).
void mlp_scale_loss(Mlp *model, float factor);
// loss.backward(): gradients of the last mlp_loss, accumulated into each
// parameter's grad. x is the batch given to forward. The hook may be NULL.
void mlp_backward(Mlp *model, const Tensor *x, GradReadyHook hook, void *context);
void mlp_zero_grad(Mlp *model);
// optimizer.zero_grad() for any model's parameters: every gradient 0 (on a GPU in one launch).
void params_zero_grad(const Param *params, int n_params);
// Fraction of x's rows whose argmax logit equals the label (no gradients).
double mlp_accuracy(Mlp *model, const Tensor *x, const int *labels);
size_t mlp_num_weights(const Mlp *model);
// What mlp_new(sizes, n_sizes, max_batch) and its training will hold, added to
// `need` (memory_budget.h) before anything is allocated: the parameters, their
// gradients, `state_floats` floats of optimizer state per weight (Adam's 2,
// SGD's 0), and every layer's output and its gradient for max_batch rows (and,
// with --dtype bfloat16, the rounded copies mlp_new keeps of them).
void mlp_add_memory_need(MemoryNeed *need, const int *sizes, int n_sizes, int max_batch, int state_floats);
// The largest matrix a product of Linear layers first_layer .. end_layer - 1 (layer l: sizes[l] ->
// sizes[l + 1]) reads for `rows` rows: an input, an output's gradient or a weight (whole: a bound
// on a split layer's). What --dtype bfloat16 rounds (tensor.h's matmul_add_memory_need).
double mlp_largest_operand(const int *sizes, int first_layer, int end_layer, int rows);
// A 64-bit hash of every parameter's bits: equal on two ranks iff (almost
// surely) their models are bit-identical.
unsigned long long params_checksum(const Param *params, int n_params);
// The same hash, continued over more parameters: a model split across ranks
// (Day 4) hashes its parts in order, each rank going on from the last one's
// hash, and ends with the whole model's params_checksum.
#define PARAMS_CHECKSUM_START 1469598103934665603ULL  // FNV-1a's offset basis
unsigned long long params_checksum_continue(unsigned long long hash, const Param *params, int n_params);

// torch.optim.Adam (betas 0.9, 0.999, eps 1e-8, no weight decay), the same
// operations in the same order as PyTorch's single-tensor implementation.
typedef struct {
    Param *params;
    int n_params;
    Tensor *exp_avg, *exp_avg_sq;  // first and second moments, like the params
    double lr, beta1, beta2, eps;
    long step;
    AdamCoefficients prepared;              // adam_prepare_step's, for adam_apply_step on a CPU
    AdamCoefficients *device_coefficients;  // adam_prepare_step's on a GPU (NULL until then)
    AdamTensors *gpu_tensors;               // on a GPU, the tensors' table for one launch (tensor_ops.h)
} Adam;

Adam adam_new(Param *params, int n_params, double lr);
void adam_step(Adam *adam);
// adam_step after AdamW's decoupled weight decay: params[i] *= keep first where decays[i] (decays
// NULL: none; adamw.h). On a GPU the two are one pass over each tensor, every tensor in one launch.
void adam_step_decayed(Adam *adam, const bool *decays, float keep);
// adam_step in two halves, for a step replayed from a CUDA graph (train/step_graph.h), whose
// kernels' arguments are those of its capture: adam_prepare_step computes the step's coefficients
// and, on a GPU, copies them to device memory (before the graph's launch); adam_apply_step updates
// the parameters, the kernels reading them there (inside the graph). The same bits as adam_step.
void adam_prepare_step(Adam *adam);
void adam_apply_step(Adam *adam);
void adam_free(Adam *adam);

// torch.optim.SGD without momentum: p -= lr * grad.
void sgd_step(const Param *params, int n_params, double lr);
