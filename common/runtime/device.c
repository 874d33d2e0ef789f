// device.c: the device choice and the CUDA context. See device.h.
#include "runtime/device.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "runtime/dist.h"

static Device g_device = DEVICE_CPU;
static char g_name[300] = "cpu";
static double g_gpu_memory;       // bytes of this rank's GPU (0: a CPU rank)
static int g_ranks_on_gpu = 1;    // the ranks of its node that use that GPU (device_gpus_shared counts them)

#if HAVE_CUDA
static bool g_pinned_host;        // device_host_alloc gives page-locked memory (from the GPU's choice on)
static int g_gpu = -1;            // the CUDA device index of this rank
static cudaStream_t g_stream;     // every kernel, copy and GEMM of this rank, in order
static cublasHandle_t g_cublas;
static ncclComm_t g_nccl;         // NULL: GPU collectives go through MPI on host copies
// The groups' communicators, split from g_nccl (group.h): polled and aborted with it.
enum { MAX_SPLIT_COMMS = 16 };
static ncclComm_t g_split[MAX_SPLIT_COMMS];
static int g_n_split;
static cudaStream_t g_comm_stream;  // NCCL's, beside the compute stream

cudaStream_t device_stream(void) { return g_stream; }
cublasHandle_t device_cublas(void) { return g_cublas; }
ncclComm_t device_nccl_comm(void) { return g_nccl; }
cudaStream_t device_comm_stream(void) { return g_comm_stream; }
bool device_nccl(void) { return g_nccl != NULL; }
#else
bool device_nccl(void) { return false; }
#endif

int device_gpu_count(void) {
#if HAVE_CUDA
    int count = 0;
    // No driver (cudaErrorInsufficientDriver) or no GPU (cudaErrorNoDevice):
    // a CPU machine, not an error. Clear the sticky error and say 0.
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
#else
    return 0;
#endif
}

// The lowest (or highest) value of x over the ranks.
static int min_over_ranks(int x) {
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return x;
}
static int max_over_ranks(int x) {
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    return x;
}

int device_local_gpu(void) {
    int gpus = device_gpu_count();
    return gpus > 0 ? dist_local_rank() % gpus : -1;
}

bool device_gpus_shared(int gpu) {
#if HAVE_CUDA
    enum { NAME = 160 };
    char mine[NAME] = "", *all = xcalloc((size_t)dist_world_size(), NAME);
    int len = snprintf(mine, NAME, "%s/", dist_hostname());
    CHECK_CUDA(cudaDeviceGetPCIBusId(mine + len, NAME - len, gpu));
    CHECK_MPI(MPI_Allgather(mine, NAME, MPI_CHAR, all, NAME, MPI_CHAR, MPI_COMM_WORLD));
    bool shared = false;
    for (int i = 0; i < dist_world_size() && !shared; i++)
        for (int j = i + 1; j < dist_world_size() && !shared; j++) shared = strcmp(all + i * NAME, all + j * NAME) == 0;
    g_ranks_on_gpu = 0;  // its memory is theirs to share (memory_budget.c)
    for (int i = 0; i < dist_world_size(); i++) g_ranks_on_gpu += strcmp(all + i * NAME, mine) == 0;
    free(all);
    return shared;
#else
    (void)gpu;
    return false;
#endif
}

#if HAVE_CUDA
static void use_gpu(void) {
    g_gpu = device_local_gpu();
    CHECK_CUDA(cudaSetDevice(g_gpu));
    // A blocking stream: should anything use the legacy default stream (a
    // plain cudaMemcpy, cudaFree), it still waits for our queued work.
    CHECK_CUDA(cudaStreamCreate(&g_stream));
    CHECK_CUBLAS(cublasCreate(&g_cublas));
    CHECK_CUBLAS(cublasSetStream(g_cublas, g_stream));
    // Plain FP32 GEMMs (cuBLAS uses TF32 tensor cores only when asked to):
    // PyTorch's default (allow_tf32 = False), and what the CPU-vs-GPU loss
    // comparison relies on.
    CHECK_CUBLAS(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, g_gpu));
    snprintf(g_name, sizeof g_name, "cuda:%d (%s)", g_gpu, prop.name);
    g_gpu_memory = (double)prop.totalGlobalMem;
    g_device = DEVICE_CUDA;
    g_pinned_host = true;
    dist_at_finalize(device_release);
}

