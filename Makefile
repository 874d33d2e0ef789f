# DDP workshop in C: build, data, demo and tests.
#
#   make            build every program this machine can build
#   make data       fetch MNIST into data/mnist (MNIST_MIRROR=DIR copies from a local folder)
#   make movielens  fetch MovieLens ml-latest-small into data/movielens, for step 15
#                   (MOVIELENS_MIRROR=DIR copies from a local folder)
#   make shakespeare  fetch Tiny Shakespeare into data/shakespeare, for step 19
#                   (SHAKESPEARE_MIRROR=DIR copies from a local folder)
#   make demo       run Day 1 steps 0, 2, 3 and 4 on CPU ranks
#   make test       unit + integration tests, their essential checks (about 4 minutes on 2
#                   cores): every program end to end, PyTorch parity, bad input, the DDP
#                   equivalences; ends with "N passed, N failed[, N skipped]" (GPU tests
#                   included: on a machine without a GPU they say "skipped: no GPU")
#   make test-all   every check (TEST_LEVEL=all), and the slow suites: the simulated GPU,
#                   the Slurm test cluster, the container image, the guides under a second
#                   BLAS kernel (what CI runs; about 30
#                   minutes on 2 cores); one "N passed, N failed[, N skipped]" line at the end
#   make test-gpu   the GPU tests alone, every check; fails where there is no GPU
#   make fuzz       mutate every input kind for FUZZ_MINUTES (15) from FUZZ_SEED (a new one each
#                   time), classify each run (tests/fuzz/fuzz.py; docs/tests.md, Fuzzing); with
#                   SANITIZE=1, on the AddressSanitizer + UBSan build
#   make test-container  build the image (Dockerfile) from a clean clone, run the demo and
#                   k8s/job.yaml's commands in it (podman or docker; SKIP without them)
#   make clean
#
# Knobs (make VAR=value): MPICC, BLAS_LIBS, BLAS_CFLAGS, OPENMP, CUDA_HOME, CUDA=0|1, CUDA_ARCH, FAKE_GPU=1,
# NVTX=0|1, CFLAGS_EXTRA, SANITIZE=1.

MPICC     ?= mpicc
CUDA_HOME ?= /usr/local/cuda
BLAS_LIBS ?= -lopenblas
BLAS_CFLAGS ?=
OPT       ?= -O3
# OpenMP: every loop of a training step runs on the rank's threads (gcc's
# libgomp). OPENMP= builds without it: one thread per rank, the same results.
OPENMP    ?= -fopenmp
CFLAGS_EXTRA ?=

# ---------------------------------------------------------------- detection
# Each probe compiles a one-line program, so "found" means "usable", not
# merely "some file exists".
probe = $(shell printf '$(1)\nint main(void){return 0;}\n' | \
          $(MPICC) -x c - -o /dev/null $(2) >/dev/null 2>&1 && echo 1)

HAVE_MPICC := $(shell command -v $(MPICC) >/dev/null 2>&1 && echo 1)
pkg = $(shell pkg-config $(1) $(2) 2>/dev/null)

PNG_CFLAGS  := $(call pkg,--cflags,libpng)
PNG_LIBS    := $(or $(call pkg,--libs,libpng),-lpng)
ZLIB_LIBS   := $(or $(call pkg,--libs,zlib),-lz)
# HDF5: pkg-config first (Debian: hdf5 -> the serial build), else ask h5cc.
HDF5_CFLAGS := $(or $(call pkg,--cflags,hdf5),$(filter -I%,$(shell h5cc -show 2>/dev/null)))
HDF5_LIBS   := $(or $(call pkg,--libs,hdf5),$(filter -L%,$(shell h5cc -show 2>/dev/null)) -lhdf5)

