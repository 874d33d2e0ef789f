// step_graph.h: a training step replayed from a CUDA graph (torch.cuda.graphs): its kernels,
// GEMMs and copies captured once, then queued again in one launch a step, not one by one.
//
//   StepGraph graph = step_graph_new(device, cuda_graph, false);  // --cuda_graph on|off (on: a GPU's default)
//   for (...) {
//       Tensor x = mnist_batch(...);                          // into the same buffers every step
//       adam_prepare_step(&optimizer);                        // what changes step by step, on the GPU first
//       if (!step_graph_replay(&graph, x.rows)) {             // the captured step, where it holds this shape
//           step_graph_begin(&graph, x.rows);                 // captured (the warm-up's shape, again) or not
//           mlp_zero_grad(&model); mlp_forward(&model, &x);
//           mlp_loss_to(&model, labels, device_labels, step_graph_loss(&graph));
//           mlp_backward(&model, &x, NULL, NULL);
//           adam_apply_step(&optimizer);
//           step_graph_end(&graph);                           // a capture is launched here
//       }
//       step_graph_hand_loss(&graph, step_losses_next(&pending));  // the step's loss, where the log takes it
//   }
//
// A graph replays its capture's kernels with their capture's arguments: the same shapes and
// pointers every step. So what changes lives in device memory written before each launch (the
// batch, gathered into the same buffers; Adam's step-dependent coefficients, adam_prepare_step), the
// step's loss goes to the graph's own slot, copied on the GPU to where the log reads it, and a batch
// of another shape (the epoch's last, shorter one) runs eagerly. The capture follows one eager
// step of the same shape (PyTorch's warm-up before torch.cuda.graph): the buffers that grow on first
// use have grown, as nothing may allocate or wait for the GPU inside a capture. The same operations
// on the same data: the same bits as the eager step (tests/test_gpu.sh checks).
//
// With NCCL between ranks the step's collectives are captured too, on their own stream, as
// torch.cuda.graphs allows: the communication stream forks from the compute stream at an event and
// joins it again (comm/collectives.c, DDP's buckets in parallel/ddp_gpu.c), so the graph holds both
// streams and the order between them; every rank replays the same collectives in the same order. A
// replay runs no host code: what the host times in a step with events (DDP's overlap, step 15's
// communication time) is not timed where the step was captured, and the reports say so. NCCL asks
// that a collective be captured, and replayed, on every rank alike: so the batch's rows must be the
// same on every rank (a global batch's size), and a graph holding collectives (`across_ranks`) is
// dropped on every rank as soon as a buffer moved on any (one MPI_Allreduce of an int a step, on
// the host). Ranks that share a GPU reduce through MPI on host copies, which no graph can hold:
// their steps run eagerly.
//
// Off (a CPU rank, --cuda_graph off, a build without CUDA), every step runs eagerly through the
// same calls; the loss still goes through the slot (a copy more).
//
// Layers: above runtime (device) and tensor (LossSlot).
#pragma once
#include <stdbool.h>

#include "runtime/device.h"
#include "tensor/tensor_ops.h"  // LossSlot

typedef struct {
    bool enabled;              // graphs on: a GPU rank with --cuda_graph on
    Device device;
    float *loss;               // the step's loss: device memory on a GPU rank, host memory on a CPU rank
    int eager_rows;            // the last eager step's batch rows (a capture follows one of the same)
    int captured_rows;         // the graph's batch rows (0: none yet)
    bool capturing;
    struct DeviceGraph *graph;
    long replays;              // steps replayed from the graph
    int captures;              // graphs captured: 1, or more where a buffer the step uses moved (step_graph_replay)
    long buffer_moves;         // device_buffer_moves() at the capture
    bool across_ranks;         // the step holds collectives: each rank replays, or captures, when all do
} StepGraph;

// `across_ranks`: the step holds collectives over the world's ranks (NCCL's), so the ranks decide
// together (rows: the same on every rank).
StepGraph step_graph_new(Device device, bool enabled, bool across_ranks);
// Launches the captured step if it holds a batch of `rows`; false (nothing done) otherwise. A graph
// captured before a DeviceBuffer moved (device_buffer_moves) is dropped first, and captured again
// after the next eager step of the shape: what runs between steps may grow the step's buffers.
// Collective where the graph is `across_ranks` and one is captured.
bool step_graph_replay(StepGraph *graph, int rows);
// Before an eager step of `rows`: captures it (then step_graph_end launches it) when graphs are on,
// none is captured yet, and the step before had the same rows (the warm-up).
void step_graph_begin(StepGraph *graph, int rows);
void step_graph_end(StepGraph *graph);
// Where the step's loss goes (weight 1): the graph's slot.
LossSlot step_graph_loss(const StepGraph *graph);
// The step's loss into `slot` (train/step_losses.h's step_losses_next: weight 1, not accumulated),
// queued after the step; the step is then queued (the simulated GPU counts per step).
void step_graph_hand_loss(StepGraph *graph, LossSlot slot);
// The run's "CUDA graph:" line (rank 0, after training): how many of `steps` were replayed from how
// many captures; where graphs were asked for (`wanted`: --cuda_graph on, a GPU) but not enabled
// (ranks that share a GPU put MPI's collectives in the step: `collectives` names them, "DDP's
// allreduces"), why none were; nothing where none were asked for.
void step_graph_report(const StepGraph *graph, bool wanted, long steps, int world, const char *collectives);
void step_graph_free(StepGraph *graph);
