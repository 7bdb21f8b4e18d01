"""The C half of the wire codec (native/wire/) against its reference (llft/protocol/wire.py).

Every datagram here goes through `wire.DifferentialDecoder`, which judges it with both
and raises `WireDivergence` when they differ in the message (field, type, body order) or
in the reason counted. Inputs: hand-made edge cases of msgpack as msgpack-python reads it,
arbitrary msgpack documents from hypothesis, and seeded mutations of real messages of
every type, re-sealed with the cluster key so that they reach the payload checks.
"""
import datetime
import os
import random

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from llft.protocol import wire
from llft.protocol.messages import BODY_FIELDS, WIRE_VERSION, MsgType
from llft.protocol.wire import (KIND_FRAGMENT, DifferentialDecoder, Encoder, Reject,
                                WireDivergence, pack_message, seal)
from wire_samples import KEY, make

pytestmark = pytest.mark.skipif(not wire.native_available(),
                                reason="native._llft_wire is not built")

def judge(*payloads, kind=0):
    """Seal each payload and decode it with both halves; the decoder's rejections."""
    dec = DifferentialDecoder(KEY, None)
    for p in payloads:
        dec.decode(seal(KEY, p, kind=kind), 0)
    return dec


def fields_of(msg):
    return msgpack.unpackb(pack_message(msg), raw=False)


def packed(fields):
    return msgpack.packb(fields, use_bin_type=True)


# -- both halves give the same message -------------------------------------------------

@pytest.mark.parametrize("mtype", list(MsgType))
def test_every_type_decodes_the_same(mtype):
    msg = make(mtype)
    dec = DifferentialDecoder(KEY, "server")
    (dg,) = Encoder(KEY, codec="differential").encode(msg)
    assert wire.same_message(dec.decode(dg, 0), msg)
    assert dec.accepted == 1 and not dec.rejections


def test_the_native_half_is_what_decides():
    """Not the reference under another name: the C half parses the hot types itself, and
    hands back only the types whose body holds lists or strings."""
    codec = wire.NativeCodec(KEY)
    fallback = {t for t, schema in BODY_FIELDS.items()
                if any(want not in (int, bytes) for want in schema.values())}
    assert MsgType.NACK in fallback and MsgType.REQUEST not in fallback
    for mtype in MsgType:
        (dg,) = wire.encode(make(mtype), KEY)
        verdict = codec.open(dg, wire.MAX_MESSAGE_BYTES)[0]
        assert verdict == (wire._lib.LLFT_WIRE_FALLBACK if mtype in fallback
                           else wire._lib.LLFT_WIRE_OK), mtype


def test_seal_is_byte_identical():
    codec = wire.NativeCodec(KEY)
    rng = random.Random(5)
    for n in (0, 1, 55, 56, 63, 64, 65, 1000, 65_487):
        body = rng.randbytes(n)
        for kind in (0, 1):
            assert codec.seal(body, kind, WIRE_VERSION) == seal(KEY, body, kind=kind)


def test_fragmented_messages_reassemble_the_same():
    msg = make(MsgType.REQUEST, body={"offset": 0, "data": os.urandom(20_000), "flags": 0})
    dgs = Encoder(KEY, mtu_bytes=1400, codec="differential").encode(msg)
    assert len(dgs) > 10
    dec = DifferentialDecoder(KEY, "server")
    out = [dec.decode(d, 0) for d in reversed(dgs)]
    assert out[-1] == msg and out[:-1] == [None] * (len(dgs) - 1)
    assert [dec.decode(d, 0) for d in dgs[:2]] == [None, None]      # late duplicates
    assert dec.rejections == {Reject.DUPLICATE_FRAGMENT: 2}


# -- msgpack read exactly as msgpack-python reads it ------------------------------------

