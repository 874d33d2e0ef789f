// Step 20: step 19's GPT split three ways at once: data x tensor x pipeline parallelism.
//                                   PyTorch twin: Megatron-LM's and picotron's 3D grid
//                                   (picotron's process_group_manager.py, tensor_parallel.py,
//                                   pipeline_parallel.py, data_parallel.py)
//
// What it changes from step 19 (diff the two files): the world is a grid of D x T x P ranks
// (--dp D --tp T --pp P), rank = (replica x P + stage) x T + tensor-parallel rank, tensor-parallel
// ranks neighbours (they talk at every block: on one node, over NVLink), pipeline stages next,
// replicas outermost (they talk once a step). Each rank holds a part of the model
// (common/models/gpt.h's gpt_new_part):
//   - tensor parallelism (step 17's, on a transformer block as Megatron-LM splits it): c_attn
//     column-parallel by heads (each rank computes the q, k, v of n_head / T heads and their
//     attention, all local), attn.c_proj row-parallel (its T partial sums allreduced: g), mlp.c_fc
//     column- and mlp.c_proj row-parallel alike; in backward the gradient of each column-parallel
//     Linear's input allreduced (f). LayerNorms, the row-parallel biases, the embeddings and the
//     head are whole on every rank of the group, their gradients the same on each (computed from
//     the same allreduced values). With --sp (Megatron-LM's sequence parallelism) the LayerNorms
//     and residuals are cut along the tokens instead (rank t of T holds 1/T of each micro-batch's
//     tokens there): g's allreduce becomes a reduce-scatter onto each rank's tokens, and an
//     all-gather of the LayerNorm's output comes before each column-parallel Linear (in backward
//     the reverse); the LayerNorms' gradients, each rank's from its tokens, are summed over the group;
//   - pipeline parallelism (step 16's): the n_layer blocks cut into P stages of n_layer / P, the
//     embeddings on the first, ln_f and the head on the last; each replica's batch cut into
//     --micro_batches M, run in --schedule gpipe|1f1b's order (common/parallel/schedule.h), each stage
//     holding the activations of as many micro-batches as its schedule has in flight (GPipe: all
//     M; 1F1B: min(P - s, M) on stage s, the memory 1F1B saves). The head
//     is tied to wte, which the first and the last stage both hold: after backward their two
//     gradients are summed, as Megatron's embedding group does, so both take the same step;
//   - data parallelism (step 19's DDP, over the D ranks that hold the same part).
// The gradients' norm for clipping is summed over a replica's T x P ranks, each tensor counted
// once. The data are step 19's: one global batch of batch_size x accum_steps x D windows a step,
// replica d's micro-step a taking slice d x accum_steps + a, so D x T x P ranks take the steps of
// step 19 on D ranks. --init and --save are the whole model in step 19's state_dict names,
// whatever the grid: each rank cuts its part from the whole model, and the parts are summed back
// into it at the end (each value owned by one rank of the replica) for the checksum, --save and
// the sample. --recompute is activation checkpointing per block (Megatron's full recomputation):
// forward keeps each block's output per micro-batch and one micro-batch's block inside, shared;
// backward redoes each block's forward just before its backward (the same losses, bit for bit,
// about a third more of the blocks' FLOPs); the memory table shows what it holds, and without it.
// --checkpoint DIR saves sharded checkpoints (step 18's module, common/records/sharded_checkpoint.h):
// each rank writes its boxes of step 19's state_dict tensors and of AdamW's moments, no rank
// gathers anything, and any grid resumes them, step 19 too (and step 20 resumes step 19's).
//
// Build and run:
//   make day5/20_gpt_3d && make shakespeare
//   mpirun -np 2 day5/20_gpt_3d --tp 2 --accum_steps 2 --max_iters 50 --eval_interval 50 --sample 0 --plot ''   (add --oversubscribe on fewer cores)
//   mpirun -np 4 day5/20_gpt_3d --dp 2 --pp 2 --micro_batches 4 --schedule 1f1b
//   mpirun -np 8 day5/20_gpt_3d --dp 2 --tp 2 --pp 2 --zero 1    # on a node of 8 GPUs: NCCL in every group
//   mpirun -np 4 day5/20_gpt_3d --tp 2 --pp 2 --save_every 100 --checkpoint checkpoints/gpt3d   # stop it, resume on any grid
//
// Expected output (the first, 2 ranks on 2 cores; times vary): step 19's losses with --accum_steps 2
// on 1 rank (day5/README.md shows them), and the grid, rank by rank; day5/README.md, step 20, shows more.
//   Step 20: a GPT on 2 ranks, 1 replica x 2 tensor-parallel x 1 pipeline stage: 4 layers, 4 heads, 128 wide, context 64, vocabulary 65: 0.80M parameters (795904, and 8192 in wpe)
//   ...
//   rank 0: replica 0, stage 0 (blocks 0-3, embeddings, ln_f and head), tensor-parallel rank 0: heads 0-1, MLP columns 0-255
//   rank 1: replica 0, stage 0 (blocks 0-3, embeddings, ln_f and head), tensor-parallel rank 1: heads 2-3, MLP columns 256-511
//   ...
//   iter 40: loss 3.0713, ...
//   iter 49: loss 2.8742, ...
//   step 50: train loss 2.8581, val loss 2.8750
//   ...
//   [rank 0] parameter checksum aa7599618f277e3b (the whole model, from replica 0's 2 ranks)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // xmalloc, usage_error
#include "base/quote.h"             // QUOTE, PATH_SHOWN: a flag's value in a message; escape_lines: the sample
#include "base/timer.h"             // wall_seconds
#include "comm/collectives.h"       // group_all_reduce, group_exchange: the tied embedding, stage to stage
#include "comm/group.h"             // group_split, group_gather_figures: the grid's groups, the per-rank table
#include "data/char_text.h"         // CharText, the windows: the data
#include "models/adamw.h"           // AdamW, clip_grad_norm_split: nanoGPT's optimizer step, over the parts
#include "models/gpt.h"             // Gpt, gpt_new_part, gpt_stage_forward, gpt_stage_backward: the model and its parts
#include "parallel/ddp.h"           // ddp_wrap_group, ddp_grad_ready, ddp_finish, ddp_set_sync: DDP per part
#include "parallel/schedule.h"      // Schedule: each stage's forwards and backwards, in order
#include "parallel/stage_timer.h"   // StageTimer: each action's compute and the idle time, on the GPU's clock there
#include "parallel/zero1.h"         // Zero1, zero1_step: AdamW's moments sharded over the replicas (--zero 1)
#include "records/h5.h"             // h5_load_params, h5_save_params: weights as HDF5 (--init, --save)
#include "records/loss_log.h"       // loss_log_add, loss_log_write_csv: the loss of every iteration
#include "records/plot.h"           // plot_png: the train and validation curves
#include "records/sharded_checkpoint.h"  // sharded_checkpoint_save_step, _resume: each rank its boxes, any grid resumes
#include "records/tracking.h"       // tracking_start, tracking_log_metric: the run in MLflow (--mlflow)
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "tensor/flops.h"           // sgemm_peak_flops: the yardstick of MFU
#include "train/divergence.h"       // check_loss_finite, check_weights_finite: a nan or inf stops the run, on every rank
#include "train/lr_schedule.h"      // lr_at: warm-up, then cosine decay
#include "train/step_losses.h"      // step_losses_take_all: each iteration's loss, read when the host prints it

typedef struct {
    const char *data, *init, *save, *losses, *plot, *device, *dtype, *dropout_rng, *prompt, *schedule, *checkpoint, *save_errors, *on_resize;
    int n_layer, n_head, n_embd, block_size, batch_size, bias;
    double dropout;
    int max_iters, warmup_iters, lr_decay_iters, accum_steps, eval_interval, eval_iters, seed, threads, sample, top_k;
    double learning_rate, min_lr, weight_decay, beta1, beta2, grad_clip, bucket_mb, temperature;
    int dp, tp, pp, micro_batches, zero, recompute, sp;
    int save_every, keep, async_save;
    TrackingOptions tracking;
} Options;

