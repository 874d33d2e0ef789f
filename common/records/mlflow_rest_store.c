// mlflow_rest_store.c: a run on an MLflow tracking server, through its REST API (version 2.0, the
// contract every MLflow server keeps; the server owns the database behind it). libcurl moves the
// bytes, cJSON writes and reads the JSON.
//
//   GET  /api/2.0/mlflow/experiments/get-by-name?experiment_name=N   the experiment's id, or 404
//   POST /api/2.0/mlflow/experiments/create      {name}               ... created if missing
//   POST /api/2.0/mlflow/runs/create             {experiment_id, run_name, start_time, tags}
//   GET  /api/2.0/mlflow/runs/get?run_id=R                            a resumed run's params and metrics,
//   GET  /api/2.0/mlflow/metrics/get-history?run_id=R&metric_key=K    ... and each metric's steps
//   POST /api/2.0/mlflow/runs/log-batch          {run_id, metrics, params, tags}  (1000 in all: tracking.c
//                                                                     cuts the batches to the limits)
//   POST /api/2.0/mlflow/runs/update             {run_id, status, end_time}
//   PUT  /api/2.0/mlflow-artifacts/artifacts/<experiment>/<run>/artifacts/<name>   the file's bytes,
//        through the server's artifact proxy (a run's artifact_uri is then mlflow-artifacts:/...)
//
// Authentication and TLS as MLflow's Python client reads them: MLFLOW_TRACKING_TOKEN (a bearer token),
// or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (basic); certificates verified, unless
// MLFLOW_TRACKING_INSECURE_TLS=true; MLFLOW_TRACKING_SERVER_CERT_PATH names a CA bundle. One request
// waits at most the store's timeout_s (tracking.c reads MLflow's MLFLOW_HTTP_REQUEST_TIMEOUT: 10 s
// there, where MLflow waits 120, since the end of a training waits for the last one), and not past its
// deadline; a transfer slower than 1 KB/s for half of that ends sooner; an answer is read up to 8 MiB.
// What a server sends is never echoed: an answer that is not MLflow's JSON is summarised (status,
// content type, size), and its text in a message (an error message) is bounded and escaped (quote.h).
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/check.h"
#include "base/quote.h"
#include "base/timer.h"
#include "records/mlflow_store.h"

#if HAVE_MLFLOW_HTTP
#include <cjson/cJSON.h>
#include <curl/curl.h>

typedef struct {
    MlflowStore base;
    CURL *curl;
    char url[1024];                  // the server, without a trailing slash
    char url_shown[1024];            // the same for messages: without a password (https://***@host)
    struct curl_slist *headers, *upload_headers;  // JSON requests; artifact uploads (bytes)
    char artifact_root[PATH_MAX];    // "<experiment>/<run>/artifacts" under the artifact proxy, or ""
    char artifact_dir[PATH_MAX];     // the run's artifact folder where its URI is a path (file: or plain), or ""
    char artifact_uri[PATH_MAX];     // the run's, as the server gave it
} RestStore;

// MLflow's answers are small: an id, a run, a page of a metric's history (25000 values, some 2 MB). An
// answer past this is not MLflow's (a server streaming without end grew the client to 4 GB in 10 s):
// its transfer is stopped there, and the request counts as refused.
#define REPLY_CAP ((size_t)8 << 20)
#define REPLY_CAP_TEXT "8 MiB"
// A transfer that moves less than this many bytes a second for half the request's timeout (5 s at
// MLflow's 10) ends there; the whole request ends at its timeout in any case.
#define LOW_SPEED_BYTES 1024L
// Text of the server's in a message (MLflow's error message, a content type) is shown as it is up to
// this many bytes when it is plain text, and quoted otherwise (quote.h: a bounded prefix, escaped).
#define SERVER_TEXT_SHOWN 300

typedef struct {
    char *data;
    size_t len, cap;
    bool too_big;  // the answer passed REPLY_CAP: the transfer was stopped
    bool said_too_big;  // ... its length said so: not a byte of it was read
} Buffer;

