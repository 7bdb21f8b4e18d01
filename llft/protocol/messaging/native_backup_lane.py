"""A backup's steady lane in C: backup_lane.py's `BackupLane` run by native/lane/llft_backup.c.

`native_backup_engine(key, mtu_bytes)` is a `backup_engine` for `LanedEndpoint` (lane.py):
a class `loan -> NativeBackupLane` bound to the key's codec. A `NativeBackupLane` has
BackupLane's interface, and its state is the C struct (native/lane/llft_backup.h): the
`BackupLoan` is written into it when the lane is made and read back by the `loan`
property (what `LanedEndpoint.reclaim` hands to `MessagingEndpoint.reclaim_backup`).
This module stays thin: it converts the loan to the struct and back, and makes the
actions.

  * `handle_datagram(datagram, now_us)`: the raw path, a remote primary's datagram as
    received (REQUEST/REPLY, KEEP_ALIVE, FIRST_ACK): C verifies and parses it with the
    wire codec's own code and applies BackupLane's rules;
  * `handle_message(msg, now_us)`: BackupLane's event. A message of our own group (our
    primary's HEARTBEAT or direct ORDER_INFO, another backup's HEARTBEAT, ORDER_INFO or
    NACK) goes to C by its header (it reaches the node decoded: membership reads it
    too); a remote one is encoded by the reference `wire.encode` and takes the raw path;
  * `handle_timer`, `set_executed`, `send`, `send_space`: as BackupLane's.

Messages a loan brings (on the held and received lists, in slots) stay Python objects,
named by index in C (`ref`); a message C takes from a datagram is copied there, and
decoded by the reference decoder when the loan is read back. The log's segments are
C's (copied; freed when the log is trimmed): a loan lives long, and what it logs goes.

C refuses some events BackupLane takes (each then goes to the core, which handles it as
it always did: the endpoint behaves the same, only fewer events are the lane's): a data
trailer that lists other connections or is malformed, the remote's NACK and SECOND_ACK, a body `upto` that is not a plain int of 64
bits, a number past 64 bits. A loan it cannot hold -- more than 16 connections or remote
groups, a nack that is not a placeholder's -- makes an *inert* lane: it refuses
every event (`inert` says why; the engine counts them).
"""
from __future__ import annotations

from typing import Any

import msgpack

from llft.protocol import wire
from llft.protocol.messages import (Message, MsgType, Pulse, Role, Send, pulse_lease_us,
                                    pulse_until_us)
from llft.protocol.messaging.actions import Closed, Deliver, DeliverOrderInfo
from llft.protocol.messaging.backup_lane import BackupLane, BackupLoan, HeldConn
from llft.protocol.messaging.config import INTRA_CONN_SEQ
from llft.protocol.messaging.lane import LaneDivergence
from llft.protocol.messaging.native_lane import (NativeLaneBase, _Engine, _Unfit,
                                                native_available)
from llft.protocol.messaging.timers import Timer

try:
    from native._llft_lane import ffi as _ffi, lib as _lib
except ImportError:     # not built
    _ffi = _lib = None

_U64 = (1 << 64) - 1
_ENDPOINT_TIMERS = ((Timer.HEARTBEAT, "LLFT_BK_T_HEARTBEAT"),
                    (Timer.WATERMARK_REPORT, "LLFT_BK_T_WATERMARK_REPORT"),
                    (Timer.ORDER_INFO_ACK, "LLFT_BK_T_ORDER_INFO_ACK"))
_CONN_TIMERS = ((Timer.NACK, "LLFT_BK_CT_NACK"), (Timer.KEEPALIVE, "LLFT_BK_CT_KEEPALIVE"))
_REMOTE_TYPES = frozenset({MsgType.REQUEST, MsgType.REPLY, MsgType.KEEP_ALIVE,
                           MsgType.FIRST_ACK, MsgType.SECOND_ACK})
