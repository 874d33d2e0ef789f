// gpt.c: nanoGPT's GPT on the CPU or a GPU: gemm for the Linears, transformer_ops for the rest. See gpt.h.
#include "models/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "tensor/tensor_ops.h"
#include "tensor/transformer_ops.h"

static const char *const BLOCK_NAMES[GPT_BLOCK_TENSORS] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
};
// The four tensors outside the blocks, after the blocks' in param_index.
enum { TOP_WTE, TOP_WPE, TOP_LN_F_WEIGHT, TOP_LN_F_BIAS, TOP_TENSORS };

static bool is_bias(int kind) { return kind % 2 == 1; }  // the enum alternates weight, bias

// A block tensor's shape [rows, cols] (a bias or a LayerNorm weight is [1, n], stored [n]).
static void block_shape(const GptConfig *c, int kind, int *rows, int *cols) {
    int C = c->n_embd;
    static const int out_width[GPT_BLOCK_TENSORS] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};  // in units of C
    static const int in_width[GPT_BLOCK_TENSORS] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0};   // 0: a vector
    if (in_width[kind] == 0) *rows = 1, *cols = out_width[kind] * C;
    else *rows = out_width[kind] * C, *cols = in_width[kind] * C;
}

const char *gpt_config_problem(const GptConfig *c) {
    static char problem[160];
    if (!(c->dropout >= 0.0 && c->dropout < 1.0))
        snprintf(problem, sizeof problem, "--dropout %g is not a probability in [0, 1)", c->dropout);
    else if (c->n_embd % c->n_head != 0)
        snprintf(problem, sizeof problem, "--n_embd %d is not divisible by --n_head %d (each head takes n_embd / n_head)",
                 c->n_embd, c->n_head);
    else if ((long)4 * c->n_embd > (1L << 24) || (long)c->block_size * c->block_size > (1L << 24))
        snprintf(problem, sizeof problem, "--n_embd %d or --block_size %d is beyond this program's limit (4 n_embd and "
                 "block_size^2 up to 16777216)", c->n_embd, c->block_size);
    else return NULL;
    return problem;
}

void gpt_add_memory_need(MemoryNeed *need, const GptConfig *c, int max_batch) {
    const double L = c->n_layer, C = c->n_embd, V = c->vocab_size, T = c->block_size, H = c->n_head;
    const double N = (double)max_batch * T, B = max_batch;
    double params = 12 * L * C * C + (V + T) * C + (2 * L + 1) * C + (c->bias ? 11 * L * C + C : 0);
    double kept = N * (16 * L * C + 4 * L + 2 * C + 2 + 2 * V) + L * B * H * T * T;  // gpt_activation_floats
    if (c->dropout > 0) kept += N * C * (2 * L + 1) + 2 * L * B * H * T * T;             // its masks
    double scratch = N * C * (10 + (c->dropout > 0 ? 2 : 0)) + B * H * T * T;  // backward's [N, C..4C] buffers, d att
    // The batch's tokens, and on a GPU their index by token (transformer_ops.h's TokenBatch), 4 bytes each.
    double tokens = N + V + 1 + N;
    memory_need_add(need, "parameters", 4 * params);
    memory_need_add(need, "gradients", 4 * params);
    memory_need_add(need, "AdamW's moments", 8 * params);
    memory_need_add(need, "DDP's buckets", 4 * params);
    memory_need_add(need, "activations", 4 * (kept + scratch + tokens));
}

// Drawn on the host whatever the device, so that one seed gives one model on either.
static void fill_normal(Tensor *t, Rng *rng, float std) {
    float *values = xmalloc(tensor_numel(t) * sizeof(float) + 1);
    for (size_t i = 0; i < tensor_numel(t); i++) values[i] = std * rng_normal(rng);
    tensor_from_host(t, values);
    free(values);
}

static void add_param(Gpt *m, const char *name, Tensor *value, Tensor *grad, int index_slot) {
    Param *p = &m->params[m->n_params];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->value = value;
    p->grad = grad;
    // A matrix keeps its two dimensions in the file even with one row (wpe at --block_size 1).
    if (value->rows > 1 || strstr(name, "wpe") || strstr(name, "wte") || strstr(name, "c_"))
        if (!strstr(name, "bias")) p->dims[0] = value->rows, p->dims[1] = value->cols;
    m->param_index[index_slot] = m->n_params++;
}

