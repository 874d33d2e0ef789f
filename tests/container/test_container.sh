#!/usr/bin/env bash
# The container image (Dockerfile) and the Kubernetes Job (k8s/job.yaml), for real:
# - job.yaml parses, each of its documents (a PersistentVolumeClaim, the Job) is valid for the
#   Kubernetes API's own models, and it holds the fields docs/containers.md promises (GPUs = ranks, /dev/shm
#   in memory, toleration, node selector, restarts, non-root, step 13's snapshot on the claim);
# - the image builds from a clean clone of HEAD, holds the committed files and no data or build output,
#   and runs as a non-root user;
# - its default command runs the Day 1 demo on MNIST mounted read-only, with the results of the same
#   demo outside, and without MNIST (and no network) stops with one clear line;
# - the Job's own commands (read from job.yaml) fetch MNIST into an empty folder and train on it,
#   with the host's results, leaving the snapshot in a folder mounted where the claim goes;
# - the restart lesson: the same training killed in mid-run (--fail_at_epoch), then run again on
#   the same folder, as restartPolicy: OnFailure does, resumes from the snapshot and ends with the
#   losses, accuracy and checksums of the run that never failed.
# `make test-container` runs it (CI: after `make test`); it prints PASS/FAIL/SKIP lines, and
# tests/run.sh counts them.
#
# The engine: ../shared/tools/podman-here.sh where it exists (our sandboxed machines reach no
# image registry; it makes podman work there), else podman, else docker; CONTAINER_ENGINE=docker
# picks one. With none, or one that cannot run a container here, the test says SKIP and why.
# The layer of packages is cached as the image ddp-workshop-test-deps (rebuilt when setup.sh
# changes; `podman rmi ddp-workshop-test-deps` drops it); all the rest is built from scratch.
set -u
cd "$(dirname "$0")/../.." || exit
source tests/lib.sh  # its PYTHON: Debian's, with python3-yaml and python3-kubernetes
suite container
tmp=$(mktemp -d)
image=localhost/ddp-workshop-test:$$
deps=localhost/ddp-workshop-test-deps

now() { date +%s.%N; }
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f\n", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.1f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# ---------------------------------------------------------------- k8s/job.yaml
# One PASS/FAIL line per property; the Job's two commands, one argument a line, the snapshot's
# folder in the container and the epochs of the restart test below, for the runs below.
"$PYTHON" - k8s/job.yaml "$tmp" <<'EOF'
import json, posixpath, sys
path, out = sys.argv[1], sys.argv[2]
def check(what, ok):
    print(("PASS" if ok else "FAIL") + " container: job.yaml: " + what)
try:
    import yaml
except ImportError:
    print("SKIP container: job.yaml: python3-yaml is not installed (./setup.sh --with-containers)")
    sys.exit(0)
try:
    documents = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    job, = [d for d in documents if d.get("kind") == "Job"]
    claims = {d["metadata"]["name"]: d for d in documents if d.get("kind") == "PersistentVolumeClaim"}
    pod = job["spec"]["template"]["spec"]
    train, = pod["containers"]
    init, = pod.get("initContainers", [])
except Exception as e:
    check(f"parses as one Job with one container and one init container ({type(e).__name__}: {e})", False)
    sys.exit(0)
check("parses: a batch/v1 Job", job.get("apiVersion") == "batch/v1")
check(f"its documents are a PersistentVolumeClaim and the Job ({', '.join(str(d.get('kind')) for d in documents)})",
      sorted(d.get("kind") for d in documents) == ["Job", "PersistentVolumeClaim"]
      and all(c.get("apiVersion") == "v1" for c in claims.values()))

# Every key known to the Kubernetes API's model of each document, with its type: the client's
# deserializer drops unknown keys (a misspelled field) and converts values, so a round trip must
# give it back.
try:
    from kubernetes import client
except ImportError:
    print("SKIP container: job.yaml against the Kubernetes API's models: python3-kubernetes is not installed (./setup.sh --with-containers)")
