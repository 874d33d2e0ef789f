// test_h5_stream.c: the HDF5 stream hands the training loop exactly the batches
// its sampler plans, in order, epoch after epoch, from float32 and from uint8
// files alike, at any number of workers, and stops cleanly mid-plan; and
// h5_chunk_read decodes every way a chunk can be stored and names every way
// it can be damaged.
//
// The files are written here with the HDF5 C API (not by create_mnist_h5), in
// the original's layout but small: 7 training groups, 2 test groups. Every
// pixel encodes its group, sample and position, so a batch that holds the
// wrong group, or a group out of order, cannot pass. Error paths exit (through
// check_all_ranks) and are left to tests/test_h5_stream.sh.
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>
#include <zlib.h>

#include "base/timer.h"
#include "data/h5_chunk.h"
#include "data/h5_stream.h"

#define TEST_NAME "test_h5_stream"
#include "test.h"

enum { TRAIN_GROUPS = 7, TEST_GROUPS = 2, GROUP = H5_GROUP_SIZE };

static uint8_t pixel(int group, int sample, int k) { return (uint8_t)((group * 37 + sample * 11 + k) % 256); }
static int label(int group, int sample) { return (group * 3 + sample) % 10; }

static void write_part(hid_t file, const char *name, int n_groups, bool uint8) {
    hsize_t image_dims[5] = {(hsize_t)n_groups, GROUP, 1, 28, 28}, label_dims[2] = {(hsize_t)n_groups, GROUP};
    hsize_t image_chunk[5] = {1, GROUP, 1, 28, 28}, label_chunk[2] = {1, GROUP};
    size_t n = (size_t)n_groups * GROUP * MNIST_PIXELS;
    uint8_t *bytes = malloc(n);
    float *floats = malloc(n * sizeof(float));
    int64_t *labels = malloc((size_t)n_groups * GROUP * sizeof(int64_t));
    for (int g = 0; g < n_groups; g++)
        for (int i = 0; i < GROUP; i++) {
            labels[g * GROUP + i] = label(g, i);
            for (int k = 0; k < MNIST_PIXELS; k++) {
                size_t at = ((size_t)g * GROUP + i) * MNIST_PIXELS + k;
                bytes[at] = pixel(g, i, k);
                floats[at] = (float)bytes[at] / 255.0f;
            }
        }
    hid_t group = H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t create = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(create, 5, image_chunk);
    H5Pset_deflate(create, 4);
    hid_t space = H5Screate_simple(5, image_dims, NULL);
    hid_t images = H5Dcreate2(group, "images", uint8 ? H5T_STD_U8LE : H5T_IEEE_F32LE, space, H5P_DEFAULT, create,
                              H5P_DEFAULT);
    H5Dwrite(images, uint8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
             uint8 ? (void *)bytes : (void *)floats);
    H5Dclose(images), H5Sclose(space), H5Pclose(create);
    create = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(create, 2, label_chunk);
    space = H5Screate_simple(2, label_dims, NULL);
    hid_t label_set = H5Dcreate2(group, "labels", H5T_STD_I64LE, space, H5P_DEFAULT, create, H5P_DEFAULT);
    H5Dwrite(label_set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels);
    H5Dclose(label_set), H5Sclose(space), H5Pclose(create), H5Gclose(group);
    free(bytes), free(floats), free(labels);
}

static void write_file(const char *path, bool uint8) {
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    write_part(file, "train", TRAIN_GROUPS, uint8);
    write_part(file, "test", TEST_GROUPS, uint8);
    H5Fclose(file);
}

// Does this batch hold exactly the groups the sampler lists, in its order?
// Returns the first mismatch as text, or "" when all is well.
static const char *check_batch(const Tensor *x, const int *labels, const int *groups, int n_groups, char *why,
                               size_t size) {
    if (x->rows != n_groups * GROUP) return snprintf(why, size, "%d rows, expected %d", x->rows, n_groups * GROUP), why;
    for (int g = 0; g < n_groups; g++)
        for (int i = 0; i < GROUP; i++) {
            int row = g * GROUP + i;
            if (labels[row] != label(groups[g], i))
                return snprintf(why, size, "row %d: label %d, expected group %d's %d", row, labels[row], groups[g],
                                label(groups[g], i)), why;
            for (int k = 0; k < MNIST_PIXELS; k++)
                if (x->data[(size_t)row * MNIST_PIXELS + k] != (float)pixel(groups[g], i, k) / 255.0f)
                    return snprintf(why, size, "row %d pixel %d is not group %d's", row, k, groups[g]), why;
        }
    return "";
}

