// test_h5_stream.c: the HDF5 stream hands the training loop exactly the batches
// its sampler plans, in order, epoch after epoch, from float32 and from uint8
// files alike, and stops cleanly mid-plan.
//
// The files are written here with the HDF5 C API (not by create_mnist_h5), in
// the original's layout but small: 7 training groups, 2 test groups. Every
// pixel encodes its group, sample and position, so a batch that holds the
// wrong group, or a group out of order, cannot pass. Error paths exit (through
// check_all_ranks) and are left to tests/test_h5_stream.sh.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>

#include "h5_stream.h"
#include "timer.h"

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
static void check_plan(const char *path, const char *kind) {
    H5Mnist file = h5_mnist_open(path);
    EXPECT(file.train.n_groups == TRAIN_GROUPS && file.test.n_groups == TEST_GROUPS,
           "%s file: %d training and %d test groups", kind, file.train.n_groups, file.test.n_groups);
    EXPECT(file.train.pixels == (strcmp(kind, "uint8") == 0 ? H5_PIXELS_UINT8 : H5_PIXELS_FLOAT32),
           "%s file: pixels recognised as %s", kind, kind);

    const int epochs = 3, per_batch = 3;
    DistributedSampler sampler = sampler_new(TRAIN_GROUPS, 2, 1, true, 5);
    H5Stream *stream = h5_stream_start(&file.train, &sampler, per_batch, epochs, DEVICE_CPU);
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
           "%s file: 3 shuffled epochs of rank 1 of 2 arrive batch by batch as planned (%d batches, %d short)%s%s",
           kind, batches, short_batches, why[0] ? ": " : "", why);
    char report[256];
    h5_stream_describe_all_ranks(stream, 1.0, report, sizeof report);
    EXPECT(strstr(report, "read 1200 samples") != NULL, "%s file: the reader counts what it read: %s", kind, report);
    h5_stream_stop(stream);

    // Stop mid-plan, with the reader blocked on two full buffers: no hang, no leak.
    DistributedSampler test_groups = sampler_new(TEST_GROUPS, 1, 0, false, 0);
    H5Stream *early = h5_stream_start(&file.test, &test_groups, 1, 50, DEVICE_CPU);  // 100 batches planned
    Tensor x = h5_stream_next(early, 0, 0, labels);
    bool first_ok = x.rows == GROUP && labels[5] == label(0, 5) && x.data[7] == (float)pixel(0, 0, 7) / 255.0f;
    usleep(100000);  // let the reader fill the other buffer and block
    double start = wall_seconds();
    h5_stream_stop(early);
    double seconds = wall_seconds() - start;
    EXPECT(first_ok && seconds < 1.0, "%s file: stopping after 1 of 100 planned batches takes %.3f s", kind, seconds);
    sampler_free(&test_groups);
    free(labels);
    sampler_free(&sampler);
    h5_mnist_close(&file);
}

int main(void) {
    char dir[] = "/tmp/test_h5_stream_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char f32[64], u8[64];
    snprintf(f32, sizeof f32, "%s/f32.h5", dir);
    snprintf(u8, sizeof u8, "%s/u8.h5", dir);
    write_file(f32, false);
    write_file(u8, true);
    check_plan(f32, "float32");
    check_plan(u8, "uint8");
    unlink(f32), unlink(u8), rmdir(dir);
    return test_summary();
}
