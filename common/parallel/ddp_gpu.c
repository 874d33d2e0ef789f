// ddp_gpu.c: DDP on GPU gradients, strategies 3 (NCCL) and 4 (a GPU shared
// by several ranks, through host copies). See ddp.h and ddp_internal.h.
//
// Either way a bucket is first packed on the compute stream into one flat
// device buffer, and its reduced sum divided back into the gradients there.
#include <stdlib.h>

#include "parallel/ddp_internal.h"

#if HAVE_CUDA
#include "base/timer.h"
#include "runtime/profile.h"
#include "tensor/kernels.h"

// ------------------------------------------------------------------ GPU buckets

typedef struct {
    float *device_buffer;               // [count]: packed here, reduced here by NCCL
    cudaEvent_t packed;                 // the compute stream has packed the bucket (and copied it to the host)
    cudaEvent_t comm_start, comm_done;  // NCCL: the allreduce on the communication stream, timed
} GpuBucket;

struct DdpGpu {
    GpuBucket *buckets;                    // [n_buckets], as ddp->buckets
    cudaEvent_t step_start, backward_end;  // NCCL: the GPU timeline's marks, for the statistics
    bool timing_pending;                   // the last step's events are not yet accounted for
    double step_start_host;                // while a profile records: step_start on the host's clock
};

DdpGpu *ddp_gpu_new(const Ddp *ddp) {
    DdpGpu *gpu = xcalloc(1, sizeof *gpu);
    gpu->buckets = xcalloc((size_t)ddp->n_buckets, sizeof *gpu->buckets);
    for (int b = 0; b < ddp->n_buckets; b++) {
        GpuBucket *bucket = &gpu->buckets[b];
        bucket->device_buffer = device_alloc(ddp->buckets[b].count * sizeof(float));
        CHECK_CUDA(cudaEventCreateWithFlags(&bucket->packed, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreate(&bucket->comm_start));
        CHECK_CUDA(cudaEventCreate(&bucket->comm_done));
    }
    if (ddp->nccl) {  // NCCL's statistics come from the GPU's timeline: a step's first and last marks
        CHECK_CUDA(cudaEventCreate(&gpu->step_start));
        CHECK_CUDA(cudaEventCreate(&gpu->backward_end));
    }
    return gpu;
}

void ddp_gpu_free(Ddp *ddp) {
    DdpGpu *gpu = ddp->gpu;
    device_synchronize();  // no bucket may be in flight
    for (int b = 0; b < ddp->n_buckets; b++) {
        device_free(gpu->buckets[b].device_buffer);
        CHECK_CUDA(cudaEventDestroy(gpu->buckets[b].packed));
        CHECK_CUDA(cudaEventDestroy(gpu->buckets[b].comm_start));
        CHECK_CUDA(cudaEventDestroy(gpu->buckets[b].comm_done));
    }
    if (ddp->nccl) {
        CHECK_CUDA(cudaEventDestroy(gpu->step_start));
        CHECK_CUDA(cudaEventDestroy(gpu->backward_end));
    }
    free(gpu->buckets);
    free(gpu);
    ddp->gpu = NULL;
}

// The bucket's gradients into its flat device buffer, on the compute stream.
static void pack_on_gpu(Ddp *ddp, int b) {
    const DdpBucket *bucket = &ddp->buckets[b];
    float *out = ddp->gpu->buckets[b].device_buffer;
    for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
        size_t n = tensor_numel(ddp->params[i].grad);
        CHECK_CUDA(cudaMemcpyAsync(out, ddp->params[i].grad->data, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                   device_stream()));
        out += n;
    }
}

// The reduced sums in the device buffer, divided by W, back into the
// gradients. (`grad / W`, a division, as PyTorch's DDP divides.)
static void divide_into_grads(Ddp *ddp, int b) {
    const DdpBucket *bucket = &ddp->buckets[b];
    float divisor = (float)ddp->world_size;
    const float *in = ddp->gpu->buckets[b].device_buffer;
    for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
        size_t n = tensor_numel(ddp->params[i].grad);
        gpu_divide(ddp->params[i].grad->data, in, n, divisor, device_stream());
        in += n;
    }
}

// ------------------------------------------------------------------ 3. NCCL
//
// No thread and no host wait: a bucket's allreduce is queued on the
// communication stream behind its packing, and the GPU overlaps the two
// streams by itself. Times come from CUDA events on the GPU's timeline.

void ddp_nccl_bucket_ready(Ddp *ddp, int b) {
    DdpGpu *gpu = ddp->gpu;
    GpuBucket *bucket = &gpu->buckets[b];
    if (b == 0) {  // the step's first bucket: account for the last step, then mark this one's start
        ddp_nccl_account_step(ddp);
        if (profile_recording()) {  // with the GPU idle, step_start happens when the host records it
            device_synchronize();
            gpu->step_start_host = wall_seconds();
        }
        CHECK_CUDA(cudaEventRecord(gpu->step_start, device_stream()));
    }
    pack_on_gpu(ddp, b);
    CHECK_CUDA(cudaEventRecord(bucket->packed, device_stream()));
    // The allreduce on the communication stream, behind the packing.
    cudaStream_t comm = device_comm_stream();
    CHECK_CUDA(cudaStreamWaitEvent(comm, bucket->packed, 0));
    CHECK_CUDA(cudaEventRecord(bucket->comm_start, comm));
    CHECK_NCCL(ncclAllReduce(bucket->device_buffer, bucket->device_buffer, ddp->buckets[b].count, ncclFloat, ncclSum,
                             ddp->group->nccl, comm));
    CHECK_CUDA(cudaEventRecord(bucket->comm_done, comm));
}

