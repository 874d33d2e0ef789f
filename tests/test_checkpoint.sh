#!/usr/bin/env bash
# Steps 16, 17 and 18's sharded checkpoints (common/records/sharded_checkpoint.h): a run stopped at step k
# (--max_steps, kill -9 of a rank, a rank killed in the middle of a save) and resumed with the
# same layout takes the uninterrupted run's steps bit for bit, mid-epoch; resumed under another
# layout (another --zero stage, another world size at the same global batch), within 1e-5;
# --keep; a checkpoint missing a shard, with a shard of another model or of another checkpoint,
# truncated, whose index disagrees with its shards, of another program, model or run: one line
# naming the file, exit 1 on every rank, nothing overwritten; a full disk and an unwritable
# folder: one line, exit 1, the previous checkpoint intact; with --save_errors continue, a full disk
# or one rank's failed fsync: one warning per failed save, the last good checkpoint current, the
# uninterrupted steps; the last step's save tried once more (saved; or failed again: the outputs
# written, then one line and exit 1); --async_save, the same steps, and a rank killed while its thread writes
# leaves the previous checkpoint current; at TEST_LEVEL=all, SIGTERM to mpirun (scancel) and the
# same command again resumes bit for bit. Steps 16 and 17 (the same module and flags): stopped
# mid-epoch and resumed bit for bit; 2 stages resumed as 1 (bit for bit: the same arithmetic),
# tensor-parallel 2 as 1 (within 1e-5); at TEST_LEVEL=all, 2 stages x 2 replicas as 4 stages
# (within 1e-5), and --async_save stopped and resumed bit for bit. Step 19 (the GPT) resumed bit
# for bit, on 1 rank within 1e-5, and with --async_save bit for bit.
# tools/checkpoint_to_state_dict makes a checkpoint of each one whole
# state_dict file: the weights of --save at the same step, bit for bit, which --init and torch load.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite checkpoint
needs_built day4/16_pipeline_ddp day4/17_tensor_parallel day4/18_zero_sharding build/tools/edit_checkpoint_index \
    build/tools/compare_weights build/tools/compare_h5_weights tools/checkpoint_to_state_dict
needs_mnist
scratch
program=day4/18_zero_sharding
# 2 epochs of 15 steps on 2 ranks: the stops below fall mid-epoch.
common=(--data "$DATA" --batch_size 2000 --epochs 2 --plot '')

# zero18 NP NAME FLAGS...: the run's output, losses and weights as $tmp/NAME.out, .csv and .h5.
zero18() {
    local np=$1 name=$2; shift 2
    mpi "$np" $program "${common[@]}" --losses "$tmp/$name.csv" --save "$tmp/$name.h5" "$@" > "$tmp/$name.out" 2>&1
}
# same_as_reference WHAT NAME: NAME ended with the reference's checksum and took its losses, bit for bit.
same_as_reference() {
    expect "$1: checksum $(checksum "$tmp/$2.out") (uninterrupted: $(checksum "$tmp/ref.out")), the same losses bit for bit" \
        test -n "$(checksum "$tmp/ref.out")" -a "$(checksum "$tmp/$2.out")" = "$(checksum "$tmp/ref.out")" \
        -a -s "$tmp/$2.csv" -a "$(cat "$tmp/$2.csv" 2> /dev/null)" = "$(cat "$tmp/ref.csv")"
}
# resumed_at NAME: the step NAME's run resumed from ("" if it did not resume).
resumed_at() { sed -n 's/^Resumed from .*: step \([0-9]*\), epoch.*/\1/p' "$tmp/$1.out"; }

zero18 2 ref --zero 3
expect "the uninterrupted run (ZeRO-3 on 2 ranks, 30 steps) ends with one checksum" test "$(checksum "$tmp/ref.out" | wc -w)" -eq 1

# ---------------------------------------------------------------- stop at step k, resume
zero18 2 first --zero 3 --max_steps 17 --checkpoint "$tmp/ck" --save_every 5
cp -r "$tmp/ck" "$tmp/ck18c"  # (for tools/checkpoint_to_state_dict, below)
expect "--max_steps 17 --save_every 5 saves steps 5, 10, 15 and 17, one line each" \
    test "$(grep -o '^Checkpoint of step [0-9]*' "$tmp/first.out" | awk '{ print $4 }' | paste -sd ' ')" = "5 10 15 17"
expect "--keep 2 (the default) leaves the newest two and current naming the last: $(ls "$tmp/ck" | paste -sd ' ')" \
    test "$(ls "$tmp/ck" | paste -sd ' ')" = "current step-000015 step-000017" -a "$(cat "$tmp/ck/current")" = step-000017
expect "one shard file per rank and the index" test "$(ls "$tmp/ck/step-000017" | paste -sd ' ')" = "index.h5 shard-00000.h5 shard-00001.h5"
zero18 2 resumed --zero 3 --checkpoint "$tmp/ck" --save_every 5
expect "the resume says where: $(grep '^Resumed' "$tmp/resumed.out")" \
    grep -q '^Resumed from .*/step-000017, saved by ZeRO-3 on 2 ranks: step 17, epoch 2, 8000 of its 60000 samples done;' "$tmp/resumed.out"
same_as_reference "stopped at step 17 (mid-epoch 2) and resumed, ZeRO-3 on 2 ranks" resumed

# ---------------------------------------------------------------- kill -9 of a rank, then resume
# The rank dies after the save of step 10 appears, as a node would: the same command then resumes.
: > "$tmp/killed.out"
timeout "$RUN_TIMEOUT" $MPIRUN $MPI_FLAGS -np 2 $program "${common[@]}" --zero 1 --checkpoint "$tmp/ck9" --save_every 5 \
    --batch_size 1000 > "$tmp/killed.out" 2>&1 &
job=$!
for ((t = 0; t < 600; t++)); do grep -q '^Checkpoint of step 10 ' "$tmp/killed.out" && break; sleep 0.05; done
launcher=$(pgrep -P "$job" | head -1)
victim=$(pgrep -P "${launcher:-0}" | tail -1)
[ -n "$victim" ] && kill -KILL "$victim"
wait "$job"
status=$?
expect "kill -9 of rank pid ${victim:-none} after step 10's save ends the run unfinished (exit $status)" \
    test -n "$victim" -a $status -ne 0 -a $status -ne 124 -a -z "$(grep 'Training completed' "$tmp/killed.out")"
