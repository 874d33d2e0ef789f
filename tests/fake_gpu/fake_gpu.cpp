// fake_gpu.cpp: the CUDA runtime, cuBLAS and NCCL calls of this repository,
// run on the CPU, so that the GPU path (its host code, its kernels, the order
// of its streams) is tested on machines without a GPU.
//
// `make FAKE_GPU=1` (tests/fake_gpu/fake_gpu.mk) links the programs against
// this library instead of libcudart and libnccl, opens it as cuBLAS, and
// builds common/tensor/kernels.cu with tests/fake_gpu/nvcc. tests/test_fake_gpu.sh
// runs tests/test_gpu.sh on such a build, with one simulated GPU (the ranks
// share it: the MPI fallbacks) and with four (NCCL between ranks).
//
// It is stricter than a GPU where a GPU forgives by luck:
//  - Device memory is an arena that host code cannot touch (PROT_NONE) except
//    while a kernel, copy, GEMM or collective runs: a host loop over a device
//    pointer is a segfault, a kernel, GEMM or copy given host memory where it
//    wants device memory is stopped with its name.
//  - Fresh device and page-locked memory is filled with 0xFF bytes (NaN),
//    not the zeros a GPU often hands out: a read before a write shows.
//  - A stream's work runs only when something waits for it (the stream, an
//    event, a synchronous copy, cudaFree, another stream through
//    cudaStreamWaitEvent): a missing wait reads stale data.
//  - NCCL's operations are nonblocking MPI calls on their stream: posted at
//    the call (or, where the stream still waits for earlier work, when it
//    gets there), done once every peer has posted its part. So a peer that
//    never joins one (a dead rank: tests/lost_peer.c makes one) leaves it
//    waiting for good, and everything behind it on the GPU: a blocking copy,
//    a cudaFree, a synchronize block the host, as on a GPU, while queries
//    (cudaStreamQuery, cudaEventQuery) answer "not ready".
//  - Stream capture into a CUDA graph (cudaStreamBeginCapture .. cudaGraphLaunch)
//    records the work without running it; each launch runs it again. Another
//    stream joins the capture by waiting for an event recorded in it (a fork: DDP's
//    communication stream) and must be joined back before the capture ends; NCCL's
//    operations are captured as any other. Each branch of a launched graph runs on
//    a stream of its own, ordered only by the captured events, so a missing join
//    reads stale data as it would eagerly. A wait for the GPU, a query of a
//    captured stream or event, a captured stream waiting for an event recorded
//    outside its capture, or a fork not joined back stops the run, named, as CUDA
//    refuses each; so does an NCCL operation launched from a graph on some ranks
//    and eagerly on others, as NCCL requires them alike.
// It does not model timing, streams running side by side, memory sizes, or
// the GPU's rounding (nvcc contracts a * b + c into one FMA; g++ here does not).
// Nor does it catch, since the threads of a grid run one after the other and
// the arena is open to a whole kernel: a kernel writing past its block (only
// the pointers it is given are checked), a race inside a kernel (a missing
// __syncthreads, one block reading another's output), uninitialised __shared__
// memory (it keeps the last block's values), a stream overwriting what NCCL
// has yet to send (NCCL reads when posted), or another host thread reading
// device memory while a window is open. compute-sanitizer on a GPU does.
//
// FAKE_GPU_REFUSE_GRAPHS=1: every cudaStreamEndCapture fails (cudaErrorStreamCaptureInvalidated), to
// test what a program says where a real GPU's driver or NCCL refuses its CUDA graph.
//
// FAKE_GPU_COUNTS=FILE: each process counts what its main thread asks of the
// GPU, per training step (between two device_mark_step() calls: the optimizer
// marks the end of each step, common/runtime/device.h), and writes the counts
// to FILE.<rank> at exit, each step's line followed by what it launched, in order
// ("  launched: ..."). A host wait is a call that returns only once the GPU
// has got somewhere: cudaDeviceSynchronize, cudaStreamSynchronize,
// cudaEventSynchronize, cudaMemcpy, a cudaMemcpyAsync to or from pageable
// memory (the driver waits for the stream, or may, to stage it), cudaMalloc,
// cudaFree, cudaMallocHost, cudaFreeHost, and a loop of cudaStreamQuery or
// cudaEventQuery that finds the work unfinished (one wait per loop). A launch
// is a kernel, a cuBLAS call or an NCCL operation; copies and memsets are
// counted apart. Waits of other threads (step 11's readers) are counted apart
// too: they hold up no queueing of the step's work.
// Fibers switch stacks with _longjmp, which glibc's fortified longjmp refuses.
#undef _FORTIFY_SOURCE
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <sched.h>
#include <setjmp.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <sys/syscall.h>
#include <vector>

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

[[noreturn]] void fail(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "fake GPU: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    fflush(stderr);
    abort();
}

std::recursive_mutex big_lock;  // one caller at a time: the state below is shared
thread_local unsigned long long api_calls;  // this thread's calls into the simulation (FAKE_GPU_COUNTS)
struct Guard {
    std::lock_guard<std::recursive_mutex> held;
    explicit Guard(std::recursive_mutex &lock) : held(lock) { api_calls++; }
};

double now_seconds() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// ------------------------------------------------------------------ counts (FAKE_GPU_COUNTS)

struct Counts {
    long waits = 0, other_thread_waits = 0, launches = 0, copies = 0;
    std::map<std::string, long> wait_kinds;  // what the main thread waited in
    std::vector<std::string> launched;       // what it launched, in order
};
Counts current_counts;                   // since the last step mark
std::vector<Counts> counted_windows;     // [0]: before the first mark; then one per step
int counts_rank = -1;
// The last query of the main thread: its stream or event, whether that was unfinished, its call.
const void *queried;
bool queried_unfinished, counted_loop;
unsigned long long queried_at;

bool on_main_thread() { return syscall(SYS_gettid) == getpid(); }

int active_captures;  // streams being captured into a graph (cudaStreamBeginCapture)

void count_wait(const char *kind) {
    // Nothing may wait for the GPU while this thread captures a stream (cudaStreamCaptureModeThreadLocal):
    // CUDA refuses it (cudaErrorStreamCaptureUnsupported), so a graph never holds a wait's side effects.
    if (active_captures > 0 && on_main_thread())
        fail("%s while a stream is captured into a CUDA graph: CUDA refuses it (cudaErrorStreamCaptureUnsupported)", kind);
    if (!on_main_thread()) {
        current_counts.other_thread_waits++;
        return;
    }
    current_counts.waits++;
    current_counts.wait_kinds[kind]++;
}

// A polling loop is a query that finds the work unfinished followed at once (no other call in
// between) by another query of the same stream or event: one wait, however long it spins. A query
// alone (a probe: is it done yet?) is no wait.
void count_query(const void *object, bool ready, const char *kind) {
    if (!on_main_thread()) return;
    bool loop = queried == object && queried_unfinished && queried_at + 1 == api_calls;
    if (loop && !counted_loop) count_wait(kind);
    counted_loop = loop;
    queried = object;
    queried_unfinished = !ready;
    queried_at = api_calls;
}

// While a stream is captured its work is recorded, not launched: a graph's launch counts once.
void count_launch(const char *what) {
    if (active_captures > 0) return;
    current_counts.launches++;
    if (on_main_thread()) current_counts.launched.push_back(what);
}
void count_copy() { current_counts.copies += active_captures == 0; }

void write_counts_line(FILE *f, const char *label, const Counts &c) {
    fprintf(f, "%s: waits %ld launches %ld copies %ld other_thread_waits %ld", label, c.waits, c.launches, c.copies,
            c.other_thread_waits);
    for (const auto &kind : c.wait_kinds) fprintf(f, " [%s x%ld]", kind.first.c_str(), kind.second);
    fprintf(f, "\n");
    if (c.launched.empty()) return;
    fprintf(f, "  launched:");  // (a line of its own: step_counts.sh reads the lines above)
    for (size_t i = 0; i < c.launched.size(); i++) fprintf(f, "%s %s", i ? "," : "", c.launched[i].c_str());
    fprintf(f, "\n");
}

