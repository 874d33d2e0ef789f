// metrics.c: confusion matrix, per-class precision, recall and F1. See metrics.h.
#include "train/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/check.h"

ConfusionMatrix confusion_new(int classes) {
    CHECK(classes > 0, "a confusion matrix of %d classes", classes);
    return (ConfusionMatrix){.classes = classes, .counts = xcalloc((size_t)classes * classes, sizeof(long))};
}

void confusion_free(ConfusionMatrix *cm) {
    free(cm->counts);
    *cm = (ConfusionMatrix){0};
}

void confusion_add(ConfusionMatrix *cm, const int *labels, const int *predictions, int n) {
    for (int i = 0; i < n; i++) {
        CHECK(labels[i] >= 0 && labels[i] < cm->classes && predictions[i] >= 0 && predictions[i] < cm->classes,
              "confusion matrix: label %d, prediction %d, of %d classes", labels[i], predictions[i], cm->classes);
        cm->counts[labels[i] * cm->classes + predictions[i]]++;
    }
}

long confusion_total(const ConfusionMatrix *cm) {
    long total = 0;
    for (int i = 0; i < cm->classes * cm->classes; i++) total += cm->counts[i];
    return total;
}

long confusion_correct(const ConfusionMatrix *cm) {
    long correct = 0;
    for (int c = 0; c < cm->classes; c++) correct += cm->counts[c * cm->classes + c];
    return correct;
}

static double ratio(long a, long b) { return b > 0 ? (double)a / (double)b : 0.0; }

ClassMetrics class_metrics(const ConfusionMatrix *cm, int c) {
    long true_positive = cm->counts[c * cm->classes + c], predicted = 0, actual = 0;
    for (int k = 0; k < cm->classes; k++) {
        predicted += cm->counts[k * cm->classes + c];  // column c
        actual += cm->counts[c * cm->classes + k];     // row c
    }
    ClassMetrics m = {.precision = ratio(true_positive, predicted), .recall = ratio(true_positive, actual),
                      .support = actual};
    m.f1 = m.precision + m.recall > 0 ? 2 * m.precision * m.recall / (m.precision + m.recall) : 0.0;
    return m;
}

// snprintf that appends at *len, and keeps counting past the end as snprintf does.
__attribute__((format(printf, 4, 5))) static void append(char *out, size_t size, int *len, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    size_t at = (size_t)*len < size ? (size_t)*len : size;
    *len += vsnprintf(out + at, size - at, fmt, args);
    va_end(args);
}

int classification_report(const ConfusionMatrix *cm, char *out, size_t size) {
    int len = 0;
    if (size) out[0] = '\0';
    append(out, size, &len, "%12s  %9s  %9s  %9s  %7s\n", "class", "precision", "recall", "f1-score", "support");
    double macro[3] = {0}, weighted[3] = {0};
    long total = confusion_total(cm);
    for (int c = 0; c < cm->classes; c++) {
        ClassMetrics m = class_metrics(cm, c);
        append(out, size, &len, "%12d  %9.4f  %9.4f  %9.4f  %7ld\n", c, m.precision, m.recall, m.f1, m.support);
        double values[3] = {m.precision, m.recall, m.f1};
        for (int k = 0; k < 3; k++) {
            macro[k] += values[k] / cm->classes;
            weighted[k] += values[k] * ratio(m.support, total);
        }
    }
    append(out, size, &len, "%12s  %9s  %9s  %9.4f  %7ld\n", "accuracy", "", "", ratio(confusion_correct(cm), total),
           total);
    append(out, size, &len, "%12s  %9.4f  %9.4f  %9.4f  %7ld\n", "macro avg", macro[0], macro[1], macro[2], total);
    append(out, size, &len, "%12s  %9.4f  %9.4f  %9.4f  %7ld\n", "weighted avg", weighted[0], weighted[1],
           weighted[2], total);
    return len;
}

int confusion_table(const ConfusionMatrix *cm, char *out, size_t size) {
    int len = 0;
    if (size) out[0] = '\0';
    append(out, size, &len, "%12s", "true \\ pred");
    for (int p = 0; p < cm->classes; p++) append(out, size, &len, " %5d", p);
    append(out, size, &len, "\n");
    for (int t = 0; t < cm->classes; t++) {
        append(out, size, &len, "%12d", t);
        for (int p = 0; p < cm->classes; p++) append(out, size, &len, " %5ld", cm->counts[t * cm->classes + p]);
        append(out, size, &len, "\n");
    }
    return len;
}
