// plot.h: line charts as PNG (libpng), readable like matplotlib's defaults.
//
// One call draws a complete figure: title, axes with "nice" ticks and tick
// labels, axis labels, any number of series (distinct colours, optionally with
// a min-max bar at each point), and a legend.
//
//   PlotSeries curve = {.label = "rank 0", .x = steps, .y = losses, .n = n_steps};
//   PlotSpec spec = {.title = "MNIST training loss", .xlabel = "step", .ylabel = "loss"};
//   plot_png("img/loss.png", &spec, &curve, 1);
#pragma once

typedef struct {
    const char *label;   // legend text; NULL or "" leaves the series out of the legend
    const float *x;      // [n]
    const float *y;      // [n]
    int n;
    // [n] each, or NULL: a vertical bar from y_lo[i] to y_hi[i] at x[i], with
    // caps, in the series' colour: the spread of repeated measurements around y.
    const float *y_lo, *y_hi;
} PlotSeries;

typedef struct {
    const char *title;
    const char *xlabel;
    const char *ylabel;
    int width, height;   // pixels; 0 means the default 640 x 480 (matplotlib's 6.4 x 4.8 in at 100 dpi)
    int integer_x;       // nonzero: x ticks at whole numbers only (world sizes: no tick at 1.5 ranks)
} PlotSpec;

// Write the figure to `path` (creating its parent directory if needed).
// Fatal (check.h) on I/O errors, naming the file.
void plot_png(const char *path, const PlotSpec *spec, const PlotSeries *series, int n_series);