else:
    models = {"Job": "V1Job", "PersistentVolumeClaim": "V1PersistentVolumeClaim"}
    api = client.ApiClient()
    for document in documents:
        kind = document.get("kind")
        class Response: data = json.dumps(document)
        try:
            back = api.sanitize_for_serialization(api.deserialize(Response(), models[kind]))
            problems = []
            def same(a, b, where):
                if isinstance(a, dict) and isinstance(b, dict):
                    for key in sorted(set(a) | set(b)):
                        if key not in b: problems.append(f"{where}.{key}: unknown to the API")
                        elif key not in a: problems.append(f"{where}.{key}: added")
                        else: same(a[key], b[key], f"{where}.{key}")
                elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
                    for i, (x, y) in enumerate(zip(a, b)): same(x, y, f"{where}[{i}]")
                # A quantity (nvidia.com/gpu: 4) is a string in the model and may be an integer in YAML.
                elif not (type(a) is type(b) and a == b) and not (type(a) is int and b == str(a)):
                    problems.append(f"{where}: {a!r} read as {b!r}")
            same(document, back, "")
            check(f"every field of the {kind} is a field of the Kubernetes API's {kind}, with its type" +
                  (": " + "; ".join(problems) if problems else ""), not problems)
        except Exception as e:
            check(f"the Kubernetes API's models reject the {kind} ({type(e).__name__}: {e})", False)

command = train.get("command", []) + train.get("args", [])
ranks = command[2] if command[:2] == ["mpirun", "-np"] and len(command) > 3 else None
gpus = train.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
check(f"the container runs `mpirun -np N day3/13_fault_tolerant_ddp ...` ({' '.join(command)})",
      ranks is not None and command[3] == "day3/13_fault_tolerant_ddp")
check(f"it asks for as many GPUs as it starts ranks (nvidia.com/gpu: {gpus}, -np {ranks})",
      ranks is not None and str(gpus) == ranks)
volumes = {v["name"]: v for v in pod.get("volumes", [])}
def volume_at(container, mount_path):
    for mount in container.get("volumeMounts", []):
        if mount["mountPath"] == mount_path:
            return volumes.get(mount["name"], {}), mount
    return {}, {}
shm, _ = volume_at(train, "/dev/shm")
check(f"/dev/shm is an emptyDir in memory of 1Gi ({shm.get('emptyDir')})",
      shm.get("emptyDir") == {"medium": "Memory", "sizeLimit": "1Gi"})
check(f"it tolerates the GPU nodes' taint ({pod.get('tolerations')})",
      any(t.get("key") == "nvidia.com/gpu" and t.get("effect", "NoSchedule") == "NoSchedule"
          for t in pod.get("tolerations", [])))
check(f"a node selector picks the GPU nodes ({pod.get('nodeSelector')})", bool(pod.get("nodeSelector")))
check(f"a failed container restarts, a bounded number of times (restartPolicy {pod.get('restartPolicy')}, "
      f"backoffLimit {job['spec'].get('backoffLimit')})",
      pod.get("restartPolicy") == "OnFailure" and isinstance(job["spec"].get("backoffLimit"), int)
      and job["spec"]["backoffLimit"] >= 1)
check("it refuses to run as root (runAsNonRoot)",
      pod.get("securityContext", {}).get("runAsNonRoot") is True or
      train.get("securityContext", {}).get("runAsNonRoot") is True)
data_train, mount_train = volume_at(train, "/workshop/data/mnist")
data_init, _ = volume_at(init, "/workshop/data/mnist")
check("the init container fills the data volume, which training mounts read-only at /workshop/data/mnist",
      data_train and data_train is data_init and mount_train.get("readOnly") is True)
check(f"both containers run the same image ({train.get('image')})",
      bool(train.get("image")) and train.get("image") == init.get("image"))

# The snapshot (step 13's --snapshot, --total_epochs and --save_every, as it reads them: the last
# one given wins) lives on the claim, where a restarted container, or a new pod, finds it.
def flag(name, default):
    value = default
    for i, arg in enumerate(command):
        if arg.startswith(f"--{name}="): value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(command): value = command[i + 1]
    return value
snapshot = flag("snapshot", "checkpoints/snapshot.h5")
folder = posixpath.normpath(posixpath.join(train.get("workingDir", "/workshop"), posixpath.dirname(snapshot)))
snapshots, mount_snapshots = volume_at(train, folder)
claim = snapshots.get("persistentVolumeClaim", {}).get("claimName")
check(f"the snapshot ({snapshot}) is on the claim {claim}, defined in the file and mounted writable at {folder}",
      claim in claims and not mount_snapshots.get("readOnly", False))
