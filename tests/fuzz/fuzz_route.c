/* libFuzzer target: the native request route (native/route.c) on mutated request bytes.
 *
 * Input: byte 0 seeds the route's choices; the rest is a PredictRequest. When the codec
 * accepts the request, the harness compiles a route for its layout the way
 * recserve.processor.native_route does (id inputs of rank 1-2 looked up in a table with a
 * combiner the seed picks, string ids keyed in place first (XXH64, hash buckets or the
 * servable's vocabulary, as the seed picks), integer ids keyed in place through one of the
 * servable's integer vocabularies or not keyed (as the seed picks), float and integer inputs fed as
 * dense inputs of a type the seed picks), registers it with a servable and serves the same
 * bytes through rs_route_process, with a dense runner written here (one float32 output per
 * input: the sum of its values; an int64 output of 1-48 values as the input's first and last bytes and the input count pick; a
 * bool one). The same
 * bytes go the TF Serving way too: when rs_decode_tfs_request takes them, the layout behind
 * its ModelSpec prefix gets a route the same way and rs_route_process_tfs serves them. Checks:
 *   - a request whose layout was registered is served (200) and its response is the same
 *     bytes when served again (the route consumes nothing it does not own);
 *   - a registered layout's response parses as a PredictResponse's framing: one entry per
 *     output, each (name, ArrayProto) in bounds; a TF Serving one's TensorProto holds its
 *     dtype, a tensor_shape and exactly the shape's count of values in the dtype's field;
 *   - a layout the harness cannot describe is refused (rs_servable_refuse_layout) and falls
 *     back as RS_FALLBACK_NOT_NATIVE;
 *   - a request of any other layout falls back (0) and allocates nothing;
 *   - the EAS request twice in one rs_route_process_many call (serve_many): served as alone;
 *   - every 64 inputs the servable is swapped for a new one (publish, drain, free).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "embedding.h"
#include "fuzz_input.h"
#include "route.h"

#define DIM 4
#define MAX_INTS 4096

static rs_table* tables[2];
static rs_route_slot* slot;
static rs_servable* current;
static int64_t current_vocabulary; /* its handle in `current` */
static int64_t current_int_vocabularies[2]; /* handles in `current`: a list, an empty one */
static int served_inputs;
static uint8_t run_seed; /* the choice byte mixed with the input's last: the runner's int64 output follows it */

/* ---- the dense runner: deterministic outputs from the inputs, no model ---------------- */

static double value_at(const rs_tensor_in* t, int64_t i) {
    switch (t->elem_type) {
    case RS_ELEM_FLOAT: return ((const float*)t->data)[i];
    case RS_ELEM_DOUBLE: return ((const double*)t->data)[i];
    case RS_ELEM_INT32: return ((const int32_t*)t->data)[i];
    case RS_ELEM_INT64: return (double)((const int64_t*)t->data)[i];
    default: return ((const uint8_t*)t->data)[i];
    }
}

