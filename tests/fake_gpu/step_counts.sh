#!/usr/bin/env bash
# Host waits and launches per training step of every GPU training program, on the simulated GPU.
#
#   FAKE_GPU_COUNT=2 bash tests/fake_gpu/step_counts.sh OUT_DIR [PROGRAM...]
#
# Run in a tree built with `make CUDA=1 FAKE_GPU=1` (tests/test_fake_gpu.sh does). Each program
# trains for a few epochs or steps with FAKE_GPU_COUNTS set (tests/fake_gpu/fake_gpu.cpp: every
# process writes its counts per step, a step ending where the optimizer calls device_mark_step),
# and one line per program says, for the steady step, the host waits and launches that most of
# its steps show (the steps that hold an epoch's end or a print differ; the line says how many
# and their most waits), over all ranks the worst:
#   step 2 (1 rank, 59 steps): 4 host waits, 17 launches and 2 copies per steady step (the most in one step: 4) [...]
# Then, for each program, the lines
#   zero-wait step 2: 0
#   steady copies step 2: 2
# which tests/test_fake_gpu.sh turns into PASS or FAIL (no wait in any; no copy in step 15's).
# `[...]`: what the worst rank waited in, in one of its steady steps. OUT_DIR/kernels_NAME.RANK: what
# each rank launched in a steady step, in order (kernels, GEMMs, NCCL operations, graphs).
set -u
out=$1; shift
mkdir -p "$out"
# MPIRUN as tests/lib.sh has it: the command and its flags, split at spaces.
: "${MPIRUN:=mpirun --oversubscribe}"
: "${DATA:=data/mnist}"
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
limit=${RUN_TIMEOUT:-600}

# The programs, each: its name (the step's number), ranks, command.
declare -A np command
add() { local name=$1 ranks=$2; shift 2; np[$name]=$ranks; command[$name]=$(printf '%q ' "$@"); }
mnist=(--data "$DATA" --batch_size 2000 --plot '' --device cuda)
add 2 1 day1/2_mnist_training "${mnist[@]}" --epochs 2
add 3 2 day1/3_mnist_distributed "${mnist[@]}" --epochs 2
add 4 2 day1/4_mnist_manual_ddp "${mnist[@]}" --epochs 2
add 5 2 day1/5_mnist_manual_ddp_profile "${mnist[@]}" --epochs 2
add 6 2 day1/6_mnist_ddp "${mnist[@]}" --epochs 2
add 7 2 day1/7_mnist_ddp_timing "${mnist[@]}" --epochs 2 --results "$out/7_results.csv" --chart ''
add 8 2 day1/8_mnist_ddp_lr "${mnist[@]}" --epochs 2
add 10 2 day2/10_mnist_ddp_multinode "${mnist[@]}" --epochs 2
add 11 2 day2/11_multinode_streaming --h5 "$out/mnist.h5" --batch_size 2000 --plot '' --device cuda --epochs 2
add 13 2 day3/13_fault_tolerant_ddp "${mnist[@]}" --total_epochs 2 --snapshot "$out/13_snapshot.h5"
add 14 2 day3/14_cnn_ddp --data "$DATA" --batch_size 64 --plot '' --device cuda --max_steps 12
# Steps 14 and 15 replay their step from a CUDA graph (--cuda_graph on): on 2 ranks (2 simulated GPUs) with
# NCCL's collectives inside it; on 1 rank with none.
add 14-1 1 day3/14_cnn_ddp --data "$DATA" --batch_size 64 --plot '' --device cuda --max_steps 12
add 15 2 day3/15_recommender_ddp --data "$out/movielens" --batch_size 1000 --epochs 2 --plot '' --device cuda
add 15-1 1 day3/15_recommender_ddp --data "$out/movielens" --batch_size 1000 --epochs 2 --plot '' --device cuda
add 16 2 day4/16_pipeline_ddp "${mnist[@]}" --epochs 1 --pp 2 --micro_batches 4
add 17 2 day4/17_tensor_parallel "${mnist[@]}" --epochs 1 --tp 2
add 18 2 day4/18_zero_sharding "${mnist[@]}" --epochs 1 --zero 3
add 19 2 day5/19_gpt --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --batch_size 4 --max_iters 12 --eval_interval 12 \
    --eval_iters 2 --sample 0 --plot '' --device cuda
