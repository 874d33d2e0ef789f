// test_collectives.c: group_reduce_scatter and group_all_gather (common/collectives.c)
// under mpirun, at any world size W (tests/test_mpi_units.sh runs it on 1, 2 and 4
// ranks; tests/test_gpu.sh with the argument cuda, on GPUs and the simulated one).
//
// The values are small integers, so every sum is exact in float and the
// result is known in closed form: we demand bit equality. Each verdict is the
// AND over all ranks, printed by rank 0:
//   reduce-scatter  rank r gets block r of the sum over ranks, out of place and
//                   in place (the output is the input's own block r);
//   all-gather      every rank gets block r from rank r, out of place and in place;
//   overlapped      two started at once and waited for in the other order: a gather and a
//                   reduce-scatter, and two reduce-scatters (two rings on the CPU);
//   groups          the same over the even and the odd ranks (group_split);
// for blocks of 1, 5 and 1000 floats (and 100,000 on the world: FSDP's units).
#define TEST_NAME "test_collectives"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "comm/collectives.h"
#include "runtime/dist.h"
#include "test_mpi.h"

static int rank, world;

// Block `block` of a flat [1, n] tensor, sharing its storage.
static Tensor block_of(const Tensor *t, size_t count, int block) {
    return (Tensor){.data = t->data + (size_t)block * count, .rows = 1, .cols = (int)count, .device = t->device};
}

static Tensor filled(size_t n, Device device, float (*value)(int member, size_t k), int member) {
    Tensor t = tensor_zeros(1, (int)n, device);
    float *host = malloc(n * sizeof(float));
    for (size_t k = 0; k < n; k++) host[k] = value(member, k);
    tensor_from_host(&t, host);
    free(host);
    return t;
}

// Member m's contribution to the reduce-scatter, and the sum over a group of g members: every
// block different from every other (4093 is a prime that no block size here divides), so that a
// block summed into the wrong place is seen.
static float contribution(int member, size_t k) { return (float)((member + 1) * (int)(k % 4093 + 1)); }
static float summed(int members, size_t k) { return (float)(members * (members + 1) / 2 * (int)(k % 4093 + 1)); }
// Member m's block in the all-gather.
static float gathered(int member, size_t k) { return (float)(member * 1000 + (int)(k % 997)); }

// How many of t's floats [first, first + n) differ from value(member, first + j)... for the block `member`.
static long wrong_in(const Tensor *t, size_t offset, size_t n, float (*value)(int, size_t), int arg, size_t k0) {
    float *host = malloc(tensor_numel(t) * sizeof(float));
    tensor_to_host(t, host);
    long wrong = 0;
    for (size_t j = 0; j < n; j++) wrong += host[offset + j] != value(arg, k0 + j);
    free(host);
    return wrong;
}

