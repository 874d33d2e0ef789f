#!/usr/bin/env bash
# Step 16, the MLP in pipeline stages under DDP, against plain DDP: with the
# same seed and flags, P stages x D replicas take the steps of step 6 on D
# ranks (P x 1: step 2's), bit for bit at one micro-batch and within 1e-5 at
# any number of micro-batches and either schedule; a deeper MLP (--hidden) in
# 4 stages takes the steps of the same MLP in 1. Also: the activations 1F1B
# and GPipe hold, measured; --print_schedule, --timeline, --trace, --save and
# --init between steps 6 and 16; bad flags (one line, exit 2, every rank);
# a rank killed mid-pipeline ends the job.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite pipeline
needs_built day4/16_pipeline_ddp
needs_mnist
scratch

# ---------------------------------------------------------------- the same steps as plain DDP
# One micro-batch: the same operations in the same order as step 6 (step 2 on one replica).
train 1 ref2 day1/2_mnist_training
train 2 ref6_2 day1/6_mnist_ddp
train 1 pp1 day4/16_pipeline_ddp --pp 1
train 2 pp2 day4/16_pipeline_ddp --pp 2
train 2 pp1_dp2 day4/16_pipeline_ddp --pp 1
train 4 pp2_dp2 day4/16_pipeline_ddp --pp 2
same_weights "1 stage x 1 replica ends with step 2's weights, bit for bit" "$tmp/pp1.h5" "$tmp/ref2.h5" 0
same_weights "2 stages x 1 replica end with step 2's weights, bit for bit" "$tmp/pp2.h5" "$tmp/ref2.h5" 0
same_weights "1 stage x 2 replicas end with step 6's weights on 2 ranks, bit for bit" "$tmp/pp1_dp2.h5" "$tmp/ref6_2.h5" 0
same_weights "2 stages x 2 replicas (4 ranks) end with step 6's weights on 2 ranks, bit for bit" "$tmp/pp2_dp2.h5" "$tmp/ref6_2.h5" 0
expect "the whole model's checksum, hashed stage after stage, is step 6's: $(checksum "$tmp/pp2_dp2.out") and $(checksum "$tmp/ref6_2.out")" \
    test -n "$(checksum "$tmp/ref6_2.out")" -a "$(checksum "$tmp/pp2_dp2.out")" = "$(checksum "$tmp/ref6_2.out")"
verdict=$(same_losses "$tmp/ref6_2.csv" "$tmp/pp2_dp2.csv" 0)
expect "2 stages x 2 replicas log step 6's losses: $verdict" test $? -eq 0
expect "2 stages x 2 replicas reach step 6's accuracy ($(accuracy "$tmp/pp2_dp2.out")%, step 6: $(accuracy "$tmp/ref6_2.out")%)" \
    test -n "$(accuracy "$tmp/ref6_2.out")" -a "$(accuracy "$tmp/pp2_dp2.out")" = "$(accuracy "$tmp/ref6_2.out")"

# Micro-batches and schedules: gradients accumulated over M micro-batches, each
# weighted by its share of the batch, take the same step (summed in another order).
for schedule in gpipe 1f1b; do
    for m in 2 $(if_thorough 4) 8; do
        train 2 "pp2_m${m}_$schedule" day4/16_pipeline_ddp --pp 2 --micro_batches $m --schedule $schedule
        verdict=$(same_losses "$tmp/ref2.csv" "$tmp/pp2_m${m}_$schedule.csv" 1e-5)
        expect "2 stages, $m micro-batches, $schedule: step 2's losses within 1e-5 ($verdict)" test $? -eq 0
        same_weights "2 stages, $m micro-batches, $schedule: step 2's weights" "$tmp/pp2_m${m}_$schedule.h5" "$tmp/ref2.h5" 1e-5
    done
done
train 4 pp2_dp2_m4 day4/16_pipeline_ddp --pp 2 --micro_batches 4
verdict=$(same_losses "$tmp/ref6_2.csv" "$tmp/pp2_dp2_m4.csv" 1e-5)
expect "2 stages x 2 replicas, 4 micro-batches, 1f1b: step 6's losses within 1e-5 ($verdict)" test $? -eq 0

# A deeper MLP: 4 Linears in 4 stages take the steps of the same MLP in 1.
deep=(--hidden 64,64,64 --batch_size 3200)
train 1 deep_pp1 day4/16_pipeline_ddp --pp 1 "${deep[@]}"
train 4 deep_pp4 day4/16_pipeline_ddp --pp 4 "${deep[@]}"
expect "4 stages of 784-64-64-64-10 end with 1 stage's weights, bit for bit: checksums $(checksum "$tmp/deep_pp4.out") and $(checksum "$tmp/deep_pp1.out")" \
    test -n "$(checksum "$tmp/deep_pp1.out")" -a "$(checksum "$tmp/deep_pp4.out")" = "$(checksum "$tmp/deep_pp1.out")"