# One msgpack value each, and how msgpack-python reads it: "ok" (a valid value),
# "malformed" (an error) or "truncated" (it runs out first).
EDGES = {
    "reserved 0xc1": (b"\xc1", "malformed"),
    "array longer than the payload": (b"\xdd\x00\x01\x00\x00\x01", "malformed"),
    "array cut short": (b"\xdc\x00\x03\x01", "truncated"),
    "str longer than the payload": (b"\xdb\x00\x01\x00\x00a", "truncated"),
    "map over half the payload": (b"\xdf\x00\x01\x00\x00\x01\x01", "malformed"),
    "int map key": (b"\x81\x01\x02", "malformed"),
    "bytes map key": (b"\x81\xc4\x01a\x02", "ok"),
    "map key judged after its value": (b"\x81\x01", "truncated"),
    "bad value before bad key": (b"\x81\x01\xc1", "malformed"),
    "repeated map key": (b"\x82\xa1a\x01\xa1a\x02", "ok"),
    "good utf-8": (b"\xa9" + "é€𝄞".encode(), "ok"),
    "bad utf-8": (b"\xa2\xff\xfe", "malformed"),
    "surrogate in utf-8": (b"\xa3\xed\xa0\x80", "malformed"),
    "overlong utf-8": (b"\xa2\xc0\x80", "malformed"),
    "past U+10FFFF": (b"\xa4\xf4\x90\x80\x80", "malformed"),
    "cut utf-8": (b"\xa2\xe2\x82", "malformed"),
    "ext type": (b"\xd4\x05\x00", "malformed"),
    "timestamp 32": (b"\xd6\xff\x00\x00\x00\x01", "ok"),
    "timestamp of 2 bytes": (b"\xd5\xff\x00\x00", "malformed"),
    "timestamp 64": (b"\xd7\xff" + (999999999 << 34).to_bytes(8, "big"), "ok"),
    "timestamp 64, nanoseconds too big": (b"\xd7\xff" + (10**9 << 34).to_bytes(8, "big"),
                                          "malformed"),
    "timestamp 96": (b"\xc7\x0c\xff" + b"\x00" * 4 + b"\xff" * 8, "ok"),
    "timestamp 96, nanoseconds too big": (b"\xc7\x0c\xff" + (10**9).to_bytes(4, "big")
                                          + b"\x00" * 8, "malformed"),
    "ext cut short": (b"\xc7\x08\xff\x00", "truncated"),
    "float 32": (b"\xca\x00\x00\x00\x00", "ok"),
    "int 8, not negative": (b"\xd0\x05", "int"),
    "int 64, negative": (b"\xd3\xff\xff\xff\xff\xff\xff\xff\xfe", "negative"),
    "uint 64, largest": (b"\xcf" + b"\xff" * 8, "int"),
}
EXPECT_AS_OFFSET = {"ok": Reject.BAD_BODY, "malformed": Reject.MALFORMED,
                    "int": None, "negative": Reject.OUT_OF_RANGE}


def request_with(offset=None, order_info=None):
    """A REQUEST's payload with raw msgpack for its body's offset or its order_info."""
    f = fields_of(make(MsgType.REQUEST, body={"offset": 0, "data": b"x", "flags": 0}))
    head = packed(f[:12])[1:]
    body = (b"\x83\xa6offset" + (offset or b"\x00") + b"\xa4data\xc4\x01x\xa5flags\x00")
    return b"\x9e" + head + body + (order_info or b"\xc4\x00")


@pytest.mark.parametrize("name", list(EDGES))
def test_msgpack_edges(name):
    value, how = EDGES[name]
    if how == "truncated":      # only the end of a payload can run out
        assert judge(request_with(order_info=value)).rejections == {Reject.TRUNCATED: 1}
        return
    want = EXPECT_AS_OFFSET[how]
    dec = judge(request_with(offset=value))
    assert dec.rejections == ({want: 1} if want else {}) and dec.accepted == (want is None)


def test_nesting_depth_as_msgpack_python_bounds_it():
    """msgpack-python's unpacker holds 1024 open containers; the 1025th is an error."""
    reasons = [next(iter(judge(request_with(offset=b"\x91" * k + b"\x01")).rejections))
               for k in (1021, 1022, 1023, 1024)]
    assert reasons == [Reject.BAD_BODY, Reject.BAD_BODY, Reject.MALFORMED, Reject.MALFORMED]
    cut = judge(request_with(order_info=b"\x91" * 1023), request_with(order_info=b"\x91" * 1024))
    assert cut.rejections == {Reject.TRUNCATED: 1, Reject.MALFORMED: 1}


