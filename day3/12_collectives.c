// Step 12: the other collectives.        PyTorch twin: the torchrun tutorial's point-to-point and collective primitives
//
// What it adds: data parallelism needs one collective, allreduce (steps 0-11).
// Larger-scale training runs on the others too, and this step shows each one
// do its job, then measures it as NVIDIA's nccl-tests do:
//   broadcast       rank 0's buffer overwrites every rank's        DDP's start: every replica gets rank 0's weights
//   reduce          the sum over ranks, on rank 0 only             a metric that only rank 0 reports
//   allreduce       the sum over ranks, on every rank              DDP's gradients (steps 4-11)
//   gather          rank r's slice r, collected on rank 0          rank 0 writes every rank's results
//   allgather       rank r's slice r, collected on every rank      ZeRO-3/FSDP rebuild a layer from its shards
//   scatter         rank 0's buffer dealt out, slice r to rank r   rank 0 hands out what it alone read
//   reduce-scatter  the sum, slice r of it to rank r               ZeRO/FSDP: each rank sums only its shard's gradients
//   all-to-all      rank r's slice s goes to rank s, as slice r    mixture of experts: tokens to their expert's rank
// Reduce-scatter followed by allgather is an allreduce, and that is how ZeRO
// and FSDP split it: between the two halves each rank updates only the shard
// of the weights it owns. Like step 0, the program calls MPI itself (and, with
// --device cuda, NCCL): mpi_collective() and nccl_collective() below hold the
// lesson, one call per collective (NCCL's gather, scatter and all-to-all are
// point-to-point calls in a group, as nccl-tests writes them).
//
// Build and run:
//   make day3/12_collectives
//   mpirun --oversubscribe -np 4 day3/12_collectives                       # each collective on a few values
//   mpirun --oversubscribe -np 4 day3/12_collectives --count 10000000      # 40 MB per rank: verify and time
//   mpirun -np 4 day3/12_collectives --device cuda --count 100000000       # GPU buffers: NCCL, one GPU per rank
// Any world size works, 1, 3 and 5 included. --count N gives every rank
// buffers of N floats (rounded down to a multiple of the world size), cut
// into one slice per rank where a collective works on slices. With --device
// cuda the buffers live on the GPUs: NCCL moves them when every rank has a GPU
// of its own; ranks that share a GPU go through MPI on host copies, as the
// training steps do. Without a GPU, --device cuda says so in one line.
//
// Expected output at 4 ranks (day3/README.md shows it whole). Rank r starts
// with 10 r + i at position i, so every number tells where it came from; the
// lines come in rank order:
//   Step 12: the collectives on 4 ranks, cpu, MPI (Open MPI v4.1.4); rank r holds 10 r + i at position i, ...
//   ...
//   all-to-all: rank r's slice s goes to rank s, as its slice r (MPI_Alltoall; grouped ncclSend/ncclRecv; torch: dist.all_to_all_single)
//     in training: mixture of experts: every rank sends each token to the rank that holds its expert
//     [rank 0] before  0  1  2  3  after  0 10 20 30
//     [rank 1] before 10 11 12 13  after  1 11 21 31
//     ...
//   every result verified on every rank
// With --count N, a table in nccl-tests' terms: size, time (the slowest rank's
// mean), algbw = size / time, and busbw = algbw x the collective's factor,
// what each link carries (allreduce 2 (W-1)/W; allgather, reduce-scatter,
// all-to-all, gather and scatter (W-1)/W; broadcast and reduce 1):
//   collective          size (B)    time (us)  algbw (GB/s)  busbw (GB/s)  factor  wrong
//   broadcast           40000000     18680.37         2.141         2.141   1.000      0
//   ...
//   every element of every collective verified on every rank
// A wrong element fails the run (exit 1), with one line naming the
// collective, the rank and the element:
//   allreduce: rank 2 holds 89 at element 17 where 88 belongs (1 wrong element over all ranks)
// Test-only: COLLECTIVES_TEST_WRONG_ELEMENT=allreduce:2:17 makes rank 2 change
// element 17 of its allreduce result before it is verified, which is how
// tests/test_collectives.sh proves that a wrong element is caught.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"       // the flag table and --help
#include "base/check.h"      // CHECK_MPI, CHECK_CUDA, CHECK_NCCL: one line, then MPI_Abort
#include "base/timer.h"      // wall_seconds
#include "runtime/device.h"  // which GPU this rank takes, and whether ranks share one
#include "runtime/dist.h"    // rank, world size, print0

