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
suite "tensor parallel"
needs_built day4/17_tensor_parallel
needs_mnist
scratch
same_checksum() {  # WHAT A.out B.out
    expect "$1: checksums $(checksum "$2") and $(checksum "$3")" test -n "$(checksum "$3")" -a "$(checksum "$2")" = "$(checksum "$3")"
}
same_accuracy() {  # WHAT A.out B.out
    expect "$1 ($(accuracy "$2")% and $(accuracy "$3")%)" test -n "$(accuracy "$3")" -a "$(accuracy "$2")" = "$(accuracy "$3")"
}

# ---------------------------------------------------------------- the same steps as plain DDP
train 1 ref2 day1/2_mnist_training
train 1 ref6_1 day1/6_mnist_ddp
train 2 ref6_2 day1/6_mnist_ddp
train 1 tp1 day4/17_tensor_parallel --tp 1
train 2 tp1_dp2 day4/17_tensor_parallel --tp 1
train 2 tp2 day4/17_tensor_parallel --tp 2
train 4 tp2_dp2 day4/17_tensor_parallel --tp 2
# T = 1: the same operations in the same order as steps 2 and 6.
same_weights "1 tensor-parallel rank x 1 replica ends with step 2's weights, bit for bit" "$tmp/tp1.h5" "$tmp/ref2.h5" 0
same_checksum "the whole model's checksum at T = 1 is step 6's on 1 rank" "$tmp/tp1.out" "$tmp/ref6_1.out"
same_weights "1 x 2 replicas end with step 6's weights on 2 ranks, bit for bit" "$tmp/tp1_dp2.h5" "$tmp/ref6_2.h5" 0
# T = 2: the row-parallel layer's two partial sums added after the GEMMs: within 1e-5.
verdict=$(same_losses "$tmp/ref2.csv" "$tmp/tp2.csv" 1e-5)
expect "2 tensor-parallel ranks log step 2's losses within 1e-5 ($verdict)" test $? -eq 0
same_weights "2 tensor-parallel ranks end with step 2's weights within 1e-5" "$tmp/tp2.h5" "$tmp/ref2.h5" 1e-5
same_accuracy "2 tensor-parallel ranks reach step 2's test accuracy" "$tmp/tp2.out" "$tmp/ref2.out"
verdict=$(same_losses "$tmp/ref6_2.csv" "$tmp/tp2_dp2.csv" 1e-5)
expect "2 tensor-parallel ranks x 2 replicas (4 ranks) log step 6's losses on 2 ranks within 1e-5 ($verdict)" test $? -eq 0
same_weights "2 x 2 end with step 6's weights on 2 ranks within 1e-5" "$tmp/tp2_dp2.h5" "$tmp/ref6_2.h5" 1e-5
same_accuracy "2 x 2 reach step 6's test accuracy on 2 ranks" "$tmp/tp2_dp2.out" "$tmp/ref6_2.out"
expect "the two replicas end with the same model: checksums '$(checksum "$tmp/tp2_dp2.out")' (one)" \
    test "$(checksum "$tmp/tp2_dp2.out" | wc -w)" -eq 1
expect "the grid: rank 3 is tensor-parallel rank 1 of 2, replica 1 of 2, with fc.0's rows 64-127 and fc.2's columns 64-127" \
    grep -qx 'rank 3: tensor-parallel rank 1 of 2, replica 1 of 2: fc.0 rows 64-127, fc.2 columns 64-127' "$tmp/tp2_dp2.out"

