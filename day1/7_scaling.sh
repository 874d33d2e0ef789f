#!/usr/bin/env bash
# Step 7's companion: time DDP training at 1, 2 and 4 ranks (or the world
# sizes in RANKS) and print the speed-up table (and img/7_scaling.png). Usage:
#   day1/7_scaling.sh [extra flags for 7_mnist_ddp_timing]       (or: make scaling)
#   RANKS="1 2 4 8 16" day1/7_scaling.sh                          (a 16-core node)
# Set MPIRUN to change the launcher, e.g. MPIRUN="srun" inside an allocation.
# --bind-to none: mpirun pins each of up to 2 ranks to one core, which would
# leave 1 rank on one core of the machine. Unpinned, every world size may use
# every core (each rank's BLAS takes its fair share of them).
set -euo pipefail
cd "$(dirname "$0")/.."
MPIRUN=${MPIRUN:-mpirun --oversubscribe --bind-to none $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
world_sizes=${RANKS:-1 2 4}
[ -n "${world_sizes// /}" ] || { echo "error: RANKS is empty: expected world sizes such as \"1 2 4 8\"" >&2; exit 2; }
for ranks in $world_sizes; do
    [[ $ranks =~ ^[1-9][0-9]*$ ]] ||
        { echo "error: RANKS=\"$world_sizes\": expected world sizes, positive integers such as \"1 2 4 8\"" >&2; exit 2; }
done
results=${RESULTS:-img/7_scaling.csv}
mkdir -p "$(dirname "$results")"
rm -f "$results"
for ranks in $world_sizes; do
    echo "== $ranks rank(s)"
    $MPIRUN -np $ranks day1/7_mnist_ddp_timing --results "$results" --plot '' "$@" |
        grep -vE '^epoch' || exit 1
done
