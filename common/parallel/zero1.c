// zero1.c: ZeRO stage 1 over a group, for any parameters. See zero1.h.
#include "parallel/zero1.h"

#include <stdlib.h>

#include "base/check.h"
#include "comm/collectives.h"
#include "runtime/profile.h"

// Values [first, first + n) of t as a [1, n] tensor sharing its storage.
static Tensor flat_view(const Tensor *t, size_t first, size_t n) {
    return (Tensor){.data = t->data + first, .rows = 1, .cols = (int)n, .device = t->device};
}

// This rank's part of block-cut tensor i: [first, first + count), count 0 when the tensor ends before it.
static void my_block(const Zero1 *z, int i, size_t *first, size_t *count) {
    size_t numel = tensor_numel(z->params[i].value), start = (size_t)z->group->rank * z->block[i];
    *first = start < numel ? start : numel;
    *count = start < numel ? (numel - start < z->block[i] ? numel - start : z->block[i]) : 0;
}

Zero1 zero1_new(Param *params, int n_params, const Group *group, double weight_decay, double beta1, double beta2) {
    Zero1 z = {.group = group, .params = params, .n_params = n_params};
    z.block = xmalloc((size_t)(n_params ? n_params : 1) * sizeof(size_t));
    z.blocks = xcalloc((size_t)(n_params ? n_params : 1), sizeof(Param));
    z.views = xcalloc((size_t)(2 * n_params + 1), sizeof(Tensor));
    size_t largest = 1;
    int n_blocks = 0;
    for (int i = 0; i < n_params; i++) {
        size_t numel = tensor_numel(params[i].value), first, count;
        z.block[i] = (numel + group->size - 1) / group->size;
        largest = z.block[i] > largest ? z.block[i] : largest;
        my_block(&z, i, &first, &count);
        if (count == 0) continue;  // a tensor of fewer values than ranks: nothing of it here
        z.views[2 * n_blocks] = flat_view(params[i].value, first, count);
        z.views[2 * n_blocks + 1] = flat_view(params[i].grad, first, count);
        Param *b = &z.blocks[n_blocks++];
        *b = params[i];  // its name and dims: AdamW decays what the whole tensor's dims say
        if (b->dims[0] == 0 && params[i].value->rows > 1) b->dims[0] = params[i].value->rows, b->dims[1] = params[i].value->cols;
        b->value = &z.views[2 * (n_blocks - 1)];
        b->grad = &z.views[2 * (n_blocks - 1) + 1];
    }
    z.optimizer = adamw_new(z.blocks, n_blocks, weight_decay, beta1, beta2);
    z.staging = tensor_zeros(1, (int)(largest * group->size), n_params ? params[0].value->device : DEVICE_CPU);
    return z;
}

void zero1_step(Zero1 *z, double lr) {
    adamw_step(&z->optimizer, lr);
    profile_push("all-gather");
    for (int i = 0; i < z->n_params; i++) {
        // Block d of the staging buffer gets my updated block; the all-gather fills the others in place.
        size_t first, count, numel = tensor_numel(z->params[i].value);
        my_block(z, i, &first, &count);
        Tensor mine = flat_view(&z->staging, (size_t)z->group->rank * z->block[i], count);
        if (count) {
            Tensor updated = flat_view(z->params[i].value, first, count);
            tensor_copy(&mine, &updated);
        }
        Tensor gathered = flat_view(&z->staging, 0, z->block[i] * z->group->size);
        Tensor my_slot = flat_view(&z->staging, (size_t)z->group->rank * z->block[i], z->block[i]);
        group_all_gather(z->group, &my_slot, &gathered);
        Tensor whole = flat_view(&z->staging, 0, numel), value = flat_view(z->params[i].value, 0, numel);
        tensor_copy(&value, &whole);
    }
    profile_pop();
}

size_t zero1_state_floats(const Zero1 *z) {
    size_t floats = 0;
    for (int i = 0; i < z->optimizer.adam.n_params; i++) floats += 2 * tensor_numel(z->blocks[i].value);
    return floats;
}

void zero1_free(Zero1 *z) {
    adamw_free(&z->optimizer);
    tensor_free(&z->staging);
    free(z->block), free(z->blocks), free(z->views);
    *z = (Zero1){0};
}
