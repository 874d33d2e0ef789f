#!/usr/bin/env bash
# Day 2's HDF5 path end to end: day2/create_mnist_h5 and step 11 streaming from it.
# Prints one PASS/FAIL/SKIP line per check (tests/run.sh counts them).
#   - the file has the original workshop's layout, uint8 uncompressed by default and
#     float32 gzip (the original's exactly) with --float32 (checked with h5py, not with
#     our reader); --gzip N compresses uint8 chunks;
#   - the workers: losses and weights bit-identical at any --workers and --prefetch;
#     damaged chunks and truncated files end the job with one line, no hang;
#     a file with filters the workers do not decode trains through H5Dread;
#   - a file written by h5py in that layout trains in step 11, with the losses of ours;
#   - step 11 takes step 10's steps (1 rank, no shuffle), and uint8 and float32 files agree;
#   - on 2 ranks: the loss falls, parameters agree, each rank reads only its groups;
#   - bad files and flags: one clear line, non-zero exit, no hang;
#   - memory: step 11 holds workers x prefetch batches, not the data set.
# make test leaves the float32 and gzip files' training, the workers, the file written by
# h5py and the memory checks to make test-all (TEST_LEVEL=all).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite h5_stream
scratch
step11=(day2/11_multinode_streaming --plot '')  # a later --plot wins

# ---------------------------------------------------------------- create_mnist_h5
run day2/create_mnist_h5 --data "$DATA" --out "$tmp/ours.h5" > "$tmp/out_create" 2>&1
expect "create_mnist_h5 writes $tmp/ours.h5 and says what: $(tail -1 "$tmp/out_create")" \
    grep -q "^wrote $tmp/ours.h5: [0-9.]* MB" "$tmp/out_create"
run day2/create_mnist_h5 --data "$DATA" --out "$tmp/ours_float32.h5" --float32 > /dev/null 2>&1
expect "create_mnist_h5 --float32 writes a second file" test -s "$tmp/ours_float32.h5"
run day2/create_mnist_h5 --data "$DATA" --out "$tmp/ours_gzip.h5" --gzip 4 > "$tmp/out_gzip" 2>&1
expect "create_mnist_h5 --gzip 4 compresses the uint8 chunks: $(tail -1 "$tmp/out_gzip")" \
    awk '/^wrote/ { mb = $3 + 0 } END { exit !(mb > 0 && mb < 20) }' "$tmp/out_gzip"

