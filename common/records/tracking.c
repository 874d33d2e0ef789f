// tracking.c: the run's record in MLflow, kept by rank 0 off the training's critical path. See tracking.h.
//
// The training thread only appends to a queue under a lock. A sender thread wakes when 500 records
// wait, or a second after the first of them, takes the whole queue and hands it to the store in batches
// within the store's limits. Every store call goes through send(), which owns the policy:
//   - a call that may work later (no answer, a timeout, a 5xx) is tried again after 0.5, 1, 2 s
//     (MLFLOW_HTTP_REQUEST_MAX_RETRIES, default 3; MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR, default 0.5),
//     or after the pause the server asked for (Retry-After) up to RETRY_AFTER_CAP, 30 s; a longer one
//     is not waited for, and the call has failed; when the tries are spent, one warning line, and from
//     then on each call gets one try; the first call that succeeds again says so;
//   - the end of the run (tracking_end) has a deadline, 1.5 request timeouts after it begins, that no
//     call, retry or pause passes: a server that hangs, drips, streams without end or asks for a long
//     pause costs the end 15 s at most (MLflow's default timeout, 10 s), whatever was due, and the
//     last line says what may not have reached it (a folder's store: exactly what was not written);
//   - a call the store refuses (a 4xx answer: MLflow's error_code and message) is said once and dropped.
// Nothing here ends the run or changes it, except at the start (tracking_start), where a URI that does
// not work is one line and exit 2 on every rank.
#include "records/tracking.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <pwd.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "base/paths.h"
#include "base/timer.h"
#include "records/mlflow_store.h"
#include "runtime/dist.h"
#include "runtime/threads.h"

enum { BATCH_WAKE = 500 };  // records that wake the sender before its second is up
// The end of a run (tracking_end) waits for the store this many request timeouts in all.
static const double END_TIMEOUTS = 1.5;
// A server that answers 429 or 503 may say when to try again (Retry-After): a pause up to this long
// is taken instead of the backoff's; a longer one (an hour, say) is not waited for, and the request
// counts as failed then and there.
static const double RETRY_AFTER_CAP = 30;

struct Tracking {
    MlflowStore *store;
    char run_id[33];
    char where[PATH_MAX];          // the URI, for messages
    pthread_mutex_t store_lock;    // one store call at a time: the sender, the end, the fatal hook
    pthread_mutex_t queue_lock;
    sem_t wake;                    // posted by producers, tracking_end and the signal handler
    pthread_t sender;
    TrackingRecord *queue;
    int n_queued, capacity;
    bool closing;                  // under queue_lock
    char **artifacts;
    int n_artifacts;
    RunHoldings held;              // a resumed run's steps and params in the store: not sent again
    TrackingRecord *unrecoverable; // values a restart cannot log again (tracking_metric_lost): the end
    int n_unrecoverable;           // names those the store lacks
    // send()'s state: the sender thread and, after it ended, tracking_end.
    int max_retries;
    double backoff;
    bool degraded;                 // retries spent (or no time for them): one try per call from now on
    bool warned;                   // the failure's one warning line is out
    long dropped;                  // records lost while degraded or refused (those a store did not mark stored)
    RunHoldings lost;              // ... of them, the metrics' keys and steps, for the messages
    long lost_params, lost_tags;   // ... and how many params and tags
    int lost_artifacts;
    bool unanswered;               // something was dropped for want of an answer (not refused): the
                                   // run may lack it, so the end does not mark it FINISHED
    bool lost_status;
    bool said_refused;
    bool out_of_time;              // the end's deadline passed with something not sent
    double request_timeout;        // MLFLOW_HTTP_REQUEST_TIMEOUT: the end's bound is 1.5 times it
    atomic_bool status_set;        // a final status went out (the fatal hook or the signal, then the end)
    atomic_bool fatal;             // a fatal error: the hook's store call may not wait for the store
};

static Tracking *g_run;  // the fatal hook's and the signal handler's run (rank 0's one)
static volatile int g_signal;  // (a plain int: the stores' cancel flag points at it)
static struct sigaction g_previous[2];
static const int g_signals[2] = {SIGTERM, SIGINT};

static double env_number(const char *name, double fallback) {
    const char *text = getenv(name);
    char *end;
    double v = text ? strtod(text, &end) : 0;
    return text && *text && !*end && v >= 0 && isfinite(v) ? v : fallback;
}

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...) {
    char line[1200];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    fprintf(stderr, "warning: MLflow: %s\n", line);
    fflush(stderr);
}

// ------------------------------------------------------------------ one store call, with the policy

typedef enum { SEND_BATCH, SEND_ARTIFACT, SEND_STATUS } SendKind;
typedef struct {
    SendKind kind;
    TrackingRecord *records;  // the store marks those it stored
    int n;
    const char *path;
    RunStatus status;
    long long end_ms;
} Send;

