#!/usr/bin/env bash
# Day 2 on a real Slurm cluster: two nodes, each in its own network namespace
# on this machine (tests/slurm/cluster.sh builds it: slurmctld, two slurmds,
# munge). The ranks of a job really cross a network stack between nodes.
#
# It runs, through slurm/multinode_setup_and_run.sh inside `salloc -N 2
# --ntasks-per-node=2`: step 9 (under srun --mpi=pmix and under mpirun), step
# 10, step 11 (once it is built), and submits slurm/day1.sbatch and
# slurm/day2.sbatch with sbatch; last, an elastic restart: step 19 under
# run_with_restarts.sh --min_ranks 2 loses ddpnode2 (everything on it killed)
# and finishes on ddpnode1 with the uninterrupted run's losses. One PASS/FAIL/SKIP line per check (tests/run.sh
# counts them). Where the cluster cannot run (not root, Slurm or munge not
# installed, no network namespaces) it says SKIP and exits 0; CI installs
# Slurm with ./setup.sh --with-slurm and runs it as root.
#
# Everything it starts is stopped, by pid, and everything it changes is put
# back, on every exit (a failed check, a timeout, Ctrl-C): run it twice in a
# row and the second run starts from the same clean machine.
#
# make test (TEST_LEVEL=quick) runs only the checks that need no cluster (step 9
# against Slurm's variables, multinode_setup_and_run.sh outside an allocation);
# make test-all (TEST_LEVEL=all) the cluster too.
set -u
cd "$(dirname "$0")/.." || exit 1
source tests/lib.sh
repo=$(pwd)
# Knobs of the scripts under test: theirs to read, not the caller's.
unset LAUNCHER MASTER_ADDR MASTER_PORT PROGRAM
suite slurm
scratch

# ---------------------------------------------------------------- no cluster needed
expect "slurm/day1.sbatch, day2.sbatch, day3.sbatch and run_with_restarts.sh are valid bash" \
    bash -c 'bash -n slurm/day1.sbatch && bash -n slurm/day2.sbatch && bash -n slurm/day3.sbatch && bash -n slurm/run_with_restarts.sh'

env -u SLURM_JOB_ID slurm/multinode_setup_and_run.sh day2/10_mnist_ddp_multinode --epochs 10 --plot '' > "$tmp/out" 2>&1
status=$?
expect "multinode_setup_and_run.sh outside an allocation: exit 2, the salloc to run, and the mpirun that runs the same on this machine ($(cat "$tmp/out"))" \
    test $status = 2 -a "$(wc -l < "$tmp/out")" = 1 -a -n "$(grep 'salloc --nodes 2' "$tmp/out")" \
    -a -n "$(grep -E "or run it on this one machine: mpirun --oversubscribe (--allow-run-as-root )?-np 4 day2/10_mnist_ddp_multinode --epochs 10 --plot ''\$" "$tmp/out")"

if [ -x day2/9_dist_multinode ]; then
    # Step 9's check of Slurm's numbers against MPI's, with a made-up Slurm
    # environment around one process (Open MPI itself stops a real srun
    # without PMIx before our check can run).
    SLURM_PROCID=1 SLURM_NTASKS=4 timeout 30 day2/9_dist_multinode > "$tmp/out" 2>&1
    status=$?
    expect "step 9: 4 Slurm tasks but an MPI world of 1 is an error (exit $status: $(head -1 "$tmp/out"))" \
        test $status = 1 -a -n "$(grep 'Slurm started 4 tasks but MPI sees a world of 1' "$tmp/out")"
    SLURM_PROCID=3 SLURM_NTASKS=1 timeout 30 day2/9_dist_multinode > "$tmp/out" 2>&1
    status=$?
    expect "step 9: SLURM_PROCID that is not MPI's rank is an error (exit $status: $(head -1 "$tmp/out"))" \
        test $status = 1 -a -n "$(grep 'SLURM_PROCID=3 but MPI.s rank is 0' "$tmp/out")"
    env -u SLURM_PROCID -u SLURM_JOB_ID timeout 30 day2/9_dist_multinode > "$tmp/out" 2>&1
    expect "step 9 outside Slurm says it uses MPI's view, once" \
        test "$(grep -c 'not under Slurm' "$tmp/out")" = 1 -a -n "$(grep -x 'Program complete' "$tmp/out")"
