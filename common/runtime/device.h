// device.h: where this rank computes, CPU or its GPU, and the CUDA context of that choice.
//
//   Device device = device_from_flag(opt.device);   // collective: every rank calls it
//   Mlp model = mlp_new(..., device);               // tensors live on that device
//   ...
//   device_synchronize();                           // torch.cuda.synchronize()
//
// --device auto (the default) takes the GPU when every rank has one, cuda asks
// for it (an error where there is none), cpu never touches CUDA. Rank r uses
// GPU (local rank mod GPUs on its node). NCCL cannot put two ranks of one
// communicator on the same GPU: when ranks outnumber GPUs on a node, every
// rank still computes on a GPU, but collectives go through MPI on host copies,
// and rank 0 says so once.
//
// GPU work is queued, in order, on one compute stream per rank: the host runs
// ahead until it needs a result (a loss value, a copy to the host).
//
// Layers: device sits on dist (the process group: local rank, hostname, MPI
// for the choice) and owns everything CUDA: the GPU, its streams, the cuBLAS
// handle and the NCCL communicator. It registers its teardown with
// dist_at_finalize. Collectives on tensors are one layer up (collectives.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "base/check.h"  // HAVE_CUDA, CHECK_CUDA

typedef enum { DEVICE_CPU, DEVICE_CUDA } Device;

// Parse --device cpu|cuda|auto and set this rank up on the device it names.
// Collective. With a GPU: picks it, creates the compute stream and the cuBLAS
// handle, and (world > 1, one GPU per rank) the NCCL communicator.
Device device_from_flag(const char *flag);
// "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)" once a GPU is chosen.
const char *device_name(Device device);

// The memory of this rank's GPU (its total, as cudaGetDeviceProperties gives it)
// and how many ranks of the job use that GPU: 0 and 0 on a CPU rank.
double device_gpu_memory_bytes(int *ranks_on_gpu);

// CUDA devices this process can use: 0 in a build without CUDA, without a
// driver, or without a GPU. Never fails.
int device_gpu_count(void);
// The GPU this rank takes: local rank mod the GPUs it can see.
int device_local_gpu(void);
// Does any GPU serve two ranks? Collective; the same answer on every rank.
// It compares the GPUs' node and PCI address, not counts: under Slurm each
// rank may see only its own GPU (CUDA_VISIBLE_DEVICES), as GPU 0.
bool device_gpus_shared(int gpu);

// Wait until the GPU has finished all queued work (nothing to do on the CPU).
// Like every host wait on the GPU here, it polls (see device_wait_stream).
void device_synchronize(void);
// A training step is queued: the optimizer calls this after its update (adam_step, sgd_step,
// step 15's SparseAdam). The simulated GPU (tests/fake_gpu, `make FAKE_GPU=1`) counts its host
// waits and launches between two marks (FAKE_GPU_COUNTS); in every other build it is nothing.
#if FAKE_GPU
void fake_gpu_step_boundary(void);
#define device_mark_step() fake_gpu_step_boundary()
#else
#define device_mark_step() ((void)0)
#endif
// A thread other than main() that calls CUDA must first bind to our GPU.
void device_bind_thread(void);
// Release the NCCL communicator, the streams and the cuBLAS handle.
// device_from_flag registers it with dist_at_finalize; it may run earlier.
void device_release(void);

// Raw device memory (cudaMalloc; zero bytes give NULL), and host memory that
// the GPU copies fastest (page-locked on a GPU rank, plain malloc otherwise).
void *device_alloc(size_t bytes);
void device_free(void *pointer);
// Scratch memory on the GPU that grows to the largest request and is kept between calls (a loss's
// per-row terms, a batch's indices, step 15's rows): a cudaMalloc (and its wait) for each new
// largest size, not for each call. device_buffer_reserve returns at least `bytes` of it; when it
// must grow it takes half as much again (sizes that creep up step by step then reallocate rarely),
// and what it held is dropped. A zeroed DeviceBuffer is an empty one.
typedef struct {
    void *data;
    size_t bytes;
} DeviceBuffer;
void *device_buffer_reserve(DeviceBuffer *buffer, size_t bytes);
void device_buffer_free(DeviceBuffer *buffer);
// How many times device_buffer_reserve has (re)allocated a buffer in this process: when it changed,
// some buffer may have moved, and a CUDA graph captured before holds its old address
// (train/step_graph.h captures again).
long device_buffer_moves(void);
// The most bytes device_alloc held at once on this rank's GPU, as torch.cuda.max_memory_allocated()
// counts them (0 on a CPU rank): what the model, its state and the activations took, without what the
// CUDA context, cuBLAS and NCCL keep for themselves.
size_t device_peak_bytes(void);
// The process's peak resident set, in bytes (getrusage): the most host memory it held at once, the
// data and the libraries included. The one measure of host memory: step 15's load line, the traces'
// per-rank peaks (profile.c) and device_peak_memory_bytes on a CPU rank.
double host_peak_resident_bytes(void);
// The peak of the memory that holds this rank's model: on a GPU rank device_peak_bytes(); on a CPU rank
// host_peak_resident_bytes().
double device_peak_memory_bytes(Device device);
void *device_host_alloc(size_t bytes);
void device_host_free(void *pointer);

