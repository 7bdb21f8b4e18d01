/* llft_wire.c -- see llft_wire.h. Every rule here has its twin in llft/protocol/wire.py
 * (the reference); a comment names the Python line a check mirrors where that helps. */
#define OPENSSL_SUPPRESS_DEPRECATED 1   /* SHA256_Init & co.: the one API with a copyable
                                         * mid-state, what HMAC's precomputed pads need */
#include "llft_wire.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>

#define KEY_BYTES 32
#define TAG_BYTES 16
#define PREFIX_BYTES 4
#define HEADER_BYTES (PREFIX_BYTES + TAG_BYTES)  /* 20 */
#define FRAG_HEADER_BYTES (HEADER_BYTES + 16)    /* 36 */
#define MAX_DATAGRAM_BYTES 65507
#define MAX_GROUP_BYTES 96
#define PAYLOAD_LEN 14
#define MAX_DEPTH 1024      /* msgpack-python's unpacker stack (MSGPACK_EMBED_STACK_SIZE) */
#define SCHEMA_NAME_BYTES 32

typedef struct {
    int present, data, fallback;
    unsigned nfields;
    char names[LLFT_WIRE_MAX_FIELDS][SCHEMA_NAME_BYTES];
    size_t name_len[LLFT_WIRE_MAX_FIELDS];
    uint8_t masks[LLFT_WIRE_MAX_FIELDS];
} schema_t;

struct llft_wire {
    SHA256_CTX inner, outer;        /* SHA-256 of key^ipad, key^opad: HMAC's first blocks */
    uint8_t versions[256];
    schema_t types[256];
};

llft_wire *llft_wire_new(const uint8_t *key, size_t key_len) {
    if (key == NULL || key_len != KEY_BYTES) return NULL;
    llft_wire *w = calloc(1, sizeof *w);
    if (w == NULL) return NULL;
    uint8_t pad[64];
    memset(pad, 0x36, sizeof pad);
    for (size_t i = 0; i < key_len; i++) pad[i] ^= key[i];
    SHA256_Init(&w->inner);
    SHA256_Update(&w->inner, pad, sizeof pad);
    memset(pad, 0x5c, sizeof pad);
    for (size_t i = 0; i < key_len; i++) pad[i] ^= key[i];
    SHA256_Init(&w->outer);
    SHA256_Update(&w->outer, pad, sizeof pad);
    OPENSSL_cleanse(pad, sizeof pad);
    return w;
}

void llft_wire_free(llft_wire *w) {
    if (w == NULL) return;
    OPENSSL_cleanse(w, sizeof *w);
    free(w);
}

void llft_wire_support(llft_wire *w, unsigned version) {
    if (version < 256) w->versions[version] = 1;
}

int llft_wire_schema(llft_wire *w, unsigned type, int data, unsigned nfields,
                     const char *names, const uint8_t *masks) {
    if (type >= 256 || nfields > LLFT_WIRE_MAX_FIELDS) return -1;
    schema_t s;
    memset(&s, 0, sizeof s);
    s.present = 1;
    s.data = data != 0;
    s.nfields = nfields;
    const char *name = names;
    for (unsigned i = 0; i < nfields; i++) {
        size_t len = strlen(name);
        if (len == 0 || len >= SCHEMA_NAME_BYTES) return -1;
        memcpy(s.names[i], name, len);
        s.name_len[i] = len;
        s.masks[i] = masks[i];
        if (masks[i] & (LLFT_WIRE_STR | LLFT_WIRE_LIST)) s.fallback = 1;
        name += len + 1;
    }
    w->types[type] = s;
    return 0;
}

/* ---- the tag -------------------------------------------------------------------- */

static void tag(const llft_wire *w, const uint8_t *prefix, const uint8_t *rest, size_t n,
                uint8_t out[TAG_BYTES]) {
    uint8_t inner[SHA256_DIGEST_LENGTH], full[SHA256_DIGEST_LENGTH];
    SHA256_CTX c = w->inner;
    SHA256_Update(&c, prefix, PREFIX_BYTES);
    SHA256_Update(&c, rest, n);
    SHA256_Final(inner, &c);
    c = w->outer;
    SHA256_Update(&c, inner, sizeof inner);
    SHA256_Final(full, &c);
    memcpy(out, full, TAG_BYTES);
}

