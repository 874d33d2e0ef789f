#!/usr/bin/env python3
"""A stand-in for an MLflow tracking server, for the tests of the C client (common/records/mlflow_rest_store.c).

    python3 tests/mlflow_test_server.py --port-file FILE --log FILE.jsonl [--dump FILE.json] [faults]

It listens on 127.0.0.1, on a port the OS picks, and writes that port to --port-file (temp + rename)
once it listens; it serves until SIGTERM or SIGINT. It keeps, in memory, what the REST API 2.0
endpoints the client uses keep, with MLflow's JSON shapes, checks (log-batch limits, names, a param
logged again with another value) and errors ({"error_code": ..., "message": ...}; 404
RESOURCE_DOES_NOT_EXIST, 400 INVALID_PARAMETER_VALUE or RESOURCE_ALREADY_EXISTS):

    GET  /api/2.0/mlflow/experiments/get-by-name?experiment_name=N
    POST /api/2.0/mlflow/experiments/create          {name}
    POST /api/2.0/mlflow/runs/create                 {experiment_id, run_name, start_time, tags}
    GET  /api/2.0/mlflow/runs/get?run_id=R           data.metrics: each key's latest (highest step, then time)
    POST /api/2.0/mlflow/runs/log-batch              {run_id, metrics, params, tags}
    POST /api/2.0/mlflow/runs/update                 {run_id, status, end_time, run_name}
    GET  /api/2.0/mlflow/metrics/get-history?run_id=R&metric_key=K[&max_results=N&page_token=T]
    PUT  /api/2.0/mlflow-artifacts/artifacts/PATH    the bytes (kept; with --artifact-dir, also DIR/PATH)
Runs' artifact_uri is mlflow-artifacts:/<experiment>/<run>/artifacts, the artifact proxy's, or with
--default-artifact-root URI, URI/<experiment>/<run>/artifacts, which the client writes itself.
    GET  /api/2.0/mlflow-artifacts/artifacts?path=P  {"files": [{"path" (from the root), "is_dir",
                                                     "file_size"}]} under P; GET .../artifacts/PATH: the bytes

Every request is one JSON line of --log, flushed at once:
    {"time": seconds since start, "method", "path" (no query), "query": {name: value}, "headers":
     {"Authorization": ...} (if sent), "body": the JSON sent or null, "bytes": the body's length,
     "status": the HTTP status answered (null: none), "fault": the fault applied or null}
--dump FILE writes the whole store as JSON when the server stops (SIGTERM/SIGINT), temp + rename:
    {"experiments": [...], "runs": [{"info", "params", "tags", "metrics": {key: [{"timestamp",
     "value", "step"}, ...]}}], "artifacts": [{"path", "bytes"}], "requests": N}
Metric values that JSON has no number for are the API's strings "NaN", "Infinity", "-Infinity".

Faults count the requests from 1: all of them, or with --fault-path SUBSTRING only those whose path
holds it (the others are served normally). From the Nth counted request on, K of them (default: all):
    --fail-from N [--fail-count K]       500 {"error_code": "INTERNAL_ERROR"}
    --refuse-from N [--refuse-count K]   400 {"error_code": "INVALID_PARAMETER_VALUE", "message": "injected refusal"}
    --hang-from N [--hang-count K]       read the request, then never answer (the connection stays open)
    --close-from N [--close-count K]     read the request, then close the connection without an answer
Hostile servers (issue 36), the same way:
    --endless-from N                     200 application/json, no length, then bytes without end, as fast as
                                         the client reads them, until it closes the connection
    --drip-from N                        the answer (a valid one) one byte a second, its status line included
    --throttle-from N [--retry-after S]  429 {"error_code": "REQUEST_LIMIT_EXCEEDED"} with "Retry-After: S"
                                         (default 3600; "date+N": an HTTP date N seconds from now)
    --html-from N                        200 text/html, an 8-line page (a proxy's login page)
    --binary-from N                      200 application/octet-stream, 4 KB holding escape sequences, \r, \n, NUL
    --huge-from N                        200 application/json, a valid JSON object of 64 MiB (its length said)
(several at once: the first in this order close, hang, endless, drip, throttle, html, binary, huge, fail,
refuse whose range holds the request).
    --refuse-message TEXT                the message of --refuse's answers (Python escapes: \n, \x1b)
SIGUSR1 turns every fault off from then on: a server that failed a first run and serves the next.
libcurl sends a request once more, on a new connection, when a kept-alive one closes without an answer:
the client itself sees a --close only when two requests in a row are closed (--close-count 2 or more).
    --require-token TOKEN / --require-basic USER:PASSWORD   401 {"error_code": "UNAUTHENTICATED"} to a
                                         request without "Authorization: Bearer TOKEN" / that Basic pair
                                         (fault "unauthenticated"; both given: either will do)
    --deleted-experiment NAME            an experiment of that name exists, deleted (lifecycle_stage)
"""
import argparse
import base64
import email.utils
import json
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API = "/api/2.0/mlflow/"
# The faults, in the order that picks one when several ranges hold a request; the hostile ones' status.
FAULTS = ("close", "hang", "endless", "drip", "throttle", "html", "binary", "huge", "fail", "refuse")
HOSTILE = {"endless": 200, "drip": 200, "throttle": 429, "html": 200, "binary": 200, "huge": 200}
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
# mlflow/utils/validation.py
MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000
MAX_KEY, MAX_PARAM_VALUE, MAX_TAG_VALUE = 250, 6000, 8000
NAME = re.compile(r"^[/\w.\- :]*$")


