"""Adaptive silence timeouts: how long a peer may stay silent before we act on it.

Theory of operation
-------------------
Every membership timeout that removes or replaces a member (a backup's fault detector
on its primary, the primary's removal of a silent backup, the ack timeout of a
membership change or of a proposal) starts from a configured value, the *floor*, and
may be extended for one peer by what that peer's own timing has shown:

    gaps        the inter-arrival times of the peer's messages, the last
                `ARRIVAL_WINDOW` of them (running sum and sum of squares for the mean
                and standard deviation; a monotonic deque for the window's maximum)
    expected    the longest silence that is not improbable for this peer:
                max(longest gap in the window, mean + SIGMAS * stddev)
    timeout     floor + min(cap, max(0, MARGIN * expected - reference))

`reference` is the floor of the rank-2 detector (or the timeout itself for the other
timeouts), so that every rank adds the same extension and the ranks keep their order;
`cap` (Config.adaptive_cap_us, by default 3 x the base timeout) bounds the extension,
so a real death is detected at most `cap` later than with the configured timeouts.
A peer with fewer than KNOWN_AFTER gaps (a new member, the primary of a view just
joined) borrows the history of the slowest well-known peer (membership/core.py,
`_extension_us`): a busy machine slows every process on it. At the primary, such a
member that is still waiting for or receiving the group's state gets the whole cap:
restoring the group's log is the heaviest moment of a replica's life.

A machine whose peers answer every few ms never extends anything: MARGIN * expected
stays below the floor. A peer that was starved for 80 ms and came back has shown that
80 ms of silence is not death: its detectors wait up to 160 ms (+ rank) from then on,
until that gap leaves the window.

What this replica itself causes is not learned: a local stall (membership/core.py,
`_forgive_stall`) shifts the arrival times forward by the stall before the next gap
is measured. Times are integers in microseconds from the caller (`now_us`); the
arithmetic is deterministic, so the simulator replays it exactly.
"""
from __future__ import annotations

import math
from collections import deque

ARRIVAL_WINDOW = 2_048     # inter-arrival gaps remembered per peer (~10 s of heartbeats at
                           # 5 ms; llft/replica/node.py); `window_for` scales it
KNOWN_AFTER = 64           # gaps before a peer's own history is trusted over its peers'
WINDOW_SPAN_US = 10_240_000  # what the window spans in time, at any heartbeat interval
SIGMAS = 4                 # mean + SIGMAS * stddev: a silence beyond it is improbable
MARGIN = 2                 # wait MARGIN x the longest expected silence before acting


def window_for(heartbeat_interval_us: int) -> tuple[int, int]:
    """(window, known_after) in gaps for a heartbeat interval: the same ~10 s of history
    and ~0.3 s before a peer's own gaps count, whatever the interval."""
    per = max(1, heartbeat_interval_us)
    return (max(64, WINDOW_SPAN_US // per),
            max(16, KNOWN_AFTER * WINDOW_SPAN_US // ARRIVAL_WINDOW // per))


class ArrivalStats:
    """Inter-arrival times of one peer's messages over a bounded window."""

    __slots__ = ("last_us", "_gaps", "_maxq", "_n", "_sum", "_sumsq", "_window", "_known_after")

    def __init__(self, now_us: int, window: int = ARRIVAL_WINDOW,
                 known_after: int = KNOWN_AFTER) -> None:
        self._window, self._known_after = window, known_after
        self.last_us = now_us                 # arrival of its latest message
        self._gaps: deque[int] = deque()
        self._maxq: deque[tuple[int, int]] = deque()   # (index, gap), gaps decreasing
        self._n = 0
        self._sum = 0
        self._sumsq = 0

    def arrived(self, now_us: int) -> None:
        gap = max(0, now_us - self.last_us)
        self.last_us = max(self.last_us, now_us)
        self._gaps.append(gap)
        self._sum += gap
        self._sumsq += gap * gap
        if len(self._gaps) > self._window:
            old = self._gaps.popleft()
            self._sum -= old
            self._sumsq -= old * old
        i = self._n
        self._n += 1
        while self._maxq and self._maxq[-1][1] <= gap:
            self._maxq.pop()
        self._maxq.append((i, gap))
        while self._maxq[0][0] <= i - self._window:
            self._maxq.popleft()

    def shift(self, stall_us: int, now_us: int) -> None:
        """This replica stalled: its own pause is no silence of the peer."""
        self.last_us = min(now_us, self.last_us + stall_us)

    def known(self) -> bool:
        return len(self._gaps) >= self._known_after

    def expected_silence_us(self) -> int:
        n = len(self._gaps)
        if n == 0:
            return 0
        mean = self._sum / n
        var = max(0.0, self._sumsq / n - mean * mean)
        return max(self._maxq[0][1], int(mean + SIGMAS * math.sqrt(var)))


def extension_us(stats: ArrivalStats | None, reference_us: int, cap_us: int) -> int:
    """How much longer than its floor a timeout on this peer waits (0 .. cap_us)."""
    if stats is None:
        return 0
    return min(cap_us, max(0, MARGIN * stats.expected_silence_us() - reference_us))
