/* tfs_spec.h: a TF Serving ModelSpec read and written by hand (protobuf wire format). */
#include "tfs_spec.h"

#include <string.h>

/* A varint at *p (before end): advances *p; 0 when malformed or past 64 bits. */
static int varint(const uint8_t** p, const uint8_t* end, uint64_t* value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t byte = *(*p)++;
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = v;
            return 1;
        }
    }
    return 0;
}

int rs_tfs_spec_parse(const uint8_t* data, int64_t size, rs_tfs_spec* spec) {
    memset(spec, 0, sizeof *spec);
    if (!data || size < 2 || data[0] != 0x0A)
        return 0;
    const uint8_t *p = data + 1, *end = data + size;
    uint64_t n;
    if (!varint(&p, end, &n) || n > (uint64_t)(end - p))
        return 0;
    const uint8_t* stop = p + n;
    int seen[5] = {0};
    while (p < stop) {
        uint64_t tag, length;
        if (!varint(&p, stop, &tag))
            return 0;
        uint64_t field = tag >> 3;
        if ((tag & 7) != 2 || field < 1 || field > 4 || seen[field])
            return 0;
        seen[field] = 1;
        if (!varint(&p, stop, &length) || length > (uint64_t)(stop - p))
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
            if (q < qend && (!varint(&q, qend, &inner) || inner != 0x08 || !varint(&q, qend, &value) || q != qend))
                return 0;
            spec->has_version = 1;
            spec->version = (int64_t)value;
        }
        }
    }
    return 1;
}

static int64_t varint_size(uint64_t v) {
    int64_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t* put_varint(uint8_t* out, uint64_t v) {
    while (v >= 0x80) {
        *out++ = (uint8_t)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *out++ = (uint8_t)v;
    return out;
}

static uint8_t* put_field(uint8_t* out, uint8_t tag, const uint8_t* payload, int64_t size) {
    *out++ = tag;
    out = put_varint(out, (uint64_t)size);
    if (size)
        memcpy(out, payload, (size_t)size);
    return out + size;
}

int64_t rs_tfs_spec_field(const uint8_t* name, int64_t name_size, int64_t version, const uint8_t* signature,
                          int64_t signature_size, uint8_t* out, int64_t cap) {
    /* As protobuf serializes ModelSpec: name (when set), version (an Int64Value, empty when 0,
     * present because it is set), signature_name (when set). */
    int64_t value = version ? 1 + varint_size((uint64_t)version) : 0;
    int64_t spec = (name_size ? 1 + varint_size((uint64_t)name_size) + name_size : 0) + 1 + varint_size((uint64_t)value) +
                   value + (signature_size ? 1 + varint_size((uint64_t)signature_size) + signature_size : 0);
    int64_t total = 1 + varint_size((uint64_t)spec) + spec;
    if (total > cap)
        return total;
    uint8_t* p = out;
    *p++ = 0x12;
    p = put_varint(p, (uint64_t)spec);
    if (name_size)
        p = put_field(p, 0x0A, name, name_size);
    *p++ = 0x12;
    p = put_varint(p, (uint64_t)value);
    if (version) {
        *p++ = 0x08;
        p = put_varint(p, (uint64_t)version);
    }
    if (signature_size)
        p = put_field(p, 0x1A, signature, signature_size);
    return total;
}
