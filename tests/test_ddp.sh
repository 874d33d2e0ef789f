#!/usr/bin/env bash
# Steps 6, 7 and 8 and the DDP library, end to end, on real MNIST (and
# --accum_steps in steps 10 and 11 too).
# Prints one PASS/FAIL line per check (tests/run.sh counts them).
# make test (TEST_LEVEL=quick) runs steps 6 and 4 at 2 ranks and --accum_steps in step 6; make
# test-all (TEST_LEVEL=all) also at 4 ranks, and --accum_steps in steps 7, 8, 10 and 11.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite ddp
scratch

# ---------------------------------------------------------------- 6 == 4
# Step 4 scales lr by W, step 6 does not: give both the same effective lr.
for np in 2 $(if_thorough 4); do
    mpi $np day1/4_mnist_manual_ddp --epochs 2 --lr "$(awk "BEGIN { print 0.001 / $np }")" --save "$tmp/w4.h5" --plot '' > /dev/null 2>&1
    mpi $np day1/6_mnist_ddp --epochs 2 --save "$tmp/w6_$np.h5" --plot '' > "$tmp/out6" 2>&1
    same_weights "step 6 (DDP library) ends where step 4 (manual allreduce) does, on $np ranks" "$tmp/w6_$np.h5" "$tmp/w4.h5" 1e-6
done
if grep -qE '^DDP: gradient allreduce [0-9.]+ ms per step in 1 bucket, [0-9.]+ ms \([0-9]+%\) of it hidden behind backward' "$tmp/out6"; then
    pass "step 6 reports the allreduce time and how much of it backward hid: $(grep '^DDP:' "$tmp/out6")"
else
    fail "step 6 prints no overlap report: $(tail -2 "$tmp/out6")"
fi
grep -qE "^World Size: $np\. Training completed in [0-9.]+ seconds\." "$tmp/out6" &&
    pass "step 6 prints 'World Size: $np. Training completed in T seconds.' like the original" ||
    fail "step 6's final line: $(grep World "$tmp/out6")"

# ---------------------------------------------------------------- bucket sizes
# One bucket, one per tensor, and a cap that splits the model in between.
for np in 2 $(if_thorough 4); do
    for mb in 0 0.003; do
        mpi $np day1/6_mnist_ddp --epochs 2 --bucket_mb $mb --save "$tmp/w6_$mb.h5" --plot '' > "$tmp/out_$mb" 2>&1
        buckets=$(sed -n 's/.*weights in \([0-9]*\) buckets\{0,1\}.*/\1/p' "$tmp/out_$mb")
        same_weights "step 6 on $np ranks: --bucket_mb $mb ($buckets buckets) == --bucket_mb 25 (1 bucket)" "$tmp/w6_$mb.h5" "$tmp/w6_$np.h5" 1e-6
    done
done

