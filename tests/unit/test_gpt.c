// test_gpt.c: step 19's GPT (common/models/gpt.h) against independent references: central finite
// differences of the loss for the gradient of every parameter on a tiny config (with and without
// biases), the hook order DDP relies on, the state_dict names and shapes nanoGPT's model has, and
// gradient accumulation (two half-batches with loss / 2 give the whole batch's gradients).
//
// The finite differences perturb one float weight by H and rerun the C forward; the loss is
// recomputed in double from the float logits (log-sum-exp minus the target's logit), so each
// numeric derivative carries about 1e-7 / H of rounding noise, far below the tolerances.
#define TEST_NAME "test_gpt"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "models/gpt.h"
#include "test.h"

#define H 1e-2
#define ATOL 1e-4  // per element: |analytic - numeric| <= ATOL + RTOL * max(|analytic|, |numeric|)
#define RTOL 1e-2

enum { B = 2, T = 6 };
static Rng data_rng;
static int inputs[B * T], targets[B * T];

// The mean cross-entropy of a forward, in double. The dropout masks are drawn anew from one seed
// for every forward, so that the finite differences see one function.
static double loss_in_double(Gpt *m) {
    gpt_seed_dropout(m, 99);
    const float *logits = gpt_forward(m, inputs, B, T)->data;  // (on the CPU)
    const int V = m->config.vocab_size;
    double total = 0;
    for (int r = 0; r < B * T; r++) {
        const float *z = logits + (size_t)r * V;
        double max = z[0], sum = 0;
        for (int c = 1; c < V; c++) max = fmax(max, z[c]);
        for (int c = 0; c < V; c++) sum += exp(z[c] - max);
        total += log(sum) + max - z[targets[r]];
    }
    return total / (B * T);
}

// Weights larger than nanoGPT's 0.02, so that every gradient is well above the noise, and
// LayerNorm gains around 1, as trained ones are.
static void randomise(Gpt *m) {
    for (int i = 0; i < m->n_params; i++) {
        Tensor *v = m->params[i].value;
        bool gain = strstr(m->params[i].name, "ln_") && strstr(m->params[i].name, "weight");
        for (size_t k = 0; k < tensor_numel(v); k++)
            v->data[k] = gain ? rng_uniform(&data_rng, 0.5f, 1.5f) : rng_uniform(&data_rng, -0.5f, 0.5f);
    }
}

typedef struct { int calls[256]; int order[256]; int n; } HookLog;
static void on_ready(void *context, int index) {
    HookLog *log = context;
    log->calls[index]++;
    log->order[log->n++] = index;
}

static void test_gradients(bool bias, double dropout) {
    GptConfig config = {.vocab_size = 11, .block_size = T, .n_layer = 2, .n_head = 2, .n_embd = 8, .bias = bias,
                        .dropout = dropout};
    Rng init;
    rng_seed(&init, 7);
    Gpt *m = gpt_new(&config, B, &init, DEVICE_CPU);
    const char *what = dropout > 0 ? ", dropout 0.3" : "";
    randomise(m);
    for (int i = 0; i < B * T; i++) inputs[i] = (int)(rng_next_u32(&data_rng) % 11), targets[i] = (int)(rng_next_u32(&data_rng) % 11);
    gpt_zero_grad(m);
    double reference = loss_in_double(m);
    gpt_seed_dropout(m, 99);
    gpt_forward(m, inputs, B, T);
    float loss = gpt_loss(m, targets);
    EXPECT(fabs(loss - reference) < 1e-5 * reference, "bias=%d%s: gpt_loss %.7f is the cross-entropy of its logits (%.7f in double)",
           bias, what, loss, reference);
    HookLog log = {0};
    gpt_backward(m, on_ready, &log);
    bool once = log.n == m->n_params;
    for (int i = 0; i < m->n_params; i++) once = once && log.calls[i] == 1;
    EXPECT(once, "bias=%d%s: the hook names each of the %d parameters once (%d calls)", bias, what, m->n_params, log.n);
    EXPECT(log.order[0] == m->n_params - (bias ? 2 : 1) && log.order[log.n - 1] == 0,
           "bias=%d%s: ln_f's gradient is ready first, wte's last (it gets the head's and the embedding's parts)", bias, what);
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        double worst = 0, err2 = 0, ref2 = 0;
        size_t n = tensor_numel(p->value);
        for (size_t k = 0; k < n; k++) {
            float *v = &p->value->data[k], v0 = *v;
            *v = (float)(v0 + H);
            double x_up = *v, up = loss_in_double(m);
            *v = (float)(v0 - H);
            double x_down = *v, down = loss_in_double(m);
            *v = v0;
            double numeric = (up - down) / (x_up - x_down), analytic = p->grad->data[k];
            double err = fabs(analytic - numeric);
            worst = fmax(worst, err / (ATOL + RTOL * fmax(fabs(analytic), fabs(numeric))));
            err2 += err * err, ref2 += numeric * numeric;
        }
        double norm_rel = sqrt(err2 / fmax(ref2, 1e-30));
        EXPECT(worst <= 1 && norm_rel < 5e-3 && ref2 > 0,
               "bias=%d%s: d loss/d %s [%d, %d] vs central FD (h=%g): worst err/(%g+%g|g|) = %.3f, ||err||/||g_fd|| = %.1e",
               bias, what, p->name, p->value->rows, p->value->cols, H, ATOL, RTOL, worst, norm_rel);
    }
    gpt_free(m);
}

