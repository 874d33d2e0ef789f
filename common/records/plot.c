// plot.c: line charts and pipeline timelines as PNG, drawn pixel by pixel into
// an RGB buffer. See plot.h.
//
// Nothing here needs a graphics library beyond libpng: text uses embedded
// public-domain bitmap fonts (font.h), lines are anti-aliased by the distance
// of each pixel centre to the segment, and the layout follows matplotlib's
// defaults: axes at 12.5%..90% x 11%..88% of the figure (wider where labels
// need it), ticks outside, 5% data margins, tab10 colours, legend in the
// emptiest place. A timeline shares the fonts, ticks, frame and legend: 24 px
// per stage, its time axis padded 2%, the legend beside the title.
#include "base/paths.h"
#include "records/plot.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <png.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/check.h"
#include "records/font.h"

typedef struct { uint8_t r, g, b; } Rgb;

// matplotlib's default colour cycle ("tab10").
static const Rgb TAB10[10] = {
    {0x1f, 0x77, 0xb4}, {0xff, 0x7f, 0x0e}, {0x2c, 0xa0, 0x2c}, {0xd6, 0x27, 0x28}, {0x94, 0x67, 0xbd},
    {0x8c, 0x56, 0x4b}, {0xe3, 0x77, 0xc2}, {0x7f, 0x7f, 0x7f}, {0xbc, 0xbd, 0x22}, {0x17, 0xbe, 0xcf},
};
static const Rgb BLACK = {0, 0, 0}, WHITE = {255, 255, 255}, LEGEND_EDGE = {0xcc, 0xcc, 0xcc};

// Layout in pixels (matplotlib's points at 100 dpi, rounded).
enum {
    DEFAULT_WIDTH = 640, DEFAULT_HEIGHT = 480,
    PAD = 8,                 // figure edge to the outermost text
    TICK_LEN = 5, TICK_PAD = 4,
    LABEL_GAP = 6,           // tick labels to axis label
    TITLE_GAP = 8,           // title to axes frame
    LEGEND_INSET = 8, LEGEND_PAD = 6, LEGEND_ROW_GAP = 4, SAMPLE_LEN = 24, SAMPLE_GAP = 8,
    LEGEND_COLUMN_GAP = 20,  // between entries side by side: matplotlib's columnspacing, 2 em
    PATCH_INSET = 2,         // a filled sample's top and bottom inside the text's rows
    MAX_TICKS = 12,
};
static const double LINE_HALF_WIDTH = 1.0;  // 2 px lines, matplotlib's 1.5 pt
static const double DOT_RADIUS = 2.5;       // a point with no neighbour to join
static const double BAR_HALF_WIDTH = 0.6;   // min-max bars, thinner than the line
static const double CAP_HALF_LENGTH = 4.0;  // their caps: 3 pt at 100 dpi
static const double DATA_MARGIN = 0.05;     // matplotlib's axes.xmargin / ymargin

// ---------------------------------------------------------------- raster

typedef struct { int width, height; uint8_t *rgb; } Canvas;

static Canvas canvas_new(int width, int height) {
    Canvas c = {width, height, xmalloc((size_t)3 * width * height)};
    memset(c.rgb, 255, (size_t)3 * width * height);  // white
    return c;
}

// Mix `color` into pixel (x, y) with weight `coverage`; pixels off the canvas are clipped.
static void blend(Canvas *c, int x, int y, Rgb color, double coverage) {
    if (x < 0 || y < 0 || x >= c->width || y >= c->height || coverage <= 0) return;
    if (coverage > 1) coverage = 1;
    uint8_t *p = c->rgb + 3 * ((size_t)y * c->width + x);
    const uint8_t rgb[3] = {color.r, color.g, color.b};
    for (int k = 0; k < 3; k++) p[k] = (uint8_t)lround(p[k] + (rgb[k] - p[k]) * coverage);
}

static void fill_rect(Canvas *c, int x0, int y0, int x1, int y1, Rgb color) {  // inclusive corners
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++) blend(c, x, y, color, 1);
}

static void frame_rect(Canvas *c, int x0, int y0, int x1, int y1, Rgb color) {
    fill_rect(c, x0, y0, x1, y0, color);
    fill_rect(c, x0, y1, x1, y1, color);
    fill_rect(c, x0, y0, x0, y1, color);
    fill_rect(c, x1, y0, x1, y1, color);
}

static int text_width(const BitmapFont *font, const char *s) { return font->width * (int)strlen(s); }

