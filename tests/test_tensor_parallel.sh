#!/usr/bin/env bash
# Step 17, the MLP's Linears split across ranks (Megatron's tensor parallelism)
# under DDP, against plain DDP: with the same seed and flags, T tensor-parallel
# ranks x D replicas take the steps of step 6 on D ranks (T x 1: step 2's), bit
# for bit at T = 1 and within 1e-5 at T > 1 (the row-parallel layer adds its T
# partial sums in another order than one GEMM); deeper MLPs (--hidden: column
# and row pairs, an odd last Linear whole) at T = 2 and 4 take the steps of the
# same MLP at T = 1, which are step 16's. Also: the bytes each rank holds and
# sends beside the theory; --init and --save between steps 6 and 17; --trace;
# bad flags (one line, exit 2, every rank); a rank killed mid-allreduce ends the job.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
MPIRUN=${MPIRUN:-mpirun --oversubscribe $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
DATA=${DATA:-data/mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS tensor parallel: $*"; }
fail() { echo "FAIL tensor parallel: $*"; }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }

if [ ! -x day4/17_tensor_parallel ]; then
    fail "day4/17_tensor_parallel is not built (make)"
    exit 1
fi
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -f "$DATA/train-images-idx3-ubyte" ]; then
    echo "SKIP tensor parallel: no MNIST in $DATA (make data)"
    exit 0
fi

# run NP NAME PROGRAM FLAGS...: one epoch, no shuffle, losses and weights kept as $tmp/NAME.*
run() {
    local np=$1 name=$2; shift 2
    timeout 300 $MPIRUN -np "$np" "$@" --data "$DATA" --epochs 1 --no-shuffle --plot '' \
        --losses "$tmp/$name.csv" --save "$tmp/$name.h5" > "$tmp/$name.out" 2>&1
    local status=$?
    [ $status -eq 0 ] || fail "$name: exit $status: $(grep -v '^rank\|^Step\|^epoch' "$tmp/$name.out" | head -3 | tr '\n' ' ')"
    return $status
}
checksum() { grep -o 'parameter checksum [0-9a-f]*' "$1" | sort -u | awk '{ print $3 }' | tr '\n' ' ' | sed 's/ $//'; }
accuracy() { sed -n 's/.*Test accuracy: \([0-9.]*\)%.*/\1/p' "$1" | head -1; }
same_checksum() {  # WHAT A.out B.out
    check "$1: checksums $(checksum "$2") and $(checksum "$3")" test -n "$(checksum "$3")" -a "$(checksum "$2")" = "$(checksum "$3")"
}
same_accuracy() {  # WHAT A.out B.out
    check "$1 ($(accuracy "$2")% and $(accuracy "$3")%)" test -n "$(accuracy "$3")" -a "$(accuracy "$2")" = "$(accuracy "$3")"
}

# ---------------------------------------------------------------- the same steps as plain DDP
run 1 ref2 day1/2_mnist_training
run 1 ref6_1 day1/6_mnist_ddp
run 2 ref6_2 day1/6_mnist_ddp
run 1 tp1 day4/17_tensor_parallel --tp 1
run 2 tp1_dp2 day4/17_tensor_parallel --tp 1
run 2 tp2 day4/17_tensor_parallel --tp 2
run 4 tp2_dp2 day4/17_tensor_parallel --tp 2
# T = 1: the same operations in the same order as steps 2 and 6.
same_weights "1 tensor-parallel rank x 1 replica ends with step 2's weights, bit for bit" "$tmp/tp1.h5" "$tmp/ref2.h5" 0
same_checksum "the whole model's checksum at T = 1 is step 6's on 1 rank" "$tmp/tp1.out" "$tmp/ref6_1.out"
same_weights "1 x 2 replicas end with step 6's weights on 2 ranks, bit for bit" "$tmp/tp1_dp2.h5" "$tmp/ref6_2.h5" 0
# T = 2: the row-parallel layer's two partial sums added after the GEMMs: within 1e-5.
verdict=$(same_losses "$tmp/ref2.csv" "$tmp/tp2.csv" 1e-5)
check "2 tensor-parallel ranks log step 2's losses within 1e-5 ($verdict)" test $? -eq 0
same_weights "2 tensor-parallel ranks end with step 2's weights within 1e-5" "$tmp/tp2.h5" "$tmp/ref2.h5" 1e-5
same_accuracy "2 tensor-parallel ranks reach step 2's test accuracy" "$tmp/tp2.out" "$tmp/ref2.out"
verdict=$(same_losses "$tmp/ref6_2.csv" "$tmp/tp2_dp2.csv" 1e-5)
check "2 tensor-parallel ranks x 2 replicas (4 ranks) log step 6's losses on 2 ranks within 1e-5 ($verdict)" test $? -eq 0
same_weights "2 x 2 end with step 6's weights on 2 ranks within 1e-5" "$tmp/tp2_dp2.h5" "$tmp/ref6_2.h5" 1e-5
same_accuracy "2 x 2 reach step 6's test accuracy on 2 ranks" "$tmp/tp2_dp2.out" "$tmp/ref6_2.out"
check "the two replicas end with the same model: checksums '$(checksum "$tmp/tp2_dp2.out")' (one)" \
    test "$(checksum "$tmp/tp2_dp2.out" | wc -w)" -eq 1