zero18 2 ref1000 --zero 1 --batch_size 1000
zero18 2 after_kill --zero 1 --checkpoint "$tmp/ck9" --save_every 5 --batch_size 1000
expect "... the same command resumes (from step $(resumed_at after_kill)) and ends with the uninterrupted run's checksum $(checksum "$tmp/ref1000.out") and losses" \
    test -n "$(resumed_at after_kill)" -a -n "$(checksum "$tmp/ref1000.out")" -a "$(checksum "$tmp/after_kill.out")" = "$(checksum "$tmp/ref1000.out")" \
    -a "$(cat "$tmp/after_kill.csv")" = "$(cat "$tmp/ref1000.csv")"

# ---------------------------------------------------------------- SIGTERM to mpirun (scancel, a preemption)
# Open MPI's mpirun, sent SIGTERM, sends its ranks SIGCONT, then 1 s later SIGTERM, then SIGKILL: the
# training runs on for that second (8 epochs of 60 steps leave it several) and dies wherever it is,
# in a save or not. The same command then resumes from the last checkpoint (any unfinished tmp-*
# removed) and takes the uninterrupted run's steps.
if thorough; then
    : > "$tmp/termed.out"
    timeout "$RUN_TIMEOUT" $MPIRUN $MPI_FLAGS -np 2 $program "${common[@]}" --zero 2 --epochs 8 --checkpoint "$tmp/ckt" \
        --save_every 5 --batch_size 500 > "$tmp/termed.out" 2>&1 &
    job=$!
    for ((t = 0; t < 600; t++)); do grep -q '^Checkpoint of step 10 ' "$tmp/termed.out" && break; sleep 0.05; done
    launcher=$(pgrep -P "$job" | head -1)
    [ -n "$launcher" ] && kill -TERM "$launcher"
    wait "$job"
    status=$?
    expect "SIGTERM to mpirun (pid ${launcher:-none}) after step 10's save ends the run unfinished (exit $status, last checkpoint $(cat "$tmp/ckt/current" 2> /dev/null))" \
        test -n "$launcher" -a $status -ne 0 -a $status -ne 124 -a -z "$(grep 'Training completed' "$tmp/termed.out")"
    zero18 2 ref_term --zero 2 --epochs 8 --batch_size 500
    zero18 2 after_term --zero 2 --epochs 8 --checkpoint "$tmp/ckt" --save_every 5 --batch_size 500
    expect "... the same command resumes (from step $(resumed_at after_term)), no tmp-* left, and ends with the uninterrupted run's checksum $(checksum "$tmp/ref_term.out") and losses" \
        test -n "$(resumed_at after_term)" -a -z "$(ls -d "$tmp"/ckt/tmp-* 2> /dev/null)" -a -n "$(checksum "$tmp/ref_term.out")" \
        -a "$(checksum "$tmp/after_term.out")" = "$(checksum "$tmp/ref_term.out")" -a "$(cat "$tmp/after_term.csv")" = "$(cat "$tmp/ref_term.csv")"
fi

