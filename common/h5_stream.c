// h5_stream.c: the MNIST HDF5 reader and its prefetch thread. See h5_stream.h.
#include "h5_stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dist.h"
#include "timer.h"

// The one lock around every HDF5 call in this file (see h5_stream.h).
static pthread_mutex_t hdf5_lock = PTHREAD_MUTEX_INITIALIZER;

// ------------------------------------------------------------------ open and validate

// "float32", "uint8", "int64", ... as numpy would name the type.
static void describe_type(hid_t type, char *out, size_t size) {
    size_t bits = 8 * H5Tget_size(type);
    switch (H5Tget_class(type)) {
    case H5T_FLOAT:   snprintf(out, size, "float%zu", bits); break;
    case H5T_INTEGER: snprintf(out, size, "%sint%zu", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits); break;
    case H5T_STRING:  snprintf(out, size, "string"); break;
    default:          snprintf(out, size, "a non-numeric type"); break;
    }
}

// "[600, 100, 1, 28, 28]"
static void describe_dims(const hsize_t *dims, int rank, char *out, size_t size) {
    int len = snprintf(out, size, "[");
    for (int d = 0; d < rank && len < (int)size; d++)
        len += snprintf(out + len, size - len, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    if (len < (int)size) snprintf(out + len, size - len, "]");
}

// Does "train/images" exist? H5Lexists fails, rather than saying no, when a
// group on the way is missing: ask about "train", then "train/images".
static bool path_exists(hid_t file, const char *path) {
    char prefix[256];
    for (const char *end = strchr(path, '/');; end = strchr(end + 1, '/')) {
        int len = end ? (int)(end - path) : (int)strlen(path);
        snprintf(prefix, sizeof prefix, "%.*s", len, path);
        if (H5Lexists(file, prefix, H5P_DEFAULT) <= 0) return false;
        if (!end) return true;
    }
}

// Open dataset part/what ("train/images") and check its type and shape. Inner
// dims must be exactly `inner` (after the group count); `pixels` is set for the
// images, NULL for the labels (any integer type: HDF5 converts on reading).
static bool open_dataset(hid_t file, const char *path, const char *part, const char *what, const hsize_t *inner,
                         int inner_rank, H5Pixels *pixels, hid_t *dataset, hsize_t *n_groups, char *err,
                         size_t err_size) {
    char name[64], expected[96], want_dims[64] = "[groups", found_type[32], found_dims[96];
    snprintf(name, sizeof name, "%s/%s", part, what);
    for (int d = 0; d < inner_rank; d++)
        snprintf(want_dims + strlen(want_dims), sizeof want_dims - strlen(want_dims), ", %llu",
                 (unsigned long long)inner[d]);
    strcat(want_dims, "]");
    snprintf(expected, sizeof expected, "%s %s", pixels ? "float32 or uint8" : "int64", want_dims);

    if (!path_exists(file, name)) {
        snprintf(err, err_size, "%s: no dataset '%s' (expected %s, as day2/create_mnist_h5 writes)", path, name,
                 expected);
        return false;
    }
    // Each chunk is read once an epoch: a chunk cache would only copy it twice.
    hid_t access = H5Pcreate(H5P_DATASET_ACCESS);
    H5Pset_chunk_cache(access, H5D_CHUNK_CACHE_NSLOTS_DEFAULT, 0, H5D_CHUNK_CACHE_W0_DEFAULT);
    *dataset = H5Dopen2(file, name, access);
    H5Pclose(access);
    if (*dataset < 0) {
        snprintf(err, err_size, "%s: '%s' is not a dataset (expected %s)", path, name, expected);
        return false;
    }
    hid_t type = H5Dget_type(*dataset), space = H5Dget_space(*dataset);
    hsize_t dims[H5S_MAX_RANK] = {0};
    int rank = H5Sget_simple_extent_dims(space, dims, NULL);
    H5T_class_t type_class = H5Tget_class(type);
    size_t type_size = H5Tget_size(type);
    bool is_float32 = type_class == H5T_FLOAT && type_size == 4;
    bool is_uint8 = type_class == H5T_INTEGER && type_size == 1 && H5Tget_sign(type) == H5T_SGN_NONE;
    bool type_ok = pixels ? is_float32 || is_uint8 : type_class == H5T_INTEGER;
    bool shape_ok = rank == 1 + inner_rank && dims[0] >= 1;
    for (int d = 0; shape_ok && d < inner_rank; d++) shape_ok = dims[1 + d] == inner[d];
    describe_type(type, found_type, sizeof found_type);
    describe_dims(dims, rank, found_dims, sizeof found_dims);
    H5Tclose(type);
    H5Sclose(space);
    if (!type_ok || !shape_ok) {
        snprintf(err, err_size, "%s: dataset '%s' is %s %s (expected %s)", path, name, found_type, found_dims,
                 expected);
        return false;
    }
    if (pixels) *pixels = is_float32 ? H5_PIXELS_FLOAT32 : H5_PIXELS_UINT8;
    *n_groups = dims[0];
    return true;
}

static bool open_part(hid_t file, const char *path, const char *name, H5Part *part, char *err, size_t err_size) {
    static const hsize_t image_dims[] = {H5_GROUP_SIZE, 1, 28, 28};  // [groups, 100, 1, 28, 28]
    static const hsize_t label_dims[] = {H5_GROUP_SIZE};             // [groups, 100]
    hsize_t image_groups = 0, label_groups = 0;
    *part = (H5Part){.path = path, .name = name, .images = H5I_INVALID_HID, .labels = H5I_INVALID_HID};
    if (!open_dataset(file, path, name, "images", image_dims, 4, &part->pixels, &part->images, &image_groups, err,
                      err_size) ||
        !open_dataset(file, path, name, "labels", label_dims, 1, NULL, &part->labels, &label_groups, err, err_size))
        return false;
    if (image_groups != label_groups) {
        snprintf(err, err_size, "%s: '%s/images' has %llu groups but '%s/labels' has %llu", path, name,
                 (unsigned long long)image_groups, name, (unsigned long long)label_groups);
        return false;
    }
    if (image_groups > (hsize_t)(0x7fffffff / H5_GROUP_SIZE)) {
        snprintf(err, err_size, "%s: '%s/images' has %llu groups, too many for int sample indices", path, name,
                 (unsigned long long)image_groups);
        return false;
    }
    part->n_groups = (int)image_groups;
    return true;
}

static void close_part(H5Part *part) {
    if (part->images >= 0) H5Dclose(part->images);
    if (part->labels >= 0) H5Dclose(part->labels);
    part->images = part->labels = H5I_INVALID_HID;
}

static bool is_hdf5(const char *path) {
#if H5_VERSION_GE(1, 12, 0)
    return H5Fis_accessible(path, H5P_DEFAULT) > 0;
#else
    return H5Fis_hdf5(path) > 0;
#endif
}

H5Mnist h5_mnist_open(const char *path) {
    H5Mnist mnist = {.path = strdup(path), .file = H5I_INVALID_HID};
    CHECK(mnist.path != NULL, "out of memory");
    mnist.train.images = mnist.train.labels = mnist.test.images = mnist.test.labels = H5I_INVALID_HID;
    char err[1024] = "";
    pthread_mutex_lock(&hdf5_lock);
    // HDF5 prints its whole error stack on every failed call by default; each
    // call is checked here, and one line of our own says what is wrong.
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (access(path, R_OK) != 0) {
        // The one problem with an obvious fix: say which command writes the file.
        bool default_path = strcmp(path, H5_DEFAULT_FILE) == 0;
        snprintf(err, sizeof err, "%s: cannot open: %s. Write it with `day2/create_mnist_h5%s%s`", path,
                 strerror(errno), default_path ? "" : " --out ", default_path ? "" : path);
    } else if (!is_hdf5(path)) {
        snprintf(err, sizeof err, "%s: not an HDF5 file", path);
    } else if ((mnist.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
        snprintf(err, sizeof err, "%s: cannot open the HDF5 file", path);
    } else if (open_part(mnist.file, mnist.path, "train", &mnist.train, err, sizeof err)) {
        open_part(mnist.file, mnist.path, "test", &mnist.test, err, sizeof err);
    }
    pthread_mutex_unlock(&hdf5_lock);
    // Every rank opens the same file: one line says what is wrong, all stop together.
    check_all_ranks(err[0] == '\0', err);
    return mnist;
}

void h5_mnist_close(H5Mnist *mnist) {
    pthread_mutex_lock(&hdf5_lock);
    close_part(&mnist->train);
    close_part(&mnist->test);
    if (mnist->file >= 0) H5Fclose(mnist->file);
    pthread_mutex_unlock(&hdf5_lock);
    free(mnist->path);
    *mnist = (H5Mnist){.file = H5I_INVALID_HID};
}

// ------------------------------------------------------------------ the reader thread

#define GROUP_PIXELS ((size_t)H5_GROUP_SIZE * MNIST_PIXELS)
// One group in the file, as a hyperslab's count, and in memory.
static const hsize_t image_group[5] = {1, H5_GROUP_SIZE, 1, 28, 28}, label_group[2] = {1, H5_GROUP_SIZE};

// One batch buffer: what the reader fills and the training loop reads.
typedef struct {
    Tensor images;     // [groups_per_batch * 100, 784] on the host
    int *labels;       // [groups_per_batch * 100]
    int rows;          // filled rows (the last batch of an epoch may be short)
    int epoch, batch;  // which batch of the plan it holds
    bool full;         // filled and not yet handed back
} Slot;

struct H5Stream {
    const H5Part *part;
    DistributedSampler sampler;  // the reader's own copy: it runs ahead of the loop's
    int groups_per_batch, epochs;

    pthread_t thread;
    pthread_mutex_t lock;        // guards the slots' `full`, `stopping` and the statistics
    pthread_cond_t changed;      // a slot was filled or handed back, or stop was asked
    Slot slots[2];               // double buffering: batch k of the plan goes to slots[k % 2]
    long taken;                  // batches handed to the loop so far
    bool holding;                // the loop trains on slots[(taken - 1) % 2]
    bool stopping;               // asked by h5_stream_stop
    bool finished;               // the reader has read its whole plan

    // The reader thread's alone.
    uint8_t *raw;                // [100 * 784]: one group as stored, for uint8 files
    hid_t image_space, label_space;              // the datasets' dataspaces: select a group in them
    hid_t group_image_space, group_label_space;  // one group in memory: [1, 100, 1, 28, 28] and [1, 100]

    Tensor on_device;            // the batch copied to the device, when that is not the CPU

    // Statistics (under `lock`).
    double read_seconds;     // the reader inside HDF5 and converting
    long long samples_read;
    double wait_seconds;     // the loop blocked in h5_stream_next
};

// Group `group` of the part, as one hyperslab of each dataset: exactly one
// chunk, so HDF5 reads and inflates that chunk and nothing else. Pixels land
// in `pixels` as stored (float32 or uint8), labels in `labels` as int.
static void read_group(H5Stream *s, int group, void *pixels, int *labels) {
    const H5Part *part = s->part;
    const hsize_t image_start[5] = {(hsize_t)group, 0, 0, 0, 0}, label_start[2] = {(hsize_t)group, 0};
    hid_t pixel_type = part->pixels == H5_PIXELS_FLOAT32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT8;
    pthread_mutex_lock(&hdf5_lock);
    herr_t status = H5Sselect_hyperslab(s->image_space, H5S_SELECT_SET, image_start, NULL, image_group, NULL);
    if (status >= 0)
        status = H5Dread(part->images, pixel_type, s->group_image_space, s->image_space, H5P_DEFAULT, pixels);
    if (status >= 0)
        status = H5Sselect_hyperslab(s->label_space, H5S_SELECT_SET, label_start, NULL, label_group, NULL);
    if (status >= 0)  // int64 (or any integer type) in the file, converted by HDF5
        status = H5Dread(part->labels, H5T_NATIVE_INT, s->group_label_space, s->label_space, H5P_DEFAULT, labels);
    pthread_mutex_unlock(&hdf5_lock);
    // The layout was validated at open: a failure now is a damaged chunk.
    CHECK(status >= 0, "%s: cannot read group %d of '%s' (a damaged chunk?)", part->path, group, part->name);
    for (int i = 0; i < H5_GROUP_SIZE; i++)
        CHECK(labels[i] >= 0 && labels[i] < MNIST_CLASSES,
              "%s: '%s/labels' group %d, sample %d: label %d (expected 0..9)", part->path, part->name, group, i,
              labels[i]);
}

// Fill `slot` with batch `batch` of the reader's sampler (at its current epoch).
static void read_batch(H5Stream *s, int batch, Slot *slot) {
    int first = batch * s->groups_per_batch;
    int n_groups = s->sampler.num_samples - first < s->groups_per_batch ? s->sampler.num_samples - first
                                                                         : s->groups_per_batch;
    for (int g = 0; g < n_groups; g++) {
        int group = s->sampler.indices[first + g];
        float *images = slot->images.data + (size_t)g * GROUP_PIXELS;  // [100, 784]
        int *labels = slot->labels + g * H5_GROUP_SIZE;                // [100]
        if (s->part->pixels == H5_PIXELS_FLOAT32) {
            read_group(s, group, images, labels);  // straight into the batch
        } else {
            read_group(s, group, s->raw, labels);
            mnist_pixels_to_float(s->raw, images, GROUP_PIXELS);
        }
    }
    slot->rows = n_groups * H5_GROUP_SIZE;
}

// The plan: every batch of every epoch, in the training loop's order.
static void *reader_main(void *arg) {
    H5Stream *s = arg;
    long k = 0;  // batches read so far; batch k goes to slots[k % 2]
    for (int epoch = 0; epoch < s->epochs; epoch++) {
        sampler_set_epoch(&s->sampler, epoch);
        int n_batches = sampler_num_batches(&s->sampler, s->groups_per_batch);
        for (int b = 0; b < n_batches; b++, k++) {
            Slot *slot = &s->slots[k % 2];
            pthread_mutex_lock(&s->lock);
            while (slot->full && !s->stopping) pthread_cond_wait(&s->changed, &s->lock);
            bool stopping = s->stopping;
            pthread_mutex_unlock(&s->lock);
            if (stopping) return NULL;

            double start = wall_seconds();
            read_batch(s, b, slot);  // the slot is ours alone until we mark it full
            double seconds = wall_seconds() - start;

            pthread_mutex_lock(&s->lock);
            slot->epoch = epoch, slot->batch = b, slot->full = true;
            s->read_seconds += seconds;
            s->samples_read += slot->rows;
            pthread_cond_broadcast(&s->changed);
            pthread_mutex_unlock(&s->lock);
        }
    }
    pthread_mutex_lock(&s->lock);
    s->finished = true;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

// ------------------------------------------------------------------ the training loop's side

H5Stream *h5_stream_start(const H5Part *part, const DistributedSampler *sampler, int groups_per_batch,
                          int epochs, Device device) {
    CHECK(sampler->dataset_size == part->n_groups, "a sampler over %d groups for '%s', which has %d",
          sampler->dataset_size, part->name, part->n_groups);
    CHECK(groups_per_batch >= 1 && epochs >= 1, "a stream of %d groups per batch, %d epochs", groups_per_batch,
          epochs);
    H5Stream *s = xcalloc(1, sizeof *s);
    *s = (H5Stream){.part = part, .groups_per_batch = groups_per_batch, .epochs = epochs};
    s->sampler = sampler_new(sampler->dataset_size, sampler->world_size, sampler->rank, sampler->shuffle,
                             sampler->seed);
    int rows = groups_per_batch * H5_GROUP_SIZE;
    for (int i = 0; i < 2; i++) {
        s->slots[i].images = tensor_zeros(rows, MNIST_PIXELS, DEVICE_CPU);  // [B, 784]
        s->slots[i].labels = xmalloc((size_t)rows * sizeof(int));          // [B]
    }
    if (part->pixels == H5_PIXELS_UINT8) s->raw = xmalloc(GROUP_PIXELS);
    if (device != DEVICE_CPU) s->on_device = tensor_zeros(rows, MNIST_PIXELS, device);

    pthread_mutex_lock(&hdf5_lock);
    s->image_space = H5Dget_space(part->images);
    s->label_space = H5Dget_space(part->labels);
    // The memory side has the selection's own shape: with a flat [78400] one,
    // HDF5 takes its general gather path and reads 4x slower.
    s->group_image_space = H5Screate_simple(5, image_group, NULL);
    s->group_label_space = H5Screate_simple(2, label_group, NULL);
    pthread_mutex_unlock(&hdf5_lock);
    CHECK(s->image_space >= 0 && s->label_space >= 0 && s->group_image_space >= 0 && s->group_label_space >= 0,
          "%s: cannot make the dataspaces of '%s'", part->path, part->name);

    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    int status = pthread_create(&s->thread, NULL, reader_main, s);
    CHECK(status == 0, "cannot start the HDF5 reader thread: %s", strerror(status));
    return s;
}

Tensor h5_stream_next(H5Stream *s, int epoch, int batch, int *labels) {
    double start = wall_seconds();
    pthread_mutex_lock(&s->lock);
    if (s->holding) {  // the loop is done with the previous batch: the reader may refill it
        s->slots[(s->taken - 1) % 2].full = false;
        s->holding = false;
        pthread_cond_broadcast(&s->changed);
    }
    Slot *slot = &s->slots[s->taken % 2];
    while (!slot->full && !s->finished) pthread_cond_wait(&s->changed, &s->lock);
    // Asking past the end would wait forever: say so instead.
    CHECK(slot->full, "'%s' stream: the loop asks for epoch %d batch %d, past the %d epochs planned",
          s->part->name, epoch, batch, s->epochs);
    s->taken++;
    s->holding = true;
    s->wait_seconds += wall_seconds() - start;
    pthread_mutex_unlock(&s->lock);
    // The loop and the reader walk the same plan; if they disagree, say so
    // rather than train on the wrong data.
    CHECK(slot->epoch == epoch && slot->batch == batch,
          "'%s' stream: the loop asks for epoch %d batch %d, the reader has epoch %d batch %d", s->part->name,
          epoch, batch, slot->epoch, slot->batch);

    memcpy(labels, slot->labels, (size_t)slot->rows * sizeof(int));
    Tensor images = tensor_rows(&slot->images, slot->rows);  // [rows, 784]
    if (s->on_device.data == NULL) return images;
    Tensor on_device = tensor_rows(&s->on_device, slot->rows);
    tensor_copy(&on_device, &images);
    return on_device;
}

void h5_stream_stop(H5Stream *s) {
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);

    pthread_mutex_lock(&hdf5_lock);
    H5Sclose(s->image_space);
    H5Sclose(s->label_space);
    H5Sclose(s->group_image_space);
    H5Sclose(s->group_label_space);
    pthread_mutex_unlock(&hdf5_lock);
    for (int i = 0; i < 2; i++) {
        tensor_free(&s->slots[i].images);
        free(s->slots[i].labels);
    }
    if (s->on_device.data) tensor_free(&s->on_device);
    free(s->raw);
    sampler_free(&s->sampler);
    free(s);
}

void h5_stream_describe_all_ranks(H5Stream *s, double loop_seconds, char *out, size_t size) {
    pthread_mutex_lock(&s->lock);
    // Means over ranks: [read seconds, wait seconds, samples read, loop seconds].
    double mean[4] = {s->read_seconds, s->wait_seconds, (double)s->samples_read, loop_seconds};
    pthread_mutex_unlock(&s->lock);
    int world = dist_world_size();
    if (world > 1) CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, mean, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    for (int i = 0; i < 4; i++) mean[i] /= world;
    // Counted as what the loop receives, float32 pixels, whatever the storage:
    // so the two storage types compare on the same work.
    double megabytes = mean[2] * MNIST_PIXELS * sizeof(float) / 1e6;
    snprintf(out, size,
             "read %.0f samples (%.1f MB of float32 pixels) from %s chunks in %.2f s: %.0f MB/s; the loop waited "
             "%.2f s for data (%.0f%% of %.2f s)%s",
             mean[2], megabytes, s->part->pixels == H5_PIXELS_FLOAT32 ? "float32" : "uint8", mean[0],
             megabytes / (mean[0] > 0 ? mean[0] : 1e-9), mean[1], 100 * mean[1] / (mean[3] > 0 ? mean[3] : 1e-9),
             mean[3], world > 1 ? ", means over ranks" : "");
}
