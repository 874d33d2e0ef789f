// lr_schedule.h: nanoGPT's learning rate, iteration by iteration (train.py's get_lr).
//
// A linear warm-up over warmup_iters (lr * (it + 1) / (warmup_iters + 1)), then a cosine decay from
// lr to min_lr at lr_decay_iters, and min_lr after that. With decay off, lr throughout.
#pragma once
#include <stdbool.h>

typedef struct {
    double lr, min_lr;
    int warmup_iters, lr_decay_iters;
    bool decay;
} LrSchedule;

double lr_at(const LrSchedule *schedule, int iteration);