// At exit: FILE.<rank>, one line before the first mark ("setup"), one per step
// (step 1: from the first mark to the second), one after the last ("after").
void write_counts() {
    const char *path = getenv("FAKE_GPU_COUNTS");
    if (!path || !*path || counted_windows.empty()) return;
    std::string name = std::string(path) + "." + std::to_string(counts_rank < 0 ? 0 : counts_rank);
    FILE *f = fopen(name.c_str(), "w");
    if (!f) {
        fprintf(stderr, "fake GPU: cannot write FAKE_GPU_COUNTS to %s: %s\n", name.c_str(), strerror(errno));
        return;
    }
    fprintf(f, "# fake GPU counts of rank %d's main thread: per training step, between two step marks\n",
            counts_rank < 0 ? 0 : counts_rank);
    write_counts_line(f, "setup", counted_windows[0]);
    for (size_t i = 1; i < counted_windows.size(); i++) {
        char label[32];
        snprintf(label, sizeof label, "step %zu", i);
        write_counts_line(f, label, counted_windows[i]);
    }
    write_counts_line(f, "after", current_counts);
    fclose(f);
}

// ------------------------------------------------------------------ memory

// Device memory: one reserved range, allocated from the bottom; readable and
// writable only inside a Window.
const size_t ARENA_BYTES = (size_t)1 << 38, PAGE = 4096, ALIGN = 256;
char *arena;
size_t arena_top;                             // bytes handed out so far (page-rounded when protected)
std::map<const char *, size_t> device_blocks;  // start -> bytes asked for, live
std::map<const char *, size_t> capacities;     // start -> bytes reserved (256-byte multiples)
std::multimap<size_t, char *> free_blocks;     // bytes -> start, for reuse
std::map<const char *, size_t> pinned_blocks;  // cudaMallocHost's
int window_depth;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void protect(int protection) {
    if (arena_top && mprotect(arena, round_up(arena_top, PAGE), protection) != 0) fail("mprotect: %s", strerror(errno));
}

// While one is alive, the arena is readable and writable (device code runs).
struct Window {
    Window() {
        if (window_depth++ == 0) protect(PROT_READ | PROT_WRITE);
    }
    ~Window() {
        if (--window_depth == 0) protect(PROT_NONE);
    }
};

void reserve_arena() {
    if (arena) return;
    void *p = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("cannot reserve %zu GB of address space: %s", ARENA_BYTES >> 30, strerror(errno));
    arena = (char *)p;
}

bool in_arena(const void *p) { return arena && (const char *)p >= arena && (const char *)p < arena + ARENA_BYTES; }

// The live block of `blocks` that holds [p, p + bytes), or NULL.
const char *block_holding(const std::map<const char *, size_t> &blocks, const void *p, size_t bytes) {
    auto it = blocks.upper_bound((const char *)p);
    if (it == blocks.begin()) return NULL;
    --it;
    const char *start = it->first, *q = (const char *)p;
    return q >= start && q + bytes <= start + it->second ? start : NULL;
}

bool is_device(const void *p, size_t bytes) { return block_holding(device_blocks, p, bytes ? bytes : 1) != NULL; }
bool is_pinned(const void *p, size_t bytes) { return block_holding(pinned_blocks, p, bytes ? bytes : 1) != NULL; }

void require_device(const void *p, size_t bytes, const char *what) {
    if (!is_device(p, bytes))
        fail("%s: %p (%zu bytes) is not inside one block of device memory%s", what, p, bytes,
             in_arena(p) ? " (it runs past the end of its block, or the block was freed)" : " (it is host memory)");
}

void require_host(const void *p, size_t bytes, const char *what) {
    if (in_arena(p)) fail("%s: %p (%zu bytes) is device memory where host memory was asked for", what, p, bytes);
}

void poison(void *p, size_t bytes) {
    Window open;
    memset(p, 0xFF, bytes);  // NaN in every float
}

// ------------------------------------------------------------------ streams and events

}  // namespace

// A stream's operation: `run`, once `ready` says it can (always, where it is
// empty). Not ready: an NCCL operation whose peers have not all joined it, or
// a wait for another stream; asked again at the next query or wait.
struct Operation {
    std::function<bool()> ready;
    std::function<void()> run;
};

// A CUDA graph as captured (cudaStreamBeginCapture to cudaStreamEndCapture): the operations, not
// run, each on its branch. Branch 0 is the stream the capture began on; another stream becomes a
// branch when it waits for an event recorded in the capture (a fork), and a branch's operations
// after such a wait depend on the waited-for branch up to the event (a captured wait: `after`).
// Each cudaGraphLaunch of its instance queues copies of them, branch 0's on the launch stream and
// each other branch's on a stream of the instance's own, where they run as other work does (a
// kernel's arguments and a copy's pointers as captured, the memory's contents as they are when
// the graph runs, as in CUDA).
struct CapturedOperation {
    int branch;
    Operation op;        // none where this is a captured wait
    int after = -1;      // a captured wait: for branch `after` ...
    unsigned long long position = 0;  // ... to have run this many of its operations
};
struct CUstream_st;
struct CUgraph_st {
    std::vector<CapturedOperation> operations;
    std::vector<unsigned long long> length;  // per branch: its operations so far
    std::vector<unsigned long long> joined;  // per branch: how far another branch has waited for it
    std::vector<CUstream_st *> members;      // the streams captured into it, by branch (while capturing)
    unsigned long long id;                   // this capture's, never reused (open_captures)
    bool nccl = false;                       // it holds NCCL operations
};
struct CUgraphExec_st {
    std::vector<CapturedOperation> operations;
    std::vector<CUstream_st *> branch_streams;  // [0] unused: branch 0 runs on the launch stream
    bool nccl;
};

struct CUstream_st {
    std::deque<Operation> pending;
    unsigned long long queued = 0, done = 0;  // operations ever queued, and run
    bool blocking = true;                     // synchronises with the legacy default stream
    CUgraph_st *capture = nullptr;            // being captured into it: its operations go there
    int branch = 0;                           // ... as this branch
};

struct CUevent_st {
    CUstream_st *stream = nullptr;  // where it was last recorded outside a capture (nullptr: complete)
    unsigned long long position = 0;
    // When it completed: each record's own cell, which its marker writes (a marker still queued
    // from an earlier record writes that record's, never a destroyed event's).
    std::shared_ptr<double> seconds = std::make_shared<double>(0.0);
    // Recorded inside a capture (0: not), at branch_position of branch: a place in the graph.
    unsigned long long capture_id = 0, branch_position = 0;
    int branch = 0;
};

