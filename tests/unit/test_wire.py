"""The wire codec: round trips, every rejection reason, fragmentation and its bounds."""
import random

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from llft.protocol.messages import BODY_FIELDS, DATA_TYPES, WIRE_VERSION, Message, MsgType, Role
from llft.protocol import wire
from llft.protocol.wire import (HEADER_BYTES, KIND_FRAGMENT, MAGIC, Encoder, Reject,
                                WireError, encode, fragment_body, make_decoder, pack_message,
                                seal)
from wire_samples import KEY, make

# Every test here runs on the reference alone and on the differential decoder (the C half
# deciding, the reference judging each datagram beside it: any difference raises).
CODECS = ["python"] + (["differential"] if wire.native_available() else [])


@pytest.fixture(autouse=True, params=CODECS)
def codec(request, monkeypatch):
    monkeypatch.setenv("LLFT_WIRE", request.param)
    return request.param


def Decoder(key, groups, **kw):     # noqa: N802 -- the codec's Decoder under test
    return make_decoder(key, groups, **kw)

OTHER_KEY = bytes(range(1, 33))


def one(msg, key=KEY):
    (dg,) = encode(msg, key)
    return dg


def payload_list(msg):
    return msgpack.unpackb(pack_message(msg), raw=False)


def sealed(fields, **kw):
    return seal(KEY, msgpack.packb(fields, use_bin_type=True), **kw)


@pytest.mark.parametrize("mtype", list(MsgType))
def test_round_trip_every_type(mtype):
    msg = make(mtype)
    dec = Decoder(KEY, "server")
    got = dec.decode(one(msg), 0)
    assert got == msg and type(got.type) is MsgType and type(got.role) is Role
    assert dec.accepted == 1 and not dec.rejections


def test_intra_group_and_multiple_groups():
    dec = Decoder(KEY, ["g", "gw"])
    assert dec.decode(one(make(MsgType.HEARTBEAT, src="g", dst="g")), 0) is not None
    assert dec.decode(one(make(src="c", dst="gw")), 0) is not None
    assert dec.decode(one(make(src="c", dst="h")), 0) is None
    assert dec.rejections == {Reject.WRONG_GROUP: 1}


def test_layout_prefix_and_tag():
    dg = one(make())
    assert dg[:2] == MAGIC and dg[2] == wire.WIRE_VERSION and dg[3] == wire.KIND_WHOLE
    assert wire.verify_tag(KEY, dg) and not wire.verify_tag(OTHER_KEY, dg)
    p = wire.peek(dg)
    assert p.kind == 0 and p.data == pack_message(make())


# -- each rejection reason ------------------------------------------------------------

def good_fields():
    return payload_list(make())


def with_field(i, value):
    f = good_fields()
    f[i] = value
    return f


def with_body(**body):
    f = good_fields()
    f[12] = body
    return f


