/* recserve embedding engine, internal: the structures embedding.c (index, DRAM storage,
 * lookups), embedding_ssd.c (the SSD record tier) and embedding_tier.c (admission/eviction
 * and the background threads) share. Not part of the library's interface.
 */
#ifndef RECSERVE_EMBEDDING_INTERNAL_H
#define RECSERVE_EMBEDDING_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "embedding.h"

#define EMPTY_KEY (-1)            /* never a real key: -1 is padding */
#define TOMBSTONE UINT64_MAX      /* the slot of a deleted key (and of an empty bucket) */
/* A bucket's slot with this bit set (and not TOMBSTONE) is a record number of the SSD tier;
 * without it, a row of DRAM storage. DRAM-only tables never set it. */
#define SSD_TAG (1ULL << 62)
#define GROUP 512                 /* lookups work through ids in groups (embedding.c) */

/* ---- memory the table owns (embedding_arena.c) ---- */

/* The heap, or the shared arena once the leader of worker processes reserved it: every
 * allocation a table owns goes through these, so its pointers mean the same in every
 * process forked after the reservation. Scratch memory of one call uses malloc. */
void* rs_mem_alloc(size_t bytes, size_t alignment);
void rs_mem_free(void* p);
void* rs_mem_grow(void* p, size_t old_bytes, size_t new_bytes);

/* ---- index: key -> slot ---- */

/* Buckets come four to a 64-byte line, keys first: a probe loads the line's keys with two
 * vector loads and compares them at once. Bucket p is lane p % 4 of line p / 4. */
#define LINE_BUCKETS 4
typedef struct {
    _Atomic int64_t keys[LINE_BUCKETS];
    _Atomic uint64_t slots[LINE_BUCKETS];
} line;

typedef struct {
    line* lines;
    uint64_t mask; /* buckets - 1 */
    int64_t used;  /* buckets holding a key, live or deleted; writer only */
} rs_index;

typedef struct {
    _Atomic int64_t* key;
    _Atomic uint64_t* slot;
} bucket;

static inline bucket bucket_at(const rs_index* ix, uint64_t p) {
    line* l = &ix->lines[p / LINE_BUCKETS];
    return (bucket){&l->keys[p % LINE_BUCKETS], &l->slots[p % LINE_BUCKETS]};
}

static inline uint64_t hash_key(int64_t key) {
    uint64_t h = (uint64_t)key; /* murmur3's fmix64: sequential keys spread over the table */
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 33);
}

/* A key's probe sequence (linear probing) starts at the first bucket of the line its hash
 * picks: at 60-70% load most keys then sit in that line, so a lookup costs one cache miss. */
static inline uint64_t home_line(uint64_t h, uint64_t mask) { return (h & mask) / LINE_BUCKETS; }

/* The bucket holding `key`, or the empty bucket where it would go. */
static inline bucket index_find(const rs_index* ix, int64_t key, uint64_t h) {
    for (uint64_t p = home_line(h, ix->mask) * LINE_BUCKETS;; p = (p + 1) & ix->mask) {
        bucket b = bucket_at(ix, p);
        int64_t k = atomic_load_explicit(b.key, memory_order_acquire);
        if (k == key || k == EMPTY_KEY) return b;
    }
}

rs_index* rs_index_new(uint64_t capacity);
void rs_index_free(rs_index* ix);
uint64_t rs_index_capacity(int64_t keys);
int64_t rs_index_max_used(const rs_index* ix);

/* ---- DRAM storage: slot -> row ---- */

/* Row buffers start on a cache line, so a row of 16 floats is one line, not two (a lookup
 * then misses on its index line and one row line). recserve.embedding.empty_rows lays out
 * the rows it hands to rs_table_create the same way. */
static inline float* alloc_rows(size_t bytes) { return rs_mem_alloc(bytes ? bytes : 64, 64); }

#define EXTRA_SHIFT 10 /* upsert block k holds 1024 << k rows */
#define MAX_BLOCKS 48

typedef struct {
    int64_t dim;
    float* base; /* block 0: the adopted values (tiered: the DRAM tier), slots [0, base_rows) */
    uint64_t base_rows;
    _Atomic(float*) blocks[MAX_BLOCKS]; /* upsert blocks, allocated by the writer */
    uint64_t extra_used;                 /* writer only */
} rs_storage;

