"""`llft bench join`: how long a replica takes to join a group, against the group's age.

A joiner receives the group's whole log (delivered inputs and order information since
the group started, llft/replica/node.py) and replays it before it is `ready`
(docs/LOG.md): join time grows with the group's age until the log is trimmed at
checkpoints (the design in docs/LOG.md). This bench shows that growth and compares the
replay with the time the original run took, measured in the same run.

One LocalCluster, with `--workload ticker` (`llft run -- python examples/ticker.py TICK_MS
WORK`: order info every tick, WORK iterations of arithmetic per tick) or `--workload http`
(examples/http_counter.py, the stdlib's threading HTTP server, behind `llft gateway`, with
`--clients` clients making one connection per request all along: a history of thousands
of short connections, each a stream the joiner's agent connects to its app in order). The
founder runs; at each age in
`--ages` (seconds since the founder's view started) a new replica is started, and from
its status file's events (CLOCK_MONOTONIC, system-wide):

    transfer_s   start of `llft run` -> `restored` (membership, the state transfer)
    replay_s     `restored` -> `ready` (its application replayed the history)
    join_s       start -> `ready`
    replay_ratio replay_s / age_s: the replay against the original run's duration

then it is stopped (SIGTERM) and the group is back to one member before the next age.
Writes `<results>/join.csv`, `join.md`, `join.png` (times against age, with the
original run's duration as the reference line).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

from llft import EXAMPLES_DIR
from llft.bench import report
from llft.tools.cluster import LocalCluster
from llft.tools.loadclient import BackgroundLoad

TICKER = os.path.join(EXAMPLES_DIR, "ticker.py")
HTTP_COUNTER = os.path.join(EXAMPLES_DIR, "http_counter.py")
JOIN_TIMEOUT_S = 180.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ages", default="5,10,15,20",
                   help="group ages (s) at which a replica joins")
    p.add_argument("--tick-ms", type=float, default=1.0, help="the ticker's period")
    p.add_argument("--work", type=int, default=2000,
                   help="iterations of arithmetic per tick (computation a joiner redoes)")
    p.add_argument("--workload", choices=("ticker", "http"), default="ticker",
                   help="the group's application (see the module's doc)")
    p.add_argument("--clients", type=int, default=2,
                   help="http: clients, one connection per request, during the whole run")
    p.add_argument("--quick", action="store_true", help="smoke run: ages 2,5")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def _events(lc: LocalCluster, birth: int) -> list[dict]:
    path = os.path.join(lc.cfg.status_dir(lc.group), f"{birth:x}.json")
    try:
        with open(path) as f:
            return json.load(f)["events"]
    except (OSError, ValueError, KeyError):
        return []


def _first(evs: list[dict], kind: str) -> dict | None:
    return next((e for e in evs if e["event"] == kind), None)


def _joiner_ready(lc: LocalCluster, name: str) -> tuple[int, list[dict]]:
    """The member `name` runs as, once it is ready, and its events."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:
        for m in lc.status()["members"]:
            if lc.name_of(m["agent_pid"]) == name and m["sync"] == "ready":
                evs = _events(lc, m["birth"])
                if _first(evs, "ready"):
                    return m["birth"], evs
        if time.monotonic() > deadline:
            resets = lc.log_tail(name, 10**7).count(" reset (")
            raise TimeoutError(f"{name} not ready in {JOIN_TIMEOUT_S:.0f} s ({resets} resets "
                               "while joining)")
        time.sleep(0.05)             # polling status files, with a deadline