# ---------------------------------------------------------------- no_sync / accumulation
mpi 2 day1/6_mnist_ddp --no-shuffle --epochs 2 --batch_size 1600 --accum_steps 4 --losses "$tmp/accum.csv" --save "$tmp/accum.h5" --plot '' > /dev/null 2>&1
mpi 2 day1/6_mnist_ddp --no-shuffle --epochs 2 --batch_size 6400 --losses "$tmp/big.csv" --save "$tmp/big.h5" --plot '' > /dev/null 2>&1
verdict=$(same_losses "$tmp/accum.csv" "$tmp/big.csv" 1e-5)
if [ $? -eq 0 ]; then pass "--accum_steps 4 x batch 1600 == batch 6400 on 2 ranks: $verdict"; else fail "--accum_steps 4 x batch 1600 vs batch 6400: $verdict"; fi
same_weights "--accum_steps 4 x batch 1600 ends with the weights of batch 6400" "$tmp/accum.h5" "$tmp/big.h5" 1e-5
# Every other step with --accum_steps (its loop is step 6's: tests/test_training_loops.sh), one epoch each.
steps_with_accum=(day1/7_mnist_ddp_timing day1/8_mnist_ddp_lr day2/10_mnist_ddp_multinode "day2/11_multinode_streaming --h5 $tmp/mnist.h5")
day2/create_mnist_h5 --out "$tmp/mnist.h5" > /dev/null 2>&1 || fail "create_mnist_h5 for step 11's --accum_steps check"
thorough || steps_with_accum=()  # make test-all
for step in "${steps_with_accum[@]}"; do
    name=${step%% *}
    mpi 2 $step --no-shuffle --epochs 1 --batch_size 1600 --accum_steps 4 --losses "$tmp/accum.csv" --save "$tmp/accum.h5" --plot '' > /dev/null 2>&1
    mpi 2 $step --no-shuffle --epochs 1 --batch_size 6400 --losses "$tmp/big.csv" --save "$tmp/big.h5" --plot '' > /dev/null 2>&1
    verdict=$(same_losses "$tmp/accum.csv" "$tmp/big.csv" 1e-5)
    if [ $? -eq 0 ]; then pass "$name --accum_steps 4 x batch 1600 == batch 6400 on 2 ranks: $verdict"; else fail "$name --accum_steps 4 x batch 1600 vs batch 6400: $verdict"; fi
    same_weights "$name --accum_steps 4 x batch 1600 ends with the weights of batch 6400" "$tmp/accum.h5" "$tmp/big.h5" 1e-5
    rm -f "$tmp"/accum.* "$tmp"/big.*
done

# ---------------------------------------------------------------- step 8: lr x W
day1/2_mnist_training --losses "$tmp/one.csv" --plot '' > /dev/null 2>&1
mpi 4 day1/8_mnist_ddp_lr --losses "$tmp/lr4.csv" --compare "$tmp/one.csv" --plot "$tmp/8.png" > "$tmp/out8" 2>&1
mpi 4 day1/6_mnist_ddp --losses "$tmp/nolr4.csv" --plot '' > /dev/null 2>&1
one=$(final_loss "$tmp/one.csv") scaled=$(final_loss "$tmp/lr4.csv") unscaled=$(final_loss "$tmp/nolr4.csv")
if awk "BEGIN { d = ($scaled - $one) / $one; exit !(d < 0.15 && d > -0.15) }"; then
    pass "step 8 on 4 ranks with lr x 4 ends at loss $scaled, within 15% of one process ($one); without scaling (step 6): $unscaled"
else
    fail "step 8 on 4 ranks with lr x 4 ends at $scaled, one process at $one (more than 15% apart)"
fi
awk "BEGIN { exit !($unscaled > 2 * $one) }" &&
    pass "without lr scaling 4 ranks learn less in 5 epochs: loss $unscaled vs $one (PyTorch: 1.33 vs 0.44)" ||
    fail "step 6 on 4 ranks without lr scaling ends at $unscaled, not clearly above one process ($one)"
# Both curves are in the image: the tab10 blue (DDP) and orange (--compare) lines.
colors=$(build/tools/png_colors "$tmp/8.png" 1f77b4 ff7f0e 2>&1)
blue=$(echo "$colors" | awk '$1 == "1f77b4" { print $2 }') orange=$(echo "$colors" | awk '$1 == "ff7f0e" { print $2 }')
if [ "${blue:-0}" -gt 300 ] && [ "${orange:-0}" -gt 300 ]; then
    pass "step 8's PNG holds both curves ($blue blue and $orange orange pixels)"
else
    fail "step 8's PNG: $colors"
fi
expect_usage() {
    mpi 2 day1/8_mnist_ddp_lr --epochs 1 --compare "$1" --plot "$tmp/x.png" > "$tmp/err" 2>&1
    local status=$?
    if [ $status -eq 2 ] && grep -q "$2" "$tmp/err"; then pass "step 8 --compare $3: $(grep -m1 error "$tmp/err")"
    else fail "step 8 --compare $3: exit $status: $(head -2 "$tmp/err")"; fi
}
expect_usage "$tmp/none.csv" "^error: --compare .*none.csv: cannot open" "with a missing file"
echo "not,a,log" > "$tmp/bad.csv"
expect_usage "$tmp/bad.csv" "^error: --compare .*expected the header step,epoch,loss" "with a file that is not a loss log"