Gpt *gpt_new(const GptConfig *config, int max_batch, Rng *rng, Device device) {
    CHECK(!gpt_config_problem(config), "%s", gpt_config_problem(config));
    Gpt *m = xcalloc(1, sizeof *m);
    m->config = *config;
    m->max_batch = max_batch;
    m->device = device;
    m->training = true;
    rng_seed(&m->dropout_rng, 0);
    const GptConfig *c = &m->config;
    const int V = c->vocab_size, C = c->n_embd, L = c->n_layer, T = c->block_size, H = c->n_head;
    const int N = max_batch * T;
    m->wte = tensor_zeros(V, C, device), m->grad_wte = tensor_zeros(V, C, device);
    m->wpe = tensor_zeros(T, C, device), m->grad_wpe = tensor_zeros(T, C, device);
    m->ln_f_weight = tensor_zeros(1, C, device), m->grad_ln_f_weight = tensor_zeros(1, C, device);
    if (c->bias) m->ln_f_bias = tensor_zeros(1, C, device), m->grad_ln_f_bias = tensor_zeros(1, C, device);
    m->blocks = xcalloc((size_t)L * GPT_BLOCK_TENSORS, sizeof(Tensor));
    m->grad_blocks = xcalloc((size_t)L * GPT_BLOCK_TENSORS, sizeof(Tensor));
    m->params = xcalloc((size_t)L * GPT_BLOCK_TENSORS + TOP_TENSORS, sizeof(Param));
    m->param_index = xmalloc(((size_t)L * GPT_BLOCK_TENSORS + TOP_TENSORS) * sizeof(int));
    for (int i = 0; i < L * GPT_BLOCK_TENSORS + TOP_TENSORS; i++) m->param_index[i] = -1;
    int top = L * GPT_BLOCK_TENSORS;  // param_index's slots of the four top tensors start here

    // nanoGPT's _init_weights, then its c_proj rule; the draws in model.parameters()' order.
    const float std = 0.02f, proj_std = (float)(0.02 / sqrt(2.0 * L));
    add_param(m, "transformer.wte.weight", &m->wte, &m->grad_wte, top + TOP_WTE);
    fill_normal(&m->wte, rng, std);
    add_param(m, "transformer.wpe.weight", &m->wpe, &m->grad_wpe, top + TOP_WPE);
    fill_normal(&m->wpe, rng, std);
    for (int l = 0; l < L; l++)
        for (int kind = 0; kind < GPT_BLOCK_TENSORS; kind++) {
            if (is_bias(kind) && !c->bias) continue;
            int rows, cols;
            block_shape(c, kind, &rows, &cols);
            Tensor *value = &m->blocks[l * GPT_BLOCK_TENSORS + kind], *grad = &m->grad_blocks[l * GPT_BLOCK_TENSORS + kind];
            *value = tensor_zeros(rows, cols, device);
            *grad = tensor_zeros(rows, cols, device);
            char name[64];
            snprintf(name, sizeof name, "transformer.h.%d.%s", l, BLOCK_NAMES[kind]);
            add_param(m, name, value, grad, l * GPT_BLOCK_TENSORS + kind);
            if (kind == GPT_LN_1_WEIGHT || kind == GPT_LN_2_WEIGHT) tensor_fill(value, 1.0f);
            else if (kind == GPT_ATTN_PROJ_WEIGHT || kind == GPT_FC_PROJ_WEIGHT) fill_normal(value, rng, proj_std);
            else if (!is_bias(kind)) fill_normal(value, rng, std);
        }
    add_param(m, "transformer.ln_f.weight", &m->ln_f_weight, &m->grad_ln_f_weight, top + TOP_LN_F_WEIGHT);
    tensor_fill(&m->ln_f_weight, 1.0f);
    if (c->bias) add_param(m, "transformer.ln_f.bias", &m->ln_f_bias, &m->grad_ln_f_bias, top + TOP_LN_F_BIAS);

    // Activations and scratch for N tokens.
    m->tokens = token_batch_new(N, V, device);
    m->targets = xmalloc((size_t)N * sizeof(int));
    m->embedded = tensor_zeros(N, C, device);
    m->acts = xcalloc((size_t)L, sizeof(GptBlockActivations));
    for (int l = 0; l < L; l++) {
        GptBlockActivations *a = &m->acts[l];
        a->ln_1 = tensor_zeros(N, C, device), a->ln_1_mean = tensor_zeros(1, N, device);
        a->ln_1_rstd = tensor_zeros(1, N, device);
        a->qkv = tensor_zeros(N, 3 * C, device);
        a->att = tensor_zeros(max_batch * H, T * T, device);
        a->attn_y = tensor_zeros(N, C, device);
        a->residual_1 = tensor_zeros(N, C, device);
        a->ln_2 = tensor_zeros(N, C, device), a->ln_2_mean = tensor_zeros(1, N, device);
        a->ln_2_rstd = tensor_zeros(1, N, device);
        a->fc = tensor_zeros(N, 4 * C, device);
        a->fc_gelu = tensor_zeros(N, 4 * C, device);
        a->residual_2 = tensor_zeros(N, C, device);
        if (c->dropout > 0) {
            a->att_mask = tensor_zeros(max_batch * H, T * T, device);
            a->att_dropped = tensor_zeros(max_batch * H, T * T, device);
            a->attn_proj_mask = tensor_zeros(N, C, device);
            a->mlp_proj_mask = tensor_zeros(N, C, device);
        }
    }
    if (c->dropout > 0) {
        m->embed_mask = tensor_zeros(N, C, device);
        m->proj_out = tensor_zeros(N, C, device);
        m->grad_proj_out = tensor_zeros(N, C, device);
    }
    m->ln_f = tensor_zeros(N, C, device), m->ln_f_mean = tensor_zeros(1, N, device);
    m->ln_f_rstd = tensor_zeros(1, N, device);
    m->logits = tensor_zeros(N, V, device);
    m->grad_logits = tensor_zeros(N, V, device);
    m->grad_residual = tensor_zeros(N, C, device);
    m->grad_ln = tensor_zeros(N, C, device);
    m->grad_qkv = tensor_zeros(N, 3 * C, device);
    m->grad_attn_y = tensor_zeros(N, C, device);
    m->grad_fc = tensor_zeros(N, 4 * C, device);
    m->grad_att = tensor_zeros(max_batch * H, T * T, device);
    return m;
}

