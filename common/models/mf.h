// mf.h: step 15's model, matrix factorisation with biases, and the three ways
// its embedding tables are kept and their gradients exchanged across ranks.
//
//   rating(u, i) = global mean + user_bias[u] + item_bias[i] + user_embedding[u] . item_embedding[i]
//   loss = mean over the global batch of (rating - r)^2 + weight_decay * (|user_embedding[u]|^2 + |item_embedding[i]|^2)
//
// The PyTorch twin (tests/torch_recommender.py): four nn.Embedding(sparse=True)
// tables (user_embedding, item_embedding [rows, dim], user_bias, item_bias
// [rows, 1]), a global_mean buffer, and torch.optim.SparseAdam: a step updates
// only the rows the global batch touched (their moments too), as lazily as
// SparseAdam does, with its arithmetic. The L2 term is on the batch's rows, as
// SparseAdam has no weight decay of its own.
//
// --embeddings picks how the tables live on W ranks (DDP in all three: every
// rank trains on its share of the global batch, and the gradients of the
// whole batch are summed before the step):
//   dense   every rank holds every table; the gradient tables, whole, are
//           allreduced (and which rows were touched: a byte per row). What a
//           plain DDP port does: the bytes scale with the tables, not the batch.
//   sparse  every rank holds every table; each sends only the rows its batch
//           touched (ids and gradient rows: allgather), as DDP with
//           nn.Embedding(sparse=True) does.
//   sharded rank r holds the embedding rows with id % W == r (1/W of each
//           table, and of Adam's moments); a batch's rows are asked of their
//           owners and come back by all-to-all, and their gradients go back
//           to the owners by all-to-all (DLRM's, TorchRec's model-parallel
//           embeddings). The bias tables stay data-parallel: replicated, their
//           gradients exchanged as in sparse.
//
// The same steps in all three, on any number of ranks. Each rank first sums
// its own samples' gradients per row, in the batch's order (its samples are
// one contiguous slice of the global batch). Then the W partial sums of a row
// are added in rank order, starting from zero: sparse adds what allgather
// brought, rank 0's first; sharded, the owner adds what all-to-all brought,
// source rank 0's first; so the two give the same bits at any W. dense lets
// MPI_Allreduce add them, in MPI's order: the same bits at 1 and 2 ranks (a
// sum of two is commutative), within a rounding at 4. Across W the partial
// sums differ (more ranks, shorter slices): within 1e-7 relative per step.
//
// On a GPU rank (mf_new's device) the tables, Adam's moments, the looked-up
// rows and every gradient row live in device memory, and kernels
// (common/tensor/kernels.h) do the gathers, the forward and backward, the per-row
// sums and SparseAdam's update, in the CPU's order and arithmetic (no fused
// multiply-adds): the same bits as the CPU. The host queues a step and never
// waits for the GPU in it (docs/gpus.md): the batch's ids are on the GPU
// (rating_sampler.h), and kernels find the rows it touches and group each
// row's samples in the batch's order (gpu_sort_groups: a stable sort of the
// ids, then one group per id), which the CPU does with its slot table. How
// many rows a batch touches is data, known on the GPU only, so nothing the
// host decides may depend on it: every exchange has a fixed size, bounded by
// the batch (a rank's slice touches at most min(batch, rows) rows of a table):
// dense allreduces the gradient tables and a float per row that says whether
// it was touched; sparse all-gathers each rank's touched rows and their ids,
// padded to that bound; sharded exchanges, with each owner, a block of ids and
// then of rows and of gradients, each padded to it (grouped ncclSend/ncclRecv:
// collectives.h's group_exchange). A count travels with its ids, and the
// receiver's kernels read it. The bytes sent are then the bounds', larger than
// the CPU's (which sends what was touched) by up to the world size for
// sharded, and are counted so. The loss stays on the GPU (a double per step),
// read when the program takes it (mf_take_losses). Where ranks share a GPU,
// the rows go by MPI on host copies, as collectives.h does (those wait). dense's NCCL allreduce adds in NCCL's order:
// the same bits as MPI's at 1 and 2 ranks, within a rounding at 4.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "base/rng.h"
#include "data/rating_sampler.h"  // RatingBatch
#include "models/nn.h"

typedef enum { EMBEDDINGS_DENSE, EMBEDDINGS_SPARSE, EMBEDDINGS_SHARDED } EmbeddingsMode;