# ---------------------------------------------------------------- step 7: the scaling table, by its script
# RANKS="1 2" REPEATS=2: four short runs, interleaved (1, 2, 1, 2), one table after the last.
# A table row: world size, runs, median s, min..max s, speed-up, its min..max, efficiency.
row7() { echo "^ +$1 +$2 +[0-9.]+ +[0-9.]+\.\.[0-9.]+ +$3x +[0-9.]+\.\.[0-9.]+x +$4%\$"; }
RANKS="1 2" REPEATS=2 RESULTS="$tmp/scaling.csv" RUN_TIMEOUT=240 run day1/7_scaling.sh --epochs 1 --chart "$tmp/7.png" > "$tmp/out7" 2>&1
if grep -qE "$(row7 1 2 '1\.00' 100)" "$tmp/out7" && grep -qE "$(row7 2 2 '[0-9.]+' '[0-9]+')" "$tmp/out7" &&
    grep -q '^speed-up: median time at 1 rank / median at W' "$tmp/out7" && [ -s "$tmp/7.png" ]; then
    pass "RANKS=\"1 2\" REPEATS=2 day1/7_scaling.sh: a table of 2 runs per world size (median, min..max, speed-up and its range), and the chart"
else
    fail "RANKS=\"1 2\" REPEATS=2 day1/7_scaling.sh: $(tail -6 "$tmp/out7")"
fi
order=$(grep '^==' "$tmp/out7" | tr '\n' '/')
csv_order=$(tail -n +2 "$tmp/scaling.csv" 2> /dev/null | cut -d, -f1 | tr '\n' ' ')
if [ "$order" = "== 1 rank(s), run 1/2/== 2 rank(s), run 1/2/== 1 rank(s), run 2/2/== 2 rank(s), run 2/2/" ] &&
    [ "$csv_order" = "1 2 1 2 " ] && [ "$(grep -c '^world size' "$tmp/out7")" = 1 ]; then
    pass "day1/7_scaling.sh interleaves the repeats (world sizes ${csv_order% }), one CSV row each, and prints the table once, after the last"
else
    fail "day1/7_scaling.sh runs: $order; CSV world sizes: $csv_order; $(grep -c '^world size' "$tmp/out7") tables"
fi
[ "$(grep -cE '^\[rank 1\] training loop: [0-9.]+ s' "$tmp/out7")" = 2 ] && pass "step 7 times the loop on every rank" ||
    fail "step 7 prints no per-rank time on rank 1 of each 2-rank run: $(grep -c 'training loop' "$tmp/out7") lines"

# ---------------------------------------------------------------- its knobs, refused before any run
for repeats in 0 -1 three 1.5; do
    RANKS=1 REPEATS=$repeats RESULTS="$tmp/refused.csv" RUN_TIMEOUT=60 run day1/7_scaling.sh --epochs 1 --chart '' > "$tmp/out7s" 2>&1
    status=$?
    if [ $status -eq 2 ] && [ "$(wc -l < "$tmp/out7s")" = 1 ] &&
        grep -q "^error: REPEATS=\"$repeats\": expected the runs per world size, a positive integer" "$tmp/out7s"; then
        pass "REPEATS=$repeats is refused before any run: $(head -1 "$tmp/out7s")"
    else
        fail "REPEATS=$repeats: exit $status: $(head -2 "$tmp/out7s")"
    fi
done
RANKS="1 two" day1/7_scaling.sh > "$tmp/out7s" 2>&1
status=$?
if [ $status -eq 2 ] && grep -q '^error: RANKS="1 two": expected world sizes' "$tmp/out7s" && ! grep -q '^==' "$tmp/out7s"; then
    pass "RANKS=\"1 two\" is refused before any run: $(head -1 "$tmp/out7s")"
else
    fail "RANKS=\"1 two\": exit $status: $(head -2 "$tmp/out7s")"
fi