#define ROOT 0  // the rank that broadcast and scatter send from, and reduce and gather collect on

typedef enum { BROADCAST, REDUCE, ALLREDUCE, GATHER, ALLGATHER, SCATTER, REDUCE_SCATTER, ALL_TO_ALL, COLLECTIVES } Collective;

static const struct {
    const char *name;
    const char *does;      // what lands where
    const char *calls;     // MPI's, NCCL's and torch.distributed's name for it
    const char *training;  // what training uses it for
} ABOUT[COLLECTIVES] = {
    {"broadcast", "rank 0's buffer overwrites every rank's", "MPI_Bcast; ncclBroadcast; torch: dist.broadcast",
     "DDP starts every replica from rank 0's weights (step 6's ddp_wrap)"},
    {"reduce", "the sum over ranks, on rank 0 only", "MPI_Reduce; ncclReduce; torch: dist.reduce",
     "a loss or an accuracy count summed where only rank 0 reports it"},
    {"allreduce", "the sum over ranks, on every rank", "MPI_Allreduce; ncclAllReduce; torch: dist.all_reduce",
     "data parallelism: every rank gets the summed gradients and takes the same step (steps 4-11)"},
    {"gather", "rank r's slice r, collected on rank 0", "MPI_Gather; grouped ncclSend/ncclRecv; torch: dist.gather",
     "rank 0 collects every rank's results (predictions, timings) to write them once"},
    {"allgather", "rank r's slice r, collected on every rank",
     "MPI_Allgather; ncclAllGather; torch: dist.all_gather_into_tensor",
     "ZeRO-3 and FSDP rebuild each layer's full weights from the ranks' shards just before using them"},
    {"scatter", "rank 0's buffer dealt out, slice r to rank r", "MPI_Scatter; grouped ncclSend/ncclRecv; torch: dist.scatter",
     "rank 0 hands every rank its part of something it alone read (a shard of a data set or a checkpoint)"},
    {"reduce-scatter", "the sum over ranks, slice r of it to rank r",
     "MPI_Reduce_scatter_block; ncclReduceScatter; torch: dist.reduce_scatter_tensor",
     "ZeRO and FSDP: each rank gets the summed gradients of the shard it owns; reduce-scatter + allgather = allreduce"},
    {"all-to-all", "rank r's slice s goes to rank s, as its slice r",
     "MPI_Alltoall; grouped ncclSend/ncclRecv; torch: dist.all_to_all_single",
     "mixture of experts: every rank sends each token to the rank that holds its expert"},
};

// nccl-tests' bus bandwidth: algbw times the share of the data that crosses
// each rank's link, so that one number, comparable across world sizes, says
// how close a collective comes to the hardware.
static double bus_factor(Collective c, int world) {
    switch (c) {
    case BROADCAST:
    case REDUCE: return 1.0;                                 // a pipeline passes the whole buffer over every link
    case ALLREDUCE: return 2.0 * (world - 1) / world;        // a ring: reduce-scatter, then allgather
    default: return (double)(world - 1) / (double)world;    // every slice but the rank's own crosses its link
    }
}

// ---------------------------------------------------------------- the values, and the right answers

