/* ONNX Runtime C API runner: see ort_runner.h. */
#define _GNU_SOURCE
#include "ort_runner.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ort_api.h"

#define RS_OK 0
#define RS_BAD_INPUT 400
#define RS_INTERNAL 500

/* Remembered per thread for MOD (which number a thread got from which runner); a thread
 * that uses more runners than this renumbers, as SessionPolicy does past its map size. */
#define RS_THREAD_SLOTS 8
/* Feeds held on the stack up to this many; more take the heap. */
#define RS_STACK_FEEDS 64

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const OrtApi *g_api;
static const char *g_version;
static OrtEnv *g_env;
static int g_global_pools;
static OrtMemoryInfo *g_cpu_memory;
static atomic_uint_fast64_t g_next_runner_id = 1;

typedef struct {
    OrtSession *session;
    atomic_long in_flight;
    cpu_set_t cpus;
    int pinned;              /* cpus set */
    char providers[256];
    char refused[1024];
} rs_session;

typedef struct {
    uint64_t id;
    int policy;
    OrtValue **init_values;
    char **init_names;
    size_t n_inits;
    /* The sessions' prepacked MatMul/Gemm weights, one copy for all of them: a session given
     * the shared initializers and prepacking on keeps its packed form here, not privately. */
    OrtPrepackedWeightsContainer *prepacked;
    rs_session *sessions;
    size_t n_sessions, cap_sessions;
    char **input_names;      /* session 0's graph inputs: a run that misses one is told which */
    size_t n_input_names;
    atomic_uint_fast64_t turn;
    atomic_uint_fast32_t next_thread;
} rs_runner;

static _Thread_local struct { uint64_t runner; uint32_t number; } tl_numbers[RS_THREAD_SLOTS];
static _Thread_local unsigned tl_next_slot;
static _Thread_local uint64_t tl_pinned_runner;
static _Thread_local size_t tl_pinned_index;

/* ---- errors ---------------------------------------------------------------------------- */

static int fail(char **err, int status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        char *text = NULL;
        if (vasprintf(&text, fmt, ap) < 0) text = NULL;
        va_end(ap);
        *err = text;
    }
    return status;
}

/* Turns a failed OrtStatus into our status and message and releases it. */
static int from_ort(OrtStatus *status, char **err, const char *what) {
    int code = g_api->GetErrorCode(status) == RS_ORT_INVALID_ARGUMENT ? RS_BAD_INPUT : RS_INTERNAL;
    const char *message = g_api->GetErrorMessage(status);
    int rc = what ? fail(err, code, "%s: %s", what, message) : fail(err, code, "%s", message);
    g_api->ReleaseStatus(status);
    return rc;
}

#define ORT_TRY(call, what)                                   \
    do {                                                      \
        OrtStatus *st_ = (call);                              \
        if (st_) return from_ort(st_, err, (what));           \
    } while (0)

RS_ORT_EXPORT void rs_ort_free_error(char *err) { free(err); }

/* ---- library and env --------------------------------------------------------------------- */

static int load_library(const char *path, char **err) {
    if (g_api) return RS_OK;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return fail(err, RS_INTERNAL, "cannot load ONNX Runtime from %s: %s", path, dlerror());
    OrtGetApiBaseFn get_base = (OrtGetApiBaseFn)dlsym(handle, "OrtGetApiBase");
    if (!get_base) return fail(err, RS_INTERNAL, "%s has no OrtGetApiBase: not an ONNX Runtime library", path);
    const OrtApiBase *base = get_base();
    const OrtApi *api = base->GetApi(RS_ORT_API_VERSION);
    if (!api)
        return fail(err, RS_INTERNAL,
                    "ONNX Runtime %s at %s does not offer C API version %u, which recserve's native runner "
                    "needs (ONNX Runtime >= 1.11)", base->GetVersionString(), path, RS_ORT_API_VERSION);
    g_version = base->GetVersionString();
    g_api = api;  /* the handle stays open for the life of the process */
    return RS_OK;
}

