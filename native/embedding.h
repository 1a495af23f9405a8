/* recserve embedding engine: int64 key -> float32 row tables behind an opaque handle.
 *
 * Layout. A table is an *index* (key -> slot: open addressing with linear probing, buckets
 * four to a 64-byte line, keys before slots) over a *storage* (slot -> row). Storage block 0
 * is the caller's values buffer, adopted without a copy; upserts write to further blocks of
 * doubling size. Keeping the two apart lets a later tier (SSD, Redis) replace the storage
 * and keep the index. Lookups hash, probe and gather a group of ids at a time, prefetching
 * lines and rows a whole pass ahead (embedding.c, pipeline()).
 *
 * Concurrency. Any number of readers (lookup, contains, snapshot, sample) run concurrently
 * with ONE writer (upsert, delete); the caller serialises writers. Readers take no lock:
 *   - a row is written into a free slot first, then its slot number is published into the
 *     bucket with a release store; readers load it with acquire, so a row is seen entirely
 *     old or entirely new;
 *   - a new key publishes its slot before its key, so a reader that sees the key sees a slot;
 *   - delete stores RS_TOMBSTONE in the bucket's slot (the key stays until the next rebuild);
 *   - growth builds a bigger index and publishes the pointer with a release store.
 * Slots freed by overwrite/delete and replaced indexes are *retired*, and reused or freed
 * only after a grace period: readers register in a two-generation epoch (an in-flight
 * counter per generation parity); the writer flips the generation, and memory retired
 * before the flip is reclaimed once the old generation's counter has drained to zero. The
 * writer never waits for readers: reclamation is attempted at the start and end of each
 * write call, and while it is pending new rows go to fresh storage.
 *
 * Status codes: every function that can fail returns an int (RS_OK = 0).
 * Strings for rs_xxh64_batch are UTF-8 bytes; XXH64 with seed 0, read as int64.
 * The host must be little-endian (x86_64, aarch64).
 */
#ifndef RECSERVE_EMBEDDING_H
#define RECSERVE_EMBEDDING_H

#include <stdint.h>

#define RS_API __attribute__((visibility("default")))

enum {
    RS_OK = 0,
    RS_ENOMEM = 1,      /* allocation failed; a write call may have applied a prefix */
    RS_EDUPLICATE = 2,  /* create: a key appears twice (reported in *bad_key) */
    RS_EINVAL = 3,      /* bad argument: unknown combiner, dim <= 0, ... */
    RS_EEMPTY = 4,      /* sample: the table has no rows */
};

enum { RS_COMBINER_NONE = 0, RS_COMBINER_SUM = 1, RS_COMBINER_MEAN = 2, RS_COMBINER_SQRTN = 3 };
enum { RS_DEFAULT_ZEROS = 0, RS_DEFAULT_NORMAL = 1 };

typedef struct rs_table rs_table;

/* One binding of a request: ids [rows, width] (-1 = padding) looked up in `table`.
 * combiner NONE writes out[rows * width, dim]; the others write out[rows, dim].
 * Every field is 8 bytes so the caller can fill an int64 [n, 6] array. */
typedef struct {
    rs_table* table;
    const int64_t* ids;
    float* out;
    int64_t rows;
    int64_t width;
    int64_t combiner;
} rs_lookup_task;

/* Builds a table over values[n, dim], which it adopts: the buffer must outlive the table
 * and may be written by later upserts (freed slots are recycled). keys must not hold -1. */
RS_API int rs_table_create(int64_t dim, int32_t default_kind, double stddev, uint64_t seed,
                           const int64_t* keys, float* values, int64_t n,
                           rs_table** out, int64_t* bad_key);
RS_API void rs_table_free(rs_table* t);
RS_API int64_t rs_table_size(rs_table* t);
/* Rows the storage holds (live, retired and free): for tests of slot recycling. */
RS_API int64_t rs_table_storage_rows(rs_table* t);

/* Readers. */
RS_API int rs_lookup(const rs_lookup_task* tasks, int64_t n_tasks);
RS_API int rs_table_lookup(rs_table* t, const int64_t* ids, int64_t rows, int64_t width,
                           int64_t combiner, float* out);
RS_API int rs_table_contains(rs_table* t, const int64_t* keys, int64_t n, uint8_t* out);
/* Writes up to `capacity` live rows; returns the number of live rows seen (retry if larger). */
RS_API int64_t rs_table_snapshot(rs_table* t, int64_t* keys, float* values, int64_t capacity);
/* For each position, the first live key at or after it in index order (wrapping). */
RS_API int rs_table_sample(rs_table* t, const uint64_t* positions, int64_t n, int64_t* out);

/* The writer (one at a time). keys must not hold -1; within a batch the last write wins. */
RS_API int rs_table_upsert(rs_table* t, const int64_t* keys, const float* values, int64_t n);
RS_API int rs_table_delete(rs_table* t, const int64_t* keys, int64_t n);

/* Deterministic functions of keys (embedding_keys.c). */
RS_API void rs_default_vectors(double stddev, uint64_t seed, const int64_t* keys, int64_t n,
                               int64_t dim, float* out);
RS_API void rs_xxh64_batch(const uint8_t* data, const int64_t* starts, const int64_t* lengths,
                           int64_t n, int64_t* out);

/* Internal: one key's N(0, stddev) default row (the algorithm is in embedding_keys.c). */
void rs_default_vector(double stddev, uint64_t seed, int64_t key, int64_t dim, float* out);

#endif
