// plot.h: line charts and timelines as PNG (libpng), readable like matplotlib's defaults.
//
// One call draws a complete figure. plot_png: title, axes with "nice" ticks and
// tick labels, axis labels, any number of series (distinct colours, optionally
// with a min-max bar at each point), and a legend.
//
//   PlotSeries curve = {.label = "rank 0", .x = steps, .y = losses, .n = n_steps};
//   PlotSpec spec = {.title = "MNIST training loss", .xlabel = "step", .ylabel = "loss"};
//   plot_png("img/loss.png", &spec, &curve, 1);
//
// plot_panels_png: several such charts stacked in one figure, each with its own
// axes (a training loss per step above a test metric per epoch).
//
// plot_timeline_png: a pipeline's schedule, as the GPipe and 1F1B papers draw
// it. One row per stage, each micro-batch's forward and backward a block from
// its start to its end, labelled with the micro-batch's number; idle time (the
// bubble) is the white between blocks. Panels stack on one time axis, so that
// two schedules, or a measurement and its prediction, line up.
//
//   PlotBlock blocks[] = {{.row = 0, .start = 0, .end = 1.2, .label = 0, .kind = PLOT_FORWARD}, ...};
//   PlotTimelinePanel gpipe = {.title = "GPipe, measured", .n_rows = 4, .blocks = blocks, .n_blocks = n};
//   plot_timeline_png("img/pipeline.png", "4 stages, 8 micro-batches", "time (ms)", &gpipe, 1);
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

// One chart of a stacked figure: its own title, axes, series and legend.
typedef struct {
    PlotSpec spec;       // the first panel's width is the figure's; each panel's height its own (0: 480)
    const PlotSeries *series;
    int n_series;
} PlotPanel;

// Several charts stacked top to bottom in one PNG, each laid out as plot_png lays
// out a figure of its own (two quantities of one run that share no axis: a
// training loss per step above a test metric per epoch). Fatal as plot_png, and
// on no panel.
void plot_panels_png(const char *path, const PlotPanel *panels, int n_panels);

typedef enum { PLOT_FORWARD, PLOT_BACKWARD } PlotBlockKind;  // one colour each, and a legend entry

// One stage's work on one micro-batch: a block on row `row` from `start` to
// `end`, in the time axis' unit. A block of any length shows (1 px at least);
// one with a NaN or infinite time is left out.
typedef struct {
    int row;             // 0 is the panel's top row
    double start, end;
    int label;           // drawn inside the block where it fits (the micro-batch); negative: none
    PlotBlockKind kind;
} PlotBlock;

typedef struct {
    const char *title;               // above the panel, at its left ("GPipe, measured"); NULL: none
    int n_rows;                      // at least 1
    const char *const *row_names;    // [n_rows], top row first; NULL: "stage 0", "stage 1", ...
    const PlotBlock *blocks;         // [n_blocks], in any order; rows may have none (all idle)
    int n_blocks;
} PlotTimelinePanel;

// Write the panels, stacked top to bottom under `title` and a legend (forward,
// backward, idle: white, outlined), on one x axis labelled `xlabel` under the last, to `path` (creating
// its parent directory if needed): 1000 px wide, as tall as the rows need.
// Labels take the body font, or a smaller one where that fits more of them.
// Fatal (check.h) on I/O errors, naming the file, and on what cannot be drawn:
// no panel, a panel without rows, a block outside its panel's rows or of no
// known kind.
void plot_timeline_png(const char *path, const char *title, const char *xlabel,
                       const PlotTimelinePanel *panels, int n_panels);