# ---------------------------------------------------------------- a rank killed during a save
# build/lib/libcrash_in_save.so: rank 1 SIGKILLs itself as it syncs its shard of step 10, its file
# written, nothing after it done; step 5 stays current and the resume takes the uninterrupted steps.
crash_lib=build/lib/libcrash_in_save.so
if [ -f $crash_lib ]; then
    RUN_TIMEOUT=60 mpi 2 -x LD_PRELOAD=$crash_lib -x CRASH_IN_SAVE=tmp-000010/shard-00001.h5 $program "${common[@]}" --zero 3 \
        --checkpoint "$tmp/ckc" --save_every 5 > "$tmp/crashed.out" 2>&1
    status=$?
    expect "a rank killed while writing its shard of step 10 (exit $status): current still names step 5, the unfinished tmp-000010 left beside it" \
        test $status -ne 0 -a "$(cat "$tmp/ckc/current")" = step-000005 -a -d "$tmp/ckc/tmp-000010" -a -n "$(grep -m1 '^crash_in_save' "$tmp/crashed.out")"
    zero18 2 after_crash --zero 3 --checkpoint "$tmp/ckc" --save_every 5
    expect "... the resume removes tmp-000010, saying so, and goes on from step 5" \
        test "$(resumed_at after_crash)" = 5 -a ! -d "$tmp/ckc/tmp-000010" -a -n "$(grep 'removing an unfinished checkpoint' "$tmp/after_crash.out")"
    same_as_reference "... and takes the uninterrupted run's steps" after_crash
    # --async_save: rank 1 SIGKILLed as its writer thread syncs its shard of step 10 while training
    # goes on; step 5, made current when step 10's save began, loads, and the steps are the same.
    RUN_TIMEOUT=60 mpi 2 -x LD_PRELOAD=$crash_lib -x CRASH_IN_SAVE=tmp-000010/shard-00001.h5 $program "${common[@]}" --zero 3 \
        --checkpoint "$tmp/cka" --save_every 5 --async_save > "$tmp/crashed_a.out" 2>&1
    status=$?
    expect "--async_save: a rank killed while its thread writes its shard of step 10 (exit $status): current still names step 5" \
        test $status -ne 0 -a "$(cat "$tmp/cka/current")" = step-000005 -a -n "$(grep -m1 '^crash_in_save' "$tmp/crashed_a.out")"
    zero18 2 after_crash_a --zero 3 --checkpoint "$tmp/cka" --save_every 5 --async_save
    expect "... the resume goes on from step 5, saving steps 10 to 30 asynchronously, each line with its stall and write time" \
        test "$(resumed_at after_crash_a)" = 5 -a "$(grep -c '^Checkpoint of step [0-9]* saved in .*written by a thread from host copies), index .*; the training stalled [0-9.]* ms, the thread wrote for [0-9.]* ms$' "$tmp/after_crash_a.out")" = 5
    same_as_reference "... and takes the uninterrupted run's steps" after_crash_a
    # --save_errors continue: rank 1 alone fails to sync its shard of step 10 (ENOSPC), its thread
    # writing while training goes on; every rank agrees the save failed, one warning, tmp-000010
    # removed, step 5 current until step 15's save succeeds; the run ends as the uninterrupted one.
    mpi 2 -x LD_PRELOAD=$crash_lib -x CRASH_IN_SAVE=tmp-000010/shard-00001.h5 -x CRASH_IN_SAVE_ERRNO=28 $program "${common[@]}" \
        --zero 3 --checkpoint "$tmp/ckf" --save_every 5 --async_save --save_errors continue --losses "$tmp/failed_one.csv" > "$tmp/failed_one.out" 2>&1
    warned=$(grep '^warning: checkpoint of step' "$tmp/failed_one.out")
    expect "--save_errors continue, --async_save: rank 1's sync of step 10 fails (ENOSPC), one warning: $(echo "$warned" | sed "s|$tmp/||g")" \
        test "$(echo "$warned" | wc -l)" = 1 -a -n "$(echo "$warned" | grep "^warning: checkpoint of step 10 not saved in $tmp/ckf/step-000010, its unfinished folder removed; current still names step-000005; training goes on (--save_errors continue): $tmp/ckf/tmp-000010/shard-00001.h5: cannot flush it to disk: No space left on device$")"
    expect "... steps 15 to 30 saved, step 30 current, no tmp-* left" \
        test "$(grep -o '^Checkpoint of step [0-9]*' "$tmp/failed_one.out" | awk '{ print $4 }' | paste -sd ' ')" = "5 15 20 25 30" \
        -a "$(cat "$tmp/ckf/current")" = step-000030 -a -z "$(ls -d "$tmp"/ckf/tmp-* 2> /dev/null)"
    same_as_reference "... and the run took the uninterrupted steps" failed_one
    # The last step's save fails once (rank 1's sync of step 30, ENOSPC): it is tried once more, in
    # line, and saved; exit 0.
    mpi 2 -x LD_PRELOAD=$crash_lib -x CRASH_IN_SAVE=tmp-000030/shard-00001.h5 -x CRASH_IN_SAVE_ERRNO=28 $program "${common[@]}" \
        --zero 3 --checkpoint "$tmp/ckl" --save_every 10 --save_errors continue --losses "$tmp/failed_last.csv" > "$tmp/failed_last.out" 2>&1
    status=$?
    expect "--save_errors continue: the last step's save fails once, then saves: exit $status, $(grep -c '^warning: checkpoint of step 30 not saved' "$tmp/failed_last.out") warning, steps $(grep -o '^Checkpoint of step [0-9]*' "$tmp/failed_last.out" | awk '{ print $4 }' | paste -sd ' ') saved, step 30 current" \
        test $status = 0 -a "$(grep -c '^warning' "$tmp/failed_last.out")" = 1 -a "$(grep -c '^warning: checkpoint of step 30 not saved' "$tmp/failed_last.out")" = 1 \
        -a "$(grep -o '^Checkpoint of step [0-9]*' "$tmp/failed_last.out" | awk '{ print $4 }' | paste -sd ' ')" = "10 20 30" \
        -a "$(cat "$tmp/ckl/current")" = step-000030 -a -z "$(ls -d "$tmp"/ckl/tmp-* 2> /dev/null)"
    if thorough; then
        # The same, saving in line: one rank's failure, agreed by both, and the run goes on.
        mpi 2 -x LD_PRELOAD=$crash_lib -x CRASH_IN_SAVE=tmp-000010/shard-00001.h5 -x CRASH_IN_SAVE_ERRNO=28 $program "${common[@]}" \
            --zero 3 --checkpoint "$tmp/ckfs" --save_every 5 --save_errors continue --losses "$tmp/failed_sync.csv" > "$tmp/failed_sync.out" 2>&1
        expect "--save_errors continue: rank 1's failed sync of step 10, one warning, steps 15 to 30 saved, step 30 current" \
            test "$(grep -c '^warning: checkpoint of step 10 not saved.*No space left on device$' "$tmp/failed_sync.out")" = 1 \
            -a "$(grep -c '^Checkpoint of step' "$tmp/failed_sync.out")" = 5 -a "$(cat "$tmp/ckfs/current")" = step-000030 \
            -a -z "$(ls -d "$tmp"/ckfs/tmp-* 2> /dev/null)"
        same_as_reference "... and the run took the uninterrupted steps" failed_sync
        # --save_errors stop (the default): the same failure ends the run on every rank, one line, step 5 current.
        RUN_TIMEOUT=60 mpi 2 -x LD_PRELOAD=$crash_lib -x CRASH_IN_SAVE=tmp-000010/shard-00001.h5 -x CRASH_IN_SAVE_ERRNO=28 $program \
            "${common[@]}" --zero 3 --checkpoint "$tmp/ckfx" --save_every 5 > "$tmp/failed_stop.out" 2>&1
        status=$?
        expect "--save_errors stop: rank 1's failed sync of step 10 ends the run (exit $status), one line: $(grep '^\[rank' "$tmp/failed_stop.out" | sed "s|$tmp/||g")" \
            test $status = 1 -a "$(grep -c '^\[rank' "$tmp/failed_stop.out")" = 1 -a "$(cat "$tmp/ckfx/current")" = step-000005 \
            -a -z "$(ls -d "$tmp"/ckfx/tmp-* 2> /dev/null)" -a -z "$(grep 'Training completed' "$tmp/failed_stop.out")"
        # Rank 0 killed in the second save between the step's folder's rename and `current`'s.
        RUN_TIMEOUT=60 mpi 2 -x LD_PRELOAD=$crash_lib -x CRASH_IN_SAVE=current.tmp -x CRASH_IN_SAVE_COUNT=2 $program \
            "${common[@]}" --zero 2 --checkpoint "$tmp/ckr" --save_every 5 > "$tmp/crashed_r.out" 2>&1
        expect "rank 0 killed after renaming step 10's folder, before replacing current: current names step 5" \
            test "$(cat "$tmp/ckr/current")" = step-000005 -a -d "$tmp/ckr/step-000010"
        zero18 2 after_crash_r --zero 2 --checkpoint "$tmp/ckr" --save_every 5
        expect "... the resume goes on from step 5, and saves step 10 again over the stray folder" \
            test "$(resumed_at after_crash_r)" = 5 -a "$(grep -c '^Checkpoint of step 10 ' "$tmp/after_crash_r.out")" = 1
        same_as_reference "... and takes the uninterrupted run's steps" after_crash_r
    fi
