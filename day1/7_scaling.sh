#!/usr/bin/env bash
# Step 7's companion: time DDP training at 1, 2 and 4 ranks (or the world
# sizes in RANKS), REPEATS times each (3 by default), and print the speed-up
# table (and img/7_scaling.png). Usage:
#   day1/7_scaling.sh [extra flags for 7_mnist_ddp_timing]       (or: make scaling)
#   RANKS="1 2 4 8 16" day1/7_scaling.sh                          (a 16-core node)
#   REPEATS=5 day1/7_scaling.sh                                   (a noisy machine)
# Set MPIRUN to change the launcher, e.g. MPIRUN="srun" inside an allocation.
# --bind-to none: mpirun pins each of up to 2 ranks to one core, which would
# leave 1 rank on one core of the machine. Unpinned, every world size may use
# every core (each rank's BLAS takes its fair share of them).
#
# Why repeats: on a machine shared with other work one run can take 5 times
# another of the same world size (a 1-rank run took 0.64 s, then 3.24 s), and a
# single run per world size showed 2 ranks 4.78x faster, then 0.92x. The table
# takes the median of each world size's runs, and shows their min..max. The
# runs are interleaved (1, 2, 4, 1, 2, 4, ...), so that a slow spell of the
# machine hits every world size alike rather than all the runs of one.
#
# The output: each run's settings and times, then, after the last, the table:
#   == 1 rank(s), run 1/3
#   Step 7: DDP on 1 rank: MLP 784-128-10, ...
#   ...
#   == 4 rank(s), run 3/3
#   ...
#   world size  runs  median s      min..max s  speed-up      min..max  efficiency
#            1     3     0.606    0.602..0.633     1.00x   0.95..1.05x        100%
#            2     3     0.711    0.709..0.719     0.85x   0.84..0.89x         43%
#            4     3     0.767    0.761..0.769     0.79x   0.78..0.83x         20%
#   speed-up: median time at 1 rank / median at W; min..max: fastest 1-rank run / slowest W-rank run
#   to slowest / fastest. Where it spans 1.00x, these runs cannot tell whether W ranks are faster.
#   Speed-up chart: img/7_scaling.png
set -euo pipefail
cd "$(dirname "$0")/.."
MPIRUN=${MPIRUN:-mpirun --oversubscribe --bind-to none $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
world_sizes=${RANKS:-1 2 4}
[ -n "${world_sizes// /}" ] || { echo "error: RANKS is empty: expected world sizes such as \"1 2 4 8\"" >&2; exit 2; }
for ranks in $world_sizes; do
    [[ $ranks =~ ^[1-9][0-9]*$ ]] ||
        { echo "error: RANKS=\"$world_sizes\": expected world sizes, positive integers such as \"1 2 4 8\"" >&2; exit 2; }
done
repeats=${REPEATS:-3}
[[ $repeats =~ ^[1-9][0-9]*$ ]] ||
    { echo "error: REPEATS=\"$repeats\": expected the runs per world size, a positive integer such as 3" >&2; exit 2; }
results=${RESULTS:-img/7_scaling.csv}
mkdir -p "$(dirname "$results")"
rm -f "$results"
runs=$(( repeats * $(wc -w <<< "$world_sizes") )) run=0
for repeat in $(seq "$repeats"); do
    for ranks in $world_sizes; do
        run=$((run + 1))
        echo "== $ranks rank(s), run $repeat/$repeats"
        # Every run prints the table of the runs so far; only the last one's is kept.
        # It starts at the first blank line ('$d' reads to the end: no broken pipe).
        last_table='/^$/,$d'
        [ $run -lt $runs ] || last_table=''
        $MPIRUN -np $ranks day1/7_mnist_ddp_timing --results "$results" --plot '' "$@" |
            grep -vE '^epoch' | sed "$last_table" || exit 1
    done
done
