#!/usr/bin/env bash
# Step 20 (step 19's GPT split data x tensor x pipeline parallel), against step 19 from the same
# --init: at D = T = P = 1 step 19's losses and checksum bit for bit; every grid its per-iteration
# losses within 1e-5 over 20 iterations, and the gathered model (--save, the whole model in step
# 19's state_dict names) within 1e-5 of step 19's weights; the sample of the gathered model; bad
# grids refused in one line, exit 2.
# --zero 1 (AdamW's moments sharded over the replicas) takes DDP's steps bit for bit, with half the moments.
# --recompute (activation checkpointing) takes the same grid's steps without it bit for bit, holding fewer activations.
# --sp (sequence parallelism) takes step 19's steps as every grid does, holding fewer activations than the grid without it.
# --dropout takes step 19's steps: on whole models (D ranks) with either --dropout_rng, and split
# (--tp, --sp, --pp, --micro_batches; --recompute draws them again) with Philox's masks, each rank its part; --mlflow logs the
# run as the other steps do (an mlruns folder); a rank SIGKILLed in a 2 x 2 grid ends the job.
# --checkpoint: stopped and resumed bit for bit; resumed under another grid, by step 19, and from step
# 19's checkpoint, within 1e-5 of step 19's losses; made whole, --save's weights; another model's refused.
# make test (TEST_LEVEL=quick): 1 and 2 ranks (--dp 2 with and without --zero 1, --tp 2 with and without --sp, --pp 2
# with 1F1B, holding fewer micro-batches' activations than with GPipe); make test-all: the 4-rank grids (dp2 x tp2, tp2 x pp2, dp2 x pp2, pp4, tp4, with both schedules, --sp,
# --bias and --accum_steps) and 8 ranks (dp2 x tp2 x pp2). Needs data/shakespeare (make shakespeare); SKIP without it.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite gpt_3d
needs_built day5/19_gpt
needs_built day5/20_gpt_3d
needs_built build/tools/compare_h5_weights
scratch
RUN_TIMEOUT=300
MPI_FLAGS="--bind-to none"  # mpirun would bind each rank to one core, whatever --threads asks
SHAKESPEARE=${SHAKESPEARE_DATA:-data/shakespeare}
if [ ! -f "$SHAKESPEARE/input.txt" ]; then
    skip "step 20 (no $SHAKESPEARE/input.txt: make shakespeare, or SHAKESPEARE_MIRROR=DIR make shakespeare)"
    exit 0
fi
# same_gpt_weights WHAT A.h5 B.h5 TOLERANCE: lib.sh's same_weights for any state_dict (the GPT's).
same_gpt_weights() {
    local verdict
    verdict=$(build/tools/compare_h5_weights "$2" "$3" "$4" 2>&1)
    if [ $? -eq 0 ]; then pass "$1: $verdict"; else fail "$1: $verdict (tolerance $4)"; fi
}
short=(--data "$SHAKESPEARE" --plot '' --sample 0 --max_iters 20 --eval_interval 20 --eval_iters 2 --threads 1)

# ---------------------------------------------------------------- the references: step 19 on 1 and 2 ranks
run day5/19_gpt --data "$SHAKESPEARE" --plot '' --sample 0 --max_iters 0 --eval_iters 1 --save "$tmp/init.h5" > /dev/null 2>&1
run day5/19_gpt "${short[@]}" --init "$tmp/init.h5" --losses "$tmp/s19.csv" --save "$tmp/s19.h5" > "$tmp/s19.out" 2>&1 ||
    fail "step 19 did not run: $(tail -1 "$tmp/s19.out")"
mpi 2 day5/19_gpt "${short[@]}" --init "$tmp/init.h5" --losses "$tmp/s19dp2.csv" --save "$tmp/s19dp2.h5" > "$tmp/s19dp2.out" 2>&1 ||
    fail "step 19 did not run on 2 ranks: $(tail -1 "$tmp/s19dp2.out")"

# grid NP REFERENCE NAME FLAGS...: step 20 on NP ranks with FLAGS from the same --init takes the
# steps of step 19's REFERENCE run (s19: 1 rank; s19dp2: 2 ranks) and ends with its weights.
grid() {
    local np=$1 reference=$2 name=$3 verdict
    shift 3
    if ! mpi "$np" day5/20_gpt_3d "${short[@]}" --init "$tmp/init.h5" --losses "$tmp/$name.csv" --save "$tmp/$name.h5" "$@" > "$tmp/$name.out" 2>&1; then
        fail "$np ranks, $*: exit status $?: $(grep -a -m1 'error\|rank [0-9]* @' "$tmp/$name.out")"
        return
    fi
    verdict=$(same_losses "$tmp/$reference.csv" "$tmp/$name.csv" 1e-5)
    expect "$np ranks, $*: step 19's per-iteration losses ($reference): $verdict (<= 1e-5)" test $? -eq 0
    same_gpt_weights "... and the gathered model's weights (--save) are step 19's" "$tmp/$name.h5" "$tmp/$reference.h5" 1e-5
    # (Each rank checks its memory and its step's traffic against their formulas, and stops if they disagree.)
    expect "... each rank's traffic per step, as its theory: $(traffic_rows "$tmp/$name.out" | awk '{ printf "%s ", $2 + $3 + $4 + $5 }')MB" \
        test "$(traffic_rows "$tmp/$name.out" | wc -l)" -eq "$np"
}
# traffic_rows OUT: the rank rows of OUT's table of communication per training step.
traffic_rows() { sed -n '/^  rank  tensor-parallel MB/,/^[^ ]/p' "$1" | awk '$1 ~ /^[0-9]+$/'; }

