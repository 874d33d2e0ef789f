#!/usr/bin/env bash
# Output files are replaced atomically (paths.h: replace_begin/replace_commit):
# a write that fails leaves the old file byte for byte, and no temporary file
# behind; a write that succeeds leaves no temporary file either. Also step 7's
# --results, which a malformed file is refused by, and create_mnist_h5's
# writes. Prints one PASS/FAIL/SKIP line per check (tests/run.sh counts them).
# make test (TEST_LEVEL=quick) leaves to make test-all (TEST_LEVEL=all) the failed writes of
# --losses, --plot and step 7's --results, the full disk, and the writes that succeed over an
# old file, through a link, or into a new --results file: each one more training run.
set -u
cd "$(dirname "$0")/.."
source tests/lib.sh
suite outputs
scratch
mounted=""
at_exit '[ -n "$mounted" ] && umount "$mounted"'

# limited N COMMAND...: COMMAND as one rank whose files cannot grow past N
# KiB (ulimit -f counts blocks of 1024 bytes), so that writing a bigger one fails with EFBIG ("File
# too large"), as a full disk fails it with ENOSPC. SIGXFSZ is ignored: the
# write fails instead of killing the process. The limit is the rank's alone
# (mpirun's own files would break under it), and one rank over `--mca btl
# self` needs no shared-memory segment, which the limit would refuse too.
limited() {
    local kb=$1; shift
    run $MPIRUN --mca btl self -np 1 bash -c 'trap "" XFSZ; ulimit -f "$0"; exec "$@"' "$kb" "$@"
}

# The temporary files left in a folder (TARGET.tmp.PID, or create_mnist_h5's old TARGET.partial).
temps() { find "$1" -maxdepth 1 \( -name '*.tmp.*' -o -name '*.partial' \) -printf '%f ' 2>/dev/null; }

# expect_kept WHAT FILE PATTERN: the last command (its output in $tmp/err, its
# status in $status) failed with one line matching PATTERN, FILE is still its
# copy $tmp/keep/FILE's name byte for byte, and no temporary file is left.
expect_kept() {
    local what=$1 file=$2 pattern=$3 line left
    line=$(grep -m1 -E -- "$pattern" "$tmp/err")
    left=$(temps "$(dirname "$file")")
    if [ "$status" -ne 0 ] && [ -n "$line" ] && cmp -s "$file" "$tmp/keep/$(basename "$file")" && [ -z "$left" ] &&
       ! grep -qiE 'segmentation|core dumped' "$tmp/err"; then
        pass "$what: the old file survives a failed write, byte for byte, and no temp is left: $line"
    else
        fail "$what: exit $status, old file $(cmp -s "$file" "$tmp/keep/$(basename "$file")" && echo kept || echo LOST), temps: '${left}'; $(grep -v '^-\|^ *$' "$tmp/err" | tail -3)"
    fi
}

# ---------------------------------------------------------------- the first writes
mkdir -p "$tmp/out" "$tmp/keep"
run day3/14_cnn_ddp --data "$DATA" --max_steps 100 --save "$tmp/out/w.h5" --losses "$tmp/out/l.csv" \
    --plot "$tmp/out/p.png" > "$tmp/err" 2>&1
status=$?
run day1/test_profile --trace "$tmp/out/t.json" > /dev/null 2>&1
left=$(temps "$tmp/out")
if [ $status -eq 0 ] && [ -s "$tmp/out/w.h5" ] && [ -s "$tmp/out/l.csv" ] && [ -s "$tmp/out/p.png" ] &&
   [ -s "$tmp/out/t.json" ] && [ -z "$left" ]; then
    pass "--save, --losses, --plot and --trace write their files and leave no temp file"
else
    fail "the first writes: exit $status, temps '$left': $(tail -3 "$tmp/err")"
fi
cp "$tmp/out/"* "$tmp/keep/"

