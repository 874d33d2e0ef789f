// tensor.h: a 2-D float buffer that knows its shape and where it lives.
//
// Every tensor here is a matrix [rows, cols] in row-major order (a bias is
// [1, out]), which is all an MLP needs and keeps the GEMM calls readable.
// The CPU/GPU choice is made here and in nn; programs never #ifdef on CUDA.
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef enum { DEVICE_CPU, DEVICE_CUDA } Device;

typedef struct {
    float *data;
    int rows, cols;
    Device device;
} Tensor;

Tensor tensor_zeros(int rows, int cols, Device device);
void tensor_free(Tensor *t);
static inline size_t tensor_numel(const Tensor *t) { return (size_t)t->rows * (size_t)t->cols; }

// The first `rows` rows of t, sharing its storage (a partial last batch).
Tensor tensor_rows(const Tensor *t, int rows);

void tensor_fill(Tensor *t, float value);
void tensor_copy(Tensor *dst, const Tensor *src);  // same shape; any devices

// C = alpha * op(A) @ op(B) + beta * C, where op(X) is X or X^T.
// CBLAS on the CPU (cuBLAS will serve CUDA tensors). Shapes are checked.
void gemm(bool transpose_a, bool transpose_b, float alpha, const Tensor *a, const Tensor *b,
          float beta, Tensor *c);

// Parse --device cpu|cuda|auto into a Device, a usage error if unavailable.
Device device_from_flag(const char *flag);
const char *device_name(Device device);
