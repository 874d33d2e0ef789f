// collectives.c: tensor collectives on MPI, NCCL or host copies. See collectives.h.
#include "comm/collectives.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/device.h"
#include "runtime/dist.h"

#if HAVE_CUDA
static cudaEvent_t g_compute_done, g_comm_done;  // the ordering between the two streams
static float *g_staging;                         // host copies for MPI (page-locked)
static size_t g_staging_count;
// The ends of the collectives started and not yet waited for (group_wait): events made once and
// reused, as destroying one waits for it on some drivers and on tests/fake_gpu.
enum { MAX_IN_FLIGHT = 64 };
static cudaEvent_t g_ends[MAX_IN_FLIGHT];
static bool g_end_busy[MAX_IN_FLIGHT];

static void collectives_release(void) {
    if (g_compute_done) {
        CHECK_CUDA(cudaEventDestroy(g_compute_done));
        CHECK_CUDA(cudaEventDestroy(g_comm_done));
        g_compute_done = g_comm_done = NULL;
    }
    device_host_free(g_staging);
    g_staging = NULL;
    g_staging_count = 0;
    for (int i = 0; i < MAX_IN_FLIGHT; i++) {
        if (g_ends[i]) CHECK_CUDA(cudaEventDestroy(g_ends[i]));
        g_ends[i] = NULL, g_end_busy[i] = false;
    }
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

static float *staging(size_t count) {
    if (count > g_staging_count) {
        device_host_free(g_staging);
        g_staging = device_host_alloc(count * sizeof(float));
        g_staging_count = count;
        dist_at_finalize(collectives_release);
    }
    return g_staging;
}

static float *host_copy(const Tensor *t) {
    float *host = staging(tensor_numel(t));
    tensor_to_host(t, host);
    return host;
}
#endif

void group_all_reduce(const Group *group, Tensor *t) {
    if (group->size == 1) return;
    group_count_traffic(group, TRAFFIC_ALL_REDUCE, tensor_numel(t));
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

void group_all_reduce_doubles_on_gpu(const Group *group, double *device_values, size_t n) {
    if (group->size == 1 || n == 0) return;
#if HAVE_CUDA
    if (group->nccl) {
        comm_after_compute();
        CHECK_NCCL(ncclAllReduce(device_values, device_values, n, ncclDouble, ncclSum, group->nccl, device_comm_stream()));
        compute_after_comm();
        return;
    }
    double *host = xmalloc(n * sizeof(double));  // ranks share a GPU: MPI on the host (it waits)
    device_read_to_host(host, device_values, n * sizeof(double), "a sum to reduce over ranks");
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, host, (int)n, MPI_DOUBLE, MPI_SUM, group->mpi));
    CHECK_CUDA(cudaMemcpy(device_values, host, n * sizeof(double), cudaMemcpyHostToDevice));
    free(host);
#else
    (void)device_values;
    CHECK(false, "group_all_reduce_doubles_on_gpu: a build without CUDA");
#endif
}

