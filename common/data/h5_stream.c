// h5_stream.c: the MNIST HDF5 reader and its workers. See h5_stream.h.
#include "data/h5_stream.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/paths.h"
#include "base/timer.h"
#include "runtime/dist.h"
#include "runtime/threads.h"
#if HAVE_CUDA
#include "tensor/kernels.h"
#endif

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
    // How each group is read: raw chunks inflated by the workers, or H5Dread.
    // Literals: an H5Part is copied by value (h5_mnist_open returns it), and
    // its datasets' messages point at these names.
    bool train = strcmp(name, "train") == 0;
    part->images_name = train ? "train/images" : "test/images";
    part->labels_name = train ? "train/labels" : "test/labels";
    hid_t pixel_type = part->pixels == H5_PIXELS_FLOAT32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT8;
    if (!h5_chunked_open(&part->image_chunks, part->images, path, part->images_name, pixel_type, err, err_size) ||
        !h5_chunked_open(&part->label_chunks, part->labels, path, part->labels_name, H5T_NATIVE_INT64, err, err_size))
        return false;
    part->image_chunks.unit = part->label_chunks.unit = "group";
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
    char err[8192] = "";  // (room for the paths of the hints below)
    const char *problem;  // what the path names, if not a file (paths.h)
    h5_lock();
    // HDF5 prints its whole error stack on every failed call by default; each
    // call is checked here, and one line of our own says what is wrong.
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char cwd[1024] = "?", above[1024], root[1024];
    if (access(path, R_OK) != 0) {
        // The one problem with an obvious fix: say which command writes the file.
        // But a relative path is relative to the working directory, which may
        // not be the repository root (`./11_multinode_streaming` inside day2/).
        int why = errno;
        bool default_path = strcmp(path, H5_DEFAULT_FILE) == 0, relative = *path != '/';
        bool have_root = relative && program_repository(root, sizeof root);
        if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
        if (why == ENOENT && find_from_above(path, above, sizeof above)) {
            char hint[6144];
            run_from_hint(above, "--h5", path, hint, sizeof hint);
            snprintf(err, sizeof err, "%.200s: not found %s", path, hint);
        } else if (why == ENOENT && default_path && have_root && strcmp(root, cwd) != 0) {
            snprintf(err, sizeof err, "%s: cannot open: %s (working directory %s). Write it with `day2/create_mnist_h5` in the repository root %s and run from there",
                     path, strerror(why), cwd, root);
        } else {
            snprintf(err, sizeof err, "%.200s: cannot open: %s%s%s%s. Write it with `day2/create_mnist_h5%s%.200s`", path,
                     strerror(why), relative ? " (working directory " : "", relative ? cwd : "", relative ? ")" : "",
                     default_path ? "" : " --out ", default_path ? "" : path);
        }
    } else if ((problem = input_file_problem(path))) {
        snprintf(err, sizeof err, "%s: %s, not an HDF5 file", path, problem);
    } else if (!is_hdf5(path)) {
        snprintf(err, sizeof err, "%s: not an HDF5 file", path);
    } else if ((mnist.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
        // HDF5 knows why ("truncated file: eof = ..."): say it on our line.
        char why[256];
        h5_last_error(why, sizeof why);
        snprintf(err, sizeof err, "%s: cannot open the HDF5 file%s%s", path, *why ? ": " : "", why);
    } else if (open_part(mnist.file, mnist.path, "train", &mnist.train, err, sizeof err)) {
        open_part(mnist.file, mnist.path, "test", &mnist.test, err, sizeof err);
    }
    h5_unlock();
    // Every rank opens the same file: one line says what is wrong, all stop together.
    check_all_ranks(err[0] == '\0', err);
    // A file the workers cannot read themselves still trains, slower: say so once.
    const H5ChunkedDataset *datasets[] = {&mnist.train.image_chunks, &mnist.train.label_chunks,
                                          &mnist.test.image_chunks, &mnist.test.label_chunks};
    char slow[1024] = "";
    for (int i = 0, len = 0; i < 4 && len < (int)sizeof slow; i++)
        if (!datasets[i]->direct)
            len += snprintf(slow + len, sizeof slow - len, "%s'%s' (%s)", len ? ", " : "", datasets[i]->name,
                            datasets[i]->why_not_direct);
    if (*slow)
        print0("Data: %s: read with H5Dread, one worker at a time: %s. day2/create_mnist_h5 writes chunks that the "
               "workers read in parallel\n",
               path, slow);
    return mnist;
}

