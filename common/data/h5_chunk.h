// h5_chunk.h: one chunk of a chunked HDF5 dataset, read by any thread.
//
// HDF5 lets one thread into the library at a time: a thread-safe build (Debian's)
// takes a global lock in every call, other builds must not be entered twice, so
// we take our own lock, h5_lock(), around every call. More threads calling
// H5Dread therefore gain nothing: each inflates its gzip chunk inside the library,
// under the lock, while the others wait.
//
// So the reader threads split the work in two. Under the lock, one short call,
// H5Dread_chunk (HDF5 >= 1.10.5 here), fetches the chunk's bytes as they are stored
// on disk: for a gzip dataset, a zlib stream. Outside it, the calling thread
// inflates them with zlib itself: N threads inflate N chunks at once.
//
//   H5ChunkedDataset images;
//   if (!h5_chunked_open(&images, dataset_id, "data/mnist.h5", "train/images", chunk_shape, 5, H5T_NATIVE_UINT8, err, n)) ...
//   H5ChunkScratch scratch = {0};                 // one per thread
//   h5_chunk_read(&images, 17, out, &scratch, err, n);  // chunk 17 along the first dimension
//   h5_chunk_scratch_free(&scratch);
//
// Each chunk says which filters were applied to it (its filter mask): HDF5 stores
// a chunk raw when deflate would not shrink it, and we copy that one as is. A
// dataset that is not [gzip] or [no filter], or not chunked by first-dimension
// slices, or stored in another byte order, is read with H5Dread instead (slower:
// one thread at a time), and h5_chunked_open says why.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include <hdf5.h>

// The lock around every HDF5 call of a program that reads from several threads.
void h5_lock(void);
void h5_unlock(void);

typedef struct {
    hid_t dataset;           // not owned
    const char *file, *name; // for messages: "data/mnist.h5", "train/images"
    hid_t memory_type;       // the type the caller gets, e.g. H5T_NATIVE_UINT8 (not owned)
    size_t chunk_bytes;      // one chunk in memory: the elements of one slice times the type's size
    int rank;
    hsize_t slice[H5S_MAX_RANK];  // one chunk's shape: [1, dims...]
    bool direct;             // H5Dread_chunk and our own inflate; false: H5Dread
    bool gzip;               // the filter pipeline is [deflate] (else none)
    char why_not_direct[160];// when !direct: "filters [shuffle, deflate]", ...
    const char *unit;        // what a slice is, for messages: "slice" unless the caller says ("group")
} H5ChunkedDataset;

// Per-thread buffers: the stored bytes of a chunk, and zlib's state.
typedef struct {
    void *stored;
    size_t capacity;
    void *zlib;              // a z_stream, kept between chunks (inflateReset is cheap)
    double hdf5_seconds;     // time spent waiting for and holding h5_lock(), summed
} H5ChunkScratch;

// Decide how to read `dataset` (its chunks must be slices [1, dims[1:]] for the
// direct path). Holds h5_lock() itself. Returns false, with a message in err,
// only if HDF5 cannot describe the dataset.
bool h5_chunked_open(H5ChunkedDataset *d, hid_t dataset, const char *file, const char *name, hid_t memory_type,
                     char *err, size_t err_size);

// Slice `index` along the first dimension (one chunk) into out[d->chunk_bytes].
// Safe to call from many threads at once, each with its own scratch. On a
// missing chunk, a damaged one (corrupt gzip bytes, a size other than one
// slice's) or a read error, returns false with one line in err that names the
// file, the dataset and the slice.
bool h5_chunk_read(const H5ChunkedDataset *d, long index, void *out, H5ChunkScratch *scratch, char *err,
                   size_t err_size);
void h5_chunk_scratch_free(H5ChunkScratch *scratch);

// The innermost message of HDF5's error stack for this thread ("truncated file:
// eof = ..."), or "" where there is none: what to add to our own line.
void h5_last_error(char *out, size_t size);