# The same files again, from another seed (other bytes), where a write fails:
# 1 KiB is less than each of them (the weights at any step; the losses of 100 steps).
limited 1 day3/14_cnn_ddp --data "$DATA" --seed 1 --max_steps 10 --plot '' --save "$tmp/out/w.h5" > "$tmp/err" 2>&1
status=$?
expect_kept "--save" "$tmp/out/w.h5" 'w\.h5: cannot write .*: File too large$'
if thorough; then  # make test-all: --losses and --plot, each one more run of step 14
limited 1 day3/14_cnn_ddp --data "$DATA" --seed 1 --max_steps 100 --plot '' --losses "$tmp/out/l.csv" > "$tmp/err" 2>&1
status=$?
expect_kept "--losses" "$tmp/out/l.csv" '--losses .*l\.csv: cannot write: File too large$'
limited 1 day3/14_cnn_ddp --data "$DATA" --seed 1 --max_steps 100 --plot "$tmp/out/p.png" > "$tmp/err" 2>&1
status=$?
expect_kept "--plot" "$tmp/out/p.png" 'cannot write .*p\.png: .*File too large$'
fi  # thorough
limited 1 day1/test_profile --trace "$tmp/out/t.json" > "$tmp/err" 2>&1
status=$?
expect_kept "--trace" "$tmp/out/t.json" '--trace .*t\.json: cannot write: File too large$'

# A write that succeeds replaces the file, and leaves no temp.
if thorough; then  # make test-all: a write over an old file, and on a full disk
run day3/14_cnn_ddp --data "$DATA" --seed 1 --max_steps 100 --plot '' --losses "$tmp/out/l.csv" > /dev/null 2>&1
status=$?
if [ $status -eq 0 ] && ! cmp -s "$tmp/out/l.csv" "$tmp/keep/l.csv" && [ "$(wc -l < "$tmp/out/l.csv")" = 101 ] &&
   [ -z "$(temps "$tmp/out")" ]; then
    pass "a write that succeeds replaces the old file (--losses from another seed: 100 new steps) and leaves no temp"
else
    fail "--losses over an old file: exit $status, $(wc -l < "$tmp/out/l.csv") lines, temps '$(temps "$tmp/out")'"
fi

# A full disk, as the sweep found it: a tmpfs that holds the old weights and
# not a second copy. Only where this user may mount one (root, outside most
# containers).
mkdir -p "$tmp/full"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=2m tmpfs "$tmp/full" 2> /dev/null; then
    mounted="$tmp/full"
    cp "$tmp/keep/w.h5" "$tmp/full/w.h5"
    run day3/14_cnn_ddp --data "$DATA" --seed 1 --max_steps 0 --plot '' --save "$tmp/full/w.h5" > "$tmp/err" 2>&1
    status=$?
    expect_kept "--save on a full disk" "$tmp/full/w.h5" 'w\.h5: cannot write .*: No space left on device$'
else
    skip "--save on a full disk (skipped: cannot mount a small tmpfs here; the file size limit above stands in for it)"
fi
fi  # thorough

# ---------------------------------------------------------------- step 7 --results
step7=(day1/7_mnist_ddp_timing --data "$DATA" --epochs 1 --plot '' --chart '')
printf 'world_size,seconds\n1,-1\nabc,def\n4,1e999\n' > "$tmp/bad.csv"
cp "$tmp/bad.csv" "$tmp/keep/bad.csv"
mpi 2 "${step7[@]}" --results "$tmp/bad.csv" > "$tmp/err" 2>&1
status=$?
line=$(grep -m1 '^error: ' "$tmp/err")
if [ $status -eq 2 ] && echo "$line" | grep -qE "^error: --results .*bad\.csv: line 2 is '1,-1', expected world_size,seconds" &&
   [ "$(grep -c '^error' "$tmp/err")" = 1 ] && ! grep -q '^epoch' "$tmp/err" && cmp -s "$tmp/bad.csv" "$tmp/keep/bad.csv"; then
    pass "step 7 refuses a malformed --results file before training, on 2 ranks, and leaves it as it was: $line"
else
    fail "step 7 --results with malformed rows: exit $status: $(grep -v '^-\|^ *$' "$tmp/err" | head -3)"
fi
for row in 'abc,def' '2,1.5,3' '0,1.5' '2,0' '2,nan' '2,1e999'; do
    printf 'world_size,seconds\n1,2.5\n%s\n' "$row" > "$tmp/bad2.csv"
    mpi 1 "${step7[@]}" --results "$tmp/bad2.csv" > "$tmp/err" 2>&1
    status=$?
    line=$(grep -m1 '^error: ' "$tmp/err")
    if [ $status -eq 2 ] && echo "$line" | grep -qF "bad2.csv: line 3 is '$row', expected"; then
        pass "step 7 --results: the row '$row' is refused, naming its line"
    else
        fail "step 7 --results with the row '$row': exit $status: $(head -2 "$tmp/err")"
    fi
done

