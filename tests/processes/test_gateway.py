"""The example services, the load client, and `llft gateway` in front of a group.

Real processes, loopback multicast only (random group addresses per run). The group
behind the gateway is a static-view group of `llft.tools.streamdemo --echo` members (1 and 3
members): every reply byte must reach each client exactly once and in order. Waiting is
on the processes' ready lines and on conditions with deadlines, never on sleeps.
"""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from llft import EXAMPLES_DIR
from llft.runtime import keys
from llft.tools.loadclient import run_load, wait_listening
from llft.tools.procs import ProcGroup, free_port, random_group_addresses

EXAMPLES = EXAMPLES_DIR


def start_service(pg: ProcGroup, name: str, script: str) -> int:
    port = free_port()
    pg.start(name, [sys.executable, os.path.join(EXAMPLES, script), str(port)])
    assert wait_listening("127.0.0.1", port, 15), pg.stderr(name)
    return port


# -- the example services, plainly ------------------------------------------------------
def test_kv_counter_plain_counter_load(tmp_path):
    pg = ProcGroup(str(tmp_path))
    try:
        port = start_service(pg, "kv", "kv_counter.py")
        r = run_load("127.0.0.1", port, clients=4, requests=300, mode="counter", timeout_s=10)
        assert r.ok, r.errors
        assert r.requests == r.replies == 1200 and r.global_repeats == 0
        assert len(r.latencies) == 1200 and [len(t) for t in r.reply_times] == [300] * 4
        assert 0 < r.max_gap_s <= r.elapsed_s and 0 <= r.max_gap_client < 4
        # a second run against the same service: fresh keys, counts start at 1 again
        r2 = run_load("127.0.0.1", port, clients=2, requests=50, mode="counter", timeout_s=10)
        assert r2.ok, r2.errors
        # the protocol's other requests
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"SET k 41\nINCR k\nGET k\nGET nope\nBOGUS\n")
            f = s.makefile("rb")
            lines = [f.readline() for _ in range(5)]
        assert lines[0] == b"OK k 41\n"
        assert lines[1].startswith(b"OK k 42 ")
        assert lines[2] == b"OK k 42\n"
        assert lines[3].startswith(b"ERR") and lines[4].startswith(b"ERR")
        assert pg.procs["kv"].events == []          # nothing printed per request
    finally:
        pg.stop_all()


def test_echo_plain_echo_load(tmp_path):
    pg = ProcGroup(str(tmp_path))
    try:
        port = start_service(pg, "echo", "echo.py")
        r = run_load("127.0.0.1", port, clients=4, requests=300, mode="echo", size=1024,
                     timeout_s=10)
        assert r.ok, r.errors
        assert r.replies == 1200 and r.size == 1024
    finally:
        pg.stop_all()


def test_loadclient_reports_failures_instead_of_hanging(tmp_path):
    pg = ProcGroup(str(tmp_path))
    try:
        # wrong protocol: the echo service answers INCR with "INCR ..." -> errors, no hang
        port = start_service(pg, "echo", "echo.py")
        r = run_load("127.0.0.1", port, clients=2, requests=5, mode="counter", timeout_s=5)
        assert not r.ok and r.error_count >= 2 and "unexpected reply" in r.errors[0]
        # the service dies mid-run: every client ends with an error, promptly
        kv = start_service(pg, "kv", "kv_counter.py")
        some = threading.Event()
        out = {}

        def load():
            out["r"] = run_load("127.0.0.1", kv, clients=4, requests=10**7, timeout_s=20,
                                on_reply=lambda c, n: n >= 20 and some.set())
        t = threading.Thread(target=load)
        t.start()
        assert some.wait(15)
        pg.signal("kv", signal.SIGKILL)
        t.join(25)
        assert not t.is_alive()
        r = out["r"]
        assert not r.ok and 0 < r.replies < r.requests + 1
        assert any("connection" in e for e in r.errors), r.errors
        # nothing listening at all
        r = run_load("127.0.0.1", free_port(), clients=2, requests=5, timeout_s=5)
        assert not r.ok and all("cannot connect" in e for e in r.errors)
    finally:
        pg.stop_all()


