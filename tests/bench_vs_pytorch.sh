#!/usr/bin/env bash
# Benchmark (not a test): our steps 2, 4 and 7 against the PyTorch reference,
# side by side in one sitting, alternating runs so that machine noise hits both.
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

# One row pair per configuration: our program against the PyTorch reference
# with the same world size and learning-rate rule. --bind-to none lets every
# world size use every core (mpirun would pin a single rank to one core).
# On a machine with a GPU, step 2 also runs there, against the reference on
# the same GPU (--device cuda). Every row names its device.
configs=(
    "1|day1/2_mnist_training||cpu"
    "2|day1/4_mnist_manual_ddp|--lr-scale|cpu"
    "1|day1/7_mnist_ddp_timing||cpu"
    "2|day1/7_mnist_ddp_timing||cpu"
    "4|day1/7_mnist_ddp_timing||cpu"
)
[ "$(build/tools/gpu_count 2> /dev/null || echo 0)" -gt 0 ] && configs+=("1|day1/2_mnist_training||cuda")
printf '%-40s %6s %8s %8s %9s\n' "program" "ranks" "loop s" "wall s" "test acc"
for config in "${configs[@]}"; do
    IFS='|' read -r ranks program torch_flags device <<< "$config"
    c_loop=() c_wall=() t_loop=() t_wall=()
    for ((i = 0; i < repeats; i++)); do
        if [ "$program" = day1/2_mnist_training ]; then
            c_wall+=("$(wall $program --device $device --data "$DATA" --plot '')")
        else
            c_wall+=("$(wall $MPIRUN --bind-to none -np $ranks $program --device $device --data "$DATA" --plot '')")
        fi
        c_loop+=("$(sed -n 's/.*Training completed in \([0-9.]*\) s.*/\1/p' "$out")")
        c_acc=$(sed -n 's/.*Test accuracy: \([0-9.]*%\).*/\1/p' "$out")
        t_wall+=("$(wall "$PYTHON" "$REFERENCE" "$DATA" $ranks $torch_flags --device $device)")
        t_loop+=("$("$PYTHON" -c "import json; print(json.loads(open('$out').read().strip().splitlines()[-1])['train_s'])")")
        t_acc=$("$PYTHON" -c "import json; print('%.2f%%' % (100 * json.loads(open('$out').read().strip().splitlines()[-1])['test_acc']))")
    done
    cl=$(printf '%s\n' "${c_loop[@]}" | median); cw=$(printf '%s\n' "${c_wall[@]}" | median)
    tl=$(printf '%s\n' "${t_loop[@]}" | median); tw=$(printf '%s\n' "${t_wall[@]}" | median)
    printf '%-40s %6d %8.3f %8.2f %9s\n' "$program ($device)" "$ranks" "$cl" "$cw" "$c_acc"
    printf '%-40s %6d %8.3f %8.2f %9s\n' "PyTorch reference ${torch_flags:-(lr 1e-3)} ($device)" "$ranks" "$tl" "$tw" "$t_acc"
    printf '%-40s %6s %7.1fx %7.1fx\n' "  PyTorch time / ours" "" "$(awk "BEGIN { print $tl / $cl }")" "$(awk "BEGIN { print $tw / $cw }")"
done
