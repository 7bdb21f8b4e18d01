"""`llft bench transport`: what a short TCP connection costs the process that makes or
accepts it, on asyncio's socket transport and on llft's `LeanTransport` (the one the
agents and the gateway use: llft/runtime/sockets.py), side by side.

A connection is what a stream costs with a connection per request: connect (or accept),
1 KB one way, a half-close, 1 KB back, the end read, close. The other side is a plain
blocking process (a forked child): an echo server for `connect` (the agent's side: it
connects to its app), a client that connects again and again for `accept` (the
gateway's side). Only the process under test is measured (its CPU time, user + system,
per connection), in interleaved blocks, asyncio's and the lean transport's in turn, so
the machine's noise falls on both; the ratio is the figure.

Writes `<results>/transport.csv`, `transport.md` and `transport.png`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import time

from llft.bench import report
from llft.bench.report import Table, write_markdown
from llft.lifetime import die_with
from llft.runtime.sockets import LeanServer, connect_lean

SIZE = 1024
IMPLS = ("asyncio", "lean")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connections", type=int, default=1000, help="connections per block")
    p.add_argument("--blocks", type=int, default=5, help="interleaved blocks per side")
    p.add_argument("--quick", action="store_true", help="--connections 200 --blocks 3")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR, help="output folder")


class Peer(asyncio.BufferedProtocol):
    """Both roles' protocol: keeps what arrives; the accepting side echoes it at the
    client's EOF and closes, the connecting side closes at the server's EOF."""

    def __init__(self, echo: bool, done: asyncio.Future | None = None):
        self.echo, self.done = echo, done
        self.buf, self.got = bytearray(65536), bytearray()

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        return self.buf

    def buffer_updated(self, nbytes):
        self.got += self.buf[:nbytes]

    def eof_received(self):
        if self.echo:
            self.transport.write(bytes(self.got))
        self.transport.close()
        return True

    def connection_lost(self, exc):
        if self.done is not None and not self.done.done():
            self.done.set_result(len(self.got))


def _echo_server_child(ls: socket.socket) -> None:
    while True:
        c, _ = ls.accept()
        data = b""
        while len(data) < SIZE:
            x = c.recv(65536)
            if not x:
                break
            data += x
        c.sendall(data)
        c.close()


def _client_child(port: int) -> None:
    payload = b"c" * SIZE
    while True:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
        s.close()


def _fork(fn, *args) -> int:
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            die_with(parent)            # a killed bench leaves no echo process behind
            fn(*args)
        finally:
            os._exit(0)
    return pid


async def _connect_block(impl: str, port: int, n: int) -> float:
    loop = asyncio.get_running_loop()
    payload = b"x" * SIZE
    t0 = time.process_time()
    for _ in range(n):
        done = loop.create_future()
        if impl == "lean":
            t = await connect_lean(loop, ("127.0.0.1", port), lambda: Peer(False, done))
        else:
            t, _ = await loop.create_connection(lambda: Peer(False, done), "127.0.0.1", port)
        t.write(payload)
        t.write_eof()
        if await done != SIZE:
            raise RuntimeError("the echo came back short")
    return (time.process_time() - t0) / n * 1e6


async def _accept_block(impl: str, n: int) -> float:
    loop = asyncio.get_running_loop()
    ended = [0]                             # connections accepted and ended so far
    target = [20]                           # first: the client is running
    wanted = asyncio.Event()                # set when ended reaches the target

    def counted(_f) -> None:
        ended[0] += 1
        if ended[0] >= target[0]:
            wanted.set()

    def factory():
        f = loop.create_future()
        f.add_done_callback(counted)
        return Peer(True, f)
    if impl == "lean":
        server = LeanServer(loop, factory, "127.0.0.1", 0)
    else:
        server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    child = _fork(_client_child, port)
    try:
        await wanted.wait()
        wanted.clear()
        target[0] = ended[0] + n
        t0 = time.process_time()
        await wanted.wait()                 # n more connections accepted and ended
        cpu = time.process_time() - t0
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        server.close()
    return cpu / n * 1e6


def run(args) -> int:
    command = report.command_of(args, add_arguments, "transport")
    if args.quick:
        args.connections, args.blocks = 200, 3
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(128)
    server = _fork(_echo_server_child, ls)
    ls_port = ls.getsockname()[1]
    ls.close()
    cpu: dict[tuple[str, str], list[float]] = {(side, i): [] for side in ("connect", "accept")
                                               for i in IMPLS}
    try:
        for b in range(args.blocks):
            order = IMPLS if b % 2 == 0 else IMPLS[::-1]
            for impl in order:
                cpu["connect", impl].append(asyncio.run(
                    _connect_block(impl, ls_port, args.connections)))
            for impl in order:
                cpu["accept", impl].append(asyncio.run(_accept_block(impl, args.connections)))
    finally:
        os.kill(server, signal.SIGKILL)
        os.waitpid(server, 0)
    table = Table("transport", f"CPU µs of the measured process per short connection (1 KB "
                  f"each way, half-close, close): median of {args.blocks} interleaved "
                  f"blocks of {args.connections}",
                  ["side", "asyncio_us", "lean_us", "lean_vs_asyncio", "lean_spread"])
    for side in ("connect", "accept"):
        a = statistics.median(cpu[side, "asyncio"])
        lean = statistics.median(cpu[side, "lean"])
        ratios = [x / y for x, y in zip(cpu[side, "lean"], cpu[side, "asyncio"])]
        table.add(side=side, asyncio_us=a, lean_us=lean, lean_vs_asyncio=lean / a,
                  lean_spread=f"{min(ratios):.2f}-{max(ratios):.2f}")
    table.print()
    path = table.write_csv(args.results)
    png = report.bars(args.results, "transport", "CPU per short connection",
                      "CPU µs per connection", ["connect (agent)", "accept (gateway)"],
                      {impl: [r[f"{impl}_us"] for r in table.rows] for impl in IMPLS})
    write_markdown(args.results, "transport", [table.markdown()], plots=[png],
                   command=command,
                   notes="lean_spread: the lean/asyncio ratio of each block pair. "
                         "connect: the agent's side (it connects to its app per stream); "
                         "accept: the gateway's side (a client per request). The other "
                         "side is a plain blocking process and is not measured.")
    print(f"wrote {path}")
    return 0
