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
# Elastic restarts (--min_ranks N, as torchrun --nnodes=MIN:MAX): before each
# attempt the script works out how many ranks can run now, and goes on with them
# if there are at least N, else says so in one line and exits 1 without running:
#   - inside a Slurm allocation, the allocation's nodes that still answer (their
#     slurmd takes a TCP connection within 5 s) times each node's tasks. While
#     an attempt runs, the script asks them again every 5 s: a node that stops
#     answering ends the attempt (SIGTERM to COMMAND: srun then ends the step),
#     as torchrun's agent ends the workers when a node leaves; otherwise the
#     ranks left could wait for the lost ones until the time limit. The
#     allocation must outlive a node's loss: get it with `salloc --no-kill` (or
#     `#SBATCH --no-kill`), or Slurm ends the whole job once it sees the node down;
#   - with --hostfile FILE (and outside Slurm, where nothing else can say it), the
#     slots of FILE's hosts (Open MPI's format, `HOST slots=N`), read again before
#     each attempt: whatever watches the machines (you, a health check) takes a
#     lost host out of it, and `mpirun --hostfile FILE` runs one rank per slot.
# It exports what it found to COMMAND, which slurm/multinode_setup_and_run.sh
# honours (srun or mpirun on those nodes only): ELASTIC_NTASKS (the ranks),
# and in Slurm ELASTIC_NODELIST (the live nodes, comma-separated) and
# ELASTIC_NNODES. The program must resume on another world size: step 19 does,
# with --on_resize keep_batch (the uninterrupted run's steps: --accum_steps
# grows as the ranks shrink) or scale_lr (see day5/README.md):
#   salloc --nodes 2 --ntasks-per-node=2 --no-kill
#   slurm/run_with_restarts.sh --max-restarts 3 --min_ranks 2 -- slurm/multinode_setup_and_run.sh \
#       day5/19_gpt --checkpoint checkpoints/gpt --save_every 100 --on_resize keep_batch
#   # one machine: the hosts file says what can run
#   slurm/run_with_restarts.sh --max-restarts 3 --min_ranks 2 --hostfile hosts -- \
#       mpirun --hostfile hosts day5/19_gpt --checkpoint checkpoints/gpt --save_every 100 --on_resize keep_batch
# A restart with fewer ranks says so:
#   run_with_restarts: attempt 2 of 4 on 2 rank(s) (ddpnode1; lost: ddpnode2): slurm/multinode_setup_and_run.sh ...
# Without --min_ranks nothing is counted or exported: the command runs as it is.
#
# Under srun, a task that dies must take its whole step down, or the ranks left
# could wait for it in their next collective until the time limit. Slurm's PMIx
# plugin does that for MPI programs; to be sure of it for any program, this
# script exports SLURM_KILL_BAD_EXIT=1 (srun --kill-on-bad-exit) unless it is set.
set -uo pipefail

say() { echo "run_with_restarts: $*"; }
usage_error() { echo "error: $* (see --help)" >&2; exit 2; }

max_restarts=0 min_ranks="" hostfile=""
while [ $# -gt 0 ]; do
    case $1 in
        --max-restarts | --max_restarts)
            [ $# -ge 2 ] || usage_error "$1 expects a value (N)"
            max_restarts=$2
            shift 2 ;;
        --max-restarts=* | --max_restarts=*)
            max_restarts=${1#*=}
            shift ;;
        --min-ranks | --min_ranks | --hostfile)
            [ $# -ge 2 ] || usage_error "$1 expects a value"
            if [ "$1" = --hostfile ]; then hostfile=$2; else min_ranks=$2; fi
            shift 2 ;;
        --min-ranks=* | --min_ranks=*)
            min_ranks=${1#*=}
            shift ;;
        --hostfile=*)
            hostfile=${1#*=}
            shift ;;
        --)
            shift
            break ;;
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"  # the comment above
            exit 0 ;;
        *) usage_error "unknown option '$1': usage: $0 --max-restarts N [--min_ranks N [--hostfile FILE]] -- COMMAND [ARGS...]" ;;
    esac
