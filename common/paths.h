// paths.h: what a path names, before we open it; folders for output files.
#pragma once

// `mkdir -p` of the folder part of `path`, so "img/run1/loss.png" just works.
// Fatal, naming the folder, if it cannot be created.
void make_parent_dirs(const char *path);

// Why `path` cannot be read as an input file, or NULL when it can be tried:
// "is a directory", or "is not a regular file" for a FIFO, a socket or a
// device (opening a FIFO would wait for a writer, forever). A path that does
// not exist is left to the caller's open, whose errno says so.
const char *input_file_problem(const char *path);
