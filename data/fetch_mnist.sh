#!/usr/bin/env bash
# Put the four MNIST files in DIR (default data/mnist) and verify their md5s.
#
#   data/fetch_mnist.sh [DIR]                              # download from the public mirror
#   MNIST_MIRROR=/path/to/folder data/fetch_mnist.sh       # copy from a local folder (offline)
#   MNIST_MIRROR=https://host/path data/fetch_mnist.sh     # another mirror
#
# Files already present with the right md5 are kept. The md5s are those of the
# canonical LeCun gzip files, so any mirror of them passes.
#
# Each file is then unpacked beside its .gz (as torchvision keeps raw/ beside the archives):
# the programs read the plain file where there is one, and so skip inflating 55 MB at every
# start (0.1-0.2 s of each run on 2 cores; the tests start some 400). The .gz alone suffice.
set -euo pipefail

dest=${1:-data/mnist}
mirror=${MNIST_MIRROR:-https://ossci-datasets.s3.amazonaws.com/mnist}

declare -A md5=(
    [train-images-idx3-ubyte.gz]=f68b3c2dcbeaaa9fbdd348bbdeb94873
    [train-labels-idx1-ubyte.gz]=d53e105ee54ea40749a09fcbcd1e9432
    [t10k-images-idx3-ubyte.gz]=9fb629c4189551a2d022fa330f9573f3
    [t10k-labels-idx1-ubyte.gz]=ec29112dd5afa0611ce80d1b7f02629c
)
declare -A unpacked_md5=(
    [train-images-idx3-ubyte]=6bbc9ace898e44ae57da46a324031adb
    [train-labels-idx1-ubyte]=a25bea736e30d166cdddb491f175f624
    [t10k-images-idx3-ubyte]=2646ac647ad5339dbf082846283269ea
    [t10k-labels-idx1-ubyte]=27ae3e4e09519cfbb04c329615203637
)

md5_ok() { [ -f "$1" ] && [ "$(md5sum < "$1" | cut -d' ' -f1)" = "$2" ]; }

mkdir -p "$dest"
for file in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    target="$dest/$file"
    if md5_ok "$target" "${md5[$file]}"; then
        echo "ok       $target (md5 verified, kept)"
        continue
    fi
    if [[ "$mirror" != *://* ]]; then  # a local folder
        [ -d "$mirror" ] || { echo "error: MNIST_MIRROR=$mirror is not a folder (expected one holding the four .gz files)" >&2; exit 1; }
        [ -f "$mirror/$file" ] || { echo "error: $mirror/$file not found (MNIST_MIRROR must hold the four .gz files)" >&2; exit 1; }
        cp "$mirror/$file" "$target.part"
    elif command -v curl > /dev/null; then
        curl -fsSL --retry 3 -o "$target.part" "$mirror/$file" ||
            { echo "error: cannot download $mirror/$file (offline? set MNIST_MIRROR=DIR to copy from a folder)" >&2; rm -f "$target.part"; exit 1; }
    elif command -v wget > /dev/null; then
        wget -q -O "$target.part" "$mirror/$file" ||
            { echo "error: cannot download $mirror/$file (offline? set MNIST_MIRROR=DIR to copy from a folder)" >&2; rm -f "$target.part"; exit 1; }
    else
        echo "error: need curl or wget to download MNIST (or set MNIST_MIRROR=DIR)" >&2
        exit 1
    fi
    if ! md5_ok "$target.part" "${md5[$file]}"; then
        echo "error: $file from $mirror has the wrong md5 (expected ${md5[$file]}); not kept" >&2
        rm -f "$target.part"
        exit 1
    fi
    mv "$target.part" "$target"
    echo "fetched  $target (md5 verified)"
done
for file in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    target="$dest/$file"
    if md5_ok "$target" "${unpacked_md5[$file]}"; then
        echo "ok       $target (md5 verified, kept)"
        continue
    fi
    gzip -dc "$target.gz" > "$target.part" && md5_ok "$target.part" "${unpacked_md5[$file]}" ||
        { echo "error: $target.gz does not unpack to the canonical $file (md5 ${unpacked_md5[$file]}); not kept" >&2; rm -f "$target.part"; exit 1; }
    mv "$target.part" "$target"
    echo "unpacked $target (md5 verified)"
done