// Rank r's input holds 10 r + (i mod 10) at position i: the tens name the rank,
// the units the position (rank 2 starts with 20 21 22 23). Small integers, so
// a sum of them is exact in float32 in any order of addition (up to
// MAX_RANKS ranks): every element of every result has exactly one right value.
#define MAX_RANKS 1800
static float input_value(int rank, long i) { return (float)(10 * rank + i % 10); }
static double sum_over_ranks(long i, int world) { return 5.0 * world * (world - 1) + (double)world * (double)(i % 10); }

// What element k of this rank's result must be. The buffers hold n = slice x
// world floats; slice s is elements [s x slice, (s + 1) x slice).
static double expected(Collective c, int rank, int world, long slice, long k) {
    switch (c) {
    case BROADCAST: return input_value(ROOT, k);
    case REDUCE:
    case ALLREDUCE: return sum_over_ranks(k, world);
    case GATHER:
    case ALLGATHER: return input_value((int)(k / slice), k);                       // slice s is rank s's slice s
    case SCATTER: return input_value(ROOT, rank * slice + k);                      // the root's slice `rank`
    case REDUCE_SCATTER: return sum_over_ranks(rank * slice + k, world);           // slice `rank` of the sum
    case ALL_TO_ALL: return input_value((int)(k / slice), rank * slice + k % slice);  // rank s's slice `rank`
    default: return -1;
    }
}

// What this rank sends (elements [first, first + count) of its input) and how
// much of its result buffer the collective writes.
typedef struct { long first, count; } Span;
static Span sent(Collective c, int rank, int world, long slice) {
    long n = slice * world;
    switch (c) {
    case BROADCAST:
    case SCATTER: return (Span){0, rank == ROOT ? n : 0};
    case GATHER:
    case ALLGATHER: return (Span){rank * slice, slice};  // its own slice
    default: return (Span){0, n};
    }
}
static long result_count(Collective c, int rank, int world, long slice) {
    switch (c) {
    case REDUCE:
    case GATHER: return rank == ROOT ? slice * world : 0;
    case SCATTER:
    case REDUCE_SCATTER: return slice;
    default: return slice * world;
    }
}

// ---------------------------------------------------------------- the lesson: one call per collective

// MPI, on host buffers. Broadcast works in place, as torch's does: `out` is the
// one buffer, the root's is sent and the others are overwritten.
static void mpi_collective(Collective c, const float *in, float *out, int slice) {
    int rank = dist_rank(), world = dist_world_size(), n = slice * world;
    MPI_Comm all = MPI_COMM_WORLD;
    switch (c) {
    case BROADCAST: CHECK_MPI(MPI_Bcast(out, n, MPI_FLOAT, ROOT, all)); break;
    case REDUCE: CHECK_MPI(MPI_Reduce(in, out, n, MPI_FLOAT, MPI_SUM, ROOT, all)); break;
    case ALLREDUCE: CHECK_MPI(MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, all)); break;
    case GATHER: CHECK_MPI(MPI_Gather(in + (long)rank * slice, slice, MPI_FLOAT, out, slice, MPI_FLOAT, ROOT, all)); break;
    case ALLGATHER: CHECK_MPI(MPI_Allgather(in + (long)rank * slice, slice, MPI_FLOAT, out, slice, MPI_FLOAT, all)); break;
    case SCATTER: CHECK_MPI(MPI_Scatter(in, slice, MPI_FLOAT, out, slice, MPI_FLOAT, ROOT, all)); break;
    case REDUCE_SCATTER: CHECK_MPI(MPI_Reduce_scatter_block(in, out, slice, MPI_FLOAT, MPI_SUM, all)); break;
    case ALL_TO_ALL: CHECK_MPI(MPI_Alltoall(in, slice, MPI_FLOAT, out, slice, MPI_FLOAT, all)); break;
    default: break;
    }
}

