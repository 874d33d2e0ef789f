// metrics.h: a classifier's evaluation, as the tutorial's Trainer reports it.
//
//   ConfusionMatrix cm = confusion_new(10);
//   confusion_add(&cm, labels, predictions, n);    // counts[true][predicted]++
//   classification_report(&cm, text, sizeof text); // sklearn.metrics.classification_report
//   confusion_table(&cm, text, sizeof text);       // sklearn.metrics.confusion_matrix, as a table
//
// For class c: precision = TP / (TP + FP) (of the images predicted c, the
// share that are c), recall = TP / (TP + FN) (of the images of c, the share
// found), F1 = their harmonic mean 2 P R / (P + R). A ratio with nothing to
// divide by is 0, as sklearn's zero_division=0.
#pragma once
#include <stddef.h>

typedef struct {
    int classes;
    long *counts;  // [classes * classes]: counts[true * classes + predicted]
} ConfusionMatrix;

ConfusionMatrix confusion_new(int classes);
void confusion_free(ConfusionMatrix *cm);
// Count n (label, prediction) pairs; both must be classes (0 .. classes-1).
void confusion_add(ConfusionMatrix *cm, const int *labels, const int *predictions, int n);
long confusion_total(const ConfusionMatrix *cm);
long confusion_correct(const ConfusionMatrix *cm);

typedef struct {
    double precision, recall, f1;
    long support;  // images of the class
} ClassMetrics;
ClassMetrics class_metrics(const ConfusionMatrix *cm, int c);

// The table, one line per class, then accuracy, macro and weighted averages:
//   class  precision  recall  f1-score  support
//       0     0.9888  0.9949    0.9919      980
//   ...
// Returns the characters written (as snprintf: more than size when cut).
int classification_report(const ConfusionMatrix *cm, char *out, size_t size);
// Rows: the true class; columns: the predicted one.
int confusion_table(const ConfusionMatrix *cm, char *out, size_t size);
