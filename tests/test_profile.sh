#!/usr/bin/env bash
# Profiling: step 5's and test_profile's ranges, summary table and Chrome
# trace; step 6's buckets overlapping backward in the trace; builds with and
# without NVTX. One PASS/FAIL/SKIP line per check.
# The builds with and without NVTX (two compilations of common/) run in make test-all
# (TEST_LEVEL=all), not in make test.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite profile
scratch
if ! "$PYTHON" -c 'import json' 2> /dev/null; then
    skip "the trace checks need python3 (apt-get install python3)"
    exit 0
fi

# check_trace FILE RANKS "required names" CHECK-KIND: parse with a real JSON parser and check
# names, nesting and durations per rank. CHECK-KIND: step5 | toy | overlap | no-overlap
check_trace() {
    "$PYTHON" - "$@" << 'PY'
import json, sys
path, ranks, required, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
try:
    events = json.load(open(path))["traceEvents"]
except Exception as e:
    print(f"FAIL profile: {path} is not valid JSON: {e}"); sys.exit(1)
ok, notes = True, []
def fail(msg):
    global ok; ok = False; notes.append(msg)
spans = [e for e in events if e.get("ph") == "X"]
for e in spans:
    if e["dur"] < 0: fail(f"negative duration {e}")
for rank in range(ranks):
    mine = [e for e in spans if e["pid"] == rank]
    names = {e["name"] for e in mine} | {e["name"] for e in events if e.get("ph") == "i" and e["pid"] == rank}
    missing = [n for n in required if n not in names]
    if missing: fail(f"rank {rank} lacks {missing}")
    if not any(e.get("ph") == "C" and e["pid"] == rank and e["args"]["MB"] > 0 for e in events):
        fail(f"rank {rank} has no peak-memory counter")
    main = sorted([e for e in mine if e["tid"] == 0], key=lambda e: (e["ts"], -e["dur"]))
    # Proper nesting on the main thread: ranges are either disjoint or contained.
    stack = []
    for e in main:
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - 1e-3: stack.pop()
        if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + 1e-3:
            fail(f"rank {rank}: {e['name']} overlaps {stack[-1]['name']} without nesting"); break
        stack.append(e)
    def inside(child, parent): return parent["ts"] - 1e-3 <= child["ts"] and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"] + 1e-3
    if kind == "step5":
        steps = [e for e in main if e["name"] == "step"]
        loop_end = max(s["ts"] + s["dur"] for s in steps) if steps else 0  # the test-set forward comes after
        for n in ["data", "forward", "loss", "backward", "allreduce", "optimizer"]:
            for e in (e for e in main if e["name"] == n and e["ts"] < loop_end):
                if not any(inside(e, s) for s in steps): fail(f"rank {rank}: a {n} range outside every step"); break
        children = sum(e["dur"] for e in main if e["name"] != "step" and any(inside(e, s) for s in steps))
        total = sum(s["dur"] for s in steps)
        share = children / total if total else 0
        notes.append(f"rank {rank}: ranges inside 'step' cover {100 * share:.1f}% of it")
        if not 0.9 <= share <= 1.1: fail(f"rank {rank}: children cover {100 * share:.1f}% of the steps")
    if kind == "toy":
        for n, parent in [("forward", "forward_pass"), ("backward", "loss+backward"), ("optimizer", "optimizer_step")]:
            for e in (e for e in main if e["name"] == n):
                if not any(inside(e, p) for p in main if p["name"] == parent): fail(f"rank {rank}: {n} outside {parent}"); break
        marks = [e for e in events if e.get("ph") == "i" and e["pid"] == rank and e["name"] == "step"]
        if len(marks) != 5: fail(f"rank {rank}: {len(marks)} step markers, expected 5")
    if kind in ("overlap", "no-overlap"):
        backwards = [e for e in main if e["name"] == "backward"]
        comm = [e for e in mine if e["name"] == "allreduce"]
        during = sum(1 for a in comm if any(b["ts"] < a["ts"] < b["ts"] + b["dur"] for b in backwards))
        notes.append(f"rank {rank}: {during} of {len(comm)} allreduce ranges start during backward")
        if kind == "overlap" and during == 0: fail(f"rank {rank}: no allreduce starts during backward")
        if kind == "no-overlap" and during != 0: fail(f"rank {rank}: an allreduce starts during backward")
print(("PASS" if ok else "FAIL") + f" profile: {path.split('/')[-1]} ({kind}, {ranks} ranks, {len(spans)} ranges): " + "; ".join(notes[:4]))
sys.exit(0 if ok else 1)
PY
}

# ---------------------------------------------------------------- step 5
mpi 2 day1/5_mnist_manual_ddp_profile --trace "$tmp/log_ddp/trace5.json" --plot '' > "$tmp/out5" 2>&1
check_trace "$tmp/log_ddp/trace5.json" 2 step,data,forward,loss,backward,allreduce,optimizer step5
check_trace "$tmp/log_ddp/trace5.json" 2 backward,allreduce no-overlap
share=$(sed -n "s/^The ranges inside 'step' account for \([0-9.]*\)% of its time\./\1/p" "$tmp/out5")
if [ -n "$share" ] && awk "BEGIN { exit !($share >= 90 && $share <= 110) }"; then
    pass "step 5's summary table adds up to the step time ($share%)"