static size_t collect(char *data, size_t size, size_t count, void *user) {
    Buffer *b = user;
    size_t n = size * count;
    if (n > REPLY_CAP - b->len) {  // a short count ends the transfer (CURLE_WRITE_ERROR)
        b->too_big = true;
        return 0;
    }
    if (b->len + n + 1 > b->cap) {
        b->cap = 2 * (b->len + n + 1);
        if (b->cap > REPLY_CAP + 1) b->cap = REPLY_CAP + 1;
        b->data = xrealloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

// libcurl asks between its reads and writes, and about once a second while it waits for an answer: a
// request under way ends when tracking.c cancels it, or at the deadline.
static int cancelled(void *user, curl_off_t down_total, curl_off_t down_now, curl_off_t up_total, curl_off_t up_now) {
    RestStore *s = user;
    (void)down_total, (void)down_now, (void)up_total, (void)up_now;
    double deadline = s->base.deadline;
    return (s->base.cancel && *s->base.cancel) || (deadline > 0 && wall_seconds() >= deadline);
}

// The server's text shown in a message: itself when short plain text, else its quotation (into out).
static const char *server_text(char out[QUOTE_SIZE], const char *text) {
    size_t len = strlen(text);
    return len <= SERVER_TEXT_SHOWN && first_non_text(text, len) == len ? text : quote_text(out, QUOTE_SIZE, text, len);
}

// What an answer that is not MLflow's was, in a few words and never its bytes (a proxy's HTML page, a
// binary file): "text/html, 1234 bytes", "no content type, more than 8 MiB".
static void describe_answer(CURL *curl, const Buffer *answer, char *out, size_t size) {
    char *type = NULL;
    curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
    char quoted[QUOTE_SIZE];
    if (answer->too_big)
        snprintf(out, size, "%s, more than " REPLY_CAP_TEXT " (%s)", type ? server_text(quoted, type) : "no content type",
                 answer->said_too_big ? "its length said so: not read" : "stopped there");
    else
        snprintf(out, size, "%s, %zu byte%s", type ? server_text(quoted, type) : "no content type", answer->len,
                 answer->len == 1 ? "" : "s");
}

// One request. `body` (JSON) for POST, `upload` (a file) for PUT, neither for GET. On a 2xx answer
// returns STORE_OK and the parsed answer in *reply (NULL for an empty one; the caller frees it).
// Otherwise the error names the endpoint and the reason: MLflow's error_code and message for a 4xx
// (refused: sending it again changes nothing, except 429, too many requests), libcurl's for no answer
// and the status for a 5xx (both worth a retry, after the Retry-After the answer asked for, if any,
// in base.retry_after). An answer that is not MLflow's JSON, or larger than MLflow's ever are, is
// summarised (status, content type, size), never shown. The messages name the endpoint, not the URL,
// which may hold a password: tracking.c names the server.
static StoreResult request(RestStore *s, const char *method, const char *endpoint, const cJSON *body,
                           FILE *upload, long upload_size, cJSON **reply, long *http_status, char *error,
                           size_t size) {
    char url[2048];
    snprintf(url, sizeof url, "%s%s", s->url, endpoint);
    endpoint = PATH_SHOWN(endpoint);  // in messages (a path the server gave may be in it)
    s->base.retry_after = 0;
    double seconds = s->base.timeout_s > 0 ? s->base.timeout_s : 10.0, deadline = s->base.deadline;
    if (deadline > 0 && deadline - wall_seconds() < seconds) seconds = deadline - wall_seconds();
    if (seconds < 0.001) {
        if (http_status) *http_status = 0;
        return store_failed(STORE_RETRY, error, size, "%s: no time left to send it", endpoint);
    }
    char *text = body ? cJSON_PrintUnformatted(body) : NULL;
    Buffer answer = {0};
    char curl_error[CURL_ERROR_SIZE] = "";
    curl_easy_reset(s->curl);
    curl_easy_setopt(s->curl, CURLOPT_URL, url);
    curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);  // a thread of its own: no SIGALRM for timeouts
    curl_easy_setopt(s->curl, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, &answer);
    // An answer that says it is larger than the cap is refused before its first byte; one that does
    // not say (chunked, or until the connection closes) is stopped by collect() at the cap.
    curl_easy_setopt(s->curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)REPLY_CAP);
    // The whole request ends at its timeout; a server that drips its answer (or takes the upload a byte
    // at a time) ends sooner, at half of it.
    curl_easy_setopt(s->curl, CURLOPT_TIMEOUT_MS, (long)(seconds * 1000));
    curl_easy_setopt(s->curl, CURLOPT_LOW_SPEED_LIMIT, LOW_SPEED_BYTES);
    curl_easy_setopt(s->curl, CURLOPT_LOW_SPEED_TIME, (long)fmax(1, ceil(seconds / 2)));
    curl_easy_setopt(s->curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(s->curl, CURLOPT_XFERINFOFUNCTION, cancelled);
    curl_easy_setopt(s->curl, CURLOPT_XFERINFODATA, s);
    const char *insecure = getenv("MLFLOW_TRACKING_INSECURE_TLS");
    if (insecure && strcasecmp(insecure, "true") == 0) {
        curl_easy_setopt(s->curl, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(s->curl, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    const char *ca = getenv("MLFLOW_TRACKING_SERVER_CERT_PATH");
    if (ca && *ca) curl_easy_setopt(s->curl, CURLOPT_CAINFO, ca);
    const char *user = getenv("MLFLOW_TRACKING_USERNAME"), *password = getenv("MLFLOW_TRACKING_PASSWORD");
    if (user && *user) {
        curl_easy_setopt(s->curl, CURLOPT_USERNAME, user);
        curl_easy_setopt(s->curl, CURLOPT_PASSWORD, password ? password : "");
    }
    curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, s->headers);
    if (text) {
        curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, text);
    } else if (upload) {
        curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, s->upload_headers);
        curl_easy_setopt(s->curl, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(s->curl, CURLOPT_READDATA, upload);
        curl_easy_setopt(s->curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)upload_size);
    }
    (void)method;
    CURLcode code = curl_easy_perform(s->curl);
    free(text);
    long status = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
    if (http_status) *http_status = status;
    char what[QUOTE_SIZE + 96];  // the answer, summarised
    StoreResult result = STORE_OK;
    if (answer.too_big || code == CURLE_FILESIZE_EXCEEDED) {
        answer.said_too_big = !answer.too_big;
        answer.too_big = true;
        describe_answer(s->curl, &answer, what, sizeof what);
        result = store_failed(STORE_REFUSED, error, size, "%s: HTTP %ld, %s: no MLflow answer is that large (is %s an "
                              "MLflow tracking server?)", endpoint, status, what, s->url_shown);
    } else if (code == CURLE_ABORTED_BY_CALLBACK && !(s->base.cancel && *s->base.cancel)) {
        result = store_failed(STORE_RETRY, error, size, "%s: no answer before the end's deadline", endpoint);
    } else if (code != CURLE_OK) {
        result = store_failed(STORE_RETRY, error, size, "%s: %s", endpoint, *curl_error ? curl_error : curl_easy_strerror(code));
    } else if (status < 200 || status > 299) {
        cJSON *json = answer.data ? cJSON_Parse(answer.data) : NULL;
        const cJSON *error_code = cJSON_GetObjectItemCaseSensitive(json, "error_code");
        const cJSON *message = cJSON_GetObjectItemCaseSensitive(json, "message");
        StoreResult kind = status >= 500 || status == 429 ? STORE_RETRY : STORE_REFUSED;
        const char *hint = status == 401 || status == 403
            ? " (the credentials: MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)" : "";
        if (cJSON_IsString(error_code) && cJSON_IsString(message)) {
            char code_shown[QUOTE_SIZE], message_shown[QUOTE_SIZE];
            result = store_failed(kind, error, size, "%s: HTTP %ld, %s: %s%s", endpoint, status,
                                  server_text(code_shown, error_code->valuestring),
                                  server_text(message_shown, message->valuestring), hint);
        } else {  // a proxy's page, a web server's: not MLflow's JSON, and not worth a screen of HTML
            describe_answer(s->curl, &answer, what, sizeof what);
            result = store_failed(kind, error, size, "%s: HTTP %ld, %s, not an MLflow answer (is %s an MLflow "
                                  "tracking server, at its root address?)%s", endpoint, status, what, s->url_shown, hint);
        }
        if (http_status && !cJSON_IsString(error_code)) *http_status = -status;  // not MLflow's own 404
        cJSON_Delete(json);
        // 429 and 503 may say when to come back: in seconds, or as a date (libcurl reads both).
        curl_off_t wait = 0;
        if (kind == STORE_RETRY && curl_easy_getinfo(s->curl, CURLINFO_RETRY_AFTER, &wait) == CURLE_OK && wait > 0)
            s->base.retry_after = (double)wait;
    } else if (reply) {
        *reply = answer.len ? cJSON_Parse(answer.data) : NULL;
        if (answer.len && !*reply) {
            describe_answer(s->curl, &answer, what, sizeof what);
            result = store_failed(STORE_REFUSED, error, size, "%s: HTTP %ld, %s, not JSON (is %s an MLflow tracking "
                                  "server, at its root address?)", endpoint, status, what, s->url_shown);
        }
    }
    free(answer.data);
    return result;
}

static const char *json_string(const cJSON *object, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

static cJSON *key_values(const TrackingRecord *records, int n, RecordKind kind) {
    cJSON *array = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        if (records[i].kind != kind || records[i].stored) continue;
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "key", records[i].key);
        cJSON_AddStringToObject(item, "value", records[i].value);
        cJSON_AddItemToArray(array, item);
    }
    return array;
}