REJECTIONS = {
    Reject.TRUNCATED: [b"", b"L", b"LF\x01", one(make())[:HEADER_BYTES - 1],
                       seal(KEY, pack_message(make())[:-3]),
                       seal(KEY, b"\x00" * 5, kind=KIND_FRAGMENT)],
    Reject.BAD_MAGIC: [b"X", b"GET / HTTP/1.0\r\n", b"\x00" * 64],
    Reject.BAD_VERSION: [b"LF\x09\x00" + one(make())[4:], seal(KEY, b"\x90", version=WIRE_VERSION + 1)],
    Reject.OVERSIZE: [seal(KEY, b"\x00" * 70000), sealed(with_field(1, "g" * (wire.MAX_GROUP_BYTES + 1))),
                      seal(KEY, b"\xc4\x01x" * (wire.MAX_MESSAGE_BYTES // 3 + 1))],
    Reject.BAD_MAC: [one(make(), OTHER_KEY), one(make())[:-1],
                     one(make())[:30] + b"\xff" + one(make())[31:]],
    Reject.MALFORMED: [seal(KEY, b"\xc1"), seal(KEY, b"\x90"), seal(KEY, b"\x01"),
                       seal(KEY, pack_message(make()) + b"\x00"),   # trailing bytes
                       seal(KEY, b"\x90", kind=7),
                       sealed(good_fields()[:-1]), sealed(with_field(0, "1")),
                       sealed(with_field(1, b"client")), sealed(with_field(1, "")),
                       sealed(with_field(3, 1.5)), sealed(with_field(3, True)),
                       sealed(with_field(5, None)), sealed(with_field(12, [])),
                       sealed(with_field(13, "text")),
                       seal(KEY, msgpack.packb(msgpack.ExtType(1, b"x"))),
                       seal(KEY, b"\x81\x01\x02"),                 # int map key
                       seal(KEY, b"\xa2\xff\xfe")],                # bad utf-8
    Reject.UNKNOWN_TYPE: [sealed(with_field(0, 99)), sealed(with_field(0, 0))],
    Reject.BAD_BODY: [sealed(with_body(offset=0, data=b"")),
                      sealed(with_body(offset=0, data=b"", flags=0, extra=1)),
                      sealed(with_body(offset=0, data="str", flags=0)),
                      sealed(with_body(offset=True, data=b"", flags=0)),
                      sealed(with_body(offset=None, data=b"", flags=0))],
    Reject.OUT_OF_RANGE: [sealed(with_field(3, -1)), sealed(with_field(5, -(1 << 63))),
                          sealed(with_field(4, 2)), sealed(with_field(8, 0)),
                          sealed(with_body(offset=-5, data=b"", flags=0)),
                          one(make(MsgType.HEARTBEAT, dst="server"))[:0] +
                          sealed(payload_list(make(MsgType.HEARTBEAT))[:8] + [3] +
                                 payload_list(make(MsgType.HEARTBEAT))[9:])],
    Reject.WRONG_GROUP: [one(make(dst="elsewhere")), one(make(src="server", dst="client"))],
    Reject.OLD_VIEW: [one(make(pvn=1)), one(make(MsgType.NACK, pvn=2))],
}


@pytest.mark.parametrize("reason", list(REJECTIONS))
def test_each_rejection_reason_is_counted(reason):
    dec = Decoder(KEY, "server")
    dec.set_view("client", 3)
    for dg in REJECTIONS[reason]:
        assert dec.decode(dg, 0) is None, (reason, dg[:40])
    assert dec.rejections == {reason: len(REJECTIONS[reason])}, dec.rejections
    assert dec.accepted == 0


def test_old_view_rules():
    dec = Decoder(KEY, "server")
    assert dec.decode(one(make(pvn=1)), 0) is not None        # no view known: accept
    dec.set_view("client", 3)
    assert dec.view("client") == 3
    assert dec.decode(one(make(pvn=2)), 0) is None
    assert dec.decode(one(make(pvn=3)), 0) is not None
    assert dec.decode(one(make(pvn=4)), 0) is not None        # newer: the core decides
    # membership messages carry their own view rules
    assert dec.decode(one(make(MsgType.NEW_PRIMARY_VIEW, pvn=0)), 0) is not None
    assert dec.decode(one(make(MsgType.PROPOSE_PRIMARY, src="server", pvn=0)), 0) is not None
    assert dec.rejections == {Reject.OLD_VIEW: 1}


def test_fragment_rejections():
    dec = Decoder(KEY, "server")
    frag = lambda i, n, chunk=b"abc", fid=1, sender=5: seal(   # noqa: E731
        KEY, fragment_body(sender, fid, i, n, chunk), kind=KIND_FRAGMENT)
    for dg in (frag(0, 1), frag(0, 0), frag(3, 3), frag(0, wire.MAX_FRAGMENTS + 1),
               frag(0, 2, b"")):
        assert dec.decode(dg, 0) is None
    assert dec.rejections == {Reject.BAD_FRAGMENT: 5}
    dec.decode(frag(0, 3), 0)
    assert dec.decode(frag(1, 4), 0) is None          # count differs from the first
    assert dec.decode(frag(0, 3), 0) is None          # duplicate
    assert dec.rejections[Reject.BAD_FRAGMENT] == 6
    assert dec.rejections[Reject.DUPLICATE_FRAGMENT] == 1
    # a fragment header naming another sender than the message's
    dgs = encode(make(body={"offset": 0, "data": b"x" * 3000, "flags": 0}), KEY)
    forged = [seal(KEY, fragment_body(42, 9, i, len(dgs), wire.peek(d).data),
                   kind=KIND_FRAGMENT) for i, d in enumerate(dgs)]
    assert [dec.decode(d, 0) for d in forged] == [None] * len(forged)
    assert dec.rejections[Reject.BAD_FRAGMENT] == 7


def test_decode_never_raises_on_internal_error(monkeypatch, codec):
    dec = Decoder(KEY, "server")
    dg = one(make())
    monkeypatch.setattr(wire, "_parse", lambda *a: 1 / 0)
    if codec == "differential":     # the C half does not call _parse: its own glue fails
        dec = wire.Decoder(KEY, "server", native=True)
        monkeypatch.setattr(wire.NativeCodec, "message", lambda *a: 1 / 0)
    assert dec.decode(dg, 0) is None
    assert dec.rejections == {Reject.INTERNAL_ERROR: 1}


# -- encoder pair assertions ------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    dict(conn_seq=-1), dict(src_group=""), dict(dst_group="x" * (wire.MAX_GROUP_BYTES + 1)), dict(body={}),
    dict(body={"offset": 0, "data": "s", "flags": 0}), dict(msn=0), dict(order_info="s"),
    dict(version=256), dict(pvn=1 << 64), dict(role=5),
])
def test_encoder_refuses_what_the_decoder_would(bad):
    with pytest.raises(WireError):
        encode(make(**bad), KEY)


def test_encoder_refuses_oversize_message():
    enc = Encoder(KEY, max_message_bytes=10_000)
    with pytest.raises(WireError) as info:
        enc.encode(make(body={"offset": 0, "data": b"x" * 20_000, "flags": 0}))
    assert info.value.reason is Reject.OVERSIZE


# -- fragmentation ----------------------------------------------------------------------

def big(n_bytes, sender=0x77):
    return make(body={"offset": 0, "data": random.Random(n_bytes).randbytes(n_bytes),
                      "flags": 0}, sender=sender)


@pytest.mark.parametrize("mtu", [128, 576, 1400, 9000])
def test_fragments_respect_mtu_and_reassemble(mtu):
    msg = big(50_000)
    dgs = Encoder(KEY, mtu_bytes=mtu).encode(msg)
    assert len(dgs) > 1 and all(len(d) <= mtu for d in dgs)
    dec = Decoder(KEY, "server")
    out = [dec.decode(d, 0) for d in dgs]
    assert out[:-1] == [None] * (len(dgs) - 1) and out[-1] == msg
    assert dec.partial_messages == 0 and dec.partial_bytes == 0 and not dec.rejections


def test_small_message_is_one_datagram_at_exact_mtu():
    msg = make(order_info=b"o" * 300)
    n = len(one(msg))
    assert len(Encoder(KEY, mtu_bytes=n).encode(msg)) == 1
    assert n > 128
    assert len(Encoder(KEY, mtu_bytes=n - 1).encode(msg)) == 2


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), sizes=st.lists(st.integers(600, 12_000), min_size=1,
                                                  max_size=6),
       dup=st.floats(0, 0.5), loss_msg=st.integers(-1, 5))
