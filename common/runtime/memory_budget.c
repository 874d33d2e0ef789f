// memory_budget.c: what this rank may allocate, and the refusal (memory_budget.h says why).
#include "runtime/memory_budget.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/check.h"
#include "runtime/dist.h"

MemoryNeed memory_need(const char *flags_format, ...) {
    MemoryNeed need = {0};
    va_list ap;
    va_start(ap, flags_format);
    vsnprintf(need.flags, sizeof need.flags, flags_format, ap);
    va_end(ap);
    return need;
}

void memory_need_add(MemoryNeed *need, const char *part, double bytes) {
    for (int i = 0; i < need->n_parts; i++)
        if (strcmp(need->parts[i].name, part) == 0) {
            need->parts[i].bytes += bytes;
            return;
        }
    if (need->n_parts == MEMORY_PARTS) {  // the total stays right; only the breakdown is coarser
        need->parts[MEMORY_PARTS - 1].bytes += bytes;
        return;
    }
    snprintf(need->parts[need->n_parts].name, sizeof need->parts[0].name, "%s", part);
    need->parts[need->n_parts++].bytes = bytes;
}

double memory_need_bytes(const MemoryNeed *need) {
    double total = 0;
    for (int i = 0; i < need->n_parts; i++) total += need->parts[i].bytes;
    return total;
}

const char *memory_format(char *out, size_t size, double bytes) {
    if (bytes >= 1e12) snprintf(out, size, "%.1f TB", bytes / 1e12);
    else if (bytes >= 1e9) snprintf(out, size, "%.1f GB", bytes / 1e9);
    else if (bytes >= 1e6) snprintf(out, size, "%.0f MB", bytes / 1e6);
    else snprintf(out, size, "%.0f kB", ceil(bytes / 1e3));
    return out;
}
#define FORMAT_BYTES(bytes) memory_format((char[32]){0}, 32, (bytes))

// ------------------------------------------------------------------ the host's share

// The first number of a file (a cgroup's limit, "max" for none): INFINITY when unreadable or "max".
static double read_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return INFINITY;
    char text[64] = "";
    bool read = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    char *end = NULL;
    double value = read ? strtod(text, &end) : 0;
    return read && end != text && value > 0 ? value : INFINITY;
}

// The smallest limit in `file` of the folder root/path and of each folder above it up to root:
// a cgroup's limit binds its children, and inside a container the path may name folders that
// are not mounted, where only root's file is there.
static double smallest_limit_up(const char *root, const char *path, const char *file) {
    char folder[1024];
    snprintf(folder, sizeof folder, "%s%s", root, path);
    double limit = INFINITY;
    for (;;) {
        char name[1100];
        size_t len = strlen(folder);
        while (len > strlen(root) && folder[len - 1] == '/') folder[--len] = '\0';
        snprintf(name, sizeof name, "%s/%s", folder, file);
        limit = fmin(limit, read_limit(name));
        char *slash = strrchr(folder, '/');
        if (len <= strlen(root) || !slash || slash < folder + strlen(root)) break;
        *slash = '\0';
    }
    return limit;
}

double memory_cgroup_limit(const char *root, const char *self_cgroup) {
    double limit = INFINITY;
    const char *line = self_cgroup;
    while (line && *line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char entry[1024];
        snprintf(entry, sizeof entry, "%.*s", (int)(len < sizeof entry ? len : sizeof entry - 1), line);
        // "hierarchy:controllers:path": v2 has hierarchy 0 and no controllers; v1 names them ("memory").
        char *first = strchr(entry, ':'), *second = first ? strchr(first + 1, ':') : NULL;
        if (second) {
            *first = '\0', *second = '\0';  // entry: the hierarchy's number
            const char *controllers = first + 1, *path = second + 1;
            char root_of[600];
            if (strcmp(entry, "0") == 0 && *controllers == '\0') {
                limit = fmin(limit, smallest_limit_up(root, path, "memory.max"));
            } else {
                for (const char *c = controllers; c && *c; c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL)
                    if (strncmp(c, "memory", 6) == 0 && (c[6] == ',' || c[6] == '\0')) {
                        snprintf(root_of, sizeof root_of, "%s/memory", root);
                        limit = fmin(limit, smallest_limit_up(root_of, path, "memory.limit_in_bytes"));
                    }
            }
        }
        line = end ? end + 1 : NULL;
    }
    return limit;
}

double memory_rlimit_room(int resource) {
    struct rlimit limit;
    if (getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return INFINITY;
    int statm_field = resource == RLIMIT_AS ? 0 : 5;  // statm: size, resident, shared, text, lib, data + stack
    double used = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long pages[6] = {0};
        if (fscanf(f, "%lu %lu %lu %lu %lu %lu", &pages[0], &pages[1], &pages[2], &pages[3], &pages[4], &pages[5]) == 6)
            used = (double)pages[statm_field] * (double)sysconf(_SC_PAGESIZE);
        fclose(f);
    }
    return fmax(0.0, (double)limit.rlim_cur - used);
}

