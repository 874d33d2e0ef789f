// test_gpu.c: every GPU operation against the CPU code that the other unit
// tests verify (finite differences, a hand-computed Adam, PyTorch's numbers).
//
// Each operation runs on the same inputs on both devices, and the GPU's
// result comes back to be compared: bit for bit where the arithmetic is
// exactly the same (copies, fills, division, the uint8 -> float gather, the
// ReLU mask), to a relative tolerance where the order of a sum or a
// transcendental function (expf, logf) differs (GEMM, softmax, Adam's sqrt).
//
// Without a GPU it prints one "SKIP ... (skipped: no GPU)" line and passes;
// REQUIRE_GPU=1 (make test-gpu) turns that into a failure.

// The checks' name: "test_gpu", then "test_gpu (64-bit indices)" in main's second round.
static const char *test_name = "test_gpu";
#define TEST_NAME test_name
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "data/mnist.h"
#include "data/rating_sampler.h"
#include "models/adamw.h"
#include "models/cnn.h"
#include "models/gpt.h"
#include "models/mf.h"
#include "models/nn.h"
#include "records/h5.h"
#include "runtime/device.h"
#include "runtime/dist.h"
#include "tensor/transformer_ops.h"
#include "test.h"
#if HAVE_CUDA
#include "tensor/kernels.h"  // gpu_row_sum_chunks: how add_sum_of_rows cuts a row on the GPU
#endif

static Rng data_rng;

static void fill_uniform(Tensor *t, float low, float high) {
    for (size_t i = 0; i < tensor_numel(t); i++) t->data[i] = rng_uniform(&data_rng, low, high);
}

// A CPU copy of any tensor (the caller frees it).
static Tensor on_cpu(const Tensor *t) {
    Tensor host = tensor_zeros(t->rows, t->cols, DEVICE_CPU);
    tensor_copy(&host, t);
    return host;
}
static Tensor on_gpu(const Tensor *t) {
    Tensor device = tensor_zeros(t->rows, t->cols, DEVICE_CUDA);
    tensor_copy(&device, t);
    return device;
}

// max |a - b| / (max |b| + tiny): relative to the tensor's scale, which is
// what a GEMM's rounding error is proportional to. A NaN on one side only is
// an infinite error (fmax alone would pass over it).
// max |a - b| / max |b| of two host tensors.
static double relative_error_cpu(const Tensor *a, const Tensor *b) {
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < tensor_numel(b); i++) {
        worst = fmax(worst, fabs((double)a->data[i] - b->data[i]));
        scale = fmax(scale, fabs(b->data[i]));
    }
    return worst / scale;
}

static double relative_error(const Tensor *gpu, const Tensor *cpu) {
    Tensor a = on_cpu(gpu);
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < tensor_numel(cpu); i++) {
        if (isnan(a.data[i]) != isnan(cpu->data[i])) worst = INFINITY;
        worst = fmax(worst, fabs((double)a.data[i] - cpu->data[i]));
        scale = fmax(scale, fabs(cpu->data[i]));
    }
    tensor_free(&a);
    return worst / scale;
}

static size_t bits_differ(const Tensor *gpu, const Tensor *cpu) {
    Tensor a = on_cpu(gpu);
    size_t differ = 0;
    for (size_t i = 0; i < tensor_numel(cpu); i++) differ += memcmp(&a.data[i], &cpu->data[i], sizeof(float)) != 0;
    tensor_free(&a);
    return differ;
}

static void test_copies_and_elementwise(void) {
    Tensor cpu = tensor_zeros(33, 65, DEVICE_CPU);
    fill_uniform(&cpu, -3, 3);
    Tensor gpu = on_gpu(&cpu);
    EXPECT(bits_differ(&gpu, &cpu) == 0, "CPU -> GPU -> CPU copy of [33, 65] is bit-exact");

    tensor_divide(&cpu, 3.0f), tensor_divide(&gpu, 3.0f);
    EXPECT(bits_differ(&gpu, &cpu) == 0, "tensor_divide by 3 is bit-identical (IEEE division on both)");
    tensor_scale(&cpu, 0.7f), tensor_scale(&gpu, 0.7f);
    EXPECT(bits_differ(&gpu, &cpu) == 0, "tensor_scale by 0.7 is bit-identical");

    float back[4] = {0};
    Tensor row = tensor_zeros(1, 4, DEVICE_CUDA);
    tensor_from_host(&row, (const float[]){1.5f, -2.0f, 0.0f, 7.25f});
    tensor_to_host(&row, back);
    EXPECT(back[0] == 1.5f && back[1] == -2.0f && back[2] == 0.0f && back[3] == 7.25f,
           "tensor_from_host / tensor_to_host round trip: %g %g %g %g", back[0], back[1], back[2], back[3]);
    tensor_fill(&row, 0.25f);
    tensor_to_host(&row, back);
    EXPECT(back[0] == 0.25f && back[3] == 0.25f, "tensor_fill(0.25) on the GPU: %g .. %g", back[0], back[3]);
    tensor_free(&row);
    tensor_free(&cpu);
    tensor_free(&gpu);
}

// device_peak_bytes: the most that device_alloc held at once, allocations freed counted out.
static void test_peak_bytes(void) {
    size_t before = device_peak_bytes();
    size_t mb = 1 << 20, base = before;
    // Far above whatever the earlier tests held, so that the peak is this test's.
    void *a = device_alloc(64 * mb + base), *b = device_alloc(32 * mb + base);
    size_t two = device_peak_bytes();
    device_free(a);
    void *c = device_alloc(16 * mb);
    size_t after_c = device_peak_bytes();
    device_free(b), device_free(c);
    void *d = device_alloc(100 * mb + 3 * base);
    size_t last = device_peak_bytes();
    device_free(d);
    EXPECT(two >= 96 * mb + 2 * base && after_c == two && last - two == 4 * mb + base,
           "device_peak_bytes: 64 + 32 MB live peak at %.1f MB; with 64 MB freed, 16 MB more leave it there (%.1f MB); "
           "a 100 MB block alone raises it by exactly what it holds beyond them, to %.1f MB",
           (double)two / mb, (double)after_c / mb, (double)last / mb);
}

static void test_gemm(void) {
    const int m = 37, k = 53, n = 29;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            Tensor a = tensor_zeros(ta ? k : m, ta ? m : k, DEVICE_CPU);
            Tensor b = tensor_zeros(tb ? n : k, tb ? k : n, DEVICE_CPU);
            Tensor c = tensor_zeros(m, n, DEVICE_CPU);
            fill_uniform(&a, -1, 1), fill_uniform(&b, -1, 1), fill_uniform(&c, -1, 1);
            Tensor ga = on_gpu(&a), gb = on_gpu(&b), gc = on_gpu(&c);
            gemm(ta, tb, 0.5f, &a, &b, 0.75f, &c);
            gemm(ta, tb, 0.5f, &ga, &gb, 0.75f, &gc);
            double err = relative_error(&gc, &c);
            EXPECT(err < 1e-5, "gemm(%s, %s) [%d, %d] x [%d, %d], alpha 0.5, beta 0.75: cuBLAS vs CBLAS, rel err %.1e",
                   ta ? "T" : "N", tb ? "T" : "N", m, k, k, n, err);
            tensor_free(&a), tensor_free(&b), tensor_free(&c);
            tensor_free(&ga), tensor_free(&gb), tensor_free(&gc);
        }

    // With bfloat16 matmuls (--dtype bfloat16): the tensor cores' GEMM of the rounded operands
    // (cublasGemmEx) against the CPU's GEMM of the same rounded values: exact products, float32
    // sums in another order, so a float32 GEMM's tolerance; and 5e-4 and more from float32's result.
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            Tensor a = tensor_zeros(ta ? k : m, ta ? m : k, DEVICE_CPU);
            Tensor b = tensor_zeros(tb ? n : k, tb ? k : n, DEVICE_CPU);
            Tensor c = tensor_zeros(m, n, DEVICE_CPU), c32 = tensor_zeros(m, n, DEVICE_CPU);
            fill_uniform(&a, -1, 1), fill_uniform(&b, -1, 1), fill_uniform(&c, -1, 1);
            tensor_copy(&c32, &c);
            Tensor ga = on_gpu(&a), gb = on_gpu(&b), gc = on_gpu(&c);
            gemm(ta, tb, 0.5f, &a, &b, 0.75f, &c32);
            matmul_set_dtype(MATMUL_BFLOAT16);
            gemm(ta, tb, 0.5f, &a, &b, 0.75f, &c);
            gemm(ta, tb, 0.5f, &ga, &gb, 0.75f, &gc);
            matmul_set_dtype(MATMUL_FLOAT32);
            double err = relative_error(&gc, &c), from_fp32 = relative_error(&gc, &c32);
            EXPECT(err < 1e-5 && from_fp32 > 5e-4,
                   "gemm(%s, %s) [%d, %d] x [%d, %d] with bfloat16 matmuls: cublasGemmEx vs the CPU's, rel err %.1e "
                   "(%.1e from float32's)", ta ? "T" : "N", tb ? "T" : "N", m, k, k, n, err, from_fp32);
            tensor_free(&a), tensor_free(&b), tensor_free(&c), tensor_free(&c32);
            tensor_free(&ga), tensor_free(&gb), tensor_free(&gc);
        }

    // The GPU's bfloat16 GEMM multiplies each float32 operand rounded to nearest, ties to even, as
    // round_to_bfloat16 and autocast's .to(torch.bfloat16) round it. An outer product (k = 1): each
    // C[i][j] is one product of two rounded values, exact in float32, so it shows both operands'
    // rounding: ties either way, just above and below a half, both signs. (cuBLAS's own
    // CUBLAS_COMPUTE_32F_FAST_16BF on float32 operands fails this on an H100: 1 + 2^-8 x -2.75 gave
    // -2.76074219, the operand not rounded to bfloat16 at all; docs/gpus.md.)
    {
        const float half = 0x1p-8f, bit = 0x1p-20f;
        const float values[] = {1 + half, 1 + 3 * half, 1 + half + bit, 1 + half - bit, -(1 + half + bit),
                                -(1 + 3 * half), 0.1f, 3.14159265f, 1000.5f, 1e-3f + 1e-10f, -2.75f, 0.0f};
        const int count = (int)(sizeof values / sizeof *values);
        Tensor a = tensor_zeros(count, 1, DEVICE_CPU), b = tensor_zeros(1, count, DEVICE_CPU);
        for (int i = 0; i < count; i++) a.data[i] = values[i], b.data[i] = values[count - 1 - i];
        Tensor ga = on_gpu(&a), gb = on_gpu(&b), gc = tensor_zeros(count, count, DEVICE_CUDA);
        matmul_set_dtype(MATMUL_BFLOAT16);
        gemm(false, false, 1.0f, &ga, &gb, 0.0f, &gc);
        matmul_set_dtype(MATMUL_FLOAT32);
        float *c = xmalloc((size_t)count * count * sizeof(float));
        tensor_to_host(&gc, c);
        int wrong = 0, first = -1;
        for (int i = 0; i < count * count; i++) {
            float want = round_to_bfloat16(a.data[i / count]) * round_to_bfloat16(b.data[i % count]);
            if (c[i] != want && wrong++ == 0) first = i;  // (exact: a product of two bfloat16 values)
        }
        EXPECT(wrong == 0, "gemm with bfloat16 matmuls on the GPU rounds each float32 operand to nearest, ties to even "
               "(round_to_bfloat16's, autocast's): %d of %d products of rounded values differ", wrong, count * count);
        if (wrong)
            printf("  the first: %.9g x %.9g gave %.9g, not %.9g\n", a.data[first / count], b.data[first % count], c[first],
                   round_to_bfloat16(a.data[first / count]) * round_to_bfloat16(b.data[first % count]));
        free(c);
        tensor_free(&a), tensor_free(&b), tensor_free(&ga), tensor_free(&gb), tensor_free(&gc);
    }

    // gemm_hold_rounded on the GPU: the held operand's bfloat16 copy, made by the first product,
    // serves the next (as A, then as B: a Linear's and conv2d_backward's grad_y) with each product's
    // own bits; held again after new values were copied in, the products read those.
    {
        Tensor g = tensor_zeros(23, 31, DEVICE_CPU), x = tensor_zeros(31, 19, DEVICE_CPU), w = tensor_zeros(19, 23, DEVICE_CPU);
        fill_uniform(&x, -2, 2), fill_uniform(&w, -2, 2);
        Tensor gg = on_gpu(&g), gx = on_gpu(&x), gw = on_gpu(&w);
        Tensor c[4] = {tensor_zeros(23, 19, DEVICE_CUDA), tensor_zeros(19, 31, DEVICE_CUDA), tensor_zeros(23, 19, DEVICE_CUDA),
                       tensor_zeros(19, 31, DEVICE_CUDA)};
        matmul_set_dtype(MATMUL_BFLOAT16);
        size_t differ = 0;
        for (int round = 0; round < 2; round++) {
            fill_uniform(&g, -2, 2);
            tensor_from_host(&gg, g.data);
            gemm(false, false, 1.0f, &gg, &gx, 0.0f, &c[0]);
            gemm(false, false, 1.0f, &gw, &gg, 0.0f, &c[1]);
            gemm_hold_rounded(&gg);
            gemm(false, false, 1.0f, &gg, &gx, 0.0f, &c[2]);
            gemm(false, false, 1.0f, &gw, &gg, 0.0f, &c[3]);
            gemm_release_rounded();
            Tensor own_a = on_cpu(&c[0]), own_b = on_cpu(&c[1]);
            differ += bits_differ(&c[2], &own_a) + bits_differ(&c[3], &own_b);
            tensor_free(&own_a), tensor_free(&own_b);
        }
        matmul_set_dtype(MATMUL_FLOAT32);
        EXPECT(differ == 0, "gemm_hold_rounded on the GPU with bfloat16 matmuls: the held operand as A and as B, twice with "
               "new values: each product's own rounding, bit for bit (%zu of %d differ)", differ, 2 * (23 * 19 + 19 * 31));
        Tensor *all[] = {&g, &x, &w, &gg, &gx, &gw, &c[0], &c[1], &c[2], &c[3]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    }

    Tensor x = tensor_zeros(300, 17, DEVICE_CPU), sums = tensor_zeros(1, 17, DEVICE_CPU);
    fill_uniform(&x, -1, 1), fill_uniform(&sums, -1, 1);
    Tensor gx = on_gpu(&x), gsums = on_gpu(&sums);
    add_sum_over_rows(&x, &sums);
    add_sum_over_rows(&gx, &gsums);
    double err = relative_error(&gsums, &sums);
    EXPECT(err < 1e-5, "add_sum_over_rows of [300, 17] (bias gradient, cuBLAS gemv): rel err %.1e", err);
    tensor_free(&x), tensor_free(&sums), tensor_free(&gx), tensor_free(&gsums);
}

