"""Group connections (LLFT_SERVICE_PORT): the shim's side of the agent's virtual
connections, with real processes under the real shim. The test plays the agent: it
connects to the published group listener, writes the same request bytes at every replica
and reads what the app writes."""
from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from determinizer.orderinfo import CALL_IDS, SocketKind, decode
from determinizer.recordreplay import EXIT_DIVERGED
from determinizer.runner import shim_env, spawn
from determinizer.shm import Shm
from llft.tools.procs import free_port
from rr_helpers import program

import polling

TIMEOUT = 20.0


def wait_for(cond, what):
    return polling.wait_for(cond, what, TIMEOUT)


class Replica:
    """One app process under the shim, as the agent runs it."""

    def __init__(self, mode, script, args, service_port, cwd=None, stall_ms=8000):
        self.shm = Shm.create(mode, stall_ms=stall_ms)
        env = shim_env(dict(os.environ), self.shm.env(service_port))
        self.proc = spawn([sys.executable, program(script)] + [str(a) for a in args], env,
                          cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._drainer = None
        if mode == Shm.PRIMARY:
            self._drainer = threading.Thread(target=self._drain, daemon=True)
            self._drainer.start()

    def _drain(self):
        # the agent's pump: wait() without the lock, drain(0) under it
        while True:
            running = self.proc.poll() is None
            if self.shm.wait(50) or not running:
                with self._lock:
                    data = self.shm.drain(timeout_ms=0)
                    if data:
                        self._chunks.append(data)
                if not running and not data:
                    return

    def orderinfo(self) -> bytes:
        with self._lock:
            return b"".join(self._chunks)

    def feed(self, data: bytes, done=True):
        feeder = self.shm.feeder()

        def push():
            feeder.push(data, timeout_s=TIMEOUT)
            if done:
                feeder.done()
        t = threading.Thread(target=push, daemon=True)
        t.start()
        return feeder, t

    def connect(self) -> socket.socket:
        wait_for(lambda: self.shm.group_id or self.proc.poll() is not None, "the group listener")
        assert self.proc.poll() is None, self.proc.stderr.read().decode()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT)
        s.connect(self.shm.group_address)
        return s

    def finish(self, timeout=TIMEOUT):
        out, err = self.proc.communicate(timeout=timeout)
        if self._drainer:
            self._drainer.join(timeout)
        return self.proc.returncode, out.decode(), err.decode()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._drainer:
            self._drainer.join(TIMEOUT)
        self.shm.close()