// The experiment's id by name, created if missing (two runs creating it at once: the loser finds it).
static StoreResult experiment_id(RestStore *s, const char *name, char *id, size_t id_size, char *error, size_t size) {
    for (int attempt = 0; attempt < 2; attempt++) {
        char *escaped = curl_easy_escape(s->curl, name, 0);
        char endpoint[1024];
        snprintf(endpoint, sizeof endpoint, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=%s", escaped);
        curl_free(escaped);
        cJSON *reply = NULL;
        long status = 0;
        StoreResult result = request(s, "GET", endpoint, NULL, NULL, 0, &reply, &status, error, size);
        if (result == STORE_OK) {
            const cJSON *experiment = cJSON_GetObjectItemCaseSensitive(reply, "experiment");
            const char *found = json_string(experiment, "experiment_id");
            const char *stage = json_string(experiment, "lifecycle_stage");
            char found_shown[QUOTE_SIZE];
            if (found && stage && strcmp(stage, "active") != 0)
                result = store_failed(STORE_REFUSED, error, size, "experiment %s (id %s) is deleted on %s: restore it, or "
                                "choose another --experiment", QUOTE(name), server_text(found_shown, found), s->url_shown);
            else if (found) snprintf(id, id_size, "%s", found);
            else result = store_failed(STORE_REFUSED, error, size, "%s: no experiment_id in the answer", endpoint);
            cJSON_Delete(reply);
            return result;
        }
        if (status != 404) return result;  // MLflow's 404 is RESOURCE_DOES_NOT_EXIST: create it
        cJSON *body = cJSON_CreateObject();
        cJSON_AddStringToObject(body, "name", name);
        result = request(s, "POST", "/api/2.0/mlflow/experiments/create", body, NULL, 0, &reply, &status, error, size);
        cJSON_Delete(body);
        if (result == STORE_OK) {
            const char *created = json_string(reply, "experiment_id");
            if (created) snprintf(id, id_size, "%s", created);
            else result = store_failed(STORE_REFUSED, error, size, "experiments/create: no experiment_id in the answer");
            cJSON_Delete(reply);
            return result;
        }
        if (!strstr(error, "RESOURCE_ALREADY_EXISTS")) return result;
    }
    return STORE_REFUSED;
}

// Where the run's artifacts go, from the artifact_uri the server gave it, as MLflow's client decides:
//   mlflow-artifacts:/1/<run>/artifacts (or mlflow-artifacts://host:port/...): through the server's
//     artifact proxy (`mlflow server`'s default, --serve-artifacts): artifact_root is the path under it;
//   file:///path/1/<run>/artifacts, file:/path/..., or a plain path (a server started with
//     --default-artifact-root PATH, which overrides the proxy for its new experiments): a folder that
//     the client writes itself, MLflow's LocalArtifactRepository: artifact_dir;
//   anything else (s3://, gs://, ...): neither, and rest_log_artifact says which flags would serve it.
static void remember_artifact_uri(RestStore *s, const cJSON *info) {
    const char *uri = json_string(info, "artifact_uri");
    snprintf(s->artifact_uri, sizeof s->artifact_uri, "%s", uri ? uri : "");
    s->artifact_root[0] = s->artifact_dir[0] = '\0';
    if (!uri) return;
    const char *proxy = "mlflow-artifacts:";
    if (strncmp(uri, proxy, strlen(proxy)) == 0) {
        const char *path = uri + strlen(proxy);
        if (strncmp(path, "//", 2) == 0) {  // an authority: skip to its path
            path = strchr(path + 2, '/');
            if (!path) return;
        }
        while (*path == '/') path++;
        snprintf(s->artifact_root, sizeof s->artifact_root, "%s", path);
        return;
    }
    const char *path = NULL;
    if (strncmp(uri, "file://", 7) == 0) path = uri[7] == '/' ? uri + 7 : NULL;  // file://host/... is not ours
    else if (strncmp(uri, "file:", 5) == 0) path = uri + 5;
    else if (!strstr(uri, ":")) path = uri;  // no scheme: a path (relative: to the working folder, as MLflow's)
    if (path == uri) {
        snprintf(s->artifact_dir, sizeof s->artifact_dir, "%s", path);
    } else if (path) {
        char *decoded = curl_easy_unescape(s->curl, path, 0, NULL);  // a file: URI's %20 is a space
        snprintf(s->artifact_dir, sizeof s->artifact_dir, "%s", decoded ? decoded : path);
        curl_free(decoded);
    }
}

// The folder `levels` folders above `path` (".../1/<run>/artifacts", 3: the artifact root), in `out`.
static void folder_above(const char *path, int levels, char *out, size_t size) {
    snprintf(out, size, "%s", path);
    for (int i = 0; i < levels; i++) {
        char *slash = strrchr(out, '/');
        if (!slash) { snprintf(out, size, "."); return; }
        if (slash == out) { out[1] = '\0'; return; }
        *slash = '\0';
    }
}

static StoreResult rest_log_batch(MlflowStore *store, const char *run_id, TrackingRecord *records, int n,
                                  char *error, size_t size);

static StoreResult rest_create_run(MlflowStore *store, const char *experiment, const char *run_name,
                                   long long start_ms, const TrackingRecord *tags, int n_tags, char run_id[33],
                                   char *error, size_t size) {
    RestStore *s = (RestStore *)store;
    char id[64];
    StoreResult result = experiment_id(s, experiment, id, sizeof id, error, size);
    if (result != STORE_OK) return result;
    cJSON *body = cJSON_CreateObject(), *reply = NULL;
    cJSON_AddStringToObject(body, "experiment_id", id);
    cJSON_AddStringToObject(body, "run_name", run_name);
    cJSON_AddNumberToObject(body, "start_time", (double)start_ms);
    const char *user = getenv("USER");
    if (user && *user) cJSON_AddStringToObject(body, "user_id", user);
    cJSON_AddItemToObject(body, "tags", key_values(tags, n_tags, RECORD_TAG));
    result = request(s, "POST", "/api/2.0/mlflow/runs/create", body, NULL, 0, &reply, NULL, error, size);
    cJSON_Delete(body);
    if (result != STORE_OK) return result;
    const cJSON *info = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(reply, "run"), "info");
    const char *created = json_string(info, "run_id");
    if (!created) created = json_string(info, "run_uuid");
    if (created && strlen(created) < 33) {
        snprintf(run_id, 33, "%s", created);
        remember_artifact_uri(s, info);
    } else {
        result = store_failed(STORE_REFUSED, error, size, "runs/create: no run_id in the answer");
    }
    cJSON_Delete(reply);
    // Tags beyond the run's own (params too, should a caller pass them) go in a batch.
    if (result == STORE_OK) {
        for (int i = 0; i < n_tags && result == STORE_OK; i++) {
            TrackingRecord record = tags[i];
            if (record.kind != RECORD_TAG) result = rest_log_batch(store, run_id, &record, 1, error, size);
        }
    }
    return result;
}

