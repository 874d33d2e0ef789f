// test_h5.c: checkpoints round-trip bit for bit, and the file has the layout of
// the PyTorch state_dict of the workshop's Net (what h5py + torch expect):
// fc.0.weight [128, 784], fc.0.bias [128], fc.2.weight [10, 128], fc.2.bias [10],
// all float32 little-endian. A float64 file (numpy's default dtype) loads too.
//
// The layout is read back with the HDF5 C API itself, not through h5.c, so a
// mistake in h5.c cannot hide behind the same mistake in its reader. Error
// paths call FATAL (exit) and are left to the integration tests.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>

#include "models/nn.h"
#include "records/h5.h"

#define TEST_NAME "test_h5"
#include "test.h"

static const int sizes[] = {784, 128, 10};

static Mlp model_with_seed(uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    return mlp_new(sizes, 3, 1, &rng, DEVICE_CPU);
}

// The state_dict layout: name, rank and dims as torch stores them.
static const struct {
    const char *name;
    int rank;
    hsize_t dims[2];
} layout[] = {
    {"fc.0.weight", 2, {128, 784}},
    {"fc.0.bias", 1, {128, 0}},
    {"fc.2.weight", 2, {10, 128}},
    {"fc.2.bias", 1, {10, 0}},
};
enum { N_PARAMS = 4 };

// "[128, 784]"
static const char *shape_string(char *out, size_t size, int rank, const hsize_t *dims) {
    if (rank == 1) snprintf(out, size, "[%llu]", (unsigned long long)dims[0]);
    else snprintf(out, size, "[%llu, %llu]%s", (unsigned long long)dims[0], (unsigned long long)dims[1],
                  rank == 2 ? "" : " (rank is not 1 or 2)");
    return out;
}

// One dataset against the expected layout and the model's values.
static void check_dataset(hid_t file, int i, const Param *param) {
    hid_t dataset = H5Dopen2(file, layout[i].name, H5P_DEFAULT);
    EXPECT(dataset >= 0 && strcmp(param->name, layout[i].name) == 0,
           "parameter %d, '%s', is a dataset at the file's root", i, param->name);
    if (dataset < 0) return;
    hid_t type = H5Dget_type(dataset), space = H5Dget_space(dataset);
    hsize_t dims[H5S_MAX_RANK] = {0};
    int rank = H5Sget_simple_extent_dims(space, dims, NULL);
    bool same_shape = rank == layout[i].rank && dims[0] == layout[i].dims[0] &&
                      (rank == 1 || dims[1] == layout[i].dims[1]);
    char found[64], expected[64];
    EXPECT(same_shape, "'%s' is %s (expected %s, as in torch's state_dict)", layout[i].name,
           shape_string(found, sizeof found, rank, dims),
           shape_string(expected, sizeof expected, layout[i].rank, layout[i].dims));
    EXPECT(H5Tequal(type, H5T_IEEE_F32LE) > 0, "'%s' is float32 little-endian (class %d, %zu bytes, order %d)",
           layout[i].name, (int)H5Tget_class(type), H5Tget_size(type), (int)H5Tget_order(type));

    // Row-major [out, in] as torch: read the raw values and compare with the model's.
    size_t n = tensor_numel(param->value);
    float *values = calloc(n, sizeof(float));
    bool read_ok = same_shape && H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0;
    EXPECT(read_ok && memcmp(values, param->value->data, n * sizeof(float)) == 0,
           "'%s' holds the model's %zu values in order (read %s)", layout[i].name, n, read_ok ? "ok" : "failed");
    free(values);
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(dataset);
}

