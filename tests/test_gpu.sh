#!/usr/bin/env bash
# The GPU path, end to end. Prints one PASS/FAIL/SKIP line per check.
#
# Everywhere (CUDA_VISIBLE_DEVICES= hides any GPU): what a machine without a
# GPU does with step 1, --device cuda and --device auto.
# With a GPU (tests/run.sh and make test-gpu): step 1; the same per-step
# losses on the CPU and the GPU; steps 2, 4, 6, 8 and 11 on the GPU, several
# ranks sharing it through the MPI fallback; step 12's collectives on GPU
# buffers at 1-4 ranks (NCCL, or MPI on host copies); step 13's snapshots of
# GPU tensors; step 14; step 15's three kinds of embeddings; step 19's GPT
# against the CPU at 1 and 4 ranks; compute-sanitizer on short runs (TEST_LEVEL=all only:
# make test-all, make test-gpu).
# Without one each of those prints "SKIP ... (skipped: no GPU)", or fails
# under REQUIRE_GPU=1 (make test-gpu).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite gpu
scratch
RUN_TIMEOUT=300  # its bound before tests/lib.sh: memcheck and the simulated GPU run many times slower
no_gpu() { CUDA_VISIBLE_DEVICES= "$@"; }  # the same binaries, with every GPU hidden

# ---------------------------------------------------------------- without a GPU
# step1_refused WHAT STATUS PATTERN FLAGS...: step 1, with every GPU hidden, exits with STATUS
# (any non-zero for "fail") and prints one line matching PATTERN.
step1_refused() {
    local what=$1 want=$2 pattern=$3 status; shift 3
    no_gpu day1/1_dist_allreduce_gpu "$@" > "$tmp/step1" 2>&1
    status=$?
    if { [ "$want" = fail ] && [ $status -ne 0 ] || [ $status = "$want" ]; } &&
        [ "$(wc -l < "$tmp/step1")" -eq 1 ] && grep -q -- "$pattern" "$tmp/step1"; then
        pass "step 1 $what: one line, exit $status: $(cat "$tmp/step1")"
    else
        fail "step 1 $what (exit $status): $(head -3 "$tmp/step1")"
    fi
}
if [ -x day1/1_dist_allreduce_gpu ]; then
    step1_refused "without a GPU" fail 'no CUDA device: run step 0, or use a GPU node'
    step1_refused "--iters without --count (a usage error)" 2 \
        '^error: --iters times the allreduce of --count N > 1 floats (got --count 1)' --iters 5
else
    grep -q 'HAVE_CUDA=1' build/flags 2> /dev/null &&
        fail "step 1 is missing from a build with CUDA" ||
        pass "step 1 is not built without CUDA (CUDA=0 or no nvcc/NCCL), and make says so"
fi

no_gpu mpi 3 day3/12_collectives --device cuda > "$tmp/c12" 2>&1
status=$?
lines=$(grep -c -- '--device cuda' "$tmp/c12")
expect "step 12 --device cuda without a GPU on 3 ranks: exit $status, no hang, the reason said once: $(grep -m1 -- '--device cuda' "$tmp/c12")" \
    test $status -ne 0 -a $status -ne 124 -a "$lines" -eq 1

no_gpu day1/2_mnist_training --device cuda --epochs 1 > "$tmp/cuda" 2>&1
status=$?
if [ $status -ne 0 ] && [ "$(wc -l < "$tmp/cuda")" -eq 1 ] && grep -q -- '--device cuda' "$tmp/cuda"; then
    pass "--device cuda without a GPU: one line, exit $status: $(cat "$tmp/cuda")"
else
    fail "--device cuda without a GPU (exit $status): $(head -3 "$tmp/cuda")"
fi
no_gpu mpi 4 day1/4_mnist_manual_ddp --device cuda --epochs 1 > "$tmp/cuda4" 2>&1
status=$?
lines=$(grep -c -- '--device cuda' "$tmp/cuda4")
expect "--device cuda without a GPU on 4 ranks: exit $status, no hang, the reason said once ($lines line)" \
    test $status -ne 0 -a $status -ne 124 -a "$lines" -eq 1
# Step 19 computes on the GPU now: without one, --device cuda is refused as in every step.
no_gpu day5/19_gpt --device cuda --max_iters 1 > "$tmp/cuda19" 2>&1
status=$?
expect "step 19 --device cuda without a GPU: one line, exit $status: $(head -1 "$tmp/cuda19")" \
    eval '[ $status -ne 0 ] && [ $status -ne 124 ] && [ "$(wc -l < "$tmp/cuda19")" -eq 1 ] && grep -q -- "--device cuda" "$tmp/cuda19"'
no_gpu day1/2_mnist_training --epochs 1 --plot '' > "$tmp/auto" 2>&1
expect "--device auto without a GPU trains on the CPU: $(head -1 "$tmp/auto" | grep -o '; cpu, .*')" \
    grep -q '; cpu, [0-9]* threads\?, ' "$tmp/auto"

# A CPU-only build (CUDA=0) of a program, in a copy of the tree: no warnings,
# --device cuda is a usage error, --device auto trains on the CPU.
mkdir -p "$tmp/src/day1" "$tmp/src/day3"
cp -r Makefile common "$tmp/src/"
cp day1/2_mnist_training.c "$tmp/src/day1/"
cp day3/12_collectives.c "$tmp/src/day3/"
if make -C "$tmp/src" -j2 CUDA=0 NVTX=0 day1/2_mnist_training day3/12_collectives > "$tmp/build0" 2>&1; then
    # The compiler's warnings (file:line:col: warning:), not make's own (a -j
    # inherited from a `make -j test` makes the sub-make warn about its jobserver).
    warnings=$(grep -cE '^[^ :]+:[0-9]+:[0-9]+: warning:' "$tmp/build0")
    expect "a CUDA=0 build compiles without warnings ($warnings) and says 'CUDA=0: CPU only'" \
        test "$warnings" -eq 0 -a "$(grep -c 'CUDA=0: CPU only' "$tmp/build0")" -eq 1
    "$tmp/src/day1/2_mnist_training" --device cuda > "$tmp/cuda0" 2>&1
    status=$?
    expect "CUDA=0 build: --device cuda is a usage error (exit $status): $(cat "$tmp/cuda0")" \
        test $status -eq 2 -a "$(grep -c 'this build has no GPU code' "$tmp/cuda0")" -eq 1
    "$tmp/src/day1/2_mnist_training" --epochs 1 --plot '' > "$tmp/auto0" 2>&1
    expect "CUDA=0 build: --device auto trains on the CPU: $(grep -o 'Training completed.*' "$tmp/auto0")" \
        grep -q '; cpu, .*' "$tmp/auto0"
    "$tmp/src/day3/12_collectives" --device cuda > "$tmp/c12_0" 2>&1
    status=$?
    expect "CUDA=0 build: step 12 --device cuda is a usage error (exit $status): $(cat "$tmp/c12_0")" \
        test $status -eq 2 -a "$(grep -c 'this build has no GPU code' "$tmp/c12_0")" -eq 1
else
    fail "make CUDA=0 day1/2_mnist_training: $(grep -m3 -E 'error|Error' "$tmp/build0")"
fi

# ---------------------------------------------------------------- with a GPU
gpus=$(build/tools/gpu_count 2> /dev/null || echo 0)
simulated=false  # the GPU is tests/fake_gpu's (make CUDA=1 FAKE_GPU=1: tests/test_fake_gpu.sh)
grep -q -- '-lfakegpu' build/flags 2> /dev/null && simulated=true
gpu_checks=("step 1 at world size 1" "step 1 --count: bandwidth and every element"
    "step 1 refuses two ranks on one GPU" "CPU and GPU per-step losses from the same --init, --no-shuffle"
    "step 2 on the GPU" "step 4 on 2 ranks sharing the GPU (MPI fallback)" "step 6 == step 4 on the GPU"
    "DDP on the GPU: 2 ranks x 3200 == 1 process x 6400" "step 8 on the GPU" "test_profile on the GPU"
    "step 11 on the GPU takes step 10's GPU steps" "step 11 on the GPU: bit-identical at any --workers and --prefetch"
    "step 11 on 2 GPU ranks"
    "step 12 --device cuda at 1, 2, 3 and 4 ranks: every collective verified, the demo as on the CPU"
    "step 12 --device cuda: a wrong element fails the run, named"
    "step 14: CPU and GPU per-step losses from the same --init" "step 14: DDP on the GPU, 2 ranks x 32 == 1 x 64"
    "step 14 on 2 GPU ranks runs each step eagerly" "step 14's CUDA graph: the eager steps' losses and weights bit for bit"
    "step 14 on the GPU refuses a batch past its int pooling indexes"
    "step 15 on the GPU: dense, sparse and sharded embeddings take the CPU's steps at 1 and 2 ranks"
    "step 15's CUDA graph: the eager steps' losses and weights bit for bit (dense, sparse, sharded)"
    "step 19 on the GPU: the CPU's losses, validation loss and weights (1 rank; 4 ranks, NCCL, with 4 GPUs)"
    "step 13 on the GPU: a kill and a restart end as the run without one"
    "step 16 on the GPU, 2 stages x 4 micro-batches: step 2's losses"
    "NCCL between ranks (DDP, step 12, a lost peer): needs 2 GPUs or more" "compute-sanitizer")