# Dropout on whole models: D ranks draw each micro-batch's masks from step 19's seed for it, from
# either generator (a run with dropout used to stop at gpt_new_part's check).
for rng in torch $(thorough && echo philox); do
    mpi 2 day5/19_gpt "${short[@]}" --max_iters 10 --eval_interval 10 --init "$tmp/init.h5" --dropout 0.2 --dropout_rng $rng --losses "$tmp/s19dp2_drop_$rng.csv" \
        --save "$tmp/s19dp2_drop_$rng.h5" > "$tmp/s19dp2_drop_$rng.out" 2>&1 || fail "step 19 with --dropout did not run: $(tail -1 "$tmp/s19dp2_drop_$rng.out")"
    grid 2 "s19dp2_drop_$rng" "dp2_drop_$rng" --dp 2 --dropout 0.2 --dropout_rng $rng --max_iters 10 --eval_interval 10
done
# --dtype bfloat16: the split GEMMs round the operands that step 19's whole GEMMs round (element by
# element), and sum their partials in float32; step 19's bfloat16 steps within 1e-4 (float32's
# ordering differences, 1e-7, move an operand across a bfloat16 rounding here and there: 2^-8).
run day5/19_gpt "${short[@]}" --init "$tmp/init.h5" --dtype bfloat16 --losses "$tmp/s19bf16.csv" > "$tmp/s19bf16.out" 2>&1 ||
    fail "step 19 --dtype bfloat16 did not run: $(tail -1 "$tmp/s19bf16.out")"
mpi 2 day5/20_gpt_3d "${short[@]}" --init "$tmp/init.h5" --tp 2 --dtype bfloat16 --losses "$tmp/tp2bf16.csv" > "$tmp/tp2bf16.out" 2>&1 ||
    fail "step 20 --tp 2 --dtype bfloat16 did not run: $(tail -1 "$tmp/tp2bf16.out")"
expect_same_losses "--tp 2 --dtype bfloat16 ($(grep -c 'matmuls in bfloat16' "$tmp/tp2bf16.out") line says so): step 19's bfloat16 losses" \
    "$tmp/s19bf16.csv" "$tmp/tp2bf16.csv" 1e-4

# ---------------------------------------------------------------- --mlflow: the run in an mlruns folder
# As the other steps log (tests/test_tracking.sh): every flag a param, each iteration's loss the
# --losses CSV's, the train and validation losses at each evaluation, the grid's shape, the files.
mpi 2 day5/20_gpt_3d "${short[@]}" --init "$tmp/init.h5" --tp 2 --max_iters 10 --eval_interval 5 --losses "$tmp/tracked.csv" \
    --save "$tmp/tracked.h5" --mlflow "$tmp/mlruns" --experiment gpt3d > "$tmp/tracked.out" 2>&1
status=$?
if [ $status -ne 0 ]; then
    fail "step 20 with --mlflow FOLDER: exit $status: $(grep -a -m1 'error\|rank [0-9]* @' "$tmp/tracked.out")"
elif ! "$PYTHON" -c 'import yaml' 2> /dev/null; then
    skip "step 20's mlruns folder: tests/check_mlruns.py needs PyYAML in $PYTHON (apt-get install python3-yaml)"
elif ! "$PYTHON" tests/check_mlruns.py "$tmp/mlruns" --json "$tmp/mlruns.json" 2> "$tmp/check.err"; then
    fail "step 20's mlruns folder: tests/check_mlruns.py refuses it: $(head -3 "$tmp/check.err" | tr '\n' ' ')"
