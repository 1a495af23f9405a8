/* PredictRequest wire bytes -> values + layout (see codec.h for the contract).
 *
 * Each map entry is walked up to three times: WALK_SHAPE reads its key, dtype and dims and
 * checks every field's framing (the dtype, which picks the value field, may come last);
 * WALK_VALUES copies the values of the field the dtype selects; WALK_CHECK validates
 * packed varint chunks of the other varint fields (upb rejects a malformed chunk even in a
 * field nobody reads) and runs only when such chunks exist. Surviving entries (last one
 * per key) are found with a small hash set once the whole request is read.
 */
#include "codec.h"
#include "varint.h"

#include <stdbool.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "recserve's codec reads packed values in place: it needs a little-endian host"
#endif

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };
enum { F_FLOAT = 3, F_DOUBLE = 4, F_INT = 5, F_STRING = 6, F_INT64 = 7, F_BOOL = 8 };
#define VARINT_FIELDS ((1u << F_INT) | (1u << F_INT64) | (1u << F_BOOL))

enum { OK = 0, FALLBACK = RS_CODEC_FALLBACK, VALUES_FULL = RS_CODEC_VALUES_FULL,
       SCRATCH_FULL = RS_CODEC_SCRATCH_FULL };

/* How one ArrayDataType travels (TF's conventions, as recserve.wire.codec._KINDS). */
typedef struct {
    uint8_t field;        /* value field number; 0 = not supported here */
    uint8_t per_element;  /* complex values travel as (real, imag) pairs */
    uint8_t out;          /* RS_CODEC_OUT_* */
    bool narrow;          /* int_val narrower than int32: range-checked */
    int32_t min, max;
} kind;

static const kind KINDS[] = {
    [1] = {F_FLOAT, 1, RS_CODEC_OUT_FLOAT32, false, 0, 0},        /* DT_FLOAT */
    [2] = {F_DOUBLE, 1, RS_CODEC_OUT_FLOAT64, false, 0, 0},       /* DT_DOUBLE */
    [3] = {F_INT, 1, RS_CODEC_OUT_INT32, false, 0, 0},            /* DT_INT32 */
    [4] = {F_INT, 1, RS_CODEC_OUT_UINT8, true, 0, 255},           /* DT_UINT8 */
    [5] = {F_INT, 1, RS_CODEC_OUT_INT16, true, -32768, 32767},    /* DT_INT16 */
    [6] = {F_INT, 1, RS_CODEC_OUT_INT8, true, -128, 127},         /* DT_INT8 */
    [7] = {F_STRING, 1, RS_CODEC_OUT_STRING, false, 0, 0},        /* DT_STRING */
    [8] = {F_FLOAT, 2, RS_CODEC_OUT_COMPLEX64, false, 0, 0},      /* DT_COMPLEX64 */
    [9] = {F_INT64, 1, RS_CODEC_OUT_INT64, false, 0, 0},          /* DT_INT64 */
    [10] = {F_BOOL, 1, RS_CODEC_OUT_BOOL, false, 0, 0},           /* DT_BOOL */
    [17] = {F_INT, 1, RS_CODEC_OUT_UINT16, true, 0, 65535},       /* DT_UINT16 */
    [18] = {F_DOUBLE, 2, RS_CODEC_OUT_COMPLEX128, false, 0, 0},   /* DT_COMPLEX128 */
    [19] = {F_FLOAT, 1, RS_CODEC_OUT_FLOAT16, false, 0, 0},       /* DT_HALF */
};
#define N_KINDS ((int32_t)(sizeof KINDS / sizeof KINDS[0]))

/* One map entry while the request is read; rows grow down from the end of scratch. */
enum { R_KEY_OFF, R_KEY_LEN, R_DTYPE, R_NDIMS, R_SLOT, R_COUNT, R_ALIVE, R_DIMS,
       ROW_SLOTS = R_DIMS + RS_CODEC_MAX_DIMS };

typedef struct {
    const uint8_t *data, *end;
    int64_t *values, values_cap, nvalues;
    int64_t *scratch, scratch_cap, nrows;
} decoder;

