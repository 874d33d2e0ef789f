// mf.c: matrix factorisation with biases; dense, sparse and sharded embedding tables. See mf.h.
#include "models/mf.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/timer.h"
#include "comm/collectives.h"  // group_all_reduce, group_all_gather, group_exchange: the rows on GPUs
#include "runtime/dist.h"
#if HAVE_CUDA
#include "tensor/kernels.h"
#endif

const char *embeddings_mode_name(EmbeddingsMode mode) {
    return mode == EMBEDDINGS_DENSE ? "dense" : mode == EMBEDDINGS_SPARSE ? "sparse" : "sharded";
}

static void grow(void **buffer, int *capacity, int needed, size_t item_bytes) {
    if (needed <= *capacity) return;
    int wanted = needed + needed / 2 + 16;
    void *grown = realloc(*buffer, (size_t)wanted * item_bytes);
    CHECK(grown != NULL, "out of memory for %d rows", wanted);
    *buffer = grown;
    *capacity = wanted;
}

static bool on_gpu(const Mf *model) { return HAVE_CUDA && model->device == DEVICE_CUDA; }

// GPU: gpu_sort_groups' inputs and outputs (kernels.h), kept from step to step. `count` holds
// the number of groups: device memory, which the host never reads in a step.
typedef struct GpuGroups {
    DeviceBuffer keys, scratch, order, count, group_key, group_start, group_of;
} GpuGroups;

// GPU: a pair of CUDA events around each exchange, read once they have happened (a ring), so
// that timing the communication makes the host wait for nothing.
enum { COMM_TIMES = 256 };
typedef struct CommTimes {
    void *start[COMM_TIMES], *done[COMM_TIMES];  // cudaEvent_t
    int oldest, n;
} CommTimes;

#if HAVE_CUDA
// GPU: a stream beside the compute stream, for the work that nothing after it needs at once: the
// batch's sorts, beside the forward where every table is read in place (lookup_gpu), then the
// step's loss, beside the backward (forward_backward_gpu says why). Each piece is forked from the
// compute stream (forked); the backward waits for the sorts (sorted), and the step's end joins
// the rest (done, recorded after each piece: mf_adam_step).
typedef struct StepBranch {
    cudaStream_t stream;
    cudaEvent_t forked, sorted, done;  // (without timing)
} StepBranch;

// ------------------------------------------------------------------ GPU memory
// Room for n rows of dim floats in b (one more: n may be 0).
static float *device_rows(DeviceBuffer *b, size_t n, int dim) {
    return device_buffer_reserve(b, (n + 1) * (size_t)dim * sizeof(float));
}

static void upload_floats(float *device_floats, const float *host, size_t n, const char *what) {
    if (n == 0) return;
    CHECK_CUDA(cudaMemcpyAsync(device_floats, host, n * sizeof(float), cudaMemcpyHostToDevice, device_stream()));
    device_wait_stream(device_stream(), what);
}

// Rows to every rank and from every rank (send_count[r] rows from send +
// send_offset[r] rows go to rank r, and so on): grouped ncclSend/ncclRecv,
// or MPI on host copies where ranks share a GPU (group_exchange); this
// rank's own rows by a copy on the GPU.
static void gpu_rows_all_to_all(const float *send, const int *send_count, const int *send_offset, float *received,
                                const int *received_count, const int *received_offset, int dim) {
    int world = dist_world_size(), rank = dist_rank(), n_sends = 0, n_receives = 0;
    Tensor *views = xmalloc(2 * (size_t)world * sizeof(Tensor));
    P2pSend *sends = xmalloc((size_t)world * sizeof(P2pSend));
    P2pReceive *receives = xmalloc((size_t)world * sizeof(P2pReceive));
    for (int r = 0; r < world; r++) {
        if (r == rank) {
            if (send_count[r] > 0)
                CHECK_CUDA(cudaMemcpyAsync(received + (size_t)received_offset[r] * dim, send + (size_t)send_offset[r] * dim,
                                           (size_t)send_count[r] * dim * sizeof(float), cudaMemcpyDeviceToDevice,
                                           device_stream()));
            continue;
        }
        if (send_count[r] > 0) {
            views[2 * r] = (Tensor){.data = (float *)send + (size_t)send_offset[r] * dim, .rows = send_count[r], .cols = dim,
                                    .device = DEVICE_CUDA};
            sends[n_sends++] = (P2pSend){.tensor = &views[2 * r], .peer = r};
        }
        if (received_count[r] > 0) {
            views[2 * r + 1] = (Tensor){.data = received + (size_t)received_offset[r] * dim, .rows = received_count[r],
                                        .cols = dim, .device = DEVICE_CUDA};
            receives[n_receives++] = (P2pReceive){.tensor = &views[2 * r + 1], .peer = r};
        }
    }
    group_exchange(group_world(), sends, n_sends, receives, n_receives);
    free(views);
    free(sends);
    free(receives);
}
#endif

static void table_init(EmbeddingTable *t, const char *name, int rows, int dim, bool sharded, EmbeddingsMode mode, bool gpu) {
    int rank = dist_rank(), world = dist_world_size();
    *t = (EmbeddingTable){.rows = rows, .dim = dim, .sharded = sharded, .mode = mode};
    snprintf(t->name, sizeof t->name, "%s", name);
    t->owned = sharded ? (rows - rank + world - 1) / world : rows;
    if (t->owned < 0) t->owned = 0;
    size_t bytes = ((size_t)t->owned * dim + 1) * sizeof(float);
    t->weight = xcalloc(1, bytes);  // on a GPU rank, the host's copy
    if (!gpu) {
        t->exp_avg = xcalloc(1, bytes);
        t->exp_avg_sq = xcalloc(1, bytes);
    }
    t->slot = xmalloc((size_t)rows * sizeof(int));
    for (int k = 0; k < rows; k++) t->slot[k] = -1;
    t->update_slot = xmalloc(((size_t)t->owned + 1) * sizeof(int));
    for (int k = 0; k < t->owned; k++) t->update_slot[k] = -1;
    t->ask_count = xcalloc((size_t)world, sizeof(int));
    t->ask_offset = xcalloc((size_t)world + 1, sizeof(int));
    t->asked_count = xcalloc((size_t)world, sizeof(int));
    t->asked_offset = xcalloc((size_t)world + 1, sizeof(int));
    if (mode == EMBEDDINGS_DENSE) {
        if (!gpu) t->dense_grad = xcalloc((size_t)rows * dim + 1, sizeof(float));
        t->dense_touched = xcalloc((size_t)rows + 1, 1);
    }
#if HAVE_CUDA
    if (gpu) {
        float **tables[4] = {&t->gpu_weight, &t->gpu_exp_avg, &t->gpu_exp_avg_sq, &t->gpu_dense_grad};
        for (int k = 0; k < 4; k++) {
            size_t table_bytes = k < 3 ? bytes : mode == EMBEDDINGS_DENSE ? ((size_t)rows * (dim + 1) + 1) * sizeof(float) : 0;
            if (!table_bytes) continue;
            *tables[k] = device_alloc(table_bytes);
            CHECK_CUDA(cudaMemsetAsync(*tables[k], 0, table_bytes, device_stream()));
        }
        t->by_owner = xcalloc(1, sizeof(GpuGroups));
        t->updates = xcalloc(1, sizeof(GpuGroups));
    }
#endif
}

static void groups_free(GpuGroups *g) {
#if HAVE_CUDA
    if (!g) return;
    DeviceBuffer *buffers[] = {&g->keys, &g->scratch, &g->order, &g->count, &g->group_key, &g->group_start, &g->group_of};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++) device_buffer_free(buffers[k]);
#endif
    free(g);
}

static void table_free(EmbeddingTable *t) {
    void *buffers[] = {t->weight, t->exp_avg, t->exp_avg_sq, t->slot, t->touched, t->sample_slot, t->looked_up, t->grad,
                       t->update_slot, t->update, t->update_grad, t->asked_count, t->asked_offset, t->asked,
                       t->ask_count, t->ask_offset, t->ask_order, t->exchange, t->dense_grad, t->dense_touched};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++) free(buffers[k]);
#if HAVE_CUDA
    float *tables[4] = {t->gpu_weight, t->gpu_exp_avg, t->gpu_exp_avg_sq, t->gpu_dense_grad};
    for (int k = 0; k < 4; k++) device_free(tables[k]);
    DeviceBuffer *device_buffers[] = {&t->gpu_looked_up, &t->gpu_grad, &t->gpu_send, &t->gpu_received,
                                      &t->gpu_send_ids, &t->gpu_received_ids, &t->gpu_asked, &t->gpu_place,
                                      &t->gpu_update_grad};
    for (size_t k = 0; k < sizeof device_buffers / sizeof device_buffers[0]; k++) device_buffer_free(device_buffers[k]);