# scalar fields written as they are (BackupLoan's names = llft_bk_state's)
_SCALARS = ("birth_id", "pvn", "precedence", "primary_id", "clock", "now", "gw", "digest",
            "max_data_ts", "reported_w", "has_backups", "hb_quiet", "oi_delivered",
            "oi_acked", "oi_done_acked", "oi_executed", "oi_pending",
            "watermark_report_us", "order_info_ack_us", "nack_delay_us", "nack_retry_us",
            "keepalive_us", "heartbeat_us", "max_order_info_pending", "window_bytes",
            "max_placeholders", "max_nack_msns", "max_log_bytes", "max_payload_bytes",
            "pulse_intervals")
# HeldConn's fields that C changes, read back as they are
_CONN_FIELDS = ("delivered", "covered", "term", "upto", "ts", "max_data_ts", "fa_count",
                "ka_idle", "log_bytes", "remote_gw", "remote_delivered", "out_offset",
                "next_msn", "fa_msn", "last_back", "last_send_us")


def _check_agreement() -> None:
    """What the C engine hard-codes must be what messages.py says."""
    lib = _lib
    ok = ((lib.LLFT_BK_HEARTBEAT, lib.LLFT_BK_ORDER_INFO, lib.LLFT_BK_NACK)
          == (MsgType.HEARTBEAT, MsgType.ORDER_INFO, MsgType.NACK)
          and all(t < lib.LLFT_BK_C_TYPES for t in _REMOTE_TYPES | {
              MsgType.HEARTBEAT, MsgType.ORDER_INFO, MsgType.NACK})
          and {getattr(lib, f"LLFT_BK_C_{n.upper()}") for n in _COUNTER_NAMES.values()}
          == set(_COUNTER_NAMES) and lib.LLFT_BK_COUNTERS == max(_COUNTER_NAMES) + 1)
    if not ok:
        raise RuntimeError("native._llft_lane's backup lane disagrees with messages.py")


def native_backup_engine(key: bytes, mtu_bytes: int) -> type["NativeBackupLane"]:
    """The factory `loan -> NativeBackupLane` for datagrams sealed with `key`, at most
    `mtu_bytes` long: a NativeBackupLane class whose `engine` is that codec."""
    engine = _Engine(key, mtu_bytes, materialize=True)
    _check_agreement()
    engine.bk_spare = []            # released C lanes (this engine's inert counts its own)
    return type("NativeBackupLane", (NativeBackupLane,), {"engine": engine})