size_t llft_wire_seal(const llft_wire *w, unsigned version, unsigned kind,
                      const char *body_chars, size_t n, char *out_chars) {
    const uint8_t *body = (const uint8_t *)body_chars;
    uint8_t *out = (uint8_t *)out_chars;
    out[0] = 'L';
    out[1] = 'F';
    out[2] = (uint8_t)version;
    out[3] = (uint8_t)kind;
    memmove(out + HEADER_BYTES, body, n);
    tag(w, out, out + HEADER_BYTES, n, out + PREFIX_BYTES);
    return HEADER_BYTES + n;
}

/* ---- msgpack, read as msgpack-python's unpackb reads it -------------------------- */

enum cls { C_INT, C_NEG, C_BOOL, C_NIL, C_FLOAT, C_STR, C_BYTES, C_LIST, C_MAP, C_TS };
enum { E_NONE, E_TRUNCATED, E_MALFORMED };

typedef struct {
    int cls;
    uint64_t u;             /* C_INT: the value; C_LIST, C_MAP: the count */
    uint32_t off, len;      /* C_STR, C_BYTES: the data, offset from base */
} val_t;

/* what the body map is matched against while it is read */
typedef struct {
    const schema_t *schema;     /* NULL: no schema (the type is not known yet) */
    int foreign;                /* a key that is no field of the schema */
    int seen[LLFT_WIRE_MAX_FIELDS];
    val_t vals[LLFT_WIRE_MAX_FIELDS];
    unsigned order[LLFT_WIRE_MAX_FIELDS], norder;
} body_t;

typedef struct {
    const uint8_t *base, *p, *end;
    uint64_t max_array, max_map;    /* unpackb: len(payload), len(payload) // 2 */
    int err;
    const llft_wire *w;
    val_t items[PAYLOAD_LEN];       /* the top-level array's first items */
    body_t body;
} rd_t;

static int need(rd_t *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) { r->err = E_TRUNCATED; return 0; }
    return 1;
}

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* strict UTF-8, as CPython's decoder: no overlongs, no surrogates, nothing past U+10FFFF */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) k = 1;
        else if (c == 0xe0) { k = 2; lo = 0xa0; }
        else if (c >= 0xe1 && c <= 0xec) k = 2;
        else if (c == 0xed) { k = 2; hi = 0x9f; }
        else if (c >= 0xee && c <= 0xef) k = 2;
        else if (c == 0xf0) { k = 3; lo = 0x90; }
        else if (c >= 0xf1 && c <= 0xf3) k = 3;
        else if (c == 0xf4) { k = 3; hi = 0x8f; }
        else return 0;
        if (n - i <= k) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xbf) return 0;
        i += k + 1;
    }
    return 1;
}

static int read_value(rd_t *r, unsigned depth, val_t *v, int role);

enum { ROLE_NONE, ROLE_TOP, ROLE_BODY };   /* which values are kept, not only checked */

static int raw(rd_t *r, size_t len, int cls, val_t *v) {
    if (!need(r, len)) return 0;
    if (cls == C_STR && !utf8_ok(r->p, len)) { r->err = E_MALFORMED; return 0; }
    v->cls = cls;
    v->off = (uint32_t)(r->p - r->base);
    v->len = (uint32_t)len;
    r->p += len;
    return 1;
}

static int ext(rd_t *r, size_t len, val_t *v) {
    if (!need(r, len + 1)) return 0;
    int8_t type = (int8_t)r->p[0];
    const uint8_t *d = r->p + 1;
    r->p += len + 1;
    if (type != -1) { r->err = E_MALFORMED; return 0; }     /* wire._no_ext */
    uint64_t nanos = 0;
    if (len == 4) nanos = 0;
    else if (len == 8) nanos = be(d, 8) >> 34;
    else if (len == 12) nanos = be(d, 4);
    else { r->err = E_MALFORMED; return 0; }
    if (nanos > 999999999u) { r->err = E_MALFORMED; return 0; }
    v->cls = C_TS;
    return 1;
}

