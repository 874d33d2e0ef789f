// test_ddp.c: common/ddp*.c under mpirun, at any world size W
// (tests/test_mpi_units.sh runs it on 1, 2 and 4 ranks).
//
// What DDP promises, each verdict the AND over all ranks, printed by rank 0:
//   wrap      every rank starts from rank 0's parameters, whatever its own seed;
//   buckets   contiguous ranges in reverse parameter order, each closed as soon
//             as it reaches the cap (bucket_mb <= 0: one tensor per bucket);
//   mean      after the hooks and ddp_finish, every gradient is the mean over
//             ranks. Synthetic gradients are small integers (times (r + 1)), so
//             the sum over ranks and the division by W are exact and the mean
//             is known in closed form: we demand bit equality. A real backward
//             is compared with a manual MPI_Allreduce, to rounding (the two may
//             sum in different orders), and must be bit-identical across ranks;
//   steps     20 steps in a row on one Ddp, each exact: the per-step reset;
//   no_sync   no communication at all, then the mean of the accumulated sum;
//   overlap   sane statistics; ddp_free joins the thread; a second wrap works.
// Both progress paths are run: the communication thread (when the MPI has
// MPI_THREAD_MULTIPLE) and, by clearing use_thread before the first hook,
// the between-layers fallback that ddp_mpi.c uses without it.
#define TEST_NAME "test_ddp"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/ddp.h"
#include "runtime/dist.h"
#include "test_mpi.h"

static int rank, world;
static char on_ranks[32];  // "on 4 ranks", for the messages

static long sum_ranks(long v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return v;
}
static double max_ranks(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}

static const int SMALL[] = {6, 5, 4, 3};  // params of 30, 5, 20, 4, 12, 3 floats
#define MIB (1024.0 * 1024.0)
#define CAP_60_BYTES (60 / MIB)           // 15 floats: buckets {3,12} {4,20} {5,30}
static const double CAPS[] = {25.0, 0.0, CAP_60_BYTES};
#define N_CAPS 3

// ------------------------------------------------------------------ synthetic gradients

// Rank r's gradient for element k of parameter i at step s, and its mean over
// ranks, (W + 1) / 2 * pattern + s: exact in float for any small W.
static float pattern(int i, size_t k, int step) { return (float)(1 + (k + 3 * (size_t)i + (size_t)step) % 7); }
static float local_grad(int i, size_t k, int step) { return (float)(rank + 1) * pattern(i, k, step) + (float)step; }
static float mean_grad(int i, size_t k, int step) { return 0.5f * (float)(world + 1) * pattern(i, k, step) + (float)step; }

static void set_grads(Param *p, int n, int step) {
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < tensor_numel(p[i].grad); k++) p[i].grad->data[k] = local_grad(i, k, step);
}

// Elements of this rank's gradients that are not exactly expected(i, k, step).
static long count_wrong(const Param *p, int n, float (*expected)(int, size_t, int), int step) {
    long wrong = 0;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < tensor_numel(p[i].grad); k++) wrong += p[i].grad->data[k] != expected(i, k, step);
    return wrong;
}

// What mlp_backward does to DDP: the hook for every parameter, last first. A
// short rank- and step-dependent pause now and then shifts when buckets
// complete relative to the hooks and to ddp_finish.
static void fake_backward(Ddp *ddp, int step) {
    for (int i = ddp->n_params - 1; i >= 0; i--) {
        if ((i + step + rank) % 3 == 0) nanosleep(&(struct timespec){.tv_nsec = 30000}, NULL);
        ddp_grad_ready(ddp, i);
    }
}

// One synchronised step; returns how many elements on this rank miss the mean.
static long sync_step(Ddp *ddp, int step) {
    set_grads(ddp->params, ddp->n_params, step);
    fake_backward(ddp, step);
    ddp_finish(ddp);
    return count_wrong(ddp->params, ddp->n_params, mean_grad, step);
}

// "bucket_mb 25", "bucket_mb 0 (per tensor)", "cap 60 B": for the messages.
static const char *cap_name(double bucket_mb) {
    static char name[4][48];
    static int next;
    char *out = name[next++ % 4];
    if (bucket_mb >= 1) snprintf(out, sizeof name[0], "bucket_mb %g", bucket_mb);
    else if (bucket_mb <= 0) snprintf(out, sizeof name[0], "bucket_mb %g (per tensor)", bucket_mb);
    else snprintf(out, sizeof name[0], "cap %.0f B", bucket_mb * MIB);
    return out;
}

