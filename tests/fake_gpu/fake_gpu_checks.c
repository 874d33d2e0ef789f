// fake_gpu_checks: the simulated GPU catches what it claims to catch.
//
// Each planted mistake runs in a child process, which must die with the
// fake GPU's message (or a segfault, for host code reading device memory);
// the correct versions of the same code must give the right numbers. Built
// and run by tests/test_fake_gpu.sh on a FAKE_GPU=1 build; prints PASS/FAIL lines.
#include <math.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "tensor/kernels.h"

static int failures, checks;

static void check(int ok, const char *what) {
    printf("%s fake_gpu: %s\n", ok ? "PASS" : "FAIL", what);
    failures += !ok;
    checks++;
}

// Runs mistake() in a child with its stderr in a pipe: true if the child died
// by `signal` and, when `message` is given, said it.
static int dies(void (*mistake)(void), int signal, const char *message) {
    int pipe_ends[2];
    if (pipe(pipe_ends) != 0) return 0;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        dup2(pipe_ends[1], 2);
        close(pipe_ends[0]);
        mistake();
        _exit(0);  // not caught
    }
    close(pipe_ends[1]);
    char said[4096] = "";
    size_t used = 0;
    ssize_t got;
    while (used < sizeof said - 1 && (got = read(pipe_ends[0], said + used, sizeof said - 1 - used)) > 0) used += (size_t)got;
    close(pipe_ends[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == signal && (!message || strstr(said, message));
}

static float *device_floats(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) abort();
    return p;
}

static void host_reads_device_memory(void) {
    float *x = device_floats(4);
    printf("%g\n", x[0]);
}

static void kernel_given_host_memory(void) {
    static float host[4];
    gpu_fill(host, 4, 1.0f, 0);
}

static void kernel_job_given_host_memory(void) {  // a pointer inside a kernel's job (step 15's tables)
    static float host[4];
    float *x = device_floats(4);
    SparseAdamRows tables[2] = {{x, x, x, NULL, NULL, x, NULL, 4, 1}, {host, x, x, NULL, NULL, x, NULL, 4, 1}};
    gpu_sparse_adam(tables, 2, (const MfStepInputs *)device_floats(8), 0.1f, 0.001f, 1e-8f, 0);
}

static void copy_of_the_wrong_kind(void) {
    float *x = device_floats(4), host[4] = {0};
    cudaMemcpy(x, host, sizeof host, cudaMemcpyDeviceToHost);  // the pointers say host to device
}

static void copy_past_the_end(void) {
    float *x = device_floats(4), host[8] = {0};
    cudaMemcpy(x, host, sizeof host, cudaMemcpyHostToDevice);
}

static void gemm_on_host_memory(void) {
    cublasHandle_t handle;
    cublasCreate(&handle);
    static float a[4], b[4], c[4];
    float one = 1, zero = 0;
    cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a, 2, b, 2, &zero, c, 2);
}

// Stream capture: a wait for the GPU, or an event, inside a capture.
static void wait_inside_a_capture(void) {
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    float *x = device_floats(4), host[4];
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    cudaMemcpy(host, x, sizeof host, cudaMemcpyDeviceToHost);
}

// A fork into a second stream (an event recorded in the capture, waited for there) must be joined
// back before the capture ends.
static void fork_not_joined(void) {
    cudaStream_t stream, side;
    cudaStreamCreate(&stream);
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEvent_t forked;
    cudaEventCreateWithFlags(&forked, cudaEventDisableTiming);
    float *x = device_floats(4);
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(forked, stream);
    cudaStreamWaitEvent(side, forked, 0);
    gpu_fill(x, 4, 1.0f, side);
    cudaGraph_t graph;
    cudaStreamEndCapture(stream, &graph);
}

static void wait_for_an_outside_event(void) {
    cudaStream_t stream, side;
    cudaStreamCreate(&stream);
    cudaStreamCreate(&side);
    cudaEvent_t outside;
    cudaEventCreate(&outside);
    cudaEventRecord(outside, side);
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    cudaStreamWaitEvent(stream, outside, 0);
}

// An event recorded in a capture that has ended, waited for in the next capture (its graph freed:
// the next one may take its address).
static void wait_for_an_ended_capture(void) {
    cudaStream_t stream, side;
    cudaStreamCreate(&stream);
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEvent_t event;
    cudaEventCreate(&event);
    cudaGraph_t graph;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(event, stream);
    cudaStreamEndCapture(stream, &graph);
    cudaGraphDestroy(graph);
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    cudaStreamWaitEvent(side, event, 0);
}

static void query_a_captured_event(void) {
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    cudaEvent_t event;
    cudaEventCreate(&event);
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(event, stream);
    cudaEventQuery(event);
}

// What the captured step below does, queued eagerly: the input's copy up, y = x / 2, its sum, the
// sum's copy down.
static void step(const float *input, float *x, float *y, size_t n, double *sum, double *output, cudaStream_t stream) {
    cudaMemcpyAsync(x, input, n * sizeof *x, cudaMemcpyHostToDevice, stream);
    gpu_divide(y, x, n, 2.0f, stream);
    gpu_sum(y, n, 0, sum, stream);
    cudaMemcpyAsync(output, sum, sizeof *output, cudaMemcpyDeviceToHost, stream);
}

