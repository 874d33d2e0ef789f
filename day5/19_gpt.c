// Step 19: a GPT, trained under DDP on Tiny Shakespeare.      PyTorch twin: tests/torch_gpt.py
//                                                            (nanoGPT's model.py and train.py)
//
// What it changes from step 14 (diff the two files): the model and the data. The model is
// nanoGPT's decoder-only transformer (common/models/gpt.h): token and position embeddings, n_layer blocks
// of LayerNorm -> causal self-attention -> residual -> LayerNorm -> MLP (GELU) -> residual, a last
// LayerNorm and the head tied to the token embedding. The data is text as characters
// (common/data/char_text.h): each iteration draws random windows of block_size + 1 characters and the
// model learns to predict each next character. The optimizer is nanoGPT's: AdamW with weight decay
// on the matrices only, a warm-up then a cosine decay of the learning rate, the gradients clipped
// to a global norm of 1 (common/models/adamw.h, common/train/lr_schedule.h). DDP is step 6's library, unchanged.
//
// The batches: each iteration draws ONE global batch of batch_size x accum_steps x world windows,
// as torch.randint(len(train) - block_size, ...) draws them from --seed, and rank r's micro-step m
// takes its slice (r * accum_steps + m). So W ranks with --accum_steps A take the same steps as one
// process with --accum_steps W x A (up to float summation order). nanoGPT instead seeds each rank
// differently (1337 + rank): as good a batch, but no run on other ranks can be compared with it.
// Evaluation draws its windows from a generator of its own (--seed + 1), so that evaluating more
// or less often never changes the training's windows. --dropout draws its masks from a generator
// seeded for each micro-batch of the global batch (seed x 2^32 + 2^31 + its index in the run): on
// the CPU as PyTorch's CPU kernel does, so that the twin, seeding torch alike, drops the same values;
// on a GPU from Philox, a counter-based generator, on the GPU (--dropout_rng says which).
//
// Where: --device auto (the default) computes on the GPU where every rank has one (cuBLAS and the
// kernels of common/tensor/kernels.cu, the choice made inside each operation: nothing here changes);
// with the same --dropout_rng both devices take the same steps (day5/README.md, On GPUs).
//
// Defaults: nanoGPT's "baby GPT" for a laptop CPU (its README): 4 layers, 4 heads, 128 wide,
// context 64, batch 12, 2000 iterations, lr 1e-3 decaying over 2000 to 1e-4, warm-up 100,
// betas (0.9, 0.99), weight decay 0.1, no dropout, no biases. nanoGPT reports a validation loss
// of about 1.88 for it.
//
// Build and run:
//   make day5/19_gpt && make shakespeare                 (SHAKESPEARE_MIRROR=DIR: from a folder)
//   day5/19_gpt --max_iters 100 --eval_interval 50 --sample 0   # a first look: 100 iterations
//   day5/19_gpt                                          # the baby GPT: 2000 iterations, then a sample
//   mpirun -np 2 day5/19_gpt                             # DDP on 2 ranks (add --oversubscribe on fewer cores)
//   mpirun -np 4 day5/19_gpt                             # on a node of 4 GPUs: a GPU per rank, NCCL's allreduce
//   day5/19_gpt --max_iters 0 --init gpt.h5 --sample 500 # text from a saved model (--save gpt.h5)
//   mpirun -np 2 day5/19_gpt --save_every 500 --checkpoint checkpoints/gpt   # stop it, then resume it
//   mpirun -np 2 day5/19_gpt --save_every 500 --checkpoint checkpoints/gpt --on_resize keep_batch  # resumed on
//                                                        another world size, the same steps (a node lost:
//                                                        slurm/run_with_restarts.sh --min_ranks, day5/README.md)
//
// Expected output (the first look, 1 process on 2 cores; times vary; day5/README.md shows the
// whole baby run, its sample and the memory table):
//   Step 19: a GPT on 1 rank: 4 layers, 4 heads, 128 wide, context 64, vocabulary 65: 0.80M parameters (795904, and 8192 in wpe); 1 bucket: [transformer.ln_f.weight .. transformer.wte.weight, 3.22 MB]
//   ...
//   step 0: train loss 4.2246, val loss 4.2196
//   ...
//   step 50: train loss 2.9145, val loss 2.9291
//   ...
//   step 100: train loss 2.5974, val loss 2.5982
//   training: 100 iterations in 3.91 s, 19642 tokens/s, MFU 67.6%
//   ...
//   [rank 0] parameter checksum 390f1934b70e4738
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // xmalloc, usage_error
#include "base/quote.h"             // QUOTE, PATH_SHOWN: a flag's value in a message; escape_lines: the sample
#include "base/timer.h"             // wall_seconds
#include "data/char_text.h"         // CharText, the windows: the data
#include "models/adamw.h"           // AdamW, clip_grad_norm: nanoGPT's optimizer step
#include "models/gpt.h"             // Gpt: the model, forward, loss, backward, generate
#include "parallel/ddp.h"           // ddp_wrap, ddp_grad_ready, ddp_finish, ddp_set_sync: DistributedDataParallel
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/sharded_checkpoint.h"  // sharded_checkpoint_save_step, _resume: step 18's checkpoints, any world size resumes
#include "records/loss_log.h"       // loss_log_add, loss_log_write_csv: the loss of every iteration
#include "records/plot.h"           // plot_png: the train and validation curves
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "tensor/flops.h"           // sgemm_peak_flops: the yardstick of MFU
#include "train/divergence.h"       // check_loss_finite, check_weights_finite: a nan or inf stops the run, on every rank
#include "train/step_losses.h"      // step_losses_take_all: each iteration's loss, read when the host prints it
#include "train/lr_schedule.h"      // lr_at: warm-up, then cosine decay

