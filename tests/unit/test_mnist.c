// test_mnist.c: the IDX reader accepts exactly the files whose header matches
// their contents (plain or gzip) and names the problem otherwise; mnist_load,
// mnist_gather and mnist_batch deliver pixels / 255 and labels; the sampler
// follows torch's DistributedSampler position by position, and, when python3
// has torch, agrees with torch's own output.
//
// Every file is written here, in a temporary directory, so the test needs no
// download. mnist_load's error paths call FATAL (exit), so they are left to the
// integration tests that run the real programs.
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "base/rng.h"
#include "data/mnist.h"

#define TEST_NAME "test_mnist"
#include "test.h"

enum { N_IMAGES = 12 };  // >= 8, so a labels file is long enough to reach the magic check as 3-D

static char dir[] = "/tmp/test_mnist_XXXXXX";

static const char *tmp_path(const char *name) {
    static char paths[16][512];  // a few live at once; the ring is far larger than needed
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, size, f) != size || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static void write_gz(const char *path, const void *bytes, size_t size) {
    gzFile f = gzopen(path, "wb");
    if (!f || gzwrite(f, bytes, (unsigned)size) != (int)size || gzclose(f) != Z_OK) {
        fprintf(stderr, "%s: gzip write failed\n", path);
        exit(1);
    }
}

// An IDX file in memory: big-endian magic and dims, then `data` (prod(dims) bytes).
static uint8_t *make_idx(uint32_t magic, int ndim, const uint32_t *dims, const uint8_t *data, size_t *size) {
    size_t payload = 1;
    for (int d = 0; d < ndim; d++) payload *= dims[d];
    *size = 4 + 4 * (size_t)ndim + payload;
    uint8_t *buf = malloc(*size + 64);  // slack for the "trailing bytes" case
    uint32_t words[4] = {magic, dims[0], ndim > 1 ? dims[1] : 0, ndim > 2 ? dims[2] : 0};
    for (int w = 0; w <= ndim; w++)
        for (int b = 0; b < 4; b++) buf[4 * w + b] = (uint8_t)(words[w] >> (24 - 8 * b));
    memcpy(buf + 4 + 4 * ndim, data, payload);
    return buf;
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    rewind(f);
    char *buf = malloc(*size);
    if (fread(buf, 1, *size, f) != *size) *size = 0;
    fclose(f);
    return buf;
}

// idx_read must fail with a message that contains `keyword`.
static void expect_rejected(const char *what, const char *path, int ndim, const char *keyword) {
    IdxArray a;
    char err[512] = "";
    bool ok = idx_read(path, ndim, &a, err, sizeof err);
    EXPECT(!ok && strstr(err, keyword) && !a.data, "idx_read rejects %s (%d-D), message mentions \"%s\": %s%s",
           what, ndim, keyword, ok ? "ACCEPTED" : "", err);
    idx_free(&a);
}

// torch's DistributedSampler.__iter__ transcribed independently of mnist.c:
// build the padded list by appending the start of the list until its length
// is a multiple of W, then take every W-th entry from `rank`.
static int reference_sampler(int n, int world, int rank, bool shuffle, uint64_t seed, int epoch, int *out) {
    int num_samples = (n + world - 1) / world, total = num_samples * world;
    int *padded = malloc((size_t)total * sizeof(int));
    if (shuffle) {
        Rng rng;
        rng_seed(&rng, seed + (uint64_t)epoch);
        rng_randperm(&rng, n, padded);
    } else {
        for (int i = 0; i < n; i++) padded[i] = i;
    }
    for (int len = n; len < total;) {  // W > N pads with several copies
        int take = total - len < n ? total - len : n;
        memcpy(padded + len, padded, (size_t)take * sizeof(int));
        len += take;
    }
    for (int k = 0; k < num_samples; k++) out[k] = padded[rank + k * world];
    free(padded);
    return num_samples;
}

