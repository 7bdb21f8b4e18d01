"""One connection's state, as an explicit state machine (in the manner of etcd raft's
`tracker.Progress`).

A `Connection` is this replica's end of one virtual connection. Its fields are grouped by
what they describe:
  send         our own stream: what the application produced, the primary's queue and
               sent list (msn order), a backup's log, retransmission and throttling state
  recv         the remote primary's stream: the receive sequence of its current view (and
               of the previous one while a backup still fills its gaps), the offset
               delivered, the received list kept for our backups, bytes ahead of a gap
  remote_view  what the remote group told us: its group watermark, how far it delivered
               our stream, the order info to reflect back, our phase-2 answer to it
The timers of a connection live in the endpoint's registry (timers.py).

States (`SendState`, the send side; the only way it changes is a transition method):
  STREAMING  sends as the window allows (a backup logs instead of sending)
  THROTTLED  primary: the remote group's FIRST_ACKs of our last message say our backups
             lag (intra-group flow control); nothing new is sent until a KEEP_ALIVE or
             throttle_us (the endpoint's THROTTLE_END timer is armed exactly then)
  RESYNC     new primary: msns restarted at 1, NEW_PRIMARY_VIEW sent until the remote
             primary answers; nothing is sent, the sent list is empty
  STREAMING -throttle-> THROTTLED -unthrottle-> STREAMING
  any -begin_resync-> RESYNC -end_resync-> STREAMING
`known` (counted in the watermark and the digest) only ever goes from False to True
(`mark_known`). `peer_finished` (the remote group freed the connection: CLOSED) empties
the send side and ends any RESYNC: from then on the connection only waits for our own
application's end before it is freed (endpoint.py, "Stream end and freeing"). `check()` asserts the invariants written next to the fields.
"""
from __future__ import annotations

import enum
from collections import deque

from llft.protocol.messages import STREAM_END, Message
from llft.protocol.messaging.config import ConnId


class SendState(enum.Enum):
    STREAMING = "streaming"
    THROTTLED = "throttled"
    RESYNC = "resync"


# the transitions the methods below perform: state -> states it may go to
TRANSITIONS: dict[SendState, frozenset[SendState]] = {
    SendState.STREAMING: frozenset({SendState.THROTTLED, SendState.RESYNC}),
    SendState.THROTTLED: frozenset({SendState.STREAMING, SendState.RESYNC}),
    SendState.RESYNC: frozenset({SendState.STREAMING, SendState.RESYNC}),
}


class ReceiveSequence:
    """Receive sequence of one remote primary view on one connection.
    Invariants: every slot's msn > upto; nacks are placeholders (slots holding None)."""
    __slots__ = ("pvn", "upto", "ts", "slots", "nacks", "first_offset", "start",
                 "after_change")

    def __init__(self, pvn: int):
        self.pvn = pvn
        self.upto = 0                       # receiveduptomsn
        self.ts = 0                         # recv_ts (see the endpoint's theory)
        self.slots: dict[int, Message | None] = {}   # msn > upto: message or placeholder
        self.nacks: set[int] = set()
        self.first_offset: int | None = None
        # the offset of msn 1: where this primary view's stream resumed (a new primary's
        # msn 1 is an empty message at its resend point); unknown until msn 1 arrives
        self.start: int | None = None
        self.after_change = False           # follows a remote change of primary

    def expect(self, upto: int, max_placeholders: int) -> bool:
        """The remote primary sent everything up to msn `upto`: placeholders (and nacks)
        for what we lack, at most max_placeholders past `self.upto`. True if any is new."""
        top = min(upto, self.upto + max_placeholders)
        hi = max(self.slots) if self.slots else self.upto
        if top <= hi and top <= self.upto:
            return False
        new = False
        for k in range(self.upto + 1, top + 1):
            if k not in self.slots:
                self.slots[k] = None
                self.nacks.add(k)
                new = True
        return new

    def take_contiguous(self) -> list[Message]:
        """The messages now in msn order without a gap, out of the slots."""
        out = []
        while (nxt := self.slots.get(self.upto + 1)) is not None:
            del self.slots[self.upto + 1]
            self.upto += 1
            if nxt.ts > self.ts:
                self.ts = nxt.ts
            out.append(nxt)
        return out

    def check(self) -> None:
        assert all(k > self.upto for k in self.slots), "slot at or below upto"
        assert all(self.slots.get(k, 1) is None for k in self.nacks), "nack of a held msn"


