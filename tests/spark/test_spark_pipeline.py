"""Replicated PySpark drivers end to end: the Nexmark pipeline (examples/) under
`llft run`, the primary driver SIGKILLed mid-stream, the sink's results compared byte
for byte with an unreplicated run on the same generated input.

One plain reference run serves every test of the module (Spark JVMs are expensive on a
2-core machine). Kills are placed by progress (windows received), never by time.
"""
from __future__ import annotations

import json

import pytest

from llft.spark import sparkrun


# 2500 events at 150/s: a window of 500 events every ~3.3 s, so that a killed driver
# restarted with its own JVM can rejoin (replaying the group's history) mid-stream
WL = sparkrun.Workload(events=2500, rate=150, window_ms=500, batch_events=250, batch_ms=200)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    r = sparkrun.reference(str(tmp_path_factory.mktemp("ref")), WL)
    assert r.sink.verdict(WL.events) == []
    assert len(r.sink.windows) == WL.windows
    return r.sink.received_bytes()


def _check(res: sparkrun.Result, ref: bytes, kills: int) -> None:
    sink = res.sink
    assert sink.verdict(WL.events) == [], sink.verdict(WL.events)
    assert sink.repeated == 0 and sink.gaps == []
    assert sink.connections == 1 and res.streams.gen.stats.connections == 1
    assert res.streams.gen.stats.resumed_from == [0]
    assert sink.received_bytes() == ref
    assert len(res.kills) == kills
    for k in res.kills:
        assert k["next_result_ms"] is not None
    # survivors report no divergence
    assert all(m["diverged"] is None for m in res.status["members"]), res.status["members"]
    assert not res.status.get("departed"), res.status.get("departed")


def _windows_after_kill(res: sparkrun.Result) -> list[dict]:
    t = res.kills[-1]["t_kill"]
    return [json.loads(w.line) for w in res.sink.windows if w.t > t]


def test_two_replicas_kill_restart_rejoin_kill(tmp_path, ref):
    # started together; the primary killed, restarted, rejoined, and the new primary killed
    res = sparkrun.replicated(str(tmp_path), WL, replicas=2, kill_after=[1, 3], restart=True)
    _check(res, ref, kills=2)
    # each kill hit the primary of its moment and another replica took over (which one
    # depends on the moment: a restarted replica may be the primary by the next kill)
    assert all(k["killed"] != k["new_primary"] for k in res.kills)
    assert all("rejoined_s" in k for k in res.kills)
    # the new primary's Spark session kept working on state built before the takeover:
    # windows emitted after the kill carry running per-category counts that include
    # every bid since the start, and join bids with auctions received before the kill
    after = _windows_after_kill(res)
    assert after, "no window was emitted after the kill"
    total_bids = sum(json.loads(w.line)["bids"] for w in res.sink.windows[:after[0]["w"] + 1])
    assert sum(n for _c, n in after[0]["bids_per_category"]) == total_bids


@pytest.mark.slow
def test_three_replicas_two_successive_kills(tmp_path, ref, soak):
    # the kill-restart-rejoin-kill test below kills twice too (with a rejoin between):
    # this one runs at full size only, for CI's time (2.5-3.5 min of JVMs on two cores)
    if soak != "full":
        pytest.skip("two kills without a rejoin: --soak=full")
    res = sparkrun.replicated(str(tmp_path), WL, replicas=3, kill_after=[1, 3])
    _check(res, ref, kills=2)
    assert all(k["killed"] != k["new_primary"] for k in res.kills)
    assert res.kills[0]["killed"] != res.kills[1]["killed"]     # a killed one stays dead


@pytest.mark.slow
def test_three_replicas_kill_restart_rejoin_kill(tmp_path, ref, soak):
    # three started together; the primary killed and restarted (it rejoins as a backup
    # and catches up while two replicas serve), then the primary of that moment killed.
    # Four JVMs on two cores: 86-109 s on a fast VM, 246 s on a slow one, where the
    # two-replica test above took 157 s. CI runs that one (the same steps) for its time
    if soak != "full":
        pytest.skip("three-replica kill-restart-rejoin-kill: --soak=full")
    res = sparkrun.replicated(str(tmp_path), WL, replicas=3, kill_after=[1, 3], restart=True)
    _check(res, ref, kills=2)
    assert all(k["killed"] != k["new_primary"] for k in res.kills)
    assert all("rejoined_s" in k for k in res.kills)
