#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for tests/test_slurm.sh.
#
#   tests/slurm/cluster.sh up       start it (as root); prints the SLURM_CONF to export
#   tests/slurm/cluster.sh down     stop it and remove every trace of it
# or from a script:
#   source tests/slurm/cluster.sh
#   reason=$(cluster_check) || skip "$reason"
#   cluster_lock; trap cluster_down EXIT; cluster_up || fail
#
# The shape (see /work/shared/notes/slurm-test-cluster.md for what was checked):
#
#   host (its own network stack)         ddpnode1 (netns)           ddpnode2 (netns)
#   munged, slurmctld, salloc/srun       slurmd, hostname ddpnode1  slurmd, hostname ddpnode2
#   bridge ddpbr0 10.201.0.1  ------veth------ eth0 10.201.0.11   eth0 10.201.0.12
#
# Each node has its own network namespace, so ranks on different nodes talk
# over TCP through the bridge, as on a cluster; each has its own hostname
# (UTS namespace), so MPI and Slurm see two machines. They share the file
# system, as cluster nodes share /home: the repository and MNIST are visible
# from both at the same paths.
#
# What is ours, and how it goes away:
#   - one scratch folder /tmp/ddp-slurm.XXXXXX with the configuration, the
#     munge key and socket, state, logs; its path is in /run/ddp-slurm-cluster
#     while the cluster runs, so that `down` also cleans up after a run that was
#     killed before it could clean up itself;
#   - our own munged and slurmctld (pids recorded) and everything inside the two
#     namespaces (slurmd, slurmstepd, the ranks), stopped by pid;
#   - the namespaces, the bridge and its veths;
#   - two lines in /etc/hosts, marked, so that the node names resolve.
# (One file stays: the empty lock file /run/lock/ddp-slurm-cluster.lock, so
# that two runs at once take turns; /run is emptied at boot.)
# /etc/slurm and /etc/munge are not touched: SLURM_CONF points every Slurm
# command and daemon at our configuration, and munged gets its own key and socket.

CLUSTER_NODES=(ddpnode1 ddpnode2)
CLUSTER_NET=10.201.0                 # a /24: .1 is the host (the bridge), .11 and .12 the nodes
CLUSTER_BRIDGE=ddpbr0
CLUSTER_CTLD_PORT=16817              # not Slurm's 6817/6818: a real Slurm here keeps its ports
CLUSTER_SLURMD_PORT=16818
CLUSTER_STATE=/run/ddp-slurm-cluster
CLUSTER_LOCK=/run/lock/ddp-slurm-cluster.lock
CLUSTER_MARKER="# ddp-workshop test cluster (tests/slurm/cluster.sh)"
CLUSTER_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PATH=$PATH:/usr/sbin:/sbin           # slurmctld, slurmd, munged, ip

cluster_say() { echo "cluster: $*"; }

# Prints why this machine cannot run the cluster, and fails; silent if it can.
cluster_check() {
    if [ "$(id -u)" != 0 ]; then echo "needs root (network namespaces, slurmd)"; return 1; fi
    local cmd missing=()
    for cmd in slurmctld slurmd munged munge unmunge salloc srun sbatch scontrol sinfo ip nsenter unshare flock timeout; do
        command -v "$cmd" > /dev/null || missing+=("$cmd")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "not installed: ${missing[*]} (./setup.sh --with-slurm installs Slurm and munge)"
        return 1
    fi
    local probe="ddpprobe$$" error
    if ! error=$(ip netns add "$probe" 2>&1); then
        echo "no network namespaces here (ip netns add: $error)"
        return 1
    fi
    ip netns del "$probe"
    if ip -o addr show | grep -v " $CLUSTER_BRIDGE " | grep -q " $CLUSTER_NET\."; then
        echo "$CLUSTER_NET.0/24 is already in use on this machine (ip addr)"
        return 1
    fi
}

# One cluster at a time: the names, addresses and ports are fixed, and
# cluster_up begins by removing whatever carries them. Two test runs at once
# (two `make test` on one machine) take turns here instead. The lock is held
# until this shell exits.
cluster_lock() {  # [seconds to wait]
    mkdir -p "$(dirname "$CLUSTER_LOCK")" && exec {CLUSTER_LOCK_FD}>> "$CLUSTER_LOCK" &&
        flock -w "${1:-600}" "$CLUSTER_LOCK_FD"
}

# ---------------------------------------------------------------- helpers
_cluster_alive() {  # a process that exists and is not a zombie
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2> /dev/null | cut -d' ' -f1) && [ -n "$state" ] && [ "$state" != Z ]
}