// Called with the store lock held: the Retry-After of the call just made, before another call sets it.
static StoreResult call_store(Tracking *t, const Send *s, double *retry_after, char *error, size_t size) {
    const MlflowStoreOps *ops = t->store->ops;
    if (atomic_load(&t->fatal)) {
        // From the fatal hook, maybe on the sender's own thread inside a store call: wait a little for
        // the store, never forever.
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 2;
        if (pthread_mutex_timedlock(&t->store_lock, &until) != 0) {
            snprintf(error, size, "the store is busy");
            return STORE_REFUSED;
        }
    } else {
        pthread_mutex_lock(&t->store_lock);
    }
    StoreResult result =
        s->kind == SEND_BATCH ? ops->log_batch(t->store, t->run_id, s->records, s->n, error, size)
        : s->kind == SEND_ARTIFACT ? ops->log_artifact(t->store, t->run_id, s->path, error, size)
                                   : ops->set_status(t->store, t->run_id, s->status, s->end_ms, error, size);
    *retry_after = result == STORE_RETRY ? t->store->retry_after : 0;
    pthread_mutex_unlock(&t->store_lock);
    return result;
}

// printf at the end of `text` (of `size` bytes), cut at its end.
static void append(char *text, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *text, size_t size, const char *fmt, ...) {
    size_t n = strlen(text);
    va_list args;
    va_start(args, fmt);
    vsnprintf(text + n, size - n, fmt, args);
    va_end(args);
}

// "loss at steps 0-9 and 12": `key` and its steps (ascending), consecutive ones as ranges, after `text`.
static void append_steps(char *text, size_t size, const char *key, const long *steps, int count) {
    append(text, size, "%s at step%s", key, count == 1 ? "" : "s");
    for (int k = 0; k < count;) {
        int last = k;
        while (last + 1 < count && steps[last + 1] <= steps[last] + 1) last++;
        const char *joint = k == 0 ? " " : last + 1 == count ? " and " : ", ";
        if (steps[last] == steps[k]) append(text, size, "%s%ld", joint, steps[k]);
        else append(text, size, "%s%ld-%ld", joint, steps[k], steps[last]);
        k = last + 1;
    }
}

// "13 values (loss at steps 0-9; test_accuracy at step 1; 2 params), 1 artifact and the run's status":
// what the store lacks (values: metrics, params, tags), the parts that are not nothing. A long list of
// steps is cut, with "...", to keep the line a line.
static const char *describe_lost(Tracking *t) {
    static char text[3 * 520 + 16];
    char values[480] = "", parts[3][520];
    int n = 0;
    // (Not after a fatal error: the hook's thread and the sender's may both be here, and `lost` grows
    // unlocked; the program ends then, without an end's line.)
    for (int i = 0; i < t->lost.n_metrics && !atomic_load(&t->fatal); i++) {
        if (*values) append(values, sizeof values, "; ");
        append_steps(values, sizeof values, t->lost.metrics[i].key, t->lost.metrics[i].steps, t->lost.metrics[i].n_steps);
    }
    if (t->lost_params) append(values, sizeof values, "%s%ld param%s", *values ? "; " : "", t->lost_params, t->lost_params == 1 ? "" : "s");
    if (t->lost_tags) append(values, sizeof values, "%s%ld tag%s", *values ? "; " : "", t->lost_tags, t->lost_tags == 1 ? "" : "s");
    if (strlen(values) + 1 == sizeof values) snprintf(values + sizeof values - 4, 4, "...");
    if (t->dropped)
        snprintf(parts[n++], sizeof parts[0], "%ld value%s (%s)", t->dropped, t->dropped == 1 ? "" : "s", values);
    if (t->lost_artifacts)
        snprintf(parts[n++], sizeof parts[0], "%d artifact%s", t->lost_artifacts, t->lost_artifacts == 1 ? "" : "s");
    if (t->lost_status) snprintf(parts[n++], sizeof parts[0], "the run's status");
    if (n == 0) snprintf(text, sizeof text, "nothing");
    else if (n == 1) snprintf(text, sizeof text, "%s", parts[0]);
    else if (n == 2) snprintf(text, sizeof text, "%s and %s", parts[0], parts[1]);
    else snprintf(text, sizeof text, "%s, %s and %s", parts[0], parts[1], parts[2]);
    return text;
}

typedef enum { SENT, DROPPED, CANCELLED } SendResult;

// A signal while the store's cancel flag points at it: the request under way ended, and no retry waits.
static bool cancelled_by_signal(const Tracking *t) { return g_signal && t->store->cancel; }

// Seconds until the store's deadline (the end's bound); HUGE_VAL without one.
static double time_left(const Tracking *t) {
    double deadline = t->store->deadline;
    return deadline > 0 ? deadline - wall_seconds() : HUGE_VAL;
}

// Sleeps `seconds`, in slices, so that the end's deadline (set meanwhile by tracking_end) or a signal
// cuts the pause short: a pause the server asked for (Retry-After) may be long.
static void pause_for(const Tracking *t, double seconds) {
    const double until = wall_seconds() + seconds;
    for (double left = seconds; left > 0 && time_left(t) > 0 && !cancelled_by_signal(t); left = until - wall_seconds()) {
        double slice = fmin(left, 0.05);
        struct timespec ts = {0, (long)(slice * 1e9)};
        nanosleep(&ts, NULL);
    }
}

