// test_snapshot.c: common/snapshot.c and common/stop_signal.c under mpirun, at
// any world size (tests/test_mpi_units.sh runs it on 1, 2 and 4 ranks).
//
//   round trip   a snapshot of a model after 3 Adam steps, a loss log, an
//                advanced generator and a mid-epoch position loads, on every
//                rank, into a model of another seed: parameters, moments, step,
//                losses, generator and progress all bit for bit;
//   layout       read back with the HDF5 C API itself, not through snapshot.c:
//                names, types and shapes as snapshot.h (and the README) list them;
//   atomic       a second save replaces the first, and leaves no FILE.tmp;
//   absent       no file: snapshot_load returns false and changes nothing;
//   stop         stop_signal_agreed() is 0 on every rank until one rank gets
//                SIGUSR1, then SIGUSR1 on every rank.
// The refusals (truncated, corrupt, mismatched files) end the process, so
// tests/test_fault_tolerance.sh checks them on the real program.
#define TEST_NAME "test_snapshot"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>

#include "records/snapshot.h"
#include "records/stop_signal.h"
#include "runtime/dist.h"
#include "test_mpi.h"

static int rank, world;

static const int sizes[] = {784, 128, 10};

// A model and its Adam, seeded, after `steps` steps on made-up gradients.
typedef struct {
    Mlp model;
    Adam adam;
} Trained;

static Trained trained(uint64_t seed, int steps) {
    Rng rng;
    rng_seed(&rng, seed);
    Trained t = {.model = mlp_new(sizes, 3, 1, &rng, DEVICE_CPU)};
    t.adam = adam_new(t.model.params, t.model.n_params, 0.002);
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < t.model.n_params; i++)
            for (size_t k = 0; k < tensor_numel(t.model.params[i].grad); k++)
                t.model.params[i].grad->data[k] = rng_uniform(&rng, -1.0f, 1.0f);
        adam_step(&t.adam);
    }
    return t;
}

static void trained_free(Trained *t) {
    adam_free(&t->adam);
    mlp_free(&t->model);
}

static bool same_tensors(const Tensor *a, const Tensor *b, int n) {
    for (int i = 0; i < n; i++)
        if (memcmp(a[i].data, b[i].data, tensor_numel(&a[i]) * sizeof(float)) != 0) return false;
    return true;
}

// ---------------------------------------------------------------- the layout, through HDF5 itself
static bool has_dataset(hid_t file, const char *name, hid_t type, int rank_expected, const hsize_t *dims) {
    if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return false;
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    hid_t stored = H5Dget_type(dataset), space = H5Dget_space(dataset);
    hsize_t found[H5S_MAX_RANK] = {0};
    int found_rank = H5Sget_simple_extent_dims(space, found, NULL);
    bool ok = H5Tequal(stored, type) > 0 && found_rank == rank_expected;
    for (int d = 0; ok && d < found_rank; d++) ok = found[d] == dims[d];
    H5Tclose(stored), H5Sclose(space), H5Dclose(dataset);
    return ok;
}