// Where this rank sits in the grid, and the groups it talks in.
typedef struct {
    int replica, stage, tp_rank;  // d, p, t: rank = (d P + p) T + t
    int stages;
    Group tensor_parallel;        // my replica's and stage's T ranks: f and g, every block
    Group pipeline;               // my replica's P stages of my tensor-parallel rank: activations and their gradients
    Group data_parallel;          // the D ranks that hold my part: DDP
    Group model;                  // my replica's T x P ranks: the gradients' norm, the whole model
    Group embedding;              // the first and the last stage (P > 1): the tied wte's gradient
    int activation_slots;         // the micro-batches whose activations my stage holds at once (its schedule's)
} Grid;

// The grid's groups whose traffic a training step has, in the order of the traffic table.
enum { GROUP_TENSOR_PARALLEL, GROUP_PIPELINE, GROUP_DATA_PARALLEL, GROUP_EMBEDDING, GRID_GROUPS };
static const Group *grid_group(const Grid *grid, int which) {
    const Group *groups[GRID_GROUPS] = {&grid->tensor_parallel, &grid->pipeline, &grid->data_parallel, &grid->embedding};
    return groups[which];
}

// What one training step sends over each group, in theory (group.h's GroupTraffic: the calls
// and the bytes of each kind this rank sends), from the grid and the flags alone: per micro-step of
// N = B T tokens in M micro-batches, a stage of L_s blocks, split T ways (S = T with --sp, else 1),
// each block's forward done F = 1 times (2 with --recompute, whose backward redoes it).
static void traffic_theory(const Gpt *model, const Options *o, const Ddp *ddp, GroupTraffic theory[GRID_GROUPS]) {
    const double A = o->accum_steps, M = o->micro_batches, Ls = model->n_blocks, C = model->config.n_embd;
    const double N = (double)o->batch_size * o->block_size, Tp = o->tp, S = o->sp ? Tp : 1, F = o->recompute ? 2 : 1;
    const double first = model->has_embeddings, last = model->has_head, D = o->dp, floats = 4;
    for (int g = 0; g < GRID_GROUPS; g++) theory[g] = (GroupTraffic){0};
    GroupTraffic *tp = &theory[GROUP_TENSOR_PARALLEL];
    const double tp_share = (Tp - 1) / Tp;
    if (Tp > 1 && !o->sp) {  // g after each row-parallel Linear (each forward), f before each column-parallel one
        tp->calls[TRAFFIC_ALL_REDUCE] = A * M * (2 * Ls * F + 2 * Ls);
        tp->bytes[TRAFFIC_ALL_REDUCE] = A * (2 * Ls * F + 2 * Ls) * 2 * tp_share * floats * N * C;
    } else if (Tp > 1) {
        // Forward: per block 2 all-gathers and 2 reduce-scatters, and the head's all-gather of ln_f;
        // backward: per block 4 all-gathers (d c_proj's output, the LayerNorm's output again) and 2
        // reduce-scatters (f), the embeddings' all-gather of d x; the LayerNorms' [2, C] gradients allreduced.
        tp->calls[TRAFFIC_REDUCE_SCATTER] = A * M * (2 * Ls * F + 2 * Ls);
        tp->bytes[TRAFFIC_REDUCE_SCATTER] = A * (2 * Ls * F + 2 * Ls) * tp_share * floats * N * C;
        tp->calls[TRAFFIC_ALL_GATHER] = A * M * (2 * Ls * F + 4 * Ls + last + first);
        tp->bytes[TRAFFIC_ALL_GATHER] = A * (2 * Ls * F + 4 * Ls + last + first) * tp_share * floats * N * C;
        tp->calls[TRAFFIC_ALL_REDUCE] = A * M * (2 * Ls + last);
        tp->bytes[TRAFFIC_ALL_REDUCE] = A * M * (2 * Ls + last) * 2 * tp_share * floats * 2 * C;
    }
    if (o->pp > 1) {  // each micro-batch's output on to the next stage, its gradient back: N C / S floats
        GroupTraffic *pipe = &theory[GROUP_PIPELINE];
        pipe->calls[TRAFFIC_SEND] = A * M * (!last + !first);
        pipe->bytes[TRAFFIC_SEND] = A * (!last + !first) * floats * N * C / S;
    }
    if (D > 1) {  // DDP's buckets, once a step; with --zero 1 each tensor's blocks all-gathered after AdamW
        GroupTraffic *dp = &theory[GROUP_DATA_PARALLEL];
        dp->calls[TRAFFIC_ALL_REDUCE] = ddp->n_buckets;
        dp->bytes[TRAFFIC_ALL_REDUCE] = 2 * (D - 1) / D * floats * (double)gpt_num_params(model, false);
        if (o->zero == 1) {
            double gathered = 0;
            for (int i = 0; i < model->n_params; i++) gathered += D * ceil((double)tensor_numel(model->params[i].value) / D);
            dp->calls[TRAFFIC_ALL_GATHER] = model->n_params;
            dp->bytes[TRAFFIC_ALL_GATHER] = (D - 1) / D * floats * gathered;
        }
    }
    if (o->pp > 1 && (first || last)) {  // the tied wte's two gradients summed, once a step
        theory[GROUP_EMBEDDING].calls[TRAFFIC_ALL_REDUCE] = 1;
        theory[GROUP_EMBEDDING].bytes[TRAFFIC_ALL_REDUCE] = floats * model->config.vocab_size * C;
    }
}

// The last training step's traffic beside traffic_theory's, each rank checking its own (a
// collective the theory does not have, or one missing, stops the run), and a table of every rank's.
static void print_traffic(const Gpt *model, const Options *o, const Ddp *ddp, const GroupTraffic measured[GRID_GROUPS]) {
    GroupTraffic theory[GRID_GROUPS];
    traffic_theory(model, o, ddp, theory);
    double mine[GRID_GROUPS] = {0};
    for (int g = 0; g < GRID_GROUPS; g++)
        for (int k = 0; k < TRAFFIC_KINDS; k++) {
            CHECK(measured[g].calls[k] == theory[g].calls[k] &&
                  fabs(measured[g].bytes[k] - theory[g].bytes[k]) <= 1e-9 * theory[g].bytes[k],
                  "the traffic disagrees with its theory: group %d, %s: %.0f calls, %.0f bytes (theory: %.0f, %.0f)", g,
                  traffic_kind_name(k), measured[g].calls[k], measured[g].bytes[k], theory[g].calls[k], theory[g].bytes[k]);
            mine[g] += measured[g].bytes[k];
        }
    print0("communication per training step, each rank's sends as a ring algorithm makes them (an all-reduce of b "
           "bytes 2 (n - 1) / n b, a reduce-scatter or an all-gather (n - 1) / n b), counted and checked against the "
           "theory (N = B T = %d tokens a micro-step, %d micro-step%s):\n", o->batch_size * o->block_size, o->accum_steps,
           o->accum_steps == 1 ? "" : "s");
    if (o->tp > 1 && !o->sp)
        print0("  tensor-parallel  %s all-reduces of N C floats a micro-step (g in forward, f in backward%s)\n",
               o->recompute ? "6 L_s" : "4 L_s", o->recompute ? ", g again in --recompute's second forward" : "");
    if (o->tp > 1 && o->sp)
        print0("  tensor-parallel  %s reduce-scatters and %s + [first] + [last] all-gathers of N C floats a micro-step, "
               "and 2 L_s + [last] all-reduces of 2 C a micro-batch (the LayerNorms' gradients)%s\n",
               o->recompute ? "6 L_s" : "4 L_s", o->recompute ? "8 L_s" : "6 L_s",
               o->recompute ? " (--recompute's second forward: 2 L_s of each more)" : "");
    if (o->pp > 1)
        print0("  pipeline         N C %s floats sent on and N C %s back a micro-step (not from the last stage, not from the first)\n",
               o->sp ? "/ T" : "", o->sp ? "/ T" : "");
    if (o->dp > 1)
        print0("  data-parallel    an all-reduce of the part's P_r gradients a step (DDP's buckets)%s\n",
               o->zero == 1 ? ", an all-gather of its P_r weights (ZeRO-1)" : "");
    if (o->pp > 1) print0("  embedding        an all-reduce of the tied wte's V C gradients a step (the first and the last stage)\n");
    print0("  rank  tensor-parallel MB  pipeline MB  data-parallel MB  embedding MB\n");
    for (int g = 0; g < GRID_GROUPS; g++) mine[g] /= 1e6;
    double *all = group_gather_figures(group_world(), mine, GRID_GROUPS, false);
    for (int r = 0; all && r < dist_world_size(); r++)
        print0("  %4d  %18.3f  %11.3f  %16.3f  %12.3f\n", r, all[GRID_GROUPS * r], all[GRID_GROUPS * r + 1],
               all[GRID_GROUPS * r + 2], all[GRID_GROUPS * r + 3]);
    free(all);
}