namespace {

CUstream_st legacy_stream;  // stream 0: runs at once, after every blocking stream
std::vector<CUstream_st *> streams;

CUstream_st *stream_of(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &legacy_stream;
    return s;
}

// Runs s's operations up to `position` as far as they can go now, and says
// whether it got there: what a GPU does meanwhile, the host not waiting.
bool advance(CUstream_st *s, unsigned long long position) {
    std::unique_ptr<Window> open;  // once for the lot, and only if something runs: each mprotect
                                   // of the arena costs up to a millisecond, and polls come often
    while (s->done < position) {
        Operation &op = s->pending.front();
        if (op.ready && !op.ready()) return false;  // it waits (and everything behind it)
        if (!open) open = std::make_unique<Window>();
        if (op.run) op.run();
        s->pending.pop_front();
        s->done++;
    }
    return true;
}

// The host blocks until s has run up to `position`, as in a blocking CUDA call.
// Behind an NCCL operation that a lost peer never joins, that is for good, as
// on a GPU: only the polling waits of common/runtime/device.c get out (by their limit).
void run_until(CUstream_st *s, unsigned long long position) {
    double started = 0;
    bool said = false;
    while (!advance(s, position)) {
        if (started == 0) started = now_seconds();
        if (!said && now_seconds() - started > 30) {
            fprintf(stderr, "fake GPU: a blocking CUDA call has waited 30 s for an NCCL operation that a peer never "
                            "joined: on a GPU it would wait for good\n");
            said = true;
        }
        sched_yield();
    }
}

void run_all(CUstream_st *s) { run_until(s, s->queued); }

void run_blocking_streams() {
    for (CUstream_st *s : streams)
        if (s->blocking) run_all(s);
}

void run_every_stream() {
    for (CUstream_st *s : streams) run_all(s);
}

// Queues op on s; on the legacy default stream it runs now, after the blocking streams.
void enqueue_operation(cudaStream_t stream, Operation op) {
    CUstream_st *s = stream_of(stream);
    if (s->capture) {
        s->capture->operations.push_back(CapturedOperation{s->branch, std::move(op)});
        s->capture->length[(size_t)s->branch]++;
        return;
    }
    if (s == &legacy_stream) {
        run_blocking_streams();
        while (op.ready && !op.ready()) sched_yield();
        if (op.run) op.run();
        return;
    }
    s->pending.push_back(std::move(op));
    s->queued++;
}

// The same for an operation that is always ready (a kernel, a copy, a GEMM).
void enqueue(cudaStream_t stream, std::function<void()> work) { enqueue_operation(stream, Operation{{}, std::move(work)}); }

bool event_complete(const CUevent_st *e) { return !e->stream || e->stream->done >= e->position; }

// The captures under way, by id: an event recorded in one names it by id, so that an event from a
// capture that has ended (its graph perhaps freed, its address reused) is known as such.
std::map<unsigned long long, CUgraph_st *> open_captures;
unsigned long long next_capture_id = 1;

// An event recorded inside a capture marks a place in the graph, not on a timeline: CUDA refuses
// to query it, wait for it on the host, or time it.
void require_not_captured(const CUevent_st *e, const char *call) {
    if (e->capture_id)
        fail("%s of an event recorded inside a stream capture: it marks a place in the graph, and CUDA refuses it "
             "(record it again outside the capture)", call);
}

// ------------------------------------------------------------------ devices

int current_device;

int device_count() {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    const char *count = getenv("FAKE_GPU_COUNT");
    int n = count && *count ? atoi(count) : 1;
    if (visible) {
        int listed = *visible ? 1 : 0;
        for (const char *c = visible; *c; c++) listed += *c == ',';
        if (listed < n) n = listed;
    }
    return n;
}

// ------------------------------------------------------------------ kernels

// Up to 1024 threads of one block, as fibers: each runs until __syncthreads
// or its end, in turn. makecontext gives each its stack and swapcontext starts
// it; after that they switch with _setjmp/_longjmp, which, unlike swapcontext,
// make no system call (a kernel with barriers switches 10^4 times a launch).
const size_t FIBER_STACK = 64 * 1024;
struct Fibers {
    ucontext_t start;
    jmp_buf scheduler;
    std::vector<ucontext_t> contexts;
    struct Resume {
        jmp_buf at;
    };
    std::vector<Resume> resume;  // where each fiber waits at its barrier
    std::vector<char> started, done;
    char *stacks = nullptr;
    size_t n_stacks = 0;
    const std::function<void()> *thread = nullptr;
    int current = -1;
} fibers;

void fiber_main() {
    (*fibers.thread)();
    fibers.done[fibers.current] = 1;
    _longjmp(fibers.scheduler, 1);
}

void run_block_as_fibers(const std::function<void()> &thread, dim3 block) {
    size_t n = (size_t)block.x * block.y * block.z;
    if (n > fibers.n_stacks) {
        if (fibers.stacks) munmap(fibers.stacks, fibers.n_stacks * FIBER_STACK);
        void *p = mmap(NULL, n * FIBER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) fail("cannot map %zu fiber stacks: %s", n, strerror(errno));
        fibers.stacks = (char *)p;
        fibers.n_stacks = n;
    }
    fibers.contexts.resize(n);
    fibers.resume.resize(n);
    fibers.started.assign(n, 0);
    fibers.done.assign(n, 0);
    fibers.thread = &thread;
    for (size_t remaining = n; remaining > 0;) {  // one round: every thread to its next barrier
        size_t finished = 0;
        for (size_t t = 0; t < n; t++) {
            if (fibers.done[t]) continue;
            threadIdx = dim3((unsigned)(t % block.x), (unsigned)(t / block.x % block.y), (unsigned)(t / block.x / block.y));
            fibers.current = (int)t;
            if (_setjmp(fibers.scheduler) == 0) {
                if (fibers.started[t]) _longjmp(fibers.resume[t].at, 1);
                fibers.started[t] = 1;
                ucontext_t &c = fibers.contexts[t];
                getcontext(&c);
                c.uc_stack.ss_sp = fibers.stacks + t * FIBER_STACK;
                c.uc_stack.ss_size = FIBER_STACK;
                c.uc_link = NULL;  // fiber_main never returns: it jumps back here
                makecontext(&c, fiber_main, 0);
                swapcontext(&fibers.start, &c);
            }
            finished += fibers.done[t];
        }
        if (finished && finished != remaining)
            fail("a kernel's block left %zu threads at a __syncthreads that %zu others never reached", remaining - finished,
                 finished);
        remaining -= finished;
    }
    fibers.current = -1;
}

void run_grid(const std::function<void()> &thread, bool synced, dim3 grid, dim3 block) {
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                if (synced) {
                    run_block_as_fibers(thread, block);
                    continue;
                }
                for (unsigned tz = 0; tz < block.z; tz++)
                    for (unsigned ty = 0; ty < block.y; ty++)
                        for (unsigned tx = 0; tx < block.x; tx++) {
                            threadIdx = dim3(tx, ty, tz);
                            thread();
                        }
            }
}

cudaError_t last_error = cudaSuccess;

}  // namespace

void __syncthreads() {
    if (fibers.current < 0) fail("__syncthreads in a kernel launched without fibers (tests/fake_gpu/nvcc missed it)");
    if (_setjmp(fibers.resume[fibers.current].at) == 0) _longjmp(fibers.scheduler, 1);
}

namespace fake_gpu {

void check_kernel_pointer(const char *kernel, int argument, const void *p) {
    Guard guard(big_lock);
    if (p && !is_device(p, 1) && !is_pinned(p, 1))
        fail("kernel %s: argument %d (%p) is neither device memory nor page-locked host memory", kernel, argument, p);
}

void launch(const char *kernel, bool synced, dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> thread) {
    Guard guard(big_lock);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
        (size_t)block.x * block.y * block.z > 1024 || grid.y > 65535 || grid.z > 65535) {
        fail("kernel %s: launch of grid (%u, %u, %u) x block (%u, %u, %u) is invalid", kernel, grid.x, grid.y, grid.z,
             block.x, block.y, block.z);
    }
    count_launch(kernel);
    enqueue(stream, [thread, synced, grid, block] {
        Window open;
        run_grid(thread, synced, grid, block);
    });
}

}  // namespace fake_gpu

// ================================================================== the CUDA runtime
extern "C" {

// device_mark_step(): a training step has been queued (common/runtime/device.h).
void fake_gpu_step_boundary(void) {
    Guard guard(big_lock);
    if (counted_windows.empty()) {
        int initialized = 0, finalized = 0;
        MPI_Initialized(&initialized);
        MPI_Finalized(&finalized);
        if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &counts_rank);
        atexit(write_counts);
    }
    counted_windows.push_back(current_counts);
    current_counts = Counts();
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = device_count();
    return *count ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return last_error = cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device) {
    if (device < 0 || device >= device_count()) return last_error = cudaErrorInvalidDevice;
    snprintf(bus_id, (size_t)len, "0000:%02X:00.0", device + 1);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device < 0 || device >= device_count()) return last_error = cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "fake GPU %d, the CPU", device);
    prop->totalGlobalMem = (size_t)16 << 30;
    prop->major = 9;
    prop->multiProcessorCount = 1;
    prop->maxThreadsPerBlock = 1024;
    prop->pciBusID = device + 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    Guard guard(big_lock);
    count_wait("cudaDeviceSynchronize");
    run_every_stream();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t error = last_error;
    last_error = cudaSuccess;
    return error;
}

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "fake GPU: an error it does not name";
    }
}

