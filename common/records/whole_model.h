// whole_model.h: a model split across ranks made whole again, one layer at a time, for its
// parameter checksum and --save.
//
// Steps 16-18 split the MLP (whole layers per pipeline stage, a part of every layer per
// tensor-parallel rank, a flat block of every layer per ZeRO rank), yet their checksum and
// their --save file are the whole model's: the checksum is step 6's params_checksum of the same
// weights, and the file has step 6's state_dict layout, so that weights go freely between the
// steps. Each program says how one layer of its layout is brought whole (gather_layer); this
// file walks the layers in order, hashes each, and keeps them for the file only when saving
// (so a checksum holds one layer at a time, as ZeRO-3's gathers do).
//
//   unsigned long long checksum = whole_model_gather(&pipeline, sizes, n_sizes, WHOLE_ON_ROOT,
//                                                    gather_stage_layer, &stage, opt.save);
#pragma once
#include "comm/group.h"
#include "models/nn.h"

// Collective over the group: puts layer `layer`'s whole weight [out, in] and bias [1, out] into
// the host tensors pair[0].value and pair[1].value where they are not NULL (the group's rank 0,
// and with WHOLE_ON_EVERY_RANK every rank), named as mlp_name_layer names them.
typedef void (*GatherLayer)(void *model, int layer, Param pair[2]);

typedef enum {
    WHOLE_ON_ROOT,        // only the group's rank 0 gets each layer whole; the others learn its checksum
    WHOLE_ON_EVERY_RANK,  // every rank gets (or holds) each layer whole and hashes its own copy
} WholeOn;

// Collective over `group`: the whole model of `sizes` (as mlp_new's), layer by layer through
// gather_layer, hashed as params_checksum hashes it; returns that checksum on every rank of the
// group. With a save_path, the group's rank 0 writes the layers as one state_dict file
// (h5_save_params).
unsigned long long whole_model_gather(const Group *group, const int *sizes, int n_sizes, WholeOn whole_on,
                                      GatherLayer gather_layer, void *model, const char *save_path);
