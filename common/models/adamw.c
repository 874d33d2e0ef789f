// adamw.c: gradient clipping and AdamW. See adamw.h.
#include "models/adamw.h"

#include <math.h>
#include <stdlib.h>

#include "base/check.h"
#include "base/cpu_dispatch.h"
#include "runtime/profile.h"

// A parameter's dimensions as its state_dict has them (h5.c stores it so): a bias or a
// LayerNorm weight [1, n] is 1-D, a matrix 2-D, a Param with its own dims as many as it names.
static int param_ndim(const Param *p) {
    if (p->dims[0] > 0) {
        int n = 0;
        while (n < 4 && p->dims[n] > 0) n++;
        return n;
    }
    return p->value->rows == 1 ? 1 : 2;
}

AdamW adamw_new(Param *params, int n_params, double weight_decay, double beta1, double beta2) {
    AdamW optimizer = {.adam = adam_new(params, n_params, 0.0), .weight_decay = weight_decay};
    optimizer.adam.beta1 = beta1;
    optimizer.adam.beta2 = beta2;
    optimizer.decays = xmalloc((size_t)n_params * sizeof(bool));
    for (int i = 0; i < n_params; i++) optimizer.decays[i] = param_ndim(&params[i]) >= 2;
    return optimizer;
}

void adamw_count(const AdamW *o, int *decay_tensors, long *decay_values, int *other_tensors, long *other_values) {
    *decay_tensors = *other_tensors = 0;
    *decay_values = *other_values = 0;
    for (int i = 0; i < o->adam.n_params; i++) {
        long n = (long)tensor_numel(o->adam.params[i].value);
        if (o->decays[i]) ++*decay_tensors, *decay_values += n;
        else ++*other_tensors, *other_values += n;
    }
}

void adamw_step(AdamW *o, double lr) {
    // param.mul_(1 - lr * weight_decay): the factor in double, as Python computes it, then float.
    float keep = (float)(1.0 - lr * o->weight_decay);
    if (o->weight_decay != 0.0)
        for (int i = 0; i < o->adam.n_params; i++)
            if (o->decays[i]) tensor_scale(o->adam.params[i].value, keep);
    o->adam.lr = lr;
    adam_step(&o->adam);
}

void adamw_free(AdamW *o) {
    adam_free(&o->adam);
    free(o->decays);
}

// Blocks of a fixed size, each a thread's, summed in block order: the same bits on any number of threads.
enum { NORM_BLOCK = 4096 };

// The sum of squares of x[0..n) in double, in an order fixed by n: 8 running sums (sum j takes
// x[j], x[j + 8], ...), added pairwise, then the last n % 8 values. One running sum was a chain
// of dependent additions, 4 cycles a value (without -ffast-math the compiler may not reorder
// them): 3% of step 19's training step at 1 thread (perf); 8 lanes vectorise.
CPU_DISPATCHED static double sum_of_squares(const float *restrict x, size_t n) {
    enum { LANES = 8 };
    double lane[LANES] = {0};
    size_t k = 0;
    for (; k + LANES <= n; k += LANES)
        for (int j = 0; j < LANES; j++) lane[j] += (double)x[k + j] * x[k + j];
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) lane[j] += lane[j + width];
    double sum = lane[0];
    for (; k < n; k++) sum += (double)x[k] * x[k];
    return sum;
}

double clip_grad_norm(const Param *params, int n_params, double max_norm) {
    profile_push("clip_grad_norm");
    double total = 0.0;
    for (int i = 0; i < n_params; i++) {
        const Tensor *g = params[i].grad;
        CHECK(!tensor_on_gpu(g), "clip_grad_norm: %s is on the GPU (step 19's GPU path is not written yet)", params[i].name);
        size_t n = tensor_numel(g);
        long blocks = (long)((n + NORM_BLOCK - 1) / NORM_BLOCK);
        double *partial = xmalloc((size_t)(blocks ? blocks : 1) * sizeof(double));
#pragma omp parallel for schedule(static)
        for (long b = 0; b < blocks; b++) {
            size_t start = (size_t)b * NORM_BLOCK, end = start + NORM_BLOCK < n ? start + NORM_BLOCK : n;
            partial[b] = sum_of_squares(g->data + start, end - start);
        }
        for (long b = 0; b < blocks; b++) total += partial[b];
        free(partial);
    }
    double norm = sqrt(total);
    // clip_coef = max_norm / (total_norm + 1e-6), clamped to 1: a float32 tensor in torch.
    float coef = (float)(max_norm / ((float)norm + 1e-6));
    if (coef < 1.0f)
        for (int i = 0; i < n_params; i++) tensor_scale(params[i].grad, coef);
    profile_pop();
    return norm;
}
