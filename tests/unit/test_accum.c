// test_accum.c: micro_batch() and rows_in_batches(), the bookkeeping of
// gradient accumulation, against hand-computed steps, then over every small
// epoch: each step has one first and one last micro-batch, and its weights
// are its micro-batches' shares of its samples, summing to 1.
#define TEST_NAME "test_accum"
#include <math.h>

#include "test.h"
#include "train/accum.h"

static void expect_micro(int b, int accum_steps, int samples, int batch_size, bool first, bool last, double weight) {
    MicroBatch micro = micro_batch(b, accum_steps, samples, batch_size);
    EXPECT(micro.first == first && micro.last == last && fabs(micro.weight - weight) <= 1e-7 * weight,
           "%d samples, batch %d, accum %d: batch %d is %sfirst, %slast, weight %.7f (got %s, %s, %.7f)", samples,
           batch_size, accum_steps, b, first ? "" : "not ", last ? "" : "not ", weight, micro.first ? "first" : "-",
           micro.last ? "last" : "-", micro.weight);
}

// MNIST at batch 6400: 10 batches, the last of 2400 samples.
static void test_by_hand(void) {
    EXPECT(rows_in_batches(60000, 6400, 0, 10) == 60000, "rows in all 10 batches: 60000 (got %d)",
           rows_in_batches(60000, 6400, 0, 10));
    EXPECT(rows_in_batches(60000, 6400, 9, 10) == 2400, "rows in the last batch: 2400 (got %d)",
           rows_in_batches(60000, 6400, 9, 10));
    EXPECT(rows_in_batches(60000, 6400, 8, 12) == 8800, "rows in batches 8 to 11 of 10: 8800 (got %d)",
           rows_in_batches(60000, 6400, 8, 12));
    // accum 1: every batch is a step of its own.
    expect_micro(0, 1, 60000, 6400, true, true, 1.0);
    expect_micro(9, 1, 60000, 6400, true, true, 1.0);
    // accum 3: steps [0, 3), [3, 6), [6, 9) of 19200 samples, then [9] alone.
    expect_micro(0, 3, 60000, 6400, true, false, 1.0 / 3);
    expect_micro(1, 3, 60000, 6400, false, false, 1.0 / 3);
    expect_micro(2, 3, 60000, 6400, false, true, 1.0 / 3);
    expect_micro(6, 3, 60000, 6400, true, false, 1.0 / 3);
    expect_micro(9, 3, 60000, 6400, true, true, 1.0);
    // accum 4: the last step is [8, 10), 6400 + 2400 samples.
    expect_micro(8, 4, 60000, 6400, true, false, 6400.0 / 8800);
    expect_micro(9, 4, 60000, 6400, false, true, 2400.0 / 8800);
    // More micro-batches than the epoch has: one step of all of them.
    expect_micro(0, 16, 60000, 6400, true, false, 6400.0 / 60000);
    expect_micro(9, 16, 60000, 6400, false, true, 2400.0 / 60000);
}

// Every epoch of 1..60 samples, batches of 1..8, accumulating 1..5. The
// expectations are counted here, batch by batch, not taken from accum.c's
// formulas: a batch holds batch_size samples, or what is left of the epoch.
static void test_every_small_epoch(void) {
    enum { MAX_ACCUM = 5 };
    int bad = 0, epochs = 0;
    for (int samples = 1; samples <= 60; samples++)
        for (int batch_size = 1; batch_size <= 8; batch_size++)
            for (int accum = 1; accum <= MAX_ACCUM; accum++, epochs++) {
                int n_batches = 0, steps = 0, open = 0, step_rows = 0, in_step = 0;
                int rows[MAX_ACCUM];
                float weights[MAX_ACCUM];
                for (int left = samples; left > 0; left -= batch_size) n_batches++;
                for (int b = 0; b < n_batches; b++) {
                    MicroBatch micro = micro_batch(b, accum, samples, batch_size);
                    int batch_rows = samples - b * batch_size < batch_size ? samples - b * batch_size : batch_size;
                    // A step opens at every accum-th batch and nowhere else.
                    if (micro.first != (in_step == 0) || in_step >= accum) bad++;
                    if (micro.first) open = 1, step_rows = 0, in_step = 0;
                    if (!open) break;
                    rows[in_step] = batch_rows, weights[in_step] = micro.weight, in_step++;
                    step_rows += batch_rows;
                    // It closes after accum batches, or at the epoch's end.
                    if (micro.last != (in_step == accum || b + 1 == n_batches)) bad++;
                    if (micro.last) {
                        double total = 0.0;
                        for (int i = 0; i < in_step; i++) {
                            total += weights[i];
                            if (fabs(weights[i] - (double)rows[i] / step_rows) > 1e-6) bad++;
                        }
                        if (fabs(total - 1.0) > 1e-6) bad++;
                        open = 0, in_step = 0, steps++;
                    }
                }
                if (open || steps != (n_batches + accum - 1) / accum) bad++;
            }
    EXPECT(bad == 0, "%d epochs (1-60 samples, batches of 1-8, accum 1-5): every step opens at its first batch, "
                     "closes after accum batches or at the epoch's end, and weighs each batch by its share of the "
                     "step's samples, counted here (%d wrong)", epochs, bad);
}

int main(void) {
    test_by_hand();
    test_every_small_epoch();
    return test_summary();
}
