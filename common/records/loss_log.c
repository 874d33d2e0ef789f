// loss_log.c: per-step losses. See loss_log.h.
#include "records/loss_log.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/paths.h"
#include "records/plot.h"

void loss_log_add(LossLog *log, int epoch, float loss) {
    if (log->n == log->capacity) {
        log->capacity = log->capacity ? 2 * log->capacity : 256;
        log->epoch = realloc(log->epoch, (size_t)log->capacity * sizeof *log->epoch);
        log->loss = realloc(log->loss, (size_t)log->capacity * sizeof *log->loss);
        CHECK(log->epoch && log->loss, "out of memory for the loss log");
    }
    log->epoch[log->n] = epoch;
    log->loss[log->n] = loss;
    log->n++;
}

void loss_log_free(LossLog *log) {
    free(log->epoch);
    free(log->loss);
    *log = (LossLog){0};
}

void loss_log_write_csv(const LossLog *log, const char *path) {
    char temp[PATH_MAX];  // written there, then renamed over `path`: a failed write keeps the old file
    FILE *file = replace_begin(path, temp, sizeof temp);
    CHECK_ERRNO(file != NULL, "--losses %s: cannot create %s", path, temp);
    fprintf(file, "step,epoch,loss\n");
    for (int i = 0; i < log->n; i++) fprintf(file, "%d,%d,%.9g\n", i, log->epoch[i], (double)log->loss[i]);
    CHECK_ERRNO(replace_commit(file, temp), "--losses %s: cannot write", path);
}

void loss_log_plot(const LossLog *log, const char *path, const char *title, const char *label) {
    float *steps = xmalloc((size_t)log->n * sizeof(float) + 1);
    for (int i = 0; i < log->n; i++) steps[i] = (float)i;
    PlotSeries curve = {.label = label, .x = steps, .y = log->loss, .n = log->n};
    PlotSpec spec = {.title = title, .xlabel = "step", .ylabel = "training loss"};
    plot_png(path, &spec, &curve, 1);
    free(steps);
}

LossLog loss_log_read_csv(const char *path, const char *flag) {
    const char *problem = input_file_problem(path);
    if (problem) usage_error("%s %s: %s, not a CSV file", flag, path, problem);
    FILE *file = fopen(path, "r");
    if (!file) usage_error("%s %s: cannot open: %s", flag, path, strerror(errno));
    LossLog log = {0};
    char line[256];
    if (!fgets(line, sizeof line, file) || strncmp(line, "step,epoch,loss", 15) != 0)
        usage_error("%s %s: expected the header step,epoch,loss (a file written with --losses)", flag, path);
    int step, epoch, line_number = 1;
    float loss;
    while (fgets(line, sizeof line, file)) {
        line_number++;
        if (sscanf(line, "%d,%d,%f", &step, &epoch, &loss) != 3 || step != log.n || epoch < 0)
            usage_error("%s %s: line %d is not 'step,epoch,loss' in order", flag, path, line_number);
        loss_log_add(&log, epoch, loss);
    }
    fclose(file);
    if (log.n == 0) usage_error("%s %s: no steps in the file", flag, path);
    return log;
}

void loss_log_epoch_positions(const LossLog *log, float *x) {
    for (int first = 0; first < log->n;) {  // one epoch at a time
        int end = first;
        while (end < log->n && log->epoch[end] == log->epoch[first]) end++;
        for (int k = first; k < end; k++) x[k] = (float)log->epoch[k] + (float)(k - first + 1) / (float)(end - first);
        first = end;
    }
}

void loss_log_plot_epochs(const LossLog *logs, const char *const *labels, int n_logs, const char *path,
                          const char *title) {
    PlotSeries *series = xcalloc((size_t)n_logs, sizeof(PlotSeries));
    for (int s = 0; s < n_logs; s++) {
        const LossLog *log = &logs[s];
        float *x = xmalloc((size_t)log->n * sizeof(float) + 1);
        loss_log_epoch_positions(log, x);
        series[s] = (PlotSeries){.label = labels[s], .x = x, .y = log->loss, .n = log->n};
    }
    PlotSpec spec = {.title = title, .xlabel = "epoch", .ylabel = "training loss"};
    plot_png(path, &spec, series, n_logs);
    for (int s = 0; s < n_logs; s++) free((void *)series[s].x);
    free(series);
}
