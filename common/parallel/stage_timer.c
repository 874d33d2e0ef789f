// stage_timer.c: a pipeline stage's compute and idle time, on the host's clock or the GPU's. See stage_timer.h.
#include "parallel/stage_timer.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/timer.h"

#if HAVE_CUDA
// One step's events on the compute stream, in the order they are recorded.
typedef struct {
    cudaEvent_t step_start, step_end;
    cudaEvent_t *begin, *end;  // [actions]
    bool *forward;             // [actions]
    bool keep;
    double host_start;         // the step's start on the host's clock (host_clock), else 0
} TimedStep;
#endif

struct StageTimer {
    int actions;
    Device device;
    bool host_clock;
    StageTimes sums;
    // The kept step, once accounted for: its start (host clock) and its actions' intervals from there.
    bool have_kept;
    double kept_start, *kept_begin, *kept_end;
    // A CPU rank's step in progress, on the host's clock (a GPU rank's accounting uses begin and end too).
    double step_start, *begin, *end;  // [actions]: from step_start
    bool *forward;                    // [actions]
#if HAVE_CUDA
    TimedStep ring[STAGE_TIMER_STEPS];
    int oldest, n_timed;  // the steps recorded and not yet accounted for
#endif
};

// One step's intervals into the sums (and kept, if asked).
static void account(StageTimer *timer, double step_start, const double *begin, const double *end, const bool *forward,
                    double all, bool keep) {
    double busy = 0;
    for (int k = 0; k < timer->actions; k++) {
        double seconds = end[k] - begin[k];
        (forward[k] ? &timer->sums.forward : &timer->sums.backward)[0] += seconds;
        busy += seconds;
    }
    timer->sums.idle += all > busy ? all - busy : 0;
    timer->sums.all += all;
    timer->sums.steps++;
    if (keep) {
        timer->have_kept = true;
        timer->kept_start = step_start;
        memcpy(timer->kept_begin, begin, (size_t)timer->actions * sizeof(double));
        memcpy(timer->kept_end, end, (size_t)timer->actions * sizeof(double));
    }
}

StageTimer *stage_timer_new(int actions, Device device, bool host_clock) {
    CHECK(actions >= 1, "stage_timer_new: %d actions per step", actions);
    StageTimer *timer = xcalloc(1, sizeof *timer);
    timer->actions = actions, timer->device = device, timer->host_clock = host_clock;
    timer->kept_begin = xcalloc((size_t)actions, sizeof(double));
    timer->kept_end = xcalloc((size_t)actions, sizeof(double));
    timer->begin = xcalloc((size_t)actions, sizeof(double));
    timer->end = xcalloc((size_t)actions, sizeof(double));
    timer->forward = xcalloc((size_t)actions, sizeof(bool));
#if HAVE_CUDA
    if (device == DEVICE_CUDA)
        for (int i = 0; i < STAGE_TIMER_STEPS; i++) {
            TimedStep *step = &timer->ring[i];
            CHECK_CUDA(cudaEventCreate(&step->step_start));
            CHECK_CUDA(cudaEventCreate(&step->step_end));
            step->begin = xmalloc((size_t)actions * sizeof(cudaEvent_t));
            step->end = xmalloc((size_t)actions * sizeof(cudaEvent_t));
            step->forward = xcalloc((size_t)actions, sizeof(bool));
            for (int k = 0; k < actions; k++) {
                CHECK_CUDA(cudaEventCreate(&step->begin[k]));
                CHECK_CUDA(cudaEventCreate(&step->end[k]));
            }
        }
#endif
    return timer;
}

#if HAVE_CUDA
static TimedStep *recording(StageTimer *timer) {
    return &timer->ring[(timer->oldest + timer->n_timed) % STAGE_TIMER_STEPS];
}

static double seconds_between(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, from, to));
    return 1e-3 * ms;
}

