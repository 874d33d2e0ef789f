// h5_file.h: a new HDF5 file whose metadata HDF5 checksums itself, for the files that hold a run's
// state (step 13's snapshots, the sharded checkpoints): object header and superblock versions of
// 1.8 on, so that HDF5 refuses a damaged header instead of reading it. The data is the caller's to
// check.
#pragma once
#include <hdf5.h>

// H5Fcreate(path, H5F_ACC_TRUNC) with those versions; a negative id when it cannot.
static inline hid_t h5_create_checksummed(const char *path) {
    hid_t access = H5Pcreate(H5P_FILE_ACCESS);
#if H5_VERSION_GE(1, 10, 0)
    H5Pset_libver_bounds(access, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
#else
    H5Pset_libver_bounds(access, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
#endif
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, access);
    H5Pclose(access);
    return file;
}