// Two copies of one model, one per device, drawn from the same seed.
typedef struct {
    Mlp cpu, gpu;
} Twins;

static Twins twins(const int *sizes, int n_sizes, int batch, uint64_t seed) {
    Twins t;
    Rng rng;
    rng_seed(&rng, seed);
    t.cpu = mlp_new(sizes, n_sizes, batch, &rng, DEVICE_CPU);
    rng_seed(&rng, seed);
    t.gpu = mlp_new(sizes, n_sizes, batch, &rng, DEVICE_CUDA);
    return t;
}

static double worst_param_error(const Twins *t, bool grads) {
    double worst = 0;
    for (int i = 0; i < t->cpu.n_params; i++) {
        const Param *c = &t->cpu.params[i], *g = &t->gpu.params[i];
        worst = fmax(worst, relative_error(grads ? g->grad : g->value, grads ? c->grad : c->value));
    }
    return worst;
}

static void test_mlp_cross_entropy_adam(void) {
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES}, batch = 500;
    Twins t = twins(sizes, 3, batch, 7);
    EXPECT(params_checksum(t.cpu.params, t.cpu.n_params) == params_checksum(t.gpu.params, t.gpu.n_params),
           "the same seed draws bit-identical weights on either device (drawn on the host)");

    Tensor x = tensor_zeros(batch, MNIST_PIXELS, DEVICE_CPU);
    fill_uniform(&x, 0, 1);
    Tensor gx = on_gpu(&x);
    int labels[500];
    for (int r = 0; r < batch; r++) labels[r] = (int)rng_uniform(&data_rng, 0, 10) % 10;

    Adam adam_cpu = adam_new(t.cpu.params, t.cpu.n_params, 1e-3);
    Adam adam_gpu = adam_new(t.gpu.params, t.gpu.n_params, 1e-3);
    double worst_logits = 0, worst_loss = 0, worst_grad = 0;
    for (int step = 0; step < 5; step++) {
        mlp_zero_grad(&t.cpu), mlp_zero_grad(&t.gpu);
        const Tensor *logits_cpu = mlp_forward(&t.cpu, &x);
        const Tensor *logits_gpu = mlp_forward(&t.gpu, &gx);
        worst_logits = fmax(worst_logits, relative_error(logits_gpu, logits_cpu));
        float loss_cpu = mlp_loss(&t.cpu, labels), loss_gpu = mlp_loss(&t.gpu, labels);
        worst_loss = fmax(worst_loss, fabs(loss_gpu - loss_cpu) / loss_cpu);
        mlp_backward(&t.cpu, &x, NULL, NULL), mlp_backward(&t.gpu, &gx, NULL, NULL);
        worst_grad = fmax(worst_grad, worst_param_error(&t, true));
        // Adam divides by sqrt(v) + 1e-8: a gradient of 1e-8 that differs in
        // its last bits between cuBLAS and OpenBLAS moves its weight by a
        // different ~lr. So both optimizers get the CPU's gradients, and the
        // weights compare the Adam kernels, not the GEMMs' rounding.
        for (int i = 0; i < t.cpu.n_params; i++) tensor_copy(t.gpu.params[i].grad, t.cpu.params[i].grad);
        adam_step(&adam_cpu), adam_step(&adam_gpu);
    }
    EXPECT(worst_logits < 1e-4, "MLP 784-128-10 forward, 5 Adam steps: logits rel err %.1e", worst_logits);
    EXPECT(worst_loss < 1e-5, "cross-entropy loss (fused softmax kernel + fixed-order sum): rel err %.1e", worst_loss);
    EXPECT(worst_grad < 1e-4, "gradients of every parameter (bias + ReLU, GEMMs, gemv): rel err %.1e", worst_grad);
    double worst_weights = worst_param_error(&t, false);
    EXPECT(worst_weights < 1e-5, "weights after 5 Adam steps from the same gradients: rel err %.1e", worst_weights);

    double acc_cpu = mlp_accuracy(&t.cpu, &x, labels), acc_gpu = mlp_accuracy(&t.gpu, &gx, labels);
    EXPECT(fabs(acc_cpu - acc_gpu) <= 2.0 / batch, "mlp_accuracy (argmax kernel): %.3f on the CPU, %.3f on the GPU",
           acc_cpu, acc_gpu);

    // Gradient accumulation: (loss * 0.5).backward() twice is one backward.
    mlp_zero_grad(&t.cpu), mlp_zero_grad(&t.gpu);
    for (int twice = 0; twice < 2; twice++) {
        mlp_forward(&t.cpu, &x), mlp_forward(&t.gpu, &gx);
        mlp_loss(&t.cpu, labels), mlp_loss(&t.gpu, labels);
        mlp_scale_loss(&t.cpu, 0.5f), mlp_scale_loss(&t.gpu, 0.5f);
        mlp_backward(&t.cpu, &x, NULL, NULL), mlp_backward(&t.gpu, &gx, NULL, NULL);
    }
    double worst_accumulated = worst_param_error(&t, true);
    EXPECT(worst_accumulated < 1e-4, "mlp_scale_loss and accumulated gradients: rel err %.1e", worst_accumulated);

    // The loss into a slot on the GPU (the host never waits; mlp_loss_to): the host's arithmetic on
    // mlp_loss's value, bit for bit, written, then two weighted shares added (micro-batches').
    {
        mlp_forward(&t.gpu, &gx);
        float loss = mlp_loss(&t.gpu, labels), expected[2] = {loss, 0.0f};
        for (int share = 0; share < 2; share++) expected[1] += 0.25f * loss;
        Tensor slot = tensor_zeros(1, 1, DEVICE_CUDA);
        float got[2];
        mlp_loss_to(&t.gpu, labels, NULL, (LossSlot){.value = slot.data, .weight = 1.0f});
        tensor_to_host(&slot, &got[0]);
        tensor_fill(&slot, 0.0f);
        for (int share = 0; share < 2; share++)
            mlp_loss_to(&t.gpu, labels, NULL, (LossSlot){.value = slot.data, .weight = 0.25f, .accumulate = true});
        tensor_to_host(&slot, &got[1]);
        EXPECT(memcmp(got, expected, sizeof got) == 0,
               "the loss into a slot on the GPU: %.9g (mlp_loss: %.9g), two shares of a quarter added: %.9g (%.9g)",
               got[0], expected[0], got[1], expected[1]);
        tensor_free(&slot);
    }

    // A checkpoint written from the GPU loads into a CPU model bit for bit.
    h5_save_params("/tmp/test_gpu_weights.h5", t.gpu.params, t.gpu.n_params);
    Rng other;
    rng_seed(&other, 99);
    Mlp loaded = mlp_new(sizes, 3, batch, &other, DEVICE_CPU);
    h5_load_params("/tmp/test_gpu_weights.h5", loaded.params, loaded.n_params);
    EXPECT(params_checksum(loaded.params, loaded.n_params) == params_checksum(t.gpu.params, t.gpu.n_params),
           "h5_save_params from GPU tensors, h5_load_params into CPU ones: bit-identical");
    remove("/tmp/test_gpu_weights.h5");

    mlp_free(&loaded);
    adam_free(&adam_cpu), adam_free(&adam_gpu);
    mlp_free(&t.cpu), mlp_free(&t.gpu);
    tensor_free(&x), tensor_free(&gx);
}

// Each parameter's gradient (grads) or value of a GPU model against another's, bit for bit: how many
// values differ.
static size_t params_bits_differ(const Param *a, const Param *b, int n_params, bool grads) {
    size_t differ = 0;
    for (int i = 0; i < n_params; i++) {
        Tensor host = on_cpu(grads ? b[i].grad : b[i].value);
        differ += bits_differ(grads ? a[i].grad : a[i].value, &host);
        tensor_free(&host);
    }
    return differ;
}

// --dtype bfloat16 on the GPU: an MLP made under bfloat16 matmuls keeps its products' operands
// rounded by what writes them (its weights once a pass, the hidden outputs, the output gradients:
// nn.h), where one made under float32 has each product round its own. Both take the same steps bit
// for bit: the losses, gradients and weights of Adam steps; a step of two micro-batches, whose
// loss gradient mlp_scale_loss rescales after the loss kept its copy (which must be dropped); a
// loss read back (mlp_loss); the accuracy's forwards between steps. The kept model's batch comes with
// its own copy, as mnist_batch's does; the other's rows are rounded by each product.
static void test_mlp_kept_bfloat16(void) {
    enum { BATCH = 48, STEPS = 4, N_SIZES = 4 };
    const int sizes[N_SIZES] = {40, 24, 16, MNIST_CLASSES};
    Rng rng;
    rng_seed(&rng, 11);
    Mlp plain = mlp_new(sizes, N_SIZES, BATCH, &rng, DEVICE_CUDA);  // made under float32: no room for copies
    matmul_set_dtype(MATMUL_BFLOAT16);
    rng_seed(&rng, 11);
    Mlp kept = mlp_new(sizes, N_SIZES, BATCH, &rng, DEVICE_CUDA);
    int rooms = 0;
    for (int i = 0; i < kept.n_layers; i++)
        rooms += !!kept.layers[i].weight.bfloat16_room + !!kept.grad_outputs[i].bfloat16_room + !!kept.outputs[i].bfloat16_room;
    Tensor x = tensor_zeros(BATCH, sizes[0], DEVICE_CPU);
    fill_uniform(&x, -1, 1);
    Tensor gx = on_gpu(&x), slots = tensor_zeros(2, STEPS, DEVICE_CUDA);
    tensor_keep_bfloat16(&gx);
    Tensor *batch = &gx;
    tensors_round_bfloat16(&batch, 1);
    Tensor gx_plain = {.data = gx.data, .rows = gx.rows, .cols = gx.cols, .device = gx.device};  // without the copy
    Tensor *inputs[2] = {&gx_plain, &gx};
    int labels[BATCH];
    for (int r = 0; r < BATCH; r++) labels[r] = (int)rng_uniform(&data_rng, 0, 10) % 10;
    Mlp *models[2] = {&plain, &kept};
    Adam adams[2] = {adam_new(plain.params, plain.n_params, 1e-2), adam_new(kept.params, kept.n_params, 1e-2)};
    size_t grads_differ = 0, weights_differ = 0;
    int losses_differ = 0, accuracy_differs = 0, copies_wrong = 0;
    for (int step = 0; step < STEPS; step++) {
        float read_back[2] = {0, 0};
        for (int m = 0; m < 2; m++) {
            Mlp *model = models[m];
            LossSlot slot = {.value = slots.data + m * STEPS + step, .weight = 1.0f};
            mlp_zero_grad(model);
            if (step == 1) {  // two micro-batches, each loss's gradient halved after the loss kept it
                for (int half = 0; half < 2; half++) {
                    Tensor part = tensor_row_range(inputs[m], half * BATCH / 2, BATCH / 2);
                    mlp_forward(model, &part);
                    mlp_loss_to(model, labels + half * BATCH / 2, NULL, (LossSlot){slot.value, 0.5f, half == 1});
                    mlp_scale_loss(model, 0.5f);
                    mlp_backward(model, &part, NULL, NULL);
                }
            } else {
                mlp_forward(model, inputs[m]);
                if (m == 1)  // the hidden outputs kept, the weights' copies held for the backward
                    copies_wrong += kept.outputs[0].bfloat16_copy != kept.outputs[0].bfloat16_room ||
                                    kept.layers[2].weight.bfloat16_copy != kept.layers[2].weight.bfloat16_room;
                if (step == 2) read_back[m] = mlp_loss(model, labels);
                else mlp_loss_to(model, labels, NULL, slot);
                mlp_backward(model, inputs[m], NULL, NULL);
                if (m == 1) copies_wrong += kept.layers[0].weight.bfloat16_copy != NULL;  // forgotten: Adam writes next
            }
        }
        losses_differ += memcmp(&read_back[0], &read_back[1], sizeof(float)) != 0;
        grads_differ += params_bits_differ(plain.params, kept.params, plain.n_params, true);
        adam_step(&adams[0]), adam_step(&adams[1]);
        weights_differ += params_bits_differ(plain.params, kept.params, plain.n_params, false);
        accuracy_differs += mlp_accuracy(&plain, &gx_plain, labels) != mlp_accuracy(&kept, &gx, labels);
        copies_wrong += kept.layers[1].weight.bfloat16_copy != NULL;  // forgotten after the accuracy's forwards
    }
    Tensor host_slots = on_cpu(&slots);
    for (int step = 0; step < STEPS; step++) losses_differ += memcmp(&host_slots.data[step], &host_slots.data[STEPS + step], sizeof(float)) != 0;
    matmul_set_dtype(MATMUL_FLOAT32);
    EXPECT(rooms == 3 * kept.n_layers - 1 && copies_wrong == 0 && losses_differ == 0 && grads_differ == 0 &&
               weights_differ == 0 && accuracy_differs == 0,
           "an MLP %d-%d-%d-%d with bfloat16 matmuls on the GPU, its operands kept rounded by their writers (%d rooms "
           "of %d; %d copies not as nn.h says; its batch with a copy, as mnist_batch's), against one whose products round "
           "their own, %d Adam steps (one of two "
           "micro-batches, one loss read back): %d losses, %zu gradients, %zu weights and %d accuracies differ",
           sizes[0], sizes[1], sizes[2], sizes[3], rooms, 3 * kept.n_layers - 1, copies_wrong, STEPS, losses_differ,
           grads_differ, weights_differ, accuracy_differs);
    adam_free(&adams[0]), adam_free(&adams[1]);
    mlp_free(&plain), mlp_free(&kept);
    tensor_free(&x), tensor_free(&gx), tensor_free(&slots), tensor_free(&host_slots);
}

