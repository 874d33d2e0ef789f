#!/usr/bin/env bash
# Benchmark (not a test): step 20's memory savings and what they cost, on one world of NP ranks
# (default 4), for a model wide enough that the blocks' activations matter (issue 39's: 8 layers,
# 512 wide, context 256). For each grid: the activations a rank holds at most (the memory table's
# figure: what the model allocated, which the program checks against its formula), AdamW's
# moments on rank 0, the bytes a rank sends per step (the traffic table's largest row), the median
# time of an iteration and the windows trained per second (an iteration trains 12 windows per
# replica: D x 12), runs alternating so that machine noise hits each alike.
#
#   tests/bench_gpt_3d.sh [REPEATS] [ITERS] [NP]      (defaults 3, 3 and 4)
#   MODEL="--n_layer 4 --n_embd 256 --block_size 128" tests/bench_gpt_3d.sh    (a smaller model)
#
# Throughput against the first grid's (D = NP: whole blocks on every rank); a --recompute grid's
# time per iteration against the same grid's without it (the grid above it). Times are of this machine under its load (printed before
# and after): on fewer cores than ranks the ranks share them, and the ratios are what to read.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
iters=${2:-3}
np=${3:-4}
DATA=${SHAKESPEARE_DATA:-data/shakespeare}
read -r -a model <<< "${MODEL:---n_layer 8 --n_embd 512 --block_size 256}"
[ -f "$DATA/input.txt" ] || { echo "no $DATA/input.txt: make shakespeare" >&2; exit 1; }
[ -x day5/20_gpt_3d ] || { echo "no day5/20_gpt_3d: make day5/20_gpt_3d" >&2; exit 1; }
unset OPENBLAS_CORETYPE
MPIRUN=${MPIRUN:-mpirun --oversubscribe --bind-to none}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
half=$((np / 2)) quarter=$((np / 4))
grids=("--dp $np" "--dp $half --tp 2" "--dp $half --tp 2 --sp" "--dp $half --tp 2 --sp --recompute"
       "--dp $quarter --tp 2 --pp 2 --micro_batches 4 --sp" "--dp $quarter --tp 2 --pp 2 --micro_batches 4 --sp --recompute"
       "--dp $np --zero 1")
[ $((np % 4)) -eq 0 ] || grids=("--dp $np" "--dp 1 --tp $np" "--dp 1 --tp $np --sp" "--dp 1 --tp $np --sp --recompute" "--dp $np --zero 1")

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "step 20 on $np ranks, ${model[*]}, $iters iterations a run, medians of $repeats runs, alternating"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
declare -A times
for ((r = 0; r < repeats; r++)); do
    for i in "${!grids[@]}"; do
        # shellcheck disable=SC2086
        $MPIRUN -np "$np" day5/20_gpt_3d --data "$DATA" "${model[@]}" ${grids[$i]} --max_iters "$iters" \
            --eval_interval 1000000 --eval_iters 1 --sample 0 --plot '' --threads 1 > "$tmp/$i.out" 2>&1 ||
            { echo "failed: ${grids[$i]}: $(grep -a -m1 'error\|rank [0-9]* @' "$tmp/$i.out")" >&2; exit 1; }
        times[$i]+="$(sed -n 's/^training: [0-9]* iterations in \([0-9.]*\) s.*/\1/p' "$tmp/$i.out") "
    done
done
printf '%-58s  %15s  %9s  %9s  %13s  %12s  %10s  %10s\n' grid "activations MB" "of D=$np" "AdamW MB" "sent MB/step" \
    "s/iteration" "windows/s" "vs D=$np"
base_act= base_rate= prev_time=
for i in "${!grids[@]}"; do
    out=$tmp/$i.out
    act=$(sed -n '/^  rank  replica  stage/,/^[^ ]/p' "$out" | awk '$1 ~ /^[0-9]+$/ && $8 > m { m = $8 } END { print m }')
    adam=$(sed -n '/^  rank  replica  stage/,/^[^ ]/p' "$out" | awk '$1 == 0 { print $7 }')
    sent=$(sed -n '/^  rank  tensor-parallel MB/,/^[^ ]/p' "$out" | awk '$1 ~ /^[0-9]+$/ { s = $2 + $3 + $4 + $5; if (s > m) m = s } END { printf "%.1f", m }')
    t=$(echo "${times[$i]}" | tr ' ' '\n' | grep . | median)
    t=$(awk -v t="$t" -v n="$iters" 'BEGIN { printf "%.3f", t / n }')
    replicas=$(sed -n 's/.*--dp \([0-9]*\).*/\1/p' <<< "${grids[$i]}")
    rate=$(awk -v t="$t" -v d="$replicas" 'BEGIN { printf "%.2f", 12 * d / t }')
    [ -n "$base_act" ] || base_act=$act base_rate=$rate
    vs=$(awk -v a="$rate" -v b="$base_rate" 'BEGIN { printf "%.2fx", a / b }')
    [[ ${grids[$i]} == *--recompute* ]] && vs=$(awk -v a="$t" -v b="$prev_time" 'BEGIN { printf "time %.2fx", a / b }')
    printf '%-58s  %15s  %8.0f%%  %9s  %13s  %12s  %10s  %10s\n' "${grids[$i]}" "$act" "$(awk -v a="$act" -v b="$base_act" 'BEGIN { print 100 * a / b }')" \
        "$adam" "$sent" "$t" "$rate" "$vs"
    prev_time=$t
done
echo "(vs D=$np: windows per second against the first grid's; for a --recompute grid, its time per iteration against the grid above it, the same without --recompute)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
