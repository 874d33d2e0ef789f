#!/usr/bin/env bash
# common/'s layers (common/README.md draws them): common/ is in folders by family, each folder a
# floor, and no file uses one above it. Two readings of "uses":
# - the #include lines (tests/check_layers.py): none climbs a floor, none is bare, no circle;
#   and the checker is shown to fail on a copy of common/ with a climb, a circle, a bare include
#   and a stray file planted in it;
# - the objects' symbols (nm), which catch what includes cannot (a function declared by hand):
#   no cycle, no object calling into a floor above its own;
# and a program links only what it uses (build/libcommon.a): step 0, one allreduce, gets no
# device, tensor, profiler or GPU code.
# Prints one PASS/FAIL line per check (tests/run.sh counts them).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite layers
scratch

# ---- the includes (its FAIL lines are its own: counted here as one)
python3 tests/check_layers.py || failures=$((failures + 1))

# The checker fails where it should: each fault planted in a copy of common/ gets its FAIL line.
planted() {  # planted WHAT EXPECTED-TEXT: run the checker on $tmp/plant, expect a FAIL holding the text
    local out
    out=$(python3 tests/check_layers.py "$tmp/plant")
    if [ $? -ne 0 ] && grep -F "FAIL layers: " <<< "$out" | grep -qF -- "$2"; then
        pass "the checker catches $1: $(grep -F -- "$2" <<< "$out" | head -1 | cut -c14-220)"
    else
        fail "the checker missed $1 (expected a FAIL with '$2'); it said: $(tr '\n' ' ' <<< "$out" | cut -c1-400)"
    fi
}
fresh_copy() { rm -rf "$tmp/plant"; mkdir "$tmp/plant"; cp -r common "$tmp/plant/"; }
fresh_copy
echo '#include "models/nn.h"' >> "$tmp/plant/common/base/rng.c"
planted "a climb" 'common/base/rng.c (floor 1, base) includes models/nn.h (floor 6, models)'
fresh_copy
echo '#include "runtime/threads.h"' >> "$tmp/plant/common/runtime/dist.h"
planted "a circle within a floor" 'a circle of includes: common/runtime/dist.h includes runtime/threads.h, then common/runtime/threads.c includes runtime/dist.h'
fresh_copy
echo '#include "dist.h"' >> "$tmp/plant/common/runtime/threads.c"
planted "an include without its folder" 'common/runtime/threads.c includes "dist.h"'
fresh_copy
touch "$tmp/plant/common/stray.c"
planted "a file outside the folders" 'files outside the floors'"'"' folders: common/stray.c'

# ---- the objects: who defines what, then one "user provider" pair per object that uses
# another's symbol. tsort reports a loop if the pairs hold a cycle.
# (The objects of today's sources only: one left in build/ by a file since moved or deleted is not
# in the archive, and does not count.)
objects=()
for o in build/common/*/*.o; do
    source=common/${o#build/common/}
    [ -f "${source%.o}.c" ] || [ -f "${source%.o}.cu" ] && objects+=("$o")
done
name() { local o=${1#build/common/}; echo "${o%.o}"; }  # build/common/runtime/dist.o -> runtime/dist
# (threads.c defines getenv in libc's place, to answer libgomp's GOMP_SPINCOUNT: a file that calls
# getenv uses libc, not threads, and is not counted as threads' user.)
for o in "${objects[@]}"; do
    nm --defined-only -g "$o" | awk -v f="$(name "$o")" 'NF == 3 && $3 != "getenv" { print $3, f }'
done | sort -u > "$tmp/defined"
for o in "${objects[@]}"; do
    user=$(name "$o")
    nm -u "$o" | awk '{ print $2 }' | sort -u | join - "$tmp/defined" | awk -v u="$user" '$2 != u { print u, $2 }'
done | sort -u > "$tmp/uses"
if [ ! -s "$tmp/uses" ]; then
    fail "no references between common/'s objects found (is build/common built?)"
elif tsort "$tmp/uses" > /dev/null 2> "$tmp/loop"; then
    pass "common/'s ${#objects[@]} objects use each other without a cycle ($(wc -l < "$tmp/uses") uses)"
else
    fail "common/ has a dependency cycle: $(tr '\n' ' ' < "$tmp/loop")"
fi
# No object calls into a floor above its own (the floors: check_layers.py's, bottom first).
climbs=$(python3 tests/check_layers.py --floors | awk 'NR == FNR { floor[$1] = NR; next }
    { split($1, u, "/"); split($2, p, "/") }
    floor[p[1]] > floor[u[1]] { printf "%s uses %s; ", $1, $2 }' - "$tmp/uses")
[ -z "$climbs" ] && pass "no object uses a symbol of a floor above its own" || fail "objects that climb a floor: $climbs"
# dist is the process group: MPI and check.h, nothing of ours above it.
above=$(awk '$1 == "runtime/dist" && $2 != "base/check" { print $2 }' "$tmp/uses" | tr '\n' ' ')
[ -z "$above" ] && pass "dist uses only check (MPI below it)" || fail "dist uses $above"

# Step 0 links against the archive and gets what it calls, nothing more.
symbols=$(nm day1/0_dist_allreduce)
linked=$(awk '{ print $2 }' "$tmp/defined" | sort -u | while read -r f; do
    first=$(awk -v f="$f" '$2 == f { print $1; exit }' "$tmp/defined")
    echo "$symbols" | grep -qw -- "$first" && echo "${f#*/}"
done | tr '\n' ' ')
case " $linked " in
    *" device "*|*" tensor "*|*" profile "*|*" collectives "*|*" kernels "*|*" nn "*)
        fail "step 0 links $linked" ;;
    *) if echo "$symbols" | grep -qE ' (cudaMalloc|ncclCommInitRank|cublasCreate)'; then
           fail "step 0 links GPU code"
       else
           pass "step 0 links only $linked($(stat -c %s day1/0_dist_allreduce) bytes)"
       fi ;;
esac
exit_status
