"""`MessagingEndpoint`: the LLFT messaging protocol of one replica, as a sans-IO state
machine (the package's __init__ gives the map of its parts and the API).

Theory of operation
-------------------
The endpoint owns the replica's end of every virtual connection of its group
(connection.py), one timer registry (timers.py) and the order-info log
(orderinfo_log.py); it dispatches messages and timers to its handlers through tables
at the end of this module, keyed by role where primary and backup differ. Pseudocode
line numbers below refer to the paper's messaging algorithm figure.

Roles. The primary multicasts data; a backup creates and logs the messages its own
application produces, but never sends them (semi-active replication). Every member of a
group receives the remote primary's messages (they are multicast to the group's virtual
port) and delivers them in the remote primary's msn order.

Sending (lines 9-17, 45-46). `send(conn, data)` cuts the bytes into segments of at most
`max_payload_bytes` and gives each a stream offset. The primary sends a segment
as a REQUEST/REPLY with the next msn, a fresh Lamport timestamp, `ack` = last msn
received without a gap on the connection (piggybacked ack, line 10) and `back` =
mygroupwatermark, and keeps it in the sent list; when the remote primary has not acked
within the retransmission timeout of that remote group it resends the oldest unacked
message and states its sent-up-to in a KEEP_ALIVE (the remote NACKs the rest it lacks;
`_retransmit`), the timeout (one estimate shared by its connections): estimated from measured round trips (Jacobson/Karels SRTT + 4 RTTVAR, Karn's rule: no sample from a
retransmitted message), at least `retransmit_us`, doubling on each timeout up to
`retransmit_max_us`, and not reset by acks (connection.RtoEstimator).
Flow control follows the slowest member: the sent list only shrinks when the *remote
group watermark* covers a message (every remote member has it), and the primary never
has more than `window_msgs` messages in it; so no remote backup falls out of the window.

Receiving (lines 21-32). A data message with a gap creates placeholders and nack
entries; a retransmission fills a placeholder or is discarded. Contiguous messages are
delivered; the stream offset de-duplicates bytes (msns are per primary view and restart
at 1, offsets never do). The primary nacks the remote primary on the remote connection;
a backup nacks its own primary on the local (intra-group) connection and the primary
re-multicasts the remote primary's original message to its group (lines 49-52). A
local NACK body is a list of [remote_group, conn_seq, role, pvn, msn...] entries; the
entry [remote_group, conn_seq, role, 0] asks for the NEW_PRIMARY_VIEW_ACK below, and
[remote_group, conn_seq, role, 0, lo, hi] for stream bytes [lo, hi) of any remote view.

FirstAck / SecondAck / KeepAlive (lines 47-48, 54-55, 60-72). A primary that received
data and has nothing to send within `first_ack_delay_us` multicasts FIRST_ACK(ack), and
repeats it until a SECOND_ACK acks as much. A backup of the remote group answers a
FIRST_ACK with SECOND_ACK only if its own application has produced the acked message;
with no backup, the primary answers. FIRST_ACKs for the primary's last sent message,
`first_ack_slowdown` times, throttle the primary (intra-group flow control, lines 65-66)
until a KEEP_ALIVE or newer ack or `throttle_us`. An idle connection gets a KEEP_ALIVE
every `keepalive_us`, unless another message to the same group went out meanwhile (its
trailer states every connection's sent-up-to: one keep-alive per group and interval). A backup that sees a SECOND_ACK (or a remote primary's sent-up-to,
below) beyond what it received nacks the gap (line 72); after a remote change of primary
only the sent-up-to counts (the SECOND_ACK may echo an msn of the previous view).

Timestamps and buffer management (lines 76-84). Every message carries a Lamport
timestamp (`ts`; the clock merges every received ts). Per connection a member records
`recv_ts`: every data message of the remote primary's current view with ts <= recv_ts
has been received. A remote primary's control messages (FIRST_ACK, KEEP_ALIVE, NACK,
NEW_PRIMARY_VIEW) state its sent-up-to msn in our trailer (below): once a member has
everything up to it, `recv_ts` rises to that message's ts, which is below every ts the
remote primary will use later; idle connections therefore do not pin the watermark
for long. A sender also states the sent-up-to of its other connections to the same
group, and a primary holding received data its group watermark does not cover yet asks
the remote primary of an idle connection that pins it for a fresh KEEP_ALIVE (an empty
NACK), so one quiet connection does not pace all the others. What holds for a whole
remote group is said once per group, not per connection: the others' sent-up-to rides
on KEEP_ALIVEs and on one data message per group and first_ack_delay_us, one connection
per group is asked, one KEEP_ALIVE per group carries a risen watermark (its `back`
holds for every connection it lists).
  mytimestampwatermark = min over known connections of recv_ts   (each member)
  mygroupwatermark     = min(primary's own, every backup's)        (the primary, from
                         the backups' HEARTBEAT `back`)
  remotegroupwatermark = the largest `back` received on a connection
The sender drops sent messages with ts <= remotegroupwatermark (line 80); every member
drops received messages with ts <= mygroupwatermark (line 83; backups learn it from the
primary's HEARTBEAT `back`). A backup's watermark only counts if it knows the same set
of connections (and remote views) as the primary: its HEARTBEAT `ack` carries a digest
of that set, so a backup that never heard of a connection cannot let the primary (and
the remote sender) discard messages it lacks; likewise a backup uses the primary's group
watermark only when the primary's HEARTBEAT `ack` digest equals its own (a message on a
connection learned later may carry a lower timestamp).

Order info (orderinfo_log.py) and the trailer that carries it with each message's
sent-up-to, the sender's other connections and its delivered offset (trailer.py).

Backups reason in stream offsets, never in msns: the agent reads the application's bytes
in whatever chunks the socket gives it, so the primary and its backups cut the same
stream into different messages. A backup answers a FIRST_ACK with SECOND_ACK when its
application has produced the stream up to the remote primary's `delivered` offset, and
it trims its log below (`delivered` - window_msgs * max_payload_bytes): the primary's
sent list never holds more than a window past the remote group watermark, so those bytes
are covered; at quiescence a backup holds at most a window (+ one message) of bytes per
connection.

Change of primary (membership, phase 2). `set_view()` installs a view. A backup that
becomes primary resets msns to 1 and, on each connection, multicasts NEW_PRIMARY_VIEW
(last_delivered = stream offset it delivered) until the remote primary answers
NEW_PRIMARY_VIEW_ACK(last_delivered_from, last_sent_to); it then re-sends from its log
exactly the bytes from last_delivered_from on. A remote primary that receives
NEW_PRIMARY_VIEW flushes what it had not delivered from the old primary and answers,
reflecting the old primary's last order info it holds (`RecoveredOrderInfo` at the new
primary; every replica keeps the last piggyback it got, so a backup promoted before the
question comes answers as its primary would have). Its resend point is the lowest offset
any of its members may lack (its received list), and it gives the same answer to a
repeated NEW_PRIMARY_VIEW. The new primary's msn 1
is an empty message at the resend point, so receivers behind it see the gap and ask their
primary for the missing bytes by offset; until a member has delivered up to there its
watermark stays where the old view left it. The precedence check of lines 18-20 and
phase 1 belong to membership.

Stream end and freeing. `close(conn, abort)` ends our application's stream: the end is
one unit of the stream's offsets (a marker byte, flagged STREAM_FIN or STREAM_RST on the
message that carries it), so everything above -- ordering, retransmission, NACKs by msn
or offset, the resend of phase 2, a backup's log -- carries it like data, and the
receiver emits `Closed(conn, offset, abort)` exactly once, after the last byte. A primary
frees a connection (`Freed`; every timer and byte of it gone, its seq added to `closed`)
once both ends are in, the sent list is empty (the remote group watermark covers our
end: every remote member has our stream) and the received list is empty (our group
watermark covers the remote's end) and that end is the group's (taken in order from the
current remote view, or that view resumed beyond it: `ReceiveSide.end_is_groups`), or
once the remote primary answered CLOSED. A remote that LOST the connection (CLOSED on a
stream whose end we never delivered) or is gone (a group of one, `lone_groups`, silent
for remote_timeout_us) is taken as its reset after what the primary delivered
(`_peer_lost`): the primary re-multicasts to its backups what they may lack, frees once
its group watermark covers it or every backup said it holds the bytes up to the cut (its
HEARTBEATs announce the cuts of such waiting connections, `_waiting_cuts`, and each
backup's HEARTBEAT says how far it reaches toward each, `_reach`: a backup following
another remote view than its primary's may never have a watermark term that covers them),
and the free carries the cut. A primary answers any message on a connection
it freed with CLOSED (at most once per retransmit_us per connection): "both streams are
complete on my side"; a remote primary listing that connection in a trailer's `others`
counts as such a message (the freeing side no longer states the connection, and the
other side's own keep-alives on it back off while its other connections' trailers speak
for it). Backups free on their primary's word: its HEARTBEATs carry the frees its
backups have not all applied (in the `order_info` field), each backup's HEARTBEAT how
many it applied, and the digest is a sum over connections, so the primary knows the
digest of a backup that has not applied the latest frees yet. After a change of primary
the new primary re-announces its recent frees and backups report theirs until digests
match (`_reconcile_frees`). A server end does not send before the opener's first message
arrived (`_flush`), so the opener counts a connection it never heard back on at the ts
of its first message (`timestamp_watermark`). No per-connection timer or message exists
for an ended stream.

Bounds are in `MessagingConfig`; rules are in the tables of rules.py and the dispatch
tables below. No clock, no I/O, no randomness here.
"""
from __future__ import annotations

import dataclasses
import heapq
import zlib
from collections import deque
from typing import Any, Callable, Iterable

import msgpack

from llft.protocol.messages import (DATA_TYPES, MEMBERSHIP_CORE_TYPES, MEMBERSHIP_TYPES,
                                    STREAM_END, STREAM_FIN, STREAM_OPEN, STREAM_RST, Message,
                                    MsgType, Pulse, ROLES, Role, Send, probe, pulse_lease_us,
                                    pulse_until_us)
from llft.protocol.messaging.actions import (Closed, Deliver, DeliverOrderInfo, Freed, Opened,
                                             Phase2Done, RecoveredOrderInfo, Resynced)
from llft.protocol.messaging.closed import ClosedSeqs
from llft.protocol.messaging.config import (INTRA_CONN_SEQ, BufferFull, ConnId,
                                            MessagingConfig, ProtocolError)
from llft.protocol.messaging.connection import (Connection, ReceiveSequence, RtoEstimator,
                                                SendState)
from llft.protocol.messaging.backup_lane import (BACKUP_LANE_CONN_TIMERS, BACKUP_LANE_TIMERS,
                                                BackupLoan, HeldConn)
from llft.protocol.messaging.lane import Loan
from llft.protocol.messaging.orderinfo_log import OrderInfoLog
from llft.protocol.messaging.rules import (PRIMARY_ONLY_TYPES, RESPONDS_TO_FIRST_ACK, Duty,
                                           news_of_primary)
from llft.protocol.messaging.timers import (BACKUP_TIMERS, CONNECTION_TIMERS, ENDPOINT_TIMERS,
                                            PRIMARY_TIMERS, Timer, Timers)
from llft.protocol.messaging.trailer import (Section, pack_trailer, section_end,
                                             unpack_trailer, unreflected)


# compare the incremental timestamp watermark with its definition on every call (the
# simulator and the tests turn it on: O(connections) per call)
CHECK_WATERMARK = False
# an idle connection's own keep-alive: at least every 4 intervals, backing off to 16 while
# no data moves on it (many idle connections to one group then cost little)
KEEPALIVE_OWN_EVERY = 4
KEEPALIVE_OWN_MAX = 16
# ... and a primary without backups on an idle connection doubles its keep-alive interval
# this many times (15 ms -> 480 ms)
LONE_IDLE_BACKOFF = 5
# unacked order info is sent to the backups again after order_info_intra_us, doubling up
# to this many times while no ack comes
INTRA_BACKOFF_MAX = 5


