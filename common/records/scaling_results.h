// scaling_results.h: step 7's --results file, the speed-up table over world
// sizes that the workshop builds one run at a time (7_scaling.sh runs 1, 2, 4
// ranks, 3 times each). The file is CSV: a header "world_size,seconds", then
// one row per run; rows of the same world size are repeats of it.
//
//   scaling_results_check(path);                      // all ranks, before training
//   ... train, time the slowest rank ...
//   if (rank == 0) scaling_results_report(path, world, seconds, chart);
#pragma once

// Collective: rank 0 reads the whole file (a missing one is a new, empty
// table). A file that cannot be read, or a row that is not an integer world
// size >= 1 and a finite time > 0, is a usage error on every rank, with one line
// naming the file and the line, before any training; the file stays as it is.
void scaling_results_check(const char *path);

// Rank 0: add this run's row to the file, which is replaced whole (paths.h),
// so that a failed write loses no earlier run. Then print the table of all its
// runs, one row per world size: how many, the median time, the fastest and
// slowest; the speed-up over one rank as the ratio of the medians, its range
// from the fastest 1-rank run over the slowest W-rank run to the slowest over
// the fastest, and the efficiency. Draw the speed-up, with that range as a bar,
// to `chart` (NULL or '': none).
void scaling_results_report(const char *path, int world, double seconds, const char *chart);
