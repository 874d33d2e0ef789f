// collectives.c: tensor collectives on MPI, NCCL or host copies. See collectives.h.
#include "collectives.h"

#include "check.h"
#include "dist.h"

#if HAVE_CUDA
static cudaEvent_t g_compute_done, g_comm_done;  // the ordering between the two streams
static float *g_staging;                         // host copies for MPI (page-locked)
static size_t g_staging_count;

static void collectives_release(void) {
    if (g_compute_done) {
        CHECK_CUDA(cudaEventDestroy(g_compute_done));
        CHECK_CUDA(cudaEventDestroy(g_comm_done));
        g_compute_done = g_comm_done = NULL;
    }
    device_host_free(g_staging);
    g_staging = NULL;
    g_staging_count = 0;
}

// The communication stream waits for the compute stream's queued work (the
// tensor's producers); afterwards the compute stream waits for the collective.
static void comm_after_compute(void) {
    if (!g_compute_done) {
        CHECK_CUDA(cudaEventCreateWithFlags(&g_compute_done, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreateWithFlags(&g_comm_done, cudaEventDisableTiming));
        dist_at_finalize(collectives_release);  // before the device's own teardown
    }
    CHECK_CUDA(cudaEventRecord(g_compute_done, device_stream()));
    CHECK_CUDA(cudaStreamWaitEvent(device_comm_stream(), g_compute_done, 0));
}
static void compute_after_comm(void) {
    CHECK_CUDA(cudaEventRecord(g_comm_done, device_comm_stream()));
    CHECK_CUDA(cudaStreamWaitEvent(device_stream(), g_comm_done, 0));
}

static float *host_copy(const Tensor *t) {
    if (tensor_numel(t) > g_staging_count) {
        device_host_free(g_staging);
        g_staging = device_host_alloc(tensor_numel(t) * sizeof(float));
        g_staging_count = tensor_numel(t);
        dist_at_finalize(collectives_release);
    }
    tensor_to_host(t, g_staging);
    return g_staging;
}
#endif

void dist_all_reduce(Tensor *t) {
    if (dist_world_size() == 1) return;
    if (!tensor_on_gpu(t)) {
        dist_allreduce_sum(t->data, tensor_numel(t));
        return;
    }
#if HAVE_CUDA
    if (device_nccl()) {
        comm_after_compute();
        CHECK_NCCL(ncclAllReduce(t->data, t->data, tensor_numel(t), ncclFloat, ncclSum, device_nccl_comm(),
                                 device_comm_stream()));
        compute_after_comm();
        return;
    }
    float *host = host_copy(t);  // ranks share a GPU: MPI on the host
    dist_allreduce_sum(host, tensor_numel(t));
    tensor_from_host(t, host);
#endif
}

void dist_broadcast_tensor(Tensor *t, int root) {
    if (dist_world_size() == 1) return;
    if (!tensor_on_gpu(t)) {
        dist_broadcast(t->data, tensor_numel(t), root);
        return;
    }
#if HAVE_CUDA
    if (device_nccl()) {
        comm_after_compute();
        CHECK_NCCL(ncclBroadcast(t->data, t->data, tensor_numel(t), ncclFloat, root, device_nccl_comm(),
                                 device_comm_stream()));
        compute_after_comm();
        return;
    }
    float *host = host_copy(t);
    dist_broadcast(host, tensor_numel(t), root);
    tensor_from_host(t, host);
#endif
}
