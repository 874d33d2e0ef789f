// timer.h: wall-clock time in seconds (monotonic, so NTP steps do not bite).
#pragma once
#include <time.h>

// Milliseconds since 1970 (the real clock, which can step): a timestamp for others to read, as MLflow's.
static inline long long epoch_milliseconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
