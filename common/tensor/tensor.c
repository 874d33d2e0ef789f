// tensor.c: tensors on the CPU and the GPU, GEMM through CBLAS or cuBLAS. See tensor.h.
#include "tensor/tensor.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "base/check.h"
#include "base/cpu_dispatch.h"
#if HAVE_CUDA
#include "tensor/kernels.h"
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
    size_t n = tensor_numel(&t);
    t.data = xmalloc_huge_pages(n * sizeof(float));
    // Zeroed by the rank's threads: on a node of several sockets, each page
    // lands in the memory of the socket whose core touches it first.
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) t.data[i] = 0.0f;
    return t;
}

void tensor_free(Tensor *t) {
    if (tensor_on_gpu(t)) {
        device_free(t->data);
        if (t->bfloat16_room) device_free(t->bfloat16_room);
    } else {
        free(t->data);
    }
    *t = (Tensor){0};
}

Tensor tensor_rows(const Tensor *t, int rows) {
    CHECK(rows >= 0 && rows <= t->rows, "view of %d rows of a [%d, %d] tensor", rows, t->rows, t->cols);
    Tensor view = *t;
    view.rows = rows;
    return view;
}

Tensor tensor_row_range(const Tensor *t, int first, int rows) {
    CHECK(first >= 0 && rows >= 0 && first <= t->rows - rows, "view of rows %d to %d of a [%d, %d] tensor", first,
          first + rows, t->rows, t->cols);
    size_t at = (size_t)first * (size_t)t->cols;
    return (Tensor){.data = t->data + at, .rows = rows, .cols = t->cols, .device = t->device,
                    .bfloat16_copy = t->bfloat16_copy ? t->bfloat16_copy + at : NULL,
                    .bfloat16_room = t->bfloat16_room ? t->bfloat16_room + at : NULL};
}

void tensor_fill(Tensor *t, float value) {
    tensor_drop_bfloat16(t);
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
    size_t n = tensor_numel(t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) t->data[i] = value;
}

#if HAVE_CUDA
// tensors_fill's tables on the GPU (device.h) for the last FILL_LISTS lists of tensors filled: a
// model's gradients are one list, the same every step, and a program may have a few models.
enum { FILL_LISTS = 4 };
static DeviceTable g_fill_lists[FILL_LISTS];
static int g_fill_next;  // the list to replace next

static void fill_on_gpu(Tensor *const *tensors, int n, float value) {
    FillSpan *spans = xcalloc((size_t)n, sizeof *spans);  // (zeroed, and set field by field: device.h)
    size_t blocks = 0, bytes = (size_t)n * sizeof *spans;
    for (int i = 0; i < n; i++) {
        spans[i].data = tensors[i]->data, spans[i].n = tensor_numel(tensors[i]), spans[i].first_block = (int)blocks;
        blocks += gpu_span_blocks(spans[i].n);
        CHECK(blocks <= INT_MAX, "tensors_fill: %zu blocks of values in one launch", blocks);
    }
    int k = 0;
    while (k < FILL_LISTS && !device_table_holds(&g_fill_lists[k], spans, bytes)) k++;
    if (k == FILL_LISTS) k = g_fill_next, g_fill_next = (g_fill_next + 1) % FILL_LISTS;  // in place of the oldest sent
    const FillSpan *table = device_table_send(&g_fill_lists[k], spans, bytes, "tensors_fill");
    free(spans);
    gpu_fill_spans(table, n, (int)blocks, value, device_stream());
}
#endif

void tensors_fill(Tensor *const *tensors, int n, float value) {
    for (int i = 0; i < n; i++) tensor_drop_bfloat16(tensors[i]);
    if (n > 0 && tensor_on_gpu(tensors[0])) {
        for (int i = 1; i < n; i++) CHECK(tensor_on_gpu(tensors[i]), "tensors_fill: tensor %d of %d is not on the GPU", i, n);
#if HAVE_CUDA
        fill_on_gpu(tensors, n, value);
#endif
        return;
    }
    for (int i = 0; i < n; i++) tensor_fill(tensors[i], value);
}

