"""`llft bench echo`: 1 KB echo through llft against the same server direct and through a
plain one-hop forwarder, plus what the group costs when idle and after load.

Configurations, measured in ONE run (same machine, same moment):
  tcp        examples/echo.py (a plain threaded echo server), reached directly
  proxy      the same process through a plain asyncio TCP forwarder (one hop, no llft)
  proxy_x2   through two such forwarders in a row: the process hops of llft's path
             (client, gateway, the primary's agent, the app) with no protocol work, the
             floor of that shape on this machine (its wake-ups, its two extra hops)
  llft_Nr    N replicas under `llft run` (DEFAULT configuration), reached through
             `llft gateway` (N from `--replicas`, default 1,2,3)

One phase per replica count (its group started, measured interleaved with tcp and
proxy, stopped). Per phase:
  idle       agent CPU (% of one core, psutil cpu_times over `--idle-s` seconds, no load,
             once the gateway closed its idle group connection)
             and the group's datagrams/s meanwhile (agents' transport counters), and
             each agent's event-loop iterations a second (its wake-ups: `loop_waits`)
  latency    p50/p99 of `--rounds` 1 KB round trips, one client, interleaved in blocks
  throughput req/s with each of `--clients` request/reply clients (`--duration` s each),
             and CPU us per request of every process of the configuration (agents,
             apps, gateway; proxy and server for the baselines)
  after load datagrams/s the group sends in the first and in the second second after
             the last client stopped (a quiet group: back to its idle rate in the second)
  conn/req   req/s with each of `--conn-clients` clients opening a connection per
             request (connect, 1 KB, FIN, the echo, the server's close)
Ratios are to the proxy (the one-hop forwarder) measured in the same phase.

Writes `<results>/echo.csv`, `echo_idle.csv`, `echo.md` and `echo*.png`.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import psutil

from llft.bench import report
from llft.bench.service import Setup, measure_round_trips, measure_throughput
from llft.runtime import status

SIZE = 1024


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", default="1,2,3", help="llft group sizes to measure")
    p.add_argument("--rounds", type=int, default=2000, help="latency: timed round trips")
    p.add_argument("--warmup", type=int, default=100, help="latency: untimed round trips")
    p.add_argument("--blocks", type=int, default=5, help="latency: interleaved blocks")
    p.add_argument("--clients", default="1,16,64", help="throughput: concurrent clients")
    p.add_argument("--conn-clients", default="1,16",
                   help="connection per request: concurrent clients")
    p.add_argument("--duration", type=float, default=3.0,
                   help="throughput: seconds per configuration and client count")
    p.add_argument("--idle-s", type=float, default=10.0,
                   help="idle: seconds of CPU measurement with no load")
    p.add_argument("--heartbeat-ms", type=float, default=None,
                   help="heartbeat_ms of the llft clusters (default: the configuration's)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: replicas 1, 200 rounds, clients 1,16, 1 s, idle 3 s")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


# ------------------------------------------------------------------ processes --------
def _procs(setup: Setup, target) -> dict[str, psutil.Process]:
    """name -> process of everything serving `target` (an llft cluster: each agent, its
    app and the gateway; proxy: the forwarder and the server; tcp: the server)."""
    out: dict[str, psutil.Process] = {}

    def add(name, pid):
        try:
            out[name] = psutil.Process(pid)
        except psutil.Error:
            pass
    if target.cluster is not None:
        for name, p in target.cluster.procs.items():
            add(name, p.pid)
            try:
                for i, ch in enumerate(psutil.Process(p.pid).children(recursive=True)):
                    if "proctree" not in " ".join(ch.cmdline()):
                        out[f"{name}.app{i or ''}"] = ch
            except psutil.Error:
                pass
    else:
        add("server", setup.procs[0].pid)
        if target.name in ("proxy", "proxy_x2"):
            add("forwarder", setup.procs[1].pid)
        if target.name == "proxy_x2":
            add("forwarder2", setup.procs[2].pid)
    return out


def _cpu_s(procs: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for name, p in procs.items():
        try:
            t = p.cpu_times()
            out[name] = t.user + t.system
        except psutil.Error:
            out[name] = float("nan")
    return out


def _agents(target) -> list[dict]:
    lc = target.cluster
    return status.read_files(lc.cfg.status_dir(lc.group))[0]


def _datagrams(target) -> int:
    """Datagrams the group's agents sent so far (their status files' transport counters:
    the event loop's and the pulse thread's heartbeats, llft/runtime/pulse.py)."""
    return sum(a.get("transport", {}).get("sent_datagrams", 0)
               + a.get("transport", {}).get("pulse_sent", 0) for a in _agents(target))


def _loop_waits(target) -> dict[int, int]:
    """Each agent's event-loop iterations so far (llft/runtime/pulse.py, ParkingSelector),
    by birth."""
    return {a["birth"]: a.get("transport", {}).get("loop_waits", 0) for a in _agents(target)}


def _group_mark(target) -> tuple[int, set[int]]:
    """(highest view number, births) of the group's live agents now."""
    agents = _agents(target)
    return max((a.get("pvn") or 0 for a in agents), default=0), {a["birth"] for a in agents}


