#!/usr/bin/env bash
# The fuzzing target (tests/fuzz/fuzz.py, issue 36): every kind of input the programs read (MovieLens
# CSVs, --init files, MNIST IDX files, step 13's snapshots, steps 19-20's text, the sharded checkpoints,
# flag values), mutated from a seed, run, and
# each run classified as refused (one clean line), trained (finite results), crashed or hung.
# - At every level: the classifier itself, on stand-in programs that refuse, train, segfault, print two
#   lines or a control byte, print nan, leave a temporary file, fail an allocation, hang, or leave a
#   process behind; each must get its verdict (so the fuzzer can fail).
# - make test-all: a fixed seed and FUZZ_COUNT runs per input kind (a minute or two on 2 cores), one FAIL
#   line per crashed or hung run with its reproducer, one PASS line per kind whose runs all passed.
# Longer runs, other seeds and the sanitizer tree: docs/tests.md (Fuzzing).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite fuzz

if ! have_h5py; then
    skip "$PYTHON has no h5py (./setup.sh --with-reference)"
    exit 0
fi
scratch
"$PYTHON" tests/fuzz/fuzz.py --self-test --results "$tmp"

if ! thorough; then
    skip "the mutated inputs run in make test-all (TEST_LEVEL=all), or tests/fuzz/fuzz.py alone"
elif ! DATA=data/mnist have_mnist; then
    skip "no MNIST in data/mnist (make data)"
elif [ ! -f data/movielens/ratings.csv ]; then
    skip "no MovieLens in data/movielens (make movielens)"
else
    # Reproducers of failed runs stay in build/fuzz (the FAIL lines name them); the rest goes.
    "$PYTHON" tests/fuzz/fuzz.py --seed "${FUZZ_SEED:-36}" --count "${FUZZ_COUNT:-6}" --results build/fuzz
    [ $? -le 1 ] || fail "tests/fuzz/fuzz.py could not run (above)"
fi
