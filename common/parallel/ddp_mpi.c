// ddp_mpi.c: DDP's buckets through MPI, strategies 1 (a communication thread)
// and 2 (no MPI thread support: progress between layers). CPU gradients, or a
// shared GPU's host copies (strategy 4, ddp_gpu.c). See ddp.h.
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "base/timer.h"
#include "parallel/ddp_internal.h"

// ------------------------------------------------------------------ the buckets' MPI calls

static void start_bucket(Ddp *ddp, int b, int thread) {
    DdpBucket *bucket = &ddp->buckets[b];
    if (ddp->on_gpu) ddp_shared_gpu_wait_packed(ddp, b);  // the host copy must have arrived
    bucket->range = profile_range_start("allreduce", thread);
    bucket->start_time = wall_seconds();
    group_count_traffic(ddp->group, TRAFFIC_ALL_REDUCE, bucket->count);
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, bucket->buffer, (int)bucket->count, MPI_FLOAT, MPI_SUM,
                             ddp->group->mpi, &bucket->request));
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

// CPU gradients into the bucket's flat buffer.
static void pack_on_cpu(Ddp *ddp, const DdpBucket *bucket) {
    float *out = bucket->buffer;
    for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
        size_t n = tensor_numel(ddp->params[i].grad);
        memcpy(out, ddp->params[i].grad->data, n * sizeof(float));
        out += n;
    }
}

// The reduced sums, divided by W, back into the CPU gradients: the gradient of
// the global batch. (`grad / W`, a division, as PyTorch's DDP divides.)
static void unpack_on_cpu(Ddp *ddp, const DdpBucket *bucket) {
    float divisor = (float)ddp->world_size;
    const float *in = bucket->buffer;
    for (int i = bucket->first_param; i < bucket->first_param + bucket->n_params; i++) {
        float *grad = ddp->params[i].grad->data;
        size_t n = tensor_numel(ddp->params[i].grad);
#pragma omp parallel for
        for (size_t k = 0; k < n; k++) grad[k] = in[k] / divisor;
        in += n;
    }
}

// ------------------------------------------------------------------ 1. a communication thread

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

        for (int b = first; b < ready; b++) start_bucket(ddp, b, PROFILE_COMM_THREAD);
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

// Bucket b to the thread (started at the first bucket of the first step).
static void hand_to_thread(Ddp *ddp, int b) {
    if (!ddp->thread) {
        pthread_mutex_init(&ddp->lock, NULL);
        pthread_cond_init(&ddp->changed, NULL);
        CHECK(pthread_create(&ddp->thread, NULL, communication_thread, ddp) == 0, "cannot start the DDP thread");
    }
    pthread_mutex_lock(&ddp->lock);
    CHECK(b == ddp->n_ready, "DDP bucket %d ready out of order (expected %d)", b, ddp->n_ready);
    ddp->n_ready++;
    pthread_cond_broadcast(&ddp->changed);
    pthread_mutex_unlock(&ddp->lock);
}

// Every bucket completed on the thread; resets the counters for the next step.
static void wait_for_thread(Ddp *ddp) {
    pthread_mutex_lock(&ddp->lock);
    CHECK(ddp->n_ready == ddp->n_buckets, "ddp_finish: backward produced %d of %d buckets", ddp->n_ready,
          ddp->n_buckets);
    ddp->finishing = true;
    while (ddp->n_done < ddp->n_buckets) pthread_cond_wait(&ddp->changed, &ddp->lock);
    ddp->finishing = false;
    ddp->n_ready = ddp->n_started = ddp->n_done = 0;  // the thread waits now: reset for the next step
    pthread_mutex_unlock(&ddp->lock);
}

void ddp_mpi_stop_thread(Ddp *ddp) {
    if (!ddp->thread) return;
    pthread_mutex_lock(&ddp->lock);
    ddp->stopping = true;
    pthread_cond_broadcast(&ddp->changed);
    pthread_mutex_unlock(&ddp->lock);
    pthread_join(ddp->thread, NULL);
    pthread_mutex_destroy(&ddp->lock);
    pthread_cond_destroy(&ddp->changed);
}

// ------------------------------------------------------------------ 2. no MPI thread support: between layers

// Start bucket b here, and drive every started bucket once: MPI progresses
// only inside MPI calls, and this is the main thread's one chance per layer.
static void start_between_layers(Ddp *ddp, int b) {
    start_bucket(ddp, b, PROFILE_MAIN_THREAD);
    for (int k = 0; k <= b; k++)
        if (!ddp->buckets[k].completed) test_bucket(&ddp->buckets[k]);
}

static void wait_between_layers(Ddp *ddp) {
    for (int b = 0; b < ddp->n_buckets; b++)
        while (!ddp->buckets[b].completed) test_bucket(&ddp->buckets[b]);
}

// ------------------------------------------------------------------ both: ready and finish

void ddp_mpi_bucket_ready(Ddp *ddp, int b) {
    if (ddp->on_gpu) ddp_shared_gpu_pack(ddp, b);
    else pack_on_cpu(ddp, &ddp->buckets[b]);
    if (ddp->use_thread) hand_to_thread(ddp, b);
    else start_between_layers(ddp, b);
}

void ddp_mpi_finish(Ddp *ddp) {
    profile_push("allreduce wait");
    double wait_start = wall_seconds();
    if (ddp->use_thread) wait_for_thread(ddp);
    else wait_between_layers(ddp);
    double wait_end = wall_seconds();

    // Backward was over when ddp_finish was entered.
    double covered_until = 0;
    for (int b = 0; b < ddp->n_buckets; b++) {
        DdpBucket *bucket = &ddp->buckets[b];
        ddp_account_bucket(ddp, bucket->start_time, bucket->done_time, wait_start, &covered_until);
        if (ddp->on_gpu) ddp_shared_gpu_unpack(ddp, b);
        else unpack_on_cpu(ddp, bucket);
        bucket->pending = bucket->n_params;
        bucket->started = bucket->completed = false;
    }
    ddp->wait_seconds += wait_end - wait_start;
    profile_pop();
}
