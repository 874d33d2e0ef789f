// test_args.c: the flag parser (common/base/args.c) takes both spellings, "--name value"
// and "--name=value" (the one torchrun and the DDP tutorials use), for every type
// of flag, and turns every mistake into one line and exit status 2.
//
// Errors end the process (usage_error), so each error case runs args_parse in a
// child process and checks its exit status and the line it printed on stderr.
// (--help needs MPI running, as in the programs: tests/test_flag_spelling.sh
// passes every flag of every program as --name=value before a --help.)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/args.h"

#define TEST_NAME "test_args"
#include "test.h"

// The flags of a training program, one of each type.
typedef struct {
    int epochs, no_shuffle, fail_rank, threads, batch_size;
    double lr, bucket_mb;
    const char *data, *plot, *device, *init;
} Flags;

static Flags defaults(void) {
    return (Flags){.epochs = 5, .fail_rank = -1, .batch_size = 6400, .lr = 1e-3, .bucket_mb = 25, .data = "data/mnist",
                   .plot = "img/x.png", .device = "auto"};
}

static void parse(Flags *f, int argc, char **argv) {
    ArgSpec flags[] = {
        {"epochs", ARG_INT, &f->epochs, "N", "passes", 1, NULL},
        {"fail_rank", ARG_INT, &f->fail_rank, "R", "a rank, -1: the last", -1, NULL},
        {"lr", ARG_FLOAT, &f->lr, "X", "learning rate", 0, NULL},
        {"bucket_mb", ARG_FLOAT_GE, &f->bucket_mb, "MB", "bucket size", 0, NULL},
        {"threads", ARG_INT, &f->threads, "N", "threads", 0, NULL},
        {"batch_size", ARG_INT, &f->batch_size, "N", "samples per step", 1, NULL},
        {"data", ARG_STRING, &f->data, "DIR", "data folder", 0, NULL},
        {"init", ARG_PATH, &f->init, "FILE.h5", "weights", 0, NULL},
        {"plot", ARG_STRING, &f->plot, "FILE.png", "loss curve", 0, NULL},
        {"device", ARG_STRING, &f->device, "DEV", "where", 0, "cpu|cuda|auto"},
        {"no-shuffle", ARG_SWITCH, &f->no_shuffle, NULL, "file order", 0, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "test_args");
}

// Parse a command line given as one string of space-separated words.
static Flags parse_line(const char *line) {
    static char copy[512];
    char *argv[32] = {"prog"};
    int argc = 1;
    snprintf(copy, sizeof copy, "%s", line);
    for (char *word = strtok(copy, " "); word && argc < 31; word = strtok(NULL, " ")) argv[argc++] = word;
    Flags f = defaults();
    parse(&f, argc, argv);
    return f;
}

// Run parse_line in a child; return its exit status and the first line of its stderr.
static int parse_in_child(const char *line, char *message, size_t size) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipe_fds[1], STDERR_FILENO);
        close(pipe_fds[0]);
        parse_line(line);
        _exit(0);
    }
    close(pipe_fds[1]);
    size_t used = 0;  // read to the end, so that the child never writes into a closed pipe
    char rest[256];
    for (ssize_t got; (got = read(pipe_fds[0], used < size - 1 ? message + used : rest,
                                  used < size - 1 ? size - 1 - used : sizeof rest)) > 0;)
        if (used < size - 1) used += (size_t)got;
    message[used] = '\0';
    char *newline = strchr(message, '\n');
    if (newline) *newline = '\0';
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void expect_error(const char *line, const char *expected) {
    char message[512];
    int status = parse_in_child(line, message, sizeof message);
    EXPECT(status == 2 && strstr(message, expected) != NULL,
           "'%s' is a usage error (exit %d, want 2): \"%s\"", line, status, message);
}

