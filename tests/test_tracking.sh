#!/usr/bin/env bash
# Tracking runs in MLflow (--mlflow, docs/tracking.md), read back by readers that share nothing with
# common/records/tracking.c and its stores:
#   - an mlruns folder, read by tests/check_mlruns.py as MLflow's FileStore reads it: every flag a param,
#     the loss of every step equal to the --losses CSV, the epoch metrics, the accuracy printed, the
#     tags, the artifacts byte for byte, FINISHED; two runs in one experiment; MLFLOW_TRACKING_URI and
#     MLFLOW_EXPERIMENT_NAME; only rank 0 logs; the same checksum with and without tracking;
#   - a tracking server, tests/mlflow_test_server.py: the REST calls in order, within MLflow's limits per
#     batch, authenticated; and when it fails mid-run (500s, a hang, a refusal) the training ends with its
#     normal checksum, one warning line, in bounded time;
#   - a bad URI, a folder that cannot be written, a server that is down or refuses the token: one line,
#     exit 2 on every rank, before any training;
#   - a run killed by SIGTERM shows KILLED with what it logged, a fatal error on rank 0 FAILED; step 13 killed and restarted
#     logs into the same run, its loss at every step exactly once, and ends FINISHED;
#   - hostile servers (an endless answer, one dripped a byte a second, 429 with Retry-After, an HTML page,
#     binary bytes, 64 MiB of JSON, escape sequences in an error message): the same losses, bounded
#     memory, one summarised line, the end within its bound; Retry-After within 30 s honoured;
#   - full disks (a tmpfs of 24 KB, and of about 100 KB; SKIP where mounting is not allowed): no run's
#     folder without meta.yaml, each value written once, the last line naming exactly what is missing;
#   - a real MLflow when one is installed (python3 -c 'import mlflow'): `mlflow server` with SQLite, the
#     runs read back through mlflow.search_runs and MlflowClient.get_metric_history; SKIP otherwise.
# make test runs them all but some server checks, which make test-all adds: 1875 steps within MLflow's
# limits per batch, a server that hangs, a refused batch, a server that fails and comes back, the
# hostile servers' other cases (at the start, mid-run or at the end), more disk sizes, and step 13
# killed and resumed into a folder (make test: into a server).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite tracking
scratch
servers=()
# The tmpfs mounts of the full-disk checks, unmounted before the folder is removed.
mounts=()
unmount_all() { for dir in "${mounts[@]}"; do umount "$dir" 2> /dev/null; done; mounts=(); }
at_exit 'unmount_all; for pid in "${servers[@]}"; do kill -CONT -- "$pid" 2> /dev/null; kill -- "$pid" 2> /dev/null; done; wait 2> /dev/null'
# The environment must not pick a tracking URI of the user's.
unset MLFLOW_TRACKING_URI MLFLOW_EXPERIMENT_NAME MLFLOW_TRACKING_TOKEN MLFLOW_TRACKING_USERNAME MLFLOW_TRACKING_PASSWORD

needs_built day1/6_mnist_ddp
needs_mnist
if ! "$PYTHON" -c 'import yaml' 2> /dev/null; then
    skip "the mlruns checks need PyYAML in $PYTHON (apt-get install python3-yaml)"
    have_yaml=0
else
    have_yaml=1
fi

# train_tracked NAME NP PROGRAM FLAGS...: one epoch, outputs kept as $tmp/NAME.{out,err,csv,h5,png}; returns the status.
train_tracked() {
    local name=$1 np=$2; shift 2
    RUN_TIMEOUT=300 mpi "$np" "$@" --data "$DATA" --epochs 1 --losses "$tmp/$name.csv" --save "$tmp/$name.h5" \
        --plot "$tmp/$name.png" > "$tmp/$name.out" 2> "$tmp/$name.err"
}
mlruns() { "$PYTHON" tests/check_mlruns.py "$1" --json "$2"; }

# ---------------------------------------------------------------- an mlruns folder
train_tracked plain 2 day1/6_mnist_ddp
train_tracked folder 2 day1/6_mnist_ddp --mlflow "$tmp/mlruns" --experiment ddp
status=$?
if [ $status -ne 0 ]; then
    fail "step 6 with --mlflow FOLDER: exit $status: $(head -3 "$tmp/folder.err" | tr '\n' ' ')"
else
    [ "$(checksum "$tmp/folder.out")" = "$(checksum "$tmp/plain.out")" ] && cmp -s "$tmp/folder.csv" "$tmp/plain.csv" \
        && pass "step 6 on 2 ranks logging to a folder takes the same steps as without (checksum $(checksum "$tmp/plain.out"), the same losses)" \
        || fail "step 6 logging to a folder: checksum $(checksum "$tmp/folder.out"), without $(checksum "$tmp/plain.out")"
    grep -q "^MLflow: run [0-9a-f]\{32\} (6_mnist_ddp, 2 ranks) in experiment 'ddp' at $tmp/mlruns$" "$tmp/folder.out" \
        && pass "step 6 says where its run is: $(grep '^MLflow' "$tmp/folder.out" | sed "s|$tmp|TMP|")" \
        || fail "no 'MLflow: run ID (6_mnist_ddp, 2 ranks) in experiment 'ddp' at ...' line: $(grep -i mlflow "$tmp/folder.out" | head -2)"
    if [ $have_yaml = 1 ]; then
        if mlruns "$tmp/mlruns" "$tmp/folder.json" 2> "$tmp/check.err"; then
            pass "the mlruns folder reads as MLflow's FileStore reads it (tests/check_mlruns.py: no problem)"
            expect_output "the run: FINISHED, every step's loss = the --losses CSV, epoch metrics, test accuracy $(accuracy "$tmp/folder.out")%, the flags as params (but --mlflow, --experiment, --run_name), the tags, the artifacts" \
                "$PYTHON" tests/tracked_run.py "$tmp/folder.json" --experiment ddp --runs 1 --status FINISHED \
                --no_param mlflow --no_param experiment --no_param run_name \
                --losses "$tmp/folder.csv" --epochs 1 --accuracy "$(accuracy "$tmp/folder.out")" \
                --param lr=0.001 --param batch_size=6400 --param epochs=1 --param world_size=2 --param seed=0 \
                --param no_shuffle=False --param init=None --param bucket_mb=25 --param "data=$DATA" \
                --tag world_size=2 --tag nodes=1 --tag mlflow.source.name=day1/6_mnist_ddp.c \
                --tag "mlflow.runName=6_mnist_ddp, 2 ranks" --tag device=cpu \
                --artifact "$tmp/folder.csv" --artifact "$tmp/folder.h5" --artifact "$tmp/folder.png"
            run_dir=$(dirname "$(ls -d "$tmp"/mlruns/*/*/artifacts | head -1)")
            same=1
            for f in folder.csv folder.h5 folder.png; do cmp -s "$tmp/$f" "$run_dir/artifacts/$f" || same=0; done
            [ $same = 1 ] && pass "the artifacts are the files written, byte for byte" || fail "an artifact differs from its file"
            if git rev-parse HEAD > /dev/null 2>&1; then
                [ "$(cat "$run_dir/tags/mlflow.source.git.commit")" = "$(git rev-parse HEAD)" ] \
                    && pass "tag mlflow.source.git.commit is the checkout's HEAD" \
                    || fail "tag mlflow.source.git.commit is '$(cat "$run_dir/tags/mlflow.source.git.commit" 2>&1)', HEAD is $(git rev-parse HEAD)"
            fi
        else
            fail "tests/check_mlruns.py refuses the folder: $(head -3 "$tmp/check.err" | tr '\n' ' ')"
        fi
    fi
