// test_schedule.c: pipeline schedules (common/parallel/schedule.h). The lists of
// GPipe and 1F1B against the anchors' examples, written out by hand; every
// small pipeline's lists valid, holding the activations the formulas say,
// and replayed without deadlock to the textbook bubble when stages are
// equal; a replay of unequal stages computed by hand; and broken lists,
// which the check and the replay reject with the reason.
#define TEST_NAME "test_schedule"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/schedule.h"
#include "test.h"

enum { MAX_STAGES = 6, MAX_MICRO_BATCHES = 12 };

// Stage `stage`'s list as "F0 F1 B0 ...", written here rather than by
// schedule_format, so that the lists and the printing are tested apart.
static const char *list_text(const Schedule *schedule, int stage) {
    static char text[1024];
    const Action *list = schedule_actions(schedule, stage);
    int len = 0;
    text[0] = '\0';
    for (int k = 0; k < 2 * schedule->micro_batches; k++)
        len += snprintf(text + len, sizeof text - (size_t)len, "%s%c%d", k ? " " : "",
                        list[k].kind == ACTION_FORWARD ? 'F' : 'B', list[k].micro_batch);
    return text;
}

static void expect_lists(ScheduleKind kind, int stages, int micro_batches, const char *const *expected) {
    Schedule schedule = schedule_new(kind, stages, micro_batches);
    for (int s = 0; s < stages; s++) {
        const char *got = list_text(&schedule, s);
        EXPECT(strcmp(got, expected[s]) == 0, "%s, P=%d, M=%d, stage %d: %s (got %s)", schedule_kind_name(kind),
               stages, micro_batches, s, expected[s], got);
    }
    schedule_free(&schedule);
}

static void test_names(void) {
    ScheduleKind kind = SCHEDULE_1F1B;
    EXPECT(schedule_kind_from_name("gpipe", &kind) && kind == SCHEDULE_GPIPE, "\"gpipe\" is GPipe");
    EXPECT(schedule_kind_from_name("1f1b", &kind) && kind == SCHEDULE_1F1B, "\"1f1b\" is 1F1B");
    EXPECT(schedule_kind_from_name("GPipe", &kind) && kind == SCHEDULE_GPIPE, "\"GPipe\": any case");
    EXPECT(!schedule_kind_from_name("interleaved", &kind) && !schedule_kind_from_name("", &kind),
           "\"interleaved\" and \"\" are no schedule");
    EXPECT(strcmp(schedule_kind_name(SCHEDULE_GPIPE), "gpipe") == 0 &&
               strcmp(schedule_kind_name(SCHEDULE_1F1B), "1f1b") == 0,
           "the names back: gpipe, 1f1b");
}

// The anchors' lists (picotron's train_step_pipeline_afab and _1f1b).
static void test_lists_by_hand(void) {
    const char *gpipe_3_4[] = {"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3"};
    expect_lists(SCHEDULE_GPIPE, 3, 4, gpipe_3_4);
    const char *gpipe_1_2[] = {"F0 F1 B0 B1"};
    expect_lists(SCHEDULE_GPIPE, 1, 2, gpipe_1_2);
    // Warm-up 3, 2, 1, 0 forwards; the steady state pairs F(i + W) with B(i).
    const char *one_f_one_b_4_8[] = {
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    };
    expect_lists(SCHEDULE_1F1B, 4, 8, one_f_one_b_4_8);
    const char *one_f_one_b_2_1[] = {"F0 B0", "F0 B0"};
    expect_lists(SCHEDULE_1F1B, 2, 1, one_f_one_b_2_1);
    // Fewer micro-batches than stages: the warm-up is cut to M, and the first
    // two stages run GPipe's order.
    const char *one_f_one_b_4_2[] = {"F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"};
    expect_lists(SCHEDULE_1F1B, 4, 2, one_f_one_b_4_2);
}

