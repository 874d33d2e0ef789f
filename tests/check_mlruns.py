#!/usr/bin/env python3
"""Read an `mlruns` folder as MLflow's FileStore does, strictly, and summarise it as JSON.

    python3 tests/check_mlruns.py MLRUNS_DIR [--json OUT] [--allow-temp] [--label LABEL]

An independent reader for the tests of common/records/mlflow_file_store.c: it shares nothing with the C code
and follows MLflow's own reader (mlflow/store/tracking/file_store.py), with meta.yaml read by
yaml.safe_load as MLflow reads it:

    MLRUNS_DIR/<experiment id>/meta.yaml             experiment_id, name, artifact_location, lifecycle_stage
    MLRUNS_DIR/<experiment id>/<run id>/meta.yaml    run_id, run_uuid, experiment_id, status (1 RUNNING,
                                                     2 SCHEDULED, 3 FINISHED, 4 FAILED, 5 KILLED), start_time,
                                                     end_time, lifecycle_stage, artifact_uri, run_name, user_id
    .../<run id>/metrics/<key>   lines "timestamp value step" (MLflow: line.strip().split(" "))
    .../<run id>/params/<key>    the value;  .../tags/<key>: the value;  .../artifacts/: the files

Every subfolder of MLRUNS_DIR but .trash and models is an experiment, and every subfolder of an
experiment but tags, datasets and traces is a run (as MLflow lists them). Stricter than MLflow, every
one of these is a problem: such a folder without a meta.yaml, or one YAML does not parse; a field
missing or of the wrong type (an unquoted id that YAML reads as a number, say); an id that differs
from its folder's name; two active experiments of one name; an artifact_location that is not an
absolute path (file: URI) ending in the experiment's id; run_name other than the mlflow.runName tag;
end_time set while RUNNING, or missing otherwise, or before start_time; an artifact_uri other than
the experiment's artifact_location/<run id>/artifacts; a metric file that is empty, has a line that
is not 3 fields (int, float, int; MLflow also takes 2) or a last line without its newline; a file in
metrics/, params/ or tags/ whose name is not a key MLflow takes (a temporary file, ".tmp..."), or a
".tmp" one among the artifacts; anything else in a run's folder or a file in an experiment's (with
--allow-temp, ".tmp*" files there are let pass: what a writer killed mid-write leaves).

Each problem is one line on stderr, and the exit status 1. Otherwise the summary goes to --json OUT
(or stdout), exit 0:
    {"experiments": [{"id", "name", "runs": [{"run_id", "run_name", "status": "FINISHED", ...,
      "start_time", "end_time", "params": {..}, "tags": {..}, "metrics": {key: [[timestamp, value,
      step], ...]}, "artifacts": [paths under artifacts/], "artifact_sizes": {path: bytes}}]}]}
in folder order of ids (numbers by value), runs by start_time; a metric's values in file order;
values that JSON has no number for as the strings "NaN", "Infinity", "-Infinity".
Without PyYAML: "SKIP LABEL: PyYAML missing (python3-yaml)" and exit 0.
"""
import argparse
import json
import math
import os
import re
import sys
import urllib.parse

STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}
STAGES = ("active", "deleted")
KEY = re.compile(r"^[/\w.\- :]*$")               # mlflow/utils/validation.py: names of params, metrics, tags
RUN_ID = re.compile(r"^[a-zA-Z0-9][\w\-]{0,255}$")  # ... _validate_run_id
RUN_ENTRIES = {"meta.yaml", "metrics", "params", "tags", "artifacts", "inputs", "outputs"}


