// gpt_ops_bench: where a training iteration of step 19's GPT spends its time, phase by phase and
// operation by operation, on the CPU or a GPU, at a shape of your choice (default: nanoGPT's
// train_shakespeare_char, the config issue 40 measures on a GPU):
//   gpt_ops_bench [cpu|cuda] [B T C H L DROPOUT [DTYPE]]   e.g. gpt_ops_bench cuda 64 256 384 6 6 0.2 bfloat16
// (DTYPE: float32, the default, or bfloat16: the matrix products as --dtype bfloat16 runs them)
// Each line is the median of REPEATS timed calls (after one warm-up), with the device synchronised
// around each call (op_timer.h): the time the operation itself takes, not its launch. Part of
// make bench's GPU figures (docs/gpus.md); nothing here is asserted.
#include <stdio.h>
#include <stdlib.h>

#include "base/timer.h"
#include "models/adamw.h"
#include "models/gpt.h"
#include "runtime/device.h"
#include "runtime/dist.h"
#include "tensor/transformer_ops.h"
#include "op_timer.h"  // TIME

static void noop_hook(void *context, int index) { (void)context, (void)index; }

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    const char *flag = argc > 1 ? argv[1] : "auto";
    int B = argc > 2 ? atoi(argv[2]) : 64, T = argc > 3 ? atoi(argv[3]) : 256, C = argc > 4 ? atoi(argv[4]) : 384;
    int H = argc > 5 ? atoi(argv[5]) : 6, L = argc > 6 ? atoi(argv[6]) : 6;
    double dropout = argc > 7 ? atof(argv[7]) : 0.2;
    if (B < 1 || T < 1 || C < 1 || H < 1 || L < 1 || C % H || !(dropout >= 0 && dropout < 1)) {
        fprintf(stderr, "usage: %s [cpu|cuda|auto] [B T C H L DROPOUT [float32|bfloat16]] (C a multiple of H, 0 <= DROPOUT < 1)\n",
                argv[0]);
        return 2;
    }
    matmul_set_dtype(matmul_dtype_from_flag(argc > 8 ? argv[8] : "float32"));
    Device device = device_from_flag(flag);
    const int V = 65, N = B * T;
    printf("GPT ops at B %d, T %d, C %d, %d heads, %d layers, vocabulary %d, dropout %g, matmuls in %s, on %s\n", B, T, C,
           H, L, V, dropout, matmul_dtype() == MATMUL_BFLOAT16 ? "bfloat16" : "float32", device_name(device));

    // The whole iteration, phase by phase, as day5/19_gpt runs it (one rank, one micro-step).
    GptConfig config = {.vocab_size = V, .block_size = T, .n_layer = L, .n_head = H, .n_embd = C, .dropout = dropout};
    Rng rng;
    rng_seed(&rng, 1337);
    Gpt *model = gpt_new(&config, B, &rng, device);
    AdamW optimizer = adamw_new(model->params, model->n_params, 0.1, 0.9, 0.99);
    int *inputs = malloc((size_t)N * sizeof *inputs), *targets = malloc((size_t)N * sizeof *targets);
    for (int i = 0; i < N; i++) inputs[i] = (int)(rng_next_u32(&rng) % V), targets[i] = (int)(rng_next_u32(&rng) % V);
    printf("iteration, by phase:\n");
    TIME("forward (gpt_forward)", 1, gpt_forward(model, inputs, B, T));
    TIME("loss (gpt_loss, read on the host)", 1, gpt_loss(model, targets));
    TIME("backward (gpt_backward)", 1, gpt_backward(model, noop_hook, NULL));
    TIME("clip_grad_norm", 1, clip_grad_norm(model->params, model->n_params, 1.0));
    TIME("AdamW step", 1, adamw_step(&optimizer, 1e-4));
    TIME("whole iteration", 1, {
        gpt_zero_grad(model);
        gpt_forward(model, inputs, B, T);
        gpt_loss(model, targets);
        gpt_backward(model, noop_hook, NULL);
        clip_grad_norm(model->params, model->n_params, 1.0);
        adamw_step(&optimizer, 1e-4);
    });

    // One block's operations, one call each (a layer runs each of them once, LayerNorm twice).
    Tensor x = tensor_zeros(N, C, device), y = tensor_zeros(N, C, device), grad_x = tensor_zeros(N, C, device);
    Tensor weight = tensor_zeros(1, C, device), grad_weight = tensor_zeros(1, C, device);
    Tensor mean = tensor_zeros(1, N, device), rstd = tensor_zeros(1, N, device);
    Tensor w_attn = tensor_zeros(3 * C, C, device), qkv = tensor_zeros(N, 3 * C, device);
    Tensor grad_qkv = tensor_zeros(N, 3 * C, device), att = tensor_zeros(B * H, T * T, device);
    Tensor att_mask = tensor_zeros(B * H, T * T, device), att_dropped = tensor_zeros(B * H, T * T, device);
    Tensor grad_att = tensor_zeros(B * H, T * T, device), token_mask = tensor_zeros(N, C, device);
    Tensor fc = tensor_zeros(N, 4 * C, device), fc_out = tensor_zeros(N, 4 * C, device);
    Tensor w_fc = tensor_zeros(4 * C, C, device), grad_wte = tensor_zeros(V, C, device), grad_wpe = tensor_zeros(T, C, device);
    tensor_fill(&x, 0.5f), tensor_fill(&weight, 1.0f), tensor_fill(&w_attn, 0.01f), tensor_fill(&w_fc, 0.01f);
    tensor_fill(&y, 0.25f), tensor_fill(&fc, 0.1f);
    layernorm_forward(&x, &weight, NULL, &y, &mean, &rstd);
    gemm(false, true, 1.0f, &x, &w_attn, 0.0f, &qkv);
    // The masks as step 19 draws them on a GPU (Philox there, --dropout_rng's default: gpt.c); torch's
    // generator, drawn on the host and copied, is the CPU's default and a GPU's option.
    Rng mask_rng;
    rng_seed(&mask_rng, 1);
    if (dropout > 0) dropout_philox(1, 0, dropout, (long)tensor_numel(&att_mask), &att_mask);
    printf("one block's operations:\n");
    TIME("layernorm_forward [N, C]", 1, layernorm_forward(&x, &weight, NULL, &y, &mean, &rstd));
    TIME("layernorm_backward", 1, layernorm_backward(&x, &weight, &mean, &rstd, &y, &grad_x, &grad_weight, NULL));
    TIME("c_attn: gemm [N, C] x [C, 3C]", 1, gemm(false, true, 1.0f, &x, &w_attn, 0.0f, &qkv));
    TIME("c_fc weight gradient: gemm [4C, N] x [N, C]", 1, gemm(true, false, 1.0f, &fc, &x, 1.0f, &w_fc));
    TIME("attention_forward, no dropout", 1, attention_forward(&qkv, B, T, H, &att, NULL, NULL, &y));
    TIME("attention_backward, no dropout", 1, attention_backward(&qkv, &att, NULL, NULL, &y, B, T, H, &grad_att, &grad_qkv));
    if (dropout > 0) {
        TIME("attention_forward, dropout", 1, attention_forward(&qkv, B, T, H, &att, &att_mask, &att_dropped, &y));
        TIME("dropout_philox [B H, T T] (attention's mask)", 1,
             dropout_philox(1, 1, dropout, (long)tensor_numel(&att_mask), &att_mask));
        TIME("dropout_philox [N, C] (a c_proj's mask)", 1,
             dropout_philox(1, 2, dropout, (long)tensor_numel(&token_mask), &token_mask));
        TIME("dropout_draw [N, C], on the host (torch's)", 1,
             dropout_draw(&mask_rng, dropout, (long)tensor_numel(&token_mask), &token_mask));
        TIME("multiply_by_mask [N, C]", 1, multiply_by_mask(&y, &token_mask));
    }
    TIME("gelu_forward [N, 4C]", 1, gelu_forward(&fc, &fc_out));
    TIME("gelu_backward [N, 4C]", 1, gelu_backward(&fc, &fc_out, &fc_out));
    TIME("add_elementwise [N, C]", 1, add_elementwise(&x, &y, &grad_x));
    TIME("embedding_backward", 1, embedding_backward(&model->slot_tokens[0], &x, B, T, &grad_wte, &grad_wpe));

    Tensor *all[] = {&x, &y, &grad_x, &weight, &grad_weight, &mean, &rstd, &w_attn, &qkv, &grad_qkv, &att, &att_mask,
                     &att_dropped, &grad_att, &token_mask, &fc, &fc_out, &w_fc, &grad_wte, &grad_wpe};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    adamw_free(&optimizer);
    gpt_free(model);
    free(inputs), free(targets);
    dist_finalize();
    return 0;
}