void h5_mnist_close(H5Mnist *mnist) {
    h5_lock();
    close_part(&mnist->train);
    close_part(&mnist->test);
    if (mnist->file >= 0) H5Fclose(mnist->file);
    h5_unlock();
    free(mnist->path);
    *mnist = (H5Mnist){.file = H5I_INVALID_HID};
}

// ------------------------------------------------------------------ the workers

#define GROUP_PIXELS ((size_t)H5_GROUP_SIZE * MNIST_PIXELS)

typedef enum { SLOT_FREE, SLOT_FILLED, SLOT_HELD } SlotState;

// One batch of the plan, as a worker fills it and the training loop reads it.
typedef struct {
    void *pixels;      // [groups_per_batch * 100, 784] as stored, uint8 or float32 (page-locked
                       // for a GPU: its copy runs at full speed, asynchronously)
    int *labels;       // [groups_per_batch * 100]
    int rows;          // filled rows (the last batch of an epoch may be short)
    long batch;        // its place in the plan: epoch * batches_per_epoch + batch
    SlotState state;   // FREE -> (worker) FILLED -> (loop) HELD -> (loop) FREE
    bool uploaded;     // GPU: its copy to the device is queued
    char *error;       // the worker's one-line failure, instead of data
#if HAVE_CUDA
    cudaEvent_t copied;  // GPU: its copy to the device is done (the compute stream and, to refill it, the worker wait for it)
#endif
} Slot;

typedef struct {
    struct H5Stream *stream;
    int index;
    pthread_t thread;
    DistributedSampler sampler;  // its own copy, walked epoch by epoch
    H5ChunkScratch scratch;      // its own buffers for raw chunks and zlib
    int64_t group_labels[H5_GROUP_SIZE];
    // Statistics (under the stream's lock once the worker has stopped).
    long batches, samples;
    double busy_seconds;
} Worker;

struct H5Stream {
    const H5Part *part;
    int groups_per_batch, batches_per_epoch;
    long n_planned;              // batches in all the epochs
    int n_workers, prefetch, n_slots;
    Worker *workers;
    Slot *slots;                 // batch k of the plan goes to slots[k % n_slots]
    bool to_gpu;                 // batches go to the GPU
    Tensor images;               // [B, 784] float32 on the stream's device, for uint8 files

    pthread_mutex_t lock;        // guards the slots' state and `stopping`
    pthread_cond_t changed;      // a slot was filled or handed back, or stop was asked
    long taken;                  // batches handed to the loop so far
    bool stopping;               // asked by h5_stream_stop
    double wait_seconds;         // the loop blocked in h5_stream_next

#if HAVE_CUDA
    // Batch k's stored pixels go to staging[k % 2] on the copy stream; uint8
    // ones are then converted into `images` on the compute stream.
    cudaStream_t copy_stream;
    void *staging[2];
    cudaEvent_t consumed[2];     // all of batch k's work is queued before this (compute stream)
#endif
};

static size_t stored_pixel_bytes(const H5Part *part) {
    return part->pixels == H5_PIXELS_FLOAT32 ? sizeof(float) : sizeof(uint8_t);
}

