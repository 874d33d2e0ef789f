// ddp.c: buckets, overlapped allreduce, no_sync. See ddp.h.
#include "ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "check.h"
#include "collectives.h"
#include "dist.h"
#include "timer.h"
#if HAVE_CUDA
#include "kernels.h"
#endif

// ------------------------------------------------------------------ GPU gradients: a bucket's device side

#if HAVE_CUDA
// The bucket's flat copy on the GPU and the events that order and time it.
static void gpu_bucket_new(DdpBucket *bucket) {
    bucket->device_buffer = device_alloc(bucket->count * sizeof(float));
    CHECK_CUDA(cudaEventCreateWithFlags(&bucket->packed, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreate(&bucket->comm_start));
    CHECK_CUDA(cudaEventCreate(&bucket->comm_done));
}
// NCCL's statistics come from the GPU's timeline: a step's first and last marks.
static void nccl_timing_new(Ddp *ddp) {
    CHECK_CUDA(cudaEventCreate(&ddp->step_start));
    CHECK_CUDA(cudaEventCreate(&ddp->backward_end));
}
#else
static void gpu_bucket_new(DdpBucket *bucket) { (void)bucket; }  // never called: no tensor is on a GPU
static void nccl_timing_new(Ddp *ddp) { (void)ddp; }
#endif

// ------------------------------------------------------------------ wrap

Ddp ddp_wrap(Param *params, int n_params, double bucket_mb) {
    Ddp ddp = {.params = params, .n_params = n_params, .world_size = dist_world_size(), .sync = true};
    ddp.on_gpu = n_params > 0 && tensor_on_gpu(params[0].grad);
    ddp.nccl = ddp.on_gpu && device_nccl();

    // 1. Every rank starts from rank 0's weights, whatever its seed.
    for (int i = 0; i < n_params; i++) dist_broadcast_tensor(params[i].value, 0);

    // 2. Buckets, filled in reverse parameter order: the last layer's gradients
    //    come out of backward first. A bucket closes once it holds bucket_mb.
    double cap = bucket_mb * 1024 * 1024;  // bytes; a cap past any model is one bucket
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
        if (ddp.on_gpu) gpu_bucket_new(bucket);
    }
    if (ddp.nccl) nccl_timing_new(&ddp);

    // 3. The communication thread, if MPI lets two threads call it (NCCL
    //    needs none: the GPU runs its streams side by side).
    ddp.use_thread = dist_world_size() > 1 && dist_thread_multiple() && !ddp.nccl;
    if (dist_world_size() > 1 && !ddp.nccl && !dist_thread_multiple())
        print0("ddp: this MPI has no MPI_THREAD_MULTIPLE: buckets progress between layers only\n");
    return ddp;
}

// ------------------------------------------------------------------ the buckets' MPI calls

static void start_bucket(DdpBucket *bucket, int thread) {
#if HAVE_CUDA
    // GPU gradients: wait for the compute stream's copy to the host buffer.
    if (bucket->device_buffer) device_wait_event(bucket->packed);
#endif
    bucket->range = profile_range_start("allreduce", thread);
    bucket->start_time = wall_seconds();
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, bucket->buffer, (int)bucket->count, MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD, &bucket->request));
    bucket->started = true;
}

// MPI_Test drives the collective forward; returns true when it has completed.
static bool test_bucket(DdpBucket *bucket) {
    int done = 0;
    CHECK_MPI(MPI_Test(&bucket->request, &done, MPI_STATUS_IGNORE));
    if (done) {
        bucket->completed = true;
        bucket->done_time = wall_seconds();
        profile_range_end(&bucket->range);
    }
    return done;
}

