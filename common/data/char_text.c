// char_text.c: a text as characters. See char_text.h.
#include "data/char_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/paths.h"
#include "base/quote.h"

#define TEXT_MAX_BYTES ((long)1 << 31)  // tokens index windows with int offsets

static bool try_load(const char *path, int block_size, CharText *text, char *err, size_t err_size) {
    const char *shown = PATH_SHOWN(path);
    const char *problem = input_file_problem(path);
    if (problem) {
        snprintf(err, err_size, "%s: %s, not a text file", shown, problem);
        return false;
    }
    FILE *file = fopen(path, "rb");
    if (!file) {
        snprintf(err, err_size, "%s: cannot open: %s%s", shown, strerror(errno),
                 errno == ENOENT ? " (make shakespeare fetches Tiny Shakespeare)" : "");
        return false;
    }
    long capacity = 1 << 20, used = 0;
    uint8_t *bytes = xmalloc((size_t)capacity);
    for (;;) {
        if (used == capacity) {
            if (capacity >= TEXT_MAX_BYTES) {
                snprintf(err, err_size, "%s: larger than %ld bytes", shown, TEXT_MAX_BYTES);
                fclose(file), free(bytes);
                return false;
            }
            capacity *= 2;
            bytes = realloc(bytes, (size_t)capacity);
            CHECK(bytes, "out of memory reading %s", shown);
        }
        size_t got = fread(bytes + used, 1, (size_t)(capacity - used), file);
        used += (long)got;
        if (got == 0) break;
    }
    bool read_error = ferror(file);
    fclose(file);
    if (read_error) {
        snprintf(err, err_size, "%s: cannot read: %s", shown, strerror(errno));
        free(bytes);
        return false;
    }
    // The first 90% trains, the rest validates (prepare.py: data[:int(n * 0.9)]).
    long n_train = (long)(used * 0.9), n_val = used - n_train;
    if (used == 0 || n_train < block_size + 1 || n_val < block_size + 1) {
        snprintf(err, err_size, "%s: %ld characters, %ld to train and %ld to validate: each part needs at least "
                 "--block_size + 1 = %d (one window and the character after it)", shown, used, n_train, n_val, block_size + 1);
        free(bytes);
        return false;
    }
    bool present[256] = {false};
    for (long i = 0; i < used; i++) present[bytes[i]] = true;
    text->vocab_size = 0;
    for (int c = 0; c < 256; c++) {
        text->token_of[c] = present[c] ? text->vocab_size : -1;
        if (present[c]) text->chars[text->vocab_size++] = (unsigned char)c;
    }
    for (long i = 0; i < used; i++) bytes[i] = (uint8_t)text->token_of[bytes[i]];  // in place: characters become tokens
    text->tokens = bytes;
    text->n = used;
    text->n_train = n_train;
    return true;
}

CharText char_text_load(const char *dir, int block_size) {
    CharText text = {0};
    char path[4096], err[8192] = "";
    snprintf(path, sizeof path, "%s/input.txt", dir);
    bool ok = try_load(path, block_size, &text, err, sizeof err);
    check_all_ranks(ok, err);  // one line from one rank, and every rank leaves
    return text;
}

void char_text_free(CharText *text) {
    free(text->tokens);
    text->tokens = NULL;
}

long char_text_split_length(const CharText *text, TextSplit split) {
    return split == SPLIT_TRAIN ? text->n_train : text->n - text->n_train;
}

void char_text_draw_offsets(Rng *rng, long split_length, int block_size, int count, long *offsets) {
    // torch's random_from_to on the CPU: one 32-bit draw mod the range (which is below 2^32 here).
    uint32_t range = (uint32_t)(split_length - block_size);
    for (int i = 0; i < count; i++) offsets[i] = (long)(rng_next_u32(rng) % range);
}

void char_text_windows(const CharText *text, TextSplit split, const long *offsets, int count, int block_size,
                       int *inputs, int *targets) {
    const uint8_t *data = text->tokens + (split == SPLIT_TRAIN ? 0 : text->n_train);
    for (int b = 0; b < count; b++)
        for (int t = 0; t < block_size; t++) {
            inputs[b * block_size + t] = data[offsets[b] + t];
            targets[b * block_size + t] = data[offsets[b] + t + 1];
        }
}

bool char_text_encode(const CharText *text, const char *prompt, int *tokens, int *bad) {
    for (int i = 0; prompt[i]; i++) {
        int token = text->token_of[(unsigned char)prompt[i]];
        if (token < 0) {
            *bad = i;
            return false;
        }
        tokens[i] = token;
    }
    return true;
}

void char_text_decode(const CharText *text, const int *tokens, int count, char *out) {
    for (int i = 0; i < count; i++) out[i] = (char)text->chars[tokens[i]];
}
