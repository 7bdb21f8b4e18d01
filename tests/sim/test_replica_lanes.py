"""Lanes inside whole replicas (`llft simulate replica --lanes`, `set lanes`): every
replica node's messaging core is a LanedEndpoint (ReplicaNode's `wrap_messaging`), its
backups lending their steady state to the backup lane (backup_lane.py) and its lone
primaries their steady connection to the steady lane (lane.py), each loan checked in
lockstep against a copy of the core -- here under what the messaging simulator does not
have: membership's view changes, joins with state transfer, partitions and heals,
graceful stops, streams framed by the node."""
from __future__ import annotations

from collections import Counter

import pytest

from llft.protocol.messaging.backup_lane import BackupLane
from llft.protocol.messaging.lane import LaneDivergence
from llft.protocol.messaging.native_lane import native_available
from llft.sim import replica_check as rc
from llft.sim.campaign import schedule_seed

FAULTS = dict(random_cuts=True, partition=0.5, leave=0.2)


@pytest.fixture(autouse=True)
def every_loan(monkeypatch):
    """Every backup loan in lockstep here (the campaigns check one in four)."""
    monkeypatch.setattr(rc, "BACKUP_SHADOW_EVERY", 1)


def _run(n: int, campaign: int, first: int = 0, **params) -> tuple[list[str], Counter]:
    """(violations, lane counts) of schedules `first`.. `first + n - 1` of a campaign
    seed, lanes on; stops at the first schedule with a violation (a lane's divergence is
    one)."""
    violations, counts = [], Counter()
    for i in range(first, first + n):
        seed = schedule_seed(rc.KIND, campaign, i)
        try:
            out = rc.Schedule.generate(seed, lanes=True, **params).run()
        except LaneDivergence as e:
            violations.append(f"seed {seed}: {e}")
            break
        counts.update({k: v for k, v in out.stats.items() if k.startswith("lane ")})
        if out.violations:
            violations += [f"seed {seed}: {v}" for v in out.violations]
            break
    return violations, counts


def test_lanes_match_the_core_in_whole_replicas_with_streams_and_partitions():
    violations, n = _run(10, 7, streams=3, **FAULTS)
    assert violations == []
    # (these 10: 10,968 backup events in 215 loans, 303 events at lone primaries; before
    # the lane fired our own HEARTBEAT, which ended every loan that lived an interval,
    # 20 schedules took 15,948 in 4,398)
    assert n["lane events: backups"] >= 3000, n
    assert n["lane loans: backups"] >= 100, n
    # loans outlive our own heartbeats (rule 3): tens of events each
    assert n["lane events: backups"] > 10 * n["lane loans: backups"], n


@pytest.mark.skipif(not native_available(), reason="native._llft_lane is not built")
def test_native_lanes_match_the_core_in_whole_replicas():
    """The C engines (`--native`: native/lane/, a backup's and a lone primary's) in the
    same schedules, every backup loan in lockstep (these 10, measured when written:
    10,861 backup events in 244 loans)."""
    violations, n = _run(10, 7, streams=3, native=True, **FAULTS)
    assert violations == []
    assert n["lane events: backups"] >= 3000, n
    assert n["lane events: backups"] > 10 * n["lane loans: backups"], n


def test_lanes_match_the_core_on_plain_connections(monkeypatch):
    """One or two plain connections (bigger messages, REPLYs carrying data); a backup
    lends hundreds of times per schedule, and a lockstep loan copies the core: two
    schedules, one backup loan in four in lockstep."""
    monkeypatch.setattr(rc, "BACKUP_SHADOW_EVERY", 4)
    violations, n = _run(2, 11, first=2, **FAULTS)
    assert violations == []
    assert n["lane events: backups"] >= 1000, n      # (3,674 in these two)


