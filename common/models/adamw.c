// adamw.c: gradient clipping and AdamW. See adamw.h.
#include "models/adamw.h"

#include <math.h>
#include <stdlib.h>

#include "base/check.h"
#include "comm/collectives.h"
#include "runtime/profile.h"
#include "tensor/tensor_ops.h"

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
    o->adam.lr = lr;
    adam_step_decayed(&o->adam, o->weight_decay != 0.0 ? o->decays : NULL, keep);
}

void adamw_free(AdamW *o) {
    adam_free(&o->adam);
    free(o->decays);
}

double clip_grad_norm(const Param *params, int n_params, double max_norm) {
    return clip_grad_norm_split(params, n_params, NULL, NULL, max_norm);
}

void clip_grad_norm_queued(const Param *params, int n_params, double max_norm) {
    if (n_params == 0 || !tensor_on_gpu(params[0].grad)) {
        clip_grad_norm(params, n_params, max_norm);
        return;
    }
    profile_push("clip_grad_norm");
    Tensor **grads = xmalloc((size_t)n_params * sizeof(Tensor *));
    for (int i = 0; i < n_params; i++) grads[i] = params[i].grad;
    scale_to_norm_on_gpu(grads, n_params, sum_of_squares_on_gpu(grads, n_params), max_norm);
    free(grads);
    profile_pop();
}

void clip_grad_norm_split_queued(const Param *params, int n_params, const bool *owned, const Group *group, double max_norm) {
    if (n_params == 0 || !tensor_on_gpu(params[0].grad)) {
        clip_grad_norm_split(params, n_params, owned, group, max_norm);
        return;
    }
    profile_push("clip_grad_norm");
    Tensor **grads = xmalloc((size_t)n_params * sizeof(Tensor *)), **mine = xmalloc((size_t)n_params * sizeof(Tensor *));
    int n_owned = 0;
    for (int i = 0; i < n_params; i++) {
        grads[i] = params[i].grad;
        if (!owned || owned[i]) mine[n_owned++] = params[i].grad;
    }
    CHECK(n_owned > 0, "clip_grad_norm_split_queued: this rank owns none of its %d gradients", n_params);
    double *squares = sum_of_squares_on_gpu(mine, n_owned);                  // this rank's share of the sum
    if (group && group->size > 1) group_all_reduce_doubles_on_gpu(group, squares, 1);  // the model's, on the GPU
    scale_to_norm_on_gpu(grads, n_params, squares, max_norm);
    free(grads), free(mine);
    profile_pop();
}

double clip_grad_norm_split(const Param *params, int n_params, const bool *owned, const Group *group, double max_norm) {
    profile_push("clip_grad_norm");
    Tensor **grads = xmalloc((size_t)(n_params ? n_params : 1) * sizeof(Tensor *));
    int n_owned = 0;
    for (int i = 0; i < n_params; i++)
        if (!owned || owned[i]) grads[n_owned++] = params[i].grad;
    double squares = sum_of_squares(grads, n_owned);  // (on a GPU, the host waits for it here)
    if (group && group->size > 1) CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &squares, 1, MPI_DOUBLE, MPI_SUM, group->mpi));
    double norm = sqrt(squares);
    free(grads);
    // clip_coef = max_norm / (total_norm + 1e-6), clamped to 1: a float32 tensor in torch.
    float coef = (float)(max_norm / ((float)norm + 1e-6));
    if (coef < 1.0f)
        for (int i = 0; i < n_params; i++) tensor_scale(params[i].grad, coef);
    profile_pop();
    return norm;
}
