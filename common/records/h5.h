// h5.h: model weights in and out of HDF5, in the PyTorch state_dict layout.
//
// One float32 dataset per parameter at the file's root, named like the
// state_dict keys of the workshop's Net ("fc.0.weight" [128, 784], "fc.0.bias"
// [128], ...). So h5py + torch read our checkpoints, and we start from theirs:
//   with h5py.File("w.h5", "w") as f:
//       for k, v in model.state_dict().items(): f[k] = v.numpy()
#pragma once
#include "models/nn.h"

void h5_save_params(const char *path, const Param *params, int n_params);
// Every parameter must be present with its exact shape (a bias may be stored
// [out] or [1, out]) and a floating-point type, and hold weights: written whole
// (not HDF5's fill value; a virtual dataset must find all its sources), every
// value finite and within float32's range (a float64 1e300 is refused, not
// rounded to inf). Otherwise one line names the file, the dataset and what was
// expected, and every rank exits(1). Collective: every rank calls it.
void h5_load_params(const char *path, Param *params, int n_params);

// The same, strictly: the file must hold no dataset but the parameters' and those named in
// `also_allowed` (NULL-terminated; e.g. a tied weight's second name, "lm_head.weight"). One left
// over means the file is of another model (a GPT of 6 layers given to one of 4): one line names it
// and every rank exits(1). Collective.
void h5_load_params_exactly(const char *path, Param *params, int n_params, const char *const *also_allowed);
