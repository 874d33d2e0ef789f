// quote.h: untrusted text, quoted safely inside a one-line message.
//
//   usage_error("--device expects one of cpu|cuda|auto, got %s", QUOTE(value));
//   // error: --device expects one of cpu|cuda|auto, got 'cu\nda\x1b[2J' (see --help)
//
// A message that echoes what a user or a file gave us (a flag's value, a CSV
// line) must stay one line and must not drive the terminal: a raw "\n" splits
// the refusal in two, "\r" overwrites it, and "\x1b[2J" clears the screen. So
// the quotation
// - is wrapped in single quotes, which it owns: 'text';
// - holds at most QUOTE_PREFIX bytes of the text, then "..." and the text's
//   whole length: 'aaaa...' (5008 bytes), so a megabyte-long line stays a line;
// - escapes every control byte (\n, \r, \t, \\ for a backslash itself, \xNN
//   for the others: \x00, \x1b, \x7f), and every byte >= 0x80 that is not part
//   of valid UTF-8 (or that encodes a C1 control, U+0080..U+009F, which some
//   terminals obey as 8-bit controls; or a line separator or bidirectional
//   override, U+2028/9, U+202A..E, U+2066..9, which reorder or split what the
//   reader sees). Valid UTF-8 otherwise stays as it is: a title "Amélie" reads
//   as Amélie. The text may hold NUL bytes: it is given by its length.
//
// Layer 1, beside check: no dependencies of ours.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define QUOTE_PREFIX 60  // bytes of the text shown at most
// Enough for any quotation: 60 bytes, each escaped to at most 4 characters,
// the quotes, "...", " (N bytes)" with N up to 20 digits, and the NUL.
#define QUOTE_SIZE (2 + 4 * QUOTE_PREFIX + 3 + 32 + 1)

// Writes the quotation of text[0..len) into out (QUOTE_SIZE bytes are always
// enough; a smaller buffer gets a shorter, still NUL-terminated and still safe,
// quotation) and returns out.
const char *quote_text(char *out, size_t out_size, const char *text, size_t len);

// The offset of the first byte of text[0..len) that is not text, as quote_text
// sees it (a control byte, a byte that is not valid UTF-8, a character that acts
// on the terminal: the ones it escapes, a backslash aside), or len when there is
// none. A CSV row must be text (movielens.c), and a path in a message is shown
// bare when it is text and quoted when not (args.c).
size_t first_non_text(const char *text, size_t len);

// `text` itself when it is text throughout (first_non_text), however long;
// otherwise its quotation, written into out. For a path in a message: shown
// bare as ever when it is an ordinary name, escaped and bounded when it holds a
// newline or an escape sequence.
const char *quote_unless_text(char *out, size_t out_size, const char *text);

// Text of many lines shown whole and safe (a generated sample, whose characters came from a file):
// newlines and tabs as they are, and every other character that quote_text escapes (control
// bytes, bytes that are not UTF-8, characters that act on the terminal) escaped as it does;
// backslashes as they are. Writes into out, which must hold 4 len + 1 bytes, and returns it.
char *escape_lines(char *out, const char *text, size_t len);

// A NUL-terminated string, quoted into a buffer that lives until the end of the
// enclosing block (a compound literal): use it in a message's arguments.
#define QUOTE(text) quote_text((char[QUOTE_SIZE]){0}, QUOTE_SIZE, (text), strlen(text))
// The same for `len` bytes (which may hold NUL bytes).
#define QUOTE_N(text, len) quote_text((char[QUOTE_SIZE]){0}, QUOTE_SIZE, (text), (len))
// A path (or other text) shown bare when it is text, quoted when not (quote_unless_text).
#define PATH_SHOWN(text) quote_unless_text((char[QUOTE_SIZE]){0}, QUOTE_SIZE, (text))
