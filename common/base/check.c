// check.c: the one place where fatal errors end. See check.h.
#include "base/check.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static int mpi_is_running(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
}

static void (*g_fatal_hook)(void);
void check_set_fatal_hook(void (*hook)(void)) { g_fatal_hook = hook; }

static _Thread_local const char *g_context;  // this thread's: another's errors (a reader's) are not about it
void check_set_context(const char *context) { g_context = context; }

void fatal_at(const char *file, int line, int code, const char *fmt, ...) {
    int rank = 0, world = 1;
    if (mpi_is_running()) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
    }
    char host[64] = "?";
    gethostname(host, sizeof host - 1);

    // Build the whole line first and write it at once, so that lines from
    // several ranks never interleave mid-line.
    char msg[1024];
    int len = snprintf(msg, sizeof msg, "[rank %d @ %s] %s:%d: ", rank, host, file, line);
    va_list ap;
    va_start(ap, fmt);
    if (len >= 0 && len < (int)sizeof msg) len += vsnprintf(msg + len, sizeof msg - len, fmt, ap);
    va_end(ap);
    if (g_context && len >= 0 && len < (int)sizeof msg) len += snprintf(msg + len, sizeof msg - len, " (%s)", g_context);
    if (len < 0 || len >= (int)sizeof msg - 1) len = (int)sizeof msg - 2;
    msg[len] = '\n';
    fflush(stdout);
    fwrite(msg, 1, (size_t)len + 1, stderr);
    fflush(stderr);

    void (*hook)(void) = g_fatal_hook;
    g_fatal_hook = NULL;  // once: a fatal error inside the hook goes straight on to the abort
    if (hook) hook();
    if (mpi_is_running() && world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);  // alone there is nobody to take down with us
}

void check_all_ranks(int ok, const char *message) {
    int rank = 0;
    int first_failing = ok ? INT_MAX : 0;
    if (mpi_is_running()) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        first_failing = ok ? INT_MAX : rank;
        MPI_Allreduce(MPI_IN_PLACE, &first_failing, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    }
    if (first_failing == INT_MAX) return;
    if (rank == first_failing) {
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        fflush(stdout);
        fprintf(stderr, "[rank %d @ %s] %s\n", rank, host, message);
        fflush(stderr);
    }
    if (mpi_is_running()) MPI_Finalize();
    exit(1);
}

void usage_error(const char *fmt, ...) {
    int rank = 0;
    if (mpi_is_running()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fflush(stdout);
        fprintf(stderr, "error: %s (see --help)\n", msg);
        fflush(stderr);
    }
    if (mpi_is_running()) MPI_Finalize();
    exit(EXIT_USAGE);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    CHECK(p != NULL, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    CHECK(p != NULL, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

// A 4 KB page is 5 rows of MNIST pixels: the batch gather, whose rows are
// scattered over the 47 MB data set, misses the TLB on nearly every row it
// reads, and walks the page tables again for every 4 KB of the 20 MB of floats
// it writes. One 2 MB page covers 2675 rows. Kernels whose transparent huge
// pages are "madvise" (Ubuntu's and Debian's default) give them only to memory
// that asks; "never" ignores the hint, and so do other systems.
// (2-core AMD EPYC VM, step 5 at B = 6400: the gather 2.5 -> 1.2 ms a step.)
void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    CHECK(q != NULL, "out of memory allocating %zu bytes", bytes);
    return q;
}

char *xstrdup(const char *text) {
    size_t n = strlen(text) + 1;
    return memcpy(xmalloc(n), text, n);
}

void *xmalloc_huge_pages(size_t bytes) {
    enum { HUGE_PAGE = 2 << 20 };
    if (bytes < HUGE_PAGE) return xmalloc(bytes);
    size_t rounded = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = aligned_alloc(HUGE_PAGE, rounded);
    CHECK(p != NULL, "out of memory allocating %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
    madvise(p, rounded, MADV_HUGEPAGE);  // a hint: where it fails, 4 KB pages serve as before
#endif
    return p;
}
