// timer.h: wall-clock time in seconds (monotonic, so NTP steps do not bite).
#pragma once
#include <time.h>

static inline double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
