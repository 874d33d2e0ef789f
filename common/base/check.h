// check.h: fail fast, and never leave other ranks hanging.
//
// Every fatal error ends in fatal(), which prints ONE line
//   [rank 1 @ node07] common/data/mnist.c:42: cannot open data/mnist/...: No such file or directory
// and then calls MPI_Abort. A plain exit() on one rank would leave the others
// blocked forever in their next collective; MPI_Abort takes the whole job down.
// Outside MPI (unit tests, world size 1) it simply exits with the code.
//
// Errors that every rank meets alike are reported once, without an abort:
// usage errors (every rank parses the same argv; usage_error() prints on rank 0,
// all exit 2) and bad input files (check_all_ranks()).
#pragma once
// Builds with the GPU code pass -DHAVE_CUDA=1 (the Makefile, when it finds nvcc and NCCL).
#ifndef HAVE_CUDA
#define HAVE_CUDA 0
#endif
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include <mpi.h>

#define EXIT_USAGE 2  // bad flags or values: the convention of getopt tools

// Print "[rank r @ host] file:line: message" and abort the job with `code`.
__attribute__((noreturn, format(printf, 4, 5)))
void fatal_at(const char *file, int line, int code, const char *fmt, ...);

// A clause that fatal_at adds to every message of the calling thread, in parentheses, until it is
// cleared (NULL): what the thread was doing that a failed call's own words do not say (device.c's:
// "while a training step was captured into a CUDA graph; --cuda_graph off ..."). A string that
// outlives its use.
void check_set_context(const char *context);

// Usage error: print "error: message (see --help)" once (rank 0) and exit(2)
// on every rank. Call it only from code that all ranks run with the same input.
__attribute__((noreturn, format(printf, 1, 2)))
void usage_error(const char *fmt, ...);

// For errors that every rank meets at the same point of the program (a missing
// data file, a bad --init file): every rank calls this with its own verdict.
// If any rank failed, the lowest failing rank prints "[rank r @ host] message"
// and all ranks exit(1) together: one line, and no rank killed mid-print.
// Must be called by all ranks, like any collective.
void check_all_ranks(int ok, const char *message);

// One function that fatal_at() calls after its line and before the abort, from the failing thread:
// tracking.c marks the MLflow run FAILED there. It must not call fatal_at itself (a second fatal
// error inside it skips it) and should be quick (it delays the abort). NULL removes it.
void check_set_fatal_hook(void (*hook)(void));

#define FATAL(...) fatal_at(__FILE__, __LINE__, 1, __VA_ARGS__)

// CHECK(cond, "what went wrong %s", arg): abort when a condition does not hold.
#define CHECK(cond, ...) \
    do { if (!(cond)) fatal_at(__FILE__, __LINE__, 1, __VA_ARGS__); } while (0)

// CHECK_ERRNO(call, "open %s", path): for libc calls that return -1/NULL and set errno.
#define CHECK_ERRNO(ok, fmt, ...)                                                         \
    do { if (!(ok)) fatal_at(__FILE__, __LINE__, 1, fmt ": %s", __VA_ARGS__, strerror(errno)); \
    } while (0)

// CHECK_MPI(MPI_Allreduce(...)): MPI's own error string names the failure.
#define CHECK_MPI(call)                                                              \
    do {                                                                             \
        int mpi_status_ = (call);                                                    \
        if (mpi_status_ != MPI_SUCCESS) {                                            \
            char mpi_msg_[MPI_MAX_ERROR_STRING]; int mpi_len_ = 0;                   \
            MPI_Error_string(mpi_status_, mpi_msg_, &mpi_len_);                      \
            fatal_at(__FILE__, __LINE__, 1, "%s failed: %s", #call, mpi_msg_);       \
        }                                                                            \
    } while (0)

// CUDA, cuBLAS and NCCL: each library's own error string names the failure.
// (HAVE_CUDA is 1 in builds with the GPU code; see device.h.)
#if HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define CHECK_CUDA(call)                                                                         \
    do {                                                                                         \
        cudaError_t cuda_status_ = (call);                                                       \
        if (cuda_status_ != cudaSuccess)                                                         \
            fatal_at(__FILE__, __LINE__, 1, "%s failed: %s", #call, cudaGetErrorString(cuda_status_)); \
    } while (0)

#define CHECK_CUBLAS(call)                                                                       \
    do {                                                                                         \
        cublasStatus_t cublas_status_ = (call);                                                  \
        if (cublas_status_ != CUBLAS_STATUS_SUCCESS)                                             \
            fatal_at(__FILE__, __LINE__, 1, "%s failed: %s", #call, cublasGetStatusString(cublas_status_)); \
    } while (0)

#define CHECK_NCCL(call)                                                                         \
    do {                                                                                         \
        ncclResult_t nccl_status_ = (call);                                                      \
        if (nccl_status_ != ncclSuccess)                                                         \
            fatal_at(__FILE__, __LINE__, 1, "%s failed: %s", #call, ncclGetErrorString(nccl_status_)); \
    } while (0)
#endif

// Allocation that never returns NULL.
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t bytes);
char *xstrdup(const char *text);
// The same, for the buffers that the training step streams through (the data
// set, the batch, the activations): from 2 MB up, aligned to 2 MB and asked of
// the kernel as transparent huge pages. Freed with free().
void *xmalloc_huge_pages(size_t bytes);
