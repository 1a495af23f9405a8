/* recserve embedding engine: hash index + row storage + lock-free batch lookups.
 * The contract (layout, concurrency, status codes) is in embedding.h; tiered tables' record
 * files are in embedding_ssd.c and their DRAM tier's policy in embedding_tier.c.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "embedding_internal.h"

#define LOAD_NUM 7                /* rebuild the index above 70% occupied buckets */
#define LOAD_DEN 10
#define MIN_BUCKETS 16
#define HUGE_PAGE (2u << 20)

/* ---- index: key -> slot (the bucket layout is in embedding_internal.h) ---- */

uint64_t rs_index_capacity(int64_t keys) {
    uint64_t cap = MIN_BUCKETS;
    while ((uint64_t)keys * LOAD_DEN > cap * LOAD_NUM) cap <<= 1;
    return cap;
}

int64_t rs_index_max_used(const rs_index* ix) {
    return (int64_t)((ix->mask + 1) / LOAD_DEN * LOAD_NUM);
}

rs_index* rs_index_new(uint64_t capacity) {
    rs_index* ix = rs_mem_alloc(sizeof *ix, 64);
    if (!ix) return NULL;
    size_t bytes = capacity / LINE_BUCKETS * sizeof(line);
    void* mem = rs_mem_alloc(bytes, bytes >= HUGE_PAGE ? HUGE_PAGE : 64);
    if (!mem) {
        rs_mem_free(ix);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    /* Probes are random accesses: huge pages save a TLB miss on most of them. */
    if (bytes >= HUGE_PAGE) madvise(mem, bytes, MADV_HUGEPAGE);
#endif
    memset(mem, 0xFF, bytes); /* every bucket: key EMPTY_KEY, slot TOMBSTONE */
    ix->lines = mem;
    ix->mask = capacity - 1;
    ix->used = 0;
    return ix;
}

void rs_index_free(rs_index* ix) {
    if (!ix) return;
    rs_mem_free(ix->lines);
    rs_mem_free(ix);
}

/* ---- storage: slot -> row ---- */

static int storage_append(rs_storage* s, uint64_t* slot) {
    uint64_t e = s->extra_used;
    int k = 63 - __builtin_clzll((e >> EXTRA_SHIFT) + 1);
    if (k >= MAX_BLOCKS) return RS_ENOMEM;
    if (!atomic_load_explicit(&s->blocks[k], memory_order_relaxed)) {
        size_t rows = (size_t)1 << (k + EXTRA_SHIFT);
        float* block = alloc_rows(rows * (size_t)s->dim * sizeof(float));
        if (!block) return RS_ENOMEM;
        atomic_store_explicit(&s->blocks[k], block, memory_order_relaxed);
    }
    s->extra_used = e + 1;
    *slot = s->base_rows + e;
    return RS_OK;
}

static void storage_free(rs_storage* s) {
    for (int k = 0; k < MAX_BLOCKS; k++) rs_mem_free(atomic_load_explicit(&s->blocks[k], memory_order_relaxed));
}

/* ---- writer-side lists ---- */

int rs_grow_array(void** items, size_t* cap, size_t need, size_t item_size) {
    if (need <= *cap) return RS_OK;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void* p = rs_mem_grow(*items, *cap * item_size, cap2 * item_size);
    if (!p) return RS_ENOMEM;
    *items = p;
    *cap = cap2;
    return RS_OK;
}

static int index_push(index_list* l, rs_index* v) {
    if (rs_grow_array((void**)&l->items, &l->cap, l->len + 1, sizeof(rs_index*))) return RS_ENOMEM;
    l->items[l->len++] = v;
    return RS_OK;
}

/* ---- the table (struct rs_table is in embedding_internal.h) ---- */

static int32_t reader_slot; /* this process's (rs_set_reader_slot) */

int rs_set_reader_slot(int32_t slot) {
    if (slot < 0 || slot >= RS_READER_SLOTS) return RS_EINVAL;
    reader_slot = slot;
    return RS_OK;
}

/* The tables this process created and has not freed, for rs_reset_reader_slot: a list in
 * the process's own heap (never in the shared arena: a worker's copy must not write into the
 * leader's tables). */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static rs_table** live_tables;
static size_t live_len, live_cap;

static int live_add(rs_table* t) {
    pthread_mutex_lock(&live_lock);
    if (live_len == live_cap) {
        size_t cap = live_cap ? 2 * live_cap : 64;
        rs_table** grown = realloc(live_tables, cap * sizeof(*grown));
        if (!grown) {
            pthread_mutex_unlock(&live_lock);
            return RS_ENOMEM;
        }
        live_tables = grown;
        live_cap = cap;
    }
    live_tables[live_len++] = t;
    pthread_mutex_unlock(&live_lock);
    return RS_OK;
}

static void live_remove(rs_table* t) {
    pthread_mutex_lock(&live_lock);
    for (size_t i = 0; i < live_len; i++) {
        if (live_tables[i] == t) {
            live_tables[i] = live_tables[--live_len];
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

void rs_reset_reader_slot(int32_t slot) {
    if (slot < 0 || slot >= RS_READER_SLOTS) return;
    pthread_mutex_lock(&live_lock);
    for (size_t i = 0; i < live_len; i++) {
        atomic_store(&live_tables[i]->readers[slot].count[0], 0);
        atomic_store(&live_tables[i]->readers[slot].count[1], 0);
    }
    pthread_mutex_unlock(&live_lock);
}

static uint64_t reader_enter(rs_table* t) {
    _Atomic int64_t* count = t->readers[reader_slot].count;
    for (;;) {
        uint64_t g = atomic_load(&t->generation);
        atomic_fetch_add(&count[g & 1], 1);
        /* A flip between the load and the increment: the writer may not have counted us. */
        if (atomic_load(&t->generation) == g) return g;
        atomic_fetch_sub(&count[g & 1], 1);
    }
}

static void reader_exit(rs_table* t, uint64_t g) {
    atomic_fetch_sub_explicit(&t->readers[reader_slot].count[g & 1], 1, memory_order_release);
}

/* Whether any process has a read in flight in generation parity `parity`. */
static bool readers_in(rs_table* t, int parity) {
    for (int k = 0; k < RS_READER_SLOTS; k++)
        if (atomic_load(&t->readers[k].count[parity]) != 0) return true;
    return false;
}

static int release_waiting(rs_table* t) {
    slot_list* w = &t->waiting_slots;
    if (rs_grow_array((void**)&t->free_slots.items, &t->free_slots.cap, t->free_slots.len + w->len,
                      sizeof(uint64_t)))
        return RS_ENOMEM;
    if (w->len) memcpy(t->free_slots.items + t->free_slots.len, w->items, w->len * sizeof(uint64_t));
    t->free_slots.len += w->len;
    w->len = 0;
    for (size_t i = 0; i < t->waiting_indexes.len; i++) rs_index_free(t->waiting_indexes.items[i]);
    t->waiting_indexes.len = 0;
    for (size_t i = 0; i < t->waiting_segments.len; i++)
        rs_ssd_free_segment(t->tier, t->waiting_segments.items[i]);
    t->waiting_segments.len = 0;
    t->waiting = false;
    return RS_OK;
}

#define SWAP(type, a, b) do { type swap_ = (a); (a) = (b); (b) = swap_; } while (0)

/* Advances the epoch as far as readers allow; never waits. */
int rs_reclaim(rs_table* t) {
    if (t->waiting && !readers_in(t, t->waiting_parity)) {
        if (release_waiting(t)) return RS_ENOMEM;
    }
    if (!t->waiting &&
        (t->retired_slots.len || t->retired_indexes.len || t->retired_segments.len)) {
        uint64_t g = atomic_load(&t->generation);
        atomic_store(&t->generation, g + 1);
        SWAP(slot_list, t->waiting_slots, t->retired_slots);
        SWAP(index_list, t->waiting_indexes, t->retired_indexes);
        SWAP(slot_list, t->waiting_segments, t->retired_segments);
        t->waiting = true;
        t->waiting_parity = (int)(g & 1);
        if (!readers_in(t, (int)(g & 1))) return release_waiting(t);
    }
    return RS_OK;
}

rs_table* rs_table_alloc(int64_t dim, int32_t default_kind, double stddev, uint64_t seed) {
    size_t size = (sizeof(rs_table) + 63) / 64 * 64;
    rs_table* t = rs_mem_alloc(size, 64);
    if (!t) return NULL;
    memset(t, 0, size);
    t->dim = dim;
    t->default_kind = default_kind;
    t->stddev = stddev;
    t->seed = seed;
    t->storage.dim = dim;
    for (int k = 0; k < MAX_BLOCKS; k++) atomic_init(&t->storage.blocks[k], NULL);
    atomic_init(&t->generation, 0);
    for (int k = 0; k < RS_READER_SLOTS; k++) {
        atomic_init(&t->readers[k].count[0], 0);
        atomic_init(&t->readers[k].count[1], 0);
    }
    if (live_add(t)) {
        rs_mem_free(t);
        return NULL;
    }
    return t;
}

/* Builds the index of keys[n]: key i -> slot i | tag. */
int rs_index_load(rs_table* t, const int64_t* keys, int64_t n, uint64_t tag, int64_t* bad_key) {
    rs_index* ix = rs_index_new(rs_index_capacity(n));
    if (!ix) return RS_ENOMEM;
    uint64_t h[GROUP];
    for (int64_t c = 0; c < n; c += GROUP) {
        int64_t m = n - c < GROUP ? n - c : GROUP;
        for (int64_t i = 0; i < m; i++) {
            h[i] = hash_key(keys[c + i]);
            __builtin_prefetch(&ix->lines[home_line(h[i], ix->mask)], 1);
        }
        for (int64_t i = 0; i < m; i++) {
            int64_t key = keys[c + i];
            bucket b = index_find(ix, key, h[i]);
            if (key == EMPTY_KEY || atomic_load_explicit(b.key, memory_order_relaxed) == key) {
                *bad_key = key;
                rs_index_free(ix);
                return key == EMPTY_KEY ? RS_EINVAL : RS_EDUPLICATE;
            }
            atomic_store_explicit(b.slot, (uint64_t)(c + i) | tag, memory_order_relaxed);
            atomic_store_explicit(b.key, key, memory_order_relaxed);
        }
    }
    ix->used = n;
    atomic_init(&t->live, n);
    atomic_init(&t->index, ix);
    return RS_OK;
}

int rs_table_create(int64_t dim, int32_t default_kind, double stddev, uint64_t seed,
                    const int64_t* keys, float* values, int64_t n, rs_table** out,
                    int64_t* bad_key) {
    *out = NULL;
    if (dim <= 0 || n < 0 || (default_kind != RS_DEFAULT_ZEROS && default_kind != RS_DEFAULT_NORMAL))
        return RS_EINVAL;
    rs_table* t = rs_table_alloc(dim, default_kind, stddev, seed);
    if (!t) return RS_ENOMEM;
    t->storage.base = values;
    t->storage.base_rows = (uint64_t)n;
    int status = rs_index_load(t, keys, n, 0, bad_key);
    if (status != RS_OK) {
        rs_mem_free(t);
        return status;
    }
    *out = t;
    return RS_OK;
}

int rs_table_set_default_rows(rs_table* t, const float* rows, int64_t count) {
    if (count < 1 || t->default_rows != NULL) return RS_EINVAL;
    size_t bytes = (size_t)count * (size_t)t->dim * sizeof(float);
    float* copy = rs_mem_alloc(bytes, 64);
    if (!copy) return RS_ENOMEM;
    memcpy(copy, rows, bytes);
    t->default_rows = copy;
    t->default_count = count;
    t->default_kind = RS_DEFAULT_ROWS;
    return RS_OK;
}

void rs_table_free(rs_table* t) {
    if (!t) return;
    live_remove(t);
    if (t->tier) rs_tier_destroy(t); /* first: no eviction thread may touch t after this */
    rs_index_free(atomic_load(&t->index));
    for (size_t i = 0; i < t->retired_indexes.len; i++) rs_index_free(t->retired_indexes.items[i]);
    for (size_t i = 0; i < t->waiting_indexes.len; i++) rs_index_free(t->waiting_indexes.items[i]);
    rs_mem_free(t->retired_indexes.items);
    rs_mem_free(t->waiting_indexes.items);
    rs_mem_free(t->free_slots.items);
    rs_mem_free(t->retired_slots.items);
    rs_mem_free(t->waiting_slots.items);
    rs_mem_free(t->retired_segments.items);
    rs_mem_free(t->waiting_segments.items);
    storage_free(&t->storage);
    rs_mem_free((void*)t->default_rows);
    rs_mem_free(t);
}

int64_t rs_table_size(rs_table* t) { return atomic_load(&t->live); }

int64_t rs_table_storage_rows(rs_table* t) {
    return (int64_t)(t->storage.base_rows + t->storage.extra_used);
}

/* ---- lookups ---- */

static const float missing_row_marker;
#define MISSING_ROW (&missing_row_marker) /* known not to be a row: the key has no row */

#if defined(__SSE2__)
#include <emmintrin.h>
/* Bit q set where 64-bit lane q of a equals that of b (SSE2 has only 32-bit compares). */
static inline unsigned equal_lanes(__m128i a, __m128i b) {
    __m128i eq = _mm_cmpeq_epi32(a, b);
    eq = _mm_and_si128(eq, _mm_shuffle_epi32(eq, _MM_SHUFFLE(2, 3, 0, 1)));
    return (unsigned)_mm_movemask_pd(_mm_castsi128_pd(eq));
}

/* Bit q set where the line's key q equals `key`. Each key is written by one aligned 8-byte
 * store and x86 keeps loads in order, so two 16-byte loads read every key whole and no later
 * load passes them; the signal fence keeps the compiler from moving the slot's load up, which
 * makes this an acquire load of the keys. */
static inline unsigned line_match(const line* l, int64_t key) {
    const __m128i* keys = (const __m128i*)(const void*)l->keys;
    __m128i lo = _mm_load_si128(keys), hi = _mm_load_si128(keys + 1);
    atomic_signal_fence(memory_order_acquire);
    __m128i wanted = _mm_set1_epi64x(key);
    return equal_lanes(lo, wanted) | equal_lanes(hi, wanted) << 2;
}
#else
static inline unsigned line_match(const line* l, int64_t key) {
    unsigned match = 0;
    for (unsigned q = 0; q < LINE_BUCKETS; q++)
        match |= (unsigned)(atomic_load_explicit(&l->keys[q], memory_order_acquire) == key) << q;
    return match;
}
#endif

#define PADDING_SLOT (UINT64_MAX - 1) /* probe's answer for padding; never a stored slot */

/* The slot of `key`: PADDING_SLOT for padding, TOMBSTONE for an unknown key. A key lies in
 * the first line of its probe sequence with a match, and never beyond a line with an empty
 * bucket (keys are never removed from an index, only their slots). */
static inline uint64_t probe(const line* lines, uint64_t line_mask, int64_t key, uint64_t home) {
    if (key == EMPTY_KEY) return PADDING_SLOT;
    for (uint64_t g = home;; g = (g + 1) & line_mask) {
        unsigned match = line_match(&lines[g], key);
        if (match)
            return atomic_load_explicit(&lines[g].slots[__builtin_ctz(match)], memory_order_acquire);
        if (line_match(&lines[g], EMPTY_KEY)) return TOMBSTONE;
    }
}

/* What one lookup call did on a tiered table's tiers. */
typedef struct {
    float* rows;       /* RS_IO_PREAD: room for a group of rows read from record files */
    int status;        /* RS_EIO once a record could not be read */
    int64_t dram, ssd; /* ids served from each tier */
    uint64_t phase;    /* ids at positions k with (k + phase) % SAMPLE_EVERY == 0 are logged */
} tier_reads;

#define SAMPLE_EVERY 4

/* The row of an SSD record: in its file's mapping, or read into the call's buffer. */
static const float* ssd_row(const rs_tier* tier, uint64_t record, int64_t dim, int64_t i,
                            tier_reads* reads) {
    reads->ssd++;
    if (tier->io == RS_IO_MMAP) return ssd_mapped_row(tier, record);
    float* dst = reads->rows + i * dim;
    if (rs_ssd_read(tier, record, dst) != RS_OK) {
        reads->status = RS_EIO;
        return MISSING_ROW;
    }
    return dst;
}

/* Appends the sampled keys of a group to the access log with one atomic add; the eviction
 * threads read it (lossy: a lap overwrites what they have not read). */
static void log_accesses(rs_tier* tier, const int64_t* keys, const float* const* rows, int64_t m,
                         uint64_t phase) {
    int64_t sampled[GROUP / SAMPLE_EVERY + 1];
    int64_t count = 0;
    for (int64_t i = (int64_t)((SAMPLE_EVERY - phase % SAMPLE_EVERY) % SAMPLE_EVERY); i < m;
         i += SAMPLE_EVERY)
        if (rows[i] != NULL && rows[i] != MISSING_ROW) sampled[count++] = keys[i];
    if (count == 0) return;
    uint64_t at = atomic_fetch_add_explicit(&tier->log_head, (uint64_t)count, memory_order_relaxed);
    for (int64_t j = 0; j < count; j++)
        atomic_store_explicit(&tier->log[(at + (uint64_t)j) & (ACCESS_LOG - 1)], sampled[j],
                              memory_order_relaxed);
}

/* Every cache line of the row: one prefetch per 64 bytes, and one for its last byte. */
static inline void prefetch_row(const float* row, size_t bytes) {
    if (row == NULL || row == MISSING_ROW) return;
    const char* p = (const char*)row;
    for (size_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(p + offset);
    __builtin_prefetch(p + bytes - 1);
}

/* Row key mod default_count of an RS_DEFAULT_ROWS table's matrix (floor modulo). */
static inline const float* matrix_row(const rs_table* t, int64_t key) {
    int64_t r = key % t->default_count;
    if (r < 0) r += t->default_count;
    return t->default_rows + r * t->dim;
}

static inline void emit_row(const rs_table* t, int64_t key, const float* row, float* dst) {
    const int64_t dim = t->dim;
    if (row == NULL || (row == MISSING_ROW && t->default_kind == RS_DEFAULT_ZEROS)) {
        memset(dst, 0, (size_t)dim * sizeof(float));
    } else if (row == MISSING_ROW && t->default_kind == RS_DEFAULT_ROWS) {
        memcpy(dst, matrix_row(t, key), (size_t)dim * sizeof(float));
    } else if (row == MISSING_ROW) {
        rs_default_vector(t->stddev, t->seed, key, dim, dst);
    } else if (dim == 16) {
        memcpy(dst, row, 16 * sizeof(float)); /* the common case, inlined */
    } else {
        memcpy(dst, row, (size_t)dim * sizeof(float));
    }
}

/* acc += the row (padding adds nothing); `scratch` receives a default row. */
static inline void pool_row(const rs_table* t, int64_t key, const float* row, float* restrict acc,
                            float* scratch) {
    if (row == NULL || (row == MISSING_ROW && t->default_kind == RS_DEFAULT_ZEROS)) return;
    if (row == MISSING_ROW && t->default_kind == RS_DEFAULT_ROWS) {
        row = matrix_row(t, key);
    } else if (row == MISSING_ROW) {
        rs_default_vector(t->stddev, t->seed, key, t->dim, scratch);
        row = scratch;
    }
    for (int64_t d = 0; d < t->dim; d++) acc[d] += row[d];
}

enum { EMIT, POOL, CONTAINS };

/* A lookup does three passes over each group of GROUP ids: hash every id and prefetch its
 * home line; probe every id (its line has arrived meanwhile) and prefetch its row (a record
 * of a tiered table's SSD tier is prefetched from its file's mapping, or read); then
 * copy, pool or test every id. Each pass issues its cache misses back to back, so the
 * memory system always has as many in flight as it can take, although every row address
 * depends on a bucket read first; a group's lines and rows (~100 KB) stay in L2 between
 * passes. Pooling consumes ids in order, so float32 sums are in id order. */
static inline __attribute__((always_inline)) void pipeline(
    const rs_table* t, const rs_index* ix, const int64_t* ids, int64_t n, int mode,
    int64_t width, float* out, uint8_t* found, float* scratch, tier_reads* reads) {
    uint64_t homes[GROUP];
    const float* rows[GROUP];
    const line* lines = ix->lines;
    const uint64_t line_mask = ix->mask / LINE_BUCKETS;
    const int64_t dim = t->dim;
    const size_t bytes = (size_t)dim * sizeof(float);
    int64_t sample = 0, position = 0; /* of id k in [rows, width], for POOL */
    for (int64_t c = 0; c < n; c += GROUP) {
        const int64_t m = n - c < GROUP ? n - c : GROUP;
        const int64_t* group = ids + c;
        for (int64_t i = 0; i < m; i++) {
            uint64_t h = home_line(hash_key(group[i]), ix->mask);
            homes[i] = h;
            __builtin_prefetch(&lines[h]);
        }
        for (int64_t i = 0; i < m; i++) {
            const uint64_t slot = probe(lines, line_mask, group[i], homes[i]);
            const float* row;
            if (slot < SSD_TAG) {
                row = storage_row(&t->storage, slot);
                if (reads) reads->dram++;
            } else if (slot >= PADDING_SLOT) {
                row = slot == PADDING_SLOT ? NULL : MISSING_ROW;
            } else if (mode == CONTAINS) {
                row = (const float*)group; /* any pointer but NULL and MISSING_ROW: found */
            } else {
                row = ssd_row(t->tier, slot - SSD_TAG, dim, i, reads);
            }
            rows[i] = row;
            if (mode != CONTAINS) prefetch_row(row, bytes);
        }
        if (reads && mode != CONTAINS) log_accesses(t->tier, group, rows, m, reads->phase + c);
        for (int64_t i = 0; i < m; i++) {
            const int64_t k = c + i;
            if (mode == EMIT) {
                emit_row(t, ids[k], rows[i], out + k * dim);
            } else if (mode == POOL) {
                pool_row(t, ids[k], rows[i], out + sample * dim, scratch);
                if (++position == width) {
                    position = 0;
                    sample++;
                }
            } else {
                found[k] = rows[i] != NULL && rows[i] != MISSING_ROW;
            }
        }
    }
}

static void scale_pooled(const int64_t* ids, int64_t n_rows, int64_t width, int64_t dim,
                         int64_t combiner, float* out) {
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t count = 0;
        for (int64_t l = 0; l < width; l++) count += ids[r * width + l] != EMPTY_KEY;
        if (count == 0) continue;
        float divisor = combiner == RS_COMBINER_MEAN ? (float)count : sqrtf((float)count);
        for (int64_t d = 0; d < dim; d++) out[r * dim + d] /= divisor;
    }
}

/* A tiered table's per-call read state; reads->rows is freed by tier_reads_end. */
static int tier_reads_begin(const rs_table* t, tier_reads* reads) {
    static _Thread_local uint64_t calls;
    memset(reads, 0, sizeof *reads);
    reads->phase = hash_key((int64_t)++calls); /* a fresh sampling phase per call */
    if (t->tier->io == RS_IO_PREAD) {
        reads->rows = malloc((size_t)GROUP * (size_t)t->dim * sizeof(float));
        if (!reads->rows) return RS_ENOMEM;
    }
    return RS_OK;
}

static int tier_reads_end(const rs_table* t, tier_reads* reads) {
    atomic_fetch_add_explicit(&t->tier->hits, reads->dram, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->tier->misses, reads->ssd, memory_order_relaxed);
    free(reads->rows);
    return reads->status;
}

static int run_task(const rs_lookup_task* task) {
    rs_table* t = task->table;
    const int64_t combiner = task->combiner, width = task->width, n_rows = task->rows;
    if (combiner < RS_COMBINER_NONE || combiner > RS_COMBINER_SQRTN || n_rows < 0 || width < 0)
        return RS_EINVAL;
    const int64_t n = n_rows * width, dim = t->dim;
    float* scratch = NULL;
    if (combiner != RS_COMBINER_NONE) {
        memset(task->out, 0, (size_t)(n_rows * dim) * sizeof(float));
        if (t->default_kind == RS_DEFAULT_NORMAL && n > 0) {
            scratch = malloc((size_t)dim * sizeof(float));
            if (!scratch) return RS_ENOMEM;
        }
    }
    tier_reads tier_state, *reads = NULL;
    if (t->tier) {
        if (tier_reads_begin(t, &tier_state) != RS_OK) {
            free(scratch);
            return RS_ENOMEM;
        }
        reads = &tier_state;
    }
    uint64_t g = reader_enter(t);
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_acquire);
    if (combiner == RS_COMBINER_NONE)
        pipeline(t, ix, task->ids, n, EMIT, width, task->out, NULL, NULL, reads);
    else
        pipeline(t, ix, task->ids, n, POOL, width, task->out, NULL, scratch, reads);
    reader_exit(t, g);
    free(scratch);
    if (reads && tier_reads_end(t, reads) != RS_OK) return RS_EIO;
    if (combiner == RS_COMBINER_MEAN || combiner == RS_COMBINER_SQRTN)
        scale_pooled(task->ids, n_rows, width, dim, combiner, task->out);
    return RS_OK;
}

int rs_lookup(const rs_lookup_task* tasks, int64_t n_tasks) {
    for (int64_t i = 0; i < n_tasks; i++) {
        int status = run_task(&tasks[i]);
        if (status != RS_OK) return status;
    }
    return RS_OK;
}

int rs_lookup_at(const rs_lookup_task* tasks, int64_t n_tasks, const int64_t* ids_base,
                 float* out_base) {
    for (int64_t i = 0; i < n_tasks; i++) {
        rs_lookup_task task = tasks[i];
        task.ids = (const int64_t*)(const void*)((const char*)ids_base + (intptr_t)task.ids);
        task.out = (float*)(void*)((char*)out_base + (intptr_t)task.out);
        int status = run_task(&task);
        if (status != RS_OK) return status;
    }
    return RS_OK;
}

int rs_table_lookup(rs_table* t, const int64_t* ids, int64_t rows, int64_t width, int64_t combiner,
                    float* out) {
    rs_lookup_task task = {t, ids, out, rows, width, combiner};
    return run_task(&task);
}

int rs_table_contains(rs_table* t, const int64_t* keys, int64_t n, uint8_t* out) {
    uint64_t g = reader_enter(t);
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_acquire);
    pipeline(t, ix, keys, n, CONTAINS, 1, NULL, out, NULL, NULL);
    reader_exit(t, g);
    return RS_OK;
}

int64_t rs_table_snapshot(rs_table* t, int64_t* keys, float* values, int64_t capacity) {
    uint64_t g = reader_enter(t);
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_acquire);
    const size_t bytes = (size_t)t->dim * sizeof(float);
    int64_t count = 0;
    bool failed = false;
    for (uint64_t i = 0; i <= ix->mask; i++) {
        bucket b = bucket_at(ix, i);
        int64_t k = atomic_load_explicit(b.key, memory_order_acquire);
        if (k == EMPTY_KEY) continue;
        uint64_t slot = atomic_load_explicit(b.slot, memory_order_acquire);
        if (slot == TOMBSTONE) continue;
        if (count < capacity) {
            keys[count] = k;
            if (slot < SSD_TAG) {
                memcpy(values + count * t->dim, storage_row(&t->storage, slot), bytes);
            } else if (rs_ssd_read(t->tier, slot - SSD_TAG, values + count * t->dim) != RS_OK) {
                failed = true;
                break;
            }
        }
        count++;
    }
    reader_exit(t, g);
    return failed ? -1 : count;
}

int64_t rs_table_keys(rs_table* t, int64_t* keys, int64_t capacity) {
    uint64_t g = reader_enter(t);
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_acquire);
    int64_t count = 0;
    for (uint64_t i = 0; i <= ix->mask; i++) {
        bucket b = bucket_at(ix, i);
        int64_t k = atomic_load_explicit(b.key, memory_order_acquire);
        if (k == EMPTY_KEY || atomic_load_explicit(b.slot, memory_order_acquire) == TOMBSTONE) continue;
        if (count < capacity) keys[count] = k;
        count++;
    }
    reader_exit(t, g);
    return count;
}