// The communication thread: start each bucket the main thread hands over, in
// order (every rank must start the same collectives in the same order), and
// test the running ones until they complete. It sleeps on the condition
// variable when there is nothing to do, and naps briefly between tests so that
// it does not take a core away from backward's GEMMs; once the main thread
// waits in ddp_finish, there is nothing left to protect and it tests without
// pause. The counters live in the Ddp, under its lock, so that ddp_finish can
// reset them for the next step.
static void *communication_thread(void *arg) {
    Ddp *ddp = arg;
    prctl(PR_SET_TIMERSLACK, 1UL);  // a 20 us nap, not the default 50 us of slack on top
    device_bind_thread();           // it waits on CUDA events of our GPU
    pthread_mutex_lock(&ddp->lock);
    for (;;) {
        while (!ddp->stopping && ddp->n_started == ddp->n_ready && ddp->n_done == ddp->n_started)
            pthread_cond_wait(&ddp->changed, &ddp->lock);
        if (ddp->stopping) break;
        int first = ddp->n_started, ready = ddp->n_ready;
        ddp->n_started = ready;
        pthread_mutex_unlock(&ddp->lock);

        for (int b = first; b < ready; b++) start_bucket(&ddp->buckets[b], PROFILE_COMM_THREAD);
        int newly_done = 0;
        for (int b = 0; b < ready; b++)
            if (!ddp->buckets[b].completed && test_bucket(&ddp->buckets[b])) newly_done++;

        pthread_mutex_lock(&ddp->lock);
        if (newly_done) {
            ddp->n_done += newly_done;
            pthread_cond_broadcast(&ddp->changed);
        }
        if (ddp->n_done < ddp->n_started && !ddp->finishing) {  // still running: test again soon
            pthread_mutex_unlock(&ddp->lock);
            nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
            pthread_mutex_lock(&ddp->lock);
        }
    }
    pthread_mutex_unlock(&ddp->lock);
    return NULL;
}

static void ensure_thread(Ddp *ddp) {
    if (!ddp->use_thread || ddp->thread) return;
    pthread_mutex_init(&ddp->lock, NULL);
    pthread_cond_init(&ddp->changed, NULL);
    CHECK(pthread_create(&ddp->thread, NULL, communication_thread, ddp) == 0, "cannot start the DDP thread");
}

// ------------------------------------------------------------------ backward and finish

// Copy the bucket's gradients into one flat buffer: `buffer` on the CPU; on a
// GPU, `device_buffer`, and from there to `buffer` when MPI is to reduce it.
static void pack_bucket(Ddp *ddp, DdpBucket *bucket) {
    if (!ddp->on_gpu) {
        float *out = bucket->buffer;
        for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
            size_t n = tensor_numel(ddp->params[i].grad);
            memcpy(out, ddp->params[i].grad->data, n * sizeof(float));
            out += n;
        }
        return;
    }
#if HAVE_CUDA
    cudaStream_t stream = device_stream();
    float *out = bucket->device_buffer;
    for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
        size_t n = tensor_numel(ddp->params[i].grad);
        CHECK_CUDA(cudaMemcpyAsync(out, ddp->params[i].grad->data, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                   stream));
        out += n;
    }
    if (!ddp->nccl)
        CHECK_CUDA(cudaMemcpyAsync(bucket->buffer, bucket->device_buffer, bucket->count * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaEventRecord(bucket->packed, stream));
#endif
}

// The reduced sums, divided by W, back into the gradients: the gradient of the
// global batch. (`grad / W`, a division, as PyTorch's DDP divides.)
static void unpack_bucket(Ddp *ddp, DdpBucket *bucket) {
    float divisor = (float)ddp->world_size;
    if (!ddp->on_gpu) {
        const float *in = bucket->buffer;
        for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
            float *grad = ddp->params[i].grad->data;
            size_t n = tensor_numel(ddp->params[i].grad);
#pragma omp parallel for
            for (size_t k = 0; k < n; k++) grad[k] = in[k] / divisor;
            in += n;
        }
        return;
    }
#if HAVE_CUDA
    cudaStream_t stream = device_stream();
    if (ddp->nccl) CHECK_CUDA(cudaStreamWaitEvent(stream, bucket->comm_done, 0));
    else CHECK_CUDA(cudaMemcpyAsync(bucket->device_buffer, bucket->buffer, bucket->count * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
    const float *in = bucket->device_buffer;
    for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
        size_t n = tensor_numel(ddp->params[i].grad);
        gpu_divide(ddp->params[i].grad->data, in, n, divisor, stream);
        in += n;
    }
#endif
}

// Communication time: the union of the buckets' [start, done] intervals
// (started in order, so a running maximum merges them). The part of it before
// backward ended ran while backward computed: hidden. Called for each bucket
// of a step, in order, from *covered_until = 0.
static void account_bucket(Ddp *ddp, double start, double done, double backward_end, double *covered_until) {
    double from = start > *covered_until ? start : *covered_until;
    if (done > from) {
        double hidden_until = done < backward_end ? done : backward_end;
        ddp->comm_seconds += done - from;
        ddp->hidden_seconds += hidden_until > from ? hidden_until - from : 0;
        *covered_until = done;
    }
}

