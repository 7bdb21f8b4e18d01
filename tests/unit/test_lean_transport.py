"""LeanTransport and LeanServer (llft/runtime/sockets.py) against asyncio's own socket
transport: the same scenarios over real loopback connections, once on each, must show
the protocols the same calls in the same order (bytes compared whole: reads may be cut
differently). The agent and the gateway swapped asyncio's transport for the lean one,
so anything asyncio's did for them that the lean one does not shows up here."""
from __future__ import annotations

import asyncio
import errno
import resource
import socket
import struct

import pytest

from llft.runtime import sockets
from llft.runtime.sockets import LeanServer, connect_lean

KINDS = ["asyncio", "lean"]


class Recorder(asyncio.BufferedProtocol):
    """Records the calls a transport makes; `keep_open` is what eof_received returns."""

    def __init__(self, keep_open: bool = True):
        self.calls: list = []
        self.data = bytearray()
        self.transport = None
        self.keep_open = keep_open
        self.lost = asyncio.get_running_loop().create_future()
        self.eof = asyncio.get_running_loop().create_future()
        self.resumed = asyncio.Event()
        self._buf = bytearray(4096)

    def _note(self, call):
        if not self.calls or self.calls[-1] != call or call != "data":
            self.calls.append(call)

    def connection_made(self, transport):
        self.transport = transport
        self._note("made")

    def get_buffer(self, sizehint):
        return self._buf

    def buffer_updated(self, nbytes):
        self.data += self._buf[:nbytes]
        self._note("data")

    def eof_received(self):
        self._note("eof")
        self.eof.set_result(None)
        return self.keep_open

    def pause_writing(self):
        self._note("pause_writing")

    def resume_writing(self):
        self._note("resume_writing")
        self.resumed.set()

    def connection_lost(self, exc):
        self._note(("lost", type(exc).__name__ if exc else None))
        self.lost.set_result(exc)


