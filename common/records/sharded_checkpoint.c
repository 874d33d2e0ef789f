// sharded_checkpoint.c: every rank writes its shards, an index says where they lie, a load reads
// the overlaps its new layout needs. See sharded_checkpoint.h.
#include "records/sharded_checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <hdf5.h>

#include "base/args.h"
#include "base/check.h"
#include "base/paths.h"
#include "base/quote.h"
#include "base/timer.h"
#include "records/h5_file.h"
#include "runtime/device.h"
#include "runtime/dist.h"

#define FORMAT "ddp-workshop sharded checkpoint, version 1"
#define ERROR_SIZE CHECKPOINT_ERROR_SIZE
#define NAME_SIZE 128
#define ROW (2 + 2 * CHECKPOINT_MAX_DIMS)  // an index row: rank, number, offsets, sizes

// A tensor as the index has it: its shape and every saved piece of it.
typedef struct {
    char name[NAME_SIZE];
    int ndim;
    long long shape[CHECKPOINT_MAX_DIMS];
    long n_pieces;
    long long *rows;  // [n_pieces][ROW]
} IndexTensor;

typedef struct {
    IndexTensor *tensors;
    int n_tensors, capacity;
} Index;

// A piece as it travels to rank 0, which writes the index.
typedef struct {
    char name[NAME_SIZE];
    long long ndim, number, shape[CHECKPOINT_MAX_DIMS], offset[CHECKPOINT_MAX_DIMS], count[CHECKPOINT_MAX_DIMS];
} PieceRecord;

static void quiet_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

__attribute__((format(printf, 2, 3))) static void fail(char *err, const char *fmt, ...) {
    if (err[0]) return;  // the first problem is the one said
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERROR_SIZE, fmt, ap);
    va_end(ap);
}

static long long volume(int ndim, const long long *count) {
    long long v = 1;
    for (int d = 0; d < ndim; d++) v *= count[d];
    return v;
}

// "[128, 784]"
static void format_dims(char *out, size_t size, int ndim, const long long *dims) {
    int len = snprintf(out, size, "[");
    for (int d = 0; d < ndim && len < (int)size; d++) len += snprintf(out + len, size - (size_t)len, "%s%lld", d ? ", " : "", dims[d]);
    if (len < (int)size) snprintf(out + len, size - (size_t)len, "]");
}

// ---------------------------------------------------------------- pieces of a flat run
int checkpoint_box_run_pieces(const char *name, int rows, int cols, const long long offset[2], const long long count[2],
                              size_t first, size_t end, const Tensor *source, size_t at, CheckpointPiece *out) {
    int n = 0;
    bool vector = cols == 0;
    size_t width = (size_t)(vector ? count[0] : count[1]);  // a row of the box
    while (first < end) {
        size_t row = vector ? 0 : first / width, col = vector ? first : first % width;
        size_t take = col > 0 || end - first < width ? (end - first < width - col ? end - first : width - col)
                                                     : (end - first) / width * width;  // whole rows
        CheckpointPiece *p = &out[n++];
        *p = (CheckpointPiece){.name = name, .ndim = vector ? 1 : 2};
        p->values = (Tensor){.data = source->data + at, .rows = 1, .cols = (int)take, .device = source->device};
        if (vector) {
            p->shape[0] = rows, p->offset[0] = offset[0] + (long long)col, p->count[0] = (long long)take;
        } else {
            p->shape[0] = rows, p->shape[1] = cols;
            p->offset[0] = offset[0] + (long long)row, p->offset[1] = offset[1] + (long long)col;
            p->count[0] = col > 0 || take < width ? 1 : (long long)(take / width);
            p->count[1] = col > 0 || take < width ? (long long)take : (long long)width;
        }
        first += take, at += take;
    }
    return n;
}

int checkpoint_flat_pieces(const char *name, int rows, int cols, size_t first, size_t end, const Tensor *source,
                           size_t at, CheckpointPiece *out) {
    const long long origin[2] = {0, 0}, whole[2] = {rows, cols};
    return checkpoint_box_run_pieces(name, rows, cols, origin, whole, first, end, source, at, out);
}

// ---------------------------------------------------------------- HDF5 small things
static bool set_text(hid_t object, const char *name, const char *text) {
    hid_t scalar = H5Screate(H5S_SCALAR), type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(text) + 1);
    hid_t attribute = H5Acreate2(object, name, type, scalar, H5P_DEFAULT, H5P_DEFAULT);
    bool ok = attribute >= 0 && H5Awrite(attribute, type, text) >= 0;
    if (attribute >= 0) H5Aclose(attribute);
    H5Tclose(type), H5Sclose(scalar);
    return ok;
}

static bool get_text(hid_t object, const char *name, char *out, size_t size) {
    out[0] = '\0';
    if (H5Aexists(object, name) <= 0) return false;
    hid_t attribute = H5Aopen(object, name, H5P_DEFAULT), stored = H5Aget_type(attribute), type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, size);
    bool ok = H5Tget_class(stored) == H5T_STRING && H5Tget_size(stored) <= size && H5Aread(attribute, type, out) >= 0;
    H5Tclose(type), H5Tclose(stored), H5Aclose(attribute);
    out[size - 1] = '\0';
    return ok;
}

static bool set_u64(hid_t object, const char *name, uint64_t value) {
    hid_t scalar = H5Screate(H5S_SCALAR);
    hid_t attribute = H5Acreate2(object, name, H5T_STD_U64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    bool ok = attribute >= 0 && H5Awrite(attribute, H5T_NATIVE_UINT64, &value) >= 0;
    if (attribute >= 0) H5Aclose(attribute);
    H5Sclose(scalar);
    return ok;
}

static bool get_u64(hid_t object, const char *name, uint64_t *value) {
    if (H5Aexists(object, name) <= 0) return false;
    hid_t attribute = H5Aopen(object, name, H5P_DEFAULT);
    bool ok = H5Aread(attribute, H5T_NATIVE_UINT64, value) >= 0;
    H5Aclose(attribute);
    return ok;
}

// Reserves disk for what HDF5 will write into a file it has just created (fallocate, the file's
// size unchanged), so that a full disk fails here, cleanly, and not in HDF5's own writes: HDF5
// 1.10 crashes at exit (in H5_term_library) after a close that failed to flush. A file system
// that cannot reserve (EOPNOTSUPP) is written as it comes.
static bool reserve_space(hid_t file, double bytes) {
    int *descriptor = NULL;
    if (H5Fget_vfd_handle(file, H5P_DEFAULT, (void **)&descriptor) < 0 || !descriptor) return true;
    if (fallocate(*descriptor, FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes) == 0) return true;
    return errno == EOPNOTSUPP || errno == ENOSYS;
}

// What a file of `values` floats in `datasets` datasets takes at most: its data, and generous
// room for HDF5's metadata (a superblock, object headers, groups' heaps and trees).
static double file_bytes(double values, int datasets) { return values * sizeof(float) + 32768.0 + 2048.0 * datasets; }

static hid_t open_file(const char *path) {
    if (access(path, R_OK) != 0 || input_file_problem(path)) return H5I_INVALID_HID;
#if H5_VERSION_GE(1, 12, 0)
    if (H5Fis_accessible(path, H5P_DEFAULT) <= 0) return H5I_INVALID_HID;
#else
    if (H5Fis_hdf5(path) <= 0) return H5I_INVALID_HID;
#endif
    return H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
}

// A dataset of `ndim` dims (0: a scalar), groups on the way created.
static bool write_dataset(hid_t file, const char *name, hid_t file_type, hid_t memory_type, int ndim,
                          const hsize_t *dims, const void *data) {
    hid_t links = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(links, 1);
    hid_t space = ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(ndim, dims, NULL);
    hid_t dataset = H5Dcreate2(file, name, file_type, space, links, H5P_DEFAULT, H5P_DEFAULT);
    bool ok = dataset >= 0 && H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    if (dataset >= 0) H5Dclose(dataset);
    H5Sclose(space), H5Pclose(links);
    return ok;
}

// The dims of dataset `name` (its rank returned; -1 if it is not there).
static int dataset_dims(hid_t file, const char *name, hsize_t dims[H5S_MAX_RANK]) {
    if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return -1;  // (also when a group on the way is missing)
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    if (dataset < 0) return -1;
    hid_t space = H5Dget_space(dataset);
    int ndim = H5Sget_simple_extent_ndims(space);
    if (ndim >= 0) H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space), H5Dclose(dataset);
    return ndim;
}