// Stream 3 epochs of rank 1 of 2 (shuffled: 4 groups per rank, batches of 3
// groups, so each epoch ends with a short batch) and compare each batch with
// the sampler's plan.
static void check_plan(const char *path, const char *kind, int workers, int prefetch) {
    H5Mnist file = h5_mnist_open(path);
    EXPECT(file.train.n_groups == TRAIN_GROUPS && file.test.n_groups == TEST_GROUPS,
           "%s file: %d training and %d test groups", kind, file.train.n_groups, file.test.n_groups);
    EXPECT(file.train.pixels == (strcmp(kind, "uint8") == 0 ? H5_PIXELS_UINT8 : H5_PIXELS_FLOAT32),
           "%s file: pixels recognised as %s", kind, kind);

    const int epochs = 3, per_batch = 3;
    DistributedSampler sampler = sampler_new(TRAIN_GROUPS, 2, 1, true, 5);
    H5Stream *stream = h5_stream_start(&file.train, &sampler, per_batch, epochs, DEVICE_CPU, workers, prefetch);
    int *labels = malloc(per_batch * GROUP * sizeof(int));
    char why[160] = "";
    int batches = 0, short_batches = 0;
    for (int epoch = 0; epoch < epochs && !why[0]; epoch++) {
        sampler_set_epoch(&sampler, epoch);
        for (int b = 0; b < sampler_num_batches(&sampler, per_batch) && !why[0]; b++) {
            int first = b * per_batch;
            int n = sampler.num_samples - first < per_batch ? sampler.num_samples - first : per_batch;
            Tensor x = h5_stream_next(stream, epoch, b, labels);
            check_batch(&x, labels, sampler.indices + first, n, why, sizeof why);
            batches++, short_batches += n < per_batch;
        }
    }
    EXPECT(!why[0] && batches == 6 && short_batches == 3,
           "%s file, %d workers x %d ahead: 3 shuffled epochs of rank 1 of 2 arrive batch by batch as planned (%d "
           "batches, %d short)%s%s",
           kind, workers, prefetch, batches, short_batches, why[0] ? ": " : "", why);
    char report[1024];
    h5_stream_describe_all_ranks(stream, 1.0, report, sizeof report);
    char *end = strchr(report, '\n');
    if (end) *end = '\0';
    EXPECT(strstr(report, "read 1200 samples") != NULL, "%s file: the workers count what they read: %s", kind, report);
    // The share of the loop spent waiting agrees with the seconds printed beside
    // it, however short the loop ("0.00 s for data (0% of 0.01 s)", not 40%).
    h5_stream_describe_all_ranks(stream, 0.01, report, sizeof report);
    if ((end = strchr(report, '\n'))) *end = '\0';
    const char *waited = strstr(report, "waited ");
    double wait_s = -1, share = -1, loop_s = -1;
    bool parsed = waited && sscanf(waited, "waited %lf s for data (%lf%% of %lf s)", &wait_s, &share, &loop_s) == 3;
    EXPECT(parsed && loop_s > 0 && fabs(share - round(100 * wait_s / loop_s)) < 0.5,
           "%s file: the share of time waited agrees with the seconds printed: %s", kind, waited ? waited : report);
    h5_stream_stop(stream);

    // Stop mid-plan, with the reader blocked on two full buffers: no hang, no leak.
    DistributedSampler test_groups = sampler_new(TEST_GROUPS, 1, 0, false, 0);
    H5Stream *early = h5_stream_start(&file.test, &test_groups, 1, 50, DEVICE_CPU, workers, prefetch);  // 100 batches
    Tensor x = h5_stream_next(early, 0, 0, labels);
    bool first_ok = x.rows == GROUP && labels[5] == label(0, 5) && x.data[7] == (float)pixel(0, 0, 7) / 255.0f;
    usleep(100000);  // let the workers fill their slots and block
    double start = wall_seconds();
    h5_stream_stop(early);
    double seconds = wall_seconds() - start;
    EXPECT(first_ok && seconds < 1.0, "%s file, %d workers x %d ahead: stopping after 1 of 100 planned batches takes %.3f s",
           kind, workers, prefetch, seconds);
    sampler_free(&test_groups);
    free(labels);
    sampler_free(&sampler);
    h5_mnist_close(&file);
}

