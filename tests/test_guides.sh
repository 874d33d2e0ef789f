#!/usr/bin/env bash
# The guides' outputs stay true: tests/check_guides.py runs every command that
# day1/ to day4/README.md mark (<!-- output of: ... -->) and the
# command of every program's header, and compares what they print with the
# output shown, as printed, spacing included (times and hosts masked). A change
# that moves a number or a column fails here until the text follows. Off the
# guides' kernels (README.md), results that sum through BLAS are compared within
# the tolerance that tests/check_guides.py states. TEST_LEVEL=all (make test-all)
# runs the slow ones too (step 14's epochs).
#
# First, the checker itself must fail where it should: on a guide whose output
# is wrong by one number, on a marker whose command the reader never sees, on a
# table whose columns moved, and off the guides' kernels on an accuracy beyond
# its tolerance (and pass within it).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite guides
if ! command -v python3 > /dev/null; then
    skip "no python3 to read the guides (./setup.sh installs it)"
    exit 0
fi
scratch

fence='```'
cat > "$tmp/wrong.md" <<GUIDE
${fence}sh
mpirun --oversubscribe -np 4 day1/0_dist_allreduce
${fence}
<!-- output of: mpirun --oversubscribe -np 4 day1/0_dist_allreduce -->
${fence}
[rank 0] after allreduce: sum 10, mean 2.5
[rank 1] after allreduce: sum 11, mean 2.5
${fence}
GUIDE
# expect_refused WHAT GUIDE PATTERN: the checker fails on GUIDE, with a line matching PATTERN.
expect_refused() {
    if python3 tests/check_guides.py "$2" > "$tmp/out" 2>&1; then
        fail "$1: passes"
    elif grep -q -- "$3" "$tmp/out"; then
        pass "$1: fails, saying so"
    else
        fail "$1: fails for another reason: $(head -3 "$tmp/out")"
    fi
}
expect_refused "a guide with one wrong number ('sum 11' where the program prints 'sum 10')" "$tmp/wrong.md" \
    'expected: \[rank 1\] after allreduce: sum 11'
sed 's/^mpirun --oversubscribe -np 4 day1\/0_dist_allreduce$/mpirun -np 4 day1\/0_dist_allreduce/' "$tmp/wrong.md" > "$tmp/hidden.md"
expect_refused "a marker whose command the reader does not see (in no sh block)" "$tmp/hidden.md" 'is in no ```sh block'


# A guide made from what COMMAND prints here (with OPENBLAS_CORETYPE=$1 when not empty), its
# lines edited by the Python expression $3 (of `line`): guide_of KERNEL COMMAND EDIT > FILE.
guide_of() {
    local printed
    printed=$(env ${1:+OPENBLAS_CORETYPE=$1} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash -c "$2" 2>&1)
    printf '%ssh\n%s\n%s\n<!-- output of: %s -->\n%s\n' "$fence" "$2" "$fence" "$2" "$fence"
    printf '%s\n' "$printed" | python3 -c 'import re, sys
for line in sys.stdin.read().splitlines():
    print(eval(sys.argv[1]))' "$3"
    echo "$fence"
}
# expect_passed WHAT KERNEL GUIDE PATTERN: the checker passes GUIDE under KERNEL, with a line matching PATTERN.
expect_passed() {
    if OPENBLAS_CORETYPE=$2 python3 tests/check_guides.py "$3" > "$tmp/out" 2>&1 && grep -q -- "$4" "$tmp/out"; then
        pass "$1: passes, saying so"
    else
        fail "$1: $(grep -m1 -E '^(PASS|FAIL)' "$tmp/out")"
    fi
}

# Spacing counts: one space more inside a table's row (its columns moved since the guide was
# made) fails, beside masked columns (times) as elsewhere.
table="mpirun --oversubscribe -np 2 day4/16_pipeline_ddp --pp 2 --epochs 1 --plot ''"
guide_of "" "$table" "re.sub(r'^(    1  fc.2 +[\d.]+%) ', r'\1', line)" > "$tmp/columns.md"
expect_refused "a table whose columns moved (one space less before a masked time than printed)" "$tmp/columns.md" \
    'expected:     1  fc.2'
guide_of "" "day1/2_mnist_training --epochs 1 --plot ''" "line.replace('mean loss', 'mean  loss')" > "$tmp/spaced.md"
expect_refused "a line with two spaces where the program prints one" "$tmp/spaced.md" 'expected: epoch 1/1: mean  loss'

# Off the guides' kernels (README.md: SkylakeX), an accuracy may move by 10 test samples and
# no further, and the PASS line says what moved; on them, not by one.
step2="day1/2_mnist_training --epochs 1 --plot ''"
moved() {  # the Python expression that moves the accuracy of step 2's last line by $1 samples
    echo "re.sub(r'accuracy: ([\d.]+)% \((\d+) of', lambda m: 'accuracy: %.2f%% (%d of' % ((int(m.group(2)) + $1) / 100, int(m.group(2)) + $1), line)"
}
# can_force KERNEL: OpenBLAS runs KERNEL here when OPENBLAS_CORETYPE asks (the CPU has its instructions).
can_force() {
    case $1 in Haswell) grep -qw avx2 /proc/cpuinfo ;; SkylakeX) grep -qw avx512f /proc/cpuinfo ;; esac 2> /dev/null &&
        OPENBLAS_CORETYPE=$1 build/tools/blas_kernels | grep -q "($1 kernels)"
}
if can_force Haswell; then
    guide_of Haswell "$step2" "$(moved 3)" > "$tmp/near.md"
    expect_passed "off the guides' kernels (Haswell), an accuracy 3 samples from the one printed" Haswell "$tmp/near.md" \
        "within the tolerance of OpenBLAS's Haswell kernels for .*(shown: "
    guide_of Haswell "$step2" "$(moved 11)" > "$tmp/far.md"
    OPENBLAS_CORETYPE=Haswell expect_refused "off the guides' kernels (Haswell), an accuracy 11 samples from the one printed" "$tmp/far.md" \
        "results compared within 5 units of a loss's last digit, 10 test samples of an accuracy"
else
    skip "the tolerance off the guides' kernels: OPENBLAS_CORETYPE=Haswell cannot be forced here ($(build/tools/blas_kernels))"
fi
if can_force SkylakeX; then
    guide_of SkylakeX "$step2" "$(moved 1)" > "$tmp/exact.md"
    OPENBLAS_CORETYPE=SkylakeX expect_refused "on the guides' kernels (SkylakeX), an accuracy 1 sample from the one printed" \
        "$tmp/exact.md" 'expected: Training completed in .* Test accuracy'
else
    skip "exact results on the guides' kernels: this CPU cannot run OpenBLAS's SkylakeX kernels (no AVX-512)"
fi

python3 tests/check_guides.py "$@"
