"""The heartbeat channel of an agent: a native thread repeats and absorbs heartbeats.

Theory of operation
-------------------
An idle member's cost is its event loop's wake-ups (~150-300 µs of cold Python each on
this kind of machine). With a heartbeat every interval sent, and one received from each
peer, a 3-replica agent woke ~113 times a second (4 % of a core). The cores now say a
quiet member's heartbeat once per refresh (`messages.Pulse`: "repeat these bytes every
interval until then"), and this channel keeps the loop out of the repetition:

- sending: the datagram(s) of a Pulse go to the native thread (native/pulse/), which
  sends them at once and repeats them byte for byte every interval until the Pulse's
  end (a hung loop stops being announced then);
- receiving: heartbeats travel on the group's *pulse port* (its port + 1, same
  multicast address), read by the same thread. A datagram byte-identical to one this
  endpoint authenticated from the same source is *absorbed*: only its kernel arrival
  time is kept. Anything else (a heartbeat that says something new, a forgery, noise)
  is queued for the loop, which authenticates and decodes it as any datagram and, if
  it is good, tells the thread to absorb its copies (`accept`);
- the lease: a Pulse is repeated only while the loop lives (`messages.Pulse.lease_us`).
  The loop's selector (`ParkingSelector`, the loop `new_loop` makes) tells the thread
  when the loop waits for events and when it stops waiting (`llft_pulse_park`): a
  loop asleep in its selector is alive, so the core's refresh can be rare (a second),
  while a loop stuck in a handler falls silent a lease after it last waited;
- silence watches: the deadlines at which the core would suspect a peer ("last heard
  + allowance", `silence_watches()` of the cores) are handed to the thread instead of
  a loop timer (`watch`). It moves each by the copies of that peer's heartbeat it
  absorbs and signals the loop only when one passes (`on_watch`): an idle loop wakes
  for its refresh only, not every ~80 ms for a detector that its peers' copies keep
  postponing;
- judging: before a timer, and before each message while a takeover is held, the
  loop reads the pulse socket itself (`poll`: the thread reads it only at its sends,
  and a starved thread would leave the evidence of a live peer in the kernel while a
  detector judges it silent); before every event the driver takes the absorbed
  arrivals
  (`Endpoint.take_absorbed`) and hands them to its core (`heard_again`) with their
  true times, so a detector deadline, or a loop that was itself late, judges a peer
  on when its heartbeats really came.

An absorbed copy is never authenticated again: it is byte-identical to a datagram that
was. Replaying a captured heartbeat keeps its sender looking alive, as replaying it to
the loop always did (the wire has no replay protection; docs/DESIGN.md, Security).

Without the native module (not built) the channel does the same in Python, on the
loop: the repetition on loop timers, and every copy received and handled (nothing is
absorbed). The protocol is the same either way; only the cost differs.
"""
from __future__ import annotations

import asyncio
import logging
import os
import selectors
import socket
import sys
from typing import Callable

log = logging.getLogger(__name__)

try:                                # built by scripts/setup.sh (native/pulse_build.py)
    from native._llft_pulse import ffi as _ffi, lib as _lib
except ImportError:                 # pragma: no cover -- a tree without the native build
    _ffi = _lib = None

RECV_MAX_BYTES = 65536
ARRIVALS_BATCH = 256                # arrivals taken per native call
MAX_WATCHES = 16                    # the native table's size (llft_pulse.c MAX_WATCH)
WATCH_RENEW_US = 40_000             # watches this close to passing are handed anew (`watch`)
STATS = ("sent", "received", "absorbed", "forwarded", "queue_full", "arrivals_dropped",
         "send_errors", "recv_errors", "lease_skipped", "watch_fired")


def native_available() -> bool:
    return _lib is not None


class ParkingSelector(selectors.DefaultSelector):
    """The event loop's selector, telling each pulse thread registered with it when the
    loop waits in it (`llft_pulse_park`): the thread's lease on the loop's heartbeat."""

    def __init__(self):
        super().__init__()
        self.pulses: list = []              # native handles
        self.waits = 0                      # selects that may block: wake-ups

    def select(self, timeout=None):
        if timeout is not None and timeout <= 0:
            # a turn with callbacks ready: the loop does not wait (on the request path
            # about half the turns; the lease is renewed by its waits and Pulses)
            return super().select(timeout)
        self.waits += 1                     # a wait: a wake-up to come
        pulses = self.pulses
        for p in pulses:
            _lib.llft_pulse_park(p, 1)
        try:
            return super().select(timeout)
        finally:
            for p in pulses:
                _lib.llft_pulse_park(p, 0)


def new_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose selector gives its pulse threads their lease (the agent's:
    `run`; the gateway has no pulse channel). A loop made otherwise works the same, but
    its Pulses are repeated to their end without a lease."""
    sel = ParkingSelector()
    loop = asyncio.SelectorEventLoop(sel)
    loop.llft_parking = sel
    return loop


def run(coro):
    """`asyncio.run(coro)` on a `new_loop()`."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(coro)