else
    expect_output "step 20 on 2 ranks (--tp 2) with --mlflow FOLDER: the run FINISHED, each iteration's loss the --losses CSV's, the flags and the grid as params, the files as artifacts" \
        "$PYTHON" tests/tracked_run.py "$tmp/mlruns.json" --experiment gpt3d --runs 1 --status FINISHED --losses "$tmp/tracked.csv" \
        --param tp=2 --param dp=1 --param pp=1 --param max_iters=10 --param world_size=2 --no_param mlflow --no_param experiment \
        --tag world_size=2 --tag mlflow.source.name=day5/20_gpt_3d.c --artifact "$tmp/tracked.csv" --artifact "$tmp/tracked.h5"
    evals=$("$PYTHON" -c 'import json, sys
sys.path.insert(0, "tests")
from tracked_run import runs_of
run = runs_of(json.load(open(sys.argv[1])), "gpt3d")[0]
print(sorted(step for step, _ in run["metrics"].get("val_loss", [])))' "$tmp/mlruns.json" 2>&1)
    expect "... and val_loss at the evaluations' iterations: $evals" test "$evals" = "[0, 5, 10]"
fi

# memory_rows OUT: the rank rows of OUT's memory table (on rank 0, after its header line).
memory_rows() { sed -n '/^  rank  replica  stage/,/^[^ ]/p' "$1" | awk '$1 ~ /^[0-9]+$/'; }
# recomputed NP NAME FLAGS...: the grid NAME ran with FLAGS, again with --recompute: the same float
# operations redone, so its losses and checksum bit for bit; and each rank's activations, as
# allocated (the memory table's figure, which the program checks against its formula), fewer.
recomputed() {
    local np=$1 name=$2 out
    shift 2
    out="$tmp/${name}_recompute"
    if ! mpi "$np" day5/20_gpt_3d "${short[@]}" --init "$tmp/init.h5" --losses "$out.csv" "$@" --recompute > "$out.out" 2>&1; then
        fail "$np ranks, $* --recompute: exit status $?: $(grep -a -m1 'error\|rank [0-9]* @' "$out.out")"
        return
    fi
    local same_losses=no
    test -s "$out.csv" && cmp -s "$tmp/$name.csv" "$out.csv" && same_losses=yes
    expect "$np ranks, $* --recompute: the losses without it, bit for bit ($(($(wc -l < "$out.csv") - 1)) iterations), and its checksum $(checksum "$out.out")" \
        test "$same_losses" = yes -a -n "$(checksum "$out.out")" -a "$(checksum "$out.out")" = "$(checksum "$tmp/$name.out")"
    holds_less "$out.out" "$tmp/${name%_sp}.out" --recompute  # (NAME_sp: its table's without is NAME's, without --sp)
}
# holds_less OUT PLAIN.out FLAG: the memory table of OUT (a run with FLAG) shows each rank's
# activations, as allocated (the program checks them against its formula), no more than those
# without FLAG and the most of any rank below theirs (a stage of one block that holds one
# micro-batch at a time, the last of pp4 under 1F1B, has nothing for --recompute to save), and
# those are what PLAIN.out (the same grid without FLAG) held.
holds_less() {
    local held
    held=$(memory_rows "$1" | awk 'NF == 10 { print $8 " of " $10 }' | tr '\n' ' ')
    expect "... each rank's activations, allocated, against those without $3 (MB): $held" \
        test -n "$held" -a "$(memory_rows "$1" | awk 'NF == 10 { if ($8 > $10) bad = 1; if ($8 > most) most = $8; if ($10 > without) without = $10 }
            END { print (bad || most >= without) }')" = 0
    expect "... and the ones without are what the run without $3 held" \
        test -n "$(memory_rows "$2")" -a "$(memory_rows "$1" | awk 'NF == 10 { print $1, $10 }')" = \
        "$(memory_rows "$2" | awk 'NF == 9 { print $1, $8 }')"
}
# sequence_parallel NP REFERENCE NAME FLAGS...: the grid NAME (FLAGS, with --tp) again with --sp:
# step 19's steps as every grid (within 1e-5: the LayerNorms' gradients are summed in another
# order), each rank holding fewer activations than NAME did.
sequence_parallel() {
    local np=$1 reference=$2 name=$3
    shift 3
    grid "$np" "$reference" "${name}_sp" "$@" --sp
    test -f "$tmp/${name}_sp.out" || return
    holds_less "$tmp/${name}_sp.out" "$tmp/$name.out" --sp
    # Between stages each rank sends its tokens only: 1/T of the pipeline's bytes without --sp.
    local pipeline
    pipeline=$(paste <(traffic_rows "$tmp/${name}_sp.out") <(traffic_rows "$tmp/$name.out") | awk '{ print $3 " vs " $8 }' | tr '\n' ' ')
    expect "... the pipeline's bytes a rank per step, 1/T of those without --sp: $pipeline" \
        test -n "$pipeline" -a "$(paste <(traffic_rows "$tmp/${name}_sp.out") <(traffic_rows "$tmp/$name.out") |
            awk -v T="$(printf '%s\n' "$@" | grep -A1 -x -- --tp | tail -1)" '{ if ($3 * T < $8 * 0.99 || $3 * T > $8 * 1.01) bad = 1 } END { print bad + 0 }')" = 0  # (MB to 3 decimals)
}

# ---------------------------------------------------------------- 1 rank: step 19 itself
run day5/20_gpt_3d "${short[@]}" --init "$tmp/init.h5" --losses "$tmp/one.csv" > "$tmp/one.out" 2>&1
expect "D = T = P = 1: step 19's losses bit for bit (20 iterations)" cmp -s "$tmp/s19.csv" "$tmp/one.csv"
expect "... and its parameter checksum: $(checksum "$tmp/one.out") (step 19: $(checksum "$tmp/s19.out"))" \
    test -n "$(checksum "$tmp/one.out")" -a "$(checksum "$tmp/one.out")" = "$(checksum "$tmp/s19.out")"

# ---------------------------------------------------------------- 2 ranks: one axis each
grid 2 s19dp2 dp2 --dp 2
expect "--dp 2: step 19's checksum on 2 ranks, bit for bit, from both replicas: $(checksum "$tmp/dp2.out") (step 19: $(checksum "$tmp/s19dp2.out"))" \
    test "$(grep -c 'parameter checksum' "$tmp/dp2.out")" -eq 2 -a "$(checksum "$tmp/dp2.out")" = "$(checksum "$tmp/s19dp2.out")"
# ZeRO-1: AdamW elementwise on each replica's 1/D of every tensor, then all-gathered: DDP's bits.
grid 2 s19dp2 dp2zero --dp 2 --zero 1
expect "--dp 2 --zero 1: step 19's checksum on 2 ranks, bit for bit: $(checksum "$tmp/dp2zero.out")" \
    test "$(checksum "$tmp/dp2zero.out")" = "$(checksum "$tmp/s19dp2.out")"
