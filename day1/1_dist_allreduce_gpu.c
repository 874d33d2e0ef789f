// Step 1: the allreduce of step 0, on GPU buffers with NCCL.   PyTorch twin: 1_torch_dist_gpu.py
//
// What it teaches: the same collective as step 0 with the backend PyTorch
// uses on GPUs (init_process_group("nccl")). Four moves:
//   1. each rank takes a GPU of its node: local rank mod GPUs (torchrun's LOCAL_RANK);
//   2. rank 0 creates NCCL's unique id and MPI_Bcast hands it to every rank
//      (PyTorch passes it through its TCP store), which joins the communicator;
//   3. ncclAllReduce reads and writes GPU memory and only QUEUES the work on a
//      CUDA stream: the host goes on at once;
//   4. cudaStreamSynchronize waits for it, before the host reads the result.
//      (It would wait forever on a peer that died mid-collective. The training
//      steps' waits poll instead, and ask NCCL for the communicator's error:
//      device_wait_stream in common/runtime/device.h. Here, mpirun ends the others.)
// NCCL cannot put two ranks of one communicator on the same GPU: run at most
// as many ranks per node as it has GPUs. (The training steps fall back to MPI
// when ranks outnumber GPUs; this step is about NCCL, so it says so and stops.)
// This is the one program with CUDA calls in it; every other step gets the
// GPU through common/.
//
// Build and run (built when make finds nvcc and NCCL):
//   make day1/1_dist_allreduce_gpu
//   mpirun -np 4 day1/1_dist_allreduce_gpu                      # a node with 4 GPUs
//   mpirun -np 4 day1/1_dist_allreduce_gpu --count 100000000    # 400 MB: bus bandwidth
//
// Expected output (the rank order varies from run to run):
//   [rank 0] cuda:0 (NVIDIA H100 80GB HBM3): initial value 1
//   [rank 2] cuda:2 (NVIDIA H100 80GB HBM3): initial value 3
//   ...
//   [rank 0] after allreduce: sum 10, mean 2.5
//   [rank 3] after allreduce: sum 10, mean 2.5
// With --count N, one line from rank 0, with the bandwidths as nccl-tests
// computes them (algbw = bytes / time; busbw = algbw * 2 (W - 1) / W, what
// each link carries in a ring allreduce, comparable across world sizes):
//   allreduce of 100000000 floats (400.0 MB) on 4 ranks: T ms, algbw A GB/s, busbw B GB/s; every element verified on every rank
// On a machine without a GPU it stops with
//   [rank 0 @ host] no CUDA device: run step 0, or use a GPU node
#include <stdio.h>
#include <stdlib.h>

#include "base/args.h"       // args_parse: the flags and --help
#include "base/check.h"      // CHECK, xmalloc: fail fast, on every rank
#include "runtime/device.h"  // device_gpu_count, device_local_gpu: which GPU is this rank's
#include "runtime/dist.h"    // dist_init, dist_rank, print0: the process group

