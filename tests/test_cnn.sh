#!/usr/bin/env bash
# Step 14 (the SimpleCNN under DDP), end to end on real MNIST: DDP on 2 ranks
# takes the steps of one process with the 2x batch, the same bits at any
# thread count, the evaluation tables, checkpoints, the loss curve, and bad
# input. Prints one PASS/FAIL line per check (tests/run.sh counts them).
# make test (TEST_LEVEL=quick) leaves the thread counts and the 200 steps that learn to
# make test-all (TEST_LEVEL=all).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite cnn
scratch
RUN_TIMEOUT=300  # step 14's convolutions are the slowest CPU runs: they keep their 300 s
MPI_FLAGS="--bind-to none"  # mpirun would bind each rank to one core, whatever --threads asks
same_cnn_weights() {  # WHAT A.h5 B.h5 TOLERANCE
    local verdict
    verdict=$(build/tools/compare_cnn_weights "$2" "$3" "$4" 2>&1)
    if [ $? -eq 0 ]; then pass "$1: $verdict"; else fail "$1: $verdict (tolerance $4)"; fi
}
# The evaluation: the line with the test loss, the report and the confusion
# matrix (without other ranks' checksum lines, which may come in between).
evaluation() { sed -n '/Test loss/,/^DDP:/p' "$1" | sed 's/.*Test loss/Test loss/' | grep -v -e '^DDP:' -e '^\[rank'; }

# ---------------------------------------------------------------- DDP: 2 ranks x 32 == 1 process x 64
# No shuffle: rank r takes samples r, r + 2, ..., so 2 ranks' batches of 32
# together are the one process's batch of 64; DDP averages the two halves'
# gradients, which is the mean over the 64. Only the float sums' order differs.
run day3/14_cnn_ddp --no-shuffle --max_steps 40 --threads 2 --losses "$tmp/one.csv" --save "$tmp/one.h5" --plot '' > "$tmp/one.out" 2>&1
mpi 2 day3/14_cnn_ddp --no-shuffle --max_steps 40 --batch_size 32 --threads 1 --losses "$tmp/two.csv" --save "$tmp/two.h5" --plot "$tmp/two.png" > "$tmp/two.out" 2>&1
verdict=$(same_losses "$tmp/one.csv" "$tmp/two.csv" 1e-4)
expect "DDP on 2 ranks x 32 takes the steps of 1 process x 64 (no shuffle, 40 steps): $verdict (<= 1e-4)" test $? -eq 0
same_cnn_weights "DDP on 2 ranks x 32 ends with the weights of 1 process x 64" "$tmp/two.h5" "$tmp/one.h5" 1e-4
expect "both ranks end with the same parameters: $(grep -c 'parameter checksum' "$tmp/two.out") checksum lines, $(checksum "$tmp/two.out" | wc -w) distinct" \
    test "$(grep -c 'parameter checksum' "$tmp/two.out")" -eq 2 -a "$(checksum "$tmp/two.out" | wc -w)" -eq 1
expect "the first line names the model and its buckets: $(head -1 "$tmp/two.out" | cut -c1-110)..." \
    grep -q '^Step 14: DDP on 2 ranks: SimpleCNN, 421642 weights in 1 bucket: \[network.9.bias .. network.0.weight, 1.69 MB\]; Adam lr 0.001; batch 32 per rank; 1 epoch (--max_steps 40); shuffle off' "$tmp/two.out"

# ---------------------------------------------------------------- the evaluation
# Ten classes, then accuracy and the averages; the confusion matrix's rows add
# up to the test set, its diagonal to the correct count of the summary line.
correct=$(sed -n 's/.*accuracy [0-9.]*% (\([0-9]*\) of 10000).*/\1/p' "$tmp/two.out")
matrix=$(sed -n '/^Confusion matrix/,/^DDP:/p' "$tmp/two.out" | awk '$1 ~ /^[0-9]$/ && NF == 11')
total=$(echo "$matrix" | awk '{ for (i = 2; i <= 11; i++) s += $i } END { print s + 0 }')
diagonal=$(echo "$matrix" | awk '{ s += $($1 + 2) } END { print s + 0 }')
rows=$(sed -n '/precision/,/weighted avg/p' "$tmp/two.out" | grep -cE '^ +[0-9] +[01]\.[0-9]{4} +[01]\.[0-9]{4} +[01]\.[0-9]{4} +[0-9]+$')
expect "rank 0 prints precision, recall, F1 for $rows classes and a confusion matrix of $total images whose diagonal ($diagonal) is the correct count (${correct:-?})" \
    test "$rows" -eq 10 -a "$total" -eq 10000 -a "$diagonal" = "${correct:-x}"