class MessagingEndpoint:
    """The messaging core of one replica of `group` (see the module docstring)."""

    def __init__(self, group: str, birth_id: int, config: MessagingConfig | None = None):
        self.group = group
        self.birth_id = birth_id
        self.config = config or MessagingConfig()
        self.pvn = 0
        self.primary_id = birth_id
        self.members: list[tuple[int, int]] = [(birth_id, 1)]
        self.precedence = 1
        self.backups: list[int] = []
        self.ever_shared = False            # some membership had another member
        self.clock = 0                      # Lamport clock
        self._last_hb: Message | None = None    # our last HEARTBEAT (repeated while quiet)
        self._hb_quiet = False              # it said nothing new: next one a refresh later
        self.gw = 0                         # mygroupwatermark (backups: as told by primary)
        self.max_data_ts = 0                # highest ts of data kept on any connection
        self.conns: dict[ConnId, Connection] = {}
        # the timestamp watermark, kept incrementally (timestamp_watermark): each known
        # connection's term, a heap of (term, id, connection) with stale entries left in
        # it, and the connections whose term may have changed since it was last computed
        self._wm_terms: dict[Connection, int] = {}
        self._wm_heap: list[tuple[int, int, Connection]] = []
        self._wm_dirty: set[Connection] = set()
        # connections whose received list is not empty (what the group watermark frees)
        self._holding: set[Connection] = set()
        self._conn_order: dict[ConnId, int] = {}    # position in conns (timer firing order)
        self._told_us: dict[str, int] = {}  # remote group -> last trailer stating `others`
        self._rtos: dict[str, RtoEstimator] = {}    # remote group -> its RTO estimate
        self._reflected: dict[str, tuple[int, int]] = {}  # remote group -> (pvn, pos) reflected
        self._solicit_after: dict[str, int] = {}    # remote group -> not asked again before
        # backup -> (watermark, digest, frees applied) from its last report
        self.reports: dict[int, tuple[int, int, int]] = {}
        self.last_heard_us: dict[int, int] = {}
        # backup: what the other backups acked of each recent primary view's order info
        # (their ORDER_INFO reports are multicast to the group): a successor primary
        # re-sends the old view's tail from the lowest of them (ReplicaNode, "catch-up")
        self.peer_oi_acks: dict[int, dict[int, int]] = {}
        self._digest: int | None = None
        self._actions: list[Any] = []
        self._now = 0
        self.timers = Timers()
        self.reported_w = 0                 # backup: watermark in our last HEARTBEAT
        self._gw_rose = False
        self.order_info = OrderInfoLog(self.config)
        self.phase2_pvn: int | None = None  # new primary: the view whose phase 2 runs
        self.stats: dict[str, int] = {}
        self.closed = ClosedSeqs()          # connections freed here (never come back)
        self._ending: set[ConnId] = set()   # connections whose own stream has ended
        # primary: the connections it freed in this view that some backup may not have
        # applied yet, (cid, digest item) from position freed_base on (HEARTBEATs carry them)
        # (connection, its digest item, the offset of its reset if it was lost)
        self.freed_log: deque[tuple[ConnId, int, int | None]] = deque()
        self.freed_base = 0
        self.freed_applied = 0              # backup: its primary's frees applied, this view
        # the last connections freed here (any view): after a change of primary they
        # reconcile the new primary's set with its backups' (see _reconcile_frees)
        self.recent_frees: deque[ConnId] = deque(maxlen=self.config.max_freed_pending)
        self.carry: list[ConnId] = []       # backup: recent frees of earlier views, reported
        # the cut of each recent free of a lost connection: a new primary re-announcing
        # its recent frees gives it again (a backup that has not applied it delivers
        # exactly up to it, as the others did)
        self._recent_cuts: dict[ConnId, int] = {}
        # a connection whose remote is done or gone, waiting for its received list: the
        # primary announces its cut (`_waiting_cuts`), each backup says how far the bytes
        # it holds reach toward it (`_reach`), and the primary frees once every backup
        # holds the cut (`_cut_held`), whatever the group watermark says.
        # backup: cid -> cut, from its primary's last HEARTBEAT, and every cut it
        # announced in this view (promoted, we deliver up to them first: the old primary
        # may have freed there, and a backup applied that free, before it died)
        self.cuts_asked: dict[ConnId, int] = {}
        self.cuts_announced: dict[ConnId, int] = {}
        # primary: backup -> {cid: reach} from its last HEARTBEAT of this view
        self.cut_reports: dict[int, dict[ConnId, int]] = {}
        # CLOSED answers sent lately (cid -> time): a retransmitted window gets one answer
        self._closed_answered: dict[ConnId, int] = {}
        self._probe_answered: dict[str, int] = {}   # remote group -> our last PROBE answer
        self._probes_to_answer: list[str] = []      # remote groups owed one (PROBE_ANSWER)
        # remote group -> (pvn, birth, time, Lamport ts) of the newest message only its
        # primary sends (`news_of_primary`: a relayed or reordered copy is not news)
        self.primary_heard: dict[str, tuple[int, int, int, int]] = {}
        # remote group -> time of its last message of any kind (every member keeps it: a
        # new primary judges silence from what it heard as a backup)
        self.heard: dict[str, int] = {}
        self._since_us: int | None = None   # our first message: listening since
        self.served_pvn = 0                 # the last view in which we, primary, got data
        self.lineage = 0                    # membership's (said in our HEARTBEATs)
        self.change = 0                     # membership's change in this view (likewise)
        # membership's detector wait, in ms (likewise: Membership.detector_wait_ms)
        self.wait_of: Callable[[], int] = int
        self.replay_of: Callable[[], int] = int
        self.rm_of: Callable[[], int] = int
        # (quiet, size) said in our PROBE answers (likewise: Membership.probe_state)
        # (quiet, size) of our membership for a PROBE answer covering since `since_us`
        self.probe_state_of: Callable[[int], tuple[int, int]] = lambda since_us: (0, 0)

    # ======================================================================== views ===
    @property
    def is_primary(self) -> bool:
        return self.primary_id == self.birth_id

    @property
    def served(self) -> bool:
        """Primary with a connection to a remote group (open now, or that brought data in
        this view): its branch carries output a client may have seen. A successor that
        took over its predecessor's connections continues a served branch. A connection
        this primary only heard from the middle of the remote's stream, with nothing of
        it delivered here (`Connection.foreign`), does not count: after a heal a
        primary that took over alone, with no connection, hears the clients of the
        branch that served them, and counting their connection (or the data it could
        not deliver) made its empty branch "served" and let its precedence roll back
        what they read (replica_heal_foreign_connection_served)."""
        return self.is_primary and (any(not c.foreign for c in self.conns.values())
                                    or self.served_pvn == self.pvn)

    def set_view(self, pvn: int, primary_birth_id: int, members: list[tuple[int, int]],
                 my_birth_id: int, now_us: int | None = None) -> None:
        """Install a membership (called by membership). A higher pvn with a new primary
        resets msns; if this replica becomes the primary it starts phase 2 on every
        connection (NEW_PRIMARY_VIEW)."""
        if my_birth_id != self.birth_id:
            raise ProtocolError("set_view for another replica")
        if now_us is not None:
            self._now = max(self._now, now_us)
        was_primary = self.is_primary
        old_pvn = self.pvn
        self.members = [(int(b), int(p)) for b, p in members]
        if len(self.members) > 1:
            self.ever_shared = True     # a member since may probe our remote groups
        self.precedence = dict(self.members).get(self.birth_id, 0)
        self.primary_id = primary_birth_id
        self.backups = [b for b, _ in sorted(self.members, key=lambda m: m[1])
                        if b != primary_birth_id]
        for gone in set(self.reports) - set(self.backups):
            del self.reports[gone]
        for gone in set(self.cut_reports) - set(self.backups):
            del self.cut_reports[gone]
        self._trim_freed_log()
        self.order_info.set_backups(self.backups, self._now)
        self._digest_changed()
        if pvn > old_pvn:
            self.pvn = pvn
            # order-info positions, like msns, restart at 1 in a new primary view
            self.order_info.new_view()
            self.timers.clear(Timer.ORDER_INFO_ACK)
            # like order-info positions, the positions of frees restart in a new view
            self._reconcile_frees()
            announced = self.cuts_announced
            self.cuts_asked, self.cuts_announced, self.cut_reports = {}, {}, {}
            if self.is_primary and not was_primary and old_pvn > 0:
                self._reach_announced_cuts(announced)
                self._release_all_held()        # ours to decide now
                self._become_primary(old_pvn)
        self._gc_order_info()
        self.timers.arm(Timer.HEARTBEAT, None, self._now)

    def _become_primary(self, old_pvn: int) -> None:
        now = self._now
        self.reports.clear()
        self.order_info.become_primary(now)
        self.phase2_pvn = self.pvn
        for c in self.conns.values():
            c.begin_resync(old_pvn)
            self.timers.clear(Timer.RETRANSMIT, c.cid)
            self.timers.clear(Timer.THROTTLE_END, c.cid)
            self.timers.set(Timer.NEW_PRIMARY_VIEW, c.cid, now)
            self._arm_remote_silence(c)
        if not self.conns:
            self._actions.append(Phase2Done(self.pvn))
            self.phase2_pvn = None

    # ================================================================ application ===
    def open(self, remote_group: str, conn_seq: int, role: Role = Role.CLIENT) -> ConnId:
        cid = (remote_group, conn_seq, Role(role))
        if cid in self.closed:
            raise ProtocolError(f"connection {cid} was closed and freed here")
        self._conn(cid)
        return cid

    def send_space(self, conn: ConnId) -> int:
        c = self.conns[conn]
        if self.is_primary:
            return max(0, self.config.max_queue_bytes - c.send.queue_bytes)
        return max(0, self.config.max_log_bytes - c.send.log_bytes)

    def in_flight(self, conn: ConnId) -> int:
        """Messages of ours on `conn` sent and not yet covered by the remote group
        watermark, plus those queued behind them (0 for an unknown connection)."""
        c = self.conns.get(conn)
        return 0 if c is None else len(c.send.sent) + len(c.send.queue)

    def send(self, conn: ConnId, data: bytes, now_us: int | None = None) -> int:
        """Accept up to send_space() bytes of the application's stream; returns how many.
        The primary sends them (window permitting); a backup logs them."""
        if now_us is not None:
            self._now = max(self._now, now_us)
        c = self.conns.get(conn)
        if c is None and conn in self.closed or c is not None and (
                c.peer_done or c.send.end is not None):
            # the remote end has our whole stream, or our stream ended: nothing to carry
            self._count("discarded_bytes", len(data))
            return len(data)
        c = self._conn(conn)
        n = min(len(data), self.send_space(conn))
        step = self.config.max_payload_bytes
        for i in range(0, n, step):
            seg = bytes(data[i:min(n, i + step)])
            if self.is_primary:
                c.send.queue_segment(seg)
            else:
                c.send.log_segment(seg)
        if n:
            self._mark_known(c)
            if self.is_primary:
                self._flush(c)
            else:
                self._trim_log(c)       # a lagging backup: the remote may be ahead of it
        return n

    def close(self, conn: ConnId, abort: bool = False, now_us: int | None = None) -> None:
        """Our application's stream on `conn` ends after every byte it sent: a FIN, or a
        reset if `abort`. The end takes one unit of the stream's offsets (the remote
        delivers it after every byte, exactly once: `Closed`). Repeated calls, and calls
        for a connection already freed, do nothing."""
        if now_us is not None:
            self._now = max(self._now, now_us)
        c = self.conns.get(conn)
        if c is None or c.send.end is not None:
            return
        c.send.end = c.send.out_offset
        c.send.abort = abort
        self._ending.add(conn)
        if c.peer_done:
            c.send.out_offset += 1
        elif self.is_primary:
            c.send.queue_segment(b"\0")
        else:
            c.send.log_segment(b"\0")
        self._mark_known(c)
        if self.is_primary:
            self._flush(c)
        else:
            self._trim_log(c)
        self._reap()

    def add_order_info(self, chunk: bytes, now_us: int | None = None) -> int:
        """Append an opaque order-info chunk (primary); returns its position."""
        if now_us is not None:
            self._now = max(self._now, now_us)
        if not self.is_primary:
            raise ProtocolError("only the primary produces order info")
        pos = self.order_info.append(chunk, self._now)
        if self.backups:
            self.timers.arm(Timer.ORDER_INFO_INTRA, None,
                            self._now + self.config.order_info_intra_us)
            self._order_info_urgent()
        return pos

    def want_order_info(self, now_us: int | None = None) -> None:
        """Output commit waits until every backup holds every position so far (an external
        send: no remote group will reflect it): they go to the backups at once, not once
        order_info_intra_us old."""
        if now_us is not None:
            self._now = max(self._now, now_us)
        oi = self.order_info
        if self.is_primary and self.backups and oi.floor() < oi.last_pos:
            oi.wanted = max(oi.wanted, oi.last_pos)
            self._order_info_urgent()

    def _order_info_waited_on(self) -> bool:
        """Output commit holds: more order info than one piggyback is unprotected, or an
        external send waits for positions not every backup acked (`want_order_info`)."""
        oi = self.order_info
        return oi.bytes > self.config.max_piggyback_bytes or oi.wanted > oi.floor()

    def _order_info_urgent(self) -> None:
        """Output commit holds: the output waits for the backups' acks, so the order info
        goes to them now rather than after order_info_intra_us (which only gives a
        reflection time to carry it)."""
        if self._order_info_waited_on():
            self.timers.arm_earlier(Timer.ORDER_INFO_INTRA, None, self._now)

    def order_info_held(self) -> int:
        """Order-info chunks this primary keeps until every backup acknowledges them."""
        return len(self.order_info.log)

    def order_info_produced(self) -> int:
        """The last order-info position this primary produced in its view."""
        return self.order_info.last_pos

    @property
    def oi_delivered(self) -> int:
        """A backup: the order-info positions of this view delivered so far."""
        return self.order_info.delivered

    def set_executed(self, pos: int, now_us: int | None = None) -> None:
        """A backup: its application executed this view's order info up to `pos`
        (reported to the primary by an ORDER_INFO report within order_info_ack_us, and
        in every heartbeat; docs/LOG.md)."""
        if now_us is not None:
            self._now = max(self._now, now_us)
        oi = self.order_info
        oi.executed = max(oi.executed, min(pos, oi.delivered))
        if oi.executed != oi.done_acked and not self.is_primary:
            self.timers.arm(Timer.ORDER_INFO_ACK, None, self._now + self.config.order_info_ack_us)

    def peer_order_info_acks(self, pvn: int) -> dict[int, int]:
        """Order-info positions of view `pvn` each backup was seen to acknowledge
        (a lower bound of what it holds: a report may have been lost)."""
        return dict(self.peer_oi_acks.get(pvn, {}))

    def backup_lag(self, now_us: int) -> dict[int, tuple[int, int, bool]]:
        """The primary: per backup, (positions its application has not executed, age in
        us of the oldest of them, whether it has caught up with what it joined at)."""
        if not self.is_primary:
            return {}
        oi = self.order_info
        return {b: (*oi.lag(b, now_us), oi.caught_up_once(b)) for b in self.backups}

    def order_info_unprotected_bytes(self) -> int:
        """Order info that no backup-acknowledgment and no remote reflection covers yet:
        the next message to a remote group piggybacks it (up to max_piggyback_bytes).
        Output commit: a runtime hands output to `send` only while this fits in one
        piggyback, so every entry the output depends on travels with it or before it."""
        return self.order_info.unprotected_bytes() if self.is_primary else 0

    # =========================================================== snapshot/restore ===
    def snapshot(self) -> dict:
        """This endpoint's connections as a joining backup must install them (plain data,
        msgpack-able): for each, the remote view and msn received up to (with its
        recv_ts), the stream offset delivered, our own stream's end and the unacknowledged
        tail of it (sent list and queue: what a backup would hold in its log, numbered as
        this primary numbered it), and how far the remote primary delivered our stream;
        plus the order-info position `oi_upto` this primary reached in view `pvn`.

        And the old remote view's messages this primary holds undelivered (`held`: it
        waits for the current remote primary's resume point). The watermark the joiner
        takes over (`rx`'s ts) counts them as received, so no member keeps them for it:
        without them the joiner would lack bytes its primary delivers later, below the
        resume point, which nobody re-sends (llft simulate replica --random-cuts
        --partition 0.5 --replay 16347246534468173044 stalled on it)."""
        conns = []
        for (remote, seq, role), c in self.conns.items():
            rx = c.recv.view
            log = [[m.msn, m.body["offset"], m.body["data"]] for m in c.send.sent]
            log += [[c.send.next_msn + i, off, d] for i, (off, d) in enumerate(c.send.queue)]
            held = [[int(m.type), m.pvn, m.msn, m.ts, m.body] for m in c.recv.held]
            conns.append({"remote": remote, "seq": seq, "role": int(role),
                          "rx": [rx.pvn, rx.upto, rx.ts, rx.start] if rx is not None else None,
                          "held": held,
                          "delivered": c.recv.delivered, "out_offset": c.send.out_offset,
                          "next_msn": c.send.next_msn + len(c.send.queue), "log": log,
                          "remote_delivered": c.remote_view.delivered,
                          "end": [c.send.end, c.send.abort, c.recv.end, c.recv.abort,
                                  c.recv.end_pvn]})
        return {"pvn": self.pvn, "oi_upto": self.order_info.last_pos, "conns": conns,
                "closed": self.closed.to_list(),
                "freed": self.freed_base + len(self.freed_log)}

    def restore(self, snapshot: dict) -> dict[ConnId, int]:
        """Install a primary's `snapshot()` at a joining backup, after `set_view`, as if
        this backup had followed every connection from the start. Returns, per restored
        connection, the end of our own stream there (bytes the group already produced:
        the replaying application will write them again)."""
        produced: dict[ConnId, int] = {}
        for s in snapshot["conns"]:
            cid = (s["remote"], s["seq"], Role(s["role"]))
            c = self._conn(cid)
            if s["rx"] is not None:
                pvn, upto, ts, *start = s["rx"]
                c.recv.view = ReceiveSequence(pvn)
                c.recv.view.upto, c.recv.view.ts = upto, ts
                # where that view resumed (the held messages are released below it)
                c.recv.view.start = start[0] if start else None
            c.recv.delivered = s["delivered"]
            for mtype, pvn, msn, ts, body in s.get("held", ()):
                c.recv.held.append(Message(
                    type=MsgType(mtype), src_group=cid[0], dst_group=self.group,
                    conn_seq=cid[1], role=ROLES[1 - int(cid[2])], pvn=pvn, precedence=0,
                    sender=0, msn=msn, ts=ts, body=body))
            c.send.out_offset = s["out_offset"]
            c.send.next_msn = s["next_msn"]
            c.send.log = deque((msn, off, data) for msn, off, data in s["log"])
            c.send.log_bytes = sum(len(d) for _, _, d in s["log"])
            c.remote_view.delivered = s["remote_delivered"]
            c.send.end, c.send.abort, c.recv.end, c.recv.abort = s["end"][:4]
            c.recv.end_pvn = s["end"][4] if len(s["end"]) > 4 else 0
            if c.send.end is not None:
                self._ending.add(cid)
            c.mark_known()
            self._wm_dirty.add(c)
            self._digest_changed()
            # bytes the application wrote (our end marker is not one of them)
            produced[cid] = c.send.out_offset if c.send.end is None else c.send.end
        self.closed = ClosedSeqs.from_list(snapshot["closed"])
        if snapshot["pvn"] == self.pvn:
            # positions of this view the joiner's log already holds
            self.order_info.delivered = snapshot["oi_upto"]
            self.freed_applied = snapshot["freed"]
        return produced

    # ======================================================= lanes (lane.py) ===
    def lend(self) -> Loan | None:
        """Hand the steady state of our one connection to a lane (lane.py), or None if it
        is not steady. Until `reclaim`, nothing of the core may touch that connection:
        its timers leave the registry with it (the owner, `LanedEndpoint`, takes the
        loan back before any other event or call)."""
        if (not self.is_primary or self.backups or self.phase2_pvn is not None
                or self._hb_quiet or self._since_us is None or len(self.conns) != 1
                or self._ending or self.order_info.piggyback(self.pvn) is not None):
            return None
        (c,) = self.conns.values()
        s, r, rx = c.send, c.recv, c.recv.view
        if (not c.known or c.state is not SendState.STREAMING or c.peer_done or c.foreign
                or c.lost_at is not None or s.end is not None or r.end is not None
                or not s.sent_open or s.queue or s.log or rx is None or rx.upto == 0
                or r.old_view is not None or r.old_ts is not None or rx.slots
                or rx.nacks or r.held or r.ahead or r.beyond or r.received):
            return None
        timers = {}
        for kind in CONNECTION_TIMERS:
            d = self.timers.due(kind, c.cid)
            if d is not None:
                timers[kind] = d
                self.timers.clear(kind, c.cid)
        self._holding.discard(c)        # (its received list is empty)
        rto, rv = s.rto, c.remote_view
        return Loan(
            group=self.group, birth_id=self.birth_id, pvn=self.pvn,
            precedence=self.precedence, clock=self.clock, now=self._now, gw=self.gw,
            gw_rose=self._gw_rose, max_data_ts=self.max_data_ts, served_pvn=self.served_pvn,
            told_us=self._told_us.get(c.remote), reflected=self._reflected.get(c.remote),
            heard=None, primary_heard=self.primary_heard.get(c.remote),
            primary_heard_set=False, cid=c.cid, role=c.role, out_offset=s.out_offset,
            next_msn=s.next_msn, sent=list(s.sent), sent_bytes=s.sent_bytes,
            sent_at=dict(s.sent_at), remote_ack=s.remote_ack,
            rto=(rto.srtt_us, rto.rttvar_us, rto.backoff, rto.rto_us),
            rto_bounds=(rto.floor_us, rto.ceiling_us), fa_count=s.fa_count,
            fa_msn=s.fa_msn, last_send_us=s.last_send_us, last_back=s.last_back,
            ka_urgent=s.ka_urgent, first_ts=s.first_ts, ka_idle=s.ka_idle,
            view_pvn=rx.pvn, upto=rx.upto, view_ts=rx.ts, first_offset=rx.first_offset,
            delivered=r.delivered, declared=r.declared, recv_max_data_ts=r.max_data_ts,
            fa_pending=r.fa_pending, fa_tries=r.fa_tries, told_delivered=r.told_delivered,
            remote_gw=rv.group_watermark, remote_delivered=rv.delivered,
            to_reflect=rv.to_reflect, last_order_info=rv.last_order_info, timers=timers,
            first_ack_delay_us=self.config.first_ack_delay_us,
            keepalive_us=self.config.keepalive_us,
            max_payload_bytes=self.config.max_payload_bytes,
            window_msgs=self.config.window_msgs, max_queue_bytes=self.config.max_queue_bytes)

    def lend_backup(self) -> BackupLoan | None:
        """A backup's steady state for its primary's HEARTBEAT (rule 2 of
        docs/BACKUP_LANE.md) and the remote primaries' data messages (rule 1;
        backup_lane.py), or None if it is not steady: no connection foreign, with an old
        remote view or ts, bytes ahead or beyond, a held message of another view or not
        contiguous from `delivered`, a received message of an older view, or (no remote
        view yet) anything held or received; no cut asked and no frees carried; not in
        phase 2. Until `reclaim_backup`, the core is not touched: the WATERMARK_REPORT
        and ORDER_INFO_ACK timers and the connections' NACK and KEEPALIVE leave the
        registry with the loan."""
        if (self.is_primary or self.phase2_pvn is not None or self._since_us is None
                or self.cuts_asked or self.carry or self.primary_id == self.birth_id):
            return None
        conns = []
        for c in self.conns.values():
            r, rx = c.recv, c.recv.view
            if (c.foreign or r.old_view is not None or r.old_ts is not None or r.ahead
                    or r.beyond):
                return None
            if rx is None:
                if r.held or r.received:
                    return None
                term = c.send.first_ts if c.role is Role.CLIENT else 0
            else:
                term = rx.ts        # (_wm_term without a gap or an old view)
            reach = r.delivered
            for m in r.held:        # (rx is not None: checked above)
                if m.pvn != rx.pvn or m.body["offset"] != reach:
                    return None
                reach += len(m.body["data"])
            if rx is not None and any(m.pvn < rx.pvn for m in r.received):
                return None
            s, rv = c.send, c.remote_view
            conns.append(HeldConn(
                cid=c.cid, holding=c in self._holding, delivered=r.delivered,
                covered=r.covered, end=r.end, abort=r.abort, held=list(r.held),
                received=list(r.received), known=c.known, term=term,
                view_pvn=None if rx is None else rx.pvn,
                upto=0 if rx is None else rx.upto, ts=0 if rx is None else rx.ts,
                first_offset=None if rx is None else rx.first_offset,
                slots={} if rx is None else dict(rx.slots),
                nacks=set() if rx is None else set(rx.nacks), declared=r.declared,
                max_data_ts=r.max_data_ts, sending=bool(s.sent),
                fa_count=s.fa_count, ka_idle=s.ka_idle, log=list(s.log),
                log_bytes=s.log_bytes, remote_gw=rv.group_watermark,
                remote_delivered=rv.delivered, last_order_info=rv.last_order_info,
                after_change=rx is not None and rx.after_change, resyncing=c.resyncing,
                throttled=c.state is SendState.THROTTLED, out_offset=s.out_offset,
                next_msn=s.next_msn, send_ended=s.end is not None or c.peer_done,
                fa_msn=s.fa_msn, last_back=s.last_back, last_send_us=s.last_send_us))
        if any(self.conns.get(c.cid) is not c for c in self._holding):
            return None
        timers = {}
        for kind in BACKUP_LANE_TIMERS:
            d = self.timers.due(kind)
            if d is not None:
                timers[kind] = d
                self.timers.clear(kind)
        for hc in conns:
            for kind in BACKUP_LANE_CONN_TIMERS:
                d = self.timers.due(kind, hc.cid)
                if d is not None:
                    timers[kind, hc.cid] = d
                    self.timers.clear(kind, hc.cid)
        remotes = {hc.cid[0] for hc in conns}
        cfg = self.config
        return BackupLoan(
            group=self.group, birth_id=self.birth_id, pvn=self.pvn,
            precedence=self.precedence, primary_id=self.primary_id, clock=self.clock,
            now=self._now, gw=self.gw,
            digest=self.digest(), max_data_ts=self.max_data_ts,
            reported_w=self.reported_w, has_backups=bool(self.backups), last_heard={},
            backups=frozenset(self.backups),
            peer_oi_acks={v: dict(a) for v, a in self.peer_oi_acks.items()},
            conns=conns, by_cid={hc.cid: hc for hc in conns}, timers=timers,
            hb_quiet=self._hb_quiet, heard={},
            primary_heard={r: h for r, h in self.primary_heard.items() if r in remotes},
            primary_heard_set={}, oi_delivered=self.order_info.delivered,
            oi_pending=bool(self.order_info.pending), oi_acked=self.order_info.acked,
            oi_done_acked=self.order_info.done_acked, oi_executed=self.order_info.executed,
            watermark_report_us=cfg.watermark_report_us,
            order_info_ack_us=cfg.order_info_ack_us,
            max_order_info_pending=cfg.max_order_info_pending,
            window_bytes=cfg.window_msgs * cfg.max_payload_bytes,
            max_placeholders=cfg.max_placeholders, nack_delay_us=cfg.nack_delay_us,
            nack_retry_us=cfg.nack_retry_us, max_nack_msns=cfg.max_nack_msns,
            keepalive_us=cfg.keepalive_us, heartbeat_us=cfg.heartbeat_us,
            direct_ack_us=cfg.order_info_direct_ack_us, max_log_bytes=cfg.max_log_bytes,
            max_payload_bytes=cfg.max_payload_bytes, rank=self.rank(), lineage=self.lineage,
            change=self.change, hooks=(self.wait_of, self.replay_of, self.rm_of),
            frees=self._heartbeat_frees(), last_hb=self._last_hb,
            pulse_intervals=cfg.pulse_intervals)

    def reclaim_backup(self, loan: BackupLoan) -> None:
        """Take back a backup's state lent with `lend_backup`, as its lane left it."""
        self.clock, self._now, self.gw = loan.clock, loan.now, loan.gw
        self.max_data_ts, self.reported_w = loan.max_data_ts, loan.reported_w
        self._hb_quiet, self._last_hb = loan.hb_quiet, loan.last_hb
        oi = self.order_info
        oi.delivered, oi.acked, oi.done_acked = loan.oi_delivered, loan.oi_acked, \
            loan.oi_done_acked
        oi.executed = loan.oi_executed
        self.last_heard_us.update(loan.last_heard)
        self.peer_oi_acks = loan.peer_oi_acks
        # (in the order the lane heard them: insertion order is recency)
        for remote, at in loan.heard.items():
            _remember(self.heard, remote, at, MAX_HEARD)
        for remote, h in loan.primary_heard_set.items():
            _remember(self.primary_heard, remote, h, MAX_PROBED_BY)
        for k, n in loan.stats.items():
            self._count(k, n)
        for hc in loan.conns:
            c = self.conns[hc.cid]
            r, rx, s, rv = c.recv, c.recv.view, c.send, c.remote_view
            r.delivered, r.covered = hc.delivered, hc.covered
            r.held, r.received = deque(hc.held), deque(hc.received)
            r.max_data_ts, r.declared = hc.max_data_ts, hc.declared
            if rx is not None:
                rx.upto, rx.ts, rx.first_offset = hc.upto, hc.ts, hc.first_offset
                rx.slots, rx.nacks = hc.slots, hc.nacks
            s.fa_count, s.ka_idle, s.fa_msn = hc.fa_count, hc.ka_idle, hc.fa_msn
            s.last_back, s.last_send_us = hc.last_back, hc.last_send_us
            s.log, s.log_bytes = deque(hc.log), hc.log_bytes
            s.out_offset, s.next_msn = hc.out_offset, hc.next_msn
            rv.group_watermark, rv.delivered = hc.remote_gw, hc.remote_delivered
            rv.last_order_info = hc.last_order_info
            if hc.holding:
                self._holding.add(c)
            else:
                self._holding.discard(c)
            self._wm_dirty.add(c)
            for kind in BACKUP_LANE_CONN_TIMERS:
                self.timers.set(kind, c.cid, loan.timers.get((kind, c.cid)))
        for kind in BACKUP_LANE_TIMERS:
            self.timers.set(kind, None, loan.timers.get(kind))

    def reclaim(self, loan: Loan) -> None:
        """Take back a connection lent with `lend`, in the state its lane left it."""
        c = self.conns[loan.cid]
        self.clock, self._now, self.gw = loan.clock, loan.now, loan.gw
        self._gw_rose, self.max_data_ts = loan.gw_rose, loan.max_data_ts
        self.served_pvn = loan.served_pvn
        if loan.told_us is not None:
            self._told_us[c.remote] = loan.told_us
        if loan.reflected is not None:
            self._reflected[c.remote] = loan.reflected
        if loan.heard is not None:
            _remember(self.heard, c.remote, loan.heard, MAX_HEARD)
        if loan.primary_heard_set:
            _remember(self.primary_heard, c.remote, loan.primary_heard, MAX_PROBED_BY)
        for k, n in loan.stats.items():
            self._count(k, n)
        s, r, rx, rv = c.send, c.recv, c.recv.view, c.remote_view
        s.out_offset, s.next_msn = loan.out_offset, loan.next_msn
        s.sent, s.sent_bytes = deque(loan.sent), loan.sent_bytes
        s.sent_at, s.remote_ack = loan.sent_at, loan.remote_ack
        rto = s.rto
        rto.srtt_us, rto.rttvar_us, rto.backoff, rto.rto_us = loan.rto
        s.fa_count, s.fa_msn, s.last_send_us = loan.fa_count, loan.fa_msn, loan.last_send_us
        s.last_back, s.ka_urgent, s.first_ts = loan.last_back, loan.ka_urgent, loan.first_ts
        s.ka_idle = loan.ka_idle
        rx.upto, rx.ts, rx.first_offset = loan.upto, loan.view_ts, loan.first_offset
        if loan.delivered > r.delivered:
            # the lane took the current view's data in order, each message collected at
            # once (a lone primary's received list stays empty): covered to its end
            r.covered = max(r.covered, loan.delivered)
        r.delivered, r.declared, r.max_data_ts = loan.delivered, loan.declared, \
            loan.recv_max_data_ts
        r.fa_pending, r.fa_tries, r.told_delivered = loan.fa_pending, loan.fa_tries, \
            loan.told_delivered
        rv.group_watermark, rv.delivered = loan.remote_gw, loan.remote_delivered
        rv.to_reflect, rv.last_order_info = loan.to_reflect, loan.last_order_info
        for kind in CONNECTION_TIMERS:
            self.timers.set(kind, c.cid, loan.timers.get(kind))
        self._wm_dirty.add(c)

    # ============================================================ sans-IO surface ===
    def take_actions(self) -> list[Any]:
        a, self._actions = self._actions, []
        return a

    def heard_again(self, msg: Message, times_us: list[int]) -> None:
        """Byte-identical copies of `msg` arrived at `times_us` (absorbed by the driver,
        `Pulse`): messaging keeps no liveness, so only the last is handled."""
        if times_us:
            self.handle_message(msg, times_us[-1])

    def next_timer_us(self) -> int | None:
        return self.timers.next_us()

    def handle_timer(self, now_us: int) -> None:
        """Fire every due timer, in the order of `Timer` (endpoint's, then per connection
        in connection order); a timer of the other role (armed before a change of role)
        is cleared; the backups' local nacks go out as one NACK."""
        self._now = now = max(self._now, now_us)
        not_mine = BACKUP_TIMERS if self.is_primary else PRIMARY_TIMERS
        # only the timers due now (the registry's heap), in the order of Timer and of
        # the connections; each is checked again right before it fires (an earlier
        # handler may have moved or cleared it)
        order = self._conn_order
        due = self.timers.pop_due(now)
        due.sort(key=lambda k: (-1 if k[1] is None else order[k[1]], _TIMER_RANK[k[0]]))
        local_nacks: list[list] = []
        for kind, key in due:
            if not self.timers.expired(kind, key, now):
                continue
            if kind in not_mine:
                self.timers.clear(kind, key)        # armed in the other role
            elif key is None:
                getattr(self, _ENDPOINT_TIMER_HANDLERS[kind])()
            elif kind is Timer.NACK:
                local_nacks.extend(self._nack(self.conns[key]))
            else:
                c = self.conns[key]
                self._wm_dirty.add(c)
                getattr(self, _CONNECTION_TIMER_HANDLERS[kind])(c)
        for k in due:
            self.timers.keep(k)                     # still set: back into the heap
        if local_nacks:
            self._emit(self.group, self._intra(MsgType.NACK, {"missing": local_nacks}))
        self._after_event()
        self._reap()

    # ---- timer handlers (named in the tables at the end of this module) ----
    def _heartbeat_due(self) -> None:
        quiet = self._heartbeat()
        hb = self.config.heartbeat_us
        self._hb_quiet = quiet
        # quiet (it said nothing new): the driver repeats it meanwhile (`Pulse`)
        self.timers.set(Timer.HEARTBEAT, None,
                        self._now + (hb * self.config.pulse_intervals if quiet else hb)
                        if self.backups else None)

    def heartbeat_soon(self) -> None:
        """What our heartbeat says changed outside messaging's sight (the replica node:
        `served`): the next one goes an interval from now. A primary without backups
        sends none (`_heartbeat`), so it arms nothing."""
        if self.backups or not self.is_primary:
            self._hb_soon()

    def _hb_soon(self) -> None:
        """Something happened (a message in or out that is not a heartbeat): what our
        heartbeat says may change, so the next one is due an interval from now, not a
        refresh from the last."""
        self._hb_quiet = False
        self.timers.arm_earlier(Timer.HEARTBEAT, None, self._now + self.config.heartbeat_us)

    def _watermark_report_due(self) -> None:
        self.timers.clear(Timer.WATERMARK_REPORT)
        if (self.timestamp_watermark() > self.reported_w
                or self.order_info.acked != self.order_info.delivered):
            self._order_info_ack()

    def _order_info_ack_due(self) -> None:
        self.timers.clear(Timer.ORDER_INFO_ACK)
        self._order_info_ack()

    def _throttle_end_due(self, c: Connection) -> None:
        self.timers.clear(Timer.THROTTLE_END, c.cid)
        c.unthrottle()
        self._flush(c)

    def _solicit_due(self, c: Connection) -> None:
        self.timers.clear(Timer.SOLICIT, c.cid)
        if c.recv.view is not None and not c.resyncing:
            # an empty NACK: "where are you?" -- answered by a KEEP_ALIVE
            self._emit(c.remote, self._msg(c, MsgType.NACK, {"missing": []}))
            self._solicit_after[c.remote] = self._now + self.config.first_ack_retry_us

    def _arm_remote_silence(self, c: Connection) -> None:
        if not c.remote.startswith(self.config.lone_groups):
            return                      # replicated: it takes over, however long that takes
        timeout = self.config.remote_timeout_us
        heard = self.heard.get(c.remote)
        since = self._now if heard is None else max(heard, self._now - timeout)
        self.timers.set(Timer.REMOTE_SILENCE, c.cid, since + timeout)

    def _remote_silence_due(self, c: Connection) -> None:
        """Primary: a remote group of one (`lone_groups`: a gateway) that said nothing
        for remote_timeout_us is gone; its connection would pin our group watermark
        forever. (After that, the same timer paces `_resend_received`.)"""
        # (a remote never heard, or forgotten among MAX_HEARD others, counts from when
        # the timer was armed: a group that never answered our opening is gone too)
        heard = self.heard.get(c.remote, 0)
        if c.peer_done:
            self._resend_received(c)
        elif self._now - heard < self.config.remote_timeout_us:
            self.timers.set(Timer.REMOTE_SILENCE, c.cid,
                            heard + self.config.remote_timeout_us)
        else:
            self._count("remote_silent")
            self._take_held_of_ended_remote(c)
            if not c.recv.finished:     # (an end heard ahead of a gap is not ours)
                self._peer_lost(c)
            else:
                self._peer_done(c)      # its stream ended here; ours goes nowhere now
                self._resend_received(c)

    def _answer_probe(self, msg: Message) -> None:
        """A remote backup whose detector fired asks when we last heard its group's
        primary (every member answers, the gateway too; membership/core.py "Takeover
        needs evidence"). One answer per remote group per nack_delay_us, however many
        probes arrive (a group's held backups probe together); an answer is not
        answered."""
        if msg.body["answer"]:
            return
        last = self._probe_answered.get(msg.src_group)
        if last is not None and self._now - last < self.config.nack_delay_us:
            return
        _remember(self._probe_answered, msg.src_group, self._now, MAX_PROBED_BY)
        self._count("probe_answered")
        # The answer's times ("heard ago", "listening for") are said relative to when it
        # goes, and a message is handled at its arrival time, which for one queued while
        # this process was stopped is in the past: answered then, a member waking from a
        # 122 ms pause said the asker's crashed primary spoke 23 ms before a time long
        # gone, the asker took it as word after its own silence and never took over
        # (replica_paused_member_stamps_queued_words_as_fresh, in the report timing of
        # 2026-12-02). So it goes from a timer, due at once, which runs at the clock's now.
        if msg.src_group not in self._probes_to_answer:
            self._probes_to_answer.append(msg.src_group)
        self.timers.arm(Timer.PROBE_ANSWER, None, self._now)

    def _probe_answer_due(self) -> None:
        self.timers.clear(Timer.PROBE_ANSWER)
        for remote in self._probes_to_answer:
            heard = self.primary_heard.get(remote)
            self._emit(remote, probe(
                self.group, remote, pvn=self.pvn, precedence=self.precedence,
                sender=self.birth_id, answer=probe_answer(
                    heard, self._since_us, self._now,
                    *self.probe_state_of(heard[2] if heard else self._since_us or 0))))
        self._probes_to_answer.clear()

    def _after_event(self) -> None:
        """Watermark news: a backup reports a risen watermark soon; a primary whose group
        watermark rose tells remote senders holding data it now covers (KEEP_ALIVE soon),
        so that flow control follows the slowest member without waiting for idle timers."""
        if self.is_primary:
            self._solicit_pinning()
            if self._gw_rose:
                self._gw_rose = False
                gw = self.gw
                soon = self._now + self.config.first_ack_delay_us
                # one KEEP_ALIVE per remote group: its `back` holds for every connection
                # its trailer lists (`others`: all of them), so one per connection cost
                # O(connections) messages each carrying O(connections) entries
                told: set[str] = set()
                for c in self.conns.values():
                    last_back = c.send.last_back
                    if (c.remote not in told and c.recv.max_data_ts > last_back
                            and gw > last_back and not c.resyncing):
                        told.add(c.remote)
                        self.timers.arm_earlier(Timer.KEEPALIVE, c.cid, soon)
                        c.send.ka_urgent = True
        elif (self.timers.due(Timer.WATERMARK_REPORT) is None and self.backups
              and self.max_data_ts > self.reported_w):
            # Soon only if the rise may cover data (what the group watermark frees: the
            # members' received lists, the backups' deliveries, a remote sender's window).
            # A rise that only follows the remote keep-alives' timestamps waits for our
            # next heartbeat, which carries it: with idle connections open, a report per
            # keep-alive was most of an idle group's traffic.
            if self.timestamp_watermark() > self.reported_w:
                self.timers.set(Timer.WATERMARK_REPORT, None,
                                self._now + self.config.watermark_report_us)

    def _solicit_pinning(self) -> None:
        """Received data our group watermark does not cover yet, because an idle
        connection's recv_ts pins it: ask that connection's remote primary to state where
        it is (its KEEP_ALIVE carries a fresh timestamp), instead of waiting for its
        periodic keep-alive. Bounded: one request per connection per first_ack_retry_us."""
        need = 0
        for c in self._holding:
            if c.recv.received and c.recv.received[-1].ts > need:
                need = c.recv.received[-1].ts
        if not need or self.gw >= need:
            return
        # one request per remote group, on its most pinning idle connection: the answer's
        # trailer states every connection of that group (`others`), so asking each idle
        # connection (one KEEP_ALIVE each) cost O(connections) messages per request
        pick: dict[str, Connection] = {}
        for c in self.conns.values():
            rx = c.recv.view
            if (c.known and rx is not None and rx.ts < need and not rx.slots
                    and c.recv.max_data_ts < rx.ts):     # idle: nothing of its own in flight
                best = pick.get(c.remote)
                if best is None or rx.ts < best.recv.view.ts:
                    pick[c.remote] = c
        soon = self._now + self.config.first_ack_delay_us
        for remote, c in pick.items():
            if self._now >= self._solicit_after.get(remote, 0):
                self._solicit_after[remote] = soon + self.config.first_ack_retry_us
                self.timers.set(Timer.SOLICIT, c.cid, soon)

    def handle_message(self, msg: Message, now_us: int) -> None:
        self._now = max(self._now, now_us)
        if self._since_us is None:
            self._since_us = now_us
        if msg.sender == self.birth_id:
            return
        if msg.ts > self.clock:
            self.clock = msg.ts
        self._count(_RX_COUNTERS[msg.type])
        if self._hb_quiet and msg.type is not MsgType.HEARTBEAT:
            self._hb_soon()
        if msg.src_group == self.group:
            if msg.dst_group == self.group:
                self._handle_intra(msg)
                self._after_event()
                self._reap()
            # else: our own group's message to a remote group (not addressed to us)
            return
        if msg.dst_group != self.group:
            return
        if msg.type in MEMBERSHIP_CORE_TYPES:
            return      # membership's
        _remember(self.heard, msg.src_group, self._now, MAX_HEARD)
        if msg.type is MsgType.PROBE:
            self._answer_probe(msg)
            return
        if msg.type in PRIMARY_ONLY_TYPES:
            # stamped with when it came (`now_us`: the kernel's arrival time at the
            # runtime), not with our clock, which may be past it: a member that was
            # stopped handles what queued meanwhile when it wakes, and said that a
            # primary that had crashed meanwhile spoke to it "0 ms ago" (our PROBE
            # answers: replica_paused_member_stamps_queued_words_as_fresh)
            if news_of_primary(self.primary_heard.get(msg.src_group), msg.pvn, msg.sender,
                               msg.ts):
                _remember(self.primary_heard, msg.src_group,
                          (msg.pvn, msg.sender, min(now_us, self._now), msg.ts),
                          MAX_PROBED_BY)
        cid = (msg.src_group, msg.conn_seq, ROLES[1 - msg.role])
        c = self.conns.get(cid)
        if c is None and cid in self.closed:
            # freed here: a late, duplicated or retransmitted message. A remote primary
            # still sending on it has not learned that we are done: the primary tells it.
            self._count("rx_freed_conn")
            if (self.is_primary and msg.type in PRIMARY_ONLY_TYPES
                    and msg.type is not MsgType.CLOSED):
                self._answer_closed(cid)
            return
        if c is None and msg.type is MsgType.CLOSED:
            return
        if c is None and not self.config.accepts_connections:
            # a group that only opens connections (a gateway) takes none it did not open:
            # one of an earlier incarnation of it (a gateway restarted after a crash)
            # would pin our group watermark on the gap of everything we never received,
            # and flow control then stalls our own connection. Its remote primary hears
            # that nobody here holds it (CLOSED: it stops retransmitting on it).
            self._count("rx_not_our_conn")
            if self.is_primary and msg.type in PRIMARY_ONLY_TYPES:
                self._answer_closed(cid)
            return
        if (c is None and self.is_primary
                and not (msg.type in DATA_TYPES and msg.body["offset"] == 0)
                and not (msg.type is MsgType.NEW_PRIMARY_VIEW
                         and msg.body["last_delivered"] == 0)):
            # A connection we never had, heard in the middle of its stream: another
            # branch of our group served it (a backup cut off alone takes over a view of
            # its own with no connection to ask about; the clients open one with the
            # serving branch meanwhile). We hold none of it, and a word from us in our
            # view makes the remote group follow our view number, so that the serving
            # primary's lower one is stale there once it prunes us: the stream stalls
            # (docs/ARCHITECTURE.md open item 9). The stream's start (retransmitted until
            # our group has it) is still taken up, and so is a NEW_PRIMARY_VIEW that says
            # the remote group delivered nothing of ours on it: a primary can lack a
            # connection its backups hold (the first messages lost here, the remote
            # primary that opened it crashed), and the remote group's new primary resumes
            # it by its NEW_PRIMARY_VIEW (`llft simulate replica --schedules 2 --seed 3`
            # loses replies without that exception). One that delivered bytes of ours
            # there had them from another branch.
            self._count("rx_unknown_midstream")
            return
        if c is None:
            if len(self.conns) >= self.config.max_connections:
                self._count("conn_refused")
                return
            c = self._conn(cid)
            # a primary that first hears a connection anywhere but at its stream's start
            # takes up another branch's (or a predecessor's it never knew): not ours to
            # count as served until something of it is delivered here
            c.foreign = self.is_primary and not (
                msg.type in DATA_TYPES and msg.body["offset"] == 0)
            self._actions.append(Opened(cid))
        self._handle_inter(c, msg)
        if self.is_primary:
            self._gc_all_received()
        self._after_event()
        self._reap()

    # ================================================================= inter-group ===
    def _handle_inter(self, c: Connection, msg: Message) -> None:
        """A message from the remote group on `c`. First what every message of a remote
        primary tells (its view, that the connection is live, its group watermark, its
        ack, how far it delivered our stream), then the handler of this message type
        for our role, then the trailer (sent-up-to, order info)."""
        self._wm_dirty.add(c)
        t = msg.type
        if (t in DATA_TYPES and msg.body["flags"] & STREAM_END and msg.body["data"]
                and c.recv.end is None):
            # the last byte of this message is the end marker (any view: one stream;
            # the first end heard is the end -- a stream the app reset may be cut at
            # another point by a backup's agent, and nobody reads it any more)
            c.recv.end = msg.body["offset"] + len(msg.body["data"]) - 1
            c.recv.abort = bool(msg.body["flags"] & STREAM_RST)
        from_primary = t in PRIMARY_ONLY_TYPES
        if from_primary:
            rx = c.recv.view
            if rx is not None and msg.pvn < rx.pvn:
                old = c.recv.old_view
                part = self._below_resume_point(c, msg) if t in DATA_TYPES else None
                if t in DATA_TYPES and not self.is_primary:
                    self._keep_beyond_resume_point(c, msg)
                if part is None:
                    self._count("stale_view")
                elif old is not None and msg.pvn == old.pvn:
                    self._rx_data(c, old, part)     # a backup filling the old view's gap
                elif (part.body["offset"] <= c.recv.delivered
                      < part.body["offset"] + len(part.body["data"])):
                    self._count("gap_fill")         # bytes asked for by offset
                    self._deliver(c, part.body["offset"], part.body["data"])
                    self._gc_received(c)
                else:
                    self._count("stale_view")
                return
            if rx is None or msg.pvn > rx.pvn:
                self._new_remote_view(c, msg.pvn, flush=(t == MsgType.NEW_PRIMARY_VIEW))
            self._mark_known(c)
            # the ack before the watermark: collecting what `back` covers raises the ack
            # too, and the round-trip sample (RtoEstimator) is taken only from a new ack
            if t != MsgType.NEW_PRIMARY_VIEW_ACK:
                self._on_remote_ack(c, msg)
            if msg.back > c.remote_view.group_watermark:
                c.remote_view.group_watermark = msg.back
                self._gc_sent(c)
        trailer = unpack_trailer(msg.order_info)
        if from_primary and trailer is not None and trailer[4] is not None:
            if trailer[4] > c.remote_view.delivered:
                c.remote_view.delivered = trailer[4]
                if not self.is_primary:
                    self._trim_log(c)
        if t in DATA_TYPES and self.is_primary and not c.foreign:
            self.served_pvn = self.pvn
        handler = _INTER_GROUP_HANDLERS.get((t, self.is_primary))
        if handler is not None:
            getattr(self, handler)(c, msg)
        if trailer is not None:
            self._on_trailer(c, msg, trailer, from_primary)

    def _below_resume_point(self, c: Connection, msg: Message) -> Message | None:
        """The part of an older primary view's data message that lies below where the
        current remote primary resumed the stream (its msn 1), or None.

        Only those bytes are the group's: the current remote primary re-sends everything
        from its resume point, which is at most what our primary delivered from the old
        view when it answered NEW_PRIMARY_VIEW. Beyond it, an old primary's data may come
        from a primary that was excluded while still running (a false suspicion): it keeps
        executing and sending in its old view, with choices the new primary never learned,
        so taking those bytes would splice two histories into one stream. Until msn 1 of
        the current view is here, the resume point is unknown and nothing old is taken."""
        start = c.recv.view.start
        off, data = msg.body["offset"], msg.body["data"]
        if start is None or off >= start:
            self._count("old_view_beyond_resume")
            return None
        if off + len(data) <= start:
            return msg
        self._count("old_view_clipped")
        return dataclasses.replace(msg, body={**msg.body, "data": data[:start - off]})

    def _keep_beyond_resume_point(self, c: Connection, msg: Message) -> None:
        """A backup, an older remote view's data message: its bytes past where the
        current remote primary resumed are not delivered (`_below_resume_point`), but
        our primary may have delivered them, from that view, before it answered
        NEW_PRIMARY_VIEW (it held them as a backup and took them when it became
        primary). If the remote group is then gone, our primary frees the connection at
        a cut that includes them, and this backup must deliver up to the same cut
        (`_deliver_upto`, from `beyond`). Its only way to get them, if it lost the
        original, is the copy our primary re-sends when the remote is gone
        (`_resend_received`), which comes after the view change: kept here as for a
        message held across it (`_release_held`); also while the resume point is still
        unknown once our primary announced the connection's cut. Bounded:
        `max_placeholders` pieces (what our primary delivered past the resume point was
        at most a window)."""
        start = c.recv.view.start
        off, data = msg.body["offset"], msg.body["data"]
        if start is not None:
            lo = max(off, start)
        elif c.cid in self.cuts_asked:
            # the resume point never came and our primary says the remote is done or
            # gone (it asks us for a cut): what it re-sends is all there is
            # (`_cut_pieces` takes it only where no newer view's bytes lie)
            lo = max(off, c.recv.delivered)
        else:
            return
        if off + len(data) <= lo:
            return
        if len(c.recv.beyond) < self.config.max_placeholders or lo in c.recv.beyond:
            self._count("old_view_kept_beyond")
            c.recv.keep_beyond(lo, data[lo - off:])

    # ---- inter-group handlers, by (type, role): the table at the end of this module ----
    def _on_data(self, c: Connection, msg: Message) -> None:
        self._rx_data(c, c.recv.view, msg)

    def _on_data_at_primary(self, c: Connection, msg: Message) -> None:
        self._rx_data(c, c.recv.view, msg)
        self._want_first_ack(c, self.config.first_ack_delay_us)

    def _on_first_ack(self, c: Connection, msg: Message) -> None:
        if msg.ack > 0 and msg.ack == c.send.last_msn:
            # FIRST_ACKs of one message, our last: the count starts again for a newer
            # one (counted across messages, a busy connection whose replies each drew one
            # FIRST_ACK was throttled for throttle_us every third request)
            if c.send.fa_msn != msg.ack:
                c.send.fa_msn, c.send.fa_count = msg.ack, 0
            c.send.fa_count += 1
            if (c.send.fa_count >= self.config.first_ack_slowdown and self.is_primary
                    and self.backups and c.state is SendState.STREAMING):
                c.throttle()
                self.timers.set(Timer.THROTTLE_END, c.cid, self._now + self.config.throttle_us)
                self._count("throttled")
        duty = RESPONDS_TO_FIRST_ACK[(self.is_primary, bool(self.backups))]
        # "has our application produced the acked message?" -- by stream offset: the
        # FIRST_ACK's trailer states how far the remote primary delivered our stream
        # (msns would not do: primary and backups cut the stream differently)
        if (duty is Duty.SECOND_ACK and msg.ack > 0 and not c.resyncing
                and c.send.out_offset >= c.remote_view.delivered):
            self._emit(c.remote, self._msg(c, MsgType.SECOND_ACK, {}, ack=msg.ack))

    def _on_second_ack_at_primary(self, c: Connection, msg: Message) -> None:
        if c.recv.fa_pending and msg.ack >= c.recv.fa_pending:
            c.recv.fa_pending = 0
            self.timers.clear(Timer.FIRST_ACK, c.cid)
            c.recv.fa_tries = 0
            self._arm_keepalive(c)

    def _on_second_ack_at_backup(self, c: Connection, msg: Message) -> None:
        if c.recv.view is None:
            self._new_remote_view(c, msg.pvn, flush=False)
        # line 72. The ack echoes a FIRST_ACK of our primary, which may still have
        # counted in the remote's previous view: after a remote change of primary only
        # the remote primary's own sent-up-to is trusted.
        if msg.pvn == c.recv.view.pvn and not c.recv.view.after_change:
            self._expect(c, c.recv.view, msg.ack)

    def _on_keepalive(self, c: Connection, msg: Message) -> None:
        c.send.fa_count = 0
        if c.state is SendState.THROTTLED:
            self.timers.clear(Timer.THROTTLE_END, c.cid)
            c.unthrottle()
            self._flush(c)

    def _on_remote_nack(self, c: Connection, msg: Message) -> None:
        self._answer_remote_nack(c, msg.body["missing"])

    def _on_npv_ack(self, c: Connection, msg: Message) -> None:
        if c.resyncing:
            self._resync(c, msg.body["last_delivered_from"], msg.body["last_sent_to"])

    def _on_trailer(self, c: Connection, msg: Message, trailer, from_primary: bool) -> None:
        sent_upto, own, refl, others, _ = trailer
        rx = c.recv.view
        if from_primary and rx is not None and msg.pvn == rx.pvn:
            if msg.type not in DATA_TYPES:
                self._declared(c, rx, sent_upto, msg.ts)
            for seq, role, upto in others:
                cid2 = (msg.src_group, seq, ROLES[1 - role])   # role: 0 or 1 (trailer.py)
                c2 = self.conns.get(cid2)
                if c2 is None and self.is_primary and cid2 in self.closed:
                    # the remote still holds a connection we freed: stating it is a
                    # message on it, answered CLOSED. Nothing else brings its end the
                    # news (we no longer list it, and its own keep-alives back off while
                    # the others' trailers speak for it): until then its sent list waits
                    # for our watermark and its recv_ts pins its group's.
                    self._answer_closed(cid2)
                    continue
                if c2 is not None and c2.recv.view is not None and c2.recv.view.pvn == msg.pvn:
                    self._declared(c2, c2.recv.view, upto, msg.ts)
                # the remote group watermark is the group's (every member's watermark over
                # its known connections), and the sender lists only connections it knows:
                # it covers c2 as well (a keep-alive on c2 itself is then not needed)
                if c2 is not None and msg.back > c2.remote_view.group_watermark:
                    c2.remote_view.group_watermark = msg.back
                    self._gc_sent(c2)
            if own is not None:
                # kept at a backup too: promoted before the remote primary's successor
                # asks (a double failover), it is what our group holds of the old remote
                # primary's unprotected choices, which the output we took depends on
                last = section_end(own)
                lr = c.remote_view.last_order_info
                if lr is None or last >= section_end(lr):
                    c.remote_view.last_order_info = own
                refl_now = c.remote_view.to_reflect
                if self.is_primary and ((refl_now is None or last > section_end(refl_now))
                                        and last > self._reflected.get(c.remote, (0, 0))):
                    c.remote_view.to_reflect = own
                    self._want_first_ack(c, self.config.first_ack_delay_us, reflect=True)
        if refl is not None:
            if self.is_primary:
                if msg.type == MsgType.NEW_PRIMARY_VIEW_ACK:
                    self._actions.append(RecoveredOrderInfo(c.cid, refl[0], refl[1],
                                                            tuple(refl[2])))
                # any other reflection is for our backups (it does not protect: see
                # orderinfo_log.py)
            else:
                self._oi_accept(refl, "oi_via_reflection")

    def _declared(self, c: Connection, rx: ReceiveSequence, sent_upto: int, ts: int) -> None:
        """The remote primary had sent msns up to `sent_upto` on `c` when it stamped `ts`."""
        self._wm_dirty.add(c)
        if sent_upto >= c.recv.declared[0] or ts > c.recv.declared[1]:
            c.recv.declared = (max(sent_upto, c.recv.declared[0]), max(ts, c.recv.declared[1]))
        self._expect(c, rx, sent_upto)
        c.recv.advance_ts(rx)

    def _on_remote_ack(self, c: Connection, msg: Message) -> None:
        a = msg.ack
        if msg.type != MsgType.FIRST_ACK and a != c.send.last_msn:
            c.send.fa_count = 0
        if self.is_primary:
            if a > c.send.remote_ack and a <= c.send.last_msn:
                c.send.remote_ack = a
                c.send.on_acked(a, self._now)       # a round-trip sample (Karn's rule)
                # progress: the timer restarts for what is still unacked (the timeout
                # itself stays the estimate: an ack does not reset it to the floor)
                self.timers.set(Timer.RETRANSMIT, c.cid,
                                (self._now + c.send.rto_us) if a < c.send.last_msn else None)

    def _trim_log(self, c: Connection) -> None:
        """A backup does not know the timestamps its primary gave its messages, so it
        cannot compare them with the remote group watermark. But the primary's sent list
        never holds more than window_msgs messages (window_bytes) past that watermark, so
        every byte below (remote primary's delivered offset - window_bytes) is covered."""
        upto = c.remote_view.delivered - self.config.window_msgs * self.config.max_payload_bytes
        while c.send.log and c.send.log[0][1] + len(c.send.log[0][2]) <= upto:
            _, _, d = c.send.log.popleft()
            c.send.log_bytes -= len(d)

    def _new_remote_view(self, c: Connection, pvn: int, flush: bool) -> None:
        # a backup keeps filling the old view's gaps locally (unless phase 2 flushed it)
        first = c.recv.view is None
        self._wm_dirty.add(c)
        c.recv.new_view(pvn, keep_old_gaps=not flush and not self.is_primary)
        self._digest_changed()
        if first:
            self._flush(c)          # what we queued before the opener's first message

    # ------------------------------------------------------------------ receiving ---
    def _rx_data(self, c: Connection, rx: ReceiveSequence, msg: Message) -> None:
        self._wm_dirty.add(c)
        m = msg.msn
        if m <= rx.upto or rx.slots.get(m) is not None:
            self._count("dup_data")
            if self.is_primary and rx is c.recv.view:      # our ack may be lost: re-ack soon
                self._want_first_ack(c, self.config.first_ack_delay_us, reflect=True)
            return
        if m > rx.upto + self.config.max_placeholders:
            self._count("beyond_window")
            return
        if rx.first_offset is None or msg.body["offset"] < rx.first_offset:
            rx.first_offset = msg.body["offset"]
        c.send.ka_idle = 0                  # data moves: its own keep-alives come sooner
        if m == 1:
            rx.start = msg.body["offset"]
        self._expect(c, rx, m - 1)
        rx.slots[m] = msg
        rx.nacks.discard(m)
        self._advance(c, rx)

    def _expect(self, c: Connection, rx: ReceiveSequence, upto: int) -> None:
        """The remote primary sent everything up to msn `upto`: placeholders + nacks."""
        if rx.expect(upto, self.config.max_placeholders):
            self.timers.arm(Timer.NACK, c.cid, self._now + self.config.nack_delay_us)

    def _advance(self, c: Connection, rx: ReceiveSequence) -> None:
        self._wm_dirty.add(c)
        for m in rx.take_contiguous():
            c.recv.keep_received(m)
            self._holding.add(c)
            c.recv.held.append(m)
            if m.ts > self.max_data_ts:
                self.max_data_ts = m.ts
        self._release_held(c)
        c.recv.advance_ts(rx)
        c.recv.drop_old_view_if_done()
        self._gc_received(c)

    def _release_held(self, c: Connection, force: bool = False) -> None:
        """Deliver what is received in order, at a backup only what its primary has too.

        A backup that delivered a remote message its primary never received (lost on the
        way to the primary only) would hold bytes its group does not agree on: if the
        remote primary then fails, our primary answers NEW_PRIMARY_VIEW with the point
        it delivered, the new remote primary re-sends from there with its own choices
        (the order info that message carried reached only our backups), and the backup's
        application reads other bytes than the primary's did. So a backup delivers a
        message once its ts is within the group watermark its primary announced (every
        member, the primary included, has received it, and the primary delivers in order
        on receipt), or, for an older remote view, below where the current remote
        primary resumed (our primary delivered those). The rest of an older view is not
        the group's and is dropped. A primary delivers on receipt."""
        self._wm_dirty.add(c)
        held = c.recv.held
        cur = c.recv.view
        while held:
            m = held[0]
            if m.pvn < cur.pvn:
                if cur.start is None and not force:
                    break               # where the current remote primary resumed: unknown
                held.popleft()
                part = m if force else self._below_resume_point(c, m)
                n = 0 if part is None else len(part.body["data"])
                if n < len(m.body["data"]):
                    c.recv.keep_beyond(m.body["offset"] + n, m.body["data"][n:])
                if part is not None:
                    self._deliver(c, part.body["offset"], part.body["data"])
                continue
            if not self.is_primary and not force and m.ts > self.gw:
                if m.body["offset"] > c.recv.delivered:     # bytes before it are missing
                    self.timers.arm(Timer.NACK, c.cid, self._now + self.config.nack_delay_us)
                break
            held.popleft()
            self._deliver(c, m.body["offset"], m.body["data"])

    def _release_all_held(self) -> None:
        for c in self.conns.values():
            if c.recv.held:
                self._release_held(c)

    def _deliver(self, c: Connection, offset: int, data: bytes) -> None:
        self._wm_dirty.add(c)
        end = offset + len(data)
        if c.recv.finished:
            self._count("after_end" if end > c.recv.delivered else "dup_bytes")
            return
        if end <= c.recv.delivered:
            self._count("dup_bytes")
            return
        if offset > c.recv.delivered:
            # only after a change of primary: bytes ahead of a gap wait (bounded)
            if len(c.recv.ahead) < self.config.max_placeholders:
                c.recv.ahead[offset] = data
            self.timers.arm(Timer.NACK, c.cid, self._now + self.config.nack_delay_us)
            return
        if offset < c.recv.delivered:
            data = data[c.recv.delivered - offset:]
        start, e = c.recv.delivered, c.recv.end
        if c.foreign:
            c.foreign = False               # its stream continues here: ours from now on
            if self.is_primary:
                self.served_pvn = self.pvn
        if e is not None and start <= e < end:
            if e > start:
                self._actions.append(Deliver(c.cid, start, data[:e - start]))
            self._actions.append(Closed(c.cid, e, c.recv.abort))
            self._count("stream_ends")
        else:
            self._actions.append(Deliver(c.cid, start, data))
        c.recv.delivered = end
        c.recv.drop_beyond_delivered()
        while c.recv.ahead:
            ready = [o for o in c.recv.ahead if o <= c.recv.delivered]
            if not ready:
                break
            for o in ready:
                d = c.recv.ahead.pop(o)
                if o + len(d) > c.recv.delivered:
                    self._deliver(c, o, d)

    # ------------------------------------------------------------------- sending ---
    def _flush(self, c: Connection) -> None:
        """Send queued segments while the window, byte bound and throttle allow."""
        if not self.is_primary or c.state is not SendState.STREAMING:
            return
        if c.role is Role.SERVER and c.recv.view is None:
            # The end that opened the connection speaks first: until its first message
            # reaches us we only queue. So every message on a connection has a larger
            # ts than the opener's first one (Lamport), which lets the opener count a
            # connection it never heard back on at that ts (timestamp_watermark).
            return
        config = self.config
        while c.send.queue and len(c.send.sent) < config.window_msgs:
            offset, data = c.send.queue.popleft()
            c.send.queue_bytes -= len(data)
            flags = 0
            if not c.send.sent_open:
                flags = STREAM_OPEN
                c.send.sent_open = True
            e = c.send.end
            if e is not None and offset <= e < offset + len(data):
                flags |= STREAM_RST if c.send.abort else STREAM_FIN
            mtype = MsgType.REQUEST if c.role == Role.CLIENT else MsgType.REPLY
            msg = self._msg(c, mtype, {"offset": offset, "data": data, "flags": flags},
                            msn=c.send.next_msn)
            if not c.send.first_ts:
                c.send.first_ts = msg.ts
                self._wm_dirty.add(c)
            c.send.next_msn += 1
            c.send.sent.append(msg)
            c.send.sent_at[msg.msn] = self._now
            c.send.ka_idle = 0
            c.send.sent_bytes += len(data)
            self._emit(c.remote, msg)
            self.timers.arm(Timer.RETRANSMIT, c.cid, self._now + c.send.rto_us)
            # data carries our ack: a pending FIRST_ACK is superseded
            c.recv.fa_pending = 0
            self.timers.clear(Timer.FIRST_ACK, c.cid)
            c.recv.fa_tries = 0

    def _retransmit(self, c: Connection) -> None:
        """The oldest unacked message went a timeout without an ack: it goes out again,
        and when more are unacked a KEEP_ALIVE follows it, whose trailer states our
        sent-up-to: the remote primary makes placeholders for what it lacks and NACKs
        them (`_answer_remote_nack`). Resending the whole unacked window instead turned
        every late ack into a burst of duplicates: on a saturated host (16 clients, a
        connection per request) a fifth of a gateway's REPLYs were duplicates, each a
        datagram and a pass at the receiver, which made the host later still."""
        unacked = [m for m in c.send.sent if m.msn > c.send.remote_ack]
        if not unacked:
            self.timers.clear(Timer.RETRANSMIT, c.cid)
            return
        self._emit(c.remote, self._refresh(c, unacked[0]))
        if len(unacked) > 1:
            self._emit(c.remote, self._msg(c, MsgType.KEEP_ALIVE, {}))
        self._count("retransmit")
        c.send.rto.timed_out()                      # exponential back-off
        self.timers.set(Timer.RETRANSMIT, c.cid, self._now + c.send.rto_us)

    def _refresh(self, c: Connection, m: Message) -> Message:
        """A retransmission: same msn, ts and data; fresh ack/back. Its ack gives no
        round-trip sample (Karn's rule)."""
        c.send.sent_at.pop(m.msn, None)
        rx = c.recv.view
        return Message(type=m.type, src_group=m.src_group, dst_group=m.dst_group,
                       conn_seq=m.conn_seq, role=m.role, pvn=m.pvn,
                       precedence=m.precedence, sender=m.sender, msn=m.msn,
                       ack=rx.upto if rx else 0, back=self._back(c), ts=m.ts,
                       body=m.body, order_info=m.order_info)

    def _want_first_ack(self, c: Connection, delay_us: int, reflect: bool = False) -> None:
        rx = c.recv.view
        if rx is None or not self.is_primary:
            return
        if reflect or rx.upto > c.recv.fa_pending or c.recv.fa_pending == 0:
            due = self._now + delay_us
            self.timers.arm_earlier(Timer.FIRST_ACK, c.cid, due)
            c.recv.fa_tries = 0

    def _first_ack(self, c: Connection) -> None:
        rx = c.recv.view
        if rx is None:
            self.timers.clear(Timer.FIRST_ACK, c.cid)
            return
        c.recv.fa_pending = max(rx.upto, 1) if rx.upto else 0
        self._emit(c.remote, self._msg(c, MsgType.FIRST_ACK, {}))
        c.recv.fa_tries += 1
        if c.recv.fa_pending and c.recv.fa_tries < self.config.first_ack_max_tries:
            # the remote group answers within a round trip: retry after the connection's
            # estimated retransmission timeout (at least first_ack_retry_us), so a loaded
            # remote is not asked again while the answer still waits in its queue
            self.timers.set(Timer.FIRST_ACK, c.cid,
                            self._now + max(self.config.first_ack_retry_us, c.send.rto_us))
        else:
            self.timers.clear(Timer.FIRST_ACK, c.cid)
            c.recv.fa_pending = 0
            c.recv.fa_tries = 0
            self._arm_keepalive(c)

    def _arm_keepalive(self, c: Connection) -> None:
        if self.is_primary:
            due = c.send.last_send_us + self.config.keepalive_us
            if due <= self._now:
                due = self._now + self.config.keepalive_us
            # never later than one already due: an urgent one (watermark news, which
            # one keep-alive says for the whole remote group) must not wait an interval
            # (_keepalive decides again when it fires)
            self.timers.arm_earlier(Timer.KEEPALIVE, c.cid, due)

    def _keepalive(self, c: Connection) -> None:
        if not c.known or c.resyncing:
            self.timers.clear(Timer.KEEPALIVE, c.cid)
            return
        # Any message to the same group states this connection's sent-up-to in its trailer
        # (`others`), with a fresh ts: one keep-alive per remote group and interval, not
        # one per connection (with many idle connections those were most of the traffic).
        # (not `delivered`, which only its own trailer carries: news of it is sent on it);
        # and each connection still speaks itself every KEEPALIVE_OWN_EVERY intervals,
        # so what only it carries (ack, delivered) is repeated if a datagram was lost
        ka = self.config.keepalive_us
        if (not self.ever_shared and not c.send.sent and not c.send.queue
                and not c.recv.received and not c.recv.held):
            # A primary that has always been alone in its group (a gateway) on a
            # connection with nothing in flight either way backs off: no backup of ours
            # relies on its keep-alives as evidence, and a remote group whose watermark
            # our silence pins asks for a fresh one (SOLICIT). A gateway's group
            # connection stays open while it runs: its keep-alives reached every server
            # replica 66 times a second when idle. A primary that ever had a member
            # beside it keeps its pace, backups or not: its keep-alives are what the
            # remote group answers a probing backup of ours with (membership/core.py
            # "Takeover needs evidence"), and a backup it removed while that backup was
            # cut off probes after the heal, before it hears it was removed: backed off
            # to 480 ms, the remote group said our primary was silent there too and the
            # removed backup took over from a live primary (its stale state won, the
            # live one reset: replica_removed_backup_probes_a_lone_primary).
            ka <<= min(c.send.ka_idle, LONE_IDLE_BACKOFF)
        spoke = c.send.last_send_us
        if c.recv.told_delivered == c.recv.delivered:
            own = min(KEEPALIVE_OWN_EVERY << c.send.ka_idle, KEEPALIVE_OWN_MAX)
            spoke = max(spoke, min(self._told_us.get(c.remote, 0),
                                   c.send.last_send_us + (own - 1) * ka))
        if c.send.ka_urgent or self._now - spoke >= ka:
            if not c.send.ka_urgent and c.send.ka_idle < 8:
                c.send.ka_idle += 1
            c.send.ka_urgent = False
            self._emit(c.remote, self._msg(c, MsgType.KEEP_ALIVE, {}))
            spoke = self._now
        self.timers.set(Timer.KEEPALIVE, c.cid, spoke + ka)

    def _nack(self, c: Connection) -> list[list]:
        """Nack gaps: the primary on the remote connection, a backup on the local one
        (returns the local entries, batched by the caller into one NACK)."""
        config = self.config
        entries: list[list] = []
        rxs = [r for r in (c.recv.old_view, c.recv.view) if r is not None and r.nacks]
        gap_to = c.recv.gap_before()
        if not self.is_primary and gap_to is not None:
            # bytes of an old remote primary we never heard of: ask by stream offset
            entries.append([c.remote, c.seq, int(c.role), 0, c.recv.delivered, gap_to])
            self.timers.set(Timer.NACK, c.cid, self._now + config.nack_retry_us)
        if not rxs:
            if not entries:
                self.timers.clear(Timer.NACK, c.cid)
            return entries
        self.timers.set(Timer.NACK, c.cid, self._now + config.nack_retry_us)
        for rx in rxs:
            missing = sorted(rx.nacks)[: config.max_nack_msns]
            self._count("nack_msns", len(missing))
            if self.is_primary:
                if rx is c.recv.view:
                    self._emit(c.remote, self._msg(c, MsgType.NACK, {"missing": missing}))
            else:
                entries.append([c.remote, c.seq, int(c.role), rx.pvn, *missing])
        return entries

    def _answer_remote_nack(self, c: Connection, missing: list) -> None:
        if not missing:                         # "where are you?": a fresh keep-alive
            self._emit(c.remote, self._msg(c, MsgType.KEEP_ALIVE, {}))
            return
        want = {m for m in missing if type(m) is int}
        n = 0
        for m in c.send.sent:
            if m.msn in want:
                self._emit(c.remote, self._refresh(c, m))
                n += 1
        self._count("nack_answered", n)

    def _answer_local_nacks(self, entries: list) -> None:
        for e in entries:
            if (type(e) is not list or len(e) < 4 or type(e[0]) is not str
                    or type(e[1]) is not int or e[2] not in (0, 1) or type(e[3]) is not int):
                continue
            c = self.conns.get((e[0], e[1], Role(e[2])))
            if c is None:
                continue
            if len(e) == 6 and e[3] == 0 and type(e[4]) is int and type(e[5]) is int:
                lo, hi = e[4], e[5]                 # a byte range, any remote view
                for m in c.recv.received:
                    off = m.body["offset"]
                    if off < hi and off + len(m.body["data"]) > lo:
                        self._emit(self.group, m)
                continue
            pvn, want = e[3], {m for m in e[4:] if type(m) is int}
            for m in c.recv.received:
                if m.pvn == pvn and m.msn in want:
                    self._emit(self.group, m)       # the remote primary's own message
            for rx in (c.recv.view, c.recv.old_view):
                if rx is not None and rx.pvn == pvn:
                    for k, m in rx.slots.items():
                        if m is not None and k in want:
                            self._emit(self.group, m)

    # ----------------------------------------------------------- phase 2 (messaging) ---
    def _send_npv(self, c: Connection) -> None:
        if not c.resyncing:
            self.timers.clear(Timer.NEW_PRIMARY_VIEW, c.cid)
            return
        self._emit(c.remote, self._msg(c, MsgType.NEW_PRIMARY_VIEW,
                                       {"old_pvn": c.send.old_pvn,
                                        "last_delivered": c.recv.delivered}))
        self.timers.set(Timer.NEW_PRIMARY_VIEW, c.cid, self._now + self.config.npv_retry_us)

    def _answer_npv(self, c: Connection, msg: Message) -> None:
        """Remote side of phase 2 (line 38-41): flushed (see _new_remote_view); report
        the last byte delivered from, and the last byte sent to, the old primary's group."""
        c.remote_view.to_reflect = c.remote_view.last_order_info   # the old primary's last
        # Resend point: not just what we delivered, but the lowest offset a member of
        # our group may still lack (our received list holds exactly the messages the
        # group watermark has not yet covered), so that no backup of ours is left with
        # a gap if we fail too.
        # A repeated NEW_PRIMARY_VIEW (our answer was lost) gets the same answer: the
        # whole remote group numbers its log from it, and we may have collected since.
        if c.remote_view.npv_answer is None or c.remote_view.npv_answer[0] != msg.pvn:
            # We fix the point the new remote primary resumes from, so what we hold of its
            # predecessor's stream (a backup promoted before its primary's word came) is
            # ours to deliver first: the answer then covers it.
            if c.recv.held:
                self._release_held(c, force=True)
            low = min([m.body["offset"] for m in c.recv.received] + [c.recv.delivered])
            sent = c.send.sent
            sent_to = (sent[-1].body["offset"] + len(sent[-1].body["data"]) if sent
                       else (c.send.queue[0][0] if c.send.queue else c.send.out_offset))
            sec = c.remote_view.last_order_info
            c.remote_view.npv_answer = (msg.pvn, low, sent_to, c.recv.delivered, None if sec
                                        is None else (sec[0], sec[1], section_end(sec)[1]))
        _, low, sent_to, _, _ = c.remote_view.npv_answer
        self._emit(c.remote, self._msg(c, MsgType.NEW_PRIMARY_VIEW_ACK,
                                       {"last_delivered_from": low,
                                        "last_sent_to": sent_to}))
        # the new primary may lack our tail: make our unacked data go out again
        if c.send.sent and self.timers.due(Timer.RETRANSMIT, c.cid) is None:
            self.timers.set(Timer.RETRANSMIT, c.cid, self._now)

    def _resync(self, c: Connection, resend_from: int, remote_sent_to: int) -> None:
        """New primary: re-send from the log exactly the bytes the remote end lacks."""
        self.timers.clear(Timer.NEW_PRIMARY_VIEW, c.cid)
        if c.end_resync(resend_from):
            self._count("resync_gap")       # the log lost bytes the remote lacks
        self._actions.append(Resynced(c.cid, resend_from, remote_sent_to))
        self._flush(c)
        self._phase2_check()

    def _phase2_check(self) -> None:
        if self.phase2_pvn is not None and not any(x.resyncing for x in self.conns.values()):
            self._actions.append(Phase2Done(self.phase2_pvn))
            self.phase2_pvn = None

    # ======================================================= stream end and freeing ===
    def _on_closed(self, c: Connection, msg: Message) -> None:
        """The remote primary freed the connection: it has our whole stream, we have its
        (a new primary's phase 2 ends here on this connection)."""
        if c.peer_done:
            return
        self._take_held_of_ended_remote(c)
        # a remote group frees a connection only once our group had its stream's end, so
        # no end delivered here means the remote LOST it: a gateway restarted after a
        # crash answers CLOSED for its predecessor's connections (it accepts none it did
        # not open).
        if not c.recv.finished:
            self._count("peer_forgot")
            self._peer_lost(c)
            return
        self._peer_done(c)

    def _peer_done(self, c: Connection) -> None:
        """Nothing more goes to the remote group on `c`: it freed the connection, lost
        it or is gone. Freed here without waiting for our application's end (what it
        still writes is discarded), once our backups have all we received (`_reap`)."""
        c.peer_finished()
        self._ending.add(c.cid)
        for kind in (Timer.RETRANSMIT, Timer.NEW_PRIMARY_VIEW, Timer.THROTTLE_END,
                     Timer.REMOTE_SILENCE):
            self.timers.clear(kind, c.cid)      # (a lost one's re-sends arm it again)
        self._count("peer_freed")
        self._phase2_check()

    def _take_held_of_ended_remote(self, c: Connection) -> None:
        """Primary, the remote freed, lost or is gone: deliver what we still hold in
        order. Those are an older remote view's messages we took as a backup and could
        not deliver at our promotion (where the remote's new primary resumed is unknown,
        and now stays so): our predecessor delivered them, and a backup may have too, so
        they are the stream's last bytes (and may end it: then it is done, not lost)."""
        if c.recv.held:
            self._count("lost_held_released")
            self._release_held(c, force=True)

    def _peer_lost(self, c: Connection) -> None:
        """Primary: the remote group lost the connection (CLOSED on a stream that never
        ended here) or is gone (silent). To us that is its reset after what we
        delivered: the application gets it (`Closed`, abort) and ends its side; the
        connection is freed once our backups have every byte we delivered (the received
        list empty: our group watermark covers it), then at the backups by our word.
        So every replica's application sees the reset after the same bytes, and the
        connection no longer pins our group watermark on a stream that never moves."""
        c.lost_at = c.recv.end = c.recv.delivered
        c.recv.abort = True
        c.recv.delivered += 1               # the end takes one unit of the offsets
        # what came beyond a gap never completes: dropped, or it would pin our watermark
        for rx in (c.recv.view, c.recv.old_view):
            if rx is not None:
                rx.slots.clear()
                rx.nacks.clear()
        c.recv.old_view = None
        c.recv.ahead.clear()
        self.timers.clear(Timer.NACK, c.cid)
        self._wm_dirty.add(c)
        self._actions.append(Closed(c.cid, c.recv.end, True))
        self._peer_done(c)
        self._resend_received(c)

    def _resend_received(self, c: Connection) -> None:
        """Primary, a connection whose remote is gone: a backup may lack bytes we
        delivered and never learn they exist (the remote's declarations of what it sent
        went with it), so we multicast to our group the remote's messages we still hold
        (as for a backup's NACK), again with back-off until our group watermark covers
        them or every backup says it holds the cut (`_cut_held`); then `_reap` frees the
        connection."""
        # every message still received: those past the group watermark, and an old
        # remote view's that a backup's watermark may cover without its having them
        # (ReceiveSide.drop_received)
        pending = list(c.recv.received)
        if not pending or not self.backups or self._cut_held(c):
            self.timers.clear(Timer.REMOTE_SILENCE, c.cid)
            return
        for m in pending:
            self._emit(self.group, m)           # the remote primary's own message
        self._count("lost_resent", len(pending))
        self.timers.set(Timer.REMOTE_SILENCE, c.cid, self._now + min(
            self.config.retransmit_max_us, self.config.retransmit_us << c.lost_resends))
        c.lost_resends = min(c.lost_resends + 1, 16)

    def _answer_closed(self, cid: ConnId) -> None:
        """CLOSED, at most once per retransmit_us per connection (a remote primary
        retransmits a whole window at once); the memory of it is bounded."""
        last = self._closed_answered.get(cid)
        if last is not None and self._now - last < self.config.retransmit_us:
            return
        _remember(self._closed_answered, cid, self._now, CLOSED_ANSWERS_KEPT)
        self._emit(cid[0], self._closed_msg(cid))

    def _closed_msg(self, cid: ConnId) -> Message:
        self.clock += 1
        return Message(type=MsgType.CLOSED, src_group=self.group, dst_group=cid[0],
                       conn_seq=cid[1], role=cid[2], pvn=self.pvn,
                       precedence=self.precedence, sender=self.birth_id, ts=self.clock)

    def _reap(self) -> None:
        """Primary: free every connection whose streams both ended and that nobody needs
        any more: the remote group has ours (the sent list is empty: its watermark covers
        our end) and our whole group has the remote's (its end delivered, the received
        list empty: our group watermark covers it), or the remote group said CLOSED.
        Backups free what their primary freed (`_apply_frees`).
        A connection whose remote is done receives nothing more, so nothing else would
        collect its received list: that is done here, again after each free (a freed
        connection's term no longer holds our watermark down)."""
        if not self._ending or not self.is_primary:
            return
        progress = True
        while progress:
            progress = False
            for cid in list(self._ending):
                c = self.conns.get(cid)
                if c is None:
                    self._ending.discard(cid)
                    continue
                if c.resyncing or (self.backups and len(self.freed_log)
                                   >= self.config.max_freed_pending):
                    continue
                if c.peer_done and c.recv.received:
                    self._gc_received(c)
                if (c.peer_done and not c.recv.received) or (
                        not c.send.queue and not c.send.sent and c.recv.finished
                        and not c.recv.received and c.recv.end_is_groups()):
                    if not c.recv.finished:
                        self._count("freed_unfinished")     # the sim flags the missing end
                    self._free(c)
                    progress = True
                elif c.peer_done and self._cut_held(c):
                    self._count("freed_at_held_cut")
                    self._free(c, self._cut_of(c))
                    progress = True

    def _free(self, c: Connection, cut: int | None = None) -> None:
        cid = c.cid
        if cut is not None:
            self._deliver_upto(c, cut)
        if c.recv.held:
            # a backup freeing on its primary's word: the primary freed it only once our
            # watermark covered the remote's whole stream (or up to its cut), so what we
            # hold is the group's
            self._release_held(c, force=True)
        del self.conns[cid]
        self._wm_dirty.add(c)               # its term goes at the next computation
        self._holding.discard(c)
        self._ending.discard(cid)
        self.recent_frees.append(cid)
        cut = c.lost_at if cut is None else cut
        if cut is not None:
            _remember(self._recent_cuts, cid, cut, self.config.max_freed_pending)
        for kind in CONNECTION_TIMERS:
            self.timers.clear(kind, cid)
        self.closed.add(cid)
        if self.is_primary and self.backups:
            self.freed_log.append((cid, _item_hash(c) if c.known else 0, cut))
        if c.known:
            self._digest_changed()
        self._actions.append(Freed(cid))
        self._count("freed")
        if c.resyncing:
            self._phase2_check()

    @staticmethod
    def _cut_of(c: Connection) -> int:
        """Where the stream of a connection whose remote is done or gone stops for our
        group: the reset's offset if it was lost, else all we delivered (its end)."""
        return c.lost_at if c.lost_at is not None else c.recv.delivered

    def _waiting_cuts(self) -> list[tuple[ConnId, int]]:
        """Primary: the connections whose remote is done or gone that still wait for
        their received list (a backup's watermark term may never cover it: it follows a
        newer remote view than ours, or an old one frozen at a gap, and the remote will
        send nothing more), with their cuts."""
        out = []
        for cid in self._ending:
            c = self.conns.get(cid)
            if c is not None and c.peer_done and c.recv.received:
                out.append((cid, self._cut_of(c)))
        out.sort(key=lambda e: self._conn_order.get(e[0], 0))
        return out[:CUTS_PER_HEARTBEAT]

    def _cut_held(self, c: Connection) -> bool:
        """Primary: every backup said (its last HEARTBEAT of this view) that the bytes it
        holds reach the cut of `c`: freeing it there loses nothing at any of them."""
        if not self.backups:
            return True                         # nobody else to hold it
        cut = self._cut_of(c)
        return all(self.cut_reports.get(b, {}).get(c.cid, -1) >= cut for b in self.backups)

    def _reach(self, c: Connection, cut: int) -> int:
        """Backup: how far toward `cut` `_deliver_upto` would deliver now."""
        rx = c.recv
        pieces = self._cut_pieces(c, cut)
        pos = pieces[-1][0] + len(pieces[-1][1]) if pieces else rx.delivered
        if rx.finished or (rx.end is not None and pos > rx.end):
            return cut                          # the end delivered: nothing more comes
        return pos

    def _cut_pieces(self, c: Connection, cut: int) -> list[tuple[int, bytes]]:
        """The pieces (offset, bytes) that deliver the stream from `delivered` toward
        `cut`, in order, from every message held of any remote view (offsets are one
        stream: an old remote view's message beyond the new view's resume point is not
        delivered while that view may resend it, but with the remote gone it is the only
        copy); nothing past the stream's end."""
        rx = c.recv
        if rx.finished:
            return []
        have = sorted(((m.body["offset"], m.body["data"]) for m in (*rx.received, *rx.held)),
                      key=lambda od: od[0])
        have += sorted(rx.ahead.items())
        cur = rx.view.pvn if rx.view is not None else 0
        newer = [m.body["offset"] for m in (*rx.received, *rx.held) if m.pvn == cur]
        newer += list(rx.ahead)
        beyond = sorted(rx.beyond.items())
        pos, pieces = rx.delivered, []
        while pos < cut:
            before = pos
            for off, data in have:
                if off <= pos < off + len(data):
                    piece = data[pos - off:cut - off]
                    pieces.append((pos, piece))
                    pos += len(piece)
                    if rx.end is not None and pos > rx.end:
                        return pieces
            if pos == before and beyond and all(off < pos or off >= cut for off in newer):
                # the current remote view re-sent no further than here: the rest up to
                # the cut is what our primary took from the old view before it answered
                # NEW_PRIMARY_VIEW (old-view bytes there are one stream with ours). With
                # newer data of the current view beyond a gap, its bytes may differ from
                # the old view's (an excluded primary's later output): not taken.
                have, beyond = beyond, []
                continue
            if pos == before:
                break                           # nothing more here
        return pieces

    def _reach_announced_cuts(self, announced: dict[ConnId, int]) -> None:
        """A backup promoted: the old primary announced these cuts (its remote done or
        gone), and freed a connection at its cut once every backup, we included, held the
        bytes up to it; a backup that applied that free delivered exactly up to it. We
        deliver up to each cut we hold, so that our own reset of the connection (or its
        end) falls where theirs did."""
        for cid, cut in announced.items():
            c = self.conns.get(cid)
            if c is not None and c.recv.delivered < cut and self._reach(c, cut) >= cut:
                self._count("announced_cut_reached")
                self._deliver_upto(c, cut)

    def _deliver_upto(self, c: Connection, cut: int) -> None:
        """A backup freeing a connection its primary lost, reset after `cut` bytes: it
        delivers exactly the stream's bytes up to there (`_cut_pieces`); what lies beyond
        `cut` (the primary never had it) is not the group's."""
        rx = c.recv
        pieces = self._cut_pieces(c, cut)
        rx.held, rx.ahead, rx.beyond = deque(), {}, {}
        for off, piece in pieces:
            self._deliver(c, off, piece)
        if rx.delivered < cut:
            self._count("lost_bytes_missing")   # the simulator flags the difference

    def _apply_frees(self, data: bytes) -> None:
        """Backup: the frees of its primary (HEARTBEAT), in order, each once. The primary
        freed a connection only once our watermark covered the remote's whole stream on
        it: we delivered all of it; what our application still writes there is dropped.
        A connection the primary lost comes with its cut (`_peer_lost`): we deliver
        exactly up to it."""
        try:
            first, entries, *more = msgpack.unpackb(data)
            cids = [(g, int(seq), Role(role)) for g, seq, role, *_ in entries]
            cuts = [int(e[3]) if len(e) > 3 else None for e in entries]
            first = int(first)
            self.cuts_asked = _unpack_conn_values(more[0] if more else ())
            self.cuts_announced.update(self.cuts_asked)
        except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException):
            self._count("bad_frees")
            return
        for i, cid in enumerate(cids):
            if first + i != self.freed_applied:
                continue
            c = self.conns.get(cid)
            if c is not None:
                self._free(c, cuts[i])
            else:
                self.closed.add(cid)
            self.freed_applied += 1

    def _reconcile_frees(self) -> None:
        """A new primary view. The old primary's last frees may have reached some members
        and not others. The new primary re-announces the frees it made recently (its
        backups apply those they still hold); a backup reports its own recent frees in its
        HEARTBEATs until its digest matches the primary's (the primary frees those it
        still holds: the old primary had found them done)."""
        self.freed_base = self.freed_applied = 0
        self.freed_log.clear()
        if self.is_primary:
            self.freed_log.extend((cid, 0, self._recent_cuts.get(cid))
                                  for cid in self.recent_frees)
            self.carry = []
        else:
            self.carry = list(self.recent_frees)[-FREES_PER_HEARTBEAT:]

    def _trim_freed_log(self) -> None:
        if not self.backups:
            self.freed_base += len(self.freed_log)
            self.freed_log.clear()
        if not self.freed_log or any(b not in self.reports for b in self.backups):
            return
        low = min(self.reports[b][2] for b in self.backups)
        while self.freed_log and self.freed_base < low:
            self.freed_log.popleft()
            self.freed_base += 1

    # ================================================================= intra-group ===
    def _handle_intra(self, msg: Message) -> None:
        t = msg.type
        if t in MEMBERSHIP_TYPES:
            return          # membership's (phase 2 never travels intra-group)
        self.last_heard_us[msg.sender] = self._now
        if t == MsgType.ORDER_INFO and not self.is_primary and msg.sender != self.primary_id:
            self._note_peer_ack(msg)    # (a primary has its backups' acks in order_info)
        if self.is_primary:
            if msg.sender not in self.backups:
                return
        elif msg.sender != self.primary_id or msg.pvn != self.pvn:
            return
        handler = _INTRA_GROUP_HANDLERS.get((t, self.is_primary))
        if handler is not None:
            getattr(self, handler)(msg)

    def _note_peer_ack(self, msg: Message) -> None:
        upto = msg.body.get("upto") if isinstance(msg.body, dict) else None
        if not isinstance(upto, int) or msg.sender not in self.backups:
            return
        acks = self.peer_oi_acks.setdefault(msg.pvn, {})
        acks[msg.sender] = max(acks.get(msg.sender, 0), upto)
        for old in sorted(self.peer_oi_acks)[:-2]:      # this view and the one before
            del self.peer_oi_acks[old]

    # ---- intra-group handlers, by (type, role): the table at the end of this module ----
    def _on_backup_heartbeat(self, msg: Message) -> None:
        # (an ORDER_INFO report says nothing of frees: the last HEARTBEAT's count stands)
        applied = 0 if msg.type == MsgType.HEARTBEAT else \
            self.reports.get(msg.sender, (0, 0, 0))[2]
        reaches: dict[ConnId, int] = {}
        if msg.type == MsgType.HEARTBEAT and msg.order_info and msg.pvn == self.pvn:
            try:
                report = msgpack.unpackb(msg.order_info)
                applied = int(report[0])
                carried = [(g, int(seq), Role(role)) for g, seq, role in report[1]] \
                    if len(report) > 1 else []
                reaches = _unpack_conn_values(report[2] if len(report) > 2 else ())
            except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException):
                self._count("bad_freed_report")
                carried = []
            for cid in carried:         # freed by an earlier primary: done here too
                c = self.conns.get(cid)
                if c is not None:
                    self._count("freed_carried")
                    self._free(c)
                else:
                    self.closed.add(cid)
        if msg.type == MsgType.HEARTBEAT and msg.pvn == self.pvn:
            self.cut_reports[msg.sender] = reaches
            # its lag report again: the ORDER_INFO that carried it may have been lost
            self.order_info.on_done(msg.sender, msg.body["done"])
        self.reports[msg.sender] = (msg.back, msg.ack, applied)
        self._trim_freed_log()
        self._gc_all_received()

    def _on_local_nack(self, msg: Message) -> None:
        self._answer_local_nacks(msg.body["missing"])

    def _on_order_info_ack(self, msg: Message) -> None:
        # a backup's report: order info delivered and executed (its lag), and its
        # watermark as a HEARTBEAT's
        self._on_backup_heartbeat(msg)
        if msg.pvn != self.pvn:
            return
        self.order_info.on_done(msg.sender, msg.body["done"])
        self._backup_acked(msg.sender, msg.body["upto"])

    def _backup_acked(self, backup: int, upto: int) -> bool:
        """`backup` holds our order info up to `upto`: what every backup holds goes, and
        what output waits on is sent on. True if that was news."""
        if not self.order_info.on_ack(backup, upto):
            return False
        self._gc_order_info()
        if self.order_info.log:
            self._order_info_urgent()
        return True

    def _on_joiner_oi_ack(self, msg: Message) -> None:
        """A joiner still receiving its state says it holds the order info we sent it from
        position `from` to `upto` (llft/replica/node.py, "order info before the state").
        Its checkpoint, taken after it was admitted, holds every position up to where it
        joined (`joined_at`); so once restored it holds all up to `upto`, and until then it
        cannot take over. That is an acknowledgment like a backup's, if `from` is at or
        below the first position past where it joined; otherwise there is a hole and it
        counts for nothing (the joiner acks normally once restored). Without it output
        commit waited for the joiner's whole state transfer (an admission under load held
        every reply for 0.3-1.5 s)."""
        if msg.pvn != self.pvn:
            return
        joined = self.order_info.joined_at.get(msg.sender)
        if joined is None or msg.body["from"] > joined + 1:
            self._count("joiner_oi_ack_ignored")
            return
        if self._backup_acked(msg.sender, msg.body["upto"]):
            self._count("joiner_oi_acks")

    def take_early_order_info(self, first: int, chunks: list[bytes]) -> None:
        """A restored joiner: the order info of our view it was sent while its state was
        on its way (positions `first`.. without a hole, `first` at or below the end of
        what the checkpoint held), delivered now past that end; a slice at a time, as a
        backup holds at most max_order_info_pending ahead of what it delivered."""
        step = self.config.max_order_info_pending
        for i in range(0, len(chunks), step):
            self._oi_accept([self.pvn, first + i, chunks[i:i + step]], "oi_before_state")

    def _on_primary_heartbeat(self, msg: Message) -> None:
        # the primary's group watermark holds for the connections it knew (its digest in
        # `ack`); a message on a connection we learned of later may have a lower ts, so
        # only a watermark over our own set of connections counts
        if msg.order_info:
            self._apply_frees(msg.order_info)
        else:
            self.cuts_asked = {}
        if msg.ack == self.digest():
            self.carry = []             # our set of connections is the primary's
        if msg.ack == self.digest() and msg.back > self.gw:
            self.gw = msg.back
            self._gc_all_received()
            self._release_all_held()

    def _on_order_info(self, msg: Message) -> None:
        tr = unpack_trailer(msg.order_info)
        if tr is not None and tr[1] is not None:
            self._oi_accept(tr[1], "oi_via_intra")
        # (re-)ack at once: a direct ORDER_INFO is sent only while the primary waits for it
        # (output commit, or positions order_info_intra_us old that no reflection brought);
        # the ack delay batches what reflections deliver
        if self.config.order_info_direct_ack_us:
            self.timers.arm(Timer.ORDER_INFO_ACK, None,
                            self._now + self.config.order_info_direct_ack_us)
        else:
            self._order_info_ack()

    def _heartbeat(self) -> bool:
        """Send our HEARTBEAT as a `Pulse` (the driver repeats it until our next one).
        When it would say what the last one said, it IS the last one (the same Lamport
        timestamp): the copies are byte-identical, which receivers absorb without waking
        their loop. Returns True then (quiet: the next is due a refresh later)."""
        if not self.backups and self.is_primary:
            return False
        back = self._heartbeat_back()
        body = {"rank": self.rank(), "served": int(self.served), "lineage": self.lineage,
                "change": self.change, "wait": self.wait_of(), "replay": self.replay_of(),
                "rm": self.rm_of(),
                "done": 0 if self.is_primary else self.order_info.executed}
        ack, frees = self.digest(), self._heartbeat_frees()
        hb, k = self.config.heartbeat_us, self.config.pulse_intervals
        msg = self._last_hb
        quiet = (k > 1 and msg is not None and msg.pvn == self.pvn
                 and msg.precedence == self.precedence and msg.back == back
                 and msg.ack == ack and msg.order_info == frees and msg.body == body)
        if not quiet:
            msg = self._last_hb = self._intra(MsgType.HEARTBEAT, body, back=back, ack=ack,
                                              order_info=frees)
        if k == 1:
            self._actions.append(Send(self.group, msg))     # a new one every interval
        else:
            self._actions.append(Pulse(self.group, msg, hb, self._now + pulse_until_us(k, hb),
                                       pulse_lease_us(hb)))
        self._after_heartbeat()
        return quiet

    def _heartbeat_frees(self) -> bytes:
        """What a heartbeat says of freed connections: the primary's frees its backups
        apply in order; a backup's count of frees applied and the recent frees it carries
        (see _apply_frees, _reconcile_frees)."""
        if self.is_primary:
            waiting = self._waiting_cuts() if self.backups else []
            if not (self.freed_log or waiting):
                return b""
            frees = [self.freed_base, [
                [g, seq, int(role)] + ([] if cut is None else [cut])
                for (g, seq, role), _, cut in list(self.freed_log)[:FREES_PER_HEARTBEAT]]]
            if waiting:
                frees.append(_pack_conn_values(waiting))
            return msgpack.packb(frees)
        # how far we reach toward each cut asked (a connection we no longer hold needs
        # nothing from us)
        reaches = _pack_conn_values(
            (cid, self._reach(self.conns[cid], cut) if cid in self.conns else cut)
            for cid, cut in self.cuts_asked.items())
        if not (self.freed_applied or self.carry or reaches):
            return b""
        report = [self.freed_applied, [[g, seq, int(role)] for g, seq, role in self.carry]]
        if reaches:
            report.append(reaches)
        return msgpack.packb(report)

    def _heartbeat_back(self) -> int:
        """A heartbeat's `back`: the primary's group watermark, a backup's report."""
        if self.is_primary:
            return self.group_watermark()
        self.reported_w = self.timestamp_watermark()
        return self.reported_w

    def _after_heartbeat(self) -> None:
        self.timers.clear(Timer.WATERMARK_REPORT)       # reported with this one
        oi = self.order_info
        if not self.is_primary and oi.acked != oi.delivered:
            # the order-info report goes when due (it carries the watermark; the lag is
            # in the heartbeat itself)
            self.timers.arm(Timer.ORDER_INFO_ACK, None,
                            self._now + self.config.order_info_ack_us)

    # ---------------------------------------------------------------- order info ---
    def _oi_accept(self, sec: list, path: str) -> None:
        pvn, first, chunks = sec
        if self.is_primary or pvn != self.pvn:
            return          # order info of another primary view: not ours to deliver
        for pos, chunk in self.order_info.accept(first, chunks):
            self._count(path)
            self._actions.append(DeliverOrderInfo(pos, chunk, self.pvn))
            self.timers.arm(Timer.ORDER_INFO_ACK, None, self._now + self.config.order_info_ack_us)

    def _order_info_ack(self) -> None:
        """A backup's report to its primary, one message for both of its duties: the
        order info delivered (`upto`) and its watermark with the digest (`back`, `ack`,
        as in its HEARTBEAT). Whichever comes due first (ORDER_INFO_ACK, WATERMARK_REPORT)
        sends it and the other is not needed."""
        oi = self.order_info
        oi.acked = oi.delivered
        oi.done_acked = oi.executed
        self.reported_w = self.timestamp_watermark()
        self.timers.clear(Timer.ORDER_INFO_ACK)
        self.timers.clear(Timer.WATERMARK_REPORT)
        self._emit(self.group, self._intra(MsgType.ORDER_INFO, {"upto": oi.delivered,
                                                                "done": oi.executed},
                                           back=self.reported_w, ack=self.digest()))

    def _order_info_intra(self) -> None:
        oi = self.order_info
        floor = oi.floor()
        if floor >= oi.last_pos:
            self.timers.clear(Timer.ORDER_INFO_INTRA)
            return
        due = self._intra_due()
        if due > self._now:
            self.timers.set(Timer.ORDER_INFO_INTRA, None, due)
            return
        # what no backup acked since the last resend is sent again from the floor; before
        # that (an urgent send, _order_info_urgent) only what was never sent goes: resending
        # the whole unacked section on every ack multiplied it by the acks
        # (backing off, doubling while no backup's ack moves the floor: a loaded backup
        # is not sent the same section again every interval)
        after = floor
        if self._now < oi.intra_resend_us:
            after = max(floor, oi.intra_sent)
        else:
            if floor == oi.intra_floor:
                oi.intra_backoff = min(oi.intra_backoff + 1, INTRA_BACKOFF_MAX)
            else:
                oi.intra_floor, oi.intra_backoff = floor, 0
            oi.intra_resend_us = self._now + (self.config.order_info_intra_us
                                              << oi.intra_backoff)
        sec = oi.section(self.pvn, after)
        if sec is not None:
            oi.intra_sent = max(oi.intra_sent, section_end(sec)[1])
        if sec is not None or after == floor:
            # (nothing held past the floor: an empty ORDER_INFO, answered by an ack)
            self._emit(self.group, self._intra(
                MsgType.ORDER_INFO, {"upto": section_end(sec)[1] if sec else oi.last_pos,
                                     "done": 0},
                order_info=pack_trailer(0, sec, None)))
        self.timers.set(Timer.ORDER_INFO_INTRA, None,
                        self._now + self.config.order_info_intra_us
                        if oi.intra_sent < oi.last_pos else oi.intra_resend_us)

    def _intra_due(self) -> int:
        """When the order info no backup acked goes to them directly: once the oldest
        position not acked by all is order_info_intra_us old, or now while output commit
        waits on it (`_order_info_urgent`). Not "an interval after some position was
        unacked": at a steady request rate some position always is (the last reply's,
        on its way to the backups in the next request's reflection), and each firing sent
        them what the reflection brought anyway and drew an ack from each (one client at
        3 replicas: an ORDER_INFO every 4 requests, ~0.6 acks a request)."""
        if self._order_info_waited_on():
            return self._now
        return self.order_info.unacked_since() + self.config.order_info_intra_us

    def _gc_order_info(self) -> None:
        """Drop what every backup acked. While some backup has not acked every position
        (a joiner whose first ack was lost acks nothing more by itself), ORDER_INFO goes on
        asking: it carries what is held past the floor, or nothing, and is answered by an
        ack."""
        oi = self.order_info
        oldest = oi.log[0][0] if oi.log else None
        oi.gc()
        if not self.is_primary or oi.floor() >= oi.last_pos:
            self.timers.clear(Timer.ORDER_INFO_INTRA)
        elif oi.log and oi.log[0][0] != oldest and self._now >= oi.intra_resend_us:
            # the floor moved: the oldest unacked position is a younger one now
            self.timers.set(Timer.ORDER_INFO_INTRA, None, max(self._now, self._intra_due()))
        else:
            self.timers.arm(Timer.ORDER_INFO_INTRA, None,
                            self._now + self.config.order_info_intra_us)

    # ================================================================= watermarks ===
    def timestamp_watermark(self) -> int:
        """mytimestampwatermark: min recv_ts over the connections this replica knows.

        Kept incrementally: every path that changes what a connection's term depends on
        (its receive sequences, gaps, delivered offset, `known`, first ts; its freeing)
        adds it to `_wm_dirty`, and only those terms are computed again here (the
        minimum is the top of a heap with stale entries). It is asked several times per
        message, and computing it over every connection each time was the primary's
        largest cost with many connections open. With CHECK_WATERMARK (the simulator
        and the tests) every call is compared with the plain minimum over all of them."""
        if CHECK_WATERMARK:
            expect = self._timestamp_watermark_full()
        terms, heap = self._wm_terms, self._wm_heap
        if self._wm_dirty:
            conns = self.conns
            for c in self._wm_dirty:
                if c.known and conns.get(c.cid) is c:
                    t = self._wm_term(c, clear=True)
                    if terms.get(c) != t:
                        terms[c] = t
                        heapq.heappush(heap, (t, id(c), c))
                else:
                    terms.pop(c, None)
            self._wm_dirty.clear()
            if len(heap) > 4 * len(terms) + 64:         # mostly stale entries: rebuild
                heap[:] = [(t, id(c), c) for c, t in terms.items()]
                heapq.heapify(heap)
        while heap and terms.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        # no known connection: nothing to collect. 0, not the Lamport clock: the clock
        # rises with every message received, and a backup reporting it re-triggered a
        # report at every member for every heartbeat (a feedback loop of heartbeats)
        w = heap[0][0] if heap else 0
        if CHECK_WATERMARK:
            assert w == expect, f"incremental timestamp watermark {w} != {expect}"
        return w

    def _wm_term(self, c: Connection, clear: bool) -> int:
        """A known connection's term of the timestamp watermark; `clear`: forget the
        frozen recv_ts of an old remote view once caught up with the new one."""
        if c.recv.view is not None:
            ts = c.recv.view.ts
        elif c.role is Role.CLIENT:
            # We opened it and never heard back: the remote can only answer after
            # receiving our first message, so above its ts (Lamport). Without this,
            # every just-opened connection pinned the watermark at 0 and short
            # connections starved everybody's garbage collection.
            ts = c.send.first_ts
        else:
            ts = 0
        if c.recv.old_view is not None or c.recv.gap_before() is not None:
            return 0            # a gap in the stream: nothing may be collected yet
        if c.recv.old_ts is not None:
            first = c.recv.view.first_offset if c.recv.view is not None else None
            if first is not None and c.recv.delivered >= first:
                if clear:
                    c.recv.old_ts = None     # caught up with the new remote primary
            else:
                ts = min(ts, c.recv.old_ts)
        return ts

    def _timestamp_watermark_full(self) -> int:
        """The definition, over every known connection (CHECK_WATERMARK). Also checks
        that a connection left out of `_wm_dirty` has nothing to forget either."""
        w = None
        for c in self.conns.values():
            if c.known:
                t = self._wm_term(c, clear=False)
                if c not in self._wm_dirty:
                    assert self._wm_terms.get(c) == t, f"stale watermark term of {c.cid}"
                    rv = c.recv.view
                    # (with a gap or an old view left the term is 0 and old_ts stays: what
                    # closes the gap marks the connection, and the clear happens then)
                    assert not (c.recv.old_ts is not None and rv is not None
                                and rv.first_offset is not None
                                and c.recv.delivered >= rv.first_offset
                                and c.recv.old_view is None
                                and c.recv.gap_before() is None), \
                        f"caught-up connection {c.cid} not marked for the watermark"
                if w is None or t < w:
                    w = t
        return 0 if w is None else w

    def group_watermark(self) -> int:
        """mygroupwatermark (the primary computes it; a backup repeats its primary's)."""
        if not self.is_primary:
            return self.gw
        w = self.timestamp_watermark()
        if self.backups:
            for b in self.backups:
                rep = self.reports.get(b)
                if rep is None or rep[1] != self._digest_at(rep[2]):
                    return 0
                if rep[0] < w:
                    w = rep[0]
        if w > self.gw:
            self.gw = w
            self._gw_rose = True
        return w

    def _digest_changed(self) -> None:
        self._digest = None
        if not self.is_primary:
            self.gw = 0         # learned for another set of connections: not valid now

    def digest(self) -> int:
        """Digest of the known connections and their remote views (HEARTBEAT `ack`): a
        sum of one hash per connection, so that the primary can tell what a backup's
        digest must be while it has not applied the primary's latest frees yet."""
        if self._digest is None:
            self._digest = sum(_item_hash(c) for c in self.conns.values()
                               if c.known) & DIGEST_MASK
        return self._digest

    def _digest_at(self, applied: int) -> int:
        """The primary's digest as a backup that applied `applied` frees of this view
        computes it (the connections freed since are still in its set)."""
        extra = sum(h for i, (_, h, _) in enumerate(self.freed_log)
                    if self.freed_base + i >= applied)
        return (self.digest() + extra) & DIGEST_MASK

    def _gc_sent(self, c: Connection) -> None:
        if c.send.drop_covered(c.remote_view.group_watermark):
            if not any(m.msn > c.send.remote_ack for m in c.send.sent):
                self.timers.clear(Timer.RETRANSMIT, c.cid)
            self._flush(c)

    def _keeps_old_views(self) -> bool:
        """Whether collecting the received lists keeps an old remote view's messages past
        the resume point (`ReceiveSide.drop_received`): not at a primary without backups,
        which nobody else needs them for."""
        return bool(self.backups) or not self.is_primary

    def _gc_received(self, c: Connection) -> None:
        c.recv.drop_received(self.gw if not self.is_primary else self.group_watermark(),
                             self._keeps_old_views())

    def _gc_all_received(self) -> None:
        gw = self.group_watermark()
        keep_old = self._keeps_old_views()
        emptied = []
        for c in self._holding:
            c.recv.drop_received(gw, keep_old)
            if not c.recv.received:
                emptied.append(c)
        self._holding.difference_update(emptied)

    # =================================================================== helpers ===
    def rank(self) -> int:
        if self.is_primary:
            return 1
        try:
            return 2 + self.backups.index(self.birth_id)
        except ValueError:
            return 0

    def _conn(self, cid: ConnId) -> Connection:
        c = self.conns.get(cid)
        if c is None:
            if len(self.conns) >= self.config.max_connections:
                raise BufferFull("too many connections")
            c = Connection(cid, self.config.retransmit_us, self.config.retransmit_max_us)
            # one round-trip estimate per remote group: every connection to it crosses
            # the same path and queues, and a connection with one request now and then
            # would never collect the samples to learn it alone
            rto = self._rtos.get(cid[0])
            if rto is None:
                rto = self._rtos[cid[0]] = c.send.rto
            c.send.rto = rto
            self._conn_order[cid] = len(self.conns)
            self.conns[cid] = c
            self._wm_dirty.add(c)
            if self.is_primary:
                self._arm_remote_silence(c)
        return c

    def _mark_known(self, c: Connection) -> None:
        self._wm_dirty.add(c)
        if c.mark_known():
            self._digest_changed()
            if self.is_primary and self.timers.due(Timer.KEEPALIVE, c.cid) is None:
                self._arm_keepalive(c)

    def _msg(self, c: Connection, mtype: MsgType, body: dict, *, msn: int = 0,
             ack: int | None = None) -> Message:
        self.clock += 1
        rx = c.recv.view
        trailer = b""
        if mtype != MsgType.SECOND_ACK:
            own = None
            # Order info rides on data messages only: they carry the output it protects
            # (output commit). Copying it onto every ack and keep-alive as well multiplied
            # a slow backup's backlog by the control traffic, fragments included.
            if mtype in DATA_TYPES:
                own = self.order_info.piggyback(self.pvn)
            refl, c.remote_view.to_reflect = c.remote_view.to_reflect, None
            if refl is not None and mtype != MsgType.NEW_PRIMARY_VIEW_ACK:
                refl = self._unreflected(c.remote, refl)
            sent_upto = msn if msn else (c.send.last_msn if not c.resyncing else 0)
            # sent-up-to of our other connections to the same group: an idle one then
            # does not pin the remote watermark until its next keep-alive, and our `back`
            # holds for them too. Stated on every KEEP_ALIVE (one per group and interval;
            # the answer to a solicitation and the watermark news of _after_event stand
            # for every connection) and otherwise at most once per first_ack_delay_us per
            # group: on every message, with n connections busy, each message was O(n) to
            # build, send and apply (a 1 KB reply became two datagrams at 64 connections)
            others = []
            if mtype is MsgType.KEEP_ALIVE or self._now - self._told_us.get(
                    c.remote, -self.config.first_ack_delay_us) >= self.config.first_ack_delay_us:
                listed = [x for x in self.conns.values()
                          if x.remote == c.remote and x is not c and x.known
                          and not x.resyncing]
                others = [[x.seq, int(x.role), x.send.last_msn] for x in listed]
                back = self.group_watermark()
                for x in listed:
                    if back > x.send.last_back:
                        x.send.last_back = back
                self._told_us[c.remote] = self._now
            trailer = pack_trailer(sent_upto, own, refl, others, c.recv.delivered)
            c.recv.told_delivered = c.recv.delivered
        return Message(type=mtype, src_group=self.group, dst_group=c.remote,
                       conn_seq=c.seq, role=c.role, pvn=self.pvn,
                       precedence=self.precedence, sender=self.birth_id, msn=msn,
                       ack=(rx.upto if rx else 0) if ack is None else ack,
                       back=self._back(c), ts=self.clock, body=body,
                       order_info=trailer)

    def _unreflected(self, remote: str, sec: Section) -> Section | None:
        """The part of a remote primary's section that no message of ours to its group
        has reflected yet. A reflection only feeds that group's backups (it protects
        nothing: orderinfo_log.py) and reaches all of them whichever connection carries
        it, so with many connections each chunk is reflected once, not once per
        connection (a lost one reaches them as their primary's ORDER_INFO). The answer
        to NEW_PRIMARY_VIEW is not trimmed: it is the phase-2 recovery itself."""
        sec = unreflected(sec, self._reflected.get(remote))
        if sec is not None:
            self._reflected[remote] = section_end(sec)
        return sec

    def _back(self, c: Connection) -> int:
        b = self.group_watermark()
        if b > c.send.last_back:
            c.send.last_back = b
        return b

    def _intra(self, mtype: MsgType, body: dict, *, back: int = 0, ack: int = 0,
               order_info: bytes = b"") -> Message:
        self.clock += 1
        return Message(type=mtype, src_group=self.group, dst_group=self.group,
                       conn_seq=INTRA_CONN_SEQ, role=Role.CLIENT, pvn=self.pvn,
                       precedence=self.precedence, sender=self.birth_id, ack=ack,
                       back=back, ts=self.clock, body=body, order_info=order_info)

    def _emit(self, dst_group: str, msg: Message) -> None:
        self._actions.append(Send(dst_group, msg))
        if self._hb_quiet:
            self._hb_soon()
        if dst_group != self.group:
            c = self.conns.get((msg.dst_group, msg.conn_seq, msg.role)) \
                if msg.src_group == self.group else None
            if c is not None:
                c.send.last_send_us = self._now
                if self.timers.due(Timer.KEEPALIVE, c.cid) is not None or c.known:
                    self.timers.set(Timer.KEEPALIVE, c.cid, self._now + self.config.keepalive_us)

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    # ============================================================ introspection ===
    def check(self) -> None:
        """Assert the invariants of every connection (connection.py) and the endpoint's
        own: at most window_msgs in flight per connection; a connection is THROTTLED exactly while its THROTTLE_END timer is armed;
        order info is held only at a primary with backups, below the position reached."""
        window = self.config.window_msgs
        for c in self.conns.values():
            c.check()
            # flow control: never more than a window in flight on a connection (sent,
            # not yet covered by the remote group watermark)
            assert len(c.send.sent) <= window, f"{c.cid}: {len(c.send.sent)} in flight > window"
            throttled = c.state is SendState.THROTTLED
            assert throttled == (self.timers.due(Timer.THROTTLE_END, c.cid) is not None), \
                f"{c.cid}: THROTTLED and the THROTTLE_END timer disagree"
            assert c.cid not in self.closed, f"{c.cid}: freed and still held"
        # a freed connection leaves nothing behind: no timer, no pending end
        for kind, key in self.timers.keys():
            assert key is None or key in self.conns, f"timer {kind} of a freed connection {key}"
        assert all(cid in self.conns for cid in self._ending), "an ending connection was freed"
        assert all(c in self._holding for c in self.conns.values() if c.recv.received), \
            "a received list the group watermark would not free"
        assert all(self.conns.get(c.cid) is c for c in self._holding), "freed and holding"
        self.order_info.check()

    def buffer_sizes(self) -> dict[str, int]:
        """What the endpoint holds (the simulator asserts bounds at quiescence)."""
        out = {"sent": 0, "queue": 0, "log": 0, "log_bytes": 0, "received": 0,
               "placeholders": 0,
               "ahead": 0, "order_info": len(self.order_info.log),
               "order_info_pending": len(self.order_info.pending)}
        for c in self.conns.values():
            out["sent"] += len(c.send.sent)
            out["queue"] += len(c.send.queue)
            out["log"] += len(c.send.log)
            out["log_bytes"] += c.send.log_bytes
            out["received"] += len(c.recv.received)
            out["ahead"] += len(c.recv.ahead)
            for rx in (c.recv.view, c.recv.old_view):
                if rx is not None:
                    out["placeholders"] += len(rx.slots)
        return out


