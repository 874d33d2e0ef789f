// scaling_results.c: see scaling_results.h.
#include "records/scaling_results.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/paths.h"    // input_file_problem, replace_begin, replace_commit: replaced whole, never half written
#include "records/plot.h"  // the speed-up chart
#include "runtime/dist.h"  // dist_rank

// The results CSV: a header line world_size,seconds (files written before it
// had none), then one row per run; several rows of one world size are repeats
// of it. Kept as text, so that adding a run writes the old rows back as they were.
static const char RESULTS_HEADER[] = "world_size,seconds";

typedef struct {
    char *text;  // the file as read, NUL-terminated; size 0: no file yet
    size_t size;
    int *worlds;
    double *seconds;
    int n, capacity;
} Results;

static void results_add(Results *r, int world, double seconds) {
    if (r->n == r->capacity) {
        r->capacity = r->capacity ? 2 * r->capacity : 16;
        r->worlds = realloc(r->worlds, (size_t)r->capacity * sizeof *r->worlds);
        r->seconds = realloc(r->seconds, (size_t)r->capacity * sizeof *r->seconds);
        CHECK(r->worlds && r->seconds, "out of memory for %d runs", r->capacity);
    }
    r->worlds[r->n] = world, r->seconds[r->n] = seconds, r->n++;
}

static void results_free(Results *r) {
    free(r->text);
    free(r->worlds);
    free(r->seconds);
    *r = (Results){0};
}

// "W,S": an integer world size >= 1 and a time in seconds, finite and > 0.
static bool parse_row(const char *row, int *world, double *seconds) {
    const char *comma = strchr(row, ',');
    if (!comma || strchr(comma + 1, ',')) return false;  // two fields
    char *end;
    errno = 0;
    long w = strtol(row, &end, 10);
    if (end == row || end != comma || errno || w < 1 || w > INT_MAX) return false;
    double t = strtod(comma + 1, &end);
    if (end == comma + 1 || *end != '\0' || !isfinite(t) || t <= 0) return false;
    *world = (int)w, *seconds = t;
    return true;
}

// Read and check the whole file. A missing one is empty: the first run creates
// it. False at the first problem, which `err` names with its line.
static bool results_read(const char *path, Results *r, char *err, size_t err_size) {
    *r = (Results){0};
    const char *problem = input_file_problem(path);
    if (problem) return snprintf(err, err_size, "--results %s: %s, not a CSV file", path, problem), false;
    FILE *file = fopen(path, "rb");
    if (!file && errno == ENOENT) return true;
    if (!file) return snprintf(err, err_size, "--results %s: cannot open: %s", path, strerror(errno)), false;
    size_t capacity = 4096, got;
    r->text = xmalloc(capacity);
    while ((got = fread(r->text + r->size, 1, capacity - 1 - r->size, file)) > 0) {
        r->size += got;
        if (r->size + 1 == capacity) {
            capacity *= 2;
            r->text = realloc(r->text, capacity);
            CHECK(r->text != NULL, "--results %s: out of memory reading it", path);
        }
    }
    bool failed = ferror(file);
    int error = errno;
    fclose(file);
    if (failed) return snprintf(err, err_size, "--results %s: cannot read: %s", path, strerror(error)), false;
    r->text[r->size] = '\0';
    if (strlen(r->text) != r->size) return snprintf(err, err_size, "--results %s: not a text file", path), false;

    int line_number = 0;
    size_t len;
    for (const char *line = r->text; *line; line += len + (line[len] == '\n')) {
        len = strcspn(line, "\n");
        line_number++;
        char row[128];
        snprintf(row, sizeof row, "%.*s", (int)len, line);  // cut if longer: then it is no row of ours
        if (row[0] && row[strlen(row) - 1] == '\r') row[strlen(row) - 1] = '\0';  // a CRLF file
        if (row[0] == '\0' || (line_number == 1 && strcmp(row, RESULTS_HEADER) == 0)) continue;  // blank, header
        int world;
        double seconds;
        if (len >= sizeof row || !parse_row(row, &world, &seconds))
            return snprintf(err, err_size,
                            "--results %s: line %d is '%.40s%s', expected world_size,seconds: an integer world "
                            "size >= 1 and the seconds, a finite number > 0",
                            path, line_number, row, strlen(row) > 40 ? "..." : ""), false;
        results_add(r, world, seconds);
    }
    return true;
}

// One world size's runs: how many, their median time, the fastest and the slowest.
typedef struct {
    int world, runs;
    double median, fastest, slowest;
} WorldTimes;

typedef struct {
    int world;
    double seconds;
} Run;

static int by_world_then_seconds(const void *pa, const void *pb) {
    const Run *a = pa, *b = pb;
    if (a->world != b->world) return a->world < b->world ? -1 : 1;
    return (a->seconds > b->seconds) - (a->seconds < b->seconds);
}

// Group the runs by world size (rows: r->n at most), smallest first. The
// median of an even count is the mean of the middle two.
static int world_times(const Results *r, WorldTimes *rows) {
    Run *runs = xmalloc((size_t)r->n * sizeof *runs);
    for (int i = 0; i < r->n; i++) runs[i] = (Run){r->worlds[i], r->seconds[i]};
    qsort(runs, (size_t)r->n, sizeof *runs, by_world_then_seconds);
    int n = 0;
    for (int first = 0, end; first < r->n; first = end) {
        for (end = first; end < r->n && runs[end].world == runs[first].world; end++) {}
        int count = end - first;
        const Run *mid = runs + first + count / 2;
        rows[n++] = (WorldTimes){.world = runs[first].world, .runs = count,
                                 .median = count % 2 ? mid->seconds : (mid[-1].seconds + mid->seconds) / 2,
                                 .fastest = runs[first].seconds, .slowest = runs[end - 1].seconds};
    }
    free(runs);
    return n;
}

