// mlp_ops_bench: where a training step of step 2 spends its time, phase by phase, on the CPU or a
// GPU (issue 40's steady step): what the first step pays once (the split's upload, cuBLAS's first
// call, each phase's first run), the batch's gather, each phase of the step, the three GEMMs alone
// (with their FLOP rate), and the whole step eager and, on a GPU, replayed from a CUDA graph.
//   mlp_ops_bench [cpu|cuda] [MNIST_DIR] [BATCH] [float32|bfloat16]   e.g. mlp_ops_bench cuda data/mnist 6400
// Each line is the median per call of REPEATS timed runs of n calls, the device synchronised around
// each run (op_timer.h). Part of make bench's GPU figures (docs/gpus.md); nothing here is asserted.
#include <stdio.h>
#include <stdlib.h>

#include "data/mnist.h"
#include "models/nn.h"
#include "runtime/dist.h"
#include "train/step_graph.h"
#include "op_timer.h"  // TIME

enum { HIDDEN = 128, CALLS = 20 };

// The step of day1/2_mnist_training after adam_prepare_step (which goes before a graph's capture).
static void train_step(Mlp *model, Adam *optimizer, const Tensor *x, const int *labels, const int *device_labels,
                       LossSlot slot) {
    mlp_zero_grad(model);
    mlp_forward(model, x);
    mlp_loss_to(model, labels, device_labels, slot);
    mlp_backward(model, x, NULL, NULL);
    adam_apply_step(optimizer);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    const char *flag = argc > 1 ? argv[1] : "auto", *data = argc > 2 ? argv[2] : "data/mnist";
    int B = argc > 3 ? atoi(argv[3]) : 6400;
    if (B < 1 || B > 60000) {
        fprintf(stderr, "usage: %s [cpu|cuda|auto] [MNIST_DIR] [BATCH] [float32|bfloat16] (1 <= BATCH <= 60000)\n", argv[0]);
        return 2;
    }
    Device device = device_from_flag(flag);
    matmul_set_dtype(matmul_dtype_from_flag(argc > 4 ? argv[4] : "float32"));  // before mlp_new (nn.h)
    MnistSplit train = mnist_load(data, MNIST_TRAIN);
    DistributedSampler sampler = sampler_new(train.n, 1, 0, true, 0);
    sampler_set_epoch(&sampler, 0);
    const int sizes[] = {MNIST_PIXELS, HIDDEN, MNIST_CLASSES};
    Rng rng;
    rng_seed(&rng, 0);
    Mlp model = mlp_new(sizes, 3, B, &rng, device);
    Adam optimizer = adam_new(model.params, model.n_params, 1e-3);
    Tensor images = tensor_zeros(B, MNIST_PIXELS, device);
    int *labels = malloc((size_t)B * sizeof *labels);
    StepGraph graph = step_graph_new(device, true, false);
    printf("Step 2's step at batch %d, MLP 784-%d-10, %s matmuls, on %s (each line: per call)\n", B, HIDDEN,
           matmul_dtype() == MATMUL_BFLOAT16 ? "bfloat16" : "float32", device_name(device));

    // What the first epoch pays once, each part timed to the device's end of it: the split's upload
    // (at the first gather on a GPU), the first GEMM (of 1 x 1 matrices: what cuBLAS, or the CPU's BLAS,
    // does once, whatever the shape), and each phase of the first step, which loads its
    // kernels (CUDA loads a module at its first launch) and meets each GEMM's shape for the first
    // time (cuBLAS picks its kernel).
    printf("once, cold:\n");
    device_synchronize();
    double start = wall_seconds();
    Tensor x = mnist_batch(&train, &sampler, 0, B, &images, labels);
    device_synchronize();
    printf("  %-44s %10.3f ms\n", "the first gather (the split's upload)", 1e3 * (wall_seconds() - start));
    const int *device_labels = mnist_batch_device_labels(&train);
    LossSlot slot = step_graph_loss(&graph);
    {
        Tensor one[3] = {tensor_zeros(1, 1, device), tensor_zeros(1, 1, device), tensor_zeros(1, 1, device)};
        start = wall_seconds();
        gemm(false, false, 1.0f, &one[0], &one[1], 0.0f, &one[2]);
        device_synchronize();
        printf("  %-44s %10.3f ms\n", "the first GEMM, 1 x 1 (the library's start)", 1e3 * (wall_seconds() - start));
        for (int i = 0; i < 3; i++) tensor_free(&one[i]);
    }
    double step_start = wall_seconds();
#define FIRST(what, call)                                                      \
    do {                                                                       \
        start = wall_seconds();                                                \
        call;                                                                  \
        device_synchronize();                                                  \
        printf("  %-44s %10.3f ms\n", what, 1e3 * (wall_seconds() - start)); \
    } while (0)
    FIRST("the first step: zero_grad", mlp_zero_grad(&model));
    FIRST("the first step: forward", mlp_forward(&model, &x));
    FIRST("the first step: loss", mlp_loss_to(&model, labels, device_labels, slot));
    FIRST("the first step: backward", mlp_backward(&model, &x, NULL, NULL));
    FIRST("the first step: Adam (prepare + apply)", { adam_prepare_step(&optimizer); adam_apply_step(&optimizer); });
#undef FIRST
    printf("  %-44s %10.3f ms\n", "the first step, all of it", 1e3 * (wall_seconds() - step_start));
    printf("the step, by phase:\n");
    TIME("gather the batch (mnist_batch)", CALLS, mnist_batch(&train, &sampler, 0, B, &images, labels));
    TIME("zero_grad", CALLS, mlp_zero_grad(&model));
    TIME("forward", CALLS, mlp_forward(&model, &x));
    TIME("loss (cross-entropy into a slot)", CALLS, mlp_loss_to(&model, labels, device_labels, slot));
    // (With bfloat16, a backward without its forward rounds W2 itself: the weights' copies last from a
    // forward to its backward, nn.h. The whole step's lines below are the step as it runs.)
    TIME("backward", CALLS, mlp_backward(&model, &x, NULL, NULL));
    TIME("Adam (prepare + apply)", CALLS, { adam_prepare_step(&optimizer); adam_apply_step(&optimizer); });
    TIME("whole step, eager", CALLS, {
        adam_prepare_step(&optimizer);
        train_step(&model, &optimizer, &x, labels, device_labels, slot);
    });
    if (graph.enabled) {
        device_synchronize();
        start = wall_seconds();
        for (int s = 0; s < 2; s++) {  // a warm-up step, then the capture (step_graph.h)
            adam_prepare_step(&optimizer);
            step_graph_begin(&graph, B);
            train_step(&model, &optimizer, &x, labels, device_labels, step_graph_loss(&graph));
            step_graph_end(&graph);
        }
        device_synchronize();
        printf("  %-44s %10.3f ms\n", "an eager step, then one captured and launched", 1e3 * (wall_seconds() - start));
        TIME("whole step, replayed from its CUDA graph", CALLS, {
            adam_prepare_step(&optimizer);
            step_graph_replay(&graph, B);
        });
    }

    // The GEMMs alone, as linear_forward and linear_backward call them.
    Tensor hidden = tensor_zeros(B, HIDDEN, device), w1 = tensor_zeros(HIDDEN, MNIST_PIXELS, device);
    tensor_fill(&w1, 0.01f), tensor_fill(&hidden, 0.1f);
    double flops = 2.0 * B * MNIST_PIXELS * HIDDEN;
    printf("layer 1's GEMMs alone (%.2f GFLOP each):\n", flops / 1e9);
    TIME("forward: x [B, 784] w1^T [784, 128]", CALLS, gemm(false, true, 1.0f, &x, &w1, 0.0f, &hidden));
    TIME("weight gradient: grad_h^T [128, B] x [B, 784]", CALLS, gemm(true, false, 1.0f, &hidden, &x, 0.0f, &w1));

    tensor_free(&hidden), tensor_free(&w1), tensor_free(&images);
    free(labels);
    step_graph_free(&graph);
    adam_free(&optimizer);
    mlp_free(&model);
    sampler_free(&sampler);
    mnist_free(&train);
    dist_finalize();
    return 0;
}
