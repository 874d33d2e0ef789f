#!/usr/bin/env bash
# Benchmark (not a test): our steps 2 and 4 against the PyTorch reference, side
# by side in one sitting, alternating runs so that machine noise hits both.
#
#   tests/bench_vs_pytorch.sh [REPEATS]        (make bench)
#
# Reports, per world size, the median training-loop time (as each program
# prints it) and the end-to-end wall time (process start to exit).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
MPIRUN=${MPIRUN:-mpirun --oversubscribe $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
REFERENCE=${TORCH_REFERENCE:-tests/torch_mnist_ddp.py}
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=${DATA:-data/mnist}
"$PYTHON" -c 'import torch' 2> /dev/null || { echo "needs python3-torch (./setup.sh --with-reference)" >&2; exit 1; }
[ -f "$REFERENCE" ] || { echo "no PyTorch reference at $REFERENCE (set TORCH_REFERENCE)" >&2; exit 1; }

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
wall() { local t0 t1; t0=$(date +%s.%N); "$@" > "$out" 2>&1; t1=$(date +%s.%N); awk "BEGIN { print $t1 - $t0 }"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

printf '%-34s %8s %8s %10s %10s\n' "program" "ranks" "loop s" "wall s" "test acc"
for ranks in 1 2; do
    declare -a c_loop=() c_wall=() t_loop=() t_wall=()
    for ((i = 0; i < repeats; i++)); do
        if [ $ranks = 1 ]; then
            c_wall+=("$(wall day1/2_mnist_training --data "$DATA" --plot '')")
        else
            c_wall+=("$(wall $MPIRUN -np $ranks day1/4_mnist_manual_ddp --data "$DATA" --plot '')")
        fi
        c_loop+=("$(sed -n 's/.*Training completed in \([0-9.]*\) s.*/\1/p' "$out")")
        c_acc=$(sed -n 's/.*Test accuracy: \([0-9.]*%\).*/\1/p' "$out")
        t_wall+=("$(wall "$PYTHON" "$REFERENCE" "$DATA" $ranks --lr-scale)")
        t_loop+=("$("$PYTHON" -c "import json,sys; print(json.loads(open('$out').read().strip().splitlines()[-1])['train_s'])")")
        t_acc=$("$PYTHON" -c "import json; print('%.2f%%' % (100 * json.loads(open('$out').read().strip().splitlines()[-1])['test_acc']))")
    done
    cl=$(printf '%s\n' "${c_loop[@]}" | median); cw=$(printf '%s\n' "${c_wall[@]}" | median)
    tl=$(printf '%s\n' "${t_loop[@]}" | median); tw=$(printf '%s\n' "${t_wall[@]}" | median)
    name=$([ $ranks = 1 ] && echo "day1/2_mnist_training" || echo "day1/4_mnist_manual_ddp")
    printf '%-34s %8d %8.2f %10.2f %10s\n' "$name" $ranks "$cl" "$cw" "$c_acc"
    printf '%-34s %8d %8.2f %10.2f %10s\n' "PyTorch reference (gloo, lr x W)" $ranks "$tl" "$tw" "$t_acc"
    printf '%-34s %8s %7.1fx %9.1fx\n' "  speed-up" "" "$(awk "BEGIN { print $tl / $cl }")" "$(awk "BEGIN { print $tw / $cw }")"
done
