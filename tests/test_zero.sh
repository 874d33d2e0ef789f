#!/usr/bin/env bash
# Step 18, sharded data parallelism (ZeRO 1-3, FSDP), against plain DDP: with
# the same seed and flags, every stage takes step 6's steps on the same world
# (bit for bit on 2 ranks; on 3 and 4, where the units are padded and the ring
# reduce-scatter sums in another order than DDP's allreduce, the losses and
# weights within 1e-5 and the same accuracy); a
# deeper MLP gathered with --prefetch as without. Also: each rank's model
# state within 5% of the stage's theory, the bytes sent (stages 1-2 DDP's,
# stage 3 1.5x), --trace, --save and --init between steps 6 and 18, bad flags
# (one line, exit 2, every rank), and a rank killed mid-gather ends the job.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite zero
needs_built day4/18_zero_sharding
needs_mnist
scratch
# same_run WHAT OUT REF: the same checksum on every rank as the reference's, and the same accuracy.
same_run() {
    expect "$1: checksum $(checksum "$2") (reference: $(checksum "$3")), accuracy $(accuracy "$2")% ($(accuracy "$3")%)" \
        test -n "$(checksum "$3")" -a "$(checksum "$2")" = "$(checksum "$3")" -a "$(accuracy "$2")" = "$(accuracy "$3")"
}

# ---------------------------------------------------------------- the same steps as plain DDP
# 2 ranks: a sum of two is the same in any order, so every stage is step 6, bit for bit.
train 2 ref6_2 day1/6_mnist_ddp
for zero in 0 1 2 3; do
    train 2 "z${zero}_2" day4/18_zero_sharding --zero $zero
    same_weights "--zero $zero on 2 ranks ends with step 6's weights, bit for bit" "$tmp/z${zero}_2.h5" "$tmp/ref6_2.h5" 0
    verdict=$(same_losses "$tmp/ref6_2.csv" "$tmp/z${zero}_2.csv" 0)
    expect "--zero $zero on 2 ranks logs step 6's losses: $verdict" test $? -eq 0
    same_run "--zero $zero on 2 ranks" "$tmp/z${zero}_2.out" "$tmp/ref6_2.out"
done
# 3 ranks: both units padded (100480 and 1290 are not multiples of 3), the next layer gathered ahead.
train 3 ref6_3 day1/6_mnist_ddp
train 3 z3p_3 day4/18_zero_sharding --zero 3 --prefetch
verdict=$(same_losses "$tmp/ref6_3.csv" "$tmp/z3p_3.csv" 1e-5)
expect "--zero 3 --prefetch on 3 ranks (padded units): step 6's losses within 1e-5 ($verdict)" test $? -eq 0
same_weights "--zero 3 --prefetch on 3 ranks: step 6's weights within 1e-5" "$tmp/z3p_3.h5" "$tmp/ref6_3.h5" 1e-5
expect "--zero 3 --prefetch on 3 ranks reaches step 6's accuracy ($(accuracy "$tmp/z3p_3.out")%, step 6: $(accuracy "$tmp/ref6_3.out")%)" \
    test -n "$(accuracy "$tmp/ref6_3.out")" -a "$(accuracy "$tmp/z3p_3.out")" = "$(accuracy "$tmp/ref6_3.out")"
expect "the padding is shown: 2 flat units padded to 101772 (a block of 33924 per rank)" \
    grep -q '2 flat units padded to 101772 (a block of 33924 per rank)' "$tmp/z3p_3.out"
# The test set is shared out: 3333, 3333 and 3334 images in chunks of 1111, so ranks 0 and 1 take
# part in a fourth chunk's gathers with no image of their own.
train 3 ref6_3_1111 day1/6_mnist_ddp --batch_size 1111
train 3 z3_3_1111 day4/18_zero_sharding --zero 3 --batch_size 1111
same_weights "--zero 3 on 3 ranks, batch 1111 (an empty last chunk of the test set on 2 ranks): step 6's weights within 1e-5" \
    "$tmp/z3_3_1111.h5" "$tmp/ref6_3_1111.h5" 1e-5
