// accum.h: gradient accumulation, which micro-batches make one optimizer step.
//
// With --accum_steps K, K consecutive batches (micro-batches) make one step:
// the gradients are zeroed on the first, accumulated over all K, and reduced
// across ranks and applied on the last (DDP's no_sync() on the others). The
// epoch's last step may have fewer. Each micro-batch's loss is weighed by its
// share of the step's samples, so that K micro-batches of B give exactly the
// gradient of one batch of K·B, partial last batches included.
//
//   MicroBatch micro = micro_batch(b, accum_steps, samples, batch_size);
//   if (micro.first) zero_grad;  ...  loss *= micro.weight; backward;
//   if (micro.last) { finish; step; }
//
// Layer 1: no dependencies of ours.
#pragma once
#include <stdbool.h>

typedef struct {
    bool first;    // the step's first micro-batch: zero the gradients
    bool last;     // its last: reduce the gradients and step the optimizer
    float weight;  // this micro-batch's samples / the step's samples
} MicroBatch;

// Micro-batch b of an epoch of `samples` cut into batches of batch_size (the
// last one partial), accum_steps batches to a step.
MicroBatch micro_batch(int b, int accum_steps, int samples, int batch_size);

// The samples in batches [first, end) when `samples` are cut into batches of
// batch_size, the last one partial: what one step of accumulated batches sees.
int rows_in_batches(int samples, int batch_size, int first, int end);
