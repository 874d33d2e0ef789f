// idle_threads: how much CPU a rank's OpenMP threads burn while they have
// nothing to do, the observable of the wait policy that threads.c chooses
// (tests/test_threads.sh). Two threads run ROUNDS rounds of one short parallel
// loop followed by GAP_MS of serial time, which the main thread spends asleep,
// as a rank does while it waits for MPI or reads data. Then it prints the
// process's CPU time (user + system, both threads) over the wall time:
//   idle_threads [ROUNDS] [GAP_MS]   ->   "cpu 0.012 s, wall 1.021 s, 0.01 CPU-seconds per second"
// A worker that sleeps soon after each loop burns next to nothing in the
// gaps; one that spins through them (libgomp's default, some milliseconds)
// burns up to a core. Load can only lower the figure (a spinner waits for its
// core too), so a bound from above holds on a busy machine.
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "base/timer.h"
#include "runtime/threads.h"

static double cpu_seconds(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (double)usage.ru_utime.tv_sec + (double)usage.ru_stime.tv_sec +
           1e-6 * (double)(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    int gap_ms = argc > 2 ? atoi(argv[2]) : 10;
    if (rounds < 1 || gap_ms < 0) {
        fprintf(stderr, "usage: idle_threads [ROUNDS >= 1] [GAP_MS >= 0]\n");
        return 2;
    }
    threads_init(2);
    static volatile double sink[2];
    struct timespec gap = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
    double cpu0 = cpu_seconds(), wall0 = wall_seconds();
    for (int round = 0; round < rounds; round++) {
#pragma omp parallel for
        for (int i = 0; i < 2; i++) sink[i] += i;
        nanosleep(&gap, NULL);
    }
    double cpu = cpu_seconds() - cpu0, wall = wall_seconds() - wall0;
    printf("cpu %.3f s, wall %.3f s, %.2f CPU-seconds per second\n", cpu, wall, cpu / wall);
    return 0;
}
