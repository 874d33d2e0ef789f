// transformer_ops.h: the operations of a GPT block that are not GEMMs, forward and backward.
//
// LayerNorm, causal multi-head self-attention (the part between c_attn and c_proj: scores, the
// causal softmax, the weighted sum of values), GELU and the token + position embeddings, each as
// nanoGPT's model.py computes it with torch.nn (nn.LayerNorm eps 1e-5, nn.GELU() exact: erf, the
// mask of torch.tril). The GEMMs of the Linears and of the tied head are tensor.h's gemm; the
// cross-entropy is tensor_ops.h's.
//
// Tokens are rows: x [N, C] holds N = B * T tokens, batch-major (row b * T + t is position t of
// sequence b), as a contiguous torch tensor [B, T, C] is laid out. Backward functions ADD their
// input gradients into what the caller gives them (grad_x +=), as autograd accumulates into a
// residual stream, and add their parameter gradients too (grad_weight +=), as .grad accumulates.
//
// Each operation makes the CPU/GPU choice once, inside, from where its tensors live (as
// tensor_ops.h's do): on the CPU, loops on the rank's OpenMP threads; on the GPU, the kernels of
// kernels.h on the compute stream, and cuBLAS's batched GEMMs for the attention's
// products. Every reduction (a LayerNorm's statistics, a column sum for a weight's gradient, an
// embedding row's sum over the batch) runs in a fixed order, so the bits depend neither on the
// thread count nor on the run; the kernels do the CPU's operations in the CPU's order, so that
// LayerNorm, the causal softmax, GELU, the embeddings and the elementwise operations are the CPU's
// bits on a GPU too (tests/unit/test_gpu.c checks it), the attention's GEMMs to rounding.
// A tensor bigger than an operation's batch (a buffer allocated for the largest one) is used from
// its start: rows_of a [max N, C] buffer, the first B n_head T^2 values of an attention buffer.
#pragma once
#include "base/rng.h"
#include "tensor/tensor_ops.h"  // Tensor, IntBuffer

// y = (x - mean) / sqrt(var + 1e-5) * weight + bias over each row of x [N, C] (var: the biased
// variance, as nn.LayerNorm). Keeps each row's mean and 1/sqrt(var + eps) (the first N values of
// mean and rstd) for backward. bias may be NULL (nanoGPT's bias=False).
void layernorm_forward(const Tensor *x, const Tensor *weight, const Tensor *bias, Tensor *y, Tensor *mean,
                       Tensor *rstd);
// grad_x += d/dx, grad_weight += sum over rows of grad_y * x_hat, grad_bias += sum of grad_y
// (grad_bias NULL: no bias).
void layernorm_backward(const Tensor *x, const Tensor *weight, const Tensor *mean, const Tensor *rstd,
                        const Tensor *grad_y, Tensor *grad_x, Tensor *grad_weight, Tensor *grad_bias);

// Attention of qkv [B * T, 3C] (c_attn's output: q, then k, then v, each [C] = n_head heads of
// C / n_head) into y [B * T, C] (heads side by side, as y.transpose(1, 2).view(B, T, C)):
// att = softmax(q k^T / sqrt(head_dim)) with position t seeing positions 0..t only; y = att v.
// Keeps att [B, n_head, T, T] (zero above the diagonal) for backward. With dropout_mask [B, n_head,
// T, T] (each value 0 or 1 / (1 - p): nanoGPT's attn_dropout), y = (att * mask) v, and att_dropped
// keeps att * mask; both NULL: no dropout.
void attention_forward(const Tensor *qkv, int B, int T, int n_head, Tensor *att, const Tensor *dropout_mask,
                       Tensor *att_dropped, Tensor *y);
// grad_qkv [B * T, 3C] = the gradient of q, k and v (overwritten, not added: qkv has no other use).
// dropout_mask and att_dropped as forward had them (NULL: no dropout). grad_att: scratch of B
// n_head T^2 values, the gradient of the probabilities and then of the scores.
void attention_backward(const Tensor *qkv, const Tensor *att, const Tensor *dropout_mask, const Tensor *att_dropped,
                        const Tensor *grad_y, int B, int T, int n_head, Tensor *grad_att, Tensor *grad_qkv);