// What a failed batch leaves the store without: the records it did not mark stored.
static void count_lost_records(Tracking *t, const Send *s) {
    for (int i = 0; i < s->n; i++) {
        const TrackingRecord *r = &s->records[i];
        if (r->stored) continue;
        t->dropped++;
        if (r->kind == RECORD_METRIC && !atomic_load(&t->fatal)) run_holdings_add_step(&t->lost, r->key, r->step);
        else if (r->kind == RECORD_PARAM) t->lost_params++;
        else t->lost_tags++;
    }
}

static SendResult send(Tracking *t, const Send *s) {
    char error[1024] = "";
    int tries = t->degraded ? 1 : 1 + t->max_retries, made = 0;
    StoreResult result = STORE_RETRY;
    double asked = 0;  // the last answer's Retry-After, seconds
    for (int attempt = 0; attempt < tries; attempt++) {
        if (attempt > 0) {
            // The backoff's pause, or the server's, if it asked for a longer one.
            double pause = fmax(t->backoff * (double)(1L << (attempt - 1)), asked);
            if (pause >= time_left(t)) {  // the end's time would pass before the try: not tried again
                t->out_of_time = true;
                if (asked > 0) {
                    size_t n = strlen(error);
                    snprintf(error + n, sizeof error - n, "; it asked to be tried again after %.0f s (Retry-After), "
                             "past the end's time", asked);
                }
                break;
            }
            pause_for(t, pause);
        }
        if (cancelled_by_signal(t)) return CANCELLED;  // after_signal sends it, with the status
        if (time_left(t) <= 0) {  // the end's time is spent: not tried (again)
            t->out_of_time = true;
            break;
        }
        result = call_store(t, s, &asked, error, sizeof error);
        made++;
        if (result != STORE_RETRY) break;
        if (asked > RETRY_AFTER_CAP && attempt + 1 < tries) {  // (an hour, say): this request has failed
            size_t n = strlen(error);
            snprintf(error + n, sizeof error - n, "; it asked to be tried again after %.0f s (Retry-After), more than "
                     "the %.0f s this client waits", asked, RETRY_AFTER_CAP);
            break;
        }
    }
    if (result == STORE_OK) {
        if (t->degraded && t->warned) {
            warn("%s answers again (%s %s meanwhile)", t->where, describe_lost(t),
                 t->store->ops->knows_outcome ? "were not written" : "may have been lost");
            t->degraded = false;
        }
        return SENT;
    }
    if (result == STORE_RETRY && cancelled_by_signal(t)) return CANCELLED;
    if (s->kind == SEND_BATCH) count_lost_records(t, s);
    if (s->kind == SEND_ARTIFACT) t->lost_artifacts++;
    if (s->kind == SEND_STATUS) t->lost_status = true;
    if (result != STORE_REFUSED) t->unanswered = true;
    if (made == 0) return DROPPED;  // the end's last line says it
    if (result == STORE_REFUSED) {
        if (!t->said_refused)
            warn("%s refused %s: %s (said once; the training goes on)", t->where,
                 s->kind == SEND_BATCH ? "a batch of values" : s->kind == SEND_ARTIFACT ? s->path : "the run's status",
                 error);
        t->said_refused = true;
    } else if (!t->degraded) {
        warn("%s failed %d tr%s (%s): the training goes on; from now on each request gets one try, and what "
             "fails is dropped", t->where, made, made == 1 ? "y" : "ies", error);
        t->degraded = t->warned = true;
    }
    return DROPPED;
}

static void free_records(TrackingRecord *records, int n) {
    for (int i = 0; i < n; i++) free(records[i].key), free(records[i].value);
    free(records);
}

// Hand `records` (owned: freed here) to the store in batches within its limits: max_batch in all,
// max_params params and max_tags tags each, each metric's values in their order. A signal that cancels
// a batch puts it and the rest back at the front of the queue, for after_signal.
static void send_records(Tracking *t, TrackingRecord *records, int n) {
    const MlflowStoreOps *ops = t->store->ops;
    TrackingRecord *batch = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *batch);
    int *taken = xcalloc((size_t)(n > 0 ? n : 1), sizeof *taken);  // 0: waiting, 1: sent or dropped
    bool cancelled = false;
    for (int left = n; left > 0 && !cancelled;) {
        int count = 0, params = 0, tags = 0, chosen[1000];
        for (int i = 0; i < n && count < ops->max_batch && count < 1000; i++) {
            if (taken[i]) continue;
            if (records[i].kind == RECORD_PARAM && params == ops->max_params) continue;
            if (records[i].kind == RECORD_TAG && tags == ops->max_tags) continue;
            params += records[i].kind == RECORD_PARAM;
            tags += records[i].kind == RECORD_TAG;
            chosen[count] = i;
            batch[count++] = records[i];
        }
        cancelled = send(t, &(Send){SEND_BATCH, batch, count, NULL, 0, 0}) == CANCELLED;
        // Sent, dropped, or (cancelled) stored before the signal: done; the rest of a cancelled batch
        // goes back to the queue, and nothing is sent twice.
        for (int k = 0; k < count; k++) taken[chosen[k]] = !cancelled || batch[k].stored;
        left -= count;
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (taken[i]) free(records[i].key), free(records[i].value);
        else records[kept++] = records[i];
    }
    if (kept) {  // back to the front of the queue, before whatever came meanwhile
        pthread_mutex_lock(&t->queue_lock);
        records = xrealloc(records, (size_t)(kept + t->n_queued) * sizeof *records);
        if (t->n_queued) memcpy(records + kept, t->queue, (size_t)t->n_queued * sizeof *records);
        free(t->queue);
        t->queue = records, t->n_queued += kept, t->capacity = t->n_queued;
        pthread_mutex_unlock(&t->queue_lock);
    } else {
        free(records);
    }
    free(taken);
    free(batch);
}

