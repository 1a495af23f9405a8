/* Deterministic functions of keys, shared bit for bit with recserve/embedding/_purekeys.py:
 * XXH64 of strings (the stable string -> int64 key hash) and the N(0, stddev) default row
 * of an unknown key. The exact algorithms are documented in recserve/embedding/__init__.py.
 */
#include <math.h>
#include <string.h>

#include "embedding.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "recserve's embedding engine assumes a little-endian host"
#endif

/* ---- XXH64 (seed 0), after the reference specification ---- */

static const uint64_t P1 = 0x9E3779B185EBCA87ULL;
static const uint64_t P2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t P3 = 0x165667B19E3779F9ULL;
static const uint64_t P4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t P5 = 0x27D4EB2F165667C5ULL;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const uint8_t* p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t read32(const uint8_t* p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t input) {
    acc += input * P2;
    return rotl64(acc, 31) * P1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t v) {
    acc ^= xxh_round(0, v);
    return acc * P1 + P4;
}

static uint64_t xxh64(const uint8_t* p, uint64_t len) {
    const uint8_t* end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = 0 - P1;
        const uint8_t* limit = end - 32;
        do {
            v1 = xxh_round(v1, read64(p));
            v2 = xxh_round(v2, read64(p + 8));
            v3 = xxh_round(v3, read64(p + 16));
            v4 = xxh_round(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    } else {
        h = P5;
    }
    h += len;
    for (; p + 8 <= end; p += 8) {
        h ^= xxh_round(0, read64(p));
        h = rotl64(h, 27) * P1 + P4;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

void rs_xxh64_batch(const uint8_t* data, const int64_t* starts, const int64_t* lengths,
                    int64_t n, int64_t* out) {
    for (int64_t i = 0; i < n; i++) {
        /* The empty string is padding, like the int64 id -1. */
        out[i] = lengths[i] == 0 ? -1 : (int64_t)xxh64(data + starts[i], (uint64_t)lengths[i]);
    }
}

void rs_xxh64_spans(const uint8_t* data, const int64_t* spans, int64_t n, int64_t* out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t start = spans[2 * i], length = spans[2 * i + 1];
        out[i] = length == 0 ? -1 : (int64_t)xxh64(data + start, (uint64_t)length);
    }
}

/* ---- default rows: splitmix64 counters -> Box-Muller in double -> float32 ---- */

static inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

void rs_default_vector(double stddev, uint64_t seed, int64_t key, int64_t dim, float* out) {
    uint64_t stream = splitmix64(splitmix64(seed) ^ (uint64_t)key);
    for (int64_t j = 0; j < dim; j += 2) {
        uint64_t a = splitmix64(stream + (uint64_t)j);
        uint64_t b = splitmix64(stream + (uint64_t)j + 1);
        double u1 = (double)((a >> 11) + 1) * 0x1.0p-53; /* (0, 1]: log is finite */
        double u2 = (double)(b >> 11) * 0x1.0p-53;       /* [0, 1) */
        double radius = sqrt(-2.0 * log(u1));
        double theta = 6.283185307179586 * u2;
        out[j] = (float)(stddev * (radius * cos(theta)));
        if (j + 1 < dim) out[j + 1] = (float)(stddev * (radius * sin(theta)));
    }
}

void rs_default_vectors(double stddev, uint64_t seed, const int64_t* keys, int64_t n,
                        int64_t dim, float* out) {
    for (int64_t i = 0; i < n; i++) rs_default_vector(stddev, seed, keys[i], dim, out + i * dim);
}