#if HAVE_CUDA
// NCCL, on GPU buffers. Each call only queues the work on the stream. NCCL's
// collectives proper are broadcast, reduce, allreduce, allgather and
// reduce-scatter; gather, scatter and all-to-all are sends and receives, and
// ncclGroupStart/End makes them one operation in which every transfer runs at
// once (without the group, two ranks that both send first would wait on each
// other forever). NCCL 2.28 adds ncclGather, ncclScatter and ncclAlltoAll that
// do the same; the grouped calls work with every NCCL since 2.7.
static void nccl_collective(Collective c, const float *in, float *out, size_t slice, ncclComm_t comm, cudaStream_t stream) {
    int rank = dist_rank(), world = dist_world_size();
    size_t n = slice * (size_t)world;
    switch (c) {
    case BROADCAST: CHECK_NCCL(ncclBroadcast(out, out, n, ncclFloat, ROOT, comm, stream)); break;
    case REDUCE: CHECK_NCCL(ncclReduce(in, out, n, ncclFloat, ncclSum, ROOT, comm, stream)); break;
    case ALLREDUCE: CHECK_NCCL(ncclAllReduce(in, out, n, ncclFloat, ncclSum, comm, stream)); break;
    case GATHER:
        CHECK_NCCL(ncclGroupStart());
        CHECK_NCCL(ncclSend(in + rank * slice, slice, ncclFloat, ROOT, comm, stream));
        if (rank == ROOT)
            for (int peer = 0; peer < world; peer++)
                CHECK_NCCL(ncclRecv(out + peer * slice, slice, ncclFloat, peer, comm, stream));
        CHECK_NCCL(ncclGroupEnd());
        break;
    case ALLGATHER: CHECK_NCCL(ncclAllGather(in + rank * slice, out, slice, ncclFloat, comm, stream)); break;
    case SCATTER:
        CHECK_NCCL(ncclGroupStart());
        if (rank == ROOT)
            for (int peer = 0; peer < world; peer++)
                CHECK_NCCL(ncclSend(in + peer * slice, slice, ncclFloat, peer, comm, stream));
        CHECK_NCCL(ncclRecv(out, slice, ncclFloat, ROOT, comm, stream));
        CHECK_NCCL(ncclGroupEnd());
        break;
    case REDUCE_SCATTER: CHECK_NCCL(ncclReduceScatter(in, out, slice, ncclFloat, ncclSum, comm, stream)); break;
    case ALL_TO_ALL:
        CHECK_NCCL(ncclGroupStart());
        for (int peer = 0; peer < world; peer++) {
            CHECK_NCCL(ncclSend(in + peer * slice, slice, ncclFloat, peer, comm, stream));
            CHECK_NCCL(ncclRecv(out + peer * slice, slice, ncclFloat, peer, comm, stream));
        }
        CHECK_NCCL(ncclGroupEnd());
        break;
    default: break;
    }
}
#endif

// ---------------------------------------------------------------- buffers on the CPU or the GPU

typedef struct {
    bool gpu;                    // in and out live on this rank's GPU
    float *in, *out;             // what the collectives read and write: n floats each
    float *host_in, *host_out;   // host copies (the CPU's buffers are their own): MPI's, when
                                 // ranks share a GPU, and what we verify and print
#if HAVE_CUDA
    ncclComm_t nccl;             // NULL: the ranks share a GPU, MPI moves host copies
    cudaStream_t stream;
#endif
} Buffers;

// Wait for the work queued on the GPU (nothing to wait for on the CPU),
// looking at NCCL's error state meanwhile, as nccl-tests does: when a peer
// dies, NCCL keeps waiting for it, and so would cudaStreamSynchronize. An
// error, or a wait past GPU_WAIT_TIMEOUT (a dead peer on the same node, which
// NCCL never reports), ends the job with one line instead (common/runtime/device.h).
static void wait_for_gpu(Buffers *b) {
#if HAVE_CUDA
    if (b->gpu) device_wait_stream_nccl(b->stream, &b->nccl, "the collectives");
#else
    (void)b;
#endif
}