// ------------------------------------------------------------------ the sender thread

static void set_final_status(Tracking *t, RunStatus status) {
    if (atomic_exchange(&t->status_set, true) && status != RUN_FINISHED) return;
    send(t, &(Send){SEND_STATUS, NULL, 0, NULL, status, epoch_milliseconds()});
}

// SIGTERM or SIGINT: remembered here, acted on by the sender (a handler may not send anything). A
// handler that was there before (step 13's stop_signal) still runs; with none, the signal takes effect
// once the sender has marked the run KILLED.
static void on_signal(int sig) {
    g_signal = sig;
    if (g_run) sem_post(&g_run->wake);
    for (int i = 0; i < 2; i++) {
        if (g_signals[i] != sig) continue;
        if (g_previous[i].sa_flags & SA_SIGINFO) {
            if (g_previous[i].sa_sigaction) g_previous[i].sa_sigaction(sig, NULL, NULL);
        } else if (g_previous[i].sa_handler != SIG_DFL && g_previous[i].sa_handler != SIG_IGN) {
            g_previous[i].sa_handler(sig);
        }
    }
}

static bool send_queue(Tracking *t);

// What was logged goes first, then the status: one try each, of 2 s at most, as the signal's grace is
// short (Slurm's KillWait is 30 s, mpirun's a few).
static void after_signal(Tracking *t, int sig) {
    t->store->cancel = NULL;
    t->store->timeout_s = 2;
    t->degraded = true;
    send_queue(t);
    set_final_status(t, RUN_KILLED);
    for (int i = 0; i < 2; i++)
        if (g_signals[i] == sig && !(g_previous[i].sa_flags & SA_SIGINFO) && g_previous[i].sa_handler == SIG_DFL) {
            signal(sig, SIG_DFL);  // as if we had never been there
            kill(getpid(), sig);
        }
}

// Everything queued so far, to the store. Returns whether tracking_end has asked the sender to stop
// (then the queue it sent was the last).
static bool send_queue_locked(Tracking *t);

static bool send_queue(Tracking *t) {
    pthread_mutex_lock(&t->queue_lock);
    return send_queue_locked(t);
}

// send_queue, with queue_lock already taken (released here).
static bool send_queue_locked(Tracking *t) {
    TrackingRecord *records = t->queue;
    int n = t->n_queued;
    bool closing = t->closing;
    t->queue = NULL, t->n_queued = t->capacity = 0;
    pthread_mutex_unlock(&t->queue_lock);
    if (n) send_records(t, records, n);
    else free(records);
    return closing;
}

static void *sender_main(void *arg) {
    Tracking *t = arg;
    int handled_signal = 0;
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        while (sem_timedwait(&t->wake, &until) != 0 && errno == EINTR) {}
        if (g_signal && !handled_signal) after_signal(t, handled_signal = g_signal);
        bool closing = send_queue(t);
        if (closing && !(g_signal && !handled_signal)) return NULL;  // (a signal meanwhile: once more, for it)
    }
}

static void enqueue(Tracking *t, TrackingRecord record) {
    pthread_mutex_lock(&t->queue_lock);
    if (t->n_queued == t->capacity) {
        t->capacity = t->capacity ? 2 * t->capacity : 1024;
        t->queue = xrealloc(t->queue, (size_t)t->capacity * sizeof *t->queue);
    }
    t->queue[t->n_queued++] = record;
    bool wake = t->n_queued == BATCH_WAKE;
    pthread_mutex_unlock(&t->queue_lock);
    if (wake) sem_post(&t->wake);
}

// A fatal error on rank 0 (check.h): what was logged, then FAILED, one try each of 2 s at most. From the
// failing thread, which may be the sender's (then the queue or the store may be its own, locked: the
// queue is taken only if free, the store waited for 2 s). The send() state it shares with the sender
// is not locked: at a fatal error, a count off by one is the worst of it.
static void on_fatal(void) {
    Tracking *t = g_run;
    if (!t) return;
    atomic_store(&t->fatal, true);
    t->store->cancel = NULL;
    t->store->timeout_s = 2;
    t->degraded = true;
    if (pthread_mutex_trylock(&t->queue_lock) == 0) send_queue_locked(t);
    set_final_status(t, RUN_FAILED);
}

