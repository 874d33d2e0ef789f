#!/usr/bin/env bash
# Run every unit test (build/tests/*) and integration script (tests/test_*.sh),
# or just the ones named as arguments,
# count their "PASS ..." / "FAIL ..." / "SKIP ..." lines, and end with the one line
#   N passed, N failed[, N skipped]
# A test program that exits non-zero without printing a FAIL (a crash) counts as a failure.
set -u
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
crashed=0
run() {
    local name=$1; shift
    local out status
    out=$(mktemp)
    # The CPU tests run on the CPU wherever they run: GPUs are hidden from
    # them (--device auto would otherwise take one). The GPU tests see them.
    local hide_gpus=(env CUDA_VISIBLE_DEVICES=)
    case $name in *gpu*) hide_gpus=() ;; esac
    # Show the verdicts as they come; keep the whole output for the count.
    "${hide_gpus[@]}" "$@" 2>&1 | tee "$out" | grep --line-buffered -E '^(PASS|FAIL|SKIP) '
    status=${PIPESTATUS[0]}
    cat "$out" >> "$log"
    if [ "$status" -ne 0 ] && ! grep -q '^FAIL ' "$out"; then
        echo "FAIL $name: exited with status $status without a FAIL line; its output:"
        tail -20 "$out" | sed 's/^/    /'
        crashed=$((crashed + 1))
    fi
    rm -f "$out"
}

if [ $# -gt 0 ]; then  # just these (make test-gpu)
    for test in "$@"; do
        case $test in
            *.sh) run "$(basename "$test")" bash "$test" ;;
            *) run "$(basename "$test")" "$test" ;;
        esac
    done
else
    for test in build/tests/*; do
        [ -x "$test" ] && run "$(basename "$test")" "$test"
    done
    for script in tests/test_*.sh; do
        run "$(basename "$script")" bash "$script"
    done
fi

passed=$(grep -c '^PASS ' "$log")
failed=$(( $(grep -c '^FAIL ' "$log") + crashed ))
skipped=$(grep -c '^SKIP ' "$log")
echo
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
