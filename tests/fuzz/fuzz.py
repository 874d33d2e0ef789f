#!/usr/bin/python3
"""tests/fuzz/fuzz.py: mutate every kind of input the programs read, run them, and classify each run.

Input kinds (--kinds, all by default):
  csv       MovieLens ratings.csv / movies.csv for step 15 on 1-3 ranks: byte flips, truncation, NUL and
            control bytes, overlong lines, huge or non-finite numbers, empty and header-only files, ...
  init      --init HDF5 files for steps 2, 6, 15, 16, 17, 18, 19 and 20, and step 11's --h5 MNIST file: NaN,
            inf, 3e38, float64, other types, wrong shapes, missing, unwritten and virtual datasets, soft links
            to nowhere, truncated and byte-flipped files
  idx       MNIST IDX files (plain or gzip) for the MNIST steps and create_mnist_h5: truncation, wrong
            magic, huge counts and dimensions, labels past 9, corrupt gzip, trailing bytes
  snapshot  step 13's snapshots: every dataset and attribute of a real snapshot mutated as above
  text      steps 19 and 20's text (Tiny Shakespeare's input.txt): empty, cut near the least a window needs,
            NUL and control bytes, every byte value, one character only, a folder or nothing in its place;
            with an --init of another vocabulary, or a --prompt of characters the text lacks
  checkpoint  the sharded checkpoints of steps 13, 16, 17, 18, 19 and 20 (index.h5, a rank's shard file, `current`),
            mutated as the HDF5 files above, resumed on 1-3 ranks under another layout, or converted by
            tools/checkpoint_to_state_dict
  flags     flag values for steps 2-20: numbers at and past their limits, empty, huge, control bytes and
            newlines, unknown and repeated flags, paths that cannot be read or written
Each run is one of:
  refused   a non-zero exit whose output holds exactly one line of ours ("error: ..." or
            "[rank r @ host] ..."), no other line on stderr (Open MPI's own blocks between dashes aside),
            no raw control byte, no sanitizer report, no temporary file left behind, and not an allocation
            that failed (the fuzzer's memory limit stands in for the node's: the programs are to estimate
            what they allocate and refuse first);
  trained   exit 0 with no nan/inf printed, no control byte printed, no output file (HDF5, CSV) holding a
            non-finite value, no temporary file left behind;
  crashed   anything else: a signal, a sanitizer report, a refusal of several lines or with a control byte,
            exit 0 with nan/inf, a leftover temporary file, an allocation that failed;
  hung      still running after --timeout seconds (the whole process group is killed, mpirun's ranks too).
Crashed and hung runs are failures: their folder (the mutated input, the command as repro.sh, what it
printed) stays under --results, and one FAIL line names the folder and the command. Refused and trained
runs leave nothing (unless --keep).

Prints PASS/FAIL lines as tests/run.sh counts them: one FAIL line per failed run, then one PASS line per kind
whose runs all passed; -v adds a line per run. The same --seed and --count give the same inputs, so the
same verdicts (a timeout aside). With --minutes, kinds take turns until the time is spent.
See docs/tests.md (Fuzzing) for longer runs and the sanitizer tree.
"""
import argparse
import gzip
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---------------------------------------------------------------- the programs
MNIST_STEPS = ["day1/2_mnist_training", "day1/3_mnist_distributed", "day1/4_mnist_manual_ddp",
               "day1/5_mnist_manual_ddp_profile", "day1/6_mnist_ddp", "day1/7_mnist_ddp_timing",
               "day1/8_mnist_ddp_lr", "day2/10_mnist_ddp_multinode", "day3/13_fault_tolerant_ddp",
               "day3/14_cnn_ddp", "day4/16_pipeline_ddp", "day4/17_tensor_parallel", "day4/18_zero_sharding"]
GPT_STEPS = ["day5/19_gpt", "day5/20_gpt_3d"]
FLAG_STEPS = MNIST_STEPS[:7] + ["day2/9_dist_multinode"] + MNIST_STEPS[7:8] + [
    "day2/11_multinode_streaming", "day2/create_mnist_h5", "day3/12_collectives"] + MNIST_STEPS[8:11] + [
    "day3/15_recommender_ddp"] + MNIST_STEPS[11:] + GPT_STEPS
KINDS = ["csv", "init", "idx", "snapshot", "text", "checkpoint", "flags"]
# A GPT of 2 layers, 16 wide, 2 iterations of 4 windows of 16 characters, evaluated once, no sample.
GPT_SHORT = {"--n_layer": "2", "--n_head": "2", "--n_embd": "16", "--block_size": "16", "--batch_size": "4",
             "--max_iters": "2", "--eval_interval": "2", "--eval_iters": "1", "--sample": "0", "--plot": ""}

# What keeps a run short (a few seconds on 2 busy cores); a fuzzed flag replaces its entry. Outputs that
# a program writes by default land in the run's own folder (the working directory).
SHORT = {
    "day1/5_mnist_manual_ddp_profile": {"--epochs": "1", "--plot": "", "--trace": ""},
    "day1/7_mnist_ddp_timing": {"--epochs": "1", "--plot": "", "--chart": ""},
    "day2/9_dist_multinode": {},
    "day2/create_mnist_h5": {"--out": "out.h5"},
    "day3/12_collectives": {},
    "day3/13_fault_tolerant_ddp": {"--total_epochs": "1", "--plot": "", "--snapshot": "snap.h5"},
    "day3/14_cnn_ddp": {"--max_steps": "2", "--plot": ""},
    "day3/15_recommender_ddp": {"--epochs": "1", "--max_steps": "3", "--plot": ""},
    "day4/17_tensor_parallel": {"--max_steps": "2", "--plot": ""},
    "day4/18_zero_sharding": {"--max_steps": "2", "--plot": ""},
    "day5/19_gpt": GPT_SHORT,
    "day5/20_gpt_3d": GPT_SHORT,
}


def short_args(program):
    return dict(SHORT.get(program, {"--epochs": "1", "--plot": ""}))


# ---------------------------------------------------------------- quoting
def shell_word(s):
    """One shell word for s, printable: $'...' with \\xNN escapes where s holds a control byte."""
    if all(32 <= ord(c) < 127 for c in s):
        return shlex.quote(s)
    out = []
    for b in s.encode("utf-8", "surrogateescape"):
        c = chr(b)
        out.append("\\" + c if c in "\\'" else c if 32 <= b < 127 else "\\x%02x" % b)
    return "$'" + "".join(out) + "'"


