#!/usr/bin/env bash
# Step 15 (the MovieLens recommender), end to end on ml-latest-small: the three
# --embeddings modes take the same steps on 1, 2 and 4 ranks; sparse and
# sharded send 10x fewer bytes than dense; the RMSE target; --recommend;
# --save/--init; the PyTorch twin (tests/torch_recommender.py) within 1e-5 over
# 100 steps; the reader's byte ranges, CRLF, --synthetic; bad input.
# Prints one PASS/FAIL line per check (tests/run.sh counts them); SKIP without
# MovieLens (make movielens; CI copies it from MOVIELENS_MIRROR). make test
# (TEST_LEVEL=quick) leaves 4 ranks in every mode and the twin on 2 ranks to
# make test-all.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite recommender
DATA=${MOVIELENS_DATA:-data/movielens}
PROGRAM=day3/15_recommender_ddp
scratch
RUN_TIMEOUT=300  # its bound before tests/lib.sh: MovieLens epochs on up to 4 ranks
MPI_FLAGS="--bind-to none"  # mpirun would bind each rank to one core, whatever --threads asks
field() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p" "$2" | tail -1; }

if [ ! -f "$DATA/ratings.csv" ] || [ ! -f "$DATA/movies.csv" ]; then
    skip "no MovieLens in $DATA (make movielens, or MOVIELENS_MIRROR=DIR make movielens)"
    exit 0
fi

# ---------------------------------------------------------------- the same steps in every mode, on 1, 2 and 4 ranks
# One epoch (89 steps of a global batch of 1024): W ranks take 1024 / W each.
# Each row's gradient is summed in the batch's order and the ranks' partial
# sums in rank order (common/models/mf.h): sparse and sharded give the same bits at
# any W, dense MPI's rounding; across W only the partial sums differ.
for np in 1 2 4; do
    modes="dense sparse sharded"
    [ "$np" = 4 ] && ! thorough && modes=sharded
    for mode in $modes; do
        mpi "$np" $PROGRAM --data "$DATA" --epochs 1 --batch_size $((1024 / np)) --embeddings "$mode" --plot '' \
            --losses "$tmp/${np}_$mode.csv" > "$tmp/${np}_$mode.out" 2>&1 || fail "$np ranks, $mode: exit $?: $(grep -m1 '^\[rank\|error' "$tmp/${np}_$mode.out")"
    done
done
same_bits() { cmp -s "$1" "$2" && cmp -s "$1" "$3"; }
expect "on 1 rank the three modes take the same bits (89 steps)" same_bits "$tmp/1_dense.csv" "$tmp/1_sparse.csv" "$tmp/1_sharded.csv"
for np in 2 4; do
    for mode in dense sparse sharded; do
        [ -f "$tmp/${np}_$mode.csv" ] || continue
        verdict=$(same_losses "$tmp/1_dense.csv" "$tmp/${np}_$mode.csv" 1e-5)
        expect "$mode on $np ranks x $((1024 / np)) takes the steps of 1 rank x 1024: $verdict (<= 1e-5)" test $? -eq 0
    done
    if [ -f "$tmp/${np}_sparse.csv" ]; then
        expect "sparse and sharded take the same bits on $np ranks" cmp -s "$tmp/${np}_sparse.csv" "$tmp/${np}_sharded.csv"
    fi
done
# MPI_Allreduce adds two ranks' partial sums in one order or the other: the same bits.
expect "dense takes sparse's bits on 2 ranks" cmp -s "$tmp/2_dense.csv" "$tmp/2_sparse.csv"
rmse1=$(field 'Test RMSE' "$tmp/1_sparse.out") rmse2=$(field 'Test RMSE' "$tmp/2_sharded.out")
expect "the test RMSE after an epoch: $rmse2 on 2 ranks (sharded) == $rmse1 on 1" test -n "$rmse1" -a "$rmse1" = "$rmse2"

