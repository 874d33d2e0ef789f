// Step 7: what does scaling buy? Time the training loop.    PyTorch twin: 7_mnist_ddp_pt_timing.py
//
// What it adds over step 6: every rank times its training loop, rank 0
// reports the slowest (the job is as fast as its slowest rank), and with
// --results FILE.csv each run appends "world_size,seconds" and prints the
// table of every world size in the file so far, with the speed-up over one
// rank, and draws it (--chart). A results file with a malformed row is refused
// before training, and left as it is. The companion script runs it at 1, 2,
// 4 ranks:
//   day1/7_scaling.sh                  (or: make scaling)
// The batch is per rank, so W ranks take 1/W of the steps per epoch, each of
// them as expensive as before: ideally the loop is W times faster. On one CPU
// node it is not: one rank already computes on every core, and W ranks divide
// the same cores among them (each takes cores / W threads). More ranks bring
// more hardware only across nodes, or with a GPU each.
//
// Build and run:
//   make day1/7_mnist_ddp_timing
//   mpirun -np 2 day1/7_mnist_ddp_timing --results scaling.csv   (add --oversubscribe on fewer cores)
//
// Expected output (times vary):
//   Step 7: DDP on 2 ranks: MLP 784-128-10, ...
//   epoch 1/5: mean loss 2.1628 over 5 steps, 0.10 s, 598130 samples/s
//   ...
//   [rank 1] training loop: 0.503 s
//   [rank 0] training loop: 0.503 s
//   World Size: 2. Training completed in 0.50 seconds (slowest rank). Test accuracy: 84.54% (8454 of 10000)
//   DDP: gradient allreduce 1.56 ms per step in 1 bucket, 0.07 ms (4%) of it hidden behind backward; the step waited 1.52 ms for it
//   
//   world size   training s  speed-up  efficiency   (with --results, after runs at 1 and 2 ranks)
//            1        0.470     1.00x        100%
//            2        0.503     0.94x         47%
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accum.h"     // micro_batch: which micro-batches make one optimizer step
#include "args.h"      // args_parse: the flags and --help
#include "check.h"     // CHECK, xmalloc: fail fast, on every rank
#include "ddp.h"       // ddp_wrap, ddp_grad_ready, ddp_finish: DistributedDataParallel
#include "dist.h"      // dist_init, dist_rank, print0: the process group
#include "h5.h"        // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "loss_log.h"  // loss_log_add, loss_log_plot: the loss of every step, CSV and PNG
#include "mnist.h"     // mnist_load, DistributedSampler, mnist_batch: the data
#include "nn.h"        // Mlp, its forward and backward, Adam, SGD: model and optimizer
#include "paths.h"     // replace_begin, replace_commit: --results is replaced whole, never half written
#include "plot.h"      // the speed-up chart
#include "threads.h"   // threads_init: this rank's CPU threads
#include "timer.h"     // wall_seconds

// ---------------------------------------------------------------- --results
// The results CSV: a header line world_size,seconds (files written before it
// had none), then one row per run. Kept as text, so that adding a run writes
// the old rows back as they were.
static const char RESULTS_HEADER[] = "world_size,seconds";

typedef struct {
    char *text;  // the file as read, NUL-terminated; size 0: no file yet
    size_t size;
    int *worlds;
    double *seconds;
    int n, capacity;
} Results;

static void results_add(Results *r, int world, double seconds) {
    if (r->n == r->capacity) {
        r->capacity = r->capacity ? 2 * r->capacity : 16;
        r->worlds = realloc(r->worlds, (size_t)r->capacity * sizeof *r->worlds);
        r->seconds = realloc(r->seconds, (size_t)r->capacity * sizeof *r->seconds);
        CHECK(r->worlds && r->seconds, "out of memory for %d runs", r->capacity);
    }
    r->worlds[r->n] = world, r->seconds[r->n] = seconds, r->n++;
}

static void results_free(Results *r) {
    free(r->text);
    free(r->worlds);
    free(r->seconds);
    *r = (Results){0};
}

// "W,S": an integer world size >= 1 and a time in seconds, finite and > 0.
static bool parse_row(const char *row, int *world, double *seconds) {
    const char *comma = strchr(row, ',');
    if (!comma || strchr(comma + 1, ',')) return false;  // two fields
    char *end;
    errno = 0;
    long w = strtol(row, &end, 10);
    if (end == row || end != comma || errno || w < 1 || w > INT_MAX) return false;
    double t = strtod(comma + 1, &end);
    if (end == comma + 1 || *end != '\0' || !isfinite(t) || t <= 0) return false;
    *world = (int)w, *seconds = t;
    return true;
}