static const char *path_name(const Ddp *ddp) {
    return world == 1 ? "no communication" : ddp->use_thread ? "communication thread" : "between layers";
}

// ------------------------------------------------------------------ buckets

// The layout rules for any cap: buckets cover params[n-1] down to params[0] as
// contiguous ranges, in that order; bucket_of_param agrees; counts add up; every
// bucket but the last reaches the cap, and none would have without its lowest
// tensor (it closed as soon as it reached the cap).
static bool layout_ok(const Ddp *d, double bucket_mb) {
    size_t cap = bucket_mb > 0 ? (size_t)(bucket_mb * MIB) : 0, total = 0, weights = 0;
    int next = d->n_params - 1;  // the highest parameter not yet in a bucket
    for (int b = 0; b < d->n_buckets; b++) {
        const DdpBucket *k = &d->buckets[b];
        if (k->n_params < 1 || k->first_param + k->n_params - 1 != next || k->pending != k->n_params) return false;
        size_t count = 0;
        for (int i = k->first_param; i <= next; i++) {
            if (d->bucket_of_param[i] != b) return false;
            count += tensor_numel(d->params[i].value);
        }
        size_t without_lowest = count - tensor_numel(d->params[k->first_param].value);
        if (count != k->count || (b + 1 < d->n_buckets && count * sizeof(float) < cap)) return false;
        if (k->n_params > 1 && without_lowest * sizeof(float) >= cap) return false;
        total += count;
        next = k->first_param - 1;
    }
    for (int i = 0; i < d->n_params; i++) weights += tensor_numel(d->params[i].value);
    return next == -1 && total == weights;
}

static void test_buckets(Mlp *m) {
    const double caps[] = {25.0, 0.0, -1.0, CAP_60_BYTES};
    for (int c = 0; c < 4; c++) {
        Ddp d = ddp_wrap(m->params, m->n_params, caps[c]);
        bool shape = caps[c] >= 25.0 ? d.n_buckets == 1
                   : caps[c] <= 0    ? d.n_buckets == m->n_params  // bucket b holds the b-th from last
                                     : d.n_buckets == 3;           // 2 tensors each, see CAP_60_BYTES
        for (int b = 0; b < d.n_buckets && caps[c] <= 0; b++) shape &= d.buckets[b].first_param == m->n_params - 1 - b;
        for (int b = 0; b < d.n_buckets && caps[c] > 0 && caps[c] < 1; b++) shape &= d.buckets[b].n_params >= 2;
        char desc[512];
        ddp_describe_buckets(&d, desc, sizeof desc);
        EXPECT_ALL(shape && layout_ok(&d, caps[c]), "%s %s: %s", cap_name(caps[c]), on_ranks, desc);
        ddp_free(&d);
    }
}

// ------------------------------------------------------------------ a real backward

// One micro-batch's loss.backward() on this rank's data, with or without DDP.
static void backward_on(Mlp *m, const Tensor *x, const int *labels, Ddp *ddp) {
    mlp_forward(m, x);
    mlp_loss(m, labels);
    mlp_backward(m, x, ddp ? ddp_grad_ready : NULL, ddp);
}

static size_t flatten_grads(const Mlp *m, float *out) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++) {
        size_t numel = tensor_numel(m->params[i].grad);
        if (out) memcpy(out + n, m->params[i].grad->data, numel * sizeof(float));
        n += numel;
    }
    return n;
}

static void mean_over_ranks(float *v, size_t n) {
    MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (size_t k = 0; k < n; k++) v[k] /= (float)world;
}