size_t gpt_activation_floats(const Gpt *m) {
    size_t total = tensor_numel(&m->embedded) + tensor_numel(&m->ln_f) + tensor_numel(&m->ln_f_mean) +
                   tensor_numel(&m->ln_f_rstd) + tensor_numel(&m->logits) + tensor_numel(&m->grad_logits);
    for (int l = 0; l < m->config.n_layer; l++) {
        const GptBlockActivations *a = &m->acts[l];
        const Tensor *all[] = {&a->ln_1, &a->ln_1_mean, &a->ln_1_rstd, &a->qkv, &a->att, &a->attn_y, &a->residual_1,
                               &a->ln_2, &a->ln_2_mean, &a->ln_2_rstd, &a->fc, &a->fc_gelu, &a->residual_2,
                               &a->att_mask, &a->att_dropped, &a->attn_proj_mask, &a->mlp_proj_mask};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) total += tensor_numel(all[i]);
    }
    return total + tensor_numel(&m->embed_mask);
}

void gpt_free(Gpt *m) {
    if (!m) return;
    for (int i = 0; i < m->n_params; i++) tensor_free(m->params[i].value), tensor_free(m->params[i].grad);
    for (int l = 0; l < m->config.n_layer; l++) {
        GptBlockActivations *a = &m->acts[l];
        Tensor *all[] = {&a->ln_1, &a->ln_1_mean, &a->ln_1_rstd, &a->qkv, &a->att, &a->attn_y, &a->residual_1,
                         &a->ln_2, &a->ln_2_mean, &a->ln_2_rstd, &a->fc, &a->fc_gelu, &a->residual_2,
                         &a->att_mask, &a->att_dropped, &a->attn_proj_mask, &a->mlp_proj_mask};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    }
    Tensor *rest[] = {&m->embedded, &m->ln_f, &m->ln_f_mean, &m->ln_f_rstd, &m->logits, &m->grad_logits,
                      &m->grad_residual, &m->grad_ln, &m->grad_qkv, &m->grad_attn_y, &m->grad_fc,
                      &m->embed_mask, &m->proj_out, &m->grad_proj_out, &m->grad_att};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) tensor_free(rest[i]);
    free(m->acts), free(m->blocks), free(m->grad_blocks), free(m->params), free(m->param_index);
    token_batch_free(&m->tokens);
    free(m->targets);
    free(m);
}

