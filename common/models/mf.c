// mf.c: matrix factorisation with biases; dense, sparse and sharded embedding tables. See mf.h.
#include "models/mf.h"

#include <math.h>
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

#if HAVE_CUDA
// ------------------------------------------------------------------ GPU memory
// Room for n rows of dim floats in b (one more: n may be 0).
static float *device_rows(DeviceBuffer *b, size_t n, int dim) {
    return device_buffer_reserve(b, (n + 1) * (size_t)dim * sizeof(float));
}

// n ints from the host into b; returns their device copy. The host array may
// be reused on return (the wait is polled, as every wait here).
static int *upload_ints(DeviceBuffer *b, const int *host, int n, const char *what) {
    int *device_ints = device_buffer_reserve(b, ((size_t)n + 1) * sizeof(int));
    if (n > 0) {
        CHECK_CUDA(cudaMemcpyAsync(device_ints, host, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, device_stream()));
        device_wait_stream(device_stream(), what);
    }
    return device_ints;
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
            size_t table_bytes = k < 3 ? bytes : mode == EMBEDDINGS_DENSE ? ((size_t)rows * dim + 1) * sizeof(float) : 0;
            if (!table_bytes) continue;
            *tables[k] = device_alloc(table_bytes);
            CHECK_CUDA(cudaMemsetAsync(*tables[k], 0, table_bytes, device_stream()));
        }
    }
#endif
}

static void table_free(EmbeddingTable *t) {
    void *buffers[] = {t->weight, t->exp_avg, t->exp_avg_sq, t->slot, t->touched, t->sample_slot, t->looked_up, t->grad,
                       t->update_slot, t->update, t->update_grad, t->asked_count, t->asked_offset, t->asked,
                       t->ask_count, t->ask_offset, t->ask_order, t->exchange, t->dense_grad, t->dense_touched};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++) free(buffers[k]);
#if HAVE_CUDA
    float *tables[4] = {t->gpu_weight, t->gpu_exp_avg, t->gpu_exp_avg_sq, t->gpu_dense_grad};
    for (int k = 0; k < 4; k++) device_free(tables[k]);
    DeviceBuffer *device_buffers[] = {&t->gpu_looked_up, &t->gpu_grad, &t->gpu_update_grad, &t->gpu_exchange,
                                      &t->gpu_touched, &t->gpu_sample_slot, &t->gpu_ask_order, &t->gpu_asked,
                                      &t->gpu_sample_start, &t->gpu_sample, &t->gpu_update, &t->gpu_update_start,
                                      &t->gpu_update_source};
    for (size_t k = 0; k < sizeof device_buffers / sizeof device_buffers[0]; k++) device_buffer_free(device_buffers[k]);
#endif
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
#endif
    free(model->forward);
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

void mf_add_memory_need(MemoryNeed *need, EmbeddingsMode mode, int n_users, int n_items, int dim, int world) {
    bool sharded = mode == EMBEDDINGS_SHARDED, dense = mode == EMBEDDINGS_DENSE;
    double users = n_users, items = n_items;
    double owned_users = sharded ? ceil(users / world) : users, owned_items = sharded ? ceil(items / world) : items;
    memory_need_add(need, "embeddings and Adam's moments",
                    table_bytes(users, owned_users, dim, dense) + table_bytes(items, owned_items, dim, dense) +
                    table_bytes(users, users, 1, dense) + table_bytes(items, items, 1, dense));
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
#if HAVE_CUDA
    if (on_gpu(model)) {  // the owners gather the rows asked, which travel by NCCL, and land in place
        float *reply = device_rows(&t->gpu_exchange, 2 * (size_t)rows_needed, dim);
        float *received = reply + (size_t)rows_needed * dim;
        int *asked = upload_ints(&t->gpu_asked, t->asked, t->n_asked, "the rows asked of this rank");
        gpu_gather_rows(t->gpu_weight, asked, t->n_asked, dim, reply, device_stream());
        device_wait_stream(device_stream(), "the rows asked of this rank");
        start = wall_seconds();
        gpu_rows_all_to_all(reply, t->asked_count, t->asked_offset, received, t->ask_count, t->ask_offset, dim);
        device_wait_stream(device_stream(), "the embedding rows of the batch (all-to-all)");
        model->comm_seconds += wall_seconds() - start;
        int *order = upload_ints(&t->gpu_ask_order, t->ask_order, t->n_touched, "the rows' order");
        gpu_scatter_rows(received, order, t->n_touched, dim, device_rows(&t->gpu_looked_up, t->n_touched, dim),
                         device_stream());
        return;
    }
#endif
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
#if HAVE_CUDA
    if (on_gpu(model)) {
        upload_ints(&t->gpu_sample_slot, t->sample_slot, n, "the batch's rows");
        if (t->sharded) {
            table_fetch_sharded(model, t);
            return;
        }
        int *touched = upload_ints(&t->gpu_touched, t->touched, t->n_touched, "the batch's rows");
        gpu_gather_rows(t->gpu_weight, touched, t->n_touched, t->dim,
                        device_rows(&t->gpu_looked_up, t->n_touched, t->dim), device_stream());
        return;
    }
#endif
    if (t->sharded) {
        table_fetch_sharded(model, t);
        return;
    }
    for (int j = 0; j < t->n_touched; j++)
        memcpy(t->looked_up + (size_t)j * t->dim, t->weight + (size_t)t->touched[j] * t->dim, (size_t)t->dim * sizeof(float));
}

