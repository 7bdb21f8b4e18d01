"""`StreamSocket`: the connection of one stream, as an asyncio protocol.

A stream of a group connection ends in a real connection at both sides: the gateway's
accepted TCP client, an agent's connection to its app (a UNIX socket). Both read what
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

The transports under them are not asyncio's but `LeanTransport`s (accepted by a
`LeanServer` at the gateway, made by `connect_lean` at an agent): the same calls in the
same order (tests/unit/test_lean_transport.py runs each scenario on both and compares),
at about two thirds of the CPU per short connection.

Every call into the owner goes through `_call` (the subclass's: the agent stops on a
failure as on a failed task; the gateway drops that client), not through asyncio, which
would take any exception for the end of this one connection.
"""
from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import struct
from typing import Awaitable, Callable

READ_BYTES = 64 << 10           # what one read takes at most (the owner's buffer)


Address = tuple[str, int] | bytes     # TCP (host, port), or a UNIX socket's address


def stream_socket(where: Address) -> socket.socket:
    """A stream socket of the family `where` is in (bytes: AF_UNIX)."""
    return socket.socket(socket.AF_UNIX if isinstance(where, bytes) else socket.AF_INET,
                         socket.SOCK_STREAM)


def connect_at_once(where: Address) -> socket.socket | None:
    """A non-blocking stream socket connected to `where`, if the connection completed
    within the connect call, else None (the caller connects the usual way and gets its
    error). On loopback (and on a UNIX socket) the kernel completes it inside connect()
    while the listener's backlog has room: the socket is writable at once, and asyncio's
    `create_connection` (a writer registered, a loop turn, the writer removed, a future)
    is not needed for it -- a tenth of an agent's time with a connection per request."""
    sock = stream_socket(where)   # EMFILE: the caller's
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


class LeanTransport(asyncio.Transport):
    """A connected TCP socket on the loop's selector, for a StreamSocket: the part of
    asyncio's socket transport the agent and the gateway use (write with high/low-water
    marks, write_eof after the buffer, close, abort, pause/resume reading), with the
    same rules and order of calls, and nothing else.

    Why not asyncio's: with a connection per request every stream makes and ends a TCP
    connection at the gateway and at each replica's agent, and asyncio spends per
    connection a task (accepted) or a coroutine and future (connected), three scheduled
    callbacks and a loop turn before the first read, and `getsockname`/`getpeername`
    calls nobody reads: ~40-55 µs of CPU of a ~110-180 µs connection here (connect,
    write 1 KB, half-close, read to EOF, close; docs/BENCHMARKS.md "Lean transports").
    Here the protocol's `connection_made` runs at once and reading starts after it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol: asyncio.BaseProtocol, peername=None):
        super().__init__()
        self._loop, self._sock, self._fd, self._protocol = loop, sock, sock.fileno(), protocol
        self._peername = peername
        self._buffer = bytearray()
        self._closing = False           # close() or abort() called, or a fatal error
        self._lost = False              # connection_lost is scheduled
        self._eof = False               # write_eof called
        self._read_eof = False          # the peer's FIN was read
        self._paused = False            # pause_reading called
        self._protocol_paused = False   # pause_writing called
        self._high, self._low = 64 << 10, 16 << 10     # asyncio's defaults
        self._reader = self._writer = False     # registered with the loop's selector
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # as asyncio's does
        protocol.connection_made(self)
        if not self._closing and not self._paused:
            self._watch_read(True)

    def _watch_read(self, on: bool) -> None:
        """Only changes are passed on: the selector's lookup of an fd it does not hold
        raises a KeyError with a formatted message (3 a connection, ~10 µs)."""
        if on != self._reader:
            self._reader = on
            if on:
                self._loop.add_reader(self._fd, self._read_ready)
            else:
                self._loop.remove_reader(self._fd)

    def _watch_write(self, on: bool) -> None:
        if on != self._writer:
            self._writer = on
            if on:
                self._loop.add_writer(self._fd, self._write_ready)
            else:
                self._loop.remove_writer(self._fd)

    # -- reading -----------------------------------------------------------------------
    def _read_ready(self) -> None:
        if self._lost:
            return
        try:
            nbytes = self._sock.recv_into(self._protocol.get_buffer(-1))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        if nbytes:
            self._protocol.buffer_updated(nbytes)
            return
        self._read_eof = True
        self._watch_read(False)
        if not self._protocol.eof_received():
            self.close()

    def is_reading(self) -> bool:
        return not self._closing and not self._paused

    def pause_reading(self) -> None:
        if self.is_reading():
            self._paused = True
            self._watch_read(False)

    def resume_reading(self) -> None:
        if self._closing or not self._paused:
            return
        self._paused = False
        if not self._read_eof:
            self._watch_read(True)

    # -- writing -----------------------------------------------------------------------
    def write(self, data) -> None:
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data or self._lost:
            return
        if not self._buffer:
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self._force_close(exc)
                return
            if n == len(data):
                return
            data = memoryview(data)[n:]
            self._watch_write(True)
        self._buffer += data
        self._maybe_pause_protocol()

    def _write_ready(self) -> None:
        if self._lost:
            return
        try:
            n = self._sock.send(self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._watch_write(False)
            self._buffer.clear()
            self._force_close(exc)
            return
        del self._buffer[:n]
        self._maybe_resume_protocol()
        if not self._buffer:
            self._watch_write(False)
            if self._closing:
                self._call_connection_lost(None)
            elif self._eof:
                self._shutdown_write()

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        if not self._buffer:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:          # the peer reset it meanwhile
            self._force_close(exc)

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 << 10 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause_protocol()

    def _maybe_pause_protocol(self) -> None:
        if len(self._buffer) > self._high and not self._protocol_paused:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _maybe_resume_protocol(self) -> None:
        if self._protocol_paused and len(self._buffer) <= self._low:
            self._protocol_paused = False
            self._protocol.resume_writing()

    # -- ending ------------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stop reading; connection_lost(None) once the buffer is written."""
        if self._closing:
            return
        self._closing = True
        self._watch_read(False)
        if not self._buffer:
            self._lost = True
            self._watch_write(False)
            self._loop.call_soon(self._call_connection_lost, None)

    def abort(self) -> None:
        self._force_close(None)

    def _force_close(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._watch_write(False)
        if not self._closing:
            self._closing = True
            self._watch_read(False)
        self._lost = True
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    # -- the rest of the Transport interface -------------------------------------------
    def get_extra_info(self, name: str, default=None):
        if name == "socket":
            return self._sock
        if name == "peername":
            if self._peername is None:
                try:
                    self._peername = self._sock.getpeername()
                except OSError:
                    return default
            return self._peername
        if name == "sockname":
            try:
                return self._sock.getsockname()
            except OSError:
                return default
        return default

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol


async def connect_lean(loop: asyncio.AbstractEventLoop, where: Address,
                       protocol_factory: Callable[[], asyncio.BaseProtocol]) -> LeanTransport:
    """A LeanTransport connected to `where` (OSError if it cannot be)."""
    sock = connect_at_once(where)
    if sock is None and isinstance(where, bytes):
        sock = await _connect_unix(where)
    if sock is None:
        sock = stream_socket(where)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, where)
        except BaseException:
            sock.close()
            raise
    return LeanTransport(loop, sock, protocol_factory())