int rs_table_sample(rs_table* t, const uint64_t* positions, int64_t n, int64_t* out) {
    int status = RS_OK;
    uint64_t g = reader_enter(t);
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_acquire);
    for (int64_t i = 0; i < n && status == RS_OK; i++) {
        status = RS_EEMPTY;
        for (uint64_t j = 0, p = positions[i] & ix->mask; j <= ix->mask; j++, p = (p + 1) & ix->mask) {
            bucket b = bucket_at(ix, p);
            int64_t k = atomic_load_explicit(b.key, memory_order_acquire);
            if (k != EMPTY_KEY && atomic_load_explicit(b.slot, memory_order_acquire) != TOMBSTONE) {
                out[i] = k;
                status = RS_OK;
                break;
            }
        }
    }
    reader_exit(t, g);
    return status;
}

/* ---- the writer ---- */

/* Rebuilds the index with room to spare; readers keep the old one until they are done. */
int rs_rebuild_index(rs_table* t) {
    rs_index* old = atomic_load_explicit(&t->index, memory_order_relaxed);
    int64_t live = atomic_load_explicit(&t->live, memory_order_relaxed);
    rs_index* ix = rs_index_new(rs_index_capacity(2 * (live + 1)));
    if (!ix) return RS_ENOMEM;
    for (uint64_t i = 0; i <= old->mask; i++) {
        bucket from = bucket_at(old, i);
        int64_t k = atomic_load_explicit(from.key, memory_order_relaxed);
        uint64_t slot = atomic_load_explicit(from.slot, memory_order_relaxed);
        if (k == EMPTY_KEY || slot == TOMBSTONE) continue;
        bucket b = index_find(ix, k, hash_key(k));
        atomic_store_explicit(b.slot, slot, memory_order_relaxed);
        atomic_store_explicit(b.key, k, memory_order_relaxed);
        ix->used++;
    }
    if (index_push(&t->retired_indexes, old)) {
        rs_index_free(ix);
        return RS_ENOMEM;
    }
    atomic_store_explicit(&t->index, ix, memory_order_release);
    return RS_OK;
}