// Run collective c once, wherever the buffers are. On NCCL it is only queued.
static void run(Collective c, Buffers *b, int slice) {
    if (!b->gpu) {
        mpi_collective(c, b->in, b->out, slice);
        return;
    }
#if HAVE_CUDA
    if (b->nccl) {
        nccl_collective(c, b->in, b->out, (size_t)slice, b->nccl, b->stream);
        return;
    }
    // Ranks share a GPU, which NCCL cannot do: what this rank sends goes to
    // the host, MPI moves it there, and what it received goes back to the GPU.
    int rank = dist_rank(), world = dist_world_size();
    Span send = sent(c, rank, world, slice);
    const float *from = c == BROADCAST ? b->out : b->in;  // broadcast's one buffer is `out`
    float *host_from = c == BROADCAST ? b->host_out : b->host_in;
    CHECK_CUDA(cudaMemcpy(host_from + send.first, from + send.first, send.count * sizeof(float), cudaMemcpyDeviceToHost));
    mpi_collective(c, b->host_in, b->host_out, slice);
    CHECK_CUDA(cudaMemcpy(b->out, b->host_out, result_count(c, rank, world, slice) * sizeof(float), cudaMemcpyHostToDevice));
#endif
}

// Every rank's state before collective c: its values in `in`; -1, which no
// collective here produces, in `out`, so an element left unwritten is caught;
// except broadcast's buffer, `out`, which starts as the rank's own values.
static void fill(Collective c, Buffers *b, long n) {
    for (long i = 0; i < n; i++) {
        b->host_in[i] = input_value(dist_rank(), i);
        b->host_out[i] = c == BROADCAST ? b->host_in[i] : -1.0f;
    }
#if HAVE_CUDA
    if (b->gpu) {
        CHECK_CUDA(cudaMemcpy(b->in, b->host_in, n * sizeof(float), cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(b->out, b->host_out, n * sizeof(float), cudaMemcpyHostToDevice));
    }
#endif
}

// Wait for the queued work, and bring the result to host_out.
static void result_to_host(Buffers *b, long count) {
    wait_for_gpu(b);
#if HAVE_CUDA
    if (b->gpu) CHECK_CUDA(cudaMemcpy(b->host_out, b->out, count * sizeof(float), cudaMemcpyDeviceToHost));
#else
    (void)count;
#endif
}

// ---------------------------------------------------------------- verification

// The test-only hook: which result element to spoil, on which rank.
typedef struct { int on; Collective c; int rank; long index; } Plant;
#define PLANT_VARIABLE "COLLECTIVES_TEST_WRONG_ELEMENT"

static Plant plant_from_environment(int world, long slice) {
    Plant plant = {0};
    const char *text = getenv(PLANT_VARIABLE);
    if (!text || !*text) return plant;
    char name[32] = "", end = 0;
    if (sscanf(text, "%31[^:]:%d:%ld%c", name, &plant.rank, &plant.index, &end) != 3)
        usage_error(PLANT_VARIABLE "=%s: expected COLLECTIVE:RANK:INDEX (test only)", text);
    for (plant.c = 0; plant.c < COLLECTIVES && strcmp(ABOUT[plant.c].name, name) != 0; plant.c++) {}
    if (plant.c == COLLECTIVES) usage_error(PLANT_VARIABLE "=%s: no collective '%s'", text, name);
    if (plant.rank < 0 || plant.rank >= world || plant.index < 0 ||
        plant.index >= result_count(plant.c, plant.rank, world, slice))
        usage_error(PLANT_VARIABLE "=%s: rank %d has no element %ld in its %s result", text, plant.rank,
                    plant.index, name);
    plant.on = 1;
    return plant;
}

// Check every element of this rank's result; all ranks learn every rank's
// verdict, and rank 0 names the first wrong element of the lowest rank that
// has one, in one line. Returns the number of wrong elements over all ranks.
// Collective.
static long verify(Collective c, const float *result, long count, long slice) {
    int rank = dist_rank(), world = dist_world_size();
    double mine[4] = {0, -1, 0, 0};  // wrong elements, first wrong index, its value, the right value
    for (long k = 0; k < count; k++) {
        double right = expected(c, rank, world, slice, k);
        if ((double)result[k] == right) continue;
        if (mine[0]++ == 0) mine[1] = (double)k, mine[2] = result[k], mine[3] = right;
    }
    double *all = xmalloc((size_t)world * sizeof mine);
    CHECK_MPI(MPI_Allgather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, MPI_COMM_WORLD));
    long wrong = 0;
    int first = -1;
    for (int r = 0; r < world; r++) {
        wrong += (long)all[4 * r];
        if (first < 0 && all[4 * r] > 0) first = r;
    }
    if (rank == 0 && first >= 0) {
        const double *v = all + 4 * first;
        fflush(stdout);
        fprintf(stderr, "%s: rank %d holds %g at element %ld where %g belongs (%ld wrong element%s over all ranks)\n",
                ABOUT[c].name, first, v[2], (long)v[1], v[3], wrong, wrong == 1 ? "" : "s");
        fflush(stderr);
    }
    free(all);
    return wrong;
}

