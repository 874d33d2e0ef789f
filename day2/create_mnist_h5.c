// create_mnist_h5: MNIST as chunked HDF5, for step 11.          PyTorch twin: create_mnist_h5.py
//
// What it does: reads the four IDX files (make data) and writes them in the
// original workshop's layout (names, shapes, chunks), groups of 100 samples,
// one chunk per group:
//   train/images  [600, 100, 1, 28, 28]  uint8 pixels 0..255 (--float32: float32 pixels / 255)
//   train/labels  [600, 100]             int64
//   test/images   [100, 100, 1, 28, 28] and test/labels [100, 100], the same way
// A chunk is what HDF5 reads (and inflates) in one go: step 11 reads whole
// groups, one chunk each, and never the whole file.
//
// The pixels: the original stores float32 pixels / 255, gzip-compressed; by
// default we store the IDX bytes themselves, uncompressed, and step 11 divides
// by 255 where it computes, into the very same float32 values (its losses are
// bit-identical: tests/test_h5_stream.sh). Why, by measurement (README, step 11):
// reading costs CPU time that training would use. uint8 is 4x less to move
// than float32, and an uncompressed chunk needs no inflating: it reads about 4x
// faster than a gzip one, for a file of 55 MB instead of 12 MB. --gzip 4 makes
// the small file, for a slow disk; --float32 writes the original's exact
// layout, for the original's h5py code. Step 11 reads them all, and files
// written by the original too.
//
// Build and run (one process: it writes one file):
//   make day2/create_mnist_h5
//   day2/create_mnist_h5                                   # data/mnist -> data/mnist.h5
//   day2/create_mnist_h5 --gzip 4 --out data/mnist_gzip.h5 # 4.6x smaller, slower to read
//   day2/create_mnist_h5 --float32 --out data/mnist_float32.h5   # for the PyTorch original
//   day2/create_mnist_h5 --force                           # overwrite data/mnist.h5
//
// Expected output (times vary):
//   create_mnist_h5: data/mnist -> data/mnist.h5: uint8 pixels 0..255, uncompressed, one chunk per group of 100
//   train: 60000 samples -> train/images uint8 [600, 100, 1, 28, 28], train/labels int64 [600, 100] in 0.05 s
//   test: 10000 samples -> test/images uint8 [100, 100, 1, 28, 28], test/labels int64 [100, 100] in 0.01 s
//   wrote data/mnist.h5: 55.5 MB for 55.4 MB of data (uncompressed) in 0.32 s
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>      // the HDF5 C API: the file is written with it directly

#include "base/args.h"       // args_parse: the flags and --help
#include "base/check.h"      // CHECK, xmalloc: fail fast, on every rank
#include "base/paths.h"      // replace_temp_name, replace_commit: write next to FILE.h5, then rename
#include "base/timer.h"      // wall_seconds
#include "data/h5_stream.h"  // H5_GROUP_SIZE: the file layout step 11 reads
#include "data/mnist.h"      // mnist_load: the IDX files to convert
#include "runtime/dist.h"    // dist_init, dist_rank, print0: the process group

#define CHECK_H5(call, ...) CHECK((call) >= 0, __VA_ARGS__)

// A chunked dataset `name` [dims], one chunk = [1, dims[1:]]: one group;
// gzip-compressed at `gzip_level` (0: stored as is).
static hid_t create_dataset(hid_t parent, const char *path, const char *name, hid_t type, int rank,
                            const hsize_t *dims, int gzip_level) {
    hsize_t chunk[5];
    for (int d = 0; d < rank; d++) chunk[d] = d == 0 ? 1 : dims[d];
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t create = H5Pcreate(H5P_DATASET_CREATE);
    CHECK_H5(H5Pset_chunk(create, rank, chunk), "%s: cannot chunk '%s'", path, name);
    if (gzip_level > 0) CHECK_H5(H5Pset_deflate(create, (unsigned)gzip_level), "%s: cannot compress '%s'", path, name);
    hid_t dataset = H5Dcreate2(parent, name, type, space, H5P_DEFAULT, create, H5P_DEFAULT);
    CHECK(dataset >= 0, "%s: cannot create dataset '%s'", path, name);
    H5Pclose(create);
    H5Sclose(space);
    return dataset;
}