group = pod.get("securityContext", {}).get("fsGroup")
check(f"the claim's files belong to a group of the non-root user (fsGroup {group}), who writes the snapshots",
      isinstance(group, int) and group > 0)
try:
    total, save_every = int(flag("total_epochs", "10")), int(flag("save_every", "1"))
except ValueError:
    total = save_every = 0
# A rank dies in the first epoch after the first snapshot; the restart must resume from that one.
fail_at = save_every + 1
check(f"a snapshot is saved before the last epoch, so a failure can lose less than the run "
      f"(--save_every {save_every}, --total_epochs {total})", 1 <= save_every and fail_at <= total)
for name, container in (("train", train), ("init", init)):
    with open(f"{out}/{name}.cmd", "w") as f:
        f.write("".join(arg + "\n" for arg in container.get("command", []) + container.get("args", [])))
with open(f"{out}/snapshot", "w") as f:
    f.write(f"{folder}\n{posixpath.basename(snapshot)}\n{fail_at}\n{save_every}\n")
EOF

# ---------------------------------------------------------------- the engine
here=../shared/tools/podman-here.sh
engine=${CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
    if [ -x "$here" ]; then engine=$here
    elif command -v podman > /dev/null; then engine=podman
    elif command -v docker > /dev/null; then engine=docker
    else
        skip "the image: neither podman nor docker is installed (./setup.sh --with-containers installs podman)"
        rm -rf "$tmp"; exit 0
    fi
fi
# podman-here.sh wraps build and run; images are listed and removed by podman itself.
case $engine in *podman-here.sh) manage=podman ;; *) manage=$engine ;; esac
cleanup() { "$manage" rmi -f "$image" > /dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
# Can it run a container at all here? (With podman-here.sh, the first call sets podman up: a minute.)
if ! timeout 600 "$engine" run --rm docker.io/library/debian:bookworm true > "$tmp/probe" 2>&1; then
    why=$(grep -v -e '^$' -e "^Run '.* --help'" "$tmp/probe" | tail -1)
    skip "the image: $engine cannot run a container here: ${why:-it exits with an error and says nothing}"
    exit 0
fi

# ---------------------------------------------------------------- build from a clean clone
# The committed tree, plus what a user's working copy also holds (MNIST, build outputs, images),
# which .dockerignore must keep out of the image.
head=$(git rev-parse HEAD)
git clone -q --no-checkout . "$tmp/src" && git -C "$tmp/src" checkout -q --detach "$head"
[ -z "$(git status --porcelain --untracked-files=no)" ] || echo "note: uncommitted changes are not in the image (it builds HEAD, $head)"
mkdir -p "$tmp/src/data/mnist" "$tmp/src/img" "$tmp/src/build"
cp data/mnist/*.gz "$tmp/src/data/mnist/"
touch "$tmp/src/img/stale.png" "$tmp/src/build/stale.o" "$tmp/src/day1/stale_program" "$tmp/src/losses.csv"

# First the packages' layer (Dockerfile's stage `deps`), from the cache when setup.sh has not changed,
# then everything else with no cache at all, on top of it.
start=$(now)
timeout 1200 "$engine" build --target deps -t "$deps" "$tmp/src" > "$tmp/build_deps.log" 2>&1
deps_status=$?
middle=$(now)
timeout 1200 "$engine" build --no-cache --build-arg BASE="$deps" -t "$image" "$tmp/src" > "$tmp/build.log" 2>&1
build_status=$?
end=$(now)
if grep -qE 'Using cache|CACHED' "$tmp/build_deps.log"; then packages="packages from the cache"
else packages="packages installed in $(seconds "$start" "$middle") s"; fi
if [ $deps_status -ne 0 ] || [ $build_status -ne 0 ]; then
    fail "the image does not build from a clean clone of HEAD (${head:0:12}); the end of the log:"
    tail -n 15 "$tmp/build_deps.log" "$tmp/build.log" | sed 's/^/    /'
    exit 1
fi
size=$("$manage" image inspect --format '{{.Size}}' "$image")
pass "the image builds from a clean clone of HEAD (${head:0:12}) in $(seconds "$start" "$end") s ($packages, then the build in $(seconds "$middle" "$end") s); $((size / 1000000)) MB"
expect "the image is under 1 GB ($((size / 1000000)) MB)" test "$size" -lt 1000000000
expect "the build in the image: $(grep -m1 -o 'config: .*' "$tmp/build.log")" grep -q 'config: mpicc ✓  cblas ✓' "$tmp/build.log"
expect "the build in the image has no compiler warnings ($(grep -c 'warning:' "$tmp/build.log") found)" \
    test "$(grep -c 'warning:' "$tmp/build.log")" = 0

"$engine" run --rm "$image" find . -type f > "$tmp/files" 2>&1
missing=$(git -C "$tmp/src" ls-files | while read -r file; do grep -qxF "./$file" "$tmp/files" || echo "$file"; done)
expect "the image holds every committed file${missing:+ (missing: ${missing//$'\n'/ })}" test -z "$missing"
kept=$(grep -E '^\./(\.git/|data/mnist/|img/|build/stale|day1/stale|losses\.csv)' "$tmp/files" | head -5)
expect "the image holds no MNIST, git history or stale outputs of the working copy${kept:+ (found: ${kept//$'\n'/ })}" test -z "$kept"
# Every program (step 1 is built only with CUDA, which the default base lacks).
unbuilt=$(git -C "$tmp/src" ls-files 'day*/*.c' | sed 's/\.c$//' | grep -v '^day1/1_dist_allreduce_gpu$' |
          while read -r program; do grep -qxF "./$program" "$tmp/files" || echo "$program"; done)