class NativeBackupLane(NativeLaneBase):
    """BackupLane's interface over the C engine (module docstring)."""
    engine: _Engine | None = None
    cid = None
    reclaim_with = "reclaim_backup"
    READS = BackupLane.READS
    candidate = staticmethod(BackupLane.candidate)

    def __init__(self, loan: BackupLoan, engine: _Engine | None = None):
        engine = engine or self.engine
        if engine is None:
            raise TypeError("a NativeBackupLane needs an engine: native_backup_engine(...)")
        self.actions: list[Any] = []
        self.inert: str | None = None
        self.last_refusal = 0
        self.raw_refused = False
        self._eng = engine
        self._loan0 = loan
        self._objs: list[Any] = []          # ref -> a Message the loan brought
        self._cids = [hc.cid for hc in loan.conns]
        self._index = {cid: i for i, cid in enumerate(self._cids)}
        self._decoded: dict[tuple[int, int], Message] = {}
        self._last_hb = loan.last_hb        # our last HEARTBEAT (the adapter's: its body)
        self._hb_body: dict | None = None
        if not self._load_or_inert(loan, engine):
            return
        self._st = _lib.llft_bk_state_of(self._c)
        self._n = _ffi.new("uint32_t *")
        self._at = _ffi.new("int64_t *")
        self._taken = _ffi.new("uint64_t *")

    # ------------------------------------------------------------- BackupLane's API ---
    def read(self, name: str):
        return self._loan0.pvn if name == "pvn" else False

    @staticmethod
    def _next_timer(c, at) -> int:
        return _lib.llft_bk_next_timer(c, at)

    def handle_message(self, msg: Message, now_us: int) -> bool:
        c = self._c
        if c is None:
            return False
        group = self._loan0.group
        if msg.src_group != group:
            if msg.type not in _REMOTE_TYPES:
                return False
            try:
                dgs = wire.encode(msg, self._eng.key, mtu_bytes=self._eng.mtu_bytes)
            except wire.WireError:
                return False
            return len(dgs) == 1 and self.handle_datagram(dgs[0], now_us)
        if msg.dst_group != group:
            return False
        t = msg.type
        upto = msg.body.get("upto") if isinstance(msg.body, dict) else None
        has_upto = type(upto) is int and 0 <= upto <= _U64
        if isinstance(upto, int) and not has_upto and t is MsgType.ORDER_INFO:
            return False            # (a bool or a number past 64 bits: the core's)
        if (t is MsgType.ORDER_INFO and msg.sender == self._loan0.primary_id
                and self._loan0.direct_ack_us):
            return False            # (an ack delayed by order_info_direct_ack_us)
        oi = msg.order_info
        try:
            r = _lib.llft_bk_intra(c, int(t), msg.sender, msg.pvn, msg.ack, msg.back,
                                   msg.ts, oi, len(oi), has_upto,
                                   upto if has_upto else 0, now_us)
        except (OverflowError, TypeError):
            return False
        if r:
            self.last_refusal = r
            return False
        self._take(oi)
        return True

    def handle_datagram(self, datagram: bytes, now_us: int) -> bool:
        """The raw path: a remote group's datagram as received. False: not taken;
        `raw_refused` says whether the lane refused it (else it is one the lane takes
        decoded, or no lane takes: LanedEndpoint offers the decoded message then)."""
        c = self._c
        self.raw_refused = False
        if c is None:
            return False
        try:
            r = _lib.llft_bk_receive(c, datagram, len(datagram), now_us)
        except (OverflowError, TypeError):
            return False
        if r:
            self.last_refusal = r
            self.raw_refused = r != _lib.LLFT_BK_NOT_RAW
            return False
        self._take(datagram)
        return True

    def handle_timer(self, now_us: int, core_next_us: int | None) -> bool:
        c = self._c
        if c is None:
            return False
        st, lib = self._st, _lib
        now = max(now_us, st.now)
        hb = lib.LLFT_BK_T_HEARTBEAT
        same = False
        self._hb_body = None
        if (st.timer_set[hb] and st.timer_at[hb] <= now
                and (core_next_us is None or core_next_us > now)):
            # our HEARTBEAT fires: its body as `_heartbeat` makes it (membership's hooks
            # read now), and whether all but `back` is what the last one said
            L0 = self._loan0
            wait_of, replay_of, rm_of = L0.hooks
            body = self._hb_body = {
                "rank": L0.rank, "served": 0, "lineage": L0.lineage, "change": L0.change,
                "wait": wait_of(), "replay": replay_of(), "rm": rm_of(),
                "done": st.oi_executed}
            last = self._last_hb
            same = (last is not None and last.pvn == L0.pvn
                    and last.precedence == L0.precedence and last.ack == L0.digest
                    and last.order_info == L0.frees and last.body == body)
        try:
            r = lib.llft_bk_timer(c, now_us, core_next_us is not None, core_next_us or 0,
                                  same)
        except OverflowError:
            return False
        if r:
            self.last_refusal = r
            return False
        self._take(b"")
        return True

    def set_executed(self, pos: int, now_us: int | None) -> bool:
        c = self._c
        if c is None:
            return False
        try:
            r = _lib.llft_bk_set_executed(c, min(max(pos, 0), _U64), now_us is not None,
                                          now_us or 0)
        except OverflowError:
            return False
        return r == _lib.LLFT_BK_OK

    def send_space(self, conn) -> int | None:
        i = self._index.get(conn)
        if self._c is None or i is None:
            return None
        return _lib.llft_bk_send_space(self._c, i)

    def send(self, conn, data: bytes, now_us: int | None) -> int | None:
        i = self._index.get(conn)
        c = self._c
        if c is None or i is None:
            return None
        if type(data) is not bytes:
            data = bytes(data)
        try:
            r = _lib.llft_bk_send(c, i, data, len(data), now_us is not None, now_us or 0,
                                  self._taken)
        except OverflowError:
            return None
        if r:
            self.last_refusal = r
            return None
        return self._taken[0]

    def timer_deadlines(self, core) -> dict:
        """The same timers' deadlines in a core (the lockstep check)."""
        out = {}
        for k, _ in _ENDPOINT_TIMERS:
            d = core.timers.due(k)
            if d is not None:
                out[k] = d
        for cid in self._cids:
            for k, _ in _CONN_TIMERS:
                d = core.timers.due(k, cid)
                if d is not None:
                    out[k, cid] = d
        return out

    def loan_timers(self) -> dict:
        """`loan.timers` without reading the whole loan back."""
        if self._c is None:
            return self._loan0.timers
        st, lib, out = self._st, _lib, {}
        for k, name in _ENDPOINT_TIMERS:
            i = getattr(lib, name)
            if st.timer_set[i]:
                out[k] = st.timer_at[i]
        for j, cid in enumerate(self._cids):
            cc = st.conns[j]
            for k, name in _CONN_TIMERS:
                i = getattr(lib, name)
                if cc.timer_set[i]:
                    out[k, cid] = cc.timer_at[i]
        return out

    # ------------------------------------------------------------------- the state ---
    @property
    def loan(self) -> BackupLoan:
        """The loan as the C struct holds it now (for an inert lane, the one given)."""
        if self._c is None:
            return self._loan0
        st, lib, L0 = self._st, _lib, self._loan0
        conns = []
        for i, hc0 in enumerate(L0.conns):
            cc = st.conns[i]
            lists = [[self._message(i, w, j) for j in range(lib.llft_bk_list_len(self._c, i, w))]
                     for w in (0, 1)]
            log = [(g.msn, g.offset, _ffi.unpack(g.data, g.len)) for g in (
                lib.llft_bk_log_at(self._c, i, j) for j in range(lib.llft_bk_log_len(self._c, i)))]
            hc = HeldConn(**{f: getattr(hc0, f) for f in HeldConn.__slots__})
            for f in _CONN_FIELDS:
                setattr(hc, f, getattr(cc, f))
            hc.holding = bool(cc.holding)
            hc.held, hc.received, hc.log = lists[0], lists[1], log
            hc.first_offset = cc.first_offset if cc.has_first_offset else None
            hc.declared = (cc.declared_upto, cc.declared_ts)
            hc.slots, hc.nacks = self._slots(i, cc.upto)
            sec = cc.last_order_info
            hc.last_order_info = (msgpack.unpackb(_ffi.unpack(lib.llft_bk_section(self._c, i),
                                                              sec.len), raw=False)
                                  if sec.has else None)
            conns.append(hc)
        remotes = [st.remotes[r] for r in range(st.nremotes)]
        name = [_ffi.unpack(rm.name, rm.name_len).decode() for rm in remotes]
        heard = {name[r]: rm.heard_us for r, rm in sorted(
            enumerate(remotes), key=lambda x: x[1].heard_order) if rm.heard_set}
        ph = {name[r]: (rm.ph_pvn, rm.ph_sender, rm.ph_us, rm.ph_ts)
              for r, rm in enumerate(remotes) if rm.has_ph}
        ph_set = {name[r]: ph[name[r]] for r, rm in sorted(
            enumerate(remotes), key=lambda x: x[1].ph_order) if rm.ph_set}
        stats = dict(L0.stats)
        for k in range(lib.LLFT_BK_COUNTERS):
            n = st.counters[k]
            if n:
                key = (f"rx_{MsgType(k).name}" if k < lib.LLFT_BK_C_TYPES
                       else _COUNTER_NAMES[k])
                stats[key] = stats.get(key, 0) + n
        return BackupLoan(
            group=L0.group, birth_id=L0.birth_id, pvn=L0.pvn, precedence=L0.precedence,
            primary_id=L0.primary_id, clock=st.clock, now=st.now, gw=st.gw,
            digest=L0.digest, max_data_ts=st.max_data_ts, reported_w=st.reported_w,
            has_backups=L0.has_backups,
            last_heard={**L0.last_heard, **{st.last_heard[i].sender: st.last_heard[i].at_us
                                            for i in range(st.nheard)}},
            backups=L0.backups,
            peer_oi_acks={p.pvn: {p.sender[j]: p.upto[j] for j in range(p.n)}
                          for p in (st.peer[i] for i in range(st.npeer))},
            conns=conns, by_cid={hc.cid: hc for hc in conns}, timers=self.loan_timers(),
            hb_quiet=bool(st.hb_quiet), heard=heard, primary_heard=ph,
            primary_heard_set=ph_set, oi_delivered=st.oi_delivered,
            oi_pending=L0.oi_pending, oi_acked=st.oi_acked, oi_done_acked=st.oi_done_acked,
            oi_executed=st.oi_executed, watermark_report_us=L0.watermark_report_us,
            order_info_ack_us=L0.order_info_ack_us,
            max_order_info_pending=L0.max_order_info_pending, window_bytes=L0.window_bytes,
            max_placeholders=L0.max_placeholders, nack_delay_us=L0.nack_delay_us,
            nack_retry_us=L0.nack_retry_us, max_nack_msns=L0.max_nack_msns,
            keepalive_us=L0.keepalive_us, heartbeat_us=L0.heartbeat_us,
            direct_ack_us=L0.direct_ack_us, max_log_bytes=L0.max_log_bytes,
            max_payload_bytes=L0.max_payload_bytes, rank=L0.rank, lineage=L0.lineage,
            change=L0.change, hooks=L0.hooks, frees=L0.frees, last_hb=self._last_hb,
            pulse_intervals=L0.pulse_intervals, stats=stats)

    def release(self) -> None:
        """The loan went back: the C lane serves the next one."""
        if self._c is not None:
            self._eng.bk_spare.append(self._c)
            self._c = None

    # --------------------------------------------------------------------- helpers ---
    def _take(self, buf: bytes) -> None:
        """The last event's actions, as the model's."""
        acts = _lib.llft_bk_actions(self._c, self._n)
        lib, out = _lib, self.actions
        L0 = self._loan0
        nacks: list[list] = []
        for i in range(self._n[0]):
            a = acts[i]
            k = a.kind
            if k == lib.LLFT_BK_A_DELIVER:
                m = a.msg
                if m.ref != lib.LLFT_BK_NONE:
                    data = self._objs[m.ref].body["data"]
                    if a.len != len(data):
                        data = data[:a.len]
                else:
                    data = _ffi.unpack(m.dg + m.data_at, a.len)
                out.append(Deliver(self._cids[a.conn], m.offset, data))
            elif k == lib.LLFT_BK_A_NACK_ENTRY:
                remote, seq, role = self._cids[a.conn]
                msns = lib.llft_bk_nack_msns(self._c)
                nacks.append([remote, seq, int(role), a.a,
                              *(msns[j] for j in range(a.at, a.at + a.len))])
            elif k == lib.LLFT_BK_A_LOCAL_NACK:
                out.append(Send(L0.group, Message(
                    type=MsgType.NACK, src_group=L0.group, dst_group=L0.group,
                    conn_seq=INTRA_CONN_SEQ, role=Role.CLIENT, pvn=L0.pvn,
                    precedence=L0.precedence, sender=L0.birth_id, ack=0, back=0, ts=a.t,
                    body={"missing": nacks}, order_info=b"")))
                nacks = []
            elif k == lib.LLFT_BK_A_HEARTBEAT:
                msg = self._last_hb
                if not a.b:                         # (quiet: the last one again)
                    msg = self._last_hb = Message(
                        type=MsgType.HEARTBEAT, src_group=L0.group, dst_group=L0.group,
                        conn_seq=INTRA_CONN_SEQ, role=Role.CLIENT, pvn=L0.pvn,
                        precedence=L0.precedence, sender=L0.birth_id, ack=L0.digest,
                        back=a.c, ts=a.t, body=self._hb_body, order_info=L0.frees)
                hb, k = L0.heartbeat_us, L0.pulse_intervals
                out.append(Send(L0.group, msg) if k == 1 else Pulse(
                    L0.group, msg, hb, self._st.now + pulse_until_us(k, hb),
                    pulse_lease_us(hb)))
            elif k == lib.LLFT_BK_A_CLOSED:
                out.append(Closed(self._cids[a.conn], a.a, bool(a.b)))
            elif k == lib.LLFT_BK_A_ORDER_INFO:
                out.append(DeliverOrderInfo(a.a, bytes(buf[a.at:a.at + a.len]), L0.pvn))
            elif k == lib.LLFT_BK_A_REPORT:
                out.append(Send(L0.group, Message(
                    type=MsgType.ORDER_INFO, src_group=L0.group, dst_group=L0.group,
                    conn_seq=INTRA_CONN_SEQ, role=Role.CLIENT, pvn=L0.pvn,
                    precedence=L0.precedence, sender=L0.birth_id, ack=a.d, back=a.c,
                    ts=a.t, body={"upto": a.a, "done": a.b}, order_info=b"")))
            elif k == lib.LLFT_BK_A_SECOND_ACK:
                remote, seq, role = self._cids[a.conn]
                out.append(Send(remote, Message(
                    type=MsgType.SECOND_ACK, src_group=L0.group, dst_group=remote,
                    conn_seq=seq, role=role, pvn=L0.pvn, precedence=L0.precedence,
                    sender=L0.birth_id, msn=0, ack=a.a, back=a.c, ts=a.t, body={},
                    order_info=b"")))
            else:
                raise LaneDivergence(f"native backup lane: unknown action kind {k}")

    def _slots(self, conn: int, upto: int) -> tuple[dict, set]:
        """A connection's slots (msn -> Message, None: a placeholder) and nacks."""
        slots, nacks = {}, set()
        pm, pn = _ffi.new("const llft_bk_msg **"), _ffi.new("int *")
        for msn in range(upto + 1, upto + self._loan0.max_placeholders + 1):
            k = _lib.llft_bk_slot(self._c, conn, msn, pm, pn)
            if k:
                slots[msn] = None if k == 1 else self._as_message(conn, pm[0])
            if pn[0]:
                nacks.add(msn)
        return slots, nacks

    def _message(self, conn: int, which: int, j: int) -> Message:
        return self._as_message(conn, _lib.llft_bk_list_at(self._c, conn, which, j))

    def _as_message(self, conn: int, m) -> Message:
        if m.ref != _lib.LLFT_BK_NONE:
            return self._objs[m.ref]
        key = (conn, m.msn)
        msg = self._decoded.get(key)
        if msg is None:
            dg = _ffi.unpack(m.dg, m.dg_len)
            msg = self._eng.decoder.decode(dg, 0)
            if msg is None:
                raise LaneDivergence(f"native backup lane holds a datagram the decoder "
                                     f"refuses: {dg.hex()}")
            self._decoded[key] = msg
        return msg

    def _add(self, c, m: Message) -> int:
        """A message the loan brings, made in C (its index there; C names it by ref)."""
        body = m.body
        idx = _lib.llft_bk_add_msg(c, m.msn, m.ts, body["offset"], m.pvn, body["flags"],
                                   len(body["data"]), len(self._objs))
        if idx < 0:
            raise MemoryError("llft_bk_add_msg")
        self._objs.append(m)
        return idx

    def _load(self, loan: BackupLoan):
        """The loan, written into a C lane (raises _Unfit, OverflowError, ...)."""
        lib, eng = _lib, self._eng
        if len(loan.conns) > lib.LLFT_BK_MAX_CONNS:
            raise _Unfit("connections")
        if any(not hc.nacks <= {k for k, m in hc.slots.items() if m is None}
               for hc in loan.conns):
            raise _Unfit("nacks")
        if loan.heard or loan.primary_heard_set:
            raise _Unfit("heard while lent")
        if len(loan.peer_oi_acks) >= lib.LLFT_BK_MAX_PEER_PVNS:
            raise _Unfit("peer acks")
        if len(loan.backups) > lib.LLFT_BK_MAX_MEMBERS or len(loan.last_heard) > 0:
            raise _Unfit("members")
        c = eng.bk_spare.pop() if eng.bk_spare else None
        if c is None:
            c = lib.llft_bk_new(eng.codec, eng.mtu_bytes)
            if c == _ffi.NULL:
                raise MemoryError("llft_bk_new")
            c = _ffi.gc(c, lib.llft_bk_free)
        else:
            lib.llft_bk_reset(c)
        st = lib.llft_bk_state_of(c)
        g = loan.group.encode()
        if lib.llft_bk_set_group(c, g, len(g)):
            raise _Unfit("group")
        for name in _SCALARS:
            setattr(st, name, getattr(loan, name))
        st.last_hb_back = loan.last_hb.back if loan.last_hb is not None else 0
        for k, name in _ENDPOINT_TIMERS:
            if k in loan.timers:
                i = getattr(lib, name)
                st.timer_set[i], st.timer_at[i] = 1, loan.timers[k]
        remotes: dict[str, int] = {}
        for hc in loan.conns:
            remotes.setdefault(hc.cid[0], len(remotes))
        if len(remotes) > lib.LLFT_BK_MAX_REMOTES:
            raise _Unfit("remote groups")
        st.nremotes = len(remotes)
        for r, i in remotes.items():
            rm, b = st.remotes[i], r.encode()
            if not 0 < len(b) <= wire.MAX_GROUP_BYTES:
                raise _Unfit("group name")
            _ffi.memmove(rm.name, b, len(b))
            rm.name_len = len(b)
            h = loan.primary_heard.get(r)
            if h is not None:
                rm.has_ph = 1
                rm.ph_pvn, rm.ph_sender, rm.ph_us, rm.ph_ts = h
        st.nbackups = len(loan.backups)
        for i, b in enumerate(sorted(loan.backups)):
            st.backups[i] = b
        st.npeer = len(loan.peer_oi_acks)
        for i, (pvn, acks) in enumerate(loan.peer_oi_acks.items()):
            if len(acks) > lib.LLFT_BK_MAX_MEMBERS:
                raise _Unfit("peer acks")
            p = st.peer[i]
            p.pvn, p.n = pvn, len(acks)
            for j, (s, u) in enumerate(acks.items()):
                p.sender[j], p.upto[j] = s, u
        st.nconns = len(loan.conns)
        for i, hc in enumerate(loan.conns):
            cc = st.conns[i]
            cc.remote, cc.seq, cc.role = remotes[hc.cid[0]], hc.cid[1], int(hc.cid[2])
            for f in ("holding", "known", "sending", "after_change", "resyncing",
                      "throttled", "send_ended"):
                setattr(cc, f, bool(getattr(hc, f)))
            for f in _CONN_FIELDS:
                setattr(cc, f, getattr(hc, f))
            if hc.view_pvn is not None:
                cc.has_view, cc.view_pvn = 1, hc.view_pvn
            if hc.first_offset is not None:
                cc.has_first_offset, cc.first_offset = 1, hc.first_offset
            if hc.end is not None:
                cc.has_end, cc.end, cc.abort = 1, hc.end, bool(hc.abort)
            if hc.last_order_info is not None:
                raw = msgpack.packb(hc.last_order_info, use_bin_type=True)
                if lib.llft_bk_load_section(c, i, raw, len(raw)):
                    raise _Unfit("section")
            cc.declared_upto, cc.declared_ts = hc.declared
            for k, name in _CONN_TIMERS:
                d = loan.timers.get((k, hc.cid))
                if d is not None:
                    j = getattr(lib, name)
                    cc.timer_set[j], cc.timer_at[j] = 1, d
            made: dict[int, int] = {}       # (a message on both lists is one)
            for which, msgs in ((1, hc.received), (0, hc.held)):
                for m in msgs:
                    idx = made.get(id(m))
                    if idx is None:
                        idx = made[id(m)] = self._add(c, m)
                    if lib.llft_bk_push(c, i, which, idx):
                        raise _Unfit("lists")
            for msn, m in hc.slots.items():
                idx = -1 if m is None else self._add(c, m)
                if lib.llft_bk_load_slot(c, i, msn, idx, msn in hc.nacks):
                    raise _Unfit("slots")
            for msn, off, data in hc.log:
                if lib.llft_bk_push_seg(c, i, msn, off, data, len(data)):
                    raise _Unfit("log")
        if lib.llft_bk_check(c):
            raise _Unfit("state")
        return c


_COUNTER_NAMES = {16: "dup_data", 17: "oi_via_reflection", 18: "oi_via_intra",
                  19: "dup_bytes", 20: "after_end", 21: "stream_ends", 22: "nack_msns"}

__all__ = ["NativeBackupLane", "native_backup_engine", "native_available"]
