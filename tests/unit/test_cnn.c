// test_cnn.c: step 14's layers and model against independent references:
// a direct convolution in double for Conv2d's forward, central finite
// differences for every backward (Conv2d, MaxPool2d, Flatten, the whole
// SimpleCNN), im2col/col2im as adjoints, PyTorch's pooling rule on ties and
// NaNs, its init bounds and draw order, the state_dict names, DDP's hook order,
// the same bits at 1 to 4 threads, and hand-counted evaluation metrics.
//
// Finite differences perturb a float by H and re-run the C forward; see
// test_nn.c for the error budget. A perturbation that flips a ReLU or moves a
// pooling window's maximum crosses a kink: that element is skipped (the caller
// bounds how many).
#define TEST_NAME "test_cnn"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "models/cnn.h"
#include "reference_ce.h"
#include "test.h"
#include "train/metrics.h"

#define H 1e-2
#define ATOL 1e-4  // per element: |analytic - numeric| <= ATOL + RTOL * max(|analytic|, |numeric|)
#define RTOL 1e-2

static Rng data_rng;

static void fill_uniform(Tensor *t, float low, float high) {
    for (size_t i = 0; i < tensor_numel(t); i++) t->data[i] = rng_uniform(&data_rng, low, high);
}

typedef double (*LossFn)(void *context);  // NAN: this point crossed a kink

static double central_diff(float *x, double h, LossFn loss, void *context) {
    float x0 = *x;
    *x = (float)(x0 + h);
    double x_up = *x, up = loss(context);
    *x = (float)(x0 - h);
    double x_down = *x, down = loss(context);
    *x = x0;
    return (up - down) / (x_up - x_down);
}

// The analytic gradient g of v against central differences, at `count`
// elements: all of them (stride 1), or every stride-th from a random start.
// Returns the elements skipped at kinks.
static size_t check_grad_h(const char *what, float *v, const float *g, size_t n, size_t stride, double h,
                           double max_norm_rel, LossFn f, void *context) {
    double worst = 0, err2 = 0, ref2 = 0;
    size_t skipped = 0, checked = 0;
    size_t start = stride > 1 ? rng_next_u32(&data_rng) % stride : 0;
    for (size_t i = start; i < n; i += stride) {
        double numeric = central_diff(&v[i], h, f, context);
        checked++;
        if (isnan(numeric)) {
            skipped++;
            continue;
        }
        double err = fabs(g[i] - numeric);
        worst = fmax(worst, err / (ATOL + RTOL * fmax(fabs(g[i]), fabs(numeric))));
        err2 += err * err;
        ref2 += numeric * numeric;
    }
    double norm_rel = sqrt(err2 / fmax(ref2, 1e-30));
    EXPECT(worst <= 1 && norm_rel < max_norm_rel && skipped < checked,
           "%s vs central FD (h=%g), %zu of %zu elements, %zu skipped at kinks: worst err/(%g+%g|g|) = %.3f, "
           "||err||/||g_fd|| = %.2e",
           what, h, checked, n, skipped, ATOL, RTOL, worst, norm_rel);
    return skipped;
}

static size_t check_grad(const char *what, float *v, const float *g, size_t n, size_t stride, LossFn f, void *context) {
    return check_grad_h(what, v, g, n, stride, H, 5e-3, f, context);
}

// ------------------------------------------------------------ Conv2d

// y[o, b, y, x] = bias[o] + sum over c, dy, dx of w[o, c, dy, dx] x[c, b, y + dy - p, x + dx - p], in double.
static double direct_conv(const Conv2d *conv, const Tensor *x, int batch, int o, int b, int y, int x_) {
    const int k = conv->kernel, h = conv->height, w = conv->width;
    double sum = conv->bias.data[o];
    for (int c = 0; c < conv->in_channels; c++)
        for (int dy = 0; dy < k; dy++)
            for (int dx = 0; dx < k; dx++) {
                int in_y = y + dy - conv->padding, in_x = x_ + dx - conv->padding;
                if (in_y < 0 || in_y >= h || in_x < 0 || in_x >= w) continue;
                sum += (double)conv->weight.data[(o * conv->in_channels + c) * k * k + dy * k + dx] *
                       x->data[(((size_t)c * batch + b) * h + in_y) * w + in_x];
            }
    return sum;
}