typedef enum { WALK_SHAPE, WALK_VALUES, WALK_CHECK } walk;

/* --- wire primitives (false = malformed) ---------------------------------------------- */

static inline bool get_tag(const uint8_t **pp, const uint8_t *end, uint32_t *field, uint32_t *wt)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end)
            return false;
        uint64_t b = *p++;
        v |= (b & 0x7f) << (7 * i);
        if (b < 0x80) {
            if (v > UINT32_MAX || (v >> 3) == 0)
                return false;
            *pp = p;
            *field = (uint32_t)(v >> 3);
            *wt = (uint32_t)(v & 7);
            return true;
        }
    }
    return false;
}

/* A length: as upb reads one, at most five varint bytes (a longer encoding, even of a small
 * number, is malformed) and below INT32_MAX. */
static inline bool get_len(const uint8_t **pp, const uint8_t *end, const uint8_t **start, int64_t *len)
{
    const uint8_t *p = *pp;
    uint64_t n = 0;
    for (int i = 0;; i++) {
        if (i == 5 || p >= end)
            return false;
        uint64_t b = *p++;
        n |= (b & 0x7f) << (7 * i);
        if (b < 0x80)
            break;
    }
    *pp = p;
    if (n >= INT32_MAX || n > (uint64_t)(end - *pp))
        return false;
    *start = *pp;
    *len = (int64_t)n;
    *pp += n;
    return true;
}

static inline bool skip_field(const uint8_t **pp, const uint8_t *end, uint32_t wt)
{
    uint64_t v;
    const uint8_t *start;
    int64_t len;
    switch (wt) {
    case WT_VARINT:
        return rs_varint_get(pp, end, &v);
    case WT_I64:
    case WT_I32: {
        int64_t width = wt == WT_I64 ? 8 : 4;
        if (end - *pp < width)
            return false;
        *pp += width;
        return true;
    }
    case WT_LEN:
        return get_len(pp, end, &start, &len);
    default:   /* groups (3, 4) and invalid wire types: left to upb */
        return false;
    }
}

/* Unicode's well-formed UTF-8 (Table 3-7), as upb checks proto3 string fields. */
static bool utf8_valid(const uint8_t *s, int64_t n)
{
    int64_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c == 0xE0)
            more = 2, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
            more = 2;
        else if (c == 0xED)
            more = 2, hi = 0x9F;
        else if (c == 0xF0)
            more = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3)
            more = 3;
        else if (c == 0xF4)
            more = 3, hi = 0x8F;
        else
            return false;
        if (n - i <= more || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        i += more + 1;
    }
    return true;
}

/* --- packed varints ------------------------------------------------------------------- */

/* Eight bytes of 7 payload bits each (continuation bits cleared) -> their 56-bit value. */
static inline uint64_t gather7(uint64_t x)
{
    x = ((x & 0x7f007f007f007f00ULL) >> 1) | (x & 0x007f007f007f007fULL);
    x = ((x & 0x3fff00003fff0000ULL) >> 2) | (x & 0x00003fff00003fffULL);
    return ((x & 0x0fffffff00000000ULL) >> 4) | (x & 0x000000000fffffffULL);
}

enum { AS_INT64, AS_INT32, AS_BOOL };

static inline int64_t as_value(uint64_t v, int as)
{
    return as == AS_INT64 ? (int64_t)v : as == AS_INT32 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)(v != 0);
}

/* Decodes the varints of [p, e) into out (room for e - p values: a varint takes at least a
 * byte; NULL to only validate); returns how many, or -1 if the chunk is malformed. */