static int run(void* runner, const rs_tensor_in* inputs, size_t n, const char* const* names, size_t n_out,
               rs_tensor_out* outs, char** err) {
    (void)runner;
    (void)names;
    for (size_t o = 0; o < n_out; o++) {
        rs_tensor_out* out = &outs[o];
        if (o % 3 == 0) {
            out->elem_type = RS_ELEM_FLOAT;
            out->rank = 1;
            out->shape[0] = (int64_t)n;
            out->bytes = n * sizeof(float);
            float* sums = malloc(n ? out->bytes : 1);
            for (size_t i = 0; i < n; i++) {
                int64_t elements = 1;
                for (size_t d = 0; d < inputs[i].rank; d++)
                    elements *= inputs[i].shape[d];
                double sum = 0;
                for (int64_t k = 0; k < elements; k++)
                    sum += value_at(&inputs[i], k);
                sums[i] = (float)sum;
            }
            out->data = sums;
        } else if (o % 3 == 1) {
            /* 1-48 int64s of every varint width, as the input's bytes and count pick: entries of every
             * size around 127 bytes, where a length's varint grows a byte (finding 14). */
            int64_t count = 1 + (run_seed + 5 * (int64_t)n) % 48;
            out->elem_type = RS_ELEM_INT64;
            out->rank = 1;
            out->shape[0] = count;
            out->bytes = (size_t)count * 8;
            out->data = malloc(out->bytes);
            for (int64_t i = 0; i < count; i++)
                ((int64_t*)out->data)[i] = (int64_t)(0x9E3779B97F4A7C15ULL >> ((i * 7 + run_seed + (int64_t)n) % 64)) - (int64_t)n;
        } else {
            out->elem_type = RS_ELEM_BOOL;
            out->rank = 2;
            out->shape[0] = 1;
            out->shape[1] = 2;
            out->bytes = 2;
            out->data = malloc(2);
            ((uint8_t*)out->data)[0] = 1;
            ((uint8_t*)out->data)[1] = 0;
        }
    }
    *err = NULL;
    return 0;
}

static void setup(void) {
    int64_t keys[8] = {0, 1, 2, 3, 100, -5, 1LL << 40, 7};
    for (int t = 0; t < 2; t++) {
        float* rows = malloc(8 * DIM * sizeof(float));
        for (int i = 0; i < 8 * DIM; i++)
            rows[i] = (float)(i * (t + 1)) / 8.0f;
        int64_t bad = 0;
        CHECK(rs_table_create(DIM, t ? RS_DEFAULT_NORMAL : RS_DEFAULT_ZEROS, 0.5, 11, keys, rows, 8, &tables[t], &bad) == RS_OK);
    }
    slot = rs_slot_create();
    CHECK(slot);
}

/* A vocabulary per servable (freed with it): short words, one listed twice, '' (padding
 * whatever it is given), bytes that are not UTF-8 -- keys 0..7, some of them table keys. */
static int64_t add_vocabulary(rs_servable* s) {
    static const uint8_t words[] = "abc" "\xe5\x8c\x97" "\xff\xfe" "abc" "zz";
    static const int64_t lengths[] = {1, 2, 3, 2, 0, 1, 2}, indices[] = {0, 1, 2, 3, 4, 7, 100};
    int64_t handle = rs_servable_add_vocabulary(s, words, lengths, indices, 7, -1, 0, 0, 1);
    CHECK(handle != 0);
    return handle;
}

/* Two integer vocabularies per servable: ids listed out of order, one twice (its last key
 * wins), -1 listed (padding whatever the list says), int64's extremes -- keys 0..100, some
 * of them table keys; and an empty list keying every id 3 (-1 too: no padding). */
static void add_int_vocabularies(rs_servable* s, int64_t* handles) {
    static const int64_t ids[] = {5, -1, INT64_MIN, 1LL << 40, 5, INT64_MAX, 0, -7};
    static const int64_t keys[] = {0, 1, 2, 3, 100, 7, 4, 5};
    handles[0] = rs_servable_add_int_vocabulary(s, ids, keys, 8, -1, 1);
    handles[1] = rs_servable_add_int_vocabulary(s, NULL, NULL, 0, 3, 0);
    CHECK(handles[0] != 0 && handles[1] != 0);
}

static rs_servable* fresh(void) {
    rs_servable* s = rs_servable_create(++served_inputs, run, NULL, rs_lookup_at, rs_xxh64_spans, rs_bucket_spans);
    CHECK(s);
    return s;
}

/* ---- the route of a layout, compiled as native_route.describe does -------------------- */

typedef struct {
    int64_t ints[MAX_INTS];
    int64_t n;
    char names[4096];
    int64_t names_size;
} description;

static void put(description* d, int64_t v) {
    CHECK(d->n < MAX_INTS);
    d->ints[d->n++] = v;
}

