/* llft_backup.h -- a backup's steady lane in C (native._llft_lane, with llft_lane.h):
 * llft/protocol/messaging/backup_lane.py's BackupLane, the messaging half of rules 1, 2,
 * 3, 5 and 6 of docs/BACKUP_LANE.md, on raw datagrams where they come raw.
 *
 * backup_lane.py is the specification. A backup's messaging core lends what its steady
 * events touch as a `BackupLoan` (MessagingEndpoint.lend_backup); the adapter
 * (llft/protocol/messaging/native_backup_lane.py) writes it into `llft_bk_state` and
 * the lane's lists, and the lane runs the events below, each only in its steady form,
 * or refuses it (LLFT_BK_REFUSE / LLFT_BK_RANGE: nothing changed; the owner takes the
 * loan back and the core handles the event). What C takes, it does statement for
 * statement as the model does (the comments name the model's methods):
 *
 *   receive        a remote primary's REQUEST/REPLY, KEEP_ALIVE or FIRST_ACK, or a remote
 *                  backup's SECOND_ACK (_second_ack: the gap up to its ack), as it came
 *                  off the socket (verified and parsed by the wire codec's C): a data
 *                  message of the current remote view within the window, a duplicate,
 *                  or one that opens or fills a gap (placeholders and nacks, _expect;
 *                  the run it makes contiguous, _contiguous and _rx_data), each taken
 *                  message continuing the held bytes (_data); a KEEP_ALIVE or FIRST_ACK
 *                  (_control; its SECOND_ACK an action); the trailer's `delivered`,
 *                  the remote's own order info (kept), and its reflection of our view's
 *                  order info;
 *   intra          a message of our own group, given by its header (it reaches the node
 *                  decoded: membership reads it too): our primary's HEARTBEAT (_heartbeat:
 *                  the gw rise, its releases), our primary's direct ORDER_INFO
 *                  (_order_info), another backup's HEARTBEAT, ORDER_INFO or NACK (_peer);
 *   timer          our HEARTBEAT (_heartbeat_due: its `back`, the clock, quiet or not; the
 *                  adapter makes its body, from membership's hooks, and says whether
 *                  all but `back` is what the last one said), WATERMARK_REPORT,
 *                  ORDER_INFO_ACK (the report), NACK (the local NACK of the gaps) and
 *                  KEEPALIVE (cleared) when no timer of the core is due (handle_timer);
 *   set_executed   rule 6's messaging half;
 *   send           rule 5's messaging half: the app's output logged (copied: a segment's
 *                  bytes are freed when the log is trimmed).
 * Refused beyond the model (the core's then, as every refusal): a trailer listing other
 * connections or malformed, the remote's NACK, numbers past 64 bits.
 * A datagram of our own group, or of a type the codec here does not parse, is answered
 * LLFT_BK_NOT_RAW: the lane takes it decoded, or not at all, but did not refuse it.
 *
 * Messages on the held and received lists and in the slots are `llft_bk_msg`s: one the
 * loan brought names the adapter's Message (`ref`); one C took from a datagram holds a
 * copy of it (`dg`), which the adapter decodes if the loan goes back while it is held.
 * Each is freed (at the next event: an action may name it) when nothing holds it.
 *
 * Actions are written per event into a list the adapter reads after each call.
 * The cdef region below is also read by cffi (native/lane_build.py).
 */
#ifndef LLFT_BACKUP_H
#define LLFT_BACKUP_H

#include <stddef.h>
#include <stdint.h>

#include "llft_lane.h"      /* llft_lane_codec */

/* ==== cdef begin ==================================================================== */
#define LLFT_BK_OK 0
#define LLFT_BK_REFUSE 1          /* not this lane's event (nothing changed) */
#define LLFT_BK_RANGE 2           /* a number past what the state holds (nothing changed) */
#define LLFT_BK_STATE 3           /* loading: not a loan this lane can hold */
#define LLFT_BK_NOT_RAW 4         /* receive: a message the lane takes decoded only (our
                                   * group's), or that no lane takes: not a refusal of
                                   * this message by the lane (nothing changed) */