// max |grad - ref| / max |ref| on this rank; *same: grads bit-identical to rank 0's.
static double compare_grads(const Mlp *m, const float *ref, float *scratch, bool *same) {
    size_t n = flatten_grads(m, scratch);
    double err = 0, scale = 1e-30;
    for (size_t k = 0; k < n; k++) err = fmax(err, fabs(scratch[k] - ref[k])), scale = fmax(scale, fabs(ref[k]));
    unsigned long long h = 1469598103934665603ULL, h0;  // FNV-1a of the bits
    for (size_t k = 0; k < n * sizeof(float); k++) h = (h ^ ((unsigned char *)scratch)[k]) * 1099511628211ULL;
    h0 = h;
    MPI_Bcast(&h0, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    *same = h == h0;
    return err / scale;
}

static void test_real_backward(Mlp *m) {
    enum { B = 8 };
    Rng rng;
    rng_seed(&rng, 1000 + (uint64_t)rank);  // each rank its own data
    Tensor x[2] = {tensor_zeros(B, SMALL[0], DEVICE_CPU), tensor_zeros(B, SMALL[0], DEVICE_CPU)};
    int labels[2][B];
    for (int j = 0; j < 2; j++)
        for (int r = 0; r < B; r++) {
            for (int c = 0; c < SMALL[0]; c++) x[j].data[r * SMALL[0] + c] = rng_uniform(&rng, -2, 2);
            labels[j][r] = (int)(rng_next_u32(&rng) % 3);
        }
    size_t n = flatten_grads(m, NULL);
    float *local = malloc(n * sizeof *local), *ref1 = malloc(n * sizeof *ref1), *ref2 = malloc(n * sizeof *ref2),
          *scratch = malloc(n * sizeof *scratch);
    // References without DDP: batch 0's local gradients and their mean over
    // ranks; the local sum over batches 0 and 1 (accumulated) and its mean.
    mlp_zero_grad(m);
    backward_on(m, &x[0], labels[0], NULL);
    flatten_grads(m, local);
    memcpy(ref1, local, n * sizeof *ref1);
    mean_over_ranks(ref1, n);
    backward_on(m, &x[1], labels[1], NULL);
    flatten_grads(m, ref2);
    mean_over_ranks(ref2, n);

    bool same;
    for (int c = 0; c < N_CAPS; c++) {
        Ddp d = ddp_wrap(m->params, m->n_params, CAPS[c]);
        mlp_zero_grad(m);
        backward_on(m, &x[0], labels[0], &d);
        ddp_finish(&d);
        double err = max_ranks(compare_grads(m, ref1, scratch, &same));
        EXPECT_ALL(err <= 1e-6 && same, "real backward, %s, %s %s: gradients identical across ranks "
                   "and equal to the MPI_Allreduce mean of the local ones (max rel. error %.1e)",
                   cap_name(CAPS[c]), path_name(&d), on_ranks, err);

        // no_sync on batch 0 (gradients must stay exactly local), then a
        // synchronised batch 1: the mean of the accumulated sum.
        mlp_zero_grad(m);
        ddp_set_sync(&d, false);
        backward_on(m, &x[0], labels[0], &d);
        ddp_finish(&d);
        double local_err = max_ranks(compare_grads(m, local, scratch, &same));
        ddp_set_sync(&d, true);
        backward_on(m, &x[1], labels[1], &d);
        ddp_finish(&d);
        err = max_ranks(compare_grads(m, ref2, scratch, &same));
        EXPECT_ALL(local_err == 0 && err <= 1e-6 && same, "no_sync backward then synced backward, %s %s: "
                   "first stays local (error %.1e), then the mean of the accumulated gradients (max rel. error %.1e)",
                   cap_name(CAPS[c]), on_ranks, local_err, err);
        ddp_free(&d);
    }
    free(local), free(ref1), free(ref2), free(scratch);
    tensor_free(&x[0]), tensor_free(&x[1]);
}

// ------------------------------------------------------------------ main

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    rank = dist_rank(), world = dist_world_size();
    snprintf(on_ranks, sizeof on_ranks, "on %d rank%s", world, world == 1 ? "" : "s");

    // 1. Wrap: different seeds, then every rank holds rank 0's parameters.
    const int big_sizes[] = {784, 128, 10};
    Rng rng;
    rng_seed(&rng, (uint64_t)rank + 1);
    Mlp big = mlp_new(big_sizes, 3, 1, &rng, DEVICE_CPU);
    unsigned long long before = params_checksum(big.params, big.n_params), rank0_before = before;
    MPI_Bcast(&rank0_before, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    Ddp d = ddp_wrap(big.params, big.n_params, 25.0);
    unsigned long long after = params_checksum(big.params, big.n_params), *afters = malloc(world * sizeof *afters);
    MPI_Gather(&after, 1, MPI_UNSIGNED_LONG_LONG, afters, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    int equal = 0;
    for (int r = 0; r < world && rank == 0; r++) equal += afters[r] == rank0_before;
    // Rank 0 checks the gathered checksums; the others that their own seed did
    // give them different weights before the wrap (or the check proves nothing).
    EXPECT_ALL(rank == 0 ? equal == world : before != rank0_before,
               "ddp_wrap %s: models seeded rank + 1 all end with rank 0's checksum %016llx (%d of %d ranks)",
               on_ranks, rank0_before, equal, world);
    EXPECT_ALL(d.n_buckets == 1 && layout_ok(&d, 25.0), "bucket_mb 25 holds the {784,128,10} MLP in 1 bucket %s",
               on_ranks);
    ddp_free(&d);
    free(afters);
    mlp_free(&big);

    // 2. Bucket layouts, on a small MLP (also synchronised by the wraps).
    Mlp m = mlp_new(SMALL, 4, 8, &rng, DEVICE_CPU);
    test_buckets(&m);

    // 3 and 4. The exact mean: one step on a fresh Ddp, then 20 in a row, for
    // each cap and both progress paths.
    for (int c = 0; c < N_CAPS; c++)
        for (int thread = world > 1 && dist_thread_multiple(); thread >= 0; thread--) {
            d = ddp_wrap(m.params, m.n_params, CAPS[c]);
            d.use_thread = thread;  // before the first hook, which starts the thread
            long wrong1 = sum_ranks(sync_step(&d, 0)), wrong20 = 0;
            for (int s = 1; s <= 20; s++) wrong20 += sum_ranks(sync_step(&d, s));
            EXPECT_ALL(wrong1 == 0, "%s, %s %s: one step gives the exact mean of the ranks' gradients "
                       "(%ld elements wrong)", cap_name(CAPS[c]), path_name(&d), on_ranks, wrong1);
            EXPECT_ALL(wrong20 == 0 && d.steps == (world > 1 ? 21 : 0), "%s, %s %s: 20 more steps on the "
                       "same Ddp, each the exact mean (%ld elements wrong, %ld steps counted)",
                       cap_name(CAPS[c]), path_name(&d), on_ranks, wrong20, d.steps);
            ddp_free(&d);
        }
    test_real_backward(&m);

    // 5. no_sync: the hooks start no bucket and ddp_finish leaves the local
    //    gradients untouched; the next synchronised step is the exact mean.
    d = ddp_wrap(m.params, m.n_params, CAP_60_BYTES);
    ddp_set_sync(&d, false);
    set_grads(m.params, m.n_params, 7);
    fake_backward(&d, 7);
    ddp_finish(&d);
    bool quiet = d.steps == 0 && d.n_ready == 0;
    for (int b = 0; b < d.n_buckets; b++)
        quiet &= !d.buckets[b].started && d.buckets[b].pending == d.buckets[b].n_params;
    long wrong = sum_ranks(count_wrong(m.params, m.n_params, local_grad, 7));
    EXPECT_ALL(quiet && wrong == 0, "no_sync %s: hooks start no bucket, ddp_finish keeps the local gradients "
               "(%ld elements changed)", on_ranks, wrong);
    ddp_set_sync(&d, true);
    wrong = sum_ranks(sync_step(&d, 8));
    EXPECT_ALL(wrong == 0, "the synchronised step after no_sync is the exact mean %s (%ld elements wrong)",
               on_ranks, wrong);

    // 6. Overlap bookkeeping, then ddp_free (joins the thread) and a new wrap.
    for (int s = 9; s < 14; s++) sync_step(&d, s);
    char desc[512];
    ddp_describe_overlap(&d, desc, sizeof desc);
    if (world == 1) {
        EXPECT_ALL(d.steps == 0 && strstr(desc, "world size 1") != NULL,
                   "world size 1: ddp_finish is a no-op (%ld steps counted): \"%s\"", d.steps, desc);
    } else {
        EXPECT_ALL(strstr(desc, "per step") && d.steps == 6 && d.comm_seconds >= d.hidden_seconds &&
                   d.hidden_seconds >= 0 && d.wait_seconds >= 0,
                   "overlap %s after %ld steps: comm %.3f ms >= hidden %.3f ms >= 0, wait %.3f ms: \"%s\"", on_ranks,
                   d.steps, 1e3 * d.comm_seconds, 1e3 * d.hidden_seconds, 1e3 * d.wait_seconds, desc);
    }
    ddp_free(&d);
    bool cleared = d.buckets == NULL && d.bucket_of_param == NULL && !d.thread;
    d = ddp_wrap(m.params, m.n_params, 0.0);
    wrong = 0;
    for (int s = 0; s < 3; s++) wrong += sum_ranks(sync_step(&d, s));
    EXPECT_ALL(cleared && wrong == 0, "ddp_free joins the thread and clears the Ddp; a new ddp_wrap on the same "
               "model gives exact means again %s (%ld elements wrong)", on_ranks, wrong);
    ddp_free(&d);
    mlp_free(&m);

    int status = test_summary();
    dist_finalize();
    return status;
}
