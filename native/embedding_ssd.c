/* recserve embedding engine: the SSD tier of a tiered table, as record files.
 *
 * Every row of a tiered table lives in a record: an 8-byte key, then the row (float32 x dim),
 * appended to the table's current segment file (seg-<n>.rec under its directory). Record r
 * is record r % P of segment r / P (P records per segment), and segments are filled in
 * order, so a batch of appends gets consecutive numbers. A record is never overwritten: an
 * upsert appends a new one and repoints the key, so the old one becomes garbage. The key in
 * each record is what compaction needs to find out whether a record is still live (its key
 * still points at it) without any per-record state in memory.
 *
 * Compaction copies the live records of mostly-garbage segments to the end of the current
 * one, repoints their keys, and retires the old segment: it is closed and deleted only after
 * the grace period (embedding.c), so a lookup that read the old record number still reads a
 * whole row. It runs when garbage is at least half the records and one segment's worth,
 * inside the writer's call (sync) or in an eviction thread's round (async).
 *
 * Every function here except rs_ssd_read and the readers' use of the mapping runs with the
 * tier's mutex held.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "embedding_internal.h"

#define COPY_RECORDS 4096 /* records per buffered read or write */

static void segment_path(const rs_tier* tier, uint64_t segment, char* out) {
    snprintf(out, PATH_MAX, "%s/seg-%08llu.rec", tier->path, (unsigned long long)segment);
}

static size_t mapping_bytes(const rs_tier* tier) {
    return (size_t)(tier->segment_records * tier->record_bytes);
}

static int write_all(int fd, const char* buf, size_t bytes, off_t offset) {
    while (bytes) {
        ssize_t done = pwrite(fd, buf, bytes, offset);
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) return RS_EIO;
        buf += done;
        bytes -= (size_t)done;
        offset += done;
    }
    return RS_OK;
}

static int read_all(int fd, char* buf, size_t bytes, off_t offset) {
    while (bytes) {
        ssize_t done = pread(fd, buf, bytes, offset);
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) return RS_EIO;
        buf += done;
        bytes -= (size_t)done;
        offset += done;
    }
    return RS_OK;
}

static int segment_new(rs_tier* tier) {
    uint64_t s = (uint64_t)tier->segment_count;
    if (s >= (uint64_t)SEGMENT_CHUNKS * SEGMENT_CHUNK) return RS_ENOSPC;
    rs_segment* chunk = atomic_load_explicit(&tier->segments[s / SEGMENT_CHUNK], memory_order_relaxed);
    if (!chunk) {
        chunk = calloc(SEGMENT_CHUNK, sizeof(rs_segment));
        if (!chunk) return RS_ENOMEM;
        for (int i = 0; i < SEGMENT_CHUNK; i++) chunk[i].fd = -1;
        atomic_store_explicit(&tier->segments[s / SEGMENT_CHUNK], chunk, memory_order_release);
    }
    char path[PATH_MAX];
    segment_path(tier, s, path);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return RS_EIO;
    const char* map = NULL;
    if (tier->io == RS_IO_MMAP) {
        /* The mapping spans the whole segment before the file has grown: pages are only read
         * once a record on them has been written and published. */
        void* m = mmap(NULL, mapping_bytes(tier), PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int saved = errno;
            close(fd);
            unlink(path);
            errno = saved;
            return RS_EIO;
        }
        madvise(m, mapping_bytes(tier), MADV_RANDOM); /* no readahead for random lookups */
        map = m;
    }
    rs_segment* seg = &chunk[s % SEGMENT_CHUNK];
    seg->fd = fd;
    seg->map = map;
    seg->written = 0;
    seg->live = 0;
    seg->damaged = false;
    tier->segment_count = (int64_t)s + 1;
    tier->segments_open++;
    return RS_OK;
}

int rs_ssd_open(rs_tier* tier, int64_t dim, const rs_tier_config* config) {
    tier->record_bytes = 8 + 4 * dim;
    tier->segment_records = config->segment_bytes / tier->record_bytes;
    if (tier->segment_records < 1) tier->segment_records = 1;
    tier->io = (int32_t)config->io;
    tier->ssd_limit = config->ssd_bytes;
    tier->path = strdup(config->path);
    if (!tier->path) return RS_ENOMEM;
    return segment_new(tier);
}

