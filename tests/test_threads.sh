#!/usr/bin/env bash
# Threads per rank: results never depend on how many there are, --threads
# overrides the default, and the first line says what computes.
# make test (TEST_LEVEL=quick) checks step 2's thread counts; make test-all (TEST_LEVEL=all)
# also step 6's (DDP on 2 ranks) and step 11's (streaming).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite threads
scratch
# --bind-to none: otherwise mpirun binds 1 or 2 ranks to one core each, and a
# rank could not use the threads asked for.
MPI_FLAGS="--bind-to none"

# Step 2 at 1, 2 and 4 threads: the same losses and weights, bit for bit. The
# last batch of the epoch is partial (60000 = 9 x 6400 + 2400).
for threads in 1 2 4; do
    run day1/2_mnist_training --epochs 1 --threads $threads --losses "$tmp/losses$threads.csv" \
        --save "$tmp/w$threads.h5" --plot '' > "$tmp/out$threads" 2>&1
done
expect "step 2 at --threads 4 says so on its first line: $(head -1 "$tmp/out4" | grep -o 'cpu, .*')" \
    grep -q '^Step 2: .*; cpu, 4 threads, .* (.* kernels)$' "$tmp/out4"
for threads in 2 4; do
    expect "step 2 at $threads threads takes the same steps as at 1, bit for bit" cmp -s "$tmp/losses1.csv" "$tmp/losses$threads.csv"
    same_weights "step 2 at $threads threads ends with the same weights as at 1" "$tmp/w1.h5" "$tmp/w$threads.h5" 0
done

# The vector width: the same bits from the loops that common/base/cpu_dispatch.h
# compiles for AVX-512, AVX2 and SSE2 and picks between at run time (this CPU
# took one; build/one_isa/ holds step 2 built for one instruction set alone,
# on x86-64 with a gcc that knows the levels), both at 2 threads.
if [ "$(uname -m)" = x86_64 ]; then
    for isa in x86-64 x86-64-v3; do
        if [ ! -x build/one_isa/$isa/2_mnist_training ]; then
            skip "step 2 built for $isa: not built (the compiler has no -march=$isa)"
        elif [ "$isa" = x86-64-v3 ] && ! grep -qw avx2 /proc/cpuinfo; then
            skip "step 2 built for $isa: this CPU has no AVX2"
        else
            run build/one_isa/$isa/2_mnist_training --epochs 1 --threads 2 --losses "$tmp/isa.csv" \
                --save "$tmp/isa.h5" --plot '' > "$tmp/isa_out" 2>&1
            expect "step 2 with its loops built for $isa alone takes the same steps as the dispatched build, bit for bit" \
                cmp -s "$tmp/losses2.csv" "$tmp/isa.csv"
            same_weights "step 2 with its loops built for $isa alone ends with the same weights" "$tmp/w2.h5" "$tmp/isa.h5" 0
        fi
    done
fi

# DDP (step 6: buckets, the communication thread) on 2 ranks at 1 and 2
# threads per rank, and step 11 (streaming from HDF5) at 1 and 3.
if thorough; then  # make test-all
for threads in 1 2; do
    mpi 2 day1/6_mnist_ddp --epochs 1 --threads $threads --losses "$tmp/ddp$threads.csv" \
        --save "$tmp/ddp$threads.h5" --plot '' > "$tmp/ddp_out$threads" 2>&1
done
expect "step 6 on 2 ranks says 2 threads per rank: $(head -1 "$tmp/ddp_out2" | grep -o 'cpu, .*')" \
    grep -q '; cpu, 2 threads per rank, ' "$tmp/ddp_out2"
expect "step 6 on 2 ranks at 2 threads per rank takes the same steps as at 1, bit for bit" \
    cmp -s "$tmp/ddp1.csv" "$tmp/ddp2.csv"
same_weights "step 6 on 2 ranks at 2 threads per rank ends with the same weights as at 1" "$tmp/ddp1.h5" "$tmp/ddp2.h5" 0

if run day2/create_mnist_h5 --data "$DATA" --out "$tmp/mnist.h5" > /dev/null 2>&1; then
    for threads in 1 3; do
        run day2/11_multinode_streaming --h5 "$tmp/mnist.h5" --epochs 1 --threads $threads \
            --losses "$tmp/stream$threads.csv" --plot '' > /dev/null 2>&1
    done
    expect "step 11 at 3 threads takes the same steps as at 1, bit for bit" cmp -s "$tmp/stream1.csv" "$tmp/stream3.csv"
else
    fail "day2/create_mnist_h5 could not write $tmp/mnist.h5"
fi
fi  # thorough

# The default: the node's cores shared among its ranks, within the binding.
cores=$(nproc)
run day1/2_mnist_training --epochs 1 --plot '' > "$tmp/default" 2>&1
expect "step 2 alone takes the $cores cores it may use: $(head -1 "$tmp/default" | grep -o 'cpu, [^,]*')" \
    grep -q "; cpu, $cores threads\?, " "$tmp/default"