static int create_env(int global_pools, int intra, int inter, int spinning, char **err) {
    if (!global_pools) {
        ORT_TRY(g_api->CreateEnv(RS_ORT_LOG_WARNING, "recserve", &g_env), "cannot create ONNX Runtime's env");
    } else {
        OrtThreadingOptions *tp = NULL;
        ORT_TRY(g_api->CreateThreadingOptions(&tp), "cannot create threading options");
        OrtStatus *st = g_api->SetGlobalIntraOpNumThreads(tp, intra);
        if (!st) st = g_api->SetGlobalInterOpNumThreads(tp, inter);
        if (!st) st = g_api->SetGlobalSpinControl(tp, spinning ? 1 : 0);
        if (!st) st = g_api->CreateEnvWithGlobalThreadPools(RS_ORT_LOG_WARNING, "recserve", tp, &g_env);
        g_api->ReleaseThreadingOptions(tp);
        if (st) return from_ort(st, err, "cannot create ONNX Runtime's global thread pools");
    }
    g_global_pools = global_pools;
    ORT_TRY(g_api->CreateCpuMemoryInfo(RS_ORT_ARENA_ALLOCATOR, RS_ORT_MEM_TYPE_DEFAULT, &g_cpu_memory),
            "cannot describe CPU memory");
    return RS_OK;
}

RS_ORT_EXPORT int rs_ort_env(const char *library_path, int global_pools, int intra, int inter, int spinning,
                             char **err) {
    pthread_mutex_lock(&g_lock);
    int rc = load_library(library_path, err);
    if (rc == RS_OK && !g_env) rc = create_env(global_pools, intra, inter, spinning, err);
    else if (rc == RS_OK && global_pools && !g_global_pools)
        rc = fail(err, RS_INTERNAL,
                  "this process's ONNX Runtime env was created without global thread pools (by a model with "
                  "use_per_session_threads true) and ONNX Runtime cannot add them later; set "
                  "use_per_session_threads false and ort_global_thread_pools true for every model of the "
                  "process, or for none");
    pthread_mutex_unlock(&g_lock);
    return rc;
}

RS_ORT_EXPORT const char *rs_ort_version(void) { return g_version; }

RS_ORT_EXPORT unsigned rs_ort_api_version(void) { return RS_ORT_API_VERSION; }

RS_ORT_EXPORT int rs_ort_available_providers(char *buf, size_t cap, char **err) {
    if (!g_api) return fail(err, RS_INTERNAL, "ONNX Runtime is not loaded");
    char **names = NULL;
    int n = 0;
    ORT_TRY(g_api->GetAvailableProviders(&names, &n), "cannot list providers");
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        int wrote = snprintf(buf + used, cap > used ? cap - used : 0, "%s%s", i ? "," : "", names[i]);
        if (wrote > 0) used += (size_t)wrote;
    }
    OrtStatus *st = g_api->ReleaseAvailableProviders(names, n);
    if (st) g_api->ReleaseStatus(st);
    return used < cap ? RS_OK : fail(err, RS_INTERNAL, "provider list longer than %zu bytes", cap);
}

/* ---- element types ------------------------------------------------------------------------ */

static size_t element_size(int32_t type) {
    switch (type) {
    case 1: case 6: case 12: return 4;                 /* float, int32, uint32 */
    case 7: case 11: case 13: return 8;                /* int64, double, uint64 */
    case 2: case 3: case 9: return 1;                  /* uint8, int8, bool */
    case 4: case 5: case 10: case 16: return 2;        /* uint16, int16, float16, bfloat16 */
    default: return 0;                                 /* string, complex, unknown: not served here */
    }
}

/* ---- runners -------------------------------------------------------------------------------- */

