// gpt.c: nanoGPT's GPT on the CPU or a GPU: gemm for the Linears, transformer_ops for the rest. See gpt.h.
#include "models/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "comm/collectives.h"
#include "tensor/tensor_ops.h"
#include "tensor/transformer_ops.h"

static const char *const BLOCK_NAMES[GPT_BLOCK_TENSORS] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
};
// The four tensors outside the blocks, after the blocks' in param_index.
enum { TOP_WTE, TOP_WPE, TOP_LN_F_WEIGHT, TOP_LN_F_BIAS, TOP_TENSORS };

static bool is_bias(int kind) { return kind % 2 == 1; }  // the enum alternates weight, bias

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

// The floats a part holds: n_blocks blocks split tp ways, with or without the embeddings and the
// head, activations for max_batch sequences (the formulas behind gpt_activation_floats and the
// parameter counts; gpt_add_memory_need's whole model is n_layer blocks, tp 1, both ends).
typedef struct {
    double params, kept, scratch, tokens;
    double largest_operand, largest_pair_operand;  // of a Linear's or the head's product; of attention's products
} PartFloats;

static PartFloats part_floats(const GptConfig *c, int max_batch, int n_blocks, int tp, bool embeddings, bool head,
                              int recompute_batch, bool sequence_parallel) {
    const double L = n_blocks, C = c->n_embd, V = c->vocab_size, T = c->block_size, H = c->n_head / tp;
    const double N = (double)max_batch * T, B = max_batch;
    const double S = sequence_parallel ? tp : 1;  // the token-wise regions' rows are N / S
    PartFloats f;
    // Per block: 12 C^2 / tp of the Linears, 2 C of the LayerNorms; biases 7 C / tp of the
    // column-parallel Linears, C + C of the row-parallel ones' and the LayerNorms' (replicated).
    f.params = L * (12 * C * C / tp + 2 * C + (c->bias ? 7 * C / tp + 4 * C : 0)) + (embeddings || head ? V * C : 0) +
               (embeddings ? T * C : 0) + (head ? (c->bias ? 2 : 1) * C : 0);
    // Per block and token: ln_1, residual_1, ln_2, residual_2 (4 C) and their 4 statistics (1 / S
    // of the tokens: sequence parallelism's), and split tp ways: qkv 3C, attn_y C, fc and its GELU
    // 8C; attention's probabilities H T^2 per sequence. The stage's input N C / S; the head's ln_f
    // (gathered: the head needs every token), its statistics and the logits with their gradient.
    const double ends = N * C / S + (head ? N * (C + 2 / S + 2 * V) : 0);
    f.kept = N * L * ((4 * C + 4) / S + 12 * C / tp) + L * B * H * T * T + ends;
    if (recompute_batch) {  // each block's output kept; one micro-batch's inside, shared
        const double Bi = recompute_batch;
        f.kept = N * L * C / S + Bi * T * ((3 * C + 4) / S + 12 * C / tp) + Bi * H * T * T + ends;
    }
    // Dropout's masks: the embeddings' (the first stage's) and two per block on the token-wise rows,
    // attention's on this rank's heads, its probabilities after it too; with recompute the blocks'
    // are one micro-batch's inside, drawn again.
    const double blocks_masks = recompute_batch ? 2 * recompute_batch * T * (C / S + H * T) : 2 * L * B * T * (C / S + H * T);
    if (c->dropout > 0) f.kept += (embeddings ? N * C / S : 0) + blocks_masks;
    // Backward's [N, C..4C] buffers (grad_residual, grad_ln; split: grad_qkv, grad_attn_y, grad_fc),
    // d att, and with dropout or tp > 1 a c_proj's output before the residual (and its gradient);
    // sequence parallelism's gathered rows and a LayerNorm's partial gradients.
    f.scratch = N * (C / S + C + 8 * C / tp) + B * H * T * T + (c->dropout > 0 ? 2 * N * C : tp > 1 ? N * C : 0) +
                (head ? 0 : N * C / S) +  // a stage's d output, received
                (sequence_parallel ? N * C + 2 * C : 0);
    // The batch's tokens, and on a GPU their index by token (transformer_ops.h's TokenBatch).
    f.tokens = embeddings ? N + V + 1 + N : 0;
    // What --dtype bfloat16 rounds: a Linear's input, weight or output gradient (fc's [N, 4C / tp] the
    // largest), the head's wte [V, C] and logits' gradient [N, V]; attention's probabilities (all B
    // sequences' H heads at once, as their batched products read them) or qkv.
    f.largest_operand = fmax(N * 4 * C / tp, head ? fmax(V * C, N * V) : 0);
    f.largest_pair_operand = fmax(B * H * T * T, N * 3 * C / tp);
    return f;
}

static void add_part_need(MemoryNeed *need, PartFloats f) {
    memory_need_add(need, "parameters", 4 * f.params);
    memory_need_add(need, "gradients", 4 * f.params);
    memory_need_add(need, "AdamW's moments", 8 * f.params);
    memory_need_add(need, "DDP's buckets", 4 * f.params);
    memory_need_add(need, "activations", 4 * (f.kept + f.scratch + f.tokens));
    matmul_add_memory_need(need, f.largest_operand);  // (nothing with float32 matmuls)
    matmul_add_memory_need(need, f.largest_pair_operand);
}

void gpt_add_memory_need(MemoryNeed *need, const GptConfig *c, int max_batch) {
    add_part_need(need, part_floats(c, max_batch, c->n_layer, 1, true, true, 0, false));
}

void gpt_add_part_memory_need(MemoryNeed *need, const GptConfig *c, int max_batch, const GptSplit *split) {
    const int tp = split->tensor_group ? split->tensor_group->size : 1;
    add_part_need(need, part_floats(c, max_batch, split->end_layer - split->first_layer, tp, split->first_layer == 0,
                                    split->end_layer == c->n_layer, split->recompute_batch,
                                    split->sequence_parallel && tp > 1));
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

// How Megatron splits a block tensor over T tensor-parallel ranks: along its rows or its columns,
// in `groups` equal groups each cut T ways (c_attn's rows: q, k and v, each by heads), or not at all
// (groups 0: the LayerNorms and the row-parallel Linears' biases, replicated).
typedef struct {
    int groups;
    bool by_columns;
} ShardLayout;

static ShardLayout shard_layout(int kind) {
    switch (kind) {
    case GPT_ATTN_WEIGHT: return (ShardLayout){3, false};      // column-parallel: its output rows, by heads
    case GPT_ATTN_BIAS: return (ShardLayout){3, true};         // (a bias is stored [1, out])
    case GPT_FC_WEIGHT: return (ShardLayout){1, false};
    case GPT_FC_BIAS: return (ShardLayout){1, true};
    case GPT_ATTN_PROJ_WEIGHT: case GPT_FC_PROJ_WEIGHT: return (ShardLayout){1, true};  // row-parallel: its input columns
    default: return (ShardLayout){0, false};
    }
}

// Copies between a whole tensor [rows, cols] and rank `rank`'s shard of it (of `size`), on the host:
// whole -> shard with to_shard, else shard -> whole.
static void shard_copy(ShardLayout layout, float *whole, int rows, int cols, float *shard, int rank, int size,
                       bool to_shard) {
    if (layout.groups == 0 || size == 1) {
        if (to_shard) memcpy(shard, whole, (size_t)rows * cols * sizeof(float));
        else memcpy(whole, shard, (size_t)rows * cols * sizeof(float));
        return;
    }
    if (!layout.by_columns) {  // whole rows: groups of rows / groups, each cut in `size` runs
        int group_rows = rows / layout.groups, piece = group_rows / size;
        for (int g = 0; g < layout.groups; g++) {
            float *w = whole + ((size_t)g * group_rows + (size_t)rank * piece) * cols, *s = shard + (size_t)g * piece * cols;
            if (to_shard) memcpy(s, w, (size_t)piece * cols * sizeof(float));
            else memcpy(w, s, (size_t)piece * cols * sizeof(float));
        }
        return;
    }
    int group_cols = cols / layout.groups, piece = group_cols / size, shard_cols = cols / size;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < layout.groups; g++) {
            float *w = whole + (size_t)r * cols + (size_t)g * group_cols + (size_t)rank * piece;
            float *s = shard + (size_t)r * shard_cols + (size_t)g * piece;
            if (to_shard) memcpy(s, w, (size_t)piece * sizeof(float));
            else memcpy(w, s, (size_t)piece * sizeof(float));
        }
}

