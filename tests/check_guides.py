#!/usr/bin/env python3
"""Run the commands of the guides and of the programs' headers, and check the
outputs they show.

    tests/check_guides.py [--show] [FILE ...]   (default: day*/README.md and day*/*.c)

--show prints, under each FAIL, everything the command printed: the block to paste
into the guide when the program's output changed (docs/tests.md says how, on the
guides' kernels).

Guides (Markdown) mark what to run with HTML comments, which do not show:
    <!-- run: COMMAND -->          run it (it must exit 0); its output is not shown
    <!-- output of: COMMAND -->    run it, and check the fenced block that follows
    <!-- output of: COMMAND (exit N) -->   the same, for a command that must exit N
    <!-- output of: COMMAND (exit N without a GPU) -->   ... where there is no GPU (else not run)
    <!-- output of (slow): COMMAND -->      run by make test-all only (TEST_LEVEL=all)
    <!-- output of (kernels): COMMAND -->   every result depends on the BLAS kernels (a CNN's
                                             whole epoch): compared only under the guides' kernels
A header whose command a guide runs with options takes the same options.
A command whose program is not built here (step 1 without CUDA) is not run: one SKIP line.
COMMAND must also be a line of one of the guide's ```sh blocks (a trailing
`# comment` aside), so that what is checked is what the reader types. Commands
run in document order, in one scratch folder per file that looks like the
repository root (the programs, data/mnist, data/movielens, data/shakespeare) but keeps what they write (img/,
checkpoints/, data/mnist.h5) away from the reader's own.

A program's header comment shows an expected output after a line that starts
with "Expected output"; its command is the first line of the header that runs
the program (mpirun ..., or the program's path), with --oversubscribe added to
mpirun. A header whose output is of several nodes is not run.

How an expected block is compared with what the command printed:
  - every line of the block must be found among the printed lines, in any order
    (ranks print in any order), each printed line matching one expected line at most;
  - "..." stands for anything: a line of "..." for lines left out, "..." inside a
    line for the rest of it; a note after two spaces, "   (the same on every rank)",
    is the guide's, not the program's;
  - spacing counts, as the program prints it (a table whose columns moved fails); a
    masked field in a table's column (after two spaces or more) keeps its right edge,
    and may only push it right where its value grew (a slower machine's time);
  - what varies from run to run or machine to machine is masked on both sides:
    times and rates ("0.11 s", "545760 samples/s", "71.3 ms", "GB/s"), shares of
    time ("(26%)", "100.0%"; accuracies have two decimals and stay), host names,
    the device and threads at the end of a program's first line, the MPI library's
    version;
  - lines that hold only measurements (profile tables, timing tables, the DDP:
    and Data: reports, peak memory) are not compared;
  - the guides show the results of the BLAS kernels that README.md names (OpenBLAS's
    SkylakeX), and every number is compared exactly where the command runs those
    kernels. Where it runs others (OPENBLAS_CORETYPE, another CPU), what sums through
    BLAS may differ in its last bits, and so in its printed digits:
      - a loss or an RMSE (after "loss", "Loss:", "RMSE") is compared within
        LOSS_UNITS units of its last printed digit,
      - an accuracy ("80.44%" after "accuracy", "(8044 of 10000)") within
        ACCURACY_SAMPLES test samples,
      - parameter checksums are not compared (one SKIP line names the kernels),
      - a block marked (kernels) is not compared (one SKIP line names the kernels);
    every other number (byte counts, memory, schedules, shapes, sums of
    collectives, counts of steps) is compared exactly on every kernel, and so are
    the results of programs that sum nothing through BLAS (step 15's), since
    they print the same digits everywhere.
Prints PASS/FAIL/SKIP lines (tests/run.sh counts them); exits 1 on a FAIL.
"""
import collections
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300  # seconds a command may take (step 14's epoch on a slow machine)