// ---------------------------------------------------------------- the two modes

// "10 11 12 13", each number right-aligned in `width` characters; "-" for none.
static void format_values(char *text, size_t size, const float *values, long count, int width) {
    int len = snprintf(text, size, "%s", count ? "" : "-");
    for (long i = 0; i < count && len < (int)size; i++)
        len += snprintf(text + len, size - len, "%s%*g", i ? " " : "", width, values[i]);
}

// Each collective on one value per rank and slice: every rank formats its line,
// rank 0 gathers them and prints them in rank order.
static long demo(Buffers *b, const Plant *plant) {
    int rank = dist_rank(), world = dist_world_size();
    long slice = 1, n = world, wrong = 0;
    char widest[32];
    int width = snprintf(widest, sizeof widest, "%g", sum_over_ranks(9, world));  // the largest value of all
    size_t line_size = 64 + 2 * (size_t)n * (width + 1);
    char *line = xmalloc(line_size), *before = xmalloc(line_size), *after = xmalloc(line_size);
    char *lines = rank == 0 ? xmalloc(line_size * world) : NULL;
    for (Collective c = 0; c < COLLECTIVES; c++) {
        fill(c, b, n);
        // Before: what the rank sends; for broadcast, the one buffer it will overwrite.
        Span send = c == BROADCAST ? (Span){0, n} : sent(c, rank, world, slice);
        format_values(before, line_size, (c == BROADCAST ? b->host_out : b->host_in) + send.first, send.count, width);
        run(c, b, (int)slice);
        long count = result_count(c, rank, world, slice);
        result_to_host(b, count);
        if (plant->on && plant->c == c && plant->rank == rank) b->host_out[plant->index] += 1;
        format_values(after, line_size, b->host_out, count, width);
        snprintf(line, line_size, "  [rank %d] before %-*s  after %s", rank, (int)(n * (width + 1) - 1), before, after);
        CHECK_MPI(MPI_Gather(line, (int)line_size, MPI_CHAR, lines, (int)line_size, MPI_CHAR, 0, MPI_COMM_WORLD));
        print0("\n%s: %s (%s)\n", ABOUT[c].name, ABOUT[c].does, ABOUT[c].calls);
        print0("  in training: %s\n", ABOUT[c].training);
        for (int r = 0; rank == 0 && r < world; r++) {
            printf("%s\n", lines + r * line_size);
            fflush(stdout);  // whole lines: an error line on stderr never lands inside one
        }
        wrong += verify(c, b->host_out, count, slice);
    }
    free(line), free(before), free(after), free(lines);
    print0("\n%s\n", wrong == 0 ? "every result verified on every rank" : "FAILED: wrong results (see above)");
    return wrong;
}

