// flops.c: this rank's measured sgemm peak. See flops.h.
#include "tensor/flops.h"

#include "tensor/tensor.h"
#include "base/timer.h"

double sgemm_peak_flops(Device device, int size, int repeats) {
    Tensor a = tensor_zeros(size, size, device), b = tensor_zeros(size, size, device);
    Tensor c = tensor_zeros(size, size, device);
    tensor_fill(&a, 1.0f), tensor_fill(&b, 0.5f);
    device_synchronize();  // the fills are not the GEMM's time
    double best = 0.0;
    for (int r = 0; r < repeats; r++) {
        double start = wall_seconds();
        gemm(false, false, 1.0f, &a, &b, 0.0f, &c);
        device_synchronize();
        double seconds = wall_seconds() - start, rate = 2.0 * size * size * (double)size / seconds;
        if (rate > best) best = rate;
    }
    tensor_free(&a), tensor_free(&b), tensor_free(&c);
    return best;
}
