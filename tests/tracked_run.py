#!/usr/bin/env python3
"""Check one tracked run against what the program printed and wrote (tests/test_tracking.sh).

    tests/tracked_run.py STORE.json --experiment NAME [--runs N] [--run K] [expectations...]

STORE.json is either tests/check_mlruns.py's summary of an mlruns folder or tests/mlflow_test_server.py's
--dump of a server's store; both are read into one shape. The run checked is the experiment's K-th
(--run, 0 by default; -1 the last), after checking that the experiment holds N runs (--runs).
Expectations:
    --status FINISHED            the run's status
    --losses FILE.csv            the metric `loss` holds exactly the CSV's steps (0..n-1, each once; in
                                 any order: a resumed run sends what its store lacks, wherever it is),
                                 with its values (the CSV's 6 significant digits or better)
    --epochs E                   epoch_mean_loss and samples_per_second at steps 0..E-1, each once
    --lacking FILE.err           ... but for the steps that the program's last line in FILE.err says the
                                 run lacks ("warning: MLflow: run ID at URI lacks KEY at steps 0-1 and 3;
                                 KEY2 at step 2: ..."): those must be missing, and no line: none
    --min_steps N                the metric `loss` holds steps 0..N-1 at least (a killed run's), each once
    --accuracy PERCENT           test_accuracy x 100, to the printed 2 decimals
    --param KEY=VALUE, --tag KEY=VALUE   (repeatable)
    --no_param KEY               (repeatable) the run has no param KEY
    --artifact FILE              (repeatable) an artifact of FILE's name and size
Prints nothing and exits 0 when every expectation holds; otherwise one line per miss on stdout, exit 1.
"""
import argparse
import csv
import json
import os
import re
import sys


