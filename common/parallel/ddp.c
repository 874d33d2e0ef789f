// ddp.c: DDP's outline: the buckets, and each step's bucket handed to its
// strategy (ddp_mpi.c for CPU gradients and a shared GPU, ddp_gpu.c for
// NCCL); the statistics are ddp_stats.c's. See ddp.h.
#include <stdlib.h>

#include "comm/collectives.h"
#include "parallel/ddp_internal.h"
#include "runtime/dist.h"

// ------------------------------------------------------------------ wrap

Ddp ddp_wrap(Param *params, int n_params, double bucket_mb) {
    return ddp_wrap_group(params, n_params, bucket_mb, group_world());
}

Ddp ddp_wrap_group(Param *params, int n_params, double bucket_mb, const Group *group) {
    Ddp ddp = {.params = params, .n_params = n_params, .group = group, .world_size = group->size, .sync = true};
    ddp.on_gpu = n_params > 0 && tensor_on_gpu(params[0].grad);
#if HAVE_CUDA
    ddp.nccl = ddp.on_gpu && group->nccl;
#endif

    // 1. Every rank starts from rank 0's weights, whatever its seed (the
    //    group's rank 0, over a group).
    for (int i = 0; i < n_params; i++) group_broadcast_tensor(group, params[i].value, 0);

    // 2. Buckets, filled in reverse parameter order: the last layer's gradients
    //    come out of backward first. A bucket closes once it holds bucket_mb.
    double cap = bucket_mb * 1024 * 1024;  // bytes (MiB, as bucket_cap_mb); a cap past any model is one bucket
    size_t cap_bytes = cap <= 0 ? 0 : cap >= 0x1p62 ? (size_t)1 << 62 : (size_t)cap;
    ddp.buckets = xcalloc((size_t)n_params, sizeof(DdpBucket));  // at most one per tensor
    ddp.bucket_of_param = xmalloc((size_t)n_params * sizeof(int));
    for (int i = n_params - 1; i >= 0; i--) {
        DdpBucket *bucket = &ddp.buckets[ddp.n_buckets];
        bucket->first_param = i;  // the lowest index so far: the range is [i, i + n_params)
        bucket->n_params++;
        bucket->count += tensor_numel(params[i].value);
        ddp.bucket_of_param[i] = ddp.n_buckets;
        if (bucket->count * sizeof(float) >= cap_bytes || i == 0) ddp.n_buckets++;
    }
    for (int b = 0; b < ddp.n_buckets; b++) {
        DdpBucket *bucket = &ddp.buckets[b];
        bucket->pending = bucket->n_params;
        if (!ddp.nccl) bucket->buffer = device_host_alloc(bucket->count * sizeof(float));  // MPI's copy
    }
    if (ddp.on_gpu) ddp.gpu = ddp_gpu_new(&ddp);  // each bucket's device buffer and events

    // 3. The communication thread, if MPI lets two threads call it (NCCL
    //    needs none: the GPU runs its streams side by side).
    ddp.use_thread = group->size > 1 && dist_thread_multiple() && !ddp.nccl;
    if (group->size > 1 && !ddp.nccl && !dist_thread_multiple())
        print0("ddp: this MPI has no MPI_THREAD_MULTIPLE: buckets progress between layers only\n");
    return ddp;
}

// ------------------------------------------------------------------ backward and finish

void ddp_grad_ready(void *context, int index) {
    Ddp *ddp = context;
    if (!ddp->sync || ddp->world_size == 1) return;
    int b = ddp->bucket_of_param[index];
    if (--ddp->buckets[b].pending > 0) return;

    // All of the bucket's gradients exist: pack them and send the bucket off.
    if (ddp->nccl) ddp_nccl_bucket_ready(ddp, b);  // 3. queued on the GPU's communication stream
    else ddp_mpi_bucket_ready(ddp, b);             // 1., 2. (and 4. through host copies)
}

void ddp_finish(Ddp *ddp) {
    if (!ddp->sync || ddp->world_size == 1) return;
    if (ddp->nccl) ddp_nccl_finish(ddp);  // the compute stream waits; the host does not
    else ddp_mpi_finish(ddp);             // the host waits for every bucket
    ddp->steps++;
}

void ddp_set_sync(Ddp *ddp, bool sync) { ddp->sync = sync; }

void ddp_free(Ddp *ddp) {
    ddp_mpi_stop_thread(ddp);
    if (ddp->gpu) ddp_gpu_free(ddp);
    for (int b = 0; b < ddp->n_buckets; b++) device_host_free(ddp->buckets[b].buffer);
    free(ddp->buckets);
    free(ddp->bucket_of_param);
    *ddp = (Ddp){0};
}

// ------------------------------------------------------------------ reports (ddp_stats.c)

void ddp_describe_overlap(Ddp *ddp, char *out, size_t size) {
    if (ddp->nccl) ddp_nccl_account_step(ddp);  // the last step's GPU events, once they have happened
    ddp_describe_totals(ddp, out, size);
}