#endif
    groups_free(t->by_owner);
    groups_free(t->updates);
}

static int local_index(const EmbeddingTable *t, int row) { return t->sharded ? row / dist_world_size() : row; }

static EmbeddingTable *table_of(Mf *model, int t) {
    EmbeddingTable *tables[4] = {&model->user_embedding, &model->item_embedding, &model->user_bias, &model->item_bias};
    return tables[t];
}

// GPU: the host's copies of the tables to the GPU, and back.
static void upload_weights(Mf *model) {
#if HAVE_CUDA
    if (!on_gpu(model)) return;
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        upload_floats(table->gpu_weight, table->weight, (size_t)table->owned * table->dim, "the embedding tables' copy to the GPU");
    }
#else
    (void)model;
#endif
}

static void download_weights(Mf *model) {
#if HAVE_CUDA
    if (!on_gpu(model)) return;
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        device_read_to_host(table->weight, table->gpu_weight, (size_t)table->owned * table->dim * sizeof(float),
                            "the embedding tables");
    }
#else
    (void)model;
#endif
}

Mf *mf_new(EmbeddingsMode mode, Device device, int n_users, int n_items, int dim, float global_mean, double lr, double weight_decay,
           Rng *rng) {
    Mf *model = xcalloc(1, sizeof *model);
    *model = (Mf){.mode = mode, .device = device, .dim = dim, .lr = lr, .weight_decay = weight_decay};
    bool sharded = mode == EMBEDDINGS_SHARDED, gpu = on_gpu(model);
    EmbeddingsMode bias_mode = sharded ? EMBEDDINGS_SPARSE : mode;  // biases stay data-parallel
    table_init(&model->user_embedding, "user_embedding.weight", n_users, dim, sharded, mode, gpu);
    table_init(&model->item_embedding, "item_embedding.weight", n_items, dim, sharded, mode, gpu);
    table_init(&model->user_bias, "user_bias.weight", n_users, 1, false, bias_mode, gpu);
    table_init(&model->item_bias, "item_bias.weight", n_items, 1, false, bias_mode, gpu);
    model->global_mean = tensor_zeros(1, 1, DEVICE_CPU);
    model->global_mean.data[0] = global_mean;
    // Every rank draws the whole tables, row after row, and keeps its rows, so
    // that the values do not depend on the number of ranks or the mode.
    int world = dist_world_size(), rank = dist_rank();
    float *row = xmalloc((size_t)dim * sizeof(float));
    EmbeddingTable *tables[2] = {&model->user_embedding, &model->item_embedding};
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < tables[t]->rows; k++) {
            for (int d = 0; d < dim; d++) row[d] = rng_uniform(rng, -0.05f, 0.05f);
            if (!tables[t]->sharded || k % world == rank)
                memcpy(tables[t]->weight + (size_t)local_index(tables[t], k) * dim, row, (size_t)dim * sizeof(float));
        }
    free(row);
    upload_weights(model);
    if (gpu) {  // the batch's rows of each id array, shared by the two tables that it indexes
        model->gpu_users = xcalloc(1, sizeof(GpuGroups));
        model->gpu_items = xcalloc(1, sizeof(GpuGroups));
        model->user_embedding.batch_rows = model->user_bias.batch_rows = model->gpu_users;
        model->item_embedding.batch_rows = model->item_bias.batch_rows = model->gpu_items;
    }
    return model;
}


void mf_free(Mf *model) {
    for (int t = 0; t < 4; t++) {
        table_free(table_of(model, t));
        tensor_free(&model->full[t]);
    }
    tensor_free(&model->global_mean);
#if HAVE_CUDA
    device_buffer_free(&model->gpu_rating);
    device_buffer_free(&model->gpu_forward);
    device_buffer_free(&model->gpu_user);
    device_buffer_free(&model->gpu_item);
    if (model->comm_times) {
        CommTimes *times = model->comm_times;
        for (int k = 0; k < COMM_TIMES; k++) {
            CHECK_CUDA(cudaEventDestroy((cudaEvent_t)times->start[k]));
            CHECK_CUDA(cudaEventDestroy((cudaEvent_t)times->done[k]));
        }
    }
    if (model->branch) {
        StepBranch *branch = model->branch;
        CHECK_CUDA(cudaStreamDestroy(branch->stream));  // (its queued work still runs)
        CHECK_CUDA(cudaEventDestroy(branch->forked));
        CHECK_CUDA(cudaEventDestroy(branch->sorted));
        CHECK_CUDA(cudaEventDestroy(branch->done));
        free(branch);
    }
    if (model->losses && on_gpu(model)) device_free(model->losses);
    if (on_gpu(model)) device_free(model->gpu_step);
    if (model->gpu_queued_inputs) device_free(model->gpu_queued_inputs);
    if (model->host_losses && on_gpu(model)) device_host_free(model->host_losses);
#endif
    if (!on_gpu(model)) free(model->losses);
    free(model->comm_times);
    groups_free(model->gpu_users);
    groups_free(model->gpu_items);
    free(model->forward);
    free(model->queued_inputs);
    free(model);
}

// A table's bytes on a rank: the rows it owns, with Adam's two moments, and
// (dense) the whole gradient table and its touched flags. mf_embedding_bytes
// reports it, mf_add_memory_need estimates it before the tables exist.
static double table_bytes(double rows, double owned, int dim, bool dense_grad) {
    return 3 * owned * dim * sizeof(float) + (dense_grad ? rows * dim * sizeof(float) + rows : 0);
}

size_t mf_embedding_bytes(const Mf *model) {
    double bytes = 0;
    const EmbeddingTable *tables[4] = {&model->user_embedding, &model->item_embedding, &model->user_bias, &model->item_bias};
    for (int t = 0; t < 4; t++)
        bytes += table_bytes(tables[t]->rows, tables[t]->owned, tables[t]->dim, tables[t]->dense_grad != NULL);
    return (size_t)bytes;
}

void mf_add_memory_need(MemoryNeed *need, EmbeddingsMode mode, int n_users, int n_items, int dim, int world,
                        Device device, int epoch_steps) {
    bool sharded = mode == EMBEDDINGS_SHARDED, dense = mode == EMBEDDINGS_DENSE;
    double users = n_users, items = n_items;
    double owned_users = sharded ? ceil(users / world) : users, owned_items = sharded ? ceil(items / world) : items;
    memory_need_add(need, "embeddings and Adam's moments",
                    table_bytes(users, owned_users, dim, dense) + table_bytes(items, owned_items, dim, dense) +
                    table_bytes(users, users, 1, dense) + table_bytes(items, items, 1, dense));
    // A double a step, in room that doubles as it grows (reserve_losses): up to twice the steps
    // and those queued past them, and the room before it while it grows (at --batch_size 1 on
    // 5 M ratings, ~110 MB).
#if HAVE_CUDA
    if (device == DEVICE_CUDA) memory_need_add(need, "losses", 3.0 * ((double)epoch_steps + MF_QUEUED_STEPS) * sizeof(double));
#else
    (void)device, (void)epoch_steps;
#endif
}

// ------------------------------------------------------------------ lookups
// The rows that n samples use, in order of first use; each sample's place among them.
static void table_collect(EmbeddingTable *t, const int *index, int n) {
    for (int j = 0; j < t->n_touched; j++) t->slot[t->touched[j]] = -1;
    t->n_touched = 0;
    int needed = n < t->rows ? n : t->rows;
    if (needed < 1) needed = 1;  // never NULL buffers, even for an empty slice
    if (needed > t->capacity) {
        int capacity = t->capacity;
        grow((void **)&t->touched, &capacity, needed, sizeof(int));
        capacity = t->capacity;
        grow((void **)&t->looked_up, &capacity, needed, (size_t)t->dim * sizeof(float));
        capacity = t->capacity;
        grow((void **)&t->grad, &capacity, needed, (size_t)t->dim * sizeof(float));
        t->capacity = capacity;
    }
    free(t->sample_slot);
    t->sample_slot = xmalloc(((size_t)n + 1) * sizeof(int));
    for (int s = 0; s < n; s++) {
        int row = index[s];
        if (t->slot[row] < 0) {
            t->slot[row] = t->n_touched;
            t->touched[t->n_touched++] = row;
        }
        t->sample_slot[s] = t->slot[row];
    }
}

