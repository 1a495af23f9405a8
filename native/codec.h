/* recserve request decoder: tensorflow.eas.PredictRequest wire bytes -> flat buffers that
 * Python turns into numpy arrays with one step per group of alike inputs.
 *
 * One call parses a whole request. It succeeds only when its result is exactly what the
 * generated protobuf parser (upb) followed by recserve.wire.codec's checks would give:
 * fields in any order, packed or unpacked values, packed chunks split in pieces, repeated
 * map entries with the same key (the last one wins), repeated `value`/`array_shape`
 * messages (merged), unknown fields (skipped). Everything else -- malformed bytes, invalid
 * UTF-8 in a string field, an unsupported dtype, a negative dimension, a value count that
 * does not match the shape, a narrow integer out of range, groups, a map entry carrying an
 * unknown field (upb keeps such an entry out of the map), more than RS_CODEC_MAX_DIMS
 * dimensions -- returns -RS_CODEC_FALLBACK, and the caller parses with the generated code,
 * which owns every error message.
 *
 * Outputs (the caller owns both buffers; nothing is allocated here):
 *   values  - every input's values, each input starting on a fresh int64 slot:
 *             varint fields (int64_val, int_val, bool_val) one int64 per value (int_val
 *             truncated to int32, bool_val as 0/1), float_val/double_val as their
 *             little-endian bytes, string_val as (offset into data, length) pairs.
 *             values_cap = size + 1 slots always suffices.
 *   scratch - working space; on success its bytes start with the *layout*, which describes
 *             the result completely except for the values themselves (so equal layouts
 *             decode alike and the caller may cache per layout). Every number is a
 *             protobuf-style varint (all are >= 0), every text its length then its bytes:
 *               signature_name
 *               output_filter:   count, then each name
 *               inputs:          count, then per surviving map entry in wire order:
 *                                key, out kind (RS_CODEC_OUT_*), ndims, dims...,
 *                                first value slot, wire value count
 *             (a complex value counts twice: real and imaginary parts.)
 * Returns the layout's length in bytes (>= 0) or a negated RS_CODEC_* status. On
 * -RS_CODEC_SCRATCH_FULL the caller may retry with a larger scratch.
 *
 * Thread-safety: pure function of its arguments; call it from any number of threads with
 * distinct buffers. The host must be little-endian (x86_64, aarch64).
 */
#ifndef RECSERVE_CODEC_H
#define RECSERVE_CODEC_H

#include <stdint.h>

#define RS_CODEC_API __attribute__((visibility("default")))

enum {
    RS_CODEC_FALLBACK = 1,      /* leave this request to the generated parser */
    RS_CODEC_VALUES_FULL = 2,   /* values_cap too small */
    RS_CODEC_SCRATCH_FULL = 3,  /* scratch_cap too small */
};

enum { RS_CODEC_MAX_DIMS = 8 };

/* numpy dtype of a decoded input. */
enum {
    RS_CODEC_OUT_INT64 = 0,
    RS_CODEC_OUT_INT32 = 1,
    RS_CODEC_OUT_INT16 = 2,
    RS_CODEC_OUT_INT8 = 3,
    RS_CODEC_OUT_UINT8 = 4,
    RS_CODEC_OUT_UINT16 = 5,
    RS_CODEC_OUT_BOOL = 6,
    RS_CODEC_OUT_FLOAT32 = 7,
    RS_CODEC_OUT_FLOAT64 = 8,
    RS_CODEC_OUT_FLOAT16 = 9,
    RS_CODEC_OUT_COMPLEX64 = 10,
    RS_CODEC_OUT_COMPLEX128 = 11,
    RS_CODEC_OUT_STRING = 12,
};

RS_CODEC_API int64_t rs_decode_request(const uint8_t *data, int64_t size,
                                       int64_t *values, int64_t values_cap,
                                       int64_t *scratch, int64_t scratch_cap);

/* tensorflow.serving.PredictRequest wire bytes -> the same values and layout, the layout
 * behind a prefix holding the request's ModelSpec (see codec_tfs.inc for which requests
 * it takes):
 *   model_spec.name, version kind (0 none, 1 version, 2 version_label), then the version
 *   (its int64 as a uint64 varint) or the label
 * (model_spec.signature_name is the layout's signature_name). values_cap = size + 1 slots
 * suffices unless a *_val field's last value repeats to fill a tensor: then
 * -RS_CODEC_VALUES_FULL, and 2 * (size + 1) + 2 * RS_CODEC_TFS_MAX_FILL slots suffice. */
enum { RS_CODEC_TFS_MAX_FILL = 1 << 20 };   /* elements a request's *_val fields may be short of, in all */

RS_CODEC_API int64_t rs_decode_tfs_request(const uint8_t *data, int64_t size,
                                           int64_t *values, int64_t values_cap,
                                           int64_t *scratch, int64_t scratch_cap);

#endif
