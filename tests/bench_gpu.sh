#!/usr/bin/env bash
# Benchmark (not a test): issue 40's figures on one GPU, each beside its PyTorch yardstick on the
# same GPU, in one sitting (make bench runs it where there is a GPU):
#   - step 2's steady step (float32 and --dtype        (tests/torch_fast_mlp.py: resident data, eager)
#     bfloat16) and first epoch
#   - step 14's epoch                                  (tests/torch_cnn_ddp.py --device cuda)
#   - step 15's epoch at 5 M synthetic ratings         (graph and eager, one CPU core of ours; 2 GPUs)
#   - step 19's tokens/s at nanoGPT's GPU config,      (tests/torch_gpt.py --device cuda, float32 and
#     float32 and --dtype bfloat16                      --dtype bfloat16 under autocast)
#
#   tests/bench_gpu.sh              on a machine with a GPU (build/tools/gpu_count > 0)
#   QUICK=1 tests/bench_gpu.sh      small sizes: the script itself (the simulated GPU runs it)
#
# Each figure is a line "NAME: OURS | PYTORCH | TARGET", from the programs' own printed times (the
# training loop as each reports it: ours after torch.cuda.synchronize's twin, PyTorch's likewise).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=${DATA:-data/mnist}
quick=${QUICK:-0}
[ "$(build/tools/gpu_count 2> /dev/null || echo 0)" -gt 0 ] || { echo "bench_gpu.sh: no GPU here (build/tools/gpu_count)" >&2; exit 1; }
torch_cuda=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))' 2> /dev/null || echo 0)
[ "$torch_cuda" = 1 ] || echo "(PyTorch sees no GPU: its columns stay empty)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null | sed 's/^/GPU: /' || true

# Step 2: --epochs E; the first epoch's seconds, and the steady step: the median epoch after the first
# over its steps.
epochs=50 ratings=5000000 block=256 batch=64 gpt=(--n_layer 6 --n_head 6 --n_embd 384 --dropout 0.2) iters=20
[ "$quick" = 1 ] && epochs=3 ratings=20000 block=16 batch=4 gpt=(--n_layer 2 --n_head 2 --n_embd 32) iters=3
gpt+=(--block_size "$block" --batch_size "$batch")
day1/2_mnist_training --data "$DATA" --device cuda --epochs "$epochs" --plot '' > "$out/s2" 2>&1
day1/2_mnist_training --data "$DATA" --device cuda --epochs "$epochs" --plot '' --dtype bfloat16 > "$out/s2bf16" 2>&1
# An epoch's seconds are printed to 0.01 s, which a GPU's epoch of 10 steps undercuts: the step is
# taken from its samples/s instead (60,000 samples an epoch: MNIST's training set).
first=$(awk '/^epoch 1\// { for (i = 1; i <= NF; i++) if ($i == "samples/s") printf "%.3f\n", 60000 / $(i - 1) }' "$out/s2")
steady_step() {  # the median epoch after the first, over its steps (ms)
    awk '/^epoch [0-9]+\// && !/^epoch 1\// { for (i = 1; i <= NF; i++) { if ($i == "over") n = $(i + 1); if ($i == "samples/s") printf "%.4f\n", 1e3 * 60000 / $(i - 1) / n } }' "$1" |
        sort -g | awk '{ t[NR] = $1 } END { if (NR) print t[int((NR + 1) / 2)] }'
}
steady=$(steady_step "$out/s2") steady_bf16=$(steady_step "$out/s2bf16")
torch2=""
if [ "$torch_cuda" = 1 ]; then
    QUICK=$quick "$PYTHON" tests/torch_fast_mlp.py "$DATA" cuda > "$out/t2" 2>&1 || true
    torch2=$(tail -1 "$out/t2" | "$PYTHON" -c 'import json, sys; d = json.loads(sys.stdin.read()); print(d["ms_per_step_steady"], round(d["loop5_cold_s"] - 0.8 * d["loop5_warm_s"], 3))' 2> /dev/null || echo "? ?")
fi
read -r torch2_step torch2_epoch <<< "${torch2:-}"
echo "step 2, steady step (ms): ${steady:-?} | PyTorch: ${torch2_step:-} | target 0.1"
echo "step 2, steady step with --dtype bfloat16 (ms): ${steady_bf16:-?} | target 0.1"
echo "step 2, first epoch (s): ${first:-?} | PyTorch (its cold 5 epochs less 4 warm ones): ${torch2_epoch:-} | target 0.05"

