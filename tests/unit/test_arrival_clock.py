"""The kernel's arrival stamp of a datagram on the monotonic clock (transport.ArrivalClock),
over a real loopback socket: believed when it is plausible, and still read right when the
realtime clock moved since the offset was taken (a stamp from the future is a stale
offset, not a datagram not yet arrived: most of a profile's stamps were lost so)."""
from __future__ import annotations

import socket
import time

from llft.runtime.transport import ArrivalClock


def _pair():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ArrivalClock.enable(rx)
    return rx, tx


def _arrival(clock: ArrivalClock, rx, tx) -> tuple[int | None, int, int]:
    before = time.monotonic_ns() // 1000
    tx.sendto(b"x", rx.getsockname())
    rx.recv(16)
    return clock.arrival_us(rx), before, time.monotonic_ns() // 1000


def test_the_stamp_falls_between_the_send_and_the_read():
    rx, tx = _pair()
    clock = ArrivalClock()
    for _ in range(5):
        at, before, after = _arrival(clock, rx, tx)
        assert at is not None and before - 1000 <= at <= after + 1000, (before, at, after)
    rx.close()
    tx.close()


def test_a_realtime_clock_moved_since_the_offset_was_taken():
    rx, tx = _pair()
    clock = ArrivalClock()
    _arrival(clock, rx, tx)                 # the offset taken now ...
    clock._offset_ns -= 5_000_000           # ... then the realtime clock ran 5 ms ahead
    at, before, after = _arrival(clock, rx, tx)
    assert at is not None and before - 1000 <= at <= after + 1000, (before, at, after)
    rx.close()
    tx.close()
