"""`llft bench failover`: fault detection, primary view change and backup addition latency.

Real OS processes (`python -m llft.tools.membership_demo`, one replica each) on loopback multicast,
for groups of 2 and 3 replicas. One cycle:

  1. SIGKILL the primary (t_kill, this process's CLOCK_MONOTONIC, which is system-wide);
  2. detection: the first status change of the rank-2 backup after the kill (it starts
     proposing itself, or is already primary) -- t_detect;
  3. primary view change: until that replica reports status "primary" in a new view
     whose membership every survivor reports -- t_view (phase 1 + phase 2, which is
     immediate here: membership only, no inter-group connections);
  4. backup addition: a new replica process is started and joins; latency from its
     first status ("joining") to its status "backup" in the primary's membership.

Each replica stamps its status lines with CLOCK_MONOTONIC (`mono`), so the figures do
not include pipe or scheduling delays of this process. The paper's figures: detection
about 30 ms; primary view change under 50 us with two replicas.

Client-visible pause (the replicated service): a LocalCluster of 2 and of 3 replicas
(`llft run -- python examples/kv_counter.py`, `--service-replicas`) behind `llft
gateway` serves 4 counter clients (llft.tools.loadclient, every reply checked: exactly once,
in order). The primary's agent is SIGKILLed `--service-kills` times; after each kill,
once a new primary's application is promoted, the killed replica is restarted with `llft
run` and the bench waits until it is a member again (LocalCluster.wait_members), so the
group keeps its size, and until the clients got more replies, before the next kill. Per
kill: view_ms, kill to the new primary's view event (agent status file, `mono`
timestamps, CLOCK_MONOTONIC like the kill's); promoted_ms, kill to its application
promoted (backup caught up, now live); pause_ms, the longest gap between two replies of
any client that overlaps the time from the kill to the restart (client-visible pause);
rejoin_ms and rejoin_pause_ms, the restart until the new member is in the view, and the
longest reply gap overlapping that time (state transfer). steady_gap_ms is the longest
gap before the first kill, for comparison.

Writes `<results>/failover.csv` (membership, median [min-max] per size),
`failover_runs.csv` (every run), `failover_service.csv`, `failover_service_kills.csv`
(every kill), `failover.md`, `failover.png` (medians against the number of replicas)
and `failover_view_change.png` (the membership's primary view change against replicas).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

from llft import EXAMPLES_DIR
from llft.bench import report
from llft.bench.service import cluster_settings
from llft.runtime import keys
from llft.runtime.config import default_heartbeat_ms
from llft.tools.procs import ProcGroup, random_group_addresses

STARTUP_TIMEOUT_S = 30.0
CHANGE_TIMEOUT_S = 10.0
SERVICE_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0               # a client waiting longer for a reply gives up
REPLIES_BETWEEN_KILLS = 200          # the clients must be served again before the next kill
KV_COUNTER = os.path.join(EXAMPLES_DIR, "kv_counter.py")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=10, help="failovers per group size")
    p.add_argument("--replicas", default="2,3")
    p.add_argument("--heartbeat-ms", type=float, default=None,
                   help="membership part (default: timeout / 5, as the configuration's)")
    p.add_argument("--timeout-ms", type=float, default=25.0)
    p.add_argument("--service-kills", type=int, default=5,
                   help="primary kills per group size in the replicated-service part")
    p.add_argument("--service-replicas", default="2,3",
                   help="group sizes of the replicated service (empty: skip that part)")
    p.add_argument("--service-timeout-ms", type=float, default=100.0,
                   help="fault_timeout_ms of the replicated service's cluster (the agents "
                   "and their applications share 2 cores here: 25 ms gives false suspicions; "
                   "100 ms is the configuration's default)")
    p.add_argument("--service-heartbeat-ms", type=float, default=None,
                   help="heartbeat_ms of the replicated service's cluster (default: the "
                   "configuration's, fault_timeout_ms / 5)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 runs, 2 service kills")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


class Cluster:
    def __init__(self, tmp: str, args, group: str = "bench"):
        self.key_path = os.path.join(tmp, "cluster.key")
        if not os.path.exists(self.key_path):
            keys.write_key(self.key_path)
        self.addresses = random_group_addresses([group])
        self.group = group
        self.args = args
        self.pg = ProcGroup(tmp)
        self.n = 0
        self.alive: list[str] = []

    def start_replica(self) -> str:
        self.n += 1
        name = f"r{self.n}"
        self.pg.python(name, "llft.tools.membership_demo", "--group", self.group, "--key", self.key_path,
                       "--addresses", self.addresses, "--heartbeat-ms", str(self.args.heartbeat_ms),
                       "--timeout-ms", str(self.args.timeout_ms))
        self.alive.append(name)
        return name

    def last_status(self, name: str) -> dict | None:
        return next((e for e in reversed(self.pg.procs[name].events) if e.get("event") == "status"),
                    None)

    def settled(self, size: int) -> bool:
        """One primary, every live replica a member of its view."""
        st = [self.last_status(n) for n in self.alive]
        if any(s is None for s in st):
            return False
        prim = [s for s in st if s["status"] == "primary"]
        if len(prim) != 1 or len(prim[0]["members"]) != size:
            return False
        view = (prim[0]["pvn"], prim[0]["members"])
        return all((s["pvn"], s["members"]) == view and s["status"] in ("primary", "backup")
                   for s in st)

    def primary(self) -> str:
        return next(n for n in self.alive if self.last_status(n)["status"] == "primary")

    def kill(self, name: str) -> float:
        t = time.monotonic()
        os.kill(self.pg.procs[name].popen.pid, signal.SIGKILL)
        self.alive.remove(name)
        return t

    def stop(self) -> None:
        self.pg.stop_all()


def one_size(tmp: str, args, size: int) -> list[dict]:
    c = Cluster(tmp, args, group=f"bench{size}")
    rows = []
    try:
        for _ in range(size):
            c.start_replica()
            c.pg.wait(lambda: c.last_status(c.alive[-1]) is not None
                      and c.last_status(c.alive[-1])["status"] in ("primary", "backup"),
                      STARTUP_TIMEOUT_S)
        if not c.pg.wait(lambda: c.settled(size), STARTUP_TIMEOUT_S):
            raise RuntimeError(f"group of {size} did not form")
        for run in range(args.runs):
            old = c.primary()
            old_pvn = c.last_status(old)["pvn"]
            marks = {n: len(c.pg.procs[n].events) for n in c.alive if n != old}
            t_kill = c.kill(old)

            def new_primary():
                # usually the rank-2 backup; on a loaded machine another may get there first
                return next((n for n in marks if n in c.alive
                             and (c.last_status(n) or {}).get("status") == "primary"
                             and c.last_status(n)["pvn"] > old_pvn), None)
            if not c.pg.wait(lambda: c.settled(size - 1) and new_primary() is not None,
                             CHANGE_TIMEOUT_S):
                raise RuntimeError(f"no new primary after killing {old}")
            successor = new_primary()
            after = [e for e in c.pg.procs[successor].events[marks[successor]:]
                     if e.get("event") == "status"]
            t_detect = after[0]["mono"]
            t_view = next(e["mono"] for e in after if e["status"] == "primary")
            # backup addition: a fresh replica joins
            new = c.start_replica()
            if not c.pg.wait(lambda: c.settled(size), STARTUP_TIMEOUT_S):
                raise RuntimeError("new replica was not added")
            ev = [e for e in c.pg.procs[new].events if e.get("event") == "status"]
            t_join0 = ev[0]["mono"]
            t_backup = next(e["mono"] for e in ev if e["status"] == "backup")
            rows.append({"replicas": size, "run": run,
                         "detection_ms": (t_detect - t_kill) * 1e3,
                         "view_change_us": (t_view - t_detect) * 1e6,
                         "failover_ms": (t_view - t_kill) * 1e3,
                         "add_backup_ms": (t_backup - t_join0) * 1e3})
    finally:
        c.stop()
    return rows


# ------------------------------------------------------- the replicated service -------
def _agent_events(lc, birth: int) -> list[dict]:
    path = os.path.join(lc.cfg.status_dir(lc.group), f"{birth:x}.json")
    try:
        with open(path) as f:
            return json.load(f).get("events", [])
    except (OSError, ValueError):
        return []


def _last_lines(text: str, n: int = 2) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(empty)"


def _wait(predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        v = predicate()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.01)                 # polling status files / counters, with a deadline


def _gaps(reply_times: list[list[tuple[float, float]]], start: float):
    """Per client, (previous reply, this reply) receive times, the first from `start`."""
    for times in reply_times:
        prev = start
        for _, recv in times:
            yield prev, recv
            prev = recv


def _longest_gap(reply_times, start: float, lo: float, hi: float) -> float:
    """Longest gap between consecutive replies of one client that overlaps [lo, hi]."""
    return max((b - a for a, b in _gaps(reply_times, start) if b > lo and a < hi), default=0.0)


def service_size(tmp: str, args, size: int) -> tuple[list[dict], dict]:
    from llft.tools.cluster import LocalCluster
    from llft.tools.loadclient import run_load
    extra = cluster_settings(fault_timeout_ms=args.service_timeout_ms,
                             heartbeat_ms=args.service_heartbeat_ms)
    lc = LocalCluster(os.path.join(tmp, f"service{size}"), group=f"counter{size}",
                      service_port=9000, extra_cluster=extra)
    cmd = [sys.executable, KV_COUNTER, "9000"]
    stop = threading.Event()
    replies = [0]
    lock = threading.Lock()
    result: dict = {}

    def on_reply(_client, _n):
        with lock:
            replies[0] += 1

    def served_more(than: int, what: str) -> None:
        if not _wait(lambda: replies[0] >= than + REPLIES_BETWEEN_KILLS or not load.is_alive(),
                     SERVICE_TIMEOUT_S) or not load.is_alive():
            r = result.get("r")
            why = result.get("error") or (r.errors[0] if r is not None and r.errors
                                          else "load ended" if r is not None else "timeout")
            raise RuntimeError(f"clients not served {what} ({replies[0]} replies; {why})")

    def load_main(host, port):
        try:
            result["r"] = run_load(host, port, clients=4, requests=10 ** 9, mode="counter",
                                   timeout_s=REPLY_TIMEOUT_S, stop=stop, on_reply=on_reply)
        except Exception as e:           # noqa: BLE001 -- reported below
            result["error"] = f"{type(e).__name__}: {e}"

    kills: list[dict] = []
    load = None
    try:
        for i in range(1, size + 1):
            lc.start_replica(f"r{i}", cmd)
            lc.wait_members(i, timeout_s=SERVICE_TIMEOUT_S)
        host, port = lc.start_gateway()
        load = threading.Thread(target=load_main, args=(host, port), daemon=True)
        load.start()
        served_more(0, "before the first kill")
        for k in range(args.service_kills):
            old = lc.primary()
            name = lc.name_of(old["agent_pid"]) if old else None
            if name is None:
                raise RuntimeError(f"no primary of ours to kill: {lc.status()}")
            t_kill = time.monotonic()
            os.kill(lc.procs[name].pid, signal.SIGKILL)
            lc.procs[name].wait(timeout=30)
            new = lc.wait_primary(other_than=old["birth"], timeout_s=SERVICE_TIMEOUT_S)
            evs = _wait(lambda: [e for e in _agent_events(lc, new["birth"])
                                 if e.get("mono", 0) > t_kill
                                 and e.get("event") in ("view", "promoted")]
                        if any(e.get("event") == "promoted" and e.get("mono", 0) > t_kill
                               for e in _agent_events(lc, new["birth"])) else None, 5.0) or []
            t_view = next((e["mono"] for e in evs if e["event"] == "view" and e.get("primary")),
                          None)
            t_prom = next((e["mono"] for e in evs if e["event"] == "promoted"), None)
            t_restart = time.monotonic()
            lc.start_replica(f"{name}k{k + 1}", cmd)
            lc.wait_members(size, timeout_s=SERVICE_TIMEOUT_S)
            t_member = time.monotonic()
            kills.append({"replicas": size, "kill": k + 1, "t_kill": t_kill,
                          "t_restart": t_restart, "t_member": t_member,
                          "view_ms": (t_view - t_kill) * 1e3 if t_view else float("nan"),
                          "promoted_ms": (t_prom - t_kill) * 1e3 if t_prom else float("nan"),
                          "rejoin_ms": (t_member - t_restart) * 1e3})
            served_more(replies[0], f"after kill {k + 1}")
    except Exception as e:
        logs = "; ".join(f"{n}.log: {_last_lines(lc.log_tail(n))}" for n in lc.logs)
        raise RuntimeError(f"{str(e)[:300]} [{logs}]") from None
    finally:
        stop.set()
        if load is not None:
            load.join(timeout=SERVICE_TIMEOUT_S + 10)
        lc.stop()
    r = result.get("r")
    if r is None:
        raise RuntimeError(f"load client: {result.get('error', 'did not finish')}")
    first = kills[0]["t_kill"] if kills else r.started + r.elapsed_s
    for row in kills:
        row["pause_ms"] = _longest_gap(r.reply_times, r.started, row["t_kill"],
                                       row["t_restart"]) * 1e3
        row["rejoin_pause_ms"] = _longest_gap(r.reply_times, r.started, row["t_restart"],
                                              row["t_member"]) * 1e3
    steady = max((b - a for a, b in _gaps(r.reply_times, r.started)
                  if a > r.started + 0.2 and b < first), default=float("nan"))
    info = {"replicas": size, "kills": len(kills), "replies": r.replies,
            "errors": r.error_count, "first_error": r.errors[0] if r.errors else "",
            "steady_gap_ms": steady * 1e3}
    return kills, info


def _cell(values: list[float]) -> str:
    v = [x for x in values if x == x]
    if not v:
        return "-"
    return f"{statistics.median(v):.3g} [{min(v):.3g}-{max(v):.3g}]"


def _median(values: list[float]) -> float:
    v = [x for x in values if x == x]
    return statistics.median(v) if v else float("nan")


def _plots(args, raw: report.Table, kills: report.Table) -> list[str | None]:
    """The paper's failover figures: latencies against the number of replicas (medians)."""
    def by_size(table: report.Table, col: str) -> tuple[list, list]:
        sizes = sorted({r["replicas"] for r in table.rows if col in r})
        return sizes, [_median([r[col] for r in table.rows if r["replicas"] == n and col in r])
                       for n in sizes]
    series = {}
    if raw.rows:
        series["detection (membership)"] = by_size(raw, "detection_ms")
        series["failover (membership)"] = by_size(raw, "failover_ms")
    if kills.rows:
        series["service: kill to new view"] = by_size(kills, "view_ms")
        series["service: kill to promoted"] = by_size(kills, "promoted_ms")
        series["service: client-visible pause"] = by_size(kills, "pause_ms")
    sizes = sorted({n for xs, _ in series.values() for n in xs})
    out = [report.plot(args.results, "failover", "Failover latency vs replicas (medians)",
                       "replicas", "latency (ms)", series, xticks=sizes)] if series else []
    if raw.rows:
        xs, ys = by_size(raw, "view_change_us")
        out.append(report.plot(args.results, "failover_view_change", "Primary view change "
                               "latency vs replicas (membership, median)", "replicas",
                               "view change (us)", {"view change": (xs, ys)}, xticks=xs))
    return out