async def pair(kind: str, server_keep_open: bool = True):
    """(client protocol, server protocol, closer) connected over loopback."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Queue = asyncio.Queue()

    def factory():
        p = Recorder(server_keep_open)
        accepted.put_nowait(p)
        return p

    if kind == "asyncio":
        server = await loop.create_server(factory, "127.0.0.1", 0, reuse_address=True)
        port = server.sockets[0].getsockname()[1]
        _, client = await loop.create_connection(Recorder, "127.0.0.1", port)
    else:
        server = LeanServer(loop, factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = await connect_lean(loop, ("127.0.0.1", port), Recorder)
        client = transport.get_protocol()
    srv = await asyncio.wait_for(accepted.get(), 5)
    while srv.transport is None or client.transport is None:
        await asyncio.sleep(0)
    return client, srv, server


async def until(cond, timeout=5.0):
    async def wait():
        while not cond():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(wait(), timeout)


# -- scenarios: each returns what both transports must agree on ------------------------------

async def echo_with_half_close(kind):
    client, srv, server = await pair(kind)
    payload = bytes(range(256)) * 40
    client.transport.write(payload)
    client.transport.write_eof()
    await srv.eof
    srv.transport.write(bytes(srv.data[::-1]))       # the half-closed client still reads
    srv.transport.write_eof()
    await client.eof
    client.transport.close()
    srv.transport.close()
    await client.lost, await srv.lost
    server.close()
    assert bytes(client.data) == payload[::-1]
    return client.calls, srv.calls


async def eof_not_kept_open_closes(kind):
    client, srv, server = await pair(kind, server_keep_open=False)
    client.transport.write(b"x" * 100)
    client.transport.write_eof()
    await srv.lost                                  # eof_received False: closed
    await client.eof
    client.transport.close()
    await client.lost
    server.close()
    return client.calls, srv.calls, bytes(srv.data) == b"x" * 100


async def backpressure_and_buffered_eof(kind):
    client, srv, server = await pair(kind)
    big = bytes(range(251)) * 40_000                # ~10 MB: beyond the socket buffers
    client.transport.set_write_buffer_limits(high=64 << 10)
    srv.transport.pause_reading()
    client.transport.write(big)
    client.transport.write_eof()                    # after the buffered bytes
    assert client.transport.get_write_buffer_size() > 0
    paused_calls = list(client.calls)
    srv.transport.resume_reading()
    await srv.eof
    await client.resumed.wait()
    srv.transport.close()
    client.transport.close()
    await client.lost, await srv.lost
    server.close()
    assert bytes(srv.data) == big
    return paused_calls, client.calls, srv.calls


async def close_flushes_buffer(kind):
    client, srv, server = await pair(kind)
    big = b"z" * (8 << 20)
    srv.transport.pause_reading()
    client.transport.write(big)
    client.transport.close()                        # lost only after the buffer is out
    assert client.transport.is_closing()
    await asyncio.sleep(0.01)
    early = client.lost.done()
    srv.transport.resume_reading()
    await srv.eof
    await client.lost
    srv.transport.close()
    await srv.lost
    server.close()
    assert len(srv.data) == len(big)
    return early, client.calls, srv.calls


async def abort_resets_the_peer(kind):
    client, srv, server = await pair(kind)
    client.transport.write(b"before")
    await until(lambda: len(srv.data) == 6)
    sock = client.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.transport.abort()
    exc = await srv.lost
    await client.lost
    server.close()
    return client.calls, srv.calls, isinstance(exc, ConnectionResetError)


async def write_to_a_reset_peer(kind):
    client, srv, server = await pair(kind)
    sock = srv.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    srv.transport.abort()
    await srv.lost
    exc = await client.lost                         # the read sees the reset
    client.transport.write(b"after the end")        # ignored, no exception
    server.close()
    return client.calls, srv.calls, isinstance(exc, ConnectionResetError)


async def paused_reading_holds_data_and_eof(kind):
    client, srv, server = await pair(kind)
    srv.transport.pause_reading()
    client.transport.write(b"abc")
    client.transport.write_eof()
    await asyncio.sleep(0.02)
    held = (bytes(srv.data), srv.eof.done())
    srv.transport.pause_reading()                   # twice: no effect
    srv.transport.resume_reading()
    await srv.eof
    srv.transport.resume_reading()                  # not paused: no effect
    client.transport.close()
    srv.transport.close()
    await client.lost, await srv.lost
    server.close()
    return held, bytes(srv.data), client.calls, srv.calls


async def write_after_eof_raises(kind):
    client, srv, server = await pair(kind)
    client.transport.write_eof()
    client.transport.write_eof()                    # twice: no effect
    with pytest.raises(RuntimeError):
        client.transport.write(b"late")
    await srv.eof
    client.transport.close()
    client.transport.close()                        # twice: one connection_lost
    srv.transport.close()
    await client.lost, await srv.lost
    await asyncio.sleep(0.01)
    server.close()
    return client.calls, srv.calls, client.transport.can_write_eof()


SCENARIOS = [echo_with_half_close, eof_not_kept_open_closes, backpressure_and_buffered_eof,
             close_flushes_buffer, abort_resets_the_peer, write_to_a_reset_peer,
             paused_reading_holds_data_and_eof, write_after_eof_raises]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_the_lean_transport_makes_the_calls_asyncios_makes(scenario):
    seen = {kind: asyncio.run(asyncio.wait_for(scenario(kind), 30)) for kind in KINDS}
    assert seen["lean"] == seen["asyncio"]


def test_a_closed_transport_closes_its_socket_and_leaves_no_reader():
    async def main():
        loop = asyncio.get_running_loop()
        client, srv, server = await pair("lean")
        csock = client.transport.get_extra_info("socket")
        fd = csock.fileno()
        client.transport.close()
        srv.transport.close()
        await client.lost, await srv.lost
        server.close()
        assert csock.fileno() == -1
        assert fd not in loop._selector.get_map()   # nothing left registered
        assert server.sockets == []
        assert len(loop._selector.get_map()) == 1   # the loop's own self-pipe
    asyncio.run(main())


def test_the_peername_is_the_accepted_address():
    async def main():
        client, srv, server = await pair("lean")
        csock = client.transport.get_extra_info("socket")
        assert srv.transport.get_extra_info("peername") == csock.getsockname()
        assert client.transport.get_extra_info("peername") == server_addr(server)
        assert client.transport.get_extra_info("nothing", 7) == 7
        client.transport.close()
        srv.transport.close()
        await client.lost, await srv.lost
        server.close()

    def server_addr(server):
        return server.sockets[0].getsockname()
    asyncio.run(main())


def test_out_of_descriptors_the_server_waits_and_accepts_later(monkeypatch):
    """EMFILE on accept: the server tells its owner, stops watching the socket (Linux
    keeps reporting it readable: the loop would spin) and accepts the waiting
    connection once descriptors are back."""
    monkeypatch.setattr(sockets.LeanServer, "ACCEPT_RETRY_S", 0.05)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    async def main():
        loop = asyncio.get_running_loop()
        errors, made = [], []

        def factory():
            p = Recorder()
            made.append(p)
            return p
        server = LeanServer(loop, factory, "127.0.0.1", 0, on_error=errors.append)
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))   # queued, not accepted
        fillers = []
        try:
            while True:                                # use up the descriptors
                try:
                    fillers.append(socket.socket())
                except OSError as e:
                    assert e.errno == errno.EMFILE
                    break
            await until(lambda: errors)
            assert errors[0].errno == errno.EMFILE and not made
            await asyncio.sleep(0.12)                  # retried, failed again, quietly
            assert not made and len(errors) >= 2
        finally:
            for f in fillers:
                f.close()
        await until(lambda: made and made[0].transport is not None)
        client.sendall(b"hello")
        await until(lambda: bytes(made[0].data) == b"hello")
        client.close()
        await made[0].eof
        made[0].transport.close()
        await made[0].lost
        server.close()

    fds = len(__import__("os").listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, fds + 64), hard))
    try:
        asyncio.run(main())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_full_unix_accept_queue_is_waited_out():
    """The agent's connections to its app are UNIX sockets (native/shim_group.c). Their
    listener's queue full (a joiner connects a history's worth while its app accepts one
    at a time), a non-blocking connect fails with EAGAIN: connect_lean tries again until
    the app accepts, and the connection is then made, not an error."""
    async def main():
        loop = asyncio.get_running_loop()
        name = b"\0llft-test-queue-%d" % id(loop)
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lst.bind(name)
        lst.listen(0)                               # one connection waits at most
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        first.connect(name)
        made = []

        def factory():
            p = Recorder()
            made.append(p)
            return p
        task = asyncio.ensure_future(connect_lean(loop, name, factory))
        done, _ = await asyncio.wait([task], timeout=0.05)
        assert not done and not made               # still waiting for room
        conn, _ = lst.accept()                      # the app takes the first one
        transport = await asyncio.wait_for(task, 5.0)
        second, _ = lst.accept()
        second.setblocking(False)
        transport.write(b"after the wait")

        def arrived():
            try:
                return second.recv(100, socket.MSG_PEEK) == b"after the wait"
            except BlockingIOError:
                return False
        await until(arrived)
        transport.close()
        for s in (conn, second, first, lst):
            s.close()
    asyncio.run(main())
