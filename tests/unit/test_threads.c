// test_threads.c: the CPU step on many threads. The GEMM's pieces (cut along
// rows, columns or the sum) against a double-precision reference, and every
// result of a training step bit for bit the same at 1, 2, 3 and 4 threads:
// the GEMMs, the loss, the gradients, Adam's update. And the step's large
// buffers on 2 MB pages where the kernel grants them.
#define TEST_NAME "test_threads"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/nn.h"
#include "runtime/threads.h"
#include "test.h"

static Rng data_rng;

static Tensor random_tensor(int rows, int cols) {
    Tensor t = tensor_zeros(rows, cols, DEVICE_CPU);
    for (size_t i = 0; i < tensor_numel(&t); i++) t.data[i] = rng_uniform(&data_rng, -1.0f, 1.0f);
    return t;
}

// op(X)[row, col] of a row-major X.
static double element(const Tensor *x, bool transposed, int row, int col) {
    return transposed ? x->data[(size_t)col * x->cols + row] : x->data[(size_t)row * x->cols + col];
}

// One GEMM shape: C = alpha op(A) op(B) + beta C against a double reference,
// then the same product at 1..4 threads, bit for bit.
static void check_gemm(const char *what, int m, int n, int k, bool ta, bool tb, float beta) {
    Tensor a = ta ? random_tensor(k, m) : random_tensor(m, k);
    Tensor b = tb ? random_tensor(n, k) : random_tensor(k, n);
    Tensor c0 = random_tensor(m, n), c = tensor_zeros(m, n, DEVICE_CPU), first = tensor_zeros(m, n, DEVICE_CPU);
    // beta 0 must not read C: start from NaNs, as BLAS allows.
    if (beta == 0.0f)
        for (size_t i = 0; i < tensor_numel(&c0); i++) c0.data[i] = NAN;
    const float alpha = 0.5f;
    double worst = 0.0;
    bool same = true;
    for (int threads = 1; threads <= 4; threads++) {
        threads_init(threads);
        tensor_copy(&c, &c0);
        gemm(ta, tb, alpha, &a, &b, beta, &c);
        if (threads == 1) {
            tensor_copy(&first, &c);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double sum = 0.0, size = 0.0;
                    for (int p = 0; p < k; p++) {
                        double term = element(&a, ta, i, p) * element(&b, tb, p, j);
                        sum += term;
                        size += fabs(term);
                    }
                    double expected = alpha * sum + (beta == 0.0f ? 0.0 : beta * (double)c0.data[(size_t)i * n + j]);
                    double error = fabs(c.data[(size_t)i * n + j] - expected) / (alpha * size + 1.0);
                    if (!(error <= worst)) worst = error;  // NaN counts as the worst
                }
        } else {
            same = same && memcmp(c.data, first.data, tensor_numel(&c) * sizeof(float)) == 0;
        }
    }
    EXPECT(worst <= 1e-6, "gemm %s [%d x %d x %d]%s%s beta %g: worst error %.1e of the terms' size (<= 1e-6)", what,
           m, n, k, ta ? " A^T" : "", tb ? " B^T" : "", beta, worst);
    EXPECT(same, "gemm %s [%d x %d x %d]: the same bits at 1, 2, 3 and 4 threads", what, m, n, k);
    tensor_free(&a);
    tensor_free(&b);
    tensor_free(&c0);
    tensor_free(&c);
    tensor_free(&first);
}

static void test_gemm(void) {
    // The cut follows the largest dimension: rows (the batch in forward),
    // columns, the sum (the batch in a weight gradient), or none at all.
    check_gemm("cut along m", 1000, 40, 30, false, true, 0.0f);
    check_gemm("cut along m", 1000, 40, 30, true, false, 1.0f);
    check_gemm("cut along n", 20, 1100, 50, false, false, 1.0f);
    check_gemm("cut along n", 20, 1100, 50, true, true, 0.0f);
    check_gemm("cut along k", 30, 40, 1500, true, false, 1.0f);
    check_gemm("cut along k", 30, 40, 1500, false, true, 0.0f);
    // k is largest, but 4 partial products of [520, 520] would outweigh the
    // operands: cut along m instead.
    check_gemm("k largest, partials too big", 520, 520, 1024, true, false, 1.0f);
    check_gemm("uncut", 50, 60, 70, false, false, 1.0f);
}

// One training step of an MLP on random data, at `threads` threads: its loss
// and the checksum of the parameters afterwards.
static void train_step(int threads, int batch, float *loss, unsigned long long *checksum) {
    threads_init(threads);
    Rng rng;
    rng_seed(&rng, 7);
    const int sizes[] = {300, 64, 10};
    Mlp model = mlp_new(sizes, 3, batch, &rng, DEVICE_CPU);
    Adam adam = adam_new(model.params, model.n_params, 1e-3);
    Tensor x = tensor_zeros(batch, 300, DEVICE_CPU);
    int *labels = malloc((size_t)batch * sizeof(int));
    rng_seed(&rng, 8);
    for (size_t i = 0; i < tensor_numel(&x); i++) x.data[i] = rng_uniform(&rng, 0.0f, 1.0f);
    for (int r = 0; r < batch; r++) labels[r] = r % 10;
    mlp_zero_grad(&model);
    mlp_forward(&model, &x);
    *loss = mlp_loss(&model, labels);
    mlp_backward(&model, &x, NULL, NULL);
    adam_step(&adam);
    *checksum = params_checksum(model.params, model.n_params);
    free(labels);
    tensor_free(&x);
    adam_free(&adam);
    mlp_free(&model);
}

