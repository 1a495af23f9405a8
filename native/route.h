/* recserve's native request route (DESIGN §10): PredictRequest bytes -> PredictResponse
 * bytes in C, with no Python object and no GIL, for requests whose layout Python has
 * already validated and compiled (recserve/processor/native_route.py).
 *
 * Objects and ownership.
 *   rs_route_slot  - one per Processor: the servable answering new requests (published by
 *                    atomic pointer swap) and the counters. Owned by Python.
 *   rs_servable    - one per model version: its compiled routes (a fixed hash table of
 *                    immutable routes, each published once by an atomic store), the lookup
 *                    and dense-run functions, and an atomic count of leases. Created and
 *                    freed by Python (the version's owner); a request only leases it.
 * Leases. A request enters the slot (an in-flight counter), loads the current servable and
 * adds a lease, then leaves the slot: rs_slot_publish swaps the pointer and waits until no
 * request is between those two steps (a few instructions) before dropping the slot's own
 * lease, so a lease is never added to a servable already handed back. The owner frees the
 * servable only after rs_servable_drain saw its last lease end.
 * Thread-safety: rs_route_process from any number of threads; publish/add_route/drain/free
 * from the control plane (Python), add_route concurrently with requests.
 */
#ifndef RECSERVE_ROUTE_H
#define RECSERVE_ROUTE_H

#include <stdint.h>

#include "dense_run.h"
#include "embedding.h"

#define RS_ROUTE_API __attribute__((visibility("default")))

/* Why a request left the native route for Python (counters, in this order). */
enum {
    RS_FALLBACK_NO_SERVABLE = 0,  /* nothing published: no version yet, or the version is not native */
    RS_FALLBACK_PARSE,            /* the C parser declined the bytes (the generated parser decides) */
    RS_FALLBACK_ROUTE_MISS,       /* the layout has no native route yet: its first request
                                     (Python validates it and registers its route) */
    RS_FALLBACK_LOOKUP,           /* the engine lookup failed */
    RS_FALLBACK_RUN,              /* the dense run failed (Python reruns it and owns the message) */
    RS_FALLBACK_OUTPUT,           /* an output the native encoder does not write */
    RS_FALLBACK_MEMORY,           /* malloc failed */
    RS_FALLBACK_EMPTY,            /* input_size 0: the signature description (Python) */
    RS_FALLBACK_TRACE,            /* the caller asked for an ONNX Runtime profile (Python-only) */
    RS_FALLBACK_NOT_NATIVE,       /* a layout Python found has no native form (rs_servable_refuse_layout:
                                     a dense input of float16, complex or strings; a Concat the
                                     route cannot fold; a vocabulary not built for want of
                                     memory -- native_route.describe lists them) */
    RS_FALLBACK_REASONS
};
/* Counters (rs_slot_counters): the fallbacks above, then these. */
enum {
    RS_COUNT_SERVED = RS_FALLBACK_REASONS, /* requests answered natively */
    RS_COUNT_WALL_NS,                      /* their wall time (CPU time: the callers measure it,
                                              e.g. recserve_request_cpu_seconds_total) */
    RS_COUNTERS
};
/* rs_route_process's info[] (may be NULL): filled when it returns 200. */
enum {
    RS_INFO_SERVABLE = 0, /* the id rs_servable_create was given */
    RS_INFO_BATCH,        /* the route's batch size */
    RS_INFO_T0,           /* CLOCK_MONOTONIC ns: start, after decode, after lookup, after run, after encode */
    RS_INFO_REASON = RS_INFO_T0 + 5, /* RS_FALLBACK_* when it returns 0 */
    RS_INFO_MERGED,       /* rs_route_process_many only: requests in its dense run (1: it ran alone) */
    RS_INFO_STARTS,       /* rs_route_process_many only: when its lookup, run and encode began (3
                             times; a merged request's spans are not back to back: its run waits
                             for its neighbours' lookups, its encode for theirs) */
    RS_INFO_DELTA_STEP = RS_INFO_STARTS + 3, /* the servable's delta step then (rs_servable_set_delta_step) */
    RS_INFO_SIZE
};

typedef struct rs_route_slot rs_route_slot;
typedef struct rs_servable rs_servable;

