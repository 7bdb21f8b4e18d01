"""The backups' steady lane (llft/protocol/messaging/backup_lane.py: rule 2 of
docs/BACKUP_LANE.md, a gw rise) in lockstep with the core: every backup of
`llft simulate messaging` (`set lanes`) lends its steady state for its primary's
HEARTBEAT, each one the lane takes is checked against a copy of the core (actions,
timers, and the whole endpoint state at each reclaim), and one-rule mutants are caught."""
from __future__ import annotations

import pytest

from llft.protocol.messaging import MessagingEndpoint
from llft.protocol.messaging.backup_lane import BackupLane
from llft.protocol.messaging.lane import LanedEndpoint, LaneDivergence
from llft.sim import messaging_check as mc


def _run(seeds, **faults) -> tuple[list[str], int, int, int]:
    """(violations, backup lane events, backup loans, Deliver actions of backup lanes)
    over the default schedules of `seeds`."""
    delivered = 0
    real = BackupLane._deliver

    def counted(self, hc, offset, data):
        nonlocal delivered
        n = len(self.actions)
        real(self, hc, offset, data)
        delivered += len(self.actions) - n
    violations, events, loans = [], 0, 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BackupLane, "_deliver", counted)
        for seed in seeds:
            s = mc.Schedule(mc.generate(seed, **faults))
            try:
                violations += s.run()
            except LaneDivergence as e:
                violations.append(f"seed {seed}: {e}")
            for rep in s.by_node.values():
                if isinstance(rep.core, LanedEndpoint):
                    events += rep.core.backup_events
                    loans += rep.core.backup_loans
    return violations, events, loans, delivered


def test_backup_lanes_match_the_core_under_faults():
    violations, events, loans, delivered = _run(range(30), loss=0.05, dup=0.02,
                                                reorder=0.05)
    assert violations == []
    # the lanes took heartbeats and released held data themselves (not only gave the
    # loan back); seen: 445 heartbeats in 440 loans, 1878 Deliver/Closed actions
    assert events >= 100 and loans > 0 and delivered >= 200


def test_backup_lanes_match_the_core_across_changes_of_primary():
    violations, events, _, _ = _run(range(100, 120), loss=0.1, failover=0.5, die=0.2)
    assert violations == []
    assert events >= 50         # (seen: 295)


def test_the_campaign_wraps_backups():
    """`set lanes` (on by default) gives every replica, backups too, a backup lane."""
    s = mc.Schedule(mc.generate(3))
    assert all(isinstance(rep.core, LanedEndpoint)
               and rep.core.backup_engine is BackupLane for rep in s.by_node.values())


def _mutant_run(monkeypatch, name, fn, seeds=range(30)) -> list[str]:
    monkeypatch.setattr(BackupLane, name, fn)
    violations, _, _, _ = _run(seeds, loss=0.05, dup=0.02, reorder=0.05)
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
    back. (The WATERMARK_REPORT `_after_event` may arm is modelled too, but in these
    schedules an earlier event has always armed it or the report already went: a lane
    that skips it is not caught here.)"""
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
    violations, _, _, _ = _run(range(30), loss=0.05, dup=0.02, reorder=0.05)
    assert any("covered" in x for x in violations)