def _wait_status_fresh(target, after: float, timeout_s: float = 5.0,
                       gateways: bool = False) -> None:
    """Until every agent's (and with `gateways`, every gateway's) status file was
    written after monotonic time `after`."""
    lc = target.cluster
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agents, gws, _ = status.read_files(lc.cfg.status_dir(lc.group))
        files = agents + (gws if gateways else [])
        if agents and all(a.get("written_mono", 0) > after for a in files):
            return
        time.sleep(0.05)        # polling status files, bounded by the deadline


def _wait_gateway_idle(target, timeout_s: float = 10.0) -> None:
    """Until the gateway closed its idle group connection (gateway.IDLE_CLOSE_S after
    the set-up's probe request): idle is measured as a user's idle group is."""
    from llft.tools.cluster import ClusterError
    try:
        target.cluster.wait_status(
            lambda st: st["gateways"] and all(g["connections"] == 0 for g in st["gateways"]),
            timeout_s, "the gateway's idle group connection closed")
    except ClusterError:
        pass                    # measured anyway: the row then shows what an open one costs


def measure_idle(setup: Setup, target, seconds: float) -> dict:
    procs = {n: p for n, p in _procs(setup, target).items() if n.startswith("r")
             and "." not in n}
    procs["gateway"] = _procs(setup, target).get("gateway")
    procs = {n: p for n, p in procs.items() if p is not None}
    time.sleep(1.0)             # settle: the group just finished its set-up
    _wait_gateway_idle(target)
    t0 = time.monotonic()
    _wait_status_fresh(target, t0)
    d0, c0, l0, w0 = _datagrams(target), _cpu_s(procs), _loop_waits(target), time.monotonic()
    time.sleep(seconds)         # the measured idle interval itself
    t1 = time.monotonic()
    _wait_status_fresh(target, t1)
    d1, c1, l1, w1 = _datagrams(target), _cpu_s(procs), _loop_waits(target), time.monotonic()
    wall = w1 - w0
    agents = [100 * (c1[n] - c0[n]) / wall for n in procs if n != "gateway"]
    waits = [(l1[b] - l0[b]) / wall for b in l1 if b in l0]
    return {"agent_cpu_pct_max": max(agents), "agent_cpu_pct_mean": sum(agents) / len(agents),
            "gateway_cpu_pct": 100 * (c1["gateway"] - c0["gateway"]) / wall
            if "gateway" in procs else float("nan"),
            "datagrams_per_s": (d1 - d0) / wall,
            "agent_loop_wakeups_per_s": sum(waits) / len(waits) if waits else float("nan")}


def measure_after_load(target) -> tuple[float, float]:
    """Datagrams/s the group sent in the first and in the second second after the load
    stopped (the streams' ends and the last acknowledgements fall in the first; a quiet
    group is back to its idle rate in the second)."""
    t0 = time.monotonic()
    _wait_status_fresh(target, t0)
    marks = [(_datagrams(target), time.monotonic())]
    for _ in range(2):
        time.sleep(1.0)         # the measured interval itself
        t1 = time.monotonic()
        _wait_status_fresh(target, t1)
        marks.append((_datagrams(target), time.monotonic()))
    return tuple((d1 - d0) / (w1 - w0) for (d0, w0), (d1, w1) in zip(marks, marks[1:]))