expect "every program is built in the image${unbuilt:+ (not: ${unbuilt//$'\n'/ })}" test -z "$unbuilt"

user=$("$manage" image inspect --format '{{.Config.User}}' "$image")
uid=$("$engine" run --rm "$image" id -u 2>&1)
non_root() { [[ $uid =~ ^[0-9]+$ ]] && [ "$uid" != 0 ] && [[ $user =~ ^[1-9][0-9]*(:[0-9]+)?$ ]]; }
expect "the container runs as a non-root user (uid $uid; USER $user, numeric for runAsNonRoot)" non_root

# ---------------------------------------------------------------- the default command: the demo
# MNIST from the mirror (CI's MNIST_MIRROR), else from data/mnist, mounted read-only. OpenBLAS's
# settings of this machine, if any, go in too: the results are compared with the host's.
mnist=${MNIST_MIRROR:-}
[ -d "$mnist" ] || mnist=data/mnist
mnist=$(cd "$mnist" && pwd)
env_opts=()
for var in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; do [ -n "${!var:-}" ] && env_opts+=(-e "$var"); done

# Inside and outside in turn, 3 times each (the machine's noise hits both), medians of the times.
: > "$tmp/times_in"; : > "$tmp/times_out"
for round in 1 2 3; do
    t0=$(now)
    timeout 600 "$engine" run --rm "${env_opts[@]}" -v "$mnist:/workshop/data/mnist:ro" "$image" > "$tmp/demo_in$round" 2>&1
    status_in[round]=$?
    t1=$(now)
    CUDA_VISIBLE_DEVICES='' timeout 600 make --no-print-directory demo > "$tmp/demo_out$round" 2>&1
    status_out[round]=$?
    t2=$(now)
    seconds "$t0" "$t1" >> "$tmp/times_in"
    seconds "$t1" "$t2" >> "$tmp/times_out"
