// edit_checkpoint_index INDEX.h5 attr NAME VALUE
// edit_checkpoint_index INDEX.h5 piece TENSOR ROW COLUMN VALUE
// Damages a sharded checkpoint's index (common/records/sharded_checkpoint.h) the way a bug or a
// hand would, for tests/test_checkpoint.sh, where h5py may be missing: replaces a string
// attribute of the root ("program"), or one number of a tensor's list of pieces (its rank, its
// number, an offset or a size). Exits 0 when it wrote the change.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>

static int usage(const char *program) {
    fprintf(stderr, "usage: %s INDEX.h5 attr NAME VALUE\n       %s INDEX.h5 piece TENSOR ROW COLUMN VALUE\n", program, program);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 5) return usage(argv[0]);
    hid_t file = H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT);
    if (file < 0) return fprintf(stderr, "%s: cannot open it for writing\n", argv[1]), 1;
    int status = 1;
    if (strcmp(argv[2], "attr") == 0 && argc == 5) {
        if (H5Aexists(file, argv[3]) > 0) H5Adelete(file, argv[3]);
        hid_t scalar = H5Screate(H5S_SCALAR), type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, strlen(argv[4]) + 1);
        hid_t attribute = H5Acreate2(file, argv[3], type, scalar, H5P_DEFAULT, H5P_DEFAULT);
        status = attribute >= 0 && H5Awrite(attribute, type, argv[4]) >= 0 ? 0 : 1;
        if (attribute >= 0) H5Aclose(attribute);
        H5Tclose(type), H5Sclose(scalar);
    } else if (strcmp(argv[2], "piece") == 0 && argc == 7) {
        char name[512];
        snprintf(name, sizeof name, "tensors/%s/pieces", argv[3]);
        hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
        if (dataset < 0) return fprintf(stderr, "%s: no dataset %s\n", argv[1], name), 1;
        hid_t space = H5Dget_space(dataset);
        hsize_t dims[2] = {0, 0};
        H5Sget_simple_extent_dims(space, dims, NULL);
        long long *rows = malloc(dims[0] * dims[1] * sizeof(long long));
        long row = atol(argv[4]), column = atol(argv[5]);
        if (rows && H5Dread(dataset, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0 && row >= 0 &&
            row < (long)dims[0] && column >= 0 && column < (long)dims[1]) {
            rows[row * (long)dims[1] + column] = atoll(argv[6]);
            status = H5Dwrite(dataset, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0 ? 0 : 1;
        }
        free(rows);
        H5Sclose(space), H5Dclose(dataset);
    } else {
        H5Fclose(file);
        return usage(argv[0]);
    }
    if (H5Fclose(file) < 0) status = 1;
    return status;
}