expect "... holding half of AdamW's moments: $(grep -A7 '^memory per rank' "$tmp/dp2zero.out" | awk '$1 == 0 && NF == 9 { print $7 " MB of AdamW for " $6 " MB of gradients (without: twice)" }')" \
    test "$(grep -A7 '^memory per rank' "$tmp/dp2zero.out" | awk '$1 == 0 && NF == 9 { print ($7 <= $6 * 1.001 && $7 >= $6 * 0.999) }')" = 1
grid 2 s19 tp2 --tp 2
sequence_parallel 2 s19 tp2 --tp 2
grid 2 s19 pp2 --pp 2 --micro_batches 2 --schedule 1f1b
# 1F1B holds fewer micro-batches' activations than GPipe: stage s min(P - s, M) of M, each in a slot.
grid 2 s19 pp2gpipe --pp 2 --micro_batches 2 --schedule gpipe
held=$(paste <(memory_rows "$tmp/pp2.out") <(memory_rows "$tmp/pp2gpipe.out") | awk '{ printf "stage %s %s of %s MB ", $3, $8, $17 }')
expect "... 1F1B's activations, stage s min(P - s, M) of GPipe's M micro-batches': $held" \
    test -n "$held" -a "$(paste <(memory_rows "$tmp/pp2.out") <(memory_rows "$tmp/pp2gpipe.out") |
        awk '{ want = $17 * ($3 == 0 ? 2 : 1) / 2; if ($8 < want * 0.995 || $8 > want * 1.005) bad = 1; n++ } END { print n == 2 && !bad }')" = 1
# idle_rows OUT: the stage rows of OUT's pipeline table (stage, forward ms, backward ms, idle, predicted).
idle_rows() { sed -n '/^  stage  forward ms  backward ms/,/^[^ ]/p' "$1" | awk '$1 ~ /^[0-9]+$/'; }
expect "... each stage's idle share, measured beside the schedule replayed with its times: $(idle_rows "$tmp/pp2.out" | awk '{ printf "stage %s %s (%s) ", $1, $4, $5 }')" \
    test "$(idle_rows "$tmp/pp2.out" | awk '{ gsub("%", ""); if ($2 > 0 && $3 > 0 && $4 >= 0 && $4 <= 100 && $5 >= 0 && $5 <= 100) n++ } END { print n + 0 }')" = 2
recomputed 2 pp2 --pp 2 --micro_batches 2 --schedule 1f1b

# Split models: each rank draws its part of every mask from Philox (--dropout_rng auto picks it for
# a split), at the values of step 19's whole mask for the same tokens: a micro-batch's rows (in any
# activation slot), a tensor-parallel rank's heads of each sequence, a stage's blocks, sequence
# parallelism's share of the rows. Against step 19 on 1 rank with --dropout_rng philox. With
# --recompute each block's masks are drawn again in backward: the same steps, bit for bit.
run day5/19_gpt "${short[@]}" --max_iters 10 --eval_interval 10 --init "$tmp/init.h5" --dropout 0.2 --dropout_rng philox \
    --losses "$tmp/s19_drop.csv" --save "$tmp/s19_drop.h5" > "$tmp/s19_drop.out" 2>&1 || fail "step 19 --dropout_rng philox did not run: $(tail -1 "$tmp/s19_drop.out")"
drop=(--dropout 0.2 --max_iters 10 --eval_interval 10)
grid 2 s19_drop tp2_drop --tp 2 "${drop[@]}"
expect "... each rank drawing its part of the masks from Philox (--dropout_rng auto on a split model): $(grep -a '^dropout' "$tmp/tp2_drop.out")" \
    grep -q "^dropout 0.2: masks from Philox, each rank drawing its part" "$tmp/tp2_drop.out"
grid 2 s19_drop pp2_drop --pp 2 --micro_batches 2 "${drop[@]}"
recomputed 2 pp2_drop --pp 2 --micro_batches 2 "${drop[@]}"
if thorough; then
    grid 2 s19_drop tp2m3_drop --tp 2 --micro_batches 3 "${drop[@]}"
    grid 2 s19_drop tp2_drop_sp --tp 2 --sp "${drop[@]}"
    recomputed 2 tp2_drop_sp --tp 2 --sp "${drop[@]}"  # (its table's without: tp2_drop's, without --sp)
    grid 4 s19_drop tp2pp2sp_drop --tp 2 --pp 2 --micro_batches 4 --schedule gpipe --sp "${drop[@]}"
    grid 4 s19dp2_drop_philox dp2tp2_drop --dp 2 --tp 2 --micro_batches 2 "${drop[@]}"  # (2 replicas: step 19 on 2 ranks)
fi

