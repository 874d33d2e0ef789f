// paths.c: see paths.h.
#include "paths.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

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
