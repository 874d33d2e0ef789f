// profile.h: named time ranges, for Nsight Systems and for a trace of our own.
//
//   profile_start("log_ddp/trace.json");   // record from now on (NULL: summary only)
//   profile_push("forward"); ... profile_pop();        // nested ranges, main thread
//   ProfileRange r = profile_range_start("allreduce", PROFILE_COMM_THREAD);
//   ... profile_range_end(&r);                          // any thread, may cross threads
//   profile_mark("step");                              // an instant
//   profile_summary();       // collective: rank 0 prints the table of every rank's ranges
//
// Each range is an NVTX3 range (header-only, /usr/local/cuda/include/nvtx3), so
// `nsys profile -t nvtx` shows it; built without NVTX (HAVE_NVTX undefined), the
// NVTX calls compile to nothing. Once profile_start() has run, each range is
// also recorded with host timestamps; at dist_finalize() (profile_start
// registers it there) profile_finish gathers all ranks'
// records to rank 0, which writes them as Chrome trace-event JSON (one process
// per rank, one track per thread, peak memory as a counter), for Perfetto
// (ui.perfetto.dev) or chrome://tracing. Recording costs two clock reads a range.
#pragma once

enum { PROFILE_MAIN_THREAD = 0, PROFILE_COMM_THREAD = 1 };

typedef struct {
    const char *name;
    double start;
    int thread;
    unsigned long long nvtx_id;
} ProfileRange;

void profile_start(const char *trace_path);

void profile_push(const char *name);
void profile_pop(void);
ProfileRange profile_range_start(const char *name, int thread);
void profile_range_end(ProfileRange *range);
void profile_mark(const char *name);
// Whether ranges are being recorded (profile_start has run).
int profile_recording(void);
// A range timed by other means, on wall_seconds()'s clock: NCCL's allreduce,
// placed on the host's clock by CUDA events (ddp_gpu.c). Recorded only.
void profile_range_record(const char *name, int thread, double start, double end);

// Collective. Rank 0 prints, per range name: calls, total and mean ms (mean
// over ranks, slowest rank in brackets) and the share of the "step" range,
// plus each rank's peak memory.
void profile_summary(void);
// Collective: write the trace file, if one was asked for. profile_start
// registers it with dist_at_finalize; calling it earlier ends the recording.
void profile_finish(void);
