// test_plot.c: plot_png writes a readable PNG of the requested size, with each
// series in its own colour, text and a legend, and survives degenerate input;
// plot_panels_png stacks such charts, each in its own band.
// plot_timeline_png draws each block where its times say, in its kind's colour,
// labels only inside their blocks, no block too short to see, and grows with the
// rows. Both end in one line naming the file when it cannot be written.
//
// The figure is read back with libpng and checked by pixel statistics, not
// against a reference image, so layout tweaks do not break the test.
#include <math.h>
#include <png.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "records/plot.h"

#define EXPECT(cond, ...)                                      \
    do {                                                       \
        if (!(cond)) {                                         \
            printf("FAIL test_plot: " __VA_ARGS__);            \
            printf("\n");                                      \
            exit(1);                                           \
        }                                                      \
    } while (0)

typedef struct { int width, height; unsigned char *rgb; } Image;

static Image read_png(const char *path) {
    png_image png = {.version = PNG_IMAGE_VERSION};
    EXPECT(png_image_begin_read_from_file(&png, path), "cannot read %s: %s", path, png.message);
    png.format = PNG_FORMAT_RGB;
    Image im = {(int)png.width, (int)png.height, malloc(PNG_IMAGE_SIZE(png))};
    EXPECT(im.rgb && png_image_finish_read(&png, NULL, im.rgb, 0, NULL),
           "cannot decode %s: %s", path, png.message);
    return im;
}

// Pixels in rows [y0, y1) whose colour is within `tolerance` per channel of 0xRRGGBB.
static int count_near(const Image *im, unsigned rgb, int tolerance, int y0, int y1) {
    int r = rgb >> 16 & 255, g = rgb >> 8 & 255, b = rgb & 255, count = 0;
    for (int y = y0; y < y1; y++)
        for (int x = 0; x < im->width; x++) {
            const unsigned char *p = im->rgb + 3 * ((size_t)y * im->width + x);
            count += abs(p[0] - r) <= tolerance && abs(p[1] - g) <= tolerance && abs(p[2] - b) <= tolerance;
        }
    return count;
}

static int count_dark(const Image *im, int y0, int y1) { return count_near(im, 0x000000, 80, y0, y1); }

static bool is_black(const Image *im, int x, int y) {
    const unsigned char *p = im->rgb + 3 * ((size_t)y * im->width + x);
    return p[0] == 0 && p[1] == 0 && p[2] == 0;
}

// The x ticks of a figure, as data values: found from the pixels, so this
// checks what a reader sees. The bottom of the axes frame is the lowest row
// that is mostly black; its black run gives the frame's left and right
// columns, which map to the visible range, the data's [x_min, x_max] padded as
// plot.c pads it (a flat range opened by 10% of its value, then 5% margins).
// Tick marks hang below the frame (rows bottom+1..+5).
static int x_ticks(const Image *im, double x_min, double x_max, double *ticks, int max_ticks) {
    if (x_max == x_min) x_min -= 0.1 * fabs(x_min), x_max += 0.1 * fabs(x_max);
    double margin = 0.05 * (x_max - x_min), lo = x_min - margin, hi = x_max + margin;
    int bottom = -1, left = -1, right = -1;
    for (int y = im->height - 1; y > im->height / 2 && bottom < 0; y--) {
        int n = 0;
        for (int x = 0; x < im->width; x++) n += is_black(im, x, y);
        if (n > im->width / 2) bottom = y;
    }
    EXPECT(bottom > 0, "no axes frame found");
    for (int x = 0; x < im->width; x++)
        if (is_black(im, x, bottom)) right = x, left = left < 0 ? x : left;
    int n = 0;
    for (int x = left; x <= right && n < max_ticks; x++)
        if (is_black(im, x, bottom + 2)) ticks[n++] = lo + (x - left) * (hi - lo) / (right - left);
    return n;
}

