// test_stage_timer.c: a pipeline stage's timer (common/parallel/stage_timer.h). On the CPU, steps
// whose idle time and actions are known sleeps: each sum at least its sleeps, idle the step less its
// actions, the kept step's intervals in order, and a take that starts the sums again. On a GPU (the
// simulated one in `make test-all`), more steps than the ring of events holds, each action a kernel:
// every step accounted for once, waited for only when the ring is full or at the take.
#define TEST_NAME "test_stage_timer"
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/stage_timer.h"
#include "runtime/dist.h"
#include "tensor/tensor.h"
#include "test.h"

static void sleep_ms(int ms) {
    struct timespec t = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    while (nanosleep(&t, &t) != 0) {}
}

// Two steps of [idle 10 ms] F0 (20 ms) [idle 5 ms] B0 (30 ms), the second kept.
static void test_cpu(void) {
    StageTimer *timer = stage_timer_new(2, DEVICE_CPU, false);
    double kept_start = 0, start[2] = {0}, end[2] = {0};
    EXPECT(!stage_timer_kept(timer, &kept_start, start, end), "no step kept before the first");
    for (int step = 0; step < 2; step++) {
        stage_timer_step_start(timer);
        sleep_ms(10);
        stage_timer_compute_start(timer, 0);
        sleep_ms(20);
        stage_timer_compute_end(timer, 0, true);
        sleep_ms(5);
        stage_timer_compute_start(timer, 1);
        sleep_ms(30);
        stage_timer_compute_end(timer, 1, false);
        stage_timer_step_end(timer, step == 1);
    }
    StageTimes t = stage_timer_take(timer);
    EXPECT(t.steps == 2 && t.forward >= 0.040 && t.backward >= 0.060 && t.idle >= 0.030,
           "2 steps of sleeps: forward %.1f ms (>= 40), backward %.1f ms (>= 60), idle %.1f ms (>= 30)", 1e3 * t.forward,
           1e3 * t.backward, 1e3 * t.idle);
    double sum = t.forward + t.backward + t.idle;
    EXPECT(sum > t.all - 1e-9 && sum < t.all + 1e-9, "idle is the steps' time less their actions: %.3f + %.3f + %.3f = %.3f ms",
           1e3 * t.forward, 1e3 * t.backward, 1e3 * t.idle, 1e3 * t.all);
    bool kept = stage_timer_kept(timer, &kept_start, start, end);
    EXPECT(kept && kept_start > 0 && start[0] >= 0.010 && end[0] >= start[0] + 0.020 && start[1] >= end[0] + 0.005 &&
               end[1] >= start[1] + 0.030,
           "the kept step: F0 [%.1f, %.1f) ms, B0 [%.1f, %.1f) ms from its start", 1e3 * start[0], 1e3 * end[0],
           1e3 * start[1], 1e3 * end[1]);
    StageTimes again = stage_timer_take(timer);
    EXPECT(again.steps == 0 && again.all == 0 && again.forward == 0, "a take starts the sums again (%ld steps after it)",
           again.steps);
    stage_timer_free(timer);
}

// More steps than the ring holds, each of M = 3 forwards and 3 backwards that are GPU work.
static void test_gpu(Device device) {
    enum { M = 3, STEPS = STAGE_TIMER_STEPS + 8 };
    StageTimer *timer = stage_timer_new(2 * M, device, false);
    Tensor x = tensor_zeros(256, 256, device), y = tensor_zeros(256, 256, device);
    tensor_fill(&x, 0.5f);
    for (int step = 0; step < STEPS; step++) {
        stage_timer_step_start(timer);
        for (int k = 0; k < 2 * M; k++) {
            stage_timer_compute_start(timer, k);
            gemm(false, false, 1.0f, &x, &x, 0.0f, &y);  // y = x @ x
            stage_timer_compute_end(timer, k, k < M);
        }
        stage_timer_step_end(timer, step == STEPS - 1);
    }
    StageTimes t = stage_timer_take(timer);
    double kept_start = -1, start[2 * M], end[2 * M];
    bool kept = stage_timer_kept(timer, &kept_start, start, end), ordered = kept;
    for (int k = 0; kept && k < 2 * M; k++) ordered = ordered && end[k] >= start[k] && (k == 0 || start[k] >= end[k - 1]);
    EXPECT(t.steps == STEPS && t.forward >= 0 && t.backward >= 0 && t.idle >= 0 &&
               t.forward + t.backward + t.idle <= t.all + 1e-6,
           "%d steps on the GPU (the ring holds %d): each accounted once (%ld), forward %.2f ms, backward %.2f ms, "
           "idle %.2f ms of %.2f ms",
           STEPS, STAGE_TIMER_STEPS, t.steps, 1e3 * t.forward, 1e3 * t.backward, 1e3 * t.idle, 1e3 * t.all);
    EXPECT(kept && ordered && kept_start == 0, "the kept step's 6 actions in order on the GPU's clock (no host clock asked)");
    tensor_free(&x), tensor_free(&y);
    stage_timer_free(timer);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    test_cpu();
    const char *require = getenv("REQUIRE_GPU");  // make test-gpu: no GPU is a failure there
    if (device_gpu_count() > 0) test_gpu(device_from_flag("cuda"));
    else if (require && strcmp(require, "1") == 0) EXPECT(0, "the timer on a GPU: REQUIRE_GPU=1, but no GPU");
    else printf("SKIP %s: the timer on a GPU (skipped: no GPU)\n", TEST_NAME);
    dist_finalize();
    return test_summary();
}