expect "--zero 3 on 3 ranks, batch 1111: step 6's accuracy ($(accuracy "$tmp/z3_3_1111.out")%, step 6: $(accuracy "$tmp/ref6_3_1111.out")%)" \
    test -n "$(accuracy "$tmp/ref6_3_1111.out")" -a "$(accuracy "$tmp/z3_3_1111.out")" = "$(accuracy "$tmp/ref6_3_1111.out")"
# A deeper MLP: 5 units, gathered one by one, with and without --prefetch, as DDP.
deep=(--hidden 64,48,32,16 --batch_size 3200)
train 2 deep_z0 day4/18_zero_sharding --zero 0 "${deep[@]}"
train 2 deep_z3 day4/18_zero_sharding --zero 3 "${deep[@]}"
train 2 deep_z3p day4/18_zero_sharding --zero 3 --prefetch "${deep[@]}"
for name in deep_z3 deep_z3p; do
    same_run "784-64-48-32-16-10, $(sed -n 's/^Step 18: \(ZeRO-3[a-z ]*\) on.*/\1/p' "$tmp/$name.out") on 2 ranks: --zero 0's weights, bit for bit" \
        "$tmp/$name.out" "$tmp/deep_z0.out"
done
if thorough; then
    # 4 ranks: the last unit padded (1290 -> 1292); MPI's reduce-scatter may sum in another order than its allreduce.
    train 4 ref6_4 day1/6_mnist_ddp
    for zero in 1 2 3; do
        train 4 "z${zero}_4" day4/18_zero_sharding --zero $zero
        verdict=$(same_losses "$tmp/ref6_4.csv" "$tmp/z${zero}_4.csv" 1e-5)
        expect "--zero $zero on 4 ranks: step 6's losses within 1e-5 ($verdict)" test $? -eq 0
        expect "--zero $zero on 4 ranks reaches step 6's accuracy ($(accuracy "$tmp/z${zero}_4.out")%, step 6: $(accuracy "$tmp/ref6_4.out")%)" \
            test -n "$(accuracy "$tmp/ref6_4.out")" -a "$(accuracy "$tmp/z${zero}_4.out")" = "$(accuracy "$tmp/ref6_4.out")"
    done
    RUN_TIMEOUT=300 mpi 2 day4/18_zero_sharding --zero 3 --data "$DATA" --epochs 2 --plot '' > "$tmp/shuffled_z3.out" 2>&1
    RUN_TIMEOUT=300 mpi 2 day1/6_mnist_ddp --data "$DATA" --epochs 2 --plot '' > "$tmp/shuffled_6.out" 2>&1
    same_run "--zero 3 on 2 ranks, shuffled, 2 epochs" "$tmp/shuffled_z3.out" "$tmp/shuffled_6.out"
fi

# ---------------------------------------------------------------- what the attendee sees
# Each rank's model state (parameters + gradients + Adam) beside the stage's theory, within 5%.
for out in z0_2 z1_2 z2_2 z3_2 z3p_3 deep_z3; do
    rows=$(grep -cE '^ *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ \([-+][0-9.]+%\)' "$tmp/$out.out")
    worst=$(sed -n 's/.*(\([-+][0-9.]*\)%).*/\1/p' "$tmp/$out.out" | tr -d + | awk '{ d = $1 < 0 ? -$1 : $1; if (d > w) w = d } END { print w + 0 }')
    np=$(sed -n 's/.* on \([0-9]*\) ranks.*/\1/p' "$tmp/$out.out" | head -1)
    expect "$out: every rank's model state within 5% of the theory ($rows of $np ranks shown, worst ${worst}%)" \
        awk -v r="$rows" -v n="$np" -v w="$worst" 'BEGIN { exit !(r == n && n > 0 && w <= 5) }'
done
state() { awk -v r="$2" '$1 == r && /%\)/ { print $5; exit }' "$1"; }
expect "the model state shrinks stage by stage on 2 ranks (MB): $(state "$tmp/z0_2.out" 1) > $(state "$tmp/z1_2.out" 1) > $(state "$tmp/z2_2.out" 1) > $(state "$tmp/z3_2.out" 1)" \
    awk -v a="$(state "$tmp/z0_2.out" 1)" -v b="$(state "$tmp/z1_2.out" 1)" -v c="$(state "$tmp/z2_2.out" 1)" -v d="$(state "$tmp/z3_2.out" 1)" \
    'BEGIN { exit !(a > b && b > c && c > d && d > 0) }'
