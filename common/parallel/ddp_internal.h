// ddp_internal.h: what the files behind ddp.h share; programs use ddp.h.
//
// ddp.c hands each bucket to one strategy: ddp_mpi.c (CPU gradients, or a
// shared GPU's host copies) or ddp_gpu.c (NCCL). Both time their buckets with
// ddp_stats.c. Files use only those below them: stats, then gpu, then mpi,
// then ddp.c.
#pragma once
#include "parallel/ddp.h"

// ------------------------------------------------------------------ ddp_stats.c

// Adds one bucket's [start, done] interval (seconds) to the step's
// communication time; the part before backward_end was hidden behind backward.
// Called for each bucket of a step, in order, from *covered_until = 0.
void ddp_account_bucket(Ddp *ddp, double start, double done, double backward_end, double *covered_until);
// The per-step averages of what ddp_account_bucket and the waits collected.
void ddp_describe_totals(const Ddp *ddp, char *out, size_t size);

// ------------------------------------------------------------------ ddp_gpu.c
// In a build without CUDA no gradient is on a GPU, and none of these is called.

// The device buffers and events of every bucket (ddp->buckets laid out), and
// with NCCL the step's timeline marks.
DdpGpu *ddp_gpu_new(const Ddp *ddp);
void ddp_gpu_free(Ddp *ddp);  // waits for the GPU first: no bucket may be in flight

// 3. NCCL: pack bucket b on the compute stream and queue its allreduce on the
// communication stream; finish makes the compute stream wait for each bucket
// and divide. Each step's events are read into the statistics once they have
// happened (asked at the next step's first bucket, never waited for there
// unless the host runs 32 steps ahead); account_step reads every step's that
// is left, waiting for them (for the report).
void ddp_nccl_bucket_ready(Ddp *ddp, int b);
void ddp_nccl_finish(Ddp *ddp);
void ddp_nccl_account_step(Ddp *ddp);

// 4. A shared GPU: bucket b packed on the GPU and copied to its host buffer
// (asynchronously; wait_packed waits for the copy), and the reduced host
// buffer copied back and divided into the gradients.
void ddp_shared_gpu_pack(Ddp *ddp, int b);
void ddp_shared_gpu_wait_packed(Ddp *ddp, int b);
void ddp_shared_gpu_unpack(Ddp *ddp, int b);

// ------------------------------------------------------------------ ddp_mpi.c

// 1. and 2.: bucket b is complete: pack it (for a shared GPU, through host
// copies) and hand it to the communication thread or start it here. finish
// waits for every bucket and unpacks it; stop_thread ends the thread, if any.
void ddp_mpi_bucket_ready(Ddp *ddp, int b);
void ddp_mpi_finish(Ddp *ddp);
void ddp_mpi_stop_thread(Ddp *ddp);