if [ "$gpus" -eq 0 ]; then
    for what in "${gpu_checks[@]}"; do
        if [ "${REQUIRE_GPU:-0}" = 1 ]; then fail "$what: REQUIRE_GPU=1, but no GPU"
        else skip "$what (skipped: no GPU)"; fi
    done
    exit 0
fi

# Step 1.
day1/1_dist_allreduce_gpu > "$tmp/s1" 2>&1
expect "step 1 at world size 1: $(grep 'after allreduce' "$tmp/s1")" grep -q 'after allreduce: sum 1, mean 1$' "$tmp/s1"
day1/1_dist_allreduce_gpu --count 50000000 > "$tmp/s1c" 2>&1
expect "step 1 --count 50000000: $(tail -1 "$tmp/s1c")" grep -q 'busbw .*every element verified on every rank' "$tmp/s1c"
if [ "$gpus" -ge 2 ]; then
    mpi 2 day1/1_dist_allreduce_gpu > "$tmp/s1n" 2>&1
    expect "step 1 on 2 GPUs: sum 3, mean 1.5 on both ranks" test "$(grep -c 'sum 3, mean 1.5' "$tmp/s1n")" -eq 2
else
    mpi 2 day1/1_dist_allreduce_gpu > "$tmp/s1n" 2>&1
    status=$?
    expect "step 1 refuses two ranks on one GPU, exit $status: $(grep -o 'share.*' "$tmp/s1n" | head -1)" \
        test $status -ne 0 -a $status -ne 124 -a "$(grep -c 'NCCL needs a GPU per rank' "$tmp/s1n")" -eq 1
fi

# Step 12: the collectives on GPU buffers. NCCL where every rank has a GPU of
# its own, MPI on host copies where ranks share one; the demo prints what it
# prints on the CPU (after its first line, which names the device).
for np in 1 2 3 4; do
    if [ "$np" -le "$gpus" ]; then path=NCCL; else path="MPI on host copies"; fi
    # Standard output only: a notice on stderr from the GPU's libraries (NCCL,
    # Open MPI's CUDA support) is not the demo's output.
    mpi $np day3/12_collectives --device cpu > "$tmp/c12_cpu" 2> "$tmp/c12_cpu.err"
    mpi $np day3/12_collectives --device cuda > "$tmp/c12_gpu" 2> "$tmp/c12_gpu.err"
    demo=$?
    mpi $np day3/12_collectives --device cuda --count 10000000 --iters 5 > "$tmp/c12_count" 2>&1
    count=$?
    expect "step 12 --device cuda at $np rank(s), $path: the demo as on the CPU, --count 10000000 verified; allreduce: $(grep '^allreduce ' "$tmp/c12_count" | tr -s ' ')" \
        eval '[ $demo -eq 0 ] && [ $count -eq 0 ] && head -1 "$tmp/c12_gpu" | grep -q "$path" &&
              diff <(tail -n +2 "$tmp/c12_cpu") <(tail -n +2 "$tmp/c12_gpu") > /dev/null &&
              grep -q "^every element of every collective verified on every rank$" "$tmp/c12_count"'
done
COLLECTIVES_TEST_WRONG_ELEMENT=all-to-all:0:5 mpi 1 day3/12_collectives --device cuda --count 1000 --iters 1 > /dev/null 2> "$tmp/c12_w1"
status1=$?
COLLECTIVES_TEST_WRONG_ELEMENT=reduce-scatter:1:3 mpi 2 day3/12_collectives --device cuda --count 1000 --iters 1 > /dev/null 2> "$tmp/c12_w2"
status2=$?
expect "step 12 --device cuda: a wrong element fails the run, named: $(grep -h ' holds ' "$tmp/c12_w1" "$tmp/c12_w2" | tr '\n' ' ')" \
    eval '[ $status1 -eq 1 ] && [ $status2 -eq 1 ] && grep -q "^all-to-all: rank 0 holds .* at element 5 where" "$tmp/c12_w1" &&
          grep -q "^reduce-scatter: rank 1 holds .* at element 3 where" "$tmp/c12_w2"'

# The same steps on both devices: start from one set of weights, no shuffle.
day1/2_mnist_training --device cpu --epochs 1 --save "$tmp/init.h5" --plot '' > /dev/null 2>&1
day1/2_mnist_training --device cpu --init "$tmp/init.h5" --no-shuffle --epochs 1 --losses "$tmp/cpu.csv" --plot '' > /dev/null 2>&1
day1/2_mnist_training --device cuda --init "$tmp/init.h5" --no-shuffle --epochs 1 --losses "$tmp/gpu.csv" --plot '' > "$tmp/g" 2>&1
verdict=$(same_losses "$tmp/cpu.csv" "$tmp/gpu.csv" 1e-3)
expect "CPU and GPU per-step losses from the same --init, --no-shuffle, one epoch: $verdict" test $? -eq 0
grep -q '; cuda:' "$tmp/g" || fail "step 2 --device cuda does not say it runs on the GPU: $(head -1 "$tmp/g")"

# Step 2, 5 epochs: the GPU's accuracy is the CPU's, to the rounding of a few samples.
day1/2_mnist_training --device cpu --plot '' > "$tmp/c2" 2>&1
day1/2_mnist_training --plot '' > "$tmp/g2" 2>&1
expect "step 2 on the GPU (--device auto): $(grep -o 'Training completed.*' "$tmp/g2"); CPU: $(accuracy "$tmp/c2")%" \
    awk "BEGIN { d = $(accuracy "$tmp/g2") - $(accuracy "$tmp/c2"); exit !(d < 0.3 && d > -0.3) }"

# Step 2's CUDA graph (--cuda_graph, on by default): the step captured once and replayed takes the
# eager step's losses and weights bit for bit, 2 epochs, each ending in a shorter batch run eagerly.
day1/2_mnist_training --device cuda --epochs 2 --losses "$tmp/graph.csv" --save "$tmp/graph.h5" --plot '' > "$tmp/graph" 2>&1
day1/2_mnist_training --device cuda --epochs 2 --losses "$tmp/eager.csv" --save "$tmp/eager.h5" --plot '' --cuda_graph off \
    > "$tmp/eager" 2>&1
expect "step 2's CUDA graph ($(grep -o '[0-9]* of [0-9]* steps replayed' "$tmp/graph")): the eager step's losses and weights, bit for bit" \
    eval 'grep -q "^CUDA graph: 17 of 20 steps replayed" "$tmp/graph" && ! grep -q "^CUDA graph" "$tmp/eager" &&
          test -s "$tmp/graph.csv" && cmp -s "$tmp/graph.csv" "$tmp/eager.csv" &&
          build/tools/compare_h5_weights "$tmp/graph.h5" "$tmp/eager.h5" 0 > /dev/null 2>&1'
# Step 2 with --dtype bfloat16: its GEMMs on the tensor cores (cublasGemmEx, bfloat16 operands,
# float32 sums), captured in its graph too, take the CPU's bfloat16 steps to a float32 GEMM's order
# of sums (the products are exact): within 1e-4, where float32's steps are 3e-4 away.
day1/2_mnist_training --device cuda --dtype bfloat16 --epochs 2 --losses "$tmp/bf16_gpu.csv" --plot '' > "$tmp/bf16_gpu" 2>&1
no_gpu day1/2_mnist_training --device cpu --dtype bfloat16 --epochs 2 --losses "$tmp/bf16_cpu.csv" --plot '' > /dev/null 2>&1
expect_same_losses "step 2 --dtype bfloat16 on the GPU ($(grep -o '[0-9]* of [0-9]* steps replayed' "$tmp/bf16_gpu")) vs on the CPU" \
    "$tmp/bf16_cpu.csv" "$tmp/bf16_gpu.csv" 1e-4