#define LLFT_BK_MAX_CONNS 16
#define LLFT_BK_MAX_REMOTES 16
#define LLFT_BK_MAX_MEMBERS 16    /* our group's members heard, and the backups */
#define LLFT_BK_MAX_PEER_PVNS 4   /* peer_oi_acks' views (pruned to two after a note) */
#define LLFT_BK_NONE 0xffffffff

/* the endpoint timers a loan carries (backup_lane.BACKUP_LANE_TIMERS' order) and each
 * connection's (BACKUP_LANE_CONN_TIMERS') */
#define LLFT_BK_T_HEARTBEAT 0
#define LLFT_BK_T_WATERMARK_REPORT 1
#define LLFT_BK_T_ORDER_INFO_ACK 2
#define LLFT_BK_CT_NACK 0
#define LLFT_BK_CT_KEEPALIVE 1

/* the counters (loan.stats): rx_<type> at the type's number, then these */
#define LLFT_BK_C_TYPES 16
#define LLFT_BK_C_DUP_DATA 16
#define LLFT_BK_C_OI_VIA_REFLECTION 17
#define LLFT_BK_C_OI_VIA_INTRA 18
#define LLFT_BK_C_DUP_BYTES 19
#define LLFT_BK_C_AFTER_END 20
#define LLFT_BK_C_STREAM_ENDS 21
#define LLFT_BK_C_NACK_MSNS 22
#define LLFT_BK_COUNTERS 23

/* action kinds */
#define LLFT_BK_A_DELIVER 0       /* conn, msg, len: Deliver(cid, msg offset, the first
                                   * len bytes of msg data) */
#define LLFT_BK_A_ORDER_INFO 1    /* a = pos, at/len: the chunk's bytes in the event's
                                   * buffer (datagram or order_info): DeliverOrderInfo */
#define LLFT_BK_A_REPORT 2        /* a = upto, b = done, c = back, d = ack, t = ts: the
                                   * ORDER_INFO report to our group (_send_intra) */
#define LLFT_BK_A_SECOND_ACK 3    /* conn, a = ack, c = back, t = ts (_on_first_ack) */
#define LLFT_BK_A_CLOSED 4        /* conn, a = end, b = abort: Closed(cid, end, abort) */
#define LLFT_BK_A_NACK_ENTRY 5    /* conn, a = view pvn, at/len: its msns in
                                   * llft_bk_nack_msns (one entry of the local NACK) */
#define LLFT_BK_A_LOCAL_NACK 6    /* t = ts: the local NACK of the entries before it */
#define LLFT_BK_A_HEARTBEAT 7     /* b = quiet (the last one again), c = back, t = ts:
                                   * our HEARTBEAT (_heartbeat) */

/* the message types it reads (native_backup_lane.py checks them against messages.py) */
#define LLFT_BK_HEARTBEAT 7
#define LLFT_BK_ORDER_INFO 8
#define LLFT_BK_NACK 6

/* a message of a held or received list */
typedef struct {
    uint64_t msn, ts, offset, pvn, flags;
    uint32_t data_len;
    uint32_t ref;               /* the adapter's Message, or LLFT_BK_NONE: in dg */
    const char *dg;             /* the datagram C took it from (ref NONE) */
    uint32_t dg_len, data_at;   /* its data: data_len bytes at data_at of dg */
    uint32_t lists;             /* (internal) how many lists (and slots) hold it */
} llft_bk_msg;

/* a segment of a connection's output log: (msn, offset, data), its bytes C's own */
typedef struct {
    uint64_t msn, offset;
    uint32_t len;
    const char *data;
} llft_bk_seg;

typedef struct {
    uint8_t kind;
    uint32_t conn;
    const llft_bk_msg *msg;
    uint64_t a, b, c, d, t;
    uint32_t at, len;
} llft_bk_action;

