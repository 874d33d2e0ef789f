#!/usr/bin/env bash
# The training loop of steps 6, 7, 8, 10 and 11 is one loop, copied: the steps
# differ in what they add around it (timing, lr x W, nodes, streaming), not in
# the loop. This test keeps the copies identical where the steps do not mean
# to differ, so that a fix in one reaches all, and checks that step 6's loop
# reads in PyTorch's order.
# Prints one PASS/FAIL line per check (tests/run.sh counts them).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite loops
scratch

# The loop over an epoch's batches, from its `for` to its closing brace.
loop_of() { awk '/^        for \(int b = 0; b < n_batches; b\+\+\) \{$/ { on = 1 } on { print } on && /^        }$/ { exit }' "$1"; }
# What the steps mean to differ in: where the batch comes from (memory or the
# HDF5 stream), and so how many samples this rank has, and whether its labels
# are on the GPU already (mnist_batch gathers them there; the stream's come
# from the host).
intended() {
    sed -e '2s/^\( *Tensor x = \).*/\1<the batch>/' -e 's/\brank_samples\b/sampler.num_samples/g' \
        -e 's#^\( *mlp_loss_to(&model, batch_labels, \)\(mnist_batch_device_labels(&train), *\|NULL, *\)//.*#\1<the labels on the GPU>#'
}

loop_of day1/6_mnist_ddp.c | intended > "$tmp/6"
lines=$(wc -l < "$tmp/6")
if [ "$lines" -lt 10 ]; then
    fail "found no training loop in day1/6_mnist_ddp.c ($lines lines)"
    exit 0
fi
for step in day1/7_mnist_ddp_timing.c day1/8_mnist_ddp_lr.c day2/10_mnist_ddp_multinode.c day2/11_multinode_streaming.c; do
    loop_of "$step" | intended > "$tmp/other"
    if diff -u "$tmp/6" "$tmp/other" > "$tmp/diff"; then
        pass "$step's training loop is step 6's ($lines lines; the batch's source aside)"
    else
        fail "$step's training loop differs from step 6's: $(sed -n '4,12p' "$tmp/diff" | tr '\n' '|')"
    fi
done

# Step 6's loop: zero_grad, forward, loss, backward (buckets start), finish, step.
order=$(grep -oE 'mlp_zero_grad|mlp_forward|mlp_loss|mlp_backward|ddp_finish|adam_step' "$tmp/6" | tr '\n' ' ')
if [ "$order" = "mlp_zero_grad mlp_forward mlp_loss mlp_backward ddp_finish adam_step " ]; then
    pass "step 6's loop reads zero_grad, forward, loss, backward, finish, step"
else
    fail "step 6's loop calls, in order: $order"
fi
grep -qE '\bcontinue\b|, *loss *= *0' "$tmp/6" && fail "step 6's loop skips with continue or a comma operator" ||
    pass "step 6's loop has no continue and no comma operator"