else
    fail "$crash_lib is not built (make)"
fi

# ---------------------------------------------------------------- another layout
# A global batch of 2000 x 2 taken by 4000 x 1: the same steps, summed in another order.
zero18 1 reshard_1 --zero 0 --batch_size 4000 --checkpoint "$tmp/ck"
expect "ZeRO-3 on 2 ranks resumed as DDP on 1 rank says it resharded" grep -q '^Resumed from .*saved by ZeRO-3 on 2 ranks: .*resharded' "$tmp/reshard_1.out"
expect_same_losses "... and takes the uninterrupted run's losses within 1e-5" "$tmp/ref.csv" "$tmp/reshard_1.csv" 1e-5
same_weights "... and ends with its weights within 1e-5" "$tmp/reshard_1.h5" "$tmp/ref.h5" 1e-5
if thorough; then
    # ZeRO-3 on 4 ranks stopped at step 4 of 10 (a global batch of 12000: 3000 x 4, 6000 x 2, 4000 x 3).
    common=(--data "$DATA" --epochs 2 --plot '')
    zero18 4 ref4 --zero 3 --batch_size 3000
    zero18 4 stop4 --zero 3 --batch_size 3000 --max_steps 4 --checkpoint "$tmp/ck4"
    cp -r "$tmp/ck4" "$tmp/ck4b"
    for target in "2 ddp2 --zero 0 --batch_size 6000 --checkpoint $tmp/ck4" "3 z1_3 --zero 1 --batch_size 4000 --checkpoint $tmp/ck4b" \
                  "4 z2_4 --zero 2 --batch_size 3000 --checkpoint $tmp/ck4"; do
        set -- $target
        zero18 "$@"
        expect_same_losses "ZeRO-3 on 4 ranks resumed at step 4 as $3 $4 on $1 ranks: the uninterrupted losses within 1e-5" \
            "$tmp/ref4.csv" "$tmp/$2.csv" 1e-5
        same_weights "... and its weights within 1e-5" "$tmp/$2.h5" "$tmp/ref4.h5" 1e-5
        rm -rf "$tmp/ck4" && cp -r "$tmp/ck4b" "$tmp/ck4"  # (each resume saves on; start the next from step 4)
    done
    common=(--data "$DATA" --batch_size 2000 --epochs 2 --plot '')
fi

# ---------------------------------------------------------------- steps 16 and 17: the same flags, the same module
# split NP NAME PROGRAM FLAGS...: as zero18, for another program.
split_common=(--data "$DATA" --batch_size 2000 --epochs 1 --plot '')  # 30 steps: step 17 is mid-epoch
split() {
    local np=$1 name=$2; shift 2
    mpi "$np" "$@" "${split_common[@]}" --losses "$tmp/$name.csv" --save "$tmp/$name.h5" > "$tmp/$name.out" 2>&1
}
# same_run WHAT NAME REF: NAME ended with REF's checksum and took its losses, bit for bit.
same_run() {
    expect "$1: checksum $(checksum "$tmp/$2.out") ($3: $(checksum "$tmp/$3.out")), the same losses bit for bit" \
        test -n "$(checksum "$tmp/$3.out")" -a "$(checksum "$tmp/$2.out")" = "$(checksum "$tmp/$3.out")" \
        -a -s "$tmp/$2.csv" -a "$(cat "$tmp/$2.csv" 2> /dev/null)" = "$(cat "$tmp/$3.csv")"
}
for step in "16 day4/16_pipeline_ddp --pp" "17 day4/17_tensor_parallel --tp"; do
    set -- $step
    n=$1 prog=$2 split_flag=$3
    split 2 ref$n $prog $split_flag 2
    split 2 stop$n $prog $split_flag 2 --max_steps 17 --save_every 10 --checkpoint "$tmp/ck$n"
    expect "step $n: one shard file per rank, each rank's $(sed -n 's/^Checkpoint of step 17 .*: \(.* MB per rank\).*/\1/p' "$tmp/stop$n.out")" \
        test "$(ls "$tmp/ck$n/step-000017" | paste -sd ' ')" = "index.h5 shard-00000.h5 shard-00001.h5" -a "$(cat "$tmp/ck$n/current")" = step-000017
    cp -r "$tmp/ck$n" "$tmp/ck${n}b"
    cp -r "$tmp/ck$n" "$tmp/ck${n}c"
    split 2 resumed$n $prog $split_flag 2 --checkpoint "$tmp/ck$n"
    expect "step $n: the resume says where: $(grep '^Resumed' "$tmp/resumed$n.out")" \
        grep -q "^Resumed from .*/step-000017, saved by 2 .* x 1 replica: step 17, epoch 1, 34000 of its 60000 samples done;" "$tmp/resumed$n.out"
    same_run "step $n: stopped at step 17 (mid-epoch 1) and resumed with the same layout" resumed$n ref$n
    if thorough; then
        # --async_save: the same steps, saved by a thread; stopped at step 17 and resumed (saving so too), bit for bit.
        split 2 astop$n $prog $split_flag 2 --max_steps 17 --save_every 5 --async_save --checkpoint "$tmp/ck${n}a"
        expect "step $n --async_save: steps 5, 10 and 15 written by a thread, each line with its stall and write time, step 17 current" \
            test "$(grep -c '^Checkpoint of step [0-9]* saved in .*written by a thread from host copies), index .*; the training stalled [0-9.]* ms, the thread wrote for [0-9.]* ms$' "$tmp/astop$n.out")" = 3 \
            -a "$(cat "$tmp/ck${n}a/current")" = step-000017
        same_run "step $n --async_save: the steps of the run saving in line" astop$n stop$n
        split 2 ares$n $prog $split_flag 2 --save_every 5 --async_save --checkpoint "$tmp/ck${n}a"
        same_run "step $n --async_save: stopped at step 17 and resumed" ares$n ref$n
    fi
    split 1 whole$n $prog $split_flag 1 --checkpoint "$tmp/ck${n}b"
    expect "step $n: $split_flag 2 resumed as $split_flag 1 says it resharded" grep -q '^Resumed from .*saved by 2 .*: step 17, .*resharded' "$tmp/whole$n.out"