typedef int (*rs_lookup_at_fn)(const rs_lookup_task* tasks, int64_t n_tasks, const int64_t* ids_base,
                               float* out_base);
typedef void (*rs_xxh64_spans_fn)(const uint8_t* data, const int64_t* spans, int64_t n, int64_t* out);
typedef void (*rs_bucket_spans_fn)(const uint8_t* data, const int64_t* spans, int64_t n, uint64_t buckets,
                                   int64_t* out);

RS_ROUTE_API rs_route_slot* rs_slot_create(void);
/* Only after rs_slot_publish(slot, NULL, ...): no request can be inside it then. */
RS_ROUTE_API void rs_slot_free(rs_route_slot* slot);
/* Requests from now on lease `s` (NULL: none; they fall back counted as `reason_if_null`).
 * Takes a lease on s for the slot and drops the slot's lease on the previous servable. */
RS_ROUTE_API void rs_slot_publish(rs_route_slot* slot, rs_servable* s, int32_t reason_if_null);
RS_ROUTE_API void rs_slot_count(rs_route_slot* slot, int32_t reason);
/* Copies up to cap counters (RS_COUNTERS) into out; returns RS_COUNTERS. */
RS_ROUTE_API int64_t rs_slot_counters(rs_route_slot* slot, int64_t* out, int64_t cap);

/* A version with no routes yet; run(runner, ...) runs its dense graph; string ids are keyed by
 * the engine's xxh64_spans / bucket_spans (rs_xxh64_spans, rs_bucket_spans) or a vocabulary
 * of the servable's, integer ids by an integer vocabulary of the servable's (or not keyed:
 * the ids are the keys). One lease: the owner's. */
RS_ROUTE_API rs_servable* rs_servable_create(int64_t id, rs_dense_run_fn run, void* runner,
                                             rs_lookup_at_fn lookup_at, rs_xxh64_spans_fn xxh64_spans,
                                             rs_bucket_spans_fn bucket_spans);
/* The dense run rs_route_process_many's runs take (they are merges of requests already, so
 * they skip a dynamic batcher behind `run`, as SessionGroup.run(merged=True) does); until
 * this is called they take rs_servable_create's. Before the servable is published. */
RS_ROUTE_API void rs_servable_set_merged_run(rs_servable* s, rs_dense_run_fn run, void* runner);
/* The delta step (incremental update) the servable's tables are at, which each request it
 * serves reports (info[RS_INFO_DELTA_STEP]); set by its owner as updates apply. */
RS_ROUTE_API void rs_servable_set_delta_step(rs_servable* s, int64_t delta_step);
/* Builds a vocabulary (route_vocabulary.h: n words back to back in `words`, word i of
 * lengths[i] bytes keyed indices[i]; a string that is no word gets default_id, or oov_start +
 * Fingerprint64 % oov_buckets when oov_buckets > 0; '' is padding when empty_is_padding, else
 * a string like any other) that the servable owns and frees with itself. Returns its
 * handle, which route descriptions name, or 0 when out of memory / malformed. Callers
 * serialise it with rs_servable_add_route's that name it (the handle must exist first);
 * requests never read the list. */
RS_ROUTE_API int64_t rs_servable_add_vocabulary(rs_servable* s, const uint8_t* words, const int64_t* lengths,
                                                const int64_t* indices, int64_t n, int64_t default_id,
                                                int64_t oov_buckets, int64_t oov_start, int32_t empty_is_padding);
/* Builds an integer vocabulary (route_int_vocabulary.h: id ids[i] keyed keys[i] (>= 0), the
 * last of an id given twice; any other id default_id; -1 padding when `padding`, else an id
 * like any other) that the servable owns and frees with itself. Returns its handle, which
 * route descriptions name (as for rs_servable_add_vocabulary), or 0 when out of memory /
 * malformed. */
RS_ROUTE_API int64_t rs_servable_add_int_vocabulary(rs_servable* s, const int64_t* ids, const int64_t* keys,
                                                    int64_t n, int64_t default_id, int32_t padding);
/* Compiles a route from its description (native_route.py writes it: ints[n_ints] and a blob of
 * NUL-terminated names) for requests whose layout bytes equal key[key_size]. 0, or -1 when the
 * description is malformed, 1 when the table is full or the key is already there. */
