#!/usr/bin/env bash
# Parity with PyTorch itself: tests/torch_mnist_ddp.py (or $TORCH_REFERENCE), the
# CPU/gloo reference script of the workshop, run with Debian's python3-torch.
#
# Our RNG is torch's (common/rng.h), so with the same seed our programs draw the
# same initial weights and the same DistributedSampler order as PyTorch: the
# per-step losses must agree up to float summation order. Needs python3-torch
# and python3-h5py (./setup.sh --with-reference); otherwise prints SKIP lines.
set -u
cd "$(dirname "$0")/.."
MPIRUN=${MPIRUN:-mpirun --oversubscribe $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
DATA=${DATA:-data/mnist}
REFERENCE=${TORCH_REFERENCE:-tests/torch_mnist_ddp.py}
PYTHON=${PYTHON:-/usr/bin/python3}

pass() { echo "PASS parity: $*"; }
fail() { echo "FAIL parity: $*"; }
if ! "$PYTHON" -c 'import torch, h5py' 2> /dev/null; then
    echo "SKIP parity: PyTorch comparison (python3-torch/python3-h5py not installed: ./setup.sh --with-reference)"
    exit 0
fi
if [ ! -f "$REFERENCE" ]; then
    echo "SKIP parity: PyTorch comparison (no reference script at $REFERENCE; set TORCH_REFERENCE)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# compare OURS.csv TORCH.json TOLERANCE WHAT: per-step losses and test accuracy.
compare() {
    "$PYTHON" - "$@" << 'PY'
import csv, json, sys
ours_csv, torch_json, tol, what, ours_acc = sys.argv[1:6]
ours = [float(r["loss"]) for r in csv.DictReader(open(ours_csv))]
ref = json.loads(open(torch_json).read().strip().splitlines()[-1])
theirs = ref["losses"]
worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) if ours else float("inf")
ok = len(ours) == len(theirs) and worst <= float(tol)
acc_line = ""
if ours_acc:
    acc_ok = abs(float(ours_acc) - 100 * ref["test_acc"]) < 0.05
    acc_line = f"; test accuracy {ours_acc}% vs torch {100 * ref['test_acc']:.2f}%"
    ok = ok and acc_ok
print(f"{'PASS' if ok else 'FAIL'} parity: {what}: {len(ours)} vs {len(theirs)} steps, "
      f"worst relative loss difference {worst:.1e} (<= {tol}){acc_line}")
PY
}
accuracy() { sed -n 's/.*Test accuracy: \([0-9.]*\)%.*/\1/p' "$1"; }

# 1. Step 2 with the default seed, shuffled: PyTorch's init and data order.
day1/2_mnist_training --losses "$tmp/c1.csv" --plot '' > "$tmp/c1.out" 2>&1
"$PYTHON" "$REFERENCE" "$DATA" 1 --port 29611 > "$tmp/t1.json" 2> "$tmp/t1.err" || { fail "reference run: $(tail -1 "$tmp/t1.err")"; exit 1; }
compare "$tmp/c1.csv" "$tmp/t1.json" 1e-5 "step 2 (seed 0, shuffled, 5 epochs) vs torch at 1 rank" "$(accuracy "$tmp/c1.out")"

# 2. Step 4 on 2 ranks vs torch DDP on 2 ranks with lr x 2. torch logs rank 0's
#    own loss, we log the global mean, so compare the end: test accuracy.
$MPIRUN -np 2 day1/4_mnist_manual_ddp --plot '' > "$tmp/c2.out" 2>&1
"$PYTHON" "$REFERENCE" "$DATA" 2 --lr-scale --port 29612 > "$tmp/t2.json" 2> "$tmp/t2.err" || { fail "reference run: $(tail -1 "$tmp/t2.err")"; exit 1; }
ours=$(accuracy "$tmp/c2.out")
theirs=$("$PYTHON" -c "import json; print('%.2f' % (100 * json.loads(open('$tmp/t2.json').read().strip().splitlines()[-1])['test_acc']))")
if [ "$ours" = "$theirs" ]; then pass "step 4 on 2 ranks vs torch DDP (lr x 2): test accuracy $ours% == $theirs%"
else fail "step 4 on 2 ranks vs torch DDP (lr x 2): test accuracy $ours% != $theirs%"; fi

# 3. Checkpoints both ways: torch loads the weights we --save (through h5py, the
#    state_dict names and shapes), and from them both take the same steps.
day1/2_mnist_training --seed 123 --epochs 1 --save "$tmp/ours.h5" --plot '' > /dev/null 2>&1
day1/2_mnist_training --init "$tmp/ours.h5" --no-shuffle --epochs 1 --losses "$tmp/c3.csv" --plot '' > /dev/null 2>&1
"$PYTHON" "$REFERENCE" "$DATA" 1 --init "$tmp/ours.h5" --no-shuffle --epochs 1 --port 29613 > "$tmp/t3.json" 2> "$tmp/t3.err" || { fail "reference run from our checkpoint: $(tail -1 "$tmp/t3.err")"; exit 1; }
compare "$tmp/c3.csv" "$tmp/t3.json" 1e-5 "from our --save checkpoint, loaded by torch via h5py (no shuffle, 1 epoch)" ""
