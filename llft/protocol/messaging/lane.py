"""Steady lanes: one established connection of a lone primary, owned outside the core.

The plan for the native data path (docs/ARCHITECTURE.md, open item 1, "The plan for item
4") is ownership transfer: while a connection is *steady* the core lends its state to an
engine that runs only the steady-state rules, and takes it back for anything else. This
module is that engine's executable model, in Python: the specification a C engine
follows, checked in lockstep against the core itself.

What a lane owns. `MessagingEndpoint.lend()` hands over its one connection when the
endpoint is a primary without backups (a gateway: no order info to carry, no backup to
wait for; its group watermark is its own timestamp watermark, the connection's recv_ts),
the connection is known, streaming, not ending, in a current remote view with nothing
missing, held, ahead or kept (`lendable`). The loan (`Loan`) is the connection's steady
state as plain fields -- what a C struct of a few hundred bytes would hold -- plus the
endpoint's few fields its messages touch (the Lamport clock, the group watermark, what
was last said and heard of the remote group) and the connection's timers.

What a lane does. Two events, each only in its steady form:
  * `send(data)`: the application's next bytes, when they all fit the window at once:
    the next data messages (REQUEST or REPLY), with the trailer the core would build
    (sent-up-to, the reflection of the remote's order info, `delivered`), sent;
  * `handle_message(msg)`: the next data message in order from the current remote
    primary view, no stream flag, with a trailer the lane understands (no `others`, no
    reflection): acks, round-trip sample, remote watermark, delivery, FIRST_ACK timer,
    the order info to reflect; and, from the same view with such a trailer, a duplicate
    data message (msn <= upto: counted, FIRST_ACK re-armed), a KEEP_ALIVE (its watermark
    news) or a FIRST_ACK (answered with the SECOND_ACK a lone primary owes), each when its
    sent-up-to is not past ours and it carries no order info of its own.
Anything else -- another message type or view, a gap, a flag, a window that would
queue, a timer coming due, any other call on the core -- returns False or goes through
the owner (`LanedEndpoint`), which takes the loan back (`MessagingEndpoint.reclaim`)
and lets the core handle the event as always. The lane's actions and state after each
event must be exactly the core's: `LanedEndpoint(shadow=True)` (the simulator's
`llft simulate messaging` runs every lone primary this way) runs a copy of the core on
the same events and raises `LaneDivergence` at the first differing action, timer or,
at each reclaim, endpoint state.
"""
from __future__ import annotations

import copy
import enum
from collections import Counter
from types import MethodType
from dataclasses import dataclass, field
from typing import Any

from llft.protocol.messages import Message, MsgType, ROLES, Role, Send
from llft.protocol.messaging.actions import Deliver
from llft.protocol.messaging.timers import CONNECTION_TIMERS, Timer
from llft.protocol.messaging.connection import RtoEstimator
from llft.protocol.messaging.rules import news_of_primary
from llft.protocol.messaging.trailer import (pack_trailer, section_end, unpack_trailer,
                                             unreflected)


class LaneDivergence(AssertionError):
    """A lane did or holds something else than the core on the same events."""


@dataclass(slots=True)
class Loan:
    """A lent connection's steady state (the core's fields of the same names)."""
    # the endpoint's
    group: str
    birth_id: int
    pvn: int
    precedence: int
    clock: int
    now: int
    gw: int
    gw_rose: bool
    max_data_ts: int
    served_pvn: int
    told_us: int | None             # _told_us[remote]
    reflected: tuple[int, int] | None   # _reflected[remote]
    heard: int | None               # heard[remote] (None: not changed)
    primary_heard: tuple[int, int, int, int] | None
    primary_heard_set: bool         # ... and it was set while lent
    # the connection's
    cid: tuple
    role: Role
    out_offset: int
    next_msn: int
    sent: list[Message]
    sent_bytes: int
    sent_at: dict[int, int]
    remote_ack: int
    rto: tuple[int | None, int, int, int]   # RtoEstimator (srtt, rttvar, backoff, rto)
    rto_bounds: tuple[int, int]             # (floor, ceiling)
    fa_count: int
    fa_msn: int
    last_send_us: int
    last_back: int
    ka_urgent: bool
    first_ts: int
    ka_idle: int
    view_pvn: int
    upto: int
    view_ts: int
    first_offset: int | None
    delivered: int
    declared: tuple[int, int]
    recv_max_data_ts: int
    fa_pending: int
    fa_tries: int
    told_delivered: int
    remote_gw: int
    remote_delivered: int
    to_reflect: list | None
    last_order_info: list | None
    timers: dict[Timer, int]        # the connection's deadlines
    # config
    first_ack_delay_us: int
    keepalive_us: int
    max_payload_bytes: int
    window_msgs: int
    max_queue_bytes: int
    stats: dict[str, int] = field(default_factory=dict)    # counted while lent