static StoreResult rest_set_status(MlflowStore *store, const char *run_id, RunStatus status, long long end_ms,
                                   char *error, size_t size) {
    RestStore *s = (RestStore *)store;
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "run_id", run_id);
    cJSON_AddStringToObject(body, "status", run_status_name(status));
    if (end_ms) cJSON_AddNumberToObject(body, "end_time", (double)end_ms);
    cJSON *reply = NULL;
    StoreResult result = request(s, "POST", "/api/2.0/mlflow/runs/update", body, NULL, 0, &reply, NULL, error, size);
    cJSON_Delete(body);
    cJSON_Delete(reply);
    return result;
}

// Every step the run holds of `key`, page by page (MLflow answers 25000 values a page at most).
static StoreResult metric_steps(RestStore *s, const char *run_id, const char *key, RunHoldings *held, char *error,
                                size_t size) {
    char *escaped = curl_easy_escape(s->curl, key, 0);
    char token[256] = "";
    StoreResult result = STORE_OK;
    do {
        char endpoint[1024];
        snprintf(endpoint, sizeof endpoint, "/api/2.0/mlflow/metrics/get-history?run_id=%s&metric_key=%s&max_results=25000%s%s",
                 run_id, escaped, *token ? "&page_token=" : "", token);
        cJSON *reply = NULL;
        result = request(s, "GET", endpoint, NULL, NULL, 0, &reply, NULL, error, size);
        if (result != STORE_OK) break;
        const cJSON *metric;
        cJSON_ArrayForEach(metric, cJSON_GetObjectItemCaseSensitive(reply, "metrics")) {
            const cJSON *step = cJSON_GetObjectItemCaseSensitive(metric, "step");  // int64: a number, or text
            run_holdings_add_step(held, key, cJSON_IsNumber(step) ? (long)step->valuedouble
                                             : cJSON_IsString(step) ? atol(step->valuestring) : 0);
        }
        const char *next = json_string(reply, "next_page_token");
        char *next_escaped = next && *next ? curl_easy_escape(s->curl, next, 0) : NULL;
        snprintf(token, sizeof token, "%s", next_escaped ? next_escaped : "");
        curl_free(next_escaped);
        cJSON_Delete(reply);
    } while (*token);
    curl_free(escaped);
    return result;
}