mpi 2 day1/3_mnist_distributed --device cuda --epochs 1 --plot '' > "$tmp/graph3" 2>&1
mpi 2 day1/3_mnist_distributed --device cuda --epochs 1 --plot '' --cuda_graph off > "$tmp/eager3" 2>&1
replayed3=$(grep -c '^\[rank [01]\] CUDA graph: 8 of 10 steps replayed' "$tmp/graph3")
sums3() { grep -o 'Parameter checksum [0-9a-f]*' "$1" | sort -u | awk '{ print $3 }' | paste -sd ' '; }
expect "step 3's CUDA graph on 2 ranks ($replayed3 say 8 of 10 steps replayed): the eager run's checksum $(sums3 "$tmp/eager3")" \
    test "$replayed3" -eq 2 -a -n "$(sums3 "$tmp/eager3")" -a "$(sums3 "$tmp/graph3")" = "$(sums3 "$tmp/eager3")"

# Step 4 on 2 ranks and one GPU: the MPI fallback, announced once.
mpi 2 day1/4_mnist_manual_ddp --device cpu --plot '' > "$tmp/c4" 2>&1
mpi 2 day1/4_mnist_manual_ddp --lr 0.0005 --save "$tmp/w4.h5" --plot '' > "$tmp/g4" 2>&1
mpi 2 day1/4_mnist_manual_ddp --plot '' > "$tmp/g4b" 2>&1
if [ "$gpus" -lt 2 ]; then
    expect "step 4 on 2 ranks sharing the GPU says so once: $(grep -o 'share.*' "$tmp/g4b" | head -1)" \
        test "$(grep -c 'NCCL cannot put two ranks on one GPU' "$tmp/g4b")" -eq 1
fi
checksums=$(checksum "$tmp/g4b" | wc -w)
expect "step 4 on 2 GPU ranks: $(accuracy "$tmp/g4b")% (CPU $(accuracy "$tmp/c4")%), both ranks end bit-identical" \
    awk "BEGIN { d = $(accuracy "$tmp/g4b") - $(accuracy "$tmp/c4"); exit !(d < 0.5 && d > -0.5 && $checksums == 1) }"

# Step 6, the DDP library on GPU gradients, takes the steps of step 4.
mpi 2 day1/6_mnist_ddp --save "$tmp/w6.h5" --plot '' > "$tmp/g6" 2>&1
same_weights "step 6 == step 4 on the GPU, 2 ranks (DDP buckets through page-locked host copies)" "$tmp/w6.h5" "$tmp/w4.h5" 1e-6
mpi 2 day1/6_mnist_ddp --no-shuffle --epochs 1 --batch_size 3200 --losses "$tmp/ddp2.csv" --plot '' > /dev/null 2>&1
day1/2_mnist_training --no-shuffle --epochs 1 --losses "$tmp/one.csv" --plot '' > /dev/null 2>&1
verdict=$(same_losses "$tmp/one.csv" "$tmp/ddp2.csv" 1e-4)
expect "DDP on the GPU: 2 ranks x batch 3200 == 1 process x batch 6400: $verdict" test $? -eq 0

# Step 16 on the GPU: 2 stages (activations and gradients by NCCL send/receive with a GPU per rank,
# MPI on host copies where ranks share one), 4 micro-batches, take step 2's GPU steps; with 4 GPUs,
# 2 stages x 2 replicas (DDP over split NCCL communicators) take step 6's on 2.
mpi 2 day4/16_pipeline_ddp --pp 2 --micro_batches 4 --no-shuffle --epochs 1 --losses "$tmp/pp2.csv" --plot '' > "$tmp/g16" 2>&1
verdict=$(same_losses "$tmp/one.csv" "$tmp/pp2.csv" 1e-5)
expect "step 16 on the GPU, 2 stages x 4 micro-batches: step 2's losses within 1e-5: $verdict" test $? -eq 0
# With --dtype bfloat16 the first stage's micro-batches read their rows of the batch's rounded copy
# (tensor_row_range): the CPU's bfloat16 steps, within step 2's 1e-4.
mpi 2 day4/16_pipeline_ddp --pp 2 --micro_batches 4 --no-shuffle --epochs 1 --dtype bfloat16 --losses "$tmp/pp2_bf16_gpu.csv" \
    --plot '' > /dev/null 2>&1
mpi 2 day4/16_pipeline_ddp --pp 2 --micro_batches 4 --no-shuffle --epochs 1 --dtype bfloat16 --device cpu \
    --losses "$tmp/pp2_bf16_cpu.csv" --plot '' > /dev/null 2>&1
expect_same_losses "step 16 --dtype bfloat16 on the GPU, 2 stages x 4 micro-batches, vs on the CPU" \
    "$tmp/pp2_bf16_cpu.csv" "$tmp/pp2_bf16_gpu.csv" 1e-4
if [ "$gpus" -ge 4 ]; then
    mpi 4 day4/16_pipeline_ddp --pp 2 --micro_batches 2 --schedule gpipe --no-shuffle --epochs 1 --batch_size 3200 \
        --losses "$tmp/pp2dp2.csv" --plot '' > /dev/null 2>&1
    verdict=$(same_losses "$tmp/ddp2.csv" "$tmp/pp2dp2.csv" 1e-5)
    expect "step 16 on 4 GPUs, 2 stages x 2 replicas (split NCCL communicators), GPipe: step 6's losses on 2 GPUs within 1e-5: $verdict" test $? -eq 0
fi

# Step 17 on the GPU: 2 tensor-parallel ranks (g's allreduce of the partial logits by NCCL with a
# GPU per rank, MPI on host copies where ranks share one) take step 2's GPU steps; a deeper MLP
# (784-64-64-64-10: f's allreduce in backward too) at T = 2 takes step 16's steps at P = 1; with 4
# GPUs, 2 x 2 replicas (DDP over split NCCL communicators) take step 6's on 2.
mpi 2 day4/17_tensor_parallel --tp 2 --no-shuffle --epochs 1 --losses "$tmp/tp2.csv" --plot '' > "$tmp/g17" 2>&1
verdict=$(same_losses "$tmp/one.csv" "$tmp/tp2.csv" 1e-5)
expect "step 17 on the GPU, 2 tensor-parallel ranks: step 2's losses within 1e-5: $verdict" test $? -eq 0
deep17=(--hidden 64,64,64 --batch_size 3200 --no-shuffle --epochs 1 --plot '')
day4/16_pipeline_ddp --pp 1 "${deep17[@]}" --losses "$tmp/deep_pp1.csv" > /dev/null 2>&1
mpi 2 day4/17_tensor_parallel --tp 2 "${deep17[@]}" --losses "$tmp/deep_tp2.csv" > /dev/null 2>&1
verdict=$(same_losses "$tmp/deep_pp1.csv" "$tmp/deep_tp2.csv" 1e-5)
expect "step 17 on the GPU, 784-64-64-64-10 at T = 2 (g and f): step 16's losses at P = 1 within 1e-5: $verdict" test $? -eq 0
if [ "$gpus" -ge 4 ]; then
    mpi 4 day4/17_tensor_parallel --tp 2 --no-shuffle --epochs 1 --batch_size 3200 --losses "$tmp/tp2dp2.csv" --plot '' > /dev/null 2>&1
    verdict=$(same_losses "$tmp/ddp2.csv" "$tmp/tp2dp2.csv" 1e-5)
    expect "step 17 on 4 GPUs, 2 tensor-parallel ranks x 2 replicas (split NCCL communicators): step 6's losses on 2 GPUs within 1e-5: $verdict" test $? -eq 0
fi
# Step 18 on the GPU: reduce-scatter and all-gather of GPU buffers (NCCL on the communication stream
# with a GPU per rank, MPI on host copies where ranks share one), exact, in place or not; then every
# ZeRO stage takes step 6's steps on the same world (2 ranks; 4 with 4 GPUs, the units padded).
for np in 2 $([ "$gpus" -ge 4 ] && echo 4); do
    mpi $np build/tests_mpi/test_collectives cuda > "$tmp/coll18_$np" 2>&1
    status=$?
    expect "group_reduce_scatter and group_all_gather of GPU tensors on $np ranks: $(grep -c '^PASS' "$tmp/coll18_$np") checks passed, exit $status $(grep -m1 '^FAIL' "$tmp/coll18_$np")" \
        test $status -eq 0 -a "$(grep -c '^PASS' "$tmp/coll18_$np")" -ge 20 -a "$(grep -c '^FAIL' "$tmp/coll18_$np")" -eq 0
    mpi $np day1/6_mnist_ddp --no-shuffle --epochs 1 --batch_size 3200 --losses "$tmp/z6_$np.csv" --plot '' > "$tmp/z6_$np" 2>&1
    for zero in 1 2 3; do
        flags=(--zero $zero); [ $zero = 3 ] && flags+=(--prefetch)
        mpi $np day4/18_zero_sharding "${flags[@]}" --no-shuffle --epochs 1 --batch_size 3200 --losses "$tmp/z${zero}_$np.csv" \
            --plot '' > "$tmp/z${zero}_$np" 2>&1
        verdict=$(same_losses "$tmp/z6_$np.csv" "$tmp/z${zero}_$np.csv" 1e-5)
        same=$?
        expect "step 18 ${flags[*]} on $np GPU ranks: step 6's losses within 1e-5 ($verdict), accuracy $(accuracy "$tmp/z${zero}_$np")% (step 6: $(accuracy "$tmp/z6_$np")%)" \
            eval '[ $same -eq 0 ] && [ -n "$(accuracy "$tmp/z6_$np")" ] && [ "$(accuracy "$tmp/z${zero}_$np")" = "$(accuracy "$tmp/z6_$np")" ]'
    done
