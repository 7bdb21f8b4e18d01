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
"""
from __future__ import annotations

import enum
import hmac
import struct
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable

import msgpack

from llft.protocol.messages import (BODY_FIELDS, DATA_TYPES, MEMBERSHIP_TYPES, WIRE_VERSION,
                                    Message, MsgType, Role)

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


class Encoder:
    """Message -> datagrams. One per sending replica: it numbers fragmented messages."""

    def __init__(self, key: bytes, *, mtu_bytes: int = DEFAULT_MTU_BYTES,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, first_frag_id: int = 0,
                 check: bool = True):
        """`check`: re-read every message as the decoder would (`validate`: pack, unpack,
        parse; about 2/3 of encoding). The simulator and tests keep it on, so a core that
        builds a message the decoder refuses fails there; a production sender may turn it
        off (`pack_message` only): such a message is then rejected, and counted, by its
        receivers instead of raising here."""
        self.check = check
        if not MIN_MTU_BYTES <= mtu_bytes <= MAX_DATAGRAM_BYTES:
            raise ValueError(f"mtu_bytes must be in [{MIN_MTU_BYTES}, {MAX_DATAGRAM_BYTES}]")
        self.key = _check_key(key)
        self.mtu_bytes = mtu_bytes
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = mtu_bytes - FRAG_HEADER_BYTES
        self._next_frag_id = first_frag_id & U32_MAX

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
            return [seal(self.key, payload, version=msg.version)]
        count = -(-len(payload) // self.chunk_bytes)
        if count > MAX_FRAGMENTS:
            raise WireError(Reject.OVERSIZE, f"{count} fragments at mtu {self.mtu_bytes}")
        frag_id = self._next_frag_id
        self._next_frag_id = (frag_id + 1) & U32_MAX
        c = self.chunk_bytes
        return [seal(self.key, fragment_body(msg.sender, frag_id, i, count,
                                             payload[i * c:(i + 1) * c]),
                     kind=KIND_FRAGMENT, version=msg.version)
                for i in range(count)]


def encode(msg: Message, key: bytes, *, mtu_bytes: int = DEFAULT_MTU_BYTES,
           frag_id: int = 0) -> list[bytes]:
    """One-shot encoding (tests, tools); a sending replica keeps an `Encoder`."""
    return Encoder(key, mtu_bytes=mtu_bytes, first_frag_id=frag_id).encode(msg)


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
                 recent_done_max: int = RECENT_DONE_MAX):
        self.key = _check_key(key)
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
        payload = self._reassemble(sender, frag_id, index, count, version,
                                   datagram[FRAG_HEADER_BYTES:], now_us)
        if payload is None:
            return None
        msg = _unpack(payload, version, self.max_message_bytes)
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
