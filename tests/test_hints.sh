#!/usr/bin/env bash
# Errors that point the way (issue 26, item 5), and the small oddities of the
# output that went with them. A few seconds in all:
#   - an unknown flag names the closest known one, once, on every rank alike
#     ("did you mean --epochs?"; step 13's --total_epochs for --epochs), and
#     nothing when no flag is close;
#   - a missing MNIST folder or HDF5 file, given relative to a working directory
#     that is not where it is (./2_mnist_training inside day1/), names that
#     working directory and the folder above it that has the files;
#   - the output says "1 step", "1 rank", "1 batch", not "1 steps"; step 13 with
#     nothing left to train prints no DDP report; step 11's share of time spent
#     waiting for data agrees with the seconds it prints.
# slurm/run_with_restarts.sh's final statuses are checked in
# test_fault_tolerance.sh, multinode_setup_and_run.sh's hint in test_slurm.sh.
# One PASS/FAIL/SKIP line per check (tests/run.sh counts them).
set -u
cd "$(dirname "$0")/.."
repo=$(pwd)
source tests/lib.sh
suite hints
scratch
RUN_TIMEOUT=60  # the runs stop at a flag or a missing file, or train one epoch in one batch

# expect_line WHAT STATUS LINE COMMAND...: COMMAND exits with STATUS and
# prints LINE (exactly, as a whole line) once.
expect_line() {
    local what=$1 want=$2 line=$3
    shift 3
    "$@" > "$tmp/out" 2>&1
    local status=$?
    if [ $status = "$want" ] && [ "$(grep -cxF -- "$line" "$tmp/out")" = 1 ]; then
        pass "$what: exit $want, \"$line\""
    else
        fail "$what: expected exit $want and the line \"$line\" once (got exit $status: $(head -c 300 "$tmp/out"))"
    fi
}

# ---------------------------------------------------------------- flags
expect_line "an unknown flag on 2 ranks names the closest flag, once" 2 \
    "error: unknown flag '--epoch': did you mean --epochs? (see --help)" mpi 2 day1/6_mnist_ddp --epoch 3
expect "... and no other line names it" test "$(grep -c "unknown flag" "$tmp/out")" = 1
expect_line "step 13's --epochs points to the DDP tutorial's --total_epochs" 2 \
    "error: unknown flag '--epochs': did you mean --total_epochs? (see --help)" run day3/13_fault_tolerant_ddp --epochs 3
expect_line "DataLoader's --num_workers points to step 11's --workers" 2 \
    "error: unknown flag '--num_workers': did you mean --workers? (see --help)" run day2/11_multinode_streaming --num_workers=2
expect_line "a flag like none of the table's gets no suggestion" 2 \
    "error: unknown flag '--bogus' (see --help)" run day1/2_mnist_training --bogus
expect_line "--batch-size is --batch_size, and errors name it as --help does" 2 \
    "error: --batch_size expects an integer from 1 to 1048576, got '0' (see --help)" run day1/2_mnist_training --batch-size 0

# ---------------------------------------------------------------- data paths
# A layout of our own: the files are in $tmp/top/data, the program runs in
# $tmp/top/sub, as ./2_mnist_training inside day1/ would.
mkdir -p "$tmp/top/sub" "$tmp/top/data/mnist" "$tmp/elsewhere"
touch "$tmp/top/data/mnist/train-images-idx3-ubyte.gz" "$tmp/top/data/mnist.h5"
(cd "$tmp/top/sub" && expect_line "--data data/mnist from a folder below the one that has it" 1 \
    "[rank 0 @ $(hostname)] MNIST not found: no data/mnist/train-images-idx3-ubyte[.gz] relative to the working directory $tmp/top/sub; run from $tmp/top or pass --data $tmp/top/data/mnist" \
    run "$repo/day1/2_mnist_training" --data data/mnist)
