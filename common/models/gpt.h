// gpt.h: nanoGPT's GPT (model.py), forward and backward, in the layers of nn.h.
//
//   x = wte[idx] + wpe[pos]                                  [B, T, C]
//   for each of n_layer blocks:
//       x = x + attn.c_proj(attention(attn.c_attn(ln_1(x))))  causal, n_head heads
//       x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))           4C wide
//   logits = ln_f(x) @ wte^T                                  [B, T, vocab]: the head is tied to wte
//
// Parameters are Params (nn.h) named as nanoGPT's state_dict ("transformer.h.0.attn.c_attn.weight"),
// in model.parameters()' order: wte, wpe, each block's ln_1, c_attn, attn.c_proj, ln_2, c_fc,
// mlp.c_proj (weight, then bias when config.bias), ln_f. lm_head.weight is wte's tensor, so it
// appears once in the list, as in model.parameters(); gpt_state_dict adds its name for --save.
// Gradients accumulate as in PyTorch: gpt_zero_grad before a step's first micro-batch.
//
// gemm (tensor.h) computes the Linears and the head, transformer_ops.h the rest, tensor_ops.h the
// cross-entropy, each on the device where the model lives (gpt_new's): the CPU's threads, or a GPU
// (cuBLAS and kernels.cu; the host then only launches, copies each batch's tokens in and reads the
// loss back). Activations for batch max_batch at block_size are allocated once, as llm.c does, and
// kept from forward to backward (the memory is gpt_add_memory_need's).
//
// Split (step 20, gpt_new_part): a rank may hold a part of the model, as Megatron-LM cuts it:
// a pipeline stage's run of blocks (the embeddings with the first block, ln_f and the head with the
// last, wte on both when they differ: the tied head), each block split over a tensor-parallel group
// (c_attn and mlp.c_fc column-parallel: n_head / T heads' q, k, v and 4C / T of the MLP's columns
// per rank; attn.c_proj and mlp.c_proj row-parallel, their partial sums allreduced: g; the
// gradient of each column-parallel Linear's input allreduced in backward: f; LayerNorms, biases of
// the row-parallel Linears, embeddings and head replicated, their gradients computed alike on every
// rank of the group from the same values). With sequence parallelism (Megatron-LM's, T > 1) the
// regions between the Linears (LayerNorms, residuals, the stage's input and output) are not
// replicated but cut along the tokens: tensor-parallel rank r holds rows [r N / T, (r + 1) N / T)
// of each micro-batch's N = B * T tokens there; an all-gather of the LayerNorm's output before
// each column-parallel Linear, a reduce-scatter of the row-parallel Linear's partial sums after it
// (in place of g's allreduce), and in backward the reverse (the all-gather again, of the kept
// shard, where the Linear's weight gradient needs the whole input; f's allreduce a
// reduce-scatter). The LayerNorms' weight gradients, each from the rank's own tokens, are summed
// over the group. A stage runs micro-batches (gpt_stage_forward /
// gpt_stage_backward), each at its own rows of the activation buffers, so that a pipeline schedule
// may hold several at once. The names stay the whole model's (transformer.h.<global layer>...).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/group.h"  // Group: the tensor-parallel ranks of a split model
#include "runtime/memory_budget.h"  // MemoryNeed
#include "models/nn.h"  // Param, Tensor, GradReadyHook, Rng
#include "tensor/transformer_ops.h"  // TokenBatch

typedef struct {
    int vocab_size, block_size, n_layer, n_head, n_embd;
    bool bias;       // biases in the Linears and LayerNorms (nanoGPT's bias; its train.py's default is False)
    double dropout;  // nanoGPT's dropout: after the embeddings, on attention's probabilities, after each c_proj
} GptConfig;

// The tensors of one block, in model.parameters()' order (the biases absent without config.bias).
enum {
    GPT_LN_1_WEIGHT, GPT_LN_1_BIAS, GPT_ATTN_WEIGHT, GPT_ATTN_BIAS, GPT_ATTN_PROJ_WEIGHT, GPT_ATTN_PROJ_BIAS,
    GPT_LN_2_WEIGHT, GPT_LN_2_BIAS, GPT_FC_WEIGHT, GPT_FC_BIAS, GPT_FC_PROJ_WEIGHT, GPT_FC_PROJ_BIAS,
    GPT_BLOCK_TENSORS
};