# Deeper MLPs: two column/row pairs (784-64-64-64-10), and a pair with the last Linear whole (784-64-64-10),
# at T = 1 take step 16's steps bit for bit (the same checksum), at T = 2 and 4 within 1e-5 of T = 1's.
for hidden in 64,64,64 64,64; do
    deep=(--hidden $hidden --batch_size 3200) model=784-${hidden//,/-}-10
    train 1 "deep${hidden}_tp1" day4/17_tensor_parallel --tp 1 "${deep[@]}"
    train 1 "deep${hidden}_pp1" day4/16_pipeline_ddp --pp 1 "${deep[@]}"
    same_checksum "$model at T = 1 ends with step 16's weights, bit for bit" "$tmp/deep${hidden}_tp1.out" "$tmp/deep${hidden}_pp1.out"
    for t in 2 $(if_thorough 4); do
        train $t "deep${hidden}_tp$t" day4/17_tensor_parallel --tp $t "${deep[@]}"
        verdict=$(same_losses "$tmp/deep${hidden}_tp1.csv" "$tmp/deep${hidden}_tp$t.csv" 1e-5)
        expect "$model at T = $t: T = 1's losses within 1e-5 ($verdict)" test $? -eq 0
        same_accuracy "$model at T = $t: T = 1's test accuracy" "$tmp/deep${hidden}_tp$t.out" "$tmp/deep${hidden}_tp1.out"
    done
done
if thorough; then
    train 4 deep_tp2_dp2 day4/17_tensor_parallel --tp 2 --hidden 64,64,64 --batch_size 3200
    train 2 deep_tp1_dp2 day4/17_tensor_parallel --tp 1 --hidden 64,64,64 --batch_size 3200
    verdict=$(same_losses "$tmp/deep_tp1_dp2.csv" "$tmp/deep_tp2_dp2.csv" 1e-5)
    expect "784-64-64-64-10, 2 x 2 replicas: 1 x 2 replicas' losses within 1e-5 ($verdict)" test $? -eq 0
fi

# ---------------------------------------------------------------- what the attendee sees
# Each rank holds 16 B x (the split weights / T + the whole ones): 784-128-10 at T = 2: 101760 / 2 + 10
# weights, 814,160 B; and per step sends one g allreduce of [6400, 10] floats (256,000 B), no f
# (fc.0's input is the data), and DDP's allreduce of its part's 50,890 gradients over 2 replicas.
row() { sed -n "s/^ *$2  *//p" "$1" | head -1; }
expect "memory at T = 2, rank 1: held 0.81 MB = theory 0.81 MB, DDP's 1.63 MB ($(row "$tmp/tp2_dp2.out" 1))" \
    awk -v r="$(row "$tmp/tp2_dp2.out" 1)" 'BEGIN { split(r, f, " "); exit !(f[4] == 0.81 && f[5] == 0.81 && f[6] == 1.63 && f[7] > 0) }'
comm() { grep "^$2" "$1" | awk '{ print $(NF - 3), $(NF - 2), $(NF - 1), $NF }'; }  # calls, MB, theory, a ring's
expect "g at T = 2: 1 allreduce of 0.26 MB a step, as the theory, a ring sends 0.26 MB ($(comm "$tmp/tp2_dp2.out" 'g: forward'))" \
    test "$(comm "$tmp/tp2_dp2.out" 'g: forward')" = "1 0.26 0.26 0.26"
expect "f at T = 2 on 784-128-10: none, fc.0's input is the data ($(comm "$tmp/tp2_dp2.out" 'f: backward'))" \
    test "$(comm "$tmp/tp2_dp2.out" 'f: backward')" = "0 0.00 0.00 0.00"
expect "DDP over 2 replicas: 0.20 MB, its part's gradients ($(comm "$tmp/tp2_dp2.out" 'DDP: the gradients'))" \
    test "$(comm "$tmp/tp2_dp2.out" 'DDP: the gradients')" = "1 0.20 0.20 0.20"
# 784-64-64-64-10 at T = 2, batch 3200: g of fc.2 and fc.6 ([3200, 64] and [3200, 10]: 0.95 MB), f at fc.4 ([3200, 64]: 0.82 MB).
expect "784-64-64-64-10 at T = 2: g 2 allreduces of 0.95 MB, f 1 of 0.82 MB, as the theory ($(comm "$tmp/deep64,64,64_tp2.out" 'g: forward'); $(comm "$tmp/deep64,64,64_tp2.out" 'f: backward'))" \
    test "$(comm "$tmp/deep64,64,64_tp2.out" 'g: forward')" = "2 0.95 0.95 0.95" -a "$(comm "$tmp/deep64,64,64_tp2.out" 'f: backward')" = "1 0.82 0.82 0.82"

mpi 2 day4/17_tensor_parallel --tp 2 --max_steps 3 --data "$DATA" --plot '' \
    --losses "$tmp/steps.csv" --trace "$tmp/trace.json" > "$tmp/shown.out" 2>&1
expect "--max_steps 3: 3 steps ($(grep -o '([0-9]* steps)' "$tmp/shown.out"), $(($(wc -l < "$tmp/steps.csv") - 1)) logged)" \
    eval 'grep -q "(3 steps)" "$tmp/shown.out" && [ "$(wc -l < "$tmp/steps.csv")" -eq 4 ]'
expect "--trace: both ranks' forward, backward and g ranges" \
    trace_has_ranges "$tmp/trace.json" 2 forward backward "g: allreduce"

# --init from step 6's weights file and --save into it: one state_dict layout, whatever T.
mpi 2 day4/17_tensor_parallel --tp 2 --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle \
    --plot '' --losses "$tmp/init17.csv" --save "$tmp/init17.h5" > /dev/null 2>&1
day1/2_mnist_training --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle --plot '' \
    --losses "$tmp/init2.csv" --save "$tmp/init2.h5" > /dev/null 2>&1
same_weights "--init from step 6's file: 2 tensor-parallel ranks take step 2's steps from it, and --save writes its file (1e-5)" \
    "$tmp/init17.h5" "$tmp/init2.h5" 1e-5

# ---------------------------------------------------------------- bad input
# refused NP WHAT PATTERN FLAGS...: exit 2, the one line (on every rank alike: printed once).
refused() { expect_refused_flags day4/17_tensor_parallel "$@"; }
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
expect_killed_rank_ends_job "a tensor-parallel rank killed mid-training" day4/17_tensor_parallel --tp 2