# ------------------------------------------------------------- comparing lines
UNIT = r'(?:s|ms|us|µs|seconds|samples/s|tokens/s|[KMG]B/s|GFLOP/s)'
MASKS = [
    (re.compile(r'\d+(?:\.\d+)?\s?' + UNIT + r'(?![\w/])'), '<time>'),
    (re.compile(r'(?<![\d.])\d+(?:\.\d)?%'), '<share>'),           # 26%, 100.0%; not 89.14%
    (re.compile(r'@ [\w.-]+\]'), '@ <host>]'),                     # [rank 0 @ vm]
    (re.compile(r'ranks? on [\w.-]+\)'), 'ranks on <host>)'),      # (1 node, 2 ranks on vm)
    (re.compile(r'\bhost [\w.-]+'), 'host <host>'),
    (re.compile(r'MPI \((?:Open MPI|MPICH|Intel)[^)]*\)'), 'MPI (<mpi>)'),
    # A program's first line ends with its device: "; cpu, 2 threads, OpenBLAS 0.3.21 (X kernels)".
    (re.compile(r'; (?:cpu|cuda:\d+)\b.*$'), '; <device>'),
]
CHECKSUM = re.compile(r'(checksum) [0-9a-f]{16}')
UNCOMPARED = [re.compile(p) for p in (
    r'^Profile on ', r'^range\s+calls', r'^\s*[\w+ -]+?\s+\d+\s+[\d.]+ \[[\d.]+\]',  # step 5's table
    r'^The ranges inside', r'^Peak memory', r'^Trace: ',
    r'^world size\s+runs\s+median', r'^\s*\d+\s+\d+\s+[\d.]+\s+[\d.]+\.\.[\d.]+\s+[\d.]+x',  # step 7's table
    r'^collective\s+size', r'^[a-z-]+\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+$',  # step 12's
    r'^DDP: ', r'^Data: ', r'^Snapshots: ', r'training loop: ',
)]
KERNELS = re.compile(r'\((\w+) kernels\)')


def mask(line, compare_checksums):
    """LINE with what varies replaced by tokens. A masked field that is a table's column (two or
    more spaces before it) keeps its right edge: the token is right-aligned where the field ended,
    so the columns after it stay where the program put them."""
    line = line.rstrip()
    for pattern, token in MASKS:
        def replace(m):
            pad, field = m.group('pad'), m.expand(token)
            if len(pad) < 2:  # in a sentence: "in 3.49 seconds"
                return pad + field
            return ' ' * max(2, len(m.group(0)) - len(field)) + field
        line = re.sub(r'(?P<pad> *)' + pattern.pattern, replace, line)
    if not compare_checksums:
        line = CHECKSUM.sub(r'\1 <checksum>', line)
    return line


def column_padding(regex):
    """In an expected line's regex, the padding before a masked column: as shown, or less (the
    field grew on a slower machine: " 113.41 ms" where the guide shows "  13.41 ms"), never more
    (a column that moved right since the guide was made)."""
    return re.sub(r' {2,}(?=<[a-z]+>)', lambda m: ' {1,%d}' % len(m.group(0)), regex)


# Off the guides' kernels, the results that sum through BLAS, with how far each may move: a loss or
# an RMSE LOSS_UNITS units of its last printed digit, an accuracy ACCURACY_SAMPLES of MNIST's 10000
# test samples (as a count, or as a percentage with two decimals). Measured: the Haswell and
# Cooperlake kernels move the deeper MLPs of Day 4 by up to 3 samples and their losses by 1 unit.
LOSS_UNITS = 5
ACCURACY_SAMPLES = 10
RESULTS = re.compile(r'(?:(?<=\b[Ll]oss )|(?<=\b[Ll]oss: )|(?<=\bRMSE )|(?<=\b[Aa]ccuracy )|(?<=\b[Aa]ccuracy: ))'
                     r'(?P<value>\d+\.\d+)(?P<percent>%?)|(?<=\()(?P<count>\d+)(?= of \d+\))')
