// mlflow_file_store.c: a run in an `mlruns` folder, the layout of MLflow's FileStore, which
// `mlflow ui --backend-store-uri ./mlruns` and mlflow.set_tracking_uri("file:./mlruns") read:
//
//   mlruns/<experiment id>/meta.yaml                  name, id, artifact_location, lifecycle_stage, times
//   mlruns/<experiment id>/<run id>/meta.yaml         run_id, run_name, status (1 RUNNING .. 5 KILLED), times
//   mlruns/<experiment id>/<run id>/metrics/<key>     one line per value: "timestamp value step"
//   mlruns/<experiment id>/<run id>/params/<key>      the value, and nothing else
//   mlruns/<experiment id>/<run id>/tags/<key>        the value
//   mlruns/<experiment id>/<run id>/artifacts/        the files, as logged
//
// Written so that a crash or a full disk at any moment leaves nothing the reader chokes on: every
// meta.yaml, param, tag and artifact is written under a temporary name in the run's (or experiment's)
// own folder, which the reader does not list as a record, and renamed into place; a run's folder holds
// its meta.yaml before anything else, and a run that cannot be created is removed whole; a metric file
// only ever grows by whole lines, each batch of them one write() on a file opened O_APPEND, cut back
// to its last whole line when the write falls short. A value is written once: log_batch marks what it
// wrote, and a batch tried again after the disk filled part way writes only the rest.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "base/paths.h"  // make_dirs
#include "base/quote.h"
#include "base/timer.h"
#include "records/mlflow_store.h"

typedef struct {
    MlflowStore base;
    char root[PATH_MAX];        // absolute
    char run_dir[PATH_MAX];     // root/<experiment id>/<run id>, once a run is created or resumed
    char experiment_id[32];
    char run_name[256];
    long long start_ms;
    unsigned temp_counter;
} FileStore;

StoreResult store_failed(StoreResult result, char *error, size_t size, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(error, size, fmt, args);
    va_end(args);
    return result;
}

// ------------------------------------------------------------------ what a resumed run holds (both stores)

static HeldMetric *held_metric(const RunHoldings *held, const char *key) {
    for (int i = 0; i < held->n_metrics; i++)
        if (strcmp(held->metrics[i].key, key) == 0) return &held->metrics[i];
    return NULL;
}

void run_holdings_add_step(RunHoldings *held, const char *key, long step) {
    HeldMetric *m = held_metric(held, key);
    if (!m) {
        held->metrics = xrealloc(held->metrics, (size_t)(held->n_metrics + 1) * sizeof *held->metrics);
        m = &held->metrics[held->n_metrics++];
        *m = (HeldMetric){xstrdup(key), NULL, 0};
    }
    // Insertion in order: the steps come in their order (a metric file, a history page), so this is
    // an append but for the duplicates that a store may hold (a value sent twice).
    int at = m->n_steps;
    while (at > 0 && m->steps[at - 1] > step) at--;
    if (at > 0 && m->steps[at - 1] == step) return;
    m->steps = xrealloc(m->steps, (size_t)(m->n_steps + 1) * sizeof *m->steps);
    memmove(m->steps + at + 1, m->steps + at, (size_t)(m->n_steps - at) * sizeof *m->steps);
    m->steps[at] = step;
    m->n_steps++;
}

void run_holdings_add_param(RunHoldings *held, const char *key) {
    if (run_holdings_has_param(held, key)) return;
    held->params = xrealloc(held->params, (size_t)(held->n_params + 1) * sizeof *held->params);
    held->params[held->n_params++] = xstrdup(key);
}

