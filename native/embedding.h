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
 * Tiers. A table made by rs_tiered_create keeps every row in record files (the SSD tier,
 * embedding_ssd.c) and the hottest rows also in a fixed DRAM tier (embedding_tier.c); a
 * bucket's slot says which: a DRAM slot, or an SSD record (SSD_TAG). Lookups read either
 * inside the same call; a record is appended and written before its number is published and
 * is never overwritten, and a record file is removed only after the same grace period as
 * a slot, so "entirely old or entirely new" holds on both tiers. Every mutation of a tiered
 * table (writer calls, the eviction threads, compaction) holds the table's mutex; lookups
 * never take it, and sample a quarter of their ids into a lossy ring the eviction threads
 * drain to decide admission and eviction (LFU or LRU).
 *
 * Status codes: every function that can fail returns an int (RS_OK = 0).
 * Strings for rs_xxh64_batch/_spans are UTF-8 bytes; XXH64 with seed 0, read as int64.
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
    RS_EIO = 5,         /* a record file could not be created, written or read */
    RS_ENOSPC = 6,      /* the SSD tier's byte budget cannot hold the rows */
};
enum { RS_POLICY_LFU = 0, RS_POLICY_LRU = 1 };
enum { RS_IO_MMAP = 0, RS_IO_PREAD = 1 };

enum { RS_COMBINER_NONE = 0, RS_COMBINER_SUM = 1, RS_COMBINER_MEAN = 2, RS_COMBINER_SQRTN = 3 };
/* What an unknown key gets: zeros; N(0, stddev) from (seed, key) (embedding_keys.c); or row
 * key mod count of a matrix (rs_table_set_default_rows: DeepRec's Embedding Variable). */
enum { RS_DEFAULT_ZEROS = 0, RS_DEFAULT_NORMAL = 1, RS_DEFAULT_ROWS = 2 };

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
/* Unknown key k gets row k mod count of rows[count, dim] (floor modulo: a negative k gets
 * row count - (-k mod count), never one out of range), copied into memory the table owns
 * (the shared arena once reserved: worker processes read it too); count >= 1. Call it
 * right after rs_table_create / rs_tiered_create, before any reader sees the table.
 * RS_EINVAL: count < 1 or the table already has rows as its default; RS_ENOMEM. */
RS_API int rs_table_set_default_rows(rs_table* t, const float* rows, int64_t count);
/* Frees the table; a tiered one stops its eviction work and deletes its record files. */
RS_API void rs_table_free(rs_table* t);

/* Worker processes reading tables in shared memory (rs_arena_reserve): each process counts
 * its in-flight reads in a slot of its own, 0..RS_READER_SLOTS-1 (0 unless set; set once,
 * before the process's first read). A process that died mid-read leaves its count behind,
 * and the table's retired memory would never be reclaimed: the process that built the
 * tables calls rs_reset_reader_slot(k) once the process using slot k is dead and before
 * another uses k; it zeroes slot k in every table this process created and has not freed.
 * rs_set_reader_slot returns RS_EINVAL for a slot out of range. */
#define RS_READER_SLOTS 256
RS_API int rs_set_reader_slot(int32_t slot);
RS_API void rs_reset_reader_slot(int32_t slot);
RS_API int64_t rs_table_size(rs_table* t);
/* Rows the storage holds (live, retired and free): for tests of slot recycling. */
RS_API int64_t rs_table_storage_rows(rs_table* t);

/* A tiered table's configuration. Every field is 8 bytes (ctypes fills it as int64s). */
typedef struct {
    const char* path;         /* existing directory the table owns: its record files go here */
    int64_t dram_bytes;       /* DRAM tier budget: rs_tier_capacity slots fit in it */
    int64_t ssd_bytes;        /* SSD tier budget: record bytes in files not yet compacted away */
    int64_t segment_bytes;    /* size of one record file */
    int64_t policy;           /* RS_POLICY_* */
    int64_t io;               /* RS_IO_*: how lookups read records */
    int64_t async_compaction; /* 0: writer calls compact; 1: the eviction threads do */
    int64_t eviction_threads; /* the process-wide pool grows to at least this many threads */
} rs_tier_config;

/* DRAM slots (rows) a budget of dram_bytes holds: a row plus its per-slot metadata each. */
RS_API int64_t rs_tier_capacity(int64_t dim, int64_t dram_bytes);
/* Of those, the slots admission leaves free for write-through updates of resident keys;
 * rs_tiered_create takes at most capacity - reserve resident rows. */
RS_API int64_t rs_tier_write_reserve(int64_t capacity);
/* Builds a tiered table over keys[n] and values[n, dim], which it copies (to record files,
 * in chunks, and rows resident[0..n_resident) of them to DRAM): the caller keeps the arrays.
 * resident must hold distinct rows, at most rs_tier_capacity - rs_tier_write_reserve.
 * *detail receives the duplicate key (RS_EDUPLICATE) or errno (RS_EIO). */
RS_API int rs_tiered_create(int64_t dim, int32_t default_kind, double stddev, uint64_t seed,
                            const int64_t* keys, const float* values, int64_t n,
                            const int64_t* resident, int64_t n_resident,
                            const rs_tier_config* config, rs_table** out, int64_t* detail);