// `text` with its newlines shown as \n, so that a check stays one line.
static const char *one_line(const char *text) {
    static char shown[2][1024];
    static int which;
    char *out = shown[which ^= 1];
    size_t n = 0;
    for (; *text && n + 2 < sizeof shown[0]; text++) {
        if (*text == '\n') {
            out[n++] = '\\';
            out[n++] = 'n';
        } else {
            out[n++] = *text;
        }
    }
    out[n] = '\0';
    return out;
}

static void test_format(void) {
    Schedule schedule = schedule_new(SCHEDULE_1F1B, 2, 3);
    char text[256];
    const char *expected = "stage 0: F0 F1 B0 F2 B1 B2\nstage 1: F0 B0 F1 B1 F2 B2\n";
    int len = schedule_format(&schedule, text, sizeof text);
    EXPECT(strcmp(text, expected) == 0 && len == (int)strlen(expected), "1f1b, P=2, M=3, printed: %s (got %s)",
           one_line(expected), one_line(text));
    char short_text[12];
    len = schedule_format(&schedule, short_text, sizeof short_text);
    EXPECT(len == (int)strlen(expected) && strcmp(short_text, "stage 0: F0") == 0,
           "cut at 12 bytes: \"stage 0: F0\", and the full length %d returned as snprintf does (got \"%s\", %d)",
           (int)strlen(expected), short_text, len);
    schedule_free(&schedule);

    // Micro-batch 10 is three characters wide: every action is padded to
    // three, so action k of every stage sits in the same column.
    schedule = schedule_new(SCHEDULE_1F1B, 2, 11);
    char wide[1024];
    schedule_format(&schedule, wide, sizeof wide);
    const char *wide_expected =
        "stage 0: F0  F1  B0  F2  B1  F3  B2  F4  B3  F5  B4  F6  B5  F7  B6  F8  B7  F9  B8  F10 B9  B10\n"
        "stage 1: F0  B0  F1  B1  F2  B2  F3  B3  F4  B4  F5  B5  F6  B6  F7  B7  F8  B8  F9  B9  F10 B10\n";
    EXPECT(strcmp(wide, wide_expected) == 0, "1f1b, P=2, M=11: the actions in columns: %s (got %s)",
           one_line(wide_expected), one_line(wide));
    schedule_free(&schedule);
}

// Every replayed action runs for its stage's time, as soon as its stage is
// free and what it receives has been sent, and never earlier.
static int replay_faults(const Schedule *schedule, const Replay *replay, const double *forward_seconds,
                         const double *backward_seconds) {
    int faults = 0, stages = schedule->stages, micro_batches = schedule->micro_batches;
    double forward_end[MAX_STAGES][MAX_MICRO_BATCHES], backward_end[MAX_STAGES][MAX_MICRO_BATCHES];
    for (int s = 0; s < stages; s++)
        for (int k = 0; k < 2 * micro_batches; k++) {
            Action a = schedule_actions(schedule, s)[k];
            Interval at = replay->intervals[s * 2 * micro_batches + k];
            (a.kind == ACTION_FORWARD ? forward_end : backward_end)[s][a.micro_batch] = at.end;
        }
    for (int s = 0; s < stages; s++)
        for (int k = 0; k < 2 * micro_batches; k++) {
            Action a = schedule_actions(schedule, s)[k];
            Interval at = replay->intervals[s * 2 * micro_batches + k];
            bool forward = a.kind == ACTION_FORWARD;
            double ready = k > 0 ? replay->intervals[s * 2 * micro_batches + k - 1].end : 0.0;
            if (forward && s > 0) ready = fmax(ready, forward_end[s - 1][a.micro_batch]);
            if (!forward && s < stages - 1) ready = fmax(ready, backward_end[s + 1][a.micro_batch]);
            if (at.start != ready || at.end != at.start + (forward ? forward_seconds[s] : backward_seconds[s]))
                faults++;
        }
    return faults;
}