// A block tensor's shape [rows, cols] on one of tp ranks (a bias or a LayerNorm weight is [1, n],
// stored [n]).
static void block_shape(const GptConfig *c, int kind, int tp, int *rows, int *cols) {
    int C = c->n_embd;
    static const int out_width[GPT_BLOCK_TENSORS] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};  // in units of C
    static const int in_width[GPT_BLOCK_TENSORS] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0};   // 0: a vector
    if (in_width[kind] == 0) *rows = 1, *cols = out_width[kind] * C;
    else *rows = out_width[kind] * C, *cols = in_width[kind] * C;
    ShardLayout layout = shard_layout(kind);
    if (layout.groups && layout.by_columns) *cols /= tp;
    else if (layout.groups) *rows /= tp;
}

// The tensors of the part (zeros, named), in model.parameters()' order, and its activations.
static Gpt *gpt_allocate(const GptConfig *config, int max_batch, const GptSplit *split, Device device) {
    CHECK(!gpt_config_problem(config), "%s", gpt_config_problem(config));
    Gpt *m = xcalloc(1, sizeof *m);
    m->config = *config;
    m->max_batch = max_batch;
    m->device = device;
    m->training = true;
    gpt_seed_dropout(m, 0);
    m->dropout_philox = device == DEVICE_CUDA;
    const GptConfig *c = &m->config;
    m->first_layer = split ? split->first_layer : 0;
    m->n_blocks = split ? split->end_layer - split->first_layer : c->n_layer;
    m->has_embeddings = m->first_layer == 0;
    m->has_head = m->first_layer + m->n_blocks == c->n_layer;
    m->tensor_group = split && split->tensor_group && split->tensor_group->size > 1 ? split->tensor_group : NULL;
    m->tp_rank = m->tensor_group ? m->tensor_group->rank : 0;
    m->tp_size = m->tensor_group ? m->tensor_group->size : 1;
    m->recompute_batch = split ? split->recompute_batch : 0;
    m->sequence_parallel = split && split->sequence_parallel && m->tp_size > 1;
    const int V = c->vocab_size, C = c->n_embd, L = m->n_blocks, T = c->block_size, tp = m->tp_size;
    const int H = c->n_head / tp, N = max_batch * T;
    const int S = m->sequence_parallel ? tp : 1, NS = N / S;  // the token-wise regions' rows
    CHECK(m->first_layer >= 0 && L >= 1 && m->first_layer + L <= c->n_layer && c->n_head % tp == 0 &&
          (4 * C) % tp == 0 && N % S == 0,
          "gpt: blocks [%d, %d) of %d split %d ways (%d tokens over %d)", m->first_layer, m->first_layer + L,
          c->n_layer, tp, N, S);
    m->blocks = xcalloc((size_t)L * GPT_BLOCK_TENSORS, sizeof(Tensor));
    m->grad_blocks = xcalloc((size_t)L * GPT_BLOCK_TENSORS, sizeof(Tensor));
    m->params = xcalloc((size_t)L * GPT_BLOCK_TENSORS + TOP_TENSORS, sizeof(Param));
    m->param_index = xmalloc(((size_t)L * GPT_BLOCK_TENSORS + TOP_TENSORS) * sizeof(int));
    for (int i = 0; i < L * GPT_BLOCK_TENSORS + TOP_TENSORS; i++) m->param_index[i] = -1;
    int top = L * GPT_BLOCK_TENSORS;  // param_index's slots of the four top tensors start here

    if (m->has_embeddings || m->has_head) {  // the head's weight is wte's: on the last stage too
        m->wte = tensor_zeros(V, C, device), m->grad_wte = tensor_zeros(V, C, device);
        add_param(m, "transformer.wte.weight", &m->wte, &m->grad_wte, top + TOP_WTE);
    }
    if (m->has_embeddings) {
        m->wpe = tensor_zeros(T, C, device), m->grad_wpe = tensor_zeros(T, C, device);
        add_param(m, "transformer.wpe.weight", &m->wpe, &m->grad_wpe, top + TOP_WPE);
    }
    for (int l = 0; l < L; l++)
        for (int kind = 0; kind < GPT_BLOCK_TENSORS; kind++) {
            if (is_bias(kind) && !c->bias) continue;
            int rows, cols;
            block_shape(c, kind, tp, &rows, &cols);
            Tensor *value = &m->blocks[l * GPT_BLOCK_TENSORS + kind], *grad = &m->grad_blocks[l * GPT_BLOCK_TENSORS + kind];
            *value = tensor_zeros(rows, cols, device);
            *grad = tensor_zeros(rows, cols, device);
            char name[64];
            snprintf(name, sizeof name, "transformer.h.%d.%s", m->first_layer + l, BLOCK_NAMES[kind]);
            add_param(m, name, value, grad, l * GPT_BLOCK_TENSORS + kind);
        }
    if (m->has_head) {
        m->ln_f_weight = tensor_zeros(1, C, device), m->grad_ln_f_weight = tensor_zeros(1, C, device);
        add_param(m, "transformer.ln_f.weight", &m->ln_f_weight, &m->grad_ln_f_weight, top + TOP_LN_F_WEIGHT);
        if (c->bias) {
            m->ln_f_bias = tensor_zeros(1, C, device), m->grad_ln_f_bias = tensor_zeros(1, C, device);
            add_param(m, "transformer.ln_f.bias", &m->ln_f_bias, &m->grad_ln_f_bias, top + TOP_LN_F_BIAS);
        }
    }

    // Activations and scratch for N tokens (a later stage's input is `embedded`).
    if (m->has_embeddings) m->slot_tokens = xcalloc((size_t)max_batch, sizeof(TokenBatch));
    m->targets = xmalloc((size_t)N * sizeof(int));
    m->embedded = tensor_zeros(NS, C, device);
    m->acts = xcalloc((size_t)L, sizeof(GptBlockActivations));
    // With recompute, block 0's inside is allocated for a micro-batch and the other blocks share it.
    const int inside_batch = m->recompute_batch ? m->recompute_batch : max_batch, NI = inside_batch * T, NIS = NI / S;
    CHECK(inside_batch <= max_batch && NI % S == 0, "gpt: recompute for micro-batches of %d sequences (of %d)",
          inside_batch, max_batch);
    for (int l = 0; l < L; l++) {
        GptBlockActivations *a = &m->acts[l];
        a->residual_2 = tensor_zeros(NS, C, device);
        if (m->recompute_batch && l > 0) {
            Tensor kept = a->residual_2;
            *a = m->acts[0], a->residual_2 = kept;
            continue;
        }
        a->ln_1 = tensor_zeros(NIS, C, device), a->ln_1_mean = tensor_zeros(1, NIS, device);
        a->ln_1_rstd = tensor_zeros(1, NIS, device);
        a->qkv = tensor_zeros(NI, 3 * C / tp, device);
        a->att = tensor_zeros(inside_batch * H, T * T, device);
        a->attn_y = tensor_zeros(NI, C / tp, device);
        a->residual_1 = tensor_zeros(NIS, C, device);
        a->ln_2 = tensor_zeros(NIS, C, device), a->ln_2_mean = tensor_zeros(1, NIS, device);
        a->ln_2_rstd = tensor_zeros(1, NIS, device);
        a->fc = tensor_zeros(NI, 4 * C / tp, device);
        a->fc_gelu = tensor_zeros(NI, 4 * C / tp, device);
        if (c->dropout > 0) {  // (part of the inside: with recompute, drawn again)
            a->att_mask = tensor_zeros(inside_batch * H, T * T, device);
            a->att_dropped = tensor_zeros(inside_batch * H, T * T, device);
            a->attn_proj_mask = tensor_zeros(NIS, C, device);
            a->mlp_proj_mask = tensor_zeros(NIS, C, device);
        }
    }
    if (c->dropout > 0) {
        if (m->has_embeddings) m->embed_mask = tensor_zeros(NS, C, device);
        m->slot_micro_batch = xcalloc((size_t)max_batch, sizeof(int));
        m->grad_proj_out = tensor_zeros(N, C, device);
    }
    if (c->dropout > 0 || tp > 1) m->proj_out = tensor_zeros(N, C, device);
    if (m->has_head) {
        m->ln_f = tensor_zeros(N, C, device), m->ln_f_mean = tensor_zeros(1, NS, device);
        m->ln_f_rstd = tensor_zeros(1, NS, device);
        m->logits = tensor_zeros(N, V, device);
        m->grad_logits = tensor_zeros(N, V, device);
    }
    m->grad_residual = tensor_zeros(NS, C, device);
    if (!m->has_head) m->grad_output = tensor_zeros(NS, C, device);
    if (m->sequence_parallel) {
        m->gathered = tensor_zeros(N, C, device);
        m->grad_layernorm_part = tensor_zeros(2, C, device);
    }
    m->grad_ln = tensor_zeros(N, C, device);
    m->grad_qkv = tensor_zeros(N, 3 * C / tp, device);
    m->grad_attn_y = tensor_zeros(N, C / tp, device);
    m->grad_fc = tensor_zeros(N, 4 * C / tp, device);
    m->grad_att = tensor_zeros(max_batch * H, T * T, device);
    return m;
}