static void body_pair(body_t *b, const val_t *key, const val_t *value, const uint8_t *base) {
    if (b->schema == NULL) return;
    if (key->cls != C_STR) { b->foreign = 1; return; }     /* bytes: never a str name */
    const schema_t *s = b->schema;
    for (unsigned j = 0; j < s->nfields; j++) {
        if (s->name_len[j] == key->len && memcmp(s->names[j], base + key->off, key->len) == 0) {
            if (!b->seen[j]) { b->seen[j] = 1; b->order[b->norder++] = j; }
            b->vals[j] = *value;                              /* a repeated key: last wins */
            return;
        }
    }
    b->foreign = 1;
}

static int container(rd_t *r, unsigned depth, uint64_t count, int is_map, val_t *v, int role) {
    if (depth >= MAX_DEPTH) { r->err = E_MALFORMED; return 0; }          /* StackError */
    if (count > (is_map ? r->max_map : r->max_array)) { r->err = E_MALFORMED; return 0; }
    v->cls = is_map ? C_MAP : C_LIST;
    v->u = count;
    for (uint64_t i = 0; i < count; i++) {
        val_t a, b;
        if (is_map) {
            if (!read_value(r, depth + 1, &a, ROLE_NONE)) return 0;
            if (!read_value(r, depth + 1, &b, ROLE_NONE)) return 0;
            if (a.cls != C_STR && a.cls != C_BYTES) { r->err = E_MALFORMED; return 0; }
            if (role == ROLE_BODY) body_pair(&r->body, &a, &b, r->base);
        } else {
            /* the type (item 0) is known before the body (item 12) is read */
            int child = role == ROLE_TOP && i == 12 ? ROLE_BODY : ROLE_NONE;
            if (child == ROLE_BODY) {
                const val_t *t = &r->items[0];
                r->body.schema = t->cls == C_INT && t->u < 256 && r->w->types[t->u].present
                                 ? &r->w->types[t->u] : NULL;
            }
            if (!read_value(r, depth + 1, &a, child)) return 0;
            if (role == ROLE_TOP && i < PAYLOAD_LEN) r->items[i] = a;
        }
    }
    return 1;
}

static int read_value(rd_t *r, unsigned depth, val_t *v, int role) {
    if (!need(r, 1)) return 0;
    uint8_t c = *r->p++;
    memset(v, 0, sizeof *v);
    if (c <= 0x7f) { v->cls = C_INT; v->u = c; return 1; }
    if (c >= 0xe0) { v->cls = C_NEG; return 1; }
    if (c >= 0xa0 && c <= 0xbf) return raw(r, c & 0x1f, C_STR, v);
    if (c >= 0x90 && c <= 0x9f) return container(r, depth, c & 0x0f, 0, v, role);
    if (c >= 0x80 && c <= 0x8f) return container(r, depth, c & 0x0f, 1, v, role);
    int n;
    switch (c) {
    case 0xc0: v->cls = C_NIL; return 1;
    case 0xc2: case 0xc3: v->cls = C_BOOL; return 1;
    case 0xca: case 0xcb:
        n = c == 0xca ? 4 : 8;
        if (!need(r, n)) return 0;
        r->p += n; v->cls = C_FLOAT; return 1;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        n = 1 << (c - 0xcc);
        if (!need(r, n)) return 0;
        v->cls = C_INT; v->u = be(r->p, n); r->p += n; return 1;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        n = 1 << (c - 0xd0);
        if (!need(r, n)) return 0;
        uint64_t u = be(r->p, n);
        r->p += n;
        int neg = (u >> (8 * n - 1)) & 1;      /* the sign bit of an n-byte integer */
        if (neg) { v->cls = C_NEG; } else { v->cls = C_INT; v->u = u; }
        return 1;
    }
    case 0xd9: case 0xda: case 0xdb: case 0xc4: case 0xc5: case 0xc6: {
        n = c == 0xd9 || c == 0xc4 ? 1 : c == 0xda || c == 0xc5 ? 2 : 4;
        if (!need(r, n)) return 0;
        size_t len = (size_t)be(r->p, n);
        r->p += n;
        return raw(r, len, c >= 0xd9 ? C_STR : C_BYTES, v);
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        return ext(r, (size_t)1 << (c - 0xd4), v);
    case 0xc7: case 0xc8: case 0xc9: {
        n = 1 << (c - 0xc7);
        if (!need(r, n)) return 0;
        size_t len = (size_t)be(r->p, n);
        r->p += n;
        return ext(r, len, v);
    }
    case 0xdc: case 0xdd: case 0xde: case 0xdf: {
        n = c & 1 ? 4 : 2;
        if (!need(r, n)) return 0;
        uint64_t count = be(r->p, n);
        r->p += n;
        return container(r, depth, count, c >= 0xde, v, role);
    }
    default:                                    /* 0xc1: never used (FormatError) */
        r->err = E_MALFORMED;
        return 0;
    }
}