// Batch `batch` of the worker's sampler (at its current epoch) into `slot`.
// Returns false with a line in err on the first damaged group.
static bool read_batch(Worker *w, int batch, Slot *slot, char *err, size_t err_size) {
    H5Stream *s = w->stream;
    const H5Part *part = s->part;
    int first = batch * s->groups_per_batch, left = w->sampler.num_samples - first;
    int n_groups = left < s->groups_per_batch ? left : s->groups_per_batch;
    // The pixels stay as stored: uint8 is 4x less to move, and the conversion
    // to float32 runs where the batch is used, on every core or on the GPU.
    size_t group_bytes = GROUP_PIXELS * stored_pixel_bytes(part);
    for (int g = 0; g < n_groups; g++) {
        int group = w->sampler.indices[first + g];
        void *rows = (char *)slot->pixels + (size_t)g * group_bytes;
        if (!h5_chunk_read(&part->image_chunks, group, rows, &w->scratch, err, err_size) ||
            !h5_chunk_read(&part->label_chunks, group, w->group_labels, &w->scratch, err, err_size))
            return false;
        for (int i = 0; i < H5_GROUP_SIZE; i++) {
            int64_t label = w->group_labels[i];
            if (label < 0 || label >= MNIST_CLASSES) {
                snprintf(err, err_size, "%s: '%s' group %d, sample %d: label %lld (expected 0..9)", part->path,
                         part->labels_name, group, i, (long long)label);
                return false;
            }
            slot->labels[g * H5_GROUP_SIZE + i] = (int)label;
        }
    }
    slot->rows = n_groups * H5_GROUP_SIZE;
    return true;
}

// Worker w's part of the plan: batches w, w + W, w + 2W, ... of all the epochs,
// as PyTorch's DataLoader deals batches to its workers.
static void *worker_main(void *arg) {
    Worker *w = arg;
    H5Stream *s = w->stream;
    int epoch = -1;
    // A thread-safe HDF5 keeps its error stack, and whether to print it, per thread: silence
    // this one's too, or a damaged chunk adds HDF5's whole stack after our one line.
    h5_lock();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    h5_unlock();
    if (s->to_gpu) device_bind_thread();  // it waits on CUDA events of our GPU
    for (long k = w->index; k < s->n_planned; k += s->n_workers) {
        Slot *slot = &s->slots[k % s->n_slots];
        pthread_mutex_lock(&s->lock);
        while (slot->state != SLOT_FREE && !s->stopping) pthread_cond_wait(&s->changed, &s->lock);
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        if (stopping) break;
#if HAVE_CUDA
        // Its last batch may still be on its way to the GPU (from page-locked memory, asynchronously):
        // this worker waits for that copy, so that the training loop never does.
        if (s->to_gpu && slot->uploaded) device_wait_event(slot->copied, "a batch's copy to the GPU");
#endif

        if (k / s->batches_per_epoch != epoch) sampler_set_epoch(&w->sampler, epoch = (int)(k / s->batches_per_epoch));
        double start = wall_seconds();
        char err[512] = "";
        bool ok = read_batch(w, (int)(k % s->batches_per_epoch), slot, err, sizeof err);  // the slot is ours alone
        double seconds = wall_seconds() - start;

        pthread_mutex_lock(&s->lock);
        slot->batch = k;
        slot->uploaded = false;
        slot->error = ok ? NULL : strdup(err);
        slot->state = SLOT_FILLED;
        w->batches++, w->samples += ok ? slot->rows : 0, w->busy_seconds += seconds;
        pthread_cond_broadcast(&s->changed);
        pthread_mutex_unlock(&s->lock);
        if (!ok) break;  // the loop ends the job when it reaches this batch
    }
    return NULL;
}

void h5_stream_add_memory_need(MemoryNeed *need, int batch_size, int workers, int prefetch) {
    double slot = (double)batch_size * (MNIST_PIXELS * sizeof(float) + sizeof(int));  // float32 pixels at most
    memory_need_add(need, "batch slots", (double)workers * prefetch * slot + (double)batch_size * MNIST_PIXELS * sizeof(float));
}

int h5_stream_default_workers(Device device) {
    int computing = device == DEVICE_CPU ? threads_count() : 1;
    int spare = threads_rank_cores() - computing;
    return spare > 1 ? spare : 1;
}

