// divergence.c: a diverged training ends on every rank, with one line. See divergence.h.
#include "train/divergence.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"
#include "base/check.h"
#include "tensor/tensor.h"

// "nan", "inf" or "-inf": printf's "-nan" depends on the sign bit a kernel happened to leave, and a
// guide shows this line.
static const char *nonfinite_word(double value) {
    return isnan(value) ? "nan" : value > 0 ? "inf" : "-inf";
}

// The value of --name as the command line set it (its default otherwise), or NULL where the last
// args_parse had no such flag.
static const char *flag_value(const char *name) {
    ArgValues flags = args_values();
    for (int i = 0; i < flags.count; i++)
        if (strcmp(flags.names[i], name) == 0) return flags.values[i];
    return NULL;
}

// Every rank stops here together: each has reached the same verdict at the same point (divergence.h).
__attribute__((noreturn)) static void stop_diverged(const char *what_and_when, Tracking *run) {
    // The likely cause first: a learning rate (or an L2 weight) that throws the weights past float's
    // range. Both are named with the values this run has, as typed or defaulted.
    const char *lr = flag_value("lr"), *weight_decay = flag_value("weight_decay");
    char cause[160];
    if (lr && weight_decay && strtod(weight_decay, NULL) != 0.0)
        snprintf(cause, sizeof cause, "--lr %s or --weight_decay %s is", lr, weight_decay);
    else if (lr)
        snprintf(cause, sizeof cause, "--lr %s is", lr);
    else
        snprintf(cause, sizeof cause, "the learning rate is");
    const char *other_causes = args_given("init") ? "the data or --init's weights hold" : "the data holds";
    char message[512];
    snprintf(message, sizeof message,
             "%s: training diverged; %s likely too large (or %s extreme values); stopped before writing anything: "
             "files already there are kept",
             what_and_when, cause, other_causes);
    tracking_end(run, TRACKING_FAILED);  // rank 0's run (NULL elsewhere): FAILED, with the losses before this one
    check_all_ranks(false, message);     // rank 0 prints the line; every rank exits 1
    abort();                             // not reached: check_all_ranks exits when a rank failed
}

// " (epoch 3)", or nothing for a program that counts only steps (epoch 0).
static const char *epoch_note(char *out, size_t size, int epoch) {
    if (epoch > 0) snprintf(out, size, " (epoch %d)", epoch);
    else out[0] = '\0';
    return out;
}

static void stop_at_step(const char *what, double value, long step, int epoch, Tracking *run) {
    char what_and_when[160], note[32];
    snprintf(what_and_when, sizeof what_and_when, "%s is %s at step %ld%s", what, nonfinite_word(value), step,
             epoch_note(note, sizeof note, epoch));
    stop_diverged(what_and_when, run);
}

void check_loss_finite(double loss, long step, int epoch, Tracking *run) {
    if (!isfinite(loss)) stop_at_step("loss", loss, step, epoch, run);
}

void check_loss_finite_agreed(double loss, long step, int epoch, Tracking *run) {
    // The loss itself travels (MPI_SUM of doubles): a NaN or inf anywhere makes the sum non-finite,
    // and the line can then name what the first rank to diverge saw only approximately; the
    // verdict is what matters. One allreduce of 8 bytes per step.
    double sum = loss;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    if (!isfinite(sum)) stop_at_step("loss", isfinite(loss) ? sum : loss, step, epoch, run);
}

void check_result_finite(double value, const char *what, int epoch, Tracking *run) {
    // Collective, where a result may be rank 0's alone (a reduce to rank 0): one allreduce of an int
    // per evaluation.
    int any_bad = !isfinite(value);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (!any_bad) return;
    char what_and_when[160], when[32] = "";
    if (epoch > 0) snprintf(when, sizeof when, " after epoch %d", epoch);  // (0: a program that counts steps, whose `what` says when)
    snprintf(what_and_when, sizeof what_and_when, "%s is %s%s", what, isfinite(value) ? "not finite" : nonfinite_word(value),
             when);
    stop_diverged(what_and_when, run);
}

void check_weights_finite(const Param *params, int n_params, long steps, int epochs, Tracking *run) {
    int bad_param = -1;  // the first of this rank's tensors that holds a value that is not finite
    double bad_value = 0.0;
    for (int i = 0; i < n_params && bad_param < 0; i++) {
        size_t n = tensor_numel(params[i].value);
        float *host = tensor_on_gpu(params[i].value) ? xmalloc(n * sizeof(float) + 1) : params[i].value->data;
        if (host != params[i].value->data) tensor_to_host(params[i].value, host);
        for (size_t k = 0; k < n; k++)
            if (!isfinite(host[k])) {
                bad_param = i, bad_value = host[k];
                break;
            }
        if (host != params[i].value->data) free(host);
    }
    int any_bad = bad_param >= 0;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (!any_bad) return;
    // The lowest failing rank prints (check_all_ranks): its tensor is named; others see only "a weight".
    char what_and_when[192], note[32];
    epoch_note(note, sizeof note, epochs);
    if (bad_param >= 0)
        snprintf(what_and_when, sizeof what_and_when, "weight '%s' holds %s after step %ld%s", params[bad_param].name,
                 nonfinite_word(bad_value), steps, note);
    else
        snprintf(what_and_when, sizeof what_and_when, "another rank's weights hold values that are not finite after "
                 "step %ld%s", steps, note);
    stop_diverged(what_and_when, run);
}
