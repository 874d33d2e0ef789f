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