check "the grid: rank 3 is tensor-parallel rank 1 of 2, replica 1 of 2, with fc.0's rows 64-127 and fc.2's columns 64-127" \
    grep -qx 'rank 3: tensor-parallel rank 1 of 2, replica 1 of 2: fc.0 rows 64-127, fc.2 columns 64-127' "$tmp/tp2_dp2.out"

# Deeper MLPs: two column/row pairs (784-64-64-64-10), and a pair with the last Linear whole (784-64-64-10),
# at T = 1 take step 16's steps bit for bit (the same checksum), at T = 2 and 4 within 1e-5 of T = 1's.
for hidden in 64,64,64 64,64; do
    deep=(--hidden $hidden --batch_size 3200) model=784-${hidden//,/-}-10
    run 1 "deep${hidden}_tp1" day4/17_tensor_parallel --tp 1 "${deep[@]}"
    run 1 "deep${hidden}_pp1" day4/16_pipeline_ddp --pp 1 "${deep[@]}"
    same_checksum "$model at T = 1 ends with step 16's weights, bit for bit" "$tmp/deep${hidden}_tp1.out" "$tmp/deep${hidden}_pp1.out"
    for t in 2 $(if_thorough 4); do
        run $t "deep${hidden}_tp$t" day4/17_tensor_parallel --tp $t "${deep[@]}"
        verdict=$(same_losses "$tmp/deep${hidden}_tp1.csv" "$tmp/deep${hidden}_tp$t.csv" 1e-5)
        check "$model at T = $t: T = 1's losses within 1e-5 ($verdict)" test $? -eq 0
        same_accuracy "$model at T = $t: T = 1's test accuracy" "$tmp/deep${hidden}_tp$t.out" "$tmp/deep${hidden}_tp1.out"
    done
done
if thorough; then
    run 4 deep_tp2_dp2 day4/17_tensor_parallel --tp 2 --hidden 64,64,64 --batch_size 3200
    run 2 deep_tp1_dp2 day4/17_tensor_parallel --tp 1 --hidden 64,64,64 --batch_size 3200
    verdict=$(same_losses "$tmp/deep_tp1_dp2.csv" "$tmp/deep_tp2_dp2.csv" 1e-5)
    check "784-64-64-64-10, 2 x 2 replicas: 1 x 2 replicas' losses within 1e-5 ($verdict)" test $? -eq 0
fi

# ---------------------------------------------------------------- what the attendee sees
# Each rank holds 16 B x (the split weights / T + the whole ones): 784-128-10 at T = 2: 101760 / 2 + 10
# weights, 814,160 B; and per step sends one g allreduce of [6400, 10] floats (256,000 B), no f
# (fc.0's input is the data), and DDP's allreduce of its part's 50,890 gradients over 2 replicas.
row() { sed -n "s/^ *$2  *//p" "$1" | head -1; }
check "memory at T = 2, rank 1: held 0.81 MB = theory 0.81 MB, DDP's 1.63 MB ($(row "$tmp/tp2_dp2.out" 1))" \
    awk -v r="$(row "$tmp/tp2_dp2.out" 1)" 'BEGIN { split(r, f, " "); exit !(f[4] == 0.81 && f[5] == 0.81 && f[6] == 1.63 && f[7] > 0) }'
comm() { grep "^$2" "$1" | awk '{ print $(NF - 3), $(NF - 2), $(NF - 1), $NF }'; }  # calls, MB, theory, a ring's
check "g at T = 2: 1 allreduce of 0.26 MB a step, as the theory, a ring sends 0.26 MB ($(comm "$tmp/tp2_dp2.out" 'g: forward'))" \
    test "$(comm "$tmp/tp2_dp2.out" 'g: forward')" = "1 0.26 0.26 0.26"
check "f at T = 2 on 784-128-10: none, fc.0's input is the data ($(comm "$tmp/tp2_dp2.out" 'f: backward'))" \
    test "$(comm "$tmp/tp2_dp2.out" 'f: backward')" = "0 0.00 0.00 0.00"
check "DDP over 2 replicas: 0.20 MB, its part's gradients ($(comm "$tmp/tp2_dp2.out" 'DDP: the gradients'))" \
    test "$(comm "$tmp/tp2_dp2.out" 'DDP: the gradients')" = "1 0.20 0.20 0.20"
# 784-64-64-64-10 at T = 2, batch 3200: g of fc.2 and fc.6 ([3200, 64] and [3200, 10]: 0.95 MB), f at fc.4 ([3200, 64]: 0.82 MB).
check "784-64-64-64-10 at T = 2: g 2 allreduces of 0.95 MB, f 1 of 0.82 MB, as the theory ($(comm "$tmp/deep64,64,64_tp2.out" 'g: forward'); $(comm "$tmp/deep64,64,64_tp2.out" 'f: backward'))" \
    test "$(comm "$tmp/deep64,64,64_tp2.out" 'g: forward')" = "2 0.95 0.95 0.95" -a "$(comm "$tmp/deep64,64,64_tp2.out" 'f: backward')" = "1 0.82 0.82 0.82"

timeout 120 $MPIRUN -np 2 day4/17_tensor_parallel --tp 2 --max_steps 3 --data "$DATA" --plot '' \
    --losses "$tmp/steps.csv" --trace "$tmp/trace.json" > "$tmp/shown.out" 2>&1
check "--max_steps 3: 3 steps ($(grep -o '([0-9]* steps)' "$tmp/shown.out"), $(($(wc -l < "$tmp/steps.csv") - 1)) logged)" \
    eval 'grep -q "(3 steps)" "$tmp/shown.out" && [ "$(wc -l < "$tmp/steps.csv")" -eq 4 ]'
check "--trace: both ranks' forward, backward and g ranges" eval \
    '${PYTHON:-/usr/bin/python3} -c "
import json, sys
events = json.load(open(sys.argv[1]))[\"traceEvents\"]
names = {(e.get(\"pid\"), e.get(\"name\")) for e in events}
sys.exit(not all((r, n) in names for r in (0, 1) for n in (\"forward\", \"backward\", \"g: allreduce\")))" "$tmp/trace.json"'

# --init from step 6's weights file and --save into it: one state_dict layout, whatever T.
timeout 120 $MPIRUN -np 2 day4/17_tensor_parallel --tp 2 --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle \
    --plot '' --losses "$tmp/init17.csv" --save "$tmp/init17.h5" > /dev/null 2>&1
day1/2_mnist_training --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle --plot '' \
    --losses "$tmp/init2.csv" --save "$tmp/init2.h5" > /dev/null 2>&1
same_weights "--init from step 6's file: 2 tensor-parallel ranks take step 2's steps from it, and --save writes its file (1e-5)" \
    "$tmp/init17.h5" "$tmp/init2.h5" 1e-5

# ---------------------------------------------------------------- bad input
# refused NP WHAT PATTERN FLAGS...: exit 2, the one line (on every rank alike: printed once).
refused() {
    local np=$1 what=$2 pattern=$3 status; shift 3
    timeout 60 $MPIRUN -np "$np" day4/17_tensor_parallel --data "$DATA" "$@" > "$tmp/bad" 2>&1
    status=$?
    local lines; lines=$(grep -c '^error: ' "$tmp/bad")
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$pattern" "$tmp/bad"; then
        pass "$what: exit 2, one line: $(grep '^error: ' "$tmp/bad")"
    else
        fail "$what: exit $status, $lines error line(s): $(head -3 "$tmp/bad" | tr '\n' ' ')"
    fi
}
refused 3 "--tp 2 on 3 ranks" '--tp 2: the world size 3 is not a multiple of it' --tp 2
refused 2 "--tp 3 on 2 ranks" '--tp 3: the world size 2 is not a multiple of it' --tp 3
refused 4 "--tp 4 with a hidden width of 130" '--tp 4: the hidden width 130 (fc.0' --tp 4 --hidden 130
refused 2 "--tp 2 with fc.4's 63 outputs (the second pair's column-parallel layer)" '--tp 2: the hidden width 63 (fc.4' \
    --tp 2 --hidden 64,64,63
refused 2 "--tp 0" '--tp' --tp 0
refused 2 "--hidden that does not parse" "--hidden 512,,512: expected" --tp 2 --hidden 512,,512

# ---------------------------------------------------------------- a rank killed mid-allreduce
# Its partner waits in the g allreduce of every forward for a sum that never comes; mpirun ends the
# job (on GPUs, the polled waits do where nothing else would: tests/test_gpu.sh's lost peer).
: > "$tmp/killed.out"  # there before the job's own redirection, which the loop below may outrun
timeout 120 $MPIRUN -np 2 day4/17_tensor_parallel --tp 2 --data "$DATA" --epochs 50 --plot '' > "$tmp/killed.out" 2>&1 &
job=$!
for ((t = 0; t < 300; t++)); do grep -q '^epoch 1/' "$tmp/killed.out" && break; sleep 0.1; done
launcher=$(pgrep -P "$job" | head -1)
victim=$(pgrep -P "${launcher:-0}" | tail -1)
start=$(date +%s)
[ -n "$victim" ] && kill -KILL "$victim"
wait "$job"
status=$?
seconds=$(($(date +%s) - start))
check "a tensor-parallel rank killed mid-training (SIGKILL, pid ${victim:-none}) ends the job: exit $status after $seconds s, not the test's timeout" \
    test -n "$victim" -a $status -ne 0 -a $status -ne 124 -a $seconds -lt 60
