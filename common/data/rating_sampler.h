// rating_sampler.h: step 15's batches. Every epoch, the global batches of a
// seeded shuffle of all the training ratings, each rank given its slice of
// each, whichever rank read the rating.
//
//   RatingSampler s = rating_sampler_new(n_local, user, item, rating, batch_size, shuffle, seed, device);
//   rating_sampler_set_epoch(&s, epoch);     // collective: the ratings move to the ranks that train on them
//   for (int b = 0; b < s.n_batches; b++) {
//       RatingBatch batch = rating_sampler_batch(&s, b);   // this rank's slice of global batch b
//
// The order is torch's: perm = torch.randperm(N, generator seeded seed + epoch)
// (common/base/rng.h), global batch b = perm[bG, (b + 1)G), G = W x batch_size (the
// last one shorter). Rank r trains on positions [S r / W, S (r + 1) / W) of a
// batch of S: a contiguous slice, so that its per-row gradient sums follow
// the batch's order (mf.h). The global batches are the same on any number of
// ranks with the same G, so 1 rank at batch 1024 and 4 ranks at batch 256
// take the same steps. Each rank read its own byte range of the file, so the
// ratings a rank trains on this epoch are mostly elsewhere: they travel by
// one all-to-all per epoch (16 bytes a rating), and the perm (4 bytes a
// training rating) is drawn on every rank.
//
// On a GPU rank the epoch's ratings (the slices of all its batches) go to the GPU once an epoch,
// from page-locked memory, and each batch points into them there too: a step uploads nothing
// (docs/gpus.md, "No host wait inside a training step"). On one GPU rank alone (world size 1),
// the training ratings go to the GPU once, and each epoch only its permutation follows them (4
// bytes a rating, drawn ahead into page-locked memory): a kernel gathers the epoch's ratings
// there, and the host holds no copy of them.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "base/perm_ahead.h"  // PermAhead
#include "runtime/device.h"
#include "runtime/memory_budget.h"

typedef struct {
    long n_total;             // training ratings, all ranks
    long first;               // the global index of this rank's first (its ratings in file order)
    int n_local;
    const int *user, *item;   // [n_local]: this rank's training ratings, as read
    const float *rating;
    int batch_size, world, rank;
    bool shuffle;
    uint64_t seed;
    int *perm;                // [n_total]: the epoch's permutation (shuffle; page-locked where it goes to a GPU)
    PermAhead ahead;          // the next epoch's, drawn on a thread while this one trains
    // This epoch: this rank's slices of every global batch, one after the other (NULL on a GPU rank
    // alone: there they are on the GPU only).
    int n_batches;
    long n_mine;
    int *epoch_user, *epoch_item;
    float *epoch_rating;
    // On a GPU rank: the host arrays above are page-locked, and these are their device copies.
    Device device;
    long capacity;                         // ratings the arrays hold room for
    int *gpu_user, *gpu_item;
    float *gpu_rating;
    // On a GPU rank alone, shuffling: the training ratings as read, and the epoch's permutation.
    int *gpu_all_user, *gpu_all_item, *gpu_perm;
    float *gpu_all_rating;
    void *copied;  // the copies' event (cudaEvent_t): what they read on the host (arrays, perm) is free again
} RatingSampler;

typedef struct {
    const int *user, *item;  // on the host (NULL on a GPU rank alone: the GPU's below)
    const float *rating;
    int n;            // this rank's samples (may be 0 in a short last batch)
    long global_n;    // the global batch's
    int max_n;        // the most samples of any rank's slice of any batch: the same on every rank
    const int *gpu_user, *gpu_item;  // on a GPU rank, the same samples on the GPU (else NULL)
    const float *gpu_rating;
    // The batches after this one in its epoch, whose slices follow this one's max_n apart on the
    // GPU (0 where none is known): a GPU model queues their steps' inputs at once (mf.h).
    int following;
} RatingBatch;

// Collective. The arrays are borrowed: they must outlive the sampler.
RatingSampler rating_sampler_new(int n_local, const int *user, const int *item, const float *rating, int batch_size,
                                 bool shuffle, uint64_t seed, Device device);
void rating_sampler_set_epoch(RatingSampler *s, int epoch);
// What its epochs will hold on this rank's device (the epoch's ratings, the permutation), added to
// `need` before the first set_epoch allocates it.
void rating_sampler_add_memory_need(const RatingSampler *s, MemoryNeed *need);
RatingBatch rating_sampler_batch(const RatingSampler *s, int b);
void rating_sampler_free(RatingSampler *s);
