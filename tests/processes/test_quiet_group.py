"""An idle group of real `llft run` replicas, started together with the default
configuration: its agents' event loops sleep between their quiet refreshes (a second),
because the pulse thread repeats their heartbeats while each loop waits in its selector
(the lease) and holds their detectors' deadlines (silence watches,
llft/runtime/pulse.py) -- and yet a primary SIGKILLed after the idle spell is replaced.

The bound is a count of loop iterations (the status files' `loop_waits`), not a time:
before the lease and the watches an idle agent of a 3-replica group woke ~20 times a
second (a refresh every 60 ms, the status and lag tasks), now about twice. The window
is an observation window, not a synchronisation.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

from llft import EXAMPLES_DIR
from llft.runtime import status
from llft.runtime.pulse import native_available
from llft.tools.cluster import LocalCluster

COUNTER = [sys.executable, os.path.join(EXAMPLES_DIR, "kv_counter.py"), "9000"]
IDLE_S = 5.0
SETTLE_S = 30.0             # the apps' start-up: order info flows for a second or two
MAX_WAKEUPS_PER_S = 6       # refresh 1 + status 1 + the lag task's look 1; the old code: ~20


def agents(lc: LocalCluster) -> list[dict]:
    return status.read_files(lc.cfg.status_dir(lc.group))[0]


def rates(lc: LocalCluster, window_s: float) -> dict[int, float]:
    """Each agent's loop wake-ups a second over a window of `window_s` (an observation
    window: the status files are read fresh at both ends)."""
    w0, t0 = fresh_waits(lc, time.monotonic())
    time.sleep(window_s)
    w1, t1 = fresh_waits(lc, time.monotonic())
    return {b: (w1[b] - w0[b]) / (t1 - t0) for b in w0 if b in w1}


def fresh_waits(lc: LocalCluster, after: float) -> tuple[dict[int, int], float]:
    """Each agent's loop iterations, from status files written after `after`
    (monotonic), and when the last of them was written."""
    deadline = time.monotonic() + 10
    while True:
        got = agents(lc)
        if len(got) == 3 and all(a.get("written_mono", 0) > after for a in got):
            return ({a["birth"]: a["transport"]["loop_waits"] for a in got},
                    max(a["written_mono"] for a in got))
        assert time.monotonic() < deadline, "status files not refreshed"
        time.sleep(0.05)    # polling files, bounded by the deadline


@pytest.mark.skipif(not native_available(), reason="native pulse module not built")
def test_an_idle_group_sleeps_between_refreshes_and_still_fails_over(tmp_path):
    with LocalCluster(str(tmp_path)) as lc:
        for name in ("r1", "r2", "r3"):             # started together, as users do
            lc.start_replica(name, COUNTER)
        lc.wait_ready(3, timeout_s=90)
        # quiet once the apps have started (their start-up's order info delivered)
        settle = time.monotonic() + SETTLE_S
        while max(rates(lc, 1.0).values()) > MAX_WAKEUPS_PER_S:
            assert time.monotonic() < settle, "the idle group never became quiet"
        before = lc.status()
        idle = rates(lc, IDLE_S)
        assert len(idle) == 3 and max(idle.values()) <= MAX_WAKEUPS_PER_S, idle
        after = lc.status()
        # nobody suspected while the loops slept: the same view, the same members
        assert after["view"] == before["view"], (before["view"], after["view"])
        assert {m["birth"] for m in after["members"]} == {m["birth"] for m in before["members"]}
        # the silence of a dead primary is still noticed (the watches fire)
        old = lc.kill_primary()
        new = lc.wait_primary(other_than=old["birth"])
        st = lc.wait_members(2)
        assert new["birth"] != old["birth"] and st["view"] > before["view"]
