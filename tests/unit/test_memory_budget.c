// test_memory_budget.c: common/runtime/memory_budget.c, what a rank may allocate and the refusal's line.
//
// - a cgroup's limit is the smallest of its folder's and its ancestors' (v2 memory.max, v1
//   memory.limit_in_bytes, v1 with several controllers on one hierarchy); "max", a missing
//   file or no memory controller mean no limit;
// - the host's share divides the node among its ranks, and RLIMIT_AS (ulimit -v) lowers it
//   to what the limit leaves this process, saying so;
// - a GPU's share divides it among the ranks that use it;
// - a need sums its parts (one named twice is one part; past MEMORY_PARTS, the last takes
//   the rest); the refusal is one line that names the flags, the total, each part but the
//   empty ones, "per rank" or the rank, and the share.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/memory_budget.h"
#define TEST_NAME "test_memory_budget"
#include "test.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static void make_folder(const char *path) { mkdir(path, 0700); }

static void test_cgroups(void) {
    char root[] = "/tmp/test_memory_budget.XXXXXX", path[512];
    if (!mkdtemp(root)) {
        EXPECT(false, "mkdtemp for a fake /sys/fs/cgroup");
        return;
    }
    // v2: /a/b with no limit of its own ("max") under /a, limited to 1 MB.
    snprintf(path, sizeof path, "%s/a", root), make_folder(path);
    snprintf(path, sizeof path, "%s/a/b", root), make_folder(path);
    snprintf(path, sizeof path, "%s/a/memory.max", root), write_text(path, "1000000\n");
    snprintf(path, sizeof path, "%s/a/b/memory.max", root), write_text(path, "max\n");
    double limit = memory_cgroup_limit(root, "0::/a/b\n");
    EXPECT(limit == 1e6, "v2: a child without a limit is bound by its parent's memory.max (got %g)", limit);
    snprintf(path, sizeof path, "%s/a/b/memory.max", root), write_text(path, "500000\n");
    limit = memory_cgroup_limit(root, "0::/a/b\n");
    EXPECT(limit == 5e5, "v2: the smaller of the child's and the parent's (got %g)", limit);
    limit = memory_cgroup_limit(root, "0::/elsewhere\n");
    EXPECT(isinf(limit), "v2: a path with no files (a container's view) has no limit (got %g)", limit);
    // v1: the memory hierarchy, alone or with other controllers.
    snprintf(path, sizeof path, "%s/memory", root), make_folder(path);
    snprintf(path, sizeof path, "%s/memory/job", root), make_folder(path);
    snprintf(path, sizeof path, "%s/memory/memory.limit_in_bytes", root), write_text(path, "9223372036854771712\n");
    snprintf(path, sizeof path, "%s/memory/job/memory.limit_in_bytes", root), write_text(path, "2000000\n");
    limit = memory_cgroup_limit(root, "9:pids:/\n4:memory:/job\n1:cpu:/\n");
    EXPECT(limit == 2e6, "v1: memory.limit_in_bytes of the memory controller's path (got %g)", limit);
    limit = memory_cgroup_limit(root, "4:cpu,memory:/job\n");
    EXPECT(limit == 2e6, "v1: the memory controller beside another on one hierarchy (got %g)", limit);
    limit = memory_cgroup_limit(root, "4:memory_other:/job\n5:cpu:/job\n");
    EXPECT(isinf(limit), "v1: no memory controller, no limit (got %g)", limit);
    limit = memory_cgroup_limit(root, "");
    EXPECT(isinf(limit), "no cgroup at all, no limit (got %g)", limit);
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", root);
    if (system(command) != 0) printf("(could not remove %s)\n", root);
}

