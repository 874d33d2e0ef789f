// adamw.h: the optimizer step of nanoGPT's train.py: clip_grad_norm_, then AdamW.
//
//   AdamW optimizer = adamw_new(model->params, model->n_params, 0.1, 0.9, 0.99);  // configure_optimizers
//   ...
//   clip_grad_norm(model->params, model->n_params, 1.0);   // torch.nn.utils.clip_grad_norm_
//   adamw_step(&optimizer, lr_at(&schedule, iter));        // optimizer.step() at this iteration's lr
//
// AdamW (torch.optim.AdamW, single-tensor, as on the CPU): param *= 1 - lr * weight_decay (decoupled
// weight decay), then Adam's update (nn.h's, PyTorch's operation order). As configure_optimizers
// groups them, only parameters of 2 or more dimensions decay (the Linears' weights and the
// embeddings); biases and LayerNorm weights do not.
#pragma once
#include <stdbool.h>

#include "comm/group.h"  // Group: the ranks a split model's norm is summed over
#include "models/nn.h"  // Adam, Param

typedef struct {
    Adam adam;         // the moments, betas, eps and step count
    double weight_decay;
    bool *decays;      // [n_params]: does params[i] decay (2 or more dimensions)?
} AdamW;

AdamW adamw_new(Param *params, int n_params, double weight_decay, double beta1, double beta2);
void adamw_step(AdamW *optimizer, double lr);
void adamw_free(AdamW *optimizer);
// How many of the parameters' values decay, and how many do not ("num decayed parameter tensors: 18,
// with 800,768 parameters" in nanoGPT's words).
void adamw_count(const AdamW *optimizer, int *decay_tensors, long *decay_values, int *other_tensors, long *other_values);

// torch.nn.utils.clip_grad_norm_(params, max_norm): the gradients' global L2 norm over every
// parameter (squares summed in double, in a fixed order), and, when it exceeds max_norm, every
// gradient scaled by max_norm / (norm + 1e-6). Returns the norm before clipping.
double clip_grad_norm(const Param *params, int n_params, double max_norm);
// The same clip, the norm never read by the host (on a GPU: queued on the compute stream, the
// coefficient computed there, the same bits; no host wait in a training step). On a CPU clip_grad_norm.
void clip_grad_norm_queued(const Param *params, int n_params, double max_norm);
// The same for a model split across `group`'s ranks (step 20: a replica's tensor- and pipeline-
// parallel ranks): the squares of the gradients this rank owns (owned[i]; a replicated tensor is
// owned by one rank only) summed over the group make the global norm, and every rank scales all of
// its own gradients. Collective over the group.
double clip_grad_norm_split(const Param *params, int n_params, const bool *owned, const Group *group, double max_norm);
// The same, the norm never read by the host (on a GPU: the sum of squares summed over the group
// there, NCCL on the GPU, as clip_grad_norm_queued's). On a CPU clip_grad_norm_split.
void clip_grad_norm_split_queued(const Param *params, int n_params, const bool *owned, const Group *group, double max_norm);