// Open the NCCL communicator over the ranks' GPUs: rank 0 makes the unique
// id and MPI_Bcast carries it to the others. Collective.
static void use_nccl(void) {
    ncclUniqueId id;
    if (dist_rank() == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    CHECK_NCCL(ncclCommInitRank(&g_nccl, dist_world_size(), id, dist_rank()));
    CHECK_CUDA(cudaStreamCreateWithFlags(&g_comm_stream, cudaStreamNonBlocking));
}
#endif

Device device_from_flag(const char *flag) {
    bool want_gpu = strcmp(flag, "cuda") == 0, auto_choice = strcmp(flag, "auto") == 0;
    if (!want_gpu && !auto_choice && strcmp(flag, "cpu") != 0)
        usage_error("--device %s: expected cpu, cuda or auto", flag);
    if (!want_gpu && !auto_choice) return g_device = DEVICE_CPU;
    if (want_gpu && !HAVE_CUDA)
        usage_error("--device cuda: this build has no GPU code (built with CUDA=0 or without nvcc); use --device cpu");

    // Every rank must make the same choice: a job that is half on GPUs would
    // mix NCCL and MPI collectives. So the GPU is used only if all ranks have one.
    int gpus = device_gpu_count();
    bool everyone_has_one = min_over_ranks(gpus) > 0;
    if (want_gpu) {
        char message[160];
        snprintf(message, sizeof message, "--device cuda: no CUDA device on %s (use --device cpu, or a GPU node)",
                 dist_hostname());
        check_all_ranks(gpus > 0, message);
    }
    if (!everyone_has_one) {
        if (max_over_ranks(gpus) > 0) print0("device: some ranks see no GPU, so every rank computes on its CPU\n");
        return g_device = DEVICE_CPU;
    }
#if HAVE_CUDA
    use_gpu();
    // NCCL needs one GPU per rank. Where ranks share one, fall back to MPI on
    // host copies, on every rank alike.
    if (device_gpus_shared(g_gpu)) {
        print0("device: %d ranks share %d GPU%s on %s; NCCL cannot put two ranks on one GPU, so collectives "
               "go through MPI on host copies\n",
               dist_local_world_size(), gpus, gpus == 1 ? "" : "s", dist_hostname());
    } else if (dist_world_size() > 1) {
        use_nccl();
    }
#endif
    return g_device;
}

const char *device_name(Device device) { return device == DEVICE_CPU ? "cpu" : g_name; }

double device_gpu_memory_bytes(int *ranks_on_gpu) {
    *ranks_on_gpu = g_gpu_memory > 0 ? g_ranks_on_gpu : 0;
    return g_gpu_memory;
}

#if HAVE_CUDA
// Every communicator of ours stops: NCCL's abort ends the GPU kernels that
// wait for a peer, so the job can end. `own` is the caller's own, or NULL.
static void abort_communicators(ncclComm_t *own) {
    if (own && *own) ncclCommAbort(*own);  // the abort's own result no longer matters
    if (own) *own = NULL;
    if (g_nccl) ncclCommAbort(g_nccl);
    g_nccl = NULL;
    for (int i = 0; i < g_n_split; i++) ncclCommAbort(g_split[i]);
    g_n_split = 0;
}

// A failed communicator (a peer died, the network broke) ends the job now:
// the GPU's NCCL kernels would otherwise wait for the peer forever. `own`
// (step 12's) or, when NULL, device.c's: the world's and the groups'.
static void check_nccl_async_error(ncclComm_t *own, const char *waiting_for) {
    ncclComm_t comms[MAX_SPLIT_COMMS + 1];
    int n = 0;
    if (own) {
        if (*own) comms[n++] = *own;
    } else {
        if (g_nccl) comms[n++] = g_nccl;
        for (int i = 0; i < g_n_split; i++) comms[n++] = g_split[i];
    }
    for (int i = 0; i < n; i++) {
        ncclResult_t async = ncclSuccess;
        CHECK_NCCL(ncclCommGetAsyncError(comms[i], &async));
        if (async == ncclSuccess || async == ncclInProgress) continue;
        char detail[256];
        snprintf(detail, sizeof detail, "%s", ncclGetLastError(comms[i]));  // before the abort frees it
        abort_communicators(own);
        FATAL("NCCL failed while the host waited for %s on the GPU: %s (%s); a peer rank died or the network "
              "failed: aborting the job", waiting_for, ncclGetErrorString(async), detail);
    }
}

// NCCL reports a peer that died on another node only after its own network
// timeout, and one on the same node (shared memory, NVLink) never: the GPU
// just waits. So a wait has a limit, as init_process_group's timeout (10
// minutes) in PyTorch; GPU_WAIT_TIMEOUT=SECONDS sets it. No wait of ours
// is anywhere near it: the host is never more than a step ahead of the GPU.
static double wait_limit(void) {
    const char *seconds = getenv("GPU_WAIT_TIMEOUT");
    return seconds && atof(seconds) > 0.0 ? atof(seconds) : 600.0;
}

static void check_wait_timeout(double started, double limit, ncclComm_t *own, const char *waiting_for) {
    double waited = wall_seconds() - started;
    if (waited < limit) return;
    abort_communicators(own);
    FATAL("the host waited %.0f s for %s on the GPU: a peer rank died or hangs (NCCL does not see a dead peer "
          "on the same node); aborting the job (GPU_WAIT_TIMEOUT=SECONDS sets the limit)", waited, waiting_for);
}

// Query until done; a query's own error (not "not ready") is fatal as usual.
#define POLL(query, own, what)                                                   \
    for (double started_ = wall_seconds(), limit_ = wait_limit();;) {            \
        cudaError_t status_ = (query);                                           \
        if (status_ == cudaSuccess) break;                                       \
        if (status_ != cudaErrorNotReady) CHECK_CUDA(status_);                   \
        check_nccl_async_error(own, what);                                       \
        check_wait_timeout(started_, limit_, own, what);                         \
        sched_yield();                                                           \
    }

void device_wait_stream(cudaStream_t stream, const char *what) { POLL(cudaStreamQuery(stream), NULL, what); }
void device_wait_event(cudaEvent_t event, const char *what) { POLL(cudaEventQuery(event), NULL, what); }
void device_wait_stream_nccl(cudaStream_t stream, ncclComm_t *comm, const char *what) {
    POLL(cudaStreamQuery(stream), comm, what);
}

ncclComm_t device_nccl_split(int color, int key) {
    CHECK(g_nccl, "device_nccl_split: no NCCL communicator to split (device_nccl() is false)");
    CHECK(g_n_split < MAX_SPLIT_COMMS, "device_nccl_split: more than %d groups", MAX_SPLIT_COMMS);
    ncclComm_t comm = NULL;
    CHECK_NCCL(ncclCommSplit(g_nccl, color, key, &comm, NULL));
    g_split[g_n_split++] = comm;
    return comm;
}

void device_nccl_free(ncclComm_t comm) {
    for (int i = 0; i < g_n_split; i++)
        if (g_split[i] == comm) {
            g_split[i] = g_split[--g_n_split];
            CHECK_NCCL(ncclCommDestroy(comm));
            return;
        }
}

void device_read_to_host(void *host, const void *device_memory, size_t bytes, const char *what) {
    // Into pageable memory the copy returns only when the stream gets there,
    // inside the driver: so first the polled wait, after which it has nothing
    // to wait for. Into page-locked memory it is queued: the second wait.
    device_wait_stream(g_stream, what);
    CHECK_CUDA(cudaMemcpyAsync(host, device_memory, bytes, cudaMemcpyDeviceToHost, g_stream));
    device_wait_stream(g_stream, what);
}
#endif

#if HAVE_CUDA
static void synchronize_polled(const char *what);

// Uploads through a ring of page-locked slots, all of one size: each slot's copy, and the event after it.
enum { UPLOAD_SLOTS = 64 };
static struct {
    char *host[UPLOAD_SLOTS];
    size_t slot_bytes;
    cudaEvent_t copied[UPLOAD_SLOTS];  // recorded after the slot's last copy
    bool used[UPLOAD_SLOTS];
    int next;
} g_upload;

void device_upload(void *device_memory, const void *host, size_t bytes, const char *what) {
    if (bytes == 0) return;
    if (bytes > g_upload.slot_bytes) {  // every slot grown at once to twice this (a run's first uploads only)
        synchronize_polled(what);       // (cudaFreeHost would wait for the device inside the driver)
        for (int k = 0; k < UPLOAD_SLOTS; k++) {
            if (g_upload.host[k]) CHECK_CUDA(cudaFreeHost(g_upload.host[k]));
            else CHECK_CUDA(cudaEventCreateWithFlags(&g_upload.copied[k], cudaEventDisableTiming));
            g_upload.used[k] = false;
        }
        g_upload.slot_bytes = 2 * bytes > 4096 ? 2 * bytes : 4096;
        for (int k = 0; k < UPLOAD_SLOTS; k++) CHECK_CUDA(cudaMallocHost((void **)&g_upload.host[k], g_upload.slot_bytes));
    }
    int k = g_upload.next;
    g_upload.next = (k + 1) % UPLOAD_SLOTS;
    if (g_upload.used[k]) device_wait_event(g_upload.copied[k], what);  // (long done, in a steady state)
    memcpy(g_upload.host[k], host, bytes);
    CHECK_CUDA(cudaMemcpyAsync(device_memory, g_upload.host[k], bytes, cudaMemcpyHostToDevice, g_stream));
    CHECK_CUDA(cudaEventRecord(g_upload.copied[k], g_stream));
    g_upload.used[k] = true;
}

bool device_table_holds(const DeviceTable *table, const void *host, size_t bytes) {
    return table->device.data && table->bytes == bytes && memcmp(table->sent, host, bytes) == 0;
}

const void *device_table_send(DeviceTable *table, const void *host, size_t bytes, const char *what) {
    if (device_table_holds(table, host, bytes)) return table->device.data;
    CHECK(!device_graph_capturing(), "%s: a new table of tensors during a CUDA graph's capture", what);
    device_buffer_free(&table->device);  // a new buffer: see device.h
    void *device = device_buffer_reserve(&table->device, bytes);
    device_upload(device, host, bytes, what);
    free(table->sent);
    table->sent = xmalloc(bytes ? bytes : 1);
    memcpy(table->sent, host, bytes);
    table->bytes = bytes;
    return device;
}

void device_table_free(DeviceTable *table) {
    device_buffer_free(&table->device);
    free(table->sent);
    *table = (DeviceTable){0};
}

struct DeviceGraph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

static bool g_capturing;

void device_graph_begin(void) {
    // Thread-local: only this thread's calls could spoil the capture (step 11's readers may wait meanwhile).
    // Should a call fail from here to the instantiated graph (an NCCL that cannot be captured, a
    // driver that refuses the graph), the line says so, and what runs without it.
    check_set_context("while a training step was captured into a CUDA graph; --cuda_graph off launches each kernel by itself");
    CHECK_CUDA(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    g_capturing = true;
}

bool device_graph_capturing(void) { return g_capturing; }

DeviceGraph *device_graph_end(void) {
    DeviceGraph *graph = xcalloc(1, sizeof *graph);
    g_capturing = false;
    CHECK_CUDA(cudaStreamEndCapture(g_stream, &graph->graph));
    CHECK_CUDA(cudaGraphInstantiate(&graph->exec, graph->graph, 0));
    check_set_context(NULL);
    return graph;
}

void device_graph_launch(const DeviceGraph *graph) {
    cudaError_t status = cudaGraphLaunch(graph->exec, g_stream);
    CHECK(status == cudaSuccess, "cudaGraphLaunch failed: %s (a training step replayed from its CUDA graph; "
          "should the graph be at fault, not an earlier kernel, --cuda_graph off launches each kernel by itself)",
          cudaGetErrorString(status));
}

void device_graph_free(DeviceGraph *graph) {
    if (!graph) return;
    synchronize_polled("a CUDA graph's last launch");  // (its work may still run)
    CHECK_CUDA(cudaGraphExecDestroy(graph->exec));
    CHECK_CUDA(cudaGraphDestroy(graph->graph));
    free(graph);
}

static void upload_free(void) {
    for (int k = 0; k < UPLOAD_SLOTS; k++) {
        if (g_upload.copied[k]) CHECK_CUDA(cudaEventDestroy(g_upload.copied[k]));
        if (g_upload.host[k]) CHECK_CUDA(cudaFreeHost(g_upload.host[k]));
    }
    memset(&g_upload, 0, sizeof g_upload);
}
#endif

#if HAVE_CUDA
// Our two streams, polled (NCCL's work is on the communication stream); then
// the device as a whole, which has nothing left that NCCL could hold up.
static void synchronize_polled(const char *what) {
    if (g_device != DEVICE_CUDA) return;
    device_wait_stream(g_stream, what);
    if (g_nccl) device_wait_stream(g_comm_stream, what);
    CHECK_CUDA(cudaDeviceSynchronize());
}
#endif

void device_synchronize(void) {
#if HAVE_CUDA
    synchronize_polled("the queued work");
#endif
}

void device_bind_thread(void) {
#if HAVE_CUDA
    if (g_device == DEVICE_CUDA) CHECK_CUDA(cudaSetDevice(g_gpu));
#endif
}

void device_release(void) {
#if HAVE_CUDA
    if (g_device != DEVICE_CUDA || !g_cublas) return;
    device_synchronize();
    while (g_n_split > 0) device_nccl_free(g_split[0]);  // a group not freed by its program
    if (g_nccl) {
        CHECK_NCCL(ncclCommDestroy(g_nccl));
        CHECK_CUDA(cudaStreamDestroy(g_comm_stream));
        g_nccl = NULL;
        g_comm_stream = NULL;
    }
    upload_free();
    CHECK_CUBLAS(cublasDestroy(g_cublas));
    CHECK_CUDA(cudaStreamDestroy(g_stream));
    // No handle outlives what it names: a wait after this one (a teardown that
    // runs later) finds the default stream, not a destroyed one.
    g_cublas = NULL;
    g_stream = NULL;
#endif
}

// The live allocations, for device_peak_bytes: a few dozen at most (a model's tensors, their
// gradients and Adam's moments, the activations), so a list searched from its end, where the
// short-lived ones (a gathered layer) are.
#if HAVE_CUDA
static struct { void *pointer; size_t bytes; } *g_live;
static int g_n_live, g_live_capacity;
static size_t g_live_bytes, g_peak_bytes;
static pthread_mutex_t g_live_lock = PTHREAD_MUTEX_INITIALIZER;  // step 11's reader threads allocate too

size_t device_peak_bytes(void) { return g_peak_bytes; }
#else
size_t device_peak_bytes(void) { return 0; }
#endif

double host_peak_resident_bytes(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss * 1024.0;  // Linux reports KiB (its "kilobytes")
}

double device_peak_memory_bytes(Device device) {
    return device == DEVICE_CUDA ? (double)device_peak_bytes() : host_peak_resident_bytes();
}

void *device_alloc(size_t bytes) {
#if HAVE_CUDA
    if (bytes == 0) return NULL;
    synchronize_polled("the queued work, before a cudaMalloc");  // which may wait for it inside the driver
    void *pointer = NULL;
    cudaError_t status = cudaMalloc(&pointer, bytes);
    CHECK(status == cudaSuccess, "cannot allocate %.1f MB on %s: %s", bytes / 1e6, g_name, cudaGetErrorString(status));
    pthread_mutex_lock(&g_live_lock);
    if (g_n_live == g_live_capacity) {
        g_live_capacity = g_live_capacity ? 2 * g_live_capacity : 64;
        g_live = xrealloc(g_live, (size_t)g_live_capacity * sizeof *g_live);
    }
    g_live[g_n_live].pointer = pointer, g_live[g_n_live++].bytes = bytes;
    g_live_bytes += bytes;
    if (g_live_bytes > g_peak_bytes) g_peak_bytes = g_live_bytes;
    pthread_mutex_unlock(&g_live_lock);
    return pointer;
#else
    (void)bytes;
    FATAL("device_alloc: this build has no GPU code");
#endif
}

void device_free(void *pointer) {
#if HAVE_CUDA
    if (!pointer) return;
    synchronize_polled("the queued work, before a cudaFree");  // which waits for it inside the driver
    CHECK_CUDA(cudaFree(pointer));
    pthread_mutex_lock(&g_live_lock);
    for (int i = g_n_live - 1; i >= 0; i--)
        if (g_live[i].pointer == pointer) {
            g_live_bytes -= g_live[i].bytes;
            g_live[i] = g_live[--g_n_live];
            break;
        }
    pthread_mutex_unlock(&g_live_lock);
#else
    (void)pointer;
#endif
}

static long g_buffer_moves;  // DeviceBuffers (re)allocated so far: see device_buffer_moves

void *device_buffer_reserve(DeviceBuffer *buffer, size_t bytes) {
    if (bytes > buffer->bytes || !buffer->data) {
        g_buffer_moves++;
        device_free(buffer->data);
        buffer->bytes = bytes + bytes / 2 + 256;
        buffer->data = device_alloc(buffer->bytes);
    }
    return buffer->data;
}

long device_buffer_moves(void) { return g_buffer_moves; }

void device_buffer_free(DeviceBuffer *buffer) {
    device_free(buffer->data);
    *buffer = (DeviceBuffer){0};
}

void *device_host_alloc(size_t bytes) {
#if HAVE_CUDA
    if (g_pinned_host) {
        void *pointer = NULL;
        CHECK_CUDA(cudaMallocHost(&pointer, bytes ? bytes : 1));
        return pointer;
    }
#endif
    return xmalloc(bytes);
}

void device_host_free(void *pointer) {
#if HAVE_CUDA
    if (g_pinned_host) {
        if (!pointer) return;
        synchronize_polled("the queued work, before a cudaFreeHost");  // which waits for it, as cudaFree
        CHECK_CUDA(cudaFreeHost(pointer));
        return;
    }
#endif
    free(pointer);
}
