/* libFuzzer target: the embedding engine (native/embedding*.c) driven by a random sequence
 * of create / upsert / delete / lookup (every combiner) / contains / snapshot / sample /
 * compact / maintain, on a DRAM table or a tiered (DRAM + SSD record files) one, and
 * checked after every step against a plain model of the table: a few dozen keys, each
 * absent or holding one row. Lookups must return the model's rows exactly (unknown ids:
 * the table's default row; padding: zeros), pooled the way DESIGN.md §4 says.
 *
 * Input: byte 0 picks the table (tiered, default, dim), byte 1 and those after it the
 * initial keys, a tiered table's next byte its DRAM budget, segment size, policy and I/O
 * mode; then each step is an opcode byte and its arguments. Running out of bytes
 * ends the sequence. Record files go under $TMPDIR (the Makefile points it at a tmpfs).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "embedding.h"
#include "fuzz_input.h"

/* The key space: extremes and neighbours of the values hashing and probing care about. */
static const int64_t KEYS[] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 100, 1000, 65536, -2, -3, -100, INT64_MAX, INT64_MIN,
    INT64_MIN + 1, INT64_MAX - 1, 1LL << 32, (1LL << 32) + 1, 1LL << 62, (1LL << 62) + 1,
    -(1LL << 62), 0x7f00000000000000LL, 123456789012345LL, -987654321LL, 4096, 4097, 8191,
    1LL << 40, 31,
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))
#define MAX_DIM 9
#define MAX_BATCH 24

static int key_index(input* in) { return byte(in) % NKEYS; }

/* RS_DEFAULT_ROWS tables: an unknown key k gets row k mod DEFAULT_ROWS (floor modulo). */
#define DEFAULT_ROWS 3
static float DEFAULT_MATRIX[DEFAULT_ROWS][MAX_DIM];

static void fill_default_matrix(void) {
    for (int r = 0; r < DEFAULT_ROWS; r++)
        for (int d = 0; d < MAX_DIM; d++) DEFAULT_MATRIX[r][d] = -1000.0f - (float)(r * 16 + d);
}

typedef struct {
    rs_table* table;
    float* adopted; /* the DRAM table's initial values buffer (it outlives the table) */
    int64_t dim;
    int32_t default_kind;
    bool tiered;
    char dir[128];
    bool present[NKEYS];
    float rows[NKEYS][MAX_DIM];
    uint32_t version;
} state;

static int index_of(int64_t key) {
    for (int i = 0; i < NKEYS; i++)
        if (KEYS[i] == key) return i;
    return -1;
}

static void fill_row(state* s, int k, float* out) {
    for (int64_t d = 0; d < s->dim; d++)
        out[d] = (float)(s->version * 64 + (uint32_t)k) + (float)d / 16.0f;
    s->version++;
}

/* What a lookup of `key` must return. */
static void expected_row(const state* s, int64_t key, float* out) {
    int i = index_of(key);
    if (key == -1) {
        memset(out, 0, (size_t)s->dim * sizeof(float));
    } else if (i >= 0 && s->present[i]) {
        memcpy(out, s->rows[i], (size_t)s->dim * sizeof(float));
    } else if (s->default_kind == RS_DEFAULT_NORMAL) {
        rs_default_vectors(0.5, 7, &key, 1, s->dim, out);
    } else if (s->default_kind == RS_DEFAULT_ROWS) {
        int64_t r = key % DEFAULT_ROWS;
        memcpy(out, DEFAULT_MATRIX[r < 0 ? r + DEFAULT_ROWS : r], (size_t)s->dim * sizeof(float));
    } else {
        memset(out, 0, (size_t)s->dim * sizeof(float));
    }
}

static int64_t live_count(const state* s) {
    int64_t n = 0;
    for (int i = 0; i < NKEYS; i++) n += s->present[i];
    return n;
}

static void op_upsert(state* s, input* in) {
    int n = byte(in) % MAX_BATCH;
    int64_t keys[MAX_BATCH];
    float values[MAX_BATCH * MAX_DIM];
    for (int j = 0; j < n; j++) {
        int k = key_index(in);
        keys[j] = KEYS[k];
        fill_row(s, k, values + j * s->dim);
    }
    CHECK(rs_table_upsert(s->table, keys, values, n) == RS_OK);
    for (int j = 0; j < n; j++) { /* within a batch the last write wins */
        int k = index_of(keys[j]);
        s->present[k] = true;
        memcpy(s->rows[k], values + j * s->dim, (size_t)s->dim * sizeof(float));
    }
}

static void op_delete(state* s, input* in) {
    int n = byte(in) % MAX_BATCH;
    int64_t keys[MAX_BATCH];
    for (int j = 0; j < n; j++) keys[j] = KEYS[key_index(in)];
    CHECK(rs_table_delete(s->table, keys, n) == RS_OK);
    for (int j = 0; j < n; j++) s->present[index_of(keys[j])] = false;
}

