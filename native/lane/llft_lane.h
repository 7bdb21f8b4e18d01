/* llft_lane.h -- a steady lane in C (native._llft_lane): llft/protocol/messaging/lane.py's
 * SteadyLane, on raw datagrams.
 *
 * lane.py is the specification: a lone primary's messaging core lends its one steady
 * connection as a `Loan`, and the lane runs exactly two events on it, each only in its
 * steady form, or refuses (changes nothing; the owner takes the loan back and the core
 * handles the event):
 *
 *   receive   one whole datagram as it came off the socket: verified and parsed by the
 *             wire codec's own C code (native/wire/llft_wire.c, compiled into this
 *             module), then taken if it is the next in-order data message of the current
 *             remote view with a plain trailer, or a duplicate of one, a KEEP_ALIVE or
 *             a FIRST_ACK (its SECOND_ACK sealed into the control buffer)
 *             (SteadyLane.handle_message's conditions,
 *             the trailer read with trailer.py's unpack_trailer/checked_section rules);
 *             the result names the delivered bytes as a span of the datagram;
 *   send      the application's bytes, when every segment fits the window and every
 *             data message fits one datagram of the MTU: the sealed datagrams, byte for
 *             byte what wire.encode makes of the Message the core builds (SteadyLane.send).
 *
 * State. `llft_lane_state` is the loan's scalar fields, plainly (the Python adapter,
 * llft/protocol/messaging/native_lane.py, writes it from a Loan and reads it back). The
 * rest lives in the lane's fixed buffers, allocated once when the lane is made (sized
 * from the window and the MTU; no allocation per event):
 *   - the sent list: a ring of `window` slots, each the sealed datagram of one data
 *     message (at most the MTU) and its msn, ts, stream offset, data length, send time;
 *   - the remote's order-info sections the loan holds (`to_reflect`, `last_order_info`):
 *     each its canonical msgpack [pvn, first_pos, [chunk, ...]] (msgpack-python's packb
 *     of the list), so a reflection is trimmed (`_unreflected`) by skipping chunks and
 *     copied into the trailer as the core would pack it;
 *   - the connection's identity: our group and the remote group (UTF-8).
 * Python ints are unbounded, C's are not: a value of a loan that does not fit its field
 * makes the adapter refuse the loan, and an event that would carry a value past 64 bits
 * onto the wire or into the state is refused (LLFT_LANE_R_RANGE: the core then handles
 * it, and fails or not as it always did). Order-info positions, which a peer chooses
 * freely (a pvn may be negative; a section's last position is refused past
 * trailer.MAX_POSITION, 2^63 - 1), are kept exactly (`llft_lane_int`, 128 bits).
 *
 * The cdef region below is also read by cffi (native/lane_build.py).
 */
#ifndef LLFT_LANE_H
#define LLFT_LANE_H

#include <stddef.h>
#include <stdint.h>

/* ==== cdef begin ==================================================================== */
/* results of receive and send: OK, or why the event is not the lane's (nothing changed) */
#define LLFT_LANE_OK 0
#define LLFT_LANE_R_SIZE 1        /* receive: datagram larger than the lane's MTU */
#define LLFT_LANE_R_WIRE 2        /* receive: the codec refused it, or it is no whole
                                   * REQUEST/REPLY (fragment, other type, bad tag, ...) */
#define LLFT_LANE_R_HEADER 3      /* receive: not the next message of this connection's
                                   * current remote view (type, groups, seq, role,
                                   * sender, pvn, msn) */
#define LLFT_LANE_R_BODY 4        /* receive: a stream flag, no data, or not at `delivered` */
#define LLFT_LANE_R_TRAILER 5     /* receive: trailer absent, malformed, or with a
                                   * reflection or other connections (not steady) */
#define LLFT_LANE_R_RANGE 6       /* a number past what the state or the wire holds */
#define LLFT_LANE_R_EMPTY 7       /* send: no bytes */
#define LLFT_LANE_R_WINDOW 8      /* send: more than max_queue_bytes, or the window would
                                   * not take every segment at once */
#define LLFT_LANE_R_FRAGMENT 9    /* send: a data message would not fit one datagram */
#define LLFT_LANE_R_STATE 10      /* loading: the loan is not one this lane can hold */