# ---------------------------------------------------------------- sharded checkpoints, any grid
# --tp 2 stopped at step 13 (--save_every 5) and resumed as itself: the uninterrupted run's losses
# and checksum bit for bit (the tp2 run above); the checkpoint made whole is --save's weights at
# step 13 (the file --init loads); resumed by another grid (--dp 2 --zero 1 at the same global batch: the moments cut by
# replicas now) and by step 19 on 1 rank, and step 19's checkpoint by --pp 2: step 19's losses
# within 1e-5; a checkpoint of another model: one line, exit 1.
cp_short=("${short[@]}" --init "$tmp/init.h5")
mpi 2 day5/20_gpt_3d "${cp_short[@]}" --tp 2 --max_iters 13 --save_every 5 --checkpoint "$tmp/ck" --save "$tmp/at13.h5" > "$tmp/ck_stop.out" 2>&1
expect "--tp 2 --max_iters 13 --save_every 5: steps $(grep -o '^Checkpoint of step [0-9]*' "$tmp/ck_stop.out" | awk '{ print $4 }' | paste -sd ' ') saved, each rank a shard ($(ls "$tmp/ck/step-000013" 2> /dev/null | paste -sd ' '))" \
    test "$(grep -o '^Checkpoint of step [0-9]*' "$tmp/ck_stop.out" | awk '{ print $4 }' | paste -sd ' ')" = "5 10 13" \
    -a "$(ls "$tmp/ck/step-000013" 2> /dev/null | paste -sd ' ')" = "index.h5 shard-00000.h5 shard-00001.h5"
for copy in zero 19; do cp -r "$tmp/ck" "$tmp/ck_$copy"; done
tools/checkpoint_to_state_dict "$tmp/ck" "$tmp/ck13.state.h5" > "$tmp/ck_whole.out" 2>&1
mpi 2 day5/20_gpt_3d "${short[@]}" --tp 2 --max_iters 0 --eval_iters 1 --init "$tmp/ck13.state.h5" --save "$tmp/ck13.h5" > "$tmp/ck_init.out" 2>&1
same_gpt_weights "... made whole by tools/checkpoint_to_state_dict, which --init loads: --save's weights at step 13" "$tmp/ck13.h5" "$tmp/at13.h5" 0
mpi 2 day5/20_gpt_3d "${cp_short[@]}" --tp 2 --checkpoint "$tmp/ck" --losses "$tmp/ck_tp2.csv" > "$tmp/ck_tp2.out" 2>&1
expect "... resumed as --tp 2 ($(grep -o '^Resumed from .*: step 13' "$tmp/ck_tp2.out" | sed "s|$tmp/||")): the uninterrupted losses and checksum $(checksum "$tmp/tp2.out"), bit for bit" \
    test -n "$(grep '^Resumed from .*/step-000013, saved by dp 1 x tp 2 x pp 1 on 2 ranks: step 13' "$tmp/ck_tp2.out")" \
    -a -n "$(checksum "$tmp/tp2.out")" -a "$(checksum "$tmp/ck_tp2.out")" = "$(checksum "$tmp/tp2.out")" \
    -a -s "$tmp/ck_tp2.csv" -a "$(cat "$tmp/ck_tp2.csv" 2> /dev/null)" = "$(cat "$tmp/tp2.csv")"
mpi 2 day5/20_gpt_3d "${cp_short[@]}" --dp 2 --zero 1 --batch_size 6 --checkpoint "$tmp/ck_zero" --losses "$tmp/ck_zero.csv" > "$tmp/ck_zero.out" 2>&1
expect_same_losses "... resumed as --dp 2 --zero 1 --batch_size 6 (resharded: $(grep -c '^Resumed from .*step 13.*; resharded' "$tmp/ck_zero.out")): step 19's losses within 1e-5" \
    "$tmp/s19.csv" "$tmp/ck_zero.csv" 1e-5
tools/checkpoint_to_state_dict "$tmp/ck_zero" "$tmp/ck_zero.state.h5" > "$tmp/ck_zero_whole.out" 2>&1
expect "... and its own save of step 20 says what saved it: $(sed "s|$tmp/||g; s|:.*||" "$tmp/ck_zero_whole.out")" \
    grep -q '^.*/step-000020 (day5/20_gpt_3d, dp 2 x tp 1 x pp 1 on 2 ranks, ZeRO-1, step 20)' "$tmp/ck_zero_whole.out"
run day5/19_gpt "${cp_short[@]}" --checkpoint "$tmp/ck_19" --losses "$tmp/ck_19.csv" > "$tmp/ck_19.out" 2>&1
expect_same_losses "... resumed by step 19 on 1 rank ($(grep -c '^Resumed from .*saved by day5/20_gpt_3d, dp 1 x tp 2 x pp 1 on 2 ranks: step 13' "$tmp/ck_19.out") line says so): step 19's losses within 1e-5" \
    "$tmp/s19.csv" "$tmp/ck_19.csv" 1e-5
run day5/19_gpt "${cp_short[@]}" --max_iters 7 --checkpoint "$tmp/ck_from19" > /dev/null 2>&1
mpi 2 day5/20_gpt_3d "${cp_short[@]}" --pp 2 --micro_batches 2 --checkpoint "$tmp/ck_from19" --losses "$tmp/ck_pp2.csv" > "$tmp/ck_pp2.out" 2>&1
expect_same_losses "step 19's checkpoint of step 7 resumed as --pp 2 ($(grep -c '^Resumed from .*saved by day5/19_gpt, DDP on 1 rank: step 7' "$tmp/ck_pp2.out") line says so): step 19's losses within 1e-5" \
    "$tmp/s19.csv" "$tmp/ck_pp2.csv" 1e-5