static void test_conv2d_forward(void) {
    enum { IN = 3, OUT = 4, HEIGHT = 5, WIDTH = 6, MAX_BATCH = 3, B = 2 };  // a partial batch: B < max
    const int shapes[][2] = {{3, 1}, {3, 0}, {1, 0}, {2, 1}, {5, 2}};  // kernel, padding
    for (int s = 0; s < 5; s++) {
        int k = shapes[s][0], p = shapes[s][1];
        Rng init;
        rng_seed(&init, 7);
        Conv2d conv;
        conv2d_init(&conv, IN, OUT, k, p, HEIGHT, WIDTH, MAX_BATCH, &init, DEVICE_CPU);
        int out_h = conv2d_out_height(&conv), out_w = conv2d_out_width(&conv);
        Tensor x = tensor_zeros(IN, B * HEIGHT * WIDTH, DEVICE_CPU), y = tensor_zeros(OUT, B * out_h * out_w, DEVICE_CPU);
        fill_uniform(&x, -1, 1);
        double worst = 0, worst_relu = 0;
        for (int relu = 0; relu < 2; relu++) {
            conv2d_forward(&conv, &x, B, &y, relu);
            for (int o = 0; o < OUT; o++)
                for (int b = 0; b < B; b++)
                    for (int yy = 0; yy < out_h; yy++)
                        for (int xx = 0; xx < out_w; xx++) {
                            double ref = direct_conv(&conv, &x, B, o, b, yy, xx);
                            if (relu) ref = fmax(ref, 0);
                            double got = y.data[(size_t)o * B * out_h * out_w + ((size_t)b * out_h + yy) * out_w + xx];
                            double *into = relu ? &worst_relu : &worst;
                            *into = fmax(*into, fabs(got - ref));
                        }
        }
        EXPECT(worst < 1e-5 && worst_relu < 1e-5 && out_h == HEIGHT + 2 * p - k + 1,
               "Conv2d(%d, %d, %d, padding=%d) on 2 images %dx%d -> %dx%d = a direct convolution in double "
               "(max err %.1e, with ReLU %.1e)", IN, OUT, k, p, HEIGHT, WIDTH, out_h, out_w, worst, worst_relu);
        tensor_free(&x), tensor_free(&y);
        conv2d_free(&conv);
    }
}

// loss = sum(f(x) * R) for a fixed R, f = Conv2d (then ReLU when relu). The
// ReLU pattern of the unperturbed point is recorded once (record = true); a
// perturbation that changes it crossed a kink -> NAN.
typedef struct { Conv2d *conv; Tensor *x, *y, *r; int batch; bool relu, record; bool *mask; } ConvCtx;

static double conv_loss(void *p) {
    ConvCtx *c = p;
    conv2d_forward(c->conv, c->x, c->batch, c->y, c->relu);
    double loss = 0;
    for (size_t i = 0; i < tensor_numel(c->y); i++) {
        loss += (double)c->y->data[i] * c->r->data[i];
        bool on = c->y->data[i] > 0;
        if (c->record) c->mask[i] = on;
        else if (c->relu && on != c->mask[i]) return NAN;
    }
    return loss;
}

