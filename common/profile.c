// profile.c: NVTX ranges, host-timestamp records, Chrome trace, summary table.
#include "profile.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "check.h"
#include "dist.h"
#include "paths.h"
#include "timer.h"

#ifdef HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#else  // no NVTX: the calls vanish
#define nvtxRangePushA(name) ((void)(name))
#define nvtxRangePop() ((void)0)
#define nvtxRangeStartA(name) ((void)(name), 0ULL)
#define nvtxRangeEnd(id) ((void)(id))
#define nvtxMarkA(name) ((void)(name))
#endif

// ------------------------------------------------------------------ recording

typedef struct {
    const char *name;   // a string literal of the caller: stored by pointer
    int thread, depth;  // depth: nesting level on the main thread's stack
    double start, end;  // seconds since profile_start
} Record;

#define MAX_DEPTH 32

static struct {
    int on;
    const char *trace_path;
    double t0;
    Record *records;
    size_t n, capacity;
    pthread_mutex_t lock;           // ranges may end on the communication thread
    const char *stack[MAX_DEPTH];   // the main thread's open push ranges
    double stack_start[MAX_DEPTH];
    int depth;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

void profile_start(const char *trace_path) {
    dist_barrier();  // a common time origin for all ranks (to within a barrier's skew)
    g.on = 1;
    g.trace_path = trace_path && *trace_path ? trace_path : NULL;
    if (g.trace_path && dist_rank() == 0) make_parent_dirs(g.trace_path);  // fail now, not after training
    g.t0 = wall_seconds();
}

int profile_recording(void) { return g.on; }

static void record(const char *name, int thread, int depth, double start, double end) {
    pthread_mutex_lock(&g.lock);
    if (g.n == g.capacity) {
        g.capacity = g.capacity ? 2 * g.capacity : 4096;
        g.records = realloc(g.records, g.capacity * sizeof(Record));
        CHECK(g.records, "out of memory for profile records");
    }
    g.records[g.n++] = (Record){name, thread, depth, start - g.t0, end - g.t0};
    pthread_mutex_unlock(&g.lock);
}

void profile_push(const char *name) {
    nvtxRangePushA(name);
    if (!g.on) return;
    CHECK(g.depth < MAX_DEPTH, "profile ranges nested deeper than %d", MAX_DEPTH);
    g.stack[g.depth] = name;
    g.stack_start[g.depth++] = wall_seconds();
}

void profile_pop(void) {
    nvtxRangePop();
    if (!g.on) return;
    CHECK(g.depth > 0, "profile_pop without a profile_push");
    g.depth--;
    record(g.stack[g.depth], PROFILE_MAIN_THREAD, g.depth, g.stack_start[g.depth], wall_seconds());
}

ProfileRange profile_range_start(const char *name, int thread) {
    ProfileRange range = {.name = name, .thread = thread, .start = g.on ? wall_seconds() : 0};
    range.nvtx_id = (unsigned long long)nvtxRangeStartA(name);
    return range;
}

void profile_range_end(ProfileRange *range) {
    nvtxRangeEnd(range->nvtx_id);
    if (g.on) record(range->name, range->thread, 0, range->start, wall_seconds());
}

void profile_mark(const char *name) {
    nvtxMarkA(name);
    if (g.on) {
        double now = wall_seconds();
        record(name, PROFILE_MAIN_THREAD, -1, now, now);  // depth -1: an instant
    }
}

// ------------------------------------------------------------------ gathering

static double peak_rss_mb(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss / 1024.0;  // Linux reports kilobytes
}

// Every rank's records as text lines "name\tthread\tdepth\tstart\tend", the
// first line "#peak_rss_mb\t<MB>\t<host>", gathered on rank 0. Returns the
// concatenation (rank 0) and each rank's offset and length in it.
static char *gather_records(int **offsets_out, int **lengths_out) {
    size_t capacity = 128 + g.n * 96, len = 0;
    char *text = xmalloc(capacity);
    len += (size_t)snprintf(text, capacity, "#peak_rss_mb\t%.1f\t%s\n", peak_rss_mb(), dist_hostname());
    for (size_t i = 0; i < g.n; i++) {
        const Record *r = &g.records[i];
        len += (size_t)snprintf(text + len, capacity - len, "%.40s\t%d\t%d\t%.9f\t%.9f\n", r->name, r->thread,
                                r->depth, r->start, r->end);
    }
    int world = dist_world_size(), my_length = (int)len;
    int *lengths = xcalloc((size_t)world, sizeof(int)), *offsets = xcalloc((size_t)world, sizeof(int));
    CHECK_MPI(MPI_Gather(&my_length, 1, MPI_INT, lengths, 1, MPI_INT, 0, MPI_COMM_WORLD));
    size_t total = 0;
    for (int r = 0; r < world; r++) offsets[r] = (int)total, total += (size_t)lengths[r];
    char *all = dist_rank() == 0 ? xmalloc(total + 1) : NULL;
    CHECK_MPI(MPI_Gatherv(text, my_length, MPI_CHAR, all, lengths, offsets, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (all) all[total] = '\0';
    free(text);
    *offsets_out = offsets, *lengths_out = lengths;
    return all;
}

// ------------------------------------------------------------------ the summary table

typedef struct {
    char name[41];
    int depth, thread;
    double *total_ms;  // [world]
    double first_start;
    long calls;
} Row;

// Parents open before their children: ordering by first start lists each
// range above the ranges nested in it.
static int by_first_start(const void *a, const void *b) {
    const Row *x = a, *y = b;
    return (x->first_start > y->first_start) - (x->first_start < y->first_start);
}

void profile_summary(void) {
    if (!g.on) return;
    int *offsets, *lengths;
    char *all = gather_records(&offsets, &lengths);
    int world = dist_world_size();
    if (dist_rank() == 0) {
        Row rows[64];
        int n_rows = 0;
        double *rss = xcalloc((size_t)world, sizeof(double));
        for (int rank = 0; rank < world; rank++) {
            char *line = all + offsets[rank], *end = line + lengths[rank];
            while (line < end) {
                char *next = memchr(line, '\n', (size_t)(end - line));
                *next = '\0';
                char name[41];
                int thread, depth;
                double start, stop;
                if (line[0] == '#') {
                    sscanf(line, "#peak_rss_mb\t%lf", &rss[rank]);
                } else if (sscanf(line, "%40[^\t]\t%d\t%d\t%lf\t%lf", name, &thread, &depth, &start, &stop) == 5 &&
                           depth >= 0) {
                    int k = 0;
                    while (k < n_rows && !(strcmp(rows[k].name, name) == 0 && rows[k].thread == thread)) k++;
                    if (k == n_rows && n_rows < 64) {
                        rows[n_rows] = (Row){.depth = depth, .thread = thread, .first_start = start};
                        snprintf(rows[k].name, sizeof rows[k].name, "%s", name);
                        rows[n_rows++].total_ms = xcalloc((size_t)world, sizeof(double));
                    }
                    if (k < n_rows) {
                        if (start < rows[k].first_start) rows[k].first_start = start;
                        rows[k].total_ms[rank] += 1e3 * (stop - start);
                        rows[k].calls++;
                    }
                }
                line = next + 1;
            }
        }
        qsort(rows, (size_t)n_rows, sizeof(Row), by_first_start);
        double step_ms = 0;  // mean over ranks of the "step" range: 100%
        for (int k = 0; k < n_rows; k++)
            if (strcmp(rows[k].name, "step") == 0 && rows[k].thread == PROFILE_MAIN_THREAD)
                for (int r = 0; r < world; r++) step_ms += rows[k].total_ms[r] / world;

        printf("\nProfile on %d rank%s (per rank: mean over ranks, slowest rank in brackets)\n", world,
               world == 1 ? "" : "s");
        printf("%-28s %7s %20s %10s %10s\n", "range", "calls", "total ms", "mean ms", "% of step");
        double inside_step = 0;
        for (int thread = PROFILE_MAIN_THREAD; thread <= PROFILE_COMM_THREAD; thread++) {
            for (int k = 0; k < n_rows; k++) {
                if (rows[k].thread != thread) continue;
                double mean = 0, slowest = 0;
                for (int r = 0; r < world; r++) {
                    mean += rows[k].total_ms[r] / world;
                    slowest = fmax(slowest, rows[k].total_ms[r]);
                }
                char label[96], total[48], share[16] = "-";
                snprintf(label, sizeof label, "%*s%.40s%s", 2 * (rows[k].depth % 8), "", rows[k].name,
                         thread == PROFILE_COMM_THREAD ? " (comm thread)" : "");
                snprintf(total, sizeof total, "%.1f [%.1f]", mean, slowest);
                if (step_ms > 0) snprintf(share, sizeof share, "%.1f%%", 100 * mean / step_ms);
                double calls_per_rank = (double)rows[k].calls / world;
                printf("%-28s %7.0f %20s %10.3f %10s\n", label, calls_per_rank, total, mean / calls_per_rank, share);
                if (thread == PROFILE_MAIN_THREAD && rows[k].depth == 1) inside_step += mean;
            }
        }
        if (step_ms > 0)
            printf("The ranges inside 'step' account for %.1f%% of its time.\n", 100 * inside_step / step_ms);
        printf("Peak memory (RSS) so far:");
        for (int r = 0; r < world; r++) printf(" rank %d %.0f MB%s", r, rss[r], r + 1 < world ? "," : "\n");
        fflush(stdout);
        for (int k = 0; k < n_rows; k++) free(rows[k].total_ms);
        free(rss);
    }
    free(all), free(offsets), free(lengths);
}

// ------------------------------------------------------------------ the trace file

void profile_finish(void) {
    if (!g.on || !g.trace_path) {
        g.on = 0;
        return;
    }
    int *offsets, *lengths;
    char *all = gather_records(&offsets, &lengths);
    if (dist_rank() == 0) {
        make_parent_dirs(g.trace_path);  // log_ddp/, as the original's profiler makes it
        FILE *file = fopen(g.trace_path, "w");
        CHECK_ERRNO(file != NULL, "--trace %s: cannot create", g.trace_path);
        fprintf(file, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
        const char *separator = "";
        for (int rank = 0; rank < dist_world_size(); rank++) {
            char *line = all + offsets[rank], *end = line + lengths[rank];
            while (line < end) {
                char *next = memchr(line, '\n', (size_t)(end - line));
                *next = '\0';
                char name[41], host[256] = "";
                int thread, depth;
                double start, stop, rss;
                if (sscanf(line, "#peak_rss_mb\t%lf\t%255s", &rss, host) >= 1) {
                    fprintf(file, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d (%s)\"}}",
                            separator, rank, rank, host);
                    separator = ",\n";
                    fprintf(file, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"main\"}}", rank);
                    fprintf(file, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": \"communication\"}}", rank);
                    fprintf(file, ",\n{\"name\": \"peak RSS\", \"ph\": \"C\", \"pid\": %d, \"ts\": 0, \"args\": {\"MB\": %.1f}}", rank, rss);
                } else if (sscanf(line, "%40[^\t]\t%d\t%d\t%lf\t%lf", name, &thread, &depth, &start, &stop) == 5) {
                    if (depth < 0)  // an instant: a step marker
                        fprintf(file, ",\n{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"t\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f}",
                                name, rank, thread, 1e6 * start);
                    else
                        fprintf(file, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
                                name, rank, thread, 1e6 * start, 1e6 * (stop - start));
                }
                line = next + 1;
            }
        }
        fprintf(file, "\n]}\n");
        CHECK_ERRNO(fclose(file) == 0, "--trace %s: cannot write", g.trace_path);
        printf("Trace: %s (open it in https://ui.perfetto.dev or chrome://tracing)\n", g.trace_path);
        fflush(stdout);
    }
    free(all), free(offsets), free(lengths);
    g.on = 0;
}