# A good file keeps its rows, byte for byte, and gets this run's; a new one starts with the header.
# Its rows are repeats, out of order: the table shows per world size the runs, the median (of an
# odd and of an even count), the fastest..slowest, the speed-up of the medians, and its range from
# the fastest 1-rank run over the slowest W-rank run to the slowest over the fastest.
printf 'world_size,seconds\n1,2.0\n4,6.0\n1,9.0\n8,1.0\n4,1.5\n1,3.0\n8,2.0\n4,1.0' > "$tmp/good.csv"  # no newline at the end: written by hand
cp "$tmp/good.csv" "$tmp/keep/good.csv"
mpi 2 "${step7[@]}" --results "$tmp/good.csv" > "$tmp/out7" 2>&1
status=$?
if [ $status -eq 0 ] && [ "$(head -c "$(wc -c < "$tmp/keep/good.csv")" "$tmp/good.csv")" = "$(cat "$tmp/keep/good.csv")" ] &&
   [ "$(wc -l < "$tmp/good.csv")" = 10 ] && tail -1 "$tmp/good.csv" | grep -qE '^2,[0-9]+\.[0-9]{6}$' && [ -z "$(temps "$tmp")" ]; then
    pass "step 7 --results: a good file keeps its rows and gets this run's"
else
    fail "step 7 --results on a good file: exit $status: $(cat "$tmp/good.csv" | tr '\n' ' ') / $(tail -3 "$tmp/out7")"
fi
if grep -qE '^ +1 +3 +3\.000 +2\.000\.\.9\.000 +1\.00x +0\.22\.\.4\.50x +100%$' "$tmp/out7" &&
   grep -qE '^ +2 +1 +[0-9.]+ +[0-9.]+\.\.[0-9.]+ +[0-9.]+x +[0-9.]+\.\.[0-9.]+x +[0-9]+%$' "$tmp/out7" &&
   grep -qE '^ +4 +3 +1\.500 +1\.000\.\.6\.000 +2\.00x +0\.33\.\.9\.00x +50%$' "$tmp/out7" &&
   grep -qE '^ +8 +2 +1\.500 +1\.000\.\.2\.000 +2\.00x +1\.00\.\.9\.00x +25%$' "$tmp/out7"; then
    pass "step 7 --results: repeats make one row per world size, with the median, the min..max, and the speed-up of the medians with its range"
else
    fail "step 7 --results with repeats: the table reads $(grep -E '^ +[0-9]+ ' "$tmp/out7" | tr -s ' ' | tr '\n' '/')"
fi
if thorough; then  # make test-all: a new --results file, and a failed write of one
mpi 1 "${step7[@]}" --results "$tmp/new.csv" > /dev/null 2>&1
expect_new=$(head -1 "$tmp/new.csv" 2> /dev/null)
if [ "$expect_new" = "world_size,seconds" ] && [ "$(wc -l < "$tmp/new.csv")" = 2 ]; then
    pass "step 7 --results: a new file starts with the header world_size,seconds"
else
    fail "step 7 --results: a new file holds: $(cat "$tmp/new.csv" 2> /dev/null | tr '\n' ' ')"
fi
# A failed write keeps every run: 200 of them are more than 1 KiB.
{ echo world_size,seconds; for i in $(seq 200); do echo "$((i % 4 + 1)),1.$i"; done; } > "$tmp/out/runs.csv"
cp "$tmp/out/runs.csv" "$tmp/keep/runs.csv"
limited 1 "${step7[@]}" --results "$tmp/out/runs.csv" > "$tmp/err" 2>&1
status=$?
expect_kept "step 7 --results" "$tmp/out/runs.csv" '--results .*runs\.csv: cannot write: File too large$'
fi  # thorough

mpi 1 "${step7[@]}" --chart "$tmp/lonely.png" > "$tmp/err" 2>&1
status=$?
if [ $status -eq 2 ] && grep -q '^error: --chart draws the table of --results: give --results too' "$tmp/err" &&
   ! grep -q '^epoch' "$tmp/err"; then
    pass "step 7 --chart without --results: a usage error before training"
else
    fail "step 7 --chart without --results: exit $status: $(head -2 "$tmp/err")"
fi

# ---------------------------------------------------------------- create_mnist_h5
echo "old data" > "$tmp/out/mnist.h5"
cp "$tmp/out/mnist.h5" "$tmp/keep/mnist.h5"
limited 64 day2/create_mnist_h5 --data "$DATA" --out "$tmp/out/mnist.h5" --force > "$tmp/err" 2>&1
status=$?
expect_kept "create_mnist_h5 --force" "$tmp/out/mnist.h5" 'mnist\.h5: cannot write'

