"""The order-info log: the primary's opaque order-info chunks until its backups hold them,
and a backup's in-order delivery of them.

Primary side. The primary appends chunks (`append`, positions 1, 2, ... in each primary
view) and keeps each until every backup has acknowledged it (ORDER_INFO(upto) on the
intra-group connection; `acked`, then `gc`). A data message to a remote group piggybacks
every chunk past the *protected* position, the lowest of the backups' acks (`piggyback`);
a remote primary reflects what it received in its next message to the group, and the
backups deliver the reflection (and then ack it).

Why a reflection does not protect a chunk: a remote primary keeps only the last section
it received on each connection (that is what it answers a new primary with in phase 2).
If the primary stopped carrying chunks the remote had reflected, its later messages would
carry sections starting past them, the remote's last section would no longer hold them,
and a primary crashing before its backups got the reflection would leave its successor
without order info that output the remote already delivered depended on (seen in the
replica simulation: a new primary drew another choice for bytes the client had). A remote
primary reflects each chunk to a group once, on whichever connection's message goes first
(MessagingEndpoint._unreflected). Chunks no backup acked within order_info_intra_us go to
the backups directly (ORDER_INFO on the intra-group connection: the path for order info
with nothing to ride on, and for backups that missed a reflection); at once while output
commit waits on them (more than a piggyback unprotected, or an external send waits for
every position so far: `wanted`), then again from the floor,
backing off while no ack moves it, until every backup acked every position.
`unprotected_bytes` is what output commit waits on.

Backup side. `accept` takes a section (from a reflection or from ORDER_INFO) and returns
the chunks now deliverable, exactly once and in position order; chunks beyond a gap wait
(at most max_order_info_pending). Positions restart at 1 in a new primary view
(`new_view`); a backup that becomes primary starts an empty log (`become_primary`).

Lag (docs/LOG.md, "Bounded backup lag"). A backup's acknowledgment also carries `done`,
the position its application has *executed* (the runtime tells it: `executed`); it rides
on ORDER_INFO acks the backup sends anyway (when it delivered something new, or at its
heartbeat when execution advanced since its last ack). The primary stamps each position
with the time it was appended and reports, per backup, the positions not executed and
the age of the oldest of them (`lag`): an upper bound on the primary's execution the
backup would replay at a takeover. Stamps are kept for positions some backup has not
executed, at most MAX_LAG_STAMPS (beyond that the oldest go: ages read low).

Sections are [pvn, first_pos, [chunk, ...]] (trailer.py); the chunks stay opaque (the
determinizer's codec). Bounds: max_order_info_bytes held at the primary (BufferFull),
max_piggyback_bytes per message, max_order_info_pending at a backup.
"""
from __future__ import annotations

from collections import deque

MAX_LAG_STAMPS = 1 << 16            # positions' append times kept for lag (see above)

from llft.protocol.messaging.config import BufferFull, MessagingConfig
from llft.protocol.messaging.trailer import Section


