// tracking.h: the run's record in MLflow, kept by rank 0, as mlflow's Python client keeps it.
//
//   TrainOptions opt = ...;                                   // TRAIN_FLAGS has --mlflow, --experiment, --run_name
//   args_parse(...);
//   Tracking *run = tracking_start(&opt.tracking, "day1/6_mnist_ddp.c", device_name(device), NULL, args_values());
//                                                             // mlflow.start_run(); mlflow.log_params(vars(args))
//                                                             // (but for the three flags above)
//   tracking_log_metric(run, "loss", loss, step);             // mlflow.log_metric("loss", loss, step=step)
//   tracking_log_artifact(run, opt.plot);                     // mlflow.log_artifact(path)
//   tracking_end(run, TRACKING_FINISHED);                     // mlflow.end_run()
//
// Where the run goes, as MLflow's clients decide (flag first, then the environment):
//   --mlflow URI or $MLFLOW_TRACKING_URI    http(s)://host:port: a tracking server, through its REST API
//                                           (mlflow_rest_store.c); file:PATH or a plain path: an `mlruns`
//                                           folder that `mlflow ui --backend-store-uri PATH` reads
//                                           (mlflow_file_store.c); unset: no tracking, and no cost
//   --experiment NAME or $MLFLOW_EXPERIMENT_NAME   created if missing ("Default" otherwise)
//   --run_name NAME                         MLflow's mlflow.runName tag (the program and world size otherwise)
//
// What it costs the training: nothing on the other ranks, and on rank 0 a lock and a copy per call. A
// thread of its own sends what was logged in batches, a second apart; a server that fails mid-run gets
// bounded retries with backoff ($MLFLOW_HTTP_REQUEST_MAX_RETRIES, _BACKOFF_FACTOR, _TIMEOUT: MLflow's
// own variables), then one warning line, and the training goes on to the same result: tracking never
// changes a result or ends a run. The end of the run (tracking_end) waits for the store 1.5 request
// timeouts in all (15 s by default), however many requests were due and whatever the server does (it
// hangs, drips its answers, streams without end, asks for an hour's pause). Only at the start is it
// allowed to stop the job: a bad URI or a server that does not answer is one line and exit 2 on every
// rank, before any training.
//
// How a run ends: tracking_end's status (FINISHED, or KILLED after a stop signal). A fatal error on rank
// 0 marks it FAILED (check.h's fatal hook), and SIGTERM or SIGINT marks it KILLED before the signal
// takes effect (mpirun sends SIGTERM when another rank dies; Slurm at the time limit). A restart that
// resumes the run (step 13 keeps the run id in its snapshot) sets it RUNNING again and sends what the
// store lacks: the params (a first start killed before it sent them), and every metric value the
// program logs again from its snapshot or replays after it, unless the store holds that step already
// (an exact resume's values are the same values): a run killed by SIGKILL with values queued ends
// complete, each step once. What the program cannot log again (a timing the snapshot does not keep),
// it names with tracking_metric_lost, and the end's last line says which of those the run lacks.
#pragma once
#include <stdbool.h>

#include "base/args.h"  // ArgValues: the params; ARG_STRING: TRACKING_FLAGS' rows

typedef struct {
    const char *uri;         // --mlflow; NULL: $MLFLOW_TRACKING_URI, and if unset no tracking
    const char *experiment;  // --experiment; NULL: $MLFLOW_EXPERIMENT_NAME, else "Default"
    const char *run_name;    // --run_name; NULL: the program's name and world size
} TrackingOptions;

// The three flags, for a program's ArgSpec table (TRAIN_FLAGS has them).
#define TRACKING_FLAGS(t)                                                                                        \
    {"mlflow", ARG_STRING, &(t).uri, "URI", "log the run to MLflow: http(s)://server:port, or an mlruns folder; without it $MLFLOW_TRACKING_URI, if set", 0, NULL}, \
    {"experiment", ARG_STRING, &(t).experiment, "NAME", "MLflow experiment, created if missing; without it $MLFLOW_EXPERIMENT_NAME, else Default", 0, NULL}, \
    {"run_name", ARG_STRING, &(t).run_name, "NAME", "MLflow run name; without it, the program and its world size", 0, NULL}

typedef enum { TRACKING_FINISHED, TRACKING_FAILED, TRACKING_KILLED } TrackingStatus;

typedef struct Tracking Tracking;  // NULL or not, every call below takes it; NULL does nothing

// Collective. With a tracking URI, rank 0 creates the run (or, given `resume_run_id`, sets that run
// RUNNING again and learns which steps and params it already holds), logs `params` (the flags that
// args_parse read: args_values()) and the run's tags (host, world size, nodes, device, BLAS, mlflow.source.name = `program`, the
// git commit), and starts its sender thread; the other ranks get NULL. Without one, every rank gets NULL.
// A URI that is not one, or a server that refuses or does not answer: one line naming it, exit 2 on every
// rank. A resume_run_id the store does not know starts a new run and says so. The params are every flag
// but --mlflow, --experiment and --run_name (where the run goes, not what it is: the experiment and the
// name are the run's own fields, and a server's URI may hold a password), and world_size; they are sent
// before this returns (a resumed run's: those its store lacked), so that no kill loses them.
Tracking *tracking_start(const TrackingOptions *options, const char *program, const char *device,
                         const char *resume_run_id, ArgValues params);

// The run's id (32 hex digits), for a snapshot; "" for NULL.
const char *tracking_run_id(const Tracking *run);

// A value this run measured before a restart, which the restarted process cannot log again (a timing
// that the snapshot does not keep): if the store lacks it, tracking_end's last line names it.
void tracking_metric_lost(Tracking *run, const char *key, long step);

// mlflow.log_param: a name and its value as text. mlflow.set_tag: the same for a tag.
void tracking_log_param(Tracking *run, const char *key, const char *value);
void tracking_set_tag(Tracking *run, const char *key, const char *value);
// mlflow.log_metric(key, value, step): stamped now, sent within a second or so.
void tracking_log_metric(Tracking *run, const char *key, double value, long step);
// mlflow.log_artifact(path): the file as it is when sent (before tracking_end returns), under the run's
// artifacts with its own name. NULL or "" path: nothing.
void tracking_log_artifact(Tracking *run, const char *path);

// mlflow.end_run(status): sends what is left and the artifacts, sets the status and end time, within
// 1.5 request timeouts in all (a server that hangs costs that, no more), stops the thread and frees the
// run. What failed, its last line says "may not have reached" the server (a folder: "not written to" it,
// exactly, metric by metric and step by step); then, what the run lacks for good (tracking_metric_lost).
void tracking_end(Tracking *run, TrackingStatus status);