# An elastic restart (slurm/run_with_restarts.sh --min_ranks): --dp 2 stopped at step 13, resumed on
# 1 rank with --on_resize keep_batch (--accum_steps 2 keeps the global batch of 24): step 19's
# losses on 2 ranks within 1e-5.
mpi 2 day5/20_gpt_3d "${cp_short[@]}" --dp 2 --max_iters 13 --checkpoint "$tmp/ck_dp2" > /dev/null 2>&1
run day5/20_gpt_3d "${cp_short[@]}" --checkpoint "$tmp/ck_dp2" --on_resize keep_batch --losses "$tmp/ck_resized.csv" > "$tmp/ck_resized.out" 2>&1
expect_same_losses "--dp 2 stopped at step 13, resumed on 1 rank with --on_resize keep_batch ($(grep -o '(--accum_steps [0-9]*, was [0-9]*)' "$tmp/ck_resized.out")): step 19's losses on 2 ranks within 1e-5" \
    "$tmp/s19dp2.csv" "$tmp/ck_resized.csv" 1e-5
# The same command again with fewer iterations than the checkpoint holds (a guide's block run twice):
# evaluated once, nothing trained or saved, one line (it used to train on for good, past its arrays).
RUN_TIMEOUT=60 mpi 2 day5/20_gpt_3d "${cp_short[@]}" --tp 2 --max_iters 13 --checkpoint "$tmp/ck" > "$tmp/ck_past.out" 2>&1
status=$?
RUN_TIMEOUT=60 run day5/19_gpt "${cp_short[@]}" --max_iters 13 --checkpoint "$tmp/ck_19" > "$tmp/ck_past19.out" 2>&1
status19=$?
expect "a checkpoint of step 20 resumed with --max_iters 13, by step 20 (exit $status) and step 19 (exit $status19): one line, nothing saved" \
    test $status = 0 -a $status19 = 0 -a "$(cat "$tmp/ck/current")" = step-000020 -a "$(cat "$tmp/ck_19/current")" = step-000020 \
    -a -n "$(grep -x 'Nothing left to train: the checkpoint is at step 20 (--max_iters 13)' "$tmp/ck_past.out")" \
    -a -n "$(grep -x 'Nothing left to train: the checkpoint is at step 20 (--max_iters 13)' "$tmp/ck_past19.out")" \
    -a "$(grep -c '^step [0-9]*: train loss' "$tmp/ck_past.out")" = 1 -a "$(grep -c '^iter ' "$tmp/ck_past19.out")" = 0
mpi 2 day5/20_gpt_3d "${short[@]}" --tp 2 --n_embd 64 --checkpoint "$tmp/ck" > "$tmp/ck_other.out" 2>&1
status=$?
expect "a checkpoint of another model (--n_embd 64): exit $status, one line: $(grep -m1 'index.h5: ' "$tmp/ck_other.out" | sed "s|$tmp/||")" \
    test $status = 1 -a -n "$(grep "$tmp/ck/step-000020/index.h5: tensor 'transformer.wte.weight' is \[65, 128\], this model's is \[65, 64\]: a checkpoint of another model" "$tmp/ck_other.out")" \
    -a "$(cat "$tmp/ck/current")" = step-000020

# The gathered model is the whole model: from an --init, without training, --save gives it back
# as it was, and the sample is step 19's.
mpi 2 day5/20_gpt_3d --data "$SHAKESPEARE" --plot '' --max_iters 0 --eval_iters 1 --tp 2 --init "$tmp/init.h5" --save "$tmp/back.h5" \
    --sample 100 --prompt 'ROMEO:' > "$tmp/sample20.out" 2>&1
run day5/19_gpt --data "$SHAKESPEARE" --plot '' --max_iters 0 --eval_iters 1 --init "$tmp/init.h5" --sample 100 --prompt 'ROMEO:' > "$tmp/sample19.out" 2>&1
same_gpt_weights "--tp 2 --max_iters 0: --save is the --init, gathered from the 2 ranks' parts" "$tmp/back.h5" "$tmp/init.h5" 0
sample20=$(sed -n '/^sample (100 characters/,$p' "$tmp/sample20.out") sample19=$(sed -n '/^sample (100 characters/,$p' "$tmp/sample19.out")
expect "... and its sample is step 19's ($(printf '%s' "$sample20" | wc -c) bytes)" test -n "$sample20" -a "$sample20" = "$sample19"