typedef struct {
    char name[32];        // the state_dict key: "user_embedding.weight"
    int rows, dim;        // of the whole table
    bool sharded;         // row k lives on rank k % W, at index k / W
    int owned;            // rows held here
    EmbeddingsMode mode;  // how its gradients travel
    float *weight, *exp_avg, *exp_avg_sq;  // [owned, dim]: the rows, Adam's moments
    // This step's rows: those the local batch uses, in order of first use.
    int *slot;            // [rows]: a row's place in `touched`, or -1
    int n_touched, capacity;
    int *touched;         // [n_touched]
    int *sample_slot;     // [batch]: the place in `touched` of each sample's row
    float *looked_up;     // [n_touched, dim]: their values
    float *grad;          // [n_touched, dim]: their gradient, summed over the local batch
    // After the exchange: the rows this rank updates, their gradient summed over the global batch.
    int *update_slot;     // [owned]: a row's place in `update`, or -1
    int n_update, update_capacity;
    int *update;          // [n_update]: local indices
    float *update_grad;   // [n_update, dim]
    // sharded: for each rank, the rows it asked of this one (local indices),
    // and which of this rank's touched rows went to which owner
    int *asked_count, *asked_offset, *asked, n_asked, asked_capacity;
    int *ask_count, *ask_offset, *ask_order;
    float *exchange;      // scratch rows for the all-to-alls
    int exchange_capacity;
    float *dense_grad;    // dense: [rows, dim]
    unsigned char *dense_touched;  // dense: [rows]
    // On a GPU rank: the tables (weight above is then the host copy that
    // mf_new, --init and --save use), and the step's rows, found on the GPU.
    float *gpu_weight, *gpu_exp_avg, *gpu_exp_avg_sq;
    float *gpu_dense_grad;          // dense: [rows, dim], then [rows] flags (1: a rank touched the row)
    struct GpuGroups *batch_rows;   // the batch's rows of this table's ids (shared with the table of the same ids)
    int bound;                      // the most rows a rank's slice touches: min(the batch's max_n, rows)
    int update_bound;               // the most rows this rank may update after the exchange
    DeviceBuffer gpu_looked_up, gpu_grad;             // [bound, dim]: sharded, the rows fetched from their owners; the gradients
    DeviceBuffer gpu_send, gpu_received;              // the exchanges' fixed blocks
    DeviceBuffer gpu_send_ids, gpu_received_ids, gpu_asked, gpu_place;  // sharded: the ids asked of each owner
    struct GpuGroups *by_owner, *updates;            // sharded: touched rows by owner; the rows to update
    DeviceBuffer gpu_update_grad;                    // [updates, dim]: their gradients, summed over the global batch
    // What SparseAdam takes on the GPU (the exchange says): the rows to update, their count, their gradients.
    const int *gpu_update_rows, *gpu_update_count;
    const float *gpu_update_grads;
} EmbeddingTable;

typedef struct {
    EmbeddingsMode mode;
    Device device;                   // where the tables live and the steps run
    int dim;
    double lr, weight_decay;
    long step;                       // Adam's step count
    float minus_step_size;           // this step's SparseAdam step size (mf_prepare_step)
    bool prepared;                   // mf_prepare_step came since the last mf_adam_step
    Tensor global_mean;              // [1, 1]: a buffer, the mean training rating
    EmbeddingTable user_embedding, item_embedding, user_bias, item_bias;
    // Communication, counted by the ring model of nccl-tests (bytes this rank
    // sends): allreduce 2(W-1)/W of the buffer, allgather (W-1)/W of what all
    // gather, all-to-all what goes to the other ranks.
    double bytes_sent, comm_seconds;
    // This step's, between mf_prepare_step and mf_end_step: bytes_sent when it began, whether its
    // exchanges were queued by the host (not replayed from a CUDA graph), and the bytes of the last
    // step that was (a replay sends the same: a GPU step's bounds do not change).
    double bytes_at_prepare, step_bytes;
    bool exchanged;
    // For h5 (--save, --init): the whole tables in state_dict order.
    Tensor full[4];
    Param params[5];
    DeviceBuffer gpu_rating, gpu_forward;  // GPU: the step's ratings; per sample prediction, error, |p|^2, |q|^2
    DeviceBuffer gpu_user, gpu_item;       // GPU: the step's ids (and a prediction's, copied from the host)
    struct MfStepInputs *gpu_step;         // GPU: where the step's batch is, its step size, where its loss goes
    // GPU: the inputs of the steps ahead, queued at once where the batch says which follow it (up
    // to 256 of an epoch's), each step's taken by its first kernel (mf_lookup); the host's copy
    // (its `next` counts the steps prepared; a step whose inputs are the next queued uploads nothing).
    struct MfQueuedInputs *gpu_queued_inputs, *queued_inputs;
    struct GpuGroups *gpu_users, *gpu_items;  // GPU: the batch's rows of each, found by gpu_sort_groups
    float *forward;                        // the host's copy of gpu_forward
    int forward_capacity;
    // Each step's loss (this rank's share), until mf_take_losses hands it over: on a GPU rank
    // in device memory (the steps since the last hand-over), on a CPU rank the one step's.
    double *losses, *host_losses;
    int pending, losses_capacity;
    struct CommTimes *comm_times;          // GPU: the exchanges' CUDA events, read once they have happened
    struct StepBranch *branch;             // GPU: the stream beside the compute stream (the sorts, the loss)
    bool branch_open;                      // forked in this step, not yet joined (mf_adam_step joins it)
    bool sorts_beside;                     // this step's sorts are on the branch: the backward waits for them
} Mf;

