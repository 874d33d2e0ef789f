#!/usr/bin/env bash
# Step 19 (nanoGPT's GPT under DDP, on Tiny Shakespeare), end to end: the PyTorch twin
# (tests/torch_gpt.py) takes the same steps from the same --init, and loads what we save and the
# reverse; DDP on 2 ranks with batch B takes the steps of 1 rank with --accum_steps 2; the same bits
# at any thread count; the sample; bad input refused in one line with nothing written.
# (The gradients against finite differences: build/tests/test_gpt.)
# make test (TEST_LEVEL=quick) leaves 4 ranks, dropout against the twin and under DDP, and the longer
# runs to make test-all (TEST_LEVEL=all). Needs data/shakespeare (make shakespeare); SKIP without it.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite gpt
needs_built day5/19_gpt
scratch
RUN_TIMEOUT=300
MPI_FLAGS="--bind-to none"  # mpirun would bind each rank to one core, whatever --threads asks
SHAKESPEARE=${SHAKESPEARE_DATA:-data/shakespeare}
val_loss_at() { sed -n "s/^step $2: train loss [0-9.]*, val loss \([0-9.]*\)$/\1/p" "$1"; }
# twin_csv TWIN.out: the twin's per-iteration losses (its last line, JSON) as a --losses CSV.
twin_csv() { tail -1 "$1" | "$PYTHON" -c 'import json, sys; print("step,epoch,loss"); [print(f"{i},0,{l!r}") for i, l in enumerate(json.load(sys.stdin)["losses"])]' 2> /dev/null; }

if [ ! -f "$SHAKESPEARE/input.txt" ]; then
    skip "step 19 (no $SHAKESPEARE/input.txt: make shakespeare, or SHAKESPEARE_MIRROR=DIR make shakespeare)"
    exit 0
fi
gpt=(day5/19_gpt --data "$SHAKESPEARE" --plot '' --sample 0)

# ---------------------------------------------------------------- the model's first line and an init
run "${gpt[@]}" --max_iters 0 --eval_iters 1 --save "$tmp/init.h5" > "$tmp/init.out" 2>&1
expect "the first line names the baby config and nanoGPT's parameter count: $(head -1 "$tmp/init.out" | cut -c1-120)" \
    grep -q '^Step 19: a GPT on 1 rank: 4 layers, 4 heads, 128 wide, context 64, vocabulary 65: 0.80M parameters (795904, and 8192 in wpe)' "$tmp/init.out"

# ---------------------------------------------------------------- the PyTorch twin
if ! "$PYTHON" -c 'import torch, h5py' 2> /dev/null; then
    skip "step 19 vs its PyTorch twin (python3-torch/python3-h5py not installed: ./setup.sh --with-reference)"