Gpt *gpt_new(const GptConfig *config, int max_batch, Rng *rng, Device device) {
    Gpt *m = gpt_allocate(config, max_batch, NULL, device);
    // nanoGPT's _init_weights, then its c_proj rule; the draws in model.parameters()' order.
    const float std = 0.02f, proj_std = (float)(0.02 / sqrt(2.0 * config->n_layer));
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        if (strstr(p->name, "ln_") && strstr(p->name, ".weight")) tensor_fill(p->value, 1.0f);   // LayerNorms: 1
        else if (strstr(p->name, "c_proj.weight")) fill_normal(p->value, rng, proj_std);
        else if (!strstr(p->name, ".bias")) fill_normal(p->value, rng, std);                     // biases: 0
    }
    return m;
}

// The tensor of `whole` that a part's params[index] is (a part of): the same name.
static const Param *whole_param(const Gpt *whole, const char *name) {
    for (int i = 0; i < whole->n_params; i++)
        if (strcmp(whole->params[i].name, name) == 0) return &whole->params[i];
    CHECK(false, "gpt: the whole model has no %s", name);
    return NULL;
}

// The block tensor kind of a name ("transformer.h.3.attn.c_attn.weight": GPT_ATTN_WEIGHT), -1 for the
// tensors outside the blocks.
static int kind_of(const char *name) {
    const char *dot = strncmp(name, "transformer.h.", 14) == 0 ? strchr(name + 14, '.') : NULL;
    if (!dot) return -1;
    for (int kind = 0; kind < GPT_BLOCK_TENSORS; kind++)
        if (strcmp(dot + 1, BLOCK_NAMES[kind]) == 0) return kind;
    return -1;
}

Gpt *gpt_new_part(const Gpt *whole, int max_batch, const GptSplit *split, Device device) {
    CHECK(whole->n_blocks == whole->config.n_layer && whole->device == DEVICE_CPU, "gpt_new_part: a whole model on the host");
    Gpt *m = gpt_allocate(&whole->config, max_batch, split, device);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        const Param *w = whole_param(whole, p->name);
        int kind = kind_of(p->name);
        float *shard = xmalloc(tensor_numel(p->value) * sizeof(float));
        shard_copy(shard_layout(kind < 0 ? GPT_LN_1_WEIGHT : kind), w->value->data, w->value->rows, w->value->cols, shard,
                   m->tp_rank, m->tp_size, true);
        tensor_from_host(p->value, shard);
        free(shard);
    }
    return m;
}

bool gpt_owns(const Gpt *m, int index) {
    const char *name = m->params[index].name;
    if (strcmp(name, "transformer.wte.weight") == 0 && !m->has_embeddings) return false;  // the tied head's copy
    int kind = kind_of(name);
    return m->tp_rank == 0 || (kind >= 0 && shard_layout(kind).groups > 0);
}

GptParamBoxes gpt_param_boxes(const Gpt *m, int index) {
    const Param *p = &m->params[index];
    int kind = kind_of(p->name), rows = p->value->rows, cols = p->value->cols;  // (the tensors outside the blocks are whole)
    if (kind >= 0) block_shape(&m->config, kind, 1, &rows, &cols);
    GptParamBoxes b = {.vector = rows == 1, .rows = rows, .cols = cols, .n_boxes = 1, .count = {{rows, cols}}};
    ShardLayout layout = shard_layout(kind < 0 ? GPT_LN_1_WEIGHT : kind);
    if (layout.groups == 0 || m->tp_size == 1) return b;
    const int t = m->tp_rank, T = m->tp_size;
    b.n_boxes = layout.groups;
    for (int g = 0; g < layout.groups; g++) {
        if (layout.by_columns) {  // (groups > 1 only for a bias: one row, so each group's columns are contiguous)
            int piece = cols / layout.groups / T;
            b.offset[g][0] = 0, b.offset[g][1] = (long long)g * (cols / layout.groups) + (long long)t * piece;
            b.count[g][0] = rows, b.count[g][1] = piece;
        } else {
            int piece = rows / layout.groups / T;
            b.offset[g][0] = (long long)g * (rows / layout.groups) + (long long)t * piece, b.offset[g][1] = 0;
            b.count[g][0] = piece, b.count[g][1] = cols;
        }
    }
    CHECK(!layout.by_columns || layout.groups == 1 || rows == 1, "gpt: %s split by columns in %d groups", p->name, layout.groups);
    return b;
}

