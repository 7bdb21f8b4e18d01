"""`llft bench core`: what one request costs the messaging core and the wire codec, with
their memory in the CPU's caches and with it evicted, in one process.

Two endpoints, each a primary alone in its group (a gateway and a server primary), on
one established connection: per round trip a 1 KB request and a 1 KB reply, each sealed
into its datagram (`wire.Encoder`), judged back (`wire.Decoder`, the default codec) and
handled by the other core, its actions taken and its due timers run: the Python work of
a request's two hops minus the system calls, the event loop and the stream framing.

Each round is timed alone, after `--evict-mib` MiB of other memory was written (one
store per 64-byte line, untimed), the way a process that was asleep while others ran
finds its memory: a row per size, the sizes interleaved in blocks (median of blocks), so
the machine's noise falls on every row alike. On a machine whose cores are shared by a
replicated group (agents, apps, gateway, clients), a wake-up of Python is the evicted
row, not the hot one: compare with the CPU µs per request `llft bench echo` reports.

Writes `<results>/core.csv`, `core.md` and `core.png`.
"""
from __future__ import annotations

import argparse
import statistics
import time

from llft.bench import report
from llft.bench.report import Table, write_markdown
from llft.protocol import wire
from llft.protocol.messaging import MessagingEndpoint
from llft.protocol.messaging.actions import Deliver, Send

KEY = bytes(range(32))
SIZE = 1024
LINE = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=400, help="timed round trips per block")
    p.add_argument("--blocks", type=int, default=5, help="interleaved blocks per size")
    p.add_argument("--evict-mib", default="0,2,16,64",
                   help="MiB of other memory written before each round (0: hot)")
    p.add_argument("--quick", action="store_true", help="--rounds 100 --blocks 3")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR, help="output folder")


class Pair:
    """A gateway's core and a server primary's core on one connection, with the codec
    between them."""

    def __init__(self) -> None:
        self.now = 1000
        self.gw = MessagingEndpoint("bench.gateway", 7)
        self.srv = MessagingEndpoint("bench", 9)
        self.gw.set_view(1, 7, [(7, 1)], 7, self.now)
        self.srv.set_view(1, 9, [(9, 1)], 9, self.now)
        self.enc = wire.Encoder(KEY, mtu_bytes=wire.MAX_DATAGRAM_BYTES, check=False)
        self.dec = wire.Decoder(KEY, None)
        self.conn = self.gw.open("bench", 1)
        self.srv_conn = None
        self.request, self.reply = b"q" * SIZE, b"r" * SIZE
        self.delivered = 0

    def _carry(self, src: MessagingEndpoint, dst: MessagingEndpoint) -> None:
        for a in src.take_actions():
            if isinstance(a, Send) and a.dst_group == dst.group:
                for dg in self.enc.encode(a.msg):
                    msg = self.dec.decode(dg, self.now)
                    if msg is not None:
                        dst.handle_message(msg, self.now)

    def _timers(self, ep: MessagingEndpoint) -> None:
        t = ep.next_timer_us()
        if t is not None and t <= self.now:
            ep.handle_timer(self.now)

    def round_trip(self) -> None:
        self.now += 150
        self.gw.send(self.conn, self.request, self.now)
        self._carry(self.gw, self.srv)
        for a in self.srv.take_actions():
            if isinstance(a, Deliver):
                self.srv_conn = a.conn
                self.delivered += len(a.data)
        self._timers(self.srv)
        self.now += 150
        self.srv.send(self.srv_conn, self.reply, self.now)
        self._carry(self.srv, self.gw)
        for a in self.gw.take_actions():
            if isinstance(a, Deliver):
                self.delivered += len(a.data)
        self._timers(self.gw)


def _block(pair: Pair, junk: bytearray, mib: int, rounds: int) -> float:
    """Median µs of `rounds` round trips, each after `mib` MiB of `junk` was written."""
    n = mib << 20
    stores = bytes(len(range(0, n, LINE)))
    times = []
    for _ in range(rounds):
        if n:
            junk[0:n:LINE] = stores
        t0 = time.perf_counter_ns()
        pair.round_trip()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000


def run(args) -> int:
    command = report.command_of(args, add_arguments, "core")
    if args.quick:
        args.rounds, args.blocks = 100, 3
    try:
        sizes = [int(x) for x in args.evict_mib.split(",") if x.strip()]
    except ValueError:
        print(f"llft bench core: --evict-mib {args.evict_mib!r}: expected MiB such as 0,16")
        return 2
    if not sizes or min(sizes) < 0:
        print("llft bench core: --evict-mib needs sizes >= 0")
        return 2
    pair = Pair()
    junk = bytearray(max(sizes) << 20 or 1)
    for _ in range(200):                        # warm-up: the connection established
        pair.round_trip()
    if pair.delivered != 200 * 2 * SIZE:
        print(f"llft bench core: the cores delivered {pair.delivered} bytes of "
              f"{200 * 2 * SIZE}: the pair is broken")
        return 1
    med: dict[int, list[float]] = {s: [] for s in sizes}
    for _ in range(args.blocks):
        for s in sizes:
            med[s].append(_block(pair, junk, s, args.rounds))
    hot = statistics.median(med[sizes[0]])
    table = Table("core", f"Messaging core + wire codec, one 1 KB request and its 1 KB "
                  f"reply through two cores: median µs of {args.blocks} interleaved blocks "
                  f"of {args.rounds} round trips", ["evicted_mib", "round_trip_us",
                                                    f"x_{sizes[0]}_mib"])
    for s in sizes:
        m = statistics.median(med[s])
        table.add(evicted_mib=s, round_trip_us=m, **{f"x_{sizes[0]}_mib": m / hot})
    table.print()
    path = table.write_csv(args.results)
    png = report.bars(args.results, "core", "Messaging core + codec: µs per round trip",
                      "µs per round trip", [f"{s} MiB evicted" for s in sizes],
                      {"round trip": [r["round_trip_us"] for r in table.rows]})
    write_markdown(args.results, "core", [table.markdown()], plots=[png], command=command,
                   notes="Two lone primaries' MessagingEndpoints (llft/protocol/messaging) "
                         "and the default wire codec in one process, no system calls. "
                         "Evicted: that much other memory written before each round, as "
                         "other processes do to a sleeping one on a shared machine.")
    print(f"wrote {path}")
    return 0
