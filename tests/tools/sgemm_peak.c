// sgemm_peak: the best single-precision GEMM rate of this machine at N
// threads, the yardstick for the training loop's GFLOP/s in `make bench`.
// It times a large square sgemm two ways, one call on OpenBLAS's own threads
// and our gemm() (single-threaded pieces on our threads), and prints the
// better of the two:
//   sgemm_peak [THREADS] [SIZE]   ->   "331.2 GFLOP/s (2048^3, 2 threads, OpenBLAS's threads)"
// With "mlp" for SIZE it times instead the two GEMMs that are nearly all of
// step 2's arithmetic, at its shapes (B = 6400), through our gemm(): the
// ceiling of the training loop on this machine, whatever the rest costs.
//   sgemm_peak 2 mlp   ->   "x @ W1^T [6400, 784] @ [784, 128]: 3.52 ms, 365 GFLOP/s" ...
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "base/timer.h"
#include "runtime/threads.h"
#include "tensor/tensor.h"

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

// The MLP's two large GEMMs: the forward x @ W1^T and the weight gradient
// grad_h^T @ x, each timed right after x is rewritten (as the batch gather
// does every step), the best of 20.
static void mlp_gemms(void) {
    enum { BATCH = 6400, IN = 784, HIDDEN = 128, REPEATS = 20 };
    Tensor x = tensor_zeros(BATCH, IN, DEVICE_CPU), w1 = tensor_zeros(HIDDEN, IN, DEVICE_CPU);
    Tensor h = tensor_zeros(BATCH, HIDDEN, DEVICE_CPU), grad_w1 = tensor_zeros(HIDDEN, IN, DEVICE_CPU);
    for (size_t i = 0; i < tensor_numel(&w1); i++) w1.data[i] = (float)(i % 5) * 0.01f;
    enum { FORWARD, WEIGHT_GRADIENT };
    double flop = 2.0 * BATCH * IN * HIDDEN, best[2] = {1e9, 1e9};
    for (int repeat = 0; repeat < REPEATS; repeat++) {
        for (int gemm_kind = FORWARD; gemm_kind <= WEIGHT_GRADIENT; gemm_kind++) {
            tensor_fill(&x, (float)(repeat + 1) / 255.0f);
            double start = wall_seconds();
            if (gemm_kind == FORWARD) gemm(false, true, 1.0f, &x, &w1, 0.0f, &h);  // h = x @ W1^T
            else gemm(true, false, 1.0f, &h, &x, 1.0f, &grad_w1);                  // grad_W1 += h^T @ x
            double seconds = wall_seconds() - start;
            if (seconds < best[gemm_kind]) best[gemm_kind] = seconds;
        }
    }
    double forward = best[FORWARD], weight_gradient = best[WEIGHT_GRADIENT];
    printf("x @ W1^T [%d, %d] @ [%d, %d]: %.2f ms, %.0f GFLOP/s\n", BATCH, IN, IN, HIDDEN, 1e3 * forward,
           flop / forward / 1e9);
    printf("grad_W1 = grad_h^T @ x [%d, %d] @ [%d, %d]: %.2f ms, %.0f GFLOP/s\n", HIDDEN, BATCH, BATCH, IN,
           1e3 * weight_gradient, flop / weight_gradient / 1e9);
    printf("both: %.2f ms, %.0f GFLOP/s\n", 1e3 * (forward + weight_gradient),
           2 * flop / (forward + weight_gradient) / 1e9);
    tensor_free(&x);
    tensor_free(&w1);
    tensor_free(&h);
    tensor_free(&grad_w1);
}

int main(int argc, char **argv) {
    int threads = threads_init(argc > 1 ? atoi(argv[1]) : 0);
    if (argc > 2 && strcmp(argv[2], "mlp") == 0) {
        mlp_gemms();
        return 0;
    }
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