def runs_of(store, experiment):
    """The experiment's runs as dicts: name, status, params, tags, metrics {key: [(step, value)]}, artifacts {name: bytes}."""
    if "runs" in store:  # the test server's dump
        ids = [e["experiment_id"] for e in store["experiments"] if e["name"] == experiment]
        if not ids:
            return None
        sizes = {a["path"]: a["bytes"] for a in store["artifacts"]}
        runs = []
        for r in store["runs"]:
            info = r["info"]
            if info["experiment_id"] != ids[0]:
                continue
            uri = info["artifact_uri"]
            if uri.startswith("mlflow-artifacts:"):  # through the server's proxy: in the dump
                prefix = uri.split(":", 1)[1].lstrip("/") + "/"
                artifacts = {p[len(prefix):]: n for p, n in sizes.items() if p.startswith(prefix)}
            else:  # a path (plain, or file:) that the client wrote itself
                folder = re.sub(r"^file:(//)?", "", uri)
                artifacts = {name: os.path.getsize(os.path.join(folder, name))
                             for name in (os.listdir(folder) if os.path.isdir(folder) else [])}
            runs.append({"name": info.get("run_name"), "status": info["status"], "start": info["start_time"],
                         "end": info.get("end_time"), "params": dict(r["params"]), "tags": dict(r["tags"]),
                         "metrics": {k: [(m["step"], float(m["value"])) for m in v] for k, v in r["metrics"].items()},
                         "artifacts": artifacts})
        return sorted(runs, key=lambda run: run["start"])
    for e in store["experiments"]:  # check_mlruns.py's summary (it checked the files already)
        if e["name"] == experiment:
            return [{"name": r["run_name"], "status": r["status"], "start": r["start_time"], "end": r["end_time"],
                     "params": r["params"], "tags": r["tags"],
                     "metrics": {k: [(step, float(value)) for _, value, step in v] for k, v in r["metrics"].items()},
                     "artifacts": r.get("artifact_sizes") or {a: None for a in r["artifacts"]}}
                    for r in e["runs"]]
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--experiment", required=True)
    p.add_argument("--runs", type=int)
    p.add_argument("--run", type=int, default=0)
    p.add_argument("--status")
    p.add_argument("--losses")
    p.add_argument("--epochs", type=int)
    p.add_argument("--lacking")
    p.add_argument("--min_steps", type=int)
    p.add_argument("--accuracy", type=float)
    p.add_argument("--param", action="append", default=[])
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--no_param", action="append", default=[])
    p.add_argument("--artifact", action="append", default=[])
    a = p.parse_args()
    misses = []
    runs = runs_of(json.load(open(a.store)), a.experiment)
    if runs is None:
        print(f"no experiment '{a.experiment}' in {a.store}")
        return 1
    if a.runs is not None and len(runs) != a.runs:
        misses.append(f"experiment '{a.experiment}' holds {len(runs)} runs, expected {a.runs}")
    if not runs:
        print("; ".join(misses) or f"experiment '{a.experiment}' holds no run")
        return 1
    run = runs[a.run]
    if a.status and run["status"] != a.status:
        misses.append(f"status {run['status']}, expected {a.status}")
    if a.status and a.status != "RUNNING" and not run["end"]:
        misses.append(f"status {run['status']} without an end time")
    if a.losses:
        with open(a.losses) as f:
            rows = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]
        logged = sorted(run["metrics"].get("loss", []), key=lambda m: m[0])
        steps = [s for s, _ in logged]
        if steps != [s for s, _ in rows]:
            dup = len(steps) - len(set(steps))
            misses.append(f"loss logged at {len(steps)} steps ({dup} twice; first {steps[:3]}, last {steps[-3:]}), "
                          f"the CSV has {len(rows)}")
        else:
            worst = max((abs(v - w) / max(abs(w), 1e-30) for (_, v), (_, w) in zip(logged, rows)), default=0)
            if worst > 5e-6:
                misses.append(f"loss values differ from the CSV's by up to {worst:.1e} relative")
    if a.min_steps is not None:
        steps = [s for s, _ in run["metrics"].get("loss", [])]
        if steps[:a.min_steps] != list(range(a.min_steps)) or len(set(steps)) != len(steps):
            misses.append(f"loss at {len(steps)} steps ({steps[:3]} .. {steps[-3:]}), expected 0..{a.min_steps - 1} at least, each once")
    lacking = {}
    if a.lacking:
        with open(a.lacking) as f:
            lines = f.read().splitlines()
        said = re.fullmatch(r"warning: MLflow: run \w+ at .* lacks (.*?): .*", lines[-1]) if lines else None
        for part in said.group(1).split("; ") if said else []:
            key, steps = re.fullmatch(r"(\S+) at steps? (.*)", part).groups()
            for item in re.split(r", | and ", steps):
                first, _, last = item.partition("-")
                lacking.setdefault(key, set()).update(range(int(first), int(last or first) + 1))
    if a.epochs is not None:
        for key in ("epoch_mean_loss", "samples_per_second"):
            steps = sorted(s for s, _ in run["metrics"].get(key, []))
            want = [s for s in range(a.epochs) if s not in lacking.get(key, ())]
            if steps != want:
                misses.append(f"{key} at steps {steps}, expected {want}"
                              + (f" (0..{a.epochs - 1} but for the {sorted(lacking[key])} the last line names)" if key in lacking else ""))
    if a.accuracy is not None:
        values = run["metrics"].get("test_accuracy", [])
        if len(values) != 1 or abs(100 * values[0][1] - a.accuracy) > 0.005 + 1e-9:
            misses.append(f"test_accuracy {values}, expected {a.accuracy / 100} (once)")
    for kind, pairs in (("params", a.param), ("tags", a.tag)):
        for pair in pairs:
            key, value = pair.split("=", 1)
            got = run[kind].get(key)
            if got != value:
                misses.append(f"{kind[:-1]} {key} = {got!r}, expected {value!r}")
    for key in a.no_param:
        if key in run["params"]:
            misses.append(f"param {key} = {run['params'][key]!r}, expected none")
    for path in a.artifact:
        name, size = os.path.basename(path), os.path.getsize(path)
        if name not in run["artifacts"]:
            misses.append(f"no artifact {name} (there are {sorted(run['artifacts'])})")
        elif run["artifacts"][name] not in (None, size):
            misses.append(f"artifact {name}: {run['artifacts'][name]} bytes, the file has {size}")
    for miss in misses:
        print(miss)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
