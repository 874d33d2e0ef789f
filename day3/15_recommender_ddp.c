// Step 15: a MovieLens recommender under DDP, with dense, sparse and sharded embeddings.
//                                               PyTorch twin: tests/torch_recommender.py
//
// What it changes from step 14: the model and the data, and what travels.
// Matrix factorisation with biases (common/models/mf.h): a rating is predicted as
//   global mean + user_bias[u] + item_bias[i] + user_embedding[u] . item_embedding[i]
// with tables of --dim 32 columns, one row per user and per movie; MSE loss,
// an L2 term on the batch's rows (--weight_decay), torch.optim.SparseAdam.
// The test set is a seeded random 10% of the ratings (a hash of --seed and the
// rating's line: the same ratings on any number of ranks).
//
// A batch touches a few hundred of the tables' rows, so plain DDP, which
// allreduces whole gradient tables, sends mostly zeros. --embeddings picks:
//   dense    the whole gradient tables allreduced (what a plain DDP port does);
//   sparse   only the rows the batch touched: allgather of their ids and gradients
//            (DDP with nn.Embedding(sparse=True));
//   sharded  rank r owns the rows with id % W == r; the batch's rows come from
//            their owners and their gradients go back by all-to-all (step 12's
//            collective: DLRM's and TorchRec's model-parallel embeddings).
// The three take the same steps (mf.h says how the sums are ordered for it),
// on CPUs or GPUs (--device: the tables on the GPU, the gathers, scatters and
// SparseAdam in kernels, the rows by NCCL; the host queues each step and never
// waits for the GPU inside it: mf.h says how). On GPUs the step is captured
// once into a CUDA graph and replayed, NCCL's collectives inside it (--cuda_graph,
// as in step 2).
//
// The data: each rank reads only its byte range of ratings.csv
// (common/data/movielens.h), so no rank holds the whole file; every epoch the
// ratings are dealt to the ranks that train on them (common/data/rating_sampler.h).
//
// Build and run:
//   make day3/15_recommender_ddp && make movielens
//   day3/15_recommender_ddp                                        # one process, 20 epochs
//   mpirun -np 2 day3/15_recommender_ddp --embeddings sharded --recommend 1   (add --oversubscribe on fewer cores)
//   day3/15_recommender_ddp --synthetic 25000000 --data data/ml-synthetic     # a ratings.csv the size of ml-25m
//
// Expected output (one process; times vary):
//   Step 15: DDP on 1 rank: matrix factorisation, dim 32, 610 users x 9724 movies; sparse embeddings; SparseAdam lr 0.003, L2 0.1 on the batch's rows; batch 1024 per rank; 20 epochs; 90714 training and 10122 test ratings (seed 0); cpu, 2 threads, OpenBLAS 0.3.21 (SkylakeX kernels)
//   [rank 0] read bytes 0..2382886 of data/movielens/ratings.csv (100836 ratings) in ...
//   baselines on the test set: global mean RMSE 1.0392; user and movie biases RMSE 0.8734
//   epoch  1/20: train loss 1.0270, test RMSE 0.9768, 0.04 s
//   ...
//   epoch 20/20: train loss 0.5262, test RMSE 0.8342, 0.03 s
//   sparse embeddings: no communication (world size 1); embedding memory 4.09 MB per rank
//   World Size: 1. Training completed in 0.98 seconds (1780 steps). Test RMSE 0.8342
//   Loss curve: img/15_recommender_ddp.png
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // check_all_ranks, xmalloc
#include "base/timer.h"             // wall_seconds
#include "data/movielens.h"         // movielens_read_ratings: each rank its byte range of ratings.csv
#include "data/rating_sampler.h"    // the global batches of a shuffle, each rank its slice
#include "models/mf.h"              // Mf: the model, its three ways of keeping the embeddings, SparseAdam
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"       // the loss of every step, CSV and PNG
#include "records/plot.h"           // plot_panels_png: the training loss above the test RMSE
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/device.h"         // host_peak_resident_bytes: the load's peak memory; device_synchronize
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init
#include "train/divergence.h"       // check_loss_finite: a loss that is nan or inf stops the run, on every rank
#include "train/step_graph.h"       // StepGraph: the step replayed from a CUDA graph on a GPU (--cuda_graph)
#include "train/train_options.h"    // TrainOptions, TRAIN_FLAGS: the flags every training program takes

