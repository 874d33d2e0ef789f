#!/usr/bin/env bash
# tests/lib.sh's own guarantees, each shown on a small script of its kind that must end as stated:
# a check that fails is a FAIL line and a failing exit status (exit_status); a helper the script
# calls before defining it is a FAIL line naming it, even from inside a redirection, where bash
# alone would print "command not found" and the check would silently not run; a tool this machine
# lacks, run to probe for it, stays bash's exit status 127 and no FAIL line.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite harness
scratch

# planted BODY: a script sourcing tests/lib.sh with BODY after it, run; its output in $tmp/out.
planted() {
    printf 'set -u\nsource tests/lib.sh\nsuite planted\n%s\n' "$1" > "$tmp/planted.sh"
    bash "$tmp/planted.sh" > "$tmp/out" 2> "$tmp/err"
}

planted 'expect "a check that fails" false
expect "a check that passes" true
exit_status'
status=$?
expect "a failing check is a FAIL line and the script's exit status 1 (exit $status): $(grep -c '^FAIL planted: a check that fails$' "$tmp/out") FAIL, $(grep -c '^PASS ' "$tmp/out") PASS" \
    test $status -eq 1 -a "$(grep -c '^FAIL planted: a check that fails$' "$tmp/out")" -eq 1 -a "$(grep -c '^PASS ' "$tmp/out")" -eq 1

planted 'result=$(count_rows 2> /dev/null) > /dev/null
count_rows() { echo 3; }
expect "count_rows gives 3" test "$(count_rows)" = 3
exit_status'
status=$?
expect "a helper called before its definition, in a command substitution sent to /dev/null, is a FAIL line naming it and exit status 1 (exit $status): $(grep -m1 '^FAIL' "$tmp/out")" \
    eval '[ $status -eq 1 ] && grep -q "^FAIL planted: count_rows is called before .*planted.sh defines it" "$tmp/out"'
# The same script run from another folder, by a relative path (its `cd` then leaves $0 behind).
sed -i '1a cd "$(dirname "$0")/../.."' "$tmp/planted.sh"
mkdir -p "$tmp/a/b" && mv "$tmp/planted.sh" "$tmp/a/b/" && ln -s "$PWD/tests" "$tmp/tests"
(cd "$tmp/a/b" && bash planted.sh) > "$tmp/out" 2> "$tmp/err"
expect "... and run by a relative path from its own folder: $(grep -m1 '^FAIL' "$tmp/out")" \
    grep -q '^FAIL planted: count_rows is called before' "$tmp/out"

planted 'no_such_tool_for_the_harness --version > /dev/null 2>&1
echo "probe status $?"'
expect "a missing tool, run to probe for it, stays exit status 127 and no FAIL ($(grep -o 'probe status [0-9]*' "$tmp/out"))" \
    eval 'grep -q "^probe status 127$" "$tmp/out" && ! grep -q "^FAIL" "$tmp/out"'
exit_status