def run(args) -> int:
    command = report.command_of(args, add_arguments, "failover")
    if args.quick:
        args.runs, args.service_kills = 2, 2
    if args.heartbeat_ms is None:
        args.heartbeat_ms = default_heartbeat_ms(args.timeout_ms)
    svc_hb = args.service_heartbeat_ms or default_heartbeat_ms(args.service_timeout_ms)
    sizes = [int(s) for s in args.replicas.split(",") if s.strip()]
    svc_sizes = [int(s) for s in args.service_replicas.split(",") if s.strip()]
    raw = report.Table("failover_runs", "Failover runs", ["replicas", "run", "detection_ms",
                       "view_change_us", "failover_ms", "add_backup_ms"])
    table = report.Table("failover", f"Failover latency (median [min-max] of {args.runs} runs; "
                         f"heartbeat {args.heartbeat_ms:g} ms, base timeout {args.timeout_ms:g} ms)",
                         ["replicas", "detection_ms", "view_change_us", "failover_ms",
                          "add_backup_ms", "paper", "error"])
    kills = report.Table("failover_service_kills", "Replicated service: primary kills",
                         ["replicas", "kill", "view_ms", "promoted_ms", "pause_ms",
                          "rejoin_ms", "rejoin_pause_ms"])
    service = report.Table(
        "failover_service", f"Replicated service (kv_counter, 4 counter clients through the "
        f"gateway; heartbeat {svc_hb:g} ms, fault timeout "
        f"{args.service_timeout_ms:g} ms): client-visible pause per primary kill, "
        f"median [min-max] of {args.service_kills} kills (ms)",
        ["replicas", "kills", "view_ms", "promoted_ms", "pause_ms", "steady_gap_ms",
         "rejoin_ms", "rejoin_pause_ms", "replies", "client_errors", "error"])
    failed = False
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="llft-bench-failover-") as tmp:
        for size in sizes:
            try:
                rows = one_size(tmp, args, size)
            except Exception as e:          # noqa: BLE001 -- reported in the table
                failed = True
                msg = f"{type(e).__name__}: {e}".replace("\n", " ")
                print(f"llft bench failover: membership with {size} replicas failed: {msg}",
                      file=sys.stderr)
                table.add(replicas=size, error=msg[:200])
                failures.append(f"membership, {size} replicas: {msg}")
                continue
            for r in rows:
                raw.add(**r)

            def cell(k):
                v = [r[k] for r in rows]
                return f"{statistics.median(v):.3g} [{min(v):.3g}-{max(v):.3g}]"
            table.add(replicas=size, detection_ms=cell("detection_ms"),
                      view_change_us=cell("view_change_us"), failover_ms=cell("failover_ms"),
                      add_backup_ms=cell("add_backup_ms"),
                      paper="~30 ms detection; <50 us view change" if size == 2
                      else "~30 ms detection")
        for size in svc_sizes:
            try:
                rows, info = service_size(tmp, args, size)
            except Exception as e:          # noqa: BLE001 -- reported in the table
                failed = True
                msg = f"{type(e).__name__}: {e}".replace("\n", " ")
                print(f"llft bench failover: service with {size} replicas failed: {msg}",
                      file=sys.stderr)
                service.add(replicas=size, kills=0, error=msg[:200])
                failures.append(f"{size} replicas: {msg}")
                continue
            for r in rows:
                kills.add(**r)
            failed = failed or info["errors"] > 0
            service.add(replicas=size, kills=info["kills"],
                        view_ms=_cell([r["view_ms"] for r in rows]),
                        promoted_ms=_cell([r["promoted_ms"] for r in rows]),
                        pause_ms=_cell([r["pause_ms"] for r in rows]),
                        steady_gap_ms=info["steady_gap_ms"],
                        rejoin_ms=_cell([r["rejoin_ms"] for r in rows]),
                        rejoin_pause_ms=_cell([r["rejoin_pause_ms"] for r in rows]),
                        replies=info["replies"], client_errors=info["errors"],
                        error=info["first_error"])
    sections = []
    if sizes:
        table.print()
        raw.write_csv(args.results)
        table.write_csv(args.results)
        sections.append(table.markdown())
    if svc_sizes:
        kills.print()
        service.print()
        kills.write_csv(args.results)
        service.write_csv(args.results)
        sections.append(service.markdown())
    plots = _plots(args, raw, kills)
    md = report.write_markdown(args.results, "failover", sections, plots=plots, command=command,
                               notes=(
        "Detection: SIGKILL of the primary to the rank-2 backup's first reaction. View "
        "change: that reaction to its status 'primary' (membership only, no connections: "
        "phase 2 is immediate). Add backup: a new replica's first status to 'backup' "
        "(includes the State transfer, empty here). A view change of 0 us happened inside "
        "one event-loop turn of the new primary (2 replicas: no acknowledgments to wait "
        "for), below the resolution of the status lines the replicas print.\n\n"
        "Replicated service: `llft run` agents with examples/kv_counter.py, SIGKILL of the "
        "primary's agent (its application dies with it). view_ms: kill to the new "
        "primary's view event; promoted_ms: kill to its application promoted (replayed "
        "what it was given, now live); pause_ms: longest gap between two replies of any "
        "client overlapping kill..restart; steady_gap_ms: longest gap before the first "
        "kill; rejoin_ms: restart of the killed replica (`llft run`) until it is a member "
        "with a running application; rejoin_pause_ms: longest reply gap during that. "
        "Every reply is checked (exactly once, in order); client_errors counts problems. "
        "Raw per-run and per-kill numbers: failover_runs.csv, failover_service_kills.csv."
        + "".join(f"\n\nFailed: {f}" for f in failures)))
    print(f"wrote {md}")
    return 1 if failed else 0