// One micro-step of a replica through the pipeline: its batch of B windows in M micro-batches,
// each stage running its schedule's list; before each action, one exchange with the neighbouring
// stages (what the last action produced goes out, what this one needs comes in), as step 16 does.
// With `train` false, forwards only, in order (evaluation). The last stage's losses: with `losses`,
// each micro-batch's mean loss added to the iteration's there (`starts_iteration`: this micro-step is its first;
// on a GPU it stays there) and 0 returned; without, their sum returned (the host waits for it).
// With a `timer` (P > 1), each action's compute and the step timed (stage_timer.h: on a GPU, on its
// own clock, never waited for). Nothing here waits for the GPU: a caller that goes on to the host's
// collectives first waits for its queued work (what another stage waits for includes its sends; a
// GPU runs them by itself, tests/fake_gpu only when waited for).
static double pipeline_step(Gpt *model, const Grid *grid, const Schedule *schedule, const int *inputs, const int *targets,
                            int B, int T, float factor, bool train, bool sync, Ddp *ddp, StageTimer *timer,
                            StepLosses *losses, bool starts_iteration) {
    const int M = schedule->micro_batches, Bm = B / M;
    const bool first = grid->stage == 0, last = grid->stage == grid->stages - 1;
    const Action *actions = schedule_actions(schedule, grid->stage);
    P2pSend send = {0};
    int n_send = 0;
    double loss = 0.0;
    Tensor received;
    if (timer) stage_timer_step_start(timer);
    for (int k = 0; k < (train ? 2 * M : M); k++) {
        Action action = train ? actions[k] : (Action){ACTION_FORWARD, k};
        const int i = action.micro_batch, offset = i * Bm * T;
        // Micro-batch i's activations in slot i mod slots: the micro-batches in flight on a stage are
        // consecutive (forwards and backwards each in order), never more than the slots, so never two in one.
        const int slot = i % grid->activation_slots;
        const bool forward = action.kind == ACTION_FORWARD;
        P2pReceive receive = {0};
        int n_receive = 0;
        if (forward && !first) received = gpt_stage_input(model, slot, Bm, T), receive = (P2pReceive){&received, grid->stage - 1}, n_receive = 1;
        if (!forward && !last) received = gpt_stage_grad_output(model, Bm, T), receive = (P2pReceive){&received, grid->stage + 1}, n_receive = 1;
        if (n_send + n_receive > 0) group_exchange(&grid->pipeline, &send, n_send, &receive, n_receive);
        n_send = 0;
        if (timer) stage_timer_compute_start(timer, k);  // (on a GPU, marked once what came in is there)
        if (forward) {
            const Tensor *out = gpt_stage_forward(model, slot, i, inputs + offset, Bm, T);  // logits, loss = model(X, Y)
            if (last && losses)
                gpt_stage_loss_to(model, slot, targets + offset, Bm, T, factor,
                                  step_losses_next_share(losses, 1.0f, starts_iteration && i == 0));  // (the iteration's sum)
            else if (last)
                loss += gpt_stage_loss(model, slot, targets + offset, Bm, T, factor);
            else send = (P2pSend){out, grid->stage + 1}, n_send = 1;
        } else {
            // DDP averages this part's gradients over its replicas in the last micro-batch's backward
            // of the last micro-step (model.no_sync() for the others).
            ddp_set_sync(ddp, sync && i == M - 1);
            const Tensor *grad_input = gpt_stage_backward(model, slot, Bm, T, ddp_grad_ready, ddp);
            if (!first) send = (P2pSend){grad_input, grid->stage - 1}, n_send = 1;
        }
        if (timer) stage_timer_compute_end(timer, k, forward);
    }
    if (n_send) group_exchange(&grid->pipeline, &send, n_send, NULL, 0);  // the last action's output
    if (timer) stage_timer_step_end(timer, false);
    return loss;
}

// The loss that the ranks of a replica's last stage (its tensor-parallel rank 0) hold, summed over
// the world: every rank learns the global batch's.
static double loss_over_world(const Grid *grid, double loss) {
    float mine = grid->stage == grid->stages - 1 && grid->tp_rank == 0 ? (float)loss : 0.0f;
    dist_allreduce_sum(&mine, 1);
    return mine;
}

