// h5.c: HDF5 checkpoints. See h5.h.
#include "records/h5.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>

#include "base/check.h"
#include "base/paths.h"
#include "base/quote.h"

// HDF5 prints its whole error stack on every failed call by default; we check
// each call and print one line of our own instead.
static void quiet_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

#define CHECK_H5(call, ...) CHECK((call) >= 0, __VA_ARGS__)

// A bias [1, out] is stored 1-D [out], as torch has it; a parameter with its
// own state_dict shape (Param.dims: a Conv2d weight) is stored with that one.
static int stored_shape(const Param *p, hsize_t dims[4]) {
    const Tensor *t = p->value;
    if (p->dims[0] > 0) {
        int rank = 0;
        for (; rank < 4 && p->dims[rank] > 0; rank++) dims[rank] = (hsize_t)p->dims[rank];
        return rank;
    }
    if (t->rows == 1) {
        dims[0] = (hsize_t)t->cols;
        return 1;
    }
    dims[0] = (hsize_t)t->rows;
    dims[1] = (hsize_t)t->cols;
    return 2;
}

// "float32 [128, 784]"
static void format_shape(char *out, size_t size, const hsize_t *dims, int rank) {
    int len = snprintf(out, size, "float32 [");
    for (int d = 0; d < rank && len < (int)size; d++)
        len += snprintf(out + len, size - len, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    if (len < (int)size) snprintf(out + len, size - len, "]");
}

// The file is built in memory (HDF5's core driver) and then written by stdio,
// next to `path` and renamed over it (paths.h): a failed write leaves the old
// weights as they were, and names its cause (errno), which HDF5's own writes
// would not. (HDF5 writing to disk also crashes at exit after a close that
// failed.) The weights are a few MB at most.
void h5_save_params(const char *path, const Param *params, int n_params) {
    quiet_hdf5();
    const char *shown = PATH_SHOWN(path);  // the name as a message shows it: one safe line
    hid_t access = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(access, 1 << 20, 0);  // grow by 1 MB; no backing file: `path` is only its name
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, access);
    H5Pclose(access);
    CHECK(file >= 0, "%s: cannot create the HDF5 file in memory", shown);
    for (int i = 0; i < n_params; i++) {
        hsize_t dims[4];
        int rank = stored_shape(&params[i], dims);
        hid_t space = H5Screate_simple(rank, dims, NULL);
        hid_t dataset = H5Dcreate2(file, params[i].name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT);
        CHECK(space >= 0 && dataset >= 0, "%s: cannot create dataset '%s'", shown, params[i].name);
        float *values = xmalloc(tensor_numel(params[i].value) * sizeof(float));  // a host copy, wherever it lives
        tensor_to_host(params[i].value, values);
        CHECK_H5(H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values),
                 "%s: cannot write dataset '%s'", shown, params[i].name);
        free(values);
        H5Dclose(dataset);
        H5Sclose(space);
    }
    CHECK_H5(H5Fflush(file, H5F_SCOPE_LOCAL), "%s: cannot finish the HDF5 file in memory", shown);
    ssize_t size = H5Fget_file_image(file, NULL, 0);
    CHECK(size > 0, "%s: cannot take the HDF5 file's image", shown);
    char *image = xmalloc((size_t)size);
    CHECK(H5Fget_file_image(file, image, (size_t)size) == size, "%s: cannot take the HDF5 file's image", shown);
    CHECK_H5(H5Fclose(file), "%s: cannot close the HDF5 file in memory", shown);

    char temp[PATH_MAX];
    FILE *out = replace_begin(path, temp, sizeof temp);
    CHECK_ERRNO(out != NULL, "%s: cannot create %s", shown, PATH_SHOWN(temp));
    if (fwrite(image, 1, (size_t)size, out) != (size_t)size) {
        replace_abort(out, temp);  // keeps fwrite's errno
        CHECK_ERRNO(false, "%s: cannot write %s", shown, PATH_SHOWN(temp));
    }
    CHECK_ERRNO(replace_commit(out, temp), "%s: cannot write %s", shown, PATH_SHOWN(temp));
    free(image);
}