static MPI_Datatype row_type(int dim) {
    MPI_Datatype type;
    CHECK_MPI(MPI_Type_contiguous(dim, MPI_FLOAT, &type));
    CHECK_MPI(MPI_Type_commit(&type));
    return type;
}

static void offsets(const int *count, int *offset, int world) {
    offset[0] = 0;
    for (int r = 0; r < world; r++) offset[r + 1] = offset[r] + count[r];
}

// Sharded: ask each owner for the touched rows it holds (ids by all-to-all),
// and take the rows back (all-to-all). The owner keeps what each rank asked:
// the gradients come back in the same order.
static void table_fetch_sharded(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), rank = dist_rank(), dim = t->dim;
    memset(t->ask_count, 0, (size_t)world * sizeof(int));
    for (int j = 0; j < t->n_touched; j++) t->ask_count[t->touched[j] % world]++;
    offsets(t->ask_count, t->ask_offset, world);
    free(t->ask_order);
    t->ask_order = xmalloc(((size_t)t->n_touched + 1) * sizeof(int));
    int *fill = xmalloc((size_t)world * sizeof(int));
    memcpy(fill, t->ask_offset, (size_t)world * sizeof(int));
    int *ids = xmalloc(((size_t)t->n_touched + 1) * sizeof(int));
    for (int j = 0; j < t->n_touched; j++) {
        int k = fill[t->touched[j] % world]++;
        t->ask_order[k] = j;
        ids[k] = t->touched[j];
    }
    free(fill);
    double start = wall_seconds();
    CHECK_MPI(MPI_Alltoall(t->ask_count, 1, MPI_INT, t->asked_count, 1, MPI_INT, MPI_COMM_WORLD));
    offsets(t->asked_count, t->asked_offset, world);
    t->n_asked = t->asked_offset[world];
    grow((void **)&t->asked, &t->asked_capacity, t->n_asked + 1, sizeof(int));
    CHECK_MPI(MPI_Alltoallv(ids, t->ask_count, t->ask_offset, MPI_INT, t->asked, t->asked_count, t->asked_offset, MPI_INT,
                            MPI_COMM_WORLD));
    model->comm_seconds += wall_seconds() - start;
    for (int k = 0; k < t->n_asked; k++) t->asked[k] /= world;  // local indices
    int rows_needed = t->n_asked > t->n_touched ? t->n_asked : t->n_touched;
    // Bytes sent to the other ranks: the ids asked, and the rows sent back.
    model->bytes_sent += (double)(t->n_touched - t->ask_count[rank]) * sizeof(int) +
                         (double)(t->n_asked - t->asked_count[rank]) * dim * sizeof(float);
    free(ids);
    grow((void **)&t->exchange, &t->exchange_capacity, 2 * rows_needed + 1, (size_t)dim * sizeof(float));
    float *reply = t->exchange, *received = t->exchange + (size_t)rows_needed * dim;
    for (int k = 0; k < t->n_asked; k++)
        memcpy(reply + (size_t)k * dim, t->weight + (size_t)t->asked[k] * dim, (size_t)dim * sizeof(float));
    MPI_Datatype row = row_type(dim);
    start = wall_seconds();
    CHECK_MPI(MPI_Alltoallv(reply, t->asked_count, t->asked_offset, row, received, t->ask_count, t->ask_offset, row,
                            MPI_COMM_WORLD));
    model->comm_seconds += wall_seconds() - start;
    MPI_Type_free(&row);
    for (int k = 0; k < t->n_touched; k++)
        memcpy(t->looked_up + (size_t)t->ask_order[k] * dim, received + (size_t)k * dim, (size_t)dim * sizeof(float));
}

static void table_lookup(Mf *model, EmbeddingTable *t, const int *index, int n) {
    table_collect(t, index, n);
    if (t->sharded) {
        table_fetch_sharded(model, t);
        return;
    }
    for (int j = 0; j < t->n_touched; j++)
        memcpy(t->looked_up + (size_t)j * t->dim, t->weight + (size_t)t->touched[j] * t->dim, (size_t)t->dim * sizeof(float));
}

#if HAVE_CUDA
// Where a training step's batch is read on the GPU: in the epoch's ratings, where the step's inputs
// say (mf_prepare_step), or (NULL) in the step's own buffers, ids copied from the host.
static const MfStepInputs *step_batch(const Mf *model, const RatingBatch *batch) {
    return batch->gpu_user ? model->gpu_step : NULL;
}
static void lookup_gpu(Mf *model, const MfStepInputs *take, int n, int max_n, bool training);
#endif

void mf_lookup(Mf *model, const RatingBatch *batch) {
    CHECK(batch->n <= batch->max_n, "mf_lookup: %d samples, past the batch's bound %d", batch->n, batch->max_n);
#if HAVE_CUDA
    if (on_gpu(model)) {
        CHECK(model->prepared, "mf_lookup: no mf_prepare_step before it");
        if (step_batch(model, batch))  // the step's inputs, from those queued (mf_prepare_step)
            gpu_mf_take_step_inputs(model->gpu_queued_inputs, model->gpu_step, device_stream());
        // The batch's ids in the step's own buffers (from the host: mf_prepare_step put them
        // there), or where mf_prepare_step's inputs say (the epoch's ratings on the GPU), which the
        // sorts read there: the same pointers every step, as a CUDA graph needs.
        lookup_gpu(model, step_batch(model, batch), batch->n, batch->max_n, true);
        return;
    }
#endif
    table_lookup(model, &model->user_embedding, batch->user, batch->n);
    table_lookup(model, &model->item_embedding, batch->item, batch->n);
    table_lookup(model, &model->user_bias, batch->user, batch->n);
    table_lookup(model, &model->item_bias, batch->item, batch->n);
}

// ------------------------------------------------------------------ forward and backward
#if HAVE_CUDA
static void forward_backward_gpu(Mf *model, const RatingBatch *batch);
#endif

// This step's loss share, kept until mf_take_losses (on a CPU rank: one).
static void keep_loss(Mf *model, double loss) {
    if (!model->losses) model->losses = xmalloc(sizeof(double)), model->losses_capacity = 1;
    model->losses[0] = loss;
    model->pending = 1;
}

void mf_forward_backward(Mf *model, const RatingBatch *batch) {
#if HAVE_CUDA
    if (on_gpu(model)) {
        forward_backward_gpu(model, batch);
        return;
    }
#endif
    EmbeddingTable *P = &model->user_embedding, *Q = &model->item_embedding, *BU = &model->user_bias, *BI = &model->item_bias;
    int dim = model->dim, n = batch->n;
    const float *rating = batch->rating;
    long global_n = batch->global_n;
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        memset(table->grad, 0, (size_t)table->n_touched * table->dim * sizeof(float));
    }
    float mean = model->global_mean.data[0];
    float wd = (float)model->weight_decay, scale = 2.0f / (float)global_n, decay = 2.0f * wd / (float)global_n;
    double loss_sum = 0.0;
    // Sample after sample, in the batch's order: each row's gradient sums its
    // samples' contributions in that order (mf.h: the same steps in every mode).
    for (int s = 0; s < n; s++) {
        const float *p = P->looked_up + (size_t)P->sample_slot[s] * dim, *q = Q->looked_up + (size_t)Q->sample_slot[s] * dim;
        float dot = 0.0f, p_norm = 0.0f, q_norm = 0.0f;
        for (int d = 0; d < dim; d++) {
            dot += p[d] * q[d];
            p_norm += p[d] * p[d];
            q_norm += q[d] * q[d];
        }
        float prediction = dot + BU->looked_up[BU->sample_slot[s]] + BI->looked_up[BI->sample_slot[s]] + mean;
        float error = prediction - rating[s];
        loss_sum += (double)error * error + (double)wd * ((double)p_norm + q_norm);
        float g = scale * error;  // d loss / d prediction
        float *grad_p = P->grad + (size_t)P->sample_slot[s] * dim, *grad_q = Q->grad + (size_t)Q->sample_slot[s] * dim;
        for (int d = 0; d < dim; d++) {
            grad_p[d] += g * q[d] + decay * p[d];
            grad_q[d] += g * p[d] + decay * q[d];
        }
        BU->grad[BU->sample_slot[s]] += g;
        BI->grad[BI->sample_slot[s]] += g;
    }
    keep_loss(model, loss_sum / (double)global_n);
}