// All pipelines of 1-6 stages and 1-12 micro-batches, both schedules.
static void test_every_small_pipeline(void) {
    double forward_seconds[MAX_STAGES], backward_seconds[MAX_STAGES];
    for (int s = 0; s < MAX_STAGES; s++) forward_seconds[s] = 1.0, backward_seconds[s] = 2.0;
    for (int kind = SCHEDULE_GPIPE; kind <= SCHEDULE_1F1B; kind++) {
        int invalid = 0, deadlocks = 0, wrong_in_flight = 0, wrong_makespan = 0, wrong_idle = 0, wrong_times = 0;
        int pipelines = 0;
        char why[256] = "", first_fault[320] = "";
        for (int stages = 1; stages <= MAX_STAGES; stages++)
            for (int micro_batches = 1; micro_batches <= MAX_MICRO_BATCHES; micro_batches++, pipelines++) {
                Schedule schedule = schedule_new((ScheduleKind)kind, stages, micro_batches);
                if (!schedule_valid(&schedule, why, sizeof why)) {
                    if (!invalid++)
                        snprintf(first_fault, sizeof first_fault, "P=%d, M=%d: %s", stages, micro_batches, why);
                }
                for (int s = 0; s < stages; s++) {
                    int expected = kind == SCHEDULE_GPIPE ? micro_batches
                                                          : (stages - s < micro_batches ? stages - s : micro_batches);
                    wrong_in_flight += schedule_max_in_flight(&schedule, s) != expected;
                }
                Replay replay;
                if (!schedule_replay(&schedule, forward_seconds, backward_seconds, &replay, why, sizeof why)) {
                    if (!deadlocks++ && !invalid)
                        snprintf(first_fault, sizeof first_fault, "P=%d, M=%d: %s", stages, micro_batches, why);
                    schedule_free(&schedule);
                    continue;
                }
                // Equal stages: M + P - 1 forward slots and as many backward
                // ones (whole seconds here: exact in floating point).
                wrong_makespan += replay.makespan != (micro_batches + stages - 1) * 3.0;
                for (int s = 0; s < stages; s++)
                    wrong_idle += fabs(replay.idle_share[s] - schedule_bubble(stages, micro_batches)) > 1e-12;
                wrong_times += replay_faults(&schedule, &replay, forward_seconds, backward_seconds) > 0;
                replay_free(&replay);
                schedule_free(&schedule);
            }
        const char *name = schedule_kind_name((ScheduleKind)kind);
        EXPECT(invalid == 0 && deadlocks == 0,
               "%s: the %d pipelines of 1-%d stages and 1-%d micro-batches are valid and replay without deadlock "
               "(%d invalid, %d deadlocked%s%s)", name, pipelines, MAX_STAGES, MAX_MICRO_BATCHES, invalid, deadlocks,
               first_fault[0] ? "; first: " : "", first_fault);
        EXPECT(wrong_in_flight == 0,
               "%s: each stage holds at most %s micro-batches' activations, counted along its list (%d stages wrong)",
               name, kind == SCHEDULE_GPIPE ? "M" : "min(P - s, M)", wrong_in_flight);
        EXPECT(wrong_makespan == 0 && wrong_idle == 0,
               "%s: equal stages (forward 1 s, backward 2 s) take (M + P - 1) x 3 s, and each stage idles "
               "(P - 1) / (M + P - 1) of it (%d makespans, %d idle shares wrong)", name, wrong_makespan, wrong_idle);
        EXPECT(wrong_times == 0,
               "%s: every action starts as soon as its stage and its input are ready, and lasts its stage's time "
               "(%d pipelines wrong)", name, wrong_times);
    }
    EXPECT(fabs(schedule_bubble(4, 8) - 3.0 / 11.0) < 1e-15 && schedule_bubble(1, 5) == 0.0,
           "the bubble: 3/11 at P=4, M=8; none with one stage (got %.6f, %.6f)", schedule_bubble(4, 8),
           schedule_bubble(1, 5));
}

static void expect_intervals(const Replay *replay, int count, const Interval *expected, const char *what) {
    bool same = true;
    char got[512];
    int len = 0;
    for (int k = 0; k < count; k++) {
        same = same && replay->intervals[k].start == expected[k].start && replay->intervals[k].end == expected[k].end;
        len += snprintf(got + len, sizeof got - (size_t)len, " [%g, %g]", replay->intervals[k].start,
                        replay->intervals[k].end);
    }
    EXPECT(same, "%s (got%s)", what, got);
}

