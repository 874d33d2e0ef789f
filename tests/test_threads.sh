#!/usr/bin/env bash
# Threads per rank: results never depend on how many there are, --threads
# overrides the default, and the first line says what computes.
# make test (TEST_LEVEL=quick) checks step 2's thread counts; make test-all (TEST_LEVEL=all)
# also step 6's (DDP on 2 ranks) and step 11's (streaming).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
MPIRUN=${MPIRUN:-mpirun --oversubscribe $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
DATA=${DATA:-data/mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

pass() { echo "PASS threads: $*"; }
fail() { echo "FAIL threads: $*"; }
expect() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
run() { timeout 120 "$@"; }
# --bind-to none: otherwise mpirun binds 1 or 2 ranks to one core each, and a
# rank could not use the threads asked for.
mpi() { local np=$1; shift; run $MPIRUN --bind-to none -np "$np" "$@"; }

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

# The vector width: the same bits from the loops that common/cpu_dispatch.h
# compiles for AVX-512, AVX2 and SSE2 and picks between at run time (this CPU
# took one; build/one_isa/ holds step 2 built for one instruction set alone,
# on x86-64 with a gcc that knows the levels), both at 2 threads.
if [ "$(uname -m)" = x86_64 ]; then
    for isa in x86-64 x86-64-v3; do
        if [ ! -x build/one_isa/$isa/2_mnist_training ]; then
            echo "SKIP threads: step 2 built for $isa: not built (the compiler has no -march=$isa)"
        elif [ "$isa" = x86-64-v3 ] && ! grep -qw avx2 /proc/cpuinfo; then
            echo "SKIP threads: step 2 built for $isa: this CPU has no AVX2"
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

# Bad values are usage errors.
run day1/2_mnist_training --threads -1 > "$tmp/bad" 2>&1
status=$?
expect "--threads -1: exit 2 and one line naming the flag ($(head -1 "$tmp/bad"))" \
    test $status -eq 2 -a "$(grep -c -- '--threads' "$tmp/bad")" -eq 1