# ---------------------------------------------------------------- bytes and memory
dense=$(field 'embeddings:' "$tmp/2_dense.out") sparse=$(field 'embeddings:' "$tmp/2_sparse.out") sharded=$(field 'embeddings:' "$tmp/2_sharded.out")
expect "on 2 ranks, sparse sends ${sparse:-?} kB and sharded ${sharded:-?} kB per step per rank: at least 10x fewer than dense's ${dense:-?} kB" \
    awk -v d="${dense:-0}" -v s="${sparse:-1e9}" -v h="${sharded:-1e9}" 'BEGIN { exit !(d > 0 && s * 10 <= d && h * 10 <= d) }'
expect "on 1 rank, no communication is reported: $(grep '^sparse embeddings:' "$tmp/1_sparse.out")" \
    grep -q '^sparse embeddings: no communication (world size 1); embedding memory [0-9.]* MB per rank$' "$tmp/1_sparse.out"
memory() { sed -n 's/.*embedding memory \([0-9.]*\) MB per rank.*/\1/p' "$1"; }
expect "the embedding memory per rank: sharded on 2 ranks $(memory "$tmp/2_sharded.out") MB, under the replicated $(memory "$tmp/2_sparse.out") MB (dense, with its gradient tables, $(memory "$tmp/2_dense.out") MB)" \
    awk -v h="$(memory "$tmp/2_sharded.out")" -v s="$(memory "$tmp/2_sparse.out")" -v d="$(memory "$tmp/2_dense.out")" 'BEGIN { exit !(h > 0 && h < 0.6 * s && s < d) }'

