// reference_ce.h: the cross-entropy the unit tests check the library's against
// (tests/unit/test_nn.c) and take finite differences of (tests/unit/test_cnn.c).
#pragma once
#include <math.h>
#include <stddef.h>

// mean over rows of -log softmax(z)[label], by log-sum-exp in double: finite
// differences of it see only the forward's float rounding, not the loss's
// (whose ulp at 2.3 would be 5e-5 of a difference at h = 1e-3).
static inline double reference_ce(const float *z, const int *labels, int rows, int cols) {
    double total = 0;
    for (int r = 0; r < rows; r++) {
        const float *row = z + (size_t)r * cols;
        double max = row[0], sum = 0;
        for (int c = 1; c < cols; c++) max = fmax(max, row[c]);
        for (int c = 0; c < cols; c++) sum += exp(row[c] - max);
        total += (max - row[labels[r]]) + log(sum);
    }
    return total / rows;
}
