#!/usr/bin/env bash
# The guides' outputs stay true: tests/check_guides.py runs every command that
# day1/, day2/ and day3/README.md mark (<!-- output of: ... -->) and the
# command of every program's header, and compares what they print with the
# output shown (losses, accuracies, checksums, sums, tables of results; times
# and hosts masked). A change that moves a number fails here until the text
# follows. TEST_LEVEL=all (make test-all) runs the slow ones too (step 14's epochs).
#
# First, the checker itself must fail where it should: on a guide whose output
# is wrong by one number, and on a marker whose command the reader never sees.
set -u
cd "$(dirname "$0")/.."
if ! command -v python3 > /dev/null; then
    echo "SKIP guides: no python3 to read the guides (./setup.sh installs it)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

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
        echo "FAIL guides: $1: passes"
    elif grep -q -- "$3" "$tmp/out"; then
        echo "PASS guides: $1: fails, saying so"
    else
        echo "FAIL guides: $1: fails for another reason: $(head -3 "$tmp/out")"
    fi
}
expect_refused "a guide with one wrong number ('sum 11' where the program prints 'sum 10')" "$tmp/wrong.md" \
    'expected: \[rank 1\] after allreduce: sum 11'
sed 's/^mpirun --oversubscribe -np 4 day1\/0_dist_allreduce$/mpirun -np 4 day1\/0_dist_allreduce/' "$tmp/wrong.md" > "$tmp/hidden.md"
expect_refused "a marker whose command the reader does not see (in no sh block)" "$tmp/hidden.md" 'is in no ```sh block'

python3 tests/check_guides.py "$@"
