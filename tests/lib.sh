# tests/lib.sh: comparisons shared by the integration scripts (source it).

# same_losses A.csv B.csv TOLERANCE: the per-step losses of two --losses logs
# (step,epoch,loss) agree within a relative tolerance. Prints "worst relative
# difference X over N steps"; fails when they differ, or differ in length, or
# hold no step.
same_losses() {
    awk -F, -v tol="$3" 'NR == FNR { a[FNR] = $3; n = FNR; next }
        FNR > 1 { d = ($3 - a[FNR]) / a[FNR]; if (d < 0) d = -d; if (d > worst) worst = d; m = FNR }
        END { printf "worst relative difference %.1e over %d steps", worst, m - 1; exit !(n == m && n > 1 && worst <= tol) }' "$1" "$2"
}

# same_weights WHAT A.h5 B.h5 TOLERANCE: a PASS or FAIL line (the caller's
# pass and fail) for two weight files within a relative tolerance.
same_weights() {
    local verdict
    verdict=$(build/tools/compare_weights "$2" "$3" "$4" 2>&1)
    if [ $? -eq 0 ]; then pass "$1: $verdict"; else fail "$1: $verdict (tolerance $4)"; fi
}

# thorough: true under `make test-all` (TEST_LEVEL=all), false under `make test`
# (TEST_LEVEL unset or quick). A script runs its essential checks at every level
# (each program end to end, the equivalences, bad input) and wraps the slower,
# more thorough ones in `if thorough; then ... fi`, so that `make test` stays
# within a few minutes on 2 cores and `make test-all` runs every check.
thorough() { [ "${TEST_LEVEL:-quick}" = all ]; }
# if_thorough WORDS...: the words under `make test-all`, nothing under `make test`:
# `for np in 2 $(if_thorough 4)` runs at 2 ranks, and at 4 too in make test-all.
if_thorough() { if thorough; then echo "$@"; fi; }
