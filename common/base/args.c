// args.c: flag parsing driven by a table. See args.h.
#include "base/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/paths.h"  // output_file_writable
#include "base/quote.h"  // QUOTE: a value echoed in a message stays one safe line

static void print_default(const ArgSpec *f, char *out, size_t size) {
    switch (f->type) {
    case ARG_INT:    snprintf(out, size, "%d", *(int *)f->value); break;
    case ARG_FLOAT:
    case ARG_FLOAT_GE: snprintf(out, size, "%g", *(double *)f->value); break;
    case ARG_SWITCH: snprintf(out, size, "off"); break;
    case ARG_PATH:
    case ARG_OUTPUT:
    case ARG_OUTPUT_OR_NONE:
    case ARG_STRING: {
        const char *s = *(const char **)f->value;
        snprintf(out, size, "%s", s ? (*s ? s : "''") : "none");
    } break;
    }
}

// Rank 0 prints the help (args sits below dist: it asks MPI, if it is running).
static bool rank_zero(void) {
    int initialized = 0, finalized = 0, rank = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank == 0;
}

static void print_help(const char *program, const ArgSpec *flags, int n_flags, const char *about) {
    if (!rank_zero()) return;
    printf("usage: %s [flags]\n  %s\n\nflags:\n", program, about);
    for (int i = 0; i < n_flags; i++) {
        const ArgSpec *f = &flags[i];
        char left[64], def[256];
        const char *meta = f->choices ? f->choices : f->metavar;
        snprintf(left, sizeof left, "--%s%s%s", f->name, meta ? " " : "", meta ? meta : "");
        print_default(f, def, sizeof def);
        printf("  %-26s %s (default: %s)\n", left, f->help, def);
    }
    printf("  %-26s %s\n", "--help", "show this message");
    fflush(stdout);
}

static int is_choice(const char *value, const char *choices) {
    size_t len = strlen(value);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        if (n == len && strncmp(c, value, n) == 0) return 1;
        c += n + (bar ? 1 : 0);
    }
    return 0;
}

// Upper bounds, by flag name, in every program: they keep a typo from
// becoming a crash, an out-of-memory kill or an integer overflow. No node has
// 1024 cores per rank; 2^20 MNIST samples are 3.3 GB of floats per rank; 2^20
// micro-batches or 2^30 steps are past any epoch; 256 reader workers with 64
// batches each ahead are past any DataLoader; zlib's levels end at 9; no
// embedding of step 15 needs 4096 columns; step 15's --synthetic writes at most
// 10^9 ratings: 40 times ml-25m, a file of about 30 GB, whose ratings one rank
// still counts in an int (the reader's and the sampler's counts) and holds in
// about 40 GB.
static const struct {
    const char *name;
    long max;
} upper_bounds[] = {
    {"threads", 1024}, {"batch_size", 1L << 20}, {"accum_steps", 1L << 20}, {"max_steps", 1L << 30},
    {"workers", 256},  {"prefetch", 64},     {"gzip", 9},  {"dim", 4096},
    {"synthetic", 1000000000L},
};

static long upper_bound(const char *name) {
    for (int i = 0; i < ARRAY_LEN(upper_bounds); i++)
        if (strcmp(upper_bounds[i].name, name) == 0) return upper_bounds[i].max;
    return 2147483647L;
}

// A path flag's value must be text (quote.h's first_non_text: no control byte, valid UTF-8, nothing
// that acts on the terminal): the programs print their paths in lines of output ("Loss curve: ...",
// "Checkpoint of step 10 saved in ..."), which such a byte would split or drive the terminal with.
static void require_text_path(const ArgSpec *f, const char *text) {
    size_t length = strlen(text), at = first_non_text(text, length);
    if (at < length)
        usage_error("--%s expects a path of text, got %s (byte %zu: a control byte, or not UTF-8)", f->name,
                    QUOTE(text), at);
}

