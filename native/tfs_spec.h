/* A TF Serving PredictRequest's leading ModelSpec, read and written without protobuf, for
 * the gRPC front end (grpc_front.cc), which answers TF Serving Predict natively: it needs
 * the model's name, the version or label asked for and the signature name before the
 * route serves the rest (rs_route_process_tfs does not read the spec), and writes the
 * response's model_spec. recserve.wire.tfserving_codec (leading_model_spec,
 * model_spec_field) is the reference; tests/fuzz/fuzz_tfs_spec.c fuzzes both functions.
 * Pure functions, thread-safe. */
#ifndef RECSERVE_TFS_SPEC_H
#define RECSERVE_TFS_SPEC_H

#include <stdint.h>

/* Spans into the request's bytes. */
typedef struct {
    const uint8_t* name;
    int64_t name_size;
    const uint8_t* version_label;
    int64_t version_label_size;
    const uint8_t* signature_name;
    int64_t signature_name_size;
    int has_version, has_label;
    int64_t version;
} rs_tfs_spec;

/* The ModelSpec `data` starts with (field 1 first: serializers write fields in number
 * order): 1 with `spec` filled, or 0 for anything but a plain spec -- no spec first, a
 * field of it twice, an unknown field or wire type, a malformed length, a non-ASCII
 * signature name -- which the caller leaves to a full parser. A second model_spec later in
 * `data` would merge into this one: the native route declines such requests. */
int rs_tfs_spec_parse(const uint8_t* data, int64_t size, rs_tfs_spec* spec);

/* Writes a PredictResponse's model_spec field (2) -- name, version (always present, as an
 * Int64Value), signature name -- into out[cap]; returns its size, or the size it needs
 * when cap is too small (nothing written then). */
int64_t rs_tfs_spec_field(const uint8_t* name, int64_t name_size, int64_t version, const uint8_t* signature,
                          int64_t signature_size, uint8_t* out, int64_t cap);

#endif
