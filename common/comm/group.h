// group.h: process groups, as torch.distributed.new_group: some of the ranks,
// running collectives among themselves.
//
//   const Group *world = group_world();              // the default group: every rank
//   Group stage = group_split(stage_index, replica);  // the ranks that share my color, ordered by key
//   ddp_wrap_group(params, n, 25.0, &stage);          // DDP over that group only
//   group_free(&stage);
//
// Day 4 splits the world twice: a pipeline group per replica (its stages) and
// a data-parallel group per stage (its replicas). A group is a communicator
// pair: MPI's, split from MPI_COMM_WORLD (MPI_Comm_split), and on GPUs with
// NCCL, NCCL's, split from the world's the same way (ncclCommSplit), whose
// waits device.c polls and whose errors end the job as the world's do.
//
// Layers: above dist (MPI) and device (the NCCL communicators); collectives
// and ddp take the group they work over.
#pragma once
#include <mpi.h>
#include <stdbool.h>

#include "base/check.h"  // HAVE_CUDA, and NCCL's types with it

typedef struct {
    MPI_Comm mpi;
    int rank, size;    // this rank's place in the group, and how many it has
    int *world_ranks;  // [size]: each member's rank in the world (NULL for the world itself)
#if HAVE_CUDA
    ncclComm_t nccl;   // NULL: no NCCL (CPU tensors, or ranks sharing a GPU)
#endif
} Group;

// Every rank, in world order: MPI_COMM_WORLD and the device's NCCL communicator.
const Group *group_world(void);
// Collective over the world: the ranks that pass the same color form a group,
// ranked by key (ties by world rank), as MPI_Comm_split.
Group group_split(int color, int key);
void group_free(Group *group);
// The world rank of the group's member `rank`.
int group_world_rank(const Group *group, int rank);
// The figures of a per-rank table (a report's memory, times, idle shares): every member's
// `n` doubles, member by member ([size x n]), on the group's rank 0, or with to_every_rank on
// every member (a newly allocated array, to free()); NULL where they do not arrive. Collective.
double *group_gather_figures(const Group *group, const double *mine, int n, bool to_every_rank);
