// quote.c: untrusted text, quoted safely inside a one-line message. See quote.h.
#include "base/quote.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

// The length (2..4) of the valid UTF-8 sequence at s[0..len), or 0 if it is not
// one: no stray continuation byte, no overlong form, no surrogate, nothing past
// U+10FFFF. The code point goes to *code.
static size_t utf8_sequence(const unsigned char *s, size_t len, uint32_t *code) {
    unsigned char b = s[0];
    size_t n;
    uint32_t c, min;
    if (b >= 0xC2 && b <= 0xDF) n = 2, c = b & 0x1F, min = 0x80;
    else if (b >= 0xE0 && b <= 0xEF) n = 3, c = b & 0x0F, min = 0x800;
    else if (b >= 0xF0 && b <= 0xF4) n = 4, c = b & 0x07, min = 0x10000;
    else return 0;  // 0x80..0xC1 (a continuation, or an overlong lead) and 0xF5..0xFF never start one
    if (n > len) return 0;
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[k] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *code = c;
    return n;
}

// Code points that are valid UTF-8 and still act on the terminal or on how the
// line reads: C1 controls (U+009B is CSI, as ESC [ is), line and paragraph
// separators, bidirectional embeddings, overrides and isolates.
static bool acts_on_terminal(uint32_t c) {
    return (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || (c >= 0x202A && c <= 0x202E) ||
           (c >= 0x2066 && c <= 0x2069);
}

// How the character at t[0..len) is shown: its bytes (the count is returned)
// become piece[0..*n), either themselves or escaped.
static size_t show(const unsigned char *t, size_t len, char piece[16], size_t *n) {
    unsigned char b = t[0];
    uint32_t code = 0;
    size_t used = 1;
    *n = 0;
    if (b == '\n') *n = (size_t)snprintf(piece, 16, "\\n");
    else if (b == '\r') *n = (size_t)snprintf(piece, 16, "\\r");
    else if (b == '\t') *n = (size_t)snprintf(piece, 16, "\\t");
    else if (b == '\\') *n = (size_t)snprintf(piece, 16, "\\\\");
    else if (b < 0x20 || b == 0x7F) *n = (size_t)snprintf(piece, 16, "\\x%02x", b);
    else if (b < 0x80) piece[0] = (char)b, *n = 1;
    else if ((used = utf8_sequence(t, len, &code)) == 0) {
        used = 1;  // not UTF-8: the byte alone, escaped
        *n = (size_t)snprintf(piece, 16, "\\x%02x", b);
    } else if (acts_on_terminal(code)) {
        for (size_t k = 0; k < used; k++) *n += (size_t)snprintf(piece + *n, 16 - *n, "\\x%02x", t[k]);
    } else {
        memcpy(piece, t, used), *n = used;
    }
    return used;
}

size_t first_non_text(const char *text, size_t len) {
    const unsigned char *t = (const unsigned char *)text;
    for (size_t at = 0; at < len;) {
        // Printable ASCII, nearly all of a CSV row, in a tight loop: every row of ratings.csv
        // (25 million in ml-25m) comes through here.
        while (at < len && t[at] >= 0x20 && t[at] < 0x7F) at++;
        if (at == len) break;
        char piece[16];
        size_t n, used = show(t + at, len - at, piece, &n);
        if (n != used) return at;  // escaped: not text
        at += used;
    }
    return len;
}

const char *quote_text(char *out, size_t out_size, const char *text, size_t len) {
    if (out_size == 0) return out;
    // Room kept for the end, at most: "...' (", 20 digits, " bytes)" and the NUL.
    enum { RESERVE = 6 + 20 + 7 + 1 };
    const unsigned char *t = (const unsigned char *)text;
    size_t at = 0, written = 0;
    bool room = out_size > 1 + RESERVE;
    if (room) out[written++] = '\'';
    while (room && at < len) {
        char piece[16];
        size_t n, used = show(t + at, len - at, piece, &n);
        // The prefix ends at QUOTE_PREFIX bytes of the text, never inside a character.
        if (at + used > QUOTE_PREFIX || written + n + RESERVE > out_size) break;
        memcpy(out + written, piece, n);
        written += n;
        at += used;
    }
    if (at < len || !room)
        snprintf(out + written, out_size - written, "%s...' (%zu bytes)", room ? "" : "'", len);
    else
        snprintf(out + written, out_size - written, "'");
    return out;
}

char *escape_lines(char *out, const char *text, size_t len) {
    const unsigned char *t = (const unsigned char *)text;
    size_t written = 0;
    for (size_t at = 0; at < len;) {
        char piece[16];
        size_t n, used = show(t + at, len - at, piece, &n);
        if (t[at] == '\n' || t[at] == '\t' || t[at] == '\\') piece[0] = (char)t[at], n = 1;  // shown as they are
        memcpy(out + written, piece, n);  // (at most 4 bytes per byte of the text: \xNN)
        written += n;
        at += used;
    }
    out[written] = '\0';
    return out;
}

const char *quote_unless_text(char *out, size_t out_size, const char *text) {
    size_t len = strlen(text);
    return first_non_text(text, len) == len ? text : quote_text(out, out_size, text, len);
}
