# The workshop in a container: every program built, run as a non-root user.
#
#   docker build -t ddp-workshop .                # CPUs: Debian 12 (about a minute, 810 MB)
#   docker run --rm -v "$PWD/data/mnist:/workshop/data/mnist:ro" ddp-workshop             # the Day 1 demo
#   docker run --rm -v "$PWD/data/mnist:/workshop/data/mnist:ro" ddp-workshop \
#       mpirun -np 2 day1/6_mnist_ddp                                                      # any step
#
# GPUs: the same file on one of NVIDIA's CUDA "devel" images (CUDA, cuBLAS and NCCL inside; pick the
# CUDA version that your driver supports, `nvidia-smi` names it), and the GPU code is built too:
#
#   docker build -t ddp-workshop:gpu --build-arg BASE=nvidia/cuda:12.8.1-devel-ubuntu24.04 .
#   docker run --rm --gpus all --shm-size 1g -v "$PWD/data/mnist:/workshop/data/mnist:ro" \
#       ddp-workshop:gpu mpirun -np 4 day1/6_mnist_ddp
#
# MNIST is not in the image: mount it, as above, or let `make demo` fetch it at run time where the
# internet is reachable. docs/containers.md shows the expected output;
# k8s/job.yaml runs the GPU image as a Kubernetes Job; `make test-container` tests all of this.
ARG BASE=debian:bookworm
FROM ${BASE} AS deps

# The packages are setup.sh's own list, so the image and a laptop cannot drift apart. This layer
# depends on setup.sh alone: editing a program does not download them again.
COPY setup.sh /tmp/setup.sh
RUN /tmp/setup.sh --deps-only && rm /tmp/setup.sh && apt-get clean && rm -rf /var/lib/apt/lists/*

FROM deps
# A user of our own: mpirun refuses to run as root, and clusters often do too. Its id is numeric in
# USER, so that Kubernetes can check `runAsNonRoot` (k8s/job.yaml).
RUN useradd --create-home --uid 10001 workshop && mkdir /workshop && chown workshop:workshop /workshop
WORKDIR /workshop
COPY --chown=10001:10001 . .
USER 10001:10001
# The Makefile finds what the base holds: on Debian the CPU programs, on a CUDA image the GPU code too
# (its first line, "config: ...", says which).
RUN make -j"$(nproc)"

# mpirun refuses more ranks than the cores it sees, unless told (the Makefile's --oversubscribe):
# `mpirun -np 4` then runs on any machine, as the guides' commands do.
ENV OMPI_MCA_rmaps_base_oversubscribe=1
CMD ["make", "demo"]