static int64_t name(description* d, const uint8_t* text, uint64_t size) {
    CHECK(d->names_size + (int64_t)size + 1 <= (int64_t)sizeof d->names);
    int64_t at = d->names_size;
    memcpy(d->names + at, text, size);
    d->names[at + (int64_t)size] = '\0';
    d->names_size += (int64_t)size + 1;
    return at;
}

/* Returns 0 and the description, or -1 when the layout has a part no route takes. */
static int describe(const uint8_t* layout, int64_t size, uint8_t seed, description* d) {
    const uint8_t *p = layout, *end = layout + size;
    uint64_t n = varint(&p, end); /* signature_name */
    p += n;
    uint64_t filters = varint(&p, end);
    for (uint64_t i = 0; i < filters; i++)
        p += varint(&p, end);
    uint64_t count = varint(&p, end);
    if (count > 16)
        return -1;
    /* Pass 1 collects, pass 2 writes the sections in the description's order. */
    struct {
        const uint8_t* key;
        uint64_t key_size, out, ndims, slot, values;
        int64_t dims[RS_CODEC_MAX_DIMS];
        int bound;
    } in[16];
    for (uint64_t i = 0; i < count; i++) {
        in[i].key_size = varint(&p, end);
        in[i].key = p;
        p += in[i].key_size;
        in[i].out = varint(&p, end);
        in[i].ndims = varint(&p, end);
        for (uint64_t k = 0; k < in[i].ndims; k++)
            in[i].dims[k] = (int64_t)varint(&p, end);
        in[i].slot = varint(&p, end);
        in[i].values = varint(&p, end);
        int integer = in[i].out <= RS_CODEC_OUT_BOOL, string = in[i].out == RS_CODEC_OUT_STRING;
        in[i].bound = (string || (integer && (seed >> (i % 8)) & 1)) && (in[i].ndims == 1 || in[i].ndims == 2);
        if (!in[i].bound && !integer && in[i].out != RS_CODEC_OUT_FLOAT32 && in[i].out != RS_CODEC_OUT_FLOAT64)
            return -1; /* half, complex, strings not bound: Python's */
        if (in[i].ndims > RS_DENSE_MAX_RANK)
            return -1;
    }
    CHECK(p == end);
    put(d, 2); /* the description's format (ROUTE_FORMAT) */
    put(d, count && in[0].ndims ? in[0].dims[0] : 1);
    int64_t strings = 0;
    int int_keyed[16];
    for (uint64_t i = 0; i < count; i++) {
        int_keyed[i] = in[i].bound && in[i].out != RS_CODEC_OUT_STRING && (seed >> ((i + 3) % 8)) & 1;
        strings += (in[i].out == RS_CODEC_OUT_STRING && in[i].bound) || int_keyed[i];
    }
    put(d, strings);
    for (uint64_t i = 0; i < count; i++)
        if (in[i].out == RS_CODEC_OUT_STRING && in[i].bound) {
            put(d, (int64_t)in[i].slot);
            put(d, (int64_t)(in[i].slot + 2 * in[i].values));
            int key = (seed + (int)i) % 3; /* KEY_XXH64, KEY_BUCKETS, KEY_VOCABULARY in route.c */
            put(d, key);
            put(d, key == 0 ? 0 : key == 1 ? 1 + seed * 37 : current_vocabulary);
        } else if (int_keyed[i]) { /* its ids, one slot each */
            put(d, (int64_t)in[i].slot);
            put(d, (int64_t)(in[i].slot + in[i].values));
            put(d, 4); /* KEY_INT_VOCABULARY */
            put(d, current_int_vocabularies[(seed + i) % 2]);
        }
    int64_t tasks = 0, arena = 0;
    for (uint64_t i = 0; i < count; i++)
        tasks += in[i].bound;
    put(d, tasks);
    int64_t offsets[16], rows_out[16];
    for (uint64_t i = 0; i < count; i++) {
        if (!in[i].bound)
            continue;
        int64_t rows = in[i].dims[0], width = in[i].ndims == 2 ? in[i].dims[1] : 1;
        int64_t combiner = in[i].ndims == 2 ? (seed + (int)i) % 4 : RS_COMBINER_NONE;
        put(d, (int64_t)(intptr_t)tables[i % 2]);
        put(d, (int64_t)in[i].slot * 8);
        put(d, arena * 4);
        put(d, rows);
        put(d, width);
        put(d, combiner);
        offsets[i] = arena;
        rows_out[i] = combiner == RS_COMBINER_NONE ? rows * width : rows;
        arena += rows_out[i] * DIM;
    }
    put(d, arena);
    put(d, tasks);
    for (uint64_t i = 0; i < count; i++)
        if (in[i].bound) {
            put(d, name(d, in[i].key, in[i].key_size));
            put(d, offsets[i]);
            put(d, 2);
            put(d, rows_out[i]);
            put(d, DIM);
        }
    static const int32_t types[] = {RS_ELEM_FLOAT, RS_ELEM_DOUBLE, RS_ELEM_INT32, RS_ELEM_INT64, RS_ELEM_BOOL};
    put(d, (int64_t)count - tasks);
    for (uint64_t i = 0; i < count; i++)
        if (!in[i].bound) {
            put(d, name(d, in[i].key, in[i].key_size));
            put(d, in[i].out == RS_CODEC_OUT_FLOAT32 ? 1 : in[i].out == RS_CODEC_OUT_FLOAT64 ? 2 : 0);
            put(d, (int64_t)in[i].slot);
            put(d, (int64_t)in[i].values);
            put(d, types[(seed + i) % 5]);
            put(d, (int64_t)in[i].ndims);
            for (uint64_t k = 0; k < in[i].ndims; k++)
                put(d, in[i].dims[k]);
        }
    put(d, 0); /* no folded Concat */
    int64_t outputs = 1 + seed % 3;
    put(d, outputs);
    static const uint8_t out_names[][4] = {"out", "n", "ok"};
    for (int64_t o = 0; o < outputs; o++) {
        put(d, name(d, out_names[o], strlen((const char*)out_names[o])));
        put(d, name(d, out_names[o], strlen((const char*)out_names[o])));
    }
    return 0;
}