# The layout, read back by h5py against the IDX files: what the original's code sees.
check_layout() {  # file, pixel dtype, compression (gzip or None)
    "$PYTHON" - "$1" "$2" "$3" "$DATA" << 'EOF'
import gzip, os, sys
import h5py, numpy as np
path, dtype, compression, data = sys.argv[1:]
compression = None if compression == "None" else compression
def idx(stem, header):
    name = os.path.join(data, stem)
    raw = gzip.open(name + ".gz").read() if os.path.exists(name + ".gz") else open(name, "rb").read()
    return np.frombuffer(raw, np.uint8, offset=header)
with h5py.File(path, "r") as f:
    for part, prefix, groups in (("train", "train", 600), ("test", "t10k", 100)):
        images, labels = f[part + "/images"], f[part + "/labels"]
        want = [(images.shape, (groups, 100, 1, 28, 28)), (images.dtype, np.dtype(dtype)),
                (labels.shape, (groups, 100)), (labels.dtype, np.dtype("int64")),
                (images.chunks, (1, 100, 1, 28, 28)), (labels.chunks, (1, 100)),
                (images.compression, compression), (labels.compression, compression)]
        for got, expected in want:
            assert got == expected, f"{part}: {got} where the original has {expected}"
        pixels = idx(prefix + "-images-idx3-ubyte", 16).reshape(groups, 100, 1, 28, 28)
        classes = idx(prefix + "-labels-idx1-ubyte", 8).reshape(groups, 100)
        for g in (0, 1, groups // 2, groups - 1):
            expected = pixels[g] if dtype == "uint8" else pixels[g].astype(np.float32) / np.float32(255)
            assert np.array_equal(images[g], expected), f"{part} group {g}: pixels differ from the IDX file's"
            assert np.array_equal(labels[g], classes[g]), f"{part} group {g}: labels differ"
print(f"train/images {dtype} (600, 100, 1, 28, 28), train/labels int64 (600, 100), test likewise (100 groups); "
      f"{compression or 'uncompressed'}, one chunk per group; groups 0, 1, N/2, N-1 equal the IDX data" +
      (" (the pixels as stored in IDX)" if dtype == "uint8" else " / 255 (the original's pixels exactly)"))
EOF
}
if have_h5py; then
    for variant in "ours.h5 uint8 None" "ours_float32.h5 float32 gzip" "ours_gzip.h5 uint8 gzip"; do
        set -- $variant
        verdict=$(check_layout "$tmp/$1" "$2" "$3" 2>&1)
        if [ $? -eq 0 ]; then pass "h5py reads $1 ($2) in the original's layout: $verdict"
        else fail "h5py reads $1: $(echo "$verdict" | tail -1)"; fi
    done
else
    no_h5py "h5py reads create_mnist_h5's file in the original's layout"
fi

# Never overwrite by accident; --force does.
before=$(cksum < "$tmp/ours.h5")
run day2/create_mnist_h5 --data "$DATA" --out "$tmp/ours.h5" > "$tmp/err" 2>&1
status=$?
if [ $status -eq 2 ] && grep -qx "error: $tmp/ours.h5 exists: pass --force to overwrite it (see --help)" "$tmp/err" &&
   [ "$(cksum < "$tmp/ours.h5")" = "$before" ]; then
    pass "create_mnist_h5 refuses to overwrite (exit 2, file untouched): $(cat "$tmp/err")"
else
    fail "create_mnist_h5 over an existing file: exit $status: $(head -2 "$tmp/err")"
fi
run day2/create_mnist_h5 --data "$DATA" --out "$tmp/ours.h5" --force > /dev/null 2>&1
expect "create_mnist_h5 --force overwrites it (and leaves no temporary file)" \
    test $? -eq 0 -a -s "$tmp/ours.h5" -a -z "$(find "$tmp" -maxdepth 1 -name 'ours.h5.*')"

# An --out that cannot be written is refused before anything is: one line, no 55 MB leftover;
# exit 2 for a bad flag, 1 for a file that cannot be written (args.c tries it, like every output).
expect_refused() {  # exit status, message pattern, flags...
    local want=$1 pattern=$2; shift 2
    run day2/create_mnist_h5 --data "$DATA" "$@" > "$tmp/err" 2>&1
    local status=$? left
    left=$(find "$tmp" . -maxdepth 1 \( -name '*.partial' -o -name '*.tmp.*' -o -name '.write-check.*' \) 2> /dev/null)
    if [ $status -eq "$want" ] && [ "$(wc -l < "$tmp/err")" = 1 ] && grep -qE "$pattern" "$tmp/err" && [ -z "$left" ]; then
        pass "create_mnist_h5 $*: $(cat "$tmp/err")"
    else
        fail "create_mnist_h5 $*: exit $status, leftovers '$left': $(head -2 "$tmp/err")"
    fi
}
mkdir -p "$tmp/folder"
expect_refused 2 "^error: --out expects a FILE.h5, got ''" --out ''
expect_refused 1 "^\[rank 0 @ .*\] --out .*folder: is a directory$" --out "$tmp/folder"
expect_refused 1 "^\[rank 0 @ .*\] --out .*folder: is a directory$" --out "$tmp/folder" --force
expect_refused 1 "^\[rank 0 @ .*\] --out .*ours.h5/x.h5: .*ours.h5 is not a folder$" --out "$tmp/ours.h5/x.h5"
expect_refused 2 "^error: --out /dev/stdout: HDF5 writes a file it can seek in, not a stream" --out /dev/stdout --force
for level in -2 10 x; do
    expect_refused 2 "^error: --gzip expects an integer from -1 to 9, got '$level'" \
        --out "$tmp/gzip.h5" --gzip "$level"
done

# ---------------------------------------------------------------- step 11 trains like step 10
# One rank, no shuffle: groups of 100 in file order are the samples in file
# order, so both take the same steps on the same data (the same floats: exact).
run day2/10_mnist_ddp_multinode --data "$DATA" --no-shuffle --epochs 2 --losses "$tmp/s10.csv" --plot '' > /dev/null 2>&1
run "${step11[@]}" --h5 "$tmp/ours.h5" --no-shuffle --epochs 2 --losses "$tmp/s11.csv" > /dev/null 2>&1
expect_same_losses "step 11 (1 rank, --no-shuffle) takes step 10's steps, per-step losses within 1e-5" \
    "$tmp/s10.csv" "$tmp/s11.csv" 1e-5

if thorough; then  # make test-all: the other storages, the workers, a file written by h5py
# uint8 storage: the reader divides by 255 as create_mnist_h5 --float32 does: the same batches.
run "${step11[@]}" --h5 "$tmp/ours.h5" --epochs 2 --losses "$tmp/uint8.csv" > /dev/null 2>&1
run "${step11[@]}" --h5 "$tmp/ours_float32.h5" --epochs 2 --losses "$tmp/float32.csv" > /dev/null 2>&1
expect_same_losses "step 11 from the uint8 file == from the --float32 file (shuffled, 2 epochs)" \
    "$tmp/uint8.csv" "$tmp/float32.csv" 0
run "${step11[@]}" --h5 "$tmp/ours_gzip.h5" --epochs 2 --losses "$tmp/gzip.csv" > /dev/null 2>&1
expect_same_losses "step 11 from the gzip uint8 file (inflated by the workers) == from the uncompressed one" \
    "$tmp/uint8.csv" "$tmp/gzip.csv" 0

# ---------------------------------------------------------------- the workers
# Which worker reads a batch, and how far ahead, changes nothing: the same
# losses and the same final weights, bit for bit, from the gzip file (workers
# inflate in parallel) at 1, 2 and 4 workers and 1 or 3 batches ahead.
for setting in "1 1" "2 2" "4 3"; do
    set -- $setting
    run "${step11[@]}" --h5 "$tmp/ours_gzip.h5" --epochs 2 --workers "$1" --prefetch "$2" \
        --losses "$tmp/w$1.csv" > "$tmp/out_w$1" 2>&1
done
sums=$(for w in 1 2 4; do sed -n 's/.*parameter checksum \([0-9a-f]*\)/\1/p' "$tmp/out_w$w"; done)
expect "--workers 1/2/4 with --prefetch 1/2/3: bit-identical losses and final weights ($(echo $sums))" \
    eval 'cmp -s "$tmp/w1.csv" "$tmp/w2.csv" && cmp -s "$tmp/w1.csv" "$tmp/w4.csv" &&
          [ "$(echo "$sums" | wc -l)" = 3 ] && [ "$(echo "$sums" | sort -u | wc -l)" = 1 ]'
expect_same_losses "... and the same losses as the default settings" "$tmp/gzip.csv" "$tmp/w4.csv" 0
expect "step 11 says what each of its 4 workers read ($(grep -c '^Data: worker' "$tmp/out_w4") lines) and how long the loop waited" \
    eval '[ "$(grep -cE "^Data: worker [0-3]: [0-9]+ batches \([0-9]+ samples\), busy [0-9.]+ s" "$tmp/out_w4")" = 4 ] &&
          grep -qE "^Data: read 120000 samples .* 4 workers busy .* the loop waited [0-9.]+ s for data" "$tmp/out_w4"'


# ---------------------------------------------------------------- a file written by h5py
# The original's layout written by numpy + h5py, as the original's create_mnist_h5.py would.
if have_h5py; then
    "$PYTHON" - "$DATA" "$tmp/theirs.h5" << 'EOF'
import gzip, os, sys
import h5py, numpy as np
data, out = sys.argv[1:]
def idx(stem, header):
    name = os.path.join(data, stem)
    raw = gzip.open(name + ".gz").read() if os.path.exists(name + ".gz") else open(name, "rb").read()
    return np.frombuffer(raw, np.uint8, offset=header)
with h5py.File(out, "w") as f:
    for part, prefix in (("train", "train"), ("test", "t10k")):
        images = idx(prefix + "-images-idx3-ubyte", 16).reshape(-1, 100, 1, 28, 28).astype(np.float32) / 255
        labels = idx(prefix + "-labels-idx1-ubyte", 8).reshape(-1, 100).astype(np.int64)
        f.create_dataset(part + "/images", data=images, chunks=(1, 100, 1, 28, 28), compression="gzip")
        f.create_dataset(part + "/labels", data=labels, chunks=(1, 100), compression="gzip")
EOF
    run "${step11[@]}" --h5 "$tmp/theirs.h5" --epochs 2 --losses "$tmp/theirs.csv" > "$tmp/out_theirs" 2>&1
    accuracy=$(accuracy "$tmp/out_theirs")
    expect "step 11 trains from a file written by h5py (test accuracy ${accuracy:-none}% after 2 epochs)" \
        awk "BEGIN { exit !(${accuracy:-0} >= 70) }"
    expect_same_losses "step 11 from h5py's file == from create_mnist_h5's file" "$tmp/uint8.csv" "$tmp/theirs.csv" 0
else
    no_h5py "step 11 from a file written by h5py in the original's layout"
fi
fi  # thorough

# ---------------------------------------------------------------- 2 ranks
mpi 2 "${step11[@]}" --h5 "$tmp/ours.h5" --epochs 3 --losses "$tmp/r2.csv" --save "$tmp/w2.h5" --plot "$tmp/img/11.png" \
    > "$tmp/out2" 2>&1
expect "step 11 on 2 ranks: the mean loss falls every epoch ($(grep -o 'mean loss [0-9.]*' "$tmp/out2" | cut -d' ' -f3 | paste -sd' '))" \
    awk '/^epoch/ { loss = $5 + 0; if (seen && loss >= prev) bad = 1; prev = loss; seen = 1 } END { exit bad || !seen }' "$tmp/out2"
checksums=$(sed -n 's/.*parameter checksum \([0-9a-f]*\)/\1/p' "$tmp/out2")
expect "step 11 on 2 ranks ends with identical parameters on both ranks ($(echo $checksums))" \
    test "$(echo "$checksums" | wc -l)" = 2 -a "$(echo "$checksums" | sort -u | wc -l)" = 1
# Each rank reads its 300 groups an epoch, not the file: 3 x 30000 samples.
expect "each of 2 ranks reads only its half of the groups: $(grep '^Data: read' "$tmp/out2")" \
    grep -qE '^Data: read 90000 samples \([0-9.]+ MB of float32 pixels\) from uint8 chunks, [0-9.]+ workers? busy [0-9.]+ s in all: [0-9]+ MB/s per worker; the loop waited [0-9.]+ s for data' "$tmp/out2"
expect "step 11 --losses (3 epochs x 5 steps), --save and --plot write their files" \
    test "$(wc -l < "$tmp/r2.csv")" = 16 -a -s "$tmp/w2.h5" -a -s "$tmp/img/11.png"
mpi 2 "${step11[@]}" --h5 "$tmp/ours.h5" --epochs 1 --init "$tmp/w2.h5" --losses "$tmp/resume.csv" > /dev/null 2>&1
last=$(tail -1 "$tmp/r2.csv" | cut -d, -f3) first=$(sed -n 2p "$tmp/resume.csv" | cut -d, -f3)
expect "step 11 --init from its --save resumes where it ended (first loss ${first:-none}, last trained ${last:-none}; fresh: 2.3)" \
    awk "BEGIN { d = (${first:-9} - ${last:-0}) / ${last:-1}; exit !(d < 0.25 && d > -0.25) }"

# ---------------------------------------------------------------- bad input
# One clear line, the right exit status, no core dump, no hang: at 2 ranks.
expect_error 1 "missing.h5: cannot open: No such file or directory\. Write it with \`day2/create_mnist_h5 --out $tmp/missing.h5\`" \
    mpi 2 "${step11[@]}" --h5 "$tmp/missing.h5"
expect "a missing file on 2 ranks is reported once" test "$(grep -c 'cannot open' "$tmp/err")" = 1
expect_error 2 '^error: --batch_size 6450 is not a multiple of 100' mpi 2 "${step11[@]}" --h5 "$tmp/ours.h5" --batch_size 6450
expect_error 2 '^error: --prefetch expects an integer from 1' mpi 2 "${step11[@]}" --h5 "$tmp/ours.h5" --prefetch 0
expect_error 2 '^error: --workers expects an integer from 0 to 256' mpi 2 "${step11[@]}" --h5 "$tmp/ours.h5" --workers 100000
# W x K slots that no node holds (16384 batches of 822 MB): one line, before any is allocated.
expect_error 2 '^error: --batch_size 1048500 --workers 256 --prefetch 64 needs about [0-9.]+ TB per rank \(.*batch slots [0-9.]+ TB\), more than ' \
    mpi 2 "${step11[@]}" --h5 "$tmp/ours.h5" --workers 256 --prefetch 64 --batch_size 1048500
expect_error 2 '^error: --gzip expects an integer from -1 to 9' run day2/create_mnist_h5 --data "$DATA" --out "$tmp/x.h5" --gzip 10
# A truncated file (a copy cut at half): HDF5 sees it at open, every rank says so at once.
head -c $(( $(stat -c %s "$tmp/ours_gzip.h5") / 2 )) "$tmp/ours_gzip.h5" > "$tmp/truncated.h5"
expect_error 1 "truncated.h5: cannot open the HDF5 file: truncated file" mpi 2 "${step11[@]}" --h5 "$tmp/truncated.h5"
echo "not hdf5" > "$tmp/text.h5"
expect_error 1 'text.h5: not an HDF5 file' mpi 2 "${step11[@]}" --h5 "$tmp/text.h5"
mkfifo "$tmp/fifo.h5"  # opening it would wait for a writer: refused before opening
expect_error 1 'fifo.h5: is not a regular file \(a FIFO, a socket or a device\), not an HDF5 file' \
    mpi 2 "${step11[@]}" --h5 "$tmp/fifo.h5"
expect_error 1 'MNIST not found.*Run `make data`' run day2/create_mnist_h5 --data "$tmp/nowhere" --out "$tmp/x.h5"
expect_error 2 '^error: create_mnist_h5 writes one file: run it as one process, not on 2 ranks' \
    mpi 2 day2/create_mnist_h5 --data "$DATA" --out "$tmp/x.h5"

if have_h5py; then
    # Small files (2 groups) with one thing wrong each.
    "$PYTHON" - "$tmp" << 'EOF'
import sys
import h5py, numpy as np
tmp = sys.argv[1]
def write(name, images=None, labels=None, skip=()):
    good_images, good_labels = np.zeros((2, 100, 1, 28, 28), np.float32), np.zeros((2, 100), np.int64)
    with h5py.File(f"{tmp}/{name}.h5", "w") as f:
        for part in ("train", "test"):
            for what, default, override in (("images", good_images, images), ("labels", good_labels, labels)):
                if f"{part}/{what}" not in skip:
                    f[f"{part}/{what}"] = override if override is not None and part == "train" else default
write("no_labels", skip=("test/labels",))
write("shape", images=np.zeros((2, 100, 784), np.float32))
write("float64", images=np.zeros((2, 100, 1, 28, 28), np.float64))
write("float_labels", labels=np.zeros((2, 100), np.float32))
write("count", labels=np.zeros((3, 100), np.int64))
bad = np.zeros((2, 100), np.int64)
bad[1, 3] = 12
write("label_value", labels=bad)
write("all_label_value", labels=np.full((3, 100), 12, np.int64), images=np.zeros((3, 100, 1, 28, 28), np.float32))
write("test_label_value")
with h5py.File(f"{tmp}/test_label_value.h5", "r+") as f:
    f["test/labels"][1, 3] = 12
EOF
    expect_error 1 "no_labels.h5: no dataset 'test/labels' \(expected int64 \[groups, 100\], as day2/create_mnist_h5 writes\)" \
        mpi 2 "${step11[@]}" --h5 "$tmp/no_labels.h5"
    expect_error 1 "shape.h5: dataset 'train/images' is float32 \[2, 100, 784\] \(expected float32 or uint8 \[groups, 100, 1, 28, 28\]\)" \
        mpi 2 "${step11[@]}" --h5 "$tmp/shape.h5"
    expect_error 1 "float64.h5: dataset 'train/images' is float64 \[2, 100, 1, 28, 28\] \(expected float32 or uint8" \
        mpi 2 "${step11[@]}" --h5 "$tmp/float64.h5"
    expect_error 1 "float_labels.h5: dataset 'train/labels' is float32 \[2, 100\] \(expected int64 \[groups, 100\]\)" \
        mpi 2 "${step11[@]}" --h5 "$tmp/float_labels.h5"
    expect_error 1 "count.h5: 'train/images' has 2 groups but 'train/labels' has 3" mpi 2 "${step11[@]}" --h5 "$tmp/count.h5"
    # Found while streaming, on the rank that reads it (rank 1 gets group 1): the ranks agree, one line.
    expect_error 1 "label_value.h5: 'train/labels' group 1, sample 3: label 12 \(expected 0\.\.9\)" \
        mpi 2 "${step11[@]}" --h5 "$tmp/label_value.h5" --no-shuffle --epochs 1
    # Every training label bad, on 3 ranks: each meets one in its own first batch, at once. Agreed
    # at the batch, one line from one rank (with MPI_Abort, a line from each as Open MPI took them
    # down: the fuzzer's finding).
    expect_error 1 "all_label_value.h5: 'train/labels' group [0-2], sample 0: label 12 \(expected 0\.\.9\)" \
        mpi 3 "${step11[@]}" --h5 "$tmp/all_label_value.h5" --epochs 1
    expect "... in one line of ours, not Open MPI's MPI_ABORT: $(grep -c '^\[rank' "$tmp/err") line(s)" \
        test "$(grep -c '^\[rank' "$tmp/err")" = 1 -a "$(grep -c 'MPI_ABORT' "$tmp/err")" = 0
    # Every rank reads the whole test set, so every rank meets its damage alike: agreed, one line
    # from one rank (not a line from each and Open MPI's noise as they abort at once).
    expect_error 1 "test_label_value.h5: 'test/labels' group 1, sample 3: label 12 \(expected 0\.\.9\)" \
        mpi 2 "${step11[@]}" --h5 "$tmp/test_label_value.h5" --epochs 1
    expect "... in one line of ours, and nothing from Open MPI but its blocks: $(grep -c '^\[rank' "$tmp/err") line(s)" \
        test "$(grep -c '^\[rank' "$tmp/err")" = 1 -a "$(grep -c 'ORTE_ERROR_LOG' "$tmp/err")" = 0

    # Damaged chunks in copies of the gzip file, found by a worker of the rank
    # that reads the group (2 ranks, no shuffle: rank 1 reads group 5 in its 1st
    # batch); the job ends with the worker's line, no rank or thread left waiting.
    "$PYTHON" - "$tmp/ours_gzip.h5" "$tmp" << 'EOF'
import shutil, sys
import h5py
source, tmp = sys.argv[1:]
def damage(name, how):
    shutil.copy(source, f"{tmp}/{name}.h5")
    with h5py.File(f"{tmp}/{name}.h5", "r+") as f:
        how(f["train/images"])
def corrupt(images):
    mask, chunk = images.id.read_direct_chunk((5, 0, 0, 0, 0))
    images.id.write_direct_chunk((5, 0, 0, 0, 0), chunk[:2] + bytes(b ^ 0x5A for b in chunk[2:]), mask)
def short(images):  # stored raw (filter mask 1), one image short
    images.id.write_direct_chunk((5, 0, 0, 0, 0), bytes(99 * 784), 1)
damage("corrupt_chunk", corrupt)
damage("short_chunk", short)
# A chunk never written: group 5 of 6 left out.
with h5py.File(source, "r") as src, h5py.File(f"{tmp}/missing_chunk.h5", "w") as dst:
    for part in ("train", "test"):
        images, labels = src[part + "/images"], src[part + "/labels"]
        n = 6 if part == "train" else images.shape[0]
        out = dst.create_dataset(part + "/images", (n,) + images.shape[1:], images.dtype, chunks=images.chunks,
                                 compression="gzip")
        for g in range(n):
            if not (part == "train" and g == 5):
                out[g] = images[g]
        dst[part + "/labels"] = labels[:n]
EOF
    expect_error 1 "corrupt_chunk.h5: 'train/images' group 5: corrupt gzip data" \
        mpi 2 "${step11[@]}" --h5 "$tmp/corrupt_chunk.h5" --no-shuffle --epochs 1 --workers 2
    expect_error 1 "short_chunk.h5: 'train/images' group 5: its chunk is 77616 bytes, one group is 78400" \
        mpi 2 "${step11[@]}" --h5 "$tmp/short_chunk.h5" --no-shuffle --epochs 1
    expect_error 1 "missing_chunk.h5: 'train/images' group 5: its chunk is missing \(never written\)" \
        mpi 2 "${step11[@]}" --h5 "$tmp/missing_chunk.h5" --no-shuffle --epochs 1 --batch_size 300

    # Filters the workers do not decode (shuffle + gzip, as h5py's shuffle=True
    # writes): read with H5Dread, the same batches, and rank 0 says so once.
    "$PYTHON" - "$tmp/ours_gzip.h5" "$tmp/shuffled.h5" << 'EOF'
import sys
import h5py
source, out = sys.argv[1:]
with h5py.File(source, "r") as src, h5py.File(out, "w") as dst:
    for name in ("train/images", "train/labels", "test/images", "test/labels"):
        dst.create_dataset(name, data=src[name][:], chunks=src[name].chunks, compression="gzip", shuffle=True)
EOF
    mpi 2 "${step11[@]}" --h5 "$tmp/shuffled.h5" --epochs 3 --losses "$tmp/shuffled.csv" > "$tmp/out_shuffled" 2>&1
    expect "a file with the shuffle filter trains through H5Dread, and rank 0 says so once: $(grep -m1 'H5Dread' "$tmp/out_shuffled")" \
        eval '[ "$(grep -c "read with H5Dread, one worker at a time: .train/images. (filters \[shuffle, deflate\])" "$tmp/out_shuffled")" = 1 ]'
    expect_same_losses "... and takes the same steps as from our file (2 ranks, 3 epochs)" "$tmp/r2.csv" "$tmp/shuffled.csv" 0
    # ... and a damaged chunk there: H5Dread fails in a worker thread, whose HDF5 error stack
    # (kept per thread by a thread-safe HDF5) must be as quiet as the main thread's: one line.
    "$PYTHON" - "$tmp/shuffled.h5" "$tmp/shuffled_bad.h5" << 'EOF'
import shutil, sys
import h5py
shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "r+") as f:
    images = f["train/images"]
    mask, chunk = images.id.read_direct_chunk((5, 0, 0, 0, 0))
    images.id.write_direct_chunk((5, 0, 0, 0, 0), bytes(b ^ 0x5A for b in chunk), mask)
