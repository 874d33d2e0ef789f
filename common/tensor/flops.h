// flops.h: this rank's single-precision GEMM peak, the yardstick of a training loop's MFU.
//
// Model FLOPs utilisation (PaLM's MFU, as nanoGPT's estimate_mfu and llm.c print it) divides the
// FLOPs a model's step needs by the time it took and by the hardware's peak. A data sheet's peak
// is not this rank's: a CPU has none to look up, and a GPU's counts tensor cores that a float32
// GEMM without TF32 does not use. So it is measured: the best of a few large sgemms through
// tensor.h's gemm on this rank's device (its threads, or cuBLAS), what the model's own GEMMs run
// on (tests/tools/sgemm_peak measures the CPU's the same way).
#pragma once
#include "runtime/device.h"

// FLOP/s of the best of `repeats` [size, size] @ [size, size] GEMMs on `device` (on a GPU, each
// timed from launch to the end of the GPU's work).
double sgemm_peak_flops(Device device, int size, int repeats);