// Test RMSE of the model: every rank its test ratings (collective).
static double test_rmse(Mf *model, const int *user, const int *item, const float *rating, int n, long n_total) {
    float *prediction = xmalloc(((size_t)n + 1) * sizeof(float));
    mf_predict(model, user, item, n, prediction);
    double squared = 0.0;
    for (int k = 0; k < n; k++) squared += ((double)prediction[k] - rating[k]) * ((double)prediction[k] - rating[k]);
    free(prediction);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &squared, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    return sqrt(squared / (double)n_total);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    TrainOptions opt = {.data = "data/movielens", .epochs = 20, .batch_size = 1024, .lr = 3e-3, .seed = 0,
                        .plot = "img/15_recommender_ddp.png", .device = "auto"};
    int dim = 32, recommend = 0, synthetic = 0, max_steps = -1;
    double weight_decay = 0.1;
    const char *embeddings = "sparse", *cuda_graph = "on";
    ArgSpec flags[] = {
        {"data", ARG_PATH, &opt.data, "DIR", "folder with MovieLens's ratings.csv and movies.csv (make movielens)", 0, NULL},
        {"epochs", ARG_INT, &opt.epochs, "N", "passes over the training ratings", 1, NULL},
        {"batch_size", ARG_INT, &opt.batch_size, "N", "ratings per step, per rank", 1, NULL},
        {"lr", ARG_FLOAT, &opt.lr, "X", "SparseAdam learning rate", 0, NULL},
        {"seed", ARG_INT, &opt.seed, "N", "seeds the weights, the shuffle and the 90/10 split", 0, NULL},
        {"no-shuffle", ARG_SWITCH, &opt.no_shuffle, NULL, "keep the training ratings in file order", 0, NULL},
        {"init", ARG_PATH, &opt.init, "FILE.h5", "start from these weights (state_dict names)", 0, NULL},
        {"save", ARG_OUTPUT, &opt.save, "FILE.h5", "write the final weights", 0, NULL},
        {"losses", ARG_OUTPUT, &opt.losses, "FILE.csv", "write step,epoch,loss per step (rank 0)", 0, NULL},
        {"plot", ARG_OUTPUT_OR_NONE, &opt.plot, "FILE.png", "loss-curve PNG ('' for none)", 0, NULL},
        {"device", ARG_STRING, &opt.device, "DEV", "where to compute", 0, "cpu|cuda|auto"},
        {"threads", ARG_INT, &opt.threads, "N", "CPU threads per rank (0: the node's cores / its ranks)", 0, NULL},
        {"embeddings", ARG_STRING, &embeddings, "MODE", "how the tables live on the ranks and their gradients travel", 0, "dense|sparse|sharded"},
        {"dim", ARG_INT, &dim, "N", "columns of the user and movie embeddings", 1, NULL},
        {"weight_decay", ARG_FLOAT_GE, &weight_decay, "X", "L2 on the batch's embedding rows", 0, NULL},
        {"max_steps", ARG_INT, &max_steps, "N", "stop after N optimizer steps, overriding --epochs (-1: --epochs decides)", -1, NULL},
        {"recommend", ARG_INT, &recommend, "USER", "at the end, the top 10 unseen movies for this userId (0: none)", 0, NULL},
        {"synthetic", ARG_INT, &synthetic, "N", "write a MovieLens-shaped ratings.csv of N ratings into --data, and stop", 0, NULL},
        {"cuda_graph", ARG_STRING, &cuda_graph, "on|off", "on a GPU, each step replayed from a CUDA graph captured once (torch.cuda.graphs)", 0, "on|off"},
        TRACKING_FLAGS(opt.tracking),
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 15: a MovieLens recommender (matrix factorisation) under DDP, with dense, sparse or sharded embeddings.");
    EmbeddingsMode mode = strcmp(embeddings, "dense") == 0 ? EMBEDDINGS_DENSE
                        : strcmp(embeddings, "sparse") == 0 ? EMBEDDINGS_SPARSE : EMBEDDINGS_SHARDED;
    threads_init(opt.threads);
    Device device = device_from_flag(opt.device);  // the tables, lookups and updates on this rank's GPU, if any
    int rank = dist_rank(), world = dist_world_size();

    if (synthetic > 0) {  // --synthetic N: write the files, and stop
        char no_room[512] = "";  // rank 0 writes, so rank 0 looks at the disk first: one line, not a half-written file
        check_all_ranks(rank != 0 || movielens_synthetic_fits(opt.data, synthetic, no_room, sizeof no_room), no_room);
        if (rank == 0) movielens_write_synthetic(opt.data, synthetic, (uint64_t)opt.seed);
        dist_barrier();
        print0("wrote %s/ratings.csv (%d ratings) and %s/movies.csv\n", opt.data, synthetic, opt.data);
        dist_finalize();
        return 0;
    }

    // Data: each rank parses its byte range of ratings.csv.
    char path[4096];
    snprintf(path, sizeof path, "%s/ratings.csv", opt.data);
    double load_start = wall_seconds();
    Ratings ratings = movielens_read_ratings(path);
    double load_seconds = wall_seconds() - load_start, load_peak_mb = host_peak_resident_bytes() / 1e6;
    int recommend_index = recommend ? ratings_user_index(&ratings, recommend) : -1;
    if (recommend && recommend_index < 0) usage_error("--recommend %d: no user of that id in %s", recommend, path);
    // The titles --recommend prints, read now: a bad movies.csv is refused before training, not after.
    char **titles = NULL;
    if (recommend) {
        char error[1024] = "", movies_path[4096];
        snprintf(movies_path, sizeof movies_path, "%s/movies.csv", opt.data);
        bool ok = rank != 0 || movielens_read_titles(movies_path, &ratings, &titles, error, sizeof error);
        check_all_ranks(ok, error);
    }

    // The seeded 90/10 split, and the two baselines the model must beat.
    int n_train = 0, n_test = 0;
    int *train_user = xmalloc(((size_t)ratings.n + 1) * sizeof(int)), *train_item = xmalloc(((size_t)ratings.n + 1) * sizeof(int));
    int *test_user = xmalloc(((size_t)ratings.n + 1) * sizeof(int)), *test_item = xmalloc(((size_t)ratings.n + 1) * sizeof(int));
    float *train_rating = xmalloc(((size_t)ratings.n + 1) * sizeof(float)), *test_rating = xmalloc(((size_t)ratings.n + 1) * sizeof(float));
    for (long k = 0; k < ratings.n; k++) {
        if (movielens_is_test((uint64_t)opt.seed, ratings.first + k)) {
            test_user[n_test] = ratings.user[k], test_item[n_test] = ratings.item[k], test_rating[n_test++] = ratings.rating[k];
        } else {
            train_user[n_train] = ratings.user[k], train_item[n_train] = ratings.item[k], train_rating[n_train++] = ratings.rating[k];
        }
    }
    double sums[3] = {0.0, (double)n_train, (double)n_test};  // sum of training ratings, counts
    for (int k = 0; k < n_train; k++) sums[0] += train_rating[k];
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    long n_train_total = (long)sums[1], n_test_total = (long)sums[2];
    check_all_ranks(n_train_total > 0 && n_test_total > 0, "too few ratings for a 90/10 split");
    float global_mean = (float)(sums[0] / sums[1]);
    // Baseline 2: biases alone, as Koren's: b_i = sum(r - mean) / (25 + n_i), then
    // b_u = sum(r - mean - b_i) / (10 + n_u), over the training ratings.
    double *item_sum = xcalloc((size_t)ratings.n_items * 2, sizeof(double)), *user_sum = xcalloc((size_t)ratings.n_users * 2, sizeof(double));
    for (int k = 0; k < n_train; k++) item_sum[2 * train_item[k]] += train_rating[k] - global_mean, item_sum[2 * train_item[k] + 1] += 1;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, item_sum, 2 * ratings.n_items, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    for (int i = 0; i < ratings.n_items; i++) item_sum[2 * i] /= 25.0 + item_sum[2 * i + 1];
    for (int k = 0; k < n_train; k++)
        user_sum[2 * train_user[k]] += train_rating[k] - global_mean - item_sum[2 * train_item[k]], user_sum[2 * train_user[k] + 1] += 1;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, user_sum, 2 * ratings.n_users, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    for (int u = 0; u < ratings.n_users; u++) user_sum[2 * u] /= 10.0 + user_sum[2 * u + 1];
    double baseline[2] = {0.0, 0.0};  // squared errors: the global mean; the biases
    for (int k = 0; k < n_test; k++) {
        double mean_error = test_rating[k] - global_mean;
        double bias_error = mean_error - item_sum[2 * test_item[k]] - user_sum[2 * test_user[k]];
        baseline[0] += mean_error * mean_error, baseline[1] += bias_error * bias_error;
    }
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, baseline, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    free(item_sum);
    free(user_sum);

    // Batches: global batch b is positions [bG, (b + 1)G) of a shuffle of all the training ratings.
    RatingSampler sampler = rating_sampler_new(n_train, train_user, train_item, train_rating, opt.batch_size,
                                               !opt.no_shuffle, (uint64_t)opt.seed, device);  // (GPU: an epoch's ratings there)
    int epochs = max_steps < 0 ? opt.epochs : (max_steps + sampler.n_batches - 1) / sampler.n_batches;

    // Model and optimizer: first what its tables (the figure the report prints at the end), the
    // epoch's ratings and, on a GPU, an epoch's losses will take on this rank, refused now if it
    // would not fit (exit 2).
    MemoryNeed need = memory_need("--dim %d --embeddings %s --batch_size %d (%d users x %d movies)", dim,
                                  embeddings_mode_name(mode), opt.batch_size, ratings.n_users, ratings.n_items);
    mf_add_memory_need(&need, mode, ratings.n_users, ratings.n_items, dim, world, device, sampler.n_batches);
    rating_sampler_add_memory_need(&sampler, &need);
    memory_require(&need, device);
    Rng rng;
    rng_seed(&rng, (uint64_t)opt.seed);
    Mf *model = mf_new(mode, device, ratings.n_users, ratings.n_items, dim, global_mean, opt.lr, weight_decay, &rng);
    if (opt.init) {
        h5_load_params(opt.init, mf_full_params(model), 5);
        mf_scatter_full(model);
    }

    print0("Step 15: DDP on %d rank%s: matrix factorisation, dim %d, %d users x %d movies; %s embeddings; SparseAdam lr %g, L2 %g on the batch's rows; batch %d per rank; %d epoch%s; %ld training and %ld test ratings (seed %d); %s, %s\n",
           world, world == 1 ? "" : "s", dim, ratings.n_users, ratings.n_items, embeddings_mode_name(mode), opt.lr, weight_decay,
           opt.batch_size, epochs, epochs == 1 ? "" : "s", n_train_total, n_test_total, opt.seed, device_name(device), threads_describe());
    print_rank("read bytes %ld..%ld of %s (%ld ratings) in %.2f s; peak memory %.0f MB\n", ratings.byte_start,
               ratings.byte_end, path, ratings.n, load_seconds, load_peak_mb);
    print0("baselines on the test set: global mean RMSE %.4f; user and movie biases RMSE %.4f\n",
           sqrt(baseline[0] / n_test_total), sqrt(baseline[1] / n_test_total));
    Tracking *run = tracking_start(&opt.tracking, "day3/15_recommender_ddp.c", device_name(device), NULL, args_values());  // mlflow.start_run(); mlflow.log_params(vars(args))
    tracking_log_metric(run, "baseline_global_mean_rmse", sqrt(baseline[0] / n_test_total), 0);
    tracking_log_metric(run, "baseline_biases_rmse", sqrt(baseline[1] / n_test_total), 0);

    LossLog losses = {0};
    // On a GPU the step is captured into a CUDA graph and replayed: one launch a step, not one per
    // kernel (step_graph.h: the epoch's last, shorter batch runs eagerly, and so does the first, a
    // warm-up). The exchanges' NCCL collectives are captured with it, on their stream; where ranks
    // share a GPU they go through MPI on host copies, which no graph can hold: those steps run eagerly.
    bool graph_wanted = strcmp(cuda_graph, "on") == 0 && device == DEVICE_CUDA;
    StepGraph graph = step_graph_new(device, graph_wanted && (world == 1 || device_nccl()), world > 1);
    float *epoch_rmse = xmalloc(((size_t)epochs + 1) * sizeof(float));  // the test RMSE after each epoch, for the PNG
    int steps = 0;
    double train_start = wall_seconds(), rmse = 0.0;
    for (int epoch = 0; epoch < epochs; epoch++) {
        double epoch_start = wall_seconds();
        rating_sampler_set_epoch(&sampler, epoch);  // the ratings move to the ranks that train on them
        double loss_sum = 0.0, epoch_samples = 0.0;
        int epoch_steps = 0;
        for (int b = 0; b < sampler.n_batches && steps != max_steps; b++) {
            RatingBatch batch = rating_sampler_batch(&sampler, b);
            mf_prepare_step(model, &batch);               // (where the batch is, Adam's step size: before the graph)
            // The graph is keyed by the global batch's size: the same on every rank, where a rank's
            // slice of a short last batch may differ by one (NCCL: every rank replays, or none).
            if (!step_graph_replay(&graph, (int)batch.global_n)) {  // g.replay(), where the graph holds this batch's shape
                step_graph_begin(&graph, (int)batch.global_n);     // (with torch.cuda.graph(g): once, after a warm-up step)
                mf_lookup(model, &batch);                 // embedding(user), embedding(item)
                mf_forward_backward(model, &batch);       // loss = ...; loss.backward()
                mf_exchange_gradients(model);             // DDP: the global batch's gradients
                mf_adam_step(model);                      // optimizer.step()
                step_graph_end(&graph);
            }
            mf_end_step(model);                           // losses.append(loss.detach())
            epoch_samples += (double)batch.global_n;
            epoch_steps++;
            steps++;
            // The global batch's loss of each step, for the log: on a CPU rank this step's; on a GPU
            // rank they stay there until the epoch's last step (the host waits for the GPU then, not
            // every step), so a nan is noticed at its epoch's end, still named by its step.
            const double *taken;
            int n_taken = mf_take_losses(model, b == sampler.n_batches - 1 || steps == max_steps, &taken);
            for (int i = 0; i < n_taken; i++) {
                double loss = taken[i];
                check_loss_finite(loss, losses.n + 1, epoch + 1, run);  // the ranks' sum spread any nan to every rank
                loss_log_add(&losses, epoch, (float)loss);
                tracking_log_metric(run, "loss", (float)loss, losses.n - 1);  // mlflow.log_metric("loss", loss, step=step)
                loss_sum += loss;
            }
        }
        device_synchronize();  // torch.cuda.synchronize(): the epoch's queued steps are done (nothing on a CPU)
        double train_seconds = wall_seconds() - epoch_start;
        rmse = test_rmse(model, test_user, test_item, test_rating, n_test, n_test_total);
        check_result_finite(rmse, "test RMSE", epoch + 1, run);  // "Test RMSE -nan" is no result
        epoch_rmse[epoch] = (float)rmse;
        print0("epoch %2d/%d: train loss %.4f, test RMSE %.4f, %.2f s\n", epoch + 1, epochs,
               epoch_steps ? loss_sum / epoch_steps : 0.0, rmse, train_seconds);
        tracking_log_metric(run, "epoch_mean_loss", epoch_steps ? loss_sum / epoch_steps : 0.0, epoch);
        tracking_log_metric(run, "test_rmse", rmse, epoch);
        tracking_log_metric(run, "samples_per_second", epoch_samples / train_seconds, epoch);
    }
    double seconds = wall_seconds() - train_start;
    if (epochs == 0) rmse = test_rmse(model, test_user, test_item, test_rating, n_test, n_test_total);  // --max_steps 0
    // Sizes in decimal units (kB = 10^3 bytes, MB = 10^6), as every program prints them.
    if (world == 1)
        print0("%s embeddings: no communication (world size 1); embedding memory %.2f MB per rank\n",
               embeddings_mode_name(mode), mf_embedding_bytes(model) / 1e6);
    else if (graph.captures > 0)  // not timed (mf.h): the eager steps left, the first and the short last, are not the run's
        print0("%s embeddings: %.1f kB sent per step by each rank, the exchanges inside the step's CUDA graph: not "
               "timed (--cuda_graph off times them); embedding memory %.2f MB per rank\n", embeddings_mode_name(mode),
               steps ? model->bytes_sent / steps / 1e3 : 0.0, mf_embedding_bytes(model) / 1e6);
    else
        print0("%s embeddings: %.1f kB sent per step by each rank, %.3f ms per step communicating; embedding memory "
               "%.2f MB per rank\n", embeddings_mode_name(mode), steps ? model->bytes_sent / steps / 1e3 : 0.0,
               steps ? 1e3 * mf_comm_seconds(model) / steps : 0.0, mf_embedding_bytes(model) / 1e6);
    step_graph_report(&graph, graph_wanted, steps, world, "the exchanges' collectives");
    print0("World Size: %d. Training completed in %.2f seconds (%d step%s). Test RMSE %.4f\n", world, seconds, steps,
           steps == 1 ? "" : "s", rmse);

    if (opt.save || recommend) {
        mf_gather_full(model);  // rank 0 gets the whole tables
        check_weights_finite(model->params, rank == 0 ? 5 : 0, steps, epochs, run);  // rows no test rating reads
    }
    if (recommend) {
        // The movies this user rated anywhere in the file: no recommendation of those.
        unsigned char *seen = xcalloc((size_t)ratings.n_items, 1);
        for (long k = 0; k < ratings.n; k++)
            if (ratings.user[k] == recommend_index) seen[ratings.item[k]] = 1;
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, seen, ratings.n_items, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD));
        if (rank == 0) {
            const float *p = model->full[0].data + (size_t)recommend_index * dim, *user_bias = model->full[2].data;
            float *score = xmalloc((size_t)ratings.n_items * sizeof(float));
            int n_seen = 0;
            for (int i = 0; i < ratings.n_items; i++) {
                const float *q = model->full[1].data + (size_t)i * dim;
                float dot = 0.0f;
                for (int d = 0; d < dim; d++) dot += p[d] * q[d];
                score[i] = dot + user_bias[recommend_index] + model->full[3].data[i] + global_mean;
                n_seen += seen[i];
            }
            printf("Top 10 movies for user %d, who rated %d (predicted rating, title):\n", recommend, n_seen);
            for (int top = 0; top < 10; top++) {
                int best = -1;
                for (int i = 0; i < ratings.n_items; i++)
                    if (!seen[i] && (best < 0 || score[i] > score[best])) best = i;
                if (best < 0) break;
                seen[best] = 1;
                printf("  %2d. %.2f  %s\n", top + 1, score[best], titles[best]);
            }
            fflush(stdout);
            free(score);
            for (int i = 0; i < ratings.n_items; i++) free(titles[i]);
            free(titles);
        }
        free(seen);
    }
    if (rank == 0 && opt.save) h5_save_params(opt.save, model->params, 5);
    if (rank == 0 && opt.losses) loss_log_write_csv(&losses, opt.losses);
    if (rank == 0 && opt.plot && *opt.plot && losses.n > 0) {
        // Two panels on one epoch axis: the training loss of every step above the
        // test RMSE after each epoch, beside the two baselines it must beat.
        char title[96], label[48];
        snprintf(title, sizeof title, "Step 15: MovieLens matrix factorisation, %s embeddings", embeddings_mode_name(mode));
        snprintf(label, sizeof label, "%d rank%s (loss of the global batch)", world, world == 1 ? "" : "s");
        int n_epochs = losses.epoch[losses.n - 1] + 1;  // the epochs run (--max_steps may stop early)
        float *step_x = xmalloc((size_t)losses.n * sizeof(float));
        loss_log_epoch_positions(&losses, step_x);
        float *epoch_x = xmalloc((size_t)n_epochs * sizeof(float));
        for (int e = 0; e < n_epochs; e++) epoch_x[e] = (float)(e + 1);
        const float span[2] = {0.0f, (float)n_epochs};
        const float mean_rmse = (float)sqrt(baseline[0] / n_test_total), biases_rmse = (float)sqrt(baseline[1] / n_test_total);
        const float global_mean_line[2] = {mean_rmse, mean_rmse}, biases_line[2] = {biases_rmse, biases_rmse};
        PlotSeries train[1] = {{.label = label, .x = step_x, .y = losses.loss, .n = losses.n}};
        int best = 0;  // the epoch of the lowest test RMSE: where training should have stopped
        for (int e = 1; e < n_epochs; e++)
            if (epoch_rmse[e] < epoch_rmse[best]) best = e;
        char best_label[64];
        snprintf(best_label, sizeof best_label, "lowest: %.4f after epoch %d", epoch_rmse[best], best + 1);
        PlotSeries test[4] = {
            {.label = "test RMSE after the epoch", .x = epoch_x, .y = epoch_rmse, .n = n_epochs},
            {.label = "baseline: the global mean", .x = span, .y = global_mean_line, .n = 2},
            {.label = "baseline: user and movie biases", .x = span, .y = biases_line, .n = 2},
            {.label = best_label, .x = &epoch_x[best], .y = &epoch_rmse[best], .n = 1},  // a dot
        };
        PlotPanel panels[2] = {
            {.spec = {.title = title, .xlabel = "epoch", .ylabel = "training loss (MSE + L2)"}, .series = train, .n_series = 1},
            {.spec = {.title = "Test RMSE (10% of the ratings held out)", .xlabel = "epoch", .ylabel = "RMSE",
                      .height = 400, .integer_x = 1},
             .series = test, .n_series = 4},
        };
        plot_panels_png(opt.plot, panels, 2);
        free(step_x), free(epoch_x);
        print0("Loss curve: %s\n", opt.plot);
    }
    tracking_log_artifact(run, opt.losses);  // mlflow.log_artifact(path)
    tracking_log_artifact(run, opt.save);
    tracking_log_artifact(run, opt.plot);
    tracking_end(run, TRACKING_FINISHED);    // mlflow.end_run()

    loss_log_free(&losses);
    step_graph_free(&graph);
    free(epoch_rmse);
    mf_free(model);
    rating_sampler_free(&sampler);
    free(train_user), free(train_item), free(train_rating), free(test_user), free(test_item), free(test_rating);
    ratings_free(&ratings);
    dist_finalize();
    return 0;
}
