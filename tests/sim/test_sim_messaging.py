"""`llft simulate messaging` as tests: random schedules with faults, determinism, and a
check that the checker catches a broken core (the regression scenarios are run by
tests/sim/test_scenarios.py)."""
from __future__ import annotations

import argparse

import pytest

from llft.protocol import messaging
from llft.protocol.messaging import MessagingEndpoint
from llft.sim import messaging_check as mc
from llft.sim.campaign import schedule_seed

def _campaign(n, seed, loss, dup, reorder, failover=0.0, die=0.0, lanes=1.0):
    return mc.CAMPAIGN.failures(n, seed, loss=loss, dup=dup, reorder=reorder,
                                failover=failover, die=die, lanes=lanes)


# The checks that a broken core is caught run the core alone: with lanes, a lone
# primary's lane (the unbroken model) would differ from it first (LaneDivergence).
CORE_ALONE = 0.0


def test_schedules_with_faults():
    assert _campaign(250, 1, 0.2, 0.05, 0.1) == []


def test_schedules_without_faults():
    assert _campaign(50, 2, 0.0, 0.0, 0.0) == []


def test_schedules_with_changes_of_primary():
    """The check plays membership (new primary view, phase 2 of messaging)."""
    assert _campaign(100, 4, 0.2, 0.05, 0.1, failover=0.6) == []


def test_schedules_with_harsh_faults():
    assert _campaign(50, 3, 0.4, 0.2, 0.5) == []


def test_schedules_where_a_group_dies():
    """A whole group dies (a gateway's host, lost for good) while the others run with
    faults and changes of primary: every connection with it is freed at every live
    replica after the same bytes, within the remote timeout of silence."""
    assert _campaign(60, 5, 0.05, 0.02, 0.1, failover=0.3, die=1.0) == []


def test_checker_catches_a_dead_group_kept_forever(monkeypatch):
    """Without the silence rule a dead group's connection stays, pinning the watermark."""
    monkeypatch.setattr(messaging.MessagingEndpoint, "_remote_silence_due",
                        lambda self, c: self.timers.clear(messaging.Timer.REMOTE_SILENCE,
                                                          c.cid))
    assert _campaign(5, 5, 0.0, 0.0, 0.0, die=1.0, lanes=CORE_ALONE)


def test_checker_catches_backups_freeing_beyond_the_primarys_cut(monkeypatch):
    """A backup that frees a lost connection by force delivers bytes its primary never
    had (tests/sim/regressions/messaging_dead_group_backup_beyond_cut.scenario)."""
    import os
    from llft.sim.campaign import Script
    orig = messaging.MessagingEndpoint._free
    monkeypatch.setattr(messaging.MessagingEndpoint, "_free",
                        lambda self, c, cut=None: orig(self, c))
    path = os.path.join(os.path.dirname(__file__), "regressions",
                        "messaging_dead_group_backup_beyond_cut.scenario")
    outcome = mc.run_script(Script.load(path))
    assert any("freed after different bytes" in v for v in outcome.violations)


def test_a_schedule_is_deterministic():
    seed = schedule_seed("messaging", 9, 0)
    s1 = mc.Schedule(mc.generate(seed, 0.2, 0.05, 0.1))
    s2 = mc.Schedule(mc.generate(seed, 0.2, 0.05, 0.1))
    assert s1.run() == s2.run() == []
    assert s1.sim.stats == s2.sim.stats and s1.sim.now_us == s2.sim.now_us


def test_checker_catches_duplicate_delivery(monkeypatch):
    orig = messaging.MessagingEndpoint._deliver

    def twice(self, c, offset, data):
        orig(self, c, offset, data)
        self._actions.append(messaging.Deliver(c.cid, offset, data))

    monkeypatch.setattr(messaging.MessagingEndpoint, "_deliver", twice)
    assert _campaign(3, 1, 0.0, 0.0, 0.0, lanes=CORE_ALONE)


def test_checker_catches_missing_retransmission(monkeypatch):
    monkeypatch.setattr(messaging.MessagingEndpoint, "_answer_remote_nack",
                        lambda self, c, missing: None)
    monkeypatch.setattr(messaging.MessagingEndpoint, "_retransmit",
                        lambda self, c: self.timers.clear(messaging.Timer.RETRANSMIT, c.cid))
    assert _campaign(5, 1, 0.3, 0.0, 0.0, lanes=CORE_ALONE)


def test_cli_last_line(capsys):
    p = argparse.ArgumentParser()
    mc.add_arguments(p)
    rc = mc.run(p.parse_args(["--schedules", "3", "--seed", "5", "--loss", "0.1"]))
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and out[-1] == "3 schedules, 0 violations"


@pytest.mark.slow
def test_soak(soak):
    n = 250 if soak == "small" else 20000
    assert _campaign(n, 7, 0.2, 0.05, 0.1) == []


