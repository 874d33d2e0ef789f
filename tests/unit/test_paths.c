// test_paths.c: what common/base/paths.c says about a path before a program uses
// it, and how it replaces a file.
//
// - output_file_writable: the cases that would otherwise fail only after the
//   training (a folder as the target, a plain file where a folder must be, a
//   FIFO, a final '/', a name too long for its temporary suffix), the ones that
//   must pass (a new file, in folders that do not exist yet, through links and
//   dangling links, a bare name, /dev/null), and that trying leaves nothing
//   behind: no probe file, no folder.
// - replace_begin/replace_commit: the new bytes arrive, a symbolic link stays a
//   link (the file it points to is replaced: through a chain, or created where
//   a dangling one points), the old file's mode is kept, no temporary file is
//   left, and a stream (/dev/null) is written in place; replace_abort leaves
//   the old file as it was.
// (tests/test_outputs.sh runs the programs: refusals on 1 and 2 ranks, a
// read-only filesystem, writes that fail.)
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/paths.h"

#define TEST_NAME "test_paths"
#include "test.h"

static char g_dir[PATH_MAX];

// g_dir/name, in a static buffer (one of a few in turn).
static const char *at(const char *name) {
    static char buffers[4][PATH_MAX + 320];
    static int next;
    char *path = buffers[next++ % 4];
    snprintf(path, sizeof buffers[0], "%s/%s", g_dir, name);
    return path;
}

// A path as the messages show it: relative to g_dir where it is inside it.
static const char *shown(const char *path) {
    size_t n = strlen(g_dir);
    return strncmp(path, g_dir, n) == 0 ? path + n + 1 : (*path ? path : "''");
}

static void write_text(const char *path, const char *text) {
    FILE *file = fopen(path, "w");
    if (file) fputs(text, file), fclose(file);
}

static int same_text(const char *path, const char *text) {
    char got[256] = "";
    FILE *file = fopen(path, "r");
    if (!file) return 0;
    size_t n = fread(got, 1, sizeof got - 1, file);
    fclose(file);
    got[n] = '\0';
    return strcmp(got, text) == 0;
}

// The names in g_dir that are neither "." nor ".." nor in `expected` (a
// space-separated list), written into `extra`: leftovers of a probe or a temp.
static int only_these_names(const char *expected, char *extra, size_t size) {
    extra[0] = '\0';
    DIR *dir = opendir(g_dir);
    if (!dir) return 0;
    for (struct dirent *entry; (entry = readdir(dir));) {
        const char *name = entry->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
        char padded[300];
        snprintf(padded, sizeof padded, " %s ", name);
        char list[512];
        snprintf(list, sizeof list, " %s ", expected);
        if (!strstr(list, padded)) snprintf(extra + strlen(extra), size - strlen(extra), "%s ", name);
    }
    closedir(dir);
    return extra[0] == '\0';
}

static void expect_refused(const char *path, const char *reason) {
    char why[PATH_MAX + 64] = "";
    int writable = output_file_writable(path, why, sizeof why);
    EXPECT(!writable && strstr(why, reason) != NULL, "%s is refused: '%s' (expected '%s')", shown(path),
           why, reason);
}

