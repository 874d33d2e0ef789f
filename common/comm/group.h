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

// What this rank's collectives over a group have sent since the last group_reset_traffic, per
// kind: the calls, and the bytes as the bandwidth-optimal (ring) algorithms send them, the least
// any algorithm sends: an allreduce of b bytes 2 (n - 1) / n b, a reduce-scatter of b bytes in or
// an all-gather of b bytes out (n - 1) / n b, a broadcast b (at most: a pipelined root), a send b.
// collectives.h's calls count themselves, and DDP its buckets; a group of one rank sends nothing.
// Counted by the thread that starts the collective, not atomically: one thread at a time starts a
// group's collectives (DDP's thread its group's buckets during backward, and nothing else then).
typedef enum {
    TRAFFIC_ALL_REDUCE, TRAFFIC_REDUCE_SCATTER, TRAFFIC_ALL_GATHER, TRAFFIC_BROADCAST, TRAFFIC_SEND, TRAFFIC_KINDS
} TrafficKind;
typedef struct {
    double calls[TRAFFIC_KINDS], bytes[TRAFFIC_KINDS];
} GroupTraffic;

typedef struct {
    MPI_Comm mpi;
    int rank, size;    // this rank's place in the group, and how many it has
    int *world_ranks;  // [size]: each member's rank in the world (NULL for the world itself)
    GroupTraffic *traffic;  // what this rank has sent over the group (group_count_traffic)
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
// A collective of `kind` over `floats` float32 values (an allreduce's or a broadcast's buffer, a
// reduce-scatter's input, an all-gather's output, a send's message), counted in group->traffic.
void group_count_traffic(const Group *group, TrafficKind kind, size_t floats);
void group_reset_traffic(const Group *group);
const char *traffic_kind_name(TrafficKind kind);  // "all-reduce", ...
// The figures of a per-rank table (a report's memory, times, idle shares): every member's
// `n` doubles, member by member ([size x n]), on the group's rank 0, or with to_every_rank on
// every member (a newly allocated array, to free()); NULL where they do not arrive. Collective.
double *group_gather_figures(const Group *group, const double *mine, int n, bool to_every_rank);
