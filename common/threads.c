// threads.c: how many threads a rank computes with. See threads.h.
#include "threads.h"

#include <sched.h>
#include <stdio.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "dist.h"

static int g_threads = 1;
static int g_share = 1;  // cores / ranks on the node, when a CPU binding allowed fewer
static int g_cores = 1;  // the cores this rank may use

// OpenBLAS reads OPENBLAS_NUM_THREADS when the library loads, before main(),
// so its count must be set through its API. Weak, so that another CBLAS
// (BLAS_LIBS=...) still links; give that one a single thread through its own
// variable (BLIS_NUM_THREADS=1, MKL_NUM_THREADS=1).
extern void openblas_set_num_threads(int) __attribute__((weak));
extern char *openblas_get_config(void) __attribute__((weak));
extern char *openblas_get_corename(void) __attribute__((weak));

int threads_init(int requested) {
    int online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int allowed = online;
    cpu_set_t set;
    // mpirun and Slurm may bind us to a subset of the cores: respect it.
    if (sched_getaffinity(0, sizeof set, &set) == 0) allowed = CPU_COUNT(&set);
    int fair_share = online / dist_local_world_size();
    g_cores = allowed < fair_share ? allowed : fair_share;
    if (g_cores < 1) g_cores = 1;
    int threads = requested;
    g_share = 1;
    if (threads <= 0) {
        threads = g_cores;
        if (threads < fair_share) g_share = fair_share;
    }
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    threads = 1;  // built without OpenMP (make OPENMP=): every loop runs on this thread
#endif
    g_threads = threads;
    if (openblas_set_num_threads) openblas_set_num_threads(1);
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
    static char text[320];
    // mpirun binds 1 or 2 ranks to one core each by default (and Slurm may bind
    // too): a rank bound to fewer cores than its share says so.
    char bound[96] = "";
    if (g_share > g_threads)
        snprintf(bound, sizeof bound, " (bound to %d of its %d cores: mpirun --bind-to none frees them)", g_threads,
                 g_share);
    snprintf(text, sizeof text, "%d thread%s%s%s, %s", g_threads, g_threads == 1 ? "" : "s",
             dist_world_size() > 1 ? " per rank" : "", bound, threads_blas_name());
    return text;
}
