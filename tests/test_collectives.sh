#!/usr/bin/env bash
# Step 12, the collectives, on CPU ranks. Prints one PASS/FAIL line per check.
#
# - The demo at 1 to 5 ranks: every rank's before and after values of every
#   collective, in rank order, against the definitions computed here (awk),
#   independently of the program's own verification.
# - --count at 1 to 5 ranks: every collective verified on every rank (a count
#   that is no multiple of the world size included), the table's sizes and
#   bus-bandwidth factors.
# - A wrong element, planted by the test-only hook in each collective's
#   result, fails the run: exit 1, no hang, one line naming the collective,
#   the rank and the element.
# - Bad flags: one line and exit 2.
# (The GPU path, --device cuda, is tested in tests/test_gpu.sh.)
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite collectives
program=day3/12_collectives
needs_built $program
scratch
# Our program's lines, without the notices mpirun frames in lines of dashes.
ours() { awk '/^-----+$/ { inside = !inside; next } !inside && NF' "$1"; }
unset COLLECTIVES_TEST_WRONG_ELEMENT

# ---------------------------------------------------------------- the demo
# What every rank must print: rank r starts with 10 r + i at position i; the
# buffers hold W values, one slice of one value per rank. Lines
# "collective|rank|before|after", "-" for nothing.
expected_demo() {
    awk -v W="$1" 'function v(r, i) { return 10 * r + i % 10 }
    function sum(i,   s, t) { t = 0; for (s = 0; s < W; s++) t += v(s, i); return t }
    function row(name, r, before, after) { printf "%s|%d|%s|%s\n", name, r, before, after }
    function mine(r,   i, t) { t = v(r, 0); for (i = 1; i < W; i++) t = t " " v(r, i); return t }
    BEGIN {
        for (r = 0; r < W; r++) {
            sums = sum(0); diagonal = v(0, 0); column = v(0, r)
            for (i = 1; i < W; i++) { sums = sums " " sum(i); diagonal = diagonal " " v(i, i); column = column " " v(i, r) }
            row("broadcast", r, mine(r), mine(0))
            row("reduce", r, mine(r), r == 0 ? sums : "-")
            row("allreduce", r, mine(r), sums)
            row("gather", r, v(r, r), r == 0 ? diagonal : "-")
            row("allgather", r, v(r, r), diagonal)
            row("scatter", r, r == 0 ? mine(0) : "-", v(0, r))
            row("reduce-scatter", r, mine(r), sum(r))
            row("all-to-all", r, mine(r), column)
        }
    }' | sort
}
# The same lines from the program's output, in the order it printed them.
printed_demo() {
    awk '/^[a-z-]+: / { name = substr($1, 1, length($1) - 1); next }
         /^  \[rank [0-9]+\] before / {
             line = $0; sub(/^  \[rank /, "", line); r = line + 0
             sub(/^[0-9]+\] before +/, "", line); split(line, halves, / +after +/)
             before = halves[1]; after = halves[2]; gsub(/ +/, " ", before); gsub(/ +/, " ", after)
             sub(/ $/, "", before); printf "%s|%d|%s|%s\n", name, r, before, after }' "$1"
}
for np in 1 2 3 4 5; do
    mpi $np $program > "$tmp/demo$np" 2>&1
    status=$?
    printed_demo "$tmp/demo$np" > "$tmp/printed$np"
    # Rank order: within each collective, ranks 0..W-1 one after the other.
    in_order=$(awk -F'|' -v W=$np '{ if ($2 != n % W) bad = 1; n++ } END { print (n == 8 * W && !bad) ? "yes" : "no" }' "$tmp/printed$np")
    expected_demo $np > "$tmp/expected$np"
    if [ $status -eq 0 ] && [ "$in_order" = yes ] && sort "$tmp/printed$np" | cmp -s - "$tmp/expected$np" &&
        [ "$(tail -1 "$tmp/demo$np")" = "every result verified on every rank" ]; then
        pass "demo at $np rank$([ $np = 1 ] || echo s): all 8 collectives, every rank's before and after as defined, in rank order, verified"
    else
        fail "demo at $np ranks (exit $status, rank order: $in_order): $(sort "$tmp/printed$np" | diff - "$tmp/expected$np" | head -4 | tr '\n' ' ')$(tail -1 "$tmp/demo$np")"
    fi
done
# Each collective says what training uses it for, and the two halves of an allreduce are named.
lines=$(grep -c '^  in training: ' "$tmp/demo4")
grep -q 'reduce-scatter + allgather = allreduce' "$tmp/demo4" && grep -q 'mixture of experts' "$tmp/demo4" &&
    [ "$lines" -eq 8 ] && pass "demo: an 'in training' line for each of the 8 collectives ($lines)" ||
    fail "demo: 'in training' lines: $lines of 8"

