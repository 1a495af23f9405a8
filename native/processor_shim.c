/* libserving_processor.so: DeepRec's processor C ABI (processor.h) over recserve.Processor.
 *
 * The C side only moves bytes: it enters the interpreter, calls a function of
 * recserve.processor.cabi (which turns every Python error into a status and a message),
 * and copies the result into malloc'ed memory. Any failure on the way (an exception, an
 * unexpected return value, malloc) becomes a status and message too: the host never aborts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "processor.h"
#include "route.h"

#define HANDLE_MAGIC 0x7265637365727665ULL /* "recserve": catches a stray or destroyed pointer */

typedef int (*route_process_fn)(rs_route_slot*, const uint8_t*, int64_t, uint8_t**, int64_t*, int64_t*);

typedef struct {
    uint64_t magic;
    PyObject* processor; /* recserve.Processor, owned */
    /* The native route (DESIGN §10): tried first, with the GIL released. NULL: Python only.
     * The slot belongs to the processor's manager and lives as long as `processor`. */
    route_process_fn route;
    rs_route_slot* slot;
    int batch_native; /* batch_process serves natively too (no dynamic batching to merge into) */
} model_handle;

/* recserve.processor.cabi's functions, resolved once (under the GIL) and kept forever. */
static PyObject* cabi_open;
static PyObject* cabi_batch;
static PyObject* cabi_info;
static PyObject* cabi_close;
static PyObject* cabi_load_version; /* recserve.processor.cabi.load_version */
static PyObject* cabi_native_route; /* recserve.processor.cabi.native_route */
static PyObject* cabi_process; /* set last: non-NULL means all six are set */

static pthread_once_t interpreter_once = PTHREAD_ONCE_INIT;
static char interpreter_error[PATH_MAX + 256]; /* empty once an interpreter is available */

/* ---- starting the interpreter ------------------------------------------------------- */

/* The directory holding the recserve package this library belongs to (it lives inside it). */
static int find_package_parent(char* out) {
    Dl_info self;
    char resolved[PATH_MAX];
    if (!dladdr((void*)&initialize, &self) || !self.dli_fname || !realpath(self.dli_fname, resolved))
        return -1;
    char* package_dir = dirname(resolved); /* .../recserve */
    strcpy(out, dirname(package_dir));     /* dirname writes into `resolved`, within PATH_MAX */
    return 0;
}

/* The Python whose environment (venv, site-packages) recserve was installed into: the
 * prefix of the site-packages dir holding the package, else the Python that built this
 * library (an in-place or editable build). NULL: let CPython search as it does by default. */
static const char* find_python(const char* package_parent, char* buf, size_t size) {
    const char* base = strrchr(package_parent, '/');
    if (base && (!strcmp(base, "/site-packages") || !strcmp(base, "/dist-packages"))) {
        /* <prefix>/lib/pythonX.Y/site-packages -> <prefix>/bin/pythonX.Y, the version linked */
        snprintf(buf, size, "%s/../../../bin/python%d.%d", package_parent, PY_MAJOR_VERSION, PY_MINOR_VERSION);
        if (access(buf, X_OK) == 0)
            return buf;
    }
#ifdef RECSERVE_BUILD_PYTHON
    if (access(RECSERVE_BUILD_PYTHON, X_OK) == 0)
        return RECSERVE_BUILD_PYTHON;
#endif
    return NULL;
}