# The same with the plain file (make data unpacks each .gz beside it): either name, the nearest
# folder, whichever the repository's own data/mnist holds.
mkdir -p "$tmp/plain/sub" "$tmp/plain/data/mnist"
touch "$tmp/plain/data/mnist/train-images-idx3-ubyte"
(cd "$tmp/plain/sub" && expect_line "--data data/mnist from below a folder that has the unpacked file" 1 \
    "[rank 0 @ $(hostname)] MNIST not found: no data/mnist/train-images-idx3-ubyte[.gz] relative to the working directory $tmp/plain/sub; run from $tmp/plain or pass --data $tmp/plain/data/mnist" \
    run "$repo/day1/2_mnist_training" --data data/mnist)
(cd "$tmp/top/sub" && expect_line "step 11's --h5 data/mnist.h5 from a folder below the one that has it" 1 \
    "[rank 0 @ $(hostname)] data/mnist.h5: not found relative to the working directory $tmp/top/sub; run from $tmp/top or pass --h5 $tmp/top/data/mnist.h5" \
    run "$repo/day2/11_multinode_streaming" --h5 data/mnist.h5)
(cd "$tmp/elsewhere" && expect_line "step 11's --h5 nothere.h5, nowhere: the working directory and create_mnist_h5 --out" 1 \
    "[rank 0 @ $(hostname)] nothere.h5: cannot open: No such file or directory (working directory $tmp/elsewhere). Write it with \`day2/create_mnist_h5 --out nothere.h5\`" \
    run "$repo/day2/11_multinode_streaming" --h5 nothere.h5)
(cd "$tmp/elsewhere" && expect_line "--data nothere, nowhere: the working directory, and no make data (it fetches into data/mnist)" 1 \
    "[rank 0 @ $(hostname)] MNIST not found: no nothere/train-images-idx3-ubyte[.gz] relative to the working directory $tmp/elsewhere. Pass --data DIR, the folder with the MNIST files" \
    run "$repo/day1/2_mnist_training" --data nothere)
# The default data/mnist and data/mnist.h5 nowhere, neither here nor in the
# repository (a copy of the programs beside a Makefile of its own, with no data):
# make data, or create_mnist_h5, there.
mkdir -p "$tmp/repo/day1" "$tmp/repo/day2"
touch "$tmp/repo/Makefile"
cp day1/2_mnist_training "$tmp/repo/day1/" && cp day2/11_multinode_streaming "$tmp/repo/day2/"
(cd "$tmp/elsewhere" && expect_line "MNIST nowhere: make data in the repository root" 1 \
    "[rank 0 @ $(hostname)] MNIST not found: no data/mnist/train-images-idx3-ubyte[.gz] relative to the working directory $tmp/elsewhere. Run \`make data\` in the repository root $tmp/repo and run from there (or pass --data DIR)" \
    run "$tmp/repo/day1/2_mnist_training")
(cd "$tmp/repo" && expect_line "MNIST nowhere, run from the repository root: make data" 1 \
    "[rank 0 @ $(hostname)] MNIST not found: no data/mnist/train-images-idx3-ubyte[.gz] relative to the working directory $tmp/repo. Run \`make data\` (or pass --data DIR)" \
    run day1/2_mnist_training)
(cd "$tmp/elsewhere" && expect_line "data/mnist.h5 nowhere: create_mnist_h5 in the repository root" 1 \
    "[rank 0 @ $(hostname)] data/mnist.h5: cannot open: No such file or directory (working directory $tmp/elsewhere). Write it with \`day2/create_mnist_h5\` in the repository root $tmp/repo and run from there" \
    run "$tmp/repo/day2/11_multinode_streaming")
if have_mnist; then
    (cd day1 && expect_line "./2_mnist_training inside day1/: run from the repository root, no make data" 1 \
        "[rank 0 @ $(hostname)] MNIST not found: no data/mnist/train-images-idx3-ubyte[.gz] relative to the working directory $repo/day1; run from the repository root $repo or pass --data $repo/data/mnist" \
        run ./2_mnist_training)
