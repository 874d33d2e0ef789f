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
    cudaEvent_t reduced;                // NCCL: the communication stream has reduced it
} GpuBucket;

// NCCL: one step's marks on the GPU's timeline, for the statistics. They are read once they have
// happened, a few steps later, so that no step waits for the GPU to get there: a ring of steps. A
// step captured into a CUDA graph (train/step_graph.h) records none: an event recorded in a capture
// marks a place in the graph, not a time, and its replays run no host code to move the ring on.
enum { TIMED_STEPS = 32 };
typedef struct {
    cudaEvent_t step_start, backward_end;  // the step's first packing, and the end of its backward
    cudaEvent_t *comm_start, *comm_done;   // [n_buckets]: each bucket's allreduce on the communication stream
    double step_start_host;                // while a profile records: step_start on the host's clock
} TimedStep;

struct DdpGpu {
    GpuBucket *buckets;             // [n_buckets], as ddp->buckets
    TimedStep timed[TIMED_STEPS];   // NCCL: a ring
    int oldest, n_timed;            // the steps recorded and not yet accounted for, oldest first; the
                                    // step in progress is recorded at timed[(oldest + n_timed) % TIMED_STEPS]
};

DdpGpu *ddp_gpu_new(const Ddp *ddp) {
    DdpGpu *gpu = xcalloc(1, sizeof *gpu);
    gpu->buckets = xcalloc((size_t)ddp->n_buckets, sizeof *gpu->buckets);
    for (int b = 0; b < ddp->n_buckets; b++) {
        GpuBucket *bucket = &gpu->buckets[b];
        bucket->device_buffer = device_alloc(ddp->buckets[b].count * sizeof(float));
        CHECK_CUDA(cudaEventCreateWithFlags(&bucket->packed, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreateWithFlags(&bucket->reduced, cudaEventDisableTiming));
    }
    if (ddp->nccl)  // NCCL's statistics come from the GPU's timeline
        for (int t = 0; t < TIMED_STEPS; t++) {
            TimedStep *timed = &gpu->timed[t];
            CHECK_CUDA(cudaEventCreate(&timed->step_start));
            CHECK_CUDA(cudaEventCreate(&timed->backward_end));
            timed->comm_start = xmalloc((size_t)ddp->n_buckets * sizeof(cudaEvent_t));
            timed->comm_done = xmalloc((size_t)ddp->n_buckets * sizeof(cudaEvent_t));
            for (int b = 0; b < ddp->n_buckets; b++) {
                CHECK_CUDA(cudaEventCreate(&timed->comm_start[b]));
                CHECK_CUDA(cudaEventCreate(&timed->comm_done[b]));
            }
        }
    return gpu;
}

void ddp_gpu_free(Ddp *ddp) {
    DdpGpu *gpu = ddp->gpu;
    device_synchronize();  // no bucket may be in flight
    for (int b = 0; b < ddp->n_buckets; b++) {
        device_free(gpu->buckets[b].device_buffer);
        CHECK_CUDA(cudaEventDestroy(gpu->buckets[b].packed));
        CHECK_CUDA(cudaEventDestroy(gpu->buckets[b].reduced));
    }
    if (ddp->nccl)
        for (int t = 0; t < TIMED_STEPS; t++) {
            TimedStep *timed = &gpu->timed[t];
            CHECK_CUDA(cudaEventDestroy(timed->step_start));
            CHECK_CUDA(cudaEventDestroy(timed->backward_end));
            for (int b = 0; b < ddp->n_buckets; b++) {
                CHECK_CUDA(cudaEventDestroy(timed->comm_start[b]));
                CHECK_CUDA(cudaEventDestroy(timed->comm_done[b]));
            }
            free(timed->comm_start);
            free(timed->comm_done);
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
// streams by itself. Times come from CUDA events on the GPU's timeline,
// read once they have happened (a ring of steps), never waited for in a
// step unless the host is TIMED_STEPS steps ahead of the GPU.

static TimedStep *recording(DdpGpu *gpu) { return &gpu->timed[(gpu->oldest + gpu->n_timed) % TIMED_STEPS]; }

// Has the event happened? A question, not a wait (cudaEventQuery once).
static bool happened(cudaEvent_t event) {
    cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) return false;
    CHECK_CUDA(status);
    return true;
}

// The oldest recorded step's statistics, its events waited for if `wait` (polled), or only if they
// have all happened. Returns whether it was accounted for.
static bool account_oldest(Ddp *ddp, bool wait) {
    DdpGpu *gpu = ddp->gpu;
    if (gpu->n_timed == 0) return false;
    TimedStep *timed = &gpu->timed[gpu->oldest];
    if (!wait) {
        if (!happened(timed->backward_end)) return false;
        for (int b = 0; b < ddp->n_buckets; b++)
            if (!happened(timed->comm_done[b])) return false;
    }
    float backward_end_ms = 0, from_ms = 0, to_ms = 0;
    device_wait_event(timed->backward_end, "the end of backward");
    CHECK_CUDA(cudaEventElapsedTime(&backward_end_ms, timed->step_start, timed->backward_end));
    double covered_until = 0, last_done = 0, backward_end = 1e-3 * backward_end_ms;
    for (int b = 0; b < ddp->n_buckets; b++) {
        device_wait_event(timed->comm_done[b], "DDP's allreduce of a bucket");
        CHECK_CUDA(cudaEventElapsedTime(&from_ms, timed->step_start, timed->comm_start[b]));
        CHECK_CUDA(cudaEventElapsedTime(&to_ms, timed->step_start, timed->comm_done[b]));
        ddp_account_bucket(ddp, 1e-3 * from_ms, 1e-3 * to_ms, backward_end, &covered_until);
        if (profile_recording() && timed->step_start_host > 0)  // the trace's communication track, as on CPUs
            profile_range_record("allreduce", PROFILE_COMM_THREAD, timed->step_start_host + 1e-3 * from_ms,
                                 timed->step_start_host + 1e-3 * to_ms);
        last_done = 1e-3 * to_ms > last_done ? 1e-3 * to_ms : last_done;
    }
    ddp->wait_seconds += last_done > backward_end ? last_done - backward_end : 0;  // the compute stream's wait
    gpu->oldest = (gpu->oldest + 1) % TIMED_STEPS;
    gpu->n_timed--;
    return true;
}

void ddp_nccl_bucket_ready(Ddp *ddp, int b) {
    DdpGpu *gpu = ddp->gpu;
    bool timed = !device_graph_capturing();
    if (b == 0 && timed) {  // the step's first bucket: account for the steps that are over, then mark this one's start
        while (account_oldest(ddp, false)) {}
        if (gpu->n_timed == TIMED_STEPS) account_oldest(ddp, true);  // the host is that far ahead
        if (profile_recording()) {  // with the GPU idle, step_start happens when the host records it
            device_synchronize();
            recording(gpu)->step_start_host = wall_seconds();
        } else {
            recording(gpu)->step_start_host = 0;
        }
        CHECK_CUDA(cudaEventRecord(recording(gpu)->step_start, device_stream()));
    }
    GpuBucket *bucket = &gpu->buckets[b];
    TimedStep *timed_step = recording(gpu);
    pack_on_gpu(ddp, b);
    CHECK_CUDA(cudaEventRecord(bucket->packed, device_stream()));
    // The allreduce on the communication stream, behind the packing.
    cudaStream_t comm = device_comm_stream();
    CHECK_CUDA(cudaStreamWaitEvent(comm, bucket->packed, 0));  // (in a capture: the communication stream forks)
    if (timed) CHECK_CUDA(cudaEventRecord(timed_step->comm_start[b], comm));
    group_count_traffic(ddp->group, TRAFFIC_ALL_REDUCE, ddp->buckets[b].count);
    CHECK_NCCL(ncclAllReduce(bucket->device_buffer, bucket->device_buffer, ddp->buckets[b].count, ncclFloat, ncclSum,
                             ddp->group->nccl, comm));
    if (timed) CHECK_CUDA(cudaEventRecord(timed_step->comm_done[b], comm));
    CHECK_CUDA(cudaEventRecord(bucket->reduced, comm));
}

// Nothing to wait for on the host: the compute stream waits for each bucket (in a capture: the
// communication stream joins it again).
void ddp_nccl_finish(Ddp *ddp) {
    DdpGpu *gpu = ddp->gpu;
    bool timed = !device_graph_capturing();
    if (timed) CHECK_CUDA(cudaEventRecord(recording(gpu)->backward_end, device_stream()));
    for (int b = 0; b < ddp->n_buckets; b++) {
        CHECK(ddp->buckets[b].pending == 0, "ddp_finish: backward did not produce bucket %d", b);
        CHECK_CUDA(cudaStreamWaitEvent(device_stream(), gpu->buckets[b].reduced, 0));
        divide_into_grads(ddp, b);
        ddp->buckets[b].pending = ddp->buckets[b].n_params;
    }
    if (timed) gpu->n_timed++;
    else ddp->captured_steps++;
}

// NCCL's statistics of every recorded step, read off the GPU's timeline (waiting for it), with
// the end of backward on the compute stream as the boundary of "hidden". Times are seconds since
// the step's first bucket was packed.
void ddp_nccl_account_step(Ddp *ddp) {
    while (account_oldest(ddp, true)) {}
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
