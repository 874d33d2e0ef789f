// zero1.h: ZeRO stage 1 (DeepSpeed's zero_optimization.stage 1, PyTorch's ZeroRedundancyOptimizer)
// for any model's parameters, with nanoGPT's AdamW: the optimizer's state sharded over a
// data-parallel group.
//
//   Zero1 zero = zero1_new(model->params, model->n_params, &data_parallel, 0.1, 0.9, 0.99);
//   ...                                 // backward; DDP's allreduce: every replica's gradients whole
//   zero1_step(&zero, lr);              // optimizer.step(): AdamW on my 1/D, then the parameters gathered
//
// Each tensor of n values is cut into D blocks of ceil(n / D) (the last shorter, or empty); rank d
// keeps Adam's two moments of block d only, updates block d of the parameter from block d of the
// (allreduced) gradient, and the D updated blocks are all-gathered into every replica's tensor.
// AdamW is elementwise, so the parameters are those of an AdamW over the whole tensors, bit for bit:
// only the memory changes (the moments 2 P / D floats a rank, not 2 P) and one all-gather of the
// parameters is added per step (what step 18's stage 1 does on the MLP's flat units).
//
// Layers: above adamw (models) and collectives (the group's all-gather).
#pragma once
#include "comm/group.h"
#include "models/adamw.h"

typedef struct {
    const Group *group;
    Param *params;       // the model's: [n_params]
    int n_params;
    size_t *block;       // [n_params]: ceil(numel / D), each rank's block of tensor i
    Param *blocks;       // [n_params]: views of this rank's block of each tensor (value and gradient)
    Tensor *views;       // [2 n_params]: the views' tensors
    AdamW optimizer;     // over the blocks
    Tensor staging;      // [1, D x the largest block]: the all-gather's buffer
} Zero1;

// Collective over nothing (the cut is arithmetic); the group must outlive it.
Zero1 zero1_new(Param *params, int n_params, const Group *group, double weight_decay, double beta1, double beta2);
// adamw_step on this rank's blocks, then each tensor's blocks all-gathered over the group. Collective.
void zero1_step(Zero1 *zero, double lr);
// The moments' floats this rank holds (2 x the sum of its blocks).
size_t zero1_state_floats(const Zero1 *zero);
void zero1_free(Zero1 *zero);