@pytest.mark.slow
def test_soak_failover(soak):
    n = 250 if soak == "small" else 10000
    assert _campaign(n, 8, 0.2, 0.05, 0.1, failover=0.5) == []


@pytest.mark.slow
def test_soak_dead_group(soak):
    n = 150 if soak == "small" else 3000
    assert _campaign(n, 9, 0.1, 0.05, 0.1, failover=0.3, die=1.0) == []


@pytest.mark.slow
def test_soak_dead_group_failing_over(soak):
    """A remote group that changes primary and then dies whole, with both groups failing
    over (docs/ARCHITECTURE.md item 12: 3 to 4 of 3,000 schedules failed before the cut
    announcements)."""
    n = 150 if soak == "small" else 3000
    assert _campaign(n, 12, 0.2, 0.05, 0.2, failover=0.7, die=1.0) == []


# -- the kernel itself (membership reuses it) ---------------------------------------------
from dataclasses import dataclass as _dc   # noqa: E402

from llft.protocol.messages import Message, MsgType, Role   # noqa: E402
from llft.sim.kernel import NetConfig, Sim   # noqa: E402


@_dc(frozen=True)
class _Send:
    dst_group: str
    msg: Message


class _Echo:
    """Sends one heartbeat to `peer` every 1 ms; records what it receives."""

    def __init__(self, group, peer, bid):
        self.group, self.peer, self.bid = group, peer, bid
        self.got, self.out, self.t = [], [], 0

    def handle_message(self, msg, now_us):
        self.got.append((now_us, msg.sender, msg.body))

    def handle_timer(self, now_us):
        self.out.append(_Send(self.peer, Message(MsgType.HEARTBEAT, self.group, self.peer, 0,
                                                 Role.CLIENT, 1, 1, self.bid,
                                                 body={"rank": 1, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0})))
        self.t = now_us + 1000

    def next_timer_us(self):
        return self.t

    def take_actions(self):
        out, self.out = self.out, []
        return out


def _echo_sim(seed, net):
    sim = Sim(seed, net)
    a, b = _Echo("A", "B", 1), _Echo("B", "A", 2)
    sim.add_node("a", a, ["A"])
    sim.add_node("b", b, ["B"])
    return sim, a, b


def test_kernel_is_deterministic_and_faulty_as_configured():
    net = NetConfig(loss=0.3, dup=0.2, reorder=0.3)
    runs = []
    for _ in range(2):
        sim, a, b = _echo_sim(4, net)
        sim.run_until(200_000)
        runs.append((a.got, b.got, dict(sim.stats)))
    assert runs[0] == runs[1]
    got, stats = runs[0][0], runs[0][2]
    assert stats["lost"] > 0 and 100 < len(got) < 400


def test_kernel_crash_partition_and_forgery():
    sim, a, b = _echo_sim(1, NetConfig())
    sim.run_until(10_000)
    n = len(b.got)
    sim.partition(["a"], ["b"])
    sim.run_until(20_000)
    assert len(b.got) == n and sim.stats["partitioned"] > 0
    sim.heal()
    forged = Message(MsgType.HEARTBEAT, "A", "B", 0, Role.CLIENT, 1, 1, 99, body={"rank": 1, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0})
    for dg in sim.forge(forged):
        sim.inject("B", dg)
    sim.inject("B", b"LF\x01\x00garbage")
    sim.run_until(30_000)
    assert len(b.got) > n and all(s != 99 for _, s, _ in b.got)
    assert sim.stats["rejected"] == 2
    sim.crash("b")
    before = len(b.got)
    sim.run_until(40_000)
    assert len(b.got) == before and not sim.alive("b")
    b2 = _Echo("B", "A", 3)
    sim.restart("b", b2)
    sim.run_until(50_000)
    assert b2.got and sim.core("b") is b2


def test_invariants_hold_after_every_event_of_a_lossy_failover_schedule(monkeypatch):
    checked = [0]
    for name in ("handle_message", "handle_timer", "send", "set_view", "add_order_info"):
        orig = getattr(MessagingEndpoint, name)

        def wrapped(self, *args, _orig=orig, **kw):
            out = _orig(self, *args, **kw)
            self.check()
            checked[0] += 1
            return out
        monkeypatch.setattr(MessagingEndpoint, name, wrapped)
    for i in range(3):
        assert mc.Schedule(mc.generate(schedule_seed("messaging", 7, i), 0.2, 0.05, 0.1, 1.0)).run() == []
    assert checked[0] > 1000


def test_campaigns_assert_each_endpoints_invariants(monkeypatch):
    def broken(self):
        raise AssertionError("a broken invariant")
    monkeypatch.setattr(MessagingEndpoint, "check", broken)
    violations = mc.Schedule(mc.generate(schedule_seed("messaging", 7, 0))).run()
    assert any("invariant: a broken invariant" in v for v in violations), violations
