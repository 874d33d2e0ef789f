#!/usr/bin/env bash
# Run every unit test (build/tests/*) and integration script (tests/test_*.sh),
# or just the ones named as arguments,
# count their "PASS ..." / "FAIL ..." / "SKIP ..." lines, and end with the one line
#   N passed, N failed[, N skipped]
# A test program that exits non-zero without printing a FAIL (a crash) counts as a failure.
#
# TEST_LEVEL picks how much (exported to the scripts, which read it through
# tests/lib.sh's `thorough`):
#   quick (or unset; make test): each script's essential checks, and not the slow
#         suites below;
#   all   (make test-all): every check of every script, then the slow suites.
set -u
cd "$(dirname "$0")/.."
export TEST_LEVEL=${TEST_LEVEL:-quick}
case $TEST_LEVEL in
    quick | all) ;;
    *) echo "error: TEST_LEVEL=$TEST_LEVEL: expected quick (make test) or all (make test-all)" >&2; exit 2 ;;
esac
# The slow suites, minutes each on 2 cores: the simulated GPU (a second build of
# the tree) and the container image. (tests/test_slurm.sh runs at both levels: its
# two-node cluster at the all level only.)
SLOW_SUITES="tests/test_fake_gpu.sh tests/container/test_container.sh"
# Open MPI at the quick level, which starts some 300 MPI processes: when a rank
# exits non-zero, mpirun waits about 2 s before it SIGKILLs the job's ranks, even
# ones already gone (some 100 expected failures: bad input), so there it kills
# at once; and each process spends 0.2 s probing for a fabric (the cm PML's
# MTLs) before it takes ob1 (shared memory, TCP), so there it takes ob1 at once.
# The thorough level keeps Open MPI's defaults, as attendees run it.
if [ "$TEST_LEVEL" = quick ]; then
    export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
    export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
fi

# The unit tests of a SANITIZE=1 build as the scripts run theirs (tests/lib.sh says why).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:verify_asan_link_order=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

log=$(mktemp)
# Seconds and name of each suite, for the budget line at the end; TEST_TIMES=FILE keeps them there.
times=${TEST_TIMES:-$(mktemp)}
: > "$times"
trap 'rm -f "$log"; [ -n "${TEST_TIMES:-}" ] || rm -f "$times"' EXIT
crashed=0
run() {
    local name=$1; shift
    local out status started=$SECONDS
    out=$(mktemp)
    # The CPU tests run on the CPU wherever they run: GPUs are hidden from
    # them (--device auto would otherwise take one). The GPU tests see them:
    # those named so, and every suite of make test-gpu (REQUIRE_GPU=1), where
    # a suite that also tests the CPU (test_stage_timer) takes its GPU part.
    local hide_gpus=(env CUDA_VISIBLE_DEVICES=)
    case $name in *gpu*) hide_gpus=() ;; esac
    [ "${REQUIRE_GPU:-0}" = 1 ] && hide_gpus=()
    # Show the verdicts as they come; keep the whole output for the count.
    "${hide_gpus[@]}" "$@" 2>&1 | tee "$out" | grep --line-buffered -E '^(PASS|FAIL|SKIP) '
    status=${PIPESTATUS[0]}
    cat "$out" >> "$log"
    echo "$((SECONDS - started)) $name" >> "$times"
    if [ "$status" -ne 0 ] && ! grep -q '^FAIL ' "$out"; then
        echo "FAIL $name: exited with status $status without a FAIL line; its output:"
        tail -20 "$out" | sed 's/^/    /'
        crashed=$((crashed + 1))
    fi
    # What a suite printed under its FAIL lines (indented: a log's end, a diff), which the verdicts
    # shown above leave out, so that a CI log says why.
    if grep -q '^FAIL ' "$out"; then
        awk '/^FAIL / { show = 1; next } /^(PASS|SKIP) / { show = 0 } show && /^[ \t]/ && shown++ < 60' "$out" |
            sed "1s/^/($name, under its FAIL lines:)\n/"
    fi
    rm -f "$out"
}

# The second kernels (make test-all): the suites that compare what the guides show (their
# checksums, accuracies, losses) run again under OpenBLAS kernels other than those that ran
# above, forced by OPENBLAS_CORETYPE: Haswell's (any x86-64 with AVX2) where the SkylakeX kernels
# ran, the guides' own; SkylakeX's on any other CPU with AVX-512, so that somewhere the guides'
# numbers are compared exactly; a SKIP where neither can run. Verdicts carry the kernels' name.
KERNEL_SUITES="tests/test_guides.sh"
second_kernels() {
    local here second script
    here=$(build/tools/blas_kernels 2> /dev/null)
    case $here in
        OpenBLAS*"(SkylakeX kernels)") second=Haswell ;;
        OpenBLAS*) second=SkylakeX ;;
        *) echo "SKIP second kernels: the programs link ${here:-no BLAS that build/tools/blas_kernels names}, not OpenBLAS"
           return ;;
    esac
    # The CPU's flags first: a kernel forced onto a CPU without its instructions would crash.
    if ! grep -qw "$( [ $second = Haswell ] && echo avx2 || echo avx512f )" /proc/cpuinfo 2> /dev/null ||
            [ "$(OPENBLAS_CORETYPE=$second build/tools/blas_kernels)" != "${here% (*} ($second kernels)" ]; then
        echo "SKIP second kernels: this CPU cannot run OpenBLAS's $second kernels ($here here)"
        return
    fi
    for script in $KERNEL_SUITES; do
        run "$(basename "$script") ($second kernels)" env OPENBLAS_CORETYPE=$second bash -c \
            'bash "$1" | sed -u -E "s/^(PASS|FAIL|SKIP) ([^:]*):/\1 \2 ($2 kernels):/"; exit "${PIPESTATUS[0]}"' \
            _ "$script" "$second"
    done
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
        case " $SLOW_SUITES " in *" $script "*) continue ;; esac
        run "$(basename "$script")" bash "$script"
    done
    if [ "$TEST_LEVEL" = all ]; then
        for script in $SLOW_SUITES; do
            run "$(basename "$script")" bash "$script"
        done
        second_kernels
    fi
fi

passed=$(grep -c '^PASS ' "$log")
failed=$(( $(grep -c '^FAIL ' "$log") + crashed ))
skipped=$(grep -c '^SKIP ' "$log")
echo
# Where the time went, so that a suite that grows is seen before make test outgrows its
# budget (docs/tests.md: 5 minutes on 2 cores).
shown=5; [ "$TEST_LEVEL" = all ] && shown=12  # make test-all: CI's budget (60 minutes on 2 cores) is read off this line
echo "($SECONDS s in all; the slowest: $(sort -rn "$times" | head -$shown | sed -E 's/^([0-9]+) (.*)/\2 \1 s/' | paste -sd '|' | sed 's/|/, /g'))"
if [ $# -eq 0 ] && [ "$TEST_LEVEL" = quick ]; then
    echo "(the essential checks: make test-all runs every check, and the slow suites $SLOW_SUITES)"
fi
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
