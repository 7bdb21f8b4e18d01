"""The llft wire format: msgpack messages in authenticated, optionally fragmented datagrams.

Theory of operation
-------------------
One `Message` (llft/protocol/messages.py) is packed with msgpack into a *payload*: a 14-element
array, header fields first, in `HEADER_FIELDS` order, then the typed body map and the
opaque order_info bytes:

    [type, src_group, dst_group, conn_seq, role, pvn, precedence, sender,
     msn, ack, back, ts, body, order_info]

The payload travels in one datagram if it fits the MTU, otherwise in fragments, each its
own datagram. Every datagram is laid out as (big-endian, byte offsets):

    0   2  magic        b"LF"  -- foreign traffic is rejected on two byte compares
    2   1  version      WIRE_VERSION (becomes Message.version)
    3   1  kind         0 = whole message, 1 = fragment
    4  16  tag          HMAC-SHA256(cluster key, bytes 0..3 || bytes 20..end)[:16]
   20     kind 0: the payload
          kind 1: sender u64 (birth id), frag_id u32, index u16, count u16, then
                  payload[index * chunk : (index + 1) * chunk]

The tag covers every byte of the datagram except itself, so a forged, corrupted or
truncated datagram fails the MAC before msgpack ever sees it. A fragment's sender is the
Message.sender of the message it carries; (sender, frag_id) names one fragmented message.

The `Decoder` is strict and total: `decode()` returns a Message or None and never
raises; every refusal is counted in `Decoder.rejections` (a Counter of `Reject`). It
refuses, in this order: short/foreign/other-version/malformed prefixes, bad tags, bad
fragments, malformed payloads (wrong msgpack types, unknown message type, a body that is
not exactly `BODY_FIELDS[type]`, negative numbers, oversize fields), messages addressed
to a group it does not listen for, and data/control messages from a view of their
source group older than the one the runtime last told it (`set_view`); membership
messages carry their own view rules and pass. Reassembly is bounded in messages, bytes
and time; time is the caller's `now_us` (sans-IO: no sockets, no clocks here).

The `Encoder` is the pair of the decoder: it validates with the same rules (so a bad
message is a local bug, raised as `WireError`, not a silent remote rejection), numbers
fragmented messages, and splits them to the MTU.

The native half
---------------
The per-datagram work -- prefix checks, the tag, the msgpack payload read and checked
as `_unpack` and `_parse` do -- also exists in C (native/wire/, `native._llft_wire`): it
returns numbers and spans, and `NativeCodec` turns them into the same Message. This
Python code is the reference model: the two must agree on every datagram, reason for
reason. `DifferentialDecoder` runs both and raises `WireDivergence` at the first
datagram they judge apart (the simulator's "differential" codec; the fuzz tests).
The codec a process uses is `default_codec()`: "native" when the module is built,
unless the environment sets LLFT_WIRE (python | native | differential). Types whose body
holds lists or strings are parsed by the reference in both (the C half checks their tag
and hands them back); reassembly is the reference's in both.
"""
from __future__ import annotations

import enum
import hmac
import os
import struct
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import msgpack

from llft.protocol.messages import (BODY_FIELDS, DATA_TYPES, MEMBERSHIP_TYPES, WIRE_VERSION,
                                    Message, MsgType, ROLES, Role)

try:
    from native._llft_wire import ffi as _ffi, lib as _lib
except ImportError:     # not built: the reference does everything
    _ffi = _lib = None

MAGIC = b"LF"
SUPPORTED_VERSIONS = frozenset({WIRE_VERSION})
KIND_WHOLE = 0
KIND_FRAGMENT = 1

TAG_BYTES = 16                      # truncated HMAC-SHA256: 128 bits is ample for forgery
PREFIX = struct.Struct("!2sBB")     # magic, version, kind
PREFIX_BYTES = PREFIX.size          # 4
HEADER_BYTES = PREFIX_BYTES + TAG_BYTES   # 20: start of the payload of a whole message
FRAG = struct.Struct("!QIHH")       # sender, frag_id, index, count
FRAG_HEADER_BYTES = HEADER_BYTES + FRAG.size  # 36: start of a fragment's chunk

KEY_BYTES = 32
U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1

# Bounds. A datagram can never exceed what UDP over IPv4 carries.
MAX_DATAGRAM_BYTES = 65507
DEFAULT_MTU_BYTES = 1400            # UDP payload that fits a 1500-byte Ethernet frame
MIN_MTU_BYTES = 128
MAX_MESSAGE_BYTES = 1 << 20         # one encoded payload (STATE chunks must fit under it)
MAX_GROUP_BYTES = 96                # a group id: a short user-chosen name (<= 63), or a
                                    # gateway's: <name>.gateway.<16 hex digits>