#if !HAVE_CUDA
#error "step 1 needs CUDA and NCCL: make builds it only when it finds them (CUDA=1)"
#endif

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    int count = 1, iterations = 20, status = 0;
    ArgSpec flags[] = {
        {"count", ARG_INT, &count, "N", "floats per rank; N > 1 verifies every element and measures bandwidth", 1, NULL},
        {"iters", ARG_INT, &iterations, "N", "timed allreduces, after one warm-up (--count N > 1 only)", 1, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 1: allreduce (sum, then mean) across GPUs with NCCL.");
    if (args_given("iters") && count == 1) usage_error("--iters times the allreduce of --count N > 1 floats (got --count 1)");
    int rank = dist_rank(), world = dist_world_size();

    // 1. A GPU per rank: local rank mod the GPUs this rank sees, and no GPU
    //    taken twice (compared by PCI address: see device.h).
    int gpus = device_gpu_count();
    check_all_ranks(gpus > 0, "no CUDA device: run step 0, or use a GPU node");
    int gpu = device_local_gpu();
    char message[200];
    snprintf(message, sizeof message,
             "%d ranks on %s share %d GPU%s, and NCCL needs a GPU per rank: run at most %d rank%s per node "
             "(or step 0 on CPUs)",
             dist_local_world_size(), dist_hostname(), gpus, gpus == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s");
    check_all_ranks(!device_gpus_shared(gpu), message);
    CHECK_CUDA(cudaSetDevice(gpu));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, gpu));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));

    // 2. The communicator: rank 0's unique id, broadcast over MPI.
    ncclUniqueId id;
    if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    ncclComm_t comm;
    CHECK_NCCL(ncclCommInitRank(&comm, world, id, rank));

    if (count == 1) {
        // 3. and 4. The original: rank r holds r + 1, on its GPU.
        float value = (float)(rank + 1), *on_gpu = NULL;
        CHECK_CUDA(cudaMalloc((void **)&on_gpu, sizeof(float)));
        CHECK_CUDA(cudaMemcpy(on_gpu, &value, sizeof value, cudaMemcpyHostToDevice));
        print_rank("cuda:%d (%s): initial value %g\n", gpu, prop.name, value);
        CHECK_NCCL(ncclAllReduce(on_gpu, on_gpu, 1, ncclFloat, ncclSum, comm, stream));  // queued
        CHECK_CUDA(cudaStreamSynchronize(stream));                                       // done
        CHECK_CUDA(cudaMemcpy(&value, on_gpu, sizeof value, cudaMemcpyDeviceToHost));
        float sum = value;
        float mean = sum / (float)world;
        print_rank("after allreduce: sum %g, mean %g\n", sum, mean);
        CHECK_CUDA(cudaFree(on_gpu));
    } else {
        // --count N: element i on rank r is (r + 1) * (1 + i % 7), so every
        // element of the sum is known exactly: (1 + i % 7) * W (W + 1) / 2.
        // Out of place, as nccl-tests measures: send stays, recv is overwritten.
        size_t bytes = (size_t)count * sizeof(float);
        float *values = xmalloc(bytes), *send = NULL, *recv = NULL;
        for (int i = 0; i < count; i++) values[i] = (float)((rank + 1) * (1 + i % 7));
        CHECK_CUDA(cudaMalloc((void **)&send, bytes));
        CHECK_CUDA(cudaMalloc((void **)&recv, bytes));
        CHECK_CUDA(cudaMemcpy(send, values, bytes, cudaMemcpyHostToDevice));

        // The warm-up allreduce (NCCL sets up its channels on the first) is the one we verify.
        CHECK_NCCL(ncclAllReduce(send, recv, (size_t)count, ncclFloat, ncclSum, comm, stream));
        CHECK_CUDA(cudaMemcpyAsync(values, recv, bytes, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        long wrong = 0;
        for (int i = 0; i < count; i++) wrong += values[i] != (float)(1 + i % 7) * (float)(world * (world + 1) / 2);
        if (wrong) print_rank("%ld of %d elements wrong after allreduce\n", wrong, count);

        // Timed on the GPU with CUDA events: the host only queues the work.
        cudaEvent_t start, stop;
        CHECK_CUDA(cudaEventCreate(&start));
        CHECK_CUDA(cudaEventCreate(&stop));
        dist_barrier();
        CHECK_CUDA(cudaEventRecord(start, stream));
        for (int it = 0; it < iterations; it++)
            CHECK_NCCL(ncclAllReduce(send, recv, (size_t)count, ncclFloat, ncclSum, comm, stream));
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float total_ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&total_ms, start, stop));
        // The slowest rank's mean time, and whether any rank saw a wrong element.
        double seconds = 1e-3 * total_ms / iterations, wrong_anywhere = (double)wrong;
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong_anywhere, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
        double algbw = (double)bytes / seconds / 1e9;           // GB/s, as nccl-tests
        double busbw = algbw * 2.0 * (world - 1) / world;        // allreduce: 2 (W - 1) / W
        print0("allreduce of %d floats (%.1f MB) on %d rank%s: %.2f ms, algbw %.1f GB/s, busbw %.1f GB/s%s; %s\n",
               count, bytes / 1e6, world, world == 1 ? "" : "s", 1e3 * seconds, algbw, busbw,
               world == 1 ? " (one rank: nothing crosses a link)" : "",
               wrong_anywhere == 0 ? "every element verified on every rank" : "FAILED");
        CHECK_CUDA(cudaEventDestroy(start));
        CHECK_CUDA(cudaEventDestroy(stop));
        CHECK_CUDA(cudaFree(send));
        CHECK_CUDA(cudaFree(recv));
        free(values);
        if (wrong_anywhere != 0) status = 1;
    }

    CHECK_NCCL(ncclCommDestroy(comm));
    CHECK_CUDA(cudaStreamDestroy(stream));
    dist_finalize();
    return status;
}