// ------------------------------------------------------------------ memory

cudaError_t cudaMalloc(void **p, size_t bytes) {
    Guard guard(big_lock);
    reserve_arena();
    count_wait("cudaMalloc");
    size_t size = round_up(bytes ? bytes : 1, ALIGN);
    char *block = NULL;
    auto reuse = free_blocks.lower_bound(size);
    if (reuse != free_blocks.end() && reuse->first <= 2 * size) {
        block = reuse->second;
        size = reuse->first;
        free_blocks.erase(reuse);
    } else {
        if (arena_top + size > ARENA_BYTES) return last_error = cudaErrorMemoryAllocation;
        block = arena + arena_top;
        arena_top += size;  // reserved as PROT_NONE: only an open window needs the new pages opened
        if (window_depth) protect(PROT_READ | PROT_WRITE);
    }
    device_blocks[block] = bytes ? bytes : 1;  // the checks hold a copy to the bytes asked for
    capacities[block] = size;
    poison(block, size);
    *p = block;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    Guard guard(big_lock);
    if (!p) return cudaSuccess;
    count_wait("cudaFree");
    run_every_stream();  // cudaFree waits for the device
    auto it = device_blocks.find((const char *)p);
    if (it == device_blocks.end()) fail("cudaFree(%p): not the start of a live block of device memory", p);
    size_t size = capacities[(const char *)p];
    poison(p, size);  // a use after the free reads NaN
    free_blocks.emplace(size, (char *)p);
    device_blocks.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    Guard guard(big_lock);
    count_wait("cudaMallocHost");
    void *block = NULL;
    if (posix_memalign(&block, PAGE, round_up(bytes ? bytes : 1, PAGE)) != 0) return last_error = cudaErrorMemoryAllocation;
    memset(block, 0xFF, bytes);
    pinned_blocks[(const char *)block] = bytes ? bytes : 1;
    *p = block;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    Guard guard(big_lock);
    if (!p) return cudaSuccess;
    count_wait("cudaFreeHost");
    run_every_stream();
    if (!pinned_blocks.erase((const char *)p)) fail("cudaFreeHost(%p): not from cudaMallocHost", p);
    free(p);
    return cudaSuccess;
}

}  // extern "C"

namespace {

// The copy's kind, checked against where its pointers are.
cudaMemcpyKind checked_kind(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *call) {
    if (kind == cudaMemcpyDefault)
        kind = in_arena(dst) ? (in_arena(src) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                             : (in_arena(src) ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    char what[96];
    snprintf(what, sizeof what, "%s's destination", call);
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) require_device(dst, bytes, what);
    else require_host(dst, bytes, what);
    snprintf(what, sizeof what, "%s's source", call);
    if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) require_device(src, bytes, what);
    else require_host(src, bytes, what);
    return kind;
}

void copy_now(void *dst, const void *src, size_t bytes) {
    Window open;
    memmove(dst, src, bytes);
}

}  // namespace

extern "C" {

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    Guard guard(big_lock);
    if (!bytes) return cudaSuccess;
    checked_kind(dst, src, bytes, kind, "cudaMemcpy");
    count_wait("cudaMemcpy");
    run_blocking_streams();  // the legacy default stream's copy
    copy_now(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
    Guard guard(big_lock);
    if (!bytes) return cudaSuccess;
    kind = checked_kind(dst, src, bytes, kind, "cudaMemcpyAsync");
    if (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, bytes)) {
        // Into pageable memory the call returns when the copy is done.
        count_wait("cudaMemcpyAsync to pageable memory");
        CUstream_st *s = stream_of(stream);
        if (s == &legacy_stream) run_blocking_streams();
        else run_all(s);
        copy_now(dst, src, bytes);
    } else if (kind == cudaMemcpyHostToDevice && !is_pinned(src, bytes)) {
        // From pageable memory the source is staged before the call returns (the driver may
        // wait for the stream to stage it: CUDA's "API synchronization behavior").
        count_wait("cudaMemcpyAsync from pageable memory");
        count_copy();
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
        enqueue(stream, [dst, staged] { copy_now(dst, staged->data(), staged->size()); });
    } else {
        count_copy();
        enqueue(stream, [dst, src, bytes] { copy_now(dst, src, bytes); });
    }
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
    Guard guard(big_lock);
    if (!bytes) return cudaSuccess;
    require_device(p, bytes, "cudaMemsetAsync");
    count_copy();
    enqueue(stream, [p, value, bytes] {
        Window open;
        memset(p, value, bytes);
    });
    return cudaSuccess;
}

// ------------------------------------------------------------------ streams and events

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    Guard guard(big_lock);
    CUstream_st *s = new CUstream_st;
    s->blocking = !(flags & cudaStreamNonBlocking);
    streams.push_back(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    Guard guard(big_lock);
    CUstream_st *s = stream_of(stream);
    if (s == &legacy_stream) return last_error = cudaErrorInvalidValue;
    run_all(s);  // its queued work still runs
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) streams.erase(streams.begin() + (long)i);
    // Not deleted: an event recorded on it may outlive it (legal in CUDA; step 11
    // destroys its copy stream before the events), and the event points here.
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    Guard guard(big_lock);
    count_wait("cudaStreamSynchronize");
    CUstream_st *s = stream_of(stream);
    if (s == &legacy_stream) run_blocking_streams();
    else run_all(s);
    return cudaSuccess;
}

// Not ready while work is queued; the query lets it run, so a polling loop ends.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    Guard guard(big_lock);
    CUstream_st *s = stream_of(stream);
    if (s->capture) fail("cudaStreamQuery of a stream being captured into a CUDA graph: CUDA refuses it");
    count_query(s, s->done == s->queued, "a cudaStreamQuery loop");
    if (s->done == s->queued) return cudaSuccess;
    advance(s, s->queued);
    return cudaErrorNotReady;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    *event = new CUevent_st;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(event);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    Guard guard(big_lock);
    if (!event_complete(event)) run_until(event->stream, event->position);  // as some drivers do
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    Guard guard(big_lock);
    CUstream_st *s = stream_of(stream);
    if (s->capture) {  // a place in the graph, for captured waits (a fork, a join): nothing is queued
        event->capture_id = s->capture->id;
        event->branch = s->branch;
        event->branch_position = s->capture->length[(size_t)s->branch];
        return cudaSuccess;
    }
    event->capture_id = 0;
    event->seconds = std::make_shared<double>(0.0);
    if (s == &legacy_stream) {
        run_blocking_streams();
        event->stream = nullptr;
        *event->seconds = now_seconds();
        return cudaSuccess;
    }
    std::shared_ptr<double> cell = event->seconds;
    enqueue(stream, [cell] { *cell = now_seconds(); });
    event->stream = s;
    event->position = s->queued;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    Guard guard(big_lock);
    require_not_captured(event, "cudaEventQuery");
    count_query(event, event_complete(event), "a cudaEventQuery loop");
    if (event_complete(event)) return cudaSuccess;
    advance(event->stream, event->position);
    return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    Guard guard(big_lock);
    require_not_captured(event, "cudaEventSynchronize");
    count_wait("cudaEventSynchronize");
    if (!event_complete(event)) run_until(event->stream, event->position);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    Guard guard(big_lock);
    require_not_captured(start, "cudaEventElapsedTime");
    require_not_captured(end, "cudaEventElapsedTime");
    if (!event_complete(start) || !event_complete(end)) return last_error = cudaErrorNotReady;
    *ms = (float)((*end->seconds - *start->seconds) * 1e3);
    return cudaSuccess;
}

