// paths.c: see paths.h.
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

void make_parent_dirs(const char *path) {
    char dir[4096];
    CHECK(strlen(path) < sizeof dir, "path too long: %s", path);
    strcpy(dir, path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = '\0';
    for (char *p = dir + 1;; p++) {  // each prefix in turn: a, a/b, a/b/c
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        CHECK_ERRNO(mkdir(dir, 0777) == 0 || errno == EEXIST, "cannot create directory %s", dir);
        if (saved == '\0') break;
        *p = saved;
    }
}

const char *input_file_problem(const char *path) {
    struct stat info;
    if (stat(path, &info) != 0 || S_ISREG(info.st_mode)) return NULL;
    return S_ISDIR(info.st_mode) ? "is a directory" : "is not a regular file (a FIFO, a socket or a device)";
}

// Fill `why` and return false: output_file_writable's verdict on a problem.
__attribute__((format(printf, 3, 4))) static bool refuse(char *why, size_t size, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, size, fmt, args);
    va_end(args);
    return false;
}

bool output_file_writable(const char *path, char *why, size_t size) {
    size_t len = strlen(path);
    if (len == 0) return refuse(why, size, "is an empty name");
    if (path[len - 1] == '/') return refuse(why, size, "names a folder, not a file");
    char folder[PATH_MAX];
    if (len >= sizeof folder) return refuse(why, size, "is too long");
    // An existing target (stat, not lstat: what a link points to is what gets replaced).
    struct stat info;
    if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) return refuse(why, size, "is a directory");
    if (stat(path, &info) == 0 && !S_ISREG(info.st_mode))
        return refuse(why, size, "is not a regular file (a FIFO, a socket or a device)");

    // The folder that will hold the new file: the target's, or the nearest
    // existing folder above it (dirname: "a/b/c" -> "a/b" -> "a" -> ".").
    strcpy(folder, path);
    for (;;) {
        const char *parent = dirname(folder);  // shortens `folder`, or returns a static "." or "/"
        memmove(folder, parent, strlen(parent) + 1);
        if (stat(folder, &info) == 0) break;
        if (errno != ENOENT || strcmp(folder, ".") == 0 || strcmp(folder, "/") == 0)
            return refuse(why, size, "%s: %s", folder, strerror(errno));
    }
    if (!S_ISDIR(info.st_mode)) return refuse(why, size, "%s is not a folder", folder);

    // Only trying tells: permissions, a read-only filesystem, a full inode table.
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/.write-check.%ld", folder, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return refuse(why, size, "cannot create a file in %s: %s", folder, strerror(errno));
    close(fd);
    unlink(probe);
    return true;
}

// The file that replacing `target` replaces: the target itself, or the file a
// symbolic link points to (rename over the link would turn it into a file).
static const char *replaced_file(const char *target, char resolved[PATH_MAX]) {
    struct stat info;
    if (lstat(target, &info) == 0 && S_ISLNK(info.st_mode) && realpath(target, resolved)) return resolved;
    return target;
}

void replace_temp_name(const char *target, char *temp, size_t size) {
    char resolved[PATH_MAX];
    const char *file = replaced_file(target, resolved);
    int len = snprintf(temp, size, "%s.tmp.%ld", file, (long)getpid());
    CHECK(len >= 0 && (size_t)len < size, "path too long: %s", target);
    make_parent_dirs(file);
}

FILE *replace_begin(const char *target, char *temp, size_t size) {
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

bool replace_commit(FILE *file, const char *temp, const char *target) {
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
        if (!error && fsync(fileno(file)) != 0) error = errno;
        if (fclose(file) != 0 && !error) error = errno;
    } else if (!sync_path(temp, false)) {
        error = errno;
    }
    char resolved[PATH_MAX];
    const char *file_replaced = replaced_file(target, resolved);
    struct stat old;
    if (!error && stat(file_replaced, &old) == 0 && chmod(temp, old.st_mode & 07777) != 0) error = errno;
    if (!error && rename(temp, file_replaced) != 0) error = errno;
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
    unlink(temp);
    errno = saved;
}
