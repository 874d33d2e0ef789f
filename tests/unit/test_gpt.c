// test_gpt.c: step 19's GPT (common/models/gpt.h) against independent references: central finite
// differences of the loss for the gradient of every parameter on a tiny config (with and without
// biases), the hook order DDP relies on, the state_dict names and shapes nanoGPT's model has, and
// gradient accumulation (two half-batches with loss / 2 give the whole batch's gradients), and
// the Philox generator of the dropout masks (Random123's known answers; the masks' values, rate
// and independence of the thread count).
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

#include "base/philox.h"
#include "models/gpt.h"
#include "tensor/transformer_ops.h"
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

static void test_gradients(bool bias, double dropout, bool philox) {
    GptConfig config = {.vocab_size = 11, .block_size = T, .n_layer = 2, .n_head = 2, .n_embd = 8, .bias = bias,
                        .dropout = dropout};
    Rng init;
    rng_seed(&init, 7);
    Gpt *m = gpt_new(&config, B, &init, DEVICE_CPU);
    gpt_set_dropout_philox(m, philox);
    const char *what = dropout == 0 ? "" : philox ? ", dropout 0.3 (Philox)" : ", dropout 0.3";
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
    // Each tensor's worst difference against its own largest gradient: the two runs sum the same
    // terms in another order (another GEMM shape, so another kernel's blocking), so an element whose
    // terms nearly cancel can differ by far more than its own size while every difference stays at
    // float rounding of the tensor's scale. A wrong accumulation (a missing / 2, a zeroed or
    // overwritten gradient) differs by the scale itself.
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0, at = 0; i < m->n_params; at += (int)tensor_numel(m->params[i].grad), i++) {
        double diff = 0, scale = 0;
        for (size_t k = 0; k < tensor_numel(m->params[i].grad); k++) {
            diff = fmax(diff, fabs(m->params[i].grad->data[k] - whole[at + k]));
            scale = fmax(scale, fabs(whole[at + k]));
        }
        double relative = diff / fmax(scale, 1e-30);
        if (relative > worst || scale == 0) worst = scale == 0 ? INFINITY : relative, worst_name = m->params[i].name;
    }
    EXPECT(worst < 1e-5,
           "two half-batches with loss / 2 accumulate the whole batch's gradients (worst max|difference| / max|gradient| %.1e, %s)",
           worst, worst_name);
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