void rs_ssd_free_segment(rs_tier* tier, uint64_t segment) {
    rs_segment* seg = segment_at(tier, segment);
    if (seg->fd < 0) return;
    if (seg->map) munmap((void*)seg->map, mapping_bytes(tier));
    close(seg->fd);
    char path[PATH_MAX];
    segment_path(tier, segment, path);
    unlink(path);
    seg->fd = -1;
    seg->map = NULL;
    tier->segments_open--;
}

void rs_ssd_close(rs_tier* tier) {
    for (int64_t s = 0; s < tier->segment_count; s++) rs_ssd_free_segment(tier, (uint64_t)s);
    for (int c = 0; c < SEGMENT_CHUNKS; c++)
        free(atomic_load_explicit(&tier->segments[c], memory_order_relaxed));
    free(tier->path);
}

/* Appends n records already laid out in buf; *first is the first one's number. */
static int append_records(rs_tier* tier, const char* buf, int64_t n, uint64_t* first) {
    const int64_t p = tier->segment_records, rb = tier->record_bytes;
    for (bool started = false; n > 0 || !started; started = true) {
        rs_segment* active = segment_at(tier, (uint64_t)tier->segment_count - 1);
        if (active->written == p) {
            int status = segment_new(tier);
            if (status != RS_OK) return status;
            active = segment_at(tier, (uint64_t)tier->segment_count - 1);
        }
        if (!started) *first = (uint64_t)((tier->segment_count - 1) * p + active->written);
        int64_t take = n < p - active->written ? n : p - active->written;
        if (take > 0 &&
            write_all(active->fd, buf, (size_t)(take * rb), (off_t)(active->written * rb)))
            return RS_EIO;
        active->written += take;
        active->live += take;
        tier->records_total += take;
        tier->records_live += take;
        buf += take * rb;
        n -= take;
    }
    return RS_OK;
}

int rs_ssd_append_many(rs_tier* tier, const int64_t* keys, const float* rows, int64_t n,
                       uint64_t* first) {
    const int64_t rb = tier->record_bytes;
    const size_t row_bytes = (size_t)(rb - 8);
    char* buf = malloc((size_t)(COPY_RECORDS * rb));
    if (!buf) return RS_ENOMEM;
    int status = RS_OK;
    *first = 0;
    for (int64_t c = 0; c < n || (c == 0 && n == 0); c += COPY_RECORDS) {
        int64_t m = n - c < COPY_RECORDS ? n - c : COPY_RECORDS;
        for (int64_t i = 0; i < m; i++) {
            memcpy(buf + i * rb, &keys[c + i], 8);
            memcpy(buf + i * rb + 8, (const char*)rows + (size_t)(c + i) * row_bytes, row_bytes);
        }
        uint64_t at;
        status = append_records(tier, buf, m, &at);
        if (status != RS_OK) break;
        if (c == 0) *first = at;
        if (n == 0) break;
    }
    free(buf);
    return status;
}

int rs_ssd_read(const rs_tier* tier, uint64_t record, float* row) {
    const uint64_t p = (uint64_t)tier->segment_records;
    const rs_segment* seg = segment_at(tier, record / p);
    return read_all(seg->fd, (char*)row, (size_t)(tier->record_bytes - 8),
                    (off_t)((record % p) * (uint64_t)tier->record_bytes + 8));
}

void rs_ssd_garbage(rs_tier* tier, uint64_t record) {
    segment_at(tier, record / (uint64_t)tier->segment_records)->live--;
    tier->records_live--;
}

bool rs_ssd_wants_compaction(const rs_tier* tier) {
    int64_t garbage = tier->records_total - tier->records_live;
    return garbage >= tier->segment_records && garbage >= tier->records_live;
}

/* Whether `record` of `key` is the one the table serves (directly, or behind a DRAM copy);
 * the key's slot, or TOMBSTONE, goes to *slot. */
