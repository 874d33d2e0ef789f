// step_losses.c: see step_losses.h.
#include "train/step_losses.h"

#include <stdlib.h>

#include "base/check.h"

StepLosses step_losses_new(int capacity, Device device) {
    CHECK(capacity > 0, "step_losses_new: room for %d losses", capacity);
    StepLosses losses = {.device = device, .capacity = capacity};
    if (device == DEVICE_CUDA) {
        losses.values = device_alloc((size_t)capacity * sizeof(float));
        losses.host = device_host_alloc((size_t)capacity * sizeof(float));
    } else {
        losses.values = losses.host = xmalloc((size_t)capacity * sizeof(float));
    }
    return losses;
}

LossSlot step_losses_next_share(StepLosses *losses, float weight, bool first) {
    if (first) {
        CHECK(losses->written < losses->capacity, "step_losses: more than %d losses before one was read",
              losses->capacity);
        losses->written++;
    }
    CHECK(losses->written > losses->taken, "step_losses: a micro-batch's share before the first of its step");
    return (LossSlot){.value = losses->values + losses->written - 1, .weight = weight, .accumulate = !first};
}

LossSlot step_losses_next(StepLosses *losses) { return step_losses_next_share(losses, 1.0f, true); }

// The losses written since the last copy, on the host: on a GPU rank one copy, one wait.
static void bring_to_host(StepLosses *losses) {
#if HAVE_CUDA
    if (losses->device == DEVICE_CUDA && losses->on_host < losses->written)
        device_read_to_host(losses->host + losses->on_host, losses->values + losses->on_host,
                            (size_t)(losses->written - losses->on_host) * sizeof(float), "the steps' losses");
#endif
    losses->on_host = losses->written;
}

bool step_losses_take(StepLosses *losses, bool due, float *loss) {
    if (losses->taken == losses->written) {
        losses->written = losses->on_host = losses->taken = 0;
        return false;
    }
    if (losses->taken == losses->on_host) {
        if (losses->device == DEVICE_CUDA && !due) return false;
        bring_to_host(losses);
    }
    *loss = losses->host[losses->taken++];
    return true;
}

int step_losses_take_all(StepLosses *losses, bool due, float **taken) {
    *taken = losses->host;
    if (losses->taken == losses->written || (losses->device == DEVICE_CUDA && !due)) return 0;
    bring_to_host(losses);
    int first = losses->taken, n = losses->written - first;
    *taken = losses->host + first;
    // All handed over: the next step writes from the first slot again (the host copy it overwrites
    // is the one handed over now, which the caller reads before that step).
    losses->written = losses->on_host = losses->taken = 0;
    return n;
}

void step_losses_free(StepLosses *losses) {
    if (losses->device == DEVICE_CUDA) {
        device_free(losses->values);
        device_host_free(losses->host);
    } else {
        free(losses->values);
    }
    *losses = (StepLosses){0};
}