// Write one part ("train" or "test") group by group: each write fills exactly
// one chunk, which HDF5 then compresses and writes out, so memory stays at one
// group's worth beyond the IDX data. Returns the bytes of data written.
static double write_part(hid_t file, const char *path, const char *name, const MnistSplit *split, bool float32,
                         int gzip_level) {
    double start = wall_seconds();
    CHECK(split->n % H5_GROUP_SIZE == 0, "%s: %d samples do not make groups of %d", name, split->n, H5_GROUP_SIZE);
    const hsize_t n_groups = (hsize_t)(split->n / H5_GROUP_SIZE);
    const hsize_t image_dims[5] = {n_groups, H5_GROUP_SIZE, 1, 28, 28}, label_dims[2] = {n_groups, H5_GROUP_SIZE};
    hid_t group = H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(group >= 0, "%s: cannot create group '%s'", path, name);
    hid_t images = create_dataset(group, path, "images", float32 ? H5T_IEEE_F32LE : H5T_STD_U8LE, 5, image_dims,
                                  gzip_level);
    hid_t labels = create_dataset(group, path, "labels", H5T_STD_I64LE, 2, label_dims, gzip_level);

    // One group in memory, and where it goes in the file: a hyperslab of one chunk.
    const size_t group_pixels = (size_t)H5_GROUP_SIZE * MNIST_PIXELS;
    float *group_floats = xmalloc(group_pixels * sizeof(float));  // [100, 784]
    int64_t group_labels[H5_GROUP_SIZE];                          // [100]
    const hsize_t image_count[5] = {1, H5_GROUP_SIZE, 1, 28, 28}, label_count[2] = {1, H5_GROUP_SIZE};
    hid_t image_memory = H5Screate_simple(5, image_count, NULL), label_memory = H5Screate_simple(2, label_count, NULL);
    hid_t image_space = H5Dget_space(images), label_space = H5Dget_space(labels);
    for (hsize_t g = 0; g < n_groups; g++) {
        const uint8_t *pixels = split->images + g * group_pixels;
        const void *image_data = pixels;
        if (float32) {
            // Exactly numpy's np.float32(p) / 255 (the division is correctly rounded).
            for (size_t k = 0; k < group_pixels; k++) group_floats[k] = (float)pixels[k] / 255.0f;
            image_data = group_floats;
        }
        for (int i = 0; i < H5_GROUP_SIZE; i++) group_labels[i] = split->labels[g * H5_GROUP_SIZE + i];
        const hsize_t image_start[5] = {g, 0, 0, 0, 0}, label_start[2] = {g, 0};
        CHECK_H5(H5Sselect_hyperslab(image_space, H5S_SELECT_SET, image_start, NULL, image_count, NULL),
                 "%s: cannot select group %llu of '%s/images'", path, (unsigned long long)g, name);
        CHECK_H5(H5Sselect_hyperslab(label_space, H5S_SELECT_SET, label_start, NULL, label_count, NULL),
                 "%s: cannot select group %llu of '%s/labels'", path, (unsigned long long)g, name);
        CHECK_H5(H5Dwrite(images, float32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT8, image_memory, image_space,
                          H5P_DEFAULT, image_data),
                 "%s: cannot write group %llu of '%s/images' (disk full?)", path, (unsigned long long)g, name);
        CHECK_H5(H5Dwrite(labels, H5T_NATIVE_INT64, label_memory, label_space, H5P_DEFAULT, group_labels),
                 "%s: cannot write group %llu of '%s/labels' (disk full?)", path, (unsigned long long)g, name);
    }
    H5Sclose(image_space), H5Sclose(label_space), H5Sclose(image_memory), H5Sclose(label_memory);
    H5Dclose(images), H5Dclose(labels), H5Gclose(group);
    free(group_floats);

    unsigned long long groups = (unsigned long long)n_groups;
    print0("%s: %d samples -> %s/images %s [%llu, %d, 1, 28, 28], %s/labels int64 [%llu, %d] in %.2f s\n", name,
           split->n, name, float32 ? "float32" : "uint8", groups, H5_GROUP_SIZE, name, groups, H5_GROUP_SIZE,
           wall_seconds() - start);
    return (double)split->n * (MNIST_PIXELS * (float32 ? sizeof(float) : 1) + sizeof(int64_t));
}

// The temporary file being written, if any: a failure anywhere (a CHECK deep
// in write_part, a full disk) ends the program, and this exit handler then
// removes the half-written file, 55 MB of nothing.
static char g_unfinished[PATH_MAX];