done
demo=$tmp/demo_in1
# One program's part of the demo's output: from make's echo of its command to the next one (the
# ranks' lines interleave, so no line of a program's own output can mark its end).
section() { awk -v program="day1/$1" '/^(mpirun .*)?day1\/[0-9a-z_]+$/ || /^demo done/ { inside = ($NF == program) } inside' "$demo"; }
demo_ends() { [ "${status_in[1]}" = 0 ] && grep -q '^demo done' "$demo"; }
expect "the default command runs the Day 1 demo to its end (exit ${status_in[1]})" demo_ends
expect "step 0 in the container: 4 ranks print mean 2.5" test "$(grep -c 'after allreduce: sum 10, mean 2.5$' "$demo")" = 4
accuracy=$(section 2_mnist_training | sed -n 's/.*Test accuracy: \([0-9.]*\)%.*/\1/p')
expect "step 2 in the container reaches >= 85% test accuracy (got ${accuracy:-nothing}%)" awk "BEGIN { exit !(${accuracy:-0} >= 85) }"
for step in 3_mnist_distributed 4_mnist_manual_ddp; do
    sums=$(section "$step" | grep -io 'parameter checksum [0-9a-f]*' | cut -d' ' -f3)
    expect "step ${step%%_*} in the container: 2 ranks, the same parameters (${sums//$'\n'/ })" \
        test "$(echo "$sums" | wc -w)" = 2 -a "$(echo "$sums" | sort -u | wc -l)" = 1
done
# The losses, accuracies and checksums, without the times: the host's, line for line.
results() { grep -E 'mean loss|Test accuracy|checksum|after allreduce' "$1" |
            sed -E 's/, [0-9.]+ s, [0-9]+ samples\/s//; s/Training completed in [0-9.]+ s(econds)?\. //' | sort; }
results "$tmp/demo_in1" > "$tmp/results_in"
results "$tmp/demo_out1" > "$tmp/results_out"
same_results() { [ -s "$tmp/results_in" ] && cmp -s "$tmp/results_in" "$tmp/results_out"; }
host_same() { [ "${status_out[1]}" = 0 ] && same_results; }
expect "the demo in the container prints the host's losses, accuracies and checksums ($(wc -l < "$tmp/results_in") lines; the host's exit ${status_out[1]})" host_same
inside=$(median < "$tmp/times_in"); outside=$(median < "$tmp/times_out")
pass "the demo takes $inside s in the container, $outside s outside ($(awk -v a="$inside" -v b="$outside" 'BEGIN { printf "%.2f", a / b }')x; medians of 3, in turn: $(paste -sd" " "$tmp/times_in") / $(paste -sd" " "$tmp/times_out"))"