// ------------------------------------------------------------------ the API

static void add(TrackingRecord **list, int *n, RecordKind kind, const char *key, const char *value) {
    *list = xrealloc(*list, (size_t)(*n + 1) * sizeof **list);
    (*list)[(*n)++] = (TrackingRecord){kind, xstrdup(key), xstrdup(value), 0, 0, 0, false};
}

// The first line of `path`, without its line ending; false if there is none.
static bool first_line(const char *path, char *line, size_t size) {
    FILE *file = fopen(path, "r");
    if (!file) return false;
    bool got = fgets(line, (int)size, file) != NULL;
    fclose(file);
    if (got) line[strcspn(line, "\r\n")] = '\0';
    return got;
}

// The commit of the checkout the program was built in: HEAD, and the branch's ref (loose, or in
// packed-refs). In a git worktree, .git is a file naming the worktree's git folder ("gitdir: ..."),
// whose HEAD is its own and whose refs are the main repository's (its "commondir"). "" where the
// program's folder is not a checkout.
static void git_commit(char *out, size_t size) {
    char root[PATH_MAX], git[PATH_MAX + 16], common[2 * PATH_MAX + 32], path[3 * PATH_MAX], line[PATH_MAX + 16];
    *out = '\0';
    if (!program_repository(root, sizeof root)) return;
    snprintf(git, sizeof git, "%s/.git", root);
    if (first_line(git, line, sizeof line) && strncmp(line, "gitdir: ", 8) == 0 &&  // a worktree's .git file
        snprintf(git, sizeof git, "%s%s%s", line[8] == '/' ? "" : root, line[8] == '/' ? "" : "/", line + 8) >= (int)sizeof git)
        return;
    snprintf(common, sizeof common, "%s", git);
    snprintf(path, sizeof path, "%s/commondir", git);
    if (first_line(path, line, sizeof line))
        snprintf(common, sizeof common, "%s%s%s", line[0] == '/' ? "" : git, line[0] == '/' ? "" : "/", line);
    snprintf(path, sizeof path, "%s/HEAD", git);
    if (!first_line(path, line, sizeof line)) return;
    if (strncmp(line, "ref: ", 5) != 0) {
        if (strlen(line) == 40) snprintf(out, size, "%.40s", line);  // (a detached HEAD: the commit itself)
        return;
    }
    char ref[256];
    snprintf(ref, sizeof ref, "%.255s", line + 5);
    snprintf(path, sizeof path, "%s/%s", common, ref);
    if (first_line(path, line, sizeof line)) {
        if (strlen(line) >= 40) snprintf(out, size, "%.40s", line);
        return;
    }
    snprintf(path, sizeof path, "%s/packed-refs", common);
    FILE *file = fopen(path, "r");
    if (!file) return;
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (strlen(line) > 41 && strcmp(line + 41, ref) == 0) { snprintf(out, size, "%.40s", line); break; }
    }
    fclose(file);
}

// Who runs it, as MLflow's client finds it: $USER, else the account's name.
static const char *user_name(void) {
    const char *user = getenv("USER");
    if (user && *user) return user;
    struct passwd *account = getpwuid(geteuid());
    return account && account->pw_name ? account->pw_name : "unknown";
}