else
    # From our --init, 50 iterations of the baby config: the twin's loss at every iteration (1e-5
    # relative), and the validation loss after them to 4 decimals.
    run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 50 --eval_interval 50 --eval_iters 4 --losses "$tmp/c1.csv" > "$tmp/c1.out" 2>&1
    run "$PYTHON" tests/torch_gpt.py "$SHAKESPEARE" 1 --init "$tmp/init.h5" --max_iters 50 --eval_interval 50 --eval_iters 4 > "$tmp/t1.out" 2> "$tmp/t1.err" ||
        fail "the twin did not run: $(tail -1 "$tmp/t1.err")"
    twin_csv "$tmp/t1.out" > "$tmp/t1.csv"
    verdict=$(same_losses "$tmp/c1.csv" "$tmp/t1.csv" 1e-5)
    expect "the twin's losses from our --init, 50 iterations of the baby config: $verdict (<= 1e-5)" test $? -eq 0
    ours=$(val_loss_at "$tmp/c1.out" 50) theirs=$(val_loss_at "$tmp/t1.out" 50)
    expect "the validation loss after 50 iterations, to 4 decimals: ${ours:-none} (the twin: ${theirs:-none})" test -n "$ours" -a "$ours" = "$theirs"

    # --dtype bfloat16 (nanoGPT's --dtype: every product's operands rounded to bfloat16, float32 sums and
    # weights) against the twin under torch.autocast(dtype=torch.bfloat16), which also rounds each
    # product's result: within 2e-4 over the 50 iterations (7.1e-5 measured; 6.3e-5 on OpenBLAS's
    # Haswell kernels, 6.9e-5 on an AMD EPYC).
    run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 50 --eval_interval 50 --eval_iters 4 --dtype bfloat16 --losses "$tmp/cb.csv" > "$tmp/cb.out" 2>&1
    run "$PYTHON" tests/torch_gpt.py "$SHAKESPEARE" 1 --init "$tmp/init.h5" --max_iters 50 --eval_interval 50 --eval_iters 4 --dtype bfloat16 > "$tmp/tb.out" 2> "$tmp/tb.err" ||
        fail "the twin did not run under autocast: $(tail -1 "$tmp/tb.err")"
    twin_csv "$tmp/tb.out" > "$tmp/tb.csv"
    verdict=$(same_losses "$tmp/cb.csv" "$tmp/tb.csv" 2e-4)
    expect "--dtype bfloat16 vs the twin under torch.autocast(bfloat16), 50 iterations: $verdict (<= 2e-4)" test $? -eq 0
    # That the run computes what it says, against the twin that does just that (--dtype
    # bfloat16_operands: each matmul's operands rounded, float32 products and sums, in PyTorch's float32
    # kernels): nearer it than the float32 run is, by half at least (2.1e-5 against 7.4e-5 measured).
    # Not nearer autocast by a margin: how far autocast is from either depends on the CPU (oneDNN's
    # bfloat16 kernels; 6.9e-5 against 7.9e-5 on an AMD EPYC, where a margin of a fifth failed).
    # Not within float32's 1e-5 either: an operand that float32's order of sums moves across a
    # rounding boundary jumps by 2^-8, so the runs part faster than float32's do.
    run "$PYTHON" tests/torch_gpt.py "$SHAKESPEARE" 1 --init "$tmp/init.h5" --max_iters 50 --eval_interval 50 --eval_iters 4 --dtype bfloat16_operands > "$tmp/to.out" 2> "$tmp/to.err" ||
        fail "the twin did not run with rounded operands: $(tail -1 "$tmp/to.err")"
    twin_csv "$tmp/to.out" > "$tmp/to.csv"
    bf16=$(same_losses "$tmp/cb.csv" "$tmp/to.csv" 1 | awk '{ print $4 }') fp32=$(same_losses "$tmp/c1.csv" "$tmp/to.csv" 1 | awk '{ print $4 }')
    expect "--dtype bfloat16 is nearer the twin with rounded operands than float32 is: $bf16 vs $fp32 (at most half of it)" \
        awk "BEGIN { exit !($bf16 + 0 > 0 && $bf16 <= 0.5 * $fp32) }"

    # --dropout 0.2: the twin's masks are ours (torch's CPU bernoulli_ without MKL, seeded per micro-batch
    # alike), so the losses agree with dropout on too (make test-all; make test checks dropout's
    # gradients in build/tests/test_gpt).
    if thorough; then
        run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 20 --eval_interval 20 --eval_iters 2 --dropout 0.2 --losses "$tmp/cd.csv" > "$tmp/cd.out" 2>&1
        run "$PYTHON" tests/torch_gpt.py "$SHAKESPEARE" 1 --init "$tmp/init.h5" --max_iters 20 --eval_interval 20 --eval_iters 2 --dropout 0.2 > "$tmp/td.out" 2> "$tmp/td.err" ||
            fail "the twin did not run: $(tail -1 "$tmp/td.err")"
        twin_csv "$tmp/td.out" > "$tmp/td.csv"
        verdict=$(same_losses "$tmp/cd.csv" "$tmp/td.csv" 1e-5)
        expect "with --dropout 0.2, the twin's losses, 20 iterations: $verdict (<= 1e-5)" test $? -eq 0
        with=$(sed -n 2p "$tmp/cd.csv" | cut -d, -f3) without=$(sed -n 2p "$tmp/c1.csv" | cut -d, -f3)
        expect "... and dropout acts: the first loss is $with with it, $without without" test -n "$with" -a "$with" != "$without"
    fi

    # The whole schedule and the clipping: warm-up for 10 iterations, the cosine down to min_lr at 30,
    # min_lr after it, and every step clipped (0.05 is below the gradients' norms; under Adam a clip
    # moves the steps only as its ratio varies from step to step: iteration 1's loss 4.09894 against
    # 4.09891 unclipped), in 40 iterations (make test-all; the baby config's 50 stay in its warm-up).
    if thorough; then
        sched=(--init "$tmp/init.h5" --max_iters 40 --eval_interval 40 --eval_iters 2 --warmup_iters 10 --lr_decay_iters 30 --grad_clip 0.05)
        run "${gpt[@]}" "${sched[@]}" --losses "$tmp/cs.csv" > "$tmp/cs.out" 2>&1
        run "$PYTHON" tests/torch_gpt.py "$SHAKESPEARE" 1 "${sched[@]}" > "$tmp/ts.out" 2> "$tmp/ts.err" ||
            fail "the twin did not run: $(tail -1 "$tmp/ts.err")"
        twin_csv "$tmp/ts.out" > "$tmp/ts.csv"
        verdict=$(same_losses "$tmp/cs.csv" "$tmp/ts.csv" 1e-5)
        expect "warm-up, cosine decay, min_lr and clipping at 0.05, 40 iterations: the twin's losses, $verdict (<= 1e-5)" test $? -eq 0
    fi

    # The reverse: we start from the twin's init (torch's own draws, saved by h5py) and evaluate it alike.
    run "$PYTHON" tests/torch_gpt.py "$SHAKESPEARE" 1 --max_iters 0 --eval_iters 2 --save "$tmp/torch.h5" > "$tmp/t2.out" 2> "$tmp/t2.err" ||
        fail "the twin did not run: $(tail -1 "$tmp/t2.err")"
    run "${gpt[@]}" --init "$tmp/torch.h5" --max_iters 0 --eval_iters 2 > "$tmp/c2.out" 2>&1
    ours=$(grep '^step 0:' "$tmp/c2.out") theirs=$(grep '^step 0:' "$tmp/t2.out")
    expect "from the twin's --save (its own init, with lm_head.weight), the same evaluation: ${ours:-none} (the twin: ${theirs:-none})" \
        test -n "$ours" -a "$ours" = "$theirs"

    # DDP against torch DDP (gloo): 2 ranks each, from the same --init (50 iterations in make test-all).
    iters=$(if thorough; then echo 50; else echo 20; fi)
    mpi 2 "${gpt[@]}" --init "$tmp/init.h5" --max_iters "$iters" --eval_interval "$iters" --eval_iters 2 --threads 1 --losses "$tmp/c3.csv" > "$tmp/c3.out" 2>&1
    run "$PYTHON" tests/torch_gpt.py "$SHAKESPEARE" 2 --init "$tmp/init.h5" --max_iters "$iters" --eval_interval "$iters" --eval_iters 2 --threads 1 --port "$(free_port)" > "$tmp/t3.out" 2> "$tmp/t3.err" ||
        fail "the twin did not run on 2 ranks: $(tail -1 "$tmp/t3.err")"
    twin_csv "$tmp/t3.out" > "$tmp/t3.csv"
    verdict=$(same_losses "$tmp/c3.csv" "$tmp/t3.csv" 1e-5)
    expect "DDP on 2 ranks vs the twin under torch DDP (gloo), $iters iterations: $verdict (<= 1e-5)" test $? -eq 0
    ours=$(val_loss_at "$tmp/c3.out" "$iters") theirs=$(val_loss_at "$tmp/t3.out" "$iters")
    expect "... and the validation loss, to 4 decimals: ${ours:-none} (the twin: ${theirs:-none})" test -n "$ours" -a "$ours" = "$theirs"