// The stream's later work waits for the event's stream up to the event. For an event recorded in a
// capture the wait is captured, and a stream not yet captured joins the capture as a new branch.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    Guard guard(big_lock);
    (void)flags;
    CUstream_st *s = stream_of(stream);
    if (event->capture_id) {
        auto open = open_captures.find(event->capture_id);
        if (open == open_captures.end())
            fail("cudaStreamWaitEvent for an event recorded in a capture that has ended: CUDA refuses it");
        CUgraph_st *g = open->second;
        if (s->capture && s->capture != g) fail("cudaStreamWaitEvent joins two captures: CUDA refuses it");
        if (s == &legacy_stream) fail("cudaStreamWaitEvent: the legacy default stream cannot join a capture");
        if (!s->capture) {  // a fork: s is captured from here, as a branch of its own
            s->capture = g;
            s->branch = (int)g->length.size();
            g->length.push_back(0);
            g->joined.push_back(0);
            g->members.push_back(s);
            active_captures++;
        }
        if (s->branch == event->branch) return cudaSuccess;  // its own earlier work: already before it
        g->operations.push_back(CapturedOperation{s->branch, Operation{}, event->branch, event->branch_position});
        g->length[(size_t)s->branch]++;
        g->joined[(size_t)event->branch] = std::max(g->joined[(size_t)event->branch], event->branch_position);
        return cudaSuccess;
    }
    if (s->capture)
        fail("cudaStreamWaitEvent: a stream being captured waits for an event recorded outside its capture: CUDA "
             "refuses it (cudaErrorStreamCaptureIsolation)");
    if (event_complete(event)) return cudaSuccess;
    CUstream_st *other = event->stream;
    unsigned long long position = event->position;
    enqueue_operation(stream, Operation{[other, position] { return advance(other, position); }, {}});
    return cudaSuccess;
}

// ------------------------------------------------------------------ graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    Guard guard(big_lock);
    (void)mode;
    CUstream_st *s = stream_of(stream);
    if (s == &legacy_stream) return last_error = cudaErrorStreamCaptureUnsupported;
    if (s->capture) return last_error = cudaErrorIllegalState;
    s->capture = new CUgraph_st;
    s->capture->length = {0};
    s->capture->joined = {0};
    s->capture->members = {s};
    s->capture->id = next_capture_id++;
    open_captures[s->capture->id] = s->capture;
    s->branch = 0;
    active_captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    Guard guard(big_lock);
    CUstream_st *s = stream_of(stream);
    if (!s->capture || s->branch != 0) return last_error = cudaErrorIllegalState;  // ended where it began
    CUgraph_st *g = s->capture;
    // Every forked stream joined back: its last operation waited for by another branch (CUDA:
    // cudaErrorStreamCaptureUnjoined, and the capture is lost).
    for (size_t b = 1; b < g->length.size(); b++)
        if (g->joined[b] < g->length[b])
            fail("cudaStreamEndCapture: a stream forked into the capture (branch %zu) was not joined back to the one "
                 "the capture began on: CUDA refuses it (cudaErrorStreamCaptureUnjoined)", b);
    for (CUstream_st *member : g->members) {
        member->capture = nullptr;
        member->branch = 0;
        active_captures--;
    }
    g->members.clear();
    open_captures.erase(g->id);
    // FAKE_GPU_REFUSE_GRAPHS=1: the capture ends refused, as CUDA ends one that held an operation it
    // could not capture (an NCCL too old for graphs, say): what the program says then.
    const char *refuse = getenv("FAKE_GPU_REFUSE_GRAPHS");
    if (refuse && strcmp(refuse, "1") == 0) {
        *graph = nullptr;
        return last_error = cudaErrorStreamCaptureInvalidated;
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
    Guard guard(big_lock);
    *status = stream_of(stream)->capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    Guard guard(big_lock);
    (void)flags;
    CUgraphExec_st *e = new CUgraphExec_st{graph->operations, {nullptr}, graph->nccl};
    for (size_t b = 1; b < graph->length.size(); b++) {  // a stream for each forked branch, as a GPU's graph
        CUstream_st *s = new CUstream_st;                // runs its branches side by side
        s->blocking = false;
        streams.push_back(s);
        e->branch_streams.push_back(s);
    }
    *exec = e;
    return cudaSuccess;
}

// Branch 0's operations on the launch stream, the others' on the instance's streams; a captured
// wait becomes a wait for the other branch's stream up to the captured place, in this launch.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    Guard guard(big_lock);
    CUstream_st *launch_stream = stream_of(stream);
    if (launch_stream->capture) fail("cudaGraphLaunch into a stream being captured: not simulated");
    if (launch_stream == &legacy_stream) fail("cudaGraphLaunch on the legacy default stream: not simulated");
    count_launch("cudaGraphLaunch");  // the graph's kernels, copies, GEMMs and NCCL operations: one launch
    std::vector<CUstream_st *> where = exec->branch_streams;
    where[0] = launch_stream;
    std::vector<unsigned long long> base;
    for (CUstream_st *s : where) base.push_back(s->queued);
    for (const CapturedOperation &c : exec->operations) {
        if (c.after < 0) {
            enqueue_operation(where[(size_t)c.branch], c.op);
            continue;
        }
        CUstream_st *other = where[(size_t)c.after];
        unsigned long long position = base[(size_t)c.after] + c.position;
        enqueue_operation(where[(size_t)c.branch], Operation{[other, position] { return advance(other, position); }, {}});
    }
    // A graph with NCCL operations: each branch as far as it goes now, as an eager NCCL call posts at
    // once, so that they are posted before the host's next call, whatever that is (another rank may
    // wait for them in a host MPI call).
    if (exec->nccl)
        for (CUstream_st *s : where) advance(s, s->queued);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    Guard guard(big_lock);
    for (size_t b = 1; b < exec->branch_streams.size(); b++) {
        CUstream_st *s = exec->branch_streams[b];
        run_all(s);  // (a launch's work still runs)
        for (size_t i = 0; i < streams.size(); i++)
            if (streams[i] == s) streams.erase(streams.begin() + (long)i);
        // Not deleted: a launch stream's captured wait may still name it (as cudaStreamDestroy).
    }
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

}  // extern "C"

// ================================================================== cuBLAS (column-major, as cuBLAS)
struct cublasContext {
    cudaStream_t stream = nullptr;
};

namespace {

// The bytes of a column-major rows x cols matrix with leading dimension ld.
size_t matrix_bytes(int rows, int cols, int ld) {
    return rows && cols ? ((size_t)ld * (cols - 1) + rows) * sizeof(float) : 0;
}

CBLAS_TRANSPOSE transpose_of(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    (void)handle, (void)mode;
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS's own words.
const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "fake GPU: a cuBLAS status it does not name";
    }
}

// C = a op(A) op(B) + b C, column-major, as cuBLAS computes it, when the stream runs it: with b 0,
// C is not read (a NaN there must not show); with k 0, C is only scaled by b.
static void run_sgemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float a, const float *A,
                      int lda, const float *B, int ldb, float b, float *C, int ldc) {
    if (b == 0.0f)
        for (int j = 0; j < n; j++) memset(C + (size_t)j * ldc, 0, (size_t)m * sizeof *C);
    if (m && n && k) cblas_sgemm(CblasColMajor, transpose_of(transa), transpose_of(transb), m, n, k, a, A, lda, B, ldb, b, C, ldc);
    else if (b != 1.0f && b != 0.0f)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) C[(size_t)j * ldc + i] *= b;
}

