/* recserve.processor._route_call: Python's call into the native request route (route.h).
 *
 * Why a CPython module and not ctypes: a Python thread holds the GIL for everything around
 * rs_route_process, and with ctypes that was most of it (argument conversion, the out
 * parameters, string_at, a second call to free): ~3 us of a ~31 us batch-1 request, during
 * which a second thread finding the GIL taken waits. Here the GIL is held only to read the
 * arguments and to make the response bytes.
 *
 * rs_route_process is librecserve_route.so's, the library native_route.py opened with ctypes
 * (its slots and servables live there): bind() is given its address once, as the C ABI shim
 * is (native_route.route_process_address).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

#include "route.h"

typedef int (*route_process_fn)(rs_route_slot* slot, const uint8_t* data, int64_t size, uint8_t** out,
                                int64_t* out_size, int64_t* info);

typedef int (*route_process_values_fn)(rs_route_slot* slot, const uint8_t* layout, int64_t layout_size,
                                       const int64_t* values, int64_t n_values, const uint8_t* data,
                                       uint8_t** out, int64_t* out_size, int64_t* info);

typedef int64_t (*route_process_many_fn)(rs_route_slot* slot, const uint8_t* const* datas, const int64_t* sizes,
                                         int64_t n, int64_t max_rows, uint8_t** outs, int64_t* out_sizes,
                                         int32_t* statuses, int64_t* infos);

static route_process_fn route_process = NULL, route_process_tfs = NULL;
static route_process_values_fn route_process_values = NULL;
static route_process_many_fn route_process_many = NULL;

/* bind(process, process_tfs, process_values, process_many): the addresses of
 * rs_route_process, rs_route_process_tfs, rs_route_process_values and rs_route_process_many. */
static PyObject* bind(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "bind(process, process_tfs, process_values, process_many) takes 4 arguments, not %zd",
                     nargs);
        return NULL;
    }
    void* addresses[4];
    for (int i = 0; i < 4; i++) {
        addresses[i] = PyLong_AsVoidPtr(args[i]);
        if (!addresses[i]) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError,
                                "bind: the address of rs_route_process(_tfs, _values, _many) must not be 0");
            return NULL;
        }
    }
    route_process = (route_process_fn)addresses[0];
    route_process_tfs = (route_process_fn)addresses[1];
    route_process_values = (route_process_values_fn)addresses[2];
    route_process_many = (route_process_many_fn)addresses[3];
    Py_RETURN_NONE;
}

/* The rs_route_slot whose address is `arg`; NULL with a Python error set. */
static rs_route_slot* slot_of(PyObject* arg, const char* name) {
    rs_route_slot* slot = PyLong_AsVoidPtr(arg);
    if (!slot && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: the slot address must not be 0", name);
    return slot;
}

/* One request's bytes: read in place, or `view` holding a buffer export (release it: a no-op
 * when none was taken); size -1 for an object that is not one contiguous buffer (a strided
 * memoryview: the Python route's). */
static int payload(PyObject* obj, Py_buffer* view, const uint8_t** data, int64_t* size) {
    if (PyBytes_CheckExact(obj)) {
        *data = (const uint8_t*)PyBytes_AS_STRING(obj);
        *size = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear(); /* the Python route's */
        view->obj = NULL;
        *data = NULL;
        *size = -1;
        return 0;
    }
    *data = view->buf;
    *size = view->len;
    return 0;
}

/* One request: 200 with *out (malloc'd) the response, 0 not served, -1 a Python error set.
 * `data`: bytes or any contiguous buffer (bytearray, memoryview), read in place with the GIL
 * released -- its owner must not change it meanwhile (a resize is refused while the view is
 * held); anything else is not served here (the Python route answers it). */
static int call(route_process_fn function, PyObject* const* args, const char* name, uint8_t** out,
                int64_t* out_size, int64_t* info) {
    if (!function) {
        PyErr_Format(PyExc_RuntimeError, "%s: bind(address of rs_route_process) was not called", name);
        return -1;
    }
    rs_route_slot* slot = slot_of(args[0], name);
    if (!slot)
        return -1;
    Py_buffer view = {0};
    const uint8_t* data;
    int64_t size;
    if (payload(args[1], &view, &data, &size) < 0)
        return -1;
    if (size < 0)
        return 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = function(slot, data, size, out, out_size, info);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);   /* a no-op for bytes (view not taken) */
    return status;
}

/* The response bytes, freeing the route's buffer. */
static PyObject* response(uint8_t* out, int64_t out_size) {
    PyObject* bytes = PyBytes_FromStringAndSize((const char*)out, out_size);
    free(out);
    return bytes;
}

/* process(slot, data) -> bytes | None: the PredictResponse bytes, or None when the route did
 * not serve the request (the caller takes the Python route). slot: an rs_route_slot address. */
static PyObject* process(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    uint8_t* out = NULL;
    int64_t out_size = 0;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "process(slot, data) takes 2 arguments, not %zd", nargs);
        return NULL;
    }
    int status = call(route_process, args, "process", &out, &out_size, NULL);
    if (status < 0)
        return NULL;
    if (status != 200)
        Py_RETURN_NONE;   /* nothing allocated */
    return response(out, out_size);
}