done
[[ $max_restarts =~ ^[0-9]+$ ]] || usage_error "--max-restarts expects an integer >= 0, got '$max_restarts'"
[ $# -gt 0 ] || usage_error "no command: usage: $0 --max-restarts N -- COMMAND [ARGS...]"
if [ -n "$min_ranks" ]; then
    if ! [[ $min_ranks =~ ^[0-9]+$ ]] || [ "$min_ranks" -lt 1 ]; then
        usage_error "--min_ranks expects an integer >= 1, got '$min_ranks'"
    fi
    if [ -n "$hostfile" ]; then
        [ -f "$hostfile" ] || usage_error "--hostfile $hostfile: no such file"
    elif [ -z "${SLURM_JOB_ID:-}" ]; then
        usage_error "--min_ranks outside a Slurm allocation needs --hostfile FILE (the hosts and slots that can run)"
    fi
elif [ -n "$hostfile" ]; then
    usage_error "--hostfile: only with --min_ranks N"
fi
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

# --min_ranks: how many ranks can run now, and where (see the top). Sets
# ranks (a number) and where (for the attempt's line), and exports ELASTIC_*.
count_ranks() {
    ranks=0 where=""
    if [ -n "$hostfile" ]; then
        # `HOST slots=N` (no slots: 1), comments and blank lines aside.
        local host slots
        while read -r host slots; do
            [ -z "$host" ] || [[ $host == \#* ]] && continue
            slots=${slots#slots=}
            [[ $slots =~ ^[0-9]+$ ]] || slots=1
            ranks=$((ranks + slots))
            where+="${where:+, }$host:$slots"
        done < <(sed 's/#.*//; s/max_slots=[0-9]*//' "$hostfile" 2> /dev/null)
        where="--hostfile $hostfile: ${where:-no hosts}"
        export ELASTIC_NTASKS=$ranks
        return
    fi
    # Slurm: each node's tasks from SLURM_TASKS_PER_NODE ("2(x3),1": 2, 2, 2, 1), in the order of
    # the node list.
    local nodes=() per_node=() item count times i lost=()
    live=()
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST" 2> /dev/null)
    for item in ${SLURM_TASKS_PER_NODE//,/ }; do
        count=${item%%(*} times=1
        [[ $item == *"(x"* ]] && times=${item##*(x} && times=${times%)}
        for ((i = 0; i < times; i++)); do per_node+=("$count"); done
    done
    for i in "${!nodes[@]}"; do
        if node_answers "${nodes[$i]}"; then
            live+=("${nodes[$i]}")
            ranks=$((ranks + ${per_node[$i]:-${per_node[0]:-1}}))
        else
            lost+=("${nodes[$i]}")
        fi
    done
    where=$(IFS=,; echo "${live[*]}")
    [ ${#lost[@]} -gt 0 ] && where+="; lost: $(IFS=,; echo "${lost[*]}")"
    export ELASTIC_NTASKS=$ranks ELASTIC_NNODES=${#live[@]} ELASTIC_NODELIST
    ELASTIC_NODELIST=$(IFS=,; echo "${live[*]}")
}

# A node answers if its slurmd takes a TCP connection (its address and Slurm's
# slurmd port from scontrol): a node that is down, cut off or whose slurmd died
# does not, and then no step can run there.
slurmd_port=""
node_answers() {
    local address
    [ -n "$slurmd_port" ] || slurmd_port=$(scontrol show config 2> /dev/null | sed -n 's/^SlurmdPort *= *//p')
    address=$(scontrol show node "$1" 2> /dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
    # shellcheck disable=SC2016  # $1 and $2 are the inner shell's arguments
    timeout 5 bash -c 'exec 3<> "/dev/tcp/$1/$2"' _ "${address:-$1}" "${slurmd_port:-6818}" 2> /dev/null
}

# While an attempt runs in Slurm (--min_ranks): its nodes asked every 5 s; the
# first that does not answer ends the attempt (see the top).
watch_nodes() {  # pid of COMMAND, nodes... (in a subshell, which the loop below ends by SIGTERM)
    local pid=$1 node nap
    shift
    trap 'kill "$nap" 2> /dev/null; exit 0' TERM  # (and its sleep with it, not left to run out)
    while :; do
        sleep 5 &
        nap=$!
        wait "$nap"
        kill -0 "$pid" 2> /dev/null || return
        for node in "$@"; do
            if ! node_answers "$node"; then
                say "$node does not answer (its slurmd takes no connection): ending attempt $attempt"
                kill -TERM "$pid" 2> /dev/null
                return
            fi
        done
    done
}

printf -v command_line '%q ' "$@"
attempts=$((max_restarts + 1))
for ((attempt = 1; ; attempt++)); do
    if [ -n "$min_ranks" ]; then
        count_ranks
        if [ "$ranks" -lt "$min_ranks" ]; then
            say "$ranks rank(s) can run ($where), fewer than --min_ranks $min_ranks: not $( [ "$attempt" = 1 ] && echo starting || echo restarting)"
            exit 1
        fi
        say "attempt $attempt of $attempts on $ranks rank(s) ($where): $command_line"
    else
        say "attempt $attempt of $attempts: $command_line"
    fi
    "$@" &
    child=$!
    watcher=""
    if [ -n "$min_ranks" ] && [ -z "$hostfile" ]; then
        watch_nodes "$child" "${live[@]}" &
        watcher=$!
    fi
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
    [ -n "$watcher" ] && kill "$watcher" 2> /dev/null && wait "$watcher" 2> /dev/null
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
