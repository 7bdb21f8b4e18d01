/* llft_lane.c -- see llft_lane.h. Each function mirrors the SteadyLane method of
 * llft/protocol/messaging/lane.py named in its comment, statement for statement where
 * the order matters (a deadline, a watermark, the clock).
 *
 * The wire codec is compiled into this module (the #include below, one translation
 * unit): the datagram is verified and parsed by llft_wire_open itself, the seal is
 * llft_wire_seal, and the trailer's msgpack is read with the codec's own scalar reader
 * (read_value: ints, strings as strict UTF-8, bins, timestamps). Only what differs is
 * here: unpack_trailer calls msgpack.unpackb with its defaults, under which an ext of
 * type 0..127 is an ExtType value, not an error (the wire refuses it; a negative type
 * other than a timestamp's -1 fails in ExtType's constructor), so containers and exts
 * are walked here and everything else goes to read_value. */
#include "llft_wire.c"
#include "llft_lane.h"

#include <stdlib.h>
#include <string.h>

typedef __int128 i128;      /* order-info positions: a pvn down to -2^63, a last
                             * position up to 2^64 + a datagram's worth of chunks */

#define LN_MAX_MESSAGE_BYTES ((size_t)1 << 20)  /* wire.MAX_MESSAGE_BYTES */
/* Times (us) and durations a loan may hold, and the deadlines: far beyond any clock,
 * and small enough that now + a duration, now - then, and the RTT estimator's sums
 * never overflow int64 (the estimator computes in 128 bits anyway). */
#define LN_TIME_MAX ((int64_t)1 << 61)
#define LN_TIMER_MAX ((int64_t)1 << 62)
#define LN_EXT 100          /* a value class read_value never gives: an ExtType */
#define LN_MIN_MTU 128      /* wire.MIN_MTU_BYTES */

struct llft_lane_codec {
    llft_wire *w;
};

struct llft_lane {
    const llft_wire *w;
    uint32_t mtu, window;
    llft_lane_state st;
    uint8_t group[MAX_GROUP_BYTES], remote[MAX_GROUP_BYTES];
    uint32_t group_len, remote_len;
    llft_lane_slot *slots;      /* window of them, by ring position */
    uint8_t *ring;              /* window * mtu: the datagram of ring position i at i * mtu */
    uint8_t *sec[2];            /* LLFT_LANE_TO_REFLECT, LLFT_LANE_LAST_ORDER_INFO: mtu each */
    uint8_t *scratch;           /* a trailer being built: mtu */
    uint8_t *ctl;               /* the last receive's SECOND_ACK datagram: mtu */
};

/* ---- the codec ---------------------------------------------------------------------- */

llft_lane_codec *llft_lane_codec_new(const uint8_t *key, size_t key_len) {
    llft_lane_codec *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->w = llft_wire_new(key, key_len);
    if (c->w == NULL) { free(c); return NULL; }
    llft_wire_support(c->w, LLFT_LANE_WIRE_VERSION);
    /* BODY_FIELDS of REQUEST and REPLY, in its order (native_lane.py checks it): only
     * these two types are registered, so any other is refused as unknown before its
     * body is looked at -- it is the core's anyway */
    static const char names[] = "offset\0data\0flags";
    static const uint8_t masks[] = {LLFT_WIRE_INT, LLFT_WIRE_BYTES, LLFT_WIRE_INT};
    if (llft_wire_schema(c->w, LLFT_LANE_REQUEST, 1, 3, names, masks) != 0
        || llft_wire_schema(c->w, LLFT_LANE_REPLY, 1, 3, names, masks) != 0
        /* and the control messages the lanes take: empty bodies (a SECOND_ACK: the
         * backup's lane, llft_backup.c; this lane refuses it as another type) */
        || llft_wire_schema(c->w, LLFT_LANE_KEEP_ALIVE, 0, 0, "", masks) != 0
        || llft_wire_schema(c->w, LLFT_LANE_FIRST_ACK, 0, 0, "", masks) != 0
        || llft_wire_schema(c->w, LLFT_LANE_SECOND_ACK, 0, 0, "", masks) != 0) {
        llft_wire_free(c->w);
        free(c);
        return NULL;
    }
    return c;
}

void llft_lane_codec_free(llft_lane_codec *c) {
    if (c == NULL) return;
    llft_wire_free(c->w);
    free(c);
}

/* ---- the lane's memory: one block, made once ------------------------------------------ */

llft_lane *llft_lane_new(const llft_lane_codec *codec, uint32_t mtu, uint32_t window) {
    if (codec == NULL || mtu < LN_MIN_MTU || mtu > MAX_DATAGRAM_BYTES
        || window == 0 || window > LLFT_LANE_MAX_WINDOW)
        return NULL;
    /* (sizes: at most 4096 * 65507 + 4 * 65507 bytes, no overflow in size_t) */
    size_t slots = sizeof(llft_lane_slot) * window;
    size_t bytes = (size_t)mtu * window + 4 * (size_t)mtu;
    llft_lane *L = calloc(1, sizeof *L + slots + bytes);
    if (L == NULL) return NULL;
    L->w = codec->w;
    L->mtu = mtu;
    L->window = window;
    L->slots = (llft_lane_slot *)(L + 1);
    L->ring = (uint8_t *)L->slots + slots;
    L->sec[0] = L->ring + (size_t)mtu * window;
    L->sec[1] = L->sec[0] + mtu;
    L->scratch = L->sec[1] + mtu;
    L->ctl = L->scratch + mtu;
    return L;
}

void llft_lane_free(llft_lane *L) { free(L); }

/* Empty again, for the next loan (its buffers kept: a lane of the MTU of loopback is
 * megabytes, and allocating them at every loan was most of a loan's cost) */
void llft_lane_reset(llft_lane *L) {
    memset(&L->st, 0, sizeof L->st);
    L->group_len = L->remote_len = 0;
}

llft_lane_state *llft_lane_state_of(llft_lane *L) { return &L->st; }

/* ---- numbers -------------------------------------------------------------------------- */

static i128 int_get(llft_lane_int v) {
    return (i128)(((unsigned __int128)(uint64_t)v.hi << 64) | v.lo);
}

static llft_lane_int int_put(i128 x) {
    llft_lane_int v;
    v.lo = (uint64_t)x;
    v.hi = (int64_t)(x >> 64);
    return v;
}

/* Python's a // b (floor), b > 0 */
static i128 floordiv(i128 a, i128 b) {
    i128 q = a / b;
    if (a % b != 0 && a < 0) q--;
    return q;
}

/* tuple comparison of section ends (pvn, last position) */
static int end_cmp(i128 ap, i128 aq, i128 bp, i128 bq) {
    if (ap != bp) return ap < bp ? -1 : 1;
    return aq < bq ? -1 : aq > bq;
}

static int time_ok(int64_t t) { return t >= -LN_TIME_MAX && t <= LN_TIME_MAX; }

/* ---- msgpack out, as msgpack-python's Packer(use_bin_type=True) writes it ------------- */

typedef struct {
    uint8_t *p, *end;
    int ok;                     /* 0 once anything did not fit: the rest is not written */
} wr_t;