def measure(args, tmp: str, table: report.Table) -> None:
    ages = [float(a) for a in args.ages.split(",") if a.strip()]
    if args.workload == "http":
        cmd = [sys.executable, HTTP_COUNTER, "9000"]
    else:
        cmd = [sys.executable, TICKER, f"{args.tick_ms:g}", str(args.work)]
    load = None
    with LocalCluster(tmp, group=args.workload) as lc:
        lc.start_replica("founder", cmd)
        st = lc.wait_members(1)
        if args.workload == "http":
            host, port = lc.start_gateway()
            stop = threading.Event()
            load = BackgroundLoad(host, port, after=1, clients=args.clients,
                                  requests=10 ** 9, mode="http", stop=stop, timeout_s=60)
        founder = st["members"][0]
        view = _first(_events(lc, founder["birth"]), "view")
        t0 = view["mono"]
        for i, age in enumerate(sorted(ages)):
            while time.monotonic() - t0 < age:
                time.sleep(0.05)     # the group ages (this is what is measured against)
            name = f"joiner{i}"
            started = time.monotonic()
            requests = load.replies() if load is not None else None   # the history's
            lc.start_replica(name, cmd)
            birth, evs = _joiner_ready(lc, name)
            restored, ready = _first(evs, "restored"), _first(evs, "ready")
            prim = next(m for m in lc.status()["members"] if m["rank"] == 1)
            real_age = started - t0
            replay = ready["mono"] - restored["mono"]
            table.add(age_s=round(real_age, 1), history_entries=restored.get("entries"),
                      log_mib=round(((prim.get("log") or {}).get("order_info_bytes") or 0)
                                    / 2**20, 2),
                      transfer_s=round(restored["mono"] - started, 3),
                      replay_s=round(replay, 3), join_s=round(ready["mono"] - started, 3),
                      replay_ratio=round(replay / real_age, 4))
            if load is not None:
                table.rows[-1]["requests"] = requests
            lc.kill(name, sig=15)    # SIGTERM: back to one member for the next age
            lc.wait_members(1)
        if load is not None:
            stop.set()
            r = load.result(120)
            if r.error_count:
                raise RuntimeError(f"the http clients failed: {r.errors[:2]}")


def run(args) -> int:
    command = report.command_of(args, add_arguments, "join")
    if args.quick:
        args.ages = "2,5"
    what = (f"http: examples/http_counter.py, {args.clients} clients, a connection per "
            "request" if args.workload == "http" else
            f"ticker: tick {args.tick_ms:g} ms, {args.work} iterations per tick")
    name = "join" if args.workload == "ticker" else f"join_{args.workload}"
    table = report.Table(
        name, f"Join time against the group's age ({what}; the baseline is the original "
        "run: age_s)",
        ["age_s"] + (["requests"] if args.workload == "http" else [])
        + ["history_entries", "log_mib", "transfer_s", "replay_s", "join_s", "replay_ratio"])
    error = ""
    with tempfile.TemporaryDirectory(prefix="llft-bench-join-") as tmp:
        try:
            measure(args, tmp, table)
        except (TimeoutError, RuntimeError) as e:
            error = str(e)
    table.print()
    if error:
        print(f"llft bench join: {error}", file=sys.stderr)
    table.write_csv(args.results)
    xs = [r["age_s"] for r in table.rows]
    plots = [report.plot(
        args.results, name, f"Join time vs group age ({args.workload})", "group age (s)",
        "seconds",
        {"join (start to ready)": (xs, [r["join_s"] for r in table.rows]),
         "state transfer": (xs, [r["transfer_s"] for r in table.rows]),
         "replay": (xs, [r["replay_s"] for r in table.rows]),
         "original run (age)": (xs, xs)})] if table.rows else []
    slope = report.fit_slope(xs, [r["join_s"] for r in table.rows]) if len(xs) > 1 else 0.0
    ratios = sorted(r["replay_ratio"] for r in table.rows)
    ratio = ratios[len(ratios) // 2] if ratios else float("nan")
    notes = (f"Join time grows by {slope:.3f} s per second of group age (least squares): a "
             "joiner receives and replays the group's whole log. The replay took "
             f"{ratio:.2f} x the original run's duration (median replay_ratio; a replaying "
             "backup does not wait out recorded sleeps, so it is faster than the original "
             "when it gets the CPU the primary got; load average at the end "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores). docs/LOG.md: the "
             "log's cap, and the design that bounds join time."
             + (f"\n\nError: {error}" if error else ""))
    report.write_markdown(args.results, name, [table.markdown()], notes, plots=plots,
                          command=command)
    return 1 if error or not table.rows else 0
