"""scapy layers for llft datagrams: dissect live traffic, craft bad traffic.

Theory of operation
-------------------
`LLFT` is the fixed datagram header of llft/protocol/wire.py (magic, version, kind, 16-byte tag);
a fragment's header (sender, frag_id, index, count) is the `LLFTFragment` layer after
it, its chunk `Raw`. A whole message's payload dissects as
`LLFTMessage`: the msgpack array of header fields, body and order_info, one scapy field
per array element (each a msgpack object), so `show()` names every header field and a
test can set any of them to any msgpack value -- a string where an int belongs, a
negative pvn, a body with a missing key -- to exercise the decoder. A fragment's chunk
stays `Raw` (it is a slice of a payload, meaningless alone). Craft a fragment with
`LLFT(kind=1) / LLFTFragment(sender=..., frag_id=..., index=..., count=...) / chunk`.

Tags: leave `tag` unset and set `LLFT.mac_key` (or call `sign(pkt, key)`) to get a valid
HMAC over the built bytes; set `tag` explicitly to forge one. Nothing here validates:
building follows the fields as given, dissecting never refuses (bad msgpack becomes Raw).

`bind_llft()` makes UDP hand our default port range (transport.PORT_BASE..+PORT_SPAN)
to `LLFT`; `bind_llft(port=P)` binds one explicit port (tests use random ports).
"""
from __future__ import annotations

import hmac
import struct

import msgpack
from scapy.fields import (ByteEnumField, ByteField, Field, IntField,
                          ShortField, StrFixedLenField, XLongField, XStrFixedLenField)
from scapy.layers.inet import UDP
from scapy.packet import Packet, Raw, bind_bottom_up, bind_layers

from llft.runtime import transport
from llft.protocol import wire
from llft.protocol.messages import BODY_FIELDS, WIRE_VERSION, MsgType, Role

ZERO_VALUES = {int: 0, bytes: b"", str: "", list: []}


def zero_body(mtype) -> dict:
    """A schema-correct body of zeros for `mtype` (crafting convenience)."""
    try:
        schema = BODY_FIELDS[MsgType(mtype)]
    except (ValueError, KeyError, TypeError):
        return {}
    return {k: ZERO_VALUES[t[0] if isinstance(t, tuple) else t] for k, t in schema.items()}


class MsgpackField(Field):
    """One msgpack object, any type: the wire format's array elements."""
    # islist: a list value is one msgpack array, not scapy's "one packet per element".
    islist = 1

    def __init__(self, name, default):
        Field.__init__(self, name, default, fmt="B")

    def addfield(self, pkt, s, val):
        return s + msgpack.packb(val, use_bin_type=True)

    def getfield(self, pkt, s):
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=True,
                                    max_buffer_size=max(len(s), 1))
        unpacker.feed(s)
        val = unpacker.unpack()
        return s[unpacker.tell():], val

    def i2m(self, pkt, x):
        return x

    def m2i(self, pkt, x):
        return x

    def any2i(self, pkt, x):
        return x

    def i2repr(self, pkt, x):
        return repr(x)


class _TypeField(MsgpackField):
    def i2repr(self, pkt, x):
        try:
            return f"{MsgType(x).name} ({x})"
        except (ValueError, TypeError):
            return repr(x)


class _RoleField(MsgpackField):
    def i2repr(self, pkt, x):
        try:
            return Role(x).name
        except (ValueError, TypeError):
            return repr(x)


class _BodyField(MsgpackField):
    def addfield(self, pkt, s, val):
        if val is None:
            val = zero_body(pkt.type)
        return MsgpackField.addfield(self, pkt, s, val)


class MsgpackArrayLenField(Field):
    """A msgpack array header: fixarray, array16 or array32."""

    def __init__(self, name, default):
        Field.__init__(self, name, default, fmt="B")

    def addfield(self, pkt, s, val):
        if val < 16:
            return s + bytes([0x90 | val])
        if val < 1 << 16:
            return s + b"\xdc" + struct.pack("!H", val)
        return s + b"\xdd" + struct.pack("!I", val)

    def getfield(self, pkt, s):
        first = s[0]
        if first & 0xF0 == 0x90:
            return s[1:], first & 0x0F
        if first == 0xDC:
            return s[3:], struct.unpack("!H", s[1:3])[0]
        if first == 0xDD:
            return s[5:], struct.unpack("!I", s[1:5])[0]
        raise ValueError("not a msgpack array")