// Reading checks everything about the file and, on the first problem, reports
// it through check_all_ranks(): every rank reads the same file, so one line
// says what is wrong and all ranks stop together.
#define REJECT(...)                             \
    do {                                        \
        snprintf(err, sizeof err, __VA_ARGS__); \
        goto done;                              \
    } while (0)

// A virtual dataset reads its values from source datasets, maybe in other
// files; where a source is missing, HDF5 gives the fill value (0) in silence.
// So every source must be there: the file (as named, relative to the working
// directory or to the virtual dataset's own folder, the places HDF5 looks
// besides HDF5_VDS_PREFIX) and the dataset in it. False, with the first one
// missing in `missing`.
static bool virtual_sources_present(const char *path, hid_t file, hid_t dataset, char *missing, size_t size) {
    hid_t create = H5Dget_create_plist(dataset);
    size_t count = 0;
    bool ok = create >= 0 && H5Pget_virtual_count(create, &count) >= 0;
    if (!ok) snprintf(missing, size, "its list of source datasets cannot be read");
    for (size_t i = 0; ok && i < count; i++) {
        char source_file[PATH_MAX] = "", source[1024] = "", beside[PATH_MAX + 1] = "", folder[PATH_MAX];
        ok = H5Pget_virtual_filename(create, i, source_file, sizeof source_file) > 0 &&
             H5Pget_virtual_dsetname(create, i, source, sizeof source) > 0;
        if (!ok) {
            snprintf(missing, size, "the name of its source %zu cannot be read", i);
            break;
        }
        snprintf(folder, sizeof folder, "%s", path);
        snprintf(beside, sizeof beside, "%s/%s", dirname(folder), source_file);
        hid_t other = H5I_INVALID_HID, holder = file;  // "." is the virtual dataset's own file
        if (strcmp(source_file, ".") != 0) {
            const char *tries[2] = {source_file, source_file[0] == '/' ? NULL : beside};
            for (int t = 0; t < 2 && other < 0; t++)
                if (tries[t] && access(tries[t], R_OK) == 0 && !input_file_problem(tries[t]))
                    other = H5Fopen(tries[t], H5F_ACC_RDONLY, H5P_DEFAULT);
            holder = other;
        }
        ok = holder >= 0 && H5Lexists(holder, source, H5P_DEFAULT) > 0;
        hid_t source_dataset = ok ? H5Dopen2(holder, source, H5P_DEFAULT) : H5I_INVALID_HID;
        ok = source_dataset >= 0;
        if (ok) H5Dclose(source_dataset);
        if (!ok)
            snprintf(missing, size, "its source dataset %s in %s is missing",
                     QUOTE(source), strcmp(source_file, ".") == 0 ? "the same file" : QUOTE(source_file));
        if (other >= 0) H5Fclose(other);
    }
    if (create >= 0) H5Pclose(create);
    return ok;
}

// HDF5 converts a stored float64 to float32 by rounding, and one beyond
// float32's range to inf, in silence: a file of 1e300 would start training
// from inf. This callback of the conversion stops the read instead.
static H5T_conv_ret_t refuse_overflow(H5T_conv_except_t what, hid_t source_type, hid_t memory_type, void *source,
                                      void *memory, void *overflowed) {
    (void)source_type, (void)memory_type, (void)source, (void)memory;
    if (what != H5T_CONV_EXCEPT_RANGE_HI && what != H5T_CONV_EXCEPT_RANGE_LOW) return H5T_CONV_UNHANDLED;
    *(bool *)overflowed = true;
    return H5T_CONV_ABORT;
}

