"""`llft bench ndlatency`: end-to-end latency against nondeterministic operations per request.

The LLFT paper's figure "ndlatency": a request/reply service whose every request performs
K nondeterministic operations (the paper: gettimeofday; "other types produce a similar
profile"), 1 KB requests and replies, latency as K grows; llft adds about 8 us per
operation there, mostly the piggybacked order information.

Here the service is examples/ndops_service.py, an unmodified threaded TCP server: a
request `OPS <op> <K> <padding>` does K operations of kind <op> (`--op-kinds`: clock =
time.time(), random = os.urandom(8), lock = a shared threading.Lock acquired and
released, external = an 8-byte round trip to an echo server this bench runs outside the
replicas: under llft each send waits for output commit) and replies with a digest of the values, padded to the request's length.
Configurations, measured in one run like `llft bench latency` (service.py's Setup):

  tcp        the plain process reached directly over TCP (the baseline; no shim)
  llft_Nr    N replicas under `llft run` (N from `--replicas`, default 1,2,3) through
             `llft gateway`; each operation is determinized at the primary (order info
             recorded by the shim, piggybacked on the reply's data message) and replayed
             at the backups

One phase per replica count: that group is started, measured interleaved (`--blocks`)
with tcp for every op kind and K (`--ops`), then stopped. Per (op, K, configuration):
median, p90, p99 of `--rounds` round trips after `--warmup`; extra_us = median minus
the same phase's tcp median. Per op kind and configuration the least-squares slope of
the median against K gives the cost of one operation (us_per_op), and of the extra
latency against K the cost llft adds per operation (extra_us_per_op).

Writes `<results>/ndlatency.csv` (every point), `ndlatency_slope.csv`, `ndlatency.md`
and `ndlatency_<op>.png` (median latency against K, one line per configuration).
"""
from __future__ import annotations

import argparse
import os
import socket
import socketserver
import sys
import tempfile
import threading

from llft import EXAMPLES_DIR
from llft.bench import report
from llft.bench.service import (Setup, Target, phase_of, pooled_samples,
                                measure_round_trips)

NDOPS_SERVICE = os.path.join(EXAMPLES_DIR, "ndops_service.py")
OP_KINDS = ("clock", "random", "lock", "mixed", "external")


class ExternalEcho:
    """The `external` op's server: a TCP echo server on loopback in this (bench) process,
    outside every replica's process tree, so the shim classifies connections to it as
    external and every send to it waits for output commit. A thread per connection."""

    def __init__(self):
        self.srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _EchoHandler)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, name="external-echo",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := self.request.recv(65536):
            self.request.sendall(data)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", default="0,10,100,1000",
                   help="nondeterministic operations per request (K values)")
    p.add_argument("--op-kinds", default="clock,random,lock",
                   help=f"operation kinds, each its own series: {', '.join(OP_KINDS)}")
    p.add_argument("--size", type=int, default=1024, help="request and reply bytes")
    p.add_argument("--rounds", type=int, default=200,
                   help="timed round trips per op kind, K and configuration")
    p.add_argument("--warmup", type=int, default=20, help="untimed round trips first")
    p.add_argument("--blocks", type=int, default=4,
                   help="interleave the configurations in this many blocks")
    p.add_argument("--replicas", default="1,2,3", help="llft group sizes to measure")
    p.add_argument("--fault-timeout-ms", type=float, default=None,
                   help="fault_timeout_ms of the llft clusters (default: the "
                   "configuration's default)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: clock only, K 0,10,100,1000, 20 round trips, 2 blocks")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def request_of(op: str, k: int, size: int) -> bytes:
    head = f"OPS {op} {k} ".encode()
    return head + b"x" * max(0, size - 1 - len(head)) + b"\n"


def measure(targets: list[Target], points: list[tuple[str, int]], size: int, rounds: int,
            warmup: int, blocks: int, phase: int, samples: dict) -> None:
    """Into samples[(phase, config, (op, K))]: round-trip times (us)."""
    measure_round_trips(targets, points, lambda point: request_of(point[0], point[1], size),
                        lambda reply, _req: reply.startswith(b"OK ") and reply[-1:] == b"\n",
                        lambda point: f"{point[0]} K={point[1]}",
                        rounds, warmup, blocks, phase, samples)