ifeq ($(HAVE_MPICC),1)
HAVE_BLAS := $(call probe,#include <cblas.h>,$(BLAS_CFLAGS) $(BLAS_LIBS))
HAVE_ZLIB := $(call probe,#include <zlib.h>,$(ZLIB_LIBS))
HAVE_PNG  := $(call probe,#include <png.h>,$(PNG_CFLAGS) $(PNG_LIBS))
HAVE_HDF5 := $(call probe,#include <hdf5.h>,$(HDF5_CFLAGS) $(HDF5_LIBS))
# MLflow's REST API (--mlflow http://...): libcurl and cJSON. Without them the
# programs still log to an mlruns folder, and say so for a server.
CURL_CFLAGS  := $(call pkg,--cflags,libcurl)
CURL_LIBS    := $(or $(call pkg,--libs,libcurl),-lcurl)
CJSON_CFLAGS := $(call pkg,--cflags,libcjson)
CJSON_LIBS   := $(or $(call pkg,--libs,libcjson),-lcjson)
HAVE_MLFLOW_HTTP := $(call probe,#include <curl/curl.h>\n#include <cjson/cJSON.h>,$(CURL_CFLAGS) $(CJSON_CFLAGS) $(CURL_LIBS) $(CJSON_LIBS))
endif
NVCC      ?= $(CUDA_HOME)/bin/nvcc
HAVE_NVCC := $(shell test -x $(NVCC) && echo 1)
# NCCL and cuBLAS: a probe that includes the header and calls the library, built
# against CUDA's folders (where NVIDIA's packages put them) and the system's
# (Debian's libnccl-dev), so a stray header or a broken library is "not found".
CUDA_LIBDIR ?= $(CUDA_HOME)/lib64
CUDA_PROBE_FLAGS = -isystem $(CUDA_HOME)/include -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR)
probe_call = $(shell printf '$(1)\nint main(void){$(2)}\n' | \
               $(MPICC) -x c - -o /dev/null $(3) >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_MPICC),1)
HAVE_NCCL   := $(call probe_call,#include <nccl.h>,int version = 0; return ncclGetVersion(&version) != ncclSuccess;,$(CUDA_PROBE_FLAGS) -lnccl)
HAVE_CUBLAS := $(call probe_call,#include <cublas_v2.h>,cublasHandle_t handle; return cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS;,$(CUDA_PROBE_FLAGS) -lcublas)
endif
HAVE_NVTX := $(shell test -f $(CUDA_HOME)/include/nvtx3/nvToolsExt.h && echo 1)
# The GPU code needs all three; without them the programs are CPU-only (and
# --device cuda says so). A machine without a GPU still builds it, and runs
# the programs on its CPU.
CUDA ?= $(if $(and $(HAVE_NVCC),$(HAVE_NCCL),$(HAVE_CUBLAS)),1,0)
# GPU architectures to compile for: A100 (80) and H100 (90) by default, plus
# PTX of the last one, which newer GPUs compile when they load it.
CUDA_ARCH ?= 80 90
# NVTX3 is header-only: the profiling ranges need just its headers (NVTX=0: none).
NVTX ?= $(if $(HAVE_NVTX),1,0)

mark = $(if $(filter 1,$(1)),✓,✗)
ifneq ($(filter-out clean data movielens shakespeare,$(or $(MAKECMDGOALS),all)),)
$(info config: mpicc $(call mark,$(HAVE_MPICC))  cblas $(call mark,$(HAVE_BLAS)) ($(BLAS_LIBS))  zlib $(call mark,$(HAVE_ZLIB))  libpng $(call mark,$(HAVE_PNG))  hdf5 $(call mark,$(HAVE_HDF5))  libcurl+cjson $(call mark,$(HAVE_MLFLOW_HTTP))  |  nvcc $(call mark,$(HAVE_NVCC)) ($(CUDA_HOME))  nccl $(call mark,$(HAVE_NCCL))  cublas $(call mark,$(HAVE_CUBLAS))  nvtx $(call mark,$(HAVE_NVTX))  CUDA=$(CUDA)$(if $(filter 1,$(CUDA)), (sm_$(subst $(eval) ,/sm_,$(strip $(CUDA_ARCH)))),: CPU only)  NVTX=$(NVTX))
endif
MISSING := $(strip $(if $(HAVE_MPICC),,mpicc) $(if $(HAVE_BLAS),,cblas) $(if $(HAVE_ZLIB),,zlib) \
                   $(if $(HAVE_PNG),,libpng) $(if $(HAVE_HDF5),,hdf5))

# ---------------------------------------------------------------- flags
# -fno-math-errno: sqrtf need not set errno, so loops with it vectorise (Adam's
# update, 3x faster); IEEE square roots either way, so the same bits.
# -ffp-contract=off: no a * b + c fused into an FMA where a CPU has one, so the
# loops compiled for AVX2 or AVX-512 (common/base/cpu_dispatch.h) round as the
# baseline's do (C11 mode implies it; said here so that no flag changes it).
CFLAGS  = -std=c11 -D_GNU_SOURCE $(OPT) -fno-math-errno -ffp-contract=off $(OPENMP) -g -Wall -Wextra -Wshadow -Icommon \
          $(BLAS_CFLAGS) $(PNG_CFLAGS) $(HDF5_CFLAGS) $(CFLAGS_EXTRA)
LDFLAGS = $(OPENMP)
CFLAGS += $(if $(OPENMP),,-Wno-unknown-pragmas)
LDLIBS  = $(BLAS_LIBS) $(HDF5_LIBS) $(PNG_LIBS) $(ZLIB_LIBS) -lpthread -lm
ifeq ($(HAVE_MLFLOW_HTTP),1)
CFLAGS  += -DHAVE_MLFLOW_HTTP=1 $(CURL_CFLAGS) $(CJSON_CFLAGS)
LDLIBS  += $(CURL_LIBS) $(CJSON_LIBS)
endif
ifeq ($(NVTX),1)
CFLAGS  += -DHAVE_NVTX -isystem $(CUDA_HOME)/include
LDLIBS  += -ldl
endif
ifeq ($(CUDA),1)
CFLAGS  += -DHAVE_CUDA=1 -isystem $(CUDA_HOME)/include
# The CUDA runtime linked in statically (it finds the driver at run time, so
# the binaries start, and run on CPU, where there is none); NCCL shared, found
# through the rpath; cuBLAS opened by the first GPU rank that needs it
# (common/runtime/cublas_loader.c says why). nvcc's objects need the C++ runtime.
CFLAGS  += -DCUBLAS_LIBRARY='"$(CUDA_LIBDIR)/libcublas.so"'
LDLIBS  += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lnccl -lcudart_static -ldl -lrt -lstdc++
NVCCFLAGS = -O3 -std=c++17 -lineinfo -Icommon \
            $(foreach arch,$(CUDA_ARCH),-gencode arch=compute_$(arch),code=sm_$(arch)) \
            -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH)) \
            -Xcompiler -Wall,-Wextra
endif
ifeq ($(SANITIZE),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -O1
LDFLAGS += -fsanitize=address,undefined
endif

BUILD := build
# common/ is in folders by family (common/README.md); one archive holds them all.
COMMON_SRC := $(wildcard common/*/*.c)
COMMON_OBJ := $(COMMON_SRC:common/%.c=$(BUILD)/common/%.o)
ifeq ($(CUDA),1)
COMMON_OBJ += $(BUILD)/common/tensor/kernels.o
endif
# The programs link against an archive of common/'s objects, so each pulls in
# only the files it uses (and those they use): step 0 gets dist and args, not
# the GPU code, the tensors or the profiler.
COMMON_LIB := $(BUILD)/libcommon.a

DAY1 := day1/0_dist_allreduce day1/2_mnist_training day1/3_mnist_distributed day1/4_mnist_manual_ddp \
        day1/5_mnist_manual_ddp_profile day1/6_mnist_ddp day1/7_mnist_ddp_timing day1/8_mnist_ddp_lr day1/test_profile
# Step 1 is NCCL itself: built only with the GPU code.
ifeq ($(CUDA),1)
DAY1 += day1/1_dist_allreduce_gpu
endif
# Days 2 to 4: every day2/*.c, day3/*.c and day4/*.c is a program.
DAY2 := $(patsubst %.c,%,$(wildcard day2/*.c))
DAY3 := $(patsubst %.c,%,$(wildcard day3/*.c))
DAY4 := $(patsubst %.c,%,$(wildcard day4/*.c))
DAY5 := $(patsubst %.c,%,$(wildcard day5/*.c))
UNIT_TESTS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/*.c))
# MPI unit tests: run under mpirun by tests/test_mpi_units.sh, not directly.
MPI_TESTS  := $(patsubst tests/unit_mpi/%.c,$(BUILD)/tests_mpi/%,$(wildcard tests/unit_mpi/*.c))
TOOLS      := $(patsubst tests/tools/%.c,$(BUILD)/tools/%,$(wildcard tests/tools/*.c))
# Attendees' tools, built in place as the programs are: tools/checkpoint_to_state_dict.
USER_TOOLS := $(patsubst %.c,%,$(wildcard tools/*.c))
# Step 2 with common/'s CPU_DISPATCHED loops compiled for one instruction set
# alone, the x86-64 baseline (SSE2) and x86-64-v3 (AVX2): tests/test_threads.sh
# checks that each ends with the bits of the build that picks a clone at run time.
# (x86-64 only, with a compiler that knows the levels: gcc 11 or later.)
ifeq ($(shell uname -m)$(call probe,,-march=x86-64-v3),x86_641)
DISPATCHED_SRC := common/data/mnist.c common/tensor/tensor.c common/tensor/tensor_ops.c
ONE_ISA    := $(BUILD)/one_isa/x86-64/2_mnist_training $(BUILD)/one_isa/x86-64-v3/2_mnist_training
endif

.PHONY: all check-deps data movielens shakespeare demo test test-all test-gpu test-container fuzz bench scaling clean FORCE
# The objects are prerequisites of pattern rules only; keep make from deleting them.
.SECONDARY: $(COMMON_OBJ)
all: check-deps $(DAY1) $(DAY2) $(DAY3) $(DAY4) $(DAY5) $(USER_TOOLS) $(UNIT_TESTS) $(MPI_TESTS) $(TOOLS) $(ONE_ISA)

check-deps:
	@if [ -n "$(MISSING)" ]; then \
	  echo "missing: $(MISSING). On Debian/Ubuntu run ./setup.sh (or see docs/dependencies.md)." >&2; exit 1; fi

# Everything depends on the compiler flags too: `make SANITIZE=1` after a
# plain build rebuilds it all, and so does going back.
FLAGS_STAMP := $(BUILD)/flags
$(FLAGS_STAMP): FORCE | $(BUILD)/common
	@echo '$(CFLAGS) $(LDFLAGS) $(LDLIBS) $(NVCCFLAGS)' | cmp -s - $@ || echo '$(CFLAGS) $(LDFLAGS) $(LDLIBS) $(NVCCFLAGS)' > $@
FORCE:

# The GPU path on a simulated GPU, for machines without one (tests/test_fake_gpu.sh).
ifeq ($(FAKE_GPU),1)
include tests/fake_gpu/fake_gpu.mk
endif

$(BUILD)/common/tensor/kernels.o: common/tensor/kernels.cu common/tensor/kernels.h $(FLAGS_STAMP) | $(BUILD)/common
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/common/%.o: common/%.c $(wildcard common/*/*.h) $(FLAGS_STAMP) | $(BUILD)/common
	@mkdir -p $(@D)
	$(MPICC) $(CFLAGS) -c $< -o $@

# Rebuilt whole (rm first), so an object whose source is gone leaves with it.
$(COMMON_LIB): $(COMMON_OBJ)
	rm -f $@
	ar rcs $@ $(COMMON_OBJ)

day1/%: day1/%.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

day2/%: day2/%.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

day3/%: day3/%.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

day4/%: day4/%.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

day5/%: day5/%.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

tools/%: tools/%.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(COMMON_LIB) $(FLAGS_STAMP) | $(BUILD)/tests
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

$(BUILD)/tests_mpi/%: tests/unit_mpi/%.c tests/unit_mpi/test_mpi.h tests/unit/test.h $(COMMON_LIB) $(FLAGS_STAMP) | $(BUILD)/tests_mpi
	$(MPICC) $(CFLAGS) -Itests/unit $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

$(BUILD)/tools/%: tests/tools/%.c $(COMMON_LIB) $(FLAGS_STAMP) | $(BUILD)/tools
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)

# The dispatched files' own sources come first, so the archive's objects for
# them are never pulled in.
$(BUILD)/one_isa/%/2_mnist_training: day1/2_mnist_training.c $(DISPATCHED_SRC) $(COMMON_LIB) $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(MPICC) $(CFLAGS) -march=$* -DNO_CPU_DISPATCH $(LDFLAGS) $< $(DISPATCHED_SRC) $(COMMON_LIB) -o $@ $(LDLIBS)

# A rank that stops taking part in NCCL, preloaded into the ranks by
# tests/test_gpu.sh to show what a dead peer does to the others.
ifeq ($(CUDA),1)
LOST_PEER := $(BUILD)/lib/liblost_peer.so
# (In build/lib, not build/tests: tests/run.sh runs every file there.)
$(LOST_PEER): tests/lost_peer.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(MPICC) $(CFLAGS) -fPIC -shared $< -o $@ -ldl
all: $(LOST_PEER)
endif

# A rank that dies in the middle of a checkpoint save, preloaded into the ranks by
# tests/test_checkpoint.sh to show that the last good checkpoint survives.
CRASH_IN_SAVE := $(BUILD)/lib/libcrash_in_save.so
$(CRASH_IN_SAVE): tests/crash_in_save.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -fPIC -shared $< -o $@ -ldl
all: $(CRASH_IN_SAVE)

$(BUILD)/common $(BUILD)/tests $(BUILD)/tests_mpi $(BUILD)/tools:
	mkdir -p $@

# ---------------------------------------------------------------- data, demo, tests
data:
	data/fetch_mnist.sh data/mnist

movielens:
	data/fetch_movielens.sh data/movielens

shakespeare:
	data/fetch_shakespeare.sh data/shakespeare

# The tests of step 15 need MovieLens: fetched when a mirror is named
# (MOVIELENS_MIRROR, as CI does), else tests/test_recommender.sh says SKIP.
FETCH_MOVIELENS = test -f data/movielens/ratings.csv || [ -z "$$MOVIELENS_MIRROR" ] || $(MAKE) movielens
# The same for step 19's Tiny Shakespeare (SHAKESPEARE_MIRROR; tests/test_gpt.sh says SKIP without it).
FETCH_SHAKESPEARE = test -f data/shakespeare/input.txt || [ -z "$$SHAKESPEARE_MIRROR" ] || $(MAKE) shakespeare

# mpirun refuses root unless told, and refuses more ranks than cores unless
# told: both are normal on a laptop VM or a container.
MPIRUN ?= mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

demo: all
	@test -f data/mnist/train-images-idx3-ubyte.gz || $(MAKE) data
	$(MPIRUN) -np 4 day1/0_dist_allreduce
	day1/2_mnist_training
	$(MPIRUN) -np 2 day1/3_mnist_distributed
	$(MPIRUN) -np 2 day1/4_mnist_manual_ddp
	@echo "demo done: loss curves in img/ (2_mnist_training.png, 3_mnist_distributed_rank*.png, 4_mnist_manual_ddp.png)"

# tests/run.sh: TEST_LEVEL=quick, each script's essential checks (tests/lib.sh,
# `thorough`), without the slow suites; TEST_LEVEL=all, everything (CI).
test: all
	@test -f data/mnist/train-images-idx3-ubyte.gz || $(MAKE) data
	@$(FETCH_MOVIELENS)
	@$(FETCH_SHAKESPEARE)
	@MPIRUN="$(MPIRUN)" TEST_LEVEL=quick tests/run.sh

test-all: all
	@test -f data/mnist/train-images-idx3-ubyte.gz || $(MAKE) data
	@$(FETCH_MOVIELENS)
	@$(FETCH_SHAKESPEARE)
	@MPIRUN="$(MPIRUN)" TEST_LEVEL=all tests/run.sh

# The fuzzing target, longer than make test-all's minute: reproducers of failed runs land in
# build/fuzz/KIND-SEED-N (each FAIL line names its folder and command).
FUZZ_MINUTES ?= 15
FUZZ_SEED    ?= $(shell date +%s)
# (a Python with h5py: on GPU nodes python3 is often a venv without it)
FUZZ_PYTHON  ?= /usr/bin/python3
fuzz: all
	@test -f data/mnist/train-images-idx3-ubyte.gz || $(MAKE) data
	@$(FETCH_MOVIELENS)
	@echo "fuzzing for $(FUZZ_MINUTES) minutes, seed $(FUZZ_SEED)$(if $(filter 1,$(SANITIZE)), (AddressSanitizer + UBSan build))"
	@$(FUZZ_PYTHON) tests/fuzz/fuzz.py --minutes $(FUZZ_MINUTES) --seed $(FUZZ_SEED)

# The GPU tests alone: step 1, CPU-vs-GPU losses, steps 2, 4, 6 and 8 on the
# GPU, compute-sanitizer. Unlike `make test`, no GPU here is a failure.
test-gpu: all
	@test -f data/mnist/train-images-idx3-ubyte.gz || $(MAKE) data
	@MPIRUN="$(MPIRUN)" REQUIRE_GPU=1 TEST_LEVEL=all tests/run.sh build/tests/test_gpu build/tests/test_stage_timer tests/test_gpu.sh

# The container image and the Kubernetes Job (tests/container/test_container.sh says
# what it checks). Not in `make test`: it takes a few minutes; `make test-all` runs it last.
test-container: all
	@test -f data/mnist/train-images-idx3-ubyte.gz || $(MAKE) data
	@MPIRUN="$(MPIRUN)" TEST_LEVEL=all tests/run.sh tests/container/test_container.sh

clean:
	rm -rf $(BUILD) $(DAY1) $(DAY2) $(DAY3) $(DAY4) $(DAY5) $(USER_TOOLS) day1/1_dist_allreduce_gpu

# Benchmark against the original's PyTorch script and the idiomatic PyTorch loop,
# with the sgemm peak and step 5's profile at 1 and all threads, then step 19's
# GPT against its PyTorch twin (tests/bench_gpt.sh; needs python3-torch), and on a
# GPU step 2's step and the GPT's iteration at nanoGPT's GPU config, phase by phase
# (mlp_ops_bench, gpt_ops_bench), and issue 40's figures (tests/bench_gpu.sh); not
# part of `make test`.
bench: all
	@MPIRUN="$(MPIRUN)" tests/bench_vs_pytorch.sh
	@$(FETCH_SHAKESPEARE)
	@if [ -f data/shakespeare/input.txt ]; then tests/bench_gpt.sh; else echo "step 19's benchmark skipped: no data/shakespeare/input.txt (make shakespeare)"; fi
	@if [ "$$(build/tools/gpu_count 2> /dev/null || echo 0)" -gt 0 ]; then build/tools/mlp_ops_bench cuda && build/tools/gpt_ops_bench cuda && tests/bench_gpu.sh; fi

# Step 7's companion: the speed-up table at 1, 2 and 4 ranks, 3 runs each, interleaved (RANKS="1 2 4 8" for
# other world sizes, REPEATS=5 for more runs), and img/7_scaling.png.
scaling: all
	@test -f data/mnist/train-images-idx3-ubyte.gz || $(MAKE) data
	day1/7_scaling.sh
