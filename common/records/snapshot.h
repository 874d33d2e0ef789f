// snapshot.h: everything an exact resume needs, in one HDF5 file, replaced atomically.
//
//   SnapshotSettings run = {...};              // what this run is; a resume must match it
//   SnapshotSettings saved;
//   SnapshotProgress progress = {0};
//   if (snapshot_load(path, &run, &saved, &progress, &optimizer, &losses, &rng)) ...   // collective
//   ...
//   SnapshotWrite written = snapshot_save(path, &run, &progress, &optimizer, &losses, &rng);  // collective
//
// The PyTorch DDP tutorial's snapshot holds the model and the epoch. An exact
// resume needs more: Adam's moments and step (else the first steps after a
// resume are different steps), where the sampler stands (else the data order
// restarts), the generator, and the losses so far (else the log has a hole).
//
// The file, as h5py lists it (day3/README.md reads it with h5py and torch):
//   fc.0.weight, fc.0.bias, ...        float32   the model, in the layout of h5.h (the state_dict's)
//   optimizer/step                     int64     Adam's step count
//   optimizer/exp_avg/<name>           float32   Adam's first moment of each parameter, shaped like it
//   optimizer/exp_avg_sq/<name>        float32   ... and second moment
//   progress/epochs_done               int64     complete epochs
//   progress/samples_done              int64     of the next epoch, the sampler positions already trained on
//                                                (0, except in a snapshot taken on a stop signal)
//   generator/mt19937                  uint32 [624]  the generator's state (rng.h) ...
//   generator/index                    int64         ... and its position in it
//   losses/epoch, losses/loss          int64, float32 [steps]: the --losses log so far
//   settings/world_size, batch_size, accum_steps, seed, shuffle, train_samples   int64
//   settings/lr                        float64   --lr, before the scaling by the world size
//   settings/model_sizes               int64 [layers + 1]: 784, 128, 10
//   attributes of the root: format (a string naming this layout and its version) and
//   checksum (uint64: a hash of every value above, so that a corrupt file is refused); and
//   mlflow_run_id (a string) for a run tracked in MLflow
//
// Saving: rank 0 writes FILE.tmp beside FILE, fsyncs it, renames it over FILE
// and fsyncs the folder. A crash at any moment leaves FILE as it was (the old
// snapshot, whole) or the new one, whole. Every rank learns the outcome.
//
// Loading: every rank reads the file itself, and the ranks agree: all of them
// see it or none, each checks it, and all must read the same contents. Any
// problem is one line naming the file and what is wrong, and every rank exits(1).
#pragma once
#include <stdbool.h>

#include "base/rng.h"
#include "models/nn.h"
#include "records/loss_log.h"

#define SNAPSHOT_MAX_SIZES 8

// What the run is. A resume continues the same run, so these must match the
// snapshot's, except world_size: another world size resumes too (an elastic
// restart), with another split of the data into global batches.
typedef struct {
    int world_size;
    int batch_size;     // per rank
    int accum_steps;
    double lr;          // --lr, before the scaling by the world size
    int seed;
    int shuffle;
    int train_samples;  // the training set's size
    int n_sizes;
    int sizes[SNAPSHOT_MAX_SIZES];  // the MLP's widths, input to output
} SnapshotSettings;

// Where the run stands.
typedef struct {
    int epochs_done;    // complete epochs
    long samples_done;  // of epoch epochs_done: positions of its sampler order already trained on
    // The MLflow run the training logs to ("" for none), so that a resume logs into it: the root's
    // attribute mlflow_run_id, outside the checksum (it is not training state; a snapshot without it loads).
    char mlflow_run_id[33];
} SnapshotProgress;

typedef struct {
    double seconds;     // rank 0's time to write, sync and rename (0 on the other ranks)
    double megabytes;   // the file's size
} SnapshotWrite;

// Collective. Rank 0 writes the model and Adam's state (optimizer->params are
// the model's parameters), the progress, the losses and the generator; a failure
// is one line, and every rank exits(1).
SnapshotWrite snapshot_save(const char *path, const SnapshotSettings *run, const SnapshotProgress *progress,
                            const Adam *optimizer, const LossLog *losses, const Rng *generator);

// Collective. No file at `path` (on every rank): returns false and changes
// nothing. Otherwise loads the model's parameters, Adam's state, the progress,
// the losses (replacing `losses`) and the generator, fills `saved` with the
// snapshot's settings, and returns true. A snapshot that does not match `run`
// (but for its world size), or is truncated, corrupt or incomplete, or is seen by
// some ranks only, is refused: one line, every rank exits(1). Rank 0 removes a
// FILE.tmp left by a run that died while writing, and says so.
bool snapshot_load(const char *path, const SnapshotSettings *run, SnapshotSettings *saved,
                   SnapshotProgress *progress, Adam *optimizer, LossLog *losses, Rng *generator);
