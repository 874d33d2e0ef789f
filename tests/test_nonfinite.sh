#!/usr/bin/env bash
# Non-finite numbers are errors (issue 36, common/train/divergence.h): a training whose loss, test result or
# weights turn nan or inf stops on every rank at the same step, with one line naming the step and the
# likely cause, exit status 1, and writes nothing over a good file (--save, --losses, --plot, step 13's
# snapshot). PyTorch trains on NaN in silence and exits 0; these checks fail on a build that does.
# Also: step 13 refuses a snapshot holding a NaN, one line naming the file and the tensor.
# NONFINITE_DEVICE=cuda runs the programs on the GPU (tests/test_fake_gpu.sh: on the simulated one).
# Prints one PASS/FAIL/SKIP line per check (tests/run.sh counts them).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
DEVICE=${NONFINITE_DEVICE:-cpu}
DATA=data/mnist
suite "nonfinite ($DEVICE)"
needs_mnist
scratch

# Files of an earlier, good run, which a diverged run must leave as they are.
good_files() {
    printf 'weights of a good run\n' > "$tmp/good.h5"
    printf 'step,epoch,loss\n0,0,2.3\n' > "$tmp/good.csv"
    printf 'a good curve\n' > "$tmp/good.png"
    cp "$tmp/good.png" "$tmp/good_rank0.png"  # step 3 writes one curve per rank
    md5sum "$tmp"/good* > "$tmp/sentinels.md5"
}

