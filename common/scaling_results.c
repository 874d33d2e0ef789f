// scaling_results.c: see scaling_results.h.
#include "scaling_results.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"   // dist_rank
#include "paths.h"  // input_file_problem, replace_begin, replace_commit: replaced whole, never half written
#include "plot.h"   // the speed-up chart

// The results CSV: a header line world_size,seconds (files written before it
// had none), then one row per run. Kept as text, so that adding a run writes
// the old rows back as they were.
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

// Add this run to the results CSV, then print the table of all its runs and
// draw the speed-up chart. Rank 0 only.
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

    // Keep the last run of each world size.
    int *worlds = xmalloc((size_t)r.n * sizeof(int)), n = 0;
    double *times = xmalloc((size_t)r.n * sizeof(double));
    for (int i = 0; i < r.n; i++) {
        int k = 0;
        while (k < n && worlds[k] != r.worlds[i]) k++;
        if (k == n) n++;
        worlds[k] = r.worlds[i], times[k] = r.seconds[i];
    }
    results_free(&r);
    for (int i = 1; i < n; i++)  // by world size
        for (int k = i; k > 0 && worlds[k] < worlds[k - 1]; k--) {
            int wi = worlds[k]; worlds[k] = worlds[k - 1]; worlds[k - 1] = wi;
            double ti = times[k]; times[k] = times[k - 1]; times[k - 1] = ti;
        }
    int base = 0;
    while (base < n && worlds[base] != 1) base++;
    float *x = xmalloc((size_t)n * sizeof(float)), *speedup = xmalloc((size_t)n * sizeof(float)),
          *ideal = xmalloc((size_t)n * sizeof(float));
    printf("\n%10s %12s %9s %11s\n", "world size", "training s", "speed-up", "efficiency");
    for (int i = 0; i < n; i++) {
        x[i] = (float)worlds[i];
        ideal[i] = (float)worlds[i];
        speedup[i] = base < n ? (float)(times[base] / times[i]) : 0.0f;
        if (base < n)
            printf("%10d %12.3f %8.2fx %10.0f%%\n", worlds[i], times[i], speedup[i], 100 * speedup[i] / worlds[i]);
        else
            printf("%10d %12.3f %9s %11s\n", worlds[i], times[i], "-", "-");
    }
    if (base == n) printf("(run it on 1 rank too, for the speed-up)\n");
    fflush(stdout);
    if (chart && *chart && base < n) {
        PlotSeries series[2] = {{.label = "measured", .x = x, .y = speedup, .n = n},
                                {.label = "ideal (W x)", .x = x, .y = ideal, .n = n}};
        PlotSpec spec = {.title = "Step 7: DDP training speed-up over one rank", .xlabel = "world size (ranks)",
                         .ylabel = "speed-up"};
        plot_png(chart, &spec, series, 2);
        printf("Speed-up chart: %s\n", chart);
    }
    free(x), free(speedup), free(ideal), free(worlds), free(times);
}