RS_ORT_EXPORT void rs_ort_runner_free(void *handle) {
    rs_runner *r = handle;
    if (!r) return;
    for (size_t i = 0; i < r->n_sessions; i++) g_api->ReleaseSession(r->sessions[i].session);
    /* after the sessions: they read the initializers and the packed weights until released */
    if (r->prepacked) g_api->ReleasePrepackedWeightsContainer(r->prepacked);
    for (size_t i = 0; i < r->n_inits; i++) {
        if (r->init_values[i]) g_api->ReleaseValue(r->init_values[i]);
        free(r->init_names[i]);
    }
    free(r->init_values);
    free(r->init_names);
    for (size_t i = 0; i < r->n_input_names; i++) free(r->input_names[i]);
    free(r->input_names);
    free(r->sessions);
    free(r);
}

RS_ORT_EXPORT void *rs_ort_runner_new(int policy, const rs_ort_initializer *inits, size_t n_inits, char **err) {
    if (!g_env) {
        fail(err, RS_INTERNAL, "rs_ort_env must succeed before a runner is created");
        return NULL;
    }
    if (policy < RS_ORT_POLICY_MOD || policy > RS_ORT_POLICY_LEAST_BUSY) {
        fail(err, RS_BAD_INPUT, "unknown session policy %d", policy);
        return NULL;
    }
    rs_runner *r = calloc(1, sizeof *r);
    if (!r || (n_inits && (!(r->init_values = calloc(n_inits, sizeof *r->init_values)) ||
                           !(r->init_names = calloc(n_inits, sizeof *r->init_names))))) {
        fail(err, RS_INTERNAL, "out of memory");
        rs_ort_runner_free(r);
        return NULL;
    }
    r->id = atomic_fetch_add(&g_next_runner_id, 1);
    r->policy = policy;
    r->n_inits = n_inits;
    OrtStatus *made = g_api->CreatePrepackedWeightsContainer(&r->prepacked);
    if (made) {
        from_ort(made, err, "cannot create the prepacked weights container");
        rs_ort_runner_free(r);
        return NULL;
    }
    for (size_t i = 0; i < n_inits; i++) {
        const rs_ort_initializer *in = &inits[i];
        r->init_names[i] = strdup(in->name);
        /* ORT does not write initializers it is given; the const is dropped for its signature only. */
        OrtStatus *st = g_api->CreateTensorWithDataAsOrtValue(g_cpu_memory, (void *)in->data, in->bytes, in->shape,
                                                              in->rank, in->elem_type, &r->init_values[i]);
        if (st || !r->init_names[i]) {
            if (st) from_ort(st, err, "cannot wrap a shared initializer");
            else fail(err, RS_INTERNAL, "out of memory");
            rs_ort_runner_free(r);
            return NULL;
        }
    }
    return r;
}

static void append_text(char *buf, size_t cap, const char *fmt, ...) {
    size_t used = strnlen(buf, cap);
    if (used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, cap - used, fmt, ap);
    va_end(ap);
}

/* Appends one GPU provider with its string options. Untested here: no GPU, CPU-only wheel
 * (written to the C API's documented V2 calls). A refusal is recorded, not fatal: the
 * caller decides, as recserve.runtime.providers.check_providers does for Python sessions. */
static void append_provider(OrtSessionOptions *options, rs_session *s, const char *name, const char *const *keys,
                            const char *const *values, size_t n) {
    OrtStatus *st = NULL;
    if (strcmp(name, "CUDAExecutionProvider") == 0) {
        OrtCUDAProviderOptionsV2 *cuda = NULL;
        st = g_api->CreateCUDAProviderOptions(&cuda);
        if (!st) st = g_api->UpdateCUDAProviderOptions(cuda, keys, values, n);
        if (!st) st = g_api->SessionOptionsAppendExecutionProvider_CUDA_V2(options, cuda);
        if (cuda) g_api->ReleaseCUDAProviderOptions(cuda);
    } else if (strcmp(name, "TensorrtExecutionProvider") == 0) {
        OrtTensorRTProviderOptionsV2 *trt = NULL;
        st = g_api->CreateTensorRTProviderOptions(&trt);
        if (!st) st = g_api->UpdateTensorRTProviderOptions(trt, keys, values, n);
        if (!st) st = g_api->SessionOptionsAppendExecutionProvider_TensorRT_V2(options, trt);
        if (trt) g_api->ReleaseTensorRTProviderOptions(trt);
    } else {
        append_text(s->refused, sizeof s->refused, "%s: not a provider recserve's native runner appends\n", name);
        return;
    }
    if (st) {
        append_text(s->refused, sizeof s->refused, "%s: %s\n", name, g_api->GetErrorMessage(st));
        g_api->ReleaseStatus(st);
        return;
    }
    append_text(s->providers, sizeof s->providers, "%s,", name);
}

