// h5_stream.h: MNIST streamed from chunked HDF5 by reader workers, batches ahead.
//
// The file has the layout of the original workshop's create_mnist_h5.py, as
// written by it, by h5py, or by day2/create_mnist_h5:
//   train/images  [600, 100, 1, 28, 28]  float32 pixels / 255 (the original's),
//                                        or uint8 0..255 (create_mnist_h5's default)
//   train/labels  [600, 100]             int64 (any integer type is accepted)
//   test/images   [100, 100, 1, 28, 28], test/labels [100, 100]
// one chunk per GROUP of 100 samples (gzip-compressed or not). The group is the
// unit of everything here: the sampler shuffles and shards group indices, a batch
// is a whole number of groups, and each group is one chunk.
//
//   H5Mnist file = h5_mnist_open("data/mnist.h5");          // collective: validates it all
//   DistributedSampler sampler = sampler_new(file.train.n_groups, world, rank, shuffle, seed);
//   H5Stream *stream = h5_stream_start(&file.train, &sampler, groups_per_batch, epochs, device,
//                                      workers, prefetch);
//   for (int epoch = 0; epoch < epochs; epoch++) {
//       sampler_set_epoch(&sampler, epoch);
//       for (int b = 0; b < sampler_num_batches(&sampler, groups_per_batch); b++) {
//           Tensor x = h5_stream_next(stream, epoch, b, labels);   // [rows, 784], on `device`
//           ...
//   h5_stream_describe_all_ranks(stream, loop_seconds, text, size);  // "Data: read ..."
//   h5_stream_stop(stream);
//   h5_mnist_close(&file);
//
// This is PyTorch's DataLoader(num_workers=W, prefetch_factor=K, pin_memory=True):
//   - W worker threads walk the training loop's plan (each its own copy of the
//     sampler, epoch after epoch); batch k of the plan is worker k % W's, as in
//     the DataLoader, and goes to slot k % (W * K). A worker reads each group's
//     chunk into the batch's rows (h5_chunk.h: fetched raw under the HDF5 lock,
//     inflated outside it, so W workers inflate at once).
//   - A slot holds the pixels as stored (uint8: 4x less to move than float32);
//     the loop converts them to float32 where it computes: on every core, as
//     step 10's gather does, or on the GPU. The workers' CPU time is then only
//     reading (and inflating): on a CPU whose every core computes, it is time
//     taken from training.
//   - So a rank holds W * K batches, whatever the size of the file, and which
//     worker reads a batch changes nothing in it: results are bit-identical at
//     any W and K.
//   - For a GPU, the slots are page-locked host memory; batch b+1 is copied to
//     the GPU on a copy stream while the GPU computes batch b, and converted to
//     float32 there. CUDA events order the copy, the conversion and the reuse
//     of buffers.
//
// Every HDF5 call here holds h5_lock() (h5_chunk.h); h5.c (checkpoints) does
// not take it: load and save weights while no stream is running, as step 11 does.
#pragma once
#include <stddef.h>

#include <hdf5.h>

#include "data/h5_chunk.h"
#include "data/mnist.h"
#include "runtime/memory_budget.h"  // MemoryNeed
#include "tensor/tensor.h"

#define H5_GROUP_SIZE 100   // samples per group, and per chunk: the original's layout
#define H5_DEFAULT_FILE "data/mnist.h5"  // where day2/create_mnist_h5 writes by default

typedef enum { H5_PIXELS_FLOAT32, H5_PIXELS_UINT8 } H5Pixels;

// One part of the file, "train" or "test": its two datasets, open.
typedef struct {
    const char *path;  // the file, for messages
    const char *name;  // "train" or "test"
    const char *images_name, *labels_name;  // "train/images", "train/labels"
    hid_t images, labels;
    H5ChunkedDataset image_chunks, label_chunks;  // how each group is read (h5_chunk.h)
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
// A dataset that the workers cannot inflate themselves (other filters, other
// chunks) is read with H5Dread, one worker at a time: rank 0 says so, once.
// Collective: every rank calls it.
H5Mnist h5_mnist_open(const char *path);
void h5_mnist_close(H5Mnist *file);

typedef struct H5Stream H5Stream;  // the reader workers and their batch slots

// PyTorch's num_workers default here: the cores this rank has beyond those it
// computes with (its OpenMP threads on the CPU; one thread that drives a GPU),
// at least 1.
int h5_stream_default_workers(Device device);

// What a stream of batches of `batch_size` rows with `workers` x `prefetch` slots
// holds, added to `need` as "batch slots" (memory_budget.h): each slot's pixels,
// counted as float32 (a file may store uint8: a bound, not the exact figure, which
// needs the open file), and labels, and the batch handed out as floats. The
// caller checks it before h5_stream_start, which allocates the slots.
void h5_stream_add_memory_need(MemoryNeed *need, int batch_size, int workers, int prefetch);

// Start reading: `epochs` passes of `sampler` (over part->n_groups groups), in
// batches of groups_per_batch groups, by `workers` threads that keep up to
// `prefetch` batches each read ahead (workers * prefetch slots). The workers
// start at once, on the first batches; the caller keeps its sampler to count
// batches and calls sampler_set_epoch on it as usual.
H5Stream *h5_stream_start(const H5Part *part, const DistributedSampler *sampler, int groups_per_batch,
                          int epochs, Device device, int workers, int prefetch);

// Batch `batch` of `epoch`, in the plan's order only: the images [rows, 784] as
// float32 pixels / 255 on the stream's device, and their labels copied into
// labels[rows]. Waits if the workers are not done with it. Collective: every rank
// takes its batches in step (one int's MPI_Allreduce a batch), so that a worker's
// failure (a damaged chunk, a bad label) on any rank ends the job here on every
// rank, with one line: the first failing rank's worker's.
// The images stay valid until the next call, which hands their slot back.
Tensor h5_stream_next(H5Stream *stream, int epoch, int batch, int *labels);

// Stop the workers (at once, even mid-plan), join them and free the stream.
void h5_stream_stop(H5Stream *stream);

// What the workers did and how long the loop waited for them, one line each
// ("Data: ...\n"), for rank 0 to print:
//   Data: read 150000 samples (470.4 MB of float32 pixels) from uint8 chunks, 2 workers busy 0.93 s in all:
//         504 MB/s per worker; the loop waited 0.04 s for data (3% of 1.34 s), means over ranks
//   Data: rank 0's worker 0: 38 batches (121600 samples), busy 0.47 s, 0.01 s of it in HDF5: 1030 MB/s
// MB/s counts the float32 pixels delivered, whatever the storage, so that
// storages compare. Collective; call it before h5_stream_stop. A worker line
// appears for each of this rank's workers: size `out` for them (128 bytes each).
void h5_stream_describe_all_ranks(H5Stream *stream, double loop_seconds, char *out, size_t size);
