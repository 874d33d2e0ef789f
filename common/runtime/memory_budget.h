// memory_budget.h: what this rank may allocate, and the refusal of flags that ask for more.
//
//   MemoryNeed need = memory_need("--tp %d --hidden %s", tp, hidden);  // the flags that size it
//   memory_need_add(&need, "parameters", 4.0 * weights);               // the parts, as the program
//   memory_need_add(&need, "Adam's moments", 8.0 * weights);           // prints them at the end
//   memory_require(&need, device);                                     // collective: fits, or exit 2
//
// A flag that asks for more memory than the machine has would otherwise end in
// the kernel's OOM killer, which kills a rank without a word (rc 137) after it
// has grown for a while, or in swap. So each training program adds up what its
// flags will allocate per rank before it allocates anything, and refuses in one
// line, exit status 2 on every rank, what exceeds this rank's share:
//   error: --hidden 1048576 --tp 2 --batch_size 6400 needs about 35.3 GB per rank (parameters 1.7 GB, gradients 1.7 GB,
//   Adam's moments 3.3 GB, DDP's buckets 1.7 GB, activations 26.8 GB, data 107 MB), more than this rank's
//   share of the node's memory: 12.6 GB (25.3 GB / 2 ranks on vm)
// (one line). The share of a CPU rank: the node's memory (MemTotal, or its cgroup's
// limit, v2 memory.max or v1 memory.limit_in_bytes, when smaller) divided among the
// ranks on the node; less where RLIMIT_AS (ulimit -v) or RLIMIT_DATA (ulimit -d)
// leaves this process less room than that (what it has mapped already counted), so
// that a test can fake a small machine with ulimit. A GPU rank's: its GPU's memory
// divided among the ranks that share that GPU.
//
// An estimate, not an accounting: what the libraries, MPI and the allocator take
// besides is left out (tests/test_memory_limits.sh holds the estimate within a
// stated factor of the peak resident set measured). Ranks may need different
// amounts (pipeline stages): one allgather agrees the verdict, and the rank
// shortest of memory prints the line, naming its own figures.
//
// Layer 3: above dist (the ranks of the node, the allgather) and device (the GPU's memory).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "runtime/device.h"

enum { MEMORY_PARTS = 8 };

typedef struct {
    char flags[160];  // the flags that size it, as the program read them: "--tp 2 --hidden 1048576"
    int n_parts;
    struct {
        char name[32];  // "parameters", "Adam's moments", "activations", "data", ...
        double bytes;
    } parts[MEMORY_PARTS];
} MemoryNeed;

// An empty need for the flags named by the printf-like format (values the
// program has already validated: numbers, a --hidden list).
__attribute__((format(printf, 1, 2))) MemoryNeed memory_need(const char *flags_format, ...);
// Add `bytes` under `part` (a part added twice is summed; more than MEMORY_PARTS
// parts are summed into the last).
void memory_need_add(MemoryNeed *need, const char *part, double bytes);
double memory_need_bytes(const MemoryNeed *need);

typedef struct {
    double bytes;   // what this rank may allocate; INFINITY when nothing is known
    char why[192];  // what it is: "this rank's share of the node's memory: 11.7 GB (23.4 GB / 2 ranks on vm)"
} MemoryShare;

// A CPU rank's share of its node: MemTotal or the cgroup's limit (the smaller)
// over `local_ranks`, or what RLIMIT_AS / RLIMIT_DATA leave this process when less.
MemoryShare memory_share_of_host(int local_ranks, const char *host);
// What a resource limit leaves this process to map: the limit (RLIMIT_AS: ulimit -v;
// RLIMIT_DATA: ulimit -d) less what /proc/self/statm says it maps already (its whole
// address space, or data + stack). INFINITY without a limit. (threads.c asks it too,
// for the stacks of --threads.)
double memory_rlimit_room(int resource);
// A GPU rank's share: the GPU's `gpu_bytes` over the `ranks_on_gpu` ranks that use it.
MemoryShare memory_share_of_gpu(double gpu_bytes, int ranks_on_gpu, const char *gpu_name);
// This rank's share on `device` (the GPU's where it computes on one).
MemoryShare memory_share(Device device);

// The smallest memory limit of a cgroup and its ancestors, in bytes (INFINITY
// when there is none): `self_cgroup` is /proc/self/cgroup's content, `root` where
// the cgroup file systems are mounted (/sys/fs/cgroup): v2's "0::/path" reads
// root/path/memory.max, v1's "N:memory:/path" root/memory/path/memory.limit_in_bytes.
double memory_cgroup_limit(const char *root, const char *self_cgroup);

// The refusal's one line (without "error: "): `need` on `rank` (or "per rank"
// when every rank needs the same), beyond `share`.
void memory_refusal(char *out, size_t size, const MemoryNeed *need, int rank, bool same_on_every_rank,
                    const MemoryShare *share);

// Collective over the world: returns when every rank's need fits its share;
// otherwise the rank shortest of memory (its need over its share; the lowest
// such rank) prints "error: <memory_refusal's line>" and every rank exits with
// status 2 (dist_finalize first, so no rank is left waiting).
void memory_require(const MemoryNeed *need, Device device);

// "1.2 TB", "12.6 GB", "55 MB", "3 kB": bytes as the refusal shows them (decimal units, as the programs' reports).
const char *memory_format(char *out, size_t size, double bytes);