static void start_interpreter(void) {
    if (Py_IsInitialized())
        return; /* a Python host: use its interpreter */

    /* Extension modules (numpy...) expect libpython's symbols in the global namespace; a host
     * that dlopened us with RTLD_LOCAL left them private, so promote them. */
    Dl_info libpython;
    if (dladdr((void*)&Py_IsInitialized, &libpython) && libpython.dli_fname)
        (void)dlopen(libpython.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);

    char package_parent[PATH_MAX];
    if (find_package_parent(package_parent) != 0) {
        snprintf(interpreter_error, sizeof interpreter_error,
                 "cannot locate libserving_processor.so on disk to find the recserve package");
        return;
    }
    char python_buf[PATH_MAX + 32];
    const char* python = find_python(package_parent, python_buf, sizeof python_buf);

    PyConfig config;
    PyConfig_InitIsolatedConfig(&config); /* ignores PYTHON* variables and the user site dir */
    config.install_signal_handlers = 0;   /* signals belong to the host */
    config.site_import = 1;               /* site-packages of the chosen environment */
    PyStatus status = PyStatus_Ok();
    if (python)
        status = PyConfig_SetBytesString(&config, &config.executable, python);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        snprintf(interpreter_error, sizeof interpreter_error, "cannot start Python (executable %s): %s%s%s",
                 python ? python : "searched by CPython", status.func ? status.func : "",
                 status.func ? ": " : "", status.err_msg ? status.err_msg : "unknown error");
        return;
    }

    /* Importing CPython's signal module installs its SIGINT handler whenever SIGINT is at
     * the default, install_signal_handlers or not: import it now and give SIGINT back. */
    struct sigaction host_sigint;
    sigaction(SIGINT, NULL, &host_sigint);
    PyObject* signal_module = PyImport_ImportModule("_signal");
    sigaction(SIGINT, &host_sigint, NULL);
    if (!signal_module)
        PyErr_Clear();
    Py_XDECREF(signal_module);

    /* The package next to this library comes first, whatever else is installed. */
    PyObject* sys_path = PySys_GetObject("path"); /* borrowed */
    PyObject* entry = PyUnicode_DecodeFSDefault(package_parent);
    if (!sys_path || !entry || PyList_Insert(sys_path, 0, entry) != 0) {
        PyErr_Clear();
        snprintf(interpreter_error, sizeof interpreter_error, "cannot add %s to sys.path", package_parent);
    }
    Py_XDECREF(entry);
    (void)PyEval_SaveThread(); /* host threads take the GIL per call */
}

/* ---- entering the interpreter from host threads --------------------------------- */

/* A host thread that Python has never seen gets a thread state on its first call and keeps
 * it until it exits: PyGILState_Ensure/Release would create and destroy one per call, which
 * costs more than the call itself. Threads Python already knows use PyGILState per call. */
static pthread_key_t host_thread_key;
static pthread_once_t host_thread_once = PTHREAD_ONCE_INIT;

/* Runs as the thread exits, when glibc may already have cleared PyGILState's own key:
 * so no PyGILState_Release here. After a Python host finalized, the state is left alone. */
static void release_host_thread(void* thread_state) {
    if (!Py_IsInitialized() || _Py_IsFinalizing())
        return;
    PyEval_RestoreThread(thread_state);
    PyThreadState_Clear(thread_state);
    PyThreadState_DeleteCurrent(); /* also releases the GIL */
}

static void create_host_thread_key(void) {
    (void)pthread_key_create(&host_thread_key, release_host_thread);
}

typedef struct {
    PyThreadState* kept; /* NULL: entered with PyGILState_Ensure */
    PyGILState_STATE gil;
} python_entry;

static python_entry enter_python(void) {
    PyThreadState* kept = pthread_getspecific(host_thread_key);
    if (kept) {
        PyEval_RestoreThread(kept);
        return (python_entry){kept, PyGILState_UNLOCKED};
    }
    int unknown_thread = PyGILState_GetThisThreadState() == NULL;
    PyGILState_STATE gil = PyGILState_Ensure();
    if (unknown_thread && pthread_setspecific(host_thread_key, PyThreadState_Get()) == 0)
        return (python_entry){PyThreadState_Get(), gil};
    return (python_entry){NULL, gil};
}

static void leave_python(python_entry entry) {
    if (entry.kept)
        (void)PyEval_SaveThread();
    else
        PyGILState_Release(entry.gil);
}

/* ---- replies ------------------------------------------------------------------------ */

/* Every returned buffer: malloc'ed, '\0'-terminated, the terminator not counted. */
static int reply(int status, const char* data, size_t size, void** output_data, int* output_size) {
    char* buffer = malloc(size + 1);
    if (!buffer) {
        *output_data = NULL;
        *output_size = 0;
        return RECSERVE_INTERNAL_ERROR;
    }
    if (size)
        memcpy(buffer, data, size);
    buffer[size] = '\0';
    *output_data = buffer;
    *output_size = (int)size;
    return status;
}

static int reply_text(int status, void** output_data, int* output_size, const char* format, ...)
    __attribute__((format(printf, 4, 5)));