static void test_conv2d_backward(void) {
    enum { IN = 3, OUT = 4, HEIGHT = 5, WIDTH = 6, MAX_BATCH = 3, B = 2 };
    const size_t n_in = IN * B * HEIGHT * WIDTH, n_out = OUT * B * HEIGHT * WIDTH;
    for (int relu = 0; relu < 2; relu++) {
        Rng init;
        rng_seed(&init, 11);
        Conv2d conv;
        conv2d_init(&conv, IN, OUT, 3, 1, HEIGHT, WIDTH, MAX_BATCH, &init, DEVICE_CPU);
        Tensor x = tensor_zeros(IN, B * HEIGHT * WIDTH, DEVICE_CPU), grad_x = tensor_zeros(IN, B * HEIGHT * WIDTH, DEVICE_CPU);
        Tensor y = tensor_zeros(OUT, B * HEIGHT * WIDTH, DEVICE_CPU), r = tensor_zeros(OUT, B * HEIGHT * WIDTH, DEVICE_CPU);
        Tensor grad_y = tensor_zeros(OUT, B * HEIGHT * WIDTH, DEVICE_CPU);
        fill_uniform(&x, -1, 1);
        fill_uniform(&r, -1, 1);
        fill_uniform(&grad_x, 5, 6);  // must be overwritten, not added to
        fill_uniform(&conv.grad_weight, 1, 2);  // must be added to, as PyTorch accumulates
        Tensor grad_weight0 = tensor_zeros(conv.grad_weight.rows, conv.grad_weight.cols, DEVICE_CPU);
        tensor_copy(&grad_weight0, &conv.grad_weight);
        bool *mask = calloc(n_out, sizeof(bool));
        ConvCtx c = {&conv, &x, &y, &r, B, relu, true, mask};
        conv_loss(&c);
        c.record = false;
        tensor_copy(&grad_y, &r);
        if (relu) relu_backward(&y, &grad_y);
        conv2d_backward(&conv, &grad_y, &grad_x);
        for (size_t i = 0; i < tensor_numel(&conv.grad_weight); i++) conv.grad_weight.data[i] -= grad_weight0.data[i];
        const char *name = relu ? "Conv2d(3, 4, 3, padding=1) + ReLU" : "Conv2d(3, 4, 3, padding=1)";
        char what[96];
        size_t skipped = 0;
        // With the ReLU, a smaller step crosses fewer kinks (the loss is a
        // double sum: its noise stays well under ATOL).
        double h = relu ? 1e-3 : H;
        snprintf(what, sizeof what, "%s, 2 images 5x6: d loss/d weight", name);
        skipped += check_grad_h(what, conv.weight.data, conv.grad_weight.data, tensor_numel(&conv.weight), 1, h, 5e-3,
                                conv_loss, &c);
        snprintf(what, sizeof what, "%s, 2 images 5x6: d loss/d bias", name);
        skipped += check_grad_h(what, conv.bias.data, conv.grad_bias.data, tensor_numel(&conv.bias), 1, h, 5e-3,
                                conv_loss, &c);
        snprintf(what, sizeof what, "%s, 2 images 5x6: d loss/d input", name);
        skipped += check_grad_h(what, x.data, grad_x.data, n_in, 1, h, 5e-3, conv_loss, &c);
        if (relu)
            EXPECT(skipped * 10 <= tensor_numel(&conv.weight) + OUT + n_in,
                   "Conv2d + ReLU FD: %zu of %zu elements skipped for flipping a ReLU (at most 10%%)", skipped,
                   tensor_numel(&conv.weight) + OUT + n_in);
        free(mask);
        tensor_free(&x), tensor_free(&grad_x), tensor_free(&y), tensor_free(&r), tensor_free(&grad_y);
        tensor_free(&grad_weight0);
        conv2d_free(&conv);
    }
}

// im2col and col2im are adjoint: <im2col(x), c> = <x, col2im(c)> for any x, c.
static void test_im2col_adjoint(void) {
    ConvGeometry g = {.channels = 2, .batch = 3, .height = 4, .width = 7, .kernel = 3, .padding = 1};
    int rows = g.channels * g.kernel * g.kernel, cols = g.batch * conv_out_height(&g) * conv_out_width(&g);
    Tensor x = tensor_zeros(g.channels, g.batch * g.height * g.width, DEVICE_CPU), x2 = tensor_zeros(x.rows, x.cols, DEVICE_CPU);
    Tensor col = tensor_zeros(rows, cols, DEVICE_CPU), c = tensor_zeros(rows, cols, DEVICE_CPU);
    fill_uniform(&x, -1, 1);
    fill_uniform(&c, -1, 1);
    im2col(&x, &g, &col);
    col2im(&c, &g, &x2);
    double left = 0, right = 0, scale = 0;
    for (size_t i = 0; i < tensor_numel(&col); i++) left += (double)col.data[i] * c.data[i], scale += fabs(col.data[i] * c.data[i]);
    for (size_t i = 0; i < tensor_numel(&x); i++) right += (double)x.data[i] * x2.data[i];
    EXPECT(fabs(left - right) <= 1e-6 * scale, "im2col and col2im are adjoint: <im2col(x), c> = %.6f, <x, col2im(c)> = %.6f", left, right);
    tensor_free(&x), tensor_free(&x2), tensor_free(&col), tensor_free(&c);
}