// Draw `s` in `color` with the top-left corner of its bounding box at (x, y).
// Vertical text is turned 90 degrees counter-clockwise (read bottom to top, like
// matplotlib's y-axis label), so its box is font->height wide and text_width() tall.
static void draw_text(Canvas *c, const BitmapFont *font, const char *s, int x, int y, bool vertical,
                      Rgb color) {
    int length = text_width(font, s);
    for (int i = 0; s[i]; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 32 || ch > 126) ch = '?';
        const uint16_t *rows = font->glyphs + (ch - 32) * font->height;
        for (int v = 0; v < font->height; v++)
            for (int u = 0; u < font->width; u++) {
                if (!(rows[v] >> (font->width - 1 - u) & 1)) continue;
                int along = i * font->width + u;  // position along the reading direction
                if (vertical) blend(c, x + v, y + length - 1 - along, color, 1);
                else blend(c, x + along, y + v, color, 1);
            }
    }
}

// Stroke one segment into `mask` (w x h coverage values, pixel centres at integer
// coordinates). Coverage is how far a pixel centre lies inside the stroke's edge,
// clamped to [0, 1]; taking the maximum, rather than blending each segment, keeps
// the joints of a dense polyline from darkening. A zero-length segment is a dot.
static void stroke_segment(float *mask, int w, int h, double x0, double y0, double x1, double y1,
                           double half_width) {
    const double reach = half_width + 0.5;
    // Clamp in double before converting: a point far outside must not overflow int.
    int xa = (int)fmax(0, floor(fmin(x0, x1) - reach)), xb = (int)fmin(w - 1, ceil(fmax(x0, x1) + reach));
    int ya = (int)fmax(0, floor(fmin(y0, y1) - reach)), yb = (int)fmin(h - 1, ceil(fmax(y0, y1) + reach));
    double dx = x1 - x0, dy = y1 - y0, length2 = dx * dx + dy * dy;
    for (int y = ya; y <= yb; y++)
        for (int x = xa; x <= xb; x++) {
            double t = length2 > 0 ? ((x - x0) * dx + (y - y0) * dy) / length2 : 0;
            t = fmin(1, fmax(0, t));  // nearest point on the segment, not the infinite line
            float coverage = (float)fmin(1, reach - hypot(x0 + t * dx - x, y0 + t * dy - y));
            if (coverage > mask[(size_t)y * w + x]) mask[(size_t)y * w + x] = coverage;
        }
}

// ---------------------------------------------------------------- axes and ticks

typedef struct {
    double lo, hi;           // visible data range
    double first, step;      // ticks at first + i * step
    int n_ticks;
    char labels[MAX_TICKS][32];
    int label_width;         // widest tick label, pixels
} Axis;

// Widen [lo, hi] like matplotlib: open up a flat range (one point, constant loss)
// around its value, then add `margin` (a fraction of the range) on each side.
// No data at all: [0, 1].
static void pad_range(Axis *a, double margin_fraction) {
    if (!(a->lo <= a->hi)) { a->lo = 0; a->hi = 1; return; }
    if (a->hi - a->lo <= 1e-12 * fmax(1, fabs(a->lo))) {
        double half = a->lo != 0 ? 0.1 * fabs(a->lo) : 1;
        a->lo -= half;
        a->hi += half;
    }
    double margin = margin_fraction * (a->hi - a->lo);
    a->lo -= margin;
    a->hi += margin;
}

// Fewest decimals that print `step` exactly (0.25 -> 2, 0.5 -> 1, 50 -> 0), so
// labels read "0.5" and never "0.30000001". One count per axis, as matplotlib.
static int decimals_for(double step) {
    int d = 0;
    while (d < 9 && fabs(step * pow(10, d) - round(step * pow(10, d))) > 1e-6 * step * pow(10, d)) d++;
    return d;
}

// Ticks at a "nice" step (1, 2, 2.5 or 5 times a power of ten): the smallest such
// step that gives at most max_ticks ticks inside [lo, hi]. `integer`: only
// whole steps (1, 2, 5, 10, 20, 25, ...), so every tick is a whole number;
// below 1 that leaves step 1. Then format the labels.
static void make_ticks(Axis *a, const BitmapFont *font, int max_ticks, bool integer) {
    static const double MULTIPLES[] = {1, 2, 2.5, 5, 10};
    double span = a->hi - a->lo, magnitude = pow(10, floor(log10(span / max_ticks)));
    bool found = false;
    for (int i = 0; i < 5 && !found; i++) {
        double step = MULTIPLES[i] * magnitude;
        if (integer && (step < 1 - 1e-9 || fabs(step - round(step)) > 1e-9 * step)) continue;
        a->step = integer ? round(step) : step;
        a->first = ceil(a->lo / a->step) * a->step;
        a->n_ticks = (int)floor((a->hi - a->first) / a->step + 1e-9) + 1;
        found = a->n_ticks <= max_ticks;
    }
    if (integer && !found && a->step < 1) {  // a range narrower than max_ticks: every whole number in it
        a->step = 1;
        a->first = ceil(a->lo);
        a->n_ticks = (int)floor(a->hi - a->first + 1e-9) + 1;
    }
    if (a->n_ticks < 0) a->n_ticks = 0;
    if (a->n_ticks > MAX_TICKS) a->n_ticks = MAX_TICKS;  // only if max_ticks > MAX_TICKS

    double last = a->first + (a->n_ticks - 1) * a->step;
    double largest = fmax(fabs(a->first), fabs(last));
    bool scientific = largest >= 1e5 || (largest > 0 && largest < 1e-3);  // "2e+05", not "200000"
    int digits = scientific ? (int)(floor(log10(largest)) - floor(log10(a->step) + 1e-9)) + 1 : 0;
    a->label_width = 0;
    for (int i = 0; i < a->n_ticks; i++) {
        double v = a->first + i * a->step;
        if (fabs(v) < 1e-9 * a->step) v = 0;  // -1e-17 would print as "-0.0"
        if (scientific) snprintf(a->labels[i], sizeof a->labels[i], "%.*g", digits < 1 ? 1 : digits, v);
        else snprintf(a->labels[i], sizeof a->labels[i], "%.*f", decimals_for(a->step), v);
        int w = text_width(font, a->labels[i]);
        if (w > a->label_width) a->label_width = w;
    }
}

