// paths.h: what a path names, before we open it; folders for output files, and
// replacing them atomically.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

// `mkdir -p` of `folder`: it and every folder above it that is missing. False,
// with errno set, if one cannot be made (a caller that must not stop the run,
// the MLflow folder store, says so itself).
bool make_dirs(const char *folder);
// `mkdir -p` of the folder part of `path`, so "img/run1/loss.png" just works.
// Fatal, naming the folder, if it cannot be created.
void make_parent_dirs(const char *path);

// Why `path` cannot be read as an input file, or NULL when it can be tried:
// "is a directory", or "is not a regular file" for a FIFO, a socket or a
// device (opening a FIFO would wait for a writer, forever). A path that does
// not exist is left to the caller's open, whose errno says so.
const char *input_file_problem(const char *path);

// For a relative `path` that the working directory does not have: the nearest
// folder above the working directory, or the running program's own folder or
// one above it, that does (`./2_mnist_training` run inside day1/ looks for
// data/mnist there; the repository root has it). False, with `folder` "", when
// none does, or when `path` is absolute.
bool find_from_above(const char *path, char *folder, size_t size);
// The same for a file that may be stored under either of two names (MNIST's plain IDX file
// or its .gz): the nearest folder that has one of them, so that a .gz near the working
// directory is not passed over for a plain file beside the program.
bool find_either_from_above(const char *path, const char *alternative, char *folder, size_t size);

// The nearest folder at or above the running program's own that holds a
// Makefile: the repository root, for day1/2_mnist_training. False if none.
bool program_repository(char *folder, size_t size);

// Where to run from, for a relative input that find_from_above found in
// `folder`: "relative to the working directory CWD; run from [the repository
// root ]FOLDER or pass FLAG FOLDER/VALUE" (FLAG VALUE: the flag that names it).
void run_from_hint(const char *folder, const char *flag, const char *value, char *hint, size_t size);

// Whether writing `path` writes a stream in place rather than replacing a
// file: this process's stdout or stderr (/dev/stdout, or the very file they
// are redirected to, as in `--losses run.log > run.log`), or a character device
// (/dev/null, a terminal). replace_begin writes those directly.
bool output_is_stream(const char *path);

// Whether `path` can be written as an output file, tried now rather than at
// the end of a run (args.c does it for every output flag at parse time):
// false, with the reason in `why` ("is a directory", "cannot create a file in
// logs: Read-only file system"), when it cannot. It leaves no trace: it creates
// and removes a probe file in the folder of the file that will be written (see
// replace_target), or, where that folder does not exist yet, in the nearest
// folder above it, where make_parent_dirs will create the rest; and it checks
// that the temporary name fits the filesystem's limit on a name. An existing
// target must be a regular file or a stream: renaming over a FIFO or a device
// would replace it, not write to it.
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
//   if (!replace_commit(file, temp)) ...                   // errno says why; the temp is gone
//
// Writers that open the file by name (HDF5) take replace_temp_name(), create
// `temp` themselves, and end with replace_commit(NULL, temp), or with
// replace_abort(NULL, temp) when they fail. They cannot write a stream.
//
// A target that is a symbolic link stays one: the file it points to is
// replaced (or created, for a link to nothing yet). A replaced file keeps its
// permission bits. A stream (output_is_stream) is written in place, and `temp`
// is then "".

// The file that replacing `target` writes: `target` itself, or, where it is a
// symbolic link (or a chain of them), the file it points to, which need not
// exist yet, as writing through a link does. Returns `target` or `resolved`.
const char *replace_target(const char *target, char *resolved, size_t size);

// fsync a file or a folder by name (a file that HDF5 wrote and closed): its
// data, or a folder's entries, reach the disk. False, with errno set, if not.
bool sync_path(const char *path, bool folder);

// The temporary name for `target`: "FILE.tmp.PID", FILE from replace_target.
// In the file's folder, since rename() cannot cross filesystems; with the
// process id, so that two runs writing one target never write into one
// temporary file. Creates the file's parent folders (make_parent_dirs); fatal
// if the name is too long.
void replace_temp_name(const char *target, char *temp, size_t size);

// Give `temp` the permission bits of `file`, if it exists, and rename it over
// `file`. False, with errno set, if either fails. (snapshot.c, which writes
// its own FILE.tmp, ends with it too.)
bool replace_rename(const char *temp, const char *file);

// replace_temp_name(), then open `temp` for writing (binary); or, for a stream,
// open it to write in place, with temp = "". NULL, with errno set, when it
// cannot be opened.
FILE *replace_begin(const char *target, char *temp, size_t size);

// Finish: flush `file` (if not NULL) and close it, sync the data to the disk,
// and rename `temp` over the file it replaces (FILE of "FILE.tmp.PID"). False,
// with errno set, if any of it failed (for a write that failed earlier, the
// commit reports it); then `temp` is removed and the target is as it was. For
// a stream: flush and close.
bool replace_commit(FILE *file, const char *temp);

// Give up: close `file` (if not NULL) and remove `temp`. Keeps errno.
void replace_abort(FILE *file, const char *temp);