# --------------------------------------------------------------------- command --------
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run(args) -> int:
    command = report.command_of(args, add_arguments, "echo")
    if args.quick:
        args.replicas, args.rounds, args.warmup, args.blocks = "1", 200, 20, 2
        args.clients, args.duration, args.idle_s = "1,16", 1.0, 3.0
        args.conn_clients = "1,16"
    replicas, clients = _ints(args.replicas), _ints(args.clients)
    conn_clients = _ints(args.conn_clients)
    rows: list[dict] = []
    idle_rows: list[dict] = []
    failed = []
    with tempfile.TemporaryDirectory(prefix="llft-bench-echo-") as tmp:
        setup = Setup(tmp, proxy=True, heartbeat_ms=args.heartbeat_ms, proxy_chain=True)
        try:
            for phase, r in enumerate(replicas):
                t = setup.add_cluster(r)
                targets = setup.baselines + [t]
                idle = {}
                if t.error is None:
                    idle = measure_idle(setup, t, args.idle_s)
                    idle_rows.append({"config": t.name, "replicas": r, **idle})
                mark = _group_mark(t) if t.error is None else None
                lat: dict = {}
                measure_round_trips(targets, [SIZE], os.urandom,
                                    lambda reply, req: reply == req, lambda s: f"{s} B",
                                    args.rounds, args.warmup, args.blocks, phase, lat)
                per: dict = {}
                for x in targets:
                    s = report.summarize_us(lat.get((phase, x.name, SIZE), []))
                    per[x.name] = {"config": x.name, "replicas": x.replicas, "phase": r,
                                   "p50_us": s["median_us"], "p99_us": s["p99_us"]}
                for c in clients:
                    cpus = {x.name: (_procs(setup, x), None) for x in targets}
                    acc: dict = {}
                    for x in targets:
                        if x.error is not None:
                            continue
                        procs = cpus[x.name][0]
                        c0 = _cpu_s(procs)
                        measure_throughput([x], [c], SIZE, args.duration, 1, phase, acc)
                        c1 = _cpu_s(procs)
                        a = acc.get((phase, x.name, c))
                        if a and a["elapsed_s"] > 0 and x.error is None:
                            per[x.name][f"rps_{c}"] = a["replies"] / a["elapsed_s"]
                            if a["replies"]:
                                per[x.name][f"cpu_us_per_req_{c}"] = "; ".join(
                                    f"{n}={1e6 * (c1[n] - c0[n]) / a['replies']:.0f}"
                                    for n in procs)
                    if idle_rows and t.cluster is not None and c == clients[-1]:
                        # also (especially) when the load failed: is the group quiet?
                        (idle_rows[-1]["after_load_datagrams_per_s"],
                         idle_rows[-1]["after_load_2nd_s_datagrams_per_s"]) = \
                            measure_after_load(t)
                for c in conn_clients:
                    acc = {}
                    for x in targets:
                        if x.error is not None:
                            continue
                        measure_throughput([x], [c], SIZE, args.duration, 1, phase, acc,
                                           mode="echo_conn")
                        a = acc.get((phase, x.name, c))
                        if a and a["elapsed_s"] > 0 and x.error is None:
                            per[x.name][f"conn_rps_{c}"] = a["replies"] / a["elapsed_s"]
                if mark is not None and t.cluster is not None:
                    # churn under load (false suspicions, resets): the view number and
                    # the births of the members, before the latency run and after the
                    # last load; a healthy group ends in the view it started in
                    pvn, births = _group_mark(t)
                    per[t.name]["view_changes"] = pvn - mark[0]
                    per[t.name]["replicas_replaced"] = len(births - mark[1])
                for x in targets:
                    per[x.name]["error"] = x.error or ""
                    rows.append(per[x.name])
                if t.error is not None:
                    failed.append(t)
                setup.stop_cluster(t)
        finally:
            setup.stop()
    # ratios to the forwarder of the same phase
    for row in rows:
        px = next((p for p in rows if p["phase"] == row["phase"] and p["config"] == "proxy"), None)
        if px and isinstance(row.get("p50_us"), float) and px.get("p50_us"):
            row["p50_vs_proxy"] = row["p50_us"] / px["p50_us"]
        # what llft adds beyond its process shape's floor (two forwarders in a row)
        px2 = next((p for p in rows if p["phase"] == row["phase"]
                    and p["config"] == "proxy_x2"), None)
        if (row["replicas"] and px2 and isinstance(row.get("p50_us"), float)
                and px2.get("p50_us")):
            row["p50_vs_proxy_x2"] = row["p50_us"] / px2["p50_us"]
        for k in [f"rps_{c}" for c in clients] + [f"conn_rps_{c}" for c in conn_clients]:
            if px and row.get(k) and px.get(k):
                row[f"{k}_vs_proxy"] = row[k] / px[k]
    cols = (["phase", "config", "replicas", "p50_us", "p99_us", "p50_vs_proxy",
             "p50_vs_proxy_x2"]
            + [k for c in clients for k in (f"rps_{c}", f"rps_{c}_vs_proxy")]
            + [k for c in conn_clients for k in (f"conn_rps_{c}", f"conn_rps_{c}_vs_proxy")]
            + ["view_changes", "replicas_replaced", "error"])
    table = report.Table("echo", f"1 KB echo: latency (1 client, {args.rounds} round trips) "
                         f"and throughput ({args.duration:g} s per client count); ratios to "
                         "the forwarder of the same phase", cols)
    for row in rows:
        table.add(**row)
    cpu_cols = ["phase", "config"] + [f"cpu_us_per_req_{c}" for c in clients]
    cpu_table = report.Table("echo_cpu", "CPU us per request, per process", cpu_cols)
    for row in rows:
        cpu_table.add(**row)
    idle_cols = ["config", "replicas", "agent_cpu_pct_max", "agent_cpu_pct_mean",
                 "agent_loop_wakeups_per_s",
                 "gateway_cpu_pct", "datagrams_per_s", "after_load_datagrams_per_s",
                 "after_load_2nd_s_datagrams_per_s"]
    idle_table = report.Table("echo_idle", f"Idle group ({args.idle_s:g} s, no load) and the "
                              "two seconds after the last load stopped", idle_cols)
    for row in idle_rows:
        idle_table.add(**row)
    for tb in (table, cpu_table, idle_table):
        tb.print()
        tb.write_csv(args.results)
    series = {}
    for name in dict.fromkeys(r["config"] for r in rows):
        pts = [(c, r[f"rps_{c}"]) for r in rows if r["config"] == name for c in clients
               if r.get(f"rps_{c}")]
        if name in ("tcp", "proxy", "proxy_x2"):   # pooled over phases: the first phase's
            pts = pts[:len(clients)]
        if pts:
            series[name] = ([x for x, _ in pts], [y for _, y in pts])
    png = report.plot(args.results, "echo", "1 KB echo throughput vs clients",
                      "concurrent clients", "requests per second", series,
                      logx=True, logy=True, xticks=clients)
    notes = ("Server: examples/echo.py (threaded). proxy: a plain asyncio TCP forwarder "
             "(one hop, no replication). proxy_x2: two of them in a row (llft's process "
             "hops, no protocol work). llft_Nr: N replicas under `llft run` with the "
             "DEFAULT configuration behind `llft gateway`. Idle CPU from psutil cpu_times "
             "of each agent; datagrams from the agents' transport counters. conn_rps_N: N "
             "clients, each request on a connection of its own. view_changes, replicas_replaced: "
             "the group's view number and new member births from before the latency run "
             "to after the last load (0 and 0: no false suspicion, no reset under load).")
    if failed:
        notes += "\n\nFailed: " + "; ".join(f"{t.name}: {t.detail}" for t in failed)
    md = report.write_markdown(args.results, "echo", [table.markdown(), cpu_table.markdown(),
                                                      idle_table.markdown()],
                               notes=notes, plots=[png], command=command)
    print(f"wrote {md}")
    return 1 if failed else 0
