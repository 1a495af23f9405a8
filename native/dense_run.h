/* The seam between the native request route (native/route*.c) and the dense run
 * (native/ort_*.c). The route calls a runner through this function pointer; the
 * ONNX Runtime C API runner is one implementation, a test runner may be another.
 * Owned jointly: change it only by agreement (tell the lead). */
#ifndef RECSERVE_DENSE_RUN_H
#define RECSERVE_DENSE_RUN_H
#include <stddef.h>
#include <stdint.h>

#define RS_DENSE_MAX_RANK 8

/* ONNX TensorProto element types used here. */
enum { RS_ELEM_FLOAT = 1, RS_ELEM_INT32 = 6, RS_ELEM_INT64 = 7, RS_ELEM_BOOL = 9, RS_ELEM_DOUBLE = 11 };

typedef struct {
    const char *name;          /* graph input name */
    int32_t elem_type;         /* RS_ELEM_* */
    const int64_t *shape;
    size_t rank;
    const void *data;          /* caller-owned, contiguous row-major; must stay valid for the call */
} rs_tensor_in;

typedef struct {
    int32_t elem_type;
    int64_t shape[RS_DENSE_MAX_RANK];
    size_t rank;
    void *data;                /* malloc'd by the runner; the caller free()s it */
    size_t bytes;
} rs_tensor_out;

/* Runs the dense graph once. Returns 0, or an HTTP-like status (400 bad input, 500 internal)
 * with *err set to a malloc'd UTF-8 message (caller free()s). Thread-safe: many threads may
 * call it on one runner at once. Never touches the Python GIL. On failure no output is left
 * allocated. */
typedef int (*rs_dense_run_fn)(void *runner, const rs_tensor_in *inputs, size_t n_inputs,
                               const char *const *output_names, size_t n_outputs,
                               rs_tensor_out *outputs, char **err);

#endif
