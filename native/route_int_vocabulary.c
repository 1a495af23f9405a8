/* The ids sorted, their keys alongside; a request id is found by binary search (log2 n
 * probes: ~17 for 100,000 ids), as IntegerKeys finds it with numpy's searchsorted. The arrays
 * never change after the build. */
#include "route_int_vocabulary.h"

#include <stdlib.h>

typedef struct {
    int64_t id, key, at; /* at: its place in the list (the last one wins) */
} pair;

struct rs_int_vocabulary {
    int64_t n, default_id;
    int padding;
    int64_t* ids; /* ascending, distinct */
    int64_t* keys;
};

static int by_id_then_place(const void* a, const void* b) {
    const pair *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

rs_int_vocabulary* rs_int_vocabulary_build(const int64_t* ids, const int64_t* keys, int64_t n, int64_t default_id,
                                           int padding) {
    if (n < 0 || (n && (!ids || !keys)) || default_id < -1 || (uint64_t)n > SIZE_MAX / sizeof(pair))
        return NULL;
    for (int64_t i = 0; i < n; i++)
        if (keys[i] < 0)
            return NULL;
    rs_int_vocabulary* v = calloc(1, sizeof *v);
    pair* pairs = malloc((size_t)(n ? n : 1) * sizeof *pairs);
    if (v) {
        v->ids = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
        v->keys = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    }
    if (!v || !pairs || !v->ids || !v->keys) {
        free(pairs);
        rs_int_vocabulary_free(v);
        return NULL;
    }
    v->default_id = default_id;
    v->padding = padding != 0;
    for (int64_t i = 0; i < n; i++)
        pairs[i] = (pair){ids[i], keys[i], i};
    qsort(pairs, (size_t)n, sizeof *pairs, by_id_then_place);
    for (int64_t i = 0; i < n; i++) {
        if (v->n && v->ids[v->n - 1] == pairs[i].id)
            v->n--; /* a later place of the same id replaces it */
        v->ids[v->n] = pairs[i].id;
        v->keys[v->n] = pairs[i].key;
        v->n++;
    }
    free(pairs);
    return v;
}

void rs_int_vocabulary_keys(const rs_int_vocabulary* v, const int64_t* ids, int64_t n, int64_t* out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        if (id == -1 && v->padding) {
            out[i] = -1;
            continue;
        }
        int64_t low = 0, high = v->n; /* the id, if listed, is in ids[low:high] */
        while (low < high) {
            int64_t mid = low + (high - low) / 2;
            if (v->ids[mid] < id)
                low = mid + 1;
            else
                high = mid;
        }
        out[i] = low < v->n && v->ids[low] == id ? v->keys[low] : v->default_id;
    }
}

void rs_int_vocabulary_free(rs_int_vocabulary* v) {
    if (!v)
        return;
    free(v->ids);
    free(v->keys);
    free(v);
}