# -- the gateway in front of a static-view echo group ------------------------------------
def write_cluster(tmp_path, group: str = "echo") -> tuple[str, str]:
    """A key, a configuration and the matching streamdemo --addresses string."""
    key = tmp_path / "cluster.key"
    keys.write_key(str(key))
    addrs = random_group_addresses([group, f"{group}.gateway.*"])   # every gateway
    amap = dict(item.split("=") for item in addrs.split(","))
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(f"""[cluster]
key_file = "cluster.key"
interface = "127.0.0.1"
runtime_dir = "run"

[group.{group}]
address = "{amap[group]}"
service_port = 9000
gateway_address = "{amap[group + '.gateway.*']}"
""")
    return str(cfg), addrs


def start_gateway(pg: ProcGroup, cfg: str, group: str = "echo") -> tuple[int, dict]:
    gw = pg.python("gateway", "llft", "gateway", "--config", cfg, "--group", group,
                   "--listen", "127.0.0.1:0")
    assert pg.wait(lambda: gw.find("ready") or gw.popen.poll() is not None, 30), \
        pg.stderr("gateway")
    ready = gw.find("ready")
    assert ready, pg.stderr("gateway")
    assert ready["group"] == group and ready["listen"][0] == "127.0.0.1"
    return ready["listen"][1], ready


@pytest.mark.parametrize("members", [1, 3])
def test_gateway_echo_group_exactly_once(tmp_path, members):
    cfg, addrs = write_cluster(tmp_path)
    pg = ProcGroup(str(tmp_path))
    births = [str(100 + i) for i in range(members)]
    try:
        for b in births:
            pg.python(f"m{b}", "llft.tools.streamdemo", "--echo", "--key", str(tmp_path / "cluster.key"),
                      "--group", "echo", "--me", b, "--members", ",".join(births),
                      "--addresses", addrs)
        assert pg.wait(lambda: all(pg.procs[f"m{b}"].find("ready") for b in births), 30)
        port, _ = start_gateway(pg, cfg)
        status_dir = tmp_path / "run" / "echo"
        gw_pid = pg.procs["gateway"].popen.pid
        status_file = status_dir / f"gateway-{gw_pid}.json"
        assert status_file.exists()            # written before the ready line

        r = run_load("127.0.0.1", port, clients=4, requests=150, mode="echo", size=1024,
                     timeout_s=20)
        assert r.ok, r.errors
        assert r.replies == 600 and all(len(t) == 150 for t in r.reply_times)

        # the status file follows the counters (rewritten every 500 ms)
        def status_caught_up():
            try:
                st = json.loads(status_file.read_text())
            except (OSError, ValueError):
                return False
            return st["bytes_out"] >= 600 * 1024
        assert pg.wait(status_caught_up, 10)
        st = json.loads(status_file.read_text())
        assert st["bytes_in"] == st["bytes_out"] == 600 * 1024
        assert st["gaps"] == 0 and st["clients_total"] == 4
        assert st["transport"]["accepted_messages"] > 0
        # the steady group connection ran on the lane (llft/protocol/messaging/lane.py):
        # the requests' sends and replies, with a loan taken back only now and then (a
        # keep-alive, a timer, the status); a driver's question about a core attribute
        # it lacks takes nothing back
        lane = st["lane"]
        assert lane["events"] >= 150 and lane["events"] > lane["loans"] > 0, lane
        assert "takeover_held" not in lane["reclaimed_for"], lane

        # a client that leaves abruptly is dropped; the others go on being served
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"x" * 5000)
        r = run_load("127.0.0.1", port, clients=2, requests=20, mode="echo", size=64,
                     timeout_s=20)
        assert r.ok, r.errors

        def all_gone():
            try:
                st = json.loads(status_file.read_text())
            except (OSError, ValueError):
                return False
            return st["clients"] == 0 and st["clients_total"] == 7
        assert pg.wait(all_gone, 10)

        pg.signal("gateway", signal.SIGTERM)
        gw = pg.procs["gateway"].popen
        assert pg.wait(lambda: gw.poll() is not None, 10)
        assert gw.returncode == 0, pg.stderr("gateway")
        assert not status_file.exists()
        assert pg.stderr("gateway") == ""
    finally:
        pg.stop_all()


# -- errors: one line, exit 2 -------------------------------------------------------------
def gateway_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llft", "gateway", *args],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})


