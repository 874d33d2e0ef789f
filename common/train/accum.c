// accum.c: micro-batches of gradient accumulation. See accum.h.
#include "train/accum.h"

int rows_in_batches(int samples, int batch_size, int first, int end) {
    long last = (long)end * batch_size < samples ? (long)end * batch_size : samples;
    return (int)(last - (long)first * batch_size);
}

MicroBatch micro_batch(int b, int accum_steps, int samples, int batch_size) {
    long n_batches = ((long)samples + batch_size - 1) / batch_size;  // long: no sum here can overflow
    int first = b - b % accum_steps;  // the step's micro-batches: [first, end)
    int end = (int)((long)first + accum_steps < n_batches ? (long)first + accum_steps : n_batches);
    int rows = rows_in_batches(samples, batch_size, b, b + 1);
    int step_rows = rows_in_batches(samples, batch_size, first, end);
    return (MicroBatch){.first = b == first, .last = b + 1 == end, .weight = (float)rows / (float)step_rows};
}