static StoreResult rest_resume_run(MlflowStore *store, const char *run_id, bool *found, RunHoldings *held,
                                   char *error, size_t size) {
    RestStore *s = (RestStore *)store;
    *found = false;
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "/api/2.0/mlflow/runs/get?run_id=%s", run_id);
    cJSON *reply = NULL;
    long status = 0;
    StoreResult result = request(s, "GET", endpoint, NULL, NULL, 0, &reply, &status, error, size);
    if (result != STORE_OK) return status == 404 ? STORE_OK : result;  // MLflow's 404: RESOURCE_DOES_NOT_EXIST
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(reply, "run");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(run, "data");
    remember_artifact_uri(s, cJSON_GetObjectItemCaseSensitive(run, "info"));
    const cJSON *item;
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(data, "params")) {
        const char *key = json_string(item, "key");
        if (key) run_holdings_add_param(held, key);
    }
    // data.metrics holds each metric's latest value only: its history says which steps are there.
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(data, "metrics")) {
        const char *key = json_string(item, "key");
        if (key && result == STORE_OK) result = metric_steps(s, run_id, key, held, error, size);
    }
    cJSON_Delete(reply);
    if (result != STORE_OK) return result;
    *found = true;
    return rest_set_status(store, run_id, RUN_RUNNING, 0, error, size);
}

