// compare_h5_weights A.h5 B.h5 TOLERANCE: are two checkpoints of any model the same weights? Every
// dataset of A (a state_dict: float32 tensors by name, as records/h5.c writes them) against B's of
// the same name and size (a state_dict's tensors are the root group's entries); prints the relative difference ||A - B|| / ||B|| over all of them and
// the largest element difference; exits 0 iff the files hold the same names and sizes and the
// relative difference is <= TOLERANCE. (compare_weights and compare_cnn_weights know their
// models' names; step 19's GPT has a config's worth of them, so this one reads what is there.)
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    hid_t other;
    int datasets, problems;
    double diff2, norm2, worst;
} Comparison;

static float *read_floats(hid_t file, const char *name, hssize_t *count) {
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    if (dataset < 0) return NULL;
    hid_t space = H5Dget_space(dataset);
    *count = H5Sget_simple_extent_npoints(space);
    float *values = malloc((size_t)(*count > 0 ? *count : 1) * sizeof(float));
    if (!values || H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0) free(values), values = NULL;
    H5Sclose(space);
    H5Dclose(dataset);
    return values;
}

static herr_t compare_one(hid_t file, const char *name, const H5L_info_t *info, void *data) {
    Comparison *c = data;
    (void)info;
    hssize_t n_a = 0, n_b = -1;
    float *a = read_floats(file, name, &n_a), *b = H5Lexists(c->other, name, H5P_DEFAULT) > 0 ? read_floats(c->other, name, &n_b) : NULL;
    if (!a || !b || n_a != n_b) {
        fprintf(stderr, "%s: %s\n", name, !b ? "not in the second file" : "different sizes");
        c->problems++;
    } else {
        for (hssize_t k = 0; k < n_a; k++) {
            double d = (double)a[k] - (double)b[k];
            c->diff2 += d * d;
            c->norm2 += (double)b[k] * b[k];
            c->worst = fabs(d) > c->worst || isnan(d) ? fabs(d) : c->worst;
        }
        c->datasets++;
    }
    free(a), free(b);
    return 0;
}

// The entries of the root group (a state_dict's tensors are all there).
static int count_entries(hid_t file) {
    H5G_info_t group;
    return H5Gget_info(file, &group) >= 0 ? (int)group.nlinks : -1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s A.h5 B.h5 TOLERANCE\n", argv[0]);
        return 2;
    }
    hid_t a = H5Fopen(argv[1], H5F_ACC_RDONLY, H5P_DEFAULT), b = H5Fopen(argv[2], H5F_ACC_RDONLY, H5P_DEFAULT);
    if (a < 0 || b < 0) {
        fprintf(stderr, "cannot open %s\n", a < 0 ? argv[1] : argv[2]);
        return 2;
    }
    Comparison c = {.other = b};
    H5Literate(a, H5_INDEX_NAME, H5_ITER_INC, NULL, compare_one, &c);  // the root's entries: the state_dict
    int in_a = count_entries(a), in_b = count_entries(b);
    if (in_a != in_b) {
        fprintf(stderr, "%s has %d entries, %s %d\n", argv[1], in_a, argv[2], in_b);
        c.problems++;
    }
    H5Fclose(a), H5Fclose(b);
    double relative = sqrt(c.diff2 / (c.norm2 > 0 ? c.norm2 : 1e-300));
    printf("%d tensors: relative difference %.2e, largest element difference %.2e\n", c.datasets, relative, c.worst);
    return c.problems == 0 && c.datasets > 0 && relative <= atof(argv[3]) ? 0 : 1;
}