/* An id of a lookup: a key of the space, padding, or a key never written. */
static int64_t lookup_id(input* in) {
    uint8_t b = byte(in);
    if (b % 8 == 7) return -1;
    if (b % 8 == 6) return 0x5a5a5a5a5a5aLL + b;
    return KEYS[b % NKEYS];
}

static void op_lookup(state* s, input* in) {
    uint8_t shape = byte(in);
    int64_t combiner = shape % 4, width = 1 + (shape >> 2) % 4, rows = (shape >> 4) % 6;
    int64_t ids[6 * 4];
    for (int64_t j = 0; j < rows * width; j++) ids[j] = lookup_id(in);
    const int64_t out_rows = combiner == RS_COMBINER_NONE ? rows * width : rows;
    float out[6 * 4 * MAX_DIM + 1], want[MAX_DIM], acc[MAX_DIM];
    out[out_rows * s->dim] = 12345.0f; /* guard: nothing written past the output */
    CHECK(rs_table_lookup(s->table, ids, rows, width, combiner, out) == RS_OK);
    CHECK(out[out_rows * s->dim] == 12345.0f);
    for (int64_t r = 0; r < rows; r++) {
        if (combiner == RS_COMBINER_NONE) {
            for (int64_t l = 0; l < width; l++) {
                expected_row(s, ids[r * width + l], want);
                CHECK(memcmp(out + (r * width + l) * s->dim, want, (size_t)s->dim * sizeof(float)) == 0);
            }
            continue;
        }
        /* Pooled in id order in float32, then divided (DESIGN.md §4). */
        memset(acc, 0, sizeof acc);
        int64_t count = 0;
        for (int64_t l = 0; l < width; l++) {
            int64_t id = ids[r * width + l];
            if (id == -1) continue;
            count++;
            expected_row(s, id, want);
            for (int64_t d = 0; d < s->dim; d++) acc[d] += want[d];
        }
        if (count && combiner != RS_COMBINER_SUM) {
            float divisor = combiner == RS_COMBINER_MEAN ? (float)count : sqrtf((float)count);
            for (int64_t d = 0; d < s->dim; d++) acc[d] /= divisor;
        }
        CHECK(memcmp(out + r * s->dim, acc, (size_t)s->dim * sizeof(float)) == 0);
    }
}

static void op_contains(state* s, input* in) {
    int n = byte(in) % MAX_BATCH;
    int64_t keys[MAX_BATCH];
    uint8_t found[MAX_BATCH];
    for (int j = 0; j < n; j++) keys[j] = lookup_id(in);
    CHECK(rs_table_contains(s->table, keys, n, found) == RS_OK);
    for (int j = 0; j < n; j++) {
        int i = index_of(keys[j]);
        CHECK(found[j] == (i >= 0 && s->present[i]));
    }
}

static void op_snapshot(state* s, input* in) {
    int64_t live = live_count(s), capacity = byte(in) % 2 ? live : NKEYS;
    int64_t keys[NKEYS];
    float values[NKEYS * MAX_DIM];
    CHECK(rs_table_size(s->table) == live);
    CHECK(rs_table_snapshot(s->table, keys, values, capacity) == live);
    bool seen[NKEYS] = {false};
    for (int64_t j = 0; j < live; j++) {
        int i = index_of(keys[j]);
        CHECK(i >= 0 && s->present[i] && !seen[i]);
        seen[i] = true;
        CHECK(memcmp(values + j * s->dim, s->rows[i], (size_t)s->dim * sizeof(float)) == 0);
    }
}

static void op_sample(state* s, input* in) {
    uint64_t positions[4];
    int64_t out[4];
    for (int j = 0; j < 4; j++) positions[j] = (uint64_t)byte(in) * 0x9E3779B97F4A7C15ULL;
    int status = rs_table_sample(s->table, positions, 4, out);
    if (live_count(s) == 0) {
        CHECK(status == RS_EEMPTY);
        return;
    }
    CHECK(status == RS_OK);
    for (int j = 0; j < 4; j++) {
        int i = index_of(out[j]);
        CHECK(i >= 0 && s->present[i]);
    }
}

static void op_tier(state* s, input* in) {
    uint8_t b = byte(in);
    if (!s->tiered) return;
    int64_t stats[RS_TIER_STATS];
    CHECK((b % 2 ? rs_tier_compact(s->table) : rs_tier_maintain(s->table)) == RS_OK);
    CHECK(rs_tier_stats(s->table, stats) == RS_OK);
    CHECK(stats[RS_STAT_SSD_LIVE_RECORDS] == live_count(s));
    CHECK(stats[RS_STAT_DRAM_ROWS] <= stats[RS_STAT_DRAM_CAPACITY]);
}

