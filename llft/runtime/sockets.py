"""`StreamSocket`: the TCP connection of one stream, as an asyncio protocol.

A stream of a group connection ends in a real TCP connection at both sides: the
gateway's accepted client, an agent's loopback connection to its app. Both read what
arrives and frame it into the group connection, write what the group delivered, and
pass the ends (FIN, reset) on in order. They did so with asyncio's streams: a reader
task per connection that woke for every read (a future, a task step, a loop turn) and a
writer's `drain()`. Here the loop's callbacks do the work directly:

- reads land in the owner's one buffer (`get_buffer`: READ_BYTES at most per read) and
  are copied out to `data()` at once; a producer that must not read further (its group
  connection's outbox is full, the remote grants no more, its client reads no replies)
  calls `pause_reading_until(ready)`: reading resumes once the owner's `ready()` says so,
  one such wait at a time, cancelled when the connection goes;
- writes go to the transport; `write_paused` follows its high-water mark (the limits
  the owner set), `writable()` waits until it drained to the low-water mark, and
  `writable_again()` is called then (the owner refills from what it holds);
- ends: `ended_by(abort)` once, at the peer's FIN (`eof_received`; the socket stays
  open for our writes: a half-close), at a reset (`connection_lost` with an error), or
  when the connection goes otherwise; `reset_after_flush()` sends a RST after every byte
  written so far.

Every call into the owner goes through `_call` (the subclass's: the agent stops on a
failure as on a failed task; the gateway drops that client), not through asyncio, which
would take any exception for the end of this one connection.
"""
from __future__ import annotations

import asyncio
import errno
import select
import socket
import struct
from typing import Awaitable, Callable

READ_BYTES = 64 << 10           # what one read takes at most (the owner's buffer)


def connect_at_once(where: tuple[str, int]) -> socket.socket | None:
    """A non-blocking TCP socket connected to `where`, if the handshake completed within
    the connect call, else None (the caller connects the usual way and gets its error).
    On loopback the kernel runs the whole handshake inside connect() while the listener's
    backlog has room: the socket is writable at once, and asyncio's `create_connection`
    (a writer registered, a loop turn, the writer removed, a future) is not needed for it
    -- a tenth of an agent's time with a connection per request."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)   # EMFILE: the caller's
    try:
        sock.setblocking(False)
        err = sock.connect_ex(where)
        if err == errno.EINPROGRESS:
            poll = select.poll()
            poll.register(sock, select.POLLOUT)
            err = (sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if poll.poll(0)
                   else errno.EINPROGRESS)
        if err == 0:
            return sock
    except OSError:
        pass
    sock.close()
    return None


def read_buffer() -> bytearray:
    """A buffer for every StreamSocket of one event loop (each read is copied out at once)."""
    return bytearray(READ_BYTES)


class StreamSocket(asyncio.BufferedProtocol):
    def __init__(self, buf: bytearray):
        self.transport: asyncio.Transport | None = None
        self.ended = False                   # ended_by was called
        self.write_paused = False            # above the transport's high-water mark
        self._buf = buf
        self._writable: asyncio.Future | None = None
        self._resume: asyncio.Task | None = None    # a pause_reading_until wait

    # -- the owner's side (subclasses) -------------------------------------------------
    def _call(self, name: str, fn: Callable, *args) -> None:
        fn(*args)

    def _spawn(self, coro, name: str) -> asyncio.Task:
        """Start a task of the owner's (its TaskSet, its set of tasks)."""
        return asyncio.ensure_future(coro)

    def made(self) -> None:
        """Connected (`self.transport` is set)."""

    def data(self, data: bytes) -> None:
        """Bytes read, in order."""

    def ended_by(self, abort: bool) -> None:
        """The peer ended its side (abort: a reset), or the connection is gone."""

    def writable_again(self) -> None:
        """The transport's buffer drained to its low-water mark."""

    # -- asyncio's side ----------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self._call("connected", self.made)

    def get_buffer(self, sizehint: int):
        return self._buf

    def buffer_updated(self, nbytes: int) -> None:
        self._call("data", self.data, bytes(self._buf[:nbytes]))

    def eof_received(self) -> bool:
        self._end(False)
        return True                      # half-closed: the peer still reads our writes

    def connection_lost(self, exc) -> None:
        self.write_paused = False
        self._wake()
        if self._resume is not None:
            self._resume.cancel()               # nothing more to read
        self._end(exc is not None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake()
        self._call("writable", self.writable_again)

    def _end(self, abort: bool) -> None:
        if not self.ended:
            self.ended = True
            self._call("ended", self.ended_by, abort)

    def _wake(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- waiting -----------------------------------------------------------------------
    def pause_reading_until(self, ready: Callable[[], Awaitable[bool]]) -> None:
        """Read no more until `await ready()` returns True (False: stay paused)."""
        self.transport.pause_reading()
        if self._resume is None or self._resume.done():
            self._resume = self._spawn(self._resume_when(ready), "resume-reading")

    async def _resume_when(self, ready: Callable[[], Awaitable[bool]]) -> None:
        if await ready() and not self.transport.is_closing():
            self.transport.resume_reading()

    async def writable(self) -> None:
        """Until the transport's buffer is below its high-water mark again (at once if
        it is) or the connection is gone."""
        while self.write_paused and not self.transport.is_closing():
            self._writable = asyncio.get_running_loop().create_future()
            await self._writable

    async def reset_after_flush(self) -> None:
        """A reset after every byte written so far: the peer's recv fails with
        ECONNRESET only once it has them all (SO_LINGER 0, then abort)."""
        t = self.transport
        t.set_write_buffer_limits(high=0)    # paused until the buffer is empty
        await self.writable()
        if t.is_closing():
            return                           # the peer reset it meanwhile
        sock = t.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        t.abort()