// Philox4x32-10 against the known answers of the Random123 library (its kat_vectors), and
// dropout_philox's masks: every value 0 or 1 / (1 - p), value i from word i % 4 of counter i / 4,
// the kept share within 5 standard deviations of 1 - p, the same bits on 1 thread and on 4, and
// other bits for another stream or seed.
static void test_philox(void) {
    static const uint32_t known[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int k = 0; k < 3; k++) {
        Philox4x32 counter = {{known[k][0], known[k][1], known[k][2], known[k][3]}};
        Philox4x32 out = philox4x32_10(counter, known[k][4], known[k][5]);
        EXPECT(!memcmp(out.v, known[k] + 6, sizeof out.v), "Philox4x32-10, Random123's known answer %d: %08x %08x %08x %08x",
               k + 1, out.v[0], out.v[1], out.v[2], out.v[3]);
    }
    enum { N = 100003 };  // not a multiple of 4: the last evaluation's words are used in part
    const double p = 0.3;
    const uint64_t seed = 0x123456789abcdefULL, stream = 5ULL << 32 | 7;
    Tensor one = tensor_zeros(1, N, DEVICE_CPU), four = tensor_zeros(1, N, DEVICE_CPU), other = tensor_zeros(1, N, DEVICE_CPU);
#ifdef _OPENMP
    omp_set_num_threads(4);
#endif
    dropout_philox(seed, stream, p, N, &four);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    dropout_philox(seed, stream, p, N, &one);
    const float scale = 1.0f / (float)(1.0 - p);
    long kept = 0, odd = 0;
    for (long i = 0; i < N; i++) kept += one.data[i] == scale, odd += one.data[i] != scale && one.data[i] != 0.0f;
    double share = (double)kept / N, sd = sqrt(p * (1 - p) / N);
    EXPECT(odd == 0 && fabs(share - (1 - p)) < 5 * sd, "dropout_philox, p %.1f: %ld of %d kept (%.4f, 1 - p +- 5 sd: %.4f..%.4f), "
           "every value 0 or %g (%ld others)", p, kept, N, share, 1 - p - 5 * sd, 1 - p + 5 * sd, scale, odd);
    EXPECT(!memcmp(one.data, four.data, N * sizeof(float)), "dropout_philox: the same %d values on 1 thread and on 4", N);
    bool direct = true;
    for (long i = N - 7; i < N; i++) {  // the last values, from the last evaluation's words
        Philox4x32 counter = {{(uint32_t)(i / 4), 0, (uint32_t)stream, (uint32_t)(stream >> 32)}};
        uint32_t bits = philox4x32_10(counter, (uint32_t)seed, (uint32_t)(seed >> 32)).v[i % 4];
        direct &= one.data[i] == (philox_keeps(bits, (float)(1 - p)) ? scale : 0.0f);
    }
    EXPECT(direct, "dropout_philox: value i is word i %% 4 of Philox's counter (i / 4, stream) under the seed");
    long differ = 0;
    dropout_philox(seed, stream + 1, p, N, &other);
    for (long i = 0; i < N; i++) differ += other.data[i] != one.data[i];
    long differ_seed = 0;
    dropout_philox(seed + 1, stream, p, N, &other);
    for (long i = 0; i < N; i++) differ_seed += other.data[i] != one.data[i];
    // Independent masks differ at 2 p (1 - p) of the values: 42%.
    EXPECT(fabs((double)differ / N - 0.42) < 0.01 && fabs((double)differ_seed / N - 0.42) < 0.01,
           "dropout_philox: another stream differs at %.1f%% of the values, another seed at %.1f%% (independent: 42%%)",
           100.0 * differ / N, 100.0 * differ_seed / N);
    // dropout_philox_part: a split model's share of the whole mask (runs of a length, a stride apart,
    // from any first value: a micro-batch's rows, a tensor-parallel rank's heads), each value the
    // whole's, at alignments that start and end runs inside an evaluation's four words.
    const struct { long first, length, stride, runs; } parts[] = {
        {0, N, N, 1}, {1, 5, 7, 3}, {6, 13, 13, 2}, {4 * 2500 + 3, 2499, 9000, 10}, {N - 9, 9, 9, 1}, {17, 0, 3, 4}};
    long wrong = 0;
    for (size_t k = 0; k < sizeof parts / sizeof *parts; k++) {
        Tensor part = tensor_zeros(1, (int)(parts[k].length * parts[k].runs) + 1, DEVICE_CPU);
        part.data[parts[k].length * parts[k].runs] = -1.0f;  // past the part: left as it was
#ifdef _OPENMP
        omp_set_num_threads(k % 2 ? 4 : 1);
#endif
        dropout_philox_part(seed, stream, p, parts[k].first, parts[k].length, parts[k].stride, parts[k].runs, &part);
        for (long r = 0; r < parts[k].runs; r++)
            for (long i = 0; i < parts[k].length; i++)
                wrong += part.data[r * parts[k].length + i] != one.data[parts[k].first + r * parts[k].stride + i];
        wrong += part.data[parts[k].length * parts[k].runs] != -1.0f;
        tensor_free(&part);
    }
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    EXPECT(wrong == 0, "dropout_philox_part: %zu parts (runs from any value, a stride apart) are the whole mask's values "
           "there, nothing written past them (%ld wrong)", sizeof parts / sizeof *parts, wrong);
    tensor_free(&one), tensor_free(&four), tensor_free(&other);
}

int main(void) {
#ifdef _OPENMP
    // Some 8000 forwards of a model of a few thousand weights: threads would only wait for each other.
    omp_set_num_threads(1);
#endif
    rng_seed(&data_rng, 2024);
    test_philox();
    test_gradients(true, 0.0, false);
    test_gradients(false, 0.0, false);
    test_gradients(true, 0.3, false);  // dropout's masks on all four of its places, fixed by the seed
    test_gradients(true, 0.3, true);   // the same from Philox
    test_accumulation();
    test_names();
    return test_summary();
}
