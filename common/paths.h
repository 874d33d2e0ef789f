// paths.h: what a path names, before we open it; folders for output files, and
// replacing them atomically.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

// `mkdir -p` of the folder part of `path`, so "img/run1/loss.png" just works.
// Fatal, naming the folder, if it cannot be created.
void make_parent_dirs(const char *path);

// Why `path` cannot be read as an input file, or NULL when it can be tried:
// "is a directory", or "is not a regular file" for a FIFO, a socket or a
// device (opening a FIFO would wait for a writer, forever). A path that does
// not exist is left to the caller's open, whose errno says so.
const char *input_file_problem(const char *path);

// Whether `path` can be written as an output file, tried now rather than at
// the end of a run (args.c does it for every ARG_OUTPUT flag at parse time):
// false, with the reason in `why` ("is a directory", "cannot create a file in
// logs: Read-only file system"), when it cannot. It leaves no trace: it creates
// and removes a probe file in the target's folder, or, where that folder does
// not exist yet, in the nearest folder above it, where make_parent_dirs will
// create the rest. An existing target must be a regular file (or a link to
// one): renaming over a device or a FIFO would replace it, not write to it.
bool output_file_writable(const char *path, char *why, size_t size);

// Replacing an output file atomically, as the workshop promises ("nothing
// already written is lost"): write a temporary file in the target's folder,
// then rename it over the target. Until the rename the target is untouched, so
// a failed write (a full disk, a killed process) leaves the old file whole,
// never half of a new one. With stdio:
//
//   char temp[PATH_MAX];
//   FILE *file = replace_begin(path, temp, sizeof temp);   // NULL: errno says why
//   fprintf(file, ...);                                    // errors are caught at the commit
//   if (!replace_commit(file, temp, path)) ...             // errno says why; the temp is gone
//
// Writers that open the file by name (HDF5) take replace_temp_name(), create
// `temp` themselves, and end with replace_commit(NULL, temp, path), or with
// replace_abort(NULL, temp) when they fail.
//
// A target that is a symbolic link stays one: the file it points to is
// replaced. A replaced file keeps its permission bits.

// fsync a file or a folder by name (a file that HDF5 wrote and closed): its
// data, or a folder's entries, reach the disk. False, with errno set, if not.
bool sync_path(const char *path, bool folder);

// The temporary name for `target`: "TARGET.tmp.PID". In the target's folder,
// since rename() cannot cross filesystems; with the process id, so that two
// runs writing one target never write into one temporary file. Creates the
// target's parent folders (make_parent_dirs); fatal if the name is too long.
void replace_temp_name(const char *target, char *temp, size_t size);

// replace_temp_name(), then open `temp` for writing (binary). NULL, with errno
// set, when it cannot be created.
FILE *replace_begin(const char *target, char *temp, size_t size);

// Finish: flush `file` (if not NULL) and close it, sync the data to the disk,
// and rename `temp` over `target`. False, with errno set, if any of it failed
// (for a write that failed earlier, the commit reports it); then `temp` is
// removed and `target` is as it was.
bool replace_commit(FILE *file, const char *temp, const char *target);

// Give up: close `file` (if not NULL) and remove `temp`. Keeps errno.
void replace_abort(FILE *file, const char *temp);