// Nothing to wait for on the host: the compute stream waits for each bucket.
void ddp_nccl_finish(Ddp *ddp) {
    CHECK_CUDA(cudaEventRecord(ddp->gpu->backward_end, device_stream()));
    for (int b = 0; b < ddp->n_buckets; b++) {
        CHECK(ddp->buckets[b].pending == 0, "ddp_finish: backward did not produce bucket %d", b);
        CHECK_CUDA(cudaStreamWaitEvent(device_stream(), ddp->gpu->buckets[b].comm_done, 0));
        divide_into_grads(ddp, b);
        ddp->buckets[b].pending = ddp->buckets[b].n_params;
    }
    ddp->gpu->timing_pending = true;
}

// NCCL's statistics, read off the GPU's timeline once a step's events have
// happened, with the end of backward on the compute stream as the boundary
// of "hidden". Times are seconds since the step's first bucket was packed.
void ddp_nccl_account_step(Ddp *ddp) {
    DdpGpu *gpu = ddp->gpu;
    if (!gpu->timing_pending) return;
    gpu->timing_pending = false;
    float backward_end_ms = 0, from_ms = 0, to_ms = 0;
    device_wait_event(gpu->backward_end, "the end of backward");
    CHECK_CUDA(cudaEventElapsedTime(&backward_end_ms, gpu->step_start, gpu->backward_end));
    double covered_until = 0, last_done = 0, backward_end = 1e-3 * backward_end_ms;
    for (int b = 0; b < ddp->n_buckets; b++) {
        device_wait_event(gpu->buckets[b].comm_done, "DDP's allreduce of a bucket");
        CHECK_CUDA(cudaEventElapsedTime(&from_ms, gpu->step_start, gpu->buckets[b].comm_start));
        CHECK_CUDA(cudaEventElapsedTime(&to_ms, gpu->step_start, gpu->buckets[b].comm_done));
        ddp_account_bucket(ddp, 1e-3 * from_ms, 1e-3 * to_ms, backward_end, &covered_until);
        if (profile_recording() && gpu->step_start_host > 0)  // the trace's communication track, as on CPUs
            profile_range_record("allreduce", PROFILE_COMM_THREAD, gpu->step_start_host + 1e-3 * from_ms,
                                 gpu->step_start_host + 1e-3 * to_ms);
        last_done = 1e-3 * to_ms > last_done ? 1e-3 * to_ms : last_done;
    }
    ddp->wait_seconds += last_done > backward_end ? last_done - backward_end : 0;  // the compute stream's wait
}

// ------------------------------------------------------------------ 4. a shared GPU, through host copies
//
// NCCL cannot put two ranks on one GPU: the packed bucket goes to its
// page-locked host buffer and through MPI as on CPUs (ddp_mpi.c), then back.

void ddp_shared_gpu_pack(Ddp *ddp, int b) {
    pack_on_gpu(ddp, b);
    CHECK_CUDA(cudaMemcpyAsync(ddp->buckets[b].buffer, ddp->gpu->buckets[b].device_buffer,
                               ddp->buckets[b].count * sizeof(float), cudaMemcpyDeviceToHost, device_stream()));
    CHECK_CUDA(cudaEventRecord(ddp->gpu->buckets[b].packed, device_stream()));
}

// Called by whichever thread starts the bucket's MPI allreduce.
void ddp_shared_gpu_wait_packed(Ddp *ddp, int b) { device_wait_event(ddp->gpu->buckets[b].packed, "a bucket's copy to the host"); }

void ddp_shared_gpu_unpack(Ddp *ddp, int b) {
    CHECK_CUDA(cudaMemcpyAsync(ddp->gpu->buckets[b].device_buffer, ddp->buckets[b].buffer,
                               ddp->buckets[b].count * sizeof(float), cudaMemcpyHostToDevice, device_stream()));
    divide_into_grads(ddp, b);
}

#else  // ------------------------------------------------------------------ a build without CUDA

// No tensor is ever on a GPU here (tensor_on_gpu is a constant false), so
// ddp.c and ddp_mpi.c never call these; they exist for the linker.
static void no_gpu(void) { FATAL("ddp: GPU gradients in a build without CUDA"); }
DdpGpu *ddp_gpu_new(const Ddp *ddp) { (void)ddp, no_gpu(); return NULL; }
void ddp_gpu_free(Ddp *ddp) { (void)ddp, no_gpu(); }
void ddp_nccl_bucket_ready(Ddp *ddp, int b) { (void)ddp, (void)b, no_gpu(); }
void ddp_nccl_finish(Ddp *ddp) { (void)ddp, no_gpu(); }
void ddp_nccl_account_step(Ddp *ddp) { (void)ddp, no_gpu(); }
void ddp_shared_gpu_pack(Ddp *ddp, int b) { (void)ddp, (void)b, no_gpu(); }
void ddp_shared_gpu_wait_packed(Ddp *ddp, int b) { (void)ddp, (void)b, no_gpu(); }
void ddp_shared_gpu_unpack(Ddp *ddp, int b) { (void)ddp, (void)b, no_gpu(); }
#endif