// adam_step_decayed on a GPU updates every tensor in one launch (blocks of 2,048 values, a block
// finding its tensor): each value's bits those of a launch per tensor, tensor_scale then
// adam_update, on the GPU, with the coefficients the step used (read back). Sizes below, at and
// above a block's values, some tensors decaying; before the last step one tensor moves (a new
// buffer), and the launch must follow it.
static void test_adam_one_launch(void) {
    enum { N = 5, STEPS = 3 };
    const int rows[N] = {1, 1, 2, 1, 7}, cols[N] = {1, 2047, 1024, 2049, 1000};
    const bool decays[N] = {false, true, false, true, true};
    Tensor values[2][N], grads[2][N], initial[N];
    Param params[2][N];
    for (int i = 0; i < N; i++) {
        initial[i] = tensor_zeros(rows[i], cols[i], DEVICE_CPU);
        fill_uniform(&initial[i], -1, 1);
        for (int k = 0; k < 2; k++) {
            values[k][i] = on_gpu(&initial[i]), grads[k][i] = tensor_zeros(rows[i], cols[i], DEVICE_CUDA);
            params[k][i] = (Param){.value = &values[k][i], .grad = &grads[k][i]};
        }
    }
    Adam one = adam_new(params[0], N, 1e-2), each = adam_new(params[1], N, 1e-2);
    const float keep = 0.999f;
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < N; i++) {
            Tensor host = tensor_zeros(rows[i], cols[i], DEVICE_CPU);
            fill_uniform(&host, -1, 1);
            tensor_copy(&grads[0][i], &host), tensor_copy(&grads[1][i], &host);
            tensor_free(&host);
        }
        if (step == STEPS - 1) {  // tensor 3 moves to a new buffer
            Tensor moved = on_gpu(&values[0][3]);
            tensor_free(&values[0][3]);
            values[0][3] = moved;
        }
        adam_step_decayed(&one, decays, keep);
        AdamCoefficients used;  // (six floats: tensor_ops.h)
        Tensor coefficients = {.data = (float *)one.device_coefficients, .rows = 1, .cols = 6, .device = DEVICE_CUDA};
        tensor_to_host(&coefficients, (float *)&used);
        for (int i = 0; i < N; i++) {
            if (decays[i]) tensor_scale(&values[1][i], keep);
            adam_update(&values[1][i], &grads[1][i], &each.exp_avg[i], &each.exp_avg_sq[i], &used);
        }
    }
    size_t differ = 0, total = 0, changed = 0;
    for (int i = 0; i < N; i++) {
        Tensor reference = on_cpu(&values[1][i]);
        differ += bits_differ(&values[0][i], &reference);
        Tensor m = on_cpu(&each.exp_avg[i]), v = on_cpu(&each.exp_avg_sq[i]);
        differ += bits_differ(&one.exp_avg[i], &m) + bits_differ(&one.exp_avg_sq[i], &v);
        total += 3 * tensor_numel(&reference);
        changed += bits_differ(&values[0][i], &initial[i]);  // (every weight moves)
        tensor_free(&reference), tensor_free(&m), tensor_free(&v), tensor_free(&initial[i]);
    }
    EXPECT(differ == 0 && changed == total / 3,
           "Adam on a GPU, %d tensors of 1 to 7,000 values in one launch, 3 of them decaying (AdamW), %d steps, one "
           "tensor moved before the last: the weights and both moments of a launch per tensor, bit for bit (%zu of "
           "%zu differ; %zu of %zu weights moved)", N, STEPS, differ, total, changed, total / 3);
    adam_free(&one), adam_free(&each);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N; i++) tensor_free(&values[k][i]), tensor_free(&grads[k][i]);
}

// tensors_fill on a GPU: many tensors in one launch (a model's zero_grad), each value set, nothing
// past a tensor's end touched; lists of tensors taken in turn, more of them than the GPU keeps
// tables for, each filled right whenever it comes back.
static void test_tensors_fill(void) {
    enum { N = 6, MEMBERS = 3, LISTS = 6, ROUNDS = 2 };
    const int cols[N] = {1, 2047, 2048, 2049, 7000, 3};
    Tensor t[N];
    for (int i = 0; i < N; i++) t[i] = tensor_zeros(1, cols[i] + 1, DEVICE_CUDA);  // a guard value past the view
    size_t wrong = 0, checked = 0;
    for (int round = 0; round < ROUNDS; round++)
        for (int list = 0; list < LISTS; list++) {
            // List `list`: MEMBERS tensors from `list` on (round the end), as views one shorter than
            // the tensors: lists of one length, which only their tensors tell apart.
            Tensor views[MEMBERS], *members[MEMBERS];
            for (int k = 0; k < MEMBERS; k++) views[k] = t[(list + k) % N], views[k].cols--, members[k] = &views[k];
            for (int i = 0; i < N; i++) tensor_fill(&t[i], -1.0f);
            const float value = (float)(list + 10 * round) + 0.5f;
            tensors_fill(members, MEMBERS, value);
            for (int i = 0; i < N; i++) {
                Tensor host = on_cpu(&t[i]);
                for (int c = 0; c <= cols[i]; c++) {
                    const bool member = (i - list % N + N) % N < MEMBERS && c < cols[i];
                    wrong += host.data[c] != (member ? value : -1.0f), checked++;
                }
                tensor_free(&host);
            }
        }
    EXPECT(wrong == 0, "tensors_fill on a GPU: %d lists of %d tensors of 1 to 7,000 values, each in one launch, twice "
           "over (more lists than the GPU keeps tables for): every value set, the one past each view kept (%zu of "
           "%zu wrong)", LISTS, MEMBERS, wrong, checked);
#if HAVE_CUDA
    // A list filled once, then again inside a CUDA graph's capture (a model's zero_grad in a captured
    // step): its table is on the GPU already, and the graph's launches fill it.
    Tensor *all[N];
    for (int i = 0; i < N; i++) all[i] = &t[i];
    tensors_fill(all, N, 1.0f);
    device_graph_begin();
    tensors_fill(all, N, 7.0f);
    DeviceGraph *graph = device_graph_end();
    size_t captured_wrong = 0;
    for (int launch = 0; launch < 2; launch++) {
        for (int i = 0; i < N; i++) tensor_fill(&t[i], -1.0f);
        device_graph_launch(graph);
        for (int i = 0; i < N; i++) {
            Tensor host = on_cpu(&t[i]);
            for (int c = 0; c <= cols[i]; c++) captured_wrong += host.data[c] != 7.0f;
            tensor_free(&host);
        }
    }
    device_graph_free(graph);
    EXPECT(captured_wrong == 0, "tensors_fill inside a CUDA graph's capture, its list sent before: each launch of "
           "the graph fills every value (%zu wrong)", captured_wrong);
    // Lists enough to push that one out of the tables kept: its table's buffer must be a new one, which
    // device_buffer_moves counts (a graph that holds the old address is then captured again:
    // step_graph.h), not the old buffer rewritten under the graph.
    long moves = device_buffer_moves();
    for (int list = 0; list < 4; list++) {
        Tensor view = t[list], *member = &view;
        view.cols = 1 + list;
        tensors_fill(&member, 1, 0.0f);
    }
    EXPECT(device_buffer_moves() > moves, "tensors_fill: a list's table pushed out by others is a new buffer, not the "
           "old one rewritten under a graph that holds it (device_buffer_moves %ld, then %ld)", moves,
           device_buffer_moves());
#endif
    for (int i = 0; i < N; i++) tensor_free(&t[i]);
}

#if HAVE_CUDA
// device.h's DeviceTable, under Adam's one launch, zero_grad's and the gradients' norm: a table the
// GPU holds already is not sent again (the same buffer, nothing moved); a changed one goes to a new
// buffer (device_buffer_moves counts it: a graph that read the old one is captured again) and holds
// the new values; a table of nothing is a buffer all the same.
static void test_device_table(void) {
    enum { N = 300 };
    float a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = (float)i, b[i] = (float)(N - i);
    DeviceTable table = {0};
    const void *first = device_table_send(&table, a, sizeof a, "test a");
    long moves = device_buffer_moves();
    const void *again = device_table_send(&table, a, sizeof a, "test a");
    bool kept = again == first && device_buffer_moves() == moves && device_table_holds(&table, a, sizeof a) &&
                !device_table_holds(&table, b, sizeof b) && !device_table_holds(&table, a, sizeof a - sizeof(float));
    const void *changed = device_table_send(&table, b, sizeof b, "test b");
    bool moved = device_buffer_moves() > moves && device_table_holds(&table, b, sizeof b) && !device_table_holds(&table, a, sizeof a);
    Tensor view = {.data = (float *)changed, .rows = 1, .cols = N, .device = DEVICE_CUDA};
    Tensor host = on_cpu(&view);
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += host.data[i] != b[i];
    tensor_free(&host);
    DeviceTable empty = {0};
    bool none = device_table_send(&empty, a, 0, "test empty") != NULL && device_table_holds(&empty, b, 0);
    device_table_free(&table), device_table_free(&empty);
    EXPECT(kept && moved && wrong == 0 && none && !table.device.data,
           "DeviceTable: sent once while it holds the same bytes (%s), a change to a new buffer with the new values "
           "(%s, %d of %d wrong), an empty table (%s)", kept ? "yes" : "no", moved ? "yes" : "no", wrong, N,
           none ? "yes" : "no");
}
#endif

static void test_mlp_mse_sgd(void) {
    const int sizes[] = {64, 96, 32}, batch = 40;
    Twins t = twins(sizes, 3, batch, 11);
    Tensor x = tensor_zeros(batch, 64, DEVICE_CPU), target = tensor_zeros(batch, 32, DEVICE_CPU);
    fill_uniform(&x, -2, 2), fill_uniform(&target, -1, 1);
    Tensor gx = on_gpu(&x), gtarget = on_gpu(&target);
    double worst_loss = 0;
    for (int step = 0; step < 3; step++) {
        mlp_zero_grad(&t.cpu), mlp_zero_grad(&t.gpu);
        mlp_forward(&t.cpu, &x), mlp_forward(&t.gpu, &gx);
        float loss_cpu = mlp_mse_loss(&t.cpu, &target), loss_gpu = mlp_mse_loss(&t.gpu, &gtarget);
        worst_loss = fmax(worst_loss, fabs(loss_gpu - loss_cpu) / loss_cpu);
        mlp_backward(&t.cpu, &x, NULL, NULL), mlp_backward(&t.gpu, &gx, NULL, NULL);
        sgd_step(t.cpu.params, t.cpu.n_params, 0.01), sgd_step(t.gpu.params, t.gpu.n_params, 0.01);
    }
    EXPECT(worst_loss < 1e-5, "MSE loss (test_profile's), 3 SGD steps: rel err %.1e", worst_loss);
    double worst_weights = worst_param_error(&t, false);
    EXPECT(worst_weights < 1e-5, "weights after 3 SGD steps: rel err %.1e", worst_weights);
    mlp_free(&t.cpu), mlp_free(&t.gpu);
    tensor_free(&x), tensor_free(&target), tensor_free(&gx), tensor_free(&gtarget);
}

// How many of the last mnist_batch's labels on the GPU differ from `want` (the host's).
static int device_labels_differ(const MnistSplit *split, const int *want, int rows) {
    const int *device = mnist_batch_device_labels(split);
    if (!device) return rows;
    Tensor view = {.data = (float *)device, .rows = 1, .cols = rows, .device = DEVICE_CUDA};  // (the ints' bits)
    Tensor host = on_cpu(&view);
    int differ = 0;
    for (int r = 0; r < rows; r++) differ += memcmp(&host.data[r], &want[r], sizeof(int)) != 0;
    tensor_free(&host);
    return differ;
}