// estimate_loss(): the mean loss over eval_iters global batches of the split, each replica
// evaluating its slice (as in training), in micro-steps of batch_size through its pipeline; no gradients.
static double estimate_loss(Gpt *model, const Grid *grid, const Schedule *schedule, const CharText *text,
                            TextSplit split, Rng *eval_rng, const Options *o, long *offsets, int *inputs, int *targets) {
    int per_replica = o->batch_size * o->accum_steps, global = per_replica * o->dp;
    double sum = 0.0;
    gpt_set_training(model, false);  // model.eval(): no dropout
    for (int k = 0; k < o->eval_iters; k++) {
        char_text_draw_offsets(eval_rng, char_text_split_length(text, split), o->block_size, global, offsets);
        for (int m = 0; m < o->accum_steps; m++) {
            char_text_windows(text, split, offsets + (size_t)(grid->replica * o->accum_steps + m) * o->batch_size,
                              o->batch_size, o->block_size, inputs, targets);
            sum += pipeline_step(model, grid, schedule, inputs, targets, o->batch_size, o->block_size, 1.0f, false,
                                 false, NULL, NULL, NULL, false) / o->micro_batches;
        }
    }
    gpt_set_training(model, true);   // model.train()
    device_synchronize();  // (every stage's queued work, before the host's collective: see pipeline_step)
    return loss_over_world(grid, sum) / ((double)o->eval_iters * o->accum_steps * o->dp);
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

// The whole model again, on the model group's rank 0 (a replica's stage 0, tensor-parallel rank 0):
// every rank of the replica puts the values it owns into a zeroed whole model and the group sums
// them, tensor by tensor (x + 0 is x: the sum is exact). Collective over the model group.
static void gather_whole(const Gpt *part, Gpt *whole, const Grid *grid) {
    for (int i = 0; i < whole->n_params; i++) tensor_fill(whole->params[i].value, 0.0f);
    gpt_part_to_whole(part, whole);
    for (int i = 0; i < whole->n_params; i++) {
        Tensor *t = whole->params[i].value;
        CHECK_MPI(MPI_Reduce(grid->model.rank == 0 ? MPI_IN_PLACE : t->data, t->data, (int)tensor_numel(t), MPI_FLOAT,
                             MPI_SUM, 0, grid->model.mpi));
    }
}

// The activations a rank keeps from forward for backward, in floats, for the B_h sequences whose
// activations its stage holds at once (all of a micro-step's with GPipe, min(P - s, M) micro-batches'
// with 1F1B: Grid's activation_slots), as the formulas of print_memory count them, with the
// token-wise regions split S ways (S = T with --sp, else 1) and with or without --recompute.
static double activation_formula(const Gpt *model, const Options *o, double S, bool recompute) {
    const GptConfig *c = &model->config;
    const double Ls = model->n_blocks, C = c->n_embd, V = c->vocab_size, T = c->block_size, Tp = o->tp;
    const double H = c->n_head, B = model->max_batch, N = B * T, Bm = (double)o->batch_size / o->micro_batches;
    const double ends = N * C / S + (model->has_head ? N * (C + 2 / S + 2 * V) : 0);  // the stage's input; ln_f, logits
    // Dropout's masks: the embeddings' on the first stage, and per block two on the token-wise rows and
    // attention's on this rank's heads (with its probabilities after it).
    const double embed_mask = c->dropout > 0 && model->has_embeddings ? N * C / S : 0, drop = c->dropout > 0 ? 1 : 0;
    // --recompute: each block's output (the next one's input) for every micro-batch held, and one
    // micro-batch's (B_m = batch_size / M) inside, shared by the blocks, in place of every block's
    // inside (its masks among it, drawn again).
    if (recompute)
        return N * Ls * C / S + ends + Bm * T * ((3 * C + 4) / S + 12 * C / Tp) + Bm * H / Tp * T * T + embed_mask +
               drop * 2 * Bm * T * (C / S + H / Tp * T);
    return N * Ls * ((4 * C + 4) / S + 12 * C / Tp) + ends + Ls * B * H / Tp * T * T + embed_mask +
           drop * 2 * Ls * B * T * (C / S + H / Tp * T);
}

// What a rank holds, each part beside its formula (L_s = n_layer / P blocks of its stage, C wide,
// V characters, T context, B windows per micro-step of its replica, H heads, split T_p = --tp ways;
// float32, 4 bytes each), and the rank's line in a table of every rank, on rank 0. With --recompute
// or --sp, what the same grid holds without them beside it.
static void print_memory(const Gpt *model, const Grid *grid, const Options *o, double adam_floats) {
    const GptConfig *c = &model->config;
    const double Ls = model->n_blocks, C = c->n_embd, V = c->vocab_size, T = c->block_size, Tp = o->tp;
    const double H = c->n_head, B = model->max_batch, Bm = (double)o->batch_size / o->micro_batches, S = o->sp ? Tp : 1;
    const bool first = model->has_embeddings, last = model->has_head, savings = o->recompute || o->sp;
    double params = Ls * (12 * C * C / Tp + 2 * C + (c->bias ? 7 * C / Tp + 4 * C : 0)) + (first || last ? V * C : 0) +
                    (first ? T * C : 0) + (last ? (c->bias ? 2 : 1) * C : 0);
    double activations = activation_formula(model, o, S, o->recompute), plain = activation_formula(model, o, 1, false);
    double held = (double)gpt_activation_floats(model);  // measured: what the model allocated
    // AdamW's moments: 2 P_r, or with --zero 1 2 x this rank's blocks of ceil(n / D) of every tensor, about 2 P_r / D.
    CHECK(params == (double)gpt_num_params(model, false) && activations == held &&
          (o->zero == 1 ? adam_floats <= 2 * params / o->dp + 2 * model->n_params : adam_floats == 2 * params),
          "the memory formulas disagree with the model: %.0f and %.0f floats", params, held);
    const char *without = o->recompute && o->sp ? "--recompute --sp" : o->recompute ? "--recompute" : "--sp";
    print0("memory per rank (float32; L_s = n_layer / P = %d blocks a stage, split T = %d ways; [first]: stage 0's "
           "embeddings, [last]: the last stage's ln_f and head; B: the windows whose activations a stage holds at once, "
           "batch_size / M for each micro-batch in flight (M of them with GPipe, min(P - s, M) with 1F1B); here %d on "
           "rank 0):\n"
           "  parameters   P_r = L_s (12 C^2 / T + 2 C)%s + [first or last] V C + [first] T C + [last] %sC\n"
           "  gradients    P_r;  AdamW: 2 P_r (exp_avg, exp_avg_sq)%s\n"
           "  activations  B T (L_s (4 C + 4 + 12 C / T) + C) + [last] B T (C + 2 + 2 V) + L_s B (H / T) T^2%s\n",
           model->n_blocks, o->tp, model->max_batch, c->bias ? " + L_s (7 C / T + 4 C)" : "", c->bias ? "2 " : "",
           o->zero == 1 ? ", / D with --zero 1 (each tensor's block of ceil(n / D) values)" : "",
           c->dropout > 0 ? " + dropout's masks B T C (2 L_s + [first]) + 2 L_s B (H / T) T^2" : "");
    const char *recomputed_masks = !(c->dropout > 0) ? ""
                                   : o->sp ? " + dropout's masks ([first] B + 2 B_m) T C / T + 2 B_m (H / T) T^2"
                                           : " + dropout's masks ([first] B + 2 B_m) T C + 2 B_m (H / T) T^2";
    if (o->sp)
        print0("  --sp         B T (L_s ((4 C + 4) / T + 12 C / T) + C / T) + [last] B T (C + 2 / T + 2 V) + L_s B (H / T) "
               "T^2%s: the LayerNorms, the residuals and the stage's input cut T = %d ways along the tokens\n",
               c->dropout > 0 ? " + dropout's masks B T C (2 L_s + [first]) / T + 2 L_s B (H / T) T^2" : "", o->tp);
    if (o->recompute)
        print0("  --recompute  B T (L_s C + C)%s + [last] B T (C + 2%s + 2 V) + B_m T (%s + 12 C / T) + B_m (H / T) T^2%s, "
               "B_m = %.0f, a micro-batch's windows: the blocks' outputs, one micro-batch's inside\n", o->sp ? " / T" : "",
               o->sp ? " / T" : "", o->sp ? "(3 C + 4) / T" : "3 C + 4", recomputed_masks, Bm);
    print0("  rank  replica  stage  tp  parameters MB  gradients MB  AdamW MB  activations MB  of which attention's");
    if (savings) print0("  without %s MB", without);
    print0("\n");
    double attention = o->recompute ? Bm * H / Tp * T * T : Ls * B * H / Tp * T * T;
    double mine[8] = {grid->replica, grid->stage, grid->tp_rank, 4 * params / 1e6, 4 * adam_floats / 1e6,
                      4 * held / 1e6, 4 * attention / 1e6, 4 * plain / 1e6};
    double *all = group_gather_figures(group_world(), mine, 8, false);
    for (int r = 0; all && r < dist_world_size(); r++) {
        const double *f = all + 8 * r;
        print0("  %4d  %7.0f  %5.0f  %2.0f  %13.2f  %12.2f  %8.2f  %14.2f  %20.2f", r, f[0], f[1], f[2], f[3], f[3],
               f[4], f[5], f[6]);
        if (savings) print0("  %*.2f", (int)strlen(without) + 12, f[7]);
        print0("\n");
    }
    if (all && savings) {
        double most = 0, most_without = 0;
        for (int r = 0; r < dist_world_size(); r++) most = fmax(most, all[8 * r + 5]), most_without = fmax(most_without, all[8 * r + 7]);
        print0("%s: activations held at most %.2f MB a rank, %.2f MB without (%.0f%% less)", without, most, most_without,
               100.0 * (1.0 - most / most_without));
        if (o->recompute) print0(", for one more forward of the blocks in backward (about +%.0f%% of the blocks' FLOPs)", 100.0 / 3.0);
        if (o->sp) print0("; per block, forward's collectives move the bytes of the allreduces they replace (a reduce-scatter "
                          "and an all-gather each), backward's half more (each LayerNorm's output all-gathered again, not kept)");
        print0("\n");
    }
    free(all);
}

// Each stage's idle share of the training steps' pipeline (replica 0's tensor-parallel rank 0's
// stages), beside what the schedule predicts when replayed with the stages' measured times
// (common/parallel/schedule.h) and the textbook's bubble of equal stages. Collective over the world.
static void print_idle(const Grid *grid, const Schedule *schedule, const StageTimes *times, double micro_steps) {
    const int P = schedule->stages, M = schedule->micro_batches;
    double per_micro = 1.0 / (micro_steps * M);
    double mine[3] = {times->forward * per_micro, times->backward * per_micro, times->all ? times->idle / times->all : 0};
    double *all = group_gather_figures(&grid->pipeline, mine, 3, true);  // every stage of the pipeline replays it
    double *forward = xmalloc((size_t)P * sizeof(double)), *backward = xmalloc((size_t)P * sizeof(double));
    for (int p = 0; p < P; p++) forward[p] = all[3 * p], backward[p] = all[3 * p + 1];
    Replay replay;
    char why[256];
    CHECK(schedule_replay(schedule, forward, backward, &replay, why, sizeof why), "schedule replay: %s", why);
    print0("pipeline (replica 0, tensor-parallel rank 0): %s, %d micro-batch%s; the bubble of equal stages: (P - 1) / "
           "(M + P - 1) = %.0f%%\n  stage  forward ms  backward ms  idle  predicted (the schedule replayed with these times)\n",
           schedule_kind_name(schedule->kind), M, M == 1 ? "" : "es", 100 * schedule_bubble(P, M));
    for (int p = 0; p < P; p++)
        print0("  %5d  %10.2f  %11.2f  %3.0f%%  %8.0f%%\n", p, 1e3 * forward[p], 1e3 * backward[p], 100 * all[3 * p + 2],
               100 * fmax(replay.idle_share[p], 0.0));  // (not "-0%" from rounding)
    replay_free(&replay);
    free(all), free(forward), free(backward);
}

// This rank's pieces of a sharded checkpoint (records/sharded_checkpoint.h): its boxes of step
// 19's state_dict and of AdamW's moments ("optimizer/exp_avg/<name>"), so that either step resumes
// the other's checkpoints, under any grid. A part's tensor is 1 box of its whole tensor, or 3 for
// c_attn's (gpt_param_boxes). Loading (saving false), a rank reads every element it holds.
// Saving, each element goes in one file: a tensor that a tensor-parallel group holds alike is
// written by its rank 0, the tied wte by the first stage (gpt_owns); the D replicas of a part each
// write 1/D of its elements, and with --zero 1 each its own block of the moments (zero1.h).
static CheckpointPieces checkpoint_pieces(const Gpt *model, const Grid *grid, const AdamW *adamw, const Zero1 *zero,
                                          bool saving) {
    static const char *const prefixes[3] = {"", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
    const int n_params = model->n_params, d = grid->data_parallel.rank, D = grid->data_parallel.size;
    CheckpointPieces list = {.piece = xcalloc((size_t)n_params * 3 * 3 * 3, sizeof(CheckpointPiece)),  // states, boxes, runs
                             .names = xcalloc((size_t)n_params * 3, sizeof *list.names)};
    for (int i = 0; i < n_params; i++) {
        if (saving && !gpt_owns(model, i)) continue;
        const GptParamBoxes boxes = gpt_param_boxes(model, i);
        const size_t n = tensor_numel(model->params[i].value);
        const Tensor *states[3] = {model->params[i].value, &adamw->adam.exp_avg[i], &adamw->adam.exp_avg_sq[i]};
        for (int k = 0; k < 3; k++) {
            // The run [first, end) of the part's elements this state's piece covers, from element `held` on in its tensor.
            size_t first = 0, end = n, held = 0;
            if (k > 0 && zero) held = first = zero->block[i] * d, end = first + zero->block[i] < n ? first + zero->block[i] : n;
            else if (saving) first = n * d / D, end = n * (d + 1) / D;
            char *name = list.names[3 * i + k];
            snprintf(name, sizeof *list.names, "%s%s", prefixes[k], model->params[i].name);
            size_t box_first = 0;  // the box's first element in the part's tensor
            for (int b = 0; b < boxes.n_boxes; b++) {
                size_t size = (size_t)(boxes.count[b][0] * boxes.count[b][1]);
                size_t lo = first > box_first ? first : box_first, hi = end < box_first + size ? end : box_first + size;
                if (lo < hi) {
                    const long long vector_offset[2] = {boxes.offset[b][1], 0}, vector_count[2] = {boxes.count[b][1], 0};
                    list.n += checkpoint_box_run_pieces(name, boxes.vector ? boxes.cols : boxes.rows, boxes.vector ? 0 : boxes.cols,
                                                        boxes.vector ? vector_offset : boxes.offset[b],
                                                        boxes.vector ? vector_count : boxes.count[b], lo - box_first,
                                                        hi - box_first, states[k], lo - held, &list.piece[list.n]);
                }
                box_first += size;
            }
        }
    }
    return list;
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    Options o = {.data = "data/shakespeare", .plot = "img/20_gpt_3d.png", .device = "auto", .schedule = "1f1b",
                 .n_layer = 4, .n_head = 4, .n_embd = 128, .block_size = 64, .batch_size = 12,
                 .max_iters = 2000, .warmup_iters = 100, .lr_decay_iters = 2000, .accum_steps = 1,
                 .eval_interval = 250, .eval_iters = 20, .seed = 1337, .sample = 200, .top_k = 200,
                 .learning_rate = 1e-3, .min_lr = 1e-4, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.99,
                 .grad_clip = 1.0, .bucket_mb = 25.0, .temperature = 0.8, .dp = 1, .tp = 1, .pp = 1, .micro_batches = 1,
                 .keep = 2, .save_errors = "stop", .dropout_rng = "auto", .dtype = "float32", .on_resize = "off"};
    ArgSpec flags[] = {
        {"dp", ARG_INT, &o.dp, "D", "data-parallel replicas (world = D x T x P)", 1, NULL},
        {"tp", ARG_INT, &o.tp, "T", "tensor-parallel ranks per block (a divisor of --n_head and 4 --n_embd)", 1, NULL},
        {"pp", ARG_INT, &o.pp, "P", "pipeline stages (a divisor of --n_layer)", 1, NULL},
        {"micro_batches", ARG_INT, &o.micro_batches, "M", "micro-batches per micro-step through the pipeline (a divisor of --batch_size)", 1, NULL},
        {"zero", ARG_INT, &o.zero, "STAGE", "1: AdamW's moments sharded over the data-parallel group (ZeRO-1); 0: none", 0, NULL},
        {"sp", ARG_SWITCH, &o.sp, NULL, "sequence parallelism (with --tp > 1): the LayerNorms and residuals cut along the tokens, an all-gather before and a reduce-scatter after each tensor-parallel pair", 0, NULL},
        {"recompute", ARG_SWITCH, &o.recompute, NULL, "activation checkpointing: keep each block's input, redo its forward just before its backward", 0, NULL},
        {"schedule", ARG_STRING, &o.schedule, "NAME", "the order of each stage's forwards and backwards", 0, "gpipe|1f1b"},
        {"data", ARG_PATH, &o.data, "DIR", "folder with input.txt, the text (make shakespeare)", 0, NULL},
        {"n_layer", ARG_INT, &o.n_layer, "N", "transformer blocks", 1, NULL},
        {"n_head", ARG_INT, &o.n_head, "N", "attention heads per block", 1, NULL},
        {"n_embd", ARG_INT, &o.n_embd, "N", "width of the residual stream (a multiple of --n_head)", 1, NULL},
        {"block_size", ARG_INT, &o.block_size, "N", "context: characters the model sees", 1, NULL},
        {"batch_size", ARG_INT, &o.batch_size, "N", "windows per micro-step, per replica", 1, NULL},
        {"bias", ARG_SWITCH, &o.bias, NULL, "biases in the Linears and LayerNorms (nanoGPT's bias=True)", 0, NULL},
        {"dropout", ARG_FLOAT_GE, &o.dropout, "P", "dropout probability (after the embeddings, on attention, after each c_proj)", 0, NULL},
        {"dropout_rng", ARG_STRING, &o.dropout_rng, "GEN", "the masks' generator: torch (its CPU generator's bits, drawn on "
         "the host; whole models only) or philox (counter-based, drawn where the model is, each rank its part); auto: "
         "philox on a GPU or a split or recomputed model, torch on the CPU", 0,
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
        {"init", ARG_PATH, &o.init, "FILE.h5", "start from these weights (nanoGPT's state_dict names, the whole model)", 0, NULL},
        {"save", ARG_OUTPUT, &o.save, "FILE.h5", "write the final weights (the whole model)", 0, NULL},
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
        {"checkpoint", ARG_STRING, &o.checkpoint, "DIR", CHECKPOINT_HELP_DIR " (step 19's too)", 0, NULL},
        {"save_every", ARG_INT, &o.save_every, "N", CHECKPOINT_HELP_SAVE_EVERY, 0, NULL},
        {"keep", ARG_INT, &o.keep, "N", CHECKPOINT_HELP_KEEP, 1, NULL},
        {"async_save", ARG_SWITCH, &o.async_save, NULL, CHECKPOINT_HELP_ASYNC_SAVE, 0, NULL},
        {"save_errors", ARG_STRING, &o.save_errors, "WHAT", CHECKPOINT_HELP_SAVE_ERRORS, 0, "stop|continue"},
        {"on_resize", ARG_STRING, &o.on_resize, "WHAT", "a checkpoint saved with another global batch (another world "
         "size: an elastic restart): keep_batch grows --accum_steps to keep its global batch (the uninterrupted "
         "run's steps), scale_lr keeps the per-replica batch and scales the lr with the global batch, off takes the "
         "flags as given", 0, "keep_batch|scale_lr|off"},
        TRACKING_FLAGS(o.tracking),
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "Step 20: step 19's GPT split data x tensor x pipeline parallel (Megatron-LM's 3D grid).");
    checkpoint_flags_check(o.checkpoint);  // --save_every, --keep, --async_save, --save_errors: only with --checkpoint
    if (args_given("on_resize") && !o.checkpoint) usage_error("--on_resize: only with --checkpoint DIR");
    bool save_errors_continue = strcmp(o.save_errors, "continue") == 0;
    GptConfig config = {.block_size = o.block_size, .n_layer = o.n_layer, .n_head = o.n_head, .n_embd = o.n_embd,
                        .bias = o.bias, .dropout = o.dropout};
    if (gpt_config_problem(&config)) usage_error("%s", gpt_config_problem(&config));
    int rank = dist_rank(), world = dist_world_size();
    // The grid, refused in one line (exit 2, every rank alike) where it cannot be.
    ScheduleKind schedule_kind;
    if (!schedule_kind_from_name(o.schedule, &schedule_kind)) usage_error("--schedule %s: expected gpipe or 1f1b", QUOTE(o.schedule));
    if ((long)o.dp * o.tp * o.pp != world)
        usage_error("--dp %d --tp %d --pp %d: a grid of %ld ranks, but the world has %d (D x T x P must be the world size)",
                    o.dp, o.tp, o.pp, (long)o.dp * o.tp * o.pp, world);
    // (T dividing n_head divides n_embd = n_head x head_dim, and so the MLP's 4 n_embd too.)
    if (o.n_head % o.tp != 0)
        usage_error("--tp %d: --n_head %d is not a multiple of it (each tensor-parallel rank computes n_head / T heads "
                    "and 4 n_embd / T of the MLP)", o.tp, o.n_head);
    if (o.n_layer % o.pp != 0)
        usage_error("--pp %d: --n_layer %d is not a multiple of it (each stage holds n_layer / P blocks)", o.pp, o.n_layer);
    if (o.zero > 1)
        usage_error("--zero %d: expected 0 or 1 (ZeRO-1: AdamW's moments sharded; stages 2 and 3 are step 18's)", o.zero);
    if (o.batch_size % o.micro_batches != 0)
        usage_error("--micro_batches %d: expected a divisor of --batch_size %d", o.micro_batches, o.batch_size);
    if (o.sp && o.tp == 1)
        usage_error("--sp: sequence parallelism cuts the tensor-parallel group's tokens, and needs --tp 2 or more");
    if (o.sp && (long)o.batch_size / o.micro_batches * o.block_size % o.tp != 0)
        usage_error("--sp: a micro-batch's %d x %d tokens do not split into --tp %d equal parts", o.batch_size / o.micro_batches,
                    o.block_size, o.tp);
    // A split's rank draws its part of each mask (its micro-batch's rows, its heads, its stages'
    // blocks) at the values step 19 draws for the whole micro-step, and --recompute draws a block's
    // again: Philox gives any value alone, again; torch's generator is a sequence, which only a whole
    // model draws, once, in step 19's order.
    const bool split_model = o.tp * o.pp * o.micro_batches > 1, masks_in_parts = split_model || o.recompute;
    if (o.dropout > 0 && masks_in_parts && strcmp(o.dropout_rng, "torch") == 0)
        usage_error("--dropout_rng torch with --tp, --pp, --micro_batches or --recompute: torch's generator draws whole "
                    "masks once, in order, where a split model's ranks each draw a part of them and --recompute draws "
                    "them again (--dropout_rng philox)");
    Device device = device_from_flag(o.device);
    threads_init(o.threads);
    matmul_set_dtype(matmul_dtype_from_flag(o.dtype));  // ctx = torch.autocast(device_type, dtype=ptdtype)

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
    // The grid, as Megatron's and picotron's: tensor-parallel ranks innermost (neighbours: one
    // node), then the stages, then the replicas.
    Grid grid = {.tp_rank = rank % o.tp, .stage = rank / o.tp % o.pp, .replica = rank / (o.tp * o.pp), .stages = o.pp};
    grid.tensor_parallel = group_split(grid.replica * o.pp + grid.stage, grid.tp_rank);
    grid.pipeline = group_split(grid.replica * o.tp + grid.tp_rank, grid.stage);
    grid.data_parallel = group_split(grid.stage * o.tp + grid.tp_rank, grid.replica);
    grid.model = group_split(grid.replica, grid.stage * o.tp + grid.tp_rank);
    bool tied_ends = grid.stage == 0 || grid.stage == o.pp - 1;  // a singleton group for the stages in between
    grid.embedding = group_split(tied_ends ? grid.replica * o.tp + grid.tp_rank : world + rank, grid.stage);
    int blocks = o.n_layer / o.pp;
    // The schedule; the activations of as many micro-batches as it has in flight on my stage at most
    // (GPipe: all M; 1F1B: min(P - s, M)), kept in that many slots.
    Schedule pipeline_schedule = schedule_new(schedule_kind, o.pp, o.micro_batches);
    grid.activation_slots = schedule_max_in_flight(&pipeline_schedule, grid.stage);
    const int held_batch = o.batch_size / o.micro_batches * grid.activation_slots;  // the windows held at once
    GptSplit split = {.first_layer = grid.stage * blocks, .end_layer = (grid.stage + 1) * blocks,
                      .tensor_group = &grid.tensor_parallel,
                      .recompute_batch = o.recompute ? o.batch_size / o.micro_batches : 0, .sequence_parallel = o.sp};

    // What this rank's part will take, refused in one line if it would not fit (before anything is allocated).
    MemoryNeed need = memory_need("--n_layer %d --n_embd %d --block_size %d --batch_size %d --tp %d --pp %d", o.n_layer,
                                  o.n_embd, o.block_size, o.batch_size, o.tp, o.pp);
    gpt_add_part_memory_need(&need, &config, held_batch, &split);
    MemoryNeed whole_need = memory_need("the whole model");
    gpt_add_memory_need(&whole_need, &config, 1);
    if (device == DEVICE_CPU) {  // (on a GPU rank the text and the whole model stay on the host)
        memory_need_add(&need, "the whole model, on the host", memory_need_bytes(&whole_need));
        memory_need_add(&need, "data", (double)text.n);
    }
    memory_require(&need, device);

    // Model: the whole model made on the host as step 19 makes it (or loaded), and this rank's part
    // cut from it; DDP over the replicas of the part; the optimizer over the part.
    Rng init_rng;
    rng_seed(&init_rng, (uint64_t)o.seed);  // torch.manual_seed(seed)
    Gpt *whole = gpt_new(&config, 1, &init_rng, DEVICE_CPU);  // model = GPT(gptconf)
    // Every tensor of the state_dict, and nothing else (lm_head.weight aside: wte's, tied).
    if (o.init) h5_load_params_exactly(o.init, whole->params, whole->n_params, (const char *const[]){"lm_head.weight", NULL});
    Gpt *model = gpt_new_part(whole, held_batch, &split, device);  // its part, .to(device)
    if (strcmp(o.dropout_rng, "auto") != 0 || masks_in_parts)
        gpt_set_dropout_philox(model, masks_in_parts || strcmp(o.dropout_rng, "philox") == 0);
    Ddp ddp = ddp_wrap_group(model->params, model->n_params, o.bucket_mb, &grid.data_parallel);  // model = DDP(model, process_group)
    // The optimizer over the part: AdamW, or with --zero 1 AdamW over this replica's 1/D of every tensor.
    AdamW optimizer = {0};
    Zero1 zero = {0};
    if (o.zero == 1) zero = zero1_new(model->params, model->n_params, &grid.data_parallel, o.weight_decay, o.beta1, o.beta2);
    else optimizer = adamw_new(model->params, model->n_params, o.weight_decay, o.beta1, o.beta2);
    bool *owned = xmalloc((size_t)model->n_params * sizeof(bool));  // what counts once in the gradients' norm
    for (int i = 0; i < model->n_params; i++) owned[i] = gpt_owns(model, i);
    LrSchedule schedule = {.lr = o.learning_rate, .min_lr = o.min_lr, .warmup_iters = o.warmup_iters,
                           .lr_decay_iters = o.lr_decay_iters, .decay = true};

    int global_batch = o.batch_size * o.accum_steps * o.dp;
    print0("Step 20: a GPT on %d rank%s, %d replica%s x %d tensor-parallel x %d pipeline stage%s: %d layers, %d heads, "
           "%d wide, context %d, vocabulary %d: %.2fM parameters (%zu, and %zu in wpe)\n", world, world == 1 ? "" : "s",
           o.dp, o.dp == 1 ? "" : "s", o.tp, o.pp, o.pp == 1 ? "" : "s", o.n_layer, o.n_head, o.n_embd, o.block_size,
           text.vocab_size, gpt_num_params(whole, true) / 1e6, gpt_num_params(whole, true),
           gpt_num_params(whole, false) - gpt_num_params(whole, true));
    print0("AdamW lr %g (warm-up %d, cosine to %g at %d), betas (%g, %g), weight decay %g, clip %g%s; %d iterations of "
           "%d windows (%d per replica x %d micro-step%s x %d replica%s; %d micro-batch%s of %d, %s), %d tokens each; "
           "%s%s, %s\n", o.learning_rate, o.warmup_iters, o.min_lr, o.lr_decay_iters, o.beta1, o.beta2, o.weight_decay,
           o.grad_clip, o.zero == 1 ? ", its moments sharded over the replicas (ZeRO-1)" : "", o.max_iters, global_batch, o.batch_size, o.accum_steps, o.accum_steps == 1 ? "" : "s", o.dp,
           o.dp == 1 ? "" : "s", o.micro_batches, o.micro_batches == 1 ? "" : "es", o.batch_size / o.micro_batches,
           schedule_kind_name(schedule_kind), global_batch * o.block_size,
           matmul_dtype() == MATMUL_BFLOAT16 ? "matmuls in bfloat16; " : "", device_name(device), threads_describe());
    for (int r = 0; r < world; r++) {  // rank 0 knows the grid: it is arithmetic
        int t = r % o.tp, p = r / o.tp % o.pp, d = r / (o.tp * o.pp), H = o.n_head / o.tp;
        print0("rank %d: replica %d, stage %d (blocks %d-%d%s%s), tensor-parallel rank %d: heads %d-%d, MLP columns %d-%d\n",
               r, d, p, p * blocks, (p + 1) * blocks - 1, p == 0 ? ", embeddings" : "", p == o.pp - 1 ? ", ln_f and head" : "",
               t, t * H, (t + 1) * H - 1, t * 4 * o.n_embd / o.tp, (t + 1) * 4 * o.n_embd / o.tp - 1);
    }
    print0("data: %s/input.txt, %ld characters: %ld train, %ld validate\n", o.data, text.n, text.n_train, text.n - text.n_train);
    if (o.dropout > 0)
        print0("dropout %g: masks from %s\n", o.dropout,
               model->dropout_philox ? split_model ? "Philox, each rank drawing its part where the model is"
                                                   : "Philox, drawn where the model is"
                                     : "torch's CPU generator, drawn on the host");
    // MFU's yardstick: this rank's sgemm peak on its device, measured now.
    double flops_per_iter = gpt_flops_per_token(whole, o.block_size) * global_batch * o.block_size;
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

    // --checkpoint: resume from DIR's current checkpoint, saved by any grid, or by step 19 on any
    // number of ranks: the tensors are step 19's state_dict's, and each rank reads the boxes its
    // part holds (checkpoint_pieces, below).
    CheckpointState state = {.program = "day5/20_gpt_3d", .also_resumes = "day5/19_gpt", .world_size = world,
                             .global_batch = global_batch, .random_windows = true, .seed = o.seed, .shuffle = 1,
                             .train_samples = (int)text.n_train, .lr = o.learning_rate, .generator = train_rng,
                             .eval_generator = eval_rng, .eval_generator_kept = true, .losses = &losses,
                             .adopts_global_batch = strcmp(o.on_resize, "keep_batch") == 0, .lr_scale = 1.0};
    snprintf(state.layout, sizeof state.layout, "dp %d x tp %d%s x pp %d on %d rank%s%s", o.dp, o.tp, o.sp ? " (sp)" : "",
             o.pp, world, world == 1 ? "" : "s", o.zero == 1 ? ", ZeRO-1" : "");
    const AdamW *adamw = o.zero == 1 ? &zero.optimizer : &optimizer;  // the moments (of my blocks, with --zero 1)
    CheckpointPieces wanted = checkpoint_pieces(model, &grid, adamw, o.zero == 1 ? &zero : NULL, false);
    CheckpointPieces saved = checkpoint_pieces(model, &grid, adamw, o.zero == 1 ? &zero : NULL, true);
    int first_iter = 0;
    CheckpointSave *in_flight = NULL;  // --async_save: the save a thread is writing
    if (o.checkpoint && sharded_checkpoint_resume(o.checkpoint, wanted.piece, wanted.n, &state, o.init)) {
        first_iter = (int)state.step;
        (o.zero == 1 ? &zero.optimizer : &optimizer)->adam.step = state.step;
        train_rng = state.generator, eval_rng = state.eval_generator;
        // --on_resize, as step 19's: keep_batch takes the checkpoint's global batch, --accum_steps
        // growing as the replicas shrink (the same windows, the same slices: the uninterrupted
        // steps); scale_lr keeps the per-replica batch and scales the lr by the global batches' ratio.
        if (state.saved_global_batch != global_batch && strcmp(o.on_resize, "keep_batch") == 0) {
            long per_micro_step = (long)o.batch_size * o.dp;
            if (state.saved_global_batch % per_micro_step != 0)
                usage_error("--on_resize keep_batch: the checkpoint's global batch of %ld windows is not a multiple of "
                            "--batch_size %d x %d replica%s", state.saved_global_batch, o.batch_size, o.dp, o.dp == 1 ? "" : "s");
            int was = o.accum_steps;
            o.accum_steps = (int)(state.saved_global_batch / per_micro_step);
            global_batch = (int)state.saved_global_batch;
            free(offsets);
            offsets = xmalloc((size_t)global_batch * sizeof(long));
            flops_per_iter = gpt_flops_per_token(whole, o.block_size) * global_batch * o.block_size;
            print0("--on_resize keep_batch: the checkpoint's global batch of %d windows, saved on %d rank%s, as %d per "
                   "replica x %d micro-steps x %d replica%s (--accum_steps %d, was %d): the uninterrupted run's steps\n",
                   global_batch, state.saved_world_size, state.saved_world_size == 1 ? "" : "s", o.batch_size,
                   o.accum_steps, o.dp, o.dp == 1 ? "" : "s", o.accum_steps, was);
        } else if (state.saved_global_batch != global_batch && strcmp(o.on_resize, "scale_lr") == 0) {
            state.lr_scale *= (double)global_batch / (double)state.saved_global_batch;
            print0("--on_resize scale_lr: the global batch goes from %ld windows (%d rank%s) to %d: the learning rate x "
                   "%g, %g (min_lr %g), %g times --learning_rate since the run began\n", state.saved_global_batch,
                   state.saved_world_size, state.saved_world_size == 1 ? "" : "s", global_batch,
                   (double)global_batch / (double)state.saved_global_batch, o.learning_rate * state.lr_scale,
                   o.min_lr * state.lr_scale, state.lr_scale);
        }
        state.global_batch = global_batch;  // what this run's checkpoints say it takes
        schedule.lr = o.learning_rate * state.lr_scale, schedule.min_lr = o.min_lr * state.lr_scale;
    }
    Tracking *run = tracking_start(&o.tracking, "day5/20_gpt_3d.c", device_name(device), state.mlflow_run_id, args_values());  // mlflow.start_run(run_id=...); log_params
    snprintf(state.mlflow_run_id, sizeof state.mlflow_run_id, "%s", tracking_run_id(run));
    for (int i = 0; i < losses.n; i++) tracking_log_metric(run, "loss", losses.loss[i], i);
    int n_evals = o.max_iters / o.eval_interval + 2;
    float *eval_steps = xmalloc((size_t)n_evals * sizeof(float)), *train_evals = xmalloc((size_t)n_evals * sizeof(float));
    float *val_evals = xmalloc((size_t)n_evals * sizeof(float));
    int evals = 0;
    double train_seconds = 0.0;
    long tokens_per_iter = (long)global_batch * o.block_size;
    const float factor = 1.0f / (float)(o.accum_steps * o.micro_batches);  // each micro-batch's share of the step
    GroupTraffic step_traffic[GRID_GROUPS] = {0};  // what the last training step sent over each group
    // This stage's compute and idle time in the pipeline (P > 1), on the GPU's clock on a GPU (stage_timer.h).
    StageTimer *stage_timer = o.pp > 1 ? stage_timer_new(2 * o.micro_batches, device, false) : NULL;
    // Each iteration's loss stays on the GPU of its last stage until the host prints it (step_losses.h,
    // as step 19): no iteration waits for it. The ranks that hold none count the iterations too, and
    // every rank takes part in the sum over the world that makes the global batch's loss.
    enum { PRINT_EVERY = 10 };
    StepLosses pending = step_losses_new(PRINT_EVERY, device);
    float told[PRINT_EVERY];  // the iterations' losses since the last hand-over, summed over the world
    int untold = 0;
    double print_seconds = 0.0;  // the iterations' since the last print
    int since_print = 0;

    // (A checkpoint past --max_iters, a run resumed with fewer iterations than it saved: evaluated
    // once, nothing trained.)
    for (int iter = first_iter;; iter++) {
        if (iter % o.eval_interval == 0 || iter >= o.max_iters) {
            double train_loss = estimate_loss(model, &grid, &pipeline_schedule, &text, SPLIT_TRAIN, &eval_rng, &o, offsets, inputs, targets);
            double val_loss = estimate_loss(model, &grid, &pipeline_schedule, &text, SPLIT_VAL, &eval_rng, &o, offsets, inputs, targets);
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
        for (int g = 0; g < GRID_GROUPS; g++) group_reset_traffic(grid_group(&grid, g));  // this step's, from here
        double lr = lr_at(&schedule, iter);
        // One global batch of windows; this replica's micro-steps take its slices.
        char_text_draw_offsets(&train_rng, text.n_train, o.block_size, global_batch, offsets);
        gpt_zero_grad(model);                                 // optimizer.zero_grad(set_to_none=True)
        for (int m = 0; m < o.accum_steps; m++) {
            char_text_windows(&text, SPLIT_TRAIN, offsets + (size_t)(grid.replica * o.accum_steps + m) * o.batch_size,
                              o.batch_size, o.block_size, inputs, targets);
            // The dropout masks of micro-batch (iteration, slice), as step 19 draws them (a split: each rank its part).
            int slice = grid.replica * o.accum_steps + m, slices = o.accum_steps * o.dp;
            gpt_seed_dropout(model, ((uint64_t)o.seed << 32) + (1ULL << 31) + (uint64_t)iter * slices + slice);
            // Forward, loss and backward of the micro-step's M micro-batches, in the schedule's order.
            pipeline_step(model, &grid, &pipeline_schedule, inputs, targets, o.batch_size, o.block_size, factor, true,
                          m == o.accum_steps - 1, &ddp, stage_timer, &pending, m == 0);
        }
        ddp_finish(&ddp);                                     // every gradient the mean over replicas
        // The tied wte: the first stage's gradient (the embedding's) and the last's (the head's) summed.
        if (o.pp > 1 && tied_ends) group_all_reduce(&grid.embedding, model->params[0].grad);
        if (o.grad_clip > 0) {  // (the norm stays on the GPU)
            if (o.tp * o.pp == 1) clip_grad_norm_queued(model->params, model->n_params, o.grad_clip);
            else clip_grad_norm_split_queued(model->params, model->n_params, owned, &grid.model, o.grad_clip);
        }
        if (o.zero == 1) zero1_step(&zero, lr);               // optimizer.step(): my 1/D, then all-gathered
        else adamw_step(&optimizer, lr);                      // optimizer.step()
        // loss.item(): at once on a CPU; on a GPU the iterations' losses since the last hand-over, when
        // the host prints one, saves a checkpoint (which keeps them) or evaluates.
        bool print = iter % PRINT_EVERY == 0 || iter == o.max_iters - 1;
        bool save_now = o.checkpoint && o.save_every > 0 && (iter + 1) % o.save_every == 0;
        untold++;
        float loss = 0.0f;
        if (device == DEVICE_CPU || print || save_now || (iter + 1) % o.eval_interval == 0) {
            device_synchronize();  // (every stage's queued work, before the host's collective: see pipeline_step)
            float *held = NULL;
            int n_held = grid.stage == grid.stages - 1 ? step_losses_take_all(&pending, true, &held) : untold;
            CHECK(n_held == untold, "step 20: %d losses held for %d iterations", n_held, untold);
            bool mine = grid.stage == grid.stages - 1 && grid.tp_rank == 0;  // a replica's last stage, once
            for (int i = 0; i < untold; i++) told[i] = mine ? held[i] : 0.0f;
            dist_allreduce_sum(told, (size_t)untold);  // for the log: each iteration's loss of the global batch
            for (int i = 0; i < untold; i++) {
                loss = told[i] / (float)(o.accum_steps * o.micro_batches * o.dp);
                check_loss_finite(loss, losses.n + 1, 0, run);  // the sum above spread any nan to every rank
                tracking_log_metric(run, "loss", loss, losses.n);
                loss_log_add(&losses, 0, loss);
            }
            untold = 0;
        }
        double seconds = wall_seconds() - start;
        train_seconds += seconds;
        print_seconds += seconds, since_print++;
        for (int g = 0; g < GRID_GROUPS; g++) step_traffic[g] = *grid_group(&grid, g)->traffic;
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
    print_memory(model, &grid, &o, o.zero == 1 ? (double)zero1_state_floats(&zero) : 2.0 * gpt_num_params(model, false));
    if (taken > 0 && world > 1) print_traffic(model, &o, &ddp, step_traffic);
    if (taken > 0 && o.pp > 1) {
        StageTimes stage_times = stage_timer_take(stage_timer);
        print_idle(&grid, &pipeline_schedule, &stage_times, (double)taken * o.accum_steps);
    }
    stage_timer_free(stage_timer);
    step_losses_free(&pending);
    check_weights_finite(model->params, model->n_params, o.max_iters, 0, run);  // the last step's update
    bool end_saved = true;  // false: the last step's checkpoint failed twice (--save_errors continue)
    // The end of training saved, where no --save_every save holds it (--async_save: the one in flight finished first).
    if (o.checkpoint && taken <= 0)
        print0("Nothing left to train: the checkpoint is at step %d (--max_iters %d)\n", first_iter, o.max_iters);
    else if (o.checkpoint)
        end_saved = sharded_checkpoint_save_last(&in_flight, o.checkpoint, o.keep, save_errors_continue, saved.piece,
                                                 saved.n, &state);
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    if (taken > 0) print0("DDP (rank 0's part): %s\n", overlap);
    // The whole model again: on each replica's first rank, its checksum (step 19's, of the same weights).
    gather_whole(model, whole, &grid);
    if (grid.model.rank == 0)
        print_rank("parameter checksum %016llx (the whole model, from replica %d's %d rank%s)\n",
                   params_checksum(whole->params, whole->n_params), grid.replica, o.tp * o.pp, o.tp * o.pp == 1 ? "" : "s");

    if (rank == 0 && o.sample > 0) {
        Rng sample_rng;
        rng_seed(&sample_rng, (uint64_t)o.seed + 2);  // (the dropout's seeds are above 2^31)
        print0("sample (%d characters, temperature %g, top_k %d):\n", o.sample, o.temperature, o.top_k);
        sample_text(whole, &text, prompt, prompt_length, &o, &sample_rng);
    }
    if (rank == 0 && o.losses) loss_log_write_csv(&losses, o.losses);
    if (rank == 0 && o.save) {
        int n_state;
        Param *state_dict = gpt_state_dict(whole, &n_state);
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
        snprintf(title, sizeof title, "Step 20: GPT on Tiny Shakespeare, %d x %d x %d ranks", o.dp, o.tp, o.pp);
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
    free(offsets), free(inputs), free(targets), free(prompt), free(owned);
    loss_log_free(&losses);
    checkpoint_pieces_free(&wanted), checkpoint_pieces_free(&saved);
    schedule_free(&pipeline_schedule);
    if (o.zero == 1) zero1_free(&zero);
    else adamw_free(&optimizer);
    ddp_free(&ddp);
    gpt_free(model);
    gpt_free(whole);
    group_free(&grid.embedding), group_free(&grid.model), group_free(&grid.data_parallel);
    group_free(&grid.pipeline), group_free(&grid.tensor_parallel);
    char_text_free(&text);
    sharded_checkpoint_check_end_saved(end_saved, o.checkpoint);  // the outputs written: exit 1 if the end is not checkpointed
    dist_finalize();
    return 0;
}
