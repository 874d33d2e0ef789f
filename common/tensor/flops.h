// flops.h: this machine's single-precision GEMM peak, the yardstick of a training loop's MFU.
//
// Model FLOPs utilisation (PaLM's MFU, as nanoGPT's estimate_mfu and llm.c print it) divides the
// FLOPs a model's step needs by the time it took and by the hardware's peak. On a GPU the peak is
// the data sheet's; on a CPU there is none to look up, so it is measured: the best of a few large
// sgemms through tensor.h's gemm on this rank's threads (tests/tools/sgemm_peak measures the same).
#pragma once

// FLOP/s of the best of `repeats` [size, size] @ [size, size] GEMMs on the CPU (this rank's threads).
double cpu_sgemm_peak_flops(int size, int repeats);
