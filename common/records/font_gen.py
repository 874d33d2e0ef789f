#!/usr/bin/env python3
"""font_gen.py: turn X11 misc-fixed bitmap fonts into common/records/font.h.

    apt-get install -y xfonts-base          # Debian/Ubuntu: the .pcf.gz files
    python3 common/records/font_gen.py > common/records/font.h

The misc-fixed fonts carry the property COPYRIGHT "Public domain font.  Share
and enjoy." We embed printable ASCII (32..126) of two of them, so plot.c needs
no font library and draws the same pixels on every machine:

    7x13    -Misc-Fixed-Medium-R-Normal--13-120-75-75-C-70-ISO10646-1  (body text)
    9x15B   -Misc-Fixed-Bold-R-Normal--15-140-75-75-C-90-ISO10646-1    (titles)
    5x8     -Misc-Fixed-Medium-R-Normal--8-80-75-75-C-50-ISO10646-1    (labels in tight places:
                                                                        a timeline's blocks)

The PCF reader below handles what these files use (uncompressed or compressed
metrics, any glyph padding, either byte/bit order); it is not a general one.
Layout reference: https://fontforge.org/docs/techref/pcf-format.html
"""
import gzip
import struct
import sys

FONT_DIR = "/usr/share/fonts/X11/misc"
FONTS = [("FONT_BODY", "7x13"), ("FONT_TITLE", "9x15B"), ("FONT_SMALL", "5x8")]
FIRST, LAST = 32, 126

PCF_PROPERTIES, PCF_ACCELERATORS, PCF_METRICS, PCF_BITMAPS, PCF_BDF_ENCODINGS = (
    1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 5)
PCF_COMPRESSED_METRICS = 0x100


class Table:
    """One PCF table: a cursor that reads with the table's own byte order."""

    def __init__(self, data, offset):
        self.data, self.pos = data, offset
        (self.format,) = struct.unpack_from("<I", data, offset)  # always little-endian
        self.pos += 4
        self.endian = ">" if self.format & (1 << 2) else "<"

    def read(self, fmt):
        values = struct.unpack_from(self.endian + fmt, self.data, self.pos)
        self.pos += struct.calcsize(self.endian + fmt)
        return values if len(values) > 1 else values[0]


def load_pcf(path):
    data = gzip.open(path).read()
    assert data[:4] == b"\x01fcp", f"{path}: not a PCF font"
    (count,) = struct.unpack_from("<I", data, 4)
    toc = {}
    for i in range(count):
        kind, _fmt, _size, offset = struct.unpack_from("<IIII", data, 8 + 16 * i)
        toc[kind] = offset

    # Properties: name -> value (the strings live in a pool after the entries).
    t = Table(data, toc[PCF_PROPERTIES])
    nprops = t.read("i")
    entries = [t.read("ibi") for _ in range(nprops)]
    t.pos += (4 - nprops % 4) % 4
    t.read("i")  # size of the string pool
    pool = t.pos

    def cstring(at):
        return data[pool + at:data.index(b"\0", pool + at)].decode("latin-1")

    props = {cstring(name): (cstring(value) if is_string else value)
             for name, is_string, value in entries}

    # Accelerators: the font-wide ascent and descent (the cell's height).
    t = Table(data, toc[PCF_ACCELERATORS])
    t.read("8B")  # flags we do not need
    ascent, descent = t.read("2i")

    # Metrics per glyph: left/right bearing, advance, ascent, descent.
    t = Table(data, toc[PCF_METRICS])
    if t.format & PCF_COMPRESSED_METRICS:
        metrics = [tuple(b - 0x80 for b in t.read("5B")) for _ in range(t.read("h"))]
    else:
        metrics = [t.read("6h")[:5] for _ in range(t.read("i"))]

    # Bitmaps: rows padded to 1 << (format & 3) bytes.
    t = Table(data, toc[PCF_BITMAPS])
    nglyphs = t.read("i")
    offsets = [t.read("i") for _ in range(nglyphs)]
    t.read("4i")  # bitmap sizes for each padding; we only need ours
    bitmap_base, pad = t.pos, 1 << (t.format & 3)
    msbit_first = bool(t.format & (1 << 3))

    # Encodings: code point -> glyph index (0xffff: none).
    t = Table(data, toc[PCF_BDF_ENCODINGS])
    min2, max2, min1, _max1, _default = t.read("5h")
    index_table = t.pos

    def glyph_index(code):
        row, col = code >> 8, code & 0xFF
        slot = (row - min1) * (max2 - min2 + 1) + (col - min2)
        return struct.unpack_from(t.endian + "H", data, index_table + 2 * slot)[0]

    width = metrics[glyph_index(ord("M"))][2]
    height = ascent + descent
    glyphs = []
    for code in range(FIRST, LAST + 1):
        g = glyph_index(code)
        lsb, rsb, advance, g_ascent, g_descent = metrics[g]
        assert advance == width, f"{path}: not monospaced at {code}"
        row_bytes = ((rsb - lsb + 7) // 8 + pad - 1) // pad * pad
        rows = [0] * height
        for r in range(g_ascent + g_descent):
            at = bitmap_base + offsets[g] + r * row_bytes
            for c in range(rsb - lsb):
                byte = data[at + c // 8]
                bit = (byte >> (7 - c % 8)) & 1 if msbit_first else (byte >> (c % 8)) & 1
                x, y = lsb + c, ascent - g_ascent + r
                if bit and 0 <= x < width and 0 <= y < height:
                    rows[y] |= 1 << (width - 1 - x)  # leftmost pixel = highest bit
        glyphs.append(rows)
    return props, width, height, glyphs


def main():
    out = sys.stdout
    out.write("// font.h: GENERATED by common/records/font_gen.py from Debian's xfonts-base. Do not edit.\n"
              "//\n"
              "// Bitmap fonts for printable ASCII 32..126, from the X11 misc-fixed family.\n"
              "// Licence (the fonts' COPYRIGHT property): \"Public domain font.  Share and enjoy.\"\n"
              "//\n"
              "// glyphs[(c - 32) * height + row] is one row of character c, top row first;\n"
              "// bit (width - 1 - x) is pixel x, so the leftmost pixel is the highest bit.\n"
              "#pragma once\n#include <stdint.h>\n\n"
              "typedef struct {\n    int width, height;        // every glyph is one cell of this size\n"
              "    const uint16_t *glyphs;\n} BitmapFont;\n")
    for name, file in FONTS:
        props, width, height, glyphs = load_pcf(f"{FONT_DIR}/{file}.pcf.gz")
        assert width <= 16
        out.write(f"\n// {props['FONT']}\n// {props.get('COPYRIGHT', '')}\n")
        out.write(f"enum {{ {name}_WIDTH = {width}, {name}_HEIGHT = {height} }};\n")
        out.write(f"static const uint16_t {name.lower()}_glyphs[{LAST - FIRST + 1} * {height}] = {{\n")
        for code, rows in zip(range(FIRST, LAST + 1), glyphs):
            out.write(f"    /* {repr(chr(code)):>5} */ " + ",".join(f"0x{r:03x}" for r in rows) + ",\n")
        out.write("};\n")
        out.write(f"static const BitmapFont {name} = {{{name}_WIDTH, {name}_HEIGHT, "
                  f"{name.lower()}_glyphs}};\n")


if __name__ == "__main__":
    main()