fi

# ---------------------------------------------------------------- the cluster
thorough || exit $((failures > 0))  # make test: the checks above; make test-all (TEST_LEVEL=all): the cluster too
source tests/slurm/cluster.sh
if ! reason=$(cluster_check); then
    skip "the two-node cluster: $reason"
    exit 0
fi
needs_built day2/9_dist_multinode day2/10_mnist_ddp_multinode day1/6_mnist_ddp
if ! DATA=data/mnist have_mnist; then
    fail "no MNIST in data/mnist (make data)"
    exit 1
fi

if ! cluster_lock 600; then
    fail "another run kept the test cluster for 10 minutes (lock $CLUSTER_LOCK)"
    exit 1
fi
# From here on, whatever happens, the cluster goes away with us. A signal
# becomes an exit, so that the EXIT trap runs for it too.
at_exit cluster_down
trap 'exit 130' INT TERM HUP
if ! cluster_up; then
    fail "the two-node cluster did not come up (messages above)"
    exit 1
fi
pass "two-node cluster up: $(timeout 10 sinfo -h -N -o '%N=%t' | paste -sd ' ')"

# Every job is bounded: a hang is a failure, not a stuck CI job. timeout
# signals its whole process group (salloc, the script, srun or mpirun).
allocate() {  # nodes, output file, command...
    local nodes=$1 out=$2
    shift 2
    timeout -k 10 240 salloc --nodes "$nodes" --ntasks-per-node=2 --time=10 --job-name=ddp-test "$@" > "$out" 2>&1
}
run_script() {  # nodes, output file, program, args...
    local nodes=$1 out=$2
    shift 2
    allocate "$nodes" "$out" "$repo/slurm/multinode_setup_and_run.sh" "$@"
}
show_on_failure() { [ "$1" = 0 ] || { echo "---- $2 (exit $1):"; tail -n 25 "$2" | sed 's/^/    /'; }; }

# Step 9's per-rank lines: "[rank r] running on rank r (local l, node n) with world size w, host h".
placement() { sed -n 's/.*\[rank [0-9]*\] running on rank \([0-9]*\) (local \([0-9]*\), node \([0-9]*\)) with world size \([0-9]*\), host \(.*\)$/\1 \2 \3 \4 \5/p' "$1"; }

check_step9() {  # output file, ranks, nodes, what the header says, label
    local out=$1 ranks=$2 nodes=$3 header=$4 label=$5
    local lines
    lines=$(placement "$out")
    expect "$label: $ranks ranks report, all with world size $ranks" \
        test "$(echo "$lines" | awk '{ print $1 }' | sort -u | grep -c .)" = "$ranks" \
        -a "$(echo "$lines" | awk -v w="$ranks" '$4 == w' | grep -c .)" = "$ranks"
    expect "$label: on $nodes distinct node(s): $(echo "$lines" | awk '{ print $5 "=node" $3 }' | sort -u | paste -sd ' ')" \
        test "$(echo "$lines" | awk '{ print $5 }' | sort -u | grep -c .)" = "$nodes" \
        -a "$(echo "$lines" | awk '{ print $3 }' | sort -u | grep -c .)" = "$nodes" \
        -a "$(echo "$lines" | awk '{ print $3, $5 }' | sort -u | grep -c .)" = "$nodes"
    local sum=$((ranks * (ranks + 1) / 2)) mean
    mean=$(awk -v w="$ranks" 'BEGIN { print (w + 1) / 2 }')
    expect "$label: every rank gets sum $sum, mean $mean" \
        test "$(grep -c "after allreduce: sum $sum, mean $mean\$" "$out")" = "$ranks"
    expect "$label: $header" grep -q "$header" "$out"
    expect "$label: Program complete" grep -q 'Program complete$' "$out"
}

