// loss_log.h: the loss of every optimizer step, as CSV and as a PNG curve.
//
//   LossLog log = {0};
//   loss_log_add(&log, epoch, loss);                 // once per step
//   loss_log_write_csv(&log, "losses.csv");          // step,epoch,loss
//   loss_log_plot(&log, "img/loss.png", "title", "1 process");
#pragma once

typedef struct {
    int n, capacity;
    int *epoch;   // [n]
    float *loss;  // [n]
} LossLog;

void loss_log_add(LossLog *log, int epoch, float loss);
void loss_log_free(LossLog *log);
// CSV with the header "step,epoch,loss"; step and epoch count from 0.
void loss_log_write_csv(const LossLog *log, const char *path);
// Loss against step; `label` names the curve in the legend.
void loss_log_plot(const LossLog *log, const char *path, const char *title, const char *label);

// Read a CSV written by loss_log_write_csv (e.g. step 2's --losses). A missing
// or malformed file is a usage error naming it: every rank reads it alike.
LossLog loss_log_read_csv(const char *path, const char *flag);
// Each step's place on an epoch axis, into x[log->n]: step k of an epoch of n
// steps sits at epoch + (k + 1) / n, so that the last step of epoch e (counted
// from 0) is at e + 1, where a test after that epoch is plotted.
void loss_log_epoch_positions(const LossLog *log, float *x);
// Several runs on one chart, against epochs (loss_log_epoch_positions), so runs
// with different global batches line up.
void loss_log_plot_epochs(const LossLog *logs, const char *const *labels, int n_logs, const char *path,
                          const char *title);