typedef struct {
    const char *data, *init, *save, *losses, *plot, *device, *dtype, *dropout_rng, *prompt, *checkpoint, *save_errors, *on_resize;
    int save_every, keep, async_save;
    int n_layer, n_head, n_embd, block_size, batch_size, bias;
    double dropout;
    int max_iters, warmup_iters, lr_decay_iters, accum_steps, eval_interval, eval_iters, seed, threads, sample, top_k;
    double learning_rate, min_lr, weight_decay, beta1, beta2, grad_clip, bucket_mb, temperature;
    TrackingOptions tracking;
} Options;

// estimate_loss(): the mean loss over eval_iters global batches of the split, each rank
// evaluating its slice (as in training), in micro-batches of batch_size; no gradients.
static double estimate_loss(Gpt *model, const CharText *text, TextSplit split, Rng *eval_rng, const Options *o,
                            long *offsets, int *inputs, int *targets) {
    int world = dist_world_size(), rank = dist_rank();
    int per_rank = o->batch_size * o->accum_steps, global = per_rank * world;
    double sum = 0.0;
    gpt_set_training(model, false);  // model.eval(): no dropout
    for (int k = 0; k < o->eval_iters; k++) {
        char_text_draw_offsets(eval_rng, char_text_split_length(text, split), o->block_size, global, offsets);
        for (int m = 0; m < o->accum_steps; m++) {
            char_text_windows(text, split, offsets + (size_t)(rank * o->accum_steps + m) * o->batch_size, o->batch_size,
                              o->block_size, inputs, targets);
            gpt_forward(model, inputs, o->batch_size, o->block_size);
            sum += gpt_loss(model, targets);
        }
    }
    gpt_set_training(model, true);   // model.train()
    float total = (float)sum;
    dist_allreduce_sum(&total, 1);
    return total / ((double)o->eval_iters * o->accum_steps * world);
}

// nanoGPT's sample.py, after training: model.eval(), generate from the prompt, decode, print. The
// text's characters as they are, a control byte or a byte of no UTF-8 escaped (\x1b): the training
// text may hold any byte, and a terminal would obey some.
static void sample_text(Gpt *model, const CharText *text, const int *prompt, int prompt_length, const Options *o,
                        Rng *rng) {
    int length = prompt_length + o->sample;
    int *tokens = xmalloc((size_t)length * sizeof(int));
    char *out = xmalloc((size_t)length), *shown = xmalloc(4 * (size_t)length + 1);
    memcpy(tokens, prompt, (size_t)prompt_length * sizeof(int));
    gpt_set_training(model, false);  // model.eval(): no dropout
    gpt_generate(model, tokens, prompt_length, o->sample, o->temperature, o->top_k, rng);
    char_text_decode(text, tokens, length, out);
    print0("%s\n", escape_lines(shown, out, (size_t)length));
    free(tokens), free(out), free(shown);
}

