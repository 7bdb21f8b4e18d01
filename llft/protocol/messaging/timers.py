"""One timer registry for the messaging core: a deadline per (timer kind, key).

The key is None for the endpoint's own timers and the connection's ConnId for the
per-connection ones. A deadline is set, armed (set unless set), moved earlier
(`arm_earlier`) or cleared; nothing else stores a time to act at. `next_us()` is the
earliest deadline (the driver's next wake-up); `expired()` says whether a timer is due.
The endpoint fires due timers in the order of `Timer` (endpoint timers first, then each
connection's in connection order), so a run does not depend on the registry's order.
"""
from __future__ import annotations

import enum
from typing import Hashable


class Timer(enum.Enum):
    # the endpoint's own (key None), in firing order
    HEARTBEAT = "heartbeat"                 # HEARTBEAT to the group every heartbeat_us
    WATERMARK_REPORT = "watermark_report"   # backup: an early HEARTBEAT, its watermark rose
    ORDER_INFO_INTRA = "order_info_intra"   # primary: ORDER_INFO for chunks not acked yet
    ORDER_INFO_ACK = "order_info_ack"       # backup: ack delivered order info
    # per connection (key ConnId), in firing order
    THROTTLE_END = "throttle_end"           # primary: intra-group flow control lifts
    NEW_PRIMARY_VIEW = "new_primary_view"   # new primary: (re)send NEW_PRIMARY_VIEW
    RETRANSMIT = "retransmit"               # primary: unacked data goes out again
    NACK = "nack"                           # gaps: nack them (remote or local connection)
    FIRST_ACK = "first_ack"                 # primary: acknowledge received data
    KEEPALIVE = "keepalive"                 # primary: idle connection, or watermark news
    SOLICIT = "solicit"                     # primary: ask an idle remote primary for news


ENDPOINT_TIMERS = (Timer.HEARTBEAT, Timer.WATERMARK_REPORT, Timer.ORDER_INFO_INTRA,
                   Timer.ORDER_INFO_ACK)
CONNECTION_TIMERS = tuple(t for t in Timer if t not in ENDPOINT_TIMERS)
# whose duty each timer is (the others run in both roles: HEARTBEAT, THROTTLE_END, NACK);
# one of the other role that comes due (armed before a change of role) is cleared
PRIMARY_TIMERS = frozenset({Timer.ORDER_INFO_INTRA, Timer.NEW_PRIMARY_VIEW, Timer.RETRANSMIT,
                            Timer.FIRST_ACK, Timer.KEEPALIVE, Timer.SOLICIT})
BACKUP_TIMERS = frozenset({Timer.WATERMARK_REPORT, Timer.ORDER_INFO_ACK})


class Timers:
    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: dict[tuple[Timer, Hashable], int] = {}

    def due(self, kind: Timer, key: Hashable = None) -> int | None:
        return self._due.get((kind, key))

    def set(self, kind: Timer, key: Hashable, at_us: int | None) -> None:
        """Set a deadline (None clears it)."""
        if at_us is None:
            self._due.pop((kind, key), None)
        else:
            self._due[(kind, key)] = at_us

    def arm(self, kind: Timer, key: Hashable, at_us: int) -> None:
        """Set the deadline unless one is set already."""
        self._due.setdefault((kind, key), at_us)

    def arm_earlier(self, kind: Timer, key: Hashable, at_us: int) -> None:
        """Set the deadline unless one at least as early is set already."""
        d = self._due.get((kind, key))
        if d is None or at_us < d:
            self._due[(kind, key)] = at_us

    def clear(self, kind: Timer, key: Hashable = None) -> None:
        self._due.pop((kind, key), None)

    def expired(self, kind: Timer, key: Hashable, now_us: int) -> bool:
        d = self._due.get((kind, key))
        return d is not None and d <= now_us

    def next_us(self) -> int | None:
        return min(self._due.values(), default=None)

    def keys(self) -> list[tuple[Timer, Hashable]]:
        return list(self._due)

    def __len__(self) -> int:
        return len(self._due)