// A float64 checkpoint, as h5py writes numpy's default dtype; fc.2.bias is
// stored [1, 10] to exercise the "bias as a row" form the loader accepts.
// Returns the doubles written, concatenated in parameter order.
static double *write_float64_file(const char *path, const Mlp *shapes) {
    size_t total = 0;
    for (int i = 0; i < N_PARAMS; i++) total += tensor_numel(shapes->params[i].value);
    double *values = malloc(total * sizeof(double)), *v = values;
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    for (int i = 0; i < N_PARAMS; i++) {
        size_t n = tensor_numel(shapes->params[i].value);
        // Values with more precision than a float: the load must round each one.
        for (size_t k = 0; k < n; k++) v[k] = 0.1 * sin((double)k + i) + 1e-12 * (double)k;
        hsize_t row_bias[2] = {1, 10};
        bool as_row = strcmp(layout[i].name, "fc.2.bias") == 0;
        hid_t space = H5Screate_simple(as_row ? 2 : layout[i].rank, as_row ? row_bias : layout[i].dims, NULL);
        hid_t dataset = H5Dcreate2(file, layout[i].name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT);
        H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(dataset);
        H5Sclose(space);
        v += n;
    }
    EXPECT(file >= 0 && H5Fclose(file) >= 0, "wrote a float64 checkpoint with the HDF5 API: %s", path);
    return values;
}

int main(void) {
    char dir[] = "/tmp/test_h5_XXXXXX";
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    char path[256], path64[256];
    snprintf(path, sizeof path, "%s/params.h5", dir);
    snprintf(path64, sizeof path64, "%s/params64.h5", dir);

    // ------------------------------------------------------------ round trip
    Mlp saved = model_with_seed(1), loaded = model_with_seed(2);
    unsigned long long saved_sum = params_checksum(saved.params, saved.n_params);
    EXPECT(saved.n_params == N_PARAMS &&
               saved_sum != params_checksum(loaded.params, loaded.n_params),
           "models with seeds 1 and 2 have %d parameters and differ before loading", saved.n_params);
    h5_save_params(path, saved.params, saved.n_params);
    h5_load_params(path, loaded.params, loaded.n_params);
    for (int i = 0; i < N_PARAMS; i++) {
        const Tensor *a = saved.params[i].value, *b = loaded.params[i].value;
        EXPECT(a->rows == b->rows && a->cols == b->cols &&
                   memcmp(a->data, b->data, tensor_numel(a) * sizeof(float)) == 0,
               "%s [%d, %d] is bit-identical after save + load", saved.params[i].name, a->rows, a->cols);
    }
    unsigned long long loaded_sum = params_checksum(loaded.params, loaded.n_params);
    EXPECT(loaded_sum == saved_sum, "params_checksum agrees after the round trip (%016llx vs %016llx)", saved_sum,
           loaded_sum);

    // ------------------------------------------------------------ layout, via the HDF5 API
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    EXPECT(file >= 0, "h5_save_params wrote a file the HDF5 library opens: %s", path);
    if (file >= 0) {
        H5G_info_t info;
        H5Gget_info(file, &info);
        EXPECT(info.nlinks == N_PARAMS, "the root holds %llu objects (expected %d: one per parameter)",
               (unsigned long long)info.nlinks, N_PARAMS);
        for (int i = 0; i < N_PARAMS; i++) check_dataset(file, i, &saved.params[i]);
        H5Fclose(file);
    }

    // ------------------------------------------------------------ float64 input
    double *values = write_float64_file(path64, &saved);
    h5_load_params(path64, loaded.params, loaded.n_params);
    const double *v = values;
    for (int i = 0; i < N_PARAMS; i++) {
        size_t n = tensor_numel(loaded.params[i].value), wrong = 0;
        for (size_t k = 0; k < n; k++) wrong += loaded.params[i].value->data[k] != (float)v[k];
        EXPECT(wrong == 0, "%s from float64%s: %zu of %zu values differ from (float)value", layout[i].name,
               i == 3 ? " stored [1, 10]" : "", wrong, n);
        v += n;
    }
    free(values);

    mlp_free(&saved);
    mlp_free(&loaded);
    remove(path);
    remove(path64);
    if (rmdir(dir) != 0) perror(dir);
    return test_summary();
}