fi

# A second run lands in the same experiment; the environment names the store and the experiment.
MLFLOW_TRACKING_URI="file:$tmp/mlruns" MLFLOW_EXPERIMENT_NAME=ddp train_tracked second 1 day1/2_mnist_training --run_name second
status=$?
if [ $status -ne 0 ]; then
    fail "step 2 with MLFLOW_TRACKING_URI=file:DIR: exit $status: $(head -3 "$tmp/second.err" | tr '\n' ' ')"
elif [ $have_yaml = 1 ] && mlruns "$tmp/mlruns" "$tmp/second.json" 2> "$tmp/check.err"; then
    expect_output "MLFLOW_TRACKING_URI=file:DIR and MLFLOW_EXPERIMENT_NAME: a second run in the same experiment, named by --run_name" \
        "$PYTHON" tests/tracked_run.py "$tmp/second.json" --experiment ddp --runs 2 --run -1 --status FINISHED \
        --losses "$tmp/second.csv" --tag mlflow.runName=second --param world_size=1
elif [ $have_yaml = 1 ]; then
    fail "tests/check_mlruns.py refuses the folder after a second run: $(head -3 "$tmp/check.err" | tr '\n' ' ')"
fi

# Only rank 0 logs: one run for 2 ranks (checked above); and nothing at all without a URI.
train_tracked untracked 2 day1/6_mnist_ddp
[ ! -e mlruns ] && ! grep -q MLflow "$tmp/untracked.out" \
    && pass "without --mlflow or MLFLOW_TRACKING_URI nothing is tracked (no mlruns folder, no MLflow line)" \
    || fail "an untracked run wrote ./mlruns or printed an MLflow line"

# ---------------------------------------------------------------- refused at the start
# refused NAME WANT FLAGS...: step 6 on 2 ranks exits 2 with one error line naming WANT, and trains nothing.
refused() {
    local name=$1 want=$2; shift 2
    train_tracked "$name" 2 day1/6_mnist_ddp "$@"
    local status=$? errors
    errors=$(grep -c '^error: ' "$tmp/$name.err")
    if [ $status -eq 2 ] && [ "$errors" -eq 1 ] && grep -q -- "$want" "$tmp/$name.err" && ! grep -q '^epoch' "$tmp/$name.out"; then
        pass "$name: exit 2, one line, before any training: $(grep '^error: ' "$tmp/$name.err" | sed "s|$tmp|TMP|g" | cut -c1-160)"
    else
        fail "$name: exit $status, $errors error lines, expected 2 and 1 naming '$want': $(head -2 "$tmp/$name.err" | tr '\n' ' ')"
    fi
}
refused "a database URI" "sqlite:///x.db: expected a tracking server" --mlflow sqlite:///x.db
touch "$tmp/a_file"
refused "a folder inside a file" "cannot create" --mlflow "$tmp/a_file/mlruns"
# A port nobody listens on: take one from the kernel and close it.
closed_port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
refused "a server that is not there" "127.0.0.1:$closed_port" --mlflow "http://127.0.0.1:$closed_port"
# The same URI from the environment: the line names the variable, not a flag that was never given.
MLFLOW_TRACKING_URI="http://127.0.0.1:$closed_port" refused "a server that is not there, named by MLFLOW_TRACKING_URI" \
    "^error: MLFLOW_TRACKING_URI=http://127.0.0.1:$closed_port: "