def test_reassembly_with_loss_duplication_reorder(seed, sizes, dup, loss_msg):
    """Interleaved, shuffled, duplicated fragments of several (fragmented) messages; message
    `loss_msg` loses one fragment and must never come out, every other one exactly once."""
    rng = random.Random(seed)
    enc = Encoder(KEY, mtu_bytes=576)
    msgs = [big(n, sender=i + 1) for i, n in enumerate(sizes)]
    stream, lost, partial = [], None, 0
    for i, m in enumerate(msgs):
        dgs = enc.encode(m)
        if i == loss_msg:
            victim = rng.randrange(len(dgs))
            lost, partial = i, int(len(dgs) > 1)
            dgs = dgs[:victim] + dgs[victim + 1:]
        stream += dgs + [d for d in dgs if rng.random() < dup]
    rng.shuffle(stream)
    dec = Decoder(KEY, "server")
    got = [m for d in stream if (m := dec.decode(d, 0)) is not None]
    want = [m for i, m in enumerate(msgs) if i != lost]
    assert sorted(got, key=lambda m: m.sender) == want
    assert dec.partial_messages == partial
    assert set(dec.rejections) <= {Reject.DUPLICATE_FRAGMENT}


def test_reassembly_timeout_uses_callers_clock():
    dgs = Encoder(KEY, mtu_bytes=576).encode(big(3000))
    dec = Decoder(KEY, "server", reassembly_timeout_us=1000)
    dec.decode(dgs[0], 10_000)
    assert dec.partial_messages == 1
    assert dec.expire(10_999) == 0
    assert dec.expire(11_000) == 1 and dec.partial_messages == 0 and dec.partial_bytes == 0
    assert dec.rejections == {Reject.REASSEMBLY_TIMEOUT: 1}
    # late fragments of an expired message start over and can still complete later
    for d in dgs[1:]:
        dec.decode(d, 20_000)
    assert dec.decode(dgs[0], 20_500) is not None


def test_reassembly_count_bound_evicts_oldest():
    enc = Encoder(KEY, mtu_bytes=576)
    msgs = [enc.encode(big(2000, sender=s)) for s in range(1, 6)]
    dec = Decoder(KEY, "server", reassembly_max_messages=3)
    for dgs in msgs:
        dec.decode(dgs[0], 0)
    assert dec.partial_messages == 3
    assert dec.rejections == {Reject.REASSEMBLY_EVICTED: 2}
    # the newest three complete, the two oldest (evicted) cannot
    done = [m for dgs in reversed(msgs) for d in dgs[1:]
            if (m := dec.decode(d, 0)) is not None]
    assert sorted(m.sender for m in done) == [3, 4, 5]