static inline __attribute__((always_inline)) int64_t
packed_varints(const uint8_t *p, const uint8_t *e, int64_t *out, int as)
{
    int64_t n = 0;
    /* While a longest varint (10 bytes) fits, read words without per-byte bounds checks. */
    while (e - p >= 10) {
        uint64_t w, v;
        memcpy(&w, p, 8);
        uint64_t stops = ~w & 0x8080808080808080ULL;
        if (stops) {
            int bits = __builtin_ctzll(stops) + 1;   /* 8 * length */
            v = gather7(w & 0x7f7f7f7f7f7f7f7fULL & (~0ULL >> (64 - bits)));
            p += bits >> 3;
        } else {
            uint64_t b8 = p[8];
            v = gather7(w & 0x7f7f7f7f7f7f7f7fULL) | (b8 & 0x7f) << 56;
            if (b8 < 0x80) {
                p += 9;
            } else {
                if (p[9] >= 0x80)
                    return -1;
                v |= (uint64_t)p[9] << 63;
                p += 10;
            }
        }
        if (out)
            out[n] = as_value(v, as);
        n++;
    }
    while (p < e) {
        uint64_t v;
        if (!rs_varint_get(&p, e, &v))
            return -1;
        if (out)
            out[n] = as_value(v, as);
        n++;
    }
    return n;
}

static int varints_into(decoder *d, const uint8_t *p, const uint8_t *e, uint32_t field)
{
    int64_t *out = d->values + d->nvalues;
    if (d->values_cap - d->nvalues < e - p)
        return VALUES_FULL;
    int64_t n = field == F_INT64 ? packed_varints(p, e, out, AS_INT64)
              : field == F_INT   ? packed_varints(p, e, out, AS_INT32)
                                 : packed_varints(p, e, out, AS_BOOL);
    if (n < 0)
        return FALLBACK;
    d->nvalues += n;
    return OK;
}

/* --- one map entry ---------------------------------------------------------------------- */

typedef struct {
    int64_t *row;
    uint32_t selected;     /* value field the dtype selects (0: none) */
    uint32_t packed_seen;  /* varint fields that arrived as packed chunks */
    int64_t fixed_bytes;   /* WALK_VALUES: bytes of float/double values copied so far */
    int64_t count;         /* WALK_VALUES: values collected so far */
} entry;

static int add_dim(entry *en, uint64_t v)
{
    int64_t *row = en->row;
    if (row[R_NDIMS] == RS_CODEC_MAX_DIMS)
        return FALLBACK;
    row[R_DIMS + row[R_NDIMS]++] = (int64_t)v;
    return OK;
}

static int walk_shape_message(entry *en, const uint8_t *p, const uint8_t *e)
{
    while (p < e) {
        uint32_t field, wt;
        if (!get_tag(&p, e, &field, &wt))
            return FALLBACK;
        if (field != 1) {
            if (!skip_field(&p, e, wt))
                return FALLBACK;
            continue;
        }
        uint64_t v;
        if (wt == WT_VARINT) {
            if (!rs_varint_get(&p, e, &v) || add_dim(en, v) != OK)
                return FALLBACK;
        } else if (wt == WT_LEN) {
            const uint8_t *q, *qe;
            int64_t len;
            if (!get_len(&p, e, &q, &len))
                return FALLBACK;
            for (qe = q + len; q < qe;)
                if (!rs_varint_get(&q, qe, &v) || add_dim(en, v) != OK)
                    return FALLBACK;
        } else {
            return FALLBACK;
        }
    }
    return OK;
}

static int fixed_into(decoder *d, entry *en, const uint8_t *src, int64_t n)
{
    int64_t end_slot = d->nvalues + (en->fixed_bytes + n + 7) / 8;
    if (end_slot > d->values_cap)
        return VALUES_FULL;
    memcpy((uint8_t *)(d->values + d->nvalues) + en->fixed_bytes, src, (size_t)n);
    en->fixed_bytes += n;
    return OK;
}

/* The wire types a value field may take: packed (WT_LEN) or one value per tag. */
static uint32_t scalar_wire_type(uint32_t field)
{
    return field == F_FLOAT ? WT_I32 : field == F_DOUBLE ? WT_I64 : field == F_STRING ? WT_LEN : WT_VARINT;
}

