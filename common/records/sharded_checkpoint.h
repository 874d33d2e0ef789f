// sharded_checkpoint.h: a checkpoint of a split model that no rank gathers: every rank writes its
// own shards, an index says where each piece of each tensor lies, and a load under any other
// layout reads only the slices its own new shards need (torch.distributed.checkpoint's design).
//
//   CheckpointPiece saved[...], wanted[...];   // this rank's boxes of the global tensors
//   CheckpointState state = {...};            // the step, the data position, the generator, ...
//   if (sharded_checkpoint_load(dir, wanted, n_wanted, &state)) ...          // collective
//   CheckpointWrite w = sharded_checkpoint_save(dir, keep, saved, n_saved, &state);  // collective
// Steps 13 and 16-20 use it alike: their boxes (checkpoint_param_pieces, step 18's flat blocks,
// step 20's gpt_param_boxes), sharded_checkpoint_resume, and sharded_checkpoint_save_step and
// _finish_saves, which save in line or (--async_save) by way of sharded_checkpoint_save_async and
// _finish (a thread writes the shard), and print each save's line (_print_saved). One process
// outside a run reads a checkpoint with checkpoint_reader_* (tools/checkpoint_to_state_dict).
//
// The folder, as `ls -R` shows it:
//   DIR/current                  "step-000010": the checkpoint a resume loads (a small file,
//                                replaced by rename, as a symbolic link would be but on any
//                                shared file system)
//   DIR/step-000010/index.h5     rank 0's: every tensor's global shape and, for each piece,
//                                its file and its box (offsets and sizes); the run's state
//   DIR/step-000010/shard-00000.h5 ... shard-0000W.h5   one per rank: its pieces, each a dataset
//   DIR/tmp-000020/              a save in progress; one that a crash left is removed on load
// index.h5, as h5py lists it:
//   tensors/<name>/shape         int64 [ndim]       the global shape ("fc.0.weight": [128, 784])
//   tensors/<name>/pieces        int64 [n, 2 + 8]   per piece: the rank whose file holds it, its
//                                number there (dataset "<name>/<number>" of shard-RRRRR.h5),
//                                then 4 offsets and 4 sizes (unused dimensions 0 and 1)
//   state/step, epoch, samples_done, seed, shuffle, train_samples, global_batch   int64
//   state/lr                     float64
//   state/lr_scale               float64: what the run multiplies lr by since an elastic restart
//                                scaled it (step 19's --on_resize scale_lr); 1 where absent
//   state/losses/epoch, state/losses/loss   int64, float32 [step]: the loss log so far
//   state/generator/mt19937, state/generator/index   the generator (rng.h)
//   state/eval_generator/...     a second one, where the program keeps it (step 19's evaluation)
//   attributes of the root: format, program (a checkpoint of another program is refused, but
//   for the one named CheckpointState.also_resumes),
//   layout ("ZeRO-3 on 4 ranks"), world_size, checkpoint_id (also in every shard file: a shard of
//   another checkpoint is refused), mlflow_run_id (a tracked run)
//
// One HDF5 file per rank, not one file written by all: the project links Debian's serial HDF5
// (libhdf5-dev), and the parallel build (libhdf5-openmpi-dev, whose H5Pset_fapl_mpio writes one
// file collectively over MPI-IO) installs the same headers and library names, so one build links
// one or the other, and every other HDF5 user here (--init, --save, step 11's stream, step 13's
// snapshots) would move to the MPI build with it. A file per rank needs nothing of MPI-IO, writes
// in parallel on any shared file system, and costs an index: DCP's choice too.
//
// Atomic: every rank writes and fsyncs its file in DIR/tmp-STEP; the ranks agree; rank 0 writes
// and fsyncs the index, renames tmp-STEP to step-STEP, and then replaces `current` by rename,
// fsyncing the folder after each. A crash at any moment leaves `current` naming the last whole
// checkpoint. --keep N then removes the oldest step-* beyond N.
//
// Resharding: a piece is a box of a global tensor (a ZeRO block of a flat layer is up to three
// boxes of its weight: a partial row, whole rows, a partial row; and one of its bias). A load
// intersects each box this rank wants with every saved box of the same tensor and reads each
// overlap as an HDF5 hyperslab of the file that holds it, so a rank reads only what its new
// shards hold (a rank that holds a whole tensor, DDP's, reads it whole).
//
// Errors: a missing or truncated shard file, a piece whose shape the index does not give, a
// tensor of another shape, an index whose pieces do not tile its tensors, a checkpoint of
// another program or of another run (seed, lr, shuffle, data): one line naming the file and what
// was expected, every rank exits(1) (check_all_ranks), nothing written. A save that fails (an
// unwritable folder, a full disk) on any rank fails on every rank alike (the ranks agree; no rank
// waits for one that gave up): its unfinished folder is removed, `current` and its checkpoint are
// untouched, and then, as the caller's flag says (--save_errors), one line and exit 1 on every
// rank (stop, the default), or the CheckpointWrite comes back `failed` with that line, which
// sharded_checkpoint_print_saved prints as one warning, and the training goes on (continue): the
// next save that succeeds becomes current.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "base/rng.h"
#include "models/nn.h"
#include "records/loss_log.h"
#include "tensor/tensor.h"