// Each collective on n floats: one run verified element by element, then
// `iterations` timed back to back; a table in nccl-tests' terms.
static long benchmark(Buffers *b, long slice, int iterations, const Plant *plant) {
    int rank = dist_rank(), world = dist_world_size();
    long n = slice * world, wrong = 0;
    double bytes = (double)n * sizeof(float);
    print0("%-15s %12s %12s %13s %13s %7s %6s\n", "collective", "size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
           "factor", "wrong");
    for (Collective c = 0; c < COLLECTIVES; c++) {
        fill(c, b, n);
        run(c, b, (int)slice);  // the first run sets up connections: it is verified, not timed
        long count = result_count(c, rank, world, slice);
        result_to_host(b, count);
        if (plant->on && plant->c == c && plant->rank == rank) b->host_out[plant->index] += 1;
        long wrong_here = verify(c, b->host_out, count, slice);
        wrong += wrong_here;

        dist_barrier();
        double start = wall_seconds();
        for (int it = 0; it < iterations; it++) run(c, b, (int)slice);
        wait_for_gpu(b);
        double seconds = (wall_seconds() - start) / iterations;
        // The slowest rank's mean: a collective is done when its last rank is.
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        double algbw = bytes / seconds / 1e9, factor = bus_factor(c, world);
        print0("%-15s %12.0f %12.2f %13.3f %13.3f %7.3f %6ld\n", ABOUT[c].name, bytes, seconds * 1e6, algbw,
               algbw * factor, factor, wrong_here);
    }
    if (world == 1) print0("(one rank: nothing crosses a link, and the times are those of local copies)\n");
    print0("%s\n", wrong == 0 ? "every element of every collective verified on every rank"
                              : "FAILED: wrong elements (see above)");
    return wrong;
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    int count = 0, iterations = 10;
    const char *device = "cpu";
    ArgSpec flags[] = {
        {"count", ARG_INT, &count, "N", "floats in every rank's buffers: verify every element and time each collective (0: show each on a few values)", 0, NULL},
        {"iters", ARG_INT, &iterations, "N", "timed runs of each collective, after one verified run (--count only)", 1, NULL},
        {"device", ARG_STRING, &device, "DEV", "where the buffers live (cuda: NCCL when every rank has a GPU of its own)", 0, "cpu|cuda"},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 12: broadcast, reduce, allreduce, gather, allgather, scatter, "
               "reduce-scatter and all-to-all, shown on a few values or verified and timed (--count).");
    if (args_given("iters") && count == 0) usage_error("--iters times the collectives on --count N > 0 floats (got --count 0: the demo)");
    int world = dist_world_size();
    if (count > 0 && count < world)
        usage_error("--count %d: fewer floats than ranks (%d): a slice needs at least one", count, world);
    char message[160];
    snprintf(message, sizeof message, "step 12 runs on at most %d ranks (beyond, the sums it checks are not exact in float32)", MAX_RANKS);
    check_all_ranks(world <= MAX_RANKS, message);
    long slice = count > 0 ? count / world : 1, n = slice * world;  // n: count rounded down to whole slices
    snprintf(message, sizeof message, "--count %d: two buffers of %ld floats", count, n);
    dist_require_memory(2.0 * (double)n * sizeof(float), message);
    Plant plant = plant_from_environment(world, slice);

    // The buffers: on the CPU, or on this rank's GPU with host copies beside them.
    Buffers b = {0};
    bool through_mpi = true;  // false: NCCL moves the data
    char where[400] = "cpu, MPI";
    if (strcmp(device, "cuda") == 0) {
#if HAVE_CUDA
        int gpus = device_gpu_count();
        snprintf(where, sizeof where, "--device cuda: no CUDA device on %s (use --device cpu, or a GPU node)", dist_hostname());
        check_all_ranks(gpus > 0, where);
        int gpu = device_local_gpu();
        bool shared = device_gpus_shared(gpu);  // collective: the same answer on every rank
        CHECK_CUDA(cudaSetDevice(gpu));
        CHECK_CUDA(cudaStreamCreate(&b.stream));
        if (!shared) {  // a GPU per rank: NCCL, its id made by rank 0 and broadcast over MPI (step 1)
            ncclUniqueId id;
            if (dist_rank() == 0) CHECK_NCCL(ncclGetUniqueId(&id));
            CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
            CHECK_NCCL(ncclCommInitRank(&b.nccl, world, id, dist_rank()));
            through_mpi = false;
        }
        struct cudaDeviceProp prop;
        CHECK_CUDA(cudaGetDeviceProperties(&prop, gpu));
        int version = 0;
        CHECK_NCCL(ncclGetVersion(&version));
        if (shared)
            snprintf(where, sizeof where, "cuda:%d (%s); %d ranks share %d GPU%s on %s, which NCCL cannot do: MPI on host copies",
                     gpu, prop.name, dist_local_world_size(), gpus, gpus == 1 ? "" : "s", dist_hostname());
        else
            snprintf(where, sizeof where, "cuda:%d (%s) on rank 0, a GPU per rank, NCCL %d.%d.%d", gpu, prop.name,
                     version / 10000, version / 100 % 100, version % 100);
        b.gpu = true;
        CHECK_CUDA(cudaMalloc((void **)&b.in, n * sizeof(float)));
        CHECK_CUDA(cudaMalloc((void **)&b.out, n * sizeof(float)));
        CHECK_CUDA(cudaMallocHost((void **)&b.host_in, n * sizeof(float)));  // page-locked: faster copies
        CHECK_CUDA(cudaMallocHost((void **)&b.host_out, n * sizeof(float)));
#else
        usage_error("--device cuda: this build has no GPU code (built with CUDA=0 or without nvcc); use --device cpu");
#endif
    } else {
        b.in = b.host_in = xmalloc(n * sizeof(float));
        b.out = b.host_out = xmalloc(n * sizeof(float));
    }
    if (through_mpi) {
        char library[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        CHECK_MPI(MPI_Get_library_version(library, &len));
        library[strcspn(library, ",\n")] = '\0';  // "Open MPI v4.1.4"
        snprintf(where + strlen(where), sizeof where - strlen(where), " (%s)", library);
    }

    long wrong;
    if (count == 0) {
        print0("Step 12: the collectives on %d rank%s, %s; rank r holds 10 r + i at position i, so every number tells "
               "where it came from; a buffer holds %d value%s, a slice one\n", world, world == 1 ? "" : "s", where, world,
               world == 1 ? "" : "s");
        wrong = demo(&b, &plant);
    } else {
        print0("Step 12: the collectives on %d rank%s, %s; %ld floats (%.1f MB) per buffer%s, %ld per slice; "
               "each verified once, then timed over %d run%s (the slowest rank's mean)\n",
               world, world == 1 ? "" : "s", where, n, n * 4e-6, n == count ? "" : " (--count rounded down to whole slices)",
               slice, iterations, iterations == 1 ? "" : "s");
        wrong = benchmark(&b, slice, iterations, &plant);
    }

#if HAVE_CUDA
    if (b.gpu) {
        if (b.nccl) CHECK_NCCL(ncclCommDestroy(b.nccl));
        CHECK_CUDA(cudaStreamDestroy(b.stream));
        CHECK_CUDA(cudaFree(b.in));
        CHECK_CUDA(cudaFree(b.out));
        CHECK_CUDA(cudaFreeHost(b.host_in));
        CHECK_CUDA(cudaFreeHost(b.host_out));
    }
#endif
    if (!b.gpu) free(b.in), free(b.out);
    dist_finalize();
    return wrong == 0 ? 0 : 1;
}