// Read and check the whole file. A missing one is empty: the first run creates
// it. False at the first problem, which `err` names with its line.
static bool results_read(const char *path, Results *r, char *err, size_t err_size) {
    *r = (Results){0};
    const char *problem = input_file_problem(path);
    if (problem) return snprintf(err, err_size, "--results %s: %s, not a CSV file", path, problem), false;
    FILE *file = fopen(path, "rb");
    if (!file && errno == ENOENT) return true;
    if (!file) return snprintf(err, err_size, "--results %s: cannot open: %s", path, strerror(errno)), false;
    size_t capacity = 4096, got;
    r->text = xmalloc(capacity);
    while ((got = fread(r->text + r->size, 1, capacity - 1 - r->size, file)) > 0) {
        r->size += got;
        if (r->size + 1 == capacity) {
            capacity *= 2;
            r->text = realloc(r->text, capacity);
            CHECK(r->text != NULL, "--results %s: out of memory reading it", path);
        }
    }
    bool failed = ferror(file);
    int error = errno;
    fclose(file);
    if (failed) return snprintf(err, err_size, "--results %s: cannot read: %s", path, strerror(error)), false;
    r->text[r->size] = '\0';
    if (strlen(r->text) != r->size) return snprintf(err, err_size, "--results %s: not a text file", path), false;

    int line_number = 0;
    size_t len;
    for (const char *line = r->text; *line; line += len + (line[len] == '\n')) {
        len = strcspn(line, "\n");
        line_number++;
        char row[128];
        snprintf(row, sizeof row, "%.*s", (int)len, line);  // cut if longer: then it is no row of ours
        if (row[0] && row[strlen(row) - 1] == '\r') row[strlen(row) - 1] = '\0';  // a CRLF file
        if (row[0] == '\0' || (line_number == 1 && strcmp(row, RESULTS_HEADER) == 0)) continue;  // blank, header
        int world;
        double seconds;
        if (len >= sizeof row || !parse_row(row, &world, &seconds))
            return snprintf(err, err_size,
                            "--results %s: line %d is '%.40s%s', expected world_size,seconds: an integer world "
                            "size >= 1 and the seconds, a finite number > 0",
                            path, line_number, row, strlen(row) > 40 ? "..." : ""), false;
        results_add(r, world, seconds);
    }
    return true;
}