static int reply_text(int status, void** output_data, int* output_size, const char* format, ...) {
    char text[512];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    return reply(status, text, strlen(text), output_data, output_size);
}

/* The pending Python exception as malloc'ed "Type: message" text; clears it. GIL held. */
static char* exception_text(void) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    const char* name = type ? ((PyTypeObject*)type)->tp_name : "unknown exception";
    PyObject* str = value ? PyObject_Str(value) : NULL;
    const char* message = str ? PyUnicode_AsUTF8(str) : NULL;
    PyErr_Clear();
    size_t size = strlen(name) + (message ? strlen(message) : 0) + 3;
    char* text = malloc(size);
    if (text)
        snprintf(text, size, "%s: %s", name, message ? message : "");
    Py_XDECREF(str);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return text;
}

static int reply_exception(void** output_data, int* output_size) {
    char* text = exception_text();
    int status = reply_text(RECSERVE_INTERNAL_ERROR, output_data, output_size, "internal error: %s",
                            text ? text : "(no message)");
    free(text);
    return status;
}

/* Copies a (status, bytes) result of recserve.processor.cabi. GIL held; result borrowed. */
static int reply_result(PyObject* result, void** output_data, int* output_size) {
    if (!result)
        return reply_exception(output_data, output_size);
    PyObject* status = PyTuple_Check(result) && PyTuple_GET_SIZE(result) == 2 ? PyTuple_GET_ITEM(result, 0) : NULL;
    PyObject* payload = status ? PyTuple_GET_ITEM(result, 1) : NULL;
    if (!status || !PyLong_Check(status) || !PyBytes_Check(payload))
        return reply_text(RECSERVE_INTERNAL_ERROR, output_data, output_size,
                          "internal error: recserve returned %s, not (status, bytes)", Py_TYPE(result)->tp_name);
    int code = (int)PyLong_AsLong(status);
    Py_ssize_t size = PyBytes_GET_SIZE(payload);
    if (PyErr_Occurred())
        return reply_exception(output_data, output_size);
    if (size > INT_MAX)
        return reply_text(RECSERVE_INTERNAL_ERROR, output_data, output_size,
                          "response is %zd bytes, more than output_size (an int) can hold", size);
    return reply(code, PyBytes_AS_STRING(payload), (size_t)size, output_data, output_size);
}

/* ---- argument checks ---------------------------------------------------------------- */

static model_handle* as_handle(void* model_buf) {
    model_handle* handle = model_buf;
    return handle && handle->magic == HANDLE_MAGIC ? handle : NULL;
}

static int reply_bad_handle(void* model_buf, void** output_data, int* output_size) {
    if (!model_buf)
        return reply_text(RECSERVE_BAD_REQUEST, output_data, output_size, "model_buf is NULL: call initialize first");
    return reply_text(RECSERVE_BAD_REQUEST, output_data, output_size,
                      "model_buf is not a handle returned by initialize (or it was destroyed)");
}

static int reply_bad_input(const void* input_data, int input_size, void** output_data, int* output_size) {
    if (input_size < 0)
        return reply_text(RECSERVE_BAD_REQUEST, output_data, output_size,
                          "input_size is %d; it must be >= 0 (0 asks for the serving signature)", input_size);
    return reply_text(RECSERVE_BAD_REQUEST, output_data, output_size,
                      "input_data is NULL but input_size is %d", input_size);
}

static int input_ok(const void* input_data, int input_size) {
    return input_size == 0 || (input_size > 0 && input_data);
}

/* ---- the ABI ------------------------------------------------------------------------ */

