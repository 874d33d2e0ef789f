// h5_read_bench: step 11's reader alone, without training: how fast do W
// workers turn a file's chunks into float32 batches?
//
//   build/tools/h5_read_bench data/mnist.h5 [workers] [prefetch] [epochs]
//   -> data/mnist.h5: 5 epochs of 600 groups, 2 workers x 2 ahead: 1.18 GB/s of float32 pixels (0.80 s); ...
// One rank, CPU batches of 64 groups (step 11's default 6400 samples), shuffled.
#include <stdio.h>
#include <stdlib.h>

#include "base/timer.h"
#include "data/h5_stream.h"
#include "runtime/dist.h"
#include "runtime/threads.h"

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE.h5 [workers] [prefetch] [epochs]\n", argv[0]);
        return 2;
    }
    int workers = argc > 2 ? atoi(argv[2]) : 1, prefetch = argc > 3 ? atoi(argv[3]) : 2;
    int epochs = argc > 4 ? atoi(argv[4]) : 5, groups_per_batch = 64;
    threads_init(0);
    H5Mnist file = h5_mnist_open(argv[1]);
    DistributedSampler sampler = sampler_new(file.train.n_groups, 1, 0, true, 0);
    int *labels = xmalloc((size_t)groups_per_batch * H5_GROUP_SIZE * sizeof(int));
    double start = wall_seconds();
    H5Stream *stream = h5_stream_start(&file.train, &sampler, groups_per_batch, epochs, DEVICE_CPU, workers, prefetch);
    double checksum = 0;
    for (int epoch = 0; epoch < epochs; epoch++) {
        sampler_set_epoch(&sampler, epoch);
        for (int b = 0; b < sampler_num_batches(&sampler, groups_per_batch); b++) {
            Tensor x = h5_stream_next(stream, epoch, b, labels);
            checksum += x.data[(size_t)x.rows * x.cols / 2];  // touch the batch, as training would
        }
    }
    double seconds = wall_seconds() - start;
    char report[512 + 128 * workers];
    h5_stream_describe_all_ranks(stream, seconds, report, sizeof report);
    h5_stream_stop(stream);
    double gigabytes = (double)epochs * file.train.n_groups * H5_GROUP_SIZE * MNIST_PIXELS * sizeof(float) / 1e9;
    printf("%s: %d epochs of %d groups, %d workers x %d ahead: %.2f GB/s of float32 pixels (%.2f s)\n%s", argv[1],
           epochs, file.train.n_groups, workers, prefetch, gigabytes / seconds, seconds, report);
    (void)checksum;
    free(labels);
    sampler_free(&sampler);
    h5_mnist_close(&file);
    dist_finalize();
    return 0;
}