class OrderInfoLog:
    __slots__ = ("config", "backups", "next_pos", "log", "bytes", "acks",
                 "delivered", "pending", "acked", "done", "joined_at", "stamps", "view_us",
                 "executed", "done_acked", "intra_sent", "intra_resend_us", "intra_floor",
                 "intra_backoff", "wanted")

    def __init__(self, config: MessagingConfig):
        self.config = config
        self.backups: tuple[int, ...] = ()
        # primary side
        self.next_pos = 1
        self.log: deque[tuple[int, bytes]] = deque()   # (pos, chunk) not acked by all
        self.bytes = 0
        self.acks: dict[int, int] = {}      # backup birth id -> position acked
        self.done: dict[int, int] = {}      # backup birth id -> position executed
        self.joined_at: dict[int, int] = {} # backup -> last position when it appeared
        self.stamps: deque[int] = deque()   # append times (us) of consecutive positions
        self.view_us = 0                    # when this view's log started (position 0)
        self.intra_sent = 0                 # positions sent to the backups as ORDER_INFO
        self.intra_resend_us = 0            # ... unacked ones are sent again from then on
        self.intra_floor = -1               # the floor when they were last sent again
        self.intra_backoff = 0              # ... and the interval's doublings since
        self.wanted = 0                     # an output commit waits until all acked this
        # backup side
        self.delivered = 0                  # delivered up to (this primary view)
        self.pending: dict[int, bytes] = {} # beyond a gap
        self.acked = 0                      # what our last ORDER_INFO acked
        self.executed = 0                   # our application executed up to (runtime)
        self.done_acked = 0                 # what our last ORDER_INFO said of it

    # ---- views ----
    def set_backups(self, backups: list[int], now_us: int = 0) -> None:
        if not self.stamps:
            self.view_us = now_us       # lag ages count from here until a stamp exists
        self.backups = tuple(backups)
        for gone in set(self.acks) - set(self.backups):
            del self.acks[gone]
        for gone in set(self.joined_at) - set(self.backups):
            del self.joined_at[gone]
            self.done.pop(gone, None)
        for b in self.backups:
            self.joined_at.setdefault(b, self.last_pos)
        self._trim_stamps()

    def new_view(self) -> None:
        """A higher primary view: positions restart at 1."""
        self.delivered = 0
        self.pending.clear()
        self.acked = 0
        self.executed = 0
        self.done_acked = 0

    def become_primary(self, now_us: int = 0) -> None:
        self.acks.clear()
        self.done.clear()
        self.joined_at = {b: 0 for b in self.backups}
        self.stamps.clear()
        self.view_us = now_us
        self.next_pos = 1
        self.log.clear()
        self.bytes = 0
        self.pending.clear()
        self.intra_sent = 0
        self.intra_resend_us = 0
        self.intra_floor = -1
        self.intra_backoff = 0
        self.wanted = 0

    # ---- primary side ----
    @property
    def last_pos(self) -> int:
        return self.next_pos - 1

    def append(self, chunk: bytes, now_us: int = 0) -> int:
        """A new chunk's position (kept only while there are backups to hold it)."""
        if self.bytes + len(chunk) > self.config.max_order_info_bytes:
            raise BufferFull("order info not yet acknowledged by the backups")
        pos = self.next_pos
        self.next_pos += 1
        if self.backups:
            self.stamps.append(now_us)
            if len(self.stamps) > MAX_LAG_STAMPS:
                self.stamps.popleft()
        else:
            self.stamps.clear()
        if self.backups:
            self.log.append((pos, bytes(chunk)))
            self.bytes += len(chunk)
        return pos

    def floor(self) -> int:
        """Positions every backup has acked."""
        if not self.backups:
            return self.last_pos
        return min(self.acks.get(b, 0) for b in self.backups)

    def protected(self) -> int:
        """Positions every backup holds (a reflection does not count: module docstring)."""
        return self.floor()

    def unprotected_bytes(self) -> int:
        if not self.backups or not self.log:
            return 0
        lim = self.protected()
        if self.log[0][0] > lim:
            return self.bytes           # (positions ascend: all of it; as after every gc)
        return sum(len(ch) for pos, ch in self.log if pos > lim)

    def section(self, pvn: int, after: int) -> Section | None:
        """The chunks past position `after`, at most max_piggyback_bytes (at least one)."""
        chunks: list[bytes] = []
        first = 0
        size = 0
        for pos, ch in self.log:
            if pos <= after:
                continue
            if chunks and size + len(ch) > self.config.max_piggyback_bytes:
                break
            if not chunks:
                first = pos
            chunks.append(ch)
            size += len(ch)
        return [pvn, first, chunks] if chunks else None

    def piggyback(self, pvn: int) -> Section | None:
        """What a data message to a remote group carries."""
        if not self.backups or not self.log:
            return None
        return self.section(pvn, self.protected())

    def on_ack(self, backup: int, upto: int) -> bool:
        """A backup acked positions up to `upto`; True if that is news."""
        if upto <= self.acks.get(backup, 0):
            return False
        self.acks[backup] = min(upto, self.last_pos)
        return True

    def on_done(self, backup: int, upto: int) -> None:
        """A backup's application executed positions up to `upto`."""
        if upto > self.done.get(backup, 0):
            self.done[backup] = min(upto, self.last_pos)
            self._trim_stamps()

    def unacked_since(self) -> int:
        """When the oldest position not every backup acked was appended; 0 if its stamp
        is gone (a joiner that has not acked up to where it joined holds the floor below
        the stamps, which its peers' execution trims: the oldest stamp kept is younger
        than that position, and going by it would put off the direct send for as long as
        they execute)."""
        pos = self.floor() + 1
        if pos < self.next_pos - len(self.stamps):
            return 0
        return self._stamp_of(pos)

    def _stamp_of(self, pos: int) -> int:
        """When position `pos` was appended (the oldest stamp kept if older)."""
        first = self.next_pos - len(self.stamps)     # position of stamps[0]
        if not self.stamps:
            return self.view_us
        return self.stamps[max(0, min(pos - first, len(self.stamps) - 1))]

    def _trim_stamps(self) -> None:
        if not self.backups:
            self.stamps.clear()
            return
        floor = min(max(self.done.get(b, 0), self.joined_at.get(b, 0)) for b in self.backups)
        first = self.next_pos - len(self.stamps)
        for _ in range(min(len(self.stamps), floor + 1 - first)):
            self.stamps.popleft()

    def lag(self, backup: int, now_us: int) -> tuple[int, int]:
        """(positions not executed, age in us of the oldest of them) of `backup`."""
        done = self.done.get(backup, 0)
        behind = self.last_pos - done
        if behind <= 0:
            return 0, 0
        return behind, max(0, now_us - self._stamp_of(done + 1))

    def caught_up_once(self, backup: int) -> bool:
        """The backup executed a position made after it joined: it has replayed the history
        it was given. For the backups a new primary inherits (joined at 0) that is the
        view's first position, which one still replaying the last view's history executes
        only once that replay is done (docs/LOG.md, "Joiners")."""
        return self.done.get(backup, 0) > self.joined_at.get(backup, 0)

    def gc(self) -> None:
        """Drop what every backup holds."""
        floor = self.floor()
        while self.log and self.log[0][0] <= floor:
            _, ch = self.log.popleft()
            self.bytes -= len(ch)

    # ---- backup side ----
    def accept(self, first: int, chunks: list[bytes]) -> list[tuple[int, bytes]]:
        """Chunks of this view from position `first`: the (pos, chunk) now deliverable."""
        for i, ch in enumerate(chunks):
            pos = first + i
            if pos <= self.delivered:
                continue
            if pos - self.delivered > self.config.max_order_info_pending:
                break
            self.pending[pos] = ch
        out = []
        while self.delivered + 1 in self.pending:
            self.delivered += 1
            out.append((self.delivered, self.pending.pop(self.delivered)))
        return out

    def check(self) -> None:
        assert self.bytes == sum(len(ch) for _, ch in self.log), "order-info bytes"
        assert all(pos <= self.last_pos for pos, _ in self.log), "beyond the last position"
        assert all(pos > self.delivered for pos in self.pending), "pending at or below delivered"
        assert len(self.stamps) <= min(MAX_LAG_STAMPS, self.last_pos), "lag stamps"
        assert all(d <= self.last_pos for d in self.done.values()), "done beyond the log"
        assert self.executed <= self.delivered, "executed beyond delivered"