def assert_one_line_error(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llft gateway: "), p.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_gateway_errors_exit_2_with_one_line(tmp_path):
    cfg, _ = write_cluster(tmp_path)
    assert_one_line_error(gateway_cli("--config", str(tmp_path / "nope.toml"), "--group",
                                      "echo", "--listen", "127.0.0.1:0"),
                          "no such configuration file")
    assert_one_line_error(gateway_cli("--config", cfg, "--group", "other",
                                      "--listen", "127.0.0.1:0"), "[group.other]")
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\n")
    assert_one_line_error(gateway_cli("--config", str(bad), "--group", "echo",
                                      "--listen", "127.0.0.1:0"), "not valid TOML")
    assert_one_line_error(gateway_cli("--config", cfg, "--group", "echo",
                                      "--listen", "nonsense"), "--listen")
    # a port that is taken
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        assert_one_line_error(gateway_cli("--config", cfg, "--group", "echo", "--listen",
                                          f"127.0.0.1:{taken.getsockname()[1]}"),
                              "cannot listen")
    finally:
        taken.close()
    # what runs the group connection's lane: a value it does not know
    assert_one_line_error(gateway_cli("--config", cfg, "--group", "echo", "--listen",
                                      "127.0.0.1:0", env={"LLFT_LANE": "fast"}),
                          "LLFT_LANE")
    # the key: unsafe mode, then missing
    os.chmod(tmp_path / "cluster.key", 0o644)
    assert_one_line_error(gateway_cli("--config", cfg, "--group", "echo",
                                      "--listen", "127.0.0.1:0"), "key_file")
    os.unlink(tmp_path / "cluster.key")
    assert_one_line_error(gateway_cli("--config", cfg, "--group", "echo",
                                      "--listen", "127.0.0.1:0"), "key_file")


# -- de-duplication by stream offset (what a failover of the group's primary produces) ---
class FakeTransport:
    """What the gateway writes to a client (its ClientSocket's transport)."""

    def __init__(self):
        self.size = 0                       # bytes the client has not read
        self.data = bytearray()
        self.closed = False
        self.eof = False

    def get_write_buffer_size(self):
        return self.size

    def get_write_buffer_limits(self):
        return (16 << 10, 64 << 10)         # asyncio's defaults

    def write(self, b):
        assert not self.eof
        self.data += b

    def can_write_eof(self):
        return True

    def write_eof(self):
        self.eof = True

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


class FakeWriter:
    """A client's socket as the gateway holds it (a ClientSocket)."""
    write_paused = False

    def __init__(self):
        self.transport = FakeTransport()

    data = property(lambda self: self.transport.data)
    eof = property(lambda self: self.transport.eof)
    closed = property(lambda self: self.transport.closed)

    async def writable(self):
        pass


def test_gateway_deduplicates_replies_by_offset(tmp_path):
    """The group's byte stream (one group connection, every client a stream in it) is
    de-duplicated by offset across a resend, cut into frames whatever the cut, and each
    frame reaches its client once; a gap or a frame breaking the rules resets every
    client rather than handing one a corrupt stream."""
    from llft.runtime import config
    from llft.runtime.gateway import Client, Gateway
    from llft.protocol.messaging import Deliver
    from llft.protocol.streams import Kind, data_frames, frame
    cfg = config.parse({"cluster": {"key_file": "k", "runtime_dir": str(tmp_path)},
                        "group": {"g": {"address": "239.255.9.9:40000",
                                        "service_port": 9000}}}, str(tmp_path / "c.toml"))

    async def main():
        gw = Gateway(cfg, "g", b"k" * 32, ("127.0.0.1", 0))
        assert gw.gateway_group.startswith("g.gateway.") and 0 < gw.birth < 2 ** 63
        gw.conn_open = True             # (as its first client opens it)
        framed = bytearray()            # what the gateway gives messaging
        gw.outbox._send = lambda view: (framed.extend(view), len(view))[1]
        writers = {}
        for _ in range(3):
            st = gw.streams.open_next()
            writers[st.id] = FakeWriter()
            gw.clients[st.id] = Client(st.id, writers[st.id], f"peer{st.id}")
        a, b = bytes(range(256)) * 4, b"reply of two" * 10
        group = b"".join([*data_frames(1, a[:300]), *data_frames(2, b), frame(Kind.FIN, 2),
                          *data_frames(1, a[300:])])
        # the old primary delivers [0, 500); the new primary resends from 400 (phase 2)
        gw._on_action(Deliver(gw.conn, 0, group[:500]))
        gw._on_action(Deliver(gw.conn, 400, group[400:900]))   # overlaps: 100 bytes dropped
        gw._on_action(Deliver(gw.conn, 450, group[450:600]))   # wholly a duplicate
        gw._on_action(Deliver(gw.conn, 900, group[900:]))
        assert bytes(writers[1].data) == a and bytes(writers[2].data) == b
        assert writers[2].eof and not writers[1].eof
        assert gw.counters["duplicate_bytes"] == 100 + 150
        assert gw.counters["duplicate_deliveries"] == 2 and gw.counters["gaps"] == 0
        # a client that never reads its replies is dropped past the backlog bound (its
        # stream is reset into the group); the others go on
        writers[3].transport.size = 1 << 40
        gw._on_action(Deliver(gw.conn, len(group), data_frames(3, b"reply")[0]))
        assert writers[3].closed and gw.counters["clients_dropped_slow"] == 1
        await asyncio.sleep(0)          # (the outbox pushes at the end of a loop turn)
        assert (framed + gw.outbox.buf).endswith(frame(Kind.RST, 3))
        # a gap is a bug: counted, and every client is reset (never a corrupt stream)
        gw._on_action(Deliver(gw.conn, 10 ** 6, b"late"))
        assert gw.counters["gaps"] == 1 and writers[1].closed
        assert bytes(writers[1].data) == a
        gw.outbox.close()
        gw.endpoint.close()

    asyncio.run(main())


def test_gateway_grants_what_its_client_took(tmp_path):
    """Group -> client credit (streams.py): a WINDOW of what the client's socket took,
    once per GRANT_STEP_BYTES; nothing while the client has not read, none after the
    group's end of the stream."""
    from llft.runtime import config
    from llft.runtime.gateway import Client, Gateway
    from llft.protocol.messaging import Deliver
    from llft.protocol.streams import (GRANT_STEP_BYTES, FrameDecoder, Kind, data_frames,
                                       frame, window_value)
    cfg = config.parse({"cluster": {"key_file": "k", "runtime_dir": str(tmp_path)},
                        "group": {"g": {"address": "239.255.9.9:40000",
                                        "service_port": 9000}}}, str(tmp_path / "c.toml"))

    async def main():
        gw = Gateway(cfg, "g", b"k" * 32, ("127.0.0.1", 0))
        gw.conn_open = True
        framed = bytearray()
        gw.outbox._send = lambda view: (framed.extend(view), len(view))[1]
        st = gw.streams.open_next()
        w = FakeWriter()
        gw.clients[st.id] = Client(st.id, w, "peer")
        at = 0

        def deliver(data: bytes) -> None:
            nonlocal at
            gw._on_action(Deliver(gw.conn, at, data))
            at += len(data)

        def grants() -> list[int]:
            return [window_value(f) for f in FrameDecoder().feed(bytes(framed + gw.outbox.buf))
                    if f.kind is Kind.WINDOW]

        step = b"x" * (GRANT_STEP_BYTES // 2)
        deliver(b"".join(data_frames(st.id, step)))
        assert grants() == []                       # half a step taken: not yet
        w.transport.size = 3 * len(step)            # the client stopped reading ...
        deliver(b"".join(data_frames(st.id, step * 3)))
        assert grants() == [len(step)] or grants() == []
        w.transport.size = 0                        # ... and read everything
        deliver(b"".join(data_frames(st.id, step)))
        assert grants()[-1] == 5 * len(step)
        n = len(grants())
        deliver(frame(Kind.FIN, st.id))             # the group's side ended
        assert len(grants()) == n
        gw.outbox.close()
        gw.endpoint.close()

    asyncio.run(main())


def test_gateway_resets_clients_on_a_frame_that_breaks_the_rules(tmp_path):
    """A frame of a stream the gateway never opened (the group's bytes are authenticated:
    a bug there) resets the clients instead of guessing."""
    from llft.runtime import config
    from llft.runtime.gateway import Client, Gateway
    from llft.protocol.messaging import Deliver
    from llft.protocol.streams import data_frames
    cfg = config.parse({"cluster": {"key_file": "k", "runtime_dir": str(tmp_path)},
                        "group": {"g": {"address": "239.255.9.9:40000",
                                        "service_port": 9000}}}, str(tmp_path / "c.toml"))

    async def main():
        gw = Gateway(cfg, "g", b"k" * 32, ("127.0.0.1", 0))
        w = FakeWriter()
        gw.conn_open = True             # (as its first client opens it)
        gw.clients[gw.streams.open_next().id] = Client(1, w, "peer")
        gw._on_action(Deliver(gw.conn, 0, data_frames(7, b"xyz")[0]))
        assert gw.counters["broken_group_stream"] == 1 and w.closed
        gw.outbox.close()
        gw.endpoint.close()

    asyncio.run(main())