// cuBLAS's argument checks of a GEMM's sizes: none negative, each leading dimension at least its
// matrix's rows (and 1).
static bool sgemm_sizes_valid(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, int lda, int ldb,
                              int ldc) {
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    auto at_least = [](int rows) { return rows > 1 ? rows : 1; };
    return m >= 0 && n >= 0 && k >= 0 && lda >= at_least(ta ? k : m) && ldb >= at_least(tb ? n : k) && ldc >= at_least(m);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc) {
    Guard guard(big_lock);
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    if (!sgemm_sizes_valid(transa, transb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    if (k > 0) {
        require_device(A, matrix_bytes(ta ? k : m, ta ? m : k, lda), "cublasSgemm's A");
        require_device(B, matrix_bytes(tb ? n : k, tb ? k : n, ldb), "cublasSgemm's B");
    }
    require_device(C, matrix_bytes(m, n, ldc), "cublasSgemm's C");
    require_host(alpha, sizeof *alpha, "cublasSgemm's alpha");
    require_host(beta, sizeof *beta, "cublasSgemm's beta");
    float a = *alpha, b = *beta;
    count_launch("cublasSgemm");
    enqueue(handle->stream, [=] {
        Window open;
        run_sgemm(transa, transb, m, n, k, a, A, lda, B, ldb, b, C, ldc);
    });
    return CUBLAS_STATUS_SUCCESS;
}

// bfloat16 values (their bits, the upper half of a float's) as floats: exact.
static std::vector<float> widen_bfloat16(const uint16_t *half, size_t count) {
    std::vector<float> wide(count);
    for (size_t i = 0; i < count; i++) {
        uint32_t bits = (uint32_t)half[i] << 16;
        memcpy(&wide[i], &bits, sizeof bits);
    }
    return wide;
}

// The one mixed-precision GEMM the project calls (tensor.c's bfloat16 matmuls): A and B bfloat16, C
// float32, float32 sums. A bf16 x bf16 product is exact in float32, so the operands widened to float
// and cublasSgemm's GEMM compute what tensor cores do, up to the order of the sums. Other types stop
// the run: they are not simulated.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    Guard guard(big_lock);
    (void)algo;
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F)
        fail("cublasGemmEx: only bfloat16 A and B, float32 C and CUBLAS_COMPUTE_32F are simulated");
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    if (!sgemm_sizes_valid(transa, transb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    // The elements each operand spans, column-major (as matrix_bytes counts floats: half as many bytes).
    size_t a_count = matrix_bytes(ta ? k : m, ta ? m : k, lda) / sizeof(float);
    size_t b_count = matrix_bytes(tb ? n : k, tb ? k : n, ldb) / sizeof(float);
    if (k > 0) {
        require_device(A, a_count * sizeof(uint16_t), "cublasGemmEx's A");
        require_device(B, b_count * sizeof(uint16_t), "cublasGemmEx's B");
    }
    require_device(C, matrix_bytes(m, n, ldc), "cublasGemmEx's C");
    require_host(alpha, sizeof(float), "cublasGemmEx's alpha");
    require_host(beta, sizeof(float), "cublasGemmEx's beta");
    float a = *(const float *)alpha, b = *(const float *)beta;
    const uint16_t *A16 = (const uint16_t *)A, *B16 = (const uint16_t *)B;
    float *C32 = (float *)C;
    count_launch("cublasGemmEx");
    enqueue(handle->stream, [=] {
        Window open;
        std::vector<float> A32 = widen_bfloat16(A16, k > 0 ? a_count : 0), B32 = widen_bfloat16(B16, k > 0 ? b_count : 0);
        run_sgemm(transa, transb, m, n, k, a, A32.data(), lda, B32.data(), ldb, b, C32, ldc);
    });
    return CUBLAS_STATUS_SUCCESS;
}

// The batched GEMMs' checks and work, for either element type: batchCount GEMMs whose A, B and C
// are where the arrays (device memory, read when the GEMMs run) point; bfloat16 A and B are widened
// to float (exact) for the float32 GEMM, as cublasGemmEx's tensor cores sum in float32.
static cublasStatus_t batched_gemm(const char *name, bool bfloat16, cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k, const float *alpha,
                                   const void *const Aarray[], int lda, const void *const Barray[], int ldb,
                                   const float *beta, void *const Carray[], int ldc, int batchCount) {
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    if (!sgemm_sizes_valid(transa, transb, m, n, k, lda, ldb, ldc) || batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (batchCount == 0) return CUBLAS_STATUS_SUCCESS;
    std::string what = name;
    size_t arrays = (size_t)batchCount * sizeof(void *);
    require_device(Aarray, arrays, (what + "'s Aarray").c_str());
    require_device(Barray, arrays, (what + "'s Barray").c_str());
    require_device(Carray, arrays, (what + "'s Carray").c_str());
    require_host(alpha, sizeof *alpha, (what + "'s alpha").c_str());
    require_host(beta, sizeof *beta, (what + "'s beta").c_str());
    float a = *alpha, b = *beta;
    size_t element = bfloat16 ? sizeof(uint16_t) : sizeof(float);
    size_t a_count = matrix_bytes(ta ? k : m, ta ? m : k, lda) / sizeof(float);
    size_t b_count = matrix_bytes(tb ? n : k, tb ? k : n, ldb) / sizeof(float);
    std::string a_name = what + "'s A[i]", b_name = what + "'s B[i]", c_name = what + "'s C[i]";
    count_launch(name);
    enqueue(handle->stream, [=] {
        Window open;
        for (int i = 0; i < batchCount; i++) {
            const void *A_i = Aarray[i], *B_i = Barray[i];
            float *C_i = (float *)Carray[i];
            if (k > 0) {
                require_device(A_i, a_count * element, a_name.c_str());
                require_device(B_i, b_count * element, b_name.c_str());
            }
            require_device(C_i, matrix_bytes(m, n, ldc), c_name.c_str());
            if (!bfloat16) {
                run_sgemm(transa, transb, m, n, k, a, (const float *)A_i, lda, (const float *)B_i, ldb, b, C_i, ldc);
                continue;
            }
            std::vector<float> A32 = widen_bfloat16((const uint16_t *)A_i, k > 0 ? a_count : 0),
                               B32 = widen_bfloat16((const uint16_t *)B_i, k > 0 ? b_count : 0);
            run_sgemm(transa, transb, m, n, k, a, A32.data(), lda, B32.data(), ldb, b, C_i, ldc);
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

// cublasGemmEx's GEMM for each of batchCount matrices, where Aarray, Barray and Carray point.
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *const Aarray[], cudaDataType_t Atype,
                                   int lda, const void *const Barray[], cudaDataType_t Btype, int ldb, const void *beta,
                                   void *const Carray[], cudaDataType_t Ctype, int ldc, int batchCount,
                                   cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    Guard guard(big_lock);
    (void)algo;
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F)
        fail("cublasGemmBatchedEx: only bfloat16 A and B, float32 C and CUBLAS_COMPUTE_32F are simulated");
    return batched_gemm("cublasGemmBatchedEx", true, handle, transa, transb, m, n, k, (const float *)alpha, Aarray, lda,
                        Barray, ldb, (const float *)beta, Carray, ldc, batchCount);
}

// batchCount GEMMs, matrix i of A, B and C where pointer i of Aarray, Barray and Carray points, as
// cuBLAS's: the arrays are device memory, which a kernel may fill just before on the same stream,
// so they are read, and each matrix checked to be device memory, when the GEMMs run; each the GEMM
// above, one after the other (cuBLAS may run them side by side; they write disjoint C's).
cublasStatus_t cublasSgemmBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                  int n, int k, const float *alpha, const float *const Aarray[], int lda,
                                  const float *const Barray[], int ldb, const float *beta, float *const Carray[],
                                  int ldc, int batchCount) {
    Guard guard(big_lock);
    return batched_gemm("cublasSgemmBatched", false, handle, transa, transb, m, n, k, alpha, (const void *const *)Aarray,
                        lda, (const void *const *)Barray, ldb, beta, (void *const *)Carray, ldc, batchCount);
}

cublasStatus_t cublasSgemv_v2(cublasHandle_t handle, cublasOperation_t trans, int m, int n, const float *alpha,
                              const float *A, int lda, const float *x, int incx, const float *beta, float *y, int incy) {
    Guard guard(big_lock);
    if (m < 0 || n < 0 || incx == 0 || incy == 0 || lda < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    if (incx < 0 || incy < 0) fail("cublasSgemv with a negative increment is not simulated");
    bool t = trans != CUBLAS_OP_N;
    int len_x = t ? m : n, len_y = t ? n : m;
    require_device(A, matrix_bytes(m, n, lda), "cublasSgemv's A");
    if (len_x) require_device(x, ((size_t)(len_x - 1) * incx + 1) * sizeof *x, "cublasSgemv's x");
    if (len_y) require_device(y, ((size_t)(len_y - 1) * incy + 1) * sizeof *y, "cublasSgemv's y");
    float a = *alpha, b = *beta;
    count_launch("cublasSgemv");
    enqueue(handle->stream, [=] {
        Window open;
        if (b == 0.0f)
            for (int i = 0; i < len_y; i++) y[(size_t)i * incy] = 0.0f;
        if (m && n) cblas_sgemv(CblasColMajor, transpose_of(trans), m, n, a, A, lda, x, incx, b, y, incy);
    });
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

// ================================================================== NCCL, over MPI
struct ncclComm {
    MPI_Comm mpi;
    MPI_Comm agree = MPI_COMM_NULL;  // each operation's check that every rank ran it captured, or none did
    int rank, size;
    bool aborted = false;  // ncclCommAbort: what it had queued is dropped
};

namespace {

struct Datatype {
    MPI_Datatype mpi;
    size_t bytes;
};

Datatype datatype_of(ncclDataType_t type) {
    switch (type) {
    case ncclInt8: return {MPI_INT8_T, 1};
    case ncclUint8: return {MPI_UINT8_T, 1};
    case ncclInt32: return {MPI_INT32_T, 4};
    case ncclUint32: return {MPI_UINT32_T, 4};
    case ncclInt64: return {MPI_INT64_T, 8};
    case ncclUint64: return {MPI_UINT64_T, 8};
    case ncclFloat32: return {MPI_FLOAT, 4};
    case ncclFloat64: return {MPI_DOUBLE, 8};
    default: fail("NCCL datatype %d is not simulated", (int)type);
    }
}

MPI_Op op_of(ncclRedOp_t op) {
    switch (op) {
    case ncclSum: case ncclAvg: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: fail("NCCL reduction %d is not simulated", (int)op);
    }
}

void divide(void *buffer, size_t count, ncclDataType_t type, int by) {
    if (type == ncclFloat32)
        for (size_t i = 0; i < count; i++) ((float *)buffer)[i] /= (float)by;
    else if (type == ncclFloat64)
        for (size_t i = 0; i < count; i++) ((double *)buffer)[i] /= by;
    else fail("ncclAvg of an integer type is not simulated");
}

void check_mpi(int code, const char *call) {
    if (code != MPI_SUCCESS) fail("%s failed (MPI error %d)", call, code);
}

// One NCCL operation, as two operations of its stream. The first posts it:
// its input is read from device memory then (what the stream computed before
// it) and a nonblocking MPI call starts. The second completes it once every
// peer has posted its part (MPI_Test), and puts the result in place. Posting
// is tried at the call; where the stream still waits for earlier work, it
// happens when the stream gets there, as on a GPU. A peer that never posts
// (tests/lost_peer.c) leaves the operation, and all behind it, waiting.
struct Transfer {
    enum Kind { COLLECTIVE, SEND, RECV } kind;
    cudaStream_t stream;
    ncclComm_t comm;
    const void *send_buffer;  // device memory, or nullptr
    size_t send_bytes;
    void *recv_buffer;        // device memory, or nullptr: nothing lands on this rank
    size_t recv_bytes;
    int peer;                                                                    // SEND, RECV
    std::function<int(const void *input, void *result, MPI_Request *)> start;  // COLLECTIVE: MPI_I...
    std::function<void(void *result)> finish;                                   // ncclAvg's division, or none
    bool captured = false;  // queued by a CUDA graph's launch
};

// Each operation's launch is captured into a CUDA graph on every rank of its communicator, or on
// none (NCCL: a captured launch is a collective property, and so is a graph's launch). Beside the
// operation, a check on the communicator's twin: for a collective, the largest and the smallest
// flag over the ranks (an MPI_Iallreduce of {flag, -flag}); for a send, the flag to the receiver,
// which compares it with its own.
struct InFlight {
    std::vector<char> input, result;
    MPI_Request request = MPI_REQUEST_NULL, agree = MPI_REQUEST_NULL;
    int mine[2] = {0, 0}, theirs[2] = {0, 0};
};

int group_depth;
std::vector<Transfer> group;

void post(const Transfer &t, InFlight &f) {
    if (t.comm->aborted) return;
    f.mine[0] = t.captured, f.mine[1] = -(int)t.captured;
    if (t.kind == Transfer::SEND)
        check_mpi(MPI_Isend(f.mine, 1, MPI_INT, t.peer, 78, t.comm->agree, &f.agree), "ncclSend (MPI_Isend)");
    else if (t.kind == Transfer::RECV)
        check_mpi(MPI_Irecv(f.theirs, 1, MPI_INT, t.peer, 78, t.comm->agree, &f.agree), "ncclRecv (MPI_Irecv)");
    else
        check_mpi(MPI_Iallreduce(f.mine, f.theirs, 2, MPI_INT, MPI_MAX, t.comm->agree, &f.agree),
                  "an NCCL collective (MPI_Iallreduce)");
    if (t.send_buffer) {
        Window open;
        f.input.assign((const char *)t.send_buffer, (const char *)t.send_buffer + t.send_bytes);
    }
    f.result.resize(t.recv_bytes);
    if (t.kind == Transfer::SEND)
        check_mpi(MPI_Isend(f.input.data(), (int)t.send_bytes, MPI_BYTE, t.peer, 77, t.comm->mpi, &f.request),
                  "ncclSend (MPI_Isend)");
    else if (t.kind == Transfer::RECV)
        check_mpi(MPI_Irecv(f.result.data(), (int)t.recv_bytes, MPI_BYTE, t.peer, 77, t.comm->mpi, &f.request),
                  "ncclRecv (MPI_Irecv)");
    else
        check_mpi(t.start(f.input.data(), f.result.data(), &f.request), "an NCCL collective (its nonblocking MPI twin)");
}

// Every peer has joined: the MPI call is done (MPI_Test drives it on).
bool joined(const Transfer &t, InFlight &f) {
    if (t.comm->aborted) return true;
    int done = 0, agreed = 0;
    check_mpi(MPI_Test(&f.request, &done, MPI_STATUS_IGNORE), "an NCCL operation (MPI_Test)");
    check_mpi(MPI_Test(&f.agree, &agreed, MPI_STATUS_IGNORE), "an NCCL operation (MPI_Test)");
    return done && agreed;
}

void complete(const Transfer &t, InFlight &f) {
    if (t.comm->aborted) return;
    bool alike = t.kind == Transfer::SEND || (t.kind == Transfer::RECV ? f.theirs[0] == f.mine[0]
                                                                        : f.theirs[0] == -f.theirs[1]);
    if (!alike)
        fail("an NCCL %s launched from a CUDA graph on some ranks and eagerly on others (rank %d: %s): NCCL "
             "requires every rank of the communicator to capture it, and to launch the graph, alike",
             t.kind == Transfer::COLLECTIVE ? "collective" : "send/receive", t.comm->rank,
             t.captured ? "from the graph" : "eagerly");
    if (t.finish) t.finish(f.result.data());
    if (t.recv_buffer && !f.result.empty()) copy_now(t.recv_buffer, f.result.data(), f.result.size());
    f = InFlight();
}

// A group's operations: every post before any completion (a send may complete
// only once its peer's receive is posted), then as far as each stream goes now.
void queue_transfers(std::vector<Transfer> &transfers) {
    std::vector<std::shared_ptr<InFlight>> flights;
    for (Transfer &t : transfers) {
        auto f = std::make_shared<InFlight>();
        flights.push_back(f);
        enqueue_operation(t.stream, Operation{{}, [t, f] { post(t, *f); }});
    }
    for (size_t i = 0; i < transfers.size(); i++) {
        Transfer t = transfers[i];
        auto f = flights[i];
        enqueue_operation(t.stream, Operation{[t, f] { return joined(t, *f); }, [t, f] { complete(t, *f); }});
    }
    for (Transfer &t : transfers)
        if (!stream_of(t.stream)->capture) advance(stream_of(t.stream), stream_of(t.stream)->queued);
}

ncclResult_t submit(Transfer t) {
    Guard guard(big_lock);
    // (none while captured: the graph's launch counts)
    count_launch(t.kind == Transfer::COLLECTIVE ? "an NCCL collective" : t.kind == Transfer::SEND ? "ncclSend" : "ncclRecv");
    t.captured = stream_of(t.stream)->capture != nullptr;
    if (t.captured) stream_of(t.stream)->capture->nccl = true;
    group.push_back(std::move(t));
    if (group_depth == 0) {
        std::vector<Transfer> now;
        now.swap(group);
        queue_transfers(now);
    }
    return ncclSuccess;
}

void require_buffer(const void *p, size_t bytes, const char *what) {
    if (bytes) require_device(p, bytes, what);
}

// A collective: its MPI twin, nonblocking, from the staged input to the result.
Transfer collective(cudaStream_t stream, ncclComm_t comm, const void *send, size_t send_bytes, void *recv,
                    size_t recv_bytes, std::function<int(const void *, void *, MPI_Request *)> start,
                    std::function<void(void *)> finish = {}) {
    return Transfer{Transfer::COLLECTIVE, stream, comm, send, send_bytes, recv, recv_bytes, 0, std::move(start),
                    std::move(finish)};
}

std::function<void(void *)> average(ncclRedOp_t op, size_t count, ncclDataType_t type, int size) {
    if (op != ncclAvg) return {};
    return [=](void *result) { divide(result, count, type, size); };
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "fake GPU: an NCCL error";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "fake GPU NCCL id");
    return ncclSuccess;
}

// Every rank of MPI_COMM_WORLD, each on a GPU of its own, as NCCL demands.
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    Guard guard(big_lock);
    (void)id;
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (nranks != world || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    char host[256] = "";
    gethostname(host, sizeof host - 16);
    snprintf(host + strlen(host), 16, "#%d", current_device);
    std::vector<char> all((size_t)nranks * sizeof host);
    check_mpi(MPI_Allgather(host, sizeof host, MPI_CHAR, all.data(), sizeof host, MPI_CHAR, MPI_COMM_WORLD),
              "ncclCommInitRank (MPI_Allgather)");
    for (int r = 0; r < nranks; r++)
        if (r != rank && strcmp(&all[(size_t)r * sizeof host], host) == 0) {
            fprintf(stderr, "fake NCCL WARN Duplicate GPU detected: rank %d and rank %d both on CUDA device %d\n", rank, r,
                    current_device);
            return ncclInvalidUsage;
        }
    ncclComm *c = new ncclComm;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi), "ncclCommInitRank (MPI_Comm_dup)");
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c->agree), "ncclCommInitRank (MPI_Comm_dup)");
    c->rank = rank;
    c->size = nranks;
    *comm = c;
    return ncclSuccess;
}

// The ranks of `comm` that pass the same color, ordered by key: MPI_Comm_split.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    Guard guard(big_lock);
    (void)config;
    MPI_Comm split = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &split),
              "ncclCommSplit (MPI_Comm_split)");
    *newcomm = nullptr;
    if (split == MPI_COMM_NULL) return ncclSuccess;
    ncclComm *c = new ncclComm;
    c->mpi = split;
    check_mpi(MPI_Comm_dup(split, &c->agree), "ncclCommSplit (MPI_Comm_dup)");
    MPI_Comm_rank(split, &c->rank);
    MPI_Comm_size(split, &c->size);
    *newcomm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    Guard guard(big_lock);
    MPI_Comm_free(&comm->mpi);
    MPI_Comm_free(&comm->agree);
    delete comm;
    return ncclSuccess;
}

