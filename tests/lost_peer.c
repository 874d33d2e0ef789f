// lost_peer.c: loses one rank's NCCL at its Nth operation, so that tests can
// show what a dead peer does to the others (tests/test_gpu.sh, "a lost peer"),
// on a real GPU and on tests/fake_gpu alike. Preloaded into the ranks:
//
//   export LOST_PEER_RANK=1 LOST_PEER_AT=10 GPU_WAIT_TIMEOUT=5
//   mpirun -np 2 -x LD_PRELOAD=build/lib/liblost_peer.so day1/6_mnist_ddp
//
// From its LOST_PEER_AT-th NCCL operation on (a collective, a send or a
// receive, counted from 1) rank LOST_PEER_RANK of MPI_COMM_WORLD makes none:
// to its peers it is a rank that died in the middle of a collective, which
// then never completes on their GPUs, and neither does anything queued behind
// it. Unlike a dead process, mpirun does not see it, so nothing but the
// peers' own waits can end the job: that is what the tests check. (The lost
// rank runs on with unreduced gradients; it next meets its peers in an MPI
// call, and waits there until they end the job.) It says once, on stderr:
//   lost_peer: rank 1 makes no NCCL operation from number 10 (ncclAllReduce) on
//
// NCCL itself reports nothing when a peer on the same node dies (shared
// memory, NVLink): its GPU kernels just wait. Across nodes it reports an
// error once its network timeout passes. LOST_PEER_ERROR_AFTER=SECONDS makes
// ncclCommGetAsyncError say ncclRemoteError, on every rank, from SECONDS after
// the loss; the lost rank marks that moment by creating LOST_PEER_FILE, a
// path every rank must see (one node, or a shared file system).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // RTLD_NEXT
#endif
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static long g_operations;   // this rank's NCCL operations so far
static int g_lost;          // this rank makes no more of them
static char g_error[256];   // what ncclGetLastError says once we report the loss

static long env_long(const char *name, long fallback) {
    const char *text = getenv(name);
    return text && *text ? atol(text) : fallback;
}

static int world_rank(void) {
    int initialized = 0, rank = -1;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

// Counts this operation; true if it is not to be made (the rank is lost).
static int lost_at(const char *operation) {
    pthread_mutex_lock(&g_lock);
    long at = env_long("LOST_PEER_AT", 0);
    if (!g_lost && at > 0 && ++g_operations >= at && world_rank() == env_long("LOST_PEER_RANK", -1)) {
        g_lost = 1;
        const char *file = getenv("LOST_PEER_FILE");
        if (file && *file) {
            FILE *mark = fopen(file, "w");  // its modification time is the moment of the loss
            if (mark) fclose(mark);
        }
        fprintf(stderr, "lost_peer: rank %d makes no NCCL operation from number %ld (%s) on\n", world_rank(), at,
                operation);
    }
    int lost = g_lost;
    pthread_mutex_unlock(&g_lock);
    return lost;
}

// Seconds since the loss, or -1 before it (or without LOST_PEER_FILE).
static double seconds_since_loss(void) {
    const char *file = getenv("LOST_PEER_FILE");
    struct stat info;
    if (!file || !*file || stat(file, &info) != 0) return -1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)(now.tv_sec - info.st_mtim.tv_sec) + 1e-9 * (double)(now.tv_nsec - info.st_mtim.tv_nsec);
}

static void *next(const char *name) {
    void *real = dlsym(RTLD_NEXT, name);
    if (!real) {
        fprintf(stderr, "lost_peer: no %s after this library (is NCCL linked in?)\n", name);
        abort();
    }
    return real;
}

// Each NCCL operation: counted, then made, unless the rank is lost.
#define OPERATION(name, params, args)                       \
    ncclResult_t name params {                              \
        static ncclResult_t(*real) params;                  \
        if (lost_at(#name)) return ncclSuccess;             \
        if (!real) real = (ncclResult_t(*) params)next(#name); \
        return real args;                                   \
    }

OPERATION(ncclAllReduce, (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                          ncclComm_t comm, cudaStream_t stream), (send, recv, count, type, op, comm, stream))
OPERATION(ncclBroadcast, (const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                          ncclComm_t comm, cudaStream_t stream), (send, recv, count, type, root, comm, stream))
OPERATION(ncclReduce, (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                       ncclComm_t comm, cudaStream_t stream), (send, recv, count, type, op, root, comm, stream))
OPERATION(ncclAllGather, (const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                          cudaStream_t stream), (send, recv, count, type, comm, stream))
OPERATION(ncclReduceScatter, (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t stream), (send, recv, count, type, op, comm, stream))
OPERATION(ncclSend, (const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                     cudaStream_t stream), (send, count, type, peer, comm, stream))
OPERATION(ncclRecv, (void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream),
          (recv, count, type, peer, comm, stream))

// NCCL's view across nodes: after its network timeout, an error.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
    static ncclResult_t (*real)(ncclComm_t, ncclResult_t *);
    if (!real) real = (ncclResult_t(*)(ncclComm_t, ncclResult_t *))next("ncclCommGetAsyncError");
    ncclResult_t result = real(comm, error);
    double after = atof(getenv("LOST_PEER_ERROR_AFTER") ? getenv("LOST_PEER_ERROR_AFTER") : "0");
    double since = seconds_since_loss();
    if (result == ncclSuccess && *error == ncclSuccess && after > 0 && since >= after) {
        snprintf(g_error, sizeof g_error, "lost_peer: rank %ld stopped answering %.0f s ago (LOST_PEER_ERROR_AFTER=%g)",
                 env_long("LOST_PEER_RANK", -1), since, after);
        *error = ncclRemoteError;
    }
    return result;
}

const char *ncclGetLastError(ncclComm_t comm) {
    static const char *(*real)(ncclComm_t);
    if (g_error[0]) return g_error;
    if (!real) real = (const char *(*)(ncclComm_t))next("ncclGetLastError");
    return real(comm);
}