int main(void) {
    // Both spellings give the same values, for every type of flag.
    const char *spaced = "--epochs 7 --fail_rank 0 --lr 0.004 --bucket_mb 0 --data /d --plot a.png --device cpu";
    const char *joined = "--epochs=7 --fail_rank=0 --lr=0.004 --bucket_mb=0 --data=/d --plot=a.png --device=cpu";
    Flags a = parse_line(spaced), b = parse_line(joined);
    EXPECT(a.epochs == 7 && a.fail_rank == 0 && a.lr == 0.004 && a.bucket_mb == 0 && strcmp(a.data, "/d") == 0 &&
               strcmp(a.plot, "a.png") == 0 && strcmp(a.device, "cpu") == 0,
           "--name value sets an int, a float, a float >= 0, strings and a choice");
    EXPECT(b.epochs == a.epochs && b.fail_rank == a.fail_rank && b.lr == a.lr && b.bucket_mb == a.bucket_mb &&
               strcmp(b.data, a.data) == 0 && strcmp(b.plot, a.plot) == 0 && strcmp(b.device, a.device) == 0,
           "--name=value sets the same values (epochs %d, lr %g, data %s, device %s)", b.epochs, b.lr, b.data,
           b.device);

    Flags f = parse_line("--fail_rank=-1 --lr=1e-2");
    EXPECT(f.fail_rank == -1 && f.lr == 0.01, "--fail_rank=-1 and --lr=1e-2: a sign and an exponent after '='");
    f = parse_line("--plot=");
    EXPECT(strcmp(f.plot, "") == 0, "--plot= gives the empty string, as --plot '' does (got '%s')", f.plot);
    f = parse_line("--data=run=3/x");
    EXPECT(strcmp(f.data, "run=3/x") == 0, "--data=run=3/x: only the first '=' splits (got '%s')", f.data);
    f = parse_line("--epochs 3 --epochs=4");
    EXPECT(f.epochs == 4, "the last of two spellings wins (got %d)", f.epochs);
    f = parse_line("--no-shuffle --epochs=2");
    EXPECT(f.no_shuffle == 1 && f.epochs == 2, "a switch beside a --name=value flag");
    f = parse_line("--epochs 3 --epochs=4");
    EXPECT(args_given("epochs") && !args_given("lr") && !args_given("epoch"),
           "args_given: --epochs was on the command line, --lr was not");
    f = parse_line("--lr 0.001");
    EXPECT(args_given("lr") && !args_given("epochs"),
           "args_given: a flag given at its default value counts as given; the last parse's flags only");
    // A hyphen and an underscore in a name are one character, in either spelling
    // of the value; the table's spelling is the one errors and args_given use.
    f = parse_line("--batch-size 100 --no_shuffle --fail-rank=0 --bucket-mb 0");
    EXPECT(f.batch_size == 100 && f.no_shuffle == 1 && f.fail_rank == 0 && f.bucket_mb == 0,
           "--batch-size, --no_shuffle, --fail-rank=, --bucket-mb are --batch_size, --no-shuffle, --fail_rank, "
           "--bucket_mb (got %d, %d, %d, %g)", f.batch_size, f.no_shuffle, f.fail_rank, f.bucket_mb);
    EXPECT(args_given("batch_size") && args_given("no-shuffle") && !args_given("batch-size"),
           "args_given takes the table's spelling whatever the command line's");
    f = parse_line("--batch_size 7 --batch-size=9");
    EXPECT(f.batch_size == 9, "--batch_size then --batch-size: one flag, the last wins (got %d)", f.batch_size);
    expect_error("--batch-size=0", "--batch_size expects an integer from 1 to 1048576, got '0'");
    expect_error("--no_shuffle=1", "--no-shuffle takes no value");
    expect_error("--Batch_size 8", "unknown flag '--Batch_size': did you mean --batch_size?");  // case counts

    f = parse_line("");
    Flags d = defaults();
    EXPECT(f.epochs == d.epochs && f.lr == d.lr && strcmp(f.data, d.data) == 0 && f.no_shuffle == 0,
           "no flags: every default stays");

    // Every mistake, in either spelling: one line, exit status 2.
    expect_error("--epochs=0", "--epochs expects an integer from 1 to 2147483647, got '0'");
    expect_error("--epochs 0", "--epochs expects an integer from 1 to 2147483647, got '0'");
    expect_error("--epochs=", "--epochs expects an integer from 1 to 2147483647, got ''");
    expect_error("--epochs=3x", "--epochs expects an integer");
    expect_error("--epochs=99999999999", "--epochs expects an integer");
    expect_error("--fail_rank=-2", "--fail_rank expects an integer from -1 to");
    expect_error("--lr=0", "--lr expects a number > 0, got '0'");
    expect_error("--lr=nan", "--lr expects a number > 0, got 'nan'");
    expect_error("--bucket_mb=-1", "--bucket_mb expects a number >= 0, got '-1'");
    expect_error("--device=tpu", "--device expects one of cpu|cuda|auto, got 'tpu'");
    expect_error("--device tpu", "--device expects one of cpu|cuda|auto, got 'tpu'");
    expect_error("--no-shuffle=1", "--no-shuffle takes no value");
    expect_error("--epoch=3", "unknown flag '--epoch': did you mean --epochs? (see --help)");
    expect_error("--epochs_x=3", "unknown flag '--epochs_x'");
    expect_error("--=3", "unknown flag '--' (see --help)");
    expect_error("--bogus 1", "unknown flag '--bogus' (see --help)");  // nothing close: no suggestion
    expect_error("--batchsize 8", "unknown flag '--batchsize': did you mean --batch_size?");
    expect_error("--learning-rate 0.1", "unknown flag '--learning-rate': did you mean --lr?");
    expect_error("--epochs", "--epochs expects a value (N)");
    // A few names are bounded above in every program: a typo must not become
    // a crash (libgomp at 100000 threads), an OOM kill or an int overflow.
    f = parse_line("--threads=1024 --batch_size 1048576 --init w.h5");
    EXPECT(f.threads == 1024 && f.batch_size == 1048576 && strcmp(f.init, "w.h5") == 0,
           "--threads 1024 and --batch_size 2^20 are allowed (got %d, %d)", f.threads, f.batch_size);
    expect_error("--threads=1025", "--threads expects an integer from 0 to 1024, got '1025'");
    expect_error("--batch_size 2147483647", "--batch_size expects an integer from 1 to 1048576, got '2147483647'");
    // A file name is never empty ('' means none only where a flag says so: --plot).
    expect_error("--init=", "--init expects a FILE.h5, got ''");
    expect_error("epochs=3", "unexpected argument 'epochs=3'");
    expect_error("-epochs=3", "unexpected argument '-epochs=3'");

    // args_suggest: the closest flag of the table, or NULL when none is close.
    int n = 0;
    double x = 0;
    const char *path = NULL;
    ArgSpec table[] = {
        {"data", ARG_PATH, &path, "DIR", "data", 0, NULL},
        {"total_epochs", ARG_INT, &n, "N", "passes", 1, NULL},
        {"batch_size", ARG_INT, &n, "N", "samples", 1, NULL},
        {"lr", ARG_FLOAT, &x, "X", "learning rate", 0, NULL},
        {"save_every", ARG_INT, &n, "N", "epochs between snapshots", 1, NULL},
        {"workers", ARG_INT, &n, "N", "readers", 0, NULL},
        {"no-shuffle", ARG_SWITCH, &n, NULL, "file order", 0, NULL},
    };
    static const struct {
        const char *given, *expected;  // expected NULL: no suggestion
    } cases[] = {
        {"epochs", "total_epochs"},    // a whole word of the flag (step 13's --total_epochs)
        {"epoch", "total_epochs"},     // the tutorial's name, by the synonym table
        {"total-epoch", "total_epochs"},
        {"batch-siez", "batch_size"},  // a swap of two letters is one edit
        {"batch", "batch_size"},
        {"bacth_size", "batch_size"},
        {"LR", "lr"},
        {"lrr", "lr"},
        {"learning_rate", "lr"},
        {"num_workers", "workers"},    // DataLoader's name
        {"worker", "workers"},
        {"data_dir", "data"},
        {"noshuffle", "no-shuffle"},
        {"hepl", "help"},
        {"save_every_n", "save_every"},
        {"bogus", NULL},
        {"x", NULL},
        {"", NULL},
        {"seed", NULL},                // nothing like it
        {"save", NULL},                // a short word of a longer flag is not enough
        {"device", NULL},
        {"shuffle_buffer_size_of_the_loader", NULL},
    };
    for (int i = 0; i < ARRAY_LEN(cases); i++) {
        const char *got = args_suggest(cases[i].given, strlen(cases[i].given), table, ARRAY_LEN(table));
        const char *want = cases[i].expected;
        EXPECT(want ? got && strcmp(got, want) == 0 : got == NULL, "args_suggest('%s') is %s (got %s)",
               cases[i].given, want ? want : "none", got ? got : "none");
    }
    // Only the first given_len characters count: the name before an '='.
    const char *name_and_value = "epochs=3";
    const char *got = args_suggest(name_and_value, 6, table, ARRAY_LEN(table));
    EXPECT(got && strcmp(got, "total_epochs") == 0, "args_suggest reads only the name of 'epochs=3' (got %s)",
           got ? got : "none");
    return test_summary();
}