# ---------------------------------------------------------------- each rank reads its byte range
size=$(stat -c %s "$DATA/ratings.csv")
ranges=$(grep -o 'read bytes [0-9]*\.\.[0-9]* of [^ ]* ([0-9]* ratings)' "$tmp/4_sharded.out" | sort -t' ' -k3 -n)
covered=$(echo "$ranges" | awk -v size="$size" '{ split($3, r, "\\.\\."); if (r[1] != at) bad = 1; at = r[2]; n += substr($6, 2) }
    END { print (NR == 4 && !bad && at == size) ? n : "no" }')
lines=$(($(wc -l < "$DATA/ratings.csv") - 1))
expect "on 4 ranks each reads a quarter of ratings.csv, the byte ranges cover its $size bytes, the ratings add up to its $lines rows (${covered})" \
    test "$covered" = "$lines"

# ---------------------------------------------------------------- accuracy: the default flags (20 epochs)
$PROGRAM --data "$DATA" --plot "$tmp/loss.png" --recommend 1 > "$tmp/default.out" 2>&1
rmse=$(field 'Test RMSE' "$tmp/default.out")
mean=$(sed -n 's/.*global mean RMSE \([0-9.]*\);.*/\1/p' "$tmp/default.out") biases=$(sed -n 's/.*biases RMSE \([0-9.]*\)$/\1/p' "$tmp/default.out")
expect "the default flags reach test RMSE ${rmse:-?} <= 0.86, beside the baselines: global mean ${mean:-?}, biases alone ${biases:-?}" \
    awk -v r="${rmse:-9}" -v m="${mean:-0}" -v b="${biases:-0}" 'BEGIN { exit !(r <= 0.86 && r < b && b < m) }'
expect "20 epoch lines, each with its train loss and test RMSE, and the loss curve PNG" \
    test "$(grep -cE '^epoch +[0-9]+/20: train loss [0-9.]+, test RMSE [0-9.]+, [0-9.]+ s$' "$tmp/default.out")" -eq 20 -a -s "$tmp/loss.png"
# --recommend 1: ten movies from movies.csv that user 1 never rated, best first.
python3 - "$DATA" "$tmp/default.out" > "$tmp/recommend.check" << 'PY'
import csv, re, sys
data, out = sys.argv[1:3]
title = {int(r["movieId"]): r["title"] for r in csv.DictReader(open(data + "/movies.csv", newline=""))}
seen = {int(r["movieId"]) for r in csv.DictReader(open(data + "/ratings.csv", newline="")) if r["userId"] == "1"}
rows = [re.match(r"^ +(\d+)\. ([0-9.]+)  (.*)$", l) for l in open(out) if re.match(r"^ +\d+\. ", l)]
titles_seen = {title[m] for m in seen}
scores = [float(r.group(2)) for r in rows]
ok = (len(rows) == 10 and all(r.group(3) in title.values() and r.group(3) not in titles_seen for r in rows)
      and scores == sorted(scores, reverse=True))
print("ok" if ok else "bad", len(rows), len(seen))
PY
expect "--recommend 1: $(cut -d' ' -f2 "$tmp/recommend.check") titles of movies.csv, none of the $(cut -d' ' -f3 "$tmp/recommend.check") that user 1 rated, best first: $(grep -m1 '^ *1\. ' "$tmp/default.out" | sed 's/^ *//')" \
    grep -q '^ok' "$tmp/recommend.check"

# ---------------------------------------------------------------- --save, --init, and the recommendation on 2 ranks
mpi 2 $PROGRAM --data "$DATA" --epochs 2 --batch_size 512 --embeddings sharded --save "$tmp/sharded.h5" --recommend 1 --plot '' > "$tmp/s2.out" 2>&1
mpi 2 $PROGRAM --data "$DATA" --epochs 2 --batch_size 512 --embeddings sparse --recommend 1 --plot '' > "$tmp/p2.out" 2>&1
$PROGRAM --data "$DATA" --init "$tmp/sharded.h5" --max_steps 0 --plot '' > "$tmp/init.out" 2>&1
expect "--save from 2 sharded ranks (the tables gathered), --init on 1 rank: test RMSE $(field 'Test RMSE' "$tmp/init.out") == $(field 'Test RMSE' "$tmp/s2.out")" \
    test -n "$(field 'Test RMSE' "$tmp/s2.out")" -a "$(field 'Test RMSE' "$tmp/init.out")" = "$(field 'Test RMSE' "$tmp/s2.out")"
expect "--recommend on 2 ranks: sharded (rows gathered from their owners) lists sparse's ten movies" \
    test "$(grep -c '^ *[0-9]*\. ' "$tmp/s2.out")" -eq 10 -a "$(grep '^ *[0-9]*\. ' "$tmp/s2.out")" = "$(grep '^ *[0-9]*\. ' "$tmp/p2.out")"

# ---------------------------------------------------------------- PyTorch: nn.Embedding(sparse=True), SparseAdam
if "$PYTHON" -c 'import torch, h5py, numpy' 2> /dev/null; then
    compare() {  # OURS.csv TORCH.json WHAT
        "$PYTHON" - "$@" << 'PY'
import csv, json, sys
ours_csv, torch_json, what = sys.argv[1:4]
ours = [float(r["loss"]) for r in csv.DictReader(open(ours_csv))]
theirs = json.loads(open(torch_json).read().strip().splitlines()[-1])["losses"]
worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) if ours else float("inf")
ok = len(ours) == len(theirs) == 100 and worst <= 1e-5
print(f"{'PASS' if ok else 'FAIL'} recommender: {what}: {len(ours)} vs {len(theirs)} steps, worst relative loss difference {worst:.1e} (<= 1e-5)")
PY
    }
    $PROGRAM --data "$DATA" --max_steps 0 --seed 7 --save "$tmp/init.h5" --plot '' > /dev/null 2>&1
    "$PYTHON" tests/torch_recommender.py "$DATA" --init "$tmp/init.h5" --seed 7 --max_steps 100 --threads 1 > "$tmp/torch.json" 2> "$tmp/torch.err" ||
        fail "the PyTorch twin: $(tail -1 "$tmp/torch.err")"
    $PROGRAM --data "$DATA" --init "$tmp/init.h5" --seed 7 --max_steps 100 --losses "$tmp/c1.csv" --plot '' > /dev/null 2>&1
    compare "$tmp/c1.csv" "$tmp/torch.json" "1 rank (sparse) vs the PyTorch twin from the same --init, 100 steps of 1024"
    for np in $(if_thorough 2 4); do
        for mode in dense sharded; do
            mpi "$np" $PROGRAM --data "$DATA" --init "$tmp/init.h5" --seed 7 --max_steps 100 --batch_size $((1024 / np)) \
                --embeddings $mode --losses "$tmp/c$np$mode.csv" --plot '' > /dev/null 2>&1
            compare "$tmp/c$np$mode.csv" "$tmp/torch.json" "$mode on $np ranks x $((1024 / np)) vs the PyTorch twin, 100 steps"
        done
    done