// ------------------------------------------------------------------ the copy to the GPU
#if HAVE_CUDA
// Queue batch k's copy (its slot is filled) into staging[k % 2], once the
// compute stream is past batch k - 2, the last user of that buffer.
static void upload(H5Stream *s, long k, Slot *slot) {
    int buffer = (int)(k % 2);
    size_t bytes = (size_t)slot->rows * MNIST_PIXELS * stored_pixel_bytes(s->part);
    CHECK_CUDA(cudaStreamWaitEvent(s->copy_stream, s->consumed[buffer], 0));
    CHECK_CUDA(cudaMemcpyAsync(s->staging[buffer], slot->pixels, bytes, cudaMemcpyHostToDevice, s->copy_stream));
    CHECK_CUDA(cudaEventRecord(slot->copied, s->copy_stream));
    slot->uploaded = true;
}

// The loop takes batch k: make its pixels float32 on the GPU, in stream order.
static Tensor batch_on_gpu(H5Stream *s, long k, Slot *slot) {
    int buffer = (int)(k % 2);
    if (!slot->uploaded) upload(s, k, slot);  // not copied ahead: the workers were late
    CHECK_CUDA(cudaStreamWaitEvent(device_stream(), slot->copied, 0));
    Tensor images = {.data = s->staging[buffer], .rows = slot->rows, .cols = MNIST_PIXELS, .device = DEVICE_CUDA};
    if (s->part->pixels == H5_PIXELS_UINT8) {
        images = tensor_rows(&s->images, slot->rows);
        gpu_pixels_to_float(s->staging[buffer], tensor_numel(&images), images.data, device_stream());
    }
    // Batch k + 1 already read? Copy it now: the copy runs while the GPU computes batch k.
    Slot *next = &s->slots[(k + 1) % s->n_slots];
    pthread_mutex_lock(&s->lock);
    bool ready = k + 1 < s->n_planned && next != slot && next->state == SLOT_FILLED && next->batch == k + 1 &&
                 !next->error;
    pthread_mutex_unlock(&s->lock);
    if (ready) upload(s, k + 1, next);  // a FILLED slot is the loop's to read: the worker waits for FREE
    return images;
}
#endif

// ------------------------------------------------------------------ the training loop's side

H5Stream *h5_stream_start(const H5Part *part, const DistributedSampler *sampler, int groups_per_batch,
                          int epochs, Device device, int workers, int prefetch) {
    CHECK(sampler->dataset_size == part->n_groups, "a sampler over %d groups for '%s', which has %d",
          sampler->dataset_size, part->name, part->n_groups);
    CHECK(groups_per_batch >= 1 && epochs >= 1 && workers >= 1 && prefetch >= 1,
          "a stream of %d groups per batch, %d epochs, %d workers, %d batches ahead", groups_per_batch, epochs,
          workers, prefetch);
    H5Stream *s = xcalloc(1, sizeof *s);
    s->part = part;
    s->groups_per_batch = groups_per_batch;
    s->batches_per_epoch = sampler_num_batches(sampler, groups_per_batch);
    s->n_planned = (long)epochs * s->batches_per_epoch;
    s->n_workers = workers, s->prefetch = prefetch, s->n_slots = workers * prefetch;
    s->to_gpu = device != DEVICE_CPU;

    int rows = groups_per_batch * H5_GROUP_SIZE;
    size_t pixel_bytes = (size_t)rows * MNIST_PIXELS * stored_pixel_bytes(part);
    // (The caller has checked that they fit: h5_stream_add_memory_need.)
    s->slots = xcalloc((size_t)s->n_slots, sizeof *s->slots);
    for (int i = 0; i < s->n_slots; i++) {
        s->slots[i].pixels = s->to_gpu ? device_host_alloc(pixel_bytes) : xmalloc(pixel_bytes);
        s->slots[i].labels = xmalloc((size_t)rows * sizeof(int));
        s->slots[i].batch = -1;
#if HAVE_CUDA
        if (s->to_gpu) CHECK_CUDA(cudaEventCreateWithFlags(&s->slots[i].copied, cudaEventDisableTiming));
#endif
    }
#if HAVE_CUDA
    if (s->to_gpu) {
        CHECK_CUDA(cudaStreamCreateWithFlags(&s->copy_stream, cudaStreamNonBlocking));
        for (int i = 0; i < 2; i++) {
            s->staging[i] = device_alloc((size_t)rows * MNIST_PIXELS * stored_pixel_bytes(part));
            CHECK_CUDA(cudaEventCreateWithFlags(&s->consumed[i], cudaEventDisableTiming));
        }
    }
#endif
    if (part->pixels == H5_PIXELS_UINT8) s->images = tensor_zeros(rows, MNIST_PIXELS, device);

    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    s->workers = xcalloc((size_t)workers, sizeof *s->workers);
    for (int i = 0; i < workers; i++) {
        Worker *w = &s->workers[i];
        w->stream = s, w->index = i;
        w->sampler = sampler_new(sampler->dataset_size, sampler->world_size, sampler->rank, sampler->shuffle,
                                 sampler->seed);
        int status = pthread_create(&w->thread, NULL, worker_main, w);
        CHECK(status == 0, "cannot start HDF5 reader worker %d: %s", i, strerror(status));
    }
    return s;
}

