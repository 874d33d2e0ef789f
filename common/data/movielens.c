// movielens.c: MovieLens CSV files, read in parallel by byte ranges. See movielens.h.
#include "data/movielens.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/check.h"
#include "base/paths.h"
#include "base/quote.h"
#include "base/rng.h"
#include "runtime/dist.h"

#define READ_BLOCK (1 << 20)   // bytes read at a time: the reader's buffer, whatever the file's size
// A line's text (its line ending aside) is at most this long, wherever it falls in the file; longer
// lines are malformed (MovieLens's longest is under 300 bytes). The reader looks no further than
// MAX_LINE + 2 bytes for a line's end, so the buffer must hold that much past any line's start.
#define MAX_LINE 4096
_Static_assert(READ_BLOCK >= MAX_LINE + 2, "the read block holds the longest line and its CRLF");
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
// truncated); -2: a line longer than MAX_LINE (*start says where it starts, so
// that only the rank that owns it reports it; *line_len is then not set).
//
// The limit holds wherever the line falls: its end is sought within the
// MAX_LINE + 2 bytes from its start (the text, a '\r' and the '\n'), and the
// buffer is refilled first when fewer are in it, so whether a line is too long
// never depends on where a read block happens to end.
static int next_line(LineReader *in, char **line, size_t *line_len, long *start) {
    for (;;) {
        size_t unread = in->len - in->at, reach = MAX_LINE + 2;
        *line = in->buf + in->at;
        *start = in->offset + (long)in->at;
        char *newline = memchr(*line, '\n', unread < reach ? unread : reach);
        if (newline) {
            *line_len = (size_t)(newline - *line);
            if (*line_len > 0 && (*line)[*line_len - 1] == '\r') (*line_len)--;
            if (*line_len > MAX_LINE) return -2;
            (*line)[*line_len] = '\0';
            in->at = (size_t)(newline - in->buf) + 1;
            return 1;
        }
        if (unread >= reach) return -2;  // no line ending in reach: the text alone is longer
        if (in->eof) {
            if (unread == 0) return 0;
            *line_len = unread;
            (*line)[*line_len] = '\0';
            return -1;
        }
        refill(in);
    }
}