// What one block keeps from forward for backward, [N, ...] for N = B * T tokens.
typedef struct {
    Tensor ln_1, ln_1_mean, ln_1_rstd;  // [N, C], [1, N], [1, N]
    Tensor qkv;                          // [N, 3C]: c_attn's output
    Tensor att;                          // [B * n_head, T * T]: the attention probabilities
    Tensor attn_y;                       // [N, C]: the heads' outputs, before c_proj
    Tensor residual_1;                   // [N, C]: x after the attention's residual
    Tensor ln_2, ln_2_mean, ln_2_rstd;
    Tensor fc;                           // [N, 4C]: c_fc's output, before GELU
    Tensor fc_gelu;                      // [N, 4C]
    Tensor residual_2;                   // [N, C]: the block's output
    // Dropout's masks (each value 0 or 1 / (1 - p)), allocated only when config.dropout > 0, part of
    // the inside (with recompute, one micro-batch's, drawn again), on this rank's heads and rows:
    Tensor att_mask, att_dropped;        // [B * n_head / T, T * T]: attn_dropout's, and att * mask
    Tensor attn_proj_mask, mlp_proj_mask;  // [N / S, C]: resid_dropout's after attn.c_proj, the MLP's after mlp.c_proj
} GptBlockActivations;

// A rank's part of the model (gpt_new_part): blocks [first_layer, end_layer) of a pipeline stage,
// each split over tensor_group's ranks (NULL: whole blocks).
// recompute_batch > 0: activation checkpointing (Megatron's full recompute, torch.utils.checkpoint
// per block): each block keeps only its output (the next block's input) per micro-batch; its
// inside (LayerNorms, qkv, attention's probabilities, the MLP's) lives in one set of buffers for
// a micro-batch of recompute_batch sequences, shared by the blocks, and gpt_stage_backward redoes
// a block's forward there just before that block's backward.
// sequence_parallel (with a tensor_group of 2 ranks or more): the regions between the Linears cut
// along the tokens, as above; each micro-batch's B * T tokens must divide by the group's size.
typedef struct {
    int first_layer, end_layer;
    const Group *tensor_group;
    int recompute_batch;
    bool sequence_parallel;
} GptSplit;

typedef struct {
    GptConfig config;
    int max_batch;
    // The part held (gpt_new: all of it): blocks [first_layer, first_layer + n_blocks); the
    // embeddings (the first stage) and ln_f with the head (the last); the tensor-parallel group.
    int first_layer, n_blocks;
    bool has_embeddings, has_head;
    const Group *tensor_group;                     // NULL: whole blocks
    int tp_rank, tp_size;
    int recompute_batch;                           // GptSplit's: 0 keeps every block's inside from forward to backward
    bool sequence_parallel;                        // GptSplit's, with tp_size > 1: the token-wise regions hold 1 / tp_size of the rows
    Device device;                                 // where every tensor below lives
    // Parameters and their gradients.
    Tensor wte, wpe, ln_f_weight, ln_f_bias;       // [V, C], [block_size, C], [1, C], [1, C]
    Tensor grad_wte, grad_wpe, grad_ln_f_weight, grad_ln_f_bias;
    Tensor *blocks, *grad_blocks;                  // [n_blocks * GPT_BLOCK_TENSORS]
    int n_params;
    Param *params;                                 // model.parameters()
    int *param_index;                              // [n_blocks * GPT_BLOCK_TENSORS + 4]: where each tensor is in params (-1: absent)
    // model.train() / model.eval(): dropout acts in training only. Its masks come from dropout_rng,
    // which the caller seeds (gpt_seed_dropout) before each forward whose masks it wants to pin.
    bool training;
    Rng dropout_rng;
    // Where the masks come from: dropout_rng, torch's CPU generator (mt19937), drawn on the host; or,
    // with dropout_philox (a GPU's default), Philox keyed by the seed, stream (forward since the seed,
    // mask), drawn where the model lives (transformer_ops.h's dropout_philox).
    bool dropout_philox;
    uint64_t dropout_seed, dropout_forwards;       // forwards since the seed (micro-batch 0's count): the masks drawn are
                                                   // forward dropout_forwards - 1's
    int *slot_micro_batch;                         // [max_batch] (dropout): the micro-batch each slot holds, for its masks
    // The last forward's batch and activations.
    int B, T;
    TokenBatch *slot_tokens;                       // [max_batch] (the first stage): micro-batch slot s's inputs on the
                                                   // device, uploaded by its forward (at the first, allocated) and read
                                                   // again by its backward, which a pipeline runs after others' forwards
    int *targets;                                  // [max_batch * block_size], on the host (the loss copies them)
    Tensor embedded;                               // [N, C]: wte[idx] + wpe[pos] (after dropout); a later stage's input
    Tensor embed_mask;                             // [N / S, C]: transformer.drop's mask (dropout > 0; the first stage's)
    Tensor proj_out;                               // [N, C]: a c_proj's output before its dropout (dropout > 0) or its allreduce (T > 1)
    GptBlockActivations *acts;                     // [n_blocks]
    Tensor ln_f, ln_f_mean, ln_f_rstd;
    Tensor logits;                                 // [N, V]
    Tensor last_logits;                            // the last forward's rows of logits
    Tensor stage_output, grad_input;               // a stage's last output and input gradient (views)
    Tensor grad_logits;                            // [N, V]: d loss / d logits, set by gpt_loss
    // Backward's scratch, [N, ...].
    Tensor grad_residual, grad_ln, grad_qkv, grad_attn_y, grad_fc;
    Tensor grad_output;                            // [N, C]: d the stage's output, from the next stage (not the last)
    Tensor grad_proj_out;                          // [N, C]: d c_proj's output, through its dropout (dropout > 0)
    Tensor grad_att;                               // [B * n_head, T * T]: d att, then d scores (attention_backward's)
    // Sequence parallelism's scratch: a micro-batch's all-gathered rows [N, C] (a LayerNorm's output
    // for the Linear after it, d a c_proj's output, the first stage's embeddings), and a LayerNorm's
    // weight and bias gradients from this rank's tokens [2, C], before their sum over the group.
    Tensor gathered, grad_layernorm_part;
} Gpt;