class LaneBase:
    """What every lane model has: its loan, the actions it emitted since they were last
    taken, the deadlines of the timers the loan carries (`loan.timers`) and what it
    counted (`loan.stats`)."""

    def __init__(self, loan):
        self.loan = loan
        self.actions: list[Any] = []

    def take_actions(self) -> list[Any]:
        a, self.actions = self.actions, []
        return a

    def next_timer_us(self) -> int | None:
        t = self.loan.timers
        return min(t.values()) if t else None

    def _count(self, key: str, n: int = 1) -> None:
        """Counted while lent (`loan.stats`: the core adds them at the reclaim)."""
        s = self.loan
        s.stats[key] = s.stats.get(key, 0) + n


class SteadyLane(LaneBase):
    """The steady-state rules over a `Loan` (module docstring). Every method mirrors the
    core's code path of the same event; the comments name the core's functions."""

    # What a replica node reads of its core after every event, answered from the loan
    # (backup_lane.BackupLane.READS): a lone primary whose one connection is lent (a
    # known one, not foreign) is served.
    READS = frozenset({"served", "is_primary", "pvn"})

    def __init__(self, loan: Loan):
        super().__init__(loan)
        self.cid = loan.cid

    def read(self, name: str):
        return self.loan.pvn if name == "pvn" else True

    def in_flight(self) -> int:
        """Messages sent and not covered yet (nothing is queued while lent)."""
        return len(self.loan.sent)

    # ------------------------------------------------------------------ sending ---
    def send(self, data: bytes, now_us: int | None) -> bool:
        """`MessagingEndpoint.send` of the lent connection, if every segment goes out
        at once (else False: nothing changed)."""
        s = self.loan
        n = len(data)
        step = s.max_payload_bytes
        if not n or n > s.max_queue_bytes or \
                len(s.sent) + (n + step - 1) // step > s.window_msgs:
            return False
        if now_us is not None and now_us > s.now:
            s.now = now_us
        for i in range(0, n, step):
            seg = bytes(data[i:min(n, i + step)])
            offset = s.out_offset
            s.out_offset += len(seg)
            self._send_data(offset, seg)
        return True

    def _send_data(self, offset: int, data: bytes) -> None:
        """`_flush` of one queued segment, with `_msg` and `_emit`."""
        s = self.loan
        msn = s.next_msn
        s.clock += 1
        refl, s.to_reflect = s.to_reflect, None
        if refl is not None:
            refl = self._unreflected(refl)
        if s.told_us is None or s.now - s.told_us >= s.first_ack_delay_us:
            self._group_watermark()         # (no other connection to list: `others` [])
            s.told_us = s.now
        trailer = pack_trailer(msn, None, refl, [], s.delivered)
        s.told_delivered = s.delivered
        msg = self._message(MsgType.REQUEST if s.role is Role.CLIENT else MsgType.REPLY,
                            msn, s.upto, {"offset": offset, "data": data, "flags": 0},
                            trailer)
        if not s.first_ts:
            s.first_ts = msg.ts
        s.next_msn += 1
        s.sent.append(msg)
        s.sent_at[msn] = s.now
        s.ka_idle = 0
        s.sent_bytes += len(data)
        self._emit(msg)
        t = s.timers
        if Timer.RETRANSMIT not in t:
            t[Timer.RETRANSMIT] = s.now + s.rto[3]
        s.fa_pending = 0
        t.pop(Timer.FIRST_ACK, None)
        s.fa_tries = 0

    def _unreflected(self, sec: list) -> list | None:
        """`MessagingEndpoint._unreflected`."""
        sec = unreflected(sec, self.loan.reflected)
        if sec is not None:
            self.loan.reflected = section_end(sec)
        return sec

    def _group_watermark(self) -> int:
        """`group_watermark` of a primary without backups whose one connection has
        nothing missing: the connection's recv_ts."""
        s = self.loan
        w = s.view_ts
        if w > s.gw:
            s.gw = w
            s.gw_rose = True
        return w

    # ---------------------------------------------------------------- receiving ---
    def handle_message(self, msg: Message, now_us: int) -> bool:
        """`MessagingEndpoint.handle_message` of a steady message of the current remote
        primary view (else False: nothing changed): the next data message in order, a
        duplicate data message (msn <= upto), a KEEP_ALIVE or a FIRST_ACK."""
        s = self.loan
        remote, seq, role = s.cid
        if (msg.src_group != remote or msg.dst_group != s.group
                or msg.conn_seq != seq or ROLES[1 - msg.role] is not role
                or msg.sender == s.birth_id or msg.pvn != s.view_pvn or s.upto == 0):
            return False
        t = msg.type
        if t is (MsgType.REPLY if role is Role.CLIENT else MsgType.REQUEST):
            body = msg.body
            if body["flags"]:
                return False
            if msg.msn == s.upto + 1:
                if not body["data"] or body["offset"] != s.delivered:
                    return False
                kind = _NEXT
            elif msg.msn <= s.upto:
                kind = _DUP
            else:
                return False
        elif t is MsgType.KEEP_ALIVE:
            kind = _KEEP_ALIVE
        elif t is MsgType.FIRST_ACK:
            kind = _FIRST_ACK
        else:
            return False
        trailer = unpack_trailer(msg.order_info)
        if trailer is None or trailer[2] is not None or trailer[3]:
            return False
        sent_upto, own, _, _, delivered = trailer
        if kind >= _KEEP_ALIVE and (own is not None or sent_upto > s.upto):
            # (own order info rides on data only; a sent-up-to past ours: placeholders)
            return False
        # handle_message
        if now_us > s.now:
            s.now = now_us
        now = s.now
        if msg.ts > s.clock:
            s.clock = msg.ts
        self._count("rx_" + t.name)
        s.heard = now
        if news_of_primary(s.primary_heard, msg.pvn, msg.sender, msg.ts):
            s.primary_heard = (msg.pvn, msg.sender, now_us, msg.ts)    # (when it came)
            s.primary_heard_set = True
        # _handle_inter: _on_remote_ack
        tm = s.timers
        a = msg.ack
        last_msn = s.next_msn - 1
        if kind != _FIRST_ACK and a != last_msn:
            s.fa_count = 0
        if s.remote_ack < a <= last_msn:
            s.remote_ack = a
            self._on_acked(a, now)
            if a < last_msn:
                tm[Timer.RETRANSMIT] = now + s.rto[3]
            else:
                tm.pop(Timer.RETRANSMIT, None)
        if msg.back > s.remote_gw:
            s.remote_gw = msg.back
            self._drop_covered()
        if delivered is not None and delivered > s.remote_delivered:
            s.remote_delivered = delivered
        if kind == _NEXT:
            self._next_data(msg, own)
            return True
        if kind == _DUP:
            s.served_pvn = s.pvn
            # _on_data_at_primary: _rx_data's duplicate (our ack may be lost: re-ack soon)
            self._count("dup_data")
            self._want_first_ack(True)
            self._want_first_ack(False)
            # _on_trailer of a data message: its own order info
            if own is not None:
                self._own(own)
        else:
            if kind == _KEEP_ALIVE:
                s.fa_count = 0                      # _on_keepalive (STREAMING)
            else:
                self._on_first_ack(msg)
            # _on_trailer of a non-data message: _declared, _expect (nothing), advance_ts
            d_upto, d_ts = s.declared
            if sent_upto >= d_upto or msg.ts > d_ts:
                s.declared = (max(sent_upto, d_upto), max(msg.ts, d_ts))
            d_upto, d_ts = s.declared
            if s.upto >= d_upto and d_ts > s.view_ts:
                s.view_ts = d_ts
        self._group_watermark()                     # _gc_all_received
        self._after_event()
        return True

    def _next_data(self, msg: Message, own: list | None) -> None:
        """The rest of the next data message in order (after the common part)."""
        s = self.loan
        s.served_pvn = s.pvn
        # _on_data_at_primary: _rx_data, _advance, _release_held, _deliver
        body = msg.body
        offset, data = body["offset"], body["data"]
        if s.first_offset is None or offset < s.first_offset:
            s.first_offset = offset
        s.ka_idle = 0
        s.upto = msg.msn
        if msg.ts > s.view_ts:
            s.view_ts = msg.ts
        if msg.ts > s.recv_max_data_ts:
            s.recv_max_data_ts = msg.ts
        if msg.ts > s.max_data_ts:
            s.max_data_ts = msg.ts
        self.actions.append(Deliver(s.cid, offset, data))
        s.delivered = offset + len(data)
        sent_upto, ts = s.declared                  # ReceiveSide.advance_ts
        if s.upto >= sent_upto and ts > s.view_ts:
            s.view_ts = ts
        self._group_watermark()                     # _gc_received: the message goes
        self._want_first_ack(False)
        # _on_trailer: the remote's order info, to reflect
        if own is not None:
            self._own(own)
        self._after_event()

    def _own(self, own: list) -> None:
        """`_on_trailer`'s own section (a primary's): kept, and to reflect if newer."""
        s = self.loan
        last = section_end(own)
        lr = s.last_order_info
        if lr is None or last >= section_end(lr):
            s.last_order_info = own
        refl_now = s.to_reflect
        if ((refl_now is None or last > section_end(refl_now))
                and last > (s.reflected or (0, 0))):
            s.to_reflect = own
            self._want_first_ack(True)

    def _after_event(self) -> None:
        """`_after_event` (nothing held: nothing to solicit)."""
        s = self.loan
        if s.gw_rose:
            s.gw_rose = False
            if s.recv_max_data_ts > s.last_back and s.gw > s.last_back:
                soon = s.now + s.first_ack_delay_us
                d = s.timers.get(Timer.KEEPALIVE)
                if d is None or soon < d:
                    s.timers[Timer.KEEPALIVE] = soon
                s.ka_urgent = True

    def _on_first_ack(self, msg: Message) -> None:
        """`_on_first_ack` of a primary without backups (never throttled: that takes
        backups) and the SECOND_ACK it owes (`_msg(c, SECOND_ACK, {}, ack=...)`,
        `_emit`)."""
        s = self.loan
        if msg.ack > 0 and msg.ack == s.next_msn - 1:
            if s.fa_msn != msg.ack:
                s.fa_msn, s.fa_count = msg.ack, 0
            s.fa_count += 1
        # RESPONDS_TO_FIRST_ACK[(True, False)]: SECOND_ACK, if our app produced the acked
        # message (by offset: the trailer's `delivered`, taken above)
        if msg.ack <= 0 or s.out_offset < s.remote_delivered:
            return
        s.clock += 1
        self._emit(self._message(MsgType.SECOND_ACK, 0, msg.ack, {}, b""))

    def _message(self, mtype: MsgType, msn: int, ack: int, body: dict,
                 order_info: bytes) -> Message:
        """The Message `_msg` makes on the lent connection (the clock already ticked for
        it), with `_back`'s group watermark."""
        s = self.loan
        back = self._group_watermark()
        if back > s.last_back:
            s.last_back = back
        remote, seq, role = s.cid
        return Message(type=mtype, src_group=s.group, dst_group=remote, conn_seq=seq,
                       role=role, pvn=s.pvn, precedence=s.precedence, sender=s.birth_id,
                       msn=msn, ack=ack, back=back, ts=s.clock, body=body,
                       order_info=order_info)

    def _emit(self, msg: Message) -> None:
        """`MessagingEndpoint._emit` on the lent connection (known: KEEPALIVE moves)."""
        s = self.loan
        self.actions.append(Send(msg.dst_group, msg))
        s.last_send_us = s.now
        s.timers[Timer.KEEPALIVE] = s.now + s.keepalive_us

    def _want_first_ack(self, reflect: bool) -> None:
        s = self.loan
        if reflect or s.upto > s.fa_pending or s.fa_pending == 0:
            due = s.now + s.first_ack_delay_us
            d = s.timers.get(Timer.FIRST_ACK)
            if d is None or due < d:
                s.timers[Timer.FIRST_ACK] = due
            s.fa_tries = 0

    def _on_acked(self, upto: int, now: int) -> None:
        """`SendSide.on_acked` and `RtoEstimator.sample`."""
        s = self.loan
        sample = None
        for msn in [m for m in s.sent_at if m <= upto]:
            t0 = s.sent_at.pop(msn)
            if msn == upto:
                sample = now - t0
        if sample is None:
            return
        est = RtoEstimator(*s.rto_bounds)           # the core's rule on the loan's values
        est.srtt_us, est.rttvar_us, est.backoff, est.rto_us = s.rto
        est.sample(sample)
        s.rto = (est.srtt_us, est.rttvar_us, est.backoff, est.rto_us)

    def _drop_covered(self) -> None:
        """`_gc_sent`: `SendSide.drop_covered` by the remote group watermark."""
        s = self.loan
        freed = False
        while s.sent and s.sent[0].ts <= s.remote_gw:
            m = s.sent.pop(0)
            s.sent_bytes -= len(m.body["data"])
            s.sent_at.pop(m.msn, None)
            freed = True
        if freed:
            covered = s.sent[0].msn - 1 if s.sent else s.next_msn - 1
            if s.remote_ack < covered:
                s.remote_ack = covered
            if not any(m.msn > s.remote_ack for m in s.sent):
                s.timers.pop(Timer.RETRANSMIT, None)