static inline float* storage_row(const rs_storage* s, uint64_t slot) {
    if (slot < s->base_rows) return s->base + slot * (uint64_t)s->dim;
    uint64_t e = slot - s->base_rows;
    int k = 63 - __builtin_clzll((e >> EXTRA_SHIFT) + 1);
    uint64_t offset = e - ((((uint64_t)1 << k) - 1) << EXTRA_SHIFT);
    /* Relaxed is enough: the slot itself was read with acquire after this pointer was set. */
    return atomic_load_explicit(&s->blocks[k], memory_order_relaxed) + offset * (uint64_t)s->dim;
}

/* ---- writer-side lists ---- */

typedef struct {
    uint64_t* items;
    size_t len, cap;
} slot_list;

typedef struct {
    rs_index** items;
    size_t len, cap;
} index_list;

int rs_grow_array(void** items, size_t* cap, size_t need, size_t item_size);

static inline int slot_push(slot_list* l, uint64_t v) {
    if (rs_grow_array((void**)&l->items, &l->cap, l->len + 1, sizeof(uint64_t))) return RS_ENOMEM;
    l->items[l->len++] = v;
    return RS_OK;
}

/* ---- the SSD tier (embedding_ssd.c) and its DRAM cache policy (embedding_tier.c) ---- */

#define SEGMENT_CHUNK 1024 /* segments per directory chunk */
#define SEGMENT_CHUNKS 4096
#define ACCESS_LOG 16384   /* sampled accesses kept for the eviction threads (power of two) */
#define PENDING_MAX 1024

/* One record file. fd and map are set before any of its records is published and cleared
 * only after a grace period, so readers use them without synchronisation of their own. */
typedef struct {
    int fd;
    const char* map;  /* read-only shared mapping of the whole file (RS_IO_MMAP), or NULL */
    int64_t written;  /* records appended; writer only */
    int64_t live;     /* records some key still points at; writer only */
    /* Compaction found live records whose stored key no longer names them (the file was
     * written by someone else): it keeps serving them and is never compacted. Writer only. */
    bool damaged;
} rs_segment;

typedef struct rs_tier {
    /* Read by lookups. */
    int64_t record_bytes;    /* 8-byte key + the row */
    int64_t segment_records; /* records per segment file */
    int32_t io;              /* RS_IO_MMAP or RS_IO_PREAD */
    _Atomic(rs_segment*) segments[SEGMENT_CHUNKS];

    /* Written by lookups: counters and the sampled access log (lossy ring). */
    _Alignas(64) _Atomic uint64_t log_head;
    _Atomic int64_t hits, misses;
    _Atomic int64_t log[ACCESS_LOG];

    /* Every mutation of the table (writer calls, eviction rounds, compaction) holds `lock`;
     * lookups never take it. Everything below is guarded by it. */
    _Alignas(64) pthread_mutex_t lock;
    int32_t policy;
    int32_t async_compaction;
    int64_t capacity;       /* DRAM slots */
    int64_t resident;       /* DRAM slots holding a row some key points at */
    int64_t* slot_key;      /* per DRAM slot: its key, EMPTY_KEY when free or retired */
    uint64_t* slot_record;  /* per DRAM slot: the SSD record holding the same row */
    uint32_t* stamp;        /* LRU: access clock of the slot's last sampled access */
    uint8_t* sketch;        /* LFU: count-min sketch, SKETCH_DEPTH rows of sketch_width */
    int64_t sketch_width, sketch_adds;
    uint32_t clock;
    _Atomic uint64_t log_tail; /* read without the lock by the pool to look for work */
    uint64_t rng;
    int64_t pending[PENDING_MAX]; /* keys admitted whose DRAM slot is still in its grace period */
    int64_t pending_len;
    int64_t segment_count;  /* segments created; the last one takes appends */
    int64_t segments_open;  /* created and not yet deleted */
    int64_t records_total;  /* records in segments not retired */
    int64_t records_live;
    int64_t ssd_limit;      /* bytes */
    int64_t promotions, evictions, compactions;
    char* path;
    /* Claimed by one pool thread at a time (embedding_tier.c). */
    _Atomic int claimed;
    bool registered;
} rs_tier;

#define SKETCH_DEPTH 4
/* DRAM bytes per slot besides its row: slot_key, slot_record, stamp and the sketch. */
#define SLOT_OVERHEAD (8 + 8 + 4 + SKETCH_DEPTH)

