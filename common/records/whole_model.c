// whole_model.c: a split model walked layer by layer on its group's rank 0: the checksum and
// --save. See whole_model.h.
#include "records/whole_model.h"

#include <stdlib.h>

#include "base/check.h"
#include "records/h5.h"

unsigned long long whole_model_gather(const Group *group, const int *sizes, int n_sizes, WholeOn whole_on,
                                      GatherLayer gather_layer, void *model, const char *save_path) {
    int n_layers = n_sizes - 1;
    bool root = group->rank == 0, here = root || whole_on == WHOLE_ON_EVERY_RANK, saving = root && save_path;
    Param *all = xcalloc((size_t)(2 * n_layers), sizeof(Param));  // what rank 0 writes, when saving
    unsigned long long hash = PARAMS_CHECKSUM_START;
    for (int l = 0; l < n_layers; l++) {
        Param *pair = &all[2 * l];
        mlp_name_layer(pair, l);
        if (here) {
            pair[0].value = xmalloc(sizeof(Tensor)), pair[1].value = xmalloc(sizeof(Tensor));
            *pair[0].value = tensor_zeros(sizes[l + 1], sizes[l], DEVICE_CPU);  // [out, in]
            *pair[1].value = tensor_zeros(1, sizes[l + 1], DEVICE_CPU);         // [1, out]
        }
        gather_layer(model, l, pair);
        if (!here) continue;
        hash = params_checksum_continue(hash, pair, 2);
        if (!saving)  // one layer at a time
            for (int k = 0; k < 2; k++) tensor_free(pair[k].value), free(pair[k].value), pair[k].value = NULL;
    }
    if (saving) h5_save_params(save_path, all, 2 * n_layers);
    for (int p = 0; p < 2 * n_layers && saving; p++) tensor_free(all[p].value), free(all[p].value);
    free(all);
    // Rank 0's hash for the ranks that saw no layer whole; a rank that hashed its own copy keeps it.
    unsigned long long root_hash = hash;
    CHECK_MPI(MPI_Bcast(&root_hash, 1, MPI_UNSIGNED_LONG_LONG, 0, group->mpi));
    return here ? hash : root_hash;
}