/* A TensorProto as rs_route_process_tfs writes it: dtype, tensor_shape (a Dim message per
 * dimension), then -- unless the shape holds no element -- the dtype's value field with
 * exactly the shape's count of values. */
static void check_tensor(const uint8_t* p, const uint8_t* end) {
    CHECK(p < end && *p++ == 0x08);
    uint64_t dtype = varint(&p, end);
    static const uint8_t fields[] = {[1] = 0x2A, [2] = 0x32, [3] = 0x3A, [9] = 0x52, [10] = 0x5A};
    CHECK(dtype < sizeof fields && fields[dtype]);
    CHECK(p < end && *p++ == 0x12);
    uint64_t shape = varint(&p, end);
    CHECK(shape <= (uint64_t)(end - p));
    const uint8_t* shape_end = p + shape;
    uint64_t elements = 1;
    while (p < shape_end) {
        CHECK(*p++ == 0x12);
        uint64_t dim = varint(&p, shape_end);
        CHECK(dim <= (uint64_t)(shape_end - p));
        uint64_t size = 0;
        if (dim) {
            const uint8_t* dim_end = p + dim;
            CHECK(*p++ == 0x08);
            size = varint(&p, dim_end);
            CHECK(size > 0 && p == dim_end); /* a 0 is left out, as proto3 does */
        }
        elements *= size;
    }
    if (!elements) {
        CHECK(p == end);
        return;
    }
    CHECK(p < end && *p++ == fields[dtype]);
    uint64_t payload = varint(&p, end);
    CHECK(payload == (uint64_t)(end - p));
    if (dtype == 1 || dtype == 2) {
        CHECK(payload == elements * (dtype == 1 ? 4 : 8));
        return;
    }
    uint64_t count = 0;
    while (p < end) {
        uint64_t v = varint(&p, end);
        CHECK(dtype != 10 || v <= 1);
        count++;
    }
    CHECK(count == elements);
}

