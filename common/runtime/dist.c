// dist.c: process group on MPI. See dist.h.
#include "runtime/dist.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/check.h"

static int g_nodes = 1;
static int g_rank = 0, g_world = 1, g_local_rank = 0, g_local_world = 1, g_thread_level = MPI_THREAD_SINGLE;
static char g_host[MPI_MAX_PROCESSOR_NAME] = "localhost";

// Teardown registered by the layers above (device, collectives, profile).
enum { MAX_TEARDOWNS = 16 };
static void (*g_teardowns[MAX_TEARDOWNS])(void);
static int g_n_teardowns;

// A program started without mpirun or srun is an MPI singleton: MPI_Init forks Open MPI's orted,
// and the fork runs OpenBLAS's pre-fork handler, which joins OpenBLAS's threads. Under a small
// `ulimit -v` a thread that could not map its buffer (128 MB) retries for ever, and the join with
// it: the program hung before its first line. So a singleton whose address space leaves less
// than MPI needs to start (about 200 MB: 56 -> 256 MB for a bare singleton) says so in one line
// and ends, by _exit, which joins nothing. Under a launcher MPI_Init forks nothing, and
// memory_require (memory_budget.h) refuses what does not fit, as it names the flags.
enum { SINGLETON_START_MB = 200 };

// The value of environment variable `name`, or NULL. (`environ` read here, not getenv: threads.c
// defines the program's getenv, and a call from here would link it, and all it needs, into every
// program, step 0's too: tests/test_layers.sh.)
static const char *environment(const char *name) {
    extern char **environ;
    size_t length = strlen(name);
    for (char **entry = environ; entry && *entry; entry++)
        if (strncmp(*entry, name, length) == 0 && (*entry)[length] == '=') return *entry + length + 1;
    return NULL;
}

static bool launched(void) {
    static const char *const launchers[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof launchers / sizeof *launchers; i++)
        if (environment(launchers[i])) return true;
    return false;
}
static void refuse_singleton_without_room(const char *program) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");  // its first field: the pages mapped (what RLIMIT_AS counts)
    if (!f) return;
    int read = fscanf(f, "%lu", &pages);
    fclose(f);
    if (read != 1) return;
    double room_mb = ((double)limit.rlim_cur - (double)pages * (double)sysconf(_SC_PAGESIZE)) / 1e6;
    if (room_mb >= SINGLETON_START_MB) return;
    fprintf(stderr, "error: ulimit -v leaves %s %.0f MB of address space (of %.0f MB), less than the %d MB that "
            "MPI takes to start in a program run without mpirun: raise ulimit -v\n", program, room_mb > 0 ? room_mb : 0,
            (double)limit.rlim_cur / 1e6, SINGLETON_START_MB);
    fflush(stderr);
    _exit(1);
}

void dist_init(int *argc, char ***argv) {
    if (!launched()) {
        refuse_singleton_without_room(*argc > 0 ? (*argv)[0] : "this program");
        // A singleton of Open MPI's starts its helper (orted) only to serve MPI_Comm_spawn and the
        // like, which no program here calls: isolated, it starts in a third of the time (0.1 s
        // less, for each of the tests' hundreds of runs too). A user's own setting wins.
        // Isolated singletons all take job family 0, so their session folders are one,
        // TMPDIR/ompi.HOST.UID/jf.0: one that ends removes it while another starts in it, whose
        // MPI_Init then fails ("A call to mkdir was unable to create the desired directory", 6 of
        // 480 starts, 8 at a time). So each gets a folder of its own, which Open MPI removes at
        // MPI_Finalize as it would its own.
        if (!environment("OMPI_MCA_ess_singleton_isolated") && !environment("OMPI_MCA_orte_top_session_dir")) {
            const char *tmp = environment("TMPDIR");
            if (!tmp || !*tmp) tmp = "/tmp";
            char top[4096];
            snprintf(top, sizeof top, "%s/ompi.singleton.%ld.%ld", tmp, (long)getuid(), (long)getpid());
            setenv("OMPI_MCA_orte_top_session_dir", top, 0);
        }
        setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    }
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

void dist_at_finalize(void (*teardown)(void)) {
    for (int i = 0; i < g_n_teardowns; i++)
        if (g_teardowns[i] == teardown) return;  // registered once, however often asked
    CHECK(g_n_teardowns < MAX_TEARDOWNS, "dist_at_finalize: more than %d teardown functions", MAX_TEARDOWNS);
    g_teardowns[g_n_teardowns++] = teardown;
}

void dist_finalize(void) {
    while (g_n_teardowns > 0) g_teardowns[--g_n_teardowns]();  // newest first
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

void dist_allreduce_sum_over(MPI_Comm comm, float *buf, size_t count) {
    int size = 1;
    CHECK_MPI(MPI_Comm_size(comm, &size));
    if (size == 1) return;
    for (size_t off = 0; off < count; off += MPI_SLICE) {
        int n = (int)(count - off < MPI_SLICE ? count - off : MPI_SLICE);
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf + off, n, MPI_FLOAT, MPI_SUM, comm));
    }
}

void dist_broadcast_over(MPI_Comm comm, float *buf, size_t count, int root) {
    int size = 1;
    CHECK_MPI(MPI_Comm_size(comm, &size));
    if (size == 1) return;
    for (size_t off = 0; off < count; off += MPI_SLICE) {
        int n = (int)(count - off < MPI_SLICE ? count - off : MPI_SLICE);
        CHECK_MPI(MPI_Bcast(buf + off, n, MPI_FLOAT, root, comm));
    }
}

void dist_allreduce_sum(float *buf, size_t count) { dist_allreduce_sum_over(MPI_COMM_WORLD, buf, count); }
void dist_broadcast(float *buf, size_t count, int root) { dist_broadcast_over(MPI_COMM_WORLD, buf, count, root); }

void dist_barrier(void) { CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD)); }

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

void dist_require_memory(double bytes_per_rank, const char *what) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    double node = pages > 0 && page_size > 0 ? (double)pages * page_size : 0.0;  // 0: unknown, no check
    int ranks = dist_local_world_size();
    char message[512];
    snprintf(message, sizeof message, "%s: %.1f GB per rank, %d rank%s on %s: more than half of its %.1f GB of memory",
             what, bytes_per_rank / 1e9, ranks, ranks == 1 ? "" : "s", dist_hostname(), node / 1e9);
    check_all_ranks(node == 0.0 || bytes_per_rank * ranks <= node / 2, message);
}
