// char_text.h: a text as characters, for a character-level language model (step 19).
//
// As nanoGPT's data/shakespeare_char/prepare.py: the vocabulary is the text's distinct characters,
// sorted (65 for Tiny Shakespeare), each character's token its index there; the first 90% of the
// text trains (int(n * 0.9) characters), the rest validates. Characters are the file's bytes: for
// an ASCII text such as Tiny Shakespeare these are prepare.py's characters exactly.
//
// Batches are windows, as nanoGPT's get_batch draws them: offsets from
// torch.randint(len(split) - block_size, (count,)), each giving block_size inputs and the
// block_size characters after them as targets. The project's generator is PyTorch's (rng.h), and
// torch draws each offset as one 32-bit number mod the range, so the same seed gives the same
// windows in the twin.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "base/rng.h"

typedef struct {
    int vocab_size;
    unsigned char chars[256];  // itos: token -> character
    int token_of[256];         // stoi: character -> token, -1 for one the text does not have
    uint8_t *tokens;           // [n]: the whole text as tokens
    long n, n_train;           // characters in all, and in the training split (the first 90%)
} CharText;

typedef enum { SPLIT_TRAIN, SPLIT_VAL } TextSplit;

// Read DIR/input.txt. Every rank reads the same file: a missing, unreadable or empty file, or one
// whose train or validation split is shorter than block_size + 1 characters (no window fits), ends
// every rank with one line naming it (exit 1; check_all_ranks). Collective.
CharText char_text_load(const char *dir, int block_size);
void char_text_free(CharText *text);
long char_text_split_length(const CharText *text, TextSplit split);

// offsets[0..count) = torch.randint(split_length - block_size, (count,), generator=rng).
void char_text_draw_offsets(Rng *rng, long split_length, int block_size, int count, long *offsets);
// The windows at offsets[0..count) of the split: inputs and targets [count * block_size].
void char_text_windows(const CharText *text, TextSplit split, const long *offsets, int count, int block_size,
                       int *inputs, int *targets);

// The tokens of `prompt` (a --sample prompt), into tokens[strlen(prompt)]; false when a character
// is not in the vocabulary, with *bad its position.
bool char_text_encode(const CharText *text, const char *prompt, int *tokens, int *bad);
// The characters of tokens[count], into out[count] (no NUL added): nanoGPT's decode().
void char_text_decode(const CharText *text, const int *tokens, int count, char *out);
