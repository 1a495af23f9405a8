/* The native request route: see route.h for the objects, their ownership and the leases.
 *
 * A compiled route is the C twin of recserve.processor.request_route.RequestRoute for one
 * request layout: which string-id spans of the parser's values buffer to key in place (XXH64,
 * hash buckets, or a vocabulary built once per servable: route_vocabulary.h) and which int64
 * ids to key in place through an integer vocabulary (route_int_vocabulary.h), the
 * lookup plan's tasks (rs_lookup_at, offsets from the values buffer and the output arena),
 * the dense inputs as (slot, wire kind, count) -> (ONNX type, shape) copies, the folded Concat
 * input if the session group has one, and the outputs to ask for and how to name them. Every
 * check a route stands for was made in Python when the layout was first seen; equal layout
 * bytes mean equal names, dtypes, shapes and slots, so a request here only moves values.
 */
#include "route.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"
#include "varint.h"
#include "route_int_vocabulary.h"
#include "route_vocabulary.h"

#define ROUTE_FORMAT 2
#define ROUTE_BUCKETS 2048 /* power of two; twice Servable._MAX_ROUTES */
#define SCRATCH_START (1 << 12)
#define SCRATCH_MAX (1 << 20)

enum { SRC_INT64 = 0, SRC_FLOAT32 = 1, SRC_FLOAT64 = 2 };
/* How a string input's ids become keys (recserve.embedding.StringKeys): XXH64; TensorFlow's
 * StringToHashBucketFast (Fingerprint64 modulo a bucket count); a vocabulary's index. */
/* KEY_BUCKETS_EMPTY: buckets where '' is a string like any other (Keras's Hashing layer), not padding.
 * KEY_INT_VOCABULARY: int64 ids (one slot each, not string spans) through an integer
 * vocabulary (recserve.embedding.IntegerKeys). */
enum { KEY_XXH64 = 0, KEY_BUCKETS = 1, KEY_VOCABULARY = 2, KEY_BUCKETS_EMPTY = 3, KEY_INT_VOCABULARY = 4 };
/* tensorflow.eas.ArrayDataType values the encoder writes. */
enum { DT_FLOAT = 1, DT_DOUBLE = 2, DT_INT32 = 3, DT_INT64 = 9, DT_BOOL = 10 };

typedef struct {
    const char* name;
    int64_t src, slot, count; /* the request's values: wire kind, first slot, element count */
    int32_t elem_type;        /* what the graph is fed (RS_ELEM_*) */
    int64_t shape[RS_DENSE_MAX_RANK];
    size_t rank;
} dense_input;

typedef struct {
    const char* name;
    int64_t offset; /* floats into the arena */
    int64_t shape[RS_DENSE_MAX_RANK];
    size_t rank;
} bound_input;

typedef struct {
    int64_t first, stop; /* its (start, length) pairs in the values buffer (KEY_INT_VOCABULARY:
                            its int64 ids), keyed in place */
    int64_t key;         /* KEY_* */
    uint64_t buckets;    /* KEY_BUCKETS */
    const rs_vocabulary* vocabulary; /* KEY_VOCABULARY: one of the servable's */
    const rs_int_vocabulary* int_vocabulary; /* KEY_INT_VOCABULARY: one of the servable's */
} string_input;

typedef struct {
    int64_t start, stop, src, slot, count;
} fold_column;

typedef struct {
    int64_t column, offset, count, dim;
} fold_block;

typedef struct {
    uint8_t* key;
    int64_t key_size;
    uint64_t hash;
    bool refused; /* a layout with no native form: nothing below is set */
    int64_t batch;
    int64_t values_end; /* slots the route reads: the request's values buffer holds at least these */
    int64_t n_strings;
    string_input* strings;
    int64_t n_tasks;
    rs_lookup_task* tasks;
    int64_t arena_floats;
    int64_t n_bound;
    bound_input* bound;
    int64_t n_dense;
    dense_input* dense;
    const char* fold_name; /* NULL: no folded Concat input */
    int64_t fold_width, n_columns, n_blocks;
    fold_column* columns;
    fold_block* blocks;
    int64_t n_outputs;
    const char** output_keys;   /* response names */
    const char** output_names;  /* graph output names */
    char* names;                /* owns every name above */
} route;

/* Fields every request writes sit on cache lines of their own, apart from those every
 * request only reads: two threads serving at once must not invalidate each other's copy of
 * the read-mostly ones (measured: a demo-model request cost 40% more CPU at 2 threads). */
#define LINE 64

struct vocabulary_node { /* one of the two is set */
    rs_vocabulary* vocabulary;
    rs_int_vocabulary* int_vocabulary;
    struct vocabulary_node* next;
};

struct rs_servable {
    _Alignas(LINE) atomic_int_fast64_t leases;
    _Alignas(LINE) int64_t id;
    atomic_int_fast64_t delta_step; /* rs_servable_set_delta_step */
    rs_dense_run_fn run;
    void* runner;
    rs_dense_run_fn run_merged; /* rs_route_process_many's runs (rs_servable_set_merged_run) */
    void* runner_merged;
    rs_lookup_at_fn lookup_at;
    rs_xxh64_spans_fn xxh64_spans;
    rs_bucket_spans_fn bucket_spans;
    _Atomic(struct vocabulary_node*) vocabularies; /* rs_servable_add_vocabulary's, newest first */
    atomic_int_fast64_t n_routes;
    _Atomic(route*) routes[ROUTE_BUCKETS];
};

/* Counters are striped: each thread adds to its own stripe (picked once per thread), a
 * reader sums them. */
#define STRIPES 16

typedef struct {
    _Alignas(LINE) atomic_int_fast64_t n[RS_COUNTERS];
} counter_stripe;

struct rs_route_slot {
    _Alignas(LINE) atomic_int_fast64_t entering;
    _Alignas(LINE) _Atomic(rs_servable*) current;
    atomic_int reason_if_null;
    counter_stripe stripes[STRIPES];
};

static atomic_int next_stripe;
static _Thread_local int my_stripe = -1;

/* Zeroed memory aligned to a cache line (the structs above ask for it). */
static void* alloc_lines(size_t size) {
    size = (size + LINE - 1) / LINE * LINE;
    void* p = aligned_alloc(LINE, size);
    if (p)
        memset(p, 0, size);
    return p;
}

/* ---- clocks and counters -------------------------------------------------------------- */