# ---------------------------------------------------------------- 4 and 8 ranks (make test-all)
if thorough; then
    grid 4 s19dp2 dp2tp2 --dp 2 --tp 2
    grid 4 s19 tp2pp2 --tp 2 --pp 2 --micro_batches 2 --schedule gpipe
    grid 4 s19dp2 dp2pp2 --dp 2 --pp 2 --micro_batches 3 --schedule 1f1b
    grid 4 s19 pp4 --pp 4 --micro_batches 4 --schedule 1f1b
    grid 4 s19 pp4gpipe --pp 4 --micro_batches 2 --schedule gpipe
    grid 4 s19 tp4 --tp 4
    recomputed 4 dp2tp2 --dp 2 --tp 2
    recomputed 4 tp2pp2 --tp 2 --pp 2 --micro_batches 2 --schedule gpipe
    recomputed 4 dp2pp2 --dp 2 --pp 2 --micro_batches 3 --schedule 1f1b
    recomputed 4 pp4 --pp 4 --micro_batches 4 --schedule 1f1b
    recomputed 4 pp4gpipe --pp 4 --micro_batches 2 --schedule gpipe
    recomputed 4 tp4 --tp 4
    sequence_parallel 4 s19 tp4 --tp 4
    sequence_parallel 4 s19dp2 dp2tp2 --dp 2 --tp 2
    sequence_parallel 4 s19 tp2pp2 --tp 2 --pp 2 --micro_batches 2 --schedule gpipe
    recomputed 4 tp2pp2_sp --tp 2 --pp 2 --micro_batches 2 --schedule gpipe --sp
    grid 8 s19dp2 dp2tp2pp2 --dp 2 --tp 2 --pp 2 --micro_batches 2
    grid 8 s19dp2 dp2tp2pp2zero --dp 2 --tp 2 --pp 2 --micro_batches 2 --zero 1
    recomputed 8 dp2tp2pp2 --dp 2 --tp 2 --pp 2 --micro_batches 2
    sequence_parallel 8 s19dp2 dp2tp2pp2zero --dp 2 --tp 2 --pp 2 --micro_batches 2 --zero 1
    grid 8 s19 tp4pp2_sp --tp 4 --pp 2 --micro_batches 3 --schedule 1f1b --sp --recompute
    expect "8 ranks, --zero 1: the checksum of the same grid without it, bit for bit: $(checksum "$tmp/dp2tp2pp2zero.out")" \
        test -n "$(checksum "$tmp/dp2tp2pp2zero.out")" -a "$(checksum "$tmp/dp2tp2pp2zero.out")" = "$(checksum "$tmp/dp2tp2pp2.out")"
    # Checkpoints across grids: dp2 x tp2 x pp2 with --zero 1 (8 files, the moments in replica
    # blocks), saving from a thread (--async_save: steps 5 and 10; the last, 13, in line), stopped at
    # step 13; resumed as tp2 x pp2 with --sp on 4 ranks (batch 24: the same global batch) and by step
    # 19 on 2 ranks: step 19's losses on 2 ranks within 1e-5; and as itself, saving from a thread:
    # the same grid's uninterrupted run bit for bit.
    mpi 8 day5/20_gpt_3d "${cp_short[@]}" --dp 2 --tp 2 --pp 2 --micro_batches 2 --zero 1 --max_iters 13 --save_every 5 \
        --async_save --checkpoint "$tmp/ck8" > "$tmp/ck8_stop.out" 2>&1
    expect "8 ranks, --zero 1 --async_save stopped at step 13: $(ls "$tmp/ck8/step-000013" 2> /dev/null | grep -c shard) shard files, steps $(grep -o '^Checkpoint of step [0-9]* saved in .*written by a thread' "$tmp/ck8_stop.out" | awk '{ print $4 }' | paste -sd ' ') written by a thread" \
        test "$(ls "$tmp/ck8/step-000013" 2> /dev/null | grep -c shard)" = 8 \
        -a "$(grep -o '^Checkpoint of step [0-9]* saved in .*written by a thread' "$tmp/ck8_stop.out" | awk '{ print $4 }' | paste -sd ' ')" = "5 10"
    for copy in 4 19 8; do cp -r "$tmp/ck8" "$tmp/ck8_$copy"; done
    mpi 4 day5/20_gpt_3d "${cp_short[@]}" --tp 2 --pp 2 --micro_batches 2 --batch_size 24 --sp --checkpoint "$tmp/ck8_4" --losses "$tmp/ck8_4.csv" > "$tmp/ck8_4.out" 2>&1
    expect_same_losses "... resumed as --tp 2 --pp 2 --sp --batch_size 24 on 4 ranks ($(grep -c '^Resumed from .*saved by dp 2 x tp 2 x pp 2 on 8 ranks, ZeRO-1: step 13' "$tmp/ck8_4.out") line says so): step 19's losses (2 ranks) within 1e-5" \
        "$tmp/s19dp2.csv" "$tmp/ck8_4.csv" 1e-5
    mpi 2 day5/19_gpt "${cp_short[@]}" --checkpoint "$tmp/ck8_19" --losses "$tmp/ck8_19.csv" > "$tmp/ck8_19.out" 2>&1
    expect_same_losses "... resumed by step 19 on 2 ranks: its losses within 1e-5" "$tmp/s19dp2.csv" "$tmp/ck8_19.csv" 1e-5
    mpi 8 day5/20_gpt_3d "${cp_short[@]}" --dp 2 --tp 2 --pp 2 --micro_batches 2 --zero 1 --async_save --save_every 5 \
        --checkpoint "$tmp/ck8_8" --losses "$tmp/ck8_8.csv" > "$tmp/ck8_8.out" 2>&1
    expect "... resumed as itself, saving from a thread: the uninterrupted losses and checksum $(checksum "$tmp/dp2tp2pp2zero.out"), bit for bit" \
        test -n "$(grep '^Resumed from .*step-000013' "$tmp/ck8_8.out")" -a -n "$(checksum "$tmp/dp2tp2pp2zero.out")" \
        -a "$(checksum "$tmp/ck8_8.out")" = "$(checksum "$tmp/dp2tp2pp2zero.out")" -a -s "$tmp/ck8_8.csv" \
        -a "$(cat "$tmp/ck8_8.csv" 2> /dev/null)" = "$(cat "$tmp/dp2tp2pp2zero.csv")"
    # With biases (the row-parallel Linears' added once, after g) and accumulation (no_sync across
    # micro-steps and micro-batches): step 19 with the same flags.
    run day5/19_gpt --data "$SHAKESPEARE" --plot '' --sample 0 --max_iters 0 --eval_iters 1 --bias --save "$tmp/init_bias.h5" > /dev/null 2>&1
    run day5/19_gpt "${short[@]}" --bias --init "$tmp/init_bias.h5" --accum_steps 2 --batch_size 6 --losses "$tmp/s19bias.csv" --save "$tmp/s19bias.h5" > /dev/null 2>&1
    short+=(--bias --accum_steps 2 --batch_size 6)
    mpi 4 day5/20_gpt_3d "${short[@]}" --init "$tmp/init_bias.h5" --tp 2 --pp 2 --micro_batches 3 --losses "$tmp/bias.csv" --save "$tmp/bias.h5" > "$tmp/bias.out" 2>&1
    verdict=$(same_losses "$tmp/s19bias.csv" "$tmp/bias.csv" 1e-5)
    expect "4 ranks, --tp 2 --pp 2 --micro_batches 3 --bias --accum_steps 2: step 19's losses: $verdict (<= 1e-5)" test $? -eq 0
    same_gpt_weights "... and its weights" "$tmp/bias.h5" "$tmp/s19bias.h5" 1e-5
    # --sp with biases: the row-parallel Linears' added to this rank's rows after the reduce-scatter.
    mpi 4 day5/20_gpt_3d "${short[@]}" --init "$tmp/init_bias.h5" --tp 4 --sp --losses "$tmp/bias_sp.csv" --save "$tmp/bias_sp.h5" > "$tmp/bias_sp.out" 2>&1
    verdict=$(same_losses "$tmp/s19bias.csv" "$tmp/bias_sp.csv" 1e-5)
    expect "4 ranks, --tp 4 --sp --bias --accum_steps 2: step 19's losses: $verdict (<= 1e-5)" test $? -eq 0
    same_gpt_weights "... and its weights" "$tmp/bias_sp.h5" "$tmp/s19bias.h5" 1e-5