# ---------------------------------------------------------------- step 9
run_script 2 "$tmp/9.out" day2/9_dist_multinode
status=$?
show_on_failure $status "$tmp/9.out"
expect "step 9 under salloc -N 2 --ntasks-per-node=2 exits 0" test $status = 0
expect "step 9: the script sets MASTER_ADDR to the first node ($(grep -o 'MASTER_ADDR=[^ ]* MASTER_PORT=[0-9]*' "$tmp/9.out"))" \
    grep -q "MASTER_ADDR=${CLUSTER_NODES[0]} MASTER_PORT=29500" "$tmp/9.out"
expect "step 9: launched with srun -l --mpi=pmix" grep -q 'srun -l --mpi=pmix' "$tmp/9.out"
expect "step 9: srun -l prefixes every rank's line with its task number" \
    test "$(grep -cE '^([0-9]+): \[rank \1\] running on' "$tmp/9.out")" = 4
check_step9 "$tmp/9.out" 4 2 "placement from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS) agrees with MPI" \
    "step 9 (srun)"

LAUNCHER=mpirun run_script 2 "$tmp/9m.out" day2/9_dist_multinode
status=$?
show_on_failure $status "$tmp/9m.out"
expect "step 9 under mpirun inside the allocation exits 0" test $status = 0
check_step9 "$tmp/9m.out" 4 2 "launched by mpirun inside Slurm job" "step 9 (mpirun)"

# One node: the same script, the same program.
allocate 1 "$tmp/9one.out" "$repo/slurm/multinode_setup_and_run.sh" day2/9_dist_multinode
status=$?
show_on_failure $status "$tmp/9one.out"
expect "step 9 under salloc -N 1 --ntasks-per-node=2 exits 0" test $status = 0
check_step9 "$tmp/9one.out" 2 1 "placement from Slurm" "step 9 on one node"

# ---------------------------------------------------------------- steps 10 and 11
check_training() {  # label, output file, exit status, losses CSV
    local label=$1 out=$2 status=$3 csv=$4
    show_on_failure "$status" "$out"
    expect "$label exits 0" test "$status" = 0
    expect "$label reports 4 ranks on 2 nodes ($(grep -o 'on 4 ranks ([^)]*)' "$out" | head -1))" \
        grep -q 'on 4 ranks (2 nodes' "$out"
    local checksums
    checksums=$(sed -n 's/.*\[rank [0-9]*\] parameter checksum \([0-9a-f]*\)$/\1/p' "$out")
    expect "$label ends with the same parameters on all 4 ranks ($(echo "$checksums" | sort -u | paste -sd ' '))" \
        test "$(echo "$checksums" | grep -c .)" = 4 -a "$(echo "$checksums" | sort -u | grep -c .)" = 1
    # The loss of the first step against the last (rank 0's CSV: step,epoch,loss).
    local trend
    trend=$(awk -F, 'NR == 2 { first = $3 } NR > 2 { last = $3 } END { printf "%s -> %s", first, last }' "$csv" 2> /dev/null)
    # shellcheck disable=SC2016  # awk's $3, not the shell's
    expect "$label: the loss goes down ($trend)" \
        awk -F, 'NR == 2 { first = $3 } NR > 2 { last = $3; n++ } END { exit !(n > 0 && last < first) }' "$csv"
}

run_script 2 "$tmp/10.out" day2/10_mnist_ddp_multinode --epochs 2 --losses "$tmp/10.csv" --plot ''
check_training "step 10 (2 epochs)" "$tmp/10.out" $? "$tmp/10.csv"

if [ ! -x day2/11_multinode_streaming ]; then
    skip "step 11 (not built yet)"
elif [ ! -x day2/create_mnist_h5 ]; then
    skip "step 11 (day2/create_mnist_h5 not built yet)"
elif ! timeout 120 day2/create_mnist_h5 --data data/mnist --out "$tmp/mnist.h5" > "$tmp/h5.out" 2>&1; then
    fail "create_mnist_h5 --data data/mnist --out $tmp/mnist.h5: $(tail -1 "$tmp/h5.out")"
else
    run_script 2 "$tmp/11.out" day2/11_multinode_streaming --h5 "$tmp/mnist.h5" --epochs 2 --losses "$tmp/11.csv" --plot ''
    check_training "step 11 (2 epochs, streaming from HDF5)" "$tmp/11.out" $? "$tmp/11.csv"
fi

