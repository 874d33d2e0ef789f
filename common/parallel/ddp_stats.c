// ddp_stats.c: how much of the gradient allreduce backward hid, and the
// reports of ddp.h. Every strategy feeds the same totals. See ddp.h.
#include <stdio.h>

#include "parallel/ddp_internal.h"

// Communication time: the union of the buckets' [start, done] intervals
// (started in order, so a running maximum merges them). The part of it before
// backward ended ran while backward computed: hidden.
void ddp_account_bucket(Ddp *ddp, double start, double done, double backward_end, double *covered_until) {
    double from = start > *covered_until ? start : *covered_until;
    if (done > from) {
        double hidden_until = done < backward_end ? done : backward_end;
        ddp->comm_seconds += done - from;
        ddp->hidden_seconds += hidden_until > from ? hidden_until - from : 0;
        *covered_until = done;
    }
}

void ddp_describe_totals(const Ddp *ddp, char *out, size_t size) {
    if (ddp->world_size == 1 || ddp->steps == 0) {
        snprintf(out, size, ddp->world_size == 1 ? "no gradient allreduce (world size 1)"
                                                 : "no synchronised step yet");
        return;
    }
    if (ddp->captured_steps > 0) {  // the eager steps left (the first, a short last batch) are not the run's
        snprintf(out, size, "gradient allreduce in %d bucket%s, inside the step's CUDA graph: not timed (a replayed "
                 "step runs no host code to read the GPU's clock; --cuda_graph off times each step)",
                 ddp->n_buckets, ddp->n_buckets == 1 ? "" : "s");
        return;
    }
    double comm = ddp->comm_seconds / ddp->steps, hidden = ddp->hidden_seconds / ddp->steps;
    snprintf(out, size,
             "gradient allreduce %.2f ms per step in %d bucket%s, %.2f ms (%.0f%%) of it hidden behind backward; "
             "the step waited %.2f ms for it",
             1e3 * comm, ddp->n_buckets, ddp->n_buckets == 1 ? "" : "s", 1e3 * hidden,
             comm > 0 ? 100 * hidden / comm : 0.0, 1e3 * ddp->wait_seconds / ddp->steps);
}

void ddp_describe_buckets(const Ddp *ddp, char *out, size_t size) {
    int len = snprintf(out, size, "%d bucket%s:", ddp->n_buckets, ddp->n_buckets == 1 ? "" : "s");
    for (int b = 0; b < ddp->n_buckets && len < (int)size; b++) {
        const DdpBucket *bucket = &ddp->buckets[b];
        len += snprintf(out + len, size - len, " [%s", ddp->params[bucket->first_param + bucket->n_params - 1].name);
        if (bucket->n_params > 1 && len < (int)size)
            len += snprintf(out + len, size - len, " .. %s", ddp->params[bucket->first_param].name);
        double bytes = (double)bucket->count * sizeof(float);  // decimal units, as every size we print
        if (len >= (int)size) break;
        if (bytes < 1e3) len += snprintf(out + len, size - len, ", %.0f B]", bytes);
        else if (bytes < 1e6) len += snprintf(out + len, size - len, ", %.1f kB]", bytes / 1e3);
        else len += snprintf(out + len, size - len, ", %.2f MB]", bytes / 1e6);
    }
}
