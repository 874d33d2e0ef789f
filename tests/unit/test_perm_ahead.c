// test_perm_ahead.c: common/base/perm_ahead.c, the next epoch's shuffle drawn on a thread.
//
// - each epoch's permutation is rng_randperm's for its seed, whether the thread drew it ahead (the
//   next seed, as the samplers ask) or the call drew it itself (a seed or a size not drawn ahead);
// - the caller's buffer and the thread's swap: the permutation handed over is the thread's, and the
//   caller's goes to the next draw, never read by both at once;
// - the buffers come from the PermAhead's allocator where it names one (page-locked memory, for a
//   GPU rank's step 15), and every one goes back to it: a size change and perm_ahead_free release
//   them, none twice, none left.
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/perm_ahead.h"
#include "base/rng.h"

#define TEST_NAME "test_perm_ahead"
#include "test.h"

enum { MAX_BUFFERS = 16 };
static void *live[MAX_BUFFERS];  // the buffers the allocator below has given and not had back
static int allocated, released, unknown_released;

static void *counted_alloc(size_t bytes) {
    void *buffer = malloc(bytes);
    for (int i = 0; i < MAX_BUFFERS; i++)
        if (!live[i]) {
            live[i] = buffer;
            break;
        }
    allocated++;
    return buffer;
}

static void counted_release(void *buffer) {
    if (!buffer) return;
    bool known = false;
    for (int i = 0; i < MAX_BUFFERS; i++)
        if (live[i] == buffer) live[i] = NULL, known = true;
    unknown_released += !known;
    released++;
    free(buffer);
}

static bool is_randperm(const int *perm, int n, uint64_t seed) {
    int *want = malloc((size_t)n * sizeof(int) + 1);
    Rng rng;
    rng_seed(&rng, seed);
    rng_randperm(&rng, n, want);
    bool same = memcmp(perm, want, (size_t)n * sizeof(int)) == 0;
    free(want);
    return same;
}

// Epochs first .. first + epochs - 1 taken in turn, as a sampler's set_epoch takes them.
static bool epochs_match(PermAhead *ahead, int **perm, int n, uint64_t seed, int first, int epochs) {
    bool all = true;
    for (int e = first; e < first + epochs; e++) {
        perm_ahead_take(ahead, seed + (uint64_t)e, n, perm, seed + (uint64_t)e + 1);
        all &= is_randperm(*perm, n, seed + (uint64_t)e);
    }
    return all;
}

int main(void) {
    enum { N = 60000, SMALL = 1000 };
    const uint64_t seed = 42;

    // malloc's buffers (no allocator named), as MNIST's sampler uses it.
    PermAhead plain = {0};
    int *order = malloc((size_t)N * sizeof(int));
    EXPECT(epochs_match(&plain, &order, N, seed, 0, 4), "epochs 0-3 of %d are rng_randperm's, each drawn ahead but the first", N);
    int *before = order;
    perm_ahead_take(&plain, seed + 4, N, &order, seed + 5);
    EXPECT(order != before && is_randperm(order, N, seed + 4),
           "an epoch drawn ahead is handed over in the thread's buffer (the caller's goes to the next draw)");
    perm_ahead_take(&plain, seed + 9, N, &order, seed + 10);
    EXPECT(is_randperm(order, N, seed + 9), "a seed not drawn ahead (epoch 9 after 4: a resumed run) is drawn by the call");
    perm_ahead_free(&plain);
    free(order);

    // A named allocator: every buffer from it, every one back.
    PermAhead counted = {.alloc = counted_alloc, .release = counted_release};
    int *perm = perm_ahead_alloc(&counted, N);  // the caller's buffer, from the same allocator
    EXPECT(epochs_match(&counted, &perm, N, seed, 0, 3), "with an allocator named: epochs 0-2 of %d are rng_randperm's", N);
    EXPECT(allocated == 2 && released == 0, "two buffers in use, the caller's (perm_ahead_alloc) and the thread's, both from the allocator "
                                            "(allocated %d, released %d)", allocated, released);
    EXPECT(epochs_match(&counted, &perm, SMALL, seed, 3, 2), "a new size (%d): its epochs are rng_randperm's too", SMALL);
    EXPECT(allocated == 3 && released == 1, "the size's change released the draw ahead's buffer of the old size and "
                                            "allocated one of the new (allocated %d, released %d)", allocated, released);
    perm_ahead_free(&counted);
    perm_ahead_release(&counted, perm);
    int left = 0;
    for (int i = 0; i < MAX_BUFFERS; i++) left += live[i] != NULL;
    EXPECT(allocated == released && left == 0 && unknown_released == 0,
           "after perm_ahead_free and the caller's release, every buffer is back, none twice, none foreign "
           "(allocated %d, released %d, left %d, foreign %d)", allocated, released, left, unknown_released);
    return test_summary();
}