// spec.integer_x: every x tick is a whole number (no tick at 1.5 ranks), for
// the world sizes of step 7's chart and a few other spans.
static void check_integer_ticks(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/ticks.png", dir);
    static const float sizes_1_2_4[] = {1, 2, 4}, sizes_1_4[] = {1, 2, 3, 4}, sizes_1_16[] = {1, 2, 4, 8, 16},
                       sizes_1_2[] = {1, 2}, sizes_1[] = {1}, sizes_1_100[] = {1, 100}, y[] = {1, 1.9f, 3.5f, 6, 11};
    const struct { const float *x; int n, min_ticks; } cases[] = {
        {sizes_1_2_4, 3, 4},  // step 7's default world sizes: ticks 1, 2, 3, 4
        {sizes_1_4, 4, 4},
        {sizes_1_16, 5, 3},   // RANKS="1 2 4 8 16"
        {sizes_1_2, 2, 2},    // a span narrower than the ticks it has room for
        {sizes_1, 1, 1},      // one world size: a tick at 1, none at 0.95
        {sizes_1_100, 2, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        PlotSeries measured = {.label = "measured", .x = cases[c].x, .y = y, .n = cases[c].n};
        PlotSpec spec = {.title = "speed-up", .xlabel = "world size (ranks)", .ylabel = "speed-up", .integer_x = 1};
        plot_png(path, &spec, &measured, 1);
        Image im = read_png(path);
        double ticks[32], x_min = cases[c].x[0], x_max = cases[c].x[cases[c].n - 1];
        int n = x_ticks(&im, x_min, x_max, ticks, 32);
        EXPECT(n >= cases[c].min_ticks, "x data %g..%g: %d x ticks, want at least %d", x_min, x_max, n,
               cases[c].min_ticks);
        for (int i = 0; i < n; i++)  // within 1 px (a tick is at a rounded pixel)
            EXPECT(fabs(ticks[i] - round(ticks[i])) < 0.01 * fmax(1, x_max - x_min),
                   "x data %g..%g: a tick at %.3f, not a whole number", x_min, x_max, ticks[i]);
        free(im.rgb);
    }
    // Without integer_x, 1, 2, 4 keep their half ticks, and the tick finder sees them.
    PlotSeries measured = {.label = "measured", .x = sizes_1_2_4, .y = y, .n = 3};
    PlotSpec spec = {.title = "speed-up", .xlabel = "world size (ranks)", .ylabel = "speed-up"};
    plot_png(path, &spec, &measured, 1);
    Image im = read_png(path);
    double ticks[32];
    int n = x_ticks(&im, 1, 4, ticks, 32), halves = 0;
    for (int i = 0; i < n; i++) halves += fabs(ticks[i] - round(ticks[i] - 0.5) - 0.5) < 0.01 * 3;
    EXPECT(halves > 0, "without integer_x: %d x ticks, none at a half: the tick finder misses them", n);
    free(im.rgb);
    unlink(path);
    printf("PASS test_plot: integer_x puts the x ticks at whole numbers only (x data 1..4, 1..16, 1..2, 1, 1..100)\n");
}

// Pixels in rows [y0, y1) tinted by the first series' blue, anti-aliased
// edges included: everything else (white, black, the legend's grey) is grey.
static int count_blue(const Image *im, int y0, int y1) {
    int count = 0;
    for (int y = y0; y < y1; y++)
        for (int x = 0; x < im->width; x++) {
            const unsigned char *p = im->rgb + 3 * ((size_t)y * im->width + x);
            count += p[2] - p[0] > 30;
        }
    return count;
}

// y_lo and y_hi draw a bar at each point, in the series' colour, and widen
// the y range to hold it: a flat series with bars has its colour far above and
// below its line; without them, none. A NaN end draws no bar.
static void check_bars(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/bars.png", dir);
    float x[3] = {1, 2, 4}, y[3] = {1, 1, 1}, lo[3] = {0.2f, 0.6f, 0.9f}, hi[3] = {1.8f, 1.4f, NAN};
    PlotSpec spec = {.title = "bars", .xlabel = "world size (ranks)", .ylabel = "speed-up", .integer_x = 1};
    int above[2], below[2];
    for (int with_bars = 0; with_bars < 2; with_bars++) {
        PlotSeries median = {.label = NULL, .x = x, .y = y, .n = 3};  // no legend: its sample is blue too
        if (with_bars) median.y_lo = lo, median.y_hi = hi;
        plot_png(path, &spec, &median, 1);
        Image im = read_png(path);
        above[with_bars] = count_blue(&im, 0, im.height / 2 - 30);
        below[with_bars] = count_blue(&im, im.height / 2 + 30, im.height);
        free(im.rgb);
    }
    EXPECT(above[0] == 0 && below[0] == 0, "no bars asked: %d and %d pixels of the series' colour off its line",
           above[0], below[0]);
    EXPECT(above[1] > 100 && below[1] > 100, "bars from 0.2 to 1.8 around y = 1: only %d pixels of them above "
           "and %d below the line", above[1], below[1]);
    unlink(path);
    printf("PASS test_plot: y_lo and y_hi draw a min-max bar at each point and widen the y range to hold it\n");
}

// The legend goes where it hides the least ink, as matplotlib's loc="best": with
// lines through all four corners (an X), it leaves the corners for the middle
// of a side, where the X leaves room.
static void check_legend_place(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/legend.png", dir);
    float x[2] = {0, 1}, up[2] = {0, 1}, down[2] = {1, 0};
    PlotSeries cross[2] = {{.label = "rising", .x = x, .y = up, .n = 2}, {.label = "falling", .x = x, .y = down, .n = 2}};
    PlotSpec spec = {.title = "an X", .xlabel = "x", .ylabel = "y"};
    plot_png(path, &spec, cross, 2);
    Image im = read_png(path);
    int top = 0, middle = 0, bottom = 0;  // the legend frame's grey, by thirds of the height
    for (int y = 0; y < im.height; y++) {
        int n = count_near(&im, 0xcccccc, 0, y, y + 1);
        if (y < im.height / 3) top += n;
        else if (y < 2 * im.height / 3) middle += n;
        else bottom += n;
    }
    EXPECT(middle > 50 && top == 0 && bottom == 0, "lines through every corner: the legend's frame has %d grey "
           "pixels in the top third, %d in the middle, %d in the bottom; want it in the middle only", top, middle, bottom);
    free(im.rgb);
    unlink(path);
    printf("PASS test_plot: the legend avoids the lines: with an X through every corner, it sits mid-side\n");
}

// plot_panels_png stacks whole charts: each panel in its own band of rows, with
// its own title, axes and colours (each panel's first series is blue again),
// the figure as wide as the first panel and as tall as all of them.
static void check_panels(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/panels.png", dir);
    enum { N = 50 };
    float x[N], loss[N], rmse[N], baseline[2] = {1.0f, 1.0f}, ends[2] = {0, N - 1};
    for (int i = 0; i < N; i++) x[i] = (float)i, loss[i] = 2.0f * expf(-i / 10.0f), rmse[i] = 0.9f - 0.002f * i;
    PlotSeries top[1] = {{.label = "training loss", .x = x, .y = loss, .n = N}};
    PlotSeries bottom[2] = {{.label = "test RMSE", .x = x, .y = rmse, .n = N},
                            {.label = "baseline", .x = ends, .y = baseline, .n = 2}};
    PlotPanel panels[2] = {
        {.spec = {.title = "loss", .xlabel = "epoch", .ylabel = "loss"}, .series = top, .n_series = 1},
        {.spec = {.title = "RMSE", .xlabel = "epoch", .ylabel = "RMSE", .height = 360}, .series = bottom, .n_series = 2},
    };
    plot_panels_png(path, panels, 2);
    Image im = read_png(path);
    EXPECT(im.width == 640 && im.height == 480 + 360, "two panels of 480 and 360 rows make %dx%d, want 640x840",
           im.width, im.height);
    EXPECT(count_near(&im, 0x1f77b4, 24, 0, 480) > 150 && count_near(&im, 0x1f77b4, 24, 480, im.height) > 150,
           "each panel's first series in tab10's blue: %d pixels above row 480, %d below",
           count_near(&im, 0x1f77b4, 24, 0, 480), count_near(&im, 0x1f77b4, 24, 480, im.height));
    EXPECT(count_near(&im, 0xff7f0e, 24, 0, 480) == 0 && count_near(&im, 0xff7f0e, 24, 480, im.height) > 100,
           "the second panel's second series (orange) only in its band: %d pixels above row 480, %d below",
           count_near(&im, 0xff7f0e, 24, 0, 480), count_near(&im, 0xff7f0e, 24, 480, im.height));
    EXPECT(count_dark(&im, 0, 48) > 30 && count_dark(&im, 480, 480 + 40) > 30, "a title at the top of each panel");
    free(im.rgb);
    unlink(path);
    printf("PASS test_plot: plot_panels_png stacks charts, each in its own band with its own title, axes and colours\n");
}

// ---------------------------------------------------------------- timelines

enum { FORWARD = 0x1f77b4, BACKWARD = 0xff7f0e, WHITE = 0xffffff };  // the blocks' colours, the background

static unsigned pixel(const Image *im, int x, int y) {
    const unsigned char *p = im->rgb + 3 * ((size_t)y * im->width + x);
    return (unsigned)p[0] << 16 | (unsigned)p[1] << 8 | p[2];
}

// Where a timeline's panels are, found from the pixels: each panel's frame is
// a pair of rows mostly black (top, bottom), over the same columns (left,
// right). Its n_rows stages share the rows between, top first. Times map to
// columns as plot.c maps them: the blocks' [t_min, t_max] padded by 2% each
// side, onto the frame's columns.
typedef struct {
    int left, right, n_frames, tops[8], bottoms[8];
    double lo, hi;
} TimelineAxes;

static TimelineAxes find_timeline_axes(const Image *im, double t_min, double t_max) {
    TimelineAxes axes = {.left = -1, .right = -1};
    int lines = 0, line_rows[16];
    for (int y = 0; y < im->height && lines < 16; y++) {
        int n = 0;
        for (int x = 0; x < im->width; x++) n += is_black(im, x, y);
        if (n > im->width / 2) line_rows[lines++] = y;
    }
    EXPECT(lines >= 2 && lines % 2 == 0, "timeline: %d frame lines, want a top and a bottom per panel", lines);
    axes.n_frames = lines / 2;
    for (int i = 0; i < axes.n_frames; i++) axes.tops[i] = line_rows[2 * i], axes.bottoms[i] = line_rows[2 * i + 1];
    for (int x = 0; x < im->width; x++)
        if (is_black(im, x, axes.tops[0])) axes.right = x, axes.left = axes.left < 0 ? x : axes.left;
    double margin = 0.02 * (t_max - t_min);
    axes.lo = t_min - margin, axes.hi = t_max + margin;
    return axes;
}

static int time_to_x(const TimelineAxes *axes, double t) {
    return (int)lround(axes->left + (t - axes->lo) / (axes->hi - axes->lo) * (axes->right - axes->left));
}

// The middle pixel row of stage `row` (of n_rows) in panel `panel`.
static int row_middle(const TimelineAxes *axes, int panel, int row, int n_rows) {
    double row_height = (axes->bottoms[panel] - axes->tops[panel] - 1) / (double)n_rows;
    return axes->tops[panel] + 1 + (int)((row + 0.5) * row_height);
}

// Pixels of colour `rgb` in columns [x0, x1] of pixel row y.
static int count_in_row(const Image *im, unsigned rgb, int x0, int x1, int y) {
    int n = 0;
    for (int x = x0; x <= x1; x++) n += pixel(im, x, y) == rgb;
    return n;
}

// Two panels of a hand-made 2-stage schedule, the second shifted right: each
// block is where its times say, in its kind's colour and labelled in it; idle
// time is white; the last block ends inside the frame; a block far shorter than
// a pixel still shows.
static void check_timeline_blocks(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/timeline.png", dir);
    const PlotBlock first[] = {
        {.row = 0, .start = 0, .end = 2, .label = 0, .kind = PLOT_FORWARD},
        {.row = 1, .start = 2, .end = 4, .label = 0, .kind = PLOT_FORWARD},
        {.row = 1, .start = 4, .end = 8, .label = 0, .kind = PLOT_BACKWARD},
        {.row = 0, .start = 8, .end = 12, .label = 0, .kind = PLOT_BACKWARD},
        {.row = 1, .start = 10, .end = 10.0001, .label = 1, .kind = PLOT_FORWARD},  // 0.007 px
    };
    const PlotBlock second[] = {
        {.row = 0, .start = 1, .end = 3, .label = 7, .kind = PLOT_FORWARD},
        {.row = 0, .start = 9, .end = 13, .label = 7, .kind = PLOT_BACKWARD},  // the last time of all
    };
    const char *const names[] = {"stage 0", "stage 1"};
    const PlotTimelinePanel panels[2] = {
        {.title = "GPipe, measured", .n_rows = 2, .row_names = names, .blocks = first, .n_blocks = 5},
        {.title = "1F1B, predicted", .n_rows = 1, .blocks = second, .n_blocks = 2},
    };
    plot_timeline_png(path, "2 stages", "time (ms)", panels, 2);
    Image im = read_png(path);
    EXPECT(im.width == 1000, "timeline width %d, want 1000", im.width);
    TimelineAxes axes = find_timeline_axes(&im, 0, 13);
    EXPECT(axes.n_frames == 2, "timeline of 2 panels: %d frames", axes.n_frames);

    // Each block's colour a quarter of the way in (its label is in the middle), on its row's middle.
    for (int p = 0; p < 2; p++) {
        const PlotTimelinePanel *panel = &panels[p];
        for (int b = 0; b < panel->n_blocks; b++) {
            const PlotBlock *block = &panel->blocks[b];
            if (block->end - block->start < 1) continue;
            int y = row_middle(&axes, p, block->row, panel->n_rows);
            int x = time_to_x(&axes, block->start + 0.25 * (block->end - block->start));
            unsigned want = block->kind == PLOT_FORWARD ? FORWARD : BACKWARD, got = pixel(&im, x, y);
            EXPECT(got == want, "panel %d, block %d (row %d, %g..%g ms): #%06x at its pixel (%d, %d), want #%06x",
                   p, b, block->row, block->start, block->end, got, x, y, want);
            // Its label: white on the blue, black on the orange, in the middle of the block.
            int x0 = time_to_x(&axes, block->start) + 2, x1 = time_to_x(&axes, block->end) - 3, ink = 0;
            unsigned label_colour = block->kind == PLOT_FORWARD ? WHITE : 0x000000;
            for (int dy = -4; dy <= 4; dy++) ink += count_in_row(&im, label_colour, x0, x1, y + dy);
            EXPECT(ink >= 5, "panel %d, block %d: %d pixels of its label (#%06x) in it", p, b, ink, label_colour);
        }
    }
    // Back to back, forward then backward at 4 ms on stage 1: a white column parts them.
    int y = row_middle(&axes, 0, 1, 2), join_x = time_to_x(&axes, 4);
    EXPECT(count_in_row(&im, WHITE, join_x - 2, join_x, y) >= 1,
           "stage 1's blocks meeting at 4 ms: no white column between them (columns %d..%d)", join_x - 2, join_x);
    // Idle: stage 0 between its forward (ends at 2) and its backward (starts at 8), in both panels.
    for (int p = 0; p < 2; p++) {
        int idle_y = row_middle(&axes, p, 0, panels[p].n_rows), idle_x = time_to_x(&axes, 5.5);
        EXPECT(pixel(&im, idle_x, idle_y) == WHITE, "panel %d: #%06x at 5.5 ms on stage 0, idle there, want white",
               p, pixel(&im, idle_x, idle_y));
    }
    // The block that ends last (13 ms) is whole, not cut by the frame: its colour
    // reaches to 2 px before its end's column, and the frame's right edge lies
    // beyond that column.
    y = row_middle(&axes, 1, 0, 1);
    int end_x = time_to_x(&axes, 13);
    EXPECT(end_x < axes.right && pixel(&im, end_x - 2, y) == BACKWARD && is_black(&im, axes.right, y),
           "the last block (9..13 ms) ends at column %d: #%06x just before it; frame at %d", end_x,
           pixel(&im, end_x - 2, y), axes.right);
    // A block of 0.0001 ms, far less than a pixel, is still there: 1 px of blue.
    y = row_middle(&axes, 0, 1, 2);
    int tiny_x = time_to_x(&axes, 10);
    EXPECT(count_in_row(&im, FORWARD, tiny_x - 1, tiny_x + 1, y) >= 1,
           "a block of 0.0001 ms at 10 ms on stage 1: no blue pixel there, it vanished");
    // And its neighbours are idle: it did not grow.
    EXPECT(count_in_row(&im, FORWARD, tiny_x - 6, tiny_x + 6, y) <= 2,
           "a block of 0.0001 ms: %d blue pixels around 10 ms, want 1 (2 at a rounding)",
           count_in_row(&im, FORWARD, tiny_x - 6, tiny_x + 6, y));
    // The legend: both colours above the first panel.
    EXPECT(count_near(&im, FORWARD, 0, 0, axes.tops[0]) > 50 && count_near(&im, BACKWARD, 0, 0, axes.tops[0]) > 50,
           "no legend (forward, backward) above the panels");
    free(im.rgb);
    unlink(path);
    printf("PASS test_plot: a timeline's blocks are where their times say, in their kind's colour, labelled; idle "
           "is white; the last ends inside the frame; a 0.0001 ms block shows as 1 px\n");
}

// GPipe's schedule: stage s runs forward i at (s + i), 1 unit long, then the
// backwards (2 units) from the last stage up. Returns the number of blocks.
static int gpipe_blocks(int stages, int micro_batches, PlotBlock *blocks) {
    int n = 0, backward_start = stages + micro_batches - 1;
    for (int s = 0; s < stages; s++)
        for (int i = 0; i < micro_batches; i++) {
            blocks[n++] = (PlotBlock){.row = s, .start = s + i, .end = s + i + 1, .label = i, .kind = PLOT_FORWARD};
            double start = backward_start + 2 * (stages - 1 - s) + 2 * i;
            blocks[n++] = (PlotBlock){.row = s, .start = start, .end = start + 2, .label = i, .kind = PLOT_BACKWARD};
        }
    return n;
}

// A dense timeline (GPipe, `n_panels` times): every backward block carries its
// label (black on the orange), and no label ink is outside a block: each run of
// black on a stage's row has orange on both sides.
static void check_dense_labels(const Image *im, const PlotBlock *blocks, int n_blocks, int stages, int n_panels) {
    double t_max = 0;
    for (int b = 0; b < n_blocks; b++) t_max = fmax(t_max, blocks[b].end);
    TimelineAxes axes = find_timeline_axes(im, 0, t_max);
    int labelled = 0, backwards = 0, stray = 0;
    for (int p = 0; p < n_panels; p++) {
        for (int b = 0; b < n_blocks; b++) {
            if (blocks[b].kind != PLOT_BACKWARD) continue;
            backwards++;
            int y = row_middle(&axes, p, blocks[b].row, stages), ink = 0;
            int x0 = time_to_x(&axes, blocks[b].start) + 1, x1 = time_to_x(&axes, blocks[b].end) - 2;
            for (int dy = -6; dy <= 6; dy++) ink += count_in_row(im, 0x000000, x0, x1, y + dy);
            labelled += ink > 0;
        }
        for (int y = axes.tops[p] + 1; y < axes.bottoms[p]; y++)
            for (int x = axes.left + 1; x < axes.right; x++) {
                bool run_starts = is_black(im, x, y) && (x == axes.left + 1 || !is_black(im, x - 1, y));
                if (!run_starts) continue;  // (a run at the frame's left edge has the frame's black beside it)
                int end = x;
                while (end + 1 < axes.right && is_black(im, end + 1, y)) end++;
                stray += pixel(im, x - 1, y) != BACKWARD || pixel(im, end + 1, y) != BACKWARD;
            }
    }
    EXPECT(labelled == backwards, "%d stages, %d blocks: %d of the %d backward blocks labelled", stages, n_blocks,
           labelled, backwards);
    EXPECT(stray == 0, "%d stages, %d blocks: %d runs of label ink not inside an orange block", stages, n_blocks,
           stray);
}

// The height grows with the rows and the panels: the same step for each row,
// whichever panel it is in; the width stays. At 8 stages x 32 micro-batches,
// every backward block is labelled, and labels are inside their blocks only.
static void check_timeline_sizes(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/timeline_sizes.png", dir);
    static PlotBlock blocks[2][2 * 8 * 32];
    // Stages of the first panel and of the second (0: one panel only), micro-batches.
    const struct { int stages[2], micro_batches; } cases[] = {
        {{1, 0}, 1}, {{2, 0}, 1}, {{8, 0}, 1}, {{8, 1}, 1}, {{8, 8}, 1}, {{8, 8}, 32},
    };
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    int heights[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        PlotTimelinePanel panels[2];
        int n_panels = cases[c].stages[1] > 0 ? 2 : 1;
        for (int p = 0; p < n_panels; p++) {
            int n = gpipe_blocks(cases[c].stages[p], cases[c].micro_batches, blocks[p]);
            panels[p] = (PlotTimelinePanel){.title = "GPipe", .n_rows = cases[c].stages[p], .blocks = blocks[p],
                                            .n_blocks = n};
        }
        plot_timeline_png(path, "GPipe", "time (ms)", panels, n_panels);
        Image im = read_png(path);
        EXPECT(im.width == 1000, "stages %d and %d, %d micro-batches: width %d, want 1000", cases[c].stages[0],
               cases[c].stages[1], cases[c].micro_batches, im.width);
        heights[c] = im.height;
        if (cases[c].micro_batches == 32) check_dense_labels(&im, panels[0].blocks, panels[0].n_blocks, 8, 2);
        free(im.rgb);
    }
    int step = heights[1] - heights[0];
    EXPECT(step > 0 && heights[2] - heights[0] == 7 * step,
           "one panel of 1, 2, 8 stages: %d, %d, %d px high, not the same step for each row", heights[0], heights[1],
           heights[2]);
    EXPECT(heights[3] > heights[2] && heights[4] - heights[3] == 7 * step,
           "8 stages, then a second panel of 1 and of 8: %d, %d, %d px high, want each of its rows a step of %d",
           heights[2], heights[3], heights[4], step);
    EXPECT(heights[5] == heights[4], "2 panels of 8 stages: %d px high with 1 micro-batch, %d with 32: the blocks "
           "changed the height", heights[4], heights[5]);
    unlink(path);
    printf("PASS test_plot: a timeline grows by one step per stage, in any panel, at 1000 px wide; at 8 stages x 32 "
           "micro-batches every backward block is labelled, and labels are inside their blocks only\n");
}

// Run `draw` in a child, its stderr into `message` (the whole of it); return its exit status.
static int fatal_in_child(void (*draw)(const char *), const char *path, char *message, size_t size) {
    int pipe_fds[2];
    EXPECT(pipe(pipe_fds) == 0, "pipe failed");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipe_fds[1], STDERR_FILENO);
        close(pipe_fds[0]);
        draw(path);
        _exit(0);
    }
    close(pipe_fds[1]);
    size_t used = 0;
    for (ssize_t got; used < size - 1 && (got = read(pipe_fds[0], message + used, size - 1 - used)) > 0;)
        used += (size_t)got;
    message[used] = '\0';
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static const PlotBlock ONE_BLOCK = {.row = 0, .start = 0, .end = 1, .label = 0, .kind = PLOT_FORWARD};