class RtoEstimator:
    """Retransmission timeout from measured round trips (Jacobson/Karels, RFC 6298):
    SRTT and RTTVAR, RTO = SRTT + 4 RTTVAR within [floor, ceiling], doubled on each
    timeout (exponential back-off) until a fresh sample. An ack does not reset it: under
    load the round trip includes the remote's queue, and a timeout shorter than that
    queue resends every datagram while it waits there."""
    __slots__ = ("floor_us", "ceiling_us", "srtt_us", "rttvar_us", "backoff", "rto_us")

    def __init__(self, floor_us: int, ceiling_us: int | None = None):
        self.floor_us = floor_us
        self.ceiling_us = max(floor_us, ceiling_us or floor_us * 64)
        self.srtt_us: int | None = None
        self.rttvar_us = 0
        self.backoff = 0
        self.rto_us = floor_us

    def sample(self, rtt_us: int) -> None:
        rtt_us = max(0, rtt_us)
        if self.srtt_us is None:
            self.srtt_us, self.rttvar_us = rtt_us, rtt_us // 2
        else:
            self.rttvar_us += (abs(self.srtt_us - rtt_us) - self.rttvar_us) // 4
            self.srtt_us += (rtt_us - self.srtt_us) // 8
        self.backoff = 0
        self._update()

    def timed_out(self) -> None:
        self.backoff = min(self.backoff + 1, 16)    # far beyond any ceiling already
        self._update()

    def _update(self) -> None:
        base = self.floor_us if self.srtt_us is None else self.srtt_us + 4 * self.rttvar_us
        self.rto_us = min(self.ceiling_us, max(self.floor_us, base) << self.backoff)