// Why a dataset's values would not be the ones a save wrote, or NULL: a type of another class or
// size than `memory_type`, which the save wrote (HDF5 would convert an integer or a float64 on the
// way in, and read nothing from strings); storage never written whole (HDF5 would read its fill
// value); a virtual dataset (its sources elsewhere: a save writes none).
static const char *stored_problem(hid_t dataset, hid_t memory_type) {
    hid_t stored = H5Dget_type(dataset), create = H5Dget_create_plist(dataset);
    bool same_type = stored >= 0 && H5Tget_class(stored) == H5Tget_class(memory_type) &&
                     H5Tget_size(stored) == H5Tget_size(memory_type);
    bool is_virtual = create < 0 || H5Pget_layout(create) == H5D_VIRTUAL;
    if (stored >= 0) H5Tclose(stored);
    if (create >= 0) H5Pclose(create);
    H5D_space_status_t written = H5D_SPACE_STATUS_ERROR;
    if (!same_type) return "is of another type than a checkpoint's";
    if (is_virtual) return "is virtual, not written";
    if (H5Dget_space_status(dataset, &written) < 0 || written != H5D_SPACE_STATUS_ALLOCATED)
        return "was never written whole (HDF5 would read its fill value)";
    return NULL;
}

// A dataset read whole, after its shape is checked against `ndim`/`dims` (dims NULL with ndim 1:
// any length up to *length, which is then set) and its type and storage (stored_problem).
static bool read_dataset(hid_t file, const char *path, const char *name, hid_t memory_type, int ndim,
                         const hsize_t *dims, long *length, void *data, char *err) {
    hsize_t stored[H5S_MAX_RANK] = {0};
    int stored_ndim = dataset_dims(file, name, stored);
    if (stored_ndim < 0) {
        fail(err, "%s: no dataset '%s': an incomplete index", path, name);
        return false;
    }
    bool same = stored_ndim == ndim;
    for (int d = 0; same && dims && d < ndim; d++) same = stored[d] == dims[d];
    if (same && length) same = (long)stored[0] <= *length, *length = (long)stored[0];
    if (!same) {
        fail(err, "%s: '%s' has another shape than the index's format gives it: a damaged index", path, name);
        return false;
    }
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    const char *problem = stored_problem(dataset, memory_type);
    bool ok = !problem && H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    H5Dclose(dataset);
    if (problem) fail(err, "%s: '%s' %s: a damaged index", path, name, problem);
    else if (!ok) fail(err, "%s: cannot read '%s' (a corrupt file?)", path, name);
    return ok;
}

// ---------------------------------------------------------------- the folder
static void step_folder(char *out, size_t size, const char *prefix, long step) { snprintf(out, size, "%s-%06ld", prefix, step); }

// Removes a folder of files (a checkpoint's: no subfolders). False with errno set where it could not.
static bool remove_folder(const char *path) {
    DIR *folder = opendir(path);
    if (!folder) return errno == ENOENT;
    struct dirent *entry;
    char file[PATH_MAX];
    bool ok = true;
    while ((entry = readdir(folder)))
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) {
            snprintf(file, sizeof file, "%s/%s", path, entry->d_name);
            ok = unlink(file) == 0 && ok;
        }
    closedir(folder);
    return rmdir(path) == 0 && ok;
}

// "step-" and its number's digits (at least 6, at most 18), and nothing else: a folder's name that
// `current` may give.
static bool is_step_name(const char *name) {
    size_t digits = strspn(name + 5, "0123456789");
    return strncmp(name, "step-", 5) == 0 && digits >= 6 && digits <= 18 && name[5 + digits] == '\0';
}

// DIR/current's first line, the current checkpoint's name ("step-000010"); false when there is no
// such file. An empty or unreadable one gives "", which no step folder is called: a damaged
// `current` is refused, never taken for a folder without a checkpoint (whose next saves would
// then push the real ones out).
static bool read_current(const char *dir, char *name, size_t size) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/current", dir);
    FILE *file = fopen(path, "r");
    if (!file) return false;
    if (!fgets(name, (int)size, file)) name[0] = '\0';
    fclose(file);
    name[strcspn(name, "\n")] = '\0';
    return true;
}

// DIR/current replaced by rename, through current.tmp, synced: it names `name` or the one before.
static bool write_current(const char *dir, const char *name) {
    char path[PATH_MAX], temp[PATH_MAX];
    snprintf(path, sizeof path, "%s/current", dir);
    snprintf(temp, sizeof temp, "%s/current.tmp", dir);
    FILE *file = fopen(temp, "w");
    if (!file) return false;
    bool ok = fprintf(file, "%s\n", name) > 0;
    ok = fclose(file) == 0 && ok;
    ok = ok && sync_path(temp, false) && rename(temp, path) == 0 && sync_path(dir, true);
    if (!ok) unlink(temp);
    return ok;
}

// Every "PREFIX-NNNNNN" in DIR: their steps, sorted up; returns how many (at most `room`).
static int list_steps(const char *dir, const char *prefix, long *steps, int room) {
    DIR *folder = opendir(dir);
    if (!folder) return 0;
    int n = 0;
    size_t length = strlen(prefix);
    struct dirent *entry;
    while ((entry = readdir(folder)) && n < room) {
        char *end;
        if (strncmp(entry->d_name, prefix, length) != 0 || entry->d_name[length] != '-') continue;
        long step = strtol(entry->d_name + length + 1, &end, 10);
        if (*end == '\0' && end != entry->d_name + length + 1) steps[n++] = step;
    }
    closedir(folder);
    for (int i = 1; i < n; i++)  // insertion sort: a handful
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            long t = steps[j];
            steps[j] = steps[j - 1], steps[j - 1] = t;
        }
    return n;
}

// ---------------------------------------------------------------- the index in memory
static IndexTensor *index_find(const Index *index, const char *name) {
    for (int t = 0; t < index->n_tensors; t++)
        if (strcmp(index->tensors[t].name, name) == 0) return &index->tensors[t];
    return NULL;
}

