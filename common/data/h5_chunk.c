// h5_chunk.c: chunks read raw under the HDF5 lock, inflated outside it. See h5_chunk.h.
#include "data/h5_chunk.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "base/check.h"
#include "base/timer.h"

// Recursive: h5_mnist_open holds it around h5_chunked_open, which takes it too.
static pthread_mutex_t hdf5_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
void h5_lock(void) { pthread_mutex_lock(&hdf5_lock); }
void h5_unlock(void) { pthread_mutex_unlock(&hdf5_lock); }

// A walk of HDF5's error stack upward, from where the error was first detected
// to the API call: keep the first, most specific description.
static herr_t keep_description(unsigned n, const H5E_error2_t *error, void *data) {
    if (n == 0 && error->desc) snprintf(data, 256, "%s", error->desc);
    return 0;
}

void h5_last_error(char *out, size_t size) {
    char description[256] = "";
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_description, description);
    snprintf(out, size, "%s", description);
}

// "deflate", "shuffle", ... for the message that says why a dataset is read the slow way.
static void describe_filters(hid_t create, char *out, size_t size) {
    int n = H5Pget_nfilters(create), len = snprintf(out, size, "filters [");
    for (int i = 0; i < n && len < (int)size; i++) {
        unsigned flags;
        size_t n_values = 0;
        char name[32] = "?";
        H5Pget_filter2(create, (unsigned)i, &flags, &n_values, NULL, sizeof name, name, NULL);
        len += snprintf(out + len, size - len, "%s%s", i ? ", " : "", name);
    }
    if (len < (int)size) snprintf(out + len, size - len, "]");
}

bool h5_chunked_open(H5ChunkedDataset *d, hid_t dataset, const char *file, const char *name, hid_t memory_type,
                     char *err, size_t err_size) {
    *d = (H5ChunkedDataset){
        .dataset = dataset, .file = file, .name = name, .memory_type = memory_type, .unit = "slice"};
    h5_lock();
    hid_t space = H5Dget_space(dataset), stored = H5Dget_type(dataset), create = H5Dget_create_plist(dataset);
    hsize_t dims[H5S_MAX_RANK] = {0}, chunk[H5S_MAX_RANK] = {0};
    d->rank = H5Sget_simple_extent_dims(space, dims, NULL);
    bool ok = space >= 0 && stored >= 0 && create >= 0 && d->rank >= 1;
    if (ok) {
        size_t elements = 1;
        d->slice[0] = 1;
        for (int i = 1; i < d->rank; i++) d->slice[i] = dims[i], elements *= dims[i];
        d->chunk_bytes = elements * H5Tget_size(memory_type);

        bool chunked = H5Pget_layout(create) == H5D_CHUNKED && H5Pget_chunk(create, d->rank, chunk) == d->rank;
        bool slices = chunked;
        for (int i = 0; slices && i < d->rank; i++) slices = chunk[i] == d->slice[i];
        int n_filters = chunked ? H5Pget_nfilters(create) : 0;
        unsigned flags;
        size_t n_values = 0;
        d->gzip = n_filters == 1 &&
                  H5Pget_filter2(create, 0, &flags, &n_values, NULL, 0, NULL, NULL) == H5Z_FILTER_DEFLATE;
        // The bytes on disk are the caller's type only if the types are equal,
        // byte order included; otherwise HDF5 must convert them (H5Dread).
        bool same_type = H5Tequal(stored, memory_type) > 0;
        if (!chunked)
            snprintf(d->why_not_direct, sizeof d->why_not_direct, "not chunked");
        else if (!slices)
            snprintf(d->why_not_direct, sizeof d->why_not_direct, "chunks other than one slice [1, ...] each");
        else if (n_filters != 0 && !d->gzip)
            describe_filters(create, d->why_not_direct, sizeof d->why_not_direct);
        else if (!same_type)
            snprintf(d->why_not_direct, sizeof d->why_not_direct, "a type that HDF5 must convert");
#if !H5_VERSION_GE(1, 10, 5)
        else
            snprintf(d->why_not_direct, sizeof d->why_not_direct, "HDF5 %d.%d.%d (direct chunk reads need 1.10.5)",
                     H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE);
#endif
        d->direct = d->why_not_direct[0] == '\0';
    }
    if (space >= 0) H5Sclose(space);
    if (stored >= 0) H5Tclose(stored);
    if (create >= 0) H5Pclose(create);
    h5_unlock();
    if (!ok) snprintf(err, err_size, "%s: cannot read the layout of dataset '%s'", file, name);
    return ok;
}

// The slow path, for any layout, filter and type: HDF5 reads (and inflates,
// and converts) the slice itself, holding the lock throughout.
static bool read_with_h5dread(const H5ChunkedDataset *d, long index, void *out, H5ChunkScratch *scratch,
                              char *err, size_t err_size) {
    hsize_t start[H5S_MAX_RANK] = {(hsize_t)index};
    double begin = wall_seconds();
    h5_lock();
    hid_t file_space = H5Dget_space(d->dataset);
    // The memory side has the selection's own shape: with a flat one, HDF5
    // takes its general gather path, 4x slower.
    hid_t memory_space = H5Screate_simple(d->rank, d->slice, NULL);
    herr_t status = file_space >= 0 && memory_space >= 0 ? 0 : -1;
    if (status >= 0) status = H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, d->slice, NULL);
    if (status >= 0) status = H5Dread(d->dataset, d->memory_type, memory_space, file_space, H5P_DEFAULT, out);
    char why[256] = "";
    if (status < 0) h5_last_error(why, sizeof why);
    if (file_space >= 0) H5Sclose(file_space);
    if (memory_space >= 0) H5Sclose(memory_space);
    h5_unlock();
    scratch->hdf5_seconds += wall_seconds() - begin;
    if (status < 0)
        snprintf(err, err_size, "%s: cannot read '%s' %s %ld (a damaged chunk?)%s%s", d->file, d->name, d->unit, index,
                 *why ? ": " : "", why);
    return status >= 0;
}