/* The response's framing: entries of (field 1: name, field 2: ArrayProto or, for TF
 * Serving, a TensorProto checked whole), all in bounds. */
static int entries(const uint8_t* p, int64_t size, int tfs) {
    const uint8_t* end = p + size;
    int n = 0;
    while (p < end) {
        CHECK(*p++ == 0x0A);
        uint64_t body = varint(&p, end);
        CHECK(body <= (uint64_t)(end - p));
        const uint8_t* stop = p + body;
        CHECK(*p++ == 0x0A);
        p += varint(&p, stop);
        CHECK(p < stop && *p++ == 0x12);
        uint64_t array = varint(&p, stop);
        CHECK(array == (uint64_t)(stop - p));
        if (tfs)
            check_tensor(p, stop);
        p = stop;
        n++;
    }
    return n;
}

/* Where the layout starts behind rs_decode_tfs_request's ModelSpec prefix (codec.h). */
static int64_t tfs_prefix(const uint8_t* layout, int64_t size) {
    const uint8_t *p = layout, *end = layout + size;
    p += varint(&p, end); /* model_spec.name */
    uint64_t kind = varint(&p, end);
    CHECK(kind <= 2);
    if (kind == 1)
        varint(&p, end);
    else if (kind == 2)
        p += varint(&p, end);
    CHECK(p <= end);
    return p - layout;
}

/* The request twice and an empty one through rs_route_process_many (request merging): each
 * copy served exactly when the request alone is, framed as a PredictResponse, and byte for
 * byte the answer alone when it ran alone (this runner is not row-independent: a merged
 * answer is a view of rows it did not compute per request); the empty one declined. */
static void serve_many(const uint8_t* request, int64_t n, int status, const uint8_t* out, int64_t out_size) {
    const uint8_t* datas[3] = {request, request, NULL};
    int64_t sizes[3] = {n, n, 0};
    uint8_t* outs[3];
    int64_t out_sizes[3], infos[3 * RS_INFO_SIZE];
    int32_t statuses[3];
    int64_t max_rows = 1 + run_seed % 64;
    int64_t served = rs_route_process_many(slot, datas, sizes, 3, max_rows, outs, out_sizes, statuses, infos);
    CHECK(served == (status == 200 ? 2 : 0));
    CHECK(statuses[2] == 0 && !outs[2] && infos[2 * RS_INFO_SIZE + RS_INFO_REASON] == RS_FALLBACK_EMPTY);
    for (int k = 0; k < 2; k++) {
        CHECK(statuses[k] == status);
        if (status == 200) {
            int64_t merged = infos[k * RS_INFO_SIZE + RS_INFO_MERGED];
            CHECK(outs[k] && entries(outs[k], out_sizes[k], 0) >= 1 && (merged == 1 || merged == 2));
            if (merged == 1)
                CHECK(out_sizes[k] == out_size && memcmp(outs[k], out, (size_t)out_size) == 0);
        } else {
            CHECK(!outs[k] && out_sizes[k] == 0);
        }
        free(outs[k]);
    }
}

typedef int64_t (*decode_fn)(const uint8_t*, int64_t, int64_t*, int64_t, int64_t*, int64_t);
typedef int (*process_fn)(rs_route_slot*, const uint8_t*, int64_t, uint8_t**, int64_t*, int64_t*);

