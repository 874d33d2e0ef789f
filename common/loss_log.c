// loss_log.c: per-step losses. See loss_log.h.
#include "loss_log.h"

#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "plot.h"

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
    FILE *file = fopen(path, "w");
    CHECK_ERRNO(file != NULL, "--losses %s: cannot create", path);
    fprintf(file, "step,epoch,loss\n");
    for (int i = 0; i < log->n; i++) fprintf(file, "%d,%d,%.9g\n", i, log->epoch[i], (double)log->loss[i]);
    CHECK_ERRNO(fclose(file) == 0, "--losses %s: cannot write", path);
}

void loss_log_plot(const LossLog *log, const char *path, const char *title, const char *label) {
    float *steps = xmalloc((size_t)log->n * sizeof(float) + 1);
    for (int i = 0; i < log->n; i++) steps[i] = (float)i;
    PlotSeries curve = {.label = label, .x = steps, .y = log->loss, .n = log->n};
    PlotSpec spec = {.title = title, .xlabel = "step", .ylabel = "training loss"};
    plot_png(path, &spec, &curve, 1);
    free(steps);
}