# what handle_message takes (in this order: the last two are not data)
_NEXT, _DUP, _KEEP_ALIVE, _FIRST_ACK = 0, 1, 2, 3

LANE_TIMERS = CONNECTION_TIMERS     # a lent connection's timers travel with it


class LanedEndpoint:
    """A messaging core whose steady connection a lane owns between events: the driver's
    side of the ownership transfer. It has the core's sans-IO surface; steady events go
    to the lane, anything else takes the loan back first. Any other attribute is the
    endpoint's, read after taking the loan back.

    `shadow`: also run a copy of the core (taken at each loan) on the events the lane
    handles, and raise LaneDivergence at the first action, timer or (at each reclaim)
    state that differs. `backup_shadow_every` k: of a backup's loans only the first of
    every k is shadowed (a backup lends for every burst of remote data, and the copy of
    its whole core per loan doubled a messaging campaign's time; the others run on the
    lane alone, judged by the campaign's checks like any replica)."""

    def __init__(self, endpoint, *, shadow: bool = False, engine=None,
                 backup_engine=None, backup_shadow_every: int = 1, lone: bool = True):
        """`engine`: what runs a loan (a class taking a `Loan`, with SteadyLane's
        methods); SteadyLane by default. `backup_engine`: what runs a backup's loan
        (`MessagingEndpoint.lend_backup`, backup_lane.py: its primary's steady
        HEARTBEAT, the remote primaries' steady data messages); None: a backup lends
        nothing. `lone` False: a lone primary lends nothing (a backup's lane alone)."""
        engine = engine or SteadyLane
        self.__dict__.update(endpoint=endpoint, lane=None, shadow=shadow, _copy=None,
                             backup_shadow_every=backup_shadow_every, shadowing=False,
                             lane_events=0, loans=0, reclaims=Counter(), engine=engine,
                             backup_engine=backup_engine, backup_events=0,
                             backup_loans=0, lone=lone, _cached=set(),
                             # a lane whose raw path refused the datagram being decoded
                             _raw_refused=None,
                             # an engine handles whole datagrams (a native lane)
                             takes_datagrams=(lone and hasattr(engine, "handle_datagram"))
                             or hasattr(backup_engine, "handle_datagram"))

    # -- ownership ---------------------------------------------------------------------
    def _lend(self, msg: Message | None = None) -> SteadyLane | None:
        """Lend if steady; a backup lends only for a message its lane may take."""
        if self.lane is None:
            ep = self.endpoint
            loan = ep.lend() if self.lone else None
            engine = self.engine
            if (loan is None and msg is not None and self.backup_engine is not None
                    and self.backup_engine.candidate(ep, msg)):
                loan = ep.lend_backup()
                engine = self.backup_engine
                if loan is not None:
                    self.backup_loans += 1
            if loan is not None:
                d = self.__dict__
                for k in d["_cached"]:       # (a loan out: the core's methods reclaim)
                    del d[k]
                d["_cached"].clear()
                self.lane = engine(loan)
                self.loans += 1
                self.shadowing = self.shadow and (
                    engine is not self.backup_engine
                    or (self.backup_loans - 1) % self.backup_shadow_every == 0)
                if self.shadowing:
                    # (the hooks a replica node gives its core -- wait_of, replay_of,
                    # rm_of, probe_state_of -- read membership: shared, not copied)
                    ep = self.endpoint
                    hooks = {id(getattr(ep, k)): getattr(ep, k) for k in _HOOKS}
                    self._copy = copy.deepcopy(ep, dict(hooks))
                    getattr(self._copy, getattr(engine, "reclaim_with", "reclaim"))(
                        copy.deepcopy(loan, dict(hooks)))   # (a backup's loan has them)
                    self._copy._actions = []    # (the owner's until taken)
        return self.lane

    def reclaim(self, why: str = "asked") -> None:
        lane = self.lane
        if lane is None:
            return
        self.lane = None
        self.reclaims[why] += 1
        pending = lane.take_actions()
        # (a backup's loan goes back through its own method: `reclaim_with`)
        getattr(self.endpoint, getattr(lane, "reclaim_with", "reclaim"))(lane.loan)
        release = getattr(lane, "release", None)
        if release is not None:
            release()                   # (a native lane's buffers serve the next loan)
        # (after what the core emitted before the loan and nobody took yet)
        self.endpoint._actions.extend(pending)
        if self.shadowing:
            theirs = endpoint_state(self._copy)
            mine = endpoint_state(self.endpoint)
            self._copy = None
            if mine != theirs:
                raise LaneDivergence("state after reclaim differs from the core's: "
                                     + _first_difference(mine, theirs))

    def _shadowed(self, since: int, event: str, *args, result=None) -> None:
        """The core's copy takes the same event; its actions and timers must match the
        lane's (its actions from index `since` on), and its answer `result` (if given)."""
        self.lane_events += 1
        if self.lane.cid is None:
            self.backup_events += 1
        if not self.shadowing:
            return
        core = self._copy
        answer = getattr(core, event)(*args)
        if result is not None and answer != result:
            raise LaneDivergence(f"{event}: lane answers {result!r}, core {answer!r}")
        theirs = core.take_actions()
        mine = self.lane.actions[since:]
        if mine != theirs:
            raise LaneDivergence(f"{event}: lane actions {_brief(mine)} != core's "
                                 f"{_brief(theirs)}")
        cid = self.lane.cid
        if cid is None:
            deadlines = self.lane.timer_deadlines(core)
        else:
            deadlines = {k: core.timers.due(k, cid) for k in LANE_TIMERS
                         if core.timers.due(k, cid) is not None}
        # (a native backup lane answers without reading its whole loan back)
        mine_t = getattr(self.lane, "loan_timers", None)
        mine_t = mine_t() if mine_t is not None else self.lane.loan.timers
        if deadlines != mine_t:
            raise LaneDivergence(f"{event}: lane timers {mine_t} != core's {deadlines}")

    # -- the sans-IO surface -------------------------------------------------------------
    def handle_message(self, msg: Message, now_us: int) -> None:
        # An engine that takes datagrams had this message's bytes first and refused them
        # (or it came another way -- reassembled, from the pulse port --: no steady one
        # either), unless a shadow checks the lane: then every message comes this way.
        # A backup's lane sees what its raw path did not refuse: its group's messages
        # come decoded (membership reads them too), and without a loan out the raw path
        # could not lend (a backup lends for a message its lane may take).
        offer = self.shadow or not self.takes_datagrams
        if not offer and self.backup_engine is not None:
            lane = self.lane
            offer = lane is None or (lane.cid is None and lane is not self._raw_refused)
        self._raw_refused = None
        lane = self._lend(msg) if offer else self.lane
        if lane is not None:
            since = len(lane.actions)
            if offer and lane.handle_message(msg, now_us):
                self._shadowed(since, "handle_message", msg, now_us)
                return
            self.reclaim(msg.type.name)
        self.endpoint.handle_message(msg, now_us)

    def handle_datagram(self, datagram: bytes, now_us: int) -> bool:
        """A whole datagram as received, to an engine that verifies and handles steady
        ones itself (`takes_datagrams`); False: not handled, nothing changed (the caller
        decodes it and calls `handle_message`)."""
        # (with a shadow every message goes through handle_message, which it checks;
        # the engine's handle_message takes the same raw path after encoding it)
        # (without a message only a lone primary can lend: a backup's lane takes a
        # datagram only while a loan is out -- so a primary behind llft run's wrapper,
        # which lends nothing, pays no lending attempt per datagram)
        lane = None if self.shadow else self._lend() if self.lone else self.lane
        raw = getattr(lane, "handle_datagram", None)     # (a Python backup lane has none)
        if raw is None or not raw(datagram, now_us):
            # (the decoded message then goes to the core, unless the lane takes it
            # decoded only: a backup's lane, its group's messages)
            self._raw_refused = lane if getattr(lane, "raw_refused", True) else None
            return False
        self.lane_events += 1
        return True

    def send(self, conn, data: bytes, now_us: int | None = None) -> int:
        lane = self._lend()
        if lane is not None and lane.cid is None:
            # a backup's loan: its app's output is logged (rule 5), if the lane can
            since = len(lane.actions)
            n = lane.send(conn, data, now_us)
            if n is not None:
                self._shadowed(since, "send", conn, data, now_us, result=n)
                return n
            self.reclaim("send")
        elif lane is not None and conn == lane.cid:
            since = len(lane.actions)
            if lane.send(data, now_us):
                self._shadowed(since, "send", conn, data, now_us, result=len(data))
                return len(data)
            self.reclaim("send")
        return self.endpoint.send(conn, data, now_us)

    def send_space(self, conn) -> int:
        lane = self.lane
        n = None if lane is None or lane.cid is not None else lane.send_space(conn)
        if n is None:
            self.reclaim("send_space")
            return self.endpoint.send_space(conn)
        if self.shadowing and self._copy.send_space(conn) != n:
            raise LaneDivergence(f"send_space: lane answers {n}, core "
                                 f"{self._copy.send_space(conn)}")
        return n

    def in_flight(self, conn) -> int:
        lane = self.lane
        if lane is not None and conn == lane.cid:
            return lane.in_flight()
        return self.endpoint.in_flight(conn)

    def next_timer_us(self) -> int | None:
        a = self.endpoint.next_timer_us()
        b = self.lane.next_timer_us() if self.lane is not None else None
        return b if a is None else a if b is None else min(a, b)

    def set_executed(self, pos: int, now_us: int | None = None) -> None:
        lane = self.lane
        if lane is not None and hasattr(lane, "set_executed"):
            since = len(lane.actions)
            if lane.set_executed(pos, now_us):
                self._shadowed(since, "set_executed", pos, now_us)
                return
        self.reclaim("set_executed")
        self.endpoint.set_executed(pos, now_us)

    def handle_timer(self, now_us: int) -> None:
        lane = self.lane
        # a backup's lane fires its loan's timers when no timer of the core is due too
        if lane is not None and hasattr(lane, "handle_timer"):
            since = len(lane.actions)
            if lane.handle_timer(now_us, self.endpoint.next_timer_us()):
                self._shadowed(since, "handle_timer", now_us)
                return
        self.reclaim("timer")
        self.endpoint.handle_timer(now_us)

    def take_actions(self) -> list[Any]:
        mine = self.lane.take_actions() if self.lane is not None else []
        return self.endpoint.take_actions() + mine

    def heard_again(self, msg: Message, times_us: list[int]) -> None:
        if times_us and self.backup_engine is not None:
            # (the core's heard_again: the last copy handled; a backup's lane takes
            # its primary's and the other backups' repeated HEARTBEATs)
            self.handle_message(msg, times_us[-1])
            return
        self.reclaim("heard_again")
        self.endpoint.heard_again(msg, times_us)

    def __getattr__(self, name: str):
        d = self.__dict__
        if "endpoint" not in d:
            raise AttributeError(name)  # (not made by __init__: copy, pickle)
        ep, lane = d["endpoint"], d["lane"]
        if lane is None:
            # nothing lent: the core's. A method of its class is kept here until a loan
            # goes out (`_lend` drops them): a core that never lends (a primary) is read
            # through this wrapper several times a request, on its critical path.
            v = getattr(ep, name)
            if type(v) is MethodType and v.__self__ is ep and name not in vars(ep):
                d[name] = v
                d["_cached"].add(name)
            return v
        if name in getattr(lane, "READS", ()):
            mine = lane.read(name)      # (answered by the loan: it stays lent)
            if d["shadowing"] and getattr(d["_copy"], name) != mine:
                raise LaneDivergence(f"{name}: lane answers {mine!r}, core "
                                     f"{getattr(d['_copy'], name)!r}")
            return mine
        if name not in vars(ep) and not hasattr(type(ep), name):
            # (a driver asking whether its core has something: no loan to take back)
            raise AttributeError(name)
        self.reclaim(name)
        return getattr(self.endpoint, name)

    def __setattr__(self, name: str, value) -> None:
        d = self.__dict__
        if name in d and name not in d["_cached"]:
            d[name] = value
            return
        if name in d:                   # (a method kept from the core: set the core's)
            del d[name]
            d["_cached"].discard(name)
        self.reclaim(name)
        setattr(self.endpoint, name, value)