done
# 2 stages on 1 replica and 1 stage do the same operations in the same order: the same bits.
same_run "step 16: 2 stages resumed as 1 stage takes the uninterrupted run's steps" whole16 ref16
# Tensor parallelism sums the row-parallel layer's 2 partial products in another order than one GEMM.
expect_same_losses "step 17: tensor-parallel 2 resumed as 1 rank: the uninterrupted losses within 1e-5" "$tmp/ref17.csv" "$tmp/whole17.csv" 1e-5
same_weights "... and its weights within 1e-5" "$tmp/whole17.h5" "$tmp/ref17.h5" 1e-5
if thorough; then
    split_common=(--data "$DATA" --epochs 2 --plot '')
    # 2 stages x 2 replicas (batch 1000 each) stopped at step 7, resumed as 4 stages x 1 (batch 2000).
    split 4 ref16x2 day4/16_pipeline_ddp --pp 2 --hidden 128,128,128 --batch_size 1000
    split 4 stop16x2 day4/16_pipeline_ddp --pp 2 --hidden 128,128,128 --batch_size 1000 --max_steps 7 --checkpoint "$tmp/ck16x2"
    expect "step 16: 2 stages x 2 replicas write 4 shard files: $(sed -n 's/^Checkpoint of step 7 .*: \(.* MB per rank\).*/\1/p' "$tmp/stop16x2.out")" \
        test "$(ls "$tmp/ck16x2/step-000007" | wc -l)" = 5
    split 4 pp4 day4/16_pipeline_ddp --pp 4 --hidden 128,128,128 --batch_size 2000 --checkpoint "$tmp/ck16x2"
    expect "... resumed as 4 stages x 1 replica: $(grep '^Resumed' "$tmp/pp4.out")" grep -q '^Resumed from .*saved by 2 pipeline stages x 2 replicas: step 7, .*resharded' "$tmp/pp4.out"
    expect_same_losses "... the uninterrupted losses within 1e-5" "$tmp/ref16x2.csv" "$tmp/pp4.csv" 1e-5
    verdict=$(build/tools/compare_h5_weights "$tmp/pp4.h5" "$tmp/ref16x2.h5" 1e-5 2>&1)
    expect "... and its weights within 1e-5: $verdict" test $? = 0
    # Tensor-parallel 2 x 2 replicas stopped at step 7, resumed as 4 x 1 replica and as 1 x 2 replicas.
    split 4 ref17x2 day4/17_tensor_parallel --tp 2 --batch_size 1000
    split 4 stop17x2 day4/17_tensor_parallel --tp 2 --batch_size 1000 --max_steps 7 --checkpoint "$tmp/ck17x2"
    cp -r "$tmp/ck17x2" "$tmp/ck17x2b"
    split 4 tp4 day4/17_tensor_parallel --tp 4 --batch_size 2000 --checkpoint "$tmp/ck17x2"
    expect_same_losses "step 17: tensor-parallel 2 x 2 replicas resumed as 4 x 1: the uninterrupted losses within 1e-5" "$tmp/ref17x2.csv" "$tmp/tp4.csv" 1e-5
    split 2 tp1x2 day4/17_tensor_parallel --tp 1 --batch_size 1000 --checkpoint "$tmp/ck17x2b"
    expect_same_losses "... resumed as 1 x 2 replicas: the uninterrupted losses within 1e-5" "$tmp/ref17x2.csv" "$tmp/tp1x2.csv" 1e-5
    same_weights "... and its weights within 1e-5" "$tmp/tp1x2.h5" "$tmp/ref17x2.h5" 1e-5
fi