static void wr_raw(wr_t *w, const void *src, size_t n) {
    if (!w->ok || (size_t)(w->end - w->p) < n) { w->ok = 0; return; }
    memcpy(w->p, src, n);
    w->p += n;
}

static void wr_byte(wr_t *w, uint8_t b) { wr_raw(w, &b, 1); }

/* a type byte and the low n bytes of v, big-endian */
static void wr_be(wr_t *w, uint8_t type, uint64_t v, int n) {
    uint8_t b[9];
    b[0] = type;
    for (int i = 0; i < n; i++) b[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    wr_raw(w, b, 1 + (size_t)n);
}

/* smallest form, unsigned for any non-negative value (Packer's choice) */
static void wr_uint(wr_t *w, uint64_t v) {
    if (v < 0x80) wr_byte(w, (uint8_t)v);
    else if (v <= 0xff) wr_be(w, 0xcc, v, 1);
    else if (v <= 0xffff) wr_be(w, 0xcd, v, 2);
    else if (v <= 0xffffffffu) wr_be(w, 0xce, v, 4);
    else wr_be(w, 0xcf, v, 8);
}

/* v within msgpack's range [-2^63, 2^64): callers check */
static void wr_int(wr_t *w, i128 v) {
    if (v >= 0) { wr_uint(w, (uint64_t)v); return; }
    uint64_t u = (uint64_t)(int64_t)v;      /* two's complement: the low bytes are it */
    if (v >= -32) wr_byte(w, (uint8_t)u);
    else if (v >= -128) wr_be(w, 0xd0, u, 1);
    else if (v >= -32768) wr_be(w, 0xd1, u, 2);
    else if (v >= -2147483648LL) wr_be(w, 0xd2, u, 4);
    else wr_be(w, 0xd3, u, 8);
}

static void wr_str(wr_t *w, const void *s, size_t n) {
    if (n < 32) wr_byte(w, (uint8_t)(0xa0 | n));
    else if (n <= 0xff) wr_be(w, 0xd9, n, 1);
    else if (n <= 0xffff) wr_be(w, 0xda, n, 2);
    else wr_be(w, 0xdb, n, 4);
    wr_raw(w, s, n);
}

static void wr_bin_head(wr_t *w, size_t n) {
    if (n <= 0xff) wr_be(w, 0xc4, n, 1);
    else if (n <= 0xffff) wr_be(w, 0xc5, n, 2);
    else wr_be(w, 0xc6, n, 4);
}

static void wr_array(wr_t *w, size_t n) {
    if (n < 16) wr_byte(w, (uint8_t)(0x90 | n));
    else if (n <= 0xffff) wr_be(w, 0xdc, n, 2);
    else wr_be(w, 0xdd, n, 4);
}

static size_t uint_size(uint64_t v) {
    return v < 0x80 ? 1 : v <= 0xff ? 2 : v <= 0xffff ? 3 : v <= 0xffffffffu ? 5 : 9;
}

static size_t int_size(i128 v) {
    if (v >= 0) return uint_size((uint64_t)v);
    return v >= -32 ? 1 : v >= -128 ? 2 : v >= -32768 ? 3 : v >= -2147483648LL ? 5 : 9;
}

static size_t bin_size(size_t n) { return (n <= 0xff ? 2 : n <= 0xffff ? 3 : 5) + n; }
static size_t array_head_size(size_t n) { return n < 16 ? 1 : n <= 0xffff ? 3 : 5; }

/* ---- msgpack in, as msgpack.unpackb(raw=False) with its defaults reads it ------------ *
 * On the codec's reader (rd_t, need, be, read_value): the same limits (containers
 * bounded by the buffer's length, 1024 levels, map keys str or bytes only, strict UTF-8,
 * timestamps checked); an ext of any other type is a value (ExtType). Every read is
 * bounded by rd_t's end. */

static int tr_value(rd_t *r, unsigned depth, val_t *v);

/* A container's header, if the next value is one: 1 (consumed: *count, *is_map), 0 (not
 * a container: nothing consumed), -1 (error). */
static int tr_head(rd_t *r, uint64_t *count, int *is_map) {
    if (!need(r, 1)) return -1;
    uint8_t c = r->p[0];
    if (c >= 0x80 && c <= 0x9f) {
        *count = c & 0x0f;
        *is_map = c <= 0x8f;
        r->p++;
        return 1;
    }
    if (c >= 0xdc && c <= 0xdf) {
        int n = c & 1 ? 4 : 2;
        if (!need(r, 1 + (size_t)n)) return -1;
        *count = be(r->p + 1, n);
        *is_map = c >= 0xde;
        r->p += 1 + n;
        return 1;
    }
    return 0;
}

/* msgpack-python's checks when a container starts (its stack, its length bounds) */
static int tr_open(rd_t *r, unsigned depth, uint64_t count, int is_map) {
    if (depth >= MAX_DEPTH || count > (is_map ? r->max_map : r->max_array)) {
        r->err = E_MALFORMED;
        return 0;
    }
    return 1;
}

/* the items of a container whose header was read */
static int tr_items(rd_t *r, unsigned depth, uint64_t count, int is_map, val_t *v) {
    if (!tr_open(r, depth, count, is_map)) return 0;
    for (uint64_t i = 0; i < count; i++) {
        val_t a, b;
        if (!tr_value(r, depth + 1, &a)) return 0;
        if (is_map) {
            if (a.cls != C_STR && a.cls != C_BYTES) { r->err = E_MALFORMED; return 0; }
            if (!tr_value(r, depth + 1, &b)) return 0;
        }
    }
    memset(v, 0, sizeof *v);
    v->cls = is_map ? C_MAP : C_LIST;
    v->u = count;
    return 1;
}

static int tr_value(rd_t *r, unsigned depth, val_t *v) {
    uint64_t count;
    int is_map;
    int h = tr_head(r, &count, &is_map);
    if (h < 0) return 0;
    if (h > 0) return tr_items(r, depth, count, is_map, v);
    uint8_t c = r->p[0];                        /* (tr_head checked one byte is there) */
    size_t len;
    const uint8_t *q;                           /* the ext's type byte */
    if (c >= 0xd4 && c <= 0xd8) {
        len = (size_t)1 << (c - 0xd4);
        q = r->p + 1;
    } else if (c >= 0xc7 && c <= 0xc9) {
        int n = 1 << (c - 0xc7);
        if (!need(r, 1 + (size_t)n)) return 0;
        len = (size_t)be(r->p + 1, n);
        q = r->p + 1 + n;
    } else {
        return read_value(r, depth, v, ROLE_NONE);  /* a scalar: the codec's rules */
    }
    if ((size_t)(r->end - q) < len + 1) { r->err = E_TRUNCATED; return 0; }
    int8_t type = (int8_t)q[0];
    if (type == -1) return read_value(r, depth, v, ROLE_NONE);  /* a timestamp */
    if (type < 0) { r->err = E_MALFORMED; return 0; }   /* ExtType: "code must be 0~127" */
    memset(v, 0, sizeof *v);
    v->cls = LN_EXT;
    r->p = q + 1 + len;
    return 1;
}

/* An int value: 1 (its exact value in *x), 0 (another value, read), -1 (error). */
static int tr_int(rd_t *r, unsigned depth, i128 *x) {
    const uint8_t *at = r->p;
    val_t v;
    if (!tr_value(r, depth, &v)) return -1;
    if (v.cls == C_INT) { *x = (i128)v.u; return 1; }
    if (v.cls != C_NEG) return 0;
    /* read_value keeps no negative value: decode it again (its bytes were checked) */
    uint8_t c = at[0];
    if (c >= 0xe0) { *x = (int8_t)c; return 1; }
    int n = 1 << (c - 0xd0);                    /* int8 .. int64 */
    uint64_t u = be(at + 1, n);
    if (n < 8) u |= ~(uint64_t)0 << (8 * n);    /* sign-extend (the sign bit is set) */
    *x = (int64_t)u;
    return 1;
}

/* a section: [pvn, first_pos, [chunk, ...]]; chunks: where the chunk items start */
typedef struct {
    i128 pvn;
    uint64_t first;
    uint32_t n;
    const uint8_t *chunks;
    const uint8_t *base;        /* the buffer they are in, and its end: for re-walking */
    const uint8_t *end;
} sec_t;

/* One value: 1 if it is a section as trailer.checked_section accepts it (list of
 * three: int, int > 0, list of bytes only), 0 if any other value, -1 on error. */
static int tr_section(rd_t *r, unsigned depth, sec_t *s) {
    uint64_t count;
    int is_map;
    val_t v;
    int h = tr_head(r, &count, &is_map);
    if (h < 0) return -1;
    if (h == 0) return tr_value(r, depth, &v) ? 0 : -1;
    if (is_map || count != 3) return tr_items(r, depth, count, is_map, &v) ? 0 : -1;
    if (!tr_open(r, depth, count, 0)) return -1;
    int ok = 1;
    i128 x;
    int k = tr_int(r, depth + 1, &x);
    if (k < 0) return -1;
    if (k) s->pvn = x; else ok = 0;
    k = tr_int(r, depth + 1, &x);
    if (k < 0) return -1;
    if (k && x > 0) s->first = (uint64_t)x; else ok = 0;   /* (x <= 2^64 - 1: a C_INT) */
    h = tr_head(r, &count, &is_map);
    if (h < 0) return -1;
    if (h == 0) return tr_value(r, depth + 1, &v) ? 0 : -1;
    if (is_map) return tr_items(r, depth + 1, count, 1, &v) ? 0 : -1;
    if (!tr_open(r, depth + 1, count, 0)) return -1;
    s->chunks = r->p;
    s->n = (uint32_t)count;         /* (count <= the buffer's length < 2^32: tr_open) */
    s->base = r->base;
    s->end = r->end;
    for (uint64_t i = 0; i < count; i++) {
        if (!tr_value(r, depth + 2, &v)) return -1;
        if (v.cls != C_BYTES) ok = 0;
    }
    /* its last position within trailer.MAX_POSITION (2^63 - 1) */
    if (ok && (i128)s->first + (i128)count - 1 > (i128)INT64_MAX) ok = 0;
    return ok;
}

/* t[3]: 1 if it lists another connection (unpack_trailer's `others` not empty: a list
 * of three ints whose second is 0 or 1), 0 if not, -1 on error. */
static int tr_others(rd_t *r, unsigned depth) {
    uint64_t count, n;
    int is_map, m;
    val_t v;
    int h = tr_head(r, &count, &is_map);
    if (h < 0) return -1;
    if (h == 0) return tr_value(r, depth, &v) ? 0 : -1;
    if (is_map) return tr_items(r, depth, count, 1, &v) ? 0 : -1;
    if (!tr_open(r, depth, count, 0)) return -1;
    for (uint64_t i = 0; i < count; i++) {
        h = tr_head(r, &n, &m);
        if (h < 0) return -1;
        if (h == 0) {
            if (!tr_value(r, depth + 1, &v)) return -1;
            continue;
        }
        if (m) {
            if (!tr_items(r, depth + 1, n, 1, &v)) return -1;
            continue;
        }
        if (!tr_open(r, depth + 1, n, 0)) return -1;
        int listed = n == 3;
        for (uint64_t j = 0; j < n; j++) {
            if (!tr_value(r, depth + 2, &v)) return -1;
            if (v.cls != C_INT && v.cls != C_NEG) listed = 0;
            else if (j == 1 && !(v.cls == C_INT && v.u <= 1)) listed = 0;
        }
        if (listed) return 1;   /* (refused whatever follows: no need to read on) */
    }
    return 0;
}

/* A reader over n bytes at t, with msgpack.unpackb's default limits */
static void rd_over(rd_t *r, const uint8_t *t, size_t n) {
    memset(r, 0, sizeof *r);
    r->base = r->p = t;
    r->end = t + n;
    r->max_array = n;           /* unpackb's defaults: len(buffer), len(buffer) // 2 */
    r->max_map = n / 2;
}

/* The trailer as unpack_trailer reads it: [sent_upto, own, refl, others, delivered] */
typedef struct {
    i128 sent_upto;
    int has_own, has_refl;      /* a section (else None) */
    sec_t own, refl;
    int others;                 /* `others` lists a connection (read no further then) */
    int has_delivered;
    uint64_t delivered;
} trailer_t;

/* 1: read into out; 0: absent (n == 0); -1: malformed, or not what unpack_trailer takes
 * (both lanes leave those to the core). */
static int tr_read(const uint8_t *t, size_t n, trailer_t *out) {
    memset(out, 0, sizeof *out);
    if (n == 0) return 0;
    rd_t rd;
    rd_t *r = &rd;
    rd_over(r, t, n);
    uint64_t count;
    int is_map;
    if (tr_head(r, &count, &is_map) != 1 || is_map || count < 3 || count > 5) return -1;
    if (!tr_open(r, 0, count, 0)) return -1;
    if (tr_int(r, 1, &out->sent_upto) != 1) return -1;     /* sent_upto: an int */
    int k = tr_section(r, 1, &out->own);
    if (k < 0) return -1;
    out->has_own = k;                                       /* (not a section: None) */
    k = tr_section(r, 1, &out->refl);
    if (k < 0) return -1;
    out->has_refl = k;
    if (count >= 4) {
        k = tr_others(r, 1);
        if (k < 0) return -1;
        if (k) {
            out->others = 1;
            return 1;
        }
    }
    if (count == 5) {
        val_t v;
        if (!tr_value(r, 1, &v)) return -1;
        if (v.cls == C_INT) {                               /* an int >= 0, else None */
            out->has_delivered = 1;
            out->delivered = v.u;
        }
    }
    return r->p == r->end ? 1 : -1;                         /* else ExtraData */
}

/* The trailer as SteadyLane takes it: 1 if unpack_trailer gives [sent_upto, own, None,
 * [], delivered] (own, delivered: anything, None included), else 0 (absent, malformed,
 * a reflection, other connections). */
static int tr_parse(const uint8_t *t, size_t n, trailer_t *out) {
    return tr_read(t, n, out) == 1 && !out->has_refl && !out->others;
}

/* ---- sections in the lane's buffers ----------------------------------------------------- */

/* The bytes of the bin at p (checked by the reader that found it; bounds checked again
 * against end all the same): its data and length; the position after it. */
static const uint8_t *bin_at(const uint8_t *p, const uint8_t *end, const uint8_t **data,
                             size_t *len) {
    if (p >= end) return NULL;
    int n = p[0] == 0xc4 ? 1 : p[0] == 0xc5 ? 2 : p[0] == 0xc6 ? 4 : 0;
    if (n == 0 || (size_t)(end - p) < 1 + (size_t)n) return NULL;
    size_t l = (size_t)be(p + 1, n);
    if ((size_t)(end - p) - 1 - (size_t)n < l) return NULL;
    *data = p + 1 + n;
    *len = l;
    return p + 1 + n + l;
}

/* Bytes of a section's canonical msgpack (0: its chunks could not be walked). */
static size_t sec_size(const sec_t *s) {
    size_t size = 1 + int_size(s->pvn) + uint_size(s->first) + array_head_size(s->n);
    const uint8_t *p = s->chunks;
    for (uint32_t i = 0; i < s->n; i++) {
        const uint8_t *d;
        size_t l;
        p = bin_at(p, s->end, &d, &l);
        if (p == NULL) return 0;
        size += bin_size(l);
    }
    return size;
}

/* Pack a section as the core would hold it (its list, packed again: canonical) into
 * buf (cap bytes) and describe it in *m, or leave both as they were if it does not fit
 * (0). (The backup lane, llft_backup.c, keeps its connections' sections this way too.) */
static int sec_pack(uint8_t *buf, size_t cap, const sec_t *s, llft_lane_section *m) {
    size_t size = sec_size(s);
    if (size == 0 || size > cap) return 0;
    wr_t w = {buf, buf + cap, 1};
    wr_byte(&w, 0x93);
    wr_int(&w, s->pvn);
    wr_uint(&w, s->first);
    wr_array(&w, s->n);
    size_t at = (size_t)(w.p - buf);
    const uint8_t *p = s->chunks;
    for (uint32_t i = 0; i < s->n && w.ok; i++) {
        const uint8_t *d;
        size_t l;
        p = bin_at(p, s->end, &d, &l);
        if (p == NULL) return 0;
        wr_bin_head(&w, l);
        wr_raw(&w, d, l);
    }
    if (!w.ok) return 0;
    m->has = 1;
    m->len = (uint32_t)(w.p - buf);
    m->pvn = int_put(s->pvn);
    m->first = s->first;
    m->nchunks = s->n;
    m->chunks_at = (uint32_t)at;
    return 1;
}

/* Store a section in one of the lane's two buffers (sec_pack) */
static int sec_store(llft_lane *L, int which, const sec_t *s) {
    return sec_pack(L->sec[which], L->mtu, s,
                    which == LLFT_LANE_TO_REFLECT ? &L->st.to_reflect : &L->st.last_order_info);
}

/* section_end of a held section: (pvn, first + n - 1) */
static i128 held_last(const llft_lane_section *m) {
    return (i128)m->first + (i128)m->nchunks - 1;
}

/* ---- loading and reading back ------------------------------------------------------------ */

int llft_lane_set_groups(llft_lane *L, const char *group, size_t group_len,
                         const char *remote, size_t remote_len) {
    /* wire._check_group: a message naming them must be encodable; valid UTF-8 comes
     * from Python's str.encode */
    if (group_len == 0 || group_len > MAX_GROUP_BYTES || remote_len == 0
        || remote_len > MAX_GROUP_BYTES)
        return LLFT_LANE_R_STATE;
    memcpy(L->group, group, group_len);
    L->group_len = (uint32_t)group_len;
    memcpy(L->remote, remote, remote_len);
    L->remote_len = (uint32_t)remote_len;
    return LLFT_LANE_OK;
}

static uint32_t ring_pos(const llft_lane *L, uint32_t i) {
    return (uint32_t)(((uint64_t)L->st.sent_head + i) % L->window);
}

static int body_field(const uint64_t *v, unsigned field, uint64_t *value) {
    for (uint64_t i = 0; i < v[15] && i < LLFT_WIRE_MAX_FIELDS; i++)
        if (v[16 + i] == field) { *value = v[24 + i]; return 1; }
    return 0;
}

int llft_lane_load_sent(llft_lane *L, const char *dg, size_t n, int has_sent_at,
                        int64_t sent_at) {
    llft_lane_state *s = &L->st;
    if (s->sent_count >= L->window || n > L->mtu) return LLFT_LANE_R_STATE;
    uint64_t v[LLFT_WIRE_OUT];
    llft_wire_open(L->w, dg, n, LN_MAX_MESSAGE_BYTES, v);
    uint64_t offset, data;
    if (v[0] != LLFT_WIRE_OK || !body_field(v, 0, &offset) || !body_field(v, 1, &data))
        return LLFT_LANE_R_STATE;
    /* the sent list holds consecutive msns (SendSide.check) */
    if (s->sent_count > 0) {
        const llft_lane_slot *last = &L->slots[ring_pos(L, s->sent_count - 1)];
        if (v[8] != last->msn + 1) return LLFT_LANE_R_STATE;
    }
    uint32_t pos = ring_pos(L, s->sent_count);
    llft_lane_slot *slot = &L->slots[pos];
    slot->msn = v[8];
    slot->ts = v[11];
    slot->offset = offset;
    slot->data_len = (uint32_t)(data & 0xffffffffu);
    slot->dg_len = (uint32_t)n;
    slot->has_sent_at = has_sent_at != 0;
    slot->sent_at = has_sent_at ? sent_at : 0;
    memcpy(L->ring + (size_t)pos * L->mtu, dg, n);
    s->sent_count++;
    return LLFT_LANE_OK;
}

int llft_lane_load_section(llft_lane *L, int which, const char *raw, size_t n) {
    if (which != LLFT_LANE_TO_REFLECT && which != LLFT_LANE_LAST_ORDER_INFO)
        return LLFT_LANE_R_STATE;
    rd_t rd;
    rd_over(&rd, (const uint8_t *)raw, n);
    sec_t s;
    if (tr_section(&rd, 0, &s) != 1 || rd.p != rd.end) return LLFT_LANE_R_STATE;
    if (s.pvn < -((i128)1 << 63)) return LLFT_LANE_R_STATE;    /* (msgpack's range) */
    return sec_store(L, which, &s) ? LLFT_LANE_OK : LLFT_LANE_R_STATE;
}

int llft_lane_check(const llft_lane *L) {
    const llft_lane_state *s = &L->st;
    int ok = L->group_len > 0 && L->remote_len > 0
        && s->cid_role <= 1 && s->role <= 1
        && s->next_msn >= 1                 /* last_msn = next_msn - 1 >= 0 */
        && s->window_msgs == L->window && s->max_payload_bytes >= 1
        && time_ok(s->now) && (!s->has_told_us || time_ok(s->told_us))
        && (!s->has_heard || time_ok(s->heard))
        && (!s->has_primary_heard || time_ok(s->primary_heard_us))
        && time_ok(s->last_send_us) && time_ok(s->first_ack_delay_us)
        && time_ok(s->keepalive_us) && (!s->has_srtt || time_ok(s->srtt))
        && time_ok(s->rttvar) && time_ok(s->rto) && time_ok(s->rto_floor)
        && time_ok(s->rto_ceiling)
        && s->sent_bytes >= -LN_TIMER_MAX && s->sent_bytes <= LN_TIMER_MAX
        /* the loader writes the state in place: what C indexes with must be its own */
        && s->sent_head < L->window && s->sent_count <= L->window
        && (!s->to_reflect.has || (s->to_reflect.len <= L->mtu
                                   && s->to_reflect.chunks_at <= s->to_reflect.len))
        && (!s->last_order_info.has || (s->last_order_info.len <= L->mtu
                                        && s->last_order_info.chunks_at
                                           <= s->last_order_info.len));
    for (int k = 0; ok && k < LLFT_LANE_TIMERS; k++)
        if (s->timer_set[k] && (s->timer_at[k] < -LN_TIMER_MAX || s->timer_at[k] > LN_TIMER_MAX))
            ok = 0;
    for (uint32_t i = 0; ok && i < s->sent_count; i++) {
        const llft_lane_slot *slot = &L->slots[ring_pos(L, i)];
        if (slot->has_sent_at && !time_ok(slot->sent_at)) ok = 0;
    }
    if (ok && s->sent_count > 0)            /* ... ending at last_msn */
        ok = L->slots[ring_pos(L, s->sent_count - 1)].msn == s->next_msn - 1;
    return ok ? LLFT_LANE_OK : LLFT_LANE_R_STATE;
}

const llft_lane_slot *llft_lane_slot_at(const llft_lane *L, uint32_t i) {
    return i < L->st.sent_count ? &L->slots[ring_pos(L, i)] : NULL;
}

const char *llft_lane_datagram(const llft_lane *L, uint32_t i) {
    if (i >= L->st.sent_count) return NULL;
    return (const char *)L->ring + (size_t)ring_pos(L, i) * L->mtu;
}

const char *llft_lane_control(const llft_lane *L) { return (const char *)L->ctl; }

const char *llft_lane_section_bytes(const llft_lane *L, int which) {
    if (which != LLFT_LANE_TO_REFLECT && which != LLFT_LANE_LAST_ORDER_INFO) return NULL;
    return (const char *)L->sec[which];
}

int llft_lane_next_timer(const llft_lane *L, int64_t *at_us) {
    int any = 0;
    for (int k = 0; k < LLFT_LANE_TIMERS; k++)
        if (L->st.timer_set[k] && (!any || L->st.timer_at[k] < *at_us)) {
            *at_us = L->st.timer_at[k];
            any = 1;
        }
    return any;
}

/* ---- the rules shared by both events --------------------------------------------------- */

static void timer_set(llft_lane_state *s, int k, int64_t at) {
    s->timer_set[k] = 1;
    s->timer_at[k] = at;
}

/* `t[k] = min(t.get(k), at)` */
static void timer_earlier(llft_lane_state *s, int k, int64_t at) {
    if (!s->timer_set[k] || at < s->timer_at[k]) timer_set(s, k, at);
}

/* SteadyLane._group_watermark */
static uint64_t group_watermark(llft_lane_state *s) {
    uint64_t w = s->view_ts;
    if (w > s->gw) {
        s->gw = w;
        s->gw_rose = 1;
    }
    return w;
}

/* SteadyLane._want_first_ack */
static void want_first_ack(llft_lane_state *s, int reflect) {
    if (reflect || s->upto > s->fa_pending || s->fa_pending == 0) {
        timer_earlier(s, LLFT_LANE_T_FIRST_ACK, s->now + s->first_ack_delay_us);
        s->fa_tries = 0;
    }
}

/* SteadyLane._on_acked: SendSide.on_acked and RtoEstimator.sample */
static void on_acked(llft_lane *L, uint64_t upto, int64_t now) {
    llft_lane_state *s = &L->st;
    int have = 0;
    int64_t sample = 0;
    for (uint32_t i = 0; i < s->sent_count; i++) {
        llft_lane_slot *slot = &L->slots[ring_pos(L, i)];
        if (slot->has_sent_at && slot->msn <= upto) {
            slot->has_sent_at = 0;
            if (slot->msn == upto) {
                have = 1;
                sample = now - slot->sent_at;       /* (both within LN_TIME_MAX) */
            }
        }
    }
    if (!have) return;
    /* in 128 bits: with times bounded by 2^61 every result fits int64 (srtt stays
     * between its samples, rttvar below 2^63), the sums on the way need not */
    i128 rtt = sample > 0 ? sample : 0, srtt, rttvar;
    if (!s->has_srtt) {
        srtt = rtt;
        rttvar = rtt / 2;
    } else {
        srtt = s->srtt;
        rttvar = s->rttvar;
        i128 d = srtt - rtt;
        rttvar += floordiv((d < 0 ? -d : d) - rttvar, 4);
        srtt += floordiv(rtt - srtt, 8);
    }
    i128 rto = srtt + 4 * rttvar;
    if (rto < s->rto_floor) rto = s->rto_floor;
    if (rto > s->rto_ceiling) rto = s->rto_ceiling;
    s->has_srtt = 1;
    s->srtt = (int64_t)srtt;
    s->rttvar = (int64_t)rttvar;
    s->backoff = 0;
    s->rto = (int64_t)rto;
}

/* SteadyLane._drop_covered: SendSide.drop_covered by the remote group watermark */
static void drop_covered(llft_lane *L) {
    llft_lane_state *s = &L->st;
    int freed = 0;
    while (s->sent_count > 0 && L->slots[ring_pos(L, 0)].ts <= s->remote_gw) {
        s->sent_bytes -= L->slots[ring_pos(L, 0)].data_len; /* (its sent_at goes with it) */
        s->sent_head = ring_pos(L, 1);
        s->sent_count--;
        freed = 1;
    }
    if (!freed) return;
    uint64_t covered = s->sent_count > 0 ? L->slots[ring_pos(L, 0)].msn - 1 : s->next_msn - 1;
    if (s->remote_ack < covered) s->remote_ack = covered;
    for (uint32_t i = 0; i < s->sent_count; i++)
        if (L->slots[ring_pos(L, i)].msn > s->remote_ack) return;
    s->timer_set[LLFT_LANE_T_RETRANSMIT] = 0;
}

/* ---- receiving: SteadyLane.handle_message ------------------------------------------------ */

/* a span of the codec's result names exactly these bytes of the datagram */
static int span_is(const uint8_t *dg, size_t n, uint64_t span, const uint8_t *want,
                   uint32_t want_len) {
    uint64_t off = span >> 32, len = span & 0xffffffffu;
    return len == want_len && off <= n && len <= n - off && memcmp(dg + off, want, len) == 0;
}

/* SteadyLane._own: _on_trailer's own section, kept and to reflect if newer */
static void take_own(llft_lane *L, const sec_t *own, i128 own_last) {
    llft_lane_state *s = &L->st;
    i128 pvn_own = own->pvn;
    const llft_lane_section *lr = &s->last_order_info;
    int stored = -1;                            /* which buffer holds `own` already */
    if (!lr->has || end_cmp(pvn_own, own_last, int_get(lr->pvn), held_last(lr)) >= 0) {
        sec_store(L, LLFT_LANE_LAST_ORDER_INFO, own);   /* (it fits: checked) */
        stored = LLFT_LANE_LAST_ORDER_INFO;
    }
    const llft_lane_section *now_refl = &s->to_reflect;
    i128 rp = s->has_reflected ? int_get(s->reflected_pvn) : 0;
    i128 rq = s->has_reflected ? int_get(s->reflected_pos) : 0;
    if ((!now_refl->has
         || end_cmp(pvn_own, own_last, int_get(now_refl->pvn), held_last(now_refl)) > 0)
        && end_cmp(pvn_own, own_last, rp, rq) > 0) {
        if (stored >= 0) {                      /* the same list: the same bytes */
            memcpy(L->sec[LLFT_LANE_TO_REFLECT], L->sec[stored], s->last_order_info.len);
            s->to_reflect = s->last_order_info;
        } else {
            sec_store(L, LLFT_LANE_TO_REFLECT, own);
        }
        want_first_ack(s, 1);
    }
}

/* SteadyLane._after_event (nothing held: nothing to solicit) */
static void after_event(llft_lane_state *s) {
    if (s->gw_rose) {
        s->gw_rose = 0;
        if (s->recv_max_data_ts > s->last_back && s->gw > s->last_back) {
            timer_earlier(s, LLFT_LANE_T_KEEPALIVE, s->now + s->first_ack_delay_us);
            s->ka_urgent = 1;
        }
    }
}

/* The Message `_msg` makes on the lent connection (the clock already ticked for it),
 * as wire.pack_message packs it: a 14-array and its first 12 fields, up to the ts; the
 * body and order_info follow. `back` is `_back`'s group watermark. */
static void wr_message_head(wr_t *w, llft_lane *L, uint64_t type, uint64_t msn,
                            uint64_t ack) {
    llft_lane_state *s = &L->st;
    uint64_t back = group_watermark(s);             /* _back */
    if (back > s->last_back) s->last_back = back;
    wr_byte(w, 0x9e);
    wr_uint(w, type);
    wr_str(w, L->group, L->group_len);
    wr_str(w, L->remote, L->remote_len);
    wr_uint(w, s->seq);
    wr_uint(w, s->cid_role);
    wr_uint(w, s->pvn);
    wr_uint(w, s->precedence);
    wr_uint(w, s->birth_id);
    wr_uint(w, msn);
    wr_uint(w, ack);
    wr_uint(w, back);
    wr_uint(w, s->clock);                           /* ts */
}

/* `MessagingEndpoint._emit` on the lent connection (known: its KEEPALIVE moves) */
static void emitted(llft_lane_state *s) {
    s->last_send_us = s->now;
    timer_set(s, LLFT_LANE_T_KEEPALIVE, s->now + s->keepalive_us);
}

/* the largest SECOND_ACK of this lane: every number in its widest form */
static size_t second_ack_bound(const llft_lane *L) {
    return HEADER_BYTES + 1 + 1 + 5 + L->group_len + 5 + L->remote_len + 9 * 9 + 1 + 2;
}

/* SteadyLane._on_first_ack's SECOND_ACK: `_msg(c, SECOND_ACK, {}, ack=...)` (no
 * trailer), sealed into the control buffer (it fits: second_ack_bound), and `_emit` */
static uint32_t second_ack(llft_lane *L, uint64_t ack) {
    llft_lane_state *s = &L->st;
    s->clock += 1;
    uint8_t *dg = L->ctl;
    wr_t w = {dg + HEADER_BYTES, dg + L->mtu, 1};
    wr_message_head(&w, L, LLFT_LANE_SECOND_ACK, 0, ack);
    wr_byte(&w, 0x80);                              /* body {} */
    wr_bin_head(&w, 0);                             /* order_info b"" */
    size_t payload = (size_t)(w.p - (dg + HEADER_BYTES));
    size_t dg_len = llft_wire_seal(L->w, LLFT_LANE_WIRE_VERSION, 0,
                                   (const char *)dg + HEADER_BYTES, payload, (char *)dg);
    emitted(s);
    return (uint32_t)dg_len;
}

int llft_lane_receive(llft_lane *L, const char *dg_chars, size_t n, int64_t now_us,
                      llft_lane_rx *rx) {
    llft_lane_state *s = &L->st;
    const uint8_t *dg = (const uint8_t *)dg_chars;
    /* (the sections the lane keeps fit its buffers because the datagram fits the MTU) */
    if (n > L->mtu) return LLFT_LANE_R_SIZE;
    uint64_t v[LLFT_WIRE_OUT];
    llft_wire_open(L->w, dg_chars, n, LN_MAX_MESSAGE_BYTES, v);
    if (v[0] != LLFT_WIRE_OK) return LLFT_LANE_R_WIRE;
    /* the steady conditions, in SteadyLane.handle_message's order */
    uint64_t type = v[2], seq = v[3], role = v[4], pvn = v[5], sender = v[7], msn = v[8];
    uint64_t ack = v[9], back = v[10], ts = v[11];
    uint64_t data_type = s->cid_role == 0 ? LLFT_LANE_REPLY : LLFT_LANE_REQUEST;
    if (!span_is(dg, n, v[12], L->remote, L->remote_len)
        || !span_is(dg, n, v[13], L->group, L->group_len)
        || seq != s->seq || role != 1u - s->cid_role          /* ROLES[1 - role] is ours */
        || sender == s->birth_id || pvn != s->view_pvn || s->upto == 0)
        return LLFT_LANE_R_HEADER;
    int kind;
    uint64_t offset = 0, data = 0, flags = 0, data_at = 0, data_len = 0;
    if (type == data_type) {
        if (!body_field(v, 0, &offset) || !body_field(v, 1, &data)
            || !body_field(v, 2, &flags))
            return LLFT_LANE_R_WIRE;                        /* (the codec requires all) */
        data_at = data >> 32;
        data_len = data & 0xffffffffu;
        if (data_at > n || data_len > n - data_at) return LLFT_LANE_R_WIRE;
        if (flags != 0) return LLFT_LANE_R_BODY;
        if (s->upto != UINT64_MAX && msn == s->upto + 1) {
            if (data_len == 0 || offset != s->delivered) return LLFT_LANE_R_BODY;
            kind = LLFT_LANE_RX_DATA;
        } else if (msn <= s->upto) {
            kind = LLFT_LANE_RX_DUP;
        } else {
            return LLFT_LANE_R_HEADER;
        }
    } else if (type == LLFT_LANE_KEEP_ALIVE) {
        kind = LLFT_LANE_RX_KEEP_ALIVE;
    } else if (type == LLFT_LANE_FIRST_ACK) {
        kind = LLFT_LANE_RX_FIRST_ACK;
    } else {
        return LLFT_LANE_R_HEADER;
    }
    trailer_t tr;
    uint64_t oi = v[14], oi_at = oi >> 32, oi_len = oi & 0xffffffffu;
    if (oi_at > n || oi_len > n - oi_at || !tr_parse(dg + oi_at, oi_len, &tr))
        return LLFT_LANE_R_TRAILER;
    int control = kind >= LLFT_LANE_RX_KEEP_ALIVE;
    /* (own order info rides on data only; a sent-up-to past ours: placeholders) */
    if (control && (tr.has_own || tr.sent_upto > (i128)s->upto)) return LLFT_LANE_R_TRAILER;
    /* what Python would hold but this state cannot: refused, the core takes it */
    uint64_t counter = kind == LLFT_LANE_RX_KEEP_ALIVE ? s->rx_keep_alive
                     : kind == LLFT_LANE_RX_FIRST_ACK ? s->rx_first_ack : s->rx;
    if (!time_ok(now_us) || counter == UINT64_MAX
        || (kind == LLFT_LANE_RX_DATA && data_len > UINT64_MAX - offset)
        || (kind == LLFT_LANE_RX_DUP && s->dup_data == UINT64_MAX))
        return LLFT_LANE_R_RANGE;
    int owes = 0;                   /* a SECOND_ACK (its `delivered` condition: below) */
    if (kind == LLFT_LANE_RX_FIRST_ACK) {
        if (s->fa_count == UINT64_MAX) return LLFT_LANE_R_RANGE;
        uint64_t rd = s->remote_delivered;
        if (tr.has_delivered && tr.delivered > rd) rd = tr.delivered;
        owes = ack > 0 && s->out_offset >= rd;
        if (owes && ((ts > s->clock ? ts : s->clock) == UINT64_MAX
                     || second_ack_bound(L) > L->mtu))
            return LLFT_LANE_R_RANGE;
    }
    i128 own_last = 0;
    if (tr.has_own) {
        if (tr.own.pvn < -((i128)1 << 63)) return LLFT_LANE_R_RANGE;   /* (cannot be) */
        size_t size = sec_size(&tr.own);
        if (size == 0 || size > L->mtu) return LLFT_LANE_R_RANGE;      /* (cannot be) */
        own_last = (i128)tr.own.first + (i128)tr.own.n - 1;
    }

    /* handle_message: from here on nothing refuses */
    rx->kind = (uint8_t)kind;
    rx->ctl_len = 0;
    rx->offset = 0;
    rx->data_at = rx->data_len = 0;
    if (now_us > s->now) s->now = now_us;
    int64_t now = s->now;
    if (ts > s->clock) s->clock = ts;
    if (kind == LLFT_LANE_RX_KEEP_ALIVE) {
        s->has_rx_keep_alive = 1;
        s->rx_keep_alive++;
    } else if (kind == LLFT_LANE_RX_FIRST_ACK) {
        s->has_rx_first_ack = 1;
        s->rx_first_ack++;
    } else {
        s->has_rx = 1;
        s->rx++;
    }
    s->has_heard = 1;
    s->heard = now;
    /* rules.news_of_primary: a later view, another primary, or a later timestamp */
    if (!s->has_primary_heard || pvn > s->primary_heard_pvn
        || (pvn == s->primary_heard_pvn
            && (sender != s->primary_heard_sender || ts > s->primary_heard_ts))) {
        s->has_primary_heard = 1;
        s->primary_heard_pvn = pvn;
        s->primary_heard_sender = sender;
        s->primary_heard_us = now_us;  /* when it came (<= now): endpoint.py */
        s->primary_heard_ts = ts;
        s->primary_heard_set = 1;
    }
    /* _handle_inter: _on_remote_ack */
    uint64_t last_msn = s->next_msn - 1;
    if (kind != LLFT_LANE_RX_FIRST_ACK && ack != last_msn) s->fa_count = 0;
    if (s->remote_ack < ack && ack <= last_msn) {
        s->remote_ack = ack;
        on_acked(L, ack, now);
        if (ack < last_msn) timer_set(s, LLFT_LANE_T_RETRANSMIT, now + s->rto);
        else s->timer_set[LLFT_LANE_T_RETRANSMIT] = 0;
    }
    if (back > s->remote_gw) {
        s->remote_gw = back;
        drop_covered(L);
    }
    if (tr.has_delivered && tr.delivered > s->remote_delivered)
        s->remote_delivered = tr.delivered;
    if (kind == LLFT_LANE_RX_DATA) {
        s->served_pvn = s->pvn;
        /* _on_data_at_primary: _rx_data, _advance, _release_held, _deliver */
        if (!s->has_first_offset || offset < s->first_offset) {
            s->has_first_offset = 1;
            s->first_offset = offset;
        }
        s->ka_idle = 0;
        s->upto = msn;
        if (ts > s->view_ts) s->view_ts = ts;
        if (ts > s->recv_max_data_ts) s->recv_max_data_ts = ts;
        if (ts > s->max_data_ts) s->max_data_ts = ts;
        rx->offset = offset;
        rx->data_at = (uint32_t)data_at;
        rx->data_len = (uint32_t)data_len;
        s->delivered = offset + data_len;
        if (s->upto >= s->declared_upto && s->declared_ts > s->view_ts)   /* advance_ts */
            s->view_ts = s->declared_ts;
        group_watermark(s);                         /* _gc_received: the message goes */
        want_first_ack(s, 0);
        /* _on_trailer: the remote's order info, to reflect */
        if (tr.has_own) take_own(L, &tr.own, own_last);
        after_event(s);
        return LLFT_LANE_OK;
    }
    if (kind == LLFT_LANE_RX_DUP) {
        s->served_pvn = s->pvn;
        /* _rx_data's duplicate (our ack may be lost: re-ack soon), _on_data_at_primary */
        s->has_dup_data = 1;
        s->dup_data++;
        want_first_ack(s, 1);
        want_first_ack(s, 0);
        if (tr.has_own) take_own(L, &tr.own, own_last);
    } else {
        if (kind == LLFT_LANE_RX_KEEP_ALIVE) {
            s->fa_count = 0;                        /* _on_keepalive (STREAMING) */
        } else {                                    /* _on_first_ack */
            if (ack > 0 && ack == last_msn) {
                if (s->fa_msn != ack) {
                    s->fa_msn = ack;
                    s->fa_count = 0;
                }
                s->fa_count++;
            }
            if (owes) rx->ctl_len = second_ack(L, ack);
        }
        /* _on_trailer of a non-data message: _declared, _expect (nothing), advance_ts
         * (sent_upto <= upto: checked; a negative one is below any declared) */
        if (tr.sent_upto >= (i128)s->declared_upto || ts > s->declared_ts) {
            if (tr.sent_upto > (i128)s->declared_upto) s->declared_upto = (uint64_t)tr.sent_upto;
            if (ts > s->declared_ts) s->declared_ts = ts;
        }
        if (s->upto >= s->declared_upto && s->declared_ts > s->view_ts)
            s->view_ts = s->declared_ts;
    }
    group_watermark(s);                             /* _gc_all_received */
    after_event(s);
    return LLFT_LANE_OK;
}

/* ---- sending: SteadyLane.send ------------------------------------------------------------ */

/* SteadyLane._unreflected of the held to_reflect, written into the trailer (nil if
 * nothing is left to reflect). */
static int write_unreflected(llft_lane *L, wr_t *w) {
    llft_lane_state *s = &L->st;
    const llft_lane_section *m = &s->to_reflect;
    const uint8_t *buf = L->sec[LLFT_LANE_TO_REFLECT];
    i128 rpvn = s->has_reflected ? int_get(s->reflected_pvn) : 0;
    i128 rpos = s->has_reflected ? int_get(s->reflected_pos) : 0;
    i128 pvn = int_get(m->pvn), first = m->first;
    uint32_t skip = 0;
    if (m->len > L->mtu || m->chunks_at > m->len) return LLFT_LANE_R_STATE;   /* (cannot be) */
    if (pvn == rpvn && first <= rpos) {
        i128 k = rpos - first + 1;                  /* >= 1 */
        if (k >= m->nchunks) { wr_byte(w, 0xc0); return LLFT_LANE_OK; }
        skip = (uint32_t)k;
        first = rpos + 1;                           /* (<= first + nchunks - 1) */
        if (first > (i128)UINT64_MAX) return LLFT_LANE_R_RANGE;   /* packb would raise */
    } else if (pvn < rpvn) {
        wr_byte(w, 0xc0);
        return LLFT_LANE_OK;
    }
    uint32_t n = m->nchunks - skip;
    const uint8_t *p = buf + m->chunks_at, *end = buf + m->len;
    for (uint32_t i = 0; i < skip; i++) {           /* canonical bins: walk past them */
        const uint8_t *d;
        size_t l;
        p = bin_at(p, end, &d, &l);
        if (p == NULL) return LLFT_LANE_R_STATE;    /* (cannot be: we wrote them) */
    }
    wr_byte(w, 0x93);
    wr_int(w, pvn);
    wr_uint(w, (uint64_t)first);
    wr_array(w, n);
    wr_raw(w, p, (size_t)(end - p));
    s->has_reflected = 1;
    s->reflected_pvn = int_put(pvn);
    s->reflected_pos = int_put(first + n - 1);
    return LLFT_LANE_OK;
}

/* SteadyLane._send_data: `_flush` of one segment, with `_msg` and `_emit` */
static int send_data(llft_lane *L, uint64_t offset, const uint8_t *data, size_t len) {
    llft_lane_state *s = &L->st;
    uint64_t msn = s->next_msn;
    if (msn == UINT64_MAX || s->clock == UINT64_MAX
        || (int64_t)len > INT64_MAX - LN_TIMER_MAX || s->sent_bytes > LN_TIMER_MAX)
        return LLFT_LANE_R_RANGE;
    s->clock += 1;
    /* the trailer: pack_trailer(msn, None, refl, [], delivered) */
    wr_t tw = {L->scratch, L->scratch + L->mtu, 1};
    wr_byte(&tw, 0x95);
    wr_uint(&tw, msn);
    wr_byte(&tw, 0xc0);
    if (s->to_reflect.has) {
        s->to_reflect.has = 0;                      /* refl, to_reflect = to_reflect, None */
        int r = write_unreflected(L, &tw);
        if (r != LLFT_LANE_OK) return r;
    } else {
        wr_byte(&tw, 0xc0);
    }
    if (!s->has_told_us || s->now - s->told_us >= s->first_ack_delay_us) {
        group_watermark(s);                         /* (no other connection: `others` []) */
        s->has_told_us = 1;
        s->told_us = s->now;
    }
    wr_byte(&tw, 0x90);
    wr_uint(&tw, s->delivered);
    if (!tw.ok) return LLFT_LANE_R_FRAGMENT;
    s->told_delivered = s->delivered;
    /* the Message, as wire.pack_message packs it: 14 fields, body in its key order */
    uint32_t pos = ring_pos(L, s->sent_count);      /* (a free slot: the window checked) */
    uint8_t *dg = L->ring + (size_t)pos * L->mtu;
    wr_t w = {dg + HEADER_BYTES, dg + L->mtu, 1};
    wr_message_head(&w, L, s->role == 0 ? LLFT_LANE_REQUEST : LLFT_LANE_REPLY, msn, s->upto);
    wr_byte(&w, 0x83);
    wr_str(&w, "offset", 6);
    wr_uint(&w, offset);
    wr_str(&w, "data", 4);
    wr_bin_head(&w, len);
    wr_raw(&w, data, len);
    wr_str(&w, "flags", 5);
    wr_uint(&w, 0);
    wr_bin_head(&w, (size_t)(tw.p - L->scratch));  /* order_info */
    wr_raw(&w, L->scratch, (size_t)(tw.p - L->scratch));
    if (!w.ok) return LLFT_LANE_R_FRAGMENT;         /* wire.encode would fragment it */
    size_t payload = (size_t)(w.p - (dg + HEADER_BYTES));
    /* (the payload is already in place: seal's memmove onto itself is a no-op) */
    size_t dg_len = llft_wire_seal(L->w, LLFT_LANE_WIRE_VERSION, 0,
                                   (const char *)dg + HEADER_BYTES, payload, (char *)dg);
    if (!s->first_ts) s->first_ts = s->clock;
    s->next_msn += 1;
    llft_lane_slot *slot = &L->slots[pos];
    slot->msn = msn;
    slot->ts = s->clock;
    slot->offset = offset;
    slot->data_len = (uint32_t)len;
    slot->dg_len = (uint32_t)dg_len;
    slot->has_sent_at = 1;
    slot->sent_at = s->now;
    s->sent_count++;
    s->ka_idle = 0;
    s->sent_bytes += (int64_t)len;
    emitted(s);
    if (!s->timer_set[LLFT_LANE_T_RETRANSMIT])
        timer_set(s, LLFT_LANE_T_RETRANSMIT, s->now + s->rto);
    s->fa_pending = 0;
    s->timer_set[LLFT_LANE_T_FIRST_ACK] = 0;
    s->fa_tries = 0;
    return LLFT_LANE_OK;
}

int llft_lane_send(llft_lane *L, const char *data_chars, size_t n, int has_now,
                   int64_t now_us, uint32_t *nmsgs) {
    llft_lane_state *s = &L->st;
    const uint8_t *data = (const uint8_t *)data_chars;
    *nmsgs = 0;
    uint64_t step = s->max_payload_bytes;
    if (n == 0) return LLFT_LANE_R_EMPTY;
    uint64_t segs = n / step + (n % step != 0);
    if (n > s->max_queue_bytes || s->sent_count + segs > s->window_msgs)
        return LLFT_LANE_R_WINDOW;
    if (has_now && !time_ok(now_us)) return LLFT_LANE_R_RANGE;
    /* All or nothing: a segment that cannot go (it would fragment, or a number would
     * pass 64 bits) takes back every change, the earlier segments' included; the slots
     * they filled lie past the restored sent list, free again. */
    llft_lane_state saved = *s;
    if (has_now && now_us > s->now) s->now = now_us;
    for (size_t i = 0; i < n; i += step) {
        size_t len = n - i < step ? n - i : (size_t)step;
        uint64_t offset = s->out_offset;
        int r = len > UINT64_MAX - offset ? LLFT_LANE_R_RANGE : LLFT_LANE_OK;
        if (r == LLFT_LANE_OK) {
            s->out_offset += len;
            r = send_data(L, offset, data + i, len);
        }
        if (r != LLFT_LANE_OK) {
            *s = saved;
            return r;
        }
    }
    *nmsgs = (uint32_t)segs;
    return LLFT_LANE_OK;
}
