// philox.h: Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3" (SC '11), that PyTorch's and cuRAND's GPU generators use.
//
// A counter-based generator is a function, not a sequence: philox4x32_10(counter, key) gives four
// 32-bit numbers for any 128-bit counter under a 64-bit key, and value i of a stream is the same
// whichever thread, rank or device computes it, in any order. That is why GPUs draw with it: a
// dropout mask of 25 M values is 25 M independent evaluations, one per thread, with no state to
// pass along (mt19937, torch's CPU generator, is a sequence: one thread draws it, in order).
// Checked against the Random123 library's known answers (tests/unit/test_gpt.c).
//
// Header-only, and the same code in C on the CPU and in CUDA on a GPU (PHILOX_FUNCTION), so that
// both devices compute the same bits.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FUNCTION static inline __host__ __device__
#else
#define PHILOX_FUNCTION static inline
#endif

typedef struct {
    uint32_t v[4];
} Philox4x32;

PHILOX_FUNCTION Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
    for (int round = 0; round < 10; round++) {
        if (round > 0) key0 += 0x9E3779B9u, key1 += 0xBB67AE85u;  // the Weyl sequence's bump between rounds
        uint64_t product0 = (uint64_t)0xD2511F53u * counter.v[0], product1 = (uint64_t)0xCD9E8D57u * counter.v[2];
        Philox4x32 next = {{(uint32_t)(product1 >> 32) ^ counter.v[1] ^ key0, (uint32_t)product1,
                            (uint32_t)(product0 >> 32) ^ counter.v[3] ^ key1, (uint32_t)product0}};
        counter = next;
    }
    return counter;
}

// Dropout's keep test for one 32-bit number: its top 24 bits as a float uniform u in [0, 1) (exact:
// 24 bits fit a float's significand), kept when u < keep, where keep = 1 - p as a float. What a
// kept value is multiplied by is the caller's (1 / (1 - p)).
PHILOX_FUNCTION int philox_keeps(uint32_t bits, float keep) {
    return (float)(bits >> 8) * 0x1p-24f < keep;
}

// Evaluation `group` of a dropout mask (transformer_ops.h's dropout_philox_part), for its run of
// values first .. first + length - 1: Philox's four words for the counter (group, stream) under the
// key give mask values 4 group .. 4 group + 3, and those in the run go to run[value - first]: scale
// where philox_keeps, else 0. A run's evaluations are groups first / 4 .. (first + length - 1) / 4.
PHILOX_FUNCTION void philox_dropout_group(uint64_t group, uint32_t key0, uint32_t key1, uint64_t stream, float keep,
                                          float scale, uint64_t first, uint64_t length, float *run) {
    Philox4x32 counter = {{(uint32_t)group, (uint32_t)(group >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)}};
    Philox4x32 bits = philox4x32_10(counter, key0, key1);
    for (int j = 0; j < 4; j++) {
        uint64_t value = 4 * group + j;
        if (value >= first && value < first + length) run[value - first] = philox_keeps(bits.v[j], keep) ? scale : 0.0f;
    }
}

// The evaluations a run of `length` values takes at any alignment: (length + 3) / 4 + 1, the extra
// one writing nothing where the run starts on a group's first value.
PHILOX_FUNCTION uint64_t philox_run_evaluations(uint64_t length) { return (length + 3) / 4 + 1; }

// Evaluation i of dropout_philox_part's `runs` runs (i < runs philox_run_evaluations(length)): run
// r = i / philox_run_evaluations(length), its values first + r stride .. into mask + r length, and
// its evaluation i % that. The CPU's loop and the GPU's kernel both call it.
PHILOX_FUNCTION void philox_dropout_part_evaluation(uint64_t i, uint64_t runs, uint32_t key0, uint32_t key1,
                                                    uint64_t stream, float keep, float scale, uint64_t first,
                                                    uint64_t length, uint64_t stride, float *mask) {
    const uint64_t per_run = philox_run_evaluations(length);
    const uint64_t r = runs == 1 ? 0 : i / per_run, q = runs == 1 ? i : i % per_run;  // (a whole mask: no division)
    const uint64_t run_first = first + r * stride;
    philox_dropout_group(run_first / 4 + q, key0, key1, stream, keep, scale, run_first, length, mask + r * length);
}
