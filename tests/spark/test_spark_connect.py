"""`llft spark-connect`: a real Spark Connect server from the pyspark wheel, a real client.

One JVM: started, used by the thin client (tests/programs/connect_client.py), stopped; the
server listens on loopback only, and nothing it started is left afterwards.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from llft.spark.connect import Server

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "..", "programs", "connect_client.py")


def llft(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llft", "spark-connect", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_from_the_wheel_serves_a_thin_client_and_leaves_nothing(tmp_path):
    port, state = free_port(), str(tmp_path / "sc")
    common = ["--port", str(port), "--dir", state]
    r = llft("start", *common, "--master", "local[1]")
    assert r.returncode == 0, r.stderr
    server = Server(port, state_dir=state)
    pid = server.pid()
    try:
        assert pid is not None and f"pid {pid}" in r.stdout
        jvm = psutil.Process(pid)
        listening = [c.laddr for c in jvm.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert listening and all(a.ip in ("127.0.0.1", "::ffff:127.0.0.1") for a in listening)
        st = llft("status", *common)
        assert st.returncode == 0 and "(accepting)" in st.stdout
        # a second start finds it running: the same JVM
        again = llft("start", *common)
        assert again.returncode == 0 and f"pid {pid}" in again.stdout
        out = subprocess.run([sys.executable, CLIENT, str(port)], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        want = sorted((k, sum(1 for i in range(1000) if i % 7 == k)) for k in range(7))
        assert out.stdout.strip().splitlines()[-1] == str(want)
        tree = [jvm] + jvm.children(recursive=True)
    finally:
        stop = llft("stop", *common)
    assert stop.returncode == 0 and "stopped" in stop.stdout
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert llft("status", *common).returncode == 1
    assert llft("stop", *common).stdout.strip() == "not running"


def test_no_java_is_one_clear_line_and_nothing_starts(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}          # no java, no JAVA_HOME
    r = llft("start", "--port", str(free_port()), "--dir", str(tmp_path / "sc"), env=env)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Java found" in lines[0] and "install" in lines[0]
    assert not os.path.exists(tmp_path / "sc" / "pids")


class ReplayDiverged(Exception):
    """`llft replay` did not reproduce the recorded run (the known failure below; any
    other failure of the test is a real one)."""


@pytest.mark.xfail(strict=True, raises=ReplayDiverged, reason=(
    "issue 15: grpcio's C-core starts its own threads (a native thread pool) in no stable "
    "order; `llft replay` of a Connect client diverges on them (\"thread 5 call #0: the "
    "trace has getsockopt(...), the program made epoll_wait(...)\")"))
def test_record_and_replay_of_a_thin_client(tmp_path):
    port, state = free_port(), str(tmp_path / "sc")
    assert llft("start", "--port", str(port), "--dir", state,
                "--master", "local[1]").returncode == 0
    try:
        trace = str(tmp_path / "trace")
        cmd = [sys.executable, CLIENT, str(port)]
        rec = subprocess.run([sys.executable, "-m", "llft", "record", "--trace", trace, "--",
                              *cmd], capture_output=True, text=True, timeout=300)
        assert rec.returncode == 0, rec.stderr[-2000:]
        rep = subprocess.run([sys.executable, "-m", "llft", "replay", "--trace", trace, "--",
                              *cmd], capture_output=True, text=True, timeout=300)
        if rep.returncode != 0 or rep.stdout.splitlines()[-1:] != rec.stdout.splitlines()[-1:]:
            raise ReplayDiverged(rep.stderr[-2000:])
    finally:
        llft("stop", "--port", str(port), "--dir", state)