Tensor h5_stream_next(H5Stream *s, int epoch, int batch, int *labels) {
    long k = (long)epoch * s->batches_per_epoch + batch;
    // The loop and the workers walk the same plan; if they disagree, say so
    // rather than train on the wrong data (or wait forever).
    CHECK(k == s->taken && k < s->n_planned && batch < s->batches_per_epoch,
          "'%s' stream: the loop asks for epoch %d batch %d, the plan's next is epoch %ld batch %ld of %ld batches",
          s->part->name, epoch, batch, s->taken / s->batches_per_epoch, s->taken % s->batches_per_epoch,
          s->n_planned);
    double start = wall_seconds();
    Slot *previous = k > 0 ? &s->slots[(k - 1) % s->n_slots] : NULL;
#if HAVE_CUDA
    // Everything of batch k - 1 is queued: its staging buffer is free after that. (Its host slot is
    // refilled once its copy is done: the worker that refills it waits for that, not this loop.)
    if (s->to_gpu && previous) CHECK_CUDA(cudaEventRecord(s->consumed[(k - 1) % 2], device_stream()));
#endif
    Slot *slot = &s->slots[k % s->n_slots];
    pthread_mutex_lock(&s->lock);
    if (previous) {  // the loop is done with batch k - 1: its worker may refill the slot
        previous->state = SLOT_FREE;
        pthread_cond_broadcast(&s->changed);
    }
    while (!(slot->state == SLOT_FILLED && slot->batch == k)) pthread_cond_wait(&s->changed, &s->lock);
    slot->state = SLOT_HELD;
    s->taken++;
    s->wait_seconds += wall_seconds() - start;
    pthread_mutex_unlock(&s->lock);
    // A damaged chunk or a bad label, found by a worker. Every rank takes as many batches as the
    // others, in step (the training loop is the same on every rank), so each batch is a collective
    // and the ranks agree on it: one line, from the lowest rank that met one, once the readers are
    // stopped. (MPI_Abort from the rank that met it would do where one rank's slice is damaged; where
    // several are, a file damaged throughout, each printed its line before Open MPI took it down.)
    // One int's MPI_Allreduce a batch.
    int ok = slot->error == NULL, all_ok = ok;
    if (dist_world_size() > 1) CHECK_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all_ok) {
        char message[1024];
        snprintf(message, sizeof message, "%s", ok ? "" : slot->error);
        h5_stream_stop(s);  // (no reader left inside HDF5 as the ranks leave)
        check_all_ranks(ok, message);
    }

    memcpy(labels, slot->labels, (size_t)slot->rows * sizeof(int));
#if HAVE_CUDA
    if (s->to_gpu) return batch_on_gpu(s, k, slot);
#endif
    Tensor stored = {.data = slot->pixels, .rows = slot->rows, .cols = MNIST_PIXELS, .device = DEVICE_CPU};
    if (s->part->pixels == H5_PIXELS_FLOAT32) return stored;
    // uint8 -> float32 / 255 on every core, as step 10's gather does: x.float().div(255).
    Tensor images = tensor_rows(&s->images, slot->rows);
    const uint8_t *pixels = slot->pixels;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < slot->rows; r++)
        mnist_pixels_to_float(pixels + (size_t)r * MNIST_PIXELS, images.data + (size_t)r * MNIST_PIXELS, MNIST_PIXELS);
    return images;
}

