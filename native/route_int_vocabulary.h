/* An integer vocabulary for the native request route: int64 id -> its key, built once per
 * model version (rs_servable_add_int_vocabulary) and read by every request without locks.
 *
 * The C twin of recserve.embedding.IntegerKeys, which is the spec: id ids[i] gets keys[i]
 * (an id given twice: its last key, as a Python dict keeps its last index); any other id gets
 * `default_id` (-1: padding). Id -1 is padding (key -1) when `padding`, whatever the list
 * says (feature columns drop it before the lookup); else it is an id like any other (Keras
 * IntegerLookup). An empty list keys every id `default_id`.
 *
 * Immutable once built: any number of threads may key ids at once.
 */
#ifndef RECSERVE_ROUTE_INT_VOCABULARY_H
#define RECSERVE_ROUTE_INT_VOCABULARY_H

#include <stdint.h>

typedef struct rs_int_vocabulary rs_int_vocabulary;

/* n ids keyed keys[i] (any order; keys >= 0), default_id >= -1. NULL when out of memory or
 * the arguments are malformed. */
rs_int_vocabulary* rs_int_vocabulary_build(const int64_t* ids, const int64_t* keys, int64_t n, int64_t default_id,
                                           int padding);
/* The keys of the n ids in `ids`; `out` may be `ids` itself (keyed in place). */
void rs_int_vocabulary_keys(const rs_int_vocabulary* v, const int64_t* ids, int64_t n, int64_t* out);
void rs_int_vocabulary_free(rs_int_vocabulary* v);

#endif
