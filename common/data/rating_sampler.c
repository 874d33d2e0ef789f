// rating_sampler.c: the global batches of a shuffle, each rank its slice. See rating_sampler.h.
#include "data/rating_sampler.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/rng.h"
#include "runtime/dist.h"
#if HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tensor/kernels.h"  // gpu_gather_ints
#endif

typedef struct {
    int slot, user, item;
    float rating;
} Record;

// A GPU rank alone: the epoch's ratings are gathered on the GPU (rating_sampler.h).
static bool gathered_on_gpu(const RatingSampler *s) { return s->device == DEVICE_CUDA && s->world == 1; }

RatingSampler rating_sampler_new(int n_local, const int *user, const int *item, const float *rating, int batch_size,
                                 bool shuffle, uint64_t seed, Device device) {
    RatingSampler s = {.n_local = n_local, .user = user, .item = item, .rating = rating, .batch_size = batch_size,
                       .world = dist_world_size(), .rank = dist_rank(), .shuffle = shuffle, .seed = seed,
                       .device = HAVE_CUDA ? device : DEVICE_CPU};
    long n = n_local;
    CHECK_MPI(MPI_Exscan(&n, &s.first, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (s.rank == 0) s.first = 0;
    CHECK_MPI(MPI_Allreduce(&n, &s.n_total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    CHECK(s.n_total < 2147483647L, "%ld training ratings: this sampler counts them in ints", s.n_total);
    long global_batch = (long)batch_size * s.world;
    s.n_batches = (int)((s.n_total + global_batch - 1) / global_batch);
    // Its permutations go to the GPU from where they are drawn: page-locked memory.
    if (gathered_on_gpu(&s)) s.ahead.alloc = device_host_alloc, s.ahead.release = device_host_free;
    return s;
}

static double larger(double a, double b) { return a > b ? a : b; }

void rating_sampler_add_memory_need(const RatingSampler *s, MemoryNeed *need) {
    // A rank's slices hold batch_size samples a batch, the last one's fewer.
    double n = (double)s->n_total, local = s->n_local, mine = s->world == 1 ? n : (double)s->n_batches * s->batch_size;
    double rating = 3 * sizeof(int), index = sizeof(int), record = sizeof(Record);
    if (s->device == DEVICE_CUDA) {  // the epoch's ratings; alone and shuffled, all of them and the permutation too
        memory_need_add(need, "ratings", mine * rating + (gathered_on_gpu(s) && s->shuffle ? mine * (rating + index) : 0));
        return;
    }
    // The epoch's ratings, two permutations (the epoch's and the next, drawn ahead) and, across
    // ranks, set_epoch's exchange at its largest: each rating's position (n) with the owners and
    // slots of this rank's (12 bytes each), then those with the records sent, then the records
    // sent and received.
    double exchange = s->world == 1 ? 0 : larger(n * index + local * 12, larger(local * (12 + record), (local + mine) * record));
    memory_need_add(need, "ratings", mine * rating + (s->shuffle ? 2 * n * index : 0) + exchange);
}

// Where position p of the epoch goes: batch p / G, and in it the slice of the
// rank r with S r / W <= p - bG < S (r + 1) / W.
static long slice_start(long batch_n, int r, int world) { return batch_n * r / world; }

static int owner_of(const RatingSampler *s, long position, long *slot) {
    long global_batch = (long)s->batch_size * s->world;
    long b = position / global_batch, offset = position - b * global_batch;
    long batch_n = s->n_total - b * global_batch < global_batch ? s->n_total - b * global_batch : global_batch;
    int r = (int)(offset * s->world / batch_n);
    while (r + 1 < s->world && slice_start(batch_n, r + 1, s->world) <= offset) r++;
    while (r > 0 && slice_start(batch_n, r, s->world) > offset) r--;
    // Full batches give every rank batch_size samples: slices of batch b start at b x batch_size.
    *slot = b * s->batch_size + offset - slice_start(batch_n, r, s->world);
    return r;
}

// This epoch's arrays: kept from epoch to epoch (n_mine is the same every epoch: the batches'
// slices depend on the counts only). On a GPU rank the host's are page-locked.
static void epoch_arrays(RatingSampler *s) {
    if (s->capacity >= s->n_mine && s->epoch_user) return;
    if (s->device == DEVICE_CUDA) {
        device_synchronize();  // nothing queued may still read the arrays freed here
        device_host_free(s->epoch_user), device_host_free(s->epoch_item), device_host_free(s->epoch_rating);
        device_free(s->gpu_user), device_free(s->gpu_item), device_free(s->gpu_rating);
    } else {
        free(s->epoch_user), free(s->epoch_item), free(s->epoch_rating);
    }
    s->capacity = s->n_mine;
    size_t ints = (size_t)s->n_mine * sizeof(int) + 1, floats = (size_t)s->n_mine * sizeof(float) + 1;
    if (s->device == DEVICE_CUDA) {
        s->epoch_user = device_host_alloc(ints), s->epoch_item = device_host_alloc(ints);
        s->epoch_rating = device_host_alloc(floats);
        s->gpu_user = device_alloc(ints), s->gpu_item = device_alloc(ints), s->gpu_rating = device_alloc(floats);
    } else {
        s->epoch_user = xmalloc(ints), s->epoch_item = xmalloc(ints), s->epoch_rating = xmalloc(floats);
    }
}

#if HAVE_CUDA
// The event after an epoch's copies: what they read on the host may be written again once it is done.
static void record_copied(RatingSampler *s) {
    if (!s->copied) {
        cudaEvent_t copied;
        CHECK_CUDA(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
        s->copied = copied;
    }
    CHECK_CUDA(cudaEventRecord((cudaEvent_t)s->copied, device_stream()));
}
#endif

// The epoch's arrays on the GPU, from page-locked memory: queued, no wait.
static void upload_epoch(RatingSampler *s) {
#if HAVE_CUDA
    if (s->device == DEVICE_CUDA && s->n_mine > 0) {
        cudaStream_t stream = device_stream();
        CHECK_CUDA(cudaMemcpyAsync(s->gpu_user, s->epoch_user, (size_t)s->n_mine * sizeof(int), cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(s->gpu_item, s->epoch_item, (size_t)s->n_mine * sizeof(int), cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(s->gpu_rating, s->epoch_rating, (size_t)s->n_mine * sizeof(float), cudaMemcpyHostToDevice,
                                   stream));
        record_copied(s);
    }
#else
    (void)s;
#endif
}

#if HAVE_CUDA
// A GPU rank alone: the training ratings go to the GPU once (from the arrays as read: their first
// epoch), then each epoch its permutation (page-locked: queued, no wait), through which a kernel
// gathers the epoch's ratings there. Gathered on the host, they were 12 bytes a rating read from
// three scattered places (~40 ms at 4.5 M ratings on one core) and 12 bytes a rating copied over,
// at the epoch's start, where the GPU has nothing queued; now 4 bytes a rating go over.
static void gather_on_gpu(RatingSampler *s, const int *perm) {
    cudaStream_t stream = device_stream();
    size_t n = (size_t)s->n_total, ints = n * sizeof(int) + 1, floats = n * sizeof(float) + 1;
    if (!s->gpu_user) {
        s->gpu_user = device_alloc(ints), s->gpu_item = device_alloc(ints), s->gpu_rating = device_alloc(floats);
        if (perm) {
            s->gpu_all_user = device_alloc(ints), s->gpu_all_item = device_alloc(ints);
            s->gpu_all_rating = device_alloc(floats), s->gpu_perm = device_alloc(ints);
        }
        // Unshuffled, the epoch's ratings are the ratings as read, every epoch. (From pageable
        // memory a copy waits for the stream first, inside the driver: device_alloc's polled
        // wait has just emptied it.)
        CHECK_CUDA(cudaMemcpyAsync(perm ? s->gpu_all_user : s->gpu_user, s->user, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(perm ? s->gpu_all_item : s->gpu_item, s->item, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(perm ? s->gpu_all_rating : s->gpu_rating, s->rating, n * sizeof(float),
                                   cudaMemcpyHostToDevice, stream));
    }
    if (perm) {
        CHECK_CUDA(cudaMemcpyAsync(s->gpu_perm, perm, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        gpu_gather_ints(s->gpu_all_user, s->gpu_perm, (int)n, s->gpu_user, stream);
        gpu_gather_ints(s->gpu_all_item, s->gpu_perm, (int)n, s->gpu_item, stream);
        gpu_gather_ints((const int *)s->gpu_all_rating, s->gpu_perm, (int)n, (int *)s->gpu_rating, stream);  // (4 bytes each)
    }
    record_copied(s);
}
#endif

void rating_sampler_set_epoch(RatingSampler *s, int epoch) {
    int world = s->world;
    long n = s->n_total;
#if HAVE_CUDA
    // The last epoch's copies read the host arrays and the permutation written again below: done
    // (long done, a whole epoch since).
    if (s->copied) device_wait_event((cudaEvent_t)s->copied, "the copy of the epoch's ratings");
#endif
    int *perm = NULL;  // perm[p]: the training rating at position p this epoch (NULL: no shuffle, rating p)
    if (s->shuffle) {  // as DistributedSampler: a new order every epoch, randperm seeded seed + epoch (drawn ahead)
        if (!s->perm) s->perm = perm_ahead_alloc(&s->ahead, (int)n);  // (the draws' allocator: they swap)
        perm_ahead_take(&s->ahead, s->seed + (uint64_t)epoch, (int)n, &s->perm, s->seed + (uint64_t)epoch + 1);
        perm = s->perm;
    }
    if (world == 1) {  // every rating stays, at its position (owner_of's slot is the position itself)
        s->n_mine = n;
#if HAVE_CUDA
        if (gathered_on_gpu(s)) {
            gather_on_gpu(s, perm);
            return;
        }
#endif
        epoch_arrays(s);
#pragma omp parallel for schedule(static)
        for (long p = 0; p < n; p++) {
            long t = perm ? perm[p] : p;
            s->epoch_user[p] = s->user[t], s->epoch_item[p] = s->item[t], s->epoch_rating[p] = s->rating[t];
        }
        upload_epoch(s);
        return;
    }
    int *position = xmalloc((size_t)n * sizeof(int) + 1);  // position[t]: where training rating t comes this epoch
    for (long p = 0; p < n; p++) position[perm ? perm[p] : p] = (int)p;
    int *send_count = xcalloc((size_t)world, sizeof(int)), *receive_count = xcalloc((size_t)world, sizeof(int));
    int *send_offset = xcalloc((size_t)world + 1, sizeof(int)), *receive_offset = xcalloc((size_t)world + 1, sizeof(int));
    int *owner = xmalloc((size_t)s->n_local * sizeof(int) + 1);
    long *slot = xmalloc((size_t)s->n_local * sizeof(long) + 1);
    for (int k = 0; k < s->n_local; k++) {
        owner[k] = owner_of(s, position[s->first + k], &slot[k]);
        send_count[owner[k]]++;
    }
    free(position);
    for (int r = 0; r < world; r++) send_offset[r + 1] = send_offset[r] + send_count[r];
    Record *send = xmalloc((size_t)s->n_local * sizeof(Record) + 1);
    int *fill = xmalloc((size_t)world * sizeof(int));
    memcpy(fill, send_offset, (size_t)world * sizeof(int));
    for (int k = 0; k < s->n_local; k++)
        send[fill[owner[k]]++] = (Record){.slot = (int)slot[k], .user = s->user[k], .item = s->item[k], .rating = s->rating[k]};
    free(fill);
    free(owner);
    free(slot);
    CHECK_MPI(MPI_Alltoall(send_count, 1, MPI_INT, receive_count, 1, MPI_INT, MPI_COMM_WORLD));
    for (int r = 0; r < world; r++) receive_offset[r + 1] = receive_offset[r] + receive_count[r];
    s->n_mine = receive_offset[world];
    Record *received = xmalloc((size_t)s->n_mine * sizeof(Record) + 1);
    MPI_Datatype record;
    CHECK_MPI(MPI_Type_contiguous(4, MPI_INT, &record));  // (a float travels as its 4 bytes)
    CHECK_MPI(MPI_Type_commit(&record));
    CHECK_MPI(MPI_Alltoallv(send, send_count, send_offset, record, received, receive_count, receive_offset, record,
                            MPI_COMM_WORLD));
    MPI_Type_free(&record);
    free(send);
    epoch_arrays(s);
    for (long k = 0; k < s->n_mine; k++) {
        Record *rec = &received[k];
        CHECK(rec->slot >= 0 && rec->slot < s->n_mine, "sampler: slot %d outside 0..%ld", rec->slot, s->n_mine);
        s->epoch_user[rec->slot] = rec->user;
        s->epoch_item[rec->slot] = rec->item;
        s->epoch_rating[rec->slot] = rec->rating;
    }
    free(received);
    upload_epoch(s);
    free(send_count);
    free(receive_count);
    free(send_offset);
    free(receive_offset);
}

RatingBatch rating_sampler_batch(const RatingSampler *s, int b) {
    long global_batch = (long)s->batch_size * s->world, start = (long)b * global_batch;
    long batch_n = s->n_total - start < global_batch ? s->n_total - start : global_batch;
    long first = slice_start(batch_n, s->rank, s->world), end = slice_start(batch_n, s->rank + 1, s->world);
    long at = (long)b * s->batch_size;
    // A rank's slice holds at most batch_size samples (a full batch's, exactly).
    RatingBatch batch = {.n = (int)(end - first), .global_n = batch_n, .max_n = s->batch_size};
    if (s->epoch_user) batch.user = s->epoch_user + at, batch.item = s->epoch_item + at, batch.rating = s->epoch_rating + at;
    if (s->device == DEVICE_CUDA) {
        batch.gpu_user = s->gpu_user + at, batch.gpu_item = s->gpu_item + at, batch.gpu_rating = s->gpu_rating + at;
        batch.following = s->n_batches - 1 - b;  // (slices of batch b start at b x batch_size: owner_of)
    }
    return batch;
}

void rating_sampler_free(RatingSampler *s) {
    if (s->device == DEVICE_CUDA) device_synchronize();  // nothing queued may still read what is freed here
    perm_ahead_free(&s->ahead);
    perm_ahead_release(&s->ahead, s->perm);
    if (s->device == DEVICE_CUDA) {
        device_host_free(s->epoch_user), device_host_free(s->epoch_item), device_host_free(s->epoch_rating);
        device_free(s->gpu_user), device_free(s->gpu_item), device_free(s->gpu_rating);
        device_free(s->gpu_all_user), device_free(s->gpu_all_item), device_free(s->gpu_all_rating), device_free(s->gpu_perm);
#if HAVE_CUDA
        if (s->copied) CHECK_CUDA(cudaEventDestroy((cudaEvent_t)s->copied));
#endif
        return;
    }
    free(s->epoch_user);
    free(s->epoch_item);
    free(s->epoch_rating);
}
