// rng.c: mt19937 and the two transforms of torch's CPU generator we need.
#include "base/rng.h"

#include <math.h>

void rng_seed(Rng *rng, uint64_t seed) {
    // torch seeds mt19937 with the low 32 bits (the standard init_genrand).
    rng->state[0] = (uint32_t)seed;
    for (int i = 1; i < 624; i++) {
        uint32_t prev = rng->state[i - 1];
        rng->state[i] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)i;
    }
    rng->next = 624;
}

static void rng_twist(Rng *rng) {
    uint32_t *s = rng->state;
    for (int i = 0; i < 624; i++) {
        uint32_t y = (s[i] & 0x80000000u) | (s[(i + 1) % 624] & 0x7fffffffu);
        s[i] = s[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    rng->next = 0;
}

uint32_t rng_next_u32(Rng *rng) {
    if (rng->next >= 624) rng_twist(rng);
    uint32_t y = rng->state[rng->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

float rng_uniform(Rng *rng, float low, float high) {
    // at::uniform_real_distribution<float>: 24 random bits -> [0, 1), then scaled
    // in double (the CPU accumulate type of float) and rounded once to float.
    float unit = (float)(rng_next_u32(rng) & ((1u << 24) - 1)) * (1.0f / (1u << 24));
    return (float)((double)unit * ((double)high - (double)low) + (double)low);
}

float rng_normal(Rng *rng) {
    // 1 - u keeps the logarithm's argument in (0, 1].
    double u1 = 1.0 - (rng_next_u32(rng) + 0.5) / 4294967296.0, u2 = (rng_next_u32(rng) + 0.5) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void rng_randperm(Rng *rng, int n, int *perm) {
    // randperm_cpu: forward Fisher-Yates with `random() % (n - i)`.
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = 0; i + 1 < n; i++) {
        int z = (int)(rng_next_u32(rng) % (uint32_t)(n - i));
        int saved = perm[i];
        perm[i] = perm[i + z];
        perm[i + z] = saved;
    }
}
