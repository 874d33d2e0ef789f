// args.h: one flag table drives both the parsing and --help.
//
//   int count = 1;
//   ArgSpec flags[] = {
//       {"count", ARG_INT, &count, "N", "floats to allreduce", .min = 1},
//   };
//   args_parse(argc, argv, flags, ARRAY_LEN(flags), "0_dist_allreduce: sum, then mean, over ranks");
//
// Flags take "--name value" or "--name=value"; a hyphen and an underscore in a
// name are the same character (--batch-size is --batch_size). A bad value, an unknown flag or a
// stray argument is a usage error: one line on rank 0, exit status 2 on all ranks.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "records/tracking.h"  // TrackingOptions, TRACKING_FLAGS: --mlflow, --experiment, --run_name

#define ARRAY_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef enum {
    ARG_INT,     // int*;    value must be >= .min (and within args.c's bound for a few names: --threads ...)
    ARG_FLOAT,   // double*; value must be finite and > .min
    ARG_FLOAT_GE,  // double*; value must be finite and >= .min
    ARG_STRING,  // const char**; if .choices ("cpu|cuda|auto") is set, one of them
    ARG_PATH,    // const char**; a file or folder to read, never ''
    ARG_OUTPUT,  // const char**; a file to write, never '': tried at parse time (see args_parse)
    ARG_OUTPUT_OR_NONE,  // the same, or '' for none (--plot '')
    ARG_SWITCH,  // int*;    takes no value, sets 1
} ArgType;

typedef struct {
    const char *name;     // without the leading "--"
    ArgType type;
    void *value;          // holds the default before parsing
    const char *metavar;  // "N", "DIR", ... shown in --help
    const char *help;
    double min;
    const char *choices;
} ArgSpec;

// After the flags are read, rank 0 tries every output file
// (output_file_writable in paths.h): a folder it cannot create or write ends
// the job now, with one line (check_all_ranks), rather than after the training.
void args_parse(int argc, char **argv, const ArgSpec *flags, int n_flags, const char *about);

// The flag of the table (or "help") closest to an unknown name of `given_len`
// characters, for "unknown flag '--epoch': did you mean --epochs?"; NULL when
// none is close. Close: a few edits away (case, and hyphen versus underscore,
// aside), or a whole word of the other name (epochs, total_epochs), or a
// PyTorch name for it (learning_rate: lr).
const char *args_suggest(const char *given, size_t given_len, const ArgSpec *flags, int n_flags);

// Whether the last args_parse saw --name on the command line (a flag that only
// makes sense beside another: "--iters needs --count").
bool args_given(const char *name);

// Every flag of the last args_parse and its value as text (defaults included), as Python's str()
// writes an argparse attribute: "0.001", "None" (unset), "True"/"False" (switches). For
// mlflow.log_params(vars(args)) (tracking.c).
int args_count(void);
const char *args_flag_name(int i);
const char *args_flag_value(int i);

// The flags every MNIST training program takes (issue: "Flags shared by the MNIST programs").
typedef struct {
    const char *data;    // folder with the four MNIST IDX files (plain or .gz)
    int epochs;
    int batch_size;      // per rank
    double lr;           // a double, like Python's float: lr * world_size stays exact
    int seed;
    int no_shuffle;
    const char *init;    // start from these weights (HDF5, PyTorch state_dict names)
    const char *save;    // write the final weights there
    const char *losses;  // CSV "step,epoch,loss", one line per optimizer step (rank 0)
    const char *plot;    // loss-curve PNG
    const char *device;  // cpu | cuda | auto
    int threads;         // CPU threads of this rank; 0: its share of the node's cores
    TrackingOptions tracking;  // --mlflow, --experiment, --run_name: where rank 0 logs the run
} TrainOptions;

// The workshop's defaults: MLP trained with Adam (lr 1e-3), batch 6400, 5 epochs.
#define TRAIN_OPTIONS_DEFAULTS(plot_path)                                                 \
    (TrainOptions) { .data = "data/mnist", .epochs = 5, .batch_size = 6400, .lr = 1e-3,   \
                     .seed = 0, .plot = (plot_path), .device = "auto" }

#define TRAIN_FLAGS(o) TRAIN_FLAGS_WITH_EPOCHS(o, "epochs")
// The same flags with another name for --epochs: step 13 takes the DDP
// tutorial's --total_epochs.
#define TRAIN_FLAGS_WITH_EPOCHS(o, epochs_flag)                                                   \
    {"data", ARG_PATH, &(o).data, "DIR", "folder with the MNIST files (make data)", 0, NULL},   \
    {epochs_flag, ARG_INT, &(o).epochs, "N", "passes over the training set", 1, NULL},            \
    {"batch_size", ARG_INT, &(o).batch_size, "N", "samples per step, per rank", 1, NULL}, \
    {"lr", ARG_FLOAT, &(o).lr, "X", "Adam learning rate", 0, NULL},                               \
    {"seed", ARG_INT, &(o).seed, "N", "seeds the weights and the shuffle, as torch.manual_seed", 0, NULL}, \
    {"no-shuffle", ARG_SWITCH, &(o).no_shuffle, NULL, "keep the data in file order", 0, NULL},    \
    {"init", ARG_PATH, &(o).init, "FILE.h5", "start from these weights", 0, NULL},                \
    {"save", ARG_OUTPUT, &(o).save, "FILE.h5", "write the final weights", 0, NULL},                 \
    {"losses", ARG_OUTPUT, &(o).losses, "FILE.csv", "write step,epoch,loss per step (rank 0)", 0, NULL}, \
    {"plot", ARG_OUTPUT_OR_NONE, &(o).plot, "FILE.png", "loss-curve PNG ('' for none)", 0, NULL},         \
    {"device", ARG_STRING, &(o).device, "DEV", "where to compute (auto: the GPU when every rank has one)", 0, "cpu|cuda|auto"}, \
    {"threads", ARG_INT, &(o).threads, "N", "CPU threads per rank, as torch.set_num_threads (0: the node's cores / its ranks)", 0, NULL}, \
    TRACKING_FLAGS((o).tracking)
