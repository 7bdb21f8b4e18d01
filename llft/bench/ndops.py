"""`llft bench ndops`: the cost of one determinized operation.

One unmodified workload program runs three times in the same benchmark run: plainly
(no shim), recorded (`llft record`: the primary's path -- real call + one ring append),
and replayed from that trace (`llft replay`: the backup's path -- fed by the same
Feeder a backup uses; take the record, wait for the operation's turn, return the
result). Per operation kind it times a tight loop of N calls:

  clock   time.monotonic()                        (CTS)
  lock    Lock.acquire(); Lock.release()          (CMTS: one ordered claim)
  recv    sock.recv(64) on an external TCP socket  (CSCS: 64 bytes recorded per read)

The workload measures itself with clock_gettime called through ctypes: ctypes drops
the GIL around foreign calls, so the shim classifies those reads as not reaching the
application and lets them through (the very rule under test), and the loop timings
are real in all three runs. Results: ns per operation, ratios to plain; writes
`<results>/ndops.csv`, `ndops.md` and `ndops.png` (ns per operation, plain / record /
replay, per kind). `llft bench ndlatency` measures the end-to-end figure (latency of a
replicated service against operations per request).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading

from llft.bench import report
from llft.bench.report import Table, write_markdown

WORKLOAD = r'''
import ctypes, json, os, socket, sys, threading, time

class TS(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
_cg = ctypes.CDLL(None).clock_gettime
_ts = TS()
def now_ns():
    _cg(1, ctypes.byref(_ts))          # GIL dropped by ctypes: never determinized
    return _ts.s * 1000000000 + _ts.ns

N = int(sys.argv[1]); port = int(sys.argv[2])
out = {}
t0 = now_ns()
for _ in range(N):
    time.monotonic()
out["clock"] = (now_ns() - t0) / N
l = threading.Lock()
t0 = now_ns()
for _ in range(N):
    l.acquire(); l.release()
out["lock"] = (now_ns() - t0) / N
s = socket.create_connection(("127.0.0.1", port))
got = 0
t0 = now_ns()
while got < N * 64:
    d = s.recv(64)
    if not d:
        break
    got += len(d)
out["recv"] = (now_ns() - t0) / N
s.close()
t0 = now_ns()
for _ in range(N):
    pass
out["empty_loop"] = (now_ns() - t0) / N
os.write(2, ("NDOPS " + json.dumps(out) + "\n").encode())
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", type=int, default=20000, help="operations per kind")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2000 operations per kind")
    parser.add_argument("--results", default=report.DEFAULT_RESULTS_DIR, help="output folder")


def _server(n_bytes: int) -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                c.sendall(os.urandom(n_bytes))

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _parse(stderr: bytes) -> dict[str, float]:
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("NDOPS "):
            return json.loads(line[6:])
    raise RuntimeError("workload printed no timings:\n" + stderr.decode(errors="replace")[-2000:])


def run(args) -> int:
    command = report.command_of(args, add_arguments, "ndops")
    if getattr(args, "quick", False):
        args.ops = 2000
    n = args.ops
    srv, port = _server(n * 64)
    with tempfile.TemporaryDirectory(prefix="llft-ndops-") as tmp:
        prog = os.path.join(tmp, "workload.py")
        with open(prog, "w") as f:
            f.write(WORKLOAD)
        trace = os.path.join(tmp, "trace")
        cmd = [sys.executable, prog, str(n), str(port)]
        llft = [sys.executable, "-m", "llft"]
        runs = {
            "plain": cmd,
            "record": llft + ["record", "-q", "--trace", trace, "--external-port", str(port), "--"] + cmd,
            "replay": llft + ["replay", "-q", "--trace", trace],
        }
        res = {}
        for name, argv in runs.items():
            p = subprocess.run(argv, capture_output=True, timeout=600)
            if p.returncode != 0:
                print(f"ndops: {name} run failed ({p.returncode}):\n{p.stderr.decode()[-2000:]}",
                      file=sys.stderr)
                return 1
            res[name] = _parse(p.stderr)
        trace_bytes = os.path.getsize(os.path.join(trace, "orderinfo.bin"))
    srv.close()

    table = Table("ndops", f"Cost per determinized operation ({n} ops per kind)",
                  ["op", "plain_ns", "record_ns", "replay_ns", "record_x", "replay_x",
                   "record_extra_ns", "replay_extra_ns"])
    for op in ("clock", "lock", "recv"):
        p, r, b = res["plain"][op], res["record"][op], res["replay"][op]
        table.add(op=op, plain_ns=p, record_ns=r, replay_ns=b, record_x=r / p, replay_x=b / p,
                  record_extra_ns=r - p, replay_extra_ns=b - p)
    table.print()
    print(f"trace: {trace_bytes} bytes for {3 * n} determinized operations "
          f"(+ start-up); empty loop {res['plain']['empty_loop']:.1f} ns/iter")
    os.makedirs(args.results, exist_ok=True)
    path = table.write_csv(args.results)
    ops = [r["op"] for r in table.rows]
    png = report.bars(args.results, "ndops", f"Cost per determinized operation ({n} ops)",
                      "ns per operation", ops,
                      {name: [r[f"{name}_ns"] for r in table.rows]
                       for name in ("plain", "record", "replay")}, logy=True)
    write_markdown(args.results, "ndops", [table.markdown()], plots=[png], command=command,
                   notes=f"Each row: the same unmodified loop, timed in one benchmark run "
                         f"plainly, recorded (primary path) and replayed from the trace "
                         f"(backup path, no network peer). Trace: {trace_bytes} bytes.")
    print(f"wrote {path}")
    return 0