// Rank 0's part of tracking_start: the store, the run, its params and tags. false with a message.
// from_flag: the URI came from --mlflow, not MLFLOW_TRACKING_URI; the messages name which.
static bool open_run(Tracking *t, const char *uri, bool from_flag, const char *experiment, const char *run_name,
                     const char *program, const char *device, const char *resume_run_id, ArgValues params,
                     char *error, size_t size) {
    char message[1024] = "";
    // Messages name the URI without a password in it (https://user:secret@host: https://***@host).
    const char *scheme_end = strstr(uri, "://"), *at = scheme_end ? strchr(scheme_end + 3, '@') : NULL;
    const char *path = scheme_end ? strchr(scheme_end + 3, '/') : NULL;
    if (at && (!path || at < path))
        snprintf(t->where, sizeof t->where, "%.*s***%s", (int)(scheme_end + 3 - uri), uri, at);
    else
        snprintf(t->where, sizeof t->where, "%s", uri);
    const char *source = from_flag ? "--mlflow " : "MLFLOW_TRACKING_URI=";
    if (strncmp(uri, "http://", 7) == 0 || strncmp(uri, "https://", 8) == 0) {
        t->store = mlflow_rest_store_open(uri, message, sizeof message);
    } else if (strncmp(uri, "file://", 7) == 0 && uri[7] != '/') {
        snprintf(error, size, "%s%.400s: a file URI names a folder of this machine: file:///absolute/path, or "
                 "file:relative/path", source, t->where);
        return false;
    } else if (strstr(uri, "://") && strncmp(uri, "file://", 7) != 0) {
        snprintf(error, size, "%s%.400s: expected a tracking server (http://HOST:PORT, https://...) or a folder "
                 "(file:PATH, or a path); for a database, run `mlflow server --backend-store-uri URI` and give its "
                 "address", source, t->where);
        return false;
    } else {
        const char *folder = strncmp(uri, "file://", 7) == 0 ? uri + 7 : strncmp(uri, "file:", 5) == 0 ? uri + 5 : uri;
        t->store = mlflow_file_store_open(folder, message, sizeof message);
    }
    if (!t->store) {
        snprintf(error, size, "%s%.400s: %.1000s", source, t->where, message);
        return false;
    }
    t->store->cancel = &g_signal;
    t->store->timeout_s = t->request_timeout;
    const MlflowStoreOps *ops = t->store->ops;
    char text[PATH_MAX];

    // The tags: who ran what, where (mlflow.* are the names MLflow's UI shows in its columns).
    TrackingRecord *tags = NULL;
    int n_tags = 0;
    const char *base = strrchr(program, '/') ? strrchr(program, '/') + 1 : program;
    char name[256];
    if (run_name) snprintf(name, sizeof name, "%s", run_name);
    else snprintf(name, sizeof name, "%.*s, %d rank%s", (int)strcspn(base, "."), base, dist_world_size(),
                  dist_world_size() == 1 ? "" : "s");
    add(&tags, &n_tags, RECORD_TAG, "mlflow.runName", name);
    add(&tags, &n_tags, RECORD_TAG, "mlflow.source.name", program);
    add(&tags, &n_tags, RECORD_TAG, "mlflow.source.type", "LOCAL");
    add(&tags, &n_tags, RECORD_TAG, "mlflow.user", user_name());
    git_commit(text, sizeof text);
    if (*text) add(&tags, &n_tags, RECORD_TAG, "mlflow.source.git.commit", text);
    add(&tags, &n_tags, RECORD_TAG, "host", dist_hostname());
    snprintf(text, sizeof text, "%d", dist_world_size());
    add(&tags, &n_tags, RECORD_TAG, "world_size", text);
    snprintf(text, sizeof text, "%d", dist_num_nodes());
    add(&tags, &n_tags, RECORD_TAG, "nodes", text);
    add(&tags, &n_tags, RECORD_TAG, "device", device);
    add(&tags, &n_tags, RECORD_TAG, "blas", threads_blas_name());

    StoreResult result = STORE_OK;
    bool resumed = false;
    if (resume_run_id && *resume_run_id) {
        result = ops->resume_run(t->store, resume_run_id, &resumed, &t->held, message, sizeof message);
        if (result == STORE_OK && resumed) {
            snprintf(t->run_id, sizeof t->run_id, "%s", resume_run_id);
            printf("MLflow: resuming run %s at %s (it keeps the params of its first start)\n", t->run_id, t->where);
        } else if (result == STORE_OK) {
            printf("MLflow: the snapshot's run %s is not at %s: starting a new run\n", resume_run_id, t->where);
        }
    }
    if (result == STORE_OK && !resumed) {
        result = ops->create_run(t->store, experiment, name, epoch_milliseconds(), tags, n_tags, t->run_id, message, sizeof message);
        if (result == STORE_OK) printf("MLflow: run %s (%s) in experiment '%s' at %s\n", t->run_id, name, experiment, t->where);
    }
    if (result != STORE_OK) {
        snprintf(error, size, "%s%.400s: %.1000s", source, t->where, message);
        free_records(tags, n_tags);
        return false;
    }
    fflush(stdout);
    // The tags say where the run runs now: a resumed run gets them again (tags may change).
    if (resumed) for (int i = 0; i < n_tags; i++) enqueue(t, tags[i]);
    else for (int i = 0; i < n_tags; i++) free(tags[i].key), free(tags[i].value);
    free(tags);
    // mlflow.log_params(vars(args)): every flag but the three that say where the run goes (the run's
    // experiment and name are fields of the run already, and a server's URI may hold a password).
    // A resumed run keeps the params its store holds (MLflow refuses to change one) and gets those it
    // lacks: a first start killed before they were sent.
    for (int i = 0; i < params.count; i++) {
        const char *flag = params.names[i];
        if (strcmp(flag, "mlflow") == 0 || strcmp(flag, "experiment") == 0 || strcmp(flag, "run_name") == 0) continue;
        char key[128];  // argparse's attribute names: --no-shuffle is args.no_shuffle
        snprintf(key, sizeof key, "%s", flag);
        for (char *c = key; *c; c++) if (*c == '-') *c = '_';
        if (!run_holdings_has_param(&t->held, key)) tracking_log_param(t, key, params.values[i]);
    }
    snprintf(text, sizeof text, "%d", dist_world_size());
    if (!run_holdings_has_param(&t->held, "world_size")) tracking_log_param(t, "world_size", text);
    // ... sent now, before any training: a run killed at any moment from here on has its params (and a
    // resumed one its tags), as mlflow.log_params returns once the server has them.
    send_queue(t);
    return true;
}