static bool create(state* s, input* in) {
    uint8_t b = byte(in), n0 = byte(in) % 16;
    s->tiered = b & 1;
    s->default_kind = b & 2 ? RS_DEFAULT_NORMAL : b & 4 ? RS_DEFAULT_ROWS : RS_DEFAULT_ZEROS;
    const int32_t create_kind = s->default_kind == RS_DEFAULT_ROWS ? RS_DEFAULT_ZEROS : s->default_kind;
    s->dim = 1 + (b >> 4) % MAX_DIM;
    int64_t keys[16];
    float values[16 * MAX_DIM];
    for (int j = 0; j < n0; j++) {
        int k = key_index(in);
        keys[j] = KEYS[k];
        fill_row(s, k, values + j * s->dim);
    }
    int64_t detail = 0;
    int status;
    if (s->tiered) {
        const char* tmp = getenv("TMPDIR");
        snprintf(s->dir, sizeof s->dir, "%s/fuzz-engine-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        CHECK(mkdtemp(s->dir) != NULL);
        const int64_t record = 8 + 4 * s->dim;
        const uint8_t c = byte(in);
        rs_tier_config config = {
            .path = s->dir,
            .dram_bytes = (int64_t)(c & 3) * 6 * (4 * s->dim + 24),
            .ssd_bytes = 1 << 20,
            .segment_bytes = record * (1 + (c >> 2 & 1) * 7),
            .policy = c & 8 ? RS_POLICY_LRU : RS_POLICY_LFU,
            .io = c & 16 ? RS_IO_PREAD : RS_IO_MMAP,
            .async_compaction = 0,
            .eviction_threads = 1,
        };
        int64_t resident[1] = {0};
        int64_t capacity = rs_tier_capacity(s->dim, config.dram_bytes);
        int64_t n_resident = n0 > 0 && capacity - rs_tier_write_reserve(capacity) >= 1 ? 1 : 0;
        status = rs_tiered_create(s->dim, create_kind, 0.5, 7, keys, values, n0, resident, n_resident,
                                  &config, &s->table, &detail);
    } else {
        s->adopted = aligned_alloc(64, 64 * (size_t)(16 * MAX_DIM * sizeof(float) / 64 + 1));
        memcpy(s->adopted, values, (size_t)n0 * (size_t)s->dim * sizeof(float));
        status = rs_table_create(s->dim, create_kind, 0.5, 7, keys, s->adopted, n0, &s->table, &detail);
    }
    /* Duplicate initial keys must be refused, naming one; nothing else may fail. */
    bool dup = false;
    for (int i = 0; i < n0; i++)
        for (int j = 0; j < i; j++) dup |= keys[i] == keys[j];
    if (dup) {
        CHECK(status == RS_EDUPLICATE && index_of(detail) >= 0 && s->table == NULL);
        return false;
    }
    CHECK(status == RS_OK);
    if (s->default_kind == RS_DEFAULT_ROWS) {
        float matrix[DEFAULT_ROWS * MAX_DIM];
        fill_default_matrix();
        for (int r = 0; r < DEFAULT_ROWS; r++)
            memcpy(matrix + r * s->dim, DEFAULT_MATRIX[r], (size_t)s->dim * sizeof(float)); /* [3, dim] */
        CHECK(rs_table_set_default_rows(s->table, matrix, 0) == RS_EINVAL);
        CHECK(rs_table_set_default_rows(s->table, matrix, DEFAULT_ROWS) == RS_OK);
        CHECK(rs_table_set_default_rows(s->table, matrix, DEFAULT_ROWS) == RS_EINVAL); /* once */
    }
    for (int j = 0; j < n0; j++) {
        int k = index_of(keys[j]);
        s->present[k] = true;
        memcpy(s->rows[k], values + j * s->dim, (size_t)s->dim * sizeof(float));
    }
    return true;
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc, (void)argv;
    keep_eviction_threads();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    input in = {data, data + size};
    state* s = calloc(1, sizeof *s);
    if (create(s, &in)) {
        while (more(&in)) {
            switch (byte(&in) % 8) {
            case 0: case 1: op_upsert(s, &in); break;
            case 2: op_delete(s, &in); break;
            case 3: op_lookup(s, &in); break;
            case 4: op_contains(s, &in); break;
            case 5: op_snapshot(s, &in); break;
            case 6: op_sample(s, &in); break;
            default: op_tier(s, &in); break;
            }
        }
        op_snapshot(s, &in);
        rs_table_free(s->table);
    }
    if (s->tiered && s->dir[0]) CHECK(rmdir(s->dir) == 0); /* the table deleted its files */
    free(s->adopted);
    free(s);
    return 0;
}