int rs_index_bucket_for_write(rs_table* t, int64_t key, rs_index** ix, bucket* b, bool* is_new) {
    *ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    uint64_t h = hash_key(key);
    *b = index_find(*ix, key, h);
    *is_new = atomic_load_explicit(b->key, memory_order_relaxed) != key;
    if (*is_new && (*ix)->used + 1 > rs_index_max_used(*ix)) {
        if (rs_rebuild_index(t)) return RS_ENOMEM;
        *ix = atomic_load_explicit(&t->index, memory_order_relaxed);
        *b = index_find(*ix, key, h);
    }
    return RS_OK;
}

static int upsert_one(rs_table* t, int64_t key, const float* row) {
    rs_index* ix;
    bucket b;
    bool is_new;
    if (rs_index_bucket_for_write(t, key, &ix, &b, &is_new)) return RS_ENOMEM;
    uint64_t slot;
    if (t->free_slots.len) {
        slot = t->free_slots.items[--t->free_slots.len];
    } else if (storage_append(&t->storage, &slot)) {
        return RS_ENOMEM;
    }
    memcpy(storage_row(&t->storage, slot), row, (size_t)t->dim * sizeof(float));
    if (is_new) {
        atomic_store_explicit(b.slot, slot, memory_order_relaxed);
        atomic_store_explicit(b.key, key, memory_order_release);
        ix->used++;
        atomic_fetch_add(&t->live, 1);
        return RS_OK;
    }
    uint64_t old = atomic_load_explicit(b.slot, memory_order_relaxed);
    atomic_store_explicit(b.slot, slot, memory_order_release);
    if (old == TOMBSTONE) {
        atomic_fetch_add(&t->live, 1);
        return RS_OK;
    }
    return slot_push(&t->retired_slots, old);
}

int rs_table_upsert(rs_table* t, const int64_t* keys, const float* values, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (keys[i] == EMPTY_KEY) return RS_EINVAL;
    if (t->tier) return rs_tier_upsert(t, keys, values, n);
    int status = rs_reclaim(t);
    for (int64_t i = 0; i < n && status == RS_OK; i++) {
        status = upsert_one(t, keys[i], values + i * t->dim);
    }
    int after = rs_reclaim(t);
    return status != RS_OK ? status : after;
}

int rs_table_delete(rs_table* t, const int64_t* keys, int64_t n) {
    if (t->tier) return rs_tier_delete(t, keys, n);
    int status = rs_reclaim(t);
    rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    for (int64_t i = 0; i < n && status == RS_OK; i++) {
        uint64_t old = unpublish_key(t, ix, keys[i]);
        if (old != TOMBSTONE) status = slot_push(&t->retired_slots, old);
    }
    int after = rs_reclaim(t);
    return status != RS_OK ? status : after;
}