static int session_options(const rs_ort_session_spec *spec, rs_runner *r, rs_session *s, OrtSessionOptions *o,
                           char **err) {
    ORT_TRY(g_api->SetSessionLogSeverityLevel(o, spec->log_severity), "session option log_severity");
    if (spec->graph_optimization_level >= 0)
        ORT_TRY(g_api->SetSessionGraphOptimizationLevel(o, (GraphOptimizationLevel)spec->graph_optimization_level),
                "session option graph_optimization_level");
    if (!spec->per_session_threads) {
        ORT_TRY(g_api->DisablePerSessionThreads(o), "session option per_session_threads");
    } else {
        ORT_TRY(g_api->SetIntraOpNumThreads(o, spec->intra_op_threads), "session option intra_op_threads");
        ORT_TRY(g_api->SetInterOpNumThreads(o, spec->inter_op_threads), "session option inter_op_threads");
    }
    ORT_TRY(g_api->SetSessionExecutionMode(o, spec->parallel_execution ? RS_ORT_PARALLEL : RS_ORT_SEQUENTIAL),
            "session option execution_mode");
    for (size_t i = 0; i < spec->n_config; i++)
        ORT_TRY(g_api->AddSessionConfigEntry(o, spec->config_keys[i], spec->config_values[i]),
                "session config entry");
    for (size_t i = 0; i < r->n_inits; i++)
        ORT_TRY(g_api->AddInitializer(o, r->init_names[i], r->init_values[i]), "shared initializer");
    size_t first = 0;
    for (size_t i = 0; i < spec->n_providers; i++) {
        size_t n = spec->provider_option_counts[i];
        const char *name = spec->provider_names[i];
        if (strcmp(name, "CPUExecutionProvider") != 0)
            append_provider(o, s, name, spec->provider_keys + first, spec->provider_values + first, n);
        first += n;
    }
    append_text(s->providers, sizeof s->providers, "CPUExecutionProvider");
    return RS_OK;
}

static int remember_inputs(rs_runner *r, char **err) {
    size_t n = 0;
    OrtAllocator *alloc = NULL;
    ORT_TRY(g_api->SessionGetInputCount(r->sessions[0].session, &n), "graph inputs");
    ORT_TRY(g_api->GetAllocatorWithDefaultOptions(&alloc), "no default allocator");
    r->input_names = calloc(n ? n : 1, sizeof *r->input_names);
    if (!r->input_names) return fail(err, RS_INTERNAL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char *name = NULL;
        ORT_TRY(g_api->SessionGetInputName(r->sessions[0].session, i, alloc, &name), "graph input name");
        r->input_names[i] = strdup(name);
        alloc->Free(alloc, name);
        if (!r->input_names[i]) return fail(err, RS_INTERNAL, "out of memory");
        r->n_input_names = i + 1;
    }
    return RS_OK;
}

/* ONNX Runtime runs a graph with an input missing until a node needs it, then fails with an
 * internal error; recserve says which inputs are missing instead (a bad request). */
static int missing_inputs(rs_runner *r, const rs_tensor_in *inputs, size_t n_inputs, char **err) {
    char text[1024] = "";
    for (size_t i = 0; i < r->n_input_names; i++) {
        size_t k = 0;
        while (k < n_inputs && strcmp(inputs[k].name, r->input_names[i]) != 0) k++;
        if (k == n_inputs) append_text(text, sizeof text, "%s%s", text[0] ? ", " : "", r->input_names[i]);
    }
    return text[0] ? fail(err, RS_BAD_INPUT, "missing graph input(s): %s", text) : RS_OK;
}