/* process_traced(slot, data, tfs) -> (bytes, (servable id, batch, t0, t1, t2, t3, t4)) | None:
 * as process (rs_route_process_tfs when tfs is true), with what a trace records (route.h's
 * RS_INFO_*: the times are CLOCK_MONOTONIC ns at the start, after decode, lookup, run and
 * encode; the servable id also names the version a TF Serving answer must check). */
static PyObject* process_traced(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    uint8_t* out = NULL;
    int64_t out_size = 0, info[RS_INFO_SIZE] = {0};
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "process_traced(slot, data, tfs) takes 3 arguments, not %zd", nargs);
        return NULL;
    }
    int tfs = PyObject_IsTrue(args[2]);
    if (tfs < 0)
        return NULL;
    int status = call(tfs ? route_process_tfs : route_process, args, "process_traced", &out, &out_size, info);
    if (status < 0)
        return NULL;
    if (status != 200)
        Py_RETURN_NONE;
    PyObject* bytes = response(out, out_size);
    if (!bytes)
        return NULL;
    return Py_BuildValue("N(LLLLLLL)", bytes, (long long)info[RS_INFO_SERVABLE], (long long)info[RS_INFO_BATCH],
                         (long long)info[RS_INFO_T0], (long long)info[RS_INFO_T0 + 1], (long long)info[RS_INFO_T0 + 2],
                         (long long)info[RS_INFO_T0 + 3], (long long)info[RS_INFO_T0 + 4]);
}

/* process_values(slot, layout, values, data) -> (bytes | None, info): a request already
 * decoded (rs_route_process_values: `layout` and `values`, bytes of int64 slots, as
 * rs_decode_request leaves them; string spans are offsets into `data`), with route.h's
 * RS_INFO_* as a tuple (servable id, batch, t0..t4, fallback reason) whether served or not:
 * the caller reads a route miss's reason from it. */
static PyObject* process_values(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    uint8_t* out = NULL;
    int64_t out_size = 0, info[RS_INFO_SIZE] = {0};
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "process_values(slot, layout, values, data) takes 4 arguments, not %zd", nargs);
        return NULL;
    }
    if (!route_process_values) {
        PyErr_SetString(PyExc_RuntimeError, "process_values: bind() was not called");
        return NULL;
    }
    rs_route_slot* slot = slot_of(args[0], "process_values");
    if (!slot)
        return NULL;
    for (int i = 1; i < 4; i++)
        if (!PyBytes_CheckExact(args[i])) {
            PyErr_Format(PyExc_TypeError, "process_values: argument %d must be bytes", i + 1);
            return NULL;
        }
    const uint8_t* layout = (const uint8_t*)PyBytes_AS_STRING(args[1]);
    int64_t layout_size = PyBytes_GET_SIZE(args[1]);
    const int64_t* values = (const int64_t*)PyBytes_AS_STRING(args[2]);
    int64_t n_values = PyBytes_GET_SIZE(args[2]) / (Py_ssize_t)sizeof(int64_t);
    const uint8_t* data = (const uint8_t*)PyBytes_AS_STRING(args[3]);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = route_process_values(slot, layout, layout_size, values, n_values, data, &out, &out_size, info);
    Py_END_ALLOW_THREADS
    PyObject* bytes;
    if (status == 200) {
        bytes = response(out, out_size);
        if (!bytes)
            return NULL;
    } else {
        bytes = Py_NewRef(Py_None);
    }
    return Py_BuildValue("N(LLLLLLLL)", bytes, (long long)info[RS_INFO_SERVABLE], (long long)info[RS_INFO_BATCH],
                         (long long)info[RS_INFO_T0], (long long)info[RS_INFO_T0 + 1], (long long)info[RS_INFO_T0 + 2],
                         (long long)info[RS_INFO_T0 + 3], (long long)info[RS_INFO_T0 + 4],
                         (long long)info[RS_INFO_REASON]);
}

/* process_many(slot, payloads, max_rows) -> list: rs_route_process_many over a list of EAS
 * PredictRequests (bytes or contiguous buffers, read in place with the GIL released), per
 * request None when the route did not serve it (counted natively; an object that is not a
 * buffer is neither served nor counted), else (response bytes, (servable id, batch, merged,
 * t0, t1, lookup start, t2, run start, t3, encode start, t4)): `merged` the requests in its
 * dense run, the times CLOCK_MONOTONIC ns (route.h's RS_INFO_*). */