/* Resolves recserve.processor.cabi's functions. GIL held; 0 on success, -1 with an exception. */
static int load_cabi(void) {
    if (cabi_process)
        return 0;
    PyObject* module = PyImport_ImportModule("recserve.processor.cabi");
    if (!module)
        return -1;
    if (cabi_process) { /* another thread finished the import while this one waited */
        Py_DECREF(module);
        return 0;
    }
    PyObject* open = PyObject_GetAttrString(module, "open_processor");
    PyObject* batch = PyObject_GetAttrString(module, "process_batch");
    PyObject* info = PyObject_GetAttrString(module, "model_info");
    PyObject* close = PyObject_GetAttrString(module, "close");
    PyObject* load = PyObject_GetAttrString(module, "load_version");
    PyObject* process = PyObject_GetAttrString(module, "process");
    PyObject* native = PyObject_GetAttrString(module, "native_route");
    Py_DECREF(module);
    if (!open || !batch || !info || !close || !load || !process || !native) {
        Py_XDECREF(native);
        Py_XDECREF(open);
        Py_XDECREF(batch);
        Py_XDECREF(info);
        Py_XDECREF(close);
        Py_XDECREF(load);
        Py_XDECREF(process);
        return -1;
    }
    cabi_load_version = load;
    cabi_native_route = native;
    cabi_open = open;
    cabi_batch = batch;
    cabi_info = info;
    cabi_close = close;
    cabi_process = process;
    return 0;
}

/* Asks recserve.processor.cabi.native_route for the route's entry point and the processor's
 * slot; without them (no native route library) every request takes Python. GIL held. */
static void find_route(model_handle* handle) {
    handle->route = NULL;
    handle->slot = NULL;
    handle->batch_native = 0;
    PyObject* result = PyObject_CallFunctionObjArgs(cabi_native_route, handle->processor, NULL);
    unsigned long long route = 0, slot = 0;
    int batch_native = 0;
    if (result && PyArg_ParseTuple(result, "KKp", &route, &slot, &batch_native) && route && slot) {
        handle->route = (route_process_fn)(uintptr_t)route;
        handle->slot = (rs_route_slot*)(uintptr_t)slot;
        handle->batch_native = batch_native;
    }
    if (PyErr_Occurred()) {
        char* text = exception_text();
        fprintf(stderr, "[recserve] the native route is off for this model: %s\n", text ? text : "");
        free(text);
    }
    Py_XDECREF(result);
}

/* The native route's response to one request: 1 with it in *output_data, 0 to take Python. */
static int serve_native(model_handle* handle, const void* input_data, int input_size, void** output_data,
                        int* output_size, int* status) {
    if (!handle->route || input_size <= 0)
        return 0;
    uint8_t* out = NULL;
    int64_t size = 0;
    if (handle->route(handle->slot, input_data, input_size, &out, &size, NULL) != 200)
        return 0;
    if (size > INT_MAX) {
        free(out);
        *status = reply_text(RECSERVE_INTERNAL_ERROR, output_data, output_size,
                             "response is %lld bytes, more than output_size (an int) can hold", (long long)size);
        return 1;
    }
    *output_data = out;
    *output_size = (int)size;
    *status = RECSERVE_OK;
    return 1;
}

/* Creates the Processor; returns the handle or NULL with a malloc'ed reason. GIL held. */
static model_handle* open_model(const char* model_entry, const char* model_config, char** reason) {
    if (load_cabi() != 0) {
        *reason = exception_text();
        return NULL;
    }
    PyObject* result = PyObject_CallFunction(cabi_open, "yy", model_entry, model_config);
    if (!result) {
        *reason = exception_text();
        return NULL;
    }
    model_handle* handle = NULL;
    PyObject* processor = PyTuple_Check(result) && PyTuple_GET_SIZE(result) == 2 ? PyTuple_GET_ITEM(result, 0) : NULL;
    if (processor && processor != Py_None) {
        handle = malloc(sizeof *handle);
        if (handle) {
            handle->magic = HANDLE_MAGIC;
            handle->processor = Py_NewRef(processor);
            find_route(handle);
        } else {
            *reason = strdup("out of memory");
        }
    } else if (processor && PyUnicode_Check(PyTuple_GET_ITEM(result, 1))) {
        const char* text = PyUnicode_AsUTF8(PyTuple_GET_ITEM(result, 1));
        *reason = text ? strdup(text) : exception_text();
    } else {
        *reason = strdup("recserve.processor.cabi.open_processor returned an unexpected value");
    }
    Py_DECREF(result);
    return handle;
}