def test_body_edges_in_a_real_message():
    base = fields_of(make(MsgType.REQUEST))

    def body(pairs):        # a body map written pair by pair (repeats, bytes keys...)
        out = bytearray(b"\xdf" + len(pairs).to_bytes(4, "big"))
        for k, v in pairs:
            out += msgpack.packb(k, use_bin_type=True) + msgpack.packb(v, use_bin_type=True)
        head = packed(base[:12])[1:]        # the 12 header fields, without the array byte
        return b"\x9e" + head + bytes(out) + msgpack.packb(base[13], use_bin_type=True)

    assert packed(base) == b"\x9e" + packed(base[:12])[1:] + packed(base[12]) + packed(base[13])
    good = [("offset", 1), ("data", b"x"), ("flags", 0)]
    cases = {
        "in schema order": (good, None),
        "another order": (good[::-1], None),
        "a repeated key, last wins": (good + [("offset", 9)], None),
        "a repeat hiding a bad value": ([("offset", -1)] + good, None),
        "a repeat bringing one": (good + [("flags", -1)], Reject.OUT_OF_RANGE),
        "bytes key": (good[:2] + [(b"flags", 0)], Reject.BAD_BODY),
        "both key kinds": (good + [(b"flags", 0)], Reject.BAD_BODY),
        "extra key": (good + [("x", 0)], Reject.BAD_BODY),
        "missing key": (good[:2], Reject.BAD_BODY),
        "bool for int": ([("offset", True)] + good[1:], Reject.BAD_BODY),
        "str for bytes": ([good[0], ("data", "x"), good[2]], Reject.BAD_BODY),
        "timestamp value": ([("offset", msgpack.Timestamp(1))] + good[1:], Reject.BAD_BODY),
        "nested junk value": ([("offset", [[{"a": [1]}]])] + good[1:], Reject.BAD_BODY),
        "negative, then wrong type": ([("offset", -1), ("data", 5), ("flags", 0)],
                                      Reject.OUT_OF_RANGE),
        "wrong type, then negative": ([("offset", 5), ("data", 5), ("flags", -1)],
                                      Reject.BAD_BODY),
    }
    for name, (pairs, reason) in cases.items():
        dec = judge(body(pairs))
        assert dec.rejections == ({reason: 1} if reason else {}), name
        assert dec.accepted == (0 if reason else 1), name


def test_header_edges_in_a_real_message():
    base = fields_of(make(MsgType.HEARTBEAT))
    cases = []
    for i, bad in [(0, -3), (0, 300), (0, 1 << 63), (0, True), (0, 2.0), (1, "é" * 48),
                   (1, "é" * 49), (2, ""), (2, b"g"), (3, -1), (3, None), (4, 2), (4, -1),
                   (8, 1), (11, 1 << 64 - 1), (12, []), (12, {}), (13, ""), (13, None)]:
        f = list(base)
        f[i] = bad
        cases.append(packed(f))
    f = list(base)
    f[3], f[5] = 1.5, -1        # the first bad field decides
    cases.append(packed(f))
    f[3], f[5] = -1, 1.5
    cases.append(packed(f))
    cases += [packed(base[:13]), packed(base + [1]), packed({"a": 1}), packed(base)[:-1]]
    dec = judge(*cases)
    assert sum(dec.rejections.values()) + dec.accepted == len(cases)


# -- arbitrary documents ------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
           | st.floats(allow_nan=False) | st.text(max_size=12) | st.binary(max_size=12)
           | st.builds(msgpack.Timestamp, st.integers(0, 1 << 33), st.integers(0, 999999999)))
documents = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=6) | st.binary(max_size=6), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(doc=documents, cut=st.integers(0, 40))
def test_property_any_document(doc, cut):
    p = packed(doc)
    judge(p, p[:max(0, len(p) - cut)])


@settings(max_examples=400, deadline=None)
@given(mtype=st.sampled_from(list(MsgType)),
       swaps=st.lists(st.tuples(st.integers(0, 13), documents), min_size=1, max_size=3),
       body_swaps=st.lists(st.tuples(st.sampled_from(["offset", "data", "flags", "rank",
                                                      "upto", "x"]), documents), max_size=2))
def test_property_real_messages_with_fields_replaced(mtype, swaps, body_swaps):
    f = fields_of(make(mtype))
    for i, value in swaps:
        f[i] = value
    if isinstance(f[12], dict):
        for k, value in body_swaps:
            f[12][k] = value
    judge(packed(f))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), kind=st.sampled_from([0, 1, 2]),
       version=st.sampled_from([0, 1, 2]))
def test_property_garbage(data, kind, version):
    dec = DifferentialDecoder(KEY, "server")
    for dg in (data, seal(KEY, data, kind=kind, version=version), b"LF" + data[:2]):
        dec.decode(dg, 0)