static int walk_array(decoder *d, entry *en, const uint8_t *p, const uint8_t *e, walk how)
{
    while (p < e) {
        uint32_t field, wt;
        if (!get_tag(&p, e, &field, &wt))
            return FALLBACK;
        if (field < 1 || field > F_BOOL) {
            if (!skip_field(&p, e, wt))
                return FALLBACK;
            continue;
        }
        const uint8_t *q;
        int64_t len;
        uint64_t v;
        if (field == 1 || field == 2) {   /* dtype, array_shape */
            if (wt != (field == 1 ? WT_VARINT : WT_LEN))
                return FALLBACK;
            if (field == 1 ? !rs_varint_get(&p, e, &v) : !get_len(&p, e, &q, &len))
                return FALLBACK;
            if (how != WALK_SHAPE)
                continue;
            if (field == 1)
                en->row[R_DTYPE] = (int32_t)(uint32_t)v;   /* an open enum: int32, as upb stores it */
            else if (walk_shape_message(en, q, q + len) != OK)
                return FALLBACK;
            continue;
        }
        uint32_t width = field == F_FLOAT ? 4 : field == F_DOUBLE ? 8 : 0;
        bool chosen = field == en->selected;
        int status = OK;
        if (wt == WT_LEN) {
            if (!get_len(&p, e, &q, &len))
                return FALLBACK;
            if (field == F_STRING) {
                if (how == WALK_VALUES && chosen) {
                    if (d->nvalues + 2 > d->values_cap)
                        return VALUES_FULL;
                    d->values[d->nvalues++] = q - d->data;
                    d->values[d->nvalues++] = len;
                    en->count++;
                }
            } else if (width) {
                if (len % width)
                    return FALLBACK;
                if (how == WALK_VALUES && chosen) {
                    status = fixed_into(d, en, q, len);
                    en->count += len / width;
                }
            } else if (how == WALK_SHAPE) {
                en->packed_seen |= 1u << field;
            } else if (how == WALK_VALUES && chosen) {
                int64_t before = d->nvalues;
                status = varints_into(d, q, q + len, field);
                en->count += d->nvalues - before;
            } else if (how == WALK_CHECK && !chosen) {
                status = packed_varints(q, q + len, NULL, AS_INT64) < 0 ? FALLBACK : OK;
            }
        } else if (wt == scalar_wire_type(field)) {
            q = p;
            if (!skip_field(&p, e, wt))
                return FALLBACK;
            if (how == WALK_VALUES && chosen) {
                status = width ? fixed_into(d, en, q, width) : varints_into(d, q, p, field);
                en->count++;
            }
        } else {
            return FALLBACK;   /* upb would keep it as an unknown field: let upb say what that means */
        }
        if (status != OK)
            return status;
    }
    return OK;
}

/* Walks the `value` messages of one entry ([p, e) = the entry's bytes). */
static int walk_entry(decoder *d, entry *en, const uint8_t *p, const uint8_t *e, walk how)
{
    while (p < e) {
        uint32_t field, wt;
        const uint8_t *q;
        int64_t len;
        /* Anything but key/value makes upb keep the whole entry out of the map. */
        if (!get_tag(&p, e, &field, &wt) || (field != 1 && field != 2) || wt != WT_LEN || !get_len(&p, e, &q, &len))
            return FALLBACK;
        if (field == 1) {
            if (how == WALK_SHAPE) {
                if (!utf8_valid(q, len))
                    return FALLBACK;
                en->row[R_KEY_OFF] = q - d->data;
                en->row[R_KEY_LEN] = len;
            }
            continue;
        }
        int status = walk_array(d, en, q, q + len, how);
        if (status != OK)
            return status;
    }
    return OK;
}