void h5_stream_stop(H5Stream *s) {
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < s->n_workers; i++) {
        Worker *w = &s->workers[i];
        pthread_join(w->thread, NULL);
        sampler_free(&w->sampler);
        h5_chunk_scratch_free(&w->scratch);
    }
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
#if HAVE_CUDA
    if (s->to_gpu) {
        // The last copies may still run from the page-locked slots.
        device_wait_stream(s->copy_stream, "the copy stream");
        CHECK_CUDA(cudaStreamDestroy(s->copy_stream));
        for (int i = 0; i < 2; i++) {
            device_free(s->staging[i]);
            CHECK_CUDA(cudaEventDestroy(s->consumed[i]));
        }
    }
#endif
    if (s->images.data) tensor_free(&s->images);
    for (int i = 0; i < s->n_slots; i++) {
#if HAVE_CUDA
        if (s->to_gpu) CHECK_CUDA(cudaEventDestroy(s->slots[i].copied));
#endif
        if (s->to_gpu) device_host_free(s->slots[i].pixels);
        else free(s->slots[i].pixels);
        free(s->slots[i].labels);
        free(s->slots[i].error);
    }
    free(s->slots);
    free(s->workers);
    free(s);
}

void h5_stream_describe_all_ranks(H5Stream *s, double loop_seconds, char *out, size_t size) {
    // Means over ranks: [busy seconds, wait seconds, samples read, loop seconds, workers].
    double mean[5] = {0, s->wait_seconds, 0, loop_seconds, s->n_workers};
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_workers; i++) mean[0] += s->workers[i].busy_seconds, mean[2] += s->workers[i].samples;
    pthread_mutex_unlock(&s->lock);
    int world = dist_world_size();
    if (world > 1) CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, mean, 5, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    for (int i = 0; i < 5; i++) mean[i] /= world;
    // Counted as what the loop receives, float32 pixels, whatever the storage:
    // so that the storages compare on the same work.
    const double float_megabytes = MNIST_PIXELS * sizeof(float) / 1e6;
    double megabytes = mean[2] * float_megabytes;
    // The share of the loop spent waiting, from the seconds as printed, so that
    // the line agrees with itself ("0.00 s ... (0% of 0.68 s)", never 1%).
    double wait_shown = round(100 * mean[1]) / 100, loop_shown = round(100 * mean[3]) / 100;
    double wait_share = loop_shown > 0 ? 100 * wait_shown / loop_shown : 0.0;
    int len = snprintf(out, size,
                       "Data: read %.0f samples (%.1f MB of float32 pixels) from %s chunks, %g worker%s busy %.2f s "
                       "in all: %.0f MB/s per worker; the loop waited %.2f s for data (%.0f%% of %.2f s)%s\n",
                       mean[2], megabytes, s->part->pixels == H5_PIXELS_FLOAT32 ? "float32" : "uint8", mean[4],
                       mean[4] == 1 ? "" : "s", mean[0], megabytes / (mean[0] > 0 ? mean[0] : 1e-9), mean[1],
                       wait_share, mean[3], world > 1 ? ", means over ranks" : "");
    // The workers have read their whole plan (or stopped): their counters are still.
    for (int i = 0; i < s->n_workers && len < (int)size; i++) {
        const Worker *w = &s->workers[i];
        len += snprintf(out + len, size - len,
                        "Data: %sworker %d: %ld batch%s (%ld samples), busy %.2f s, %.2f s of it in HDF5: %.0f MB/s\n",
                        world > 1 ? "rank 0's " : "", i, w->batches, w->batches == 1 ? "" : "es", w->samples, w->busy_seconds,
                        w->scratch.hdf5_seconds,
                        (double)w->samples * float_megabytes / (w->busy_seconds > 0 ? w->busy_seconds : 1e-9));
    }
}
