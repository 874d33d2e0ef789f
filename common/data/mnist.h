// mnist.h: MNIST from IDX files, torch's DistributedSampler, and batches.
//
//   MnistSplit train = mnist_load("data/mnist", MNIST_TRAIN);   // 60000 images
//   DistributedSampler sampler = sampler_new(train.n, world, rank, shuffle, seed);
//   sampler_set_epoch(&sampler, epoch);                          // reshuffles
//   for (int b = 0; b < sampler_num_batches(&sampler, B); b++) {
//       Tensor x = mnist_batch(&train, &sampler, b, B, &buffer, labels);   // [rows, 784]
//       ...
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/perm_ahead.h"        // PermAhead: the sampler's next shuffle
#include "runtime/memory_budget.h"  // MemoryNeed
#include "tensor/tensor.h"

#define MNIST_PIXELS 784  // 28 x 28, flattened as torch's view(-1, 784)
#define MNIST_CLASSES 10

// ------------------------------------------------------------------ IDX files
typedef struct {
    int ndim;
    int dims[3];
    uint8_t *data;  // prod(dims) bytes
} IdxArray;

// Read an IDX file of unsigned bytes with `ndim` dimensions, plain or gzip.
// Everything is validated before it is trusted: the magic, the dimensions, and
// that the file holds exactly the bytes the header promises. On failure
// returns false with a one-line reason in err (the path is the caller's to add).
bool idx_read(const char *path, int ndim, IdxArray *out, char *err, size_t err_size);
void idx_free(IdxArray *array);

// ------------------------------------------------------------------ the data set
typedef enum { MNIST_TRAIN, MNIST_TEST } MnistPart;

typedef struct {
    int n;
    uint8_t *images;  // [n, 784] raw pixels 0..255
    int *labels;      // [n] 0..9
    // On a GPU rank the first gather onto the GPU uploads the pixels, once
    // (uint8: 47 MB for the training set); batches are gathered there after.
    uint8_t *device_images;  // [n, 784] device memory, or NULL
    int *device_labels;      // [n] device memory, or NULL (uploaded with the pixels)
    DeviceBuffer device_indices;  // a batch's sample indices (mnist_gather)
    // mnist_batch on a GPU rank: the sampler's epoch order goes over once per epoch (from page-locked
    // memory, an event saying when that copy is done), and each batch is gathered by its slice of it,
    // its labels too, so that no step copies anything from the host.
    DeviceBuffer device_order;        // [num_samples] the epoch's order on the GPU
    int *order_staging;               // page-locked copy of it
    size_t order_staging_bytes;
    void *order_copied;               // cudaEvent_t: the staging may be refilled
    const void *order_sampler;        // the sampler and epoch that device_order holds
    unsigned long order_serial;
    DeviceBuffer device_batch_labels;  // [rows] the last mnist_batch's labels on the GPU
    DeviceBuffer device_batch_rounded;  // its pixels rounded to bfloat16 (--dtype bfloat16)
} MnistSplit;

// Loads train-* or t10k-* from dir (each file plain or .gz). Collective: every
// rank calls it. When the files are missing or invalid on any rank, one line
// says what and which command to run, and every rank exits(1).
MnistSplit mnist_load(const char *dir, MnistPart part);
void mnist_free(MnistSplit *split);

// out[i] = pixels[i] / 255 as float32: exactly numpy's uint8 -> float32 / 255.
void mnist_pixels_to_float(const uint8_t *pixels, float *out, size_t n);

// images[rows] = pixels / 255 as float32 (exactly numpy's uint8 -> float32 / 255),
// labels[rows] (on the host); `indices` picks the samples. When images is on
// the GPU, the gather runs there.
void mnist_gather(MnistSplit *split, const int *indices, int rows, Tensor *images, int *labels);

// All images of the split as float32 [n, 784], e.g. to evaluate the test set.
Tensor mnist_images(MnistSplit *split, Device device);
// What the data takes of a rank's memory, added to `need` as "data" (memory_budget.h):
// both splits as mnist_load holds them (uint8 pixels, labels), a batch of
// `batch_size` rows as floats (with bfloat16 products, matmul_set_dtype before this, its rounded
// copy too), and the test set as floats (mnist_images, the evaluation).
void mnist_add_memory_need(MemoryNeed *need, int batch_size);

// ------------------------------------------------------------------ sampler
// torch.utils.data.DistributedSampler(shuffle, seed, drop_last=False):
//   indices = randperm(N, seed + epoch) if shuffle else 0..N-1
//   padded to a multiple of W by repeating its start
//   rank r takes positions r, r + W, r + 2W, ...   (num_samples = ceil(N / W))
// The permutation is torch's own (rng.h), so the order matches PyTorch exactly.
typedef struct {
    int dataset_size, world_size, rank;
    bool shuffle;
    uint64_t seed;
    int num_samples;  // per rank
    int *indices;     // [num_samples]: this rank's samples for the current epoch
    int *order;       // [dataset_size]: the permutation of epoch order_epoch (-1: none yet)
    int order_epoch;
    PermAhead ahead;  // the next epoch's permutation, drawn on a thread while this one trains
    unsigned long serial;  // new at each sampler_set_epoch_from, unique in the process: a new `indices`
} DistributedSampler;

DistributedSampler sampler_new(int dataset_size, int world_size, int rank, bool shuffle, uint64_t seed);
void sampler_set_epoch(DistributedSampler *sampler, int epoch);
// The same epoch without the first first_position positions of its padded list,
// which earlier steps trained on (a run resumed mid-epoch): rank r takes
// positions first_position + r, + W, + 2W, ... and num_samples shrinks to match.
// With first_position = k * W * batch_size, this rank's batches are batches
// k, k + 1, ... of the whole epoch. A position means the same sample at any
// world size, so a run resumed on other ranks trains on the rest of the epoch.
// sampler_set_epoch(s, e) is sampler_set_epoch_from(s, e, 0).
void sampler_set_epoch_from(DistributedSampler *sampler, int epoch, long first_position);
void sampler_free(DistributedSampler *sampler);
// DataLoader(batch_size, drop_last=False): the last, partial batch is kept.
int sampler_num_batches(const DistributedSampler *sampler, int batch_size);

// Gather batch b of this rank into `buffer` [batch_size, 784] and labels, and
// return the view of the rows filled: batch_size of them, fewer in the last batch.
// On a GPU with bfloat16 products (matmul_set_dtype) the view carries the pixels rounded too
// (Tensor's bfloat16_copy), which the split holds until its next mnist_batch.
Tensor mnist_batch(MnistSplit *split, const DistributedSampler *sampler, int batch, int batch_size,
                   const Tensor *buffer, int *labels);
// The labels of the last mnist_batch of `split` on the GPU (for mlp_loss_to), NULL on a CPU rank.
const int *mnist_batch_device_labels(const MnistSplit *split);
// The labels of the same batch, without its images (a pipeline's last stage
// needs them, not the pixels); returns its rows. On a GPU rank (`device`) they are
// gathered there too, for mnist_batch_device_labels, and the pixels never go there.
int mnist_batch_labels(MnistSplit *split, const DistributedSampler *sampler, int batch, int batch_size,
                       int *labels, Device device);
