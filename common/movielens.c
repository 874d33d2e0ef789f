// movielens.c: MovieLens CSV files, read in parallel by byte ranges. See movielens.h.
#include "movielens.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "dist.h"
#include "paths.h"
#include "rng.h"

#define READ_BLOCK (1 << 20)   // bytes read at a time: the reader's buffer, whatever the file's size
#define MAX_LINE 4096          // longer lines are malformed (MovieLens's longest is under 200 bytes)
#define MAX_ID 100000000       // ids index a bitmap of this many bytes at most (ml-25m's go to 209171)

// ------------------------------------------------------------------ a buffered range of lines
typedef struct {
    FILE *file;
    char *buf;
    size_t len, at;     // bytes in buf, and the next unread one
    long offset;        // the file offset of buf[0]
    bool eof;
} LineReader;

static void refill(LineReader *in) {
    memmove(in->buf, in->buf + in->at, in->len - in->at);
    in->offset += (long)in->at;
    in->len -= in->at;
    in->at = 0;
    size_t got = fread(in->buf + in->len, 1, READ_BLOCK - in->len, in->file);
    in->len += got;
    if (got == 0) in->eof = true;
}

// The next line: its text [*line, *line + *line_len) without the line ending
// (LF or CRLF), and the file offset where it starts. 0: no more lines; 1: a
// line; -1: a line without its line ending at the end of the file (the file is
// truncated); -2: a line longer than MAX_LINE.
static int next_line(LineReader *in, char **line, size_t *line_len, long *start) {
    for (;;) {
        char *newline = memchr(in->buf + in->at, '\n', in->len - in->at);
        if (newline) {
            *line = in->buf + in->at;
            *start = in->offset + (long)in->at;
            *line_len = (size_t)(newline - *line);
            if (*line_len > 0 && (*line)[*line_len - 1] == '\r') (*line_len)--;
            (*line)[*line_len] = '\0';
            in->at = (size_t)(newline - in->buf) + 1;
            return 1;
        }
        if (in->len - in->at > MAX_LINE) return -2;
        if (in->eof) {
            if (in->len == in->at) return 0;
            *line = in->buf + in->at;
            *start = in->offset + (long)in->at;
            *line_len = in->len - in->at;
            (*line)[*line_len] = '\0';
            return -1;
        }
        refill(in);
    }
}

// ------------------------------------------------------------------ one row
static bool parse_id(char **p, int *out) {
    char *s = *p;
    long value = 0;
    if (*s < '0' || *s > '9') return false;
    for (; *s >= '0' && *s <= '9'; s++) {
        value = value * 10 + (*s - '0');
        if (value > MAX_ID) return false;
    }
    if (value < 1) return false;
    *out = (int)value;
    *p = s;
    return true;
}

// "1,31,2.5,1260759144": false with the reason in `why` when it is not a row.
static bool parse_row(char *line, int *user, int *item, float *rating, char *why, size_t why_size) {
    char *p = line;
    if (!parse_id(&p, user) || *p != ',') {
        snprintf(why, why_size, "expected userId,movieId,rating,timestamp with userId a whole number from 1 to %d, got '%.80s'", MAX_ID, line);
        return false;
    }
    p++;
    if (!parse_id(&p, item) || *p != ',') {
        snprintf(why, why_size, "expected userId,movieId,rating,timestamp with movieId a whole number from 1 to %d, got '%.80s'", MAX_ID, line);
        return false;
    }
    char *field = ++p;
    char *comma = strchr(field, ',');
    if (!comma) {
        snprintf(why, why_size, "expected 4 fields userId,movieId,rating,timestamp, got '%.80s'", line);
        return false;
    }
    *comma = '\0';
    char *end = NULL;
    float value = comma > field ? strtof(field, &end) : NAN;
    bool ok = comma > field && end == comma && value >= 0.5f && value <= 5.0f;  // NaN fails both
    if (!ok) {
        snprintf(why, why_size, "rating '%.40s' is not a number from 0.5 to 5", field);
        return false;
    }
    *rating = value;
    p = comma + 1;
    if (*p < '0' || *p > '9') {
        snprintf(why, why_size, "timestamp '%.40s' is not a whole number", p);
        return false;
    }
    while (*p >= '0' && *p <= '9') p++;
    if (*p != '\0') {
        snprintf(why, why_size, "expected 4 fields userId,movieId,rating,timestamp, got '%.80s'", line);
        return false;
    }
    return true;
}

