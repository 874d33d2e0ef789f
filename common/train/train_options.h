// train_options.h: the flags every MNIST training program takes, one struct and one table fragment.
//
//   TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/2_mnist_training.png");
//   ArgSpec flags[] = {TRAIN_FLAGS(opt)};
//   args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 2: ...");
//
// Here, above both, and not in args.h: the flag parser is common/'s base and knows nothing of what
// the flags are for; these name the training's settings and where its run is tracked
// (records/tracking.h), so they sit on the top floor with the training's other pieces.
#pragma once
#include "base/args.h"         // ArgSpec, ARG_INT ...: the table these rows go in
#include "records/tracking.h"  // TrackingOptions, TRACKING_FLAGS: --mlflow, --experiment, --run_name

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
    const char *dtype;   // float32 | bfloat16: the matrix products' precision (tensor.h's matmul_set_dtype)
    int threads;         // CPU threads of this rank; 0: its share of the node's cores
    TrackingOptions tracking;  // --mlflow, --experiment, --run_name: where rank 0 logs the run
} TrainOptions;

// The workshop's defaults: MLP trained with Adam (lr 1e-3), batch 6400, 5 epochs.
#define TRAIN_OPTIONS_DEFAULTS(plot_path)                                                 \
    (TrainOptions) { .data = "data/mnist", .epochs = 5, .batch_size = 6400, .lr = 1e-3,   \
                     .seed = 0, .plot = (plot_path), .device = "auto", .dtype = "float32" }

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
    {"dtype", ARG_STRING, &(o).dtype, "TYPE", "the matrix products' precision: bfloat16 operands, float32 sums and weights (torch.autocast)", 0, "float32|bfloat16"}, \
    {"threads", ARG_INT, &(o).threads, "N", "CPU threads per rank, as torch.set_num_threads (0: the node's cores / its ranks)", 0, NULL}, \
    TRACKING_FLAGS((o).tracking)
