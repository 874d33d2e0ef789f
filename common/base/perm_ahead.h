// perm_ahead.h: the next epoch's shuffle, drawn on a thread of its own while this epoch trains.
//
// A sampler's set_epoch draws torch.randperm(N) for the epoch (rng.h: one Mersenne Twister, a
// serial chain). On a GPU rank that draw used to fall where the GPU has nothing queued: the host
// read the epoch's losses (the GPU done), then shuffled, then queued the next epoch's first step.
// PermAhead draws epoch e + 1's permutation on a thread while epoch e trains, and set_epoch(e + 1)
// takes it (MNIST's 60,000: ~0.3 ms; step 15's 4.5 M ratings: ~45 ms). The same permutation as
// rng_randperm's, whichever thread drew it: nothing else reads or writes the thread's buffer until
// it is joined.
//
//   PermAhead ahead = {0};
//   perm_ahead_take(&ahead, seed + epoch, n, &order, seed + epoch + 1);  // order: n ints, malloc'd
//   ...
//   perm_ahead_free(&ahead);                                            // joins a draw still going
//
// The buffers swap between the caller and the thread, so they come from one allocator: malloc, or
// the one the PermAhead names (a GPU rank's step 15 draws into page-locked memory, from which its
// epoch's permutation goes to the GPU without a wait: rating_sampler.c).
//
// Layers: base (rng), and POSIX threads.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    struct PermDraw *draw;  // the draw ahead, running or done (NULL: none)
    // Where the buffers come from and go back to (NULL: malloc and free), called on the caller's thread.
    void *(*alloc)(size_t bytes);
    void (*release)(void *buffer);
} PermAhead;

// *perm (n ints, from the PermAhead's allocator) := rng_randperm(n) of a generator seeded `seed`: the one drawn ahead where
// it was for (seed, n) (the buffers swap: *perm may point elsewhere after), drawn here otherwise.
// Then the draw for (next_seed, n) starts on a thread (where no thread can start, the next call
// draws it itself).
void perm_ahead_take(PermAhead *ahead, uint64_t seed, int n, int **perm, uint64_t next_seed);
void perm_ahead_free(PermAhead *ahead);
// A buffer of n ints from the PermAhead's allocator, and one given back to it: the caller's *perm.
int *perm_ahead_alloc(const PermAhead *ahead, int n);
void perm_ahead_release(const PermAhead *ahead, int *perm);
