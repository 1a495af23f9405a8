/* recserve embedding engine: a tiered table's DRAM tier, its writes, and the eviction pool.
 *
 * The DRAM tier is `capacity` fixed slots (rs_tier_capacity: a row plus SLOT_OVERHEAD bytes
 * of metadata each fit in the budget), a cache of rows whose records stay in the SSD tier;
 * a key points at its DRAM slot while it is resident, else at its record.
 *
 * Admission and eviction. Lookups never change the table; they log a quarter of their ids
 * (sampled by position, hits and misses alike) into a lossy ring. Eviction threads drain it:
 *   - LFU (default): every sampled key counts in a count-min sketch (4 x capacity 8-bit
 *     counters, halved every 10 x capacity samples so that old popularity fades). A sampled
 *     key on SSD is admitted into a free slot while the tier has one; once it is full, it is
 *     admitted only if its estimate beats that of the least frequent of 5 random resident
 *     keys, which is evicted (TinyLFU with sampled eviction).
 *   - LRU: a sampled resident key gets the current access clock; a sampled key on SSD is
 *     always admitted, evicting the least recently sampled of 5 random resident keys.
 * An evicted slot is reusable only after the readers' grace period; the admitted key waits
 * in `pending` (at most PENDING_MAX) and takes the next slot that comes free. Eviction only
 * repoints the key at its record (never torn: the record is immutable).
 *
 * Writes are write-through: upsert appends the row to the SSD tier; a resident key also
 * gets the row in a fresh DRAM slot. Admission leaves rs_tier_write_reserve slots free for
 * that (1/16 of the tier, at most 256); only if they are all in their grace period does the
 * key go back to its new record.
 *
 * The pool: TF_MULTI_TIER_EV_EVICTION_THREADS threads per process (rs_tier_config's
 * eviction_threads; the pool grows to the largest asked for) serve every tiered table, one
 * table per thread at a time, a round of at most ROUND_ENTRIES log entries (and, with async
 * compaction, one segment) under the table's mutex. Threads exit when no tiered table is
 * left and are started again by the next one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <time.h>

#include "embedding_internal.h"

#define VICTIM_SAMPLES 5
#define ROUND_ENTRIES 4096
#define IDLE_NS 1000000 /* a pool thread with nothing to do sleeps this long */

/* ---- slots ---- */

static int take_slot(rs_table* t, uint64_t* slot) {
    if (t->free_slots.len == 0) return RS_ENOMEM;
    *slot = t->free_slots.items[--t->free_slots.len];
    return RS_OK;
}

/* The slot no longer holds a key's row; it is reused after the grace period. */
static int drop_slot(rs_table* t, uint64_t slot) {
    t->tier->slot_key[slot] = EMPTY_KEY;
    t->tier->resident--;
    return slot_push(&t->retired_slots, slot);
}

static void fill_slot(rs_table* t, uint64_t slot, int64_t key, uint64_t record) {
    rs_tier* tier = t->tier;
    tier->slot_key[slot] = key;
    tier->slot_record[slot] = record;
    tier->stamp[slot] = tier->clock;
    tier->resident++;
}

/* ---- the count-min sketch (LFU) ---- */

static inline uint64_t sketch_cell(const rs_tier* tier, int64_t key, int row) {
    uint64_t h = hash_key(key ^ (int64_t)(0x9E3779B97F4A7C15ULL * (uint64_t)(row + 1)));
    return (uint64_t)row * (uint64_t)tier->sketch_width +
           (((h >> 32) * (uint64_t)tier->sketch_width) >> 32);
}

static void sketch_add(rs_tier* tier, int64_t key) {
    for (int r = 0; r < SKETCH_DEPTH; r++) {
        uint8_t* c = &tier->sketch[sketch_cell(tier, key, r)];
        if (*c < UINT8_MAX) (*c)++;
    }
    if (++tier->sketch_adds >= 10 * tier->sketch_width) {
        for (int64_t i = 0; i < SKETCH_DEPTH * tier->sketch_width; i++) tier->sketch[i] >>= 1;
        tier->sketch_adds = 0;
    }
}

static uint32_t sketch_estimate(const rs_tier* tier, int64_t key) {
    uint32_t best = UINT8_MAX;
    for (int r = 0; r < SKETCH_DEPTH; r++) {
        uint32_t c = tier->sketch[sketch_cell(tier, key, r)];
        if (c < best) best = c;
    }
    return best;
}