void mf_lookup(Mf *model, const int *user, const int *item, int n) {
    table_lookup(model, &model->user_embedding, user, n);
    table_lookup(model, &model->item_embedding, item, n);
    table_lookup(model, &model->user_bias, user, n);
    table_lookup(model, &model->item_bias, item, n);
}

// ------------------------------------------------------------------ forward and backward
#if HAVE_CUDA
// Groups `n` items by their slot (< n_slots), keeping their order within a
// slot (a counting sort): slot j's items are item[start[j] .. start[j + 1]),
// and item k is source[k] (or k when source is NULL). Both to the GPU.
static void upload_grouped(DeviceBuffer *start_buffer, DeviceBuffer *item_buffer, const int *slot, const int *source, int n,
                           int n_slots, const char *what) {
    int *start = xcalloc((size_t)n_slots + 2, sizeof(int)), *item = xmalloc(((size_t)n + 1) * sizeof(int));
    for (int k = 0; k < n; k++) start[slot[k] + 1]++;
    for (int j = 0; j < n_slots; j++) start[j + 1] += start[j];
    int *fill = xmalloc(((size_t)n_slots + 1) * sizeof(int));
    memcpy(fill, start, ((size_t)n_slots + 1) * sizeof(int));
    for (int k = 0; k < n; k++) item[fill[slot[k]]++] = source ? source[k] : k;
    upload_ints(start_buffer, start, n_slots + 1, what);
    upload_ints(item_buffer, item, n, what);
    free(start);
    free(item);
    free(fill);
}

// The forward and backward on the GPU: a thread per sample for the
// predictions and errors, then, per table, a thread per gradient element
// that sums its row's samples in the batch's order. The host reads the
// per-sample errors and norms and sums the loss in double, as the CPU does.
static void forward_backward_gpu(Mf *model, const float *rating, int n, float scale, float decay) {
    EmbeddingTable *P = &model->user_embedding, *Q = &model->item_embedding, *BU = &model->user_bias, *BI = &model->item_bias;
    int dim = model->dim;
    float *device_rating = device_buffer_reserve(&model->gpu_rating, ((size_t)n + 1) * sizeof(float));
    upload_floats(device_rating, rating, (size_t)n, "the batch's ratings");
    float *forward = device_buffer_reserve(&model->gpu_forward, (4 * (size_t)n + 1) * sizeof(float));
    gpu_mf_forward(P->gpu_looked_up.data, P->gpu_sample_slot.data, Q->gpu_looked_up.data, Q->gpu_sample_slot.data,
                   BU->gpu_looked_up.data, BU->gpu_sample_slot.data, BI->gpu_looked_up.data, BI->gpu_sample_slot.data,
                   device_rating, n, dim, model->global_mean.data[0], forward, device_stream());
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t), *other = t == 0 ? Q : t == 1 ? P : NULL;
        upload_grouped(&table->gpu_sample_start, &table->gpu_sample, table->sample_slot, NULL, n, table->n_touched,
                       "the batch's samples per row");
        float *grad = device_rows(&table->gpu_grad, table->n_touched, table->dim);
        gpu_embedding_backward(forward, scale, table->gpu_sample_start.data, table->gpu_sample.data, table->n_touched,
                               table->dim, other ? table->gpu_looked_up.data : NULL, other ? other->gpu_looked_up.data : NULL,
                               other ? other->gpu_sample_slot.data : NULL, decay, grad, device_stream());
    }
    if (n > model->forward_capacity) grow((void **)&model->forward, &model->forward_capacity, n, 4 * sizeof(float));
    if (n > 0) device_read_to_host(model->forward, forward, 4 * (size_t)n * sizeof(float), "the loss");
}
#endif

