// dist.h: the process group, like torch.distributed, on MPI.
//
// One process-wide group (MPI_COMM_WORLD), as in PyTorch:
//   dist_init(&argc, &argv);            // init_process_group
//   dist_rank(), dist_world_size()      // get_rank(), get_world_size()
//   dist_local_rank()                   // LOCAL_RANK: index among the ranks on this node
//   dist_allreduce_sum(buf, n)          // all_reduce(t, op=SUM), in place, on a host buffer
//   dist_broadcast(buf, n, root)        // broadcast(t, src=root), on a host buffer
//   dist_barrier()
//   dist_finalize();                    // destroy_process_group
// Printing: print0() prints on rank 0 only; print_rank() prefixes "[rank r] ".
// Both write whole lines at once, so ranks never interleave half-lines.
//
// The bottom of common/'s layers above check.h: MPI only, no device, no
// tensors. Collectives on tensors (CPU or GPU, MPI or NCCL) are one layer up,
// in collectives.h. The layers above that need work done before MPI_Finalize
// (the GPU's streams and NCCL communicator, the profiler's trace) register it
// with dist_at_finalize, so that dist never calls up.
#pragma once
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

void dist_init(int *argc, char ***argv);
// Run every registered teardown, newest first (so a layer's work runs before
// that of the layers below it, which it may still use), then MPI_Finalize.
void dist_finalize(void);
// Register `teardown` to run in dist_finalize, before MPI_Finalize. Collective
// work is allowed there: every rank finalizes at the same point.
void dist_at_finalize(void (*teardown)(void));

int dist_rank(void);
int dist_world_size(void);
int dist_local_rank(void);        // rank among the processes sharing this node
int dist_local_world_size(void);  // how many ranks share this node
int dist_num_nodes(void);         // how many nodes the job spans
const char *dist_hostname(void);
int dist_thread_multiple(void);   // may several threads call MPI at once?

// Collective: end the job with one line (check_all_ranks) when this node's
// ranks, each asking for bytes_per_rank of host memory for `what` (a flag and
// its value), would take more than half of the node's memory. Better than
// what follows otherwise: the kernel's OOM killer, which says nothing.
void dist_require_memory(double bytes_per_rank, const char *what);

void dist_allreduce_sum(float *buf, size_t count);
void dist_broadcast(float *buf, size_t count, int root);
// The same over a communicator of some of the ranks (a group's: group.h).
void dist_allreduce_sum_over(MPI_Comm comm, float *buf, size_t count);
void dist_broadcast_over(MPI_Comm comm, float *buf, size_t count, int root);
void dist_barrier(void);

__attribute__((format(printf, 1, 2))) void print0(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void print_rank(const char *fmt, ...);