/* what a receive took (llft_lane_rx.kind) */
#define LLFT_LANE_RX_DATA 0       /* the next data message: bytes delivered */
#define LLFT_LANE_RX_DUP 1        /* a duplicate data message (msn <= upto) */
#define LLFT_LANE_RX_KEEP_ALIVE 2
#define LLFT_LANE_RX_FIRST_ACK 3  /* ctl_len > 0: a SECOND_ACK sent (llft_lane_control) */

/* the connection timers a loan carries, in lane.py's CONNECTION_TIMERS order */
#define LLFT_LANE_TIMERS 8
#define LLFT_LANE_T_RETRANSMIT 2
#define LLFT_LANE_T_FIRST_ACK 4
#define LLFT_LANE_T_KEEPALIVE 5

/* the two sections a loan holds (llft_lane_section_bytes, llft_lane_load_section) */
#define LLFT_LANE_TO_REFLECT 0
#define LLFT_LANE_LAST_ORDER_INFO 1

/* what the wire must agree with (native_lane.py checks them against wire.py) */
#define LLFT_LANE_WIRE_VERSION 3
#define LLFT_LANE_REQUEST 1
#define LLFT_LANE_REPLY 2
#define LLFT_LANE_FIRST_ACK 3
#define LLFT_LANE_SECOND_ACK 4
#define LLFT_LANE_KEEP_ALIVE 5
#define LLFT_LANE_MAX_GROUP_BYTES 96
#define LLFT_LANE_MAX_WINDOW 4096
#define LLFT_LANE_HEADER_BYTES 20

/* an integer as Python holds it, within [-2^127, 2^127): hi * 2^64 + lo */
typedef struct {
    uint64_t lo;
    int64_t hi;
} llft_lane_int;

/* an order-info section held in the lane's buffer (has 0: None) */
typedef struct {
    uint8_t has;
    uint32_t len;               /* bytes of its canonical msgpack */
    llft_lane_int pvn;
    uint64_t first;             /* first_pos (> 0) */
    uint32_t nchunks;
    uint32_t chunks_at;         /* where the first chunk's encoding starts */
} llft_lane_section;

/* A Loan's scalar fields (lane.py), same names; has_X: X is not None. */
typedef struct {
    /* the endpoint's */
    uint64_t birth_id, pvn, precedence, clock;
    int64_t now;
    uint64_t gw;
    uint8_t gw_rose;
    uint64_t max_data_ts, served_pvn;
    uint8_t has_told_us;
    int64_t told_us;
    uint8_t has_reflected;
    llft_lane_int reflected_pvn, reflected_pos;
    uint8_t has_heard;
    int64_t heard;
    uint8_t has_primary_heard;
    uint64_t primary_heard_pvn, primary_heard_sender;
    int64_t primary_heard_us;
    uint64_t primary_heard_ts;          /* (rules.news_of_primary) */
    uint8_t primary_heard_set;
    /* the connection's: cid = (remote, seq, cid_role); role 0 CLIENT, 1 SERVER */
    uint64_t seq;
    uint8_t cid_role, role;
    uint64_t out_offset, next_msn;
    int64_t sent_bytes;
    uint64_t remote_ack;
    uint8_t has_srtt;                           /* rto = (srtt, rttvar, backoff, rto) */
    int64_t srtt, rttvar, backoff, rto, rto_floor, rto_ceiling;
    uint64_t fa_count, fa_msn;
    int64_t last_send_us;
    uint64_t last_back;
    uint8_t ka_urgent;
    uint64_t first_ts, ka_idle;
    uint64_t view_pvn, upto, view_ts;
    uint8_t has_first_offset;
    uint64_t first_offset;
    uint64_t delivered, declared_upto, declared_ts, recv_max_data_ts;
    uint64_t fa_pending, fa_tries, told_delivered, remote_gw, remote_delivered;
    llft_lane_section to_reflect, last_order_info;
    uint8_t timer_set[8];                      /* LLFT_LANE_TIMERS */
    int64_t timer_at[8];
    /* config */
    int64_t first_ack_delay_us, keepalive_us;
    uint64_t max_payload_bytes, window_msgs, max_queue_bytes;
    /* stats counted while lent: rx_REQUEST or rx_REPLY (the data type a lane takes),
     * rx_KEEP_ALIVE, rx_FIRST_ACK, dup_data */
    uint8_t has_rx;
    uint64_t rx;
    uint8_t has_rx_keep_alive, has_rx_first_ack, has_dup_data;
    uint64_t rx_keep_alive, rx_first_ack, dup_data;
    /* the sent list: sent_count slots of the ring, oldest at sent_head */
    uint32_t sent_head, sent_count;
} llft_lane_state;

