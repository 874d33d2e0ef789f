// step_graph.c: a training step replayed from a CUDA graph. See step_graph.h.
#include "train/step_graph.h"

#include <stdlib.h>

#include "base/check.h"
#include "runtime/dist.h"

StepGraph step_graph_new(Device device, bool enabled, bool across_ranks) {
    StepGraph graph = {.enabled = HAVE_CUDA && enabled && device == DEVICE_CUDA, .device = device,
                       .across_ranks = across_ranks};
    graph.loss = device == DEVICE_CUDA ? device_alloc(sizeof(float)) : xcalloc(1, sizeof(float));
    return graph;
}

bool step_graph_replay(StepGraph *graph, int rows) {
#if HAVE_CUDA
    int moved = graph->graph && device_buffer_moves() != graph->buffer_moves;
    if (graph->graph && graph->across_ranks)  // where one rank's buffers moved, every rank captures again
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &moved, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (moved) {
        // A scratch buffer moved since the capture (step 15's evaluation between epochs grows the
        // ones its step uses): the graph would use the old address. Dropped, then captured again
        // after a warm-up step, as the first time.
        device_graph_free(graph->graph);
        graph->graph = NULL;
        graph->captured_rows = graph->eager_rows = 0;
    }
    if (graph->graph && rows == graph->captured_rows) {
        device_graph_launch(graph->graph);
        graph->replays++;
        return true;
    }
#endif
    (void)graph, (void)rows;
    return false;
}

void step_graph_begin(StepGraph *graph, int rows) {
    CHECK(!graph->capturing, "step_graph_begin: a capture is in progress");
    bool capture = graph->enabled && !graph->graph && rows == graph->eager_rows;
#if HAVE_CUDA
    if (capture) {
        device_graph_begin();
        graph->capturing = true;
        graph->captures++;
        graph->buffer_moves = device_buffer_moves();
        graph->captured_rows = rows;
        return;
    }
#endif
    (void)capture;
    graph->eager_rows = rows;
}

void step_graph_end(StepGraph *graph) {
#if HAVE_CUDA
    if (graph->capturing) {
        graph->graph = device_graph_end();
        graph->capturing = false;
        device_graph_launch(graph->graph);  // the captured step has not run yet
        graph->replays++;
    }
#endif
    (void)graph;
}

LossSlot step_graph_loss(const StepGraph *graph) { return (LossSlot){.value = graph->loss, .weight = 1.0f}; }

void step_graph_hand_loss(StepGraph *graph, LossSlot slot) {
    CHECK(slot.weight == 1.0f && !slot.accumulate, "step_graph_hand_loss: a slot of weight %g%s", slot.weight,
          slot.accumulate ? ", accumulated" : "");
#if HAVE_CUDA
    if (graph->device == DEVICE_CUDA)
        CHECK_CUDA(cudaMemcpyAsync(slot.value, graph->loss, sizeof(float), cudaMemcpyDeviceToDevice, device_stream()));
    else
#endif
        *slot.value = *graph->loss;
    device_mark_step();  // the step is queued (the simulated GPU counts per step)
}

void step_graph_report(const StepGraph *graph, bool wanted, long steps, int world, const char *collectives) {
    if (graph->enabled)
        print0("CUDA graph: %ld of %ld steps replayed from %d capture%s (--cuda_graph off: each kernel launched by "
               "itself)\n", graph->replays, steps, graph->captures, graph->captures == 1 ? "" : "s");
    else if (wanted)
        print0("CUDA graph: 0 of %ld steps replayed: %d ranks share a GPU, so each step holds %s through MPI on host "
               "copies, which no graph can hold; each kernel launched by itself\n", steps, world, collectives);
}

void step_graph_free(StepGraph *graph) {
#if HAVE_CUDA
    device_graph_free(graph->graph);
#endif
    if (graph->device == DEVICE_CUDA) device_free(graph->loss);
    else free(graph->loss);
    *graph = (StepGraph){0};
}