# ---------------------------------------------------------------- outputs tried before the run
# args.c tries every output file at parse time (paths.h: output_file_writable),
# so that a path that cannot be written ends the job in a second, with one line
# naming the flag, and not after the training it would have thrown away.
touch "$tmp/plainfile"
mkdir -p "$tmp/folder"
rm -f "$tmp/fifo"; mkfifo "$tmp/fifo"
expect_early() {  # what, pattern, ranks, program and flags...
    local what=$1 pattern=$2 np=$3; shift 3
    mpi "$np" "$@" > "$tmp/err" 2>&1
    local status=$? line left
    line=$(grep -m1 -E -- "$pattern" "$tmp/err")
    left=$(find "$tmp" -maxdepth 2 -name '.write-check.*' -printf '%f ')
    if [ $status -eq 1 ] && [ -n "$line" ] && [ "$(grep -c '^\[rank' "$tmp/err")" = 1 ] &&
       ! grep -qE '^(epoch|Step|step)' "$tmp/err" && [ -z "$left" ] && ! grep -qiE 'segmentation|core dumped' "$tmp/err"; then
        pass "$what: refused before anything runs, on $np rank$([ "$np" = 1 ] || echo s), one line: $line"
    else
        fail "$what: exit $status, probes left '$left': $(grep -v '^-\|^ *$' "$tmp/err" | head -3)"
    fi
}
expect_early "step 2 --save under a plain file" "^\[rank 0 @ .*\] --save .*plainfile/w\.h5: .*plainfile is not a folder$" \
    1 day1/2_mnist_training --data "$DATA" --save "$tmp/plainfile/w.h5"
expect_early "step 3 --plot deeper under a plain file" "--plot .*plainfile/a/p\.png: .*plainfile is not a folder$" \
    2 day1/3_mnist_distributed --data "$DATA" --plot "$tmp/plainfile/a/p.png"
expect_early "step 5 --trace on a FIFO" "--trace .*fifo: is not a regular file \(a FIFO" \
    2 day1/5_mnist_manual_ddp_profile --data "$DATA" --trace "$tmp/fifo"
expect_early "step 6 --losses on a folder" "--losses .*folder: is a directory$" \
    2 day1/6_mnist_ddp --data "$DATA" --losses "$tmp/folder"
expect_early "step 7 --results on a folder" "--results .*folder: is a directory$" \
    2 day1/7_mnist_ddp_timing --data "$DATA" --results "$tmp/folder"
expect_early "step 7 --chart under a plain file" "--chart .*plainfile/c\.png: .*plainfile is not a folder$" \
    2 day1/7_mnist_ddp_timing --data "$DATA" --chart "$tmp/plainfile/c.png"
expect_early "step 13 --snapshot under a plain file" "--snapshot .*plainfile/s\.h5: .*plainfile is not a folder$" \
    2 day3/13_fault_tolerant_ddp --data "$DATA" --snapshot "$tmp/plainfile/s.h5"
expect_early "step 14 --save naming a folder" "--save .*folder/: names a folder, not a file$" \
    2 day3/14_cnn_ddp --data "$DATA" --save "$tmp/folder/"

# A read-only filesystem, the case that permissions cannot show to root.
mkdir -p "$tmp/ro"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o ro,size=1m tmpfs "$tmp/ro" 2> /dev/null; then
    expect_early "step 2 --losses on a read-only filesystem" \
        "--losses .*ro/deep/l\.csv: cannot create a file in .*ro: Read-only file system$" \
        1 day1/2_mnist_training --data "$DATA" --losses "$tmp/ro/deep/l.csv"
    umount "$tmp/ro"
else
    skip "--losses on a read-only filesystem (skipped: cannot mount a tmpfs here)"
fi

# Trying leaves no trace: a run refused for another reason has created no folder.
run day1/2_mnist_training --data "$DATA" --save "$tmp/never/made/w.h5" --init "$tmp/missing.h5" > "$tmp/err" 2>&1
status=$?
if [ $status -ne 0 ] && [ ! -e "$tmp/never" ] && grep -q 'missing\.h5' "$tmp/err"; then
    pass "a writable --save in new folders is accepted, and trying it creates no folder (the run then fails on --init)"
else
    fail "--save in new folders: exit $status, $tmp/never $( [ -e "$tmp/never" ] && echo exists || echo absent): $(head -2 "$tmp/err")"
fi