# ---------------------------------------------------------------- step 13: a rank dies, the step restarts
# Under salloc -N 2: first an uninterrupted run; then run_with_restarts.sh around
# multinode_setup_and_run.sh (srun), with rank 3 (on the second node) killed by
# SIGKILL in epoch 2. The step is restarted, resumes from epoch 1's snapshot and
# ends with the uninterrupted run's weights and losses (the same launcher, the
# same world size: the same reduction order).
if [ ! -x day3/13_fault_tolerant_ddp ]; then
    skip "step 13 (not built yet)"
else
    step13=(day3/13_fault_tolerant_ddp --total_epochs 3 --plot '')
    run_script 2 "$tmp/13.out" "${step13[@]}" --snapshot "$tmp/13.h5" --losses "$tmp/13.csv"
    check_training "step 13 (3 epochs)" "$tmp/13.out" $? "$tmp/13.csv"
    allocate 2 "$tmp/13r.out" "$repo/slurm/run_with_restarts.sh" --max-restarts 2 -- "$repo/slurm/multinode_setup_and_run.sh" \
        "${step13[@]}" --snapshot "$tmp/13r.h5" --losses "$tmp/13r.csv" --fail_at_epoch 2 --fail_rank 3
    status=$?
    show_on_failure $status "$tmp/13r.out"
    expect "step 13 under run_with_restarts.sh: rank 3 dies on node 2 in epoch 2, attempt 2 resumes from epoch 1 and succeeds (exit $status)" \
        test $status = 0 -a -n "$(grep '^3: \[rank 3\] --fail_at_epoch 2: this rank dies now' "$tmp/13r.out")" \
        -a -n "$(grep 'run_with_restarts: attempt 1 ended with status [0-9]*.*: restarting' "$tmp/13r.out")" \
        -a -n "$(grep '^0: Resuming training from snapshot at Epoch 1$' "$tmp/13r.out")" \
        -a -n "$(grep 'run_with_restarts: attempt 2 of 3 succeeded' "$tmp/13r.out")"
    expect "step 13 restarted across nodes ends with the uninterrupted run's weights on all 4 ranks ($(checksum "$tmp/13r.out")) and losses" \
        test -n "$(checksum "$tmp/13.out")" -a "$(checksum "$tmp/13r.out")" = "$(checksum "$tmp/13.out")" \
        -a "$(grep -c 'parameter checksum' "$tmp/13r.out")" = 4 -a -n "$(cmp "$tmp/13r.csv" "$tmp/13.csv" && echo same)"
fi

# ---------------------------------------------------------------- the sbatch templates
# Submitted as they are, but for the GPU requests this cluster cannot meet:
# options on sbatch's command line win over the #SBATCH lines. (The account
# placeholder passes: this cluster keeps no accounts.)
submit() {  # output file, sbatch options and script and arguments...
    local out=$1
    shift
    timeout -k 10 240 sbatch --wait --constraint= --gpus-per-node=0 --ntasks-per-node=2 --output="$out" "$@" \
        > "$out.sbatch" 2>&1
}
submit "$tmp/day2.out" slurm/day2.sbatch --epochs 1 --plot ''
status=$?
cat "$tmp/day2.out.sbatch" >> "$tmp/day2.out" 2> /dev/null
show_on_failure $status "$tmp/day2.out"
expect "sbatch slurm/day2.sbatch --epochs 1: step 10 on 4 ranks, 2 nodes, equal parameters" \
    test $status = 0 -a -n "$(grep 'on 4 ranks (2 nodes' "$tmp/day2.out")" \
    -a "$(sed -n 's/.*parameter checksum //p' "$tmp/day2.out" | sort -u | grep -c .)" = 1

submit "$tmp/day1.out" --nodes=1 slurm/day1.sbatch --epochs 1 --plot ''
status=$?
cat "$tmp/day1.out.sbatch" >> "$tmp/day1.out" 2> /dev/null
show_on_failure $status "$tmp/day1.out"
expect "sbatch slurm/day1.sbatch --epochs 1: step 6 on 2 ranks, one node, equal parameters" \
    test $status = 0 -a "$(sed -n 's/.*parameter checksum //p' "$tmp/day1.out" | grep -c .)" = 2 \
    -a "$(sed -n 's/.*parameter checksum //p' "$tmp/day1.out" | sort -u | grep -c .)" = 1 \
    -a "$(grep -c 'on ddpnode' "$tmp/day1.out")" -ge 1

