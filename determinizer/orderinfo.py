"""Order information: the (t, o, n, d) entries of the generic algorithm, and their codec.

An entry is `struct llft_rec` of native/llft_shm.h: a fixed 56-byte little-endian
header followed by `dlen` payload bytes, padded to 8. The primary's shim writes
entries in exactly this form into its ring, the agent drains them as bytes, and those
bytes ARE the wire codec: `Message.order_info` carries a concatenation of entries, a
trace file is a concatenation of entries. Decoding is only for tools and tests.

Operation identifiers `o` carry their class in the top byte (clock, lock, mutex,
per-thread, socket); see `op_name`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("<IHHIIQQqiIQ")
assert HEADER.size == 56
MAX_DATA_BYTES = 32 << 10

CALLS = {
    1: "clock_gettime", 2: "gettimeofday", 3: "time", 4: "clock_nanosleep", 5: "nanosleep",
    10: "getrandom", 11: "read(/dev/urandom)",
    20: "sem_wait", 21: "sem_trywait", 22: "sem_timedwait",
    30: "pthread_mutex_lock", 31: "pthread_mutex_trylock", 32: "pthread_mutex_timedlock",
    40: "pthread_create",
    50: "connect", 51: "accept", 52: "recv", 53: "send", 54: "poll", 55: "select",
    56: "epoll_wait", 57: "getsockopt", 58: "getsockname", 59: "getpeername", 60: "shutdown",
    61: "stat", 62: "waitpid", 63: "recv(private)",
}
CALL_IDS = {v: k for k, v in CALLS.items()}
OP_CLASSES = {1: "clock", 2: "lock", 3: "mutex", 4: "thread", 5: "socket"}
SOCKET_KINDS = {1: "private", 2: "external", 3: "group"}


def op_name(op: int) -> str:
    cls, low = op >> 56, op & ((1 << 56) - 1)
    name = OP_CLASSES.get(cls, f"op{cls}")
    if cls in (2, 3, 5):
        return f"{name} {low >> 32}:{low & 0xffffffff}"
    return f"{name} {low}"


@dataclass(frozen=True)
class Entry:
    """(t, o, n, d): thread t's n-th determinized call was `call` on operation o."""
    tid: int
    call: int
    op: int
    n: int
    ret: int = 0
    err: int = 0
    aux: int = 0
    flags: int = 0
    data: bytes = b""
    oseq: int = 0

    def describe(self) -> str:
        return (f"thread {self.tid} call #{self.n}: {CALLS.get(self.call, self.call)}"
                f"({op_name(self.op)}) -> {self.ret}" + (f" errno {self.err}" if self.err else "")
                + (f" [{len(self.data)} bytes]" if self.data else ""))


def encode(entries: list[Entry]) -> bytes:
    out = bytearray()
    for e in entries:
        if len(e.data) > MAX_DATA_BYTES:
            raise ValueError(f"entry payload {len(e.data)} > {MAX_DATA_BYTES} bytes")
        length = (HEADER.size + len(e.data) + 7) & ~7
        out += HEADER.pack(length, e.call, e.flags, e.tid, len(e.data), e.n, e.op, e.ret,
                           e.err, e.aux, e.oseq)
        out += e.data
        out += b"\0" * (length - HEADER.size - len(e.data))
    return bytes(out)


class CodecError(ValueError):
    """Malformed order information (the sender's fault)."""


def split(buf: bytes) -> tuple[int, int]:
    """(number of whole entries, bytes they span) at the start of buf."""
    off = count = 0
    while off + HEADER.size <= len(buf):
        length = struct.unpack_from("<I", buf, off)[0]
        if length < HEADER.size or length % 8:
            raise CodecError(f"bad entry length {length} at offset {off}")
        if off + length > len(buf):
            break
        off += length
        count += 1
    return count, off


def decode(buf: bytes) -> list[Entry]:
    out = []
    off = 0
    while off < len(buf):
        if off + HEADER.size > len(buf):
            raise CodecError(f"truncated header at offset {off}")
        (length, call, flags, tid, dlen, n, op, ret, err, aux, oseq) = HEADER.unpack_from(buf, off)
        if length < HEADER.size or length % 8 or dlen > length - HEADER.size or off + length > len(buf):
            raise CodecError(f"bad entry at offset {off}: len={length} dlen={dlen}")
        data = bytes(buf[off + HEADER.size: off + HEADER.size + dlen])
        out.append(Entry(tid, call, op, n, ret, err, aux, flags, data, oseq))
        off += length
    return out
