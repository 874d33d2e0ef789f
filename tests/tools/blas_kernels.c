// blas_kernels: print the BLAS the programs link and the kernels it runs on this
// CPU, as each program's first line names them: "OpenBLAS 0.3.21 (SkylakeX kernels)"
// ("CBLAS" for another library). OPENBLAS_CORETYPE=Haswell forces a kernel;
// tests/run.sh asks which one runs before it picks the second for make test-all.
#include <cblas.h>
#include <stdio.h>

#include "runtime/threads.h"

int main(void) {
    // One call into CBLAS, so that the linker keeps the library (with --as-needed a
    // library only weakly referred to, as threads.c refers to OpenBLAS's, is dropped).
    float one = 1.0f;
    if (cblas_sdot(1, &one, 1, &one, 1) != 1.0f) return 1;
    printf("%s\n", threads_blas_name());
    return 0;
}
