"""One timer registry for the messaging core: a deadline per (timer kind, key).

The key is None for the endpoint's own timers and the connection's ConnId for the
per-connection ones. A deadline is set, armed (set unless set), moved earlier
(`arm_earlier`) or cleared; nothing else stores a time to act at. `next_us()` is the
earliest deadline (the driver's next wake-up); `expired()` says whether a timer is due;
`pop_due(now)` lists the timers due now. The endpoint fires due timers in the order of
`Timer` (endpoint timers first, then each connection's in connection order), so a run
does not depend on the registry's order.

The deadlines live in a dict (the truth) and a heap of (deadline, kind, key) entries,
pushed at every set; an entry whose deadline is no longer the dict's is stale and
skipped when it reaches the top (lazy deletion; the heap is rebuilt when stale entries
outnumber live ones). So the earliest deadline and the due timers cost O(log n) per
change, not a scan of every connection's timers after every event.
"""
from __future__ import annotations

import enum
import heapq
import itertools
from typing import Hashable


class Timer(enum.Enum):
    # the endpoint's own (key None), in firing order
    HEARTBEAT = "heartbeat"                 # HEARTBEAT to the group every heartbeat_us
    WATERMARK_REPORT = "watermark_report"   # backup: an early HEARTBEAT, its watermark rose
    ORDER_INFO_INTRA = "order_info_intra"   # primary: ORDER_INFO for chunks not acked yet
    ORDER_INFO_ACK = "order_info_ack"       # backup: ack delivered order info
    PROBE_ANSWER = "probe_answer"           # answer the PROBEs handled (at once)
    # per connection (key ConnId), in firing order
    THROTTLE_END = "throttle_end"           # primary: intra-group flow control lifts
    NEW_PRIMARY_VIEW = "new_primary_view"   # new primary: (re)send NEW_PRIMARY_VIEW
    RETRANSMIT = "retransmit"               # primary: unacked data goes out again
    NACK = "nack"                           # gaps: nack them (remote or local connection)
    FIRST_ACK = "first_ack"                 # primary: acknowledge received data
    KEEPALIVE = "keepalive"                 # primary: idle connection, or watermark news
    SOLICIT = "solicit"                     # primary: ask an idle remote primary for news
    REMOTE_SILENCE = "remote_silence"       # primary: the remote group silent too long?

    __hash__ = object.__hash__      # a singleton: identity, in C (membership's Status too)


ENDPOINT_TIMERS = (Timer.HEARTBEAT, Timer.WATERMARK_REPORT, Timer.ORDER_INFO_INTRA,
                   Timer.ORDER_INFO_ACK, Timer.PROBE_ANSWER)
CONNECTION_TIMERS = tuple(t for t in Timer if t not in ENDPOINT_TIMERS)
# whose duty each timer is (the others run in both roles: HEARTBEAT, THROTTLE_END, NACK);
# one of the other role that comes due (armed before a change of role) is cleared
PRIMARY_TIMERS = frozenset({Timer.ORDER_INFO_INTRA, Timer.NEW_PRIMARY_VIEW, Timer.RETRANSMIT,
                            Timer.FIRST_ACK, Timer.KEEPALIVE, Timer.SOLICIT,
                            Timer.REMOTE_SILENCE})
BACKUP_TIMERS = frozenset({Timer.WATERMARK_REPORT, Timer.ORDER_INFO_ACK})


class Timers:
    __slots__ = ("_due", "_heap", "_seq")

    def __init__(self) -> None:
        self._due: dict[tuple[Timer, Hashable], int] = {}
        # (deadline, tie-break, (kind, key)); the tie-break keeps keys uncompared
        self._heap: list[tuple[int, int, tuple[Timer, Hashable]]] = []
        self._seq = itertools.count()

    def due(self, kind: Timer, key: Hashable = None) -> int | None:
        return self._due.get((kind, key))

    def _put(self, k: tuple[Timer, Hashable], at_us: int) -> None:
        self._due[k] = at_us
        heapq.heappush(self._heap, (at_us, next(self._seq), k))
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._due):
            self._heap = [(d, next(self._seq), x) for x, d in self._due.items()]
            heapq.heapify(self._heap)

    def set(self, kind: Timer, key: Hashable, at_us: int | None) -> None:
        """Set a deadline (None clears it)."""
        if at_us is None:
            self._due.pop((kind, key), None)
        else:
            self._put((kind, key), at_us)

    def arm(self, kind: Timer, key: Hashable, at_us: int) -> None:
        """Set the deadline unless one is set already."""
        if (kind, key) not in self._due:
            self._put((kind, key), at_us)

    def arm_earlier(self, kind: Timer, key: Hashable, at_us: int) -> None:
        """Set the deadline unless one at least as early is set already."""
        d = self._due.get((kind, key))
        if d is None or at_us < d:
            self._put((kind, key), at_us)

    def clear(self, kind: Timer, key: Hashable = None) -> None:
        self._due.pop((kind, key), None)

    def expired(self, kind: Timer, key: Hashable, now_us: int) -> bool:
        d = self._due.get((kind, key))
        return d is not None and d <= now_us

    def _top(self) -> tuple[int, int, tuple[Timer, Hashable]] | None:
        """The heap's earliest live entry (stale ones above it are dropped)."""
        heap, due = self._heap, self._due
        while heap:
            top = heap[0]
            if due.get(top[2]) == top[0]:
                return top
            heapq.heappop(heap)
        return None

    def next_us(self) -> int | None:
        top = self._top()
        return None if top is None else top[0]

    def pop_due(self, now_us: int) -> list[tuple[Timer, Hashable]]:
        """The timers due at now_us, each once, out of the heap (they stay set: the
        caller fires them, and each handler sets, re-arms or clears its own; `keep()`
        puts one back that is still due afterwards)."""
        out: dict[tuple[Timer, Hashable], None] = {}    # an entry may be pushed twice
        while (top := self._top()) is not None and top[0] <= now_us:
            heapq.heappop(self._heap)
            out[top[2]] = None
        return list(out)

    def keep(self, k: tuple[Timer, Hashable]) -> None:
        """Back into the heap after firing: a popped timer that is still set (its
        handler may have left its deadline as it was)."""
        d = self._due.get(k)
        if d is not None:
            heapq.heappush(self._heap, (d, next(self._seq), k))

    def keys(self) -> list[tuple[Timer, Hashable]]:
        return list(self._due)

    def __len__(self) -> int:
        return len(self._due)