static bool record_is_live(const rs_table* t, const rs_index* ix, int64_t key, uint64_t record,
                           bucket* b) {
    *b = index_find(ix, key, hash_key(key));
    if (atomic_load_explicit(b->key, memory_order_relaxed) != key) return false;
    uint64_t slot = atomic_load_explicit(b->slot, memory_order_relaxed);
    if (slot == TOMBSTONE) return false;
    if (slot >= SSD_TAG) return slot - SSD_TAG == record;
    return t->tier->slot_record[slot] == record;
}

/* Moves the live records of segment s to the end of the log and retires s. */
static int compact_segment(rs_table* t, uint64_t s, char* in, char* out, uint64_t* moved) {
    rs_tier* tier = t->tier;
    rs_segment* seg = segment_at(tier, s);
    const int64_t rb = tier->record_bytes, p = tier->segment_records;
    const rs_index* ix = atomic_load_explicit(&t->index, memory_order_relaxed);
    for (int64_t c = 0; c < seg->written && seg->live > 0; c += COPY_RECORDS) {
        int64_t m = seg->written - c < COPY_RECORDS ? seg->written - c : COPY_RECORDS;
        if (read_all(seg->fd, in, (size_t)(m * rb), (off_t)(c * rb))) return RS_EIO;
        int64_t kept = 0;
        for (int64_t i = 0; i < m; i++) {
            int64_t key;
            memcpy(&key, in + i * rb, 8);
            uint64_t record = s * (uint64_t)p + (uint64_t)(c + i);
            bucket b;
            if (!record_is_live(t, ix, key, record, &b)) continue;
            memcpy(out + kept * rb, in + i * rb, (size_t)rb);
            moved[kept++] = record;
        }
        uint64_t first;
        if (kept == 0) continue;
        int status = append_records(tier, out, kept, &first);
        if (status != RS_OK) return status;
        for (int64_t i = 0; i < kept; i++) {
            int64_t key;
            memcpy(&key, out + i * rb, 8);
            bucket b;
            record_is_live(t, ix, key, moved[i], &b);
            uint64_t slot = atomic_load_explicit(b.slot, memory_order_relaxed);
            if (slot >= SSD_TAG)
                atomic_store_explicit(b.slot, (first + (uint64_t)i) | SSD_TAG, memory_order_release);
            else
                tier->slot_record[slot] = first + (uint64_t)i; /* the DRAM copy's new home */
            rs_ssd_garbage(tier, moved[i]);
        }
    }
    /* A live record not found through its stored key means the key bytes were damaged:
     * retiring the segment would leave that key pointing into a deleted file. */
    if (seg->live > 0) {
        seg->damaged = true;
        return RS_EIO;
    }
    tier->records_total -= seg->written;
    tier->records_live -= seg->live; /* 0: every live record moved */
    seg->written = -1;                /* retired: never a candidate again */
    tier->compactions++;
    return slot_push(&t->retired_segments, s);
}

int rs_ssd_compact(rs_table* t, bool everything, int64_t max_segments) {
    rs_tier* tier = t->tier;
    const int64_t rb = tier->record_bytes;
    char* in = malloc((size_t)(COPY_RECORDS * rb));
    char* out = malloc((size_t)(COPY_RECORDS * rb));
    uint64_t* moved = malloc(COPY_RECORDS * sizeof(uint64_t));
    int status = in && out && moved ? RS_OK : RS_ENOMEM;
    /* The current segment takes the copies, so it is never compacted itself; compacting
     * everything seals it first if it holds garbage. */
    rs_segment* active = segment_at(tier, (uint64_t)tier->segment_count - 1);
    if (everything && status == RS_OK && active->live < active->written) status = segment_new(tier);
    const int64_t sealed = tier->segment_count - 1;
    for (int64_t s = 0; s < sealed && max_segments > 0 && status == RS_OK; s++) {
        rs_segment* seg = segment_at(tier, (uint64_t)s);
        if (seg->written < 0 || seg->fd < 0 || seg->damaged) continue;
        bool worth = everything ? seg->live < seg->written : 2 * seg->live <= seg->written;
        if (!worth) continue;
        status = compact_segment(t, (uint64_t)s, in, out, moved);
        max_segments--;
    }
    free(in);
    free(out);
    free(moved);
    return status;
}