else
    fail "step 5's summary: '${share:-no share line}'"; tail -12 "$tmp/out5"
fi
rows=$(awk '/^range +calls/ { on = 1; next } /^The ranges inside/ { on = 0 } on' "$tmp/out5" | awk '{ print $1 }' | sort | tr '\n' ' ')
if [ "$rows" = "allreduce backward data forward loss optimizer step " ] && grep -q '^Peak memory (RSS) so far: rank 0 [0-9]* MB, rank 1 [0-9]* MB' "$tmp/out5"; then
    pass "step 5's table lists every range and each rank's peak memory"
else
    fail "step 5's table rows: $rows"
fi
grep -q '^epoch 1/1:' "$tmp/out5" && ! grep -q '^epoch 2' "$tmp/out5" &&
    pass "step 5 stops after the first epoch, like the original" ||
    fail "step 5 should train one epoch"

# ---------------------------------------------------------------- test_profile
mpi 2 day1/test_profile --trace "$tmp/log/toy.json" > "$tmp/outtoy" 2>&1
check_trace "$tmp/log/toy.json" 2 forward_pass,loss+backward,optimizer_step,forward,backward,optimizer,allreduce,step toy
grep -q '^\[rank 1\] parameter checksum' "$tmp/outtoy" &&
    [ "$(sed -n 's/.*parameter checksum //p' "$tmp/outtoy" | sort -u | wc -l)" = 1 ] &&
    pass "test_profile's DDP ranks end equal" || fail "test_profile's ranks differ"

# ---------------------------------------------------------------- step 6: the buckets overlap backward
mpi 2 day1/6_mnist_ddp --epochs 1 --bucket_mb 0 --trace "$tmp/trace6.json" --plot '' > /dev/null 2>&1
check_trace "$tmp/trace6.json" 2 forward,backward,allreduce,"allreduce wait",optimizer overlap

# ---------------------------------------------------------------- with and without NVTX
if thorough; then  # make test-all
cuda=${CUDA_HOME:-/usr/local/cuda}
flags="-std=c11 -D_GNU_SOURCE -O1 -Icommon $(pkg-config --cflags hdf5 libpng 2> /dev/null)"
libs="-lopenblas $(pkg-config --libs hdf5 libpng zlib 2> /dev/null) -lpthread -lm"
build() {  # NAME EXTRA-FLAGS
    mpicc $flags $2 common/*/*.c day1/5_mnist_manual_ddp_profile.c -o "$tmp/$1" $libs $3 > "$tmp/$1.log" 2>&1
}
if build step5_plain "" ""; then
    mpi 2 "$tmp/step5_plain" --plot '' --trace "$tmp/plain.json" > /dev/null 2>&1
    check_trace "$tmp/plain.json" 2 step,forward,backward,allreduce step5 | sed 's/^\(PASS\|FAIL\) profile: /\1 profile: without NVTX: /'
    nm "$tmp/step5_plain" | grep -qi nvtx && fail "the build without NVTX has NVTX symbols" ||
        pass "the build without NVTX compiles the ranges to nothing (no NVTX symbols)"
else
    fail "build without NVTX: $(tail -3 "$tmp/step5_plain.log")"
fi
if [ -f "$cuda/include/nvtx3/nvToolsExt.h" ]; then
    if build step5_nvtx "-DHAVE_NVTX -isystem $cuda/include" "-ldl"; then
        mpi 2 "$tmp/step5_nvtx" --plot '' --trace "$tmp/nvtx.json" > /dev/null 2>&1
        check_trace "$tmp/nvtx.json" 2 step,forward,backward,allreduce step5 | sed 's/^\(PASS\|FAIL\) profile: /\1 profile: with NVTX: /'
        nm "$tmp/step5_nvtx" | grep -qi nvtx && pass "the NVTX build calls NVTX3 (its symbols are in the binary)" ||
            fail "the NVTX build has no NVTX symbols"
    else
        fail "build with NVTX: $(tail -3 "$tmp/step5_nvtx.log")"
    fi
else
    skip "the NVTX build (no $cuda/include/nvtx3: set CUDA_HOME)"
fi
fi  # thorough

# ---------------------------------------------------------------- nsys
if command -v nsys > /dev/null; then
    NSYS_OUT="$tmp/reports" mpi 2 profiling/nsys.sh day1/test_profile --trace '' > "$tmp/nsys.out" 2>&1
    ls "$tmp"/reports/test_profile.rank0.nsys-rep "$tmp"/reports/test_profile.rank1.nsys-rep > /dev/null 2>&1 &&
        pass "profiling/nsys.sh writes one report per rank" || fail "nsys.sh: $(tail -3 "$tmp/nsys.out")"
else
    out=$(profiling/nsys.sh day1/test_profile 2>&1); status=$?
    [ $status -ne 0 ] && echo "$out" | grep -q "nsys not found on PATH" &&
        pass "without nsys, profiling/nsys.sh says so (exit $status): ${out:0:60}..." ||
        fail "nsys.sh without nsys: exit $status: $out"
fi
