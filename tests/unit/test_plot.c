// test_plot.c: plot_png writes a readable PNG of the requested size, with each
// series in its own colour, text and a legend, and survives degenerate input.
//
// The figure is read back with libpng and checked by pixel statistics, not
// against a reference image, so layout tweaks do not break the test.
#include <math.h>
#include <png.h>
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

    unlink(path), unlink(path_small), unlink(path_odd);
    char img_dir[256];
    snprintf(img_dir, sizeof img_dir, "%s/img", dir);
    rmdir(img_dir), rmdir(dir);
    printf("PASS test_plot\n");
    return 0;
}