size_t gpt_num_params(const Gpt *m, bool non_embedding) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += tensor_numel(m->params[i].value);
    return non_embedding ? n - tensor_numel(&m->wpe) : n;
}

double gpt_flops_per_token(const Gpt *m, int T) {
    const GptConfig *c = &m->config;
    return 6.0 * (double)gpt_num_params(m, true) + 12.0 * c->n_layer * c->n_head * (c->n_embd / c->n_head) * (double)T;
}

Param *gpt_state_dict(const Gpt *m, int *n) {
    Param *all = xcalloc((size_t)m->n_params + 1, sizeof(Param));
    memcpy(all, m->params, (size_t)m->n_params * sizeof(Param));
    all[m->n_params] = m->params[0];  // lm_head.weight: wte's tensor, last in model.state_dict()
    snprintf(all[m->n_params].name, sizeof all[m->n_params].name, "lm_head.weight");
    *n = m->n_params + 1;
    return all;
}

// The first `rows` rows of a [capacity, cols] buffer: this batch's part of it.
static Tensor rows_of(const Tensor *t, int rows) { return tensor_rows(t, rows); }

static Tensor *block_tensor(Gpt *m, int layer, int kind) { return &m->blocks[layer * GPT_BLOCK_TENSORS + kind]; }
static Tensor *block_grad(Gpt *m, int layer, int kind) { return &m->grad_blocks[layer * GPT_BLOCK_TENSORS + kind]; }
static const Tensor *bias_of(Gpt *m, int layer, int kind) { return m->config.bias ? block_tensor(m, layer, kind) : NULL; }

// y [N, out] = x @ weight^T (+ bias): nn.Linear.
static void linear(Gpt *m, int layer, int weight_kind, const Tensor *x, Tensor *y) {
    gemm(false, true, 1.0f, x, block_tensor(m, layer, weight_kind), 0.0f, y);
    if (m->config.bias) add_column_bias(y, block_tensor(m, layer, weight_kind + 1), false);
}

// Linear's backward: grad_weight += grad_y^T @ x, grad_bias += the column sums of grad_y, and
// grad_x = grad_y @ weight (+= with accumulate_x: a residual stream's gradient).
static void linear_back(Gpt *m, int layer, int weight_kind, const Tensor *x, const Tensor *grad_y, Tensor *grad_x,
                        bool accumulate_x) {
    gemm(true, false, 1.0f, grad_y, x, 1.0f, block_grad(m, layer, weight_kind));
    if (m->config.bias) add_sum_over_rows(grad_y, block_grad(m, layer, weight_kind + 1));
    gemm(false, false, 1.0f, grad_y, block_tensor(m, layer, weight_kind), accumulate_x ? 1.0f : 0.0f, grad_x);
}

void gpt_set_training(Gpt *m, bool training) { m->training = training; }
void gpt_seed_dropout(Gpt *m, uint64_t seed) { rng_seed(&m->dropout_rng, seed); }

// The masks of a forward of [B, T] in training, drawn in nanoGPT's order (the embeddings', then per
// block attention's, after attn.c_proj, after mlp.c_proj), all before the forward computes: on a GPU
// they are drawn on the host and copied (transformer_ops.h's dropout_draw), and so the host waits
// for the GPU once per forward, not once per mask.
static void draw_dropout_masks(Gpt *m, int B, int T) {
    const double p = m->config.dropout;
    const long tokens = (long)B * T * m->config.n_embd, scores = (long)B * m->config.n_head * T * T;
    dropout_draw(&m->dropout_rng, p, tokens, &m->embed_mask);
    for (int l = 0; l < m->config.n_layer; l++) {
        dropout_draw(&m->dropout_rng, p, scores, &m->acts[l].att_mask);
        dropout_draw(&m->dropout_rng, p, tokens, &m->acts[l].attn_proj_mask);
        dropout_draw(&m->dropout_rng, p, tokens, &m->acts[l].mlp_proj_mask);
    }
}