static void test_gather(void) {
    // A small data set of random pixels: the GPU gathers from its uint8 copy.
    MnistSplit split = {.n = 50};
    split.images = xmalloc((size_t)split.n * MNIST_PIXELS);
    split.labels = xmalloc((size_t)split.n * sizeof(int));
    for (size_t i = 0; i < (size_t)split.n * MNIST_PIXELS; i++)
        split.images[i] = (uint8_t)((int)rng_uniform(&data_rng, 0, 256) & 255);
    for (int i = 0; i < split.n; i++) split.labels[i] = i % 10;
    DistributedSampler sampler = sampler_new(split.n, 1, 0, true, 3);
    Tensor cpu_buffer = tensor_zeros(16, MNIST_PIXELS, DEVICE_CPU);
    Tensor gpu_buffer = tensor_zeros(16, MNIST_PIXELS, DEVICE_CUDA);
    int labels_cpu[16], labels_gpu[16];
    size_t differ = 0, wrong_labels = 0;
    for (int b = 0; b < sampler_num_batches(&sampler, 16); b++) {  // 16, 16, 16 and a partial 2
        Tensor xc = mnist_batch(&split, &sampler, b, 16, &cpu_buffer, labels_cpu);
        Tensor xg = mnist_batch(&split, &sampler, b, 16, &gpu_buffer, labels_gpu);
        differ += bits_differ(&xg, &xc) + (size_t)(xg.rows != xc.rows);
        for (int r = 0; r < xc.rows; r++) wrong_labels += labels_cpu[r] != labels_gpu[r];
        wrong_labels += (size_t)device_labels_differ(&split, labels_cpu, xc.rows);
    }
    EXPECT(differ == 0 && wrong_labels == 0,
           "mnist_batch gathered on the GPU (uint8 / 255) equals the CPU's bit for bit: %zu pixels, %zu labels differ",
           differ, wrong_labels);

    // With bfloat16 products the gather also writes the batch rounded (Tensor's bfloat16_copy), which
    // gemm reads where it would round the batch itself: the copy holds round_to_bfloat16's bits, the
    // products from it are those of the batch rounded by gemm, and gemm reads it (a copy of zeros
    // gives zeros).
    matmul_set_dtype(MATMUL_BFLOAT16);
    Tensor w = tensor_zeros(10, MNIST_PIXELS, DEVICE_CPU);
    fill_uniform(&w, -1, 1);
    Tensor gw = on_gpu(&w), from_copy = tensor_zeros(16, 10, DEVICE_CUDA), rounding = tensor_zeros(16, 10, DEVICE_CUDA);
    Tensor zeros = tensor_zeros(8, MNIST_PIXELS, DEVICE_CUDA);  // as many bytes as 16 rows of bfloat16
    size_t wrong_copy = 0, wrong_product = 0, missing = 0;
    int not_zero = 0;
    for (int b = 0; b < sampler_num_batches(&sampler, 16); b++) {
        Tensor xc = mnist_batch(&split, &sampler, b, 16, &cpu_buffer, labels_cpu);
        Tensor xg = mnist_batch(&split, &sampler, b, 16, &gpu_buffer, labels_gpu);
        for (int r = 0; r < xc.rows; r++) wrong_labels += labels_cpu[r] != labels_gpu[r];
        wrong_labels += (size_t)device_labels_differ(&split, labels_cpu, xc.rows);
        if (!xg.bfloat16_copy) {
            missing++;
            continue;
        }
        // The copy's bits, two bfloat16 values a float, through a float view of its buffer.
        Tensor pairs = {.data = (float *)xg.bfloat16_copy, .rows = xg.rows, .cols = MNIST_PIXELS / 2, .device = DEVICE_CUDA};
        Tensor host_pairs = on_cpu(&pairs);
        const uint16_t *bits = (const uint16_t *)host_pairs.data;
        for (size_t i = 0; i < tensor_numel(&xc); i++) {
            float want = round_to_bfloat16(xc.data[i]);
            uint32_t want_bits;
            memcpy(&want_bits, &want, sizeof want_bits);
            wrong_copy += bits[i] != (uint16_t)(want_bits >> 16);
        }
        tensor_free(&host_pairs);
        Tensor plain = {.data = xg.data, .rows = xg.rows, .cols = xg.cols, .device = xg.device};  // rounded by gemm
        from_copy.rows = rounding.rows = xg.rows;
        gemm(false, true, 1.0f, &xg, &gw, 0.0f, &from_copy);
        gemm(false, true, 1.0f, &plain, &gw, 0.0f, &rounding);
        Tensor want_product = on_cpu(&rounding);
        wrong_product += bits_differ(&from_copy, &want_product);
        tensor_free(&want_product);
        if (xg.rows > 8) {  // rows 3 to 8 through tensor_row_range, its copy from row 3 on too
            Tensor rows = tensor_row_range(&xg, 3, 5), plain_rows = tensor_row_range(&plain, 3, 5);
            from_copy.rows = rounding.rows = 5;
            gemm(false, true, 1.0f, &rows, &gw, 0.0f, &from_copy);
            gemm(false, true, 1.0f, &plain_rows, &gw, 0.0f, &rounding);
            want_product = on_cpu(&rounding);
            wrong_product += bits_differ(&from_copy, &want_product) + (rows.bfloat16_copy != xg.bfloat16_copy + 3 * MNIST_PIXELS);
            tensor_free(&want_product);
            from_copy.rows = rounding.rows = xg.rows;
        }
        Tensor of_zeros = xg;
        of_zeros.bfloat16_copy = (const uint16_t *)zeros.data;
        gemm(false, true, 1.0f, &of_zeros, &gw, 0.0f, &from_copy);
        Tensor host = on_cpu(&from_copy);
        for (size_t i = 0; i < tensor_numel(&host); i++) not_zero += host.data[i] != 0.0f;
        tensor_free(&host);
    }
    matmul_set_dtype(MATMUL_FLOAT32);
    EXPECT(missing == 0 && wrong_copy == 0 && wrong_product == 0 && not_zero == 0 && wrong_labels == 0,
           "mnist_batch on the GPU with bfloat16 products: the batch rounded in the gather (%zu batches without), "
           "round_to_bfloat16's bits (%zu differ), gemm's products from it (and from rows 3 to 8 of it: tensor_row_range) "
           "those of the batch it rounds itself (%zu differ) and read from it (%d of a copy of zeros not zero), the labels in the same launch (%zu differ)",
           missing, wrong_copy, wrong_product, not_zero, wrong_labels);
    Tensor *all[] = {&w, &gw, &from_copy, &rounding, &zeros};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    tensor_free(&cpu_buffer), tensor_free(&gpu_buffer);
    sampler_free(&sampler);
    mnist_free(&split);
#if HAVE_CUDA
    // gpu_gather_batch itself on rows of 6 pixels (not in fours: a launch for each output) and of 8
    // (fours, one launch), every output asked for: the pixels, their rounding, the labels.
    enum { SAMPLES = 9, ROWS = 5 };
    const int indices[ROWS] = {4, 0, 8, 4, 2};
    int gather_wrong = 0;
    for (int pixels = 6; pixels <= 8; pixels += 2) {
        uint8_t images[SAMPLES * 8];
        int labels[SAMPLES], got_labels[ROWS];
        float got[ROWS * 8];
        uint16_t got_rounded[ROWS * 8];
        for (int i = 0; i < SAMPLES * pixels; i++) images[i] = (uint8_t)((37 * i + 11) & 255);
        for (int i = 0; i < SAMPLES; i++) labels[i] = 100 + i;
        uint8_t *d_images = device_alloc(sizeof images);
        int *d_labels = device_alloc(sizeof labels), *d_indices = device_alloc(sizeof indices);
        int *d_out_labels = device_alloc(sizeof got_labels);
        float *d_out = device_alloc(sizeof got);
        uint16_t *d_rounded = device_alloc(sizeof got_rounded);
        device_upload(d_images, images, sizeof images, "test images");
        device_upload(d_labels, labels, sizeof labels, "test labels");
        device_upload(d_indices, indices, sizeof indices, "test indices");
        gpu_gather_batch(d_images, d_labels, d_indices, ROWS, pixels, d_out, d_rounded, d_out_labels, device_stream());
        device_read_to_host(got, d_out, sizeof got, "test pixels");
        device_read_to_host(got_rounded, d_rounded, sizeof got_rounded, "test rounding");
        device_read_to_host(got_labels, d_out_labels, sizeof got_labels, "test labels");
        for (int r = 0; r < ROWS; r++) {
            gather_wrong += got_labels[r] != labels[indices[r]];
            for (int p = 0; p < pixels; p++) {
                float want = (float)images[indices[r] * pixels + p] / 255.0f, rounded = round_to_bfloat16(want);
                uint32_t bits;
                memcpy(&bits, &rounded, sizeof bits);
                gather_wrong += got[r * pixels + p] != want;
                gather_wrong += got_rounded[r * pixels + p] != (uint16_t)(bits >> 16);
            }
        }
        device_free(d_images), device_free(d_labels), device_free(d_indices), device_free(d_out_labels);
        device_free(d_out), device_free(d_rounded);
    }
    EXPECT(gather_wrong == 0, "gpu_gather_batch on rows of 6 pixels (a launch each: pixels, rounding, labels) and of "
           "8 (in fours, one launch): %d of %d values wrong", gather_wrong, ROWS * (6 * 2 + 1) + ROWS * (8 * 2 + 1));
#endif
}

// Step 14's tensor operations: the copies, pooling, reordering and per-row
// bias are bit for bit (the same arithmetic; col2im adds in the same order on
// both), the sums of rows to a relative tolerance (their order differs).
static void test_cnn_ops(void) {
    ConvGeometry g = {.channels = 3, .batch = 5, .height = 14, .width = 13, .kernel = 3, .padding = 1};
    int rows = g.channels * 9, positions = g.batch * conv_out_height(&g) * conv_out_width(&g);
    Tensor x = tensor_zeros(g.channels, g.batch * g.height * g.width, DEVICE_CPU);
    Tensor columns = tensor_zeros(rows, positions, DEVICE_CPU), back = tensor_zeros(x.rows, x.cols, DEVICE_CPU);
    fill_uniform(&x, -1, 1);
    Tensor gx = on_gpu(&x), gcolumns = on_gpu(&columns), gback = on_gpu(&back);
    im2col(&x, &g, &columns), im2col(&gx, &g, &gcolumns);
    col2im(&columns, &g, &back), col2im(&gcolumns, &g, &gback);
    EXPECT(bits_differ(&gcolumns, &columns) == 0 && bits_differ(&gback, &back) == 0,
           "im2col and col2im of 5 images 3 x 14 x 13 (3x3, padding 1): bit-identical");

    Tensor bias = tensor_zeros(1, rows, DEVICE_CPU), sums = tensor_zeros(1, rows, DEVICE_CPU);
    fill_uniform(&bias, -0.5f, 0.5f), fill_uniform(&sums, -1, 1);
    Tensor gbias = on_gpu(&bias), gsums = on_gpu(&sums);
    add_row_bias(&columns, &bias, true), add_row_bias(&gcolumns, &gbias, true);
    EXPECT(bits_differ(&gcolumns, &columns) == 0, "add_row_bias with ReLU: bit-identical");
    add_sum_of_rows(&columns, &sums), add_sum_of_rows(&gcolumns, &gsums);
    double err = relative_error(&gsums, &sums);
    EXPECT(err < 1e-6, "add_sum_of_rows of [%d, %d] (a conv's bias gradient): rel err %.1e", rows, positions, err);

    // Pooling 2x2 of 15 planes of 14 x 13 (the last column dropped), with ties from the ReLU's zeros.
    int planes = g.channels * g.batch;
    Tensor pooled = tensor_zeros(planes, 7 * 6, DEVICE_CPU), grad_x = tensor_zeros(x.rows, x.cols, DEVICE_CPU);
    Tensor relu_x = tensor_zeros(x.rows, x.cols, DEVICE_CPU);
    tensor_copy(&relu_x, &x);
    for (size_t i = 0; i < tensor_numel(&relu_x); i++) relu_x.data[i] = fmaxf(relu_x.data[i], 0);
    Tensor grelu_x = on_gpu(&relu_x), gpooled = on_gpu(&pooled), ggrad_x = on_gpu(&grad_x);
    IntBuffer argmax = int_buffer_new(tensor_numel(&pooled), DEVICE_CPU);
    IntBuffer gargmax = int_buffer_new(tensor_numel(&pooled), DEVICE_CUDA);
    max_pool2d(&relu_x, 14, 13, 2, &pooled, &argmax), max_pool2d(&grelu_x, 14, 13, 2, &gpooled, &gargmax);
    EXPECT(bits_differ(&gpooled, &pooled) == 0, "max_pool2d: the same maxima");
    // Distinct gradients land where each device's argmax says: the same
    // places (the first maximum on ties) iff the results are bit-identical.
    Tensor grad_pooled = tensor_zeros(pooled.rows, pooled.cols, DEVICE_CPU);
    for (size_t i = 0; i < tensor_numel(&grad_pooled); i++) grad_pooled.data[i] = 1.0f + (float)i;
    Tensor ggrad_pooled = on_gpu(&grad_pooled);
    max_pool2d_backward(&grad_pooled, &argmax, &grad_x), max_pool2d_backward(&ggrad_pooled, &gargmax, &ggrad_x);
    EXPECT(bits_differ(&ggrad_x, &grad_x) == 0, "max_pool2d_backward: bit-identical, so the same argmax");

    Tensor swapped = tensor_zeros(g.batch, g.channels * g.height * g.width, DEVICE_CPU), gswapped = on_gpu(&swapped);
    swap_outer_axes(&x, g.channels, g.batch, g.height * g.width, &swapped);
    swap_outer_axes(&gx, g.channels, g.batch, g.height * g.width, &gswapped);
    EXPECT(bits_differ(&gswapped, &swapped) == 0, "swap_outer_axes (Flatten): bit-identical");

    int_buffer_free(&argmax), int_buffer_free(&gargmax);
    Tensor *all[] = {&x, &columns, &back, &gx, &gcolumns, &gback, &bias, &sums, &gbias, &gsums, &pooled, &grad_x,
                     &relu_x, &grelu_x, &gpooled, &ggrad_x, &grad_pooled, &ggrad_pooled, &swapped, &gswapped};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
}

#if HAVE_CUDA
// add_sum_of_rows, a conv's bias gradient, on the GPU: each row cut into
// chunks (kernels.h), a block per chunk, then each row's chunk sums in order.
// Shapes that take one chunk (rows of 1 value, of a full chunk), several (the
// last one shorter, of 1 value, or full), the most chunks (rows past it get
// longer chunks), step 14's two layers (32 rows of 64 x 784, 64 of 64 x 196),
// and a single row. Each against the CPU, and twice on the GPU from the same
// sums: the same bits (no atomics; a real GPU would show a race here).
static void test_sum_of_rows(void) {
    static const int shapes[][2] = {{1, 1},      {300, 1},   {7, 2048},  {27, 910},   {3, 4096},   {1, 2049},
                                    {5, 6149},   {32, 50176}, {64, 12544}, {1, 131072}, {1, 131073}, {2, 200003}};
    bool one_chunk = false, several = false, most = false;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], cols = shapes[s][1], chunks = gpu_row_sum_chunks(cols);
        one_chunk |= chunks == 1, several |= chunks > 1;
        most |= chunks > 1 && gpu_row_sum_chunks(2 * cols) == chunks;  // doubling the row adds no chunk
        Tensor x = tensor_zeros(rows, cols, DEVICE_CPU), sums = tensor_zeros(1, rows, DEVICE_CPU);
        fill_uniform(&x, -1, 1), fill_uniform(&sums, -1, 1);
        Tensor gx = on_gpu(&x), gsums = on_gpu(&sums), gsums_again = on_gpu(&sums);
        add_sum_of_rows(&x, &sums);
        add_sum_of_rows(&gx, &gsums), add_sum_of_rows(&gx, &gsums_again);
        double err = relative_error(&gsums, &sums);
        Tensor again = on_cpu(&gsums_again);
        size_t differ = bits_differ(&gsums, &again);
        EXPECT(err < 1e-6 && differ == 0,
               "add_sum_of_rows of [%d, %d] on the GPU (%d chunk%s): rel err %.1e; run twice, %zu sums differ", rows,
               cols, chunks, chunks == 1 ? "" : "s", err, differ);
        Tensor *all[] = {&x, &sums, &gx, &gsums, &gsums_again, &again};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    }
    EXPECT(one_chunk && several && most, "add_sum_of_rows's shapes take one chunk (%s), several (%s) and the most (%s)",
           one_chunk ? "yes" : "no", several ? "yes" : "no", most ? "yes" : "no");
}
#endif