static int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
static int max_int(int a, int b) { return a > b ? a : b; }
static bool has_text(const char *s) { return s && *s; }

// Ticks for an x axis drawn from column `left` to `right`. Its labels are wide:
// start from one tick per 70 px, thin out until labels do not touch.
static void fit_x_ticks(Axis *xa, const BitmapFont *font, int left, int right, bool integer) {
    for (int max_ticks = clamp_int((right - left) / 70, 2, 8);; max_ticks--) {
        make_ticks(xa, font, max_ticks, integer);
        double step_px = xa->step / (xa->hi - xa->lo) * (right - left);
        if (max_ticks == 2 || step_px >= xa->label_width + 2 * font->width) break;
    }
}

// Tick marks under the frame's bottom row, pointing out; their labels below
// them when `with_labels` (panels stacked on one axis label only the lowest).
static void draw_x_ticks(Canvas *c, const Axis *xa, const BitmapFont *font, int left, int right, int bottom,
                         bool with_labels) {
    double x_scale = (right - left) / (xa->hi - xa->lo);
    for (int i = 0; i < xa->n_ticks; i++) {
        int px = (int)lround(left + (xa->first + i * xa->step - xa->lo) * x_scale);
        fill_rect(c, px, bottom + 1, px, bottom + TICK_LEN, BLACK);
        if (with_labels)
            draw_text(c, font, xa->labels[i], px - text_width(font, xa->labels[i]) / 2,
                      bottom + TICK_LEN + TICK_PAD, false, BLACK);
    }
}

// ---------------------------------------------------------------- legend

typedef struct { const char *label; Rgb color; } LegendEntry;

typedef struct {
    const LegendEntry *entries;
    int n;
    bool side_by_side;  // one row of entries (above a timeline), not one entry per row
    bool patches;       // each entry's sample a filled box (blocks), not a line (series)
} Legend;

// The legend's box in pixels: padding around the entries, each a sample and its label.
static void legend_size(const Legend *legend, const BitmapFont *font, int *width, int *height) {
    int widest = 0, total = 0;
    for (int i = 0; i < legend->n; i++) {
        int entry_w = SAMPLE_LEN + SAMPLE_GAP + text_width(font, legend->entries[i].label);
        widest = max_int(widest, entry_w);
        total += entry_w + (i > 0 ? LEGEND_COLUMN_GAP : 0);
    }
    int row_h = font->height + LEGEND_ROW_GAP;
    *width = 2 * LEGEND_PAD + (legend->side_by_side ? total : widest);
    *height = 2 * LEGEND_PAD + (legend->side_by_side ? font->height : legend->n * row_h - LEGEND_ROW_GAP);
}

// Draw the legend with its box's top-left corner at (x, y): white, framed in light grey.
static void draw_legend(Canvas *c, const Legend *legend, const BitmapFont *font, int x, int y) {
    int box_w, box_h;
    legend_size(legend, font, &box_w, &box_h);
    fill_rect(c, x, y, x + box_w - 1, y + box_h - 1, WHITE);
    frame_rect(c, x, y, x + box_w - 1, y + box_h - 1, LEGEND_EDGE);
    int entry_x = x + LEGEND_PAD, entry_y = y + LEGEND_PAD;
    for (int i = 0; i < legend->n; i++) {
        const LegendEntry *entry = &legend->entries[i];
        if (legend->patches) {  // as tall as a digit: from the text's top row of ink to its baseline
            fill_rect(c, entry_x, entry_y + PATCH_INSET, entry_x + SAMPLE_LEN - 1,
                      entry_y + font->height - 1 - PATCH_INSET, entry->color);
            if (entry->color.r == 255 && entry->color.g == 255 && entry->color.b == 255)  // white: outlined
                frame_rect(c, entry_x, entry_y + PATCH_INSET, entry_x + SAMPLE_LEN - 1,
                           entry_y + font->height - 1 - PATCH_INSET, LEGEND_EDGE);
        } else {  // a 2 px line through the text's middle
            int sample_y = entry_y + font->height / 2;
            fill_rect(c, entry_x, sample_y - 1, entry_x + SAMPLE_LEN - 1, sample_y, entry->color);
        }
        draw_text(c, font, entry->label, entry_x + SAMPLE_LEN + SAMPLE_GAP, entry_y, false, BLACK);
        if (legend->side_by_side)
            entry_x += SAMPLE_LEN + SAMPLE_GAP + text_width(font, entry->label) + LEGEND_COLUMN_GAP;
        else
            entry_y += font->height + LEGEND_ROW_GAP;
    }
}