EOF
    expect_error 1 "shuffled_bad.h5: cannot read 'train/images' group 5" \
        mpi 2 "${step11[@]}" --h5 "$tmp/shuffled_bad.h5" --no-shuffle --epochs 1
    expect "... in one line of ours, without HDF5's error stack: $(grep -c 'HDF5-DIAG' "$tmp/err") HDF5-DIAG lines" \
        test "$(grep -c 'HDF5-DIAG' "$tmp/err")" -eq 0
else
    no_h5py "step 11 on files with a missing dataset, a wrong shape, a wrong dtype, mismatched groups, a bad label"
fi

# ---------------------------------------------------------------- memory
# Step 10 holds the data set (uint8) and the test set as float32; step 11 two
# batches. Peak RSS of one process, the same batch (3200) for both. What both
# share (libraries, the threads' BLAS buffers, the model) grows with the
# cores, so compare the difference, not the ratio: step 11 must save at least
# the 47040 kB of training pixels that it never loads.
if ! thorough; then :  # make test-all
elif no_peak_memory "peak memory of step 11 vs step 10" day2/11_multinode_streaming; then :
else
    rss10=$(peak_kb day2/10_mnist_ddp_multinode --data "$DATA" --epochs 1 --batch_size 3200 --plot '')
    rss11=$(peak_kb day2/11_multinode_streaming --h5 "$tmp/ours.h5" --epochs 1 --batch_size 3200 --plot '')
    expect "step 11 peaks at ${rss11:-?} kB, at least the training set's 47040 kB under step 10's ${rss10:-?} kB (batch 3200, 1 rank)" \
        awk "BEGIN { exit !(${rss11:-0} > 0 && ${rss10:-0} - ${rss11:-0} >= 47040) }"
    # O(workers x prefetch x batch), not O(data set): 4 x the training groups,
    # the same peak, at 1, 2 and 4 workers.
    if have_h5py; then
        "$PYTHON" - "$tmp/ours.h5" "$tmp/big.h5" << 'EOF'