RS_ORT_EXPORT int rs_ort_runner_add_session(void *handle, const void *model, size_t model_len,
                                            const rs_ort_session_spec *spec, char **err) {
    rs_runner *r = handle;
    if (r->n_sessions == r->cap_sessions) {
        size_t cap = r->cap_sessions ? 2 * r->cap_sessions : 4;
        rs_session *grown = realloc(r->sessions, cap * sizeof *grown);
        if (!grown) return fail(err, RS_INTERNAL, "out of memory");
        r->sessions = grown;
        r->cap_sessions = cap;
    }
    rs_session *s = &r->sessions[r->n_sessions];
    memset(s, 0, sizeof *s);
    atomic_init(&s->in_flight, 0);
    CPU_ZERO(&s->cpus);
    for (size_t i = 0; i < spec->n_cpus; i++) {
        if (spec->cpus[i] < 0 || spec->cpus[i] >= CPU_SETSIZE)
            return fail(err, RS_BAD_INPUT, "cpu %d out of range", spec->cpus[i]);
        CPU_SET(spec->cpus[i], &s->cpus);
    }
    s->pinned = spec->n_cpus > 0;
    OrtSessionOptions *options = NULL;
    ORT_TRY(g_api->CreateSessionOptions(&options), "cannot create session options");
    int rc = session_options(spec, r, s, options, err);
    if (rc == RS_OK) {
        OrtStatus *st = model_len ? g_api->CreateSessionFromArrayWithPrepackedWeightsContainer(
                                        g_env, model, model_len, options, r->prepacked, &s->session)
                                  : g_api->CreateSessionWithPrepackedWeightsContainer(
                                        g_env, (const char *)model, options, r->prepacked, &s->session);
        if (st) rc = from_ort(st, err, NULL);
    }
    g_api->ReleaseSessionOptions(options);
    if (rc == RS_OK) r->n_sessions++;
    if (rc == RS_OK && r->n_sessions == 1) rc = remember_inputs(r, err);
    return rc;
}

RS_ORT_EXPORT size_t rs_ort_runner_session_count(void *handle) { return ((rs_runner *)handle)->n_sessions; }

RS_ORT_EXPORT int rs_ort_session_providers(void *handle, size_t index, char *names, size_t names_cap, char *refused,
                                           size_t refused_cap) {
    rs_runner *r = handle;
    if (index >= r->n_sessions) return RS_BAD_INPUT;
    snprintf(names, names_cap, "%s", r->sessions[index].providers);
    snprintf(refused, refused_cap, "%s", r->sessions[index].refused);
    return RS_OK;
}

RS_ORT_EXPORT size_t rs_ort_runner_io_count(void *handle, int outputs) {
    rs_runner *r = handle;
    size_t n = 0;
    if (!r->n_sessions) return 0;
    OrtSession *s = r->sessions[0].session;
    OrtStatus *st = outputs ? g_api->SessionGetOutputCount(s, &n) : g_api->SessionGetInputCount(s, &n);
    if (st) {
        g_api->ReleaseStatus(st);
        return 0;
    }
    return n;
}

