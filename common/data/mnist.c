// mnist.c: IDX reader, data set, sampler, batches. See mnist.h.
#include "data/mnist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>  // getcwd

#include <zlib.h>

#include "base/check.h"
#include "base/cpu_dispatch.h"
#if HAVE_CUDA
#include "tensor/kernels.h"
#endif
#include "base/paths.h"
#include "base/rng.h"
#include "runtime/profile.h"

// ------------------------------------------------------------------ IDX files

#define IDX_MAX_BYTES ((size_t)1 << 31)  // far above MNIST's 47 MB; guards against garbage

// Slurp a file through zlib, which reads gzip and plain files alike.
static uint8_t *read_all(const char *path, size_t *size, char *err, size_t err_size) {
    const char *problem = input_file_problem(path);
    if (problem) {
        snprintf(err, err_size, "%s", problem);
        return NULL;
    }
    gzFile file = gzopen(path, "rb");
    if (!file) {
        snprintf(err, err_size, "cannot open: %s", strerror(errno));
        return NULL;
    }
    size_t capacity = 1 << 20, used = 0;
    uint8_t *buf = xmalloc(capacity);
    for (;;) {
        if (used == capacity) {
            if (capacity >= IDX_MAX_BYTES) {
                snprintf(err, err_size, "larger than %zu bytes: not an MNIST file", IDX_MAX_BYTES);
                gzclose(file), free(buf);
                return NULL;
            }
            capacity *= 2;
            buf = realloc(buf, capacity);
            CHECK(buf, "out of memory reading %s", path);
        }
        int got = gzread(file, buf + used, (unsigned)(capacity - used));
        if (got < 0) {
            int code;
            snprintf(err, err_size, "corrupt gzip data (%s)", gzerror(file, &code));
            gzclose(file), free(buf);
            return NULL;
        }
        if (got == 0) break;
        used += (size_t)got;
    }
    // A gzip stream cut short reads like a short file; zlib tells us at close.
    if (gzclose(file) != Z_OK) {
        snprintf(err, err_size, "truncated or corrupt gzip stream");
        free(buf);
        return NULL;
    }
    *size = used;
    return buf;
}

static uint32_t big_endian_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

bool idx_read(const char *path, int ndim, IdxArray *out, char *err, size_t err_size) {
    *out = (IdxArray){0};
    size_t size = 0;
    uint8_t *raw = read_all(path, &size, err, err_size);
    if (!raw) return false;

    size_t header = 4 + 4 * (size_t)ndim;
    uint32_t expected_magic = 0x00000800u | (uint32_t)ndim;  // 0x08: unsigned bytes
    if (size == 0) {
        snprintf(err, err_size, "file is empty (expected an IDX file)");
        goto fail;
    }
    if (size < header) {
        snprintf(err, err_size, "only %zu bytes: too short for an IDX header of %zu bytes", size, header);
        goto fail;
    }
    uint32_t magic = big_endian_u32(raw);
    if (magic != expected_magic) {
        snprintf(err, err_size, "bad magic number 0x%08x (expected 0x%08x: IDX, unsigned bytes, %d dimension%s)",
                 magic, expected_magic, ndim, ndim > 1 ? "s" : "");
        goto fail;
    }
    size_t payload = 1;
    for (int d = 0; d < ndim; d++) {
        uint32_t dim = big_endian_u32(raw + 4 + 4 * d);
        if (dim == 0 || dim > (uint32_t)IDX_MAX_BYTES) {
            snprintf(err, err_size, "dimension %d is %u (expected 1 to %zu)", d, dim, IDX_MAX_BYTES);
            goto fail;
        }
        out->dims[d] = (int)dim;
        payload *= dim;
        if (payload > IDX_MAX_BYTES) {
            snprintf(err, err_size, "header promises more than %zu bytes: not an MNIST file", IDX_MAX_BYTES);
            goto fail;
        }
    }
    if (size - header != payload) {
        snprintf(err, err_size, "%s: the header promises %zu bytes of data, the file holds %zu",
                 size - header < payload ? "truncated" : "trailing bytes", payload, size - header);
        goto fail;
    }
    out->ndim = ndim;
    out->data = xmalloc_huge_pages(payload);  // the gather reads it at random
    memcpy(out->data, raw + header, payload);
    free(raw);
    return true;
fail:
    free(raw);
    return false;
}