// nn.Dropout(p) in training, as PyTorch's CPU kernel draws it (a build without MKL, as Debian's):
// mask[i] = (u_i < 1 - p) / (1 - p) in float, u_i = the 53-bit uniform of one 64-bit draw (two 32-bit
// numbers of the generator, the first the high half), in the tensor's order: torch's
// bernoulli_(1 - p), then div_(1 - p). Serial: a generator is a sequence.
void dropout_mask(Rng *rng, double p, long n, float *mask);
// The first n values of mask drawn as dropout_mask draws them: on the host whatever the device (the
// same generator, so the same masks on a GPU), then copied there (the host waits for the copy).
void dropout_draw(Rng *rng, double p, long n, Tensor *mask);
// The same kind of mask from a counter-based generator instead (Philox4x32-10, base/philox.h, the
// kind PyTorch's and cuRAND's GPU generators are): value i is kept when philox_keeps(word i % 4 of
// philox4x32_10({i / 4, stream}, seed)), and kept values are 1 / (1 - p). Computed where the mask
// lives, a kernel on a GPU and the rank's threads on the CPU, with no host wait and no copy: the
// same bits on either device at any thread count. Not torch's bits on either device.
void dropout_philox(uint64_t seed, uint64_t stream, double p, long n, Tensor *mask);
// The part of such a mask that a rank of a split model holds, into mask [runs, length]: run r is the
// whole mask's values first + r stride .. first + r stride + length - 1 (a micro-batch's rows; a
// tensor-parallel rank's heads of each sequence), the bits dropout_philox gives them in the whole.
void dropout_philox_part(uint64_t seed, uint64_t stream, double p, long first, long length, long stride, long runs,
                         Tensor *mask);
// x *= mask, elementwise over x's values (forward: the dropout; backward: its gradient).
void multiply_by_mask(Tensor *x, const Tensor *mask);
// out = a + b, elementwise over out's values (a residual: x + dropout(c_proj(y))).
void add_elementwise(const Tensor *a, const Tensor *b, Tensor *out);

// y = GELU(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), elementwise over x's values.
void gelu_forward(const Tensor *x, Tensor *y);
// grad_x = grad_y * GELU'(x), where GELU'(x) = Phi(x) + x * phi(x); grad_x may be grad_y.
void gelu_backward(const Tensor *x, const Tensor *grad_y, Tensor *grad_x);

// A batch's tokens where the embeddings read them: tokens [n] in batch order on the model's device,
// and, on a GPU, the same positions grouped by token, for embedding_backward: positions[row_start[v]
// .. row_start[v + 1]) are where token v occurs, in increasing order (a stable counting sort on the
// host), so that a thread per value of wte's row v sums them in the CPU's order, with no atomics.
// On a GPU the three go up in one copy: [tokens | row_start | positions], built on the host.
typedef struct {
    int n, capacity, vocab_size;
    Device device;
    IntBuffer index;  // [capacity] on a CPU; on a GPU [capacity + vocab_size + 1 + capacity]
    const int *tokens, *row_start, *positions;  // in `index`: [n], and on a GPU [vocab_size + 1] and [n] after them
    int *host_index;  // on a GPU: what goes up, built here
} TokenBatch;
TokenBatch token_batch_new(int capacity, int vocab_size, Device device);
// The batch's n tokens, from the host (each checked to be in [0, vocab_size)).
void token_batch_set(TokenBatch *batch, const int *tokens, int n);
void token_batch_free(TokenBatch *batch);

// x [B * T, C] = wte[tokens] + wpe[position]: transformer.wte(idx) + transformer.wpe(pos).
void embedding_forward(const TokenBatch *tokens, const Tensor *wte, const Tensor *wpe, int B, int T, Tensor *x);
// grad_wte[token] += each of its rows of grad_x, grad_wpe[t] += the sum over the batch of row t.
// Each row of a table is summed in token order (nothing atomic): the same bits on any thread count
// and on either device.
void embedding_backward(const TokenBatch *tokens, const Tensor *grad_x, int B, int T, Tensor *grad_wte,
                        Tensor *grad_wpe);