// A capture that forks into a second stream and joins back (DDP's: the communication stream waits
// for the compute stream's event, then the compute stream for the communication stream's): y = x / 2
// on the side stream, y's value copied down on the first. With the join where it belongs, each launch
// gives the eager result; with the first stream's copy queued before its wait for the side stream,
// the launched graph reads y before the side branch has written it, as a GPU may.
static void forked_step(float *x, float *y, size_t n, float value, float *output, bool joined_late, cudaStream_t stream,
                        cudaStream_t side, cudaEvent_t forked, cudaEvent_t joined) {
    gpu_fill(x, n, value, stream);
    cudaEventRecord(forked, stream);
    cudaStreamWaitEvent(side, forked, 0);
    gpu_divide(y, x, n, 2.0f, side);
    cudaEventRecord(joined, side);
    if (joined_late) cudaMemcpyAsync(output, y + n - 1, sizeof *output, cudaMemcpyDeviceToHost, stream);
    cudaStreamWaitEvent(stream, joined, 0);
    if (!joined_late) cudaMemcpyAsync(output, y + n - 1, sizeof *output, cudaMemcpyDeviceToHost, stream);
}

static void test_forked_graphs(cudaStream_t stream, float *x, float *y, size_t n) {
    cudaStream_t side;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEvent_t forked, joined;
    cudaEventCreateWithFlags(&forked, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&joined, cudaEventDisableTiming);
    float *output = NULL;
    cudaMallocHost((void **)&output, 4 * sizeof *output);
    cudaGraphExec_t exec[2];
    cudaGraph_t graph[2];
    for (int late = 0; late < 2; late++) {
        gpu_fill(y, n, -7.0f, stream);  // what y holds before the graph
        cudaStreamSynchronize(stream);
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
        forked_step(x, y, n, 3.0f + (float)late, &output[late], late, stream, side, forked, joined);
        cudaStreamEndCapture(stream, &graph[late]);
        cudaGraphInstantiate(&exec[late], graph[late], 0);
    }
    enum cudaStreamCaptureStatus status;
    cudaStreamIsCapturing(side, &status);
    check(status == cudaStreamCaptureStatusNone, "the forked stream leaves the capture with the stream it began on");
    cudaGraphLaunch(exec[0], stream);
    cudaStreamSynchronize(stream);
    forked_step(x, y, n, 3.0f, &output[2], false, stream, side, forked, joined);
    cudaStreamSynchronize(stream);
    char what[200];
    snprintf(what, sizeof what, "a graph forked into a second stream and joined back: %g, as eagerly (%g)", output[0],
             output[2]);
    check(output[0] == 1.5f && output[2] == 1.5f, what);
    gpu_fill(y, n, -7.0f, stream);
    cudaGraphLaunch(exec[1], stream);
    cudaStreamSynchronize(stream);
    snprintf(what, sizeof what, "a graph whose stream reads the side branch's result before it joins reads the old "
             "value (%g, not 2)", output[1]);
    check(output[1] == -7.0f, what);
    for (int late = 0; late < 2; late++) {
        cudaGraphExecDestroy(exec[late]);
        cudaGraphDestroy(graph[late]);
    }
    cudaFreeHost(output);
}

static void test_graphs(void) {
    check(dies(wait_inside_a_capture, SIGABRT, "while a stream is captured into a CUDA graph"),
          "a wait for the GPU inside a stream capture stops the run, named");
    check(dies(fork_not_joined, SIGABRT, "was not joined back"),
          "a stream forked into a capture and not joined back stops the run at the capture's end, named");
    check(dies(wait_for_an_outside_event, SIGABRT, "recorded outside its capture"),
          "a captured stream waiting for an event recorded outside the capture stops the run, named");
    check(dies(query_a_captured_event, SIGABRT, "cudaEventQuery of an event recorded inside a stream capture"),
          "a query of an event recorded in a capture stops the run, named");
    check(dies(wait_for_an_ended_capture, SIGABRT, "recorded in a capture that has ended"),
          "a wait, in a new capture, for an event recorded in one that has ended stops the run, named");
    const size_t n = 1000;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    float *input = NULL, *x = device_floats(n), *y = device_floats(n);
    double *sum = NULL, *output = NULL;
    cudaMallocHost((void **)&input, n * sizeof *input);
    cudaMallocHost((void **)&output, sizeof *output);
    cudaMalloc((void **)&sum, sizeof *sum);
    *output = -1;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    step(input, x, y, n, sum, output, stream);
    cudaGraph_t graph;
    cudaStreamEndCapture(stream, &graph);
    cudaGraphExec_t exec;
    cudaGraphInstantiate(&exec, graph, 0);
    cudaStreamSynchronize(stream);
    check(*output == -1, "a captured stream's work does not run at its capture");
    // Each launch runs it again, on what the page-locked input holds then; the same bits as eagerly.
    double replayed[2], eager[2];
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < n; i++) input[i] = (float)((i * (round + 3)) % 11) - 4.75f;
        cudaGraphLaunch(exec, stream);
        cudaStreamSynchronize(stream);
        replayed[round] = *output;
        step(input, x, y, n, sum, output, stream);
        cudaStreamSynchronize(stream);
        eager[round] = *output;
    }
    char what[256];
    snprintf(what, sizeof what, "a graph launched twice on new inputs: %.4f and %.4f, the eager step's bit for bit",
             replayed[0], replayed[1]);
    check(replayed[0] == eager[0] && replayed[1] == eager[1] && replayed[0] != replayed[1], what);
    enum cudaStreamCaptureStatus status;
    cudaStreamIsCapturing(stream, &status);
    check(status == cudaStreamCaptureStatusNone && cudaStreamBeginCapture(0, cudaStreamCaptureModeThreadLocal) != cudaSuccess,
          "capture has ended; the legacy default stream cannot be captured");
    cudaGetLastError();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    test_forked_graphs(stream, x, y, n);
}