// Config check for the flags: NULL when it is a model, else what is wrong ("--n_embd 100 is not
// divisible by --n_head 3").
const char *gpt_config_problem(const GptConfig *config);
// What gpt_new(config, max_batch) and its training will allocate on its device, by part, for
// memory_require (memory_budget.h): parameters, gradients, AdamW's moments, DDP's buckets, and the
// activations with backward's scratch and the batch's tokens, before anything is allocated.
void gpt_add_memory_need(MemoryNeed *need, const GptConfig *config, int max_batch);
// The same for gpt_new_part's part `split` (its blocks, split over its tensor group, with or
// without the embeddings and the head, recomputed, sequence-parallel); DDP's buckets as in
// gpt_add_memory_need.
void gpt_add_part_memory_need(MemoryNeed *need, const GptConfig *config, int max_batch, const GptSplit *split);
// The model with nanoGPT's initialisation drawn from rng: Linear and Embedding weights normal(0,
// 0.02), every c_proj weight normal(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorms 1 and 0.
// (Our normal draws are not torch.randn's stream: the twin starts from the same --init file.)
// Activations for batches of up to max_batch sequences. Every tensor on `device`; the weights are
// drawn on the host, so that one rng gives the same model on either device.
Gpt *gpt_new(const GptConfig *config, int max_batch, Rng *rng, Device device);
// A rank's part of `whole` (a model on the host, gpt_new's or loaded): its blocks, and its tensor-
// parallel rank's slices of them, copied; activations for max_batch sequences. Collective over
// nothing: every rank cuts its own part. Dropout only where the part is the whole model (its masks
// are drawn whole-model-wide).
Gpt *gpt_new_part(const Gpt *whole, int max_batch, const GptSplit *split, Device device);
// The reverse, for a checksum and --save: the part's values put at their places in `whole` (a model
// on the host), only those this rank owns (gpt_owns): the rest of whole is left as it is.
void gpt_part_to_whole(const Gpt *part, Gpt *whole);
// Whether params[index] counts on this rank when the ranks of a replica sum something over the
// whole model (the gradients' norm, the gathered model): a replicated tensor on tensor-parallel
// rank 0 only, the tied wte on the first stage only.
bool gpt_owns(const Gpt *model, int index);
// Where a part's params[index] lies in the whole model's tensor of its name (a sharded checkpoint's
// pieces, step 20): that tensor's shape, a vector of `cols` where it has one row (a bias, a
// LayerNorm's weight: checkpoint_whole_box's rule, step 19's), and the part's tensor as n_boxes boxes of it, one after another in its memory,
// each row-major: one for a tensor held whole or a row-parallel weight's columns, three for
// c_attn's (its heads' q, k and v rows).
typedef struct {
    bool vector;
    int rows, cols;
    int n_boxes;
    long long offset[3][2], count[3][2];  // each box's first (row, column) and its sizes
} GptParamBoxes;
GptParamBoxes gpt_param_boxes(const Gpt *model, int index);
void gpt_free(Gpt *model);
// nanoGPT's get_num_params(): every parameter, the position embedding left out when non_embedding
// (the head's weights are wte's and count once).
size_t gpt_num_params(const Gpt *model, bool non_embedding);

// model.train() (dropout on) or model.eval() (off); a new model trains.
void gpt_set_training(Gpt *model, bool training);
// torch.manual_seed(seed) for the dropout masks that the next forwards draw, in nanoGPT's order:
// the embeddings', then per block attention's probabilities, after attn.c_proj, after mlp.c_proj.
void gpt_seed_dropout(Gpt *model, uint64_t seed);
// Which generator draws the masks: torch's CPU generator on the host (false: the twin's masks, and
// a GPU waits for the copy of each; a whole model's only, drawn once) or Philox where the model
// lives (true: no wait, no copy, other masks; any part, drawn again by recompute). A new model
// takes Philox on a GPU and torch's generator on the CPU, as PyTorch's devices each have their
// own; either device computes either generator's bits.
void gpt_set_dropout_philox(Gpt *model, bool philox);

