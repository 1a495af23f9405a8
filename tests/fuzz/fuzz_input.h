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

/* A protobuf varint at *p (the layouts the codec writes); a truncated one fails the check. */
static inline uint64_t varint(const uint8_t** p, const uint8_t* end) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        CHECK(*p < end);
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) return v;
    }
    abort();
}

#ifdef RECSERVE_EMBEDDING_H
#include <string.h>
#include <unistd.h>

/* One tiered table kept for the whole run: the engine's eviction threads exit when no
 * tiered table is left and start again with the next, so without it every input would
 * pay for creating a thread (costly under ASan) rather than for the code under test. */
static rs_table* keeper;
static char keeper_dir[128];

static void keeper_free(void) {
    rs_table_free(keeper);
    rmdir(keeper_dir);
}

static inline void keep_eviction_threads(void) {
    const char* tmp = getenv("TMPDIR");
    snprintf(keeper_dir, sizeof keeper_dir, "%s/fuzz-keeper-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(keeper_dir) != NULL);
    rs_tier_config config = {.path = keeper_dir, .dram_bytes = 0, .ssd_bytes = 1 << 16,
                             .segment_bytes = 4096, .io = RS_IO_PREAD, .eviction_threads = 1};
    int64_t detail;
    CHECK(rs_tiered_create(1, RS_DEFAULT_ZEROS, 0, 0, NULL, NULL, 0, NULL, 0, &config, &keeper, &detail) == RS_OK);
    atexit(keeper_free);
}
#endif

#endif