fi

# ---------------------------------------------------------------- a rank killed mid-step
# 4 ranks in a 2 x 2 grid (tensor-parallel pairs, two stages): one SIGKILLed while they train; the
# others, waiting in a collective or a pipeline exchange with it, are ended by Open MPI, not left
# waiting. (A lost NCCL peer: tests/test_gpu.sh, for steps 12, 13 and 15-17.)
killed_run=(--data "$SHAKESPEARE" --max_iters 100000 --eval_interval 100000 --eval_iters 1 --sample 0 --plot '' --threads 1)
KILLED_NP=4 KILLED_AFTER='^iter 0:' expect_killed_rank_ends_job "step 20 on 4 ranks (--tp 2 --pp 2), a rank killed mid-training" \
    day5/20_gpt_3d --tp 2 --pp 2 --micro_batches 2
unset killed_run

# ---------------------------------------------------------------- bad grids: one line, exit 2
DATA=$SHAKESPEARE
expect_refused_flags day5/20_gpt_3d 2 "a grid that is not the world" "error: --dp 1 --tp 1 --pp 1: a grid of 1 ranks, but the world has 2"
expect_refused_flags day5/20_gpt_3d 2 "--tp not dividing --n_head" "error: --tp 2: --n_head 3 is not a multiple of it" --tp 2 --n_head 3 --n_embd 96
expect_refused_flags day5/20_gpt_3d 2 "--pp not dividing --n_layer" "error: --pp 2: --n_layer 3 is not a multiple of it" --pp 2 --n_layer 3
expect_refused_flags day5/20_gpt_3d 2 "--micro_batches not dividing --batch_size" "error: --micro_batches 5: expected a divisor of --batch_size 12" --pp 2 --micro_batches 5
expect_refused_flags day5/20_gpt_3d 2 "an unknown --schedule" "error: --schedule expects one of gpipe|1f1b, got 'zigzag'" --pp 2 --schedule zigzag
expect_refused_flags day5/20_gpt_3d 2 "--zero 2" "error: --zero 2: expected 0 or 1" --dp 2 --zero 2
expect_refused_flags day5/20_gpt_3d 2 "--dropout_rng torch with a split model" "error: --dropout_rng torch with --tp, --pp, --micro_batches or --recompute: torch's generator draws whole masks once" --tp 2 --dropout 0.1 --dropout_rng torch
expect_refused_flags day5/20_gpt_3d 1 "--sp without --tp" "error: --sp: sequence parallelism cuts the tensor-parallel group's tokens, and needs --tp 2 or more" --sp
expect_refused_flags day5/20_gpt_3d 2 "--sp with tokens that do not split" "error: --sp: a micro-batch's 1 x 63 tokens do not split into --tp 2 equal parts" --tp 2 --sp --batch_size 1 --block_size 63
expect_refused_flags day5/20_gpt_3d 1 "--on_resize without --checkpoint" "error: --on_resize: only with --checkpoint DIR" --on_resize keep_batch
expect_refused_flags day5/20_gpt_3d 1 "--recompute with --dropout_rng torch" "error: --dropout_rng torch with --tp, --pp, --micro_batches or --recompute: torch's generator draws whole masks once" --recompute --dropout 0.1 --dropout_rng torch
exit_status
