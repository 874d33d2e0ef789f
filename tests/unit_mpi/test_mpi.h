// test_mpi.h: test.h for the tests that run under mpirun (tests/unit_mpi/).
//
// A check there is collective: every rank computes its own verdict, the
// verdicts are combined (a check passes only if it passed on every rank), rank 0
// prints the one PASS/FAIL line and every rank counts a failure, so that every
// rank exits non-zero and mpirun reports the failure whichever rank saw it.
//
//   EXPECT_ALL(sum == expected, "allreduce sums %d ranks", world);  // on every rank
#pragma once
#include <mpi.h>

#include "test.h"

// 1 if ok is non-zero on every rank of MPI_COMM_WORLD. Collective.
static inline int all_ranks(int ok) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

static inline int test_rank(void) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

// EXPECT on a verdict combined over ranks; rank 0 prints it. Collective: all
// ranks call it, with the same arguments as far as the message goes.
#define EXPECT_ALL(cond, ...)                               \
    do {                                                    \
        int all_ok_ = all_ranks(cond);                      \
        if (test_rank() == 0) EXPECT(all_ok_, __VA_ARGS__); \
        else test_failures += !all_ok_;                     \
    } while (0)