class SendSide:
    """Our own stream on one connection.
    Invariants: *_bytes equal the bytes their container holds; the sent list holds
    consecutive msns ending at last_msn; remote_ack <= last_msn."""
    __slots__ = ("out_offset", "queue", "queue_bytes", "next_msn", "sent", "sent_bytes",
                 "log", "log_bytes", "remote_ack", "rto", "fa_count", "fa_msn", "last_send_us",
                 "sent_open", "old_pvn", "last_back", "ka_urgent", "sent_at", "ka_idle",
                 "end", "abort", "first_ts")

    def __init__(self, rto_us: int, rto_max_us: int | None = None):
        self.out_offset = 0                 # end of the bytes our app produced
        self.queue: deque[tuple[int, bytes]] = deque()    # primary: cut, not yet sent
        self.queue_bytes = 0
        self.next_msn = 1
        self.sent: deque[Message] = deque() # primary: sent list (msn order)
        self.sent_bytes = 0
        self.log: deque[tuple[int, int, bytes]] = deque()  # backup: (msn, offset, data)
        self.log_bytes = 0
        self.remote_ack = 0                 # the remote primary acked our msns up to
        self.rto = RtoEstimator(rto_us, rto_max_us)     # retransmission timeout of this connection
        self.sent_at: dict[int, int] = {}   # msn -> first send time (none once resent)
        self.fa_count = 0                   # FIRST_ACKs seen for our last msn ...
        self.fa_msn = 0                     # ... which was this one
        self.last_send_us = 0
        self.sent_open = False              # STREAM_OPEN went out
        self.old_pvn = 0                    # RESYNC: the view we took over from
        self.last_back = 0                  # `back` in the last message we sent on it
        self.ka_urgent = False              # group watermark news for the remote sender
        self.end: int | None = None         # offset of our stream's end marker (closed)
        self.abort = False                  # ... and it is a reset, not a FIN
        self.first_ts = 0                   # ts of the first message we sent on it
        self.ka_idle = 0                    # own keep-alives since data last moved on it

    @property
    def last_msn(self) -> int:
        return self.next_msn - 1

    @property
    def rto_us(self) -> int:
        return self.rto.rto_us

    def on_acked(self, upto: int, now_us: int) -> None:
        """The remote primary acked our msns up to `upto`: one round-trip sample from
        the newest of them sent once (Karn: a retransmitted one tells nothing)."""
        sample = None
        for msn in [m for m in self.sent_at if m <= upto]:
            t = self.sent_at.pop(msn)
            if msn == upto:
                sample = now_us - t
        if sample is not None:
            self.rto.sample(sample)

    def queue_segment(self, seg: bytes) -> None:
        """Primary: the application's next bytes, to be sent as one message."""
        self.queue.append((self.out_offset, seg))
        self.queue_bytes += len(seg)
        self.out_offset += len(seg)

    def log_segment(self, seg: bytes) -> None:
        """Backup: the application's next bytes, logged as the message it would send."""
        self.log.append((self.next_msn, self.out_offset, seg))
        self.log_bytes += len(seg)
        self.next_msn += 1
        self.out_offset += len(seg)

    def drop_covered(self, group_watermark: int) -> bool:
        """Sent messages every remote member has (ts <= the remote group watermark) go,
        and count as acknowledged. True if any went."""
        freed = False
        while self.sent and self.sent[0].ts <= group_watermark:
            m = self.sent.popleft()
            self.sent_bytes -= len(m.body["data"])
            self.sent_at.pop(m.msn, None)
            freed = True
        if freed:
            covered = self.sent[0].msn - 1 if self.sent else self.last_msn
            if self.remote_ack < covered:
                self.remote_ack = covered
        return freed

    def check(self) -> None:
        assert self.queue_bytes == sum(len(d) for _, d in self.queue), "queue_bytes"
        assert self.sent_bytes == sum(len(m.body["data"]) for m in self.sent), "sent_bytes"
        assert self.log_bytes == sum(len(d) for _, _, d in self.log), "log_bytes"
        if self.sent:
            assert [m.msn for m in self.sent] == list(
                range(self.sent[0].msn, self.last_msn + 1)), "sent list not consecutive"
        assert self.remote_ack <= self.last_msn, "ack beyond what we sent"
        assert all(m <= self.last_msn for m in self.sent_at), "send time of an unsent msn"