// residual_out = residual_in + dropout(y @ weight^T + bias): a block's c_proj and its residual.
// Without dropout in one GEMM that adds onto a copy of residual_in.
static void projection_residual(Gpt *m, int layer, int weight_kind, const Tensor *y, const Tensor *residual_in,
                                Tensor *residual_out, Tensor *mask, bool dropout) {
    if (!dropout) {
        tensor_copy(residual_out, residual_in);
        gemm(false, true, 1.0f, y, block_tensor(m, layer, weight_kind), 1.0f, residual_out);
        if (m->config.bias) add_column_bias(residual_out, block_tensor(m, layer, weight_kind + 1), false);
        return;
    }
    Tensor projected = rows_of(&m->proj_out, y->rows);  // c_proj(y), then its dropout, then the residual
    linear(m, layer, weight_kind, y, &projected);
    multiply_by_mask(&projected, mask);
    add_elementwise(residual_in, &projected, residual_out);
}

const Tensor *gpt_forward(Gpt *m, const int *inputs, int B, int T) {
    const GptConfig *c = &m->config;
    CHECK(B >= 1 && B <= m->max_batch && T >= 1 && T <= c->block_size, "gpt_forward: batch [%d, %d] beyond [%d, %d]",
          B, T, m->max_batch, c->block_size);
    const int N = B * T, H = c->n_head;
    m->B = B, m->T = T;
    token_batch_set(&m->tokens, inputs, N);  // (each token checked against the vocabulary)
    const bool dropout = m->training && c->dropout > 0;
    if (dropout) draw_dropout_masks(m, B, T);
    Tensor x = rows_of(&m->embedded, N);  // [N, C]
    embedding_forward(&m->tokens, &m->wte, &m->wpe, B, T, &x);
    if (dropout) multiply_by_mask(&x, &m->embed_mask);  // transformer.drop
    for (int l = 0; l < c->n_layer; l++) {
        GptBlockActivations *a = &m->acts[l];
        Tensor ln_1 = rows_of(&a->ln_1, N), qkv = rows_of(&a->qkv, N), attn_y = rows_of(&a->attn_y, N);
        Tensor residual_1 = rows_of(&a->residual_1, N), ln_2 = rows_of(&a->ln_2, N), fc = rows_of(&a->fc, N);
        Tensor fc_gelu = rows_of(&a->fc_gelu, N), residual_2 = rows_of(&a->residual_2, N);
        // x = x + attn(ln_1(x))
        layernorm_forward(&x, block_tensor(m, l, GPT_LN_1_WEIGHT), bias_of(m, l, GPT_LN_1_BIAS), &ln_1, &a->ln_1_mean,
                          &a->ln_1_rstd);
        linear(m, l, GPT_ATTN_WEIGHT, &ln_1, &qkv);                   // [N, 3C]
        attention_forward(&qkv, B, T, H, &a->att, dropout ? &a->att_mask : NULL, dropout ? &a->att_dropped : NULL,
                          &attn_y);                                   // attn_dropout's mask drawn above
        projection_residual(m, l, GPT_ATTN_PROJ_WEIGHT, &attn_y, &x, &residual_1, &a->attn_proj_mask, dropout);  // x + c_proj(y)
        // x = x + mlp(ln_2(x))
        layernorm_forward(&residual_1, block_tensor(m, l, GPT_LN_2_WEIGHT), bias_of(m, l, GPT_LN_2_BIAS), &ln_2,
                          &a->ln_2_mean, &a->ln_2_rstd);
        linear(m, l, GPT_FC_WEIGHT, &ln_2, &fc);                      // [N, 4C]
        gelu_forward(&fc, &fc_gelu);
        projection_residual(m, l, GPT_FC_PROJ_WEIGHT, &fc_gelu, &residual_1, &residual_2, &a->mlp_proj_mask, dropout);
        x = residual_2;
    }
    Tensor ln_f = rows_of(&m->ln_f, N);
    m->last_logits = rows_of(&m->logits, N);
    layernorm_forward(&x, &m->ln_f_weight, c->bias ? &m->ln_f_bias : NULL, &ln_f, &m->ln_f_mean, &m->ln_f_rstd);
    gemm(false, true, 1.0f, &ln_f, &m->wte, 0.0f, &m->last_logits);  // lm_head: ln_f(x) @ wte^T, [N, V]
    return &m->last_logits;
}

