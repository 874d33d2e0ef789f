// group.c: process groups. See group.h.
#include "comm/group.h"

#include <stdlib.h>

#include "runtime/device.h"
#include "runtime/dist.h"

const Group *group_world(void) {
    static Group world;
    static GroupTraffic world_traffic;
    // Built at each call: the device's communicator exists only once
    // device_from_flag has run, which comes after dist_init.
    world = (Group){.mpi = MPI_COMM_WORLD, .rank = dist_rank(), .size = dist_world_size(), .traffic = &world_traffic};
#if HAVE_CUDA
    world.nccl = device_nccl_comm();
#endif
    return &world;
}

Group group_split(int color, int key) {
    Group group = {0};
    CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, color, key, &group.mpi));
    CHECK_MPI(MPI_Comm_rank(group.mpi, &group.rank));
    CHECK_MPI(MPI_Comm_size(group.mpi, &group.size));
    group.world_ranks = xmalloc((size_t)group.size * sizeof(int));
    group.traffic = xcalloc(1, sizeof *group.traffic);
    int me = dist_rank();
    CHECK_MPI(MPI_Allgather(&me, 1, MPI_INT, group.world_ranks, 1, MPI_INT, group.mpi));
#if HAVE_CUDA
    // Every rank of the world calls it (NCCL's split is collective over the
    // communicator it splits), with the same color and key as MPI's.
    if (device_nccl()) group.nccl = device_nccl_split(color, key);
#endif
    return group;
}

void group_free(Group *group) {
    if (group->mpi == MPI_COMM_WORLD || group->mpi == MPI_COMM_NULL) return;
#if HAVE_CUDA
    if (group->nccl) device_nccl_free(group->nccl);
#endif
    CHECK_MPI(MPI_Comm_free(&group->mpi));
    free(group->world_ranks);
    free(group->traffic);
    *group = (Group){.mpi = MPI_COMM_NULL};
}

void group_count_traffic(const Group *group, TrafficKind kind, size_t floats) {
    if (group->size == 1 || !group->traffic) return;
    const double n = group->size, bytes = (double)floats * sizeof(float);
    const double share[TRAFFIC_KINDS] = {2 * (n - 1) / n, (n - 1) / n, (n - 1) / n, 1, 1};
    group->traffic->calls[kind] += 1;
    group->traffic->bytes[kind] += share[kind] * bytes;
}

void group_reset_traffic(const Group *group) {
    if (group->traffic) *group->traffic = (GroupTraffic){0};
}

const char *traffic_kind_name(TrafficKind kind) {
    static const char *const names[TRAFFIC_KINDS] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast", "send"};
    return kind >= 0 && kind < TRAFFIC_KINDS ? names[kind] : "?";
}

int group_world_rank(const Group *group, int rank) {
    CHECK(rank >= 0 && rank < group->size, "group_world_rank: rank %d of a group of %d", rank, group->size);
    return group->world_ranks ? group->world_ranks[rank] : rank;
}

double *group_gather_figures(const Group *group, const double *mine, int n, bool to_every_rank) {
    bool arrive = to_every_rank || group->rank == 0;
    double *all = arrive ? xmalloc((size_t)group->size * (size_t)n * sizeof(double)) : NULL;
    if (to_every_rank) CHECK_MPI(MPI_Allgather(mine, n, MPI_DOUBLE, all, n, MPI_DOUBLE, group->mpi));
    else CHECK_MPI(MPI_Gather(mine, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, group->mpi));
    return all;
}
