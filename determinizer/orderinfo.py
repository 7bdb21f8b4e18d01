"""Order information: the (t, o, n, d) entries of the generic algorithm, and their codec.

An entry is `struct llft_rec` of native/llft_shm.h: a fixed little-endian header
followed by `dlen` payload bytes, padded to 8. The primary's shim writes entries in
exactly this form into its ring, the agent drains them as bytes, and those bytes ARE
the wire codec: `Message.order_info` carries a concatenation of entries, a trace file
is a concatenation of entries.

Nothing about the record is written here: its layout (`HEADER`, `FIELDS`) is derived
from the struct cffi read out of the header, and the names of calls (`Call`, the kinds
of entry) and socket kinds (`SocketKind`) are the header's enums; operations are named
by the shim's own `llft_op_name`. The entry framing (a u32 length first, whole entries
only) is walked by `_spans`, which `decode` is built on and which is the reference for
`llft_oi_walk`, the same walk in C that `split` and `pieces` (the agents' hot path) use.
Decoding into `Entry` objects is for tools, reports and tests.

Operation identifiers `o` carry their class in the top byte (clock, lock, mutex,
per-thread, socket); see `op_name`.
"""
from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from native import c_enum
from native._llft_shm import ffi, lib

MAX_DATA_BYTES = lib.LLFT_MAX_DATA_BYTES

# struct module codes of the fixed-width types the record uses
_STRUCT_CODES = {"uint16_t": "H", "uint32_t": "I", "uint64_t": "Q", "int32_t": "i", "int64_t": "q"}


def _record_layout() -> tuple[struct.Struct, tuple[str, ...]]:
    """A little-endian struct.Struct for `struct llft_rec`, field by field at cffi's
    offsets (padding as pad bytes), and the field names in order."""
    fmt, at, names = "<", 0, []
    for name, field in ffi.typeof("struct llft_rec").fields:
        if field.offset > at:
            fmt += f"{field.offset - at}x"
        fmt += _STRUCT_CODES[field.type.cname]
        names.append(name)
        at = field.offset + ffi.sizeof(field.type)
    size = ffi.sizeof("struct llft_rec")
    if size > at:
        fmt += f"{size - at}x"
    layout = struct.Struct(fmt)
    if layout.size != size:
        raise ImportError(f"struct llft_rec: derived layout {fmt} is {layout.size} bytes, C says {size}")
    return layout, tuple(names)


HEADER, FIELDS = _record_layout()
_LEN = struct.Struct("<I")            # the first field, the entry's whole length
if FIELDS[0] != "len" or ffi.typeof("struct llft_rec").fields[0][1].type.cname != "uint32_t":
    raise ImportError("struct llft_rec must start with its u32 length (the framing)")


class _CallBase(enum.IntEnum):
    @property
    def label(self) -> str:
        """The name reports print: "clock_gettime", "read(/dev/urandom)", "recv(private)"."""
        return ffi.string(lib.llft_call_name(self)).decode()


Call = c_enum("Call", "enum llft_call", "LLFT_C_", _CallBase, skip=("LLFT_C_NONE",))
SocketKind = c_enum("SocketKind", "enum llft_sock_kind", "LLFT_SK_")

# Calls by printed name, as tests and tools spell them: CALL_IDS["clock_gettime"].
CALL_IDS = {c.label: c for c in Call}


def call_label(call: int) -> str:
    try:
        return Call(call).label
    except ValueError:
        return str(call)


def op_name(op: int) -> str:
    """"lock 3:9", "clock 1", "socket 0:4": the shim's own naming (llft_op_name)."""
    buf = ffi.new("char[]", 64)
    lib.llft_op_name(op, buf, len(buf))
    return ffi.string(buf).decode()


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
        return (f"thread {self.tid} call #{self.n}: {call_label(self.call)}"
                f"({op_name(self.op)}) -> {self.ret}" + (f" errno {self.err}" if self.err else "")
                + (f" [{len(self.data)} bytes]" if self.data else ""))


