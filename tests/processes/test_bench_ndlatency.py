"""`llft bench ndlatency --quick` and `llft bench messaging --quick`: structure only.

Every (op, K, configuration) point measured, CSV/markdown/PNG written, slopes present,
exit status 0. Timings never decide pass or fail. examples/ndops_service.py is also
checked plainly (protocol, reply length, digest determinism for K = 0).
"""
from __future__ import annotations

import csv
import importlib.util
import os
import socket
import subprocess
import sys

import pytest

from llft.bench.ndlatency import NDOPS_SERVICE, ExternalEcho, request_of
from llft.cli import main
from llft.tools.loadclient import wait_listening
from llft.tools.procs import free_port

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_ndops_service_plainly():
    port = free_port()
    echo = ExternalEcho()
    p = subprocess.Popen([sys.executable, NDOPS_SERVICE, str(port)],
                         env={**os.environ, "NDOPS_EXTERNAL_PORT": str(echo.port)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_listening("127.0.0.1", port, 20)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            f = s.makefile("rb")
            s.sendall(b"PING\n")
            assert f.readline() == b"PONG\n"
            for op in ("clock", "random", "lock", "mixed"):
                req = request_of(op, 50, 256)
                s.sendall(req)
                reply = f.readline()
                assert len(reply) == len(req) == 256 and reply.startswith(f"OK {op} 50 ".encode())
            s.sendall(request_of("clock", 0, 64) + request_of("lock", 0, 64))
            a, b = f.readline(), f.readline()
            assert a.split()[3] == b.split()[3]             # no operation: the same digest
            s.sendall(request_of("external", 5, 128) + request_of("external", 5, 128))
            a, b = f.readline(), f.readline()
            assert a == b and len(a) == 128 and a.startswith(b"OK external 5 ")
            s.sendall(b"OPS nope 1\nHELLO\n")
            assert f.readline().startswith(b"ERR unknown op")
            assert f.readline().startswith(b"ERR unknown request")
    finally:
        p.terminate()
        p.wait(timeout=10)
        echo.close()


def test_ndops_service_external_without_a_server(monkeypatch):
    """The external op without NDOPS_EXTERNAL_PORT, or with nobody listening: an ERR line
    naming what to fix, and the service goes on."""
    spec = importlib.util.spec_from_file_location("ndops_service", NDOPS_SERVICE)
    svc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(svc)
    monkeypatch.delenv("NDOPS_EXTERNAL_PORT", raising=False)
    assert svc.handle(b"OPS external 1").startswith(b"ERR external: set NDOPS_EXTERNAL_PORT")
    monkeypatch.setenv("NDOPS_EXTERNAL_PORT", str(free_port()))
    assert svc.handle(b"OPS external 1").startswith(b"ERR external: ")
    assert svc.handle(b"OPS clock 3").startswith(b"OK clock 3 ")


@pytest.mark.slow
def test_ndlatency_quick(tmp_path):
    out = str(tmp_path / "results")
    assert main(["bench", "ndlatency", "--quick", "--results", out]) == 0
    rows = read_csv(os.path.join(out, "ndlatency.csv"))
    configs = ["tcp", "llft_1r", "llft_2r", "llft_3r"]
    assert [(r["op"], r["ops_per_request"], r["config"]) for r in rows] == \
        [("clock", k, c) for k in ("0", "10", "100", "1000") for c in configs]
    for r in rows:
        assert r["error"] == "" and r["median_us"] and r["extra_us"], r
        # --quick: 20 round trips per phase; tcp pools the three phases
        assert int(r["n"]) == (60 if r["config"] == "tcp" else 20), r
    slope = read_csv(os.path.join(out, "ndlatency_slope.csv"))
    assert [(r["op"], r["config"]) for r in slope] == [("clock", c) for c in configs]
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    assert "Reproduce: `llft bench ndlatency --quick --results" in summary
    if HAVE_MPL:
        assert os.path.getsize(os.path.join(out, "ndlatency_clock.png")) > 0


@pytest.mark.slow
def test_messaging_quick(tmp_path):
    out = str(tmp_path / "results")
    assert main(["bench", "messaging", "--quick", "--results", out]) == 0
    rows = read_csv(os.path.join(out, "messaging.csv"))
    assert [(r["size_B"], r["transport"]) for r in rows] == \
        [(s, t) for s in ("64", "1024") for t in ("tcp", "udp", "llft_1r", "llft_3r")]
    assert all(int(r["n"]) > 0 and r["median_vs_tcp"] for r in rows if r["transport"] != "udp")
    assert len(read_csv(os.path.join(out, "messaging_throughput.csv"))) == 4
    assert os.path.exists(os.path.join(out, "messaging.md"))
    if HAVE_MPL:
        for png in ("messaging_latency.png", "messaging_throughput.png"):
            assert os.path.getsize(os.path.join(out, png)) > 0