// SimpleCNN on both devices from the same seed: logits, loss, every gradient,
// then Adam from the CPU's gradients (see test_mlp_cross_entropy_adam), and
// the evaluation's predictions.
static void test_cnn_model(void) {
    enum { BATCH = 64 };
    Rng rng;
    rng_seed(&rng, 0);
    Cnn *cpu = cnn_new(BATCH, &rng, DEVICE_CPU);
    rng_seed(&rng, 0);
    Cnn *gpu = cnn_new(BATCH, &rng, DEVICE_CUDA);
    Tensor x = tensor_zeros(BATCH, MNIST_PIXELS, DEVICE_CPU);
    fill_uniform(&x, 0, 1);
    Tensor gx = on_gpu(&x);
    int labels[BATCH];
    for (int r = 0; r < BATCH; r++) labels[r] = (int)rng_uniform(&data_rng, 0, 10) % 10;
    Adam adam_cpu = adam_new(cpu->params, cpu->n_params, 1e-3), adam_gpu = adam_new(gpu->params, gpu->n_params, 1e-3);
    double worst_logits = 0, worst_loss = 0, worst_grad = 0, worst_weights = 0;
    for (int step = 0; step < 3; step++) {
        cnn_zero_grad(cpu), cnn_zero_grad(gpu);
        worst_logits = fmax(worst_logits, relative_error(cnn_forward(gpu, &gx), cnn_forward(cpu, &x)));
        float loss_cpu = cnn_loss(cpu, labels), loss_gpu = cnn_loss(gpu, labels);
        worst_loss = fmax(worst_loss, fabs(loss_gpu - loss_cpu) / loss_cpu);
        cnn_backward(cpu, NULL, NULL), cnn_backward(gpu, NULL, NULL);
        for (int i = 0; i < cpu->n_params; i++) {
            worst_grad = fmax(worst_grad, relative_error(gpu->params[i].grad, cpu->params[i].grad));
            tensor_copy(gpu->params[i].grad, cpu->params[i].grad);
        }
        adam_step(&adam_cpu), adam_step(&adam_gpu);
    }
    for (int i = 0; i < cpu->n_params; i++)
        worst_weights = fmax(worst_weights, relative_error(gpu->params[i].value, cpu->params[i].value));
    EXPECT(worst_logits < 1e-4, "SimpleCNN forward at batch 64 (im2col + cuBLAS, pooling, Linear), 3 steps: logits rel err %.1e", worst_logits);
    EXPECT(worst_loss < 1e-5, "SimpleCNN cross-entropy: rel err %.1e", worst_loss);
    EXPECT(worst_grad < 1e-4, "SimpleCNN gradients of every parameter (col2im, pooling and ReLU backward, row sums): rel err %.1e", worst_grad);
    EXPECT(worst_weights < 1e-5, "SimpleCNN weights after 3 Adam steps from the same gradients: rel err %.1e", worst_weights);

    int predictions_cpu[BATCH], predictions_gpu[BATCH], same = 0;
    double sum_cpu = cnn_evaluate(cpu, &x, labels, predictions_cpu), sum_gpu = cnn_evaluate(gpu, &gx, labels, predictions_gpu);
    for (int r = 0; r < BATCH; r++) same += predictions_cpu[r] == predictions_gpu[r];
    EXPECT(same >= BATCH - 1 && fabs(sum_gpu - sum_cpu) <= 1e-5 * sum_cpu,
           "cnn_evaluate: %d of %d predictions equal, loss sums %.6f and %.6f", same, BATCH, sum_cpu, sum_gpu);
    adam_free(&adam_cpu), adam_free(&adam_gpu);
    cnn_free(cpu), cnn_free(gpu);
    tensor_free(&x), tensor_free(&gx);
}

// The n samples of a batch into device memory, `at` entries into each buffer (a build without CUDA
// runs no GPU test: nothing to copy).
static void upload_batch(int *device_user, int *device_item, float *device_rating, int at, const int *user,
                         const int *item, const float *rating, int n) {
#if HAVE_CUDA
    if (n == 0) return;
    device_upload(device_user + at, user, (size_t)n * sizeof(int), "the batch's users");
    device_upload(device_item + at, item, (size_t)n * sizeof(int), "the batch's items");
    device_upload(device_rating + at, rating, (size_t)n * sizeof(float), "the batch's ratings");
#else
    (void)device_user, (void)device_item, (void)device_rating, (void)at, (void)user, (void)item, (void)rating, (void)n;
#endif
}

// Whether a GPU model's queue of steps' inputs (mf.c's queue_inputs) holds `count`, `taken` of them
// by the steps prepared so far.
static bool queue_is(const Mf *model, int count, int taken) {
#if HAVE_CUDA
    return model->queued_inputs && model->queued_inputs->count == count && model->queued_inputs->next == taken;
#else
    (void)model, (void)count, (void)taken;
    return false;
#endif
}

// One training step of step 15's model, in mf.h's order.
static void mf_train_step(Mf *model, const RatingBatch *batch) {
    mf_prepare_step(model, batch);
    mf_lookup(model, batch);
    mf_forward_backward(model, batch);
    mf_exchange_gradients(model);
    mf_adam_step(model);
    mf_end_step(model);
}

// A GPU model's losses after `step` of `steps`: none handed over until the last, then every step's,
// each the CPU's bits. The number of differences.
static int gpu_losses_differ(Mf *model, int step, int steps, const double *cpu_losses) {
    const double *losses;
    int taken = mf_take_losses(model, step == steps - 1, &losses), differ = taken != (step == steps - 1 ? steps : 0);
    for (int k = 0; k < taken && taken == steps; k++) differ += memcmp(&losses[k], &cpu_losses[k], sizeof(double)) != 0;
    return differ;
}

// Step 15's model (mf.c) in each --embeddings mode: the GPU takes the CPU's
// steps bit for bit (the kernels keep the CPU's order and roundings), from
// batches that touch rows many times, and one empty slice (a rank past the
// data's end); then the predictions and the whole tables are the CPU's. Two
// GPU models: one given each batch's ids on the host (copied to the GPU), one
// given them on the GPU, at a place that moves from step to step, as step 15's
// epochs on the GPU are (the sorts and the forward read them where the step's
// inputs say: SortGroups.keys_at, MfSamples.take). A fourth is given them as an
// epoch's, one batch after the other, each saying how many follow it: the steps'
// inputs go to the GPU for all the batches at once and each step takes its own
// (mf_prepare_step, RatingBatch.following); the losses handed over after step 3
// make the next step queue its own and its followers' again, as a new epoch does.
static void test_mf(void) {
    enum { USERS = 37, ITEMS = 53, DIM = 8, BATCH = 96, STEPS = 6, HANDED_AT = 2 };
    int user[BATCH], item[BATCH];
    float rating[BATCH], predicted_cpu[BATCH], predicted_gpu[BATCH];
    int *resident_user = device_alloc(2 * BATCH * sizeof(int)), *resident_item = device_alloc(2 * BATCH * sizeof(int));
    float *resident_rating = device_alloc(2 * BATCH * sizeof(float));
    int *epoch_user = device_alloc(STEPS * BATCH * sizeof(int)), *epoch_item = device_alloc(STEPS * BATCH * sizeof(int));
    float *epoch_rating = device_alloc(STEPS * BATCH * sizeof(float));
    for (int m = EMBEDDINGS_DENSE; m <= EMBEDDINGS_SHARDED; m++) {
        EmbeddingsMode mode = (EmbeddingsMode)m;
        Rng init_cpu, init_gpu, init_resident, init_queued, batches;
        rng_seed(&init_cpu, 7), rng_seed(&init_gpu, 7), rng_seed(&init_resident, 7), rng_seed(&init_queued, 7);
        rng_seed(&batches, 11);
        Mf *cpu = mf_new(mode, DEVICE_CPU, USERS, ITEMS, DIM, 3.5f, 0.01, 0.1, &init_cpu);
        Mf *gpu = mf_new(mode, DEVICE_CUDA, USERS, ITEMS, DIM, 3.5f, 0.01, 0.1, &init_gpu);
        Mf *resident = mf_new(mode, DEVICE_CUDA, USERS, ITEMS, DIM, 3.5f, 0.01, 0.1, &init_resident);
        Mf *queued = mf_new(mode, DEVICE_CUDA, USERS, ITEMS, DIM, 3.5f, 0.01, 0.1, &init_queued);
        int losses_differ = 0, n = BATCH, queued_handed = 0, queues_differ = 0;
        double cpu_losses[STEPS];
        for (int step = 0; step < STEPS; step++) {
            n = step == 3 ? 0 : BATCH;
            for (int s = 0; s < n; s++) {
                float u = rng_uniform(&batches, 0, 1), i = rng_uniform(&batches, 0, 1);
                user[s] = (int)(u * u * USERS) % USERS;  // skewed: popular rows recur in a batch
                item[s] = (int)(i * i * ITEMS) % ITEMS;
                rating[s] = 0.5f * (float)(1 + (int)(rng_uniform(&batches, 0, 10)) % 10);
            }
            RatingBatch batch = {.user = user, .item = item, .rating = rating, .n = n, .global_n = BATCH, .max_n = BATCH};
            const double *loss_cpu;
            mf_train_step(cpu, &batch);
            int taken_cpu = mf_take_losses(cpu, false, &loss_cpu);
            losses_differ += taken_cpu != 1;
            cpu_losses[step] = taken_cpu == 1 ? loss_cpu[0] : NAN;
            mf_train_step(gpu, &batch);  // (the ids from the host: copied to the GPU)
            // The GPU's stay there until due: the steps' losses in one hand-over, at the last.
            losses_differ += gpu_losses_differ(gpu, step, STEPS, cpu_losses);
            // The same batch on the GPU, at an offset of 0 or 7 entries.
            const int at = step % 2 ? 7 : 0;
            upload_batch(resident_user, resident_item, resident_rating, at, user, item, rating, n);
            RatingBatch on_gpu = batch;
            on_gpu.gpu_user = resident_user + at, on_gpu.gpu_item = resident_item + at, on_gpu.gpu_rating = resident_rating + at;
            mf_train_step(resident, &on_gpu);
            losses_differ += gpu_losses_differ(resident, step, STEPS, cpu_losses);
            // The same batch as the epoch's batch `step`, the others following it.
            upload_batch(epoch_user, epoch_item, epoch_rating, step * BATCH, user, item, rating, n);
            RatingBatch in_epoch = batch;
            in_epoch.gpu_user = epoch_user + step * BATCH, in_epoch.gpu_item = epoch_item + step * BATCH;
            in_epoch.gpu_rating = epoch_rating + step * BATCH, in_epoch.following = STEPS - 1 - step;
            mf_train_step(queued, &in_epoch);
            // Queued: all 6 steps' inputs at step 0, the last 3 again at step 3 (after the hand-over).
            queues_differ += !queue_is(queued, step <= HANDED_AT ? STEPS : STEPS - 1 - HANDED_AT,
                                       step <= HANDED_AT ? step + 1 : step - HANDED_AT);
            if (step == HANDED_AT || step == STEPS - 1) {
                const double *losses;
                int taken = mf_take_losses(queued, true, &losses);
                losses_differ += taken != step + 1 - queued_handed;
                for (int k = 0; k < taken && k < step + 1 - queued_handed; k++)
                    losses_differ += memcmp(&losses[k], &cpu_losses[queued_handed + k], sizeof(double)) != 0;
                queued_handed = step + 1;
            }
        }
        mf_predict(cpu, user, item, n, predicted_cpu);
        mf_predict(gpu, user, item, n, predicted_gpu);
        size_t differ = (size_t)(memcmp(predicted_cpu, predicted_gpu, sizeof predicted_cpu) != 0);
        mf_predict(resident, user, item, n, predicted_gpu);
        differ += (size_t)(memcmp(predicted_cpu, predicted_gpu, sizeof predicted_cpu) != 0);
        mf_predict(queued, user, item, n, predicted_gpu);
        differ += (size_t)(memcmp(predicted_cpu, predicted_gpu, sizeof predicted_cpu) != 0);
        mf_gather_full(cpu);
        mf_gather_full(gpu);
        mf_gather_full(resident);
        mf_gather_full(queued);
        for (int t = 0; t < 4; t++)
            differ += bits_differ(&gpu->full[t], &cpu->full[t]) + bits_differ(&resident->full[t], &cpu->full[t]) +
                      bits_differ(&queued->full[t], &cpu->full[t]);
        EXPECT(losses_differ == 0 && differ == 0 && queues_differ == 0,
               "step 15's model, %s embeddings, on the GPU: %d steps (one of an empty slice), the batch's ids from the "
               "host, from the GPU, and from the GPU as an epoch's with the steps' inputs queued at once (%d steps "
               "found other queues than expected), take the CPU's losses (%d differ), its predictions and tables bit "
               "for bit (%zu values differ)",
               embeddings_mode_name(mode), STEPS, queues_differ, losses_differ, differ);
        mf_free(cpu);
        mf_free(gpu);
        mf_free(resident);
        mf_free(queued);
    }
    device_free(resident_user), device_free(resident_item), device_free(resident_rating);
    device_free(epoch_user), device_free(epoch_item), device_free(epoch_rating);
}

