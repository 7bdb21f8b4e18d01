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
from llft.tools import chaos
from llft.tools.loadclient import run_load
from llft.tools.procs import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "..", "programs", "connect_client.py")


def llft(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llft", "spark-connect", *args],
                          capture_output=True, text=True, timeout=300, env=env)


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


def test_record_and_replay_of_a_thin_client(tmp_path):
    """A Spark Connect client records with a server and replays WITHOUT one: its gRPC
    calls were the relay's (determinizer/grpcrelay/), and a backup (`llft replay`) reads
    their answers from the trace, so it needs no Spark at all. grpcio's C-core never
    runs in the recorded process (the channel is the relay's)."""
    port, state = free_port(), str(tmp_path / "sc")
    assert llft("start", "--port", str(port), "--dir", state,
                "--master", "local[1]").returncode == 0
    trace = str(tmp_path / "trace")
    cmd = [sys.executable, CLIENT, str(port), "--channel"]
    try:
        rec = subprocess.run([sys.executable, "-m", "llft", "record", "--trace", trace, "--",
                              *cmd], capture_output=True, text=True, timeout=300)
    finally:
        assert llft("stop", "--port", str(port), "--dir", state).returncode == 0
    assert rec.returncode == 0, rec.stderr[-2000:]
    want = sorted((k, sum(1 for i in range(1000) if i % 7 == k)) for k in range(7))
    lines = rec.stdout.strip().splitlines()
    assert lines[0] == str(want)
    assert lines[1] == "channel RelayChannel"
    with socket.socket() as s:                  # nothing serves the port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0
    for _ in range(2):
        rep = subprocess.run([sys.executable, "-m", "llft", "replay", "--trace", trace],
                             capture_output=True, text=True, timeout=300)
        assert rep.returncode == 0, rep.stderr[-3000:]
        assert rep.stdout == rec.stdout


def test_replicated_connect_driver_kill_restart_kill(tmp_path):
    """examples/spark_counter.py --remote (a Spark job per request on a shared Connect server,
    a ticker thread running Python UDF jobs) replicated twice with the default configuration,
    the kv counter's checking clients through the gateway: the backup does no Spark work
    (no connection to the relay or the server, a fraction of the primary's CPU), then a
    primary kill, a restart of the new primary (SIGTERM, a new replica rejoins) and a
    primary kill again: every reply right and executed once, no divergence, nothing
    left behind. No timing is asserted."""
    wl = chaos.WORKLOADS["connect"]
    lines: list[str] = []
    c = chaos.Campaign(str(tmp_path), wl, replicas=2, clients=2, say=lines.append)
    leftovers: list[str] = []
    try:
        c.start()
        members = {m["role"]: m for m in c.members()}
        primary = psutil.Process(members["primary"]["app_pid"])
        backup = psutil.Process(members["backup"]["app_pid"])
        busy = lambda p: sum(p.cpu_times()[:2])        # noqa: E731
        before = busy(primary), busy(backup)
        load = run_load(c.host, c.port, clients=2, requests=15, mode="counter",
                        timeout_s=120)
        assert load.ok, load.errors[:3]
        relay_port = c.lc.cfg.group("chaos").grpc_relay_port

        def peers(p):
            return {x.raddr.port for x in p.net_connections(kind="tcp") if x.raddr}
        assert relay_port in peers(primary)
        assert not peers(backup) & {relay_port, c.connect_port}
        lines.append(f"app CPU for {load.replies} replies (Spark jobs): primary "
                     f"{busy(primary) - before[0]:.2f} s, backup {busy(backup) - before[1]:.2f} s")
        outcomes = [c.run_fault(chaos.Fault(i, kind, 0.3, 0.0, 0)) for i, kind in
                    enumerate(("kill_primary", "restart", "kill_primary"))]
        for o in outcomes:
            lines.append(f"{o.fault.kind} {o.target}: takeovers {o.takeovers}, replies {o.replies}, "
                         f"lost {o.lost}, dup {o.duplicated}, wrong {o.wrong}, "
                         f"diverged {o.diverged}, left {o.leftovers}, errors {o.errors[:2]}")
    finally:
        leftovers = c.stop()
    log = "\n".join(lines)
    assert leftovers == [], log
    assert all(o.ok and o.settled and o.resumed for o in outcomes), log
    assert [o.takeovers for o in outcomes] == [1, 1, 1], log
    print(log)