# Step 14: 3 epochs (the last is the steady one); PyTorch's one epoch.
cnn_epochs=3 cnn_steps=()
[ "$quick" = 1 ] && cnn_epochs=1 cnn_steps=(--max_steps 20)
day3/14_cnn_ddp --data "$DATA" --device cuda --epochs "$cnn_epochs" "${cnn_steps[@]}" --plot '' > "$out/s14" 2>&1
cnn=$(awk '/^epoch [0-9]+\// { for (i = 1; i <= NF; i++) if ($i == "s,") t = $(i - 1) } END { print t }' "$out/s14")
torch14=""
if [ "$torch_cuda" = 1 ]; then
    torch_steps=()
    [ "$quick" = 1 ] && torch_steps=(--max-steps 20)
    "$PYTHON" tests/torch_cnn_ddp.py "$DATA" 1 --device cuda --epochs 1 "${torch_steps[@]}" > "$out/t14" 2>&1 || true
    torch14=$(tail -1 "$out/t14" | "$PYTHON" -c 'import json, sys; d = json.loads(sys.stdin.read()); print("%.2f (%d steps)" % (d["train_s"], d["steps"]))' 2> /dev/null || echo "?")
fi
echo "step 14, an epoch (s): ${cnn:-?} | PyTorch: ${torch14:-} | target 0.3"

# Step 15: an epoch of N synthetic ratings on the GPU (the second: the first warms up), its steps
# replayed from a CUDA graph and (--cuda_graph off) launched one by one, and on one core; with 2
# GPUs, on 2 ranks, the exchanges' NCCL collectives inside the graph and not.
epoch15() { awk '/^epoch / { t = $(NF - 1) } END { print t }' "$1"; }
day3/15_recommender_ddp --data "$out/ml" --synthetic "$ratings" > /dev/null 2>&1
s15=(day3/15_recommender_ddp --data "$out/ml" --epochs 2 --device cuda --plot '')
"${s15[@]}" > "$out/s15" 2>&1
"${s15[@]}" --cuda_graph off > "$out/s15eager" 2>&1
day3/15_recommender_ddp --data "$out/ml" --epochs 1 --device cpu --threads 1 --plot '' > "$out/s15cpu" 2>&1
echo "step 15, an epoch of $ratings ratings (s): $(epoch15 "$out/s15") on the GPU (--cuda_graph off: $(epoch15 "$out/s15eager")), $(epoch15 "$out/s15cpu") on one CPU core | target 0.1 (>= 15x one core)"
if [ "$(build/tools/gpu_count)" -ge 2 ]; then
    for mode in sparse sharded; do
        ${MPIRUN:-mpirun} -np 2 "${s15[@]}" --embeddings $mode > "$out/s15x2" 2>&1
        ${MPIRUN:-mpirun} -np 2 "${s15[@]}" --embeddings $mode --cuda_graph off > "$out/s15x2eager" 2>&1
        echo "step 15 on 2 GPUs, $mode embeddings, an epoch of $ratings ratings (s): $(epoch15 "$out/s15x2") (--cuda_graph off: $(epoch15 "$out/s15x2eager"))"
    done
fi

# Step 19 at nanoGPT's GPU config: tokens/s over the iterations, in float32 and with --dtype bfloat16.
for dtype in float32 bfloat16; do
    day5/19_gpt "${gpt[@]}" --max_iters "$iters" --eval_interval 1000000 --eval_iters 1 --sample 0 --plot '' --device cuda \
        --dtype "$dtype" > "$out/s19" 2>&1
    ours19=$(sed -n 's/^training: .*, \([0-9]*\) tokens\/s.*/\1/p' "$out/s19")
    t19=""
    if [ "$torch_cuda" = 1 ]; then
        "$PYTHON" tests/torch_gpt.py data/shakespeare 1 "${gpt[@]}" --max_iters "$iters" --eval_interval 1000000 \
            --eval_iters 1 --device cuda --dtype "$dtype" > "$out/t19" 2>&1 || true
        t19=$(tail -1 "$out/t19" | "$PYTHON" -c "import json, sys; d = json.loads(sys.stdin.read()); print('%.0f' % (d['iters'] * $batch * $block / d['train_seconds']))" 2> /dev/null || echo "?")
    fi
    [ "$dtype" = float32 ] && echo "step 19, tokens/s, float32: ${ours19:-?} | PyTorch eager: ${t19:-}"
    [ "$dtype" = bfloat16 ] && echo "step 19, tokens/s, bfloat16: ${ours19:-?} | PyTorch eager under autocast: ${t19:-} | target: ours >= 1.5x it"
done