# ---------------------------------------------------------------- step 19: the GPT, its two generators
# A small GPT (30 iterations, evaluated every 10) stopped at step 17 and resumed: the uninterrupted
# run's evaluations, losses and weights, bit for bit (the training and evaluation windows' generators
# travel in the checkpoint); on 1 rank with the same global batch, within 1e-5.
if [ -f data/shakespeare/input.txt ] && [ -x day5/19_gpt ]; then
    gpt=(day5/19_gpt --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --max_iters 30 --lr_decay_iters 30 --eval_interval 10
         --eval_iters 2 --sample 0 --plot '')
    mpi 2 "${gpt[@]}" --losses "$tmp/gpt_ref.csv" > "$tmp/gpt_ref.out" 2>&1
    mpi 2 "${gpt[@]}" --max_iters 17 --save_every 5 --checkpoint "$tmp/ckg" > "$tmp/gpt_stop.out" 2>&1
    cp -r "$tmp/ckg" "$tmp/ckg1"
    cp -r "$tmp/ckg" "$tmp/ckga"
    cp -r "$tmp/ckg" "$tmp/ckgs"
    mpi 2 "${gpt[@]}" --checkpoint "$tmp/ckg" --losses "$tmp/gpt_res.csv" > "$tmp/gpt_res.out" 2>&1
    evals() { grep '^step [0-9]*: train loss' "$1" | grep -v '^step 0:\|^step 10:' | paste -sd ' '; }
    expect "step 19 stopped at step 17 and resumed ($(grep -o '^Resumed from .*restored' "$tmp/gpt_res.out" | sed "s|$tmp/||")): checksum $(checksum "$tmp/gpt_res.out") (uninterrupted: $(checksum "$tmp/gpt_ref.out")), the same losses and evaluations bit for bit" \
        test -n "$(checksum "$tmp/gpt_ref.out")" -a "$(checksum "$tmp/gpt_res.out")" = "$(checksum "$tmp/gpt_ref.out")" \
        -a -n "$(grep '^Resumed from .*step-000017, saved by DDP on 2 ranks: step 17, the windows' "$tmp/gpt_res.out")" \
        -a -s "$tmp/gpt_res.csv" -a "$(cat "$tmp/gpt_res.csv" 2> /dev/null)" = "$(cat "$tmp/gpt_ref.csv")" \
        -a -n "$(evals "$tmp/gpt_res.out")" -a "$(evals "$tmp/gpt_res.out")" = "$(evals "$tmp/gpt_ref.out")"
    mpi 1 "${gpt[@]}" --batch_size 24 --checkpoint "$tmp/ckg1" --losses "$tmp/gpt_1.csv" > "$tmp/gpt_1.out" 2>&1
    expect_same_losses "... resumed on 1 rank (batch 24 = 12 x 2), resharded: the uninterrupted losses within 1e-5" "$tmp/gpt_ref.csv" "$tmp/gpt_1.csv" 1e-5
    # --on_resize (an elastic restart's): keep_batch refuses a --batch_size that does not divide the
    # saved global batch (24 windows on 1 rank of 5), before any step; scale_lr on 1 rank keeps the
    # batch of 12 and halves the learning rate (iteration 20's, against the uninterrupted run's).
    # (keep_batch's steps: tests/test_fault_tolerance.sh, 4 ranks restarted on 2.)
    RUN_TIMEOUT=60 mpi 1 "${gpt[@]}" --batch_size 5 --checkpoint "$tmp/ckgs" --on_resize keep_batch > "$tmp/gpt_bad.out" 2>&1
    status=$?
    expect "step 19 --on_resize keep_batch on 1 rank of --batch_size 5: exit $status, one line ($(grep '^error' "$tmp/gpt_bad.out")), nothing trained" \
        test $status = 2 -a "$(grep -c '^error' "$tmp/gpt_bad.out")" = 1 -a "$(cat "$tmp/ckgs/current")" = step-000017 \
        -a -n "$(grep -- "^error: --on_resize keep_batch: the checkpoint's global batch of 24 windows is not a multiple of --batch_size 5 x 1 rank" "$tmp/gpt_bad.out")" \
        -a -z "$(grep '^iter' "$tmp/gpt_bad.out")"
    mpi 1 "${gpt[@]}" --checkpoint "$tmp/ckgs" --on_resize scale_lr > "$tmp/gpt_s.out" 2>&1
    lr_ref=$(sed -n 's/^iter 20: .*, lr \([0-9.e+-]*\),.*/\1/p' "$tmp/gpt_ref.out")
    lr_scaled=$(sed -n 's/^iter 20: .*, lr \([0-9.e+-]*\),.*/\1/p' "$tmp/gpt_s.out")
    expect "step 19 --on_resize scale_lr, 2 ranks resumed on 1: the lr x 0.5 ($(grep -o -- '--on_resize scale_lr: .*' "$tmp/gpt_s.out")); iteration 20's lr ${lr_scaled:-none}, uninterrupted ${lr_ref:-none}" \
        test -n "$lr_ref" -a -n "$lr_scaled" -a -n "$(grep -- '^--on_resize scale_lr: the global batch goes from 24 windows (2 ranks) to 12 (1): the learning rate x 0.5, ' "$tmp/gpt_s.out")" \
        -a -n "$(awk -v a="$lr_scaled" -v b="$lr_ref" 'BEGIN { d = 2 * a / b - 1; if (d < 0) d = -d; if (d < 0.01) print "halved" }')"
    expect_error 2 '^error: --on_resize: only with --checkpoint DIR' mpi 1 "${gpt[@]}" --max_iters 1 --on_resize keep_batch
    # --async_save: resumed at step 17 and saving every 5 steps from a thread, the uninterrupted steps.
    mpi 2 "${gpt[@]}" --checkpoint "$tmp/ckga" --save_every 5 --async_save --losses "$tmp/gpt_ares.csv" > "$tmp/gpt_ares.out" 2>&1
    expect "step 19 --async_save: resumed at step 17, steps 20, 25 and 30 written by a thread (stall and write time each), checksum $(checksum "$tmp/gpt_ares.out"), the uninterrupted losses bit for bit" \
        test "$(grep -c '^Checkpoint of step [0-9]* saved in .*written by a thread from host copies), index .*; the training stalled [0-9.]* ms, the thread wrote for [0-9.]* ms$' "$tmp/gpt_ares.out")" = 3 \
        -a "$(cat "$tmp/ckga/current")" = step-000030 -a -n "$(checksum "$tmp/gpt_ref.out")" -a "$(checksum "$tmp/gpt_ares.out")" = "$(checksum "$tmp/gpt_ref.out")" \
        -a -n "$(grep '^Resumed from .*step-000017' "$tmp/gpt_ares.out")" -a "$(cat "$tmp/gpt_ares.csv" 2> /dev/null)" = "$(cat "$tmp/gpt_ref.csv")"
    if thorough; then
        # Stopped at step 17 saving from a thread (the same steps as saving in line), then resumed so, bit for bit.
        mpi 2 "${gpt[@]}" --max_iters 17 --save_every 5 --async_save --checkpoint "$tmp/ckgb" > "$tmp/gpt_astop.out" 2>&1
        expect "step 19 --async_save stopped at step 17: the checksum of the run saving in line ($(checksum "$tmp/gpt_stop.out")), step 17 current" \
            test -n "$(checksum "$tmp/gpt_stop.out")" -a "$(checksum "$tmp/gpt_astop.out")" = "$(checksum "$tmp/gpt_stop.out")" -a "$(cat "$tmp/ckgb/current")" = step-000017
        mpi 2 "${gpt[@]}" --checkpoint "$tmp/ckgb" --save_every 5 --async_save --losses "$tmp/gpt_ares2.csv" > "$tmp/gpt_ares2.out" 2>&1
        expect "... resumed, saving from a thread: checksum $(checksum "$tmp/gpt_ares2.out"), the uninterrupted losses and evaluations bit for bit" \
            test "$(checksum "$tmp/gpt_ares2.out")" = "$(checksum "$tmp/gpt_ref.out")" -a "$(cat "$tmp/gpt_ares2.csv" 2> /dev/null)" = "$(cat "$tmp/gpt_ref.csv")" \
            -a -n "$(evals "$tmp/gpt_ares2.out")" -a "$(evals "$tmp/gpt_ares2.out")" = "$(evals "$tmp/gpt_ref.out")"
    fi
else
    skip "step 19's checkpoints (needs day5/19_gpt and data/shakespeare: make shakespeare)"
fi

