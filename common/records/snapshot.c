// snapshot.c: training snapshots in HDF5, replaced atomically. See snapshot.h.
//
// One function, visit_snapshot(), lists the fields of a snapshot in order; it
// writes them when saving and reads and checks them when loading, so the two
// can never disagree on a name, a type, a shape or the order of the checksum.
#include "records/snapshot.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "base/check.h"
#include "base/paths.h"
#include "base/timer.h"
#include "records/h5_file.h"
#include "runtime/dist.h"

#define SNAPSHOT_FORMAT "ddp-workshop training snapshot, version 1"
#define ERROR_SIZE 1024

typedef enum { SAVE, LOAD } Direction;
typedef enum { INT64, UINT32, FLOAT32, FLOAT64 } FieldType;

typedef struct {
    Direction direction;
    const char *path;       // the snapshot's name, for messages
    const char *temp;       // SAVE: the FILE.tmp being written (snapshot_temp), for messages
    hid_t file;
    hid_t link_create;      // SAVE: creates "optimizer/exp_avg" on the way to "optimizer/exp_avg/fc.0.weight"
    uint64_t checksum;      // of every field's values, in visiting order
    char err[ERROR_SIZE];   // the first problem; once set, every later field is skipped
} SnapshotIo;

// ---------------------------------------------------------------- checksum
// FNV-1a's multiply-xor, a word of 8 bytes at a time. Each step is a bijection
// of the running value, so a change confined to one word always changes the
// result: any flipped bit or torn value is caught.
static void checksum_add(uint64_t *sum, const void *data, size_t bytes) {
    const unsigned char *p = data;
    uint64_t h = *sum;
    size_t k = 0;
    for (; k + 8 <= bytes; k += 8) {
        uint64_t word;
        memcpy(&word, p + k, 8);
        h = (h ^ word) * 1099511628211ULL;
    }
    for (; k < bytes; k++) h = (h ^ p[k]) * 1099511628211ULL;
    *sum = h;
}

// ---------------------------------------------------------------- fields
static const struct {
    const char *name;
    size_t size;
} field_types[] = {[INT64] = {"int64", 8}, [UINT32] = {"uint32", 4}, [FLOAT32] = {"float32", 4}, [FLOAT64] = {"float64", 8}};

static hid_t file_type(FieldType type) {
    switch (type) {
    case INT64: return H5T_STD_I64LE;
    case UINT32: return H5T_STD_U32LE;
    case FLOAT32: return H5T_IEEE_F32LE;
    default: return H5T_IEEE_F64LE;
    }
}

static hid_t memory_type(FieldType type) {
    switch (type) {
    case INT64: return H5T_NATIVE_INT64;
    case UINT32: return H5T_NATIVE_UINT32;
    case FLOAT32: return H5T_NATIVE_FLOAT;
    default: return H5T_NATIVE_DOUBLE;
    }
}

