// threads.h: the CPU threads of a rank, one pool for our loops and for BLAS.
//
//   int threads = threads_init(opt.threads);   // torch.set_num_threads(threads)
//   print0("...; %s, %s\n", device_name(device), threads_describe());  // "cpu, 2 threads, OpenBLAS ..."
//
// A rank owns its share of the node's cores: cores / ranks on the node, so
// that `mpirun -np 4` on 4 cores runs 4 one-thread ranks, not 4 x 4 threads;
// but no more than the cores it is bound to (mpirun binds 1 or 2 ranks to one
// core each unless told --bind-to none; the first line then says so).
// --threads N overrides it.
//
// Every loop of a training step (the batch gather, bias and ReLU, the loss,
// the optimizer) is an OpenMP `parallel for` on these threads, and so are the
// GEMMs (tensor.c cuts them into pieces, each one single-threaded BLAS call).
// BLAS itself is kept at one thread: two pools on the same cores would fight
// (tests/test_threads.sh checks that --threads 1 takes one CPU-second per
// second, whatever BLAS the program was built with).
//
// How idle threads wait: between two loops, an idle thread spins 10000 times
// (GOMP_SPINCOUNT=10000, about 0.2 ms on a 2-core Xeon VM), then sleeps.
// libgomp's own default spins 300000 times, some milliseconds, and on a
// machine that anything else uses (another rank, a build, a browser) the
// spinner holds a core that the thread with work needs. Beside one spinning
// process on 2 cores, step 2's loop took 1.51 s under libgomp's default and
// 1.07 s with ours, PyTorch's fast MLP 1.62 s at best; alone, 0.635 s and
// 0.615 s (medians of interleaved runs). Shorter spins (1000, or none:
// OMP_WAIT_POLICY=passive) made the quiet runs 14-19% slower (futex wake-ups).
// docs/speed.md, "Threads on a busy machine", has the measurements. A user's
// OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept: OMP_WAIT_POLICY=active for a
// node of one's own, passive for a crowded one. (libgomp reads them before
// main(): threads.c answers its getenv(); the environment is left as it was.)
#pragma once

// Decide this rank's thread count (requested > 0: exactly that many) and set
// OpenMP to it and BLAS to one thread. Call it once, after dist_init. Returns
// the count. Under `ulimit -v`, a count whose stacks and BLAS buffers would
// take more than half of what the limit leaves is refused (exit 2, one line,
// collectively: it calls MPI); the default count (requested <= 0: a thread
// per core) starts only the threads that fit, and threads_describe says so.
int threads_init(int requested);
int threads_count(void);
// The cores this rank may use: its share of the node (cores / ranks on the
// node), no more than it is bound to, whatever --threads asked. What its
// compute threads leave of them serves other work (step 11's reader workers).
int threads_rank_cores(void);
// The BLAS library and the kernels it chose for this CPU, e.g.
// "OpenBLAS 0.3.21 (Cooperlake kernels)"; "CBLAS" when it is not OpenBLAS.
const char *threads_blas_name(void);
// "2 threads, OpenBLAS 0.3.21 (Cooperlake kernels)" ("1 thread per rank, ..."
// on several ranks), for the first line of a program: how many threads
// compute, with which BLAS.
const char *threads_describe(void);