// The oldest recorded step into the sums: if it has happened (one question: its last event, recorded
// after all the others on the same stream), or waiting for it if `wait`. Returns whether it was.
static bool account_oldest(StageTimer *timer, bool wait) {
    if (timer->n_timed == 0) return false;
    TimedStep *step = &timer->ring[timer->oldest];
    if (wait) {
        device_wait_event(step->step_end, "a pipeline step's timing events");
    } else {
        cudaError_t status = cudaEventQuery(step->step_end);
        if (status == cudaErrorNotReady) return false;
        CHECK_CUDA(status);
    }
    for (int k = 0; k < timer->actions; k++) {
        timer->begin[k] = seconds_between(step->step_start, step->begin[k]);
        timer->end[k] = seconds_between(step->step_start, step->end[k]);
    }
    account(timer, step->host_start, timer->begin, timer->end, step->forward,
            seconds_between(step->step_start, step->step_end), step->keep);
    timer->oldest = (timer->oldest + 1) % STAGE_TIMER_STEPS;
    timer->n_timed--;
    return true;
}
#endif

void stage_timer_step_start(StageTimer *timer) {
#if HAVE_CUDA
    if (timer->device == DEVICE_CUDA) {
        while (account_oldest(timer, false)) {}
        if (timer->n_timed == STAGE_TIMER_STEPS) account_oldest(timer, true);  // the host is that far ahead
        TimedStep *step = recording(timer);
        step->host_start = 0;
        if (timer->host_clock) {  // with the GPU idle, the step starts when the host records it
            device_synchronize();
            step->host_start = wall_seconds();
        }
        CHECK_CUDA(cudaEventRecord(step->step_start, device_stream()));
        return;
    }
#endif
    timer->step_start = wall_seconds();
}

void stage_timer_compute_start(StageTimer *timer, int action) {
    CHECK(action >= 0 && action < timer->actions, "stage_timer_compute_start: action %d of %d", action, timer->actions);
#if HAVE_CUDA
    if (timer->device == DEVICE_CUDA) {
        CHECK_CUDA(cudaEventRecord(recording(timer)->begin[action], device_stream()));
        return;
    }
#endif
    timer->begin[action] = wall_seconds() - timer->step_start;
}

void stage_timer_compute_end(StageTimer *timer, int action, bool forward) {
    CHECK(action >= 0 && action < timer->actions, "stage_timer_compute_end: action %d of %d", action, timer->actions);
#if HAVE_CUDA
    if (timer->device == DEVICE_CUDA) {
        TimedStep *step = recording(timer);
        CHECK_CUDA(cudaEventRecord(step->end[action], device_stream()));
        step->forward[action] = forward;
        return;
    }
#endif
    timer->end[action] = wall_seconds() - timer->step_start;
    timer->forward[action] = forward;
}

void stage_timer_step_end(StageTimer *timer, bool keep) {
#if HAVE_CUDA
    if (timer->device == DEVICE_CUDA) {
        TimedStep *step = recording(timer);
        step->keep = keep;
        CHECK_CUDA(cudaEventRecord(step->step_end, device_stream()));
        timer->n_timed++;
        return;
    }
#endif
    account(timer, timer->step_start, timer->begin, timer->end, timer->forward, wall_seconds() - timer->step_start, keep);
}

StageTimes stage_timer_take(StageTimer *timer) {
#if HAVE_CUDA
    while (account_oldest(timer, true)) {}
#endif
    StageTimes sums = timer->sums;
    timer->sums = (StageTimes){0};
    return sums;
}

bool stage_timer_kept(const StageTimer *timer, double *step_start, double *start, double *end) {
    if (!timer->have_kept) return false;
    *step_start = timer->kept_start;
    memcpy(start, timer->kept_begin, (size_t)timer->actions * sizeof(double));
    memcpy(end, timer->kept_end, (size_t)timer->actions * sizeof(double));
    return true;
}

void stage_timer_free(StageTimer *timer) {
    if (!timer) return;
#if HAVE_CUDA
    if (timer->device == DEVICE_CUDA) {
        while (account_oldest(timer, true)) {}  // an event is destroyed once it has happened
        for (int i = 0; i < STAGE_TIMER_STEPS; i++) {
            TimedStep *step = &timer->ring[i];
            CHECK_CUDA(cudaEventDestroy(step->step_start));
            CHECK_CUDA(cudaEventDestroy(step->step_end));
            for (int k = 0; k < timer->actions; k++) {
                CHECK_CUDA(cudaEventDestroy(step->begin[k]));
                CHECK_CUDA(cudaEventDestroy(step->end[k]));
            }
            free(step->begin), free(step->end), free(step->forward);
        }
    }
#endif
    free(timer->kept_begin), free(timer->kept_end), free(timer->begin), free(timer->end), free(timer->forward);
    free(timer);
}
