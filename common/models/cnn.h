// cnn.h: the torchrun tutorial's SimpleCNN for MNIST, layer by layer.
//
//   self.network = nn.Sequential(
//       nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # network.0, .1, .2: 32 x 14 x 14
//       nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # network.3, .4, .5: 64 x 7 x 7
//       nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(),                # network.6, .7, .8
//       nn.Linear(128, 10))                                           # network.9
//
// Like the MLP (nn.h), the model exposes its parameters as a list in
// model.parameters() order with their state_dict names ("network.0.weight"
// [32, 1, 3, 3], ...), so DDP, Adam and the HDF5 checkpoints walk it as they
// walk the MLP's. Gradients accumulate: cnn_zero_grad() before each backward.
#pragma once
#include "models/conv.h"
#include "models/nn.h"
#include "runtime/memory_budget.h"  // MemoryNeed

#define CNN_PARAMS 8

typedef struct {
    Conv2d conv1;     // network.0: Conv2d(1, 32, 3, padding=1), then ReLU (network.1)
    MaxPool2d pool1;  // network.2: MaxPool2d(2)
    Conv2d conv2;     // network.3: Conv2d(32, 64, 3, padding=1), then ReLU (network.4)
    MaxPool2d pool2;  // network.5: MaxPool2d(2)
    Linear fc1;       // network.7: Linear(3136, 128), then ReLU (network.8)
    Linear fc2;       // network.9: Linear(128, 10)

    // Each layer's output, channel-major for the images, and its gradient,
    // sized for max_batch (a smaller batch uses the start of each buffer).
    Tensor conv1_out, grad_conv1_out;  // [32, B * 28 * 28], after the ReLU
    Tensor pool1_out, grad_pool1_out;  // [32, B * 14 * 14]
    Tensor conv2_out, grad_conv2_out;  // [64, B * 14 * 14], after the ReLU
    Tensor pool2_out, grad_pool2_out;  // [64, B * 7 * 7]
    Tensor flat, grad_flat;            // [B, 3136]
    Tensor fc1_out, grad_fc1_out;      // [B, 128], after the ReLU
    Tensor logits, grad_logits;        // [B, 10]
    Tensor output;                     // the last forward's logits: [B, 10] of `logits`
    int batch, max_batch;              // the last forward's batch; the most it takes

    int n_params;
    Param params[CNN_PARAMS];  // network.0.weight, network.0.bias, network.3.weight, ... network.9.bias
} Cnn;

// The layers in PyTorch's order, each drawing its weight and then its bias
// from rng (torch.manual_seed(seed) then SimpleCNN() draws the same numbers).
// On the heap: params point into it. cnn_free releases it. A batch whose buffers
// would not fit is the caller's to refuse first (cnn_add_memory_need).
Cnn *cnn_new(int max_batch, Rng *rng, Device device);
// What cnn_new(max_batch) and its training with Adam will hold, added to `need`
// (memory_budget.h) before anything is allocated, after refusing a batch past the
// pooling indexes (ints) whatever the memory: the parameters, their
// gradients, Adam's moments, and about 1 MB a sample of activations, their
// gradients, both convolutions' columns and the pools' argmax.
void cnn_add_memory_need(MemoryNeed *need, int max_batch);
void cnn_free(Cnn *model);
size_t cnn_num_weights(const Cnn *model);

// logits [B, 10] of images x [B, 784] (one 28 x 28 channel each).
const Tensor *cnn_forward(Cnn *model, const Tensor *x);
// Cross-entropy of the last forward's logits (the mean over the batch); keeps
// d loss / d logits for backward.
float cnn_loss(Cnn *model, const int *labels);
// The same, written to `slot` (the host does not wait for it on a GPU: mlp_loss_to in nn.h).
void cnn_loss_to(Cnn *model, const int *labels, const int *device_labels, LossSlot slot);
// loss.backward(): every parameter's gradient, accumulated. hook(context, i)
// is called as soon as params[i]'s gradient is final, the last layer's first,
// so DDP can start sending while backward goes on (hook may be NULL).
void cnn_backward(Cnn *model, GradReadyHook hook, void *context);
void cnn_zero_grad(Cnn *model);

// Evaluation without gradients (torch.no_grad()): images [n, 784] in batches
// of max_batch; predictions[i] = the argmax of image i's logits. Returns the
// sum over the images of the cross-entropy loss.
double cnn_evaluate(Cnn *model, const Tensor *images, const int *labels, int *predictions);