// A CSV row is text: a NUL (which would end the row early for the C string
// functions, so that "4,1259,4.0,964538728\0garbage" read as a valid row), an
// escape sequence, a carriage return inside it or bytes that are not UTF-8 make
// the row bad. False, with the reason in `why`, for such a row.
static bool row_is_text(const char *line, size_t len, char *why, size_t why_size) {
    size_t at = first_non_text(line, len);
    if (at == len) return true;
    snprintf(why, why_size, "byte %zu of the row is not text (0x%02x: a control character or not UTF-8): %s", at + 1,
             (unsigned char)line[at], QUOTE_N(line, len));
    return false;
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
        snprintf(why, why_size, "expected userId,movieId,rating,timestamp with userId a whole number from 1 to %d, got %s", MAX_ID, QUOTE(line));
        return false;
    }
    p++;
    if (!parse_id(&p, item) || *p != ',') {
        snprintf(why, why_size, "expected userId,movieId,rating,timestamp with movieId a whole number from 1 to %d, got %s", MAX_ID, QUOTE(line));
        return false;
    }
    char *field = ++p;
    char *comma = strchr(field, ',');
    if (!comma) {
        snprintf(why, why_size, "expected 4 fields userId,movieId,rating,timestamp, got %s", QUOTE(line));
        return false;
    }
    *comma = '\0';
    char *end = NULL;
    float value = comma > field ? strtof(field, &end) : NAN;
    bool ok = comma > field && end == comma && value >= 0.5f && value <= 5.0f;  // NaN fails both
    if (!ok) {
        snprintf(why, why_size, "rating %s is not a number from 0.5 to 5", QUOTE(field));
        return false;
    }
    *rating = value;
    p = comma + 1;
    if (*p < '0' || *p > '9') {
        snprintf(why, why_size, "timestamp %s is not a whole number", QUOTE(p));
        return false;
    }
    while (*p >= '0' && *p <= '9') p++;
    if (*p != '\0') {
        snprintf(why, why_size, "expected 4 fields userId,movieId,rating,timestamp, got %s", QUOTE(line));
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
    const char *shown = PATH_SHOWN(path);  // the name as a message shows it: one safe line
    int rank = dist_rank(), world = dist_world_size();
    char message[1024];
    const char *problem = input_file_problem(path);
    FILE *file = problem ? NULL : fopen(path, "rb");
    snprintf(message, sizeof message, "%s: %s (make movielens fetches MovieLens; --data DIR names its folder)", shown,
             problem ? problem : strerror(errno));
    check_all_ranks(file != NULL, message);
    struct stat st;
    CHECK_ERRNO(fstat(fileno(file), &st) == 0, "stat %s", shown);
    long size = (long)st.st_size;

    // This rank's lines: those that start in [start, end).
    long start = (long)((double)size * rank / world), end = (long)((double)size * (rank + 1) / world);
    if (rank == world - 1) end = size;
    LineReader in = {.file = file, .buf = xmalloc(READ_BLOCK + 1), .offset = start > 0 ? start - 1 : 0};
    CHECK_ERRNO(fseeko(file, in.offset, SEEK_SET) == 0, "seek in %s", shown);
    RowList rows = {0};
    long lines = 0;                 // lines of this rank read so far
    long bad_line = -1;             // the local index of the first bad line, if any
    char why[512] = "";
    char *line;
    size_t line_len;
    long line_start;
    if (start > 0) {  // the line holding byte start - 1 belongs to the rank before
        int got = next_line(&in, &line, &line_len, &line_start);
        // Too long to skip: this rank cannot find its first line. The rank that owns the line (a
        // lower one, whose line number check_all_ranks prints) finds it too long as well.
        if (got == -2) { bad_line = 0; snprintf(why, sizeof why, "a line longer than %d bytes", MAX_LINE); }
    }
    if (size == 0 && rank == 0) { bad_line = 0; snprintf(why, sizeof why, "the file is empty: expected the header '%s'", MOVIELENS_HEADER); }
    while (bad_line < 0) {
        int got = next_line(&in, &line, &line_len, &line_start);
        if (got == 0 || line_start >= end) break;  // the next rank's line, whatever it holds
        if (got == -2) { bad_line = lines; snprintf(why, sizeof why, "a line longer than %d bytes", MAX_LINE); break; }
        if (got == -1) {
            bad_line = lines;
            snprintf(why, sizeof why, "the file ends in the middle of a row (%s has no line ending): truncated? (make movielens fetches it again)", QUOTE_N(line, line_len));
            break;
        }
        if (!row_is_text(line, line_len, why, sizeof why)) {
            bad_line = lines;
        } else if (line_start == 0) {  // the header
            if (strcmp(line, MOVIELENS_HEADER) != 0) {
                bad_line = lines;
                snprintf(why, sizeof why, "expected the header '%s' of MovieLens's ratings.csv, got %s", MOVIELENS_HEADER, QUOTE(line));
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
    snprintf(message, sizeof message, "%s:%ld: %s", shown, lines_before + bad_line + 1, why);
    check_all_ranks(bad_line < 0, message);
    long total = rows.n;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    snprintf(message, sizeof message, "%s: no ratings after the header (expected lines userId,movieId,rating,timestamp)", shown);
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
    const char *shown = PATH_SHOWN(path);  // the name as a message shows it: one safe line
    const char *problem = input_file_problem(path);
    FILE *file = problem ? NULL : fopen(path, "rb");
    if (!file) {
        snprintf(error, error_size, "%s: %s (make movielens fetches MovieLens)", shown, problem ? problem : strerror(errno));
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
            if (got == -1) snprintf(error, error_size, "%s:%ld: the last row has no line ending: truncated?", shown, number);
            else snprintf(error, error_size, "%s:%ld: a line longer than %d bytes", shown, number, MAX_LINE);
            ok = false;
            break;
        }
        char why[QUOTE_SIZE + 128];
        if (!row_is_text(line, line_len, why, sizeof why)) {  // a title is printed: text, and nothing else
            snprintf(error, error_size, "%s:%ld: %s", shown, number, why);
            ok = false;
            break;
        }
        if (number == 1) {
            if (strcmp(line, "movieId,title,genres") != 0) {
                snprintf(error, error_size, "%s:1: expected the header 'movieId,title,genres' of MovieLens's movies.csv, got %s", shown, QUOTE(line));
                ok = false;
                break;
            }
            continue;
        }
        char *p = line;
        int id;
        if (!parse_id(&p, &id) || *p != ',') {
            snprintf(error, error_size, "%s:%ld: expected movieId,title,genres with movieId a whole number, got %s", shown, number, QUOTE(line));
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
                snprintf(error, error_size, "%s:%ld: a quoted title without its closing quote and comma: %s", shown, number, QUOTE(title));
                ok = false;
                break;
            }
            *out = '\0';
        } else {
            char *comma = strrchr(p, ',');  // genres hold no comma; an unquoted title may not either
            if (!comma) {
                snprintf(error, error_size, "%s:%ld: expected movieId,title,genres, got %s", shown, number, QUOTE(line));
                ok = false;
                break;
            }
            *comma = '\0';
        }
        if (*title == '\0') {
            snprintf(error, error_size, "%s:%ld: movie %d has an empty title", shown, number, id);
            ok = false;
            break;
        }
        int index = find_sorted(r->item_id, r->n_items, id);
        if (index >= 0 && !titles[index]) titles[index] = xstrdup(title);
    }
    free(in.buf);
    fclose(file);
    if (ok && number == 0) {
        snprintf(error, error_size, "%s: the file is empty: expected the header 'movieId,title,genres' (make movielens fetches MovieLens)", shown);
        ok = false;
    }
    // Every movie of ratings.csv has its row (MovieLens's movies.csv lists them all): a title is
    // never printed blank, and a movies.csv of another data set is refused, not half used.
    int missing = 0, first_missing = -1;
    for (int i = 0; ok && i < r->n_items; i++)
        if (!titles[i] && missing++ == 0) first_missing = i;
    if (missing > 0) {
        snprintf(error, error_size,
                 "%s: no row for movie %d, which ratings.csv rates (%d of its %d movies have none): expected "
                 "movieId,title,genres for every movie of ratings.csv, as MovieLens's movies.csv has",
                 shown, r->item_id[first_missing], missing, r->n_items);
        ok = false;
    }
    if (!ok) {
        for (int i = 0; i < r->n_items; i++) free(titles[i]);
        free(titles);
        return false;
    }
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

// The temporary file being written, for the signal handler: removed if a signal ends the write.
static char g_writing[4096];
static volatile sig_atomic_t g_writing_armed;
// The signals that end a process by default while it writes: an interrupt, a stop from
// mpirun or Slurm, a closed terminal, a file past ulimit -f (SIGXFSZ). One that the
// process was told to ignore stays ignored (the write then fails, and write_or_die cleans up).
static const int STOP_SIGNALS[] = {SIGINT, SIGTERM, SIGHUP, SIGXFSZ};
enum { N_STOP_SIGNALS = sizeof STOP_SIGNALS / sizeof STOP_SIGNALS[0] };
static struct sigaction g_previous[N_STOP_SIGNALS];

static void remove_temp_and_die(int signal_number) {
    if (g_writing_armed) unlink(g_writing);  // async-signal-safe
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (STOP_SIGNALS[i] == signal_number) sigaction(signal_number, &g_previous[i], NULL);
    raise(signal_number);  // the previous action (the default: the process ends by this signal)
}

static void guard_temp(const char *temp) {
    snprintf(g_writing, sizeof g_writing, "%s", temp);
    g_writing_armed = 1;
    struct sigaction action = {.sa_handler = remove_temp_and_die};
    sigemptyset(&action.sa_mask);
    for (int i = 0; i < N_STOP_SIGNALS; i++) {
        sigaction(STOP_SIGNALS[i], NULL, &g_previous[i]);
        if (g_previous[i].sa_handler != SIG_IGN) sigaction(STOP_SIGNALS[i], &action, NULL);
    }
}

static void unguard_temp(void) {
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(STOP_SIGNALS[i], &g_previous[i], NULL);
    g_writing_armed = 0;
}

// Commit the file, or remove its temporary file and end the job with one line.
static void write_or_die(FILE *file, const char *temp, const char *path, bool ok) {
    if (!ok) {
        int why = errno;
        replace_abort(file, temp);  // replace_commit would too, but a write that failed never gets there
        unguard_temp();
        errno = why;
        FATAL("cannot write %s: %s", PATH_SHOWN(path), strerror(errno));
    }
    bool committed = replace_commit(file, temp);  // on failure it has removed the temporary file
    unguard_temp();
    if (!committed) FATAL("cannot write %s: %s", PATH_SHOWN(path), strerror(errno));
}

static int decimal_digits(long value) {
    int digits = 1;
    while (value >= 10) value /= 10, digits++;
    return digits;
}

// The users and movies of n synthetic ratings: ml-25m's proportions.
static void synthetic_shape(long n, int *n_users, int *n_items) {
    *n_users = (int)(n / 154 > 10 ? n / 154 : 10), *n_items = (int)(n / 423 > 10 ? n / 423 : 10);
}

bool movielens_synthetic_fits(const char *dir, long n, char *why, size_t why_size) {
    int n_users, n_items;
    synthetic_shape(n, &n_users, &n_items);
    // The longest line of each file, as movielens_write_synthetic prints them.
    long last_item_id = n_items - 1 + (n_items - 1) / 2 + 1;
    double rating_line = decimal_digits(n_users) + 1 + decimal_digits(last_item_id) + 1 + 3 + 1 +
                         decimal_digits(1000000000L + n) + 1;
    double movie_line = 2 * decimal_digits(last_item_id) + 60;  // id, "Synthetic movie I, part P (YYYY)", genres
    double bytes = strlen(MOVIELENS_HEADER) + 1 + (double)n * rating_line + 22 + (double)n_items * movie_line;
    char folder[4096];
    snprintf(folder, sizeof folder, "%s", dir);
    struct statvfs fs;
    while (statvfs(folder, &fs) != 0) {  // not made yet: its nearest folder that is
        char *slash = strrchr(folder, '/');
        if (!slash || slash == folder) {
            snprintf(folder, sizeof folder, "%s", slash == folder ? "/" : ".");
            if (statvfs(folder, &fs) != 0) return true;  // nothing to ask: the write will say
            break;
        }
        *slash = '\0';
    }
    double free_bytes = (double)fs.f_bavail * (double)fs.f_frsize;
    if (bytes <= free_bytes) return true;
    snprintf(why, why_size, "--synthetic %ld: the files need up to %.1f MB in %s, which has %.1f MB free", n, bytes / 1e6,
             PATH_SHOWN(dir), free_bytes / 1e6);
    return false;
}

void movielens_write_synthetic(const char *dir, long n, uint64_t seed) {
    int n_users, n_items;
    synthetic_shape(n, &n_users, &n_items);
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
    CHECK_ERRNO(file != NULL, "cannot create %s", PATH_SHOWN(path));
    guard_temp(temp);
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
    CHECK_ERRNO(file != NULL, "cannot create %s", PATH_SHOWN(path));
    guard_temp(temp);
    ok = fprintf(file, "movieId,title,genres\n") > 0;
    for (int i = 0; i < n_items && ok; i++)  // every third title has a comma, and so its quotes
        ok = (i % 3 ? fprintf(file, "%d,Synthetic movie %d (%d),Drama\n", i + i / 2 + 1, i, 1950 + i % 70)
                    : fprintf(file, "%d,\"Synthetic movie %d, part %d (%d)\",Comedy|Drama\n", i + i / 2 + 1, i, i % 5 + 1, 1950 + i % 70)) > 0;
    write_or_die(file, temp, path, ok);
    free(user_factor);
    free(item_factor);
}
