// op_timer.h: the benchmarks' stopwatch (gpt_ops_bench, mlp_ops_bench). TIME(label, n, statement)
// runs the statement n times between two device_synchronize calls, REPEATS + 1 times over (the
// first a warm-up), and prints the median per call: the time the operation itself takes on the
// device, its launches included, not the time to queue it. n > 1 spreads the synchronisation's own
// cost (tens of microseconds) over n calls, for operations shorter than that.
#pragma once
#include <stdio.h>
#include <stdlib.h>

#include "base/timer.h"
#include "runtime/device.h"

enum { REPEATS = 7 };

static inline int op_timer_by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define TIME(label, n, statement)                                                                   \
    do {                                                                                            \
        double times_[REPEATS];                                                                     \
        for (int r_ = -1; r_ < REPEATS; r_++) {                                                     \
            device_synchronize();                                                                   \
            double start_ = wall_seconds();                                                         \
            for (int i_ = 0; i_ < (n); i_++) statement;                                             \
            device_synchronize();                                                                   \
            if (r_ >= 0) times_[r_] = (wall_seconds() - start_) / (n);                              \
        }                                                                                           \
        qsort(times_, REPEATS, sizeof times_[0], op_timer_by_value);                                \
        printf("  %-44s %10.3f ms\n", label, 1e3 * times_[REPEATS / 2]);                             \
    } while (0)