void gpt_part_to_whole(const Gpt *m, Gpt *whole) {
    CHECK(whole->device == DEVICE_CPU, "gpt_part_to_whole: a whole model on the host");
    for (int i = 0; i < m->n_params; i++) {
        if (!gpt_owns(m, i)) continue;
        const Param *p = &m->params[i], *w = whole_param(whole, p->name);
        int kind = kind_of(p->name);
        float *shard = xmalloc(tensor_numel(p->value) * sizeof(float));
        tensor_to_host(p->value, shard);
        shard_copy(shard_layout(kind < 0 ? GPT_LN_1_WEIGHT : kind), w->value->data, w->value->rows, w->value->cols, shard,
                   m->tp_rank, m->tp_size, false);
        free(shard);
    }
}

size_t gpt_activation_floats(const Gpt *m) {
    size_t total = tensor_numel(&m->embedded) + tensor_numel(&m->ln_f) + tensor_numel(&m->ln_f_mean) +
                   tensor_numel(&m->ln_f_rstd) + tensor_numel(&m->logits) + tensor_numel(&m->grad_logits);
    for (int l = 0; l < m->n_blocks; l++) {
        const GptBlockActivations *a = &m->acts[l];
        if (m->recompute_batch && l > 0) {  // block 0's inside, shared
            total += tensor_numel(&a->residual_2);
            continue;
        }
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
    for (int l = 0; l < m->n_blocks; l++) {
        GptBlockActivations *a = &m->acts[l];
        if (m->recompute_batch && l > 0) {  // block 0's inside, shared
            tensor_free(&a->residual_2);
            continue;
        }
        Tensor *all[] = {&a->ln_1, &a->ln_1_mean, &a->ln_1_rstd, &a->qkv, &a->att, &a->attn_y, &a->residual_1,
                         &a->ln_2, &a->ln_2_mean, &a->ln_2_rstd, &a->fc, &a->fc_gelu, &a->residual_2,
                         &a->att_mask, &a->att_dropped, &a->attn_proj_mask, &a->mlp_proj_mask};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    }
    Tensor *rest[] = {&m->embedded, &m->ln_f, &m->ln_f_mean, &m->ln_f_rstd, &m->logits, &m->grad_logits,
                      &m->grad_residual, &m->grad_output, &m->grad_ln, &m->grad_qkv, &m->grad_attn_y, &m->grad_fc,
                      &m->embed_mask, &m->proj_out, &m->grad_proj_out, &m->grad_att, &m->gathered,
                      &m->grad_layernorm_part};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) tensor_free(rest[i]);
    free(m->acts), free(m->blocks), free(m->grad_blocks), free(m->params), free(m->param_index);
    for (int i = 0; m->slot_tokens && i < m->max_batch; i++)
        if (m->slot_tokens[i].capacity) token_batch_free(&m->slot_tokens[i]);
    free(m->slot_tokens);
    free(m->slot_micro_batch);
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

// A micro-batch's part of a buffer: its rows of a [capacity, cols] one (tensor_row_range), or its
// values [first, first + n) as [1, n] (a LayerNorm's statistics), or as [rows, n / rows]
// (attention's probabilities of a micro-batch's sequences): values_at.
static Tensor values_at(const Tensor *t, size_t first, int rows, int cols) {
    return (Tensor){.data = t->data + first, .rows = rows, .cols = cols, .device = t->device};
}

static Tensor *block_tensor(Gpt *m, int layer, int kind) { return &m->blocks[layer * GPT_BLOCK_TENSORS + kind]; }
static Tensor *block_grad(Gpt *m, int layer, int kind) { return &m->grad_blocks[layer * GPT_BLOCK_TENSORS + kind]; }
static const Tensor *bias_of(Gpt *m, int layer, int kind) { return m->config.bias ? block_tensor(m, layer, kind) : NULL; }

// The rows of a micro-batch of N tokens that this rank holds in the token-wise regions (the
// LayerNorms, the residual stream): N / T of them with sequence parallelism, else all N.
static int token_rows(const Gpt *m, int N) { return m->sequence_parallel ? N / m->tp_size : N; }
// Where this rank's rows start among a micro-batch's N tokens.
static int first_token_row(const Gpt *m, int N) { return m->sequence_parallel ? m->tp_rank * (N / m->tp_size) : 0; }

// Megatron's g in forward and f in backward, on a row- or column-parallel Linear's partial results
// [N, width] (each rank's heads' or MLP columns' share of every value): their sum over the
// tensor-parallel group. Allreduced in place; with sequence parallelism reduce-scattered instead,
// this rank's rows summed in place of its block of `partial` and returned (half an allreduce's
// bytes: the other half is the all-gather before the next column-parallel Linear). Nothing with
// whole blocks.
static Tensor tensor_parallel_sum(Gpt *m, Tensor *partial) {
    if (!m->sequence_parallel) {
        if (m->tensor_group) group_all_reduce(m->tensor_group, partial);
        return *partial;
    }
    const int n = token_rows(m, partial->rows);
    Tensor mine = tensor_row_range(partial, first_token_row(m, partial->rows), n);
    group_reduce_scatter(m->tensor_group, partial, &mine);
    return mine;
}

// Sequence parallelism's all-gather: this rank's rows [N / T, width] of a token-wise tensor,
// gathered from the group into the rows of all N tokens (in `gathered`), as the Linear after it
// needs them. Without sequence parallelism x is already whole, and returned.
static Tensor gather_tokens(Gpt *m, const Tensor *x) {
    if (!m->sequence_parallel) return *x;
    Tensor whole = tensor_rows(&m->gathered, x->rows * m->tp_size);
    group_all_gather(m->tensor_group, x, &whole);
    return whole;
}

// layernorm_backward, its weight and bias gradients added to grad_weight and grad_bias. With
// sequence parallelism each rank's are its own tokens' part: they are computed apart, summed over
// the group (one allreduce of both), then added, so that every rank of the group holds the sum.
static void layernorm_back(Gpt *m, const Tensor *x, const Tensor *weight, const Tensor *mean, const Tensor *rstd,
                           const Tensor *grad_y, Tensor *grad_x, Tensor *grad_weight, Tensor *grad_bias) {
    if (!m->sequence_parallel) {
        layernorm_backward(x, weight, mean, rstd, grad_y, grad_x, grad_weight, grad_bias);
        return;
    }
    Tensor part_weight = tensor_row_range(&m->grad_layernorm_part, 0, 1);
    Tensor part_bias = tensor_row_range(&m->grad_layernorm_part, 1, 1);
    tensor_fill(&m->grad_layernorm_part, 0.0f);
    layernorm_backward(x, weight, mean, rstd, grad_y, grad_x, &part_weight, grad_bias ? &part_bias : NULL);
    group_all_reduce(m->tensor_group, &m->grad_layernorm_part);
    add_elementwise(grad_weight, &part_weight, grad_weight);
    if (grad_bias) add_elementwise(grad_bias, &part_bias, grad_bias);
}

// y [N, out] = x @ weight^T (+ bias): nn.Linear.
static void linear(Gpt *m, int layer, int weight_kind, const Tensor *x, Tensor *y) {
    gemm(false, true, 1.0f, x, block_tensor(m, layer, weight_kind), 0.0f, y);
    if (m->config.bias) add_column_bias(y, block_tensor(m, layer, weight_kind + 1), false);
}

// Linear's backward: grad_weight += grad_y^T @ x, grad_bias += the column sums of grad_y, and
// grad_x = grad_y @ weight (+= with accumulate_x: a residual stream's gradient).
static void linear_back(Gpt *m, int layer, int weight_kind, const Tensor *x, const Tensor *grad_y, Tensor *grad_x,
                        bool accumulate_x) {
    gemm_hold_rounded(grad_y);  // (--dtype bfloat16: rounded once for both products)
    gemm(true, false, 1.0f, grad_y, x, 1.0f, block_grad(m, layer, weight_kind));
    if (m->config.bias) add_sum_over_rows(grad_y, block_grad(m, layer, weight_kind + 1));
    gemm(false, false, 1.0f, grad_y, block_tensor(m, layer, weight_kind), accumulate_x ? 1.0f : 0.0f, grad_x);
    gemm_release_rounded();
}

void gpt_set_training(Gpt *m, bool training) { m->training = training; }
void gpt_seed_dropout(Gpt *m, uint64_t seed) {
    rng_seed(&m->dropout_rng, seed);
    m->dropout_seed = seed;
    m->dropout_forwards = 0;
}

void gpt_set_dropout_philox(Gpt *m, bool philox) { m->dropout_philox = philox; }

// residual_out = residual_in + dropout(y @ weight^T + bias): a block's c_proj and its residual.
// Without dropout and split, in one GEMM that adds onto a copy of residual_in. Row-parallel (T > 1):
// each rank's y holds its heads (or its MLP columns), so y @ weight^T is a partial sum, summed over
// the ranks (g) before the bias, which is added once; with sequence parallelism only this rank's
// rows are summed (the residuals hold those).
static void projection_residual(Gpt *m, int layer, int weight_kind, const Tensor *y, const Tensor *residual_in,
                                Tensor *residual_out, Tensor *mask, bool dropout) {
    if (!dropout && !m->tensor_group) {
        tensor_copy(residual_out, residual_in);
        gemm(false, true, 1.0f, y, block_tensor(m, layer, weight_kind), 1.0f, residual_out);
        if (m->config.bias) add_column_bias(residual_out, block_tensor(m, layer, weight_kind + 1), false);
        return;
    }
    Tensor partial = tensor_rows(&m->proj_out, y->rows);  // c_proj(y), then its dropout, then the residual
    gemm(false, true, 1.0f, y, block_tensor(m, layer, weight_kind), 0.0f, &partial);
    Tensor projected = tensor_parallel_sum(m, &partial);  // g
    if (m->config.bias) add_column_bias(&projected, block_tensor(m, layer, weight_kind + 1), false);
    if (dropout) multiply_by_mask(&projected, mask);
    add_elementwise(residual_in, &projected, residual_out);
}

// Micro-batch micro's views of a block's activations (B sequences of T at rows micro * B * T).
typedef struct {
    Tensor ln_1, ln_1_mean, ln_1_rstd, qkv, att, attn_y, residual_1, ln_2, ln_2_mean, ln_2_rstd, fc, fc_gelu, residual_2;
    Tensor att_mask, att_dropped, attn_proj_mask, mlp_proj_mask;  // with dropout (draw_block_masks')
} BlockViews;

// The token-wise ones (LayerNorms, residuals) hold this rank's n = token_rows(N) rows.
static BlockViews block_views(Gpt *m, int l, int micro, int B, int T) {
    const GptBlockActivations *a = &m->acts[l];
    const int N = B * T, n = token_rows(m, N), H = m->config.n_head / m->tp_size;
    const int inside_micro = m->recompute_batch ? 0 : micro;  // recompute: one micro-batch's inside, at row 0
    const int first = inside_micro * N, first_n = inside_micro * n;
    const size_t scores = (size_t)B * H * T * T;
    BlockViews views = {
        .ln_1 = tensor_row_range(&a->ln_1, first_n, n), .ln_1_mean = values_at(&a->ln_1_mean, first_n, 1, n),
        .ln_1_rstd = values_at(&a->ln_1_rstd, first_n, 1, n), .qkv = tensor_row_range(&a->qkv, first, N),
        .att = values_at(&a->att, inside_micro * scores, B * H, T * T),
        .attn_y = tensor_row_range(&a->attn_y, first, N), .residual_1 = tensor_row_range(&a->residual_1, first_n, n),
        .ln_2 = tensor_row_range(&a->ln_2, first_n, n), .ln_2_mean = values_at(&a->ln_2_mean, first_n, 1, n),
        .ln_2_rstd = values_at(&a->ln_2_rstd, first_n, 1, n), .fc = tensor_row_range(&a->fc, first, N),
        .fc_gelu = tensor_row_range(&a->fc_gelu, first, N)};
    views.residual_2 = tensor_row_range(&a->residual_2, micro * n, n);  // kept per micro-batch
    if (m->config.dropout > 0) {  // the inside's too
        views.att_mask = values_at(&a->att_mask, inside_micro * scores, B * H, T * T);
        views.att_dropped = values_at(&a->att_dropped, inside_micro * scores, B * H, T * T);
        views.attn_proj_mask = tensor_row_range(&a->attn_proj_mask, first_n, n);
        views.mlp_proj_mask = tensor_row_range(&a->mlp_proj_mask, first_n, n);
    }
    return views;
}

// transformer.drop's mask of micro-batch slot micro (n token rows).
static Tensor embed_mask(Gpt *m, int micro, int n) { return tensor_row_range(&m->embed_mask, micro * n, n); }

static void check_micro_batch(const Gpt *m, int micro, int B, int T) {
    CHECK(B >= 1 && T >= 1 && T <= m->config.block_size && micro >= 0 &&
          (long)(micro + 1) * B * T <= (long)m->max_batch * m->config.block_size && (B * T) % (m->sequence_parallel ? m->tp_size : 1) == 0,
          "gpt: micro-batch %d of [%d, %d] beyond the buffers of [%d, %d]", micro, B, T, m->max_batch, m->config.block_size);
}

// This rank's part of mask `index` of a forward (0 the embeddings', 1 + 3 l + k block l's k-th, l
// counted in the whole model): `runs` runs of `length` values, the first at value `first` of the
// whole mask, the others `stride` apart. torch's generator is a sequence, drawn whole: a whole model's
// first micro-batch only.
static void draw_dropout_mask(Gpt *m, int index, long first, long length, long stride, long runs, Tensor *mask) {
    if (m->dropout_philox) {
        CHECK(m->dropout_forwards > 0, "gpt: dropout's masks of a micro-batch before its micro-step's first");
        dropout_philox_part(m->dropout_seed, (m->dropout_forwards - 1) << 32 | (uint64_t)index, m->config.dropout,
                            first, length, stride, runs, mask);
        return;
    }
    CHECK(first == 0 && (runs == 1 || stride == length) && m->has_embeddings && m->has_head && m->tp_size == 1 &&
              !m->recompute_batch,
          "gpt: dropout's masks from torch's generator for a part of the model, a micro-batch after the first or a "
          "recomputed forward: only Philox draws a part (--dropout_rng philox)");
    dropout_draw(&m->dropout_rng, m->config.dropout, length * runs, mask);
}

// Micro-batch micro_batch's masks (of B sequences; a whole forward's: micro-batch 0, the micro-
// step's batch) are this rank's part of the whole micro-step's, the values step 19 draws for the same
// tokens: the micro-batch's rows, with sequence parallelism this rank's share of them, from value
// *tokens_first of a token-wise mask; attention's, this rank's heads of each sequence, the first
// from value *scores_first.
static void dropout_parts(const Gpt *m, int micro_batch, int B, int T, long *tokens_first, long *scores_first) {
    const int N = B * T, all_heads = m->config.n_head, H = all_heads / m->tp_size;
    *tokens_first = ((long)micro_batch * N + first_token_row(m, N)) * m->config.n_embd;
    *scores_first = ((long)micro_batch * B * all_heads + (long)m->tp_rank * H) * T * T;
}

// Block l's three masks for micro-batch slot micro, into its views, in nanoGPT's order (attention's,
// after attn.c_proj, after mlp.c_proj), before the block computes. With recompute they are part of
// the inside, and the second forward draws them again: Philox gives the same values; torch's
// generator, a sequence, would not. With torch's generator on a GPU each is drawn on the host and
// copied (transformer_ops.h's dropout_draw: a host wait); Philox draws them on the GPU.
static void draw_block_masks(Gpt *m, int l, int micro, BlockViews *v, int B, int T, bool again) {
    CHECK(!again || m->dropout_philox, "gpt: recompute with dropout draws a block's masks again: Philox's only");
    const int C = m->config.n_embd, all_heads = m->config.n_head, H = all_heads / m->tp_size;
    const long n = token_rows(m, B * T), square = (long)T * T;
    long tokens_first, scores_first;
    dropout_parts(m, m->slot_micro_batch[micro], B, T, &tokens_first, &scores_first);
    const int index = 1 + 3 * (m->first_layer + l);  // (the whole model's block number)
    draw_dropout_mask(m, index, scores_first, H * square, all_heads * square, B, &v->att_mask);
    draw_dropout_mask(m, index + 1, tokens_first, n * C, n * C, 1, &v->attn_proj_mask);
    draw_dropout_mask(m, index + 2, tokens_first, n * C, n * C, 1, &v->mlp_proj_mask);
}

// Block l's forward of micro-batch micro from its input x: its inside into its views (with
// recompute, the shared set), its output into residual_2's rows; `again`: recompute's second
// forward, in backward. Returns the output.
static Tensor block_forward(Gpt *m, int l, int micro, int B, int T, const Tensor *x, bool dropout, bool again) {
    const int H = m->config.n_head / m->tp_size;
    BlockViews v = block_views(m, l, micro, B, T);
    if (dropout) draw_block_masks(m, l, micro, &v, B, T, again);
    // x = x + attn(ln_1(x)); column-parallel c_attn: this rank's heads' q, k, v [N, 3C / T]
    layernorm_forward(x, block_tensor(m, l, GPT_LN_1_WEIGHT), bias_of(m, l, GPT_LN_1_BIAS), &v.ln_1, &v.ln_1_mean,
                      &v.ln_1_rstd);
    Tensor ln_1 = gather_tokens(m, &v.ln_1);                      // every token's (sequence parallelism: all-gathered)
    linear(m, l, GPT_ATTN_WEIGHT, &ln_1, &v.qkv);                 // [N, 3C]
    attention_forward(&v.qkv, B, T, H, &v.att, dropout ? &v.att_mask : NULL, dropout ? &v.att_dropped : NULL,
                      &v.attn_y);                                 // attn_dropout
    projection_residual(m, l, GPT_ATTN_PROJ_WEIGHT, &v.attn_y, x, &v.residual_1, &v.attn_proj_mask, dropout);  // x + c_proj(y)
    // x = x + mlp(ln_2(x)); c_fc column-, mlp.c_proj row-parallel
    layernorm_forward(&v.residual_1, block_tensor(m, l, GPT_LN_2_WEIGHT), bias_of(m, l, GPT_LN_2_BIAS), &v.ln_2,
                      &v.ln_2_mean, &v.ln_2_rstd);
    Tensor ln_2 = gather_tokens(m, &v.ln_2);
    linear(m, l, GPT_FC_WEIGHT, &ln_2, &v.fc);                    // [N, 4C]
    gelu_forward(&v.fc, &v.fc_gelu);
    projection_residual(m, l, GPT_FC_PROJ_WEIGHT, &v.fc_gelu, &v.residual_1, &v.residual_2, &v.mlp_proj_mask, dropout);
    return v.residual_2;
}

Tensor gpt_stage_input(Gpt *m, int micro, int B, int T) {
    check_micro_batch(m, micro, B, T);
    const int n = token_rows(m, B * T);
    return tensor_row_range(&m->embedded, micro * n, n);
}

const Tensor *gpt_stage_forward(Gpt *m, int micro, int micro_batch, const int *inputs, int B, int T) {
    const GptConfig *c = &m->config;
    check_micro_batch(m, micro, B, T);
    const int N = B * T, first = micro * N, n = token_rows(m, N);
    CHECK(!m->recompute_batch || B <= m->recompute_batch, "gpt: a micro-batch of %d sequences, recompute's buffers hold %d",
          B, m->recompute_batch);
    m->B = B, m->T = T;
    const bool dropout = m->training && c->dropout > 0;
    if (dropout) {  // the micro-step's forward starts at its first micro-batch's, whatever the slot
        if (micro_batch == 0) m->dropout_forwards++;
        m->slot_micro_batch[micro] = micro_batch;  // (for its blocks' masks, drawn as they go)
    }
    Tensor x = tensor_row_range(&m->embedded, micro * n, n);  // [N, C], or this rank's [N / T, C]
    if (m->has_embeddings) {
        TokenBatch *tokens = &m->slot_tokens[micro];
        if (!tokens->capacity) *tokens = token_batch_new(m->max_batch * c->block_size, c->vocab_size, m->device);
        token_batch_set(tokens, inputs, N);  // (each token checked against the vocabulary)
        if (m->sequence_parallel) {  // every token's, then this rank's rows of them
            Tensor all = tensor_rows(&m->gathered, N);
            embedding_forward(tokens, &m->wte, &m->wpe, B, T, &all);
            Tensor mine = tensor_row_range(&all, first_token_row(m, N), n);
            tensor_copy(&x, &mine);
        } else {
            embedding_forward(tokens, &m->wte, &m->wpe, B, T, &x);
        }
        if (dropout) {  // transformer.drop
            Tensor mask = embed_mask(m, micro, n);
            long tokens_first, scores_first;
            dropout_parts(m, micro_batch, B, T, &tokens_first, &scores_first);
            const long values = (long)n * c->n_embd;
            draw_dropout_mask(m, 0, tokens_first, values, values, 1, &mask);
            multiply_by_mask(&x, &mask);
        }
    }
    for (int l = 0; l < m->n_blocks; l++) x = block_forward(m, l, micro, B, T, &x, dropout, false);
    if (!m->has_head) {
        m->last_logits = (Tensor){0};
        m->stage_output = x;
        return &m->stage_output;
    }
    // ln_f on this rank's rows (its block of ln_f's), all-gathered in place: the head takes every token.
    Tensor ln_f = tensor_row_range(&m->ln_f, first, N), ln_f_mine = tensor_row_range(&ln_f, first_token_row(m, N), n);
    Tensor ln_f_mean = values_at(&m->ln_f_mean, micro * n, 1, n), ln_f_rstd = values_at(&m->ln_f_rstd, micro * n, 1, n);
    m->last_logits = tensor_row_range(&m->logits, first, N);
    layernorm_forward(&x, &m->ln_f_weight, c->bias ? &m->ln_f_bias : NULL, &ln_f_mine, &ln_f_mean, &ln_f_rstd);
    if (m->sequence_parallel) group_all_gather(m->tensor_group, &ln_f_mine, &ln_f);
    gemm(false, true, 1.0f, &ln_f, &m->wte, 0.0f, &m->last_logits);  // lm_head: ln_f(x) @ wte^T, [N, V]
    return &m->last_logits;
}

const Tensor *gpt_forward(Gpt *m, const int *inputs, int B, int T) {
    CHECK(m->has_embeddings && m->has_head, "gpt_forward: a whole model (a stage: gpt_stage_forward)");
    return gpt_stage_forward(m, 0, 0, inputs, B, T);
}

void gpt_logits_row(const Gpt *m, int row, float *host) {
    CHECK(row >= 0 && row < m->last_logits.rows, "gpt_logits_row: row %d of %d", row, m->last_logits.rows);
    const int V = m->config.vocab_size;
    Tensor one = {.data = m->last_logits.data + (size_t)row * V, .rows = 1, .cols = V, .device = m->device};
    tensor_to_host(&one, host);
}

void gpt_generate(Gpt *m, int *tokens, int prompt_length, int new_tokens, double temperature, int top_k, Rng *rng) {
    CHECK(top_k >= 1 && temperature > 0, "gpt_generate: top_k %d, temperature %g (expected >= 1 and > 0)", top_k,
          temperature);
    const int V = m->config.vocab_size, block_size = m->config.block_size;
    double *probs = xmalloc((size_t)V * sizeof(double));
    float *logits = xmalloc((size_t)V * sizeof(float)), *sorted = xmalloc((size_t)V * sizeof(float));
    for (int n = prompt_length; n < prompt_length + new_tokens; n++) {
        int T = n < block_size ? n : block_size;  // idx_cond: the context cropped to block_size
        gpt_forward(m, tokens + n - T, 1, T);
        gpt_logits_row(m, T - 1, logits);  // the last position's

        // The k-th largest logit: everything below it is out (torch.topk, then logits < v[-1]).
        int k = top_k < V ? top_k : V;
        memcpy(sorted, logits, (size_t)V * sizeof(float));
        for (int i = 0; i < k; i++)  // a partial selection sort: k is small
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[i]) { float swap = sorted[i]; sorted[i] = sorted[j]; sorted[j] = swap; }
        float threshold = sorted[k - 1], max = sorted[0];
        double total = 0.0;
        for (int c = 0; c < V; c++) total += probs[c] = logits[c] < threshold ? 0.0 : exp((logits[c] - max) / temperature);
        double u = rng_uniform(rng, 0.0f, 1.0f) * total, cumulative = 0.0;  // torch.multinomial's one draw
        int next = 0;
        for (int c = 0; c < V; c++) {
            cumulative += probs[c];
            if (probs[c] > 0.0) next = c;  // the last possible one, should rounding leave u beyond the sum
            if (u < cumulative && probs[c] > 0.0) break;
        }
        tokens[n] = next;
    }
    free(probs), free(logits), free(sorted);
}