DIGEST_MASK = 0x7FFFFFFF
CLOSED_ANSWERS_KEPT = 256
FREES_PER_HEARTBEAT = 256
# cuts announced per HEARTBEAT (`_waiting_cuts`): the rest go once these are freed
CUTS_PER_HEARTBEAT = 64
MAX_PROBED_BY = 64                  # remote groups whose primaries and probes we track
_RX_COUNTERS = {t: "rx_" + t.name for t in MsgType}   # (an Enum's .name is Python code)
MAX_HEARD = 4096                    # remote groups whose last message we remember


def _remember(memory: dict, key, value, limit: int) -> None:
    """Store `value` as the newest entry of `memory` (insertion order is recency) and
    forget the oldest beyond `limit`."""
    memory.pop(key, None)
    memory[key] = value
    while len(memory) > limit:
        del memory[next(iter(memory))]


def probe_answer(heard: tuple[int, int, int, int] | None, since_us: int, now_us: int,
                 quiet_us: int = 0, size: int = 0) -> dict:
    """A PROBE's answer body: what we last heard of the asking group's primary (never:
    primary 0, and `ago` how long we have been listening), whether we hear a majority
    of our own group (`quiet_us` ago, of a view of `size`), and how long we have been
    listening (`listen`)."""
    pvn, birth, at = heard[:3] if heard is not None else (0, 0, since_us)
    return {"answer": 1, "pvn": pvn, "primary": birth, "ago": max(0, now_us - at),
            "quiet": quiet_us, "size": size, "listen": max(0, now_us - since_us)}


