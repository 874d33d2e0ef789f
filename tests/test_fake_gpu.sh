#!/usr/bin/env bash
# The GPU path on a simulated GPU, for machines without one: a copy of the
# tree built with `make CUDA=1 FAKE_GPU=1` (tests/fake_gpu: a CUDA runtime,
# cuBLAS and NCCL that run on the CPU, and kernels.cu compiled for it), the
# simulation's own checks, every GPU operation against the CPU code
# (tests/unit/test_gpu.c), then every check of tests/test_gpu.sh, with one
# simulated GPU (ranks share it: the MPI fallbacks) and with four (NCCL
# between ranks). tests/fake_gpu/fake_gpu.cpp says what the simulation
# catches and what only a real GPU can show (`make test-gpu` on one).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite fake-gpu
# The simulated GPUs are all visible here (FAKE_GPU_COUNT says how many); test_gpu.sh hides them where it means to.
unset CUDA_VISIBLE_DEVICES
cuda_include=${CUDA_HOME:-/usr/local/cuda}/include
for needed in "$cuda_include/cuda_runtime_api.h" "$cuda_include/cublas_v2.h" "$cuda_include/nccl.h"; do
    if [ ! -f "$needed" ]; then
        skip "the GPU path on a simulated GPU (needs the CUDA toolkit's headers: no $needed)"
        exit 0
    fi
done
if ! command -v g++ > /dev/null || ! command -v mpicxx > /dev/null; then
    skip "the GPU path on a simulated GPU (needs g++ and mpicxx)"
    exit 0
fi

scratch
src=$tmp/src
mkdir -p "$src"
cp -r Makefile common day1 day2 day3 day4 day5 tests "$src/"
ln -s "$PWD/data" "$src/data"
# A fresh build/ of its own: every binary copied from here is rebuilt (they depend on build/flags).
if ! make -C "$src" -j"$(nproc)" CUDA=1 FAKE_GPU=1 NVTX=0 > "$tmp/build" 2>&1; then
    fail "make CUDA=1 FAKE_GPU=1: $(grep -m3 -E 'error|Error' "$tmp/build")"
    exit 1
fi
warnings=$(grep -cE '^[^ :]+:[0-9]+:[0-9]+: warning:' "$tmp/build")
if [ "$warnings" -eq 0 ]; then pass "make CUDA=1 FAKE_GPU=1 builds every program without warnings"
else fail "make CUDA=1 FAKE_GPU=1 warns $warnings times: $(grep -m1 -E ': warning:' "$tmp/build")"; fi

# relabelled NAME PREFIX COMMAND...: COMMAND's verdict lines, each with PREFIX; a crash (the
# simulation's own stop, an abort) without a FAIL line of its own is one FAIL.
relabelled() {
    local name=$1 prefix=$2 status; shift 2
    (cd "$src" && "$@") > "$tmp/out" 2>&1
    status=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$tmp/out" | sed -E "s/^(PASS|FAIL|SKIP) (gpu: )?/\1 $prefix: /"
    if [ $status -ne 0 ] && ! grep -q '^FAIL ' "$tmp/out"; then
        echo "FAIL $prefix: $name exited with status $status: $(grep -v -E '^(PASS|SKIP) ' "$tmp/out" | tail -3 | tr '\n' ' ')"
    fi
}
relabelled fake_gpu_checks "fake GPU" build/fake_gpu/fake_gpu_checks
# NCCL inside a CUDA graph (tests/fake_gpu/nccl_graph_checks.c): a step whose communication stream
# forks from the captured one, allreduces and exchanges round a ring, launched on new inputs, on 2
# and 3 simulated GPUs; and a graph launched on one rank where another runs the step eagerly, which
# NCCL forbids, stopped, named.
for np in 2 3; do
    FAKE_GPU_COUNT=$np relabelled nccl_graph_checks "fake GPU x$np" mpi $np -x FAKE_GPU_COUNT build/fake_gpu/nccl_graph_checks
