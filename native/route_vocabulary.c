/* Open addressing over a power-of-two table at most half full, linear probing; the words
 * live in one copy. The table never changes after the build, so a request string can only
 * walk the probe chains the vocabulary itself made: no input lengthens them. */
#include "route_vocabulary.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t hash;
    int64_t offset, length; /* length -1: an empty slot */
    int64_t index;
} entry;

struct rs_vocabulary {
    uint64_t mask;
    int64_t longest; /* a longer string is no word: not even hashed */
    entry* table;
    uint8_t* words;
};

static entry* find(const rs_vocabulary* v, const uint8_t* s, int64_t length, uint64_t hash) {
    for (uint64_t i = hash & v->mask;; i = (i + 1) & v->mask) {
        entry* e = &v->table[i];
        if (e->length < 0 || (e->hash == hash && e->length == length && !memcmp(v->words + e->offset, s, (size_t)length)))
            return e;
    }
}

rs_vocabulary* rs_vocabulary_build(const uint8_t* words, const int64_t* lengths, const int64_t* indices, int64_t n) {
    if (n < 0 || (n && (!words || !lengths || !indices)))
        return NULL;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (lengths[i] < 0 || indices[i] < 0 || lengths[i] > INT64_MAX - total)
            return NULL;
        total += lengths[i];
    }
    uint64_t capacity = 8;
    while (capacity < 2 * (uint64_t)n) {
        if (capacity > (UINT64_MAX >> 2) / sizeof(entry))
            return NULL;
        capacity *= 2;
    }
    rs_vocabulary* v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->mask = capacity - 1;
    v->table = malloc(capacity * sizeof(entry));
    v->words = malloc((size_t)(total ? total : 1));
    if (!v->table || !v->words) {
        rs_vocabulary_free(v);
        return NULL;
    }
    for (uint64_t i = 0; i < capacity; i++)
        v->table[i].length = -1;
    if (total)
        memcpy(v->words, words, (size_t)total);
    int64_t offset = 0;
    for (int64_t i = 0; i < n; offset += lengths[i], i++) {
        if (!lengths[i])
            continue;
        uint64_t hash = rs_fnv1a64(v->words + offset, lengths[i]);
        entry* e = find(v, v->words + offset, lengths[i], hash);
        *e = (entry){hash, offset, lengths[i], indices[i]};
        if (lengths[i] > v->longest)
            v->longest = lengths[i];
    }
    return v;
}

void rs_vocabulary_spans(const rs_vocabulary* v, const uint8_t* data, const int64_t* spans, int64_t n, int64_t* out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t start = spans[2 * i], length = spans[2 * i + 1];
        if (!length || length > v->longest) {
            out[i] = -1;
            continue;
        }
        const entry* e = find(v, data + start, length, rs_fnv1a64(data + start, length));
        out[i] = e->length < 0 ? -1 : e->index;
    }
}

void rs_vocabulary_free(rs_vocabulary* v) {
    if (!v)
        return;
    free(v->table);
    free(v->words);
    free(v);
}