const char *embeddings_mode_name(EmbeddingsMode mode);
// Collective. Embeddings ~ U(-0.05, 0.05) drawn row after row over the whole
// tables (user table, then item table: each rank keeps its rows), biases 0,
// on `device` (device_from_flag's).
Mf *mf_new(EmbeddingsMode mode, Device device, int n_users, int n_items, int dim, float global_mean, double lr, double weight_decay,
           Rng *rng);
void mf_free(Mf *model);
// Bytes of the tables and Adam's moments held by this rank (and, dense, the
// whole gradient tables).
size_t mf_embedding_bytes(const Mf *model);
// The same, before mf_new: what its tables will take on this rank, added to
// `need` (memory_budget.h) so that a --dim too large is refused, not killed; on a
// GPU, with the losses of an epoch's steps, kept there until the epoch ends.
void mf_add_memory_need(MemoryNeed *need, EmbeddingsMode mode, int n_users, int n_items, int dim, int world,
                        Device device, int epoch_steps);

// One training step on this rank's slice of a global batch (rating_sampler.h's
// RatingBatch: n >= 0 samples of global_n, at most max_n, the same max_n on every
// rank; on a GPU rank its ids on the GPU, or copied there when gpu_user is NULL).
// Collective (every rank calls it).
//   mf_prepare_step: what changes from step to step, written before the step: Adam's step count
//     and step size, and on a GPU rank, in device memory, where the batch is (ids from the host:
//     copied to the step's buffers), that step size and where the step's loss share goes (the
//     next of those kept for mf_take_losses). So the four calls after it read nothing
//     that a CUDA graph would have frozen (train/step_graph.h): step 15 captures them once and
//     replays them, for global batches of the same size (with a GPU per rank, NCCL's collectives
//     inside). Where the batch is on the GPU and says which batches follow it (the sampler's:
//     RatingBatch.following), those inputs go for up to 256 of them in one copy, and each step's
//     first kernel takes its own (mf_lookup): the steps after it copy nothing, as long as they
//     are the batches said, in order, with their losses kept in the places after (no
//     mf_take_losses in between); any other step queues its own and its followers' again;
//   mf_lookup: the rows of the batch's users and items (sharded: from their owners);
//   mf_forward_backward: this rank's share of the loss sum / global_n (kept: mf_take_losses;
//     on a GPU rank summed on a stream of its own, beside the rest of the step), and each row's
//     gradient summed over the local samples;
//   mf_exchange_gradients: the global batch's gradients (dense, sparse or sharded);
//   mf_adam_step: SparseAdam on the rows the global batch touched; on a GPU rank the loss's
//     stream joins the compute stream again: the step is whole there;
//   mf_end_step: the step's loss share kept for mf_take_losses (a GPU rank's is there already);
//     the step is queued.
void mf_prepare_step(Mf *model, const RatingBatch *batch);
void mf_lookup(Mf *model, const RatingBatch *batch);
void mf_forward_backward(Mf *model, const RatingBatch *batch);
void mf_exchange_gradients(Mf *model);
void mf_adam_step(Mf *model);
void mf_end_step(Mf *model);
// The global batch's loss of each step not yet handed over, in step order at *losses (valid until
// the next step): how many. Between steps (after mf_end_step, before the next mf_prepare_step,
// which reserves the next step's place: on a GPU rank its loss is written there in the step). Collective: the ranks' shares summed (MPI_Allreduce in double). On a
// CPU rank each step's at once (`due` or not: the loss is on the host already); on a GPU rank none
// until `due` (the epoch's last step, or the run's), then all of them with one copy and one
// allreduce: the host never waits for the GPU inside a step. (The GPU's array doubles, a wait, when
// more steps than ever come between two hand-overs: in the first epoch only.)
int mf_take_losses(Mf *model, bool due, const double **losses);
// The seconds this rank spent in the exchanges, over all steps (on a GPU rank from CUDA events
// around each exchange, waited for here; a step captured into a CUDA graph, and its replays, record
// none: an event recorded in a capture marks a place in the graph, and a replay runs no host code).
double mf_comm_seconds(Mf *model);

// Predictions for n (user, item) pairs. Collective: every rank calls it, n may differ.
// (Sharded, its lookups travel too; they are not counted in bytes_sent and comm_seconds.)
void mf_predict(Mf *model, const int *user, const int *item, int n, float *out);

// The whole tables into model->full on rank 0 (sharded: gathered from their
// owners), for --save and --recommend; and back from model->full on every rank
// (--init, after h5_load_params filled it).
// mf_full_params: the whole tables (allocated on the calling rank) as Params
// in state_dict order (user_embedding, item_embedding, user_bias, item_bias
// .weight, global_mean), for h5_load_params on every rank, then mf_scatter_full.
void mf_gather_full(Mf *model);
Param *mf_full_params(Mf *model);
void mf_scatter_full(Mf *model);
