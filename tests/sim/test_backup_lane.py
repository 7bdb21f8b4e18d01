"""The backups' steady lane (llft/protocol/messaging/backup_lane.py: rules 1 and 2 of
docs/BACKUP_LANE.md, a remote primary's data message and a gw rise) in lockstep with
the core: every backup of `llft simulate messaging` (`set lanes`) lends its steady state
for its primary's HEARTBEAT and for the remote primaries' REQUESTs and REPLYs, each
event the lane takes is checked against a copy of the core (actions, timers, and the
whole endpoint state at each reclaim), and one-rule mutants are caught."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from llft.protocol.messages import ROLES, MsgType, Send
from llft.protocol.messaging import MessagingEndpoint
from llft.protocol.messaging.actions import DeliverOrderInfo
from llft.protocol.messaging.backup_lane import BackupLane
from llft.protocol.messaging.lane import LanedEndpoint, LaneDivergence
from llft.protocol.messaging.timers import Timer
from llft.sim import messaging_check as mc

FAULTS = dict(loss=0.05, dup=0.02, reorder=0.05)


def _run(seeds, first_only=False, **faults) -> tuple[list[str], Counter]:
    """(violations, counts) over the default schedules of `seeds`: the backup lanes'
    events, loans, data messages, heartbeats, control messages (by type) and timer
    firings taken, their timers (by kind), the messages they sent (by type: "sent
    SECOND_ACK"...), Deliver/Closed actions, the app's sends logged ("sends", "logged
    bytes") and the send_space answers ("space"). `first_only`: stop after the first schedule
    with a violation (a mutant's run)."""
    n = Counter()
    deliver, data, heartbeat = BackupLane._deliver, BackupLane._data, \
        BackupLane._heartbeat
    handle_message, handle_timer = BackupLane.handle_message, BackupLane.handle_timer
    send, send_space = BackupLane.send, BackupLane.send_space

    def delivered(self, hc, offset, data):
        k = len(self.actions)
        deliver(self, hc, offset, data)
        n["delivered"] += len(self.actions) - k

    def took(real, key):
        def f(self, msg, now_us):
            ok = real(self, msg, now_us)
            n[key] += ok
            return ok
        return f

    def sent(self, since):
        for a in self.actions[since:]:
            if isinstance(a, Send):
                n["sent " + a.msg.type.name] += 1

    def message(self, msg, now_us):
        k = len(self.actions)
        ok = handle_message(self, msg, now_us)
        if ok:
            if msg.src_group == self.loan.group and msg.sender != self.loan.primary_id:
                n["peer " + msg.type.name] += 1
            elif msg.type in CONTROL or msg.type is MsgType.ORDER_INFO:
                n[msg.type.name] += 1
            sent(self, k)
        return ok

    def timer(self, now_us, core_next_us):
        k = len(self.actions)
        due = {(x if isinstance(x, Timer) else x[0]).name
               for x, d in self.loan.timers.items() if d <= max(now_us, self.loan.now)}
        ok = handle_timer(self, now_us, core_next_us)
        if ok:
            n["timers"] += 1
            n.update("timer " + x for x in due)
            sent(self, k)
        return ok
    def logged(self, conn, data, now_us):
        k = send(self, conn, data, now_us)
        if k is not None:
            n["sends"] += 1
            n["logged bytes"] += k
        return k

    def space(self, conn):
        k = send_space(self, conn)
        n["space"] += k is not None
        return k
    violations = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mc, "BACKUP_SHADOW_EVERY", 1)        # every loan in lockstep here
        mp.setattr(BackupLane, "_deliver", delivered)
        mp.setattr(BackupLane, "_data", took(data, "data"))
        mp.setattr(BackupLane, "_heartbeat", took(heartbeat, "heartbeats"))
        mp.setattr(BackupLane, "handle_message", message)
        mp.setattr(BackupLane, "handle_timer", timer)
        mp.setattr(BackupLane, "send", logged)
        mp.setattr(BackupLane, "send_space", space)
        for seed in seeds:
            s = mc.Schedule(mc.generate(seed, **faults))
            try:
                violations += s.run()
            except LaneDivergence as e:
                violations.append(f"seed {seed}: {e}")
            for rep in s.by_node.values():
                if isinstance(rep.core, LanedEndpoint):
                    n["events"] += rep.core.backup_events
                    n["loans"] += rep.core.backup_loans
            if first_only and violations:
                break
    return violations, n


CONTROL = frozenset({MsgType.KEEP_ALIVE, MsgType.FIRST_ACK, MsgType.SECOND_ACK,
                     MsgType.NACK})
PEER = ("peer HEARTBEAT", "peer ORDER_INFO", "peer NACK")


def test_backup_lanes_match_the_core_under_faults():
    violations, n = _run(range(30), **FAULTS)
    assert violations == []
    # the lanes took data messages and heartbeats and released held data themselves
    # (not only gave the loan back); seen: 2518 data messages and 1199 heartbeats (with
    # the repeated ones, `heard_again`) in 1635 loans, 1878 Deliver/Closed actions
    assert n["data"] >= 1000 and n["heartbeats"] >= 100 and n["loans"] > 0
    assert n["delivered"] >= 200
    # ... and the remote primaries' KEEP_ALIVEs and FIRST_ACKs, the remote backups'
    # SECOND_ACKs, answering FIRST_ACKs (seen: 477, 656, 670, 473 SECOND_ACKs sent), and
    # their timers: the report (WATERMARK_REPORT 339, ORDER_INFO_ACK 56), the local NACK
    # (509 firings, 200 sent), the KEEPALIVE a SECOND_ACK armed (55) -- 959 firings
    assert n["KEEP_ALIVE"] >= 100 and n["FIRST_ACK"] >= 100 and n["SECOND_ACK"] >= 100
    assert n["sent SECOND_ACK"] >= 100
    assert n["timer WATERMARK_REPORT"] >= 50 and n["timer ORDER_INFO_ACK"] > 0
    assert n["sent ORDER_INFO"] >= 50
    assert n["timer NACK"] >= 50 and n["sent NACK"] > 0 and n["timer KEEPALIVE"] > 0
    # the remote primaries' NACKs, the other backups' HEARTBEATs, reports and local
    # NACKs (seen: 347, 880, 504, 139)
    assert n["NACK"] >= 100 and n["peer HEARTBEAT"] >= 100
    assert n["peer ORDER_INFO"] >= 100 and n["peer NACK"] > 0
    # our primary's direct ORDER_INFO, reported at once (seen: 414; 809 reports sent in
    # all, at these and at the timers)
    assert n["ORDER_INFO"] >= 100
    # the app's output, logged (rule 5; seen: 588 sends, 844,111 bytes)
    assert n["sends"] >= 100 and n["logged bytes"] >= 10_000
    assert n["events"] == (n["data"] + n["heartbeats"] + n["KEEP_ALIVE"]
                           + n["FIRST_ACK"] + n["SECOND_ACK"] + n["NACK"] + n["timers"]
                           + n["ORDER_INFO"] + n["sends"]
                           + sum(n[k] for k in PEER))


def test_backup_lanes_match_the_core_across_changes_of_primary():
    violations, n = _run(range(100, 120), loss=0.1, failover=0.5, die=0.2)
    assert violations == []
    assert n["data"] >= 300 and n["heartbeats"] >= 50     # (seen: 1836, 295)
    # (seen: 359 FIRST_ACKs, 493 KEEP_ALIVEs, 293 SECOND_ACKs, 637 timer firings)
    assert n["FIRST_ACK"] + n["KEEP_ALIVE"] + n["SECOND_ACK"] >= 100 and n["timers"] >= 100


def test_the_campaign_wraps_backups():
    """`set lanes` (on by default) gives every replica, backups too, a backup lane."""
    s = mc.Schedule(mc.generate(3))
    assert all(isinstance(rep.core, LanedEndpoint)
               and rep.core.backup_engine is BackupLane for rep in s.by_node.values())


def _mutant_run(monkeypatch, name, fn, seeds=range(30)) -> list[str]:
    """The violations of the faulty schedules up to the first that has one."""
    monkeypatch.setattr(BackupLane, name, fn)
    violations, _ = _run(seeds, first_only=True, **FAULTS)
    return violations


def test_lockstep_catches_a_lane_that_keeps_one_held_message(monkeypatch,
                                                            release_all_but_last):
    """A lane that releases all but the last message a rise covers (on one connection)
    is caught at the heartbeat itself: its Deliver actions differ."""
    v = _mutant_run(monkeypatch, "_release_all_held", release_all_but_last)
    assert any("handle_message: lane actions" in x for x in v)


@pytest.mark.parametrize("field", ["gw", "clock"])
def test_lockstep_catches_a_lane_that_keeps_a_field_back(monkeypatch, field):
    """A lane that releases what `back` covers but leaves gw where it was, or does not
    take the heartbeat's Lamport timestamp into our clock, is caught when the loan comes
    back. (The WATERMARK_REPORT a heartbeat's `_after_event` may arm is modelled too,
    but it is never news: a heartbeat changes none of what arms it, and the event
    before it ran `_after_event` too. A data message's is: below.)"""
    real = BackupLane.handle_message

    def keeps(self, msg, now_us):
        before = getattr(self.loan, field)
        took = real(self, msg, now_us)
        if took:
            setattr(self.loan, field, before)
        return took
    v = _mutant_run(monkeypatch, "handle_message", keeps)
    assert any("state after reclaim" in x and f".{field}" in x for x in v)


def test_lockstep_catches_a_reclaim_that_drops_covered(monkeypatch):
    """`reclaim_backup` must write back every field of a backup loan: one that keeps
    the core's old `covered` (what the received lists' collection raised) is caught."""
    real = MessagingEndpoint.reclaim_backup

    def drops_covered(self, loan):
        before = {hc.cid: self.conns[hc.cid].recv.covered for hc in loan.conns}
        real(self, loan)
        for cid, cov in before.items():
            self.conns[cid].recv.covered = cov
    monkeypatch.setattr(MessagingEndpoint, "reclaim_backup", drops_covered)
    violations, _ = _run(range(30), first_only=True, **FAULTS)
    assert any("covered" in x for x in violations)


# ---- rule 1: a remote primary's data message ----

@pytest.mark.parametrize("field,on_conn,where", [
    ("upto", True, "ReceiveSequence.upto"),         # the receive counter not advanced
    ("ts", True, "ReceiveSequence.ts"),             # recv_ts not raised
    ("max_data_ts", False, ".max_data_ts")])        # the endpoint's not raised
def test_lockstep_catches_a_data_message_that_keeps_a_field_back(monkeypatch, field,
                                                                  on_conn, where):
    real = BackupLane._rx_data

    def keeps(self, hc, msg, take):
        obj = hc if on_conn else self.loan
        before = getattr(obj, field)
        real(self, hc, msg, take)
        setattr(obj, field, before)
    v = _mutant_run(monkeypatch, "_rx_data", keeps)
    assert any("state after reclaim" in x and where in x for x in v)


def test_lockstep_catches_a_message_not_pushed_on_the_held_list(monkeypatch):
    real = BackupLane._rx_data

    def drops(self, hc, msg, take):
        real(self, hc, msg, take)
        if take and hc.held and hc.held[-1] is take[-1]:
            hc.held.pop()
    v = _mutant_run(monkeypatch, "_rx_data", drops)
    assert any("held" in x for x in v)


def test_lockstep_catches_a_data_message_whose_clock_is_not_merged(monkeypatch):
    real = BackupLane._data

    def keeps(self, msg, now_us):
        before = self.loan.clock
        took = real(self, msg, now_us)
        if took:
            self.loan.clock = before
        return took
    v = _mutant_run(monkeypatch, "_data", keeps)
    assert any("state after reclaim" in x and ".clock" in x for x in v)


def _unarming(name, key):
    """A lane whose `name` leaves the timer `key(self, *args)` as it found it unset."""
    real = getattr(BackupLane, name)

    def f(self, *args):
        k = key(self, *args)
        had = k in self.loan.timers
        out = real(self, *args)
        if not had:
            self.loan.timers.pop(k, None)
        return out
    return f


@pytest.mark.parametrize("name,key", [
    # the gap's NACK, the order info's ack, and the report of a watermark the data
    # message raised (`_after_event`'s, never exercised by heartbeats alone)
    ("_expect", lambda self, hc, upto: (Timer.NACK, hc.cid)),
    ("_oi_accept", lambda self, first, chunks, *path: Timer.ORDER_INFO_ACK),
    ("_data", lambda self, msg, now_us: Timer.WATERMARK_REPORT)])
def test_lockstep_catches_a_data_message_that_arms_no_timer(monkeypatch, name, key):
    v = _mutant_run(monkeypatch, name, _unarming(name, key))
    assert any("lane timers" in x for x in v)


# ---- KEEP_ALIVE, FIRST_ACK, SECOND_ACK; rule 3: the loan's timers ----

@pytest.mark.parametrize("mtype", [MsgType.FIRST_ACK, MsgType.KEEP_ALIVE, MsgType.NACK])
def test_lockstep_catches_a_control_message_whose_declaration_is_not_applied(
        monkeypatch, mtype):
    """A control message's trailer declares its own sent-up-to (`_declared`: recv_ts, a
    gap); a lane that reads it as a data message's (others only) is caught (seen: at
    the next report, whose `back`, our timestamp watermark, is then lower)."""
    real = BackupLane._on_trailer

    def as_data(self, hc, msg, trailer, data):
        real(self, hc, msg, trailer, data or msg.type is mtype)
    v = _mutant_run(monkeypatch, "_on_trailer", as_data)
    assert any("lane actions" in x or "lane timers" in x or "state after reclaim" in x
               for x in v)


def test_lockstep_catches_a_keep_alive_that_keeps_fa_count(monkeypatch):
    real = BackupLane._control

    def keeps(self, msg, now_us):
        hc = self.loan.by_cid.get((msg.src_group, msg.conn_seq, ROLES[1 - msg.role]))
        before = None if hc is None else hc.fa_count
        took = real(self, msg, now_us)
        if took and msg.type is MsgType.KEEP_ALIVE:
            hc.fa_count = before
        return took
    v = _mutant_run(monkeypatch, "_control", keeps)
    assert any("state after reclaim" in x and "fa_count" in x for x in v)


def test_lockstep_catches_a_second_ack_whose_gap_is_not_expected(monkeypatch):
    """A remote backup's SECOND_ACK past what we received opens a gap (placeholders,
    nacks, NACK armed): a lane that ignores its ack is caught."""
    real = BackupLane._second_ack
    v = _mutant_run(monkeypatch, "_second_ack",
                    lambda self, msg, now_us: real(self, replace(msg, ack=0), now_us))
    assert any("lane timers" in x or "state after reclaim" in x for x in v)


def _dropping(name, mtype):
    """A lane whose `name` does not send the `mtype` message it built."""
    real = getattr(BackupLane, name)

    def f(self, *args):
        k = len(self.actions)
        out = real(self, *args)
        self.actions[k:] = [a for a in self.actions[k:]
                            if not (isinstance(a, Send) and a.msg.type is mtype)]
        return out
    return f


@pytest.mark.parametrize("name,mtype", [
    ("_on_first_ack", MsgType.SECOND_ACK),      # the SECOND_ACK a FIRST_ACK is owed
    ("_order_info_ack", MsgType.ORDER_INFO),    # the report not sent
    ("handle_timer", MsgType.NACK)])            # the local NACK of the gaps not sent
def test_lockstep_catches_a_message_not_sent(monkeypatch, name, mtype):
    v = _mutant_run(monkeypatch, name, _dropping(name, mtype))
    assert any("lane actions" in x for x in v)


def test_lockstep_catches_a_report_whose_back_is_wrong(monkeypatch):
    """The report's `back` is our timestamp watermark, not our primary's group
    watermark (which a heartbeat's `back` raises)."""
    real = BackupLane._order_info_ack

    def gw_back(self):
        real(self)
        a = self.actions[-1]
        self.actions[-1] = Send(a.dst_group, replace(a.msg, back=self.loan.gw))
    v = _mutant_run(monkeypatch, "_order_info_ack", gw_back)
    assert any("handle_timer: lane actions" in x for x in v)


@pytest.mark.parametrize("name,key", [
    # the NACK re-armed at its firing (nack_retry_us later) while gaps remain; the
    # connection's KEEPALIVE a SECOND_ACK's `_emit` moves
    ("_nack", lambda self, hc: (Timer.NACK, hc.cid)),
    ("_on_first_ack", lambda self, hc, msg: (Timer.KEEPALIVE, hc.cid))])
def test_lockstep_catches_a_timer_not_set_as_the_core_does(monkeypatch, name, key):
    real = getattr(BackupLane, name)

    def f(self, *args):
        k = key(self, *args)
        before = self.loan.timers.get(k)
        out = real(self, *args)
        if before is None:
            self.loan.timers.pop(k, None)
        else:
            self.loan.timers[k] = before
        return out
    v = _mutant_run(monkeypatch, name, f)
    assert any("lane timers" in x for x in v)


def test_lockstep_catches_a_reclaim_that_drops_the_report(monkeypatch):
    """`reclaim_backup` must write back what the report changed: one that keeps the
    core's old `reported_w` is caught."""
    real = MessagingEndpoint.reclaim_backup

    def drops(self, loan):
        before = self.reported_w
        real(self, loan)
        self.reported_w = before
    monkeypatch.setattr(MessagingEndpoint, "reclaim_backup", drops)
    violations, _ = _run(range(30), first_only=True, **FAULTS)
    assert any("reported_w" in x for x in violations)


# ---- the other backups' HEARTBEATs, reports and local NACKs ----

def test_lockstep_catches_a_peer_ack_not_noted(monkeypatch):
    """Another backup's ORDER_INFO report: its ack is noted (`peer_oi_acks`)."""
    v = _mutant_run(monkeypatch, "_note_peer_ack", lambda self, msg: None)
    assert any("state after reclaim" in x and "peer_oi_acks" in x for x in v)


def test_lockstep_catches_a_peer_not_heard(monkeypatch):
    """Any message of another backup sets `last_heard_us` (membership reads it)."""
    real = BackupLane._peer

    def deaf(self, msg, now_us):
        before = dict(self.loan.last_heard)
        took = real(self, msg, now_us)
        self.loan.last_heard = before
        return took
    v = _mutant_run(monkeypatch, "_peer", deaf)
    assert any("state after reclaim" in x and "last_heard_us" in x for x in v)


# ---- our primary's direct ORDER_INFO ----

def test_lockstep_catches_a_direct_order_info_not_delivered(monkeypatch):
    """Its section of our view is delivered (`DeliverOrderInfo`, counted oi_via_intra)."""
    real = BackupLane._order_info

    def drops(self, msg, now_us):
        took = real(self, msg, now_us)
        self.actions[:] = [a for a in self.actions
                           if not isinstance(a, DeliverOrderInfo)]
        return took
    v = _mutant_run(monkeypatch, "_order_info", drops)
    assert any("handle_message: lane actions" in x for x in v)


def test_lockstep_catches_a_direct_order_info_not_acked(monkeypatch):
    """It is answered at once by the report (`_order_info_ack`)."""
    v = _mutant_run(monkeypatch, "_order_info",
                    _dropping("_order_info", MsgType.ORDER_INFO))
    assert any("handle_message: lane actions" in x for x in v)


def test_lockstep_catches_a_quiet_heartbeat_not_ended(monkeypatch):
    """While our heartbeat is quiet, any message but a HEARTBEAT (and any send) moves
    our HEARTBEAT to an interval from now (`_hb_soon`): a lane that does not is caught."""
    v = _mutant_run(monkeypatch, "_hb_soon", lambda self: None)
    assert any("lane timers" in x for x in v)


# ---- rule 5: the app's output, logged ----

def test_lockstep_catches_a_send_that_does_not_trim_the_log(monkeypatch):
    """A send logs, then trims what lies a window below the remote's `delivered`
    (`_trim_log`): a lane whose send leaves the log untrimmed is caught at the reclaim."""
    real = BackupLane.send

    def untrimmed(self, conn, data, now_us):
        self._trim_log = lambda hc: None
        try:
            return real(self, conn, data, now_us)
        finally:
            del self._trim_log
    v = _mutant_run(monkeypatch, "send", untrimmed)
    assert any("state after reclaim" in x and "log" in x for x in v)


def test_lockstep_catches_a_send_that_keeps_next_msn(monkeypatch):
    """A logged segment takes the msn the primary gave it (`log_segment`): a lane that
    does not advance `next_msn` is caught (the reclaim, or a FIRST_ACK of our last)."""
    real = BackupLane.send

    def keeps(self, conn, data, now_us):
        hc = self.loan.by_cid.get(conn)
        before = None if hc is None else hc.next_msn
        k = real(self, conn, data, now_us)
        if k:
            hc.next_msn = before
        return k
    v = _mutant_run(monkeypatch, "send", keeps)
    assert v

