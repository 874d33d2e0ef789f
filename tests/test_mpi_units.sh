#!/usr/bin/env bash
# MPI unit tests: every build/tests_mpi/* program under mpirun on 1, 2 and 4 ranks.
# Forwards their PASS/FAIL/SKIP lines (tests/run.sh counts them); a run that exits
# non-zero without a FAIL line (a crash, an MPI_Abort, a hang killed by the
# timeout) gets one of its own:
#   FAIL test_mpi_units: build/tests_mpi/test_ddp at 4 ranks exited with status 124
# make test (TEST_LEVEL=quick) runs them on 1 and 2 ranks: 4 ranks, each with its DDP
# communication thread, take half a minute on 2 cores; make test-all (TEST_LEVEL=all) adds them.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite test_mpi_units
scratch
out=$tmp/out

failed=0
found=0
for test in build/tests_mpi/*; do
    [ -f "$test" ] && [ -x "$test" ] || continue
    found=1
    for np in 1 2 $(if_thorough 4); do
        mpi "$np" "$test" > "$out" 2>&1
        status=$?
        grep -E '^(PASS|FAIL|SKIP) ' "$out"
        if [ "$status" -ne 0 ]; then
            failed=1
            if ! grep -q '^FAIL ' "$out"; then
                fail "$test at $np ranks exited with status $status"
                # The first lines that are not verdicts: the fatal error, if any (124: timeout).
                grep -vE '^(PASS|SKIP) ' "$out" | head -4 | sed 's/^/    /'
            fi
        fi
    done
done
[ "$found" = 1 ] || skip "no build/tests_mpi/* programs (run make)"
exit "$failed"
