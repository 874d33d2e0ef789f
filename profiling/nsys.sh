#!/usr/bin/env bash
# Nsight Systems over an MPI or Slurm launch: one report per rank, named by rank.
#
#   mpirun -np 2 profiling/nsys.sh day1/5_mnist_manual_ddp_profile [args]
#   srun -n 8 profiling/nsys.sh day2/10_mnist_ddp_multinode [args]
#   mpirun -np 2 profiling/nsys.sh day1/6_mnist_ddp --bucket_mb 0
#
# The launcher starts this script once per rank; each copy runs the program
# under `nsys profile` and writes profiling/reports/<program>.rank<r>.nsys-rep.
# It traces NVTX (our ranges: common/runtime/profile.h), MPI, OS runtime, CUDA, and
# NCCL where this nsys knows it. Open a report with `nsys-ui`, or summarise it:
#   nsys stats --report nvtx_sum profiling/reports/5_mnist_manual_ddp_profile.rank0.nsys-rep
# Set NSYS_OUT to write elsewhere, NSYS_EXTRA for more nsys options.
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,14p' "$0"
    exit 2
fi
if ! command -v nsys > /dev/null; then
    echo "error: nsys not found on PATH: install Nsight Systems (part of the CUDA toolkit, or a module on a cluster:" \
         "module load nsight-systems), or use the program's --trace FILE.json, which needs no NVIDIA tools" >&2
    exit 1
fi

# The rank, for the report name: %q{VAR} is expanded by nsys itself.
if [ -n "${SLURM_PROCID:-}" ] && [ -z "${OMPI_COMM_WORLD_RANK:-}" ]; then
    rank_variable=SLURM_PROCID
else
    rank_variable=OMPI_COMM_WORLD_RANK
fi
out_dir=${NSYS_OUT:-profiling/reports}
mkdir -p "$out_dir"

# NCCL tracing arrived in later nsys versions: ask this one what it can trace.
traces=nvtx,mpi,osrt,cuda
if nsys profile --help 2> /dev/null | grep -qw nccl; then traces+=,nccl; fi

exec nsys profile --trace="$traces" --mpi-impl=openmpi --force-overwrite=true \
    --output="$out_dir/$(basename "$1").rank%q{$rank_variable}" ${NSYS_EXTRA:-} "$@"
