/* recserve's C ABI: DeepRec's serving processor interface (libserving_processor.so).
 *
 * A host (an RPC framework in C/C++, Go via cgo, Java via JNI) dlopens the library and calls
 * initialize / process / get_serving_model_info exactly as with DeepRec's processor: same
 * symbols, same JSON config, same predict.proto bytes. The library embeds CPython: in a
 * host without an interpreter it starts one on the first initialize (installing no signal
 * handlers) and finds the installed recserve package itself; in a Python host it uses the
 * running interpreter. All functions may be called concurrently from any number of threads.
 *
 * Buffers: every buffer returned through output_data — response bytes or error text — is
 * allocated with malloc; the caller frees it with free() (or release_buffer). It is followed
 * by a '\0' that output_size does not count, so error text can be printed as a C string.
 *
 * Status codes (the return value of process, batch_process, get_serving_model_info):
 *   200  OK: output_data holds PredictResponse (or ServingModelInfo) bytes
 *   400  bad request: malformed bytes, unknown input/output name, wrong dtype or shape,
 *        or a bad argument to the call itself (NULL model_buf, negative input_size)
 *   500  internal error
 *   503  no model version is loaded yet
 * On any status but 200, output_data holds a UTF-8 message saying what was wrong.
 * Nothing a caller passes aborts the process.
 */
#ifndef RECSERVE_PROCESSOR_H
#define RECSERVE_PROCESSOR_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RECSERVE_API __attribute__((visibility("default")))
#else
#define RECSERVE_API
#endif

enum {
    RECSERVE_OK = 200,
    RECSERVE_BAD_REQUEST = 400,
    RECSERVE_INTERNAL_ERROR = 500,
    RECSERVE_NOT_READY = 503,
};

/* Loads a model and returns its handle (DeepRec's "model_buf"), or NULL on failure.
 * model_entry: the model's name in logs and model info; "" or NULL means "default".
 * model_config: DeepRec's processor JSON (the config file's content, or the EAS wrapper
 *   {"model_config": {...}}).
 * state: set to 0 on success, -1 on failure (the reason is written to stderr); may be NULL.
 * Each call returns an independent handle: several models may be served in one process. */
RECSERVE_API void* initialize(const char* model_entry, const char* model_config, int* state);

/* Serves one PredictRequest (protobuf bytes). *output_data receives a malloc'ed buffer of
 * *output_size bytes: PredictResponse bytes on 200, a message otherwise.
 * input_size == 0 returns 200 and a JSON description of the serving signature.
 * If output_data or output_size is NULL nothing can be returned: 400, nothing allocated. */
RECSERVE_API int process(void* model_buf, const void* input_data, int input_size,
                         void** output_data, int* output_size);

/* Serves `count` independent requests in one call (one interpreter entry instead of
 * `count`). Entry i of output_data / output_size / status receives request i's buffer,
 * size and status exactly as process would return them; every entry is filled, so every
 * output_data[i] must be freed. Returns 200 when every request returned 200, else the
 * status of the first request that did not. A bad call (NULL model_buf, count < 0, a NULL
 * array) returns 400; when the output arrays are usable each entry then holds the message.
 * With dynamic batching on (max_batch_size > 0) the requests are served concurrently and
 * merged into shared runs (a merged run may round a float output differently in its last
 * bit); otherwise one after another.
 * This replaces DeepRec's batch_process, whose signature carried no request count. */
RECSERVE_API int batch_process(void* model_buf, int count,
                               const void* const input_data[], const int input_size[],
                               void* output_data[], int output_size[], int status[]);

/* ServingModelInfo protobuf bytes of the version being served (model_path, version,
 * global step, update time), or a message on error; the buffer is malloc'ed as above. */
RECSERVE_API int get_serving_model_info(void* model_buf, void** output_data, int* output_size);

/* recserve addition: serve full version `version` (a directory name under checkpoint_dir)
 * and its deltas from now on, pinned — a rollback. NULL or "" unpins: the newest complete
 * version serves again. Loading runs on the calling thread and never interrupts serving; on
 * success returns 200 with the model info as JSON, otherwise the status and a message (then
 * the served version is unchanged). Buffers as above. */
RECSERVE_API int load_version(void* model_buf, const char* version, void** output_data, int* output_size);

/* free() for buffers returned by this library, for hosts that cannot call free directly. */
RECSERVE_API void release_buffer(void* buffer);

/* Stops serving a handle and frees it. Call it only once every call on that handle has
 * returned; the handle is invalid afterwards. Other handles are unaffected. NULL is a no-op.
 * The interpreter itself stays up for the life of the process. */
RECSERVE_API void destroy(void* model_buf);

/* Pointer types for hosts that resolve the symbols with dlsym. */
typedef void* (*recserve_initialize_fn)(const char*, const char*, int*);
typedef int (*recserve_process_fn)(void*, const void*, int, void**, int*);
typedef int (*recserve_batch_process_fn)(void*, int, const void* const[], const int[], void*[],
                                         int[], int[]);
typedef int (*recserve_get_serving_model_info_fn)(void*, void**, int*);
typedef int (*recserve_load_version_fn)(void*, const char*, void**, int*);
typedef void (*recserve_release_buffer_fn)(void*);
typedef void (*recserve_destroy_fn)(void*);

#ifdef __cplusplus
}
#endif

#endif /* RECSERVE_PROCESSOR_H */