fi

# ---------------------------------------------------------------- DDP: 2 ranks x B == 1 rank x accum 2
# One global batch per iteration, rank r's micro-step m taking slice r * accum + m: 2 ranks with
# batch 12 see the windows of 1 rank's 2 micro-steps of 12, and DDP's mean over ranks is the
# accumulation's mean over micro-steps. Only the order of float sums differs.
run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 20 --eval_interval 20 --eval_iters 2 --accum_steps 2 --threads 2 --losses "$tmp/accum.csv" > "$tmp/accum.out" 2>&1
mpi 2 "${gpt[@]}" --init "$tmp/init.h5" --max_iters 20 --eval_interval 20 --eval_iters 2 --threads 1 --losses "$tmp/ddp2.csv" --save "$tmp/ddp2.h5" > "$tmp/ddp2.out" 2>&1
verdict=$(same_losses "$tmp/accum.csv" "$tmp/ddp2.csv" 1e-5)
expect "DDP on 2 ranks x 12 windows takes the steps of 1 rank x 2 micro-steps of 12 (20 iterations): $verdict (<= 1e-5)" test $? -eq 0
expect "... and evaluates alike: $(val_loss_at "$tmp/ddp2.out" 20) (1 rank: $(val_loss_at "$tmp/accum.out" 20))" \
    test -n "$(val_loss_at "$tmp/ddp2.out" 20)" -a "$(val_loss_at "$tmp/ddp2.out" 20)" = "$(val_loss_at "$tmp/accum.out" 20)"
