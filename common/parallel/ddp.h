// ddp.h: DistributedDataParallel, the library behind step 6.
//
// What torch.nn.parallel.DistributedDataParallel does, in four moves:
//   1. wrap:     broadcast rank 0's parameters, so every rank starts equal;
//   2. buckets:  group the gradients, in reverse parameter order (the order
//                backward produces them), into buckets of about bucket_mb;
//   3. overlap:  as soon as backward has produced every gradient of a bucket,
//                start its allreduce, while backward goes on with earlier layers;
//   4. finish:   before the optimizer step, wait for every bucket and divide
//                by the world size: each gradient is then the mean over ranks.
//
//   Ddp ddp = ddp_wrap(model.params, model.n_params, 25.0);    // model = DDP(model)
//   ...
//   mlp_backward(&model, &x, ddp_grad_ready, &ddp);            // loss.backward()
//   ddp_finish(&ddp);                                          // (inside DDP's hooks)
//   adam_step(&optimizer);
//
// On GPUs with NCCL (one GPU per rank) there is no thread: a bucket's
// allreduce is queued on the communication stream as soon as the compute
// stream has packed it, and the GPU overlaps the two by itself; ddp_finish
// makes the compute stream wait for the buckets. Where ranks share a GPU, the
// bucket goes to a page-locked host copy and through MPI as on CPUs.
//
// Progress: an MPI non-blocking collective advances only while some thread is
// inside MPI. A communication thread owns the buckets' MPI calls: it starts each
// ready bucket's MPI_Iallreduce and drives it with MPI_Test while the main
// thread computes. The main thread never enters MPI between ddp_grad_ready and
// ddp_finish. (MPI without MPI_THREAD_MULTIPLE: buckets are started and driven
// from ddp_grad_ready itself, between layers, and ddp_wrap says so.)
//
// The code, by strategy (ddp_internal.h lists what the files share):
//   ddp.c        this outline: wrap (buckets), grad_ready, finish, free, each
//                handing the bucket to its strategy;
//   ddp_mpi.c    CPU gradients through MPI: 1. with a communication thread,
//                2. without MPI thread support, between layers;
//   ddp_gpu.c    GPU gradients: 3. NCCL on the GPU, 4. a GPU shared by several
//                ranks, through host copies and ddp_mpi.c;
//   ddp_stats.c  the overlap statistics and the reports.
#pragma once
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>

#include "comm/group.h"
#include "models/nn.h"
#include "runtime/profile.h"

typedef struct {
    int first_param, n_params;  // params[first_param .. first_param + n_params), in reverse order
    size_t count;               // floats
    float *buffer;              // [count]: the flat gradients, reduced in place
    int pending;                // gradients not yet produced in this backward
    MPI_Request request;
    ProfileRange range;         // "allreduce", on the thread that drives it
    bool started, completed;    // this step (completed: set by whoever tests it, read after n_done says so)
    double start_time, done_time;
} DdpBucket;

// GPU gradients' buffers and events, per bucket and per step (ddp_gpu.c).
typedef struct DdpGpu DdpGpu;

typedef struct {
    Param *params;
    int n_params;
    const Group *group;        // the ranks it averages over (the world, unless ddp_wrap_group)
    int world_size;            // the group's size
    int n_buckets;
    DdpBucket *buckets;        // buckets[0] holds the last parameters: it is ready first
    int *bucket_of_param;      // [n_params]
    bool sync;                 // false inside no_sync: accumulate locally, no communication
    bool on_gpu;               // the gradients live on the GPU
    bool nccl;                 // ... and NCCL reduces them
    DdpGpu *gpu;               // GPU gradients: their device side (NULL on CPUs)

    // The communication thread and what it shares with the main thread.
    bool use_thread;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int n_ready, n_started, n_done;  // buckets handed to the thread / started / completed, this step
    bool finishing;            // the main thread waits in ddp_finish: test without napping
    bool stopping;

    // Overlap statistics, over all synchronised steps (each queued by the host: a step replayed
    // from a CUDA graph is not seen here, and then none are reported: captured_steps).
    long steps;
    long captured_steps;       // NCCL: of `steps`, those captured into a CUDA graph (no times recorded)
    double comm_seconds;       // time some bucket's allreduce was in flight
    double hidden_seconds;     // of that, the part before ddp_finish was entered
    double wait_seconds;       // time the main thread waited in ddp_finish
} Ddp;

// Broadcast rank 0's parameters and build the buckets (bucket_mb <= 0: one
// bucket per tensor). bucket_mb counts MiB (2^20 bytes), as PyTorch's
// bucket_cap_mb does: 25 is 26.2 MB in the decimal units that the programs
// print sizes in. Collective.
Ddp ddp_wrap(Param *params, int n_params, double bucket_mb);
// The same over a group (group.h), as DDP(model, process_group=group): the
// group's rank 0 broadcasts, and gradients are averaged over the group's
// ranks. Collective over the group; the group must outlive the Ddp.
Ddp ddp_wrap_group(Param *params, int n_params, double bucket_mb, const Group *group);
void ddp_free(Ddp *ddp);

// The GradReadyHook for mlp_backward: parameter `index` has its final gradient.
void ddp_grad_ready(void *ddp, int index);

// Wait for every bucket, copy the reduced sums back and divide them by the
// world size. Must follow every synchronised backward.
void ddp_finish(Ddp *ddp);

// DDP's no_sync(): with sync false, backward only accumulates gradients
// locally; the next synchronised backward reduces the accumulated sum.
void ddp_set_sync(Ddp *ddp, bool sync);

// "gradient allreduce 0.42 ms per step in 1 bucket, 0.05 ms (12%) of it hidden behind backward; ..."
// With NCCL, times come from CUDA events on the GPU's timeline. A step captured into a CUDA graph,
// and its replays, record none (an event recorded in a capture marks a place in the graph, and a
// replay runs no host code): where a step was captured the report says the allreduce was not timed,
// rather than give the few eager steps' times (the first, NCCL's connections made in it) as the
// run's.
void ddp_describe_overlap(Ddp *ddp, char *out, size_t size);
void ddp_describe_buckets(const Ddp *ddp, char *out, size_t size);