def printable(text, limit=300):
    """text on one line, control bytes escaped, at most `limit` characters."""
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------- HDF5 mutations (init, snapshot, step 11)
def h5_mutations():
    """(name, function(path, rng) -> description) for an HDF5 file; h5py imported on first use."""
    import h5py
    import numpy as np
    np.seterr(all="ignore")  # the casts of 3e38 and 1e300 overflow on purpose

    def datasets(f):
        found = []
        f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
        return sorted(found)

    def float_sets(f):
        return [d for d in datasets(f) if f[d].dtype.kind == "f"] or datasets(f)

    def pick(f, rng, floats=True):
        names = float_sets(f) if floats else datasets(f)
        return rng.choice(names)

    def rewrite(f, name, data, **kw):
        attrs = dict(f[name].attrs)
        del f[name]
        f.create_dataset(name, data=data, **kw)
        for k, v in attrs.items():
            f[name].attrs[k] = v

    def set_value(value):
        def mutate(path, rng):
            with h5py.File(path, "r+") as f:
                name = pick(f, rng)
                data = f[name][()]
                if np.ndim(data) == 0:
                    data = value
                    where = "the scalar"
                else:
                    flat = np.array(data).reshape(-1)
                    i = rng.randrange(flat.size) if flat.size else 0
                    if flat.size:
                        # an integer dataset takes the value as C would cast it (-1 for a non-finite one)
                        if flat.dtype.kind == "f":
                            flat[i] = value
                        else:  # an integer dataset: the value clamped to its type, -1 for NaN and inf
                            limits = np.iinfo(flat.dtype)
                            flat[i] = min(max(int(value), limits.min), limits.max) if np.isfinite(value) else \
                                np.array(-1).astype(flat.dtype)
                    data = flat.reshape(np.shape(data))
                    where = "flat index %d" % i
                rewrite(f, name, data)
                return "%s of '%s' set to %r" % (where, name, value)
        return mutate

    def whole(value):
        def mutate(path, rng):
            with h5py.File(path, "r+") as f:
                name = pick(f, rng)
                data = np.full(f[name].shape, value, dtype=f[name].dtype)
                rewrite(f, name, data)
                return "every value of '%s' set to %r" % (name, value)
        return mutate

    def retype(dtype, value=None):
        def mutate(path, rng):
            with h5py.File(path, "r+") as f:
                name = pick(f, rng)
                data = np.array(f[name][()]).astype(dtype)
                if value is not None and data.size:
                    data.reshape(-1)[rng.randrange(data.size)] = value
                rewrite(f, name, data)
                return "'%s' rewritten as %s%s" % (name, np.dtype(dtype).name, "" if value is None else " holding %r" % value)
        return mutate

    def string_type(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng, floats=False)
            rewrite(f, name, np.array([b"not a number"] * max(1, min(4, f[name].size))))
            return "'%s' rewritten as strings" % name

    def reshape(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng)
            data = np.array(f[name][()])
            how = rng.choice(["transpose", "drop", "add", "flatten", "scalar", "extra dim", "empty"])
            if how == "transpose" and data.ndim >= 2:
                data = data.T.copy()
            elif how == "drop" and data.ndim >= 1 and data.shape[0] > 0:
                data = data[:-1]
            elif how == "add" and data.ndim >= 1:
                data = np.concatenate([data, data[:1]])
            elif how == "flatten":
                data = data.reshape(-1)
            elif how == "scalar":
                data = np.array(data.reshape(-1)[0] if data.size else 0, dtype=data.dtype)
            elif how == "empty":
                data = np.zeros((0,) + data.shape[1:], dtype=data.dtype)
            else:
                how = "extra dim"
                data = data.reshape((1,) + data.shape)
            rewrite(f, name, data)
            return "'%s' reshaped (%s) to %s" % (name, how, list(data.shape))

    def remove(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng, floats=False)
            del f[name]
            return "'%s' removed" % name

    def unwritten(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng)
            shape, dtype = f[name].shape, f[name].dtype
            del f[name]
            f.create_dataset(name, shape, dtype)
            return "'%s' created and never written" % name

    def unwritten_chunked(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng)
            shape, dtype = f[name].shape, f[name].dtype
            if not shape:
                return unwritten(path, rng)
            del f[name]
            f.create_dataset(name, shape, dtype, chunks=True, fillvalue=np.nan if dtype.kind == "f" else 0)
            return "'%s' chunked, never written, fill value NaN" % name

    def group(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng, floats=False)
            del f[name]
            f.create_group(name)
            return "'%s' replaced by a group" % name

    def soft_link(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng, floats=False)
            del f[name]
            f[name] = h5py.SoftLink("/nowhere/at/all")
            return "'%s' a soft link to nowhere" % name

    def external_link(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng, floats=False)
            del f[name]
            f[name] = h5py.ExternalLink("no_such_file.h5", "/x")
            return "'%s' an external link to a missing file" % name

    def virtual(path, rng):
        with h5py.File(path, "r+") as f:
            name = pick(f, rng)
            shape, dtype = f[name].shape, f[name].dtype
            if not shape:
                return remove(path, rng)
            del f[name]
            layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
            layout[...] = h5py.VirtualSource("no_such_source.h5", name, shape=shape)
            f.create_virtual_dataset(name, layout)
            return "'%s' virtual, its source file missing" % name

    def extra(path, rng):
        with h5py.File(path, "r+") as f:
            f["zz_extra"] = np.arange(5, dtype=np.float32)
            return "an extra dataset 'zz_extra'"

    def attribute(path, rng):
        with h5py.File(path, "r+") as f:
            objs = [f] + [f[d] for d in datasets(f)]
            obj = rng.choice(objs)
            keys = list(obj.attrs.keys())
            values = [np.nan, -1, 2 ** 31 - 1, 2 ** 62, -2 ** 40, "x" * 5000, b"\x1b[2J\n", 0, 1e300, np.array([1, 2, 3])]
            value = rng.choice(values)
            if keys and rng.random() < 0.8:
                key = rng.choice(keys)
                del obj.attrs[key]
                if rng.random() < 0.85:
                    obj.attrs[key] = value
                    return "attribute '%s' of '%s' set to %s" % (key, obj.name, printable(repr(value), 40))
                return "attribute '%s' of '%s' removed" % (key, obj.name)
            obj.attrs["zz_extra"] = value
            return "an extra attribute on '%s'" % obj.name

    def int_value(path, rng):
        with h5py.File(path, "r+") as f:
            ints = [d for d in datasets(f) if f[d].dtype.kind in "iu"]
            if not ints:
                return set_value(np.nan)(path, rng)
            name = rng.choice(ints)
            data = np.array(f[name][()])
            value = rng.choice([-1, 0, 2 ** 31 - 1, 2 ** 31, -2 ** 31, 2 ** 62, 10 ** 6, 7])
            big = data.astype(np.int64)
            if big.ndim == 0:
                big = np.array(value, dtype=np.int64)
            elif big.size:
                big.reshape(-1)[rng.randrange(big.size)] = value
            rewrite(f, name, big)
            return "integer '%s' given %d (as int64)" % (name, value)

    def truncate(path, rng):
        size = os.path.getsize(path)
        cut = rng.choice([0, rng.randrange(1, 2048), rng.randrange(size // 2), rng.randrange(size), size - 1])
        with open(path, "r+b") as f:
            f.truncate(cut)
        return "cut to %d of its %d bytes" % (cut, size)

    def flip(path, rng):
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            places = []
            for _ in range(rng.randrange(1, 9)):
                # the metadata (superblock, object headers, B-trees) lies mostly in the first few KB
                at = rng.randrange(min(size, 4096)) if rng.random() < 0.7 else rng.randrange(size)
                f.seek(at)
                old = f.read(1)
                f.seek(at)
                f.write(bytes([old[0] ^ rng.randrange(1, 256)]))
                places.append(at)
        return "bytes flipped at %s" % places

    def not_hdf5(path, rng):
        content = rng.choice([b"", b"\x89HDF\r\n\x1a\n", b"fc.0.weight,1,2,3\n" * 50, os.urandom(4096)])
        with open(path, "wb") as f:
            f.write(content)
        return "replaced by %d bytes that are not HDF5" % len(content)

    return [
        ("nan", set_value(float("nan"))), ("inf", set_value(float("inf"))), ("-inf", set_value(float("-inf"))),
        ("3e38", set_value(3e38)), ("-3e38", set_value(-3e38)), ("all 3e38", whole(3e38)), ("all 1e30", whole(1e30)),
        ("denormal", set_value(1e-45)), ("float64", retype(np.float64)), ("float64 1e300", retype(np.float64, 1e300)),
        ("float16", retype(np.float16)), ("int32", retype(np.int32)), ("uint8", retype(np.uint8)),
        ("strings", string_type), ("shape", reshape), ("removed", remove), ("unwritten", unwritten),
        ("unwritten chunked", unwritten_chunked), ("group", group), ("soft link", soft_link),
        ("external link", external_link), ("virtual", virtual), ("extra dataset", extra), ("attribute", attribute),
        ("integer", int_value), ("truncated", truncate), ("byte flips", flip), ("not HDF5", not_hdf5),
    ]


# Step 13's snapshot carries a checksum of its fields (common/records/snapshot.c, visit_snapshot's order, each as
# the program reads it): a mutated snapshot is resealed half the time, so that what lies behind the
# checksum is reached too.
SNAPSHOT_PARAMS = ["fc.0.weight", "fc.0.bias", "fc.2.weight", "fc.2.bias"]
SNAPSHOT_FIELDS = ([("settings/model_sizes", "<i8")] + [("settings/" + n, "<i8") for n in ("world_size", "batch_size", "accum_steps")] +
                   [("settings/lr", "<f8")] + [("settings/" + n, "<i8") for n in ("seed", "shuffle", "train_samples")] +
                   [(p, "<f4") for p in SNAPSHOT_PARAMS] + [("optimizer/exp_avg/" + p, "<f4") for p in SNAPSHOT_PARAMS] +
                   [("optimizer/exp_avg_sq/" + p, "<f4") for p in SNAPSHOT_PARAMS] +
                   [("optimizer/step", "<i8"), ("progress/epochs_done", "<i8"), ("progress/samples_done", "<i8"),
                    ("generator/mt19937", "<u4"), ("generator/index", "<i8"), ("losses/epoch", "<i8"), ("losses/loss", "<f4")])


def snapshot_checksum(f):
    """FNV-1a's multiply-xor over 8-byte words, then the bytes left (common/records/snapshot.c, checksum_add)."""
    import numpy as np
    h, mask = 14695981039346656037, (1 << 64) - 1
    for name, dtype in SNAPSHOT_FIELDS:
        data = np.asarray(f[name][()]).astype(dtype).tobytes()
        words = np.frombuffer(data[:len(data) // 8 * 8], "<u8").tolist()
        for w in words:
            h = ((h ^ w) * 1099511628211) & mask
        for b in data[len(data) // 8 * 8:]:
            h = ((h ^ b) * 1099511628211) & mask
    return h


def reseal_snapshot(path):
    import h5py
    import numpy as np
    try:
        with h5py.File(path, "r+") as f:
            f.attrs["checksum"] = np.uint64(snapshot_checksum(f))
        return True
    except Exception:  # a field missing or of another shape: the program meets that first
        return False


# ---------------------------------------------------------------- the fuzzer
class Fuzzer:
    def __init__(self, opts):
        self.opts = opts
        self.tree = os.path.abspath(opts.tree)
        self.results = os.path.abspath(opts.results)
        self.base = os.path.join(self.results, "base")
        self.sanitized = False
        self.counts = {}      # kind -> {verdict: n}
        self.failures = 0
        self.helps = {}
        self._h5 = None

    # ------------------------------------------------ set-up: the good inputs every mutation starts from
    def log(self, line):
        if self.opts.verbose:
            print("  " + line, flush=True)

    def setup(self):
        os.makedirs(self.base, exist_ok=True)
        probe = os.path.join(self.tree, "day1/2_mnist_training")
        if not os.access(probe, os.X_OK):
            raise SystemExit("error: %s: not built (make -j2 in %s)" % (probe, self.tree))
        with open(probe, "rb") as f:
            self.sanitized = b"__asan_init" in f.read()
        # MNIST as plain IDX files (the programs prefer them to .gz): a mutated copy of one beside links to the others.
        mnist_src = os.path.join(ROOT, "data/mnist")
        self.mnist = os.path.join(self.base, "mnist")
        os.makedirs(self.mnist, exist_ok=True)
        self.mnist_files = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
        for stem in self.mnist_files:
            out = os.path.join(self.mnist, stem)
            if not os.path.exists(out):
                src = os.path.join(mnist_src, stem)
                if os.path.exists(src):
                    shutil.copyfile(src, out + ".part")
                else:
                    with gzip.open(src + ".gz", "rb") as g, open(out + ".part", "wb") as f:
                        shutil.copyfileobj(g, f)
                os.rename(out + ".part", out)
        self.movielens = os.path.join(ROOT, "data/movielens")
        for name in ("ratings.csv", "movies.csv"):
            if not os.path.exists(os.path.join(self.movielens, name)):
                raise SystemExit("error: %s/%s: not there (make movielens)" % (self.movielens, name))
        with open(os.path.join(self.movielens, "ratings.csv"), "rb") as f:
            self.ratings = f.read()
        with open(os.path.join(self.movielens, "movies.csv"), "rb") as f:
            self.movies = f.read()
        # Tiny Shakespeare for steps 19 and 20 (make shakespeare): without it their cases are left out.
        self.text_dir = os.path.join(ROOT, "data/shakespeare")
        self.have_text = os.path.isfile(os.path.join(self.text_dir, "input.txt"))
        if self.have_text:
            with open(os.path.join(self.text_dir, "input.txt"), "rb") as f:
                self.text = f.read()
        self.h5_files = {}
        self.checkpoints = {}
        if "init" in self.opts.kinds or "snapshot" in self.opts.kinds or "text" in self.opts.kinds:
            self.make_h5_bases()
        if "checkpoint" in self.opts.kinds:
            self.make_checkpoint_bases()

    def base_run(self, program, np_, args, what):
        """Runs a program in a scratch folder of the base (data/ linked in) to make a valid input to mutate."""
        work = os.path.join(self.base, "work")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(os.path.join(work, "data"))
        os.symlink(self.mnist, os.path.join(work, "data", "mnist"))
        if self.have_text:
            os.symlink(self.text_dir, os.path.join(work, "data", "shakespeare"))
        done = subprocess.run(self.command(program, np_, args), cwd=work, env=self.env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=300)
        if done.returncode != 0:
            raise SystemExit("error: making the base %s: %s exited %d: %s" % (
                what, program, done.returncode, printable(done.stdout.decode(errors="replace"))))
        shutil.rmtree(work)

    def make_h5_bases(self):
        """Each program's own --save (and step 13's snapshot, step 11's MNIST file): valid files to mutate."""
        made = {
            "day1/2_mnist_training": ["--epochs", "1", "--plot", "", "--save", "{out}"],
            "day3/15_recommender_ddp": ["--data", os.path.join(self.base, "movielens"), "--epochs", "1",
                                        "--max_steps", "2", "--plot", "", "--save", "{out}"],
            "day4/16_pipeline_ddp": ["--epochs", "1", "--plot", "", "--save", "{out}"],
            "day4/17_tensor_parallel": ["--max_steps", "1", "--plot", "", "--save", "{out}"],
            "day4/18_zero_sharding": ["--max_steps", "1", "--plot", "", "--save", "{out}"],
            "day3/13_fault_tolerant_ddp": ["--total_epochs", "1", "--plot", "", "--snapshot", "{out}"],
            "day2/create_mnist_h5": ["--out", "{out}"],
        }
        if self.have_text:
            made["day5/19_gpt"] = self.argv(GPT_SHORT) + ["--save", "{out}"]
        os.makedirs(os.path.join(self.base, "movielens"), exist_ok=True)
        for name in ("ratings.csv", "movies.csv"):
            shutil.copyfile(os.path.join(self.movielens, name), os.path.join(self.base, "movielens", name))
        for program, args in made.items():
            out = os.path.join(self.base, program.split("/")[1] + ".h5")
            if not os.path.exists(out):
                self.base_run(program, 1, [a.replace("{out}", out + ".part") for a in args], "file " + out)
                os.rename(out + ".part", out)
            self.h5_files[program] = out

    # The sharded checkpoints to mutate: each program's own, saved on 2 ranks after its last step, and
    # how a run resumes it on np ranks (one step more). A resume may take another layout: the load reshards.
    CHECKPOINTED = {
        "day3/13_fault_tolerant_ddp": ({"--total_epochs": "1", "--plot": ""}, lambda rng, np_: ["--total_epochs", "2"]),
        "day4/16_pipeline_ddp": ({"--max_steps": "2", "--plot": "", "--pp": "2", "--batch_size": "64"},
                                 lambda rng, np_: ["--max_steps", "3", "--batch_size", "64", "--pp",
                                                   str(rng.choice([1, 2] if np_ == 2 else [1]))]),
        "day4/17_tensor_parallel": ({"--max_steps": "2", "--plot": "", "--tp": "2", "--batch_size": "64"},
                                    lambda rng, np_: ["--max_steps", "3", "--batch_size", "64", "--tp",
                                                      str(rng.choice([1, 2] if np_ == 2 else [1]))]),
        "day4/18_zero_sharding": ({"--max_steps": "2", "--plot": "", "--zero": "3", "--batch_size": "64"},
                                  lambda rng, np_: ["--max_steps", "3", "--batch_size", "64", "--zero", str(rng.randrange(4))]),
        "day5/19_gpt": (GPT_SHORT, lambda rng, np_: ["--max_iters", "3", "--eval_interval", "3"] +
                        (["--on_resize", rng.choice(["keep_batch", "scale_lr", "off"])] if rng.random() < 0.5 else [])),
        "day5/20_gpt_3d": (dict(GPT_SHORT, **{"--tp": "2"}),
                           lambda rng, np_: ["--max_iters", "3", "--eval_interval", "3"] + rng.choice(
                               [[], ["--tp", "2"], ["--pp", "2"], ["--dp", "2"]] if np_ == 2 else
                               [[], ["--dp", str(np_)]])),
    }

    def make_checkpoint_bases(self):
        for program, (args, _) in self.CHECKPOINTED.items():
            if program.startswith("day5/") and not self.have_text:
                continue
            out = os.path.join(self.base, program.split("/")[1] + ".checkpoint")
            if not os.path.exists(out):
                shutil.rmtree(out + ".part", ignore_errors=True)
                self.base_run(program, 2, self.argv(args) + ["--checkpoint", out + ".part"], "checkpoint " + out)
                os.rename(out + ".part", out)
            self.checkpoints[program] = out

    def h5(self):
        if self._h5 is None:
            self._h5 = h5_mutations()
        return self._h5

    def env(self):
        env = dict(os.environ)
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
            env.pop(name, None)
        env["CUDA_VISIBLE_DEVICES"] = ""   # the CPU path: a GPU would ignore the memory limit
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        # Open MPI as tests/run.sh's quick level starts it: a failed job killed at once, shared memory taken at once.
        env.setdefault("OMPI_MCA_odls_base_sigkill_timeout", "0")
        env.setdefault("OMPI_MCA_pml", "ob1")
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "detect_leaks=0") + \
            ":allocator_may_return_null=1:hard_rss_limit_mb=%d:malloc_limit_mb=%d" % (self.opts.mem_mb, self.opts.mem_mb)
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        return env

    # ------------------------------------------------ a run's folder and command
    def new_run(self, kind, index):
        run = os.path.join(self.results, "%s-%d-%d" % (kind, self.opts.seed, index))
        shutil.rmtree(run, ignore_errors=True)
        os.makedirs(os.path.join(run, "in"))
        # data/mnist: links to the plain files (a program that writes there writes into this folder);
        # data/movielens: a copy (--synthetic writes into --data); data/mnist.h5: step 11's default.
        os.makedirs(os.path.join(run, "data", "mnist"))
        for stem in self.mnist_files:
            os.symlink(os.path.join(self.mnist, stem), os.path.join(run, "data", "mnist", stem))
        os.makedirs(os.path.join(run, "data", "movielens"))
        for name, content in (("ratings.csv", self.ratings), ("movies.csv", self.movies)):
            with open(os.path.join(run, "data", "movielens", name), "wb") as f:
                f.write(content)
        if "day2/create_mnist_h5" in self.h5_files:
            os.symlink(self.h5_files["day2/create_mnist_h5"], os.path.join(run, "data", "mnist.h5"))
        if self.have_text:
            os.symlink(self.text_dir, os.path.join(run, "data", "shakespeare"))
        return run

    def command(self, program, np_, args):
        exe = os.path.join(self.tree, program)
        if np_ == 1:
            return [exe] + args
        mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
        if os.getuid() == 0:
            mpirun.append("--allow-run-as-root")
        return mpirun + [exe] + args

    # ------------------------------------------------ running one case and classifying it
    def limits(self):
        os.setsid()  # its own process group: a timeout kills mpirun and every rank it started
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 30, 4 << 30))
        if not self.sanitized:  # AddressSanitizer reserves terabytes of address space: its own limits instead
            limit = self.opts.mem_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def reap(self, marker, grace=1.0):
        """Processes of this run still alive once it ended (found by the marker in their environment:
        ranks that mpirun left, a child that made its own session): given `grace` seconds to go, then
        killed. Returns how many were left after the grace."""
        needle = ("FUZZ_RUN=" + marker).encode() + b"\0"

        def alive():
            found = []
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open("/proc/%s/environ" % pid, "rb") as f:
                            if needle in f.read() + b"\0":
                                found.append(int(pid))
                    except OSError:
                        pass
            return found
        deadline = time.time() + grace
        left = alive()
        while left and time.time() < deadline:
            time.sleep(0.1)
            left = alive()
        for _ in range(50):
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not alive():
                break
            time.sleep(0.1)
        return len(left)

    def run_case(self, kind, index, run, program, np_, args, what):
        cmd = self.command(program, np_, args)
        marker = "%s-%d-%d-%d" % (kind, self.opts.seed, index, os.getpid())
        env = self.env()
        env["FUZZ_RUN"] = marker
        before = set(self.files(run))
        with open(os.path.join(run, "stdout"), "wb") as out, open(os.path.join(run, "stderr"), "wb") as err:
            start = time.time()
            proc = subprocess.Popen(cmd, cwd=run, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    preexec_fn=self.limits)
            try:
                rc = proc.wait(timeout=self.opts.timeout)
                hung = False
            except subprocess.TimeoutExpired:
                hung = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                rc = proc.wait()
            seconds = time.time() - start
        stragglers = self.reap(marker, 0 if hung else 1.0)
        with open(os.path.join(run, "stdout"), "rb") as f:
            stdout = f.read()
        with open(os.path.join(run, "stderr"), "rb") as f:
            stderr = f.read()
        new_files = [p for p in self.files(run) if p not in before and p not in ("stdout", "stderr")]
        verdict, why = self.classify(run, np_, rc, hung, stdout, stderr, new_files)
        if stragglers and verdict in ("refused", "trained"):
            verdict, why = "crashed", "%d process(es) of the run still alive 1 s after it ended (killed)" % stragglers
        self.record(kind, index, run, cmd, what, verdict, why, seconds, stdout, stderr)

    @staticmethod
    def files(run):
        found = []
        for folder, dirs, names in os.walk(run):
            rel = os.path.relpath(folder, run)
            if rel == "data" or rel.startswith("data" + os.sep) or rel == "in" or rel.startswith("in" + os.sep):
                continue
            found += [os.path.normpath(os.path.join(rel, n)) for n in names]
        return found

    SANITIZER = re.compile(rb"ERROR: (AddressSanitizer|LeakSanitizer|ThreadSanitizer|MemorySanitizer)|runtime error:|"
                           rb"SUMMARY: (Address|UndefinedBehavior)Sanitizer")
    OURS = re.compile(rb"^(error:|\[rank \d+ @ )")
    # mpirun's own, now and then as a rank ends with an error on a busy machine: libevent finds the
    # rank's output pipe closed (open-mpi/ompi#2004, a known race; nothing of the program's).
    LIBEVENT = re.compile(rb"^\[warn\] Epoll (ADD|MOD|DEL)\(\d+\) on fd \d+ failed\.")
    NONFINITE = re.compile(rb"(?<![A-Za-z_])[-+]?(nan|inf)(?![A-Za-z_])", re.I)
    TEMP = re.compile(r"(^|/)(\.tmp\.|\.write-check\.)|\.tmp(\.\d+)?$")
    SIGNAL = re.compile(rb"exited on signal (\d+)|terminated with signal (\d+)|killed by signal (\d+)")
    OOM = re.compile(rb"out of memory|cannot allocate memory|std::bad_alloc|allocation-size-too-big|"
                     rb"requested allocation size|Cannot allocate memory", re.I)

    @staticmethod
    def control_bytes(data):
        return [b for b in data if (b < 32 and b not in (9, 10)) or b == 127]

    def classify(self, run, np_, rc, hung, stdout, stderr, new_files):
        if hung:
            return "hung", "still running after %d s" % self.opts.timeout
        if self.SANITIZER.search(stdout + stderr):
            line = self.SANITIZER.search(stdout + stderr)
            start = (stdout + stderr).rfind(b"\n", 0, line.start()) + 1
            return "crashed", "sanitizer: " + printable((stdout + stderr)[start:start + 200].split(b"\n")[0].decode(errors="replace"))
        if rc < 0:
            return "crashed", "signal %d (%s)" % (-rc, signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else "?")
        sig = self.SIGNAL.search(stderr)
        if sig:
            number = int(next(g for g in sig.groups() if g))
            return "crashed", "a rank ended by signal %d (%s)" % (number, signal.Signals(number).name
                                                                  if number in signal.Signals._value2member_map_ else "?")
        if rc > 128 and np_ == 1:
            return "crashed", "exit %d (a signal's status)" % rc
        temps = [p for p in new_files if self.TEMP.search(p)]
        if temps:
            return "crashed", "left temporary file(s): %s (exit %d)" % (", ".join(temps[:3]), rc)
        controls = self.control_bytes(stdout) + self.control_bytes(stderr)
        if rc == 0:
            if controls:
                return "crashed", "exit 0 but printed %d control byte(s) (first 0x%02x)" % (len(controls), controls[0])
            bad = self.NONFINITE.search(stdout)
            if bad:
                at = stdout.rfind(b"\n", 0, bad.start()) + 1
                return "crashed", "exit 0 but printed a non-finite number: " + printable(stdout[at:].split(b"\n")[0].decode(errors="replace"), 160)
            for path in new_files:
                problem = self.nonfinite_file(os.path.join(run, path))
                if problem:
                    return "crashed", "exit 0 but %s: %s" % (path, problem)
            return "trained", "exit 0"
        ours = [line for line in (stdout + stderr).split(b"\n") if self.OURS.match(line)]
        if np_ == 1:
            strays = [line for line in stderr.split(b"\n") if line and not self.OURS.match(line)]
        else:  # Open MPI's own messages stand between lines of dashes, or are mpirun's libevent warning
            strays, inside = [], False
            for line in stderr.split(b"\n"):
                if re.fullmatch(rb"-{10,}", line):
                    inside = not inside
                elif line and not inside and not self.OURS.match(line) and not self.LIBEVENT.match(line):
                    strays.append(line)
        first = printable(ours[0].decode(errors="replace"), 200) if ours else ""
        if len(ours) != 1 or strays:
            shown = printable(b" | ".join((ours + strays)[:3]).decode(errors="replace"), 240)
            return "crashed", "exit %d with %d line(s) of ours and %d other line(s) on stderr: %s" % (rc, len(ours), len(strays), shown)
        if controls:
            return "crashed", "exit %d, %d raw control byte(s) printed (first 0x%02x): %s" % (rc, len(controls), controls[0], first)
        if self.OOM.search(ours[0]):
            return "crashed", "an allocation failed under the fuzzer's %d MB limit (no estimate first): %s" % (self.opts.mem_mb, first)
        return "refused", "exit %d: %s" % (rc, first)

    def nonfinite_file(self, path):
        if path.endswith(".h5") and not os.path.islink(path):
            try:
                import h5py
                import numpy as np
            except ImportError:
                return None
            problems = []
            try:
                with h5py.File(path, "r") as f:
                    def visit(name, obj):
                        if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f" and obj.size:
                            data = obj[()]
                            if not np.all(np.isfinite(data)):
                                problems.append("dataset '%s' holds %d non-finite value(s)" % (name, np.size(data) - np.count_nonzero(np.isfinite(data))))
                    f.visititems(visit)
            except Exception as e:
                return "an unreadable HDF5 output (%s)" % printable(str(e), 100)
            return problems[0] if problems else None
        if path.endswith(".csv"):
            with open(path, "rb") as f:
                bad = self.NONFINITE.search(f.read())
            return "holds %r" % bad.group(0).decode() if bad else None
        return None

    def record(self, kind, index, run, cmd, what, verdict, why, seconds, stdout, stderr):
        counts = self.counts.setdefault(kind, {})
        counts[verdict] = counts.get(verdict, 0) + 1
        line = " ".join(shell_word(a) for a in cmd)
        rel = os.path.relpath(run)
        if rel.startswith(".."):
            rel = run
        if verdict in ("refused", "trained"):
            self.log("%-8s %s #%d (%s; %.1f s): %s" % (verdict, kind, index, what, seconds, why))
            if not self.opts.keep:
                shutil.rmtree(run, ignore_errors=True)
            return
        self.failures += 1
        with open(os.path.join(run, "repro.sh"), "w") as f:
            f.write("#!/usr/bin/env bash\n# %s #%d (seed %d): %s\n# verdict: %s: %s\ncd \"$(dirname \"$0\")\"\n"
                    "ulimit -v %d\nexport CUDA_VISIBLE_DEVICES= OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n%s\n"
                    % (kind, index, self.opts.seed, printable(what, 1000), verdict, printable(why, 1000),
                       self.opts.mem_mb << 10, line))
        os.chmod(os.path.join(run, "repro.sh"), 0o755)
        print("FAIL fuzz: %s: %s #%d, %s: %s; reproduce: %s/repro.sh (cd %s && CUDA_VISIBLE_DEVICES= %s)" % (
            verdict, kind, index, printable(what, 200), why, rel, rel, printable(line, 600)), flush=True)

    # ------------------------------------------------ the input kinds
    def case_csv(self, rng, run):
        recommend = rng.random() < 0.25
        target = "movies.csv" if recommend and rng.random() < 0.7 else "ratings.csv"
        content = bytearray(self.movies if target == "movies.csv" else self.ratings)
        lines_at = [0] + [i + 1 for i, b in enumerate(content) if b == 10][:-1] if len(content) < 4_000_000 else [0]
        row = rng.randrange(1, len(lines_at)) if len(lines_at) > 1 else 0
        at = lines_at[row]
        end = content.index(b"\n", at) if b"\n" in content[at:] else len(content)
        how = rng.choice(["flip", "control", "truncate", "header only", "empty", "no header", "overlong",
                          "number", "crlf", "no final newline", "columns", "junk", "long tail", "huge id",
                          "duplicates", "unicode"])
        if how == "flip":
            places = sorted(rng.randrange(len(content)) for _ in range(rng.randrange(1, 9)))
            for p in places:
                content[p] ^= rng.randrange(1, 256)
            what = "bytes flipped at %s" % places[:8]
        elif how == "control":
            byte = rng.choice([0, 1, 8, 11, 12, 13, 27, 127, 0x85 & 0x7f])
            p = rng.randrange(at, max(at + 1, end))
            content[p:p] = bytes([byte])
            what = "0x%02x inserted in line %d" % (byte, row + 1)
        elif how == "truncate":
            cut = rng.choice([rng.randrange(len(content)), rng.randrange(64), end - 1, at + 1])
            del content[cut:]
            what = "cut to %d bytes" % cut
        elif how == "header only":
            content = content[:content.index(b"\n") + 1]
            what = "the header alone"
        elif how == "empty":
            content = bytearray()
            what = "empty"
        elif how == "no header":
            del content[:content.index(b"\n") + 1]
            what = "no header line"
        elif how == "overlong":
            length = rng.choice([4095, 4096, 4097, 5008, 65536, 1 << 20, (1 << 20) + 7])
            text = (b"%0*d,1259,4.0,964538728" % (length - 19, 4)) if target == "ratings.csv" else \
                (b'1,"' + b"A" * (length - 20) + b'",Comedy')
            content[at:at] = text + b"\n"
            what = "a %d-byte line inserted as line %d" % (len(text), row + 1)
        elif how == "number":
            value = rng.choice([b"99999999999999999999", b"-1", b"0", b"2147483647", b"2147483648", b"-2147483649",
                                b"1e400", b"nan", b"inf", b"-inf", b"-0", b"4.0e38", b"", b" 4", b"0x10", b"5.5", b"6",
                                b"1e-400", b"4.", b".5", b"+4", b"4,0", b"9" * 400])
            fields = bytes(content[at:end]).split(b",")
            column = rng.randrange(len(fields))
            fields[column] = value
            content[at:end] = b",".join(fields)
            what = "line %d column %d set to %s" % (row + 1, column + 1, printable(value.decode(), 40))
        elif how == "crlf":
            content = bytearray(bytes(content).replace(b"\n", b"\r\n"))
            what = "CRLF line endings"
        elif how == "no final newline":
            content = content.rstrip(b"\n")
            what = "no newline at the end"
        elif how == "columns":
            fields = bytes(content[at:end]).split(b",")
            fields = fields[:-1] if rng.random() < 0.5 else fields + [b"7"]
            content[at:end] = b",".join(fields)
            what = "line %d with %d columns" % (row + 1, len(fields))
        elif how == "junk":
            n = rng.randrange(1, 4096)
            p = rng.randrange(len(content))
            content[p:p + n] = bytes(rng.randrange(256) for _ in range(n))
            what = "%d random bytes at byte %d" % (n, p)
        elif how == "long tail":
            content += b"7" * rng.choice([5000, 3 << 20])
            what = "a last line of %d bytes without a newline" % (len(content) - (bytes(content).rfind(b"\n") + 1))
        elif how == "huge id":
            value = rng.choice([b"2147483647", b"2000000000", b"1000000", b"65536", b"4294967297"])
            fields = bytes(content[at:end]).split(b",")
            column = rng.randrange(2) if target == "ratings.csv" else 0
            fields[column] = value
            content[at:end] = b",".join(fields)
            what = "line %d: id %s in column %d" % (row + 1, value.decode(), column + 1)
        elif how == "duplicates":
            line_bytes = bytes(content[at:end + 1])
            content[at:at] = line_bytes * rng.choice([2, 1000, 50000])
            what = "line %d repeated" % (row + 1)
        else:
            p = rng.randrange(at, max(at + 1, end))
            text = rng.choice(["é", "\u202e", "\ufeff", "日本", "\U0001F600"]).encode()
            if rng.random() < 0.5:
                text = text[:-1]  # a cut UTF-8 sequence
            content[p:p] = text
            what = "%s inserted in line %d" % (printable(text.decode(errors="backslashreplace")), row + 1)
        data = os.path.join(run, "in", "movielens")
        os.makedirs(data)
        for name, original in (("ratings.csv", self.ratings), ("movies.csv", self.movies)):
            with open(os.path.join(data, name), "wb") as f:
                f.write(bytes(content) if name == target else original)
        np_ = rng.choice([1, 1, 2, 3])
        args = ["--data", "in/movielens", "--epochs", "1", "--max_steps", "3", "--plot", "",
                "--embeddings", rng.choice(["dense", "sparse", "sharded"])]
        if rng.random() < 0.4:
            args += ["--save", "out.h5"]
        if recommend:
            args += ["--recommend", rng.choice(["1", "610", "7", "611", "-1"])]
        return "day3/15_recommender_ddp", np_, args, "%s: %s" % (target, what)

    def case_init(self, rng, run):
        target = rng.choice(["day1/2_mnist_training", "day1/6_mnist_ddp", "day3/15_recommender_ddp",
                             "day4/16_pipeline_ddp", "day4/17_tensor_parallel", "day4/18_zero_sharding",
                             "day2/11_multinode_streaming"] + (GPT_STEPS if self.have_text else []))
        base = self.h5_files["day2/create_mnist_h5" if target == "day2/11_multinode_streaming" else
                             "day1/2_mnist_training" if target == "day1/6_mnist_ddp" else
                             "day5/19_gpt" if target in GPT_STEPS else target]
        name, mutate = rng.choice(self.h5())
        path = os.path.join(run, "in", "init.h5")
        shutil.copyfile(base, path)
        what = mutate(path, rng)
        if os.path.exists(os.path.join(os.path.dirname(base), "no_such_source.h5")):
            pass
        np_ = rng.choice([1, 2, 3])
        args = short_args(target)
        if target == "day2/11_multinode_streaming":
            args["--h5"] = "in/init.h5"
        else:
            args["--init"] = "in/init.h5"
        if rng.random() < 0.5:
            args["--save"] = "out.h5"
        if target == "day3/15_recommender_ddp":
            args["--embeddings"] = rng.choice(["dense", "sparse", "sharded"])
        elif target == "day4/16_pipeline_ddp":
            np_ = rng.choice([1, 2])
            args["--pp"] = str(np_)
        elif target == "day4/17_tensor_parallel":
            np_ = rng.choice([1, 2])
            args["--tp"] = str(np_)
        elif target == "day4/18_zero_sharding":
            args["--zero"] = str(rng.randrange(4))
            args["--batch_size"] = "64"
        elif target == "day5/20_gpt_3d":
            np_ = rng.choice([1, 2])
            if np_ == 2:
                args[rng.choice(["--tp", "--pp", "--dp"])] = "2"
        return target, np_, self.argv(args), "%s (%s): %s" % (name, os.path.basename(base), what)

    def case_text(self, rng, run):
        program = rng.choice(GPT_STEPS)
        data = os.path.join(run, "in", "shakespeare")
        os.makedirs(data)
        path = os.path.join(data, "input.txt")
        content = bytearray(self.text)
        block = int(GPT_SHORT["--block_size"])
        least = 10 * (block + 1) + 10  # about the least a 90/10 split with a window in each part takes
        how = rng.choice(["empty", "cut", "nul", "control", "bytes", "one", "utf8", "no newline", "folder", "missing"])
        if how == "empty":
            content, what = bytearray(), "empty"
        elif how == "cut":
            cut = rng.choice([1, block, block + 1, 2 * block + 2, least - 11, least - 1, least, least + 1,
                              rng.randrange(least, 4 * least)])
            del content[cut:]
            what = "cut to %d bytes (a window and the character after it: %d)" % (cut, block + 1)
        elif how == "nul":
            for _ in range(rng.randrange(1, 50)):
                content[rng.randrange(len(content))] = 0
            what = "NUL bytes in it"
        elif how == "control":
            for _ in range(rng.randrange(1, 50)):
                content[rng.randrange(len(content))] = rng.choice([1, 7, 8, 13, 27, 127])
            what = "control bytes in it"
        elif how == "bytes":
            content = bytearray(range(256)) * rng.choice([1, 10, 100]) + content[:rng.randrange(1 << 16)]
            what = "every byte value (a vocabulary of 256), %d bytes" % len(content)
        elif how == "one":
            content = bytearray(rng.choice([b"a", b"\n", b"\x00", b"\xff"]) * rng.choice([least, 5000]))
            what = "one character only (a vocabulary of 1), %d bytes" % len(content)
        elif how == "utf8":
            content = bytearray("Schön, 日本語 — ünïcödé\n".encode() * rng.choice([20, 2000]))
            what = "UTF-8 text (multi-byte characters taken byte by byte)"
        elif how == "no newline":
            content = content.replace(b"\n", b" ")
            what = "no newline in 1 MB"
        elif how == "folder":
            os.makedirs(path)
            content, what = None, "a folder in its place"
        else:
            content, what = None, "no input.txt"
        if content is not None:
            with open(path, "wb") as f:
                f.write(bytes(content))
        np_ = rng.choice([1, 2])
        args = short_args(program)
        args["--data"] = "in/shakespeare"
        extra = ""
        if rng.random() < 0.25 and "day5/19_gpt" in self.h5_files:  # the weights of another vocabulary, or the same
            args["--init"] = self.h5_files["day5/19_gpt"]
            extra = "; --init of Tiny Shakespeare's 65 characters"
        if rng.random() < 0.3:
            args["--sample"] = str(rng.choice([1, 20]))
            args["--prompt"] = rng.choice(["ROMEO:", "\x01", "\x1b[2J", "日本", "z" * 100, "é"])
            extra += "; --sample %s --prompt %s" % (args["--sample"], printable(shell_word(args["--prompt"]), 30))
        if program == "day5/20_gpt_3d" and np_ == 2:
            args[rng.choice(["--tp", "--pp", "--dp"])] = "2"
        return program, np_, self.argv(args), "input.txt: %s%s" % (what, extra)

    def case_checkpoint(self, rng, run):
        program = rng.choice(sorted(self.checkpoints))
        folder = os.path.join(run, "checkpoint")
        shutil.copytree(self.checkpoints[program], folder)
        with open(os.path.join(folder, "current")) as f:
            step = f.read().strip()
        target = rng.choice(["index", "index", "shard", "shard", "current"])
        if target == "current":
            content = rng.choice([b"", b"step-999999", b"step-000002\n\x1b[2J", b"../../etc", b"x" * 5000,
                                  b"step-", os.urandom(64), None])
            os.remove(os.path.join(folder, "current"))
            if content is None:
                os.makedirs(os.path.join(folder, "current"))
                what = "current: a folder in its place"
            else:
                with open(os.path.join(folder, "current"), "wb") as f:
                    f.write(content)
                what = "current: %s" % printable(repr(content), 60)
        else:
            names = sorted(n for n in os.listdir(os.path.join(folder, step)) if n.startswith("shard-"))
            name = "index.h5" if target == "index" else rng.choice(names)
            label, mutate = rng.choice(self.h5())
            if rng.random() < 0.1:
                os.remove(os.path.join(folder, step, name))
                what = "%s/%s: removed" % (step, name)
            else:
                what = "%s/%s: %s: %s" % (step, name, label, mutate(os.path.join(folder, step, name), rng))
        if rng.random() < 0.25:
            return "tools/checkpoint_to_state_dict", 1, ["checkpoint", "out.h5"], what
        np_ = rng.choice([1, 2, 3])
        args = short_args(program)
        args.update(dict(zip(*[iter(self.CHECKPOINTED[program][1](rng, np_))] * 2)))
        args["--checkpoint"] = "checkpoint"
        return program, np_, self.argv(args), what

    def case_idx(self, rng, run):
        program = rng.choice(MNIST_STEPS + ["day2/create_mnist_h5"])
        stem = rng.choice(self.mnist_files)
        data = os.path.join(run, "in", "mnist")
        os.makedirs(data)
        for other in self.mnist_files:
            if other != stem:
                os.symlink(os.path.join(self.mnist, other), os.path.join(data, other))
        with open(os.path.join(self.mnist, stem), "rb") as f:
            content = bytearray(f.read())
        images = "images" in stem
        header = 16 if images else 8
        how = rng.choice(["truncate", "magic", "count", "dims", "labels", "gzip", "trailing", "empty", "folder",
                          "mismatch"])
        gz = False
        if how == "truncate":
            cut = rng.choice([rng.randrange(header + 1), rng.randrange(len(content)), len(content) - 1])
            what = "cut to %d of %d bytes" % (cut, len(content))
            del content[cut:]
        elif how == "magic":
            magic = rng.choice([b"\x00\x00\x08\x01", b"\x00\x00\x08\x03", b"\x00\x00\x0d\x03", b"\x00\x00\x08\x04",
                                b"\x00\x00\x08\x00", b"\x1f\x8b\x08\x00", b"\xff\xff\xff\xff", b"\x00\x00\x0b\x03"])
            content[0:4] = magic
            what = "magic %s" % magic.hex()
        elif how == "count":
            value = rng.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 60001, 10001, 59999])
            content[4:8] = value.to_bytes(4, "big")
            what = "count %d" % value
        elif how == "dims" and images:
            value = rng.choice([0, 1, 27, 29, 65535, 0xFFFFFFFF, 0x10000])
            field = rng.choice([8, 12])
            content[field:field + 4] = value.to_bytes(4, "big")
            what = "%s %d" % ("rows" if field == 8 else "columns", value)
        elif how == "labels" and not images:
            places = [rng.randrange(header, len(content)) for _ in range(rng.randrange(1, 5))]
            for p in places:
                content[p] = rng.choice([10, 11, 127, 255])
            what = "labels past 9 at bytes %s" % places
        elif how == "gzip":
            gz = True
            packed = bytearray(gzip.compress(bytes(content), compresslevel=1))
            choice = rng.choice(["flip", "cut", "trailing"])
            if choice == "flip":
                p = rng.randrange(len(packed))
                packed[p] ^= rng.randrange(1, 256)
                what = "gzip, byte %d of %d flipped" % (p, len(packed))
            elif choice == "cut":
                cut = rng.randrange(len(packed))
                del packed[cut:]
                what = "gzip cut to %d of %d bytes" % (cut, len(packed))
            else:
                packed += os.urandom(100)
                what = "gzip with 100 random bytes after it"
            content = packed
        elif how == "trailing":
            content += os.urandom(rng.choice([1, 783, 784, 100000]))
            what = "random bytes after the data"
        elif how == "empty":
            content = bytearray()
            what = "empty"
        elif how == "folder":
            os.makedirs(os.path.join(data, stem))
            content = None
            what = "a folder in its place"
        else:
            n = int.from_bytes(content[4:8], "big")
            item = 784 if images else 1
            content[4:8] = (n - 1).to_bytes(4, "big")
            del content[header + (n - 1) * item:]
            what = "one sample fewer than the other file"
        if content is not None:
            with open(os.path.join(data, stem + (".gz" if gz else "")), "wb") as f:
                f.write(bytes(content))
        np_ = rng.choice([1, 2, 3])
        args = short_args(program)
        args["--data"] = "in/mnist"
        if program == "day4/16_pipeline_ddp" and np_ > 1 and rng.random() < 0.5:
            args["--pp"] = str(np_)
        if program == "day4/17_tensor_parallel" and np_ == 2:
            args["--tp"] = "2"
        return program, np_, self.argv(args), "%s: %s" % (stem, what)

    def case_snapshot(self, rng, run):
        name, mutate = rng.choice(self.h5())
        path = os.path.join(run, "in", "snap.h5")
        shutil.copyfile(self.h5_files["day3/13_fault_tolerant_ddp"], path)
        what = mutate(path, rng)
        if rng.random() < 0.5 and reseal_snapshot(path):
            what += " (checksum resealed)"
        np_ = rng.choice([1, 2, 3])
        args = short_args("day3/13_fault_tolerant_ddp")
        args["--total_epochs"] = "2"
        args["--snapshot"] = "in/snap.h5"
        if rng.random() < 0.3:
            args["--save"] = "out.h5"
        return "day3/13_fault_tolerant_ddp", np_, self.argv(args), "%s: %s" % (name, what)

    # Flag values by the kind of value a flag takes (its metavar in --help).
    INTS = ["0", "1", "2", "3", "-1", "-2", "7", "2147483647", "2147483648", "-2147483648", "-2147483649",
            "9223372036854775807", "18446744073709551616", "99999999999999999999999", "", " ", "abc", "1e3", "1.5",
            " 1", "1 ", "0x10", "+3", "-0", "010", "\n", "1\n2", "\x1b[2J", "9" * 5000, "\u0663", "\udcff", "1\r"]
    # Flags whose large valid values only make the run long (or write a large file): their invalid values,
    # and small ones.
    DURATION = {"--epochs", "--total_epochs", "--max_steps", "--iters", "--count", "--synthetic", "--save_every",
                "--fail_at_epoch"}
    REFUSED_INTS = ["0", "-2", "2147483648", "-2147483649", "99999999999999999999", "", "abc", "1e3", "1.5", " 1",
                    "1 ", "0x2", "\n", "1\n", "\x1b[2J", "9" * 5000, "\u0663", "\udcff"]
    FLOATS = ["0", "-1", "1e-3", "0.1", "1e308", "1e309", "-1e308", "1e-320", "nan", "NaN", "inf", "-inf",
              "Infinity", "3e38", "1e-45", "0x1p3", "1e", "", ".", "1,5", "1e-3\n", "\x1b[2J", "1" * 5000, "-0"]
    LISTS = ["128", "1", "0", "1,1", ",", "128,", ",128", "128,,128", "-1", "2147483647", "2147483648", "64," * 40 + "64",
             "3,5", "", "1e3", "128 ,128", "128\n", "8,8,8,8,8,8,8,8", "4096,4096", "65536", "\x1b"]
    BAD_FLAGS = ["--bogus", "-x", "--", "---epochs", "--epochs=", "=", "foo", "--EPOCHS", "--lr=", "--no-shuffle=1",
                 "--help=1", "-", "--\x1b[2J", "--" + "a" * 5000, "--batch-size", "--data"]
    OUT_PATHS = ["", ".", "sub/", "a/b/c/out.x", "out\n.x", "x" * 300, ("d" * 200 + "/") * 25 + "f",
                 "existing_dir", "/proc/nope/out.x", "in", "\x1b[2J.x", "out.x/"]
    IN_PATHS = ["", "/nonexistent/file", "/dev/null", "/dev/zero", "existing_dir", "in/empty", "in/text",
                "in/random", "x" * 5000, "in/\n"]

    def values_for(self, flag, metavar, program, rng):
        if flag in ("--threads",):
            return self.INTS[:9] + ["1024", "1025", "", "abc"]
        if flag in self.DURATION:
            small = ["1", "2"] if flag not in ("--count", "--synthetic", "--iters") else ["1", "3", "1000", "100000"]
            if flag == "--fail_at_epoch":
                small = []
            if flag == "--count":
                small.append("2147483647")  # a huge allocation: refused by an estimate, or caught by the limit
            return self.REFUSED_INTS + small
        if flag == "--batch_size":
            values = self.REFUSED_INTS + ["7", "6400", "60000", "60001", "100000", "2147483647"]
            if "--max_steps" in self.helps[program]:
                values.append("1")
            return values
        if flag == "--dropout":
            return self.FLOATS + ["1", "0.999999", "1.0000001"]
        if metavar == "TEXT":
            return ["", "ROMEO:", "\x01", "\x1b[2J", "a\nb", "日本", "x" * 5000, "\udcff"]
        if flag in ("--mlflow",):
            return ["mlruns", "", "http://", "http://127.0.0.1:1", "ftp://x", "file:mlruns", "mlruns\n",
                    "sub/dir/mlruns", "/proc/nope/mlruns", "http://[::1", "http://" + "a" * 3000, "existing_dir"]
        if metavar in ("N", "K", "P", "T", "M", "E", "R", "USER", "STAGE", "LEVEL"):
            return self.INTS
        if metavar in ("X", "MiB"):
            return self.FLOATS + (self.INTS if metavar == "MiB" else [])
        if metavar.startswith("W,"):
            return self.LISTS
        if "|" in metavar:
            choices = metavar.split("|")
            return choices + ["", "CPU", choices[0] + " ", "x", choices[0] + "\n", "\x1b[2J", choices[0] * 1000]
        if metavar == "NAME":
            return ["", "x" * 5000, "a\nb", "\x1b[2J", "../../x", "/", "日本", "\udcff"]
        if flag in ("--init", "--compare", "--h5", "--snapshot", "--results") or metavar == "DIR":
            return self.IN_PATHS + (self.OUT_PATHS if flag in ("--snapshot", "--results") else [])
        if metavar.startswith("FILE") or metavar == "URI":
            return self.OUT_PATHS
        return [""]

    def case_flags(self, rng, run):
        program = rng.choice([p for p in FLAG_STEPS if self.have_text or p not in GPT_STEPS])
        table = self.helps[program]
        args = short_args(program)
        extra = []
        chosen = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            if rng.random() < 0.12:
                bad = rng.choice(self.BAD_FLAGS)
                extra.append(bad)
                chosen.append(printable(bad, 40))
                continue
            flag = rng.choice(sorted(table))
            metavar = table[flag]
            if flag == "--help":
                continue
            if metavar == "":
                args[flag] = None
                chosen.append(flag)
                continue
            value = rng.choice(self.values_for(flag, metavar, program, rng))
            if rng.random() < 0.1:
                extra += [flag + "=" + value]
            else:
                args[flag] = value
            chosen.append("%s %s" % (flag, printable(shell_word(value), 50)))
        if "--mlflow" in args and args["--mlflow"] is not None and not args["--mlflow"].startswith("http"):
            pass  # a folder store, written in the run's folder (relative paths)
        # inputs the path values name
        os.makedirs(os.path.join(run, "existing_dir"))
        open(os.path.join(run, "in", "empty"), "wb").close()
        with open(os.path.join(run, "in", "text"), "w") as f:
            f.write("step,epoch,loss\n1,1,nan\n2,1,inf\nnot,a,number\n")
        with open(os.path.join(run, "in", "random"), "wb") as f:
            f.write(rng.randbytes(4096) if hasattr(rng, "randbytes") else os.urandom(4096))
        np_ = rng.choice([1, 1, 2, 3])
        if program == "day5/20_gpt_3d" and np_ > 1 and not {"--dp", "--tp", "--pp"} & set(args):
            args["--dp"] = str(np_)  # the grid must be the world (else every such run is the same refusal)
        return program, np_, self.argv(args) + extra, "; ".join(chosen) or "the short run's flags"

    @staticmethod
    def argv(args):
        out = []
        for flag, value in args.items():
            out += [flag] if value is None else [flag, value]
        return out

    def read_helps(self):
        for program in FLAG_STEPS:
            exe = os.path.join(self.tree, program)
            if not os.access(exe, os.X_OK):
                continue
            text = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=self.env(), timeout=60).stdout.decode(errors="replace")
            table = {}
            for line in text.splitlines():
                m = re.match(r"^  (--[a-z_-]+)(?: (\S+))?", line)
                if m:
                    table[m.group(1)] = m.group(2) or ""
            self.helps[program] = table

    # ------------------------------------------------ the loop
    def run(self):
        self.setup()
        self.read_helps()
        makers = {"csv": self.case_csv, "init": self.case_init, "idx": self.case_idx, "snapshot": self.case_snapshot,
                  "text": self.case_text, "checkpoint": self.case_checkpoint, "flags": self.case_flags}
        kinds = [k for k in KINDS if k in self.opts.kinds]
        if not self.have_text and "text" in kinds:
            print("  fuzz: text: left out, no %s/input.txt (make shakespeare)" % self.text_dir, flush=True)
            kinds.remove("text")
        deadline = time.time() + self.opts.minutes * 60 if self.opts.minutes else None
        index = 0
        if self.opts.only:  # KIND:INDEX
            kind, _, at = self.opts.only.partition(":")
            if kind not in kinds or not at.isdigit():
                raise SystemExit("error: --only %s: expected KIND:INDEX, KIND one of %s" % (printable(self.opts.only, 60), ", ".join(kinds)))
            kinds, index, self.opts.count, deadline = [kind], int(at), int(at) + 1, None
        while True:
            for kind in kinds:
                # Every case draws from its own generator, seeded by (seed, kind, index): a case is
                # reproducible alone (--only KIND:INDEX), whatever ran before it.
                rng = random.Random("%d/%s/%d" % (self.opts.seed, kind, index))
                run = self.new_run(kind, index)
                try:
                    program, np_, args, what = makers[kind](rng, run)
                except Exception as e:  # a mutation that h5py or numpy cannot make: the fuzzer's bug, not the program's
                    print("  fuzz: %s #%d: the mutation failed (%s: %s); case skipped" % (
                        kind, index, type(e).__name__, printable(str(e), 200)), flush=True)
                    shutil.rmtree(run, ignore_errors=True)
                    continue
                if not os.access(os.path.join(self.tree, program), os.X_OK):
                    shutil.rmtree(run, ignore_errors=True)
                    continue
                what = "%s on %d rank%s, %s" % (program.split("/")[1], np_, "" if np_ == 1 else "s", what)
                self.run_case(kind, index, run, program, np_, args, what)
            index += 1
            if deadline is not None:
                if time.time() >= deadline:
                    break
            elif index >= self.opts.count:
                break
        for kind in kinds:
            counts = self.counts.get(kind, {})
            total = sum(counts.values())
            summary = ", ".join("%d %s" % (counts[v], v) for v in ("refused", "trained", "crashed", "hung") if counts.get(v))
            if total and not counts.get("crashed") and not counts.get("hung"):
                print("PASS fuzz: %s: %d runs (seed %d), %s" % (kind, total, self.opts.seed, summary), flush=True)
            elif total:
                print("  fuzz: %s: %d runs (seed %d), %s" % (kind, total, self.opts.seed, summary), flush=True)
        return 1 if self.failures else 0


