#!/usr/bin/env bash
# Integration tests: the real programs under mpirun, on real MNIST.
# Prints one PASS/FAIL/SKIP line per check (tests/run.sh counts them).
# make test (TEST_LEVEL=quick) runs step 4 on 2 ranks; make test-all (TEST_LEVEL=all) on 4 too.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite integration
scratch

# ---------------------------------------------------------------- step 0
for np in 1 2 4; do
    mpi $np day1/0_dist_allreduce > "$tmp/out" 2>&1
    mean=$(awk "BEGIN { print ($np + 1) / 2 }")
    expect "step 0 at $np ranks: every rank prints mean $mean" \
        test "$(grep -c "after allreduce: sum $((np * (np + 1) / 2)), mean $mean\$" "$tmp/out")" = $np
    expect "step 0 --count 1000003 at $np ranks verifies every element" \
        bash -c "$MPIRUN -np $np day1/0_dist_allreduce --count 1000003 | grep -q 'every element verified on every rank'"
done

# ---------------------------------------------------------------- step 2
run day1/2_mnist_training --losses "$tmp/losses2.csv" --plot "$tmp/img/2.png" --save "$tmp/w2.h5" > "$tmp/out2" 2>&1
accuracy=$(accuracy "$tmp/out2")
expect "step 2 reaches >= 85% test accuracy in 5 epochs (got ${accuracy:-nothing}%)" \
    awk "BEGIN { exit !(${accuracy:-0} >= 85) }"
expect "step 2 writes the loss CSV: header step,epoch,loss and 50 steps" \
    bash -c "head -1 $tmp/losses2.csv | grep -qx 'step,epoch,loss' && test \$(wc -l < $tmp/losses2.csv) = 51"
expect "step 2 writes its loss-curve PNG (creating the folder)" test -s "$tmp/img/2.png"
expect "step 2's mean loss falls every epoch" \
    awk '/^epoch/ { loss = $5 + 0; if (NR > 1 && seen && loss >= prev) bad = 1; prev = loss; seen = 1 } END { exit bad }' "$tmp/out2"

# --save / --init: resuming from the saved weights starts where training ended.
run day1/2_mnist_training --init "$tmp/w2.h5" --epochs 1 --losses "$tmp/resume.csv" --plot '' > /dev/null 2>&1
expect "step 2 --init from its own --save resumes at the trained loss (< 0.6, a fresh start is 2.3)" \
    awk -F, 'NR == 2 { exit !($3 < 0.6) }' "$tmp/resume.csv"

# ---------------------------------------------------------------- step 3
(cd "$tmp" && mpi 2 "$OLDPWD/day1/3_mnist_distributed" --data "$OLDPWD/$DATA" --epochs 1 --plot img.v1/3.png) > "$tmp/out3" 2>&1
expect "step 3 at 2 ranks: one PNG per rank, the suffix before the file's extension, not a folder's dot" \
    test -s "$tmp/img.v1/3_rank0.png" -a -s "$tmp/img.v1/3_rank1.png" -a ! -e "$tmp/img_rank0.v1"
expect "step 3 at 2 ranks: two identical, independent models" \
    test "$(sed -n 's/.*Parameter checksum \([0-9a-f]*\)/\1/p' "$tmp/out3" | sort -u | wc -l)" = 1

# ---------------------------------------------------------------- step 4
for np in 2 $(if_thorough 4); do
    mpi $np day1/4_mnist_manual_ddp --epochs 2 --plot "$tmp/4.png" > "$tmp/out4" 2>&1
    checksums=$(sed -n 's/.*parameter checksum \([0-9a-f]*\)/\1/p' "$tmp/out4")
    expect "step 4 at $np ranks ends with identical parameters on all ranks" \
        test "$(echo "$checksums" | wc -l)" = $np -a "$(echo "$checksums" | sort -u | wc -l)" = 1
done