def ip_be(host: str) -> int:
    """An IPv4 address as the native side reads sin_addr.s_addr (network-order bytes)."""
    return int.from_bytes(socket.inet_aton(host), sys.byteorder)


class LoopRepeater:
    """A Pulse repeated on the event loop, where no native thread does it:
    `repeat(send, datagrams, every_us, until_us)` calls `send(datagrams)` now and every
    `every_us` until `until_us`; the next call replaces it, `stop()` ends it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock_us: Callable[[], int]):
        self._loop, self.clock_us = loop, clock_us
        self._handle: asyncio.TimerHandle | None = None

    def repeat(self, send: Callable[[list[bytes]], None], datagrams: list[bytes],
               every_us: int, until_us: int) -> None:
        self.stop()
        if datagrams:
            self._tick(send, datagrams, every_us, until_us)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self, send, datagrams: list[bytes], every_us: int, until_us: int) -> None:
        self._handle = None
        send(datagrams)
        if every_us > 0 and self.clock_us() + every_us <= until_us:
            self._handle = self._loop.call_later(every_us / 1e6, self._tick, send,
                                                 datagrams, every_us, until_us)


class PulseChannel:
    """One endpoint's heartbeat channel (see the module docstring).

    `on_datagram(data, src, at_us)` gets every datagram the loop must handle, with its
    arrival time (the kernel's; the thread reads the socket only at its sends, up to an
    interval later); the endpoint calls `accept(src, data)` for each one it
    authenticated."""

    def __init__(self, rsock: socket.socket, ssock: socket.socket,
                 dst: tuple[str, int], on_datagram: Callable[[bytes, int, int], None],
                 clock_us: Callable[[], int], native: bool = True):
        self.rsock, self.ssock, self.dst = rsock, ssock, dst
        self.on_datagram = on_datagram
        self.clock_us = clock_us
        self.native = native and native_available()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._p = None                      # the native handle
        self._efd = -1
        self._repeater: LoopRepeater | None = None    # without the native thread
        self._parking: ParkingSelector | None = None  # the loop's, when it gives a lease
        self._watching: tuple = ()                    # the watches the thread holds
        self.on_watch: Callable[[], None] | None = None   # a watch passed (`watch`)
        self.py_stats = {"sent": 0, "received": 0, "send_errors": 0, "watch_calls": 0}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self.native:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            p = _lib.llft_pulse_new(self.rsock.fileno(), self.ssock.fileno(), self._efd)
            if p == _ffi.NULL:
                os.close(self._efd)
                self._efd = -1
                self.native = False
                log.warning("llft pulse: the native thread did not start; heartbeats "
                            "are repeated by the event loop")
            else:
                self._p = p
                self._buf = _ffi.new("uint8_t[]", RECV_MAX_BYTES)
                self._src = _ffi.new("uint64_t *")
                self._at = _ffi.new("int64_t *")
                self._asrc = _ffi.new("uint64_t[]", ARRIVALS_BATCH)
                self._aat = _ffi.new("int64_t[]", ARRIVALS_BATCH)
                self._dst_ip = ip_be(self.dst[0])
                self._wsrc = _ffi.new("uint64_t[]", MAX_WATCHES)
                self._wheard = _ffi.new("int64_t[]", MAX_WATCHES)
                self._wdl = _ffi.new("int64_t[]", MAX_WATCHES)
                parking = getattr(loop, "llft_parking", None)
                if isinstance(parking, ParkingSelector):
                    self._parking = parking
                    parking.pulses.append(p)
                loop.add_reader(self._efd, self._on_event)
                return
        self._repeater = LoopRepeater(loop, self.clock_us)
        loop.add_reader(self.rsock.fileno(), self._on_readable)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(self._efd if self._p is not None
                                         else self.rsock.fileno())
            except (ValueError, OSError):
                pass
        if self._repeater is not None:
            self._repeater.stop()
        if self._p is not None:
            if self._parking is not None and self._p in self._parking.pulses:
                self._parking.pulses.remove(self._p)
            _lib.llft_pulse_free(self._p)   # joins the thread before the fds go
            self._p = None
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1
        for s in (self.rsock, self.ssock):
            s.close()

    # -- sending -----------------------------------------------------------------------
    def send_once(self, datagrams: list[bytes]) -> None:
        for d in datagrams:
            self._sendto(d)

    def repeat(self, datagrams: list[bytes], every_us: int, until_us: int,
               lease_us: int = 0) -> None:
        """Send now, then every `every_us` until `until_us` (empty: stop), while the loop
        lives (`lease_us`, messages.Pulse; without a parking selector the thread cannot
        tell, and repeats to `until_us`; without the thread the loop repeats them)."""
        if self._p is not None:
            data = b"".join(datagrams)
            lens = _ffi.new("uint32_t[]", [len(d) for d in datagrams] or [0])
            lease_us = lease_us if self._parking is not None else 0
            if _lib.llft_pulse_set(self._p, _ffi.from_buffer(data), lens, len(datagrams),
                                   self._dst_ip, self.dst[1], max(1, every_us),
                                   until_us, lease_us) != 0:
                log.error("llft pulse: the native thread refused a heartbeat of %d "
                          "datagrams; sent once", len(datagrams))
                self.send_once(datagrams)
            return
        self._repeater.repeat(self.send_once, datagrams, every_us, until_us)

    def _sendto(self, data: bytes) -> None:
        try:
            self.ssock.sendto(data, self.dst)
            self.py_stats["sent"] += 1
        except OSError:
            self.py_stats["send_errors"] += 1

    # -- receiving ---------------------------------------------------------------------
    def _on_event(self) -> None:
        try:
            os.eventfd_read(self._efd)      # first: a datagram queued after is signalled
        except BlockingIOError:
            pass
        self.drain(read_socket=False)   # the thread just read it
        if _lib.llft_pulse_watch_fired(self._p):
            self._watching = ()             # the thread dropped them: taken anew after
            if self.on_watch is not None:
                self.on_watch()

    # -- silence watches -----------------------------------------------------------------
    @property
    def watches(self) -> bool:
        """Whether the thread can watch silence deadlines (`watch`)."""
        return self._p is not None

    def watch(self, watches: tuple[tuple[int, int, int], ...], now_us: int) -> None:
        """Hand the thread its watches, (source, heard_us, deadline_us) each: it signals
        `on_watch` once one is passed after moving by the copies absorbed from its
        source since `heard_us`, and drops them all then.

        Not handed while the thread's can pass no sooner than these (the same sources,
        no deadline or allowance smaller) and none of them within `WATCH_RENEW_US`:
        under load a backup's watermark reports (heartbeats that say something new,
        which the thread does not absorb) move the primary's watches after every
        request, and a call each time cost the agents 10-25 % more CPU per request; renewed
        that close to their deadline, the thread's watches never pass while the peers
        speak."""
        if self._p is None:
            return
        old = self._watching
        if len(old) == len(watches) and all(
                s == s0 and d >= d0 and d - h >= d0 - h0 and d0 - now_us > WATCH_RENEW_US
                for (s, h, d), (s0, h0, d0) in zip(watches, old)):
            return
        n = min(len(watches), MAX_WATCHES)
        for i, (src, heard, dl) in enumerate(watches[:n]):
            self._wsrc[i], self._wheard[i], self._wdl[i] = src, heard, dl
        _lib.llft_pulse_watch(self._p, self._wsrc, self._wheard, self._wdl, n)
        self._watching = watches
        self.py_stats["watch_calls"] += 1

    def drain(self, limit: int = 4096, read_socket: bool = True) -> int:
        """Hand the loop what the thread queued (or, without it, what the socket holds).
        `read_socket`: the socket is read first, here (`llft_pulse_poll`): the thread
        reads it only at its sends, and on a busy machine it may not have run for longer
        than a detector's timeout while the heartbeats that disprove a silence wait in
        the kernel; a driver about to judge silence must hear them."""
        n = 0
        if self._p is not None:
            if read_socket:
                self.poll()
            while n < limit:
                k = _lib.llft_pulse_take(self._p, self._buf, RECV_MAX_BYTES, self._src,
                                         self._at)
                if k <= 0:
                    break
                n += 1
                self.on_datagram(_ffi.buffer(self._buf, k)[:], self._src[0], self._at[0])
            return n
        while n < limit:
            try:
                data, addr = self.rsock.recvfrom(RECV_MAX_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            n += 1
            self.py_stats["received"] += 1
            self.on_datagram(data, (ip_be(addr[0]) << 16) | addr[1], self.clock_us())
        return n

    def poll(self) -> None:
        """The thread's socket read now, from the caller (`llft_pulse_poll`): copies of
        accepted heartbeats become arrivals, anything else is queued (and signalled).
        Without the native thread the loop reads the socket itself: nothing to do."""
        if self._p is not None:
            _lib.llft_pulse_poll(self._p)

    def _on_readable(self) -> None:
        self.drain()

    def accept(self, src: int, data: bytes) -> None:
        if self._p is not None:
            _lib.llft_pulse_accept(self._p, src, data, len(data))

    def arrivals(self) -> dict[int, list[int]]:
        """Absorbed copies since the last call: source -> arrival times (ascending)."""
        out: dict[int, list[int]] = {}
        if self._p is None:
            return out
        while True:
            k = _lib.llft_pulse_arrivals(self._p, self._asrc, self._aat, ARRIVALS_BATCH)
            for i in range(k):
                out.setdefault(self._asrc[i], []).append(self._aat[i])
            if k < ARRIVALS_BATCH:
                return out

    def stats(self) -> dict[str, int]:
        if self._p is None:
            return {f"pulse_{k}": v for k, v in self.py_stats.items()}
        out = _ffi.new(f"uint64_t[{len(STATS)}]")
        _lib.llft_pulse_stats(self._p, out)
        st = {f"pulse_{k}": int(out[i]) for i, k in enumerate(STATS)}
        st["pulse_sent"] += self.py_stats["sent"]       # sent once, from the loop
        st["pulse_send_errors"] += self.py_stats["send_errors"]
        st["pulse_watch_calls"] = self.py_stats["watch_calls"]
        if self._parking is not None:
            st["loop_waits"] = self._parking.waits
        return st
