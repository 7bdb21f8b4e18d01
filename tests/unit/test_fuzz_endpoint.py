"""Fuzzing a live endpoint: >= 10,000 hostile datagrams on real loopback multicast.

Two phases against one receiving `Endpoint` (group svc), while a second endpoint keeps
sending good traffic (sender 1) to it:

1. scapy-crafted: a seeded generator mutates every header field (LLFT / LLFTMessage
   layers) to wrong types and impossible values, truncates, forges tags, duplicates
   and reorders fragments. The same datagrams, in the same order, go through a
   reference `Decoder`; the live endpoint's rejections must equal the reference's
   reason by reason, and it must accept exactly what the reference accepts.
2. hypothesis: random bytes, random prefixes, random signed msgpack, mutated payload
   arrays, bit flips and random fragment headers.

Throughout: no exception escapes (loop exception handler, INTERNAL_ERROR count, callback
errors), and every good message arrives. The receiver is waited on by datagram count
(`Endpoint.wait_until`), never by sleeping.
"""
import asyncio
import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from llft.tools import scapy_layer
from llft.runtime import transport
from llft.protocol import wire
from llft.protocol.messages import BODY_FIELDS, DATA_TYPES, WIRE_VERSION, Message, MsgType, Role
from llft.tools.scapy_layer import LLFT, LLFTFragment, LLFTMessage, sign
from llft.runtime.transport import Endpoint, GroupAddress, GroupMap
from llft.protocol.wire import MAGIC, Decoder, Reject, seal

KEY = bytes(range(100, 132))
VIEW = 5                 # current view of the good groups at the receiver
GOOD_TX = 1              # birth id of the good endpoint
GOOD_RAW = 2             # birth id of good messages crafted into the hostile stream
BATCH = 400              # datagrams between waits: well under the socket buffer

pytestmark = pytest.mark.timeout(120)

INTS = [0, 3, 2**64 - 1]
BAD_VALUES = {
    "type": [0, 9, 99, 255, -1, "REQUEST", 1.5, None, True, [1]],
    "group": ["", b"svc", "x" * (wire.MAX_GROUP_BYTES + 1), 7, None, ["svc"]],
    "uint": [-1, -(2**63), "7", 1.5, None, [], True, b"\x01"],
    "role": [2, -1, "client", None],
    "body": [[], "body", {}, {"extra": 1}, 7],
    "order_info": ["text", 5, None, [b"x"]],
    "nfields": [0, 13, 15],
}
UINT_FIELDS = ["conn_seq", "pvn", "precedence", "sender", "msn", "ack", "back", "ts"]
SAMPLE = {int: 1, bytes: b"d", str: "h", list: [[7, 1]]}


def body_for(mtype, rng=None):
    body = {k: SAMPLE[t if not isinstance(t, tuple) else t[0]]
            for k, t in BODY_FIELDS[mtype].items()}
    if mtype in DATA_TYPES and rng is not None:
        body["data"] = rng.randbytes(rng.choice([1, 50, 3000, 9000]))
    return body


def message(mtype, dst="svc", src="good", sender=GOOD_RAW, pvn=VIEW, msn=1, rng=None):
    return Message(mtype, src, dst, 1, Role.SERVER, pvn=pvn, precedence=1, sender=sender,
                   msn=msn if mtype in DATA_TYPES else 0, ts=msn, body=body_for(mtype, rng))


def layer_fields(msg):
    return dict(type=int(msg.type), src_group=msg.src_group, dst_group=msg.dst_group,
                conn_seq=msg.conn_seq, role=int(msg.role), pvn=msg.pvn,
                precedence=msg.precedence, sender=msg.sender, msn=msg.msn, ack=msg.ack,
                back=msg.back, ts=msg.ts, body=msg.body, order_info=msg.order_info)


