#!/usr/bin/env bash
# Put Tiny Shakespeare (input.txt) in DIR (default data/shakespeare) and verify its md5: the
# character-level text of step 19 (day5/19_gpt), as nanoGPT's data/shakespeare_char/prepare.py takes it.
#
#   data/fetch_shakespeare.sh [DIR]                                # download from char-rnn's repository
#   SHAKESPEARE_MIRROR=/path/to/folder data/fetch_shakespeare.sh   # copy from a local folder (offline)
#   SHAKESPEARE_MIRROR=https://host/path data/fetch_shakespeare.sh # another mirror of input.txt
#
# The file is char-rnn's (karpathy/char-rnn, data/tinyshakespeare/input.txt), the one nanoGPT
# downloads: 1,115,394 bytes of plays by Shakespeare (public domain), 65 distinct characters. A file
# already present with the right md5 is kept. The text is never part of this repository.
set -euo pipefail

dest=${1:-data/shakespeare}
mirror=${SHAKESPEARE_MIRROR:-https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare}
file=input.txt
expected_md5=6fb458f1232090904fb40fe944165e91

md5_ok() { [ -f "$1" ] && [ "$(md5sum < "$1" | cut -d' ' -f1)" = "$expected_md5" ]; }

mkdir -p "$dest"
target="$dest/$file"
if md5_ok "$target"; then
    echo "ok       $target (md5 verified, kept)"
    exit 0
fi
if [[ "$mirror" != *://* ]]; then  # a local folder
    [ -d "$mirror" ] || { echo "error: SHAKESPEARE_MIRROR=$mirror is not a folder (expected one holding $file)" >&2; exit 1; }
    [ -f "$mirror/$file" ] || { echo "error: $mirror/$file not found (SHAKESPEARE_MIRROR must hold $file)" >&2; exit 1; }
    cp "$mirror/$file" "$target.part"
elif command -v curl > /dev/null; then
    curl -fsSL --retry 3 -o "$target.part" "$mirror/$file" ||
        { echo "error: cannot download $mirror/$file (offline? set SHAKESPEARE_MIRROR=DIR to copy from a folder)" >&2; rm -f "$target.part"; exit 1; }
elif command -v wget > /dev/null; then
    wget -q -O "$target.part" "$mirror/$file" ||
        { echo "error: cannot download $mirror/$file (offline? set SHAKESPEARE_MIRROR=DIR to copy from a folder)" >&2; rm -f "$target.part"; exit 1; }
else
    echo "error: need curl or wget to download Tiny Shakespeare (or set SHAKESPEARE_MIRROR=DIR)" >&2
    exit 1
fi
if ! md5_ok "$target.part"; then
    echo "error: $file from $mirror has the wrong md5 (expected $expected_md5); not kept" >&2
    rm -f "$target.part"
    exit 1
fi
mv "$target.part" "$target"
echo "fetched  $target (md5 verified)"
