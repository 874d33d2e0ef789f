// test_nn.c: the layers, the MLP and the optimizers against independent
// references: central finite differences for every backward pass, a double
// precision Adam for the optimizer, and the PyTorch conventions (init bounds
// and draw order, state_dict names, gradient accumulation, hook order).
//
// Finite differences perturb a float parameter by H and re-run the C forward,
// so each numeric derivative carries ~eps_f32 * |loss| / H of rounding noise;
// with H = 1e-2 that is ~1e-5, well below the tolerances, and the truncation
// error H^2 * f''' / 6 of these smooth losses is of the same order.
#define TEST_NAME "test_nn"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/nn.h"
#include "reference_ce.h"
#include "test.h"

#define H 1e-2
#define ATOL 1e-4  // per element: |analytic - numeric| <= ATOL + RTOL * max(|analytic|, |numeric|)
#define RTOL 1e-2

static Rng data_rng;  // the tests' inputs; the models get their own seeds

static void fill_uniform(float *v, size_t n, float low, float high) {
    for (size_t i = 0; i < n; i++) v[i] = rng_uniform(&data_rng, low, high);
}

// A loss as a function of whatever the caller perturbs; NAN means "this point
// is not differentiable" (a ReLU flipped), and the element is skipped.
typedef double (*LossFn)(void *context);

static double central_diff(float *x, LossFn loss, void *context) {
    float x0 = *x;
    *x = (float)(x0 + H);
    double x_up = *x, up = loss(context);
    *x = (float)(x0 - H);
    double x_down = *x, down = loss(context);
    *x = x0;
    return (up - down) / (x_up - x_down);  // the float steps actually taken, not 2H
}

// Analytic gradient g of n elements v against central differences of f.
// Returns how many elements were skipped at kinks (the caller bounds the total).
static size_t check_grad(const char *what, float *v, const float *g, size_t n, LossFn f, void *context) {
    double worst = 0, err2 = 0, ref2 = 0;
    size_t skipped = 0;
    for (size_t i = 0; i < n; i++) {
        double numeric = central_diff(&v[i], f, context);
        if (isnan(numeric)) { skipped++; continue; }
        double err = fabs(g[i] - numeric);
        worst = fmax(worst, err / (ATOL + RTOL * fmax(fabs(g[i]), fabs(numeric))));
        err2 += err * err;
        ref2 += numeric * numeric;
    }
    double norm_rel = sqrt(err2 / fmax(ref2, 1e-30));
    EXPECT(worst <= 1 && norm_rel < 5e-3 && skipped < n,
           "%s vs central FD (h=%g), %zu elements, %zu skipped at ReLU kinks: "
           "worst err/(%g+%g|g|) = %.3f, ||err||/||g_fd|| = %.2e",
           what, H, n, skipped, ATOL, RTOL, worst, norm_rel);
    return skipped;
}

// ------------------------------------------------------------ Linear, ReLU

// loss = sum(f(x) * R) for a fixed R, so d loss / d f(x) = R; f is the Linear
// layer, or ReLU when there is none.
typedef struct { Linear *layer; Tensor *x, *y, *r; } LayerCtx;

static double layer_loss(void *p) {
    LayerCtx *c = p;
    if (c->layer) linear_forward(c->layer, c->x, c->y, false);
    else tensor_copy(c->y, c->x), relu_forward(c->y);
    double loss = 0;
    for (size_t i = 0; i < tensor_numel(c->y); i++) loss += (double)c->y->data[i] * c->r->data[i];
    return loss;
}

static void test_linear(void) {
    enum { B = 3, IN = 5, OUT = 4 };
    Rng init;
    rng_seed(&init, 1);
    Linear layer;
    linear_init(&layer, IN, OUT, &init, DEVICE_CPU);
    Tensor x = tensor_zeros(B, IN, DEVICE_CPU), y = tensor_zeros(B, OUT, DEVICE_CPU);
    Tensor r = tensor_zeros(B, OUT, DEVICE_CPU), grad_x = tensor_zeros(B, IN, DEVICE_CPU);
    fill_uniform(x.data, tensor_numel(&x), -1, 1);
    fill_uniform(r.data, tensor_numel(&r), -1, 1);
    linear_backward(&layer, &x, &r, &grad_x);
    LayerCtx c = {&layer, &x, &y, &r};
    check_grad("Linear d loss/d weight", layer.weight.data, layer.grad_weight.data, IN * OUT, layer_loss, &c);
    check_grad("Linear d loss/d bias", layer.bias.data, layer.grad_bias.data, OUT, layer_loss, &c);
    check_grad("Linear d loss/d input", x.data, grad_x.data, B * IN, layer_loss, &c);
    linear_free(&layer);
    tensor_free(&x), tensor_free(&y), tensor_free(&r), tensor_free(&grad_x);
}

