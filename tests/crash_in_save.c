// crash_in_save.c: a process that dies in the middle of writing a checkpoint, at a chosen
// moment, so that tests/test_checkpoint.sh can show that the last good checkpoint survives.
// Preloaded into the ranks:
//
//   mpirun -np 2 -x LD_PRELOAD=build/lib/libcrash_in_save.so -x CRASH_IN_SAVE=tmp-000004/shard-00001.h5
//       day4/18_zero_sharding --checkpoint ckpt --save_every 2
//
// The process that calls fsync() on a file whose path contains CRASH_IN_SAVE (for the
// CRASH_IN_SAVE_COUNT-th time, 1 unless set) SIGKILLs itself instead, as a node that loses power would: its file written but not synced, and nothing after
// it done (the other ranks' barrier, the index, the renames). With "tmp-000004/shard-00001.h5"
// rank 1 dies in its own part of the save of step 4; with "current.tmp" and a count of 2, rank 0
// dies in the second save after the step's folder got its final name but before `current` names it. It says so on stderr first.
// With CRASH_IN_SAVE_ERRNO=28 (or another errno) set too, that fsync() fails with it instead (ENOSPC:
// a disk that fills as the file is synced), and the process lives on: a save that fails on one rank
// alone.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // RTLD_NEXT
#endif
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fsync(int fd) {
    static int (*real_fsync)(int);
    if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    const char *target = getenv("CRASH_IN_SAVE");
    if (target && *target) {
        char link[64], path[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        if (n > 0) {
            path[n] = '\0';
            static int seen;
            const char *count = getenv("CRASH_IN_SAVE_COUNT");
            const char *fail_with = getenv("CRASH_IN_SAVE_ERRNO");
            int error = fail_with ? atoi(fail_with) : 0;
            if (strstr(path, target) && ++seen == (count ? atoi(count) : 1)) {
                if (error > 0) {
                    fprintf(stderr, "crash_in_save: process %ld fails to sync %s (errno %d)\n", (long)getpid(), path, error);
                    fflush(stderr);
                    errno = error;
                    return -1;
                }
                fprintf(stderr, "crash_in_save: process %ld dies before syncing %s (SIGKILL)\n", (long)getpid(), path);
                fflush(stderr);
                raise(SIGKILL);
            }
        }
    }
    return real_fsync(fd);
}
