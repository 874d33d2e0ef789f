#!/usr/bin/env bash
# Benchmark (not a test): what a checkpoint costs step 18 under ZeRO-3 (issue 41's "done when"), on
# NP ranks (default 4) of a model that no rank holds whole (--hidden 4096,4096,4096,4096: 53.6 M
# weights, 858 MB of weights, gradients and Adam's moments, 214 MB a rank on 4). Four runs of the
# same STEPS steps, alternating, REPEATS times:
#   train    no saving: the ZeRO-3 training's own peak
#   sharded  --checkpoint, --save_every SAVE_EVERY, saved in line: each rank writes its shards
#   gather   --save FILE.h5: the whole model gathered to rank 0, which writes it (no Adam state)
#   async    --checkpoint --async_save, --save_every SAVE_EVERY: a thread writes the shards
# Per rank, two peaks of the resident set (medians over the repeats), each against the training
# run's: the program's own (its memory table's "peak RSS", VmHWM after training, the checkpoint
# saves and the evaluation), and the whole run's (/usr/bin/time's maximum resident set, VmHWM at
# exit: also the layer-by-layer gather of the final checksum and --save's gather to rank 0, which
# come after the table). Per step, rank 0's time between two
# steps' losses (their MLflow timestamps, taken as each step's loss is logged: the ranks agree on
# it every step, so it is every rank's step): the median step of the training run against the
# steps of the async run that began while a thread was writing (from the save's step to the end
# of its write: the stall and the write time that its line prints), and the in-line save's step.
#
#   tests/bench_checkpoint.sh [REPEATS] [STEPS] [NP]      (defaults 2, 12 and 4)
#   HIDDEN=1024,1024 SAVE_EVERY=3 tests/bench_checkpoint.sh   (a smaller model, saves every 3 steps)
#
# Times are of this machine under its load (printed before and after): on fewer cores than ranks
# the ranks share them, and an asynchronous save's writer thread takes its time from the ranks'
# steps unless a core (or a GPU) is idle. Run from anywhere; it works in the repository's root.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-2}
steps=${2:-12}
np=${3:-4}
hidden=${HIDDEN:-4096,4096,4096,4096}
save_every=${SAVE_EVERY:-4}
batch=${BATCH_SIZE:-64}
[ -x day4/18_zero_sharding ] || { echo "no day4/18_zero_sharding: make day4/18_zero_sharding" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "no /usr/bin/time (apt-get install time): it measures each rank's peak" >&2; exit 1; }
unset OPENBLAS_CORETYPE
MPIRUN=${MPIRUN:-mpirun --oversubscribe --bind-to none}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_checkpoint.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
modes=(train sharded gather async)
declare -A extra=(
    [train]=""
    [sharded]="--checkpoint $tmp/ck --save_every $save_every"
    [gather]="--save $tmp/whole.h5"
    [async]="--checkpoint $tmp/ck --save_every $save_every --async_save"
)
echo "step 18 --zero 3 on $np ranks, --hidden $hidden --batch_size $batch, $steps steps a run, saves every $save_every steps; $repeats repeats, alternating"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; checkpoints in $tmp ($(df -h --output=fstype "$tmp" | tail -1 | tr -d ' '))"
for ((r = 0; r < repeats; r++)); do
    for mode in "${modes[@]}"; do
        rm -rf "$tmp/ck" "$tmp/whole.h5"
        out=$tmp/$mode.$r
        mkdir -p "$out"
        # Each rank under /usr/bin/time, its maximum resident set into a file named by its rank.
        # shellcheck disable=SC2086,SC2016
        $MPIRUN -np "$np" sh -c 'exec /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$out/rss" \
            day4/18_zero_sharding --zero 3 --hidden "$hidden" --batch_size "$batch" --max_steps "$steps" --plot '' \
            --threads 1 --mlflow "$out/mlruns" ${extra[$mode]} > "$out/stdout" 2>&1 ||
            { echo "failed: $mode: $(grep -a -m1 'error\|rank [0-9]* @' "$out/stdout")" >&2; exit 1; }
    done
