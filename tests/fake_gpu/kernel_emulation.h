// kernel_emulation.h: what nvcc gives a .cu file, for the host's C++ compiler.
//
// tests/fake_gpu/nvcc compiles common/tensor/kernels.cu with g++ and this header in
// front of it, after rewriting each launch `k<<<grid, block, shared, stream>>>(args)`
// into `fake_gpu::launcher("k", synced, k, grid, block, shared, stream)(args)`.
// A kernel becomes a plain function; fake_gpu.cpp runs it once per thread of
// the grid, with threadIdx, blockIdx, blockDim and gridDim set, when its stream
// runs. `synced` says that the kernel calls __syncthreads: its block's threads
// then run as fibers that all stop at each barrier.
#pragma once
#include <math.h>
#include <stddef.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <functional>

#include "tensor/kernels.h"  // the jobs that some kernels take (SortGroups, SparseAdamRows, ...): their pointers checked

#undef __global__
#undef __shared__
#define __global__
#define __shared__ static  // the blocks of a grid run one after the other

extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
void __syncthreads();

// The rounding intrinsics: one IEEE operation each, never fused (the host
// compiler fuses nothing without -mfma: fake_gpu's g++ gets no -march).
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
// The bits of a float as an unsigned int (a reinterpretation, not a conversion).
static inline unsigned __float_as_uint(float value) {
    unsigned bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}
// The bits of an int as a float (a reinterpretation, not a conversion).
static inline float __int_as_float(int bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

namespace fake_gpu {

// Stops the run, naming the kernel, unless p is NULL, device memory or page-locked host memory.
void check_kernel_pointer(const char *kernel, int argument, const void *p);
// Queues the grid on `stream` (runs it at once on the legacy default stream).
void launch(const char *kernel, bool synced, dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> thread);

// The pointers of a job, where a kernel takes an array of them (`job[]`: step 15's kernels, a job
// per table, kernels.h): each checked as the kernel's own pointer arguments are (a NULL, as in
// the jobs past those launched, is no pointer to check).
template <class Visit> void job_pointers(const EmbeddingGrad &j, Visit v) {
    v(j.start), v(j.sample), v(j.count), v(j.self), v(j.self_row), v(j.other), v(j.other_slot), v(j.grad);
}
template <class Visit> void job_pointers(const SparseAdamRows &j, Visit v) {
    v(j.weight), v(j.exp_avg), v(j.exp_avg_sq), v(j.rows), v(j.flags), v(j.grad), v(j.count);
}
template <class Visit> void job_pointers(const SortGroups &j, Visit v) {
    v(j.keys), v(j.keys_at), v(j.n_valid), v(j.scratch), v(j.order), v(j.n_groups), v(j.group_key), v(j.group_start),
        v(j.group_of);
}
template <class T>
auto check_jobs(const char *kernel, int argument, const T &jobs, int) -> decltype((void)jobs.job[0]) {
    for (const auto &job : jobs.job) job_pointers(job, [&](const void *p) { check_kernel_pointer(kernel, argument, p); });
}
template <class T> void check_jobs(const char *, int, const T &, long) {}  // a value: nothing to check

template <class T> void check_argument(const char *kernel, int argument, T *p) { check_kernel_pointer(kernel, argument, p); }
template <class T> void check_argument(const char *kernel, int argument, const T &value) {
    check_jobs(kernel, argument, value, 0);
}

template <class... Params>
auto launcher(const char *name, bool synced, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes = 0,
              cudaStream_t stream = 0) {
    (void)shared_bytes;  // static __shared__ arrays only
    return [=](auto... args) {
        int argument = 0;
        (check_argument(name, argument++, args), ...);
        launch(name, synced, grid, block, stream, [=] { kernel(args...); });
    };
}

}  // namespace fake_gpu