// Before training: a results file that is corrupt, or cannot be read, is
// refused now, not after the run (and it stays as it is). Rank 0 reads it,
// since rank 0 writes it; every rank exits.
void scaling_results_check(const char *path) {
    char err[512] = "";
    int bad = 0;
    if (dist_rank() == 0) {
        Results r;
        bad = !results_read(path, &r, err, sizeof err);
        results_free(&r);
    }
    CHECK_MPI(MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (bad) usage_error("%s", err);  // printed once, by rank 0
}

// Add this run to the results CSV, then print the table of all its runs (the
// median and spread of each world size) and draw the speed-up chart. Rank 0 only.
void scaling_results_report(const char *path, int world, double seconds, const char *chart) {
    // Read again: another run may have added its row since the check.
    Results r;
    char err[512];
    CHECK(results_read(path, &r, err, sizeof err), "%s", err);
    // The old rows as they were, and this run's, into a new file renamed over
    // the old one: a failed write (a full disk) loses no run.
    char temp[PATH_MAX];
    FILE *file = replace_begin(path, temp, sizeof temp);
    CHECK_ERRNO(file != NULL, "--results %s: cannot create %s", path, temp);
    if (r.size == 0) {
        fprintf(file, "%s\n", RESULTS_HEADER);  // a new file says what its columns are
    } else {
        fwrite(r.text, 1, r.size, file);  // a failed write shows at the commit
        if (r.text[r.size - 1] != '\n') fputc('\n', file);
    }
    fprintf(file, "%d,%.6f\n", world, seconds);
    CHECK_ERRNO(replace_commit(file, temp), "--results %s: cannot write", path);
    results_add(&r, world, seconds);

    // Every run counts: on a shared or busy machine one run can take five
    // times another of the same world size, so a table of single runs can
    // show 2 ranks 4.8x faster one day and 0.9x the next. Per world size:
    // the median time, which one slow run does not move, and the fastest and
    // slowest runs, which show how far any one run can be trusted.
    WorldTimes *rows = xmalloc((size_t)r.n * sizeof *rows);
    int n = world_times(&r, rows);
    results_free(&r);
    int base = 0;
    while (base < n && rows[base].world != 1) base++;
    // The speed-up is the ratio of the medians. Its range pairs the extremes:
    // from the fastest 1-rank run over the slowest W-rank run to the slowest
    // over the fastest, so that every pair of single runs lies inside it.
    // That is what a reader needs to judge the lesson: a range that spans
    // 1.00x means some run at W ranks was slower than some run at 1 rank, and
    // these runs cannot say that W ranks are faster; the 1-rank row's own
    // range is the noise of the machine itself. (Quartiles, or a standard
    // error, would look tighter, but mean little over 3 runs, and hide the
    // one run that inverted the lesson.)
    float *x = xmalloc((size_t)n * sizeof(float)), *speedup = xmalloc((size_t)n * sizeof(float)),
          *speedup_lo = xmalloc((size_t)n * sizeof(float)), *speedup_hi = xmalloc((size_t)n * sizeof(float)),
          *ideal = xmalloc((size_t)n * sizeof(float));
    printf("\n%10s %5s %9s %15s %9s %13s %11s\n", "world size", "runs", "median s", "min..max s", "speed-up",
           "min..max", "efficiency");
    for (int i = 0; i < n; i++) {
        const WorldTimes *w = &rows[i];
        char times[48], range[48];
        snprintf(times, sizeof times, "%.3f..%.3f", w->fastest, w->slowest);
        x[i] = (float)w->world;
        ideal[i] = (float)w->world;
        if (base < n) {
            const WorldTimes *one = &rows[base];
            speedup[i] = (float)(one->median / w->median);
            speedup_lo[i] = (float)(one->fastest / w->slowest);
            speedup_hi[i] = (float)(one->slowest / w->fastest);
            snprintf(range, sizeof range, "%.2f..%.2fx", speedup_lo[i], speedup_hi[i]);
            printf("%10d %5d %9.3f %15s %8.2fx %13s %10.0f%%\n", w->world, w->runs, w->median, times, speedup[i],
                   range, 100 * speedup[i] / w->world);
        } else {
            printf("%10d %5d %9.3f %15s %9s %13s %11s\n", w->world, w->runs, w->median, times, "-", "-", "-");
        }
    }
    if (base < n)
        printf("speed-up: median time at 1 rank / median at W; min..max: fastest 1-rank run / slowest W-rank run\n"
               "to slowest / fastest. Where it spans 1.00x, these runs cannot tell whether W ranks are faster.\n");
    else
        printf("(run it on 1 rank too, for the speed-up)\n");
    fflush(stdout);
    if (chart && *chart && base < n) {
        PlotSeries series[2] = {{.label = "measured: median, bar min..max", .x = x, .y = speedup, .n = n,
                                 .y_lo = speedup_lo, .y_hi = speedup_hi},
                                {.label = "ideal (W x)", .x = x, .y = ideal, .n = n}};
        PlotSpec spec = {.title = "Step 7: DDP training speed-up over one rank", .xlabel = "world size (ranks)",
                         .ylabel = "speed-up", .integer_x = 1};
        plot_png(chart, &spec, series, 2);
        printf("Speed-up chart: %s\n", chart);
    }
    free(x), free(speedup), free(speedup_lo), free(speedup_hi), free(ideal), free(rows);
}