static void test_training_step(void) {
    const int batch = 2000;  // long enough that every GEMM of the step is cut
    float loss1;
    unsigned long long sum1;
    train_step(1, batch, &loss1, &sum1);
    for (int threads = 2; threads <= 4; threads++) {
        float loss;
        unsigned long long sum;
        train_step(threads, batch, &loss, &sum);
        EXPECT(memcmp(&loss, &loss1, sizeof loss) == 0 && sum == sum1,
               "a training step (forward, loss, backward, Adam) at %d threads: loss %.9g, parameters %016llx; "
               "at 1 thread %.9g, %016llx",
               threads, (double)loss, sum, (double)loss1, sum1);
    }
}

// The bias gradient: sums += the sum over the rows of x, each column summed in
// row order from its current value, exactly as a plain loop does, at 1..4
// threads. 37 columns: two full blocks of 16 and a partial one.
static void test_sum_over_rows(void) {
    Tensor x = random_tensor(300, 37), start = random_tensor(1, 37), sums = tensor_zeros(1, 37, DEVICE_CPU);
    float expect[37];
    for (int c = 0; c < 37; c++) {
        expect[c] = start.data[c];
        for (int r = 0; r < 300; r++) expect[c] += x.data[(size_t)r * 37 + c];
    }
    for (int threads = 1; threads <= 4; threads++) {
        threads_init(threads);
        tensor_copy(&sums, &start);
        add_sum_over_rows(&x, &sums);
        EXPECT(memcmp(sums.data, expect, sizeof expect) == 0,
               "sum over the rows of [300, 37] at %d thread%s: the plain loop's bits, column by column", threads,
               threads == 1 ? "" : "s");
    }
    tensor_free(&x);
    tensor_free(&start);
    tensor_free(&sums);
}

static void test_thread_count(void) {
    EXPECT(threads_init(3) == 3 && threads_count() == 3, "--threads 3 gives 3 threads (got %d)", threads_count());
    int fair = threads_init(0);
    EXPECT(fair >= 1, "the default is at least one thread (got %d)", fair);
    const char *blas = threads_blas_name();
    EXPECT(strstr(blas, "OpenBLAS") && strstr(blas, "kernels"), "the BLAS names itself and its kernels: %s", blas);
}

// The kB of transparent huge pages in the mapping that holds `address`
// (/proc/self/smaps), or -1 where it cannot be read.
static long huge_page_kb_at(const void *address) {
    FILE *smaps = fopen("/proc/self/smaps", "r");
    if (!smaps) return -1;
    char line[512];
    bool inside = false;
    long kb = -1;
    while (kb < 0 && fgets(line, sizeof line, smaps)) {
        unsigned long start, end;
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2) inside = start <= (uintptr_t)address && (uintptr_t)address < end;
        else if (inside) sscanf(line, "AnonHugePages: %ld kB", &kb);
    }
    fclose(smaps);
    return kb;
}

// The first line of a /sys setting, or "" where it cannot be read.
static void read_setting(const char *path, char *out, size_t size) {
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)size, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
}

// tensor_zeros: zeros, whatever its size; from 2 MB up on 2 MB boundaries, and
// on huge pages where the kernel makes them when memory is first touched.
static void test_huge_pages(void) {
    Tensor small = tensor_zeros(3, 5, DEVICE_CPU), batch = tensor_zeros(6400, 784, DEVICE_CPU);
    bool zeros = true;
    for (size_t i = 0; i < tensor_numel(&small); i++) zeros &= small.data[i] == 0.0f;
    for (size_t i = 0; i < tensor_numel(&batch); i++) zeros &= batch.data[i] == 0.0f;
    EXPECT(zeros, "tensor_zeros of [3, 5] and [6400, 784] hold zeros");
    EXPECT((uintptr_t)batch.data % (2u << 20) == 0, "a [6400, 784] tensor starts on a 2 MB boundary (%p)",
           (void *)batch.data);
    // Granted at the first touch only where THP is on for madvised memory and
    // the kernel compacts memory to find a 2 MB page when it faults one in
    // ("defer" and "never" leave it to khugepaged, later or never).
    char mode[128], defrag[128];
    read_setting("/sys/kernel/mm/transparent_hugepage/enabled", mode, sizeof mode);
    read_setting("/sys/kernel/mm/transparent_hugepage/defrag", defrag, sizeof defrag);
    long kb = huge_page_kb_at(batch.data);
    if (!strstr(mode, "[always]") && !strstr(mode, "[madvise]"))
        printf("SKIP %s: huge pages (needs transparent huge pages at [always] or [madvise]; here: \"%s\")\n",
               TEST_NAME, mode);
    else if (!strstr(defrag, "[always]") && !strstr(defrag, "madvise]"))
        printf("SKIP %s: huge pages (needs their defrag at [always], [defer+madvise] or [madvise]; here: \"%s\")\n",
               TEST_NAME, defrag);
    else
        EXPECT(kb >= 2048, "the [6400, 784] tensor (20 MB) lies on huge pages: %ld kB of them (THP: %s)", kb, mode);
    tensor_free(&small);
    tensor_free(&batch);
}

int main(void) {
    rng_seed(&data_rng, 1);
    test_huge_pages();
    test_gemm();
    test_training_step();
    test_sum_over_rows();
    test_thread_count();
    return test_summary();
}