// Before training: a results file that is corrupt, or cannot be read, is
// refused now, not after the run (and it stays as it is). Rank 0 reads it,
// since rank 0 writes it; every rank exits.
static void check_results(const char *path) {  // (never '': --results is an ARG_OUTPUT)
    char err[512] = "";
    int bad = 0;
    if (dist_rank() == 0) {
        Results r;
        bad = !results_read(path, &r, err, sizeof err);
        results_free(&r);
    }
    CHECK_MPI(MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (bad) usage_error("%s", err);  // printed once, by rank 0
}

// Add this run to the results CSV, then print the table of all its runs and
// draw the speed-up chart. Rank 0 only.
static void scaling_report(const char *path, int world, double seconds, const char *chart) {
    // Read again: another run may have added its row since the check.
    Results r;
    char err[512];
    CHECK(results_read(path, &r, err, sizeof err), "%s", err);
    // The old rows as they were, and this run's, into a new file renamed over
    // the old one: a failed write (a full disk) loses no run.
    char temp[PATH_MAX];
    FILE *file = replace_begin(path, temp, sizeof temp);
    CHECK_ERRNO(file != NULL, "--results %s: cannot create %s", path, temp);
    if (r.size == 0) {
        fprintf(file, "%s\n", RESULTS_HEADER);  // a new file says what its columns are
    } else {
        fwrite(r.text, 1, r.size, file);  // a failed write shows at the commit
        if (r.text[r.size - 1] != '\n') fputc('\n', file);
    }
    fprintf(file, "%d,%.6f\n", world, seconds);
    CHECK_ERRNO(replace_commit(file, temp, path), "--results %s: cannot write", path);
    results_add(&r, world, seconds);

    // Keep the last run of each world size.
    int *worlds = xmalloc((size_t)r.n * sizeof(int)), n = 0;
    double *times = xmalloc((size_t)r.n * sizeof(double));
    for (int i = 0; i < r.n; i++) {
        int k = 0;
        while (k < n && worlds[k] != r.worlds[i]) k++;
        if (k == n) n++;
        worlds[k] = r.worlds[i], times[k] = r.seconds[i];
    }
    results_free(&r);
    for (int i = 1; i < n; i++)  // by world size
        for (int k = i; k > 0 && worlds[k] < worlds[k - 1]; k--) {
            int wi = worlds[k]; worlds[k] = worlds[k - 1]; worlds[k - 1] = wi;
            double ti = times[k]; times[k] = times[k - 1]; times[k - 1] = ti;
        }
    int base = 0;
    while (base < n && worlds[base] != 1) base++;
    float *x = xmalloc((size_t)n * sizeof(float)), *speedup = xmalloc((size_t)n * sizeof(float)),
          *ideal = xmalloc((size_t)n * sizeof(float));
    printf("\n%10s %12s %9s %11s\n", "world size", "training s", "speed-up", "efficiency");
    for (int i = 0; i < n; i++) {
        x[i] = (float)worlds[i];
        ideal[i] = (float)worlds[i];
        speedup[i] = base < n ? (float)(times[base] / times[i]) : 0.0f;
        if (base < n)
            printf("%10d %12.3f %8.2fx %10.0f%%\n", worlds[i], times[i], speedup[i], 100 * speedup[i] / worlds[i]);
        else
            printf("%10d %12.3f %9s %11s\n", worlds[i], times[i], "-", "-");
    }
    if (base == n) printf("(run it on 1 rank too, for the speed-up)\n");
    fflush(stdout);
    if (chart && *chart && base < n) {
        PlotSeries series[2] = {{.label = "measured", .x = x, .y = speedup, .n = n},
                                {.label = "ideal (W x)", .x = x, .y = ideal, .n = n}};
        PlotSpec spec = {.title = "Step 7: DDP training speed-up over one rank", .xlabel = "world size (ranks)",
                         .ylabel = "speed-up"};
        plot_png(chart, &spec, series, 2);
        printf("Speed-up chart: %s\n", chart);
    }
    free(x), free(speedup), free(ideal), free(worlds), free(times);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = TRAIN_OPTIONS_DEFAULTS("img/7_mnist_ddp_timing.png");
    double bucket_mb = 25.0;  // PyTorch's default bucket_cap_mb
    int accum_steps = 1;
    const char *results = NULL, *chart = "img/7_scaling.png";
    ArgSpec flags[] = {
        TRAIN_FLAGS(opt),
        {"bucket_mb", ARG_FLOAT_GE, &bucket_mb, "MB", "gradient bucket size; 0: one bucket per tensor", 0, NULL},
        {"accum_steps", ARG_INT, &accum_steps, "K", "micro-batches per optimizer step (no_sync on all but the last)", 1, NULL},
        {"results", ARG_OUTPUT, &results, "FILE.csv", "append world_size,seconds; print the speed-up table of the file", 0, NULL},
        {"chart", ARG_OUTPUT_OR_NONE, &chart, "FILE.png", "speed-up chart of --results ('' for none)", 0, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 7: time DDP training; --results collects a speed-up table across world sizes.");
    if (results) check_results(results);  // a corrupt file is refused before the run, not after it
    Device device = device_from_flag(opt.device);
    threads_init(opt.threads);
    int rank = dist_rank(), world = dist_world_size();

    // Data: 60000 training and 10000 test images, pixels / 255 as float32.
    MnistSplit train = mnist_load(opt.data, MNIST_TRAIN);
    MnistSplit test = mnist_load(opt.data, MNIST_TEST);
    // Each rank takes its 1/W share: positions rank, rank + W, rank + 2W, ...
    DistributedSampler sampler = sampler_new(train.n, world, rank, !opt.no_shuffle, (uint64_t)opt.seed);

    // Model and optimizer.
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);  // torch.manual_seed(seed)
    const int sizes[] = {MNIST_PIXELS, 128, MNIST_CLASSES};
    Mlp model = mlp_new(sizes, ARRAY_LEN(sizes), opt.batch_size, &rng, device);
    if (opt.init) h5_load_params(opt.init, model.params, model.n_params);
    Ddp ddp = ddp_wrap(model.params, model.n_params, bucket_mb);  // model = DDP(model)
    double lr = opt.lr;
    Adam optimizer = adam_new(model.params, model.n_params, lr);

    char buckets[512];
    ddp_describe_buckets(&ddp, buckets, sizeof buckets);
    print0("Step 7: DDP on %d rank%s: MLP 784-128-10, %zu weights in %s; Adam lr %g; batch %d per rank x %d micro-batch%s; %d epoch%s; shuffle %s (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", mlp_num_weights(&model), buckets, lr, opt.batch_size, accum_steps, accum_steps == 1 ? "" : "es", opt.epochs, opt.epochs == 1 ? "" : "s", opt.no_shuffle ? "off" : "on", opt.seed,
           device_name(device), threads_describe());

    Tensor batch_images = tensor_zeros(opt.batch_size, MNIST_PIXELS, device);  // [B, 784]
    int *batch_labels = xmalloc((size_t)opt.batch_size * sizeof(int));         // [B]
    LossLog losses = {0};

    double train_start = wall_seconds();
    for (int epoch = 0; epoch < opt.epochs; epoch++) {
        double epoch_start = wall_seconds();
        sampler_set_epoch(&sampler, epoch);
        int n_batches = sampler_num_batches(&sampler, opt.batch_size);
        int n_steps = (n_batches + accum_steps - 1) / accum_steps;
        double loss_sum = 0.0;
        float loss = 0.0f;
        for (int b = 0; b < n_batches; b++) {
            Tensor x = mnist_batch(&train, &sampler, b, opt.batch_size, &batch_images, batch_labels);  // [rows, 784]
            // accum_steps micro-batches make a step; each weighs by its share of the step's samples.
            MicroBatch micro = micro_batch(b, accum_steps, sampler.num_samples, opt.batch_size);
            if (micro.first) {
                mlp_zero_grad(&model);                     // optimizer.zero_grad()
                loss = 0.0f;
            }
            ddp_set_sync(&ddp, micro.last);                // with model.no_sync() on the others
            mlp_forward(&model, &x);                       // output = model(data)
            loss += micro.weight * mlp_loss(&model, batch_labels);  // loss = criterion(output, target)
            mlp_scale_loss(&model, micro.weight);
            mlp_backward(&model, &x, ddp_grad_ready, &ddp);  // loss.backward(): buckets start here
            if (micro.last) {
                ddp_finish(&ddp);                          // all buckets reduced, grads averaged
                adam_step(&optimizer);                     // optimizer.step()
                dist_allreduce_sum(&loss, 1);              // for the log: the loss of the global batch
                loss /= (float)world;
                loss_log_add(&losses, epoch, loss);
                loss_sum += loss;
            }
        }
        double seconds = wall_seconds() - epoch_start;
        print0("epoch %d/%d: mean loss %.4f over %d steps, %.2f s, %.0f samples/s\n", epoch + 1, opt.epochs,
               loss_sum / n_steps, n_steps, seconds, (double)sampler.num_samples * world / seconds);
    }
    device_synchronize();  // torch.cuda.synchronize(): the GPU may still be at work
    double train_seconds = wall_seconds() - train_start;
    print_rank("training loop: %.3f s\n", train_seconds);
    double slowest = train_seconds;  // the job is as fast as its slowest rank
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));

    Tensor test_images = mnist_images(&test, device);  // [10000, 784]
    double accuracy = mlp_accuracy(&model, &test_images, test.labels);
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    print0("World Size: %d. Training completed in %.2f seconds (slowest rank). Test accuracy: %.2f%% (%.0f of %d)\n",
           world, slowest, 100 * accuracy, accuracy * test.n, test.n);
    print0("DDP: %s\n", overlap);
    dist_barrier();  // let every rank's lines out before rank 0's table

    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.save) h5_save_params(opt.save, model.params, model.n_params);
    if (rank == 0 && opt.plot && *opt.plot) {
        char title[64], label[32];
        snprintf(title, sizeof title, "Step 7: MNIST training loss, DDP on %d rank%s", world, world == 1 ? "" : "s");
        snprintf(label, sizeof label, "%d rank%s (mean loss)", world, world == 1 ? "" : "s");
        loss_log_plot(&losses, opt.plot, title, label);
        print0("Loss curve: %s\n", opt.plot);
    }

    if (rank == 0 && results) scaling_report(results, world, slowest, chart);

    tensor_free(&test_images);
    tensor_free(&batch_images);
    free(batch_labels);
    loss_log_free(&losses);
    adam_free(&optimizer);
    ddp_free(&ddp);
    mlp_free(&model);
    sampler_free(&sampler);
    mnist_free(&train);
    mnist_free(&test);
    dist_finalize();
    return 0;
}