# ---------------------------------------------------------------- the classifier's own check
def self_test(opts):
    """Each verdict from a stand-in program, through the same run and classification: the fuzzer can fail."""
    opts.seed, opts.keep = 0, False
    fuzzer = Fuzzer(opts)
    fuzzer.sanitized = False
    cases = [
        ("refused", 1, ["bash", "-c", "echo 'error: --x expects a number, got 'y' (see --help)' >&2; exit 2"]),
        ("refused", 2, ["bash", "-c", "echo '[rank 0 @ h] f.c:1: bad file' >&2; printf -- '-----------\\nOpen MPI says\\n-----------\\n' >&2; exit 1"]),
        ("refused", 2, ["bash", "-c", "echo '[rank 0 @ h] f.c:1: bad file' >&2; echo '[warn] Epoll MOD(1) on fd 23 failed. Old events "
                                      "were 6; read change was 0 (none): Bad file descriptor' >&2; exit 1"]),
        ("trained", 1, ["bash", "-c", "echo 'Test accuracy: 97.1%'; echo 'info: inference done'"]),
        ("crashed", 1, ["bash", "-c", "kill -SEGV $$"]),
        ("crashed", 1, ["bash", "-c", "echo '[rank 0 @ h] a' >&2; echo '[rank 1 @ h] a' >&2; exit 1"]),
        ("crashed", 1, ["bash", "-c", "echo 'error: got a\nb' >&2; exit 2"]),
        ("crashed", 1, ["bash", "-c", "printf 'error: got \\033[2J\\n' >&2; exit 2"]),
        ("crashed", 1, ["bash", "-c", "echo 'Test RMSE -nan'"]),
        ("crashed", 1, ["bash", "-c", "echo 'loss inf'"]),
        ("crashed", 1, ["bash", "-c", "echo 'error: x' >&2; echo '==1==ERROR: AddressSanitizer: heap-buffer-overflow' >&2; exit 1"]),
        ("crashed", 1, ["bash", "-c", "echo 'f.c:3:5: runtime error: signed integer overflow'"]),
        ("crashed", 1, ["bash", "-c", "touch out.h5.tmp.123; echo 'error: disk full' >&2; exit 1"]),
        ("crashed", 1, ["bash", "-c", "echo '[rank 0 @ h] f.c:2: out of memory allocating 9 bytes' >&2; exit 1"]),
        ("crashed", 1, ["/usr/bin/python3", "-c", "import h5py, numpy; h5py.File('w.h5', 'w')['a'] = numpy.array([numpy.nan], 'f4')"]),
        ("crashed", 1, ["bash", "-c", "printf 'step,epoch,loss\\n1,1,nan\\n' > l.csv"]),
        ("crashed", 1, ["/usr/bin/python3", "-c", "bytearray(8 << 30)"]),  # the memory limit: MemoryError, a traceback
        ("hung", 1, ["bash", "-c", "sleep 60"]),
        ("hung", 1, ["bash", "-c", "(setsid sleep 60 &); sleep 60"]),
        ("crashed", 1, ["bash", "-c", "(setsid sleep 60 &); echo trained"]),  # a process left behind
    ]
    opts.timeout = 2
    failed = 0
    for i, (want, np_, cmd) in enumerate(cases):
        run = os.path.join(fuzzer.results, "self-test-%d" % i)
        shutil.rmtree(run, ignore_errors=True)
        os.makedirs(run)
        marker = "self-test-%d-%d" % (i, os.getpid())
        env = fuzzer.env()
        env["FUZZ_RUN"] = marker
        with open(os.path.join(run, "stdout"), "wb") as out, open(os.path.join(run, "stderr"), "wb") as err:
            proc = subprocess.Popen(cmd, cwd=run, env=env, stdout=out, stderr=err, preexec_fn=fuzzer.limits)
            try:
                rc, hung = proc.wait(timeout=opts.timeout), False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc, hung = proc.wait(), True
        left = fuzzer.reap(marker, 0 if hung else 1.0)
        with open(os.path.join(run, "stdout"), "rb") as f:
            stdout = f.read()
        with open(os.path.join(run, "stderr"), "rb") as f:
            stderr = f.read()
        files = [p for p in fuzzer.files(run) if p not in ("stdout", "stderr")]
        got, why = fuzzer.classify(run, np_, rc, hung, stdout, stderr, files)
        if left and got in ("refused", "trained"):
            got, why = "crashed", "%d process(es) left behind" % left
        shutil.rmtree(run, ignore_errors=True)
        alive = fuzzer.reap(marker, 0)
        shown = printable(" ".join(cmd[2:] if cmd[0] == "bash" else cmd[1:]), 100)
        if got == want and alive == 0:
            print("PASS fuzz classifier: %s -> %s (%s)%s" % (shown, got, why, ", its stray process reaped" if left else ""))
        else:
            failed += 1
            print("FAIL fuzz classifier: %s -> %s (%s), expected %s%s" % (shown, got, why, want,
                                                                           "; %d process(es) left" % alive if alive else ""))
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=36, help="seeds every mutation (default: 36)")
    parser.add_argument("--count", type=int, default=5, help="runs per input kind (default: 5)")
    parser.add_argument("--minutes", type=float, default=0, help="run for this long instead, kinds taking turns")
    parser.add_argument("--kinds", default=",".join(KINDS), help="which input kinds (default: all)")
    parser.add_argument("--only", default="", help="KIND:INDEX: that one case alone (as a FAIL line names it)")
    parser.add_argument("--tree", default=ROOT, help="the built tree whose programs run (default: this checkout)")
    parser.add_argument("--results", default=os.path.join(ROOT, "build/fuzz"),
                        help="where reproducers land (default: build/fuzz)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds a run may take before it counts as hung")
    parser.add_argument("--mem_mb", type=int, default=3072, help="address space per process, MB (default: 3072)")
    parser.add_argument("--keep", action="store_true", help="keep the folders of runs that passed too")
    parser.add_argument("--self-test", action="store_true", help="check the classifier on stand-in programs")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line for every run")
    opts = parser.parse_args()
    opts.kinds = [k for k in opts.kinds.split(",") if k]
    unknown = set(opts.kinds) - set(KINDS)
    if unknown:
        parser.error("--kinds: unknown %s (expected %s)" % (", ".join(sorted(unknown)), ", ".join(KINDS)))
    os.makedirs(opts.results, exist_ok=True)
    if opts.self_test:
        return self_test(opts)
    return Fuzzer(opts).run()


if __name__ == "__main__":
    sys.exit(main())