import sys
import h5py
source, out = sys.argv[1:]
with h5py.File(source, "r") as src, h5py.File(out, "w") as dst:
    for part, copies in (("train", 4), ("test", 1)):
        images, labels = src[part + "/images"], src[part + "/labels"]
        n = images.shape[0]
        big_images = dst.create_dataset(part + "/images", (copies * n,) + images.shape[1:], images.dtype,
                                        chunks=images.chunks)
        big_labels = dst.create_dataset(part + "/labels", (copies * n, 100), labels.dtype, chunks=(1, 100))
        for c in range(copies):  # group by group: this script holds one group too
            for g in range(n):
                big_images[c * n + g] = images[g]
            big_labels[c * n:(c + 1) * n] = labels[:]
EOF
        for workers in 1 2 4; do
            rss_small=$(peak_kb day2/11_multinode_streaming --h5 "$tmp/ours.h5" --epochs 1 --batch_size 3200 --plot '' --workers $workers)
            rss_big=$(peak_kb day2/11_multinode_streaming --h5 "$tmp/big.h5" --epochs 1 --batch_size 3200 --plot '' --workers $workers)
            expect "step 11 with $workers worker(s) x 2 ahead on 4x the training groups (2400) peaks at ${rss_big:-?} kB, within 5% of 600 groups' ${rss_small:-?} kB" \
                awk "BEGIN { r = ${rss_big:-0} / ${rss_small:-1}; exit !(r < 1.05 && r > 0.95) }"
        done
    else
        no_h5py "step 11's peak memory on a 4x larger file"
    fi
fi

exit_status  # every test exits non-zero when it fails
