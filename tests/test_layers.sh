#!/usr/bin/env bash
# common/'s layers (DESIGN.md, "Layers of common/"): no file uses one above it,
# so the objects' symbol references form no cycle, and a program links only
# what it uses (build/libcommon.a): step 0, one allreduce, gets no device,
# tensor, profiler or GPU code.
# Prints one PASS/FAIL line per check (tests/run.sh counts them).
set -u
cd "$(dirname "$0")/.."
pass() { echo "PASS layers: $*"; }
fail() { echo "FAIL layers: $*"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Who defines what, then one "user provider" pair per object that uses
# another's symbol. tsort reports a loop if the pairs hold a cycle.
objects=(build/common/*/*.o)
for o in "${objects[@]}"; do
    nm --defined-only -g "$o" | awk -v f="$(basename "$o" .o)" 'NF == 3 { print $3, f }'
done | sort -u > "$tmp/defined"
for o in "${objects[@]}"; do
    user=$(basename "$o" .o)
    nm -u "$o" | awk '{ print $2 }' | sort -u | join - "$tmp/defined" | awk -v u="$user" '$2 != u { print u, $2 }'
done | sort -u > "$tmp/uses"
if [ ! -s "$tmp/uses" ]; then
    fail "no references between common/'s objects found (is build/common built?)"
elif tsort "$tmp/uses" > /dev/null 2> "$tmp/loop"; then
    pass "common/'s $(ls build/common/*/*.o | wc -l) objects use each other without a cycle ($(wc -l < "$tmp/uses") uses)"
else
    fail "common/ has a dependency cycle: $(tr '\n' ' ' < "$tmp/loop")"
fi
# dist is the process group: MPI and check.h, nothing of ours above it.
above=$(awk '$1 == "dist" && $2 != "check" { print $2 }' "$tmp/uses" | tr '\n' ' ')
[ -z "$above" ] && pass "dist uses only check (MPI below it)" || fail "dist uses $above"

# Step 0 links against the archive and gets what it calls, nothing more.
symbols=$(nm day1/0_dist_allreduce)
linked=$(awk '{ print $2 }' "$tmp/defined" | sort -u | while read -r f; do
    first=$(awk -v f="$f" '$2 == f { print $1; exit }' "$tmp/defined")
    echo "$symbols" | grep -qw -- "$first" && echo "$f"
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
