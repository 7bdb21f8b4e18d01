"""Plain TCP and UDP peers, the baselines `llft bench` measures llft against in one run.

`python -m llft.bench.baselines KIND --port 0` runs one server and prints one JSON line
`{"event": "ready", "port": P}`; sinks print `{"event": "received", ...}` when done.
  tcp-echo   echo every byte back on each connection (asyncio streams)
  udp-echo   echo every datagram back to its sender
  tcp-sink   read --expect-bytes from one connection, report bytes and seconds from
             the first byte to the last
  udp-sink   count datagrams until --expect-bytes arrived or the sender's END marker
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

END_MARKER = b"\xffEND"


def emit(**f) -> None:
    print(json.dumps(f), flush=True)


async def tcp_echo(port: int) -> None:
    async def handle(reader, writer):
        writer.get_extra_info("socket").setsockopt(6, 1, 1)   # TCP_NODELAY
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    emit(event="ready", port=server.sockets[0].getsockname()[1])
    await server.serve_forever()


class _UdpEcho(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.t = transport

    def datagram_received(self, data, addr):
        self.t.sendto(data, addr)


async def udp_echo(port: int) -> None:
    loop = asyncio.get_running_loop()
    t, _ = await loop.create_datagram_endpoint(_UdpEcho, local_addr=("127.0.0.1", port))
    emit(event="ready", port=t.get_extra_info("sockname")[1])
    await asyncio.Event().wait()


async def tcp_sink(port: int, expect: int) -> None:
    done = asyncio.Event()

    async def handle(reader, writer):
        n, t0 = 0, None
        while n < expect and (data := await reader.read(1 << 20)):
            if t0 is None:
                t0 = time.perf_counter()
            n += len(data)
        emit(event="received", bytes=n, seconds=time.perf_counter() - (t0 or time.perf_counter()))
        writer.write(b"k")
        await writer.drain()
        done.set()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    emit(event="ready", port=server.sockets[0].getsockname()[1])
    await done.wait()


class _UdpSink(asyncio.DatagramProtocol):
    def __init__(self, expect, done):
        self.expect, self.done, self.n, self.t0, self.t1 = expect, done, 0, None, None

    def datagram_received(self, data, addr):
        if data == END_MARKER:
            self.done.set()
            return
        now = time.perf_counter()
        self.t0 = self.t0 or now
        self.t1 = now
        self.n += len(data)
        if self.n >= self.expect:
            self.done.set()


async def udp_sink(port: int, expect: int) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    t, proto = await loop.create_datagram_endpoint(lambda: _UdpSink(expect, done),
                                                   local_addr=("127.0.0.1", port))
    import socket
    t.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    emit(event="ready", port=t.get_extra_info("sockname")[1])
    await done.wait()
    emit(event="received", bytes=proto.n,
         seconds=(proto.t1 - proto.t0) if proto.t0 else 0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m llft.bench.baselines")
    p.add_argument("kind", choices=["tcp-echo", "udp-echo", "tcp-sink", "udp-sink"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--expect-bytes", type=int, default=0)
    a = p.parse_args(argv)
    coro = {"tcp-echo": lambda: tcp_echo(a.port), "udp-echo": lambda: udp_echo(a.port),
            "tcp-sink": lambda: tcp_sink(a.port, a.expect_bytes),
            "udp-sink": lambda: udp_sink(a.port, a.expect_bytes)}[a.kind]
    try:
        asyncio.run(coro())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