static void test_group(const Group *g, const char *name, size_t count, Device device) {
    size_t n = count * (size_t)g->size;
    char where[96];
    snprintf(where, sizeof where, "%s (%d rank%s), blocks of %zu floats, %s", name, g->size, g->size == 1 ? "" : "s",
             count, device_name(device));

    // Reduce-scatter, out of place, then in place.
    Tensor input = filled(n, device, contribution, g->rank), output = tensor_zeros(1, (int)count, device);
    group_reduce_scatter(g, &input, &output);
    long wrong = wrong_in(&output, 0, count, summed, g->size, (size_t)g->rank * count);
    EXPECT_ALL(wrong == 0, "reduce-scatter over %s: block r of the sum on rank r (%ld wrong)", where, wrong);
    tensor_free(&input);
    input = filled(n, device, contribution, g->rank);
    Tensor mine = block_of(&input, count, g->rank);
    group_reduce_scatter(g, &input, &mine);
    wrong = wrong_in(&input, (size_t)g->rank * count, count, summed, g->size, (size_t)g->rank * count);
    EXPECT_ALL(wrong == 0, "reduce-scatter in place over %s: the sum lands in the input's own block (%ld wrong)",
               where, wrong);

    // Two reduce-scatters in flight at once (ZeRO-2's backward), waited for in the other order:
    // on CPUs two rings, whose steps MPI matches in the order every rank posts them.
    Tensor second = filled(n, device, contribution, g->rank), second_out = tensor_zeros(1, (int)count, device);
    tensor_free(&input);
    input = filled(n, device, contribution, g->rank);
    mine = block_of(&input, count, g->rank);
    GroupRequest first_rs = group_reduce_scatter_start(g, &input, &mine);
    GroupRequest second_rs = group_reduce_scatter_start(g, &second, &second_out);
    group_wait(&second_rs);
    group_wait(&first_rs);
    wrong = wrong_in(&input, (size_t)g->rank * count, count, summed, g->size, (size_t)g->rank * count) +
            wrong_in(&second_out, 0, count, summed, g->size, (size_t)g->rank * count);
    EXPECT_ALL(wrong == 0, "two reduce-scatters in flight over %s, waited for in the other order (%ld wrong)", where,
               wrong);
    tensor_free(&second);
    tensor_free(&second_out);

    // All-gather, out of place, then in place.
    Tensor gather_out = tensor_zeros(1, (int)n, device), shard = filled(count, device, gathered, g->rank);
    group_all_gather(g, &shard, &gather_out);
    wrong = 0;
    for (int r = 0; r < g->size; r++) wrong += wrong_in(&gather_out, (size_t)r * count, count, gathered, r, 0);
    EXPECT_ALL(wrong == 0, "all-gather over %s: block r from rank r on every rank (%ld wrong)", where, wrong);
    tensor_fill(&gather_out, -1.0f);
    Tensor own = block_of(&gather_out, count, g->rank);
    tensor_copy(&own, &shard);
    group_all_gather(g, &own, &gather_out);
    wrong = 0;
    for (int r = 0; r < g->size; r++) wrong += wrong_in(&gather_out, (size_t)r * count, count, gathered, r, 0);
    EXPECT_ALL(wrong == 0, "all-gather in place over %s: every block filled (%ld wrong)", where, wrong);

    // Two at once (a gather and an in-place reduce-scatter), waited for in the other order.
    tensor_free(&input);
    input = filled(n, device, contribution, g->rank);
    mine = block_of(&input, count, g->rank);
    tensor_fill(&gather_out, -1.0f);
    GroupRequest gather = group_all_gather_start(g, &shard, &gather_out);
    GroupRequest reduce = group_reduce_scatter_start(g, &input, &mine);
    group_wait(&reduce);
    group_wait(&gather);
    wrong = wrong_in(&input, (size_t)g->rank * count, count, summed, g->size, (size_t)g->rank * count);
    for (int r = 0; r < g->size; r++) wrong += wrong_in(&gather_out, (size_t)r * count, count, gathered, r, 0);
    EXPECT_ALL(wrong == 0, "an all-gather and a reduce-scatter in flight together over %s, waited for in the "
               "other order (%ld wrong)", where, wrong);
    tensor_free(&input);
    tensor_free(&output);
    tensor_free(&gather_out);
    tensor_free(&shard);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    rank = dist_rank(), world = dist_world_size();
    Device device = device_from_flag(argc > 1 ? argv[1] : "cpu");
    const size_t counts[] = {1, 5, 1000};
    for (int c = 0; c < 3; c++) test_group(group_world(), "the world", counts[c], device);
    test_group(group_world(), "the world", 100000, device);
    if (world >= 2) {
        Group parity = group_split(rank % 2, rank);  // the even ranks, the odd ranks
        for (int c = 0; c < 3; c++) test_group(&parity, rank % 2 ? "the odd ranks" : "the even ranks", counts[c], device);
        group_free(&parity);
    }
    int status = test_summary();
    dist_finalize();
    return status;
}
