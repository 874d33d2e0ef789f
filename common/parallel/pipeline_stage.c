// pipeline_stage.c: a pipeline stage of the MLP. See pipeline_stage.h.
#include "parallel/pipeline_stage.h"

#include <stdio.h>
#include <stdlib.h>

#include "runtime/profile.h"

// The floats a slot holds per row of its micro-batch: its input (unless it is the data), every
// layer's output, and on the last stage the loss's gradient. stage_new and the memory
// estimate both count with it, so the estimate is what stage_peak_activation_bytes measures.
static size_t slot_floats_per_row(const int *sizes, int n_sizes, int first_layer, int end_layer) {
    size_t floats = first_layer == 0 ? 0 : (size_t)sizes[first_layer];
    for (int g = first_layer; g < end_layer; g++) floats += (size_t)sizes[g + 1];
    if (end_layer == n_sizes - 1) floats += (size_t)sizes[end_layer];
    return floats;
}

void stage_add_memory_need(MemoryNeed *need, const int *sizes, int n_sizes, int first_layer, int end_layer, int rows,
                           int max_in_flight) {
    double weights = 0, scratch = first_layer == 0 ? 0 : (double)rows * sizes[first_layer];  // grad_input
    for (int g = first_layer; g < end_layer; g++) {
        weights += (double)sizes[g] * sizes[g + 1] + sizes[g + 1];
        scratch += (double)rows * sizes[g + 1];  // grad_scratch
    }
    memory_need_add(need, "parameters", weights * sizeof(float));
    memory_need_add(need, "gradients", weights * sizeof(float));
    memory_need_add(need, "Adam's moments", 2 * weights * sizeof(float));
    memory_need_add(need, "DDP's buckets", weights * sizeof(float));
    memory_need_add(need, "activations", ((double)max_in_flight * rows * slot_floats_per_row(sizes, n_sizes, first_layer, end_layer)
                                          + scratch) * sizeof(float));
    matmul_add_memory_need(need, mlp_largest_operand(sizes, first_layer, end_layer, rows));  // --dtype bfloat16's copies
}

Stage stage_new(const int *sizes, int n_sizes, int first_layer, int end_layer, int rows, Rng *rng, Device device) {
    int total_layers = n_sizes - 1;
    CHECK(0 <= first_layer && first_layer < end_layer && end_layer <= total_layers,
          "stage_new: layers [%d, %d) of an MLP of %d", first_layer, end_layer, total_layers);
    Stage stage = {.first_layer = first_layer, .n_layers = end_layer - first_layer, .is_first = first_layer == 0,
                   .is_last = end_layer == total_layers, .in_features = sizes[first_layer],
                   .out_features = sizes[end_layer], .rows = rows, .device = device,
                   .slot_floats_per_row = slot_floats_per_row(sizes, n_sizes, first_layer, end_layer)};
    stage.layers = xcalloc((size_t)stage.n_layers, sizeof(Linear));
    stage.n_params = 2 * stage.n_layers;
    stage.params = xcalloc((size_t)stage.n_params, sizeof(Param));
    stage.grad_scratch = xcalloc((size_t)stage.n_layers, sizeof(Tensor));
    // Every layer, in order, from the one generator: the random draws of the
    // layers before ours must be made for ours to get mlp_new's values.
    for (int g = 0; g < total_layers; g++) {
        if (g < first_layer || g >= end_layer) {
            Linear dropped;
            linear_init(&dropped, sizes[g], sizes[g + 1], rng, DEVICE_CPU);
            linear_free(&dropped);
            continue;
        }
        int l = g - first_layer;
        linear_init(&stage.layers[l], sizes[g], sizes[g + 1], rng, device);
        stage.grad_scratch[l] = tensor_zeros(rows, sizes[g + 1], device);
        Param *pair = &stage.params[2 * l];  // its weight and bias
        pair[0] = (Param){.value = &stage.layers[l].weight, .grad = &stage.layers[l].grad_weight};
        pair[1] = (Param){.value = &stage.layers[l].bias, .grad = &stage.layers[l].grad_bias};
        mlp_name_layer(pair, g);  // the whole model's names
    }
    if (!stage.is_first) stage.grad_input = tensor_zeros(rows, stage.in_features, device);
    return stage;
}