void group_broadcast_tensor(const Group *group, Tensor *t, int root) {
    if (group->size == 1) return;
    group_count_traffic(group, TRAFFIC_BROADCAST, tensor_numel(t));
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
    for (int i = 0; i < n_sends; i++) group_count_traffic(group, TRAFFIC_SEND, tensor_numel(sends[i].tensor));
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

// ------------------------------------------------------------------ reduce-scatter and all-gather

// The shapes agree: the big side holds size blocks of the small side's count floats.
static size_t block_count(const Group *group, const Tensor *big, const Tensor *small, const char *what) {
    size_t count = tensor_numel(small);
    CHECK(tensor_numel(big) == count * (size_t)group->size, "%s: %zu floats are not %d blocks of %zu", what,
          tensor_numel(big), group->size, count);
    CHECK(tensor_on_gpu(big) == tensor_on_gpu(small), "%s: one tensor on the CPU, one on the GPU", what);
    CHECK(count * (size_t)group->size <= INT_MAX, "%s: %zu floats in one MPI call", what, count * (size_t)group->size);
    return count;
}

#if HAVE_CUDA
// NCCL on the communication stream, after the compute stream's queued work; the
// request's event marks its end, for group_wait.
static GroupRequest nccl_started(void) {
    int i = 0;
    while (i < MAX_IN_FLIGHT && g_end_busy[i]) i++;
    CHECK(i < MAX_IN_FLIGHT, "more than %d reduce-scatters and all-gathers started and not waited for", MAX_IN_FLIGHT);
    if (!g_ends[i]) CHECK_CUDA(cudaEventCreateWithFlags(&g_ends[i], cudaEventDisableTiming));  // (released with the rest)
    CHECK_CUDA(cudaEventRecord(g_ends[i], device_comm_stream()));
    g_end_busy[i] = true;
    return (GroupRequest){.request = MPI_REQUEST_NULL, .done = &g_end_busy[i]};
}
#endif

// ------------------------------------------------------------------ the ring (CPU tensors)

// Step s (0 .. size - 2) of rank r: send the partial sum of block (r - s - 1) mod size to rank
// r + 1, receive rank r - 1's partial sum of block (r - s - 2) mod size, add this rank's own
// block to it. After the last step, the block received is block r, and the sum is complete.
struct RingReduceScatter {
    const Group *group;
    const float *input;  // [size * count]: this rank's contribution
    float *output;       // [count]: block r's sum, written at the last step
    float *in_place;     // the input, when the output is its block r: each partial sum is kept at
                         // its block (the rest of the input is left undefined); NULL: they go to the
                         // output, which is free until the last step
    float *received;     // [count]: the previous rank's partial sum, the one block the ring allocates
    size_t count;
    MPI_Request requests[2];  // the step in flight: its receive and its send
};
// The rings' tag, apart from group_exchange's (0): MPI matches the steps of several rings in flight
// in the order each rank posts them, which program order makes the same on every rank.
enum { RING_TAG = 0x5253 };

static size_t block_at(const RingReduceScatter *ring, int offset) {  // block (rank + offset) mod size
    int size = ring->group->size;
    return (size_t)(((ring->group->rank + offset) % size + size) % size) * ring->count;
}
static float *partial_sum(const RingReduceScatter *ring, int offset) {
    return ring->in_place ? ring->in_place + block_at(ring, offset) : ring->output;
}

static void ring_post(RingReduceScatter *ring, int s) {
    int size = ring->group->size, rank = ring->group->rank;
    const float *send = s == 0 ? ring->input + block_at(ring, -1) : partial_sum(ring, -s - 1);
    CHECK_MPI(MPI_Irecv(ring->received, (int)ring->count, MPI_FLOAT, (rank - 1 + size) % size, RING_TAG,
                        ring->group->mpi, &ring->requests[0]));
    CHECK_MPI(MPI_Isend(send, (int)ring->count, MPI_FLOAT, (rank + 1) % size, RING_TAG, ring->group->mpi,
                        &ring->requests[1]));
}

static RingReduceScatter *ring_start(const Group *group, const Tensor *input, Tensor *output, size_t count) {
    RingReduceScatter *ring = xmalloc(sizeof *ring);
    bool in_place = output->data == input->data + (size_t)group->rank * count;
    *ring = (RingReduceScatter){.group = group, .input = input->data, .output = output->data,
                                .in_place = in_place ? input->data : NULL, .count = count,
                                .received = xmalloc(count * sizeof(float))};
    ring_post(ring, 0);
    return ring;
}

static void ring_finish(RingReduceScatter *ring) {
    int last = ring->group->size - 2;
    for (int s = 0;; s++) {  // step s is in flight
        CHECK_MPI(MPI_Waitall(2, ring->requests, MPI_STATUSES_IGNORE));
        // Read and written at the same index only: the sum may be the input's own block.
        float *sum = s == last ? ring->output : partial_sum(ring, -s - 2);
        const float *own = ring->input + block_at(ring, -s - 2);
        for (size_t i = 0; i < ring->count; i++) sum[i] = ring->received[i] + own[i];
        if (s == last) break;
        ring_post(ring, s + 1);
    }
    free(ring->received);
    free(ring);
}

GroupRequest group_reduce_scatter_start(const Group *group, const Tensor *input, Tensor *output) {
    size_t count = block_count(group, input, output, "group_reduce_scatter");
    group_count_traffic(group, TRAFFIC_REDUCE_SCATTER, tensor_numel(input));
    float *my_block = input->data + (size_t)group->rank * count;
    bool in_place = output->data == my_block;
    GroupRequest request = {.request = MPI_REQUEST_NULL};
    if (!tensor_on_gpu(input)) {
        if (group->size == 1) {
            if (!in_place) tensor_copy(output, input);
            return request;
        }
        request.ring = ring_start(group, input, output, count);
        return request;
    }
#if HAVE_CUDA
    if (group->nccl) {
        comm_after_compute();
        CHECK_NCCL(ncclReduceScatter(input->data, output->data, count, ncclFloat, ncclSum, group->nccl,
                                     device_comm_stream()));
        return nccl_started();
    }
    float *host = host_copy(input);  // ranks share a GPU (or one rank): MPI on the host
    if (group->size > 1)
        CHECK_MPI(MPI_Reduce_scatter_block(MPI_IN_PLACE, host, (int)count, MPI_FLOAT, MPI_SUM, group->mpi));
    tensor_from_host(output, host);
#endif
    return request;
}

GroupRequest group_all_gather_start(const Group *group, const Tensor *input, Tensor *output) {
    size_t count = block_count(group, output, input, "group_all_gather");
    group_count_traffic(group, TRAFFIC_ALL_GATHER, tensor_numel(output));
    float *my_block = output->data + (size_t)group->rank * count;
    bool in_place = input->data == my_block;
    GroupRequest request = {.request = MPI_REQUEST_NULL};
    if (!tensor_on_gpu(input)) {
        if (group->size == 1) {
            if (!in_place) tensor_copy(output, input);
            return request;
        }
        CHECK_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : input->data, (int)count, MPI_FLOAT, output->data,
                                 (int)count, MPI_FLOAT, group->mpi, &request.request));
        return request;
    }