def _pack_conn_values(pairs: Iterable[tuple[ConnId, int]]) -> list[list]:
    """(connection, number) pairs as a HEARTBEAT's frees carry them (cuts, reaches)."""
    return [[g, seq, int(role), n] for (g, seq, role), n in pairs]


def _unpack_conn_values(entries: Iterable) -> dict[ConnId, int]:
    """The inverse of `_pack_conn_values` (raises ValueError/TypeError on a bad entry)."""
    return {(g, int(seq), Role(role)): int(n) for g, seq, role, n in entries}


def _item_hash(c: Connection) -> int:
    return zlib.crc32(repr((c.remote, c.seq, int(c.role),
                            c.recv.view.pvn if c.recv.view else -1)).encode())


# Primary and backup duties, as data: method names (looked up at call time), by
# (message type, am_primary). A message not listed is not that role's business (for
# inter-group messages the common part -- remote view, acks, trailer -- runs anyway).
_INTER_GROUP_HANDLERS: dict[tuple[MsgType, bool], str] = {
    (MsgType.REQUEST, True): "_on_data_at_primary",
    (MsgType.REQUEST, False): "_on_data",
    (MsgType.REPLY, True): "_on_data_at_primary",
    (MsgType.REPLY, False): "_on_data",
    (MsgType.FIRST_ACK, True): "_on_first_ack",
    (MsgType.FIRST_ACK, False): "_on_first_ack",
    (MsgType.SECOND_ACK, True): "_on_second_ack_at_primary",
    (MsgType.SECOND_ACK, False): "_on_second_ack_at_backup",
    (MsgType.KEEP_ALIVE, True): "_on_keepalive",
    (MsgType.KEEP_ALIVE, False): "_on_keepalive",
    (MsgType.NACK, True): "_on_remote_nack",
    (MsgType.NEW_PRIMARY_VIEW, True): "_answer_npv",
    (MsgType.NEW_PRIMARY_VIEW_ACK, True): "_on_npv_ack",
    (MsgType.CLOSED, True): "_on_closed",
}
_INTRA_GROUP_HANDLERS: dict[tuple[MsgType, bool], str] = {
    (MsgType.HEARTBEAT, True): "_on_backup_heartbeat",
    (MsgType.NACK, True): "_on_local_nack",
    (MsgType.ORDER_INFO, True): "_on_order_info_ack",
    (MsgType.JOINER_OI_ACK, True): "_on_joiner_oi_ack",
    (MsgType.HEARTBEAT, False): "_on_primary_heartbeat",
    (MsgType.ORDER_INFO, False): "_on_order_info",
}

