"""`llft chaos` as CI runs it: a seeded fault campaign against the replicated kv counter.

Real replicas (`llft run` + the shim), the gateway, checking clients; faults injected at
random moments while the clients run (llft/tools/chaos.py). Every reply is checked and
every process accounted for. The default run has a few faults of every kind; `--soak`
(CI: `CI=true scripts/test.sh`) a longer campaign. A failure names the seed and fault
to re-run: `llft chaos --seed S --faults N --only I --keep`.
"""
from __future__ import annotations

import pytest

from llft.tools import chaos

FAULTS = {"off": 4, "small": 16, "full": 60}


def _run(tmp_path, seed: int, faults: list[chaos.Fault], workload: str = "kv") -> None:
    lines: list[str] = []
    rep = chaos.campaign(str(tmp_path), chaos.WORKLOADS[workload], faults, replicas=3,
                         clients=2, seed=seed, say=lines.append)
    assert not rep.setup_error, "\n".join(lines)
    assert len(rep.outcomes) == len(faults), "\n".join(lines)
    assert rep.leftovers == [], rep.leftovers
    assert rep.ok, "\n".join(lines) + "\n" + chaos.table(rep)
    # the faults did something: each kill changed the primary or removed a backup
    t = rep.totals()
    assert t["replies"] > 0 and t["settled"] == len(faults)


def test_chaos_kills_and_pauses(tmp_path):
    faults = [chaos.Fault(0, "kill_primary", 0.3, 0.0, 0),
              chaos.Fault(1, "pause_primary", 0.3, 1.0, 0),
              chaos.Fault(2, "kill_backup", 0.3, 0.0, 1),
              chaos.Fault(3, "cpu_hog", 0.3, 1.0, 0)]
    _run(tmp_path, 0, faults)


@pytest.mark.slow
def test_chaos_campaign(tmp_path, soak):
    seed = 7
    _run(tmp_path, seed, chaos.schedule(seed, FAULTS[soak]))