static int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void count(rs_route_slot* slot, int which, int64_t by) {
    if (my_stripe < 0)
        my_stripe = atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) % STRIPES;
    atomic_fetch_add_explicit(&slot->stripes[my_stripe].n[which], by, memory_order_relaxed);
}

rs_route_slot* rs_slot_create(void) {
    rs_route_slot* slot = alloc_lines(sizeof *slot);
    if (slot)
        atomic_store(&slot->reason_if_null, RS_FALLBACK_NO_SERVABLE);
    return slot;
}

void rs_slot_free(rs_route_slot* slot) {
    free(slot);
}

void rs_slot_count(rs_route_slot* slot, int32_t reason) {
    if (reason >= 0 && reason < RS_FALLBACK_REASONS)
        count(slot, reason, 1);
}

int64_t rs_slot_counters(rs_route_slot* slot, int64_t* out, int64_t cap) {
    for (int64_t i = 0; i < cap && i < RS_COUNTERS; i++) {
        out[i] = 0;
        for (int k = 0; k < STRIPES; k++)
            out[i] += atomic_load_explicit(&slot->stripes[k].n[i], memory_order_relaxed);
    }
    return RS_COUNTERS;
}

/* ---- leases ---------------------------------------------------------------------------- */

static rs_servable* lease(rs_route_slot* slot) {
    atomic_fetch_add(&slot->entering, 1);
    rs_servable* s = atomic_load(&slot->current);
    if (s)
        atomic_fetch_add_explicit(&s->leases, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&slot->entering, 1, memory_order_release);
    return s;
}

static void unlease(rs_servable* s) {
    atomic_fetch_sub_explicit(&s->leases, 1, memory_order_release);
}

void rs_slot_publish(rs_route_slot* slot, rs_servable* s, int32_t reason_if_null) {
    if (s)
        atomic_fetch_add(&s->leases, 1);
    atomic_store(&slot->reason_if_null, reason_if_null);
    rs_servable* old = atomic_exchange(&slot->current, s);
    /* A request that loaded `old` before the exchange is still inside the slot until its
     * lease is counted: only then may the slot's own lease go. */
    while (atomic_load_explicit(&slot->entering, memory_order_acquire) != 0) {
        struct timespec pause = {0, 1000};
        nanosleep(&pause, NULL);
    }
    if (old)
        unlease(old);
}

rs_servable* rs_servable_create(int64_t id, rs_dense_run_fn run, void* runner, rs_lookup_at_fn lookup_at,
                                rs_xxh64_spans_fn xxh64_spans, rs_bucket_spans_fn bucket_spans) {
    if (!run || !lookup_at || !xxh64_spans || !bucket_spans)
        return NULL;
    rs_servable* s = alloc_lines(sizeof *s);
    if (!s)
        return NULL;
    atomic_store(&s->leases, 1);
    s->id = id;
    s->run = s->run_merged = run;
    s->runner = s->runner_merged = runner;
    s->lookup_at = lookup_at;
    s->xxh64_spans = xxh64_spans;
    s->bucket_spans = bucket_spans;
    return s;
}

void rs_servable_set_delta_step(rs_servable* s, int64_t delta_step) {
    if (s)
        atomic_store_explicit(&s->delta_step, delta_step, memory_order_relaxed);
}

void rs_servable_set_merged_run(rs_servable* s, rs_dense_run_fn run, void* runner) {
    if (s && run) {
        s->run_merged = run;
        s->runner_merged = runner;
    }
}

static void push_vocabulary(rs_servable* s, struct vocabulary_node* node) {
    node->next = atomic_load(&s->vocabularies);
    /* Release: a compile that finds the node sees the vocabulary fully built. */
    while (!atomic_compare_exchange_weak_explicit(&s->vocabularies, &node->next, node, memory_order_release,
                                                  memory_order_relaxed)) {
    }
}

int64_t rs_servable_add_vocabulary(rs_servable* s, const uint8_t* words, const int64_t* lengths,
                                   const int64_t* indices, int64_t n, int64_t default_id, int64_t oov_buckets,
                                   int64_t oov_start, int32_t empty_is_padding) {
    if (!s)
        return 0;
    struct vocabulary_node* node = malloc(sizeof *node);
    rs_vocabulary_unknown unknown = {default_id, oov_buckets < 0 ? UINT64_MAX : (uint64_t)oov_buckets, oov_start,
                                     empty_is_padding != 0};
    rs_vocabulary* v = node ? rs_vocabulary_build(words, lengths, indices, n, &unknown) : NULL;
    if (!v) {
        free(node);
        return 0;
    }
    *node = (struct vocabulary_node){v, NULL, NULL};
    push_vocabulary(s, node);
    return (int64_t)(intptr_t)v;
}

int64_t rs_servable_add_int_vocabulary(rs_servable* s, const int64_t* ids, const int64_t* keys, int64_t n,
                                       int64_t default_id, int32_t padding) {
    if (!s)
        return 0;
    struct vocabulary_node* node = malloc(sizeof *node);
    rs_int_vocabulary* v = node ? rs_int_vocabulary_build(ids, keys, n, default_id, padding) : NULL;
    if (!v) {
        free(node);
        return 0;
    }
    *node = (struct vocabulary_node){NULL, v, NULL};
    push_vocabulary(s, node);
    return (int64_t)(intptr_t)v;
}

/* The servable's vocabulary whose handle is `handle`, or NULL: a description names only these. */
static const rs_vocabulary* vocabulary_of(rs_servable* s, int64_t handle) {
    for (struct vocabulary_node* n = atomic_load_explicit(&s->vocabularies, memory_order_acquire); n; n = n->next)
        if (n->vocabulary && (int64_t)(intptr_t)n->vocabulary == handle)
            return n->vocabulary;
    return NULL;
}

static const rs_int_vocabulary* int_vocabulary_of(rs_servable* s, int64_t handle) {
    for (struct vocabulary_node* n = atomic_load_explicit(&s->vocabularies, memory_order_acquire); n; n = n->next)
        if (n->int_vocabulary && (int64_t)(intptr_t)n->int_vocabulary == handle)
            return n->int_vocabulary;
    return NULL;
}

int64_t rs_servable_leases(rs_servable* s) {
    return atomic_load(&s->leases);
}