# ---------------------------------------------------------------- tools/checkpoint_to_state_dict
# Each step's checkpoint of step 17 made one state_dict: --save's file of the same run, bit for bit
# (whatever split wrote it), and --init of it starts the program from the same weights (its checksum).
for step in "16 day4/16_pipeline_ddp --pp 2" "17 day4/17_tensor_parallel --tp 2" "18 day4/18_zero_sharding --zero 3"; do
    set -- $step
    n=$1 prog=$2
    shift 2
    tools/checkpoint_to_state_dict "$tmp/ck${n}c" "$tmp/whole$n.state.h5" > "$tmp/convert$n.out" 2>&1
    status=$?
    saved=$tmp/stop$n.h5 saved_out=$tmp/stop$n.out
    [ "$n" = 18 ] && saved=$tmp/first.h5 saved_out=$tmp/first.out
    expect "step $n's checkpoint converted (exit $status): $(sed "s|$tmp/||g" "$tmp/convert$n.out")" \
        test $status = 0 -a -n "$(grep "^$tmp/ck${n}c/step-000017 (.*step 17): 4 tensors, 101770 weights, written whole" "$tmp/convert$n.out")"
    verdict=$(build/tools/compare_h5_weights "$tmp/whole$n.state.h5" "$saved" 0 2>&1)
    status=$?
    expect "... the same weights as --save at step 17, bit for bit: $verdict" test $status = 0
    RUN_TIMEOUT=60 mpi 2 $prog "$@" --data "$DATA" --plot '' --init "$tmp/whole$n.state.h5" --max_steps 0 > "$tmp/init$n.out" 2>&1
    expect "... --init of it, no step taken: checksum $(checksum "$tmp/init$n.out"), the stopped run's $(checksum "$saved_out")" \
        test -n "$(checksum "$saved_out")" -a "$(checksum "$tmp/init$n.out")" = "$(checksum "$saved_out")"
done
if "$PYTHON" -c 'import torch, h5py' 2> /dev/null; then
    "$PYTHON" - "$tmp/whole18.state.h5" "$tmp/first.h5" > "$tmp/torch.out" 2>&1 <<'PY'
import sys, h5py, torch, torch.nn as nn
class Net(nn.Module):  # the workshop's model
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
model = Net()
with h5py.File(sys.argv[1], "r") as f:
    model.load_state_dict({k: torch.from_numpy(f[k][...]) for k in f})  # strict: every key, no other
with h5py.File(sys.argv[2], "r") as f:
    same = all(torch.equal(p, torch.from_numpy(f[k][...])) for k, p in model.state_dict().items())
print(f"{'ok' if same else 'MISMATCH'}: {len(model.state_dict())} tensors loaded, equal to --save's: {same}")
sys.exit(0 if same else 1)
PY
    expect "torch loads the converted ZeRO-3 checkpoint (strict load_state_dict): $(tail -1 "$tmp/torch.out")" test $? = 0
else
    skip "torch loads a converted checkpoint (needs $PYTHON with torch and h5py: ./setup.sh --with-reference)"
fi
rm -rf "$tmp/ck18d" && cp -r "$tmp/ck18c" "$tmp/ck18d" && rm "$tmp/ck18d/step-000017/shard-00001.h5"
tools/checkpoint_to_state_dict "$tmp/ck18d" "$tmp/none.h5" > "$tmp/convert_bad.out" 2>&1
status=$?
expect "a checkpoint missing a shard: exit $status, one line, no file written: $(sed "s|$tmp/||g" "$tmp/convert_bad.out")" \
    test $status = 1 -a "$(wc -l < "$tmp/convert_bad.out")" = 1 -a ! -e "$tmp/none.h5" \
    -a -n "$(grep 'shard-00001.h5: missing' "$tmp/convert_bad.out")" -a -z "$(ls "$tmp" | grep 'none.h5.tmp')"

# ---------------------------------------------------------------- bad checkpoints
# A checkpoint of 2 steps, and copies of it damaged one way each.
mpi 2 $program "${common[@]}" --zero 3 --max_steps 2 --checkpoint "$tmp/good" > /dev/null 2>&1
mpi 2 $program "${common[@]}" --zero 3 --max_steps 2 --checkpoint "$tmp/other" --hidden 64 > /dev/null 2>&1
mpi 2 $program "${common[@]}" --zero 3 --max_steps 2 --checkpoint "$tmp/later" --seed 0 --lr 0.001 > /dev/null 2>&1
damaged() { rm -rf "$tmp/broken"; cp -r "$tmp/good" "$tmp/broken"; }
# refused WHAT PATTERN [FLAGS...]: a resume from $tmp/broken exits 1 with one line matching PATTERN,
# and leaves the folder as it was.
refused() {
    local what=$1 pattern=$2 before lines; shift 2
    before=$(cd "$tmp/broken" && find . -type f | sort | xargs md5sum)
    RUN_TIMEOUT=60 mpi 2 $program "${common[@]}" --zero 3 --checkpoint "$tmp/broken" "$@" > "$tmp/err" 2>&1
    local status=$?
    lines=$(grep -c '^\[rank [0-9]* @ ' "$tmp/err")
    if [ $status -eq 1 ] && [ "$lines" -eq 1 ] && grep -qE "$pattern" "$tmp/err" && ! grep -qiE 'segmentation|core dumped' "$tmp/err" &&
        [ "$(cd "$tmp/broken" && find . -type f | sort | xargs md5sum)" = "$before" ]; then
        pass "$what: exit 1, nothing changed, one line: $(grep '^\[rank' "$tmp/err" | sed "s|$tmp/||g")"
    else
        fail "$what: exit $status, $lines error line(s): $(head -3 "$tmp/err" | tr '\n' ' ')"
    fi
}
damaged; rm "$tmp/broken/step-000002/shard-00001.h5"
refused "a missing shard file" 'broken/step-000002/shard-00001.h5: missing \(expected rank 1.s shards'
damaged; cp "$tmp/other/step-000002/shard-00001.h5" "$tmp/broken/step-000002/"
refused "a shard of another model" "shard-00001.h5: dataset 'fc.0.weight/0' is \[1, 752\], the index expects float32 \[1, 720\]"
damaged; cp "$tmp/later/step-000002/shard-00000.h5" "$tmp/broken/step-000002/"
refused "a shard of another checkpoint of the same model" 'shard-00000.h5: a shard of another checkpoint'
damaged; truncate -s 20000 "$tmp/broken/step-000002/shard-00000.h5"
refused "a truncated shard file" 'shard-00000.h5: not a readable HDF5 file \(20000 bytes\): truncated'
damaged; build/tools/edit_checkpoint_index "$tmp/broken/step-000002/index.h5" piece fc.2.bias 0 1 5
refused "an index that names a dataset the shard file lacks" "shard-00001.h5: dataset 'fc.2.bias/5' is missing, the index expects"
damaged; build/tools/edit_checkpoint_index "$tmp/broken/step-000002/index.h5" piece fc.0.weight 0 6 1000
refused "an index whose piece lies outside its tensor" "index.h5: 'fc.0.weight' piece 0 lies outside the tensor's \[128, 784\]"
damaged; build/tools/edit_checkpoint_index "$tmp/broken/step-000002/index.h5" piece fc.0.weight 0 2 1
refused "an index whose pieces overlap" "index.h5: 'fc.0.weight' pieces [0-9]+ and [0-9]+ overlap"
damaged; build/tools/edit_checkpoint_index "$tmp/broken/step-000002/index.h5" attr program day4/17_tensor_parallel
refused "a checkpoint of another program" 'index.h5: a checkpoint of day4/17_tensor_parallel, not of day4/18_zero_sharding'
damaged; rm "$tmp/broken/step-000002/index.h5"
refused "a checkpoint without its index" 'step-000002/index.h5: missing'
damaged
refused "a checkpoint of another model (--hidden 64)" "index.h5: tensor 'fc.0.weight' is \[128, 784\], this model's is \[64, 784\]" --hidden 64
refused "a checkpoint of another run (--seed 3)" 'index.h5: a checkpoint of another run: seed 0' --seed 3