/* a connection of the loan (HeldConn; cid = (remote group, seq, role)) */
typedef struct {
    uint32_t remote;            /* index into remotes */
    uint64_t seq;
    uint8_t role;               /* the cid's role: 0 CLIENT, 1 SERVER */
    uint8_t holding, known, sending, after_change, resyncing, throttled, send_ended;
    uint8_t has_end, abort;     /* the remote stream's end marker (constant while lent) */
    uint64_t end;
    uint64_t delivered, covered, term;
    uint8_t has_view;
    uint64_t view_pvn, upto, ts;
    uint8_t has_first_offset;
    uint64_t first_offset;
    uint64_t declared_upto, declared_ts, max_data_ts;
    uint64_t fa_count, ka_idle, log_bytes, remote_gw, remote_delivered;
    uint64_t out_offset, next_msn, fa_msn, last_back;
    int64_t last_send_us;
    uint8_t timer_set[2];
    int64_t timer_at[2];
    llft_lane_section last_order_info;  /* the remote's own order info kept (its bytes:
                                         * llft_bk_section) */
} llft_bk_conn;

/* a remote group of the lent connections: `heard` and `primary_heard` of it */
typedef struct {
    char name[96];              /* UTF-8 (wire.MAX_GROUP_BYTES) */
    uint32_t name_len;
    uint8_t heard_set;          /* heard[name] set while lent, at heard_order */
    uint64_t heard_order;
    int64_t heard_us;
    uint8_t has_ph;             /* primary_heard[name] = (pvn, sender, us, ts) */
    uint64_t ph_pvn, ph_sender;
    int64_t ph_us;
    uint64_t ph_ts;
    uint8_t ph_set;             /* primary_heard_set[name], at ph_order */
    uint64_t ph_order;
} llft_bk_remote;

typedef struct {
    uint64_t sender;
    int64_t at_us;
} llft_bk_heard;

typedef struct {
    uint64_t pvn;
    uint32_t n;
    uint64_t sender[16];        /* LLFT_BK_MAX_MEMBERS */
    uint64_t upto[16];
} llft_bk_peer_acks;

/* BackupLoan's fields, same names (those constant while lent stay the adapter's) */
typedef struct {
    uint64_t birth_id, pvn, precedence, primary_id, clock;
    int64_t now;
    uint64_t gw, digest, max_data_ts, reported_w;
    uint8_t has_backups, hb_quiet;
    uint64_t last_hb_back;              /* our last HEARTBEAT's `back` */
    uint64_t pulse_intervals;
    uint64_t oi_delivered, oi_acked, oi_done_acked, oi_executed;
    uint8_t oi_pending;
    /* config */
    int64_t watermark_report_us, order_info_ack_us, nack_delay_us, nack_retry_us,
        keepalive_us, heartbeat_us;
    uint64_t max_order_info_pending, window_bytes, max_placeholders, max_nack_msns,
        max_log_bytes, max_payload_bytes;
    uint8_t timer_set[3];
    int64_t timer_at[3];
    uint32_t nconns, nremotes, nheard, nbackups, npeer;
    llft_bk_conn conns[16];             /* LLFT_BK_MAX_CONNS, in connection order */
    llft_bk_remote remotes[16];         /* LLFT_BK_MAX_REMOTES */
    llft_bk_heard last_heard[16];       /* set while lent, in the order first set */
    uint64_t backups[16];
    llft_bk_peer_acks peer[4];          /* LLFT_BK_MAX_PEER_PVNS */
    uint64_t order;                     /* the next heard/primary_heard order stamp */
    uint64_t counters[23];              /* LLFT_BK_COUNTERS */
} llft_bk_state;

typedef struct llft_bk llft_bk;

/* A backup lane for datagrams of at most `mtu` bytes (the codec: llft_lane_codec_new,
 * which must outlive it); NULL on bad sizes or no memory. */
llft_bk *llft_bk_new(const llft_lane_codec *codec, uint32_t mtu);
void llft_bk_free(llft_bk *L);
/* empty again for the next loan (every message it held freed) */
void llft_bk_reset(llft_bk *L);
llft_bk_state *llft_bk_state_of(llft_bk *L);