/* one message of the sent list */
typedef struct {
    uint64_t msn, ts, offset;
    uint32_t data_len, dg_len;
    uint8_t has_sent_at;                        /* sent_at[msn] (Karn: none once resent) */
    int64_t sent_at;
} llft_lane_slot;

/* what receive took: its kind (LLFT_LANE_RX_*); for RX_DATA, what it delivered:
 * data_len bytes at data_at of the datagram, stream offset; for RX_FIRST_ACK, the
 * SECOND_ACK datagram it sealed (ctl_len bytes at llft_lane_control; 0: none) */
typedef struct {
    uint64_t offset;
    uint32_t data_at, data_len;
    uint8_t kind;
    uint32_t ctl_len;
} llft_lane_rx;

typedef struct llft_lane_codec llft_lane_codec;
typedef struct llft_lane llft_lane;

/* The wire codec of one 32-byte cluster key, set up for data messages (one per engine,
 * shared by its lanes); NULL on a bad key or no memory. */
llft_lane_codec *llft_lane_codec_new(const uint8_t *key, size_t key_len);
void llft_lane_codec_free(llft_lane_codec *codec);

/* A lane for datagrams of at most `mtu` bytes and a window of `window` messages, its
 * state zeroed (NULL: bad sizes or no memory). The codec must outlive it. */
llft_lane *llft_lane_new(const llft_lane_codec *codec, uint32_t mtu, uint32_t window);
void llft_lane_free(llft_lane *lane);
void llft_lane_reset(llft_lane *lane);
/* The scalar state, read and written in place by the loader. */
llft_lane_state *llft_lane_state_of(llft_lane *lane);

/* Loading, after the scalar state: our group and the remote's (UTF-8), each message of
 * the sent list oldest first (its sealed datagram, which the codec must accept as a
 * whole data message, and its sent_at entry), the sections (msgpack of a checked
 * section), then llft_lane_check. Each returns LLFT_LANE_OK or LLFT_LANE_R_STATE. */
int llft_lane_set_groups(llft_lane *lane, const char *group, size_t group_len,
                         const char *remote, size_t remote_len);
int llft_lane_load_sent(llft_lane *lane, const char *dg, size_t n, int has_sent_at,
                        int64_t sent_at);
int llft_lane_load_section(llft_lane *lane, int which, const char *raw, size_t n);
int llft_lane_check(const llft_lane *lane);

/* Reading back: the i-th message of the sent list (0: oldest; NULL past the end), its
 * sealed datagram, a section's canonical msgpack (its length in the state). */
const llft_lane_slot *llft_lane_slot_at(const llft_lane *lane, uint32_t i);
const char *llft_lane_datagram(const llft_lane *lane, uint32_t i);
const char *llft_lane_section_bytes(const llft_lane *lane, int which);
/* the control datagram the last receive sealed (a SECOND_ACK; its length in llft_lane_rx) */
const char *llft_lane_control(const llft_lane *lane);

/* The two events (results above). receive reads n bytes of dg (the datagram as
 * received); on OK, rx names the delivered bytes. send cuts n bytes of data into
 * max_payload_bytes segments; on OK, *nmsgs new messages end the sent list (their
 * datagrams: llft_lane_datagram). now_us: the event's time (send: has_now 0 for None). */
int llft_lane_receive(llft_lane *lane, const char *dg, size_t n, int64_t now_us,
                      llft_lane_rx *rx);
int llft_lane_send(llft_lane *lane, const char *data, size_t n, int has_now,
                   int64_t now_us, uint32_t *nmsgs);

/* The earliest connection deadline: 1 and *at_us, or 0 if none is set. */
int llft_lane_next_timer(const llft_lane *lane, int64_t *at_us);
/* ==== cdef end ====================================================================== */

#endif