expect "the evaluation is printed once, by rank 0 ($(grep -c '^Confusion matrix' "$tmp/two.out") confusion matrix)" \
    test "$(grep -c '^Confusion matrix' "$tmp/two.out")" -eq 1 -a "$(grep -c 'weighted avg' "$tmp/two.out")" -eq 1
# From the same weights, 2 ranks (each evaluating half the test set) and 1 print the same tables.
run day3/14_cnn_ddp --init "$tmp/one.h5" --max_steps 0 --save "$tmp/again.h5" --plot '' > "$tmp/eval1.out" 2>&1
mpi 2 day3/14_cnn_ddp --init "$tmp/one.h5" --max_steps 0 --plot '' > "$tmp/eval2.out" 2>&1
expect "evaluation on 2 ranks (half the test set each, reduced to rank 0) == on 1: $(evaluation "$tmp/eval2.out" | head -1)" \
    test -n "$(evaluation "$tmp/eval1.out")" -a "$(evaluation "$tmp/eval1.out")" = "$(evaluation "$tmp/eval2.out")"
expect "--init then --save with --max_steps 0 (no step) evaluates the weights it trained with: $(evaluation "$tmp/one.out" | head -1)" \
    test "$(evaluation "$tmp/one.out")" = "$(evaluation "$tmp/eval1.out")"
same_cnn_weights "--init FILE --max_steps 0 --save: the same weights" "$tmp/again.h5" "$tmp/one.h5" 0

# ---------------------------------------------------------------- threads
# The same bits at any thread count: 1 rank at 1, 2 and 3 threads (shuffled,
# batches of 100: GEMMs cut unevenly), 2 ranks at 1 and 2 threads each.
if thorough; then  # make test-all: 2 ranks x 2 threads on 2 cores take half a minute
for threads in 1 2 3; do
    run day3/14_cnn_ddp --max_steps 8 --batch_size 100 --threads $threads --losses "$tmp/t$threads.csv" --save "$tmp/t$threads.h5" --plot '' > /dev/null 2>&1
done
for threads in 2 3; do
    expect "1 rank at $threads threads takes the same steps as at 1, bit for bit" cmp -s "$tmp/t1.csv" "$tmp/t$threads.csv"
    same_cnn_weights "1 rank at $threads threads ends with the weights of 1 thread" "$tmp/t$threads.h5" "$tmp/t1.h5" 0
done
mpi 2 day3/14_cnn_ddp --no-shuffle --max_steps 40 --batch_size 32 --threads 2 --losses "$tmp/two2.csv" --save "$tmp/two2.h5" --plot '' > /dev/null 2>&1
expect "2 ranks at 2 threads each take the same steps as at 1, bit for bit" cmp -s "$tmp/two.csv" "$tmp/two2.csv"
same_cnn_weights "2 ranks at 2 threads each end with the weights of 1 thread each" "$tmp/two2.h5" "$tmp/two.h5" 0

# ---------------------------------------------------------------- it learns; the loss curve
# 200 steps of 2 x 64 shuffled images (about 0.43 of an epoch).
mpi 2 day3/14_cnn_ddp --max_steps 200 --threads 1 --losses "$tmp/learn.csv" --plot "$tmp/learn.png" > "$tmp/learn.out" 2>&1
learned=$(accuracy "$tmp/learn.out")
first=$(sed -n 2p "$tmp/learn.csv" | cut -d, -f3) last=$(tail -1 "$tmp/learn.csv" | cut -d, -f3)
expect "200 steps on 2 ranks: test accuracy ${learned:-?}% (>= 95%), loss ${first:-?} -> ${last:-?}" \
    awk "BEGIN { exit !(\"${learned:-0}\" + 0 >= 95 && $(wc -l < "$tmp/learn.csv") == 201) }"