double mf_forward_backward(Mf *model, const float *rating, int n, long global_n, double *mse_sum) {
    EmbeddingTable *P = &model->user_embedding, *Q = &model->item_embedding, *BU = &model->user_bias, *BI = &model->item_bias;
    int dim = model->dim;
#if HAVE_CUDA
    if (on_gpu(model)) {
        float wd = (float)model->weight_decay;
        forward_backward_gpu(model, rating, n, 2.0f / (float)global_n, 2.0f * wd / (float)global_n);
        double loss_sum = 0.0, squared_sum = 0.0;
        for (int s = 0; s < n; s++) {
            const float *f = model->forward + 4 * (size_t)s;  // prediction, error, |p|^2, |q|^2
            squared_sum += (double)f[1] * f[1];
            loss_sum += (double)f[1] * f[1] + (double)wd * ((double)f[2] + f[3]);
        }
        *mse_sum = squared_sum;
        return loss_sum / (double)global_n;
    }
#endif
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        memset(table->grad, 0, (size_t)table->n_touched * table->dim * sizeof(float));
    }
    float mean = model->global_mean.data[0];
    float wd = (float)model->weight_decay, scale = 2.0f / (float)global_n, decay = 2.0f * wd / (float)global_n;
    double loss_sum = 0.0, squared_sum = 0.0;
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
        squared_sum += (double)error * error;
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
    *mse_sum = squared_sum;
    return loss_sum / (double)global_n;
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
// ------------------------------------------------------------------ the exchanges on GPUs
// The rows this rank updates, from n incoming gradient rows (rows[source[k]],
// or rows[k], for local row local[k]), in order of first appearance as
// update_row's; each update row is the sum of its incoming rows in order k,
// starting from zero, as add_row's: on the GPU (gpu_update_grad).
static void sum_into_updates(EmbeddingTable *t, const int *local, const int *source, int n, const float *rows) {
    update_begin(t);
    int *slot = xmalloc(((size_t)n + 1) * sizeof(int));
    for (int k = 0; k < n; k++) {
        if (t->update_slot[local[k]] < 0) {
            grow((void **)&t->update, &t->update_capacity, t->n_update + 1, sizeof(int));
            t->update_slot[local[k]] = t->n_update;
            t->update[t->n_update++] = local[k];
        }
        slot[k] = t->update_slot[local[k]];
    }
    upload_grouped(&t->gpu_update_start, &t->gpu_update_source, slot, source, n, t->n_update, "the rows to update");
    upload_ints(&t->gpu_update, t->update, t->n_update, "the rows to update");
    gpu_sum_rows(rows, t->gpu_update_start.data, t->gpu_update_source.data, t->n_update, t->dim,
                 device_rows(&t->gpu_update_grad, t->n_update, t->dim), device_stream());
    free(slot);
}

