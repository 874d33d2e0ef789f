// threads.c: how many threads a rank computes with. See threads.h.
#include "runtime/threads.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/check.h"
#include "runtime/dist.h"
#include "runtime/memory_budget.h"  // memory_rlimit_room

static int g_threads = 1;
static int g_share = 1;  // cores / ranks on the node, when a CPU binding allowed fewer
static int g_cores = 1;  // the cores this rank may use
static bool g_room_capped;  // the default count met ulimit -v: fewer threads than cores (threads_that_fit)

// OpenBLAS reads OPENBLAS_NUM_THREADS when the library loads, before main(),
// so its count must be set through its API. Weak, so that another CBLAS
// (BLAS_LIBS=...) still links; give that one a single thread through its own
// variable (BLIS_NUM_THREADS=1, MKL_NUM_THREADS=1).
extern void openblas_set_num_threads(int) __attribute__((weak));
extern char *openblas_get_config(void) __attribute__((weak));
extern char *openblas_get_corename(void) __attribute__((weak));
#pragma weak cblas_sgemm  // linked by every program; weak, so that threads.o links without a BLAS too

// ------------------------------------------------------------------ how idle threads wait
//
// Between two parallel loops libgomp's idle threads spin, GOMP_SPINCOUNT
// times (300000 pauses, some milliseconds, unless the user says otherwise),
// before they sleep on a futex. A training step runs dozens of short loops, so
// on a quiet machine the spin saves a futex wake-up per loop. But a spinning
// thread holds its core: beside any other busy process (another rank, a build,
// a browser) the scheduler gives that core to the spinner while the thread
// that has work waits for it, and the whole team waits at the next barrier.
// We spin THREADS_SPIN_COUNT times instead, then sleep: long enough to bridge
// the gap between one loop of a step and the next, short enough to give the
// core back as soon as nothing comes. Measured in docs/speed.md ("Threads on a
// busy machine"); see threads.h.
#define THREADS_SPIN_COUNT "10000"

// libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, in its constructor.
// That runs before main() and before any constructor of ours (a library is
// initialised before the program that links it), so a setenv() from here is
// too late; one from .preinit_array, which runs earlier still, is undone when
// libc sets up the environment (glibc 2.36, tried). What libgomp does at that
// moment is ask getenv() for GOMP_SPINCOUNT (GCC 12 to 15 alike), and a
// program's own getenv() takes the place of libc's for every library it loads
// (the ELF rule that lets a program bring its own malloc). Ours is libc's for
// every name (the same search of `environ`), except that it answers
// GOMP_SPINCOUNT with our count when the user chose neither a spin count nor
// a wait policy: a user's choice is theirs to keep. The environment itself is
// untouched, so the processes we start see what the user set, not our choice.
static char *environment_value(const char *name) {
    extern char **environ;
    size_t length = strlen(name);
    for (char **entry = environ; entry && *entry; entry++)
        if (strncmp(*entry, name, length) == 0 && (*entry)[length] == '=') return *entry + length + 1;
    return NULL;
}

// OMP_WAIT_POLICY, or libgomp 13's OMP_WAIT_POLICY_ALL, _DEV and _DEV_<n>.
static bool wait_policy_set(void) {
    extern char **environ;
    static const char prefix[] = "OMP_WAIT_POLICY";
    size_t length = sizeof prefix - 1;
    for (char **entry = environ; entry && *entry; entry++)
        if (strncmp(*entry, prefix, length) == 0 && ((*entry)[length] == '=' || (*entry)[length] == '_')) return true;
    return false;
}

char *getenv(const char *name) {
    char *value = environment_value(name);
    if (!value && strcmp(name, "GOMP_SPINCOUNT") == 0 && !wait_policy_set()) value = (char *)THREADS_SPIN_COUNT;
    return value;
}