_cluster_stop() {  # what, pids...: TERM, up to 10 s of grace, then KILL
    local what=$1 pid alive t
    shift
    [ $# -eq 0 ] && return 0
    kill -TERM "$@" 2> /dev/null
    for ((t = 0; t < 20; t++)); do
        alive=()
        for pid in "$@"; do _cluster_alive "$pid" && alive+=("$pid"); done
        [ ${#alive[@]} -eq 0 ] && break
        sleep 0.5
    done
    if [ ${#alive[@]} -gt 0 ]; then
        cluster_say "$what: still running after 10 s, killing ${alive[*]}"
        kill -KILL "${alive[@]}" 2> /dev/null
    fi
    # Reap our own children, so that no zombie outlives us (others' are not ours to wait for).
    for pid in "$@"; do wait "$pid" 2> /dev/null; done
    return 0
}

_cluster_wait() {  # seconds, description, command...: poll once a second
    local seconds=$1 what=$2 t
    shift 2
    for ((t = 0; t < seconds; t++)); do
        "$@" > /dev/null 2>&1 && return 0
        sleep 1
    done
    cluster_say "error: $what: not after $seconds s"
    return 1
}

_cluster_fail() {  # message, log files to show
    local message=$1 log
    shift
    cluster_say "error: $message"
    for log in "$@"; do
        [ -s "$log" ] && { echo "---- last lines of $log"; tail -n 15 "$log"; }
    done
    return 1
}

_cluster_record() { echo "$1 $2" >> "$CLUSTER_DIR/run/pids"; }  # name pid

_cluster_spawn() {  # log file, command...: start a daemon in the background; its pid is then $!
    local log=$1
    shift
    # Without our lock: a daemon that kept it open would hold it for as long
    # as it runs, beyond the life of the script that took it.
    if [ -n "${CLUSTER_LOCK_FD:-}" ]; then
        "$@" > "$log" 2>&1 {CLUSTER_LOCK_FD}>&- &
    else
        "$@" > "$log" 2>&1 &
    fi
}

_cluster_in_node() {  # node, command...: run in the node's network namespace
    local node=$1
    shift
    nsenter --net="/var/run/netns/$node" -- "$@"
}

# ---------------------------------------------------------------- up
cluster_up() {
    # Leftovers of a run that was killed (SIGKILL, a reboot of the CI step):
    # they carry our names, so they are ours to remove.
    cluster_down > /dev/null 2>&1

    CLUSTER_DIR=$(mktemp -d /tmp/ddp-slurm.XXXXXX) || return 1
    echo "$CLUSTER_DIR" > "$CLUSTER_STATE"
    local d=$CLUSTER_DIR node i
    mkdir -p "$d"/{etc,munge,run,log,state/slurmctld,pmix/base}
    for node in "${CLUSTER_NODES[@]}"; do mkdir -p "$d/state/$node" "$d/pmix/$node"; done
    : > "$d/run/pids"
    # From here on every Slurm command and daemon reads our configuration,
    # and cgroup.conf and mpi.conf next to it.
    export SLURM_CONF=$d/etc/slurm.conf
    cluster_say "scratch folder $d"

    # -------- network: a bridge on the host, a veth into each node's namespace
    # (A && B && ... || fail: any step that fails ends it.)
    # shellcheck disable=SC2015
    ip link add "$CLUSTER_BRIDGE" type bridge &&
        ip addr add "$CLUSTER_NET.1/24" dev "$CLUSTER_BRIDGE" &&
        ip link set "$CLUSTER_BRIDGE" up || { _cluster_fail "cannot create bridge $CLUSTER_BRIDGE"; return 1; }
    local summary="bridge $CLUSTER_BRIDGE $CLUSTER_NET.1"
    i=0
    for node in "${CLUSTER_NODES[@]}"; do
        i=$((i + 1))
        summary+=", $node $CLUSTER_NET.1$i"
        # shellcheck disable=SC2015
        ip netns add "$node" &&
            ip link add "ddpveth$i" type veth peer name eth0 netns "$node" &&
            ip link set "ddpveth$i" master "$CLUSTER_BRIDGE" &&
            ip link set "ddpveth$i" up &&
            ip -n "$node" addr add "$CLUSTER_NET.1$i/24" dev eth0 &&
            ip -n "$node" link set eth0 up &&
            ip -n "$node" link set lo up || { _cluster_fail "cannot set up the network of $node"; return 1; }
        # Node names resolve on every node and on the host (MASTER_ADDR, mpirun).
        echo "$CLUSTER_NET.1$i $node $CLUSTER_MARKER" >> /etc/hosts
    done
    cluster_say "network: $summary"

    # -------- munge: our own daemon, key and socket. Slurm signs every message
    # with it; a system munged (if any) keeps running undisturbed.
    local socket=$d/munge/munge.socket
    dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none && chmod 400 "$d/munge/munge.key"
    _cluster_spawn "$d/log/munged.out" munged --foreground --force --key-file="$d/munge/munge.key" \
        --socket="$socket" --pid-file="$d/run/munged.pid" --log-file="$d/log/munged.log" \
        --seed-file="$d/munge/munged.seed"
    _cluster_record munged $!
    _cluster_wait 15 "munged answers on $socket" bash -c "munge -S '$socket' -n | unmunge -S '$socket'" ||
        { _cluster_fail "munged did not start" "$d/log/munged.out" "$d/log/munged.log"; return 1; }

    # -------- configuration
    # The nodes' CPU line must be what slurmd itself finds (slurmd -C), or
    # the node is marked invalid. Memory is left out: it is not scheduled here.
    local hardware
    hardware=$(env -u SLURM_CONF slurmd -C 2> /dev/null | head -n 1 | tr ' ' '\n' |
               grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')
    [ -n "$hardware" ] || hardware="CPUs=$(nproc)"
    sed -e "s|@DIR@|$d|g" -e "s|@CONTROLLER@|$(hostname -s)|g" -e "s|@CONTROLLER_ADDR@|$CLUSTER_NET.1|g" \
        -e "s|@CTLD_PORT@|$CLUSTER_CTLD_PORT|g" -e "s|@SLURMD_PORT@|$CLUSTER_SLURMD_PORT|g" \
        -e "s|@NODE1@|${CLUSTER_NODES[0]}|g" -e "s|@NODE2@|${CLUSTER_NODES[1]}|g" \
        -e "s|@NODE1_ADDR@|$CLUSTER_NET.11|g" -e "s|@NODE2_ADDR@|$CLUSTER_NET.12|g" -e "s|@NODE_HW@|$hardware|g" \
        "$CLUSTER_HERE/slurm.conf.in" > "$SLURM_CONF" || return 1
    # slurmd loads a cgroup plugin even with proctrack/linuxproc and task/none.
    # Its autodetection stops on a hybrid v1/v2 hierarchy ("Hybrid mode is not
    # supported"), so name the version: v1 unless /sys/fs/cgroup is pure v2.
    if [ "$(stat -fc %T /sys/fs/cgroup 2> /dev/null)" = cgroup2fs ]; then
        printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n' > "$d/etc/cgroup.conf"
    else
        echo 'CgroupPlugin=cgroup/v1' > "$d/etc/cgroup.conf"
    fi
    # PMIx gives every step a folder under one base folder; two slurmds on one
    # file system would collide there ("Cannot create client cli tmpdir: File
    # exists"). Each node bind-mounts its own folder at this path (below).
    echo "PMIxCliTmpDirBase=$d/pmix/base" > "$d/etc/mpi.conf"

    # -------- slurmctld, on the host
    _cluster_spawn "$d/log/slurmctld.out" slurmctld -D
    _cluster_record slurmctld $!
    _cluster_wait 30 "slurmctld answers (scontrol ping)" bash -c 'timeout 10 scontrol ping | grep -q "is UP"' ||
        { _cluster_fail "slurmctld did not start" "$d/log/slurmctld.out" "$d/log/slurmctld.log"; return 1; }

    # -------- one slurmd per node, inside its namespaces
    local slurmd_pids=()
    for node in "${CLUSTER_NODES[@]}"; do
        _cluster_wait 10 "$node reaches slurmctld at $CLUSTER_NET.1:$CLUSTER_CTLD_PORT" \
            _cluster_in_node "$node" timeout 2 bash -c "exec 3<> /dev/tcp/$CLUSTER_NET.1/$CLUSTER_CTLD_PORT" ||
            { _cluster_fail "no route from $node to the controller through $CLUSTER_BRIDGE"; return 1; }
        # nsenter, not `ip netns exec`: the latter remounts /sys, and slurmd
        # then finds no cgroup file system. unshare gives the node its own
        # hostname and a private mount table for the PMIx bind mount. nsenter,
        # unshare and sh all exec, so $! ends up being slurmd's pid.
        # shellcheck disable=SC2016  # $1..$3 are the inner sh's arguments
        _cluster_spawn "$d/log/slurmd-$node.out" \
            nsenter --net="/var/run/netns/$node" -- unshare --uts --mount --propagation private -- \
            sh -c 'hostname "$1" && mount --bind "$2" "$3" && exec slurmd -D -N "$1"' \
            sh "$node" "$d/pmix/$node" "$d/pmix/base"
        slurmd_pids+=($!)
        _cluster_record slurmd $!
    done

    # -------- wait until both nodes take jobs
    local t states state idle
    for ((t = 0; t < 60; t++)); do
        states=$(timeout 10 sinfo -h -N -o '%N=%t' 2> /dev/null | sort -u | paste -sd ' ')
        idle=0
        for node in "${CLUSTER_NODES[@]}"; do
            state=$(echo "$states" | tr ' ' '\n' | sed -n "s/^$node=//p")
            case "$state" in
                idle) idle=$((idle + 1)) ;;
                inval) _cluster_fail "$node is invalid: its configuration disagrees with slurmd -C" \
                           "$d/log/slurmctld.log" "$d/log/slurmd-$node.log"; return 1 ;;
                # Registered but drained or down (a restart, a quick first
                # registration): give it back to the scheduler.
                drain | drng | down) scontrol update nodename="$node" state=resume > /dev/null 2>&1 ;;
            esac
        done
        if [ "$idle" -eq ${#CLUSTER_NODES[@]} ]; then
            # Ranks on different nodes talk to each other directly, through
            # the bridge: try it once (node 1 to node 2's slurmd).
            _cluster_in_node "${CLUSTER_NODES[0]}" timeout 2 \
                bash -c "exec 3<> /dev/tcp/$CLUSTER_NET.12/$CLUSTER_SLURMD_PORT" 2> /dev/null ||
                { _cluster_fail "${CLUSTER_NODES[0]} cannot reach ${CLUSTER_NODES[1]} through $CLUSTER_BRIDGE (a firewall on bridged traffic? net.bridge.bridge-nf-call-iptables)"
                  return 1; }
            cluster_say "up: slurmctld on $(hostname -s) ($CLUSTER_NET.1:$CLUSTER_CTLD_PORT); nodes $states"
            return 0
        fi
        for i in "${!CLUSTER_NODES[@]}"; do
            node=${CLUSTER_NODES[$i]}
            _cluster_alive "${slurmd_pids[$i]}" ||
                { _cluster_fail "slurmd of $node exited" "$d/log/slurmd-$node.out" "$d/log/slurmd-$node.log"; return 1; }
        done
        sleep 1
    done
    _cluster_fail "nodes not idle after 60 s: $states" "$d/log/slurmctld.log" \
        "$d/log/slurmd-${CLUSTER_NODES[0]}.log" "$d/log/slurmd-${CLUSTER_NODES[1]}.log"
}

# ---------------------------------------------------------------- down
# Safe to call any time, more than once, and when nothing is up.
cluster_down() {
    local d="" node name pid
    [ -f "$CLUSTER_STATE" ] && d=$(cat "$CLUSTER_STATE")
    # Everything running inside the nodes: slurmd, slurmstepd, ranks, orted.
    for node in "${CLUSTER_NODES[@]}"; do
        [ -e "/var/run/netns/$node" ] || continue
        # shellcheck disable=SC2046  # one pid per word
        _cluster_stop "processes on $node" $(ip netns pids "$node" 2> /dev/null)
    done
    # Our slurmctld and munged, by the pids recorded when they started (and
    # only if the pid still names that program).
    if [ -n "$d" ] && [ -f "$d/run/pids" ]; then
        while read -r name pid; do
            [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = "$name" ] && _cluster_stop "$name" "$pid"
        done < "$d/run/pids"
    fi
    # Deleting a namespace destroys its end of the veth, and with it ours.
    for node in "${CLUSTER_NODES[@]}"; do
        [ -e "/var/run/netns/$node" ] && ip netns del "$node"
    done
    ip link show "$CLUSTER_BRIDGE" > /dev/null 2>&1 && ip link del "$CLUSTER_BRIDGE"
    # /etc/hosts: drop our marked lines. Rewrite in place (cat >), not sed -i:
    # in a container /etc/hosts is often a bind mount that cannot be replaced.
    if grep -qF "$CLUSTER_MARKER" /etc/hosts 2> /dev/null; then
        local kept
        kept=$(grep -vF "$CLUSTER_MARKER" /etc/hosts)
        printf '%s\n' "$kept" > /etc/hosts
    fi
    case "$d" in /tmp/ddp-slurm.*) rm -rf "$d" ;; esac
    rm -f "$CLUSTER_STATE"
    return 0
}

# ---------------------------------------------------------------- command line
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -u
    case "${1:-}" in
        up)
            reason=$(cluster_check) || { echo "error: cannot run the test cluster here: $reason" >&2; exit 1; }
            cluster_lock 60 || { echo "error: a test run is using the cluster (lock $CLUSTER_LOCK)" >&2; exit 1; }
            cluster_up || { cluster_down; exit 1; }
            echo "export SLURM_CONF=$SLURM_CONF     # then: salloc -N 2 --ntasks-per-node=2 ...; stop with: $0 down"
            ;;
        down)
            cluster_lock 60 || { echo "error: a test run is using the cluster (lock $CLUSTER_LOCK)" >&2; exit 1; }
            cluster_down ;;
        *) sed -n '2,7p' "$0"; exit 2 ;;
    esac
fi