/* The request through one protocol's decoder and route entry (the checks above). */
static void serve(const uint8_t* request, int64_t n, uint8_t seed, int tfs) {
    decode_fn decode = tfs ? rs_decode_tfs_request : rs_decode_request;
    process_fn process = tfs ? rs_route_process_tfs : rs_route_process;
    int64_t values_cap = n + 1;
    int64_t* values = malloc((size_t)values_cap * sizeof(int64_t));
    int64_t* scratch = malloc((size_t)(32 * n + 64) * sizeof(int64_t));
    int64_t layout = decode(request, n, values, values_cap, scratch, 32 * n + 64);
    if (layout == -RS_CODEC_VALUES_FULL) { /* a TF Serving tensor repeating values to fill: codec.h's bound */
        values_cap = 2 * (n + 1) + 2 * RS_CODEC_TFS_MAX_FILL;
        values = realloc(values, (size_t)values_cap * sizeof(int64_t));
        layout = decode(request, n, values, values_cap, scratch, 32 * n + 64);
    }
    uint8_t* out = NULL;
    int64_t out_size = -1, info[RS_INFO_SIZE];
    int registered = 0, refused = 0;
    if (layout > 0) {
        int64_t start = tfs ? tfs_prefix((const uint8_t*)scratch, layout) : 0;
        const uint8_t* key = (const uint8_t*)scratch + start;
        int64_t key_size = layout - start;
        static description d;
        memset(&d, 0, sizeof d);
        if (describe(key, key_size, seed, &d) != 0) {
            int added = rs_servable_refuse_layout(current, key, key_size);
            CHECK(added >= 0);
            refused = added == 0; /* (1: a route or a refusal of this layout was there first, or the table is full) */
        } else {
            int added = rs_servable_add_route(current, key, key_size, d.ints, d.n, d.names, d.names_size);
            CHECK(added >= 0);
            registered = added == 0 || added == 1;
            if (added == 1 && rs_servable_routes(current) >= 1024)
                registered = 0; /* the table is full: it may not hold this layout */
        }
    }
    int status = process(slot, request, n, &out, &out_size, info);
    if (registered)
        CHECK(status == 200); /* this layout's route (or an earlier one for the same layout) serves it */
    if (refused)
        CHECK(status == 0 && info[RS_INFO_REASON] == RS_FALLBACK_NOT_NATIVE);
    if (status == 200) {
        CHECK(out && out_size >= 0);
        CHECK(entries(out, out_size, tfs) >= 1);
        uint8_t* again = NULL;
        int64_t again_size = -1;
        CHECK(process(slot, request, n, &again, &again_size, NULL) == 200);
        CHECK(again_size == out_size && memcmp(again, out, (size_t)out_size) == 0);
        free(again);
    } else {
        CHECK(status == 0 && out == NULL && out_size == 0);
        CHECK(info[RS_INFO_REASON] >= 0 && info[RS_INFO_REASON] < RS_FALLBACK_REASONS);
        if (layout < 0)
            CHECK(info[RS_INFO_REASON] == RS_FALLBACK_PARSE);
    }
    if (!tfs)
        serve_many(request, n, status, out, out_size);
    free(out);
    free(values);
    free(scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (!slot)
        setup();
    if (size < 2 || size > 1 << 16)
        return 0;
    uint8_t seed = data[0];
    run_seed = (uint8_t)(seed ^ (data[size - 1] * 31));
    int64_t n = (int64_t)size - 1;
    uint8_t* request = malloc((size_t)n); /* exactly its size: ASan sees a read past the end */
    memcpy(request, data + 1, (size_t)n);
    if (!current || served_inputs % 64 == 0) {
        rs_servable* next = fresh();
        current_vocabulary = add_vocabulary(next);
        add_int_vocabularies(next, current_int_vocabularies);
        rs_slot_publish(slot, next, RS_FALLBACK_NO_SERVABLE);
        if (current) {
            CHECK(rs_servable_drain(current, 1000) == 0);
            rs_servable_free(current);
        }
        current = next;
    }
    served_inputs++;

    serve(request, n, seed, 0);
    serve(request, n, seed, 1);
    free(request);
    return 0;
}
