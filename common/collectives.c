// collectives.c: tensor collectives on MPI, NCCL or host copies. See collectives.h.
#include "collectives.h"

#include <limits.h>
#include <stdlib.h>

#include "check.h"
#include "device.h"
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

void group_all_reduce(const Group *group, Tensor *t) {
    if (group->size == 1) return;
    if (!tensor_on_gpu(t)) {
        dist_allreduce_sum_over(group->mpi, t->data, tensor_numel(t));
        return;
    }
#if HAVE_CUDA
    if (group->nccl) {
        comm_after_compute();
        CHECK_NCCL(ncclAllReduce(t->data, t->data, tensor_numel(t), ncclFloat, ncclSum, group->nccl,
                                 device_comm_stream()));
        compute_after_comm();
        return;
    }
    float *host = host_copy(t);  // ranks share a GPU: MPI on the host
    dist_allreduce_sum_over(group->mpi, host, tensor_numel(t));
    tensor_from_host(t, host);
#endif
}

void group_broadcast_tensor(const Group *group, Tensor *t, int root) {
    if (group->size == 1) return;
    if (!tensor_on_gpu(t)) {
        dist_broadcast_over(group->mpi, t->data, tensor_numel(t), root);
        return;
    }
#if HAVE_CUDA
    if (group->nccl) {
        comm_after_compute();
        CHECK_NCCL(ncclBroadcast(t->data, t->data, tensor_numel(t), ncclFloat, root, group->nccl,
                                 device_comm_stream()));
        compute_after_comm();
        return;
    }
    float *host = host_copy(t);
    dist_broadcast_over(group->mpi, host, tensor_numel(t), root);
    tensor_from_host(t, host);
#endif
}

void dist_all_reduce(Tensor *t) { group_all_reduce(group_world(), t); }
void dist_broadcast_tensor(Tensor *t, int root) { group_broadcast_tensor(group_world(), t, root); }

// MPI on host memory: the tensors' own (CPU), or host copies (a shared GPU).
static void exchange_through_mpi(const Group *group, const P2pSend *sends, int n_sends, const P2pReceive *receives,
                                 int n_receives, float **host) {
    MPI_Request *requests = xmalloc((size_t)(n_sends + n_receives) * sizeof(MPI_Request));
    for (int i = 0; i < n_receives; i++)
        CHECK_MPI(MPI_Irecv(host[n_sends + i], (int)tensor_numel(receives[i].tensor), MPI_FLOAT, receives[i].peer, 0,
                            group->mpi, &requests[n_sends + i]));
    for (int i = 0; i < n_sends; i++)
        CHECK_MPI(MPI_Isend(host[i], (int)tensor_numel(sends[i].tensor), MPI_FLOAT, sends[i].peer, 0, group->mpi,
                            &requests[i]));
    CHECK_MPI(MPI_Waitall(n_sends + n_receives, requests, MPI_STATUSES_IGNORE));
    free(requests);
}

void group_exchange(const Group *group, const P2pSend *sends, int n_sends, const P2pReceive *receives,
                    int n_receives) {
    int n = n_sends + n_receives;
    if (n == 0) return;
    bool on_gpu = tensor_on_gpu(n_sends ? sends[0].tensor : receives[0].tensor);
#if HAVE_CUDA
    if (on_gpu && group->nccl) {
        CHECK_NCCL(ncclGroupStart());
        for (int i = 0; i < n_sends; i++)
            CHECK_NCCL(ncclSend(sends[i].tensor->data, tensor_numel(sends[i].tensor), ncclFloat, sends[i].peer,
                                group->nccl, device_stream()));
        for (int i = 0; i < n_receives; i++)
            CHECK_NCCL(ncclRecv(receives[i].tensor->data, tensor_numel(receives[i].tensor), ncclFloat,
                                receives[i].peer, group->nccl, device_stream()));
        CHECK_NCCL(ncclGroupEnd());
        return;
    }
#endif
    float **host = xmalloc((size_t)n * sizeof(float *));
    for (int i = 0; i < n; i++) {
        const Tensor *t = i < n_sends ? sends[i].tensor : receives[i - n_sends].tensor;
        CHECK(tensor_on_gpu(t) == on_gpu, "group_exchange: tensors on the CPU and the GPU in one exchange");
        CHECK(tensor_numel(t) <= INT_MAX, "group_exchange: %zu floats in one message", tensor_numel(t));
        host[i] = on_gpu ? device_host_alloc(tensor_numel(t) * sizeof(float)) : t->data;
        if (on_gpu && i < n_sends) tensor_to_host(t, host[i]);
    }
    exchange_through_mpi(group, sends, n_sends, receives, n_receives, host);
    for (int i = 0; i < n && on_gpu; i++) {
        if (i >= n_sends) tensor_from_host(receives[i - n_sends].tensor, host[i]);
        device_host_free(host[i]);
    }
    free(host);
}