// All ranks of one configuration against the reference, plus coverage and padding.
static void check_sampler(int n, int world, bool shuffle, uint64_t seed, int epoch) {
    int expected_per_rank = (n + world - 1) / world, mismatches = 0, total = 0, missing = 0, padding = 0;
    int *count = calloc((size_t)n, sizeof(int)), *ref = malloc((size_t)expected_per_rank * sizeof(int));
    for (int r = 0; r < world; r++) {
        DistributedSampler s = sampler_new(n, world, r, shuffle, seed);
        sampler_set_epoch(&s, epoch);
        int m = reference_sampler(n, world, r, shuffle, seed, epoch, ref);
        mismatches += s.num_samples != m || memcmp(s.indices, ref, (size_t)m * sizeof(int)) != 0;
        for (int k = 0; k < s.num_samples; k++) count[s.indices[k]]++;
        total += s.num_samples;
        sampler_free(&s);
    }
    for (int i = 0; i < n; i++) missing += count[i] == 0, padding += count[i] > 1 ? count[i] - 1 : 0;
    EXPECT(mismatches == 0 && missing == 0 && padding == total - n && total == expected_per_rank * world,
           "sampler N=%d W=%d %s, epoch %d: %d of %d ranks differ from the reference, %d samples never drawn, "
           "%d repeats (expected padding %d = %d - %d)", n, world, shuffle ? "shuffled" : "in order",
           epoch, mismatches, world, missing, padding, total - n, total, n);
    free(count);
    free(ref);
}

// This rank's indices for one epoch, into `out`.
static void sampler_epoch(int n, int world, int rank, uint64_t seed, int epoch, int *out) {
    DistributedSampler s = sampler_new(n, world, rank, true, seed);
    sampler_set_epoch(&s, epoch);
    memcpy(out, s.indices, (size_t)s.num_samples * sizeof(int));
    sampler_free(&s);
}

// Run python3, read whitespace-separated ints from its stdout; returns how many.
static int python_ints(const char *script, int *out, int capacity) {
    char command[2048];
    snprintf(command, sizeof command, "/usr/bin/python3 -c '%s' 2>&1", script);
    FILE *p = popen(command, "r");
    int n = 0;
    while (p && n < capacity && fscanf(p, "%d", &out[n]) == 1) n++;
    if (p) pclose(p);
    return n;
}

static void test_torch_parity(void) {
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        printf("SKIP %s: torch parity (needs /usr/bin/python3 with torch: ./setup.sh --with-reference)\n", TEST_NAME);
        return;
    }
    enum { PERM_N = 20, CAP = 15000 };
    static int ours[CAP], theirs[CAP];
    Rng rng;
    rng_seed(&rng, 7);
    rng_randperm(&rng, PERM_N, ours);
    int got = python_ints("import torch; g = torch.Generator().manual_seed(7); "
                          "print(*torch.randperm(20, generator=g).tolist())", theirs, CAP);
    EXPECT(got == PERM_N && memcmp(ours, theirs, PERM_N * sizeof(int)) == 0,
           "rng_randperm(seed 7, n 20) equals torch.randperm (torch gave %d numbers, first %d %d %d, ours %d %d %d)",
           got, theirs[0], theirs[1], theirs[2], ours[0], ours[1], ours[2]);

    // The brief's small case and the real one: MNIST's 60000 samples on 4 ranks.
    const struct { int n, world, rank, epoch; uint64_t seed; } cases[] = {{23, 3, 1, 2, 7}, {60000, 4, 3, 1, 0}};
    for (int c = 0; c < 2; c++) {
        char script[1024];
        snprintf(script, sizeof script,
                 "from torch.utils.data import DistributedSampler as S; "
                 "s = S(range(%d), num_replicas=%d, rank=%d, shuffle=True, seed=%d); s.set_epoch(%d); "
                 "print(*list(iter(s)))",
                 cases[c].n, cases[c].world, cases[c].rank, (int)cases[c].seed, cases[c].epoch);
        got = python_ints(script, theirs, CAP);
        int m = (cases[c].n + cases[c].world - 1) / cases[c].world;
        sampler_epoch(cases[c].n, cases[c].world, cases[c].rank, cases[c].seed, cases[c].epoch, ours);
        EXPECT(got == m && memcmp(ours, theirs, (size_t)m * sizeof(int)) == 0,
               "DistributedSampler(N=%d, W=%d, rank=%d, shuffle, seed=%d) epoch %d equals torch's "
               "(%d of %d indices from torch, first %d %d %d, ours %d %d %d)", cases[c].n, cases[c].world,
               cases[c].rank, (int)cases[c].seed, cases[c].epoch, got, m, theirs[0], theirs[1], theirs[2],
               ours[0], ours[1], ours[2]);
    }
}

