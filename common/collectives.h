// collectives.h: collectives on tensors, wherever they live.
//
//   dist_all_reduce(&grad);            // dist.all_reduce(grad, op=SUM), in place
//   dist_broadcast_tensor(&w, 0);      // dist.broadcast(w, src=0)
//
// CPU tensors: MPI (dist.h's dist_allreduce_sum and dist_broadcast). GPU
// tensors: NCCL when every rank has a GPU of its own (device.h opened the
// communicator); the collective runs on the communication stream, after the
// compute stream's queued work, which waits for it in turn: the host does not
// wait. Where ranks share a GPU: MPI on a page-locked host copy.
//
// Layers: above dist (MPI), device (streams, NCCL) and tensor; below nn and ddp.
#pragma once
#include "tensor.h"

void dist_all_reduce(Tensor *t);  // sum over ranks, in place
void dist_broadcast_tensor(Tensor *t, int root);