# Programs whose results sum nothing through BLAS: they print the same digits on every kernel, and
# are compared exactly there too (make test-all's second-kernel run proves it).
BLAS_FREE = ('day3/15_recommender_ddp',)
SLOT = '\ue000'  # where a result stood, while the rest of the line is escaped


def tolerance(match):
    """(the value shown, how far the printed one may be from it) for a RESULTS match."""
    if match.group('count'):
        return int(match.group('count')), ACCURACY_SAMPLES
    text = match.group('value')
    if match.group('percent'):
        return float(text), ACCURACY_SAMPLES * 100 / 10000
    return float(text), LOSS_UNITS * 10 ** -len(text.split('.')[1])


def expected_regex(line, tolerant=False):
    """An expected line (already masked) as a regex: '...' matches anything. TOLERANT: each result
    (RESULTS) matches any number, and comes with its value and tolerance, in order."""
    line = re.sub(r'\s{2,}\([^()]*\)$', '', line)  # the guide's note: "   (the same on every rank)"
    bounds = []
    if tolerant:
        bounds = [tolerance(m) for m in RESULTS.finditer(line)]
        line = RESULTS.sub(lambda m: SLOT + (m.group('percent') or ''), line)
    parts = [re.escape(part) for part in line.split('...')]
    regex = column_padding('.*'.join(parts).replace(r'\ ', ' ')).replace(SLOT, r'(\d+(?:\.\d+)?)')
    return re.compile(regex + r'\s*$'), bounds


def compare(expected, printed, compare_checksums, tolerant=False):
    """The expected lines not found among the printed ones, how many were compared, and the results
    that were not the same but within their tolerance (TOLERANT: off the guides' kernels), as
    (shown, printed) pairs."""
    printed = [mask(line, compare_checksums) for line in printed]
    used = [False] * len(printed)
    missing, compared, moved = [], 0, []
    for raw in expected:
        line = mask(raw, compare_checksums)
        if not line.strip() or line.strip() == '...' or any(p.search(line) for p in UNCOMPARED):
            continue
        compared += 1
        pattern, bounds = expected_regex(line, tolerant)
        for i, candidate in enumerate(printed):
            m = pattern.match(candidate) if not used[i] else None
            if m and all(abs(float(got) - shown) <= bound + 1e-9
                         for got, (shown, bound) in zip(m.groups(), bounds)):
                used[i] = True
                moved += [(shown, got) for got, (shown, _) in zip(m.groups(), bounds) if float(got) != shown]
                break
        else:
            missing.append(raw.rstrip())
    return missing, compared, moved


def closest(line, printed):
    """The printed line that shares the longest start with LINE: a hint for the reader of a FAIL."""
    def shared(other):
        n = 0
        while n < min(len(line), len(other)) and line[n] == other[n]:
            n += 1
        return n
    return max(printed, key=shared, default='(nothing)')


# ------------------------------------------------------------- what to run
MARKER = re.compile(r'^<!-- (run|output of)(?: \(([a-z, ]+)\))?: (.*?)(?: \(exit (\d+)( without a GPU)?\))? -->$')
MPIRUN = r'(?:mpirun(?:\s+--?[\w-]+(?:\s+\d+)?)*\s+)?'  # "mpirun -np 2 " before a program, or nothing
ALL = os.environ.get('TEST_LEVEL') == 'all'  # make test-all: the slow checks too
SHOW = False  # --show: a FAIL shows all that the command printed


def sanitized_build():
    """A SANITIZE=1 build (make test SANITIZE=1): AddressSanitizer reserves terabytes of address space
    for its shadow as a program starts, so nothing of it runs under `ulimit -v`."""
    try:
        with open(os.path.join(ROOT, 'build', 'flags')) as f:
            return '-fsanitize=address' in f.read()
    except OSError:
        return False


