// Step 0: one allreduce on CPU ranks.                        PyTorch twin: 0_torch_dist.py
//
// What it teaches: N processes, each with its own value, agree on their sum,
// and then on the mean, with one collective: MPI_Allreduce (torch's
// dist.all_reduce on the gloo backend). Every data-parallel trainer in this
// workshop is built on exactly this call.
//
// Build and run:
//   make day1/0_dist_allreduce
//   mpirun -np 4 day1/0_dist_allreduce            (add --oversubscribe on fewer than 4 cores)
//   mpirun -np 4 day1/0_dist_allreduce --count 10000000   # check MPI with 10 M floats
//
// Expected output (the rank order varies from run to run):
//   [rank 0] initial value 1
//   [rank 2] initial value 3
//   ...
//   [rank 0] after allreduce: sum 10, mean 2.5
//   [rank 3] after allreduce: sum 10, mean 2.5
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>     // MPI_Allreduce: the lesson itself

#include "base/args.h"     // args_parse: --count and --help
#include "base/check.h"    // CHECK_MPI, xmalloc: fail fast, on every rank
#include "base/timer.h"    // wall_seconds
#include "runtime/dist.h"  // dist_init, dist_rank, print_rank: the process group (MPI_Init and friends)

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    int count = 1;
    ArgSpec flags[] = {
        {"count", ARG_INT, &count, "N", "floats per rank; N > 1 also verifies every element", 1, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 0: allreduce (sum, then mean) across MPI ranks.");
    int rank = dist_rank(), world = dist_world_size();

    if (count == 1) {
        // The original: rank r holds r + 1; after the allreduce every rank
        // holds 1 + 2 + ... + W, and dividing by W gives the mean.
        float value = (float)(rank + 1);
        print_rank("initial value %g\n", value);
        // dist.all_reduce(tensor, op=ReduceOp.SUM): every rank's value in, the sum out, in place.
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        float sum = value;
        float mean = sum / (float)world;
        print_rank("after allreduce: sum %g, mean %g\n", sum, mean);
        dist_finalize();
        return 0;
    }

    // --count N: element i on rank r is (r + 1) * (1 + i % 7). Small integers
    // add exactly in float32, so every element of the mean is known exactly:
    // (1 + i % 7) * (W + 1) / 2.
    char what[64];
    snprintf(what, sizeof what, "--count %d", count);
    dist_require_memory((double)count * sizeof(float), what);
    float *values = xmalloc((size_t)count * sizeof(float));
    for (int i = 0; i < count; i++) values[i] = (float)((rank + 1) * (1 + i % 7));
    dist_barrier();
    double start = wall_seconds();
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    double seconds = wall_seconds() - start;
    for (int i = 0; i < count; i++) values[i] /= (float)world;

    long wrong = 0;
    for (int i = 0; i < count; i++) wrong += values[i] != (float)(1 + i % 7) * (float)(world + 1) / 2.0f;
    long wrong_total = wrong;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong_total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (wrong) print_rank("%ld of %d elements wrong after allreduce\n", wrong, count);
    print0("allreduce of %d floats (%.1f MB) on %d rank%s: %.1f ms, %s\n", count, count * 4e-6, world,
           world == 1 ? "" : "s", seconds * 1e3, wrong_total == 0 ? "every element verified on every rank" : "FAILED");
    free(values);
    dist_finalize();
    return wrong_total == 0 ? 0 : 1;
}