static void expect_writable(const char *path) {
    char why[PATH_MAX + 64] = "";
    int writable = output_file_writable(path, why, sizeof why);
    EXPECT(writable, "%s can be written%s%s", shown(path), writable ? "" : ": ", why);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/test_paths.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) return perror(g_dir), 1;
    mkdir(at("folder"), 0777);
    write_text(at("plain"), "plain");
    mkfifo(at("fifo"), 0666);
    const char *links[][2] = {{"plain", "link_to_file"}, {"folder", "link_to_folder"}, {"nowhere", "dangling"},
                              {"link_to_file", "chain"}, {"folder/sub/target.csv", "dangling_deep"}};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
        if (symlink(links[i][0], at(links[i][1])) != 0) return perror(at(links[i][1])), 1;
    const char *names = "folder plain fifo link_to_file link_to_folder dangling chain dangling_deep";

    // ------------------------------------------------ output_file_writable
    expect_refused(at("folder"), "is a directory");
    expect_refused(at("link_to_folder"), "is a directory");
    expect_refused(at("folder/"), "names a folder, not a file");
    expect_refused(at("fifo"), "is not a regular file");
    expect_refused(at("plain/w.h5"), "plain is not a folder");
    expect_refused(at("plain/a/b/w.h5"), "plain is not a folder");
    char long_name[300];
    snprintf(long_name, sizeof long_name, "%0250d.csv", 0);  // 254 bytes: a legal name, but not with ".tmp.PID"
    expect_refused(at(long_name), "with the temporary suffix");
    expect_refused("", "is an empty name");

    expect_writable(at("new.h5"));
    expect_writable(at("plain"));  // an existing file is replaced
    expect_writable(at("link_to_file"));
    expect_writable(at("dangling"));  // a new file where the link points
    expect_writable(at("chain"));
    expect_writable(at("dangling_deep"));
    expect_writable("/dev/null");  // a stream: written in place
    expect_writable(at("folder/new.csv"));
    expect_writable(at("not/yet/there/w.h5"));  // make_parent_dirs creates them at the write
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) && chdir(g_dir) == 0) {
        char why[PATH_MAX + 64] = "";
        EXPECT(output_file_writable("bare.csv", why, sizeof why), "a bare name in the current folder can be written %s",
               why);
        if (chdir(cwd) != 0) perror(cwd);
    }
    char extra[512];
    struct stat info;
    EXPECT(only_these_names(names, extra, sizeof extra) && stat(at("folder/new.csv"), &info) != 0,
           "trying leaves no probe file and creates no folder (left: '%s')", extra);

    // ------------------------------------------------ replace_*
    // Through a link: the link stays, the file it points to gets the new bytes
    // and keeps its mode (0640, not the umask's 0644).
    chmod(at("plain"), 0640);
    char temp[PATH_MAX + 64];
    FILE *file = replace_begin(at("link_to_file"), temp, sizeof temp);
    if (file) fputs("new", file);
    int committed = file && replace_commit(file, temp);
    struct stat link_info, file_info;
    lstat(at("link_to_file"), &link_info);
    stat(at("plain"), &file_info);
    EXPECT(committed && S_ISLNK(link_info.st_mode) && same_text(at("plain"), "new") &&
               (file_info.st_mode & 07777) == 0640 && only_these_names(names, extra, sizeof extra),
           "replacing through a link keeps the link, writes the file it points to, keeps mode 0640 (got %o), "
           "and leaves no temp (left: '%s')",
           file_info.st_mode & 07777, extra);

    // Through a chain of links (chain -> link_to_file -> plain): both links stay.
    file = replace_begin(at("chain"), temp, sizeof temp);
    if (file) fputs("chained", file);
    committed = file && replace_commit(file, temp);
    struct stat chain_info;
    lstat(at("chain"), &chain_info);
    lstat(at("link_to_file"), &link_info);
    EXPECT(committed && S_ISLNK(chain_info.st_mode) && S_ISLNK(link_info.st_mode) && same_text(at("plain"), "chained"),
           "replacing through a chain of two links keeps both and writes the file at its end");

    // Through a link to nothing yet: the file it names is created, in a folder made for it, and the link stays.
    file = replace_begin(at("dangling_deep"), temp, sizeof temp);
    if (file) fputs("created", file);
    committed = file && replace_commit(file, temp);
    lstat(at("dangling_deep"), &link_info);
    EXPECT(committed && S_ISLNK(link_info.st_mode) && same_text(at("folder/sub/target.csv"), "created"),
           "replacing through a dangling link creates the file it names (folder/sub/target.csv) and keeps the link");

    // A stream is written in place: no temporary name, and /dev/null stays a device.
    file = replace_begin("/dev/null", temp, sizeof temp);
    if (file) fputs("nothing", file);
    committed = file && replace_commit(file, temp);
    struct stat null_info;
    stat("/dev/null", &null_info);
    EXPECT(output_is_stream("/dev/null") && !output_is_stream(at("plain")) && committed && temp[0] == '\0' &&
               S_ISCHR(null_info.st_mode),
           "/dev/null is a stream, written in place (temp '%s'), and stays a device", temp);

    // A new file, in folders made for it.
    file = replace_begin(at("made/for/it.csv"), temp, sizeof temp);
    if (file) fputs("fresh", file);
    committed = file && replace_commit(file, temp);
    EXPECT(committed && same_text(at("made/for/it.csv"), "fresh"), "a new file is written, in the folders made for it");

    // Abandoned: the old file stays whole, and the temp is gone.
    file = replace_begin(at("plain"), temp, sizeof temp);
    if (file) fputs("half of a new", file);
    replace_abort(file, temp);
    EXPECT(same_text(at("plain"), "chained") && access(temp, F_OK) != 0,
           "replace_abort leaves the old file as it was and removes %s", shown(temp));

    char command[PATH_MAX + 16];
    snprintf(command, sizeof command, "rm -rf '%s'", g_dir);
    if (system(command) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_summary();
}