static int read_entry(decoder *d, const uint8_t *p, const uint8_t *e)
{
    if ((d->nrows + 1) * ROW_SLOTS > d->scratch_cap)
        return SCRATCH_FULL;
    entry en = {.row = d->scratch + d->scratch_cap - (d->nrows + 1) * ROW_SLOTS};
    memset(en.row, 0, ROW_SLOTS * sizeof(int64_t));
    en.row[R_KEY_OFF] = p - d->data;
    int status = walk_entry(d, &en, p, e, WALK_SHAPE);
    if (status != OK)
        return status;
    int64_t dtype = en.row[R_DTYPE];
    en.selected = dtype > 0 && dtype < N_KINDS ? KINDS[dtype].field : 0;
    if ((en.packed_seen & VARINT_FIELDS & ~(1u << en.selected)) &&
        (status = walk_entry(d, &en, p, e, WALK_CHECK)) != OK)
        return status;
    en.row[R_SLOT] = d->nvalues;
    if (en.selected && (status = walk_entry(d, &en, p, e, WALK_VALUES)) != OK)
        return status;
    d->nvalues += (en.fixed_bytes + 7) / 8;
    en.row[R_COUNT] = en.count;
    d->nrows++;
    return OK;
}

/* --- the request ------------------------------------------------------------------------ */

static int64_t *row_at(const decoder *d, int64_t i)
{
    return d->scratch + d->scratch_cap - (i + 1) * ROW_SLOTS;
}

static bool same_key(const decoder *d, const int64_t *a, const int64_t *b)
{
    return a[R_KEY_LEN] == b[R_KEY_LEN] &&
           memcmp(d->data + a[R_KEY_OFF], d->data + b[R_KEY_OFF], (size_t)a[R_KEY_LEN]) == 0;
}

/* Marks the last entry of each key alive (a map keeps the last), with a hash set in the
 * free front of scratch. */
static int mark_survivors(decoder *d)
{
    int64_t size = 8;
    while (size < 2 * d->nrows)
        size *= 2;
    if (size + d->nrows * ROW_SLOTS > d->scratch_cap)
        return SCRATCH_FULL;
    int64_t *set = d->scratch;   /* row index + 1; 0 = empty */
    memset(set, 0, (size_t)size * sizeof(int64_t));
    for (int64_t i = d->nrows - 1; i >= 0; i--) {
        int64_t *row = row_at(d, i);
        uint64_t h = 1469598103934665603ULL;   /* FNV-1a */
        for (int64_t k = 0; k < row[R_KEY_LEN]; k++)
            h = (h ^ d->data[row[R_KEY_OFF] + k]) * 1099511628211ULL;
        uint64_t at = h & (uint64_t)(size - 1);
        row[R_ALIVE] = 1;
        while (set[at]) {
            if (same_key(d, row_at(d, set[at] - 1), row)) {
                row[R_ALIVE] = 0;
                break;
            }
            at = (at + 1) & (uint64_t)(size - 1);
        }
        if (row[R_ALIVE])
            set[at] = i + 1;
    }
    return OK;
}

typedef struct {
    uint8_t *out;
    int64_t at, cap;   /* bytes */
} layout;

