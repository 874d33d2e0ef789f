#!/usr/bin/env bash
# Hostile input (issue 36): what a careless user or a crafted file puts in front of the programs
# is refused in one line that names the flag or the file:line, quotes what it got bounded and
# escaped (common/base/quote.h: at most 60 bytes, \n \r \x1b \x00 escaped), and never writes a control
# byte to the terminal:
# - flags whose values hold a newline, an escape sequence, a carriage return, bytes that are not
#   UTF-8, or 5000 digits (step 2);
# - MovieLens CSVs (step 15) whose rows hold a NUL (once read as a valid row), ESC [2J and a
#   carriage return; a movies.csv that is empty, header-only, misses a rated movie or holds an
#   escape sequence in a title, with --recommend (once: ten blank titles); a line's length limit
#   the same at line 101, 4600 bytes before the reader's 1 MiB block boundary and across two
#   ranks' ranges (once: a 5008-byte row accepted at one and refused at the other);
# - --init files (HDF5) holding NaN, +-inf, a float64 1e300 (once: cast to inf in silence), a
#   dataset never written, a virtual dataset whose source file is missing: refused by steps 2 and
#   18 (--zero 3, 2 ranks), naming the file and the dataset, every rank agreeing.
# Every mutated file is made here, in a temporary folder. Prints one PASS/FAIL/SKIP line per check
# (tests/run.sh counts them).
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite "hostile input"
MOVIELENS=${MOVIELENS_DATA:-data/movielens}
scratch
MPI_FLAGS="--bind-to none"  # mpirun would bind each rank to one core, whatever --threads asks

# The control bytes of a file, line endings aside (tabs count: none of our messages holds one).
control_bytes() { LC_ALL=C tr -d '\n\040-\176\200-\377' < "$1" | wc -c; }

