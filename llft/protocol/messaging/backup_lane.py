"""The backups' steady lane: rules 1, 2, 3 and 5 of docs/BACKUP_LANE.md ("a steady
REQUEST", "a gw rise", "the report when a timer is due", "the app's output"), their
messaging half, as an executable model checked in lockstep against the core.

A backup delivers remote data in batches, one per HEARTBEAT of its primary: the
heartbeat's `back` (the primary's group watermark, for the set of connections its `ack`
digests) raises our `gw`, which collects the received lists and releases the held
messages it covers. Between two heartbeats the remote primaries' data messages arrive:
each is received (placeholders and nacks for a gap, the contiguous ones to the received
and held lists), its trailer read (the remote's `delivered`, its own order info, the
reflection of our primary's, the declarations of its other connections). One loan serves
both: `MessagingEndpoint.lend_backup()` hands what the two paths touch to a `BackupLane`
when the backup is in the steady state where they are simple (every connection in one
current remote view, or none yet with nothing held or received; its held messages of
that view and contiguous from `delivered`; nothing ahead, beyond or of an old view; no
cut asked, no frees carried; not in phase 2), and it stays lent across data messages,
heartbeats (repeated ones too: the owner hands `heard_again` over as the
`handle_message` it is), the remote primaries' KEEP_ALIVEs, FIRST_ACKs and NACKs, the
remote backups' SECOND_ACKs, the other backups' messages and its own timers until an
event the lane refuses, a timer of the core (our HEARTBEAT) or another call on the
core.

The lane takes only the steady form of each event; the comments name the core's code:
  * rule 2, a HEARTBEAT of our group's current primary, of our view, with no frees
    (empty order info) and our digest in `ack` (`_handle_intra` ->
    `_on_primary_heartbeat`): the clock merge, the counter, `last_heard_us`, the gw
    rise, the received lists' collection, one `Deliver` (and `Closed` at a stream end)
    per released message in connection order, `_after_event`'s WATERMARK_REPORT;
  * rule 1, a REQUEST or REPLY of the current remote view on a known connection, with
    no flag and some bytes, the stream's end not known (`_handle_inter` -> `_on_data`
    -> `_rx_data`, `_on_trailer`, `_after_event`): a duplicate (counted), or a message
    within the window but not msn 1, whose `_advance` takes only messages that continue
    the held bytes without flags; a trailer whose reflection, if of our view, continues
    the order info delivered (nothing pending). It does the clock merge, `heard` and
    `primary_heard` (in the order `_remember` keeps), the FIRST_ACK count, the remote
    watermark, the remote's `delivered` and `_trim_log`, the receive sequence (upto,
    recv_ts, first_offset, slots and nacks, the NACK timer), the received and held
    lists, `max_data_ts`, a release if gw already covers a held message, `_declared` of
    the connections in `others`, the remote's own order info kept, one
    `DeliverOrderInfo` per chunk of the reflection (ORDER_INFO_ACK armed), and the
    WATERMARK_REPORT;
  * a KEEP_ALIVE, FIRST_ACK or NACK of the current remote view on a known connection,
    with such a trailer (`_handle_inter` -> `_on_keepalive` / `_on_first_ack` / none,
    `_on_trailer`): as a data message's common part, then its FIRST_ACK count or
    reset, the SECOND_ACK a FIRST_ACK is owed (its `_emit` moves the connection's
    KEEPALIVE), and the trailer, whose own sent-up-to is `_declared` too;
  * another backup's HEARTBEAT, ORDER_INFO report or local NACK (`_handle_intra`:
    `last_heard_us`, `_note_peer_ack`); our primary's direct ORDER_INFO of our view
    (`_on_order_info`: its section accepted, the report at once);
  * a remote backup's SECOND_ACK on a known connection with a remote view
    (`_on_second_ack_at_backup`): `heard`, and the gap up to its ack (`_expect`);
  * rule 3, the loan's timers when none of the core's is due (`handle_timer`): our own
    HEARTBEAT (`_heartbeat_due`: its body read from constants of the loan and
    membership's hooks, a quiet one repeated), WATERMARK_REPORT and ORDER_INFO_ACK send
    the report (`_order_info_ack`), NACK the local NACK of the gaps (`_nack`),
    KEEPALIVE (a primary's) is cleared;
  * rule 5, the app's output on a lent, known connection whose stream goes on (`send`
    at a backup: `log_segment` per max_payload_bytes, `_trim_log`), and `send_space`.
Anything else returns False with nothing changed: the owner (`LanedEndpoint`) takes the
loan back (`MessagingEndpoint.reclaim_backup`) and the core handles the event.

The timestamp watermark is no longer a constant of the loan (data messages and
declarations raise recv_ts), but it stays simple: the lend conditions hold after every
event the lane takes (a data message joins the held list only where it continues it;
nothing goes ahead, beyond or to an old view; a connection with no remote view is not
touched), so every known connection's term is its current view's recv_ts (the held list
is contiguous from `delivered`, nothing ahead: no gap; no old view or old ts), or with
no view yet the ts of our first message (a client's) or 0. The lane keeps each term
(`HeldConn.term`) and `_after_event` takes their minimum, as `timestamp_watermark()`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llft.protocol.messages import (DATA_TYPES, ROLES, Message, MsgType, Pulse, Role, Send,
                                    pulse_lease_us, pulse_until_us)
from llft.protocol.messaging.actions import Closed, Deliver, DeliverOrderInfo
from llft.protocol.messaging.config import INTRA_CONN_SEQ
from llft.protocol.messaging.lane import LaneBase
from llft.protocol.messaging.rules import news_of_primary
from llft.protocol.messaging.timers import Timer
from llft.protocol.messaging.trailer import section_end, unpack_trailer

# the endpoint timers a backup loan carries (out of the core's registry while lent)
BACKUP_LANE_TIMERS = (Timer.HEARTBEAT, Timer.WATERMARK_REPORT, Timer.ORDER_INFO_ACK)
_RANK = {t: i for i, t in enumerate(Timer)}      # the core's firing order (_TIMER_RANK)
# what the lane takes from a remote primary besides data, and from the other backups
REMOTE_CONTROL = frozenset({MsgType.KEEP_ALIVE, MsgType.FIRST_ACK, MsgType.NACK})
PEER_TYPES = frozenset({MsgType.HEARTBEAT, MsgType.ORDER_INFO, MsgType.NACK})
# ... and per lent connection (KEEPALIVE: a SECOND_ACK's `_emit` arms it at a backup too)
BACKUP_LANE_CONN_TIMERS = (Timer.NACK, Timer.KEEPALIVE)


@dataclass(slots=True)
class HeldConn:
    """One connection's part of a backup loan: the receive state a gw rise and a data
    message touch (the core's fields of the same names)."""
    cid: tuple
    holding: bool               # in the endpoint's `_holding` set
    delivered: int
    covered: int
    end: int | None             # the remote stream's end marker (recv.end), and
    abort: bool                 # whether it is a reset (constant while lent)
    held: list[Message]         # of the current remote view, contiguous from `delivered`
    received: list[Message]     # none of an older remote view
    known: bool                 # (constant: a data message on an unknown one is refused)
    term: int                   # its timestamp watermark term (its view's recv_ts)
    view_pvn: int | None        # recv.view.pvn (None: no remote view yet)
    upto: int                   # recv.view's upto, ts and first_offset
    ts: int
    first_offset: int | None
    slots: dict                 # recv.view's slots (msn -> message, None: a placeholder)
    nacks: set                  # and nacks
    declared: tuple[int, int]   # recv.declared
    max_data_ts: int            # recv.max_data_ts
    sending: bool               # send.sent not empty (a backup's is: constant)
    fa_count: int               # send's
    ka_idle: int
    log: list                   # send.log: (msn, offset, data), and its bytes
    log_bytes: int
    remote_gw: int              # remote_view's group_watermark, delivered and
    remote_delivered: int       # last_order_info
    last_order_info: list | None
    # what KEEP_ALIVE, FIRST_ACK and SECOND_ACK touch
    after_change: bool          # recv.view's (constant: set by a new remote view)
    resyncing: bool             # (constant: a backup never resyncs; refused if it does)
    throttled: bool             # send.state is THROTTLED (constant: refused if so)
    out_offset: int             # send.out_offset and next_msn (the app's output, logged;
    next_msn: int               # send.last_msn is next_msn - 1)
    send_ended: bool            # send.end set or peer_done (constant: a send is refused)
    fa_msn: int                 # send's
    last_back: int
    last_send_us: int


@dataclass(slots=True)
class BackupLoan:
    """A steady backup's state for rules 1 and 2 (the core's fields of the same names)."""
    group: str
    birth_id: int
    pvn: int
    precedence: int
    primary_id: int
    clock: int
    now: int
    gw: int
    digest: int                 # constant while lent (the set of connections is)
    max_data_ts: int
    reported_w: int
    has_backups: bool
    last_heard: dict[int, int]  # last_heard_us set while lent (our group's members)
    backups: frozenset          # (constant: set_view reclaims)
    peer_oi_acks: dict          # the other backups' order-info acks (`_note_peer_ack`)
    conns: list[HeldConn]       # in the endpoint's connection order
    by_cid: dict[tuple, HeldConn]
    timers: dict                # BACKUP_LANE_TIMERS' deadlines, and (Timer.NACK, cid)'s
    hb_quiet: bool              # _hb_quiet (any message but a HEARTBEAT ends it)
    heard: dict[str, int]       # heard[remote] set while lent, in the order set
    primary_heard: dict[str, tuple]      # of the lent connections' remote groups
    primary_heard_set: dict[str, tuple]  # ... set while lent, in the order set
    oi_delivered: int           # order_info.delivered
    oi_pending: bool            # order_info.pending (constant: refused if it would change)
    oi_acked: int               # order_info.acked and done_acked (the report sets them)
    oi_done_acked: int
    oi_executed: int            # order_info.executed (set_executed: rule 6)
    watermark_report_us: int
    order_info_ack_us: int
    max_order_info_pending: int
    window_bytes: int           # window_msgs * max_payload_bytes (_trim_log)
    max_placeholders: int
    nack_delay_us: int
    nack_retry_us: int
    max_nack_msns: int
    keepalive_us: int
    heartbeat_us: int
    direct_ack_us: int          # order_info_direct_ack_us (not 0: refused)
    max_log_bytes: int          # (send_space at a backup)
    max_payload_bytes: int      # (a logged segment's size)
    # what our own HEARTBEAT says (`_heartbeat` at a backup; constant while lent but
    # the membership hooks, called when it fires) and the last one sent (`_last_hb`)
    rank: int
    lineage: int
    change: int
    hooks: tuple                # (wait_of, replay_of, rm_of): membership's, read then
    frees: bytes                # `_heartbeat_frees` (no cut asked, nothing carried)
    last_hb: Message | None
    pulse_intervals: int
    stats: dict[str, int] = field(default_factory=dict)    # counted while lent


class BackupLane(LaneBase):
    """Rules 1, 2, 3 and 5 over a `BackupLoan`; the comments name the core's functions."""

    cid = None                  # (no connection of its own: sends go to the core)
    reclaim_with = "reclaim_backup"     # the endpoint's method that takes a loan back
    # What a replica node reads of its core after every event (ReplicaNode._settle's
    # `served`, ...), answered from the loan: a read that took the loan back would end
    # every loan at its first event. A backup is not primary and not served while lent
    # (membership's set_view takes the loan back first).
    READS = frozenset({"served", "is_primary", "pvn"})

    def read(self, name: str):
        return self.loan.pvn if name == "pvn" else False

    @staticmethod
    def candidate(endpoint, msg: Message) -> bool:
        """Worth lending for (cheap, before any loan: a loan the lane would refuse at
        once costs a copy of the core when checked in lockstep): the steady HEARTBEAT
        `handle_message` takes at a backup, a data message of the current remote view
        on a known connection, within the window, a KEEP_ALIVE or FIRST_ACK of that
        view, or a SECOND_ACK on a known connection with a remote view."""
        if endpoint.is_primary:
            return False
        t = msg.type
        if msg.src_group == endpoint.group and msg.sender != endpoint.primary_id:
            return (t in PEER_TYPES and msg.dst_group == endpoint.group
                    and msg.sender != endpoint.birth_id)
        if t is MsgType.ORDER_INFO:
            return (msg.src_group == endpoint.group and msg.dst_group == endpoint.group
                    and msg.sender == endpoint.primary_id and msg.pvn == endpoint.pvn
                    and not endpoint.config.order_info_direct_ack_us)
        if t is MsgType.HEARTBEAT:
            return (msg.src_group == endpoint.group and msg.dst_group == endpoint.group
                    and msg.sender == endpoint.primary_id and msg.pvn == endpoint.pvn
                    and not msg.order_info and msg.ack == endpoint.digest())
        if msg.dst_group != endpoint.group or msg.src_group == endpoint.group:
            return False
        c = endpoint.conns.get((msg.src_group, msg.conn_seq, ROLES[1 - msg.role]))
        rx = None if c is None else c.recv.view
        if rx is None or not c.known:
            return False
        if t is MsgType.SECOND_ACK:
            return not msg.order_info
        if msg.pvn != rx.pvn or c.send.sent:
            return False
        if t in REMOTE_CONTROL:
            return True
        if t not in DATA_TYPES or msg.body["flags"] or not msg.body["data"]:
            return False
        return c.recv.end is None and (
            msg.msn <= rx.upto
            or 1 < msg.msn <= rx.upto + endpoint.config.max_placeholders)

    def timer_deadlines(self, core) -> dict:
        """The same timers' deadlines in a core (the lockstep check)."""
        out = {}
        for k in BACKUP_LANE_TIMERS:
            d = core.timers.due(k)
            if d is not None:
                out[k] = d
        for hc in self.loan.conns:
            for k in BACKUP_LANE_CONN_TIMERS:
                d = core.timers.due(k, hc.cid)
                if d is not None:
                    out[k, hc.cid] = d
        return out

    def send_space(self, conn) -> int | None:
        """`send_space` at a backup: what the connection's log still takes; None: not a
        lent connection (the core answers)."""
        hc = self.loan.by_cid.get(conn)
        return None if hc is None else max(0, self.loan.max_log_bytes - hc.log_bytes)

    def send(self, conn, data: bytes, now_us: int | None) -> int | None:
        """Rule 5's messaging half (`send` at a backup): the app's output logged as the
        messages its primary sends (`log_segment`, a segment per max_payload_bytes), as
        much as send_space allows, then `_trim_log`. Returns the bytes taken; None: not
        a lent connection, not known yet (`_mark_known` changes the digest: constant
        while lent), or its stream ended (the core discards)."""
        s = self.loan
        hc = s.by_cid.get(conn)
        if hc is None or not hc.known or hc.send_ended:
            return None
        if now_us is not None:
            s.now = max(s.now, now_us)
        n = min(len(data), max(0, s.max_log_bytes - hc.log_bytes))
        step = s.max_payload_bytes
        for i in range(0, n, step):
            seg = bytes(data[i:min(n, i + step)])
            hc.log.append((hc.next_msn, hc.out_offset, seg))
            hc.log_bytes += len(seg)
            hc.next_msn += 1
            hc.out_offset += len(seg)
        if n:
            self._trim_log(hc)
        return n

    def handle_message(self, msg: Message, now_us: int) -> bool:
        """The primary's steady HEARTBEAT (rule 2) or direct ORDER_INFO, a remote
        primary's steady data message (rule 1), KEEP_ALIVE, FIRST_ACK or NACK, a remote
        backup's SECOND_ACK, another backup's message (module docstring); else False:
        nothing changed."""
        if msg.src_group == self.loan.group and msg.sender != self.loan.primary_id:
            return self._peer(msg, now_us)
        if msg.type is MsgType.ORDER_INFO:
            return self._order_info(msg, now_us)
        if msg.type is MsgType.HEARTBEAT:
            return self._heartbeat(msg, now_us)
        if msg.type in DATA_TYPES:
            return self._data(msg, now_us)
        if msg.type in REMOTE_CONTROL:
            return self._control(msg, now_us)
        if msg.type is MsgType.SECOND_ACK:
            return self._second_ack(msg, now_us)
        return False

    def set_executed(self, pos: int, now_us: int | None) -> bool:
        """Rule 6's messaging half (`MessagingEndpoint.set_executed`): the app executed
        this view's order info up to `pos`; the report goes within order_info_ack_us."""
        s = self.loan
        if now_us is not None:
            s.now = max(s.now, now_us)
        s.oi_executed = max(s.oi_executed, min(pos, s.oi_delivered))
        if s.oi_executed != s.oi_done_acked and Timer.ORDER_INFO_ACK not in s.timers:
            s.timers[Timer.ORDER_INFO_ACK] = s.now + s.order_info_ack_us    # (Timers.arm)
        return True

    def handle_timer(self, now_us: int, core_next_us: int | None) -> bool:
        """Rule 3 (`handle_timer` at a backup) when only the loan's timers are due (the
        core's own next deadline is `core_next_us`): our HEARTBEAT (`_heartbeat_due`),
        WATERMARK_REPORT and ORDER_INFO_ACK send the report (`_order_info_ack`), NACK the
        local NACK of the view's gaps (`_nack`), a KEEPALIVE (a primary's) is cleared;
        then `_after_event`. Else False (a timer of the core due)."""
        s = self.loan
        now = max(s.now, now_us)
        if core_next_us is not None and core_next_us <= now:
            return False
        t = s.timers
        order = {hc.cid: i for i, hc in enumerate(s.conns)}
        due = sorted((k for k, d in t.items() if d <= now),
                     key=lambda k: (-1, _RANK[k]) if isinstance(k, Timer)
                     else (order[k[1]], _RANK[k[0]]))
        if not due:
            return False
        s.now = now
        local_nacks: list[list] = []
        for k in due:
            d = t.get(k)
            if d is None or d > now:
                continue                # (an earlier handler cleared or moved it)
            if k is Timer.HEARTBEAT:
                self._heartbeat_due()
            elif k is Timer.WATERMARK_REPORT:
                del t[k]                # _watermark_report_due
                if self._ts_w() > s.reported_w or s.oi_acked != s.oi_delivered:
                    self._order_info_ack()
            elif k is Timer.ORDER_INFO_ACK:
                self._order_info_ack()  # _order_info_ack_due
            elif k[0] is Timer.NACK:
                local_nacks.extend(self._nack(s.by_cid[k[1]]))
            else:
                del t[k]                # KEEPALIVE: a primary's timer (not_mine)
        if local_nacks:
            self._send_intra(MsgType.NACK, {"missing": local_nacks}, back=0, ack=0)
        self._after_event()
        return True

    def _heartbeat_due(self) -> None:
        """`_heartbeat_due` at a backup: `_heartbeat` (our watermark as `back`, now
        reported; the same message again when it would say what the last one said: a
        quiet one, repeated by the driver), `_after_heartbeat`, the next deadline."""
        s = self.loan
        back = s.reported_w = self._ts_w()             # _heartbeat_back
        wait_of, replay_of, rm_of = s.hooks
        body = {"rank": s.rank, "served": 0, "lineage": s.lineage, "change": s.change,
                "wait": wait_of(), "replay": replay_of(), "rm": rm_of(),
                "done": s.oi_executed}
        hb, k = s.heartbeat_us, s.pulse_intervals
        msg = s.last_hb
        quiet = (k > 1 and msg is not None and msg.pvn == s.pvn
                 and msg.precedence == s.precedence and msg.back == back
                 and msg.ack == s.digest and msg.order_info == s.frees and msg.body == body)
        if not quiet:
            s.clock += 1                                # _intra
            msg = s.last_hb = Message(
                type=MsgType.HEARTBEAT, src_group=s.group, dst_group=s.group,
                conn_seq=INTRA_CONN_SEQ, role=Role.CLIENT, pvn=s.pvn,
                precedence=s.precedence, sender=s.birth_id, ack=s.digest, back=back,
                ts=s.clock, body=body, order_info=s.frees)
        if k == 1:
            self.actions.append(Send(s.group, msg))
        else:
            self.actions.append(Pulse(s.group, msg, hb, s.now + pulse_until_us(k, hb),
                                      pulse_lease_us(hb)))
        s.timers.pop(Timer.WATERMARK_REPORT, None)     # _after_heartbeat
        if s.oi_acked != s.oi_delivered and Timer.ORDER_INFO_ACK not in s.timers:
            s.timers[Timer.ORDER_INFO_ACK] = s.now + s.order_info_ack_us
        s.hb_quiet = quiet
        if s.has_backups:
            s.timers[Timer.HEARTBEAT] = s.now + (hb * k if quiet else hb)
        else:
            s.timers.pop(Timer.HEARTBEAT, None)

    def _order_info_ack(self) -> None:
        """`_order_info_ack`: the report to our primary (order info delivered and
        executed, our timestamp watermark in `back`, our digest in `ack`)."""
        s = self.loan
        s.oi_acked = s.oi_delivered
        s.oi_done_acked = s.oi_executed
        s.reported_w = self._ts_w()
        s.timers.pop(Timer.ORDER_INFO_ACK, None)
        s.timers.pop(Timer.WATERMARK_REPORT, None)
        self._send_intra(MsgType.ORDER_INFO,
                         {"upto": s.oi_delivered, "done": s.oi_executed},
                         back=s.reported_w, ack=s.digest)

    def _hb_soon(self) -> None:
        """`_hb_soon` if our heartbeat is quiet (`handle_message` of anything but a
        HEARTBEAT, `_emit`): the next one an interval from now, if that is earlier."""
        s = self.loan
        if s.hb_quiet:
            s.hb_quiet = False
            due = s.now + s.heartbeat_us
            d = s.timers.get(Timer.HEARTBEAT)
            if d is None or due < d:                    # (Timers.arm_earlier)
                s.timers[Timer.HEARTBEAT] = due

    def _nack(self, hc: HeldConn) -> list[list]:
        """`_nack` at a backup of a lent connection (no old view, nothing ahead, the
        held list contiguous: no gap by offset): its view's nacks, as a local entry."""
        s = self.loan
        if hc.view_pvn is None or not hc.nacks:
            del s.timers[Timer.NACK, hc.cid]
            return []
        s.timers[Timer.NACK, hc.cid] = s.now + s.nack_retry_us
        missing = sorted(hc.nacks)[:s.max_nack_msns]
        self._count("nack_msns", len(missing))
        remote, seq, role = hc.cid
        return [[remote, seq, int(role), hc.view_pvn, *missing]]

    def _send_intra(self, mtype: MsgType, body: dict, back: int, ack: int) -> None:
        """`_intra` (the clock ticks for its message) and `_emit` to our group (which
        ends a quiet heartbeat)."""
        s = self.loan
        s.clock += 1
        self.actions.append(Send(s.group, Message(
            type=mtype, src_group=s.group, dst_group=s.group, conn_seq=INTRA_CONN_SEQ,
            role=Role.CLIENT, pvn=s.pvn, precedence=s.precedence, sender=s.birth_id,
            ack=ack, back=back, ts=s.clock, body=body, order_info=b"")))
        self._hb_soon()

    def _heartbeat(self, msg: Message, now_us: int) -> bool:
        """Rule 2: the primary's HEARTBEAT of our view, no frees, our digest."""
        s = self.loan
        if (msg.src_group != s.group or msg.dst_group != s.group
                or msg.sender == s.birth_id or msg.sender != s.primary_id
                or msg.pvn != s.pvn or msg.order_info or msg.ack != s.digest):
            return False
        self._from_group(msg, now_us)      # (a HEARTBEAT does not end a quiet spell)
        # _on_primary_heartbeat: no frees (cuts_asked = {}: empty at lend), our digest
        # (carry = []: empty at lend)
        if msg.back > s.gw:
            s.gw = msg.back
            self._gc_all_received()
            self._release_all_held()
        self._after_event()
        # _reap: nothing at a backup
        return True

    def _data(self, msg: Message, now_us: int) -> bool:
        """Rule 1: a data message (REQUEST or REPLY) of the current remote primary view
        on a known connection, no flag, not empty, the stream's end not known, no sent
        list (a backup's is empty): a duplicate (counted), or
        one within the window (not msn 1), which fills or leaves a gap (placeholders,
        nacks, NACK armed) -- the messages it makes contiguous continue the held bytes,
        without flags; and a trailer whose `others` have no sent list and whose
        reflection, if of our view, continues the order info delivered. What
        `handle_message` -> `_handle_inter` -> `_on_data` -> `_rx_data` (-> `_expect`,
        `_advance` -> `_release_held`, `_gc_received`), `_on_trailer` (-> `_declared`,
        `_oi_accept`) -> `_after_event` do for it."""
        hc = self._remote_conn(msg)
        body = msg.body
        if hc is None or hc.end is not None or body["flags"] or not body["data"]:
            return False
        m = msg.msn
        dup = m <= hc.upto or hc.slots.get(m) is not None
        if not dup:
            if m == 1 or m > hc.upto + self.loan.max_placeholders:
                return False        # (msn 1 sets the resume point; beyond: counted)
            take = self._contiguous(hc, msg)
            if take is None:
                return False
        trailer = self._steady_trailer(msg)
        if trailer is False:
            return False
        self._from_remote_primary(hc, msg, now_us, trailer)
        if dup:
            self._count("dup_data")             # _rx_data (a backup: no ack to send)
        else:
            self._rx_data(hc, msg, take)
        self._on_trailer(hc, msg, trailer, data=True)
        self._after_event()
        return True

    def _control(self, msg: Message, now_us: int) -> bool:
        """A KEEP_ALIVE, FIRST_ACK or NACK of the current remote primary view on a known
        connection (no sent list, not throttled, not resyncing), with a steady trailer
        (as a data message's): the common part of `_handle_inter`, `_on_keepalive` or
        `_on_first_ack` (its SECOND_ACK if our app produced the acked bytes; a NACK has
        no handler at a backup), then `_on_trailer`, whose own sent-up-to `_declared` (a
        control message's) may raise recv_ts or open a gap (placeholders, NACK)."""
        hc = self._remote_conn(msg)
        if hc is None or hc.throttled or hc.resyncing:
            return False
        trailer = self._steady_trailer(msg)
        if trailer is False:
            return False
        self._from_remote_primary(hc, msg, now_us, trailer)
        if msg.type is MsgType.KEEP_ALIVE:
            hc.fa_count = 0                     # _on_keepalive (STREAMING)
        elif msg.type is MsgType.FIRST_ACK:
            self._on_first_ack(hc, msg)
        self._on_trailer(hc, msg, trailer, data=False)
        self._after_event()
        return True

    def _second_ack(self, msg: Message, now_us: int) -> bool:
        """A remote backup's SECOND_ACK (not a primary's message: no remote view, ack,
        watermark or trailer is taken from it) on a known connection with a remote
        view: `handle_message`'s common part (`heard` only) and
        `_on_second_ack_at_backup` (a gap up to its ack, unless it is of another view
        or the view follows a change of primary)."""
        hc = self._known_conn(msg)
        if hc is None or hc.view_pvn is None or msg.order_info:
            return False
        self._heard(msg, now_us, primary=False)
        if msg.pvn == hc.view_pvn and not hc.after_change:
            self._expect(hc, msg.ack)
        self._after_event()
        return True

    def _order_info(self, msg: Message, now_us: int) -> bool:
        """Our primary's direct ORDER_INFO of our view (`_handle_intra` ->
        `_on_order_info`): its section of our view accepted if it continues what was
        delivered (nothing pending), then the report at once (order_info_direct_ack_us
        0, the default; an ack delayed by it is refused: no schedule exercises it)."""
        s = self.loan
        if (msg.src_group != s.group or msg.dst_group != s.group
                or msg.sender == s.birth_id or msg.sender != s.primary_id
                or msg.pvn != s.pvn or s.direct_ack_us):
            return False
        tr = unpack_trailer(msg.order_info)
        sec = None if tr is None else tr[1]
        if sec is not None and sec[0] != s.pvn:
            sec = None                  # (another view's: not ours to deliver)
        if sec is not None and (s.oi_pending or sec[1] > s.oi_delivered + 1):
            return False                # (a gap: OrderInfoLog.accept keeps it pending)
        self._from_group(msg, now_us)
        if sec is not None:
            self._oi_accept(sec[1], sec[2], "oi_via_intra")
        self._order_info_ack()
        self._after_event()
        return True

    def _peer(self, msg: Message, now_us: int) -> bool:
        """Another backup's HEARTBEAT, ORDER_INFO report or local NACK (not our
        primary's: `_handle_intra` returns after `last_heard_us` and, for an ORDER_INFO,
        `_note_peer_ack`); anything but a HEARTBEAT ends a quiet heartbeat."""
        s = self.loan
        t = msg.type
        if msg.dst_group != s.group or msg.sender == s.birth_id or t not in PEER_TYPES:
            return False
        self._from_group(msg, now_us)
        if t is MsgType.ORDER_INFO:
            self._note_peer_ack(msg)
        self._after_event()
        return True

    def _note_peer_ack(self, msg: Message) -> None:
        """`_note_peer_ack`: a backup's order-info ack, this view's and the one before."""
        s = self.loan
        upto = msg.body.get("upto") if isinstance(msg.body, dict) else None
        if not isinstance(upto, int) or msg.sender not in s.backups:
            return
        acks = s.peer_oi_acks.setdefault(msg.pvn, {})
        acks[msg.sender] = max(acks.get(msg.sender, 0), upto)
        for old in sorted(s.peer_oi_acks)[:-2]:
            del s.peer_oi_acks[old]

    def _known_conn(self, msg: Message) -> HeldConn | None:
        """The lent, known connection of a remote group's message to us; else None."""
        s = self.loan
        if (msg.dst_group != s.group or msg.src_group == s.group
                or msg.sender == s.birth_id):
            return None
        hc = s.by_cid.get((msg.src_group, msg.conn_seq, ROLES[1 - msg.role]))
        return hc if hc is not None and hc.known else None

    def _remote_conn(self, msg: Message) -> HeldConn | None:
        """`_known_conn` of a remote primary's message of its current view, with no
        sent list (a backup's is empty); else None."""
        hc = self._known_conn(msg)
        if hc is None or hc.view_pvn != msg.pvn or hc.sending:
            return None
        return hc

    def _steady_trailer(self, msg: Message):
        """The trailer (None: none), or False if the lane does not take it: a connection
        in `others` with a sent list, or a reflection of our view with a gap or with
        order info pending."""
        s = self.loan
        trailer = unpack_trailer(msg.order_info)
        if trailer is None:
            return None
        _, _, refl, others, _ = trailer
        for seq, role, _ in others:
            c2 = s.by_cid.get((msg.src_group, seq, ROLES[1 - role]))
            if c2 is not None and c2.sending:
                return False        # (_gc_sent: a sent list at a backup)
        if refl is not None and refl[0] == s.pvn and (
                s.oi_pending or refl[1] > s.oi_delivered + 1):
            return False            # (a gap: OrderInfoLog.accept keeps it pending)
        return trailer

    def _heard(self, msg: Message, now_us: int, primary: bool) -> None:
        """`handle_message`'s common part: time, clock merge, counter, `heard` and (a
        primary's message) `primary_heard`, in the order `_remember` keeps."""
        s = self.loan
        self._merge(msg, now_us)        # (a remote message: never a HEARTBEAT)
        now = s.now
        remote = msg.src_group
        s.heard.pop(remote, None)               # _remember: the newest last
        s.heard[remote] = now
        if primary:
            if news_of_primary(s.primary_heard.get(remote), msg.pvn, msg.sender, msg.ts):
                ph = s.primary_heard[remote] = (msg.pvn, msg.sender, min(now_us, now),
                                                msg.ts)         # (when it came)
                s.primary_heard_set.pop(remote, None)
                s.primary_heard_set[remote] = ph

    def _merge(self, msg: Message, now_us: int) -> None:
        """`handle_message`'s first part, for every message: time, clock merge, counter;
        anything but a HEARTBEAT ends a quiet heartbeat (`_hb_soon`)."""
        s = self.loan
        if now_us > s.now:
            s.now = now_us
        if msg.ts > s.clock:
            s.clock = msg.ts
        self._count("rx_" + msg.type.name)
        if msg.type is not MsgType.HEARTBEAT:
            self._hb_soon()

    def _from_group(self, msg: Message, now_us: int) -> None:
        """A message of our own group: `_merge`, then `_handle_intra`'s `last_heard_us`."""
        self._merge(msg, now_us)
        self.loan.last_heard[msg.sender] = self.loan.now

    def _from_remote_primary(self, hc: HeldConn, msg: Message, now_us: int,
                             trailer) -> None:
        """`_heard`, then `_handle_inter`'s part for every message of the remote
        primary's current view on a known connection: `_on_remote_ack` at a backup,
        the remote group watermark (`_gc_sent`: nothing sent at a backup), the remote's
        `delivered` (`_trim_log`)."""
        self._heard(msg, now_us, primary=True)
        if msg.type is not MsgType.FIRST_ACK and msg.ack != hc.next_msn - 1:
            hc.fa_count = 0
        if msg.back > hc.remote_gw:
            hc.remote_gw = msg.back
        delivered = None if trailer is None else trailer[4]
        if delivered is not None and delivered > hc.remote_delivered:
            hc.remote_delivered = delivered
            self._trim_log(hc)

    def _on_trailer(self, hc: HeldConn, msg: Message, trailer, data: bool) -> None:
        """`_on_trailer` of a remote primary's message of its current view (a backup):
        `_declared` of its own sent-up-to (not a data message's), of the connections in
        `others` (and their remote watermark), its own order info kept, the reflection
        of our view accepted."""
        if trailer is None:
            return
        s = self.loan
        sent_upto, own, refl, others, _ = trailer
        ts = msg.ts
        if not data:
            self._declared(hc, sent_upto, ts)
        for seq, role, upto in others:
            c2 = s.by_cid.get((msg.src_group, seq, ROLES[1 - role]))
            if c2 is None:
                continue
            if c2.view_pvn == msg.pvn:
                self._declared(c2, upto, ts)
            if msg.back > c2.remote_gw:
                c2.remote_gw = msg.back         # (no sent list: checked before)
        if own is not None:
            last = section_end(own)             # kept at a backup too
            lr = hc.last_order_info
            if lr is None or last >= section_end(lr):
                hc.last_order_info = own
        if refl is not None and refl[0] == s.pvn:
            self._oi_accept(refl[1], refl[2])

    def _on_first_ack(self, hc: HeldConn, msg: Message) -> None:
        """`_on_first_ack` at a backup (never throttles) and the SECOND_ACK it owes when
        its group has backups and its app produced the stream up to the remote's
        `delivered`: `_msg(c, SECOND_ACK, {}, ack=...)` (no trailer; `_back`: our gw)
        and `_emit` (which moves the connection's KEEPALIVE, a primary's timer: it is
        cleared when it fires)."""
        s = self.loan
        a = msg.ack
        if a > 0 and a == hc.next_msn - 1:
            if hc.fa_msn != a:
                hc.fa_msn, hc.fa_count = a, 0
            hc.fa_count += 1
        if not (s.has_backups and a > 0 and hc.out_offset >= hc.remote_delivered):
            return
        s.clock += 1
        back = s.gw                                 # _back: group_watermark() is gw
        if back > hc.last_back:
            hc.last_back = back
        remote, seq, role = hc.cid
        self.actions.append(Send(remote, Message(
            type=MsgType.SECOND_ACK, src_group=s.group, dst_group=remote, conn_seq=seq,
            role=role, pvn=s.pvn, precedence=s.precedence, sender=s.birth_id, msn=0,
            ack=a, back=back, ts=s.clock, body={}, order_info=b"")))
        hc.last_send_us = s.now
        s.timers[Timer.KEEPALIVE, hc.cid] = s.now + s.keepalive_us    # (known)

    def _contiguous(self, hc: HeldConn, msg: Message) -> list[Message] | None:
        """What `take_contiguous` would take once `msg` is in its slot, or None if one
        of them does not continue the held bytes or carries a flag (not steady)."""
        held = hc.held
        reach = (held[-1].body["offset"] + len(held[-1].body["data"]) if held
                 else hc.delivered)
        out = []
        k = hc.upto + 1
        while True:
            nxt = msg if k == msg.msn else hc.slots.get(k)
            if nxt is None:
                return out
            body = nxt.body
            if body["flags"] or not body["data"] or body["offset"] != reach:
                return None
            reach += len(body["data"])
            out.append(nxt)
            k += 1

    def _rx_data(self, hc: HeldConn, msg: Message, take: list[Message]) -> None:
        """`_rx_data` of a message within the window (not msn 1) -> `_expect`,
        `_advance` (-> `_release_held`, `ReceiveSide.advance_ts`, `_gc_received`)."""
        s = self.loan
        offset = msg.body["offset"]
        if hc.first_offset is None or offset < hc.first_offset:
            hc.first_offset = offset
        hc.ka_idle = 0
        self._expect(hc, msg.msn - 1)
        hc.slots[msg.msn] = msg
        hc.nacks.discard(msg.msn)
        # _advance: take_contiguous, keep_received, held
        for nxt in take:
            del hc.slots[hc.upto + 1]
            hc.upto += 1
            ts = nxt.ts
            if ts > hc.ts:
                hc.ts = ts
            if ts > hc.max_data_ts:
                hc.max_data_ts = ts
            hc.received.append(nxt)
            hc.holding = True
            hc.held.append(nxt)
            if ts > s.max_data_ts:
                s.max_data_ts = ts
        self._release_held(hc)
        self._advance_ts(hc)
        self._gc_received(hc)

    def _expect(self, hc: HeldConn, upto: int) -> None:
        """`_expect`: `ReceiveSequence.expect` (placeholders and nacks for what we lack,
        at most max_placeholders past upto), NACK armed if any is new."""
        s = self.loan
        slots = hc.slots
        top = min(upto, hc.upto + s.max_placeholders)
        hi = max(slots) if slots else hc.upto
        if top <= hi and top <= hc.upto:
            return
        new = False
        for k in range(hc.upto + 1, top + 1):
            if k not in slots:
                slots[k] = None
                hc.nacks.add(k)
                new = True
        if new and (Timer.NACK, hc.cid) not in s.timers:       # (Timers.arm)
            s.timers[Timer.NACK, hc.cid] = s.now + s.nack_delay_us

    def _declared(self, hc: HeldConn, sent_upto: int, ts: int) -> None:
        """`_declared`: the remote primary had sent up to `sent_upto` at `ts`."""
        d_upto, d_ts = hc.declared
        if sent_upto >= d_upto or ts > d_ts:
            hc.declared = (max(sent_upto, d_upto), max(ts, d_ts))
        self._expect(hc, sent_upto)
        self._advance_ts(hc)

    @staticmethod
    def _advance_ts(hc: HeldConn) -> None:
        """`ReceiveSide.advance_ts` of the current view; its watermark term follows
        (no old view, no bytes ahead, the held ones contiguous: `_wm_term` is recv_ts)."""
        d_upto, d_ts = hc.declared
        if not hc.slots and hc.upto >= d_upto and d_ts > hc.ts:
            hc.ts = d_ts
        hc.term = hc.ts

    def _trim_log(self, hc: HeldConn) -> None:
        """`_trim_log`: what lies a window below the remote's `delivered` is covered."""
        upto = hc.remote_delivered - self.loan.window_bytes
        log = hc.log
        n = 0
        while n < len(log) and log[n][1] + len(log[n][2]) <= upto:
            hc.log_bytes -= len(log[n][2])
            n += 1
        del log[:n]

    def _oi_accept(self, first: int, chunks: list[bytes],
                   path: str = "oi_via_reflection") -> None:
        """`_oi_accept` of our view's section that continues what was delivered
        (`OrderInfoLog.accept` with nothing pending: the chunks up to
        max_order_info_pending past `delivered` go, in order)."""
        s = self.loan
        d = s.oi_delivered
        for i, ch in enumerate(chunks):
            pos = first + i
            if pos <= d:
                continue
            if pos - d > s.max_order_info_pending:
                break
            s.oi_delivered = pos
            self._count(path)
            self.actions.append(DeliverOrderInfo(pos, ch, s.pvn))
            if Timer.ORDER_INFO_ACK not in s.timers:        # (Timers.arm)
                s.timers[Timer.ORDER_INFO_ACK] = s.now + s.order_info_ack_us

    def _gc_all_received(self) -> None:
        """`_gc_all_received` at a backup (group_watermark() is gw; keep_old, but no
        received message is of an older view): `ReceiveSide.drop_received`."""
        for hc in self.loan.conns:
            if hc.holding:
                self._gc_received(hc)
                if not hc.received:
                    hc.holding = False

    def _gc_received(self, hc: HeldConn) -> None:
        """`_gc_received` at a backup: `ReceiveSide.drop_received` by gw (it leaves the
        connection in `_holding`)."""
        gw = self.loan.gw
        rx = hc.received
        n = 0
        while n < len(rx) and rx[n].ts <= gw:
            m = rx[n]
            end = m.body["offset"] + len(m.body["data"])
            if end > hc.covered:
                hc.covered = end
            n += 1
        del rx[:n]

    def _release_all_held(self) -> None:
        """`_release_all_held`."""
        for hc in self.loan.conns:
            self._release_held(hc)

    def _release_held(self, hc: HeldConn) -> None:
        """`_release_held` at a backup, current view only -> `_deliver` (in order:
        nothing ahead, beyond or ending)."""
        gw = self.loan.gw
        held = hc.held
        n = 0
        while n < len(held) and held[n].ts <= gw:
            # (the next held message starts at `delivered`: no NACK to arm)
            body = held[n].body
            self._deliver(hc, body["offset"], body["data"])
            n += 1
        del held[:n]

    def _deliver(self, hc: HeldConn, offset: int, data: bytes) -> None:
        """`_deliver` of a message starting at `delivered` (nothing ahead or beyond)."""
        end = offset + len(data)
        e = hc.end
        if e is not None and hc.delivered > e:               # recv.finished
            self._count("after_end" if end > hc.delivered else "dup_bytes")
            return
        if end <= hc.delivered:
            self._count("dup_bytes")
            return
        if e is not None and offset <= e < end:
            if e > offset:
                self.actions.append(Deliver(hc.cid, offset, data[:e - offset]))
            self.actions.append(Closed(hc.cid, e, hc.abort))
            self._count("stream_ends")
        else:
            self.actions.append(Deliver(hc.cid, offset, data))
        hc.delivered = end

    def _after_event(self) -> None:
        """`_after_event` at a backup."""
        s = self.loan
        if (Timer.WATERMARK_REPORT not in s.timers and s.has_backups
                and s.max_data_ts > s.reported_w and self._ts_w() > s.reported_w):
            s.timers[Timer.WATERMARK_REPORT] = s.now + s.watermark_report_us

    def _ts_w(self) -> int:
        """`timestamp_watermark()`: the least term of the known connections (each its
        view's recv_ts, or with no view its first ts or 0: no gap, no old view), 0 if
        none."""
        return min((hc.term for hc in self.loan.conns if hc.known), default=0)