void gpt_logits_row(const Gpt *m, int row, float *host) {
    CHECK(row >= 0 && row < m->last_logits.rows, "gpt_logits_row: row %d of %d", row, m->last_logits.rows);
    const int V = m->config.vocab_size;
    Tensor one = {.data = m->last_logits.data + (size_t)row * V, .rows = 1, .cols = V, .device = m->device};
    tensor_to_host(&one, host);
}

float gpt_loss(Gpt *m, const int *targets) {
    const int N = m->B * m->T;
    memcpy(m->targets, targets, (size_t)N * sizeof(int));
    Tensor logits = rows_of(&m->logits, N), grad_logits = rows_of(&m->grad_logits, N);
    return softmax_cross_entropy(&logits, targets, &grad_logits);  // the mean over B * T tokens
}

void gpt_scale_loss(Gpt *m, float factor) {
    if (factor == 1.0f) return;  // x * 1 is x: a pass over [N, V] saved (no accumulation, one rank)
    Tensor grad_logits = rows_of(&m->grad_logits, m->B * m->T);
    tensor_scale(&grad_logits, factor);
}

// The gradient of a c_proj's output, through its dropout: grad_residual itself without dropout,
// else grad_residual * mask in a scratch (the residual stream's gradient goes on unmasked).
static Tensor dropout_back(Gpt *m, const Tensor *mask, const Tensor *grad_residual) {
    if (!(m->training && m->config.dropout > 0)) return *grad_residual;
    Tensor masked = rows_of(&m->grad_proj_out, grad_residual->rows);
    tensor_copy(&masked, grad_residual);
    multiply_by_mask(&masked, mask);
    return masked;
}

static void ready(Gpt *m, int slot, GradReadyHook hook, void *context) {
    if (hook && m->param_index[slot] >= 0) hook(context, m->param_index[slot]);
}