// What it had queued is dropped, as NCCL's abort stops the GPU's waiting
// kernels. (The communicator is kept: those operations still point to it;
// and MPI_Comm_free with MPI requests in flight is not ours to try.)
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    Guard guard(big_lock);
    comm->aborted = true;
    return ncclSuccess;
}

// Never an error, as NCCL on one node, which does not see a dead peer: the
// errors that NCCL reports across nodes are tests/lost_peer.c's to simulate.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
    (void)comm;
    *error = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    Guard guard(big_lock);
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    Guard guard(big_lock);
    if (group_depth == 0) return ncclInvalidUsage;
    if (--group_depth == 0) {
        std::vector<Transfer> now;
        now.swap(group);
        queue_transfers(now);
    }
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    Datatype d = datatype_of(type);
    size_t bytes = count * d.bytes;
    require_buffer(send, bytes, "ncclAllReduce's send buffer");
    require_buffer(recv, bytes, "ncclAllReduce's receive buffer");
    return submit(collective(stream, comm, send, bytes, recv, bytes,
                             [=](const void *in, void *out, MPI_Request *r) {
                                 return MPI_Iallreduce(in, out, (int)count, d.mpi, op_of(op), comm->mpi, r);
                             },
                             average(op, count, type, comm->size)));
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    Datatype d = datatype_of(type);
    size_t bytes = count * d.bytes;
    bool is_root = comm->rank == root;
    if (is_root) require_buffer(send, bytes, "ncclBroadcast's send buffer");
    require_buffer(recv, bytes, "ncclBroadcast's receive buffer");
    return submit(collective(stream, comm, is_root ? send : nullptr, is_root ? bytes : 0, recv, bytes,
                             [=](const void *in, void *out, MPI_Request *r) {
                                 if (is_root) memcpy(out, in, bytes);
                                 return MPI_Ibcast(out, (int)count, d.mpi, root, comm->mpi, r);
                             }));
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    Datatype d = datatype_of(type);
    size_t bytes = count * d.bytes;
    bool is_root = comm->rank == root;
    require_buffer(send, bytes, "ncclReduce's send buffer");
    if (is_root) require_buffer(recv, bytes, "ncclReduce's receive buffer");
    return submit(collective(stream, comm, send, bytes, is_root ? recv : nullptr, bytes,
                             [=](const void *in, void *out, MPI_Request *r) {
                                 return MPI_Ireduce(in, out, (int)count, d.mpi, op_of(op), root, comm->mpi, r);
                             },
                             is_root ? average(op, count, type, comm->size) : std::function<void(void *)>{}));
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    Datatype d = datatype_of(type);
    size_t bytes = count * d.bytes;
    require_buffer(send, bytes, "ncclAllGather's send buffer");
    require_buffer(recv, bytes * comm->size, "ncclAllGather's receive buffer");
    return submit(collective(stream, comm, send, bytes, recv, bytes * comm->size,
                             [=](const void *in, void *out, MPI_Request *r) {
                                 return MPI_Iallgather(in, (int)count, d.mpi, out, (int)count, d.mpi, comm->mpi, r);
                             }));
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    Datatype d = datatype_of(type);
    size_t bytes = count * d.bytes;
    require_buffer(send, bytes * comm->size, "ncclReduceScatter's send buffer");
    require_buffer(recv, bytes, "ncclReduceScatter's receive buffer");
    return submit(collective(stream, comm, send, bytes * comm->size, recv, bytes,
                             [=](const void *in, void *out, MPI_Request *r) {
                                 return MPI_Ireduce_scatter_block(in, out, (int)count, d.mpi, op_of(op), comm->mpi, r);
                             },
                             average(op, count, type, comm->size)));
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    Datatype d = datatype_of(type);
    require_buffer(send, count * d.bytes, "ncclSend's buffer");
    return submit(Transfer{Transfer::SEND, stream, comm, send, count * d.bytes, nullptr, 0, peer, {}, {}});
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    Datatype d = datatype_of(type);
    require_buffer(recv, count * d.bytes, "ncclRecv's buffer");
    return submit(Transfer{Transfer::RECV, stream, comm, nullptr, 0, recv, count * d.bytes, peer, {}, {}});
}

}  // extern "C"