// P = 2, M = 2, stage 0 twice as slow as stage 1: forward 2 s and backward
// 4 s on stage 0, 1 s and 2 s on stage 1.
static void test_unequal_stages(void) {
    const double forward_seconds[] = {2.0, 1.0}, backward_seconds[] = {4.0, 2.0};
    Replay replay;
    char why[256];

    // GPipe. Stage 0: F0 [0, 2], F1 [2, 4]. Stage 1: F0 [2, 3], F1 [4, 5],
    // B0 [5, 7], B1 [7, 9]. Stage 0 then waits for B0's gradient until 7:
    // B0 [7, 11], B1 [11, 15]. Busy 12 s of 15 and 6 s of 15.
    Schedule schedule = schedule_new(SCHEDULE_GPIPE, 2, 2);
    bool ran = schedule_replay(&schedule, forward_seconds, backward_seconds, &replay, why, sizeof why);
    EXPECT(ran, "gpipe, P=2, M=2, stage 0 twice as slow: replayed (%s)", ran ? "yes" : why);
    if (ran) {
        const Interval gpipe[] = {{0, 2}, {2, 4}, {7, 11}, {11, 15}, {2, 3}, {4, 5}, {5, 7}, {7, 9}};
        expect_intervals(&replay, 8, gpipe,
                         "gpipe, P=2, M=2, stage 0 twice as slow: stage 0 F0 [0, 2] F1 [2, 4] B0 [7, 11] B1 [11, 15], "
                         "stage 1 F0 [2, 3] F1 [4, 5] B0 [5, 7] B1 [7, 9]");
        EXPECT(replay.makespan == 15.0 && fabs(replay.idle_share[0] - 3.0 / 15) < 1e-15 &&
                   fabs(replay.idle_share[1] - 9.0 / 15) < 1e-15,
               "gpipe: the step takes 15 s; stage 0 idles 3/15 of it, stage 1 9/15 (got %g s, %.6f, %.6f)",
               replay.makespan, replay.idle_share[0], replay.idle_share[1]);
        replay_free(&replay);
    }
    schedule_free(&schedule);

    // 1F1B. Stage 0 (F0 F1 B0 B1): F0 [0, 2], F1 [2, 4]. Stage 1 (F0 B0 F1
    // B1): F0 [2, 3], B0 [3, 5], then F1 [5, 6] (F1's input came at 4),
    // B1 [6, 8]. Stage 0: B0 [5, 9], B1 [9, 13]. Busy 12 s and 6 s of 13:
    // here, unlike with equal stages, 1F1B is faster, since stage 1 returns
    // B0's gradient before it runs F1.
    schedule = schedule_new(SCHEDULE_1F1B, 2, 2);
    ran = schedule_replay(&schedule, forward_seconds, backward_seconds, &replay, why, sizeof why);
    EXPECT(ran, "1f1b, P=2, M=2, stage 0 twice as slow: replayed (%s)", ran ? "yes" : why);
    if (ran) {
        const Interval one_f_one_b[] = {{0, 2}, {2, 4}, {5, 9}, {9, 13}, {2, 3}, {3, 5}, {5, 6}, {6, 8}};
        expect_intervals(&replay, 8, one_f_one_b,
                         "1f1b, P=2, M=2, stage 0 twice as slow: stage 0 F0 [0, 2] F1 [2, 4] B0 [5, 9] B1 [9, 13], "
                         "stage 1 F0 [2, 3] B0 [3, 5] F1 [5, 6] B1 [6, 8]");
        EXPECT(replay.makespan == 13.0 && fabs(replay.idle_share[0] - 1.0 / 13) < 1e-15 &&
                   fabs(replay.idle_share[1] - 7.0 / 13) < 1e-15,
               "1f1b: the step takes 13 s; stage 0 idles 1/13 of it, stage 1 7/13 (got %g s, %.6f, %.6f)",
               replay.makespan, replay.idle_share[0], replay.idle_share[1]);
        replay_free(&replay);
    }
    schedule_free(&schedule);
}