// One request for the records not yet stored; MLflow keeps a batch whole or refuses it whole.
static StoreResult rest_log_batch(MlflowStore *store, const char *run_id, TrackingRecord *records, int n,
                                  char *error, size_t size) {
    RestStore *s = (RestStore *)store;
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "run_id", run_id);
    cJSON *metrics = cJSON_AddArrayToObject(body, "metrics");
    int waiting = 0;
    for (int i = 0; i < n; i++) {
        if (records[i].stored) continue;
        waiting++;
        if (records[i].kind != RECORD_METRIC) continue;
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "key", records[i].key);
        double v = records[i].number;
        // JSON has no NaN or infinity; the API's protobuf JSON takes them as strings.
        if (isfinite(v)) cJSON_AddNumberToObject(item, "value", v);
        else cJSON_AddStringToObject(item, "value", isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
        cJSON_AddNumberToObject(item, "timestamp", (double)records[i].timestamp_ms);
        cJSON_AddNumberToObject(item, "step", (double)records[i].step);
        cJSON_AddItemToArray(metrics, item);
    }
    if (waiting == 0) {
        cJSON_Delete(body);
        return STORE_OK;
    }
    cJSON_AddItemToObject(body, "params", key_values(records, n, RECORD_PARAM));
    cJSON_AddItemToObject(body, "tags", key_values(records, n, RECORD_TAG));
    cJSON *reply = NULL;
    StoreResult result = request(s, "POST", "/api/2.0/mlflow/runs/log-batch", body, NULL, 0, &reply, NULL, error, size);
    cJSON_Delete(body);
    cJSON_Delete(reply);
    if (result == STORE_OK)
        for (int i = 0; i < n; i++) records[i].stored = true;
    return result;
}