expect "both ranks end with the same parameters: $(grep -c 'parameter checksum' "$tmp/ddp2.out") checksum lines, distinct: $(checksum "$tmp/ddp2.out")" \
    test "$(grep -c 'parameter checksum' "$tmp/ddp2.out")" -eq 2 -a "$(checksum "$tmp/ddp2.out" | wc -w)" -eq 1
if thorough; then
    run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 20 --eval_interval 20 --eval_iters 2 --accum_steps 4 --batch_size 6 --losses "$tmp/accum4.csv" > /dev/null 2>&1
    mpi 4 "${gpt[@]}" --init "$tmp/init.h5" --max_iters 20 --eval_interval 20 --eval_iters 2 --batch_size 6 --threads 1 --losses "$tmp/ddp4.csv" > /dev/null 2>&1
    verdict=$(same_losses "$tmp/accum4.csv" "$tmp/ddp4.csv" 1e-5)
    expect "DDP on 4 ranks x 6 takes the steps of 1 rank x 4 micro-steps of 6: $verdict (<= 1e-5)" test $? -eq 0
    mpi 2 "${gpt[@]}" --init "$tmp/init.h5" --max_iters 20 --eval_interval 20 --eval_iters 2 --batch_size 6 --accum_steps 2 --threads 1 --losses "$tmp/ddp2a2.csv" > /dev/null 2>&1
    verdict=$(same_losses "$tmp/accum4.csv" "$tmp/ddp2a2.csv" 1e-5)
    expect "DDP on 2 ranks x 2 micro-steps of 6 takes the same steps: $verdict (<= 1e-5)" test $? -eq 0
fi

# With dropout too: each micro-batch of the global batch draws its masks from its own seed, whichever
# rank draws them; from either generator (Philox's masks are keyed by that seed too).
if thorough; then
    for rng in torch philox; do
        run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 10 --eval_interval 10 --eval_iters 1 --accum_steps 2 --dropout 0.2 --dropout_rng $rng --losses "$tmp/accumd.csv" > /dev/null 2>&1
        mpi 2 "${gpt[@]}" --init "$tmp/init.h5" --max_iters 10 --eval_interval 10 --eval_iters 1 --threads 1 --dropout 0.2 --dropout_rng $rng --losses "$tmp/ddp2d.csv" > /dev/null 2>&1
        verdict=$(same_losses "$tmp/accumd.csv" "$tmp/ddp2d.csv" 1e-5)
        expect "with --dropout 0.2 (--dropout_rng $rng), DDP on 2 ranks takes the steps of 1 rank x 2 micro-steps: $verdict (<= 1e-5)" test $? -eq 0
    done
    # The generators draw other masks: the same run with each takes other steps.
    run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 10 --eval_interval 10 --eval_iters 1 --accum_steps 2 --dropout 0.2 --dropout_rng torch --losses "$tmp/accumd_torch.csv" > /dev/null 2>&1
    expect "--dropout_rng philox and torch drop other values: the first losses $(sed -n 2p "$tmp/accumd.csv" | cut -d, -f3) and $(sed -n 2p "$tmp/accumd_torch.csv" | cut -d, -f3)" \
        test "$(sed -n 2p "$tmp/accumd.csv")" != "$(sed -n 2p "$tmp/accumd_torch.csv")"
