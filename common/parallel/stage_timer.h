// stage_timer.h: how long a pipeline stage computes each of its actions (forwards, backwards) and how
// long it sits idle, measured where the work runs, without the step ever waiting to be timed.
//
//   StageTimer *timer = stage_timer_new(2 * M, device, false);
//   stage_timer_step_start(timer);                 // a step: before its first exchange
//   for (int k = 0; k < 2 * M; k++) {
//       ... the exchange before action k ...
//       stage_timer_compute_start(timer, k);
//       ... action k's forward or backward ...
//       stage_timer_compute_end(timer, k, forward);
//   }
//   ... the step's last exchange ...
//   stage_timer_step_end(timer, keep);             // keep: this step is the one --timeline draws
//   StageTimes epoch = stage_timer_take(timer);    // the sums over the steps since the last take
//
// On a CPU rank the marks are the host's clock (wall_seconds). On a GPU rank the host only queues the
// work, so its clock says when a kernel was queued, not when it ran: each mark is a CUDA event on the
// compute stream, and the times are the GPU's, as DDP's (ddp_gpu.c) are. The events of up to
// STAGE_TIMER_STEPS steps are kept; they are read once they have happened (a question, never a wait,
// at each step's start), and waited for only when the host is that many steps ahead of the GPU, or
// in stage_timer_take. So a GPU step makes no host wait to be timed (it used to wait twice an action).
//
// Idle is the step's time less its compute: the waits for what the neighbours send, the bubble. On a
// GPU the time between a receive and the action that needs it is idle time too, as on a CPU, since the
// compute stream waits for the receive before the action's start is marked.
//
// `host_clock` (--timeline on a GPU): the timeline aligns the stages' steps on the host's clock (one
// clock on a node), and an event tells only the time between two events. So each step's start waits
// for the GPU to be idle and reads the host's clock, as CUDA_LAUNCH_BLOCKING would: a host wait per
// step, only with --timeline.
//
// Layers: above runtime (device, timer).
#pragma once
#include <stdbool.h>

#include "runtime/device.h"

#define STAGE_TIMER_STEPS 32

typedef struct {
    double forward, backward;  // seconds of compute, summed over the steps
    double idle, all;          // seconds idle, and the steps' whole time
    long steps;
} StageTimes;

typedef struct StageTimer StageTimer;

StageTimer *stage_timer_new(int actions, Device device, bool host_clock);
void stage_timer_step_start(StageTimer *timer);
void stage_timer_compute_start(StageTimer *timer, int action);
void stage_timer_compute_end(StageTimer *timer, int action, bool forward);
void stage_timer_step_end(StageTimer *timer, bool keep);
// The sums over every step since the last take, waiting for the GPU to have run them.
StageTimes stage_timer_take(StageTimer *timer);
// The last kept step (stage_timer_step_end's keep) once taken: its start on the host's clock and each
// action's [start, end) from it, in seconds (start and end: [actions]). False if no step was kept.
bool stage_timer_kept(const StageTimer *timer, double *step_start, double *start, double *end);
void stage_timer_free(StageTimer *timer);
