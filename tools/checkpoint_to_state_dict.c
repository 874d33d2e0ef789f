// checkpoint_to_state_dict DIR OUT.h5: a sharded checkpoint (steps 13 and 16-20's --checkpoint DIR)
// made one state_dict file, as torch.distributed.checkpoint's dcp_to_torch_save makes one torch.save
// file: every weight tensor whole, under its state_dict name, float32, at the file's root, the layout
// of --save (common/records/h5.h), so that --init and the PyTorch twins load it:
//   with h5py.File("OUT.h5") as f: model.load_state_dict({k: torch.from_numpy(f[k][...]) for k in f})
// DIR is the checkpoint folder (its current checkpoint is converted) or one step-NNNNNN folder in it.
// Whatever layout saved it, one tensor at a time is held in memory: each is read from the shards
// that hold its pieces (common/records/sharded_checkpoint.h, checkpoint_reader_*), written, and
// freed; so a model that no rank could hold converts on a machine that holds its largest tensor.
// Adam's moments (the checkpoint's optimizer/...) stay behind: a state_dict is the model's.
// OUT.h5 is replaced atomically (a temporary file beside it, then a rename). One process, no mpirun.
//
//   make tools/checkpoint_to_state_dict
//   tools/checkpoint_to_state_dict checkpoints/zero weights.h5
//   mpirun -np 2 day4/18_zero_sharding --init weights.h5 --max_steps 0
#include <hdf5.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/paths.h"                  // replace_temp_name, replace_commit: OUT.h5 replaced atomically
#include "records/sharded_checkpoint.h"  // checkpoint_reader_*: a checkpoint's tensors, read box by box

// One line, as the programs' (error: ...), and exit 1 (no partial OUT.h5: the temporary file goes first).
static void die(const char *temp, const char *fmt, const char *a, const char *b) {
    if (temp && temp[0]) replace_abort(NULL, temp);
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 3 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s DIR OUT.h5\n  DIR: a sharded checkpoint folder (--checkpoint DIR of steps 13 and 16-20) or "
                        "one of its step-NNNNNN folders;\n  OUT.h5: the whole state_dict, which --init and the PyTorch "
                        "twins load\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *out = argv[2];
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);  // our one line instead of HDF5's stack
    char err[CHECKPOINT_ERROR_SIZE];
    CheckpointReader *reader = checkpoint_reader_open(dir, err);
    if (!reader) die(NULL, "%s%s", err, "");
    const CheckpointState *state = checkpoint_reader_state(reader);

    char temp[PATH_MAX];
    replace_temp_name(out, temp, sizeof temp);
    hid_t file = H5Fcreate(temp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) die(NULL, "%s: cannot create it (is the folder writable?)%s", temp, "");
    long long weights = 0, largest = 0;
    int written = 0;
    for (int t = 0; t < checkpoint_reader_tensors(reader); t++) {
        CheckpointPiece whole = {0};
        whole.name = checkpoint_reader_tensor(reader, t, &whole.ndim, whole.shape);
        if (strncmp(whole.name, "optimizer/", 10) == 0) continue;  // Adam's moments: not the model's
        long long numel = 1;
        hsize_t dims[CHECKPOINT_MAX_DIMS];
        for (int d = 0; d < whole.ndim; d++) numel *= whole.shape[d], whole.count[d] = whole.shape[d], dims[d] = (hsize_t)whole.shape[d];
        if (numel > INT_MAX) die(temp, "%s: tensor '%s' has more than 2^31 elements", checkpoint_reader_folder(reader), whole.name);
        float *values = malloc((size_t)numel * sizeof(float));
        if (!values) die(temp, "tensor '%s': out of memory for it%s", whole.name, "");
        whole.values = (Tensor){.data = values, .rows = 1, .cols = (int)numel, .device = DEVICE_CPU};
        if (!checkpoint_reader_read(reader, &whole, err)) die(temp, "%s%s", err, "");
        hid_t space = H5Screate_simple(whole.ndim, dims, NULL);
        hid_t dataset = H5Dcreate2(file, whole.name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        bool ok = dataset >= 0 && H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0;
        if (dataset >= 0) H5Dclose(dataset);
        H5Sclose(space);
        free(values);
        if (!ok) die(temp, "%s: cannot write dataset '%s' (a full disk?)", temp, whole.name);
        weights += numel, written++;
        largest = numel > largest ? numel : largest;
    }
    if (H5Fclose(file) < 0) die(temp, "%s: cannot finish the HDF5 file%s", temp, "");
    if (written == 0) die(temp, "%s: no weights in it%s", checkpoint_reader_folder(reader), "");
    if (!replace_commit(NULL, temp)) die(NULL, "%s: cannot replace it: %s", out, strerror(errno));
    printf("%s (%s, %s, step %ld): %d tensors, %lld weights, written whole to %s; at most one tensor held, %.2f MB\n",
           checkpoint_reader_folder(reader), state->program, state->layout, state->step, written, weights, out,
           largest * sizeof(float) / 1e6);
    checkpoint_reader_close(reader);
    return 0;
}
