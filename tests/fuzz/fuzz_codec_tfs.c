/* libFuzzer target: rs_decode_tfs_request (native/codec_tfs.inc) on arbitrary bytes.
 *
 * Beyond "no crash, no sanitizer report" it checks what recserve.wire._codec_native relies on
 * (codec.h):
 *   - values_cap = size + 1 suffices unless values repeat to fill a tensor, and then
 *     2 * (size + 1) + 2 * RS_CODEC_TFS_MAX_FILL does: -RS_CODEC_VALUES_FULL never comes back;
 *   - a scratch of 32 slots per input byte always suffices;
 *   - the result does not depend on the scratch size;
 *   - an accepted answer is a well-formed ModelSpec prefix, then a well-formed layout
 *     (fuzz_codec.c's checks) whose every value lies inside the values written.
 */
#define LLVMFuzzerTestOneInput eas_fuzz_one_input
#include "fuzz_codec.c"
#undef LLVMFuzzerTestOneInput

/* The ModelSpec prefix; returns where the layout starts. */
static const uint8_t* skip_prefix(const uint8_t* p, const uint8_t* end) {
    skip_text(&p, end); /* name */
    uint64_t kind = varint(&p, end);
    CHECK(kind <= 2);
    if (kind == 1) varint(&p, end);
    if (kind == 2) skip_text(&p, end);
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    uint8_t* request = malloc(size ? size : 1);
    memcpy(request, data, size);
    int64_t values_cap = (int64_t)size + 1;
    const int64_t big_cap = 32 * (int64_t)size + 64;
    int64_t* values = malloc((size_t)values_cap * sizeof(int64_t));
    int64_t* big = malloc((size_t)big_cap * sizeof(int64_t));

    int64_t n = rs_decode_tfs_request(request, (int64_t)size, values, values_cap, big, big_cap);
    if (n == -RS_CODEC_VALUES_FULL) {
        free(values);
        values_cap = 2 * ((int64_t)size + 1) + 2 * RS_CODEC_TFS_MAX_FILL;
        values = malloc((size_t)values_cap * sizeof(int64_t));
        n = rs_decode_tfs_request(request, (int64_t)size, values, values_cap, big, big_cap);
    }
    CHECK(n >= 0 || n == -RS_CODEC_FALLBACK);
    if (n >= 0) {
        CHECK(n <= big_cap * 8);
        const uint8_t* layout = skip_prefix((const uint8_t*)big, (const uint8_t*)big + n);
        int64_t at = layout - (const uint8_t*)big;
        check_layout(layout, n - at, values, values_cap, (int64_t)size);
        int64_t* values2 =
            redecode_from_small_scratch(rs_decode_tfs_request, request, size, values_cap, big, big_cap, n);
        free(values2);
    }
    free(big);
    free(values);
    free(request);
    return 0;
}
