#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine to the Day 1 demo:
# install the packages, build, fetch MNIST, run steps 0, 2, 3 and 4.
#
#   ./setup.sh                   # everything, then the demo
#   ./setup.sh --no-demo         # stop after building and fetching the data
#   ./setup.sh --with-reference  # also install PyTorch and h5py (Debian's), which the
#                                # tests use to compare with the PyTorch reference, and
#                                # strace, with which a test stops a rank mid-write
#   ./setup.sh --with-slurm      # also install Slurm and munge, for tests/test_slurm.sh
#                                # (a two-node test cluster on this machine; needs root)
#   ./setup.sh --with-containers # also install podman, python3-yaml and python3-kubernetes,
#                                # for make test-container (the image, k8s/job.yaml)
#   ./setup.sh --deps-only       # install the packages and stop (the Dockerfile's first step)
#   MNIST_MIRROR=DIR ./setup.sh  # offline: copy MNIST from a local folder
#   MOVIELENS_MIRROR=DIR ./setup.sh  # the same for MovieLens (step 15)
#   SHAKESPEARE_MIRROR=DIR ./setup.sh  # the same for Tiny Shakespeare (step 19)
#
# On a cluster, skip this: `module load` MPI, OpenBLAS, HDF5 (and CUDA) instead,
# then `make && make data` (docs/dependencies.md).
set -euo pipefail
cd "$(dirname "$0")"

demo=1 reference=0 slurm=0 containers=0 deps_only=0
for arg in "$@"; do
    case "$arg" in
        --no-demo) demo=0 ;;
        --with-reference) reference=1 ;;
        --with-slurm) slurm=1 ;;
        --with-containers) containers=1 ;;
        --deps-only) deps_only=1 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "error: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    esac
done

packages=(make gcc pkg-config curl ca-certificates python3
          openmpi-bin libopenmpi-dev       # MPI: mpicc, mpirun
          libopenblas-dev                  # CBLAS (sgemm)
          zlib1g-dev libpng-dev            # gzip'd MNIST, loss-curve PNGs
          libhdf5-dev                      # checkpoints (and Day 2's data set)
          libcurl4-openssl-dev libcjson-dev)  # MLflow tracking servers (--mlflow http://...)
# The GPU code, where CUDA is installed (the Makefile's CUDA_HOME): nvcc compiles its host side with g++.
[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && packages+=(g++)
[ "$reference" = 1 ] && packages+=(python3 python3-numpy python3-torch python3-h5py
                                   strace   # tests/test_fault_tolerance.sh: rank 0 held in its rename
                                   time     # /usr/bin/time: the tests' peak-memory checks
                                   python3-yaml)  # tests/check_mlruns.py reads MLflow's meta.yaml as MLflow does
# slurmctld + slurmd + srun/salloc (with the PMIx plugin, which loads
# libpmix.so from libpmix-dev), munge for their authentication, iproute2 for
# the test cluster's network namespaces.
[ "$slurm" = 1 ] && packages+=(slurm-wlm munge libpmix-dev iproute2)
# podman builds and runs the image (Dockerfile); the test reads k8s/job.yaml with python3-yaml
# and checks it against the Kubernetes API's models (python3-kubernetes).
[ "$containers" = 1 ] && packages+=(podman python3-yaml python3-kubernetes)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2> /dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "== installing: ${missing[*]}"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "== packages: all installed"
fi

[ "$deps_only" = 1 ] && exit 0

echo "== building"
make -j"$(nproc)"
echo "== fetching MNIST"
make data
echo "== fetching MovieLens (step 15)"
make movielens || echo "MovieLens not fetched (offline? MOVIELENS_MIRROR=DIR copies it from a folder): step 15 needs it, the rest does not"
echo "== fetching Tiny Shakespeare (step 19)"
make shakespeare || echo "Tiny Shakespeare not fetched (offline? SHAKESPEARE_MIRROR=DIR copies it from a folder): step 19 needs it, the rest does not"
if [ "$demo" = 1 ]; then
    echo "== Day 1 demo"
    make demo
fi
