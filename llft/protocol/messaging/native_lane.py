"""A steady lane in C: lane.py's `SteadyLane` run by native/lane/ on raw datagrams.

`native_engine(key, mtu_bytes)` is an `engine` for `LanedEndpoint` (lane.py): a factory
`loan -> NativeLane` (a NativeLane class bound to the key's codec, so that, like
SteadyLane, the engine is a class with the lane's methods: `LanedEndpoint` sees
`handle_datagram` on it). A `NativeLane` has SteadyLane's interface, and its state is the C
struct (native/lane/llft_lane.h): the loan is written into it when the lane is made and
read back from it by the `loan` property (what `LanedEndpoint.reclaim` hands to the core).
This module stays thin: it converts a Loan to the struct and back, and makes the actions.

  * `handle_datagram(datagram, now_us)`: the raw path, a datagram as received. C verifies
    and parses it with the wire codec's own code, checks SteadyLane.handle_message's
    conditions and applies its rules; the action is `Deliver(cid, offset, data)`, data a
    slice of the datagram;
  * `handle_message(msg, now_us)`: SteadyLane's event: `msg` encoded by the reference
    `wire.encode` (key and MTU of the engine), then the raw path (False if it fragments);
  * `send(data, now_us)`: C builds and seals each data message. With `materialize` the
    action is `Send(dst_group, msg)`, msg the reference Decoder's reading of the C bytes,
    and `wire.encode(msg)` must give exactly those bytes (else LaneDivergence): this is
    how the simulator, whose kernel encodes every Send again, proves the bytes identical.
    Without it, `SendDatagrams(dst_group, datagrams)` carries the sealed bytes for a
    driver to send as they are.

A loan C cannot hold -- a sent message that took more than one datagram, a window over
LLFT_LANE_MAX_WINDOW, a number past its C type (llft_lane.h) -- makes an *inert* lane: it
refuses every event, so the owner takes the loan back, untouched, at the first one.
`NativeLane.inert` says why, and the engine counts them (`engine.engine.inert`).

Where C refuses what SteadyLane takes (each then goes to the core, which handles it as it
always did, so the endpoint's behaviour is the same; only fewer events are the lane's):
a datagram over the MTU, a message of another wire version, and a number past 64 bits
(a clock, msn, stream offset or order-info position one step from 2^64, a time beyond
2^61 us).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgpack

from llft.protocol import wire
from llft.protocol.messages import BODY_FIELDS, WIRE_VERSION, Message, MsgType, ROLES, Role, Send
from llft.protocol.messaging.actions import Deliver
from llft.protocol.messaging.lane import LaneDivergence, Loan
from llft.protocol.messaging.timers import CONNECTION_TIMERS

try:
    from native._llft_lane import ffi as _ffi, lib as _lib
except ImportError:     # not built
    _ffi = _lib = None

_MASK64 = (1 << 64) - 1
_TIMER_INDEX = {t: i for i, t in enumerate(CONNECTION_TIMERS)}


def native_available() -> bool:
    return _lib is not None


try:    # the drivers' vocabulary has it (llft/runtime/driver.py sends it as it is)
    from llft.protocol.messages import SendDatagrams
except ImportError:
    @dataclass(frozen=True, slots=True)
    class SendDatagrams:        # type: ignore[no-redef]
        """Send these sealed datagrams, as they are, to `dst_group` (a `Send` already
        encoded: the data messages of one `send`)."""
        dst_group: str
        datagrams: list


class _Unfit(Exception):
    """A loan the C struct cannot hold (the lane is inert)."""


def _check_agreement() -> None:
    """What the C engine hard-codes must be what wire.py and messages.py say."""
    lib = _lib
    body = [(k, v) for k, v in BODY_FIELDS[MsgType.REQUEST].items()]
    problems = [
        name for name, ok in (
            ("wire version", lib.LLFT_LANE_WIRE_VERSION == WIRE_VERSION
             and wire.SUPPORTED_VERSIONS == frozenset({WIRE_VERSION})),
            ("types", (lib.LLFT_LANE_REQUEST, lib.LLFT_LANE_REPLY, lib.LLFT_LANE_FIRST_ACK,
                       lib.LLFT_LANE_SECOND_ACK, lib.LLFT_LANE_KEEP_ALIVE)
             == (MsgType.REQUEST, MsgType.REPLY, MsgType.FIRST_ACK, MsgType.SECOND_ACK,
                 MsgType.KEEP_ALIVE)),
            ("control bodies", all(BODY_FIELDS[t] == {} for t in (
                MsgType.FIRST_ACK, MsgType.SECOND_ACK, MsgType.KEEP_ALIVE))),
            ("data body", body == [("offset", int), ("data", bytes), ("flags", int)]
             and BODY_FIELDS[MsgType.REPLY] == BODY_FIELDS[MsgType.REQUEST]),
            ("header", lib.LLFT_LANE_HEADER_BYTES == wire.HEADER_BYTES
             and lib.LLFT_LANE_MAX_GROUP_BYTES == wire.MAX_GROUP_BYTES),
            ("timers", lib.LLFT_LANE_TIMERS == len(CONNECTION_TIMERS) and all(
                CONNECTION_TIMERS[getattr(lib, f"LLFT_LANE_T_{t}")].name == t
                for t in ("RETRANSMIT", "FIRST_ACK", "KEEPALIVE"))))
        if not ok]
    if problems:
        raise RuntimeError(f"native._llft_lane disagrees with the Python model: {problems}")


class _Engine:
    """The key's codec (its HMAC pads) and what the lanes of one `native_engine` share:
    how they read and check their bytes, and what they count."""

    def __init__(self, key: bytes, mtu_bytes: int, materialize: bool):
        if _lib is None:
            raise RuntimeError("native._llft_lane is not built (run scripts/setup.sh)")
        _check_agreement()
        if type(key) is not bytes or len(key) != wire.KEY_BYTES:
            raise ValueError(f"a cluster key is {wire.KEY_BYTES} bytes")
        if not wire.MIN_MTU_BYTES <= mtu_bytes <= wire.MAX_DATAGRAM_BYTES:
            raise ValueError(f"mtu_bytes must be in [{wire.MIN_MTU_BYTES}, "
                             f"{wire.MAX_DATAGRAM_BYTES}]")
        self.key, self.mtu_bytes, self.materialize = key, mtu_bytes, materialize
        codec = _lib.llft_lane_codec_new(key, len(key))
        if codec == _ffi.NULL:
            raise MemoryError("llft_lane_codec_new")
        self.codec = _ffi.gc(codec, _lib.llft_lane_codec_free)
        self.decoder = wire.Decoder(key, None)      # the C bytes, read by the reference
        # A sent message is the same bytes and the same Message at every loan until it
        # leaves the sent list: (pvn, msn, ts) -> sealed datagram, and -> Message, so
        # a loan does not seal again (HMAC) what the last lane sent or held, nor a
        # reclaim decode it again. (Without them a loan cost ~300 us of Python.)
        self.sealed: dict[tuple[int, int, int], bytes] = {}
        self.messages: dict[tuple[int, int, int], Message] = {}
        self.loans = 0
        self.inert: Counter[str] = Counter()        # loans C could not hold, by reason
        self.spare: dict[int, Any] = {}             # window -> a released C lane

    def lane(self, window: int):
        """A C lane for a loan of `window`: a released one emptied, or a new one."""
        c = self.spare.pop(window, None)
        if c is not None:
            _lib.llft_lane_reset(c)
            return c
        c = _lib.llft_lane_new(self.codec, self.mtu_bytes, window)
        if c == _ffi.NULL:
            raise MemoryError("llft_lane_new")
        return _ffi.gc(c, _lib.llft_lane_free)

    def forget_before(self, pvn: int, msn: int) -> None:
        """Messages below `msn` of view `pvn` (or of earlier views) left the sent list:
        out of the memos (pruned once they hold more than MEMO_SLACK)."""
        for memo in (self.sealed, self.messages):
            if len(memo) > MEMO_SLACK:
                for k in [k for k in memo if k[0] < pvn or k[1] < msn]:
                    del memo[k]


MEMO_SLACK = 128        # a window (32) and more: pruning is a walk of the memo


def native_engine(key: bytes, mtu_bytes: int, *,
                  materialize: bool = True) -> type["NativeLane"]:
    """The factory `loan -> NativeLane` for datagrams sealed with `key`, at most
    `mtu_bytes` long (the senders' Encoder MTU: a bigger message is fragmented, which a
    lane leaves to the core): a NativeLane class whose `engine` is that codec."""
    return type("NativeLane", (NativeLane,),
                {"engine": _Engine(key, mtu_bytes, materialize)})


class NativeLaneBase:
    """What the adapters of the C lanes share (this one's, native_backup_lane's): the
    actions emitted since last taken, the earliest deadline the loan carries (an inert
    lane's: the loan it was given)."""
    actions: list

    def take_actions(self) -> list[Any]:
        a, self.actions = self.actions, []
        return a

    def next_timer_us(self) -> int | None:
        if self._c is None:
            t = self._loan0.timers
            return min(t.values()) if t else None
        return self._at[0] if self._next_timer(self._c, self._at) else None

    @staticmethod
    def _next_timer(c, at) -> int:
        return _lib.llft_lane_next_timer(c, at)

    def _load_or_inert(self, loan, engine) -> bool:
        """The loan written into a C lane (`_load`); False if C cannot hold it: the lane
        is inert (`inert` says why, the engine counts it) and refuses every event."""
        try:
            self._c = self._load(loan)
            return True
        except (_Unfit, OverflowError, TypeError, ValueError, KeyError) as e:
            self.inert = str(e) if isinstance(e, _Unfit) else f"{type(e).__name__}: {e}"
            engine.inert[str(e) if isinstance(e, _Unfit) else type(e).__name__] += 1
            self._c = None
            return False


class NativeLane(NativeLaneBase):
    """SteadyLane's interface over the C engine (module docstring). Made by the class
    `native_engine` returns (its `engine`), or given one."""
    engine: _Engine | None = None

    def __init__(self, loan: Loan, engine: _Engine | None = None):
        engine = engine or self.engine
        if engine is None:
            raise TypeError("a NativeLane needs an engine: native_engine(key, mtu)(loan)")
        self.actions: list[Any] = []
        self.inert: str | None = None       # why C does not hold this loan (None: it does)
        self.last_refusal = 0               # the C result of the last refused event
        self._eng = engine
        self._loan0 = loan
        self._cid = self.cid = loan.cid
        self._remote = loan.cid[0]
        self._msgs: dict[int, Message] = {}     # msn -> the message read from C's bytes
        engine.loans += 1
        if not self._load_or_inert(loan, engine):
            return
        self._st = _lib.llft_lane_state_of(self._c)
        self._rx = _ffi.new("llft_lane_rx *")
        self._n = _ffi.new("uint32_t *")
        self._at = _ffi.new("int64_t *")

    # ------------------------------------------------------------- SteadyLane's API ---
    def in_flight(self) -> int:
        """Messages sent and not covered yet (SteadyLane.in_flight; no Loan built)."""
        return len(self._loan0.sent) if self._c is None else self._st.sent_count

    def handle_message(self, msg: Message, now_us: int) -> bool:
        if self._c is None:
            return False
        try:
            dgs = wire.encode(msg, self._eng.key, mtu_bytes=self._eng.mtu_bytes)
        except wire.WireError:
            return False
        return len(dgs) == 1 and self.handle_datagram(dgs[0], now_us)

    def handle_datagram(self, datagram: bytes, now_us: int) -> bool:
        """The raw path: `datagram` as received (bytes)."""
        c = self._c
        if c is None:
            return False
        try:
            r = _lib.llft_lane_receive(c, datagram, len(datagram), now_us, self._rx)
        except (OverflowError, TypeError):      # a time past int64, or not bytes
            return False
        if r:
            self.last_refusal = r
            return False
        rx = self._rx
        if rx.kind == _lib.LLFT_LANE_RX_DATA:
            at = rx.data_at
            self.actions.append(Deliver(self._cid, rx.offset, datagram[at:at + rx.data_len]))
        elif rx.ctl_len:                    # the SECOND_ACK a FIRST_ACK drew
            dg = _ffi.unpack(_lib.llft_lane_control(c), rx.ctl_len)
            if not self._eng.materialize:
                self.actions.append(SendDatagrams(self._remote, [dg]))
                return True
            msg = self._read(dg)
            mine = wire.encode(msg, self._eng.key, mtu_bytes=self._eng.mtu_bytes)
            if mine != [dg]:
                raise LaneDivergence(f"receive: C sealed {dg.hex()}, wire.encode of its "
                                     f"message gives {[d.hex() for d in mine]}")
            self.actions.append(Send(self._remote, msg))
        return True

    def send(self, data: bytes, now_us: int | None) -> bool:
        c = self._c
        if c is None:
            return False
        if type(data) is not bytes:
            data = bytes(data)
        try:
            r = _lib.llft_lane_send(c, data, len(data), now_us is not None, now_us or 0,
                                    self._n)
        except OverflowError:
            return False
        if r:
            self.last_refusal = r
            return False
        end = self._st.sent_count
        dgs = [self._datagram(i) for i in range(end - self._n[0], end)]
        if not self._eng.materialize:
            sealed = self._eng.sealed
            for i, dg in zip(range(end - self._n[0], end), dgs):
                slot = _lib.llft_lane_slot_at(self._c, i)
                sealed[(self._pvn, slot.msn, slot.ts)] = dg
            self.actions.append(SendDatagrams(self._remote, dgs))
            return True
        if len(self._msgs) > 2 * self._st.window_msgs:
            self._prune()
        for dg in dgs:
            msg = self._read(dg)
            mine = wire.encode(msg, self._eng.key, mtu_bytes=self._eng.mtu_bytes)
            if mine != [dg]:
                raise LaneDivergence(f"send: C sealed {dg.hex()}, wire.encode of its "
                                     f"message gives {[d.hex() for d in mine]}")
            self._msgs[msg.msn] = msg
            self.actions.append(Send(self._remote, msg))
        return True

    # ------------------------------------------------------------------- the state ---
    @property
    def loan(self) -> Loan:
        """The loan as the C struct holds it now (a new Loan at each read; for an inert
        lane, the loan it was given)."""
        if self._c is None:
            return self._loan0
        st, lib = self._st, _lib
        sent, sent_at = [], {}
        known = self._eng.messages
        for i in range(st.sent_count):
            slot = lib.llft_lane_slot_at(self._c, i)
            m = self._msgs.get(slot.msn)
            if m is None:
                m = known.get((self._pvn, slot.msn, slot.ts))
                if m is None:
                    m = self._read(self._datagram(i))
                    known[(m.pvn, m.msn, m.ts)] = m
                self._msgs[slot.msn] = m
            sent.append(m)
            if slot.has_sent_at:
                sent_at[slot.msn] = slot.sent_at
        self._eng.forget_before(self._pvn, sent[0].msn if sent else st.next_msn)
        if len(self._msgs) > len(sent):
            self._prune()
        timers = {t: st.timer_at[i] for i, t in enumerate(CONNECTION_TIMERS)
                  if st.timer_set[i]}
        stats = dict(self._stats)
        if st.has_rx:
            stats[self._rx_key] = st.rx
        for key, name in _COUNTERS:
            if getattr(st, "has_" + name):
                stats[key] = getattr(st, name)
        return Loan(
            group=self._loan0.group, birth_id=st.birth_id, pvn=st.pvn,
            precedence=st.precedence, clock=st.clock, now=st.now, gw=st.gw,
            gw_rose=bool(st.gw_rose), max_data_ts=st.max_data_ts, served_pvn=st.served_pvn,
            told_us=st.told_us if st.has_told_us else None,
            reflected=((_get_int(st.reflected_pvn), _get_int(st.reflected_pos))
                       if st.has_reflected else None),
            heard=st.heard if st.has_heard else None,
            primary_heard=((st.primary_heard_pvn, st.primary_heard_sender,
                            st.primary_heard_us, st.primary_heard_ts)
                           if st.has_primary_heard else None),
            primary_heard_set=bool(st.primary_heard_set),
            cid=self._cid, role=ROLES[st.role], out_offset=st.out_offset,
            next_msn=st.next_msn, sent=sent, sent_bytes=st.sent_bytes, sent_at=sent_at,
            remote_ack=st.remote_ack,
            rto=(st.srtt if st.has_srtt else None, st.rttvar, st.backoff, st.rto),
            rto_bounds=(st.rto_floor, st.rto_ceiling), fa_count=st.fa_count,
            fa_msn=st.fa_msn, last_send_us=st.last_send_us, last_back=st.last_back,
            ka_urgent=bool(st.ka_urgent), first_ts=st.first_ts, ka_idle=st.ka_idle,
            view_pvn=st.view_pvn, upto=st.upto, view_ts=st.view_ts,
            first_offset=st.first_offset if st.has_first_offset else None,
            delivered=st.delivered, declared=(st.declared_upto, st.declared_ts),
            recv_max_data_ts=st.recv_max_data_ts, fa_pending=st.fa_pending,
            fa_tries=st.fa_tries, told_delivered=st.told_delivered, remote_gw=st.remote_gw,
            remote_delivered=st.remote_delivered,
            to_reflect=self._section(lib.LLFT_LANE_TO_REFLECT, st.to_reflect),
            last_order_info=self._section(lib.LLFT_LANE_LAST_ORDER_INFO,
                                          st.last_order_info),
            timers=timers, first_ack_delay_us=st.first_ack_delay_us,
            keepalive_us=st.keepalive_us, max_payload_bytes=st.max_payload_bytes,
            window_msgs=st.window_msgs, max_queue_bytes=st.max_queue_bytes, stats=stats)

    def release(self) -> None:
        """The loan went back (`LanedEndpoint.reclaim` read `loan` first): the C lane
        goes to the engine for the next one, and this lane refuses everything."""
        if self._c is not None:
            self._eng.spare[self._st.window_msgs] = self._c
            self._c = None

    def _datagram(self, i: int) -> bytes:
        lib = _lib
        return _ffi.unpack(lib.llft_lane_datagram(self._c, i),
                           lib.llft_lane_slot_at(self._c, i).dg_len)

    def _read(self, dg: bytes) -> Message:
        msg = self._eng.decoder.decode(dg, 0)
        if msg is None:
            raise LaneDivergence(f"C holds a datagram the decoder refuses: {dg.hex()} "
                                 f"{dict(self._eng.decoder.rejections)}")
        return msg

    def _prune(self) -> None:
        """Forget messages no longer on the sent list (msns only grow)."""
        first = _lib.llft_lane_slot_at(self._c, 0)
        lo = first.msn if first != _ffi.NULL else self._st.next_msn
        self._msgs = {k: m for k, m in self._msgs.items() if k >= lo}

    def _section(self, which: int, sec) -> list | None:
        if not sec.has:
            return None
        raw = _ffi.unpack(_lib.llft_lane_section_bytes(self._c, which), sec.len)
        return msgpack.unpackb(raw, raw=False, use_list=True)

    def _load(self, loan: Loan):
        """The loan, written into a new C lane (raises _Unfit, OverflowError, ...)."""
        lib, eng = _lib, self._eng
        if not 1 <= loan.window_msgs <= lib.LLFT_LANE_MAX_WINDOW:
            raise _Unfit("window")
        c = eng.lane(loan.window_msgs)
        st = lib.llft_lane_state_of(c)
        remote, seq, cid_role = loan.cid
        g, r = loan.group.encode(), remote.encode()
        if lib.llft_lane_set_groups(c, g, len(g), r, len(r)):
            raise _Unfit("group")
        for name in ("birth_id", "pvn", "precedence", "clock", "now", "gw", "gw_rose",
                     "max_data_ts", "served_pvn", "primary_heard_set", "out_offset",
                     "next_msn", "sent_bytes", "remote_ack", "fa_count", "fa_msn",
                     "last_send_us", "last_back", "ka_urgent", "first_ts", "ka_idle",
                     "view_pvn", "upto", "view_ts", "delivered", "recv_max_data_ts",
                     "fa_pending", "fa_tries", "told_delivered", "remote_gw",
                     "remote_delivered", "first_ack_delay_us", "keepalive_us",
                     "max_payload_bytes", "window_msgs", "max_queue_bytes"):
            setattr(st, name, getattr(loan, name))
        for name in ("told_us", "heard", "first_offset"):
            v = getattr(loan, name)
            if v is not None:
                setattr(st, "has_" + name, 1)
                setattr(st, name, v)
        if loan.reflected is not None:
            st.has_reflected = 1
            _set_int(st.reflected_pvn, loan.reflected[0])
            _set_int(st.reflected_pos, loan.reflected[1])
        if loan.primary_heard is not None:
            st.has_primary_heard = 1
            (st.primary_heard_pvn, st.primary_heard_sender, st.primary_heard_us,
             st.primary_heard_ts) = loan.primary_heard
        st.seq, st.cid_role, st.role = seq, int(cid_role), int(loan.role)
        srtt, st.rttvar, st.backoff, st.rto = loan.rto
        if srtt is not None:
            st.has_srtt, st.srtt = 1, srtt
        st.rto_floor, st.rto_ceiling = loan.rto_bounds
        st.declared_upto, st.declared_ts = loan.declared
        for kind, at in loan.timers.items():
            k = _TIMER_INDEX[kind]
            st.timer_set[k], st.timer_at[k] = 1, at
        self._rx_key = "rx_" + (MsgType.REPLY if cid_role is Role.CLIENT
                                else MsgType.REQUEST).name
        own = {self._rx_key} | {key for key, _ in _COUNTERS}
        self._stats = {k: n for k, n in loan.stats.items() if k not in own}
        if self._rx_key in loan.stats:
            st.has_rx, st.rx = 1, loan.stats[self._rx_key]
        for key, name in _COUNTERS:
            if key in loan.stats:
                setattr(st, "has_" + name, 1)
                setattr(st, name, loan.stats[key])
        # the sent list, as the sealed datagrams the core's messages are on the wire
        if not set(loan.sent_at) <= {m.msn for m in loan.sent}:
            raise _Unfit("sent_at of a message not on the sent list")
        sealed = eng.sealed
        for m in loan.sent:
            key = (m.pvn, m.msn, m.ts)
            dg = sealed.get(key)
            if dg is None:
                dgs = wire.encode(m, eng.key, mtu_bytes=eng.mtu_bytes)
                if len(dgs) != 1:
                    raise _Unfit("a sent message over the MTU")
                dg = sealed[key] = dgs[0]
                eng.messages[key] = m
            at = loan.sent_at.get(m.msn)
            if lib.llft_lane_load_sent(c, dg, len(dg), at is not None, at or 0):
                raise _Unfit("sent list")
        self._pvn = loan.pvn
        for which, sec in ((lib.LLFT_LANE_TO_REFLECT, loan.to_reflect),
                           (lib.LLFT_LANE_LAST_ORDER_INFO, loan.last_order_info)):
            if sec is not None:
                raw = msgpack.packb(sec, use_bin_type=True)
                if lib.llft_lane_load_section(c, which, raw, len(raw)):
                    raise _Unfit("section")
        if lib.llft_lane_check(c):
            raise _Unfit("state")
        return c


# the other stats a lane counts: (Loan.stats key, C state field)
_COUNTERS = (("rx_KEEP_ALIVE", "rx_keep_alive"), ("rx_FIRST_ACK", "rx_first_ack"),
             ("dup_data", "dup_data"))


def _set_int(field, v: int) -> None:
    field.lo, field.hi = v & _MASK64, v >> 64       # (hi past int64: OverflowError)


def _get_int(field) -> int:
    return (field.hi << 64) | field.lo