# ---------------------------------------------------------------- --count: verified, and the table
# factor: nccl-tests' busbw / algbw for W ranks.
count=100003
for np in 1 2 3 4 5; do
    mpi $np $program --count $count --iters 2 > "$tmp/count$np" 2>&1
    status=$?
    verdict=$(awk -v W=$np -v count=$count '
        BEGIN { f["broadcast"] = 1; f["reduce"] = 1; f["allreduce"] = 2 * (W - 1) / W
                split("gather allgather scatter reduce-scatter all-to-all", sharded, " ")
                for (k in sharded) f[sharded[k]] = (W - 1) / W
                size = int(count / W) * W * 4 }
        $1 in f && NF == 7 {
            rows++
            if ($2 != size) problem = problem " " $1 ": size " $2 " (expected " size ")"
            if ($6 - f[$1] > 0.0005 || f[$1] - $6 > 0.0005) problem = problem " " $1 ": factor " $6
            d = $5 - $4 * $6; if (d > 0.002 + 0.001 * $5 || -d > 0.002 + 0.001 * $5) problem = problem " " $1 ": busbw " $5
            if ($3 <= 0) problem = problem " " $1 ": time " $3
            if ($7 != 0) problem = problem " " $1 ": " $7 " wrong"
        }
        END { if (rows != 8) problem = problem " " rows " rows"; print problem == "" ? "ok" : problem }' "$tmp/count$np")
    if [ $status -eq 0 ] && [ "$verdict" = ok ] &&
        [ "$(tail -1 "$tmp/count$np")" = "every element of every collective verified on every rank" ]; then
        pass "--count $count at $np rank$([ $np = 1 ] || echo s): 8 collectives verified, sizes and busbw factors as nccl-tests'"
    else
        fail "--count $count at $np ranks (exit $status):$verdict; $(tail -1 "$tmp/count$np")"
    fi
done

# ---------------------------------------------------------------- a wrong element is caught
# The test-only hook changes one element of one rank's result before it is
# verified: every collective at 3 ranks (--count 999: slices of 333), and the demo.
planted() {  # np, collective, rank, index, extra flags...
    local np=$1 name=$2 rank=$3 index=$4; shift 4
    # stdout and stderr apart: mpirun buffers its stdout, so in one file our
    # stderr line may land inside a line of the table.
    COLLECTIVES_TEST_WRONG_ELEMENT=$name:$rank:$index mpi $np $program "$@" > "$tmp/planted" 2> "$tmp/planted_err"
    local status=$?
    local line named others table
    line=$(ours "$tmp/planted_err" | grep -E "^$name: rank [0-9]+ holds")
    named=$(ours "$tmp/planted_err" | grep -cE "^$name: rank $rank holds [0-9.e+-]+ at element $index where [0-9.e+-]+ belongs \(1 wrong element over all ranks\)$")
    others=$(ours "$tmp/planted_err" | grep -cE '^[a-z-]+: rank [0-9]+ holds ')
    # The table, if any, shows the one wrong element in that row alone.
    table=$(awk -v name=$name 'NF == 7 && $1 ~ /^[a-z-]+$/ && $7 ~ /^[0-9]+$/ { if (($1 == name) != ($7 == 1) || $7 > 1) bad = 1 } END { print bad ? "wrong" : "ok" }' "$tmp/planted")
    if [ $status -eq 1 ] && [ "$named" -eq 1 ] && [ "$others" -eq 1 ] && [ "$table" = ok ] &&
        grep -q '^FAILED: wrong' "$tmp/planted"; then
        pass "a wrong element planted in $name's result (rank $rank, element $index, $np ranks${1:+, $*}) fails the run: $line"
    else
        fail "planted $name:$rank:$index at $np ranks ${*}: exit $status (want 1; 124 is a hang), $named naming line(s), $others in all, table $table: $(ours "$tmp/planted_err" | head -3 | tr '\n' ' ')"
    fi
}
planted 3 broadcast 2 998 --count 999 --iters 1
planted 3 reduce 0 0 --count 999 --iters 1
planted 3 allreduce 1 500 --count 999 --iters 1
planted 3 gather 0 998 --count 999 --iters 1
planted 3 allgather 2 17 --count 999 --iters 1
planted 3 scatter 1 332 --count 999 --iters 1
planted 3 reduce-scatter 2 0 --count 999 --iters 1
planted 3 all-to-all 1 666 --count 999 --iters 1
planted 4 all-to-all 3 2
planted 5 reduce-scatter 4 0

# ---------------------------------------------------------------- bad flags
bad_flag() {  # status, pattern, np, arguments...
    local want=$1 pattern=$2 np=$3; shift 3
    mpi $np $program "$@" > "$tmp/bad" 2>&1
    local status=$?
    local lines
    lines=$(ours "$tmp/bad" | wc -l)
    if [ $status -eq "$want" ] && [ "$lines" -eq 1 ] && ours "$tmp/bad" | grep -qE "$pattern"; then
        pass "exit $want and one line for '$*' at $np ranks: $(ours "$tmp/bad")"
    else
        fail "'$*' at $np ranks: exit $status (want $want), $lines lines: $(ours "$tmp/bad" | head -3 | tr '\n' ' ')"
    fi
}
bad_flag 2 "^error: --count expects an integer from 0 to" 2 --count -1
bad_flag 2 "^error: --count 3: fewer floats than ranks \(4\)" 4 --count 3
bad_flag 2 "^error: --iters expects an integer from 1 to" 2 --count 100 --iters 0
bad_flag 2 "^error: --iters times the collectives on --count N > 0 floats \(got --count 0: the demo\)" 2 --iters 5
bad_flag 2 "^error: --device expects one of cpu\|cuda, got 'gpu'" 3 --device gpu
bad_flag 2 "^error: unknown flag '--bogus'" 4 --bogus
bad_flag 2 "^error: unexpected argument 'extra'" 2 extra
bad_flag 2 "^error: --count expects a value" 2 --count
export COLLECTIVES_TEST_WRONG_ELEMENT=allreduce:5:0
bad_flag 2 "^error: COLLECTIVES_TEST_WRONG_ELEMENT=allreduce:5:0: rank 5 has no element 0" 2
export COLLECTIVES_TEST_WRONG_ELEMENT=sum:0:0
bad_flag 2 "^error: COLLECTIVES_TEST_WRONG_ELEMENT=sum:0:0: no collective 'sum'" 2
unset COLLECTIVES_TEST_WRONG_ELEMENT
exit_status