def test_seeded_mutations_of_every_type():
    """Byte flips, cuts and insertions in real messages of every type, re-sealed: 12,000
    datagrams; both halves must agree on each, and some of every kind must get through."""
    rng = random.Random(20261128)
    dec = DifferentialDecoder(KEY, None)
    for mtype in MsgType:
        payload = pack_message(make(mtype))
        for _ in range(12_000 // len(MsgType)):
            b = bytearray(payload)
            for _ in range(rng.randint(1, 3)):
                op = rng.random()
                at = rng.randrange(len(b) + 1)
                if op < 0.6 and at < len(b):
                    b[at] = rng.choice((rng.randrange(256), b[at] ^ 1, 0xc0, 0xff, 0x7f))
                elif op < 0.8:
                    b[at:at] = bytes([rng.randrange(256)])
                else:
                    del b[at:at + rng.randint(1, 4)]
            dec.decode(seal(KEY, bytes(b)), 0)
    assert dec.accepted > 500
    assert Reject.INTERNAL_ERROR not in dec.rejections


def test_a_divergence_is_raised_with_the_datagram(monkeypatch):
    dec = DifferentialDecoder(KEY, "server")
    real = wire.NativeCodec.message

    def off_by_one(self, buf, v, version, limit):
        msg = real(self, buf, v, version, limit)
        msg.ack += 1
        return msg
    monkeypatch.setattr(wire.NativeCodec, "message", off_by_one)
    (dg,) = wire.encode(make(MsgType.REQUEST), KEY)
    with pytest.raises(WireDivergence, match=dg.hex()[:40]):
        dec.decode(dg, 0)


# -- choosing the codec -------------------------------------------------------------------

def test_codec_from_the_environment(monkeypatch):
    monkeypatch.delenv("LLFT_WIRE", raising=False)
    assert wire.default_codec() == "native"
    assert wire.Decoder(KEY, None)._native is not None
    monkeypatch.setenv("LLFT_WIRE", "python")
    assert wire.Decoder(KEY, None)._native is None
    assert Encoder(KEY).codec == "python"
    monkeypatch.setenv("LLFT_WIRE", "differential")
    assert isinstance(wire.make_decoder(KEY, None), DifferentialDecoder)
    monkeypatch.setenv("LLFT_WIRE", "fast")
    with pytest.raises(ValueError, match="LLFT_WIRE='fast'"):
        wire.default_codec()


def test_fragment_kind_with_a_short_header():
    dec = judge(b"\x00" * 15, b"\x00" * 16, kind=KIND_FRAGMENT)
    assert dec.rejections == {Reject.TRUNCATED: 1, Reject.BAD_FRAGMENT: 1}


def test_timestamps_and_datetimes_inside_lists_fall_back_alike():
    when = datetime.datetime(2026, 11, 28, tzinfo=datetime.timezone.utc)
    f = fields_of(make(MsgType.NACK))
    f[12] = {"missing": [msgpack.Timestamp.from_datetime(when), 3]}
    dec = judge(packed(f))
    assert dec.accepted == 1


def test_bench_codec_writes_its_table(tmp_path):
    """`llft bench codec --quick`: every row, both halves (timings are not judged here)."""
    import csv

    from llft.cli import main
    assert main(["bench", "codec", "--quick", "--results", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "codec.csv")))
    assert [r["datagram"] for r in rows][-1] == "forged (bad tag)" and len(rows) == 7
    assert all(float(r["decode_native_us"]) > 0 and float(r["decode_python_us"]) > 0
               for r in rows)
    assert (tmp_path / "codec.md").exists()


def test_the_simulator_runs_both_halves_by_default():
    from llft.sim.kernel import Sim
    sim = Sim(7)
    assert sim.codec == "differential"
    sim.add_node("a", _Quiet(), ["g"])
    assert isinstance(sim._nodes["a"].decoder, DifferentialDecoder)
    assert sim._nodes["a"].encoder.codec == "differential"


class _Quiet:
    """A core that does nothing (the kernel's convention, for the test above)."""

    def handle_message(self, msg, now_us):
        pass

    def handle_timer(self, now_us):
        pass

    def next_timer_us(self):
        return None

    def take_actions(self):
        return []


