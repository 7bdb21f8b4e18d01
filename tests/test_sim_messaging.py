"""`llft simulate messaging` as tests: random schedules with faults, every regression
seed in tests/regressions/messaging.txt, determinism, and a check that the checker
catches a broken core."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llft import messaging
from llft.sim import messaging_check as mc

REGRESSIONS = Path(__file__).parent / "regressions" / "messaging.txt"


def _regressions():
    out = []
    for line in REGRESSIONS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            seed, loss, dup, reorder = line.split()
            out.append((int(seed), float(loss), float(dup), float(reorder)))
    return out


def _campaign(n, seed, loss, dup, reorder):
    bad = []
    for i in range(n):
        s = mc.schedule_seed(seed, i)
        v = mc.run_schedule(s, loss, dup, reorder)
        if v:
            bad.append((s, v[0]))
    return bad


def test_schedules_with_faults():
    assert _campaign(250, 1, 0.2, 0.05, 0.1) == []


def test_schedules_without_faults():
    assert _campaign(50, 2, 0.0, 0.0, 0.0) == []


def test_schedules_with_harsh_faults():
    assert _campaign(50, 3, 0.4, 0.2, 0.5) == []


@pytest.mark.parametrize("seed,loss,dup,reorder", _regressions())
def test_regression_seed(seed, loss, dup, reorder):
    assert mc.run_schedule(seed, loss, dup, reorder) == []


def test_a_schedule_is_deterministic():
    s1 = mc.Schedule(mc.schedule_seed(9, 0), 0.2, 0.05, 0.1)
    s2 = mc.Schedule(mc.schedule_seed(9, 0), 0.2, 0.05, 0.1)
    assert s1.run() == s2.run() == []
    assert s1.sim.stats == s2.sim.stats and s1.sim.now_us == s2.sim.now_us


def test_checker_catches_duplicate_delivery(monkeypatch):
    orig = messaging.MessagingEndpoint._deliver

    def twice(self, c, offset, data):
        orig(self, c, offset, data)
        self._actions.append(messaging.Deliver(c.cid, offset, data))

    monkeypatch.setattr(messaging.MessagingEndpoint, "_deliver", twice)
    assert _campaign(3, 1, 0.0, 0.0, 0.0)


def test_checker_catches_missing_retransmission(monkeypatch):
    monkeypatch.setattr(messaging.MessagingEndpoint, "_answer_remote_nack",
                        lambda self, c, missing: None)
    monkeypatch.setattr(messaging.MessagingEndpoint, "_retransmit",
                        lambda self, c: setattr(c, "rto_due", None))
    assert _campaign(5, 1, 0.3, 0.0, 0.0)


def test_cli_last_line(capsys):
    p = argparse.ArgumentParser()
    mc.add_arguments(p)
    rc = mc.run(p.parse_args(["--schedules", "3", "--seed", "5", "--loss", "0.1"]))
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and out[-1] == "3 schedules, 0 violations"


@pytest.mark.slow
def test_soak(soak):
    n = 2000 if soak == "small" else 20000
    assert _campaign(n, 7, 0.2, 0.05, 0.1) == []