#if HAVE_CUDA
    if (group->nccl) {
        comm_after_compute();
        CHECK_NCCL(ncclAllGather(input->data, output->data, count, ncclFloat, group->nccl, device_comm_stream()));
        return nccl_started();
    }
    float *host = staging(tensor_numel(output));
    tensor_to_host(input, host + (size_t)group->rank * count);
    if (group->size > 1)
        CHECK_MPI(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host, (int)count, MPI_FLOAT, group->mpi));
    tensor_from_host(output, host);
#endif
    return request;
}

void group_wait(GroupRequest *request) {
    if (request->request != MPI_REQUEST_NULL) CHECK_MPI(MPI_Wait(&request->request, MPI_STATUS_IGNORE));
    if (request->ring) ring_finish(request->ring);
#if HAVE_CUDA
    if (request->done) {  // the compute stream's next work waits for the collective; the host goes on
        bool *busy = request->done;
        CHECK_CUDA(cudaStreamWaitEvent(device_stream(), g_ends[busy - g_end_busy], 0));
        *busy = false;  // recorded again by a later collective: this wait keeps the state it has now
    }
#endif
    *request = (GroupRequest){.request = MPI_REQUEST_NULL};
}

void group_reduce_scatter(const Group *group, const Tensor *input, Tensor *output) {
    GroupRequest request = group_reduce_scatter_start(group, input, output);
    group_wait(&request);
}

void group_all_gather(const Group *group, const Tensor *input, Tensor *output) {
    GroupRequest request = group_all_gather_start(group, input, output);
    group_wait(&request);
}