train 4 deep_pp4_m8 day4/16_pipeline_ddp --pp 4 "${deep[@]}" --micro_batches 8 --schedule gpipe
verdict=$(same_losses "$tmp/deep_pp1.csv" "$tmp/deep_pp4_m8.csv" 1e-5)
expect "4 stages of 784-64-64-64-10, 8 micro-batches, gpipe: 1 stage's losses within 1e-5 ($verdict)" test $? -eq 0
if thorough; then
    train 4 deep_pp2_dp2_m4 day4/16_pipeline_ddp --pp 2 "${deep[@]}" --micro_batches 4
    train 2 deep_pp1_dp2 day4/16_pipeline_ddp --pp 1 "${deep[@]}"
    verdict=$(same_losses "$tmp/deep_pp1_dp2.csv" "$tmp/deep_pp2_dp2_m4.csv" 1e-5)
    expect "2 stages x 2 replicas of 784-64-64-64-10, 4 micro-batches: 1 stage x 2 replicas' losses within 1e-5 ($verdict)" test $? -eq 0
fi

# ---------------------------------------------------------------- what the attendee sees
# The activations held, measured by the stage's slots: GPipe all M micro-batches,
# 1F1B at most P - s on stage s; at M = 8, P = 2, 1F1B's peak is P / M of GPipe's.
held() { sed -n "s/^ *$2  .* \([0-9]*\) micro-batch[es]*, \([0-9.]*\) MB$/\1 \2/p" "$1"; }
g0=$(held "$tmp/pp2_m8_gpipe.out" 0) f0=$(held "$tmp/pp2_m8_1f1b.out" 0) f1=$(held "$tmp/pp2_m8_1f1b.out" 1)
expect "activations held at M = 8: gpipe stage 0 '$g0', 1f1b stage 0 '$f0' and stage 1 '$f1' (micro-batches, MB): 8, 2, 1; 1f1b's MB <= 2/8 of gpipe's" \
    awk -v g="$g0" -v f="$f0" -v l="$f1" 'BEGIN { split(g, a, " "); split(f, b, " "); split(l, c, " ");
        exit !(a[1] == 8 && b[1] == 2 && c[1] == 1 && b[2] <= a[2] * 2 / 8 + 1e-9) }'
expect "the bubble's theory is printed: $(grep -o 'the bubble of equal stages.*' "$tmp/pp2_m8_1f1b.out")" \
    grep -q '(P - 1) / (M + P - 1) = 11%$' "$tmp/pp2_m8_1f1b.out"
expect "the grid: rank 3 is stage 1 of 2, replica 1 of 2" grep -qx 'rank 3: stage 1 of 2 (fc.2), replica 1 of 2' "$tmp/pp2_dp2.out"

mpi 2 day4/16_pipeline_ddp --pp 2 --micro_batches 4 --print_schedule --epochs 1 --data "$DATA" \
    --plot '' --timeline "$tmp/timeline.png" --trace "$tmp/trace.json" > "$tmp/shown.out" 2>&1
expect "--print_schedule: 1f1b at P = 2, M = 4" eval 'grep -qx "stage 0: F0 F1 B0 F2 B1 F3 B2 B3" "$tmp/shown.out" &&
    grep -qx "stage 1: F0 B0 F1 B1 F2 B2 F3 B3" "$tmp/shown.out"'
expect "--timeline writes a PNG ($(stat -c %s "$tmp/timeline.png" 2> /dev/null) bytes)" \
    eval '[ "$(head -c 8 "$tmp/timeline.png" | od -An -tx1 | tr -d " \n")" = 89504e470d0a1a0a ]'
expect "--trace: both ranks' forward, backward and exchange ranges" \
    trace_has_ranges "$tmp/trace.json" 2 forward backward exchange

# --init from step 6's weights file and --save into it: one state_dict layout.
mpi 2 day4/16_pipeline_ddp --pp 2 --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle \
    --plot '' --losses "$tmp/init16.csv" --save "$tmp/init16.h5" > /dev/null 2>&1
day1/2_mnist_training --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle --plot '' \
    --losses "$tmp/init2.csv" --save "$tmp/init2.h5" > /dev/null 2>&1
same_weights "--init from step 6's file: 2 stages take step 2's steps from it, and --save writes the same file" \
    "$tmp/init16.h5" "$tmp/init2.h5" 0

# ---------------------------------------------------------------- bad input
# refused NP WHAT PATTERN FLAGS...: exit 2, the one line (on every rank alike: printed once).
refused() { expect_refused_flags day4/16_pipeline_ddp "$@"; }
refused 3 "--pp 2 on 3 ranks" 'the world size 3 is not a multiple of it' --pp 2
refused 3 "--pp 3 on an MLP of 2 Linears" 'has 2 Linear layers, so at most 2 stages' --pp 3
refused 2 "--micro_batches 7 with --batch_size 6400" '--micro_batches 7: expected a divisor of --batch_size 6400' --pp 2 --micro_batches 7
refused 2 "--micro_batches larger than the batch" '--micro_batches 128: expected a divisor of --batch_size 64' --pp 2 --batch_size 64 --micro_batches 128
refused 2 "--micro_batches above the last batch's rows (60000 = 8571 x 7 + 3)" "each replica's last batch has 3 rows" --pp 2 --batch_size 7 --micro_batches 7
refused 2 "--hidden that does not parse" "--hidden 512,,512: expected" --pp 2 --hidden 512,,512
refused 2 "--schedule unknown" "--schedule expects one of gpipe|1f1b, got 'interleaved'" --pp 2 --schedule interleaved

# ---------------------------------------------------------------- a rank killed mid-pipeline
# Its neighbour waits for activations or gradients that never come; mpirun ends the job (on GPUs,
# the polled waits do where nothing else would: tests/test_gpu.sh's lost peer).
expect_killed_rank_ends_job "a stage killed mid-pipeline" day4/16_pipeline_ddp --pp 2