def read_line(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        b = s.recv(1)
        if not b:
            break
        buf += b
    return buf


def read_all(s: socket.socket) -> bytes:
    out = b""
    while b := s.recv(65536):
        out += b
    return out


def drive_primary(rep: Replica, requests: list[list[bytes]]):
    """Connect len(requests) connections in order; in each round send one request per
    connection, then read the replies. Returns (sent, received) bytes per connection."""
    conns = [rep.connect() for _ in requests]
    sent = [b"" for _ in conns]
    got = [b"" for _ in conns]
    for rnd in range(max(len(r) for r in requests)):
        for j, s in enumerate(conns):
            if rnd < len(requests[j]):
                s.sendall(requests[j][rnd])
                sent[j] += requests[j][rnd]
        for j, s in enumerate(conns):
            if rnd < len(requests[j]):
                line = read_line(s)
                assert line, rep.proc.stderr.read().decode() if rep.proc.poll() is not None else ""
                got[j] += line
    for j, s in enumerate(conns):
        s.shutdown(socket.SHUT_WR)
        got[j] += read_all(s)
        s.close()
    return sent, got


def drive_backup(rep: Replica, sent: list[bytes]):
    """The agent at a backup: the same connections in the same order, the same bytes
    (all at once: the backup's reads take exactly the primary's counts)."""
    conns = [rep.connect() for _ in sent]
    for s, data in zip(conns, sent):
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    got = []
    for s in conns:
        try:
            got.append(read_all(s))
        except ConnectionResetError:
            got.append(None)
        s.close()
    return got


def requests_for(n_conns, rounds):
    return [[f"req {r}-{j}\n".encode() for r in range(rounds)] for j in range(n_conns)]


def primary_then_backup(script, host, requests, tmp_path):
    port = free_port()
    prim = Replica(Shm.PRIMARY, script, [host, port, len(requests)], port, cwd=str(tmp_path))
    try:
        sent, got = drive_primary(prim, requests)
        rc, out, err = prim.finish()
        assert rc == 0, err
        info = prim.orderinfo()
        assert not prim.shm.diverged
    finally:
        prim.close()
    entries = decode(info)
    group = [e for e in entries if e.flags == SocketKind.GROUP]
    assert {e.call for e in group} >= {CALL_IDS["accept"], CALL_IDS["recv"], CALL_IDS["send"]}
    assert all(not e.data for e in group if e.call in (CALL_IDS["recv"], CALL_IDS["send"]))
    return port, sent, got, out, info


def run_backup(script, host, port, n_conns, info, sent, tmp_path):
    back = Replica(Shm.BACKUP, script, [host, port, n_conns], port, cwd=str(tmp_path))
    try:
        feeder, pusher = back.feed(info)
        got = drive_backup(back, sent)
        rc, out, err = back.finish()
        pusher.join(TIMEOUT)
        return rc, out, err, got, back.shm.divergence, back.shm.report
    finally:
        back.close()


def test_wait_reports_order_info_without_taking_it(tmp_path):
    shm = Shm.create(Shm.PRIMARY)
    try:
        t0 = time.monotonic()
        assert shm.wait(30) == 0 and time.monotonic() - t0 >= 0.025      # idle: times out
        proc = spawn([sys.executable, "-c", "import time; time.time()"], shim_env(dict(os.environ), shm.env()))
        assert proc.wait(TIMEOUT) == 0
        assert shm.wait(0) == 1 and shm.wait(1000) == 1   # something to drain, still there
        data = shm.drain(timeout_ms=0)
        assert any(e.call == CALL_IDS["clock_gettime"] for e in decode(data))
        assert shm.wait(0) == 0 and shm.drain(timeout_ms=0) == b""
    finally:
        shm.close()


@pytest.mark.parametrize("script,host", [("group_counter.py", "0.0.0.0"), ("group_async.py", "any")],
                         ids=["threads", "asyncio"])
def test_backup_writes_the_primarys_bytes_on_every_group_connection(script, host, tmp_path):
    requests = requests_for(3, 4)
    port, sent, got, out, info = primary_then_backup(script, host, requests, tmp_path)
    assert all(len(g.splitlines()) == 4 for g in got), got
    rc, bout, err, bgot, div, report = run_backup(script, host, port, 3, info, sent, tmp_path)
    assert rc == 0, err + report
    assert div is None
    assert bgot == got            # byte for byte, per connection
    assert bout == out
    assert f"listening" in out


def test_a_different_reply_at_the_backup_names_connection_and_offset(tmp_path):
    tag = tmp_path / "tag.txt"
    tag.write_text("alpha\n")
    requests = [[b"x\n", b"y\n"], [b"x\n", b"file:tag.txt\n"], [b"x\n", b"y\n"]]
    port, sent, got, out, info = primary_then_backup("group_counter.py", "127.0.0.1", requests, tmp_path)
    assert got[1].splitlines()[1].endswith(b"alpha")
    tag.write_text("beta\n")      # the backup's reply to conn 1's 2nd request differs
    rc, bout, err, bgot, div, report = run_backup("group_counter.py", "127.0.0.1", port, 3, info,
                                                  sent, tmp_path)
    first = len(got[1].splitlines(keepends=True)[0])
    assert rc == EXIT_DIVERGED, err
    assert div == (1, first), report
    assert "group connection 1" in report and f"offset {first}" in report
    assert bgot[1] is None or bgot[1] == got[1][:first]   # the differing bytes never left


def test_two_primaries_share_the_service_port_on_one_host(tmp_path):
    port = free_port()
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))   # the service port is really taken on this host
    squatter.listen(1)
    reps = [Replica(Shm.PRIMARY, "group_counter.py", [h, port, 1], port, cwd=str(tmp_path))
            for h in ("0.0.0.0", "::")]
    try:
        conns = [r.connect() for r in reps]
        assert reps[0].shm.group_address != reps[1].shm.group_address
        for s in conns:
            s.sendall(b"hello\n")
            assert read_line(s).startswith(b"0 hello n=1 ")
            s.shutdown(socket.SHUT_WR)
            assert read_all(s) == b""
        outs = []
        for r in reps:
            rc, out, err = r.finish()
            assert rc == 0, err
            outs.append(out)
        assert outs[0].splitlines()[0] == f"listening ('0.0.0.0', {port})"
        assert outs[1].splitlines()[0] == f"listening ('::', {port})"
        for out in outs:   # an accepted connection's local name carries the service port
            assert out.splitlines()[1].endswith(f" {port}")
        assert [r.shm.group_id for r in reps] == [0, 0]   # the listeners are closed
    finally:
        squatter.close()
        for r in reps:
            r.close()