done
(cd "$src" && FAKE_GPU_COUNT=2 mpi 2 -x FAKE_GPU_COUNT build/fake_gpu/nccl_graph_checks mismatch) > "$tmp/mismatch" 2>&1
status=$?
expect "fake GPU x2: an NCCL allreduce launched from a graph on one rank and eagerly on the other stops the run (exit $status): $(grep -o -m1 'an NCCL collective launched from a CUDA graph on some ranks and eagerly on others' "$tmp/mismatch")" \
    eval '[ $status -ne 0 ] && grep -q "fake GPU: an NCCL collective launched from a CUDA graph on some ranks and eagerly on others" "$tmp/mismatch"'
# A CUDA graph that the driver refuses (FAKE_GPU_REFUSE_GRAPHS=1: as a real GPU's would, were an NCCL that
# cannot be captured in the step) stops the run in one line a rank, naming the failed call and the way
# round it; with --cuda_graph off the same run trains. Step 2 alone, and step 15 on 2 simulated GPUs
# (its exchanges' NCCL collectives inside the capture).
refused_graph() {  # NAME RANKS COMMAND...
    local name=$1 np=$2 status lines; shift 2
    (cd "$src" && FAKE_GPU_COUNT=$np FAKE_GPU_REFUSE_GRAPHS=1 RUN_TIMEOUT=120 mpi "$np" -x FAKE_GPU_COUNT -x FAKE_GPU_REFUSE_GRAPHS "$@") > "$tmp/refused" 2>&1
    status=$?
    lines=$(grep -c '^\[rank [0-9]* @ .*cudaStreamEndCapture.*failed: .*(while a training step was captured into a CUDA graph; --cuda_graph off launches each kernel by itself)$' "$tmp/refused")
    expect "fake GPU x$np: $name with its CUDA graph refused: exit $status (want 1), $lines line(s) naming cudaStreamEndCapture and --cuda_graph off: $(grep -m1 '^\[rank [0-9]* @' "$tmp/refused" | cut -c1-160)" \
        eval '[ $status -eq 1 ] && [ "$lines" -ge 1 ]'
    (cd "$src" && FAKE_GPU_COUNT=$np FAKE_GPU_REFUSE_GRAPHS=1 RUN_TIMEOUT=120 mpi "$np" -x FAKE_GPU_COUNT -x FAKE_GPU_REFUSE_GRAPHS "$@" --cuda_graph off) > "$tmp/refused" 2>&1
    status=$?
    expect "fake GPU x$np: $name with --cuda_graph off where graphs are refused: trains (exit $status)" eval '[ $status -eq 0 ]'
}
refused_graph "step 2" 1 day1/2_mnist_training --data "$DATA" --batch_size 2000 --epochs 1 --plot '' --device cuda
refused_graph "step 15" 2 day3/15_recommender_ddp --data data/movielens --epochs 1 --plot '' --device cuda
# Every GPU operation against the CPU code (tests/unit/test_gpu.c).
relabelled test_gpu "fake GPU" build/tests/test_gpu
# A pipeline stage's timer on the GPU's clock: more steps than its ring of events (tests/unit/test_stage_timer.c).
relabelled test_stage_timer "fake GPU" build/tests/test_stage_timer
for gpus in 1 4; do
    relabelled test_gpu.sh "fake GPU x$gpus" env FAKE_GPU_COUNT=$gpus MPIRUN="$MPIRUN" bash tests/test_gpu.sh