# ---------------------------------------------------------------- a full disk, an unwritable folder
if [ "$(id -u)" = 0 ] && mkdir -p "$tmp/small" && mount -t tmpfs -o size=2m tmpfs "$tmp/small" 2> /dev/null; then
    at_exit 'umount "$tmp/small" 2> /dev/null'
    # --save_errors continue: step 10's checkpoint fits, steps 20 and 30 do not: a warning each, and
    # the last step's one more try fails too (a third warning). The run ends as the uninterrupted
    # one, its outputs written, then one line and exit 1: its end is not saved. Step 10 current, no
    # tmp-* left.
    zero18 2 full_go --zero 3 --save_every 10 --checkpoint "$tmp/small/ck" --save_errors continue
    status=$?
    warnings=$(grep -c '^warning: checkpoint of step [23]0 not saved in .*current still names step-000010; training goes on (--save_errors continue): .*No space left on device$' "$tmp/full_go.out")
    expect "a full disk, --save_errors continue: $warnings warnings (steps 20, 30 and 30 again), step 10 current, no tmp-* left, exit $status and one line: $(grep '^\[rank [0-9]* @' "$tmp/full_go.out" | sed "s|$tmp/||g")" \
        test $status = 1 -a "$warnings" = 3 -a "$(grep -c '^warning' "$tmp/full_go.out")" = 3 \
        -a "$(grep -c '^\[rank [0-9]* @' "$tmp/full_go.out")" = 1 -a -n "$(grep "^\[rank 0 @ .*\] the end of training is not saved in $tmp/small/ck: the last step's checkpoint failed twice" "$tmp/full_go.out")" \
        -a "$(cat "$tmp/small/ck/current")" = step-000010 -a -z "$(ls -d "$tmp"/small/ck/tmp-* 2> /dev/null)"
    same_as_reference "... and the run took the uninterrupted steps, its checksum and losses written before it failed" full_go
    rm -rf "$tmp/small/ck"
    # --save_errors stop (the default). A checkpoint takes 1.3 MB: the first fits, the second does not.
    mpi 2 $program "${common[@]}" --zero 1 --max_steps 4 --save_every 2 --checkpoint "$tmp/small/ck" > "$tmp/full.out" 2>&1
    status=$?
    expect "a full disk at the second save: exit $status, one line ($(grep '^\[rank' "$tmp/full.out" | sed "s|$tmp/||g")), step 2 still current, no tmp-* left" \
        test $status -eq 1 -a "$(grep -c '^\[rank' "$tmp/full.out")" -eq 1 -a "$(cat "$tmp/small/ck/current")" = step-000002 \
        -a -z "$(ls -d "$tmp"/small/ck/tmp-* 2> /dev/null)" -a -z "$(grep -iE 'segmentation|core dumped' "$tmp/full.out")"
    grep -q 'No space left on device' "$tmp/full.out" || fail "the full disk's line does not say 'No space left on device'"
    mount -o remount,ro "$tmp/small"
    mpi 2 $program "${common[@]}" --zero 1 --max_steps 4 --checkpoint "$tmp/small/ck" > "$tmp/ro.out" 2>&1
    status=$?
    expect "a read-only folder: exit $status before training, one line: $(grep '^\[rank' "$tmp/ro.out" | sed "s|$tmp/||g")" \
        test $status -eq 1 -a "$(grep -c '^\[rank' "$tmp/ro.out")" -eq 1 -a -n "$(grep 'the checkpoint folder is not writable: Read-only file system' "$tmp/ro.out")" \
        -a -z "$(grep '^epoch' "$tmp/ro.out")"
    mount -o remount,rw "$tmp/small"
    mpi 2 $program "${common[@]}" --zero 1 --max_steps 2 --checkpoint "$tmp/small/ck" > "$tmp/intact.out" 2>&1
    expect "... the checkpoint of step 2 is intact: it loads" grep -q '^Nothing left to train: the checkpoint is at step 2' "$tmp/intact.out"
else
    skip "a full disk and a read-only folder (needs root to mount a small tmpfs)"
fi
mkdir -p "$tmp/afile" && : > "$tmp/afile/ck"
expect_error 1 'afile/ck: the checkpoint folder is not writable' mpi 2 $program "${common[@]}" --max_steps 1 --checkpoint "$tmp/afile/ck"

# ---------------------------------------------------------------- flags
expect_refused_flags $program 2 "--save_every without --checkpoint" '--save_every: only with --checkpoint DIR' --save_every 5
expect_refused_flags $program 2 "--keep 0" '--keep' --checkpoint "$tmp/ck" --keep 0
expect_refused_flags $program 2 "--async_save without --checkpoint" '--async_save: only with --checkpoint DIR' --async_save
expect_refused_flags $program 2 "--save_errors without --checkpoint" '--save_errors: only with --checkpoint DIR' --save_errors continue
exit_status