static void test_relu(void) {
    enum { N = 16 };
    Tensor x = tensor_zeros(1, N, DEVICE_CPU), y = tensor_zeros(1, N, DEVICE_CPU);
    Tensor r = tensor_zeros(1, N, DEVICE_CPU), grad = tensor_zeros(1, N, DEVICE_CPU);
    fill_uniform(r.data, N, -1, 1);
    for (int i = 0; i < N; i++)  // keep every point 5h away from the kink
        do x.data[i] = rng_uniform(&data_rng, -1, 1); while (fabsf(x.data[i]) < 5 * H);
    LayerCtx c = {NULL, &x, &y, &r};
    layer_loss(&c);
    tensor_copy(&grad, &r);
    relu_backward(&y, &grad);
    check_grad("ReLU d loss/d x", x.data, grad.data, N, layer_loss, &c);
    // At exactly 0 PyTorch's threshold_backward passes no gradient.
    Tensor zero = tensor_zeros(1, 1, DEVICE_CPU), g0 = tensor_zeros(1, 1, DEVICE_CPU);
    g0.data[0] = 1;
    relu_backward(&zero, &g0);
    EXPECT(g0.data[0] == 0, "ReLU backward at y = 0 gives 0 (got %g)", g0.data[0]);
    tensor_free(&x), tensor_free(&y), tensor_free(&r), tensor_free(&grad), tensor_free(&zero), tensor_free(&g0);
}

// ------------------------------------------------------------ cross-entropy

typedef struct { Tensor *logits, *scratch_grad; const int *labels; } CeCtx;

static double ce_loss(void *p) {
    CeCtx *c = p;
    return softmax_cross_entropy(c->logits, c->labels, c->scratch_grad);
}

static void test_cross_entropy(void) {
    enum { B = 4, C = 5 };
    const int labels[B] = {0, 3, 4, 3};
    Tensor z = tensor_zeros(B, C, DEVICE_CPU), scratch = tensor_zeros(B, C, DEVICE_CPU);
    Tensor grad = tensor_zeros(B, C, DEVICE_CPU);
    fill_uniform(z.data, B * C, -3, 3);
    double loss = softmax_cross_entropy(&z, labels, &grad), ref = reference_ce(z.data, labels, B, C);
    EXPECT(fabs(loss - ref) <= 1e-6 * ref, "CE forward %.8f vs double reference %.8f (rel err %.1e)",
           loss, ref, fabs(loss - ref) / ref);
    check_grad("CE d loss/d logits", z.data, grad.data, B * C, ce_loss, &(CeCtx){&z, &scratch, labels});

    // Logits of +-1000 overflow a naive exp; the max-shifted form must not.
    // Rows: a confidently wrong answer (loss 2000), a near tie, and a full tie.
    const float hard[3][3] = {{1000, -1000, 0}, {-1000, 1000, 999}, {1000, 1000, 1000}};
    const int hard_labels[3] = {1, 2, 0};
    Tensor hz = {.data = (float *)hard, .rows = 3, .cols = 3, .device = DEVICE_CPU};
    Tensor hg = tensor_zeros(3, 3, DEVICE_CPU);
    loss = softmax_cross_entropy(&hz, hard_labels, &hg);
    ref = reference_ce(&hard[0][0], hard_labels, 3, 3);
    double grad_err = 0;  // against (softmax - onehot) / B in double
    for (int r = 0; r < 3; r++) {
        double max = fmax(fmax(hard[r][0], hard[r][1]), hard[r][2]), sum = 0;
        for (int c = 0; c < 3; c++) sum += exp(hard[r][c] - max);
        for (int c = 0; c < 3; c++) {
            double expect = (exp(hard[r][c] - max) / sum - (c == hard_labels[r])) / 3;
            grad_err = fmax(grad_err, isfinite(hg.data[r * 3 + c]) ? fabs(hg.data[r * 3 + c] - expect) : INFINITY);
        }
    }
    EXPECT(isfinite(loss) && fabs(loss - ref) <= 1e-6 * ref,
           "CE forward at logits +-1000: %.6f vs double reference %.6f (rel err %.1e)", loss, ref,
           fabs(loss - ref) / ref);
    EXPECT(grad_err < 1e-6, "CE backward at logits +-1000 is finite and = (softmax-onehot)/B (max err %.1e)", grad_err);
    tensor_free(&z), tensor_free(&scratch), tensor_free(&grad), tensor_free(&hg);
}