static inline rs_segment* segment_at(const rs_tier* tier, uint64_t segment) {
    rs_segment* chunk =
        atomic_load_explicit(&tier->segments[segment / SEGMENT_CHUNK], memory_order_relaxed);
    return &chunk[segment % SEGMENT_CHUNK];
}

/* ---- the table ---- */

struct rs_table {
    _Atomic(rs_index*) index;
    rs_storage storage;
    int64_t dim;
    int32_t default_kind;
    double stddev;
    uint64_t seed;
    const float* default_rows; /* RS_DEFAULT_ROWS: [default_count, dim], owned (rs_mem_alloc) */
    int64_t default_count;
    _Atomic int64_t live;
    rs_tier* tier; /* NULL for a DRAM-only table */

    /* Reader epoch (see embedding.h), on its own cache line; readers count in their
     * process's slot (rs_set_reader_slot), each on a line of its own, so that a process
     * that dies mid-read can be forgotten (rs_reset_reader_slot). */
    _Alignas(64) _Atomic uint64_t generation;
    struct { _Alignas(64) _Atomic int64_t count[2]; } readers[RS_READER_SLOTS];

    /* Writer only. Retired memory moves retired -> waiting (at a generation flip) -> free
     * (once the waiting generation has no reader left). Segments are record files. */
    _Alignas(64) slot_list free_slots;
    slot_list retired_slots, waiting_slots;
    index_list retired_indexes, waiting_indexes;
    slot_list retired_segments, waiting_segments;
    bool waiting;
    int waiting_parity;
};

/* Writer only: unpublishes `key` (readers see it as unknown from now on) and returns the
 * slot it pointed at, which the caller retires; TOMBSTONE when the key was not live. */
static inline uint64_t unpublish_key(rs_table* t, const rs_index* ix, int64_t key) {
    if (key == EMPTY_KEY) return TOMBSTONE;
    bucket b = index_find(ix, key, hash_key(key));
    if (atomic_load_explicit(b.key, memory_order_relaxed) != key) return TOMBSTONE;
    uint64_t old = atomic_load_explicit(b.slot, memory_order_relaxed);
    if (old == TOMBSTONE) return TOMBSTONE;
    atomic_store_explicit(b.slot, TOMBSTONE, memory_order_release);
    atomic_fetch_sub(&t->live, 1);
    return old;
}

rs_table* rs_table_alloc(int64_t dim, int32_t default_kind, double stddev, uint64_t seed);
int rs_reclaim(rs_table* t);
int rs_rebuild_index(rs_table* t);
/* Writer: the bucket for `key` in the current index (its own, or the empty one it would take,
 * rebuilding a fuller index first so a new key fits); *is_new says which. RS_ENOMEM. */
int rs_index_bucket_for_write(rs_table* t, int64_t key, rs_index** ix, bucket* b, bool* is_new);
int rs_index_load(rs_table* t, const int64_t* keys, int64_t n, uint64_t tag, int64_t* bad_key);

/* embedding_ssd.c */
int rs_ssd_open(rs_tier* tier, int64_t dim, const rs_tier_config* config);
void rs_ssd_close(rs_tier* tier); /* closes and deletes every record file */
int rs_ssd_append_many(rs_tier* tier, const int64_t* keys, const float* rows, int64_t n,
                       uint64_t* first);
int rs_ssd_read(const rs_tier* tier, uint64_t record, float* row);
void rs_ssd_garbage(rs_tier* tier, uint64_t record);
void rs_ssd_free_segment(rs_tier* tier, uint64_t segment);
bool rs_ssd_wants_compaction(const rs_tier* tier);
int rs_ssd_compact(rs_table* t, bool everything, int64_t max_segments);

static inline const float* ssd_mapped_row(const rs_tier* tier, uint64_t record) {
    uint64_t p = (uint64_t)tier->segment_records;
    return (const float*)(const void*)(segment_at(tier, record / p)->map +
                                       (record % p) * (uint64_t)tier->record_bytes + 8);
}

/* embedding_tier.c */
int rs_tier_upsert(rs_table* t, const int64_t* keys, const float* values, int64_t n);
int rs_tier_delete(rs_table* t, const int64_t* keys, int64_t n);
void rs_tier_destroy(rs_table* t); /* stops eviction work, deletes files, frees the tier */

#endif