int rs_servable_drain(rs_servable* s, int64_t timeout_ms) {
    int64_t deadline = now_ns(CLOCK_MONOTONIC) + timeout_ms * 1000000;
    while (atomic_load_explicit(&s->leases, memory_order_acquire) > 1) {
        if (now_ns(CLOCK_MONOTONIC) >= deadline)
            return 1;
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
    return 0;
}

static void route_free(route* r) {
    if (!r)
        return;
    free(r->key);
    free(r->strings);
    free(r->tasks);
    free(r->bound);
    free(r->dense);
    free(r->columns);
    free(r->blocks);
    free(r->output_keys);
    free(r->output_names);
    free(r->names);
    free(r);
}

void rs_servable_free(rs_servable* s) {
    if (!s)
        return;
    for (int i = 0; i < ROUTE_BUCKETS; i++)
        route_free(atomic_load(&s->routes[i]));
    for (struct vocabulary_node* n = atomic_load(&s->vocabularies); n;) {
        struct vocabulary_node* next = n->next;
        rs_vocabulary_free(n->vocabulary);
        rs_int_vocabulary_free(n->int_vocabulary);
        free(n);
        n = next;
    }
    free(s);
}

int64_t rs_servable_routes(rs_servable* s) {
    return atomic_load(&s->n_routes);
}

/* ---- compiling a route from its description -------------------------------------------- */

typedef struct {
    const int64_t* ints;
    int64_t n, at;
    const char* names;
    int64_t names_size;
    bool bad;
} reader;

static int64_t next(reader* r) {
    if (r->at >= r->n) {
        r->bad = true;
        return 0;
    }
    return r->ints[r->at++];
}

/* A count of items that each need at least `width` more ints. */
static int64_t next_count(reader* r, int64_t width) {
    int64_t n = next(r);
    if (n < 0 || n > (r->n - r->at) / (width > 0 ? width : 1))
        r->bad = true;
    return r->bad ? 0 : n;
}

static const char* next_name(reader* r, const char* base) {
    int64_t at = next(r);
    if (at < 0 || at >= r->names_size || !memchr(r->names + at, '\0', (size_t)(r->names_size - at))) {
        r->bad = true;
        return "";
    }
    return base + at;
}

static size_t next_shape(reader* r, int64_t* shape, int64_t* elements) {
    int64_t rank = next(r);
    if (rank < 0 || rank > RS_DENSE_MAX_RANK) {
        r->bad = true;
        return 0;
    }
    int64_t total = 1;
    for (int64_t i = 0; i < rank; i++) {
        shape[i] = next(r);
        if (shape[i] < 0 || (shape[i] && total > INT64_MAX / shape[i]))
            r->bad = true;
        else
            total *= shape[i];
    }
    *elements = total;
    return (size_t)rank;
}

static bool valid_elem(int64_t t) {
    return t == RS_ELEM_FLOAT || t == RS_ELEM_DOUBLE || t == RS_ELEM_INT32 || t == RS_ELEM_INT64 || t == RS_ELEM_BOOL;
}

static int64_t src_slots(int64_t src, int64_t count) {
    return src == SRC_FLOAT32 ? (count + 1) / 2 : count;
}

static void reach(route* rt, int64_t slot, int64_t slots) {
    if (slot + slots > rt->values_end)
        rt->values_end = slot + slots;
}

static route* compile(rs_servable* s, const int64_t* ints, int64_t n_ints, const char* names, int64_t names_size) {
    route* rt = calloc(1, sizeof *rt);
    if (!rt)
        return NULL;
    rt->names = malloc((size_t)names_size + 1);
    if (!rt->names) {
        free(rt);
        return NULL;
    }
    memcpy(rt->names, names, (size_t)names_size);
    rt->names[names_size] = '\0';
    reader r = {ints, n_ints, 0, rt->names, names_size, false};
    const char* base = rt->names;
    if (next(&r) != ROUTE_FORMAT)
        goto bad;
    rt->batch = next(&r);

    rt->n_strings = next_count(&r, 4);
    rt->strings = calloc((size_t)rt->n_strings + 1, sizeof(string_input));
    for (int64_t i = 0; rt->strings && i < rt->n_strings; i++) {
        string_input* in = &rt->strings[i];
        in->first = next(&r);
        in->stop = next(&r);
        in->key = next(&r);
        int64_t arg = next(&r);
        if (in->first < 0 || in->stop < in->first || (in->key != KEY_INT_VOCABULARY && (in->stop - in->first) % 2))
            r.bad = true;
        else
            reach(rt, in->first, in->stop - in->first);
        if ((in->key == KEY_BUCKETS || in->key == KEY_BUCKETS_EMPTY) && arg > 0)
            in->buckets = (uint64_t)arg;
        else if (in->key == KEY_VOCABULARY)
            r.bad |= !(in->vocabulary = vocabulary_of(s, arg));
        else if (in->key == KEY_INT_VOCABULARY)
            r.bad |= !(in->int_vocabulary = int_vocabulary_of(s, arg));
        else if (in->key != KEY_XXH64 || arg != 0)
            r.bad = true;
    }

    rt->n_tasks = next_count(&r, 6);
    rt->tasks = calloc((size_t)rt->n_tasks + 1, sizeof(rs_lookup_task));
    for (int64_t i = 0; rt->tasks && i < rt->n_tasks; i++) {
        rs_lookup_task* t = &rt->tasks[i];
        t->table = (rs_table*)(intptr_t)next(&r);
        int64_t ids_at = next(&r), out_at = next(&r);
        t->ids = (const int64_t*)(intptr_t)ids_at;
        t->out = (float*)(intptr_t)out_at;
        t->rows = next(&r);
        t->width = next(&r);
        t->combiner = next(&r);
        if (!t->table || ids_at < 0 || ids_at % 8 || out_at < 0 || out_at % 4 || t->rows < 0 || t->width < 0)
            r.bad = true;
        else
            reach(rt, ids_at / 8, t->rows * t->width);
    }
    rt->arena_floats = next(&r);
    if (rt->arena_floats < 0)
        r.bad = true;

    rt->n_bound = next_count(&r, 3);
    rt->bound = calloc((size_t)rt->n_bound + 1, sizeof(bound_input));
    for (int64_t i = 0; rt->bound && i < rt->n_bound; i++) {
        bound_input* b = &rt->bound[i];
        b->name = next_name(&r, base);
        b->offset = next(&r);
        int64_t elements = 0;
        b->rank = next_shape(&r, b->shape, &elements);
        if (b->offset < 0 || b->offset + elements > rt->arena_floats)
            r.bad = true;
    }

    rt->n_dense = next_count(&r, 6);
    rt->dense = calloc((size_t)rt->n_dense + 1, sizeof(dense_input));
    for (int64_t i = 0; rt->dense && i < rt->n_dense; i++) {
        dense_input* d = &rt->dense[i];
        d->name = next_name(&r, base);
        d->src = next(&r);
        d->slot = next(&r);
        d->count = next(&r);
        d->elem_type = (int32_t)next(&r);
        int64_t elements = 0;
        d->rank = next_shape(&r, d->shape, &elements);
        if (d->src < SRC_INT64 || d->src > SRC_FLOAT64 || d->slot < 0 || d->count != elements ||
            !valid_elem(d->elem_type))
            r.bad = true;
        else
            reach(rt, d->slot, src_slots(d->src, d->count));
    }

    if (next(&r)) {
        rt->fold_name = next_name(&r, base);
        rt->fold_width = next(&r);
        rt->n_columns = next_count(&r, 5);
        rt->columns = calloc((size_t)rt->n_columns + 1, sizeof(fold_column));
        for (int64_t i = 0; rt->columns && i < rt->n_columns; i++) {
            fold_column* c = &rt->columns[i];
            c->start = next(&r);
            c->stop = next(&r);
            c->src = next(&r);
            c->slot = next(&r);
            c->count = next(&r);
            if (c->start < 0 || c->stop < c->start || c->stop > rt->fold_width || c->src < SRC_INT64 ||
                c->src > SRC_FLOAT64 || c->slot < 0 || c->count != rt->batch * (c->stop - c->start))
                r.bad = true;
            else
                reach(rt, c->slot, src_slots(c->src, c->count));
        }
        rt->n_blocks = next_count(&r, 4);
        rt->blocks = calloc((size_t)rt->n_blocks + 1, sizeof(fold_block));
        for (int64_t i = 0; rt->blocks && i < rt->n_blocks; i++) {
            fold_block* b = &rt->blocks[i];
            b->column = next(&r);
            b->offset = next(&r);
            b->count = next(&r);
            b->dim = next(&r);
            if (b->column < 0 || b->count < 0 || b->dim < 0 || b->column + b->count * b->dim > rt->fold_width ||
                b->offset < 0 || b->offset + b->count * rt->batch * b->dim > rt->arena_floats)
                r.bad = true;
        }
        if (rt->batch < 0 || rt->fold_width < 0)
            r.bad = true;
    }

    rt->n_outputs = next_count(&r, 2);
    rt->output_keys = calloc((size_t)rt->n_outputs + 1, sizeof(char*));
    rt->output_names = calloc((size_t)rt->n_outputs + 1, sizeof(char*));
    for (int64_t i = 0; rt->output_keys && rt->output_names && i < rt->n_outputs; i++) {
        rt->output_keys[i] = next_name(&r, base);
        rt->output_names[i] = next_name(&r, base);
    }
    if (r.bad || r.at != n_ints || !rt->strings || !rt->tasks || !rt->bound || !rt->dense || !rt->output_keys ||
        !rt->output_names || (rt->fold_name && (!rt->columns || !rt->blocks)))
        goto bad;
    return rt;
bad:
    route_free(rt);
    return NULL;
}

/* Publishes rt (owned from here on) under key[key_size]: 0, or 1 when the table is full or
 * the key is already there (rt is freed), -1 out of memory. */
static int insert_route(rs_servable* s, route* rt, const uint8_t* key, int64_t key_size) {
    rt->key = malloc((size_t)key_size);
    if (!rt->key) {
        route_free(rt);
        return -1;
    }
    memcpy(rt->key, key, (size_t)key_size);
    rt->key_size = key_size;
    rt->hash = rs_fnv1a64(key, key_size);
    if (atomic_load(&s->n_routes) >= ROUTE_BUCKETS / 2) {
        route_free(rt);
        return 1;
    }
    for (uint64_t i = 0; i < ROUTE_BUCKETS; i++) {
        _Atomic(route*)* bucket = &s->routes[(rt->hash + i) & (ROUTE_BUCKETS - 1)];
        route* expected = NULL;
        /* Release: a request that finds the pointer sees the route fully built. */
        if (atomic_compare_exchange_strong_explicit(bucket, &expected, rt, memory_order_release,
                                                    memory_order_acquire)) {
            atomic_fetch_add(&s->n_routes, 1);
            return 0;
        }
        if (expected->hash == rt->hash && expected->key_size == key_size && !memcmp(expected->key, key, (size_t)key_size))
            break; /* another thread registered the same layout first */
    }
    route_free(rt);
    return 1;
}

int rs_servable_add_route(rs_servable* s, const uint8_t* key, int64_t key_size, const int64_t* ints, int64_t n_ints,
                          const char* names, int64_t names_size) {
    if (!s || !key || key_size <= 0 || !ints || n_ints <= 0 || names_size < 0 || (names_size && !names))
        return -1;
    route* rt = compile(s, ints, n_ints, names ? names : "", names_size);
    return rt ? insert_route(s, rt, key, key_size) : -1;
}

int rs_servable_refuse_layout(rs_servable* s, const uint8_t* key, int64_t key_size) {
    if (!s || !key || key_size <= 0)
        return -1;
    route* rt = calloc(1, sizeof *rt);
    if (!rt)
        return -1;
    rt->refused = true;
    return insert_route(s, rt, key, key_size);
}

static const route* find_route(rs_servable* s, const uint8_t* key, int64_t size) {
    uint64_t h = rs_fnv1a64(key, size);
    for (uint64_t i = 0; i < ROUTE_BUCKETS; i++) {
        const route* rt = atomic_load_explicit(&s->routes[(h + i) & (ROUTE_BUCKETS - 1)], memory_order_acquire);
        if (!rt)
            return NULL;
        if (rt->hash == h && rt->key_size == size && !memcmp(rt->key, key, (size_t)size))
            return rt;
    }
    return NULL;
}

/* ---- one request ------------------------------------------------------------------------ */

static size_t elem_size(int32_t t) {
    switch (t) {
    case RS_ELEM_FLOAT: case RS_ELEM_INT32: return 4;
    case RS_ELEM_INT64: case RS_ELEM_DOUBLE: return 8;
    case RS_ELEM_BOOL: return 1;
    default: return 0;
    }
}

/* values[slot...] read as the wire kind `src`, element i, widened to double / int64. */
#define SRC_AT(src, base, i) \
    ((src) == SRC_INT64 ? (double)(base)[i] : (src) == SRC_FLOAT32 ? (double)((const float*)(base))[i] \
                                                                   : ((const double*)(base))[i])

/* Float -> integer as numpy's astype gives it on x86-64 (cvttsd2si): NaN and values out of
 * range become the type's minimum. (Python never compiles such a cast into a route -- the
 * signature refuses unsafe casts -- but C must not meet undefined behaviour either.) */
static int32_t to_int32(double v) {
    return v >= -2147483648.0 && v < 2147483648.0 ? (int32_t)v : INT32_MIN;
}

static int64_t to_int64(double v) {
    return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? (int64_t)v : INT64_MIN;
}

/* Copies `count` values of wire kind `src` into `out` as elem_type (numpy's astype). */
static void convert(int64_t src, const int64_t* from, int64_t count, int32_t elem_type, void* out) {
    for (int64_t i = 0; i < count; i++) {
        switch (elem_type) {
        case RS_ELEM_FLOAT:
            ((float*)out)[i] = src == SRC_INT64 ? (float)from[i] : src == SRC_FLOAT32 ? ((const float*)from)[i]
                                                                                     : (float)((const double*)from)[i];
            break;
        case RS_ELEM_DOUBLE:
            ((double*)out)[i] = SRC_AT(src, from, i);
            break;
        case RS_ELEM_INT32:
            ((int32_t*)out)[i] = src == SRC_INT64 ? (int32_t)from[i] : to_int32(SRC_AT(src, from, i));
            break;
        case RS_ELEM_INT64:
            ((int64_t*)out)[i] = src == SRC_INT64 ? from[i] : to_int64(SRC_AT(src, from, i));
            break;
        case RS_ELEM_BOOL:
            ((uint8_t*)out)[i] = src == SRC_INT64 ? from[i] != 0 : SRC_AT(src, from, i) != 0;
            break;
        }
    }
}

/* The input's values where they lie when the wire kind is the graph's type; else NULL. */
static const void* in_place(const dense_input* d, const int64_t* values) {
    const int64_t* at = values + d->slot;
    if ((d->src == SRC_INT64 && d->elem_type == RS_ELEM_INT64) ||
        (d->src == SRC_FLOAT32 && d->elem_type == RS_ELEM_FLOAT) ||
        (d->src == SRC_FLOAT64 && d->elem_type == RS_ELEM_DOUBLE))
        return at;
    return NULL;
}

static void fill_folded(const route* rt, const int64_t* values, const float* arena, float* out) {
    int64_t batch = rt->batch, width = rt->fold_width;
    for (int64_t c = 0; c < rt->n_columns; c++) {
        const fold_column* col = &rt->columns[c];
        int64_t w = col->stop - col->start;
        const int64_t* from = values + col->slot;
        for (int64_t row = 0; row < batch; row++) {
            float* dst = out + row * width + col->start;
            if (col->src == SRC_FLOAT32)
                memcpy(dst, (const float*)from + row * w, (size_t)w * sizeof(float));
            else
                for (int64_t j = 0; j < w; j++)
                    dst[j] = col->src == SRC_INT64 ? (float)from[row * w + j] : (float)((const double*)from)[row * w + j];
        }
    }
    /* A block: `count` plan outputs [batch, dim] back to back in the arena, side by side in
     * the Concat: out[row, column + k*dim : ...] = arena[offset + (k*batch + row)*dim : ...]. */
    for (int64_t b = 0; b < rt->n_blocks; b++) {
        const fold_block* blk = &rt->blocks[b];
        for (int64_t row = 0; row < batch; row++) {
            float* dst = out + row * width + blk->column;
            for (int64_t k = 0; k < blk->count; k++)
                memcpy(dst + k * blk->dim, arena + blk->offset + (k * batch + row) * blk->dim,
                       (size_t)blk->dim * sizeof(float));
        }
    }
}

/* ---- the response ------------------------------------------------------------------------ */

typedef struct {
    int dtype, field; /* DataType (tensorflow.eas's ArrayDataType numbers are TensorFlow's), value field's tag byte */
    size_t dims_size, shape_size, payload, values_size, array_size, body, entry_size, key_size;
} output_plan;

/* The two responses the route writes: DeepRec's tensorflow.eas.PredictResponse (outputs as
 * ArrayProto, recserve.wire.codec) and TF Serving's tensorflow.serving.PredictResponse
 * (outputs as TensorProto, recserve.wire.tfserving_codec; the caller appends its
 * model_spec). Both: map entries (name, array), in the route's output order. */
typedef enum { WIRE_EAS = 0, WIRE_TFS = 1 } wire;

/* An output's value field tag byte per wire, by RS_ELEM_*; 0: not written here. */
static int value_field(wire w, int32_t elem_type) {
    switch (elem_type) {
    case RS_ELEM_FLOAT: return w == WIRE_EAS ? 0x1A : 0x2A;  /* float_val: packed fixed32 */
    case RS_ELEM_DOUBLE: return w == WIRE_EAS ? 0x22 : 0x32; /* double_val: packed fixed64 */
    case RS_ELEM_INT32: return w == WIRE_EAS ? 0x2A : 0x3A;  /* int_val: packed varints */
    case RS_ELEM_INT64: return w == WIRE_EAS ? 0x3A : 0x52;  /* int64_val */
    case RS_ELEM_BOOL: return w == WIRE_EAS ? 0x42 : 0x5A;   /* bool_val */
    default: return 0;
    }
}

static uint64_t varint_value(const rs_tensor_out* o, int64_t i) {
    switch (o->elem_type) {
    case RS_ELEM_INT32: return (uint64_t)(int64_t)((const int32_t*)o->data)[i]; /* int32: sign-extended */
    case RS_ELEM_INT64: return (uint64_t)((const int64_t*)o->data)[i];
    default: return ((const uint8_t*)o->data)[i] != 0;
    }
}

/* A TensorShapeProto.Dim's bytes: its size (field 1) unless 0 (proto3 leaves it out). */
static size_t tf_dim_size(int64_t d) {
    return d ? 1 + rs_varint_size((uint64_t)d) : 0;
}

/* The sizes of one PredictResponse.outputs entry as recserve's Python encoder for `w`
 * writes it; false for an output it does not write here. */
static bool plan_output(wire w, const rs_tensor_out* o, const char* key, output_plan* p) {
    int64_t elements = 1;
    if (o->rank > RS_DENSE_MAX_RANK)
        return false;
    p->dims_size = 0;
    for (size_t i = 0; i < o->rank; i++) {
        if (o->shape[i] < 0)
            return false;
        elements *= o->shape[i];
        if (w == WIRE_EAS) /* ArrayShape.dim: packed int64 */
            p->dims_size += rs_varint_size((uint64_t)o->shape[i]);
        else /* TensorShapeProto.dim: a message each */
            p->dims_size += 1 + rs_varint_size(tf_dim_size(o->shape[i])) + tf_dim_size(o->shape[i]);
    }
    size_t width = elem_size(o->elem_type);
    p->field = value_field(w, o->elem_type);
    if (!width || !p->field || (size_t)elements * width != o->bytes || (elements && !o->data))
        return false;
    p->dtype = o->elem_type == RS_ELEM_FLOAT    ? DT_FLOAT
               : o->elem_type == RS_ELEM_DOUBLE ? DT_DOUBLE
               : o->elem_type == RS_ELEM_INT32  ? DT_INT32
               : o->elem_type == RS_ELEM_INT64  ? DT_INT64
                                                : DT_BOOL;
    size_t payload = 0;
    if (o->elem_type == RS_ELEM_FLOAT || o->elem_type == RS_ELEM_DOUBLE)
        payload = o->bytes;
    else
        for (int64_t i = 0; i < elements; i++)
            payload += rs_varint_size(varint_value(o, i));
    if (w == WIRE_EAS) /* array_shape is left out when it has no dims */
        p->shape_size = p->dims_size ? 1 + rs_varint_size(p->dims_size) + p->dims_size : 0;
    else /* tensor_shape is always written, a scalar's empty */
        p->shape_size = p->dims_size;
    p->payload = payload;
    p->values_size = payload ? 1 + rs_varint_size(payload) + payload : 0;
    p->array_size = 1 + rs_varint_size((uint64_t)p->dtype) + 1 + rs_varint_size(p->shape_size) + p->shape_size + p->values_size;
    p->key_size = strlen(key);
    p->body = 1 + rs_varint_size(p->key_size) + p->key_size + 1 + rs_varint_size(p->array_size) + p->array_size;
    p->entry_size = 1 + rs_varint_size(p->body) + p->body;
    return true;
}

static uint8_t* put_output(wire w, uint8_t* at, const rs_tensor_out* o, const char* key, const output_plan* p) {
    /* (The sizes are the plan's: one recomputed from a total, e.g. a body of 127 bytes from
     * its entry's 129, would take the wrong varint width.) */
    *at++ = 0x0A;
    at = rs_varint_put(at, p->body);
    *at++ = 0x0A;
    at = rs_varint_put(at, p->key_size);
    memcpy(at, key, p->key_size);
    at += p->key_size;
    *at++ = 0x12;
    at = rs_varint_put(at, p->array_size);
    *at++ = 0x08;
    at = rs_varint_put(at, (uint64_t)p->dtype);
    *at++ = 0x12;
    at = rs_varint_put(at, p->shape_size);
    if (w == WIRE_EAS && p->shape_size) {
        *at++ = 0x0A;
        at = rs_varint_put(at, p->dims_size);
        for (size_t i = 0; i < o->rank; i++)
            at = rs_varint_put(at, (uint64_t)o->shape[i]);
    } else if (w == WIRE_TFS) {
        for (size_t i = 0; i < o->rank; i++) {
            *at++ = 0x12;
            at = rs_varint_put(at, tf_dim_size(o->shape[i]));
            if (o->shape[i]) {
                *at++ = 0x08;
                at = rs_varint_put(at, (uint64_t)o->shape[i]);
            }
        }
    }
    if (p->values_size) {
        *at++ = (uint8_t)p->field;
        at = rs_varint_put(at, p->payload);
        if (o->elem_type == RS_ELEM_FLOAT || o->elem_type == RS_ELEM_DOUBLE) {
            memcpy(at, o->data, o->bytes);
            at += o->bytes;
        } else {
            int64_t elements = (int64_t)(o->bytes / elem_size(o->elem_type));
            for (int64_t i = 0; i < elements; i++)
                at = rs_varint_put(at, varint_value(o, i));
        }
    }
    return at;
}

/* 0 with the response in *out, or an RS_FALLBACK_* reason. */
static int encode(wire w, const route* rt, const rs_tensor_out* outs, uint8_t** out, int64_t* out_size) {
    output_plan plans_small[16];
    output_plan* plans = rt->n_outputs <= 16 ? plans_small : malloc((size_t)rt->n_outputs * sizeof *plans);
    if (!plans)
        return RS_FALLBACK_MEMORY;
    size_t total = 0;
    int reason = 0;
    for (int64_t i = 0; i < rt->n_outputs && !reason; i++) {
        if (!plan_output(w, &outs[i], rt->output_keys[i], &plans[i]))
            reason = RS_FALLBACK_OUTPUT;
        total += plans[i].entry_size;
    }
    uint8_t* buffer = reason ? NULL : malloc(total + 1);
    if (!reason && !buffer)
        reason = RS_FALLBACK_MEMORY;
    if (!reason) {
        uint8_t* at = buffer;
        for (int64_t i = 0; i < rt->n_outputs; i++)
            at = put_output(w, at, &outs[i], rt->output_keys[i], &plans[i]);
        *at = '\0';
        *out = buffer;
        *out_size = (int64_t)total;
    }
    if (plans != plans_small)
        free(plans);
    return reason;
}

/* ---- the route --------------------------------------------------------------------------- */

typedef int64_t (*decode_fn)(const uint8_t* data, int64_t size, int64_t* values, int64_t values_cap,
                             int64_t* scratch, int64_t scratch_cap);

/* Parses `data` with `decode` into a fresh values buffer of *values_cap slots; the layout is
 * scratch's first *layout_size bytes. 0, or an RS_FALLBACK_* reason. */
static int parse(wire w, const uint8_t* data, int64_t size, int64_t** values, int64_t* values_cap,
                 int64_t** scratch, int64_t* layout_size) {
    decode_fn decode = w == WIRE_EAS ? rs_decode_request : rs_decode_tfs_request;
    *values_cap = size + 1; /* the parser's bound: a slot per byte (codec.h) */
    *values = malloc((size_t)*values_cap * sizeof(int64_t));
    int64_t cap = SCRATCH_START;
    *scratch = malloc((size_t)cap * sizeof(int64_t));
    if (!*values || !*scratch)
        return RS_FALLBACK_MEMORY;
    int64_t got;
    for (;;) {
        got = decode(data, size, *values, *values_cap, *scratch, cap);
        if (got == -RS_CODEC_SCRATCH_FULL && cap < SCRATCH_MAX) {
            cap *= 4;
            int64_t* bigger = realloc(*scratch, (size_t)cap * sizeof(int64_t));
            if (!bigger)
                return RS_FALLBACK_MEMORY;
            *scratch = bigger;
        } else if (got == -RS_CODEC_VALUES_FULL && w == WIRE_TFS && *values_cap == size + 1) {
            /* a TF Serving tensor whose last value repeats to fill it: codec.h's bound */
            *values_cap = 2 * (size + 1) + 2 * RS_CODEC_TFS_MAX_FILL;
            int64_t* bigger = realloc(*values, (size_t)*values_cap * sizeof(int64_t));
            if (!bigger)
                return RS_FALLBACK_MEMORY;
            *values = bigger;
        } else {
            break;
        }
    }
    if (got < 0)
        return RS_FALLBACK_PARSE;
    *layout_size = got;
    return 0;
}

/* Where the layout starts behind rs_decode_tfs_request's ModelSpec prefix (name, version
 * kind, the version or the label); -1 if the prefix is malformed (it never is). */
static int64_t tfs_layout_start(const uint8_t* layout, int64_t size) {
    const uint8_t *p = layout, *end = layout + size;
    uint64_t n, kind, v;
    if (!rs_varint_get(&p, end, &n) || n > (uint64_t)(end - p))
        return -1;
    p += n;
    if (!rs_varint_get(&p, end, &kind) || (kind == 1 && !rs_varint_get(&p, end, &v)))
        return -1;
    if (kind == 2 && (!rs_varint_get(&p, end, &n) || n > (uint64_t)(end - p)))
        return -1;
    if (kind == 2)
        p += n;
    return p - layout;
}

/* A route's graph inputs, in the order every run of it feeds them: the dense inputs, the
 * folded Concat input if any, the plan outputs fed as they are. */
static size_t route_inputs(const route* rt) {
    return (size_t)(rt->n_bound + rt->n_dense + (rt->fold_name ? 1 : 0));
}

/* A request's feeds: its string ids keyed in place, its lookups into a fresh arena, its dense
 * inputs converted where the wire kind is not the graph's, its Concat folded. inputs[] (of
 * route_inputs(rt)) then point into `values` and the buffers in owned[] (rt->n_dense + 2,
 * zeroed: converted inputs, the arena, the folded input; free them with release()), and the
 * folded input's shape into fold_shape[2]. 0, or an RS_FALLBACK_* reason. */
static int prepare(rs_servable* s, const route* rt, const uint8_t* data, int64_t* values, rs_tensor_in* inputs,
                   void** owned, int64_t* fold_shape) {
    for (int64_t i = 0; i < rt->n_strings; i++) {
        const string_input* in = &rt->strings[i];
        int64_t* spans = values + in->first;
        int64_t n_spans = (in->stop - in->first) / 2;
        if (in->key == KEY_INT_VOCABULARY)
            rs_int_vocabulary_keys(in->int_vocabulary, spans, in->stop - in->first, spans);
        else if (in->key == KEY_BUCKETS || in->key == KEY_BUCKETS_EMPTY) {
            s->bucket_spans(data, spans, n_spans, in->buckets, spans);
            if (in->key == KEY_BUCKETS_EMPTY) /* only '' is -1: a bucket is >= 0 */
                for (int64_t k = 0; k < n_spans; k++)
                    if (spans[k] == -1)
                        spans[k] = (int64_t)(RS_FINGERPRINT64_EMPTY % in->buckets);
        } else if (in->key == KEY_VOCABULARY)
            rs_vocabulary_spans(in->vocabulary, data, spans, n_spans, spans, s->bucket_spans);
        else
            s->xxh64_spans(data, spans, n_spans, spans);
    }
    float* arena = malloc((size_t)(rt->arena_floats ? rt->arena_floats : 1) * sizeof(float));
    owned[rt->n_dense] = arena;
    if (!arena)
        return RS_FALLBACK_MEMORY;
    if (rt->n_tasks && s->lookup_at(rt->tasks, rt->n_tasks, values, arena) != RS_OK)
        return RS_FALLBACK_LOOKUP;
    size_t n = 0;
    for (int64_t i = 0; i < rt->n_dense; i++) {
        const dense_input* d = &rt->dense[i];
        const void* at = in_place(d, values);
        if (!at) {
            void* converted = malloc((size_t)(d->count ? d->count : 1) * elem_size(d->elem_type));
            if (!converted)
                return RS_FALLBACK_MEMORY;
            convert(d->src, values + d->slot, d->count, d->elem_type, converted);
            owned[i] = converted;
            at = converted;
        }
        inputs[n++] = (rs_tensor_in){d->name, d->elem_type, d->shape, d->rank, at};
    }
    if (rt->fold_name) {
        int64_t cells = rt->batch * rt->fold_width;
        float* folded = malloc((size_t)(cells > 0 ? cells : 1) * sizeof(float));
        owned[rt->n_dense + 1] = folded;
        if (!folded)
            return RS_FALLBACK_MEMORY;
        fill_folded(rt, values, arena, folded);
        fold_shape[0] = rt->batch;
        fold_shape[1] = rt->fold_width;
        inputs[n++] = (rs_tensor_in){rt->fold_name, RS_ELEM_FLOAT, fold_shape, 2, folded};
    }
    for (int64_t i = 0; i < rt->n_bound; i++) { /* plan outputs fed as they are (none the Concat takes) */
        const bound_input* b = &rt->bound[i];
        inputs[n++] = (rs_tensor_in){b->name, RS_ELEM_FLOAT, b->shape, b->rank, arena + b->offset};
    }
    return 0;
}

/* Frees what prepare() allocated for a request of rt. */
static void release(const route* rt, void** owned) {
    if (owned)
        for (int64_t i = 0; i < rt->n_dense + 2; i++)
            free(owned[i]);
}

/* One dense run of rt's outputs over `inputs` (`merged`: a run of rs_route_process_many's,
 * on the servable's merged runner): 0 with outs[] (rt->n_outputs) filled (free them with
 * free_outputs()), or RS_FALLBACK_RUN with none allocated (Python reruns the request and
 * reports its own message). */
static int run_dense(rs_servable* s, bool merged, const route* rt, const rs_tensor_in* inputs, size_t n_inputs,
                     rs_tensor_out* outs) {
    char* err = NULL;
    memset(outs, 0, (size_t)rt->n_outputs * sizeof *outs);
    int status = merged ? s->run_merged(s->runner_merged, inputs, n_inputs, rt->output_names, (size_t)rt->n_outputs,
                                        outs, &err)
                        : s->run(s->runner, inputs, n_inputs, rt->output_names, (size_t)rt->n_outputs, outs, &err);
    free(err);
    return status ? RS_FALLBACK_RUN : 0;
}

static void free_outputs(const route* rt, rs_tensor_out* outs) {
    for (int64_t i = 0; i < rt->n_outputs; i++) {
        free(outs[i].data);
        outs[i].data = NULL;
    }
}

/* Runs a found route over a parsed request (`merged`: for rs_route_process_many, on its
 * runner); 0 with the response, or an RS_FALLBACK_* reason. times[1], times[2]:
 * CLOCK_MONOTONIC ns before and after the run. */
static int serve(wire w, rs_servable* s, bool merged, const route* rt, const uint8_t* data, int64_t* values,
                 uint8_t** out, int64_t* out_size, int64_t* times) {
    int reason = 0;
    size_t n_inputs = route_inputs(rt);
    rs_tensor_in inputs_small[64];
    rs_tensor_in* inputs = n_inputs <= 64 ? inputs_small : calloc(n_inputs, sizeof *inputs);
    rs_tensor_out outs_small[16];
    rs_tensor_out* outs = rt->n_outputs <= 16 ? outs_small : calloc((size_t)rt->n_outputs, sizeof *outs);
    void** owned = calloc((size_t)rt->n_dense + 2, sizeof(void*));
    int64_t fold_shape[2]; /* lives until the run returns */
    if (!inputs || !outs || !owned)
        reason = RS_FALLBACK_MEMORY;
    if (!reason)
        reason = prepare(s, rt, data, values, inputs, owned, fold_shape);
    times[1] = now_ns(CLOCK_MONOTONIC);
    if (!reason)
        reason = run_dense(s, merged, rt, inputs, n_inputs, outs);
    times[2] = now_ns(CLOCK_MONOTONIC);
    if (!reason) {
        reason = encode(w, rt, outs, out, out_size);
        free_outputs(rt, outs);
    }
    release(rt, owned);
    free(owned);
    if (inputs != inputs_small)
        free(inputs);
    if (outs != outs_small)
        free(outs);
    return reason;
}

/* Parses `data` and finds its route in s: 0 with *rt and the parser's buffers (the caller
 * frees *values and *scratch whatever this returns), or an RS_FALLBACK_* reason. */
static int find(wire w, rs_servable* s, const uint8_t* data, int64_t size, int64_t** values, int64_t** scratch,
                const route** rt) {
    int64_t layout_size = 0, values_cap = 0, start = 0;
    *rt = NULL;
    int reason = parse(w, data, size, values, &values_cap, scratch, &layout_size);
    if (!reason && w == WIRE_TFS && (start = tfs_layout_start((const uint8_t*)*scratch, layout_size)) < 0)
        reason = RS_FALLBACK_PARSE;
    if (reason)
        return reason;
    *rt = find_route(s, (const uint8_t*)*scratch + start, layout_size - start);
    if (*rt && (*rt)->refused)
        return RS_FALLBACK_NOT_NATIVE;
    if (!*rt || (*rt)->values_end > values_cap)
        return RS_FALLBACK_ROUTE_MISS;
    return 0;
}

/* A served request's info[] (route.h's RS_INFO_*) and counters; times: start, after decode,
 * before and after the run, after encode. Under the request's lease of `s`. Returns 200. */
static int served(rs_route_slot* slot, const rs_servable* s, int64_t batch, const int64_t* times,
                  int64_t* info) {
    if (info) {
        info[RS_INFO_SERVABLE] = s->id;
        info[RS_INFO_DELTA_STEP] = atomic_load_explicit(&s->delta_step, memory_order_relaxed);
        info[RS_INFO_BATCH] = batch;
        for (int i = 0; i < 5; i++)
            info[RS_INFO_T0 + i] = times[i];
        info[RS_INFO_REASON] = 0;
    }
    count(slot, RS_COUNT_SERVED, 1);
    count(slot, RS_COUNT_WALL_NS, times[4] - times[0]);
    return 200;
}

/* A request not served here: counted, its reason in info[]. Returns 0. */
static int declined(rs_route_slot* slot, int reason, int64_t* info) {
    count(slot, reason, 1);
    if (info)
        info[RS_INFO_REASON] = reason;
    return 0;
}

static int process(wire w, rs_route_slot* slot, const uint8_t* data, int64_t size, uint8_t** out,
                   int64_t* out_size, int64_t* info) {
    int64_t times[5] = {now_ns(CLOCK_MONOTONIC)};
    *out = NULL;
    *out_size = 0;
    if (size <= 0 || !data)
        return declined(slot, RS_FALLBACK_EMPTY, info);
    rs_servable* s = lease(slot);
    if (!s)
        return declined(slot, atomic_load(&slot->reason_if_null), info);
    int64_t *values = NULL, *scratch = NULL;
    const route* rt = NULL;
    int reason = find(w, s, data, size, &values, &scratch, &rt);
    times[1] = now_ns(CLOCK_MONOTONIC);
    if (!reason)
        reason = serve(w, s, false, rt, data, values, out, out_size, times + 1);
    if (!reason) {
        times[4] = now_ns(CLOCK_MONOTONIC);
        served(slot, s, rt->batch, times, info); /* the route is the servable's: read before the lease ends */
    }
    unlease(s);
    free(values);
    free(scratch);
    return reason ? declined(slot, reason, info) : 200;
}

int rs_route_process(rs_route_slot* slot, const uint8_t* data, int64_t size, uint8_t** out, int64_t* out_size,
                     int64_t* info) {
    return process(WIRE_EAS, slot, data, size, out, out_size, info);
}

int rs_route_process_tfs(rs_route_slot* slot, const uint8_t* data, int64_t size, uint8_t** out,
                         int64_t* out_size, int64_t* info) {
    return process(WIRE_TFS, slot, data, size, out, out_size, info);
}

#include "route_values.inc"
#include "route_merge.inc"