fi

# ---------------------------------------------------------------- threads: the same bits
run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 5 --eval_interval 5 --eval_iters 1 --threads 1 > "$tmp/t1thread.out" 2>&1
run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 5 --eval_interval 5 --eval_iters 1 --threads 2 > "$tmp/t2thread.out" 2>&1
expect "--threads 1 and 2 end with the same bits: $(checksum "$tmp/t1thread.out") / $(checksum "$tmp/t2thread.out")" \
    test -n "$(checksum "$tmp/t1thread.out")" -a "$(checksum "$tmp/t1thread.out")" = "$(checksum "$tmp/t2thread.out")"
if thorough; then
    run "${gpt[@]}" --init "$tmp/init.h5" --max_iters 5 --eval_interval 5 --eval_iters 1 --threads 3 > "$tmp/t3thread.out" 2>&1
    expect "--threads 3 too: $(checksum "$tmp/t3thread.out")" test "$(checksum "$tmp/t1thread.out")" = "$(checksum "$tmp/t3thread.out")"
fi

# ---------------------------------------------------------------- the sample
run day5/19_gpt --data "$SHAKESPEARE" --plot '' --init "$tmp/ddp2.h5" --max_iters 0 --eval_iters 1 --sample 150 --prompt 'ROMEO:' > "$tmp/s1.out" 2>&1
run day5/19_gpt --data "$SHAKESPEARE" --plot '' --init "$tmp/ddp2.h5" --max_iters 0 --eval_iters 1 --sample 150 --prompt 'ROMEO:' > "$tmp/s2.out" 2>&1
sample=$(sed -n '/^sample (150 characters/,$p' "$tmp/s1.out" | tail -n +2)
expect "--sample 150 --prompt 'ROMEO:' prints the prompt and 150 characters of the text's alphabet ($(printf '%s' "$sample" | wc -c) bytes)" \
    test "$(printf '%s' "$sample" | head -c 6)" = "ROMEO:" -a "$(printf '%s' "$sample" | wc -c)" -eq 156 -a \
    "$(printf '%s' "$sample" | LC_ALL=C tr -d "$(LC_ALL=C tr -d '\n' < "$SHAKESPEARE/input.txt" | fold -w1 | sort -u | tr -d '\n' | sed 's/[]\\[^-]/\\&/g')\n" | wc -c)" -eq 0
expect "the same seed gives the same sample$(cmp -s "$tmp/s1.out" "$tmp/s2.out" || diff "$tmp/s1.out" "$tmp/s2.out" | head -5 | tr '\n' ' ' | sed 's/^/: differs: /')" \
    cmp -s "$tmp/s1.out" "$tmp/s2.out"