done

# With a GPU per rank, NCCL's allreduce runs on the communication stream; the
# trace places each bucket's allreduce there by its CUDA events, as the CPU's
# communication thread records it: the small last-layer buckets during backward.
if [ "$gpus" -ge 2 ]; then
    mpi 2 day1/6_mnist_ddp --epochs 1 --bucket_mb 0 --trace "$tmp/trace6.json" --plot '' > /dev/null 2>&1
    verdict=$(${PYTHON:-python3} - "$tmp/trace6.json" << 'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
for rank in (0, 1):
    allreduce = [e for e in events if e["pid"] == rank and e["name"] == "allreduce" and e["tid"] == 1]
    backward = [e for e in events if e["pid"] == rank and e["name"] == "backward" and e["tid"] == 0]
    during = sum(any(b["ts"] <= a["ts"] < b["ts"] + b["dur"] for b in backward) for a in allreduce)
    if not allreduce or len(allreduce) != 4 * len(backward) or not during or min(a["dur"] for a in allreduce) < 0:
        print(f"rank {rank}: {len(allreduce)} allreduce ranges for {len(backward)} steps of 4 buckets, {during} during backward")
        sys.exit(1)
print(f"{len(allreduce)} allreduce ranges a rank, {during} of them starting during backward")
PY
)
    expect "step 6's trace on 2 GPUs (NCCL): the buckets' allreduce on the communication track: $verdict" test $? -eq 0
fi

# Step 8: lr x W on the GPU lands where it does on the CPU.
mpi 2 day1/8_mnist_ddp_lr --device cpu --losses "$tmp/c8.csv" --plot '' > /dev/null 2>&1
mpi 2 day1/8_mnist_ddp_lr --losses "$tmp/g8.csv" --plot '' > /dev/null 2>&1
expect "step 8 on the GPU, 2 ranks: final loss $(final_loss "$tmp/g8.csv"), CPU $(final_loss "$tmp/c8.csv")" \
    awk "BEGIN { r = $(final_loss "$tmp/g8.csv") / $(final_loss "$tmp/c8.csv"); exit !(r > 0.98 && r < 1.02) }"

# Step 11 on the GPU: the workers fill page-locked slots with the stored
# pixels; batch b+1 is copied on a copy stream while batch b computes, and
# converted to float32 on the GPU. Same pixels as step 10's GPU gather.
day2/create_mnist_h5 --out "$tmp/mnist.h5" > /dev/null 2>&1
day2/create_mnist_h5 --out "$tmp/mnist_gzip.h5" --gzip 4 > /dev/null 2>&1
day2/create_mnist_h5 --out "$tmp/mnist_float32.h5" --float32 > /dev/null 2>&1
day2/10_mnist_ddp_multinode --no-shuffle --epochs 2 --losses "$tmp/s10.csv" --plot '' > /dev/null 2>&1
day2/11_multinode_streaming --h5 "$tmp/mnist.h5" --no-shuffle --epochs 2 --losses "$tmp/s11.csv" --plot '' > "$tmp/g11" 2>&1
verdict=$(same_losses "$tmp/s10.csv" "$tmp/s11.csv" 1e-6)
expect "step 11 on the GPU takes step 10's GPU steps (1 rank, --no-shuffle): $verdict" test $? -eq 0
grep -q 'copied to the GPU from page-locked memory' "$tmp/g11" ||
    fail "step 11 on the GPU does not say that it copies from page-locked memory: $(grep '^Data: ' "$tmp/g11" | head -1)"
for setting in "1 1" "4 3"; do
    set -- $setting
    day2/11_multinode_streaming --h5 "$tmp/mnist_gzip.h5" --epochs 2 --workers "$1" --prefetch "$2" \
        --losses "$tmp/g11_w$1.csv" --plot '' > "$tmp/g11_w$1" 2>&1
done
day2/11_multinode_streaming --h5 "$tmp/mnist_float32.h5" --epochs 2 --losses "$tmp/g11_f32.csv" --plot '' > /dev/null 2>&1
expect "step 11 on the GPU: bit-identical at 1 worker x 1 ahead and 4 x 3, and from the float32 file (copied as float32)" \
    eval 'cmp -s "$tmp/g11_w1.csv" "$tmp/g11_w4.csv" && cmp -s "$tmp/g11_w1.csv" "$tmp/g11_f32.csv"'
mpi 2 day2/11_multinode_streaming --h5 "$tmp/mnist.h5" --plot '' > "$tmp/g11_2" 2>&1
checksums=$(checksum "$tmp/g11_2" | wc -w)
expect "step 11 on 2 GPU ranks: $(accuracy "$tmp/g11_2")%, both ranks end bit-identical; $(grep -o 'the loop waited [^,]*' "$tmp/g11_2" | head -1)" \
    awk "BEGIN { exit !($(accuracy "$tmp/g11_2") > 85 && $checksums == 1) }"

# test_profile: MSE, SGD and the profiler's GPU synchronisation.
mpi 2 day1/test_profile --trace "$tmp/trace.json" > "$tmp/tp" 2>&1
expect "test_profile on the GPU, 2 ranks: a trace and $(grep -c '^step' "$tmp/tp") steps" \
    test -s "$tmp/trace.json" -a "$(grep -c '^step' "$tmp/tp")" -eq 5
# With NCCL, a step's allreduce is read off the GPU's timeline at the next
# step's first bucket, the last step's when DDP's figures are asked for: the
# table comes after them, so it counts all 5.
if [ "$gpus" -ge 2 ]; then
    expect "test_profile on 2 GPUs (NCCL): the summary table counts every step's allreduce: $(grep '^allreduce' "$tmp/tp" | tr -s ' ')" \
        grep -qE '^allreduce \(comm thread\) +5 ' "$tmp/tp"
fi

# Step 14: the SimpleCNN on the GPU (im2col, col2im and pooling kernels,
# cuBLAS) takes the CPU's steps from the same --init; DDP on 2 GPU ranks takes
# those of one GPU process with the 2x batch.
# On the simulated GPU, whose kernels run thread by thread on the CPU (a step of 64 images takes
# 0.35 s there, the evaluation of the 10000 test images 15 s), step 14 runs 40 steps where a GPU
# runs 100, and evaluates the first 1000 test images (a copy of the data with the test set cut):
# a third of the time, for the same checks (tests/test_fake_gpu.sh).
cnn_steps=100 cnn_data=(--data "$DATA")
if $simulated; then
    cnn_steps=40 cnn_data=(--data "$tmp/mnist_1k")
    mkdir -p "$tmp/mnist_1k"
    ln -s "$(cd "$DATA" && pwd)"/train-* "$tmp/mnist_1k/"  # the training set as it is
    "$PYTHON" - "$DATA" "$tmp/mnist_1k" 1000 << 'EOF_PY'
import gzip, os, struct, sys
source, target, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
for kind, header in (("images-idx3-ubyte", 16), ("labels-idx1-ubyte", 8)):
    name = "t10k-" + kind
    path = os.path.join(source, name)  # the file as it is, or its .gz
    data = open(path, "rb").read() if os.path.exists(path) else gzip.open(path + ".gz").read()
    size = (len(data) - header) // struct.unpack(">I", data[4:8])[0]  # an image's or a label's bytes
    with open(os.path.join(target, name), "wb") as f:
        f.write(data[:4] + struct.pack(">I", keep) + data[8:header] + data[header:header + keep * size])
