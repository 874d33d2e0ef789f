// schedule.c: pipeline schedules as lists of actions. See schedule.h.
#include "parallel/schedule.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "base/check.h"

bool schedule_kind_from_name(const char *name, ScheduleKind *kind) {
    if (strcasecmp(name, "gpipe") == 0) {
        *kind = SCHEDULE_GPIPE;
    } else if (strcasecmp(name, "1f1b") == 0) {
        *kind = SCHEDULE_1F1B;
    } else {
        return false;
    }
    return true;
}

const char *schedule_kind_name(ScheduleKind kind) { return kind == SCHEDULE_GPIPE ? "gpipe" : "1f1b"; }

static int actions_per_stage(const Schedule *schedule) { return 2 * schedule->micro_batches; }

static void gpipe_order(Action *list, int micro_batches) {
    int k = 0;
    for (int i = 0; i < micro_batches; i++) list[k++] = (Action){ACTION_FORWARD, i};
    for (int i = 0; i < micro_batches; i++) list[k++] = (Action){ACTION_BACKWARD, i};
}

// Stage s of P: the last stage can start a micro-batch's backward right after
// its forward; stage s gets the first gradient back P - s - 1 forwards later,
// and runs those forwards meanwhile (warm-up). From then on each forward is
// followed by the backward of the oldest micro-batch it holds (steady state),
// and what is left once all are forwarded is backwards (cool-down).
static void one_f_one_b_order(Action *list, int stage, int stages, int micro_batches) {
    int warmup = stages - stage - 1 < micro_batches ? stages - stage - 1 : micro_batches;
    int next_forward = 0, next_backward = 0, k = 0;
    for (int i = 0; i < warmup; i++) list[k++] = (Action){ACTION_FORWARD, next_forward++};
    for (int round = 0; round < micro_batches - warmup; round++) {
        list[k++] = (Action){ACTION_FORWARD, next_forward++};
        list[k++] = (Action){ACTION_BACKWARD, next_backward++};
    }
    for (int i = 0; i < warmup; i++) list[k++] = (Action){ACTION_BACKWARD, next_backward++};
}

Schedule schedule_new(ScheduleKind kind, int stages, int micro_batches) {
    CHECK(kind == SCHEDULE_GPIPE || kind == SCHEDULE_1F1B, "unknown pipeline schedule %d", (int)kind);
    CHECK(stages >= 1 && micro_batches >= 1, "a pipeline schedule of %d stages and %d micro-batches: need >= 1 of each",
          stages, micro_batches);
    Schedule schedule = {.kind = kind, .stages = stages, .micro_batches = micro_batches};
    schedule.actions = xmalloc((size_t)stages * (size_t)actions_per_stage(&schedule) * sizeof(Action));
    for (int s = 0; s < stages; s++) {
        Action *list = schedule.actions + (size_t)s * actions_per_stage(&schedule);
        if (kind == SCHEDULE_GPIPE) gpipe_order(list, micro_batches);
        else one_f_one_b_order(list, s, stages, micro_batches);
    }
    return schedule;
}

void schedule_free(Schedule *schedule) {
    free(schedule->actions);
    *schedule = (Schedule){0};
}

const Action *schedule_actions(const Schedule *schedule, int stage) {
    CHECK(stage >= 0 && stage < schedule->stages, "stage %d of a %d-stage pipeline", stage, schedule->stages);
    return schedule->actions + (size_t)stage * actions_per_stage(schedule);
}

// snprintf that appends at *len, and keeps counting past the end as snprintf does.
__attribute__((format(printf, 4, 5))) static void append(char *out, size_t size, int *len, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    size_t at = (size_t)*len < size ? (size_t)*len : size;
    *len += vsnprintf(out + at, size - at, fmt, args);
    va_end(args);
}

static char action_letter(ActionKind kind) { return kind == ACTION_FORWARD ? 'F' : 'B'; }

// Writes the reason into why (as snprintf) and returns false: a list's fault.
__attribute__((format(printf, 3, 4))) static bool fault(char *why, size_t why_size, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, why_size, fmt, args);
    va_end(args);
    return false;
}

