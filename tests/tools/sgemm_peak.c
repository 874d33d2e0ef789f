// sgemm_peak: the best single-precision GEMM rate of this machine at N
// threads, the yardstick for the training loop's GFLOP/s in `make bench`.
// It times a large square sgemm two ways, one call on OpenBLAS's own threads
// and our gemm() (single-threaded pieces on our threads), and prints the
// better of the two:
//   sgemm_peak [THREADS] [SIZE]   ->   "331.2 GFLOP/s (2048^3, 2 threads, OpenBLAS's threads)"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

#include "tensor.h"
#include "threads.h"
#include "timer.h"

extern void openblas_set_num_threads(int) __attribute__((weak));

// The best of 5: GFLOP/s of C = A @ B, [size, size] each.
static double best_rate(bool ours, const Tensor *a, const Tensor *b, Tensor *c) {
    int n = c->rows;
    double best = 0.0;
    for (int repeat = 0; repeat < 5; repeat++) {
        double start = wall_seconds();
        if (ours) gemm(false, false, 1.0f, a, b, 0.0f, c);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a->data, n, b->data, n, 0.0f,
                         c->data, n);
        double rate = 2.0 * n * n * n / (wall_seconds() - start) / 1e9;
        if (rate > best) best = rate;
    }
    return best;
}

int main(int argc, char **argv) {
    int threads = threads_init(argc > 1 ? atoi(argv[1]) : 0);
    int size = argc > 2 ? atoi(argv[2]) : 2048;
    Tensor a = tensor_zeros(size, size, DEVICE_CPU), b = tensor_zeros(size, size, DEVICE_CPU);
    Tensor c = tensor_zeros(size, size, DEVICE_CPU);
    for (size_t i = 0; i < tensor_numel(&a); i++) a.data[i] = b.data[i] = (float)(i % 7) - 3.0f;
    double ours = best_rate(true, &a, &b, &c), library = 0.0;
    if (openblas_set_num_threads) {
        openblas_set_num_threads(threads);
        library = best_rate(false, &a, &b, &c);
        openblas_set_num_threads(1);
    }
    printf("%.1f GFLOP/s (%d^3, %d thread%s, %s)\n", ours > library ? ours : library, size, threads,
           threads == 1 ? "" : "s", ours > library ? "our pieces" : "OpenBLAS's threads");
    tensor_free(&a);
    tensor_free(&b);
    tensor_free(&c);
    return 0;
}