/* RS_TIER_STATS counters (see the enum) of a tiered table; RS_EINVAL for a DRAM table. */
enum {
    RS_STAT_DRAM_CAPACITY, RS_STAT_DRAM_ROWS, RS_STAT_DRAM_BYTES, RS_STAT_INDEX_BYTES,
    RS_STAT_SSD_SEGMENTS, RS_STAT_SSD_RECORDS, RS_STAT_SSD_LIVE_RECORDS, RS_STAT_SSD_BYTES,
    RS_STAT_HITS, RS_STAT_MISSES, RS_STAT_PROMOTIONS, RS_STAT_EVICTIONS, RS_STAT_COMPACTIONS,
    RS_TIER_STATS
};
RS_API int rs_tier_stats(rs_table* t, int64_t* out);
/* Runs one admission/eviction round now, as an eviction thread would (then compaction if
 * it is due and asynchronous). For tests and benchmarks; never needed for correctness. */
RS_API int rs_tier_maintain(rs_table* t);
/* Compacts every record file holding garbage, now. */
RS_API int rs_tier_compact(rs_table* t);

/* Readers. */
RS_API int rs_lookup(const rs_lookup_task* tasks, int64_t n_tasks);
/* As rs_lookup, with every task's ids and out given as byte offsets from ids_base and
 * out_base: a caller reusing one task array per request shape passes it unchanged. */
RS_API int rs_lookup_at(const rs_lookup_task* tasks, int64_t n_tasks, const int64_t* ids_base,
                        float* out_base);
RS_API int rs_table_lookup(rs_table* t, const int64_t* ids, int64_t rows, int64_t width,
                           int64_t combiner, float* out);
RS_API int rs_table_contains(rs_table* t, const int64_t* keys, int64_t n, uint8_t* out);
/* Writes up to `capacity` live rows; returns the number of live rows seen (retry if larger),
 * or -1 if a record of the SSD tier could not be read. */
RS_API int64_t rs_table_snapshot(rs_table* t, int64_t* keys, float* values, int64_t capacity);
/* Writes up to `capacity` live keys (no rows); returns the number of live keys seen. */
RS_API int64_t rs_table_keys(rs_table* t, int64_t* keys, int64_t capacity);
/* For each position, the first live key at or after it in index order (wrapping). */
RS_API int rs_table_sample(rs_table* t, const uint64_t* positions, int64_t n, int64_t* out);

/* The writer (one at a time). keys must not hold -1; within a batch the last write wins.
 * On a tiered table every row is appended to the SSD tier; a key whose row is in DRAM gets
 * its new row there as well (write-through). RS_ENOSPC: nothing was applied. */
RS_API int rs_table_upsert(rs_table* t, const int64_t* keys, const float* values, int64_t n);
RS_API int rs_table_delete(rs_table* t, const int64_t* keys, int64_t n);

/* The shared arena (embedding_arena.c, DESIGN §9): worker processes forked after
 * rs_arena_reserve read the leader's tables at the same addresses. Reserve once, before any
 * table exists and before forking; NULL if the range cannot be mapped. A forked worker calls
 * rs_arena_detach at once and from then on only reads arena memory. stats: reserved bytes,
 * allocated bytes, peak allocated bytes, free extents. */
RS_API void* rs_arena_reserve(int64_t bytes);
RS_API void rs_arena_detach(void);
RS_API int rs_arena_contains(const void* p);
RS_API void rs_arena_stats(int64_t* out);
/* Row buffers for rs_table_create from the arena (the heap without one); 64-byte aligned. */
RS_API void* rs_arena_alloc(int64_t bytes);
RS_API void rs_arena_free(void* p);

/* Deterministic functions of keys (embedding_keys.c). */
RS_API void rs_default_vectors(double stddev, uint64_t seed, const int64_t* keys, int64_t n,
                               int64_t dim, float* out);
RS_API void rs_xxh64_batch(const uint8_t* data, const int64_t* starts, const int64_t* lengths,
                           int64_t n, int64_t* out);
/* The same over n (start, length) pairs laid out one after the other in `spans` (as the
 * request parser leaves string values); `out` may be `spans` itself: key i is written after
 * pair i is read, over pairs already read. */
RS_API void rs_xxh64_spans(const uint8_t* data, const int64_t* spans, int64_t n, int64_t* out);
/* TensorFlow's StringToHashBucketFast: Fingerprint64 (farmhash) of each string modulo
 * `buckets` (> 0); the empty string is padding (-1). Same layouts as the xxh64 calls. */
RS_API uint64_t rs_fingerprint64(const uint8_t* s, uint64_t len);
RS_API void rs_bucket_batch(const uint8_t* data, const int64_t* starts, const int64_t* lengths, int64_t n,
                            uint64_t buckets, int64_t* out);
RS_API void rs_bucket_spans(const uint8_t* data, const int64_t* spans, int64_t n, uint64_t buckets, int64_t* out);

/* Internal: one key's N(0, stddev) default row (the algorithm is in embedding_keys.c). */
void rs_default_vector(double stddev, uint64_t seed, int64_t key, int64_t dim, float* out);

#endif
