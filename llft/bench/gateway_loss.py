"""`llft bench gateway-loss`: what the clients of one gateway see when ANOTHER gateway of the
same group dies for good (its host lost; SIGKILL, never restarted).

Clients on several hosts each run their own `llft gateway`; all of them are connections
of the one server group. A dead gateway's connection pins the group watermark (the
group cannot know what it had in flight), so every other connection's window fills and
its clients wait until the group's primary, having heard nothing from the dead gateway
for `remote_timeout_ms` (3 s by default), takes it for gone and frees its connection
(docs/DESIGN.md, "A group connection carries streams"). This bench measures that wait,
with the default configuration.

Per run: a LocalCluster of `--replicas` replicas of examples/echo.py started together,
gateways A and B. Two clients hold connections open through A. `--clients` closed-loop
clients send 1 KB requests through B, each on its own long connection
(llft.tools.loadclient, echo mode: every reply checked), and the time of every reply is
kept. After `--before-s` seconds A is SIGKILLed; the clients go on for
`--after-s` seconds. Per run:

    before_rps   B's replies per second in the 2 s before the kill (the same run's
                 baseline)
    after_rps    ... in the last 2 s (back to normal?)
    stall_ms     the longest gap between two of B's replies after the kill
    stall_at_ms  when it began, after the kill (B's window filling)
    freed_ms     kill -> A's connection freed at every replica (status files, polled
                 every 50 ms)
    views        view changes of the server group during the run (none expected)

Writes `<results>/gateway_loss.csv`, `gateway_loss.md`, `gateway_loss.png` (B's replies
per 100 ms around the kill, one line per run).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import threading
import time

from llft import EXAMPLES_DIR
from llft.bench import report
from llft.tools.cluster import ClusterError, LocalCluster
from llft.tools.loadclient import BackgroundLoad

ECHO = [sys.executable, os.path.join(EXAMPLES_DIR, "echo.py"), "9000"]
SIZE = 1024
BIN_S = 0.1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=3, help="gateway losses (a fresh group each)")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--clients", type=int, default=4, help="closed-loop clients of gateway B")
    p.add_argument("--before-s", type=float, default=3.0, help="load before the kill")
    p.add_argument("--after-s", type=float, default=8.0, help="load after the kill")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 run, 2 replicas")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def _freed_counts(st: dict) -> dict[int, int]:
    """Group connections freed so far, per replica (birth id)."""
    return {m["birth"]: m["group_connections"]["freed"] for m in st["members"]}


def one_run(workdir: str, args) -> dict:
    with LocalCluster(workdir, group="echo") as lc:
        for i in range(args.replicas):
            lc.start_replica(f"r{i + 1}", ECHO)
        lc.wait_members(args.replicas, timeout_s=120)
        a = lc.start_gateway("gwA")
        b = lc.start_gateway("gwB")
        view = lc.status()["view"]
        held = [socket.create_connection(a, timeout=30) for _ in range(2)]
        for s in held:
            s.sendall(b"hello")
            s.recv(16)
        stop = threading.Event()
        load = BackgroundLoad(b[0], b[1], after=1, clients=args.clients, requests=10 ** 9,
                              mode="echo", size=SIZE, timeout_s=60, stop=stop)
        load.under_way.wait(60)
        stop.wait(args.before_s)                # (a duration of the load, not a sync)
        before = _freed_counts(lc.status())
        t_kill = time.monotonic()
        os.kill(lc.procs["gwA"].pid, signal.SIGKILL)
        lc.procs["gwA"].wait()
        try:
            lc.wait_status(lambda st: _freed_counts(st).keys() == before.keys() and all(
                n > before[birth] for birth, n in _freed_counts(st).items()),
                args.after_s, "the dead gateway's connection freed at every replica")
            freed_ms = (time.monotonic() - t_kill) * 1000
        except ClusterError:
            freed_ms = float("nan")
        stop.wait(max(0.0, t_kill + args.after_s - time.monotonic()))
        stop.set()
        result = load.result(120)
        for s in held:
            s.close()
        st = lc.status()
    replies = sorted(recv for times in result.reply_times for _, recv in times)
    after = [x for x in replies if x >= t_kill]
    gaps = [(y - x, x - t_kill) for x, y in zip([t_kill] + after, after)]
    stall, stall_at = max(gaps) if gaps else (float("nan"), float("nan"))
    end = t_kill + args.after_s
    return {
        "replicas": args.replicas, "clients": args.clients,
        "before_rps": sum(1 for x in replies if t_kill - 2 <= x < t_kill) / 2,
        "after_rps": sum(1 for x in replies if end - 2 <= x < end) / 2,
        "stall_ms": stall * 1000, "stall_at_ms": stall_at * 1000, "freed_ms": freed_ms,
        "views": st["view"] != view, "errors": len(result.errors),
        "_since_kill": [x - t_kill for x in replies if t_kill - 1 <= x < end]}


def run(args) -> int:
    command = report.command_of(args, add_arguments, "gateway-loss")
    if args.quick:
        args.runs, args.replicas, args.after_s = 1, 2, 6.0
    table = report.Table("gateway_loss", "Another gateway of the group dies for good: "
                         "gateway B's clients", ["run", "replicas", "clients", "before_rps",
                                                 "after_rps", "stall_ms", "stall_at_ms",
                                                 "freed_ms", "views", "errors"])
    series = {}
    with tempfile.TemporaryDirectory(prefix="llft-gwloss-") as tmp:
        for i in range(args.runs):
            row = one_run(os.path.join(tmp, f"run{i}"), args)
            since_kill = row.pop("_since_kill")
            table.add(run=i + 1, **row)
            bins: dict[int, int] = {}
            for x in since_kill:
                k = int((x + 1) // BIN_S)
                bins[k] = bins.get(k, 0) + 1
            ks = range(0, int((args.after_s + 1) / BIN_S))
            series[f"run{i + 1}"] = ([k * BIN_S - 1 for k in ks],
                                      [bins.get(k, 0) / BIN_S for k in ks], "-")
    table.print()
    table.write_csv(args.results)
    plot = report.timelines(args.results, "gateway_loss",
                            "Gateway B's replies when gateway A dies (t = 0)",
                            "seconds after the kill", "replies / s", series,
                            {"kill": [0.0]})
    md = report.write_markdown(args.results, "gateway_loss", [table.markdown()], plots=[plot],
                               command=command, notes=(
        "remote_timeout_ms at its default (3 s): the server primary takes a gateway it "
        "has not heard from this long for gone. stall_ms is the clients' wait; "
        "before_rps, measured in the same run, is their rate before the kill."))
    print(f"wrote {md}")
    ok = all(not r["views"] and not r["errors"] and r["freed_ms"] == r["freed_ms"]
             for r in table.rows)
    return 0 if ok else 1