// Forward of B sequences of T <= block_size tokens each (inputs [B * T] on the host, values <
// vocab_size): fills the logits [B * T, V] and returns them, on the model's device (valid until
// the next forward).
const Tensor *gpt_forward(Gpt *model, const int *inputs, int B, int T);
// A pipeline stage's micro-batch `micro` of B sequences of T tokens, at rows micro * B * T of the
// activation buffers (B * T * (micro + 1) <= max_batch * block_size). Forward: the first stage
// from inputs [B * T] on the host; a later one from gpt_stage_input's view, which the caller fills
// with the previous stage's output. Returns the stage's output: the logits on the last stage (then
// gpt_stage_loss), else the last block's output [B * T, C], to send on. With dropout in training,
// the masks are those of the micro-step's micro-batch `micro_batch` (of the micro-step's B M
// sequences, sequences micro_batch B ..), which step 19's whole forward of the micro-step draws
// for them, whatever slot `micro` holds it; micro-batch 0's forward starts the micro-step's.
Tensor gpt_stage_input(Gpt *model, int micro, int B, int T);
const Tensor *gpt_stage_forward(Gpt *model, int micro, int micro_batch, const int *inputs, int B, int T);
// The last stage: F.cross_entropy of micro-batch micro's logits (its mean), and its gradient times
// factor (its share of the step) kept for backward.
float gpt_stage_loss(Gpt *model, int micro, const int *targets, int B, int T, float factor);
// The same with the loss written to `slot` (tensor_ops.h's LossSlot: on a GPU it stays there, and the
// host does not wait; train/step_losses.h hands it over later), the same bits.
void gpt_stage_loss_to(Gpt *model, int micro, const int *targets, int B, int T, float factor, LossSlot slot);
// Not the last stage: where the caller puts d loss / d output [B * T, C] before gpt_stage_backward.
Tensor gpt_stage_grad_output(Gpt *model, int B, int T);
// Backward of micro-batch micro (the first stage's embeddings: the tokens its forward uploaded to
// its slot). Returns d loss / d the stage's input [B * T, C] for the previous stage (NULL on the
// first stage). The hook as gpt_backward's, for every gradient of the part, each time.
const Tensor *gpt_stage_backward(Gpt *model, int micro, int B, int T, GradReadyHook hook, void *context);

// Row `row` of the last forward's logits [V], copied to the host (the host waits for the forward).
void gpt_logits_row(const Gpt *model, int row, float *host);
// model.generate(idx, max_new_tokens, temperature, top_k), nanoGPT's: tokens[n] for n from
// prompt_length to prompt_length + new_tokens - 1, each drawn from the logits at the last of the
// (at most block_size) tokens before it: divided by temperature, every logit below the top_k-th
// largest left out (top_k >= vocab_size: none), softmax, one draw from rng. tokens holds
// prompt_length + new_tokens, the prompt first. Call gpt_set_training(model, false) first
// (model.eval(): no dropout), as nanoGPT's sample.py does. top_k >= 1, temperature > 0.
void gpt_generate(Gpt *model, int *tokens, int prompt_length, int new_tokens, double temperature, int top_k, Rng *rng);
// F.cross_entropy of the last forward's logits against targets [B * T]: the mean over tokens.
// Keeps d loss / d logits for backward.
float gpt_loss(Gpt *model, const int *targets);
void gpt_loss_to(Gpt *model, const int *targets, LossSlot slot);  // ... into `slot`, as gpt_stage_loss_to
// (loss * factor).backward() instead of loss.backward() (gradient accumulation: loss / accum_steps).
void gpt_scale_loss(Gpt *model, float factor);
// loss.backward(): every parameter's gradient of the last gpt_loss, accumulated into its grad;
// hook(context, i) as soon as params[i]'s is final (ln_f's first, wte's last), as DDP needs.
void gpt_backward(Gpt *model, GradReadyHook hook, void *context);
void gpt_zero_grad(Gpt *model);

// The state_dict for --save: model.parameters() and lm_head.weight (wte's tensor), in
// model.state_dict()'s order. params[] has *n entries; free() it.
Param *gpt_state_dict(const Gpt *model, int *n);

// FLOPs of forward and backward per token at context T, as nanoGPT's estimate_mfu (and PaLM's
// appendix B) count them: 6 N for the weights' multiply-adds (N = gpt_num_params(non_embedding)),
// plus 12 L H Q T for attention's scores and weighted sums (Q = head_dim).
double gpt_flops_per_token(const Gpt *model, int T);

// Memory, in floats, held by what the model keeps: its activations for a batch of max_batch
// sequences at block_size (what gpt_new allocated for forward and backward).
size_t gpt_activation_floats(const Gpt *model);