// ------------------------------------------------------------ MLP

// The FD loss of the MLP. The ReLU pattern of the unperturbed point is recorded
// once (record = true); a perturbation that changes it crossed a kink -> NAN.
typedef struct { Mlp *model; const Tensor *x; const int *labels; bool record; bool mask[64]; } MlpCtx;

static double mlp_loss_at(void *p) {
    MlpCtx *c = p;
    mlp_forward(c->model, c->x);
    double loss = mlp_loss(c->model, c->labels);
    size_t k = 0;
    for (int i = 0; i + 1 < c->model->n_layers; i++)
        for (size_t e = 0; e < tensor_numel(&c->model->outputs[i]); e++, k++) {
            bool on = c->model->outputs[i].data[e] > 0;
            if (c->record) c->mask[k] = on;
            else if (on != c->mask[k]) return NAN;
        }
    return loss;
}

// Every gradient, flattened in parameter order (the caller frees it).
static float *grads_flat(const Mlp *m) {
    float *all = malloc(mlp_num_weights(m) * sizeof *all), *at = all;
    for (int i = 0; i < m->n_params; i++) {
        memcpy(at, m->params[i].grad->data, tensor_numel(m->params[i].grad) * sizeof *at);
        at += tensor_numel(m->params[i].grad);
    }
    return all;
}

// ||a - scale * b|| / ||scale * b||
static double rel_diff(const float *a, const float *b, double scale, size_t n) {
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < n; i++) {
        err2 += (a[i] - scale * b[i]) * (a[i] - scale * b[i]);
        ref2 += scale * b[i] * scale * b[i];
    }
    return sqrt(err2 / fmax(ref2, 1e-30));
}

// Records the hook's calls and a hash of parameter i's grad at the moment of its call.
typedef struct { Mlp *model; int calls, order[8]; unsigned long long hash[8]; } HookLog;

static unsigned long long grad_hash(const Param *p) {
    const Param grad = {.value = p->grad};
    return params_checksum(&grad, 1);
}

static void on_grad_ready(void *p, int index) {
    HookLog *log = p;
    if (log->calls < 8) log->order[log->calls] = index;
    log->calls++;
    log->hash[index] = grad_hash(&log->model->params[index]);
}

