// nccl_graph_checks: NCCL inside a CUDA graph on the simulated GPU, under mpirun (2 ranks or more,
// a simulated GPU each: FAKE_GPU_COUNT).
//
//   mpirun -np 2 -x FAKE_GPU_COUNT=2 build/fake_gpu/nccl_graph_checks            # PASS/FAIL lines (rank 0)
//   mpirun -np 2 -x FAKE_GPU_COUNT=2 build/fake_gpu/nccl_graph_checks mismatch   # must stop, named
//
// The step captured is DDP's shape: the compute stream writes a buffer, the communication stream
// forks from it at an event, allreduces the buffer and sends it on round a ring (grouped
// ncclSend/ncclRecv), and the compute stream joins it back before copying the results down. Each
// launch takes new inputs (written to page-locked memory before it) and gives the eager sums.
// `mismatch`: rank 0 launches the graph where the others run the step eagerly; NCCL requires every
// rank to capture an operation alike, and the simulation stops the run, named.
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

static int failures, checks, rank, world;

static void check(bool ok, const char *what) {
    if (rank == 0) printf("%s fake_gpu: %s\n", ok ? "PASS" : "FAIL", what);
    failures += !ok;
    checks++;
}

enum { N = 6 };
typedef struct {
    cudaStream_t compute, comm;
    cudaEvent_t forked, joined;
    ncclComm_t nccl;
    float *input, *output;  // page-locked: [N] in; [2 N] out (the sums, then the ring's neighbour's)
    float *sum, *ring;      // device: [N] each
} Step;

// What the captured step does, queued: the input up, its allreduce and its ring exchange on the
// communication stream, both down.
static void step(Step *s) {
    cudaMemcpyAsync(s->sum, s->input, N * sizeof(float), cudaMemcpyHostToDevice, s->compute);
    cudaEventRecord(s->forked, s->compute);
    cudaStreamWaitEvent(s->comm, s->forked, 0);
    ncclAllReduce(s->sum, s->sum, N, ncclFloat, ncclSum, s->nccl, s->comm);
    ncclGroupStart();
    ncclSend(s->sum, N, ncclFloat, (rank + 1) % world, s->nccl, s->comm);
    ncclRecv(s->ring, N, ncclFloat, (rank + world - 1) % world, s->nccl, s->comm);
    ncclGroupEnd();
    cudaEventRecord(s->joined, s->comm);
    cudaStreamWaitEvent(s->compute, s->joined, 0);
    cudaMemcpyAsync(s->output, s->sum, N * sizeof(float), cudaMemcpyDeviceToHost, s->compute);
    cudaMemcpyAsync(s->output + N, s->ring, N * sizeof(float), cudaMemcpyDeviceToHost, s->compute);
}

// Rank r's input in round k: (r + 1) (k + 1) + i; the sums are the same on every rank.
static void write_input(Step *s, int round) {
    for (int i = 0; i < N; i++) s->input[i] = (float)((rank + 1) * (round + 1) + i);
}
static bool right_output(const Step *s, int round) {
    for (int i = 0; i < N; i++) {
        float expected = (float)(world * (world + 1) / 2 * (round + 1) + world * i);
        if (s->output[i] != expected || s->output[N + i] != expected) return false;
    }
    return true;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    bool mismatch = argc > 1 && strcmp(argv[1], "mismatch") == 0;
    cudaSetDevice(rank);
    ncclUniqueId id;
    if (rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    Step s;
    ncclCommInitRank(&s.nccl, world, id, rank);
    cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s.comm, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&s.forked, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&s.joined, cudaEventDisableTiming);
    cudaMallocHost((void **)&s.input, N * sizeof(float));
    cudaMallocHost((void **)&s.output, 2 * N * sizeof(float));
    cudaMalloc((void **)&s.sum, N * sizeof(float));
    cudaMalloc((void **)&s.ring, N * sizeof(float));

    // An eager step first, as a program's warm-up (NCCL's connections made outside the capture).
    write_input(&s, 0);
    step(&s);
    cudaStreamSynchronize(s.compute);
    check(right_output(&s, 0), "an eager step: the allreduce and the ring's exchange");

    bool captured = !mismatch || rank == 0;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (captured) {
        cudaStreamBeginCapture(s.compute, cudaStreamCaptureModeThreadLocal);
        step(&s);
        cudaStreamEndCapture(s.compute, &graph);
        cudaGraphInstantiate(&exec, graph, 0);
    }
    memset(s.output, 0, 2 * N * sizeof(float));
    bool replayed = true;
    for (int round = 1; round <= 2; round++) {
        write_input(&s, round);
        if (captured) cudaGraphLaunch(exec, s.compute);
        else step(&s);
        cudaStreamSynchronize(s.compute);
        replayed = replayed && right_output(&s, round);
    }
    char what[200];
    snprintf(what, sizeof what, "a step captured with its NCCL allreduce and grouped send/receive on a forked stream, "
             "launched twice on new inputs on %d ranks: the sums and the ring's, as eagerly", world);
    check(replayed, what);
    if (captured) {
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    ncclCommDestroy(s.nccl);
    if (rank == 0) printf("%d passed, %d failed\n", checks - failures, failures);
    MPI_Finalize();
    return failures != 0;
}