// ---------------------------------------------------------------- PNG output

// libpng's errors, kept for our one line instead of printed by libpng; a
// failed fwrite ("Write Error") keeps its errno too.
typedef struct {
    char message[200];
    int error;
} PngFailure;

static void png_failed(png_structp png, png_const_charp message) {
    PngFailure *failure = png_get_error_ptr(png);
    failure->error = strcmp(message, "Write Error") == 0 ? errno : 0;
    snprintf(failure->message, sizeof failure->message, "%s", message);
    png_longjmp(png, 1);
}

// Written next to `path`, then renamed over it: a failed write keeps the old file.
static void write_png(const char *path, const Canvas *c) {
    char temp[PATH_MAX];
    FILE *file = replace_begin(path, temp, sizeof temp);
    CHECK_ERRNO(file != NULL, "cannot create %s", temp);
    PngFailure failure = {"", 0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &failure, png_failed, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    CHECK(info != NULL, "libpng: cannot start writing %s", path);
    // libpng reports errors (e.g. a full disk) by longjmp to here; no local
    // variable changes after this point, so none needs to be volatile.
    if (setjmp(png_jmpbuf(png))) {
        replace_abort(file, temp);
        FATAL("cannot write %s: libpng: %s%s%s", path, failure.message, failure.error ? ": " : "",
              failure.error ? strerror(failure.error) : "");
    }
    png_init_io(png, file);
    png_set_IHDR(png, info, (png_uint_32)c->width, (png_uint_32)c->height, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_set_pHYs(png, info, 3937, 3937, PNG_RESOLUTION_METER);  // 100 dpi, as matplotlib
    png_write_info(png, info);
    for (int y = 0; y < c->height; y++) png_write_row(png, c->rgb + (size_t)3 * c->width * y);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    CHECK_ERRNO(replace_commit(file, temp), "cannot write %s", path);
}

// ---------------------------------------------------------------- the figure

// Draw one chart into the band of rows [y0, y0 + H) of the canvas: a figure of
// its own (plot_png), or one panel of a stacked figure (plot_panels_png).
static void draw_chart(Canvas *canvas, int y0, int H, const PlotSpec *spec, const PlotSeries *series,
                       int n_series) {
    const BitmapFont *font = &FONT_BODY, *title_font = &FONT_TITLE;
    const int W = canvas->width;

    // Data limits over the finite points only (NaN/Inf are skipped, and break
    // the line), and the finite ends of their bars.
    Axis xa = {.lo = INFINITY, .hi = -INFINITY}, ya = {.lo = INFINITY, .hi = -INFINITY};
    for (int s = 0; s < n_series; s++)
        for (int i = 0; i < series[s].n; i++) {
            double x = series[s].x[i], y = series[s].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            xa.lo = fmin(xa.lo, x), xa.hi = fmax(xa.hi, x);
            ya.lo = fmin(ya.lo, y), ya.hi = fmax(ya.hi, y);
            for (int end = 0; end < 2; end++) {
                const float *bar = end ? series[s].y_hi : series[s].y_lo;
                if (bar && isfinite(bar[i])) ya.lo = fmin(ya.lo, bar[i]), ya.hi = fmax(ya.hi, bar[i]);
            }
        }
    pad_range(&xa, DATA_MARGIN);
    pad_range(&ya, DATA_MARGIN);

    // Axes frame: rows top..bottom, columns left..right. Top and bottom come
    // first: they fix the y axis length, hence its ticks, hence the width of the
    // y tick labels, which sets the left margin.
    int title_h = has_text(spec->title) ? title_font->height + TITLE_GAP : 0;
    int xlabel_h = has_text(spec->xlabel) ? LABEL_GAP + font->height : 0;
    int ylabel_w = has_text(spec->ylabel) ? LABEL_GAP + font->height : 0;
    int top = y0 + max_int((int)(0.12 * H), PAD + title_h);
    int below = TICK_LEN + TICK_PAD + font->height + xlabel_h;
    int bottom = y0 + H - 1 - max_int((int)(0.11 * H), below + PAD);
    bottom = max_int(bottom, top + 2);
    make_ticks(&ya, font, clamp_int((bottom - top) / 40, 2, 9), false);
    int beside = TICK_LEN + TICK_PAD + ya.label_width + ylabel_w;
    int left = max_int((int)(0.125 * W), beside + PAD);
    int right = max_int(W - 1 - max_int((int)(0.1 * W), PAD + 3 * font->width), left + 2);
    fit_x_ticks(&xa, font, left, right, spec->integer_x);
    double x_scale = (right - left) / (xa.hi - xa.lo), y_scale = (bottom - top) / (ya.hi - ya.lo);

    // Series, clipped to the inside of the frame. Each is stroked into a coverage
    // mask and composited once; `ink` sums them all, for placing the legend.
    const int inner_x = left + 1, inner_y = top + 1, inner_w = right - left - 1, inner_h = bottom - top - 1;
    float *mask = xmalloc((size_t)inner_w * inner_h * sizeof *mask);
    float *ink = xcalloc((size_t)inner_w * inner_h, sizeof *ink);
    for (int s = 0; s < n_series; s++) {
        memset(mask, 0, (size_t)inner_w * inner_h * sizeof *mask);
        double prev_x = 0, prev_y = 0;
        bool have_prev = false;
        const float *xs = series[s].x, *ys = series[s].y;
        for (int i = 0; i < series[s].n; i++) {
            if (!isfinite(xs[i]) || !isfinite(ys[i])) { have_prev = false; continue; }
            double px = left + (xs[i] - xa.lo) * x_scale - inner_x;  // mask coordinates
            double py = bottom - (ys[i] - ya.lo) * y_scale - inner_y;
            bool next_joins = i + 1 < series[s].n && isfinite(xs[i + 1]) && isfinite(ys[i + 1]);
            if (have_prev) stroke_segment(mask, inner_w, inner_h, prev_x, prev_y, px, py, LINE_HALF_WIDTH);
            else if (!next_joins) stroke_segment(mask, inner_w, inner_h, px, py, px, py, DOT_RADIUS);
            prev_x = px, prev_y = py, have_prev = true;
            if (series[s].y_lo && series[s].y_hi && isfinite(series[s].y_lo[i]) && isfinite(series[s].y_hi[i])) {
                double lo_y = bottom - (series[s].y_lo[i] - ya.lo) * y_scale - inner_y;
                double hi_y = bottom - (series[s].y_hi[i] - ya.lo) * y_scale - inner_y;
                stroke_segment(mask, inner_w, inner_h, px, lo_y, px, hi_y, BAR_HALF_WIDTH);
                for (int end = 0; end < 2; end++) {
                    double cap_y = end ? hi_y : lo_y;
                    stroke_segment(mask, inner_w, inner_h, px - CAP_HALF_LENGTH, cap_y, px + CAP_HALF_LENGTH, cap_y,
                                   BAR_HALF_WIDTH);
                }
            }
        }
        for (int y = 0; y < inner_h; y++)
            for (int x = 0; x < inner_w; x++) {
                float m = mask[(size_t)y * inner_w + x];
                if (m <= 0) continue;
                blend(canvas, inner_x + x, inner_y + y, TAB10[s % 10], m);
                ink[(size_t)y * inner_w + x] += m;
            }
    }
    free(mask);

    // Frame, ticks and tick labels (drawn over the lines, as matplotlib's spines).
    frame_rect(canvas, left, top, right, bottom, BLACK);
    draw_x_ticks(canvas, &xa, font, left, right, bottom, true);
    for (int i = 0; i < ya.n_ticks; i++) {
        int py = (int)lround(bottom - (ya.first + i * ya.step - ya.lo) * y_scale);
        fill_rect(canvas, left - TICK_LEN, py, left - 1, py, BLACK);
        draw_text(canvas, font, ya.labels[i], left - TICK_LEN - TICK_PAD - text_width(font, ya.labels[i]),
                  py - font->height / 2, false, BLACK);
    }

    // Title and axis labels, centred on the axes.
    int centre_x = (left + right) / 2, centre_y = (top + bottom) / 2;
    if (has_text(spec->title))
        draw_text(canvas, title_font, spec->title, centre_x - text_width(title_font, spec->title) / 2,
                  top - TITLE_GAP - title_font->height, false, BLACK);
    if (has_text(spec->xlabel))
        draw_text(canvas, font, spec->xlabel, centre_x - text_width(font, spec->xlabel) / 2,
                  bottom + TICK_LEN + TICK_PAD + font->height + LABEL_GAP, false, BLACK);
    if (has_text(spec->ylabel))
        draw_text(canvas, font, spec->ylabel, left - beside, centre_y - text_width(font, spec->ylabel) / 2,
                  true, BLACK);

    // Legend: matplotlib's loc="best", i.e. the place that hides the least ink,
    // trying its places in its order: the four corners (upper right, upper left,
    // lower left, lower right), then centre left, centre right, lower centre,
    // upper centre and centre, for charts whose lines run through every corner.
    LegendEntry *entries = xmalloc((size_t)n_series * sizeof *entries);
    Legend legend = {.entries = entries};
    for (int s = 0; s < n_series; s++)
        if (has_text(series[s].label)) entries[legend.n++] = (LegendEntry){series[s].label, TAB10[s % 10]};
    if (legend.n > 0) {
        int box_w, box_h;
        legend_size(&legend, font, &box_w, &box_h);
        const int far_x = inner_w - LEGEND_INSET - box_w, far_y = inner_h - LEGEND_INSET - box_h;
        const int mid_x = (inner_w - box_w) / 2, mid_y = (inner_h - box_h) / 2;
        const int place_x[9] = {far_x, LEGEND_INSET, LEGEND_INSET, far_x, LEGEND_INSET, far_x, mid_x, mid_x, mid_x};
        const int place_y[9] = {LEGEND_INSET, LEGEND_INSET, far_y, far_y, mid_y, mid_y, far_y, LEGEND_INSET, mid_y};
        int best = 0;
        double best_ink = INFINITY;
        for (int k = 0; k < 9; k++) {
            double hidden = 0;
            for (int y = max_int(place_y[k], 0); y < place_y[k] + box_h && y < inner_h; y++)
                for (int x = max_int(place_x[k], 0); x < place_x[k] + box_w && x < inner_w; x++)
                    hidden += ink[(size_t)y * inner_w + x];
            if (hidden < best_ink) best_ink = hidden, best = k;
        }
        draw_legend(canvas, &legend, font, inner_x + place_x[best], inner_y + place_y[best]);
    }
    free(entries);
    free(ink);
}

void plot_png(const char *path, const PlotSpec *spec, const PlotSeries *series, int n_series) {
    const int W = spec->width > 0 ? spec->width : DEFAULT_WIDTH;
    const int H = spec->height > 0 ? spec->height : DEFAULT_HEIGHT;
    Canvas canvas = canvas_new(W, H);
    draw_chart(&canvas, 0, H, spec, series, n_series);
    write_png(path, &canvas);
    free(canvas.rgb);
}

void plot_panels_png(const char *path, const PlotPanel *panels, int n_panels) {
    CHECK(n_panels >= 1, "plot_panels_png(%s): %d panels, want at least 1", path, n_panels);
    const int W = panels[0].spec.width > 0 ? panels[0].spec.width : DEFAULT_WIDTH;
    int H = 0;
    for (int p = 0; p < n_panels; p++) H += panels[p].spec.height > 0 ? panels[p].spec.height : DEFAULT_HEIGHT;
    Canvas canvas = canvas_new(W, H);
    for (int p = 0, y = 0; p < n_panels; p++) {
        int h = panels[p].spec.height > 0 ? panels[p].spec.height : DEFAULT_HEIGHT;
        draw_chart(&canvas, y, h, &panels[p].spec, panels[p].series, panels[p].n_series);
        y += h;
    }
    write_png(path, &canvas);
    free(canvas.rgb);
}

// ---------------------------------------------------------------- the timeline

// Forward and backward blocks in tab10's first two colours, each labelled in
// the text colour of higher contrast with it (WCAG's ratio: white on the blue
// 4.8:1, black on the orange 8.3:1, where white would give 2.5:1).
static const struct { const char *name; Rgb fill, text; } BLOCK_STYLE[2] = {
    [PLOT_FORWARD] = {"forward", {0x1f, 0x77, 0xb4}, {255, 255, 255}},
    [PLOT_BACKWARD] = {"backward", {0xff, 0x7f, 0x0e}, {0, 0, 0}},
};

enum {
    TIMELINE_WIDTH = 1000,
    ROW_HEIGHT = 24,      // one stage: a block 18 px high (a label's 13 and room around it), 3 px each side
    BLOCK_INSET = 3,
    LABEL_PAD = 1,        // a label keeps this far from its block's ends, or is left out
    PANEL_TITLE_GAP = 4,  // a panel's title to its frame
    PANEL_GAP = 12,       // a panel's tick marks to the next panel's title
};
// Less than a line chart's 5%: the first block starts near the frame, as time starts at the left edge.
static const double TIME_MARGIN = 0.02;

static int panel_title_height(const PlotTimelinePanel *panel, const BitmapFont *font) {
    return has_text(panel->title) ? font->height + PANEL_TITLE_GAP : 0;
}

// The frame's rows: its two lines and the stages between them.
static int panel_frame_height(const PlotTimelinePanel *panel) { return panel->n_rows * ROW_HEIGHT + 2; }

static void row_name(const PlotTimelinePanel *panel, int row, char *name, size_t size) {
    if (panel->row_names) snprintf(name, size, "%s", panel->row_names[row] ? panel->row_names[row] : "");
    else snprintf(name, size, "stage %d", row);
}

// A block's columns, clipped to the frame's inside (left+1..right-1): those
// whose centres lie in [start, end), at least one, so that no work vanishes at
// any scale. Blocks 3 px wide or more leave their last column white, so that
// back-to-back blocks of one colour still read as two.
static void block_columns(const PlotBlock *block, const Axis *xa, int left, int right, int *x0, int *x1) {
    double x_scale = (right - left) / (xa->hi - xa->lo);
    double start = fmin(block->start, block->end), end = fmax(block->start, block->end);
    // Clamp in double before converting: a time far outside must not overflow int.
    *x0 = (int)lround(fmin(right - 1, fmax(left + 1, left + (start - xa->lo) * x_scale)));
    *x1 = (int)lround(fmin(right, fmax(left + 1, left + (end - xa->lo) * x_scale))) - 1;
    if (*x1 < *x0) *x1 = *x0;
    if (*x1 - *x0 + 1 >= 3) (*x1)--;
}

// The block's label, and whether it fits in `font`: with LABEL_PAD to spare in
// the block's width, from its duration rounded down, less its white column.
// (Not from its columns: blocks of one duration then all have a label, or none,
// where rounding their ends would make them 6 px wide here and 7 px there.)
static bool block_label(const PlotBlock *block, const BitmapFont *font, double x_scale, char *label, size_t size) {
    if (block->label < 0) return false;
    snprintf(label, size, "%d", block->label);
    double width = floor(fabs(block->end - block->start) * x_scale);
    if (width >= 3) width--;
    return text_width(font, label) + 2 * LABEL_PAD <= width;
}

// A block on the row whose top pixel row is `row_top`, and its label centred in it where it fits.
static void draw_block(Canvas *c, const PlotBlock *block, const Axis *xa, int left, int right, int row_top,
                       const BitmapFont *font) {
    int x0, x1, y0 = row_top + BLOCK_INSET, y1 = row_top + ROW_HEIGHT - 1 - BLOCK_INSET;
    block_columns(block, xa, left, right, &x0, &x1);
    fill_rect(c, x0, y0, x1, y1, BLOCK_STYLE[block->kind].fill);
    char label[16];
    if (!block_label(block, font, (right - left) / (xa->hi - xa->lo), label, sizeof label)) return;
    draw_text(c, font, label, x0 + (x1 - x0 + 1 - text_width(font, label)) / 2, y0 + (y1 - y0 + 1 - font->height) / 2,
              false, BLOCK_STYLE[block->kind].text);
}

void plot_timeline_png(const char *path, const char *title, const char *xlabel,
                       const PlotTimelinePanel *panels, int n_panels) {
    const BitmapFont *font = &FONT_BODY, *title_font = &FONT_TITLE;
    CHECK(n_panels >= 1, "plot_timeline_png(%s): %d panels, want at least 1", path, n_panels);
    for (int p = 0; p < n_panels; p++) {
        CHECK(panels[p].n_rows >= 1, "plot_timeline_png(%s): panel %d has %d rows, want at least 1", path, p,
              panels[p].n_rows);
        for (int b = 0; b < panels[p].n_blocks; b++) {
            const PlotBlock *block = &panels[p].blocks[b];
            CHECK(block->row >= 0 && block->row < panels[p].n_rows,
                  "plot_timeline_png(%s): panel %d, block %d on row %d, outside rows 0..%d", path, p, b, block->row,
                  panels[p].n_rows - 1);
            CHECK(block->kind == PLOT_FORWARD || block->kind == PLOT_BACKWARD,
                  "plot_timeline_png(%s): panel %d, block %d of kind %d, want PLOT_FORWARD or PLOT_BACKWARD", path,
                  p, b, (int)block->kind);
        }
    }

    // The time axis spans every panel's blocks (finite times only).
    Axis xa = {.lo = INFINITY, .hi = -INFINITY};
    for (int p = 0; p < n_panels; p++)
        for (int b = 0; b < panels[p].n_blocks; b++) {
            const PlotBlock *block = &panels[p].blocks[b];
            if (!isfinite(block->start) || !isfinite(block->end)) continue;
            xa.lo = fmin(xa.lo, fmin(block->start, block->end));
            xa.hi = fmax(xa.hi, fmax(block->start, block->end));
        }
    pad_range(&xa, TIME_MARGIN);

    // Columns: the row names right-aligned against their tick marks, left of the frame.
    int name_width = 0;
    char name[128];
    for (int p = 0; p < n_panels; p++)
        for (int r = 0; r < panels[p].n_rows; r++) {
            row_name(&panels[p], r, name, sizeof name);
            name_width = max_int(name_width, text_width(font, name));
        }
    const int W = TIMELINE_WIDTH;
    int left = max_int((int)(0.06 * W), PAD + name_width + TICK_PAD + TICK_LEN);
    int right = max_int(W - 1 - max_int((int)(0.03 * W), PAD + 3 * font->width), left + 2);
    fit_x_ticks(&xa, font, left, right, false);

    // Labels in the body font, unless the small one fits more of them (many
    // micro-batches: "10" and up in narrow blocks): one size for all, as a
    // figure whose labels change size midway reads as two kinds of block.
    int fit_body = 0, fit_small = 0;
    const double x_scale = (right - left) / (xa.hi - xa.lo);
    for (int p = 0; p < n_panels; p++)
        for (int b = 0; b < panels[p].n_blocks; b++) {
            char label[16];
            fit_body += block_label(&panels[p].blocks[b], font, x_scale, label, sizeof label);
            fit_small += block_label(&panels[p].blocks[b], &FONT_SMALL, x_scale, label, sizeof label);
        }
    const BitmapFont *label_font = fit_small > fit_body ? &FONT_SMALL : font;

    // Rows, top to bottom: the title, with the legend at its right where they
    // both fit in the line (else on a line of its own); then each panel: its
    // title, its frame, its tick marks; the last's tick labels and the x label.
    const LegendEntry entries[3] = {{BLOCK_STYLE[PLOT_FORWARD].name, BLOCK_STYLE[PLOT_FORWARD].fill},
                                    {BLOCK_STYLE[PLOT_BACKWARD].name, BLOCK_STYLE[PLOT_BACKWARD].fill},
                                    {"idle", WHITE}};  // the background: what no block covers
    const Legend legend = {.entries = entries, .n = 3, .side_by_side = true, .patches = true};
    int legend_w, legend_h;
    legend_size(&legend, font, &legend_w, &legend_h);
    int centre_x = (left + right) / 2;
    int title_w = has_text(title) ? text_width(title_font, title) : 0;
    bool legend_beside_title = centre_x + (title_w + 1) / 2 + LEGEND_COLUMN_GAP <= right + 1 - legend_w;
    int head_h = legend_beside_title ? max_int(has_text(title) ? title_font->height : 0, legend_h)
                                     : title_font->height + TITLE_GAP + legend_h;
    int height = PAD + head_h + TITLE_GAP;
    for (int p = 0; p < n_panels; p++)
        height += panel_title_height(&panels[p], font) + panel_frame_height(&panels[p]) + TICK_LEN +
                  (p + 1 < n_panels ? PANEL_GAP : 0);
    height += TICK_PAD + font->height + (has_text(xlabel) ? LABEL_GAP + font->height : 0) + PAD;
    Canvas canvas = canvas_new(W, height);

    int y = PAD;
    if (has_text(title))  // centred on the head's line(s): on the legend's middle when beside it
        draw_text(&canvas, title_font, title, centre_x - title_w / 2,
                  legend_beside_title ? y + (head_h - title_font->height) / 2 : y, false, BLACK);
    draw_legend(&canvas, &legend, font, right + 1 - legend_w, y + head_h - legend_h);
    y += head_h + TITLE_GAP;

    for (int p = 0; p < n_panels; p++) {
        const PlotTimelinePanel *panel = &panels[p];
        if (has_text(panel->title)) draw_text(&canvas, font, panel->title, left, y, false, BLACK);
        int top = y + panel_title_height(panel, font), bottom = top + panel_frame_height(panel) - 1;
        for (int b = 0; b < panel->n_blocks; b++) {
            const PlotBlock *block = &panel->blocks[b];
            if (!isfinite(block->start) || !isfinite(block->end)) continue;
            draw_block(&canvas, block, &xa, left, right, top + 1 + block->row * ROW_HEIGHT, label_font);
        }
        frame_rect(&canvas, left, top, right, bottom, BLACK);
        for (int r = 0; r < panel->n_rows; r++) {  // a tick and a name at each row's middle
            int row_middle = top + 1 + r * ROW_HEIGHT + ROW_HEIGHT / 2;
            fill_rect(&canvas, left - TICK_LEN, row_middle, left - 1, row_middle, BLACK);
            row_name(panel, r, name, sizeof name);
            draw_text(&canvas, font, name, left - TICK_LEN - TICK_PAD - text_width(font, name),
                      row_middle - font->height / 2, false, BLACK);
        }
        bool last = p + 1 == n_panels;
        draw_x_ticks(&canvas, &xa, font, left, right, bottom, last);
        y = bottom + 1 + TICK_LEN + (last ? 0 : PANEL_GAP);
    }
    if (has_text(xlabel))
        draw_text(&canvas, font, xlabel, centre_x - text_width(font, xlabel) / 2,
                  y + TICK_PAD + font->height + LABEL_GAP, false, BLACK);

    write_png(path, &canvas);
    free(canvas.rgb);
}
