# fake_gpu.mk: the Makefile includes this with `make CUDA=1 FAKE_GPU=1`, to build
# the GPU path against tests/fake_gpu/fake_gpu.cpp (a CUDA runtime, cuBLAS and
# NCCL that run on the CPU) instead of libcudart and libnccl, and
# common/tensor/kernels.cu with tests/fake_gpu/nvcc instead of nvcc. Only for tests:
# tests/test_fake_gpu.sh builds a copy of the tree this way.
ifneq ($(CUDA),1)
$(error FAKE_GPU=1 needs CUDA=1 and the CUDA headers in $(CUDA_HOME)/include)
endif
MPICXX ?= mpicxx
FAKE_GPU_DIR := $(BUILD)/fake_gpu
FAKE_GPU_LIB := $(FAKE_GPU_DIR)/libfakegpu.so
# cublas_loader.c opens cuBLAS by its soname first: the fake's folder is the binaries' RPATH, which,
# unlike a RUNPATH, comes before LD_LIBRARY_PATH (often /usr/local/cuda/lib64, the real cuBLAS).
CUBLAS_SONAME := libcublas.so.$(shell sed -n 's/^\#define CUBLAS_VER_MAJOR \([0-9]*\).*/\1/p' $(CUDA_HOME)/include/cublas_api.h)

comma := ,
LDLIBS := $(filter-out -L$(CUDA_LIBDIR) -Wl$(comma)-rpath$(comma)$(CUDA_LIBDIR) -lnccl -lcudart_static,$(LDLIBS)) \
          -L$(FAKE_GPU_DIR) -Wl,-rpath,$(abspath $(FAKE_GPU_DIR)) -Wl,--disable-new-dtags -lfakegpu
# device_mark_step() (common/runtime/device.h) reaches the simulation's per-step counts.
CFLAGS += -DFAKE_GPU=1
NVCC := tests/fake_gpu/nvcc
NVCCFLAGS := -isystem $(CUDA_HOME)/include -Icommon

$(FAKE_GPU_LIB): tests/fake_gpu/fake_gpu.cpp $(FLAGS_STAMP)
	mkdir -p $(@D)
	$(MPICXX) -std=c++17 -O2 -g -fPIC -shared -Wall -Wextra -U_FORTIFY_SOURCE -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX -isystem $(CUDA_HOME)/include $(BLAS_CFLAGS) $< \
	    -o $@ $(BLAS_LIBS)
	ln -sf libfakegpu.so $(@D)/$(CUBLAS_SONAME)

$(COMMON_LIB): $(FAKE_GPU_LIB)
$(BUILD)/common/tensor/kernels.o: tests/fake_gpu/nvcc tests/fake_gpu/kernel_emulation.h

# The simulation's own checks (tests/test_fake_gpu.sh runs them).
FAKE_GPU_CHECKS := $(FAKE_GPU_DIR)/fake_gpu_checks
$(FAKE_GPU_CHECKS): tests/fake_gpu/fake_gpu_checks.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< $(COMMON_LIB) -o $@ $(LDLIBS)
# NCCL inside a CUDA graph, under mpirun (tests/test_fake_gpu.sh runs it on 2 simulated GPUs).
FAKE_NCCL_GRAPH_CHECKS := $(FAKE_GPU_DIR)/nccl_graph_checks
$(FAKE_NCCL_GRAPH_CHECKS): tests/fake_gpu/nccl_graph_checks.c $(COMMON_LIB) $(FLAGS_STAMP)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $< -o $@ $(LDLIBS)
all: $(FAKE_GPU_CHECKS) $(FAKE_NCCL_GRAPH_CHECKS)
