/* What the C fuzz targets share: a failed check aborts with its place (libFuzzer then saves
 * the input), and the fuzz input read as a stream of bytes that reads as zeros once spent. */
#ifndef RECSERVE_FUZZ_INPUT_H
#define RECSERVE_FUZZ_INPUT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

typedef struct {
    const uint8_t *p, *end;
} input;

static inline bool more(const input* in) { return in->p < in->end; }
static inline uint8_t byte(input* in) { return more(in) ? *in->p++ : 0; }
static inline uint16_t word(input* in) {
    uint16_t low = byte(in);
    return (uint16_t)(low | byte(in) << 8);
}

#endif