static StoreResult rest_log_artifact(MlflowStore *store, const char *run_id, const char *path, char *error,
                                     size_t size) {
    RestStore *s = (RestStore *)store;
    (void)run_id;
    if (s->artifact_dir[0]) {
        // A folder of the server's choosing: written here, as MLflow's client does, where this machine
        // has the artifact root (the same machine, or a shared filesystem). The run's folders under it
        // are made here; the root itself is not, since a root missing here is a folder of the server's
        // machine only, and files written here would be files the server never sees.
        char root[PATH_MAX], run_folder[PATH_MAX];
        struct stat info;
        folder_above(s->artifact_dir, 3, root, sizeof root);
        if (stat(root, &info) != 0 || !S_ISDIR(info.st_mode))
            return store_failed(STORE_REFUSED, error, size, "the server keeps this run's artifacts at %s, and its artifact "
                                "root %s is not a folder of this machine: start the server with --artifacts-destination "
                                "%s instead of --default-artifact-root, so that its artifact proxy takes the files, or "
                                "share that folder with this machine", PATH_SHOWN(s->artifact_uri), PATH_SHOWN(root),
                                PATH_SHOWN(root));
        folder_above(s->artifact_dir, 1, run_folder, sizeof run_folder);
        char folder_error[PATH_MAX + 256];
        StoreResult made = store_copy_artifact(path, run_folder, s->artifact_dir, folder_error, sizeof folder_error);
        if (made != STORE_OK)
            return store_failed(made, error, size, "the server keeps this run's artifacts at %s, written from here: %s",
                                PATH_SHOWN(s->artifact_uri), folder_error);
        return STORE_OK;
    }
    if (!s->artifact_root[0]) {  // s3://, gs://, ...: a store for the server's clients to write, not ours
        char root[PATH_MAX];
        folder_above(s->artifact_uri, 3, root, sizeof root);
        return store_failed(STORE_REFUSED, error, size, "the server keeps this run's artifacts at %s, which this "
                            "program cannot write: start the server with --artifacts-destination %s instead of "
                            "--default-artifact-root, so that its artifact proxy (--serve-artifacts, the default) "
                            "takes the files", s->artifact_uri[0] ? PATH_SHOWN(s->artifact_uri) : "(no artifact_uri)",
                            PATH_SHOWN(root));
    }
    FILE *file = fopen(path, "rb");
    if (!file) return store_failed(STORE_REFUSED, error, size, "cannot read artifact %s: %s", path, strerror(errno));
    fseek(file, 0, SEEK_END);
    long bytes = ftell(file);
    rewind(file);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *escaped = curl_easy_escape(s->curl, base, 0);
    char endpoint[PATH_MAX + 512];
    snprintf(endpoint, sizeof endpoint, "/api/2.0/mlflow-artifacts/artifacts/%s/%s", s->artifact_root, escaped);
    curl_free(escaped);
    StoreResult result = request(s, "PUT", endpoint, NULL, file, bytes, NULL, NULL, error, size);
    fclose(file);
    return result;
}