// ------------------------------------------------------------------ the ratings, in parallel
typedef struct {
    long n, capacity;
    int *user, *item;
    float *rating;
} RowList;

static void row_append(RowList *rows, int user, int item, float rating) {
    if (rows->n == rows->capacity) {
        rows->capacity = rows->capacity + rows->capacity / 2 + 1024;
        rows->user = realloc(rows->user, (size_t)rows->capacity * sizeof(int));
        rows->item = realloc(rows->item, (size_t)rows->capacity * sizeof(int));
        rows->rating = realloc(rows->rating, (size_t)rows->capacity * sizeof(float));
        CHECK(rows->user && rows->item && rows->rating, "out of memory for %ld ratings", rows->capacity);
    }
    rows->user[rows->n] = user;
    rows->item[rows->n] = item;
    rows->rating[rows->n] = rating;
    rows->n++;
}

// Dense indices for the ids that occur in any rank's rows: a bitmap of ids,
// reduced over the ranks (MPI_MAX), numbered in id order.
static int *dense_ids(int *ids, long n, int *n_distinct) {
    int max_id = 0;
    for (long k = 0; k < n; k++)
        if (ids[k] > max_id) max_id = ids[k];
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &max_id, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    unsigned char *seen = xcalloc((size_t)max_id + 1, 1);
    for (long k = 0; k < n; k++) seen[ids[k]] = 1;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, seen, max_id + 1, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD));
    int *index_of = xmalloc(((size_t)max_id + 1) * sizeof(int));
    int count = 0;
    for (int id = 0; id <= max_id; id++) index_of[id] = seen[id] ? count++ : -1;
    int *id_of = xmalloc((size_t)(count ? count : 1) * sizeof(int));
    for (int id = 0; id <= max_id; id++)
        if (seen[id]) id_of[index_of[id]] = id;
    for (long k = 0; k < n; k++) ids[k] = index_of[ids[k]];
    free(index_of);
    free(seen);
    *n_distinct = count;
    return id_of;
}

