"""Steady lanes (llft/protocol/messaging/lane.py) in lockstep with the core: the gateway's
shape of `llft simulate messaging` (a lone primary with one long connection) under faults,
every lane event checked against a copy of the core, and checks that the lockstep check
catches a lane that differs from the core."""
from __future__ import annotations

import pytest

from llft.protocol.messaging import MessagingEndpoint
from llft.protocol.messaging.lane import LanedEndpoint, SteadyLane
from llft.protocol.messaging.timers import Timer
from llft.sim import messaging_check as mc


def _run(seeds, **faults) -> tuple[list[str], int, int]:
    """(violations, lane events, loans) of the gateway-shaped schedules of `seeds`."""
    violations, events, loans = [], 0, 0
    for s, found in mc.gateway_schedules(seeds, **faults):
        violations += found
        for rep in s.by_node.values():
            if isinstance(rep.core, LanedEndpoint):
                # (the gateway's lanes: backups' lanes are test_backup_lane.py's)
                events += rep.core.lane_events - rep.core.backup_events
                loans += rep.core.loans - rep.core.backup_loans
    return violations, events, loans


def test_lanes_match_the_core_under_faults():
    violations, events, loans = _run(range(40), loss=0.1, dup=0.05, reorder=0.1)
    assert violations == []
    # the lane did carry traffic (sends and in-order data), not only give it back
    assert events >= 100 and loans >= 50


def test_lanes_take_keep_alives_duplicates_and_first_acks():
    """Besides the next data message, the lane takes the server primary's KEEP_ALIVEs,
    duplicate data messages and FIRST_ACKs (answered with a SECOND_ACK), in lockstep."""
    kinds = {}
    real = LanedEndpoint._shadowed

    def counted(self, since, event, *args, **kw):
        if event == "handle_message" and self.lane.cid is not None:   # (not a backup's)
            m = args[0]
            k = m.type.name if m.type.name not in ("REQUEST", "REPLY") else (
                "dup" if m.msn <= self._copy.conns[self.lane.cid].recv.view.upto else "data")
            kinds[k] = kinds.get(k, 0) + 1
        return real(self, since, event, *args, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LanedEndpoint, "_shadowed", counted)
        violations, _, _ = _run(range(40), loss=0.1, dup=0.05, reorder=0.1)
    assert violations == []
    # (seen: 79 data, 44 dup, 13 KEEP_ALIVE, 83 FIRST_ACK)
    assert kinds.get("KEEP_ALIVE", 0) >= 5 and kinds.get("dup", 0) >= 20
    assert kinds.get("FIRST_ACK", 0) >= 40


def test_lanes_match_the_core_across_changes_of_primary_and_a_dead_group():
    violations, events, _ = _run(range(100, 140), failover=0.5, die=0.2, loss=0.05)
    assert violations == []
    assert events >= 100


def test_the_campaign_runs_lanes_by_default():
    """Every schedule of `llft simulate messaging` runs lone primaries with lanes (the
    gateway's shape only gives them more to do)."""
    assert ("set", "lanes") in [tuple(ln) for ln in mc.generate(1).lines]
    assert mc.CAMPAIGN.failures(20, 5, loss=0.1, dup=0.05, reorder=0.1,
                                gateway=1.0) == []


def _forgets_first_ack_retries(self, reflect):
    s = self.loan
    if reflect or s.upto > s.fa_pending or s.fa_pending == 0:
        due = s.now + s.first_ack_delay_us
        d = s.timers.get(Timer.FIRST_ACK)
        if d is None or due < d:
            s.timers[Timer.FIRST_ACK] = due


def test_lockstep_catches_a_lane_that_forgets_state(monkeypatch):
    """A lane that leaves out one assignment of the core (the FIRST_ACK retry count) is
    caught when the loan comes back."""
    monkeypatch.setattr(SteadyLane, "_want_first_ack", _forgets_first_ack_retries)
    violations, _, _ = _run(range(40), loss=0.05, reorder=0.1)
    assert any("fa_tries" in v for v in violations)


def test_lockstep_catches_a_lane_that_sends_differently(monkeypatch):
    """A lane whose data messages differ from the core's by one field is caught at the
    event itself, before its datagram would leave."""
    real = SteadyLane._send_data

    def later_ack(self, offset, data):
        real(self, offset, data)
        m = self.actions[-1].msg
        m.ack += 1
    monkeypatch.setattr(SteadyLane, "_send_data", later_ack)
    violations, _, _ = _run(range(10))
    assert any("send: lane actions" in v for v in violations)


def test_lockstep_catches_a_reclaim_that_drops_a_field(monkeypatch):
    """`reclaim` must write back every field of the loan: one that keeps the core's old
    `delivered` is caught when the loan comes back."""
    real = MessagingEndpoint.reclaim

    def drops_delivered(self, loan):
        c = self.conns[loan.cid]
        before = c.recv.delivered
        real(self, loan)
        c.recv.delivered = before
    monkeypatch.setattr(MessagingEndpoint, "reclaim", drops_delivered)
    violations, _, _ = _run(range(10))
    assert any("delivered" in v for v in violations)


def test_lockstep_catches_a_duplicate_left_uncounted(monkeypatch):
    """A lane that takes a duplicate without counting it (dup_data) is caught at reclaim."""
    real = SteadyLane._count

    def skips_dup(self, key):
        if key != "dup_data":
            real(self, key)
    monkeypatch.setattr(SteadyLane, "_count", skips_dup)
    violations, _, _ = _run(range(40), loss=0.1, dup=0.05, reorder=0.1)
    assert any("dup_data" in v for v in violations)


def test_lockstep_catches_a_second_ack_that_differs(monkeypatch):
    """A SECOND_ACK one field off (its ack) is caught at the FIRST_ACK itself."""
    real = SteadyLane._on_first_ack

    def later_ack(self, msg):
        n = len(self.actions)
        real(self, msg)
        if len(self.actions) > n:
            self.actions[-1].msg.ack += 1
    monkeypatch.setattr(SteadyLane, "_on_first_ack", later_ack)
    violations, _, _ = _run(range(20), loss=0.1)
    assert any("handle_message: lane actions" in v for v in violations)


def test_lockstep_catches_a_keep_alive_that_skips_the_declared_ts(monkeypatch):
    """A lane that takes a KEEP_ALIVE without its declared (sent_upto, ts) is caught."""
    real = SteadyLane.handle_message

    def keeps_declared(self, msg, now_us):
        d = self.loan.declared
        took = real(self, msg, now_us)
        if took and msg.type.name == "KEEP_ALIVE":
            self.loan.declared = d
        return took
    monkeypatch.setattr(SteadyLane, "handle_message", keeps_declared)
    violations, _, _ = _run(range(40), loss=0.1, dup=0.05, reorder=0.1)
    assert any("declared" in v for v in violations)