MAX_FRAGMENTS = 4096                # per message; 1 MiB / 4096 = 256-byte chunks at least
REASSEMBLY_MAX_MESSAGES = 64        # partial messages held at once
REASSEMBLY_MAX_BYTES = 8 << 20      # bytes held in partial messages at once
REASSEMBLY_TIMEOUT_US = 2_000_000   # a partial message older than this is dropped
RECENT_DONE_MAX = 1024              # completed (sender, frag_id) remembered to drop late dups

HEADER_FIELDS = ("type", "src_group", "dst_group", "conn_seq", "role", "pvn", "precedence",
                 "sender", "msn", "ack", "back", "ts")
PAYLOAD_LEN = len(HEADER_FIELDS) + 2   # + body, order_info


class Reject(enum.Enum):
    """Why a datagram (or, for the REASSEMBLY_* reasons, a partial message) was dropped."""
    TRUNCATED = "truncated"                 # shorter than its headers, or msgpack ran out
    BAD_MAGIC = "bad_magic"                 # not llft traffic
    BAD_VERSION = "bad_version"
    OVERSIZE = "oversize"                   # datagram, message or a field over its bound
    BAD_MAC = "bad_mac"                     # forged or corrupted
    MALFORMED = "malformed"                 # bad kind, bad msgpack, wrong types or shape
    UNKNOWN_TYPE = "unknown_type"
    BAD_BODY = "bad_body"                   # body keys/types differ from BODY_FIELDS
    OUT_OF_RANGE = "out_of_range"           # negative or impossible number
    WRONG_GROUP = "wrong_group"             # dst_group is not a group we listen for
    OLD_VIEW = "old_view"                   # pvn older than the source group's current view
    BAD_FRAGMENT = "bad_fragment"           # index/count impossible or inconsistent
    DUPLICATE_FRAGMENT = "duplicate_fragment"
    REASSEMBLY_TIMEOUT = "reassembly_timeout"   # partial message expired (counted per message)
    REASSEMBLY_EVICTED = "reassembly_evicted"   # partial message pushed out by the bounds
    INTERNAL_ERROR = "internal_error"       # a bug in this module; the fuzz test asserts 0