def _random_doc(rng, depth=0):
    r = rng.random()
    if depth > 4 or r < 0.5:
        return rng.choice([None, True, rng.randrange(-(1 << 63), 1 << 64), rng.random(),
                           rng.randbytes(rng.randrange(8)).decode("latin-1"),
                           rng.randbytes(rng.randrange(8)), msgpack.Timestamp(rng.randrange(1 << 34))])
    if r < 0.75:
        return [_random_doc(rng, depth + 1) for _ in range(rng.randrange(16))]
    return {rng.choice(["offset", "data", "flags", "rank", "x", b"k"]): _random_doc(rng, depth + 1)
            for _ in range(rng.randrange(5))}


def test_the_c_half_under_asan(tmp_path):
    """The C half, built with AddressSanitizer and UBSan, fed 30,000 hostile inputs each
    in a heap block of exactly its size (a read past the end is an error there, which a
    Python bytes object would hide): mutated real messages of every type, random msgpack
    documents, the edge cases above, cut at every length of one message."""
    import shutil
    import struct
    import subprocess
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    exe = tmp_path / "wire_asan"
    build = subprocess.run(
        ["gcc", "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-fno-omit-frame-pointer", "-I", os.path.join(root, "native", "wire"),
         os.path.join(root, "tests", "programs", "wire_asan.c"), "-lcrypto", "-o", str(exe)],
        capture_output=True, text=True)
    if build.returncode != 0 and "asan" in build.stderr.lower():
        pytest.skip("gcc without AddressSanitizer: " + build.stderr[-200:])
    assert build.returncode == 0, build.stderr
    rng = random.Random(11)
    inputs = []
    for mtype in MsgType:
        payload = pack_message(make(mtype))
        (dg,) = wire.encode(make(mtype), KEY)
        inputs += [payload, dg]
        for _ in range(1500):
            b = bytearray(payload)
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(b) + 1)
                if rng.random() < 0.6 and at < len(b):
                    b[at] = rng.randrange(256)
                elif rng.random() < 0.5:
                    b[at:at] = rng.randbytes(rng.randint(1, 3))
                else:
                    del b[at:at + rng.randint(1, 6)]
            inputs.append(bytes(b))
    inputs += [packed(_random_doc(rng)) for _ in range(3000)]
    inputs += [value for value, _ in EDGES.values()]
    inputs += [request_with(offset=v) for v, how in EDGES.values() if how != "truncated"]
    whole = request_with()
    inputs += [whole[:i] for i in range(len(whole))]
    (frag, *_) = Encoder(KEY, mtu_bytes=200, codec="python").encode(
        make(MsgType.REQUEST, body={"offset": 0, "data": b"z" * 900, "flags": 0}))
    inputs += [frag[:i] for i in range(len(frag) + 1)]
    blob = b"".join(struct.pack("<I", len(x)) + x for x in inputs)
    run = subprocess.run([str(exe)], input=blob, capture_output=True, timeout=300,
                         env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
                              "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"})
    report = run.stdout.decode() + run.stderr.decode()
    assert run.returncode == 0 and "ERROR" not in report and "runtime error" not in report, \
        report[-3000:]
    assert f"inputs {len(inputs)} " in report and " ok " in report, report


def test_a_running_process_is_told_and_keeps_the_references_verdict(monkeypatch):
    """LLFT_WIRE=differential in a process: a divergence is reported, not raised, and
    the reference's verdict (message and counters) is what the process goes on with."""
    told = []
    dec = DifferentialDecoder(KEY, "server")
    dec.on_divergence = told.append
    monkeypatch.setattr(wire.NativeCodec, "message",
                        lambda *a: (_ for _ in ()).throw(wire._Rejected(Reject.BAD_BODY)))
    msg = make(MsgType.REQUEST)
    (dg,) = wire.encode(msg, KEY)
    assert dec.decode(dg, 0) == msg
    assert len(told) == 1 and isinstance(told[0], WireDivergence)
    assert not dec.rejections and dec.accepted == 1


def test_a_bad_llft_wire_is_one_clear_line(monkeypatch, capsys, tmp_path):
    from llft.cli import main
    monkeypatch.setenv("LLFT_WIRE", "fast")
    assert main(["keygen", str(tmp_path / "k.key")]) == 2
    err = capsys.readouterr().err
    assert err == "llft: LLFT_WIRE='fast': one of python, native, differential\n"
    assert not (tmp_path / "k.key").exists()
