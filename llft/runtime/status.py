"""`llft status --config FILE --group NAME [--json]`: a group's members as its agents see them.

Every agent (and gateway) of this host writes its status file under
`<runtime_dir>/<group>/` (llft/runtime/agent.py). This command reads them, keeps those whose
process is alive, takes the view (members, ranks, precedences, primary) from the member
with the highest view number, and joins each member's own line: role, host, agent and
application pids, order-info lag behind the primary, divergence, counters. A diverged
replica leaves its file behind when it stops, and so does one that failed while its agent
lived (a process of its application killed: `failure` says which): it is listed under
`departed`.

Limit: only replicas of this host have status files; members on other hosts appear in
the view with host "?" and no pids.

JSON (`--json`):
    {"group": G, "view": pvn, "primary": birth,
     "members": [{"birth", "role", "rank", "precedence", "host", "agent_pid", "app_pid",
                  "lag", "lag_ms", "lag_entries", "sync", "lag_held", "handing_off",
                  "log", "diverged", "takeover", "counters", ...}, ...],
`lag` counts order-info positions the replica has not received; `lag_ms` is how old the
oldest entry is that its application has not executed (the primary's measure, which the
lag bound holds, docs/LOG.md); `sync` is "catching-up" for a joiner still replaying the
history it joined with, then "ready" (`replaying` is true once its primary has heard it
say so: the primary then waits longest on it, floor + cap); `catch_up_ms` is a backup's
estimate of how long its application needs for what it was given (no takeover by it
before that, docs/LOG.md);
`takeover.held` is true while a backup's detector has
fired and no remote group has yet said that the primary is silent there too;
`handing_off` is the successor a primary asked to stop serves on for (until it has
caught up: docs/DESIGN.md, "A graceful stop"), else null.
     "gateways": [...], "departed": [...]}
Exit status: 0 if the group has a primary, 1 if none was found, 2 on a configuration error.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import threading

from llft.runtime import config as config_mod
from llft.runtime import proctree


def write_file(path: str, text: str) -> None:
    """Write a status file (its JSON text) atomically (a temporary file, then a rename):
    a reader sees the previous version or this one, never a part."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class StatusFile:
    """One process's status file, rewritten whole at each `write`. Its path may change
    (an agent's file is named by its birth id, which a reset changes): once the file
    at the new path is written, the one at the old path is removed.

    Written by a helper thread, never on the caller's (an agent's event loop): on a busy
    machine one rename in the runtime folder (ext4) took over 100 ms, heartbeats unsent,
    and got a live primary replaced. `write` takes a snapshot (JSON) and returns; only the
    latest snapshot is written; `remove` happens in order after the writes asked before
    it; `close` waits (bounded) until everything asked is done. A failure is counted in
    `errors` with the last one in `last_error` (the caller reports it)."""

    def __init__(self) -> None:
        self.path: str | None = None            # the file as last written
        self._ops: list[tuple] = []             # ("write", path, text) | ("remove",)
        self._cv = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self.errors = 0
        self.last_error: OSError | None = None

    def write(self, path: str, status: dict) -> None:
        op = ("write", path, json.dumps(status, default=str))
        with self._cv:
            if self._ops and self._ops[-1][0] == "write":
                self._ops[-1] = op                  # the pending one is superseded
            else:
                self._ops.append(op)
            self._start_locked()
            self._cv.notify()

    def remove(self) -> None:
        with self._cv:
            self._ops.append(("remove",))
            self._start_locked()
            self._cv.notify()

    def close(self, timeout_s: float = 5.0) -> bool:
        """Wait until every write and removal asked is done; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._ops and not self._busy, timeout_s)

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llft-status-writer",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._ops)
                op = self._ops.pop(0)
                self._busy = True
            try:
                if op[0] == "write":
                    write_file(op[1], op[2])
                    if self.path and self.path != op[1]:
                        self._unlink()
                    self.path = op[1]
                else:
                    self._unlink()
            except OSError as e:
                self.errors += 1
                self.last_error = e
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _unlink(self) -> None:
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None


_own_start: dict[int, float] = {}


def own_start() -> float:
    """This process's create time, for its status file (per pid: `llft run` may fork
    after this module is imported, application.py `own_session`)."""
    pid = os.getpid()
    if pid not in _own_start:
        _own_start[pid] = proctree.running(pid).create_time()
    return _own_start[pid]


def _alive(pid, start=None) -> bool:
    """Whether the process a status file names still runs: `pid`, and when the file says
    that process was created (`start`, psutil's create_time; older files do not say).
    The pid alone is not enough: an agent killed by SIGKILL leaves its file, and on a
    busy machine its pid is soon another process's or thread's (pid_max 32768 here; a
    chaos run's JVMs and apps went round it): the dead agent was read as alive and
    "joining", and the group never looked settled."""
    return isinstance(pid, int) and pid > 0 and proctree.running(pid, start) is not None


def read_files(status_dir: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(live agents, live gateways, departed agents that left a report)."""
    agents, gateways, departed = [], [], []
    for path in sorted(glob.glob(os.path.join(status_dir, "*.json"))):
        try:
            with open(path) as f:
                st = json.load(f)
        except (OSError, ValueError):
            continue            # being replaced, or not ours
        name = os.path.basename(path)
        if name.startswith("gateway-"):
            if _alive(st.get("pid"), st.get("pid_start")):
                gateways.append(st)
            continue
        if _alive(st.get("agent_pid"), st.get("agent_start")):
            agents.append(st)
        elif st.get("diverged") or st.get("local_failure"):
            departed.append(st)
    return agents, gateways, departed


def group_status(cfg: config_mod.ClusterConfig, group: str) -> dict:
    cfg.group(group)
    agents, gateways, departed = read_files(cfg.status_dir(group))
    by_birth = {a["birth"]: a for a in agents}
    ref = max(agents, key=lambda a: (a.get("pvn", 0), a.get("role") == "primary"),
              default=None)
    members = []
    if ref is not None:
        prim = by_birth.get(ref.get("primary"), {})
        produced = (prim.get("order_info") or {}).get("produced")
        for m in ref.get("members", []):
            a = by_birth.get(m["birth"], {})
            oi = a.get("order_info") or {}
            lag = None
            if produced is not None and a and a.get("pvn") == prim.get("pvn"):
                lag = max(0, produced - (oi.get("delivered") or 0))
            app_lag = None
            if oi.get("fed_entries") is not None and oi.get("consumed_entries") is not None:
                app_lag = max(0, oi["fed_entries"] - oi["consumed_entries"])
            # how far its application is behind the primary's: the primary's measure
            # (what backpressure acts on), else the replica's own (another host's primary)
            reported = (prim.get("backup_lag") or {}).get(f"{m['birth']:x}")
            own = a.get("own_lag") or {}
            lag_ms = reported["ms"] if reported else own.get("ms")
            members.append({
                "birth": m["birth"], "birth_hex": f"{m['birth']:x}",
                "role": a.get("role", "primary" if m["rank"] == 1 else "backup"),
                "rank": m["rank"], "precedence": m["precedence"],
                "host": a.get("host", "?"), "agent_pid": a.get("agent_pid"),
                "app_pid": a.get("app_pid"), "app_mode": a.get("app_mode"),
                "pvn": a.get("pvn"), "lag": lag, "app_lag_entries": app_lag,
                "lag_ms": 0.0 if m["rank"] == 1 else lag_ms,
                "lag_entries": reported["entries"] if reported else None,
                "catch_up_ms": None if m["rank"] == 1 else own.get("catch_up_ms"),
                "lag_ready": reported["ready"] if reported else None,
                # the primary heard it say it replays its history: it waits longest on it
                "replaying": f"{m['birth']:x}" in (prim.get("backups_replaying") or ()),
                "sync": "primary" if m["rank"] == 1 else a.get("sync", "?"),
                "lag_held": a.get("lag_held"), "handing_off": a.get("handing_off"),
                "log": a.get("log"),
                "connections": a.get("connections"), "diverged": a.get("diverged"),
                "connections_open": a.get("connections_open"), "streams": a.get("streams"),
                "group_connections": a.get("group_connections"),
                "rss_kb": a.get("rss_kb"), "takeover": a.get("takeover"),
                "counters": a.get("counters", {})})
    in_view = {m["birth"] for m in members}
    others = [{"birth": a["birth"], "birth_hex": f"{a['birth']:x}", "role": a.get("role"),
               "status": a.get("status"), "host": a.get("host"),
               "agent_pid": a.get("agent_pid"), "app_pid": a.get("app_pid"),
               "takeover": a.get("takeover")}
              for a in agents if a["birth"] not in in_view]
    return {"group": group, "view": ref.get("pvn") if ref else None,
            "primary": ref.get("primary") if ref else None,
            "members": members, "joining": others, "gateways": gateways,
            "departed": [{"birth": d["birth"], "host": d.get("host"),
                          "diverged": d.get("diverged"),
                          "failure": d.get("local_failure")} for d in departed]}


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def _held(m: dict) -> list[str]:
    if not (m.get("takeover") or {}).get("held"):
        return []
    return ["     takeover held: its primary is silent, and no remote group has said it is "
            "silent there too (cut off? docs/ARCHITECTURE.md open item 9)"]


def render(st: dict) -> str:
    lines = [f"group {st['group']}: view {st['view']}, primary "
             + (f"{st['primary']:x}" if st["primary"] else "none")]
    hdr = f"{'rank':>4} {'role':8} {'prec':>4} {'birth':16} {'host':12} {'agent':>7} " \
          f"{'app':>7} {'lag':>5} {'lag ms':>7} {'sync':11} {'conns':>5}  divergence"
    lines.append(hdr)
    for m in st["members"]:
        d = m["diverged"]
        div = "none" if not d else f"conn {d.get('conn')} offset {d.get('offset')}"
        lines.append(f"{m['rank']:>4} {m['role']:8} {m['precedence']:>4} {m['birth_hex']:16} "
                     f"{str(m['host'])[:12]:12} {str(m['agent_pid']):>7} "
                     f"{str(m['app_pid']):>7} {str(m['lag']):>5} "
                     f"{_ms(m['lag_ms']):>7} {str(m['sync'])[:11]:11} "
                     f"{str(m['connections']):>5}  {div}")
        if m["lag_held"]:
            lines.append("     backpressure: the application is held (a backup is beyond "
                         "the lag bound)")
        if m.get("handing_off"):
            lines.append(f"     stopping: serves on until backup {m['handing_off']}, which "
                         "takes over, has caught up (docs/DESIGN.md, \"A graceful stop\")")
        log = m["log"] or {}
        if log.get("full"):
            lines.append(f"     log full, joins refused: {log['full']}")
        elif m["rank"] == 1 and log.get("cap_bytes"):
            # every member holds the same log: shown once; at either cap joins are refused
            mib = (log.get("input_bytes", 0) + log.get("order_info_bytes", 0)) / 2**20
            lines.append(f"     log (what a joiner replays): {mib:.1f} of "
                         f"{log['cap_bytes'] / 2**20:.0f} MiB, {log.get('entries', 0):,} of "
                         f"{log['cap_entries']:,} order-info positions")
        lines.extend(_held(m))
    for j in st["joining"]:
        lines.append(f"   - {str(j['role']):8}      {j['birth_hex']:16} {str(j['host'])[:12]:12}"
                     f" {str(j['agent_pid']):>7}  (not in the view yet)")
        lines.extend(_held(j))
    for g in st["gateways"]:
        lines.append(f"gateway pid {g.get('pid')}: {json.dumps(g.get('counters', {}))}")
    for d in st["departed"]:
        lines.append(f"departed {d['birth']:x} on {d['host']}: "
                     + (f"diverged {d['diverged']}" if d["diverged"] else d["failure"]))
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="cluster configuration (TOML)")
    p.add_argument("--group", required=True)
    p.add_argument("--json", action="store_true", help="one JSON object (for scripts)")


def run(args) -> int:
    try:
        cfg = config_mod.load(args.config)
        st = group_status(cfg, args.group)
    except config_mod.ConfigError as e:
        print(f"llft status: {e}", file=sys.stderr)
        return 2
    print(json.dumps(st) if args.json else render(st))
    return 0 if st["primary"] else 1