/* ---- admission and eviction ---- */

static uint64_t next_random(rs_tier* tier) {
    tier->rng += 0x9E3779B97F4A7C15ULL;
    return hash_key((int64_t)tier->rng);
}

/* How keen the policy is to keep a slot: lower is evicted first. */
static uint64_t keep_score(const rs_tier* tier, uint64_t slot) {
    if (tier->policy == RS_POLICY_LRU) return UINT32_MAX - (uint32_t)(tier->clock - tier->stamp[slot]);
    return sketch_estimate(tier, tier->slot_key[slot]);
}

/* The resident slot among a few random ones the policy would evict, or -1 if none found. */
static int64_t pick_victim(rs_tier* tier) {
    int64_t victim = -1;
    uint64_t victim_score = UINT64_MAX;
    for (int tries = 0, found = 0; tries < 16 * VICTIM_SAMPLES && found < VICTIM_SAMPLES; tries++) {
        uint64_t r = next_random(tier);
        uint64_t slot = ((r >> 32) * (uint64_t)tier->capacity) >> 32;
        if (tier->slot_key[slot] == EMPTY_KEY) continue;
        found++;
        uint64_t score = keep_score(tier, slot);
        if (score < victim_score) {
            victim = (int64_t)slot;
            victim_score = score;
        }
    }
    return victim;
}

static int evict(rs_table* t, uint64_t slot) {
    rs_tier* tier = t->tier;
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    bucket b = index_find(ix, tier->slot_key[slot], hash_key(tier->slot_key[slot]));
    atomic_store_explicit(b.slot, tier->slot_record[slot] | SSD_TAG, memory_order_release);
    tier->evictions++;
    return drop_slot(t, slot);
}

/* Copies key's record (b points at it) into a free slot and points the key there. */
static void promote(rs_table* t, int64_t key, bucket b) {
    rs_tier* tier = t->tier;
    uint64_t record = atomic_load_explicit(b.slot, memory_order_relaxed) - SSD_TAG, slot;
    if (take_slot(t, &slot) != RS_OK) return;
    float* row = storage_row(&t->storage, slot);
    if (tier->io == RS_IO_MMAP) {
        memcpy(row, ssd_mapped_row(tier, record), (size_t)t->dim * sizeof(float));
    } else if (rs_ssd_read(tier, record, row) != RS_OK) {
        t->free_slots.items[t->free_slots.len++] = slot; /* stays on SSD; lookups report it */
        return;
    }
    fill_slot(t, slot, key, record);
    tier->promotions++;
    atomic_store_explicit(b.slot, slot, memory_order_release);
}

/* The bucket of key if the key is on SSD now. */
static bool on_ssd(const rs_table* t, int64_t key, bucket* b) {
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    *b = index_find(ix, key, hash_key(key));
    if (atomic_load_explicit(b->key, memory_order_relaxed) != key) return false;
    uint64_t slot = atomic_load_explicit(b->slot, memory_order_relaxed);
    return slot != TOMBSTONE && slot >= SSD_TAG;
}

static void promote_pending(rs_table* t) {
    rs_tier* tier = t->tier;
    int64_t kept = 0;
    for (int64_t i = 0; i < tier->pending_len; i++) {
        bucket b;
        int64_t key = tier->pending[i];
        if (!on_ssd(t, key, &b)) continue;
        if (t->free_slots.len == 0) {
            tier->pending[kept++] = key;
            continue;
        }
        promote(t, key, b);
    }
    tier->pending_len = kept;
}

/* One sampled access. */
static int consider(rs_table* t, int64_t key) {
    rs_tier* tier = t->tier;
    tier->clock++;
    if (tier->policy == RS_POLICY_LFU) sketch_add(tier, key);
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    bucket b = index_find(ix, key, hash_key(key));
    if (atomic_load_explicit(b.key, memory_order_relaxed) != key) return RS_OK;
    uint64_t slot = atomic_load_explicit(b.slot, memory_order_relaxed);
    if (slot == TOMBSTONE) return RS_OK;
    if (slot < SSD_TAG) {
        tier->stamp[slot] = tier->clock;
        return RS_OK;
    }
    if ((int64_t)t->free_slots.len > tier->pending_len + rs_tier_write_reserve(tier->capacity)) {
        /* room that neither admitted keys nor write-through updates are waiting for */
        promote(t, key, b);
        return RS_OK;
    }
    if (tier->pending_len == PENDING_MAX || tier->capacity == 0) return RS_OK;
    for (int64_t i = 0; i < tier->pending_len; i++)
        if (tier->pending[i] == key) return RS_OK;
    int64_t victim = pick_victim(tier);
    if (victim < 0) return RS_OK;
    if (tier->policy == RS_POLICY_LFU &&
        sketch_estimate(tier, key) <= sketch_estimate(tier, tier->slot_key[victim]))
        return RS_OK;
    tier->pending[tier->pending_len++] = key;
    return evict(t, (uint64_t)victim);
}

