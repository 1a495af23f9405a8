/* tfs_spec.h: a TF Serving ModelSpec read and written by hand (protobuf wire format). */
#include "tfs_spec.h"
#include "varint.h"

#include <string.h>

int rs_tfs_spec_parse(const uint8_t* data, int64_t size, rs_tfs_spec* spec) {
    memset(spec, 0, sizeof *spec);
    if (!data || size < 2 || data[0] != 0x0A)
        return 0;
    const uint8_t *p = data + 1, *end = data + size;
    uint64_t n;
    if (!rs_varint_get(&p, end, &n) || n > (uint64_t)(end - p))
        return 0;
    const uint8_t* stop = p + n;
    int seen[5] = {0};
    while (p < stop) {
        uint64_t tag, length;
        if (!rs_varint_get(&p, stop, &tag))
            return 0;
        uint64_t field = tag >> 3;
        if ((tag & 7) != 2 || field < 1 || field > 4 || seen[field])
            return 0;
        seen[field] = 1;
        if (!rs_varint_get(&p, stop, &length) || length > (uint64_t)(stop - p))
            return 0;
        const uint8_t* payload = p;
        p += length;
        switch (field) {
        case 1:
            spec->name = payload;
            spec->name_size = (int64_t)length;
            break;
        case 3:
            for (uint64_t i = 0; i < length; i++)
                if (payload[i] >= 0x80) /* protobuf would check its UTF-8: left to it */
                    return 0;
            spec->signature_name = payload;
            spec->signature_name_size = (int64_t)length;
            break;
        case 4:
            spec->version_label = payload;
            spec->version_label_size = (int64_t)length;
            spec->has_label = 1;
            break;
        default: { /* 2: google.protobuf.Int64Value, its value field 1 (varint) or nothing */
            const uint8_t *q = payload, *qend = payload + length;
            uint64_t inner, value = 0;
            if (q < qend && (!rs_varint_get(&q, qend, &inner) || inner != 0x08 || !rs_varint_get(&q, qend, &value) ||
                             q != qend))
                return 0;
            spec->has_version = 1;
            spec->version = (int64_t)value;
        }
        }
    }
    return 1;
}

/* A length-delimited field's size: its tag, its length, the payload's bytes. */
static int64_t field_size(int64_t payload) {
    return 1 + (int64_t)rs_varint_size((uint64_t)payload) + payload;
}

static uint8_t* put_field(uint8_t* out, uint8_t tag, const uint8_t* payload, int64_t size) {
    *out++ = tag;
    out = rs_varint_put(out, (uint64_t)size);
    if (size)
        memcpy(out, payload, (size_t)size);
    return out + size;
}

int64_t rs_tfs_spec_field(const uint8_t* name, int64_t name_size, int64_t version, const uint8_t* signature,
                          int64_t signature_size, uint8_t* out, int64_t cap) {
    /* As protobuf serializes ModelSpec: name (when set), version (an Int64Value, empty when 0,
     * present because it is set), signature_name (when set). */
    int64_t value = version ? 1 + (int64_t)rs_varint_size((uint64_t)version) : 0;
    int64_t spec = (name_size ? field_size(name_size) : 0) + field_size(value) +
                   (signature_size ? field_size(signature_size) : 0);
    int64_t total = field_size(spec);
    if (total > cap)
        return total;
    uint8_t* p = out;
    *p++ = 0x12;
    p = rs_varint_put(p, (uint64_t)spec);
    if (name_size)
        p = put_field(p, 0x0A, name, name_size);
    *p++ = 0x12;
    p = rs_varint_put(p, (uint64_t)value);
    if (version) {
        *p++ = 0x08;
        p = rs_varint_put(p, (uint64_t)version);
    }
    if (signature_size)
        p = put_field(p, 0x1A, signature, signature_size);
    return total;
}
