// paths.c: see paths.h.
#include "base/paths.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"

static bool make_dir(const char *path) { return mkdir(path, 0777) == 0 || errno == EEXIST; }

bool make_dirs(const char *folder) {
    char partial[PATH_MAX];
    if (snprintf(partial, sizeof partial, "%s", folder) >= (int)sizeof partial) return errno = ENAMETOOLONG, false;
    for (char *c = partial + 1; *c; c++) {  // each prefix in turn: a, a/b, then a/b/c below
        if (*c != '/') continue;
        *c = '\0';
        bool ok = make_dir(partial);
        *c = '/';
        if (!ok) return false;
    }
    return make_dir(partial);
}

void make_parent_dirs(const char *path) {
    char dir[4096];
    CHECK(strlen(path) < sizeof dir, "path too long: %s", path);
    strcpy(dir, path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = '\0';
    CHECK_ERRNO(make_dirs(dir), "cannot create directory %s", dir);
}

const char *input_file_problem(const char *path) {
    struct stat info;
    if (stat(path, &info) != 0 || S_ISREG(info.st_mode)) return NULL;
    return S_ISDIR(info.st_mode) ? "is a directory" : "is not a regular file (a FIFO, a socket or a device)";
}

// Whether `dir` has `path`.
static bool has(const char *dir, const char *path) {
    char full[PATH_MAX + 256];
    struct stat info;
    return snprintf(full, sizeof full, "%s/%s", dir, path) < (int)sizeof full && stat(full, &info) == 0;
}

// The nearest folder at or above `start` (an absolute path) that has `path` or, if not NULL,
// `alternative`.
static bool search_up(const char *start, const char *path, const char *alternative, char *folder, size_t size) {
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", start) >= (int)sizeof dir) return false;
    for (;;) {
        if (has(dir, path) || (alternative && has(dir, alternative))) {
            snprintf(folder, size, "%s", *dir ? dir : "/");
            return true;
        }
        char *slash = strrchr(dir, '/');
        if (!slash) return false;
        if (slash == dir && dir[1] == '\0') return false;  // "/" was the last folder to try
        slash[slash == dir ? 1 : 0] = '\0';                 // "/a" -> "/", "/a/b" -> "/a"
    }
}

// The running program's folder (Linux: /proc/self/exe).
static bool program_folder(char *folder, size_t size) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    snprintf(folder, size, "%s", dirname(exe));
    return true;
}

bool find_either_from_above(const char *path, const char *alternative, char *folder, size_t size) {
    char cwd[PATH_MAX], program[PATH_MAX];
    *folder = '\0';
    if (*path == '/' || *path == '\0') return false;
    return (getcwd(cwd, sizeof cwd) && search_up(cwd, path, alternative, folder, size)) ||
           (program_folder(program, sizeof program) && search_up(program, path, alternative, folder, size));
}

bool find_from_above(const char *path, char *folder, size_t size) {
    return find_either_from_above(path, NULL, folder, size);
}

bool program_repository(char *folder, size_t size) {
    char program[PATH_MAX];
    *folder = '\0';
    return program_folder(program, sizeof program) && search_up(program, "Makefile", NULL, folder, size);
}

void run_from_hint(const char *folder, const char *flag, const char *value, char *hint, size_t size) {
    char cwd[PATH_MAX] = "?", root[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    bool at_root = program_repository(root, sizeof root) && strcmp(root, folder) == 0;
    snprintf(hint, size, "relative to the working directory %s; run from %s%s or pass %s %s/%s", cwd,
             at_root ? "the repository root " : "", folder, flag, folder, value);
}

// Fill `why` and return false: output_file_writable's verdict on a problem.
__attribute__((format(printf, 3, 4))) static bool refuse(char *why, size_t size, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, size, fmt, args);
    va_end(args);
    return false;
}

// The file descriptor (1 or 2) whose stream `path` is, or -1.
static int standard_stream(const char *path) {
    struct stat info, stream;
    if (stat(path, &info) != 0) return -1;
    for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++)
        if (fstat(fd, &stream) == 0 && stream.st_dev == info.st_dev && stream.st_ino == info.st_ino) return fd;
    return -1;
}

bool output_is_stream(const char *path) {
    struct stat info;
    return standard_stream(path) >= 0 || (stat(path, &info) == 0 && S_ISCHR(info.st_mode));
}

const char *replace_target(const char *target, char *resolved, size_t size) {
    const char *current = target;
    for (int hops = 0; hops < 40; hops++) {  // 40: the kernel's own limit on links in a row
        struct stat info;
        char link[PATH_MAX], next[2 * PATH_MAX];
        if (lstat(current, &info) != 0 || !S_ISLNK(info.st_mode)) return current;
        ssize_t n = readlink(current, link, sizeof link - 1);
        if (n < 0) return current;
        link[n] = '\0';
        const char *slash = strrchr(current, '/');  // a relative link starts from the link's folder
        if (link[0] == '/' || !slash) snprintf(next, sizeof next, "%s", link);
        else snprintf(next, sizeof next, "%.*s/%s", (int)(slash - current), current, link);
        if (strlen(next) >= size) return current;  // too long to follow: the write will say so
        memcpy(resolved, next, strlen(next) + 1);
        current = resolved;
    }
    return current;  // a loop of links: the write fails on it, with ELOOP
}

