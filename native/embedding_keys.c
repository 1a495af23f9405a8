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

/* ---- TensorFlow's StringToHashBucketFast: Fingerprint64 (farmhash's farmhashna::Hash64)
 * modulo the bucket count, after farmhash's reference source (Apache 2.0, Google) ---- */

static const uint64_t K0 = 0xc3a5c85c97cb3127ULL;
static const uint64_t K1 = 0xb492b66fbe98f273ULL;
static const uint64_t K2 = 0x9ae16a3b2f90404fULL;

static inline uint64_t rotr64(uint64_t v, int s) { return s == 0 ? v : (v >> s) | (v << (64 - s)); }
static inline uint64_t shift_mix(uint64_t v) { return v ^ (v >> 47); }

static inline uint64_t hash_len16(uint64_t u, uint64_t v, uint64_t mul) {
    uint64_t a = (u ^ v) * mul;
    a ^= (a >> 47);
    uint64_t b = (v ^ a) * mul;
    b ^= (b >> 47);
    return b * mul;
}

static uint64_t hash_len0to16(const uint8_t* s, uint64_t len) {
    if (len >= 8) {
        uint64_t mul = K2 + len * 2;
        uint64_t a = read64(s) + K2;
        uint64_t b = read64(s + len - 8);
        uint64_t c = rotr64(b, 37) * mul + a;
        uint64_t d = (rotr64(a, 25) + b) * mul;
        return hash_len16(c, d, mul);
    }
    if (len >= 4) {
        uint64_t mul = K2 + len * 2;
        uint64_t a = read32(s);
        return hash_len16(len + (a << 3), read32(s + len - 4), mul);
    }
    if (len > 0) {
        uint32_t y = (uint32_t)s[0] + ((uint32_t)s[len >> 1] << 8);
        uint32_t z = (uint32_t)len + ((uint32_t)s[len - 1] << 2);
        return shift_mix((uint64_t)y * K2 ^ (uint64_t)z * K0) * K2;
    }
    return K2;
}

static uint64_t hash_len17to32(const uint8_t* s, uint64_t len) {
    uint64_t mul = K2 + len * 2;
    uint64_t a = read64(s) * K1;
    uint64_t b = read64(s + 8);
    uint64_t c = read64(s + len - 8) * mul;
    uint64_t d = read64(s + len - 16) * K2;
    return hash_len16(rotr64(a + b, 43) + rotr64(c, 30) + d, a + rotr64(b + K2, 18) + c, mul);
}

static uint64_t hash_len33to64(const uint8_t* s, uint64_t len) {
    uint64_t mul = K2 + len * 2;
    uint64_t a = read64(s) * K2;
    uint64_t b = read64(s + 8);
    uint64_t c = read64(s + len - 8) * mul;
    uint64_t d = read64(s + len - 16) * K2;
    uint64_t y = rotr64(a + b, 43) + rotr64(c, 30) + d;
    uint64_t z = hash_len16(y, a + rotr64(b + K2, 18) + c, mul);
    uint64_t e = read64(s + 16) * mul;
    uint64_t f = read64(s + 24);
    uint64_t g = (y + read64(s + len - 32)) * mul;
    uint64_t h = (z + read64(s + len - 24)) * mul;
    return hash_len16(rotr64(e + f, 43) + rotr64(g, 30) + h, e + rotr64(f + a, 18) + g, mul);
}

typedef struct { uint64_t first, second; } pair64;

static inline pair64 weak_hash_len32(const uint8_t* s, uint64_t a, uint64_t b) {
    uint64_t w = read64(s), x = read64(s + 8), y = read64(s + 16), z = read64(s + 24);
    a += w;
    b = rotr64(b + a + z, 21);
    uint64_t c = a;
    a += x;
    a += y;
    b += rotr64(a, 44);
    pair64 out = {a + z, b + c};
    return out;
}

uint64_t rs_fingerprint64(const uint8_t* s, uint64_t len) {
    if (len <= 16) return hash_len0to16(s, len);
    if (len <= 32) return hash_len17to32(s, len);
    if (len <= 64) return hash_len33to64(s, len);
    const uint64_t seed = 81;
    uint64_t x = seed, y = seed * K1 + 113, z = shift_mix(y * K2 + 113) * K2, t;
    pair64 v = {0, 0}, w = {0, 0};
    x = x * K2 + read64(s);
    const uint8_t* end = s + ((len - 1) / 64) * 64;
    const uint8_t* last64 = end + ((len - 1) & 63) - 63;
    do {
        x = rotr64(x + y + v.first + read64(s + 8), 37) * K1;
        y = rotr64(y + v.second + read64(s + 48), 42) * K1;
        x ^= w.second;
        y += v.first + read64(s + 40);
        z = rotr64(z + w.first, 33) * K1;
        v = weak_hash_len32(s, v.second * K1, x + w.first);
        w = weak_hash_len32(s + 32, z + w.second, y + read64(s + 16));
        t = z; z = x; x = t;
        s += 64;
    } while (s != end);
    uint64_t mul = K1 + ((z & 0xff) << 1);
    s = last64;
    w.first += ((len - 1) & 63);
    v.first += w.first;
    w.first += v.first;
    x = rotr64(x + y + v.first + read64(s + 8), 37) * mul;
    y = rotr64(y + v.second + read64(s + 48), 42) * mul;
    x ^= w.second * 9;
    y += v.first * 9 + read64(s + 40);
    z = rotr64(z + w.first, 33) * mul;
    v = weak_hash_len32(s, v.second * mul, x + w.first);
    w = weak_hash_len32(s + 32, z + w.second, y + read64(s + 16));
    t = z; z = x; x = t;
    return hash_len16(hash_len16(v.first, w.first, mul) + shift_mix(y) * K0 + z,
                      hash_len16(v.second, w.second, mul) + x, mul);
}

/* The bucket of each string (the empty string is padding: -1), as `rs_xxh64_batch`. */
void rs_bucket_batch(const uint8_t* data, const int64_t* starts, const int64_t* lengths, int64_t n,
                     uint64_t buckets, int64_t* out) {
    for (int64_t i = 0; i < n; i++) {
        out[i] = lengths[i] == 0 ? -1
                                 : (int64_t)(rs_fingerprint64(data + starts[i], (uint64_t)lengths[i]) % buckets);
    }
}

void rs_bucket_spans(const uint8_t* data, const int64_t* spans, int64_t n, uint64_t buckets, int64_t* out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t start = spans[2 * i], length = spans[2 * i + 1];
        out[i] = length == 0 ? -1 : (int64_t)(rs_fingerprint64(data + start, (uint64_t)length) % buckets);
    }
}