static void test_host_share(void) {
    MemoryShare one = memory_share_of_host(1, "node"), four = memory_share_of_host(4, "node");
    EXPECT(isfinite(one.bytes) && one.bytes > 0, "the host's share is known here (%.0f bytes: %s)", one.bytes, one.why);
    if (!strstr(one.why, "RLIMIT")) {
        EXPECT(fabs(four.bytes * 4 - one.bytes) < 1e6, "4 ranks share the node: a quarter each (%s; %s)", one.why,
               four.why);
        EXPECT(strstr(four.why, "/ 4 ranks on node") != NULL, "the share says how it was divided: %s", four.why);
    }
    // ulimit -v: what the limit leaves this process, whatever the node has.
    struct rlimit saved;
    getrlimit(RLIMIT_AS, &saved);
    FILE *statm = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (statm) {
        if (fscanf(statm, "%lu", &pages) != 1) pages = 0;
        fclose(statm);
    }
    double mapped = (double)pages * sysconf(_SC_PAGESIZE), room = 300e6;
    struct rlimit lowered = {.rlim_cur = (rlim_t)(mapped + room), .rlim_max = saved.rlim_max};
    if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < lowered.rlim_cur) lowered.rlim_cur = saved.rlim_max;
    if (pages > 0 && setrlimit(RLIMIT_AS, &lowered) == 0) {
        MemoryShare limited = memory_share_of_host(1, "node");
        EXPECT(limited.bytes < room + 20e6 && limited.bytes > room - 50e6,
               "RLIMIT_AS of what is mapped + 300 MB leaves about 300 MB (%.0f MB)", limited.bytes / 1e6);
        EXPECT(strstr(limited.why, "RLIMIT_AS (ulimit -v)") != NULL, "and says so: %s", limited.why);
        setrlimit(RLIMIT_AS, &saved);
    } else {
        printf("SKIP %s: cannot lower RLIMIT_AS here\n", TEST_NAME);
    }
}

static void test_gpu_share(void) {
    MemoryShare share = memory_share_of_gpu(80e9, 2, "cuda:0 (H100)");
    EXPECT(share.bytes == 40e9, "a GPU's 80 GB shared by 2 ranks: 40 GB each (got %g)", share.bytes);
    EXPECT(strcmp(share.why, "this rank's share of its GPU's memory: 40.0 GB (cuda:0 (H100)'s 80.0 GB / 2 ranks)") == 0,
           "and says so: %s", share.why);
    EXPECT(isinf(memory_share_of_gpu(0, 0, "cpu").bytes), "no GPU memory known: no limit");
}

static void test_need_and_refusal(void) {
    char text[64];
    EXPECT(strcmp(memory_format(text, sizeof text, 12.6e9), "12.6 GB") == 0, "12.6e9 bytes: %s", text);
    EXPECT(strcmp(memory_format(text, sizeof text, 55.4e6), "55 MB") == 0, "55.4e6 bytes: %s", text);
    EXPECT(strcmp(memory_format(text, sizeof text, 2001), "3 kB") == 0, "2001 bytes round up: %s", text);
    EXPECT(strcmp(memory_format(text, sizeof text, 1.75e12), "1.8 TB") == 0, "1.75e12 bytes: %s", text);

    MemoryNeed need = memory_need("--hidden %s --tp %d", "1048576", 2);
    memory_need_add(&need, "parameters", 4e9);
    memory_need_add(&need, "gradients", 0);
    memory_need_add(&need, "parameters", 0.2e9);
    memory_need_add(&need, "activations", 8.4e9);
    EXPECT(need.n_parts == 3 && memory_need_bytes(&need) == 12.6e9, "parts named twice are one; the total %g",
           memory_need_bytes(&need));
    MemoryShare share = {.bytes = 11.7e9};
    snprintf(share.why, sizeof share.why, "this rank's share of the node's memory: 11.7 GB (23.4 GB / 2 ranks on vm)");
    char line[1024];
    memory_refusal(line, sizeof line, &need, 0, true, &share);
    const char *expected = "--hidden 1048576 --tp 2 needs about 12.6 GB per rank (parameters 4.2 GB, activations 8.4 GB), "
                           "more than this rank's share of the node's memory: 11.7 GB (23.4 GB / 2 ranks on vm)";
    EXPECT(strcmp(line, expected) == 0, "the refusal names the flags, the parts but the empty one, the share: %s", line);
    EXPECT(strchr(line, '\n') == NULL, "and is one line");
    memory_refusal(line, sizeof line, &need, 3, false, &share);
    EXPECT(strstr(line, "needs about 12.6 GB on rank 3 (") != NULL, "ranks that need different amounts: the rank: %s", line);

    MemoryNeed many = memory_need("--x");
    char name[24];  // "part " and any int
    for (int i = 0; i < MEMORY_PARTS + 3; i++) {
        snprintf(name, sizeof name, "part %d", i);
        memory_need_add(&many, name, 1e6);
    }
    EXPECT(many.n_parts == MEMORY_PARTS && memory_need_bytes(&many) == (MEMORY_PARTS + 3) * 1e6,
           "past %d parts, the last takes the rest: the total stays (%g)", MEMORY_PARTS, memory_need_bytes(&many));
}

int main(void) {
    test_cgroups();
    test_host_share();
    test_gpu_share();
    test_need_and_refusal();
    return test_summary();
}