#if HAVE_CUDA
// Step 15's sampler on a GPU rank alone (rating_sampler.c): the training ratings go to the GPU once,
// and each epoch its permutation, drawn ahead into page-locked memory, through which a kernel
// gathers the epoch's ratings there. Epoch after epoch (the permutation's buffers swapping with the
// thread that draws ahead), shuffled and not, its arrays on the GPU hold a CPU rank's, its batches
// point into them where the CPU's batches point into its own, and the host keeps no copy.
static void test_rating_sampler(void) {
    enum { N = 5003, BATCH = 64, EPOCHS = 4 };
    int *user = xmalloc(N * sizeof(int)), *item = xmalloc(N * sizeof(int));
    float *rating = xmalloc(N * sizeof(float));
    for (int i = 0; i < N; i++) user[i] = i, item[i] = (i * 7919) % N, rating[i] = 0.5f * (float)(i % 10);
    int *got_user = xmalloc(N * sizeof(int)), *got_item = xmalloc(N * sizeof(int));
    float *got_rating = xmalloc(N * sizeof(float));
    for (int shuffle = 1; shuffle >= 0; shuffle--) {
        RatingSampler cpu = rating_sampler_new(N, user, item, rating, BATCH, shuffle, 11, DEVICE_CPU);
        RatingSampler gpu = rating_sampler_new(N, user, item, rating, BATCH, shuffle, 11, DEVICE_CUDA);
        long wrong = 0, batches_wrong = 0, host_copies = 0;
        bool moved = false;
        const int *first_perm = NULL;
        for (int epoch = 0; epoch < EPOCHS; epoch++) {
            rating_sampler_set_epoch(&cpu, epoch), rating_sampler_set_epoch(&gpu, epoch);
            if (epoch == 0) first_perm = gpu.perm;
            moved |= shuffle && gpu.perm != first_perm;
            device_read_to_host(got_user, gpu.gpu_user, N * sizeof(int), "the epoch's users");
            device_read_to_host(got_item, gpu.gpu_item, N * sizeof(int), "the epoch's movies");
            device_read_to_host(got_rating, gpu.gpu_rating, N * sizeof(float), "the epoch's ratings");
            for (int p = 0; p < N; p++)
                wrong += got_user[p] != cpu.epoch_user[p] || got_item[p] != cpu.epoch_item[p] ||
                         got_rating[p] != cpu.epoch_rating[p];
            for (int b = 0; b < cpu.n_batches; b++) {
                RatingBatch c = rating_sampler_batch(&cpu, b), g = rating_sampler_batch(&gpu, b);
                host_copies += g.user != NULL || g.item != NULL || g.rating != NULL;
                batches_wrong += g.n != c.n || g.global_n != c.global_n || g.gpu_user != gpu.gpu_user + (c.user - cpu.epoch_user) ||
                                 g.gpu_item != gpu.gpu_item + (c.item - cpu.epoch_item) ||
                                 g.gpu_rating != gpu.gpu_rating + (c.rating - cpu.epoch_rating) ||
                                 g.following != gpu.n_batches - 1 - b;
            }
        }
        EXPECT(wrong == 0 && batches_wrong == 0 && host_copies == 0 && gpu.epoch_user == NULL && (moved || !shuffle),
               "%s, %d epochs of %d ratings in batches of %d: the GPU's epoch arrays are the CPU sampler's (%ld of %d "
               "positions wrong), its %d batches point into them as the CPU's into its own (%ld wrong), none on the "
               "host (%ld)%s", shuffle ? "shuffled" : "not shuffled", EPOCHS, N, BATCH, wrong, EPOCHS * N, cpu.n_batches,
               batches_wrong, host_copies,
               !shuffle ? "" : moved ? "; the permutation's buffer swapped with the draw ahead's" : "; the permutation never changed buffers");
        if (shuffle)
            EXPECT(gpu.ahead.alloc == device_host_alloc && gpu.ahead.release == device_host_free,
                   "shuffled: the permutations are drawn into page-locked memory (device_host_alloc), from which "
                   "their copies to the GPU wait for nothing");
        rating_sampler_free(&cpu), rating_sampler_free(&gpu);
    }
    free(user), free(item), free(rating), free(got_user), free(got_item), free(got_rating);

    // Epochs set one after the other with no wait between them, as the training loop sets them
    // where the GPU still runs the last epoch's steps: each epoch's ratings copied aside on the
    // GPU as queued, and compared at the end. The permutation whose copy is still queued must not
    // go back to the thread that draws ahead (set_epoch waits for that copy first).
    enum { BIG = 200003, BIG_EPOCHS = 6 };
    size_t ints = (size_t)BIG * sizeof(int);
    user = xmalloc(ints), item = xmalloc(ints), rating = xmalloc(ints);
    for (int i = 0; i < BIG; i++) user[i] = i, item[i] = (int)(((long)i * 7919) % BIG), rating[i] = 0.5f * (float)(i % 10);
    int *want = xmalloc(ints * BIG_EPOCHS), *got = xmalloc(ints * BIG_EPOCHS), *aside = device_alloc(ints * BIG_EPOCHS);
    RatingSampler cpu = rating_sampler_new(BIG, user, item, rating, BATCH, true, 5, DEVICE_CPU);
    for (int epoch = 0; epoch < BIG_EPOCHS; epoch++) {
        rating_sampler_set_epoch(&cpu, epoch);
        memcpy(want + (size_t)epoch * BIG, cpu.epoch_user, ints);
    }
    RatingSampler gpu = rating_sampler_new(BIG, user, item, rating, BATCH, true, 5, DEVICE_CUDA);
    for (int epoch = 0; epoch < BIG_EPOCHS; epoch++) {
        rating_sampler_set_epoch(&gpu, epoch);
        CHECK_CUDA(cudaMemcpyAsync(aside + (size_t)epoch * BIG, gpu.gpu_user, ints, cudaMemcpyDeviceToDevice, device_stream()));
    }
    device_read_to_host(got, aside, ints * BIG_EPOCHS, "the epochs' users");
    long unqueued_wrong = 0;
    for (size_t p = 0; p < (size_t)BIG * BIG_EPOCHS; p++) unqueued_wrong += got[p] != want[p];
    EXPECT(unqueued_wrong == 0, "%d epochs of %d ratings set with no wait between them (the copies of each queued "
           "behind the last): each epoch's ratings on the GPU are the CPU sampler's (%ld of %d wrong)",
           BIG_EPOCHS, BIG, unqueued_wrong, BIG_EPOCHS * BIG);
    rating_sampler_free(&cpu), rating_sampler_free(&gpu);
    device_free(aside);
    free(want), free(got), free(user), free(item), free(rating);
}

// gpu_sort_groups (step 15's rows of a batch, found on the GPU) against a stable sort on the
// CPU: the entries' order, the groups and each entry's group, on the edge cases: no entry, one,
// all of one key, all distinct, keys at the table's two ends, invalid entries (-1, past a count
// held in device memory), entries in blocks of a larger stride, more entries than the block has
// threads, keys of 18 bits. Both of its kernels (kernels.cu): the one in shared memory, for up to
// 4096 entries whose key and position fit in 31 bits, and the radix sort, for the others; sizes on
// either side of each edge.
static int sort_case_compare(const void *a, const void *b) {
    const int *x = a, *y = b;  // (key, p): p breaks ties, so the sort is stable
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

// One sort's keys and buffers on the GPU.
typedef struct {
    const int *keys;  // host memory
    int n, n_valid, block, stride;
    int *device_keys, *device_valid;
    int **keys_at, *decoy;  // (through_pointer) where the keys' address is; SortGroups.keys, all 0
    SortGroups sort;
} SortCase;

// through_pointer: the kernel finds the keys' address in device memory (SortGroups.keys_at, as step
// 15's steps read their batch's), and SortGroups.keys is a decoy of zeros, which it must not sort.
static SortCase sort_case_new(const int *keys, int n, int n_valid, int key_limit, int block, int stride,
                              bool through_pointer) {
    int bits = 0;
    while ((1L << bits) < key_limit) bits++;
    size_t entries = n > 0 ? (size_t)n : 1;
    SortCase c = {keys, n, n_valid, block, stride, device_alloc(entries * sizeof(int)), device_alloc(sizeof(int)),
                  NULL, NULL, {0}};
    if (n > 0) device_upload(c.device_keys, keys, (size_t)n * sizeof(int), "the keys");
    device_upload(c.device_valid, &n_valid, sizeof(int), "the count");
    c.sort = (SortGroups){.keys = c.device_keys, .n = n, .n_valid = n_valid < n ? c.device_valid : NULL,
                          .key_bits = bits, .block = block, .block_stride = stride,
                          .scratch = device_alloc(4 * entries * sizeof(int)), .order = device_alloc(entries * sizeof(int)),
                          .n_groups = device_alloc(sizeof(int)), .group_key = device_alloc(entries * sizeof(int)),
                          .group_start = device_alloc((entries + 1) * sizeof(int)),
                          .group_of = device_alloc(entries * sizeof(int))};
    if (through_pointer) {
        c.keys_at = device_alloc(sizeof(int *));
        device_upload(c.keys_at, &c.device_keys, sizeof(int *), "the keys' address");
        c.decoy = device_alloc(entries * sizeof(int));
        CHECK_CUDA(cudaMemsetAsync(c.decoy, 0, entries * sizeof(int), device_stream()));
        c.sort.keys = c.decoy, c.sort.keys_at = (const int *const *)c.keys_at;
    }
    return c;
}

// The sort's results against a stable sort on the CPU: the number of differences. Frees the case.
static int sort_case_check(const char *what, SortCase *c) {
    const int n = c->n, n_valid = c->n_valid, block = c->block, stride = c->stride, *keys = c->keys;
    size_t entries = n > 0 ? (size_t)n : 1;
    int got_groups = -1;
    int *got_order = xmalloc(entries * sizeof(int)), *got_key = xmalloc(entries * sizeof(int));
    int *got_start = xmalloc((entries + 1) * sizeof(int)), *got_of = xmalloc(entries * sizeof(int));
    device_read_to_host(&got_groups, c->sort.n_groups, sizeof(int), "the groups");
    // The reference: the valid entries, sorted by (key, p).
    int *pairs = xmalloc(2 * entries * sizeof(int)), m = 0;
    for (int p = 0; p < n && p < n_valid; p++)
        if (keys[p] >= 0) pairs[2 * m] = keys[p], pairs[2 * m + 1] = p, m++;
    qsort(pairs, (size_t)m, 2 * sizeof(int), sort_case_compare);
    int groups = 0, wrong = 0;
    for (int k = 0; k < m; k++) groups += k == 0 || pairs[2 * k] != pairs[2 * k - 2];
    wrong += got_groups != groups;
    if (got_groups == groups) {
        if (m > 0) {
            device_read_to_host(got_order, c->sort.order, (size_t)m * sizeof(int), "the order");
            device_read_to_host(got_key, c->sort.group_key, (size_t)groups * sizeof(int), "the groups' keys");
        }
        device_read_to_host(got_start, c->sort.group_start, ((size_t)groups + 1) * sizeof(int), "the groups' starts");
        if (n > 0) device_read_to_host(got_of, c->sort.group_of, (size_t)n * sizeof(int), "the entries' groups");
        int g = -1;
        for (int k = 0; k < m; k++) {
            int key = pairs[2 * k], p = pairs[2 * k + 1];
            if (k == 0 || key != pairs[2 * k - 2]) {
                g++;
                wrong += got_key[g] != key || got_start[g] != k;
            }
            wrong += got_order[k] != p / block * stride + p % block;
            wrong += got_of[p] != g;
        }
        wrong += got_start[groups] != m;
    }
    EXPECT(wrong == 0, "gpu_sort_groups, %s: %d entries (%d valid) in %d groups, a stable sort's (%d differences)", what, n,
           m, groups, wrong);
    void *buffers[] = {c->device_keys, c->device_valid, c->keys_at, c->decoy, c->sort.scratch, c->sort.order,
                       c->sort.n_groups, c->sort.group_key, c->sort.group_start, c->sort.group_of};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++) device_free(buffers[k]);
    free(got_order), free(got_key), free(got_start), free(got_of), free(pairs);
    return wrong;
}

static int sort_case(const char *what, const int *keys, int n, int n_valid, int key_limit, int block, int stride) {
    SortCase c = sort_case_new(keys, n, n_valid, key_limit, block, stride, false);
    gpu_sort_groups(&c.sort, 1, device_stream());
    return sort_case_check(what, &c);
}

// Two sorts in one call (step 15's users and movies: gpu_sort_groups), each against its stable sort;
// the second's keys read through their address in device memory (SortGroups.keys_at).
static void sort_pair_case(const char *what, const int *keys_a, int n_a, int limit_a, const int *keys_b, int n_b,
                           int n_valid_b, int limit_b) {
    SortCase c[2] = {sort_case_new(keys_a, n_a, n_a, limit_a, n_a, n_a, false),
                     sort_case_new(keys_b, n_b, n_valid_b, limit_b, n_b, n_b, true)};
    SortGroups sorts[2] = {c[0].sort, c[1].sort};
    gpu_sort_groups(sorts, 2, device_stream());
    char first[128], second[128];
    snprintf(first, sizeof first, "%s, the first of two", what);
    snprintf(second, sizeof second, "%s, the second of two", what);
    sort_case_check(first, &c[0]);
    sort_case_check(second, &c[1]);
}