// "[3, 17]": the index of element k of a dataset of `rank` dimensions `dims`.
static void format_index(char *out, size_t size, size_t k, const hsize_t *dims, int rank) {
    hsize_t index[H5S_MAX_RANK];
    for (int d = rank - 1; d >= 0; d--) {
        index[d] = dims[d] ? k % dims[d] : 0;
        k = dims[d] ? k / dims[d] : 0;
    }
    int len = snprintf(out, size, "[");
    for (int d = 0; d < rank && len < (int)size; d++)
        len += snprintf(out + len, size - len, "%s%llu", d ? ", " : "", (unsigned long long)index[d]);
    if (len < (int)size) snprintf(out + len, size - len, "]");
}

void h5_load_params(const char *path, Param *params, int n_params) {
    quiet_hdf5();
    const char *shown = PATH_SHOWN(path);  // the name as a message shows it: one safe line
    char err[1024] = "";
    hid_t file = H5I_INVALID_HID, dataset = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    if (access(path, R_OK) != 0) REJECT("%s: cannot open: %s", shown, strerror(errno));
    const char *problem = input_file_problem(path);
    if (problem) REJECT("%s: %s, not an HDF5 file", shown, problem);
#if H5_VERSION_GE(1, 12, 0)
    if (H5Fis_accessible(path, H5P_DEFAULT) <= 0) REJECT("%s: not an HDF5 file", shown);
#else
    if (H5Fis_hdf5(path) <= 0) REJECT("%s: not an HDF5 file", shown);
#endif
    if ((file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) REJECT("%s: cannot open the HDF5 file", shown);
    for (int i = 0; i < n_params; i++) {
        const Param *p = &params[i];
        hsize_t want[4];
        int want_rank = stored_shape(p, want);
        char expected[96];
        format_shape(expected, sizeof expected, want, want_rank);
        htri_t exists = H5Lexists(file, p->name, H5P_DEFAULT);  // the names are flat: < 0 is a read error
        if (exists < 0) REJECT("%s: cannot read its index of datasets: a damaged HDF5 file", shown);
        if (exists == 0)
            REJECT("%s: no dataset '%s' (expected %s, as in the model's state_dict)", shown, p->name,
                   expected);
        if ((dataset = H5Dopen2(file, p->name, H5P_DEFAULT)) < 0)
            REJECT("%s: '%s' is not a dataset (expected %s)", shown, p->name, expected);
        type = H5Dget_type(dataset);
        if (H5Tget_class(type) != H5T_FLOAT)
            REJECT("%s: dataset '%s' is not floating point (expected %s)", shown, p->name, expected);
        space = H5Dget_space(dataset);
        int rank = H5Sget_simple_extent_ndims(space);
        hsize_t dims[H5S_MAX_RANK] = {0};
        H5Sget_simple_extent_dims(space, dims, NULL);
        bool same = rank == want_rank;
        for (int d = 0; same && d < rank; d++) same = dims[d] == want[d];
        bool bias_as_row = want_rank == 1 && rank == 2 && dims[0] == 1 && dims[1] == want[0];
        if (!same && !bias_as_row) {
            char found[96];
            format_shape(found, sizeof found, dims, rank);
            REJECT("%s: dataset '%s' is %s (expected %s)", shown, p->name, found, expected);
        }
        // Values that were never written are HDF5's fill value (0, or whatever the file set), not
        // weights: a dataset must be written whole. A virtual one must find all its sources.
        hid_t create = H5Dget_create_plist(dataset);
        bool is_virtual = create >= 0 && H5Pget_layout(create) == H5D_VIRTUAL;
        if (create >= 0) H5Pclose(create);
        char missing[QUOTE_SIZE * 2 + 64];
        if (is_virtual && !virtual_sources_present(path, file, dataset, missing, sizeof missing))
            REJECT("%s: dataset '%s' is virtual and %s (HDF5 would read zeros in its place)", shown, p->name, missing);
        H5D_space_status_t written = H5D_SPACE_STATUS_ALLOCATED;
        if (!is_virtual && H5Dget_space_status(dataset, &written) < 0)
            REJECT("%s: cannot read the storage of dataset '%s': a damaged HDF5 file", shown, p->name);
        if (written != H5D_SPACE_STATUS_ALLOCATED)
            REJECT("%s: dataset '%s' was %s: it holds HDF5's fill value, not weights", shown, p->name,
                   written == H5D_SPACE_STATUS_PART_ALLOCATED ? "written only in part" : "never written");
        // Reading as native float converts other float types on the way in; one beyond float32's
        // range stops the read (refuse_overflow) rather than becoming inf.
        size_t n = tensor_numel(p->value);
        float *values = xmalloc(n * sizeof(float));
        bool overflowed = false;
        hid_t transfer = H5Pcreate(H5P_DATASET_XFER);
        bool read = transfer >= 0 && H5Pset_type_conv_cb(transfer, refuse_overflow, &overflowed) >= 0 &&
                    H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, transfer, values) >= 0;
        if (transfer >= 0) H5Pclose(transfer);
        // Every value finite: NaN and inf would train to NaN (PyTorch trains on in silence; we do not).
        size_t bad = 0, first_bad = 0;
        for (size_t k = 0; read && k < n; k++)
            if (!isfinite(values[k]) && bad++ == 0) first_bad = k;
        float first_value = bad ? values[first_bad] : 0.0f;
        if (read && !bad) tensor_from_host(p->value, values);
        free(values);
        size_t type_size = H5Tget_size(type);
        if (overflowed)
            REJECT("%s: dataset '%s' (float%zu) holds a value beyond float32's range (+-3.4e38): the model's "
                   "weights are float32", shown, p->name, 8 * type_size);
        if (!read) REJECT("%s: cannot read dataset '%s'", shown, p->name);
        if (bad) {
            char where[96];
            format_index(where, sizeof where, first_bad, dims, rank);
            REJECT("%s: dataset '%s' holds %s at %s (%zu of its %zu values are not finite): weights must be "
                   "finite numbers", shown, p->name, isnan(first_value) ? "NaN" : first_value > 0 ? "+inf" : "-inf",
                   where, bad, n);
        }
        H5Sclose(space), H5Tclose(type), H5Dclose(dataset);
        space = type = dataset = H5I_INVALID_HID;
    }
done:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (dataset >= 0) H5Dclose(dataset);
    if (file >= 0) H5Fclose(file);
    check_all_ranks(err[0] == '\0', err);
}