# DDP on W ranks with batch B == one process with batch W*B (no shuffle, same lr).
for np in 2 $(if_thorough 4); do
    batch=$((6400 / np))
    mpi $np day1/4_mnist_manual_ddp --no-shuffle --epochs 2 --batch_size $batch --lr 0.001 --losses "$tmp/ddp$np.csv" --plot '' > /dev/null 2>&1
    run day1/2_mnist_training --no-shuffle --epochs 2 --batch_size 6400 --lr "0.00$np" --losses "$tmp/single$np.csv" --plot '' > /dev/null 2>&1
    verdict=$(same_losses "$tmp/ddp$np.csv" "$tmp/single$np.csv" 1e-4)
    expect "step 4 on $np ranks x batch $batch == step 2 with batch 6400: per-step losses within 1e-4 ($verdict)" \
        test $? -eq 0
done

# ---------------------------------------------------------------- bad input
# One clear line, the right exit status, no core dump, no hang: also with several ranks.
expect_error 2 '^error: --epochs expects an integer from 1 to' run day1/2_mnist_training --epochs 0
expect_error 2 '^error: --epochs expects an integer' run day1/2_mnist_training --epochs abc
expect_error 2 '^error: --lr expects a number > 0' run day1/2_mnist_training --lr -1
expect_error 2 '^error: --batch_size expects a value' run day1/2_mnist_training --batch_size
expect_error 2 '^error: --device expects one of cpu\|cuda\|auto' run day1/2_mnist_training --device tpu
expect_error 2 "^error: unknown flag '--bogus'" mpi 2 day1/4_mnist_manual_ddp --bogus
expect_error 2 "^error: unexpected argument 'extra'" mpi 2 day1/0_dist_allreduce extra
expect_error 2 '^error: --count expects an integer from 1 to' mpi 2 day1/0_dist_allreduce --count -5
# Values that once crashed or were killed without a word: libgomp's segfault at 100000 threads, the
# OOM killer at --count 2147483647 (8.6 GB a rank), an int overflow that trained 0 steps and exited 0.
expect_error 2 '^error: --threads expects an integer from 0 to 1024' run day1/2_mnist_training --threads 100000
expect_error 2 '^error: --max_steps expects an integer from -1 to 1073741824' run day3/14_cnn_ddp --max_steps 2147483647
expect_error 2 '^error: --accum_steps expects an integer from 1 to 1048576' mpi 2 day1/6_mnist_ddp --accum_steps 2147483642
node_gb=$(awk '/^MemTotal/ { print int($2 / 1e6) }' /proc/meminfo)
if [ "$node_gb" -lt 34 ]; then  # 2 ranks x 8.6 GB is more than half of it
    expect_error 1 '^\[rank 0 @ [^]]*\] --count 2147483647: 8\.6 GB per rank, 2 ranks on .*: more than half of its' \
        mpi 2 day1/0_dist_allreduce --count 2147483647
    expect "--count too large for memory on 2 ranks is reported once" test "$(grep -c 'more than half' "$tmp/err")" = 1
    expect_error 1 '\] --count 2147483647: two buffers of 2147483646 floats: 17\.2 GB per rank' \
        mpi 2 day3/12_collectives --count 2147483647
else
    skip "--count beyond memory: this node's $node_gb GB hold the largest --count on 2 ranks"
fi
expect_error 2 "^error: --save expects a FILE.h5, got ''" mpi 2 day1/4_mnist_manual_ddp --save ''
expect_error 0 '^  --batch_size N' run day1/2_mnist_training --help

expect_error 1 'MNIST not found: no /nonexistent/train-images-idx3-ubyte\[\.gz\]\. Run `make data`' \
    run day1/2_mnist_training --data /nonexistent
expect_error 1 'MNIST not found.*Run `make data`' mpi 4 day1/4_mnist_manual_ddp --data /nonexistent
expect "missing data on 4 ranks is reported once, not once per rank" test "$(grep -c 'MNIST not found' "$tmp/err")" = 1

mkdir -p "$tmp/bad"
cp "$DATA"/train-labels* "$DATA"/t10k* "$tmp/bad/"
head -c 5000000 "$DATA/train-images-idx3-ubyte.gz" > "$tmp/bad/train-images-idx3-ubyte.gz"
expect_error 1 'train-images-idx3-ubyte.gz: truncated or corrupt gzip stream' mpi 2 day1/4_mnist_manual_ddp --data "$tmp/bad"
gzip -dc "$DATA/train-images-idx3-ubyte.gz" | head -c 40000000 > "$tmp/bad/train-images-idx3-ubyte"
rm "$tmp/bad/train-images-idx3-ubyte.gz"
expect_error 1 'train-images-idx3-ubyte: truncated: the header promises 47040000 bytes of data, the file holds 39999984' \
    run day1/2_mnist_training --data "$tmp/bad"
