"""The backups' steady lane (llft/protocol/messaging/backup_lane.py: rules 1 and 2 of
docs/BACKUP_LANE.md, a remote primary's data message and a gw rise) in lockstep with
the core: every backup of `llft simulate messaging` (`set lanes`) lends its steady state
for its primary's HEARTBEAT and for the remote primaries' REQUESTs and REPLYs, each
event the lane takes is checked against a copy of the core (actions, timers, and the
whole endpoint state at each reclaim), and one-rule mutants are caught."""
from __future__ import annotations

from collections import Counter

import pytest

from llft.protocol.messaging import MessagingEndpoint
from llft.protocol.messaging.backup_lane import BackupLane
from llft.protocol.messaging.lane import LanedEndpoint, LaneDivergence
from llft.protocol.messaging.timers import Timer
from llft.sim import messaging_check as mc

FAULTS = dict(loss=0.05, dup=0.02, reorder=0.05)


def _run(seeds, first_only=False, **faults) -> tuple[list[str], Counter]:
    """(violations, counts) over the default schedules of `seeds`: the backup lanes'
    events, loans, data messages and heartbeats taken, Deliver/Closed actions.
    `first_only`: stop after the first schedule with a violation (a mutant's run)."""
    n = Counter()
    deliver, data, heartbeat = BackupLane._deliver, BackupLane._data, \
        BackupLane._heartbeat

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
    violations = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mc, "BACKUP_SHADOW_EVERY", 1)        # every loan in lockstep here
        mp.setattr(BackupLane, "_deliver", delivered)
        mp.setattr(BackupLane, "_data", took(data, "data"))
        mp.setattr(BackupLane, "_heartbeat", took(heartbeat, "heartbeats"))
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


def test_backup_lanes_match_the_core_under_faults():
    violations, n = _run(range(30), **FAULTS)
    assert violations == []
    # the lanes took data messages and heartbeats and released held data themselves
    # (not only gave the loan back); seen: 2513 data messages and 445 heartbeats in
    # 1390 loans, 1878 Deliver/Closed actions
    assert n["data"] >= 1000 and n["heartbeats"] >= 100 and n["loans"] > 0
    assert n["delivered"] >= 200
    assert n["events"] == n["data"] + n["heartbeats"]


def test_backup_lanes_match_the_core_across_changes_of_primary():
    violations, n = _run(range(100, 120), loss=0.1, failover=0.5, die=0.2)
    assert violations == []
    assert n["data"] >= 300 and n["heartbeats"] >= 50     # (seen: 1836, 295)


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


def test_lockstep_catches_a_lane_that_keeps_one_held_message(monkeypatch):
    """A lane that releases all but the last message a rise covers (on one connection)
    is caught at the heartbeat itself: its Deliver actions differ."""
    def keeps_last(self):
        gw = self.loan.gw
        for hc in self.loan.conns:
            n = 0
            while n < len(hc.held) and hc.held[n].ts <= gw:
                n += 1
            for m in hc.held[:max(0, n - 1)]:
                self._deliver(hc, m.body["offset"], m.body["data"])
            del hc.held[:max(0, n - 1)]
    v = _mutant_run(monkeypatch, "_release_all_held", keeps_last)
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
    ("_oi_accept", lambda self, first, chunks: Timer.ORDER_INFO_ACK),
    ("_data", lambda self, msg, now_us: Timer.WATERMARK_REPORT)])
def test_lockstep_catches_a_data_message_that_arms_no_timer(monkeypatch, name, key):
    v = _mutant_run(monkeypatch, name, _unarming(name, key))
    assert any("lane timers" in x for x in v)