// Inflate a zlib stream (what HDF5's deflate filter writes) of exactly
// `expected` bytes into out.
static bool inflate_chunk(H5ChunkScratch *scratch, const void *in, size_t in_bytes, void *out, size_t expected,
                          char *why, size_t why_size, const char *unit) {
    z_stream *z = scratch->zlib;
    if (!z) {
        z = scratch->zlib = xcalloc(1, sizeof *z);
        CHECK(inflateInit(z) == Z_OK, "zlib: inflateInit failed");
    } else {
        inflateReset(z);
    }
    z->next_in = (Bytef *)in, z->avail_in = (uInt)in_bytes;
    z->next_out = out, z->avail_out = (uInt)expected;
    int status = inflate(z, Z_FINISH);
    if (status == Z_STREAM_END && z->total_out == expected) return true;
    if (status == Z_DATA_ERROR || status == Z_NEED_DICT)
        snprintf(why, why_size, "corrupt gzip data");
    else if (status == Z_STREAM_END)
        snprintf(why, why_size, "it inflates to fewer bytes than one %s", unit);
    else if (z->avail_out == 0)
        snprintf(why, why_size, "it inflates to more bytes than one %s", unit);
    else
        snprintf(why, why_size, "its gzip data ends early");
    return false;
}

bool h5_chunk_read(const H5ChunkedDataset *d, long index, void *out, H5ChunkScratch *scratch, char *err,
                   size_t err_size) {
    if (!d->direct) return read_with_h5dread(d, index, out, scratch, err, err_size);
#if H5_VERSION_GE(1, 10, 5)
    hsize_t offset[H5S_MAX_RANK] = {(hsize_t)index};
    unsigned mask = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t stored_bytes = 0;
    uint32_t filters = 0;
    char why_hdf5[256] = "";
    // A compressed chunk may come out a little larger than its data; far larger is damage.
    const hsize_t most = d->chunk_bytes + d->chunk_bytes / 8 + 1024;

    double begin = wall_seconds();
    h5_lock();
    herr_t status = H5Dget_chunk_info_by_coord(d->dataset, offset, &mask, &address, &stored_bytes);
    bool read = status >= 0 && stored_bytes > 0 && stored_bytes <= most;
    // An uncompressed chunk of the right size goes straight to the caller: no copy.
    bool straight = read && !d->gzip && stored_bytes == d->chunk_bytes;
    if (read && !straight && stored_bytes > scratch->capacity) {
        free(scratch->stored);
        scratch->stored = xmalloc(stored_bytes);
        scratch->capacity = stored_bytes;
    }
    if (read) status = H5Dread_chunk(d->dataset, H5P_DEFAULT, offset, &filters, straight ? out : scratch->stored);
    if (status < 0) h5_last_error(why_hdf5, sizeof why_hdf5);
    h5_unlock();
    scratch->hdf5_seconds += wall_seconds() - begin;

    const char *slice = d->unit;
    if (status < 0) {
        snprintf(err, err_size, "%s: cannot read '%s' %s %ld (a damaged file?)%s%s", d->file, d->name, slice, index,
                 *why_hdf5 ? ": " : "", why_hdf5);
        return false;
    }
    if (stored_bytes == 0) {
        snprintf(err, err_size, "%s: '%s' %s %ld: its chunk is missing (never written)", d->file, d->name, slice,
                 index);
        return false;
    }
    if (status >= 0 && straight) return true;
    if (!read) {
        snprintf(err, err_size, "%s: '%s' %s %ld: its chunk is %llu bytes, more than %zu bytes of data could take",
                 d->file, d->name, slice, index, (unsigned long long)stored_bytes, d->chunk_bytes);
        return false;
    }
    // Bit 0 of the mask set: deflate was skipped for this chunk (it would not shrink), stored raw.
    if (d->gzip && !(filters & 1)) {
        char why[64];
        if (inflate_chunk(scratch, scratch->stored, stored_bytes, out, d->chunk_bytes, why, sizeof why, slice))
            return true;
        snprintf(err, err_size, "%s: '%s' %s %ld: %s (%llu bytes stored, %zu expected inflated)", d->file, d->name,
                 slice, index, why, (unsigned long long)stored_bytes, d->chunk_bytes);
        return false;
    }
    if (stored_bytes != d->chunk_bytes) {
        snprintf(err, err_size, "%s: '%s' %s %ld: its chunk is %llu bytes, one %s is %zu", d->file, d->name, slice,
                 index, (unsigned long long)stored_bytes, slice, d->chunk_bytes);
        return false;
    }
    memcpy(out, scratch->stored, d->chunk_bytes);
    return true;
#else
    return read_with_h5dread(d, index, out, scratch, err, err_size);
#endif
}

void h5_chunk_scratch_free(H5ChunkScratch *scratch) {
    if (scratch->zlib) inflateEnd(scratch->zlib);
    free(scratch->zlib);
    free(scratch->stored);
    *scratch = (H5ChunkScratch){0};
}
