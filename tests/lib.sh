# tests/lib.sh: what every test script shares. A script starts
#
#   set -u
#   cd "$(dirname "$0")/.."     # the repository root, where the programs are
#   source tests/lib.sh
#   suite pipeline              # its verdicts read "PASS pipeline: ..."
#   needs_built day4/16_pipeline_ddp
#   needs_mnist
#   scratch                     # $tmp, removed on exit
#
# and then reads as a list of checks: `expect WHAT COMMAND...`, or pass/fail/skip
# where a check needs more than a command's exit status. tests/run.sh counts the
# PASS/FAIL/SKIP lines.

# ---------------------------------------------------------------- the machine's defaults
# Each may be set from outside (make test passes MPIRUN, CI its PYTHON).
MPIRUN=${MPIRUN:-mpirun --oversubscribe $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
DATA=${DATA:-data/mnist}
PYTHON=${PYTHON:-/usr/bin/python3}  # with torch and h5py; on GPU nodes python3 is often a venv without them
# A SANITIZE=1 build (make test SANITIZE=1): an AddressSanitizer or UBSan report fails the check
# whose program printed it (UBSan's too: halt_on_error makes it exit non-zero), but LeakSanitizer's
# does not. A program that stops on an error (usage_error, a refused file, MPI_Abort) leaves its
# memory to the system, as Open MPI and HDF5 do at any exit; a leak report there would change the
# exit status and the one-line refusal that the checks read. A user's own settings are kept.
# (verify_asan_link_order=0: the tests' LD_PRELOAD libraries, which fail a write or an NCCL call, come
# before AddressSanitizer's runtime in the load order, which it otherwise refuses.)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:verify_asan_link_order=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# ---------------------------------------------------------------- verdicts
SUITE=test
failures=0  # FAIL lines printed so far: a script may end with `exit_status`
# suite NAME: the name every verdict line of this script carries after PASS/FAIL/SKIP.
suite() { SUITE=$1; }
# pass WHAT: one passed check.
pass() { echo "PASS $SUITE: $*"; }
# fail WHAT: one failed check (counted in $failures).
fail() { echo "FAIL $SUITE: $*"; failures=$((failures + 1)); }
# skip WHAT: a check this machine cannot run; WHAT says what it lacks.
skip() { echo "SKIP $SUITE: $*"; }
# expect WHAT COMMAND...: PASS WHAT if COMMAND succeeds, else FAIL WHAT.
expect() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
# expect_output WHAT COMMAND...: as expect, COMMAND's output held back; a FAIL line ends with its
# first lines (where a checker's output says what missed).
expect_output() {
    local what=$1 out; shift
    if out=$("$@" 2>&1); then pass "$what"; else fail "$what: $(echo "$out" | head -3 | tr '\n' ' ')"; fi
}
# exit_status: the script's exit status, 1 if any check failed (a helper called too early included).
exit_status() { [ "$failures" -eq 0 ] && [ ! -e "$late_helpers" ]; }
# A helper of the script called before the script defines it would leave only bash's "command not
# found" among a check's output, and the check silently not run. bash calls command_not_found_handle
# for a command it cannot find (in a subshell: it cannot count a failure itself); where the script
# defines a function of that name further down, the handler says so on stderr and notes the name,
# and when the script exits each one noted is a FAIL line on its output (tests/run.sh counts them;
# exit_status gives 1). Anything else (a tool this machine lacks, which a script may probe for by
# running it) keeps bash's message and exit status 127.
case $0 in
    /*) script_file=$0 ;;
    *) if [ -f "$0" ]; then script_file=$PWD/$0; else script_file=${OLDPWD:-.}/$0; fi ;;  # (before or after its cd)
esac
late_helpers=${TMPDIR:-/tmp}/lib-late-helpers.$$
command_not_found_handle() {
    if [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] &&
        grep -qE "^[[:space:]]*(function[[:space:]]+)?$1[[:space:]]*\(\)" "$script_file" 2> /dev/null; then
        echo "$0: $1 is called before the script defines it" >&2
        echo "$1" >> "$late_helpers"
    else
        echo "$0: $1: command not found" >&2
    fi
    return 127
}
# report_late_helpers: the FAIL lines of the helpers called too early (an exit command).
report_late_helpers() {
    [ -e "$late_helpers" ] || return 0
    local name
    sort -u "$late_helpers" | while read -r name; do
        echo "FAIL $SUITE: $name is called before $0 defines it: the check it belongs to did not run"
    done
    rm -f "$late_helpers"
}

# ---------------------------------------------------------------- guards
# needs_built PROGRAM...: FAIL and stop the script if a program is not built.
needs_built() {
    local program
    for program in "$@"; do
        [ -x "$program" ] || { fail "$program is not built (make)"; exit 1; }
    done
}
# have_mnist: true if $DATA holds MNIST's training images (plain or gzipped).
have_mnist() { [ -f "$DATA/train-images-idx3-ubyte.gz" ] || [ -f "$DATA/train-images-idx3-ubyte" ]; }
# needs_mnist: SKIP the rest of the script, with a line saying so, without MNIST in $DATA.
needs_mnist() { have_mnist || { skip "no MNIST in $DATA (make data)"; exit 0; }; }
# free_port: a TCP port that nothing listens on now, from the kernel, for a PyTorch twin's
# rendezvous (MASTER_PORT): a fixed one collides when two checkouts run their suites at once (the
# gloo rendezvous then fails, or waits for the other run's ranks).
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# have_h5py: true if $PYTHON imports h5py and numpy (asked once).
have_h5py() {
    [ -n "${h5py_answer:-}" ] || { "$PYTHON" -c 'import h5py, numpy' 2> /dev/null && h5py_answer=yes || h5py_answer=no; }
    [ "$h5py_answer" = yes ]
}
# no_h5py WHAT: SKIP the check WHAT, which reads or writes HDF5 from Python.
no_h5py() { skip "$1 (needs $PYTHON with h5py and numpy: apt-get install python3-h5py)"; }

# ---------------------------------------------------------------- the scratch folder
exit_commands=()
# at_exit COMMAND: run COMMAND (a string, eval'd) when the script exits, before
# the commands added earlier (the scratch folder goes last).
at_exit() { exit_commands=("$1" "${exit_commands[@]}"); }
# run_exit_commands: the EXIT trap, running what at_exit collected.
run_exit_commands() { local command; for command in "${exit_commands[@]}"; do eval "$command"; done; }
at_exit report_late_helpers
trap run_exit_commands EXIT  # (scratch sets it again; a script with an EXIT trap of its own calls run_exit_commands)
# scratch: $tmp, a new folder for the script's files, removed when it exits.
scratch() { tmp=$(mktemp -d); at_exit 'rm -rf "$tmp"'; trap run_exit_commands EXIT; }

# ---------------------------------------------------------------- bounded runs
# Every run is bounded: a hang is a failure (timeout's exit 124), not a stuck CI
# job. RUN_TIMEOUT is the bound in seconds; a script whose runs take longer
# sets its own at the top, a single run as `RUN_TIMEOUT=300 run ...`.
RUN_TIMEOUT=120
# run COMMAND...: COMMAND, killed after $RUN_TIMEOUT seconds.
run() { timeout "$RUN_TIMEOUT" "$@"; }
MPI_FLAGS=""  # more flags for mpirun in mpi, for a whole script (e.g. --bind-to none)
# mpi NP COMMAND...: COMMAND on NP ranks under $MPIRUN $MPI_FLAGS, bounded as run.
mpi() { local np=$1; shift; run $MPIRUN $MPI_FLAGS -np "$np" "$@"; }

# ---------------------------------------------------------------- what the programs print
# checksum OUTPUT: the distinct parameter checksums in a program's output,
# space-separated (one where every rank holds the same model).
checksum() { grep -o 'parameter checksum [0-9a-f]*' "$1" | sort -u | awk '{ print $3 }' | paste -sd ' '; }
# accuracy OUTPUT: the first test accuracy a program printed, in percent
# ("Test accuracy: 97.31%" of the MLPs, "accuracy 98.12%" of step 14).
accuracy() { sed -n 's/.*[Aa]ccuracy:\{0,1\} \([0-9.]*\)%.*/\1/p' "$1" | head -1; }
# final_loss LOSSES.csv: the last step's loss in a --losses log.
final_loss() { tail -1 "$1" | cut -d, -f3; }

# expect_error STATUS PATTERN COMMAND...: COMMAND exits with STATUS and prints a
# line matching PATTERN (grep -E), without a crash; its output is left in $tmp/err.
expect_error() {
    local want=$1 pattern=$2; shift 2
    "$@" > "$tmp/err" 2>&1
    local status=$?
    local line
    line=$(grep -m1 -E "$pattern" "$tmp/err")
    if [ $status -eq "$want" ] && [ -n "$line" ] && ! grep -qiE 'segmentation|core dumped' "$tmp/err"; then
        pass "exit $want for '${*: -2}': $line"
    else
        fail "expected exit $want and /$pattern/ from: $* (got exit $status:" "$(head -3 "$tmp/err"))"
    fi
}

# ---------------------------------------------------------------- memory
# peak_kb COMMAND...: COMMAND's peak resident memory in kB (GNU time), its output
# dropped; bounded as run.
peak_kb() { run /usr/bin/time -f '%M' -o "$tmp/rss" "$@" > /dev/null 2>&1 && cat "$tmp/rss"; }
# sanitized PROGRAM: PROGRAM is of a SANITIZE=1 build (AddressSanitizer's runtime is in it).
sanitized() { nm "$1" 2> /dev/null | grep -q __asan_init; }
# no_peak_memory WHAT PROGRAM: SKIP WHAT (and succeed) where PROGRAM's peak memory
# cannot be measured or means nothing: no GNU time, or a SANITIZE=1 build.
no_peak_memory() {
    if sanitized "$2"; then
        skip "$1 (a SANITIZE=1 build: AddressSanitizer's allocator keeps freed memory)"
    elif [ ! -x /usr/bin/time ]; then
        skip "$1 (needs /usr/bin/time: apt-get install time)"
    else
        return 1
    fi
}
# no_address_limit WHAT PROGRAM: SKIP WHAT (and succeed) where PROGRAM cannot run under ulimit -v:
# a SANITIZE=1 build, whose AddressSanitizer reserves terabytes of address space for its shadow.
no_address_limit() {
    sanitized "$2" || return 1
    skip "$1 (a SANITIZE=1 build: AddressSanitizer reserves terabytes of address space, past any ulimit -v)"
}

# ---------------------------------------------------------------- comparisons
# same_losses A.csv B.csv TOLERANCE: the per-step losses of two --losses logs
# (step,epoch,loss) agree within a relative tolerance. Prints "worst relative
# difference X over N steps"; fails when they differ, or differ in length, or
# hold no step.
same_losses() {
    awk -F, -v tol="$3" 'NR == FNR { a[FNR] = $3; n = FNR; next }
        FNR > 1 { d = ($3 - a[FNR]) / a[FNR]; if (d < 0) d = -d; if (d > worst) worst = d; m = FNR }
        END { printf "worst relative difference %.1e over %d steps", worst, m - 1; exit !(n == m && n > 1 && worst <= tol) }' "$1" "$2"
}
# expect_same_losses WHAT A.csv B.csv TOLERANCE: a PASS or FAIL line from same_losses.
expect_same_losses() {
    local verdict
    verdict=$(same_losses "$2" "$3" "$4")
    if [ $? -eq 0 ]; then pass "$1: $verdict"; else fail "$1: $verdict (tolerance $4)"; fi
}
# same_weights WHAT A.h5 B.h5 TOLERANCE: a PASS or FAIL line for two weight files
# within a relative tolerance.
same_weights() {
    local verdict
    verdict=$(build/tools/compare_weights "$2" "$3" "$4" 2>&1)
    if [ $? -eq 0 ]; then pass "$1: $verdict"; else fail "$1: $verdict (tolerance $4)"; fi
}

# ---------------------------------------------------------------- Day 4: a split model against plain DDP
# train NP NAME PROGRAM FLAGS...: one epoch on NP ranks, no shuffle, no plot; the output, losses
# and weights kept as $tmp/NAME.out, .csv and .h5; a FAIL line if it exits non-zero. Bounded at
# 300 s: an epoch on 4 ranks of 2 cores.
train() {
    local np=$1 name=$2; shift 2
    RUN_TIMEOUT=300 mpi "$np" "$@" --data "$DATA" --epochs 1 --no-shuffle --plot '' \
        --losses "$tmp/$name.csv" --save "$tmp/$name.h5" > "$tmp/$name.out" 2>&1
    local status=$?
    [ $status -eq 0 ] || fail "$name: exit $status: $(grep -v '^rank\|^Step\|^epoch' "$tmp/$name.out" | head -3 | tr '\n' ' ')"
    return $status
}
# expect_refused_flags PROGRAM NP WHAT PATTERN FLAGS...: PROGRAM on NP ranks exits 2 with one
# error line (every rank meets the error alike: printed once) holding PATTERN.
expect_refused_flags() {
    local program=$1 np=$2 what=$3 pattern=$4 status lines; shift 4
    RUN_TIMEOUT=60 mpi "$np" "$program" --data "$DATA" "$@" > "$tmp/bad" 2>&1
    status=$?
    lines=$(grep -c '^error: ' "$tmp/bad")
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$pattern" "$tmp/bad"; then
        pass "$what: exit 2, one line: $(grep '^error: ' "$tmp/bad")"
    else
        fail "$what: exit $status, $lines error line(s): $(head -3 "$tmp/bad" | tr '\n' ' ')"
    fi
}
# expect_killed_rank_ends_job WHAT PROGRAM FLAGS...: PROGRAM on KILLED_NP ranks (2) for a long run
# (the flags of the array killed_run, if set; else 50 epochs of $DATA), its last rank SIGKILLed once
# its output shows KILLED_AFTER ('^epoch 1/'): the job ends by itself (non-zero, within 60 s), not
# by the timeout.
expect_killed_rank_ends_job() {
    local what=$1 job launcher victim start status seconds t; shift
    local -a long=(--data "$DATA" --epochs 50 --plot '')
    [ -n "${killed_run+set}" ] && long=("${killed_run[@]}")
    : > "$tmp/killed.out"  # there before the job's own redirection, which the loop below may outrun
    timeout "$RUN_TIMEOUT" $MPIRUN -np "${KILLED_NP:-2}" "$@" "${long[@]}" > "$tmp/killed.out" 2>&1 &
    job=$!  # timeout's pid: mpirun is its child, the ranks mpirun's
    for ((t = 0; t < 300; t++)); do grep -q "${KILLED_AFTER:-^epoch 1/}" "$tmp/killed.out" && break; sleep 0.1; done
    launcher=$(pgrep -P "$job" | head -1)
    victim=$(pgrep -P "${launcher:-0}" | tail -1)
    start=$(date +%s)
    [ -n "$victim" ] && kill -KILL "$victim"
    wait "$job"
    status=$?
    seconds=$(($(date +%s) - start))
    expect "$what (SIGKILL, pid ${victim:-none}) ends the job: exit $status after $seconds s, not the test's timeout" \
        test -n "$victim" -a $status -ne 0 -a $status -ne 124 -a $seconds -lt 60
}

# trace_has_ranges TRACE.json RANKS NAME...: the Chrome trace holds a range of each NAME on
# every rank 0 .. RANKS-1 (parsed by Python's json).
trace_has_ranges() {
    "$PYTHON" - "$@" << 'PY'
import json, sys
path, ranks, wanted = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names = {(e.get("pid"), e.get("name")) for e in json.load(open(path))["traceEvents"]}
sys.exit(not all((r, n) in names for r in range(ranks) for n in wanted))
PY
}

# ---------------------------------------------------------------- how much to run
# thorough: true under `make test-all` (TEST_LEVEL=all), false under `make test`
# (TEST_LEVEL unset or quick). A script runs its essential checks at every level
# (each program end to end, the equivalences, bad input) and wraps the slower,
# more thorough ones in `if thorough; then ... fi`, so that `make test` stays
# within a few minutes on 2 cores and `make test-all` runs every check.
thorough() { [ "${TEST_LEVEL:-quick}" = all ]; }
# if_thorough WORDS...: the words under `make test-all`, nothing under `make test`:
# `for np in 2 $(if_thorough 4)` runs at 2 ranks, and at 4 too in make test-all.
if_thorough() { if thorough; then echo "$@"; fi; }