// "float32 [128, 784]", "int64 scalar"
static void describe(char *out, size_t size, FieldType type, int rank, const hsize_t *dims) {
    int len = snprintf(out, size, "%s %s", field_types[type].name, rank == 0 ? "scalar" : "[");
    for (int d = 0; d < rank && len < (int)size; d++)
        len += snprintf(out + len, size - (size_t)len, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    if (rank > 0 && len < (int)size) snprintf(out + len, size - (size_t)len, "]");
}

// Record the first problem (one line, naming the file) and skip everything after it.
__attribute__((format(printf, 2, 3))) static void fail(SnapshotIo *io, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(io->err, ERROR_SIZE, fmt, ap);
    va_end(ap);
}

// LOAD: open `name` and check that it is a dataset of `type`; its shape goes to
// rank/dims. Returns the dataset, or a negative id with io->err set.
static hid_t open_field(SnapshotIo *io, const char *name, FieldType type, int *rank, hsize_t dims[H5S_MAX_RANK]) {
    if (H5Lexists(io->file, name, H5P_DEFAULT) <= 0) {  // (fails, too, when a group on the way is missing)
        fail(io, "%s: no '%s': an incomplete snapshot (day3/README.md lists what one holds)", io->path, name);
        return H5I_INVALID_HID;
    }
    hid_t dataset = H5Dopen2(io->file, name, H5P_DEFAULT);
    if (dataset < 0) {
        fail(io, "%s: '%s' is not a dataset", io->path, name);
        return H5I_INVALID_HID;
    }
    hid_t stored = H5Dget_type(dataset), space = H5Dget_space(dataset);
    H5T_class_t type_class = H5Tget_class(stored);
    size_t type_size = H5Tget_size(stored);
    *rank = H5Sget_simple_extent_ndims(space);
    if (*rank >= 0) H5Sget_simple_extent_dims(space, dims, NULL);
    H5Tclose(stored);
    H5Sclose(space);
    bool integer = type == INT64 || type == UINT32;
    if (*rank < 0 || type_class != (integer ? H5T_INTEGER : H5T_FLOAT) || (!integer && type_size != field_types[type].size)) {
        fail(io, "%s: '%s' is not %s data", io->path, name, field_types[type].name);
        H5Dclose(dataset);
        return H5I_INVALID_HID;
    }
    return dataset;
}

// LOAD: every float read must be a finite number. A NaN or inf in the weights, Adam's moments, the lr
// or the losses so far would resume a run that had diverged (we never write one: divergence.h), and
// train on NaN in silence; the checksum does not catch it where the file was made that way.
static void check_finite(SnapshotIo *io, const char *name, FieldType type, const void *data, size_t count) {
    if (type != FLOAT32 && type != FLOAT64) return;
    for (size_t k = 0; k < count; k++) {
        double value = type == FLOAT32 ? (double)((const float *)data)[k] : ((const double *)data)[k];
        if (!isfinite(value)) {
            fail(io, "%s: '%s' holds %s (value %zu of %zu): a snapshot must hold finite numbers; refused", io->path,
                 name, isnan(value) ? "nan" : value > 0 ? "inf" : "-inf", k + 1, count);
            return;
        }
    }
}

// One field of known shape (rank 0: a scalar): written from `data`, or read
// into it after its type and shape are checked.
static void field(SnapshotIo *io, const char *name, FieldType type, int rank, const hsize_t *dims, void *data) {
    if (io->err[0]) return;
    size_t count = 1;
    for (int d = 0; d < rank; d++) count *= (size_t)dims[d];
    if (io->direction == SAVE) {
        hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, NULL);
        hid_t dataset = H5Dcreate2(io->file, name, file_type(type), space, io->link_create, H5P_DEFAULT, H5P_DEFAULT);
        bool ok = space >= 0 && dataset >= 0 && H5Dwrite(dataset, memory_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
        if (dataset >= 0) H5Dclose(dataset);
        if (space >= 0) H5Sclose(space);
        if (!ok) fail(io, "%s: cannot write '%s' into %s (disk full?)", io->path, name, io->temp);
    } else {
        int stored_rank = 0;
        hsize_t stored_dims[H5S_MAX_RANK] = {0};
        hid_t dataset = open_field(io, name, type, &stored_rank, stored_dims);
        if (dataset < 0) return;
        bool same = stored_rank == rank;
        for (int d = 0; same && d < rank; d++) same = stored_dims[d] == dims[d];
        if (!same) {
            char found[96], expected[96];
            describe(found, sizeof found, type, stored_rank, stored_dims);
            describe(expected, sizeof expected, type, rank, dims);
            fail(io, "%s: '%s' is %s (expected %s)", io->path, name, found, expected);
        } else if (H5Dread(dataset, memory_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
            fail(io, "%s: cannot read '%s' (a corrupt file?)", io->path, name);
        } else {
            check_finite(io, name, type, data, count);
        }
        H5Dclose(dataset);
        if (io->err[0]) return;
    }
    checksum_add(&io->checksum, data, count * field_types[type].size);
}

// A 1-D field whose length the file says: SAVE writes *n values from *data;
// LOAD sets *n and allocates *data (the caller frees it).
static void field_list(SnapshotIo *io, const char *name, FieldType type, long *n, void **data) {
    if (io->err[0]) return;
    if (io->direction == LOAD) {
        int rank = 0;
        hsize_t dims[H5S_MAX_RANK] = {0};
        hid_t dataset = open_field(io, name, type, &rank, dims);
        if (dataset < 0) return;
        H5Dclose(dataset);
        if (rank != 1 || dims[0] > (hsize_t)INT_MAX) {
            char found[96];
            describe(found, sizeof found, type, rank, dims);
            fail(io, "%s: '%s' is %s (expected a list: %s [n])", io->path, name, found, field_types[type].name);
            return;
        }
        *n = (long)dims[0];
        *data = xmalloc((size_t)*n * field_types[type].size);
    }
    hsize_t length = (hsize_t)*n;
    field(io, name, type, 1, &length, *data);
}

static void int_field(SnapshotIo *io, const char *name, int *value) {
    int64_t stored = *value;
    field(io, name, INT64, 0, NULL, &stored);
    if (io->direction == LOAD && !io->err[0]) {
        if (stored < INT_MIN || stored > INT_MAX) fail(io, "%s: '%s' = %lld is out of range", io->path, name, (long long)stored);
        *value = (int)stored;
    }
}

static void long_field(SnapshotIo *io, const char *name, long *value) {
    int64_t stored = *value;
    field(io, name, INT64, 0, NULL, &stored);
    if (io->direction == LOAD) *value = (long)stored;
}

// A tensor, shaped as h5.h stores it (a bias [1, out] as [out]), through a
// host copy where it lives on a GPU.
static void tensor_field(SnapshotIo *io, const char *name, Tensor *t) {
    hsize_t dims[2] = {(hsize_t)t->rows, (hsize_t)t->cols};
    int rank = 2;
    if (t->rows == 1) dims[0] = (hsize_t)t->cols, rank = 1;
    float *host = tensor_on_gpu(t) ? xmalloc(tensor_numel(t) * sizeof(float)) : t->data;
    if (host != t->data && io->direction == SAVE) tensor_to_host(t, host);
    field(io, name, FLOAT32, rank, dims, host);
    if (host != t->data) {
        if (io->direction == LOAD && !io->err[0]) tensor_from_host(t, host);
        free(host);
    }
}

// LOAD: the snapshot's settings against this run's.
static void check_settings(SnapshotIo *io, const SnapshotSettings *run, const SnapshotSettings *saved) {
    if (io->err[0]) return;
    bool same_model = saved->n_sizes == run->n_sizes;
    for (int i = 0; same_model && i < run->n_sizes; i++) same_model = saved->sizes[i] == run->sizes[i];
    if (!same_model) {
        char theirs[128], ours[128];
        mlp_describe_sizes(saved->sizes, saved->n_sizes, theirs, sizeof theirs);
        mlp_describe_sizes(run->sizes, run->n_sizes, ours, sizeof ours);
        fail(io, "%s: a snapshot of an MLP %s; this run builds an MLP %s", io->path, theirs, ours);
        return;
    }
    if (saved->train_samples != run->train_samples) {
        fail(io, "%s: made on a training set of %d samples; this one has %d", io->path, saved->train_samples,
             run->train_samples);
        return;
    }
    char flag[64] = "", theirs[64], ours[64];
    if (saved->batch_size != run->batch_size) {
        snprintf(flag, sizeof flag, "--batch_size");
        snprintf(theirs, sizeof theirs, "%d", saved->batch_size), snprintf(ours, sizeof ours, "%d", run->batch_size);
    } else if (saved->accum_steps != run->accum_steps) {
        snprintf(flag, sizeof flag, "--accum_steps");
        snprintf(theirs, sizeof theirs, "%d", saved->accum_steps), snprintf(ours, sizeof ours, "%d", run->accum_steps);
    } else if (saved->lr != run->lr) {
        snprintf(flag, sizeof flag, "--lr");
        snprintf(theirs, sizeof theirs, "%.17g", saved->lr), snprintf(ours, sizeof ours, "%.17g", run->lr);
    } else if (saved->seed != run->seed) {
        snprintf(flag, sizeof flag, "--seed");
        snprintf(theirs, sizeof theirs, "%d", saved->seed), snprintf(ours, sizeof ours, "%d", run->seed);
    } else if (saved->shuffle != run->shuffle) {
        snprintf(flag, sizeof flag, "shuffle");
        snprintf(theirs, sizeof theirs, "%s", saved->shuffle ? "on" : "off (--no-shuffle)");
        snprintf(ours, sizeof ours, "%s", run->shuffle ? "on" : "off (--no-shuffle)");
    }
    if (flag[0])
        fail(io, "%s: made with %s %s, this run has %s %s; a resume continues the same run: give it the same flags, "
                 "or another --snapshot", io->path, flag, theirs, flag, ours);
}

// The layout, in one place (snapshot.h lists it).
static void visit_snapshot(SnapshotIo *io, const SnapshotSettings *run, SnapshotSettings *settings,
                           SnapshotProgress *progress, Adam *adam, LossLog *losses, Rng *generator) {
    // The settings first: a snapshot of another model is refused as such, before its shapes are.
    long n_sizes = settings->n_sizes;
    int64_t sizes[SNAPSHOT_MAX_SIZES];
    int64_t *sizes_list = sizes;
    for (int i = 0; i < settings->n_sizes; i++) sizes[i] = settings->sizes[i];
    field_list(io, "settings/model_sizes", INT64, &n_sizes, (void **)&sizes_list);
    if (io->direction == LOAD && !io->err[0]) {
        if (n_sizes < 2 || n_sizes > SNAPSHOT_MAX_SIZES) fail(io, "%s: 'settings/model_sizes' holds %ld sizes", io->path, n_sizes);
        for (int i = 0; i < n_sizes && !io->err[0]; i++) {
            if (sizes_list[i] < 1 || sizes_list[i] > INT_MAX) fail(io, "%s: 'settings/model_sizes' holds %lld", io->path, (long long)sizes_list[i]);
            else settings->sizes[i] = (int)sizes_list[i];
        }
        settings->n_sizes = (int)n_sizes;
    }
    if (sizes_list != sizes) free(sizes_list);
    int_field(io, "settings/world_size", &settings->world_size);
    int_field(io, "settings/batch_size", &settings->batch_size);
    int_field(io, "settings/accum_steps", &settings->accum_steps);
    field(io, "settings/lr", FLOAT64, 0, NULL, &settings->lr);
    int_field(io, "settings/seed", &settings->seed);
    int_field(io, "settings/shuffle", &settings->shuffle);
    int_field(io, "settings/train_samples", &settings->train_samples);
    if (io->direction == LOAD) check_settings(io, run, settings);

    // The model, in the state_dict layout, and Adam's state.
    char name[128];
    for (int i = 0; i < adam->n_params; i++) tensor_field(io, adam->params[i].name, adam->params[i].value);
    for (int i = 0; i < adam->n_params; i++) {
        snprintf(name, sizeof name, "optimizer/exp_avg/%s", adam->params[i].name);
        tensor_field(io, name, &adam->exp_avg[i]);
    }
    for (int i = 0; i < adam->n_params; i++) {
        snprintf(name, sizeof name, "optimizer/exp_avg_sq/%s", adam->params[i].name);
        tensor_field(io, name, &adam->exp_avg_sq[i]);
    }
    long_field(io, "optimizer/step", &adam->step);

    // Where the run stands: the epoch, the sampler's position in it, the generator.
    int_field(io, "progress/epochs_done", &progress->epochs_done);
    long_field(io, "progress/samples_done", &progress->samples_done);
    hsize_t words = 624;
    field(io, "generator/mt19937", UINT32, 1, &words, generator->state);
    int_field(io, "generator/index", &generator->next);

    // The loss of every step so far.
    long n = losses->n;
    int64_t *epochs = NULL;
    float *values = losses->loss;
    if (io->direction == SAVE) {
        epochs = xmalloc((size_t)n * sizeof *epochs + 1);
        for (long i = 0; i < n; i++) epochs[i] = losses->epoch[i];
    }
    field_list(io, "losses/epoch", INT64, &n, (void **)&epochs);
    long n_values = n;
    if (io->direction == LOAD) values = NULL;
    field_list(io, "losses/loss", FLOAT32, &n_values, (void **)&values);
    if (io->direction == LOAD && !io->err[0]) {
        if (n_values != n) fail(io, "%s: 'losses/epoch' holds %ld steps, 'losses/loss' %ld", io->path, n, n_values);
        loss_log_free(losses);
        for (long i = 0; i < n && !io->err[0]; i++) loss_log_add(losses, (int)epochs[i], values[i]);
    }
    free(epochs);
    if (io->direction == LOAD) free(values);
}

// LOAD: does what was read hang together? (The checksum guards against damage;
// this guards against a file that was made wrong.)
static void check_consistency(SnapshotIo *io, const SnapshotSettings *saved, const SnapshotProgress *progress,
                              const Adam *adam, const LossLog *losses) {
    if (io->err[0]) return;
    if (progress->epochs_done < 0 || progress->samples_done < 0 || progress->samples_done >= saved->train_samples)
        fail(io, "%s: inconsistent: %d epochs done and %ld samples of the next", io->path, progress->epochs_done,
             progress->samples_done);
    else if (losses->n != adam->step)
        fail(io, "%s: inconsistent: %d losses logged for %ld optimizer steps", io->path, losses->n, adam->step);
    for (int i = 0; i < losses->n && !io->err[0]; i++) {
        int last_epoch = progress->epochs_done - (progress->samples_done == 0);
        if (losses->epoch[i] < (i ? losses->epoch[i - 1] : 0) || losses->epoch[i] > last_epoch)
            fail(io, "%s: inconsistent: step %d is logged in epoch %d", io->path, i, losses->epoch[i]);
    }
}

// ---------------------------------------------------------------- save
static void quiet_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

// FILE.tmp, which a save writes and a load clears after a run that died while
// saving: beside the file that the snapshot's name points to (through a
// symbolic link, the link's file, replace_target), which it returns.
static const char *snapshot_temp(const char *path, char resolved[PATH_MAX], char *temp, size_t size) {
    const char *file = replace_target(path, resolved, PATH_MAX);
    snprintf(temp, size, "%s.tmp", file);
    return file;
}

// Rank 0: write FILE.tmp, sync it, rename it over FILE, sync the folder.
static void write_snapshot(SnapshotIo *io, const SnapshotSettings *run, const SnapshotProgress *progress,
                           const Adam *adam, const LossLog *losses, const Rng *generator) {
    // Through a symbolic link, the file it points to is replaced, and the link stays.
    char resolved[PATH_MAX], temp[PATH_MAX + 8], folder[PATH_MAX];
    const char *file = snapshot_temp(io->path, resolved, temp, sizeof temp);
    io->temp = temp;
    snprintf(folder, sizeof folder, "%s", file);
    char *slash = strrchr(folder, '/');
    if (!slash) snprintf(folder, sizeof folder, ".");
    else if (slash == folder) folder[1] = '\0';  // "/snapshot.h5": the root
    else *slash = '\0';
    make_parent_dirs(file);

    io->file = h5_create_checksummed(temp);  // HDF5 checks the headers; the data is covered by ours
    if (io->file < 0) {
        fail(io, "%s: cannot create %s (is the folder writable?)", io->path, temp);
        return;
    }
    io->link_create = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(io->link_create, 1);
    // visit_snapshot reads through these pointers only when loading.
    SnapshotSettings settings = *run;
    SnapshotProgress where = *progress;
    Rng state = *generator;
    visit_snapshot(io, run, &settings, &where, (Adam *)adam, (LossLog *)losses, &state);
    H5Pclose(io->link_create);

    if (!io->err[0]) {  // the root's attributes: what this file is, and the checksum of its contents
        hid_t scalar = H5Screate(H5S_SCALAR), text = H5Tcopy(H5T_C_S1);
        H5Tset_size(text, sizeof SNAPSHOT_FORMAT);
        hid_t format = H5Acreate2(io->file, "format", text, scalar, H5P_DEFAULT, H5P_DEFAULT);
        hid_t checksum = H5Acreate2(io->file, "checksum", H5T_STD_U64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
        bool ok = format >= 0 && checksum >= 0 && H5Awrite(format, text, SNAPSHOT_FORMAT) >= 0 &&
                  H5Awrite(checksum, H5T_NATIVE_UINT64, &io->checksum) >= 0;
        if (format >= 0) H5Aclose(format);
        if (checksum >= 0) H5Aclose(checksum);
        H5Tclose(text);
        H5Sclose(scalar);
        if (!ok) fail(io, "%s: cannot write the attributes into %s", io->path, temp);
    }
    if (!io->err[0] && progress->mlflow_run_id[0]) {  // the MLflow run a resume logs into (not training state)
        hid_t scalar = H5Screate(H5S_SCALAR), text = H5Tcopy(H5T_C_S1);
        H5Tset_size(text, sizeof progress->mlflow_run_id);
        hid_t id = H5Acreate2(io->file, "mlflow_run_id", text, scalar, H5P_DEFAULT, H5P_DEFAULT);
        bool ok = id >= 0 && H5Awrite(id, text, progress->mlflow_run_id) >= 0;
        if (id >= 0) H5Aclose(id);
        H5Tclose(text);
        H5Sclose(scalar);
        if (!ok) fail(io, "%s: cannot write the attributes into %s", io->path, temp);
    }
    if (H5Fclose(io->file) < 0 && !io->err[0]) fail(io, "%s: cannot finish writing %s (disk full?)", io->path, temp);
    if (!io->err[0] && !sync_path(temp, false))
        fail(io, "%s: cannot flush %s to disk: %s", io->path, temp, strerror(errno));
    // The switch: rename replaces FILE in one step; before it FILE is the old snapshot, after it the new one.
    if (!io->err[0] && !replace_rename(temp, file))  // keeps the old file's permission bits
        fail(io, "%s: cannot rename %s over it: %s", io->path, temp, strerror(errno));
    if (!io->err[0] && !sync_path(folder, true))  // the rename itself reaches the disk
        fail(io, "%s: cannot flush the folder %s: %s", io->path, folder, strerror(errno));
    if (io->err[0]) unlink(temp);  // the old snapshot, if any, is untouched
}

SnapshotWrite snapshot_save(const char *path, const SnapshotSettings *run, const SnapshotProgress *progress,
                            const Adam *optimizer, const LossLog *losses, const Rng *generator) {
    SnapshotWrite written = {0};
    SnapshotIo io = {.direction = SAVE, .path = path, .checksum = 14695981039346656037ULL};
    if (dist_rank() == 0) {
        quiet_hdf5();
        double start = wall_seconds();
        write_snapshot(&io, run, progress, optimizer, losses, generator);
        written.seconds = wall_seconds() - start;
        struct stat info;
        if (!io.err[0] && stat(path, &info) == 0) written.megabytes = (double)info.st_size / 1e6;
    }
    check_all_ranks(io.err[0] == '\0', io.err);  // every rank learns the outcome
    return written;
}

// ---------------------------------------------------------------- load
static void read_file(SnapshotIo *io, const SnapshotSettings *run, SnapshotSettings *saved,
                      SnapshotProgress *progress, Adam *adam, LossLog *losses, Rng *generator) {
    struct stat info;
    if (stat(io->path, &info) != 0 || access(io->path, R_OK) != 0) {
        fail(io, "%s: cannot read: %s", io->path, strerror(errno));
        return;
    }
    const char *problem = input_file_problem(io->path);
    if (problem) {
        fail(io, "%s: %s, not a snapshot", io->path, problem);
        return;
    }
    if (info.st_size == 0) {
        fail(io, "%s: the file is empty, not a snapshot", io->path);
        return;
    }
#if H5_VERSION_GE(1, 12, 0)
    bool hdf5 = H5Fis_accessible(io->path, H5P_DEFAULT) > 0;
#else
    bool hdf5 = H5Fis_hdf5(io->path) > 0;
#endif
    if (!hdf5 || (io->file = H5Fopen(io->path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
        fail(io, "%s: not a readable HDF5 file (%lld bytes): truncated or corrupt", io->path, (long long)info.st_size);
        return;
    }

    // What the file says it is, and the checksum of its contents.
    char format[sizeof SNAPSHOT_FORMAT + 64] = "";
    uint64_t stored_checksum = 0;
    if (H5Aexists(io->file, "format") <= 0 || H5Aexists(io->file, "checksum") <= 0) {
        fail(io, "%s: not a training snapshot (no 'format' and 'checksum' attributes): a weights file? --init takes "
                 "those", io->path);
    } else {
        hid_t attribute = H5Aopen(io->file, "format", H5P_DEFAULT), type = H5Aget_type(attribute);
        hid_t text = H5Tcopy(H5T_C_S1);
        H5Tset_size(text, sizeof format);
        bool ok = H5Tget_class(type) == H5T_STRING && H5Tget_size(type) < sizeof format &&
                  H5Aread(attribute, text, format) >= 0;
        H5Tclose(text), H5Tclose(type), H5Aclose(attribute);
        attribute = H5Aopen(io->file, "checksum", H5P_DEFAULT);
        ok = ok && H5Aread(attribute, H5T_NATIVE_UINT64, &stored_checksum) >= 0;
        H5Aclose(attribute);
        if (!ok || strcmp(format, SNAPSHOT_FORMAT) != 0)
            fail(io, "%s: format '%s', expected '%s'", io->path, ok ? format : "?", SNAPSHOT_FORMAT);
    }

    *saved = *run;
    visit_snapshot(io, run, saved, progress, adam, losses, generator);
    progress->mlflow_run_id[0] = '\0';
    if (!io->err[0] && H5Aexists(io->file, "mlflow_run_id") > 0) {  // a snapshot of a run tracked in MLflow
        hid_t attribute = H5Aopen(io->file, "mlflow_run_id", H5P_DEFAULT), type = H5Aget_type(attribute);
        hid_t text = H5Tcopy(H5T_C_S1);
        H5Tset_size(text, sizeof progress->mlflow_run_id);
        bool ok = H5Tget_class(type) == H5T_STRING && H5Tget_size(type) <= sizeof progress->mlflow_run_id &&
                  H5Aread(attribute, text, progress->mlflow_run_id) >= 0;
        H5Tclose(text), H5Tclose(type), H5Aclose(attribute);
        progress->mlflow_run_id[sizeof progress->mlflow_run_id - 1] = '\0';
        if (!ok) fail(io, "%s: its mlflow_run_id attribute is not a run id", io->path);
    }
    H5Fclose(io->file);
    H5garbage_collect();
    if (!io->err[0] && io->checksum != stored_checksum)
        fail(io, "%s: checksum mismatch (the file says %016llx, its contents hash to %016llx): the file is corrupt",
             io->path, (unsigned long long)stored_checksum, (unsigned long long)io->checksum);
    check_consistency(io, saved, progress, adam, losses);
}

bool snapshot_load(const char *path, const SnapshotSettings *run, SnapshotSettings *saved,
                   SnapshotProgress *progress, Adam *optimizer, LossLog *losses, Rng *generator) {
    quiet_hdf5();
    char resolved[PATH_MAX], temp[PATH_MAX + 8];
    snapshot_temp(path, resolved, temp, sizeof temp);
    struct stat info;
    if (dist_rank() == 0 && stat(temp, &info) == 0 && S_ISREG(info.st_mode)) {
        print0("%s: removing an unfinished snapshot (a run died while writing it; %s is untouched)\n", temp, path);
        unlink(temp);
    }

    // Every rank resumes, or none: they must all see the file.
    int here = access(path, F_OK) == 0, seen_by = here, world = dist_world_size();
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &seen_by, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (seen_by == 0) return false;
    char err[ERROR_SIZE] = "";
    if (!here)
        snprintf(err, sizeof err, "%s: %d of %d ranks see this snapshot, this rank does not: every rank must see "
                 "the same folder (a shared file system)", path, seen_by, world);
    check_all_ranks(here, err);

    SnapshotIo io = {.direction = LOAD, .path = path, .checksum = 14695981039346656037ULL};
    read_file(&io, run, saved, progress, optimizer, losses, generator);
    check_all_ranks(io.err[0] == '\0', io.err);

    // ... and read the same contents (each rank checked its own against the checksum).
    unsigned long long lowest = io.checksum, highest = io.checksum;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD));
    snprintf(err, sizeof err, "%s: the ranks read different snapshots (checksums %016llx to %016llx): every rank "
             "must see the same file", path, lowest, highest);
    check_all_ranks(lowest == highest, err);
    return true;
}