// ---------------------------------------------------------------- h5_chunk_read

enum { SLICE = 1000 };  // bytes of one slice of the [6, 1000] uint8 datasets below

static uint8_t byte_at(int slice, int k) { return (uint8_t)(slice * 7 + k / 50); }  // compressible

// A [6, 1000] uint8 dataset chunked by slices with `filters` (0: none, 1:
// gzip, 2: shuffle + gzip), slices 0..3 written normally; 4 and 5 are left to
// the caller (H5Dwrite_chunk) or missing.
static hid_t slices_dataset(hid_t file, const char *name, int filters) {
    hsize_t dims[2] = {6, SLICE}, chunk[2] = {1, SLICE}, start[2] = {0, 0}, count[2] = {4, SLICE};
    hid_t create = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(create, 2, chunk);
    if (filters == 2) H5Pset_shuffle(create);
    if (filters >= 1) H5Pset_deflate(create, 4);
    hid_t space = H5Screate_simple(2, dims, NULL);
    hid_t dataset = H5Dcreate2(file, name, H5T_STD_U8LE, space, H5P_DEFAULT, create, H5P_DEFAULT);
    uint8_t data[4 * SLICE];
    for (int i = 0; i < 4 * SLICE; i++) data[i] = byte_at(i / SLICE, i % SLICE);
    hid_t memory = H5Screate_simple(2, count, NULL);
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL);
    H5Dwrite(dataset, H5T_NATIVE_UINT8, memory, space, H5P_DEFAULT, data);
    H5Sclose(memory), H5Sclose(space), H5Pclose(create);
    return dataset;
}

static void write_chunk(hid_t dataset, int slice, uint32_t mask, const void *bytes, size_t n) {
    hsize_t offset[2] = {(hsize_t)slice, 0};
    H5Dwrite_chunk(dataset, H5P_DEFAULT, mask, offset, n, bytes);
}

// Read `slice` and expect success with the right bytes (want == NULL) or a
// failure whose message contains `want`.
static void expect_slice(const H5ChunkedDataset *d, int slice, const char *want, const char *what) {
    uint8_t out[SLICE];
    char err[512] = "";
    H5ChunkScratch scratch = {0};
    bool ok = h5_chunk_read(d, slice, out, &scratch, err, sizeof err);
    h5_chunk_scratch_free(&scratch);
    if (!want) {
        bool same = ok;
        for (int k = 0; same && k < SLICE; k++) same = out[k] == byte_at(slice, k);
        EXPECT(same, "%s: slice %d reads back exactly%s%s", what, slice, ok ? "" : ": ", err);
    } else {
        EXPECT(!ok && strstr(err, want) && strstr(err, "chunks.h5") && strstr(err, d->name),
               "%s: fails with a line naming the file, '%s' and the slice: %s", what, d->name, err);
    }
}