def test_reassembly_byte_bound():
    enc = Encoder(KEY, mtu_bytes=1400)
    a, b = enc.encode(big(30_000, sender=1)), enc.encode(big(30_000, sender=2))
    dec = Decoder(KEY, "server", max_message_bytes=40_000, reassembly_max_bytes=40_000)
    for d in a[:-1]:
        dec.decode(d, 0)
    held = dec.partial_bytes
    assert 25_000 < held <= 40_000
    for d in b[:-1]:
        dec.decode(d, 0)
        assert dec.partial_bytes <= 40_000
    assert dec.rejections[Reject.REASSEMBLY_EVICTED] == 1
    assert dec.decode(b[-1], 0) is not None and dec.decode(a[-1], 0) is None


def test_reassembled_message_over_max_is_refused():
    dgs = Encoder(KEY, mtu_bytes=1400).encode(big(30_000))
    dec = Decoder(KEY, "server", max_message_bytes=10_000)
    assert all(dec.decode(d, 0) is None for d in dgs)
    # each time the held bytes pass the bound the partial is dropped (later fragments
    # start a new one, which can never complete either)
    assert dec.rejections[Reject.OVERSIZE] >= 1 and dec.partial_bytes <= 10_000


def test_late_duplicates_after_completion_are_dropped_cheaply():
    dgs = Encoder(KEY, mtu_bytes=576).encode(big(3000))
    dec = Decoder(KEY, "server")
    assert [dec.decode(d, 0) for d in dgs][-1] is not None
    assert all(dec.decode(d, 0) is None for d in dgs)
    assert dec.rejections == {Reject.DUPLICATE_FRAGMENT: len(dgs)}
    assert dec.partial_messages == 0


def test_fragment_ids_advance_and_wrap():
    enc = Encoder(KEY, mtu_bytes=576, first_frag_id=wire.U32_MAX)
    ids = [wire.peek(enc.encode(big(2000))[0]).frag_id for _ in range(3)]
    assert ids == [wire.U32_MAX, 0, 1]


# -- property: anything the encoder accepts round-trips --------------------------------

uints = st.integers(0, 2**64 - 1)
groups = st.text(min_size=1, max_size=16)


@st.composite
def messages(draw):
    mtype = draw(st.sampled_from(list(MsgType)))
    value = {int: uints, bytes: st.binary(max_size=3000), str: st.text(max_size=20),
             list: st.lists(st.lists(uints, max_size=3), max_size=4)}
    body = {k: draw(value[t]) for k, t in BODY_FIELDS[mtype].items()}
    return Message(type=mtype, src_group=draw(groups), dst_group="server",
                   conn_seq=draw(uints), role=draw(st.sampled_from(list(Role))),
                   pvn=draw(uints), precedence=draw(uints), sender=draw(uints),
                   msn=draw(st.integers(1, 2**64 - 1)) if mtype in DATA_TYPES else 0,
                   ack=draw(uints), back=draw(uints), ts=draw(uints), body=body,
                   order_info=draw(st.binary(max_size=200)))


@settings(max_examples=200, deadline=None)
@given(msg=messages(), mtu=st.integers(128, 2000))
def test_property_round_trip(msg, mtu):
    dec = Decoder(KEY, "server")
    out = [dec.decode(d, 0) for d in Encoder(KEY, mtu_bytes=mtu).encode(msg)]
    assert out[-1] == msg and not dec.rejections


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), mac_ok=st.booleans(),
       kind=st.sampled_from([0, 1, 2]))
def test_property_garbage_never_raises(data, mac_ok, kind):
    dec = Decoder(KEY, "server")
    dg = seal(KEY, data, kind=kind) if mac_ok else data
    assert dec.decode(dg, 0) is None or mac_ok
    assert Reject.INTERNAL_ERROR not in dec.rejections


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), signed=st.booleans(), kind=st.sampled_from([0, 1, 2]))
def test_property_sniff_and_scapy_never_raise(data, signed, kind):
    from llft.tools.scapy_layer import LLFT
    from llft.tools.sniff import describe
    dg = seal(KEY, data, kind=kind) if signed else data
    assert isinstance(describe(dg, KEY, Decoder(KEY, None)), str)
    LLFT(dg).summary()      # scapy falls back to Raw for what it cannot dissect


def test_listen_and_unlisten():
    dec = Decoder(KEY, "a")
    dec.listen("server")
    assert dec.decode(one(make()), 0) is not None
    dec.unlisten("server")
    assert dec.decode(one(make()), 0) is None
    assert Decoder(KEY, None).decode(one(make(dst="anything")), 0) is not None
