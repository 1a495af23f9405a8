/* libFuzzer target: the SSD tier's record files (native/embedding_ssd.c) after someone else
 * wrote to them. A tiered table is created with its rows in several small segment files;
 * then the input interleaves damage to those files (bytes overwritten anywhere, keys
 * included; with pread I/O also files truncated or extended) with lookups, snapshots,
 * upserts, deletes, compaction and eviction rounds.
 *
 * What must hold: no crash and no sanitizer report; every call returns a status it
 * documents (a read that fails is RS_EIO, never a wild read); and every key the damage did
 * not reach still reads back its own row.
 *
 * Not covered: truncating a file that lookups read through its mapping (RS_IO_MMAP). Like
 * every mmap-based store, the kernel answers a read past the new end with SIGBUS; the
 * record files belong to the table (RELIABILITY.md).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "embedding.h"
#include "fuzz_input.h"

#define N 48
#define MAX_DIM 6

typedef struct {
    rs_table* table;
    int64_t dim;
    bool pread_io;
    bool damaged; /* once any file is damaged, rows are no longer checked */
    char dir[128];
    int64_t keys[N];
    bool present[N];
    float rows[N][MAX_DIM];
    uint32_t version;
} state;

static void fill(state* s, int k) {
    for (int64_t d = 0; d < s->dim; d++) s->rows[k][d] = (float)(s->version * 64 + (uint32_t)k) + (float)d;
    s->version++;
}

/* Path of the `which`-th record file of the table's directory (in name order), if any. */
static bool segment_file(const state* s, unsigned which, char* path, size_t size) {
    struct dirent** names;
    int n = scandir(s->dir, &names, NULL, alphasort), files = 0;
    CHECK(n >= 0);
    for (int i = 0; i < n; i++) files += names[i]->d_name[0] != '.';
    bool found = false;
    if (files > 0) {
        unsigned target = which % (unsigned)files, at = 0;
        for (int i = 0; i < n; i++) {
            if (names[i]->d_name[0] == '.') continue;
            if (at++ == target && !found) {
                snprintf(path, size, "%s/%s", s->dir, names[i]->d_name);
                found = true;
            }
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return found;
}

static void op_damage(state* s, input* in) {
    char path[256];
    uint8_t how = byte(in);
    unsigned which = byte(in);
    uint16_t offset = word(in);
    uint8_t len = byte(in) % 16;
    uint8_t bytes[16];
    for (int i = 0; i < len; i++) bytes[i] = byte(in);
    if (!segment_file(s, which, path, sizeof path)) return;
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    if (how % 4 == 3 && s->pread_io) { /* truncate or extend */
        CHECK(ftruncate(fd, offset % (st.st_size + 64)) == 0);
    } else if (st.st_size > 0) { /* overwrite inside the file */
        off_t at = offset % st.st_size;
        size_t n = (size_t)(st.st_size - at) < len ? (size_t)(st.st_size - at) : len;
        CHECK(pwrite(fd, bytes, n, at) == (ssize_t)n);
    }
    close(fd);
    s->damaged = true;
}

static bool io_status(int status) { return status == RS_OK || status == RS_EIO; }

static void op_lookup(state* s, input* in) {
    int n = 1 + byte(in) % 16;
    int64_t ids[16];
    int k[16];
    float out[16 * MAX_DIM];
    for (int j = 0; j < n; j++) k[j] = byte(in) % N, ids[j] = s->keys[k[j]];
    int status = rs_table_lookup(s->table, ids, n, 1, RS_COMBINER_NONE, out);
    CHECK(io_status(status));
    if (s->damaged || status != RS_OK) return;
    for (int j = 0; j < n; j++) {
        if (s->present[k[j]])
            CHECK(memcmp(out + j * s->dim, s->rows[k[j]], (size_t)s->dim * sizeof(float)) == 0);
        else
            for (int64_t d = 0; d < s->dim; d++) CHECK(out[j * s->dim + d] == 0.0f);
    }
}

static void op_write(state* s, input* in, bool del) {
    int n = byte(in) % 12;
    int64_t keys[12];
    float values[12 * MAX_DIM];
    int k[12];
    for (int j = 0; j < n; j++) {
        k[j] = byte(in) % N;
        keys[j] = s->keys[k[j]];
        if (!del) {
            fill(s, k[j]);
            memcpy(values + j * s->dim, s->rows[k[j]], (size_t)s->dim * sizeof(float));
        }
    }
    int status = del ? rs_table_delete(s->table, keys, n) : rs_table_upsert(s->table, keys, values, n);
    CHECK(io_status(status));
    if (status != RS_OK) {
        s->damaged = true; /* a prefix may have been applied: stop checking rows */
        return;
    }
    for (int j = 0; j < n; j++) s->present[k[j]] = !del;
}

static void op_snapshot(state* s) {
    int64_t keys[N];
    float values[N * MAX_DIM];
    int64_t live = rs_table_snapshot(s->table, keys, values, N);
    CHECK(live == -1 || (live >= 0 && live <= N));
}

static void op_tier(state* s, input* in) {
    int status = byte(in) % 2 ? rs_tier_compact(s->table) : rs_tier_maintain(s->table);
    CHECK(io_status(status));
    if (status != RS_OK) s->damaged = true;
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc, (void)argv;
    keep_eviction_threads();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    input in = {data, data + size};
    state* s = calloc(1, sizeof *s);
    uint8_t b = byte(&in);
    s->dim = 1 + b % MAX_DIM;
    s->pread_io = b & 0x80;
    const char* tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof s->dir, "%s/fuzz-ssd-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(s->dir) != NULL);
    int n0 = byte(&in) % (N + 1);
    float values[N * MAX_DIM];
    for (int k = 0; k < N; k++) s->keys[k] = (int64_t)k * 7919 - 100;
    for (int k = 0; k < n0; k++) {
        fill(s, k);
        s->present[k] = true;
        memcpy(values + k * s->dim, s->rows[k], (size_t)s->dim * sizeof(float));
    }
    const int64_t record = 8 + 4 * s->dim;
    rs_tier_config config = {
        .path = s->dir,
        .dram_bytes = (int64_t)(b >> 3 & 3) * 4 * (4 * s->dim + 24),
        .ssd_bytes = 1 << 20,
        .segment_bytes = record * (1 + (b >> 5 & 3) * 3),
        .policy = b & 0x40 ? RS_POLICY_LRU : RS_POLICY_LFU,
        .io = s->pread_io ? RS_IO_PREAD : RS_IO_MMAP,
        .async_compaction = 0,
        .eviction_threads = 1,
    };
    int64_t detail;
    CHECK(rs_tiered_create(s->dim, RS_DEFAULT_ZEROS, 0, 0, s->keys, values, n0, NULL, 0, &config, &s->table,
                           &detail) == RS_OK);
    while (more(&in)) {
        switch (byte(&in) % 7) {
        case 0: op_damage(s, &in); break;
        case 1: case 2: op_lookup(s, &in); break;
        case 3: op_write(s, &in, false); break;
        case 4: op_write(s, &in, true); break;
        case 5: op_snapshot(s); break;
        default: op_tier(s, &in); break;
        }
    }
    rs_table_free(s->table);
    CHECK(rmdir(s->dir) == 0);
    free(s);
    return 0;
}
