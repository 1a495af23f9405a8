/* recserve's dense run through ONNX Runtime's C API: a *runner* is the session group of one
 * dense graph (DeepRec's SessionGroup) whose runs never touch the Python GIL.
 *
 * ONNX Runtime is the wheel's own libonnxruntime.so, dlopen'ed RTLD_LOCAL by path (a copy
 * separate from the Python binding's static one): recserve links nothing at build time. One
 * OrtEnv per process, created by the first rs_ort_env call; the global thread pools exist
 * only if that call asks for them.
 *
 * A runner owns N sessions of one model built from per-session specs (threads, config
 * entries, providers) that recserve.runtime.session_options computes in Python, and
 * OrtValues over the caller's initializer buffers that every session is given with
 * AddInitializer, so N sessions hold one copy of the weights. The caller keeps those
 * buffers alive until rs_ort_runner_free.
 *
 * Thread-safety: rs_ort_dense_run and rs_ort_run_session may be called from any number of
 * threads at once. rs_ort_runner_add_session only before the first run; rs_ort_runner_free
 * once, after the last run has returned.
 */
#ifndef RECSERVE_ORT_RUNNER_H
#define RECSERVE_ORT_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "dense_run.h"

#define RS_ORT_EXPORT __attribute__((visibility("default")))

/* select_session_policy (recserve.runtime.session_policy has the meaning of each). */
enum { RS_ORT_POLICY_MOD = 0, RS_ORT_POLICY_RR = 1, RS_ORT_POLICY_LEAST_BUSY = 2 };

typedef struct {
    const char *name;
    int32_t elem_type;      /* TensorProto.DataType */
    const int64_t *shape;
    size_t rank;
    const void *data;       /* caller-owned, contiguous; must outlive the runner */
    size_t bytes;
} rs_ort_initializer;

typedef struct {
    int intra_op_threads;        /* 0 = ONNX Runtime's default */
    int inter_op_threads;
    int parallel_execution;      /* ORT_PARALLEL instead of ORT_SEQUENTIAL */
    int per_session_threads;     /* 0: the env's global pools (DisablePerSessionThreads) */
    int log_severity;            /* OrtLoggingLevel */
    int graph_optimization_level;/* -1: ONNX Runtime's default (all) */
    size_t n_config;             /* AddSessionConfigEntry pairs */
    const char *const *config_keys;
    const char *const *config_values;
    size_t n_providers;          /* in priority order; CPU is implicit and always last */
    const char *const *provider_names;   /* CPUExecutionProvider, CUDAExecutionProvider, TensorrtExecutionProvider */
    const size_t *provider_option_counts;/* options of provider i follow those of i-1 in keys/values */
    const char *const *provider_keys;
    const char *const *provider_values;
    const int *cpus;             /* the seam pins its calling thread to these; NULL/0: no pinning */
    size_t n_cpus;
} rs_ort_session_spec;

/* Loads ONNX Runtime from `library_path` and creates the process's OrtEnv, once; later
 * calls check they agree (global pools or not). Returns 0, or 500 with *err set. */
RS_ORT_EXPORT int rs_ort_env(const char *library_path, int global_pools, int intra, int inter, int spinning,
                             char **err);
/* ONNX Runtime's version string ("1.32.0"); NULL before rs_ort_env. */
RS_ORT_EXPORT const char *rs_ort_version(void);
/* The OrtApi version this file declares and requests. */
RS_ORT_EXPORT unsigned rs_ort_api_version(void);
/* Names of the providers this ONNX Runtime build has, comma-separated into buf; 0 or 500. */
RS_ORT_EXPORT int rs_ort_available_providers(char *buf, size_t cap, char **err);

RS_ORT_EXPORT void *rs_ort_runner_new(int policy, const rs_ort_initializer *initializers, size_t n_initializers,
                                      char **err);
/* Adds a session of `model` (a path when model_len is 0, else serialized ModelProto bytes,
 * read during the call only). A provider ONNX Runtime refuses is left out and its message
 * kept (rs_ort_session_providers). Returns 0, 400 for an invalid model/option, or 500. */
RS_ORT_EXPORT int rs_ort_runner_add_session(void *runner, const void *model, size_t model_len,
                                            const rs_ort_session_spec *spec, char **err);
RS_ORT_EXPORT size_t rs_ort_runner_session_count(void *runner);
/* Session `index`'s providers as appended ("A,B,CPUExecutionProvider") into names, and the
 * messages of the ones ONNX Runtime refused ("A: why\n...") into refused. */
RS_ORT_EXPORT int rs_ort_session_providers(void *runner, size_t index, char *names, size_t names_cap,
                                           char *refused, size_t refused_cap);
/* Graph inputs (outputs = 0) or outputs (1) as session 0 reports them: count, then per index
 * the name, element type and dims (-1 for a free dim; rank > RS_DENSE_MAX_RANK is an error). */
RS_ORT_EXPORT size_t rs_ort_runner_io_count(void *runner, int outputs);
RS_ORT_EXPORT int rs_ort_runner_io(void *runner, int outputs, size_t index, char *name, size_t name_cap,
                                   int32_t *elem_type, int64_t *dims, size_t *rank, char **err);

/* The seam (dense_run.h): a session picked by the runner's policy; the calling thread is
 * pinned to that session's cpus the first time it uses it. */
RS_ORT_EXPORT int rs_ort_dense_run(void *runner, const rs_tensor_in *inputs, size_t n_inputs,
                                   const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs,
                                   char **err);
/* The same run on session `index` (warmup, dynamic batching, callers with their own policy); no pinning. */
RS_ORT_EXPORT int rs_ort_run_session(void *runner, size_t index, const rs_tensor_in *inputs, size_t n_inputs,
                                     const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs,
                                     char **err);
/* rs_ort_dense_run (index < 0) or rs_ort_run_session(index) with the inputs packed as int64
 * words (see ort_runner.c): recserve.runtime.native_runner's entry. */
RS_ORT_EXPORT int rs_ort_run_any(void *runner, int64_t index, const int64_t *packed, size_t n_inputs,
                                 const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs,
                                 char **err);
/* Session index the policy would pick for the calling thread next (tests; consumes an RR turn). */
RS_ORT_EXPORT size_t rs_ort_pick_session(void *runner);
/* Runs in progress on session `index` through rs_ort_dense_run (-1: no such session). */
RS_ORT_EXPORT long rs_ort_session_in_flight(void *runner, size_t index);
RS_ORT_EXPORT void rs_ort_free_outputs(rs_tensor_out *outputs, size_t n);
RS_ORT_EXPORT void rs_ort_free_error(char *err);
RS_ORT_EXPORT void rs_ort_runner_free(void *runner);

#endif
