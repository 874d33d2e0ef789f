// dist.c: process group on MPI. See dist.h.
#include "dist.h"

#include <stdarg.h>
#include <stdio.h>

#include "check.h"
#include "profile.h"

static int g_nodes = 1;
static int g_rank = 0, g_world = 1, g_local_rank = 0, g_local_world = 1, g_thread_level = MPI_THREAD_SINGLE;
static char g_host[MPI_MAX_PROCESSOR_NAME] = "localhost";
#if HAVE_CUDA
static ncclComm_t g_nccl;                         // NULL: GPU collectives go through MPI
static cudaStream_t g_comm_stream;                // NCCL's, beside the compute stream
static cudaEvent_t g_compute_done, g_comm_done;   // the ordering between the two
static float *g_staging;                          // host copies for MPI (page-locked)
static size_t g_staging_count;
#endif

void dist_init(int *argc, char ***argv) {
    // DDP's communication thread calls MPI while the main thread may too.
    CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &g_thread_level));
    // MPI's default handler aborts inside the failing call, with its own
    // message; returning the error lets CHECK_MPI name our call and line.
    CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &g_world));
    int len = 0;
    CHECK_MPI(MPI_Get_processor_name(g_host, &len));

    // The ranks that share memory share a node: their rank in that group is
    // the local rank (what torchrun calls LOCAL_RANK; it picks the GPU).
    MPI_Comm node;
    CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node));
    CHECK_MPI(MPI_Comm_rank(node, &g_local_rank));
    CHECK_MPI(MPI_Comm_size(node, &g_local_world));
    CHECK_MPI(MPI_Comm_free(&node));
    g_nodes = g_local_rank == 0;  // one leader per node: count them
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &g_nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
}

void dist_finalize(void) {
    profile_finish();  // write the trace, if --trace asked for one (collective)
#if HAVE_CUDA
    if (g_nccl) {
        CHECK_CUDA(cudaStreamSynchronize(g_comm_stream));
        CHECK_NCCL(ncclCommDestroy(g_nccl));
        CHECK_CUDA(cudaStreamDestroy(g_comm_stream));
        CHECK_CUDA(cudaEventDestroy(g_compute_done));
        CHECK_CUDA(cudaEventDestroy(g_comm_done));
        g_nccl = NULL;
    }
    device_host_free(g_staging);
    g_staging = NULL;
#endif
    device_release();
    fflush(stdout);
    CHECK_MPI(MPI_Finalize());
}

int dist_rank(void) { return g_rank; }
int dist_thread_multiple(void) { return g_thread_level >= MPI_THREAD_MULTIPLE; }
int dist_world_size(void) { return g_world; }
int dist_local_rank(void) { return g_local_rank; }
int dist_local_world_size(void) { return g_local_world; }
int dist_num_nodes(void) { return g_nodes; }
const char *dist_hostname(void) { return g_host; }

// MPI counts are int; gradients of big models are not. Send in slices.
#define MPI_SLICE ((size_t)1 << 30)

void dist_allreduce_sum(float *buf, size_t count) {
    if (g_world == 1) return;
    for (size_t off = 0; off < count; off += MPI_SLICE) {
        int n = (int)(count - off < MPI_SLICE ? count - off : MPI_SLICE);
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf + off, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    }
}

void dist_broadcast(float *buf, size_t count, int root) {
    if (g_world == 1) return;
    for (size_t off = 0; off < count; off += MPI_SLICE) {
        int n = (int)(count - off < MPI_SLICE ? count - off : MPI_SLICE);
        CHECK_MPI(MPI_Bcast(buf + off, n, MPI_FLOAT, root, MPI_COMM_WORLD));
    }
}

void dist_barrier(void) { CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD)); }

// ------------------------------------------------------------------ tensors: MPI or NCCL

#if HAVE_CUDA
void dist_use_nccl(void) {
    ncclUniqueId id;
    if (g_rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    CHECK_NCCL(ncclCommInitRank(&g_nccl, g_world, id, g_rank));
    CHECK_CUDA(cudaStreamCreateWithFlags(&g_comm_stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&g_compute_done, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&g_comm_done, cudaEventDisableTiming));
}

bool dist_nccl(void) { return g_nccl != NULL; }
ncclComm_t dist_nccl_comm(void) { return g_nccl; }
cudaStream_t dist_comm_stream(void) { return g_comm_stream; }

// The communication stream waits for the compute stream's queued work (the
// tensor's producers); afterwards the compute stream waits for the collective.
static void comm_after_compute(void) {
    CHECK_CUDA(cudaEventRecord(g_compute_done, device_stream()));
    CHECK_CUDA(cudaStreamWaitEvent(g_comm_stream, g_compute_done, 0));
}
static void compute_after_comm(void) {
    CHECK_CUDA(cudaEventRecord(g_comm_done, g_comm_stream));
    CHECK_CUDA(cudaStreamWaitEvent(device_stream(), g_comm_done, 0));
}

static float *host_copy(const Tensor *t) {
    if (tensor_numel(t) > g_staging_count) {
        device_host_free(g_staging);
        g_staging = device_host_alloc(tensor_numel(t) * sizeof(float));
        g_staging_count = tensor_numel(t);
    }
    tensor_to_host(t, g_staging);
    return g_staging;
}
#else
void dist_use_nccl(void) { FATAL("dist_use_nccl: this build has no GPU code"); }
bool dist_nccl(void) { return false; }
#endif

void dist_all_reduce(Tensor *t) {
    if (g_world == 1) return;
    if (!tensor_on_gpu(t)) {
        dist_allreduce_sum(t->data, tensor_numel(t));
        return;
    }
#if HAVE_CUDA
    if (g_nccl) {
        comm_after_compute();
        CHECK_NCCL(ncclAllReduce(t->data, t->data, tensor_numel(t), ncclFloat, ncclSum, g_nccl, g_comm_stream));
        compute_after_comm();
        return;
    }
    float *host = host_copy(t);  // ranks share a GPU: MPI on the host
    dist_allreduce_sum(host, tensor_numel(t));
    tensor_from_host(t, host);
#endif
}

void dist_broadcast_tensor(Tensor *t, int root) {
    if (g_world == 1) return;
    if (!tensor_on_gpu(t)) {
        dist_broadcast(t->data, tensor_numel(t), root);
        return;
    }
#if HAVE_CUDA
    if (g_nccl) {
        comm_after_compute();
        CHECK_NCCL(ncclBroadcast(t->data, t->data, tensor_numel(t), ncclFloat, root, g_nccl, g_comm_stream));
        compute_after_comm();
        return;
    }
    float *host = host_copy(t);
    dist_broadcast(host, tensor_numel(t), root);
    tensor_from_host(t, host);
#endif
}

static void print_line(const char *prefix, const char *fmt, va_list ap) {
    char line[2048];
    int len = snprintf(line, sizeof line, "%s", prefix);
    vsnprintf(line + len, sizeof line - len, fmt, ap);
    fputs(line, stdout);  // one write per line (stdout is flushed right after)
    fflush(stdout);
}

void print0(const char *fmt, ...) {
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    print_line("", fmt, ap);
    va_end(ap);
}

void print_rank(const char *fmt, ...) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "[rank %d] ", g_rank);
    va_list ap;
    va_start(ap, fmt);
    print_line(prefix, fmt, ap);
    va_end(ap);
}