static void stop_program(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void stop_program(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    fflush(stderr);
    MPI_Finalize();
    exit(EXIT_USAGE);
}

Tracking *tracking_start(const TrackingOptions *options, const char *program, const char *device,
                         const char *resume_run_id, ArgValues params) {
    const char *uri = options->uri ? options->uri : getenv("MLFLOW_TRACKING_URI");
    if (!uri || !*uri) return NULL;  // every rank sees the same flags, and mpirun gives them one environment
    const char *experiment = options->experiment ? options->experiment : getenv("MLFLOW_EXPERIMENT_NAME");
    if (!experiment || !*experiment) experiment = "Default";

    Tracking *t = NULL;
    char error[1536] = "";
    int ok = 1;
    if (dist_rank() == 0) {
        t = xcalloc(1, sizeof *t);
        pthread_mutex_init(&t->store_lock, NULL);
        pthread_mutex_init(&t->queue_lock, NULL);
        sem_init(&t->wake, 0, 0);
        t->max_retries = (int)env_number("MLFLOW_HTTP_REQUEST_MAX_RETRIES", 3);
        t->backoff = env_number("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 0.5);
        t->request_timeout = env_number("MLFLOW_HTTP_REQUEST_TIMEOUT", 10);
        if (t->request_timeout <= 0) t->request_timeout = 10;
        ok = open_run(t, uri, options->uri != NULL, experiment, options->run_name, program, device, resume_run_id, params,
                      error, sizeof error);
    }
    // Every rank learns the verdict: a run that cannot be tracked stops before any training.
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        if (dist_rank() == 0) stop_program("%s", error);
        MPI_Finalize();
        exit(EXIT_USAGE);
    }
    if (!t) return NULL;

    // The sender, with SIGTERM and SIGINT blocked (they go to the training's threads, whose handler
    // posts `wake`), then the handlers and the fatal hook.
    sigset_t block, old;
    sigemptyset(&block);
    for (int i = 0; i < 2; i++) sigaddset(&block, g_signals[i]);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int created = pthread_create(&t->sender, NULL, sender_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    CHECK(created == 0, "cannot start MLflow's sender thread: %s", strerror(created));
    g_run = t;
    struct sigaction action = {0};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    // Not over SIG_IGN: a signal the program ignores (a background job's SIGINT) stays ignored.
    for (int i = 0; i < 2; i++) {
        sigaction(g_signals[i], NULL, &g_previous[i]);
        if ((g_previous[i].sa_flags & SA_SIGINFO) || g_previous[i].sa_handler != SIG_IGN)
            sigaction(g_signals[i], &action, NULL);
    }
    check_set_fatal_hook(on_fatal);
    return t;
}

const char *tracking_run_id(const Tracking *run) { return run ? run->run_id : ""; }

void tracking_log_param(Tracking *run, const char *key, const char *value) {
    if (run) enqueue(run, (TrackingRecord){RECORD_PARAM, xstrdup(key), xstrdup(value), 0, 0, 0, false});
}

void tracking_set_tag(Tracking *run, const char *key, const char *value) {
    if (run) enqueue(run, (TrackingRecord){RECORD_TAG, xstrdup(key), xstrdup(value), 0, 0, 0, false});
}

void tracking_log_metric(Tracking *run, const char *key, double value, long step) {
    if (!run) return;
    // A resumed run logs again what its snapshot holds and replays the steps after it: a step the store
    // holds is the same value (an exact resume), and is not sent twice.
    if (run_holdings_has_step(&run->held, key, step)) return;
    enqueue(run, (TrackingRecord){RECORD_METRIC, xstrdup(key), NULL, value, step, epoch_milliseconds(), false});
}

void tracking_metric_lost(Tracking *run, const char *key, long step) {
    if (!run || run_holdings_has_step(&run->held, key, step)) return;
    run->unrecoverable = xrealloc(run->unrecoverable, (size_t)(run->n_unrecoverable + 1) * sizeof *run->unrecoverable);
    run->unrecoverable[run->n_unrecoverable++] = (TrackingRecord){RECORD_METRIC, xstrdup(key), NULL, 0, step, 0, false};
}

static int compare_steps(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

// The values the run lacks for good (tracking_metric_lost), by metric, consecutive steps as ranges:
// "samples_per_second at steps 0-1 and 4".
static void describe_unrecoverable(const Tracking *t, char *text, size_t size) {
    long *steps = xmalloc((size_t)(t->n_unrecoverable > 0 ? t->n_unrecoverable : 1) * sizeof *steps);
    text[0] = '\0';
    for (int i = 0; i < t->n_unrecoverable; i++) {
        const char *key = t->unrecoverable[i].key;
        bool seen = false;
        for (int k = 0; k < i && !seen; k++) seen = strcmp(t->unrecoverable[k].key, key) == 0;
        if (seen) continue;
        int count = 0;
        for (int k = i; k < t->n_unrecoverable; k++)
            if (strcmp(t->unrecoverable[k].key, key) == 0) steps[count++] = t->unrecoverable[k].step;
        qsort(steps, (size_t)count, sizeof *steps, compare_steps);
        if (*text) append(text, size, "; ");
        append_steps(text, size, key, steps, count);
    }
    free(steps);
}

void tracking_log_artifact(Tracking *run, const char *path) {
    if (!run || !path || !*path) return;
    run->artifacts = xrealloc(run->artifacts, (size_t)(run->n_artifacts + 1) * sizeof *run->artifacts);
    run->artifacts[run->n_artifacts++] = xstrdup(path);
}

void tracking_end(Tracking *run, TrackingStatus status) {
    if (!run) return;
    // The end waits for the store END_TIMEOUTS request timeouts in all (15 s with MLflow's default 10):
    // what is queued and the artifacts until one timeout has passed (a request under way then, the
    // sender's included, ends there), the status in what is left. A server that hangs (stopped, or
    // behind a dead link) costs the end that and no more, however many requests and retries were due.
    const double start = wall_seconds();
    run->store->deadline = start + run->request_timeout;
    pthread_mutex_lock(&run->queue_lock);
    run->closing = true;
    pthread_mutex_unlock(&run->queue_lock);
    sem_post(&run->wake);
    pthread_join(run->sender, NULL);
    check_set_fatal_hook(NULL);
    if (g_signal) {  // a signal: what is left gets one short try each, as after_signal's
        run->store->cancel = NULL;
        run->store->timeout_s = 2;
        run->degraded = true;
    }
    for (int i = 0; i < run->n_artifacts; i++) {
        send(run, &(Send){SEND_ARTIFACT, NULL, 0, run->artifacts[i], 0, 0});
        free(run->artifacts[i]);
    }
    RunStatus final = status == TRACKING_FAILED ? RUN_FAILED : status == TRACKING_KILLED ? RUN_KILLED : RUN_FINISHED;
    atomic_store(&run->status_set, false);
    run->store->deadline = start + END_TIMEOUTS * run->request_timeout;
    // A run that may lack values or artifacts for want of an answer is not marked FINISHED: a server that
    // hung takes the status as soon as it wakes, and would show a complete-looking run with holes. It
    // stays RUNNING there, and the last line says why. (What the server refused, it said; the run is
    // FINISHED without it.)
    bool withheld = final == RUN_FINISHED && run->unanswered;
    if (!withheld) set_final_status(run, final);
    // The failure's warning said what happens next; at the end, what was lost in all, if the server did
    // not come back, or only refused, or the end's time ran out. "May": a request that got no answer may
    // have reached a server that answers late (one stopped, then resumed, holds it).
    if ((run->degraded && run->warned) || (run->said_refused && !run->warned) || run->out_of_time || withheld) {
        char bound[96] = "";
        if (run->out_of_time)  // the values' and artifacts' share of the end's time, or all of it
            snprintf(bound, sizeof bound, " within the end's %.3g s",
                     (withheld ? 1 : END_TIMEOUTS) * run->request_timeout);
        const char *then = withheld ? ": the run is left RUNNING there, not FINISHED without them"
                           : run->lost_status ? ": the run may stay RUNNING there" : "";
        if (run->store->ops->knows_outcome)  // a folder: what failed was not written, and the rest was
            warn("not written to %s%s: %s; everything else logged is there%s", run->where, bound, describe_lost(run), then);
        else  // a server: a request that got no answer may have reached it
            warn("%s may not have reached %s%s%s", describe_lost(run), run->where, bound, then);
    }
    // Last, what the run lacks for good: values measured before a restart by a process that died with
    // them queued, and that nothing kept (the line says so, rather than the run looking complete).
    if (run->n_unrecoverable) {
        char missing[1024];
        describe_unrecoverable(run, missing, sizeof missing);
        warn("run %s at %s lacks %s: the process that measured %s died before sending %s, and nothing else kept %s",
             run->run_id, run->where, missing, run->n_unrecoverable == 1 ? "it" : "them",
             run->n_unrecoverable == 1 ? "it" : "them", run->n_unrecoverable == 1 ? "it" : "them");
    }
    for (int i = 0; i < 2; i++) sigaction(g_signals[i], &g_previous[i], NULL);
    g_run = NULL;
    // A signal that came while the end was sending, into a program that had no handler for it: it
    // takes effect now, as it would have without tracking (the run, whose training ended, FINISHED).
    for (int i = 0; i < 2; i++)
        if (g_signal == g_signals[i] && !(g_previous[i].sa_flags & SA_SIGINFO) && g_previous[i].sa_handler == SIG_DFL)
            kill(getpid(), g_signal);
    run->store->ops->close(run->store);
    run_holdings_free(&run->held);
    run_holdings_free(&run->lost);
    free_records(run->unrecoverable, run->n_unrecoverable);
    free(run->artifacts);
    sem_destroy(&run->wake);
    pthread_mutex_destroy(&run->queue_lock);
    pthread_mutex_destroy(&run->store_lock);
    free(run);
}