float gpt_stage_loss(Gpt *m, int micro, const int *targets, int B, int T, float factor) {
    CHECK(m->has_head, "gpt_stage_loss: the last stage's");
    check_micro_batch(m, micro, B, T);
    const int N = B * T;
    Tensor logits = tensor_row_range(&m->logits, micro * N, N);
    Tensor grad_logits = tensor_row_range(&m->grad_logits, micro * N, N);
    float loss = softmax_cross_entropy(&logits, targets, &grad_logits);  // the mean over B * T tokens
    if (factor != 1.0f) tensor_scale(&grad_logits, factor);  // x * 1 is x: a pass over [N, V] saved
    return loss;
}

void gpt_stage_loss_to(Gpt *m, int micro, const int *targets, int B, int T, float factor, LossSlot slot) {
    CHECK(m->has_head, "gpt_stage_loss_to: the last stage's");
    check_micro_batch(m, micro, B, T);
    const int N = B * T;
    Tensor logits = tensor_row_range(&m->logits, micro * N, N);
    Tensor grad_logits = tensor_row_range(&m->grad_logits, micro * N, N);
    softmax_cross_entropy_to(&logits, targets, NULL, &grad_logits, slot);  // the mean over B * T tokens
    if (factor != 1.0f) tensor_scale(&grad_logits, factor);
}