#define CHECKPOINT_MAX_DIMS 4
#define CHECKPOINT_ERROR_SIZE 1536  // an error line's room

// One box of a global tensor that this rank writes (save) or wants (load).
typedef struct {
    const char *name;                        // the state_dict name: "fc.0.weight", "optimizer/exp_avg/fc.0.bias"
    int ndim;                                // of the global tensor (1 to CHECKPOINT_MAX_DIMS)
    long long shape[CHECKPOINT_MAX_DIMS];    // the global tensor's
    long long offset[CHECKPOINT_MAX_DIMS];   // the box's first element
    long long count[CHECKPOINT_MAX_DIMS];    // the box's sizes
    Tensor values;  // the box's elements, row-major and contiguous, on the CPU or a GPU (a [1, n] view)
} CheckpointPiece;

// The run's state beside the tensors: what an exact resume needs.
typedef struct {
    const char *program;     // "day4/18_zero_sharding": another program's checkpoint is refused,
    const char *also_resumes;  // but this one's (NULL: none): step 19's and 20's are the same model and data
    char layout[64];         // "ZeRO-3 on 4 ranks" (load: the saved one's, for the resume line)
    long step;               // optimizer steps done
    int epoch;               // the epoch in progress (or the next)
    long samples_done;       // positions of that epoch's sampler order already trained on
    bool random_windows;     // step 19: the data are windows drawn by the generator, no epochs (0 and 0)
    int world_size;          // load: the saved run's
    long global_batch;       // samples per step (load: the saved run's; another one is allowed)
    // sharded_checkpoint_resume puts this run's layout, world size and global batch back after its
    // line, so that its later saves say what saved them, and keeps the checkpoint's here:
    int saved_world_size;
    long saved_global_batch;
    bool adopts_global_batch;  // the program takes the saved global batch on resuming (step 19's --on_resize
                               // keep_batch): the resume line then says nothing of another batch
    bool lr_follows_world;   // step 13: the learning rate is lr x world size (step 8's rule), so
                             // another world size takes other steps whatever the global batch
    // The run: a resume must match these (another world size and batch aside, an elastic restart).
    int seed, shuffle, train_samples;
    double lr;
    double lr_scale;         // the factor on lr since a resize scaled it (0, as unset, saves as 1; load: the saved one)
    Rng generator;
    Rng eval_generator;        // step 19's evaluation windows, drawn apart from training's:
    bool eval_generator_kept;  // kept too (state/eval_generator) where this is true
    LossLog *losses;         // the loss of every step so far (load: replaced)
    char mlflow_run_id[33];  // "" for an untracked run
} CheckpointState;

