// dist.h: the process group, like torch.distributed, on MPI.
//
// One process-wide group (MPI_COMM_WORLD), as in PyTorch:
//   dist_init(&argc, &argv);            // init_process_group
//   dist_rank(), dist_world_size()      // get_rank(), get_world_size()
//   dist_local_rank()                   // LOCAL_RANK: index among the ranks on this node
//   dist_allreduce_sum(buf, n)          // all_reduce(t, op=SUM), in place, on a host buffer
//   dist_broadcast(buf, n, root)        // broadcast(t, src=root), on a host buffer
//   dist_all_reduce(&tensor)            // the same on a tensor, on the CPU or a GPU
//   dist_broadcast_tensor(&tensor, root)
//   dist_barrier()
//   dist_finalize();                    // destroy_process_group
// Printing: print0() prints on rank 0 only; print_rank() prefixes "[rank r] ".
// Both write whole lines at once, so ranks never interleave half-lines.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "tensor.h"

void dist_init(int *argc, char ***argv);
void dist_finalize(void);

int dist_rank(void);
int dist_world_size(void);
int dist_local_rank(void);        // rank among the processes sharing this node
int dist_local_world_size(void);  // how many ranks share this node
int dist_num_nodes(void);         // how many nodes the job spans
const char *dist_hostname(void);
int dist_thread_multiple(void);   // may several threads call MPI at once?

void dist_allreduce_sum(float *buf, size_t count);
void dist_broadcast(float *buf, size_t count, int root);
void dist_barrier(void);

// Collectives on tensors, wherever they live. CPU tensors: MPI. GPU tensors:
// NCCL when every rank has a GPU of its own (the collective runs on the
// communication stream, after the compute stream's queued work, which waits
// for it in turn: the host does not wait); otherwise MPI on a host copy.
void dist_all_reduce(Tensor *t);  // sum over ranks, in place
void dist_broadcast_tensor(Tensor *t, int root);

// Open the NCCL communicator over the ranks' GPUs: rank 0 makes the unique
// id and MPI_Bcast carries it to the others. device_from_flag calls it.
// Collective.
void dist_use_nccl(void);
bool dist_nccl(void);  // do GPU collectives go through NCCL?
#if HAVE_CUDA
ncclComm_t dist_nccl_comm(void);
cudaStream_t dist_comm_stream(void);
#endif

__attribute__((format(printf, 1, 2))) void print0(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void print_rank(const char *fmt, ...);