/* ---- the llft payload, checked in wire._parse's order ------------------------------ */

static void reject(uint64_t *out, int reason) { out[0] = LLFT_WIRE_REJECT + reason; }

static uint64_t span(const val_t *v, size_t base) {
    return ((uint64_t)(v->off + base) << 32) | v->len;
}

static void parse(const llft_wire *w, const uint8_t *payload, size_t n, size_t base,
                  size_t max_message_bytes, uint64_t *out) {
    if (n > max_message_bytes) { reject(out, LLFT_WIRE_R_OVERSIZE); return; }
    rd_t *r = &(rd_t){0};
    r->base = payload;
    r->p = payload;
    r->end = payload + n;
    r->max_array = n;
    r->max_map = n / 2;
    r->w = w;
    val_t top;
    if (!read_value(r, 0, &top, ROLE_TOP)) {
        reject(out, r->err == E_TRUNCATED ? LLFT_WIRE_R_TRUNCATED : LLFT_WIRE_R_MALFORMED);
        return;
    }
    if (r->p != r->end) { reject(out, LLFT_WIRE_R_MALFORMED); return; }    /* ExtraData */
    if (top.cls != C_LIST || top.u != PAYLOAD_LEN) { reject(out, LLFT_WIRE_R_MALFORMED); return; }
    const val_t *it = r->items;
    if (it[0].cls == C_NEG) { reject(out, LLFT_WIRE_R_UNKNOWN_TYPE); return; }
    if (it[0].cls != C_INT) { reject(out, LLFT_WIRE_R_MALFORMED); return; }
    if (it[0].u >= 256 || !w->types[it[0].u].present) {
        reject(out, LLFT_WIRE_R_UNKNOWN_TYPE);
        return;
    }
    const schema_t *s = &w->types[it[0].u];
    if (s->fallback) {              /* lists or strings in the body: the reference's */
        out[0] = LLFT_WIRE_FALLBACK;
        out[6] = ((uint64_t)base << 32) | n;
        return;
    }
    for (int g = 1; g <= 2; g++) {                                  /* _check_group */
        if (it[g].cls != C_STR || it[g].len == 0) { reject(out, LLFT_WIRE_R_MALFORMED); return; }
        if (it[g].len > MAX_GROUP_BYTES) { reject(out, LLFT_WIRE_R_OVERSIZE); return; }
    }
    for (int f = 3; f <= 11; f++) {                                 /* _check_uint */
        if (it[f].cls == C_NEG) { reject(out, LLFT_WIRE_R_OUT_OF_RANGE); return; }
        if (it[f].cls != C_INT) { reject(out, LLFT_WIRE_R_MALFORMED); return; }
        out[f] = it[f].u;
    }
    if (it[4].u > 1) { reject(out, LLFT_WIRE_R_OUT_OF_RANGE); return; }        /* role */
    if ((it[8].u > 0) != (s->data != 0)) { reject(out, LLFT_WIRE_R_OUT_OF_RANGE); return; }
    if (it[12].cls != C_MAP) { reject(out, LLFT_WIRE_R_MALFORMED); return; }   /* _check_body */
    const body_t *b = &r->body;
    if (b->foreign || b->norder != s->nfields) { reject(out, LLFT_WIRE_R_BAD_BODY); return; }
    for (unsigned j = 0; j < s->nfields; j++) {
        const val_t *v = &b->vals[j];
        int mask = v->cls == C_INT || v->cls == C_NEG ? LLFT_WIRE_INT
                 : v->cls == C_BYTES ? LLFT_WIRE_BYTES : 0;
        if (!(mask & s->masks[j])) { reject(out, LLFT_WIRE_R_BAD_BODY); return; }
        if (v->cls == C_NEG) { reject(out, LLFT_WIRE_R_OUT_OF_RANGE); return; }
    }
    if (it[13].cls != C_BYTES) { reject(out, LLFT_WIRE_R_MALFORMED); return; }
    out[0] = LLFT_WIRE_OK;
    out[2] = it[0].u;
    out[12] = span(&it[1], base);
    out[13] = span(&it[2], base);
    out[14] = span(&it[13], base);
    out[15] = b->norder;
    for (unsigned i = 0; i < b->norder; i++) {
        unsigned j = b->order[i];
        out[16 + i] = j;
        out[24 + i] = b->vals[j].cls == C_INT ? b->vals[j].u : span(&b->vals[j], base);
    }
}