RS_ROUTE_API int rs_servable_add_route(rs_servable* s, const uint8_t* key, int64_t key_size,
                                       const int64_t* ints, int64_t n_ints, const char* names,
                                       int64_t names_size);
/* Marks the layout key[key_size] as one with no native form: its requests fall back as
 * RS_FALLBACK_NOT_NATIVE (not ROUTE_MISS) from now on. Returns as rs_servable_add_route. */
RS_ROUTE_API int rs_servable_refuse_layout(rs_servable* s, const uint8_t* key, int64_t key_size);
/* Layouts registered (routes and refused layouts). */
RS_ROUTE_API int64_t rs_servable_routes(rs_servable* s);
/* Waits up to timeout_ms for every lease but the owner's to end: 0 once they have, 1 on timeout. */
RS_ROUTE_API int rs_servable_drain(rs_servable* s, int64_t timeout_ms);
RS_ROUTE_API int64_t rs_servable_leases(rs_servable* s);
/* Frees it; only after rs_servable_drain returned 0 and with no slot publishing it. */
RS_ROUTE_API void rs_servable_free(rs_servable* s);

/* One request. Returns 200 with *out (malloc'd, '\0'-terminated past *out_size) the
 * PredictResponse bytes, or 0: not served here (nothing allocated, info[RS_INFO_REASON] says
 * why) -- the caller takes the Python path. Never returns an error of its own. */
RS_ROUTE_API int rs_route_process(rs_route_slot* slot, const uint8_t* data, int64_t size, uint8_t** out,
                                  int64_t* out_size, int64_t* info);

/* The same for TF Serving: tensorflow.serving.PredictRequest bytes (rs_decode_tfs_request's
 * requests) -> the tensorflow.serving.PredictResponse's outputs (TensorProto, as
 * recserve.wire.tfserving_codec writes them), served by the same routes (a request's layout
 * behind its ModelSpec prefix is the EAS one). The ModelSpec is not read here: the caller
 * checks the request's model, version and label against the servable that answered
 * (info[RS_INFO_SERVABLE]) and appends the response's model_spec (field 2). */
RS_ROUTE_API int rs_route_process_tfs(rs_route_slot* slot, const uint8_t* data, int64_t size, uint8_t** out,
                                      int64_t* out_size, int64_t* info);

/* rs_route_process for a request already decoded (route_values.inc): `layout` and `values`
 * exactly as rs_decode_request leaves them for some request (codec.h), string spans being
 * offsets into `data`. Never writes `values`. Returns as rs_route_process. */
RS_ROUTE_API int rs_route_process_values(rs_route_slot* slot, const uint8_t* layout, int64_t layout_size,
                                         const int64_t* values, int64_t n_values, const uint8_t* data,
                                         uint8_t** out, int64_t* out_size, int64_t* info);

/* Request merging (route_merge.inc): n EAS PredictRequests (datas[i], sizes[i]) answered on
 * one lease, those whose routes agree in everything but the batch dimension (the same graph
 * outputs; the same graph inputs in order, with their element types and shapes but dim 0, and
 * dim 0 the route's batch in every one) concatenated along axis 0 into dense runs of at most
 * max_rows rows, in arrival order; a request of max_rows rows or more runs alone. When a
 * merged run fails, or an output's dim 0 is not the run's rows (a graph that is not
 * row-independent), each request of it runs alone: every answer is byte for byte
 * rs_route_process's for that request alone. Per request: statuses[i] 200 with outs[i]
 * (malloc'd, '\0'-terminated past out_sizes[i]) the response, or 0, not served (nothing
 * allocated; infos[i * RS_INFO_SIZE + RS_INFO_REASON] says why); infos (n x RS_INFO_SIZE,
 * may be NULL) as rs_route_process's, with RS_INFO_MERGED and RS_INFO_STARTS. Returns the
 * number served. */
RS_ROUTE_API int64_t rs_route_process_many(rs_route_slot* slot, const uint8_t* const* datas, const int64_t* sizes,
                                           int64_t n, int64_t max_rows, uint8_t** outs, int64_t* out_sizes,
                                           int32_t* statuses, int64_t* infos);

#endif
