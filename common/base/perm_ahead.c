// perm_ahead.c: the next epoch's shuffle on a thread of its own. See perm_ahead.h.
#include "base/perm_ahead.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/check.h"
#include "base/rng.h"

struct PermDraw {
    pthread_t thread;
    uint64_t seed;
    int n;
    int *perm;  // [n]: the thread's alone until it is joined
};

static void *draw_perm(void *argument) {
    struct PermDraw *draw = argument;
    Rng rng;
    rng_seed(&rng, draw->seed);
    rng_randperm(&rng, draw->n, draw->perm);
    return NULL;
}

int *perm_ahead_alloc(const PermAhead *ahead, int n) {
    size_t bytes = (size_t)n * sizeof(int) + 1;
    return ahead->alloc ? ahead->alloc(bytes) : xmalloc(bytes);
}

void perm_ahead_release(const PermAhead *ahead, int *perm) {
    if (ahead->release) ahead->release(perm);
    else free(perm);
}

// Joins the draw ahead and gives it back (NULL: none).
static struct PermDraw *join(PermAhead *ahead) {
    struct PermDraw *draw = ahead->draw;
    ahead->draw = NULL;
    if (draw) CHECK(pthread_join(draw->thread, NULL) == 0, "perm_ahead: joining the shuffle's thread failed");
    return draw;
}

void perm_ahead_take(PermAhead *ahead, uint64_t seed, int n, int **perm, uint64_t next_seed) {
    struct PermDraw *draw = join(ahead);
    if (draw && draw->seed == seed && draw->n == n) {
        int *mine = *perm;  // the caller's buffer becomes the next draw's
        *perm = draw->perm;
        draw->perm = mine;
    } else {
        Rng rng;
        rng_seed(&rng, seed);
        rng_randperm(&rng, n, *perm);
        if (draw && draw->n != n) {
            perm_ahead_release(ahead, draw->perm);
            draw->perm = NULL;
        }
    }
    if (!draw) draw = xcalloc(1, sizeof *draw);
    if (!draw->perm) draw->perm = perm_ahead_alloc(ahead, n);
    draw->seed = next_seed, draw->n = n;
    if (pthread_create(&draw->thread, NULL, draw_perm, draw) == 0) {
        ahead->draw = draw;
    } else {  // no thread to be had: the next call draws its permutation itself
        perm_ahead_release(ahead, draw->perm);
        free(draw);
    }
}

void perm_ahead_free(PermAhead *ahead) {
    struct PermDraw *draw = join(ahead);
    if (draw) perm_ahead_release(ahead, draw->perm);
    free(draw);
}