static void set_value(const ArgSpec *f, const char *text) {
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case ARG_INT: {
        long v = strtol(text, &end, 10);
        long max = upper_bound(f->name);
        if (*text == '\0' || *end != '\0' || errno || v < f->min || v > max)
            usage_error("--%s expects an integer from %g to %ld, got %s", f->name, f->min, max, QUOTE(text));
        *(int *)f->value = (int)v;
    } break;
    case ARG_FLOAT:
    case ARG_FLOAT_GE: {
        double v = strtod(text, &end);
        bool at_least = f->type == ARG_FLOAT_GE;
        if (*text == '\0' || *end != '\0' || errno || !isfinite(v) || v < f->min || (v == f->min && !at_least))
            usage_error("--%s expects a number %s %g, got %s", f->name, at_least ? ">=" : ">", f->min, QUOTE(text));
        *(double *)f->value = v;
    } break;
    case ARG_STRING:
        if (f->choices && !is_choice(text, f->choices))
            usage_error("--%s expects one of %s, got %s", f->name, f->choices, QUOTE(text));
        *(const char **)f->value = text;
        break;
    case ARG_PATH:
    case ARG_OUTPUT:
        if (*text == '\0') usage_error("--%s expects a %s, got ''", f->name, f->metavar);
        require_text_path(f, text);
        *(const char **)f->value = text;
        break;
    case ARG_OUTPUT_OR_NONE:
        require_text_path(f, text);
        *(const char **)f->value = text;
        break;
    case ARG_SWITCH:
        *(int *)f->value = 1;
        break;
    }
}

// Rank 0, which writes the outputs (step 3's ranks write their plots into one
// folder), tries each of them; check_all_ranks gives every rank its verdict.
static void check_outputs(const ArgSpec *flags, int n_flags) {
    char message[PATH_MAX + 256] = "";
    bool ok = true, writer = rank_zero();
    for (int i = 0; i < n_flags && ok && writer; i++) {
        bool output = flags[i].type == ARG_OUTPUT || flags[i].type == ARG_OUTPUT_OR_NONE;
        const char *path = output ? *(const char **)flags[i].value : NULL;
        char why[PATH_MAX + 64];
        if (path && *path && !output_file_writable(path, why, sizeof why)) {
            // The path as it is: a flag's path is text (require_text_path; a default is the
            // program's own). The reason is quoted if it is not: it may name the folder of a
            // symbolic link's target, which no flag gave.
            snprintf(message, sizeof message, "--%s %s: %s", flags[i].name, path, PATH_SHOWN(why));
            ok = false;
        }
    }
    check_all_ranks(ok, message);
}

// Hyphens and underscores in a flag's name are one character: --batch-size is
// --batch_size, --no_shuffle is --no-shuffle (torchrun takes both spellings).
static char hyphen_as_underscore(char c) { return c == '-' ? '_' : c; }

// For the suggestions only, case aside too (a flag itself is case-sensitive).
static char fold(char c) {
    c = hyphen_as_underscore(c);
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static bool names_equal(const char *name, const char *given, size_t given_len) {
    if (strlen(name) != given_len) return false;
    for (size_t i = 0; i < given_len; i++)
        if (hyphen_as_underscore(name[i]) != hyphen_as_underscore(given[i])) return false;
    return true;
}

// Edit distance (optimal string alignment: an insertion, a deletion, a
// substitution or a swap of two neighbours each count 1), ignoring case and
// hyphen/underscore. Names longer than 63 characters are never close.
static int edit_distance(const char *a, size_t la, const char *b, size_t lb) {
    enum { MAX = 64 };
    if (la >= MAX || lb >= MAX) return MAX;
    int d[MAX][MAX];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int cost = fold(a[i - 1]) != fold(b[j - 1]);
            int best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]) &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

// Whether the shorter of two names (3 characters or more, and at least half
// the longer) starts a word of the longer: epochs in total_epochs, workers in
// num_workers, data in data_dir, batch in batch_size (but not save in
// save_every: a flag of its own, elsewhere).
static bool word_inside(const char *a, size_t la, const char *b, size_t lb) {
    if (la > lb) {
        const char *t = a; a = b; b = t;
        size_t n = la; la = lb; lb = n;
    }
    if (la < 3 || 2 * la < lb) return false;
    for (size_t at = 0; at + la <= lb; at++) {
        if (at > 0 && fold(b[at - 1]) != '_') continue;
        size_t k = 0;
        while (k < la && fold(a[k]) == fold(b[at + k])) k++;
        if (k == la) return true;
    }
    return false;
}

// Names that PyTorch scripts use for a flag of ours: the suggestion for them.
static const struct {
    const char *given, *ours;
} synonyms[] = {
    {"learning_rate", "lr"},
    {"epoch", "total_epochs"},  // step 13 (epochs in total_epochs is found by word_inside)
};