static void test_mlp(void) {
    enum { B = 5, MAX_BATCH = 8, IN = 6, CLASSES = 3 };  // a partial batch: B < max_batch
    const int sizes[] = {IN, 5, 4, CLASSES}, labels[B] = {0, 2, 1, 2, 0};
    Rng init;
    rng_seed(&init, 3);
    Mlp m = mlp_new(sizes, 4, MAX_BATCH, &init, DEVICE_CPU);
    Tensor x = tensor_zeros(B, IN, DEVICE_CPU);
    fill_uniform(x.data, tensor_numel(&x), -1, 1);

    MlpCtx c = {.model = &m, .x = &x, .labels = labels, .record = true};
    mlp_zero_grad(&m);
    mlp_loss_at(&c);
    c.record = false;
    HookLog log = {.model = &m};
    mlp_backward(&m, &x, on_grad_ready, &log);
    size_t skipped = 0, n = mlp_num_weights(&m);
    for (int i = 0; i < m.n_params; i++) {
        char what[96];
        snprintf(what, sizeof what, "MLP {6,5,4,3} d loss/d %s", m.params[i].name);
        const Param *q = &m.params[i];
        skipped += check_grad(what, q->value->data, q->grad->data, tensor_numel(q->value), mlp_loss_at, &c);
    }
    EXPECT(skipped * 10 <= n, "MLP FD: %zu of %zu elements skipped for flipping a ReLU (at most 10%%)", skipped, n);

    // DDP starts the all-reduce of a parameter's bucket from the hook, so its grad must be final by then.
    bool final = true, reverse_order = log.calls == m.n_params;
    for (int i = 0; i < m.n_params; i++) final = final && log.hash[i] == grad_hash(&m.params[i]);
    for (int k = 0; reverse_order && k < m.n_params; k++) {
        int layer = m.n_layers - 1 - k / 2;  // last layer first; within a layer, bias then weight
        reverse_order = log.order[k] == 2 * layer + (k % 2 == 0 ? 1 : 0);
    }
    EXPECT(reverse_order, "hook called once per parameter, last layer first (got %d calls: %d %d %d %d %d %d)",
           log.calls, log.order[0], log.order[1], log.order[2], log.order[3], log.order[4], log.order[5]);
    EXPECT(final, "each parameter's grad at its hook equals its grad after backward (bitwise)");

    // PyTorch accumulates: a second forward/backward without zero_grad doubles the grads.
    float *once = grads_flat(&m);
    mlp_forward(&m, &x), mlp_loss(&m, labels), mlp_backward(&m, &x, NULL, NULL);
    float *twice = grads_flat(&m);
    double err = rel_diff(twice, once, 2.0, n);
    EXPECT(err < 1e-6, "two backwards without zero_grad = 2x one backward (rel err %.1e)", err);
    mlp_zero_grad(&m);
    float *zeroed = grads_flat(&m);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) nonzero += zeroed[i] != 0;
    EXPECT(nonzero == 0, "mlp_zero_grad zeroes all %zu grads (%zu nonzero left)", n, nonzero);

    // Micro-batches: with a mean loss, grad(full batch of 4) = (grad(rows 0-1) + grad(rows 2-3)) / 2.
    Tensor x4 = tensor_rows(&x, 4);
    mlp_forward(&m, &x4), mlp_loss(&m, labels), mlp_backward(&m, &x4, NULL, NULL);
    float *full = grads_flat(&m);
    mlp_zero_grad(&m);
    for (int half = 0; half < 2; half++) {
        Tensor xh = {.data = x.data + 2 * half * IN, .rows = 2, .cols = IN, .device = DEVICE_CPU};
        mlp_forward(&m, &xh), mlp_loss(&m, labels + 2 * half), mlp_backward(&m, &xh, NULL, NULL);
    }
    float *accumulated = grads_flat(&m);
    err = rel_diff(full, accumulated, 0.5, n);
    EXPECT(err < 1e-5, "grad(batch 4) = accumulated grads of two batches of 2, halved (rel err %.1e)", err);

    free(once), free(twice), free(zeroed), free(full), free(accumulated);
    tensor_free(&x);
    mlp_free(&m);
}

// ------------------------------------------------------------ MSE (test_profile's loss)

typedef struct { Mlp *model; const Tensor *x, *target; } MseCtx;

static double mse_loss_at(void *p) {
    MseCtx *c = p;
    mlp_forward(c->model, c->x);
    return mlp_mse_loss(c->model, c->target);
}

static void test_mse(void) {
    enum { B = 3, IN = 4, OUT = 5 };  // one Linear: no kinks, so every element is checked
    const int sizes[] = {IN, OUT};
    Rng init;
    rng_seed(&init, 5);
    Mlp m = mlp_new(sizes, 2, B, &init, DEVICE_CPU);
    Tensor x = tensor_zeros(B, IN, DEVICE_CPU), target = tensor_zeros(B, OUT, DEVICE_CPU);
    fill_uniform(x.data, tensor_numel(&x), -1, 1);
    fill_uniform(target.data, tensor_numel(&target), -1, 1);
    const Tensor *y = mlp_forward(&m, &x);
    double ref = 0;  // nn.MSELoss(): the mean over all B x OUT elements
    for (size_t i = 0; i < tensor_numel(y); i++) ref += pow((double)y->data[i] - target.data[i], 2) / (B * OUT);
    mlp_zero_grad(&m);
    double loss = mlp_mse_loss(&m, &target);
    EXPECT(fabs(loss - ref) <= 1e-6 * ref, "MSE forward %.8f vs double reference %.8f", loss, ref);
    mlp_backward(&m, &x, NULL, NULL);
    MseCtx c = {&m, &x, &target};
    check_grad("MSE d loss/d fc.0.weight", m.params[0].value->data, m.params[0].grad->data, IN * OUT, mse_loss_at, &c);
    check_grad("MSE d loss/d fc.0.bias", m.params[1].value->data, m.params[1].grad->data, OUT, mse_loss_at, &c);
    tensor_free(&x), tensor_free(&target);
    mlp_free(&m);
}

