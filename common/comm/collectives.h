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
// Each works over a process group (group.h): the dist_ ones over the world,
// the group_ ones over the group they are given.
//
// Layers: above dist (MPI), device (streams, NCCL), group and tensor; below nn and ddp.
#pragma once
#include "comm/group.h"
#include "tensor/tensor.h"

void dist_all_reduce(Tensor *t);  // sum over ranks, in place
void dist_broadcast_tensor(Tensor *t, int root);
void group_all_reduce(const Group *group, Tensor *t);
void group_broadcast_tensor(const Group *group, Tensor *t, int root);  // root: a rank of the group
// n doubles in GPU memory summed over the group, in place (a split model's sum of squares for its
// gradients' clip: adamw.h), queued as group_all_reduce's; not counted in the group's traffic, as
// the MPI_Allreduce of that sum on CPU ranks is not (8 bytes a step).
void group_all_reduce_doubles_on_gpu(const Group *group, double *device_values, size_t n);

// Point-to-point within a group, as torch.distributed.batch_isend_irecv:
// every send and receive of one exchange starts at once, and the exchange is
// over when all have completed, so two ranks that send to each other do not
// wait for each other. On GPUs with NCCL: one NCCL group on the compute
// stream, which the next kernels wait for (the host does not); where ranks
// share a GPU, MPI on host copies.
typedef struct {
    const Tensor *tensor;  // all of it goes
    int peer;              // to this rank of the group
} P2pSend;
typedef struct {
    Tensor *tensor;  // all of it is filled
    int peer;        // from this rank of the group
} P2pReceive;
void group_exchange(const Group *group, const P2pSend *sends, int n_sends, const P2pReceive *receives,
                    int n_receives);

// The collectives of sharded data parallelism (ZeRO, FSDP), on float tensors
// seen as flat buffers, as dist.reduce_scatter_tensor and
// dist.all_gather_into_tensor:
//   reduce-scatter: input [size * count] on every rank; output [count] gets the
//                   sum over the ranks of the input's block `rank` (elements
//                   rank * count .. rank * count + count - 1);
//   all-gather:     output [size * count] gets every rank's input [count], block
//                   r from rank r.
// In place, as NCCL's: the reduce-scatter's output may be the input's own
// block `rank` (the rest of the input is then left undefined), and the
// all-gather's input may be the output's block `rank`. On CPUs: MPI
// (the reduce-scatter our own ring, below; MPI_Allgather); on GPUs: NCCL on the
// communication stream, or MPI on host copies where ranks share a GPU.
//
// _start starts one and returns at once; group_wait makes its result ready:
// on CPUs, MPI's non-blocking collective (MPI_Wait); on GPUs, the compute
// stream waits for it (the host does not), so that what the compute stream
// queues between the two overlaps with the collective (FSDP's prefetch). Only
// what was queued on the compute stream before _start goes into it.
//
// The CPU reduce-scatter is a ring, as NCCL's: size - 1 steps, in each of which
// every rank sends one block's partial sum to the next rank and adds the
// previous rank's to its own, so that it holds one block in flight and sends
// (size - 1) / size of the buffer, the least any algorithm sends. Open MPI's
// MPI_Ireduce_scatter_block reduces the whole buffer into one rank's copy of
// it before scattering: under ZeRO-3 that copy made rank 0's peak the highest.
// The ring sums each block in a fixed order (block b from rank b + 1 around to
// rank b: on 2 ranks a + b, as MPI's), never one that depends on timing. _start
// posts its first step; group_wait takes the rest.
typedef struct RingReduceScatter RingReduceScatter;
typedef struct {
    MPI_Request request;      // CPU all-gather: the non-blocking MPI collective
    RingReduceScatter *ring;  // CPU reduce-scatter: the ring, its first step posted
    void *done;               // GPU tensors with NCCL: the slot of the event that marks its end
} GroupRequest;
GroupRequest group_reduce_scatter_start(const Group *group, const Tensor *input, Tensor *output);
GroupRequest group_all_gather_start(const Group *group, const Tensor *input, Tensor *output);
void group_wait(GroupRequest *request);
void group_reduce_scatter(const Group *group, const Tensor *input, Tensor *output);
void group_all_gather(const Group *group, const Tensor *input, Tensor *output);
