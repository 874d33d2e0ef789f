#!/usr/bin/env bash
# Day 3's step 13 (snapshots, exact resume) and slurm/run_with_restarts.sh, with real kills.
# Prints one PASS/FAIL/SKIP line per check (tests/run.sh counts them).
#   - without a failure, step 13 takes step 10's steps, bit for bit;
#   - killed (SIGKILL: --fail_at_epoch, or from outside) and started again with the
#     same command, at 1 and 2 ranks, it ends with the weights of a run that never
#     stopped (parameter checksum) and the same --losses CSV, byte for byte;
#   - SIGUSR1 to mpirun, or SIGTERM to every rank (as Slurm sends at the time
#     limit): every rank saves at the same step and exits 75; the same command
#     resumes mid-epoch, still exactly;
#   - run_with_restarts.sh brings an injected failure back to the same weights;
#   - rank 0 killed in the middle of writing a snapshot (strace holds its rename)
#     leaves the previous snapshot whole, and the run resumes from it exactly;
#   - truncated, corrupt, incomplete, wrongly shaped or mismatched snapshots, a
#     snapshot seen by one rank of two, and a failed write: one line naming the
#     file and what is wrong, exit 1 on every rank, no hang;
#   - another world size resumes, and says the data order differs;
#   - h5py and torch read the snapshot as the README shows; resuming takes no
#     more memory than a fresh start;
#   - the sharded form (--checkpoint DIR, each rank writing 1/W of every tensor): the
#     snapshot's steps; killed in epoch 2 (--fail_at_epoch) and stopped mid-epoch (SIGUSR1 as
#     the ranks start; at TEST_LEVEL=all also SIGTERM to mpirun), resumed on 2 ranks bit for
#     bit; that mid-epoch checkpoint resumed on 1 and 4 ranks at its data position; a missing
#     or truncated shard: one line, exit 1; --snapshot with --checkpoint: exit 2.
# make test (TEST_LEVEL=quick) runs the references, the kill by --fail_at_epoch on 2 ranks and
# its exact resume, the bad snapshots and usage errors, and the sharded form's checks but two;
# make test-all (TEST_LEVEL=all) also the kill on 1 rank, the kills from outside, the stop
# signals, run_with_restarts.sh around them, rank 0 killed mid-write, torch reading the snapshot,
# the memory check, and the sharded form's --async_save and SIGTERM to mpirun.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite fault_tolerance
needs_built day3/13_fault_tolerant_ddp tools/checkpoint_to_state_dict
scratch
background=()  # pids of runs started in the background: stopped on exit, by pid
at_exit 'for pid in "${background[@]}"; do kill -KILL "$pid" 2> /dev/null; done'

# Runs are bounded by $RUN_TIMEOUT (tests/lib.sh), and killed 5 s after it if
# the TERM is not enough. The flags use the tutorial's --flag=value spelling throughout.
EPOCHS=3
step13() {  # ranks, flags...
    local np=$1
    shift
    timeout -k 5 "$RUN_TIMEOUT" $MPIRUN -np "$np" day3/13_fault_tolerant_ddp --data="$DATA" --total_epochs=$EPOCHS --plot= "$@"
}
# Start step 13 in the background, output to a file; $run_pid is timeout's pid,
# mpirun is its child and the ranks are mpirun's children.
step13_background() {  # output, ranks, flags...
    local out=$1 np=$2
    shift 2
    timeout -k 5 "$RUN_TIMEOUT" $MPIRUN -np "$np" day3/13_fault_tolerant_ddp --data="$DATA" --total_epochs=$EPOCHS --plot= "$@" \
        > "$out" 2>&1 &
    run_pid=$!
    background+=("$run_pid")
}
mpirun_pid() { pgrep -P "$run_pid" | head -1; }
rank_pids() { pgrep -P "$(mpirun_pid)"; }
wait_for() {  # pattern, file, seconds: poll until the file has a line matching the pattern
    local t
    for ((t = 0; t < $3 * 10; t++)); do
        grep -q "$1" "$2" 2> /dev/null && return 0
        sleep 0.1
    done
    return 1
}
# catches_usr1 PID: the process has its SIGUSR1 handler (signal 10: bit 9 of SigCgt in /proc). A
# rank that has not reached main() yet dies of any signal, handler or not.
catches_usr1() { local mask; mask=$(sed -n 's/^SigCgt:\s*//p' "/proc/$1/status" 2> /dev/null); [ -n "$mask" ] && (((0x$mask >> 9) & 1)); }
# usr1_as_ranks_start NP: once the NP ranks of the background run ($run_pid) catch SIGUSR1, send
# it to each of them; returns the run's exit status. They train one step, save it and exit 75.
usr1_as_ranks_start() {
    local t pid pids ready
    for ((t = 0; t < 500; t++)); do
        pids=$(rank_pids)
        ready=0
        for pid in $pids; do catches_usr1 "$pid" && ready=$((ready + 1)); done
        [ "$ready" = "$1" ] && break
        sleep 0.01
    done
    for pid in $(rank_pids); do kill -USR1 "$pid"; done
    wait "$run_pid"
}
# An exact resume: every rank ends with the reference's checksum, and the CSV is the same, byte for byte.
expect_exact() {  # what, output, csv, reference output, reference csv
    local ours theirs
    ours=$(checksum "$2") theirs=$(checksum "$4")
    if [ -n "$ours" ] && [ "$ours" = "$theirs" ] && [ "$(grep -c 'parameter checksum' "$2")" = "$(grep -c 'parameter checksum' "$4")" ] &&
        cmp -s "$3" "$5"; then
        pass "$1: checksum $ours on every rank and the same losses CSV ($(($(wc -l < "$3") - 1)) steps) as without a stop"
    else
        fail "$1: checksum '${ours:-none}' against '$theirs'; CSV $(cmp "$3" "$5" 2>&1 | head -1)"
        tail -n 5 "$2" | sed 's/^/    /'
    fi
}

# ---------------------------------------------------------------- references
# The uninterrupted runs, at 1 and 2 ranks; and step 10, whose steps step 13 takes.
step13 2 --snapshot="$tmp/ref2.h5" --losses="$tmp/ref2.csv" --save="$tmp/ref2_weights.h5" > "$tmp/ref2.out" 2>&1
status=$?
expect "step 13 on 2 ranks, $EPOCHS epochs, exits 0 and says it starts from scratch (exit $status)" \
    test $status = 0 -a -n "$(grep "No snapshot at $tmp/ref2.h5: training from the start" "$tmp/ref2.out")"
