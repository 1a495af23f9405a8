/* Protobuf varints read and written: the codec's parser, the route's response encoder and
 * the gRPC front end's ModelSpec (tfs_spec.c) share these. Header-only: each library and
 * fuzz target compiles its own copy. */
#ifndef RECSERVE_VARINT_H
#define RECSERVE_VARINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A varint at *pp (before end): *out and *pp advanced past it; false (nothing moved) when
 * it is cut short or longer than 10 bytes. */
static inline bool rs_varint_get(const uint8_t** pp, const uint8_t* end, uint64_t* out) {
    const uint8_t* p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return false;
        uint64_t b = *p++;
        v |= (b & 0x7f) << (7 * i); /* upb too drops the 10th byte's bits above 2^64 */
        if (b < 0x80) {
            *pp = p;
            *out = v;
            return true;
        }
    }
    return false;
}

static inline size_t rs_varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v at p; returns the byte after it. */
static inline uint8_t* rs_varint_put(uint8_t* p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

#endif