/* Loading, after the scalar state (group name, then each list oldest first), then
 * llft_bk_check. Each returns LLFT_BK_OK or LLFT_BK_STATE. `which`: 0 held, 1 received.
 * llft_bk_add_msg makes a message the adapter holds (its index, or -1); push appends a
 * message (by that index) to a list: a message on both lists is pushed twice. */
int llft_bk_set_group(llft_bk *L, const char *group, size_t n);
int64_t llft_bk_add_msg(llft_bk *L, uint64_t msn, uint64_t ts, uint64_t offset,
                        uint64_t pvn, uint64_t flags, uint32_t data_len, uint32_t ref);
int llft_bk_push(llft_bk *L, uint32_t conn, int which, int64_t msg);
int llft_bk_push_seg(llft_bk *L, uint32_t conn, uint64_t msn, uint64_t offset,
                     const char *data, uint32_t len);
/* a slot of the connection's receive window (its upto and max_placeholders set):
 * msg -1 a placeholder, else a message made by llft_bk_add_msg; nack: in `nacks` */
int llft_bk_load_slot(llft_bk *L, uint32_t conn, uint64_t msn, int64_t msg, int nack);
/* the connection's last_order_info: msgpack of a checked section */
int llft_bk_load_section(llft_bk *L, uint32_t conn, const char *raw, size_t n);
int llft_bk_check(llft_bk *L);

/* Reading back: a list's length and its i-th message, a log's i-th segment. */
uint32_t llft_bk_list_len(const llft_bk *L, uint32_t conn, int which);
const llft_bk_msg *llft_bk_list_at(const llft_bk *L, uint32_t conn, int which, uint32_t i);
uint32_t llft_bk_log_len(const llft_bk *L, uint32_t conn);
const llft_bk_seg *llft_bk_log_at(const llft_bk *L, uint32_t conn, uint32_t i);
/* the slot of `msn`: 0 none, 1 a placeholder, 2 a message (*msg); *nack: in `nacks` */
int llft_bk_slot(const llft_bk *L, uint32_t conn, uint64_t msn, const llft_bk_msg **msg,
                 int *nack);
/* the msns the last event's NACK entries name (LLFT_BK_A_NACK_ENTRY's at/len) */
const uint64_t *llft_bk_nack_msns(const llft_bk *L);
/* a connection's last_order_info, canonical msgpack (its length: the state's) */
const char *llft_bk_section(const llft_bk *L, uint32_t conn);

/* The events. Each returns LLFT_BK_OK (its actions: llft_bk_actions) or a refusal.
 * intra: a message whose src_group and dst_group are our group (the adapter checks
 * the names), by its header; oi: its order_info; has_upto/upto: its body's `upto` if
 * that is an int (an ORDER_INFO's). timer: core_next, the core's own next deadline
 * (has_core_next 0: none); hb_same: if our HEARTBEAT fires, all it says but `back` is
 * what the last one said (the adapter compares the body). send: n bytes of the app's
 * output, logged as segments (*taken: the bytes taken). */
int llft_bk_receive(llft_bk *L, const char *dg, size_t n, int64_t now_us);
int llft_bk_intra(llft_bk *L, unsigned type, uint64_t sender, uint64_t pvn, uint64_t ack,
                  uint64_t back, uint64_t ts, const char *oi, size_t oi_len, int has_upto,
                  uint64_t upto, int64_t now_us);
int llft_bk_timer(llft_bk *L, int64_t now_us, int has_core_next, int64_t core_next_us,
                  int hb_same);
int llft_bk_set_executed(llft_bk *L, uint64_t pos, int has_now, int64_t now_us);
int llft_bk_send(llft_bk *L, uint32_t conn, const char *data, uint64_t n, int has_now,
                 int64_t now_us, uint64_t *taken);
int64_t llft_bk_send_space(const llft_bk *L, uint32_t conn);

/* the last event's actions */
const llft_bk_action *llft_bk_actions(const llft_bk *L, uint32_t *n);
/* the earliest deadline the loan carries: 1 and *at_us, or 0 */
int llft_bk_next_timer(const llft_bk *L, int64_t *at_us);
/* ==== cdef end ====================================================================== */

#endif