static void draw_timeline(const char *path) {
    PlotTimelinePanel panel = {.title = "GPipe", .n_rows = 1, .blocks = &ONE_BLOCK, .n_blocks = 1};
    plot_timeline_png(path, "title", "time (ms)", &panel, 1);
}

static void draw_line_chart(const char *path) {
    float x[2] = {0, 1}, y[2] = {1, 0};
    PlotSeries series = {.label = "loss", .x = x, .y = y, .n = 2};
    PlotSpec spec = {.title = "loss"};
    plot_png(path, &spec, &series, 1);
}

static void draw_timeline_bad_row(const char *path) {
    PlotBlock block = ONE_BLOCK;
    block.row = 4;
    PlotTimelinePanel panel = {.title = "GPipe", .n_rows = 4, .blocks = &block, .n_blocks = 1};
    plot_timeline_png(path, "title", "time (ms)", &panel, 1);
}

// Both kinds of figure, where the file cannot be written (under a plain file),
// end the program with status 1 and one line that names the file; a block on
// a row the panel does not have ends it with one line that says so.
static void check_fatal_errors(const char *dir) {
    char plain[256], path[300], message[2048];
    snprintf(plain, sizeof plain, "%s/plain", dir);
    FILE *file = fopen(plain, "w");
    EXPECT(file && fclose(file) == 0, "cannot create %s", plain);
    snprintf(path, sizeof path, "%s/figure.png", plain);
    void (*const draws[2])(const char *) = {draw_timeline, draw_line_chart};
    const char *const names[2] = {"plot_timeline_png", "plot_png"};
    for (int k = 0; k < 2; k++) {
        int status = fatal_in_child(draws[k], path, message, sizeof message);
        char *newline = strchr(message, '\n');
        EXPECT(status == 1 && newline && newline[1] == '\0' && strstr(message, "plain/figure.png"),
               "%s to %s: exit %d, want 1 and one line naming the file; stderr: \"%s\"", names[k], path, status,
               message);
    }
    snprintf(path, sizeof path, "%s/bad_row.png", dir);
    int status = fatal_in_child(draw_timeline_bad_row, path, message, sizeof message);
    char *newline = strchr(message, '\n');
    EXPECT(status == 1 && newline && newline[1] == '\0' && strstr(message, "row 4") &&
           strstr(message, "bad_row.png") && access(path, F_OK) != 0,
           "a block on row 4 of 4 rows: exit %d, want 1 and one line naming it, no file; stderr: \"%s\"", status,
           message);
    unlink(plain);
    printf("PASS test_plot: an unwritable file is one line naming it and exit 1, from plot_png and "
           "plot_timeline_png; so is a block on a row its panel does not have\n");
}