// ------------------------------------------------------------------ the exchanges
static void update_begin(EmbeddingTable *t) {
    for (int j = 0; j < t->n_update; j++) t->update_slot[t->update[j]] = -1;
    t->n_update = 0;
}

// The gradient row of local row `local` in the update list (zeros when new).
static float *update_row(EmbeddingTable *t, int local) {
    int slot = t->update_slot[local];
    if (slot < 0) {
        int capacity = t->update_capacity;
        grow((void **)&t->update, &capacity, t->n_update + 1, sizeof(int));
        capacity = t->update_capacity;
        grow((void **)&t->update_grad, &capacity, t->n_update + 1, (size_t)t->dim * sizeof(float));
        t->update_capacity = capacity;
        slot = t->n_update++;
        t->update_slot[local] = slot;
        t->update[slot] = local;
        memset(t->update_grad + (size_t)slot * t->dim, 0, (size_t)t->dim * sizeof(float));
    }
    return t->update_grad + (size_t)slot * t->dim;
}

static void add_row(float *sum, const float *row, int dim) {
    for (int d = 0; d < dim; d++) sum[d] += row[d];
}

// dense: the whole gradient table allreduced, and which rows any rank touched.
static void exchange_dense(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), dim = t->dim;
    for (int j = 0; j < t->n_touched; j++) {
        memcpy(t->dense_grad + (size_t)t->touched[j] * dim, t->grad + (size_t)j * dim, (size_t)dim * sizeof(float));
        t->dense_touched[t->touched[j]] = 1;
    }
    double start = wall_seconds();
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, t->dense_grad, t->rows * dim, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, t->dense_touched, t->rows, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD));
    model->comm_seconds += wall_seconds() - start;
    model->bytes_sent += 2.0 * (world - 1) / world * ((double)t->rows * dim * sizeof(float) + t->rows);
    update_begin(t);
    for (int row = 0; row < t->rows; row++) {
        if (!t->dense_touched[row]) continue;
        float *grad = t->dense_grad + (size_t)row * dim;
        memcpy(update_row(t, row), grad, (size_t)dim * sizeof(float));
        memset(grad, 0, (size_t)dim * sizeof(float));
        t->dense_touched[row] = 0;
    }
}

// sparse: every rank's touched rows (ids and gradient rows) gathered by every
// rank, and added per row in rank order.
static void exchange_sparse(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), dim = t->dim;
    int *count = xmalloc((size_t)world * sizeof(int)), *offset = xmalloc(((size_t)world + 1) * sizeof(int));
    double start = wall_seconds();
    CHECK_MPI(MPI_Allgather(&t->n_touched, 1, MPI_INT, count, 1, MPI_INT, MPI_COMM_WORLD));
    offsets(count, offset, world);
    int total = offset[world];
    int *ids = xmalloc(((size_t)total + 1) * sizeof(int));
    float *grads = xmalloc(((size_t)total * dim + 1) * sizeof(float));
    MPI_Datatype row = row_type(dim);
    CHECK_MPI(MPI_Allgatherv(t->touched, t->n_touched, MPI_INT, ids, count, offset, MPI_INT, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Allgatherv(t->grad, t->n_touched, row, grads, count, offset, row, MPI_COMM_WORLD));
    model->comm_seconds += wall_seconds() - start;
    MPI_Type_free(&row);
    model->bytes_sent += (double)(world - 1) / world * ((double)total * (dim * sizeof(float) + sizeof(int)) + world * sizeof(int));
    update_begin(t);
    for (int k = 0; k < total; k++) add_row(update_row(t, ids[k]), grads + (size_t)k * dim, dim);
    free(ids);
    free(grads);
    free(count);
    free(offset);
}

// sharded: each touched row's gradient sent to its owner (all-to-all, in the
// order the owner was asked for the rows), who adds them in rank order.
static void exchange_sharded(Mf *model, EmbeddingTable *t) {
    int rank = dist_rank(), dim = t->dim;
    int rows_needed = t->n_asked > t->n_touched ? t->n_asked : t->n_touched;
    float *send = t->exchange, *received = t->exchange + (size_t)rows_needed * dim;
    for (int k = 0; k < t->n_touched; k++)
        memcpy(send + (size_t)k * dim, t->grad + (size_t)t->ask_order[k] * dim, (size_t)dim * sizeof(float));
    MPI_Datatype row = row_type(dim);
    double start = wall_seconds();
    CHECK_MPI(MPI_Alltoallv(send, t->ask_count, t->ask_offset, row, received, t->asked_count, t->asked_offset, row,
                            MPI_COMM_WORLD));
    model->comm_seconds += wall_seconds() - start;
    MPI_Type_free(&row);
    model->bytes_sent += (double)(t->n_touched - t->ask_count[rank]) * dim * sizeof(float);
    update_begin(t);
    for (int k = 0; k < t->n_asked; k++) add_row(update_row(t, t->asked[k]), received + (size_t)k * dim, dim);
}

#if HAVE_CUDA
// ------------------------------------------------------------------ a step on the GPU, queued without a wait
// The kernels find the batch's rows (gpu_sort_groups), and every count they find stays on the
// GPU: the host sizes each launch and each exchange by a bound it knows (a rank's slice touches at
// most t->bound rows), never by a count it would have to wait for. See mf.h.

// Bits of keys below `limit`.
static int key_bits(long limit) {
    int bits = 0;
    while ((1L << bits) < limit) bits++;
    return bits;
}

// Room for n ints in b (one more: n may be 0).
static int *device_ints(DeviceBuffer *b, size_t n) { return device_buffer_reserve(b, (n + 1) * sizeof(int)); }

// A buffer that an exchange sends whole, unused slots included: zeroed when it is (re)allocated,
// so that no byte it sends was never written.
static void *exchange_buffer(DeviceBuffer *b, size_t bytes) {
    size_t had = b->bytes;
    void *data = device_buffer_reserve(b, bytes + sizeof(float));
    if (b->bytes != had) CHECK_CUDA(cudaMemsetAsync(data, 0, b->bytes, device_stream()));
    return data;
}

// The sort of n keys below key_limit (at keys, or where *keys_at says: SortGroups) into g's buffers
// (grown to n entries).
static SortGroups sort_of(GpuGroups *g, const int *keys, const int *const *keys_at, int n, const int *n_valid,
                          long key_limit, int block, int stride) {
    size_t entries = n > 0 ? (size_t)n : 1;
    return (SortGroups){keys, keys_at, n, n_valid, key_bits(key_limit), block, stride, device_ints(&g->scratch, 4 * entries),
                        device_ints(&g->order, entries), device_ints(&g->count, 1), device_ints(&g->group_key, entries),
                        device_ints(&g->group_start, entries + 1), device_ints(&g->group_of, entries)};
}

static void sort_groups(GpuGroups *g, const int *keys, int n, const int *n_valid, long key_limit, int block, int stride) {
    SortGroups sort = sort_of(g, keys, NULL, n, n_valid, key_limit, block, stride);
    gpu_sort_groups(&sort, 1, device_stream());
}

// Blocks of per_peer rows of dim to every rank and from every rank, block r of send to rank r,
// block r of received from rank r (this rank's own by a copy on the GPU).
static void all_to_all_blocks(const float *send, float *received, int per_peer, int dim) {
    int world = dist_world_size();
    int *count = xmalloc((size_t)world * sizeof(int)), *offset = xmalloc(((size_t)world + 1) * sizeof(int));
    for (int r = 0; r < world; r++) count[r] = per_peer;
    offsets(count, offset, world);
    gpu_rows_all_to_all(send, count, offset, received, count, offset, dim);
    free(count);
    free(offset);
}

// The exchanges' time, from CUDA events around them on the compute stream (which waits for NCCL's
// stream), read once they have happened: a question, not a wait, unless the host is COMM_TIMES
// exchanges ahead of the GPU (or `wait`: mf_comm_seconds).
static bool happened(cudaEvent_t event) {
    cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) return false;
    CHECK_CUDA(status);
    return true;
}

static void comm_account(Mf *model, bool wait) {
    CommTimes *times = model->comm_times;
    while (times && times->n > 0) {
        cudaEvent_t start = times->start[times->oldest], done = times->done[times->oldest];
        if (!wait && !happened(done)) return;
        if (wait) device_wait_event(done, "the exchanges' times");
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, done));
        model->comm_seconds += 1e-3 * ms;
        times->oldest = (times->oldest + 1) % COMM_TIMES;
        times->n--;
    }
}