#if HAVE_CUDA
// NCCL's statistics, read off the GPU's timeline once a step's events have
// happened, with the end of backward on the compute stream as the boundary
// of "hidden". Times are seconds since the step's first bucket was packed.
static void account_nccl_step(Ddp *ddp) {
    if (!ddp->timing_pending) return;
    ddp->timing_pending = false;
    float backward_end_ms = 0, from_ms = 0, to_ms = 0;
    device_wait_event(ddp->backward_end);
    CHECK_CUDA(cudaEventElapsedTime(&backward_end_ms, ddp->step_start, ddp->backward_end));
    double covered_until = 0, last_done = 0, backward_end = 1e-3 * backward_end_ms;
    for (int b = 0; b < ddp->n_buckets; b++) {
        device_wait_event(ddp->buckets[b].comm_done);
        CHECK_CUDA(cudaEventElapsedTime(&from_ms, ddp->step_start, ddp->buckets[b].comm_start));
        CHECK_CUDA(cudaEventElapsedTime(&to_ms, ddp->step_start, ddp->buckets[b].comm_done));
        account_bucket(ddp, 1e-3 * from_ms, 1e-3 * to_ms, backward_end, &covered_until);
        last_done = 1e-3 * to_ms > last_done ? 1e-3 * to_ms : last_done;
    }
    ddp->wait_seconds += last_done > backward_end ? last_done - backward_end : 0;  // the compute stream's wait
}

// Queue the bucket's allreduce on the communication stream, behind its packing.
static void start_bucket_nccl(DdpBucket *bucket) {
    cudaStream_t comm = device_comm_stream();
    CHECK_CUDA(cudaStreamWaitEvent(comm, bucket->packed, 0));
    CHECK_CUDA(cudaEventRecord(bucket->comm_start, comm));
    CHECK_NCCL(ncclAllReduce(bucket->device_buffer, bucket->device_buffer, bucket->count, ncclFloat, ncclSum,
                             device_nccl_comm(), comm));
    CHECK_CUDA(cudaEventRecord(bucket->comm_done, comm));
}
#endif

void ddp_grad_ready(void *context, int index) {
    Ddp *ddp = context;
    if (!ddp->sync || ddp->world_size == 1) return;
    int b = ddp->bucket_of_param[index];
    DdpBucket *bucket = &ddp->buckets[b];
    if (--bucket->pending > 0) return;

    // All of the bucket's gradients exist: pack them and send the bucket off.
#if HAVE_CUDA
    if (ddp->nccl) {
        if (b == 0) {  // the step's first bucket: account for the last step, then mark this one's start
            account_nccl_step(ddp);
            CHECK_CUDA(cudaEventRecord(ddp->step_start, device_stream()));
        }
        pack_bucket(ddp, bucket);
        start_bucket_nccl(bucket);
        return;
    }
#endif
    pack_bucket(ddp, bucket);
    if (ddp->use_thread) {
        ensure_thread(ddp);
        pthread_mutex_lock(&ddp->lock);
        CHECK(b == ddp->n_ready, "DDP bucket %d ready out of order (expected %d)", b, ddp->n_ready);
        ddp->n_ready++;
        pthread_cond_broadcast(&ddp->changed);
        pthread_mutex_unlock(&ddp->lock);
    } else {
        start_bucket(bucket, PROFILE_MAIN_THREAD);
        for (int k = 0; k <= b; k++)
            if (!ddp->buckets[k].completed) test_bucket(&ddp->buckets[k]);
    }
}