# slurm/day3.sbatch, and what --signal=B:USR1@120 does before the time limit:
# `scancel --signal=USR1 --batch` sends the batch shell the same signal now.
# Its trap passes it on; the ranks save at one step and exit 75; the script
# requeues the job, and its second run (appended to the same output) resumes
# where the first stopped and ends with the uninterrupted run's weights. Slurm holds a
# requeued job back (Reason=BeginTime); once the first run's step daemons are
# gone, the test lets it start at once.
if [ -x day3/13_fault_tolerant_ddp ]; then
    job=$(timeout 30 sbatch --parsable --constraint= --gpus-per-node=0 --ntasks-per-node=2 --output="$tmp/day3.out" \
        slurm/day3.sbatch --total_epochs 3 --plot '' --snapshot "$tmp/day3.h5" --losses "$tmp/day3.csv" 2> "$tmp/day3.sbatch")
    state="" signalled=0 released=0
    for ((t = 0; t < 2400; t++)); do  # 240 s at most
        state=$(timeout 10 scontrol show job "$job" 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
        if [ $signalled = 0 ] && grep -q '^0: Epoch 1 | Training snapshot saved' "$tmp/day3.out" 2> /dev/null; then
            timeout 10 scancel --signal=USR1 --batch "$job" && signalled=1
        fi
        if [ $signalled = 1 ] && [ $released = 0 ] && [ "$state" = PENDING ] && ! pgrep -f "slurmstepd: \[$job\." > /dev/null; then
            timeout 10 scontrol update JobId="$job" StartTime=now && released=1
        fi
        case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
        sleep 0.1
    done
    [ "$state" = COMPLETED ] || timeout 10 scancel "$job" 2> /dev/null
    show_on_failure "$([ "$state" = COMPLETED ] && echo 0 || echo 1)" "$tmp/day3.out"
    expect "sbatch slurm/day3.sbatch, SIGUSR1 to its batch shell: the ranks save and exit 75, the job requeues itself (job ${job:-?}: $state)" \
        test "$state" = COMPLETED -a -n "$(grep 'Stopped by SIGUSR1 .* exiting with status 75' "$tmp/day3.out")" \
        -a -n "$(grep "^requeueing job $job" "$tmp/day3.out")" -a -n "$(grep 'run 2 of the job' "$tmp/day3.out")"
    # Where the stop lands is the machine's timing: mid-epoch mostly, at an epoch's end on a busy
    # machine (once, in a CI rehearsal beside other work); test_fault_tolerance.sh resumes mid-epoch at
    # a step it chooses.
    expect "slurm/day3.sbatch's second run resumes ($(grep -o -m1 'Resuming training from snapshot at Epoch [0-9]*\(, [0-9]* of epoch\)*' "$tmp/day3.out")) and ends with the uninterrupted run's weights ($(checksum "$tmp/day3.out")) and losses" \
        test -n "$(grep "^0: Resuming training from snapshot at Epoch [0-9]*" "$tmp/day3.out")" \
        -a -n "$(checksum "$tmp/13.out")" -a "$(checksum "$tmp/day3.out")" = "$(checksum "$tmp/13.out")" \
        -a -n "$(cmp "$tmp/day3.csv" "$tmp/13.csv" 2> /dev/null && echo same)"
fi

# ---------------------------------------------------------------- elastic: a node dies, the job goes on
# Last, as it takes ddpnode2 away. First step 19 on 4 ranks over both nodes, uninterrupted. Then
# the same under run_with_restarts.sh --min_ranks 2 in `salloc --no-kill`: after its checkpoint of
# step 20, everything on ddpnode2 dies by SIGKILL (slurmd, slurmstepd, its two ranks), as when a
# machine fails. The script sees ddpnode2's slurmd stop answering, ends the attempt, and restarts
# on ddpnode1's 2 ranks, resuming with --on_resize keep_batch (--accum_steps 2): the uninterrupted
# run's losses within 1e-5. (slurmctld declares ddpnode2 down only after SlurmdTimeout, 300 s,
# when the job is over: --no-kill, which keeps a job whose node is declared down, is not put to
# the test here.)
if [ ! -x day5/19_gpt ] || [ ! -f data/shakespeare/input.txt ]; then
    skip "elastic restart of step 19 after a node's loss (needs day5/19_gpt and data/shakespeare: make shakespeare)"
else
    gpt=(day5/19_gpt --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --max_iters 300 --lr_decay_iters 300 --eval_interval 100
         --eval_iters 2 --sample 0 --plot '' --threads 1)
    run_script 2 "$tmp/gpt4.out" "${gpt[@]}" --losses "$tmp/gpt4.csv"
    status=$?
    show_on_failure $status "$tmp/gpt4.out"
    expect "step 19 on 4 ranks over 2 nodes, uninterrupted, exits 0" test $status = 0 -a -s "$tmp/gpt4.csv"
    : > "$tmp/elastic.out"
    allocate 2 "$tmp/elastic.out" --no-kill "$repo/slurm/run_with_restarts.sh" --max-restarts 2 --min_ranks 2 -- \
        "$repo/slurm/multinode_setup_and_run.sh" "${gpt[@]}" --checkpoint "$tmp/ckel" --save_every 10 --on_resize keep_batch \
        --losses "$tmp/elastic.csv" &
    job_pid=$!
    killed=""
    for ((t = 0; t < 1200; t++)); do  # 120 s at most
        grep -q '^0: Checkpoint of step 20 ' "$tmp/elastic.out" 2> /dev/null && break
        sleep 0.1
    done
    if grep -q '^0: Checkpoint of step 20 ' "$tmp/elastic.out"; then
        # (Its slurmd is a background job of this shell: disowned, bash does not report its death.)
        disown "$(awk '$1 == "slurmd" { n++; if (n == 2) print $2 }' "$CLUSTER_DIR/run/pids")" 2> /dev/null
        # shellcheck disable=SC2046  # one pid per word
        kill -KILL $(ip netns pids "${CLUSTER_NODES[1]}") 2> /dev/null && killed=$(date +%s.%N)
    fi
    wait "$job_pid"
    status=$?
    took=$(awk -v a="${killed:-0}" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
    node_state=$(timeout 10 scontrol show node "${CLUSTER_NODES[1]}" 2> /dev/null | grep -o 'State=[A-Z_+*]*')
    show_on_failure $status "$tmp/elastic.out"
    expect "salloc --no-kill, run_with_restarts.sh --min_ranks 2: ${CLUSTER_NODES[1]} killed after step 20's checkpoint; attempt 1 ended, attempt 2 on ${CLUSTER_NODES[0]}'s 2 ranks resumed and finished, ${took} s after the kill (exit $status; ${CLUSTER_NODES[1]} now $node_state)" \
        test -n "$killed" -a $status = 0 \
        -a -n "$(grep "^run_with_restarts: ${CLUSTER_NODES[1]} does not answer (its slurmd takes no connection): ending attempt 1$" "$tmp/elastic.out")" \
        -a -n "$(grep "^run_with_restarts: attempt 2 of 3 on 2 rank(s) (${CLUSTER_NODES[0]}; lost: ${CLUSTER_NODES[1]}): " "$tmp/elastic.out")" \
        -a -n "$(grep "^launching .*: srun -l --mpi=pmix --nodes 1 --ntasks 2 --nodelist ${CLUSTER_NODES[0]} " "$tmp/elastic.out")" \
        -a -n "$(grep '^0: Resumed from .*, saved by DDP on 4 ranks: step [0-9]*,' "$tmp/elastic.out")" \
        -a -n "$(grep -- '^0: --on_resize keep_batch: .*as 12 per rank x 2 micro-steps x 2 ranks (--accum_steps 2, was 1)' "$tmp/elastic.out")" \
        -a -n "$(grep '^run_with_restarts: attempt 2 of 3 succeeded' "$tmp/elastic.out")"
    expect_same_losses "... and took the uninterrupted 4-rank run's steps on one node" "$tmp/gpt4.csv" "$tmp/elastic.csv" 1e-5
fi
exit_status
