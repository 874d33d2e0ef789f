// tensor.h: a 2-D float buffer that knows its shape and where it lives.
//
// Every tensor here is a matrix [rows, cols] in row-major order (a bias is
// [1, out]), which is all an MLP needs and keeps the GEMM calls readable.
// The CPU/GPU choice is made here and in tensor_ops (the layers' operations);
// nn and the programs never #ifdef on CUDA.
// A CUDA tensor's data is device memory: only kernels, cuBLAS and copies touch
// it, and all of them run in order on the compute stream (device.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/device.h"
#include "runtime/memory_budget.h"  // MemoryNeed

typedef struct {
    float *data;
    int rows, cols;
    Device device;
    // On a GPU, where its writer keeps data's values rounded to bfloat16 (round_to_bfloat16's bits)
    // in the same order, or NULL (most tensors): a bfloat16 gemm reads A or B there, where it would
    // round it once more at each product. mnist_batch's batch has one with --dtype bfloat16, written
    // in the pass that gathers it, valid until the split's next batch; so do a model's tensors that
    // keep one (bfloat16_room). A view (tensor_rows, tensor_row_range) keeps it; a writer that does
    // not keep it up clears it (gemm's C, tensor_fill, tensor_copy, tensor_scale, the optimizers'
    // updates, ...), in the struct it is given only: so a tensor with a copy is written through that
    // struct, and a raw write (a collective, a load) comes where it has none (an MLP's weights: not
    // between a forward and its backward, nn.h).
    const uint16_t *bfloat16_copy;
    // Where the copy is kept, for a tensor given room by tensor_keep_bfloat16 (NULL: none). The
    // writers that keep the copy there as they write the tensor: add_column_bias (a layer's output),
    // relu_backward and softmax_cross_entropy_to (gradients), tensors_round_bfloat16 (weights).
    uint16_t *bfloat16_room;
} Tensor;

Tensor tensor_zeros(int rows, int cols, Device device);
void tensor_free(Tensor *t);
static inline size_t tensor_numel(const Tensor *t) { return (size_t)t->rows * (size_t)t->cols; }
// Is t on a GPU? A constant false in builds without CUDA, so that the GPU
// branches compile away.
static inline bool tensor_on_gpu(const Tensor *t) { return HAVE_CUDA && t->device == DEVICE_CUDA; }

// The first `rows` rows of t, sharing its storage (a partial last batch).
Tensor tensor_rows(const Tensor *t, int rows);
// Rows [first, first + rows) of t, sharing its storage, its bfloat16 copy too (a micro-batch, an
// evaluation's chunk).
Tensor tensor_row_range(const Tensor *t, int first, int rows);

// With bfloat16 matmuls on a GPU (matmul_set_dtype first), room for t's rounded copy
// (bfloat16_room), which its writers then keep (--dtype bfloat16: a product reads the operand its
// producer rounded as it wrote it, no launch of its own); otherwise nothing. tensor_free frees it.
void tensor_keep_bfloat16(Tensor *t);
// Each of tensors[0 .. n) that has room rounded into it, and its copy set (a model's weights
// before the products of a pass: two in a launch); the others untouched.
void tensors_round_bfloat16(Tensor *const *tensors, int n);
// t's copy forgotten (its values are about to change, or may have).
static inline void tensor_drop_bfloat16(Tensor *t) { t->bfloat16_copy = NULL; }

void tensor_fill(Tensor *t, float value);
// tensor_fill of each of tensors[0 .. n), all on one device: on a GPU in one launch (a model's
// zero_grad, where a memset per tensor made a row of small operations), from a table of their
// addresses on the GPU, sent when the list is not one of the last few sent (which may not happen
// during a CUDA graph's capture).
void tensors_fill(Tensor *const *tensors, int n, float value);
// dst = src, same shape, any pair of devices. Returns when dst may be read by
// the host (if dst is on the CPU) and src may be reused (if src is).
void tensor_copy(Tensor *dst, const Tensor *src);
// t = t / divisor (a division, as PyTorch's `grad /= world_size`), and t = t * factor.
void tensor_divide(Tensor *t, float divisor);
void tensor_scale(Tensor *t, float factor);
// Host copies of any tensor's values, e.g. to save or print them: into
// `host` [numel], and back.
void tensor_to_host(const Tensor *t, float *host);
void tensor_from_host(Tensor *t, const float *host);

// C = alpha * op(A) @ op(B) + beta * C, where op(X) is X or X^T.
// CBLAS on the CPU (cut into single-threaded pieces that the rank's threads
// share; the result is the same at any thread count), cuBLAS on the GPU.
// Shapes are checked.
void gemm(bool transpose_a, bool transpose_b, float alpha, const Tensor *a, const Tensor *b,
          float beta, Tensor *c);
// The GEMMs' precision (--dtype; torch.autocast(dtype=torch.bfloat16) for its matrix products):
// with MATMUL_BFLOAT16, gemm rounds A and B to bfloat16 (to nearest, ties to even) and multiplies
// them with float32 sums into a float32 C; the tensors themselves stay float32 (the weights, their
// gradients and Adam's moments: the master copies). On a GPU the tensor cores' bf16 GEMM
// (cublasGemmEx); on a CPU the same products (a bf16 x bf16 product is exact in float32) from
// rounded copies through the float32 GEMM: no faster, the GPU's arithmetic to compare with.
// PyTorch's autocast also rounds each product's result to bfloat16, which we keep in float32.
typedef enum { MATMUL_FLOAT32, MATMUL_BFLOAT16 } MatmulDtype;
// "float32" or "bfloat16" (a flag's value: a bad one is a usage error, exit 2).
MatmulDtype matmul_dtype_from_flag(const char *flag);
void matmul_set_dtype(MatmulDtype dtype);
MatmulDtype matmul_dtype(void);
// Until gemm_release_rounded, a bfloat16 gemm rounds t once, at the first product that reads it,
// where it would round it at every product: a Linear's output gradient, which both of its backward
// products read. Each product in between must read t, and none may write it. (With float32
// matmuls, nothing.) One operand at a time.
void gemm_hold_rounded(const Tensor *t);
void gemm_release_rounded(void);
// What bfloat16 matmuls' rounded operands take (nothing with float32), for a program's memory
// estimate: a product's two operands rounded, each at most `largest_operand` floats (the largest
// matrix any of the model's products reads), counted as float32 copies, the CPU's rounding (a GPU's
// copies are bfloat16: half of it, which also covers attention's three on a GPU: qkv's, the
// probabilities' and y's gradient's). Added under "bfloat16 copies".
void matmul_add_memory_need(MemoryNeed *need, double largest_operand);
// x rounded to bfloat16, as a float (its low 16 bits 0): NaN stays NaN, a value past bfloat16's
// largest becomes infinite.
float round_to_bfloat16(float x);
// The host's n floats x rounded to bfloat16 (all of this rank's threads) into *buffer, which grows
// to hold them (*capacity floats; free(*buffer) when done): a bfloat16 GEMM's operand on the CPU.
const float *rounded_to_bfloat16(float **buffer, size_t *capacity, const float *x, size_t n);
// sums [1, cols] += the sum over the rows of x [rows, cols] (a bias gradient).
void add_sum_over_rows(const Tensor *x, Tensor *sums);