MemoryShare memory_share_of_host(int local_ranks, const char *host) {
    MemoryShare share = {.bytes = INFINITY};
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    double node = pages > 0 && page_size > 0 ? (double)pages * page_size : INFINITY;
    double cgroup = INFINITY;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
        char text[4096];
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
        cgroup = memory_cgroup_limit("/sys/fs/cgroup", text);
    }
    if (local_ranks < 1) local_ranks = 1;
    const char *whose = cgroup < node ? "its cgroup's memory limit" : "the node's memory";
    double whole = fmin(node, cgroup);
    if (isfinite(whole)) {
        share.bytes = whole / local_ranks;
        snprintf(share.why, sizeof share.why, "this rank's share of %s: %s (%s / %d rank%s on %s)", whose, FORMAT_BYTES(share.bytes),
                 FORMAT_BYTES(whole), local_ranks, local_ranks == 1 ? "" : "s", host);
    }
    // A limit of this process alone (not shared with the node's other ranks).
    const struct { int resource; const char *name; } limits[] = {
        {RLIMIT_AS, "RLIMIT_AS (ulimit -v)"}, {RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)"}};
    for (int i = 0; i < 2; i++) {
        double room = memory_rlimit_room(limits[i].resource);
        if (room < share.bytes) {
            share.bytes = room;
            snprintf(share.why, sizeof share.why, "what %s leaves this process: %s", limits[i].name, FORMAT_BYTES(room));
        }
    }
    return share;
}

MemoryShare memory_share_of_gpu(double gpu_bytes, int ranks_on_gpu, const char *gpu_name) {
    MemoryShare share = {.bytes = INFINITY};
    if (gpu_bytes <= 0) return share;
    if (ranks_on_gpu < 1) ranks_on_gpu = 1;
    share.bytes = gpu_bytes / ranks_on_gpu;
    snprintf(share.why, sizeof share.why, "this rank's share of its GPU's memory: %s (%s's %s / %d rank%s)", FORMAT_BYTES(share.bytes),
             gpu_name, FORMAT_BYTES(gpu_bytes), ranks_on_gpu, ranks_on_gpu == 1 ? "" : "s");
    return share;
}

MemoryShare memory_share(Device device) {
    if (device == DEVICE_CUDA) {
        int ranks_on_gpu = 0;
        double gpu_bytes = device_gpu_memory_bytes(&ranks_on_gpu);
        return memory_share_of_gpu(gpu_bytes, ranks_on_gpu, device_name(device));
    }
    return memory_share_of_host(dist_local_world_size(), dist_hostname());
}

// ------------------------------------------------------------------ the refusal

void memory_refusal(char *out, size_t size, const MemoryNeed *need, int rank, bool same_on_every_rank,
                    const MemoryShare *share) {
    char parts[512] = "", where[32];
    size_t used = 0;
    for (int i = 0; i < need->n_parts && used < sizeof parts; i++)
        if (need->parts[i].bytes > 0)  // a part this configuration does not have (no gradients on ZeRO's shard...) is left out
            used += (size_t)snprintf(parts + used, sizeof parts - used, "%s%s %s", used ? ", " : "",
                                     need->parts[i].name, FORMAT_BYTES(need->parts[i].bytes));
    if (same_on_every_rank) snprintf(where, sizeof where, "per rank");
    else snprintf(where, sizeof where, "on rank %d", rank);
    snprintf(out, size, "%s needs about %s %s (%s), more than %s", need->flags,
             FORMAT_BYTES(memory_need_bytes(need)), where, parts, share->why);
}

void memory_require(const MemoryNeed *need, Device device) {
    MemoryShare share = memory_share(device);
    double mine[2] = {memory_need_bytes(need), share.bytes};
    int world = dist_world_size(), rank = dist_rank();
    double *all = xmalloc((size_t)(2 * world) * sizeof(double));
    // One collective: every rank sees every rank's need and share, and so takes the same verdict.
    CHECK_MPI(MPI_Allgather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, MPI_COMM_WORLD));
    int shortest = -1;
    double worst = 1.0;
    bool same = true;
    for (int r = 0; r < world; r++) {
        double ratio = all[2 * r] / all[2 * r + 1];  // 0 over an unknown (infinite) share: fits
        if (ratio > worst) worst = ratio, shortest = r;
        same = same && all[2 * r] == all[0];
    }
    free(all);
    if (shortest < 0) return;
    if (rank == shortest) {
        char line[1024];
        memory_refusal(line, sizeof line, need, rank, same, &share);
        fflush(stdout);
        fprintf(stderr, "error: %s\n", line);
        fflush(stderr);
    }
    dist_finalize();
    exit(EXIT_USAGE);
}