bool output_file_writable(const char *path, char *why, size_t size) {
    size_t len = strlen(path);
    if (len == 0) return refuse(why, size, "is an empty name");
    if (path[len - 1] == '/') return refuse(why, size, "names a folder, not a file");
    if (output_is_stream(path)) return true;  // written in place
    char resolved[PATH_MAX];
    const char *file = replace_target(path, resolved, sizeof resolved);
    struct stat info;
    if (stat(file, &info) == 0 && !S_ISREG(info.st_mode))
        return refuse(why, size, "%s",
                      S_ISDIR(info.st_mode) ? "is a directory" : "is not a regular file (a FIFO, a socket or a device)");
    char temp[PATH_MAX];
    if (snprintf(temp, sizeof temp, "%s.tmp.%ld", file, (long)getpid()) >= (int)sizeof temp)
        return refuse(why, size, "is too long");

    // The folder that will hold the new file: the file's, or the nearest
    // existing folder above it (dirname: "a/b/c" -> "a/b" -> "a" -> "."). A
    // plain file on the way is named as such.
    char folder[PATH_MAX];
    strcpy(folder, file);
    for (;;) {
        const char *parent = dirname(folder);  // shortens `folder`, or returns a static "." or "/"
        memmove(folder, parent, strlen(parent) + 1);
        if (stat(folder, &info) == 0) break;
        if ((errno != ENOENT && errno != ENOTDIR) || strcmp(folder, ".") == 0 || strcmp(folder, "/") == 0)
            return refuse(why, size, "%s: %s", folder, strerror(errno));
    }
    if (!S_ISDIR(info.st_mode)) return refuse(why, size, "%s is not a folder", folder);

    // Each name on the way, the temporary file's last, within the filesystem's
    // limit (255 bytes on most; the names that exist already fit).
    long name_max = pathconf(folder, _PC_NAME_MAX);
    for (const char *name = temp; name_max > 0 && *name;) {
        name += strspn(name, "/");
        size_t n = strcspn(name, "/");
        if ((long)n > name_max)
            return refuse(why, size, "'%.*s...' is too long a name for %s: %zu bytes%s, where it takes %ld", 40,
                          name, folder, n, name[n] ? "" : " with the temporary suffix", name_max);
        name += n;
    }

    // Only trying tells: permissions, a read-only filesystem, a full inode table.
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/.write-check.XXXXXX", folder);
    int fd = mkstemp(probe);
    if (fd < 0) return refuse(why, size, "cannot create a file in %s: %s", folder, strerror(errno));
    close(fd);
    unlink(probe);
    return true;
}

void replace_temp_name(const char *target, char *temp, size_t size) {
    char resolved[PATH_MAX];
    const char *file = replace_target(target, resolved, sizeof resolved);
    int len = snprintf(temp, size, "%s.tmp.%ld", file, (long)getpid());
    CHECK(len >= 0 && (size_t)len < size, "path too long: %s", target);
    make_parent_dirs(file);
}

bool replace_rename(const char *temp, const char *file) {
    struct stat old;
    if (stat(file, &old) == 0 && chmod(temp, old.st_mode & 07777) != 0) return false;
    return rename(temp, file) == 0;
}

FILE *replace_begin(const char *target, char *temp, size_t size) {
    if (output_is_stream(target)) {
        temp[0] = '\0';
        int fd = standard_stream(target);
        if (fd < 0) return fopen(target, "wb");  // a device: /dev/null, a terminal
        // Our own stdout or stderr: through its descriptor, after what stdio
        // holds, and never truncated (a reopened redirect would be).
        fflush(fd == STDOUT_FILENO ? stdout : stderr);
        int copy = dup(fd);
        FILE *file = copy >= 0 ? fdopen(copy, "wb") : NULL;
        if (copy >= 0 && !file) close(copy);
        return file;
    }
    replace_temp_name(target, temp, size);
    return fopen(temp, "wb");
}

bool sync_path(const char *path, bool folder) {
    int fd = open(path, O_RDONLY | (folder ? O_DIRECTORY : 0));
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0;
    int saved = errno;
    close(fd);
    errno = saved;
    return ok;
}

// The file that `temp` replaces: FILE of "FILE.tmp.PID". Resolved once, by
// replace_temp_name: resolving the target's links again could land elsewhere.
static bool file_of_temp(const char *temp, char *file, size_t size) {
    char suffix[32];
    size_t n = (size_t)snprintf(suffix, sizeof suffix, ".tmp.%ld", (long)getpid()), len = strlen(temp);
    if (len <= n || strcmp(temp + len - n, suffix) != 0 || len - n >= size) return false;
    memcpy(file, temp, len - n);
    file[len - n] = '\0';
    return true;
}

bool replace_commit(FILE *file, const char *temp) {
    int error = 0;
    if (file) {
        // A write fails at fflush (what stdio still holds) or earlier, and then
        // the stream's error flag remembers it. A full disk often shows here
        // first, or only at fclose.
        if (fflush(file) != 0) error = errno;
        else if (ferror(file)) error = EIO;  // an earlier write failed, and its errno is gone
        // The data reaches the disk before the rename: without it, a crash soon
        // after could leave an empty target on some filesystems. (The folder is
        // not synced: a rename lost in a crash leaves the old file, which is fine.)
        if (!error && temp[0] && fsync(fileno(file)) != 0) error = errno;
        if (fclose(file) != 0 && !error) error = errno;
    } else if (temp[0] && !sync_path(temp, false)) {
        error = errno;
    }
    if (!temp[0]) {  // a stream, written in place
        errno = error;
        return !error;
    }
    char replaced[PATH_MAX];
    if (!error && !file_of_temp(temp, replaced, sizeof replaced)) error = EINVAL;
    if (!error && !replace_rename(temp, replaced)) error = errno;
    if (error) {
        unlink(temp);
        errno = error;
        return false;
    }
    return true;
}

void replace_abort(FILE *file, const char *temp) {
    int saved = errno;
    if (file) fclose(file);
    if (temp[0]) unlink(temp);
    errno = saved;
}