add 20 2 day5/20_gpt_3d --pp 2 --micro_batches 2 --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --batch_size 4 \
    --max_iters 12 --eval_interval 12 --eval_iters 2 --sample 0 --plot '' --device cuda
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(2 3 4 5 6 7 8 10 11 13 14 14-1 15 15-1 16 17 18 19 20)

for name in "${names[@]}"; do
    [ -n "${command[$name]:-}" ] || { echo "step_counts.sh: no program $name" >&2; exit 2; }
    # Step 15's --synthetic writes its ratings into its --data folder: one of our own, never data/movielens.
    if [ "$name" = 15 ] || [ "$name" = 15-1 ]; then
        mkdir -p "$out/movielens"
        day3/15_recommender_ddp --data "$out/movielens" --synthetic 20000 > /dev/null 2>&1
    fi
    if [ "$name" = 11 ] && [ ! -f "$out/mnist.h5" ]; then
        day2/create_mnist_h5 --data "$DATA" --out "$out/mnist.h5" > /dev/null 2>&1
    fi
    rm -f "$out/counts_$name".* "$out/kernels_$name".*
    eval "program=(${command[$name]})"
    FAKE_GPU_COUNTS="$out/counts_$name" timeout "$limit" $MPIRUN --bind-to none -x FAKE_GPU_COUNTS -x FAKE_GPU_COUNT \
        -np "${np[$name]}" "${program[@]}" > "$out/run_$name" 2>&1
    status=$?
    if [ $status -ne 0 ] || ! ls "$out/counts_$name".* > /dev/null 2>&1; then
        echo "step $name: the run failed (status $status): $(tail -2 "$out/run_$name" | tr '\n' ' ')"
        echo "zero-wait step $name: no counts"
        continue
    fi
    # Per rank: the most common waits among its steps, the launches most common among those steps,
    # the steps, the most waits of a step, and (rank 0) the kinds of a steady step's waits.
    for f in "$out/counts_$name".*; do
        awk '/^step / { n++; w[$4]++; if ($4 > most) most = $4; line[$4] = $0; wl[$4 " " $6]++; key = $4 " " $6
                        if (!(key in copies)) copies[key] = $8 }
             /^  launched:/ { if (!(key in launched)) launched[key] = $0 }
             END {
                 for (v in w) if (mode == "" || w[v] > w[mode] || (w[v] == w[mode] && v + 0 < mode + 0)) mode = v
                 for (k in wl) { split(k, p, " "); if (p[1] == mode && (best == "" || wl[k] > wl[best])) best = k }
                 split(best, p, " "); kinds = line[mode]; sub(/^[^[]*/, "", kinds)
                 print mode + 0, p[2] + 0, copies[best] + 0, n + 0, most + 0, n - w[mode], kinds
                 if (best in launched) { sub(/^  launched: /, "", launched[best]); print launched[best] > kernels }
             }' kernels="$out/kernels_$name.${f##*.}" "$f"
    done > "$out/steady_$name"
    read -r waits launches copies steps most others kinds < <(sort -k1,1nr "$out/steady_$name" | head -1)
    [ -n "${steps:-}" ] && [ "$steps" -ge 3 ] || {
        echo "step $name: too few steps counted (${steps:-0})"
        echo "zero-wait step $name: no counts"
        continue
    }
    ranks=${np[$name]}
    echo "step $name ($ranks rank$([ "$ranks" = 1 ] || echo s), $steps steps): $waits host waits, $launches launches and" \
         "$copies copies per steady step ($others other steps, at most $most waits in one) ${kinds}"
    echo "zero-wait step $name: $waits"
    echo "steady copies step $name: $copies"
done
