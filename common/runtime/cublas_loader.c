// cublas_loader.c: cuBLAS, opened when a GPU rank first calls it.
//
// Linking libcublas costs every process about 200 MB of resident memory
// before main() runs (the loader relocates the 540 MB libcublasLt behind it),
// even a CPU-only run of a binary built with CUDA: four CPU ranks would carry
// 800 MB of it. So the binaries do not link cuBLAS. This file defines the
// handful of cuBLAS functions that device.c and tensor.c call; the first call
// opens the library (dlopen) and each forwards to the real function. Callers
// write plain cuBLAS.
#include "base/check.h"

#if HAVE_CUDA
#include <dlfcn.h>

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

// The soname of the cuBLAS we compiled against (libcublas.so.13), found the
// way the loader finds NCCL: the binary's rpath, then the system's paths;
// failing that, the toolkit's own copy (CUBLAS_LIBRARY, from the Makefile).
static void *cublas_symbol(const char *name) {
    static void *library;
    if (!library) {
        const char *candidates[] = {"libcublas.so." STRINGIFY(CUBLAS_VER_MAJOR), CUBLAS_LIBRARY};
        for (size_t i = 0; i < sizeof candidates / sizeof *candidates && !library; i++)
            library = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        CHECK(library, "cannot load cuBLAS (%s or %s): %s", candidates[0], candidates[1], dlerror());
    }
    void *function = dlsym(library, name);
    CHECK(function, "cuBLAS has no %s: %s", name, dlerror());
    return function;
}

// One forwarding definition per function: resolved once, then a plain call.
#define FORWARD(ret, name, params, args)                                    \
    ret name params {                                                       \
        static ret(*real) params;                                           \
        if (!real) *(void **)&real = cublas_symbol(#name);                  \
        return real args;                                                   \
    }

FORWARD(cublasStatus_t, cublasCreate_v2, (cublasHandle_t *handle), (handle))
FORWARD(cublasStatus_t, cublasDestroy_v2, (cublasHandle_t handle), (handle))
FORWARD(cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
FORWARD(cublasStatus_t, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
FORWARD(const char *, cublasGetStatusString, (cublasStatus_t status), (status))
FORWARD(cublasStatus_t, cublasSgemm_v2,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta, float *C, int ldc),
        (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
FORWARD(cublasStatus_t, cublasSgemmBatched,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const float *alpha, const float *const Aarray[], int lda, const float *const Barray[], int ldb,
         const float *beta, float *const Carray[], int ldc, int batchCount),
        (handle, transa, transb, m, n, k, alpha, Aarray, lda, Barray, ldb, beta, Carray, ldc, batchCount))
FORWARD(cublasStatus_t, cublasGemmEx,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B, cudaDataType_t Btype, int ldb,
         const void *beta, void *C, cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
         cublasGemmAlgo_t algo),
        (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo))
FORWARD(cublasStatus_t, cublasGemmBatchedEx,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const void *alpha, const void *const Aarray[], cudaDataType_t Atype, int lda, const void *const Barray[],
         cudaDataType_t Btype, int ldb, const void *beta, void *const Carray[], cudaDataType_t Ctype, int ldc,
         int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo),
        (handle, transa, transb, m, n, k, alpha, Aarray, Atype, lda, Barray, Btype, ldb, beta, Carray, Ctype, ldc,
         batchCount, computeType, algo))
FORWARD(cublasStatus_t, cublasSgemv_v2,
        (cublasHandle_t handle, cublasOperation_t trans, int m, int n, const float *alpha, const float *A, int lda,
         const float *x, int incx, const float *beta, float *y, int incy),
        (handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy))
#endif
