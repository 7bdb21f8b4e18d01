"""`llft bench bulk`: a bulk transfer both ways with a reader that goes away for a while,
through a replicated group and, in the same run, directly (the baseline).

Two connections per configuration to examples/echo.py (it writes back what it reads,
blocking in `sendall` when its peer does not read). On each the client writes `--mb` MB
of random bytes in 1 MB chunks from one thread and reads the echo from another: first
as fast as it can (the rate), then with the reader stopping for `--pause-s` seconds
once it has read the first MB (a slow consumer: a client on a slow link, an app busy
elsewhere). With plain TCP the echo server's send then blocks, it
stops reading, and the writer blocks: what waits is bounded by the sockets' buffers.
Through llft the same must hold end to end (per-stream credit both ways,
llft/protocol/streams.py): the group's primary stops reading the app's output for that
stream, the app's send blocks, the gateway stops reading the client.

Configurations: `direct` (echo.py as a plain process), then `llft_Nr` for each N of
`--replicas` (N replicas started together, a gateway; the default configuration).
Columns:

    mb_per_s    MB / seconds of the first transfer (no pause); `vs_direct` its ratio to
                the direct run's
    ahead_mb    second transfer: how far the writer got ahead of the reader by the end
                of the pause (written - read): what the path held for the absent reader
    rss_mb      peak resident memory during both: the largest agent and the gateway
                (llft), the echo server (direct); psutil, sampled every 50 ms
    ok          every byte came back, in order, both times (sha256 of both streams)
    views       the group's view changed during the transfer (a false suspicion)

Writes `<results>/bulk.csv`, `bulk.md`, `bulk.png` (bytes read back over time).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

from llft import EXAMPLES_DIR
from llft.bench import report
from llft.tools.cluster import LocalCluster
from llft.tools.loadclient import wait_listening
from llft.tools.procs import free_port

ECHO = os.path.join(EXAMPLES_DIR, "echo.py")
CHUNK = 1 << 20
SAMPLE_S = 0.05
TIMEOUT_S = 120


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mb", type=int, default=64, help="MB written (and echoed back)")
    p.add_argument("--pause-s", type=float, default=3.0,
                   help="the reader stops this long after the first MB")
    p.add_argument("--replicas", default="2,3", help="llft group sizes to measure")
    p.add_argument("--quick", action="store_true", help="smoke run: 32 MB, 1 s, 2 replicas")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


class PeakRss:
    """Peak RSS of named processes, sampled on a helper thread until `stop()`."""

    def __init__(self, pids: dict[str, int]):
        import psutil
        self.procs = {n: psutil.Process(p) for n, p in pids.items()}
        self.peak = {n: 0 for n in pids}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):     # a sampling period, not a sync
            for n, p in self.procs.items():
                try:
                    self.peak[n] = max(self.peak[n], p.memory_info().rss)
                except Exception:   # noqa: BLE001 -- gone: keep what was seen
                    pass

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._t.join()
        return {n: v / (1 << 20) for n, v in self.peak.items()}


def transfer(addr: tuple[str, int], mb: int, pause_s: float) -> dict:
    """Write `mb` MB on one connection while reading the echo, the reader away for
    `pause_s` after its first MB."""
    rng = random.Random(mb)
    chunks = [rng.randbytes(CHUNK) for _ in range(4)]
    sent_hash, got_hash = hashlib.sha256(), hashlib.sha256()
    state = {"written": 0, "read": 0, "error": None, "ahead": 0}
    times: list[tuple[float, int]] = []
    s = socket.create_connection(addr, timeout=TIMEOUT_S)
    t0 = time.monotonic()

    def write() -> None:
        try:
            for i in range(mb):
                c = chunks[i % len(chunks)]
                s.sendall(c)
                sent_hash.update(c)
                state["written"] += len(c)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            state["error"] = f"write: {e!r}"
    w = threading.Thread(target=write, daemon=True)
    w.start()
    paused = False
    try:
        while state["read"] < mb * CHUNK:
            d = s.recv(CHUNK)
            if not d:
                break
            got_hash.update(d)
            state["read"] += len(d)
            times.append((time.monotonic() - t0, state["read"]))
            if not paused and state["read"] >= CHUNK:
                paused = True
                time.sleep(pause_s)         # the workload: a reader that is away
                state["ahead"] = state["written"] - state["read"]
    except OSError as e:
        state["error"] = state["error"] or f"read: {e!r}"
    seconds = time.monotonic() - t0
    w.join(TIMEOUT_S)
    s.close()
    ok = (state["error"] is None and state["read"] == mb * CHUNK
          and sent_hash.digest() == got_hash.digest())
    return {"seconds": seconds, "ahead_mb": state["ahead"] / (1 << 20), "ok": ok,
            "error": state["error"], "_times": times}


def both(addr: tuple[str, int], args) -> dict:
    """The rate (no pause), then the held-back test (the reader away)."""
    rate = transfer(addr, args.mb, 0.0)
    held = transfer(addr, args.mb, args.pause_s)
    return {"mb_per_s": args.mb / rate["seconds"], "ahead_mb": held["ahead_mb"],
            "ok": rate["ok"] and held["ok"], "error": rate["error"] or held["error"],
            "_times": held["_times"]}


def run_direct(tmp: str, args) -> dict:
    port = free_port()
    p = subprocess.Popen([sys.executable, ECHO, str(port)], cwd=tmp,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_listening("127.0.0.1", port, timeout_s=30):
            raise RuntimeError("the echo server did not listen")
        rss = PeakRss({"server": p.pid})
        row = both(("127.0.0.1", port), args)
        row["rss_mb"] = f"server {rss.stop()['server']:.0f}"
        row["views"] = ""
        return row
    finally:
        p.kill()
        p.wait()


def run_llft(tmp: str, args, replicas: int) -> dict:
    port = free_port()
    with LocalCluster(os.path.join(tmp, f"r{replicas}"), group="bulk",
                      service_port=port) as lc:
        names = tuple(f"r{i + 1}" for i in range(replicas))
        addr = lc.start_service(names, [sys.executable, ECHO, str(port)])
        view = lc.wait_ready(replicas)["view"]
        rss = PeakRss({n: lc.procs[n].pid for n in (*names, "gateway")})
        row = both(addr, args)
        peak = rss.stop()
        row["rss_mb"] = (f"agent {max(peak[n] for n in names):.0f}, "
                         f"gateway {peak['gateway']:.0f}")
        row["views"] = lc.status()["view"] != view
        return row


def run(args) -> int:
    command = report.command_of(args, add_arguments, "bulk")
    if args.quick:
        args.mb, args.pause_s, args.replicas = 32, 1.0, "2"
    sizes = [int(x) for x in str(args.replicas).split(",") if x]
    table = report.Table("bulk", f"{args.mb} MB echoed on one connection, the reader away "
                         f"{args.pause_s:g} s after the first MB",
                         ["config", "replicas", "mb_per_s", "vs_direct",
                          "ahead_mb", "rss_mb", "ok", "views", "error"])
    series = {}
    with tempfile.TemporaryDirectory(prefix="llft-bulk-") as tmp:
        rows = [("direct", 0, run_direct(tmp, args))]
        rows += [(f"llft_{n}r", n, run_llft(tmp, args, n)) for n in sizes]
    base = rows[0][2]["mb_per_s"]
    for name, n, row in rows:
        times = row.pop("_times")
        series[name] = ([t for t, _ in times], [b / (1 << 20) for _, b in times], "-")
        table.add(config=name, replicas=n, vs_direct=row["mb_per_s"] / base, **row)
    table.print()
    table.write_csv(args.results)
    plot = report.timelines(args.results, "bulk", f"Bytes read back (the reader away "
                            f"{args.pause_s:g} s after the first MB)", "seconds",
                            "MB read", series, {})
    md = report.write_markdown(args.results, "bulk", [table.markdown()], plots=[plot],
                               command=command, notes=(
        "direct is the same echo server reached without llft, in the same run. ahead_mb "
        "is what the path held for the absent reader: with per-stream credit both ways "
        "it stays near the direct run's (socket buffers and a window per direction), "
        "however large the transfer."))
    print(f"wrote {md}")
    return 0 if all(r["ok"] and not r["views"] for r in table.rows) else 1