// ------------------------------------------------------------------ room for the threads' stacks and BLAS buffers
//
// Each thread libgomp starts maps a stack (OMP_STACKSIZE, else the default of
// new threads: RLIMIT_STACK's, 8 MiB on most systems), and each thread that
// calls the BLAS maps a work buffer of the BLAS's own on its first call:
// every thread of the team does, as each computes its slice of a GEMM with a
// one-threaded BLAS. OpenBLAS's is 128 MiB in 0.3.21 (Debian 12: one
// 134217728-byte mmap per thread under strace), 32 MiB in older versions.
// Under an address-space limit (ulimit -v, RLIMIT_AS) --threads 1024 asks
// for some 8 GB of stacks, and libgomp, failing to create one, prints its own
// message and exits mid-way; --threads 32 under 3 GB started, and as its
// threads met the BLAS at once their buffers took what the test set's
// evaluation then needed (a malloc failed, 1 run in 30 on a busy machine).
// So a --threads whose stacks and buffers cannot be mapped is refused first,
// as a flag, on every rank. Without a limit they are address space, not
// memory (a thread touches a few pages of each), and any count is let
// through, unmeasured.
static double thread_stack_bytes(void) {
    const char *omp = environment_value("OMP_STACKSIZE");
    if (omp && *omp) {  // a number and an optional unit: B, K (the default), M or G
        char *end;
        double v = strtod(omp, &end);
        while (*end == ' ') end++;
        double unit = *end == 'B' || *end == 'b' ? 1 : *end == 'M' || *end == 'm' ? 1 << 20
                    : *end == 'G' || *end == 'g' ? 1 << 30 : 1 << 10;
        if (v > 0) return v * unit;
    }
    pthread_attr_t attr;
    size_t size = 8 << 20;
    if (pthread_getattr_default_np(&attr) == 0) {
        pthread_attr_getstacksize(&attr, &size);
        pthread_attr_destroy(&attr);
    }
    return (double)size;
}

// What a thread's first BLAS call maps, measured: what the address-space limit leaves a new thread
// before and after a 1x1 GEMM (the thread's stack is mapped before it runs, so not counted).
// Whatever the library and its version map, this is it; 0 where the BLAS maps nothing per thread
// or is not linked. (Asked only under a limit: without one there is no room to measure.)
static void *first_blas_call(void *mapped) {
    float a = 1, b = 1, c = 0;
    double before = memory_rlimit_room(RLIMIT_AS);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    *(double *)mapped = fmax(0.0, before - memory_rlimit_room(RLIMIT_AS));
    return NULL;
}
static double blas_buffer_bytes(void) {
    double mapped = 0;
    pthread_t thread;
    if (!cblas_sgemm || pthread_create(&thread, NULL, first_blas_call, &mapped) != 0) return 0;
    pthread_join(thread, NULL);
    return mapped;
}

// What n threads take of the address space: n - 1 stacks (the calling thread has its own) and n
// BLAS buffers (every thread of the team calls the BLAS, the calling thread too).
typedef struct {
    double stack, buffer;  // bytes per thread
    double room;           // what the limit leaves this process; infinite without one
} ThreadRoom;
static ThreadRoom thread_room(void) {
    ThreadRoom r = {thread_stack_bytes(), 0, memory_rlimit_room(RLIMIT_AS)};
    if (!isinf(r.room)) r.buffer = blas_buffer_bytes();
    return r;
}
static double room_needed(ThreadRoom r, int threads) { return (threads - 1) * r.stack + threads * r.buffer; }

// Refuse (exit 2, one line, every rank) a --threads whose stacks and BLAS buffers would take more
// than half of what the address-space limit leaves: the other half is the model's, which the
// program's memory estimate checks next.
static void require_room_for_threads(int requested) {
    ThreadRoom r = thread_room();
    double figures[3] = {room_needed(r, requested), -r.room, r.buffer};  // need, -room, buffer
    if (dist_world_size() > 1)  // the most needed and the least room of any rank
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, figures, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    double need = figures[0], room = -figures[1], buffer = figures[2];
    if (need <= room / 2) return;
    char buffers[96] = "";
    if (buffer > 0)
        snprintf(buffers, sizeof buffers, " and %d BLAS buffers of %.0f MiB", requested, buffer / (1 << 20));
    usage_error("--threads %d needs %d thread stack%s of %.0f MiB%s (%.1f GB of address space), more than half of "
                "the %.1f GB that this process may still map (ulimit -v); ask for fewer threads, or raise the "
                "limit", requested, requested - 1, requested == 2 ? "" : "s", r.stack / (1 << 20), buffers,
                need / 1e9, room / 1e9);
}

