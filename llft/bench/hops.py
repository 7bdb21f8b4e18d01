"""`llft bench profile --hops`: one request's path through the processes, hop by hop.

With one client on a persistent connection, every 1 KB request crosses the same system
calls in the same order: the gateway reads the client's bytes and multicasts a REQUEST,
the primary's agent reads it and writes the bytes to its app, the app reads and answers,
the agent reads the answer and sends a REPLY, the gateway reads that and writes to the
client. `perf trace` records those calls machine-wide for a moment of the load (their end
times, by thread); this module chains them per request and reports each hop's median and
90th percentile: the time spent *between* two calls, in the process that makes the
second one (its wake-up, its queueing for a core, its Python) or in the kernel.

Calls are told apart by thread and size only: a read or write of exactly SIZE bytes is the
request's or the answer's payload on a TCP socket, anything larger on the datagram path is
the REQUEST or the REPLY carrying it (acks, reports and heartbeats are a few hundred bytes
at most). So this holds for the echo bench's 1 KB requests at one client, nothing else.

`Recording` traces the machine for the whole load; `chain` keeps the requests whose ten
calls it saw. `perf trace` slows every traced call (tens of µs here): read the hops against each other,
not their sum against the untraced latency. Needs `perf` and the right to trace every
process (root, or kernel.perf_event_paranoid = -1).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from llft.bench.report import summarize_us

HOPS = ("G_in", "G_req", "P_in", "P_appw", "A_r", "A_w", "P_appr", "P_rep", "G_rep", "G_cw")
WHERE = {                   # the hop ending at this call: who makes it, and what it waits on
    "G_req": "gateway: client bytes read -> REQUEST multicast (its Python)",
    "P_in": "primary agent: REQUEST sent -> read (kernel, wake-up)",
    "P_appw": "primary agent: REQUEST read -> written to its app (its Python)",
    "A_r": "app: written -> read (the app thread's wake-up)",
    "A_w": "app: read -> answer written (the app)",
    "P_appr": "primary agent: answer written -> read (wake-up)",
    "P_rep": "primary agent: answer read -> REPLY sent (its Python, output commit)",
    "G_rep": "gateway: REPLY sent -> read (kernel, wake-up)",
    "G_cw": "gateway: REPLY read -> written to the client (its Python)",
}
SYSCALLS = "sendto,recvfrom,sendmsg,recvmsg,read,write"
_LINE = re.compile(r"^\s*([\d.]+) \(\s*([\d.]*)\s*ms\): \S+/(\d+) (.*)= (-?\d+)")
_SENDS = ("sendto", "sendmsg", "write")
_RECVS = ("recvfrom", "recvmsg", "read")


def available() -> str | None:
    """None, or why `perf trace` cannot be used here (one line)."""
    if shutil.which("perf") is None:
        return "needs perf (linux-tools) on the PATH"
    try:
        with open("/proc/sys/kernel/perf_event_paranoid") as f:
            paranoid = int(f.read())
    except (OSError, ValueError):
        paranoid = 2
    if os.geteuid() != 0 and paranoid > -1:
        return "needs root or kernel.perf_event_paranoid = -1 to trace every process"
    return None


class Recording:
    """`perf trace` of the whole machine from `start()` (returned once calls are being
    recorded: perf takes seconds to set up on a loaded machine, and a trace started by
    the clock missed a short load) to `stop()` (its text output)."""

    READY_TIMEOUT_S = 60.0

    def __init__(self) -> None:
        self._out = tempfile.NamedTemporaryFile("r", suffix=".perf")
        self._proc = subprocess.Popen(["perf", "trace", "-a", "-T", "-e", SYSCALLS,
                                       "-o", self._out.name],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    @classmethod
    def start(cls) -> "Recording":
        r = cls()
        deadline = time.monotonic() + cls.READY_TIMEOUT_S
        # the idle group's heartbeats are calls too: the first line says it records
        while os.path.getsize(r._out.name) == 0:
            if r._proc.poll() is not None or time.monotonic() > deadline:
                err = r._proc.stderr.read().decode(errors="replace") if r._proc.stderr else ""
                r.stop()
                raise RuntimeError(f"perf trace did not start: {err.strip()[-300:]}")
            time.sleep(0.05)
        return r

    def stop(self) -> str:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stderr:
            self._proc.stderr.close()
        try:
            return self._out.read()
        finally:
            self._out.close()


def _kind(tid: int, call: str, ret: int, size: int, gw: int, primary: int,
          app: set[int]) -> str | None:
    send = call in _SENDS
    if not send and call not in _RECVS:
        return None
    if tid == gw:
        if ret == size:
            return "G_cw" if send else "G_in"
        return ("G_req" if send else "G_rep") if ret > size else None
    if tid == primary:
        if ret == size:
            return "P_appw" if send else "P_appr"
        return ("P_rep" if send else "P_in") if ret > size else None
    if tid in app and ret == size:
        return "A_w" if send else "A_r"
    return None


def chain(text: str, size: int, gw: int, primary: int, app: set[int]) -> dict[str, list[float]]:
    """Hop name -> its durations (µs), one per request whose ten calls were all seen in
    order."""
    events = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        ts, dur, tid, rest, ret = m.groups()
        call = rest.split("]:")[1] if "continued]:" in rest else rest
        call = call.strip().split("(")[0]
        kind = _kind(int(tid), call, int(ret), size, gw, primary, app)
        if kind is not None:     # the call's end: its start plus its duration
            events.append(((float(ts) + (float(dur) if dur else 0.0)) * 1000.0, kind))
    events.sort()
    hops: dict[str, list[float]] = {h: [] for h in HOPS[1:]}
    at: dict[str, float] = {}
    for t, kind in events:
        if kind == "G_in":
            at = {"G_in": t}
        elif at and kind == HOPS[len(at)]:
            at[kind] = t
            if len(at) == len(HOPS):
                for prev, h in zip(HOPS, HOPS[1:]):
                    hops[h].append(at[h] - at[prev])
                at = {}
    return hops


def _rows(named) -> list[dict]:
    """A table row per (hop's description, its durations) with any: median, p90, count."""
    rows = []
    for hop, d in named:
        if d:
            s = summarize_us(d)
            rows.append({"hop": hop, "median_us": s["median_us"], "p90_us": s["p90_us"],
                         "requests": s["n"]})
    return rows


def summary(hops: dict[str, list[float]]) -> list[dict]:
    return _rows((WHERE[h], hops[h]) for h in HOPS[1:])


# ---- the same path from in-process marks (`--marks`: llft/runtime/marks.py) ------------
# Each step: (role of the process, its mark, how the mark's size compares with SIZE, the
# hop that ends there). A datagram's size is above SIZE (the payload and its header), a
# socket read or write of the payload is SIZE; acks, reports and heartbeats are smaller.
MARK_STEPS = (
    ("gateway", "client_r", "eq", None),
    ("gateway", "out", "gt", "gateway: client bytes read -> REQUEST sent (its Python)"),
    ("primary", "in", "gt", "REQUEST sent -> the primary's loop has it (kernel, then wake-up)"),
    ("primary", "core_end", None, "primary: REQUEST read -> its protocol cores done"),
    ("primary", "app_w", None, "primary: cores done -> the bytes written to its app"),
    ("primary", "app_r", "eq", "app round trip: written -> its answer read (two wake-ups)"),
    ("primary", "out", "gt", "primary: answer read -> REPLY sent (its Python, output commit)"),
    ("gateway", "in", "gt", "REPLY sent -> the gateway's loop has it (kernel, then wake-up)"),
    ("gateway", "client_w", "eq", "gateway: REPLY read -> written to the client (its Python)"),
)


def _parts(step: tuple) -> tuple[str, str] | None:
    """A datagram's hop is reported again in two parts, at the receiver's arrival stamp."""
    if step[1] != "in":
        return None
    what = "REQUEST" if step[0] == "primary" else "REPLY"
    return (f"  {what}: the kernel's part (sendto -> the socket's arrival stamp)",
            f"  {what}: the wake-up's part (arrival stamp -> the loop has it)")


def _fits(size: int, test: str | None, payload: int) -> bool:
    return test is None or (size == payload if test == "eq" else size > payload)


def chain_marks(marks: dict[str, list[tuple[str, int, int, int]]], payload: int
                ) -> dict[str, list[float]]:
    """Hop -> its durations (µs), one per request whose marks were all seen in order.
    `marks`: role ("gateway", "primary"; others are ignored) -> that process's marks
    (llft/runtime/marks.py: tag, monotonic ns, size, kernel arrival ns or 0). Every
    process reads the same monotonic clock, so hops between processes are differences
    too; a datagram's hop is split at its kernel arrival stamp where it has one."""
    events = sorted((ns, role, tag, size, at) for role, ms in marks.items()
                    for tag, ns, size, at in ms if role in ("gateway", "primary"))
    hops: dict[str, list[float]] = {}
    for step in MARK_STEPS[1:]:
        hops[step[3]] = []
        for part in _parts(step) or ():
            hops[part] = []
    got: list[tuple[int, int]] = []         # (ns, arrival ns) of the steps seen
    for ns, role, tag, size, at in events:
        k = len(got)
        if (role, tag) == MARK_STEPS[0][:2] and _fits(size, MARK_STEPS[0][2], payload):
            got = [(ns, 0)]                  # a request starts (again)
            continue
        if not got:
            continue
        want_role, want_tag, test, _ = MARK_STEPS[k]
        if (role, tag) != (want_role, want_tag) or not _fits(size, test, payload):
            continue
        got.append((ns, at))
        if len(got) == len(MARK_STEPS):
            for i in range(1, len(MARK_STEPS)):
                hops[MARK_STEPS[i][3]].append((got[i][0] - got[i - 1][0]) / 1000)
                sent, (read, arrived) = got[i - 1][0], got[i]
                parts = _parts(MARK_STEPS[i])
                if parts and arrived:
                    hops[parts[0]].append((arrived - sent) / 1000)
                    hops[parts[1]].append((read - arrived) / 1000)
            got = []
    return hops


def summary_marks(hops: dict[str, list[float]]) -> list[dict]:
    return _rows(hops.items())
