// test_profile: profile a toy DDP model.                    PyTorch twin: test-profile.py
//
// The original's sandbox for the profiler, before profiling MNIST: a toy
// model, Linear(1024, 2048), ReLU, Linear(2048, 1024), wrapped in DDP and
// trained with MSE loss and SGD (lr 0.01) on random data: 64 x 1024 inputs
// and targets per rank, 5 steps. The loop marks its phases with named ranges,
// as the original does with record_function: forward_pass, loss+backward,
// optimizer_step, plus a marker per step (prof.step()). The library's own
// ranges (forward, backward, the DDP buckets' allreduce) nest inside them.
// Rank 0 prints the table; --trace (default log/trace.json, as the original's
// ./log) holds every rank's ranges for Perfetto.
//
// Build and run:
//   make day1/test_profile
//   mpirun -np 2 day1/test_profile                 (add --oversubscribe on fewer cores)
//   mpirun -np 2 profiling/nsys.sh day1/test_profile   # with Nsight Systems
#include <stdio.h>
#include <stdlib.h>

#include "base/args.h"              // args_parse: the flags and --help
#include "base/check.h"             // CHECK, xmalloc: fail fast, on every rank
#include "models/nn.h"              // Mlp, its forward and backward, Adam, SGD: model and optimizer
#include "parallel/ddp.h"           // ddp_wrap, ddp_grad_ready, ddp_finish: DistributedDataParallel
#include "runtime/dist.h"           // dist_init, dist_rank, print0: the process group
#include "runtime/memory_budget.h"  // memory_need, memory_require: refuse what would not fit, before allocating
#include "runtime/profile.h"        // profile_start, profile_push: named time ranges (--trace, Nsight)
#include "runtime/threads.h"        // threads_init: this rank's CPU threads
#include "train/divergence.h"       // check_loss_finite_agreed: a loss that is nan or inf stops the run, on every rank

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    int steps = 5, batch = 64, seed = 0, threads = 0;
    double lr = 0.01;
    const char *trace = "log/trace.json", *device_flag = "auto";
    ArgSpec flags[] = {
        {"steps", ARG_INT, &steps, "N", "training steps", 1, NULL},
        {"batch_size", ARG_INT, &batch, "N", "random samples per step, per rank", 1, NULL},
        {"lr", ARG_FLOAT, &lr, "X", "SGD learning rate", 0, NULL},
        {"seed", ARG_INT, &seed, "N", "weights (rank 0's are broadcast) and, plus the rank, the data", 0, NULL},
        {"trace", ARG_OUTPUT_OR_NONE, &trace, "FILE.json", "Chrome trace of every rank's ranges ('' for none)", 0, NULL},
        {"device", ARG_STRING, &device_flag, "DEV", "where to compute (auto: the GPU when every rank has one)", 0, "cpu|cuda|auto"},
        {"threads", ARG_INT, &threads, "N", "CPU threads per rank (0: the node's cores / its ranks)", 0, NULL},
    };
    args_parse(argc, argv, flags, ARRAY_LEN(flags), "test_profile: profile a toy DDP model on random data.");
    Device device = device_from_flag(device_flag);
    threads_init(threads);
    // Memory: what the flags will allocate on this rank, refused now if it would not fit (exit 2).
    const int sizes[] = {1024, 2048, 1024};
    MemoryNeed need = memory_need("--batch_size %d", batch);
    mlp_add_memory_need(&need, sizes, ARRAY_LEN(sizes), batch, 0);  // SGD: no state
    double weights = 0;
    for (int i = 0; i + 1 < ARRAY_LEN(sizes); i++) weights += (double)sizes[i] * sizes[i + 1] + sizes[i + 1];
    memory_need_add(&need, "DDP's buckets", weights * sizeof(float));  // a copy of the gradients
    memory_need_add(&need, "data", 3.0 * batch * 1024 * sizeof(float));  // the random draw, inputs, targets
    memory_require(&need, device);

    Rng rng;
    rng_seed(&rng, (uint64_t)seed);
    Mlp model = mlp_new(sizes, ARRAY_LEN(sizes), batch, &rng, device);
    Ddp ddp = ddp_wrap(model.params, model.n_params, 25.0);  // ddp_model = DDP(model)
    print0("test_profile: MLP 1024-2048-1024 (%zu weights), MSE loss, SGD lr %g; %d x 1024 random samples per "
           "rank, %d step%s, %d rank%s; %s, %s\n",
           mlp_num_weights(&model), lr, batch, steps, steps == 1 ? "" : "s", dist_world_size(),
           dist_world_size() == 1 ? "" : "s", device_name(device), threads_describe());

    // Every rank its own random data: torch.randn(64, 1024) per rank.
    rng_seed(&rng, (uint64_t)seed + 1 + (uint64_t)dist_rank());
    Tensor random = tensor_zeros(batch, 1024, DEVICE_CPU);  // drawn on the host, then moved
    Tensor inputs = tensor_zeros(batch, 1024, device), targets = tensor_zeros(batch, 1024, device);

    profile_start(trace);  // with torch.profiler.profile(...) as prof:
    for (int step = 0; step < steps; step++) {
        for (size_t i = 0; i < tensor_numel(&random); i++) random.data[i] = rng_normal(&rng);
        tensor_copy(&inputs, &random);
        for (size_t i = 0; i < tensor_numel(&random); i++) random.data[i] = rng_normal(&rng);
        tensor_copy(&targets, &random);
        mlp_zero_grad(&model);

        profile_push("forward_pass");
        mlp_forward(&model, &inputs);
        profile_pop();

        profile_push("loss+backward");
        float loss = mlp_mse_loss(&model, &targets);
        mlp_backward(&model, &inputs, ddp_grad_ready, &ddp);
        ddp_finish(&ddp);
        profile_pop();

        profile_push("optimizer_step");
        sgd_step(model.params, model.n_params, lr);
        profile_pop();

        profile_mark("step");  // prof.step()
        check_loss_finite_agreed(loss, step + 1, 0, NULL);  // each rank's own batch: agreed by one allreduce
        print0("step %d: loss %.4f (rank 0's batch)\n", step + 1, loss);
    }
    check_weights_finite(model.params, model.n_params, steps, 0, NULL);  // the last step's update
    // DDP's figures first: with NCCL they come off the GPU's timeline once the
    // last step has happened, and so does that step's allreduce in the table.
    char overlap[256];
    ddp_describe_overlap(&ddp, overlap, sizeof overlap);
    profile_summary();
    print0("DDP: %s\n", overlap);
    print_rank("parameter checksum %016llx\n", params_checksum(model.params, model.n_params));

    tensor_free(&random);
    tensor_free(&inputs);
    tensor_free(&targets);
    ddp_free(&ddp);
    mlp_free(&model);
    dist_finalize();  // writes the trace
    return 0;
}