void gpt_backward(Gpt *m, GradReadyHook hook, void *context) {
    const GptConfig *c = &m->config;
    const int B = m->B, T = m->T, N = B * T, L = c->n_layer, top = L * GPT_BLOCK_TENSORS;
    const bool dropout = m->training && c->dropout > 0;  // as the forward had it
    Tensor grad_logits = rows_of(&m->grad_logits, N), ln_f = rows_of(&m->ln_f, N);
    Tensor grad_residual = rows_of(&m->grad_residual, N), grad_ln = rows_of(&m->grad_ln, N);
    Tensor grad_qkv = rows_of(&m->grad_qkv, N), grad_attn_y = rows_of(&m->grad_attn_y, N);
    Tensor grad_fc = rows_of(&m->grad_fc, N);
    // The head: wte's gradient gets its first part here (its last comes from the embedding).
    gemm(true, false, 1.0f, &grad_logits, &ln_f, 1.0f, &m->grad_wte);  // [V, N] @ [N, C]
    gemm(false, false, 1.0f, &grad_logits, &m->wte, 0.0f, &grad_ln);    // d ln_f(x), [N, C]
    // ln_f: the residual stream's gradient starts here.
    Tensor x_last = rows_of(L ? &m->acts[L - 1].residual_2 : &m->embedded, N);
    tensor_fill(&grad_residual, 0.0f);
    layernorm_backward(&x_last, &m->ln_f_weight, &m->ln_f_mean, &m->ln_f_rstd, &grad_ln, &grad_residual,
                       &m->grad_ln_f_weight, c->bias ? &m->grad_ln_f_bias : NULL);
    ready(m, top + TOP_LN_F_WEIGHT, hook, context);
    ready(m, top + TOP_LN_F_BIAS, hook, context);
    for (int l = L - 1; l >= 0; l--) {
        GptBlockActivations *a = &m->acts[l];
        Tensor x_in = rows_of(l ? &m->acts[l - 1].residual_2 : &m->embedded, N);  // the block's input
        Tensor ln_1 = rows_of(&a->ln_1, N), attn_y = rows_of(&a->attn_y, N), residual_1 = rows_of(&a->residual_1, N);
        Tensor ln_2 = rows_of(&a->ln_2, N), fc = rows_of(&a->fc, N), fc_gelu = rows_of(&a->fc_gelu, N);
        int slot = l * GPT_BLOCK_TENSORS;
        // x = x + mlp(ln_2(x)): the residual passes grad_residual through; the MLP adds its part.
        Tensor grad_mlp_out = dropout_back(m, &a->mlp_proj_mask, &grad_residual);  // d mlp.c_proj's output
        linear_back(m, l, GPT_FC_PROJ_WEIGHT, &fc_gelu, &grad_mlp_out, &grad_fc, false);  // d gelu(fc), [N, 4C]
        ready(m, slot + GPT_FC_PROJ_WEIGHT, hook, context), ready(m, slot + GPT_FC_PROJ_BIAS, hook, context);
        gelu_backward(&fc, &grad_fc, &grad_fc);
        linear_back(m, l, GPT_FC_WEIGHT, &ln_2, &grad_fc, &grad_ln, false);                // d ln_2(x)
        ready(m, slot + GPT_FC_WEIGHT, hook, context), ready(m, slot + GPT_FC_BIAS, hook, context);
        layernorm_backward(&residual_1, block_tensor(m, l, GPT_LN_2_WEIGHT), &a->ln_2_mean, &a->ln_2_rstd, &grad_ln,
                           &grad_residual, block_grad(m, l, GPT_LN_2_WEIGHT),
                           c->bias ? block_grad(m, l, GPT_LN_2_BIAS) : NULL);
        ready(m, slot + GPT_LN_2_WEIGHT, hook, context), ready(m, slot + GPT_LN_2_BIAS, hook, context);
        // x = x + attn(ln_1(x))
        Tensor grad_attn_out = dropout_back(m, &a->attn_proj_mask, &grad_residual);  // d attn.c_proj's output
        linear_back(m, l, GPT_ATTN_PROJ_WEIGHT, &attn_y, &grad_attn_out, &grad_attn_y, false);
        ready(m, slot + GPT_ATTN_PROJ_WEIGHT, hook, context), ready(m, slot + GPT_ATTN_PROJ_BIAS, hook, context);
        Tensor qkv = rows_of(&a->qkv, N);
        attention_backward(&qkv, &a->att, dropout ? &a->att_mask : NULL, dropout ? &a->att_dropped : NULL, &grad_attn_y,
                           B, T, c->n_head, &m->grad_att, &grad_qkv);
        linear_back(m, l, GPT_ATTN_WEIGHT, &ln_1, &grad_qkv, &grad_ln, false);
        ready(m, slot + GPT_ATTN_WEIGHT, hook, context), ready(m, slot + GPT_ATTN_BIAS, hook, context);
        layernorm_backward(&x_in, block_tensor(m, l, GPT_LN_1_WEIGHT), &a->ln_1_mean, &a->ln_1_rstd, &grad_ln,
                           &grad_residual, block_grad(m, l, GPT_LN_1_WEIGHT),
                           c->bias ? block_grad(m, l, GPT_LN_1_BIAS) : NULL);
        ready(m, slot + GPT_LN_1_WEIGHT, hook, context), ready(m, slot + GPT_LN_1_BIAS, hook, context);
    }
    if (dropout) multiply_by_mask(&grad_residual, &m->embed_mask);  // through transformer.drop
    embedding_backward(&m->tokens, &grad_residual, B, T, &m->grad_wte, &m->grad_wpe);
    ready(m, top + TOP_WPE, hook, context);
    ready(m, top + TOP_WTE, hook, context);
}

void gpt_zero_grad(Gpt *m) {
    for (int i = 0; i < m->n_params; i++) tensor_fill(m->params[i].grad, 0.0f);
}