static int check_layout(const char *path, long step, int n_losses) {
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) return 0;
    const hsize_t w0[] = {128, 784}, b0[] = {128}, w2[] = {10, 128}, b2[] = {10}, words[] = {624}, three[] = {3};
    const hsize_t losses[] = {(hsize_t)n_losses};
    int ok = has_dataset(file, "fc.0.weight", H5T_IEEE_F32LE, 2, w0) && has_dataset(file, "fc.0.bias", H5T_IEEE_F32LE, 1, b0) &&
             has_dataset(file, "fc.2.weight", H5T_IEEE_F32LE, 2, w2) && has_dataset(file, "fc.2.bias", H5T_IEEE_F32LE, 1, b2) &&
             has_dataset(file, "optimizer/exp_avg/fc.0.weight", H5T_IEEE_F32LE, 2, w0) &&
             has_dataset(file, "optimizer/exp_avg_sq/fc.2.bias", H5T_IEEE_F32LE, 1, b2) &&
             has_dataset(file, "optimizer/step", H5T_STD_I64LE, 0, NULL) &&
             has_dataset(file, "progress/epochs_done", H5T_STD_I64LE, 0, NULL) &&
             has_dataset(file, "progress/samples_done", H5T_STD_I64LE, 0, NULL) &&
             has_dataset(file, "generator/mt19937", H5T_STD_U32LE, 1, words) &&
             has_dataset(file, "generator/index", H5T_STD_I64LE, 0, NULL) &&
             has_dataset(file, "losses/epoch", H5T_STD_I64LE, 1, losses) &&
             has_dataset(file, "losses/loss", H5T_IEEE_F32LE, 1, losses) &&
             has_dataset(file, "settings/model_sizes", H5T_STD_I64LE, 1, three) &&
             has_dataset(file, "settings/lr", H5T_IEEE_F64LE, 0, NULL) &&
             has_dataset(file, "settings/world_size", H5T_STD_I64LE, 0, NULL) &&
             H5Aexists(file, "format") > 0 && H5Aexists(file, "checksum") > 0;
    if (ok) {  // two values: the step count and the model's widths
        long long stored_step = -1, model_sizes[3] = {0};
        hid_t d = H5Dopen2(file, "optimizer/step", H5P_DEFAULT);
        H5Dread(d, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, &stored_step);
        H5Dclose(d);
        d = H5Dopen2(file, "settings/model_sizes", H5P_DEFAULT);
        H5Dread(d, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, model_sizes);
        H5Dclose(d);
        ok = stored_step == step && model_sizes[0] == 784 && model_sizes[1] == 128 && model_sizes[2] == 10;
    }
    H5Fclose(file);
    return ok;
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    rank = dist_rank(), world = dist_world_size();

    // One scratch folder for all ranks (one machine: /tmp is shared).
    char folder[256] = "/tmp/test_snapshot.XXXXXX", path[300], temp[320];
    if (rank == 0 && !mkdtemp(folder)) folder[0] = '\0';
    MPI_Bcast(folder, sizeof folder, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/sub/snapshot.h5", folder);  // a folder that does not exist yet
    snprintf(temp, sizeof temp, "%s.tmp", path);

    // ---------------------------------------------------------------- round trip
    SnapshotSettings run = {.world_size = world, .batch_size = 6400, .accum_steps = 1, .lr = 0.001, .seed = 0,
                            .shuffle = 1, .train_samples = 60000, .n_sizes = 3, .sizes = {784, 128, 10}};
    Trained before = trained(1, 3);
    LossLog losses = {0};
    for (int i = 0; i < 3; i++) loss_log_add(&losses, i / 2, 2.3f - 0.1f * (float)i);
    Rng generator;
    rng_seed(&generator, 5);
    for (int i = 0; i < 1000; i++) rng_next_u32(&generator);
    SnapshotProgress progress = {.epochs_done = 1, .samples_done = 12800};
    SnapshotWrite written = snapshot_save(path, &run, &progress, &before.adam, &losses, &generator);
    EXPECT_ALL(access(path, F_OK) == 0 && access(temp, F_OK) != 0 && (rank != 0 || written.megabytes > 1.0),
               "on %d rank(s): the snapshot is in place, in a folder it created, with no .tmp beside it (%.2f MB in %.1f ms)",
               world, written.megabytes, 1e3 * written.seconds);

    Trained after = trained(2, 0);
    LossLog loaded_losses = {0};
    loss_log_add(&loaded_losses, 9, 9.0f);  // replaced by the load
    Rng loaded_generator;
    rng_seed(&loaded_generator, 6);
    SnapshotSettings saved;
    SnapshotProgress loaded_progress = {0};
    bool resumed = snapshot_load(path, &run, &saved, &loaded_progress, &after.adam, &loaded_losses, &loaded_generator);
    unsigned long long want = params_checksum(before.model.params, before.model.n_params);
    unsigned long long got = params_checksum(after.model.params, after.model.n_params);
    EXPECT_ALL(resumed && got == want, "on %d rank(s): every rank loads the parameters bit for bit (%016llx)", world, got);
    EXPECT_ALL(same_tensors(before.adam.exp_avg, after.adam.exp_avg, 4) &&
                   same_tensors(before.adam.exp_avg_sq, after.adam.exp_avg_sq, 4) && after.adam.step == 3,
               "on %d rank(s): Adam's moments bit for bit and its step (%ld)", world, after.adam.step);
    bool same_log = loaded_losses.n == losses.n;
    for (int i = 0; same_log && i < losses.n; i++)
        same_log = loaded_losses.epoch[i] == losses.epoch[i] && memcmp(&loaded_losses.loss[i], &losses.loss[i], 4) == 0;
    EXPECT_ALL(same_log && loaded_progress.epochs_done == 1 && loaded_progress.samples_done == 12800,
               "on %d rank(s): the loss log (%d steps) and the progress (epoch %d, %ld samples)", world,
               loaded_losses.n, loaded_progress.epochs_done, loaded_progress.samples_done);
    EXPECT_ALL(memcmp(loaded_generator.state, generator.state, sizeof generator.state) == 0 &&
                   loaded_generator.next == generator.next && rng_next_u32(&loaded_generator) == rng_next_u32(&generator),
               "on %d rank(s): the generator continues with the same draws", world);
    EXPECT_ALL(saved.world_size == world && saved.batch_size == 6400 && saved.lr == 0.001 && saved.n_sizes == 3 &&
                   saved.sizes[1] == 128 && saved.train_samples == 60000,
               "on %d rank(s): the settings it was made with", world);

    int layout_ok = rank != 0 || check_layout(path, 3, losses.n);
    EXPECT_ALL(layout_ok, "the layout, read with the HDF5 C API: state_dict names at the root, optimizer/, progress/, "
                          "generator/, losses/, settings/, with snapshot.h's types and shapes");

    // ---------------------------------------------------------------- atomic replace
    progress = (SnapshotProgress){.epochs_done = 2, .samples_done = 0};
    loss_log_add(&losses, 1, 1.5f);
    before.adam.step++;  // one more step's worth of log, as the consistency check wants
    snapshot_save(path, &run, &progress, &before.adam, &losses, &generator);
    resumed = snapshot_load(path, &run, &saved, &loaded_progress, &after.adam, &loaded_losses, &loaded_generator);
    EXPECT_ALL(resumed && loaded_progress.epochs_done == 2 && loaded_progress.samples_done == 0 && loaded_losses.n == 4 &&
                   access(temp, F_OK) != 0,
               "on %d rank(s): a second save replaces the first (epoch %d, %d steps), no .tmp left", world,
               loaded_progress.epochs_done, loaded_losses.n);

    // ---------------------------------------------------------------- absent
    char absent[320];
    snprintf(absent, sizeof absent, "%s/none.h5", folder);
    Trained untouched = trained(3, 0);
    unsigned long long untouched_sum = params_checksum(untouched.model.params, untouched.model.n_params);
    resumed = snapshot_load(absent, &run, &saved, &loaded_progress, &untouched.adam, &loaded_losses, &loaded_generator);
    EXPECT_ALL(!resumed && params_checksum(untouched.model.params, untouched.model.n_params) == untouched_sum &&
                   untouched.adam.step == 0,
               "on %d rank(s): no snapshot: snapshot_load returns false and changes nothing", world);

    // ---------------------------------------------------------------- stop signals
    stop_signal_install();
    int none = stop_signal_agreed();
    EXPECT_ALL(none == 0, "on %d rank(s): no signal, stop_signal_agreed() is 0 on every rank", world);
    if (rank == world - 1) raise(SIGUSR1);  // one rank only, as when a signal reaches ranks at different moments
    int agreed = stop_signal_agreed();
    EXPECT_ALL(agreed == SIGUSR1 && stop_signal_received() == (rank == world - 1 ? SIGUSR1 : 0),
               "on %d rank(s): SIGUSR1 on the last rank only: every rank agrees on SIGUSR1 at the same call", world);

    dist_barrier();
    if (rank == 0) {
        unlink(path);
        snprintf(temp, sizeof temp, "%s/sub", folder);
        rmdir(temp);
        rmdir(folder);
    }
    trained_free(&before), trained_free(&after), trained_free(&untouched);
    loss_log_free(&losses), loss_log_free(&loaded_losses);
    dist_finalize();
    return test_summary();
}