# diverges NAME NP LINE PROGRAM ARGS...: run with --lr 1e308 (and the outputs above); expect exit 1,
# one line holding LINE (what stopped it) and "training diverged", and the good files untouched.
diverges() {
    local name=$1 np=$2 line=$3; shift 3
    good_files
    timeout 300 $MPIRUN -np "$np" "$@" --device "$DEVICE" --lr 1e308 > "$tmp/out" 2>&1
    local status=$? lines
    lines=$(grep -c 'training diverged' "$tmp/out")
    local said
    said=$(grep -m1 'training diverged' "$tmp/out" | sed 's/^\[rank [0-9]* @ [^]]*\] //' | cut -c1-110)
    if [ $status -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -q "\] $line: training diverged; --lr 1e+308" "$tmp/out"; then
        fail "$name on $np rank(s): exit $status (expected 1), $lines line(s) saying 'training diverged' (expected one, '$line'): $(grep -v '^Step' "$tmp/out" | head -3 | tr '\n' ' ' | cut -c1-300)"
    elif ! md5sum --quiet -c "$tmp/sentinels.md5" > /dev/null 2>&1; then
        fail "$name on $np rank(s): stopped, but wrote over a good file: $(md5sum --quiet -c "$tmp/sentinels.md5" 2>&1 | tr '\n' ' ')"
    else
        pass "$name on $np rank(s): exit 1, one line ('$said...'), --save, --losses and --plot untouched"
    fi
}
outputs=(--save "$tmp/good.h5" --losses "$tmp/good.csv" --plot "$tmp/good.png")
at_step_2="loss is nan at step 2 (epoch 1)"  # step 1 from the initial weights; its update leaves inf and nan

# ---------------------------------------------------------------- every training program, 1 and 2 ranks
diverges "step 2" 1 "$at_step_2" day1/2_mnist_training "${outputs[@]}"
for np in $(if_thorough 1) 2; do  # (one rank: make test-all; 2 s of mpirun's start each)
    diverges "step 3" "$np" "$at_step_2" day1/3_mnist_distributed "${outputs[@]}"
    diverges "step 4" "$np" "$at_step_2" day1/4_mnist_manual_ddp "${outputs[@]}"
    diverges "step 5" "$np" "$at_step_2" day1/5_mnist_manual_ddp_profile "${outputs[@]}"
    diverges "step 6" "$np" "$at_step_2" day1/6_mnist_ddp "${outputs[@]}"
    diverges "step 7" "$np" "$at_step_2" day1/7_mnist_ddp_timing "${outputs[@]}"
    diverges "step 8" "$np" "$at_step_2" day1/8_mnist_ddp_lr "${outputs[@]}"
    diverges "step 10" "$np" "$at_step_2" day2/10_mnist_ddp_multinode "${outputs[@]}"
    diverges "step 14" "$np" "$at_step_2" day3/14_cnn_ddp --max_steps 4 "${outputs[@]}"
    diverges "step 16" "$np" "$at_step_2" day4/16_pipeline_ddp "${outputs[@]}"
    diverges "step 17" "$np" "$at_step_2" day4/17_tensor_parallel --tp "$np" "${outputs[@]}"
    diverges "step 18 (ZeRO-3)" "$np" "$at_step_2" day4/18_zero_sharding --zero 3 "${outputs[@]}"
    diverges "test_profile" "$np" "loss is nan at step 2" day1/test_profile --trace ''
done
if [ -f data/movielens/ratings.csv ]; then
    for np in $(if_thorough 1) 2; do
        diverges "step 15" "$np" "$at_step_2" day3/15_recommender_ddp --epochs 1 "${outputs[@]}"
    done
    # One step, then the test: the loss was finite, the RMSE of the weights it left is not.
    diverges "step 15, its test RMSE" 2 "test RMSE is nan after epoch 1" day3/15_recommender_ddp --max_steps 1 "${outputs[@]}"
else
    skip "step 15: no data/movielens/ratings.csv (make movielens)"
fi
# The last step's update, which no loss saw: the weights are checked before the test and the save.
diverges "step 2 in one step" 1 "weight 'fc.0.weight' holds nan after step 1 (epoch 1)" day1/2_mnist_training --epochs 1 --batch_size 60000 "${outputs[@]}"
diverges "step 17 in one step" 2 "weight 'fc.0.weight' holds nan after step 1 (epoch 1)" day4/17_tensor_parallel --tp 2 --max_steps 1 "${outputs[@]}"
diverges "step 18 (ZeRO-3) in one step" 2 "weight 'fc.0.weight and bias' holds nan after step 1 (epoch 1)" day4/18_zero_sharding --zero 3 --max_steps 1 "${outputs[@]}"

# ---------------------------------------------------------------- step 11, and one rank's data turning first
if ! "$PYTHON" -c 'import h5py' 2> /dev/null; then
    skip "step 11 and one rank's NaN: needs h5py ($PYTHON)"
elif ! day2/create_mnist_h5 --data "$DATA" --out "$tmp/mnist.h5" --float32 > "$tmp/out" 2>&1; then
    fail "day2/create_mnist_h5 --float32: $(tail -1 "$tmp/out")"
else
    for np in $(if_thorough 1) 2; do
        diverges "step 11" "$np" "$at_step_2" day2/11_multinode_streaming --h5 "$tmp/mnist.h5" "${outputs[@]}"
    done
    # A NaN pixel in group 1, which (no shuffle, 2 ranks) rank 1 alone reads, in its first batch: rank 1's
    # first loss is nan, rank 0's is not; the gradients' allreduce would spread it a step later. Both
    # ranks stop at step 1, together. (Step 11 streams float32 pixels as stored: no check on the way.)
    "$PYTHON" - "$tmp/mnist.h5" << 'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    f["train/images"][1, 0, 0, 14, 14] = float("nan")
EOF
    good_files
    timeout 300 $MPIRUN -np 2 day2/11_multinode_streaming --h5 "$tmp/mnist.h5" --no_shuffle --device "$DEVICE" \
        "${outputs[@]}" > "$tmp/out" 2>&1
    status=$?
    if [ $status -eq 1 ] && [ "$(grep -c 'training diverged' "$tmp/out")" -eq 1 ] &&
       grep -q '\] loss is nan at step 1 (epoch 1): training diverged; --lr 0.001 is likely too large' "$tmp/out" &&
       md5sum --quiet -c "$tmp/sentinels.md5" > /dev/null 2>&1; then
        pass "step 11, a NaN in rank 1's data alone: both ranks stop at step 1, exit 1, one line, nothing written"
    else
        fail "step 11, a NaN in rank 1's data alone: exit $status: $(grep -v '^Step' "$tmp/out" | head -3 | tr '\n' ' ' | cut -c1-300)"
    fi
fi

# ---------------------------------------------------------------- step 13's snapshots
# A good snapshot after epoch 1 (one step an epoch), with an lr that leaves huge but finite weights;
# the resumed epoch 2 overflows. The diverged run stops, and the snapshot is the good one still.
snap=$tmp/snap.h5
step13=(day3/13_fault_tolerant_ddp --snapshot "$snap" --batch_size 30000 --lr 1e30 --device "$DEVICE")
good_files
if ! timeout 300 $MPIRUN -np 2 "${step13[@]}" --total_epochs 1 --plot '' > "$tmp/out" 2>&1 || [ ! -s "$snap" ]; then
    fail "step 13: the first epoch (--lr 1e30: huge, finite weights): $(tail -2 "$tmp/out" | tr '\n' ' ')"
else
    cp "$snap" "$tmp/snap_good.h5"
    timeout 300 $MPIRUN -np 2 "${step13[@]}" --total_epochs 3 "${outputs[@]}" > "$tmp/out" 2>&1
    status=$?
    if [ $status -eq 1 ] && grep -q '\] loss is [a-z]* at step 2 (epoch 2): training diverged; --lr 1e+30' "$tmp/out" &&
       cmp -s "$snap" "$tmp/snap_good.h5" && md5sum --quiet -c "$tmp/sentinels.md5" > /dev/null 2>&1; then
        pass "step 13: a resumed run that diverges stops at step 2 (epoch 2), exit 1; the epoch-1 snapshot and the outputs untouched"
    else
        fail "step 13: a resumed run that diverges: exit $status, snapshot $(cmp -s "$snap" "$tmp/snap_good.h5" && echo kept || echo CHANGED): $(grep -v '^Step' "$tmp/out" | head -3 | tr '\n' ' ' | cut -c1-300)"
    fi
    # One step an epoch at --lr 1e308: the weights after the step are nan, the loss never showed it;
    # the check before the snapshot stops the run, and no snapshot is written.
    rm -f "$tmp/snap2.h5"
    timeout 300 $MPIRUN -np 2 day3/13_fault_tolerant_ddp --snapshot "$tmp/snap2.h5" --batch_size 30000 --lr 1e308 \
        --total_epochs 1 --device "$DEVICE" --plot '' > "$tmp/out" 2>&1
    status=$?
    if [ $status -eq 1 ] && [ ! -e "$tmp/snap2.h5" ] && grep -q "\] weight 'fc.0.weight' holds nan after step 1 (epoch 1): training diverged" "$tmp/out"; then
        pass "step 13: weights that turned nan in an epoch's last step are never written to a snapshot (exit 1, one line)"
    else
        fail "step 13: nan weights at a snapshot: exit $status, $( [ -e "$tmp/snap2.h5" ] && echo 'a snapshot written' || echo 'no snapshot'): $(grep -v '^Step' "$tmp/out" | head -2 | tr '\n' ' ' | cut -c1-300)"
    fi
    # A snapshot with a NaN, its checksum made to match (a file made that way, not damaged): refused,
    # one line naming the file and the tensor. The checksum is snapshot.c's, in its visiting order.
    if ! "$PYTHON" -c 'import h5py' 2> /dev/null; then
        skip "step 13: a NaN-poisoned snapshot (needs h5py)"
    elif ! "$PYTHON" - "$tmp/snap_good.h5" "$tmp/poisoned.h5" > "$tmp/py" 2>&1 << 'EOF'
import shutil, sys
import h5py, numpy as np
good, poisoned = sys.argv[1], sys.argv[2]
shutil.copy(good, poisoned)
def checksum(f):
    names = ["settings/model_sizes", "settings/world_size", "settings/batch_size", "settings/accum_steps",
             "settings/lr", "settings/seed", "settings/shuffle", "settings/train_samples"]
    params = ["fc.0.weight", "fc.0.bias", "fc.2.weight", "fc.2.bias"]
    names += params + ["optimizer/exp_avg/" + p for p in params] + ["optimizer/exp_avg_sq/" + p for p in params]
    names += ["optimizer/step", "progress/epochs_done", "progress/samples_done", "generator/mt19937",
              "generator/index", "losses/epoch", "losses/loss"]
    h, mask = 14695981039346656037, (1 << 64) - 1
    for name in names:
        data = np.ascontiguousarray(f[name][()]).tobytes()
        k = 0
        while k + 8 <= len(data):
            h = ((h ^ int.from_bytes(data[k:k + 8], "little")) * 1099511628211) & mask
            k += 8
        for b in data[k:]:
            h = ((h ^ b) * 1099511628211) & mask
    return h
with h5py.File(poisoned, "r+") as f:
    stored = int(f.attrs["checksum"])
    if checksum(f) != stored:
        sys.exit("the test's checksum does not reproduce snapshot.c's (%x, the file says %x)" % (checksum(f), stored))
    f["optimizer/exp_avg_sq/fc.2.weight"][3, 7] = np.float32("nan")
    f.attrs.modify("checksum", np.uint64(checksum(f)))
EOF
    then
        fail "step 13: making a NaN-poisoned snapshot: $(tail -1 "$tmp/py")"
    else
        cp "$tmp/poisoned.h5" "$snap"
        timeout 300 $MPIRUN -np 2 "${step13[@]}" --total_epochs 3 --plot '' > "$tmp/out" 2>&1
        status=$?
        expected="$snap: 'optimizer/exp_avg_sq/fc.2.weight' holds nan (value 392 of 1280): a snapshot must hold finite numbers; refused"
        if [ $status -eq 1 ] && [ "$(grep -c 'refused' "$tmp/out")" -eq 1 ] && grep -qF "$expected" "$tmp/out" &&
           cmp -s "$snap" "$tmp/poisoned.h5"; then
            pass "step 13: a snapshot holding a NaN (checksum matching) is refused in one line naming the file and the tensor"
        else
            fail "step 13: a NaN-poisoned snapshot: exit $status: $(grep -v '^Step' "$tmp/out" | head -2 | tr '\n' ' ' | cut -c1-300)"
        fi
    fi
fi

# ---------------------------------------------------------------- a good run is unaffected
timeout 300 $MPIRUN -np 2 day1/6_mnist_ddp --epochs 1 --device "$DEVICE" --save "$tmp/w.h5" --plot '' > "$tmp/out" 2>&1
status=$?
if [ $status -eq 0 ] && [ -s "$tmp/w.h5" ] && ! grep -q 'diverged' "$tmp/out"; then
    pass "step 6 with the default lr trains, saves, exits 0: $(grep -m1 'Test accuracy' "$tmp/out" | sed 's/.*Test/Test/')"
else
    fail "step 6 with the default lr: exit $status: $(tail -2 "$tmp/out" | tr '\n' ' ')"
fi
