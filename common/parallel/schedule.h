// schedule.h: a pipeline schedule as data, as torch.distributed.pipelining
// builds one: for P stages and M micro-batches, each stage's ordered list of
// actions, "forward micro-batch i" (Fi) and "backward micro-batch i" (Bi).
// A program executes its stage's list; this file only makes, checks, prints
// and replays lists, so a schedule can be read and tested without running it.
//
//   Schedule schedule = schedule_new(SCHEDULE_1F1B, stages, micro_batches);
//   const Action *actions = schedule_actions(&schedule, stage);
//   for (int k = 0; k < 2 * micro_batches; k++)
//       if (actions[k].kind == ACTION_FORWARD) {
//           receive micro-batch actions[k].micro_batch's activations from stage - 1 (unless first);
//           forward; send the output to stage + 1 (unless last);
//       } else {
//           receive its output's gradient from stage + 1 (unless last);
//           backward; send the input's gradient to stage - 1 (unless first);
//       }
//   schedule_free(&schedule);
//
// The two schedules (picotron's train_step_pipeline_afab and _1f1b, PyTorch's
// ScheduleGPipe and Schedule1F1B, Megatron's forward_backward_pipelining):
// - GPipe, or all-forward-all-backward: F0 F1 ... F(M-1), then B0 B1 ... B(M-1).
//   Every stage holds the activations of all M micro-batches at once.
// - 1F1B, stage s: W = min(P - s - 1, M) warm-up forwards; then M - W rounds
//   of "forward the next micro-batch, backward the oldest"; then W cool-down
//   backwards. P = 4, M = 8:
//     stage 0: F0 F1 F2 | F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 | B5 B6 B7
//     stage 3: F0 B0 F1 B1 F2 B2 ...                        (no warm-up)
//   Stage s holds at most min(P - s, M) micro-batches' activations, not M: it
//   starts backwards as soon as the first gradient can come back from the
//   last stage, and each backward frees one micro-batch's activations.
// With equal stages both leave each stage idle the same share of the step,
// the bubble (P - 1) / (M + P - 1): 1F1B saves memory, not time.
// (PyTorch rejects M < P for 1F1B; here 1F1B with M <= P - s - 1 is GPipe on
// stage s, as the formula gives, and the replay shows what that costs.)
//
// Layer 1: check.h only (allocation, argument checks).
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef enum { SCHEDULE_GPIPE, SCHEDULE_1F1B } ScheduleKind;
typedef enum { ACTION_FORWARD, ACTION_BACKWARD } ActionKind;

typedef struct {
    ActionKind kind;
    int micro_batch;  // 0 .. micro_batches - 1
} Action;

typedef struct {
    ScheduleKind kind;
    int stages, micro_batches;
    Action *actions;  // [stages][2 * micro_batches]: each stage's list, in the order it runs them
} Schedule;

// "gpipe" or "1f1b", in any case (as PyTorch's get_schedule_class); false for
// any other name.
bool schedule_kind_from_name(const char *name, ScheduleKind *kind);
const char *schedule_kind_name(ScheduleKind kind);  // "gpipe", "1f1b"

// stages >= 1, micro_batches >= 1 (checked).
Schedule schedule_new(ScheduleKind kind, int stages, int micro_batches);
void schedule_free(Schedule *schedule);
// Stage `stage`'s list: 2 * micro_batches actions.
const Action *schedule_actions(const Schedule *schedule, int stage);

// Whether every stage's list is one that the program can run
// (PyTorch's _validate_schedule): M forwards and M backwards, each micro-batch
// once, forwards in micro-batch order, backwards in micro-batch order, and
// each backward after its own forward. If not, says why in `why` (the first
// fault found, e.g. "stage 0, action 0: B0 before F0") and returns false.
// A valid schedule may still deadlock across stages: schedule_replay finds out.
bool schedule_valid(const Schedule *schedule, char *why, size_t why_size);

// One line per stage, the actions aligned in columns:
//   stage 0: F0 F1 F2 F3 B0 B1 B2 B3
//   stage 1: F0 F1 F2 F3 B0 B1 B2 B3
// Returns the characters written (as snprintf: more than size when cut).
int schedule_format(const Schedule *schedule, char *out, size_t size);

// The most micro-batches whose activations stage `stage` holds at once
// (forwarded, not yet backwarded), counted along its list: M for GPipe,
// min(P - stage, M) for 1F1B. Times the activations of one micro-batch, it
// is the stage's activation memory.
int schedule_max_in_flight(const Schedule *schedule, int stage);

// The textbook bubble, the idle share of every stage when all stages take the
// same time: (P - 1) / (M + P - 1), for GPipe and 1F1B alike.
double schedule_bubble(int stages, int micro_batches);

// A replay: when each action runs if stage s takes forward_seconds[s] per
// forward and backward_seconds[s] per backward of a micro-batch. An action
// starts as soon as its stage has finished the action before it in its list
// and what it receives exists: F(s, i) waits for F(s - 1, i), B(s, i) for
// B(s + 1, i). Communication is free and a send never waits for its receiver,
// as with MPI_Isend. (With a blocking MPI_Send of a large message, which waits
// for its receive, 1F1B deadlocks where the replay does not: at P = M = 2,
// stage 0 sends F1's output while stage 1 sends B0's input gradient, and
// neither is receiving. PyTorch and picotron pair such a send with the next
// receive from the same neighbour: MPI_Sendrecv in C.)
typedef struct {
    double start, end;  // seconds, from the step's start
} Interval;

typedef struct {
    Interval *intervals;  // [stages][2 * micro_batches], aligned with the schedule's actions
    double makespan;      // the end of the last action of all stages: the step's time
    double *idle_share;   // [stages]: 1 - the stage's busy time / makespan
} Replay;

// Replays a valid schedule (every stage starts at 0). Returns false, with the
// reason in `why` and *out empty, if the schedule is invalid (schedule_valid)
// or deadlocks: a point where no stage's next action can start, e.g.
//   deadlock: stage 0 waits at B0 for stage 1's B0; stage 1 waits at F1 for stage 0's F1
// Times must be >= 0 (checked).
bool schedule_replay(const Schedule *schedule, const double *forward_seconds, const double *backward_seconds,
                     Replay *out, char *why, size_t why_size);
void replay_free(Replay *replay);