static void test_sort_groups(void) {
    enum { N = 5000 };
    int *keys = xmalloc(N * sizeof(int));
    sort_case("no entry", keys, 0, 0, 10, 1, 1);
    keys[0] = 0;
    sort_case("one entry, key 0", keys, 1, 1, 1, 1, 1);
    for (int p = 0; p < 1000; p++) keys[p] = 9723;
    sort_case("1000 of one key, the table's last row", keys, 1000, 1000, 9724, 1000, 1000);
    for (int p = 0; p < 1000; p++) keys[p] = (p * 617) % 1000;  // a permutation of 0 .. 999
    sort_case("1000 distinct keys, 0 to 999", keys, 1000, 1000, 1000, 1000, 1000);
    Rng rng;
    rng_seed(&rng, 3);
    for (int p = 0; p < 1000; p++) {
        float u = rng_uniform(&rng, 0, 1);
        keys[p] = (int)(u * u * 9724) % 9724;  // skewed: popular rows recur
    }
    keys[17] = 0, keys[998] = 9723, keys[999] = 0;
    sort_case("1000 skewed keys of 9724, both ends", keys, 1000, 1000, 9724, 1000, 1000);
    for (int p = 0; p < 777; p++) keys[p] = p % 13 == 0 ? -1 : (int)(rng_uniform(&rng, 0, 1) * 50);
    sort_case("777 keys, some -1, the first 500 counted (a count on the GPU)", keys, 777, 500, 50, 777, 777);
    sort_case("a short last batch: 3 of 777 counted", keys, 777, 3, 50, 777, 777);
    sort_case("none of 777 counted", keys, 777, 0, 50, 777, 777);
    for (int r = 0; r < 4; r++)  // 4 ranks' blocks of 300, each valid up to its own count
        for (int i = 0; i < 300; i++) keys[r * 300 + i] = i < 100 + 60 * r ? (int)(rng_uniform(&rng, 0, 1) * 400) : -1;
    sort_case("4 blocks of 300 at a stride of 311, padded with -1", keys, 1200, 1200, 400, 300, 311);
    for (int p = 0; p < N; p++) keys[p] = (int)(rng_uniform(&rng, 0, 1) * 162541);
    keys[0] = 162540, keys[N - 1] = 0;
    sort_case("5000 keys of 18 bits (ml-25m's users)", keys, N, N, 162541, N, N);
    // Sizes about the edges of the shared-memory sort's blocks of entries (16: sort_rank_kernel's, and
    // its grouping's 1,024 threads) and of its 4096 entries, with few keys (long runs of each), a
    // tenth -1, all counted or two thirds.
    const int sizes[] = {2, 3, 31, 32, 33, 1023, 1024, 1025, 2048, 2049, 4095, 4096, 4097, 5000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        for (int p = 0; p < n; p++)
            keys[p] = rng_uniform(&rng, 0, 1) < 0.1f ? -1 : (int)(rng_uniform(&rng, 0, 1) * 97) % 97;
        char what[96];
        snprintf(what, sizeof what, "%d keys of 97, a tenth -1", n);
        sort_case(what, keys, n, n, 97, n, n);
        snprintf(what, sizeof what, "%d keys of 97, a tenth -1, the first %d counted", n, n - n / 3);
        sort_case(what, keys, n, n - n / 3, 97, n, n);
    }
    for (int p = 0; p < N; p++) keys[p] = 42;
    sort_case("4096 of one key", keys, 4096, 4096, 97, 4096, 4096);
    sort_case("5000 of one key", keys, N, N, 97, N, N);
    for (int p = 0; p < N; p++) keys[p] = -1;
    sort_case("4096 of -1", keys, 4096, 4096, 97, 4096, 4096);
    sort_case("5000 of -1", keys, N, N, 97, N, N);
    // The widest keys: 4096 entries (12 bits of position) take the shared-memory kernel with keys of 19
    // bits, the last entry's word 2^31 - 1, and the radix sort with 20; so do 2 entries with keys of 30
    // bits and 3 entries; and keys of 31 bits.
    for (int p = 0; p < 4096; p++) keys[p] = (int)(rng_uniform(&rng, 0, 1) * (1 << 19)) % (1 << 19);
    keys[4095] = (1 << 19) - 1, keys[7] = 0;
    sort_case("4096 keys of 19 bits, the last the largest", keys, 4096, 4096, 1 << 19, 4096, 4096);
    keys[4095] = (1 << 20) - 1;
    sort_case("4096 keys of 20 bits", keys, 4096, 4096, 1 << 20, 4096, 4096);
    keys[0] = (1 << 30) - 1, keys[1] = 5, keys[2] = (1 << 30) - 1;
    sort_case("2 keys of 30 bits", keys, 2, 2, 1 << 30, 2, 2);
    sort_case("3 keys of 30 bits", keys, 3, 3, 1 << 30, 3, 3);
    for (int p = 0; p < 1000; p++) keys[p] = (int)(rng_uniform(&rng, 0, 1) * 32768) % 32768 << 16 | p;
    keys[500] = 0x7fffffff, keys[501] = 0, keys[502] = keys[3];
    sort_case("1000 keys of 31 bits", keys, 1000, 1000, 0x7fffffff, 1000, 1000);
    // Two sorts at once (gpu_sort_groups): a batch's users and movies, skewed, in the same launches
    // of the shared-memory sort, the second counted to a short last batch, or the first shorter (its
    // blocks past its entries do nothing); one of them past it (5000 entries, or keys of 20 bits at
    // 4096: the radix sort) and the other in it; none and some.
    int *other = xmalloc(N * sizeof(int));
    for (int p = 0; p < N; p++) {
        float u = rng_uniform(&rng, 0, 1), v = rng_uniform(&rng, 0, 1);
        keys[p] = (int)(u * u * u * 32467) % 32467, other[p] = (int)(v * v * v * 11820) % 11820;
    }
    sort_pair_case("1024 skewed users and 1024 skewed movies, 700 counted", keys, 1024, 32467, other, 1024, 700, 11820);
    sort_pair_case("5000 users (the radix sort) and 1024 movies", keys, N, 32467, other, 1024, 1024, 11820);
    sort_pair_case("1024 users and 4096 movies of 20 bits (the radix sort)", keys, 1024, 32467, other, 4096, 4096, 1 << 20);
    sort_pair_case("1024 users and 5000 movies (the radix sort)", keys, 1024, 32467, other, N, 4000, 11820);
    sort_pair_case("no user and 1024 movies", keys, 0, 32467, other, 1024, 1024, 11820);
    sort_pair_case("33 users and 1024 movies", keys, 33, 32467, other, 1024, 1024, 11820);
    free(other);
    free(keys);
}
#endif

// A CPU tensor of uniform values and its GPU copy.
typedef struct {
    Tensor cpu, gpu;
} Pair;
static Pair pair_uniform(int rows, int cols, float low, float high) {
    Pair p = {.cpu = tensor_zeros(rows, cols, DEVICE_CPU)};
    fill_uniform(&p.cpu, low, high);
    p.gpu = on_gpu(&p.cpu);
    return p;
}
static void pair_free(Pair *p) { tensor_free(&p->cpu), tensor_free(&p->gpu); }

// Step 19's transformer operations (transformer_ops.h). The kernels do the CPU's float operations
// in the CPU's order with no FMA contraction (kernels.cu), so LayerNorm, GELU, the embeddings
// (sums over a batch with repeated tokens), the residual adds and the dropout masks must be the
// CPU's bits: a kernel that sums in another order or lets nvcc fuse a multiply-add fails here on a
// real GPU. The attention's products are cuBLAS's GEMMs against OpenBLAS's (its softmax is the
// CPU's arithmetic): there the tolerance is a GEMM's, 1e-5 of the tensor's scale (a float32 dot
// product of head_dim or T terms in another order: a few units in the last place).
static void test_transformer_ops(void) {
    // C and T past transformer_ops.c's 16 lanes, with a rest: whole chunks, the lanes' tree and the tail.
    enum { B = 3, T = 19, C = 40, HEADS = 4, V = 11, N = B * T, T_MAX = 21 };
    // LayerNorm, with and without a bias, forward and backward (the gradients accumulate into
    // what is there); then [600, 75], past the weights' gradient kernel's tiles of 256 rows and 8
    // columns, with a rest of each.
    for (int round = 0; round < 4; round++) {
        const int with_bias = round % 2, rows = round < 2 ? N : 600, cols = round < 2 ? C : 75;
        Pair x = pair_uniform(rows, cols, -2, 3), weight = pair_uniform(1, cols, 0.5f, 1.5f), bias = pair_uniform(1, cols, -1, 1);
        Pair y = pair_uniform(rows, cols, 0, 0), mean = pair_uniform(1, rows + 5, 0, 0), rstd = pair_uniform(1, rows + 5, 0, 0);
        Pair grad_y = pair_uniform(rows, cols, -1, 1), grad_x = pair_uniform(rows, cols, -1, 1);
        Pair grad_weight = pair_uniform(1, cols, -1, 1), grad_bias = pair_uniform(1, cols, -1, 1);
        layernorm_forward(&x.cpu, &weight.cpu, with_bias ? &bias.cpu : NULL, &y.cpu, &mean.cpu, &rstd.cpu);
        layernorm_forward(&x.gpu, &weight.gpu, with_bias ? &bias.gpu : NULL, &y.gpu, &mean.gpu, &rstd.gpu);
        size_t forward = bits_differ(&y.gpu, &y.cpu) + bits_differ(&mean.gpu, &mean.cpu) + bits_differ(&rstd.gpu, &rstd.cpu);
        layernorm_backward(&x.cpu, &weight.cpu, &mean.cpu, &rstd.cpu, &grad_y.cpu, &grad_x.cpu, &grad_weight.cpu,
                           with_bias ? &grad_bias.cpu : NULL);
        layernorm_backward(&x.gpu, &weight.gpu, &mean.gpu, &rstd.gpu, &grad_y.gpu, &grad_x.gpu, &grad_weight.gpu,
                           with_bias ? &grad_bias.gpu : NULL);
        size_t backward = bits_differ(&grad_x.gpu, &grad_x.cpu) + bits_differ(&grad_weight.gpu, &grad_weight.cpu) +
                          bits_differ(&grad_bias.gpu, &grad_bias.cpu);
        EXPECT(forward == 0 && backward == 0,
               "LayerNorm [%d, %d]%s on the GPU: forward (y, mean, rstd) and backward (grad_x +=, grad_weight +=%s) are "
               "the CPU's bits (%zu and %zu values differ)", rows, cols, with_bias ? " with a bias" : "",
               with_bias ? ", grad_bias +=" : "", forward, backward);
        Pair *all[] = {&x, &weight, &bias, &y, &mean, &rstd, &grad_y, &grad_x, &grad_weight, &grad_bias};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    }

    // GELU over values from -6 to 6 (erf's tails included), and its backward in place.
    Pair gx = pair_uniform(1, 20000, -6, 6), gy = pair_uniform(1, 20000, 0, 0), ggrad = pair_uniform(1, 20000, -1, 1);
    gelu_forward(&gx.cpu, &gy.cpu), gelu_forward(&gx.gpu, &gy.gpu);
    size_t gelu = bits_differ(&gy.gpu, &gy.cpu);
    gelu_backward(&gx.cpu, &ggrad.cpu, &ggrad.cpu), gelu_backward(&gx.gpu, &ggrad.gpu, &ggrad.gpu);
    size_t gelu_back = bits_differ(&ggrad.gpu, &ggrad.cpu);
    EXPECT(gelu == 0 && gelu_back == 0, "GELU (erf) on 20000 values in [-6, 6]: forward and backward (in place) are the "
           "CPU's bits (%zu and %zu differ)", gelu, gelu_back);

    // The residual add and the mask product.
    Pair sum = pair_uniform(1, 20000, 0, 0);
    add_elementwise(&gx.cpu, &ggrad.cpu, &sum.cpu), add_elementwise(&gx.gpu, &ggrad.gpu, &sum.gpu);
    multiply_by_mask(&gy.cpu, &gx.cpu), multiply_by_mask(&gy.gpu, &gx.gpu);
    size_t elementwise = bits_differ(&sum.gpu, &sum.cpu) + bits_differ(&gy.gpu, &gy.cpu);
    EXPECT(elementwise == 0, "add_elementwise and multiply_by_mask on the GPU: the CPU's bits (%zu differ)", elementwise);
    pair_free(&gx), pair_free(&gy), pair_free(&ggrad), pair_free(&sum);

    // Embeddings: 57 tokens of 11, so rows repeat; the gradients accumulate into what is there,
    // each table row in token order on both.
    int tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (int)(rng_next_u32(&data_rng) % 5) * 2;  // 0, 2, .., 8: rows repeat, some absent
    TokenBatch batch_cpu = token_batch_new(N + 4, V, DEVICE_CPU), batch_gpu = token_batch_new(N + 4, V, DEVICE_CUDA);
    token_batch_set(&batch_cpu, tokens, N), token_batch_set(&batch_gpu, tokens, N);
    Pair wte = pair_uniform(V, C, -1, 1), wpe = pair_uniform(T_MAX, C, -1, 1), embedded = pair_uniform(N, C, 0, 0);
    embedding_forward(&batch_cpu, &wte.cpu, &wpe.cpu, B, T, &embedded.cpu);
    embedding_forward(&batch_gpu, &wte.gpu, &wpe.gpu, B, T, &embedded.gpu);
    size_t lookups = bits_differ(&embedded.gpu, &embedded.cpu);
    Pair grad_embedded = pair_uniform(N, C, -1, 1);
    embedding_backward(&batch_cpu, &grad_embedded.cpu, B, T, &wte.cpu, &wpe.cpu);  // (wte, wpe as the gradients here)
    embedding_backward(&batch_gpu, &grad_embedded.gpu, B, T, &wte.gpu, &wpe.gpu);
    size_t sums = bits_differ(&wte.gpu, &wte.cpu) + bits_differ(&wpe.gpu, &wpe.cpu);
    EXPECT(lookups == 0 && sums == 0, "embeddings on the GPU, %d tokens with repeats: wte[idx] + wpe[pos] and the "
           "tables' gradients (summed in token order, no atomics) are the CPU's bits (%zu and %zu differ)", N, lookups, sums);
    token_batch_free(&batch_cpu), token_batch_free(&batch_gpu);
    pair_free(&wte), pair_free(&wpe), pair_free(&embedded), pair_free(&grad_embedded);

    // Attention, in buffers sized for T_MAX (used from their start), without and with dropout.
    // Round 2 again with dropout, the products in bfloat16 on both (cublasGemmBatchedEx against the
    // CPU's sgemms of rounded operands): the same tolerance, and y 1e-4 and more from float32's.
    for (int round = 0; round < 3; round++) {
        const int dropout = round > 0, bf16 = round == 2;
        Pair qkv = pair_uniform(N, 3 * C, -1.5f, 1.5f), y = pair_uniform(N, C, 0, 0);
        Pair att = pair_uniform(B * HEADS, T_MAX * T_MAX, 0, 0), dropped = pair_uniform(B * HEADS, T_MAX * T_MAX, 0, 0);
        Pair mask = pair_uniform(B * HEADS, T_MAX * T_MAX, 0, 0), scratch = pair_uniform(B * HEADS, T_MAX * T_MAX, 0, 0);
        Pair grad_y = pair_uniform(N, C, -1, 1), grad_qkv = pair_uniform(N, 3 * C, 0, 0);
        size_t masks = 0;
        if (dropout) {
            Rng rng_cpu, rng_gpu;
            rng_seed(&rng_cpu, 5), rng_seed(&rng_gpu, 5);
            dropout_draw(&rng_cpu, 0.3, B * HEADS * T * T, &mask.cpu), dropout_draw(&rng_gpu, 0.3, B * HEADS * T * T, &mask.gpu);
            masks = bits_differ(&mask.gpu, &mask.cpu);
        }
        double from_fp32 = 1.0;
        if (bf16) {
            Tensor y32 = tensor_zeros(N, C, DEVICE_CPU);
            attention_forward(&qkv.cpu, B, T, HEADS, &att.cpu, &mask.cpu, &dropped.cpu, &y32);
            matmul_set_dtype(MATMUL_BFLOAT16);
            attention_forward(&qkv.cpu, B, T, HEADS, &att.cpu, &mask.cpu, &dropped.cpu, &y.cpu);
            from_fp32 = relative_error_cpu(&y.cpu, &y32);
            tensor_free(&y32);
        }
        attention_forward(&qkv.cpu, B, T, HEADS, &att.cpu, dropout ? &mask.cpu : NULL, dropout ? &dropped.cpu : NULL, &y.cpu);
        attention_forward(&qkv.gpu, B, T, HEADS, &att.gpu, dropout ? &mask.gpu : NULL, dropout ? &dropped.gpu : NULL, &y.gpu);
        double err_att = relative_error(&att.gpu, &att.cpu), err_y = relative_error(&y.gpu, &y.cpu);
        attention_backward(&qkv.cpu, &att.cpu, dropout ? &mask.cpu : NULL, dropout ? &dropped.cpu : NULL, &grad_y.cpu, B,
                           T, HEADS, &scratch.cpu, &grad_qkv.cpu);
        attention_backward(&qkv.gpu, &att.gpu, dropout ? &mask.gpu : NULL, dropout ? &dropped.gpu : NULL, &grad_y.gpu, B,
                           T, HEADS, &scratch.gpu, &grad_qkv.gpu);
        double err_grad = relative_error(&grad_qkv.gpu, &grad_qkv.cpu);
        matmul_set_dtype(MATMUL_FLOAT32);
        EXPECT(err_att < 1e-5 && err_y < 1e-5 && err_grad < 1e-5 && masks == 0 && from_fp32 > 1e-4,
               "causal attention on the GPU (cuBLAS batched GEMMs, softmax kernels)%s%s, %d sequences x %d heads x %d "
               "positions: probabilities, y and grad_qkv within 1e-5 of the CPU's (%.1e, %.1e, %.1e)%s",
               dropout ? " with dropout 0.3" : "", bf16 ? ", bfloat16 products" : "", B, HEADS, T, err_att, err_y,
               err_grad, dropout ? ", the masks drawn on the host the CPU's bits" : "");
        if (bf16) printf("  (y with bfloat16 products: %.1e from float32's)\n", from_fp32);
        Pair *all[] = {&qkv, &y, &att, &dropped, &mask, &scratch, &grad_y, &grad_qkv};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    }
    // Philox's masks, drawn where they live: a kernel's are the CPU loop's bits (an odd length: the
    // last evaluation's words used in part).
    {
        const long n = 100003;
        Pair mask = pair_uniform(1, (int)n, 0, 0);
        dropout_philox(0xfeedULL, 3ULL << 32 | 4, 0.2, n, &mask.cpu), dropout_philox(0xfeedULL, 3ULL << 32 | 4, 0.2, n, &mask.gpu);
        size_t differ = bits_differ(&mask.gpu, &mask.cpu);
        EXPECT(differ == 0, "dropout_philox on the GPU (a Philox4x32-10 kernel): the CPU's %ld values, bit for bit (%zu differ)",
               n, differ);
        // A split model's part (dropout_philox_part): 7 runs of 999 values, 4001 apart, from value 3.
        dropout_philox_part(0xfeedULL, 9, 0.2, 3, 999, 4001, 7, &mask.cpu);
        dropout_philox_part(0xfeedULL, 9, 0.2, 3, 999, 4001, 7, &mask.gpu);
        differ = bits_differ(&mask.gpu, &mask.cpu);
        EXPECT(differ == 0, "dropout_philox_part on the GPU: 7 runs of 999 values, from value 3, 4001 apart: the CPU's bits "
               "(%zu of %ld differ)", differ, n);
        pair_free(&mask);
    }

    // clip_grad_norm's sum of squares: in double on both, in another order on the GPU.
    Pair parts[3] = {pair_uniform(37, 41, -1, 1), pair_uniform(1, 9000, -3, 3), pair_uniform(5, 3, -1, 1)};
    Tensor *cpu_parts[3] = {&parts[0].cpu, &parts[1].cpu, &parts[2].cpu};
    Tensor *gpu_parts[3] = {&parts[0].gpu, &parts[1].gpu, &parts[2].gpu};
    double squares_cpu = sum_of_squares(cpu_parts, 3), squares_gpu = sum_of_squares(gpu_parts, 3);
    EXPECT(fabs(squares_gpu - squares_cpu) <= 1e-12 * squares_cpu,
           "sum_of_squares of 3 tensors (clip_grad_norm's): %.15g on the GPU, %.15g on the CPU (within 1e-12: double sums)",
           squares_gpu, squares_cpu);
    for (int i = 0; i < 3; i++) pair_free(&parts[i]);
}

