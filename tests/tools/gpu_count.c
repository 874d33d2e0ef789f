// gpu_count: print how many CUDA devices this process can use (0 without a
// GPU, a driver, or a build with CUDA). The GPU tests ask it whether to run.
#include <stdio.h>

#include "runtime/device.h"

int main(void) {
    printf("%d\n", device_gpu_count());
    return 0;
}
