#!/usr/bin/env bash
# Run a workshop program on every task of the current Slurm allocation.
#
#   salloc --nodes 2 --ntasks-per-node=4 --time 00:30:00     # first: get the nodes
#   ./slurm/multinode_setup_and_run.sh day2/9_dist_multinode
#   ./slurm/multinode_setup_and_run.sh day2/10_mnist_ddp_multinode --epochs 10
#
# The C twin of the workshop's multinode_setup_and_run.sh. It
#   1. exports MASTER_ADDR (the job's first node) and MASTER_PORT (29500 unless
#      set), as the original does for torch.distributed's env:// rendezvous.
#      The C programs do not need them (MPI finds its peers through srun's
#      PMIx), but a PyTorch script started through this one finds them set;
#   2. runs the program from the repository root, so that relative paths such
#      as the default --data data/mnist work wherever you call this from;
#   3. launches one process per task: `srun -l --mpi=pmix` (-l puts the task
#      number before each line), or Open MPI's mpirun, which takes its hosts
#      from the allocation, where this Slurm has no PMIx plugin.
#      LAUNCHER=srun or LAUNCHER=mpirun picks one by hand.
# It works on one node as well (salloc --nodes 1 ...); slurm/day1.sbatch and
# slurm/day2.sbatch call it from batch jobs.
#
# Under slurm/run_with_restarts.sh --min_ranks N (an elastic restart), it runs on
# the nodes that script found alive, not on the whole allocation: ELASTIC_NODELIST
# (comma-separated), ELASTIC_NNODES and ELASTIC_NTASKS, when set, become srun's
# --nodelist, --nodes and --ntasks, or mpirun's --host and -np.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 PROGRAM [ARGS...]   (inside a Slurm allocation; --help for more)" >&2
    exit 2
fi
if [ "$1" = -h ] || [ "$1" = --help ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"  # the comment above
    exit 0
fi
if [ -z "${SLURM_JOB_ID:-}" ]; then
    # The same run on this one machine, as typed (Open MPI wants to be told to run as root).
    printf -v here '%q ' "$@"
    root_flag=""
    [ "$(id -u)" = 0 ] && [ -z "${OMPI_ALLOW_RUN_AS_ROOT:-}" ] && root_flag="--allow-run-as-root "
    echo "error: not inside a Slurm allocation (no SLURM_JOB_ID); get nodes first, e.g." \
         "salloc --nodes 2 --ntasks-per-node=4 --time 00:30:00, or run it on this one machine:" \
         "mpirun --oversubscribe ${root_flag}-np 4 ${here% }" >&2
    exit 2
fi

case "${LAUNCHER:-}" in
    "" | srun | mpirun) ;;
    *) echo "error: LAUNCHER must be srun or mpirun (or unset: srun where it has PMIx), not '$LAUNCHER'" >&2
       exit 2 ;;
esac

# The program, as an absolute path: relative to where we were called from if it
# is there, else relative to the repository root; a bare name that is no file
# here is a command on the PATH (hostname, python3 ...).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
program=$1
shift
if [[ $program != */* ]] && [ ! -e "$program" ] && command -v "$program" > /dev/null; then
    program=$(command -v "$program")
elif [[ $program != /* ]]; then
    if [ -e "$program" ]; then program=$(pwd)/$program; else program=$repo/$program; fi
fi
if [ ! -x "$program" ]; then
    echo "error: $program: not an executable (build it with make in $repo)" >&2
    exit 2
fi
cd "$repo"

# The first node of the job hosts rank 0: that is where torch.distributed's
# rendezvous would listen.
nodelist=${ELASTIC_NODELIST:-$SLURM_JOB_NODELIST}
MASTER_ADDR=$(scontrol show hostnames "$nodelist" | head -n 1)
export MASTER_ADDR
export MASTER_PORT=${MASTER_PORT:-29500}
echo "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT" \
     "(job $SLURM_JOB_ID: ${SLURM_JOB_NUM_NODES:-?} node(s) $SLURM_JOB_NODELIST, ${SLURM_NTASKS:-?} task(s))"
# An elastic restart's nodes and ranks (see the top); none: the whole allocation.
srun_elastic=() mpirun_elastic=()
if [ -n "${ELASTIC_NODELIST:-}" ]; then
    if ! [[ ${ELASTIC_NTASKS:-} =~ ^[1-9][0-9]*$ && ${ELASTIC_NNODES:-} =~ ^[1-9][0-9]*$ ]]; then
        echo "error: ELASTIC_NODELIST=$ELASTIC_NODELIST needs ELASTIC_NNODES and ELASTIC_NTASKS (integers >= 1)," \
             "as slurm/run_with_restarts.sh --min_ranks exports them" >&2
        exit 2
    fi
    per_node=$(( (ELASTIC_NTASKS + ELASTIC_NNODES - 1) / ELASTIC_NNODES ))
    srun_elastic=(--nodes "$ELASTIC_NNODES" --ntasks "$ELASTIC_NTASKS" --nodelist "$ELASTIC_NODELIST")
    mpirun_elastic=(-np "$ELASTIC_NTASKS" --host "${ELASTIC_NODELIST//,/:$per_node,}:$per_node")  # node1:2,node2:2
    # The step of the attempt that lost a node holds its CPUs in Slurm's books until slurmctld
    # declares that node down (SlurmdTimeout, minutes), though its tasks here are gone: a step
    # that overlaps it can start now (srun --overlap, read by mpirun's srun too).
    export SLURM_OVERLAP=1
    echo "elastic restart: $ELASTIC_NTASKS task(s) on $ELASTIC_NNODES node(s) $ELASTIC_NODELIST"
fi

# srun can start MPI programs directly when Slurm was built with PMIx
# (`srun --mpi=list` names it). Otherwise mpirun starts one daemon per node
# through srun and launches the ranks itself.
launcher=${LAUNCHER:-} why="LAUNCHER=${LAUNCHER:-}"
if [ -z "$launcher" ]; then
    # Read it all first: `srun ... | grep -q` could kill srun with SIGPIPE,
    # and pipefail would then read that as "no PMIx".
    mpi_types=$(srun --mpi=list 2>&1 || true)
    if grep -qw pmix <<< "$mpi_types"; then
        launcher=srun why="srun has PMIx"
    else
        launcher=mpirun why="srun --mpi=list shows no PMIx"
    fi
fi
printf -v command_line '%q ' "$program" "$@"  # shown as a shell would need it typed
case "$launcher" in
    srun)
        echo "launching ($why): srun -l --mpi=pmix ${srun_elastic[*]:+${srun_elastic[*]} }$command_line"
        exec srun -l --mpi=pmix "${srun_elastic[@]}" "$program" "$@" ;;
    mpirun)
        # Open MPI refuses to run as root unless told; inside an allocation it
        # places one rank per Slurm task, so no -np is needed.
        root_flag=()
        [ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)
        echo "launching ($why): mpirun ${root_flag[*]} ${mpirun_elastic[*]:+${mpirun_elastic[*]} }$command_line"
        exec mpirun "${root_flag[@]}" "${mpirun_elastic[@]}" "$program" "$@" ;;
esac
