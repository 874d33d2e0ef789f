#!/usr/bin/env bash
# Benchmark (not a test): our programs against PyTorch yardsticks, side by
# side in one sitting, alternating runs so that machine noise hits both.
#   - tests/torch_mnist_ddp.py: the original workshop's script (a DataLoader
#     feeds every batch), at the same world sizes;
#   - tests/torch_fast_mlp.py: step 2 as a PyTorch expert writes it (the data
#     set resident in memory, no DataLoader), at 1 thread and at every core;
#   - tests/torch_cnn_ddp.py: step 14's SimpleCNN, one epoch, at 1 thread and
#     at every core.
# Then the GEMM yardstick (the sgemm peak of this machine, measured now) and
# step 5's profile at 1 thread and at every core: which ranges scale. Last,
# step 11 (streaming from HDF5) against step 10 at 1, 2 and 4 reader workers,
# and the reader alone.
#
#   tests/bench_vs_pytorch.sh [REPEATS]        (make bench)
#
# Times are medians over REPEATS (default 3): the training loop as each program
# reports it, and the end-to-end wall time (process start to exit).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
MPIRUN=${MPIRUN:-mpirun --oversubscribe $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
REFERENCE=${TORCH_REFERENCE:-tests/torch_mnist_ddp.py}
FAST=tests/torch_fast_mlp.py
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=${DATA:-data/mnist}
"$PYTHON" -c 'import torch' 2> /dev/null || { echo "needs python3-torch (./setup.sh --with-reference)" >&2; exit 1; }
[ -f "$REFERENCE" ] || { echo "no PyTorch reference at $REFERENCE (set TORCH_REFERENCE)" >&2; exit 1; }
# Measure as a user's machine runs: some sandboxes pin OpenBLAS to older
# kernels (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE). Here only, never in the tests.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
# Thread counts come from the flags of each run, never from the caller's environment.
unset OPENBLAS_NUM_THREADS GOTO_NUM_THREADS OMP_NUM_THREADS
cores=$(nproc)

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# spread "THEIR SECONDS..." "OUR SECONDS...": how far the ratio of two medians
# could move within the runs behind them (their fastest over our slowest, to
# their slowest over our fastest): on a noisy machine, read the ratio with it.
spread() {
    local theirs ours
    theirs=($(printf '%s\n' $1 | sort -g)) ours=($(printf '%s\n' $2 | sort -g))
    awk "BEGIN { printf \"%.2fx to %.2fx over the runs\", ${theirs[0]} / ${ours[-1]}, ${theirs[-1]} / ${ours[0]} }"
}
wall() { local t0 t1; t0=$(date +%s.%N); "$@" > "$out" 2>&1; t1=$(date +%s.%N); awk "BEGIN { print $t1 - $t0 }"; }
json() { "$PYTHON" -c "import json, sys; print(json.loads(open('$out').read().strip().splitlines()[-1])[sys.argv[1]])" "$1"; }
loop_s() { sed -n 's/.*Training completed in \([0-9.]*\) s.*/\1/p' "$out"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# Our program against PyTorch at each thread count (thread_counts), runs
# alternating, REPEATS each; the medians go into the associative arrays named
# by OURS (by thread count) and THEIRS (by config), one row each through ROW,
# then the ratios. A config is "THREADS|ENVIRONMENT|NAME": PyTorch at THREADS,
# under ENVIRONMENT (VAR=value, or nothing); the first one is PyTorch on one core.
#   versus_pytorch OURS THEIRS NAME RUN_OURS OUR_ACCURACY RUN_THEIRS TIME_KEY ROW CONFIG...
#     RUN_OURS THREADS, RUN_THEIRS THREADS ENVIRONMENT: run into $out;
#     OUR_ACCURACY: print ours from $out; TIME_KEY: PyTorch's time in its JSON;
#     ROW NAME THREADS SECONDS ACCURACY: print a row.
versus_pytorch() {
    local -n ours_=$1 theirs_=$2
    local name=$3 run_ours=$4 our_accuracy=$5 run_theirs=$6 time_key=$7 row=$8
    shift 8
    local configs=("$@") threads i config torch_threads torch_env label our_acc
    local -A our_runs=() their_runs=()  # every run's seconds, for the ratios' spread
    for threads in "${thread_counts[@]}"; do
        local our_loop=()
        local -A torch_loop=() torch_acc=()
        for ((i = 0; i < repeats; i++)); do
            "$run_ours" "$threads"
            our_loop+=("$(loop_s)")
            our_acc=$("$our_accuracy")
            for config in "${configs[@]}"; do
                IFS='|' read -r torch_threads torch_env label <<< "$config"
                [ "$torch_threads" = "$threads" ] || continue
                "$run_theirs" "$threads" "$torch_env"
                torch_loop[$config]+="$(json "$time_key") "
                torch_acc[$config]=$(printf '%.2f%%' "$(awk "BEGIN { print 100 * $(json test_acc) }")")
            done
        done
        ours_[$threads]=$(printf '%s\n' "${our_loop[@]}" | median)
        our_runs[$threads]="${our_loop[*]}"
        "$row" "$name$([ "$threads" = 1 ] && echo ", one core")" "$threads" "${ours_[$threads]}" "$our_acc"
        for config in "${configs[@]}"; do
            IFS='|' read -r torch_threads torch_env label <<< "$config"
            [ "$torch_threads" = "$threads" ] || continue
            theirs_[$config]=$(printf '%s\n' ${torch_loop[$config]} | median)
            their_runs[$config]=${torch_loop[$config]}
            "$row" "$label" "$threads" "${theirs_[$config]}" "${torch_acc[$config]}"
        done
    done
    local best_config best_threads
    best_config=$(for config in "${!theirs_[@]}"; do echo "${theirs_[$config]}#$config"; done | sort -g | head -1)
    best_config=${best_config#*#}
    best_threads=$(for threads in "${!ours_[@]}"; do echo "${ours_[$threads]} $threads"; done | sort -g | head -1)
    best_threads=${best_threads#* }
    printf '%-52s %8s %7.2fx (%s)\n' "  PyTorch's best / our best" "" \
        "$(awk "BEGIN { print ${theirs_[$best_config]} / ${ours_[$best_threads]} }")" \
        "$(spread "${their_runs[$best_config]}" "${our_runs[$best_threads]}")"
    printf '%-52s %8s %7.2fx (%s)\n' "  on one core: PyTorch / ours" "" \
        "$(awk "BEGIN { print ${theirs_[${configs[0]}]} / ${ours_[1]} }")" \
        "$(spread "${their_runs[${configs[0]}]}" "${our_runs[1]}")"
    [ "$cores" -gt 1 ] && printf '%-52s %8s %7.2fx\n' "  our speed-up from 1 to $cores threads" "" \
        "$(awk "BEGIN { print ${ours_[1]} / ${ours_[$cores]} }")"
    return 0
}

# What computes: the CPU, our BLAS and its kernels, PyTorch's BLAS and its kernels.
day1/2_mnist_training --epochs 1 --plot '' --data "$DATA" > "$out" 2>&1
our_blas=$(head -1 "$out" | grep -o 'OpenBLAS.*kernels)\|CBLAS$' || echo '?')
torch_blas=$("$PYTHON" - << 'PY' 2> /dev/null || echo '?'
import ctypes, ctypes.util, os, torch
library = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
try:
    blas = ctypes.CDLL("libopenblas.so.0")
    blas.openblas_get_corename.restype = ctypes.c_char_p
    kernels = " (%s kernels)" % blas.openblas_get_corename().decode()
except OSError:
    kernels = ""
print("torch %s, BLAS %s%s" % (torch.__version__, library, kernels))
PY
)
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $cores cores"
echo "ours:    $our_blas"
echo "PyTorch: $torch_blas"

# ---------------------------------------------------------------- against the original's script
# One row pair per configuration: our program against the reference with the
# same world size and learning-rate rule. --bind-to none lets every world size
# use every core (mpirun would pin one or two ranks to a core each). On a
# machine with a GPU, step 2 also runs there, against the reference on the
# same GPU. Every row names its device.
#
# The script bounds each rank's PyTorch threads (set_num_threads(cores / W)),
# not OpenBLAS's: each rank's GEMMs still run on one OpenBLAS thread per core,
# W times more threads than cores. At W > 1 it runs twice, as it comes and with
# OPENBLAS_NUM_THREADS=cores/W, and its better medians are the yardstick.
configs=(
    "1|day1/2_mnist_training||cpu"
    "2|day1/4_mnist_manual_ddp|--lr-scale|cpu"
    "1|day1/7_mnist_ddp_timing||cpu"
    "2|day1/7_mnist_ddp_timing||cpu"
    "4|day1/7_mnist_ddp_timing||cpu"
)
gpus=$(build/tools/gpu_count 2> /dev/null || echo 0)
[ "$gpus" -gt 0 ] && configs+=("1|day1/2_mnist_training||cuda")
echo
echo "== against the original workshop's script ($REFERENCE: a DataLoader feeds every batch)"
printf '%-40s %6s %8s %8s %9s\n' "program" "ranks" "loop s" "wall s" "test acc"
for config in "${configs[@]}"; do
    IFS='|' read -r ranks program torch_flags device <<< "$config"
    c_loop=() c_wall=() t_loop=() t_wall=() b_loop=() b_wall=()
    blas_share=$(( cores / ranks > 0 ? cores / ranks : 1 ))
    for ((i = 0; i < repeats; i++)); do
        if [ "$program" = day1/2_mnist_training ]; then
            c_wall+=("$(wall $program --device $device --data "$DATA" --plot '')")
        else
            c_wall+=("$(wall $MPIRUN --bind-to none -np $ranks $program --device $device --data "$DATA" --plot '')")
        fi
        c_loop+=("$(loop_s)")
        c_acc=$(sed -n 's/.*Test accuracy: \([0-9.]*%\).*/\1/p' "$out")
        t_wall+=("$(wall "$PYTHON" "$REFERENCE" "$DATA" $ranks $torch_flags --device $device)")
        t_loop+=("$(json train_s)")
        t_acc=$(printf '%.2f%%' "$(awk "BEGIN { print 100 * $(json test_acc) }")")
        if [ "$ranks" -gt 1 ] && [ "$device" = cpu ]; then
            b_wall+=("$(wall env OPENBLAS_NUM_THREADS=$blas_share "$PYTHON" "$REFERENCE" "$DATA" $ranks $torch_flags --device $device)")
            b_loop+=("$(json train_s)")
        fi
    done
    cl=$(printf '%s\n' "${c_loop[@]}" | median); cw=$(printf '%s\n' "${c_wall[@]}" | median)
    tl=$(printf '%s\n' "${t_loop[@]}" | median); tw=$(printf '%s\n' "${t_wall[@]}" | median)
    printf '%-40s %6d %8.3f %8.2f %9s\n' "$program ($device)" "$ranks" "$cl" "$cw" "$c_acc"
    printf '%-40s %6d %8.3f %8.2f %9s\n' "PyTorch reference ${torch_flags:-(lr 1e-3)} ($device)" "$ranks" "$tl" "$tw" "$t_acc"
    if [ ${#b_loop[@]} -gt 0 ]; then
        bl=$(printf '%s\n' "${b_loop[@]}" | median); bw=$(printf '%s\n' "${b_wall[@]}" | median)
        printf '%-40s %6d %8.3f %8.2f\n' "  the same, OPENBLAS_NUM_THREADS=$blas_share" "$ranks" "$bl" "$bw"
        awk "BEGIN { exit !($bl < $tl) }" && tl=$bl
        awk "BEGIN { exit !($bw < $tw) }" && tw=$bw
    fi
    printf '%-40s %6s %7.1fx %7.1fx\n' "  PyTorch's best time / ours" "" "$(awk "BEGIN { print $tl / $cl }")" "$(awk "BEGIN { print $tw / $cw }")"
done

# ---------------------------------------------------------------- against the idiomatic PyTorch
# Step 2 (5 epochs, batch 6400) at 1 thread and at every core, against the
# expert's loop at the same thread counts. Their time is the 5-epoch loop
# after a warm-up step; ours includes our first, cold step.
#
# torch.set_num_threads(1) bounds PyTorch's own threads, not OpenBLAS's: a
# torch that calls an OpenBLAS built with its own pthreads (Debian's does)
# still runs every GEMM on all of OpenBLAS's threads, one per core. So PyTorch
# at 1 thread runs twice here: as it comes (its GEMMs on every core), and with
# OPENBLAS_NUM_THREADS=1 (one core, like our --threads 1, which holds OpenBLAS
# at one thread). Its best of all its rows is the yardstick.
echo
echo "== step 2 against the idiomatic PyTorch ($FAST: data in memory, no DataLoader)"
printf '%-52s %8s %8s %9s\n' "program" "threads" "loop s" "test acc"
thread_counts=(1)
[ "$cores" -gt 1 ] && thread_counts+=("$cores")
run_mlp_ours() { wall day1/2_mnist_training --threads "$1" --data "$DATA" --plot '' > /dev/null; }
mlp_accuracy() { sed -n 's/.*Test accuracy: \([0-9.]*%\).*/\1/p' "$out"; }
run_mlp_theirs() { QUICK=1 wall env $2 "$PYTHON" "$FAST" "$DATA" cpu "$1" > /dev/null; }
mlp_row() { printf '%-52s %8d %8.3f %9s\n' "$@"; }
torch_configs=("1|OPENBLAS_NUM_THREADS=1|idiomatic PyTorch (cpu), one core")
[ "$cores" -gt 1 ] && torch_configs+=("1||idiomatic PyTorch (cpu), its GEMMs on $cores cores"
                                      "$cores||idiomatic PyTorch (cpu)")
declare -A ours theirs
versus_pytorch ours theirs "day1/2_mnist_training (cpu)" run_mlp_ours mlp_accuracy run_mlp_theirs loop5_warm_s mlp_row \
    "${torch_configs[@]}"
if [ "$gpus" -gt 0 ]; then
    wall day1/2_mnist_training --device cuda --data "$DATA" --plot '' > /dev/null
    gpu_ours=$(loop_s)
    QUICK=1 wall "$PYTHON" "$FAST" "$DATA" cuda > /dev/null
    printf '%-52s %8s %8.3f\n' "day1/2_mnist_training (cuda)" "" "$gpu_ours"
    printf '%-52s %8s %8.3f (cold %.3f)\n' "idiomatic PyTorch (cuda)" "" "$(json loop5_warm_s)" "$(json loop5_cold_s)"
fi

# ---------------------------------------------------------------- beside a busy neighbour
# The same loops at every core, beside one process that spins for as long as
# they run (a build, a browser, another user's job: one core's worth of
# demand), runs alternating, REPEATS each: ours as it comes (its idle threads
# spin briefly, then sleep: common/runtime/threads.c), ours under libgomp's own wait
# (GOMP_SPINCOUNT=300000, some milliseconds of spinning: how it ran before),
# PyTorch as it comes and PyTorch on one core. "alone" is each one's median in
# the table above; the slow-down is what the neighbour cost it.
if [ "$cores" -gt 1 ]; then
    echo
    echo "== step 2 beside a busy neighbour (one process spinning), medians of $repeats alternating runs"
    printf '%-52s %8s %8s %8s %9s\n' "program" "threads" "loop s" "alone s" "slow-down"
    # Bounded in time however this script ends (2 minutes a round, several
    # times what a round takes even on a loaded machine); killed as soon as the
    # runs are done.
    timeout $((120 * repeats)) awk 'BEGIN { while (1) {} }' &
    neighbour=$!
    trap 'kill $neighbour 2> /dev/null || true; rm -f "$out"' EXIT
    busy_ours=() busy_gomp=() busy_torch=() busy_torch1=()
    for ((i = 0; i < repeats; i++)); do
        wall day1/2_mnist_training --threads "$cores" --data "$DATA" --plot '' > /dev/null
        busy_ours+=("$(loop_s)")
        wall env GOMP_SPINCOUNT=300000 day1/2_mnist_training --threads "$cores" --data "$DATA" --plot '' > /dev/null
        busy_gomp+=("$(loop_s)")
        QUICK=1 wall "$PYTHON" "$FAST" "$DATA" cpu "$cores" > /dev/null
        busy_torch+=("$(json loop5_warm_s)")
        QUICK=1 wall env OPENBLAS_NUM_THREADS=1 "$PYTHON" "$FAST" "$DATA" cpu 1 > /dev/null
        busy_torch1+=("$(json loop5_warm_s)")
    done
    kill $neighbour 2> /dev/null || true  # gone already if the runs outlasted its bound
    wait $neighbour 2> /dev/null || true
    trap 'rm -f "$out"' EXIT
    busy_row() {  # name threads runs [alone seconds]
        local seconds
        seconds=$(printf '%s\n' $3 | median)
        if [ -n "${4:-}" ]; then
            printf '%-52s %8d %8.3f %8.3f %8.2fx\n' "$1" "$2" "$seconds" "$4" "$(awk "BEGIN { print $seconds / $4 }")"
        else
            printf '%-52s %8d %8.3f\n' "$1" "$2" "$seconds"
        fi
    }
    busy_row "day1/2_mnist_training (cpu)" "$cores" "${busy_ours[*]}" "${ours[$cores]}"
    busy_row "  the same, libgomp's wait (GOMP_SPINCOUNT=300000)" "$cores" "${busy_gomp[*]}"
    busy_row "idiomatic PyTorch (cpu)" "$cores" "${busy_torch[*]}" "${theirs[$cores||idiomatic PyTorch (cpu)]}"
    busy_row "idiomatic PyTorch (cpu), one core" 1 "${busy_torch1[*]}" \
        "${theirs[1|OPENBLAS_NUM_THREADS=1|idiomatic PyTorch (cpu), one core]}"
    # PyTorch's better configuration beside the neighbour, against ours.
    torch_busy=$(printf '%s\n' "${busy_torch[@]}" | median) torch1_busy=$(printf '%s\n' "${busy_torch1[@]}" | median)
    best_busy=("${busy_torch[@]}")
    awk "BEGIN { exit !($torch1_busy < $torch_busy) }" && best_busy=("${busy_torch1[@]}")
    printf '%-52s %8s %7.2fx (%s)\n' "  PyTorch's best / ours, beside the neighbour" "" \
        "$(awk "BEGIN { print $(printf '%s\n' "${best_busy[@]}" | median) / $(printf '%s\n' "${busy_ours[@]}" | median) }")" \
        "$(spread "${best_busy[*]}" "${busy_ours[*]}")"
fi

# ---------------------------------------------------------------- step 14, the CNN
# One epoch of the SimpleCNN at batch 64 on one rank, ours against PyTorch's
# training of the same network (tests/torch_cnn_ddp.py: the tutorial's loop,
# a DataLoader over the tensors in memory), each at 1 thread and at every
# core, runs alternating. An epoch is 938 steps of 25.0 MFLOP per image
# (conv1 forward and weight gradient, conv2 and the Linears forward and both
# gradients), 1.50 TFLOP in all.
CNN_REFERENCE=${TORCH_CNN_REFERENCE:-tests/torch_cnn_ddp.py}
echo
echo "== step 14 (SimpleCNN, 1 epoch, batch 64, 1 rank) against PyTorch's training of the same network ($CNN_REFERENCE)"
printf '%-52s %8s %8s %8s %9s %9s\n' "program" "threads" "loop s" "ms/step" "GFLOP/s" "test acc"
cnn_flop=$(awk 'BEGIN { print 60000 * 2 * (2 * 32*9*784 + 3 * 64*288*196 + 3 * 3136*128 + 3 * 128*10) }')
# PyTorch at 1 thread runs as above: as it comes, and on one core.
run_cnn_ours() { wall day3/14_cnn_ddp --threads "$1" --data "$DATA" --plot '' > /dev/null; }
cnn_accuracy() { sed -n 's/.*accuracy \([0-9.]*%\).*/\1/p' "$out"; }
run_cnn_theirs() { wall env $2 "$PYTHON" "$CNN_REFERENCE" "$DATA" 1 --threads "$1" --port 29531 > /dev/null; }
cnn_row() {  # name threads seconds accuracy
    printf '%-52s %8d %8.2f %8.2f %9.0f %9s\n' "$1" "$2" "$3" "$(awk "BEGIN { print 1000 * $3 / 938 }")" \
        "$(awk "BEGIN { print $cnn_flop / $3 / 1e9 }")" "$4"
}
cnn_configs=("1|OPENBLAS_NUM_THREADS=1|PyTorch, the same network (cpu), one core")
[ "$cores" -gt 1 ] && cnn_configs+=("1||PyTorch, the same network (cpu), OpenBLAS on $cores cores"
                                    "$cores||PyTorch, the same network (cpu)")
declare -A cnn_ours cnn_theirs
versus_pytorch cnn_ours cnn_theirs "day3/14_cnn_ddp (cpu)" run_cnn_ours cnn_accuracy run_cnn_theirs train_s cnn_row \
    "${cnn_configs[@]}"
if [ "$gpus" -gt 0 ]; then
    wall day3/14_cnn_ddp --device cuda --data "$DATA" --plot '' > /dev/null
    printf '%-52s %8s %8.2f %8.2f\n' "day3/14_cnn_ddp (cuda)" "" "$(loop_s)" "$(awk "BEGIN { print 1000 * $(loop_s) / 938 }")"
    wall "$PYTHON" "$CNN_REFERENCE" "$DATA" 1 --device cuda --port 29532 > /dev/null
    printf '%-52s %8s %8.2f %8.2f\n' "PyTorch, the same network (cuda)" "" "$(json train_s)" "$(awk "BEGIN { print 1000 * $(json train_s) / 938 }")"
fi

# ---------------------------------------------------------------- GEMM efficiency
# Step 2's 5 epochs do 300000 samples x 2 x (784*128 + 128*10) multiply-adds
# forward, and twice the first layer's and three times the second's in all
# (backward: both weight gradients, and the hidden layer's input gradient).
echo
echo "== the loop's GEMM rate against this machine's sgemm peak (measured now)"
flops=$(awk 'BEGIN { print 300000 * 2 * (2 * 784 * 128 + 3 * 128 * 10) }')
# The ceiling: step 2's two large GEMMs alone at the loop's shapes (the
# forward x @ W1^T and the weight gradient grad_h^T @ x, through our gemm()),
# the best of 20 each; nearly all of the loop's arithmetic is in them.
for threads in "${thread_counts[@]}"; do
    peak=$(build/tools/sgemm_peak "$threads")
    peak_rate=$(echo "$peak" | cut -d' ' -f1)
    rate=$(awk "BEGIN { print $flops / ${ours[$threads]} / 1e9 }")
    two_gemms=$(build/tools/sgemm_peak "$threads" mlp | sed -n 's/^both: \(.*\)/\1/p')
    two_gemms_rate=$(echo "$two_gemms" | awk '{ print $3 }')
    printf '%2d thread(s): loop %.0f GFLOP/s, sgemm peak %s: %.0f%% of peak\n' "$threads" "$rate" "$peak" \
        "$(awk "BEGIN { print 100 * $rate / $peak_rate }")"
    printf '              the two large GEMMs alone: %s, %.0f%% of peak\n' "$two_gemms" \
        "$(awk "BEGIN { print 100 * $two_gemms_rate / $peak_rate }")"
done

# ---------------------------------------------------------------- which ranges scale
# Step 5 (one rank, 5 epochs) at 1 thread and at every core: per range, the
# mean ms per step at each, and the speed-up.
if [ "$cores" -gt 1 ]; then
    echo
    echo "== step 5's profile (1 rank, 5 epochs): ms per step at 1 and $cores threads"
    for threads in 1 "$cores"; do
        day1/5_mnist_manual_ddp_profile --epochs 5 --threads "$threads" --data "$DATA" --plot '' --trace '' \
            2>&1 | awk '/^ *(step|data|forward|loss|backward|allreduce|optimizer) / { print $1, $(NF - 1) }' > "$out.$threads"
    done
    printf '%-12s %10s %10s %9s\n' "range" "1 thread" "$cores threads" "speed-up"
    join <(sort "$out.1") <(sort "$out.$cores") | sort -k2 -g -r |
        awk '{ printf "%-12s %10.3f %10.3f %8.2fx\n", $1, $2, $3, $2 / $3 }'
    rm -f "$out.1" "$out.$cores"
fi

# ---------------------------------------------------------------- step 11: streaming from HDF5
# Step 11 against step 10 (the same training, data in memory) at 1 and 2 ranks,
# from the default file (uint8, uncompressed) and a gzip one, at 1, 2 and 4
# reader workers; then the reader alone (no training) at 1, 2 and 4 workers.
echo
echo "== step 11 (streaming from HDF5) against step 10 (data in memory): loop s, and how long the loop waited for data"
h5dir=$(mktemp -d)
trap 'rm -f "$out"; rm -rf "$h5dir"' EXIT
day2/create_mnist_h5 --data "$DATA" --out "$h5dir/mnist.h5" > /dev/null
day2/create_mnist_h5 --data "$DATA" --out "$h5dir/mnist_gzip.h5" --gzip 4 > /dev/null
waited_s() { sed -n 's/.*the loop waited \([0-9.]*\) s for data.*/\1/p' "$out"; }
printf '%-46s %6s %8s %8s %9s\n' "program" "ranks" "loop s" "waited" "÷ step 10"
for ranks in 1 2; do
    step10=() ; declare -A s11 w11
    for ((i = 0; i < repeats; i++)); do
        wall $MPIRUN --bind-to none -np $ranks day2/10_mnist_ddp_multinode --data "$DATA" --plot '' > /dev/null
        step10+=("$(loop_s)")
        for file in mnist mnist_gzip; do
            for workers in 1 2 4; do
                wall $MPIRUN --bind-to none -np $ranks day2/11_multinode_streaming --h5 "$h5dir/$file.h5" \
                    --workers $workers --plot '' > /dev/null
                s11[$file.$workers]+="$(loop_s) " w11[$file.$workers]+="$(waited_s) "
            done
        done
    done
    base=$(printf '%s\n' "${step10[@]}" | median)
    printf '%-46s %6d %8.3f %8s %9s\n' "day2/10_mnist_ddp_multinode" "$ranks" "$base" "" ""
    for file in mnist mnist_gzip; do
        for workers in 1 2 4; do
            l=$(printf '%s\n' ${s11[$file.$workers]} | median) w=$(printf '%s\n' ${w11[$file.$workers]} | median)
            printf '%-46s %6d %8.3f %8.3f %8.2fx\n' "day2/11 $file.h5 --workers $workers" "$ranks" "$l" "$w" \
                "$(awk "BEGIN { print $l / $base }")"
        done
    done
    unset s11 w11
done
echo
echo "== step 11's reader alone (1 rank, 5 epochs, no training): GB/s of float32 pixels delivered"
for file in mnist mnist_gzip; do
    for workers in 1 2 4; do
        build/tools/h5_read_bench "$h5dir/$file.h5" "$workers" 2 5 | head -1
    done
done