class LLFTMessage(Packet):
    """A whole message's msgpack payload, one field per array element."""
    name = "LLFT message"
    fields_desc = [
        MsgpackArrayLenField("nfields", wire.PAYLOAD_LEN),
        _TypeField("type", int(MsgType.HEARTBEAT)),
        MsgpackField("src_group", "g"),
        MsgpackField("dst_group", "g"),
        MsgpackField("conn_seq", 0),
        _RoleField("role", 0),
        MsgpackField("pvn", 0),
        MsgpackField("precedence", 0),
        MsgpackField("sender", 0),
        MsgpackField("msn", 0),
        MsgpackField("ack", 0),
        MsgpackField("back", 0),
        MsgpackField("ts", 0),
        _BodyField("body", None),
        MsgpackField("order_info", b""),
    ]

    def mysummary(self):
        return self.sprintf("LLFT %type% %src_group%>%dst_group% pvn=%pvn% msn=%msn%")


class _ByteOrNone(ByteField):
    """A byte that may be missing (a datagram shorter than its prefix): None, no error."""

    def getfield(self, pkt, s):
        if not s:
            return s, None
        return ByteField.getfield(self, pkt, s)


class _ByteEnumOrNone(ByteEnumField):
    def getfield(self, pkt, s):
        if not s:
            return s, None
        return ByteEnumField.getfield(self, pkt, s)


class LLFTFragment(Packet):
    """The fragment header that follows `LLFT` when kind is 1; the chunk stays Raw.
    A separate layer, so a datagram too short for it dissects as Raw, not an error."""
    name = "LLFT fragment"
    fields_desc = [
        XLongField("sender", 0),
        IntField("frag_id", 0),
        ShortField("index", 0),
        ShortField("count", 2),
    ]

    def guess_payload_class(self, payload):
        return Raw

    def mysummary(self):
        return self.sprintf("LLFT fragment %sender%/%frag_id% %index%/%count%")


class LLFT(Packet):
    """The fixed datagram header; `tag` None means: compute it with `mac_key`."""
    name = "LLFT"
    mac_key: bytes | None = None     # key used when `tag` is left unset
    fields_desc = [
        StrFixedLenField("magic", wire.MAGIC, 2),
        _ByteOrNone("version", WIRE_VERSION),
        _ByteEnumOrNone("kind", wire.KIND_WHOLE, {wire.KIND_WHOLE: "whole",
                                                 wire.KIND_FRAGMENT: "fragment"}),
        XStrFixedLenField("tag", None, wire.TAG_BYTES),
    ]

    def guess_payload_class(self, payload):
        if self.magic != wire.MAGIC:
            return Raw
        if self.kind == wire.KIND_WHOLE:
            return LLFTMessage
        if self.kind == wire.KIND_FRAGMENT:
            return LLFTFragment
        return Raw

    def post_build(self, pkt, pay):
        data = pkt + pay
        if self.tag is None:
            key = self.mac_key if self.mac_key is not None else b"\x00" * wire.KEY_BYTES
            data = _with_tag(data, key)
        return data


def _with_tag(data: bytes, key: bytes) -> bytes:
    if len(data) < wire.HEADER_BYTES:
        return data
    tag = hmac.digest(key, data[:wire.PREFIX_BYTES] + data[wire.HEADER_BYTES:],
                      "sha256")[:wire.TAG_BYTES]
    return data[:wire.PREFIX_BYTES] + tag + data[wire.HEADER_BYTES:]


def sign(pkt, key: bytes) -> bytes:
    """The bytes of an LLFT packet (or of raw datagram bytes) with a valid tag."""
    return _with_tag(bytes(pkt), key)


class _PortRange:
    """Compares equal to any port in [lo, hi): lets one scapy binding cover a range."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def __eq__(self, other):
        return isinstance(other, int) and self.lo <= other < self.hi

    __hash__ = None

    def __repr__(self):
        return f"{self.lo}..{self.hi - 1}"


def bind_llft(port: int | None = None, port_range: tuple[int, int] | None = None) -> None:
    """Dissect UDP to/from `port` (build and dissect), or any port in `port_range`
    (default: the transport's default virtual ports; dissect only) as LLFT."""
    if port is not None:
        bind_layers(UDP, LLFT, dport=port)
        bind_bottom_up(UDP, LLFT, sport=port)
        return
    lo, hi = port_range or (transport.PORT_BASE, transport.PORT_BASE + transport.PORT_SPAN)
    bind_bottom_up(UDP, LLFT, dport=_PortRange(lo, hi))


bind_llft()
