// pipeline_stage.h: one pipeline stage of the workshop's MLP, a run of its
// Linear layers, as torch.distributed.pipelining's PipelineStage wraps a
// slice of the nn.Sequential, with the activations of every micro-batch in
// flight (forwarded, not yet backwarded).
//
//   Stage stage = stage_new(sizes, n_sizes, 2, 4, rows, &rng, device);  // layers 2 and 3: fc.4, fc.6
//   Tensor *in = stage_input(&stage, i, rows);             // receive micro-batch i's activations here
//   const Tensor *out = stage_forward(&stage, i, in);      // then send `out` to the next stage
//   ...
//   Tensor *grad_out = stage_grad_output(&stage, rows);    // receive d loss / d out here
//   const Tensor *grad_in = stage_backward(&stage, i, ddp_grad_ready, &ddp);  // send it back
//
// The first stage's input is the data (stage_forward takes the batch's rows
// as they are); the last stage's output is the logits, and stage_loss_to gives
// the loss and starts its backward. The same operations in the same order
// as mlp_forward, mlp_loss and mlp_backward: a model cut into stages, run one
// micro-batch per batch, computes the whole model's bits.
//
// Memory: a micro-batch's activations (its input, unless it is the data, and
// every layer's output; on the last stage, the loss's gradient too, which
// GPipe computes M forwards before its backward) live in a slot from its
// forward to the end of its backward. Slots are allocated when none is free and reused after, so the
// bytes allocated are the most the schedule ever held at once: measured, as
// torch.cuda.max_memory_allocated measures, not computed from the schedule.
//
// Layers: above nn (Linear, Param) and tensor_ops.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "models/nn.h"
#include "runtime/memory_budget.h"  // MemoryNeed

typedef struct {
    int micro_batch;  // -1: free
    int capacity;     // rows
    Tensor input;     // [capacity, in]: what the previous stage sent (not on the first stage)
    Tensor x;         // the forward's input (a view: `input`, or the data's rows on the first stage)
    bool forwarded;
    Tensor *outputs;  // [n_layers] of [capacity, out_l]: kept for backward
    Tensor grad_logits;  // last stage: [capacity, classes], d loss / d logits from the forward's loss
} StageSlot;

typedef struct {
    int first_layer, n_layers;  // layers [first_layer, first_layer + n_layers) of the whole MLP
    bool is_first, is_last;     // holds the model's input layer / its output layer and the loss
    int in_features, out_features;
    Linear *layers;             // [n_layers]
    int n_params;
    Param *params;              // fc.<2l>.weight, fc.<2l>.bias of its layers l, in model.parameters() order
    int rows;                   // the rows of a micro-batch the slots are made for
    size_t slot_floats_per_row; // a slot's floats per row: its input (not on the first stage), outputs, loss gradient
    Device device;
    StageSlot *slots;           // allocated on demand: n_slots of them exist
    int n_slots, live, peak_live;
    Tensor *grad_scratch;       // [n_layers]: d loss / d output of each layer, one backward at a time
    Tensor grad_input;          // [rows, in]: d loss / d input, for the previous stage
} Stage;

// Layers [first_layer, end_layer) of the MLP of `sizes` (sizes = {784, 512, 512, 10}:
// three Linears). Every layer of the whole model is initialised in order from
// rng, as mlp_new does, so the stage holds mlp_new's values for its layers;
// the others are dropped as soon as made.
Stage stage_new(const int *sizes, int n_sizes, int first_layer, int end_layer, int rows, Rng *rng, Device device);
void stage_free(Stage *stage);
// What stage_new(sizes, n_sizes, first_layer, end_layer, rows) and its training
// under DDP and Adam will hold, added to `need` (memory_budget.h) before anything
// is allocated: the parameters, gradients, Adam's moments, DDP's copy of the
// gradients, and `max_in_flight` slots of activations (schedule_max_in_flight),
// counted as stage_peak_activation_bytes measures them, with the backward's scratch.
void stage_add_memory_need(MemoryNeed *need, const int *sizes, int n_sizes, int first_layer, int end_layer, int rows,
                           int max_in_flight);

// The slot for micro-batch i, taken now; its input buffer [rows, in], where
// the previous stage's activations are to be received (not on the first stage).
Tensor *stage_input(Stage *stage, int micro_batch, int rows);
// Forward of micro-batch i from x: the slot's input, or on the first stage
// the data rows (the slot is taken here). Returns the output [rows, out].
const Tensor *stage_forward(Stage *stage, int micro_batch, const Tensor *x);
// Last stage: the cross-entropy of micro-batch i's logits (its mean over the
// rows), and d loss / d logits times `weight` (the micro-batch's share of the
// batch) to start its backward: criterion(output, target) * weight. The loss goes
// to `slot` (train/step_losses.h: on a GPU it stays there, and the host does not
// wait), weighted as the slot says: loss = 0; loss += weight * criterion(...).
// device_labels: the labels already on the GPU, or NULL to copy `labels` there (mlp_loss_to's).
void stage_loss_to(Stage *stage, int micro_batch, const int *labels, const int *device_labels, float weight,
                   LossSlot slot);
// Not the last stage: where the next stage's d loss / d output is received.
Tensor *stage_grad_output(Stage *stage, int rows);
// Backward of micro-batch i from stage_grad_output's or stage_loss_to's
// gradient: accumulates the parameters' gradients (the hook hears of each,
// as mlp_backward's), frees the slot, and returns d loss / d input for the
// previous stage (NULL on the first stage: the input is data).
const Tensor *stage_backward(Stage *stage, int micro_batch, GradReadyHook hook, void *context);
// Forward only (evaluation, under torch.no_grad()): micro-batch i's slot is free again.
void stage_release(Stage *stage, int micro_batch);
void stage_zero_grad(Stage *stage);
// The most bytes of activations held at once so far (slots x their size).
size_t stage_peak_activation_bytes(const Stage *stage);
// Floating-point operations of one sample's forward through the stage, 2 a
// multiply-add (its backward takes twice as many).
double stage_flops_per_sample(const Stage *stage);