# One command to run: its expected lines (None: it must only exit with `status`),
# where the file says so, the marker's options (slow, kernels), and, for a check
# that cannot run, why: ('SKIP' or 'FAIL', the reason), with `command` None.
Check = collections.namedtuple('Check', 'command expected status where options problem',
                               defaults=(None, None, 0, '', frozenset(), None))


def guide_checks(path):
    """A Check for each marker of a guide, in order."""
    lines = open(path, encoding='utf-8').read().split('\n')
    shown, fence = set(), None
    for line in lines:
        if line.startswith('```'):
            fence = None if fence is not None else line[3:].strip()
        elif fence == 'sh':
            shown.add(re.sub(r'\s+#.*$', '', line).strip())
    checks = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        kind, command, status = m.group(1), m.group(3), int(m.group(4) or 0)
        where = f'line {i + 1}'
        options = frozenset(option.strip() for option in (m.group(2) or '').split(',') if option.strip())
        if options - {'slow', 'kernels'}:
            checks.append(Check(where=where, problem=('FAIL', f'unknown option(s) {sorted(options)}: slow, kernels')))
            continue
        if m.group(5) and has_gpu():
            checks.append(Check(where=where, problem=('SKIP', 'shows what happens without a GPU')))
            continue
        if command not in shown:
            checks.append(Check(where=where, problem=('FAIL', f'"{command}" is in no ```sh block of the guide: '
                                                      'the reader would not type it')))
            continue
        expected = None
        if kind == 'output of':
            j = i + 1
            while j < len(lines) and not lines[j].startswith('```'):
                j += 1
            k = j + 1
            while k < len(lines) and not lines[k].startswith('```'):
                k += 1
            expected = lines[j + 1:k]
        checks.append(Check(command, expected, status, where, options))
    return checks


def header_checks(path):
    """The Checks of a program's header comment: its commands, the last with its expected output."""
    header = []
    for line in open(path, encoding='utf-8'):
        if not line.startswith('//'):
            break
        header.append(line[2:].rstrip('\n'))
    program = os.path.splitext(os.path.relpath(path, ROOT))[0]
    start = next((i for i, line in enumerate(header) if line.strip().startswith('Expected output')), None)
    if start is None:
        return []
    if re.search(r'\bnodes\b', header[start]):
        return [Check(where='header', problem=('SKIP', 'its expected output is of several nodes (run under Slurm)'))]
    # The header's commands up to the first that runs the program: those before it
    # make what it reads (step 8's img/2_losses.csv, step 11's data/mnist.h5).
    commands = []
    for line in header[:start]:
        text = re.sub(r'^\s*(?:or on one machine:)?\s*', '', line)
        text = re.sub(r'\s+(?:#.*|\(.*\)|\[.*\])$', '', text).strip()
        if not re.match(MPIRUN + r'day\d/\w+(?:\s|$)', text):
            continue
        if text.startswith('mpirun') and '--oversubscribe' not in text:
            text = text.replace('mpirun', 'mpirun --oversubscribe', 1)
        commands.append(text)
        if re.match(MPIRUN + re.escape(program) + r'(?:\s|$)', text):
            break
    else:
        return [Check(where='header', problem=('SKIP', 'no line of its header runs it'))]
    # The block: the lines indented under "Expected output", after any prose.
    block = header[start + 1:]
    first = next((i for i, line in enumerate(block) if line.startswith('   ')), len(block))
    expected = []
    for line in block[first:]:
        if not line.startswith('   '):
            break
        expected.append(line[3:])
    if any('cuda:' in line for line in expected) and not has_gpu():
        return [Check(where='header', problem=('SKIP', 'its expected output is on GPUs, and this machine has none'))]
    return [Check(command, where='header') for command in commands[:-1]] + [Check(commands[-1], expected, 0, 'header')]


