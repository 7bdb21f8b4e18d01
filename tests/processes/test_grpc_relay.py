"""The gRPC relay (determinizer/grpcrelay/): a replicated app's gRPC client channels run
no gRPC in the app; a relay process makes the real calls. And the output commit of
external sends that makes a relayed call safe across a takeover (native/llft_shm.h).

Real grpcio servers in this process, real relay processes, real sockets; the replicated
use (record/replay, takeovers) is in tests/spark/test_spark_connect.py and
`llft chaos --workload connect`.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent import futures

import grpc
import psutil
import pytest

from determinizer.grpcrelay import SITE_DIR, Relay, frames, relay_env
from determinizer.grpcrelay.channel import RelayChannel
from determinizer.runner import shim_env, spawn
from determinizer.shm import Shm


def _echo(req, ctx):
    ctx.send_initial_metadata((("im-key", "v1"),))
    ctx.set_trailing_metadata((("tm-key", "v2"), ("blob-bin", b"\x00\xff")))
    if req == b"fail":
        ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad thing")
    return req[::-1]


def _count(req, ctx):
    for i in range(int(req)):
        yield str(i).encode()


def _total(it, ctx):
    return str(sum(int(x) for x in it)).encode()


def _wait_for_cancel(req, ctx):
    ctx.add_callback(lambda: CANCELLED.append(True))
    yield b"first"
    while ctx.is_active():
        time.sleep(0.01)


CANCELLED: list[bool] = []


@pytest.fixture(scope="module")
def server():
    h = grpc.method_handlers_generic_handler("t.S", {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Count": grpc.unary_stream_rpc_method_handler(_count),
        "Total": grpc.stream_unary_rpc_method_handler(_total),
        "Hang": grpc.unary_stream_rpc_method_handler(_wait_for_cancel),
    })
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    srv.add_generic_rpc_handlers((h,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(0)


@pytest.fixture
def relay():
    r = Relay()
    yield r
    r.stop()
    assert r.proc is None or r.proc.poll() is not None


def test_calls_of_every_kind_through_the_relay(server, relay):
    ch = RelayChannel(relay.address, server, [("grpc.max_receive_message_length", 1 << 27)])
    echo = ch.unary_unary("/t.S/Echo")
    assert echo(b"hello") == b"olleh"
    resp, call = echo.with_call(b"abc", metadata=[("k", "v")])
    assert resp == b"cba" and call.code() is grpc.StatusCode.OK
    assert list(call.initial_metadata()) == [("im-key", "v1")]
    assert list(call.trailing_metadata()) == [("tm-key", "v2"), ("blob-bin", b"\x00\xff")]
    with pytest.raises(grpc.RpcError) as e:
        echo(b"fail")
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and e.value.details() == "bad thing"
    assert ("blob-bin", b"\x00\xff") in list(e.value.trailing_metadata())
    assert list(ch.unary_stream("/t.S/Count")(b"5")) == [b"0", b"1", b"2", b"3", b"4"]
    assert ch.stream_unary("/t.S/Total")(iter([b"1", b"2", b"39"])) == b"42"
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/t.S/Nope")(b"")
    assert e.value.code() is grpc.StatusCode.UNIMPLEMENTED
    # deserializers apply; sequential calls share one pooled connection
    assert ch.unary_unary("/t.S/Echo", response_deserializer=bytes.upper)(b"ab") == b"BA"
    assert len(ch._idle) == 1
    ch.close()


def test_a_cancelled_stream_cancels_the_real_call(server, relay):
    ch = RelayChannel(relay.address, server)
    CANCELLED.clear()
    s = ch.unary_stream("/t.S/Hang")(b"")
    assert next(s) == b"first"
    assert s.cancel() and s.code() is grpc.StatusCode.CANCELLED
    with pytest.raises(grpc.RpcError):
        next(s)
    deadline = time.monotonic() + 30
    while not CANCELLED and time.monotonic() < deadline:   # the relay notices the close
        time.sleep(0.01)
    assert CANCELLED
    ch.close()


def test_no_relay_fails_like_grpc(server):
    """An unreachable relay is UNAVAILABLE: raised by a unary call, and by a stream's
    first read (not by the call: gRPC clients retry there)."""
    r = Relay()
    addr = r.address
    r.stop()
    ch = RelayChannel(addr, server)
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/t.S/Echo")(b"x")
    assert e.value.code() is grpc.StatusCode.UNAVAILABLE and "relay" in e.value.details()
    s = ch.unary_stream("/t.S/Count")(b"3")        # no exception yet
    with pytest.raises(grpc.RpcError) as e:
        next(s)
    assert e.value.code() is grpc.StatusCode.UNAVAILABLE


def test_bad_frames_close_one_connection_and_the_relay_goes_on(server, relay):
    ch = RelayChannel(relay.address, server)
    assert ch.unary_unary("/t.S/Echo")(b"ab") == b"ba"           # the relay runs
    for garbage in (b"\xff\xff\xff\xff" + b"x" * 16, frames.HEADER.pack(3) + b"\xc1\xc1\xc1",
                    frames.encode({"kind": "zz", "method": 1}),
                    frames.encode({"kind": "uu", "method": "/t.S/Echo", "target": server,
                                   "compression": 99, "m": b"x", "end": True}),
                    frames.encode({"kind": "uu", "method": "/t.S/Echo", "target": server,
                                   "end": True})):
        with socket.create_connection(relay.address) as s:
            s.sendall(garbage)
            s.settimeout(30)
            try:
                assert s.recv(100) == b""                       # closed, nothing sent
            except ConnectionResetError:                        # closed with bytes unread
                pass
    assert ch.unary_unary("/t.S/Echo")(b"cd") == b"dc"           # still serving
    assert relay.proc.poll() is None


def test_a_relay_process_that_dies_is_started_again(server, relay):
    """An agent's reset kills its app's tree; a relay process killed with it (or any other
    way) is started again at the next connection: calls fail over to it (UNAVAILABLE at
    most once: the pooled connection died with the process), none waits for ever."""
    ch = RelayChannel(relay.address, server)
    assert ch.unary_unary("/t.S/Echo")(b"ab") == b"ba"
    first = relay.proc
    first.kill()
    first.wait()
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(ch.unary_unary("/t.S/Echo")(b"cd"))
        except grpc.RpcError as e:
            outcomes.append(e.code())
    assert outcomes[-1] == b"dc" and set(outcomes[:-1]) <= {grpc.StatusCode.UNAVAILABLE}
    assert relay.starts == 2 and relay.proc is not first and relay.proc.poll() is None


def test_the_relay_starts_only_when_needed_and_dies_with_its_parent(tmp_path):
    code = ("import sys, socket; sys.path.insert(0, sys.argv[1]);"
            "from determinizer.grpcrelay import Relay; r = Relay();"
            "socket.create_connection(r.address).close(); print(r.port, flush=True);"
            "import time\nwhile r.proc is None: time.sleep(0.01)\nprint(r.proc.pid, flush=True);"
            "sys.stdin.read()")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen([sys.executable, "-c", code, root], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    relay_pid = int(p.stdout.readline())
    assert psutil.Process(relay_pid).ppid() == p.pid
    p.kill()                                       # SIGKILL: no code of the parent runs
    p.wait()
    assert psutil.wait_procs([psutil.Process(relay_pid)], timeout=30)[1] == []
    idle = Relay()                                 # nobody connects: no process
    idle.stop()
    assert idle.proc is None


def test_the_hook_installs_the_channel_and_leaves_no_trace(tmp_path):
    prog = ("import os, sys, grpc; ch = grpc.insecure_channel('127.0.0.1:1');"
            "print(type(ch).__name__, os.environ.get('PYTHONPATH'),"
            " 'LLFT_GRPC_RELAY' in os.environ, any('grpcrelay' in p for p in sys.path))")
    for before in (None, str(tmp_path)):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if before:
            env["PYTHONPATH"] = before
        out = subprocess.run([sys.executable, "-c", prog],
                             env=relay_env(env, ("127.0.0.1", 1)),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["RelayChannel", str(before), "False", "False"]
    assert os.path.isfile(os.path.join(SITE_DIR, "sitecustomize.py"))


def test_record_and_replay_of_a_grpc_client(server, tmp_path):
    """tests/programs/grpc_client.py (calls of every kind from two threads, a failing one)
    records against the server and replays twice: identical output, its channel the
    relay's. A replay runs no relay (the recorded one is gone): it makes no call."""
    port = server.rsplit(":", 1)[1]
    trace = str(tmp_path / "trace")
    prog = os.path.join(os.path.dirname(__file__), "..", "programs", "grpc_client.py")
    llft = [sys.executable, "-m", "llft"]
    rec = subprocess.run(llft + ["record", "--trace", trace, "--", sys.executable, prog, port],
                         capture_output=True, timeout=120)
    assert rec.returncode == 0, rec.stderr.decode()[-2000:]
    assert b"RelayChannel" in rec.stdout and b"INVALID_ARGUMENT" in rec.stdout, rec.stdout
    for _ in range(2):
        rep = subprocess.run(llft + ["replay", "--trace", trace], capture_output=True,
                             timeout=120)
        assert rep.returncode == 0, rep.stderr.decode()[-2000:]
        assert rep.stdout == rec.stdout, (rec.stdout, rep.stdout, rep.stderr.decode()[-2000:])


def test_an_external_send_waits_for_output_commit(tmp_path):
    """At a primary whose agent asked for output commit, an external send leaves only once
    the agent says the backups hold everything recorded before it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    prog = ("import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
            "s.sendall(b'hello'); s.recv(1)")
    shm = Shm.create(Shm.PRIMARY)
    shm.set_commit(True)
    proc = spawn([sys.executable, "-c", prog, str(srv.getsockname()[1])],
                 shim_env(dict(os.environ), shm.env()))
    try:
        conn, _ = srv.accept()
        conn.settimeout(60)
        seen = 0
        while (got := shm.wait(1000, seen)) != 2:      # the send took its ticket
            if got == 1:
                shm.drain(0)
            assert proc.poll() is None
        ticket = shm.commit_req
        conn.setblocking(False)
        with pytest.raises(BlockingIOError):           # ...and is held: nothing arrived
            conn.recv(16)
        conn.setblocking(True)
        shm.commit_done(ticket)
        assert conn.recv(16) == b"hello"
        conn.sendall(b"k")
        assert proc.wait(60) == 0
        assert shm.stats()["commits"] == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shm.close()
        srv.close()