RS_ORT_EXPORT int rs_ort_runner_io(void *handle, int outputs, size_t index, char *name, size_t name_cap,
                                   int32_t *elem_type, int64_t *dims, size_t *rank, char **err) {
    rs_runner *r = handle;
    if (!r->n_sessions) return fail(err, RS_INTERNAL, "the runner has no session");
    OrtSession *s = r->sessions[0].session;
    OrtAllocator *alloc = NULL;
    ORT_TRY(g_api->GetAllocatorWithDefaultOptions(&alloc), "no default allocator");
    char *text = NULL;
    ORT_TRY(outputs ? g_api->SessionGetOutputName(s, index, alloc, &text)
                    : g_api->SessionGetInputName(s, index, alloc, &text), "graph io name");
    snprintf(name, name_cap, "%s", text);
    alloc->Free(alloc, text);
    OrtTypeInfo *info = NULL;
    ORT_TRY(outputs ? g_api->SessionGetOutputTypeInfo(s, index, &info) : g_api->SessionGetInputTypeInfo(s, index, &info),
            "graph io type");
    ONNXType kind = RS_ONNX_TYPE_UNKNOWN;
    const OrtTensorTypeAndShapeInfo *tensor = NULL;
    OrtStatus *st = g_api->GetOnnxTypeFromTypeInfo(info, &kind);
    if (!st && kind == RS_ONNX_TYPE_TENSOR) st = g_api->CastTypeInfoToTensorInfo(info, &tensor);
    *elem_type = 0;
    *rank = 0;
    if (!st && tensor) {
        ONNXTensorElementDataType type = 0;
        st = g_api->GetTensorElementType(tensor, &type);
        if (!st) st = g_api->GetDimensionsCount(tensor, rank);
        if (!st && *rank > RS_DENSE_MAX_RANK) {
            g_api->ReleaseTypeInfo(info);
            return fail(err, RS_INTERNAL, "graph tensor %s has %zu dimensions, more than %d", name, *rank,
                        RS_DENSE_MAX_RANK);
        }
        if (!st) st = g_api->GetDimensions(tensor, dims, *rank);
        *elem_type = type;
    }
    g_api->ReleaseTypeInfo(info);
    if (st) return from_ort(st, err, "graph io shape");
    return RS_OK;
}

/* ---- runs ------------------------------------------------------------------------------------ */

static void release_all(OrtValue **values, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (values[i]) g_api->ReleaseValue(values[i]);
}

RS_ORT_EXPORT void rs_ort_free_outputs(rs_tensor_out *outputs, size_t n) {
    for (size_t i = 0; outputs && i < n; i++) {
        free(outputs[i].data);
        outputs[i].data = NULL;
    }
}

static int copy_output(OrtValue *value, const char *name, rs_tensor_out *out, char **err) {
    OrtTensorTypeAndShapeInfo *info = NULL;
    int is_tensor = 0;
    ORT_TRY(g_api->IsTensor(value, &is_tensor), name);
    if (!is_tensor) return fail(err, RS_INTERNAL, "output %s is not a tensor; the native runner serves tensors", name);
    ORT_TRY(g_api->GetTensorTypeAndShape(value, &info), name);
    ONNXTensorElementDataType type = 0;
    size_t rank = 0, count = 0;
    OrtStatus *st = g_api->GetTensorElementType(info, &type);
    if (!st) st = g_api->GetDimensionsCount(info, &rank);
    if (!st && rank > RS_DENSE_MAX_RANK) {
        g_api->ReleaseTensorTypeAndShapeInfo(info);
        return fail(err, RS_INTERNAL, "output %s has %zu dimensions, more than %d", name, rank, RS_DENSE_MAX_RANK);
    }
    if (!st) st = g_api->GetDimensions(info, out->shape, rank);
    if (!st) st = g_api->GetTensorShapeElementCount(info, &count);
    g_api->ReleaseTensorTypeAndShapeInfo(info);
    if (st) return from_ort(st, err, name);
    size_t size = element_size(type);
    if (!size) return fail(err, RS_INTERNAL, "output %s has element type %d, which the native runner cannot return", name, type);
    void *data = NULL;
    ORT_TRY(g_api->GetTensorMutableData(value, &data), name);
    out->elem_type = type;
    out->rank = rank;
    out->bytes = count * size;
    out->data = malloc(out->bytes ? out->bytes : 1);
    if (!out->data) return fail(err, RS_INTERNAL, "out of memory for output %s (%zu bytes)", name, out->bytes);
    if (out->bytes) memcpy(out->data, data, out->bytes);
    return RS_OK;
}