void gpt_loss_to(Gpt *m, const int *targets, LossSlot slot) {
    const int N = m->B * m->T;
    memcpy(m->targets, targets, (size_t)N * sizeof(int));
    gpt_stage_loss_to(m, 0, targets, m->B, m->T, 1.0f, slot);
}

float gpt_loss(Gpt *m, const int *targets) {
    const int N = m->B * m->T;
    memcpy(m->targets, targets, (size_t)N * sizeof(int));
    return gpt_stage_loss(m, 0, targets, m->B, m->T, 1.0f);
}

void gpt_scale_loss(Gpt *m, float factor) {
    if (factor == 1.0f) return;  // x * 1 is x: a pass over [N, V] saved (no accumulation, one rank)
    Tensor grad_logits = tensor_rows(&m->grad_logits, m->B * m->T);
    tensor_scale(&grad_logits, factor);
}

Tensor gpt_stage_grad_output(Gpt *m, int B, int T) {
    CHECK(!m->has_head, "gpt_stage_grad_output: the last stage starts backward from its loss");
    return tensor_rows(&m->grad_output, token_rows(m, B * T));
}

// The gradient of a c_proj's output, through its dropout: grad_residual itself without dropout,
// else grad_residual * mask in a scratch (the residual stream's gradient goes on unmasked).
static Tensor dropout_back(Gpt *m, const Tensor *mask, const Tensor *grad_residual) {
    if (!(m->training && m->config.dropout > 0)) return *grad_residual;
    Tensor masked = tensor_rows(&m->grad_proj_out, grad_residual->rows);
    tensor_copy(&masked, grad_residual);
    multiply_by_mask(&masked, mask);
    return masked;
}