def _brief(actions: list) -> list:
    """Actions as a short line each (a divergence report without the payloads)."""
    out = []
    for a in actions:
        m = getattr(a, "msg", None)
        if m is not None:
            d = m.body.get("data", b"")
            out.append((type(a).__name__, m.type.name, m.msn, m.ack, m.back, m.ts,
                        m.body.get("offset"), len(d), m.order_info.hex()))
        else:
            out.append((type(a).__name__, *(repr(v)[:40] for v in vars(a).values()))
                       if hasattr(a, "__dict__") else repr(a)[:80])
    return out


# what a replica node hooks into its core (they read membership)
_HOOKS = ("wait_of", "replay_of", "rm_of", "probe_state_of")

# the endpoint's caches: derived from the rest, rebuilt when needed (not compared)
_CACHES = frozenset({"_wm_terms", "_wm_heap", "_wm_dirty", "_digest", "_actions",
                     "wait_of", "replay_of", "rm_of", "probe_state_of"})


def endpoint_state(ep) -> dict:
    """An endpoint's state as plain values, caches left out, timers as their deadlines."""
    out = {}
    for k, v in vars(ep).items():
        if k in _CACHES:
            continue
        if k == "timers":
            v = dict(v._due)
        elif k == "_holding":
            v = sorted(repr(c.cid) for c in v if c.recv.received)
        out[k] = _plain(v)
    return out


def _plain(v):
    if isinstance(v, (str, int, float, bytes, type(None), Message, enum.Enum)):
        return v
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) or type(v).__name__ == "deque":
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(repr(_plain(x)) for x in v)
    slots = getattr(type(v), "__slots__", None)
    if slots:
        return {type(v).__name__: {s: _plain(getattr(v, s)) for s in slots
                                   if hasattr(v, s)}}
    if hasattr(v, "__dict__"):
        return {type(v).__name__: {k: _plain(x) for k, x in vars(v).items()}}
    return v


def _first_difference(a, b, path: str = "") -> str:
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{path}.{k}: only on one side"
            if a[k] != b[k]:
                return _first_difference(a[k], b[k], f"{path}.{k}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} != {b!r}"
