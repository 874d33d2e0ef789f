// flops.c: the CPU's measured sgemm peak. See flops.h.
#include "tensor/flops.h"

#include "tensor/tensor.h"
#include "base/timer.h"

double cpu_sgemm_peak_flops(int size, int repeats) {
    Tensor a = tensor_zeros(size, size, DEVICE_CPU), b = tensor_zeros(size, size, DEVICE_CPU);
    Tensor c = tensor_zeros(size, size, DEVICE_CPU);
    tensor_fill(&a, 1.0f), tensor_fill(&b, 0.5f);
    double best = 0.0;
    for (int r = 0; r < repeats; r++) {
        double start = wall_seconds();
        gemm(false, false, 1.0f, &a, &b, 0.0f, &c);
        double seconds = wall_seconds() - start, rate = 2.0 * size * size * (double)size / seconds;
        if (rate > best) best = rate;
    }
    tensor_free(&a), tensor_free(&b), tensor_free(&c);
    return best;
}