@pytest.mark.slow
def test_soak_lanes(soak, monkeypatch):
    """The campaign with lanes, as `llft simulate replica --lanes` runs it (one backup
    loan in four in lockstep)."""
    monkeypatch.setattr(rc, "BACKUP_SHADOW_EVERY", 4)
    n = 16 if soak == "small" else 1000
    bad = rc.CAMPAIGN.failures(n, 21, lanes=True, streams=3, **FAULTS)
    assert [f"seed {s}: {v}" for s, v in bad] == []


@pytest.mark.slow
@pytest.mark.skipif(not native_available(), reason="native._llft_lane is not built")
def test_soak_native_lanes(soak, monkeypatch):
    """The campaign on the C engines, as `llft simulate replica --lanes --native` runs it."""
    monkeypatch.setattr(rc, "BACKUP_SHADOW_EVERY", 4)
    n = 16 if soak == "small" else 1000
    bad = rc.CAMPAIGN.failures(n, 22, lanes=True, native=True, streams=3, **FAULTS)
    assert [f"seed {s}: {v}" for s, v in bad] == []


def test_a_schedule_is_the_same_with_lanes():
    """Lanes change nothing a replica does: the faults drawn as the schedule runs (they
    follow its state) and the outcome are those of the same seed without lanes."""
    seed = schedule_seed(rc.KIND, 7, 3)
    plain = rc.Schedule.generate(seed, streams=3, **FAULTS).run()
    laned = rc.Schedule.generate(seed, streams=3, lanes=True, **FAULTS).run()
    assert laned.stats["lane events: backups"] > 0
    assert [ln for ln in laned.script.lines if ln[:2] != ("set", "lanes")] \
        == plain.script.lines
    assert laned.violations == plain.violations == []


def test_lockstep_in_replicas_catches_a_lane_that_keeps_one_held_message(
        monkeypatch, release_all_but_last):
    """The mutant of tests/sim/test_backup_lane.py (a gw rise releases all but the last
    message it covers), caught here too."""
    monkeypatch.setattr(BackupLane, "_release_all_held", release_all_but_last)
    violations, _ = _run(10, 7, streams=3, **FAULTS)
    assert any("lane actions" in v for v in violations), violations


def test_lockstep_in_replicas_catches_a_wrong_answer_from_the_loan(monkeypatch):
    """What the node reads of a lent core (`served`, `is_primary`, `pvn`) is answered by
    the loan and compared with the core's copy."""
    real = BackupLane.read
    monkeypatch.setattr(BackupLane, "read",
                        lambda self, name: self.loan.pvn + 1 if name == "pvn"
                        else real(self, name))
    violations, _ = _run(10, 7, streams=3, **FAULTS)
    assert any("pvn: lane answers" in v for v in violations), violations


@pytest.mark.parametrize("mutant", ["no report armed", "executed kept back"])
def test_lockstep_in_replicas_catches_a_wrong_set_executed(monkeypatch, mutant):
    """Rule 6's messaging half (the app's progress, `set_executed`: only the replica
    simulator's apps report it): a lane that arms no report, or keeps `executed`
    back, is caught (at the event's timers, at the reclaim's state)."""
    def wrong(self, pos, now_us):
        s = self.loan
        if now_us is not None:
            s.now = max(s.now, now_us)
        if mutant == "executed kept back":
            return True
        s.oi_executed = max(s.oi_executed, min(pos, s.oi_delivered))
        return True
    monkeypatch.setattr(BackupLane, "set_executed", wrong)
    violations, _ = _run(10, 7, streams=3, **FAULTS)
    assert any("lane timers" in v or "state after reclaim" in v for v in violations), \
        violations


def test_lockstep_in_replicas_catches_a_wrong_send_space(monkeypatch):
    """`send_space` at a backup (rule 5; only the replica simulator's nodes ask it) is
    what the connection's log still takes: a lane that forgets what is logged is caught
    at the answer itself."""
    monkeypatch.setattr(BackupLane, "send_space",
                        lambda self, conn: None if conn not in self.loan.by_cid
                        else self.loan.max_log_bytes)
    violations, _ = _run(10, 7, streams=3, **FAULTS)
    assert any("send_space: lane answers" in v for v in violations), violations
