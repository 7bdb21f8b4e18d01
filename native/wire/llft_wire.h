/* llft_wire.h -- the wire codec's per-datagram work in C (native._llft_wire).
 *
 * llft/protocol/wire.py is the specification and the reference model: its Decoder
 * refuses every bad datagram for one named reason, in a fixed order. This module does
 * the same per-datagram work without Python objects, and must give exactly the same
 * verdict, field for field and reason for reason, on every input (tests/unit/
 * test_wire_native.py fuzzes both side by side; the simulator can run every node's
 * decoder in "differential" mode, failing on the first datagram they judge apart).
 *
 *   open   prefix checks, the HMAC-SHA256 tag (OpenSSL's SHA-256 from precomputed key
 *          pads: two compressions less per datagram than hmac.digest), then the whole
 *          msgpack payload validated as msgpack-python's unpackb(raw=False,
 *          strict_map_key=True, ext_hook refusing all but timestamps) would read it, and
 *          the llft header and body checked as wire._parse does;
 *   seal   the datagram prefix and tag in front of a payload (the encoder's half).
 *
 * Results are numbers and spans, never objects: Python slices the bytes it passed in
 * (buffers are char *, so cffi passes a bytes object without a copy).
 * Message types whose body holds lists or strings (NACK and four membership messages,
 * all rare) are handed back as LLFT_WIRE_FALLBACK once their tag is good: the reference
 * parses those.
 *
 * The cdef region below is also read by cffi (native/wire_build.py).
 */
#ifndef LLFT_WIRE_H
#define LLFT_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* ==== cdef begin ==================================================================== */
/* verdicts (out[0]) */
#define LLFT_WIRE_OK 0            /* a whole message, parsed */
#define LLFT_WIRE_FALLBACK 1      /* tag good; the payload is the reference's to parse */
#define LLFT_WIRE_FRAGMENT 2      /* tag good; a fragment (out[2..6]) */
#define LLFT_WIRE_REJECT 16       /* + one of the reasons below (wire.Reject's names) */
#define LLFT_WIRE_R_TRUNCATED 0
#define LLFT_WIRE_R_BAD_MAGIC 1
#define LLFT_WIRE_R_BAD_VERSION 2
#define LLFT_WIRE_R_OVERSIZE 3
#define LLFT_WIRE_R_BAD_MAC 4
#define LLFT_WIRE_R_MALFORMED 5
#define LLFT_WIRE_R_UNKNOWN_TYPE 6
#define LLFT_WIRE_R_BAD_BODY 7
#define LLFT_WIRE_R_OUT_OF_RANGE 8

/* value classes a body field may take (a bit mask per field) */
#define LLFT_WIRE_INT 1
#define LLFT_WIRE_BYTES 2
#define LLFT_WIRE_STR 4
#define LLFT_WIRE_LIST 8

#define LLFT_WIRE_MAX_FIELDS 8    /* body fields of one message type */
#define LLFT_WIRE_OUT 40          /* uint64 words of a result */

/* Layout of a result (uint64 words). A span is offset << 32 | length, offsets counted
 * from the start of the buffer passed in.
 *   [0] verdict  [1] version
 *   OK:       [2] type  [3..11] conn_seq role pvn precedence sender msn ack back ts
 *             [12] src_group span  [13] dst_group span  [14] order_info span
 *             [15] n body fields, then per field in the order its key first appeared:
 *             [16+i] its index in the type's schema, [24+i] its value (int, or span)
 *   FRAGMENT: [2] sender [3] frag_id [4] index [5] count [6] chunk span
 *   FALLBACK: [6] payload span */

typedef struct llft_wire llft_wire;

/* A codec for one 32-byte cluster key; NULL on a bad key or no memory. */
llft_wire *llft_wire_new(const uint8_t *key, size_t key_len);
void llft_wire_free(llft_wire *w);
/* Accept datagrams of this wire version. */
void llft_wire_support(llft_wire *w, unsigned version);
/* The schema of message type `type` (< 256): data (msn > 0 required) or not, and
 * nfields fields, names NUL-terminated one after another in `names`, each with the
 * mask of value classes it accepts. 0, or -1 on bad arguments. */
int llft_wire_schema(llft_wire *w, unsigned type, int data, unsigned nfields,
                     const char *names, const uint8_t *masks);
/* Judge one datagram (see the layout above); max_message_bytes bounds its payload. */
void llft_wire_open(const llft_wire *w, const char *dg, size_t n,
                    size_t max_message_bytes, uint64_t *out);
/* Parse one payload alone (a reassembled message): out as for open, [1] untouched. */
void llft_wire_parse(const llft_wire *w, const char *payload, size_t n,
                     size_t max_message_bytes, uint64_t *out);
/* Write prefix + tag + body into out (room for 20 + n bytes); returns 20 + n. */
size_t llft_wire_seal(const llft_wire *w, unsigned version, unsigned kind,
                      const char *body, size_t n, char *out);
/* ==== cdef end ====================================================================== */

#endif