expect "step 13 saves a snapshot after every epoch (--save_every 1), from rank 0, and reports its cost ($(grep -o 'Snapshots: .*' "$tmp/ref2.out"))" \
    test "$(grep -c "^Epoch [0-9]* | Training snapshot saved at $tmp/ref2.h5 (" "$tmp/ref2.out")" = $EPOCHS \
    -a -n "$(grep "^Snapshots: $EPOCHS written" "$tmp/ref2.out")"
mpi 2 day2/10_mnist_ddp_multinode --data="$DATA" --epochs=$EPOCHS --plot= --losses="$tmp/ref10.csv" > "$tmp/ref10.out" 2>&1
expect_exact "step 13 without a failure takes step 10's steps" "$tmp/ref2.out" "$tmp/ref2.csv" "$tmp/ref10.out" "$tmp/ref10.csv"
step13 1 --snapshot="$tmp/ref1.h5" --losses="$tmp/ref1.csv" > "$tmp/ref1.out" 2>&1
expect "step 13 on 1 rank exits 0 with $EPOCHS snapshots" \
    test $? = 0 -a "$(grep -c '| Training snapshot saved' "$tmp/ref1.out")" = $EPOCHS

# ---------------------------------------------------------------- a kill, then the same command again
# --fail_at_epoch 2: the last rank dies by SIGKILL in the middle of epoch 2, after the snapshot of epoch 1.
for np in $(if_thorough 1) 2; do
    flags=(--snapshot="$tmp/fail$np.h5" --losses="$tmp/fail$np.csv" --fail_at_epoch=2)
    step13 $np "${flags[@]}" > "$tmp/fail$np.out" 2>&1
    status=$?
    expect "--fail_at_epoch 2 on $np rank(s): rank $((np - 1)) dies by SIGKILL in epoch 2 (exit $status), and the CSV is not written" \
        test $status = 137 -a -n "$(grep "\[rank $((np - 1))\] --fail_at_epoch 2: this rank dies now, in step [0-9]* of epoch 2 (SIGKILL)" "$tmp/fail$np.out")" \
        -a ! -e "$tmp/fail$np.csv" -a -z "$(grep 'Epoch 2 |' "$tmp/fail$np.out")"
    step13 $np "${flags[@]}" > "$tmp/fail$np.resumed.out" 2>&1
    status=$?
    expect "the same command again on $np rank(s) exits 0: 'Resuming training from snapshot at Epoch 1', and no second failure (exit $status)" \
        test $status = 0 -a -n "$(grep -x 'Resuming training from snapshot at Epoch 1' "$tmp/fail$np.resumed.out")" \
        -a -z "$(grep 'dies now' "$tmp/fail$np.resumed.out")"
    expect_exact "killed in epoch 2 and resumed, $np rank(s)" "$tmp/fail$np.resumed.out" "$tmp/fail$np.csv" "$tmp/ref$np.out" "$tmp/ref$np.csv"
done

restarts=(slurm/run_with_restarts.sh --max-restarts=2 --)
if thorough; then  # make test-all: the kills from outside and the stop signals
# A kill from outside, as a node's death: SIGKILL to one rank's process while it trains epoch 2.
step13_background "$tmp/kill.out" 2 --snapshot="$tmp/kill.h5" --losses="$tmp/kill.csv"
if wait_for '^Epoch 1 | Training snapshot saved' "$tmp/kill.out" 60 && victim=$(rank_pids | tail -1) && [ -n "$victim" ]; then
    kill -KILL "$victim"
    wait "$run_pid"
    status=$?
    expect "SIGKILL to rank process $victim during epoch 2: the job ends (exit $status)" test $status != 0 -a $status != 124
    step13 2 --snapshot="$tmp/kill.h5" --losses="$tmp/kill.csv" > "$tmp/kill.resumed.out" 2>&1
    expect "after the outside kill, the same command resumes ($(grep -o 'Resuming.*' "$tmp/kill.resumed.out"))" \
        test $? = 0 -a -n "$(grep 'Resuming training from snapshot at Epoch [12]' "$tmp/kill.resumed.out")"
    expect_exact "killed from outside and resumed, 2 ranks" "$tmp/kill.resumed.out" "$tmp/kill.csv" "$tmp/ref2.out" "$tmp/ref2.csv"
else
    fail "the background run never reached its first snapshot: $(tail -3 "$tmp/kill.out")"
fi

# ---------------------------------------------------------------- stop signals: save, exit 75, resume mid-epoch
# The signal comes about 0.2 s after the first snapshot (the poll, then 0.1 s): over 3 epochs of 0.1 s
# a quiet machine finished first (exit 0, CI on a 2-core Xeon); over 10 it stops mid-run.
STOP_EPOCHS=10
step13 2 --total_epochs=$STOP_EPOCHS --snapshot="$tmp/ref10.h5" --losses="$tmp/ref10.csv" > "$tmp/ref10.out" 2>&1
stop_and_resume() {  # label, name, how to deliver the signal (a function of the run)
    local label=$1 name=$2 deliver=$3
    step13_background "$tmp/$name.out" 2 --total_epochs=$STOP_EPOCHS --snapshot="$tmp/$name.h5" --losses="$tmp/$name.csv"
    if ! wait_for '^Epoch 1 | Training snapshot saved' "$tmp/$name.out" 60; then
        fail "$label: the run never reached its first snapshot: $(tail -3 "$tmp/$name.out")"
        return
    fi
    sleep 0.1
    $deliver
    wait "$run_pid"
    local status=$? line
    # Mid-epoch as a rule; but where the machine is slow to pass the signal on,
    # the agreed stop can fall on an epoch's last step: then the snapshot is the
    # epoch's own. Either way: exit 75, a snapshot, and an exact resume.
    line=$(grep -o '^Step [0-9]* of epoch [0-9]* | Training snapshot saved.*' "$tmp/$name.out")
    local resumed_at='Resuming training from snapshot at Epoch [0-9]*, [0-9]* of epoch [0-9]*.s 60000 samples done'
    if [ -z "$line" ]; then
        line=$(grep -o '^Epoch [0-9]* | Training snapshot saved.*' "$tmp/$name.out" | tail -1)
        [ -n "$line" ] && line="at an epoch's end: $line"
        resumed_at='Resuming training from snapshot at Epoch [0-9]*'
    fi
    expect "$label: the ranks save at the end of one step and exit 75 (exit $status; ${line:-no snapshot})" \
        test $status = 75 -a -n "$line" -a -n "$(grep 'Stopped by SIG[A-Z0-9]*.*exiting with status 75' "$tmp/$name.out")"
    step13 2 --total_epochs=$STOP_EPOCHS --snapshot="$tmp/$name.h5" --losses="$tmp/$name.csv" > "$tmp/$name.resumed.out" 2>&1
    status=$?
    expect "$label: the same command resumes where it stopped (exit $status: $(grep -o 'Resuming.*' "$tmp/$name.resumed.out"))" \
        test $status = 0 -a -n "$(grep "$resumed_at" "$tmp/$name.resumed.out")"
    expect_exact "$label, then resumed" "$tmp/$name.resumed.out" "$tmp/$name.csv" "$tmp/ref10.out" "$tmp/ref10.csv"
}
usr1_to_mpirun() { kill -USR1 "$(mpirun_pid)"; }  # mpirun passes it on to every rank
term_to_ranks() { local pid; for pid in $(rank_pids); do kill -TERM "$pid"; done; }  # what Slurm does at the time limit
stop_and_resume "SIGUSR1 to mpirun" usr1 usr1_to_mpirun
stop_and_resume "SIGTERM to both ranks" term term_to_ranks

# A stop as soon as the ranks exist (in MPI_Init, or loading the data): no rank dies of the
# signal; they train one step, save it and exit 75.
step13_background "$tmp/early.out" 2 --snapshot="$tmp/early.h5"
usr1_as_ranks_start 2
status=$?
expect "SIGUSR1 as the ranks start: exit 75 after the first step, not death by the signal (exit $status: $(grep -o 'Stopped by.*samples' "$tmp/early.out"))" \
    test $status = 75 -a -n "$(grep 'Stopped by SIGUSR1 after 0 of [0-9]* epochs and 12800 samples' "$tmp/early.out")"

# ---------------------------------------------------------------- slurm/run_with_restarts.sh
RUN_TIMEOUT=300 run "${restarts[@]}" $MPIRUN -np 2 day3/13_fault_tolerant_ddp --data="$DATA" --total_epochs=$EPOCHS --plot= \
    --snapshot="$tmp/restart.h5" --losses="$tmp/restart.csv" --fail_at_epoch=2 > "$tmp/restart.out" 2>&1
status=$?
expect "run_with_restarts.sh --max-restarts=2: attempt 1 dies (SIGKILL), attempt 2 resumes and succeeds (exit $status)" \
    test $status = 0 -a -n "$(grep 'run_with_restarts: attempt 1 ended with status 137 (SIGKILL): restarting (2 restart(s) left)' "$tmp/restart.out")" \
    -a -n "$(grep 'run_with_restarts: attempt 2 of 3 succeeded' "$tmp/restart.out")" \
    -a "$(grep -c 'dies now' "$tmp/restart.out")" = 1 -a -n "$(grep -x 'Resuming training from snapshot at Epoch 1' "$tmp/restart.out")"
sed -n '/attempt 2 of 3:/,$p' "$tmp/restart.out" > "$tmp/restart.last.out"
expect_exact "the injected failure under run_with_restarts.sh" "$tmp/restart.last.out" "$tmp/restart.csv" "$tmp/ref2.out" "$tmp/ref2.csv"
fi  # thorough

RUN_TIMEOUT=60 run slurm/run_with_restarts.sh --max-restarts 1 -- sh -c 'kill -KILL $$' > "$tmp/out" 2>&1
status=$?
expect "run_with_restarts.sh: a command that always dies runs 2 times, then exits with its status (exit $status)" \
    test $status = 137 -a "$(grep -c 'attempt [12] of 2:' "$tmp/out")" = 2 \
    -a -n "$(grep 'attempt 2 ended with status 137 (SIGKILL): no restarts left (--max-restarts 1)' "$tmp/out")"
# The final statuses: a usage error (2) and "stopped by a signal, snapshot saved" (75) are not restarted.
RUN_TIMEOUT=60 run "${restarts[@]}" $MPIRUN -np 2 day3/13_fault_tolerant_ddp --epochs 3 > "$tmp/out" 2>&1
status=$?
expect "run_with_restarts.sh: step 13's usage error (--epochs) runs once, exit 2 ($(grep 'not restarting' "$tmp/out"))" \
    test $status = 2 -a "$(grep -c 'attempt [0-9]* of 3:' "$tmp/out")" = 1 \
    -a -n "$(grep -E '^run_with_restarts: .*day3/13_fault_tolerant_ddp --epochs 3 exited with status 2 \(a usage error\): not restarting$' "$tmp/out")"
RUN_TIMEOUT=60 run "${restarts[@]}" sh -c 'exit 75' > "$tmp/out" 2>&1
status=$?
expect "run_with_restarts.sh: status 75 (stopped, snapshot saved) runs once, exit 75 ($(grep 'not restarting' "$tmp/out"))" \
    test $status = 75 -a "$(grep -c 'attempt [0-9]* of 3:' "$tmp/out")" = 1 \
    -a -n "$(grep -xF 'run_with_restarts: sh -c exit\ 75 exited with status 75 (stopped by a signal, snapshot saved): not restarting' "$tmp/out")"
RUN_TIMEOUT=60 run "${restarts[@]}" sh -c 'exit 3' > "$tmp/out" 2>&1
expect "run_with_restarts.sh: any other status (3) is still restarted" \
    test $? = 3 -a "$(grep -c 'attempt [0-9]* of 3:' "$tmp/out")" = 3
RUN_TIMEOUT=60 run slurm/run_with_restarts.sh --max-restarts 3 -- true > "$tmp/out" 2>&1
expect "run_with_restarts.sh: a command that succeeds runs once" \
    test $? = 0 -a "$(grep -c 'attempt' "$tmp/out")" = 2
RUN_TIMEOUT=60 run slurm/run_with_restarts.sh --max-restarts=x -- true > "$tmp/out" 2>&1
status=$?
expect "run_with_restarts.sh --max-restarts=x: usage error, exit 2 ($(head -1 "$tmp/out"))" \
    test $status = 2 -a -n "$(grep "error: --max-restarts expects an integer >= 0, got 'x'" "$tmp/out")"
# ---------------------------------------------------------------- elastic: --min_ranks, a lost rank
# Step 19 on the 4 slots of a hosts file under run_with_restarts.sh --min_ranks 2. After its
# checkpoint of step 10 the test does what a lost machine would: its 2 slots leave the hosts file,
# and one rank dies by SIGKILL. Attempt 2 counts 2 ranks and resumes on them with --on_resize
# keep_batch (--accum_steps 2): the uninterrupted 4-rank run's losses, within 1e-5.
if [ -x day5/19_gpt ] && [ -f data/shakespeare/input.txt ]; then
    gpt=(day5/19_gpt --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --max_iters 60 --lr_decay_iters 60 --eval_interval 30
         --eval_iters 2 --sample 0 --plot '' --threads 1)
    mpi 4 "${gpt[@]}" --losses "$tmp/gpt4.csv" > "$tmp/gpt4.out" 2>&1
    printf 'localhost slots=4\n' > "$tmp/hosts"
    timeout -k 5 300 slurm/run_with_restarts.sh --max-restarts=2 --min_ranks=2 --hostfile "$tmp/hosts" -- $MPIRUN --hostfile "$tmp/hosts" \
        "${gpt[@]}" --checkpoint "$tmp/ckel" --save_every 5 --on_resize keep_batch --losses "$tmp/elastic.csv" > "$tmp/elastic.out" 2>&1 &
    run_pid=$!
    background+=("$run_pid")
    victim=""
    if wait_for '^Checkpoint of step 10 ' "$tmp/elastic.out" 120; then
        printf 'localhost slots=2\n' > "$tmp/hosts"
        launcher=$(pgrep -P "$(pgrep -P "$run_pid" | head -1)" | head -1)  # timeout, the script, mpirun
        victim=$(pgrep -P "${launcher:-0}" | tail -1)
        [ -n "$victim" ] && kill -KILL "$victim"
    fi
    wait "$run_pid"
    status=$?
    expect "run_with_restarts.sh --min_ranks 2: rank pid ${victim:-none} of 4 killed after step 10's checkpoint, 2 slots left in the hosts file; attempt 2 runs on 2 ranks, resumes and succeeds (exit $status)" \
        test -n "$victim" -a $status = 0 -a -n "$(grep "^run_with_restarts: attempt 1 of 3 on 4 rank(s) (--hostfile $tmp/hosts: localhost:4)" "$tmp/elastic.out")" \
        -a -n "$(grep '^run_with_restarts: attempt 1 ended with .*: restarting' "$tmp/elastic.out")" \
        -a -n "$(grep "^run_with_restarts: attempt 2 of 3 on 2 rank(s) (--hostfile $tmp/hosts: localhost:2)" "$tmp/elastic.out")" \
        -a -n "$(grep '^Resumed from .*, saved by DDP on 4 ranks: step 1[05],' "$tmp/elastic.out")" \
        -a -n "$(grep -- '--on_resize keep_batch: .*as 12 per rank x 2 micro-steps x 2 ranks (--accum_steps 2, was 1)' "$tmp/elastic.out")" \
        -a -n "$(grep '^run_with_restarts: attempt 2 of 3 succeeded' "$tmp/elastic.out")"
    expect_same_losses "... and takes the uninterrupted 4-rank run's steps on 2 ranks" "$tmp/gpt4.csv" "$tmp/elastic.csv" 1e-5
else
    skip "elastic restart of step 19 (needs day5/19_gpt and data/shakespeare: make shakespeare)"
fi
printf 'localhost slots=1\n' > "$tmp/hosts1"
RUN_TIMEOUT=60 run slurm/run_with_restarts.sh --min_ranks=2 --hostfile "$tmp/hosts1" -- true > "$tmp/out" 2>&1
status=$?
expect "run_with_restarts.sh --min_ranks 2 with 1 slot: one line, no attempt, exit 1 ($(cat "$tmp/out"))" \
    test $status = 1 -a "$(wc -l < "$tmp/out")" = 1 \
    -a -n "$(grep -xF "run_with_restarts: 1 rank(s) can run (--hostfile $tmp/hosts1: localhost:1), fewer than --min_ranks 2: not starting" "$tmp/out")"
RUN_TIMEOUT=60 run slurm/run_with_restarts.sh --min_ranks 2 -- true > "$tmp/out" 2>&1
status=$?
expect "run_with_restarts.sh --min_ranks outside Slurm without --hostfile: usage error, exit 2 ($(head -1 "$tmp/out"))" \
    test $status = 2 -a -n "$(grep -- 'error: --min_ranks outside a Slurm allocation needs --hostfile FILE' "$tmp/out")"

# SIGUSR1 or SIGTERM (scancel, the time limit) to the script: passed on to mpirun as SIGUSR1, which
# mpirun forwards to the ranks (a SIGTERM would make mpirun end the job, exit 1); the ranks save and
# exit 75; no restart after it.
if thorough; then  # make test-all: the stop signals through run_with_restarts.sh, rank 0 killed mid-write
for signal in USR1 TERM; do
    out=$tmp/restart_$signal.out
    # timeout itself, not lib.sh's run: $! must be timeout's pid, whose child is the script signalled below.
    timeout 300 "${restarts[@]}" $MPIRUN -np 2 day3/13_fault_tolerant_ddp --data="$DATA" --total_epochs=$EPOCHS --plot= \
        --snapshot="$tmp/restart_$signal.h5" > "$out" 2>&1 &
    run_pid=$!
    background+=("$run_pid")
    if wait_for '^Epoch 1 | Training snapshot saved' "$out" 60; then
        kill -$signal "$(pgrep -P "$run_pid" -f run_with_restarts | head -1)"
        wait "$run_pid"
        status=$?
        # The saving step is mid-epoch as a rule, an epoch's last where the signal is slow (see stop_and_resume).
        expect "SIG$signal to run_with_restarts.sh: passed on, the ranks save and exit 75, no restart (exit $status)" \
            test $status = 75 -a -n "$(grep "attempt 1 ended with status 75 after SIG$signal: no restart" "$out")" \
            -a -z "$(grep 'attempt 2' "$out")" -a -n "$(grep -E '^(Step [0-9]+ of epoch|Epoch) [0-9]+ \| Training snapshot saved' "$out")" \
            -a -n "$(grep 'Stopped by SIGUSR1 after' "$out")"
    else
        fail "run_with_restarts.sh with SIG$signal: the run never reached its first snapshot"
    fi
done

# ---------------------------------------------------------------- rank 0 killed while it writes
# strace holds rank 0's second rename (the snapshot of epoch 2 is written and
# synced as FILE.tmp, but not yet in place) for 60 s; rank 0 is killed there.
if ! command -v strace > /dev/null; then
    skip "rank 0 killed during a snapshot write (needs strace: apt-get install strace)"
elif ! strace -qq -o /dev/null true 2> /dev/null; then
    skip "rank 0 killed during a snapshot write (strace cannot trace here: $(strace -qq -o /dev/null true 2>&1 | head -1))"
else
    cat > "$tmp/rank0_under_strace.sh" << 'SH'
# Rank 0 runs under strace, which holds its second rename for 60 s; the other ranks run as they are.
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
    exec strace -qq -o /dev/null -e trace=rename,renameat,renameat2 \
        -e inject=rename,renameat,renameat2:delay_enter=60000000:when=2 "$@"
fi
exec "$@"
SH
    timeout -k 5 "$RUN_TIMEOUT" $MPIRUN -np 2 bash "$tmp/rank0_under_strace.sh" day3/13_fault_tolerant_ddp --data="$DATA" \
        --total_epochs=$EPOCHS --plot= --snapshot="$tmp/torn.h5" --losses="$tmp/torn.csv" > "$tmp/torn.out" 2>&1 &
    run_pid=$!
    background+=("$run_pid")
    if wait_for '^epoch 2/' "$tmp/torn.out" 60 && sleep 1 && [ -e "$tmp/torn.h5.tmp" ] &&
        strace_pid=$(pgrep -P "$(mpirun_pid)" -x strace) && victim=$(pgrep -P "$strace_pid") && [ -n "$victim" ]; then
        kill -KILL "$victim"
        kill -KILL "$strace_pid"  # after its tracee (strace would let go of it): it waits out its delay otherwise
        wait "$run_pid"
        status=$?
        expect "rank 0 killed between writing the epoch 2 snapshot and its rename (exit $status): FILE.tmp is left, epoch 2's snapshot never replaced epoch 1's" \
            test $status != 0 -a $status != 124 -a -e "$tmp/torn.h5.tmp" -a -z "$(grep 'Epoch 2 |' "$tmp/torn.out")"
        step13 2 --snapshot="$tmp/torn.h5" --losses="$tmp/torn.csv" > "$tmp/torn.resumed.out" 2>&1
        status=$?
        expect "the previous snapshot is whole: the run resumes from Epoch 1 and removes the unfinished FILE.tmp (exit $status)" \
            test $status = 0 -a -n "$(grep -x 'Resuming training from snapshot at Epoch 1' "$tmp/torn.resumed.out")" \
            -a -n "$(grep "torn.h5.tmp: removing an unfinished snapshot" "$tmp/torn.resumed.out")" -a ! -e "$tmp/torn.h5.tmp"
        expect_exact "rank 0 killed mid-write, resumed" "$tmp/torn.resumed.out" "$tmp/torn.csv" "$tmp/ref2.out" "$tmp/ref2.csv"
    else
        fail "rank 0 under strace: never caught in its second snapshot write: $(tail -3 "$tmp/torn.out")"
    fi
fi
fi  # thorough

# ---------------------------------------------------------------- bad snapshots: one line, exit 1, every rank, no hang
expect_refused() {  # what, message pattern, snapshot, extra flags...
    local what=$1 pattern=$2 snapshot=$3
    shift 3
    step13 2 --snapshot="$snapshot" "$@" > "$tmp/err" 2>&1
    local status=$? line
    line=$(grep -E "$pattern" "$tmp/err")
    if [ $status = 1 ] && [ -n "$line" ] && [ "$(grep -c '^\[rank' "$tmp/err")" = 1 ] && ! grep -qiE 'segmentation|core dumped' "$tmp/err" &&
        ! grep -q 'Resuming' "$tmp/err"; then
        pass "$what: exit 1, one line: $line"
    else
        fail "$what: expected exit 1 and one line /$pattern/ (got exit $status:" "$(grep -v '^Step 13' "$tmp/err" | head -3))"
    fi
}
good=$tmp/ref2.h5  # the snapshot of a finished run: 3 epochs done
head -c 600000 "$good" > "$tmp/truncated.h5"
expect_refused "a truncated snapshot" "truncated.h5: not a readable HDF5 file \(600000 bytes\): truncated or corrupt" "$tmp/truncated.h5"
: > "$tmp/empty.h5"
expect_refused "an empty snapshot" "empty.h5: the file is empty, not a snapshot" "$tmp/empty.h5"
echo "not hdf5" > "$tmp/text.h5"
expect_refused "a text file as snapshot" "text.h5: not a readable HDF5 file" "$tmp/text.h5"
mkdir "$tmp/folder.h5"
expect_refused "a folder as snapshot" "folder.h5: is a directory$" "$tmp/folder.h5"
mkfifo "$tmp/fifo.h5"  # opening it would wait for a writer: it must be refused, not opened
expect_refused "a FIFO as snapshot" "fifo.h5: is not a regular file \\(a FIFO" "$tmp/fifo.h5"
expect_refused "a weights file (--save) as snapshot" "ref2_weights.h5: not a training snapshot .*--init takes those" "$tmp/ref2_weights.h5"
expect_refused "a snapshot of another run's flags (--batch_size 3200)" \
    "ref2.h5: made with --batch_size 6400, this run has --batch_size 3200" "$good" --batch_size=3200
expect_refused "a snapshot of another run's flags (--seed 1)" "ref2.h5: made with --seed 0, this run has --seed 1" "$good" --seed=1
# Seen by one rank only (each rank its own --snapshot: mpirun's MPMD syntax), then two different files.
cp "$good" "$tmp/seen.h5"
timeout -k 5 "$RUN_TIMEOUT" $MPIRUN -np 1 day3/13_fault_tolerant_ddp --data="$DATA" --plot= --snapshot="$tmp/seen.h5" : \
    -np 1 day3/13_fault_tolerant_ddp --data="$DATA" --plot= --snapshot="$tmp/unseen.h5" > "$tmp/err" 2>&1
status=$?
expect "a snapshot that rank 1 does not see: exit 1, one line ($(grep '^\[rank' "$tmp/err"))" \
    test $status = 1 -a "$(grep -c '^\[rank' "$tmp/err")" = 1 -a -n "$(grep '^\[rank 1 @ .*unseen.h5: 1 of 2 ranks see this snapshot, this rank does not' "$tmp/err")"
timeout -k 5 "$RUN_TIMEOUT" $MPIRUN -np 1 day3/13_fault_tolerant_ddp --data="$DATA" --plot= --snapshot="$tmp/seen.h5" : \
    -np 1 day3/13_fault_tolerant_ddp --data="$DATA" --plot= --snapshot="$tmp/ref1.h5" > "$tmp/err" 2>&1
status=$?
expect "two ranks that read different snapshots: exit 1, one line ($(grep '^\[rank' "$tmp/err"))" \
    test $status = 1 -a "$(grep -c '^\[rank' "$tmp/err")" = 1 -a -n "$(grep 'the ranks read different snapshots' "$tmp/err")"
# A write that fails: FILE.tmp is a folder, so rank 0 cannot create it.
mkdir -p "$tmp/blocked.h5.tmp"
expect_refused "a snapshot that cannot be written" "blocked.h5: cannot create .*blocked.h5.tmp" "$tmp/blocked.h5"
expect "a failed write leaves no snapshot behind" test ! -e "$tmp/blocked.h5"

if have_h5py; then
    "$PYTHON" - "$good" "$tmp" << 'PY'
import h5py, numpy as np, shutil, sys
good, tmp = sys.argv[1:3]
def variant(name, change):
    shutil.copy(good, f"{tmp}/{name}.h5")
    with h5py.File(f"{tmp}/{name}.h5", "a") as f:
        change(f)
def flip(name):  # one bit in the middle of fc.0.weight's data
    shutil.copy(good, f"{tmp}/{name}.h5")
    with h5py.File(good, "r") as f:
        offset = f["fc.0.weight"].id.get_offset() + 4 * 50000
    with open(f"{tmp}/{name}.h5", "r+b") as f:
        f.seek(offset); byte = f.read(1); f.seek(offset); f.write(bytes([byte[0] ^ 0x10]))
def replace(f, name, value):
    del f[name]; f[name] = value
flip("flipped")
variant("missing", lambda f: f.__delitem__("optimizer/exp_avg_sq/fc.0.bias"))
variant("other_model", lambda f: replace(f, "settings/model_sizes", np.array([784, 256, 10], np.int64)))
variant("wrong_shape", lambda f: replace(f, "fc.0.weight", np.zeros((128, 785), np.float32)))
PY
    expect_refused "a snapshot with one flipped bit" "flipped.h5: checksum mismatch .*: the file is corrupt" "$tmp/flipped.h5"
    expect_refused "a snapshot with a missing field" "missing.h5: no 'optimizer/exp_avg_sq/fc.0.bias': an incomplete snapshot" "$tmp/missing.h5"
    expect_refused "a snapshot of another model" "other_model.h5: a snapshot of an MLP 784-256-10; this run builds an MLP 784-128-10" "$tmp/other_model.h5"
    expect_refused "a snapshot with a wrongly shaped parameter" \
        "wrong_shape.h5: 'fc.0.weight' is float32 \[128, 785\] \(expected float32 \[128, 784\]\)" "$tmp/wrong_shape.h5"
else
    no_h5py "flipped-bit, incomplete and wrongly shaped snapshots"
fi

# ---------------------------------------------------------------- another world size
cp "$tmp/fail2.h5" "$tmp/elastic.h5"  # 3 epochs done on 2 ranks
step13 1 --snapshot="$tmp/elastic.h5" --total_epochs=4 > "$tmp/elastic.out" 2>&1
status=$?
expect "a snapshot from 2 ranks resumes on 1 and says the data order now differs (exit $status)" \
    test $status = 0 -a -n "$(grep -x 'Resuming training from snapshot at Epoch 3' "$tmp/elastic.out")" \
    -a -n "$(grep 'The snapshot was made on 2 ranks, this run has 1: the data order now differs from an uninterrupted run' "$tmp/elastic.out")" \
    -a -n "$(grep '^epoch 4/4: mean loss' "$tmp/elastic.out")"
step13 2 --snapshot="$tmp/ref2.h5" > "$tmp/done.out" 2>&1
expect "a finished run's snapshot: the same command trains nothing and reports the same weights" \
    test $? = 0 -a -n "$(grep "Nothing left to train: $EPOCHS of --total_epochs $EPOCHS done" "$tmp/done.out")" \
    -a "$(checksum "$tmp/done.out")" = "$(checksum "$tmp/ref2.out")"

# ---------------------------------------------------------------- the sharded form: --checkpoint DIR
# The same saves as the snapshot's (after every epoch, --save_every counting epochs), each rank
# writing its 1/W of every tensor and of Adam's moments: the snapshot's steps, bit for bit.
ckpt_lines() { grep -c "^Checkpoint of step [0-9]* saved in $2/step-[0-9]*: 0.62 to 0.62 MB per rank" "$1"; }
step13 2 --checkpoint="$tmp/ck" --losses="$tmp/ck.csv" > "$tmp/ck.out" 2>&1
status=$?
expect "--checkpoint on 2 ranks: exit $status, 'No checkpoint in DIR', $(ckpt_lines "$tmp/ck.out" "$tmp/ck") saves of 0.62 MB per rank (half the model and Adam each), no snapshot line or file" \
    test $status = 0 -a -n "$(grep "^No checkpoint in $tmp/ck: training from the start" "$tmp/ck.out")" \
    -a "$(ckpt_lines "$tmp/ck.out" "$tmp/ck")" = $EPOCHS -a -z "$(grep -i 'snapshot' "$tmp/ck.out" | grep -v '^Step 13')"
expect "... the folder: current names step-000015, --keep 2 kept steps 10 and 15, each an index and a shard per rank" \
    test "$(cat "$tmp/ck/current")" = step-000015 -a "$(cd "$tmp/ck" && ls -d step-* | paste -sd ' ')" = "step-000010 step-000015" \
    -a "$(ls "$tmp/ck/step-000015" | paste -sd ' ')" = "index.h5 shard-00000.h5 shard-00001.h5"
expect_exact "--checkpoint takes the snapshot run's steps" "$tmp/ck.out" "$tmp/ck.csv" "$tmp/ref2.out" "$tmp/ref2.csv"

# A rank killed by SIGKILL in epoch 2, after the checkpoint of epoch 1; the same command resumes it.
flags=(--checkpoint="$tmp/ckfail" --losses="$tmp/ckfail.csv" --fail_at_epoch=2)
step13 2 "${flags[@]}" > "$tmp/ckfail.out" 2>&1
status=$?
expect "--checkpoint, --fail_at_epoch 2: rank 1 dies by SIGKILL in epoch 2 (exit $status), step 5 (epoch 1) current" \
    test $status = 137 -a "$(cat "$tmp/ckfail/current" 2> /dev/null)" = step-000005 -a ! -e "$tmp/ckfail.csv"
step13 2 "${flags[@]}" > "$tmp/ckfail.resumed.out" 2>&1
status=$?
expect "... the same command resumes (exit $status): $(grep -o '^Resumed from.*samples done' "$tmp/ckfail.resumed.out" | sed "s|$tmp/||")" \
    test $status = 0 -a -n "$(grep "^Resumed from $tmp/ckfail/step-000005, saved by DDP on 2 ranks: step 5, epoch 2, 0 of its 60000 samples done; " "$tmp/ckfail.resumed.out")"
expect_exact "--checkpoint: killed in epoch 2 and resumed" "$tmp/ckfail.resumed.out" "$tmp/ckfail.csv" "$tmp/ref2.out" "$tmp/ref2.csv"

# Stopped mid-epoch: SIGUSR1 as the ranks start; they train one step (12800 samples), save it, exit 75.
step13_background "$tmp/ckstop.out" 2 --checkpoint="$tmp/ckstop" --losses="$tmp/ckstop.csv"
usr1_as_ranks_start 2
status=$?
expect "--checkpoint, SIGUSR1: the ranks save step 1, mid-epoch, and exit 75 (exit $status: $(grep -o 'Stopped by.*samples' "$tmp/ckstop.out"))" \
    test $status = 75 -a -n "$(grep "^Checkpoint of step 1 saved in $tmp/ckstop/step-000001" "$tmp/ckstop.out")" \
    -a -n "$(grep "Stopped by SIGUSR1 after 0 of $EPOCHS epochs and 12800 samples: exiting with status 75; the same command resumes from $tmp/ckstop$" "$tmp/ckstop.out")"
for np in 1 4; do cp -r "$tmp/ckstop" "$tmp/ckstop$np"; cp "$tmp/ckstop.csv" "$tmp/ckstop$np.csv" 2> /dev/null; done
step13 2 --checkpoint="$tmp/ckstop" --losses="$tmp/ckstop.csv" > "$tmp/ckstop.resumed.out" 2>&1
status=$?
expect "... resumed on 2 ranks (exit $status) at its data position: step 1, epoch 1, 12800 of its 60000 samples done" \
    test $status = 0 -a -n "$(grep "^Resumed from $tmp/ckstop/step-000001, saved by DDP on 2 ranks: step 1, epoch 1, 12800 of its 60000 samples done; " "$tmp/ckstop.resumed.out")"
expect_exact "--checkpoint: stopped mid-epoch and resumed" "$tmp/ckstop.resumed.out" "$tmp/ckstop.csv" "$tmp/ref2.out" "$tmp/ref2.csv"
# The same checkpoint on 1 and on 4 ranks: the rest of epoch 1 (47200 samples) split among them,
# another global batch and learning rate (so other steps, and said); the saved step's loss kept. Steps: 1 + 8 + 10 + 10
# on 1 rank (batches of 6400), 1 + 2 + 3 + 3 on 4 (11800 and 15000 samples a rank).
for np_steps in "1 9 29" "4 3 9"; do
    set -- $np_steps
    np=$1 first=$2 total=$3
    step13 $np --checkpoint="$tmp/ckstop$np" --losses="$tmp/ckstop$np.csv" > "$tmp/ckstop$np.out" 2>&1
    status=$?
    global=$((6400 * np))
    expect "the mid-epoch checkpoint of 2 ranks resumed on $np (exit $status): resharded, lr x $np and a global batch of $global (said), epoch 1 ends after $first steps, $total in all, the first step's loss kept, one model on every rank" \
        test $status = 0 -a -n "$(grep "^Resumed from $tmp/ckstop$np/step-000001, saved by DDP on 2 ranks: step 1, epoch 1, 12800 of its 60000 samples done; resharded, 1.22 to 1.22 MB read per rank" "$tmp/ckstop$np.out")" \
        -a -n "$(grep "^The checkpoint was saved on 2 ranks, this run has $np: the learning rate follows the world size (lr x $np) and the global batch is $global samples (it was 12800): the steps from here are not an uninterrupted run's$" "$tmp/ckstop$np.out")" \
        -a -n "$(grep "^epoch 1/$EPOCHS: mean loss [0-9.]* over $first steps" "$tmp/ckstop$np.out")" \
        -a "$(($(wc -l < "$tmp/ckstop$np.csv") - 1))" = $total -a "$(sed -n 2p "$tmp/ckstop$np.csv")" = "$(sed -n 2p "$tmp/ref2.csv")" \
        -a "$(checksum "$tmp/ckstop$np.out" | wc -w)" = 1 -a "$(grep -c 'parameter checksum' "$tmp/ckstop$np.out")" = $np
done
# The checkpoint that the 4 ranks saved is theirs (its index names their layout), and converts to one
# state_dict file (tools/checkpoint_to_state_dict, one process).
tools/checkpoint_to_state_dict "$tmp/ckstop4" "$tmp/ckstop4.h5" > "$tmp/convert.out" 2>&1
expect "the resharded run's own checkpoint: 'DDP on 4 ranks, step 9', converted to one state_dict file (exit $?: $(sed "s|$tmp/||g" "$tmp/convert.out"))" \
    test -n "$(grep "^$tmp/ckstop4/step-000009 (day3/13_fault_tolerant_ddp, DDP on 4 ranks, step 9): 4 tensors, 101770 weights, written whole" "$tmp/convert.out")" \
    -a -s "$tmp/ckstop4.h5"

# A damaged checkpoint: one line naming the file, exit 1 on every rank, nothing trained.
ck_refused() {  # what, pattern
    step13 2 --checkpoint="$tmp/ckbad" > "$tmp/err" 2>&1
    local status=$?
    expect "--checkpoint, $1: exit $status, one line ($(grep '^\[rank' "$tmp/err" | sed "s|$tmp/||g"))" \
        test $status = 1 -a "$(grep -c '^\[rank' "$tmp/err")" = 1 -a -n "$(grep -E "$2" "$tmp/err")" -a -z "$(grep '^epoch' "$tmp/err")"
}
rm -rf "$tmp/ckbad"; cp -r "$tmp/ck" "$tmp/ckbad"; rm "$tmp/ckbad/step-000015/shard-00001.h5"
ck_refused "a missing shard" 'ckbad/step-000015/shard-00001.h5: missing'
rm -rf "$tmp/ckbad"; cp -r "$tmp/ck" "$tmp/ckbad"; truncate -s 20000 "$tmp/ckbad/step-000015/shard-00000.h5"
ck_refused "a truncated shard" 'ckbad/step-000015/shard-00000.h5: not a readable HDF5 file \(20000 bytes\): truncated'

if thorough; then  # make test-all: --async_save, SIGTERM to mpirun
    step13 2 --checkpoint="$tmp/cka" --async_save --losses="$tmp/cka.csv" > "$tmp/cka.out" 2>&1
    expect "--checkpoint --async_save: $(grep -c 'written by a thread from host copies.*the training stalled' "$tmp/cka.out") saves by a thread, each with its stall and write time" \
        test "$(grep -c "^Checkpoint of step [0-9]* saved in $tmp/cka/step-[0-9]*: .*written by a thread from host copies.*the training stalled [0-9.]* ms, the thread wrote for [0-9.]* ms" "$tmp/cka.out")" = $EPOCHS
    expect_exact "--checkpoint --async_save takes the snapshot run's steps" "$tmp/cka.out" "$tmp/cka.csv" "$tmp/ref2.out" "$tmp/ref2.csv"
    # Killed in epoch 3 while saving from a thread: epoch 2's checkpoint is current once its threads
    # are done (sharded_checkpoint_poll, after every step), else epoch 1's; either resumes exactly.
    flags=(--checkpoint="$tmp/ckak" --async_save --losses="$tmp/ckak.csv" --fail_at_epoch=3)
    step13 2 "${flags[@]}" > "$tmp/ckak.out" 2>&1
    status=$?
    step13 2 "${flags[@]}" > "$tmp/ckak.resumed.out" 2>&1
    expect "--checkpoint --async_save, killed in epoch 3 (exit $status), the same command resumes ($(grep -o '^Resumed from.*samples done' "$tmp/ckak.resumed.out" | sed "s|$tmp/||"))" \
        test $status = 137 -a -n "$(grep -E "^Resumed from $tmp/ckak/step-0000(05|10), saved by DDP on 2 ranks" "$tmp/ckak.resumed.out")"
    expect_exact "--checkpoint --async_save: killed in epoch 3 and resumed" "$tmp/ckak.resumed.out" "$tmp/ckak.csv" "$tmp/ref2.out" "$tmp/ref2.csv"
    # SIGTERM to mpirun after the first checkpoint: Open MPI passes it on to the ranks, and kills them
    # odls_base_sigkill_timeout seconds later (its default, 1 s, here; tests/run.sh sets 0): the
    # ranks save at the end of a step, mid-epoch, and exit 75 if they get there first, else the last
    # epoch's checkpoint stays current. Either way the same command takes the uninterrupted steps.
    OMPI_MCA_odls_base_sigkill_timeout=1 step13_background "$tmp/ckterm.out" 2 --total_epochs=$STOP_EPOCHS \
        --checkpoint="$tmp/ckterm" --losses="$tmp/ckterm.csv"
    if wait_for "^Checkpoint of step 5 saved in $tmp/ckterm" "$tmp/ckterm.out" 60; then
        kill -TERM "$(mpirun_pid)"
        wait "$run_pid"
        status=$?
        # (A quiet machine may finish the 10 short epochs before the signal reaches the ranks: then
        # nothing was stopped, and there is nothing to check but the resume below.)
        if grep -q 'Training completed' "$tmp/ckterm.out"; then
            skip "--checkpoint, SIGTERM to mpirun after the first save: the run had finished its steps before the signal reached its ranks (exit $status)"
        else
            expect "--checkpoint, SIGTERM to mpirun after the first save: the run ends unfinished (exit $status), $(cat "$tmp/ckterm/current") current ($(grep -o '^Stopped by SIGTERM.*samples' "$tmp/ckterm.out" || echo 'killed before the ranks saved'))" \
                test $status != 0 -a $status != 124
        fi
        step13 2 --total_epochs=$STOP_EPOCHS --checkpoint="$tmp/ckterm" --losses="$tmp/ckterm.csv" > "$tmp/ckterm.resumed.out" 2>&1
        expect "... the same command resumes ($(grep -o '^Resumed from.*samples done' "$tmp/ckterm.resumed.out" | sed "s|$tmp/||"))" \
            test $? = 0 -a -n "$(grep '^Resumed from' "$tmp/ckterm.resumed.out")"
        expect_exact "--checkpoint: SIGTERM to mpirun, then resumed" "$tmp/ckterm.resumed.out" "$tmp/ckterm.csv" "$tmp/ref10.out" "$tmp/ref10.csv"
    else
        fail "--checkpoint, SIGTERM to mpirun: the run never reached its first checkpoint: $(tail -3 "$tmp/ckterm.out")"
    fi
fi

# ---------------------------------------------------------------- usage errors
expect_usage() {  # what, pattern, ranks, flags...
    local what=$1 pattern=$2 np=$3
    shift 3
    step13 "$np" --snapshot="$tmp/usage.h5" "$@" > "$tmp/err" 2>&1
    local status=$?
    expect "$what: exit 2 ($(grep '^error' "$tmp/err"))" test $status = 2 -a -n "$(grep -E "$pattern" "$tmp/err")" -a ! -e "$tmp/usage.h5"
}
expect_usage "--fail_rank=2 on 2 ranks" "^error: --fail_rank 2: the ranks are 0 to 1" 2 --fail_rank=2
expect_usage "--fail_at_epoch=1 with --save_every=1" "^error: --fail_at_epoch 1 strikes before the first snapshot" 1 --fail_at_epoch=1
expect_usage "--fail_at_epoch past --total_epochs" "^error: --fail_at_epoch 4 is past --total_epochs 3" 1 --fail_at_epoch=4
expect_usage "--save_every=0" "^error: --save_every expects an integer from 1" 1 --save_every=0
expect_usage "--snapshot with --checkpoint" "^error: --snapshot and --checkpoint: give one" 1 --checkpoint="$tmp/usage_ck"
expect_usage "--keep without --checkpoint" "^error: --keep: only with --checkpoint DIR" 1 --keep=3
expect_usage "--epochs (step 13 takes --total_epochs)" "^error: unknown flag '--epochs': did you mean --total_epochs\? \(see --help\)$" 1 --epochs=2

# ---------------------------------------------------------------- h5py and torch read the snapshot
if ! thorough; then :  # make test-all
elif "$PYTHON" -c 'import torch, h5py' 2> /dev/null; then
    "$PYTHON" - "$good" "$tmp/ref2_weights.h5" "$tmp/ref2.csv" > "$tmp/torch.out" 2>&1 << 'PY'
# What day3/README.md shows: the model into torch, Adam's state into torch.optim.Adam.
import sys, h5py, torch, torch.nn as nn
snapshot, weights, csv = sys.argv[1:4]

class Net(nn.Module):  # the workshop's model
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    def forward(self, x):
        return self.fc(x.view(-1, 784))

model = Net()
with h5py.File(snapshot, "r") as f:
    names = [k for k, _ in model.named_parameters()]
    model.load_state_dict({k: torch.from_numpy(f[k][...]) for k in names})
    optimizer = torch.optim.Adam(model.parameters(), lr=float(f["settings/lr"][()]) * int(f["settings/world_size"][()]))
    step = int(f["optimizer/step"][()])
    optimizer.load_state_dict({
        "state": {i: {"step": torch.tensor(float(step)),
                      "exp_avg": torch.from_numpy(f["optimizer/exp_avg/" + k][...]),
                      "exp_avg_sq": torch.from_numpy(f["optimizer/exp_avg_sq/" + k][...])}
                  for i, k in enumerate(names)},
        "param_groups": optimizer.state_dict()["param_groups"]})
    epochs_done, losses = int(f["progress/epochs_done"][()]), f["losses/loss"][...]
with h5py.File(weights, "r") as f:
    same = all(torch.equal(p, torch.from_numpy(f[k][...])) for k, p in model.named_parameters())
steps_in_csv = sum(1 for _ in open(csv)) - 1
state = optimizer.state_dict()["state"]
ok = same and epochs_done == 3 and len(losses) == step == steps_in_csv and len(state) == 4 \
     and state[0]["exp_avg"].shape == (128, 784)
print(f"{'ok' if ok else 'MISMATCH'}: {epochs_done} epochs, {step} Adam steps, {len(losses)} losses "
      f"({steps_in_csv} in the CSV), weights equal to --save's: {same}")
sys.exit(0 if ok else 1)
PY
    expect "torch loads the snapshot's model (strict load_state_dict) and Adam state, as the README shows ($(tail -1 "$tmp/torch.out"))" test $? = 0
else
    skip "torch reads the snapshot (needs $PYTHON with torch and h5py: ./setup.sh --with-reference)"
fi

# ---------------------------------------------------------------- memory
# The peak RSS of one process training one epoch: from scratch, and resumed
# from a snapshot (epoch 1 of 2). Medians of 3; a second copy of the model and
# Adam's state (1.2 MB) would show. The allowance, 800 kB, is two thirds of it:
# the medians of equal runs have differed by 408 kB (malloc's arenas, pages).
if ! thorough; then :  # make test-all
elif no_peak_memory "peak memory of a resumed run" day3/13_fault_tolerant_ddp; then :
else
    step13_kb() { peak_kb day3/13_fault_tolerant_ddp --data="$DATA" --plot= "$@"; }
    fresh=() resumed=()
    for i in 1 2 3; do
        fresh+=("$(step13_kb --snapshot="$tmp/mem$i.h5" --total_epochs=1)")
        resumed+=("$(step13_kb --snapshot="$tmp/mem$i.h5" --total_epochs=2)")
    done
    median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
    fresh_kb=$(median "${fresh[@]}") resumed_kb=$(median "${resumed[@]}")
    expect "resuming takes no more memory than a fresh start: peak ${resumed_kb:-?} kB against ${fresh_kb:-?} kB (medians of 3; within 800 kB)" \
        test -n "$fresh_kb" -a -n "$resumed_kb" -a "${resumed_kb:-0}" -le $((${fresh_kb:-0} + 800))
fi