typedef struct {
    double seconds;          // the whole save on this rank, from the start to `current` replaced
    double bytes;            // what this rank wrote (its shard file; rank 0's index aside)
    double index_bytes;      // rank 0: the index
    double staged_bytes;     // host memory the save took beside the model: the largest GPU piece's copy
    char folder[4096];       // DIR/step-NNNNNN
    long step;               // the step it holds
    bool asynchronous;       // written by a thread (--async_save):
    double stall_seconds;    //   the training's wait: the host copy, and the thread where it had not finished
    double write_seconds;    //   the shard file's writing, on the thread (or in line)
    bool failed;             // continue_on_error: the save failed (on some rank), nothing of it kept
    char error[CHECKPOINT_ERROR_SIZE];  //   the first failing rank's line, on every rank
    char current[64];        //   rank 0: what DIR/current still names ("" if none)
} CheckpointWrite;

// Collective. DIR must be writable (checked first, so that a run never trains for hours to fail
// at its first save): else one line, exit 1. No `current` in DIR (on every rank): returns false,
// and changes nothing but a stale tmp-* a crashed save left (removed, said once). Otherwise
// fills every piece's values from the checkpoint, resharding as needed, fills `state` (the run's
// settings must match those given), sets *bytes_read to what this rank read of the shard files,
// and returns true. The caller says where it resumed from (state->layout: the saving layout).
bool sharded_checkpoint_load(const char *dir, const CheckpointPiece *pieces, int n_pieces, CheckpointState *state,
                             double *bytes_read);

// Collective. Writes this rank's pieces and (rank 0) the index as DIR/step-<state->step>, makes
// it current, and keeps the newest `keep` checkpoints. A failure: exit 1 on every rank, or with
// continue_on_error (--save_errors continue) a CheckpointWrite marked failed (see Errors above).
CheckpointWrite sharded_checkpoint_save(const char *dir, int keep, bool continue_on_error, const CheckpointPiece *pieces,
                                        int n_pieces, const CheckpointState *state);

// --async_save (DCP's async_save): the save in flight, or NULL.
typedef struct CheckpointSave CheckpointSave;
// Collective. Finishes the save in flight, if any (its CheckpointWrite in *finished: returns true),
// then begins one: rank 0 makes DIR/tmp-STEP, every rank copies its pieces into one host buffer
// (page-locked on a GPU rank: the training's stall) and starts a thread that writes its shard file
// while the training goes on. The new save is *in_flight until the next call or
// sharded_checkpoint_finish. A crash before that leaves `current` naming the previous checkpoint.
// continue_on_error: as sharded_checkpoint_save's, for this save when it finishes.
bool sharded_checkpoint_save_async(CheckpointSave **in_flight, const char *dir, int keep, bool continue_on_error,
                                   const CheckpointPiece *pieces, int n_pieces, const CheckpointState *state,
                                   CheckpointWrite *finished);
// Collective. Waits for the thread, then the ranks agree, rank 0 writes the index and makes the
// checkpoint current (as a save does). False when nothing was in flight.
bool sharded_checkpoint_finish(CheckpointSave **in_flight, CheckpointWrite *finished);

// The boxes that a run of flat elements [first, end) of a tensor [rows, cols] covers (cols 0: a
// vector of `rows`): up to 3 for a matrix (a partial row, whole rows, a partial row), 1 for a
// vector. Each box's values are `source`'s elements from `at` on, in order. Returns the count
// written to `out` (which has room for 3).
int checkpoint_flat_pieces(const char *name, int rows, int cols, size_t first, size_t end, const Tensor *source,
                           size_t at, CheckpointPiece *out);
