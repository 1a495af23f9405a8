/* libFuzzer target: rs_tfs_spec_parse and rs_tfs_spec_field (native/tfs_spec.c), the gRPC
 * front end's reading of a TF Serving PredictRequest's ModelSpec and its writing of the
 * response's, on arbitrary bytes.
 *
 * Beyond "no crash, no sanitizer report" it checks:
 *   - an accepted spec's spans lie inside the spec's own bytes;
 *   - the spec written back from what was read (its name, version and signature) reads
 *     back the same, behind the response's field tag 2 re-tagged as field 1;
 *   - rs_tfs_spec_field asked with too little room writes nothing and names the size it needs.
 */
#include <string.h>

#include "fuzz_input.h"
#include "tfs_spec.h"

static int inside(const uint8_t* span, int64_t size, const uint8_t* data, size_t n) {
    return size == 0 || (span >= data && size >= 0 && span + size <= data + n);
}

static int same(const uint8_t* a, int64_t a_size, const uint8_t* b, int64_t b_size) {
    return a_size == b_size && (a_size == 0 || memcmp(a, b, (size_t)a_size) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    uint8_t* request = malloc(size ? size : 1);
    memcpy(request, data, size);
    rs_tfs_spec spec;
    if (rs_tfs_spec_parse(request, (int64_t)size, &spec)) {
        CHECK(inside(spec.name, spec.name_size, request, size));
        CHECK(inside(spec.version_label, spec.version_label_size, request, size));
        CHECK(inside(spec.signature_name, spec.signature_name_size, request, size));
        CHECK(spec.has_version || spec.version == 0);
        int64_t need = rs_tfs_spec_field(spec.name, spec.name_size, spec.version, spec.signature_name,
                                         spec.signature_name_size, NULL, 0);
        CHECK(need >= 4);
        uint8_t* field = malloc((size_t)need);
        uint8_t canary = 0xA5;
        if (need > 1) {
            memset(field, canary, (size_t)need);
            CHECK(rs_tfs_spec_field(spec.name, spec.name_size, spec.version, spec.signature_name,
                                    spec.signature_name_size, field, need - 1) == need);
            for (int64_t i = 0; i < need; i++)
                CHECK(field[i] == canary);
        }
        CHECK(rs_tfs_spec_field(spec.name, spec.name_size, spec.version, spec.signature_name,
                                spec.signature_name_size, field, need) == need);
        CHECK(field[0] == 0x12);
        field[0] = 0x0A; /* the response's field 2 read as a request's field 1 */
        rs_tfs_spec again;
        CHECK(rs_tfs_spec_parse(field, need, &again));
        CHECK(same(again.name, again.name_size, spec.name, spec.name_size));
        CHECK(same(again.signature_name, again.signature_name_size, spec.signature_name, spec.signature_name_size));
        CHECK(again.has_version && again.version == spec.version && !again.has_label);
        free(field);
    }
    free(request);
    return 0;
}