online=$(getconf _NPROCESSORS_ONLN)
share=$(( online / 4 < cores ? online / 4 : cores )); [ "$share" -ge 1 ] || share=1
mpi 4 day1/7_mnist_ddp_timing --epochs 1 --plot '' > "$tmp/four" 2>&1
expect "4 ranks on $cores cores take $share thread(s) each: $(head -1 "$tmp/four" | grep -o 'cpu, [^,]*')" \
    grep -q "; cpu, $share threads\? per rank, " "$tmp/four"
if [ "$cores" -ge 2 ]; then
    run $MPIRUN --bind-to core -np 1 day1/2_mnist_training --epochs 1 --plot '' > "$tmp/bound" 2>&1
    expect "a rank bound to one core takes one thread and says why: $(head -1 "$tmp/bound" | grep -o 'cpu, [^,]*')" \
        grep -q "; cpu, 1 thread (bound to 1 of its $cores cores: mpirun --bind-to none frees them), " "$tmp/bound"
fi

# The CPU budget holds whatever BLAS we were built with: at --threads 1, step 2
# takes about one CPU-second (user + system, getrusage through bash's `time`)
# per second of wall time. An OpenBLAS that runs its own threads anyway shows
# as more (one build on a 16-core machine ran this loop on several cores). Ten
# epochs, so that the loop outweighs the start: 0.78 to 0.92 here, 1.30 to 1.32
# with OpenBLAS left at its own 2 threads. On a busy machine a run gets less
# than its core, never more: the bound holds there.
TIMEFORMAT='%3R %3U %3S'
{ time run day1/2_mnist_training --threads 1 --epochs 10 --plot '' > "$tmp/one" 2>&1; } 2> "$tmp/one_time"
read -r wall user sys < "$tmp/one_time"
cpu_per_second=$(awk "BEGIN { printf \"%.2f\", ($user + $sys) / $wall }")
expect "step 2 at --threads 1 keeps to one core: $cpu_per_second CPU-seconds per second (at most 1.2)" \
    awk "BEGIN { exit !($cpu_per_second <= 1.2) }"

# How idle threads wait (common/runtime/threads.c): libgomp spins our short count
# between loops, then sleeps, not its own default of some milliseconds, unless
# the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT. libgomp reads them before
# main(), so ask it what it took (OMP_DISPLAY_ENV=verbose: its settings on
# stderr as it loads).
ours_spin=$(sed -n 's/^#define THREADS_SPIN_COUNT "\([0-9]*\)"$/\1/p' common/runtime/threads.c)
libgomp_says() {  # VARIABLE [ENVIRONMENT...]: the value libgomp took for VARIABLE
    local variable=$1; shift
    env "$@" OMP_DISPLAY_ENV=verbose day1/2_mnist_training --help 2>&1 | sed -n "s/^ *$variable = '\(.*\)'$/\1/p"
}
spin=$(libgomp_says GOMP_SPINCOUNT)
if [ -z "$spin" ]; then  # built without OpenMP (make OPENMP=), or with another runtime than gcc's
    skip "how idle threads wait: step 2 does not run on libgomp (OMP_DISPLAY_ENV=verbose names no GOMP_SPINCOUNT)"
else
    expect "step 2's threads spin $spin times before they sleep (libgomp's own default: 300000), threads.c's count" \
        test -n "$ours_spin" -a "$spin" = "$ours_spin"
    spin=$(libgomp_says GOMP_SPINCOUNT GOMP_SPINCOUNT=300000)
    expect "a user's GOMP_SPINCOUNT=300000 is kept (libgomp took $spin)" test "$spin" = 300000
    policy=$(libgomp_says OMP_WAIT_POLICY OMP_WAIT_POLICY=active) spin=$(libgomp_says GOMP_SPINCOUNT OMP_WAIT_POLICY=active)
    expect "a user's OMP_WAIT_POLICY=active is kept (libgomp took $policy, spinning $spin times)" \
        test "$policy" = ACTIVE -a "$spin" != "$ours_spin"
    spin=$(libgomp_says GOMP_SPINCOUNT OMP_WAIT_POLICY_ALL=active)  # libgomp 13 and later read it; 12 does not
    expect "a user's OMP_WAIT_POLICY_ALL=active is kept too (libgomp spins $spin times)" test -n "$spin" -a "$spin" != "$ours_spin"
    # And what that means: two threads, each short loop followed by 10 ms that the
    # main thread sleeps through. Workers that sleep soon after each loop burn next
    # to nothing (0.02 CPU-seconds per second here); under libgomp's default they
    # spin through half of each gap (0.36 to 0.38 here, 0.21 to 0.28 at a load of
    # 10 on these 2 cores). Load only lowers the figure.
    idle=$(build/tools/idle_threads 100 10 | sed -n 's/.*, \([0-9.]*\) CPU-seconds per second$/\1/p')
    expect "idle threads sleep: ${idle:-?} CPU-seconds per second while the main thread sleeps (at most 0.15)" \
        awk "BEGIN { exit !(\"${idle:-x}\" != \"x\" && ${idle:-1} <= 0.15) }"
fi

# Bad values are usage errors.
run day1/2_mnist_training --threads -1 > "$tmp/bad" 2>&1
status=$?
expect "--threads -1: exit 2 and one line naming the flag ($(head -1 "$tmp/bad"))" \
    test $status -eq 2 -a "$(grep -c -- '--threads' "$tmp/bad")" -eq 1