bool run_holdings_has_step(const RunHoldings *held, const char *key, long step) {
    const HeldMetric *m = held_metric(held, key);
    for (int lo = 0, hi = m ? m->n_steps : 0; lo < hi;) {
        int mid = lo + (hi - lo) / 2;
        if (m->steps[mid] == step) return true;
        if (m->steps[mid] < step) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

bool run_holdings_has_param(const RunHoldings *held, const char *key) {
    for (int i = 0; i < held->n_params; i++)
        if (strcmp(held->params[i], key) == 0) return true;
    return false;
}

void run_holdings_free(RunHoldings *held) {
    for (int i = 0; i < held->n_metrics; i++) free(held->metrics[i].key), free(held->metrics[i].steps);
    for (int i = 0; i < held->n_params; i++) free(held->params[i]);
    free(held->metrics);
    free(held->params);
    *held = (RunHoldings){0};
}

// ------------------------------------------------------------------ the folder

// A full disk or a quota may pass; a folder we may not write will not.
static StoreResult errno_result(void) {
    return errno == ENOSPC || errno == EDQUOT || errno == EINTR || errno == EAGAIN ? STORE_RETRY : STORE_REFUSED;
}

// Keys become file names: MLflow allows letters, digits, _ - . space and /, and so do we, minus the
// slash (no sub-folders) and any ".." (no escaping the run's folder).
static bool key_is_file_name(const char *key) {
    if (!*key || strlen(key) > 250 || strstr(key, "..")) return false;
    for (const char *c = key; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-' || *c == '.' || *c == ' '))
            return false;
    return true;
}

// YAML's single-quoted scalar: any text, with ' written twice.
static void yaml_quote(const char *text, char *out, size_t size) {
    size_t n = 0;
    if (size < 3) { if (size) out[0] = '\0'; return; }
    out[n++] = '\'';
    for (const char *c = text; *c && n + 3 < size; c++) {
        if (*c == '\'') out[n++] = '\'';
        out[n++] = *c;
    }
    out[n++] = '\'';
    out[n] = '\0';
}

// `contents` to `target`, through a temporary file in `temp_dir` (the same filesystem, and a folder the
// reader does not list records from) renamed over it.
static StoreResult write_file_via(FileStore *s, const char *temp_dir, const char *target, const char *contents,
                                  char *error, size_t size) {
    char temp[PATH_MAX + 64];
    snprintf(temp, sizeof temp, "%s/.tmp.%ld.%u", temp_dir, (long)getpid(), s->temp_counter++);
    FILE *file = fopen(temp, "wb");
    if (!file) return store_failed(errno_result(), error, size, "cannot write %s: %s", temp, strerror(errno));
    bool ok = fputs(contents, file) >= 0;
    ok = (fclose(file) == 0) && ok;
    if (!ok || rename(temp, target) != 0) {
        StoreResult result = errno_result();
        int saved = errno;
        unlink(temp);
        return store_failed(result, error, size, "cannot write %s: %s", target, strerror(saved));
    }
    return STORE_OK;
}

// `contents` to `dir/name`, through a temporary file in `dir`.
static StoreResult write_file_in(FileStore *s, const char *dir, const char *name, const char *contents,
                                 char *error, size_t size) {
    char target[PATH_MAX + 300];
    snprintf(target, sizeof target, "%s/%s", dir, name);
    return write_file_via(s, dir, target, contents, error, size);
}

static bool make_dir(const char *path) { return mkdir(path, 0777) == 0 || errno == EEXIST; }

// The value of `field: value` in a meta.yaml, unquoted; false if the field is not there.
static bool read_yaml_field(const char *path, const char *field, char *value, size_t size) {
    FILE *file = fopen(path, "r");
    if (!file) return false;
    char line[1024];
    size_t len = strlen(field);
    bool found = false;
    while (!found && fgets(line, sizeof line, file)) {
        if (strncmp(line, field, len) != 0 || line[len] != ':') continue;
        char *v = line + len + 1;
        while (*v == ' ') v++;
        v[strcspn(v, "\r\n")] = '\0';
        size_t n = strlen(v);
        if (n >= 2 && (v[0] == '\'' || v[0] == '"') && v[n - 1] == v[0]) {  // quoted: unquote, '' is '
            char quote = v[0];
            size_t k = 0;
            for (size_t i = 1; i + 1 < n && k + 1 < size; i++) {
                if (quote == '\'' && v[i] == '\'' && v[i + 1] == '\'') i++;
                value[k++] = v[i];
            }
            value[k] = '\0';
        } else {
            snprintf(value, size, "%s", v);
        }
        found = true;
    }
    fclose(file);
    return found;
}

static StoreResult write_experiment_meta(FileStore *s, const char *dir, const char *id, const char *name,
                                         char *error, size_t size) {
    // Every string quoted: a folder named "a: b" or "x #y", or a name like "null", stays a string.
    char quoted[600], location[2 * PATH_MAX + 160], where[PATH_MAX + 80], meta[4 * PATH_MAX + 1024];
    yaml_quote(name, quoted, sizeof quoted);
    snprintf(where, sizeof where, "file://%s", dir);
    yaml_quote(where, location, sizeof location);
    long long now = epoch_milliseconds();
    snprintf(meta, sizeof meta,
             "artifact_location: %s\ncreation_time: %lld\nexperiment_id: '%s'\nlast_update_time: %lld\n"
             "lifecycle_stage: active\nname: %s\n", location, now, id, now, quoted);
    return write_file_in(s, dir, "meta.yaml", meta, error, size);
}

// The lowest-numbered experiment folder whose meta.yaml has this name (*lowest -1: none), and the next
// free number. A deleted experiment of that name is refused.
static StoreResult scan_experiments(FileStore *s, const char *name, long *lowest, long *next, char *error,
                                    size_t size) {
    DIR *root = opendir(s->root);
    if (!root) return store_failed(errno_result(), error, size, "cannot read %s: %s", s->root, strerror(errno));
    *lowest = -1, *next = 1;
    struct dirent *entry;
    StoreResult result = STORE_OK;
    while (result == STORE_OK && (entry = readdir(root))) {
        char *end;
        long id = strtol(entry->d_name, &end, 10);
        if (*end || end == entry->d_name || id < 0) continue;  // not an experiment: .trash, models, ...
        if (id >= *next) *next = id + 1;
        char meta[PATH_MAX + 300], found_name[512], stage[64] = "active";
        snprintf(meta, sizeof meta, "%s/%s/meta.yaml", s->root, entry->d_name);
        if (!read_yaml_field(meta, "name", found_name, sizeof found_name) || strcmp(found_name, name) != 0) continue;
        read_yaml_field(meta, "lifecycle_stage", stage, sizeof stage);
        if (strcmp(stage, "active") != 0)
            result = store_failed(STORE_REFUSED, error, size, "experiment '%s' (%s/%s) is deleted: restore it, or choose "
                            "another --experiment", name, s->root, entry->d_name);
        else if (*lowest < 0 || id < *lowest)
            *lowest = id;
    }
    closedir(root);
    return result;
}

// The experiment's id: the folder whose meta.yaml has this name, or a new folder (the next free number;
// "0" for MLflow's "Default"). mkdir is the claim on a number. Two runs that create one new experiment
// at once (a job array) each make a folder; both then look again and take the lower-numbered one, and
// the other's maker removes its own: one experiment, whoever was first.
static StoreResult find_or_create_experiment(FileStore *s, const char *name, char *error, size_t size) {
    long lowest, next;
    StoreResult result = scan_experiments(s, name, &lowest, &next, error, size);
    if (result != STORE_OK) return result;
    if (lowest >= 0) {
        snprintf(s->experiment_id, sizeof s->experiment_id, "%ld", lowest);
        return STORE_OK;
    }
    for (long id = strcmp(name, "Default") == 0 ? 0 : next;; id++) {
        char dir[PATH_MAX + 32];
        snprintf(s->experiment_id, sizeof s->experiment_id, "%ld", id);
        snprintf(dir, sizeof dir, "%s/%ld", s->root, id);
        if (mkdir(dir, 0777) != 0) {
            if (errno != EEXIST) return store_failed(errno_result(), error, size, "cannot create %s: %s", dir, strerror(errno));
            if (id == 0) id = next - 1;  // "0" is taken by something else: go on from the free numbers
            continue;
        }
        result = write_experiment_meta(s, dir, s->experiment_id, name, error, size);
        if (result != STORE_OK) rmdir(dir);  // no experiment's folder without its meta.yaml
        if (result == STORE_OK) result = scan_experiments(s, name, &lowest, &next, error, size);
        if (result == STORE_OK && lowest >= 0 && lowest < id) {  // another run made it first
            char meta[PATH_MAX + 48];
            snprintf(meta, sizeof meta, "%s/meta.yaml", dir);
            unlink(meta);
            rmdir(dir);
            snprintf(s->experiment_id, sizeof s->experiment_id, "%ld", lowest);
        }
        return result;
    }
}

static StoreResult write_run_meta(FileStore *s, const char *run_id, RunStatus status, long long end_ms,
                                  char *error, size_t size) {
    char quoted[600], end[32], uri[2 * PATH_MAX + 32], where[PATH_MAX + 32], user_quoted[600], meta[4 * PATH_MAX + 1024];
    yaml_quote(s->run_name, quoted, sizeof quoted);
    snprintf(where, sizeof where, "file://%s/artifacts", s->run_dir);
    yaml_quote(where, uri, sizeof uri);
    if (end_ms) snprintf(end, sizeof end, "%lld", end_ms);
    else snprintf(end, sizeof end, "null");
    const char *user = getenv("USER");
    struct passwd *account = user && *user ? NULL : getpwuid(geteuid());
    if (account) user = account->pw_name;
    yaml_quote(user && *user ? user : "unknown", user_quoted, sizeof user_quoted);
    snprintf(meta, sizeof meta,
             "artifact_uri: %s\nend_time: %s\nentry_point_name: ''\nexperiment_id: '%s'\n"
             "lifecycle_stage: active\nrun_id: '%s'\nrun_name: %s\nrun_uuid: '%s'\nsource_name: ''\nsource_type: 4\n"
             "source_version: ''\nstart_time: %lld\nstatus: %d\ntags: []\nuser_id: %s\n",
             uri, end, s->experiment_id, run_id, quoted, run_id, s->start_ms, (int)status, user_quoted);
    return write_file_in(s, s->run_dir, "meta.yaml", meta, error, size);
}

static StoreResult file_log_batch(MlflowStore *store, const char *run_id, TrackingRecord *records, int n,
                                  char *error, size_t size);

// Removes a run's folder that file_create_run made and could not complete: its files, its folders of
// files (metrics/, params/, tags/, artifacts/), and itself. Everything in it is this process's own: the
// run's id is new.
static void remove_run_folder(const char *run_dir) {
    const char *folders[] = {"/metrics", "/params", "/tags", "/artifacts", ""};
    for (int i = 0; i < 5; i++) {
        char dir[PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s%s", run_dir, folders[i]);
        DIR *listing = opendir(dir);
        if (!listing) continue;
        struct dirent *entry;
        while ((entry = readdir(listing))) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
            char path[PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
            if (unlink(path) != 0 && errno == EISDIR) rmdir(path);
        }
        closedir(listing);
        rmdir(dir);
    }
}

static StoreResult file_create_run(MlflowStore *store, const char *experiment, const char *run_name,
                                   long long start_ms, const TrackingRecord *tags, int n_tags, char run_id[33],
                                   char *error, size_t size) {
    FileStore *s = (FileStore *)store;
    StoreResult result = find_or_create_experiment(s, experiment, error, size);
    if (result != STORE_OK) return result;
    unsigned char bytes[16];
    if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes)
        return store_failed(STORE_RETRY, error, size, "no random bytes for a run id: %s", strerror(errno));
    for (int i = 0; i < 16; i++) snprintf(run_id + 2 * i, 3, "%02x", bytes[i]);
    if (snprintf(s->run_dir, sizeof s->run_dir, "%s/%s/%s", s->root, s->experiment_id, run_id) >= (int)sizeof s->run_dir)
        return store_failed(STORE_REFUSED, error, size, "the folder %s is too deep for a run", s->root);
    snprintf(s->run_name, sizeof s->run_name, "%s", run_name);
    s->start_ms = start_ms;
    // meta.yaml first, renamed into place: MLflow's reader refuses a run's folder without one (a full
    // disk had left one). Then the record folders and the tags; if any of them fails, the run's folder
    // goes whole, and the reader sees no run at all rather than half of one.
    if (!make_dir(s->run_dir))
        return store_failed(errno_result(), error, size, "cannot create %s: %s", s->run_dir, strerror(errno));
    result = write_run_meta(s, run_id, RUN_RUNNING, 0, error, size);
    const char *folders[] = {"/metrics", "/params", "/tags", "/artifacts"};
    for (int i = 0; i < 4 && result == STORE_OK; i++) {
        char dir[PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s%s", s->run_dir, folders[i]);
        if (!make_dir(dir)) result = store_failed(errno_result(), error, size, "cannot create %s: %s", dir, strerror(errno));
    }
    if (result == STORE_OK) {
        TrackingRecord *copy = xmalloc((size_t)(n_tags > 0 ? n_tags : 1) * sizeof *copy);  // log_batch marks them
        if (n_tags) memcpy(copy, tags, (size_t)n_tags * sizeof *copy);
        result = file_log_batch(store, run_id, copy, n_tags, error, size);
        free(copy);
    }
    if (result != STORE_OK) remove_run_folder(s->run_dir);
    return result;
}

// Every step in a metric file (its whole lines' third fields) into `held`, under `key`.
static void read_steps(const char *path, const char *key, RunHoldings *held) {
    FILE *file = fopen(path, "r");
    if (!file) return;
    char line[256];
    while (fgets(line, sizeof line, file)) {
        long long timestamp;
        double value;
        long step;
        if (strchr(line, '\n') && sscanf(line, "%lld %lf %ld", &timestamp, &value, &step) == 3)
            run_holdings_add_step(held, key, step);
    }
    fclose(file);
}

static StoreResult file_resume_run(MlflowStore *store, const char *run_id, bool *found, RunHoldings *held,
                                   char *error, size_t size) {
    FileStore *s = (FileStore *)store;
    *found = false;
    DIR *root = opendir(s->root);
    if (!root) return store_failed(errno_result(), error, size, "cannot read %s: %s", s->root, strerror(errno));
    struct dirent *entry;
    while (!*found && (entry = readdir(root))) {
        if (entry->d_name[0] == '.') continue;
        char meta[PATH_MAX + 600];
        snprintf(meta, sizeof meta, "%s/%s/%s/meta.yaml", s->root, entry->d_name, run_id);
        if (access(meta, R_OK) != 0) continue;
        if (snprintf(s->experiment_id, sizeof s->experiment_id, "%s", entry->d_name) >= (int)sizeof s->experiment_id ||
            snprintf(s->run_dir, sizeof s->run_dir, "%s/%s/%s", s->root, entry->d_name, run_id) >= (int)sizeof s->run_dir)
            continue;
        read_yaml_field(meta, "run_name", s->run_name, sizeof s->run_name);
        char start[32] = "0";
        read_yaml_field(meta, "start_time", start, sizeof start);
        s->start_ms = atoll(start);
        *found = true;
    }
    closedir(root);
    if (!*found) return STORE_OK;
    // Each metric file's steps, and the params' file names (a temporary file is in the run's folder,
    // never in these two).
    const char *kinds[] = {"metrics", "params"};
    for (int k = 0; k < 2; k++) {
        char folder[PATH_MAX + 16];
        snprintf(folder, sizeof folder, "%s/%s", s->run_dir, kinds[k]);
        DIR *dir = opendir(folder);
        if (!dir) continue;
        while ((entry = readdir(dir))) {
            if (entry->d_name[0] == '.') continue;
            char path[PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
            if (k == 0) read_steps(path, entry->d_name, held);
            else run_holdings_add_param(held, entry->d_name);
        }
        closedir(dir);
    }
    return write_run_meta(s, run_id, RUN_RUNNING, 0, error, size);
}

static StoreResult file_log_batch(MlflowStore *store, const char *run_id, TrackingRecord *records, int n,
                                  char *error, size_t size) {
    FileStore *s = (FileStore *)store;
    (void)run_id;
    for (int i = 0; i < n; i++)
        if (!records[i].stored && !key_is_file_name(records[i].key))
            return store_failed(STORE_REFUSED, error, size, "%s is not a key for a file store (letters, digits, _ - . "
                          "and space)", QUOTE(records[i].key));
    // Params and tags: a file each. Metrics: all of one key's lines in one write(). Each record is
    // marked stored as soon as its file holds it, so that a failure further on (the disk full at the
    // next key) leaves the caller knowing what was written, and a retry does not write it again.
    bool *done = xcalloc(n > 0 ? (size_t)n : 1, sizeof *done);
    StoreResult result = STORE_OK;
    for (int i = 0; i < n && result == STORE_OK; i++) {
        if (done[i] || records[i].stored) continue;
        TrackingRecord *r = &records[i];
        char dir[PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s/%s", s->run_dir, r->kind == RECORD_PARAM ? "params" : r->kind == RECORD_TAG ? "tags" : "metrics");
        if (r->kind == RECORD_PARAM) {  // as MLflow: a param, once logged, keeps its value
            char path[PATH_MAX + 300], old[8192];
            snprintf(path, sizeof path, "%s/%s", dir, r->key);
            FILE *file = fopen(path, "rb");
            if (file) {
                size_t got = fread(old, 1, sizeof old - 1, file);
                fclose(file);
                old[got] = '\0';
                done[i] = true;
                if (strcmp(old, r->value) == 0) {
                    r->stored = true;
                    continue;
                }
                result = store_failed(STORE_REFUSED, error, size, "INVALID_PARAMETER_VALUE: param '%s' is %s, not %s: "
                                "a param cannot change", r->key, QUOTE(old), QUOTE(r->value));
                continue;
            }
        }
        if (r->kind != RECORD_METRIC) {
            // The temporary file goes in the run's folder, not in params/ or tags/, where the reader
            // would take it for a record.
            char target[PATH_MAX + 300];
            snprintf(target, sizeof target, "%s/%s", dir, r->key);
            result = write_file_via(s, s->run_dir, target, r->value, error, size);
            done[i] = true;
            r->stored = result == STORE_OK;
            continue;
        }
        size_t cap = 4096, len = 0;
        char *lines = xmalloc(cap);
        for (int k = i; k < n; k++) {
            if (done[k] || records[k].stored || records[k].kind != RECORD_METRIC || strcmp(records[k].key, r->key) != 0)
                continue;
            if (cap - len < 128) lines = xrealloc(lines, cap *= 2);
            len += (size_t)snprintf(lines + len, cap - len, "%lld %.17g %ld\n", records[k].timestamp_ms,
                                    records[k].number, records[k].step);
            done[k] = true;
        }
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, r->key);
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0666);
        ssize_t wrote = fd >= 0 ? write(fd, lines, len) : -1;
        if (fd >= 0 && wrote == (ssize_t)len) {
            for (int k = i; k < n; k++)
                if (done[k] && records[k].kind == RECORD_METRIC && strcmp(records[k].key, r->key) == 0) records[k].stored = true;
        } else {
            int saved = wrote >= 0 ? ENOSPC : errno;  // a short write's reason: the disk (or the quota) is full
            // A short write leaves part of a line, which MLflow would read as a value with step 0: cut
            // the file back to the length it had, and none of these lines is written. An empty metric
            // file breaks MLflow's search_runs: remove one that this write created.
            if (fd >= 0) {
                off_t end = lseek(fd, 0, SEEK_END);
                if (wrote > 0 && end >= wrote && ftruncate(fd, end -= wrote) != 0) end = -1;
                if (end == 0) unlink(path);
            }
            errno = saved;
            result = store_failed(errno_result(), error, size, "cannot append to %s: %s", path, strerror(errno));
        }
        if (fd >= 0) close(fd);
        free(lines);
    }
    free(done);
    return result;
}

StoreResult store_copy_artifact(const char *path, const char *temp_dir, const char *folder, char *error, size_t size) {
    static unsigned counter;  // one store call at a time (tracking.c's store lock)
    FILE *in = fopen(path, "rb");
    if (!in) return store_failed(STORE_REFUSED, error, size, "cannot read artifact %s: %s", path, strerror(errno));
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char temp[PATH_MAX + 64], target[2 * PATH_MAX];
    snprintf(temp, sizeof temp, "%s/.tmp.%ld.%u", temp_dir, (long)getpid(), counter++);
    snprintf(target, sizeof target, "%s/%s", folder, base);
    FILE *out = make_dirs(folder) ? fopen(temp, "wb") : NULL;
    if (!out) {
        int saved = errno;
        fclose(in);
        errno = saved;
        return store_failed(errno_result(), error, size, "cannot write in %s: %s", folder, strerror(saved));
    }
    char buffer[1 << 16];
    size_t got;
    bool ok = true;
    while (ok && (got = fread(buffer, 1, sizeof buffer, in)) > 0) ok = fwrite(buffer, 1, got, out) == got;
    ok = ok && !ferror(in);
    fclose(in);
    ok = (fclose(out) == 0) && ok;
    if (!ok || rename(temp, target) != 0) {
        StoreResult result = errno_result();
        int saved = errno;
        unlink(temp);
        return store_failed(result, error, size, "cannot copy %s to %s: %s", path, target, strerror(saved));
    }
    return STORE_OK;
}

// The temporary file goes in the run's folder, which MLflow does not list as artifacts.
static StoreResult file_log_artifact(MlflowStore *store, const char *run_id, const char *path, char *error,
                                     size_t size) {
    FileStore *s = (FileStore *)store;
    (void)run_id;
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/artifacts", s->run_dir);
    return store_copy_artifact(path, s->run_dir, dir, error, size);
}

static StoreResult file_set_status(MlflowStore *store, const char *run_id, RunStatus status, long long end_ms,
                                   char *error, size_t size) {
    return write_run_meta((FileStore *)store, run_id, status, end_ms, error, size);
}

static void file_close(MlflowStore *store) { free(store); }

static const MlflowStoreOps file_ops = {
    .create_run = file_create_run,
    .resume_run = file_resume_run,
    .log_batch = file_log_batch,
    .log_artifact = file_log_artifact,
    .set_status = file_set_status,
    .close = file_close,
    .knows_outcome = true,
    .max_batch = 1000, .max_params = 1000, .max_tags = 1000,
};

MlflowStore *mlflow_file_store_open(const char *folder, char *error, size_t size) {
    // mkdir -p, then the absolute path: artifact_location and artifact_uri are file:// URIs.
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", folder);
    if (!make_dirs(path)) { snprintf(error, size, "cannot create %s: %s", path, strerror(errno)); return NULL; }
    FileStore *s = xcalloc(1, sizeof *s);
    s->base.ops = &file_ops;
    if (!realpath(path, s->root) || access(s->root, W_OK) != 0) {
        snprintf(error, size, "cannot write in %s: %s", path, strerror(errno));
        free(s);
        return NULL;
    }
    return &s->base;
}

const char *run_status_name(RunStatus status) {
    switch (status) {
        case RUN_RUNNING: return "RUNNING";
        case RUN_FINISHED: return "FINISHED";
        case RUN_FAILED: return "FAILED";
        case RUN_KILLED: return "KILLED";
    }
    return "RUNNING";
}