def encode(entries: list[Entry]) -> bytes:
    out = bytearray()
    for e in entries:
        if len(e.data) > MAX_DATA_BYTES:
            raise ValueError(f"entry payload {len(e.data)} > {MAX_DATA_BYTES} bytes")
        length = (HEADER.size + len(e.data) + 7) & ~7
        values = {"len": length, "dlen": len(e.data), "call": e.call, "flags": e.flags,
                  "tid": e.tid, "n": e.n, "op": e.op, "ret": e.ret, "err": e.err,
                  "aux": e.aux, "oseq": e.oseq}
        out += HEADER.pack(*(values[f] for f in FIELDS))
        out += e.data
        out += b"\0" * (length - HEADER.size - len(e.data))
    return bytes(out)


class CodecError(ValueError):
    """Malformed order information (the sender's fault)."""


def _spans(buf: bytes, max_entries: int | None = None) -> Iterator[tuple[int, int]]:
    """(offset, length) of each whole entry at the start of buf, in order; stops at a
    partial trailing entry (or after max_entries). The reference walk of the framing
    (`_walk` is its C twin)."""
    off = count = 0
    while off + HEADER.size <= len(buf) and (max_entries is None or count < max_entries):
        length = _LEN.unpack_from(buf, off)[0]
        if length < HEADER.size or length % 8:
            raise CodecError(f"bad entry length {length} at offset {off}")
        if off + length > len(buf):
            break
        yield off, length
        off += length
        count += 1


_NO_LIMIT = 2**64 - 1


def _walk(buf, start: int = 0, max_entries: int | None = None,
          max_bytes: int = _NO_LIMIT) -> tuple[int, int]:
    """_spans's walk in C (`llft_oi_walk`): every chunk of order information a backup
    takes and a primary sends is walked, ~50 entries a request with short connections
    (tests/unit/test_determinizer.py holds it to `_spans` on random and broken input).
    (count, end) from `start`; at most `max_entries`; past the first entry, only
    entries ending within `max_bytes` of `start`."""
    end = ffi.new("uint64_t *")
    n = lib.llft_oi_walk(buf if isinstance(buf, bytes) else ffi.from_buffer(buf), len(buf),
                         start, _NO_LIMIT if max_entries is None else max_entries,
                         max_bytes, end)
    if n < 0:
        off = start + end[0]
        raise CodecError(f"bad entry length {_LEN.unpack_from(buf, off)[0]} at offset {off}")
    return n, end[0]


def split(buf: bytes, max_entries: int | None = None) -> tuple[int, int]:
    """(number of whole entries, bytes they span) at the start of buf (at most
    max_entries of them)."""
    return _walk(buf, 0, max_entries)


def pieces(buf: bytes, limit: int) -> list[bytes]:
    """Whole entries cut into pieces of at most `limit` bytes (an entry larger than
    `limit` is a piece of its own); buf must end at an entry's end."""
    out, start = [], 0
    while start < len(buf):
        count, end = _walk(buf, start, None, limit)
        if not count:
            break
        out.append(buf[start:start + end] if start or end < len(buf) else buf)
        start += end
    if start != len(buf):
        raise CodecError(f"order information ends inside an entry (offset {start} of {len(buf)})")
    return out


def decode(buf: bytes) -> list[Entry]:
    out = []
    end = 0
    for off, length in _spans(buf):
        f = dict(zip(FIELDS, HEADER.unpack_from(buf, off)))
        if f["dlen"] > length - HEADER.size:
            raise CodecError(f"bad entry at offset {off}: len={length} dlen={f['dlen']}")
        data = bytes(buf[off + HEADER.size: off + HEADER.size + f["dlen"]])
        out.append(Entry(f["tid"], f["call"], f["op"], f["n"], f["ret"], f["err"], f["aux"],
                         f["flags"], data, f["oseq"]))
        end = off + length
    if end != len(buf):
        raise CodecError(f"truncated entry at offset {end}")
    return out
