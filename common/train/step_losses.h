// step_losses.h: each step's loss kept where it was computed, and read by the host when it prints.
//
//   StepLosses pending = step_losses_new(n_batches, device);
//   for (int b = 0; b < n_batches; b++) {
//       ...
//       mlp_loss_to(&model, labels, device_labels, step_losses_next(&pending));  // losses.append(loss.detach())
//       ...
//       for (float loss; step_losses_take(&pending, b == n_batches - 1, &loss);) {
//           check_loss_finite(loss, ...); loss_log_add(...); loss_sum += loss;    // in step order
//       }
//   // or, where each step's loss is summed over the ranks first (DDP's log of the global batch):
//       float *taken;
//       int n = step_losses_take_all(&pending, b == n_batches - 1, &taken);
//       dist_allreduce_sum(taken, n);   // one collective for all of them
//       for (int i = 0; i < n; i++) ... taken[i] / world ...
//   }
//
// PyTorch's loss.item() every step makes the host wait for the GPU every step: the queue of launched
// work drains, and the next step's launches start from an idle GPU. On a GPU rank the losses stay in
// device memory, and step_losses_take hands them to the host when `due` (the epoch's last step, or a
// print): one copy into page-locked memory, one wait, for all the steps since the last. So a non-finite
// loss is noticed there, at the end of its epoch (or at the next print), and stops the run then, naming
// its step, before anything is written (divergence.h). On a CPU rank the loss is on the host already:
// every call hands it over at once, and a CPU run does exactly what it did with mlp_loss.
#pragma once
#include <stdbool.h>

#include "runtime/device.h"
#include "tensor/tensor_ops.h"  // LossSlot

typedef struct {
    Device device;
    int capacity;
    int written;   // losses written since the last hand-over ended
    int on_host;   // of those, copied to the host
    int taken;     // of those, handed over
    float *values;  // [capacity]: device memory on a GPU rank, host memory on a CPU rank
    float *host;    // [capacity]: page-locked copy on a GPU rank; `values` on a CPU rank
} StepLosses;

// Room for `capacity` losses between two hand-overs (a GPU rank's epoch: its number of steps).
StepLosses step_losses_new(int capacity, Device device);
// Where this step's loss goes (weight 1). step_losses_next_share: a micro-batch's share `weight`
// of it, the first (first = true) starting the sum, as `loss = 0; loss += weight * criterion(...)`.
LossSlot step_losses_next(StepLosses *losses);
LossSlot step_losses_next_share(StepLosses *losses, float weight, bool first);
// Hands over the oldest loss not yet handed over into *loss and returns true, or returns false when
// there is none (on a GPU rank, while not `due`: they stay on the GPU). Call it until false.
bool step_losses_take(StepLosses *losses, bool due, float *loss);
// Hands over every loss not yet handed over at once: how many (0 on a GPU rank while not `due`),
// in step order at *taken, valid until the next step's loss is written. One allreduce of them all
// then makes the global batch's loss of each step: one collective at a GPU epoch's end, not one a step.
int step_losses_take_all(StepLosses *losses, bool due, float **taken);
void step_losses_free(StepLosses *losses);
