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
// writes an argparse attribute: "0.001", "None" (unset), "True"/"False" (switches): Python's
// vars(args), which a program logs as its run's params (mlflow.log_params). Valid until the next
// args_parse.
typedef struct {
    int count;
    const char *const *names;   // without the leading "--", as the table spells them
    const char *const *values;
} ArgValues;
ArgValues args_values(void);
