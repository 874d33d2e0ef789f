// movielens.h: MovieLens ratings read in parallel, each rank its own byte range.
//
//   Ratings r = movielens_read_ratings("data/movielens/ratings.csv");   // collective
//   // r.n ratings of this rank, r.user[k] and r.item[k] dense indices into
//   // 0..r.n_users-1 and 0..r.n_items-1, r.rating[k] in 0.5..5
//
// The file (userId,movieId,rating,timestamp, a header line, LF or CRLF line
// endings) is cut into W byte ranges; a line belongs to the rank whose range
// holds its first byte, so rank r reads only about 1/W of it, from its
// range's start to the end of the last line that starts in it. No rank ever
// holds the whole file, nor all the ratings: a file larger than one rank's
// memory can be used. The ids of MovieLens are sparse (movieId up to
// 193609 for 9724 movies); the ranks agree on the dense index of every id
// that occurs anywhere in the file (a bitmap of ids, reduced), so that the
// embedding tables have a row per user and per movie, numbered alike on any
// number of ranks.
//
// Bad input, met by every rank alike, ends the job with one line naming
// file:line and what was expected (check_all_ranks; exit 1): a missing file, a
// header that is not MovieLens's, a row with a field missing or not a number,
// a rating outside 0.5..5, a last row without its line ending (a truncated
// file), a row that is not text (a NUL, an escape sequence, a carriage return
// inside it, bytes that are not UTF-8), a line longer than 4096 bytes (its line
// ending aside; the same limit wherever the line falls). The first bad line of
// the file is the one reported; what the message quotes of it is bounded and
// escaped (quote.h), so the refusal is one line that never acts on the terminal.
//
// The layer of mnist (5): MPI (dist) and check.h below it.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOVIELENS_HEADER "userId,movieId,rating,timestamp"

typedef struct {
    long n;              // ratings held by this rank
    int *user, *item;    // [n]: dense indices
    float *rating;       // [n]
    long first;          // the file-order index (0-based, header excluded) of this rank's first rating
    long n_total;        // ratings in the whole file
    int n_users, n_items;            // distinct ids in the whole file
    int *user_id, *item_id;          // [n_users], [n_items]: dense index -> MovieLens id (every rank)
    long byte_start, byte_end;       // the byte range this rank read
} Ratings;

// Collective. Fatal (one line, exit 1, every rank) on any bad input.
Ratings movielens_read_ratings(const char *path);
void ratings_free(Ratings *r);
// The dense index of MovieLens id `id`, or -1 if it does not occur.
int ratings_user_index(const Ratings *r, int user_id);

// Whether the rating at file-order index `index` is in the test split: a
// seeded hash of (seed, index) below 10% of its range, so each rating's side
// is the same on any number of ranks (tests/torch_recommender.py repeats it).
bool movielens_is_test(uint64_t seed, long index);

// movies.csv (movieId,title,genres; titles with commas in double quotes, "" for
// a quote): the title of each dense item index. Every movie of the ratings
// must have its row and a title that is not empty, as in MovieLens, so that no
// title is ever printed blank: an empty or header-only file, or one missing a
// rated movie, is refused. The same rules of text and line length as
// ratings.csv. Read by the calling rank alone; on bad input returns false with
// one line naming the file (and the line, where one is at fault) in `error`.
bool movielens_read_titles(const char *path, const Ratings *r, char ***titles, char *error, size_t error_size);

// Write a MovieLens-shaped DIR/ratings.csv of n ratings (and DIR/movies.csv with
// made-up titles), replaced atomically: users and movies in the proportions of
// ml-25m (about 154 ratings per user, 423 per movie), popularity skewed as in
// MovieLens (a few users and movies take most ratings), half-star ratings from
// a planted rank-8 structure plus noise, so matrix factorisation has something
// to find. Seeded: the same n and seed write the same bytes. Rank 0 only.
// It never leaves a temporary file behind: one that fails to write (a full
// disk) is removed before the fatal line, and SIGINT, SIGTERM or SIGHUP during
// the write remove it before the signal ends the process.
void movielens_write_synthetic(const char *dir, long n, uint64_t seed);
// Whether DIR's file system (DIR's nearest folder that exists) has room for the
// files movielens_write_synthetic(dir, n) writes, at their longest lines
// (statvfs: the blocks free to this user). False with one line in `why`.
bool movielens_synthetic_fits(const char *dir, long n, char *why, size_t why_size);
