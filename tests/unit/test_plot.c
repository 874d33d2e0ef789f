// test_plot.c: plot_png writes a readable PNG of the requested size, with each
// series in its own colour, text and a legend, and survives degenerate input.
//
// The figure is read back with libpng and checked by pixel statistics, not
// against a reference image, so layout tweaks do not break the test.
#include <math.h>
#include <png.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plot.h"

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

    unlink(path), unlink(path_small), unlink(path_odd);
    char img_dir[256];
    snprintf(img_dir, sizeof img_dir, "%s/img", dir);
    rmdir(img_dir), rmdir(dir);
    printf("PASS test_plot\n");
    return 0;
}