// dense: the gradient table (zeros but the touched rows) allreduced by NCCL;
// which rows any rank touched, a byte per row, by MPI on the host.
static void exchange_dense_gpu(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), dim = t->dim;
    gpu_scatter_rows(t->gpu_grad.data, t->gpu_touched.data, t->n_touched, dim, t->gpu_dense_grad, device_stream());
    for (int j = 0; j < t->n_touched; j++) t->dense_touched[t->touched[j]] = 1;
    device_wait_stream(device_stream(), "the gradients");
    double start = wall_seconds();
    Tensor table = {.data = t->gpu_dense_grad, .rows = t->rows, .cols = dim, .device = DEVICE_CUDA};
    group_all_reduce(group_world(), &table);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, t->dense_touched, t->rows, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD));
    device_wait_stream(device_stream(), "the gradient tables' allreduce");
    model->comm_seconds += wall_seconds() - start;
    model->bytes_sent += 2.0 * (world - 1) / world * ((double)t->rows * dim * sizeof(float) + t->rows);
    update_begin(t);
    for (int row = 0; row < t->rows; row++) {
        if (!t->dense_touched[row]) continue;
        grow((void **)&t->update, &t->update_capacity, t->n_update + 1, sizeof(int));
        t->update_slot[row] = t->n_update;
        t->update[t->n_update++] = row;
        t->dense_touched[row] = 0;
    }
    int *update = upload_ints(&t->gpu_update, t->update, t->n_update, "the rows to update");
    gpu_gather_rows(t->gpu_dense_grad, update, t->n_update, dim,
                    device_rows(&t->gpu_update_grad, t->n_update, dim), device_stream());
    gpu_fill(t->gpu_dense_grad, (size_t)t->rows * dim, 0.0f, device_stream());
}

// sparse: ids by MPI on the host; the gradient rows by NCCL's all-gather,
// each rank's block padded to the most rows any rank touched.
static void exchange_sparse_gpu(Mf *model, EmbeddingTable *t) {
    int world = dist_world_size(), rank = dist_rank(), dim = t->dim;
    int *count = xmalloc((size_t)world * sizeof(int)), *offset = xmalloc(((size_t)world + 1) * sizeof(int));
    device_wait_stream(device_stream(), "the gradients");
    double start = wall_seconds();
    CHECK_MPI(MPI_Allgather(&t->n_touched, 1, MPI_INT, count, 1, MPI_INT, MPI_COMM_WORLD));
    offsets(count, offset, world);
    int total = offset[world], most = 0;
    for (int r = 0; r < world; r++) most = count[r] > most ? count[r] : most;
    int *ids = xmalloc(((size_t)total + 1) * sizeof(int)), *source = xmalloc(((size_t)total + 1) * sizeof(int));
    CHECK_MPI(MPI_Allgatherv(t->touched, t->n_touched, MPI_INT, ids, count, offset, MPI_INT, MPI_COMM_WORLD));
    float *gathered = t->gpu_grad.data;
    if (world > 1 && most > 0) {
        gathered = device_rows(&t->gpu_exchange, (size_t)world * most, dim);
        Tensor mine = {.data = gathered + (size_t)rank * most * dim, .rows = most, .cols = dim, .device = DEVICE_CUDA};
        Tensor all = {.data = gathered, .rows = world * most, .cols = dim, .device = DEVICE_CUDA};
        if (t->n_touched > 0)
            CHECK_CUDA(cudaMemcpyAsync(mine.data, t->gpu_grad.data, (size_t)t->n_touched * dim * sizeof(float),
                                       cudaMemcpyDeviceToDevice, device_stream()));
        group_all_gather(group_world(), &mine, &all);
        device_wait_stream(device_stream(), "the gradient rows' all-gather");
    }
    model->comm_seconds += wall_seconds() - start;
    model->bytes_sent += (double)(world - 1) / world *
                         ((double)world * most * dim * sizeof(float) + (double)total * sizeof(int) + world * sizeof(int));
    for (int r = 0; r < world; r++)
        for (int i = 0; i < count[r]; i++) source[offset[r] + i] = (world > 1 ? r * most : 0) + i;
    sum_into_updates(t, ids, source, total, gathered);
    free(ids);
    free(source);
    free(count);
    free(offset);
}

