"""`Framer`: one replica's framing of its application's output, identical at every replica
(sans-IO).

Theory of operation
-------------------
A replica's application writes to many streams (llft/protocol/streams.py) of its group
connections; their frames interleave in each connection's byte stream. The interleaving is
the order in which the primary's agent happened to read its app's sockets, and a backup's
agent reads its own app at other moments; yet a new primary resends its log by offset of
that byte stream after a failover, so every replica must frame the same bytes. So:

  primary  frames output as it reads it (`output`, `app_ended`) and returns, with each
           frame, an *entry* (stream k, byte count, or the end: FRAME_FIN / FRAME_RST) for
           its order information, which leaves before the frame does (output commit);
  backup   buffers its app's output per stream and frames it only by the primary's entries
           (`entries`), in their order, each once its app has written those bytes;
  promoted first makes what is left of its predecessor's entries (its app may still have
           to write the last bytes, live: the predecessor's agent read a send's bytes as
           soon as they were readable and may have drained the shim's ring before that
           send's own entry was in it), then frames live (`promote`).

Streams are named by k, the number every replica gives a stream when it registers it
(the agent's "C" entries), and belong to a connection (any hashable) with a stream id.
A stream whose remote side reset it (`remote_reset`) is framed like any other: the
primary may have framed bytes before the reset reached it, and the remote may have read
them and then reset, so a backup (whose app writes them later: it lags) must frame the
same bytes -- a backup promoted later resends them, and a lagging remote backup reads
them. Its agent therefore keeps its socket to its app until the app closes it (the app
reads the reset where its primary's did: the shim replays that read), and only what
is still missing once the app ended its side is made by length (`void_frame_bytes`:
not what a determinized app does, so counted). What the app wrote beyond the primary's
entries (its primary's agent reset the socket before reading it) is dropped at the
stream's end entry (`reset_output_dropped`).

Grants (streams.py: WINDOW frames, "Flow control per stream") are output of the agent,
not of the app: how much of a stream the primary's app took. They go into the same byte
streams, so they are entries too (`window`: an entry whose count is FRAME_WINDOW less
the bytes consumed); a backup makes the WINDOW frame where its entry stands, and ignores
its own app's reading; a promoted backup grants its own once past its predecessor's
entries.

Every call returns `Made` records, in order: the frames to append to a connection's
outbox (with our end of a stream when it is one), and at the primary the entries to add
to the order information first. `check()` states the invariants; the property test
(tests/unit/test_framing.py) drives a primary and its backups through random
interleavings, promotions and resets and compares their byte streams.
"""
from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable

from llft.protocol.streams import Kind, data_frames, frame, window_frame

ENTRY = struct.Struct("!Iq")            # stream k, bytes (or an end or a grant below)
FRAME_FIN, FRAME_RST = -1, -2
FRAME_WINDOW = -3                       # ... and below: a grant of FRAME_WINDOW - count
END_OF = {FRAME_FIN: Kind.FIN, FRAME_RST: Kind.RST}
CODE_OF = {Kind.FIN: FRAME_FIN, Kind.RST: FRAME_RST}


@dataclass(frozen=True, slots=True)
class Made:
    """Frames for connection `conn` (stream `sid`); `end`: they end our side of it."""
    conn: Hashable
    sid: int
    frames: bytes
    end: Kind | None = None


@dataclass(slots=True)
class _Stream:
    conn: Hashable
    sid: int
    out: bytearray = field(default_factory=bytearray)   # read, not yet framed (backup)
    app_end: Kind | None = None     # our reader saw the app end its side
    ended: bool = False             # our end was framed
    reset: bool = False             # the remote side reset it (framed as the app ends)
    grant: int | None = None        # a promoted primary's grant, made once it goes live


