#!/usr/bin/env bash
# Run a command again when it fails, as torchrun --max-restarts restarts its workers.
#
#   slurm/run_with_restarts.sh --max-restarts 3 -- mpirun -np 4 day3/13_fault_tolerant_ddp
#   # inside a Slurm allocation (srun, or mpirun where srun has no PMIx):
#   slurm/run_with_restarts.sh --max-restarts=3 -- slurm/multinode_setup_and_run.sh day3/13_fault_tolerant_ddp
#
# It runs COMMAND and, when it exits non-zero, runs it again, up to N more times
# (--max-restarts N; 0, torchrun's default, runs it once), saying which attempt it
# is and how the last one ended. It exits with the last attempt's status. A
# restart only helps a program that resumes: step 13 continues from its last
# snapshot, so the restarted job ends as if nothing had happened.
#
# Two statuses are final, as they say that running the same command again cannot
# help: 2, a usage error (bad flags: every program of the workshop exits 2 for
# them, and would again), and 75, step 13's "stopped by a signal, snapshot
# saved" (whatever stopped it brings it back: see below). For them there is no
# restart, and one line says so:
#   run_with_restarts: mpirun -np 2 day3/13_fault_tolerant_ddp --epochs 3 exited with status 2 (a usage error): not restarting
#
# Signals: SIGUSR1 and SIGTERM are passed on to COMMAND as SIGUSR1, which mpirun
# and srun pass on to every rank: step 13 then saves a snapshot at the end of a
# step and exits with status 75. (mpirun takes a SIGTERM as an order to end the
# job: the ranks still save, but mpirun exits 1.) After a signal there is no restart: the job is being
# stopped (the time limit nears, or scancel), and whatever stopped it brings it
# back (slurm/day3.sbatch requeues itself). Ctrl-C reaches COMMAND from the
# terminal directly, and ends the restarts too.
#
# Under srun, a task that dies must take its whole step down, or the ranks left
# could wait for it in their next collective until the time limit. Slurm's PMIx
# plugin does that for MPI programs; to be sure of it for any program, this
# script exports SLURM_KILL_BAD_EXIT=1 (srun --kill-on-bad-exit) unless it is set.
set -uo pipefail

say() { echo "run_with_restarts: $*"; }
usage_error() { echo "error: $* (see --help)" >&2; exit 2; }

max_restarts=0
while [ $# -gt 0 ]; do
    case $1 in
        --max-restarts | --max_restarts)
            [ $# -ge 2 ] || usage_error "$1 expects a value (N)"
            max_restarts=$2
            shift 2 ;;
        --max-restarts=* | --max_restarts=*)
            max_restarts=${1#*=}
            shift ;;
        --)
            shift
            break ;;
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"  # the comment above
            exit 0 ;;
        *) usage_error "unknown option '$1': usage: $0 --max-restarts N -- COMMAND [ARGS...]" ;;
    esac
done
[[ $max_restarts =~ ^[0-9]+$ ]] || usage_error "--max-restarts expects an integer >= 0, got '$max_restarts'"
[ $# -gt 0 ] || usage_error "no command: usage: $0 --max-restarts N -- COMMAND [ARGS...]"
export SLURM_KILL_BAD_EXIT=${SLURM_KILL_BAD_EXIT:-1}

# "status 137 (SIGKILL)": a status above 128 is how a shell reports a death by signal.
describe() {
    local status=$1
    if [ "$status" -gt 128 ] && name=$(kill -l $((status - 128)) 2> /dev/null); then
        echo "status $status (SIG$name)"
    else
        echo "status $status"
    fi
}

# The statuses that a restart cannot help (see the top), and what they mean.
final_status() {
    case $1 in
        2) echo "a usage error" ;;
        75) echo "stopped by a signal, snapshot saved" ;;
        *) return 1 ;;
    esac
}

# COMMAND runs in the background: bash runs a trap only between commands, and
# `wait` is a command that a trapped signal interrupts.
child="" stop_signal=""
forward() {  # SIGUSR1 for either: see the top
    stop_signal=$1
    [ -n "$child" ] && kill -s USR1 "$child" 2> /dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'stop_signal=INT' INT

printf -v command_line '%q ' "$@"
attempts=$((max_restarts + 1))
for ((attempt = 1; ; attempt++)); do
    say "attempt $attempt of $attempts: $command_line"
    "$@" &
    child=$!
    # A signal that came while no command ran (between two attempts) is passed on now.
    case $stop_signal in USR1 | TERM) kill -s USR1 "$child" 2> /dev/null ;; esac
    while kill -0 "$child" 2> /dev/null; do  # until COMMAND itself has ended: a signal ends `wait` early
        wait "$child" 2> /dev/null  # (bash's own "Killed" notice: we say how it ended below)
    done
    # Its own status: bash keeps it for this wait too, also when a trap cut the last wait short
    # (that wait's status was 128 + the trap's signal, not COMMAND's).
    wait "$child" 2> /dev/null
    status=$?
    child=""
    if [ "$status" = 0 ]; then
        say "attempt $attempt of $attempts succeeded"
        exit 0
    fi
    if [ -n "$stop_signal" ]; then
        say "attempt $attempt ended with $(describe "$status") after SIG$stop_signal: no restart, the job is being stopped"
        exit "$status"
    fi
    if why=$(final_status "$status"); then
        say "${command_line% } exited with status $status ($why): not restarting"
        exit "$status"
    fi
    if [ "$attempt" -ge "$attempts" ]; then
        say "attempt $attempt ended with $(describe "$status"): no restarts left (--max-restarts $max_restarts)"
        exit "$status"
    fi
    say "attempt $attempt ended with $(describe "$status"): restarting ($((attempts - attempt)) restart(s) left)"
done