class ReceiveSide:
    """The remote primary's stream on one connection.
    Invariant: bytes held ahead of a gap start beyond `delivered`."""
    __slots__ = ("view", "old_view", "delivered", "received", "held", "ahead", "beyond",
                 "declared", "max_data_ts", "old_ts", "fa_pending", "fa_tries", "end",
                 "abort", "told_delivered", "end_pvn", "covered")

    def __init__(self) -> None:
        self.view: ReceiveSequence | None = None      # the remote primary's current view
        self.old_view: ReceiveSequence | None = None  # backup: the previous one's gaps
        self.delivered = 0                  # stream offset delivered
        self.received: deque[Message] = deque()   # delivered, kept until ts <= GW
        # backup: received in order, not yet delivered: a backup delivers a message only
        # once its primary has it too (see MessagingEndpoint._release_held)
        self.held: deque[Message] = deque()
        self.ahead: dict[int, bytes] = {}   # offset -> data beyond `delivered` (view change)
        # backup: an old remote view's bytes beyond the current view's resume point, not
        # delivered (the new remote primary re-sends them) but kept until it has: if the
        # remote group dies first they are the only copy of what our primary delivered
        # (`MessagingEndpoint._deliver_upto`). At most a window of messages.
        self.beyond: dict[int, bytes] = {}  # offset -> data
        self.declared: tuple[int, int] = (0, 0)   # remote primary's (sent_upto, ts)
        self.max_data_ts = 0                # highest ts of data received on this conn
        self.old_ts: int | None = None      # recv_ts frozen at a remote change of primary
        self.fa_pending = 0                 # FIRST_ACK ack value awaiting SECOND_ACK
        self.fa_tries = 0
        self.end: int | None = None         # offset of the remote stream's end marker
        self.end_pvn = 0                    # the latest remote view we have it from in order
        self.abort = False
        self.told_delivered = 0             # `delivered` in our last trailer on this conn
        # the end offset of the current remote view's messages collected from `received`
        # (every member of our group has the stream up to there from that view)
        self.covered = 0

    def gap_before(self) -> int | None:
        """The lowest offset we hold beyond a gap (bytes ahead of `delivered`, or a held
        message past what `delivered` and the held messages before it reach), or None:
        with a gap, the bytes [delivered, that) are not all here. The held list itself
        may have a hole: a new remote primary whose log lost bytes the old one sent
        resumes with an empty marker at the resend point and its first data past the
        hole; a watermark that saw only the first held message reported the hole as
        received, and the primary dropped the bytes its backup then asked it for."""
        first = min(self.ahead) if self.ahead else None     # all beyond `delivered`
        reach = self.delivered
        for m in self.held:
            off = m.body["offset"]
            if first is not None and off >= first:
                break
            if off > reach:
                return off if first is None else min(off, first)
            end = off + len(m.body["data"])
            if end > reach:
                reach = end
        return first

    @property
    def finished(self) -> bool:
        """The remote stream's end was delivered (after every byte of it)."""
        return self.end is not None and self.delivered > self.end

    def end_is_groups(self) -> bool:
        """The end (delivered here) reaches our backups too: we received it in order from
        the current remote view (so it went through the received list, which our group
        watermark empties only once every member has it), or that view resumed beyond
        it. A backup drops what an old remote view sent beyond the new one's resume
        point, so an end the old primary sent and the new one has not re-sent yet is ours
        alone, and so is an end of the new view that came ahead of a gap (the received
        list does not hold it yet): freeing then (and answering CLOSED, which stops the
        new primary from sending it) left the backups without the end."""
        v = self.view
        return (v is None or self.end_pvn >= v.pvn
                or (v.start is not None and self.end is not None and v.start > self.end))

    def new_view(self, pvn: int, keep_old_gaps: bool) -> None:
        """The remote group has a new primary (view `pvn`)."""
        old = self.view
        self.view = ReceiveSequence(pvn)
        self.view.after_change = old is not None or pvn > 1
        self.declared = (0, 0)
        if old is not None:
            # Until we have delivered up to where the new remote primary's stream starts,
            # we cannot vouch for old-view messages we never heard of: our watermark
            # contribution stays where the old view left it.
            self.old_ts = old.ts if self.old_ts is None else min(self.old_ts, old.ts)
        elif pvn > 1:
            # first contact in a later view: earlier primaries may have sent bytes we
            # never heard of (the new primary's msn-1 marker tells where it resumed)
            self.old_ts = 0
        self.old_view = old if old is not None and old.slots and keep_old_gaps else None

    def keep_received(self, m: Message) -> None:
        """A message of the remote primary in order: kept until our group has it."""
        if m.ts > self.max_data_ts:
            self.max_data_ts = m.ts
        if m.body["flags"] & STREAM_END and m.body["data"] and m.pvn > self.end_pvn:
            self.end_pvn = m.pvn
        self.received.append(m)

    def advance_ts(self, seq: ReceiveSequence) -> None:
        """recv_ts rises to the remote primary's declared ts once nothing is missing."""
        sent_upto, ts = self.declared
        if seq is self.view and not seq.slots and seq.upto >= sent_upto and ts > seq.ts:
            seq.ts = ts

    def drop_old_view_if_done(self) -> None:
        old = self.old_view
        if old is not None:
            first = self.view.first_offset
            if not old.slots or (first is not None and self.delivered >= first):
                self.old_view = None

    def keep_beyond(self, offset: int, data: bytes) -> None:
        if offset + len(data) > self.delivered and data:
            self.beyond[offset] = data

    def drop_beyond_delivered(self) -> None:
        """What the current remote view re-sent has replaced the old view's copies."""
        if self.beyond:
            for off in [o for o, d in self.beyond.items() if o + len(d) <= self.delivered]:
                del self.beyond[off]

    def drop_received(self, group_watermark: int, keep_old: bool = True) -> None:
        """Received messages every member of our group has (ts <= our group watermark).

        Except an older remote view's message with bytes past where the current remote
        view resumed (or while that point is unknown): a backup's watermark term vouches
        for the messages of the view it follows, and it drops an old view's bytes past
        the resume point (they may be an excluded primary's), so a member may lack them
        even when the watermark covers their ts. Our primary may have delivered them
        (taken at its promotion, before it answered NEW_PRIMARY_VIEW). They are kept
        until the current view's own copies of those offsets are collected (`covered`),
        or, if the remote group dies first, re-sent to the backups and kept until each
        says it holds the cut (`MessagingEndpoint._resend_received`, `_cut_held`).
        `keep_old` False: a primary without backups (nobody else needs them)."""
        rx, view = self.received, self.view
        pvn = 0 if view is None else view.pvn
        while rx and rx[0].ts <= group_watermark:
            m = rx[0]
            if m.pvn < pvn and keep_old:
                self._drop_received_past_old(group_watermark)
                return
            end = m.body["offset"] + len(m.body["data"])
            if end > self.covered:
                self.covered = end
            rx.popleft()

    def _drop_received_past_old(self, group_watermark: int) -> None:
        """`drop_received` with an older view's message among the covered ones: the
        current view's first (they raise `covered`), then the old view's it covers."""
        view = self.view
        for m in self.received:
            if m.ts <= group_watermark and m.pvn == view.pvn:
                self.covered = max(self.covered, m.body["offset"] + len(m.body["data"]))
        reach = max(self.covered, -1 if view.start is None else view.start)
        self.received = deque(
            m for m in self.received
            if m.ts > group_watermark
            or (m.pvn < view.pvn and m.body["offset"] + len(m.body["data"]) > reach))

    def check(self) -> None:
        assert all(o > self.delivered for o in self.ahead), "ahead at or below delivered"
        for seq in (self.view, self.old_view):
            if seq is not None:
                seq.check()