Ratings movielens_read_ratings(const char *path) {
    int rank = dist_rank(), world = dist_world_size();
    char message[1024];
    const char *problem = input_file_problem(path);
    FILE *file = problem ? NULL : fopen(path, "rb");
    snprintf(message, sizeof message, "%s: %s (make movielens fetches MovieLens; --data DIR names its folder)", path,
             problem ? problem : strerror(errno));
    check_all_ranks(file != NULL, message);
    struct stat st;
    CHECK_ERRNO(fstat(fileno(file), &st) == 0, "stat %s", path);
    long size = (long)st.st_size;

    // This rank's lines: those that start in [start, end).
    long start = (long)((double)size * rank / world), end = (long)((double)size * (rank + 1) / world);
    if (rank == world - 1) end = size;
    LineReader in = {.file = file, .buf = xmalloc(READ_BLOCK + 1), .offset = start > 0 ? start - 1 : 0};
    CHECK_ERRNO(fseeko(file, in.offset, SEEK_SET) == 0, "seek in %s", path);
    RowList rows = {0};
    long lines = 0;                 // lines of this rank read so far
    long bad_line = -1;             // the local index of the first bad line, if any
    char why[512] = "";
    char *line;
    size_t line_len;
    long line_start;
    if (start > 0) {  // the line holding byte start - 1 belongs to the rank before
        int got = next_line(&in, &line, &line_len, &line_start);
        if (got == -2) { bad_line = 0; snprintf(why, sizeof why, "a line longer than %d bytes", MAX_LINE); }
    }
    if (size == 0 && rank == 0) { bad_line = 0; snprintf(why, sizeof why, "the file is empty: expected the header '%s'", MOVIELENS_HEADER); }
    while (bad_line < 0) {
        int got = next_line(&in, &line, &line_len, &line_start);
        if (got == -2) { bad_line = lines; snprintf(why, sizeof why, "a line longer than %d bytes", MAX_LINE); break; }
        if (got == 0 || line_start >= end) break;
        if (got == -1) {
            bad_line = lines;
            snprintf(why, sizeof why, "the file ends in the middle of a row ('%.40s' has no line ending): truncated? (make movielens fetches it again)", line);
            break;
        }
        if (line_start == 0) {  // the header
            if (strcmp(line, MOVIELENS_HEADER) != 0) {
                bad_line = lines;
                snprintf(why, sizeof why, "expected the header '%s' of MovieLens's ratings.csv, got '%.80s'", MOVIELENS_HEADER, line);
            }
        } else {
            int user, item;
            float rating;
            if (parse_row(line, &user, &item, &rating, why, sizeof why)) row_append(&rows, user, item, rating);
            else bad_line = lines;
        }
        lines++;
    }
    free(in.buf);
    fclose(file);

    // Line numbers: the lines of the ranks before this one, and the header.
    long lines_before = 0;
    CHECK_MPI(MPI_Exscan(&lines, &lines_before, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) lines_before = 0;
    snprintf(message, sizeof message, "%s:%ld: %s", path, lines_before + bad_line + 1, why);
    check_all_ranks(bad_line < 0, message);
    long total = rows.n;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    snprintf(message, sizeof message, "%s: no ratings after the header (expected lines userId,movieId,rating,timestamp)", path);
    check_all_ranks(total > 0, message);

    Ratings r = {.n = rows.n, .user = rows.user, .item = rows.item, .rating = rows.rating, .n_total = total,
                 .byte_start = start, .byte_end = end};
    CHECK_MPI(MPI_Exscan(&rows.n, &r.first, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) r.first = 0;
    r.user_id = dense_ids(r.user, r.n, &r.n_users);
    r.item_id = dense_ids(r.item, r.n, &r.n_items);
    return r;
}

void ratings_free(Ratings *r) {
    free(r->user);
    free(r->item);
    free(r->rating);
    free(r->user_id);
    free(r->item_id);
    *r = (Ratings){0};
}

static int find_sorted(const int *ids, int n, int id) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (ids[mid] == id) return mid;
        if (ids[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int ratings_user_index(const Ratings *r, int user_id) { return find_sorted(r->user_id, r->n_users, user_id); }

bool movielens_is_test(uint64_t seed, long index) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ULL + (uint64_t)index + 1;  // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z % 10 == 0;
}

// ------------------------------------------------------------------ movies.csv
bool movielens_read_titles(const char *path, const Ratings *r, char ***titles_out, char *error, size_t error_size) {
    const char *problem = input_file_problem(path);
    FILE *file = problem ? NULL : fopen(path, "rb");
    if (!file) {
        snprintf(error, error_size, "%s: %s (make movielens fetches MovieLens)", path, problem ? problem : strerror(errno));
        return false;
    }
    char **titles = xcalloc((size_t)r->n_items, sizeof(char *));
    LineReader in = {.file = file, .buf = xmalloc(READ_BLOCK + 1)};
    char *line;
    size_t line_len;
    long line_start, number = 0;
    bool ok = true;
    for (;;) {
        int got = next_line(&in, &line, &line_len, &line_start);
        if (got == 0) break;
        number++;
        if (got < 0) {
            snprintf(error, error_size, "%s:%ld: %s", path, number, got == -1 ? "the last row has no line ending: truncated?" : "a line too long");
            ok = false;
            break;
        }
        if (number == 1) {
            if (strcmp(line, "movieId,title,genres") != 0) {
                snprintf(error, error_size, "%s:1: expected the header 'movieId,title,genres' of MovieLens's movies.csv, got '%.80s'", path, line);
                ok = false;
                break;
            }
            continue;
        }
        char *p = line;
        int id;
        if (!parse_id(&p, &id) || *p != ',') {
            snprintf(error, error_size, "%s:%ld: expected movieId,title,genres with movieId a whole number, got '%.80s'", path, number, line);
            ok = false;
            break;
        }
        p++;
        char *title = p, *out = p;
        if (*p == '"') {  // a quoted title: "" is a quote, the closing quote ends it
            bool closed = false;
            for (p++; *p; p++) {
                if (*p == '"' && p[1] == '"') { *out++ = '"'; p++; }
                else if (*p == '"') { closed = true; p++; break; }
                else *out++ = *p;
            }
            if (!closed || *p != ',') {
                snprintf(error, error_size, "%s:%ld: a quoted title without its closing quote and comma: '%.80s'", path, number, title);
                ok = false;
                break;
            }
            *out = '\0';
        } else {
            char *comma = strrchr(p, ',');  // genres hold no comma; an unquoted title may not either
            if (!comma) {
                snprintf(error, error_size, "%s:%ld: expected movieId,title,genres, got '%.80s'", path, number, line);
                ok = false;
                break;
            }
            *comma = '\0';
        }
        int index = find_sorted(r->item_id, r->n_items, id);
        if (index >= 0 && !titles[index]) titles[index] = strdup(title);
    }
    free(in.buf);
    fclose(file);
    if (!ok) {
        for (int i = 0; i < r->n_items; i++) free(titles[i]);
        free(titles);
        return false;
    }
    for (int i = 0; i < r->n_items; i++)
        if (!titles[i]) titles[i] = strdup("");
    *titles_out = titles;
    return true;
}

// ------------------------------------------------------------------ synthetic ratings
// A skewed index in [0, n): u^3 puts most draws on the first indices, as a
// few users and movies take most of MovieLens's ratings.
static int skewed(Rng *rng, int n) {
    float u = rng_uniform(rng, 0.0f, 1.0f);
    int index = (int)((double)u * u * u * n);
    return index < n ? index : n - 1;
}

static void write_or_die(FILE *file, const char *temp, const char *path, bool ok) {
    if (!ok || !replace_commit(file, temp)) FATAL("cannot write %s: %s", path, strerror(errno));
}

void movielens_write_synthetic(const char *dir, long n, uint64_t seed) {
    int n_users = (int)(n / 154 > 10 ? n / 154 : 10), n_items = (int)(n / 423 > 10 ? n / 423 : 10);
    enum { RANK = 8 };
    Rng rng;
    rng_seed(&rng, seed);
    float *user_factor = xmalloc((size_t)n_users * (RANK + 1) * sizeof(float));  // [users, 8 + bias]
    float *item_factor = xmalloc((size_t)n_items * (RANK + 1) * sizeof(float));
    for (long k = 0; k < (long)n_users * (RANK + 1); k++) user_factor[k] = 0.3f * rng_normal(&rng);
    for (long k = 0; k < (long)n_items * (RANK + 1); k++) item_factor[k] = 0.35f * rng_normal(&rng);
    // Movie ids with gaps, as MovieLens's: index i is id i + i / 2 + 1.
    char path[4096], temp[4096];
    snprintf(path, sizeof path, "%s/ratings.csv", dir);
    FILE *file = replace_begin(path, temp, sizeof temp);
    CHECK_ERRNO(file != NULL, "cannot create %s", path);
    bool ok = fprintf(file, "%s\n", MOVIELENS_HEADER) > 0;
    for (long k = 0; k < n && ok; k++) {
        int user = skewed(&rng, n_users), item = skewed(&rng, n_items);
        const float *pu = user_factor + (size_t)user * (RANK + 1), *qi = item_factor + (size_t)item * (RANK + 1);
        float value = 3.5f + pu[RANK] + qi[RANK] + 0.5f * rng_normal(&rng);
        for (int d = 0; d < RANK; d++) value += pu[d] * qi[d];
        float half_stars = roundf(value * 2.0f);
        if (half_stars < 1.0f) half_stars = 1.0f;
        if (half_stars > 10.0f) half_stars = 10.0f;
        ok = fprintf(file, "%d,%d,%.1f,%ld\n", user + 1, item + item / 2 + 1, half_stars / 2.0f, 1000000000L + k) > 0;
    }
    write_or_die(file, temp, path, ok);
    snprintf(path, sizeof path, "%s/movies.csv", dir);
    file = replace_begin(path, temp, sizeof temp);
    CHECK_ERRNO(file != NULL, "cannot create %s", path);
    ok = fprintf(file, "movieId,title,genres\n") > 0;
    for (int i = 0; i < n_items && ok; i++)  // every third title has a comma, and so its quotes
        ok = (i % 3 ? fprintf(file, "%d,Synthetic movie %d (%d),Drama\n", i + i / 2 + 1, i, 1950 + i % 70)
                    : fprintf(file, "%d,\"Synthetic movie %d, part %d (%d)\",Comedy|Drama\n", i + i / 2 + 1, i, i % 5 + 1, 1950 + i % 70)) > 0;
    write_or_die(file, temp, path, ok);
    free(user_factor);
    free(item_factor);
}