static int make_feed(const rs_tensor_in *in, OrtValue **value, char **err) {
    size_t size = element_size(in->elem_type);
    if (!size) return fail(err, RS_BAD_INPUT, "input %s has element type %d, which the native runner cannot feed", in->name, in->elem_type);
    size_t bytes = size;
    for (size_t d = 0; d < in->rank; d++) {
        if (in->shape[d] < 0) return fail(err, RS_BAD_INPUT, "input %s has a negative dimension", in->name);
        if (in->shape[d] && bytes > SIZE_MAX / (size_t)in->shape[d])
            return fail(err, RS_BAD_INPUT, "input %s is too large", in->name);
        bytes *= (size_t)in->shape[d];
    }
    static int64_t empty; /* ORT wants a non-null pointer even for zero elements */
    void *data = (bytes == 0 || !in->data) ? (void *)&empty : (void *)in->data;
    if (in->data == NULL && bytes) return fail(err, RS_BAD_INPUT, "input %s has no data", in->name);
    ORT_TRY(g_api->CreateTensorWithDataAsOrtValue(g_cpu_memory, data, bytes, in->shape, in->rank, in->elem_type, value),
            in->name);
    return RS_OK;
}

static int run_on(rs_runner *r, size_t index, const rs_tensor_in *inputs, size_t n_inputs,
                  const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs, char **err) {
    if (index >= r->n_sessions) return fail(err, RS_INTERNAL, "session %zu of %zu", index, r->n_sessions);
    if (n_inputs < r->n_input_names && missing_inputs(r, inputs, n_inputs, err)) return RS_BAD_INPUT;
    OrtValue *stack_feeds[RS_STACK_FEEDS] = {0}, *stack_outs[RS_STACK_FEEDS] = {0};
    const char *stack_names[RS_STACK_FEEDS];
    OrtValue **feeds = stack_feeds, **outs = stack_outs;
    const char **names = stack_names;
    int rc = RS_OK;
    if (n_inputs > RS_STACK_FEEDS || n_outputs > RS_STACK_FEEDS) {
        feeds = calloc(n_inputs ? n_inputs : 1, sizeof *feeds);
        names = calloc(n_inputs ? n_inputs : 1, sizeof *names);
        outs = calloc(n_outputs ? n_outputs : 1, sizeof *outs);
        if (!feeds || !names || !outs) {
            rc = fail(err, RS_INTERNAL, "out of memory");
            goto done;
        }
    }
    for (size_t i = 0; i < n_inputs && rc == RS_OK; i++) {
        names[i] = inputs[i].name;
        rc = make_feed(&inputs[i], &feeds[i], err);
    }
    if (rc == RS_OK) {
        OrtStatus *st = g_api->Run(r->sessions[index].session, NULL, names, (const OrtValue *const *)feeds, n_inputs,
                                   output_names, n_outputs, outs);
        if (st) rc = from_ort(st, err, NULL);
    }
    size_t copied = 0;
    for (; rc == RS_OK && copied < n_outputs; copied++) {
        memset(&outputs[copied], 0, sizeof outputs[copied]);
        rc = copy_output(outs[copied], output_names[copied], &outputs[copied], err);
    }
    if (rc != RS_OK) rs_ort_free_outputs(outputs, copied);
done:
    release_all(feeds, n_inputs);
    release_all(outs, n_outputs);
    if (feeds != stack_feeds) free(feeds);
    if (names != stack_names) free((void *)names);
    if (outs != stack_outs) free(outs);
    return rc;
}

RS_ORT_EXPORT int rs_ort_run_session(void *handle, size_t index, const rs_tensor_in *inputs, size_t n_inputs,
                                     const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs,
                                     char **err) {
    return run_on(handle, index, inputs, n_inputs, output_names, n_outputs, outputs, err);
}

/* Python's entry (recserve.runtime.native_runner): `packed` holds five int64 words per
 * input (name address, element type, index of its first dim in `packed`, rank, data
 * address) and then the dims, which ctypes fills far faster than structures. index < 0
 * is rs_ort_dense_run (policy, pinning), else rs_ort_run_session. */
RS_ORT_EXPORT int rs_ort_dense_run(void *handle, const rs_tensor_in *inputs, size_t n_inputs,
                                   const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs,
                                   char **err);