done
# A diverged training stops on the GPU path too (where its losses are read back: each step, or at its epoch's end: divergence.h).
relabelled test_nonfinite.sh "fake GPU x2" env FAKE_GPU_COUNT=2 NONFINITE_DEVICE=cuda MPIRUN="$MPIRUN" bash tests/test_nonfinite.sh
# Step 18's sharded checkpoint from GPU memory (each shard through a host copy): a ZeRO-3 run on 2
# simulated GPUs stopped at step 7 and resumed ends bit for bit, and the checkpoint loads on the CPU.
gpu_ck=(day4/18_zero_sharding --data "$DATA" --batch_size 2000 --epochs 1 --plot '' --zero 3 --device cuda)
(cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" --losses "$tmp/ck_ref.csv") > "$tmp/ck_ref.out" 2>&1
(cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" --max_steps 7 --checkpoint "$tmp/gpu_ck") > /dev/null 2>&1
(cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" --checkpoint "$tmp/gpu_ck" --losses "$tmp/ck_res.csv") > "$tmp/ck_res.out" 2>&1
expect "fake GPU x2: step 18's sharded checkpoint, saved at step 7 from GPU memory, resumes bit for bit (checksum $(checksum "$tmp/ck_res.out"))" \
    test -n "$(checksum "$tmp/ck_ref.out")" -a "$(checksum "$tmp/ck_res.out")" = "$(checksum "$tmp/ck_ref.out")" -a -n "$(grep '^Resumed' "$tmp/ck_res.out")" \
    -a "$(cat "$tmp/ck_res.csv" 2> /dev/null)" = "$(cat "$tmp/ck_ref.csv")"
mpi 1 day4/18_zero_sharding --data "$DATA" --batch_size 4000 --epochs 1 --plot '' --zero 0 --device cpu --checkpoint "$tmp/gpu_ck" \
    > "$tmp/ck_cpu.out" 2>&1
expect "... and the GPU run's checkpoint loads on the CPU, resharded to DDP on 1 rank, with its weights (checksum $(checksum "$tmp/ck_cpu.out"))" \
    test "$(checksum "$tmp/ck_cpu.out")" = "$(checksum "$tmp/ck_ref.out")"
# Steps 16 and 17 the same way: 2 stages, and 2 replicas of one tensor-parallel rank (each writing
# half of every tensor's rows: pieces that start inside a GPU buffer); each saving every 3 steps with
# --async_save (its host copy in page-locked memory, written by a thread while the GPU trains on).
for split in "day4/16_pipeline_ddp --pp 2" "day4/17_tensor_parallel --tp 1" "day4/18_zero_sharding --zero 3"; do
    gpu_ck=($split --data "$DATA" --batch_size 2000 --epochs 1 --plot '' --device cuda)
    saving=(--checkpoint "$tmp/gpu_ck" --save_every 3 --async_save)
    rm -rf "$tmp/gpu_ck"
    (cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" --losses "$tmp/ck_ref.csv") > "$tmp/ck_ref.out" 2>&1
    (cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" --max_steps 7 "${saving[@]}") > /dev/null 2>&1
    (cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" "${saving[@]}" --losses "$tmp/ck_res.csv") > "$tmp/ck_res.out" 2>&1
    expect "fake GPU x2: ${split%% *}'s sharded checkpoint (${split#* }${saving[2]:+ ${saving[*]:2}}), saved at step 7 from GPU memory, resumes bit for bit (checksum $(checksum "$tmp/ck_res.out"))" \
        test -n "$(checksum "$tmp/ck_ref.out")" -a "$(checksum "$tmp/ck_res.out")" = "$(checksum "$tmp/ck_ref.out")" -a -n "$(grep '^Resumed' "$tmp/ck_res.out")" \
        -a "$(cat "$tmp/ck_res.csv" 2> /dev/null)" = "$(cat "$tmp/ck_ref.csv")"
done
# Step 20's the same way (--tp 2 on 2 GPUs: each c_attn shard three boxes of the whole weight, from
# GPU memory), saving with --async_save; and step 19 on the CPU resumes the GPU run's checkpoint: the
# GPU run's losses from there within 1e-5.
if [ -f data/shakespeare/input.txt ]; then
    small_gpt=(--n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --max_iters 12 --eval_interval 12 --eval_iters 2 --bias
               --batch_size 8 --sample 0 --plot '')
    gpu_ck=(day5/20_gpt_3d "${small_gpt[@]}" --tp 2 --device cuda)
    saving=(--checkpoint "$tmp/gpu_ck20" --save_every 3 --async_save)
    (cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" --losses "$tmp/ck_ref.csv") > "$tmp/ck_ref.out" 2>&1
    (cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" --max_iters 7 "${saving[@]}") > /dev/null 2>&1
    cp -r "$tmp/gpu_ck20" "$tmp/gpu_ck20_cpu"
    (cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=300 mpi 2 -x FAKE_GPU_COUNT "${gpu_ck[@]}" "${saving[@]}" --losses "$tmp/ck_res.csv") > "$tmp/ck_res.out" 2>&1
    expect "fake GPU x2: step 20's sharded checkpoint (--tp 2 ${saving[*]:2}), saved at step 7 from GPU memory, resumes bit for bit (checksum $(checksum "$tmp/ck_res.out"))" \
        test -n "$(checksum "$tmp/ck_ref.out")" -a "$(checksum "$tmp/ck_res.out")" = "$(checksum "$tmp/ck_ref.out")" -a -n "$(grep '^Resumed' "$tmp/ck_res.out")" \
        -a "$(cat "$tmp/ck_res.csv" 2> /dev/null)" = "$(cat "$tmp/ck_ref.csv")"
    RUN_TIMEOUT=300 run day5/19_gpt "${small_gpt[@]}" --device cpu --checkpoint "$tmp/gpu_ck20_cpu" --losses "$tmp/ck_cpu.csv" \
        > "$tmp/ck_cpu.out" 2>&1
    expect_same_losses "... and step 19 on the CPU resumes it ($(grep -c '^Resumed from .*saved by day5/20_gpt_3d, dp 1 x tp 2 x pp 1 on 2 ranks: step 7' "$tmp/ck_cpu.out") line says so): the GPU run's losses within 1e-5" \
        "$tmp/ck_ref.csv" "$tmp/ck_cpu.csv" 1e-5
fi
# No host wait inside a training step (issue 40): every GPU training program trains a few steps on
# 2 simulated GPUs, counting per step what its host waits for and launches (tests/fake_gpu/step_counts.sh
# prints one line each); the programs named here must make none in a steady step.
zero_wait_steps="2 3 4 6 7 8 10 11 13 14 14-1 15 15-1 16 17 18 19 20"
(cd "$src" && FAKE_GPU_COUNT=2 RUN_TIMEOUT=600 MPIRUN="$MPIRUN" DATA="$DATA" bash tests/fake_gpu/step_counts.sh "$tmp/counts") \
    > "$tmp/step_counts" 2>&1
grep -v -e '^zero-wait ' -e '^steady copies ' "$tmp/step_counts" | sed 's/^/  /'
for step in $zero_wait_steps; do
    waits=$(sed -n "s/^zero-wait step $step: //p" "$tmp/step_counts")
    expect "fake GPU x2: step $step's steady training step makes no host wait (${waits:-no count}; launches above)" test "$waits" = 0
done
# Step 15's steady step is its graph's launch alone: its inputs were queued for the epoch's steps
# (mf.c's queue_inputs, the sampler's RatingBatch.following), where a copy before each step put them.
for step in 15 15-1; do
    copies=$(sed -n "s/^steady copies step $step: //p" "$tmp/step_counts")
    expect "fake GPU x2: step $step's steady training step copies nothing to or from the GPU (${copies:-no count})" test "$copies" = 0
done
# tests/bench_gpu.sh, issue 40's one sitting on a GPU machine, runs every line at small sizes on 2
# simulated GPUs (QUICK=1), so that the script a GPU's few minutes go to cannot break unseen. Its
# figures mean nothing here (the simulated GPU runs kernels thread by thread), but each must be
# there: 13 of ours on 9 lines (step 15's lines hold the eager run's and one CPU core's too), each
# after its label's ": " and before PyTorch's " | ".
if [ -f data/shakespeare/input.txt ]; then
    (cd "$src" && FAKE_GPU_COUNT=2 QUICK=1 MPIRUN="$MPIRUN" DATA="$DATA" timeout 600 bash tests/bench_gpu.sh) > "$tmp/bench_gpu" 2>&1
    status=$?
    lines=$(grep -c '^step ' "$tmp/bench_gpu")
    figures=$(grep '^step ' "$tmp/bench_gpu" | sed -e 's/^[^:]*: //' -e 's/ | .*//' | grep -oE '[0-9]+(\.[0-9]+)?' | wc -l)
    expect "fake GPU x2: QUICK=1 tests/bench_gpu.sh runs to its end: exit $status, $figures of our 13 figures on $lines of its 9 lines" \
        test $status -eq 0 -a "$lines" -eq 9 -a "$figures" -eq 13
else
    skip "fake GPU x2: QUICK=1 tests/bench_gpu.sh (needs Tiny Shakespeare for step 19: make shakespeare)"
fi
