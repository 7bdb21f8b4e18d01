"""Streams inside a group connection: the frames, and one end's table of streams (sans-IO).

Theory of operation
-------------------
A *group connection* is one messaging connection between two groups (the gateway counts
as a group of one): messaging delivers each of its two directions as one byte stream,
exactly once and in order at every replica of the receiving group, across failovers
(llft/protocol/messaging/). Every TCP connection between the two sides -- each client of
a gateway, each connection an application accepts on its service port -- is a *stream*
inside it, so the group pair has one set of acknowledgements, keep-alives, retransmission
timers and watermarks however many streams come and go (docs/DESIGN.md, "A group
connection carries streams"). The frames cut a direction's byte stream into streams:

    kind u8 | stream u64 | length u32 | payload (length bytes)

    DATA  the next `length` bytes of the stream. The first frame of a stream id opens
          it, possibly empty (a client that connects and says nothing yet: a server
          that speaks first must see the connection).
    FIN   the sender's side ended (close, or shutdown(SHUT_WR)); length 0.
    RST   the sender aborted the stream (a TCP reset); length 0.
    WINDOW  flow control of the *other* direction: a u64, how many bytes of the stream
          the receiver's consumer has taken so far (monotonic). It may follow the
          sender's own end (a client that half-closed still reads its reply), and one
          that crosses the stream's free is ignored.

Flow control per stream (credit). Each side says with WINDOW frames how much of each
stream its consumer took (the gateway: what its client read; a server group: what its
app read, framed as order information so every replica's byte stream carries the same
grants: llft/replica/framing.py); the other side sends at most STREAM_WINDOW_BYTES of a
stream's data beyond the last grant (none yet: beyond 0). The group's primary stops
reading that stream's app socket, the gateway stops reading that client, so a sender
blocks as it would on a plain TCP connection and one slow reader holds up only its own
stream. A grant follows every GRANT_STEP_BYTES taken; the window exceeds the step by more
than a socket buffer's high-water mark, so a sender waiting for a grant always gets one.

The side that opens streams numbers them 1, 2, ...: an id above the highest it opened is
new, one at or below it that is not open was freed. Each side ends its direction once
(FIN or RST), after its last byte; a stream is freed at both sides once both ends have
passed, which every replica of a group sees at the same offsets of the same byte streams.
So opening, ending and freeing need no message, timer or acknowledgement of their own:
they are ordered, retransmitted and resent after a failover with the data.

What the frames carry is the stream layer's only state: `StreamTable` is one end's view
(which streams are open, which direction of each has ended, how many were freed), and
`FrameDecoder` turns delivered bytes into frames across any cut of the byte stream. A
frame that breaks these rules (an unknown kind, an oversize length, data after an end,
a stream the remote may not open) comes from an authenticated peer, so it is a bug there:
`FrameError`, and the caller resets the group connection rather than guess.

Bounds: MAX_FRAME_PAYLOAD per frame; a decoder holds at most one partial frame.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

HEADER = struct.Struct("!BQI")          # kind, stream, length
HEADER_BYTES = HEADER.size              # 13
MAX_FRAME_PAYLOAD = 1 << 20             # a frame's payload (writers cut larger output)
MAX_STREAM_ID = (1 << 64) - 1
WINDOW_VALUE = struct.Struct("!Q")      # a WINDOW frame's payload: bytes consumed
STREAM_WINDOW_BYTES = 1 << 20           # a stream's data sent beyond the last grant, at most
GRANT_STEP_BYTES = 256 << 10            # a grantor says so after this much was consumed


class Kind(enum.IntEnum):
    DATA = 0
    FIN = 1
    RST = 2
    WINDOW = 3


END_KINDS = (Kind.FIN, Kind.RST)
KINDS = tuple(Kind)     # by value: an index, not Enum's call (Python code) per frame


class FrameError(ValueError):
    """The peer broke the frame format or the stream rules (a bug at the peer)."""


def frame(kind: Kind, stream: int, payload: bytes | memoryview = b"") -> bytes:
    """One frame; ends carry no payload."""
    if not 0 < stream <= MAX_STREAM_ID:
        raise ValueError(f"stream id {stream} out of range")
    if kind in END_KINDS and payload:
        raise ValueError("FIN and RST carry no payload")
    if kind is Kind.WINDOW and len(payload) != WINDOW_VALUE.size:
        raise ValueError("a WINDOW frame carries one u64")
    if len(payload) > MAX_FRAME_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes > {MAX_FRAME_PAYLOAD}")
    return HEADER.pack(kind, stream, len(payload)) + bytes(payload)


def window_frame(stream: int, consumed: int) -> bytes:
    """Our consumer took `consumed` bytes of the stream's other direction so far."""
    return frame(Kind.WINDOW, stream, WINDOW_VALUE.pack(consumed))