RS_ORT_EXPORT int rs_ort_run_any(void *handle, int64_t index, const int64_t *packed, size_t n_inputs,
                                 const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs,
                                 char **err) {
    rs_tensor_in stack[RS_STACK_FEEDS];
    rs_tensor_in *inputs = n_inputs <= RS_STACK_FEEDS ? stack : calloc(n_inputs, sizeof *inputs);
    if (!inputs) return fail(err, RS_INTERNAL, "out of memory");
    for (size_t i = 0; i < n_inputs; i++) {
        const int64_t *w = packed + 5 * i;
        inputs[i].name = (const char *)(uintptr_t)w[0];
        inputs[i].elem_type = (int32_t)w[1];
        inputs[i].shape = packed + 5 * n_inputs + w[2];
        inputs[i].rank = (size_t)w[3];
        inputs[i].data = (const void *)(uintptr_t)w[4];
    }
    int rc = index < 0 ? rs_ort_dense_run(handle, inputs, n_inputs, output_names, n_outputs, outputs, err)
                       : run_on(handle, (size_t)index, inputs, n_inputs, output_names, n_outputs, outputs, err);
    if (inputs != stack) free(inputs);
    return rc;
}

/* MOD's key: the calling thread's number with this runner, in order of first call. */
static uint32_t thread_number(rs_runner *r) {
    for (unsigned i = 0; i < RS_THREAD_SLOTS; i++)
        if (tl_numbers[i].runner == r->id) return tl_numbers[i].number;
    uint32_t number = (uint32_t)atomic_fetch_add(&r->next_thread, 1);
    unsigned slot = tl_next_slot++ % RS_THREAD_SLOTS;
    tl_numbers[slot].runner = r->id;
    tl_numbers[slot].number = number;
    return number;
}

static size_t pick(rs_runner *r) {
    size_t n = r->n_sessions;
    if (n <= 1) return 0;
    if (r->policy == RS_ORT_POLICY_MOD) return thread_number(r) % n;
    size_t start = (size_t)(atomic_fetch_add(&r->turn, 1) % n);
    if (r->policy == RS_ORT_POLICY_RR) return start;
    size_t best = start;
    long best_load = atomic_load(&r->sessions[start].in_flight);
    for (size_t k = 1; k < n && best_load > 0; k++) {
        size_t i = (start + k) % n;
        long load = atomic_load(&r->sessions[i].in_flight);
        if (load < best_load) {
            best = i;
            best_load = load;
        }
    }
    return best;
}

RS_ORT_EXPORT size_t rs_ort_pick_session(void *handle) { return pick(handle); }

RS_ORT_EXPORT long rs_ort_session_in_flight(void *handle, size_t index) {
    rs_runner *r = handle;
    return index < r->n_sessions ? atomic_load(&r->sessions[index].in_flight) : -1;
}

RS_ORT_EXPORT int rs_ort_dense_run(void *handle, const rs_tensor_in *inputs, size_t n_inputs,
                                   const char *const *output_names, size_t n_outputs, rs_tensor_out *outputs,
                                   char **err) {
    rs_runner *r = handle;
    if (!r || !r->n_sessions) return fail(err, RS_INTERNAL, "the dense runner has no session");
    size_t index = pick(r);
    rs_session *s = &r->sessions[index];
    /* Pinning costs a syscall: only when this thread last ran elsewhere (under MOD: once). */
    if (s->pinned && (tl_pinned_runner != r->id || tl_pinned_index != index)) {
        if (sched_setaffinity(0, sizeof s->cpus, &s->cpus) == 0) {
            tl_pinned_runner = r->id;
            tl_pinned_index = index;
        }
    }
    atomic_fetch_add(&s->in_flight, 1);
    int rc = run_on(r, index, inputs, n_inputs, output_names, n_outputs, outputs, err);
    atomic_fetch_sub(&s->in_flight, 1);
    return rc;
}

/* The seam's type, checked at compile time. */
static const rs_dense_run_fn rs_ort_dense_run_is_a_seam __attribute__((unused)) = rs_ort_dense_run;
