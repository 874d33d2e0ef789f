// profile.c: NVTX ranges, host-timestamp records, Chrome trace, summary table.
#include "runtime/profile.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/paths.h"
#include "base/timer.h"
#include "runtime/device.h"
#include "runtime/dist.h"

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
    dist_at_finalize(profile_finish);  // the trace is written before MPI goes away
}

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

// On a GPU the host only queues work, so a host timestamp says when a kernel
// was launched, not when it ran. While recording, each range therefore waits
// for the GPU at both ends (as CUDA_LAUNCH_BLOCKING=1 would): the table and
// the trace show GPU time, at the price of the overlap between host and GPU.
// Nsight Systems (NVTX only, nothing recorded) needs no such help.
void profile_push(const char *name) {
    nvtxRangePushA(name);
    if (!g.on) return;
    device_synchronize();
    CHECK(g.depth < MAX_DEPTH, "profile ranges nested deeper than %d", MAX_DEPTH);
    g.stack[g.depth] = name;
    g.stack_start[g.depth++] = wall_seconds();
}

void profile_pop(void) {
    nvtxRangePop();
    if (!g.on) return;
    CHECK(g.depth > 0, "profile_pop without a profile_push");
    device_synchronize();
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

int profile_recording(void) { return g.on; }

void profile_range_record(const char *name, int thread, double start, double end) {
    if (g.on) record(name, thread, 0, start, end);
}

void profile_mark(const char *name) {
    nvtxMarkA(name);
    if (g.on) {
        double now = wall_seconds();
        record(name, PROFILE_MAIN_THREAD, -1, now, now);  // depth -1: an instant
    }
}

// ------------------------------------------------------------------ gathering

// A record as it travels to rank 0: fixed size, the name copied in, so MPI
// moves whole records (a contiguous datatype) and nobody parses text.
typedef struct {
    char name[40];
    int thread, depth;
    double start, end;
} WireRecord;

typedef struct {
    double peak_rss_mb;
    char host[64];
} RankInfo;

// Every rank's records, rank by rank, on rank 0 (elsewhere: empty).
typedef struct {
    RankInfo *info;       // [world]
    WireRecord *records;  // rank r's are records[first[r] .. first[r] + count[r])
    int *first, *count;   // [world]
} Gathered;

static Gathered gather_records(void) {
    int world = dist_world_size(), root = dist_rank() == 0, n = (int)g.n;
    WireRecord *mine = xcalloc(g.n, sizeof(WireRecord));
    for (size_t i = 0; i < g.n; i++) {
        const Record *r = &g.records[i];
        mine[i] = (WireRecord){.thread = r->thread, .depth = r->depth, .start = r->start, .end = r->end};
        snprintf(mine[i].name, sizeof mine[i].name, "%s", r->name);
    }
    RankInfo info = {.peak_rss_mb = host_peak_resident_bytes() / 1e6};  // MB are 10^6 bytes, as every size we print
    snprintf(info.host, sizeof info.host, "%s", dist_hostname());

    Gathered all = {0};
    if (root) {
        all.info = xcalloc((size_t)world, sizeof(RankInfo));
        all.first = xcalloc((size_t)world, sizeof(int));
        all.count = xcalloc((size_t)world, sizeof(int));
    }
    CHECK_MPI(MPI_Gather(&info, sizeof info, MPI_BYTE, all.info, sizeof info, MPI_BYTE, 0, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Gather(&n, 1, MPI_INT, all.count, 1, MPI_INT, 0, MPI_COMM_WORLD));
    int total = 0;
    for (int r = 0; root && r < world; r++) all.first[r] = total, total += all.count[r];
    if (root) all.records = xcalloc((size_t)total, sizeof(WireRecord));
    MPI_Datatype record_type;
    CHECK_MPI(MPI_Type_contiguous(sizeof(WireRecord), MPI_BYTE, &record_type));
    CHECK_MPI(MPI_Type_commit(&record_type));
    CHECK_MPI(MPI_Gatherv(mine, n, record_type, all.records, all.count, all.first, record_type, 0, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Type_free(&record_type));
    free(mine);
    return all;
}

static void gathered_free(Gathered *all) {
    free(all->info), free(all->records), free(all->first), free(all->count);
    *all = (Gathered){0};
}

// ------------------------------------------------------------------ the summary table

typedef struct {
    char name[40];
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
    Gathered all = gather_records();
    int world = dist_world_size();
    if (dist_rank() == 0) {
        Row rows[64];
        int n_rows = 0;
        for (int rank = 0; rank < world; rank++) {
            for (int i = all.first[rank]; i < all.first[rank] + all.count[rank]; i++) {
                const WireRecord *r = &all.records[i];
                if (r->depth < 0) continue;  // an instant: no time to add up
                int k = 0;
                while (k < n_rows && !(strcmp(rows[k].name, r->name) == 0 && rows[k].thread == r->thread)) k++;
                if (k == n_rows && n_rows < 64) {
                    rows[n_rows] = (Row){.depth = r->depth, .thread = r->thread, .first_start = r->start};
                    snprintf(rows[k].name, sizeof rows[k].name, "%s", r->name);
                    rows[n_rows++].total_ms = xcalloc((size_t)world, sizeof(double));
                }
                if (k < n_rows) {
                    if (r->start < rows[k].first_start) rows[k].first_start = r->start;
                    rows[k].total_ms[rank] += 1e3 * (r->end - r->start);
                    rows[k].calls++;
                }
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
        for (int r = 0; r < world; r++)
            printf(" rank %d %.0f MB%s", r, all.info[r].peak_rss_mb, r + 1 < world ? "," : "\n");
        fflush(stdout);
        for (int k = 0; k < n_rows; k++) free(rows[k].total_ms);
    }
    gathered_free(&all);
}

// ------------------------------------------------------------------ the trace file

void profile_finish(void) {
    if (!g.on || !g.trace_path) {
        g.on = 0;
        return;
    }
    Gathered all = gather_records();
    if (dist_rank() == 0) {
        // Written next to the trace and renamed over it: a failed write keeps the old file.
        char temp[PATH_MAX];
        FILE *file = replace_begin(g.trace_path, temp, sizeof temp);
        CHECK_ERRNO(file != NULL, "--trace %s: cannot create %s", g.trace_path, temp);
        fprintf(file, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
        for (int rank = 0; rank < dist_world_size(); rank++) {
            // Per rank: a process named by rank and host, two named threads, the memory counter.
            fprintf(file, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d (%s)\"}}",
                    rank ? ",\n" : "", rank, rank, all.info[rank].host);
            fprintf(file, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"main\"}}", rank);
            fprintf(file, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": \"communication\"}}", rank);
            fprintf(file, ",\n{\"name\": \"peak RSS\", \"ph\": \"C\", \"pid\": %d, \"ts\": 0, \"args\": {\"MB\": %.1f}}", rank,
                    all.info[rank].peak_rss_mb);
            for (int i = all.first[rank]; i < all.first[rank] + all.count[rank]; i++) {
                const WireRecord *r = &all.records[i];
                if (r->depth < 0)  // an instant: a step marker
                    fprintf(file, ",\n{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"t\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f}",
                            r->name, rank, r->thread, 1e6 * r->start);
                else
                    fprintf(file, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
                            r->name, rank, r->thread, 1e6 * r->start, 1e6 * (r->end - r->start));
            }
        }
        fprintf(file, "\n]}\n");
        CHECK_ERRNO(replace_commit(file, temp), "--trace %s: cannot write", g.trace_path);
        printf("Trace: %s (open it in https://ui.perfetto.dev or chrome://tracing)\n", g.trace_path);
        fflush(stdout);
    }
    gathered_free(&all);
    g.on = 0;
}