def window_value(f: "Frame") -> int:
    return WINDOW_VALUE.unpack(f.payload)[0]


def data_frames(stream: int, data: bytes | memoryview) -> list[bytes]:
    """DATA frames carrying `data` (cut at MAX_FRAME_PAYLOAD; one empty frame for b"")."""
    view = memoryview(data)
    if not view:
        return [frame(Kind.DATA, stream)]
    return [frame(Kind.DATA, stream, view[i:i + MAX_FRAME_PAYLOAD])
            for i in range(0, len(view), MAX_FRAME_PAYLOAD)]


@dataclass(frozen=True, slots=True)
class Frame:
    kind: Kind
    stream: int
    payload: bytes = b""


class FrameDecoder:
    """Delivered bytes in, whole frames out, whatever the cut (one partial frame held)."""
    __slots__ = ("_buf", "offset")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.offset = 0                 # bytes of the byte stream consumed so far

    def feed(self, data: bytes | memoryview) -> list[Frame]:
        buf = self._buf
        buf += data
        self.offset += len(data)
        out: list[Frame] = []
        pos, n = 0, len(buf)
        while n - pos >= HEADER_BYTES:
            kind, stream, length = HEADER.unpack_from(buf, pos)
            if kind > Kind.WINDOW:
                raise FrameError(f"unknown frame kind {kind}")
            if stream == 0 or length > MAX_FRAME_PAYLOAD:
                raise FrameError(f"frame of stream {stream} with {length} bytes")
            if kind in END_KINDS and length:
                raise FrameError(f"{Kind(kind).name} frame with a payload")
            if kind == Kind.WINDOW and length != WINDOW_VALUE.size:
                raise FrameError(f"WINDOW frame with {length} bytes, not {WINDOW_VALUE.size}")
            if n - pos - HEADER_BYTES < length:
                break
            start = pos + HEADER_BYTES
            out.append(Frame(KINDS[kind], stream, bytes(buf[start:start + length])))
            pos = start + length
        if pos:
            del buf[:pos]
        return out

    @property
    def partial_bytes(self) -> int:
        return len(self._buf)


@dataclass(slots=True)
class Credit:
    """One stream's flow control at one end, both directions (the rules of "Flow control
    per stream" above; the caller says what moved and acts on the answers):

    sending   `sent` of our bytes went out, `granted` of them the remote's consumer took
              (its last WINDOW): we send no more while `blocked`;
    granting  `handed` of the remote's bytes went to our consumer, `told` of them our
              last WINDOW said it took: `grant(buffered)` names the next one when a step
              is due (`buffered`: handed bytes our consumer has not taken yet)."""
    sent: int = 0
    granted: int = 0
    handed: int = 0
    told: int = 0

    def on_window(self, consumed: int) -> None:
        self.granted = max(self.granted, consumed)

    @property
    def blocked(self) -> bool:
        return self.sent - self.granted >= STREAM_WINDOW_BYTES

    @property
    def grant_due(self) -> bool:
        """Could a grant be due at all (an integer comparison, for every hand-off)?"""
        return self.handed - self.told >= GRANT_STEP_BYTES

    def grant(self, buffered: int) -> int | None:
        """The count of the WINDOW to send now (recorded as told), or None."""
        consumed = self.handed - buffered
        if consumed - self.told < GRANT_STEP_BYTES:
            return None
        self.told = consumed
        return consumed