void llft_wire_parse(const llft_wire *w, const char *payload, size_t n,
                     size_t max_message_bytes, uint64_t *out) {
    parse(w, (const uint8_t *)payload, n, 0, max_message_bytes, out);
}

/* ---- one datagram, in wire.Decoder._decode's order ---------------------------------- */

void llft_wire_open(const llft_wire *w, const char *dg_chars, size_t n,
                    size_t max_message_bytes, uint64_t *out) {
    const uint8_t *dg = (const uint8_t *)dg_chars;
    if (n < PREFIX_BYTES) {
        size_t m = n < 2 ? n : 2;
        reject(out, memcmp(dg, "LF", m) == 0 ? LLFT_WIRE_R_TRUNCATED : LLFT_WIRE_R_BAD_MAGIC);
        return;
    }
    if (dg[0] != 'L' || dg[1] != 'F') { reject(out, LLFT_WIRE_R_BAD_MAGIC); return; }
    if (!w->versions[dg[2]]) { reject(out, LLFT_WIRE_R_BAD_VERSION); return; }
    unsigned kind = dg[3];
    if (kind > 1) { reject(out, LLFT_WIRE_R_MALFORMED); return; }
    if (n > MAX_DATAGRAM_BYTES) { reject(out, LLFT_WIRE_R_OVERSIZE); return; }
    if (n < (kind == 0 ? HEADER_BYTES : FRAG_HEADER_BYTES)) {
        reject(out, LLFT_WIRE_R_TRUNCATED);
        return;
    }
    uint8_t expect[TAG_BYTES];
    tag(w, dg, dg + HEADER_BYTES, n - HEADER_BYTES, expect);
    if (CRYPTO_memcmp(expect, dg + PREFIX_BYTES, TAG_BYTES) != 0) {
        reject(out, LLFT_WIRE_R_BAD_MAC);
        return;
    }
    out[1] = dg[2];
    if (kind == 0) {
        parse(w, dg + HEADER_BYTES, n - HEADER_BYTES, HEADER_BYTES, max_message_bytes, out);
        return;
    }
    out[0] = LLFT_WIRE_FRAGMENT;
    out[2] = be(dg + HEADER_BYTES, 8);
    out[3] = be(dg + HEADER_BYTES + 8, 4);
    out[4] = be(dg + HEADER_BYTES + 12, 2);
    out[5] = be(dg + HEADER_BYTES + 14, 2);
    out[6] = ((uint64_t)FRAG_HEADER_BYTES << 32) | (n - FRAG_HEADER_BYTES);
}