def test_promoted_backup_serves_new_requests_live(tmp_path):
    port = free_port()
    prim = Replica(Shm.PRIMARY, "group_counter.py", ["0.0.0.0", port, 3], port, cwd=str(tmp_path))
    try:
        conns = [prim.connect() for _ in range(3)]
        first = [f"one {j}\n".encode() for j in range(3)]
        for s, req in zip(conns, first):
            s.sendall(req)
        replies = [read_line(s) for s in conns]
        # the order info of round 1 is complete once its three replies are recorded
        send = CALL_IDS["send"]
        wait_for(lambda: sum(e.call == send and e.flags == SocketKind.GROUP for e in decode(prim.orderinfo())) == 3,
                 "the primary's round-1 writes in its order info")
        prefix = prim.orderinfo()
    finally:
        prim.close()            # the primary fails
        for s in conns:
            s.close()
    back = Replica(Shm.BACKUP, "group_counter.py", ["0.0.0.0", port, 3], port, cwd=str(tmp_path))
    try:
        feeder, pusher = back.feed(prefix, done=False)
        bconns = [back.connect() for _ in range(3)]
        for s, req in zip(bconns, first):
            s.sendall(req)
        assert [read_line(s) for s in bconns] == replies     # replayed
        pusher.join(TIMEOUT)
        wait_for(lambda: feeder.consumed >= feeder.fed_entries, "the backup to consume the order info")
        back.shm.promote()
        t0 = time.time()
        for j, s in enumerate(bconns):
            s.sendall(f"two {j}\n".encode())
        live = [read_line(s) for s in bconns]
        assert all(live), back.finish()
        counters = sorted(int(l.split()[3][2:]) for l in live)
        assert counters == [4, 5, 6], live
        for j, l in enumerate(live):
            assert l.startswith(f"{j} two {j} ".encode())
            assert float(l.split()[4][2:]) >= t0 - 1          # the group clock, live
        for s in bconns:
            s.shutdown(socket.SHUT_WR)
            assert read_all(s) == b""
            s.close()
        rc, out, err = back.finish()
        assert rc == 0, err
        assert out.splitlines()[-1] == "done 6"
        assert not back.shm.diverged
    finally:
        back.close()


def _drive_resets(rep: Replica, read_back: bool) -> bool:
    """The agent's side of group_resets.py: reset connection 0 after its bytes, then
    read connection 1's end; whether the app reset it. Connection 2: a line, then a
    close after reading the app's answer (`read_back`) or with it unread (the app's
    read of the end then fails with ECONNRESET: a UNIX socket's close resets its peer
    when it had unread bytes)."""
    s = rep.connect()
    s.sendall(b"abc")
    assert rep.shm.reset_conn(0)
    s.close()
    s = rep.connect()
    s.sendall(b"x\n")
    assert read_all(s) == b""
    s.close()
    reset = rep.shm.app_reset(1)
    s = rep.connect()
    s.sendall(b"y\n")
    if read_back:
        assert s.recv(100) == b"y\n"
    else:
        assert select.select([s], [], [], TIMEOUT)[0]     # the answer is there, unread
    s.close()
    return reset


