// tensor.c: tensors on the CPU and the GPU, GEMM through CBLAS or cuBLAS. See tensor.h.
#include "tensor.h"

#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "check.h"
#if HAVE_CUDA
#include "kernels.h"
#endif

Tensor tensor_zeros(int rows, int cols, Device device) {
    CHECK(rows >= 0 && cols >= 0, "bad tensor shape [%d, %d]", rows, cols);
    Tensor t = {.rows = rows, .cols = cols, .device = device};
    if (tensor_on_gpu(&t)) {
#if HAVE_CUDA
        size_t bytes = tensor_numel(&t) * sizeof(float);
        t.data = device_alloc(bytes);
        if (bytes) CHECK_CUDA(cudaMemsetAsync(t.data, 0, bytes, device_stream()));
#endif
        return t;
    }
    t.data = xcalloc((size_t)rows * (size_t)cols, sizeof(float));
    return t;
}

void tensor_free(Tensor *t) {
    if (tensor_on_gpu(t)) device_free(t->data);
    else free(t->data);
    *t = (Tensor){0};
}

Tensor tensor_rows(const Tensor *t, int rows) {
    CHECK(rows >= 0 && rows <= t->rows, "view of %d rows of a [%d, %d] tensor", rows, t->rows, t->cols);
    Tensor view = *t;
    view.rows = rows;
    return view;
}

void tensor_fill(Tensor *t, float value) {
    if (tensor_on_gpu(t)) {
#if HAVE_CUDA
        if (value == 0.0f) CHECK_CUDA(cudaMemsetAsync(t->data, 0, tensor_numel(t) * sizeof(float), device_stream()));
        else gpu_fill(t->data, tensor_numel(t), value, device_stream());
#endif
        return;
    }
    if (value == 0.0f) {
        memset(t->data, 0, tensor_numel(t) * sizeof(float));
        return;
    }
    for (size_t i = 0; i < tensor_numel(t); i++) t->data[i] = value;
}

void tensor_copy(Tensor *dst, const Tensor *src) {
    CHECK(dst->rows == src->rows && dst->cols == src->cols, "copy [%d, %d] into [%d, %d]",
          src->rows, src->cols, dst->rows, dst->cols);
    size_t bytes = tensor_numel(src) * sizeof(float);
    if (tensor_on_gpu(dst) || tensor_on_gpu(src)) {
#if HAVE_CUDA
        // cudaMemcpyDefault: the runtime knows where each pointer lives.
        CHECK_CUDA(cudaMemcpyAsync(dst->data, src->data, bytes, cudaMemcpyDefault, device_stream()));
        // A host side must be safe to read (dst) or reuse (src) on return.
        if (!tensor_on_gpu(dst) || !tensor_on_gpu(src)) CHECK_CUDA(cudaStreamSynchronize(device_stream()));
#endif
        return;
    }
    memcpy(dst->data, src->data, bytes);
}

void tensor_to_host(const Tensor *t, float *host) {
    Tensor view = {.data = host, .rows = t->rows, .cols = t->cols, .device = DEVICE_CPU};
    tensor_copy(&view, t);
}

void tensor_from_host(Tensor *t, const float *host) {
    Tensor view = {.data = (float *)host, .rows = t->rows, .cols = t->cols, .device = DEVICE_CPU};
    tensor_copy(t, &view);
}

void tensor_divide(Tensor *t, float divisor) {
    if (tensor_on_gpu(t)) {
#if HAVE_CUDA
        gpu_divide(t->data, t->data, tensor_numel(t), divisor, device_stream());
#endif
        return;
    }
    for (size_t i = 0; i < tensor_numel(t); i++) t->data[i] /= divisor;
}

void tensor_scale(Tensor *t, float factor) {
    if (tensor_on_gpu(t)) {
#if HAVE_CUDA
        gpu_scale(t->data, tensor_numel(t), factor, device_stream());
#endif
        return;
    }
    for (size_t i = 0; i < tensor_numel(t); i++) t->data[i] *= factor;
}

void gemm(bool transpose_a, bool transpose_b, float alpha, const Tensor *a, const Tensor *b,
          float beta, Tensor *c) {
    int m = transpose_a ? a->cols : a->rows;  // op(A) is [m, k]
    int k = transpose_a ? a->rows : a->cols;
    int kb = transpose_b ? b->cols : b->rows;  // op(B) is [k, n]
    int n = transpose_b ? b->rows : b->cols;
    CHECK(k == kb && c->rows == m && c->cols == n,
          "gemm shapes: op(A) [%d, %d] @ op(B) [%d, %d] -> C [%d, %d]", m, k, kb, n, c->rows, c->cols);
    CHECK(a->device == c->device && b->device == c->device, "gemm: operands on different devices");
    if (m == 0 || n == 0) return;
    if (tensor_on_gpu(c)) {
#if HAVE_CUDA
        // cuBLAS is column-major, and a row-major [r, c] matrix is a column-major
        // [c, r] one: its transpose. So compute C^T = op(B)^T @ op(A)^T, which
        // cuBLAS sees as B' @ A' on the very same buffers: swap the operands.
        CHECK_CUBLAS(cublasSgemm(device_cublas(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b->data, b->cols,
                                 a->data, a->cols, &beta, c->data, c->cols));
#endif
        return;
    }
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a->data, a->cols,
                b->data, b->cols, beta, c->data, c->cols);
}

#if HAVE_CUDA
// A vector of ones on the GPU, as long as the longest x seen: the sum over
// rows is then one GEMV, x^T @ ones, which cuBLAS does at memory speed.
static float *g_ones;
static size_t g_ones_count;

static const float *ones(size_t count) {
    if (count > g_ones_count) {
        device_free(g_ones);
        g_ones = device_alloc(count * sizeof(float));
        gpu_fill(g_ones, count, 1.0f, device_stream());
        g_ones_count = count;
    }
    return g_ones;
}
#endif

void add_sum_over_rows(const Tensor *x, Tensor *sums) {
    CHECK(sums->rows == 1 && sums->cols == x->cols && sums->device == x->device,
          "sum over the rows of [%d, %d] into [%d, %d]", x->rows, x->cols, sums->rows, sums->cols);
    if (tensor_on_gpu(x)) {
#if HAVE_CUDA
        if (x->rows == 0) return;
        const float one = 1.0f;
        // Column-major, x is [cols, rows]: sums += x @ ones(rows).
        CHECK_CUBLAS(cublasSgemv(device_cublas(), CUBLAS_OP_N, x->cols, x->rows, &one, x->data, x->cols,
                                 ones((size_t)x->rows), 1, &one, sums->data, 1));
#endif
        return;
    }
    for (int r = 0; r < x->rows; r++) {
        const float *row = x->data + (size_t)r * x->cols;
        for (int c = 0; c < x->cols; c++) sums->data[c] += row[c];
    }
}
