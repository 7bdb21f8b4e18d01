"""The relay's wire format: one frame = 4-byte big-endian length + one msgpack map.

App -> relay, per call (one call at a time on a connection):
    {"target", "options", "method", "kind", "metadata", "timeout", "wait_for_ready",
     "compression"}                       the call (kind: "uu", "us", "su", "ss")
    {"m": bytes} ...                       request messages (serialized by the app)
    {"end": true}                          no more requests (a unary request: one "m")
Relay -> app:
    {"im": [[key, value], ...]}            initial metadata (first, always)
    {"m": bytes} ...                       response messages
    {"code": int, "details": str, "tm": [[key, value], ...]}   status (last)
Metadata values are str, or bytes for keys ending in "-bin" (gRPC's rule).
"""
from __future__ import annotations

import socket
import struct

import msgpack

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30          # Spark Connect allows 128 MB messages; anything near 1 GB is garbage
KINDS = ("uu", "us", "su", "ss")


class FrameError(Exception):
    """A frame that is not one (too long, not a msgpack map)."""


def encode(obj: dict) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def _exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes, or None at EOF before the first one (EOF inside is an error)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if not buf:
                return None
            raise FrameError(f"connection closed inside a frame ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


def read(sock: socket.socket) -> dict | None:
    """The next frame, or None at a clean EOF between frames."""
    head = _exact(sock, HEADER.size)
    if head is None:
        return None
    (n,) = HEADER.unpack(head)
    if n > MAX_FRAME:
        raise FrameError(f"frame of {n} bytes (more than {MAX_FRAME})")
    body = _exact(sock, n) if n else b""
    if body is None:
        raise FrameError("connection closed after a frame header")
    try:
        obj = msgpack.unpackb(body, raw=False)
    except Exception as e:  # msgpack raises several types for garbage
        raise FrameError(f"not msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise FrameError(f"a frame is a map, got {type(obj).__name__}")
    return obj


def options_out(options) -> list:
    """Channel options (pairs, or None) as frame data: values int or str (the relay keys
    its channels by them)."""
    return [[str(k), v if isinstance(v, (int, str)) else str(v)] for k, v in options or ()]


def metadata_out(md) -> list:
    """gRPC metadata (pairs, or None) as frame data."""
    return [[str(k), v if isinstance(v, (bytes, str)) else str(v)] for k, v in (md or ())]