class Framer:
    def __init__(self) -> None:
        self.streams: dict[int, _Stream] = {}
        self.pending: deque[tuple[int, int]] = deque()   # entries not yet made here
        self.primary = False
        self.stats: dict[str, int] = {}

    # ---- streams ------------------------------------------------------------------------
    def add(self, k: int, conn: Hashable, sid: int) -> None:
        """Stream k is (conn, sid): registered at the same number at every replica."""
        self.streams.setdefault(k, _Stream(conn, sid))

    def forget(self, k: int) -> None:
        """Stream k is gone here (both ends passed, the app closed it)."""
        self.streams.pop(k, None)

    @property
    def live(self) -> bool:
        """Frames are made as the output comes (a primary past its predecessor's)."""
        return self.primary and not self.pending

    # ---- the application's output -------------------------------------------------------
    def output(self, k: int, data: bytes) -> tuple[bytes, list[Made]]:
        """Our app wrote `data` on stream k: (entries for the order information, frames
        made now)."""
        s = self.streams[k]
        if s.ended:
            self._count("reset_output_dropped" if s.reset else "output_after_end", len(data))
            return b"", []
        if self.live:
            return ENTRY.pack(k, len(data)), [Made(s.conn, s.sid,
                                                   b"".join(data_frames(s.sid, data)))]
        s.out += data
        return self._make()

    def app_ended(self, k: int, end: Kind) -> tuple[bytes, list[Made]]:
        """Our app ended its side of stream k (our reader saw it)."""
        s = self.streams[k]
        s.app_end = end
        if self.live and not s.ended:
            s.ended = True
            return ENTRY.pack(k, CODE_OF[end]), [Made(s.conn, s.sid, frame(end, s.sid), end)]
        return self._make()

    def window(self, k: int, consumed: int) -> tuple[bytes, list[Made]]:
        """The primary's app took `consumed` bytes of stream k's input: a grant to the
        remote side. A backup's own reading grants nothing (it makes the primary's)."""
        s = self.streams.get(k)
        if s is None or not self.primary:
            return b"", []
        if not self.live:
            s.grant = consumed              # after the predecessor's entries
            return b"", []
        return ENTRY.pack(k, FRAME_WINDOW - consumed), [
            Made(s.conn, s.sid, window_frame(s.sid, consumed))]

    def remote_reset(self, k: int) -> tuple[bytes, list[Made]]:
        """The remote side reset stream k: its frames still wait for the app's bytes,
        but only until the app ends its side (then the rest goes by length)."""
        s = self.streams.get(k)
        if s is None:
            return b"", []
        s.reset = True
        return self._make()

    # ---- the primary's entries, at a backup ------------------------------------------------
    def entries(self, records: bytes) -> tuple[bytes, list[Made]]:
        """The primary's entries (in order, each delivered once): frames made now."""
        if len(records) % ENTRY.size:
            raise ValueError(f"frame entries of {len(records)} bytes")
        self.pending.extend(ENTRY.iter_unpack(records))
        return self._make()

    def promote(self) -> tuple[bytes, list[Made]]:
        """This replica's app is the primary's now: what is left of the predecessor's
        entries first, then live (what the app wrote beyond them is framed as soon as
        they are made, in stream order, with entries of our own)."""
        self.primary = True
        return self._make()

    # ---- making frames -----------------------------------------------------------------
    def _make(self) -> tuple[bytes, list[Made]]:
        made: list[Made] = []
        while self.pending:
            k, n = self.pending[0]
            s = self.streams.get(k)
            if s is None:
                self._count("entry_of_unknown_stream")
            elif n >= 0:
                if len(s.out) < n and not (s.reset and s.app_end is not None):
                    return b"", made            # our app has not written them yet
                if len(s.out) < n:
                    self._count("void_frame_bytes", n - len(s.out))
                data = bytes(s.out[:n]).ljust(n, b"\0")
                del s.out[:n]
                made.append(Made(s.conn, s.sid, b"".join(data_frames(s.sid, data))))
            elif n in END_OF and not s.ended:
                if s.out:
                    # beyond what the primary's agent read before it reset the app's
                    # socket; otherwise diverged (the shim says so)
                    self._count("reset_output_dropped" if s.reset else "output_after_end",
                                len(s.out))
                    s.out.clear()
                s.ended = True
                made.append(Made(s.conn, s.sid, frame(END_OF[n], s.sid), END_OF[n]))
            elif n <= FRAME_WINDOW:
                made.append(Made(s.conn, s.sid, window_frame(s.sid, FRAME_WINDOW - n)))
            else:
                self._count("bad_entry")
            self.pending.popleft()
        if not self.primary:
            return b"", made
        # a promoted primary past its predecessor's frames: the rest goes live
        recs = bytearray()
        for k in sorted(self.streams):
            s = self.streams[k]
            if s.out:
                data = bytes(s.out)
                s.out.clear()
                recs += ENTRY.pack(k, len(data))
                made.append(Made(s.conn, s.sid, b"".join(data_frames(s.sid, data))))
            if s.app_end is not None and not s.ended:
                s.ended = True
                recs += ENTRY.pack(k, CODE_OF[s.app_end])
                made.append(Made(s.conn, s.sid, frame(s.app_end, s.sid), s.app_end))
            if s.grant is not None:
                recs += ENTRY.pack(k, FRAME_WINDOW - s.grant)
                made.append(Made(s.conn, s.sid, window_frame(s.sid, s.grant)))
                s.grant = None
        return bytes(recs), made

    def owes(self, k: int) -> bool:
        """Whether an entry of stream k is still to make here (the app's bytes it needs
        may still come: a promoted primary resets its app's socket of a stream the
        remote reset only after them)."""
        return any(pk == k for pk, _ in self.pending)

    def waiting(self) -> tuple[int, int, int] | None:
        """(stream k, bytes its next frame needs, bytes written so far), or None."""
        if not self.pending:
            return None
        k, n = self.pending[0]
        s = self.streams.get(k)
        return k, n, (len(s.out) if s else -1)

    def check(self) -> None:
        """Invariants: a live framer holds no output; an ended stream holds none."""
        for k, s in self.streams.items():
            if self.live or s.ended:
                assert not s.out, f"stream {k}: output held by a live or ended stream"

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n