# What fires when a timer is due: method names (looked up at call time).
_ENDPOINT_TIMER_HANDLERS = {
    Timer.HEARTBEAT: "_heartbeat_due",
    Timer.WATERMARK_REPORT: "_watermark_report_due",
    Timer.ORDER_INFO_INTRA: "_order_info_intra",
    Timer.ORDER_INFO_ACK: "_order_info_ack_due",
    Timer.PROBE_ANSWER: "_probe_answer_due",
}
_CONNECTION_TIMER_HANDLERS = {
    Timer.THROTTLE_END: "_throttle_end_due",
    Timer.NEW_PRIMARY_VIEW: "_send_npv",
    Timer.RETRANSMIT: "_retransmit",
    Timer.NACK: "_nack",                # its local entries are batched by handle_timer
    Timer.FIRST_ACK: "_first_ack",
    Timer.KEEPALIVE: "_keepalive",
    Timer.SOLICIT: "_solicit_due",
    Timer.REMOTE_SILENCE: "_remote_silence_due",
}
_TIMER_RANK = {t: i for i, t in enumerate(Timer)}     # endpoint timers first (timers.py)
assert set(_ENDPOINT_TIMER_HANDLERS) == set(ENDPOINT_TIMERS)
assert set(_CONNECTION_TIMER_HANDLERS) == set(CONNECTION_TIMERS)