def tables(setup: Setup, points, samples, args) -> tuple[report.Table, report.Table]:
    table = report.Table("ndlatency", f"Latency against nondeterministic operations per request "
                         f"({args.size} B requests and replies, examples/ndops_service.py; "
                         f"us, {args.rounds} round trips per point)",
                         ["op", "ops_per_request", "config", "replicas", "n", "median_us",
                          "p90_us", "p99_us", "median_vs_tcp", "extra_us", "error"])
    for point in points:
        op, k = point
        pooled = pooled_samples(samples, "tcp", point)
        for t in setup.targets:
            if t.replicas:
                ph = phase_of(samples, t.name)
                mine = samples.get((ph, t.name, point), [])
                ref = report.summarize_us(samples.get((ph, "tcp", point), []))
            else:
                mine, ref = pooled, report.summarize_us(pooled)
            s = report.summarize_us(mine)
            good = t.measured(point, points)
            row = dict(op=op, ops_per_request=k, config=t.name, replicas=t.replicas, n=s["n"],
                       error="" if good else t.error)
            if good and s["n"]:
                row.update(median_us=s["median_us"], p90_us=s["p90_us"], p99_us=s["p99_us"])
                if ref["n"]:
                    row.update(median_vs_tcp=s["median_us"] / ref["median_us"],
                               extra_us=s["median_us"] - ref["median_us"])
            table.add(**row)
    slope = report.Table("ndlatency_slope", "Cost per nondeterministic operation: least-squares "
                         "slope of the median latency against K (us per operation)",
                         ["op", "config", "replicas", "us_per_op", "extra_us_per_op", "paper"])
    for op in dict.fromkeys(p[0] for p in points):
        for t in setup.targets:
            rows = [r for r in table.rows if r["op"] == op and r["config"] == t.name
                    and "median_us" in r]
            if not rows:
                continue
            ks = [r["ops_per_request"] for r in rows]
            row = dict(op=op, config=t.name, replicas=t.replicas,
                       us_per_op=report.fit_slope(ks, [r["median_us"] for r in rows]))
            if t.replicas:
                row["extra_us_per_op"] = report.fit_slope(
                    [r["ops_per_request"] for r in rows if "extra_us" in r],
                    [r["extra_us"] for r in rows if "extra_us" in r])
                row["paper"] = "~8 us per clock op (3 replicas)" if op == "clock" else ""
            slope.add(**row)
    return table, slope


def run(args) -> int:
    command = report.command_of(args, add_arguments, "ndlatency")
    if args.quick:
        args.op_kinds, args.ops, args.rounds, args.warmup = "clock", "0,10,100,1000", 20, 3
        args.blocks = 2
    kinds = [k.strip() for k in args.op_kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in OP_KINDS]
    if bad:
        print(f"llft bench ndlatency: unknown op kind {bad[0]!r} ({', '.join(OP_KINDS)})",
              file=sys.stderr)
        return 2
    ks = [int(x) for x in args.ops.split(",") if x.strip()]
    replicas = [int(x) for x in args.replicas.split(",") if x.strip()]
    points = [(op, k) for op in kinds for k in ks]
    echo = ExternalEcho() if "external" in kinds else None
    if echo is not None:
        os.environ["NDOPS_EXTERNAL_PORT"] = str(echo.port)   # inherited by every service
    with tempfile.TemporaryDirectory(prefix="llft-bench-ndlatency-") as tmp:
        setup = Setup(tmp, proxy=False, fault_timeout_ms=args.fault_timeout_ms,
                      app=NDOPS_SERVICE, probe=(b"PING\n", b"PONG\n"), group_prefix="ndops")
        samples: dict = {}
        try:
            for phase, r in enumerate(replicas or [0]):
                cluster = setup.add_cluster(r) if r else None
                targets = setup.baselines + ([cluster] if cluster else [])
                measure(targets, points, args.size, args.rounds, args.warmup, args.blocks,
                        phase, samples)
                if cluster is not None:
                    setup.stop_cluster(cluster)
        finally:
            setup.stop()
            if echo is not None:
                echo.close()
                os.environ.pop("NDOPS_EXTERNAL_PORT", None)
        table, slope = tables(setup, points, samples, args)
    table.print()
    slope.print()
    table.write_csv(args.results)
    slope.write_csv(args.results)
    plots = []
    for op in kinds:
        series = {}
        for t in setup.targets:
            pts = [(r["ops_per_request"], r["median_us"]) for r in table.rows
                   if r["op"] == op and r["config"] == t.name and "median_us" in r]
            if pts:
                series[t.name] = ([x for x, _ in pts], [y for _, y in pts])
        plots.append(report.plot(
            args.results, f"ndlatency_{op}", f"Latency vs nondeterministic ops ({op}, "
            f"{args.size} B)", "nondeterministic operations per request",
            "median latency (us)", series, symlogx=True, logy=True, xticks=ks))
    failed = [t for t in setup.targets if t.error is not None]
    notes = ("Service: examples/ndops_service.py, unmodified; each request does K operations "
             "of the row's kind (clock: time.time(); random: os.urandom(8); lock: a shared "
             "threading.Lock acquired and released; external: an 8-byte round trip to a TCP "
             "echo server in the bench process, outside the replicas, which under llft waits "
             "for output commit: the backups hold every order-information entry recorded "
             "before the send) and the reply carries a digest of the values. tcp: the plain process reached directly (no shim, no replication); "
             "llft_Nr: N replicas under `llft run` through `llft gateway`, fault_timeout_ms = "
             f"{report.detector_ms(args.fault_timeout_ms)}; every operation is recorded by the primary's shim "
             "and its order information rides on the reply's data message (output commit), "
             "then is replayed by the backups. One phase per replica count (group started, "
             "measured interleaved with tcp, stopped); extra_us and ratios are to the tcp "
             "samples of the same phase; the tcp rows pool every phase.")
    if failed:
        notes += "\n\nFailed configurations: " + "; ".join(f"{t.name}: {t.detail}"
                                                         for t in failed)
    md = report.write_markdown(args.results, "ndlatency", [table.markdown(), slope.markdown()],
                               notes=notes, plots=plots, command=command)
    print(f"wrote {md}")
    return 1 if failed else 0