static void remove_unfinished(void) {
    if (g_unfinished[0]) unlink(g_unfinished);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);  // a world of one: MPI only so that every program shares one skeleton
    const char *data = "data/mnist", *out = H5_DEFAULT_FILE;
    int float32 = 0, force = 0, gzip_level = -1;  // -1: uncompressed uint8, or the original's gzip 4 with --float32
    ArgSpec flags[] = {
        {"data", ARG_PATH, &data, "DIR", "folder with the MNIST IDX files (make data)", 0, NULL},
        {"out", ARG_OUTPUT, &out, "FILE.h5", "the HDF5 file to write", 0, NULL},
        {"float32", ARG_SWITCH, &float32, NULL, "float32 pixels / 255 and gzip, the original's own layout (it reads 10x slower than uint8)", 0, NULL},
        {"gzip", ARG_INT, &gzip_level, "LEVEL", "gzip level of the chunks, 1 to 9, or 0: uncompressed; -1: 0 for uint8, the original's 4 with --float32", -1, NULL},
        {"force", ARG_SWITCH, &force, NULL, "overwrite FILE.h5 if it exists", 0, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Write MNIST as chunked HDF5 (groups of 100 samples) for step 11.");
    if (dist_world_size() != 1)
        usage_error("create_mnist_h5 writes one file: run it as one process, not on %d ranks", dist_world_size());
    // The defaults, by measurement (README, Day 2): uint8 chunks uncompressed read
    // 4x faster than gzip ones, and on a busy CPU that is training time; a
    // float32 file is the original's, gzip level 4 (h5py's compression="gzip").
    if (gzip_level < 0) gzip_level = float32 ? 4 : 0;
    if (output_is_stream(out)) usage_error("--out %s: HDF5 writes a file it can seek in, not a stream", out);
    if (access(out, F_OK) == 0 && !force) usage_error("%s exists: pass --force to overwrite it", out);
    // HDF5 closes its open files at exit, and crashes in it when a write has
    // failed: our exits are our own (the file is closed below, or abandoned).
    H5dont_atexit();
    CHECK(gzip_level == 0 || H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0,
          "this HDF5 library has no gzip (deflate) filter: use --gzip 0");
    double start = wall_seconds();

    MnistSplit train = mnist_load(data, MNIST_TRAIN);
    MnistSplit test = mnist_load(data, MNIST_TEST);
    char compression[32] = "uncompressed";
    if (gzip_level > 0) snprintf(compression, sizeof compression, "gzip level %d", gzip_level);
    print0("create_mnist_h5: %s -> %s: %s, %s, one chunk per group of %d\n", data, out,
           float32 ? "float32 pixels / 255" : "uint8 pixels 0..255", compression, H5_GROUP_SIZE);

    // Write next to the target and rename at the end (paths.h): an interrupted
    // run leaves no half-written FILE.h5 behind, and a step 11 reading the old
    // file keeps it. On a failure, remove_unfinished() takes the temp away.
    replace_temp_name(out, g_unfinished, sizeof g_unfinished);
    atexit(remove_unfinished);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);  // every call is checked: one line of ours, not HDF5's stack
    hid_t file = H5Fcreate(g_unfinished, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(file >= 0, "%s: cannot create the HDF5 file (is its folder writable?)", g_unfinished);
    double data_bytes = write_part(file, out, "train", &train, float32, gzip_level) +
                        write_part(file, out, "test", &test, float32, gzip_level);
    CHECK_H5(H5Fclose(file), "%s: cannot close (disk full?)", g_unfinished);
    CHECK_ERRNO(replace_commit(NULL, g_unfinished), "%s: cannot replace it with %s", out, g_unfinished);
    g_unfinished[0] = '\0';  // done: nothing to remove

    struct stat st;
    CHECK_ERRNO(stat(out, &st) == 0, "%s", out);
    char ratio[32] = "uncompressed";
    if (gzip_level > 0) snprintf(ratio, sizeof ratio, "%.1fx smaller", data_bytes / (double)st.st_size);
    print0("wrote %s: %.1f MB for %.1f MB of data (%s) in %.2f s\n", out, (double)st.st_size / 1e6, data_bytes / 1e6,
           ratio, wall_seconds() - start);

    mnist_free(&train);
    mnist_free(&test);
    H5close();
    dist_finalize();
    return 0;
}