// What a rank holds, each part beside its formula (L layers, C wide, V characters, T context,
// B windows per micro-step, H heads; float32, 4 bytes each). The activations are those kept from
// forward for backward, for one micro-step.
static void print_memory(const Gpt *model, int B) {
    const GptConfig *c = &model->config;
    const double L = c->n_layer, C = c->n_embd, V = c->vocab_size, T = c->block_size, H = c->n_head, N = B * T;
    // 12 L C^2: c_attn 3C^2, attn.c_proj C^2, c_fc 4C^2, mlp.c_proj 4C^2; the two LayerNorms' weights 2 L C
    // and ln_f's C; with biases, 11 L C + C more (3C + C + 4C + C of the Linears, 2C of the LayerNorms).
    double params = 12 * L * C * C + (V + T) * C + (2 * L + 1) * C + (c->bias ? 11 * L * C + C : 0);
    double activations = N * (16 * L * C + 4 * L + 2 * C + 2 + 2 * V) + L * B * H * T * T;
    // Dropout keeps its masks: the embeddings' and two per block [N, C], and attention's [B H T T]
    // beside the probabilities it dropped.
    double masks = c->dropout > 0 ? N * C * (2 * L + 1) + 2 * L * B * H * T * T : 0;
    CHECK(params == (double)gpt_num_params(model, false) && activations + masks == (double)gpt_activation_floats(model),
          "the memory formulas disagree with the model: %.0f and %.0f floats", params, activations);
    print0("memory per rank (float32):\n"
           "  parameters   %8.2f MB  P = 12 L C^2 + (V + T) C + (2 L + 1) C%s = %.0f\n"
           "  gradients    %8.2f MB  P\n"
           "  AdamW        %8.2f MB  2 P (exp_avg, exp_avg_sq)\n"
           "  activations  %8.2f MB  B T (16 L C + 2 V + 2 C + 4 L + 2) + L B H T^2 = %.0f (attention's probabilities: %.0f)\n",
           4 * params / 1e6, c->bias ? " + (11 L + 1) C" : "", params, 4 * params / 1e6, 8 * params / 1e6,
           4 * activations / 1e6, activations, L * B * H * T * T);
    if (masks > 0)
        print0("  dropout      %8.2f MB  B T C (2 L + 1) + 2 L B H T^2 = %.0f (its masks, and attention's probabilities after it)\n",
               4 * masks / 1e6, masks);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    Options o = {.data = "data/shakespeare", .plot = "img/19_gpt.png", .device = "auto",
                 .n_layer = 4, .n_head = 4, .n_embd = 128, .block_size = 64, .batch_size = 12,
                 .max_iters = 2000, .warmup_iters = 100, .lr_decay_iters = 2000, .accum_steps = 1,
                 .eval_interval = 250, .eval_iters = 20, .seed = 1337, .sample = 200, .top_k = 200,
                 .learning_rate = 1e-3, .min_lr = 1e-4, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.99,
                 .grad_clip = 1.0, .bucket_mb = 25.0, .temperature = 0.8, .keep = 2, .save_errors = "stop", .dropout_rng = "auto", .dtype = "float32",
                 .on_resize = "off"};
    ArgSpec flags[] = {
        {"data", ARG_PATH, &o.data, "DIR", "folder with input.txt, the text (make shakespeare)", 0, NULL},
        {"n_layer", ARG_INT, &o.n_layer, "N", "transformer blocks", 1, NULL},
        {"n_head", ARG_INT, &o.n_head, "N", "attention heads per block", 1, NULL},
        {"n_embd", ARG_INT, &o.n_embd, "N", "width of the residual stream (a multiple of --n_head)", 1, NULL},
        {"block_size", ARG_INT, &o.block_size, "N", "context: characters the model sees", 1, NULL},
        {"batch_size", ARG_INT, &o.batch_size, "N", "windows per micro-step, per rank", 1, NULL},
        {"bias", ARG_SWITCH, &o.bias, NULL, "biases in the Linears and LayerNorms (nanoGPT's bias=True)", 0, NULL},
        {"dropout", ARG_FLOAT_GE, &o.dropout, "P", "dropout probability (after the embeddings, on attention, after each c_proj)", 0, NULL},
        {"dropout_rng", ARG_STRING, &o.dropout_rng, "GEN", "the masks' generator: torch (its CPU generator's bits, drawn on "
         "the host) or philox (counter-based, drawn where the model is); auto: philox on a GPU, torch on the CPU", 0,
         "torch|philox|auto"},
        {"max_iters", ARG_INT, &o.max_iters, "N", "optimizer steps (0: none, e.g. to --sample an --init)", 0, NULL},
        {"learning_rate", ARG_FLOAT, &o.learning_rate, "X", "AdamW's peak learning rate", 0, NULL},
        {"min_lr", ARG_FLOAT_GE, &o.min_lr, "X", "the learning rate at the end of the cosine decay", 0, NULL},
        {"warmup_iters", ARG_INT, &o.warmup_iters, "N", "linear warm-up iterations", 0, NULL},
        {"lr_decay_iters", ARG_INT, &o.lr_decay_iters, "N", "the iteration where the cosine decay reaches --min_lr", 0, NULL},
        {"weight_decay", ARG_FLOAT_GE, &o.weight_decay, "X", "AdamW's decoupled weight decay (matrices only)", 0, NULL},
        {"beta1", ARG_FLOAT_GE, &o.beta1, "X", "AdamW's beta1", 0, NULL},
        {"beta2", ARG_FLOAT_GE, &o.beta2, "X", "AdamW's beta2", 0, NULL},
        {"grad_clip", ARG_FLOAT_GE, &o.grad_clip, "X", "clip the gradients' global norm to X (0: no clipping)", 0, NULL},
        {"accum_steps", ARG_INT, &o.accum_steps, "N", "micro-steps per optimizer step (gradient accumulation)", 1, NULL},
        {"eval_interval", ARG_INT, &o.eval_interval, "N", "evaluate every N iterations, and after the last", 1, NULL},
        {"eval_iters", ARG_INT, &o.eval_iters, "N", "global batches per split and evaluation", 1, NULL},
        {"seed", ARG_INT, &o.seed, "N", "seeds the weights and the windows", 0, NULL},
        {"init", ARG_PATH, &o.init, "FILE.h5", "start from these weights (nanoGPT's state_dict names)", 0, NULL},
        {"save", ARG_OUTPUT, &o.save, "FILE.h5", "write the final weights", 0, NULL},
        {"losses", ARG_OUTPUT, &o.losses, "FILE.csv", "write step,epoch,loss per iteration (rank 0)", 0, NULL},
        {"plot", ARG_OUTPUT_OR_NONE, &o.plot, "FILE.png", "train and validation loss curves ('' for none)", 0, NULL},
        {"sample", ARG_INT, &o.sample, "N", "characters to generate at the end (0: none)", 0, NULL},
        {"prompt", ARG_STRING, &o.prompt, "TEXT", "the text the sample goes on from (none: a newline, as nanoGPT's sample.py)", 0, NULL},
        {"temperature", ARG_FLOAT, &o.temperature, "X", "the sample's temperature (< 1: more likely characters)", 0, NULL},
        {"top_k", ARG_INT, &o.top_k, "N", "sample among the N likeliest characters only", 1, NULL},
        {"bucket_mb", ARG_FLOAT_GE, &o.bucket_mb, "MiB", "gradient bucket size, as PyTorch's bucket_cap_mb; 0: one bucket per tensor", 0, NULL},
        {"device", ARG_STRING, &o.device, "DEV", "where to compute (auto: the GPU when every rank has one)", 0, "cpu|cuda|auto"},
        {"dtype", ARG_STRING, &o.dtype, "TYPE", "the matrix products' precision: bfloat16 operands, float32 sums and "
         "weights (nanoGPT's --dtype, torch.autocast; the attention's products stay float32)", 0, "float32|bfloat16"},
        {"threads", ARG_INT, &o.threads, "N", "CPU threads per rank, as torch.set_num_threads (0: the node's cores / its ranks)", 0, NULL},
        {"checkpoint", ARG_STRING, &o.checkpoint, "DIR", CHECKPOINT_HELP_DIR, 0, NULL},
        {"save_every", ARG_INT, &o.save_every, "N", CHECKPOINT_HELP_SAVE_EVERY, 0, NULL},
        {"keep", ARG_INT, &o.keep, "N", CHECKPOINT_HELP_KEEP, 1, NULL},
        {"async_save", ARG_SWITCH, &o.async_save, NULL, CHECKPOINT_HELP_ASYNC_SAVE, 0, NULL},
        {"save_errors", ARG_STRING, &o.save_errors, "WHAT", CHECKPOINT_HELP_SAVE_ERRORS, 0, "stop|continue"},
        {"on_resize", ARG_STRING, &o.on_resize, "WHAT", "a checkpoint saved with another global batch (another world "
         "size: an elastic restart): keep_batch grows --accum_steps to keep its global batch (the uninterrupted "
         "run's steps), scale_lr keeps the per-rank batch and scales the lr with the global batch, off takes the "
         "flags as given", 0, "keep_batch|scale_lr|off"},
        TRACKING_FLAGS(o.tracking),
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 19: a GPT (nanoGPT's, character-level) trained under DDP on Tiny Shakespeare.");
    checkpoint_flags_check(o.checkpoint);  // --save_every, --keep, --async_save, --save_errors: only with --checkpoint
    if (args_given("on_resize") && !o.checkpoint) usage_error("--on_resize: only with --checkpoint DIR");
    bool save_errors_continue = strcmp(o.save_errors, "continue") == 0;
    GptConfig config = {.block_size = o.block_size, .n_layer = o.n_layer, .n_head = o.n_head, .n_embd = o.n_embd,
                        .bias = o.bias, .dropout = o.dropout};
    if (gpt_config_problem(&config)) usage_error("%s", gpt_config_problem(&config));
    Device device = device_from_flag(o.device);
    threads_init(o.threads);
    matmul_set_dtype(matmul_dtype_from_flag(o.dtype));  // ctx = torch.autocast(device_type, dtype=ptdtype)
    int rank = dist_rank(), world = dist_world_size();

    // Data: the text's characters are the vocabulary; 90% trains, 10% validates.
    CharText text = char_text_load(o.data, o.block_size);
    config.vocab_size = text.vocab_size;
    if (!o.prompt) o.prompt = "\n";
    int prompt_length = (int)strlen(o.prompt);
    int *prompt = xmalloc(((size_t)prompt_length + 1) * sizeof(int));
    int bad = 0;
    if (o.sample > 0 && (prompt_length == 0 || !char_text_encode(&text, o.prompt, prompt, &bad))) {
        if (prompt_length == 0) usage_error("--prompt '': the sample needs at least one character to go on from");
        usage_error("--prompt %s: its character %d, %s, is not in the vocabulary of %s/input.txt (%d characters)",
                    QUOTE(o.prompt), bad + 1, QUOTE_N(o.prompt + bad, 1), PATH_SHOWN(o.data), text.vocab_size);
    }

    // What the model will take, refused in one line if it would not fit (before anything is allocated).
    MemoryNeed need = memory_need("--n_layer %d --n_embd %d --block_size %d --batch_size %d", o.n_layer, o.n_embd,
                                  o.block_size, o.batch_size);
    gpt_add_memory_need(&need, &config, o.batch_size);
    if (device == DEVICE_CPU) memory_need_add(&need, "data", (double)text.n);  // (on a GPU rank the text stays on the host)
    memory_require(&need, device);

    // Model, DDP and optimizer.
    Rng init_rng;
    rng_seed(&init_rng, (uint64_t)o.seed);  // torch.manual_seed(seed)
    Gpt *model = gpt_new(&config, o.batch_size, &init_rng, device);  // model = GPT(gptconf).to(device)
    if (strcmp(o.dropout_rng, "auto") != 0) gpt_set_dropout_philox(model, strcmp(o.dropout_rng, "philox") == 0);
    // Every tensor of the state_dict, and nothing else (lm_head.weight aside: wte's, tied).
    if (o.init) h5_load_params_exactly(o.init, model->params, model->n_params, (const char *const[]){"lm_head.weight", NULL});
    Ddp ddp = ddp_wrap(model->params, model->n_params, o.bucket_mb);  // model = DDP(model)
    AdamW optimizer = adamw_new(model->params, model->n_params, o.weight_decay, o.beta1, o.beta2);
    LrSchedule schedule = {.lr = o.learning_rate, .min_lr = o.min_lr, .warmup_iters = o.warmup_iters,
                           .lr_decay_iters = o.lr_decay_iters, .decay = true};

    int global_batch = o.batch_size * o.accum_steps * world;
    int decay_tensors, other_tensors;
    long decay_values, other_values;
    adamw_count(&optimizer, &decay_tensors, &decay_values, &other_tensors, &other_values);
    char buckets[512];
    ddp_describe_buckets(&ddp, buckets, sizeof buckets);
    print0("Step 19: a GPT on %d rank%s: %d layers, %d heads, %d wide, context %d, vocabulary %d: %.2fM parameters "
           "(%zu, and %zu in wpe); %s\n", world, world == 1 ? "" : "s", o.n_layer, o.n_head, o.n_embd, o.block_size,
           text.vocab_size, gpt_num_params(model, true) / 1e6, gpt_num_params(model, true),
           gpt_num_params(model, false) - gpt_num_params(model, true), buckets);
    print0("AdamW lr %g (warm-up %d, cosine to %g at %d), betas (%g, %g), weight decay %g on %d tensors (%ld values), "
           "none on %d (%ld); clip %g; %d iterations of %d windows (%d per rank x %d micro-step%s x %d rank%s), "
           "%d tokens each; %s%s, %s\n", o.learning_rate, o.warmup_iters, o.min_lr, o.lr_decay_iters, o.beta1, o.beta2,
           o.weight_decay, decay_tensors, decay_values, other_tensors, other_values, o.grad_clip, o.max_iters, global_batch,
           o.batch_size, o.accum_steps, o.accum_steps == 1 ? "" : "s", world, world == 1 ? "" : "s",
           global_batch * o.block_size, matmul_dtype() == MATMUL_BFLOAT16 ? "matmuls in bfloat16; " : "", device_name(device),
           threads_describe());
    print0("data: %s/input.txt, %ld characters: %ld train, %ld validate\n", o.data, text.n, text.n_train, text.n - text.n_train);
    if (o.dropout > 0)
        print0("dropout %g: masks from %s\n", o.dropout, model->dropout_philox ? "Philox, drawn where the model is"
                                                                              : "torch's CPU generator, drawn on the host");
    // MFU's yardstick: this rank's sgemm peak on its device, measured now (a GPU needs a larger
    // product than a CPU to be busy).
    double flops_per_iter = gpt_flops_per_token(model, o.block_size) * global_batch * o.block_size;
    double peak = o.max_iters > 0 ? sgemm_peak_flops(device, device == DEVICE_CUDA ? 2048 : 1024, 5) : 0.0;
    if (o.max_iters > 0)
        print0("%.2f GFLOP per iteration (6 N + 12 L H Q T per token, as nanoGPT counts); this rank's %s peak %.1f "
               "GFLOP/s, measured\n", flops_per_iter / 1e9,
               matmul_dtype() == MATMUL_BFLOAT16 ? "bfloat16 GEMM" : "sgemm", peak / 1e9);  // (gemm's, in --dtype)

    Rng train_rng, eval_rng;
    rng_seed(&train_rng, (uint64_t)o.seed);      // the training windows
    rng_seed(&eval_rng, (uint64_t)o.seed + 1);   // the evaluation's
    long *offsets = xmalloc((size_t)global_batch * sizeof(long));
    int *inputs = xmalloc((size_t)o.batch_size * o.block_size * sizeof(int));   // [B, T]
    int *targets = xmalloc((size_t)o.batch_size * o.block_size * sizeof(int));  // [B, T]
    LossLog losses = {0};

    // --checkpoint: resume from DIR's current checkpoint, saved on any number of ranks (step 18's
    // module: every rank holds the whole model, as DDP's, and writes its 1/W of each tensor's rows).
    CheckpointState state = {.program = "day5/19_gpt", .also_resumes = "day5/20_gpt_3d", .world_size = world, .global_batch = global_batch,
                             .random_windows = true, .seed = o.seed, .shuffle = 1, .train_samples = (int)text.n_train,
                             .adopts_global_batch = strcmp(o.on_resize, "keep_batch") == 0,
                             .lr = o.learning_rate, .lr_scale = 1.0, .generator = train_rng, .eval_generator = eval_rng,
                             .eval_generator_kept = true, .losses = &losses};
    snprintf(state.layout, sizeof state.layout, "DDP on %d rank%s", world, world == 1 ? "" : "s");
    CheckpointBox *boxes = xcalloc((size_t)model->n_params, sizeof(CheckpointBox));
    for (int i = 0; i < model->n_params; i++) boxes[i] = checkpoint_whole_box(model->params[i].value, rank, world);
    CheckpointPieces wanted = checkpoint_param_pieces(model->params, optimizer.adam.exp_avg, optimizer.adam.exp_avg_sq,
                                                      model->n_params, boxes, false);
    CheckpointPieces saved = checkpoint_param_pieces(model->params, optimizer.adam.exp_avg, optimizer.adam.exp_avg_sq,
                                                     model->n_params, boxes, true);
    int first_iter = 0;
    CheckpointSave *in_flight = NULL;  // --async_save: the save a thread is writing
    if (o.checkpoint && sharded_checkpoint_resume(o.checkpoint, wanted.piece, wanted.n, &state, o.init)) {
        first_iter = (int)state.step;
        optimizer.adam.step = state.step;
        train_rng = state.generator, eval_rng = state.eval_generator;
        // --on_resize: the checkpoint was saved with another global batch, as when an elastic
        // restart (slurm/run_with_restarts.sh --min_ranks) goes on with the ranks a lost node left.
        // keep_batch takes its global batch, --accum_steps growing as the ranks shrink: every
        // iteration then draws the same windows from the same generator and the micro-steps take
        // the same slices of them (rank r's m-th is slice r x accum_steps + m), so the steps are the
        // uninterrupted run's, up to float summation order (the mean over slices is summed in
        // another order). scale_lr keeps each rank's batch and multiplies the learning rate (and
        // min_lr) by the ratio of the global batches, W'/W: Day 1's rule (step 8, lr x world
        // size), which keeps the size of a step, not the steps (fewer windows each, other ones).
        if (state.saved_global_batch != global_batch && strcmp(o.on_resize, "keep_batch") == 0) {
            long per_micro_step = (long)o.batch_size * world;
            if (state.saved_global_batch % per_micro_step != 0)
                usage_error("--on_resize keep_batch: the checkpoint's global batch of %ld windows is not a multiple of "
                            "--batch_size %d x %d rank%s", state.saved_global_batch, o.batch_size, world, world == 1 ? "" : "s");
            int was = o.accum_steps;
            o.accum_steps = (int)(state.saved_global_batch / per_micro_step);
            global_batch = (int)state.saved_global_batch;
            free(offsets);
            offsets = xmalloc((size_t)global_batch * sizeof(long));
            flops_per_iter = gpt_flops_per_token(model, o.block_size) * global_batch * o.block_size;
            print0("--on_resize keep_batch: the checkpoint's global batch of %d windows, saved on %d rank%s, as %d per "
                   "rank x %d micro-steps x %d rank%s (--accum_steps %d, was %d): the uninterrupted run's steps\n",
                   global_batch, state.saved_world_size, state.saved_world_size == 1 ? "" : "s", o.batch_size, o.accum_steps, world,
                   world == 1 ? "" : "s", o.accum_steps, was);
        } else if (state.saved_global_batch != global_batch && strcmp(o.on_resize, "scale_lr") == 0) {
            state.lr_scale *= (double)global_batch / (double)state.saved_global_batch;
            print0("--on_resize scale_lr: the global batch goes from %ld windows (%d rank%s) to %d (%d): the learning "
                   "rate x %g, %g (min_lr %g), %g times --learning_rate since the run began\n", state.saved_global_batch,
                   state.saved_world_size, state.saved_world_size == 1 ? "" : "s", global_batch, world,
                   (double)global_batch / (double)state.saved_global_batch, o.learning_rate * state.lr_scale,
                   o.min_lr * state.lr_scale, state.lr_scale);
        }
        state.global_batch = global_batch;  // what this run's checkpoints say it takes
        schedule.lr = o.learning_rate * state.lr_scale, schedule.min_lr = o.min_lr * state.lr_scale;
    }
    Tracking *run = tracking_start(&o.tracking, "day5/19_gpt.c", device_name(device), state.mlflow_run_id, args_values());  // mlflow.start_run(run_id=...); log_params
    snprintf(state.mlflow_run_id, sizeof state.mlflow_run_id, "%s", tracking_run_id(run));
    for (int i = 0; i < losses.n; i++) tracking_log_metric(run, "loss", losses.loss[i], i);
    int n_evals = o.max_iters / o.eval_interval + 2;
    float *eval_steps = xmalloc((size_t)n_evals * sizeof(float)), *train_evals = xmalloc((size_t)n_evals * sizeof(float));
    float *val_evals = xmalloc((size_t)n_evals * sizeof(float));
    int evals = 0;
    double train_seconds = 0.0;
    long tokens_per_iter = (long)global_batch * o.block_size;
    // Each iteration's loss stays on the GPU until the host prints it (step_losses.h; nanoGPT reads
    // loss.item() only at its log interval too): no iteration waits for it. The printed time is the
    // mean of the iterations since the last print, which on a GPU includes the wait for those queued:
    // the hand-overs come before an evaluation (which reads the GPU too) and a save, so that each
    // wait falls in an iteration's time.
    enum { PRINT_EVERY = 10 };
    StepLosses pending = step_losses_new(PRINT_EVERY, device);
    double print_seconds = 0.0;  // the iterations' since the last print
    int since_print = 0;

    // (A checkpoint past --max_iters, a run resumed with fewer iterations than it saved: evaluated
    // once, nothing trained.)
    for (int iter = first_iter;; iter++) {
        if (iter % o.eval_interval == 0 || iter >= o.max_iters) {
            double train_loss = estimate_loss(model, &text, SPLIT_TRAIN, &eval_rng, &o, offsets, inputs, targets);
            double val_loss = estimate_loss(model, &text, SPLIT_VAL, &eval_rng, &o, offsets, inputs, targets);
            char what[64];
            snprintf(what, sizeof what, "the train loss at iteration %d", iter);
            check_result_finite(train_loss, what, 0, run);  // (the same on every rank: allreduced)
            snprintf(what, sizeof what, "the val loss at iteration %d", iter);
            check_result_finite(val_loss, what, 0, run);
            print0("step %d: train loss %.4f, val loss %.4f\n", iter, train_loss, val_loss);
            tracking_log_metric(run, "train_loss", train_loss, iter);
            tracking_log_metric(run, "val_loss", val_loss, iter);
            eval_steps[evals] = (float)iter, train_evals[evals] = (float)train_loss, val_evals[evals++] = (float)val_loss;
        }
        if (iter >= o.max_iters) break;
        double start = wall_seconds();
        double lr = lr_at(&schedule, iter);
        // One global batch of windows; this rank's micro-steps take its slices.
        char_text_draw_offsets(&train_rng, text.n_train, o.block_size, global_batch, offsets);
        gpt_zero_grad(model);                                 // optimizer.zero_grad(set_to_none=True)
        for (int m = 0; m < o.accum_steps; m++) {
            ddp_set_sync(&ddp, m == o.accum_steps - 1);       // model.require_backward_grad_sync
            char_text_windows(&text, SPLIT_TRAIN, offsets + (size_t)(rank * o.accum_steps + m) * o.batch_size,
                              o.batch_size, o.block_size, inputs, targets);
            // The dropout masks of micro-batch (iteration, slice), whatever rank draws them: so that
            // W ranks draw the masks of 1 rank's W micro-steps (and the twin, torch.manual_seed, the same).
            int slice = rank * o.accum_steps + m, slices = o.accum_steps * world;
            gpt_seed_dropout(model, ((uint64_t)o.seed << 32) + (1ULL << 31) + (uint64_t)iter * slices + slice);
            gpt_forward(model, inputs, o.batch_size, o.block_size);   // logits, loss = model(X, Y)
            gpt_loss_to(model, targets, step_losses_next_share(&pending, 1.0f, m == 0));  // (the micro-steps' sum)
            gpt_scale_loss(model, 1.0f / (float)o.accum_steps);      // loss = loss / gradient_accumulation_steps
            gpt_backward(model, ddp_grad_ready, &ddp);                // loss.backward(): buckets start here
        }
        ddp_finish(&ddp);                                     // every gradient the mean over ranks
        if (o.grad_clip > 0) clip_grad_norm_queued(model->params, model->n_params, o.grad_clip);  // (the norm stays on the GPU)
        adamw_step(&optimizer, lr);                           // optimizer.step()
        // loss.item(): at once on a CPU; on a GPU the iterations' losses since the last hand-over, when
        // the host prints one, saves a checkpoint (which keeps them) or ends.
        bool print = iter % PRINT_EVERY == 0 || iter == o.max_iters - 1;
        bool save_now = o.checkpoint && o.save_every > 0 && (iter + 1) % o.save_every == 0;
        float *taken;
        int n_taken = step_losses_take_all(&pending, print || save_now || (iter + 1) % o.eval_interval == 0, &taken);
        dist_allreduce_sum(taken, (size_t)n_taken);          // for the log: each iteration's loss of the global batch
        float loss = 0.0f;
        for (int i = 0; i < n_taken; i++) {
            loss = taken[i] / (float)(o.accum_steps * world);
            check_loss_finite(loss, losses.n + 1, 0, run);    // the sum above spread any nan to every rank
            tracking_log_metric(run, "loss", loss, losses.n);
            loss_log_add(&losses, 0, loss);
        }
        double seconds = wall_seconds() - start;
        train_seconds += seconds;
        print_seconds += seconds, since_print++;
        if (print) {
            double mean = print_seconds / since_print;  // per iteration, since the last print
            print0("iter %d: loss %.4f, lr %.2e, %.1f ms, %.0f tokens/s, MFU %.1f%%\n", iter, loss, lr, 1e3 * mean,
                   tokens_per_iter / mean, 100.0 * flops_per_iter / world / mean / peak);
            print_seconds = 0.0, since_print = 0;
        }
        // Where the run stands: the generators as the next iteration will find them (before its evaluation).
        state.step = iter + 1, state.generator = train_rng, state.eval_generator = eval_rng;
        if (save_now) {
            check_weights_finite(model->params, model->n_params, state.step, 0, run);  // never a NaN checkpoint over a good one
            sharded_checkpoint_save_step(o.async_save ? &in_flight : NULL, o.checkpoint, o.keep, save_errors_continue, saved.piece,
                                         saved.n, &state);
        }
    }
    int taken = o.max_iters - first_iter;  // by this run (a resumed one took the others before)
    if (taken > 0)
        print0("training: %d iterations in %.2f s, %.0f tokens/s, MFU %.1f%%\n", taken, train_seconds,
               (double)taken * tokens_per_iter / train_seconds, 100.0 * taken * flops_per_iter / world / train_seconds / peak);
    print_memory(model, o.batch_size);
    check_weights_finite(model->params, model->n_params, o.max_iters, 0, run);  // the last step's update
    bool end_saved = true;  // false: the last step's checkpoint failed twice (--save_errors continue)
    // The end of training saved, where no --save_every save holds it (--async_save: the one in flight finished first).
    if (o.checkpoint && first_iter >= o.max_iters)
        print0("Nothing left to train: the checkpoint is at step %d (--max_iters %d)\n", first_iter, o.max_iters);
    else if (o.checkpoint)
        end_saved = sharded_checkpoint_save_last(&in_flight, o.checkpoint, o.keep, save_errors_continue, saved.piece,
                                                 saved.n, &state);
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    if (o.max_iters > 0) print0("DDP: %s\n", overlap);
    print_rank("parameter checksum %016llx\n", params_checksum(model->params, model->n_params));

    if (rank == 0 && o.sample > 0) {
        Rng sample_rng;
        rng_seed(&sample_rng, (uint64_t)o.seed + 2);  // (the dropout's seeds are above 2^31)
        print0("sample (%d characters, temperature %g, top_k %d):\n", o.sample, o.temperature, o.top_k);
        sample_text(model, &text, prompt, prompt_length, &o, &sample_rng);
    }
    if (rank == 0 && o.losses) loss_log_write_csv(&losses, o.losses);
    if (rank == 0 && o.save) {
        int n_state;
        Param *state_dict = gpt_state_dict(model, &n_state);
        h5_save_params(o.save, state_dict, n_state);
        free(state_dict);
    }
    if (rank == 0 && o.plot && *o.plot && losses.n > 0) {
        float *steps = xmalloc((size_t)losses.n * sizeof(float));
        for (int i = 0; i < losses.n; i++) steps[i] = (float)i;
        PlotSeries series[] = {
            {.label = "train loss (each iteration)", .x = steps, .y = losses.loss, .n = losses.n},
            {.label = "train loss (evaluation)", .x = eval_steps, .y = train_evals, .n = evals},
            {.label = "validation loss (evaluation)", .x = eval_steps, .y = val_evals, .n = evals},
        };
        char title[96];
        snprintf(title, sizeof title, "Step 19: GPT on Tiny Shakespeare, %d rank%s", world, world == 1 ? "" : "s");
        PlotSpec spec = {.title = title, .xlabel = "iteration", .ylabel = "loss"};
        plot_png(o.plot, &spec, series, 3);
        free(steps);
        print0("Loss curves: %s\n", o.plot);
    }
    tracking_log_artifact(run, o.losses);
    tracking_log_artifact(run, o.save);
    tracking_log_artifact(run, o.plot);
    tracking_end(run, TRACKING_FINISHED);

    free(eval_steps), free(train_evals), free(val_evals);
    free(offsets), free(inputs), free(targets), free(prompt);
    loss_log_free(&losses);
    step_losses_free(&pending);
    checkpoint_pieces_free(&wanted), checkpoint_pieces_free(&saved), free(boxes);
    adamw_free(&optimizer);
    ddp_free(&ddp);
    gpt_free(model);
    char_text_free(&text);
    sharded_checkpoint_check_end_saved(end_saved, o.checkpoint);  // the outputs written: exit 1 if the end is not checkpointed
    dist_finalize();
    return 0;
}