// ------------------------------------------------------------ optimizers

static void test_adam(void) {
    enum { N = 4, STEPS = 5 };
    const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    // Sign flips, a large and a tiny gradient (1e-8 ~ eps, where eps's placement shows).
    const float grads[STEPS][N] = {{0.5f, -2, 1e-8f, 3}, {-0.25f, -1, 1e-8f, 0.1f}, {0.75f, 4, -2e-8f, -3},
                                   {0.1f, -0.5f, 1e-8f, 0}, {-1, 2, 3e-8f, 1}};
    Tensor p = tensor_zeros(1, N, DEVICE_CPU), g = tensor_zeros(1, N, DEVICE_CPU);
    const float p0[N] = {1.5f, -2, 0.75f, 3};
    memcpy(p.data, p0, sizeof p0);
    Param param = {.name = "p", .value = &p, .grad = &g};
    Adam adam = adam_new(&param, 1, lr);
    double ref[N], m[N] = {0}, v[N] = {0}, worst = 0, worst_moment = 0;
    for (int k = 0; k < N; k++) ref[k] = p0[k];
    for (int t = 1; t <= STEPS; t++) {  // Kingma & Ba with bias correction, in double
        memcpy(g.data, grads[t - 1], sizeof grads[0]);
        adam_step(&adam);
        for (int k = 0; k < N; k++) {
            m[k] = b1 * m[k] + (1 - b1) * grads[t - 1][k];
            v[k] = b2 * v[k] + (1 - b2) * (double)grads[t - 1][k] * grads[t - 1][k];
            double m_hat = m[k] / (1 - pow(b1, t)), v_hat = v[k] / (1 - pow(b2, t));
            ref[k] -= lr * m_hat / (sqrt(v_hat) + eps);
            worst = fmax(worst, fabs(p.data[k] - ref[k]) / fabs(ref[k]));
            worst_moment = fmax(worst_moment, fabs(adam.exp_avg[0].data[k] - m[k]) / fmax(fabs(m[k]), 1e-30));
            worst_moment = fmax(worst_moment, fabs(adam.exp_avg_sq[0].data[k] - v[k]) / fmax(v[k], 1e-30));
        }
    }
    EXPECT(adam.step == STEPS && worst < 1e-6, "Adam, %d steps vs double reference: params rel err %.1e (p = %g %g %g %g)",
           STEPS, worst, p.data[0], p.data[1], p.data[2], p.data[3]);
    EXPECT(worst_moment < 1e-5, "Adam moments exp_avg, exp_avg_sq vs double reference: rel err %.1e", worst_moment);
    adam_free(&adam);

    // Step 1 by hand: m = (1-b1) g, v = (1-b2) g^2, so m_hat = g, sqrt(v_hat) = |g| and
    // p1 = p0 - lr * g / (|g| + eps): ~ -lr * sign(g), but only lr/2 when |g| = eps.
    const float p1[N] = {0.5f, -0.25f, 1, 2}, g1[N] = {3, -0.02f, 1e-8f, -4e-9f};
    memcpy(p.data, p1, sizeof p1), memcpy(g.data, g1, sizeof g1);
    adam = adam_new(&param, 1, 0.01);
    adam_step(&adam);
    worst = 0;
    for (int k = 0; k < N; k++) {
        double expect = p1[k] - 0.01 * g1[k] / (fabs(g1[k]) + 1e-8);
        worst = fmax(worst, fabs(p.data[k] - expect) / fabs(expect));
    }
    EXPECT(worst < 1e-6, "Adam step 1 = p - lr*g/(|g|+eps) (rel err %.1e; g=1e-8 moved 1 -> %.7f, expect 0.995)",
           worst, p.data[2]);
    adam_free(&adam);
    tensor_free(&p), tensor_free(&g);
}

