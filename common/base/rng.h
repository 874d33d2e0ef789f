// rng.h: PyTorch's CPU random generator, bit for bit.
//
// torch.Generator on the CPU is a 32-bit Mersenne Twister (mt19937). We use the
// same engine and the same transforms, so that
//   rng_seed(s); rng_randperm(n)   == torch.randperm(n, generator=torch.Generator().manual_seed(s))
//   rng_seed(s); rng_uniform(a, b) == torch.empty(k).uniform_(a, b) after torch.manual_seed(s)
// This gives the sampler the exact data order of torch's DistributedSampler,
// which makes our runs directly comparable with the PyTorch reference.
#pragma once
#include <stdint.h>

typedef struct {
    uint32_t state[624];
    int next;
} Rng;

void rng_seed(Rng *rng, uint64_t seed);
uint32_t rng_next_u32(Rng *rng);

// A float uniform in [low, high), drawn like torch's uniform_() on float32.
float rng_uniform(Rng *rng, float low, float high);

// A standard normal draw (Box-Muller on two uniforms). Not torch.randn's stream:
// only the distribution is the same.
float rng_normal(Rng *rng);

// perm[0..n) := a random permutation of 0..n-1, drawn like torch.randperm(n).
void rng_randperm(Rng *rng, int n, int *perm);