// The same for a run [first, end) of the elements of a box of such a tensor, counted row-major
// within the box: the box's first element at (offset[0], offset[1]) and its sizes count[0] x
// count[1] (a vector: its elements offset[0] to offset[0] + count[0]). A tensor-parallel shard is
// such a box (a row-parallel weight's columns), and a replica's or a ZeRO block's share of it a run.
int checkpoint_box_run_pieces(const char *name, int rows, int cols, const long long offset[2], const long long count[2],
                              size_t first, size_t end, const Tensor *source, size_t at, CheckpointPiece *out);

// ---------------------------------------------------------------- parameters and Adam, as pieces
// Steps 16 and 17 (and 18 under DDP) hold parameters as tensors that are each one box of a global
// tensor: a whole layer (a pipeline stage), or a tensor-parallel shard of one. These build their
// pieces, and Adam's moments' ("optimizer/exp_avg/<name>", "optimizer/exp_avg_sq/<name>"), once.

// Where a parameter's tensor lies in the global tensor: its state_dict shape and the offsets of
// the tensor's first element (the box's sizes are the tensor's own: [rows, cols], or a bias's
// [cols] when ndim is 1); and, when several ranks hold the same box (the replicas of a
// data-parallel group, the ranks of a tensor-parallel group for a tensor it does not split), which
// of them this rank is: they share its writing, each its 1/writers of the leading dimension, so
// that every element lies in one file.
typedef struct {
    int ndim;
    long long shape[CHECKPOINT_MAX_DIMS], offset[CHECKPOINT_MAX_DIMS];
    int writer, writers;  // this rank is writer `writer` (0 to writers - 1) of the box's holders
} CheckpointBox;

// A whole tensor, of its state_dict shape (a bias [1, out] is [out]), held by `writers` ranks.
CheckpointBox checkpoint_whole_box(const Tensor *value, int writer, int writers);

// A list of pieces and the names it made for them.
typedef struct {
    CheckpointPiece *piece;
    int n;
    char (*names)[96];
} CheckpointPieces;

// Parameter i is the box boxes[i]; exp_avg and exp_avg_sq, Adam's moments of each (NULL: the
// parameters alone). Saving: this rank's share of every box; loading: every box whole.
CheckpointPieces checkpoint_param_pieces(const Param *params, const Tensor *exp_avg, const Tensor *exp_avg_sq,
                                         int n_params, const CheckpointBox *boxes, bool saving);
void checkpoint_pieces_free(CheckpointPieces *pieces);

// ---------------------------------------------------------------- the programs' flags
// Steps 16-20 take the same flags: --checkpoint DIR, --save_every N, --keep N, --async_save and
// --save_errors stop|continue; step 13 too, its --save_every counting epochs (the tutorial's). The help texts, and the check after args_parse that the others come
// with --checkpoint (and that DIR is not ''): a usage error (exit 2) otherwise.
#define CHECKPOINT_HELP_DIR "resume from DIR's current sharded checkpoint if it has one; save into DIR"
#define CHECKPOINT_HELP_SAVE_EVERY "--checkpoint: save every N optimizer steps (0: only after the last)"
#define CHECKPOINT_HELP_KEEP "--checkpoint: keep the newest N checkpoints"
#define CHECKPOINT_HELP_ASYNC_SAVE \
    "--checkpoint: copy the shards to host memory and write them from a thread while training goes on"
#define CHECKPOINT_HELP_SAVE_ERRORS \
    "--checkpoint: after a save that fails (a full disk): stop (exit 1), or continue with one warning, the last good checkpoint " \
    "current (the last step's save tried twice: exit 1 if both fail)"
void checkpoint_flags_check(const char *checkpoint);
// Step 13's: the same, but for --save_every, which is the program's own there (epochs between
// saves, the DDP tutorial's save_every, for its snapshots and its checkpoints alike).
void checkpoint_flags_check_own_interval(const char *checkpoint);