static void test_sgd(void) {
    // Dyadic values: p - lr * g is exact in float, so any other formula shows.
    Tensor p[2] = {tensor_zeros(1, 3, DEVICE_CPU), tensor_zeros(2, 1, DEVICE_CPU)};
    Tensor g[2] = {tensor_zeros(1, 3, DEVICE_CPU), tensor_zeros(2, 1, DEVICE_CPU)};
    const float pv[5] = {1.5f, -2, 0.25f, 8, 0}, gv[5] = {0.5f, -1, 2, -0.125f, 3}, lr = 0.5f;
    memcpy(p[0].data, pv, 3 * 4), memcpy(p[1].data, pv + 3, 2 * 4);
    memcpy(g[0].data, gv, 3 * 4), memcpy(g[1].data, gv + 3, 2 * 4);
    Param params[2] = {{.name = "a", .value = &p[0], .grad = &g[0]}, {.name = "b", .value = &p[1], .grad = &g[1]}};
    sgd_step(params, 2, lr);
    int exact = 0;
    for (int k = 0; k < 5; k++) exact += (k < 3 ? p[0].data[k] : p[1].data[k - 3]) == pv[k] - lr * gv[k];
    EXPECT(exact == 5, "SGD p -= lr*grad exactly, over 2 params (%d of 5 elements exact)", exact);
    for (int i = 0; i < 2; i++) tensor_free(&p[i]), tensor_free(&g[i]);
}

// ------------------------------------------------------------ init, names, accuracy

static void test_init_and_names(void) {
    enum { IN = 50, OUT = 20 };
    Rng rng;
    rng_seed(&rng, 7);
    Linear a, b;
    linear_init(&a, IN, OUT, &rng, DEVICE_CPU);
    const float bound = (float)(1 / sqrt(IN));
    float lo = 0, hi = 0;
    bool in_bounds = true;
    for (int i = 0; i < IN * OUT + OUT; i++) {
        float w = i < IN * OUT ? a.weight.data[i] : a.bias.data[i - IN * OUT];
        in_bounds = in_bounds && fabsf(w) <= bound;
        lo = fminf(lo, w), hi = fmaxf(hi, w);
    }
    EXPECT(in_bounds && lo < -0.9f * bound && hi > 0.9f * bound,
           "linear_init in [-1/sqrt(in), 1/sqrt(in)] = +-%.5f and spans it (min %.5f, max %.5f)", bound, lo, hi);
    // torch draws the whole weight first, then the bias, from the same stream.
    rng_seed(&rng, 7);
    bool order = true;
    for (int i = 0; i < IN * OUT; i++) order = order && a.weight.data[i] == rng_uniform(&rng, -bound, bound);
    for (int i = 0; i < OUT; i++) order = order && a.bias.data[i] == rng_uniform(&rng, -bound, bound);
    EXPECT(order, "linear_init draws weight then bias as U(-bound, bound) from the seeded stream");
    rng_seed(&rng, 7);
    linear_init(&b, IN, OUT, &rng, DEVICE_CPU);
    EXPECT(!memcmp(a.weight.data, b.weight.data, IN * OUT * 4) && !memcmp(a.bias.data, b.bias.data, OUT * 4),
           "linear_init with the same seed is bit-identical");
    linear_free(&a), linear_free(&b);

    const int sizes[] = {784, 128, 10};
    Mlp m[3];
    for (int i = 0; i < 3; i++) {
        rng_seed(&rng, i < 2 ? 42 : 43);
        m[i] = mlp_new(sizes, 3, 4, &rng, DEVICE_CPU);
    }
    unsigned long long s0 = params_checksum(m[0].params, 4), s1 = params_checksum(m[1].params, 4),
                       s2 = params_checksum(m[2].params, 4);
    EXPECT(s0 == s1 && s0 != s2, "params_checksum: seed 42 twice %016llx = %016llx, seed 43 %016llx differs", s0, s1, s2);

    const char *names[] = {"fc.0.weight", "fc.0.bias", "fc.2.weight", "fc.2.bias"};
    const int shapes[4][2] = {{128, 784}, {1, 128}, {10, 128}, {1, 10}};
    for (int i = 0; i < 4 && m[0].n_params == 4; i++) {
        const Param *p = &m[0].params[i];
        EXPECT(!strcmp(p->name, names[i]) && p->value->rows == shapes[i][0] && p->value->cols == shapes[i][1] &&
                   p->grad->rows == shapes[i][0] && p->grad->cols == shapes[i][1] && p->grad != p->value,
               "param %d is %s [%d, %d] with a grad of its shape (got %s [%d, %d], grad [%d, %d])", i, names[i],
               shapes[i][0], shapes[i][1], p->name, p->value->rows, p->value->cols, p->grad->rows, p->grad->cols);
    }
    EXPECT(m[0].n_params == 4 && mlp_num_weights(&m[0]) == 101770, "{784,128,10}: %d params, %zu weights (expect 4, 101770)",
           m[0].n_params, mlp_num_weights(&m[0]));
    for (int i = 0; i < 3; i++) mlp_free(&m[i]);
}