else
    skip "PyTorch twin (python3-torch, python3-h5py not installed: ./setup.sh --with-reference)"
fi

# ---------------------------------------------------------------- the reader: CRLF, quoted titles, --synthetic
mkdir -p "$tmp/crlf"
sed 's/$/\r/' "$DATA/ratings.csv" > "$tmp/crlf/ratings.csv"
sed 's/$/\r/' "$DATA/movies.csv" > "$tmp/crlf/movies.csv"
mpi 2 $PROGRAM --data "$tmp/crlf" --epochs 2 --batch_size 512 --embeddings sparse --recommend 1 --plot '' > "$tmp/crlf.out" 2>&1
expect "CRLF line endings (ratings.csv and movies.csv): the same run and titles as LF" \
    test "$(grep -v 'read bytes\|seconds\|s$' "$tmp/crlf.out" | grep -v 'sent per step')" = "$(grep -v 'read bytes\|seconds\|s$' "$tmp/p2.out" | grep -v 'sent per step')"
mpi 2 $PROGRAM --synthetic 30000 --data "$tmp/synthetic" > "$tmp/synthetic.out" 2>&1
cp "$tmp/synthetic/ratings.csv" "$tmp/synthetic.first"
thorough && $PROGRAM --synthetic 30000 --data "$tmp/synthetic" > /dev/null 2>&1  # again, over the first
header=$(head -1 "$tmp/synthetic/ratings.csv")
stars=$(tail -n +2 "$tmp/synthetic/ratings.csv" | cut -d, -f3 | sort -u | tr '\n' ' ')
expect "--synthetic 30000: $(($(wc -l < "$tmp/synthetic/ratings.csv") - 1)) ratings under MovieLens's header, half stars only ($stars)$(if_thorough ', the same bytes again')" \
    test "$header" = "userId,movieId,rating,timestamp" -a "$(($(wc -l < "$tmp/synthetic/ratings.csv") - 1))" -eq 30000 -a \
    -z "$(echo "$stars" | tr ' ' '\n' | grep -vxE '[0-4]\.[05]|5\.0|^$')" -a -z "$(cmp "$tmp/synthetic/ratings.csv" "$tmp/synthetic.first" 2>&1)"
for mode in sparse sharded; do
    mpi 2 $PROGRAM --data "$tmp/synthetic" --epochs 3 --batch_size 256 --embeddings $mode --recommend 190 --losses "$tmp/syn_$mode.csv" --plot '' > "$tmp/syn_$mode.out" 2>&1
done
syn_rmse=$(field 'Test RMSE' "$tmp/syn_sparse.out") syn_mean=$(sed -n 's/.*global mean RMSE \([0-9.]*\);.*/\1/p' "$tmp/syn_sparse.out")
expect "training on it (2 ranks, 3 epochs): test RMSE ${syn_rmse:-?} below the global mean's ${syn_mean:-?}, sharded the same bits as sparse, titles with commas read back" \
    test -n "$syn_rmse" -a "$(awk -v r="${syn_rmse:-9}" -v m="${syn_mean:-0}" 'BEGIN { print (r < m) }')" = 1 -a \
    -z "$(cmp "$tmp/syn_sparse.csv" "$tmp/syn_sharded.csv" 2>&1)" -a "$(grep -c '^ *[0-9]*\. [0-9.]*  Synthetic movie' "$tmp/syn_sharded.out")" -eq 10