void idx_free(IdxArray *array) {
    free(array->data);
    *array = (IdxArray){0};
}

// ------------------------------------------------------------------ the data set

// "<dir>/<stem>" if present, else "<dir>/<stem>.gz". False, with a hint, if neither.
static bool find_file(const char *dir, const char *stem, char *path, size_t size, char *err, size_t err_size) {
    struct stat st;
    snprintf(path, size, "%s/%s", dir, stem);
    if (stat(path, &st) == 0) return true;
    snprintf(path, size, "%s/%s.gz", dir, stem);
    if (stat(path, &st) == 0) return true;
    if (*dir == '/') {  // the folder that --data named
        snprintf(err, err_size, "MNIST not found: no %s/%s[.gz]. Run `make data` (or pass --data DIR)", dir, stem);
        return false;
    }
    // A relative folder: relative to the working directory, which may not be
    // the repository root (`./2_mnist_training` inside day1/). Where the files
    // are above it, say so; `make data` only where they are nowhere, and
    // where they are the ones it fetches.
    char cwd[2048] = "?", above[2048], root[2048], hint[6144];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    bool have_root = program_repository(root, sizeof root);
    char plain[2048];
    snprintf(plain, sizeof plain, "%s/%s", dir, stem);
    if (find_either_from_above(plain, path, above, sizeof above)) {  // (path: the .gz)
        run_from_hint(above, "--data", dir, hint, sizeof hint);
        snprintf(err, err_size, "MNIST not found: no %.500s/%s[.gz] %s", dir, stem, hint);
    } else if (strcmp(dir, "data/mnist") != 0) {  // not where `make data` puts them
        snprintf(err, err_size, "MNIST not found: no %.500s/%s[.gz] relative to the working directory %.1000s. Pass --data DIR, the folder with the MNIST files",
                 dir, stem, cwd);
    } else if (!have_root || strcmp(root, cwd) == 0) {
        snprintf(err, err_size, "MNIST not found: no %.500s/%s[.gz] relative to the working directory %.1000s. Run `make data` (or pass --data DIR)",
                 dir, stem, cwd);
    } else {
        snprintf(err, err_size, "MNIST not found: no %.500s/%s[.gz] relative to the working directory %.1000s. Run `make data` in the repository root %.1000s and run from there (or pass --data DIR)",
                 dir, stem, cwd, root);
    }
    return false;
}

static bool load_idx(const char *dir, const char *stem, int ndim, IdxArray *array, char *err, size_t err_size) {
    char path[4096], why[512];
    if (!find_file(dir, stem, path, sizeof path, err, err_size)) return false;
    if (idx_read(path, ndim, array, why, sizeof why)) return true;
    snprintf(err, err_size, "%.700s: %.250s. Run `make data` to fetch MNIST again", path, why);
    return false;
}

// Everything mnist_load does, with failures reported in err instead of ending the job.
static bool try_load(const char *dir, const char *prefix, MnistSplit *split, char *err, size_t err_size) {
    char images_stem[64], labels_stem[64];
    snprintf(images_stem, sizeof images_stem, "%s-images-idx3-ubyte", prefix);
    snprintf(labels_stem, sizeof labels_stem, "%s-labels-idx1-ubyte", prefix);
    IdxArray images = {0}, labels = {0};
    bool ok = load_idx(dir, images_stem, 3, &images, err, err_size) &&
              load_idx(dir, labels_stem, 1, &labels, err, err_size);
    if (ok && (images.dims[1] != 28 || images.dims[2] != 28)) {
        snprintf(err, err_size, "%s/%s: images are %dx%d (expected 28x28)", dir, images_stem, images.dims[1],
                 images.dims[2]);
        ok = false;
    }
    if (ok && images.dims[0] != labels.dims[0]) {
        snprintf(err, err_size, "%s: %s has %d images but %s has %d labels", dir, images_stem, images.dims[0],
                 labels_stem, labels.dims[0]);
        ok = false;
    }
    for (int i = 0; ok && i < labels.dims[0]; i++) {
        if (labels.data[i] >= MNIST_CLASSES) {
            snprintf(err, err_size, "%s/%s: label %d of sample %d (expected 0..9)", dir, labels_stem,
                     labels.data[i], i);
            ok = false;
        }
    }
    if (ok) {
        *split = (MnistSplit){.n = images.dims[0], .images = images.data};
        split->labels = xmalloc((size_t)split->n * sizeof(int));
        for (int i = 0; i < split->n; i++) split->labels[i] = labels.data[i];
    } else {
        idx_free(&images);
    }
    idx_free(&labels);
    return ok;
}