# ---------------------------------------------------------------- a tracking server (the test double)
# serve NAME OPTIONS...: start tests/mlflow_test_server.py, its log and dump as $tmp/NAME.{log,dump}; sets $port.
serve() {
    local name=$1; shift
    rm -f "$tmp/$name.port"
    "$PYTHON" tests/mlflow_test_server.py --port-file "$tmp/$name.port" --log "$tmp/$name.log" --dump "$tmp/$name.dump" "$@" &
    servers+=($!)
    server_pid=$!
    for _ in $(seq 100); do [ -s "$tmp/$name.port" ] && break; sleep 0.1; done
    port=$(cat "$tmp/$name.port" 2> /dev/null)
}
stop_server() { kill "$server_pid" 2> /dev/null; wait "$server_pid" 2> /dev/null; }
# The endpoints of the server's log, in order, one per line ("POST runs/log-batch 200").
calls() { "$PYTHON" -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    print(e["method"], e["path"].replace("/api/2.0/mlflow/", "").replace("/api/2.0/mlflow-artifacts/artifacts/", "artifact "), e["status"])
' "$1"; }

serve rest
train_tracked rest 2 day1/6_mnist_ddp --mlflow "http://127.0.0.1:$port" --experiment ddp --batch_size 1000 --no-shuffle
status=$?
stop_server
if [ $status -ne 0 ]; then
    fail "step 6 with --mlflow http://...: exit $status: $(head -3 "$tmp/rest.err" | tr '\n' ' ')"
else
    expect_output "a server's run: FINISHED, each of the 30 steps' loss once = the CSV, epoch metrics, test accuracy, params, tags, artifacts" \
        "$PYTHON" tests/tracked_run.py "$tmp/rest.dump" --experiment ddp --runs 1 --status FINISHED \
        --losses "$tmp/rest.csv" --epochs 1 --accuracy "$(accuracy "$tmp/rest.out")" \
        --param lr=0.001 --param batch_size=1000 --param no_shuffle=True --param world_size=2 \
        --tag world_size=2 --tag mlflow.source.name=day1/6_mnist_ddp.c \
        --artifact "$tmp/rest.csv" --artifact "$tmp/rest.h5" --artifact "$tmp/rest.png"
    calls "$tmp/rest.log" > "$tmp/rest.calls"
    order=$(awk '{ print $1, $2 }' "$tmp/rest.calls" | sed 's/^PUT artifact .*/PUT artifact/' | uniq | tr '\n' ',')
    want="GET experiments/get-by-name,POST experiments/create,POST runs/create,POST runs/log-batch,PUT artifact,POST runs/update,"
    [ "$order" = "$want" ] \
        && pass "the REST calls, in order: experiment looked up (404) and created, run created, $(grep -c log-batch "$tmp/rest.calls") log-batch, $(grep -c 'PUT artifact' "$tmp/rest.calls") artifacts, status" \
        || fail "the REST calls: $order expected $want"
    ! grep -qv ' 200$\| 404$' "$tmp/rest.calls" && pass "every call answered 200 (the lookup of the new experiment 404)" \
        || fail "calls answered otherwise: $(grep -v ' 200$' "$tmp/rest.calls" | head -3 | tr '\n' ' ')"
    [ "$(checksum "$tmp/rest.out")" = "$(train_tracked restplain 2 day1/6_mnist_ddp --batch_size 1000 --no-shuffle; checksum "$tmp/restplain.out")" ] \
        && pass "logging to a server takes the same steps (checksum $(checksum "$tmp/rest.out"))" \
        || fail "logging to a server: checksum $(checksum "$tmp/rest.out"), without $(checksum "$tmp/restplain.out")"
fi

# MLflow's limits per log-batch: many steps at once (batch 32: 1875 steps) reach the server within them.
if thorough; then
serve many
train_tracked many 1 day1/2_mnist_training --mlflow "http://127.0.0.1:$port" --batch_size 32
status=$?
stop_server
if [ $status -eq 0 ]; then
    expect_output "1875 steps in $(grep -c log-batch "$tmp/many.log") batches within MLflow's limits (the server refuses more than 1000 values or 100 params), each step once" \
        "$PYTHON" tests/tracked_run.py "$tmp/many.dump" --experiment Default --runs 1 --status FINISHED --losses "$tmp/many.csv"
else
    fail "1875 steps to a server: exit $status: $(head -2 "$tmp/many.err" | tr '\n' ' ')"
fi
fi

# Authentication: a bearer token, basic; a wrong token is refused at the start.
serve token --require-token s3cret
MLFLOW_TRACKING_TOKEN=s3cret train_tracked token 1 day1/2_mnist_training --mlflow "http://127.0.0.1:$port"
status=$?
cp "$tmp/token.log" "$tmp/token_only.log"  # the wrong token's requests go in the same log
MLFLOW_TRACKING_TOKEN=wrong train_tracked badtoken 1 day1/2_mnist_training --mlflow "http://127.0.0.1:$port"
bad_status=$?
stop_server
[ $status -eq 0 ] && ! grep -q '"status": 401' "$tmp/token_only.log" && grep -q 'Bearer s3cret' "$tmp/token_only.log" \
    && pass "MLFLOW_TRACKING_TOKEN: every request carries 'Authorization: Bearer ...' ($(wc -l < "$tmp/token_only.log") requests)" \
    || fail "MLFLOW_TRACKING_TOKEN: exit $status, $(grep -c '"status": 401' "$tmp/token_only.log") requests refused"
[ $bad_status -eq 2 ] && grep -q "UNAUTHENTICATED" "$tmp/badtoken.err" && ! grep -q '^epoch' "$tmp/badtoken.out" \
    && pass "a wrong token: exit 2 before training: $(grep '^error' "$tmp/badtoken.err" | cut -c1-140)" \
    || fail "a wrong token: exit $bad_status: $(head -2 "$tmp/badtoken.err" | tr '\n' ' ')"
serve basic --require-basic ada:lovelace
MLFLOW_TRACKING_USERNAME=ada MLFLOW_TRACKING_PASSWORD=lovelace train_tracked basic 1 day1/2_mnist_training --mlflow "http://127.0.0.1:$port"
status=$?
stop_server
[ $status -eq 0 ] && ! grep -q '"status": 401' "$tmp/basic.log" \
    && pass "MLFLOW_TRACKING_USERNAME/PASSWORD: basic authentication accepted on every request" \
    || fail "basic authentication: exit $status, $(grep -c '"status": 401' "$tmp/basic.log") requests refused"

# A server started as `mlflow server --serve-artifacts --default-artifact-root PATH`: a run's artifact_uri
# is the plain path PATH/<experiment>/<run>/artifacts, which MLflow's client writes itself, and so do we
# where this machine has PATH (here, with a space in its name); where it has not (a folder of the
# server's machine), one line naming the server's flags that would serve the files, and the run goes on.
mkdir -p "$tmp/artifact root"
serve plainroot --default-artifact-root "$tmp/artifact root"
train_tracked plainroot 1 day1/2_mnist_training --mlflow "http://127.0.0.1:$port"
status=$?
stop_server
run_dir=$(ls -d "$tmp/artifact root"/0/*/artifacts 2> /dev/null | head -1)
same=1
for f in plainroot.csv plainroot.h5 plainroot.png; do cmp -s "$tmp/$f" "$run_dir/$f" || same=0; done
if [ $status -eq 0 ] && [ -n "$run_dir" ] && [ $same = 1 ] && [ ! -s "$tmp/plainroot.err" ] && ! grep -q '"PUT"' "$tmp/plainroot.log"; then
    expect_output "a server whose artifact root is a plain path (--default-artifact-root): the run FINISHED, its 3 artifacts written there byte for byte, no upload, no warning" \
        "$PYTHON" tests/tracked_run.py "$tmp/plainroot.dump" --experiment Default --runs 1 --status FINISHED \
        --artifact "$tmp/plainroot.csv" --artifact "$tmp/plainroot.h5" --artifact "$tmp/plainroot.png"
else
    fail "a server whose artifact root is a plain path: exit $status, artifacts in '${run_dir#$tmp/}' (same bytes: $same), $(grep -c '"PUT"' "$tmp/plainroot.log") uploads: $(head -2 "$tmp/plainroot.err" | tr '\n' ' ')"
fi
elsewhere=/nonexistent-$$/mlartifacts
serve otherroot --default-artifact-root "$elsewhere"
train_tracked otherroot 1 day1/2_mnist_training --mlflow "http://127.0.0.1:$port"
status=$?
stop_server
said=$(grep -c "artifact root $elsewhere is not a folder of this machine: start the server with --artifacts-destination $elsewhere instead of --default-artifact-root" "$tmp/otherroot.err")
[ $status -eq 0 ] && [ "$said" -eq 1 ] && [ ! -e "$elsewhere" ] && tail -1 "$tmp/otherroot.err" | grep -q '^warning: MLflow: 3 artifacts may not have reached' \
    && pass "an artifact root that is not a folder of this machine: exit 0, nothing written here, one line naming the server's flags: $(grep -o 'start the server.*root,' "$tmp/otherroot.err")" \
    || fail "an artifact root that is not a folder of this machine: exit $status, $said lines naming the flags: $(head -3 "$tmp/otherroot.err" | tr '\n' ' ')"
if thorough; then
    serve s3root --default-artifact-root s3://bucket/mlflow
    train_tracked s3root 1 day1/2_mnist_training --mlflow "http://127.0.0.1:$port"
    status=$?
    stop_server
    said=$(grep -c "at s3://bucket/mlflow/0/[0-9a-f]*/artifacts, which this program cannot write: start the server with --artifacts-destination s3://bucket/mlflow instead of --default-artifact-root" "$tmp/s3root.err")
    [ $status -eq 0 ] && [ "$said" -eq 1 ] \
        && pass "an s3:// artifact root: exit 0, one line naming the server's flags that would take the files" \
        || fail "an s3:// artifact root: exit $status, $said lines naming the flags: $(head -3 "$tmp/s3root.err" | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- a server that fails mid-run
# faulty NAME WARNING OPTIONS...: step 6 on 2 ranks against a failing server ends with the checksum of
# the run without tracking, exit 0, and the warning once, in bounded time.
train_tracked reference 2 day1/6_mnist_ddp --batch_size 1000 --no-shuffle
faulty() {
    local name=$1 warning=$2; shift 2
    serve "$name" "$@"
    local start=$SECONDS
    MLFLOW_HTTP_REQUEST_TIMEOUT=1 MLFLOW_HTTP_REQUEST_MAX_RETRIES=2 MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=0.1 \
        train_tracked "$name" 2 day1/6_mnist_ddp --mlflow "http://127.0.0.1:$port" --batch_size 1000 --no-shuffle
    local status=$? took=$((SECONDS - start)) warnings
    stop_server
    warnings=$(grep -c "$warning" "$tmp/$name.err")
    if [ $status -eq 0 ] && [ "$(checksum "$tmp/$name.out")" = "$(checksum "$tmp/reference.out")" ] && [ "$warnings" -eq 1 ] && [ $took -lt 60 ]; then
        pass "$name: the training ends with its checksum in ${took} s, one warning: $(grep "$warning" "$tmp/$name.err" | cut -c1-150)"
    else
        fail "$name: exit $status in ${took} s, checksum $(checksum "$tmp/$name.out") (expected $(checksum "$tmp/reference.out")), $warnings warnings '$warning': $(head -3 "$tmp/$name.err" | tr '\n' ' ')"
    fi
}
faulty "500s from the 5th request on" "failed 3 tries" --fail-from 5
# A server that hangs, as one stopped by SIGSTOP (the kernel still takes its connections, nobody
# answers): the end of the run waits 1.5 request timeouts in all (3 s with MLFLOW_HTTP_REQUEST_TIMEOUT=2;
# 15 s with the default 10), not a timeout per request and its retries (some 10 s here), and its last
# line says what "may not have reached" the server: a stopped server that is resumed holds some of it.
# Nor is the run marked FINISHED: a stopped server takes the status as soon as it is resumed, and would
# show a complete-looking run with holes; it stays RUNNING there.
serve stopped
MLFLOW_HTTP_REQUEST_TIMEOUT=2 timeout 120 day1/2_mnist_training --data "$DATA" --epochs 2 --mlflow "http://127.0.0.1:$port" \
    --losses "$tmp/stopped.csv" --save "$tmp/stopped.h5" --plot "$tmp/stopped.png" > "$tmp/stopped.out" 2> "$tmp/stopped.err" &
pid=$!
for _ in $(seq 600); do grep -q '^epoch 1/' "$tmp/stopped.out" && break; sleep 0.02; done
kill -STOP "$server_pid"
for _ in $(seq 1500); do grep -q 'Test accuracy' "$tmp/stopped.out" && break; sleep 0.02; done
end_start=$(date +%s%N)
wait $pid
status=$? took_ms=$(( ($(date +%s%N) - end_start) / 1000000 ))
kill -CONT "$server_pid"
sleep 1  # what the server took while stopped, it answers now
stop_server
last=$(tail -1 "$tmp/stopped.err")
held=$("$PYTHON" tests/tracked_run.py "$tmp/stopped.dump" --experiment Default --runs 1 --status RUNNING 2>&1)
if [ $status -eq 0 ] && [ $took_ms -le 4000 ] && [ -z "$held" ] &&
        echo "$last" | grep -q "^warning: MLflow: .* may not have reached http://127.0.0.1:$port within the end's 2 s: the run is left RUNNING there, not FINISHED without them$"; then
    pass "a server stopped (SIGSTOP) mid-run: the end took $took_ms ms (bound: 1.5 request timeouts, 3 s here; 1, 2 s, when the status is withheld), exit 0, the run RUNNING on the server once resumed, the last line: $(echo "$last" | sed 's/^warning: MLflow: //')"
else
    fail "a server stopped (SIGSTOP) mid-run: exit $status, the end took $took_ms ms (expected 3000 at most, and 1 s for the output's polling), the server once resumed: ${held:-RUNNING}, the last line: $last"
fi
if thorough; then
    # (3 tries mid-run; fewer when the hang comes at the end, whose 1.5 s deadline cuts the retries)
    faulty "a server that hangs from the 5th request on" "failed [1-3] tr" --hang-from 5
    faulty "one batch refused (400)" "INVALID_PARAMETER_VALUE: injected refusal" --fault-path log-batch --refuse-from 1 --refuse-count 1
    faulty "500s for one batch, then answers" "answers again" --fault-path log-batch --fail-from 1 --fail-count 3
    # SIGTERM while a request hangs (MLflow's default 10 s per request, 3 retries): the request is
    # cancelled, the queue and the status get one try of 2 s each, and the signal takes effect.
    serve hung --hang-from 4
    day1/2_mnist_training --data "$DATA" --epochs 30 --plot '' --mlflow "http://127.0.0.1:$port" > "$tmp/hung.out" 2> "$tmp/hung.err" &
    pid=$!
    for _ in $(seq 300); do grep -q '^epoch 2/' "$tmp/hung.out" && break; sleep 0.1; done
    start=$SECONDS
    kill -TERM $pid
    wait $pid
    status=$? took=$((SECONDS - start))
    stop_server
    [ $status -eq 143 ] && [ $took -le 8 ] \
        && pass "SIGTERM while a request to the server hangs: the program ends in ${took} s (exit 143), not after the request's 10 s and its retries" \
        || fail "SIGTERM while a request hangs: exit $status after ${took} s (expected 143 within 8 s): $(head -2 "$tmp/hung.err" | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- hostile servers (issue 36)
# A server that streams without end, drips its answer a byte a second, asks for an hour's pause (429,
# Retry-After: 3600), answers an HTML page, binary bytes or 64 MiB of JSON, or puts terminal escapes in
# its error message: the training goes on to the same losses, rank 0's memory stays bounded (an answer
# is cut at 8 MiB), each refusal is one line that summarises the answer (status, content type, size) and
# never shows it, and the end of the run keeps to its bound, 1.5 request timeouts (3 s here; checked
# with 1 s more for this script's polling of the output). Without the caps, the endless server grew
# rank 0 by gigabytes, and a 429 was tried again at once.
# peak_rss FILE COMMAND...: runs COMMAND, its peak resident memory (KB, its own and its children's) to FILE.
peak_rss() { "$PYTHON" -c '
import resource, subprocess, sys
status = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(status if status >= 0 else 128 - status)' "$@"; }
# hostile NAME [SERVER OPTIONS...]: step 2 for 2 epochs against the test server with those faults
# (MLFLOW_HTTP_REQUEST_TIMEOUT=2, backoff 0.1 s); NAME "unlogged": without --mlflow, no server. Sets
# $status, $end_ms (from the accuracy line to the exit: the end of the run) and $rss_kb; the outputs as
# $tmp/NAME.{out,err,csv}, the server's log $tmp/NAME.log.
hostile() {
    local name=$1 mlflow=() pid end_start; shift
    if [ "$name" != unlogged ]; then serve "$name" "$@"; mlflow=(--mlflow "http://127.0.0.1:$port"); fi
    MLFLOW_HTTP_REQUEST_TIMEOUT=${HOSTILE_TIMEOUT:-2} MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=0.1 peak_rss "$tmp/$name.rss" timeout 120 \
        day1/2_mnist_training --data "$DATA" --epochs 2 --plot '' --losses "$tmp/$name.csv" "${mlflow[@]}" \
        > "$tmp/$name.out" 2> "$tmp/$name.err" &
    pid=$!
    for _ in $(seq 6000); do grep -q 'Test accuracy' "$tmp/$name.out" 2> /dev/null && break; kill -0 $pid 2> /dev/null || break; sleep 0.02; done
    end_start=$(date +%s%N)
    wait $pid
    status=$?
    end_ms=$(( ($(date +%s%N) - end_start) / 1000000 ))
    [ "$name" != unlogged ] && stop_server
    rss_kb=$(cat "$tmp/$name.rss" 2> /dev/null || echo 0)
}
# The stderr of NAME: its line count, and whether it holds a control byte but its newlines.
err_lines() { wc -l < "$tmp/$1.err"; }
err_controls() { tr -d '\n' < "$tmp/$1.err" | LC_ALL=C grep -c '[[:cntrl:]]'; }
hostile unlogged
reference_rss=$rss_kb
# The memory bound: within 64 MiB of the untracked run's. Not in a SANITIZE=1 build, whose allocator
# keeps what is freed for a while (AddressSanitizer's quarantine): an 8 MiB answer read and dropped
# there stays resident.
rss_bound=$((reference_rss + 65536))
if sanitized day1/2_mnist_training; then
    rss_bound=$((1 << 40))
    skip "the hostile servers' runs within 64 MiB of the untracked run's memory (a SANITIZE=1 build: its allocator keeps what is freed)"
fi
# hostile_midrun WHAT WANT NAME OPTIONS...: the run goes on to the same losses, exit 0, warnings only
# (at most 3 lines: the failure, the server answering again, the end's; one naming WANT; no control
# byte), the end within 4 s, memory within 64 MiB of the untracked run's.
hostile_midrun() {
    local what=$1 want=$2 name=$3; shift 3
    hostile "$name" "$@"
    local lines controls wanted others
    lines=$(err_lines "$name") controls=$(err_controls "$name")
    wanted=$(grep -c -- "$want" "$tmp/$name.err") others=$(grep -vc '^warning: MLflow: ' "$tmp/$name.err")
    if [ $status -eq 0 ] && cmp -s "$tmp/$name.csv" "$tmp/unlogged.csv" && [ "$lines" -le 3 ] && [ "$wanted" -eq 1 ] &&
            [ "$others" -eq 0 ] && [ "$controls" -eq 0 ] && [ $end_ms -le 4000 ] && [ $rss_kb -le $rss_bound ]; then
        pass "$what: the same losses, exit 0, the end in $end_ms ms (bound 3 s), peak memory $((rss_kb / 1024)) MiB (untracked $((reference_rss / 1024)) MiB), $lines warning line(s): $(grep -- "$want" "$tmp/$name.err" | sed 's/^warning: MLflow: //' | cut -c1-190)"
    else
        fail "$what: exit $status, losses $(cmp -s "$tmp/$name.csv" "$tmp/unlogged.csv" && echo same || echo differ), the end in $end_ms ms (bound 3000 + 1000), peak memory $rss_kb KB (untracked $reference_rss), $lines lines ($wanted naming '$want', $others not warnings, $controls control bytes): $(head -3 "$tmp/$name.err" | cut -c1-300 | tr '\n' ' ')"
    fi
}
# hostile_start WHAT WANT NAME OPTIONS...: refused at the start: exit 2, one line naming WANT, no
# control byte, no training, memory within 64 MiB of the untracked run's.
hostile_start() {
    local what=$1 want=$2 name=$3; shift 3
    hostile "$name" "$@"
    local lines controls
    lines=$(err_lines "$name") controls=$(err_controls "$name")
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$want" "$tmp/$name.err" && [ "$controls" -eq 0 ] &&
            ! grep -q '^epoch' "$tmp/$name.out" && [ $rss_kb -le $rss_bound ]; then
        pass "$what: exit 2, one line, before any training: $(sed "s|$port|PORT|g" "$tmp/$name.err" | cut -c1-230)"
    else
        fail "$what: exit $status, $lines lines ($controls control bytes), peak memory $rss_kb KB, expected exit 2 and one line naming '$want': $(head -3 "$tmp/$name.err" | cut -c1-300 | tr '\n' ' ')"
    fi
}
hostile_midrun "a server that streams its answers without end from the 4th request" \
    "HTTP 200, application/json, more than 8 MiB (stopped there)" endless --endless-from 4
hostile_midrun "an HTML page (200) for the answers from the 4th request" \
    "HTTP 200, text/html; charset=utf-8, 151 bytes, not JSON" html --html-from 4
! grep -q '<' "$tmp/html.err" && pass "the HTML page is summarised, not shown (no '<' in the output)" \
    || fail "the HTML page is shown: $(grep '<' "$tmp/html.err" | head -2)"
hostile_midrun "a server that drips the run's status a byte a second, at the end" "may not have reached" \
    drip_end --fault-path runs/update --drip-from 1
hostile_start "binary bytes (200, 4 KB of escape sequences) for the first answer" \
    "HTTP 200, application/octet-stream, 4096 bytes, not JSON" binary --binary-from 1
# An error message of MLflow's shape whose text would clear the screen: quoted, escaped and cut.
hostile_start "an error message holding a newline and escape sequences" \
    "INVALID_PARAMETER_VALUE: 'first line\\\\nsecond\\\\x1b\[2J\\\\x1b\]0;title\\\\x07.*\.\.\.' (5[0-9][0-9] bytes)" message \
    --refuse-from 1 --refuse-message "first line\\nsecond\\x1b[2J\\x1b]0;title\\x07$(printf 'x%.0s' $(seq 500))"
# 429 with Retry-After: 3600: the request counts as failed at once, said in the warning, never sent
# again (its body is in the server's log once), and nothing waits for the hour.
hostile_midrun "429 with Retry-After: 3600 for the 4th request" \
    "it asked to be tried again after 3600 s (Retry-After), more than the 30 s this client waits" \
    throttle --throttle-from 4 --throttle-count 1
# throttled LOG: whether the request answered 429 was sent again, and after how many seconds.
throttled() { "$PYTHON" -c '
import json, sys
log = [json.loads(line) for line in open(sys.argv[1])]
first = next(i for i, e in enumerate(log) if e["status"] == 429)
again = [e for e in log[first + 1:] if e["body"] == log[first]["body"] and e["path"] == log[first]["path"]]
print("%.2f" % (again[0]["time"] - log[first]["time"]) if again else "never", len(again))' "$1"; }
[ "$(throttled "$tmp/throttle.log")" = "never 0" ] \
    && pass "the batch answered 429 with Retry-After: 3600 is not sent again" \
    || fail "the batch answered 429 with Retry-After: 3600 is sent again: after $(throttled "$tmp/throttle.log") s"
# Retry-After within the cap is honoured, in seconds and as an HTTP date: the request is tried again
# that much later (the backoff's pause is 0.1 s here), and the run holds everything, once.
for form in 1 $(if_thorough date+2); do
    # A request timeout of 6 s: the end's bound (1.5 x 6 s) leaves room for the pause even when the
    # 429 answers the run's last batch (an HTTP date has whole seconds: date+2 is up to 3 s away).
    HOSTILE_TIMEOUT=6 hostile "retry_$form" --throttle-from 4 --throttle-count 1 --retry-after "$form"
    read -r gap count < <(throttled "$tmp/retry_$form.log")
    if [ $status -eq 0 ] && [ ! -s "$tmp/retry_$form.err" ] && [ "$count" = 1 ] && "$PYTHON" -c "import sys; sys.exit(not $gap >= 0.9)" &&
            "$PYTHON" tests/tracked_run.py "$tmp/retry_$form.dump" --experiment Default --runs 1 --status FINISHED --losses "$tmp/retry_$form.csv" > /dev/null 2>&1; then
        pass "429 with Retry-After: $form: tried again after $gap s, once, no warning; the run FINISHED with every step's loss once"
    else
        fail "429 with Retry-After: $form: exit $status, sent again $count times after $gap s (expected once, after 0.9 s or more): $(head -2 "$tmp/retry_$form.err" | tr '\n' ' ')"
    fi
done
if thorough; then
    hostile_midrun "64 MiB of JSON (its length said) for the answers from the 4th request" \
        "HTTP 200, application/json, more than 8 MiB (its length said so: not read)" huge --huge-from 4
    hostile_midrun "a server that drips its answers a byte a second from the 4th request" "may not have reached" \
        drip --drip-from 4
    hostile_midrun "a server that streams the run's status without end, at the end" \
        "HTTP 200, application/json, more than 8 MiB (stopped there)" endless_end --fault-path runs/update --endless-from 1
    hostile_start "a server that streams its first answer without end" "more than 8 MiB (stopped there)" \
        endless_start --endless-from 1
    hostile_start "a server that drips its first answer a byte a second" "Operation too slow" drip_start --drip-from 1
    hostile_start "an HTML page (200) for the first answer" "HTTP 200, text/html; charset=utf-8, 151 bytes, not JSON" \
        html_start --html-from 1
fi

# ---------------------------------------------------------------- full disks (issue 36)
# An mlruns folder on a tmpfs of 24 KB: the run cannot be created, one line and exit 2, and nothing of it
# is left (a run's folder without meta.yaml, which MLflow's reader refuses, was). Of about 100 KB: the
# disk fills mid-run; each value is written once at most (a batch tried again after a short write had
# written its first keys' lines again: every loss 4 times), and the end's last line names exactly what
# was not written: with what the folder holds, every value logged, each once.
# mount_tmpfs DIR KB: a tmpfs of KB kilobytes at DIR; false where mounting is not allowed.
mount_tmpfs() { mkdir -p "$1" && mount -t tmpfs -o "size=${2}k" tmpfs "$1" 2> /dev/null && mounts+=("$1"); }
if ! mount_tmpfs "$tmp/disk24" 24; then
    skip "full disks: cannot mount a tmpfs here (root, outside a container, is needed)"
elif [ $have_yaml = 1 ]; then
    MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=0.1 day1/2_mnist_training --data "$DATA" --epochs 1 --plot '' \
        --mlflow "$tmp/disk24/mlruns" > "$tmp/disk24.out" 2> "$tmp/disk24.err"
    status=$?
    runs=$(find "$tmp/disk24/mlruns" -mindepth 2 -maxdepth 2 -type d 2> /dev/null | wc -l)
    if [ $status -eq 2 ] && [ "$(wc -l < "$tmp/disk24.err")" -eq 1 ] && grep -q 'No space left on device' "$tmp/disk24.err" &&
            [ "$runs" -eq 0 ] && "$PYTHON" tests/check_mlruns.py "$tmp/disk24/mlruns" > /dev/null 2> "$tmp/check.err"; then
        pass "a full disk (24 KB) at the start: exit 2, one line, no run's folder left, and MLflow's reader takes the folder: $(sed "s|$tmp|TMP|g" "$tmp/disk24.err" | cut -c1-150)"
    else
        fail "a full disk (24 KB) at the start: exit $status, $runs runs' folders left, $(head -2 "$tmp/disk24.err" | tr '\n' ' ') $(head -2 "$tmp/check.err" 2> /dev/null | tr '\n' ' ')"
    fi
    unmount_all
    # Every value the run logs, from the same run with room enough.
    day1/2_mnist_training --data "$DATA" --epochs 1 --plot '' --mlflow "$tmp/disk_all" > /dev/null 2>&1
    "$PYTHON" tests/check_mlruns.py "$tmp/disk_all" --json "$tmp/disk_all.json" 2> /dev/null
    for kb in 100 108 $(if_thorough 96 104 112); do
        mount_tmpfs "$tmp/disk$kb" $kb || { fail "cannot mount a tmpfs of $kb KB"; continue; }
        MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=0.1 day1/2_mnist_training --data "$DATA" --epochs 1 --plot '' \
            --mlflow "$tmp/disk$kb/mlruns" > "$tmp/disk$kb.out" 2> "$tmp/disk$kb.err"
        status=$?
        if ! "$PYTHON" tests/check_mlruns.py "$tmp/disk$kb/mlruns" --json "$tmp/disk$kb.json" 2> "$tmp/check.err"; then
            fail "a full disk ($kb KB) mid-run: MLflow's reader refuses the folder: $(head -2 "$tmp/check.err" | tr '\n' ' ')"
        elif verdict=$("$PYTHON" - "$tmp/disk_all.json" "$tmp/disk$kb.json" "$tmp/disk$kb.err" 2>&1 <<'PY'
import json, re, sys
def run(path):
    runs = [r for e in json.load(open(path))["experiments"] for r in e["runs"]]
    assert len(runs) == 1, f"{len(runs)} runs in {path}"
    return runs[0]
everything, written = run(sys.argv[1]), run(sys.argv[2])
logged = {(k, m[2]) for k, values in everything["metrics"].items() for m in values}
held = [(k, m[2]) for k, values in written["metrics"].items() for m in values]
twice = {v for v in held if held.count(v) > 1}
assert not twice, f"written more than once: {sorted(twice)[:5]}"
# The end's last line: "not written to DIR: 13 values (loss at steps 0-9; epoch_mean_loss at step 0; 2 params); ..."
lost, lost_params, lost_tags = set(), 0, 0
said = re.search(r"not written to [^:]*: (\d+) values? \((.*?)\); everything else logged is there", open(sys.argv[3]).read())
if said:
    for part in said.group(2).split("; "):
        counted = re.fullmatch(r"(\d+) (param|tag)s?", part)
        if counted:
            lost_params += int(counted.group(1)) * (counted.group(2) == "param")
            lost_tags += int(counted.group(1)) * (counted.group(2) == "tag")
            continue
        key, ranges = re.fullmatch(r"(\S+) at steps? (.*)", part).groups()
        for r in re.split(r", | and ", ranges):
            first, _, last = r.partition("-")
            lost |= {(key, s) for s in range(int(first), int(last or first) + 1)}
    assert int(said.group(1)) == len(lost) + lost_params + lost_tags, f"{said.group(1)} values said, {len(lost)} named"
assert not lost & set(held), f"said lost but written: {sorted(lost & set(held))[:5]}"
assert lost | set(held) == logged, f"neither written nor said: {sorted(logged - lost - set(held))[:5]}"
assert len(written["params"]) + lost_params == len(everything["params"]), "params"
print(f"{len(held)} values written, {len(lost)} + {lost_params} params said not written" if said else f"all {len(held)} values written")
PY
        ) && [ $status -eq 0 ]; then
            pass "a full disk ($kb KB) mid-run: exit 0, MLflow's reader takes the folder, each value once, and the last line names exactly what is missing: $verdict"
        else
            fail "a full disk ($kb KB) mid-run: exit $status: $verdict: $(tail -2 "$tmp/disk$kb.err" | cut -c1-300 | tr '\n' ' ')"
        fi
        unmount_all
    done
fi

# ---------------------------------------------------------------- how runs end
# ft NAME FLAGS...: step 13 on 2 ranks for 4 epochs, its snapshot, CSV and output as $tmp/NAME.*. When a
# rank dies, mpirun's SIGTERM gives rank 0 3 s to mark its run KILLED (FT_GRACE=0: none, for a rank 0 that
# is dead already, while rank 1 waits for it in vain).
ft() { OMPI_MCA_odls_base_sigkill_timeout=${FT_GRACE:-3} timeout 300 $MPIRUN -np 2 day3/13_fault_tolerant_ddp --data "$DATA" --plot '' \
          --total_epochs 4 --snapshot "$tmp/$1.h5" --losses "$tmp/$1.csv" "${@:2}" > "$tmp/$1.out" 2> "$tmp/$1.err"; }
ft ft_plain
# killed0 NAME URI WHERE [COMMAND]: step 13 logging to URI with rank 0 killed (SIGKILL, as `kill -9`)
# mid-epoch 3, after epoch 2's snapshot: what it had queued for the store dies with it (with a folder,
# every value when the kill comes before the sender's first second, steps 7-9 in another try). COMMAND
# runs between the two runs. The same command resumes into the same run, which ends FINISHED holding
# what the snapshot holds, each step once: every step's loss (= an uninterrupted run's), each epoch's
# mean loss, the params. An epoch's samples per second, a timing no snapshot keeps, may be missing:
# then the run's last line names it (tracked_run.py --lacking).
killed0() {
    local name=$1 uri=$2 first second
    FT_GRACE=0 ft "$name" --fail_at_epoch 3 --fail_rank 0 --mlflow "$uri"
    first=$?
    mv "$tmp/$name.out" "$tmp/$name.first.out"
    ${4:-true}
    ft "$name" --fail_at_epoch 3 --fail_rank 0 --mlflow "$uri"
    second=$?
    if [ $first -eq 0 ] || ! grep -q '^\[rank 0\] --fail_at_epoch 3: this rank dies now' "$tmp/$name.first.out" || [ $second -ne 0 ]; then
        fail "step 13 with rank 0 killed, to $3: the first run exit $first, the resumed run exit $second: $(tail -2 "$tmp/$name.err" | tr '\n' ' ')"
        return 1
    fi
}
# killed0_expect NAME STORE.json WHERE: the resumed run, complete.
killed0_expect() {
    expect_output "step 13 with rank 0 killed (SIGKILL) after a snapshot, then resumed, to $3: FINISHED, each step's loss once (= an uninterrupted run's), each epoch's mean, the params$(grep -q ' lacks ' "$tmp/$1.err" && echo "; the last line names what no snapshot keeps: $(tail -1 "$tmp/$1.err" | sed 's/.* lacks \(.*\): .*/\1/')")" \
        "$PYTHON" tests/tracked_run.py "$2" --experiment Default --runs 1 --status FINISHED --losses "$tmp/ft_plain.csv" \
        --epochs 4 --lacking "$tmp/$1.err" --param total_epochs=4 --param fail_rank=0 --param world_size=2 \
        --param "snapshot=$tmp/$1.h5" --artifact "$tmp/$1.h5"
}
# The server takes none of the first run's values (it refuses every log-batch until SIGUSR1): the
# worst case of a kill before the first send, whatever the timing: the resumed run must send them all,
# the params too.
serve killed --fault-path log-batch --refuse-from 1
killed0 killed "http://127.0.0.1:$port" "a server" "kill -USR1 $server_pid"
status=$?
stop_server
[ $status = 0 ] && killed0_expect killed "$tmp/killed.dump" "a server"
# The same into a folder: make test-all (make test has the server's case above and rank 1's below).
if thorough && [ $have_yaml = 1 ] && killed0 killed_folder "$tmp/killed_folder" "a folder"; then
    if mlruns "$tmp/killed_folder" "$tmp/killed_folder.json" 2> "$tmp/check.err"; then
        killed0_expect killed_folder "$tmp/killed_folder.json" "a folder"
    else
        fail "step 13 with rank 0 killed, then resumed: tests/check_mlruns.py refuses the folder: $(head -3 "$tmp/check.err" | tr '\n' ' ')"
    fi
fi

if [ $have_yaml = 1 ]; then
    # SIGTERM mid-training: KILLED (the signal still ends the program, as without tracking).
    day1/2_mnist_training --data "$DATA" --epochs 50 --plot '' --mlflow "$tmp/ends" --experiment sigterm > "$tmp/term.out" 2> "$tmp/term.err" &
    pid=$!
    for _ in $(seq 300); do grep -q '^epoch 1/' "$tmp/term.out" && break; sleep 0.1; done
    kill -TERM $pid
    wait $pid
    status=$?
    mlruns "$tmp/ends" "$tmp/ends.json" 2> "$tmp/check.err"
    expect_output "SIGTERM after epoch 1: exit $status (143: the signal, as without tracking), the run KILLED, with the loss of epoch 1's 10 steps at least (what was queued is sent before the status)" \
        bash -c "[ $status -eq 143 ] && '$PYTHON' tests/tracked_run.py '$tmp/ends.json' --experiment sigterm --runs 1 --status KILLED --min_steps 10"
    # A fatal error on rank 0 (its --save target became a folder): FAILED.
    mkdir -p "$tmp/fatal"
    day1/2_mnist_training --data "$DATA" --epochs 3 --plot '' --save "$tmp/fatal/w.h5" --mlflow "$tmp/ends" --experiment fatal > "$tmp/fatal.out" 2> "$tmp/fatal.err" &
    pid=$!
    for _ in $(seq 300); do grep -q '^epoch 1/' "$tmp/fatal.out" && break; sleep 0.1; done
    rm -f "$tmp/fatal/w.h5"; mkdir "$tmp/fatal/w.h5"
    wait $pid
    status=$?
    mlruns "$tmp/ends" "$tmp/ends.json" 2> "$tmp/check.err"
    expect_output "a fatal error on rank 0 (exit $status: $(grep -m1 -o 'cannot.*' "$tmp/fatal.err" | cut -c1-60)...): the run FAILED, with what it logged before (epoch 1's 10 steps at least)" \
        bash -c "[ $status -ne 0 ] && '$PYTHON' tests/tracked_run.py '$tmp/ends.json' --experiment fatal --runs 1 --status FAILED --min_steps 10"

    # Step 13: rank 1 dies in epoch 3 (SIGKILL); mpirun's SIGTERM to rank 0 marks the run KILLED; the same
    # command resumes into the same run, and the run holds every step's loss once, as an uninterrupted run's.
    ft ft_tracked --fail_at_epoch 3 --mlflow "$tmp/ft"
    first=$?
    mlruns "$tmp/ft" "$tmp/ft1.json" 2> "$tmp/check.err"
    expect_output "step 13, rank 1 killed in epoch 3 (exit $first): the run KILLED until the restart" \
        "$PYTHON" tests/tracked_run.py "$tmp/ft1.json" --experiment Default --runs 1 --status KILLED
    ft ft_tracked --fail_at_epoch 3 --mlflow "$tmp/ft"
    second=$?
    mlruns "$tmp/ft" "$tmp/ft2.json" 2> "$tmp/check.err"
    grep -q "^MLflow: resuming run [0-9a-f]\{32\} at $tmp/ft (it keeps the params of its first start)$" "$tmp/ft_tracked.out" \
        && pass "step 13 restarted: 'MLflow: resuming run ID at ...' (the id from its snapshot)" \
        || fail "step 13 restarted: no 'MLflow: resuming run' line: $(grep -i mlflow "$tmp/ft_tracked.out")"
    expect_output "step 13 restarted (exit $second): the same run, FINISHED, each step's loss once and equal to an uninterrupted run's, the snapshot an artifact" \
        "$PYTHON" tests/tracked_run.py "$tmp/ft2.json" --experiment Default --runs 1 --status FINISHED \
        --losses "$tmp/ft_plain.csv" --epochs 4 --artifact "$tmp/ft_tracked.h5"
fi

# ---------------------------------------------------------------- a real MLflow
if ! "$PYTHON" -c 'import mlflow' 2> /dev/null; then
    skip "a real MLflow server: $PYTHON has no mlflow (python3 -m venv --system-site-packages ENV && ENV/bin/pip install mlflow, then PYTHON=ENV/bin/python3; or PYTHONPATH to a checkout of MLflow)"
    exit 0
fi
real_port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$tmp/real"
# A process group of its own: `mlflow server` runs uvicorn as a child, which the group's kill takes too.
setsid "$PYTHON" -m mlflow server --host 127.0.0.1 --port "$real_port" --workers 1 \
    --backend-store-uri "sqlite:///$tmp/real/mlflow.db" --artifacts-destination "$tmp/real/artifacts" > "$tmp/real/server.log" 2>&1 &
servers+=(-$!)
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$real_port/health" > /dev/null 2>&1 && break; sleep 0.2; done
if ! curl -sf "http://127.0.0.1:$real_port/health" > /dev/null 2>&1; then
    fail "a real MLflow server did not start in 120 s: $(tail -3 "$tmp/real/server.log" | tr '\n' ' ')"
    exit 1
fi
train_tracked real 2 day1/6_mnist_ddp --mlflow "http://127.0.0.1:$real_port" --experiment real-ddp
status=$?
mlruns_check=$("$PYTHON" - "http://127.0.0.1:$real_port" "$tmp/real.csv" "$(accuracy "$tmp/real.out")" "$tmp/mlruns" 2>&1 <<'EOF'
import csv, sys
import mlflow
from mlflow.tracking import MlflowClient
uri, losses, accuracy, folder = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
mlflow.set_tracking_uri(uri)
runs = mlflow.search_runs(experiment_names=["real-ddp"])
assert len(runs) == 1, f"{len(runs)} runs"
run = runs.iloc[0]
assert run["status"] == "FINISHED", run["status"]
assert run["params.lr"] == "0.001" and run["params.world_size"] == "2", (run["params.lr"], run["params.world_size"])
assert abs(100 * run["metrics.test_accuracy"] - accuracy) < 0.006, run["metrics.test_accuracy"]
history = MlflowClient().get_metric_history(run["run_id"], "loss", max_results=100000) \
    if "max_results" in MlflowClient.get_metric_history.__code__.co_varnames else MlflowClient().get_metric_history(run["run_id"], "loss")
rows = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(open(losses))]
got = sorted((m.step, m.value) for m in history)
assert [s for s, _ in got] == [s for s, _ in rows], f"steps {[s for s, _ in got]}"
assert max(abs(v - w) / abs(w) for (_, v), (_, w) in zip(got, rows)) < 5e-6
artifacts = sorted(a.path for a in MlflowClient().list_artifacts(run["run_id"]))
assert artifacts == ["real.csv", "real.h5", "real.png"], artifacts
# The folder written above, read by MLflow's own FileStore.
mlflow.set_tracking_uri("file:" + folder)
folder_runs = mlflow.search_runs(experiment_names=["ddp"])
assert len(folder_runs) == 2 and set(folder_runs["status"]) == {"FINISHED"}, folder_runs[["status"]]
print(f"{len(got)} steps, test_accuracy {run['metrics.test_accuracy']}, artifacts {artifacts}; the mlruns folder: {len(folder_runs)} runs")
EOF
)
read_back=$?
if [ $status -eq 0 ] && [ $read_back -eq 0 ]; then
    pass "a real MLflow $("$PYTHON" -c 'import mlflow; print(mlflow.__version__)') (server on SQLite): search_runs and get_metric_history read the run back: $(echo "$mlruns_check" | tail -1)"
else
    fail "a real MLflow: exit $status: $(echo "$mlruns_check" | tail -3 | tr '\n' ' ') $(head -2 "$tmp/real.err" | tr '\n' ' ')"
fi