done
python3 - "$tmp" "$repeats" "$np" "$save_every" "$steps" << 'EOF'
import glob, re, statistics, sys
tmp, repeats, np, save_every, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
modes = ["train", "sharded", "gather", "async"]
def peaks(mode):  # MB per rank, the median over the repeats (/usr/bin/time's %M is in KiB)
    return [statistics.median(int(open(f"{tmp}/{mode}.{r}/rss.{k}").read().split()[-1]) * 1024 / 1e6
                              for r in range(repeats)) for k in range(np)]
def table_peaks(mode):  # MB per rank: the memory table's last column, the median over the repeats
    per_run = []
    for r in range(repeats):
        lines = open(f"{tmp}/{mode}.{r}/stdout").read().split("\n")
        head = next(i for i, line in enumerate(lines) if line.startswith("rank  parameters"))
        per_run.append([float(line.split()[-1]) for line in lines[head + 1:head + 1 + np]])
    return [statistics.median(run[k] for run in per_run) for k in range(np)]
def step_times(mode, r):  # {step: seconds since the step before}, from rank 0's loss timestamps
    (path,) = glob.glob(f"{tmp}/{mode}.{r}/mlruns/*/*/metrics/loss")
    stamps = {int(s): int(t) for t, _, s in (line.split() for line in open(path))}
    return {s: (stamps[s] - stamps[s - 1]) / 1e3 for s in stamps if s - 1 in stamps}
def saves(mode, r):  # (step, stall s, write s) of each asynchronous save's line
    text = open(f"{tmp}/{mode}.{r}/stdout").read()
    return [(int(s), float(a) / 1e3, float(w) / 1e3) for s, a, w in re.findall(
        r"Checkpoint of step (\d+) saved .*stalled ([\d.]+) ms, the thread wrote for ([\d.]+) ms", text)]
for title, p in (("the memory table's, after training, the saves and the evaluation", {m: table_peaks(m) for m in modes}),
                 ("the whole run's (/usr/bin/time), the final gathers included", {m: peaks(m) for m in modes})):
    print("Peak resident set per rank (MB, the median of %d runs): %s; x the training run's" % (repeats, title))
    print("rank  training   sharded save   gather to rank 0 (--save)      async save")
    for k in range(np):
        t = p["train"][k]
        print("%4d  %8.0f  %6.0f (%.2fx)  %16.0f (%.2fx)  %8.0f (%.2fx)" % (k, t, p["sharded"][k], p["sharded"][k] / t,
              p["gather"][k], p["gather"][k] / t, p["async"][k], p["async"][k] / t))
# Step times. Loss k (0-based) is logged at the end of step k + 1; the interval before loss k is step k + 1.
base, during, first_after, inline = [], [], [], []
for r in range(repeats):
    base += [t for s, t in step_times("train", r).items() if s >= 1]  # the first step (warm-up) aside
    st = step_times("async", r)
    stamps_s = sorted(st)
    for step, stall, write in saves("async", r):
        if step >= steps: continue  # the last save: finished after training, no step runs beside it
        busy, k = stall + write, step  # loss index `step` is step step + 1's end, the first step after the save
        first_after.append(st[k])
        elapsed = 0.0
        while k in st and elapsed < busy:  # the steps that began while the save was being copied or written
            during.append(st[k]); elapsed += st[k]; k += 1
    si = step_times("sharded", r)
    inline += [si[s] for s in si if s % save_every == 0 and s < steps]  # the step that ends with an in-line save
b = statistics.median(base)
print("Step time (rank 0, s): without saving, median %.3f over %d steps" % (b, len(base)))
if during:
    d = statistics.mean(during)
    print("  --async_save: the %d steps that ran while a save was copied or written: mean %.3f (%.2fx), the largest %.3f (%.2fx);"
          % (len(during), d, d / b, max(during), max(during) / b))
    print("                the first step after each save (its stall included): mean %.3f (%.2fx)"
          % (statistics.mean(first_after), statistics.mean(first_after) / b))
if inline:
    print("  sharded in line: the step that includes a save, mean %.3f (%.2fx)" % (statistics.mean(inline), statistics.mean(inline) / b))
for r in range(repeats):
    print("  async run %d's saves: %s" % (r + 1, ", ".join("step %d stalled %.2f s, wrote %.2f s" % s for s in saves("async", r))))
EOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