MnistSplit mnist_load(const char *dir, MnistPart part) {
    MnistSplit split = {0};
    char err[8192] = "";  // (room for the paths of find_file's hint)
    bool ok = try_load(dir, part == MNIST_TRAIN ? "train" : "t10k", &split, err, sizeof err);
    // Every rank reads the same files: let one rank say what is wrong, and all
    // leave together, rather than N copies of the line and N racing MPI_Aborts.
    check_all_ranks(ok, err);
    return split;
}

void mnist_free(MnistSplit *split) {
    device_free(split->device_images);
    device_free(split->device_labels);
    device_buffer_free(&split->device_indices);
    device_buffer_free(&split->device_order);
    device_buffer_free(&split->device_batch_labels);
    device_buffer_free(&split->device_batch_rounded);
#if HAVE_CUDA
    if (split->order_copied) CHECK_CUDA(cudaEventDestroy((cudaEvent_t)split->order_copied));
#endif
    if (split->order_staging) device_host_free(split->order_staging);
    free(split->images);
    free(split->labels);
    *split = (MnistSplit){0};
}

CPU_DISPATCHED void mnist_pixels_to_float(const uint8_t *pixels, float *out, size_t n) {
    // float32(p) / float32(255) is one correctly rounded division, as numpy's: vectorised.
    for (size_t k = 0; k < n; k++) out[k] = (float)pixels[k] / 255.0f;
}

#if HAVE_CUDA
// The split's labels on the GPU, once.
static void upload_labels(MnistSplit *split) {
    if (!split->device_labels) {
        split->device_labels = device_alloc((size_t)split->n * sizeof(int));
        CHECK_CUDA(cudaMemcpyAsync(split->device_labels, split->labels, (size_t)split->n * sizeof(int),
                                   cudaMemcpyHostToDevice, device_stream()));
    }
}

// The split on the GPU, once: pixels as uint8, and labels.
static void upload_split(MnistSplit *split) {
    cudaStream_t stream = device_stream();
    if (!split->device_images) {
        size_t bytes = (size_t)split->n * MNIST_PIXELS;
        split->device_images = device_alloc(bytes);
        CHECK_CUDA(cudaMemcpyAsync(split->device_images, split->images, bytes, cudaMemcpyHostToDevice, stream));
    }
    upload_labels(split);
}