class ApiError(Exception):
    HTTP = {"RESOURCE_DOES_NOT_EXIST": 404, "INVALID_PARAMETER_VALUE": 400, "RESOURCE_ALREADY_EXISTS": 400,
            "ENDPOINT_NOT_FOUND": 404, "UNAUTHENTICATED": 401, "INTERNAL_ERROR": 500, "INVALID_STATE": 500}

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message, self.status = code, message, self.HTTP[code]


def invalid(message):
    return ApiError("INVALID_PARAMETER_VALUE", message)


def now_ms():
    return int(time.time() * 1000)


def metric_value(v):
    """The API's double: a JSON number, or "NaN" / "Infinity" / "-Infinity" (protobuf's JSON)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if v in ("NaN", "Infinity", "-Infinity"):
        return float(v.replace("Infinity", "inf"))
    raise invalid(f"Got invalid value {v!r} for metric (must be a number)")


def as_json_number(x):
    return x if math.isfinite(x) else ("NaN" if math.isnan(x) else "Infinity" if x > 0 else "-Infinity")


def int64(v, what):
    """The API's int64: a JSON integer (or an integral float, or a string of digits, as protobuf takes)."""
    if isinstance(v, bool):
        raise invalid(f"{what} must be an integer, got {v!r}")
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return int(v)
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v):
        return int(v)
    raise invalid(f"{what} must be an integer, got {v!r}")


def check_key(kind, key):
    if not isinstance(key, str) or not key:
        raise invalid(f"Missing value for required parameter '{kind} key'")
    if len(key) > MAX_KEY or not NAME.match(key) or key.startswith("/") or ".." in key.split("/"):
        raise invalid(f"Invalid {kind} name: '{key}'. Names may only contain alphanumerics, underscores (_), "
                      "dashes (-), periods (.), spaces ( ), colon(:) and slashes (/), at most 250 characters")


