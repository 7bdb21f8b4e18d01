"""`llft bench latency`, `llft bench throughput` and `llft bench failover` in --quick mode.

Checks counts and structure only (every configuration measured, rows and CSV files
written, no errors, exit status 0). Timings never decide pass or fail: these machines
are shared and noisy.
"""
from __future__ import annotations

import csv
import importlib.util
import os

import pytest

from llft.cli import main

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def replicas_for(soak: str) -> str:
    return "1,2,3" if soak == "full" else "1,2"


@pytest.mark.slow
def test_latency_and_throughput_quick(tmp_path, soak):
    out = str(tmp_path / "results")
    replicas = replicas_for(soak)
    configs = ["tcp", "proxy"] + [f"llft_{r}r" for r in replicas.split(",")]

    assert main(["bench", "latency", "--quick", "--replicas", replicas, "--results", out]) == 0
    rows = read_csv(os.path.join(out, "latency.csv"))
    assert [(r["size_B"], r["config"]) for r in rows] == \
        [(s, c) for s in ("64", "1024") for c in configs]
    for r in rows:
        assert r["error"] == "", r
        # --quick: 50 round trips per phase; tcp and proxy pool every phase
        phases = 1 if r["config"].startswith("llft") else len(replicas.split(","))
        assert int(r["n"]) == 50 * phases, r
        assert r["median_us"] and r["p90_us"] and r["p99_us"] and r["median_vs_tcp"], r

    assert main(["bench", "throughput", "--quick", "--replicas", replicas,
                 "--results", out]) == 0
    rows = read_csv(os.path.join(out, "throughput.csv"))
    assert [(r["clients"], r["config"]) for r in rows] == \
        [(c, n) for c in ("1", "4") for n in configs]
    for r in rows:
        assert r["error"] == "", r
        assert int(r["replies"]) > 0, r
        assert r["req_per_s"] and r["vs_tcp"], r

    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    assert "## llft bench latency" in summary and "## llft bench throughput" in summary
    assert f"Reproduce: `llft bench latency --replicas {replicas} --quick --results" in summary
    if HAVE_MPL:
        for png in ("latency.png", "latency_p99.png", "throughput.png"):
            assert os.path.getsize(os.path.join(out, png)) > 0


@pytest.mark.slow
def test_failover_quick(tmp_path, soak):
    out = str(tmp_path / "results")
    sizes = "2,3" if soak == "full" else "2"
    assert main(["bench", "failover", "--quick", "--replicas", "2", "--service-replicas", sizes,
                 "--results", out]) == 0
    membership = read_csv(os.path.join(out, "failover_runs.csv"))
    assert len(membership) == 2                            # --quick: 2 runs
    kills = read_csv(os.path.join(out, "failover_service_kills.csv"))
    assert [(r["replicas"], r["kill"]) for r in kills] == \
        [(s, k) for s in sizes.split(",") for k in ("1", "2")]   # --quick: 2 kills
    for r in kills:
        assert r["pause_ms"] and r["promoted_ms"] and r["rejoin_ms"], r
    service = read_csv(os.path.join(out, "failover_service.csv"))
    assert [r["replicas"] for r in service] == sizes.split(",")
    for r in service:
        assert r["error"] == "" and r["client_errors"] == "0" and r["kills"] == "2", r
        assert int(r["replies"]) > 0, r
    assert "Reproduce: `llft bench failover" in open(os.path.join(out, "failover.md")).read()
    if HAVE_MPL:
        for png in ("failover.png", "failover_view_change.png"):
            assert os.path.getsize(os.path.join(out, png)) > 0


@pytest.mark.slow
def test_echo_quick(tmp_path):
    """`llft bench echo --quick`: every configuration measured (also with a connection
    per request), idle row written, the group's churn counted."""
    out = str(tmp_path / "results")
    assert main(["bench", "echo", "--quick", "--results", out]) == 0
    rows = read_csv(os.path.join(out, "echo.csv"))
    assert [r["config"] for r in rows] == ["tcp", "proxy", "proxy_x2", "llft_1r"]
    for r in rows:
        assert r["error"] == "", r
        assert r["p50_us"] and r["p99_us"] and r["rps_1"] and r["rps_16"], r
        assert r["conn_rps_1"] and r["conn_rps_16"], r
    # llft's p50 also against its process shape's floor (two forwarders in a row)
    assert rows[3]["p50_vs_proxy_x2"] and not rows[1]["p50_vs_proxy_x2"]
    # a lone replica has no one to suspect it: its view and birth never change
    assert (rows[3]["view_changes"], rows[3]["replicas_replaced"]) == ("0", "0"), rows[3]
    (idle,) = read_csv(os.path.join(out, "echo_idle.csv"))
    assert idle["config"] == "llft_1r" and idle["agent_cpu_pct_max"] != ""
    assert idle["after_load_datagrams_per_s"] and idle["after_load_2nd_s_datagrams_per_s"]
    cpu = read_csv(os.path.join(out, "echo_cpu.csv"))
    assert "gateway=" in cpu[3]["cpu_us_per_req_1"] and "r1=" in cpu[3]["cpu_us_per_req_1"]
    # the chained forwarders: both forwarders and the server counted
    assert all(f"{n}=" in cpu[2]["cpu_us_per_req_1"] for n in ("forwarder", "forwarder2",
                                                               "server")), cpu[2]


