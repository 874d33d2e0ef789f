// paths.c: see paths.h.
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
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

void replace_temp_name(const char *target, char *temp, size_t size) {
    int len = snprintf(temp, size, "%s.tmp.%ld", target, (long)getpid());
    CHECK(len >= 0 && (size_t)len < size, "path too long: %s", target);
    make_parent_dirs(target);
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
    if (!error && rename(temp, target) != 0) error = errno;
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