blue=$(build/tools/png_colors "$tmp/learn.png" 1f77b4 2>&1 | awk '$1 == "1f77b4" { print $2 }')
expect "--plot draws the loss curve (${blue:-0} blue pixels) and says where" \
    test "${blue:-0}" -gt 300 -a "$(grep -c "^Loss curve: $tmp/learn.png" "$tmp/learn.out")" -eq 1
fi  # thorough

# ---------------------------------------------------------------- bad input
run day1/2_mnist_training --epochs 1 --save "$tmp/mlp.h5" --plot '' > /dev/null 2>&1
mpi 2 day3/14_cnn_ddp --init "$tmp/mlp.h5" --plot '' > "$tmp/bad" 2>&1
status=$?
expect "--init with the MLP's checkpoint on 2 ranks: exit $status, no hang, one line naming the dataset and shape: $(grep -m1 network "$tmp/bad")" \
    test $status -ne 0 -a $status -ne 124 -a "$(grep -c "mlp.h5: no dataset 'network.0.weight' (expected float32 \[32, 1, 3, 3\]" "$tmp/bad")" -eq 1
run day3/14_cnn_ddp --max_steps -2 > "$tmp/bad" 2>&1
status=$?
expect "--max_steps -2: exit $status (2), one line naming the flag: $(head -1 "$tmp/bad")" \
    test $status -eq 2 -a "$(wc -l < "$tmp/bad")" -eq 1 -a "$(grep -c -- '--max_steps' "$tmp/bad")" -eq 1
# A batch whose activations cannot fit (50000 samples of about 1 MB each, where ulimit -v leaves
# 4 GB) is refused before anything is allocated, with one line, not killed by the OOM killer.
if ! no_address_limit "--batch_size 50000 on 2 ranks under ulimit -v 4 GB" day3/14_cnn_ddp; then
    (ulimit -v 4000000; mpi 2 day3/14_cnn_ddp --batch_size 50000 --plot '') > "$tmp/bad" 2>&1
    status=$?
    expect "--batch_size 50000 on 2 ranks under ulimit -v 4 GB: exit $status (2), one line naming the flag: $(grep -m1 -- '--batch_size' "$tmp/bad")" \
        test $status -eq 2 -a "$(grep -c '^error' "$tmp/bad")" -eq 1 -a \
        "$(grep -cE -- '^error: --batch_size 50000 needs about [0-9.]+ [GT]B per rank \(.*activations [0-9.]+ [GT]B.*\), more than ' "$tmp/bad")" -eq 1
fi
# A batch past the first pool's int indexes (2^20) is refused as such, whatever the memory: the
# model's limit comes before the memory estimate (a GPU of 141 GB would hold 85598 samples).
mpi 2 day3/14_cnn_ddp --batch_size 1048576 --plot '' > "$tmp/bad" 2>&1
status=$?
expect "--batch_size 1048576 on 2 ranks: exit $status (1), one line naming the pooling indexes: $(grep -m1 -- '--batch_size' "$tmp/bad")" \
    test $status -eq 1 -a "$(grep -c -- '--batch_size 1048576: the SimpleCNN takes at most 85598 (its pooling indexes are ints)' "$tmp/bad")" -eq 1
if /usr/bin/python3 -c 'import h5py, numpy' 2> /dev/null; then
    # A conv weight stored 2-D [32, 9] (the tensor's shape, not the state_dict's) is refused.
    /usr/bin/python3 - "$tmp/one.h5" "$tmp/flat.h5" << 'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as src, h5py.File(sys.argv[2], "w") as dst:
    for k in src:
        dst[k] = src[k][...].reshape(32, 9) if k == "network.0.weight" else src[k][...]
PY
    run day3/14_cnn_ddp --init "$tmp/flat.h5" --plot '' > "$tmp/bad" 2>&1
    status=$?
    expect "--init with network.0.weight stored [32, 9]: exit $status, one line: $(head -1 "$tmp/bad")" \
        test $status -eq 1 -a "$(grep -c "flat.h5: dataset 'network.0.weight' is float32 \[32, 9\] (expected float32 \[32, 1, 3, 3\])" "$tmp/bad")" -eq 1
else
    skip "--init with a conv weight of the wrong rank (needs python3-h5py to write the file)"
fi
