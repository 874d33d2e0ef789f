// cpu_dispatch.h: a function compiled for several generations of x86-64 CPUs,
// the best one for this CPU chosen when the program starts, as PyTorch's CPU
// capability dispatch does for its own kernels (DEFAULT, AVX2, AVX512).
//
//   CPU_DISPATCHED void relu_backward(const Tensor *y, Tensor *grad) { ... }
//
// Why: a portable build (no -march, as Debian's gcc and our Makefile compile)
// vectorises for SSE2, 4 floats a vector. -march=native would give 8 or 16,
// and a binary that dies of SIGILL on an older node or in a container image
// built on another machine. gcc's target_clones compiles the function, its
// OpenMP loops included, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the
// baseline; the dynamic loader picks one for the CPU it runs on (an ifunc).
//
// The bits do not depend on the clone: each does the same float operations on
// each element in the same order, only more elements at once. Nothing is fused
// into an FMA (the Makefile builds with -ffp-contract=off, as C11 mode implies
// anyway) and, without -ffast-math, no sum is reordered; expf and logf stay
// calls into libm. (Checked: steps 2, 4, 6 and 14 end with the same parameter
// checksums built with and without the clones; tests/test_threads.sh runs step
// 2 built for SSE2 alone and for AVX2 alone against the dispatched build.)
//
// On the loops of a training step (tensor.c, tensor_ops.c, mnist.c). On the
// MLP's step (B = 6400, 2 cores with AVX-512) the batch gather went from 0.40
// to 0.24 ms, bias + ReLU from 0.07 to 0.04, Adam from 0.035 to 0.014, the
// whole loop 5% faster; the loss and the column sums stayed as they were.
// Elsewhere (other CPUs, clang, gcc before 12, a C library without ifuncs) it
// is nothing: one build, as before.
#pragma once

#include <limits.h>  // defines __GLIBC__ where the C library is glibc

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__GLIBC__) && \
    !defined(NO_CPU_DISPATCH)
#define CPU_DISPATCHED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_DISPATCHED
#endif
