// paths.h: output files may name folders that do not exist yet.
#pragma once

// `mkdir -p` of the folder part of `path`, so "img/run1/loss.png" just works.
// Fatal, naming the folder, if it cannot be created.
void make_parent_dirs(const char *path);