// The default count, one thread per core, under the same rule: where the limit leaves no room for
// a core's thread, that thread is not started (it is the program's choice, so no error; the first
// line says so). Without a limit, nothing is measured. Ranks may settle on different counts, as
// they may have different cores: a result does not depend on the count.
static int threads_that_fit(int cores) {
#ifndef _OPENMP
    return cores;  // built without OpenMP: one thread computes, whatever the count (threads_init)
#endif
    if (cores <= 1) return cores;
    ThreadRoom r = thread_room();  // (without a limit, its room is infinite and nothing is measured)
    if (isinf(r.room)) return cores;
    int threads = cores;
    while (threads > 1 && room_needed(r, threads) > r.room / 2) threads--;
    return threads;
}

int threads_init(int requested) {
    int online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int allowed = online;
    cpu_set_t set;
    // mpirun and Slurm may bind us to a subset of the cores: respect it.
    if (sched_getaffinity(0, sizeof set, &set) == 0) allowed = CPU_COUNT(&set);
    int fair_share = online / dist_local_world_size();
    g_cores = allowed < fair_share ? allowed : fair_share;
    if (g_cores < 1) g_cores = 1;
    if (requested > 1) require_room_for_threads(requested);
    int threads = requested;
    g_share = 1;
    g_room_capped = false;
    if (threads <= 0) {
        threads = threads_that_fit(g_cores);
        g_room_capped = threads < g_cores;
        if (g_cores < fair_share) g_share = fair_share;
    }
    // BLAS at one thread first: an OpenBLAS built with OpenMP (Debian's and
    // Ubuntu's libopenblas0-openmp) sets its count through
    // omp_set_num_threads(), which would otherwise undo ours below.
    if (openblas_set_num_threads) openblas_set_num_threads(1);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    threads = 1;  // built without OpenMP (make OPENMP=): every loop runs on this thread
#endif
    g_threads = threads;
    return threads;
}

int threads_count(void) { return g_threads; }
int threads_rank_cores(void) { return g_cores; }

const char *threads_blas_name(void) {
    static char name[128];
    if (!openblas_get_config || !openblas_get_corename) return "CBLAS";
    // The config starts "OpenBLAS 0.3.21 ...": keep the name and the version.
    char library[32] = "OpenBLAS", version[32] = "";
    sscanf(openblas_get_config(), "%31s %31s", library, version);
    snprintf(name, sizeof name, "%s%s%s (%s kernels)", library, *version ? " " : "", version,
             openblas_get_corename());
    return name;
}

const char *threads_describe(void) {
    static char text[384];
    // mpirun binds 1 or 2 ranks to one core each by default (and Slurm may bind
    // too): a rank bound to fewer cores than its share says so.
    char bound[96] = "", room[112] = "";
    if (g_share > g_cores)
        snprintf(bound, sizeof bound, " (bound to %d of its %d cores: mpirun --bind-to none frees them)", g_cores,
                 g_share);
    // Under ulimit -v, the default count may start fewer threads than the cores (threads_that_fit).
    if (g_room_capped)
        snprintf(room, sizeof room, " (of %d cores: ulimit -v leaves no room for more threads' stacks and BLAS "
                 "buffers)", g_cores);
    snprintf(text, sizeof text, "%d thread%s%s%s%s, %s", g_threads, g_threads == 1 ? "" : "s",
             dist_world_size() > 1 ? " per rank" : "", bound, room, threads_blas_name());
    return text;
}
