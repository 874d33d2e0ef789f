// test_quote.c: common/base/quote.c, the quotation of untrusted text in a message.
//
// - plain text is kept, between single quotes;
// - every control byte is escaped (\n \r \t, \xNN for NUL, ESC, DEL, the
//   others), and a backslash itself, so that the quotation reads back unambiguously;
// - UTF-8 is kept when valid, and escaped byte by byte when not (a lone
//   continuation, a truncated sequence, an overlong form, a surrogate, past
//   U+10FFFF) or when it encodes a C1 control or a bidirectional override;
// - at most QUOTE_PREFIX bytes of the text, then "..." and the whole length,
//   never cutting a character in two;
// - whatever the input (every byte value, long runs of escapes), the result is
//   one line of printable ASCII or valid UTF-8, within QUOTE_SIZE;
// - first_non_text finds where a CSV row stops being text; quote_unless_text
//   shows a path bare when it is text, and quotes it when not;
// - escape_lines shows a text of many lines whole: its newlines, tabs and
//   backslashes as they are, the rest escaped as in a quotation.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/quote.h"

#define TEST_NAME "test_quote"
#include "test.h"

static void expect_quote(const char *text, size_t len, const char *want, const char *what) {
    char out[QUOTE_SIZE];
    quote_text(out, sizeof out, text, len);
    EXPECT(strcmp(out, want) == 0, "%s: %s (want %s)", what, out, want);
}

// Whether s holds no byte below 0x20, no DEL, and no ESC-like C1 byte sequence.
static bool one_safe_line(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7F) return false;
        if (p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F) return false;
    }
    return true;
}