EOF_PY
fi
day3/14_cnn_ddp --device cpu "${cnn_data[@]}" --max_steps 0 --save "$tmp/cnn_init.h5" --plot '' > /dev/null 2>&1
day3/14_cnn_ddp --device cpu "${cnn_data[@]}" --init "$tmp/cnn_init.h5" --no-shuffle --max_steps $cnn_steps --losses "$tmp/cnn_cpu.csv" --plot '' > "$tmp/cnn_c" 2>&1
day3/14_cnn_ddp --device cuda "${cnn_data[@]}" --init "$tmp/cnn_init.h5" --no-shuffle --max_steps $cnn_steps --losses "$tmp/cnn_gpu.csv" --plot '' > "$tmp/cnn_g" 2>&1
verdict=$(same_losses "$tmp/cnn_cpu.csv" "$tmp/cnn_gpu.csv" 1e-3)
status=$?
expect "step 14: CPU and GPU per-step losses from the same --init, --no-shuffle, $cnn_steps steps: $verdict; test accuracy $(accuracy "$tmp/cnn_g")% on the GPU, $(accuracy "$tmp/cnn_c")% on the CPU, $(grep -o 'of [0-9]*)' "$tmp/cnn_g" | head -1 | tr -d ')') test images" \
    awk "BEGIN { d = $(accuracy "$tmp/cnn_g") - $(accuracy "$tmp/cnn_c"); exit !($status == 0 && d < 0.3 && d > -0.3) }"
# 40 steps, as on the CPU (tests/test_cnn.sh): Adam's first steps magnify the
# rounding differences of a weight gradient summed over 32 rows twice or 64 once.
if [ $cnn_steps = 40 ]; then cp "$tmp/cnn_gpu.csv" "$tmp/cnn_gpu40.csv"  # the run above
else day3/14_cnn_ddp --device cuda "${cnn_data[@]}" --init "$tmp/cnn_init.h5" --no-shuffle --max_steps 40 --losses "$tmp/cnn_gpu40.csv" --plot '' > /dev/null 2>&1; fi
mpi 2 day3/14_cnn_ddp "${cnn_data[@]}" --init "$tmp/cnn_init.h5" --no-shuffle --max_steps 40 --batch_size 32 --losses "$tmp/cnn_gpu2.csv" \
    --save "$tmp/cnn_graph2.h5" --plot '' > "$tmp/cnn_g2" 2>&1
verdict=$(same_losses "$tmp/cnn_gpu40.csv" "$tmp/cnn_gpu2.csv" 1e-4)
status=$?
checksums=$(grep -o 'parameter checksum [0-9a-f]*' "$tmp/cnn_g2" | sort -u | wc -l)
expect "step 14: DDP on the GPU, 2 ranks x 32 == 1 x 64 (40 steps): $verdict; both ranks end bit-identical" \
    test $status -eq 0 -a "$checksums" -eq 1
# With a GPU each, DDP's NCCL allreduces are captured into the step's CUDA graph (the communication
# stream forks from the compute stream and joins it again inside the capture): the replayed steps
# take the eager steps' losses and weights bit for bit. Where the 2 ranks share a GPU, DDP reduces
# through MPI on host copies: no graph, and the run says why.
if [ "$gpus" -ge 2 ]; then
    mpi 2 day3/14_cnn_ddp "${cnn_data[@]}" --init "$tmp/cnn_init.h5" --no-shuffle --max_steps 40 --batch_size 32 --losses "$tmp/cnn_eager2.csv" \
        --save "$tmp/cnn_eager2.h5" --plot '' --cuda_graph off > "$tmp/cnn_e2" 2>&1
    expect "step 14 on 2 GPU ranks replays its step, DDP's NCCL allreduces inside ($(grep -o '[0-9]* of 40 steps replayed from [0-9]* capture' "$tmp/cnn_g2")): the eager steps' losses and weights, bit for bit; DDP's line says the allreduce was not timed, and times it with --cuda_graph off" \
        eval 'grep -q "^CUDA graph: 39 of 40 steps replayed from 1 capture" "$tmp/cnn_g2" &&
              grep -q "^DDP: gradient allreduce in 1 bucket, inside the step.s CUDA graph: not timed" "$tmp/cnn_g2" &&
              grep -q "^DDP: gradient allreduce [0-9.]* ms per step in 1 bucket" "$tmp/cnn_e2" &&
              cmp -s "$tmp/cnn_gpu2.csv" "$tmp/cnn_eager2.csv" && ! grep -q "^CUDA graph" "$tmp/cnn_e2" &&
              build/tools/compare_h5_weights "$tmp/cnn_graph2.h5" "$tmp/cnn_eager2.h5" 0 > /dev/null 2>&1'
else
    expect "step 14 on 2 ranks sharing a GPU runs each step eagerly, and says why: $(grep -o '^CUDA graph: 0 of 40 steps replayed: 2 ranks share a GPU' "$tmp/cnn_g2")" \
        grep -q '^CUDA graph: 0 of 40 steps replayed: 2 ranks share a GPU' "$tmp/cnn_g2"
fi
# Step 14's CUDA graph (--cuda_graph, on by default; 1 rank: DDP has nothing to reduce, so the step
# holds no collective): the steps replayed take the eager steps' losses and weights bit for bit. On a
# GPU, 2 epochs of 938 steps: the first step is the warm-up before the capture, and each epoch's last
# batch (32 images) runs eagerly, so 1873 replayed. On the simulated GPU (minutes an epoch), 40 steps.
if $simulated; then cnn_run=(--max_steps 40 "${cnn_data[@]}") cnn_replayed="39 of 40"
else cnn_run=(--epochs 2) cnn_replayed="1873 of 1876"; fi
day3/14_cnn_ddp --device cuda "${cnn_run[@]}" --losses "$tmp/cnn_graph.csv" --save "$tmp/cnn_graph.h5" --plot '' > "$tmp/cnn_graph" 2>&1
day3/14_cnn_ddp --device cuda "${cnn_run[@]}" --losses "$tmp/cnn_eager.csv" --save "$tmp/cnn_eager.h5" --plot '' \
    --cuda_graph off > "$tmp/cnn_eager" 2>&1
expect "step 14's CUDA graph ($(grep -o '[0-9]* of [0-9]* steps replayed from [0-9]* capture' "$tmp/cnn_graph")): the eager steps' losses and weights, bit for bit" \
    eval 'grep -q "^CUDA graph: $cnn_replayed steps replayed from 1 capture" "$tmp/cnn_graph" &&
          ! grep -q "^CUDA graph" "$tmp/cnn_eager" && test -s "$tmp/cnn_graph.csv" &&
          cmp -s "$tmp/cnn_graph.csv" "$tmp/cnn_eager.csv" &&
          build/tools/compare_h5_weights "$tmp/cnn_graph.h5" "$tmp/cnn_eager.h5" 0 > /dev/null 2>&1'

# Past batch 85598 the first pool's argmax (int indices into 32 x batch x 28 x 28)
# would wrap; a GPU has no host memory expect to refuse it first, as the CPU does.
mpi 2 day3/14_cnn_ddp --device cuda --batch_size 85599 --plot '' > "$tmp/cnn_big" 2>&1
status=$?
expect "step 14 on the GPU refuses a batch past its int pooling indexes, exit $status: $(grep -m1 -- '--batch_size' "$tmp/cnn_big")" \
    test $status -eq 1 -a "$(grep -c -- '--batch_size 85599: the SimpleCNN takes at most 85598' "$tmp/cnn_big")" -eq 1

# Step 15 on the GPU: the tables, the lookups, the forward and backward, the
# per-row sums and SparseAdam in kernels (common/tensor/kernels.h), the rows by NCCL
# (dense: allreduce; sparse: all-gather; sharded: grouped send/receive) or by
# MPI on host copies where ranks share a GPU. Each mode takes the CPU's
# per-step losses over an epoch of ml-latest-small, and ends at its test RMSE.
# (The kernels keep the CPU's order and roundings: on the simulated GPU, and
# with NCCL's rank-ordered sums, the losses are the same bits; the verdict
# says whether they were.)
rmse15() { grep -o 'Test RMSE [0-9.]*' "$1" | tail -1; }
sent() { grep -o '[0-9.]* kB sent per step' "$1"; }  # (step 15's, at 2 ranks or more)
if [ ! -f data/movielens/ratings.csv ]; then
    skip "step 15 on the GPU (no data/movielens/ratings.csv: make movielens)"