bool schedule_valid(const Schedule *schedule, char *why, size_t why_size) {
    int micro_batches = schedule->micro_batches;
    if (why_size) why[0] = '\0';
    for (int s = 0; s < schedule->stages; s++) {
        const Action *list = schedule_actions(schedule, s);
        // Forwards and backwards each run in micro-batch order, so the list is
        // valid if and only if each action is the next one of its kind, and a
        // backward's forward has run. 2M actions that pass make M of each: no
        // more than M forwards pass, and no more backwards than forwards.
        int next_forward = 0, next_backward = 0;
        for (int k = 0; k < 2 * micro_batches; k++) {
            Action a = list[k];
            if (a.kind != ACTION_FORWARD && a.kind != ACTION_BACKWARD)
                return fault(why, why_size, "stage %d, action %d: unknown kind %d", s, k, (int)a.kind);
            char letter = action_letter(a.kind);
            int *next = a.kind == ACTION_FORWARD ? &next_forward : &next_backward;
            if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
                return fault(why, why_size, "stage %d, action %d: %c%d, of micro-batches 0-%d", s, k, letter,
                             a.micro_batch, micro_batches - 1);
            if (a.micro_batch < *next)
                return fault(why, why_size, "stage %d, action %d: %c%d again", s, k, letter, a.micro_batch);
            if (a.micro_batch > *next)
                return fault(why, why_size, "stage %d, action %d: %c%d before %c%d (%s run in micro-batch order)", s,
                             k, letter, a.micro_batch, letter, *next,
                             a.kind == ACTION_FORWARD ? "forwards" : "backwards");
            if (a.kind == ACTION_BACKWARD && a.micro_batch >= next_forward)
                return fault(why, why_size, "stage %d, action %d: B%d before F%d", s, k, a.micro_batch, a.micro_batch);
            (*next)++;
        }
    }
    return true;
}

static int decimal_digits(int n) {
    int digits = 1;
    while (n >= 10) n /= 10, digits++;
    return digits;
}

int schedule_format(const Schedule *schedule, char *out, size_t size) {
    int len = 0;
    if (size) out[0] = '\0';
    // Every action as wide as the widest, so that action k of every stage
    // lines up in one column; no padding after the last.
    int stage_width = decimal_digits(schedule->stages - 1);
    int action_width = 1 + decimal_digits(schedule->micro_batches - 1);
    for (int s = 0; s < schedule->stages; s++) {
        const Action *list = schedule_actions(schedule, s);
        append(out, size, &len, "stage %*d:", stage_width, s);
        for (int k = 0; k < actions_per_stage(schedule); k++) {
            bool last = k + 1 == actions_per_stage(schedule);
            int digits = decimal_digits(list[k].micro_batch);
            append(out, size, &len, " %c%d%*s", action_letter(list[k].kind), list[k].micro_batch,
                   last ? 0 : action_width - 1 - digits, "");
        }
        append(out, size, &len, "\n");
    }
    return len;
}

int schedule_max_in_flight(const Schedule *schedule, int stage) {
    const Action *list = schedule_actions(schedule, stage);
    int held = 0, most = 0;
    for (int k = 0; k < actions_per_stage(schedule); k++) {
        held += list[k].kind == ACTION_FORWARD ? 1 : -1;
        if (held > most) most = held;
    }
    return most;
}

double schedule_bubble(int stages, int micro_batches) {
    return (double)(stages - 1) / (double)(micro_batches + stages - 1);
}

// What action `a` of stage s waits for from a neighbour: the end time of
// F(s - 1, i) or B(s + 1, i), or 0 when it receives nothing (first stage's
// forwards, last stage's backwards). Negative while that has not run yet.
static double received_at(const Schedule *schedule, const double *forward_end, const double *backward_end, int s,
                          Action a, int *from_stage) {
    int i = a.micro_batch, micro_batches = schedule->micro_batches;
    if (a.kind == ACTION_FORWARD) {
        *from_stage = s - 1;
        return s == 0 ? 0.0 : forward_end[(size_t)(s - 1) * micro_batches + i];
    }
    *from_stage = s + 1;
    return s == schedule->stages - 1 ? 0.0 : backward_end[(size_t)(s + 1) * micro_batches + i];
}