static void free_slot_tensors(Stage *stage, StageSlot *slot) {
    tensor_free(&slot->input);
    tensor_free(&slot->grad_logits);
    for (int l = 0; l < stage->n_layers; l++) tensor_free(&slot->outputs[l]);
    free(slot->outputs);
}

void stage_free(Stage *stage) {
    for (int s = 0; s < stage->n_slots; s++) free_slot_tensors(stage, &stage->slots[s]);
    for (int l = 0; l < stage->n_layers; l++) {
        linear_free(&stage->layers[l]);
        tensor_free(&stage->grad_scratch[l]);
    }
    tensor_free(&stage->grad_input);
    free(stage->slots);
    free(stage->layers);
    free(stage->params);
    free(stage->grad_scratch);
    *stage = (Stage){0};
}

// ------------------------------------------------------------------ slots

static StageSlot *slot_of(Stage *stage, int micro_batch) {
    for (int s = 0; s < stage->n_slots; s++)
        if (stage->slots[s].micro_batch == micro_batch) return &stage->slots[s];
    return NULL;
}

// A free slot of at least `rows` rows for the micro-batch, or a new one: a new
// slot is the only allocation, so what is allocated is the peak held at once.
static StageSlot *take_slot(Stage *stage, int micro_batch, int rows) {
    CHECK(!slot_of(stage, micro_batch), "stage: micro-batch %d is already in flight", micro_batch);
    StageSlot *slot = NULL;
    for (int s = 0; s < stage->n_slots && !slot; s++)
        if (stage->slots[s].micro_batch < 0 && stage->slots[s].capacity >= rows) slot = &stage->slots[s];
    if (!slot) {
        stage->slots = realloc(stage->slots, (size_t)(stage->n_slots + 1) * sizeof(StageSlot));
        CHECK(stage->slots, "out of memory for a stage's activation slots");
        slot = &stage->slots[stage->n_slots++];
        int capacity = rows > stage->rows ? rows : stage->rows;
        *slot = (StageSlot){.capacity = capacity};
        if (!stage->is_first) slot->input = tensor_zeros(capacity, stage->in_features, stage->device);
        slot->outputs = xcalloc((size_t)stage->n_layers, sizeof(Tensor));
        for (int l = 0; l < stage->n_layers; l++)
            slot->outputs[l] = tensor_zeros(capacity, stage->layers[l].weight.rows, stage->device);
        if (stage->is_last) slot->grad_logits = tensor_zeros(capacity, stage->out_features, stage->device);
    }
    slot->micro_batch = micro_batch;
    slot->forwarded = false;
    if (++stage->live > stage->peak_live) stage->peak_live = stage->live;
    return slot;
}

static void release(Stage *stage, StageSlot *slot) {
    slot->micro_batch = -1;
    stage->live--;
}

size_t stage_peak_activation_bytes(const Stage *stage) {
    size_t bytes = 0;  // every slot ever made was live at the peak, or it would not have been made
    for (int s = 0; s < stage->n_slots; s++) {
        // its capacity: a last, smaller batch uses fewer of its rows
        bytes += (size_t)stage->slots[s].capacity * stage->slot_floats_per_row * sizeof(float);
    }
    return bytes;
}

// ------------------------------------------------------------------ forward, loss, backward

Tensor *stage_input(Stage *stage, int micro_batch, int rows) {
    CHECK(!stage->is_first, "stage_input: the first stage's input is the data");
    StageSlot *slot = take_slot(stage, micro_batch, rows);
    slot->input.rows = rows;
    return &slot->input;
}