class WireError(ValueError):
    """A message that cannot be encoded (a local bug); `reason` says which rule it broke."""

    def __init__(self, reason: Reject, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


class _Rejected(Exception):
    def __init__(self, reason: Reject):
        self.reason = reason


# ---------------------------------------------------------------------------------------
# Payload: Message <-> msgpack


def pack_message(msg: Message) -> bytes:
    """msgpack payload of `msg`, unchecked (tests use it to craft bad messages)."""
    return msgpack.packb(
        [int(msg.type), msg.src_group, msg.dst_group, msg.conn_seq, int(msg.role), msg.pvn,
         msg.precedence, msg.sender, msg.msn, msg.ack, msg.back, msg.ts, msg.body,
         msg.order_info],
        use_bin_type=True)


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError("msgpack ext types are not part of the llft wire format")


def _check_uint(value: Any) -> int:
    if type(value) is not int:      # bool is an int subclass: refuse it too
        raise _Rejected(Reject.MALFORMED)
    if value < 0 or value > U64_MAX:
        raise _Rejected(Reject.OUT_OF_RANGE)
    return value


def _check_group(value: Any) -> str:
    if type(value) is not str or not value:
        raise _Rejected(Reject.MALFORMED)
    if len(value.encode("utf-8", "surrogatepass")) > MAX_GROUP_BYTES:
        raise _Rejected(Reject.OVERSIZE)
    return value


def _check_body(mtype: MsgType, body: Any) -> dict[str, Any]:
    if type(body) is not dict:
        raise _Rejected(Reject.MALFORMED)
    schema = BODY_FIELDS[mtype]
    if body.keys() != schema.keys():
        raise _Rejected(Reject.BAD_BODY)
    for name, want in schema.items():
        value = body[name]
        allowed = want if isinstance(want, tuple) else (want,)
        if type(value) not in allowed:
            raise _Rejected(Reject.BAD_BODY)
        if type(value) is int and value < 0:
            raise _Rejected(Reject.OUT_OF_RANGE)
    return body


def _parse(fields: Any, version: int) -> Message:
    """Validate a decoded payload array; the same rules guard both encode and decode."""
    if type(fields) is not list or len(fields) != PAYLOAD_LEN:
        raise _Rejected(Reject.MALFORMED)
    raw_type = fields[0]
    if type(raw_type) is not int:
        raise _Rejected(Reject.MALFORMED)
    try:
        mtype = MsgType(raw_type)
    except ValueError:
        raise _Rejected(Reject.UNKNOWN_TYPE) from None
    src = _check_group(fields[1])
    dst = _check_group(fields[2])
    conn_seq, role, pvn, precedence, sender, msn, ack, back, ts = (
        _check_uint(v) for v in fields[3:12])
    if role not in (Role.CLIENT, Role.SERVER):
        raise _Rejected(Reject.OUT_OF_RANGE)
    # messages.py: the message sequence number is > 0 exactly for data messages.
    if (msn > 0) != (mtype in DATA_TYPES):
        raise _Rejected(Reject.OUT_OF_RANGE)
    body = _check_body(mtype, fields[12])
    order_info = fields[13]
    if type(order_info) is not bytes:
        raise _Rejected(Reject.MALFORMED)
    return Message(type=mtype, src_group=src, dst_group=dst, conn_seq=conn_seq,
                   role=Role(role), pvn=pvn, precedence=precedence, sender=sender, msn=msn,
                   ack=ack, back=back, ts=ts, body=body, order_info=order_info,
                   version=version)


def unpack_payload(payload: bytes, version: int = WIRE_VERSION,
                   max_message_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Strictly decode one payload; raises `WireError` (used by tools, not by Decoder)."""
    try:
        return _unpack(payload, version, max_message_bytes)
    except _Rejected as r:
        raise WireError(r.reason, "payload rejected") from None


def _unpack(payload: bytes, version: int, max_message_bytes: int) -> Message:
    if len(payload) > max_message_bytes:
        raise _Rejected(Reject.OVERSIZE)
    try:
        # unpackb bounds every container and string by len(payload), so a hostile
        # length prefix cannot make it allocate beyond the datagram.
        fields = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True,
                                 ext_hook=_no_ext)
    except ValueError as e:     # msgpack's FormatError, ExtraData, StackError all are
        if "incomplete" in str(e):
            raise _Rejected(Reject.TRUNCATED) from None
        raise _Rejected(Reject.MALFORMED) from None
    except RecursionError:
        raise _Rejected(Reject.MALFORMED) from None
    return _parse(fields, version)


def validate(msg: Message) -> bytes:
    """The payload of `msg`; raises `WireError` unless the decoder would accept it
    (before its group and view checks). Packs and re-reads, so tuples, bytearrays or
    enums that msgpack would silently convert are judged as the receiver sees them."""
    if type(msg.version) is not int or not 0 <= msg.version <= 255:
        raise WireError(Reject.OUT_OF_RANGE, f"version {msg.version!r}")
    try:
        payload = pack_message(msg)
        _parse(msgpack.unpackb(payload, raw=False, strict_map_key=True, ext_hook=_no_ext),
               msg.version)
    except _Rejected as r:
        raise WireError(r.reason, f"{msg.type!r} from {msg.src_group!r}") from None
    except (TypeError, ValueError, OverflowError) as e:   # not even packable
        raise WireError(Reject.MALFORMED, str(e)) from None
    return payload


# ---------------------------------------------------------------------------------------
# Datagrams: sealing, fragmenting, peeking


def _tag(key: bytes, prefix: bytes, rest: bytes) -> bytes:
    return hmac.digest(key, prefix + rest, "sha256")[:TAG_BYTES]


def seal(key: bytes, body: bytes, *, kind: int = KIND_WHOLE,
         version: int = WIRE_VERSION) -> bytes:
    """One authenticated datagram: prefix, tag, then `body` (a payload, or a fragment
    header + chunk). Unchecked, so tests can seal anything."""
    prefix = PREFIX.pack(MAGIC, version, kind)
    return prefix + _tag(key, prefix, body) + body


def fragment_body(sender: int, frag_id: int, index: int, count: int, chunk: bytes) -> bytes:
    return FRAG.pack(sender, frag_id, index, count) + chunk


@dataclass(frozen=True, slots=True)
class Peek:
    """The fixed part of a datagram, read without checking the tag (sniffing, tools)."""
    magic: bytes
    version: int
    kind: int
    tag: bytes
    sender: int | None = None
    frag_id: int | None = None
    index: int | None = None
    count: int | None = None
    data: bytes = b""             # payload (kind 0) or chunk (kind 1)


def peek(datagram: bytes) -> Peek | None:
    """Split a datagram into its fixed fields, or None if it is too short to have them."""
    if len(datagram) < HEADER_BYTES:
        return None
    magic, version, kind = PREFIX.unpack_from(datagram)
    tag = bytes(datagram[PREFIX_BYTES:HEADER_BYTES])
    if kind == KIND_FRAGMENT:
        if len(datagram) < FRAG_HEADER_BYTES:
            return None
        sender, frag_id, index, count = FRAG.unpack_from(datagram, HEADER_BYTES)
        return Peek(magic, version, kind, tag, sender, frag_id, index, count,
                    bytes(datagram[FRAG_HEADER_BYTES:]))
    return Peek(magic, version, kind, tag, data=bytes(datagram[HEADER_BYTES:]))


def verify_tag(key: bytes, datagram: bytes) -> bool:
    if len(datagram) < HEADER_BYTES:
        return False
    expect = _tag(key, bytes(datagram[:PREFIX_BYTES]), bytes(datagram[HEADER_BYTES:]))
    return hmac.compare_digest(expect, bytes(datagram[PREFIX_BYTES:HEADER_BYTES]))


def _check_key(key: bytes) -> bytes:
    if type(key) is not bytes or len(key) != KEY_BYTES:
        raise ValueError(f"a cluster key is {KEY_BYTES} bytes")
    return key


# ---------------------------------------------------------------------------------------
# The native half (native/wire/): the same rules, in C


CODECS = ("python", "native", "differential")
# Reject reasons the C half can give, by their C number (LLFT_WIRE_REJECT + LLFT_WIRE_R_*)
NATIVE_REJECTS: dict[int, Reject] = (
    {} if _lib is None else
    {_lib.LLFT_WIRE_REJECT + getattr(_lib, f"LLFT_WIRE_R_{r.name}"): r
     for r in Reject if hasattr(_lib, f"LLFT_WIRE_R_{r.name}")})
_OUT = struct.Struct(f"={0 if _lib is None else _lib.LLFT_WIRE_OUT}Q")
# verdicts (llft_wire.h), read once: the decode path compares against them per datagram
_V_OK, _V_FALLBACK, _V_FRAGMENT = ((-1, -1, -1) if _lib is None else
                                   (_lib.LLFT_WIRE_OK, _lib.LLFT_WIRE_FALLBACK,
                                    _lib.LLFT_WIRE_FRAGMENT))
_SPAN = 0xFFFFFFFF
_TYPES = {int(t): t for t in MsgType}


def native_available() -> bool:
    return _lib is not None


def default_codec() -> str:
    """The codec of this process: LLFT_WIRE (python | native | differential) if set, else
    native when it is built, else python."""
    want = os.environ.get("LLFT_WIRE", "").strip().lower()
    if want:
        if want not in CODECS:
            raise ValueError(f"LLFT_WIRE={want!r}: one of {', '.join(CODECS)}")
        if want != "python" and _lib is None:
            raise ValueError(f"LLFT_WIRE={want}: native._llft_wire is not built "
                             "(run scripts/setup.sh)")
        return want
    return "native" if _lib is not None else "python"


class NativeCodec:
    """The C half of one cluster key's codec: `open` judges a datagram as the reference
    `Decoder._decode` does up to reassembly, `seal` is `seal()`. One per Encoder/Decoder
    (it owns a result buffer)."""

    def __init__(self, key: bytes):
        if _lib is None:
            raise RuntimeError("native._llft_wire is not built (run scripts/setup.sh)")
        self.key = key = _check_key(key)
        self._w = _ffi.gc(_lib.llft_wire_new(key, len(key)), _lib.llft_wire_free)
        if self._w == _ffi.NULL:
            raise MemoryError("llft_wire_new")
        for version in SUPPORTED_VERSIONS:
            _lib.llft_wire_support(self._w, version)
        # per type: its body field names, and which of them are bytes (the rest are ints)
        self._fields: dict[int, tuple[tuple[str, ...], tuple[bool, ...]]] = {}
        for mtype, schema in BODY_FIELDS.items():
            names = tuple(schema)
            # a field that takes exactly int or exactly bytes is read in C; any other
            # makes the type the reference's (LIST: the C half hands it back)
            masks = bytes(_lib.LLFT_WIRE_INT if want is int else
                          _lib.LLFT_WIRE_BYTES if want is bytes else _lib.LLFT_WIRE_LIST
                          for want in schema.values())
            blob = b"".join(n.encode() + b"\0" for n in names)
            if _lib.llft_wire_schema(self._w, int(mtype), mtype in DATA_TYPES, len(names),
                                     blob, masks) != 0:
                raise ValueError(f"{mtype!r}: schema the native codec cannot hold")
            self._fields[int(mtype)] = (names, tuple(want is bytes for want in schema.values()))
        self._out = _ffi.new("uint64_t[]", _lib.LLFT_WIRE_OUT)
        self._view = _ffi.buffer(self._out)
        self._seal_buf = _ffi.new("char[]", MAX_DATAGRAM_BYTES)

    def seal(self, body: bytes, kind: int, version: int) -> bytes:
        n = len(body)
        if HEADER_BYTES + n > MAX_DATAGRAM_BYTES or not 0 <= version <= 255:
            return seal(self.key, body, kind=kind, version=version)
        m = _lib.llft_wire_seal(self._w, version, kind, body, n, self._seal_buf)
        return _ffi.unpack(self._seal_buf, m)

    def open(self, datagram: bytes, max_message_bytes: int) -> tuple[int, ...]:
        """The C verdict on a datagram (llft_wire.h's result layout)."""
        _lib.llft_wire_open(self._w, datagram, len(datagram), max_message_bytes, self._out)
        return _OUT.unpack_from(self._view)

    def parse(self, payload: bytes, max_message_bytes: int) -> tuple[int, ...]:
        _lib.llft_wire_parse(self._w, payload, len(payload), max_message_bytes, self._out)
        return _OUT.unpack_from(self._view)

    def message(self, buf: bytes, v: tuple[int, ...], version: int,
                max_message_bytes: int) -> Message:
        """The Message of an `open`/`parse` result on `buf`; raises _Rejected."""
        verdict = v[0]
        if verdict == _V_OK:
            t = v[2]
            names, is_bytes = self._fields[t]
            body = {}
            for i in range(v[15]):
                j = v[16 + i]
                x = v[24 + i]
                body[names[j]] = buf[x >> 32:(x >> 32) + (x & _SPAN)] if is_bytes[j] else x
            s, d, o = v[12], v[13], v[14]
            return Message(_TYPES[t], buf[s >> 32:(s >> 32) + (s & _SPAN)].decode(),
                           buf[d >> 32:(d >> 32) + (d & _SPAN)].decode(), v[3], ROLES[v[4]],
                           v[5], v[6], v[7], v[8], v[9], v[10], v[11], body,
                           buf[o >> 32:(o >> 32) + (o & _SPAN)], version)
        if verdict == _V_FALLBACK:
            p = v[6]
            return _unpack(buf[p >> 32:(p >> 32) + (p & _SPAN)], version, max_message_bytes)
        raise _Rejected(NATIVE_REJECTS.get(verdict, Reject.INTERNAL_ERROR))


class Encoder:
    """Message -> datagrams. One per sending replica: it numbers fragmented messages."""

    def __init__(self, key: bytes, *, mtu_bytes: int = DEFAULT_MTU_BYTES,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, first_frag_id: int = 0,
                 check: bool = True, codec: str | None = None):
        """`check`: re-read every message as the decoder would (`validate`: pack, unpack,
        parse; about 2/3 of encoding). The simulator and tests keep it on, so a core that
        builds a message the decoder refuses fails there; a production sender may turn it
        off (`pack_message` only): such a message is then rejected, and counted, by its
        receivers instead of raising here. `codec` (default: `default_codec()`): "python"
        seals with hmac, "native" with the C half (the same bytes), "differential" with
        both, raising `WireDivergence` if they differ."""
        self.check = check
        if not MIN_MTU_BYTES <= mtu_bytes <= MAX_DATAGRAM_BYTES:
            raise ValueError(f"mtu_bytes must be in [{MIN_MTU_BYTES}, {MAX_DATAGRAM_BYTES}]")
        self.key = _check_key(key)
        self.mtu_bytes = mtu_bytes
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = mtu_bytes - FRAG_HEADER_BYTES
        self._next_frag_id = first_frag_id & U32_MAX
        self.codec = codec or default_codec()
        self._native = NativeCodec(key) if self.codec != "python" else None

    def _seal(self, body: bytes, kind: int, version: int) -> bytes:
        if self._native is None:
            return seal(self.key, body, kind=kind, version=version)
        dg = self._native.seal(body, kind, version)
        if self.codec == "differential" and dg != seal(self.key, body, kind=kind,
                                                        version=version):
            raise WireDivergence(f"sealed apart: kind {kind} version {version} "
                                 f"body {body.hex()}")
        return dg

    def encode(self, msg: Message) -> list[bytes]:
        """Datagrams carrying `msg` (one unless it exceeds the MTU); raises WireError."""
        if self.check:
            payload = validate(msg)
        else:
            try:
                payload = pack_message(msg)
            except (TypeError, ValueError, OverflowError) as e:   # not even packable
                raise WireError(Reject.MALFORMED, str(e)) from None
        if len(payload) > self.max_message_bytes:
            raise WireError(Reject.OVERSIZE, f"payload of {len(payload)} bytes")
        if HEADER_BYTES + len(payload) <= self.mtu_bytes:
            return [self._seal(payload, KIND_WHOLE, msg.version)]
        count = -(-len(payload) // self.chunk_bytes)
        if count > MAX_FRAGMENTS:
            raise WireError(Reject.OVERSIZE, f"{count} fragments at mtu {self.mtu_bytes}")
        frag_id = self._next_frag_id
        self._next_frag_id = (frag_id + 1) & U32_MAX
        c = self.chunk_bytes
        return [self._seal(fragment_body(msg.sender, frag_id, i, count,
                                         payload[i * c:(i + 1) * c]),
                           KIND_FRAGMENT, msg.version)
                for i in range(count)]


def encode(msg: Message, key: bytes, *, mtu_bytes: int = DEFAULT_MTU_BYTES,
           frag_id: int = 0) -> list[bytes]:
    """One-shot encoding (tests, tools); a sending replica keeps an `Encoder`."""
    return Encoder(key, mtu_bytes=mtu_bytes, first_frag_id=frag_id,
                   codec="python").encode(msg)


# ---------------------------------------------------------------------------------------
# Decoding


@dataclass(slots=True)
class _Partial:
    count: int
    first_us: int
    version: int
    chunks: dict[int, bytes]
    nbytes: int = 0


class Decoder:
    """Datagrams -> Messages for one replica: authenticate, reassemble, validate, filter.

    `groups` are the destination groups this replica listens for (its own group; a
    gateway may listen for several); None accepts any (tools such as `llft sniff`).
    `set_view(group, pvn)` is called by the runtime whenever it learns a group's current
    primary view number -- its own group's included, so that stale intra-group traffic
    from a deposed primary is refused too.
    """

    def __init__(self, key: bytes, groups: str | Iterable[str] | None, *,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 reassembly_max_messages: int = REASSEMBLY_MAX_MESSAGES,
                 reassembly_max_bytes: int = REASSEMBLY_MAX_BYTES,
                 reassembly_timeout_us: int = REASSEMBLY_TIMEOUT_US,
                 recent_done_max: int = RECENT_DONE_MAX, native: bool | None = None):
        """`native`: judge datagrams with the C half (None: if `default_codec()` is not
        "python"); False: this reference code alone."""
        self.key = _check_key(key)
        if native is None:
            native = default_codec() != "python"
        self._native = NativeCodec(key) if native else None
        self.groups: set[str] | None = (
            None if groups is None else {groups} if isinstance(groups, str) else set(groups))
        self.max_message_bytes = max_message_bytes
        self.reassembly_max_messages = reassembly_max_messages
        self.reassembly_max_bytes = max(reassembly_max_bytes, max_message_bytes)
        self.reassembly_timeout_us = reassembly_timeout_us
        self.recent_done_max = recent_done_max
        self.rejections: Counter[Reject] = Counter()
        self.accepted = 0
        self._views: dict[str, int] = {}
        # (sender, frag_id) -> partial, oldest first: eviction pops from the front.
        self._partials: OrderedDict[tuple[int, int], _Partial] = OrderedDict()
        self._partial_bytes = 0
        self._recent_done: OrderedDict[tuple[int, int], None] = OrderedDict()

    # -- what the runtime tells us -------------------------------------------------
    def set_view(self, group: str, pvn: int) -> None:
        """The current primary view number of `group`; older data/control is refused.
        The value replaces the previous one (a replica that resets and rejoins may need
        to lower it); membership messages are never filtered by it."""
        self._views[group] = pvn

    def view(self, group: str) -> int | None:
        return self._views.get(group)

    def listen(self, group: str) -> None:
        if self.groups is not None:
            self.groups.add(group)

    def unlisten(self, group: str) -> None:
        if self.groups is not None:
            self.groups.discard(group)

    @property
    def native(self) -> bool:
        """Whether the C half judges this decoder's datagrams."""
        return self._native is not None

    # -- reassembly state, for status and tests ------------------------------------
    @property
    def partial_messages(self) -> int:
        return len(self._partials)

    @property
    def partial_bytes(self) -> int:
        return self._partial_bytes

    # -- the entry point -------------------------------------------------------------
    def decode(self, datagram: bytes, now_us: int) -> Message | None:
        """The message `datagram` completes, or None (rejected, or a fragment held)."""
        try:
            msg = self._decode(datagram, now_us)
        except _Rejected as r:
            self.rejections[r.reason] += 1
            return None
        except Exception:   # noqa: BLE001 -- the receive path must never die on input
            self.rejections[Reject.INTERNAL_ERROR] += 1
            return None
        if msg is not None:
            self.accepted += 1
        return msg

    def rejected_total(self) -> int:
        """Datagrams refused so far (any reason)."""
        return sum(self.rejections.values())

    def expire(self, now_us: int) -> int:
        """Drop partial messages older than the timeout; returns how many."""
        dropped = 0
        while self._partials:
            key, part = next(iter(self._partials.items()))
            if now_us - part.first_us < self.reassembly_timeout_us:
                break
            self._drop_partial(key)
            self.rejections[Reject.REASSEMBLY_TIMEOUT] += 1
            dropped += 1
        return dropped

    def _decode(self, datagram: bytes, now_us: int) -> Message | None:
        if self._native is not None:
            return self._decode_native(bytes(datagram), now_us)
        n = len(datagram)
        if n < PREFIX_BYTES:
            m = min(n, len(MAGIC))
            raise _Rejected(Reject.TRUNCATED if datagram[:m] == MAGIC[:m] else Reject.BAD_MAGIC)
        magic, version, kind = PREFIX.unpack_from(datagram)
        if magic != MAGIC:
            raise _Rejected(Reject.BAD_MAGIC)
        if version not in SUPPORTED_VERSIONS:
            raise _Rejected(Reject.BAD_VERSION)
        if kind not in (KIND_WHOLE, KIND_FRAGMENT):
            raise _Rejected(Reject.MALFORMED)
        if n > MAX_DATAGRAM_BYTES:
            raise _Rejected(Reject.OVERSIZE)
        if n < (HEADER_BYTES if kind == KIND_WHOLE else FRAG_HEADER_BYTES):
            raise _Rejected(Reject.TRUNCATED)
        datagram = bytes(datagram)
        expect = _tag(self.key, datagram[:PREFIX_BYTES], datagram[HEADER_BYTES:])
        if not hmac.compare_digest(expect, datagram[PREFIX_BYTES:HEADER_BYTES]):
            raise _Rejected(Reject.BAD_MAC)
        if kind == KIND_WHOLE:
            return self._admit(_unpack(datagram[HEADER_BYTES:], version,
                                       self.max_message_bytes))
        sender, frag_id, index, count = FRAG.unpack_from(datagram, HEADER_BYTES)
        return self._fragment(sender, frag_id, index, count, version,
                              datagram[FRAG_HEADER_BYTES:], now_us)

    def _decode_native(self, datagram: bytes, now_us: int) -> Message | None:
        """`_decode` with the per-datagram work done in C (the same verdicts)."""
        codec = self._native
        v = codec.open(datagram, self.max_message_bytes)
        if v[0] != _V_FRAGMENT:
            return self._admit(codec.message(datagram, v, v[1], self.max_message_bytes))
        return self._fragment(v[2], v[3], v[4], v[5], v[1], datagram[v[6] >> 32:], now_us)

    def _fragment(self, sender: int, frag_id: int, index: int, count: int, version: int,
                  chunk: bytes, now_us: int) -> Message | None:
        """A fragment whose tag is good (either half): held, or the message it completes."""
        payload = self._reassemble(sender, frag_id, index, count, version, chunk, now_us)
        if payload is None:
            return None
        if self._native is None:
            msg = _unpack(payload, version, self.max_message_bytes)
        else:
            codec = self._native
            msg = codec.message(payload, codec.parse(payload, self.max_message_bytes),
                                version, self.max_message_bytes)
        if msg.sender != sender:    # the fragment header must name the message's sender
            raise _Rejected(Reject.BAD_FRAGMENT)
        return self._admit(msg)

    def _admit(self, msg: Message) -> Message:
        if self.groups is not None and msg.dst_group not in self.groups:
            raise _Rejected(Reject.WRONG_GROUP)
        if msg.type not in MEMBERSHIP_TYPES:      # those carry their own view rules
            current = self._views.get(msg.src_group)
            if current is not None and msg.pvn < current:
                raise _Rejected(Reject.OLD_VIEW)
        return msg

    def _reassemble(self, sender: int, frag_id: int, index: int, count: int, version: int,
                    chunk: bytes, now_us: int) -> bytes | None:
        if not 2 <= count <= MAX_FRAGMENTS or index >= count or not chunk:
            raise _Rejected(Reject.BAD_FRAGMENT)
        key = (sender, frag_id)
        if key in self._recent_done:
            raise _Rejected(Reject.DUPLICATE_FRAGMENT)
        self.expire(now_us)
        part = self._partials.get(key)
        if part is None:
            while len(self._partials) >= self.reassembly_max_messages:
                self._evict_oldest()
            part = _Partial(count=count, first_us=now_us, version=version, chunks={})
            self._partials[key] = part
        elif part.count != count or part.version != version:
            raise _Rejected(Reject.BAD_FRAGMENT)
        if index in part.chunks:
            raise _Rejected(Reject.DUPLICATE_FRAGMENT)
        if part.nbytes + len(chunk) > self.max_message_bytes:
            self._drop_partial(key)
            raise _Rejected(Reject.OVERSIZE)
        while self._partial_bytes + len(chunk) > self.reassembly_max_bytes:
            oldest = next(iter(self._partials))
            if oldest == key:       # only this message left: it cannot fit
                self._drop_partial(key)
                raise _Rejected(Reject.REASSEMBLY_EVICTED)
            self._evict_oldest()
        part.chunks[index] = chunk
        part.nbytes += len(chunk)
        self._partial_bytes += len(chunk)
        if len(part.chunks) < count:
            return None
        self._drop_partial(key)
        self._recent_done[key] = None
        if len(self._recent_done) > self.recent_done_max:
            self._recent_done.popitem(last=False)
        return b"".join(part.chunks[i] for i in range(count))

    def _evict_oldest(self) -> None:
        self._drop_partial(next(iter(self._partials)))
        self.rejections[Reject.REASSEMBLY_EVICTED] += 1

    def _drop_partial(self, key: tuple[int, int]) -> None:
        part = self._partials.pop(key)
        self._partial_bytes -= part.nbytes


# ---------------------------------------------------------------------------------------
# Differential decoding: the C half checked against the reference, datagram by datagram


class WireDivergence(AssertionError):
    """The C half and the reference judged one datagram apart: a bug in one of them."""


def same_message(a: Message | None, b: Message | None) -> bool:
    """Equal, and equal in every type and in the body's key order."""
    if a is None or b is None:
        return a is b
    return (a == b and type(a.type) is type(b.type) and type(a.role) is type(b.role)
            and list(a.body) == list(b.body)
            and all(type(a.body[k]) is type(b.body[k]) for k in a.body)
            and all(type(getattr(a, f)) is type(getattr(b, f)) for f in HEADER_FIELDS))


class DifferentialDecoder(Decoder):
    """A native Decoder with the reference beside it: every datagram is judged by both,
    and the first one they judge apart (message, or reason counted) raises
    `WireDivergence` out of `decode`, with the datagram in its message. A running
    process (LLFT_WIRE=differential) sets `on_divergence` instead: it is told, and the
    reference's verdict stands (the counters are set to the reference's)."""

    def __init__(self, key: bytes, groups: str | Iterable[str] | None, **kwargs: Any):
        super().__init__(key, groups, native=True, **kwargs)
        self.reference = Decoder(key, groups, native=False, **kwargs)
        self.on_divergence: Callable[[WireDivergence], None] | None = None

    def decode(self, datagram: bytes, now_us: int) -> Message | None:
        want = self.reference.decode(datagram, now_us)
        got = super().decode(datagram, now_us)
        if not same_message(want, got) or self.reference.rejections != self.rejections:
            err = WireDivergence(
                f"datagram {bytes(datagram).hex()}: reference {want!r} "
                f"{dict(self.reference.rejections)}, native {got!r} {dict(self.rejections)}")
            if self.on_divergence is None:
                raise err
            self.on_divergence(err)
            self.rejections = Counter(self.reference.rejections)
            self.accepted = self.reference.accepted
            return want
        return got

    def set_view(self, group: str, pvn: int) -> None:
        super().set_view(group, pvn)
        self.reference.set_view(group, pvn)

    def listen(self, group: str) -> None:
        super().listen(group)
        self.reference.listen(group)

    def unlisten(self, group: str) -> None:
        super().unlisten(group)
        self.reference.unlisten(group)

    def expire(self, now_us: int) -> int:
        self.reference.expire(now_us)
        return super().expire(now_us)


def make_decoder(key: bytes, groups: str | Iterable[str] | None, *,
                 codec: str | None = None, **kwargs: Any) -> Decoder:
    """A Decoder for `codec` (python | native | differential; None: `default_codec()`)."""
    codec = codec or default_codec()
    if codec == "differential":
        return DifferentialDecoder(key, groups, **kwargs)
    if codec not in CODECS:
        raise ValueError(f"codec {codec!r}: one of {', '.join(CODECS)}")
    return Decoder(key, groups, native=codec == "native", **kwargs)