static PyObject* process_many(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "process_many(slot, payloads, max_rows) takes 3 arguments, not %zd", nargs);
        return NULL;
    }
    if (!route_process_many) {
        PyErr_SetString(PyExc_RuntimeError, "process_many: bind() was not called");
        return NULL;
    }
    rs_route_slot* slot = slot_of(args[0], "process_many");
    if (!slot)
        return NULL;
    if (!PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "process_many: payloads must be a list");
        return NULL;
    }
    long long max_rows = PyLong_AsLongLong(args[2]);
    if (max_rows == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[1]);
    PyObject* payloads = Py_NewRef(args[1]); /* its items stay alive while their bytes are read */
    PyObject* result = NULL;
    Py_buffer* views = PyMem_Calloc((size_t)n + 1, sizeof *views);
    const uint8_t** datas = PyMem_Calloc((size_t)n + 1, sizeof *datas);
    int64_t* sizes = PyMem_Calloc((size_t)n + 1, sizeof *sizes);
    uint8_t** outs = PyMem_Calloc((size_t)n + 1, sizeof *outs);
    int64_t* out_sizes = PyMem_Calloc((size_t)n + 1, sizeof *out_sizes);
    int32_t* statuses = PyMem_Calloc((size_t)n + 1, sizeof *statuses);
    int64_t* infos = PyMem_Calloc(((size_t)n + 1) * RS_INFO_SIZE, sizeof *infos);
    Py_ssize_t exported = 0; /* views[0..exported) may hold exports */
    if (!views || !datas || !sizes || !outs || !out_sizes || !statuses || !infos) {
        PyErr_NoMemory();
        goto done;
    }
    for (; exported < n; exported++)
        if (payload(PyList_GET_ITEM(payloads, exported), &views[exported], &datas[exported], &sizes[exported]) < 0)
            goto done;
    /* Requests that are not buffers stay out of the call (uncounted, as process's). */
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (sizes[i] >= 0)
            m++;
    const uint8_t** call_datas = datas;
    int64_t* call_sizes = sizes;
    if (m != n) { /* pack them to the front; the rest is unpacked below */
        Py_ssize_t at = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (sizes[i] >= 0) {
                datas[at] = datas[i];
                sizes[at++] = sizes[i];
            }
    }
    Py_BEGIN_ALLOW_THREADS
    route_process_many(slot, call_datas, call_sizes, m, max_rows, outs, out_sizes, statuses, infos);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (Py_ssize_t i = 0, k = 0; i < n; i++) {
        int buffer = views[i].obj != NULL || PyBytes_CheckExact(PyList_GET_ITEM(payloads, i));
        PyObject* item;
        if (!buffer || statuses[k] != 200) {
            item = Py_NewRef(Py_None);
        } else {
            const int64_t* info = infos + k * RS_INFO_SIZE;
            PyObject* bytes = result ? PyBytes_FromStringAndSize((const char*)outs[k], out_sizes[k]) : NULL;
            item = bytes ? Py_BuildValue(
                               "N(LLLLLLLLLLL)", bytes, (long long)info[RS_INFO_SERVABLE],
                               (long long)info[RS_INFO_BATCH], (long long)info[RS_INFO_MERGED],
                               (long long)info[RS_INFO_T0], (long long)info[RS_INFO_T0 + 1],
                               (long long)info[RS_INFO_STARTS], (long long)info[RS_INFO_T0 + 2],
                               (long long)info[RS_INFO_STARTS + 1], (long long)info[RS_INFO_T0 + 3],
                               (long long)info[RS_INFO_STARTS + 2], (long long)info[RS_INFO_T0 + 4])
                         : NULL;
        }
        if (buffer) {
            free(outs[k]); /* every response is freed, whether or not its bytes were made */
            k++;
        }
        if (result && item)
            PyList_SET_ITEM(result, i, item);
        else if (result) {
            Py_CLEAR(result);
        } else
            Py_XDECREF(item);
    }
done:
    for (Py_ssize_t i = 0; views && i < exported; i++)
        if (views[i].obj)
            PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(datas);
    PyMem_Free(sizes);
    PyMem_Free(outs);
    PyMem_Free(out_sizes);
    PyMem_Free(statuses);
    PyMem_Free(infos);
    Py_DECREF(payloads);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(process, process_tfs, process_values, process_many): use rs_route_process(_tfs, _values, _many) at "
     "these addresses."},
    {"process_many", (PyCFunction)(void (*)(void))process_many, METH_FASTCALL,
     "process_many(slot, payloads, max_rows) -> [None | (bytes, (servable, batch, merged, t0, t1, lookup start, t2, "
     "run start, t3, encode start, t4))]: request merging on the native route, the GIL released."},
    {"process", (PyCFunction)(void (*)(void))process, METH_FASTCALL,
     "process(slot, data) -> bytes | None: one request on the native route, the GIL released."},
    {"process_traced", (PyCFunction)(void (*)(void))process_traced, METH_FASTCALL,
     "process_traced(slot, data, tfs) -> (bytes, (servable, batch, t0, t1, t2, t3, t4)) | None: process "
     "(rs_route_process_tfs if tfs), with its trace."},
    {"process_values", (PyCFunction)(void (*)(void))process_values, METH_FASTCALL,
     "process_values(slot, layout, values, data) -> (bytes | None, (servable, batch, t0, t1, t2, t3, t4, reason)): "
     "a request already decoded, on the native route, the GIL released."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_route_call", "Python's call into the native request route (native/route.h).", 0,
    methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__route_call(void) {
    return PyModuleDef_Init(&module);
}