@dataclass(slots=True)
class StreamState:
    """One open stream at one end: has each direction ended, and how (FIN or RST)."""
    id: int
    end_in: Kind | None = None          # the remote side's end, delivered here
    end_out: Kind | None = None         # our side's end, framed out

    @property
    def done(self) -> bool:
        return self.end_in is not None and self.end_out is not None


class StreamTable:
    """One end's streams on one group connection.

    `remote_opens`: the remote side opens the streams (a server group's table); else we
    do (a gateway's table: `open()` numbers them). `on_frame` checks a delivered frame
    against the rules and says what it means; `ended_out` records our own end; a stream
    both of whose ends passed is freed (`done`: the caller drops it, `free` forgets it)."""
    __slots__ = ("remote_opens", "open", "highest", "freed", "opened")

    def __init__(self, remote_opens: bool):
        self.remote_opens = remote_opens
        self.open: dict[int, StreamState] = {}
        self.highest = 0                # the highest stream id opened so far
        self.freed = 0                  # streams freed since the connection began
        self.opened = 0

    def open_next(self) -> StreamState:
        """We open a stream (the opener's side): the next id."""
        if self.remote_opens:
            raise FrameError("this side does not open streams")
        self.highest += 1
        self.opened += 1
        st = self.open[self.highest] = StreamState(self.highest)
        return st

    def learn(self, stream: int) -> StreamState | None:
        """A stream the remote side opened, known before its first frame is delivered
        here (a backup hears of it from its primary's order information first); None
        if it was freed already."""
        st = self.open.get(stream)
        if st is None and stream > self.highest:
            self.highest = stream
            self.opened += 1
            st = self.open[stream] = StreamState(stream)
        return st

    def on_frame(self, f: Frame) -> tuple[StreamState | None, bool]:
        """The stream a delivered frame belongs to, and whether the frame opened it;
        (None, False) for a WINDOW that crossed its stream's free (nothing to do)."""
        st = self.open.get(f.stream)
        new = False
        if f.kind is Kind.WINDOW:
            if st is None and f.stream > self.highest:
                raise FrameError(f"WINDOW frame of stream {f.stream}, which was never "
                                 f"opened (highest opened {self.highest})")
            return st, False
        if st is None:
            if not self.remote_opens or f.stream <= self.highest:
                raise FrameError(f"{f.kind.name} frame of stream {f.stream}, which is "
                                 f"not open (highest opened {self.highest})")
            self.highest = f.stream
            self.opened += 1
            st = self.open[f.stream] = StreamState(f.stream)
            new = True
        if st.end_in is not None:
            raise FrameError(f"{f.kind.name} frame of stream {f.stream} after its end")
        if f.kind in END_KINDS:
            st.end_in = f.kind
        return st, new

    def ended_out(self, stream: int, kind: Kind) -> StreamState:
        st = self.open[stream]
        if st.end_out is not None:
            raise FrameError(f"stream {stream} ended twice on our side")
        st.end_out = kind
        return st

    def free(self, stream: int) -> None:
        """Forget a stream whose two ends passed."""
        st = self.open.pop(stream)
        assert st.done, f"stream {stream} freed before both ends"
        self.freed += 1

    def end_all_in(self) -> list[StreamState]:
        """The remote side ended the whole group connection: every stream it had not
        ended counts as reset there (in stream order). The streams that changed."""
        changed = []
        for sid in sorted(self.open):
            st = self.open[sid]
            if st.end_in is None:
                st.end_in = Kind.RST
                changed.append(st)
        return changed