// nn.Conv2d's reset_parameters: kaiming_uniform_(a=sqrt(5)) then the bias, both
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn in that order from the generator.
static void test_conv2d_init(void) {
    Rng init, replay;
    rng_seed(&init, 42);
    rng_seed(&replay, 42);
    Conv2d conv;
    conv2d_init(&conv, 32, 64, 3, 1, 14, 14, 1, &init, DEVICE_CPU);
    float bound = (float)(1.0 / sqrt(32 * 9));
    size_t same = 0, n = tensor_numel(&conv.weight) + tensor_numel(&conv.bias);
    float low = 1, high = -1;
    for (size_t i = 0; i < n; i++) {
        float v = i < tensor_numel(&conv.weight) ? conv.weight.data[i] : conv.bias.data[i - tensor_numel(&conv.weight)];
        same += v == rng_uniform(&replay, -bound, bound);
        low = fminf(low, v), high = fmaxf(high, v);
    }
    EXPECT(same == n && conv.weight.rows == 64 && conv.weight.cols == 288,
           "Conv2d(32, 64, 3) weight [64, 288] then bias drawn as U(+-1/sqrt(288)) in order (%zu of %zu equal); range [%.4f, %.4f]",
           same, n, low, high);
    conv2d_free(&conv);
}

// ------------------------------------------------------------ MaxPool2d

static void test_maxpool(void) {
    // Planes of 5 x 7 with windows of 2: 2 x 3 outputs, the last row and column dropped (floor).
    enum { C = 2, B = 2, HEIGHT = 5, WIDTH = 7, OUT_H = 2, OUT_W = 3 };
    MaxPool2d pool;
    maxpool2d_init(&pool, 2, C, HEIGHT, WIDTH, B, DEVICE_CPU);
    Tensor x = tensor_zeros(C, B * HEIGHT * WIDTH, DEVICE_CPU), y = tensor_zeros(C, B * OUT_H * OUT_W, DEVICE_CPU);
    fill_uniform(&x, -1, 1);
    // Plane 0's first window: a tie (the first of the two wins, as in aten);
    // its second window: a NaN (it propagates); its third: all -inf.
    x.data[0] = x.data[1] = x.data[WIDTH] = 0.5f, x.data[WIDTH + 1] = 0.25f;
    x.data[WIDTH + 3] = NAN;
    x.data[4] = x.data[5] = x.data[WIDTH + 4] = x.data[WIDTH + 5] = -INFINITY;
    maxpool2d_forward(&pool, &x, &y);
    size_t wrong = 0;
    for (int p = 0; p < C * B; p++)
        for (int oy = 0; oy < OUT_H; oy++)
            for (int ox = 0; ox < OUT_W; ox++) {
                const float *in = x.data + (size_t)p * HEIGHT * WIDTH;
                int first = (2 * oy) * WIDTH + 2 * ox, best = first;  // the reference: max, first on ties, NaN wins
                for (int k = 0; k < 4; k++) {
                    int index = (2 * oy + k / 2) * WIDTH + 2 * ox + k % 2;
                    if (isnan(in[index])) { best = index; break; }
                    if (in[index] > in[best]) best = index;
                }
                size_t out = ((size_t)p * OUT_H + oy) * OUT_W + ox;
                bool value_ok = isnan(in[best]) ? isnan(y.data[out]) : y.data[out] == in[best];
                wrong += !value_ok || pool.argmax.data[out] != (int)(p * HEIGHT * WIDTH + best);
            }
    EXPECT(wrong == 0 && pool.argmax.data[0] == 0 && isnan(y.data[1]) && y.data[2] == -INFINITY,
           "MaxPool2d(2) on 4 planes of 5x7 -> 2x3: each window's maximum and where it was, the first on ties, NaN "
           "propagates, all -inf gives -inf (%zu wrong)", wrong);

    // Backward: grad_y goes where each maximum was, 0 elsewhere (and grad_x is overwritten).
    Tensor grad_y = tensor_zeros(C, B * OUT_H * OUT_W, DEVICE_CPU), grad_x = tensor_zeros(C, B * HEIGHT * WIDTH, DEVICE_CPU);
    fill_uniform(&grad_y, -1, 1);
    fill_uniform(&grad_x, 3, 4);
    maxpool2d_backward(&pool, &grad_y, &grad_x);
    size_t placed = 0, nonzero = 0;
    for (size_t i = 0; i < tensor_numel(&grad_y); i++) placed += grad_x.data[pool.argmax.data[i]] == grad_y.data[i];
    for (size_t i = 0; i < tensor_numel(&grad_x); i++) nonzero += grad_x.data[i] != 0;
    EXPECT(placed == tensor_numel(&grad_y) && nonzero == tensor_numel(&grad_y),
           "MaxPool2d backward: each gradient at its maximum (%zu of %zu), zeros elsewhere (%zu nonzero)", placed,
           tensor_numel(&grad_y), nonzero);
    tensor_free(&x), tensor_free(&y), tensor_free(&grad_y), tensor_free(&grad_x);
    maxpool2d_free(&pool);
}