// ---------------------------------------------------------------- what the programs print
// Collective: sharded_checkpoint_load, and one line on rank 0 that says what it did: "Resumed from
// DIR/step-000017, saved by ZeRO-3 on 2 ranks: step 17, epoch 2, 8000 of its 60000 samples done;
// [resharded, ]0.61 to 0.61 MB read per rank in 19.7 ms" (a line more when the global batch
// changed, or --init is not used), or "No checkpoint in DIR: training from the start". state's
// layout, world_size and global_batch stay this run's (the next save's), unlike a bare load's.
bool sharded_checkpoint_resume(const char *dir, const CheckpointPiece *pieces, int n_pieces, CheckpointState *state,
                               const char *init);

// Collective: one line for a save: what the ranks wrote (the least and the most), how long it
// took, and on GPUs the largest host copy a rank made of a piece on its way to the file. A failed
// one (continue_on_error): rank 0's warning on stderr, naming the folder, the reason and what
// `current` still names.
void sharded_checkpoint_print_saved(const CheckpointWrite *written, long step);
// What the programs call, collectively, to save step state->step and print its line: in line
// where in_flight is NULL; else (--async_save) handed to a thread, the save in flight before it
// finished first and its line printed (it is the one that became current then).
void sharded_checkpoint_save_step(CheckpointSave **in_flight, const char *dir, int keep, bool continue_on_error,
                                  const CheckpointPiece *pieces, int n_pieces, const CheckpointState *state);
// ... and at the end of training: the save still in flight, if any, finished and its line printed.
void sharded_checkpoint_finish_saves(CheckpointSave **in_flight);
// Collective, after a step: where every rank's thread has written its shard, the save in flight is
// made current now (its line printed) rather than at the next save. Step 13 saves once an epoch:
// without it a rank lost in the next epoch would lose that save, and a restart would start over.
// One allreduce of an int while a save is in flight; nothing otherwise.
void sharded_checkpoint_poll(CheckpointSave **in_flight);
// The end of training, collectively: sharded_checkpoint_finish_saves, then state->step saved in
// line unless a save of it succeeded; true when the end is saved. Under continue_on_error the last
// step gets two tries (a failed --save_every save of it was the first), and false when both failed:
// the program writes its outputs, then calls sharded_checkpoint_check_end_saved, which ends it with
// one line and exit 1. Periodic saves may fail and training go on; its end is what the run is for,
// and a job that ends with it unsaved must not look like one that saved it.
bool sharded_checkpoint_save_last(CheckpointSave **in_flight, const char *dir, int keep, bool continue_on_error,
                                  const CheckpointPiece *pieces, int n_pieces, const CheckpointState *state);
// Collective: returns if end_saved; else one line naming DIR, and exit 1 on every rank.
void sharded_checkpoint_check_end_saved(bool end_saved, const char *dir);

// ---------------------------------------------------------------- reading outside a run
// One process, no MPI (tools/checkpoint_to_state_dict): a checkpoint's tensors, any box of any of
// them read from the shards that hold it, with the checks a load makes (a missing, foreign or
// truncated shard, an index that disagrees with its shards); the run's settings are not checked.
typedef struct CheckpointReader CheckpointReader;
// DIR: a checkpoint folder (its current checkpoint) or a step-NNNNNN folder. NULL, and err, if not.
CheckpointReader *checkpoint_reader_open(const char *dir, char err[CHECKPOINT_ERROR_SIZE]);
const CheckpointState *checkpoint_reader_state(const CheckpointReader *r);  // program, layout, step, ...
const char *checkpoint_reader_folder(const CheckpointReader *r);           // DIR/step-NNNNNN
int checkpoint_reader_tensors(const CheckpointReader *r);
// Tensor t's name (weights' and "optimizer/..."), dimensions and global shape.
const char *checkpoint_reader_tensor(const CheckpointReader *r, int t, int *ndim, long long shape[CHECKPOINT_MAX_DIMS]);
// Fills piece->values (on the CPU) with the box it names; false, and err, on a problem.
bool checkpoint_reader_read(CheckpointReader *r, const CheckpointPiece *piece, char err[CHECKPOINT_ERROR_SIZE]);
void checkpoint_reader_close(CheckpointReader *r);