else
    skip "./2_mnist_training inside day1/ (no MNIST in $DATA: make data)"
fi

# ---------------------------------------------------------------- one step, one rank
# Every program's epoch line takes "step%s": the same change in each, so that
# consecutive steps stay diffable.
plural=$(grep -n 'over %d steps' day1/*.c day2/*.c day3/*.c)
expect "no program prints 'over %d steps' whatever the count${plural:+: $plural}" test -z "$plural"
if have_mnist; then
    run day1/2_mnist_training --data "$DATA" --epochs 1 --batch_size 60000 --plot '' > "$tmp/out" 2>&1
    expect "step 2 with one batch per epoch: 'over 1 step' ($(grep '^epoch' "$tmp/out"))" \
        grep -q '^epoch 1/1: mean loss [0-9.]* over 1 step, ' "$tmp/out"
    # Step 13 with nothing left to train: no DDP report of steps it never took.
    # The snapshot, made on 1 rank, is resumed on 2: "made on 1 rank".
    snapshot=(--data "$DATA" --total_epochs 1 --batch_size 60000 --plot '' --snapshot "$tmp/snapshot.h5")
    run day3/13_fault_tolerant_ddp "${snapshot[@]}" > "$tmp/first" 2>&1
    mpi 2 day3/13_fault_tolerant_ddp "${snapshot[@]}" > "$tmp/out" 2>&1
    status=$?
    expect "step 13 resumed with nothing left to train: exit 0, no 'DDP:' line ($(grep -E '^(Nothing|DDP)' "$tmp/out" | tr '\n' ' '))" \
        test $status = 0 -a -n "$(grep '^Nothing left to train: 1 of --total_epochs 1 done$' "$tmp/out")" \
        -a -z "$(grep '^DDP:' "$tmp/out")" -a -n "$(grep '^DDP:' "$tmp/first")"
    expect "step 13 resumed on 2 ranks from a snapshot of 1: 'made on 1 rank,'" \
        grep -q '^The snapshot was made on 1 rank, this run has 2:' "$tmp/out"
    # Step 11: one batch, and the share of the time spent waiting for data
    # computed from the seconds it prints beside it.
    if run day2/create_mnist_h5 --data "$DATA" --out "$tmp/mnist.h5" > "$tmp/create" 2>&1; then
        run day2/11_multinode_streaming --h5 "$tmp/mnist.h5" --epochs 1 --batch_size 60000 --plot '' > "$tmp/out" 2>&1
        expect "step 11 with one batch: 'over 1 step' and 'worker 0: 1 batch (60000 samples)'" \
            bash -c "grep -q ' over 1 step, ' '$tmp/out' && grep -q 'worker 0: 1 batch (60000 samples)' '$tmp/out'"
        waited=$(grep -o 'waited [0-9.]* s for data ([0-9]*% of [0-9.]* s)' "$tmp/out")
        expect "step 11's share of time waited agrees with its seconds ($waited)" \
            awk -v line="$waited" 'BEGIN { n = split(line, w, /[ (%]+/)  # waited X s for data P of T s
                                           exit !(n == 9 && w[8] > 0 && w[6] == sprintf("%.0f", 100 * w[2] / w[8])) }'
    else
        fail "day2/create_mnist_h5 --out $tmp/mnist.h5: $(tail -1 "$tmp/create")"
    fi
else
    skip "the runs of steps 2, 11 and 13 (no MNIST in $DATA: make data)"
fi
run day1/test_profile --steps 1 --trace "$tmp/trace.json" > "$tmp/out" 2>&1
expect "test_profile --steps 1 on 1 rank: '1 step, 1 rank' ($(head -1 "$tmp/out" | cut -c1-140))" \
    grep -q ', 1 step, 1 rank;' "$tmp/out"