UNIX_RETRY_S = (0.001, 0.05)     # first and longest wait for room in a UNIX accept queue


async def _connect_unix(where: bytes) -> socket.socket:
    """A UNIX stream socket connected to `where`. Its listener's accept queue is full
    (net.core.somaxconn connections the app has not accepted: a joiner's agent connects
    a history's worth at once): a non-blocking connect fails with EAGAIN and is tried
    again, waiting a little longer each time, until the app accepts (a loopback TCP
    connect waited for a SYN retransmission instead: 1 s, then 3 s)."""
    sock = stream_socket(where)
    try:
        sock.setblocking(False)
        wait = UNIX_RETRY_S[0]
        while (err := sock.connect_ex(where)) == errno.EAGAIN:
            await asyncio.sleep(wait)
            wait = min(2 * wait, UNIX_RETRY_S[1])
        if err:
            raise OSError(err, os.strerror(err))
    except BaseException:
        sock.close()
        raise
    return sock


class LeanServer:
    """Listening sockets whose accepted connections become LeanTransports (asyncio's
    server spends a task per accepted connection). Like asyncio's: every address `host`
    resolves to, SO_REUSEADDR, up to `backlog` accepts per wake-up, and a pause of a
    second when the process is out of descriptors (Linux keeps reporting the socket)."""

    ACCEPT_RETRY_S = 1.0

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                 backlog: int = 100, on_error: Callable[[OSError], None] | None = None):
        self._loop, self._factory, self._backlog = loop, protocol_factory, backlog
        self._on_error = on_error
        self.sockets: list[socket.socket] = []
        try:
            for family, type_, proto, _, addr in socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
                try:
                    sock = socket.socket(family, type_, proto)
                except OSError:
                    continue        # a family this host lacks (asyncio skips it too)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(backlog)
                sock.setblocking(False)
            if not self.sockets:
                raise OSError(f"no socket can be made for {host!r}")
        except BaseException:
            self.close()
            raise
        for sock in self.sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(self._backlog):
            try:
                conn, addr = sock.accept()
                conn.setblocking(False)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                if self._on_error is not None:
                    self._on_error(exc)
                self._loop.remove_reader(sock.fileno())
                self._loop.call_later(self.ACCEPT_RETRY_S, self._resume, sock)
                return
            LeanTransport(self._loop, conn, self._factory(), peername=addr)

    def _resume(self, sock: socket.socket) -> None:
        if sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting (the accepted connections stay, as with asyncio's)."""
        for sock in self.sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self.sockets = []


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

    async def reset_after_flush(self, say: Callable[[], object] | None = None) -> None:
        """A reset after every byte written so far: the peer's recv fails with
        ECONNRESET only once it has them all (SO_LINGER 0, then abort). A UNIX socket
        has no reset: `say()` tells the peer another way before the close (the agent's
        group connections: determinizer.shm `reset_conn`)."""
        t = self.transport
        t.set_write_buffer_limits(high=0)    # paused until the buffer is empty
        await self.writable()
        if t.is_closing():
            return                           # the peer reset it meanwhile
        if say is not None:
            say()
        sock = t.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        t.abort()