static void test_accuracy(void) {
    // One Linear with weight = I and bias = 0: the logits are the inputs, so
    // the argmax is readable off x. max_batch 2 forces chunks 2 + 2 + 1.
    const int sizes[] = {3, 3}, labels[5] = {0, 1, 2, 1, 0};
    const float rows[5][3] = {{0.9f, 0.1f, 0}, {0.2f, 0.7f, 0.1f}, {0.5f, 0.4f, 0.1f}, {0, -1, 2}, {3, 1, 2}};
    Rng rng;
    rng_seed(&rng, 0);
    Mlp m = mlp_new(sizes, 2, 2, &rng, DEVICE_CPU);
    tensor_fill(&m.layers[0].weight, 0), tensor_fill(&m.layers[0].bias, 0);
    for (int i = 0; i < 3; i++) m.layers[0].weight.data[i * 3 + i] = 1;
    Tensor x = {.data = (float *)rows, .rows = 5, .cols = 3, .device = DEVICE_CPU};
    double acc = mlp_accuracy(&m, &x, labels);  // rows 0, 1 and 4 (the partial chunk) right
    EXPECT(acc == 3.0 / 5, "mlp_accuracy on 5 hand-built rows in chunks of 2 = %.4f (expect 0.6)", acc);
    mlp_free(&m);
}

// ------------------------------------------------------------ bfloat16 matmuls (--dtype bfloat16)