# ---------------------------------------------------------------- bad input: one line, every rank exits, nothing written
bad() {  # WHAT STATUS PATTERN NP DIR [FLAGS...]
    local what=$1 want=$2 pattern=$3 np=$4 dir=$5
    shift 5
    rm -f "$tmp/out.h5" "$tmp/out.csv" "$tmp/out.png"
    mpi "$np" $PROGRAM --data "$dir" --epochs 1 --save "$tmp/out.h5" --losses "$tmp/out.csv" --plot "$tmp/out.png" "$@" > "$tmp/bad" 2>&1
    local status=$? ours
    ours=$(grep -E '^\[rank [0-9]+ @|^error:' "$tmp/bad")
    expect "$what on $np rank$([ "$np" = 1 ] || echo s): exit $status ($want), one line: $ours" \
        test "$status" -eq "$want" -a "$(echo "$ours" | wc -l)" -eq 1 -a "$(echo "$ours" | grep -cE -- "$pattern")" -eq 1 -a \
        ! -e "$tmp/out.h5" -a ! -e "$tmp/out.csv" -a ! -e "$tmp/out.png"
}
mkdir -p "$tmp/"{truncated,range,nan,header,fields,nomovies}
head -c 1000000 "$DATA/ratings.csv" > "$tmp/truncated/ratings.csv"
awk -F, -v OFS=, 'NR == 5000 { $3 = "6.0" } { print }' "$DATA/ratings.csv" > "$tmp/range/ratings.csv"
awk -F, -v OFS=, 'NR == 70000 { $3 = "abc" } { print }' "$DATA/ratings.csv" > "$tmp/nan/ratings.csv"
sed '1s/.*/user,movie,rating,timestamp/' "$DATA/ratings.csv" > "$tmp/header/ratings.csv"
awk -F, -v OFS=, 'NR == 80000 { NF = 3 } { print }' "$DATA/ratings.csv" > "$tmp/fields/ratings.csv"
cp "$DATA/ratings.csv" "$tmp/nomovies/ratings.csv"
cut_line=$(head -c 1000000 "$DATA/ratings.csv" | wc -l)
# Each on 1 rank, and on 3 in make test-all; a truncated file on 3 ranks always (the last rank finds it).
bad "a truncated ratings.csv" 1 "ratings.csv:$((cut_line + 1)): the file ends in the middle of a row" 3 "$tmp/truncated"
for np in 1 $(if_thorough 3); do
    bad "a missing ratings.csv" 1 "$tmp/nowhere/ratings.csv: No such file or directory" $np "$tmp/nowhere"
    [ "$np" = 1 ] && bad "a truncated ratings.csv" 1 "ratings.csv:$((cut_line + 1)): the file ends in the middle of a row" $np "$tmp/truncated"
    bad "a rating of 6.0 (line 5000)" 1 "ratings.csv:5000: rating '6.0' is not a number from 0.5 to 5" $np "$tmp/range"
    bad "a rating 'abc' (line 70000)" 1 "ratings.csv:70000: rating 'abc' is not a number from 0.5 to 5" $np "$tmp/nan"
    bad "a header that is not MovieLens's" 1 "ratings.csv:1: expected the header 'userId,movieId,rating,timestamp'" $np "$tmp/header"
done
bad "a row of 3 fields (line 80000)" 1 "ratings.csv:80000: expected 4 fields" 2 "$tmp/fields"
bad "--recommend without movies.csv" 1 "movies.csv: No such file or directory" 2 "$tmp/nomovies" --recommend 1
bad "--recommend of a user not in the data" 2 "^error: --recommend 99999: no user of that id" 2 "$DATA" --recommend 99999
bad "--dim 0" 2 "^error: --dim expects an integer from 1 to 4096, got '0'" 2 "$DATA" --dim 0
bad "--embeddings all" 2 "^error: --embeddings expects one of dense\|sparse\|sharded, got 'all'" 1 "$DATA" --embeddings all
