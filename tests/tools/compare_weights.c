// compare_weights A.h5 B.h5 TOLERANCE: are two MLP 784-128-10 checkpoints the
// same model? Prints the relative difference ||A - B|| / ||B|| over all
// weights (and the largest element difference); exits 0 iff it is <= TOLERANCE.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "models/nn.h"
#include "records/h5.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s A.h5 B.h5 TOLERANCE\n", argv[0]);
        return 2;
    }
    const int sizes[] = {784, 128, 10};
    Rng rng;
    rng_seed(&rng, 0);
    Mlp a = mlp_new(sizes, 3, 1, &rng, DEVICE_CPU), b = mlp_new(sizes, 3, 1, &rng, DEVICE_CPU);
    h5_load_params(argv[1], a.params, a.n_params);
    h5_load_params(argv[2], b.params, b.n_params);
    double diff2 = 0, norm2 = 0, worst = 0;
    for (int i = 0; i < a.n_params; i++)
        for (size_t k = 0; k < tensor_numel(a.params[i].value); k++) {
            double d = (double)a.params[i].value->data[k] - (double)b.params[i].value->data[k];
            diff2 += d * d;
            norm2 += (double)b.params[i].value->data[k] * b.params[i].value->data[k];
            worst = fabs(d) > worst ? fabs(d) : worst;
        }
    double relative = sqrt(diff2 / norm2);
    printf("relative difference %.2e, largest element difference %.2e\n", relative, worst);
    return relative <= atof(argv[3]) ? 0 : 1;
}