static void comm_begin(Mf *model) {
    if (!model->comm_times) {
        CommTimes *times = xcalloc(1, sizeof *times);
        for (int k = 0; k < COMM_TIMES; k++) {
            cudaEvent_t start, done;
            CHECK_CUDA(cudaEventCreate(&start));
            CHECK_CUDA(cudaEventCreate(&done));
            times->start[k] = start, times->done[k] = done;
        }
        model->comm_times = times;
    }
    CommTimes *times = model->comm_times;
    comm_account(model, false);
    if (times->n == COMM_TIMES) {  // the host is that far ahead: the oldest, waited for
        cudaEvent_t done = times->done[times->oldest];
        device_wait_event(done, "the exchanges' times");
        comm_account(model, false);
    }
    CHECK_CUDA(cudaEventRecord((cudaEvent_t)times->start[(times->oldest + times->n) % COMM_TIMES], device_stream()));
}

static void comm_end(Mf *model) {
    CommTimes *times = model->comm_times;
    CHECK_CUDA(cudaEventRecord((cudaEvent_t)times->done[(times->oldest + times->n) % COMM_TIMES], device_stream()));
    times->n++;
}

// Sharded: each owner asked for the touched rows it holds (a block of ids for each, padded to the
// bound: all-to-all), and the rows back (a block of rows for each: all-to-all), into place.
static void fetch_sharded_gpu(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), B = t->bound, dim = t->dim;
    cudaStream_t stream = device_stream();
    GpuGroups *rows = t->batch_rows, *by_owner = t->by_owner;
    float *looked_up = device_rows(&t->gpu_looked_up, (size_t)B, dim);  // where the rows land, a row per group
    // The touched rows in owner order (each owner's in the order of their ids).
    int *owner = device_ints(&by_owner->keys, (size_t)B);
    gpu_owner_keys(rows->group_key.data, rows->count.data, B, world, owner, stream);
    sort_groups(by_owner, owner, B, NULL, world, B, B);
    size_t id_bytes = (size_t)world * (B + 1) * sizeof(int);
    int *send_ids = exchange_buffer(&t->gpu_send_ids, id_bytes), *received_ids = exchange_buffer(&t->gpu_received_ids, id_bytes);
    int *place = device_ints(&t->gpu_place, (size_t)B);
    gpu_ask_owners(rows->group_key.data, rows->count.data, B, world, by_owner->order.data, by_owner->count.data,
                   by_owner->group_key.data, by_owner->group_start.data, by_owner->group_of.data, B, send_ids, place, stream);
    all_to_all_blocks((const float *)send_ids, (float *)received_ids, 1, B + 1);  // ids travel as their bytes
    // The owner: the rows each rank asked for (its block's local indices, -1 past its count).
    int *asked = device_ints(&t->gpu_asked, (size_t)world * B);
    gpu_block_keys(received_ids, world, B + 1, B, asked, stream);
    size_t row_bytes = (size_t)world * B * dim * sizeof(float);
    float *reply = exchange_buffer(&t->gpu_send, row_bytes), *received = exchange_buffer(&t->gpu_received, row_bytes);
    gpu_keyed_rows(t->gpu_weight, asked, world * B, dim, reply, stream);
    all_to_all_blocks(reply, received, B, dim);
    gpu_copy_rows(received, place, looked_up, by_owner->order.data, NULL, rows->count.data, B, dim, stream);
    model->bytes_sent += (double)(world - 1) * ((B + 1) * sizeof(int) + (double)B * dim * sizeof(float));
}

// The batch's rows on the GPU: each id array's ids sorted, stably (each row's samples stay in the
// batch's order), and grouped, once for the two tables it indexes; then each table's rows.
static bool any_sharded(Mf *model) {
    for (int k = 0; k < 4; k++)
        if (table_of(model, k)->sharded) return true;
    return false;
}

// The batch's touched rows, grouped (the sorts), and a sharded table's fetched from their owners.
// A training step's sorts go on the step's branch where no table is sharded: the forward then reads
// every row in place by its id and needs nothing of them, so it runs beside them (only the
// backward waits for them: forward_backward_gpu). Along one stream the forward waited for the
// sorts: 10 and 6 us of a step's 34 on an H200 (ncu). The ids are in the step's buffers (gpu_user,
// gpu_item), or, where `take` is set, where it says (in device memory: step_batch).
static void lookup_gpu(Mf *model, const MfStepInputs *take, int n, int max_n, bool training) {
    const int *user = model->gpu_user.data, *item = model->gpu_item.data;
    SortGroups sorts[2] = {sort_of(model->gpu_users, user, take ? &take->user : NULL, n, NULL, model->user_embedding.rows, n, n),
                           sort_of(model->gpu_items, item, take ? &take->item : NULL, n, NULL, model->item_embedding.rows, n, n)};
    if (training && !any_sharded(model)) {
        StepBranch *branch = model->branch;
        CHECK_CUDA(cudaEventRecord(branch->forked, device_stream()));
        CHECK_CUDA(cudaStreamWaitEvent(branch->stream, branch->forked, 0));
        gpu_sort_groups(sorts, 2, branch->stream);  // (together: two launches)
        CHECK_CUDA(cudaEventRecord(branch->sorted, branch->stream));
        CHECK_CUDA(cudaEventRecord(branch->done, branch->stream));
        model->branch_open = model->sorts_beside = true;
    } else {
        gpu_sort_groups(sorts, 2, device_stream());  // (together: two launches)
    }
    bool timed = training && model->mode == EMBEDDINGS_SHARDED && dist_world_size() > 1 && !device_graph_capturing();
    if (timed) comm_begin(model);
    for (int k = 0; k < 4; k++) {  // (a table held whole is read in place: rows_gpu)
        EmbeddingTable *t = table_of(model, k);
        t->bound = max_n < t->rows ? max_n : t->rows;
        if (t->sharded) fetch_sharded_gpu(model, t);
    }
    if (timed) comm_end(model);
}

// Where the forward and backward read a table's batch rows on the GPU: a sharded table's from those
// fetched from their owners (gpu_looked_up, a row per group, a sample's at its group_of); a table
// held whole in place, in its own weight (a sample's row at its id, a group's at its key), which
// SparseAdam writes only after the backward has read it. A copy of those rows, one launch of a
// step's seven, cost about 3 us of step 15's 43 on an H200 and changed no value.
static const float *rows_gpu(const EmbeddingTable *t) { return t->sharded ? t->gpu_looked_up.data : t->gpu_weight; }
static const int *sample_rows_gpu(const EmbeddingTable *t, const int *ids) {
    return t->sharded ? t->batch_rows->group_of.data : ids;
}
// The same for the forward, where NULL says the sample's id (gpu_mf_forward reads the ids).
static const int *forward_rows_gpu(const EmbeddingTable *t) { return sample_rows_gpu(t, NULL); }
static const int *group_rows_gpu(const EmbeddingTable *t) { return t->sharded ? NULL : t->batch_rows->group_key.data; }

// The predictions (and errors, with ratings) of the n samples whose ids are in the step's buffers
// (gpu_user, gpu_item; the ratings in gpu_rating), after lookup_gpu; or, where `take` is set, where
// it says, copied into those buffers on the way: the step's first kernel takes its batch, where a
// launch of its own did (3 us of step 15's 34 on an H200, on its path).
static void forward_gpu(Mf *model, const MfStepInputs *take, bool ratings, int n, float *forward) {
    EmbeddingTable *P = &model->user_embedding, *Q = &model->item_embedding, *BU = &model->user_bias, *BI = &model->item_bias;
    MfSamples samples = {take, model->gpu_user.data, model->gpu_item.data, ratings ? model->gpu_rating.data : NULL};
    gpu_mf_forward(rows_gpu(P), forward_rows_gpu(P), rows_gpu(Q), forward_rows_gpu(Q), rows_gpu(BU), forward_rows_gpu(BU),
                   rows_gpu(BI), forward_rows_gpu(BI), samples, n, model->dim, model->global_mean.data[0], forward,
                   device_stream());
}

// Room for `n` losses kept in device memory: the array doubles until they fit, keeping what it
// holds (cudaMalloc and cudaFree wait: in the first epoch only).
static void reserve_losses(Mf *model, int n) {
    if (n <= model->losses_capacity) return;
    long capacity = model->losses_capacity ? model->losses_capacity : 1024;
    while (capacity < n) capacity *= 2;
    if (capacity > INT_MAX) capacity = INT_MAX;  // (an epoch of over 2^30 steps: room for any, not twice)
    double *grown = device_alloc((size_t)capacity * sizeof(double));
    if (model->pending > 0)
        CHECK_CUDA(cudaMemcpyAsync(grown, model->losses, (size_t)model->pending * sizeof(double), cudaMemcpyDeviceToDevice,
                                   device_stream()));
    device_free(model->losses);  // (after the copy: device_free synchronizes first)
    device_host_free(model->host_losses);
    model->losses = grown;
    model->host_losses = device_host_alloc((size_t)capacity * sizeof(double));
    model->losses_capacity = (int)capacity;
}