/* One round of eviction work on t; the caller holds t's mutex. */
static int tier_round(rs_table* t, int64_t max_entries) {
    rs_tier* tier = t->tier;
    int status = rs_reclaim(t);
    promote_pending(t);
    uint64_t head = atomic_load_explicit(&tier->log_head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&tier->log_tail, memory_order_relaxed);
    if (head - tail > ACCESS_LOG) tail = head - ACCESS_LOG; /* lapped: those samples are lost */
    for (int64_t done = 0; tail != head && done < max_entries && status == RS_OK; done++, tail++)
        status = consider(t, atomic_load_explicit(&tier->log[tail & (ACCESS_LOG - 1)],
                                                  memory_order_relaxed));
    atomic_store_explicit(&tier->log_tail, tail, memory_order_relaxed);
    if (status == RS_OK && tier->async_compaction && rs_ssd_wants_compaction(tier))
        status = rs_ssd_compact(t, false, 1);
    int after = rs_reclaim(t);
    return status != RS_OK ? status : after;
}

/* ---- writes ---- */

/* Points key at its new record (and its DRAM copy, if resident). */
static int publish(rs_table* t, int64_t key, const float* row, uint64_t record) {
    rs_tier* tier = t->tier;
    rs_index* ix;
    bucket b;
    bool is_new;
    if (rs_index_bucket_for_write(t, key, &ix, &b, &is_new)) return RS_ENOMEM;
    const uint64_t on_disk = record | SSD_TAG;
    if (is_new) {
        atomic_store_explicit(b.slot, on_disk, memory_order_relaxed);
        atomic_store_explicit(b.key, key, memory_order_release);
        ix->used++;
        atomic_fetch_add(&t->live, 1);
        return RS_OK;
    }
    uint64_t old = atomic_load_explicit(b.slot, memory_order_relaxed);
    if (old == TOMBSTONE) {
        atomic_store_explicit(b.slot, on_disk, memory_order_release);
        atomic_fetch_add(&t->live, 1);
        return RS_OK;
    }
    if (old >= SSD_TAG) {
        atomic_store_explicit(b.slot, on_disk, memory_order_release);
        rs_ssd_garbage(tier, old - SSD_TAG);
        return RS_OK;
    }
    rs_ssd_garbage(tier, tier->slot_record[old]);
    uint64_t fresh;
    /* No free slot: the ones this batch retired come back at once if no reader is left. */
    bool have = take_slot(t, &fresh) == RS_OK || (rs_reclaim(t) == RS_OK && take_slot(t, &fresh) == RS_OK);
    if (have) {
        memcpy(storage_row(&t->storage, fresh), row, (size_t)t->dim * sizeof(float));
        fill_slot(t, fresh, key, record);
        tier->stamp[fresh] = tier->stamp[old];
        atomic_store_explicit(b.slot, fresh, memory_order_release);
    } else {
        atomic_store_explicit(b.slot, on_disk, memory_order_release);
    }
    return drop_slot(t, old);
}

/* Room for n more records within the SSD budget, compacting first if that makes it. */
static int ssd_room(rs_table* t, int64_t n) {
    rs_tier* tier = t->tier;
    const int64_t limit = tier->ssd_limit / tier->record_bytes;
    if (tier->records_total + n <= limit) return RS_OK;
    int status = rs_ssd_compact(t, true, INT64_MAX);
    if (status != RS_OK) return status;
    return tier->records_total + n <= limit ? RS_OK : RS_ENOSPC;
}

