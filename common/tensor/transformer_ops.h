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
// These are the CPU's loops, on the rank's OpenMP threads; every reduction (a LayerNorm's
// statistics, a column sum for a weight's gradient, an embedding row's sum over the batch) runs
// in a fixed order, so the bits do not depend on the thread count. (Step 19's GPU kernels are
// not written yet: the program refuses --device cuda; see day5/README.md.)
#pragma once
#include "base/rng.h"

// y = (x - mean) / sqrt(var + 1e-5) * weight + bias over each row of x [N, C] (var: the biased
// variance, as nn.LayerNorm). Keeps each row's mean and 1/sqrt(var + eps) [N] for backward.
// bias may be NULL (nanoGPT's bias=False).
void layernorm_forward(const float *x, const float *weight, const float *bias, int rows, int cols, float *y,
                       float *mean, float *rstd);
// grad_x += d/dx, grad_weight += sum over rows of grad_y * x_hat, grad_bias += sum of grad_y
// (grad_bias NULL: no bias).
void layernorm_backward(const float *x, const float *weight, const float *mean, const float *rstd,
                        const float *grad_y, int rows, int cols, float *grad_x, float *grad_weight,
                        float *grad_bias);

// Attention of qkv [B * T, 3C] (c_attn's output: q, then k, then v, each [C] = n_head heads of
// C / n_head) into y [B * T, C] (heads side by side, as y.transpose(1, 2).view(B, T, C)):
// att = softmax(q k^T / sqrt(head_dim)) with position t seeing positions 0..t only; y = att v.
// Keeps att [B, n_head, T, T] (zero above the diagonal) for backward. With dropout_mask [B, n_head,
// T, T] (each value 0 or 1 / (1 - p): nanoGPT's attn_dropout), y = (att * mask) v, and att_dropped
// keeps att * mask; both NULL: no dropout.
void attention_forward(const float *qkv, int B, int T, int C, int n_head, float *att, const float *dropout_mask,
                       float *att_dropped, float *y);
// grad_qkv [B * T, 3C] = the gradient of q, k and v (overwritten, not added: qkv has no other use).
// dropout_mask and att_dropped as forward had them (NULL: no dropout).
void attention_backward(const float *qkv, const float *att, const float *dropout_mask, const float *att_dropped,
                        const float *grad_y, int B, int T, int C, int n_head, float *grad_qkv);

// nn.Dropout(p) in training, as PyTorch's CPU kernel draws it (a build without MKL, as Debian's):
// mask[i] = (u_i < 1 - p) / (1 - p) in float, u_i = the 53-bit uniform of one 64-bit draw (two 32-bit
// numbers of the generator, the first the high half), in the tensor's order: torch's
// bernoulli_(1 - p), then div_(1 - p). Serial: a generator is a sequence.
void dropout_mask(Rng *rng, double p, long n, float *mask);
// x *= mask, elementwise over n values (forward: the dropout; backward: its gradient).
void multiply_by_mask(float *x, const float *mask, long n);
// out = a + b, elementwise over n values (a residual: x + dropout(c_proj(y))).
void add_elementwise(const float *a, const float *b, long n, float *out);

// y = GELU(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), elementwise over n values.
void gelu_forward(const float *x, long n, float *y);
// grad_x = grad_y * GELU'(x), where GELU'(x) = Phi(x) + x * phi(x); grad_x may be grad_y.
void gelu_backward(const float *x, const float *grad_y, long n, float *grad_x);

// x [B * T, C] = wte[tokens] + wpe[position]: transformer.wte(idx) + transformer.wpe(pos).
void embedding_forward(const int *tokens, const float *wte, const float *wpe, int B, int T, int C, float *x);
// grad_wte[token] += each of its rows of grad_x, grad_wpe[t] += the sum over the batch of row t.
// Each row of a table is summed in token order (nothing atomic): the same bits on any thread count.
void embedding_backward(const int *tokens, const float *grad_x, int B, int T, int C, float *grad_wte,
                        float *grad_wpe);
