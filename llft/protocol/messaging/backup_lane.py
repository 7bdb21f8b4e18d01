"""The backups' steady lane, first slice: rule 2 of docs/BACKUP_LANE.md ("a gw rise"),
its messaging half, as an executable model checked in lockstep against the core.

A backup delivers remote data in batches, one per HEARTBEAT of its primary: the
heartbeat's `back` (the primary's group watermark, for the set of connections its `ack`
digests) raises our `gw`, which collects the received lists and releases the held
messages it covers. `MessagingEndpoint.lend_backup()` hands what that path touches to a
`BackupLane` when the backup is in the steady state where the path is simple (every
connection in one current remote view, or none yet with nothing held or received; its
held messages of that view and contiguous from `delivered`; nothing ahead, beyond or of
an old view; no cut asked, no frees carried; not in phase 2). A stream end (`recv.end`)
is taken: `_deliver` cuts the message at the end marker and adds `Closed`.

The lane then takes only the steady form of the event: a HEARTBEAT of our group's
current primary, of our view, with no frees (empty order info) and our digest in `ack`.
It does what `handle_message` -> `_handle_intra` -> `_on_primary_heartbeat` (->
`_gc_all_received`, `_release_all_held`, `_release_held`, `_deliver`) -> `_after_event`
-> `_reap` do for it: the clock merge, the counter, `last_heard_us`, the gw rise, the
received lists' collection, one `Deliver` (and `Closed`) per released message in
connection order, and the WATERMARK_REPORT timer `_after_event` arms. Anything else
returns False with nothing changed: the owner (`LanedEndpoint`) takes the loan back
(`MessagingEndpoint.reclaim_backup`) and the core handles the event.

Why the timestamp watermark is a constant of the loan: with the lend conditions every
known connection's term is its current view's recv_ts, or with no view yet the ts of our
first message (a client's) or 0 (no gap: the held list is contiguous from `delivered`
and nothing is ahead; no old view or old ts), and a heartbeat changes none of them; so
`_after_event`'s `timestamp_watermark()` is the minimum taken at lend.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llft.protocol.messages import Message, MsgType
from llft.protocol.messaging.actions import Closed, Deliver
from llft.protocol.messaging.lane import LaneBase
from llft.protocol.messaging.timers import Timer

# the endpoint timers a backup loan carries (out of the core's registry while lent)
BACKUP_LANE_TIMERS = (Timer.WATERMARK_REPORT,)


@dataclass(slots=True)
class HeldConn:
    """One connection's part of a backup loan: the receive state a gw rise touches."""
    cid: tuple
    holding: bool               # in the endpoint's `_holding` set
    delivered: int
    covered: int
    end: int | None             # the remote stream's end marker (recv.end), and
    abort: bool                 # whether it is a reset (constant while lent)
    held: list[Message]         # of the current remote view, contiguous from `delivered`
    received: list[Message]     # none of an older remote view


@dataclass(slots=True)
class BackupLoan:
    """A steady backup's state for rule 2 (the core's fields of the same names)."""
    group: str
    birth_id: int
    pvn: int
    primary_id: int
    clock: int
    now: int
    gw: int
    digest: int                 # constant while lent (the set of connections is)
    ts_w: int                   # timestamp_watermark(): constant while lent (docstring)
    max_data_ts: int
    reported_w: int
    has_backups: bool
    last_heard: int | None      # last_heard_us[primary_id] (None: not set while lent)
    conns: list[HeldConn]       # in the endpoint's connection order
    timers: dict[Timer, int]    # BACKUP_LANE_TIMERS' deadlines
    watermark_report_us: int
    stats: dict[str, int] = field(default_factory=dict)    # counted while lent


class BackupLane(LaneBase):
    """Rule 2 over a `BackupLoan`; the comments name the core's functions."""

    cid = None                  # (no connection of its own: sends go to the core)
    reclaim_with = "reclaim_backup"     # the endpoint's method that takes a loan back

    @staticmethod
    def candidate(endpoint, msg: Message) -> bool:
        """Worth lending for (cheap, before any loan: a loan the lane would refuse at
        once costs a copy of the core when checked in lockstep): the steady HEARTBEAT
        `handle_message` takes, at a backup."""
        return (msg.type is MsgType.HEARTBEAT and msg.src_group == endpoint.group
                and msg.dst_group == endpoint.group and not endpoint.is_primary
                and msg.sender == endpoint.primary_id and msg.pvn == endpoint.pvn
                and not msg.order_info and msg.ack == endpoint.digest())

    def timer_deadlines(self, core) -> dict[Timer, int]:
        """The same timers' deadlines in a core (the lockstep check)."""
        out = {}
        for k in BACKUP_LANE_TIMERS:
            d = core.timers.due(k)
            if d is not None:
                out[k] = d
        return out

    def send(self, data: bytes, now_us: int | None) -> bool:
        return False

    def in_flight(self) -> int:
        return 0

    def handle_message(self, msg: Message, now_us: int) -> bool:
        """The primary's steady HEARTBEAT (else False: nothing changed)."""
        s = self.loan
        if (msg.type is not MsgType.HEARTBEAT or msg.src_group != s.group
                or msg.dst_group != s.group or msg.sender == s.birth_id
                or msg.sender != s.primary_id or msg.pvn != s.pvn
                or msg.order_info or msg.ack != s.digest):
            return False
        # handle_message
        if now_us > s.now:
            s.now = now_us
        if msg.ts > s.clock:
            s.clock = msg.ts
        self._count("rx_HEARTBEAT")
        # (a HEARTBEAT does not end a quiet spell: no _hb_soon)
        # _handle_intra
        s.last_heard = s.now
        # _on_primary_heartbeat: no frees (cuts_asked = {}: empty at lend), our digest
        # (carry = []: empty at lend)
        if msg.back > s.gw:
            s.gw = msg.back
            self._gc_all_received()
            self._release_all_held()
        self._after_event()
        # _reap: nothing at a backup
        return True

    def _gc_all_received(self) -> None:
        """`_gc_all_received` at a backup (group_watermark() is gw; keep_old, but no
        received message is of an older view): `ReceiveSide.drop_received`."""
        gw = self.loan.gw
        for hc in self.loan.conns:
            if not hc.holding:
                continue
            rx = hc.received
            n = 0
            while n < len(rx) and rx[n].ts <= gw:
                m = rx[n]
                end = m.body["offset"] + len(m.body["data"])
                if end > hc.covered:
                    hc.covered = end
                n += 1
            del rx[:n]
            if not rx:
                hc.holding = False

    def _release_all_held(self) -> None:
        """`_release_all_held` -> `_release_held` (a backup, current view only) ->
        `_deliver` (in order: nothing ahead, beyond or ending)."""
        gw = self.loan.gw
        for hc in self.loan.conns:
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
                and s.max_data_ts > s.reported_w and s.ts_w > s.reported_w):
            s.timers[Timer.WATERMARK_REPORT] = s.now + s.watermark_report_us