static void check_chunks(const char *dir) {
    char path[128];
    snprintf(path, sizeof path, "%s/chunks.h5", dir);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t gzip = slices_dataset(file, "gzip", 1), raw = slices_dataset(file, "raw", 0);
    hid_t shuffled = slices_dataset(file, "shuffled", 2);
    // gzip slice 4: stored raw, its filter mask saying deflate was skipped (as
    // HDF5 does when deflate would not shrink a chunk). Slice 5: missing.
    uint8_t bytes[SLICE], packed[2 * SLICE];
    for (int k = 0; k < SLICE; k++) bytes[k] = byte_at(4, k);
    write_chunk(gzip, 4, 1, bytes, SLICE);
    // raw slice 4: 999 bytes where a slice is 1000.
    write_chunk(raw, 4, 0, bytes, SLICE - 1);

    // Damaged gzip chunks in a dataset of their own: slice 4's bytes, compressed, then spoiled.
    hid_t damaged = slices_dataset(file, "damaged", 1);
    uLongf packed_size = sizeof packed;
    compress2(packed, &packed_size, bytes, SLICE, 4);
    uint8_t corrupt[2 * SLICE];
    memcpy(corrupt, packed, packed_size);
    for (uLongf k = 2; k < packed_size; k++) corrupt[k] ^= 0x5a;     // past the zlib header
    write_chunk(damaged, 4, 0, corrupt, packed_size);
    write_chunk(damaged, 5, 0, packed, packed_size / 2);             // cut short
    H5Dclose(damaged);
    // A zlib stream of 1200 bytes where a slice is 1000.
    uint8_t long_data[1200] = {0};
    packed_size = sizeof packed;
    compress2(packed, &packed_size, long_data, sizeof long_data, 4);
    damaged = slices_dataset(file, "too_long", 1);
    write_chunk(damaged, 4, 0, packed, packed_size);
    H5Dclose(damaged);
    H5Dclose(gzip), H5Dclose(raw), H5Dclose(shuffled);

    struct { const char *name; bool direct; } sets[] = {{"gzip", true}, {"raw", true}, {"shuffled", false},
                                                         {"damaged", true}, {"too_long", true}};
    H5ChunkedDataset d[5];
    hid_t ids[5];
    char err[256];
    for (int i = 0; i < 5; i++) {
        ids[i] = H5Dopen2(file, sets[i].name, H5P_DEFAULT);
        bool ok = h5_chunked_open(&d[i], ids[i], path, sets[i].name, H5T_NATIVE_UINT8, err, sizeof err);
        EXPECT(ok && d[i].direct == sets[i].direct, "'%s': read %s%s%s", sets[i].name,
               sets[i].direct ? "directly" : "with H5Dread", d[i].direct ? "" : ", because of ", d[i].why_not_direct);
    }
    expect_slice(&d[0], 2, NULL, "gzip chunk, inflated by us");
    expect_slice(&d[0], 4, NULL, "gzip dataset, chunk stored raw (filter mask 1)");
    expect_slice(&d[0], 5, "its chunk is missing", "gzip dataset, chunk never written");
    expect_slice(&d[1], 3, NULL, "uncompressed chunk, read straight into place");
    expect_slice(&d[1], 4, "its chunk is 999 bytes, one slice is 1000", "uncompressed chunk of the wrong size");
    expect_slice(&d[2], 1, NULL, "shuffle + gzip, through H5Dread");
    expect_slice(&d[3], 4, "corrupt gzip data", "gzip chunk with corrupt bytes");
    expect_slice(&d[3], 5, "its gzip data ends early", "gzip chunk cut short");
    expect_slice(&d[4], 4, "it inflates to more bytes than one slice", "gzip chunk of 1200 bytes");
    for (int i = 0; i < 5; i++) H5Dclose(ids[i]);
    H5Fclose(file);
    unlink(path);
}

int main(void) {
    char dir[] = "/tmp/test_h5_stream_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char f32[64], u8[64];
    snprintf(f32, sizeof f32, "%s/f32.h5", dir);
    snprintf(u8, sizeof u8, "%s/u8.h5", dir);
    write_file(f32, false);
    write_file(u8, true);
    check_plan(f32, "float32", 1, 2);
    check_plan(u8, "uint8", 1, 1);
    check_plan(u8, "uint8", 2, 2);
    check_plan(u8, "uint8", 4, 3);  // more slots (12) than the plan's batches of an epoch
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);  // the damaged chunks below make HDF5 print its stack otherwise
    check_chunks(dir);
    unlink(f32), unlink(u8), rmdir(dir);
    return test_summary();
}