@functools.lru_cache(maxsize=None)
def has_gpu():
    return os.environ.get('CUDA_VISIBLE_DEVICES', None) != '' and shutil.which('nvidia-smi') is not None and \
        subprocess.run(['nvidia-smi', '-L'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def scratch_root():
    """A folder that looks like the repository root to the commands."""
    where = tempfile.mkdtemp(prefix='guides.')
    for entry in os.listdir(ROOT):
        if entry in ('data', 'img', 'checkpoints', 'log', 'log_ddp', '.git'):
            continue
        os.symlink(os.path.join(ROOT, entry), os.path.join(where, entry))
    os.mkdir(os.path.join(where, 'data'))
    os.symlink(os.path.join(ROOT, 'data', 'mnist'), os.path.join(where, 'data', 'mnist'))
    if os.path.isdir(os.path.join(ROOT, 'data', 'movielens')):  # step 15's (make movielens)
        os.symlink(os.path.join(ROOT, 'data', 'movielens'), os.path.join(where, 'data', 'movielens'))
    if os.path.isdir(os.path.join(ROOT, 'data', 'shakespeare')):  # step 19's (make shakespeare)
        os.symlink(os.path.join(ROOT, 'data', 'shakespeare'), os.path.join(where, 'data', 'shakespeare'))
    return where


def run(command, where):
    env = dict(os.environ)
    if os.geteuid() == 0:  # what the guides ask a root user to export
        env.update(OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
    try:
        done = subprocess.run(['bash', '-c', command], cwd=where, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, ['(timed out after %d s)' % TIMEOUT]
    return done.returncode, done.stdout.decode('utf-8', 'replace').split('\n')


@functools.lru_cache(maxsize=None)
def machine_kernels():
    """The kernels OpenBLAS runs here ({'SkylakeX'}), as build/tools/blas_kernels names them; none
    where it is not built or the BLAS is not OpenBLAS."""
    tool = os.path.join(ROOT, 'build', 'tools', 'blas_kernels')
    if not os.access(tool, os.X_OK):
        return frozenset()
    done = subprocess.run([tool], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return frozenset(m.group(1) for m in KERNELS.finditer(done.stdout.decode('utf-8', 'replace')))


def guides_kernel():
    text = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    m = re.search(r'the guides show[\s>]+those of the (\w+) kernels', text)
    return m.group(1) if m else None


def main(files):
    failed = 0
    kernel = guides_kernel()
    if kernel is None:
        print('FAIL guides: README.md no longer says which kernels the checksums are of '
              '("the guides show those of the X kernels")')
        return 1
    checksums_skipped = None
    outputs = {}  # a header's command run already by its guide: its output
    checks_of = {path: guide_checks(path) if path.endswith('.md') else header_checks(path) for path in files}
    # A header's command that a guide runs takes the guide's options.
    options_of = {check.command: check.options for checks in checks_of.values() for check in checks if check.options}
    for path in files:
        rel = os.path.relpath(path, ROOT)
        checks = checks_of[path]
        if not checks:
            continue
        where = scratch_root()
        try:
            for command, expected, status, where_in_file, _, problem in checks:
                if problem:
                    verdict, reason = problem
                    print(f'{verdict} guides: {rel} ({where_in_file}): {reason}')
                    failed += verdict == 'FAIL'
                    continue
                options = options_of.get(command, frozenset())
                program = next((w for w in command.split() if re.match(r'day\d/\w+$', w)), None)
                if program and not os.access(os.path.join(ROOT, program), os.X_OK):
                    print(f'SKIP guides: {rel} ({where_in_file}): {command}: {program} is not built on this machine')
                    continue
                if program == 'day3/15_recommender_ddp' and '--synthetic' not in command and \
                        not os.path.isfile(os.path.join(ROOT, 'data', 'movielens', 'ratings.csv')):
                    print(f'SKIP guides: {rel} ({where_in_file}): {command}: no MovieLens in data/movielens (make movielens)')
                    continue
                if program == 'day5/19_gpt' and not os.path.isfile(os.path.join(ROOT, 'data', 'shakespeare', 'input.txt')):
                    print(f'SKIP guides: {rel} ({where_in_file}): {command}: no Tiny Shakespeare in data/shakespeare (make shakespeare)')
                    continue
                if 'ulimit -v' in command and sanitized_build():
                    print(f'SKIP guides: {rel} ({where_in_file}): {command}: a SANITIZE=1 build cannot run under ulimit -v')
                    continue
                if 'slow' in options and not ALL:
                    print(f'SKIP guides: {rel} ({where_in_file}): {command}: slow, make test-all runs it')
                    continue
                if path.endswith('.c') and command in outputs:
                    code, printed = outputs[command]
                else:
                    code, printed = run(command, where)
                    outputs[command] = (code, printed)
                what = f'{rel} ({where_in_file}): {command}'
                if code != status:
                    print(f'FAIL guides: {what}: exit status {code}, expected {status}; its last lines:')
                    for line in printed[-6:]:
                        print('    ' + line)
                    failed += 1
                    continue
                if expected is None:
                    print(f'PASS guides: {what}: ran (exit {status})')
                    continue
                # The kernels its programs name on their first lines; a command that names none (paste
                # of two programs' CSVs) ran this machine's.
                ran_kernels = {m.group(1) for line in printed for m in KERNELS.finditer(line)} or machine_kernels()
                same_kernels = ran_kernels <= {kernel}
                if 'kernels' in options and not same_kernels:
                    print(f'SKIP guides: {what}: its results depend on the BLAS kernels: this machine runs '
                          f'OpenBLAS\'s {", ".join(sorted(ran_kernels))} kernels, the guide shows the {kernel} kernels\'')
                    continue
                if not same_kernels and any(CHECKSUM.search(line) for line in expected):
                    checksums_skipped = ', '.join(sorted(ran_kernels))
                tolerant = not same_kernels and program not in BLAS_FREE
                missing, compared, moved = compare(expected, printed, same_kernels, tolerant)
                if compared == 0:
                    print(f'FAIL guides: {what}: the block after it has no line to compare')
                    failed += 1
                elif missing:
                    print(f'FAIL guides: {what}: {len(missing)} of {compared} expected line{"s" if compared != 1 else ""} not printed'
                          + (f' (OpenBLAS\'s {", ".join(sorted(ran_kernels))} kernels: results compared within '
                             f'{LOSS_UNITS} units of a loss\'s last digit, {ACCURACY_SAMPLES} test samples of an accuracy)'
                             if tolerant else '') + ':')
                    for line in missing[:4]:
                        print(f'    expected: {line}')
                        print(f'    closest:  {closest(line, printed)}')
                    if SHOW:
                        print('    what it printed:')
                        while printed and not printed[-1].strip():
                            printed = printed[:-1]
                        for line in printed:
                            print('    | ' + line)
                    failed += 1
                elif moved:
                    print(f'PASS guides: {what}: {compared} line{"s" if compared != 1 else ""} as shown, within '
                          f'the tolerance of OpenBLAS\'s {", ".join(sorted(ran_kernels))} kernels for '
                          + ', '.join(f'{got} (shown: {shown:g})' for shown, got in moved))
                else:
                    print(f'PASS guides: {what}: {compared} line{"s" if compared != 1 else ""} as shown')
        finally:
            shutil.rmtree(where, ignore_errors=True)
    if checksums_skipped:
        print(f'SKIP guides: parameter checksums not compared: this machine runs OpenBLAS\'s '
              f'{checksums_skipped} kernels, the guides show the {kernel} kernels\' (README.md, Before you run)')
    return 1 if failed else 0


if __name__ == '__main__':
    args = sys.argv[1:]
    SHOW = '--show' in args
    args = [arg for arg in args if arg != '--show']
    os.chdir(ROOT)
    files = [os.path.abspath(f) for f in args] or \
        sorted(glob.glob(os.path.join(ROOT, 'day*', 'README.md'))) + \
        sorted(glob.glob(os.path.join(ROOT, 'day*', '*.c')))
    sys.exit(main(files))