int main(void) {
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;

    // ---------------------------------------------------------------- IDX files
    // A pixel pattern that takes all 256 values (7 is odd), so gather sees each.
    static uint8_t pixels[N_IMAGES * MNIST_PIXELS];
    uint8_t labels[N_IMAGES];
    for (int i = 0; i < N_IMAGES * MNIST_PIXELS; i++) pixels[i] = (uint8_t)(i * 7 + 3);
    for (int i = 0; i < N_IMAGES; i++) labels[i] = (uint8_t)((i * 3) % 10);
    size_t images_size, labels_size, size;
    uint8_t *images_idx = make_idx(0x803, 3, (uint32_t[]){N_IMAGES, 28, 28}, pixels, &images_size);
    uint8_t *labels_idx = make_idx(0x801, 1, (uint32_t[]){N_IMAGES}, labels, &labels_size);
    write_file(tmp_path("images"), images_idx, images_size);
    write_file(tmp_path("labels"), labels_idx, labels_size);
    write_gz(tmp_path("images.gz"), images_idx, images_size);

    IdxArray a;
    char err[512] = "";
    bool ok = idx_read(tmp_path("images"), 3, &a, err, sizeof err);
    EXPECT(ok && a.ndim == 3 && a.dims[0] == N_IMAGES && a.dims[1] == 28 && a.dims[2] == 28 &&
               memcmp(a.data, pixels, sizeof pixels) == 0,
           "3-D IDX reads back as [%d, %d, %d] with its bytes (expected [%d, 28, 28]) %s", a.dims[0], a.dims[1],
           a.dims[2], N_IMAGES, err);
    idx_free(&a);
    ok = idx_read(tmp_path("images.gz"), 3, &a, err, sizeof err);
    EXPECT(ok && a.dims[0] == N_IMAGES && memcmp(a.data, pixels, sizeof pixels) == 0,
           "the same file gzip-compressed reads back identically %s", err);
    idx_free(&a);
    ok = idx_read(tmp_path("labels"), 1, &a, err, sizeof err);
    EXPECT(ok && a.ndim == 1 && a.dims[0] == N_IMAGES && memcmp(a.data, labels, N_IMAGES) == 0,
           "1-D IDX reads back as [%d] with its bytes (expected [%d]) %s", a.dims[0], N_IMAGES, err);
    idx_free(&a);

    // Each malformed file, and the keyword its message must carry.
    write_file(tmp_path("empty"), "", 0);
    write_file(tmp_path("short"), images_idx, 10);  // a 3-D header is 16 bytes
    uint8_t *bad_magic = make_idx(0xdeadbeef, 3, (uint32_t[]){N_IMAGES, 28, 28}, pixels, &size);
    write_file(tmp_path("bad_magic"), bad_magic, size);
    write_file(tmp_path("truncated"), images_idx, images_size - 100);
    memset(images_idx + images_size, 0, 5);
    write_file(tmp_path("trailing"), images_idx, images_size + 5);
    uint8_t *zero_dim = make_idx(0x803, 3, (uint32_t[]){0, 28, 28}, pixels, &size);
    write_file(tmp_path("zero_dim"), zero_dim, size);
    char *gz = slurp(tmp_path("images.gz"), &size);
    write_file(tmp_path("cut.gz"), gz, size / 2);

    expect_rejected("an empty file", tmp_path("empty"), 3, "empty");
    expect_rejected("10 bytes, shorter than the header", tmp_path("short"), 3, "short");
    expect_rejected("a labels file (magic 0x0801) read as images", tmp_path("labels"), 3, "magic");
    expect_rejected("an images file (magic 0x0803) read as labels", tmp_path("images"), 1, "magic");
    expect_rejected("random magic 0xdeadbeef", tmp_path("bad_magic"), 3, "magic");
    expect_rejected("data 100 bytes short", tmp_path("truncated"), 3, "truncated");
    expect_rejected("5 bytes past the data", tmp_path("trailing"), 3, "trailing");
    expect_rejected("a zero dimension", tmp_path("zero_dim"), 3, "dimension");
    expect_rejected("a gzip stream cut in half", tmp_path("cut.gz"), 3, "gzip");
    expect_rejected("a nonexistent path", tmp_path("no_such_file"), 3, "open");
    free(bad_magic), free(zero_dim), free(gz);

    // ---------------------------------------------------------------- the data set
    // Plain images and gzipped labels: mnist_load takes either form of each file.
    if (mkdir(tmp_path("mnist"), 0700) != 0) return perror("mkdir"), 1;
    write_file(tmp_path("mnist/train-images-idx3-ubyte"), images_idx, images_size);
    write_gz(tmp_path("mnist/train-labels-idx1-ubyte.gz"), labels_idx, labels_size);
    MnistSplit split = mnist_load(tmp_path("mnist"), MNIST_TRAIN);
    int label_errors = 0;
    for (int i = 0; i < split.n && i < N_IMAGES; i++) label_errors += split.labels[i] != labels[i];
    EXPECT(split.n == N_IMAGES && label_errors == 0 && memcmp(split.images, pixels, sizeof pixels) == 0,
           "mnist_load (plain images, .gz labels) gives n=%d (expected %d), %d wrong labels, pixels %s", split.n,
           N_IMAGES, label_errors, memcmp(split.images, pixels, sizeof pixels) ? "differ" : "identical");

    int indices[] = {5, 0, 11, 5};
    Tensor x = tensor_zeros(4, MNIST_PIXELS, DEVICE_CPU);
    int got_labels[4], bad_pixels = 0;
    mnist_gather(&split, indices, 4, &x, got_labels);
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < MNIST_PIXELS; k++)
            bad_pixels += x.data[r * MNIST_PIXELS + k] != (float)pixels[indices[r] * MNIST_PIXELS + k] / 255.0f;
        label_errors += got_labels[r] != labels[indices[r]];
    }
    EXPECT(bad_pixels == 0 && label_errors == 0,
           "mnist_gather of samples {5, 0, 11, 5}: %d pixels differ from (float)p / 255.0f, %d wrong labels",
           bad_pixels, label_errors);

    // ---------------------------------------------------------------- sampler
    // Hand-computed anchors first (no shuffle, N=3 on W=5: padded 0 1 2 0 1).
    DistributedSampler s = sampler_new(10, 4, 1, false, 0);
    EXPECT(s.num_samples == 3 && s.indices[0] == 1 && s.indices[1] == 5 && s.indices[2] == 9,
           "N=10 W=4 rank 1 without shuffle takes {1, 5, 9} (got %d: {%d, %d, %d})", s.num_samples, s.indices[0],
           s.indices[1], s.indices[2]);
    sampler_free(&s);
    s = sampler_new(3, 5, 4, false, 0);
    EXPECT(s.num_samples == 1 && s.indices[0] == 1, "N=3 W=5 rank 4 takes {1}: padding wraps (got %d: {%d})",
           s.num_samples, s.indices[0]);
    sampler_free(&s);

    const int configs[][2] = {{10, 3}, {10, 4}, {7, 2}, {3, 5}, {12, 4}, {1, 3}};
    for (int c = 0; c < 6; c++)
        for (int shuffle = 0; shuffle < 2; shuffle++)
            for (int epoch = 0; epoch < 2; epoch++) check_sampler(configs[c][0], configs[c][1], shuffle, 42, epoch);

    enum { N = 50, W = 2, M = N / W };
    int e0[M], e1[M], e0_again[M], other_seed[M];
    sampler_epoch(N, W, 0, 42, 0, e0);
    sampler_epoch(N, W, 0, 42, 1, e1);
    sampler_epoch(N, W, 0, 42, 0, e0_again);
    sampler_epoch(N, W, 0, 43, 0, other_seed);
    EXPECT(memcmp(e0, e1, sizeof e0) != 0, "epochs 0 and 1 give different orders (first %d vs %d)", e0[0], e1[0]);
    EXPECT(memcmp(e0, e0_again, sizeof e0) == 0, "two samplers made separately agree on seed 42 epoch 0");
    EXPECT(memcmp(e0, other_seed, sizeof e0) != 0, "seeds 42 and 43 give different orders");
    s = sampler_new(N, W, 0, true, 42);
    sampler_set_epoch(&s, 1);
    sampler_set_epoch(&s, 0);
    EXPECT(memcmp(s.indices, e0, sizeof e0) == 0, "set_epoch(1) then set_epoch(0) restores epoch 0's order");

    // A resumed epoch (sampler_set_epoch_from): after k steps of batch B on W
    // ranks, the rest of the epoch is exactly the batches k, k + 1, ... of the
    // whole epoch on every rank, padding included.
    const int resume_cases[][3] = {{10, 3, 1}, {10, 3, 2}, {7, 2, 1}, {50, 4, 3}, {12, 4, 1}, {60, 7, 2}};
    int resume_mismatches = 0, resume_checked = 0;
    for (int c = 0; c < 6; c++) {
        int n = resume_cases[c][0], world = resume_cases[c][1], batch = resume_cases[c][2];
        for (int r = 0; r < world; r++) {
            DistributedSampler whole = sampler_new(n, world, r, true, 7), rest = sampler_new(n, world, r, true, 7);
            sampler_set_epoch(&whole, 2);
            for (int k = 1; (long)k * world * batch < n; k++) {
                sampler_set_epoch_from(&rest, 2, (long)k * world * batch);
                resume_mismatches += rest.num_samples != whole.num_samples - k * batch ||
                                     memcmp(rest.indices, whole.indices + k * batch,
                                            (size_t)rest.num_samples * sizeof(int)) != 0;
                resume_checked++;
            }
            sampler_free(&whole);
            sampler_free(&rest);
        }
    }
    EXPECT(resume_mismatches == 0 && resume_checked > 30,
           "sampler_set_epoch_from(k * W * B) continues the epoch at batch k on every rank (%d of %d cases differ)",
           resume_mismatches, resume_checked);
    // At another world size: 2 ranks trained 3 steps of 4 (positions 0..23 of 50);
    // 3 ranks take the rest, every remaining sample once, plus the padding.
    {
        int seen[50] = {0}, total = 0;
        for (int r = 0; r < 2; r++) {
            DistributedSampler before = sampler_new(50, 2, r, true, 7);
            sampler_set_epoch(&before, 1);
            for (int k = 0; k < 12; k++) seen[before.indices[k]]++;
            sampler_free(&before);
        }
        for (int r = 0; r < 3; r++) {
            DistributedSampler after = sampler_new(50, 3, r, true, 7);
            sampler_set_epoch_from(&after, 1, 24);
            for (int k = 0; k < after.num_samples; k++) seen[after.indices[k]]++;
            total += after.num_samples;
            sampler_free(&after);
        }
        int missing = 0, repeats = 0;
        for (int i = 0; i < 50; i++) missing += seen[i] == 0, repeats += seen[i] > 1 ? seen[i] - 1 : 0;
        EXPECT(total == 27 && missing == 0 && repeats == 1,
               "24 of 50 samples done on 2 ranks, the rest on 3: 27 drawn (got %d), none missing (%d), "
               "1 padding repeat (%d)", total, missing, repeats);
    }

    const int batch_sizes[] = {1, 4, 5, 25, 100}, expected_batches[] = {25, 7, 5, 1, 1};
    for (int i = 0; i < 5; i++)
        EXPECT(sampler_num_batches(&s, batch_sizes[i]) == expected_batches[i],
               "%d samples in batches of %d: %d batches (expected %d, last partial kept)", s.num_samples,
               batch_sizes[i], sampler_num_batches(&s, batch_sizes[i]), expected_batches[i]);
    sampler_free(&s);

    // mnist_batch: 12 samples on rank 1 of 2 is 6 samples, batches of 4 -> 4 + 2 rows.
    s = sampler_new(N_IMAGES, 2, 1, true, 3);
    Tensor buffer = tensor_zeros(4, MNIST_PIXELS, DEVICE_CPU), expected = tensor_zeros(4, MNIST_PIXELS, DEVICE_CPU);
    for (int b = 0; b < 2; b++) {
        int batch_labels[4], want_labels[4];
        Tensor xb = mnist_batch(&split, &s, b, 4, &buffer, batch_labels);
        Tensor want = tensor_rows(&expected, xb.rows);
        mnist_gather(&split, s.indices + 4 * b, xb.rows, &want, want_labels);
        EXPECT(xb.rows == (b == 0 ? 4 : 2) && xb.cols == MNIST_PIXELS && xb.data == buffer.data &&
                   memcmp(xb.data, want.data, tensor_numel(&want) * sizeof(float)) == 0 &&
                   memcmp(batch_labels, want_labels, (size_t)xb.rows * sizeof(int)) == 0,
               "mnist_batch %d is a view of %d rows (expected %d) holding samples %d.. of the rank", b, xb.rows,
               b == 0 ? 4 : 2, 4 * b);
    }
    sampler_free(&s);
    tensor_free(&buffer), tensor_free(&expected), tensor_free(&x);
    mnist_free(&split);

    test_torch_parity();

    // What the data takes: with bfloat16 products a batch's rounded copy more (mnist_batch keeps one
    // beside the batch on a GPU), 2 bytes a pixel.
    MemoryNeed plain = memory_need("--batch_size 6400"), rounded = memory_need("--batch_size 6400");
    mnist_add_memory_need(&plain, 6400);
    matmul_set_dtype(MATMUL_BFLOAT16);
    mnist_add_memory_need(&rounded, 6400);
    matmul_set_dtype(MATMUL_FLOAT32);
    double more = memory_need_bytes(&rounded) - memory_need_bytes(&plain);
    EXPECT(more == 6400.0 * MNIST_PIXELS * 2, "mnist_add_memory_need with bfloat16 products: the batch's rounded copy, "
           "%.0f bytes more (expected %.0f)", more, 6400.0 * MNIST_PIXELS * 2);

    free(images_idx), free(labels_idx);
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    if (system(command) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