class RemoteView:
    """What the remote group told us on one connection."""
    __slots__ = ("group_watermark", "delivered", "to_reflect", "last_order_info",
                 "npv_answer")

    def __init__(self) -> None:
        self.group_watermark = 0            # remotegroupwatermark
        self.delivered = 0                  # remote primary's delivered offset of our stream
        self.to_reflect: list | None = None # its order info, reflected in our next message
        self.last_order_info: list | None = None   # newest order info the remote carried
        # (its pvn, low, sent_to, delivered then, the order info reflected: (pvn, first,
        # last) or None); the last two only for the gateway's log of a failover
        self.npv_answer: tuple[int, int, int, int, tuple[int, int, int] | None] | None = None


class Connection:
    __slots__ = ("cid", "remote", "seq", "role", "state", "known", "send", "recv",
                 "remote_view", "peer_done", "lost_at", "lost_resends", "foreign")

    def __init__(self, cid: ConnId, rto_us: int, rto_max_us: int | None = None):
        self.cid = cid
        self.remote, self.seq, self.role = cid
        self.state = SendState.STREAMING
        self.known = False                  # counted in the watermark and digest
        self.send = SendSide(rto_us, rto_max_us)
        self.recv = ReceiveSide()
        self.remote_view = RemoteView()
        self.peer_done = False              # the remote freed it (CLOSED), lost it or
                                            # is gone (silent for remote_timeout_us)
        self.lost_at: int | None = None     # lost or gone: the offset of its reset here
        self.lost_resends = 0               # ... and its bytes re-sent to our backups
        # taken up by a primary from the middle of the remote's stream, nothing of it
        # delivered here yet: another branch's connection, heard (MessagingEndpoint.served)
        self.foreign = False

    # ---- transitions (the only writers of `state` and `known`) ----
    def _go(self, to: SendState) -> None:
        assert to in TRANSITIONS[self.state], f"{self.state} -> {to}"
        self.state = to

    @property
    def resyncing(self) -> bool:
        return self.state is SendState.RESYNC

    def mark_known(self) -> bool:
        """Count the connection in the watermark and digest; True if it was not yet."""
        if self.known:
            return False
        self.known = True
        return True

    def throttle(self) -> None:
        self._go(SendState.THROTTLED)

    def unthrottle(self) -> None:
        self._go(SendState.STREAMING)
        self.send.fa_count = 0

    def begin_resync(self, old_pvn: int) -> None:
        """We became primary: msns restart at 1, nothing sent in the new view yet."""
        self._go(SendState.RESYNC)
        s = self.send
        s.next_msn = 1
        s.sent.clear()
        s.sent_at.clear()
        s.sent_bytes = 0
        s.remote_ack = 0
        s.fa_count = 0
        s.old_pvn = old_pvn

    def end_resync(self, resend_from: int) -> bool:
        """The remote end has our stream up to `resend_from`: the log from there on (and
        what the application wrote since) becomes the queue. True if the log had lost
        bytes the remote end lacks."""
        self._go(SendState.STREAMING)
        s = self.send
        gap = bool(s.log) and s.log[0][1] > resend_from
        keep = _cut_log(s.log, resend_from)
        keep.extend(s.queue)
        s.log.clear()
        s.log_bytes = 0
        s.queue = keep
        s.queue_bytes = sum(len(d) for _, d in keep)
        s.sent_open = True
        return gap

    def peer_finished(self) -> None:
        """The remote group freed the connection (CLOSED): it has our whole stream and we
        have its; nothing is sent on it any more (phase 2 ends here too)."""
        self.peer_done = True
        self.state = SendState.STREAMING    # any -> STREAMING: nothing left to throttle/resync
        s = self.send
        s.queue.clear()
        s.queue_bytes = 0
        s.sent.clear()
        s.sent_bytes = 0
        s.log.clear()
        s.log_bytes = 0
        s.remote_ack = s.last_msn
        s.sent_open = True

    def check(self) -> None:
        """The invariants (cheap enough for the simulator to call after every event)."""
        self.send.check()
        self.recv.check()
        if self.state is SendState.RESYNC:
            assert not self.send.sent, "RESYNC with a sent list"
        if self.state is SendState.THROTTLED:
            assert self.known, "THROTTLED but not known"
        if self.peer_done:
            assert not (self.send.sent or self.send.queue or self.send.log), \
                "data held for a remote end that freed the connection"
        if self.send.end is not None:
            assert self.send.out_offset == self.send.end + 1, "bytes after our stream's end"


def _cut_log(log: deque[tuple[int, int, bytes]], resend_from: int) -> deque[tuple[int, bytes]]:
    """The logged (offset, data) from stream offset `resend_from` on; the rest is dropped.
    The new primary re-sends exactly these, one message each."""
    # msn 1 of the new view is always an empty message at the resend point: it tells
    # the remote group where our stream stands (members behind it ask for the rest),
    # and it keeps the numbering identical at the new primary and at its backups
    # whatever each of their applications has written so far
    # When the log lost bytes past the resend point (a backup trims below the remote
    # primary's delivered offset minus a window: every remote member has received them,
    # though one may not have delivered them yet), the marker goes where the log starts:
    # the receivers take the hole's bytes from the old view below it (the group's
    # history: we logged them too) instead of waiting for a resend that never comes.
    start = resend_from
    if log and log[0][1] > resend_from:
        start = log[0][1]
    keep: deque[tuple[int, bytes]] = deque([(start, b"")])
    for _, off, data in log:
        if off + len(data) <= resend_from:
            continue
        if off < resend_from:
            data, off = data[resend_from - off:], resend_from
        keep.append((off, data))
    return keep