static IndexTensor *index_add(Index *index, const char *name) {
    if (index->n_tensors == index->capacity) {
        index->capacity = index->capacity ? 2 * index->capacity : 16;
        index->tensors = realloc(index->tensors, (size_t)index->capacity * sizeof(IndexTensor));
        CHECK(index->tensors != NULL, "out of memory for the checkpoint's index");
    }
    IndexTensor *t = &index->tensors[index->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

static void index_free(Index *index) {
    for (int t = 0; t < index->n_tensors; t++) free(index->tensors[t].rows);
    free(index->tensors);
    *index = (Index){0};
}

// Do the pieces tile their tensor: each inside it, none overlapping another, all of them its
// size? (Then every element is in exactly one piece.) `files`: how many shard files there are.
static void check_tiling(const IndexTensor *t, int files, const char *path, char *err) {
    long long covered = 0;
    char shape[96];
    format_dims(shape, sizeof shape, t->ndim, t->shape);
    for (long p = 0; p < t->n_pieces && !err[0]; p++) {
        const long long *row = &t->rows[p * ROW], *offset = row + 2, *count = row + 2 + CHECKPOINT_MAX_DIMS;
        if (row[0] < 0 || row[0] >= files) fail(err, "%s: '%s' piece %ld is in shard file %lld of %d", path, t->name, p, row[0], files);
        for (int d = 0; d < t->ndim && !err[0]; d++)
            if (offset[d] < 0 || count[d] < 1 || offset[d] + count[d] > t->shape[d])
                fail(err, "%s: '%s' piece %ld lies outside the tensor's %s: a damaged index", path, t->name, p, shape);
        covered += volume(t->ndim, count);
        for (long q = 0; q < p && !err[0]; q++) {
            const long long *other = &t->rows[q * ROW];
            bool overlap = true;
            for (int d = 0; d < t->ndim; d++)
                overlap = overlap && offset[d] < other[2 + d] + other[2 + CHECKPOINT_MAX_DIMS + d] &&
                          other[2 + d] < offset[d] + count[d];
            if (overlap) fail(err, "%s: '%s' pieces %ld and %ld overlap: a damaged index", path, t->name, q, p);
        }
    }
    if (!err[0] && covered != volume(t->ndim, t->shape))
        fail(err, "%s: the pieces of '%s' hold %lld of its %lld elements %s: a damaged index", path, t->name, covered,
             volume(t->ndim, t->shape), shape);
}

// H5Lvisit over "tensors": every ".../pieces" dataset names a tensor.
typedef struct {
    hid_t group;
    Index *index;
    const char *path;
    char *err;
} VisitIndex;

static herr_t visit_tensor(hid_t group, const char *name, const H5L_info_t *info, void *data) {
    (void)group, (void)info;
    VisitIndex *visit = data;
    size_t length = strlen(name);
    if (length < 7 || strcmp(name + length - 7, "/pieces") != 0) return 0;
    if (length - 7 >= NAME_SIZE) {
        fail(visit->err, "%s: a tensor's name is longer than %d characters", visit->path, NAME_SIZE - 1);
        return 1;
    }
    char tensor[NAME_SIZE], field[NAME_SIZE + 16];
    snprintf(tensor, sizeof tensor, "%.*s", (int)(length - 7), name);
    IndexTensor *t = index_add(visit->index, tensor);
    hsize_t dims[H5S_MAX_RANK] = {0};
    snprintf(field, sizeof field, "%s/shape", tensor);
    t->ndim = dataset_dims(visit->group, field, dims);
    if (t->ndim != 1 || dims[0] < 1 || dims[0] > CHECKPOINT_MAX_DIMS) {
        fail(visit->err, "%s: tensor '%s' has no shape of 1 to %d dimensions: a damaged index", visit->path, tensor,
             CHECKPOINT_MAX_DIMS);
        return 1;
    }
    t->ndim = (int)dims[0];
    snprintf(field, sizeof field, "tensors/%s/shape", tensor);
    hid_t file = H5Iget_file_id(visit->group);
    bool ok = read_dataset(file, visit->path, field, H5T_NATIVE_LLONG, 1, dims, NULL, t->shape, visit->err);
    snprintf(field, sizeof field, "%s/pieces", tensor);
    int ndim = dataset_dims(visit->group, field, dims);
    if (ok && (ndim != 2 || dims[1] != ROW || dims[0] < 1)) {
        fail(visit->err, "%s: tensor '%s' has no list of pieces [n, %d]: a damaged index", visit->path, tensor, ROW);
        ok = false;
    }
    if (ok) {
        t->n_pieces = (long)dims[0];
        t->rows = xmalloc((size_t)t->n_pieces * ROW * sizeof(long long));
        snprintf(field, sizeof field, "tensors/%s/pieces", tensor);
        ok = read_dataset(file, visit->path, field, H5T_NATIVE_LLONG, 2, dims, NULL, t->rows, visit->err);
    }
    for (int d = 0; ok && d < t->ndim; d++)
        if (t->shape[d] < 1) fail(visit->err, "%s: tensor '%s' has a dimension of %lld", visit->path, tensor, t->shape[d]), ok = false;
    H5Fclose(file);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------- save
// This rank's file: each piece a dataset "<name>/<number>" shaped as its box. A piece on a GPU
// goes through a host copy, one piece at a time.
static void write_shard(const char *path, const CheckpointPiece *pieces, int n, uint64_t id, int rank,
                        PieceRecord *records, double *staged, char *err) {
    hid_t file = h5_create_checksummed(path);
    if (file < 0) {
        fail(err, "%s: cannot create the file (is the folder writable?)", path);
        return;
    }
    double values = 0;
    for (int i = 0; i < n; i++) values += (double)tensor_numel(&pieces[i].values);
    bool ok = reserve_space(file, file_bytes(values, n));
    if (!ok) fail(err, "%s: cannot reserve %.2f MB for it: %s", path, file_bytes(values, n) / 1e6, strerror(errno));
    ok = ok && set_text(file, "format", FORMAT) && set_u64(file, "checkpoint_id", id) && set_u64(file, "rank", (uint64_t)rank);
    for (int i = 0; i < n && ok; i++) {
        const CheckpointPiece *p = &pieces[i];
        PieceRecord *r = &records[i];
        memset(r, 0, sizeof *r);
        CHECK(strlen(p->name) < NAME_SIZE && p->ndim >= 1 && p->ndim <= CHECKPOINT_MAX_DIMS, "checkpoint piece '%s'", p->name);
        snprintf(r->name, sizeof r->name, "%s", p->name);
        r->ndim = p->ndim;
        for (int j = 0; j < i; j++) r->number += strcmp(pieces[j].name, p->name) == 0;
        hsize_t dims[CHECKPOINT_MAX_DIMS];
        for (int d = 0; d < CHECKPOINT_MAX_DIMS; d++) {
            r->shape[d] = d < p->ndim ? p->shape[d] : 1;
            r->offset[d] = d < p->ndim ? p->offset[d] : 0;
            r->count[d] = d < p->ndim ? p->count[d] : 1;
            dims[d] = (hsize_t)r->count[d];
        }
        size_t numel = tensor_numel(&p->values);
        CHECK((long long)numel == volume(p->ndim, p->count), "checkpoint piece '%s': %zu values for its box", p->name, numel);
        float *host = tensor_on_gpu(&p->values) ? xmalloc(numel * sizeof(float)) : p->values.data;
        if (host != p->values.data) {
            tensor_to_host(&p->values, host);
            *staged = fmax(*staged, (double)numel * sizeof(float));
        }
        char name[NAME_SIZE + 24];
        snprintf(name, sizeof name, "%s/%lld", p->name, r->number);
        // A load refuses a value that is not finite: a save never writes one (Adam's second moment
        // overflows to inf where a gradient passes 1.8e19, while the weights and the loss stay finite).
        for (size_t k = 0; k < numel && ok; k++)
            if (!isfinite(host[k])) {
                fail(err, "%s: '%s' holds %s at [%zu] of this rank's piece: a checkpoint holds finite numbers; not saved",
                     path, p->name, isnan(host[k]) ? "nan" : "inf", k);
                ok = false;
            }
        ok = ok && write_dataset(file, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, p->ndim, dims, host);
        if (host != p->values.data) free(host);
        if (!ok) fail(err, "%s: cannot write '%s': %s", path, name, errno ? strerror(errno) : "an HDF5 error");
    }
    if (!ok) fail(err, "%s: cannot write the file's attributes", path);
    if (H5Fclose(file) < 0) fail(err, "%s: cannot finish the file: %s", path, errno ? strerror(errno) : "an HDF5 error");
    if (!err[0] && !sync_path(path, false)) fail(err, "%s: cannot flush it to disk: %s", path, strerror(errno));
}

// Rank 0: the index, from every rank's records.
static void write_index(const char *path, const PieceRecord *records, int n_records, const int *rank_of, uint64_t id,
                        const CheckpointState *state, char *err) {
    hid_t file = h5_create_checksummed(path);
    if (file < 0) {
        fail(err, "%s: cannot create the file (is the folder writable?)", path);
        return;
    }
    char layout[sizeof state->layout];
    snprintf(layout, sizeof layout, "%s", state->layout);
    double values = (double)n_records * ROW * 2 + 624 + 2.0 * state->losses->n + 64;  // (in floats' room)
    if (!reserve_space(file, file_bytes(values, 2 * n_records + 16)))
        fail(err, "%s: cannot reserve %.2f MB for it: %s", path, file_bytes(values, 2 * n_records + 16) / 1e6, strerror(errno));
    bool ok = !err[0] && set_text(file, "format", FORMAT) && set_text(file, "program", state->program) &&
              set_text(file, "layout", layout) && set_u64(file, "world_size", (uint64_t)dist_world_size()) &&
              set_u64(file, "checkpoint_id", id) && (!state->mlflow_run_id[0] || set_text(file, "mlflow_run_id", state->mlflow_run_id));
    // Each tensor once, its pieces in rank order.
    bool *done = xcalloc((size_t)n_records + 1, sizeof(bool));
    long long *rows = xmalloc(((size_t)n_records + 1) * ROW * sizeof(long long));
    for (int i = 0; i < n_records && ok; i++) {
        if (done[i]) continue;
        IndexTensor t = {.ndim = (int)records[i].ndim, .rows = rows};
        snprintf(t.name, sizeof t.name, "%s", records[i].name);
        memcpy(t.shape, records[i].shape, sizeof t.shape);
        for (int j = i; j < n_records; j++) {
            if (done[j] || strcmp(records[j].name, t.name) != 0) continue;
            CHECK(memcmp(records[j].shape, t.shape, sizeof t.shape) == 0, "'%s': ranks disagree on its shape", t.name);
            done[j] = true;
            long long *row = &rows[t.n_pieces++ * ROW];
            row[0] = rank_of[j], row[1] = records[j].number;
            memcpy(row + 2, records[j].offset, sizeof records[j].offset);
            memcpy(row + 2 + CHECKPOINT_MAX_DIMS, records[j].count, sizeof records[j].count);
        }
        char check[ERROR_SIZE] = "";
        check_tiling(&t, dist_world_size(), path, check);  // a program's own pieces: a bug if they do not tile
        CHECK(!check[0], "%s", check);
        char name[NAME_SIZE + 24];
        hsize_t shape_dims[1] = {(hsize_t)t.ndim}, row_dims[2] = {(hsize_t)t.n_pieces, ROW};
        snprintf(name, sizeof name, "tensors/%s/shape", t.name);
        ok = write_dataset(file, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 1, shape_dims, t.shape);
        snprintf(name, sizeof name, "tensors/%s/pieces", t.name);
        ok = ok && write_dataset(file, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 2, row_dims, rows);
    }
    free(done), free(rows);
    // The run's state.
    long long scalars[] = {state->step, state->epoch, state->samples_done, state->seed, state->shuffle,
                           state->train_samples, state->global_batch};
    const char *names[] = {"state/step", "state/epoch", "state/samples_done", "state/seed", "state/shuffle",
                           "state/train_samples", "state/global_batch"};
    for (int k = 0; k < ARRAY_LEN(names) && ok; k++)
        ok = write_dataset(file, names[k], H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, NULL, &scalars[k]);
    ok = ok && write_dataset(file, "state/lr", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, NULL, &state->lr);
    double lr_scale = state->lr_scale > 0 ? state->lr_scale : 1.0;  // (programs that never scale it leave it 0)
    ok = ok && write_dataset(file, "state/lr_scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, NULL, &lr_scale);
    hsize_t words = 624, n_losses = (hsize_t)state->losses->n;
    long long next = state->generator.next;
    ok = ok && write_dataset(file, "state/generator/mt19937", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, &words, state->generator.state);
    ok = ok && write_dataset(file, "state/generator/index", H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, NULL, &next);
    long long eval_next = state->eval_generator.next;
    if (state->eval_generator_kept) {
        ok = ok && write_dataset(file, "state/eval_generator/mt19937", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, &words,
                                 state->eval_generator.state);
        ok = ok && write_dataset(file, "state/eval_generator/index", H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, NULL, &eval_next);
    }
    ok = ok && write_dataset(file, "state/losses/epoch", H5T_STD_I32LE, H5T_NATIVE_INT, 1, &n_losses, state->losses->epoch);
    ok = ok && write_dataset(file, "state/losses/loss", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, &n_losses, state->losses->loss);
    if (!ok) fail(err, "%s: cannot write the index: %s", path, errno ? strerror(errno) : "an HDF5 error");
    if (H5Fclose(file) < 0) fail(err, "%s: cannot finish the file: %s", path, errno ? strerror(errno) : "an HDF5 error");
    if (!err[0] && !sync_path(path, false)) fail(err, "%s: cannot flush it to disk: %s", path, strerror(errno));
}

// Rank 0: all but the newest `keep` checkpoints go (never the current one).
static void keep_newest(const char *dir, int keep, const char *current) {
    long steps[4096];
    int n = list_steps(dir, "step", steps, ARRAY_LEN(steps));
    for (int i = 0; i < n - keep; i++) {
        char name[64], path[PATH_MAX];
        step_folder(name, sizeof name, "step", steps[i]);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (strcmp(name, current) != 0) remove_folder(path);
    }
}

// A save in flight: begun by every rank together (the folder, the id), its shard written (by the
// caller, or by a thread for --async_save), then committed together (the agreement, the index, the
// renames).
struct CheckpointSave {
    const char *dir;              // the caller's (it outlives the save: a flag's value)
    char name[64], temp[64], temp_path[PATH_MAX + 72], shard[PATH_MAX + 128];
    int keep;
    uint64_t id;
    double start;
    CheckpointState state;        // as it was at the save (a copy, with its own loss log)
    LossLog losses;
    PieceRecord *records;
    int n_pieces;
    CheckpointPiece *host_pieces;  // --async_save: the pieces' host copies, which the thread writes
    float *host_values;
    pthread_t thread;
    bool threaded;
    atomic_bool written_out;      // the thread has written and synced its shard (sharded_checkpoint_poll)
    bool continue_on_error;       // --save_errors continue: a failed save warns, and the training goes on
    bool skip_write;              // the folder could not be made: no rank writes, the commit fails
    char err[ERROR_SIZE];
    CheckpointWrite written;
};

// The newest step this process began to save, and the newest it saved (for sharded_checkpoint_save_last).
static long g_attempted_step = -1, g_saved_step = -1;

static CheckpointSave *save_begin(const char *dir, int keep, bool continue_on_error, int n_pieces,
                                  const CheckpointState *state) {
    g_attempted_step = state->step;
    quiet_hdf5();
    CheckpointSave *save = xcalloc(1, sizeof *save);
    save->start = wall_seconds();
    int rank = dist_rank();
    char current[64] = "";
    save->dir = dir;
    save->keep = keep, save->n_pieces = n_pieces, save->continue_on_error = continue_on_error;
    save->state = *state;
    for (int i = 0; i < state->losses->n; i++) loss_log_add(&save->losses, state->losses->epoch[i], state->losses->loss[i]);
    save->state.losses = &save->losses;
    step_folder(save->name, sizeof save->name, "step", state->step);
    snprintf(save->written.folder, sizeof save->written.folder, "%s/%s", dir, save->name);
    save->written.step = state->step;
    step_folder(save->temp, sizeof save->temp, "tmp", state->step);
    snprintf(save->temp_path, sizeof save->temp_path, "%s/%s", dir, save->temp);
    snprintf(save->shard, sizeof save->shard, "%s/shard-%05d.h5", save->temp_path, rank);
    save->records = xmalloc(((size_t)n_pieces + 1) * sizeof(PieceRecord));
    // An id that this save stamps into every file: a shard of another checkpoint is refused.
    if (rank == 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        save->id = ((uint64_t)now.tv_sec * 1000000007ULL) ^ ((uint64_t)now.tv_nsec << 20) ^ (uint64_t)getpid();
        read_current(dir, current, sizeof current);
        CHECK(strcmp(current, save->name) != 0, "%s is already the current checkpoint", save->written.folder);
        if (!remove_folder(save->temp_path) || mkdir(save->temp_path, 0777) != 0)  // a crashed save of this step may be there
            fail(save->err, "%s: cannot create the folder %s: %s", dir, save->temp_path, strerror(errno));
    }
    CHECK_MPI(MPI_Bcast(&save->id, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));
    int begun = !save->err[0];
    CHECK_MPI(MPI_Bcast(&begun, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (!continue_on_error) check_all_ranks(begun, save->err);
    save->skip_write = !begun;  // (rank 0's error fails the commit on every rank)
    return save;
}

// This rank's shard file, and its size.
static void save_write(CheckpointSave *save, const CheckpointPiece *pieces) {
    if (save->skip_write) return;
    double start = wall_seconds();
    errno = 0;
    write_shard(save->shard, pieces, save->n_pieces, save->id, dist_rank(), save->records, &save->written.staged_bytes,
                save->err);
    struct stat info;
    if (!save->err[0] && stat(save->shard, &info) == 0) save->written.bytes = (double)info.st_size;
    save->written.write_seconds = wall_seconds() - start;
}

static void *save_write_thread(void *save) {
    save_write(save, ((CheckpointSave *)save)->host_pieces);
    atomic_store(&((CheckpointSave *)save)->written_out, true);
    return NULL;
}

static void save_free(CheckpointSave *save) {
    loss_log_free(&save->losses);
    free(save->records);
    free(save->host_pieces);
    if (save->host_values) device_host_free(save->host_values);
    free(save);
}

// Collective, after a save failed on some rank (`failed_rank`, the first): nothing becomes current.
// The partial folder goes and the last checkpoint stays; then either every rank exits with the
// failing rank's line, or (--save_errors continue) every rank returns the save marked failed, with
// that line, and the training goes on.
static CheckpointWrite save_abandon(CheckpointSave *save, int failed_rank) {
    unlink(save->shard);
    dist_barrier();
    char current[64] = "";
    if (dist_rank() == 0) {
        remove_folder(save->temp_path);
        // Rank 0's own failure may come after the rename: a step folder that `current` does not name goes too.
        if (!read_current(save->dir, current, sizeof current) || strcmp(current, save->name) != 0)
            remove_folder(save->written.folder);
    }
    if (!save->continue_on_error) {
        check_all_ranks(!save->err[0] || dist_rank() != failed_rank, save->err);
        check_all_ranks(false, "a checkpoint save failed on another rank");  // (not reached: failed_rank exited above)
    }
    CheckpointWrite written = save->written;
    written.failed = true;
    memcpy(written.current, current, sizeof written.current);  // (rank 0's, which prints)
    memcpy(written.error, save->err, sizeof written.error);
    CHECK_MPI(MPI_Bcast(written.error, sizeof written.error, MPI_CHAR, failed_rank, MPI_COMM_WORLD));
    written.seconds = wall_seconds() - save->start;
    save_free(save);
    return written;
}

// The first rank whose save failed (`ok` false there), or -1. Collective.
static int first_failed_rank(bool ok) {
    int first = ok ? INT_MAX : dist_rank();
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return first == INT_MAX ? -1 : first;
}

// Collective: every rank's shard is whole, or the save fails on every rank; then rank 0 writes the
// index and makes the checkpoint current.
static CheckpointWrite save_commit(CheckpointSave *save) {
    int rank = dist_rank(), world = dist_world_size(), n_pieces = save->n_pieces;
    char *err = save->err;
    int failed_rank = first_failed_rank(!err[0]);
    if (failed_rank >= 0) return save_abandon(save, failed_rank);

    // The index: every rank's pieces, gathered on rank 0 (a few hundred bytes each).
    int mine = n_pieces * (int)sizeof(PieceRecord), *counts = NULL, *displs = NULL, total = 0;
    PieceRecord *all = NULL;
    int *rank_of = NULL;
    if (rank == 0) counts = xmalloc((size_t)world * sizeof(int)), displs = xmalloc((size_t)world * sizeof(int));
    CHECK_MPI(MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (rank == 0) {
        for (int r = 0; r < world; r++) displs[r] = total, total += counts[r];
        all = xmalloc((size_t)total + 1);
        rank_of = xmalloc(((size_t)total / sizeof(PieceRecord) + 1) * sizeof(int));
        for (int r = 0; r < world; r++)
            for (int k = 0; k < counts[r] / (int)sizeof(PieceRecord); k++) rank_of[displs[r] / (int)sizeof(PieceRecord) + k] = r;
    }
    CHECK_MPI(MPI_Gatherv(save->records, mine, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD));
    CheckpointWrite written = save->written;
    if (rank == 0) {
        char index[PATH_MAX + 128];
        struct stat info;
        snprintf(index, sizeof index, "%s/index.h5", save->temp_path);
        errno = 0;
        write_index(index, all, total / (int)sizeof(PieceRecord), rank_of, save->id, &save->state, err);
        if (!err[0] && stat(index, &info) == 0) written.index_bytes = (double)info.st_size;
        // The switch: the folder gets its final name, then `current` names it.
        const char *dir = save->dir;
        if (!err[0] && !sync_path(save->temp_path, true)) fail(err, "%s: cannot flush the folder: %s", save->temp_path, strerror(errno));
        if (!err[0] && !remove_folder(written.folder))  // a whole one that a crash kept from becoming current
            fail(err, "%s: cannot remove the stale %s: %s", dir, written.folder, strerror(errno));
        if (!err[0] && rename(save->temp_path, written.folder) != 0)
            fail(err, "%s: cannot rename %s to %s: %s", dir, save->temp, save->name, strerror(errno));
        if (!err[0] && !sync_path(dir, true)) fail(err, "%s: cannot flush the folder: %s", dir, strerror(errno));
        if (!err[0] && !write_current(dir, save->name)) fail(err, "%s/current: cannot replace it: %s", dir, strerror(errno));
        if (!err[0]) keep_newest(dir, save->keep, save->name);
        free(all), free(rank_of), free(counts), free(displs);
    }
    failed_rank = first_failed_rank(!err[0]);  // rank 0's part: the index, the renames
    if (failed_rank >= 0) return save_abandon(save, failed_rank);
    written.seconds = wall_seconds() - save->start;
    g_saved_step = written.step;
    save_free(save);
    return written;
}

CheckpointWrite sharded_checkpoint_save(const char *dir, int keep, bool continue_on_error, const CheckpointPiece *pieces,
                                        int n_pieces, const CheckpointState *state) {
    CheckpointSave *save = save_begin(dir, keep, continue_on_error, n_pieces, state);
    save_write(save, pieces);
    return save_commit(save);
}

bool sharded_checkpoint_save_async(CheckpointSave **in_flight, const char *dir, int keep, bool continue_on_error,
                                   const CheckpointPiece *pieces, int n_pieces, const CheckpointState *state,
                                   CheckpointWrite *finished) {
    bool any = sharded_checkpoint_finish(in_flight, finished);
    double start = wall_seconds();
    CheckpointSave *save = save_begin(dir, keep, continue_on_error, n_pieces, state);
    // The stall: this rank's pieces copied into one host buffer (page-locked on a GPU rank), which
    // the thread writes while the training changes the originals.
    size_t total = 0;
    for (int i = 0; i < n_pieces; i++) total += tensor_numel(&pieces[i].values);
    save->host_values = device_host_alloc((total + 1) * sizeof(float));
    save->host_pieces = xmalloc(((size_t)n_pieces + 1) * sizeof(CheckpointPiece));
    size_t at = 0;
    for (int i = 0; i < n_pieces; i++) {
        size_t numel = tensor_numel(&pieces[i].values);
        save->host_pieces[i] = pieces[i];
        save->host_pieces[i].values = (Tensor){.data = save->host_values + at, .rows = 1, .cols = (int)numel, .device = DEVICE_CPU};
        tensor_to_host(&pieces[i].values, save->host_values + at);
        at += numel;
    }
    save->written.staged_bytes = (double)total * sizeof(float);
    save->written.asynchronous = true;
    save->written.stall_seconds = wall_seconds() - start;
    if (!save->skip_write) {
        CHECK(pthread_create(&save->thread, NULL, save_write_thread, save) == 0, "cannot start the checkpoint's writer thread");
        save->threaded = true;
    }
    *in_flight = save;
    return any;
}

bool sharded_checkpoint_finish(CheckpointSave **in_flight, CheckpointWrite *finished) {
    CheckpointSave *save = *in_flight;
    if (!save) return false;
    *in_flight = NULL;
    double start = wall_seconds();
    if (save->threaded) CHECK(pthread_join(save->thread, NULL) == 0, "cannot join the checkpoint's writer thread");
    double waited = wall_seconds() - start;
    *finished = save_commit(save);
    finished->stall_seconds += waited;  // the copy, and a wait for the thread where it had not finished
    return true;
}

void sharded_checkpoint_save_step(CheckpointSave **in_flight, const char *dir, int keep, bool continue_on_error,
                                  const CheckpointPiece *pieces, int n_pieces, const CheckpointState *state) {
    CheckpointWrite written;
    if (!in_flight) {
        written = sharded_checkpoint_save(dir, keep, continue_on_error, pieces, n_pieces, state);
        sharded_checkpoint_print_saved(&written, written.step);
    } else if (sharded_checkpoint_save_async(in_flight, dir, keep, continue_on_error, pieces, n_pieces, state, &written)) {
        sharded_checkpoint_print_saved(&written, written.step);  // the previous one, now current
    }
}

void sharded_checkpoint_poll(CheckpointSave **in_flight) {
    if (!*in_flight) return;  // (the same on every rank: saves begin and end collectively)
    int done = !(*in_flight)->threaded || atomic_load(&(*in_flight)->written_out);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &done, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (done) sharded_checkpoint_finish_saves(in_flight);  // every thread is done: the join waits for nothing
}

void sharded_checkpoint_finish_saves(CheckpointSave **in_flight) {
    CheckpointWrite written;
    if (sharded_checkpoint_finish(in_flight, &written)) sharded_checkpoint_print_saved(&written, written.step);
}

bool sharded_checkpoint_save_last(CheckpointSave **in_flight, const char *dir, int keep, bool continue_on_error,
                                  const CheckpointPiece *pieces, int n_pieces, const CheckpointState *state) {
    sharded_checkpoint_finish_saves(in_flight);
    if (g_saved_step == state->step) return true;  // a --save_every save holds it
    // Two tries in all: a failed --save_every save of this step was the first.
    const int tries = g_attempted_step == state->step ? 1 : 2;
    for (int t = 0; t < tries; t++) {
        CheckpointWrite written = sharded_checkpoint_save(dir, keep, continue_on_error, pieces, n_pieces, state);
        sharded_checkpoint_print_saved(&written, written.step);
        if (!written.failed) return true;
    }
    return false;  // (only under continue_on_error: without it a failed save has ended the run already)
}

void sharded_checkpoint_check_end_saved(bool end_saved, const char *dir) {
    char message[PATH_MAX + 256];
    snprintf(message, sizeof message, "the end of training is not saved in %s: the last step's checkpoint failed twice "
             "(--save_errors continue; the warnings above say why)", dir ? dir : "");
    check_all_ranks(end_saved, message);
}

// ---------------------------------------------------------------- load
typedef struct {
    const char *dir;
    char folder[PATH_MAX];   // DIR/step-NNNNNN
    Index index;
    uint64_t id;
    int files;               // the saved world size: shard-00000 .. shard-(files - 1)
    char program[128];       // the program that saved it
    hid_t *open;             // [files]: the shard files this rank opened (lazily)
} Loading;

static void shard_path(const Loading *l, int file, char *out, size_t size) {
    snprintf(out, size, "%s/shard-%05d.h5", l->folder, file);
}

// Opens shard file `file` and checks that it is this checkpoint's and that it holds every piece
// the index places there, shaped as the index says. On a problem, err (and a negative id).
static hid_t open_shard(Loading *l, int file, char *err) {
    if (l->open[file] >= 0) return l->open[file];
    char path[PATH_MAX + 32];
    shard_path(l, file, path, sizeof path);
    struct stat info;
    if (stat(path, &info) != 0) {
        fail(err, "%s: missing (expected rank %d's shards of %s: %s)", path, file, l->folder, strerror(errno));
        return H5I_INVALID_HID;
    }
    hid_t h = open_file(path);
    if (h < 0) {
        fail(err, "%s: not a readable HDF5 file (%lld bytes): truncated or corrupt (expected rank %d's shards)", path,
             (long long)info.st_size, file);
        return H5I_INVALID_HID;
    }
    char format[128];
    uint64_t id = 0, rank = 0;
    if (!get_text(h, "format", format, sizeof format) || strcmp(format, FORMAT) != 0 || !get_u64(h, "rank", &rank))
        fail(err, "%s: not a shard of a sharded checkpoint (expected the attributes format '%s' and rank)", path, FORMAT);
    for (int t = 0; t < l->index.n_tensors && !err[0]; t++) {
        const IndexTensor *tensor = &l->index.tensors[t];
        for (long p = 0; p < tensor->n_pieces && !err[0]; p++) {
            const long long *row = &tensor->rows[p * ROW], *count = row + 2 + CHECKPOINT_MAX_DIMS;
            if (row[0] != file) continue;
            char name[NAME_SIZE + 24], found[96] = "none", expected[96];
            snprintf(name, sizeof name, "%s/%lld", tensor->name, row[1]);
            hsize_t dims[H5S_MAX_RANK];
            int ndim = dataset_dims(h, name, dims);
            bool same = ndim == tensor->ndim;
            long long stored[H5S_MAX_RANK];
            for (int d = 0; d < ndim && d < H5S_MAX_RANK; d++) stored[d] = (long long)dims[d];
            for (int d = 0; same && d < ndim; d++) same = stored[d] == count[d];
            if (ndim >= 0) format_dims(found, sizeof found, ndim, stored);
            format_dims(expected, sizeof expected, tensor->ndim, count);
            if (!same)
                fail(err, "%s: dataset '%s' is %s, the index expects float32 %s (a shard of another model, or an index "
                     "that disagrees with its shards)", path, name, ndim < 0 ? "missing" : found, expected);
        }
    }
    // The shapes first (a shard of another model says so), then whether it is this checkpoint's.
    if (!err[0] && (!get_u64(h, "checkpoint_id", &id) || id != l->id || rank != (uint64_t)file))
        fail(err, "%s: a shard of another checkpoint (its id %016llx, rank %llu; the index's %016llx, rank %d)", path,
             (unsigned long long)id, (unsigned long long)rank, (unsigned long long)l->id, file);
    if (err[0]) {
        H5Fclose(h);
        return H5I_INVALID_HID;
    }
    return l->open[file] = h;
}

// Reads every saved piece of `p`'s tensor that overlaps p's box, each overlap a hyperslab of
// the file that holds it into its place in p's values.
static double read_piece(Loading *l, const IndexTensor *t, const CheckpointPiece *p, char *err) {
    size_t numel = tensor_numel(&p->values);
    float *host = tensor_on_gpu(&p->values) ? xmalloc(numel * sizeof(float)) : p->values.data;
    long long got = 0;
    hsize_t memory_dims[CHECKPOINT_MAX_DIMS];
    for (int d = 0; d < p->ndim; d++) memory_dims[d] = (hsize_t)p->count[d];
    for (long k = 0; k < t->n_pieces && !err[0]; k++) {
        const long long *row = &t->rows[k * ROW], *offset = row + 2, *count = row + 2 + CHECKPOINT_MAX_DIMS;
        hsize_t in_file[CHECKPOINT_MAX_DIMS], in_memory[CHECKPOINT_MAX_DIMS], size[CHECKPOINT_MAX_DIMS];
        bool overlap = true;
        for (int d = 0; d < p->ndim; d++) {
            long long low = offset[d] > p->offset[d] ? offset[d] : p->offset[d];
            long long high = offset[d] + count[d] < p->offset[d] + p->count[d] ? offset[d] + count[d] : p->offset[d] + p->count[d];
            overlap = overlap && high > low;
            in_file[d] = (hsize_t)(low - offset[d]), in_memory[d] = (hsize_t)(low - p->offset[d]);
            size[d] = high > low ? (hsize_t)(high - low) : 0;
        }
        if (!overlap) continue;
        hid_t file = open_shard(l, (int)row[0], err);
        if (file < 0) break;
        char name[NAME_SIZE + 24], path[PATH_MAX + 32];
        snprintf(name, sizeof name, "%s/%lld", t->name, row[1]);
        hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT), file_space = H5Dget_space(dataset);
        hid_t memory_space = H5Screate_simple(p->ndim, memory_dims, NULL);
        const char *problem = dataset < 0 ? NULL : stored_problem(dataset, H5T_NATIVE_FLOAT);
        bool ok = !problem && H5Sselect_hyperslab(file_space, H5S_SELECT_SET, in_file, NULL, size, NULL) >= 0 &&
                  H5Sselect_hyperslab(memory_space, H5S_SELECT_SET, in_memory, NULL, size, NULL) >= 0 &&
                  H5Dread(dataset, H5T_NATIVE_FLOAT, memory_space, file_space, H5P_DEFAULT, host) >= 0;
        H5Sclose(memory_space), H5Sclose(file_space), H5Dclose(dataset);
        shard_path(l, (int)row[0], path, sizeof path);
        if (problem) fail(err, "%s: '%s' %s: a damaged shard", path, name, problem);
        else if (!ok) fail(err, "%s: cannot read '%s' (truncated or corrupt)", path, name);
        long long overlap_volume = 1;
        for (int d = 0; d < p->ndim; d++) overlap_volume *= (long long)size[d];
        got += overlap_volume;
    }
    for (size_t k = 0; !err[0] && k < numel; k++)
        if (!isfinite(host[k])) fail(err, "%s: '%s' holds %s: a checkpoint holds finite numbers", l->folder, p->name, isnan(host[k]) ? "nan" : "inf");
    if (!err[0] && got != (long long)numel)  // (the tiling check makes this a bug)
        fail(err, "%s: '%s': read %lld of the box's %zu elements", l->folder, p->name, got, numel);
    if (!err[0] && host != p->values.data) tensor_from_host((Tensor *)&p->values, host);
    if (host != p->values.data) free(host);
    return (double)got * sizeof(float);
}

// Every rank reads the index whole (its tensors' shapes and pieces, the state): a few kB.
static void read_index(Loading *l, const CheckpointPiece *pieces, int n_pieces, CheckpointState *state, char *err) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/index.h5", l->folder);
    struct stat info;
    if (stat(path, &info) != 0) {
        fail(err, "%s: missing: %s (every checkpoint folder has its index)", path, strerror(errno));
        return;
    }
    hid_t file = open_file(path);
    if (file < 0) {
        fail(err, "%s: not a readable HDF5 file (%lld bytes): truncated or corrupt", path, (long long)info.st_size);
        return;
    }
    char format[128], *program = l->program;
    uint64_t world = 0;
    if (!get_text(file, "format", format, sizeof format) || strcmp(format, FORMAT) != 0)
        fail(err, "%s: not a sharded checkpoint's index (expected the format '%s')", path, FORMAT);
    else if (!get_text(file, "program", program, sizeof l->program))
        fail(err, "%s: an index without its program attribute", path);
    else if (state->program && strcmp(program, state->program) != 0 &&  // (NULL: a reader, outside a run)
             !(state->also_resumes && strcmp(program, state->also_resumes) == 0))
        fail(err, "%s: a checkpoint of %s, not of %s%s%s", path, program, state->program, state->also_resumes ? " or " : "",
             state->also_resumes ? state->also_resumes : "");
    else if (!get_u64(file, "checkpoint_id", &l->id) || !get_u64(file, "world_size", &world) || world < 1 || world > 1000000 ||
             !get_text(file, "layout", state->layout, sizeof state->layout))
        fail(err, "%s: an index without its checkpoint_id, world_size and layout attributes", path);
    else if (state->program && strcmp(program, state->program) != 0) {  // the other program's: said in the resume line
        char layout[sizeof state->layout];
        snprintf(layout, sizeof layout, "%s", state->layout);
        snprintf(state->layout, sizeof state->layout, "%.20s, %.41s", program, layout);  // (both short: room for both)
    }
    if (!get_text(file, "mlflow_run_id", state->mlflow_run_id, sizeof state->mlflow_run_id)) state->mlflow_run_id[0] = '\0';
    l->files = (int)world;
    if (!err[0] && H5Lexists(file, "tensors", H5P_DEFAULT) > 0) {
        hid_t group = H5Gopen2(file, "tensors", H5P_DEFAULT);
        VisitIndex visit = {.group = group, .index = &l->index, .path = path, .err = err};
        H5Lvisit(group, H5_INDEX_NAME, H5_ITER_NATIVE, visit_tensor, &visit);
        H5Gclose(group);
    }
    for (int t = 0; t < l->index.n_tensors && !err[0]; t++) check_tiling(&l->index.tensors[t], l->files, path, err);
    // The tensors this run wants, with the shapes it has.
    for (int i = 0; i < n_pieces && !err[0]; i++) {
        const CheckpointPiece *p = &pieces[i];
        const IndexTensor *t = index_find(&l->index, p->name);
        char want[96], have[96];
        format_dims(want, sizeof want, p->ndim, p->shape);
        if (!t) {
            fail(err, "%s: no tensor '%s' (expected %s): a checkpoint of another model", path, p->name, want);
            break;
        }
        format_dims(have, sizeof have, t->ndim, t->shape);
        if (strcmp(want, have) != 0)
            fail(err, "%s: tensor '%s' is %s, this model's is %s: a checkpoint of another model", path, p->name, have, want);
    }
    // The state.
    long long scalars[7] = {0};
    const char *names[] = {"state/step", "state/epoch", "state/samples_done", "state/seed", "state/shuffle",
                           "state/train_samples", "state/global_batch"};
    for (int k = 0; k < ARRAY_LEN(names) && !err[0]; k++)
        read_dataset(file, path, names[k], H5T_NATIVE_LLONG, 0, NULL, NULL, &scalars[k], err);
    double lr = 0;
    hsize_t words = 624;
    long long next = 0;
    if (!err[0]) read_dataset(file, path, "state/lr", H5T_NATIVE_DOUBLE, 0, NULL, NULL, &lr, err);
    // A checkpoint from before elastic restarts has no lr_scale: its lr was never scaled.
    double lr_scale = 1.0;
    if (!err[0] && H5Lexists(file, "state/lr_scale", H5P_DEFAULT) > 0)
        read_dataset(file, path, "state/lr_scale", H5T_NATIVE_DOUBLE, 0, NULL, NULL, &lr_scale, err);
    if (!err[0] && !(lr_scale > 0 && lr_scale < 1e6)) fail(err, "%s: inconsistent: state/lr_scale %g", path, lr_scale);
    if (!err[0]) read_dataset(file, path, "state/generator/mt19937", H5T_NATIVE_UINT32, 1, &words, NULL, state->generator.state, err);
    if (!err[0]) read_dataset(file, path, "state/generator/index", H5T_NATIVE_LLONG, 0, NULL, NULL, &next, err);
    Rng eval_generator = {0};
    long long eval_next = 0;
    if (!err[0] && state->eval_generator_kept) {
        read_dataset(file, path, "state/eval_generator/mt19937", H5T_NATIVE_UINT32, 1, &words, NULL, eval_generator.state, err);
        if (!err[0]) read_dataset(file, path, "state/eval_generator/index", H5T_NATIVE_LLONG, 0, NULL, NULL, &eval_next, err);
        if (!err[0] && (eval_next < 0 || eval_next > 624)) fail(err, "%s: inconsistent: the evaluation generator's index %lld", path, eval_next);
        eval_generator.next = (int)eval_next;
    }
    long steps = scalars[0] >= 0 && scalars[0] < INT_MAX ? (long)scalars[0] : 0;
    int *epochs = xmalloc(((size_t)steps + 1) * sizeof(int));
    float *losses = xmalloc(((size_t)steps + 1) * sizeof(float));
    long n_epochs = steps, n_losses = steps;
    if (!err[0]) read_dataset(file, path, "state/losses/epoch", H5T_NATIVE_INT, 1, NULL, &n_epochs, epochs, err);
    if (!err[0]) read_dataset(file, path, "state/losses/loss", H5T_NATIVE_FLOAT, 1, NULL, &n_losses, losses, err);
    H5Fclose(file);
    for (long i = 0; !err[0] && i < steps && i < n_losses && i < n_epochs; i++)
        if (!isfinite(losses[i]) || epochs[i] < 0)
            fail(err, "%s: inconsistent: the loss log's step %ld: epoch %d, loss %g (a logged loss is finite, its epoch >= 0)", path,
                 i + 1, epochs[i], losses[i]);
    if (!err[0] && (n_epochs != steps || n_losses != steps || next < 0 || next > 624 || scalars[2] < 0 ||
                    scalars[1] < 0 || scalars[2] >= scalars[5]))
        fail(err, "%s: inconsistent: step %lld, %ld losses logged, epoch %lld with %lld samples done", path, scalars[0],
             n_losses, scalars[1], scalars[2]);
    // The run must be the same one (its world size and batch aside).
    if (!err[0] && state->program && (scalars[3] != state->seed || scalars[4] != state->shuffle || scalars[5] != state->train_samples || lr != state->lr))
        fail(err, "%s: a checkpoint of another run: seed %lld, shuffle %lld, %lld training samples, lr %g (this run: "
             "seed %d, shuffle %d, %d, lr %g)", path, scalars[3], scalars[4], scalars[5], lr, state->seed, state->shuffle,
             state->train_samples, state->lr);
    if (!err[0]) {
        state->step = steps, state->epoch = (int)scalars[1], state->samples_done = (long)scalars[2];
        state->global_batch = (long)scalars[6], state->world_size = l->files, state->generator.next = (int)next;
        state->lr_scale = lr_scale;
        if (state->eval_generator_kept) state->eval_generator = eval_generator;
        loss_log_free(state->losses);
        for (long i = 0; i < steps; i++) loss_log_add(state->losses, epochs[i], losses[i]);
    }
    free(epochs), free(losses);
}

// Rank 0, before anything else: DIR exists and takes a file, and stale saves go.
static void prepare_folder(const char *dir, char *err) {
    char probe[PATH_MAX];
    snprintf(probe, sizeof probe, "%s/.writable.%ld", dir, (long)getpid());
    FILE *file = NULL;
    if (!make_dirs(dir) || !(file = fopen(probe, "w")) || fclose(file) != 0) {
        fail(err, "%s: the checkpoint folder is not writable: %s", dir, strerror(errno));
        return;
    }
    unlink(probe);
    long steps[256];
    int n = list_steps(dir, "tmp", steps, ARRAY_LEN(steps));
    for (int i = 0; i < n; i++) {
        char name[64], path[PATH_MAX];
        step_folder(name, sizeof name, "tmp", steps[i]);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        print0("%s: removing an unfinished checkpoint (a run died while saving it; the current one is untouched)\n", path);
        remove_folder(path);
    }
}

bool sharded_checkpoint_load(const char *dir, const CheckpointPiece *pieces, int n_pieces, CheckpointState *state,
                             double *bytes_read) {
    quiet_hdf5();
    char err[ERROR_SIZE] = "", name[64] = "";
    *bytes_read = 0;
    if (dist_rank() == 0) prepare_folder(dir, err);
    check_all_ranks(!err[0], err);

    // Every rank resumes, or none: they must all see the same `current`.
    int here = read_current(dir, name, sizeof name), seen_by = here, world = dist_world_size();
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &seen_by, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (seen_by == 0) return false;
    char first[64] = "";
    memcpy(first, name, sizeof first);
    CHECK_MPI(MPI_Bcast(first, sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (!here || strcmp(first, name) != 0)
        fail(err, "%s/current: %d of %d ranks see it, and rank 0 reads %s, this rank %s: every rank must see the "
             "same folder (a shared file system)", dir, seen_by, world, QUOTE(first), QUOTE(name));
    else if (!is_step_name(name))
        fail(err, "%s/current names %s, expected a step-NNNNNN folder", dir, QUOTE(name));
    check_all_ranks(!err[0], err);

    Loading l = {.dir = dir};
    snprintf(l.folder, sizeof l.folder, "%s/%s", dir, name);
    read_index(&l, pieces, n_pieces, state, err);
    check_all_ranks(!err[0], err);
    l.open = xmalloc((size_t)l.files * sizeof(hid_t));
    for (int f = 0; f < l.files; f++) l.open[f] = H5I_INVALID_HID;
    // Every shard file checked by one rank (its headers: a few kB), so that a missing or foreign
    // file is found whatever this layout reads; then each rank reads its overlaps.
    for (int f = dist_rank(); f < l.files && !err[0]; f += world) open_shard(&l, f, err);
    check_all_ranks(!err[0], err);
    for (int i = 0; i < n_pieces && !err[0]; i++)
        *bytes_read += read_piece(&l, index_find(&l.index, pieces[i].name), &pieces[i], err);
    for (int f = 0; f < l.files; f++)
        if (l.open[f] >= 0) H5Fclose(l.open[f]);
    free(l.open);
    index_free(&l.index);
    check_all_ranks(!err[0], err);
    return true;
}

// ---------------------------------------------------------------- parameters and Adam, as pieces
CheckpointBox checkpoint_whole_box(const Tensor *value, int writer, int writers) {
    CheckpointBox box = {.ndim = value->rows == 1 ? 1 : 2, .writer = writer, .writers = writers};
    box.shape[0] = box.ndim == 1 ? value->cols : value->rows, box.shape[1] = value->cols;
    return box;
}

CheckpointPieces checkpoint_param_pieces(const Param *params, const Tensor *exp_avg, const Tensor *exp_avg_sq,
                                         int n_params, const CheckpointBox *boxes, bool saving) {
    CheckpointPieces list = {.piece = xcalloc((size_t)(3 * n_params) + 1, sizeof(CheckpointPiece)),
                             .names = xcalloc((size_t)(3 * n_params) + 1, sizeof *list.names)};
    for (int i = 0; i < n_params; i++) {
        const Tensor *value = params[i].value;
        CheckpointBox box = boxes[i];
        CHECK(box.ndim == 1 || box.ndim == 2, "%s: a box of %d dimensions (expected 1 or 2)", params[i].name, box.ndim);
        int writer = saving && box.writers > 1 ? box.writer : 0, writers = saving && box.writers > 1 ? box.writers : 1;
        long long count[2] = {box.ndim == 1 ? (long long)tensor_numel(value) : value->rows, value->cols};
        // This writer's rows of the box (of its elements, for a vector): a contiguous run of its values.
        long long lead = count[0], row_size = box.ndim == 1 ? 1 : count[1];
        long long first = lead * writer / writers, end = lead * (writer + 1) / writers;
        if (first >= end) continue;
        const Tensor *states[3] = {value, exp_avg ? &exp_avg[i] : NULL, exp_avg_sq ? &exp_avg_sq[i] : NULL};
        const char *prefixes[3] = {"", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
        for (int k = 0; k < 3; k++) {
            if (!states[k]) continue;
            CheckpointPiece *p = &list.piece[list.n];
            snprintf(list.names[list.n], sizeof *list.names, "%s%s", prefixes[k], params[i].name);
            *p = (CheckpointPiece){.name = list.names[list.n], .ndim = box.ndim};
            for (int d = 0; d < box.ndim; d++)
                p->shape[d] = box.shape[d], p->offset[d] = box.offset[d], p->count[d] = count[d];
            p->offset[0] += first, p->count[0] = end - first;
            p->values = (Tensor){.data = states[k]->data + first * row_size, .rows = 1,
                                 .cols = (int)((end - first) * row_size), .device = states[k]->device};
            list.n++;
        }
    }
    return list;
}

void checkpoint_pieces_free(CheckpointPieces *pieces) {
    free(pieces->piece);
    free(pieces->names);
    *pieces = (CheckpointPieces){0};
}

// ---------------------------------------------------------------- what the programs print
bool sharded_checkpoint_resume(const char *dir, const CheckpointPiece *pieces, int n_pieces, CheckpointState *state,
                               const char *init) {
    double start = wall_seconds(), bytes = 0;
    char this_layout[sizeof state->layout];  // (the load replaces state->layout with the checkpoint's)
    snprintf(this_layout, sizeof this_layout, "%s", state->layout);
    long global_batch = state->global_batch;
    int world = dist_world_size();
    if (!sharded_checkpoint_load(dir, pieces, n_pieces, state, &bytes)) {
        print0("No checkpoint in %s: training from the start\n", dir);
        return false;
    }
    double range[2] = {-bytes, bytes};  // the least and the most a rank read
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    char position[128];  // the data's: the sampler's, or (random windows) the generator's, restored with it
    if (state->random_windows) snprintf(position, sizeof position, "the windows' generator restored");
    else snprintf(position, sizeof position, "epoch %d, %ld of its %d samples done", state->epoch + 1, state->samples_done,
                  state->train_samples);
    print0("Resumed from %s/step-%06ld, saved by %s: step %ld, %s; %s%.2f to %.2f MB read per rank in %.1f ms\n", dir,
           state->step, state->layout, state->step, position, strcmp(state->layout, this_layout) ? "resharded, " : "",
           -range[0] / 1e6, range[1] / 1e6, 1e3 * (wall_seconds() - start));
    if (state->lr_follows_world && state->world_size != world)
        print0("The checkpoint was saved on %d rank%s, this run has %d: the learning rate follows the world size (lr x %d) "
               "and the global batch is %ld samples (it was %ld): the steps from here are not an uninterrupted run's\n",
               state->world_size, state->world_size == 1 ? "" : "s", world, world, global_batch, state->global_batch);
    else if (state->global_batch != global_batch && !state->adopts_global_batch)
        print0("The checkpoint's global batch was %ld samples, this run's is %ld: the steps from here are not an "
               "uninterrupted run's (a global batch of %ld keeps them)\n", state->global_batch, global_batch,
               state->global_batch);
    if (init) print0("--init %s is not used: the checkpoint's weights are the run's\n", init);
    // This run's again: what its own saves record (a resumed run's checkpoints named the first run's
    // layout); the program reads the checkpoint's world size and global batch in saved_* (--on_resize).
    state->saved_world_size = state->world_size, state->saved_global_batch = state->global_batch;
    snprintf(state->layout, sizeof state->layout, "%s", this_layout);
    state->world_size = world, state->global_batch = global_batch;
    return true;
}

// needs: the flags that mean something only with --checkpoint (--save_every first, which step 13 skips).
static void check_flags(const char *checkpoint, bool with_save_every) {
    const char *needs[] = {"save_every", "keep", "async_save", "save_errors"};
    for (int i = with_save_every ? 0 : 1; i < ARRAY_LEN(needs) && !checkpoint; i++)
        if (args_given(needs[i])) usage_error("--%s: only with --checkpoint DIR", needs[i]);
    if (checkpoint && !checkpoint[0]) usage_error("--checkpoint '': expected a folder");
}

void checkpoint_flags_check(const char *checkpoint) { check_flags(checkpoint, true); }
void checkpoint_flags_check_own_interval(const char *checkpoint) { check_flags(checkpoint, false); }

void sharded_checkpoint_print_saved(const CheckpointWrite *written, long step) {
    if (written->failed) {  // (--save_errors continue) every rank has the failing rank's line
        if (dist_rank() == 0) {
            bool has_current = written->current[0];
            fflush(stdout);
            fprintf(stderr, "warning: checkpoint of step %ld not saved in %s, its unfinished folder removed; %s%s; "
                    "training goes on (--save_errors continue): %s\n", step, written->folder,
                    has_current ? "current still names " : "no checkpoint is current yet", written->current,
                    written->error);
            fflush(stderr);
        }
        return;
    }
    double figures[4] = {-written->bytes, written->bytes, written->seconds, written->staged_bytes};
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, figures, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    char staged[64] = "";
    if (figures[3] > 0 && !written->asynchronous)
        snprintf(staged, sizeof staged, ", through host copies of up to %.2f MB", figures[3] / 1e6);
    if (!written->asynchronous) {
        print0("Checkpoint of step %ld saved in %s: %.2f to %.2f MB per rank (the shard files%s), index %.3f MB; %.1f ms\n",
               step, written->folder, -figures[0] / 1e6, figures[1] / 1e6, staged, written->index_bytes / 1e6, 1e3 * figures[2]);
        return;
    }
    // Asynchronous: the training stalled for the host copy (and any wait for the thread); the thread wrote.
    double times[2] = {written->stall_seconds, written->write_seconds};
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    print0("Checkpoint of step %ld saved in %s: %.2f to %.2f MB per rank (the shard files, written by a thread from "
           "host copies), index %.3f MB; the training stalled %.1f ms, the thread wrote for %.1f ms\n", step,
           written->folder, -figures[0] / 1e6, figures[1] / 1e6, written->index_bytes / 1e6, 1e3 * times[0], 1e3 * times[1]);
}

// ---------------------------------------------------------------- reading outside a run
struct CheckpointReader {
    Loading l;
    CheckpointState state;
    LossLog losses;
};

CheckpointReader *checkpoint_reader_open(const char *dir, char err[CHECKPOINT_ERROR_SIZE]) {
    quiet_hdf5();
    err[0] = '\0';
    CheckpointReader *r = xcalloc(1, sizeof *r);
    r->l.dir = dir;
    r->state.losses = &r->losses;
    char name[64] = "", index[PATH_MAX + 16];
    snprintf(index, sizeof index, "%s/index.h5", dir);
    struct stat info;
    if (stat(index, &info) == 0) {  // a step-NNNNNN folder itself
        snprintf(r->l.folder, sizeof r->l.folder, "%s", dir);
    } else if (read_current(dir, name, sizeof name)) {
        if (is_step_name(name)) snprintf(r->l.folder, sizeof r->l.folder, "%s/%s", dir, name);
        else fail(err, "%s/current names %s, expected a step-NNNNNN folder", dir, QUOTE(name));
    } else {
        fail(err, "%s: no checkpoint (expected a checkpoint folder with a current file, or a step-NNNNNN folder with "
             "its index.h5)", dir);
    }
    if (!err[0]) read_index(&r->l, NULL, 0, &r->state, err);
    if (err[0]) {
        checkpoint_reader_close(r);
        return NULL;
    }
    r->state.program = r->l.program;
    r->l.open = xmalloc((size_t)r->l.files * sizeof(hid_t));
    for (int f = 0; f < r->l.files; f++) r->l.open[f] = H5I_INVALID_HID;
    return r;
}

const CheckpointState *checkpoint_reader_state(const CheckpointReader *r) { return &r->state; }
const char *checkpoint_reader_folder(const CheckpointReader *r) { return r->l.folder; }
int checkpoint_reader_tensors(const CheckpointReader *r) { return r->l.index.n_tensors; }

const char *checkpoint_reader_tensor(const CheckpointReader *r, int t, int *ndim, long long shape[CHECKPOINT_MAX_DIMS]) {
    const IndexTensor *tensor = &r->l.index.tensors[t];
    *ndim = tensor->ndim;
    for (int d = 0; d < CHECKPOINT_MAX_DIMS; d++) shape[d] = d < tensor->ndim ? tensor->shape[d] : 0;
    return tensor->name;
}

bool checkpoint_reader_read(CheckpointReader *r, const CheckpointPiece *piece, char err[CHECKPOINT_ERROR_SIZE]) {
    err[0] = '\0';
    const IndexTensor *t = index_find(&r->l.index, piece->name);
    if (!t) fail(err, "%s: no tensor '%s'", r->l.folder, piece->name);
    else read_piece(&r->l, t, piece, err);
    return !err[0];
}

void checkpoint_reader_close(CheckpointReader *r) {
    if (!r) return;
    for (int f = 0; r->l.open && f < r->l.files; f++)
        if (r->l.open[f] >= 0) H5Fclose(r->l.open[f]);
    free(r->l.open);
    index_free(&r->l.index);
    loss_log_free(&r->losses);
    free(r);
}