// The sampler's order for this epoch on the GPU: copied at the epoch's first batch, from
// page-locked memory. The staging is refilled only once the previous epoch's copy is done
// (its event: the one wait, once an epoch, long over on a GPU).
static const int *epoch_order_on_gpu(MnistSplit *split, const DistributedSampler *sampler) {
    if (split->order_sampler == (const void *)sampler && split->order_serial == sampler->serial)
        return split->device_order.data;
    cudaStream_t stream = device_stream();
    size_t bytes = (size_t)sampler->num_samples * sizeof(int);
    int *device_order = device_buffer_reserve(&split->device_order, bytes);
    if (split->order_copied) {
        device_wait_event((cudaEvent_t)split->order_copied, "the copy of the epoch's sample order");
    } else {
        cudaEvent_t copied;
        CHECK_CUDA(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
        split->order_copied = copied;
    }
    if (bytes > split->order_staging_bytes) {  // (as large as device_order: it grows with it)
        if (split->order_staging) device_host_free(split->order_staging);
        split->order_staging_bytes = split->device_order.bytes;
        split->order_staging = device_host_alloc(split->order_staging_bytes);
    }
    memcpy(split->order_staging, sampler->indices, bytes);
    CHECK_CUDA(cudaMemcpyAsync(device_order, split->order_staging, bytes, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaEventRecord((cudaEvent_t)split->order_copied, stream));
    split->order_sampler = sampler;
    split->order_serial = sampler->serial;
    return device_order;
}

static void gather_on_gpu(MnistSplit *split, const int *indices, int rows, Tensor *images) {
    cudaStream_t stream = device_stream();
    upload_split(split);
    int *device_indices = device_buffer_reserve(&split->device_indices, (size_t)rows * sizeof(int));
    // 4 bytes an index go over, not 3136 bytes an image. (From pageable memory
    // the copy is staged before it returns: `indices` may change right after.)
    CHECK_CUDA(cudaMemcpyAsync(device_indices, indices, (size_t)rows * sizeof(int), cudaMemcpyHostToDevice,
                               stream));
    gpu_gather_batch(split->device_images, NULL, device_indices, rows, MNIST_PIXELS, images->data, NULL, NULL, stream);
}
#endif

void mnist_gather(MnistSplit *split, const int *indices, int rows, Tensor *images, int *labels) {
    CHECK(images->cols == MNIST_PIXELS && rows <= images->rows, "gather %d rows into [%d, %d]", rows,
          images->rows, images->cols);
    if (tensor_on_gpu(images)) {
#if HAVE_CUDA
        gather_on_gpu(split, indices, rows, images);
#endif
        for (int r = 0; r < rows; r++) labels[r] = split->labels[indices[r]];
        return;
    }
    // The rows are scattered over the 47 MB of pixels: without help, each one
    // waits for memory. Ask for the row a few ahead while converting this one.
    enum { AHEAD = 4, CACHE_LINE = 64 };
#pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        if (r + AHEAD < rows) {
            const uint8_t *next = split->images + (size_t)indices[r + AHEAD] * MNIST_PIXELS;
            for (int byte = 0; byte < MNIST_PIXELS; byte += CACHE_LINE) __builtin_prefetch(next + byte);
        }
        const uint8_t *src = split->images + (size_t)indices[r] * MNIST_PIXELS;
        float *dst = images->data + (size_t)r * MNIST_PIXELS;
        mnist_pixels_to_float(src, dst, MNIST_PIXELS);
        labels[r] = split->labels[indices[r]];
    }
}

Tensor mnist_images(MnistSplit *split, Device device) {
    Tensor images = tensor_zeros(split->n, MNIST_PIXELS, device);
    int *all = xmalloc((size_t)split->n * sizeof(int));
    int *labels = xmalloc((size_t)split->n * sizeof(int));
    for (int i = 0; i < split->n; i++) all[i] = i;
    mnist_gather(split, all, split->n, &images, labels);
    free(all);
    free(labels);
    return images;
}

void mnist_add_memory_need(MemoryNeed *need, int batch_size) {
    const double train = 60000, test = 10000;  // the samples of MNIST's two splits
    double held = (train + test) * (MNIST_PIXELS + sizeof(int));
    double batch = (double)batch_size * MNIST_PIXELS * sizeof(float);
    if (matmul_dtype() == MATMUL_BFLOAT16) batch += (double)batch_size * MNIST_PIXELS * sizeof(uint16_t);  // its rounded copy
    memory_need_add(need, "data", held + batch + test * MNIST_PIXELS * sizeof(float));
}

// ------------------------------------------------------------------ sampler

DistributedSampler sampler_new(int dataset_size, int world_size, int rank, bool shuffle, uint64_t seed) {
    CHECK(dataset_size > 0 && world_size > 0 && rank >= 0 && rank < world_size,
          "sampler of %d samples, rank %d of %d", dataset_size, rank, world_size);
    DistributedSampler s = {.dataset_size = dataset_size, .world_size = world_size, .rank = rank,
                            .shuffle = shuffle, .seed = seed, .order_epoch = -1};
    s.num_samples = (dataset_size + world_size - 1) / world_size;
    s.indices = xmalloc((size_t)s.num_samples * sizeof(int));
    s.order = xmalloc((size_t)dataset_size * sizeof(int));
    sampler_set_epoch(&s, 0);
    return s;
}

void sampler_set_epoch(DistributedSampler *s, int epoch) { sampler_set_epoch_from(s, epoch, 0); }