# '' is none only for an output that may be none (--plot, --trace); a snapshot's name may not be ''.
mpi 2 day3/13_fault_tolerant_ddp --data "$DATA" --snapshot '' > "$tmp/err" 2>&1
status=$?
if [ $status -eq 2 ] && grep -q "^error: --snapshot expects a FILE.h5, got ''" "$tmp/err" && ! grep -q '^epoch' "$tmp/err"; then
    pass "an output that cannot be none refuses '' (step 13 --snapshot ''): $(grep -m1 '^error' "$tmp/err")"
else
    fail "step 13 --snapshot '': exit $status: $(head -2 "$tmp/err")"
fi

if thorough; then  # make test-all: a write through a link
# A link stays a link: the file it points to is replaced, and keeps its permission bits.
echo old > "$tmp/out/real.csv"
chmod 640 "$tmp/out/real.csv"
ln -sf real.csv "$tmp/out/link.csv"
run day3/14_cnn_ddp --data "$DATA" --max_steps 3 --plot '' --losses "$tmp/out/link.csv" > "$tmp/err" 2>&1
status=$?
if [ $status -eq 0 ] && [ -L "$tmp/out/link.csv" ] && [ "$(wc -l < "$tmp/out/real.csv")" = 4 ] &&
   [ "$(stat -c %a "$tmp/out/real.csv")" = 640 ] && [ -z "$(temps "$tmp/out")" ]; then
    pass "--losses through a symbolic link replaces the file it points to, keeps the link and the mode 640"
else
    fail "--losses through a link: exit $status, link $( [ -L "$tmp/out/link.csv" ] && echo kept || echo REPLACED), mode $(stat -c %a "$tmp/out/real.csv"), $(wc -l < "$tmp/out/real.csv") lines"
fi
fi  # thorough

# A stream is written in place: --losses /dev/stdout, with stdout redirected to a file, adds the
# CSV to what the program prints, and replaces nothing (a rename would take the file from under it).
run day1/2_mnist_training --data "$DATA" --epochs 1 --plot '' --losses /dev/stdout > "$tmp/out/stdout.txt" 2> "$tmp/err"
status=$?
if [ $status -eq 0 ] && grep -q '^Step 2: ' "$tmp/out/stdout.txt" && grep -q '^Training completed' "$tmp/out/stdout.txt" &&
   [ "$(grep -c '^[0-9]*,0,[0-9.]*$' "$tmp/out/stdout.txt")" = 10 ] && grep -qx 'step,epoch,loss' "$tmp/out/stdout.txt" &&
   [ -z "$(temps "$tmp/out")" ]; then
    pass "--losses /dev/stdout into a file: the program's lines and the 10 CSV rows, all there"
else
    fail "--losses /dev/stdout: exit $status, $(wc -l < "$tmp/out/stdout.txt") lines: $(head -3 "$tmp/out/stdout.txt" | tr '\n' ' ')"
fi

# Step 13's snapshot (its own writer, snapshot.c) through a link to a file not there yet: the file
# is created where the link points, and the next run's snapshot keeps the link and the file's mode.
mkdir -p "$tmp/snaps"
ln -sf "$tmp/snaps/s.h5" "$tmp/out/snap_link.h5"
mpi 1 day3/13_fault_tolerant_ddp --data "$DATA" --total_epochs 1 --plot '' --snapshot "$tmp/out/snap_link.h5" > "$tmp/err" 2>&1
first=$?
chmod 600 "$tmp/snaps/s.h5" 2> /dev/null
mpi 1 day3/13_fault_tolerant_ddp --data "$DATA" --total_epochs 2 --plot '' --snapshot "$tmp/out/snap_link.h5" > "$tmp/err" 2>&1
status=$?
if [ $first -eq 0 ] && [ $status -eq 0 ] && grep -q 'Resuming' "$tmp/err" && [ -L "$tmp/out/snap_link.h5" ] &&
   [ "$(stat -c %a "$tmp/snaps/s.h5")" = 600 ] && [ -z "$(find "$tmp/snaps" "$tmp/out" -name '*.tmp*')" ]; then
    pass "step 13 --snapshot through a link: created where it points, resumed, and the link and mode 600 kept"
else
    fail "step 13 --snapshot through a link: exits $first, $status, link $( [ -L "$tmp/out/snap_link.h5" ] && echo kept || echo REPLACED), mode $(stat -c %a "$tmp/snaps/s.h5" 2>&1): $(grep -v '^-\|^ *$' "$tmp/err" | tail -2)"
fi
