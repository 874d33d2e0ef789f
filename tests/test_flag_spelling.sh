#!/usr/bin/env bash
# Every flag of every program takes the --name=value spelling (torchrun's and the
# DDP tutorials': --total_epochs=10), as well as --name value.
#
# For each program, its --help lists its flags. All of them are given at once as
# --name=DEFAULT (a switch as --name) before a --help, which exits 0 only if
# every flag before it parsed; then one numeric flag as --name=x, which must be a
# usage error naming that flag (so the value after '=' is read, not dropped).
# Hyphens and underscores in a name are interchangeable (--batch-size is
# --batch_size, as torchrun takes both): all the flags again with every '_' of
# their names a '-' and every '-' a '_', before a --help, which must exit 0 and
# print the same help (the table's own spelling, the same values) as before.
# tests/unit/test_args.c checks the parser itself, value by value.
# One PASS/FAIL line per program (tests/run.sh counts them).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite flags
scratch
RUN_TIMEOUT=30  # --help and a bad flag return before any work

found=0
for source in day1/*.c day2/*.c day3/*.c day5/*.c; do
    program=${source%.c}
    [ -x "$program" ] || continue  # (step 1 is built only with the GPU code)
    found=$((found + 1))
    if ! run "$program" --help > "$tmp/help" 2> "$tmp/err"; then
        fail "$program --help exits non-zero: $(head -2 "$tmp/err")"
        continue
    fi
    # "  --name META     help text (default: X)": the flag and its metavar fill
    # the first 26 columns; the default closes the line.
    flags=() numeric=""
    # (bash's own expansions, not a sed per line: some 1500 processes fewer)
    while IFS= read -r line; do
        left=${line:2:26}
        left=${left%"${left##*[! ]}"}
        name=${left%% *}
        [ "$name" = --help ] && continue
        default=""
        [[ $line =~ \(default:\ (.*)\)$ ]] && default=${BASH_REMATCH[1]}
        if [ "$left" = "$name" ]; then
            flags+=("$name")  # a switch takes no value
        else
            case $default in
                none) flags+=("$name=x") ;;
                "''") flags+=("$name=") ;;
                *) flags+=("$name=$default") ;;
            esac
            [[ $default =~ ^-?[0-9.e+-]+$ ]] && numeric=$name
        fi
    done < <(grep '^  --' "$tmp/help")
    if [ ${#flags[@]} -eq 0 ]; then
        pass "$program takes no flags ($(sed -n 2p "$tmp/help" | sed 's/^ *//'))"
        continue
    fi
    run "$program" "${flags[@]}" --help > "$tmp/out" 2>&1
    status=$?
    if [ $status != 0 ] || ! grep -q '^usage:' "$tmp/out"; then
        fail "$program ${flags[*]} --help: exit $status: $(grep -v '^ ' "$tmp/out" | head -2)"
        continue
    fi
    verdict="$program takes all ${#flags[@]} of its flags as --name=value (${flags[*]})"
    cp "$tmp/out" "$tmp/help_after_flags"  # (its defaults are the values just given)
    swapped=() renamed=0
    for flag in "${flags[@]}"; do
        name=${flag%%=*} value=${flag#"$name"}
        other=${name#--} other=${other//_/$'\1'} other=${other//-/_} other=--${other//$'\1'/-}
        [ "$other" != "$name" ] && renamed=$((renamed + 1))
        swapped+=("$other$value")
    done
    if [ $renamed -gt 0 ]; then
        run "$program" "${swapped[@]}" --help > "$tmp/out" 2>&1
        status=$?
        if [ $status != 0 ] || ! cmp -s "$tmp/out" "$tmp/help_after_flags"; then
            fail "$program ${swapped[*]} --help: expected exit 0 and the same --help (got exit $status: $(grep -v '^ ' "$tmp/out" | head -2))"
            continue
        fi
        verdict="$verdict; and with '-' and '_' swapped in $renamed of their names (${swapped[*]})"
    fi
    if [ -n "$numeric" ]; then
        run "$program" "$numeric=x" > "$tmp/out" 2>&1
        status=$?
        if [ $status != 2 ] || ! grep -q "^error: $numeric expects .*, got 'x'" "$tmp/out"; then
            fail "$program $numeric=x: expected a usage error naming $numeric, exit 2 (got exit $status: $(head -1 "$tmp/out"))"
            continue
        fi
        verdict="$verdict; $numeric=x is a usage error"
    fi
    pass "$verdict"
done
[ $found -gt 0 ] || fail "no program is built (make)"