# The bytes sent per step: stages 1-2 what DDP's allreduce sends, stage 3 half as much again.
ratio() { sed -n 's/.* in all, \([0-9.]*\)x DDP.s allreduce.*/\1/p' "$1"; }
expect "bytes sent per step, as multiples of DDP's allreduce: $(ratio "$tmp/z1_2.out"), $(ratio "$tmp/z2_2.out"), $(ratio "$tmp/z3_2.out") (1.00, 1.00, 1.50)" \
    test "$(ratio "$tmp/z1_2.out") $(ratio "$tmp/z2_2.out") $(ratio "$tmp/z3_2.out")" = "1.00 1.00 1.50"
expect "the peak resident set is shown" grep -q '^rank  parameters  gradients     Adam  model state   theory         working   peak RSS$' "$tmp/z3_2.out"

mpi 2 day4/18_zero_sharding --zero 3 --prefetch --max_steps 3 --data "$DATA" --plot '' \
    --trace "$tmp/trace.json" > "$tmp/traced.out" 2>&1
expect "--max_steps 3: one epoch of 3 steps" grep -q '^epoch 1/1: mean loss [0-9.]* over 3 steps' "$tmp/traced.out"
expect "--trace: both ranks' forward, backward, all-gather and reduce-scatter ranges" \
    trace_has_ranges "$tmp/trace.json" 2 forward backward all-gather reduce-scatter
expect "--trace: the evaluation's forwards inside one evaluation range per rank, after training's" eval \
    '${PYTHON:-/usr/bin/python3} -c "
import json, sys
events = [e for e in json.load(open(sys.argv[1]))[\"traceEvents\"] if e.get(\"ph\") == \"X\"]
for rank in (0, 1):
    mine = [e for e in events if e[\"pid\"] == rank]
    evaluation = [e for e in mine if e[\"name\"] == \"evaluation\"]
    if len(evaluation) != 1: sys.exit(1)
    start, end = evaluation[0][\"ts\"], evaluation[0][\"ts\"] + evaluation[0][\"dur\"]
    inside = [e for e in mine if e[\"name\"] == \"forward\" and start <= e[\"ts\"] <= end]
    training = [e for e in mine if e[\"name\"] in (\"backward\", \"optimizer\")]
    if not inside or any(e[\"ts\"] >= start for e in training): sys.exit(1)" "$tmp/trace.json"'

# --init from step 6's weights and --save into its layout.
mpi 2 day4/18_zero_sharding --zero 3 --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle \
    --plot '' --save "$tmp/init18.h5" > /dev/null 2>&1
mpi 2 day1/6_mnist_ddp --init "$tmp/ref6_2.h5" --data "$DATA" --epochs 1 --no-shuffle \
    --plot '' --save "$tmp/init6.h5" > /dev/null 2>&1
same_weights "--zero 3 --init from step 6's file on 2 ranks takes step 6's steps from it, and --save writes step 6's file" \
    "$tmp/init18.h5" "$tmp/init6.h5" 0

# ---------------------------------------------------------------- bad input
# refused NP WHAT PATTERN FLAGS...: exit 2, the one line (on every rank alike: printed once).
refused() { expect_refused_flags day4/18_zero_sharding "$@"; }
refused 2 "--zero 4" '--zero 4: expected 0 (DDP), 1' --zero 4
refused 2 "--zero -1" '--zero' --zero -1
refused 2 "--prefetch without --zero 3" '--prefetch: only --zero 3' --zero 2 --prefetch
refused 2 "--bucket_mb with --zero 1" '--bucket_mb: only --zero 0' --zero 1 --bucket_mb 5
refused 2 "--hidden that does not parse" "--hidden 512,,512: expected" --zero 3 --hidden 512,,512

# ---------------------------------------------------------------- a rank killed mid-gather
# Its peer waits in an all-gather or a reduce-scatter that never completes; mpirun ends the job
# (on GPUs, the polled waits do where nothing else would: tests/test_gpu.sh's lost peer).
expect_killed_rank_ends_job "a rank killed mid-training under --zero 3" day4/18_zero_sharding --zero 3 --prefetch