void tensor_copy(Tensor *dst, const Tensor *src) {
    CHECK(dst->rows == src->rows && dst->cols == src->cols, "copy [%d, %d] into [%d, %d]",
          src->rows, src->cols, dst->rows, dst->cols);
    size_t bytes = tensor_numel(src) * sizeof(float);
    tensor_drop_bfloat16(dst);
    if (tensor_on_gpu(dst) || tensor_on_gpu(src)) {
#if HAVE_CUDA
        if (!tensor_on_gpu(dst)) {  // polled, before and after: see device_read_to_host
            device_read_to_host(dst->data, src->data, bytes, "a tensor's copy to the host");
            return;
        }
        // cudaMemcpyDefault: the runtime knows where each pointer lives.
        CHECK_CUDA(cudaMemcpyAsync(dst->data, src->data, bytes, cudaMemcpyDefault, device_stream()));
        // A host source must be safe to reuse on return.
        if (!tensor_on_gpu(src)) device_wait_stream(device_stream(), "a tensor's copy from the host");
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

CPU_DISPATCHED void tensor_divide(Tensor *t, float divisor) {
    tensor_drop_bfloat16(t);
    if (tensor_on_gpu(t)) {
#if HAVE_CUDA
        gpu_divide(t->data, t->data, tensor_numel(t), divisor, device_stream());
#endif
        return;
    }
    size_t n = tensor_numel(t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) t->data[i] /= divisor;
}

CPU_DISPATCHED void tensor_scale(Tensor *t, float factor) {
    tensor_drop_bfloat16(t);
    if (tensor_on_gpu(t)) {
#if HAVE_CUDA
        gpu_scale(t->data, tensor_numel(t), factor, device_stream());
#endif
        return;
    }
    size_t n = tensor_numel(t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) t->data[i] *= factor;
}

// ------------------------------------------------------------------ GEMM on the CPU's threads
//
// One GEMM on all of the rank's threads, with results that never depend on
// how many there are: the work is cut into pieces by the shape alone, each
// piece is one single-threaded sgemm, and the threads share out the pieces.
// By the shape, not by the thread count, even where the cut adds nothing up:
// a single-threaded sgemm gives an element other bits when its rows or its
// columns are cut differently (OpenBLAS 0.3.21: of 508 cuts into 2-64 pieces,
// over 11 shapes of the MLP and the tests and every transpose, 488 changed bits
// on the Haswell and Zen kernels, 58 on Cooperlake, 52 on SkylakeX, none on
// Sandybridge).
// OpenBLAS's own threading would be one line, but its results change with its
// thread count (per element, on its Haswell and Zen kernels), and splitting
// measured faster on every GEMM of the MLP (B = 6400, 2 cores, Cooperlake
// kernels, ms): x @ W1^T 4.5 split vs 5.2 OpenBLAS-threaded, h @ W2^T 0.15 vs
// 0.35, grad_y @ W2 0.07 vs 1.29, grad_W1 = grad_y^T @ x 3.8 vs 4.1.
//
// Where to cut: each piece packs its own copy of what it shares with the
// others. Cutting m (rows of C) repacks op(B) [k, n] for every piece, cutting
// n repacks op(A) [m, k], and cutting k (the batch, in a weight gradient)
// shares nothing but leaves a partial [m, n] product per piece to add up, in
// piece order. Each copies the product of the two other dimensions: cut the
// largest. (At 1 thread, B = 6400: grad_W1 cut along k into 16 pieces takes
// 7.6 ms, along n into 4 pieces 8.0 ms; x @ W1^T along m 7.4 ms, whole 7.8.)

enum { GEMM_GRAIN = 256, GEMM_MAX_PIECES = 64 };

// Pieces for cutting a dimension of `size`: at least GEMM_GRAIN each, a power
// of two (as thread counts usually are) and at most GEMM_MAX_PIECES.
static int gemm_pieces(int size) {
    int pieces = 1;
    while (pieces * 2 <= GEMM_MAX_PIECES && (long)pieces * 2 * GEMM_GRAIN <= size) pieces *= 2;
    return pieces;
}

// The start of piece p of `pieces` over [0, size).
static int piece_start(int size, int pieces, int p) { return (int)((long)size * p / pieces); }

// &op(X)[row, col] for a row-major X with leading dimension ld.
static const float *at(const float *x, int ld, bool transposed, int row, int col) {
    return transposed ? x + (size_t)col * ld + row : x + (size_t)row * ld + col;
}

static void sgemm_1(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static float *g_partials;  // [pieces, m, n] for a GEMM cut along k
static size_t g_partials_count;

CPU_DISPATCHED static void cpu_gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc) {
    // Cut the largest dimension; k only while the partial products take no more
    // memory than the operands (so a square-ish product cuts m or n instead).
    bool cut_k = k > m && k > n && (double)gemm_pieces(k) * m * n <= (double)k * (m + n);
    bool cut_m = !cut_k && m >= n;
    int pieces = gemm_pieces(cut_k ? k : cut_m ? m : n);
    if (pieces == 1) {
        sgemm_1(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else if (cut_m) {  // rows of C
#pragma omp parallel for schedule(dynamic, 1)
        for (int p = 0; p < pieces; p++) {
            int m0 = piece_start(m, pieces, p), m1 = piece_start(m, pieces, p + 1);
            sgemm_1(transpose_a, transpose_b, m1 - m0, n, k, alpha, at(a, lda, transpose_a, m0, 0), lda, b, ldb, beta,
                    c + (size_t)m0 * ldc, ldc);
        }
    } else if (!cut_k) {  // columns of C
#pragma omp parallel for schedule(dynamic, 1)
        for (int p = 0; p < pieces; p++) {
            int n0 = piece_start(n, pieces, p), n1 = piece_start(n, pieces, p + 1);
            sgemm_1(transpose_a, transpose_b, m, n1 - n0, k, alpha, a, lda, at(b, ldb, transpose_b, 0, n0), ldb, beta,
                    c + n0, ldc);
        }
    } else {  // the sum over k: a partial product per piece
        size_t count = (size_t)pieces * m * n;
        if (count > g_partials_count) {
            free(g_partials);
            g_partials = xmalloc_huge_pages(count * sizeof(float));
            g_partials_count = count;
        }
        float *partials = g_partials;
#pragma omp parallel for schedule(dynamic, 1)
        for (int p = 0; p < pieces; p++) {
            int k0 = piece_start(k, pieces, p), k1 = piece_start(k, pieces, p + 1);
            sgemm_1(transpose_a, transpose_b, m, n, k1 - k0, 1.0f, at(a, lda, transpose_a, 0, k0), lda,
                    at(b, ldb, transpose_b, k0, 0), ldb, 0.0f, partials + (size_t)p * m * n, n);
        }
        // C = alpha * (the partials' sum, in piece order) + beta * C, summed
        // into piece 0's rows. beta 0 never reads C, as BLAS does not (it may
        // hold NaNs).
#pragma omp parallel for
        for (int row = 0; row < m; row++) {
            float *sum = partials + (size_t)row * n;
            for (int p = 1; p < pieces; p++) {
                const float *part = partials + ((size_t)p * m + row) * n;
                for (int col = 0; col < n; col++) sum[col] += part[col];
            }
            float *out = c + (size_t)row * ldc;
            for (int col = 0; col < n; col++)
                out[col] = beta == 0.0f ? alpha * sum[col] : alpha * sum[col] + beta * out[col];
        }
    }
}

static MatmulDtype g_matmul_dtype = MATMUL_FLOAT32;

MatmulDtype matmul_dtype_from_flag(const char *flag) {
    if (strcmp(flag, "float32") == 0) return MATMUL_FLOAT32;
    if (strcmp(flag, "bfloat16") == 0) return MATMUL_BFLOAT16;
    usage_error("--dtype: expected float32 or bfloat16");
    return MATMUL_FLOAT32;
}

void matmul_set_dtype(MatmulDtype dtype) { g_matmul_dtype = dtype; }
MatmulDtype matmul_dtype(void) { return g_matmul_dtype; }

float round_to_bfloat16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits |= 0x00400000u;  // NaN: quiet, so that it stays one
    else bits += 0x7fffu + ((bits >> 16) & 1u);                    // to nearest, ties to the even half
    bits &= 0xffff0000u;
    memcpy(&x, &bits, sizeof x);
    return x;
}

void matmul_add_memory_need(MemoryNeed *need, double largest_operand) {
    if (g_matmul_dtype == MATMUL_BFLOAT16) memory_need_add(need, "bfloat16 copies", 2 * largest_operand * sizeof(float));
}

const float *rounded_to_bfloat16(float **buffer, size_t *capacity, const float *x, size_t n) {
    if (n > *capacity) {
        free(*buffer);
        *buffer = xmalloc(n * sizeof(float) + 1);
        *capacity = n;
    }
    float *copy = *buffer;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) copy[i] = round_to_bfloat16(x[i]);
    return copy;
}

// The operand that gemm_hold_rounded holds: its values, their count, and whether its rounded copy
// (slot 0's) is made yet. No data: none held.
static struct {
    const float *data;
    size_t count;
    bool rounded;
} g_held;

void gemm_hold_rounded(const Tensor *t) {
    CHECK(!g_held.data, "gemm_hold_rounded: an operand is held already");
    g_held.data = t->data, g_held.count = tensor_numel(t), g_held.rounded = false;
}

void gemm_release_rounded(void) { g_held.data = NULL; }

static bool is_held(const Tensor *t) { return g_held.data && t->data == g_held.data && tensor_numel(t) == g_held.count; }

// Which slot of rounded copies a product's operand takes (which: 0 for A, 1 for B), and whether it
// must be rounded there: the held operand slot 0, rounded at the first product that reads it; while
// one is held, the product's other operand slot 1.
static int rounded_slot(int which, const Tensor *t, bool *round) {
    *round = true;
    if (!g_held.data) return which;
    if (!is_held(t)) return 1;
    *round = !g_held.rounded;
    g_held.rounded = true;
    return 0;
}

// A bfloat16 GEMM's operands on the CPU: rounded copies, one per operand, grown to the largest.
static float *g_rounded[2];
static size_t g_rounded_count[2];

static const float *rounded_copy(int which, const Tensor *t) {
    bool round;
    int slot = rounded_slot(which, t, &round);
    if (!round) return g_rounded[slot];
    return rounded_to_bfloat16(&g_rounded[slot], &g_rounded_count[slot], t->data, tensor_numel(t));
}

#if HAVE_CUDA
// A bfloat16 GEMM's operands on the GPU, rounded (gpu_round_to_bfloat16), grown to the largest.
static DeviceBuffer g_bf16_operands[2];

// Where operand `which` of a product is read rounded: the copy its writer keeps (Tensor's
// bfloat16_copy), or a slot of ours, which *round says whether to round it into.
static const uint16_t *gpu_rounded_operand(int which, const Tensor *t, uint16_t **round_into) {
    *round_into = NULL;
    if (t->bfloat16_copy) return t->bfloat16_copy;
    bool round;
    int slot = rounded_slot(which, t, &round);
    uint16_t *copy = device_buffer_reserve(&g_bf16_operands[slot], tensor_numel(t) * sizeof(uint16_t));
    if (round) *round_into = copy;
    return copy;
}

// C = alpha op(A) op(B) + beta C, row-major as gemm's, A and B rounded to bfloat16 and multiplied on
// the tensor cores with float32 sums (cuBLAS's CUBLAS_COMPUTE_32F), C float32. Where both operands
// need rounding, one launch rounds both (a step of small kernels is bound by their launches).
static void gpu_bfloat16_gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const Tensor *a,
                              const Tensor *b, float beta, Tensor *c) {
    uint16_t *round_a, *round_b;
    const uint16_t *a16 = gpu_rounded_operand(0, a, &round_a), *b16 = gpu_rounded_operand(1, b, &round_b);
    if (round_a && round_b)
        gpu_round_two_to_bfloat16(a->data, tensor_numel(a), round_a, b->data, tensor_numel(b), round_b, device_stream());
    else if (round_a)
        gpu_round_to_bfloat16(a->data, tensor_numel(a), round_a, device_stream());
    else if (round_b)
        gpu_round_to_bfloat16(b->data, tensor_numel(b), round_b, device_stream());
    const int lda = a->cols, ldb = b->cols, ldc = c->cols;
    // Column-major: C^T = op(B)^T op(A)^T, as gemm's cublasSgemm below.
    CHECK_CUBLAS(cublasGemmEx(device_cublas(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b16, CUDA_R_16BF, ldb, a16,
                              CUDA_R_16BF, lda, &beta, c->data, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}
#endif

void tensor_keep_bfloat16(Tensor *t) {
    if (!tensor_on_gpu(t) || g_matmul_dtype != MATMUL_BFLOAT16 || t->bfloat16_room) return;
#if HAVE_CUDA
    t->bfloat16_room = device_alloc(tensor_numel(t) * sizeof(uint16_t));
#endif
}

void tensors_round_bfloat16(Tensor *const *tensors, int n) {
#if HAVE_CUDA
    if (g_matmul_dtype != MATMUL_BFLOAT16) return;
    Tensor *first = NULL;  // one waiting for a second: a launch rounds two
    for (int i = 0; i < n; i++) {
        Tensor *t = tensors[i];
        if (!t->bfloat16_room || !tensor_on_gpu(t)) continue;
        t->bfloat16_copy = t->bfloat16_room;
        if (!first) {
            first = t;
            continue;
        }
        gpu_round_two_to_bfloat16(first->data, tensor_numel(first), first->bfloat16_room, t->data, tensor_numel(t),
                                  t->bfloat16_room, device_stream());
        first = NULL;
    }
    if (first) gpu_round_to_bfloat16(first->data, tensor_numel(first), first->bfloat16_room, device_stream());
#else
    (void)tensors, (void)n;
#endif
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
    CHECK(!g_held.data || ((is_held(a) || is_held(b)) && c->data != g_held.data),
          "gemm: a product between gemm_hold_rounded and its release must read the held operand, and not write it");
    tensor_drop_bfloat16(c);
    if (m == 0 || n == 0) return;
    if (tensor_on_gpu(c)) {
#if HAVE_CUDA
        // cuBLAS is column-major, and a row-major [r, c] matrix is a column-major
        // [c, r] one: its transpose. So compute C^T = op(B)^T @ op(A)^T, which
        // cuBLAS sees as B' @ A' on the very same buffers: swap the operands.
        if (g_matmul_dtype == MATMUL_BFLOAT16) {
            gpu_bfloat16_gemm(transpose_a, transpose_b, m, n, k, alpha, a, b, beta, c);
            return;
        }
        CHECK_CUBLAS(cublasSgemm(device_cublas(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b->data, b->cols,
                                 a->data, a->cols, &beta, c->data, c->cols));
#endif
        return;
    }
    const float *a_values = a->data, *b_values = b->data;
    if (g_matmul_dtype == MATMUL_BFLOAT16 && k > 0) a_values = rounded_copy(0, a), b_values = rounded_copy(1, b);
    cpu_gemm(transpose_a, transpose_b, m, n, k, alpha, a_values, a->cols, b_values, b->cols, beta, c->data, c->cols);
}

#if HAVE_CUDA
// A vector of ones on the GPU, as long as the longest x seen: the sum over
// rows is then one GEMV, x^T @ ones, which cuBLAS does at memory speed.
static DeviceBuffer g_ones;

static const float *ones(size_t count) {
    size_t held = g_ones.bytes;
    float *ones = device_buffer_reserve(&g_ones, count * sizeof(float));
    if (g_ones.bytes != held) gpu_fill(ones, g_ones.bytes / sizeof(float), 1.0f, device_stream());  // grown
    return ones;
}
#endif

CPU_DISPATCHED void add_sum_over_rows(const Tensor *x, Tensor *sums) {
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
    // Threads take blocks of 16 columns (a cache line); each column is summed
    // over the rows in row order, whatever the thread count. The running sums
    // live in a local block, in vector registers, not in sums->data: the compiler
    // cannot know that sums and x do not overlap, so it would load and store
    // each sum once per row ([6400, 128] on 2 threads: 0.39 ms, now 0.13).
    enum { COLUMNS = 16 };
#pragma omp parallel for
    for (int first = 0; first < x->cols; first += COLUMNS) {
        int width = first + COLUMNS < x->cols ? COLUMNS : x->cols - first;
        float block[COLUMNS];
        for (int c = 0; c < width; c++) block[c] = sums->data[first + c];
        for (int r = 0; r < x->rows; r++) {
            const float *row = x->data + (size_t)r * x->cols + first;
            if (width == COLUMNS)  // a constant trip count: the loop becomes vector adds
                for (int c = 0; c < COLUMNS; c++) block[c] += row[c];
            else
                for (int c = 0; c < width; c++) block[c] += row[c];
        }
        for (int c = 0; c < width; c++) sums->data[first + c] = block[c];
    }
}