// Step 19's GPT on both devices from one seed (drawn on the host: the same weights; the dropout
// masks from Philox on both): batches smaller than its buffers, biases and dropout on, AdamW with
// clipping. Each step's logits, loss and gradients within a GEMM's rounding of the CPU's; then both
// optimizers get the CPU's gradients (as in test_mlp_cross_entropy_adam), so that the weights
// compare clip_grad_norm (which clips here: max_norm 0.1) and AdamW's kernels, not the GEMMs'
// rounding amplified by Adam.
static void test_gpt_model(void) {
    GptConfig config = {.vocab_size = 13, .block_size = 20, .n_layer = 2, .n_head = 2, .n_embd = 24, .bias = true,
                        .dropout = 0.2};
    enum { MAX_BATCH = 3, STEPS = 4 };
    Rng init_cpu, init_gpu;
    rng_seed(&init_cpu, 3), rng_seed(&init_gpu, 3);
    Gpt *cpu = gpt_new(&config, MAX_BATCH, &init_cpu, DEVICE_CPU), *gpu = gpt_new(&config, MAX_BATCH, &init_gpu, DEVICE_CUDA);
    gpt_set_dropout_philox(cpu, true);  // the GPU's masks (test_gpu.sh trains with torch's generator on both, too)
    EXPECT(params_checksum(cpu->params, cpu->n_params) == params_checksum(gpu->params, gpu->n_params),
           "step 19's GPT: one seed draws the same weights on either device (drawn on the host)");
    AdamW opt_cpu = adamw_new(cpu->params, cpu->n_params, 0.1, 0.9, 0.99);
    AdamW opt_gpu = adamw_new(gpu->params, gpu->n_params, 0.1, 0.9, 0.99);
    int inputs[MAX_BATCH * 20], targets[MAX_BATCH * 20];
    double worst_logits = 0, worst_loss = 0, worst_grad = 0, worst_norm = 0;
    for (int step = 0; step < STEPS; step++) {
        int B = step == 1 ? 2 : MAX_BATCH, T = step == 2 ? 17 : 20;  // smaller batches use the buffers' start
        for (int i = 0; i < B * T; i++) inputs[i] = (int)(rng_next_u32(&data_rng) % 13), targets[i] = (int)(rng_next_u32(&data_rng) % 13);
        gpt_zero_grad(cpu), gpt_zero_grad(gpu);
        gpt_seed_dropout(cpu, 100 + step), gpt_seed_dropout(gpu, 100 + step);
        const Tensor *logits_cpu = gpt_forward(cpu, inputs, B, T), *logits_gpu = gpt_forward(gpu, inputs, B, T);
        worst_logits = fmax(worst_logits, relative_error(logits_gpu, logits_cpu));
        float loss_cpu = gpt_loss(cpu, targets), loss_gpu = gpt_loss(gpu, targets);
        worst_loss = fmax(worst_loss, fabs(loss_gpu - loss_cpu) / loss_cpu);
        gpt_scale_loss(cpu, 0.5f), gpt_scale_loss(gpu, 0.5f);
        gpt_backward(cpu, NULL, NULL), gpt_backward(gpu, NULL, NULL);
        for (int i = 0; i < cpu->n_params; i++)
            worst_grad = fmax(worst_grad, relative_error(gpu->params[i].grad, cpu->params[i].grad));
        for (int i = 0; i < cpu->n_params; i++) tensor_copy(gpu->params[i].grad, cpu->params[i].grad);
        double norm_cpu = clip_grad_norm(cpu->params, cpu->n_params, 0.1);
        double norm_gpu = clip_grad_norm(gpu->params, gpu->n_params, 0.1);
        worst_norm = fmax(worst_norm, fabs(norm_gpu - norm_cpu) / norm_cpu);
        adamw_step(&opt_cpu, 1e-2), adamw_step(&opt_gpu, 1e-2);
    }
    double worst_weights = 0;
    for (int i = 0; i < cpu->n_params; i++)
        worst_weights = fmax(worst_weights, relative_error(gpu->params[i].value, cpu->params[i].value));
    EXPECT(worst_logits < 1e-5 && worst_loss < 1e-5 && worst_grad < 1e-4,
           "step 19's GPT on the GPU (biases, dropout 0.2, batches of [3, 20], [2, 20], [3, 17]): logits, loss and every "
           "gradient within a GEMM's rounding of the CPU's: rel err %.1e, %.1e, %.1e", worst_logits, worst_loss, worst_grad);
    EXPECT(worst_norm < 1e-12 && worst_weights < 1e-5,
           "step 19's optimizer on the GPU from the CPU's gradients, %d steps: clip_grad_norm's norm (rel err %.1e) and "
           "the weights after AdamW (rel err %.1e)", STEPS, worst_norm, worst_weights);
    // clip_grad_norm_queued: the norm and the coefficient computed on the GPU, never read by the
    // host, clip the same gradients to the same bits as clip_grad_norm on the CPU; and leave them as
    // they are where the norm is below max_norm.
    size_t clipped_differ = 0, kept_differ = 0;
    for (int pass = 0; pass < 2; pass++) {
        double max_norm = pass == 0 ? 0.01 : 1e9;
        for (int i = 0; i < cpu->n_params; i++) tensor_copy(gpu->params[i].grad, cpu->params[i].grad);
        Tensor before = on_cpu(cpu->params[0].grad);
        clip_grad_norm(cpu->params, cpu->n_params, max_norm);
        clip_grad_norm_queued(gpu->params, gpu->n_params, max_norm);
        size_t differ = 0;
        for (int i = 0; i < cpu->n_params; i++) differ += bits_differ(gpu->params[i].grad, cpu->params[i].grad);
        if (pass == 0) clipped_differ = differ + (bits_differ(&before, cpu->params[0].grad) == 0);  // (it did clip)
        else kept_differ = differ + bits_differ(&before, cpu->params[0].grad);
        tensor_free(&before);
    }
    EXPECT(clipped_differ == 0 && kept_differ == 0,
           "clip_grad_norm_queued on the GPU (the norm never on the host): clip_grad_norm's clipped gradients on the "
           "CPU bit for bit (%zu values differ), and none touched below max_norm (%zu)", clipped_differ, kept_differ);
    // clip_grad_norm_split_queued (step 20): the squares of the owned gradients only (here every other
    // tensor: a replicated one owned by another rank) make the norm, every gradient is scaled; on one
    // rank (no group) the same bits as clip_grad_norm_split on the CPU, which the host computes.
    bool *owned = xmalloc((size_t)cpu->n_params * sizeof(bool));
    for (int i = 0; i < cpu->n_params; i++) owned[i] = i % 2 == 0;
    for (int i = 0; i < cpu->n_params; i++) tensor_copy(gpu->params[i].grad, cpu->params[i].grad);
    Tensor unclipped = on_cpu(cpu->params[1].grad);
    clip_grad_norm_split(cpu->params, cpu->n_params, owned, NULL, 0.001);  // (below the 0.01 clipped to above)
    clip_grad_norm_split_queued(gpu->params, gpu->n_params, owned, NULL, 0.001);
    size_t split_differ = bits_differ(&unclipped, cpu->params[1].grad) == 0;  // (an unowned tensor clipped too)
    for (int i = 0; i < cpu->n_params; i++) split_differ += bits_differ(gpu->params[i].grad, cpu->params[i].grad);
    tensor_free(&unclipped);
    free(owned);
    EXPECT(split_differ == 0, "clip_grad_norm_split_queued on the GPU, half the tensors owned: clip_grad_norm_split's "
           "clipped gradients on the CPU bit for bit, the unowned ones scaled too (%zu values differ)", split_differ);
    float host_row[13], host_expected[13];
    gpt_logits_row(gpu, 4, host_row), gpt_logits_row(cpu, 4, host_expected);
    double row_err = 0;
    for (int c = 0; c < 13; c++) row_err = fmax(row_err, fabs(host_row[c] - host_expected[c]));
    EXPECT(row_err < 1e-4, "gpt_logits_row copies a row of the GPU's logits to the host (max difference %.1e)", row_err);
    adamw_free(&opt_cpu), adamw_free(&opt_gpu);
    gpt_free(cpu), gpt_free(gpu);
}

// The scratch buffers' one type: it grows past a request by half again, keeps its memory (and its
// address) for any smaller request, and counts in the peak as every allocation does.
static void test_device_buffer(void) {
    DeviceBuffer buffer = {0};
    size_t mb = 1 << 20;
    void *first = device_buffer_reserve(&buffer, 8 * mb);
    size_t first_bytes = buffer.bytes;
    void *smaller = device_buffer_reserve(&buffer, 2 * mb);
    void *larger = device_buffer_reserve(&buffer, 16 * mb);
    size_t larger_bytes = buffer.bytes, peak = device_peak_bytes();
    device_buffer_free(&buffer);
    EXPECT(first && first_bytes >= 12 * mb && smaller == first && larger && larger_bytes >= 24 * mb
               && peak >= larger_bytes && !buffer.data && buffer.bytes == 0,
           "DeviceBuffer: 8 MB reserves %.1f MB; 2 MB reuses it (%s); 16 MB grows it to %.1f MB; freed, it is empty",
           (double)first_bytes / mb, smaller == first ? "same address" : "moved", (double)larger_bytes / mb);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
#if HAVE_CUDA
    // The binaries do not link cuBLAS; cublas_loader.c opens it on first use.
    // Asking it for a string needs no GPU, so this runs everywhere.
    const char *status = cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT(status && strstr(status, "not initialized"),
           "cuBLAS is opened on first use (dlopen) and answers: \"%s\"", status ? status : "(null)");
#endif
    const char *require = getenv("REQUIRE_GPU");
    if (device_gpu_count() == 0) {
        if (require && strcmp(require, "1") == 0) EXPECT(0, "GPU kernels against the CPU: REQUIRE_GPU=1, but no GPU");
        else printf("SKIP %s: GPU kernels against the CPU (skipped: no GPU)\n", TEST_NAME);
        dist_finalize();
        return test_summary();
    }
    Device device = device_from_flag("cuda");
    printf("(%s)\n", device_name(device));
    rng_seed(&data_rng, 2024);
    test_copies_and_elementwise();
    test_peak_bytes();
    test_device_buffer();
    test_gemm();
    test_mlp_cross_entropy_adam();
    test_mlp_kept_bfloat16();
    test_adam_one_launch();
    test_tensors_fill();
#if HAVE_CUDA
    test_device_table();
#endif
    test_mlp_mse_sgd();
    test_gather();
    test_cnn_ops();
#if HAVE_CUDA
    test_sum_of_rows();
#endif
    test_cnn_model();
#if HAVE_CUDA
    test_sort_groups();
    test_rating_sampler();
#endif
    test_mf();
    test_transformer_ops();
    test_gpt_model();
#if HAVE_CUDA
    // The grid-stride kernels index in 32 bits where a tensor allows
    // (kernels.cu): their 64-bit versions, which only tensors of over 4 G
    // elements take, run here on the same checks.
    gpu_force_64_bit_indices(1);
    test_name = "test_gpu (64-bit indices)";
    test_copies_and_elementwise();
    test_mlp_cross_entropy_adam();
    test_mlp_mse_sgd();
    test_cnn_ops();
    test_cnn_model();
    test_gather();
    gpu_force_64_bit_indices(0);
#endif
    dist_finalize();
    return test_summary();
}
