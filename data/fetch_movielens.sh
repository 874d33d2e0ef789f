#!/usr/bin/env bash
# Put MovieLens ml-latest-small (ratings.csv, movies.csv and its README.txt, the
# licence) in DIR (default data/movielens) and verify the CSVs' md5s.
#
#   data/fetch_movielens.sh [DIR]                               # download ml-latest-small.zip from GroupLens
#   MOVIELENS_MIRROR=/path/to/folder data/fetch_movielens.sh    # copy from a local folder (offline)
#   MOVIELENS_MIRROR=https://host/path data/fetch_movielens.sh  # another mirror of the zip
#
# The md5s are those of the CSVs with LF line endings: a copy with CRLF line
# endings (as the zip may have) passes too, and is kept as it is (the reader
# takes both). Files already present with the right md5 are kept. The data is
# GroupLens's, under the terms of its README.txt (research use; cite Harper &
# Konstan 2015); it is never part of this repository.
set -euo pipefail

dest=${1:-data/movielens}
mirror=${MOVIELENS_MIRROR:-https://files.grouplens.org/datasets/movielens}

declare -A md5=(
    [ratings.csv]=ac0cf1d26aed3a5b6777a295231976ad
    [movies.csv]=b252328d16b085936b56eefad880ef9d
)

md5_ok() { [ -f "$1" ] && [ "$(tr -d '\r' < "$1" | md5sum | cut -d' ' -f1)" = "$2" ]; }

mkdir -p "$dest"
if md5_ok "$dest/ratings.csv" "${md5[ratings.csv]}" && md5_ok "$dest/movies.csv" "${md5[movies.csv]}"; then
    echo "ok       $dest/ratings.csv, $dest/movies.csv (md5 verified, kept)"
    exit 0
fi
tmp=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [[ "$mirror" != *://* ]]; then  # a local folder
    [ -d "$mirror" ] || { echo "error: MOVIELENS_MIRROR=$mirror is not a folder (expected one holding ratings.csv, movies.csv and README.txt)" >&2; exit 1; }
    for file in ratings.csv movies.csv README.txt; do
        [ -f "$mirror/$file" ] || { echo "error: $mirror/$file not found (MOVIELENS_MIRROR must hold ratings.csv, movies.csv and README.txt)" >&2; exit 1; }
        cp "$mirror/$file" "$tmp/$file"
        chmod u+w "$tmp/$file"
    done
else
    zip="$tmp/ml-latest-small.zip"
    if command -v curl > /dev/null; then
        curl -fsSL --retry 3 -o "$zip" "$mirror/ml-latest-small.zip" ||
            { echo "error: cannot download $mirror/ml-latest-small.zip (offline? set MOVIELENS_MIRROR=DIR to copy from a folder)" >&2; exit 1; }
    elif command -v wget > /dev/null; then
        wget -q -O "$zip" "$mirror/ml-latest-small.zip" ||
            { echo "error: cannot download $mirror/ml-latest-small.zip (offline? set MOVIELENS_MIRROR=DIR to copy from a folder)" >&2; exit 1; }
    else
        echo "error: need curl or wget to download MovieLens (or set MOVIELENS_MIRROR=DIR)" >&2
        exit 1
    fi
    # The zip holds ml-latest-small/{ratings,movies,links,tags}.csv and README.txt.
    python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for name in ("ratings.csv", "movies.csv", "README.txt"):
    open(sys.argv[2] + "/" + name, "wb").write(z.read("ml-latest-small/" + name))' "$zip" "$tmp" ||
        { echo "error: $mirror/ml-latest-small.zip is not the zip of ml-latest-small (ratings.csv, movies.csv, README.txt)" >&2; exit 1; }
fi
for file in ratings.csv movies.csv; do
    if ! md5_ok "$tmp/$file" "${md5[$file]}"; then
        echo "error: $file from $mirror has the wrong md5 (expected ${md5[$file]} with LF line endings); not kept" >&2
        exit 1
    fi
done
for file in ratings.csv movies.csv README.txt; do mv "$tmp/$file" "$dest/$file"; done
echo "fetched  $dest/ratings.csv, $dest/movies.csv, $dest/README.txt (md5 verified; the licence is README.txt)"
