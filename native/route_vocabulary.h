/* A string vocabulary for the native request route: string -> its index, built once per
 * model version (rs_servable_add_vocabulary) and read by every request without locks.
 *
 * The C twin of recserve.embedding.StringKeys's vocabulary keying, which is the spec: a
 * string's key is the index the Python side passed for its bytes, -1 (padding) when absent;
 * the empty string is padding (-1) whatever the vocabulary holds. Bytes are compared as
 * bytes: a request string that is not valid UTF-8 matches no word and gets -1, as in Python.
 *
 * Immutable once built: any number of threads may look strings up at once.
 */
#ifndef RECSERVE_ROUTE_VOCABULARY_H
#define RECSERVE_ROUTE_VOCABULARY_H

#include <stdint.h>

typedef struct rs_vocabulary rs_vocabulary;

/* FNV-1a, 64 bits: the route table's and the vocabulary's hash of bytes. */
static inline uint64_t rs_fnv1a64(const uint8_t* key, int64_t size) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < size; i++)
        h = (h ^ key[i]) * 1099511628211ULL;
    return h;
}

/* n words, back to back in `words` (word i is lengths[i] bytes), word i keyed indices[i]
 * (>= 0). A word given twice keeps its last index (a Python dict's update). Empty words are
 * left out ('' is padding). NULL when out of memory or the arguments are malformed. */
rs_vocabulary* rs_vocabulary_build(const uint8_t* words, const int64_t* lengths, const int64_t* indices, int64_t n);
/* The key of the n strings data[start:start + length] of the (start, length) pairs in
 * `spans`; `out` may be `spans` itself (key i is written after pair i is read). */
void rs_vocabulary_spans(const rs_vocabulary* v, const uint8_t* data, const int64_t* spans, int64_t n, int64_t* out);
void rs_vocabulary_free(rs_vocabulary* v);

#endif