static int after_write(rs_table* t, int status) {
    rs_tier* tier = t->tier;
    if (status == RS_OK && !tier->async_compaction && rs_ssd_wants_compaction(tier))
        status = rs_ssd_compact(t, false, INT64_MAX);
    int after = rs_reclaim(t);
    pthread_mutex_unlock(&tier->lock);
    return status != RS_OK ? status : after;
}

int rs_tier_upsert(rs_table* t, const int64_t* keys, const float* values, int64_t n) {
    rs_tier* tier = t->tier;
    pthread_mutex_lock(&tier->lock);
    int status = rs_reclaim(t);
    if (status == RS_OK) status = ssd_room(t, n);
    uint64_t first = 0;
    if (status == RS_OK) status = rs_ssd_append_many(tier, keys, values, n, &first);
    for (int64_t i = 0; i < n && status == RS_OK; i++)
        status = publish(t, keys[i], values + i * t->dim, first + (uint64_t)i);
    return after_write(t, status);
}

int rs_tier_delete(rs_table* t, const int64_t* keys, int64_t n) {
    rs_tier* tier = t->tier;
    pthread_mutex_lock(&tier->lock);
    int status = rs_reclaim(t);
    rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    for (int64_t i = 0; i < n && status == RS_OK; i++) {
        uint64_t old = unpublish_key(t, ix, keys[i]);
        if (old == TOMBSTONE) continue;
        if (old >= SSD_TAG) {
            rs_ssd_garbage(tier, old - SSD_TAG);
        } else {
            rs_ssd_garbage(tier, tier->slot_record[old]);
            status = drop_slot(t, old);
        }
    }
    return after_write(t, status);
}

/* ---- the eviction pool ---- */

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static rs_table** pool_tables;
static size_t pool_len, pool_cap, pool_next;
static int64_t pool_threads, pool_target;

/* Unlocked reads of writer state: a stale answer only delays a round. Leftovers (slots in
 * their grace period, pending admissions) are worth a round only once per idle tick, so a
 * reader holding the old generation never makes a pool thread spin. */
static bool has_work(const rs_table* t, bool tick) {
    const rs_tier* tier = t->tier;
    return atomic_load_explicit(&tier->log_head, memory_order_relaxed) !=
               atomic_load_explicit(&tier->log_tail, memory_order_relaxed) ||
           (tier->async_compaction && rs_ssd_wants_compaction(tier)) ||
           (tick && (tier->pending_len > 0 || t->waiting));
}

static void* pool_worker(void* unused) {
    bool tick = false;
    pthread_mutex_lock(&pool_lock);
    while (pool_len > 0) {
        rs_table* t = NULL;
        for (size_t i = 0; i < pool_len && !t; i++) {
            rs_table* candidate = pool_tables[(pool_next + i) % pool_len];
            if (atomic_load(&candidate->tier->claimed) || !has_work(candidate, tick)) continue;
            t = candidate;
            pool_next = (pool_next + i + 1) % pool_len;
        }
        if (!t) {
            if (tick) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_nsec += IDLE_NS;
                if (until.tv_nsec >= 1000000000L) {
                    until.tv_sec++;
                    until.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&pool_wake, &pool_lock, &until);
            }
            tick = !tick;
            continue;
        }
        atomic_store(&t->tier->claimed, 1); /* under pool_lock: unregister waits for it */
        pthread_mutex_unlock(&pool_lock);
        pthread_mutex_lock(&t->tier->lock);
        tier_round(t, ROUND_ENTRIES); /* a failed round (ENOMEM, EIO) is retried next time */
        pthread_mutex_unlock(&t->tier->lock);
        atomic_store(&t->tier->claimed, 0);
        pthread_mutex_lock(&pool_lock);
    }
    pool_threads--;
    pthread_mutex_unlock(&pool_lock);
    return NULL;
}

static int pool_register(rs_table* t, int64_t threads) {
    pthread_mutex_lock(&pool_lock);
    int status = rs_grow_array((void**)&pool_tables, &pool_cap, pool_len + 1, sizeof(rs_table*));
    if (status == RS_OK) {
        pool_tables[pool_len++] = t;
        if (threads > pool_target) pool_target = threads;
        while (pool_threads < pool_target) {
            pthread_t thread;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            int failed = pthread_create(&thread, &attr, pool_worker, NULL);
            pthread_attr_destroy(&attr);
            if (failed) break; /* fewer threads: slower admission, still correct */
            pool_threads++;
        }
    }
    pthread_mutex_unlock(&pool_lock);
    return status;
}