// loss = sum(maxpool(x) * R); a perturbation that moves a maximum is a kink.
typedef struct { MaxPool2d *pool; Tensor *x, *y, *r; bool record; int *argmax; } PoolCtx;

static double pool_loss(void *p) {
    PoolCtx *c = p;
    maxpool2d_forward(c->pool, c->x, c->y);
    double loss = 0;
    for (size_t i = 0; i < tensor_numel(c->y); i++) {
        loss += (double)c->y->data[i] * c->r->data[i];
        if (c->record) c->argmax[i] = c->pool->argmax.data[i];
        else if (c->argmax[i] != c->pool->argmax.data[i]) return NAN;
    }
    return loss;
}

static void test_maxpool_fd(void) {
    enum { C = 3, B = 2, SIDE = 6, OUT = 3 };
    MaxPool2d pool;
    maxpool2d_init(&pool, 2, C, SIDE, SIDE, B, DEVICE_CPU);
    Tensor x = tensor_zeros(C, B * SIDE * SIDE, DEVICE_CPU), y = tensor_zeros(C, B * OUT * OUT, DEVICE_CPU);
    Tensor r = tensor_zeros(C, B * OUT * OUT, DEVICE_CPU), grad_x = tensor_zeros(C, B * SIDE * SIDE, DEVICE_CPU);
    fill_uniform(&x, -1, 1);
    fill_uniform(&r, -1, 1);
    int argmax[C * B * OUT * OUT];
    PoolCtx c = {&pool, &x, &y, &r, true, argmax};
    pool_loss(&c);
    c.record = false;
    maxpool2d_backward(&pool, &r, &grad_x);
    check_grad("MaxPool2d(2), 6 planes 6x6: d loss/d input", x.data, grad_x.data, tensor_numel(&x), 1, pool_loss, &c);
    tensor_free(&x), tensor_free(&y), tensor_free(&r), tensor_free(&grad_x);
    maxpool2d_free(&pool);
}

// ------------------------------------------------------------ Flatten

static void test_flatten(void) {
    enum { C = 3, B = 2, PIXELS = 4 };
    Tensor x = tensor_zeros(C, B * PIXELS, DEVICE_CPU), y = tensor_zeros(B, C * PIXELS, DEVICE_CPU);
    Tensor back = tensor_zeros(C, B * PIXELS, DEVICE_CPU);
    fill_uniform(&x, -1, 1);
    flatten_forward(&x, B, &y);
    size_t wrong = 0;  // torch: flat[b, c * pixels + p] = image b's channel c, pixel p
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < PIXELS; p++) wrong += y.data[b * C * PIXELS + c * PIXELS + p] != x.data[c * B * PIXELS + b * PIXELS + p];
    flatten_backward(&y, B, &back);
    EXPECT(wrong == 0 && memcmp(back.data, x.data, sizeof(float) * C * B * PIXELS) == 0,
           "Flatten: [C, B * pixels] -> [B, C * pixels] in PyTorch's order (%zu wrong); its backward inverts it", wrong);
    tensor_free(&x), tensor_free(&y), tensor_free(&back);
}