// sharded: each touched row's gradient to its owner (grouped ncclSend/ncclRecv,
// in the order the owner was asked for the rows), who adds them in rank order.
static void exchange_sharded_gpu(Mf *model, EmbeddingTable *t) {
    int rank = dist_rank(), dim = t->dim;
    int rows_needed = t->n_asked > t->n_touched ? t->n_asked : t->n_touched;
    float *send = device_rows(&t->gpu_exchange, 2 * (size_t)rows_needed, dim);
    float *received = send + (size_t)rows_needed * dim;
    gpu_gather_rows(t->gpu_grad.data, t->gpu_ask_order.data, t->n_touched, dim, send, device_stream());
    device_wait_stream(device_stream(), "the gradients");
    double start = wall_seconds();
    gpu_rows_all_to_all(send, t->ask_count, t->ask_offset, received, t->asked_count, t->asked_offset, dim);
    device_wait_stream(device_stream(), "the gradient rows' all-to-all");
    model->comm_seconds += wall_seconds() - start;
    model->bytes_sent += (double)(t->n_touched - t->ask_count[rank]) * dim * sizeof(float);
    sum_into_updates(t, t->asked, NULL, t->n_asked, received);
}
#endif

void mf_exchange_gradients(Mf *model) {
#if HAVE_CUDA
    if (on_gpu(model)) {
        for (int t = 0; t < 4; t++) {
            EmbeddingTable *table = table_of(model, t);
            if (table->sharded) exchange_sharded_gpu(model, table);
            else if (table->mode == EMBEDDINGS_DENSE) exchange_dense_gpu(model, table);
            else exchange_sparse_gpu(model, table);
        }
        return;
    }
#endif
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        if (table->sharded) exchange_sharded(model, table);
        else if (table->mode == EMBEDDINGS_DENSE) exchange_dense(model, table);
        else exchange_sparse(model, table);
    }
}

// ------------------------------------------------------------------ SparseAdam
// torch.optim.SparseAdam's arithmetic, on the rows the global batch touched:
// m += (g - m)(1 - beta1); v += (g^2 - v)(1 - beta2);
// w -= lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps).
void mf_adam_step(Mf *model) {
    model->step++;
    const double beta1 = 0.9, beta2 = 0.999;
    double bias_correction1 = 1.0 - pow(beta1, (double)model->step), bias_correction2 = 1.0 - pow(beta2, (double)model->step);
    float minus_step_size = (float)(-(model->lr * sqrt(bias_correction2) / bias_correction1));
    float one_minus_beta1 = (float)(1.0 - beta1), one_minus_beta2 = (float)(1.0 - beta2), eps = 1e-8f;
    for (int t = 0; t < 4; t++) {
        EmbeddingTable *table = table_of(model, t);
        int dim = table->dim;
#if HAVE_CUDA
        if (on_gpu(model)) {
            gpu_sparse_adam(table->gpu_weight, table->gpu_exp_avg, table->gpu_exp_avg_sq, table->gpu_update.data,
                            table->gpu_update_grad.data, table->n_update, dim, minus_step_size, one_minus_beta1,
                            one_minus_beta2, eps, device_stream());
            continue;
        }
#endif
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
    device_mark_step();  // the step is queued (the simulated GPU counts per step)
}

// ------------------------------------------------------------------ predictions
void mf_predict(Mf *model, const int *user, const int *item, int n, float *out) {
    // The evaluation's lookups are no training step's: the counts stay the steps'.
    double bytes_sent = model->bytes_sent, comm_seconds = model->comm_seconds;
    mf_lookup(model, user, item, n);
    model->bytes_sent = bytes_sent, model->comm_seconds = comm_seconds;
#if HAVE_CUDA
    if (on_gpu(model)) {
        EmbeddingTable *P = &model->user_embedding, *Q = &model->item_embedding, *BU = &model->user_bias, *BI = &model->item_bias;
        float *forward = device_buffer_reserve(&model->gpu_forward, (4 * (size_t)n + 1) * sizeof(float));
        gpu_mf_forward(P->gpu_looked_up.data, P->gpu_sample_slot.data, Q->gpu_looked_up.data, Q->gpu_sample_slot.data,
                       BU->gpu_looked_up.data, BU->gpu_sample_slot.data, BI->gpu_looked_up.data, BI->gpu_sample_slot.data,
                       NULL, n, model->dim, model->global_mean.data[0], forward, device_stream());
        if (n > model->forward_capacity) grow((void **)&model->forward, &model->forward_capacity, n, 4 * sizeof(float));
        if (n > 0) device_read_to_host(model->forward, forward, 4 * (size_t)n * sizeof(float), "the predictions");
        for (int s = 0; s < n; s++) out[s] = model->forward[4 * (size_t)s];
        return;
    }
#endif
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