class Store:
    """Experiments, runs and artifacts in memory; one lock around every request's work."""

    def __init__(self, artifact_dir, artifact_root=None):
        self.lock = threading.Lock()
        self.artifact_root = artifact_root  # --default-artifact-root: the experiments' artifact_location
        self.experiments = {}  # id -> MLflow's Experiment JSON
        self.runs = {}         # run id -> {"info", "params", "tags", "metrics": {key: [metric, ...]}}
        self.artifacts = {}    # path -> bytes
        self.artifact_dir = artifact_dir
        self.add_experiment("Default")

    def add_experiment(self, name, stage="active"):
        eid = str(len(self.experiments))
        t = now_ms()
        # As `mlflow server`: its artifact proxy's URI, or with --default-artifact-root ROOT, ROOT/<id>
        # (then the clients write the files there themselves, and the proxy never sees them).
        location = f"{self.artifact_root.rstrip('/')}/{eid}" if self.artifact_root else f"mlflow-artifacts:/{eid}"
        self.experiments[eid] = {"experiment_id": eid, "name": name, "artifact_location": location,
                                 "lifecycle_stage": stage, "creation_time": t, "last_update_time": t}
        return eid

    def run(self, run_id, active=False):
        if not isinstance(run_id, str) or not run_id:
            raise invalid("Missing value for required parameter 'run_id'")
        if run_id not in self.runs:
            raise ApiError("RESOURCE_DOES_NOT_EXIST", f"Run '{run_id}' not found")
        run = self.runs[run_id]
        if active and run["info"]["lifecycle_stage"] != "active":
            raise invalid(f"The run {run_id} must be in the 'active' state. Current state is deleted.")
        return run

    def run_json(self, run):
        latest = [max(values, key=lambda m: (m["step"], m["timestamp"], m["value"]))
                  for values in run["metrics"].values()]
        info = {k: v for k, v in run["info"].items() if v is not None}
        return {"info": info, "data": {
            "metrics": [dict(m, value=as_json_number(m["value"])) for m in latest],
            "params": [{"key": k, "value": v} for k, v in run["params"].items()],
            "tags": [{"key": k, "value": v} for k, v in run["tags"].items()]}, "inputs": {}}

    # ---- the endpoints: (method, name) -> handler(query, body) -> JSON answer
    def get_by_name(self, q, body):
        name = q.get("experiment_name")
        if not name:
            raise invalid("Missing value for required parameter 'experiment_name'")
        for e in self.experiments.values():
            if e["name"] == name:
                return {"experiment": e}
        raise ApiError("RESOURCE_DOES_NOT_EXIST", f"Could not find experiment with name '{name}'")

    def create_experiment(self, q, body):
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("Missing value for required parameter 'name'")
        if any(e["name"] == name for e in self.experiments.values()):
            raise ApiError("RESOURCE_ALREADY_EXISTS", f"Experiment '{name}' already exists.")
        return {"experiment_id": self.add_experiment(name)}

    def create_run(self, q, body):
        eid = body.get("experiment_id")
        if eid not in self.experiments:
            raise ApiError("RESOURCE_DOES_NOT_EXIST", f"No Experiment with id={eid} exists")
        if self.experiments[eid]["lifecycle_stage"] != "active":
            raise ApiError("INVALID_STATE", f"Experiment id={eid} must be active")  # MLflow's 500
        tags = self.key_values(body.get("tags", []), "tag", MAX_TAG_VALUE)
        name = body.get("run_name") or tags.get("mlflow.runName") or "run-" + uuid.uuid4().hex[:8]
        if tags.get("mlflow.runName", name) != name:
            raise invalid(f"Both 'run_name' argument and 'mlflow.runName' tag are specified, but with different "
                          f"values (run_name='{name}', mlflow.runName='{tags['mlflow.runName']}').")
        tags["mlflow.runName"] = name
        run_id = uuid.uuid4().hex
        info = {"run_id": run_id, "run_uuid": run_id, "run_name": name, "experiment_id": eid,
                "user_id": body.get("user_id", ""), "status": "RUNNING",
                "start_time": int64(body.get("start_time", now_ms()), "start_time"), "end_time": None,
                "artifact_uri": f"{self.experiments[eid]['artifact_location']}/{run_id}/artifacts",
                "lifecycle_stage": "active"}
        self.runs[run_id] = {"info": info, "params": {}, "tags": tags, "metrics": {}}
        return {"run": self.run_json(self.runs[run_id])}

    def get_run(self, q, body):
        return {"run": self.run_json(self.run(q.get("run_id")))}

    def key_values(self, items, kind, max_value):
        if not isinstance(items, list):
            raise invalid(f"{kind}s must be a list")
        out = {}
        for item in items:
            key, value = item.get("key"), item.get("value", "")
            check_key(kind, key)
            if not isinstance(value, str) or len(value) > max_value:
                raise invalid(f"{kind} '{key}' has a value that is not text of at most {max_value} characters")
            out[key] = value
        return out

    def log_batch(self, q, body):
        run = self.run(body.get("run_id"), active=True)
        metrics, params, tags = (body.get(k, []) for k in ("metrics", "params", "tags"))
        for items, kind, most in ((metrics, "metrics", MAX_METRICS), (params, "params", MAX_PARAMS),
                                  (tags, "tags", MAX_TAGS)):
            if not isinstance(items, list):
                raise invalid(f"{kind} must be a list")
            if len(items) > most:
                raise invalid(f"A batch logging request can contain at most {most} {kind}. Got {len(items)} "
                              f"{kind}. Please split up {kind} across multiple requests and try again.")
        total = len(metrics) + len(params) + len(tags)
        if total > MAX_ENTITIES:
            raise invalid(f"A batch logging request can contain at most {MAX_ENTITIES} metrics, params, and tags "
                          f"in total. Got {total} in total.")
        # Everything is checked before anything is kept: a refused batch changes nothing.
        new = []
        for m in metrics:
            check_key("metric", m.get("key"))
            if "value" not in m or "timestamp" not in m:
                raise invalid(f"Metric '{m['key']}' needs a value and a timestamp")
            new.append((m["key"], {"key": m["key"], "value": metric_value(m["value"]),
                                   "timestamp": int64(m["timestamp"], "timestamp"),
                                   "step": int64(m.get("step", 0), "step")}))
        keys = [p.get("key") for p in params]
        if len(set(keys)) != len(keys):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            raise invalid(f"Duplicate parameter keys have been submitted: {twice}")
        new_params = self.key_values(params, "param", MAX_PARAM_VALUE)
        for key, value in new_params.items():
            if key in run["params"] and run["params"][key] != value:
                raise invalid(f"Changing param values is not allowed. Param with key='{key}' was already logged with "
                              f"value='{run['params'][key]}' for run ID='{run['info']['run_id']}'. Attempted "
                              f"logging new value '{value}'.")
        new_tags = self.key_values(tags, "tag", MAX_TAG_VALUE)
        for key, m in new:
            run["metrics"].setdefault(key, []).append(m)
        run["params"].update(new_params)
        run["tags"].update(new_tags)
        if "mlflow.runName" in new_tags:
            run["info"]["run_name"] = new_tags["mlflow.runName"]
        return {}

    def update_run(self, q, body):
        run = self.run(body.get("run_id") or body.get("run_uuid"), active=True)
        info = run["info"]
        if "status" in body:
            if body["status"] not in STATUSES:
                raise invalid(f"Invalid run status {body['status']!r}")
            info["status"] = body["status"]
        if "end_time" in body:
            info["end_time"] = int64(body["end_time"], "end_time")
        if body.get("run_name"):
            info["run_name"] = run["tags"]["mlflow.runName"] = body["run_name"]
        return {"run_info": {k: v for k, v in info.items() if v is not None}}

    def metric_history(self, q, body):
        run = self.run(q.get("run_id"))
        key = q.get("metric_key")
        if not key:
            raise invalid("Missing value for required parameter 'metric_key'")
        values = run["metrics"].get(key, [])
        first = int(q.get("page_token") or 0)
        count = int(q.get("max_results") or 25000)
        page = [dict(m, value=as_json_number(m["value"])) for m in values[first:first + count]]
        answer = {"metrics": page}
        if first + count < len(values):
            answer["next_page_token"] = str(first + count)
        return answer

    def artifact_path(self, path):
        path = urllib.parse.unquote(path)
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise invalid(f"Invalid artifact path: '{path}'")
        return path

    def put_artifact(self, path, data):
        path = self.artifact_path(path)
        self.artifacts[path] = data
        if self.artifact_dir:
            target = os.path.join(self.artifact_dir, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        return {}

    def list_artifacts(self, q, body):
        under = (q.get("path") or "").strip("/")
        prefix = under + "/" if under else ""
        entries = {}
        for path, data in self.artifacts.items():
            if path.startswith(prefix):
                first, _, rest = path[len(prefix):].partition("/")
                entries[first] = {"path": prefix + first, "is_dir": True} if rest else \
                    {"path": prefix + first, "is_dir": False, "file_size": len(data)}
        return {"files": [entries[k] for k in sorted(entries)]}

    def dump(self):
        runs = [{"info": r["info"], "params": r["params"], "tags": r["tags"],
                 "metrics": {k: [dict(m, value=as_json_number(m["value"])) for m in v]
                             for k, v in r["metrics"].items()}} for r in self.runs.values()]
        return {"experiments": list(self.experiments.values()), "runs": runs,
                "artifacts": [{"path": p, "bytes": len(d)} for p, d in sorted(self.artifacts.items())]}


ROUTES = {("GET", "experiments/get-by-name"): Store.get_by_name,
          ("POST", "experiments/create"): Store.create_experiment,
          ("POST", "runs/create"): Store.create_run,
          ("GET", "runs/get"): Store.get_run,
          ("POST", "runs/log-batch"): Store.log_batch,
          ("POST", "runs/update"): Store.update_run,
          ("GET", "metrics/get-history"): Store.metric_history}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered, as a real server
    server_version = "mlflow_test_server"

    def log_message(self, *args):  # quiet: --log has every request
        pass

    def do_GET(self):
        self.serve()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def serve(self):
        srv, opt = self.server, self.server.options
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        entry = {"time": round(time.monotonic() - srv.started, 6), "method": self.command, "path": url.path,
                 "query": query, "headers": {}, "body": None, "bytes": len(raw), "status": None, "fault": None}
        if self.headers.get("Authorization") is not None:
            entry["headers"]["Authorization"] = self.headers["Authorization"]
        if raw and self.command != "PUT":
            try:
                entry["body"] = json.loads(raw)
            except ValueError:
                entry["body"] = None
        with srv.count_lock:
            srv.requests += 1
            counted = opt.fault_path is None or opt.fault_path in url.path
            srv.counted += counted
            n = srv.counted if counted else 0
        fault = next((name for name in FAULTS
                      if n and getattr(opt, name + "_from") and
                      getattr(opt, name + "_from") <= n < getattr(opt, name + "_from") + getattr(opt, name + "_count")),
                     None)
        if fault is None and srv.credentials and self.headers.get("Authorization") not in srv.credentials:
            fault = "unauthenticated"
        entry["fault"] = fault
        if fault in HOSTILE:
            entry["status"] = HOSTILE[fault]
            srv.log(entry)
            self.hostile(fault, url.path, query, raw, entry["body"])
            return
        if fault in ("close", "hang"):
            srv.log(entry)
            if fault == "close":
                self.close_connection = True
                return
            while True:  # a daemon thread: gone when the server stops
                time.sleep(3600)
        if fault == "fail":
            status, answer = 500, {"error_code": "INTERNAL_ERROR", "message": "injected failure"}
        elif fault == "refuse":
            status, answer = 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": opt.refuse_message}
        elif fault == "unauthenticated":
            status, answer = 401, {"error_code": "UNAUTHENTICATED", "message": "You are not authenticated."}
        else:
            status, answer = self.answer(url.path, query, raw, entry["body"])
        entry["status"] = status
        srv.log(entry)
        self.reply(status, answer)

    def hostile(self, fault, path, query, raw, body):
        """A hostile answer; the connection is closed after it."""
        self.close_connection = True
        if fault == "endless":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"pad\": \"")
            block = b"x" * 65536
            while True:  # until the client hangs up (BrokenPipeError, taken by handle_error)
                self.wfile.write(block)
        if fault == "drip":
            status, answer = self.answer(path, query, raw, body)
            data = json.dumps(answer).encode() if not isinstance(answer, bytes) else answer
            head = (f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                    "Connection: close\r\n\r\n").encode()
            for byte in head + data:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(1)
            return
        if fault == "throttle":
            after = self.server.options.retry_after
            if after.startswith("date+"):
                after = email.utils.formatdate(time.time() + float(after[5:]), usegmt=True)
            data = json.dumps({"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "Too many requests"}).encode()
            self.send_response(429)
            self.send_header("Retry-After", after)
            ctype = "application/json"
        elif fault == "html":
            data = (b"<!DOCTYPE html>\n<html>\n<head><title>Sign in</title></head>\n<body>\n"
                    b"<h1>Single sign-on</h1>\n<form action=/login><input name=user></form>\n</body>\n</html>\n")
            self.send_response(200)
            ctype = "text/html; charset=utf-8"
        elif fault == "binary":
            pattern = b"\x1b[2J\x1b]0;owned\x07\r\n\x00\xff\xfe\x9b31m" + bytes(range(256))
            data = (pattern * (4096 // len(pattern) + 1))[:4096]
            self.send_response(200)
            ctype = "application/octet-stream"
        else:  # huge
            data = b'{"pad": "' + b"x" * (64 << 20) + b'"}'
            self.send_response(200)
            ctype = "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def answer(self, path, query, raw, body):
        store = self.server.store
        try:
            with store.lock:
                if path.startswith(ARTIFACTS + "/") and self.command == "PUT":
                    return 200, store.put_artifact(path[len(ARTIFACTS) + 1:], raw)
                if path.startswith(ARTIFACTS + "/") and self.command == "GET":
                    name = store.artifact_path(path[len(ARTIFACTS) + 1:])
                    if name not in store.artifacts:
                        raise ApiError("RESOURCE_DOES_NOT_EXIST", f"File {name} does not exist")
                    return 200, store.artifacts[name]
                if path == ARTIFACTS and self.command == "GET":
                    return 200, store.list_artifacts(query, None)
                handler = ROUTES.get((self.command, path[len(API):])) if path.startswith(API) else None
                if handler is None:
                    raise ApiError("ENDPOINT_NOT_FOUND", f"No endpoint {self.command} {path}")
                if self.command == "POST" and not isinstance(body, dict):
                    raise invalid("The request's body is not a JSON object")
                return 200, handler(store, query, body or {})
        except ApiError as e:
            return e.status, {"error_code": e.code, "message": e.message}
        except (ValueError, TypeError, AttributeError) as e:  # a body of the wrong shape
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Malformed request: {e}"}

    def reply(self, status, answer):
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        binary = isinstance(answer, bytes)
        self.send_header("Content-Type", "application/octet-stream" if binary else "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401 and self.server.options.require_basic:
            self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, options):
        super().__init__(("127.0.0.1", 0), Handler)
        self.options, self.started = options, time.monotonic()
        self.store = Store(options.artifact_dir, options.default_artifact_root)
        for name in options.deleted_experiment:
            self.store.add_experiment(name, "deleted")
        self.credentials = set()
        if options.require_token:
            self.credentials.add("Bearer " + options.require_token)
        if options.require_basic:
            self.credentials.add("Basic " + base64.b64encode(options.require_basic.encode()).decode())
        self.count_lock, self.counted, self.requests = threading.Lock(), 0, 0
        self.log_lock, self.log_file = threading.Lock(), open(options.log, "a", encoding="utf-8")

    def handle_error(self, request, client_address):
        # A client that gave up on its answer (its timeout passed while the server was stopped by SIGSTOP,
        # or hung) closed the connection: the reply has nowhere to go, which is no error of the server's.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)

    def log(self, entry):
        with self.log_lock:
            self.log_file.write(json.dumps(entry) + "\n")
            self.log_file.flush()


def write_atomically(path, text):
    temp = f"{path}.tmp.{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(temp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port-file", required=True, help="where to write the port, once listening")
    p.add_argument("--log", required=True, help="JSON lines, one per request")
    p.add_argument("--dump", help="the whole store as JSON, written when the server stops")
    p.add_argument("--artifact-dir", help="also write each PUT artifact under this folder")
    p.add_argument("--default-artifact-root", metavar="URI",
                   help="as mlflow server's: experiments' artifact_location is URI/<id> (a path, file:, s3://...), "
                        "not the proxy's mlflow-artifacts:/<id>")
    p.add_argument("--fault-path", help="count only requests whose path holds this")
    for name, what in (("fail", "answer 500 INTERNAL_ERROR"), ("refuse", "answer 400 INVALID_PARAMETER_VALUE"),
                       ("hang", "never answer"), ("close", "close the connection, no answer"),
                       ("endless", "answer 200 and bytes without end"), ("drip", "answer one byte a second"),
                       ("throttle", "answer 429 with Retry-After"), ("html", "answer 200 with an HTML page"),
                       ("binary", "answer 200 with binary bytes"), ("huge", "answer 200 with 64 MiB of JSON")):
        p.add_argument(f"--{name}-from", type=int, metavar="N", help=f"{what} from the Nth counted request on")
        p.add_argument(f"--{name}-count", type=int, metavar="K", default=1 << 62, help="... K times (default: all)")
    p.add_argument("--retry-after", default="3600", metavar="S",
                   help="--throttle's Retry-After: seconds, or date+N for an HTTP date N seconds ahead")
    p.add_argument("--refuse-message", default="injected refusal", type=lambda t: t.encode().decode("unicode_escape"),
                   help="--refuse's message (Python escapes)")
    p.add_argument("--require-token", metavar="TOKEN", help="401 without 'Authorization: Bearer TOKEN'")
    p.add_argument("--require-basic", metavar="USER:PASSWORD", help="401 without this basic authentication")
    p.add_argument("--deleted-experiment", metavar="NAME", action="append", default=[],
                   help="an experiment of this name exists, deleted (repeatable)")
    options = p.parse_args()

    server = Server(options)

    def stop(signum, frame):
        raise KeyboardInterrupt

    def faults_off(signum, frame):
        for name in FAULTS:
            setattr(options, name + "_from", None)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGUSR1, faults_off)
    write_atomically(options.port_file, f"{server.server_address[1]}\n")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    if options.dump:
        with server.store.lock:
            dump = server.store.dump()
        dump["requests"] = server.requests
        write_atomically(options.dump, json.dumps(dump, indent=1) + "\n")
    server.log_file.close()


if __name__ == "__main__":
    sys.exit(main())
