/* libFuzzer target: rs_decode_request (native/codec.c) on arbitrary bytes.
 *
 * Beyond "no crash, no sanitizer report" it checks what the Python side relies on:
 *   - values_cap = size + 1 always suffices (codec.h), so -RS_CODEC_VALUES_FULL never happens;
 *   - a scratch of 32 slots per input byte always suffices;
 *   - the result does not depend on the scratch size (a small scratch that reports
 *     SCRATCH_FULL, retried larger, gives the same layout and values as a large one);
 *   - an accepted layout is well formed, and every value it points at lies inside the
 *     values written (every string's (offset, length) inside the request).
 * The request is copied to a buffer of exactly its size so ASan sees any read past its end.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "fuzz_input.h"

static void skip_text(const uint8_t** p, const uint8_t* end) {
    uint64_t n = varint(p, end);
    CHECK(n <= (uint64_t)(end - *p));
    *p += n;
}

/* Int64 slots one input's values take in the values buffer. */
static uint64_t slots_of(uint64_t out, uint64_t count) {
    switch (out) {
    case RS_CODEC_OUT_FLOAT32:
    case RS_CODEC_OUT_FLOAT16:
    case RS_CODEC_OUT_COMPLEX64:
        return (count * 4 + 7) / 8;
    case RS_CODEC_OUT_STRING:
        return 2 * count;
    default:
        return count;
    }
}

static void check_layout(const uint8_t* layout, int64_t n, const int64_t* values, int64_t values_cap,
                         int64_t size) {
    const uint8_t *p = layout, *end = layout + n;
    skip_text(&p, end); /* signature_name */
    for (uint64_t filters = varint(&p, end); filters; filters--) skip_text(&p, end);
    uint64_t inputs = varint(&p, end), next_slot = 0;
    for (; inputs; inputs--) {
        skip_text(&p, end);
        uint64_t out = varint(&p, end), ndims = varint(&p, end);
        CHECK(out <= RS_CODEC_OUT_STRING && ndims <= RS_CODEC_MAX_DIMS);
        unsigned __int128 elements = 1;
        for (uint64_t d = 0; d < ndims; d++) elements *= varint(&p, end);
        uint64_t slot = varint(&p, end), count = varint(&p, end);
        uint64_t per = out == RS_CODEC_OUT_COMPLEX64 || out == RS_CODEC_OUT_COMPLEX128 ? 2 : 1;
        CHECK(elements * per == count);
        /* Inputs start on fresh slots in wire order; survivors keep that order. */
        CHECK(slot >= next_slot && slot <= (uint64_t)values_cap);
        uint64_t used = slots_of(out, count);
        CHECK(used <= (uint64_t)values_cap - slot);
        next_slot = slot + used;
        if (out == RS_CODEC_OUT_STRING)
            for (uint64_t i = 0; i < count; i++) {
                int64_t off = values[slot + 2 * i], len = values[slot + 2 * i + 1];
                CHECK(off >= 0 && len >= 0 && off <= size && len <= size - off);
            }
    }
    CHECK(p == end);
}

typedef int64_t (*decode_fn)(const uint8_t*, int64_t, int64_t*, int64_t, int64_t*, int64_t);

/* Decodes again from a small scratch up, doubling on SCRATCH_FULL as the Python caller does,
 * and checks the answer equals `n` and the layout bytes in `big`; returns that run's values
 * (values_cap slots, the caller frees them). */
static int64_t* redecode_from_small_scratch(decode_fn decode, const uint8_t* request, size_t size,
                                            int64_t values_cap, const int64_t* big, int64_t big_cap, int64_t n) {
    int64_t* values2 = malloc((size_t)values_cap * sizeof(int64_t));
    for (int64_t cap = 1;; cap *= 2) {
        int64_t* small = malloc((size_t)cap * sizeof(int64_t));
        int64_t m = decode(request, (int64_t)size, values2, values_cap, small, cap);
        if (m == -RS_CODEC_SCRATCH_FULL) {
            free(small);
            CHECK(cap < big_cap);
            continue;
        }
        CHECK(m == n && memcmp(small, big, (size_t)n) == 0);
        free(small);
        return values2;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    uint8_t* request = malloc(size ? size : 1);
    memcpy(request, data, size);
    const int64_t values_cap = (int64_t)size + 1, big_cap = 32 * (int64_t)size + 64;
    int64_t* values = malloc((size_t)values_cap * sizeof(int64_t));
    int64_t* big = malloc((size_t)big_cap * sizeof(int64_t));

    int64_t n = rs_decode_request(request, (int64_t)size, values, values_cap, big, big_cap);
    CHECK(n >= 0 || n == -RS_CODEC_FALLBACK);
    if (n >= 0) {
        CHECK(n <= big_cap * 8);
        check_layout((const uint8_t*)big, n, values, values_cap, (int64_t)size);
        int64_t* values2 = redecode_from_small_scratch(rs_decode_request, request, size, values_cap, big, big_cap, n);
        /* The values the layout points at are equal too (slots past them are scratch). */
        const uint8_t *p = (const uint8_t*)big, *end = p + n;
        skip_text(&p, end);
        for (uint64_t f = varint(&p, end); f; f--) skip_text(&p, end);
        for (uint64_t inputs = varint(&p, end); inputs; inputs--) {
            skip_text(&p, end);
            uint64_t out = varint(&p, end), ndims = varint(&p, end);
            for (uint64_t d = 0; d < ndims; d++) varint(&p, end);
            uint64_t slot = varint(&p, end), count = varint(&p, end), used = slots_of(out, count);
            /* float32 payloads may end mid-slot: compare bytes, not slots. */
            size_t bytes = out == RS_CODEC_OUT_FLOAT32 || out == RS_CODEC_OUT_FLOAT16 ||
                                   out == RS_CODEC_OUT_COMPLEX64
                               ? count * 4
                               : used * 8;
            CHECK(memcmp(values + slot, values2 + slot, bytes) == 0);
        }
        free(values2);
    }
    free(big);
    free(values);
    free(request);
    return 0;
}