void* initialize(const char* model_entry, const char* model_config, int* state) {
    if (state)
        *state = -1;
    if (!model_config) {
        fprintf(stderr, "[recserve] initialize failed: model_config is NULL; pass the processor JSON config\n");
        return NULL;
    }
    pthread_once(&interpreter_once, start_interpreter);
    pthread_once(&host_thread_once, create_host_thread_key);
    if (interpreter_error[0]) {
        fprintf(stderr, "[recserve] initialize failed: %s\n", interpreter_error);
        return NULL;
    }
    char* reason = NULL;
    python_entry entry = enter_python();
    model_handle* handle = open_model(model_entry ? model_entry : "", model_config, &reason);
    leave_python(entry);
    if (!handle) {
        fprintf(stderr, "[recserve] initialize failed: %s\n", reason ? reason : "out of memory");
        free(reason);
        return NULL;
    }
    if (state)
        *state = 0;
    return handle;
}

int process(void* model_buf, const void* input_data, int input_size, void** output_data, int* output_size) {
    if (!output_data || !output_size)
        return RECSERVE_BAD_REQUEST;
    model_handle* handle = as_handle(model_buf);
    if (!handle)
        return reply_bad_handle(model_buf, output_data, output_size);
    if (!input_ok(input_data, input_size))
        return reply_bad_input(input_data, input_size, output_data, output_size);
    int served;
    if (serve_native(handle, input_data, input_size, output_data, output_size, &served))
        return served; /* the steady path: no GIL taken */

    python_entry entry = enter_python();
    PyObject* data = PyBytes_FromStringAndSize(input_data, input_size);
    PyObject* result = data ? PyObject_CallFunctionObjArgs(cabi_process, handle->processor, data, NULL) : NULL;
    int status = reply_result(result, output_data, output_size);
    Py_XDECREF(result);
    Py_XDECREF(data);
    leave_python(entry);
    return status;
}

/* Gives every entry the same error, each in its own buffer. */
static int reply_batch_error(int count, void* output_data[], int output_size[], int status[], int code,
                             const char* text) {
    for (int i = 0; i < count; i++)
        status[i] = reply(code, text, strlen(text), &output_data[i], &output_size[i]);
    return code;
}

/* Fills the entries from cabi.process_batch's list of (status, bytes). GIL held. */
static int reply_batch(PyObject* results, int count, void* output_data[], int output_size[], int status[]) {
    if (!results) {
        char* text = exception_text();
        int code = reply_batch_error(count, output_data, output_size, status, RECSERVE_INTERNAL_ERROR,
                                     text ? text : "internal error");
        free(text);
        return code;
    }
    if (!PyList_Check(results) || PyList_GET_SIZE(results) != count)
        return reply_batch_error(count, output_data, output_size, status, RECSERVE_INTERNAL_ERROR,
                                 "internal error: recserve.processor.cabi.process_batch returned a wrong value");
    int overall = RECSERVE_OK;
    for (int i = 0; i < count; i++) {
        status[i] = reply_result(PyList_GET_ITEM(results, i), &output_data[i], &output_size[i]);
        if (overall == RECSERVE_OK && status[i] != RECSERVE_OK)
            overall = status[i];
    }
    return overall;
}