int main(void) {
    expect_quote("0", 1, "'0'", "a plain value");
    expect_quote("", 0, "''", "the empty string");
    expect_quote("cu\nda", 5, "'cu\\nda'", "a newline");
    expect_quote("a\r\tb", 4, "'a\\r\\tb'", "a carriage return and a tab");
    expect_quote("\x1b[2J", 4, "'\\x1b[2J'", "ESC [2J (clear the screen)");
    expect_quote("4,1\0x", 5, "'4,1\\x00x'", "a NUL byte inside the text");
    expect_quote("\x7f\x01", 2, "'\\x7f\\x01'", "DEL and SOH");
    expect_quote("C:\\n", 4, "'C:\\\\n'", "a backslash is doubled, so that it never reads as an escape");
    expect_quote("it's", 4, "'it's'", "a single quote is kept (the quotation ends at the last one)");

    expect_quote("Am\xc3\xa9lie", 7, "'Am\xc3\xa9lie'", "valid 2-byte UTF-8 is kept");
    expect_quote("\xe2\x82\xac \xf0\x9f\x8e\xac", 8, "'\xe2\x82\xac \xf0\x9f\x8e\xac'", "valid 3- and 4-byte UTF-8 are kept");
    expect_quote("\x80x", 2, "'\\x80x'", "a lone continuation byte is escaped");
    expect_quote("\xc3", 1, "'\\xc3'", "a sequence cut by the end of the text is escaped");
    expect_quote("\xc3(", 2, "'\\xc3('", "a lead byte without its continuation is escaped, the next byte kept");
    expect_quote("\xc0\xaf", 2, "'\\xc0\\xaf'", "an overlong '/' is escaped");
    expect_quote("\xed\xa0\x80", 3, "'\\xed\\xa0\\x80'", "a surrogate (U+D800) is escaped");
    expect_quote("\xf4\x90\x80\x80", 4, "'\\xf4\\x90\\x80\\x80'", "past U+10FFFF is escaped");
    expect_quote("\xff\xfe", 2, "'\\xff\\xfe'", "bytes that never start UTF-8 are escaped");
    expect_quote("\xc2\x9b" "2J", 4, "'\\xc2\\x9b2J'", "U+009B (CSI, a C1 control) is escaped");
    expect_quote("a\xe2\x80\xae" "b", 5, "'a\\xe2\\x80\\xaeb'", "U+202E (right-to-left override) is escaped");
    expect_quote("a\xe2\x80\xa8" "b", 5, "'a\\xe2\\x80\\xa8b'", "U+2028 (line separator) is escaped");

    // The bound: 60 bytes shown, then the whole length.
    char long_text[5008];
    memset(long_text, '1', sizeof long_text);
    char want[128];
    snprintf(want, sizeof want, "'%.*s...' (5008 bytes)", QUOTE_PREFIX, long_text);
    expect_quote(long_text, sizeof long_text, want, "5008 bytes: the first 60, then the length");
    snprintf(want, sizeof want, "'%.*s'", QUOTE_PREFIX, long_text);
    expect_quote(long_text, QUOTE_PREFIX, want, "exactly 60 bytes: whole, no '...'");
    // 59 ASCII bytes and a 2-byte character: the character would pass byte 60, so it is left out whole.
    char cut[64];
    memset(cut, 'a', 59);
    memcpy(cut + 59, "\xc3\xa9z", 3);
    snprintf(want, sizeof want, "'%.59s...' (62 bytes)", cut);
    expect_quote(cut, 62, want, "a character across byte 60 is not cut in two");

    // Every byte value, and the worst case for the length (60 escapes of 4 characters).
    char all[256];
    for (int b = 0; b < 256; b++) all[b] = (char)b;
    bool safe = true, bounded = true;
    for (size_t start = 0; start < 256; start++) {
        char out[QUOTE_SIZE + 16];
        memset(out, 'Z', sizeof out);
        quote_text(out, QUOTE_SIZE, all + start, 256 - start);
        safe = safe && one_safe_line(out);
        bounded = bounded && memchr(out, '\0', QUOTE_SIZE) != NULL && out[QUOTE_SIZE] == 'Z';
    }
    EXPECT(safe && bounded, "every suffix of bytes 0..255: one line, no control byte, within QUOTE_SIZE");
    char escapes[300];
    memset(escapes, 0x1b, sizeof escapes);
    char out[QUOTE_SIZE];
    quote_text(out, sizeof out, escapes, sizeof escapes);
    EXPECT(strlen(out) == 2 + 4 * QUOTE_PREFIX + 3 + strlen(" (300 bytes)") && one_safe_line(out),
           "300 ESC bytes: 60 shown as \\x1b, the length after (%zu characters)", strlen(out));
    // A buffer too small for the whole quotation: cut short, still terminated and safe.
    char small[40];
    quote_text(small, sizeof small, escapes, sizeof escapes);
    EXPECT(strlen(small) < sizeof small && one_safe_line(small), "a 40-byte buffer: %s", small);

    // first_non_text: where a CSV row stops being text (movielens.c refuses it there).
    EXPECT(first_non_text("4,1259,4.0,964538728", 20) == 20, "a ratings row is text");
    static const char title[] = "1,Am\xc3\xa9lie (2001),Comedy|Romance\\";
    EXPECT(first_non_text(title, sizeof title - 1) == sizeof title - 1,
           "a title with UTF-8 and a backslash is text");
    EXPECT(first_non_text("4,1259,4.0,964538728\0garbage", 28) == 20, "a NUL byte: not text from byte 20");
    EXPECT(first_non_text("1,\x1b[2J,5", 10) == 2, "ESC: not text");
    EXPECT(first_non_text("1,2\r,5", 6) == 3, "a carriage return inside a row: not text");
    EXPECT(first_non_text("1,Am\xe9lie", 10) == 4, "Latin-1 (not UTF-8): not text");
    EXPECT(first_non_text("a\xc2\x9b", 3) == 1, "a C1 control in UTF-8: not text");

    // quote_unless_text: a path shown bare when it is text, however long; quoted when not.
    char long_path[300];
    memset(long_path, 'd', sizeof long_path - 1);
    long_path[0] = '/', long_path[sizeof long_path - 1] = '\0';
    char buffer[QUOTE_SIZE];
    EXPECT(quote_unless_text(buffer, sizeof buffer, long_path) == long_path, "a 299-byte path of text is shown bare, whole");
    EXPECT(strcmp(quote_unless_text(buffer, sizeof buffer, "data/\x1b[2J"), "'data/\\x1b[2J'") == 0,
           "a path holding ESC is quoted: %s", buffer);

    // escape_lines: a sample of many lines, whole, its newlines, tabs and backslashes as they are.
    static const char sample[] = "ROMEO:\n\tAm\xc3\xa9lie \\ \x1b[2J\x00\xff\xc2\x9b\r!";
    char lines[4 * sizeof sample + 1];
    escape_lines(lines, sample, sizeof sample - 1);
    EXPECT(strcmp(lines, "ROMEO:\n\tAm\xc3\xa9lie \\ \\x1b[2J\\x00\\xff\\xc2\\x9b\\r!") == 0,
           "escape_lines keeps lines, tabs, UTF-8 and backslashes, escapes ESC, NUL, a stray byte, C1 and CR: %s", QUOTE(lines));
    char every[256], every_shown[4 * 256 + 1];
    for (int b = 0; b < 256; b++) every[b] = (char)b;
    escape_lines(every_shown, every, sizeof every);
    bool lines_safe = true;
    for (const unsigned char *p = (const unsigned char *)every_shown; *p; p++)
        lines_safe = lines_safe && (*p >= 0x20 || *p == '\n' || *p == '\t') && *p != 0x7F && *p < 0x80;
    EXPECT(lines_safe && strlen(every_shown) <= 4 * 256, "escape_lines of every byte value: ASCII, no control byte but "
           "newline and tab, within 4 bytes a byte (%zu)", strlen(every_shown));
    return test_summary();
}