// A GPipe schedule of P = 2, M = 2 with stage `stage`'s list replaced.
static Schedule edited(int stage, const Action list[4]) {
    Schedule schedule = schedule_new(SCHEDULE_GPIPE, 2, 2);
    memcpy(schedule.actions + stage * 4, list, 4 * sizeof(Action));
    return schedule;
}

static void expect_invalid(int stage, const Action list[4], const char *reason) {
    Schedule schedule = edited(stage, list);
    char why[256] = "", replay_why[256] = "";
    bool valid = schedule_valid(&schedule, why, sizeof why);
    EXPECT(!valid && strcmp(why, reason) == 0, "invalid: %s (got %s: %s)", reason, valid ? "valid" : "invalid", why);
    Replay replay;
    const double seconds[] = {1.0, 1.0};
    bool ran = schedule_replay(&schedule, seconds, seconds, &replay, replay_why, sizeof replay_why);
    EXPECT(!ran && strcmp(replay_why, reason) == 0 && replay.intervals == NULL && replay.idle_share == NULL,
           "the replay refuses it for the same reason, and leaves nothing to free (got %s: %s)",
           ran ? "replayed" : "refused", replay_why);
    if (ran) replay_free(&replay);
    schedule_free(&schedule);
}

static Action forward(int micro_batch) { return (Action){ACTION_FORWARD, micro_batch}; }
static Action backward(int micro_batch) { return (Action){ACTION_BACKWARD, micro_batch}; }

static void test_broken_schedules(void) {
    expect_invalid(0, (Action[]){backward(0), forward(0), forward(1), backward(1)}, "stage 0, action 0: B0 before F0");
    expect_invalid(1, (Action[]){forward(1), forward(0), backward(0), backward(1)},
                   "stage 1, action 0: F1 before F0 (forwards run in micro-batch order)");
    expect_invalid(1, (Action[]){forward(0), forward(1), backward(1), backward(0)},
                   "stage 1, action 2: B1 before B0 (backwards run in micro-batch order)");
    expect_invalid(0, (Action[]){forward(0), forward(0), backward(0), backward(1)}, "stage 0, action 1: F0 again");
    expect_invalid(0, (Action[]){forward(0), forward(2), backward(0), backward(1)},
                   "stage 0, action 1: F2, of micro-batches 0-1");

    // Each list alone is valid, together they wait for each other: stage 0
    // wants B0's gradient before it forwards micro-batch 1, and stage 1
    // wants micro-batch 1 before it runs B0. The check sees one stage at a
    // time, so only the replay can tell.
    Schedule schedule = edited(0, (Action[]){forward(0), backward(0), forward(1), backward(1)});
    char why[256] = "";
    bool valid = schedule_valid(&schedule, why, sizeof why);
    EXPECT(valid, "stage 0 F0 B0 F1 B1 and stage 1 F0 F1 B0 B1: each list is valid (%s)", valid ? "yes" : why);
    Replay replay;
    const double seconds[] = {1.0, 1.0};
    bool ran = schedule_replay(&schedule, seconds, seconds, &replay, why, sizeof why);
    const char *deadlock = "deadlock: stage 0 waits at B0 for stage 1's B0; stage 1 waits at F1 for stage 0's F1";
    EXPECT(!ran && strcmp(why, deadlock) == 0, "together they deadlock: %s (got %s: %s)", deadlock,
           ran ? "replayed" : "refused", why);
    if (ran) replay_free(&replay);
    // max_in_flight reads the list it is given: this stage 0 holds one.
    EXPECT(schedule_max_in_flight(&schedule, 0) == 1 && schedule_max_in_flight(&schedule, 1) == 2,
           "stage 0 of that schedule holds 1 micro-batch at most, stage 1 2 (got %d, %d)",
           schedule_max_in_flight(&schedule, 0), schedule_max_in_flight(&schedule, 1));
    schedule_free(&schedule);
}

int main(void) {
    test_names();
    test_lists_by_hand();
    test_format();
    test_every_small_pipeline();
    test_unequal_stages();
    test_broken_schedules();
    return test_summary();
}
