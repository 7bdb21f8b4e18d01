"""The C steady lane (native/lane/, llft/protocol/messaging/native_lane.py) against its
specification, SteadyLane (llft/protocol/messaging/lane.py):

  1. the gateway-shaped schedules of `llft simulate messaging`, every replica's core
     lending to a NativeLane in lockstep with a copy of the core (LanedEndpoint shadow),
     under loss/dup/reorder and under changes of primary and a dead group;
  2. SteadyLane and NativeLane fed the same random events from the same loans (taken
     from those schedules) end every event with equal results, actions and loans;
  3. hostile datagrams on the raw path are refused and change nothing.
Each has a check that it can fail: a rule changed in SteadyLane, or a field of the C
state perturbed, is caught.
"""
from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import fields

import msgpack
import pytest

from llft.protocol import wire
from llft.protocol.messages import Message, MsgType, ROLES, Role
from llft.protocol.messaging.actions import Deliver
from llft.protocol.messaging import lane as lane_module
from llft.protocol.messaging.lane import LanedEndpoint, Loan, SteadyLane
from llft.protocol.messaging.native_lane import (NativeLane, SendDatagrams,
                                                 native_available, native_engine)
from llft.protocol.messaging.timers import Timer
from llft.protocol.messaging.trailer import pack_trailer, unpack_trailer
from llft.sim import messaging_check as mc
from llft.sim.kernel import Sim

pytestmark = pytest.mark.skipif(not native_available(), reason="native._llft_lane is not built")

if native_available():
    from native._llft_lane import ffi, lib

KEY = bytes(range(32))
MTU = wire.DEFAULT_MTU_BYTES        # what the simulator's NetConfig uses


# ---------------------------------------------------------------- 1. the simulator ---

class _KeyedSim(Sim):
    """The kernel, remembering the last one made: `Schedule` makes its Sim before its
    replicas, whose lanes need its key (random per schedule) and MTU."""
    last: Sim | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _KeyedSim.last = self


def _use_engine(mp, make) -> None:
    """messaging_check wraps every core with `make(sim)` as its lane engine."""
    class Laned(LanedEndpoint):
        def __init__(self, endpoint, **kw):
            kw["engine"] = make(_KeyedSim.last)
            super().__init__(endpoint, **kw)
    mp.setattr(mc, "Sim", _KeyedSim)
    mp.setattr(mc, "LanedEndpoint", Laned)


def _native(sim):
    return native_engine(sim.key, sim.net.mtu_bytes)


def _run(seeds, **faults):
    """(violations, lane events by kind, loans, lanes that ran in C) of the gateway-shaped
    schedules of `seeds`; every core's lanes are NativeLanes (_use_engine first)."""
    violations, events, loans, native = [], Counter(), 0, 0
    real = LanedEndpoint._shadowed

    def counted(self, since, event, *args, **kw):
        events[event] += 1
        if event == "handle_message":       # (the lane took it already: by its actions)
            m = args[0]
            events[m.type.name if m.type not in (MsgType.REQUEST, MsgType.REPLY) else
                   "data" if any(isinstance(a, Deliver) for a in self.lane.actions[since:])
                   else "dup"] += 1
        return real(self, since, event, *args, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LanedEndpoint, "_shadowed", counted)
        for s, found in mc.gateway_schedules(seeds, **faults):
            violations += found
            for rep in s.by_node.values():
                if isinstance(rep.core, LanedEndpoint):
                    loans += rep.core.loans
                    eng = rep.core.engine.engine
                    native += eng.loans - sum(eng.inert.values())
    return violations, events, loans, native


def _kind(loan: Loan, msg: Message) -> str:
    """What a message a lane took was (before it took it): data, dup, KEEP_ALIVE, ..."""
    if msg.type in (MsgType.REQUEST, MsgType.REPLY):
        return "dup" if msg.msn <= loan.upto else "data"
    return msg.type.name


def test_native_lanes_match_the_core_under_faults(monkeypatch):
    _use_engine(monkeypatch, _native)
    violations, events, loans, native = _run(range(40), loss=0.1, dup=0.05, reorder=0.1)
    assert violations == []
    # each steady kind of message was the lane's, in C, in lockstep with the core
    # (seen: 57 data, 36 dup, 65 FIRST_ACK, 10 KEEP_ALIVE; 447 loans, 308 held in C)
    assert events["KEEP_ALIVE"] >= 5 and events["dup"] >= 10 and events["FIRST_ACK"] >= 20
    # the C lanes carried traffic both ways (seen: 190 sends, 58 receives, 552 loans of
    # which 410 held in C; SteadyLane takes 254 and 83 here: the rest are messages over
    # the MTU, which C leaves to the core)
    assert events["send"] >= 120 and events["handle_message"] >= 40
    assert loans >= 300 and native >= 250