class Crafter:
    """Seeded scapy-crafted hostile (and some good) datagrams."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.enc = wire.Encoder(KEY, mtu_bytes=576, first_frag_id=seed * 1_000_000)
        self.good_msn = 0

    def mutated_message(self):
        rng = self.rng
        mtype = rng.choice(list(MsgType))
        fields = layer_fields(message(mtype, sender=rng.randrange(1000, 2**40)))
        what = rng.choice(["type", "src_group", "dst_group", "role", "body", "body_key",
                           "body_value", "order_info", "nfields", "msn"] + UINT_FIELDS)
        if what == "type":
            fields["type"] = rng.choice(BAD_VALUES["type"])
        elif what in ("src_group", "dst_group"):
            fields[what] = rng.choice(BAD_VALUES["group"])
        elif what in UINT_FIELDS:
            fields[what] = rng.choice(BAD_VALUES["uint"])
        elif what == "role":
            fields["role"] = rng.choice(BAD_VALUES["role"])
        elif what == "body":
            fields["body"] = rng.choice(BAD_VALUES["body"])
        elif what == "body_key":
            body = dict(fields["body"])
            if body and rng.random() < 0.5:
                body.pop(rng.choice(list(body)))
            else:
                body["bogus"] = 1
            fields["body"] = body
        elif what == "body_value":
            body = dict(fields["body"])
            if body:
                body[rng.choice(list(body))] = rng.choice([-1, "s", None, 1.5, True, b"b"])
            fields["body"] = body or {"x": 1}
        elif what == "order_info":
            fields["order_info"] = rng.choice(BAD_VALUES["order_info"])
        elif what == "msn":       # data without an msn, control with one
            fields["msn"] = 0 if mtype in DATA_TYPES else 4
        pkt = LLFT() / LLFTMessage(**fields)
        if what == "nfields":
            pkt[LLFTMessage].nfields = rng.choice(BAD_VALUES["nfields"])
        return sign(pkt, KEY)

    def header_attack(self):
        rng = self.rng
        good = sign(LLFT() / LLFTMessage(**layer_fields(message(MsgType.HEARTBEAT))), KEY)
        pick = rng.randrange(8)
        if pick == 0:
            return bytes(LLFT(magic=rng.choice([b"XX", b"LL", b"\x00\x00"]), tag=b"\0" * 16))
        if pick == 1:
            return sign(LLFT(version=rng.choice([0, 2, 255])) / LLFTMessage(), KEY)
        if pick == 2:
            return sign(LLFT(kind=rng.choice([2, 9, 255])) / LLFTMessage(), KEY)
        if pick == 3:     # forged tag
            return bytes(LLFT(tag=rng.randbytes(16)) / LLFTMessage())
        if pick == 4:     # truncated in transit (tag no longer matches, or too short)
            return good[:rng.randrange(len(good))]
        if pick == 5:     # truncated, then signed by a key holder: msgpack runs out
            return sign(good[:rng.randrange(wire.HEADER_BYTES + 1, len(good))], KEY)
        if pick == 6:     # junk appended after signing
            return good + rng.randbytes(rng.randrange(1, 40))
        # a bad fragment header (always invalid: a held partial would make the live
        # decoder's reassembly bounds depend on how good traffic interleaves)
        count = rng.choice([0, 1, 2, 5])
        return sign(LLFT(kind=1) / LLFTFragment(sender=rng.randrange(1000, 2**40), frag_id=1,
                                                index=rng.choice([count, count + 3]),
                                                count=count)
                    / (b"" if rng.random() < 0.3 else b"chunk"), KEY)

    def good_or_replay(self):
        """A stream with good messages (sometimes duplicated), old-view replays,
        wrong-group messages, and fragments shuffled and duplicated."""
        rng = self.rng
        mtype = rng.choice([MsgType.REQUEST, MsgType.REPLY, MsgType.NACK,
                            MsgType.KEEP_ALIVE, MsgType.HEARTBEAT])
        pick = rng.randrange(3)
        if pick == 0:
            self.good_msn += 1
            msg = message(mtype, msn=self.good_msn, rng=rng)
            msg.ts = self.good_msn          # ts identifies a good message in checks
        elif pick == 1:
            msg = message(mtype, pvn=rng.randrange(VIEW), sender=3, rng=rng)
        else:
            msg = message(mtype, dst="other", sender=3, rng=rng)
        dgs = self.enc.encode(msg)
        stream = dgs + [d for d in dgs if rng.random() < 0.3]
        if len(dgs) > 1:
            rng.shuffle(stream)
        return stream, (msg if pick == 0 else None)

    def stream(self, n):
        out, goods = [], []
        while len(out) < n:
            pick = self.rng.random()
            if pick < 0.55:
                out.append(self.mutated_message())
            elif pick < 0.85:
                out.append(self.header_attack())
            else:
                dgs, good = self.good_or_replay()
                out += dgs
                if good is not None:
                    goods.append(good)
        return out, goods


# -- hypothesis strategies ----------------------------------------------------------------

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20)


@st.composite
def mutated_payload(draw):
    mtype = draw(st.sampled_from(list(MsgType)))
    fields = msgpack.unpackb(wire.pack_message(message(mtype, dst="nobody", sender=9)),
                             raw=False)
    i = draw(st.integers(0, len(fields) - 1))
    value = draw(msgpack_values)
    if i == 2 and value == "svc":
        value = "nobody"                 # stay out of the good stream's group
    fields[i] = value
    return seal(KEY, msgpack.packb(fields, use_bin_type=True))


@st.composite
def random_fragment(draw):
    count = draw(st.integers(0, 6))
    return seal(KEY, wire.fragment_body(draw(st.integers(1000, 1010)),
                                        draw(st.integers(0, 3)),
                                        draw(st.integers(0, 7)), count,
                                        draw(st.binary(max_size=200))), kind=1)


@st.composite
def bit_flip(draw):
    good = wire.encode(message(MsgType.HEARTBEAT, sender=9), KEY)[0]
    i = draw(st.integers(0, len(good) - 1))
    return good[:i] + bytes([good[i] ^ (1 << draw(st.integers(0, 7)))]) + good[i + 1:]


hostile = st.one_of(
    st.binary(max_size=1500),
    st.builds(lambda v, k, b: MAGIC + bytes([v, k]) + b, st.integers(0, 255),
              st.integers(0, 255), st.binary(max_size=300)),
    st.builds(lambda b: seal(KEY, b), st.binary(max_size=300)),
    st.builds(lambda v: seal(KEY, msgpack.packb(v, use_bin_type=True)), msgpack_values),
    mutated_payload(),
    random_fragment(),
    bit_flip(),
)


# -- the live rig ---------------------------------------------------------------------------

class Rig:
    def __init__(self):
        r = random.SystemRandom()
        self.addr = GroupAddress(f"239.{r.randint(64, 250)}.{r.randint(0, 255)}."
                                 f"{r.randint(1, 254)}", r.randint(20000, 60000))
        self.loop = asyncio.new_event_loop()
        self.loop_errors = []
        self.loop.set_exception_handler(lambda loop, ctx: self.loop_errors.append(ctx))
        self.got = []
        gm = GroupMap({"svc": self.addr})
        # The reference decoder runs at now_us=0; the live one must see the same clock,
        # or a loaded machine times fragments out (2 s) and the counts legitimately differ.
        self.rx = Endpoint(KEY, "svc", self.got.append, groups=gm, clock_us=lambda: 0)
        self.tx = Endpoint(KEY, "good", lambda m: None, groups=gm)
        self.loop.run_until_complete(self.rx.start())
        self.loop.run_until_complete(self.tx.start())
        self.rx.set_view("good", VIEW)
        self.raw = transport.send_socket("127.0.0.1", 1, True, 4 << 20)
        self.raw.setblocking(True)
        self.raw_sent = 0
        self.tx_msn = 0
        self.rng = random.Random(1)

    def close(self):
        self.rx.close()
        self.tx.close()
        self.raw.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    def send_good(self):
        self.tx_msn += 1
        size = 4000 if self.tx_msn % 5 == 0 else 30     # every fifth one is fragmented
        msg = Message(MsgType.REQUEST, "good", "svc", 2, Role.CLIENT, pvn=VIEW,
                      precedence=1, sender=GOOD_TX, msn=self.tx_msn, ts=self.tx_msn,
                      body={"offset": 0, "data": b"g" * size, "flags": 0})
        self.tx.send("svc", msg)

    def throw(self, datagrams, good_every=40):
        for i, d in enumerate(datagrams):
            self.raw.sendto(d, (self.addr.mcast_addr, self.addr.port))
            self.raw_sent += 1
            if i % good_every == 0:
                self.send_good()
            if (i + 1) % BATCH == 0:
                self.settle()
        self.settle()

    def settle(self):
        def done():
            return (self.rx.counters["processed_datagrams"]
                    >= self.raw_sent + self.tx.counters["sent_datagrams"])
        ok = self.loop.run_until_complete(self.rx.wait_until(done, 20))
        assert ok, ("datagrams lost on loopback", self.raw_sent, self.tx.counters,
                    self.rx.stats())

    def check_health(self):
        assert not self.loop_errors, self.loop_errors
        assert Reject.INTERNAL_ERROR not in self.rx.rejections
        assert self.rx.counters["callback_errors"] == 0
        tx_msns = sorted(m.msn for m in self.got if m.sender == GOOD_TX)
        assert tx_msns == list(range(1, self.tx_msn + 1)), "good traffic stopped flowing"


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def scapy_phase(rig, n, seed):
    crafted, goods = Crafter(seed).stream(n)
    ref = Decoder(KEY, "svc")
    ref.set_view("good", VIEW)
    ref_accepted = [m for d in crafted if (m := ref.decode(d, 0)) is not None]
    before = rig.rx.rejections.copy()
    start = len(rig.got)
    rig.throw(crafted)
    live = rig.rx.rejections.copy()
    live.subtract(before)
    assert +live == ref.rejections, (dict(+live), dict(ref.rejections))
    accepted = [m for m in rig.got[start:] if m.sender != GOOD_TX]
    assert sorted(map(repr, accepted)) == sorted(map(repr, ref_accepted))
    got_good = {m.ts for m in accepted if m.sender == GOOD_RAW}
    assert got_good == {m.ts for m in goods}
    return len(crafted), ref.rejections


def hypothesis_phase(rig, examples):
    sent = []
    start = len(rig.got)

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(batch=st.lists(hostile, min_size=20, max_size=60))
    def throw(batch):
        rig.throw(batch, good_every=15)
        sent.append(len(batch))
        rig.check_health()
        # nothing hostile gets through (mutations that stay valid go to group "nobody")
        assert not [m for m in rig.got[start:] if m.sender != GOOD_TX]

    throw()
    return sum(sent)


def test_fuzz_live_endpoint(rig):
    n_scapy, reasons = scapy_phase(rig, 7000, seed=11)
    n_hyp = hypothesis_phase(rig, examples=250)
    rig.check_health()
    assert n_scapy + n_hyp >= 10_000, (n_scapy, n_hyp)
    # every rejection reason a hostile peer can reach was exercised and counted
    expected = {Reject.TRUNCATED, Reject.BAD_MAGIC, Reject.BAD_VERSION, Reject.BAD_MAC,
                Reject.MALFORMED, Reject.UNKNOWN_TYPE, Reject.BAD_BODY, Reject.OUT_OF_RANGE,
                Reject.WRONG_GROUP, Reject.OLD_VIEW, Reject.BAD_FRAGMENT,
                Reject.DUPLICATE_FRAGMENT, Reject.OVERSIZE}
    assert expected <= set(reasons), expected - set(reasons)
    assert expected <= set(rig.rx.rejections)
    assert rig.tx_msn > 200


@pytest.mark.slow
@pytest.mark.timeout(900)      # a round takes ~25 s alone, several times that on a loaded CI box
def test_fuzz_live_endpoint_soak(soak):
    """Rounds of both phases, each on a fresh endpoint (the scapy phase's exact oracle
    needs a decoder with no partial messages left by hypothesis)."""
    scale = {"small": 1, "full": 50}.get(soak, 1)
    total = 0
    for seed in range(scale):
        rig = Rig()
        try:
            total += scapy_phase(rig, 10_000, seed=100 + seed)[0]
            total += hypothesis_phase(rig, examples=300)
            rig.check_health()
        finally:
            rig.close()
    assert total >= scale * 10_000


# -- scapy layer and sniff, offline ----------------------------------------------------------

def test_scapy_layer_dissects_and_rebuilds_our_datagrams():
    msg = message(MsgType.NACK, rng=random.Random(0))
    (dg,) = wire.encode(msg, KEY)
    pkt = LLFT(dg)
    assert pkt.magic == MAGIC and pkt.version == WIRE_VERSION and pkt.kind == 0
    m = pkt[LLFTMessage]
    assert (m.type, m.src_group, m.pvn, m.body) == (int(MsgType.NACK), "good", VIEW,
                                                    msg.body)
    assert bytes(pkt) == dg
    big = message(MsgType.REQUEST)
    big.body["data"] = b"b" * 3000
    frags = wire.Encoder(KEY, mtu_bytes=576).encode(big)
    f = LLFT(frags[1])
    h = f[LLFTFragment]
    assert (f.kind, h.sender, h.index, h.count) == (1, GOOD_RAW, 1, len(frags))
    assert bytes(f) == frags[1]
    # too short for a fragment header, or even for the prefix: Raw, not an exception
    assert LLFTFragment not in LLFT(frags[1][:wire.HEADER_BYTES + 5])
    assert LLFT(b"LF").version is None
    # crafted with the layer, accepted by the decoder
    LLFT.mac_key = KEY
    try:
        crafted = bytes(LLFT() / LLFTMessage(type=int(MsgType.HEARTBEAT),
                                             src_group="svc", dst_group="svc", pvn=7))
    finally:
        LLFT.mac_key = None
    got = Decoder(KEY, "svc").decode(crafted, 0)
    assert got.type is MsgType.HEARTBEAT and got.pvn == 7 and got.body == {"rank": 0, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0}


def test_scapy_udp_binding_by_port_range_and_explicit_port():
    from scapy.layers.inet import IP, UDP
    (dg,) = wire.encode(message(MsgType.HEARTBEAT), KEY)
    in_range = IP(bytes(IP(dst="239.255.0.1") / UDP(sport=1, dport=transport.PORT_BASE + 5)
                        / dg))
    assert LLFTMessage in in_range
    scapy_layer.bind_llft(port=23456)
    assert LLFTMessage in IP(bytes(IP(dst="239.1.1.1") / UDP(sport=1, dport=23456) / dg))
    out = IP(bytes(IP(dst="239.1.1.1") / UDP(sport=1, dport=19999) / dg))
    assert LLFT not in out


def test_sniff_describe_lines():
    from llft.tools.sniff import describe
    (dg,) = wire.encode(message(MsgType.REQUEST, msn=4), KEY)
    line = describe(dg, KEY)
    assert line.startswith("REQUEST good>svc conn=1/server pvn=5 msn=4") and "mac=ok" in line
    assert "mac=bad" in describe(dg, bytes(32)) and "mac=-" in describe(dg)
    assert describe(b"junk").startswith("not llft")
    assert "invalid payload (unknown_type)" in describe(
        seal(KEY, msgpack.packb([99] + [0] * 13)), KEY)
    big = message(MsgType.REQUEST)
    big.body["data"] = b"b" * 3000
    frags = wire.Encoder(KEY, mtu_bytes=576).encode(big)
    dec = Decoder(KEY, None)
    lines = [describe(f, KEY, dec) for f in frags]
    assert lines[0].startswith("FRAGMENT 0x2/0 1/") and "->" not in lines[0]
    assert "-> REQUEST good>svc" in lines[-1]