static void pool_unregister(rs_table* t) {
    pthread_mutex_lock(&pool_lock);
    for (size_t i = 0; i < pool_len; i++) {
        if (pool_tables[i] != t) continue;
        pool_tables[i] = pool_tables[--pool_len];
        break;
    }
    pthread_mutex_unlock(&pool_lock);
    while (atomic_load(&t->tier->claimed)) { /* a round in progress: short */
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
}

/* ---- lifecycle ---- */

int64_t rs_tier_write_reserve(int64_t capacity) {
    int64_t reserve = (capacity + 15) / 16;
    return reserve < 256 ? reserve : 256;
}

int64_t rs_tier_capacity(int64_t dim, int64_t dram_bytes) {
    if (dim <= 0 || dram_bytes <= 0) return 0;
    return dram_bytes / (4 * dim + SLOT_OVERHEAD);
}

void rs_tier_destroy(rs_table* t) {
    rs_tier* tier = t->tier;
    if (tier->registered) pool_unregister(t);
    rs_ssd_close(tier);
    free(tier->slot_key);
    free(tier->slot_record);
    free(tier->stamp);
    free(tier->sketch);
    pthread_mutex_destroy(&tier->lock);
    free(tier);
    rs_mem_free(t->storage.base);
    t->storage.base = NULL;
    t->tier = NULL;
}

static int check_config(int64_t dim, int64_t n, const rs_tier_config* c) {
    bool ok = c->path && c->dram_bytes >= 0 && c->ssd_bytes >= 0 && c->segment_bytes > 0 &&
              (c->policy == RS_POLICY_LFU || c->policy == RS_POLICY_LRU) &&
              (c->io == RS_IO_MMAP || c->io == RS_IO_PREAD) && c->eviction_threads >= 1;
    if (!ok) return RS_EINVAL;
    return n * (8 + 4 * dim) > c->ssd_bytes ? RS_ENOSPC : RS_OK;
}

static int tier_init(rs_table* t, const int64_t* keys, const float* values, int64_t n,
                     const int64_t* resident, int64_t n_resident, const rs_tier_config* config,
                     int64_t* detail) {
    rs_tier* tier = aligned_alloc(64, (sizeof(rs_tier) + 63) / 64 * 64);
    if (!tier) return RS_ENOMEM;
    memset(tier, 0, sizeof *tier);
    pthread_mutex_init(&tier->lock, NULL);
    t->tier = tier;
    const int64_t dim = t->dim, capacity = rs_tier_capacity(dim, config->dram_bytes);
    if (n_resident < 0 || n_resident > capacity - rs_tier_write_reserve(capacity) || n_resident > n)
        return RS_EINVAL;
    tier->policy = (int32_t)config->policy;
    tier->async_compaction = config->async_compaction != 0;
    tier->capacity = capacity;
    tier->sketch_width = capacity > 0 ? capacity : 1;
    tier->rng = (uint64_t)(uintptr_t)t;
    t->storage.base = alloc_rows((size_t)(capacity > 0 ? capacity : 1) * (size_t)dim * sizeof(float));
    t->storage.base_rows = (uint64_t)capacity;
    tier->slot_key = malloc((size_t)(capacity > 0 ? capacity : 1) * sizeof(int64_t));
    tier->slot_record = malloc((size_t)(capacity > 0 ? capacity : 1) * sizeof(uint64_t));
    tier->stamp = calloc((size_t)(capacity > 0 ? capacity : 1), sizeof(uint32_t));
    tier->sketch = calloc((size_t)(SKETCH_DEPTH * tier->sketch_width), 1);
    if (!t->storage.base || !tier->slot_key || !tier->slot_record || !tier->stamp || !tier->sketch ||
        rs_grow_array((void**)&t->free_slots.items, &t->free_slots.cap, (size_t)capacity,
                      sizeof(uint64_t)))
        return RS_ENOMEM;
    for (int64_t s = 0; s < capacity; s++) tier->slot_key[s] = EMPTY_KEY;

    int status = rs_index_load(t, keys, n, SSD_TAG, detail); /* duplicates fail before any I/O */
    if (status != RS_OK) return status;
    status = rs_ssd_open(tier, dim, config);
    uint64_t first = 0;
    if (status == RS_OK) status = rs_ssd_append_many(tier, keys, values, n, &first);
    if (status == RS_EIO) *detail = errno;
    if (status != RS_OK) return status;

    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    for (int64_t j = 0; j < n_resident; j++) {
        int64_t i = resident[j];
        if (i < 0 || i >= n) return RS_EINVAL;
        bucket b = index_find(ix, keys[i], hash_key(keys[i]));
        if (atomic_load_explicit(b.slot, memory_order_relaxed) < SSD_TAG) return RS_EINVAL;
        memcpy(storage_row(&t->storage, (uint64_t)j), values + i * dim, (size_t)dim * sizeof(float));
        fill_slot(t, (uint64_t)j, keys[i], first + (uint64_t)i);
        atomic_store_explicit(b.slot, (uint64_t)j, memory_order_relaxed);
    }
    for (int64_t s = capacity - 1; s >= n_resident; s--) t->free_slots.items[t->free_slots.len++] = (uint64_t)s;
    status = pool_register(t, config->eviction_threads);
    if (status == RS_OK) tier->registered = true;
    return status;
}

int rs_tiered_create(int64_t dim, int32_t default_kind, double stddev, uint64_t seed,
                     const int64_t* keys, const float* values, int64_t n, const int64_t* resident,
                     int64_t n_resident, const rs_tier_config* config, rs_table** out,
                     int64_t* detail) {
    *out = NULL;
    *detail = 0;
    if (dim <= 0 || n < 0 || (default_kind != RS_DEFAULT_ZEROS && default_kind != RS_DEFAULT_NORMAL))
        return RS_EINVAL;
    int status = check_config(dim, n, config);
    if (status != RS_OK) return status;
    rs_table* t = rs_table_alloc(dim, default_kind, stddev, seed);
    if (!t) return RS_ENOMEM;
    status = tier_init(t, keys, values, n, resident, n_resident, config, detail);
    if (status != RS_OK) {
        rs_table_free(t);
        return status;
    }
    *out = t;
    return RS_OK;
}

/* ---- introspection ---- */

int rs_tier_stats(rs_table* t, int64_t* out) {
    rs_tier* tier = t->tier;
    if (!tier) return RS_EINVAL;
    pthread_mutex_lock(&tier->lock);
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    int64_t chunks = 0;
    for (int c = 0; c < SEGMENT_CHUNKS; c++)
        chunks += atomic_load_explicit(&tier->segments[c], memory_order_relaxed) != NULL;
    out[RS_STAT_DRAM_CAPACITY] = tier->capacity;
    out[RS_STAT_DRAM_ROWS] = tier->resident;
    out[RS_STAT_DRAM_BYTES] = tier->capacity * (4 * t->dim + SLOT_OVERHEAD);
    out[RS_STAT_INDEX_BYTES] = (int64_t)((ix->mask + 1) * 16 + sizeof(rs_tier) + sizeof(rs_table)) +
                               chunks * SEGMENT_CHUNK * (int64_t)sizeof(rs_segment);
    out[RS_STAT_SSD_SEGMENTS] = tier->segments_open;
    out[RS_STAT_SSD_RECORDS] = tier->records_total;
    out[RS_STAT_SSD_LIVE_RECORDS] = tier->records_live;
    out[RS_STAT_SSD_BYTES] = tier->records_total * tier->record_bytes;
    out[RS_STAT_HITS] = atomic_load(&tier->hits);
    out[RS_STAT_MISSES] = atomic_load(&tier->misses);
    out[RS_STAT_PROMOTIONS] = tier->promotions;
    out[RS_STAT_EVICTIONS] = tier->evictions;
    out[RS_STAT_COMPACTIONS] = tier->compactions;
    pthread_mutex_unlock(&tier->lock);
    return RS_OK;
}

int rs_tier_maintain(rs_table* t) {
    if (!t->tier) return RS_EINVAL;
    pthread_mutex_lock(&t->tier->lock);
    int status = tier_round(t, ACCESS_LOG);
    pthread_mutex_unlock(&t->tier->lock);
    return status;
}

int rs_tier_compact(rs_table* t) {
    if (!t->tier) return RS_EINVAL;
    pthread_mutex_lock(&t->tier->lock);
    int status = rs_ssd_compact(t, true, INT64_MAX);
    int after = rs_reclaim(t);
    pthread_mutex_unlock(&t->tier->lock);
    return status != RS_OK ? status : after;
}