def test_native_lanes_match_the_core_across_changes_of_primary_and_a_dead_group(monkeypatch):
    _use_engine(monkeypatch, _native)
    violations, events, _, _ = _run(range(100, 140), failover=0.5, die=0.2, loss=0.05)
    assert violations == []
    assert sum(events.values()) >= 150         # (seen: 236)


def test_lockstep_catches_a_native_lane_that_forgets_state(monkeypatch):
    """A C state field left as it was by a receive (ka_idle) is caught at reclaim."""
    _use_engine(monkeypatch, _native)
    real = NativeLane.handle_datagram

    def keeps_ka_idle(self, datagram, now_us):
        before = self._st.ka_idle + 1 if self._c is not None else 0
        if not real(self, datagram, now_us):
            return False
        self._st.ka_idle = before
        return True
    monkeypatch.setattr(NativeLane, "handle_datagram", keeps_ka_idle)
    violations, _, _, _ = _run(range(40), loss=0.05, reorder=0.1)
    assert any("ka_idle" in v for v in violations)


@pytest.mark.parametrize("field, caught", [("precedence", "send: lane actions"),
                                           ("keepalive_us", "send: lane timers")])
def test_lockstep_catches_native_state_that_differs(monkeypatch, field, caught):
    """C's state loaded one off in one field is caught at the next send: a data message
    sealed with another precedence by its actions, a KEEPALIVE deadline of C's own making
    one microsecond off by its timers."""
    _use_engine(monkeypatch, _native)
    real = NativeLane._load

    def one_off(self, loan):
        c = real(self, loan)
        st = lib.llft_lane_state_of(c)
        setattr(st, field, getattr(st, field) + 1)
        return c
    monkeypatch.setattr(NativeLane, "_load", one_off)
    violations, _, _, _ = _run(range(20))
    assert any(caught in v for v in violations)


# ----------------------------------------------------------------------- the loans ---

@pytest.fixture(scope="module")
def loans() -> list[Loan]:
    """Loans as the gateway's core lends them in the simulator, every window and payload
    the schedules draw, with and without order info to reflect; only those C can hold
    (a sent message over the MTU: the lane is inert, see native_lane.py)."""
    got = []

    def recording(sim):
        def engine(loan):
            got.append(copy.deepcopy(loan))
            return SteadyLane(loan)
        return engine
    with pytest.MonkeyPatch.context() as mp:
        _use_engine(mp, recording)
        for seed in range(30):
            mc.Schedule(mc.generate(seed, gateway=1.0, loss=0.1, dup=0.05,
                                    reorder=0.1)).run()
    eng = native_engine(KEY, MTU)
    held = [ln for ln in got if eng(copy.deepcopy(ln)).inert is None]
    rng = random.Random(7)
    rng.shuffle(held)
    assert len(held) >= 100
    assert any(ln.to_reflect for ln in held) and any(ln.last_order_info for ln in held)
    assert any(ln.sent for ln in held) and {ln.window_msgs for ln in held} >= {4, 8, 32}
    return held[:60]


# ------------------------------------------------------------- random events, both ---