void sampler_set_epoch_from(DistributedSampler *s, int epoch, long first_position) {
    CHECK(first_position >= 0 && first_position < s->dataset_size,
          "sampler: position %ld is not inside an epoch of %d samples", first_position, s->dataset_size);
    if (s->shuffle) {  // a new, reproducible order every epoch: randperm seeded seed + epoch (drawn ahead)
        // (Not drawn again for the epoch it holds: sampler_new's epoch 0, set again by the loop.)
        if (epoch != s->order_epoch)
            perm_ahead_take(&s->ahead, s->seed + (uint64_t)epoch, s->dataset_size, &s->order, s->seed + (uint64_t)epoch + 1);
        s->order_epoch = epoch;
    } else {
        for (int i = 0; i < s->dataset_size; i++) s->order[i] = i;
    }
    // Position p of the padded list is order[p mod N]: the padding repeats the start.
    // The first first_position positions were trained on already (a resumed epoch).
    static unsigned long serials;  // one count for every sampler: no two orders share a serial
    s->serial = ++serials;
    long remaining = s->dataset_size - first_position;
    s->num_samples = (int)((remaining + s->world_size - 1) / s->world_size);
    // p mod N by subtraction as p steps by W: a division a sample cost MNIST's 60,000 ~0.1 ms an
    // epoch, at an epoch's start, where a GPU waits for this rank's first batch.
    long position = first_position + s->rank;
    for (int k = 0; k < s->num_samples; k++, position += s->world_size) {
        while (position >= s->dataset_size) position -= s->dataset_size;  // (more than once only where W > N)
        s->indices[k] = s->order[position];
    }
}

void sampler_free(DistributedSampler *s) {
    perm_ahead_free(&s->ahead);
    free(s->indices);
    free(s->order);
    *s = (DistributedSampler){0};
}

int sampler_num_batches(const DistributedSampler *s, int batch_size) {
    return (int)(((long)s->num_samples + batch_size - 1) / batch_size);
}

int mnist_batch_labels(MnistSplit *split, const DistributedSampler *sampler, int batch, int batch_size,
                       int *labels, Device device) {
    int start = batch * batch_size;
    int rows = sampler->num_samples - start < batch_size ? sampler->num_samples - start : batch_size;
    CHECK(rows > 0, "batch %d is past the end of this rank's %d samples", batch, sampler->num_samples);
#if HAVE_CUDA
    if (device == DEVICE_CUDA) {  // gathered on the GPU too, as mnist_batch's, from the epoch's order there
        upload_labels(split);
        int *device_labels = device_buffer_reserve(&split->device_batch_labels, (size_t)batch_size * sizeof(int));
        gpu_gather_ints(split->device_labels, epoch_order_on_gpu(split, sampler) + start, rows, device_labels,
                        device_stream());
    }
#endif
    (void)device;
    for (int r = 0; r < rows; r++) labels[r] = split->labels[sampler->indices[start + r]];
    return rows;
}

Tensor mnist_batch(MnistSplit *split, const DistributedSampler *sampler, int batch, int batch_size,
                   const Tensor *buffer, int *labels) {
    int start = batch * batch_size;
    int rows = sampler->num_samples - start < batch_size ? sampler->num_samples - start : batch_size;
    CHECK(rows > 0, "batch %d is past the end of this rank's %d samples", batch, sampler->num_samples);
    profile_push("data");
    Tensor images = tensor_rows(buffer, rows);
    if (tensor_on_gpu(&images)) {
#if HAVE_CUDA
        CHECK(images.cols == MNIST_PIXELS, "gather %d rows into [%d, %d]", rows, images.rows, images.cols);
        upload_split(split);
        const int *order = epoch_order_on_gpu(split, sampler) + start;
        int *device_labels = device_buffer_reserve(&split->device_batch_labels, (size_t)buffer->rows * sizeof(int));
        // With bfloat16 products, the pixels rounded in the same pass: layer 1's forward and its
        // weights' gradient read them there (tensor.h), where each rounded the batch again.
        uint16_t *rounded = NULL;
        if (matmul_dtype() == MATMUL_BFLOAT16)
            rounded = device_buffer_reserve(&split->device_batch_rounded, tensor_numel(buffer) * sizeof(uint16_t));
        gpu_gather_batch(split->device_images, split->device_labels, order, rows, MNIST_PIXELS, images.data, rounded,
                         device_labels, device_stream());
        images.bfloat16_copy = rounded;
#endif
        for (int r = 0; r < rows; r++) labels[r] = split->labels[sampler->indices[start + r]];
    } else {
        mnist_gather(split, sampler->indices + start, rows, &images, labels);
    }
    profile_pop();
    return images;
}

const int *mnist_batch_device_labels(const MnistSplit *split) { return split->device_batch_labels.data; }