// Where this step's loss share goes: the next double of those kept in device memory.
static double *loss_slot(Mf *model) {
    reserve_losses(model, model->pending + 1);
    return model->losses + model->pending++;
}

// The compute stream waits for this step's sorts where lookup_gpu put them on the branch: before
// the first work that reads their groups (the backward, or the exchanges of a step without one).
static void wait_for_sorts(Mf *model) {
    if (model->sorts_beside) CHECK_CUDA(cudaStreamWaitEvent(device_stream(), model->branch->sorted, 0));
    model->sorts_beside = false;
}

// The step's branch joins the compute stream again, if this step forked it: at the step's end
// (mf_adam_step), and as a guard wherever the compute stream next reads the step's loss or
// overwrites what the branch reads (mf_end_step, mf_predict).
static void join_branch(Mf *model) {
    if (model->branch_open) CHECK_CUDA(cudaStreamWaitEvent(device_stream(), model->branch->done, 0));
    model->branch_open = model->sorts_beside = false;
}

// The forward and backward on the GPU: a thread per sample for the predictions and errors, one
// for the loss (mf.c's double sum, kept on the GPU), then, the four tables in one launch, a thread
// per gradient element that sums its row's samples in the batch's order.
static void forward_backward_gpu(Mf *model, const RatingBatch *batch) {
    EmbeddingTable *P = &model->user_embedding, *Q = &model->item_embedding;
    int n = batch->n;
    cudaStream_t stream = device_stream();
    float *forward = device_buffer_reserve(&model->gpu_forward, (4 * (size_t)n + 1) * sizeof(float));
    forward_gpu(model, step_batch(model, batch), true, n, forward);
    float wd = (float)model->weight_decay, scale = 2.0f / (float)batch->global_n, decay = 2.0f * wd / (float)batch->global_n;
    // The loss's sum (one thread's, in the samples' order: the CPU's bits) is a chain of a thousand
    // additions that nothing in the step reads: on a stream of its own, it runs beside the backward,
    // the exchanges and SparseAdam (in a CUDA graph, a branch beside theirs), and the step joins it
    // at its end (mf_adam_step), before mf_take_losses reads it and the next step's forward overwrites
    // what it reads.
    StepBranch *branch = model->branch;
    CHECK_CUDA(cudaEventRecord(branch->forked, stream));
    CHECK_CUDA(cudaStreamWaitEvent(branch->stream, branch->forked, 0));
    gpu_mf_loss(forward, n, wd, (double)batch->global_n, &model->gpu_step->loss, branch->stream);
    CHECK_CUDA(cudaEventRecord(branch->done, branch->stream));
    model->branch_open = true;
    wait_for_sorts(model);
    EmbeddingGrad grads[MF_TABLES];  // the four tables' in one launch
    for (int k = 0; k < 4; k++) {
        EmbeddingTable *table = table_of(model, k), *other = k == 0 ? Q : k == 1 ? P : NULL;
        GpuGroups *mine = table->batch_rows;
        const int *other_ids = k == 0 ? model->gpu_item.data : model->gpu_user.data;
        grads[k] = (EmbeddingGrad){mine->group_start.data, mine->order.data, mine->count.data, table->bound, table->dim,
                                   other ? rows_gpu(table) : NULL, other ? group_rows_gpu(table) : NULL,
                                   other ? rows_gpu(other) : NULL, other ? sample_rows_gpu(other, other_ids) : NULL,
                                   device_rows(&table->gpu_grad, (size_t)table->bound, table->dim)};
    }
    gpu_embedding_backward(forward, scale, decay, grads, 4, stream);
}

// dense: the gradient table (zeros but the touched rows) and a float per row (1: touched)
// allreduced by NCCL, each in one piece: rows no rank touched stay 0, and SparseAdam skips them.
static void exchange_dense_gpu(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), dim = t->dim;
    float *touched = t->gpu_dense_grad + (size_t)t->rows * dim;
    gpu_copy_rows(t->gpu_grad.data, NULL, t->gpu_dense_grad, t->batch_rows->group_key.data, touched,
                  t->batch_rows->count.data, t->bound, dim, device_stream());
    if (world > 1) {
        Tensor table = {.data = t->gpu_dense_grad, .rows = t->rows, .cols = dim, .device = DEVICE_CUDA};
        Tensor flags = {.data = touched, .rows = t->rows, .cols = 1, .device = DEVICE_CUDA};
        group_all_reduce(group_world(), &table);
        group_all_reduce(group_world(), &flags);
    }
    model->bytes_sent += 2.0 * (world - 1) / world * ((double)t->rows * dim * sizeof(float) + (double)t->rows * sizeof(float));
}

// sparse: each rank's block, its touched rows' gradients and their ids (with their count), padded
// to the bound, all-gathered by NCCL; then the gathered ids sorted and grouped (each row's
// blocks in rank order) and each row's gradients added in that order, from zero, as the CPU's.
static void exchange_sparse_gpu(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), rank = dist_rank(), dim = t->dim, B = t->bound;
    int block_rows = B + (B + 1 + dim - 1) / dim;  // B rows, then the count and B ids in rows of dim
    size_t block_floats = (size_t)block_rows * dim;
    cudaStream_t stream = device_stream();
    GpuGroups *rows = t->batch_rows, *updates = t->updates;
    if (world == 1) {  // the touched rows are the ones to update, each with its one gradient row
        // (the CPU adds it to zero: the same bits, as the kernel's sums start from zero and never give -0)
        t->gpu_update_rows = rows->group_key.data, t->gpu_update_count = rows->count.data;
        t->gpu_update_grads = t->gpu_grad.data, t->update_bound = B;
        return;
    }
    float *gathered = exchange_buffer(&t->gpu_received, (size_t)world * block_floats * sizeof(float));
    float *mine = gathered + (size_t)rank * block_floats;
    gpu_copy_rows(t->gpu_grad.data, NULL, mine, NULL, NULL, rows->count.data, B, dim, stream);
    gpu_pack_ids(rows->group_key.data, rows->count.data, B, (int *)(mine + (size_t)B * dim), stream);
    Tensor my_block = {.data = mine, .rows = block_rows, .cols = dim, .device = DEVICE_CUDA};
    Tensor all = {.data = gathered, .rows = world * block_rows, .cols = dim, .device = DEVICE_CUDA};
    group_all_gather(group_world(), &my_block, &all);
    int *keys = device_ints(&updates->keys, (size_t)world * B);
    gpu_block_keys((const int *)(gathered + (size_t)B * dim), world, (int)block_floats, B, keys, stream);
    sort_groups(updates, keys, world * B, NULL, t->rows, B, block_rows);  // order: rows of `gathered`
    t->update_bound = world * B < t->owned ? world * B : t->owned;
    gpu_sum_rows(gathered, updates->group_start.data, updates->order.data, updates->count.data, t->update_bound, dim,
                 device_rows(&t->gpu_update_grad, (size_t)t->update_bound, dim), stream);
    t->gpu_update_rows = updates->group_key.data, t->gpu_update_count = updates->count.data;
    t->gpu_update_grads = t->gpu_update_grad.data;
    model->bytes_sent += (double)(world - 1) * block_floats * sizeof(float);
}

// sharded: each touched row's gradient to its owner (a block of rows for each, in the order the
// owner was asked for them: all-to-all), who sorts and groups the ids asked of it (each row's
// blocks in rank order) and adds each row's gradients in that order, from zero.
static void exchange_sharded_gpu(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), dim = t->dim, B = t->bound;
    cudaStream_t stream = device_stream();
    GpuGroups *rows = t->batch_rows, *updates = t->updates;
    size_t row_bytes = (size_t)world * B * dim * sizeof(float);
    float *send = exchange_buffer(&t->gpu_send, row_bytes), *received = exchange_buffer(&t->gpu_received, row_bytes);
    gpu_copy_rows(t->gpu_grad.data, t->by_owner->order.data, send, t->gpu_place.data, NULL, rows->count.data, B, dim, stream);
    all_to_all_blocks(send, received, B, dim);
    sort_groups(updates, t->gpu_asked.data, world * B, NULL, t->owned, world * B, world * B);
    t->update_bound = world * B < t->owned ? world * B : t->owned;
    gpu_sum_rows(received, updates->group_start.data, updates->order.data, updates->count.data, t->update_bound, dim,
                 device_rows(&t->gpu_update_grad, (size_t)t->update_bound, dim), stream);
    t->gpu_update_rows = updates->group_key.data, t->gpu_update_count = updates->count.data;
    t->gpu_update_grads = t->gpu_update_grad.data;
    model->bytes_sent += (double)(world - 1) * B * dim * sizeof(float);
}
#endif

