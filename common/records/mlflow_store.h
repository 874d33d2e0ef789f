// mlflow_store.h: where tracking.c puts a run, behind one interface: an `mlruns` folder
// (mlflow_file_store.c) or a tracking server's REST API (mlflow_rest_store.c).
//
// A store only moves records; it never retries, waits or prints. tracking.c owns the policy: which
// call is retried and how often, what is said once, what is given up.
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef enum { RECORD_METRIC, RECORD_PARAM, RECORD_TAG } RecordKind;

typedef struct {
    RecordKind kind;
    char *key;
    char *value;              // params and tags
    double number;            // metrics
    long step;                // metrics
    long long timestamp_ms;   // metrics: when logged
    bool stored;              // set by a store once the record is durable there (log_batch)
} TrackingRecord;

// What a run already holds, for a resumed run: the steps of each of its metrics and the keys of its
// params. A resume sends only what the store lacks (MLflow keeps a value sent twice twice, and refuses a
// param sent again with another value), and the store may lack anything: a process killed by SIGKILL
// loses what it had queued, before or after its last snapshot.
typedef struct {
    char *key;
    long *steps;  // ascending, each once
    int n_steps;
} HeldMetric;

typedef struct {
    HeldMetric *metrics;
    int n_metrics;
    char **params;
    int n_params;
} RunHoldings;

// Adds `step` to `key`'s steps (a store's resume_run fills the holdings with it); the steps stay sorted
// and each once, whatever order they come in.
void run_holdings_add_step(RunHoldings *held, const char *key, long step);
void run_holdings_add_param(RunHoldings *held, const char *key);
bool run_holdings_has_step(const RunHoldings *held, const char *key, long step);
bool run_holdings_has_param(const RunHoldings *held, const char *key);
void run_holdings_free(RunHoldings *held);

typedef enum {
    STORE_OK,
    STORE_RETRY,    // might work later: no connection, a timeout, a 5xx or 429 answer, a full disk
    STORE_REFUSED,  // will not work again: a 4xx answer, a name the store rejects
} StoreResult;

// MLflow's run statuses, with the names its REST API and FileStore use.
typedef enum { RUN_RUNNING = 1, RUN_FINISHED = 3, RUN_FAILED = 4, RUN_KILLED = 5 } RunStatus;
const char *run_status_name(RunStatus status);  // "RUNNING", "FINISHED", ...

// Both stores' way of failing: `fmt` into `error`, and `result` returned.
StoreResult store_failed(StoreResult result, char *error, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// `path` into `folder` (made if missing) under its own name, through a temporary file in `temp_dir` (on
// the same filesystem, and not a folder MLflow lists artifacts from) renamed into place: a reader never
// sees half a file. Both stores' way of writing an artifact to a folder.
StoreResult store_copy_artifact(const char *path, const char *temp_dir, const char *folder, char *error, size_t size);

typedef struct MlflowStore MlflowStore;
typedef struct {
    // Finds the experiment by name (creating it if missing) and creates a run in it, RUNNING, with
    // its name and the tags among `tags`; fills run_id (32 hex digits and a NUL).
    StoreResult (*create_run)(MlflowStore *store, const char *experiment, const char *run_name,
                              long long start_ms, const TrackingRecord *tags, int n_tags, char run_id[33],
                              char *error, size_t size);
    // Sets an existing run RUNNING again and fills `held` (empty on entry; the caller frees it) with
    // every step of each of its metrics and its params' keys. *found is false for a run the store does
    // not know.
    StoreResult (*resume_run)(MlflowStore *store, const char *run_id, bool *found, RunHoldings *held,
                              char *error, size_t size);
    // Marks each record it has made durable `stored`, and skips one so marked: a batch that failed part
    // way (a folder's store writes a file per key; the disk filled at the third) and is tried again
    // writes the rest only, never a metric line twice; what stays unmarked is what the store lacks.
    StoreResult (*log_batch)(MlflowStore *store, const char *run_id, TrackingRecord *records, int n,
                             char *error, size_t size);
    StoreResult (*log_artifact)(MlflowStore *store, const char *run_id, const char *path, char *error,
                                size_t size);
    // end_ms 0: no end time (RUNNING).
    StoreResult (*set_status)(MlflowStore *store, const char *run_id, RunStatus status, long long end_ms,
                              char *error, size_t size);
    void (*close)(MlflowStore *store);
    // Whether a failed call's outcome is known: a folder's store knows what it wrote (a call that failed
    // wrote nothing but the records it marked), a server's does not (a request that got no answer may
    // still have reached it).
    bool knows_outcome;
    // How many records log_batch takes at most, in all and of each kind (the REST API's limits).
    int max_batch, max_params, max_tags;
} MlflowStoreOps;

struct MlflowStore {
    const MlflowStoreOps *ops;
    // Set by tracking.c, read by a server's store: the longest one request may take (0: 10 s); a flag
    // that, once non-zero, ends a request under way (a signal came: its grace is short); and a deadline
    // (wall_seconds(); 0: none), from another thread too, past which no request starts and at which one
    // under way ends (the end of a run is bounded in all). A folder's store needs none of them: its
    // calls do not wait on anyone.
    double timeout_s;
    const volatile int *cancel;
    _Atomic double deadline;
    // Set by a server's store with each STORE_RETRY: the seconds its answer asked us to wait before
    // trying again (HTTP's Retry-After, given in seconds or as a date), 0 where it asked nothing.
    double retry_after;
};

// A folder in MLflow's FileStore layout (made if missing). NULL with a message if it cannot be.
MlflowStore *mlflow_file_store_open(const char *folder, char *error, size_t size);
// A tracking server, http:// or https://. Returns NULL with a message where this build has no HTTP
// client (libcurl and cJSON); answers nothing yet: create_run is the first request.
MlflowStore *mlflow_rest_store_open(const char *url, char *error, size_t size);