static void rest_close(MlflowStore *store) {
    RestStore *s = (RestStore *)store;
    curl_slist_free_all(s->headers);
    curl_slist_free_all(s->upload_headers);
    curl_easy_cleanup(s->curl);
    free(s);
    curl_global_cleanup();  // one store at a time, and no other user of libcurl in the program
}

// MLflow's limits per log-batch call (mlflow/utils/validation.py): 1000 metrics, 100 params, 100 tags,
// 1000 in all.
static const MlflowStoreOps rest_ops = {
    .create_run = rest_create_run,
    .resume_run = rest_resume_run,
    .log_batch = rest_log_batch,
    .log_artifact = rest_log_artifact,
    .set_status = rest_set_status,
    .close = rest_close,
    .max_batch = 1000, .max_params = 100, .max_tags = 100,
};

MlflowStore *mlflow_rest_store_open(const char *url, char *error, size_t size) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(error, size, "libcurl did not start");
        return NULL;
    }
    RestStore *s = xcalloc(1, sizeof *s);
    s->base.ops = &rest_ops;
    s->curl = curl_easy_init();
    snprintf(s->url, sizeof s->url, "%s", url);
    for (size_t n = strlen(s->url); n > 0 && s->url[n - 1] == '/'; n--) s->url[n - 1] = '\0';
    const char *scheme_end = strstr(s->url, "://"), *at = scheme_end ? strchr(scheme_end + 3, '@') : NULL;
    const char *path = scheme_end ? strchr(scheme_end + 3, '/') : NULL;
    if (at && (!path || at < path))
        snprintf(s->url_shown, sizeof s->url_shown, "%.*s***%s", (int)(scheme_end + 3 - s->url), s->url, at);
    else
        snprintf(s->url_shown, sizeof s->url_shown, "%s", s->url);
    s->headers = curl_slist_append(NULL, "Content-Type: application/json");
    s->upload_headers = curl_slist_append(NULL, "Content-Type: application/octet-stream");
    const char *token = getenv("MLFLOW_TRACKING_TOKEN");
    if (token && *token) {
        char header[4096];
        snprintf(header, sizeof header, "Authorization: Bearer %s", token);
        s->headers = curl_slist_append(s->headers, header);
        s->upload_headers = curl_slist_append(s->upload_headers, header);
    }
    if (!s->curl || !s->headers || !s->upload_headers) {
        snprintf(error, size, "libcurl did not start");
        rest_close(&s->base);
        return NULL;
    }
    return &s->base;
}

#else  // built without libcurl and cJSON

MlflowStore *mlflow_rest_store_open(const char *url, char *error, size_t size) {
    snprintf(error, size, "this build has no HTTP client for %s: install libcurl and cJSON (Debian: "
             "libcurl4-openssl-dev libcjson-dev; ./setup.sh does) and run make again, or log to a folder "
             "(--mlflow ./mlruns)", url);
    return NULL;
}

#endif