static bool put(layout *l, uint64_t v)
{
    if (l->cap - l->at < 10)
        return false;
    while (v >= 0x80) {
        l->out[l->at++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    l->out[l->at++] = (uint8_t)v;
    return true;
}

static bool put_bytes(layout *l, const uint8_t *s, int64_t n)
{
    if (!put(l, (uint64_t)n) || l->cap - l->at < n)
        return false;
    memcpy(l->out + l->at, s, (size_t)n);
    l->at += n;
    return true;
}

/* A surviving entry the codec's checks accept, or FALLBACK. */
static int check_entry(const decoder *d, const int64_t *row)
{
    int64_t dtype = row[R_DTYPE];
    if (dtype <= 0 || dtype >= N_KINDS || KINDS[dtype].field == 0)
        return FALLBACK;
    const kind *k = &KINDS[dtype];
    int64_t need = k->per_element, nonzero = 1;
    for (int64_t i = 0; i < row[R_NDIMS]; i++) {
        int64_t dim = row[R_DIMS + i];
        if (dim < 0 || __builtin_mul_overflow(need, dim, &need))
            return FALLBACK;
        if (dim && __builtin_mul_overflow(nonzero, dim, &nonzero))
            return FALLBACK;
    }
    /* An empty shape with huge other dimensions: numpy cannot make it; the codec says so. */
    if (need != row[R_COUNT] || nonzero > INT32_MAX)
        return FALLBACK;
    if (k->narrow) {
        const int64_t *v = d->values + row[R_SLOT];
        for (int64_t i = 0; i < need; i++)
            if (v[i] < k->min || v[i] > k->max)
                return FALLBACK;
    }
    return OK;
}

/* Calls put_bytes for each output_filter name; a second look at the (already checked) top
 * level. With l == NULL only counts them. */
static int64_t each_filter(const decoder *d, layout *l)
{
    const uint8_t *p = d->data, *q;
    int64_t len, count = 0;
    while (p < d->end) {
        uint32_t field, wt;
        if (!get_tag(&p, d->end, &field, &wt))
            return -FALLBACK;
        if (field != 3) {
            if (!skip_field(&p, d->end, wt))
                return -FALLBACK;
            continue;
        }
        if (!get_len(&p, d->end, &q, &len))
            return -FALLBACK;
        if (l && !put_bytes(l, q, len))
            return -SCRATCH_FULL;
        count++;
    }
    return count;
}

/* Writes the layout at l.at (after a caller's prefix); returns its end, or a negated status. */
static int64_t write_layout_at(decoder *d, const uint8_t *sig, int64_t sig_len, int64_t at)
{
    layout l = {(uint8_t *)d->scratch, at, (d->scratch_cap - d->nrows * ROW_SLOTS) * 8};
    int64_t filters = each_filter(d, NULL), inputs = 0;
    for (int64_t i = 0; i < d->nrows; i++)
        inputs += row_at(d, i)[R_ALIVE];
    if (filters < 0)
        return filters;
    if (!put_bytes(&l, sig, sig_len) || !put(&l, (uint64_t)filters))
        return -SCRATCH_FULL;
    int64_t status = each_filter(d, &l);
    if (status < 0)
        return status;
    if (!put(&l, (uint64_t)inputs))
        return -SCRATCH_FULL;
    for (int64_t i = 0; i < d->nrows; i++) {
        const int64_t *row = row_at(d, i);
        if (!row[R_ALIVE])
            continue;
        if (check_entry(d, row) != OK)
            return -FALLBACK;
        bool fits = put_bytes(&l, d->data + row[R_KEY_OFF], row[R_KEY_LEN]) &&
                    put(&l, KINDS[row[R_DTYPE]].out) && put(&l, (uint64_t)row[R_NDIMS]);
        for (int64_t k = 0; fits && k < row[R_NDIMS]; k++)
            fits = put(&l, (uint64_t)row[R_DIMS + k]);   /* >= 0: check_entry */
        if (!fits || !put(&l, (uint64_t)row[R_SLOT]) || !put(&l, (uint64_t)row[R_COUNT]))
            return -SCRATCH_FULL;
    }
    return l.at;
}

RS_CODEC_API int64_t rs_decode_request(const uint8_t *data, int64_t size, int64_t *values, int64_t values_cap,
                                       int64_t *scratch, int64_t scratch_cap)
{
    decoder d = {data, data + size, values, values_cap, 0, scratch, scratch_cap, 0};
    const uint8_t *p = data, *sig = data, *q;
    int64_t sig_len = 0, len;
    while (p < d.end) {
        uint32_t field, wt;
        if (!get_tag(&p, d.end, &field, &wt))
            return -FALLBACK;
        if (field > 3) {
            if (!skip_field(&p, d.end, wt))
                return -FALLBACK;
            continue;
        }
        if (wt != WT_LEN || !get_len(&p, d.end, &q, &len))
            return -FALLBACK;
        if (field == 2) {
            int status = read_entry(&d, q, q + len);
            if (status != OK)
                return -status;
        } else if (!utf8_valid(q, len)) {
            return -FALLBACK;
        } else if (field == 1) {
            sig = q, sig_len = len;
        }
    }
    int status = mark_survivors(&d);
    if (status != OK)
        return -status;
    return write_layout_at(&d, sig, sig_len, 0);
}

#include "codec_tfs.inc"