else
    for np in 1 2 $([ "$gpus" -ge 4 ] && echo 4); do
        for mode in dense sparse sharded; do
            s15=(day3/15_recommender_ddp --embeddings $mode --epochs 1 --plot '')
            mpi $np "${s15[@]}" --device cpu --losses "$tmp/r15c_${mode}_$np.csv" > "$tmp/r15c_${mode}_$np" 2>&1
            mpi $np "${s15[@]}" --device cuda --losses "$tmp/r15g_${mode}_$np.csv" > "$tmp/r15g_${mode}_$np" 2>&1
            status=$?
            verdict=$(same_losses "$tmp/r15c_${mode}_$np.csv" "$tmp/r15g_${mode}_$np.csv" 1e-5)
            same=$?
            bits=$(cmp -s "$tmp/r15c_${mode}_$np.csv" "$tmp/r15g_${mode}_$np.csv" && echo "the same bits" || echo "not bit for bit")
            expect "step 15 on the GPU, $mode embeddings, $np rank(s), an epoch: the CPU's losses within 1e-5 ($verdict, $bits), $(rmse15 "$tmp/r15g_${mode}_$np") (CPU: $(rmse15 "$tmp/r15c_${mode}_$np"))" \
                eval '[ $status -eq 0 ] && [ $same -eq 0 ] && grep -q "; cuda:" "$tmp/r15g_${mode}_$np" &&
                      [ -n "$(rmse15 "$tmp/r15c_${mode}_$np")" ] && [ "$(rmse15 "$tmp/r15g_${mode}_$np")" = "$(rmse15 "$tmp/r15c_${mode}_$np")" ]'
        done
    done
    # An epoch of more steps than mf.c queues the inputs of in one copy (256): at batch 100, about
    # 900 steps, their inputs in 4 copies, each step's taken by its first kernel inside the graph.
    s15=(day3/15_recommender_ddp --batch_size 100 --epochs 1 --plot '')
    mpi 1 "${s15[@]}" --device cpu --losses "$tmp/r15c_b100.csv" > "$tmp/r15c_b100" 2>&1
    mpi 1 "${s15[@]}" --device cuda --losses "$tmp/r15g_b100.csv" > "$tmp/r15g_b100" 2>&1
    status=$?
    verdict=$(same_losses "$tmp/r15c_b100.csv" "$tmp/r15g_b100.csv" 1e-5)
    same=$?
    expect "step 15 on the GPU at batch 100, $(grep -o '[0-9]* of [0-9]* steps replayed' "$tmp/r15g_b100"): the CPU's losses within 1e-5 ($verdict), $(rmse15 "$tmp/r15g_b100") (CPU: $(rmse15 "$tmp/r15c_b100"))" \
        eval '[ $status -eq 0 ] && [ $same -eq 0 ] && [ "$(wc -l < "$tmp/r15g_b100.csv")" -gt 800 ] &&
              grep -q "^CUDA graph: [0-9]* of [0-9]* steps replayed" "$tmp/r15g_b100" &&
              [ -n "$(rmse15 "$tmp/r15c_b100")" ] && [ "$(rmse15 "$tmp/r15g_b100")" = "$(rmse15 "$tmp/r15c_b100")" ]'
    # Where 2 ranks share a GPU the exchanges go through MPI on host copies: no graph, and the run
    # says why. (With a GPU each, their NCCL collectives are captured: below.)
    if [ "$gpus" -lt 2 ]; then
        expect "step 15 on 2 ranks sharing a GPU runs each step eagerly, and says why: $(grep -o '^CUDA graph: 0 of [0-9]* steps replayed: 2 ranks share a GPU' "$tmp/r15g_sparse_2")" \
            grep -q '^CUDA graph: 0 of [0-9]* steps replayed: 2 ranks share a GPU' "$tmp/r15g_sparse_2"
    fi
    # Step 15's CUDA graph (--cuda_graph, on by default): the steps replayed take the eager steps'
    # losses and weights bit for bit, in each mode, 2 epochs, each ending in a shorter batch run
    # eagerly. Each epoch starts with an eager step: the first, a warm-up before the capture; the
    # second, after the evaluation grew the buffers the step uses, a warm-up before capturing it
    # again (step_graph.h). On 1 rank, 2 epochs of 89 steps: 2 x 87 replayed. With a GPU each, on 2
    # ranks too, the exchanges' NCCL collectives inside the graph (2 epochs of 45 steps: 2 x 43),
    # and the bytes sent per step counted for the replayed steps as for the eager ones.
    graph15=("1 174 of 178")
    [ "$gpus" -ge 2 ] && graph15+=("2 86 of 90")
    for run in "${graph15[@]}"; do
        read -r np replayed <<< "$run"
        for mode in dense sparse sharded; do
            s15=(day3/15_recommender_ddp --embeddings $mode --epochs 2 --plot '' --device cuda)
            g="$tmp/r15graph_${mode}_$np" e="$tmp/r15eager_${mode}_$np"
            mpi $np "${s15[@]}" --losses "$g.csv" --save "$g.h5" > "$g" 2>&1
            mpi $np "${s15[@]}" --losses "$e.csv" --save "$e.h5" --cuda_graph off > "$e" 2>&1
            expect "step 15's CUDA graph, $mode embeddings, $np rank(s) ($(grep -o '[0-9]* of [0-9]* steps replayed from [0-9]* captures' "$g")): the eager steps' losses and weights, bit for bit$([ "$np" -gt 1 ] && echo "; $(sent "$g") (eager: $(sent "$e"))")" \
                eval 'grep -q "^CUDA graph: $replayed steps replayed from 2 captures" "$g" &&
                      ! grep -q "^CUDA graph" "$e" && test -s "$g.csv" && cmp -s "$g.csv" "$e.csv" &&
                      [ "$(sent "$g")" = "$(sent "$e")" ] &&
                      build/tools/compare_h5_weights "$g.h5" "$e.h5" 0 > /dev/null 2>&1'
        done
    done
fi

# Step 19 on the GPU: nanoGPT's GPT (cuBLAS for the Linears, the head and attention's products;
# kernels for LayerNorm, the causal softmax, GELU, the embeddings, the residuals; AdamW and
# clip_grad_norm on GPU tensors) takes the CPU's steps from the same seed (the weights drawn on the
# host, the dropout masks from the same generator: Philox on either device, and at 1 rank torch's
# CPU generator, drawn on the host, on either): every iteration's loss within 1e-5, the validation
# loss after the last to its 4 printed decimals, the saved weights within 1e-5 (||GPU - CPU|| /
# ||CPU||), with biases and dropout on; on 1 rank, and on 4 ranks (DDP's allreduce by NCCL) with 4
# GPUs. The GPU run takes --device auto, which must pick the GPU. (On the simulated GPU the kernels
# do the CPU's operations and its cuBLAS is OpenBLAS: the verdict says whether the bits were the same.)
val_loss19() { sed -n "s/^step $2: train loss [0-9.]*, val loss \([0-9.]*\)$/\1/p" "$1"; }
if [ ! -f data/shakespeare/input.txt ]; then
    skip "step 19 on the GPU (no data/shakespeare/input.txt: make shakespeare)"
else
    s19=(day5/19_gpt --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --max_iters 12 --eval_interval 12 --eval_iters 2
         --warmup_iters 4 --lr_decay_iters 12 --learning_rate 3e-3 --bias --dropout 0.1 --sample 20 --plot '')
    # With --dtype bfloat16 (cublasGemmEx and cublasGemmBatchedEx against the CPU's GEMMs of the same
    # rounded operands) the losses within 1e-4 and the weights within 1e-3: where a float32 sum in
    # another order (cuBLAS's bias gradients) lands an operand on the other side of a bfloat16
    # rounding, that value moves by 2^-8 (simulated: 3.4e-6 and 1.8e-4; the validation loss is not
    # compared).
    runs=("1 philox float32" "1 torch float32" "1 philox bfloat16")
    [ "$gpus" -ge 4 ] && runs+=("4 philox float32")
    for run in "${runs[@]}"; do
        read -r np rng dtype <<< "$run"
        batch=$((8 / np))  # the same global batch of 8 windows at either world size
        c="$tmp/g19c_${np}_${rng}_$dtype" g="$tmp/g19g_${np}_${rng}_$dtype" tol=1e-5 weights_tol=1e-5
        [ "$dtype" = bfloat16 ] && tol=1e-4 weights_tol=1e-3
        mpi $np "${s19[@]}" --batch_size $batch --dropout_rng $rng --dtype $dtype --device cpu --losses "$c.csv" --save "$c.h5" > "$c" 2>&1
        mpi $np "${s19[@]}" --batch_size $batch --dropout_rng $rng --dtype $dtype --losses "$g.csv" --save "$g.h5" > "$g" 2>&1
        status=$?
        verdict=$(same_losses "$c.csv" "$g.csv" $tol)
        same=$?
        weights=$(build/tools/compare_h5_weights "$c.h5" "$g.h5" $weights_tol 2>&1)
        close=$?
        bits=$([ "$(checksum "$c")" = "$(checksum "$g")" ] && echo "the same bits" || echo "not bit for bit")
        cpu_val=$(val_loss19 "$c" 12) gpu_val=$(val_loss19 "$g" 12)
        expect "step 19 on the GPU, $np rank(s), 12 iterations with biases and dropout 0.1 (--dropout_rng $rng, --dtype $dtype): the CPU's losses ($verdict), val loss ${gpu_val:-none} (CPU ${cpu_val:-none}), weights: $weights ($bits)" \
            eval '[ $status -eq 0 ] && [ $same -eq 0 ] && [ $close -eq 0 ] && grep -q "; cuda:" "$g" && [ -n "$cpu_val" ] &&
                  { [ "$dtype" = bfloat16 ] || [ "$gpu_val" = "$cpu_val" ]; } && [ "$(checksum "$g" | wc -w)" -eq 1 ]'
    done