void mf_exchange_gradients(Mf *model) {
#if HAVE_CUDA
    if (on_gpu(model)) {
        // Timed by events on the compute stream, except in a capture: there an event marks a place in
        // the graph, and replays run no host code to read one (their time is not counted).
        bool timed = dist_world_size() > 1 && !device_graph_capturing();
        wait_for_sorts(model);  // (forward_backward_gpu has: a guard)
        if (timed) comm_begin(model);
        for (int t = 0; t < 4; t++) {
            EmbeddingTable *table = table_of(model, t);
            if (table->sharded) exchange_sharded_gpu(model, table);
            else if (table->mode == EMBEDDINGS_DENSE) exchange_dense_gpu(model, table);
            else exchange_sparse_gpu(model, table);
        }
        if (timed) comm_end(model);
        model->exchanged = true;
        return;
    }
#endif
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        if (table->sharded) exchange_sharded(model, table);
        else if (table->mode == EMBEDDINGS_DENSE) exchange_dense(model, table);
        else exchange_sparse(model, table);
    }
    model->exchanged = true;
}

// ------------------------------------------------------------------ SparseAdam
// torch.optim.SparseAdam's arithmetic, on the rows the global batch touched:
// m += (g - m)(1 - beta1); v += (g^2 - v)(1 - beta2);
// w -= lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps).
// The step count and step size are mf_prepare_step's (on a GPU rank, read in device memory).
void mf_adam_step(Mf *model) {
    CHECK(model->prepared, "mf_adam_step: no mf_prepare_step before it");
    model->prepared = false;
    const double beta1 = 0.9, beta2 = 0.999;
    float minus_step_size = model->minus_step_size;
    float one_minus_beta1 = (float)(1.0 - beta1), one_minus_beta2 = (float)(1.0 - beta2), eps = 1e-8f;
#if HAVE_CUDA
    if (on_gpu(model)) {  // the four tables in one launch
        SparseAdamRows rows[MF_TABLES];
        for (int t = 0; t < 4; t++) {
            EmbeddingTable *table = table_of(model, t);
            if (!table->sharded && table->mode == EMBEDDINGS_DENSE)  // every row a rank touched (its flag)
                rows[t] = (SparseAdamRows){table->gpu_weight, table->gpu_exp_avg, table->gpu_exp_avg_sq, NULL,
                                           table->gpu_dense_grad + (size_t)table->rows * table->dim,
                                           table->gpu_dense_grad, NULL, table->rows, table->dim};
            else
                rows[t] = (SparseAdamRows){table->gpu_weight, table->gpu_exp_avg, table->gpu_exp_avg_sq,
                                           table->gpu_update_rows, NULL, table->gpu_update_grads,
                                           table->gpu_update_count, table->update_bound, table->dim};
        }
        gpu_sparse_adam(rows, 4, model->gpu_step, one_minus_beta1, one_minus_beta2, eps, device_stream());
        for (int t = 0; t < 4; t++) {  // dense: the gradient table and its flags, zeros again
            EmbeddingTable *table = table_of(model, t);
            if (!table->sharded && table->mode == EMBEDDINGS_DENSE)
                gpu_fill(table->gpu_dense_grad, (size_t)table->rows * (table->dim + 1), 0.0f, device_stream());
        }
        join_branch(model);  // the step ends: its branch joins the compute stream again
        return;
    }
#endif
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        int dim = table->dim;
        for (int j = 0; j < table->n_update; j++) {
            size_t at = (size_t)table->update[j] * dim;
            float *w = table->weight + at, *m = table->exp_avg + at, *v = table->exp_avg_sq + at;
            const float *g = table->update_grad + (size_t)j * dim;
            for (int d = 0; d < dim; d++) {
                float m_update = (g[d] - m[d]) * one_minus_beta1, m_old = m[d];
                m[d] = m_old + m_update;
                float v_update = (g[d] * g[d] - v[d]) * one_minus_beta2, v_old = v[d];
                v[d] = v_old + v_update;
                float numerator = m_update + m_old, denominator = sqrtf(v_update + v_old) + eps;
                w[d] += minus_step_size * (numerator / denominator);
            }
        }
    }
}

// ------------------------------------------------------------------ around the step
// SparseAdam's step size at Adam's step count `step`, in double as Python computes it, rounded to
// float once.
static float sparse_adam_step_size(const Mf *model, long step) {
    const double beta1 = 0.9, beta2 = 0.999;
    double bias_correction1 = 1.0 - pow(beta1, (double)step), bias_correction2 = 1.0 - pow(beta2, (double)step);
    return (float)(-(model->lr * sqrt(bias_correction2) / bias_correction1));
}

#if HAVE_CUDA
static bool same_inputs(const MfStepInputs *a, const MfStepInputs *b) {
    return a->user == b->user && a->item == b->item && a->rating == b->rating &&
           a->minus_step_size == b->minus_step_size && a->loss == b->loss;
}

// How many steps' inputs a batch queues: its own and those of the batches that follow it in its
// epoch, up to MF_QUEUED_STEPS (at --batch_size 1 the queue is still 10 kB).
static int steps_to_queue(const RatingBatch *batch) {
    return batch->following < MF_QUEUED_STEPS - 1 ? 1 + batch->following : MF_QUEUED_STEPS;
}

// This step's inputs (`first`) and those of the batches that follow it in its epoch, on the GPU in
// one copy: batch k after this one max_n * k samples further on, Adam's step count k more, its loss
// k places after this one's (held: reserve_losses). Each step's first kernel takes its own
// (mf_lookup), where a copy before each step put them, a copy a step beside the graph's launch.
// The host's copy counts this step's as taken.
static void queue_inputs(Mf *model, const RatingBatch *batch, const MfStepInputs *first) {
    if (!model->queued_inputs) {
        model->queued_inputs = xcalloc(1, sizeof(MfQueuedInputs));
        model->gpu_queued_inputs = device_alloc(sizeof(MfQueuedInputs));
    }
    MfQueuedInputs *queued = model->queued_inputs;
    queued->next = 0, queued->count = steps_to_queue(batch);
    for (int k = 0; k < queued->count; k++) {
        size_t at = (size_t)k * (size_t)batch->max_n;
        queued->entry[k] = (MfStepInputs){.user = first->user + at, .item = first->item + at, .rating = first->rating + at,
                                          .minus_step_size = sparse_adam_step_size(model, model->step + k),
                                          .loss = first->loss + k};
    }
    device_upload(model->gpu_queued_inputs, queued,
                  offsetof(MfQueuedInputs, entry) + (size_t)queued->count * sizeof(MfStepInputs), "the steps' inputs");
    queued->next = 1;
}
#endif