int main(void) {
    check(dies(host_reads_device_memory, SIGSEGV, NULL), "host code that reads device memory is a segfault");
    check(dies(kernel_given_host_memory, SIGABRT, "kernel fill_kernel: argument 0"),
          "a kernel given host memory stops the run, named");
    check(dies(kernel_job_given_host_memory, SIGABRT, "kernel sparse_adam_kernel: argument 0"),
          "a kernel whose job (one of the tables it is given) holds host memory stops the run, named");
    check(dies(copy_of_the_wrong_kind, SIGABRT, "cudaMemcpy's destination"), "a cudaMemcpy of the wrong kind stops the run");
    check(dies(copy_past_the_end, SIGABRT, "not inside one block of device memory"),
          "a copy past the end of a device block stops the run");
    check(dies(gemm_on_host_memory, SIGABRT, "cublasSgemm's A"), "cublasSgemm on host memory stops the run, named");

    // Fresh device memory is NaN, not zeros.
    const size_t n = 3000;
    float *x = device_floats(n), *host = NULL;
    cudaMallocHost((void **)&host, n * sizeof *host);
    cudaMemcpy(host, x, n * sizeof *host, cudaMemcpyDeviceToHost);
    check(isnan(host[0]) && isnan(host[n - 1]), "fresh device memory holds NaN");

    // A stream's work waits for its stream: a copy on another stream that does
    // not wait for the fill reads what was there before it.
    cudaStream_t compute, copy;
    cudaStreamCreate(&compute);
    cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking);
    gpu_fill(x, n, 2.0f, compute);
    cudaMemcpyAsync(host, x, n * sizeof *host, cudaMemcpyDeviceToHost, copy);
    cudaStreamSynchronize(copy);
    check(isnan(host[0]), "a copy on a stream that does not wait for the fill reads the old data");
    cudaEvent_t filled;
    cudaEventCreate(&filled);
    gpu_fill(x, n, 3.0f, compute);
    cudaEventRecord(filled, compute);
    cudaStreamWaitEvent(copy, filled, 0);
    cudaMemcpyAsync(host, x, n * sizeof *host, cudaMemcpyDeviceToHost, copy);
    check(host[0] != 3.0f, "an asynchronous copy into page-locked memory has not landed before a wait");
    cudaStreamSynchronize(copy);
    check(host[0] == 3.0f && host[n - 1] == 3.0f, "with cudaStreamWaitEvent it reads the fill's values");

    // A kernel with __syncthreads (one block of 1024 fibers) sums in its fixed order.
    for (size_t i = 0; i < n; i++) host[i] = (float)(i % 7) - 2.5f;
    double expected = 0, *sum = NULL, got = 0;
    for (size_t i = 0; i < n; i++) expected += host[i];
    cudaMemcpy(x, host, n * sizeof *host, cudaMemcpyHostToDevice);
    cudaMalloc((void **)&sum, sizeof *sum);
    gpu_sum(x, n, 0, sum, compute);
    cudaMemcpyAsync(&got, sum, sizeof got, cudaMemcpyDeviceToHost, compute);
    check(got == expected, "a kernel with __syncthreads (gpu_sum, 1024 threads) sums right");

    // cuBLAS is column-major: C = A B with A = [1 2; 3 4], B = [5 6; 7 8] (rows) is [19 22; 43 50].
    float a[4] = {1, 3, 2, 4}, b[4] = {5, 7, 6, 8}, c[4], one = 1, zero = 0, *da = device_floats(4),
          *db = device_floats(4), *dc = device_floats(4);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    cublasHandle_t handle;
    cublasCreate(&handle);
    cublasSetStream(handle, compute);
    cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, da, 2, db, 2, &zero, dc, 2);  // dc is NaN: beta 0 ignores it
    cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost);
    check(c[0] == 19 && c[2] == 22 && c[1] == 43 && c[3] == 50, "cublasSgemm, column-major, beta 0 over NaN");

    test_graphs();

    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