fi

# Step 20 on the GPU: the split GPT (tensor-parallel f and g, pipeline exchanges, the tied wte's
# sum, ZeRO-1's all-gather, the gathered model copied to the host) takes the CPU's steps for the
# same grid: every iteration's loss within 1e-5, the saved whole model within 1e-5. On 2 ranks
# (--tp 2, with and without --sp: sequence parallelism's all-gathers and reduce-scatters; --pp 2
# --recompute: each block's forward redone on the GPU before its backward; with dropout, --tp 2 --sp
# and --pp 2 with 2 micro-batches, with and without --recompute: each rank's part of Philox's masks
# drawn by the kernel, with --recompute a block's again in its second forward), and with
# 4 GPUs on 4 (--dp 2 --pp 2 --zero 1 with 2 micro-batches; --tp 2 --pp 2, with and without
# --recompute, with --sp --recompute, and with --sp and dropout).
if [ -f data/shakespeare/input.txt ]; then
    s20=(day5/20_gpt_3d --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --max_iters 12 --eval_interval 12 --eval_iters 2
         --warmup_iters 4 --lr_decay_iters 12 --learning_rate 3e-3 --bias --batch_size 8 --sample 20 --plot '')
    grids=("2 --tp 2" "2 --tp 2 --sp" "2 --pp 2 --micro_batches 2 --recompute" "2 --tp 2 --sp --dropout 0.1"
           "2 --pp 2 --micro_batches 2 --dropout 0.1" "2 --pp 2 --micro_batches 2 --recompute --dropout 0.1")
    [ "$gpus" -ge 4 ] && grids+=("4 --dp 2 --pp 2 --micro_batches 2 --zero 1" "4 --tp 2 --pp 2 --micro_batches 2"
                           "4 --tp 2 --pp 2 --micro_batches 2 --recompute" "4 --tp 2 --pp 2 --micro_batches 2 --sp --recompute"
                           "4 --tp 2 --pp 2 --micro_batches 2 --sp --dropout 0.1")
    for grid in "${grids[@]}"; do
        read -r np flags <<< "$grid"
        mpi $np "${s20[@]}" $flags --device cpu --losses "$tmp/g20c.csv" --save "$tmp/g20c.h5" > "$tmp/g20c" 2>&1
        mpi $np "${s20[@]}" $flags --losses "$tmp/g20g.csv" --save "$tmp/g20g.h5" > "$tmp/g20g" 2>&1
        status=$?
        verdict=$(same_losses "$tmp/g20c.csv" "$tmp/g20g.csv" 1e-5)
        same=$?
        weights=$(build/tools/compare_h5_weights "$tmp/g20c.h5" "$tmp/g20g.h5" 1e-5 2>&1)
        close=$?
        expect "step 20 on the GPU, $np ranks, $flags: the CPU's losses ($verdict), the gathered model: $weights" \
            eval '[ $status -eq 0 ] && [ $same -eq 0 ] && [ $close -eq 0 ] && grep -q "; cuda:" "$tmp/g20g"'
    done
fi

# Step 13 on the GPU: the snapshot holds GPU tensors (the weights, Adam's
# moments), copied to the host to be written and back when loaded. A run
# killed in epoch 2 (--fail_at_epoch), then started again, resumes from its
# snapshot and ends with the losses and the weights of a run never killed.
s13=(day3/13_fault_tolerant_ddp --device cuda --total_epochs=3 --plot=)
mpi 1 "${s13[@]}" --snapshot="$tmp/s13_ref.h5" --losses="$tmp/s13_ref.csv" > "$tmp/s13_ref" 2>&1
mpi 1 "${s13[@]}" --snapshot="$tmp/s13.h5" --losses="$tmp/s13.csv" --fail_at_epoch=2 > "$tmp/s13_fail" 2>&1
failed=$?
mpi 1 "${s13[@]}" --snapshot="$tmp/s13.h5" --losses="$tmp/s13.csv" --fail_at_epoch=2 > "$tmp/s13_resumed" 2>&1
resumed=$?
s13_sum() { grep -o 'parameter checksum [0-9a-f]*' "$1"; }
expect "step 13 on the GPU: killed in epoch 2 (exit $failed), started again (exit $resumed), it resumes and ends as the run never killed: $(s13_sum "$tmp/s13_ref")" \
    eval '[ $failed -eq 137 ] && [ $resumed -eq 0 ] && grep -qx "Resuming training from snapshot at Epoch 1" "$tmp/s13_resumed" &&
          [ -n "$(s13_sum "$tmp/s13_ref")" ] && [ "$(s13_sum "$tmp/s13_resumed")" = "$(s13_sum "$tmp/s13_ref")" ] &&
          cmp -s "$tmp/s13_ref.csv" "$tmp/s13.csv"'

# Its sharded form (--checkpoint) on the GPU: each of 2 ranks copies its 1/2 of the GPU tensors
# to the host (--async_save: into page-locked memory, written by a thread); killed in epoch 3 and
# started again, it ends as the same run saving snapshots, never killed. (An asynchronous save of
# epoch 2 becomes current once its threads are done, or at the next save: the resume is from epoch
# 2's checkpoint or, where its threads were slower than the kill, from epoch 1's.)
mpi 2 "${s13[@]}" --snapshot="$tmp/s13_ref2.h5" --losses="$tmp/s13_ref2.csv" > "$tmp/s13_ref2" 2>&1
for how in "" --async_save; do
    rm -rf "$tmp/s13ck"
    mpi 2 "${s13[@]}" --checkpoint="$tmp/s13ck" $how --losses="$tmp/s13ck.csv" --fail_at_epoch=3 > "$tmp/s13ck_fail" 2>&1
    failed=$?
    mpi 2 "${s13[@]}" --checkpoint="$tmp/s13ck" $how --losses="$tmp/s13ck.csv" --fail_at_epoch=3 > "$tmp/s13ck_resumed" 2>&1
    resumed=$?
    expect "step 13 on the GPU, --checkpoint${how:+ $how} on 2 ranks: killed in epoch 3 (exit $failed), started again (exit $resumed), it resumes ($(grep -o 'step-0000[0-9]*, saved by DDP on 2 ranks' "$tmp/s13ck_resumed")) and ends as the run never killed: $(s13_sum "$tmp/s13_ref2" | head -1)" \
        eval '[ $failed -eq 137 ] && [ $resumed -eq 0 ] && grep -qE "^Resumed from $tmp/s13ck/step-0000(05|10), saved by DDP on 2 ranks" "$tmp/s13ck_resumed" &&
              [ -n "$(s13_sum "$tmp/s13_ref2")" ] && [ "$(s13_sum "$tmp/s13ck_resumed" | sort)" = "$(s13_sum "$tmp/s13_ref2" | sort)" ] &&
              cmp -s "$tmp/s13_ref2.csv" "$tmp/s13ck.csv"'
done

