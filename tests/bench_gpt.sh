#!/usr/bin/env bash
# Benchmark (not a test): step 19's training loop against its PyTorch twin (tests/torch_gpt.py,
# eager PyTorch on the CPU), the baby config from the same --init, at 1 thread and at every core,
# runs alternating so that machine noise hits both; part of make bench.
#
#   tests/bench_gpt.sh [REPEATS] [ITERS]      (defaults 3 and 100)
#
# Prints per thread count the median training-loop time of each (evaluation and start-up left
# out: each program times its iterations), the ratio of the medians, the median of the runs' own
# ratios (each run of ours against the twin's run right after it, which met the same load: on a
# shared machine the steadier of the two), its spread over the runs, and the load average before
# and after: on a shared machine read the ratios with it. Then, at every core, the twin in the fastest
# of three thread settings (its threads at every core oversubscribe them) against ours.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
iters=${2:-100}
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=${SHAKESPEARE_DATA:-data/shakespeare}
"$PYTHON" -c 'import torch, h5py' 2> /dev/null || { echo "needs python3-torch and python3-h5py (./setup.sh --with-reference)" >&2; exit 1; }
[ -f "$DATA/input.txt" ] || { echo "no $DATA/input.txt: make shakespeare" >&2; exit 1; }
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS GOTO_NUM_THREADS OMP_NUM_THREADS
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
common=(--init "$tmp/init.h5" --max_iters "$iters" --eval_interval 1000000 --eval_iters 1)
day5/19_gpt --data "$DATA" --max_iters 0 --eval_iters 1 --sample 0 --plot '' --save "$tmp/init.h5" > /dev/null
echo "step 19 (the baby GPT: 4 layers, 4 heads, 128 wide, context 64, batch 12) vs its PyTorch twin, $iters iterations from the same --init; medians of $repeats runs, alternating"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $cores cores"
printf '%-8s  %12s  %12s  %8s  %10s  %s\n' threads "ours (s)" "PyTorch (s)" ratio "run ratio" "spread over the runs"
for threads in 1 $([ "$cores" -gt 1 ] && echo "$cores"); do
    ours=() theirs=()
    for ((r = 0; r < repeats; r++)); do
        day5/19_gpt --data "$DATA" "${common[@]}" --sample 0 --plot '' --threads "$threads" > "$tmp/c.out"
        ours+=($(sed -n 's/^training: [0-9]* iterations in \([0-9.]*\) s.*/\1/p' "$tmp/c.out"))
        # The same cores for the twin's GEMMs: torch.set_num_threads sets torch's OpenMP threads,
        # not Debian's OpenBLAS's (to torch a "generic" BLAS), which otherwise starts one thread per
        # core. At --threads 1 the twin's GEMMs then ran on 2 threads (the second took a fifth of
        # the first's CPU time), and on a loaded machine were 3.5x slower waiting on each other.
        OPENBLAS_NUM_THREADS=$threads "$PYTHON" tests/torch_gpt.py "$DATA" 1 "${common[@]}" --threads "$threads" > "$tmp/t.out"
        theirs+=($(tail -1 "$tmp/t.out" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["train_seconds"])'))
    done
    o=$(printf '%s\n' "${ours[@]}" | median) t=$(printf '%s\n' "${theirs[@]}" | median)
    paired=$(for ((r = 0; r < repeats; r++)); do awk "BEGIN { print ${theirs[r]} / ${ours[r]} }"; done | median)
    lo=$(awk "BEGIN { print $(printf '%s\n' "${theirs[@]}" | sort -g | head -1) / $(printf '%s\n' "${ours[@]}" | sort -g | tail -1) }")
    hi=$(awk "BEGIN { print $(printf '%s\n' "${theirs[@]}" | sort -g | tail -1) / $(printf '%s\n' "${ours[@]}" | sort -g | head -1) }")
    printf '%-8s  %12.2f  %12.2f  %7.2fx  %9.2fx  %.2fx to %.2fx\n' "$threads" "$o" "$t" "$(awk "BEGIN { print $t / $o }")" \
        "$paired" "$lo" "$hi"
done
# Every core, the twin at its best: torch's OpenMP threads and OpenBLAS's threads both on every core
# oversubscribe them (OpenBLAS's idle threads spin while torch's run the elementwise work: on 2 cores
# the twin's 2-thread run above is slower than its 1-thread run), so the twin also runs with one of
# the two pools on one thread, and the fastest of its three settings is what ours is held against.
if [ "$cores" -gt 1 ]; then
    best="" best_setting=""
    for setting in "1 $cores" "$cores 1" "$cores $cores"; do
        read -r torch_threads blas_threads <<< "$setting"
        runs=()
        for ((r = 0; r < repeats; r++)); do
            OPENBLAS_NUM_THREADS=$blas_threads "$PYTHON" tests/torch_gpt.py "$DATA" 1 "${common[@]}" --threads "$torch_threads" > "$tmp/t.out"
            runs+=($(tail -1 "$tmp/t.out" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["train_seconds"])'))
        done
        m=$(printf '%s\n' "${runs[@]}" | median)
        printf "  the twin on %s cores, torch.set_num_threads(%s), OPENBLAS_NUM_THREADS=%s: %.2f s\n" "$cores" "$torch_threads" "$blas_threads" "$m"
        if [ -z "$best" ] || awk "BEGIN { exit !($m < $best) }"; then best=$m best_setting=$setting; fi
    done
    printf 'every core: ours %.2f s against the twin at its best (torch %s threads, OpenBLAS %s) %.2f s: %.2fx\n' \
        "$o" "${best_setting% *}" "${best_setting#* }" "$best" "$(awk "BEGIN { print $best / $o }")"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
