"""`Outbox`: the framed output of one group connection on its way into messaging.

Both ends of a group connection (the gateway, an agent) write many streams into one
messaging connection (llft/protocol/streams.py). Each producer (a client's or an app
socket's reader) appends whole frames to the connection's outbox in one synchronous step,
so frames never interleave; the outbox gives messaging as many bytes as it admits
(`send`), and when messaging is full or may not take output yet (`ready()` false: output
commit at a primary) one task waits for the driver's progress and pushes again.

When to push (Nagle's rule, per group connection): output put while the connection has
nothing of ours in flight goes at once (a lone request/reply exchange pays no extra loop
turn); output put while messages are in flight waits for the end of this turn of the
event loop (one `call_soon`), so the replies of many streams read meanwhile share
messages instead of taking one each (16 echo clients, one replica: ~3,200 req/s pushing
every frame at once, ~5,500 coalescing).
Producers call `room()` before they read more: while the outbox holds HIGH_BYTES they
wait until it drained below LOW_BYTES, so load beyond what the group connection carries
waits in the producers' sockets (TCP flow control) instead of in memory.

Bounds: HIGH_BYTES of frames per group connection beyond messaging's own queue.
"""
from __future__ import annotations

import asyncio
from typing import Callable

HIGH_BYTES = 256 << 10          # producers wait while the outbox holds this much ...
LOW_BYTES = 64 << 10            # ... until it is below this


class Outbox:
    def __init__(self, driver, send: Callable[[memoryview], int],
                 ready: Callable[[], bool] = lambda: True,
                 spawn: Callable[..., asyncio.Task] | None = None,
                 in_flight: Callable[[], int] = lambda: 0):
        self.driver = driver
        self._send = send               # bytes -> how many messaging accepted
        self._ready = ready             # may output go to messaging now?
        self._in_flight = in_flight     # our messages on the connection not yet covered
        self._spawn = spawn or (lambda coro, name: asyncio.ensure_future(coro))
        self.buf = bytearray()
        self._room = asyncio.Event()
        self._room.set()
        self._waiter: asyncio.Task | None = None
        self._then: Callable[[], None] | None = None    # once everything went out
        self._soon: asyncio.Handle | None = None
        self.closed = False
        self.pushed_bytes = 0
        self.waits = 0                  # times the outbox had to wait for messaging

    def put(self, data: bytes) -> None:
        """Append frames: at once on an idle connection, else with the rest of this
        loop turn's (see the module docstring)."""
        idle = not self.buf and self._soon is None
        self.buf += data
        if idle and not self._in_flight():
            self.push()
        elif self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self.push)
        if len(self.buf) >= HIGH_BYTES:
            self._room.clear()

    def push(self) -> None:
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self.closed:
            return
        if self.buf and self._ready():
            n = self._send(memoryview(self.buf))
            if n:
                del self.buf[:n]
                self.pushed_bytes += n
        if self.buf and (self._waiter is None or self._waiter.done()):
            self.waits += 1
            self._waiter = self._spawn(self._wait_and_push(), "outbox")
        if len(self.buf) >= HIGH_BYTES:
            self._room.clear()
        elif len(self.buf) < LOW_BYTES:
            self._room.set()
        if not self.buf and self._then is not None:
            then, self._then = self._then, None
            then()

    def finish(self, then: Callable[[], None]) -> None:
        """Call `then` once every byte put so far went to messaging (now, if none is
        left): the connection's own end goes after its last frame."""
        self._then = then
        self.push()

    async def _wait_and_push(self) -> None:
        while self.buf and not self.closed:
            self.driver.progress.clear()
            await self.driver.progress.wait()
            self.push()

    @property
    def empty(self) -> bool:
        return not self.buf

    @property
    def has_room(self) -> bool:
        """Below the high-water mark: producers may read more now."""
        return self._room.is_set()

    async def room(self) -> None:
        """Return once the outbox is below its high-water mark (at once if it is)."""
        if not self._room.is_set():
            await self._room.wait()

    def close(self) -> None:
        """Nothing more goes out (the connection or the app is gone): wake the producers."""
        self.closed = True
        self.buf.clear()
        if self._soon is not None:
            self._soon.cancel()
        self._room.set()
        if self._waiter is not None:
            self._waiter.cancel()