int batch_process(void* model_buf, int count, const void* const input_data[], const int input_size[],
                  void* output_data[], int output_size[], int status[]) {
    if (count < 0 || !output_data || !output_size || !status)
        return RECSERVE_BAD_REQUEST;
    model_handle* handle = as_handle(model_buf);
    if (!handle) {
        void* text;
        int size;
        int code = reply_bad_handle(model_buf, &text, &size);
        if (text)
            reply_batch_error(count, output_data, output_size, status, code, text);
        free(text);
        return code;
    }
    if (count > 0 && (!input_data || !input_size))
        return reply_batch_error(count, output_data, output_size, status, RECSERVE_BAD_REQUEST,
                                 "input_data and input_size must not be NULL when count > 0");

    for (int i = 0; i < count; i++) {
        if (!input_ok(input_data[i], input_size[i])) {
            void* text;
            int size;
            int code = reply_bad_input(input_data[i], input_size[i], &text, &size);
            char prefixed[600];
            snprintf(prefixed, sizeof prefixed, "request %d: %s", i, text ? (char*)text : "");
            free(text);
            return reply_batch_error(count, output_data, output_size, status, code, prefixed);
        }
    }

    /* Natively served entries are done; the others (`left`, in order) go to Python in one call. */
    int* left = malloc((size_t)(count > 0 ? count : 1) * sizeof(int));
    if (!left)
        return reply_batch_error(count, output_data, output_size, status, RECSERVE_INTERNAL_ERROR, "out of memory");
    int n_left = 0, overall = RECSERVE_OK;
    for (int i = 0; i < count; i++) {
        if (handle->batch_native && serve_native(handle, input_data[i], input_size[i], &output_data[i],
                                                 &output_size[i], &status[i])) {
            if (overall == RECSERVE_OK && status[i] != RECSERVE_OK)
                overall = status[i];
        } else {
            status[i] = -1; /* not served yet */
            left[n_left++] = i;
        }
    }
    if (n_left == 0) {
        free(left);
        return overall;
    }
    void** left_data = calloc((size_t)n_left, sizeof(void*));
    int* left_size = calloc((size_t)n_left, sizeof(int));
    int* left_status = calloc((size_t)n_left, sizeof(int));
    python_entry entry = enter_python();
    PyObject* requests = left_data && left_size && left_status ? PyList_New(n_left) : NULL;
    for (int k = 0; requests && k < n_left; k++) {
        PyObject* data = PyBytes_FromStringAndSize(input_data[left[k]], input_size[left[k]]);
        if (!data) {
            Py_CLEAR(requests);
            break;
        }
        PyList_SET_ITEM(requests, k, data);
    }
    if (!requests) {
        leave_python(entry);
        for (int i = 0; i < count; i++) /* entries already served are freed: all get the error */
            if (status[i] != -1)
                free(output_data[i]);
        free(left), free(left_data), free(left_size), free(left_status);
        return reply_batch_error(count, output_data, output_size, status, RECSERVE_INTERNAL_ERROR, "out of memory");
    }
    PyObject* results = PyObject_CallFunctionObjArgs(cabi_batch, handle->processor, requests, NULL);
    int python_overall = reply_batch(results, n_left, left_data, left_size, left_status);
    Py_XDECREF(results);
    Py_XDECREF(requests);
    leave_python(entry);
    for (int k = 0; k < n_left; k++) {
        output_data[left[k]] = left_data[k];
        output_size[left[k]] = left_size[k];
        status[left[k]] = left_status[k];
    }
    if (overall == RECSERVE_OK)
        overall = python_overall;
    free(left), free(left_data), free(left_size), free(left_status);
    return overall;
}

int get_serving_model_info(void* model_buf, void** output_data, int* output_size) {
    if (!output_data || !output_size)
        return RECSERVE_BAD_REQUEST;
    model_handle* handle = as_handle(model_buf);
    if (!handle)
        return reply_bad_handle(model_buf, output_data, output_size);
    python_entry entry = enter_python();
    PyObject* result = PyObject_CallFunctionObjArgs(cabi_info, handle->processor, NULL);
    int status = reply_result(result, output_data, output_size);
    Py_XDECREF(result);
    leave_python(entry);
    return status;
}

int load_version(void* model_buf, const char* version, void** output_data, int* output_size) {
    if (!output_data || !output_size)
        return RECSERVE_BAD_REQUEST;
    model_handle* handle = as_handle(model_buf);
    if (!handle)
        return reply_bad_handle(model_buf, output_data, output_size);
    python_entry entry = enter_python();
    PyObject* name = version ? PyBytes_FromString(version) : Py_NewRef(Py_None);
    PyObject* result = name ? PyObject_CallFunctionObjArgs(cabi_load_version, handle->processor, name, NULL) : NULL;
    int status = reply_result(result, output_data, output_size);
    Py_XDECREF(result);
    Py_XDECREF(name);
    leave_python(entry);
    return status;
}

void release_buffer(void* buffer) {
    free(buffer);
}

void destroy(void* model_buf) {
    model_handle* handle = as_handle(model_buf);
    if (!handle)
        return;
    handle->magic = 0;
    python_entry entry = enter_python();
    PyObject* result = PyObject_CallFunctionObjArgs(cabi_close, handle->processor, NULL);
    if (!result) {
        char* text = exception_text();
        fprintf(stderr, "[recserve] destroy: %s\n", text ? text : "closing the model failed");
        free(text);
    }
    Py_XDECREF(result);
    Py_DECREF(handle->processor);
    leave_python(entry);
    free(handle);
}