const char *args_suggest(const char *given, size_t given_len, const ArgSpec *flags, int n_flags) {
    const char *best = NULL;
    int best_score = INT_MAX;
    // Close in spelling: at most 1 edit in a name of up to 5 characters, 2 up to 8, 3 beyond.
    for (int k = 0; k <= n_flags; k++) {
        const char *name = k < n_flags ? flags[k].name : "help";
        size_t len = strlen(name), longer = len > given_len ? len : given_len;
        int limit = longer <= 5 ? 1 : longer <= 8 ? 2 : 3;
        int distance = edit_distance(given, given_len, name, len);
        int score = distance <= limit ? distance : word_inside(given, given_len, name, len) ? limit + 1 : INT_MAX;
        if (score < best_score) best = name, best_score = score;
    }
    for (int i = 0; !best && i < ARRAY_LEN(synonyms); i++)
        if (names_equal(synonyms[i].given, given, given_len))
            for (int k = 0; k < n_flags && !best; k++)
                if (strcmp(flags[k].name, synonyms[i].ours) == 0) best = flags[k].name;
    return best;
}

// Every flag's value as text, as Python's str() of the argparse attribute writes it (None, True,
// 0.001), for mlflow.log_params(vars(args)): the shortest decimal that reads back to the same double.
static void value_as_text(const ArgSpec *f, char *out, size_t size) {
    switch (f->type) {
    case ARG_INT:    snprintf(out, size, "%d", *(int *)f->value); break;
    case ARG_FLOAT:
    case ARG_FLOAT_GE: {
        double v = *(double *)f->value;
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(out, size, "%.*g", digits, v);
            if (strtod(out, NULL) == v) break;
        }
    } break;
    case ARG_SWITCH: snprintf(out, size, "%s", *(int *)f->value ? "True" : "False"); break;
    case ARG_PATH:
    case ARG_OUTPUT:
    case ARG_OUTPUT_OR_NONE:
    case ARG_STRING: {
        const char *s = *(const char **)f->value;
        snprintf(out, size, "%s", s ? s : "None");
    } break;
    }
}

static char **g_names, **g_values;
static int g_n_values;

ArgValues args_values(void) {
    return (ArgValues){g_n_values, (const char *const *)g_names, (const char *const *)g_values};
}

static void remember_values(const ArgSpec *flags, int n_flags) {
    for (int i = 0; i < g_n_values; i++) free(g_names[i]), free(g_values[i]);
    free(g_names), free(g_values);
    g_n_values = n_flags;
    g_names = xcalloc(n_flags > 0 ? (size_t)n_flags : 1, sizeof *g_names);
    g_values = xcalloc(n_flags > 0 ? (size_t)n_flags : 1, sizeof *g_values);
    for (int i = 0; i < n_flags; i++) {
        char text[4096];
        value_as_text(&flags[i], text, sizeof text);
        g_names[i] = xstrdup(flags[i].name);
        g_values[i] = xstrdup(text);
    }
}

// The names of the flags the last args_parse saw (NULL for the others), for
// args_given. The names, not the table: a table may live in a returned frame.
static const char **g_given;
static int g_n_flags;

bool args_given(const char *name) {
    for (int i = 0; i < g_n_flags; i++)
        if (g_given[i] && strcmp(g_given[i], name) == 0) return true;
    return false;
}

void args_parse(int argc, char **argv, const ArgSpec *flags, int n_flags, const char *about) {
    free(g_given);
    g_n_flags = n_flags;
    g_given = xcalloc(n_flags > 0 ? (size_t)n_flags : 1, sizeof *g_given);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            print_help(argv[0], flags, n_flags, about);
            MPI_Finalize();
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) usage_error("unexpected argument %s", QUOTE(arg));
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);

        const ArgSpec *f = NULL;
        for (int k = 0; k < n_flags && !f; k++)
            if (names_equal(flags[k].name, name, name_len)) f = &flags[k];
        if (!f && names_equal("help", name, name_len)) usage_error("--help takes no value");
        if (!f) {
            // The flag as given ("--name", without its "=value"), quoted: it may hold anything.
            const char *given = QUOTE_N(arg, name_len + 2);
            const char *suggestion = args_suggest(name, name_len, flags, n_flags);
            if (suggestion) usage_error("unknown flag %s: did you mean --%s?", given, suggestion);
            usage_error("unknown flag %s", given);
        }
        g_given[f - flags] = f->name;

        if (f->type == ARG_SWITCH) {
            if (eq) usage_error("--%s takes no value", f->name);
            set_value(f, "");
        } else if (eq) {
            set_value(f, eq + 1);
        } else if (i + 1 < argc) {
            set_value(f, argv[++i]);
        } else {
            usage_error("--%s expects a value (%s)", f->name, f->choices ? f->choices : f->metavar);
        }
    }
    check_outputs(flags, n_flags);
    remember_values(flags, n_flags);
}