// Two half-batches, each with loss / 2, accumulate the whole batch's gradients (up to float
// summation order), as nanoGPT's gradient_accumulation_steps does.
static void test_accumulation(void) {
    GptConfig config = {.vocab_size = 11, .block_size = T, .n_layer = 2, .n_head = 2, .n_embd = 8, .bias = true};
    Rng init;
    rng_seed(&init, 8);
    Gpt *m = gpt_new(&config, B, &init, DEVICE_CPU);
    randomise(m);
    gpt_zero_grad(m);
    gpt_forward(m, inputs, B, T);
    gpt_loss(m, targets);
    gpt_backward(m, NULL, NULL);
    size_t total = 0;
    for (int i = 0; i < m->n_params; i++) total += tensor_numel(m->params[i].grad);
    float *whole = malloc(total * sizeof(float));
    for (int i = 0, at = 0; i < m->n_params; at += (int)tensor_numel(m->params[i].grad), i++)
        memcpy(whole + at, m->params[i].grad->data, tensor_numel(m->params[i].grad) * sizeof(float));
    gpt_zero_grad(m);
    for (int half = 0; half < 2; half++) {
        gpt_forward(m, inputs + half * T, 1, T);
        gpt_loss(m, targets + half * T);
        gpt_scale_loss(m, 0.5f);
        gpt_backward(m, NULL, NULL);
    }
    double worst = 0;
    for (int i = 0, at = 0; i < m->n_params; at += (int)tensor_numel(m->params[i].grad), i++)
        for (size_t k = 0; k < tensor_numel(m->params[i].grad); k++)
            worst = fmax(worst, fabs(m->params[i].grad->data[k] - whole[at + k]) / (1e-6 + fabs(whole[at + k])));
    EXPECT(worst < 1e-4, "two half-batches with loss / 2 accumulate the whole batch's gradients (worst relative difference %.1e)", worst);
    free(whole);
    gpt_free(m);
}

// nanoGPT's names, order and shapes, and its parameter count for the baby config.
static void test_names(void) {
    GptConfig config = {.vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = false};
    Rng init;
    rng_seed(&init, 1337);
    Gpt *m = gpt_new(&config, 1, &init, DEVICE_CPU);
    EXPECT(m->n_params == 2 + 4 * 6 + 1 && !strcmp(m->params[0].name, "transformer.wte.weight") &&
           !strcmp(m->params[1].name, "transformer.wpe.weight") && !strcmp(m->params[2].name, "transformer.h.0.ln_1.weight") &&
           !strcmp(m->params[3].name, "transformer.h.0.attn.c_attn.weight") &&
           !strcmp(m->params[7].name, "transformer.h.0.mlp.c_proj.weight") &&
           !strcmp(m->params[m->n_params - 1].name, "transformer.ln_f.weight"),
           "model.parameters()' names and order, bias=False: %d tensors, %s .. %s", m->n_params, m->params[0].name,
           m->params[m->n_params - 1].name);
    EXPECT(gpt_num_params(m, true) == 795904 && gpt_num_params(m, false) == 804096,
           "the baby config has nanoGPT's 0.80M parameters (%zu; %zu with wpe)", gpt_num_params(m, true), gpt_num_params(m, false));
    int n;
    Param *state = gpt_state_dict(m, &n);
    EXPECT(n == m->n_params + 1 && !strcmp(state[n - 1].name, "lm_head.weight") && state[n - 1].value == &m->wte,
           "the state_dict ends with lm_head.weight, wte's tensor (tied)");
    free(state);
    // The init's spread: 0.02, and 0.02 / sqrt(2 n_layer) for the c_proj weights.
    double s2 = 0, p2 = 0;
    size_t n_wte = tensor_numel(&m->wte), n_proj = tensor_numel(m->params[7].value);
    for (size_t k = 0; k < n_wte; k++) s2 += m->wte.data[k] * (double)m->wte.data[k];
    for (size_t k = 0; k < n_proj; k++) p2 += m->params[7].value->data[k] * (double)m->params[7].value->data[k];
    double std_wte = sqrt(s2 / n_wte), std_proj = sqrt(p2 / n_proj);
    EXPECT(fabs(std_wte - 0.02) < 0.001 && fabs(std_proj - 0.02 / sqrt(8)) < 0.0003,
           "init: wte's std %.4f (0.02), mlp.c_proj's %.5f (0.02 / sqrt(2 n_layer) = %.5f)", std_wte, std_proj, 0.02 / sqrt(8));
    gpt_free(m);
}

int main(void) {
#ifdef _OPENMP
    // Some 8000 forwards of a model of a few thousand weights: threads would only wait for each other.
    omp_set_num_threads(1);
#endif
    rng_seed(&data_rng, 2024);
    test_gradients(true, 0.0);
    test_gradients(false, 0.0);
    test_gradients(true, 0.3);  // dropout's masks on all four of its places, fixed by the seed
    test_accumulation();
    test_names();
    return test_summary();
}