void ddp_finish(Ddp *ddp) {
    if (!ddp->sync || ddp->world_size == 1) return;
#if HAVE_CUDA
    if (ddp->nccl) {  // nothing to wait for on the host: the compute stream waits for each bucket
        CHECK_CUDA(cudaEventRecord(ddp->backward_end, device_stream()));
        for (int b = 0; b < ddp->n_buckets; b++) {
            CHECK(ddp->buckets[b].pending == 0, "ddp_finish: backward did not produce bucket %d", b);
            unpack_bucket(ddp, &ddp->buckets[b]);
            ddp->buckets[b].pending = ddp->buckets[b].n_params;
        }
        ddp->timing_pending = true;
        ddp->steps++;
        return;
    }
#endif
    profile_push("allreduce wait");
    double wait_start = wall_seconds();
    if (ddp->use_thread) {
        pthread_mutex_lock(&ddp->lock);
        CHECK(ddp->n_ready == ddp->n_buckets, "ddp_finish: backward produced %d of %d buckets", ddp->n_ready,
              ddp->n_buckets);
        ddp->finishing = true;
        while (ddp->n_done < ddp->n_buckets) pthread_cond_wait(&ddp->changed, &ddp->lock);
        ddp->finishing = false;
        ddp->n_ready = ddp->n_started = ddp->n_done = 0;  // the thread waits now: reset for the next step
        pthread_mutex_unlock(&ddp->lock);
    } else {
        for (int b = 0; b < ddp->n_buckets; b++)
            while (!ddp->buckets[b].completed) test_bucket(&ddp->buckets[b]);
    }
    double wait_end = wall_seconds();

    // Backward was over when ddp_finish was entered.
    double covered_until = 0;
    for (int b = 0; b < ddp->n_buckets; b++) {
        DdpBucket *bucket = &ddp->buckets[b];
        account_bucket(ddp, bucket->start_time, bucket->done_time, wait_start, &covered_until);
        unpack_bucket(ddp, bucket);
        bucket->pending = bucket->n_params;
        bucket->started = bucket->completed = false;
    }
    ddp->steps++;
    ddp->wait_seconds += wait_end - wait_start;
    profile_pop();
}

void ddp_set_sync(Ddp *ddp, bool sync) { ddp->sync = sync; }

void ddp_free(Ddp *ddp) {
    if (ddp->thread) {
        pthread_mutex_lock(&ddp->lock);
        ddp->stopping = true;
        pthread_cond_broadcast(&ddp->changed);
        pthread_mutex_unlock(&ddp->lock);
        pthread_join(ddp->thread, NULL);
        pthread_mutex_destroy(&ddp->lock);
        pthread_cond_destroy(&ddp->changed);
    }
#if HAVE_CUDA
    if (ddp->on_gpu) {
        device_synchronize();  // no bucket may be in flight
        for (int b = 0; b < ddp->n_buckets; b++) {
            device_free(ddp->buckets[b].device_buffer);
            CHECK_CUDA(cudaEventDestroy(ddp->buckets[b].packed));
            CHECK_CUDA(cudaEventDestroy(ddp->buckets[b].comm_start));
            CHECK_CUDA(cudaEventDestroy(ddp->buckets[b].comm_done));
        }
    }
    if (ddp->nccl) {
        CHECK_CUDA(cudaEventDestroy(ddp->step_start));
        CHECK_CUDA(cudaEventDestroy(ddp->backward_end));
    }
#endif
    for (int b = 0; b < ddp->n_buckets; b++) device_host_free(ddp->buckets[b].buffer);
    free(ddp->buckets);
    free(ddp->bucket_of_param);
    *ddp = (Ddp){0};
}

// ------------------------------------------------------------------ reports

void ddp_describe_buckets(const Ddp *ddp, char *out, size_t size) {
    int len = snprintf(out, size, "%d bucket%s:", ddp->n_buckets, ddp->n_buckets == 1 ? "" : "s");
    for (int b = 0; b < ddp->n_buckets && len < (int)size; b++) {
        const DdpBucket *bucket = &ddp->buckets[b];
        len += snprintf(out + len, size - len, " [%s", ddp->params[bucket->first_param + bucket->n_params - 1].name);
        if (bucket->n_params > 1 && len < (int)size)
            len += snprintf(out + len, size - len, " .. %s", ddp->params[bucket->first_param].name);
        if (len < (int)size) len += snprintf(out + len, size - len, ", %.1f KB]", bucket->count * 4 / 1024.0);
    }
}

void ddp_describe_overlap(Ddp *ddp, char *out, size_t size) {
#if HAVE_CUDA
    if (ddp->nccl) account_nccl_step(ddp);
#endif
    if (ddp->world_size == 1 || ddp->steps == 0) {
        snprintf(out, size, ddp->world_size == 1 ? "no gradient allreduce (world size 1)"
                                                 : "no synchronised step yet");
        return;
    }
    double comm = ddp->comm_seconds / ddp->steps, hidden = ddp->hidden_seconds / ddp->steps;
    snprintf(out, size,
             "gradient allreduce %.2f ms per step in %d bucket%s, %.2f ms (%.0f%%) of it hidden behind backward; "
             "the step waited %.2f ms for it",
             1e3 * comm, ddp->n_buckets, ddp->n_buckets == 1 ? "" : "s", 1e3 * hidden,
             comm > 0 ? 100 * hidden / comm : 0.0, 1e3 * ddp->wait_seconds / ddp->steps);
}