@pytest.mark.parametrize("host", ["127.0.0.1", "::"])
def test_resets_cross_a_group_connection_both_ways_and_replay(host, tmp_path):
    """A group connection is a UNIX socket, which has no reset: the agent's reset (a
    client's RST) reaches the app's read as ECONNRESET after the bytes before it, and the
    app's close after SO_LINGER 0 reaches the agent as a reset, at the primary and at a
    backup replaying it (the same output). A backup's agent that closes with the app's
    output unread (its timing, not the primary's) ends the app's read there as the
    primary's EOF. TCP options are taken; the app sees TCP."""
    port = free_port()
    prim = Replica(Shm.PRIMARY, "group_resets.py", [host, port], port, cwd=str(tmp_path))
    try:
        assert _drive_resets(prim, read_back=True)
        rc, out, err = prim.finish()
        assert rc == 0, err
        info = prim.orderinfo()
    finally:
        prim.close()
    lines = out.splitlines()
    assert lines[1] == f"conn 0 True {'127.0.0.1' if host[0] == '1' else '::ffff:127.0.0.1'} {port}"
    assert lines[2] == "conn 0 read b'abc' then ECONNRESET"
    assert lines[3:] == ["conn 1 read b'x\\n'", "conn 2 read b'y\\n' then EOF", "done"]
    back = Replica(Shm.BACKUP, "group_resets.py", [host, port], port, cwd=str(tmp_path))
    try:
        feeder, pusher = back.feed(info)
        assert _drive_resets(back, read_back=False)
        rc, bout, err = back.finish()
        pusher.join(TIMEOUT)
        assert rc == 0, err + back.shm.report
        assert bout == out
        assert not back.shm.app_reset(1)          # taken once
    finally:
        back.close()


STRAY = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(bytes.fromhex(sys.argv[1]))
print("connected", flush=True)
s.settimeout(20)
try:
    print("ended", repr(s.recv(100)), flush=True)
except ConnectionResetError:
    print("ended reset", flush=True)
"""


def _stray_then_agent(rep: Replica, sent: bytes) -> tuple[bytes, str]:
    """Another process connects to the group listener first; then the agent (this test).
    Returns what the agent's connection read and how the stray one ended."""
    wait_for(lambda: rep.shm.group_id or rep.proc.poll() is not None, "the group listener")
    stray = subprocess.Popen([sys.executable, "-c", STRAY, rep.shm.group_address.hex()],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert stray.stdout.readline() == "connected\n"     # queued ahead of the agent
        s = rep.connect()
        s.sendall(sent)
        s.shutdown(socket.SHUT_WR)
        got = read_all(s)
        s.close()
        out = stray.stdout.readline()        # (communicate would skip what readline buffered)
        stray.wait(TIMEOUT)
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()
    return got, out.strip()


def test_only_the_agent_connects_to_the_group_listener(tmp_path):
    """The listener's abstract name is visible to every process of the host
    (/proc/net/unix). A connection from another process than the agent is closed at once
    and counted, at the primary (it would be input no replica agreed on) and at a
    backup (it would take the agent's place): the app serves the agent's connection
    only, and the backup replays the primary's run byte for byte."""
    port = free_port()
    prim = Replica(Shm.PRIMARY, "group_counter.py", ["127.0.0.1", port, 1], port, cwd=str(tmp_path))
    try:
        got, stray = _stray_then_agent(prim, b"one\ntwo\n")
        assert stray == "ended b''"
        assert [l.split()[:3] for l in got.splitlines()] == [[b"0", b"one", b"n=1"],
                                                             [b"0", b"two", b"n=2"]]
        rc, out, err = prim.finish()
        assert rc == 0, err
        assert prim.shm.stats()["stray_conns"] == 1
        info = prim.orderinfo()
    finally:
        prim.close()
    back = Replica(Shm.BACKUP, "group_counter.py", ["127.0.0.1", port, 1], port, cwd=str(tmp_path))
    try:
        feeder, pusher = back.feed(info)
        bgot, stray = _stray_then_agent(back, b"one\ntwo\n")
        rc, bout, err = back.finish()
        pusher.join(TIMEOUT)
        assert rc == 0, err + back.shm.report
        assert stray == "ended b''" and bgot == got and bout == out
        assert back.shm.stats()["stray_conns"] == 1
    finally:
        back.close()