const Tensor *stage_forward(Stage *stage, int micro_batch, const Tensor *x) {
    StageSlot *slot = stage->is_first ? take_slot(stage, micro_batch, x->rows) : slot_of(stage, micro_batch);
    CHECK(slot && (stage->is_first || x == &slot->input), "stage_forward: micro-batch %d has no input (stage_input)",
          micro_batch);
    profile_push("forward");
    slot->x = *x;  // the view, not the caller's descriptor, which may not outlive this call
    slot->forwarded = true;
    const Tensor *input = &slot->x;
    for (int l = 0; l < stage->n_layers; l++) {
        slot->outputs[l].rows = x->rows;
        bool relu = !(stage->is_last && l == stage->n_layers - 1);  // a ReLU after every Linear but the model's last
        linear_forward(&stage->layers[l], input, &slot->outputs[l], relu);
        input = &slot->outputs[l];
    }
    profile_pop();
    return input;
}

void stage_loss_to(Stage *stage, int micro_batch, const int *labels, const int *device_labels, float weight,
                   LossSlot loss) {
    CHECK(stage->is_last, "stage_loss_to: only the last stage has the logits");
    StageSlot *slot = slot_of(stage, micro_batch);
    CHECK(slot && slot->forwarded, "stage_loss_to: micro-batch %d has not been forwarded", micro_batch);
    profile_push("loss");
    const Tensor *logits = &slot->outputs[stage->n_layers - 1];
    Tensor *grad_logits = &slot->grad_logits;  // where its backward starts, maybe M forwards later (GPipe)
    grad_logits->rows = logits->rows;
    softmax_cross_entropy_to(logits, labels, device_labels, grad_logits, loss);
    tensor_scale(grad_logits, weight);  // (loss * weight).backward()
    profile_pop();
}

Tensor *stage_grad_output(Stage *stage, int rows) {
    CHECK(!stage->is_last, "stage_grad_output: the last stage starts its backward from the loss");
    Tensor *grad = &stage->grad_scratch[stage->n_layers - 1];
    grad->rows = rows;
    return grad;
}

const Tensor *stage_backward(Stage *stage, int micro_batch, GradReadyHook hook, void *context) {
    StageSlot *slot = slot_of(stage, micro_batch);
    CHECK(slot && slot->forwarded, "stage_backward: micro-batch %d has not been forwarded", micro_batch);
    profile_push("backward");
    int rows = slot->x.rows;
    // From the forward's loss (last stage), or what the next stage sent.
    const Tensor *grad_y = stage->is_last ? &slot->grad_logits : &stage->grad_scratch[stage->n_layers - 1];
    for (int l = stage->n_layers - 1; l >= 0; l--) {
        const Tensor *input = l > 0 ? &slot->outputs[l - 1] : &slot->x;
        Tensor *grad_x = l > 0 ? &stage->grad_scratch[l - 1] : stage->is_first ? NULL : &stage->grad_input;
        if (grad_x) grad_x->rows = rows;
        linear_backward(&stage->layers[l], input, grad_y, grad_x);
        if (hook) {  // this layer's gradients are final: DDP may send them now
            hook(context, 2 * l + 1);
            hook(context, 2 * l);
        }
        // The ReLU after the layer before: on the previous stage's output when
        // l = 0, as mlp_backward applies it to the layer before's output.
        if (grad_x) relu_backward(input, grad_x);
        grad_y = grad_x;
    }
    release(stage, slot);
    profile_pop();
    return stage->is_first ? NULL : &stage->grad_input;
}

void stage_release(Stage *stage, int micro_batch) {
    StageSlot *slot = slot_of(stage, micro_batch);
    if (slot) release(stage, slot);
}

void stage_zero_grad(Stage *stage) { params_zero_grad(stage->params, stage->n_params); }

double stage_flops_per_sample(const Stage *stage) {
    double flops = 0;
    for (int l = 0; l < stage->n_layers; l++)
        flops += 2.0 * stage->layers[l].weight.rows * stage->layers[l].weight.cols;
    return flops;
}