void mf_prepare_step(Mf *model, const RatingBatch *batch) {
    CHECK(batch->n <= batch->max_n, "mf_prepare_step: %d samples, past the batch's bound %d", batch->n, batch->max_n);
    CHECK(batch->following >= 0 && (batch->following == 0 || batch->gpu_user),
          "mf_prepare_step: %d batches said to follow this one (expected 0 or more, and 0 for a batch not on the GPU)",
          batch->following);
    model->step++;
    model->minus_step_size = sparse_adam_step_size(model, model->step);
    model->prepared = true;
    model->exchanged = false;
    model->bytes_at_prepare = model->bytes_sent;
#if HAVE_CUDA
    if (on_gpu(model)) {
        // The step's own buffers, sized by the batch's bound: allocated here, never inside the step.
        size_t ints = ((size_t)batch->max_n + 1) * sizeof(int);
        int *user = device_buffer_reserve(&model->gpu_user, ints), *item = device_buffer_reserve(&model->gpu_item, ints);
        float *rating = device_buffer_reserve(&model->gpu_rating, ((size_t)batch->max_n + 1) * sizeof(float));
        if (!model->gpu_step) model->gpu_step = device_alloc(sizeof(MfStepInputs));
        if (!model->branch) {
            StepBranch *branch = model->branch = xcalloc(1, sizeof *branch);
            CHECK_CUDA(cudaStreamCreateWithFlags(&branch->stream, cudaStreamNonBlocking));
            CHECK_CUDA(cudaEventCreateWithFlags(&branch->forked, cudaEventDisableTiming));
            CHECK_CUDA(cudaEventCreateWithFlags(&branch->sorted, cudaEventDisableTiming));
            CHECK_CUDA(cudaEventCreateWithFlags(&branch->done, cudaEventDisableTiming));
        }
        // The loss goes straight to its place among those kept (a replay writes where this says),
        // where it was copied there from a slot of the step's own, a copy more on the GPU a step.
        MfStepInputs inputs = {.user = batch->gpu_user, .item = batch->gpu_item, .rating = batch->gpu_rating,
                               .minus_step_size = model->minus_step_size, .loss = loss_slot(model)};
        MfQueuedInputs *queued = model->queued_inputs;
        if (!batch->gpu_user) {  // ids on the host: to the step's buffers through page-locked memory (no wait)
            device_upload(user, batch->user, (size_t)batch->n * sizeof(int), "the batch's users");
            device_upload(item, batch->item, (size_t)batch->n * sizeof(int), "the batch's items");
            device_upload(rating, batch->rating, (size_t)batch->n * sizeof(float), "the batch's ratings");
            device_upload(model->gpu_step, &inputs, sizeof inputs, "the step's inputs");
        } else if (queued && queued->next < queued->count && same_inputs(&queued->entry[queued->next], &inputs)) {
            queued->next++;  // queued already: its first kernel takes them
        } else {
            // Places for this step's loss and its followers' first (the array may move, and this
            // one's place with it), so that none moves while they are queued.
            reserve_losses(model, model->pending - 1 + steps_to_queue(batch));
            inputs.loss = model->losses + model->pending - 1;
            queue_inputs(model, batch, &inputs);
        }
    }
#else
    (void)batch;
#endif
}

void mf_end_step(Mf *model) {
#if HAVE_CUDA
    if (on_gpu(model)) join_branch(model);  // (mf_adam_step has: a guard; the loss is in its place: mf_prepare_step)
#endif  // (a CPU rank kept its loss in mf_forward_backward)
    if (model->exchanged)  // queued by the host: what it sent
        model->step_bytes = model->bytes_sent - model->bytes_at_prepare;
    else  // replayed from a CUDA graph, no host code run: it sent what the captured step did (the bounds')
        model->bytes_sent += model->step_bytes;
    device_mark_step();  // the step is queued (the simulated GPU counts per step)
}

int mf_take_losses(Mf *model, bool due, const double **losses) {
    int n = model->pending;
    if (n == 0 || (on_gpu(model) && !due)) return 0;
    double *host = model->losses;
#if HAVE_CUDA
    if (on_gpu(model)) {  // the steps' losses since the last hand-over: one copy, one wait
        device_read_to_host(model->host_losses, model->losses, (size_t)n * sizeof(double), "the losses");
        host = model->host_losses;
    }
#endif
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, host, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));  // the global batch's
    model->pending = 0;
    *losses = host;
    return n;
}

double mf_comm_seconds(Mf *model) {
#if HAVE_CUDA
    comm_account(model, true);
#endif
    return model->comm_seconds;
}

// ------------------------------------------------------------------ predictions
void mf_predict(Mf *model, const int *user, const int *item, int n, float *out) {
    // The evaluation's lookups are no training step's: the counts stay the steps'.
    double bytes_sent = model->bytes_sent, comm_seconds = model->comm_seconds;
#if HAVE_CUDA
    if (on_gpu(model)) {
        join_branch(model);  // (a guard: a step's sorts read the ids' buffers, its loss the forward's, reused here)
        // In chunks, the same number on every rank (their lookups' exchanges are collective, and
        // padded to the chunk): the GPU's buffers stay the size of a few batches.
        enum { CHUNK = 8192 };
        int most = n;
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        int max_n = most < CHUNK ? most : CHUNK;
        if (max_n > model->forward_capacity) grow((void **)&model->forward, &model->forward_capacity, max_n, 4 * sizeof(float));
        for (int start = 0; start < most; start += CHUNK) {
            int m = n - start < 0 ? 0 : n - start > CHUNK ? CHUNK : n - start;
            size_t bytes = ((size_t)max_n + 1) * sizeof(int);
            int *device_user = device_buffer_reserve(&model->gpu_user, bytes), *device_item = device_buffer_reserve(&model->gpu_item, bytes);
            device_upload(device_user, user + start, (size_t)m * sizeof(int), "the users to predict for");
            device_upload(device_item, item + start, (size_t)m * sizeof(int), "the items to predict for");
            lookup_gpu(model, NULL, m, max_n, false);  // (the ids are in the step's buffers: just copied)
            float *forward = device_buffer_reserve(&model->gpu_forward, (4 * (size_t)max_n + 1) * sizeof(float));
            forward_gpu(model, NULL, false, m, forward);
            if (m > 0) device_read_to_host(model->forward, forward, 4 * (size_t)m * sizeof(float), "the predictions");
            for (int s = 0; s < m; s++) out[start + s] = model->forward[4 * (size_t)s];
        }
        model->bytes_sent = bytes_sent, model->comm_seconds = comm_seconds;
        return;
    }
#endif
    RatingBatch batch = {.user = user, .item = item, .n = n, .max_n = n};
    mf_lookup(model, &batch);
    model->bytes_sent = bytes_sent, model->comm_seconds = comm_seconds;
    EmbeddingTable *P = &model->user_embedding, *Q = &model->item_embedding, *BU = &model->user_bias, *BI = &model->item_bias;
    for (int s = 0; s < n; s++) {
        const float *p = P->looked_up + (size_t)P->sample_slot[s] * model->dim, *q = Q->looked_up + (size_t)Q->sample_slot[s] * model->dim;
        float dot = 0.0f;
        for (int d = 0; d < model->dim; d++) dot += p[d] * q[d];
        out[s] = dot + BU->looked_up[BU->sample_slot[s]] + BI->looked_up[BI->sample_slot[s]] + model->global_mean.data[0];
    }
}

// ------------------------------------------------------------------ whole tables
static void full_params(Mf *model) {
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        if (!model->full[t].data) model->full[t] = tensor_zeros(table->rows, table->dim, DEVICE_CPU);
        model->params[t] = (Param){.value = &model->full[t]};
        snprintf(model->params[t].name, sizeof model->params[t].name, "%s", table->name);
    }
    model->params[4] = (Param){.name = "global_mean", .value = &model->global_mean};
}

void mf_gather_full(Mf *model) {
    int rank = dist_rank(), world = dist_world_size();
    download_weights(model);
    if (rank == 0) full_params(model);
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        if (!table->sharded) {
            if (rank == 0) memcpy(model->full[t].data, table->weight, (size_t)table->rows * table->dim * sizeof(float));
            continue;
        }
        int *count = xmalloc((size_t)world * sizeof(int)), *offset = xmalloc(((size_t)world + 1) * sizeof(int));
        for (int r = 0; r < world; r++) count[r] = (table->rows - r + world - 1) / world;
        offsets(count, offset, world);
        float *gathered = rank == 0 ? xmalloc(((size_t)table->rows * table->dim + 1) * sizeof(float)) : NULL;
        MPI_Datatype row = row_type(table->dim);
        CHECK_MPI(MPI_Gatherv(table->weight, table->owned, row, gathered, count, offset, row, 0, MPI_COMM_WORLD));
        MPI_Type_free(&row);
        if (rank == 0)
            for (int r = 0; r < world; r++)
                for (int j = 0; j < count[r]; j++)
                    memcpy(model->full[t].data + ((size_t)j * world + r) * table->dim, gathered + ((size_t)offset[r] + j) * table->dim,
                           (size_t)table->dim * sizeof(float));
        free(gathered);
        free(count);
        free(offset);
    }
}

Param *mf_full_params(Mf *model) {
    full_params(model);
    return model->params;
}

void mf_scatter_full(Mf *model) {
    int rank = dist_rank(), world = dist_world_size();
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        for (int k = 0; k < table->rows; k++)
            if (!table->sharded || k % world == rank)
                memcpy(table->weight + (size_t)local_index(table, k) * table->dim, model->full[t].data + (size_t)k * table->dim,
                       (size_t)table->dim * sizeof(float));
        tensor_free(&model->full[t]);
    }
    upload_weights(model);
}