// ------------------------------------------------------------ SimpleCNN

// The FD loss of the whole network on its images; every ReLU's pattern and every
// pooling window's argmax is recorded at the unperturbed point, and a change -> NAN.
typedef struct {
    Cnn *model;
    const Tensor *x;
    const int *labels;
    bool record;
    bool *relu_mask;   // conv1_out, conv2_out, fc1_out
    int *argmax;       // pool1, pool2
} CnnCtx;

static double cnn_loss_at(void *p) {
    CnnCtx *c = p;
    Cnn *m = c->model;
    const Tensor *logits = cnn_forward(m, c->x);
    cnn_loss(m, c->labels);  // d loss / d logits, for the backward at the recorded point
    double loss = reference_ce(logits->data, c->labels, logits->rows, logits->cols);
    const int B = c->x->rows;
    const Tensor *relus[3] = {&m->conv1_out, &m->conv2_out, &m->fc1_out};
    const size_t relu_sizes[3] = {(size_t)32 * B * 784, (size_t)64 * B * 196, (size_t)B * 128};
    const IntBuffer *pools[2] = {&m->pool1.argmax, &m->pool2.argmax};
    const size_t pool_sizes[2] = {(size_t)32 * B * 196, (size_t)64 * B * 49};
    size_t k = 0;
    for (int l = 0; l < 3; l++)
        for (size_t i = 0; i < relu_sizes[l]; i++, k++) {
            bool on = relus[l]->data[i] > 0;
            if (c->record) c->relu_mask[k] = on;
            else if (on != c->relu_mask[k]) return NAN;
        }
    k = 0;
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < pool_sizes[l]; i++, k++) {
            if (c->record) c->argmax[k] = pools[l]->data[i];
            else if (c->argmax[k] != pools[l]->data[i]) return NAN;
        }
    return loss;
}

typedef struct { Cnn *model; int calls, order[CNN_PARAMS]; unsigned long long hash[CNN_PARAMS]; } HookLog;

static unsigned long long grad_hash(const Param *p) {
    const Param grad = {.value = p->grad};
    return params_checksum(&grad, 1);
}

static void on_grad_ready(void *p, int index) {
    HookLog *log = p;
    if (log->calls < CNN_PARAMS) log->order[log->calls] = index;
    log->calls++;
    log->hash[index] = grad_hash(&log->model->params[index]);
}