static uint32_t bits_of(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}
static float from_bits(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

// round_to_bfloat16 against its definition (to nearest, ties to even on the upper 16 bits), at
// the cases that break a rounding: ties both ways, a carry into the exponent, the largest finite
// value rounding to infinity, NaNs whose payload lies in the low bits, subnormals; then gemm under
// MATMUL_BFLOAT16 against the same GEMM of operands rounded by hand (the same values in, the same
// float32 GEMM: the same bits), and not the float32 one.
static void test_bfloat16_matmul(void) {
    const struct { uint32_t in, out; } cases[] = {
        {0x3f800000u, 0x3f800000u},  // 1: exact
        {0x3f808000u, 0x3f800000u},  // a tie, upper half even: down
        {0x3f818000u, 0x3f820000u},  // a tie, upper half odd: up
        {0x3f808001u, 0x3f810000u},  // past the tie: up
        {0x3fffffffu, 0x40000000u},  // the carry into the exponent
        {0x7f7fffffu, 0x7f800000u},  // float's largest: past bfloat16's, infinite
        {0xff800000u, 0xff800000u},  // -infinity stays
        {0x7f800001u, 0x7fc00000u},  // a NaN with its payload in the low bits: still a NaN
        {0x00000001u, 0x00000000u},  // the smallest subnormal: to zero
        {0x80018000u, 0x80020000u},  // a negative subnormal's tie, odd: away from zero
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t got = bits_of(round_to_bfloat16(from_bits(cases[i].in)));
        if (got != cases[i].out) wrong++, printf("  round_to_bfloat16(0x%08x) = 0x%08x, expected 0x%08x\n", cases[i].in, got, cases[i].out);
    }
    EXPECT(wrong == 0, "round_to_bfloat16: ties to even, the carry, overflow to infinity, NaN and subnormals (%d of %zu wrong)",
           wrong, sizeof cases / sizeof cases[0]);

    enum { M = 37, K = 45, N = 29 };
    Tensor a = tensor_zeros(K, M, DEVICE_CPU), b = tensor_zeros(N, K, DEVICE_CPU);  // op(A) = A^T, op(B) = B^T
    Tensor a_rounded = tensor_zeros(K, M, DEVICE_CPU), b_rounded = tensor_zeros(N, K, DEVICE_CPU);
    Tensor c = tensor_zeros(M, N, DEVICE_CPU), c_hand = tensor_zeros(M, N, DEVICE_CPU), c_fp32 = tensor_zeros(M, N, DEVICE_CPU);
    fill_uniform(a.data, tensor_numel(&a), -2, 2);
    fill_uniform(b.data, tensor_numel(&b), -2, 2);
    fill_uniform(c.data, tensor_numel(&c), -1, 1);
    tensor_copy(&c_hand, &c), tensor_copy(&c_fp32, &c);
    Tensor a_before = tensor_zeros(K, M, DEVICE_CPU);
    tensor_copy(&a_before, &a);
    for (size_t i = 0; i < tensor_numel(&a); i++) a_rounded.data[i] = round_to_bfloat16(a.data[i]);
    for (size_t i = 0; i < tensor_numel(&b); i++) b_rounded.data[i] = round_to_bfloat16(b.data[i]);
    gemm(true, true, 0.5f, &a_rounded, &b_rounded, 0.25f, &c_hand);
    gemm(true, true, 0.5f, &a, &b, 0.25f, &c_fp32);
    matmul_set_dtype(MATMUL_BFLOAT16);
    gemm(true, true, 0.5f, &a, &b, 0.25f, &c);
    matmul_set_dtype(MATMUL_FLOAT32);
    size_t differ_hand = 0, differ_fp32 = 0;
    for (size_t i = 0; i < tensor_numel(&c); i++) differ_hand += c.data[i] != c_hand.data[i], differ_fp32 += c.data[i] != c_fp32.data[i];
    EXPECT(differ_hand == 0 && differ_fp32 > tensor_numel(&c) / 2 &&
               memcmp(a.data, a_before.data, tensor_numel(&a) * sizeof(float)) == 0,
           "gemm [%d, %d] x [%d, %d] (both transposed) with bfloat16 matmuls: the GEMM of the operands rounded by hand, bit "
           "for bit (%zu differ), not float32's (%zu of %d differ), the operands left as they were",
           M, K, K, N, differ_hand, differ_fp32, M * N);
    Tensor *all[] = {&a, &b, &a_rounded, &b_rounded, &c, &c_hand, &c_fp32, &a_before};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
}

// gemm_hold_rounded: a held operand rounded once serves two products, one reading it as A and one as
// B (conv2d_backward's grad_y), with the bits of each product rounding it itself; held again after it
// changed, the products read its new values, not the last hold's copy.
static void test_bfloat16_hold(void) {
    enum { M = 23, K = 31, N = 19 };
    Tensor g = tensor_zeros(M, K, DEVICE_CPU), x = tensor_zeros(K, N, DEVICE_CPU), w = tensor_zeros(N, M, DEVICE_CPU);
    Tensor c1 = tensor_zeros(M, N, DEVICE_CPU), c2 = tensor_zeros(N, K, DEVICE_CPU);
    Tensor h1 = tensor_zeros(M, N, DEVICE_CPU), h2 = tensor_zeros(N, K, DEVICE_CPU);
    fill_uniform(x.data, tensor_numel(&x), -2, 2);
    fill_uniform(w.data, tensor_numel(&w), -2, 2);
    matmul_set_dtype(MATMUL_BFLOAT16);
    size_t differ = 0;
    for (int round = 0; round < 2; round++) {
        fill_uniform(g.data, tensor_numel(&g), -2, 2);  // new values for the second hold
        gemm(false, false, 1.0f, &g, &x, 0.0f, &c1);  // g as A
        gemm(false, false, 1.0f, &w, &g, 0.0f, &c2);  // g as B
        gemm_hold_rounded(&g);
        gemm(false, false, 1.0f, &g, &x, 0.0f, &h1);
        gemm(false, false, 1.0f, &w, &g, 0.0f, &h2);
        gemm_release_rounded();
        for (size_t i = 0; i < tensor_numel(&c1); i++) differ += c1.data[i] != h1.data[i];
        for (size_t i = 0; i < tensor_numel(&c2); i++) differ += c2.data[i] != h2.data[i];
    }
    matmul_set_dtype(MATMUL_FLOAT32);
    EXPECT(differ == 0, "gemm_hold_rounded with bfloat16 matmuls: the held operand as A and as B, twice with new values: "
           "each product's own rounding, bit for bit (%zu of %d differ)", differ, 2 * (M * N + N * K));
    Tensor *all[] = {&g, &x, &w, &c1, &c2, &h1, &h2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
}

int main(void) {
    rng_seed(&data_rng, 2024);
    test_linear();
    test_relu();
    test_cross_entropy();
    test_mlp();
    test_mse();
    test_adam();
    test_sgd();
    test_init_and_names();
    test_accuracy();
    test_bfloat16_matmul();
    test_bfloat16_hold();
    return test_summary();
}