gzip -dc "$DATA/train-labels-idx1-ubyte.gz" > "$tmp/bad/train-images-idx3-ubyte"
expect_error 1 'bad magic number 0x00000801 \(expected 0x00000803' run day1/2_mnist_training --data "$tmp/bad"
: > "$tmp/bad/train-images-idx3-ubyte"
expect_error 1 'train-images-idx3-ubyte: file is empty' run day1/2_mnist_training --data "$tmp/bad"
gzip -dc "$DATA/train-images-idx3-ubyte.gz" > "$tmp/bad/train-images-idx3-ubyte"
gzip -dc "$DATA/train-labels-idx1-ubyte.gz" | head -c 50008 > "$tmp/bad/train-labels-idx1-ubyte"
printf '\x00\x00\x08\x01\x00\x00\xc3\x50' | dd of="$tmp/bad/train-labels-idx1-ubyte" conv=notrunc status=none  # header says 50000
rm "$tmp/bad/train-labels-idx1-ubyte.gz"
expect_error 1 'has 60000 images but train-labels-idx1-ubyte has 50000 labels' run day1/2_mnist_training --data "$tmp/bad"

expect_error 1 'missing.h5: cannot open: No such file' mpi 2 day1/4_mnist_manual_ddp --init "$tmp/missing.h5"
echo "not hdf5" > "$tmp/text.h5"
expect_error 1 'text.h5: not an HDF5 file' run day1/2_mnist_training --init "$tmp/text.h5"
# A FIFO would block the open until a writer comes, on every rank: refused before opening.
mkfifo "$tmp/fifo.h5"
expect_error 1 'fifo.h5: is not a regular file \(a FIFO, a socket or a device\), not an HDF5 file' \
    mpi 2 day1/6_mnist_ddp --init "$tmp/fifo.h5"
expect_error 1 'bad: is a directory, not an HDF5 file' run day1/2_mnist_training --init "$tmp/bad"
cp "$tmp/w2.h5" "$tmp/damaged.h5"  # a real weights file, its index of datasets overwritten
head -c 1200 /dev/zero | tr '\0' '\377' | dd of="$tmp/damaged.h5" bs=1 seek=300 conv=notrunc status=none
expect_error 1 'damaged.h5: cannot read its index of datasets: a damaged HDF5 file' run day1/2_mnist_training --init "$tmp/damaged.h5"
expect_error 2 '^error: --compare .*fifo.h5: is not a regular file' mpi 2 day1/8_mnist_ddp_lr --compare "$tmp/fifo.h5"
if have_h5py; then
    "$PYTHON" -c "
import h5py, numpy as np
with h5py.File('$tmp/shape.h5', 'w') as f:
    f['fc.0.weight'] = np.zeros((128, 785), np.float32)"
    expect_error 1 "shape.h5: dataset 'fc.0.weight' is float32 \[128, 785\] \(expected float32 \[128, 784\]\)" \
        mpi 2 day1/4_mnist_manual_ddp --init "$tmp/shape.h5"
else
    skip "a wrongly shaped --init file ($PYTHON has no h5py)"
fi

# Programs started without mpirun at the same moment (isolated Open MPI singletons): each starts.
# They shared one session folder, which one removed as it ended while another made its own in it
# (6 of 480 starts failed in MPI_Init, 8 at a time); each has its own now (runtime/dist.c), removed
# at its end. 8 at a time, 20 each (60 each in make test-all).
failed=0
for w in 1 2 3 4 5 6 7 8; do
    (for i in $(seq "$(if thorough; then echo 60; else echo 20; fi)"); do
        day1/2_mnist_training --help > /dev/null 2> "$tmp/singleton.$w" || { echo x; break; }
    done) > "$tmp/singletons.$w" &
done
wait
failed=$(cat "$tmp"/singletons.* | wc -l)
expect "programs started without mpirun, 8 at a time: every one starts ($failed of 8 streams saw one fail$(
    [ "$failed" = 0 ] || echo ": $(cat "$tmp"/singleton.* | grep -m1 .)"))" test "$failed" = 0
