// divergence.h: a training that diverged (a loss, a test result or a weight that is not a finite number)
// ends on every rank at the same point, with one line, exit status 1, and nothing saved.
//
//   float loss = mlp_loss(&model, labels);
//   dist_allreduce_sum(&loss, 1);                               // already there, for the log
//   loss /= world;
//   check_loss_finite(loss, losses.n + 1, epoch + 1, run);      // before the loss is logged
//   ...
//   check_weights_finite(model.params, model.n_params, losses.n, opt.epochs, run);  // after the loop
//
// PyTorch trains on NaN in silence: `--lr 1e308` ends "Test accuracy: 9.80%" and saves NaN weights.
// Here the first non-finite loss stops the run, on rank 0's behalf:
//   [rank 0 @ vm] loss is nan at step 2 (epoch 1): training diverged; --lr 1e+308 is likely too large (or the
//   data or --init's weights hold extreme values); stopped before writing anything: files already there are kept
// The programs write their outputs (--save, --losses, --plot, step 13's snapshots) only after these
// checks, so a file of an earlier, good run is never replaced by a diverged one. Rank 0's MLflow run is
// marked FAILED.
//
// Agreement, and what it costs. A rank that stopped alone would leave the others waiting in their next
// collective, so every rank must reach the same verdict at the same step:
//   - check_loss_finite takes a loss that is already the same on every rank: the programs allreduce
//     their loss for the log, and a NaN or inf on any rank makes that sum non-finite on all of them
//     (an allreduce gives every rank the same bits). It costs a comparison: no communication, and on
//     a GPU no host round trip of its own: it takes the loss when the host has it, every step where
//     the loss is read back every step (tensor_ops.c), at the epoch's end where the steps' losses stay
//     on the GPU until then (train/step_losses.h: steps 2-4, 6-8, 10, 11, 13, 14), as late as a nan is noticed.
//   - check_loss_finite_agreed is for a loss that each rank has alone (step 3's independent
//     trainings, test_profile's rank-0 batch): one allreduce of an int per step, a few microseconds.
//   - check_weights_finite (collective) reads every rank's weights once, after the last step, whose
//     update no loss has seen yet: a finite last loss can leave NaN weights, and a test accuracy
//     from NaN logits is a finite, meaningless 9.80%. Once per run (a host copy on a GPU).
//   - check_result_finite (collective) takes an evaluation's result (a test loss, an RMSE): one
//     allreduce of an int per evaluation.
#pragma once
#include "models/nn.h"         // Param
#include "records/tracking.h"  // Tracking: rank 0 marks the run FAILED

// `loss` of optimizer step `step` (counted from 1, over the whole run) in epoch `epoch` (from 1; 0 for a
// program that counts only steps).
// The same value on every rank; no communication.
void check_loss_finite(double loss, long step, int epoch, Tracking *run);
// The same for a loss that each rank computed alone. Collective.
void check_loss_finite_agreed(double loss, long step, int epoch, Tracking *run);
// An evaluation's result after epoch `epoch` (from 1; 0 for a program that counts only steps, whose `what`
// says when: "val loss at iteration 250"): `what` names it ("test RMSE"). Collective: every
// rank passes its value (rank 0's alone may be the result, after a reduce to rank 0).
void check_result_finite(double value, const char *what, int epoch, Tracking *run);
// Every value of this rank's parameters (its shard, where the model is split), after `steps` steps
// and `epochs` epochs. Collective: every rank calls it, with its own parameters.
void check_weights_finite(const Param *params, int n_params, long steps, int epochs, Tracking *run);