static void test_cnn_gradients(void) {
    enum { B = 1, MAX_BATCH = 3 };  // a partial batch; one image has fewest kinks
    const int labels[B] = {7};
    rng_seed(&data_rng, 14);  // the same images and samples whatever ran before
    Rng init;
    rng_seed(&init, 0);
    Cnn *m = cnn_new(MAX_BATCH, &init, DEVICE_CPU);
    // Pixels in [0, 1] everywhere: a black background would make whole pooling
    // windows tie, broken only by the GEMM's rounding (which a perturbation
    // then flips, a kink in name only).
    Tensor x = tensor_zeros(B, 784, DEVICE_CPU);
    fill_uniform(&x, 0, 1);
    bool *relu_mask = calloc((size_t)B * (32 * 784 + 64 * 196 + 128), sizeof(bool));
    int *argmax = calloc((size_t)B * (32 * 196 + 64 * 49), sizeof(int));
    CnnCtx c = {m, &x, labels, true, relu_mask, argmax};
    cnn_zero_grad(m);
    cnn_loss_at(&c);
    c.record = false;
    HookLog log = {.model = m};
    cnn_backward(m, on_grad_ready, &log);

    // A sample of each parameter: every stride-th element from a random start.
    // conv1's parameters move thousands of ReLU inputs and pooling windows at
    // once: a smaller step crosses fewer of those kinks, at the price of more
    // rounding noise in the difference (against conv1's small gradients, whose
    // norm is then checked to 2%; each element still to ATOL + RTOL |g|).
    const size_t strides[CNN_PARAMS] = {1, 1, 17, 1, 997, 7, 13, 1};
    const double steps[CNN_PARAMS] = {3e-4, 3e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3};
    size_t skipped = 0, checked = 0;
    for (int i = 0; i < m->n_params; i++) {
        const Param *q = &m->params[i];
        char what[96];
        snprintf(what, sizeof what, "SimpleCNN on an image: d loss/d %s", q->name);
        skipped += check_grad_h(what, q->value->data, q->grad->data, tensor_numel(q->value), strides[i], steps[i],
                                i < 2 ? 2e-2 : 5e-3, cnn_loss_at, &c);
        checked += (tensor_numel(q->value) + strides[i] - 1) / strides[i];
    }
    EXPECT(checked - skipped >= 1000 && skipped * 3 <= checked,
           "SimpleCNN FD: %zu of %zu elements checked, %zu skipped for moving a ReLU or a maximum (at most a third)",
           checked - skipped, checked, skipped);

    bool final = true, reverse_order = log.calls == CNN_PARAMS;
    for (int i = 0; i < CNN_PARAMS; i++) final = final && log.hash[i] == grad_hash(&m->params[i]);
    for (int k = 0; reverse_order && k < CNN_PARAMS; k++)  // last layer first; in a layer, bias then weight
        reverse_order = log.order[k] == 2 * (3 - k / 2) + (k % 2 == 0 ? 1 : 0);
    EXPECT(reverse_order && final,
           "backward calls the hook once per parameter, last layer first (%d calls: %d %d %d %d %d %d %d %d), each "
           "gradient final at its call", log.calls, log.order[0], log.order[1], log.order[2], log.order[3],
           log.order[4], log.order[5], log.order[6], log.order[7]);

    // The state_dict: names, shapes, 421642 weights.
    const char *names[CNN_PARAMS] = {"network.0.weight", "network.0.bias", "network.3.weight", "network.3.bias",
                                     "network.7.weight", "network.7.bias", "network.9.weight", "network.9.bias"};
    const size_t sizes[CNN_PARAMS] = {32 * 9, 32, 64 * 32 * 9, 64, 128 * 3136, 128, 10 * 128, 10};
    int named = 0;
    for (int i = 0; i < CNN_PARAMS; i++) named += strcmp(m->params[i].name, names[i]) == 0 && tensor_numel(m->params[i].value) == sizes[i];
    EXPECT(named == CNN_PARAMS && cnn_num_weights(m) == 421642 && m->params[2].dims[1] == 32 && m->params[2].dims[3] == 3,
           "parameters in model.parameters() order with their state_dict names and sizes (%d of 8), 421642 weights (%zu)",
           named, cnn_num_weights(m));

    free(relu_mask), free(argmax);
    tensor_free(&x);
    cnn_free(m);
}

// The same bits at any thread count: a forward, backward and evaluation of a
// batch of 64 (every GEMM cut, every OpenMP loop) at 1, 2, 3 and 4 threads.
static void test_threads(void) {
#ifdef _OPENMP
    enum { B = 64 };
    Tensor x = tensor_zeros(B, 784, DEVICE_CPU);
    fill_uniform(&x, 0, 1);
    int labels[B];
    for (int i = 0; i < B; i++) labels[i] = (int)(rng_next_u32(&data_rng) % 10);
    unsigned long long grads[4], logits[4];
    float losses[4];
    for (int t = 0; t < 4; t++) {
        omp_set_num_threads(t + 1);
        Rng init;
        rng_seed(&init, 0);
        Cnn *m = cnn_new(B, &init, DEVICE_CPU);
        cnn_zero_grad(m);
        const Tensor *out = cnn_forward(m, &x);
        losses[t] = cnn_loss(m, labels);
        cnn_backward(m, NULL, NULL);
        Param grad_params[CNN_PARAMS], logit_param = {.value = (Tensor *)out};
        for (int i = 0; i < CNN_PARAMS; i++) grad_params[i] = (Param){.value = m->params[i].grad};
        grads[t] = params_checksum(grad_params, CNN_PARAMS);
        logits[t] = params_checksum(&logit_param, 1);
        cnn_free(m);
    }
    omp_set_num_threads(1);
    bool same = true;
    for (int t = 1; t < 4; t++) same = same && grads[t] == grads[0] && logits[t] == logits[0] && losses[t] == losses[0];
    EXPECT(same, "SimpleCNN forward, loss and backward at 1, 2, 3, 4 threads: the same bits (gradient hashes %016llx "
           "%016llx %016llx %016llx)", grads[0], grads[1], grads[2], grads[3]);
    tensor_free(&x);
#else
    EXPECT(1, "built without OpenMP: one thread, nothing to compare");
#endif
}