typedef struct {
    const Param *params;
    int n_params;
    const char *const *also_allowed;
    char extra[256];  // the first name that is neither
} ExtraSearch;

static herr_t find_extra(hid_t group, const char *name, const H5L_info_t *info, void *data) {
    (void)group, (void)info;
    ExtraSearch *search = data;
    for (int i = 0; i < search->n_params; i++)
        if (!strcmp(search->params[i].name, name)) return 0;
    for (int i = 0; search->also_allowed && search->also_allowed[i]; i++)
        if (!strcmp(search->also_allowed[i], name)) return 0;
    snprintf(search->extra, sizeof search->extra, "%s", name);
    return 1;  // stop: one is enough to name
}

void h5_load_params_exactly(const char *path, Param *params, int n_params, const char *const *also_allowed) {
    h5_load_params(path, params, n_params);  // every parameter there, and well formed (or every rank has left)
    quiet_hdf5();
    ExtraSearch search = {.params = params, .n_params = n_params, .also_allowed = also_allowed};
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    herr_t walked = file >= 0 ? H5Literate(file, H5_INDEX_NAME, H5_ITER_INC, NULL, find_extra, &search) : -1;
    if (file >= 0) H5Fclose(file);
    char err[1024] = "";
    if (walked < 0)
        snprintf(err, sizeof err, "%s: cannot read its index of datasets: a damaged HDF5 file", PATH_SHOWN(path));
    else if (search.extra[0])
        snprintf(err, sizeof err, "%s: holds %s, which this model does not have: the weights of another model "
                 "(another configuration, or more layers)", PATH_SHOWN(path), QUOTE(search.extra));
    check_all_ranks(err[0] == '\0', err);
}