# A lost peer. Rank 1 stops taking part in NCCL in the middle of training
# (tests/lost_peer.c, preloaded into the ranks): to the others it is a rank
# that died inside a collective, which then never completes on their GPUs;
# but mpirun, which ends a job whose rank dies, does not see it. So only the
# other ranks' polling waits (common/runtime/device.h) can end the job: at the time
# limit where NCCL says nothing (a dead peer on the same node), or at NCCL's
# asynchronous error where it says one (across nodes, after its network
# timeout: LOST_PEER_ERROR_AFTER). Either way each waiting rank prints one
# line that names what it waited for, and no rank is left running. (A host
# wait that skips the polling, such as a copy into pageable memory queued
# behind the collective, would hang here until the `timeout` below.)
# ranks_here PROGRAM: the processes of PROGRAM started in this tree, one pid a line (another
# checkout's tests may run the same program on this machine at the same time: not theirs).
ranks_here() {
    local pid
    for pid in $(pgrep -f "$1"); do [ "$(readlink "/proc/$pid/cwd" 2> /dev/null)" = "$PWD" ] && echo "$pid"; done
}
lost_peer() {  # PLACE NP AT PROGRAM FLAGS...: PLACE is node or nodes
    local place=$1 np=$2 at=$3 program=$4 out status start seconds expected settings; shift 3
    out=$tmp/lost_${program##*/}_${np}_$place
    if [ "$place" = node ]; then
        settings=(GPU_WAIT_TIMEOUT=3)
        expected='the host waited [0-9]+ s for .+ on the GPU: a peer rank died or hangs'
    else
        rm -f "$out.mark"
        settings=(GPU_WAIT_TIMEOUT=600 LOST_PEER_ERROR_AFTER=1 "LOST_PEER_FILE=$out.mark")
        expected='NCCL failed while the host waited for .+ on the GPU: remote process exited or there was a network error \(lost_peer: rank 1 stopped answering'
    fi
    start=$(date +%s.%N)
    env LOST_PEER_RANK=1 LOST_PEER_AT="$at" "${settings[@]}" \
        timeout 120 $MPIRUN -np "$np" -x LD_PRELOAD="$PWD/build/lib/liblost_peer.so" "$@" > "$out" 2>&1
    status=$?
    seconds=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $start }")
    local named others left t
    named=$(grep -cE "^\[rank [0-9]+ @ [^]]*\] .*$expected" "$out")
    others=$(grep -E '^\[rank [0-9]+ @ ' "$out" | grep -cvE "$expected")
    for ((t = 0; t < 50; t++)); do left=$(ranks_here "$program" | wc -l); [ "$left" = 0 ] && break; sleep 0.1; done
    local what="a lost peer, ${program##*/} on $np GPUs, $([ "$place" = node ] && echo "one node (NCCL silent, GPU_WAIT_TIMEOUT=3)" || echo "across nodes (NCCL's error after 1 s)")"
    if [ $status -ne 0 ] && [ $status -ne 124 ] && grep -q "^lost_peer: rank 1 makes no NCCL operation from number $at " "$out" &&
        [ "$named" -ge 1 ] && [ "$others" -eq 0 ] && [ "$left" -eq 0 ]; then
        pass "$what: exit $status after $seconds s, $named rank(s) each one line: $(grep -m1 -oE "waited( [0-9]+ s)? for .+ on the GPU" "$out")"
    else
        fail "$what: exit $status after $seconds s ($([ $status = 124 ] && echo 'it hung'), $named line(s) naming the wait, $others other error line(s), $left process(es) left): $(grep -vE '^(Step|epoch|World|DDP|Data|\[rank [0-9]+\] parameter)' "$out" | head -4 | tr '\n' ' ')"
        ranks_here "$program" | xargs -r kill -9 2> /dev/null
    fi
}
if [ "$gpus" -ge 2 ]; then
    for np in 2 $(if_thorough 4); do
        [ "$np" -le "$gpus" ] || continue
        for place in node nodes; do
            # AT: an operation of the second training step (the first ones broadcast the weights).
            lost_peer $place $np 6 day1/6_mnist_ddp --epochs 1 --plot ''
            lost_peer $place $np 6 day2/10_mnist_ddp_multinode --epochs 1 --plot ''
            lost_peer $place $np 6 day3/13_fault_tolerant_ddp --total_epochs=1 --snapshot="$tmp/lost13_${np}_$place.h5" --plot=
            lost_peer $place $np 10 day3/14_cnn_ddp --max_steps 5 --plot ''
            lost_peer $place $np 3 day3/12_collectives --device cuda  # its third collective, allreduce
            lost_peer $place $np 6 day4/16_pipeline_ddp --pp 2 --micro_batches 2 --epochs 1 --plot ''  # a send or receive
            lost_peer $place $np 6 day4/17_tensor_parallel --tp 2 --epochs 1 --plot ''  # an allreduce of g (or of DDP)
            lost_peer $place $np 8 day4/18_zero_sharding --zero 3 --prefetch --epochs 1 --plot ''  # the second step's first all-gather
            if [ -f data/movielens/ratings.csv ]; then
                # (a step: dense 2 allreduces per table; sharded 4 sends or receives per sharded table to look up,
                # 2 to send its gradients, an all-gather per bias table; at 2 ranks)
                lost_peer $place $np 9 day3/15_recommender_ddp --embeddings dense --max_steps 5 --plot ''  # the second step's first allreduce
                lost_peer $place $np 15 day3/15_recommender_ddp --embeddings sharded --max_steps 5 --plot ''  # the second step's first send
            fi
            if [ -f data/shakespeare/input.txt ]; then  # an all-gather or reduce-scatter of sequence parallelism, in the second step
                lost_peer $place $np 60 day5/20_gpt_3d --tp $np --sp --n_layer 2 --n_embd 32 --block_size 16 --batch_size 4 --max_iters 5 \
                    --eval_interval 100 --eval_iters 1 --sample 0 --plot ''
            fi
        done
    done
fi

# NCCL between ranks needs a GPU per rank: on one GPU, DDP, step 12 and step 18 took
# the MPI fallback above, and NCCL's own paths (strategy 3 of ddp_gpu.c, the
# NCCL branches of collectives.c) did not run, nor did the lost peer's checks.
[ "$gpus" -lt 2 ] && skip "NCCL between ranks (DDP, step 12, a lost peer): needs 2 GPUs or more, this machine has $gpus"

# compute-sanitizer (memcheck): no out-of-bounds or misaligned access, no API error.
sanitizer=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/compute-sanitizer 2> /dev/null)
if ! thorough; then :  # make test-all and make test-gpu (TEST_LEVEL=all): minutes under memcheck
elif $simulated; then
    skip "compute-sanitizer (the GPU is tests/fake_gpu's, on the CPU)"
elif [ -n "$sanitizer" ]; then
    "$sanitizer" --error-exitcode 9 day1/2_mnist_training --epochs 1 --plot '' > "$tmp/cs" 2>&1
    status=$?
    expect "compute-sanitizer on step 2 (one epoch), exit $status: $(grep 'ERROR SUMMARY' "$tmp/cs")" \
        grep -q 'ERROR SUMMARY: 0 errors' "$tmp/cs"
    # The copy stream, its events and the page-locked slots of step 11.
    "$sanitizer" --error-exitcode 9 day2/11_multinode_streaming --h5 "$tmp/mnist_gzip.h5" --epochs 1 --workers 3 \
        --plot '' > "$tmp/cs11" 2>&1
    status=$?
    expect "compute-sanitizer on step 11 (one epoch, 3 workers), exit $status: $(grep 'ERROR SUMMARY' "$tmp/cs11")" \
        grep -q 'ERROR SUMMARY: 0 errors' "$tmp/cs11"
    # Step 14's kernels: im2col, col2im, pooling; the evaluation ends on a partial batch (10000 = 156 x 64 + 16).
    "$sanitizer" --error-exitcode 9 day3/14_cnn_ddp --max_steps 20 --plot '' > "$tmp/cs14" 2>&1
    status=$?
    expect "compute-sanitizer on step 14 (20 steps and the evaluation), exit $status: $(grep 'ERROR SUMMARY' "$tmp/cs14")" \
        grep -q 'ERROR SUMMARY: 0 errors' "$tmp/cs14"
    # Step 19's kernels and batched GEMMs: LayerNorm, attention, GELU, the embeddings, dropout, AdamW, sampling.
    if [ -f data/shakespeare/input.txt ]; then
        "$sanitizer" --error-exitcode 9 day5/19_gpt --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --batch_size 4 \
            --max_iters 3 --eval_interval 3 --eval_iters 1 --bias --dropout 0.1 --sample 10 --plot '' > "$tmp/cs19" 2>&1
        status=$?
        expect "compute-sanitizer on step 19 (3 iterations with biases and dropout, the evaluation, a sample), exit $status: $(grep 'ERROR SUMMARY' "$tmp/cs19")" \
            grep -q 'ERROR SUMMARY: 0 errors' "$tmp/cs19"
    fi
    # Step 15's kernels: the row gathers and scatters, the per-row sums, SparseAdam; sharded's own rows copied on the GPU.
    if [ -f data/movielens/ratings.csv ]; then
        "$sanitizer" --error-exitcode 9 day3/15_recommender_ddp --embeddings sharded --max_steps 20 --plot '' > "$tmp/cs15" 2>&1
        status=$?
        expect "compute-sanitizer on step 15 (sharded, 20 steps and the evaluation), exit $status: $(grep 'ERROR SUMMARY' "$tmp/cs15")" \
            grep -q 'ERROR SUMMARY: 0 errors' "$tmp/cs15"
    fi
else
    skip "compute-sanitizer (not found in PATH or \$CUDA_HOME/bin)"
fi
