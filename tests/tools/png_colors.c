// png_colors FILE.png RRGGBB...: for each colour, print how many pixels of the
// image are within a small distance of it (anti-aliasing blends edges), as
// "RRGGBB COUNT". Used to check that a chart holds the curves it should.
#include <png.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FILE.png RRGGBB...\n", argv[0]);
        return 2;
    }
    png_image image = {.version = PNG_IMAGE_VERSION};
    if (!png_image_begin_read_from_file(&image, argv[1])) {
        fprintf(stderr, "%s: %s\n", argv[1], image.message);
        return 1;
    }
    image.format = PNG_FORMAT_RGB;
    unsigned char *rgb = malloc(PNG_IMAGE_SIZE(image));
    if (!rgb || !png_image_finish_read(&image, NULL, rgb, 0, NULL)) {
        fprintf(stderr, "%s: cannot decode\n", argv[1]);
        return 1;
    }
    printf("size %ux%u\n", image.width, image.height);
    for (int c = 2; c < argc; c++) {
        unsigned long want = strtoul(argv[c], NULL, 16), count = 0;
        int r = (int)(want >> 16 & 255), g = (int)(want >> 8 & 255), b = (int)(want & 255);
        for (size_t p = 0; p < (size_t)image.width * image.height; p++) {
            int dr = rgb[3 * p] - r, dg = rgb[3 * p + 1] - g, db = rgb[3 * p + 2] - b;
            count += dr * dr + dg * dg + db * db < 40 * 40;
        }
        printf("%06lx %lu\n", want, count);
    }
    free(rgb);
    return 0;
}