timeout 120 "$engine" run --rm --network none "$image" > "$tmp/nodata" 2>&1
status=$?
line=$(grep -m1 '^error: ' "$tmp/nodata")
stops_clearly() { [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [[ $line == *'cannot download'*'MNIST_MIRROR'* ]]; }
expect "without MNIST mounted and offline, the demo stops: exit $status, '$line'" stops_clearly

# ---------------------------------------------------------------- the Job's commands
# As in the pod: the init container fills an empty folder (an emptyDir is writable by all), from
# the mirror instead of the internet; then training mounts it read-only, with 1 GB of /dev/shm, and
# an empty folder where the claim goes (writable by the image's user, as fsGroup makes the claim).
if [ -s "$tmp/train.cmd" ] && [ -s "$tmp/init.cmd" ] && [ -s "$tmp/snapshot" ]; then
    mapfile -t train < "$tmp/train.cmd"
    mapfile -t init < "$tmp/init.cmd"
    { read -r snapshot_dir; read -r snapshot_file; read -r fail_at; read -r resume_at; } < "$tmp/snapshot"
    mkdir "$tmp/emptydir" && chmod 777 "$tmp/emptydir"
    timeout 300 "$engine" run --rm -e MNIST_MIRROR=/mirror -v "$mnist:/mirror:ro" \
        -v "$tmp/emptydir:/workshop/data/mnist" "$image" "${init[@]}" > "$tmp/init" 2>&1
    status=$?
    verified=$(grep -c 'md5 verified' "$tmp/init")
    # (each of the four .gz and the file it unpacks to: data/fetch_mnist.sh)
    fetched() { [ "$status" = 0 ] && [ "$verified" = 8 ] && [ "$(find "$tmp/emptydir" -type f | wc -l)" = 8 ]; }
    expect "the Job's init container (${init[*]}) fills the data volume as a non-root user: exit $status, $verified files md5-verified" fetched

    # The training container on a fresh claim (a folder of the host, $1), with extra flags ($2...).
    run_train() {
        local claim=$1; shift
        mkdir -p "$claim" && chmod 777 "$claim"
        timeout 600 "$engine" run --rm --shm-size 1g "${env_opts[@]}" -v "$tmp/emptydir:/workshop/data/mnist:ro" \
            -v "$claim:$snapshot_dir" "$image" "${train[@]}" "$@"
    }
    run_train "$tmp/claim" > "$tmp/job" 2>&1
    status=$?
    ranks=${train[2]}
    sums=$(sed -n 's/.*parameter checksum \([0-9a-f]*\)/\1/p' "$tmp/job")
    trained() { [ "$status" = 0 ] && grep -q "^World Size: $ranks\." "$tmp/job" &&
                [ "$(echo "$sums" | wc -w)" = "$ranks" ] && [ "$(echo "$sums" | sort -u | wc -l)" = 1 ]; }
    expect "the Job's command (${train[*]}) trains in the container: exit $status, world size $ranks, $ranks ranks with the same parameters" trained
    saved() { grep -q "^No snapshot at " "$tmp/job" && [ -s "$tmp/claim/$snapshot_file" ] &&
              [ -z "$(find "$tmp/claim" -name '*.tmp')" ]; }
    expect "it starts from scratch on an empty claim and leaves its snapshot there ($snapshot_dir/$snapshot_file, $(stat -c %s "$tmp/claim/$snapshot_file" 2> /dev/null) bytes)" saved
    # On the host, the same command with the snapshot in a folder of its own (the last --snapshot wins).
    CUDA_VISIBLE_DEVICES='' timeout 600 $MPIRUN "${train[@]:1}" --snapshot="$tmp/host_claim/$snapshot_file" > "$tmp/job_host" 2>&1
    results "$tmp/job" > "$tmp/results_in"
    results "$tmp/job_host" > "$tmp/results_out"
    expect "the Job's command prints the host's losses, accuracy and checksums ($(grep -o 'Test accuracy: [0-9.]*%' "$tmp/job"))" same_results

    # The restart lesson, as Kubernetes runs it: a rank dies in epoch $fail_at (--fail_at_epoch,
    # SIGKILL, as a lost GPU or node), mpirun fails, restartPolicy runs the same command again on
    # the same claim. It must resume from the snapshot and end as the run above, which never failed.
    run_train "$tmp/restart_claim" --fail_at_epoch="$fail_at" > "$tmp/failed" 2>&1
    status=$?
    died() { [ "$status" != 0 ] && [ "$status" != 124 ] && grep -q -- "--fail_at_epoch $fail_at: this rank dies now" "$tmp/failed" &&
             grep -q "^Epoch $resume_at | Training snapshot saved" "$tmp/failed" && [ -s "$tmp/restart_claim/$snapshot_file" ] &&
             ! grep -q '^World Size' "$tmp/failed"; }
    expect "with --fail_at_epoch=$fail_at a rank dies in epoch $fail_at: exit $status, after the snapshot of epoch $resume_at on the claim" died
    run_train "$tmp/restart_claim" --fail_at_epoch="$fail_at" > "$tmp/restarted" 2>&1
    status=$?
    resumed() { [ "$status" = 0 ] && grep -q "^Resuming training from snapshot at Epoch $resume_at\$" "$tmp/restarted" &&
                ! grep -q -- '--fail_at_epoch.*dies now' "$tmp/restarted"; }
    expect "the same command again, as the restart: exit $status, '$(grep -m1 '^Resuming' "$tmp/restarted")'" resumed
    # The epochs after the snapshot, the accuracy and every rank's checksum: the uninterrupted run's.
    results "$tmp/restarted" > "$tmp/results_restarted"
    results "$tmp/job" | awk -v done="$resume_at" '{ split($2, e, "/") } !($1 == "epoch" && e[1] + 0 <= done)' > "$tmp/results_straight"
    same_as_straight() { grep -q checksum "$tmp/results_restarted" && cmp -s "$tmp/results_restarted" "$tmp/results_straight"; }
    expect "the restarted run ends as the run that never failed: the same losses of epochs $((resume_at + 1)) on, accuracy and checksums ($(grep -m1 -o 'checksum [0-9a-f]*' "$tmp/restarted"))" same_as_straight
else
    skip "the Job's commands in the image: job.yaml was not read (needs python3-yaml: ./setup.sh --with-containers; and a job.yaml that parses: see above)"
fi