def _loose(obj, rng: random.Random) -> bytes:
    """msgpack of `obj` as another packer may write it: every int, bin and array in a
    size class drawn at random among those that hold it (msgpack.unpackb reads the same
    value; the lane must hold and reflect it as the core packs it)."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, float)):
        return msgpack.packb(obj, use_bin_type=True)
    if isinstance(obj, int):
        if obj >= 0:
            forms = [(t, n) for t, n in ((0xcc, 1), (0xcd, 2), (0xce, 4), (0xcf, 8))
                     if obj < 1 << (8 * n)]
            t, n = rng.choice(forms)
            return bytes([t]) + obj.to_bytes(n, "big")
        forms = [(t, n) for t, n in ((0xd0, 1), (0xd1, 2), (0xd2, 4), (0xd3, 8))
                 if obj >= -(1 << (8 * n - 1))]
        t, n = rng.choice(forms)
        return bytes([t]) + obj.to_bytes(n, "big", signed=True)
    if isinstance(obj, bytes):
        forms = [(t, n) for t, n in ((0xc4, 1), (0xc5, 2), (0xc6, 4)) if len(obj) < 1 << (8 * n)]
        t, n = rng.choice(forms)
        return bytes([t]) + len(obj).to_bytes(n, "big") + obj
    if isinstance(obj, list):
        head = rng.choice([bytes([0x90 | len(obj)])] * (len(obj) < 16)
                          + [b"\xdc" + len(obj).to_bytes(2, "big"),
                             b"\xdd" + len(obj).to_bytes(4, "big")])
        return head + b"".join(_loose(x, rng) for x in obj)
    return msgpack.packb(obj, use_bin_type=True)


def _nest(depth: int) -> bytes:
    return b"\x91" * depth + b"\x90"


# Trailers no well-behaved peer sends: each is judged by unpack_trailer's rules (and
# SteadyLane's), and the lane must judge it the same.
HOSTILE_TRAILERS = [
    b"", b"\xc0", b"\x90", b"\x92\x01\xc0", msgpack.packb([1, None, None, [], 5, 6]),
    msgpack.packb(["x", None, None]), msgpack.packb([True, None, None]),
    msgpack.packb([1.5, None, None]), msgpack.packb({"a": 1}),
    msgpack.packb([1, [1, 1, [b"a"]], [2, 1, [b"b"]]]),         # a reflection: refused
    msgpack.packb([1, [1, 0, [b"a"]], None]),                   # first 0: own None
    msgpack.packb([1, [1, 1, ["a"]], None]),                    # a str chunk: own None
    msgpack.packb([1, [1, 1, [b"a"], 4], None]),                # four items: own None
    msgpack.packb([1, [True, 1, [b"a"]], None]),                # bool pvn: own None
    msgpack.packb([1, [1, 1, (b"a",)], None, [[1, 0, 5]]]),     # others: refused
    msgpack.packb([1, None, None, [[1, 2, 5]]]),                # role 2: not listed
    msgpack.packb([1, None, None, [[1, True, 5]]]),             # a bool: not listed
    msgpack.packb([1, None, None, [[1, 0, 5.0]]]),
    msgpack.packb([1, None, None, [[1, 0]], 3]),
    msgpack.packb([1, None, None, [[-1, 1, -7]]]),              # negative: listed
    msgpack.packb([1, None, None, "x", 3]), msgpack.packb([1, None, None, {}, 3]),
    msgpack.packb([1, None, None, [], -5]), msgpack.packb([1, None, None, [], "x"]),
    msgpack.packb([-9, None, None, [], 2 ** 64 - 1]),
    msgpack.packb([1, None, None]) + b"\x00",                   # ExtraData
    msgpack.packb([1, None, None, [], 7])[:-1],                 # truncated
    msgpack.packb([1, None, None, [msgpack.ExtType(5, b"ab")]]),    # an ExtType value
    msgpack.packb([1, msgpack.ExtType(1, b""), None]),
    msgpack.packb([1, [1, 1, [msgpack.ExtType(1, b"x")]], None]),
    msgpack.packb([1, None, None, [msgpack.Timestamp(1, 5)]]),  # a good timestamp
    b"\x93\x01\xc0\xd7\xff" + b"\xff" * 8,                      # nanoseconds too big
    b"\x93\x01\xc0\xc7\x03\xff\x00\x00\x00",                    # timestamp of 3 bytes
    b"\x93\x01\xc0\xd4\x07\x00",                                # fixext 1 of type 7
    b"\x93\x01\xc0\xd4\x80\x00", b"\x93\x01\xc0\xd4\xfe\x00",       # negative types:
    b"\x93\x01\xc0\xc7\x00\x96",                                # ExtType refuses them
    b"\x93\x01\x81\x01\x02\xc0",                                # an int map key
    b"\x93\x01\x81\xc4\x01\x41\x02\xc0",                        # a bytes map key
    b"\x93\x01\x81\xd4\x01\x00\x02\xc0",                        # an ExtType map key
    b"\x93\x01\xa2\xff\xfe\xc0",                                # bad UTF-8
    b"\x93\x01\xc1\xc0",                                        # never used byte
    b"\x93\x01\xdd\x7f\xff\xff\xff\xc0",                        # count beyond the buffer
    b"\x93\x01" + _nest(1021) + b"\xc0", b"\x93\x01" + _nest(1022) + b"\xc0",
    b"\x93\x01" + _nest(1023) + b"\xc0", b"\x93\x01" + _nest(1024) + b"\xc0",
    b"\x93\x01\x93\xd3\x80" + b"\x00" * 7 + b"\x01\x91\xc4\x01\x41\xc0",  # pvn -2^63
    msgpack.packb([1, [2 ** 64 - 1, 2 ** 64 - 1, [b"a", b"b"]], None]),     # end 2^64
]


def _section(s: Loan, rng: random.Random) -> list:
    """An order-info section near what the loan holds (so that trimming, comparing and
    replacing all happen), sometimes at the ends of msgpack's range."""
    rpvn, rpos = s.reflected or (0, 0)
    held = s.last_order_info or s.to_reflect
    pvn = rng.choice([rpvn, rpvn, rpvn + 1, max(rpvn - 1, 0), held[0] if held else 1,
                      -3, -(2 ** 63), 2 ** 64 - 1])
    ref = rpos if pvn == rpvn else (held[1] if held and pvn == held[0] else 1)
    first = rng.choice([min(max(1, ref + rng.randint(-3, 3)), 2 ** 64 - 1),
                        rng.randint(1, 40), 2 ** 64 - 1])
    chunks = [rng.randbytes(rng.choice([0, 1, 5, 31, 40, 300]))
              for _ in range(rng.choice([0, 1, 2, 3, 5]))]
    return [min(pvn, 2 ** 64 - 1), first, chunks]     # (what msgpack can carry)