bool schedule_replay(const Schedule *schedule, const double *forward_seconds, const double *backward_seconds,
                     Replay *out, char *why, size_t why_size) {
    *out = (Replay){0};
    if (!schedule_valid(schedule, why, why_size)) return false;
    int stages = schedule->stages, micro_batches = schedule->micro_batches, per_stage = actions_per_stage(schedule);
    for (int s = 0; s < stages; s++)
        CHECK(forward_seconds[s] >= 0 && backward_seconds[s] >= 0 && isfinite(forward_seconds[s]) &&
                  isfinite(backward_seconds[s]),
              "replay: stage %d takes %g s per forward and %g s per backward: need finite times >= 0", s,
              forward_seconds[s], backward_seconds[s]);

    Interval *intervals = xmalloc((size_t)stages * per_stage * sizeof(Interval));
    // End times of F(s, i) and B(s, i), [stages][micro_batches]; -1: not run yet.
    double *forward_end = xmalloc((size_t)stages * micro_batches * sizeof(double));
    double *backward_end = xmalloc((size_t)stages * micro_batches * sizeof(double));
    for (size_t j = 0; j < (size_t)stages * micro_batches; j++) forward_end[j] = backward_end[j] = -1.0;
    int *next = xcalloc((size_t)stages, sizeof(int));   // each stage's next action
    double *free_at = xcalloc((size_t)stages, sizeof(double));  // when it has finished the one before

    // Run every stage as far as it can, again and again. An action's times
    // depend only on its stage's previous action and on what it receives, so
    // the order in which stages are visited changes nothing. A pass in which
    // no stage moves, with actions left, is a deadlock: every stage left
    // waits for a neighbour's action, and every such neighbour is itself
    // stuck at an earlier point of its list.
    int left = stages * per_stage;
    while (left > 0) {
        int moved = 0;
        for (int s = 0; s < stages; s++)
            for (; next[s] < per_stage; next[s]++, moved++, left--) {
                Action a = schedule_actions(schedule, s)[next[s]];
                int from_stage;
                double received = received_at(schedule, forward_end, backward_end, s, a, &from_stage);
                if (received < 0) break;
                double start = received > free_at[s] ? received : free_at[s];
                double end = start + (a.kind == ACTION_FORWARD ? forward_seconds[s] : backward_seconds[s]);
                intervals[(size_t)s * per_stage + next[s]] = (Interval){start, end};
                double *ends = a.kind == ACTION_FORWARD ? forward_end : backward_end;
                ends[(size_t)s * micro_batches + a.micro_batch] = end;
                free_at[s] = end;
            }
        if (moved == 0) break;
    }

    bool finished = left == 0;
    if (!finished) {
        int len = 0;
        if (why_size) why[0] = '\0';
        append(why, why_size, &len, "deadlock:");
        for (int s = 0, first = 1; s < stages; s++) {
            if (next[s] == per_stage) continue;
            Action a = schedule_actions(schedule, s)[next[s]];
            char letter = action_letter(a.kind);
            int from_stage;
            received_at(schedule, forward_end, backward_end, s, a, &from_stage);
            append(why, why_size, &len, "%s stage %d waits at %c%d for stage %d's %c%d", first ? "" : ";", s, letter,
                   a.micro_batch, from_stage, letter, a.micro_batch);
            first = 0;
        }
        free(intervals);
    } else {
        double makespan = 0.0;
        for (int s = 0; s < stages; s++)
            if (free_at[s] > makespan) makespan = free_at[s];
        double *idle_share = xmalloc((size_t)stages * sizeof(double));
        for (int s = 0; s < stages; s++) {
            double busy = micro_batches * (forward_seconds[s] + backward_seconds[s]);
            idle_share[s] = makespan > 0 ? (makespan - busy) / makespan : 0.0;
        }
        *out = (Replay){.intervals = intervals, .makespan = makespan, .idle_share = idle_share};
    }
    free(forward_end);
    free(backward_end);
    free(next);
    free(free_at);
    return finished;
}

void replay_free(Replay *replay) {
    free(replay->intervals);
    free(replay->idle_share);
    *replay = (Replay){0};
}
