// tensor.c: CPU tensors and GEMM through CBLAS. See tensor.h.
#include "tensor.h"

#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "check.h"

Tensor tensor_zeros(int rows, int cols, Device device) {
    CHECK(device == DEVICE_CPU, "this build has no CUDA tensors");
    CHECK(rows >= 0 && cols >= 0, "bad tensor shape [%d, %d]", rows, cols);
    Tensor t = {.rows = rows, .cols = cols, .device = device};
    t.data = xcalloc((size_t)rows * (size_t)cols, sizeof(float));
    return t;
}

void tensor_free(Tensor *t) {
    free(t->data);
    *t = (Tensor){0};
}

Tensor tensor_rows(const Tensor *t, int rows) {
    CHECK(rows >= 0 && rows <= t->rows, "view of %d rows of a [%d, %d] tensor", rows, t->rows, t->cols);
    Tensor view = *t;
    view.rows = rows;
    return view;
}

void tensor_fill(Tensor *t, float value) {
    if (value == 0.0f) {
        memset(t->data, 0, tensor_numel(t) * sizeof(float));
        return;
    }
    for (size_t i = 0; i < tensor_numel(t); i++) t->data[i] = value;
}

void tensor_copy(Tensor *dst, const Tensor *src) {
    CHECK(dst->rows == src->rows && dst->cols == src->cols, "copy [%d, %d] into [%d, %d]",
          src->rows, src->cols, dst->rows, dst->cols);
    memcpy(dst->data, src->data, tensor_numel(src) * sizeof(float));
}

void gemm(bool transpose_a, bool transpose_b, float alpha, const Tensor *a, const Tensor *b,
          float beta, Tensor *c) {
    int m = transpose_a ? a->cols : a->rows;  // op(A) is [m, k]
    int k = transpose_a ? a->rows : a->cols;
    int kb = transpose_b ? b->cols : b->rows;  // op(B) is [k, n]
    int n = transpose_b ? b->rows : b->cols;
    CHECK(k == kb && c->rows == m && c->cols == n,
          "gemm shapes: op(A) [%d, %d] @ op(B) [%d, %d] -> C [%d, %d]", m, k, kb, n, c->rows, c->cols);
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a->data, a->cols,
                b->data, b->cols, beta, c->data, c->cols);
}

Device device_from_flag(const char *flag) {
    if (strcmp(flag, "cuda") == 0)
        usage_error("--device cuda: GPU support is not implemented yet (CPU programs only; use --device cpu)");
    return DEVICE_CPU;  // "cpu", and "auto" on a CPU-only build
}

const char *device_name(Device device) { return device == DEVICE_CPU ? "cpu" : "cuda"; }