class Checker:
    def __init__(self, root, allow_temp):
        self.root, self.allow_temp, self.problems = root, allow_temp, []

    def problem(self, where, text):
        text = " ".join(str(text).split("\n"))
        self.problems.append(f"{os.path.relpath(where, self.root) if where != self.root else '.'}: {text}")

    def meta(self, folder, fields):
        """meta.yaml as a dict, each of `fields` (name -> type or tuple of types) checked; None if unreadable."""
        path = os.path.join(folder, "meta.yaml")
        try:
            with open(path, encoding="utf-8") as f:
                meta = yaml.safe_load(f)
        except FileNotFoundError:
            self.problem(folder, "no meta.yaml")
            return None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            self.problem(path, f"unreadable: {e}")
            return None
        if not isinstance(meta, dict):
            self.problem(path, f"not a mapping: {meta!r}")
            return None
        for name, types in fields.items():
            types = types if isinstance(types, tuple) else (types,)
            if name not in meta:
                self.problem(path, f"no field {name}")
            elif not isinstance(meta[name], types) or (isinstance(meta[name], bool) and bool not in types):
                self.problem(path, f"{name} is {meta[name]!r} ({type(meta[name]).__name__}), expected "
                                   f"{' or '.join(t.__name__ for t in types)}")
        return meta

    def stray(self, folder, name):
        """A file where MLflow's reader expects none: a problem unless a temporary one, let pass."""
        if not (self.allow_temp and name.startswith(".tmp") and os.path.isfile(os.path.join(folder, name))):
            self.problem(os.path.join(folder, name), "stray entry (not part of MLflow's layout)")

    def files(self, folder):
        """The files under `folder`, as paths relative to it (os.walk, as MLflow lists metrics/params/tags)."""
        found = []
        for top, dirs, names in os.walk(folder):
            dirs.sort()
            found += sorted(os.path.relpath(os.path.join(top, n), folder) for n in names)
        return found

    def keyed(self, folder, kind):
        """{key: text} of params/ or tags/; keys MLflow would not take are problems."""
        out = {}
        for key in self.files(folder):
            path = os.path.join(folder, key)
            if not key or not KEY.match(key) or len(key) > 250 or any(part.startswith(".") for part in key.split("/")):
                self.problem(path, f"not a {kind} name MLflow takes (a temporary file?)")
                continue
            try:
                with open(path, encoding="utf-8", newline="") as f:
                    out[key] = f.read()
            except (OSError, UnicodeDecodeError) as e:
                self.problem(path, f"unreadable: {e}")
        return out

    def metric(self, path):
        """[[timestamp, value, step], ...] of a metric file, each line as MLflow's _get_metric_from_line."""
        try:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            self.problem(path, f"unreadable: {e}")
            return []
        if not text:
            self.problem(path, "empty (MLflow: 'Metric is malformed. No data found.')")
        elif not text.endswith("\n"):
            self.problem(path, f"the last line has no newline (a write cut short): {text.splitlines()[-1]!r}")
        values = []
        for number, line in enumerate(text.splitlines(), 1):
            parts = line.strip().split(" ")
            try:
                if len(parts) != 3:
                    raise ValueError(f"{len(parts)} fields, expected 3")
                ts, value, step = int(parts[0]), float(parts[1]), int(parts[2])
                values.append([ts, value if math.isfinite(value) else
                               "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity", step])
            except ValueError as e:
                self.problem(path, f"line {number} {line!r} is malformed: {e}")
        return values

    def run(self, folder, experiment_id, experiment_location):
        run_id = os.path.basename(folder)
        meta = self.meta(folder, {"run_id": str, "run_uuid": str, "experiment_id": str, "status": int,
                                  "start_time": int, "end_time": (int, type(None)), "lifecycle_stage": str,
                                  "artifact_uri": str, "run_name": str, "user_id": str})
        if meta is None:
            return None
        path = os.path.join(folder, "meta.yaml")
        if not RUN_ID.match(run_id):
            self.problem(folder, "not a run id MLflow takes")
        for field in ("run_id", "run_uuid"):
            if field in meta and meta[field] != run_id:
                self.problem(path, f"{field} {meta[field]!r} differs from the folder's name")
        if meta.get("experiment_id", experiment_id) != experiment_id:
            self.problem(path, f"experiment_id {meta['experiment_id']!r} differs from the experiment's folder")
        status = meta.get("status")
        if isinstance(status, int) and status not in STATUS:
            self.problem(path, f"status {status} is none of 1..5")
        if meta.get("lifecycle_stage") not in STAGES:
            self.problem(path, f"lifecycle_stage {meta.get('lifecycle_stage')!r} is none of {STAGES}")
        end, start = meta.get("end_time"), meta.get("start_time")
        if status == 1 and end is not None:
            self.problem(path, f"RUNNING, with an end_time ({end})")
        if status in STATUS and status != 1 and end is None:
            self.problem(path, f"{STATUS[status]}, without an end_time")
        if isinstance(end, int) and isinstance(start, int) and end < start:
            self.problem(path, f"end_time {end} before start_time {start}")
        if isinstance(experiment_location, str) and "artifact_uri" in meta and \
                meta["artifact_uri"] != f"{experiment_location.rstrip('/')}/{run_id}/artifacts":
            self.problem(path, f"artifact_uri {meta['artifact_uri']!r} is not the experiment's "
                               f"artifact_location/{run_id}/artifacts")
        for name in sorted(os.listdir(folder)):
            if name not in RUN_ENTRIES:
                self.stray(folder, name)
        sub = {name: os.path.join(folder, name) for name in ("metrics", "params", "tags", "artifacts")}
        metrics = {}
        for key in self.files(sub["metrics"]):
            if not key or not KEY.match(key) or len(key) > 250 or any(p.startswith(".") for p in key.split("/")):
                self.problem(os.path.join(sub["metrics"], key), "not a metric name MLflow takes (a temporary file?)")
            else:
                metrics[key] = self.metric(os.path.join(sub["metrics"], key))
        params, tags = self.keyed(sub["params"], "param"), self.keyed(sub["tags"], "tag")
        if "mlflow.runName" not in tags:
            self.problem(sub["tags"], "no mlflow.runName tag")
        elif "run_name" in meta and meta["run_name"] != tags["mlflow.runName"]:
            self.problem(path, f"run_name {meta['run_name']!r} differs from the mlflow.runName tag "
                               f"{tags['mlflow.runName']!r}")
        artifacts = self.files(sub["artifacts"])
        for name in artifacts:
            if any(part.startswith(".tmp") for part in name.split("/")):
                self.problem(os.path.join(sub["artifacts"], name), "a temporary file among the artifacts")
        return {"run_id": run_id, "run_name": meta.get("run_name"), "status": STATUS.get(status, status),
                "start_time": start, "end_time": end, "params": params, "tags": tags, "metrics": metrics,
                "artifacts": artifacts,
                "artifact_sizes": {a: os.path.getsize(os.path.join(sub["artifacts"], a)) for a in artifacts}}

    def experiment(self, folder):
        eid = os.path.basename(folder)
        meta = self.meta(folder, {"experiment_id": str, "name": str, "artifact_location": str,
                                  "lifecycle_stage": str})
        if meta is None:
            return None
        path = os.path.join(folder, "meta.yaml")
        if meta.get("experiment_id", eid) != eid:
            self.problem(path, f"experiment_id {meta['experiment_id']!r} differs from the folder's name")
        if meta.get("name") == "":
            self.problem(path, "an empty name")
        if meta.get("lifecycle_stage") not in STAGES:
            self.problem(path, f"lifecycle_stage {meta.get('lifecycle_stage')!r} is none of {STAGES}")
        for field in ("creation_time", "last_update_time"):  # MLflow >= 2.2 writes them; older, not
            if field in meta and not isinstance(meta[field], int):
                self.problem(path, f"{field} is {meta[field]!r}, expected an int")
        location = meta.get("artifact_location")
        if isinstance(location, str) and location.startswith("file:"):  # where the folder was written
            local = urllib.parse.unquote(urllib.parse.urlparse(location).path)
            if not os.path.isabs(local) or os.path.basename(local.rstrip("/")) != eid:
                self.problem(path, f"artifact_location {location!r} is not an absolute file URI ending in /{eid}")
        runs = []
        for name in sorted(os.listdir(folder)):
            entry = os.path.join(folder, name)
            if name in ("meta.yaml", "tags", "datasets", "traces"):
                continue
            if not os.path.isdir(entry):
                self.stray(folder, name)
                continue
            run = self.run(entry, eid, location)
            if run:
                runs.append(run)
        runs.sort(key=lambda r: (r["start_time"] if isinstance(r["start_time"], int) else 0, r["run_id"]))
        return {"id": eid, "name": meta.get("name"), "lifecycle_stage": meta.get("lifecycle_stage"), "runs": runs}

    def check(self):
        if not os.path.isdir(self.root):
            self.problem(self.root, "not a folder")
            return None
        experiments = []
        for name in sorted(os.listdir(self.root), key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)):
            entry = os.path.join(self.root, name)
            if name in (".trash", "models") or not os.path.isdir(entry):
                continue  # MLflow lists only folders, and neither of these as an experiment
            experiment = self.experiment(entry)
            if experiment:
                experiments.append(experiment)
        names = [e["name"] for e in experiments if e["lifecycle_stage"] == "active"]
        for name in sorted({n for n in names if names.count(n) > 1}, key=str):
            ids = [e["id"] for e in experiments if e["name"] == name and e["lifecycle_stage"] == "active"]
            self.problem(self.root, f"{len(ids)} active experiments named {name!r}: {', '.join(ids)}")
        for e in experiments:
            del e["lifecycle_stage"]
        return {"experiments": experiments}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mlruns", help="the folder (an MLflow FileStore)")
    p.add_argument("--json", metavar="OUT", help="write the summary here (default: stdout)")
    p.add_argument("--allow-temp", action="store_true",
                   help="let .tmp* files in a run's or an experiment's own folder pass (a writer killed mid-write)")
    p.add_argument("--label", default="mlflow", help="the SKIP line's label (default: mlflow)")
    args = p.parse_args()
    global yaml
    try:
        import yaml
    except ImportError:
        print(f"SKIP {args.label}: PyYAML missing (python3-yaml)")
        return 0
    checker = Checker(os.path.abspath(args.mlruns), args.allow_temp)
    summary = checker.check()
    if checker.problems:
        for line in checker.problems:
            print(f"check_mlruns: {line}", file=sys.stderr)
        return 1
    text = json.dumps(summary, indent=1) + "\n"
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