# refused WHAT STATUS PATTERN COMMAND...: the command exits STATUS, and what our ranks print
# ("[rank r @ host] ..." or "error: ...") is one line, matching PATTERN (grep -E), and nothing it
# writes, stdout or stderr, holds a control byte. Run alone (no mpirun), its stderr must be that one
# line; under mpirun (COMMAND starts with mpi), Open MPI adds blocks of its own to stderr, so there
# no line may stand outside them that is not ours (a message split by a raw newline would leave one).
refused() {
    local what=$1 want=$2 pattern=$3
    shift 3
    if [ "$1" = mpi ]; then "$@"; else run "$@"; fi > "$tmp/out" 2> "$tmp/err"
    local status=$? ours controls strays
    ours=$(cat "$tmp/out" "$tmp/err" | grep -aE '^\[rank [0-9]+ @|^error:')
    controls=$(($(control_bytes "$tmp/out") + $(control_bytes "$tmp/err")))
    if [ "$1" = mpi ]; then
        # Open MPI's own messages stand between lines of dashes; mpirun's libevent warning as a rank
        # ends with an error on a busy machine is its own too (open-mpi/ompi#2004).
        strays=$(awk '/^----------+$/ { inside = !inside; next }
                      !inside && !/^\[rank [0-9]+ @|^error:|^\[warn\] Epoll (ADD|MOD|DEL)\([0-9]+\) on fd [0-9]+ failed\./ { n++ }
                      END { print n + 0 }' "$tmp/err")
    else
        strays=$(($(wc -l < "$tmp/err") - 1))
    fi
    expect "$what: exit $status ($want), one line, $controls control bytes: $(head -c 400 <<< "$ours")" \
        test "$status" -eq "$want" -a "$(grep -c . <<< "$ours")" -eq 1 -a "$(grep -acE -- "$pattern" <<< "$ours")" -eq 1 -a \
        "$controls" -eq 0 -a "$strays" -eq 0
}

# ---------------------------------------------------------------- flags (step 2)
refused "--device holding a newline and ESC [2J" 2 "^error: --device expects one of cpu\|cuda\|auto, got 'cu\\\\nda\\\\x1b\[2J' \(see --help\)$" \
    day1/2_mnist_training --device $'cu\nda\x1b[2J'
refused "an unknown flag holding ESC" 2 "^error: unknown flag '--ep\\\\x1bochs'(: did you mean --epochs\?)? \(see --help\)$" day1/2_mnist_training $'--ep\x1bochs=3'
refused "--lr ending in a carriage return" 2 "^error: --lr expects a number > 0, got '1e-3\\\\r'" day1/2_mnist_training --lr $'1e-3\r'
refused "--help=1: help is a switch" 2 "^error: --help takes no value \(see --help\)$" day1/2_mnist_training --help=1
refused "an argument that is not UTF-8" 2 "^error: unexpected argument '\\\\xff\\\\xfeabc'" day1/2_mnist_training $'\xff\xfeabc'
refused "--epochs of 5000 digits: 60 of them shown, then the length" 2 "^error: --epochs expects an integer from 1 to 2147483647, got '9{60}\.\.\.' \(5000 bytes\)" \
    day1/2_mnist_training --epochs "$(printf '9%.0s' $(seq 5000))"
# A path flag's value must be text: the programs print their paths in lines of output.
refused "--init naming a file whose name holds a newline and ESC [2J" 2 \
    "^error: --init expects a path of text, got '/nowhere/w\\\\n\\\\x1b\[2J\.h5' \(byte 10: a control byte, or not UTF-8\) \(see --help\)$" \
    day1/2_mnist_training --init $'/nowhere/w\n\x1b[2J.h5'
refused "--save into a folder whose name holds ESC (2 ranks)" 2 "^error: --save expects a path of text, got '/proc/no\\\\x1bdir/w\.h5'" \
    mpi 2 day1/2_mnist_training --save $'/proc/no\x1bdir/w.h5'
refused "--plot naming a file in Latin-1 (not UTF-8)" 2 "^error: --plot expects a path of text, got 'caf\\\\xe9\.png' \(byte 3" \
    day1/2_mnist_training --plot $'caf\xe9.png'
refused "--plot naming a file that clears the screen, the run's last line would print it" 2 \
    "^error: --plot expects a path of text, got '\\\\x1b\[2J\.png'" day5/19_gpt --plot $'\x1b[2J.png'

# ---------------------------------------------------------------- MovieLens CSVs (step 15)
if [ ! -f "$MOVIELENS/ratings.csv" ] || [ ! -f "$MOVIELENS/movies.csv" ]; then
    skip "MovieLens CSVs: no MovieLens in $MOVIELENS (make movielens)"
else
    ratings=$MOVIELENS/ratings.csv movies=$MOVIELENS/movies.csv
    refused "--data naming a folder whose name holds ESC [2J" 2 \
        "^error: --data expects a path of text, got '/nowhere/\\\\x1b\[2J'" day3/15_recommender_ddp --data $'/nowhere/\x1b[2J'
    step15=(day3/15_recommender_ddp --epochs 1 --max_steps 2 --plot '')
    # with_row DIR LINE ROW [MOVIES]: DIR/ratings.csv with ROW inserted as line LINE; movies.csv as MOVIES.
    with_row() {
        mkdir -p "$tmp/$1"
        { head -n $(($2 - 1)) "$ratings"; printf '%s\n' "$3"; tail -n +"$2" "$ratings"; } > "$tmp/$1/ratings.csv"
        cp "${4:-$movies}" "$tmp/$1/movies.csv"
    }
    mkdir -p "$tmp/nul" && cp "$movies" "$tmp/nul/"  # (a bash string holds no NUL: printf writes it)
    { head -n 100 "$ratings"; printf '4,1259,4.0,964538728\0garbage\n'; tail -n +101 "$ratings"; } > "$tmp/nul/ratings.csv"
    refused "a ratings row holding a NUL byte (line 101)" 1 \
        "ratings\.csv:101: byte 21 of the row is not text \(0x00: .*\): '4,1259,4\.0,964538728\\\\x00garbage'$" "${step15[@]}" --data "$tmp/nul"
    with_row esc 70000 $'4,1259,4.0,9645\x1b[2J\r38728'
    refused "a ratings row holding ESC [2J and a carriage return (line 70000)" 1 \
        "ratings\.csv:70000: byte 16 of the row is not text \(0x1b: .*\): '4,1259,4\.0,9645\\\\x1b\[2J\\\\r38728'$" "${step15[@]}" --data "$tmp/esc"
    refused "... on 2 ranks, where rank 1 reads it" 1 "ratings\.csv:70000: byte 16 of the row is not text" mpi 2 "${step15[@]}" --data "$tmp/esc"

    # movies.csv with --recommend: it must hold every movie that ratings.csv rates, as text.
    mkdir -p "$tmp/empty" "$tmp/header" "$tmp/missing" "$tmp/title"
    for d in empty header missing title; do cp "$ratings" "$tmp/$d/"; done
    : > "$tmp/empty/movies.csv"
    head -n 1 "$movies" > "$tmp/header/movies.csv"
    grep -v '^1,' "$movies" > "$tmp/missing/movies.csv"
    sed $'2s/,Toy Story/,Toy \x1b]0;pwned\x07Story/' "$movies" > "$tmp/title/movies.csv"
    refused "--recommend with an empty movies.csv" 1 "movies\.csv: the file is empty: expected the header 'movieId,title,genres'" \
        "${step15[@]}" --data "$tmp/empty" --recommend 1
    refused "--recommend with a header-only movies.csv (2 ranks)" 1 "movies\.csv: no row for movie 1, which ratings\.csv rates \(9724 of its 9724 movies" \
        mpi 2 "${step15[@]}" --data "$tmp/header" --recommend 1
    refused "--recommend with movie 1 missing from movies.csv" 1 "movies\.csv: no row for movie 1, which ratings\.csv rates \(1 of its 9724 movies" \
        "${step15[@]}" --data "$tmp/missing" --recommend 1
    expect "--recommend's movies.csv is read before training: the refusal trains nothing" \
        test "$(grep -c 'Epoch\|Training completed' "$tmp/out")" -eq 0
    refused "--recommend with a title holding an OSC escape sequence (line 2)" 1 "movies\.csv:2: byte 7 of the row is not text \(0x1b" \
        "${step15[@]}" --data "$tmp/title" --recommend 1

    # A line's length limit (4096 bytes, its line ending aside) is the same wherever the line falls:
    # at line 101, 4600 bytes before the reader's first 1 MiB block ends, across 2 ranks' ranges.
    # The rows are valid (leading zeros in the userId): only their length is at stake.
    row_of() { printf '%0*d,1259,4.0,964538728' $(($1 - 19)) 4; }  # a valid row of $1 bytes
    at_byte() {  # DIR BYTE ROW: ROW inserted as the first line that starts at or after BYTE
        mkdir -p "$tmp/$1"
        awk -v at="$2" -v row="$3" 'NR > 1 && !done && n >= at { print row; done = 1 } { print; n += length($0) + 1 }' \
            "$ratings" > "$tmp/$1/ratings.csv"
        cp "$movies" "$tmp/$1/"
        grep -n -m1 '^0000' "$tmp/$1/ratings.csv" | cut -d: -f1
    }
    long=$(row_of 5008) limit=$(row_of 4096)
    with_row long101 101 "$long"
    refused "a 5008-byte row at line 101" 1 "ratings\.csv:101: a line longer than 4096 bytes$" "${step15[@]}" --data "$tmp/long101"
    line=$(at_byte long_block $((1048576 - 4600)) "$long")
    refused "the same row 4600 bytes before the 1 MiB block boundary (line $line)" 1 "ratings\.csv:$line: a line longer than 4096 bytes$" \
        "${step15[@]}" --data "$tmp/long_block"
    size=$(($(wc -c < "$ratings") + 5009))
    line=$(at_byte long_ranks $((size / 2 - 2500)) "$long")
    refused "the same row across 2 ranks' ranges (line $line)" 1 "ratings\.csv:$line: a line longer than 4096 bytes$" \
        mpi 2 "${step15[@]}" --data "$tmp/long_ranks"
    n=$(($(wc -l < "$ratings") - 1 + 1))
    with_row limit101 101 "$limit"
    at_byte limit_block $((1048576 - 2000)) "$limit" > /dev/null
    at_byte limit_ranks $((($(wc -c < "$ratings") + 4097) / 2 - 2000)) "$limit" > /dev/null
    for case in "limit101 1" "limit_block 1" "limit_ranks 2"; do
        set -- $case
        mpi "$2" day3/15_recommender_ddp --data "$tmp/$1" --epochs 1 --max_steps 2 --plot '' > "$tmp/out" 2>&1
        status=$?
        read_total=$(sed -n 's/.*read bytes .* (\([0-9]*\) ratings).*/\1/p' "$tmp/out" | awk '{ s += $1 } END { print s + 0 }')
        expect "a row of exactly 4096 bytes ($1, $2 rank$([ "$2" = 1 ] || echo s)): exit $status (0), $read_total ratings read ($n)" \
            test "$status" -eq 0 -a "$read_total" -eq "$n"
    done
fi

# ---------------------------------------------------------------- --init files (steps 2 and 18)
if ! have_h5py; then
    skip "--init files: $PYTHON has no h5py (./setup.sh --with-reference)"
elif ! DATA=data/mnist have_mnist; then
    skip "--init files: no MNIST in data/mnist (make data)"
else
    # The workshop's Net as a state_dict, each file with one thing wrong; good.h5 and good64.h5 (the same
    # weights as float64, numpy's default) have nothing wrong.
    "$PYTHON" - "$tmp" <<'PY'
import sys, h5py, numpy as np
folder = sys.argv[1]
rng = np.random.default_rng(0)
shapes = {"fc.0.weight": (128, 784), "fc.0.bias": (128,), "fc.2.weight": (10, 128), "fc.2.bias": (10,)}
good = {k: rng.uniform(-0.03, 0.03, s).astype(np.float32) for k, s in shapes.items()}
def write(name, dtype=np.float32, change=None, skip=None):
    with h5py.File(f"{folder}/{name}.h5", "w") as f:
        for k, v in good.items():
            if k != skip:
                f[k] = v.astype(dtype)
        if change:
            change(f)
def put(key, index, value):
    def change(f):
        f[key][index] = value
    return change
write("good")
write("good64", np.float64)
write("nan", change=put("fc.2.weight", (3, 17), np.nan))
write("inf", change=put("fc.0.bias", 5, -np.inf))
write("huge64", np.float64, change=put("fc.0.weight", (0, 0), 1e300))
write("unwritten", skip="fc.2.bias", change=lambda f: f.create_dataset("fc.2.bias", (10,), "f4"))
def virtual(f):  # fc.0.weight read from a file that is not there
    layout = h5py.VirtualLayout(shape=(128, 784), dtype="f4")
    layout[:] = h5py.VirtualSource("no_such_source.h5", "fc.0.weight", shape=(128, 784))
    f.create_virtual_dataset("fc.0.weight", layout)
write("virtual", skip="fc.0.weight", change=virtual)
PY
    step2=(day1/2_mnist_training --epochs 1 --plot '')
    step18=(day4/18_zero_sharding --zero 3 --max_steps 2 --batch_size 64 --plot '')
    # Step 2 meets every case; step 18 (2 ranks, some 6 s a run on 2 busy cores) the first at every
    # level and all of them in make test-all.
    for np in 1 2; do
        if [ $np = 1 ]; then program=("${step2[@]}") name="step 2"; else program=(mpi 2 "${step18[@]}") name="step 18 --zero 3 on 2 ranks"; fi
        refused "$name, --init holding NaN" 1 "nan\.h5: dataset 'fc\.2\.weight' holds NaN at \[3, 17\] \(1 of its 1280 values are not finite\)" \
            "${program[@]}" --init "$tmp/nan.h5"
        [ $np = 2 ] && ! thorough && continue
        refused "$name, --init holding -inf" 1 "inf\.h5: dataset 'fc\.0\.bias' holds -inf at \[5\] \(1 of its 128 values" \
            "${program[@]}" --init "$tmp/inf.h5"
        refused "$name, --init of float64 holding 1e300" 1 "huge64\.h5: dataset 'fc\.0\.weight' \(float64\) holds a value beyond float32's range" \
            "${program[@]}" --init "$tmp/huge64.h5"
        refused "$name, --init with a dataset never written" 1 "unwritten\.h5: dataset 'fc\.2\.bias' was never written" \
            "${program[@]}" --init "$tmp/unwritten.h5"
        refused "$name, --init with a virtual dataset whose source is missing" 1 \
            "virtual\.h5: dataset 'fc\.0\.weight' is virtual and its source dataset 'fc\.0\.weight' in 'no_such_source\.h5' is missing" \
            "${program[@]}" --init "$tmp/virtual.h5"
    done
    # ... and the same weights, whole and finite, load: float32, float64, and a virtual dataset whose
    # source is there (beside it, as HDF5 finds it from any working directory).
    cp "$tmp/good.h5" "$tmp/no_such_source.h5"
    for file in good64 $(if_thorough good virtual); do
        mpi 2 "${step18[@]}" --init "$tmp/$file.h5" > "$tmp/out" 2>&1
        status=$?
        expect "step 18 --zero 3 on 2 ranks, --init $file.h5 (whole and finite): exit $status (0)$([ $status = 0 ] || echo ": $(grep -m1 '^\[rank' "$tmp/out")")" \
            test $status -eq 0
    done
fi

# ---------------------------------------------------------------- a damaged sharded checkpoint (step 19's)
# A resume refuses it in one line: a `current` file that is empty (not taken for a folder without a
# checkpoint, whose saves would then push the real ones out) or names no step folder (quoted); a
# loss log holding NaN; a shard's tensor of another type than the float32 a save writes.
if [ ! -f data/shakespeare/input.txt ]; then
    skip "damaged checkpoints: no data/shakespeare/input.txt (make shakespeare)"
else
    gpt=(day5/19_gpt --n_layer 1 --n_head 1 --n_embd 8 --block_size 8 --batch_size 2 --eval_iters 1 --sample 0 --plot '')
    run "${gpt[@]}" --max_iters 1 --eval_interval 1 --checkpoint "$tmp/ck" > "$tmp/out" 2>&1 ||
        fail "step 19 could not save the checkpoint to damage: $(tail -1 "$tmp/out")"
    damaged() { rm -rf "$tmp/ck_$1" && cp -r "$tmp/ck" "$tmp/ck_$1"; }
    damaged empty && : > "$tmp/ck_empty/current"
    refused "step 19 resuming a checkpoint whose current file is empty" 1 "ck_empty/current names '', expected a step-NNNNNN folder$" \
        "${gpt[@]}" --max_iters 2 --checkpoint "$tmp/ck_empty"
    damaged esc && printf 'step-\033[2J\n' > "$tmp/ck_esc/current"
    refused "step 19 resuming a checkpoint whose current file names 'step-ESC[2J'" 1 \
        "ck_esc/current names 'step-\\\\x1b\[2J', expected a step-NNNNNN folder$" "${gpt[@]}" --max_iters 2 --checkpoint "$tmp/ck_esc"
    if have_h5py; then
        damaged nan && "$PYTHON" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); f['state/losses/loss'][0] = float('nan')" \
            "$tmp/ck_nan/step-000001/index.h5"
        refused "step 19 resuming a checkpoint whose loss log holds NaN" 1 \
            "index\.h5: inconsistent: the loss log's step 1: epoch 0, loss nan \(a logged loss is finite, its epoch >= 0\)$" \
            "${gpt[@]}" --max_iters 2 --checkpoint "$tmp/ck_nan"
        damaged f64 && "$PYTHON" -c "
import h5py, numpy, sys
f = h5py.File(sys.argv[1], 'r+'); data = f['transformer.wte.weight/0'][()]
del f['transformer.wte.weight/0']; f['transformer.wte.weight/0'] = data.astype(numpy.float64)" "$tmp/ck_f64/step-000001/shard-00000.h5"
        refused "step 19 resuming a checkpoint whose shard holds a tensor as float64" 1 \
            "shard-00000\.h5: 'transformer\.wte\.weight/0' is of another type than a checkpoint's: a damaged shard$" \
            "${gpt[@]}" --max_iters 2 --checkpoint "$tmp/ck_f64"
        # A resume from weights of 1e30 trains on (the loss and the weights stay finite) but Adam's
        # second moment overflows: that save is refused, and the checkpoint before stays current.
        step18=(day4/18_zero_sharding --zero 1 --batch_size 64 --plot '')
        run "${step18[@]}" --max_steps 2 --checkpoint "$tmp/ck18" > "$tmp/out" 2>&1 ||
            fail "step 18 could not save the checkpoint to damage: $(tail -1 "$tmp/out")"
        "$PYTHON" -c "
import h5py, numpy, sys
f = h5py.File(sys.argv[1], 'r+'); name = [n for n in f if n == 'fc.2.weight'][0]; piece = name + '/' + list(f[name])[0]
data = f[piece][()]; del f[piece]; f[piece] = numpy.full_like(data, 1e30)" "$tmp/ck18/step-000002/shard-00000.h5"
        refused "step 18 resumed from weights of 1e30: a save of Adam's overflowed moments" 1 \
            "ck18/tmp-000003/shard-00000\.h5: 'optimizer/exp_avg_sq/.*' holds inf at \[[0-9]+\] of this rank's piece: a checkpoint holds finite numbers; not saved$" \
            "${step18[@]}" --max_steps 3 --checkpoint "$tmp/ck18"
        expect "... and the checkpoint before stays current: $(cat "$tmp/ck18/current"), no tmp-000003 left" \
            test "$(cat "$tmp/ck18/current")" = step-000002 -a ! -e "$tmp/ck18/tmp-000003"
    else
        skip "damaged checkpoints' contents: $PYTHON has no h5py (./setup.sh --with-reference)"
    fi
fi