static void ready(Gpt *m, int slot, GradReadyHook hook, void *context) {
    if (hook && m->param_index[slot] >= 0) hook(context, m->param_index[slot]);
}

const Tensor *gpt_stage_backward(Gpt *m, int micro, int B, int T, GradReadyHook hook,
                                 void *context) {
    const GptConfig *c = &m->config;
    check_micro_batch(m, micro, B, T);
    const int N = B * T, L = m->n_blocks, top = L * GPT_BLOCK_TENSORS, first = micro * N, H = c->n_head / m->tp_size;
    const int n = token_rows(m, N);  // the residual stream's rows here: N, or N / T with sequence parallelism
    const bool dropout = m->training && c->dropout > 0;  // as the forward had it
    Tensor grad_residual = tensor_rows(&m->grad_residual, n), grad_ln = tensor_rows(&m->grad_ln, N);
    Tensor grad_qkv = tensor_rows(&m->grad_qkv, N), grad_attn_y = tensor_rows(&m->grad_attn_y, N);
    Tensor grad_fc = tensor_rows(&m->grad_fc, N);
    if (m->has_head) {
        Tensor grad_logits = tensor_row_range(&m->grad_logits, first, N), ln_f = tensor_row_range(&m->ln_f, first, N);
        Tensor ln_f_mean = values_at(&m->ln_f_mean, micro * n, 1, n), ln_f_rstd = values_at(&m->ln_f_rstd, micro * n, 1, n);
        // The head: wte's gradient gets its first part here (its last comes from the embedding).
        gemm_hold_rounded(&grad_logits);
        gemm(true, false, 1.0f, &grad_logits, &ln_f, 1.0f, &m->grad_wte);  // [V, N] @ [N, C]
        gemm(false, false, 1.0f, &grad_logits, &m->wte, 0.0f, &grad_ln);    // d ln_f(x), [N, C]
        gemm_release_rounded();
        // ln_f, on this rank's rows: the residual stream's gradient starts here.
        Tensor x_last =
            L ? block_views(m, L - 1, micro, B, T).residual_2 : tensor_row_range(&m->embedded, micro * n, n);
        Tensor grad_ln_mine = tensor_row_range(&grad_ln, first_token_row(m, N), n);
        tensor_fill(&grad_residual, 0.0f);
        layernorm_back(m, &x_last, &m->ln_f_weight, &ln_f_mean, &ln_f_rstd, &grad_ln_mine, &grad_residual,
                       &m->grad_ln_f_weight, c->bias ? &m->grad_ln_f_bias : NULL);
        ready(m, top + TOP_LN_F_WEIGHT, hook, context);
        ready(m, top + TOP_LN_F_BIAS, hook, context);
    } else {
        // d output, from the next stage: a buffer of its own, as the exchange that brings it in may
        // still be sending the last backward's d input (grad_residual) out.
        Tensor grad_output = tensor_rows(&m->grad_output, n);
        tensor_copy(&grad_residual, &grad_output);
    }
    for (int l = L - 1; l >= 0; l--) {
        BlockViews v = block_views(m, l, micro, B, T);
        Tensor x_in =  // the block's input
            l ? block_views(m, l - 1, micro, B, T).residual_2 : tensor_row_range(&m->embedded, micro * n, n);
        int slot = l * GPT_BLOCK_TENSORS;
        if (m->recompute_batch) block_forward(m, l, micro, B, T, &x_in, dropout, true);  // the inside again, from the kept input
        // x = x + mlp(ln_2(x)): the residual passes grad_residual through; the MLP adds its part.
        // (Sequence parallelism: d mlp.c_proj's output and ln_2(x) all-gathered, as the Linears'
        // gradients need every token; d ln_2(x) reduce-scattered onto this rank's rows.)
        Tensor grad_mlp_out = dropout_back(m, &v.mlp_proj_mask, &grad_residual);  // d mlp.c_proj's output
        Tensor grad_mlp_all = gather_tokens(m, &grad_mlp_out);
        linear_back(m, l, GPT_FC_PROJ_WEIGHT, &v.fc_gelu, &grad_mlp_all, &grad_fc, false);  // d gelu(fc), [N, 4C]
        ready(m, slot + GPT_FC_PROJ_WEIGHT, hook, context), ready(m, slot + GPT_FC_PROJ_BIAS, hook, context);
        gelu_backward(&v.fc, &grad_fc, &grad_fc);
        Tensor ln_2 = gather_tokens(m, &v.ln_2);
        linear_back(m, l, GPT_FC_WEIGHT, &ln_2, &grad_fc, &grad_ln, false);                  // d ln_2(x)
        Tensor grad_ln_2 = tensor_parallel_sum(m, &grad_ln);  // f: every rank's columns contribute to d ln_2(x)
        ready(m, slot + GPT_FC_WEIGHT, hook, context), ready(m, slot + GPT_FC_BIAS, hook, context);
        layernorm_back(m, &v.residual_1, block_tensor(m, l, GPT_LN_2_WEIGHT), &v.ln_2_mean, &v.ln_2_rstd, &grad_ln_2,
                       &grad_residual, block_grad(m, l, GPT_LN_2_WEIGHT), c->bias ? block_grad(m, l, GPT_LN_2_BIAS) : NULL);
        ready(m, slot + GPT_LN_2_WEIGHT, hook, context), ready(m, slot + GPT_LN_2_BIAS, hook, context);
        // x = x + attn(ln_1(x))
        Tensor grad_attn_out = dropout_back(m, &v.attn_proj_mask, &grad_residual);  // d attn.c_proj's output
        Tensor grad_attn_all = gather_tokens(m, &grad_attn_out);
        linear_back(m, l, GPT_ATTN_PROJ_WEIGHT, &v.attn_y, &grad_attn_all, &grad_attn_y, false);
        ready(m, slot + GPT_ATTN_PROJ_WEIGHT, hook, context), ready(m, slot + GPT_ATTN_PROJ_BIAS, hook, context);
        attention_backward(&v.qkv, &v.att, dropout ? &v.att_mask : NULL, dropout ? &v.att_dropped : NULL, &grad_attn_y,
                           B, T, H, &m->grad_att, &grad_qkv);
        Tensor ln_1 = gather_tokens(m, &v.ln_1);
        linear_back(m, l, GPT_ATTN_WEIGHT, &ln_1, &grad_qkv, &grad_ln, false);
        Tensor grad_ln_1 = tensor_parallel_sum(m, &grad_ln);  // f: every rank's heads contribute to d ln_1(x)
        ready(m, slot + GPT_ATTN_WEIGHT, hook, context), ready(m, slot + GPT_ATTN_BIAS, hook, context);
        layernorm_back(m, &x_in, block_tensor(m, l, GPT_LN_1_WEIGHT), &v.ln_1_mean, &v.ln_1_rstd, &grad_ln_1,
                       &grad_residual, block_grad(m, l, GPT_LN_1_WEIGHT), c->bias ? block_grad(m, l, GPT_LN_1_BIAS) : NULL);
        ready(m, slot + GPT_LN_1_WEIGHT, hook, context), ready(m, slot + GPT_LN_1_BIAS, hook, context);
    }
    if (!m->has_embeddings) {
        ready(m, top + TOP_WTE, hook, context);  // the tied head's wte, on a last stage that is not the first
        m->grad_input = grad_residual;
        return &m->grad_input;
    }
    if (dropout) {
        Tensor mask = embed_mask(m, micro, n);
        multiply_by_mask(&grad_residual, &mask);  // through transformer.drop
    }
    const TokenBatch *tokens = &m->slot_tokens[micro];  // (its forward's: a pipeline runs others' in between)
    CHECK(tokens->n == N, "gpt: micro-batch slot %d's backward for %d tokens, its forward had %d", micro, N, tokens->n);
    Tensor grad_embedded = gather_tokens(m, &grad_residual);  // every token's (alike on the group's ranks)
    embedding_backward(tokens, &grad_embedded, B, T, &m->grad_wte, &m->grad_wpe);
    ready(m, top + TOP_WPE, hook, context);
    ready(m, top + TOP_WTE, hook, context);
    return NULL;
}

void gpt_backward(Gpt *m, GradReadyHook hook, void *context) {
    CHECK(m->has_embeddings && m->has_head, "gpt_backward: a whole model (a stage: gpt_stage_backward)");
    gpt_stage_backward(m, 0, m->B, m->T, hook, context);
}

void gpt_zero_grad(Gpt *m) { params_zero_grad(m->params, m->n_params); }