@pytest.mark.slow
def test_profile_quick(tmp_path):
    """`llft bench profile --quick --cprofile`: CPU per request of every process (the
    loop's thread and the rest), the agent's messages by type, and the loop profiles
    the agent and the gateway wrote at SIGUSR2 (LLFT_PROFILE_DIR)."""
    out = str(tmp_path / "results")
    assert main(["bench", "profile", "--quick", "--mode", "conn", "--duration", "2",
                 "--cprofile", "--top", "5", "--results", out]) == 0
    rows = {r["process"]: r for r in read_csv(os.path.join(out, "profile_cpu.csv"))}
    assert "r1" in rows and "gateway" in rows and any(p.startswith("r1.app") for p in rows)
    assert float(rows["r1"]["cpu_us_per_req"]) > 0 and float(rows["r1"]["loop"]) > 0
    # every request wakes the agent's loop at least once somewhere in its path; the
    # machine's row counts every process's switches, the load client's and the kernel's
    assert float(rows["r1"]["switches_vol"]) > 0
    machine = next(r for p, r in rows.items() if p.startswith("machine"))
    assert float(machine["switches_vol"]) >= float(rows["r1"]["switches_vol"])
    assert float(machine["cpu_us_per_req"]) >= float(rows["r1"]["cpu_us_per_req"]) * 0.5
    md = open(os.path.join(out, "profile.md")).read()
    assert "sent_REPLY" in md and "loop_waits" in md
    assert md.count("top 5 functions of the loop thread") == 2     # the agent, the gateway
    assert "agent-" in md and "gateway-" in md
    # and their own time by layer: each process's layers add up to its whole loop
    assert md.count("the loop thread's own time by layer") == 2
    assert "messaging core" in md and "builtins and system calls" in md


@pytest.mark.slow
def test_profile_hops(tmp_path):
    """`llft bench profile --hops`: every hop of a request's path seen, for most of the
    requests traced (perf trace; where it cannot trace, the tool says why in one line)."""
    from llft.bench import hops
    why = hops.available()
    if why is not None:
        pytest.skip(why)
    out = str(tmp_path / "results")
    assert main(["bench", "profile", "--hops", "--replicas", "1", "--duration", "3",
                 "--results", out]) == 0
    rows = read_csv(os.path.join(out, "profile_hops.csv"))
    assert len(rows) == 9, rows
    n = {int(r["requests"]) for r in rows}
    assert len(n) == 1 and n.pop() >= 20


@pytest.mark.slow
def test_profile_marks(tmp_path):
    """`llft bench profile --marks`: the primary and the gateway write their marks at
    SIGUSR2 (LLFT_MARKS_DIR) and most requests are chained whole, untraced."""
    out = str(tmp_path / "results")
    assert main(["bench", "profile", "--marks", "--replicas", "1", "--duration", "2",
                 "--results", out]) == 0
    rows = read_csv(os.path.join(out, "profile_marks.csv"))
    hops = [r for r in rows if not r["hop"].startswith("baseline")]
    assert len(hops) == 8 + 4, rows
    n = {int(r["requests"]) for r in hops}
    assert len(n) == 1 and n.pop() >= 20
    # the machine's own wake-up, measured in the same run
    assert any(r["hop"].startswith("baseline") for r in rows), rows


def test_wakeup_baseline():
    """llft/bench/wakeup.py: a plain echo's wake-ups, one per round trip, in both
    arrangements (the other CPU only where there are two)."""
    from llft.bench import wakeup
    got = wakeup.measure(other_cpu=False, rounds=30)
    assert got is not None and got["n"] == 30 and 0 < got["median_us"] <= got["p90_us"]
    pinned = wakeup.measure(other_cpu=True, rounds=30)
    if len(os.sched_getaffinity(0)) >= 2:
        assert pinned is not None and pinned["n"] == 30
    else:
        assert pinned is None