// ------------------------------------------------------------ metrics

static void test_metrics(void) {
    // 3 classes, 10 images, counted by hand:
    //   true 0: predicted 0, 0, 1        true 1: 1, 1, 1, 2        true 2: 2, 0, 2
    const int labels[10] = {0, 0, 0, 1, 1, 1, 1, 2, 2, 2}, predictions[10] = {0, 0, 1, 1, 1, 1, 2, 2, 0, 2};
    ConfusionMatrix cm = confusion_new(3);
    confusion_add(&cm, labels, predictions, 10);
    const long expected[9] = {2, 1, 0, 0, 3, 1, 1, 0, 2};
    bool counts = memcmp(cm.counts, expected, sizeof expected) == 0;
    // class 0: precision 2/3 (3 predicted 0), recall 2/3; class 1: precision 3/4, recall 3/4;
    // class 2: precision 2/3, recall 2/3. F1 = P when P = R.
    ClassMetrics m0 = class_metrics(&cm, 0), m1 = class_metrics(&cm, 1), m2 = class_metrics(&cm, 2);
    bool values = fabs(m0.precision - 2.0 / 3) < 1e-12 && fabs(m0.recall - 2.0 / 3) < 1e-12 &&
                  fabs(m1.precision - 0.75) < 1e-12 && fabs(m1.f1 - 0.75) < 1e-12 && m1.support == 4 &&
                  fabs(m2.f1 - 2.0 / 3) < 1e-12 && confusion_correct(&cm) == 7 && confusion_total(&cm) == 10;
    EXPECT(counts && values, "confusion matrix, precision, recall, F1 and support of a 3-class example counted by hand");
    char text[1024];
    classification_report(&cm, text, sizeof text);
    bool report = strstr(text, "           1     0.7500     0.7500     0.7500        4\n") &&
                  strstr(text, "    accuracy                           0.7000       10\n") &&
                  strstr(text, "   macro avg     0.6944     0.6944     0.6944       10\n");
    EXPECT(report, "classification_report prints each class, accuracy 0.7000, macro average 0.6944:\n%s", text);
    confusion_table(&cm, text, sizeof text);
    EXPECT(strstr(text, "           1     0     3     1\n") != NULL, "confusion_table: row 1 is '0 3 1':\n%s", text);

    // A class never predicted: precision 0 (sklearn's zero_division=0), F1 0.
    const int l2[2] = {0, 1}, p2[2] = {0, 0};
    ConfusionMatrix cm2 = confusion_new(2);
    confusion_add(&cm2, l2, p2, 2);
    ClassMetrics never = class_metrics(&cm2, 1);
    EXPECT(never.precision == 0 && never.recall == 0 && never.f1 == 0 && class_metrics(&cm2, 0).precision == 0.5,
           "a class never predicted has precision, recall and F1 0 (no division by zero)");
    confusion_free(&cm), confusion_free(&cm2);
}

int main(void) {
    rng_seed(&data_rng, 2024);
#ifdef _OPENMP
    omp_set_num_threads(1);  // test_threads varies it
#endif
    test_conv2d_forward();
    test_conv2d_backward();
    test_im2col_adjoint();
    test_conv2d_init();
    test_maxpool();
    test_maxpool_fd();
    test_flatten();
    test_cnn_gradients();
    test_threads();
    test_metrics();
    return test_summary();
}