def _trailer(s: Loan, rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.08:
        return rng.choice(HOSTILE_TRAILERS)
    own = _section(s, rng) if rng.random() < 0.5 else None
    sent_upto = rng.choice([s.upto + 1, 0, -1, 2 ** 64 - 1, rng.randint(0, 99)])
    refl = None
    if rng.random() < 0.08:
        refl = rng.choice([_section(s, rng), [1, 0, []], "junk"])
    t = [sent_upto, own, refl]
    n = rng.choice([3, 4, 5, 5, 5])
    if n >= 4:
        t.append(rng.choice([[], [], [[1, 2, 3]], [[1, 0]], "x", [[True, 0, 1]],
                             [[1, 0, 5]] if rng.random() < 0.3 else []]))
    if n == 5:
        t.append(rng.choice([s.delivered, rng.randint(0, 10 ** 6), -1, "x", None,
                             2 ** 64 - 1]))
    return _loose(t, rng) if rng.random() < 0.3 else msgpack.packb(t, use_bin_type=True)


def _next_message(s: Loan, rng: random.Random) -> Message:
    """The next data message of the lent connection, often steady, sometimes one rule
    off (each must be refused as SteadyLane refuses it)."""
    remote, seq, role = s.cid
    mtype = MsgType.REPLY if role is Role.CLIENT else MsgType.REQUEST
    ts_sent = [m.ts for m in s.sent]
    last = s.next_msn - 1
    f = dict(type=mtype, src_group=remote, dst_group=s.group, conn_seq=seq,
             role=ROLES[1 - role], pvn=s.view_pvn, precedence=rng.randint(0, 3),
             sender=rng.choice([s.birth_id + 1, rng.getrandbits(62) + 1]), msn=s.upto + 1,
             ack=rng.choice([last, last, s.remote_ack, max(0, last - 1), last + 1,
                             rng.randint(0, last + 1)]),
             back=rng.choice(ts_sent + [s.remote_gw, 0, s.clock + 3,
                                        rng.randint(0, s.clock + 3)]),
             ts=rng.choice([s.clock + rng.randint(1, 4), rng.randint(0, s.clock + 2),
                            s.view_ts, s.declared[1]]),
             body={"offset": s.delivered, "data": rng.randbytes(rng.randint(1, 300)),
                   "flags": 0},
             order_info=_trailer(s, rng))
    r = rng.random()
    if r < 0.15 and s.upto >= 1:                # a duplicate (crossed our ack)
        f["msn"] = rng.choice([s.upto, rng.randint(1, s.upto)])
        f["body"] = {**f["body"], "offset": rng.randint(0, s.delivered)}
    elif r < 0.45:                              # a KEEP_ALIVE or a FIRST_ACK
        f["type"] = rng.choice([MsgType.KEEP_ALIVE, MsgType.FIRST_ACK])
        f["msn"], f["body"] = 0, {}
        f["ack"] = rng.choice([last, last, 0, f["ack"]])
        sent_upto = rng.choice([s.upto, s.upto, max(0, s.upto - 1), s.upto + 1, -1])
        own = _section(s, rng) if rng.random() < 0.1 else None
        t = [sent_upto, own, None, [] if rng.random() < 0.9 else [[seq + 1, 0, 3]],
             rng.choice([s.delivered, s.delivered, None, s.delivered + 1,
                         rng.randint(0, 2 ** 40)])]
        f["order_info"] = (msgpack.packb(t, use_bin_type=True) if rng.random() < 0.95
                           else rng.choice(HOSTILE_TRAILERS))
    if rng.random() < 0.2:
        k = rng.randrange(12)
        if not f["body"] and k in (0, 1, 2, 3):     # (no msn or body to change)
            k = 4
        if k == 0:
            f["msn"] = rng.choice([s.upto, s.upto + 2])
        elif k == 1:
            f["body"] = {**f["body"], "flags": rng.choice([1, 2, 4])}
        elif k == 2:
            f["body"] = {**f["body"], "data": b""}
        elif k == 3:
            off = s.delivered + rng.choice([1, -1] if s.delivered else [1])
            f["body"] = {**f["body"], "offset": off}
        elif k == 4:
            f["pvn"] = s.view_pvn + 1
        elif k == 5:
            f["src_group"] = remote + "x"
        elif k == 6:
            f["dst_group"] = s.group + "x"
        elif k == 7:
            f["conn_seq"] = seq + 1
        elif k == 8:
            f["role"] = role
        elif k == 9:
            f["sender"] = s.birth_id
        elif k == 10 and not f["msn"]:             # a control message the lane leaves
            f["type"] = MsgType.SECOND_ACK
        elif k == 10:
            f["type"] = MsgType.REQUEST if mtype is MsgType.REPLY else MsgType.REPLY
        else:
            f["order_info"] = pack_trailer(s.upto + 1, None, _section(s, rng), [],
                                           s.delivered)
    return Message(**f)


def _loan_difference(a: Loan, b: Loan) -> str:
    return ", ".join(f"{f.name}: {getattr(a, f.name)!r:.120} != {getattr(b, f.name)!r:.120}"
                     for f in fields(Loan) if getattr(a, f.name) != getattr(b, f.name))


R_NAMES = {getattr(lib, n): n for n in dir(lib) if n.startswith("LLFT_LANE_R_")} \
    if native_available() else {}


def _differ(loan: Loan, seed: int, steady=SteadyLane, events: int = 80,
            tally: Counter | None = None) -> str | None:
    """Feed a SteadyLane (`steady`) and a NativeLane the same random events from copies
    of `loan`; the first difference, or None. Where C refuses by design what SteadyLane
    takes (a message over the MTU, a number past 64 bits that the core could not send
    either), SteadyLane's event is undone and the run goes on."""
    rng = random.Random(seed)
    py = steady(copy.deepcopy(loan))
    nat = native_engine(KEY, MTU)(copy.deepcopy(loan))
    assert nat.inert is None, nat.inert
    now = loan.now
    for i in range(events):
        now = max(0, now + rng.choice([0, 1, 60, 400, 3000, 20000, -100]))
        before = copy.deepcopy(py.loan)
        if rng.random() < 0.4:
            step = loan.max_payload_bytes
            data = rng.randbytes(rng.choice([1, rng.randint(1, step), step, step + 1,
                                             rng.randint(1, 3 * step)]))
            t = None if rng.random() < 0.1 else now
            event = f"send {len(data)} at {t}"
            try:
                a = py.send(data, t)
            except OverflowError:       # packb of a number past 64 bits: the core too
                a = "raised"
            b = nat.send(data, t)
            if a and not b and (
                    a == "raised" and nat.last_refusal == lib.LLFT_LANE_R_RANGE
                    or nat.last_refusal == lib.LLFT_LANE_R_FRAGMENT and any(
                        len(wire.encode(x.msg, KEY, mtu_bytes=MTU)) > 1 for x in py.actions)):
                py.loan, py.actions = before, []
                if tally is not None:
                    tally["send refused by design"] += 1
                continue
        else:
            msg = _next_message(py.loan, rng)
            dgs = wire.encode(msg, KEY, mtu_bytes=MTU)
            event = f"receive {_kind(py.loan, msg)} msn {msg.msn} trailer {msg.order_info.hex()}"
            a = py.handle_message(msg, now)
            if len(dgs) > 1:
                b = nat.handle_message(msg, now)
                if b:
                    return f"event {i}, {event}: C took a fragmented message"
                py.loan, py.actions = before, []
                continue
            # both entries of C: the message (encoded by wire.encode) and the datagram
            b = (nat.handle_message(msg, now) if rng.random() < 0.5
                 else nat.handle_datagram(dgs[0], now))
        if a != b:
            return (f"event {i}, {event}: SteadyLane {a}, NativeLane {b} "
                    f"({R_NAMES.get(nat.last_refusal)})")
        if tally is not None:
            tally[f"{event.split()[0]} {'taken' if a else 'refused'}"] += 1
            if event.startswith("receive"):
                tally[f"{event.split()[1]} {'taken' if a else 'refused'}"] += 1
        mine, theirs = nat.take_actions(), py.take_actions()
        if mine != theirs:
            return f"event {i}, {event}: actions {mine!r:.300} != {theirs!r:.300}"
        if nat.loan != py.loan:
            return f"event {i}, {event}: {_loan_difference(nat.loan, py.loan)}"
        if nat.next_timer_us() != py.next_timer_us():
            return f"event {i}, {event}: next timer"
    return None


def test_same_events_same_loans(loans):
    tally = Counter()
    for k, loan in enumerate(loans):
        assert _differ(loan, k, tally=tally) is None
    # the steady paths were taken, not only refusals (seen: ~1500 sends, ~1000 receives
    # taken of 4800 events)
    assert tally["send taken"] >= 500 and tally["receive taken"] >= 500
    assert tally["receive refused"] >= 300
    # and the other steady messages (seen: 329 dup, 231 KEEP_ALIVE, 232 FIRST_ACK taken)
    for kind in ("dup", "KEEP_ALIVE", "FIRST_ACK"):
        assert tally[f"{kind} taken"] >= 100 and tally[f"{kind} refused"] >= 20, tally


class _DropsCoveredLate(SteadyLane):
    def _drop_covered(self):                    # `<` for `<=`: a message at the mark stays
        s = self.loan
        real = s.remote_gw
        s.remote_gw = real - 1
        try:
            super()._drop_covered()
        finally:
            s.remote_gw = real


class _ReflectsOneChunkAgain(SteadyLane):
    def _unreflected(self, sec):
        s = self.loan
        if s.reflected and sec[0] == s.reflected[0] and 1 < sec[1] <= s.reflected[1]:
            s.reflected = (s.reflected[0], s.reflected[1] - 1)
        return super()._unreflected(sec)


class _ForgetsFirstAckRetries(SteadyLane):
    def _want_first_ack(self, reflect):
        tries = self.loan.fa_tries
        super()._want_first_ack(reflect)
        self.loan.fa_tries = tries


class _SmoothsFaster(SteadyLane):
    def _on_acked(self, upto, now):
        srtt = self.loan.rto[0]
        super()._on_acked(upto, now)
        r = self.loan.rto
        if srtt is not None and r[0] != srtt:
            self.loan.rto = (r[0] + (r[0] - srtt), *r[1:])


class _KeepsRefusedTrailers(SteadyLane):
    """The others filter without its role check (e[1] in (0, 1))."""
    def handle_message(self, msg, now_us):
        real = lane_module.unpack_trailer

        def loose(raw):
            t = real(raw)
            if t is None:
                return None
            try:
                whole = msgpack.unpackb(raw, raw=False)
                others = [e for e in whole[3] if type(e) is list and len(e) == 3
                          and all(type(x) is int for x in e)]
            except Exception:   # noqa: BLE001
                others = t[3]
            return (*t[:3], others, t[4])
        lane_module.unpack_trailer = loose
        try:
            return super().handle_message(msg, now_us)
        finally:
            lane_module.unpack_trailer = real


class _KeepAliveKeepsFaCount(SteadyLane):
    """_on_keepalive without its fa_count reset (when the ack is our last msn)."""
    def handle_message(self, msg, now_us):
        n = self.loan.fa_count
        took = super().handle_message(msg, now_us)
        if took and msg.type is MsgType.KEEP_ALIVE and msg.ack == self.loan.next_msn - 1:
            self.loan.fa_count = n
        return took


class _DuplicateNotReAcked(SteadyLane):
    """_rx_data's duplicate branch without its want_first_ack(reflect=True)."""
    def handle_message(self, msg, now_us):
        s = self.loan
        dup = msg.type in (MsgType.REQUEST, MsgType.REPLY) and msg.msn <= s.upto
        timers, tries = dict(s.timers), s.fa_tries
        if not dup:
            return super().handle_message(msg, now_us)
        real = self._want_first_ack
        calls = []

        def once(reflect):
            calls.append(reflect)
            if len(calls) > 1:
                real(reflect)
        self._want_first_ack = once
        try:
            return super().handle_message(msg, now_us)
        finally:
            del self._want_first_ack


class _SecondAckBeforeTheClock(SteadyLane):
    """A SECOND_ACK stamped with the clock before its own tick."""
    def _on_first_ack(self, msg):
        n = len(self.actions)
        super()._on_first_ack(msg)
        if len(self.actions) > n:
            m = self.actions[-1].msg
            m.ts -= 1


@pytest.mark.parametrize("mutant", [_DropsCoveredLate, _ReflectsOneChunkAgain,
                                    _ForgetsFirstAckRetries, _SmoothsFaster,
                                    _KeepsRefusedTrailers, _KeepAliveKeepsFaCount,
                                    _DuplicateNotReAcked, _SecondAckBeforeTheClock])
def test_same_events_catch_a_rule_changed(loans, mutant):
    """Each of these one-rule changes to SteadyLane is told apart from C by the random
    events above (so they reach that rule, and C follows the real one). Each loan runs
    as recorded and as lent while a FIRST_ACK of its last message waits after one try:
    the state a duplicate's re-ack changes, which the recorded loans reach only now and
    then (the messaging timers' defaults moved which loans the simulator records)."""
    assert any(_differ(v, k, steady=mutant) for k, loan in enumerate(loans[:30])
               for v in (loan, _first_ack_pending(loan)))


def _first_ack_pending(loan: Loan) -> Loan:
    v = copy.deepcopy(loan)
    v.fa_pending, v.fa_tries = v.upto, 1
    v.timers.setdefault(Timer.FIRST_ACK, v.now + v.first_ack_delay_us)
    return v


# ------------------------------------------------------------ 3. hostile datagrams ---

def _state(lane: NativeLane) -> bytes:
    return bytes(ffi.buffer(lane._st))


def _steady_message(loan: Loan, rng: random.Random) -> Message:
    """A message the lane takes (checked by the caller)."""
    remote, seq, role = loan.cid
    return Message(type=MsgType.REPLY if role is Role.CLIENT else MsgType.REQUEST,
                   src_group=remote, dst_group=loan.group, conn_seq=seq,
                   role=ROLES[1 - role], pvn=loan.view_pvn, precedence=1,
                   sender=loan.birth_id + 1, msn=loan.upto + 1, ack=loan.next_msn - 1,
                   back=loan.remote_gw, ts=loan.clock + 1,
                   body={"offset": loan.delivered, "data": rng.randbytes(50), "flags": 0},
                   order_info=pack_trailer(loan.upto + 1, [1, 1, [b"x"]], None, [],
                                           loan.delivered))


def _refuses(lane: NativeLane, datagram, reason: int | None = None) -> None:
    before, loan = _state(lane), lane.loan
    assert lane.handle_datagram(datagram, loan.now + 10) is False
    assert lane.actions == []
    assert _state(lane) == before and lane.loan == loan
    if reason is not None:
        assert lane.last_refusal == reason, R_NAMES.get(lane.last_refusal)


def test_hostile_datagrams_change_nothing(loans):
    rng = random.Random(3)
    eng = native_engine(KEY, MTU)
    for loan in loans[:12]:
        good = _steady_message(loan, rng)
        (dg,) = wire.encode(good, KEY, mtu_bytes=MTU)
        # the good one is taken, and a taken datagram does show in the state compared
        probe = eng(copy.deepcopy(loan))
        before = _state(probe)
        assert probe.handle_datagram(dg, loan.now + 10)
        assert _state(probe) != before
        lane = eng(copy.deepcopy(loan))
        for k in range(len(dg)):                                    # truncated
            _refuses(lane, dg[:k], lib.LLFT_LANE_R_WIRE)
        for i in range(len(dg)):                                    # any byte flipped
            _refuses(lane, dg[:i] + bytes([dg[i] ^ (1 + rng.randrange(255))]) + dg[i + 1:],
                     lib.LLFT_LANE_R_WIRE)
        _refuses(lane, wire.encode(good, bytes(32), mtu_bytes=MTU)[0],   # another key
                 lib.LLFT_LANE_R_WIRE)
        _refuses(lane, bytearray(dg))                               # (not bytes)
        _refuses(lane, dg + b"\x00", lib.LLFT_LANE_R_WIRE)          # MAC covers length
        big = Message(**{**vars_of(good), "body": {**good.body, "data": bytes(2000)}})
        _refuses(lane, wire.encode(big, KEY, mtu_bytes=wire.MAX_DATAGRAM_BYTES)[0],
                 lib.LLFT_LANE_R_SIZE)
        for frag in wire.encode(big, KEY, mtu_bytes=MTU):           # its fragments
            _refuses(lane, frag, lib.LLFT_LANE_R_WIRE)
        other_type = Message(**{**vars_of(good), "type": MsgType.NACK, "msn": 0,
                                "body": {"missing": []}})
        _refuses(lane, wire.encode(other_type, KEY)[0], lib.LLFT_LANE_R_WIRE)
        # (a type the shared codec parses for the backups' lane: refused as not this one's)
        second_ack = Message(**{**vars_of(good), "type": MsgType.SECOND_ACK, "msn": 0,
                                "body": {}})
        _refuses(lane, wire.encode(second_ack, KEY)[0], lib.LLFT_LANE_R_HEADER)
        for ctl in (MsgType.KEEP_ALIVE, MsgType.FIRST_ACK):     # own order info, ahead
            for trailer in (good.order_info, pack_trailer(loan.upto + 1, None, None, [],
                                                          loan.delivered)):
                wrong = Message(**{**vars_of(good), "type": ctl, "msn": 0, "body": {},
                                   "order_info": trailer})
                _refuses(lane, wire.encode(wrong, KEY)[0], lib.LLFT_LANE_R_TRAILER)
        remote, seq, role = loan.cid
        for change in ({"conn_seq": seq + 1}, {"src_group": remote + "x"},
                       {"dst_group": loan.group + "x"}, {"role": role},
                       {"sender": loan.birth_id}, {"pvn": loan.view_pvn + 1},
                       {"msn": loan.upto + 2},
                       {"type": MsgType.REQUEST if good.type is MsgType.REPLY
                        else MsgType.REPLY}):
            wrong = Message(**{**vars_of(good), **change})
            _refuses(lane, wire.encode(wrong, KEY)[0], lib.LLFT_LANE_R_HEADER)
        for body in ({"flags": 1}, {"data": b""}, {"offset": loan.delivered + 1}):
            wrong = Message(**{**vars_of(good), "body": {**good.body, **body}})
            _refuses(lane, wire.encode(wrong, KEY)[0], lib.LLFT_LANE_R_BODY)
        for flags in (1, 2, 4):                                     # a flagged duplicate
            wrong = Message(**{**vars_of(good), "msn": loan.upto,
                               "body": {**good.body, "flags": flags}})
            _refuses(lane, wire.encode(wrong, KEY)[0], lib.LLFT_LANE_R_BODY)
        for raw in HOSTILE_TRAILERS:                                # sealed, malformed
            t = unpack_trailer(raw)
            if t is None or t[2] is not None or t[3]:
                for change in ({}, {"msn": loan.upto},
                               {"type": MsgType.KEEP_ALIVE, "msn": 0, "body": {}},
                               {"type": MsgType.FIRST_ACK, "msn": 0, "body": {}}):
                    wrong = Message(**{**vars_of(good), "order_info": raw, **change})
                    _refuses(lane, wire.encode(wrong, KEY)[0], lib.LLFT_LANE_R_TRAILER)
        assert lane.handle_datagram(dg, loan.now + 10)              # and still steady


def vars_of(msg: Message) -> dict:
    return {f.name: getattr(msg, f.name) for f in fields(Message)}


def test_resealed_mutations_are_judged_as_steady_lane_judges_them(loans):
    """Payload bytes changed and sealed again with the key (so they pass the tag): C
    takes exactly those the reference decoder reads as a message SteadyLane takes, with
    the same state after; the rest change nothing."""
    rng = random.Random(5)
    eng = native_engine(KEY, MTU)
    decoder = wire.Decoder(KEY, None, native=False)
    taken = refused = 0
    for loan in loans[:10]:
        (dg,) = wire.encode(_steady_message(loan, rng), KEY, mtu_bytes=MTU)
        payload = dg[wire.HEADER_BYTES:]
        for _ in range(300):
            p = bytearray(payload)
            for _ in range(rng.choice([1, 1, 2, 3])):
                p[rng.randrange(len(p))] = rng.randrange(256)
            mutated = wire.seal(KEY, bytes(p))
            lane = eng(copy.deepcopy(loan))
            msg = decoder.decode(mutated, 0)
            py = SteadyLane(copy.deepcopy(loan))
            want = msg is not None and py.handle_message(msg, loan.now + 10)
            if want:
                assert lane.handle_datagram(mutated, loan.now + 10)
                assert lane.take_actions() == py.take_actions() and lane.loan == py.loan
                taken += 1
            else:
                _refuses(lane, mutated)
                refused += 1
    assert taken >= 200 and refused >= 1000


def test_refused_sends_change_nothing(loans):
    """A send refused part way (its second message would need a fragment, the first
    went into the ring) takes every change back; so do the other refusals."""
    loan = copy.deepcopy(next(ln for ln in loans if ln.to_reflect is None))
    loan.sent, loan.sent_at, loan.sent_bytes = [], {}, 0
    loan.next_msn, loan.clock = 127, 126        # msn and ts cross 127 -> 128: one byte more
    loan.window_msgs, loan.max_queue_bytes = 8, 1 << 20
    loan.timers.pop(Timer.RETRANSMIT, None)
    found = False
    for step in range(1200, 1400):
        loan.max_payload_bytes = step
        one = native_engine(KEY, MTU)(copy.deepcopy(loan))
        assert one.inert is None
        two = native_engine(KEY, MTU)(copy.deepcopy(loan))
        if one.send(bytes(step), loan.now) and not two.send(bytes(2 * step), loan.now):
            assert two.last_refusal == lib.LLFT_LANE_R_FRAGMENT
            found = True
            break
    assert found
    before, state = two.loan, _state(two)
    for data in (bytes(2 * step), b"", bytes(loan.max_queue_bytes + 1), bytes(9 * step)):
        assert not two.send(data, loan.now + 5)
        assert _state(two) == state and two.loan == before and two.actions == []
    # and the send that fits goes, as SteadyLane sends it
    py = SteadyLane(copy.deepcopy(loan))
    assert two.send(bytes(step), loan.now + 5) and py.send(bytes(step), loan.now + 5)
    assert two.take_actions() == py.take_actions() and two.loan == py.loan


def test_numbers_past_64_bits_are_refused(loans):
    """What SteadyLane would put on the wire past 64 bits (the core's encoder raises on
    it) C refuses and leaves to the core."""
    loan = copy.deepcopy(loans[0])
    loan.clock = 2 ** 64 - 1
    lane = native_engine(KEY, MTU)(loan)
    state = _state(lane)
    assert not lane.send(b"x", loan.now) and lane.last_refusal == lib.LLFT_LANE_R_RANGE
    assert _state(lane) == state
    big = copy.deepcopy(loans[0])
    big.clock = 2 ** 64         # not even a C number: the lane is inert, the loan as given
    inert = native_engine(KEY, MTU)(big)
    assert inert.inert and inert.loan is big and not inert.send(b"x", big.now)


def test_raw_sends_are_the_materialized_bytes(loans):
    """materialize=False: the sealed datagrams as they are, the bytes of the Sends."""
    for loan in loans[:20]:
        a = native_engine(KEY, MTU)(copy.deepcopy(loan))
        b = native_engine(KEY, MTU, materialize=False)(copy.deepcopy(loan))
        data = bytes(range(256)) * (1 + 3 * loan.max_payload_bytes // 256)
        data = data[:min(len(data), 2 * loan.max_payload_bytes)]
        if not a.send(data, loan.now + 1):
            continue
        assert b.send(data, loan.now + 1)
        (raw,) = b.take_actions()
        assert isinstance(raw, SendDatagrams) and raw.dst_group == loan.cid[0]
        assert [d for s in a.take_actions() for d in wire.encode(s.msg, KEY, mtu_bytes=MTU)] \
            == list(raw.datagrams)
        assert a.loan == b.loan