# ---------------------------------------------------------------- bad input: one line, exit 1 or 2, nothing written
# refused WHAT STATUS PATTERN ARGS...: day5/19_gpt with ARGS (--save and --losses added) exits STATUS,
# its one line of ours matches PATTERN, and neither file exists afterwards.
refused() {
    local what=$1 want=$2 pattern=$3
    shift 3
    rm -f "$tmp/bad.h5" "$tmp/bad.csv"
    timeout 120 day5/19_gpt --plot '' --save "$tmp/bad.h5" --losses "$tmp/bad.csv" --max_iters 2 --eval_iters 1 "$@" > "$tmp/out" 2> "$tmp/err"
    local status=$? ours
    ours=$(cat "$tmp/out" "$tmp/err" | grep -aE '^\[rank [0-9]+ @|^error:')
    expect "$what: exit $status ($want), one line, nothing written: $(head -c 300 <<< "$ours")" \
        test "$status" -eq "$want" -a "$(grep -c . <<< "$ours")" -eq 1 -a "$(grep -acE -- "$pattern" <<< "$ours")" -eq 1 -a \
        "$(wc -l < "$tmp/err")" -eq 1 -a ! -e "$tmp/bad.h5" -a ! -e "$tmp/bad.csv"
}
mkdir -p "$tmp/missing" "$tmp/empty" "$tmp/short" "$tmp/other"
: > "$tmp/empty/input.txt"
head -c 100 "$SHAKESPEARE/input.txt" > "$tmp/short/input.txt"
head -c 20000 "$SHAKESPEARE/input.txt" | tr 'a-z' 'A-Z' > "$tmp/other/input.txt"  # another vocabulary
refused "a --data folder without input.txt" 1 "missing/input\.txt: cannot open: No such file or directory \(make shakespeare" --data "$tmp/missing"
refused "an empty input.txt" 1 "empty/input\.txt: 0 characters, 0 to train and 0 to validate: each part needs at least --block_size \+ 1 = 65" --data "$tmp/empty"
refused "a text shorter than block_size + 1 in its validation tenth" 1 "short/input\.txt: 100 characters, 90 to train and 10 to validate: each part needs at least --block_size \+ 1 = 65" --data "$tmp/short"
refused "--n_embd not divisible by --n_head" 2 "^error: --n_embd 100 is not divisible by --n_head 3" --data "$SHAKESPEARE" --n_embd 100 --n_head 3
refused "a learning rate that diverges (--learning_rate 1e30)" 1 "the train loss at iteration 2 is nan: training diverged; .*stopped before writing anything" \
    --data "$SHAKESPEARE" --learning_rate 1e30 --eval_interval 2 --max_iters 3
refused "flags that would not fit memory" 2 "^error: --n_layer 4 --n_embd 1024 --block_size 64 --batch_size 100000 needs about [0-9.]+ TB per rank \(parameters" \
    --data "$SHAKESPEARE" --n_embd 1024 --n_head 8 --batch_size 100000
refused "--dropout 1" 2 "^error: --dropout 1 is not a probability in \[0, 1\)" --data "$SHAKESPEARE" --dropout 1
refused "--block_size 0" 2 "^error: --block_size expects an integer from 1" --data "$SHAKESPEARE" --block_size 0
refused "an --init of another width" 1 "init\.h5: dataset 'transformer\.wte\.weight' is float32 \[65, 128\] \(expected float32 \[65, 64\]\)" \
    --data "$SHAKESPEARE" --n_embd 64 --init "$tmp/init.h5"
refused "an --init of more layers" 1 "init\.h5: holds 'transformer\.h\.2\.attn\.c_attn\.weight', which this model does not have" \
    --data "$SHAKESPEARE" --n_layer 2 --init "$tmp/init.h5"
refused "an --init of another vocabulary" 1 "init\.h5: dataset 'transformer\.wte\.weight' is float32 \[65, 128\] \(expected float32 \[[0-9]+, 128\]\)" \
    --data "$tmp/other" --init "$tmp/init.h5"
refused "--prompt with a character outside the vocabulary" 2 "^error: --prompt 'Hello\{': its character 6, '\{', is not in the vocabulary of .*input\.txt \(65 characters\)" \
    --data "$SHAKESPEARE" --sample 10 --prompt 'Hello{'
# --device cuda where there is no GPU: refused by device_from_flag, in one line (exit 1; in a build
# without CUDA, exit 2: a usage error). Where there is one it trains: tests/test_gpu.sh compares its
# steps with the CPU's.
if ! grep -q 'HAVE_CUDA=1' build/flags 2> /dev/null; then
    refused "--device cuda in a build without CUDA" 2 "^error: --device cuda: this build has no GPU code" --data "$SHAKESPEARE" --device cuda
elif [ "$(build/tools/gpu_count 2> /dev/null || echo 0)" = 0 ]; then
    refused "--device cuda without a GPU" 1 "--device cuda" --data "$SHAKESPEARE" --device cuda
fi
exit_status
