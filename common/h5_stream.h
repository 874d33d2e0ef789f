// h5_stream.h: MNIST streamed from chunked HDF5, one batch ahead, by a reader thread.
//
// The file has the layout of the original workshop's create_mnist_h5.py, as
// written by it, by h5py, or by day2/create_mnist_h5:
//   train/images  [600, 100, 1, 28, 28]  float32 pixels / 255 (the original's),
//                                        or uint8 0..255 (create_mnist_h5's default)
//   train/labels  [600, 100]             int64 (any integer type is accepted)
//   test/images   [100, 100, 1, 28, 28], test/labels [100, 100]
// gzip-compressed, one chunk per GROUP of 100 samples. The group is the unit of
// everything here: the sampler shuffles and shards group indices, a batch is a
// whole number of groups, and each group is one hyperslab read of one chunk.
//
//   H5Mnist file = h5_mnist_open("data/mnist.h5");          // collective: validates it all
//   DistributedSampler sampler = sampler_new(file.train.n_groups, world, rank, shuffle, seed);
//   H5Stream *stream = h5_stream_start(&file.train, &sampler, groups_per_batch, epochs, device);
//   for (int epoch = 0; epoch < epochs; epoch++) {
//       sampler_set_epoch(&sampler, epoch);
//       for (int b = 0; b < sampler_num_batches(&sampler, groups_per_batch); b++) {
//           Tensor x = h5_stream_next(stream, epoch, b, labels);   // [rows, 784]
//           ...
//   h5_stream_stop(stream);
//   h5_mnist_close(&file);
//
// The reader thread walks the same plan as the training loop (its own copy of
// the sampler, epoch after epoch) and fills two batch buffers in turn: while the
// loop trains on one, the thread reads the next into the other. So a rank holds
// two batches of pixels, whatever the size of the file.
//
// HDF5 from Debian (and most builds) is not thread-safe: no two threads may be
// inside the library at once. Every HDF5 call in h5_stream.c holds one lock, so
// streams may overlap; but h5.c (checkpoints) does not take it: load and save
// weights while no stream is running, as step 11 does.
#pragma once
#include <stddef.h>

#include <hdf5.h>

#include "mnist.h"
#include "tensor.h"

#define H5_GROUP_SIZE 100   // samples per group, and per chunk: the original's layout
#define H5_DEFAULT_FILE "data/mnist.h5"  // where day2/create_mnist_h5 writes by default

typedef enum { H5_PIXELS_FLOAT32, H5_PIXELS_UINT8 } H5Pixels;

// One part of the file, "train" or "test": its two datasets, open.
typedef struct {
    const char *path;  // the file, for messages
    const char *name;  // "train" or "test"
    hid_t images, labels;
    int n_groups;      // 600 for train, 100 for test
    H5Pixels pixels;   // how the images are stored; batches are float32 either way
} H5Part;

typedef struct {
    char *path;  // a copy: the parts' `path` points here
    hid_t file;
    H5Part train, test;
} H5Mnist;

// Open and validate the file: both parts, dataset by dataset, type and shape.
// On the first problem one line names the file, the dataset and what was
// expected (a missing file: the command that writes it), and every rank exits(1).
// Collective: every rank calls it.
H5Mnist h5_mnist_open(const char *path);
void h5_mnist_close(H5Mnist *file);

typedef struct H5Stream H5Stream;  // the reader thread and its two batch buffers

// Start reading: `epochs` passes of `sampler` (over part->n_groups groups), in
// batches of groups_per_batch groups. The reader thread starts at once, on the
// first batch, with its own copy of the sampler; the caller keeps the original
// to count batches and calls sampler_set_epoch on it as usual.
H5Stream *h5_stream_start(const H5Part *part, const DistributedSampler *sampler, int groups_per_batch,
                          int epochs, Device device);

// Batch `batch` of `epoch`, in this order only (the reader's plan): the images
// [rows, 784] as float32 pixels / 255, and their labels copied into labels[rows].
// Waits if the reader is not done with it. The images stay valid until the next
// call, which hands their buffer back to the reader.
Tensor h5_stream_next(H5Stream *stream, int epoch, int batch, int *labels);

// Stop the reader (at once, even mid-plan), join it and free the stream.
void h5_stream_stop(H5Stream *stream);

// "read 150000 samples (470.4 MB of float32 pixels) from float32 chunks in 1.83 s: 257 MB/s;
//  the loop waited 0.31 s for data (16% of 1.96 s), means over ranks". MB/s counts
// the float32 pixels delivered, whatever the storage, so that storages compare.
// Collective; call it before h5_stream_stop.
void h5_stream_describe_all_ranks(H5Stream *stream, double loop_seconds, char *out, size_t size);