int main(void) {
    char dir[] = "/tmp/test_plot_XXXXXX";
    EXPECT(mkdtemp(dir), "mkdtemp failed");
    char path[256], path_small[256], path_odd[256];
    snprintf(path, sizeof path, "%s/img/loss.png", dir);  // img/ does not exist yet
    snprintf(path_small, sizeof path_small, "%s/img/small.png", dir);
    snprintf(path_odd, sizeof path_odd, "%s/odd.png", dir);

    // A training-like figure: decaying loss, a slower second curve, an accuracy-like third.
    enum { N = 200 };
    float step[N], loss[N], loss4[N], third[N];
    for (int i = 0; i < N; i++) {
        step[i] = (float)i;
        loss[i] = 0.3f + 2.0f * expf(-i / 25.0f) + 0.05f * sinf(i * 1.7f);
        loss4[i] = 0.3f + 2.0f * expf(-i / 50.0f);
        third[i] = 1.0f + 0.5f * (float)i / N;
    }
    PlotSeries series[3] = {
        {.label = "1 rank", .x = step, .y = loss, .n = N},
        {.label = "4 ranks", .x = step, .y = loss4, .n = N},
        {.label = "other", .x = step, .y = third, .n = N},
    };
    PlotSpec spec = {.title = "MNIST training loss", .xlabel = "step", .ylabel = "loss"};
    plot_png(path, &spec, series, 3);

    Image im = read_png(path);
    EXPECT(im.width == 640 && im.height == 480, "default size is %dx%d, want 640x480", im.width, im.height);
    int white = count_near(&im, 0xffffff, 0, 0, im.height);
    EXPECT(white < im.width * im.height - 2000, "image is (nearly) blank: %d white pixels", white);
    EXPECT(white > im.width * im.height / 2, "background is not white: only %d white pixels", white);
    const unsigned colours[3] = {0x1f77b4, 0xff7f0e, 0x2ca02c};  // tab10, in series order
    for (int s = 0; s < 3; s++) {
        int n = count_near(&im, colours[s], 24, 0, im.height);
        EXPECT(n > 150, "series %d: only %d pixels near #%06x", s, n, colours[s]);
    }
    EXPECT(count_near(&im, 0xd62728, 24, 0, im.height) == 0, "a 4th colour appears with only 3 series");
    EXPECT(count_dark(&im, 0, 48) > 30, "no title text in the top rows");
    EXPECT(count_dark(&im, im.height - 40, im.height) > 20, "no x-axis label or tick labels at the bottom");
    EXPECT(count_near(&im, 0xcccccc, 0, 0, im.height) > 50, "no grey legend frame");
    free(im.rgb);

    // A custom size round-trips.
    PlotSpec small = {.title = "small", .xlabel = "x", .ylabel = "y", .width = 300, .height = 200};
    plot_png(path_small, &small, series, 2);
    im = read_png(path_small);
    EXPECT(im.width == 300 && im.height == 200, "custom size is %dx%d, want 300x200", im.width, im.height);
    EXPECT(count_near(&im, 0x1f77b4, 24, 0, im.height) > 50, "small figure: first series missing");
    free(im.rgb);

    // Degenerate input: an empty series, constant y, one point, NaN/Inf, no labels.
    float flat[3] = {0.5f, 0.5f, 0.5f}, xs[3] = {0, 1, 2}, one = 7.0f;
    float holes[4] = {1.0f, NAN, INFINITY, 2.0f}, xh[4] = {0, 1, 2, 3};
    PlotSeries odd[4] = {
        {.label = "empty", .x = NULL, .y = NULL, .n = 0},
        {.label = "flat", .x = xs, .y = flat, .n = 3},
        {.label = NULL, .x = &one, .y = &one, .n = 1},
        {.label = "", .x = xh, .y = holes, .n = 4},
    };
    PlotSpec bare = {0};
    plot_png(path_odd, &bare, odd, 1);  // only the empty series: no data at all
    plot_png(path_odd, &bare, NULL, 0);
    plot_png(path_odd, &spec, odd, 2);  // constant y
    plot_png(path_odd, &spec, odd + 2, 1);  // a single point
    plot_png(path_odd, &spec, odd, 4);
    im = read_png(path_odd);
    EXPECT(im.width == 640 && im.height == 480, "degenerate figure is %dx%d", im.width, im.height);
    EXPECT(count_near(&im, 0xff7f0e, 24, 0, im.height) > 20, "constant series not drawn");
    free(im.rgb);

    check_integer_ticks(dir);
    check_bars(dir);
    check_legend_place(dir);
    check_panels(dir);
    check_timeline_blocks(dir);
    check_timeline_sizes(dir);
    check_fatal_errors(dir);

    unlink(path), unlink(path_small), unlink(path_odd);
    char img_dir[256];
    snprintf(img_dir, sizeof img_dir, "%s/img", dir);
    rmdir(img_dir), rmdir(dir);
    printf("PASS test_plot\n");
    return 0;
}
