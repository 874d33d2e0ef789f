// lr_schedule.c: warm-up, then cosine decay. See lr_schedule.h.
#include "train/lr_schedule.h"

#include <math.h>

double lr_at(const LrSchedule *s, int it) {
    if (!s->decay) return s->lr;
    if (it < s->warmup_iters) return s->lr * (it + 1) / (s->warmup_iters + 1);
    if (it > s->lr_decay_iters || s->lr_decay_iters <= s->warmup_iters) return s->min_lr;  // (no decay phase: none to take)
    double decay_ratio = (double)(it - s->warmup_iters) / (s->lr_decay_iters - s->warmup_iters);
    double coeff = 0.5 * (1.0 + cos(M_PI * decay_ratio));  // from 1 down to 0
    return s->min_lr + coeff * (s->lr - s->min_lr);
}