// Do GPU collectives go through NCCL? True on a GPU rank of a job of more
// than one rank where every rank has a GPU of its own (device_from_flag
// opened the communicator: rank 0 makes the unique id, MPI_Bcast carries it).
bool device_nccl(void);

#if HAVE_CUDA
// Host waits on the GPU that never hang on a dead peer. A GPU blocked in an
// NCCL collective whose peer has died never finishes, and neither would a
// plain cudaStreamSynchronize. So these poll, as nccl-tests does: query the
// stream or event, and between queries ask NCCL for the communicator's
// asynchronous error (ncclCommGetAsyncError). On an error, or past the time
// limit (GPU_WAIT_TIMEOUT): ncclCommAbort, one line naming `what` the host
// waited for ("the loss"), and MPI_Abort, which ends the job. (Without NCCL
// they just poll.) Any thread may call them.
//
// No other host wait may come first: a copy into pageable host memory, a
// cudaMalloc or a cudaFree waits for the GPU inside the driver, where nothing
// polls. So device_read_to_host waits (polled) before it copies, and
// device_alloc and device_free synchronize (polled) before they call CUDA.
void device_wait_stream(cudaStream_t stream, const char *what);
void device_wait_event(cudaEvent_t event, const char *what);
// The same for a stream whose NCCL communicator is the caller's own (step 12
// opens one beside device.c's); *comm is NULL after an abort.
void device_wait_stream_nccl(cudaStream_t stream, ncclComm_t *comm, const char *what);
// `bytes` from the GPU to host memory, pageable or not, once the compute
// stream has done what is queued before (the copy included): `what` names it.
void device_read_to_host(void *host, const void *device_memory, size_t bytes, const char *what);
// `bytes` of host memory (pageable: a batch's tokens) to the GPU, queued on the compute stream, the
// host's array free again on return, and no host wait: a cudaMemcpyAsync from pageable memory may
// wait for the stream inside the driver (where nothing polls), so the bytes go through a ring of 64
// page-locked slots, each reused once the copy out of it has run (its event: long done in a steady
// state; the host waits, polled, only when it is 64 uploads ahead of the GPU). `what` names it.
void device_upload(void *device_memory, const void *host, size_t bytes, const char *what);
// A table that one launch over many tensors reads on the GPU (each tensor's address and length:
// Adam's update, zero_grad, the gradients' norm), sent only when it is not what went last: a model's
// tensors are the same every step, so their table goes over once. A changed table goes to a new
// buffer, never over the old one, which a graph captured before may read (device_buffer_moves counts
// it: step_graph.h captures again), and never during a capture (it would record the copy out of an
// upload slot that later uploads reuse). Compared byte for byte: build the entries in zeroed memory,
// field by field (a struct's assignment may leave its padding as it likes). A zeroed one is empty.
typedef struct {
    DeviceBuffer device;
    void *sent;  // the host's copy of what went over
    size_t bytes;
} DeviceTable;
// Does the table hold these bytes?
bool device_table_holds(const DeviceTable *table, const void *host, size_t bytes);
// The table's device copy, holding `host`'s bytes for the launches queued after this call on the
// compute stream (the upload is queued there). `what` names the table (in the error, should it
// change during a capture).
const void *device_table_send(DeviceTable *table, const void *host, size_t bytes, const char *what);
void device_table_free(DeviceTable *table);

// The compute stream's work between device_graph_begin and device_graph_end as a CUDA graph
// (torch.cuda.CUDAGraph): captured, not run; device_graph_launch queues all of it again in one
// launch. The work of a stream that waits for an event the compute stream recorded meanwhile is
// captured too (the communication stream's NCCL calls: collectives.c, DDP's buckets), and must be
// joined back (the compute stream waits for an event of it) before device_graph_end. In between,
// nothing may wait for the GPU (CUDA refuses it: a buffer that grows, a read back), and every
// kernel's arguments, pointers included, are those of the capture: what changes from one launch to
// the next lives in device memory that is written before it (train/step_graph.h).
typedef struct DeviceGraph DeviceGraph;
void device_graph_begin(void);
// Between device_graph_begin and device_graph_end: what is queued now is recorded into the graph, so
// an event recorded now marks a place in the graph, to order streams by (DDP's communication stream
// forks from the compute stream and joins it again), not a time to read: timers skip such a step.
bool device_graph_capturing(void);
DeviceGraph *device_graph_end(void);
void device_graph_launch(const DeviceGraph *graph);
void device_graph_free(DeviceGraph *graph);

// A communicator for the group of ranks that pass the same color, ordered by
// key (ncclCommSplit of the world's; collective over the world). Its waits
// are polled and its errors end the job as the world's (group.h uses it).
ncclComm_t device_nccl_split(int color, int key);
void device_nccl_free(ncclComm_t comm);

cudaStream_t device_stream(void);      // the compute stream
cublasHandle_t device_cublas(void);    // bound to the compute stream
ncclComm_t device_nccl_comm(void);     // NULL without NCCL
cudaStream_t device_comm_stream(void); // NCCL's stream, beside the compute stream
#endif
