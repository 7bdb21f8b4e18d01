"""`llft bench messaging`: llft connections against plain UDP and plain TCP, in one run.

Round-trip latency (64 B, 1 KB, 16 KB by default): this process is the client; the server
is an echo peer in other OS processes: plain TCP (asyncio streams), plain UDP (datagram
echo), and llft (a server group of `--replicas` members running llft.tools.streamdemo --echo;
the client is a one-member client group). All clients use asyncio, so the comparison is
of the transports, not of the event loop.

Streaming throughput: `--stream-mb` one way; TCP into a sink, UDP blasted into a sink
(no reliability: delivered bytes and loss are reported), llft from a sending group to a
receiving group of `--replicas` members each, timed at the receivers from first to last
delivery.

Prints tables; writes `<results>/messaging.csv` (latency: one row per size and
transport, numbers only), `messaging_throughput.csv`, `messaging.md`,
`messaging_latency.png` (median RTT against size) and `messaging_throughput.png`. The
ratio columns (llft / TCP) are what to compare across machines.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
import time

from llft.runtime import keys
from llft.bench import report
from llft.bench.baselines import END_MARKER
from llft.runtime.driver import Driver
from llft.protocol.messages import Role
from llft.protocol.messaging import Deliver, MessagingConfig, MessagingEndpoint
from llft.tools.procs import ProcGroup, random_group_addresses
from llft.runtime.transport import Endpoint, GroupMap

CLIENT_BIRTH_ID = 900


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="64,1024,16384", help="message sizes in bytes")
    p.add_argument("--rounds", type=int, default=1000, help="round trips per size and transport")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--replicas", default="1,3", help="llft server group sizes to measure")
    p.add_argument("--stream-mb", type=float, default=10.0)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: sizes 64,1024, 100 round trips, 1 MB stream")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


# ----------------------------------------------------------------------- latency ---
async def rtt_tcp(port: int, size: int, rounds: int, warmup: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * size
    out = []
    for i in range(warmup + rounds):
        t0 = time.perf_counter_ns()
        writer.write(payload)
        await reader.readexactly(size)
        if i >= warmup:
            out.append((time.perf_counter_ns() - t0) / 1000)
    writer.close()
    return out


class _UdpClient(asyncio.DatagramProtocol):
    def __init__(self):
        self.waiter: asyncio.Future | None = None

    def datagram_received(self, data, addr):
        if self.waiter and not self.waiter.done():
            self.waiter.set_result(data)


async def rtt_udp(port: int, size: int, rounds: int, warmup: int) -> list[float]:
    loop = asyncio.get_running_loop()
    t, proto = await loop.create_datagram_endpoint(_UdpClient, remote_addr=("127.0.0.1", port))
    payload = b"x" * size
    out = []
    for i in range(warmup + rounds):
        proto.waiter = loop.create_future()
        t0 = time.perf_counter_ns()
        t.sendto(payload)
        try:
            await asyncio.wait_for(proto.waiter, 1.0)
        except asyncio.TimeoutError:
            continue                     # a lost datagram: plain UDP has no recovery
        if i >= warmup:
            out.append((time.perf_counter_ns() - t0) / 1000)
    t.close()
    return out


async def rtt_llft(key: bytes, addresses: str, sizes: list[int], rounds: int,
                   warmup: int) -> dict[int, list[float]]:
    """One client group member, one connection per size (msns never restart within a
    view, so a fresh measurement is a fresh connection, as a fresh TCP socket is)."""
    core = MessagingEndpoint("C", CLIENT_BIRTH_ID, MessagingConfig(max_payload_bytes=1300))
    got = {"n": 0}

    def on_action(a):
        if isinstance(a, Deliver):
            got["n"] += len(a.data)
    endpoint = Endpoint(key, "C", lambda m: None, groups=GroupMap.parse(addresses),
                        birth_id=CLIENT_BIRTH_ID)
    driver = Driver(endpoint, core, on_action=on_action)
    await endpoint.start()
    core.set_view(1, CLIENT_BIRTH_ID, [(CLIENT_BIRTH_ID, 1)], CLIENT_BIRTH_ID, driver.clock_us())
    driver.start()
    results = {}
    try:
        for conn_seq, size in enumerate(sizes, start=1):
            conn = driver.call(core.open, "S", conn_seq, Role.CLIENT)
            payload = b"x" * size
            out = results[size] = []
            for i in range(warmup + rounds):
                want = got["n"] + size
                t0 = time.perf_counter_ns()
                view = memoryview(payload)
                while view:
                    n = driver.call(core.send, conn, view, driver.clock_us())
                    view = view[n:]
                    if view:
                        await driver.wait_for(lambda: core.send_space(conn) > 0, 5.0)
                if not await driver.wait_for(lambda: got["n"] >= want, 10.0):
                    raise RuntimeError(f"llft echo of {size} B timed out")
                if i >= warmup:
                    out.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        driver.stop()
        endpoint.close()
    return results


def start_llft_group(pg: ProcGroup, key_path: str, addresses: str, group: str, members: list[int],
                     *extra: str) -> None:
    ids = ",".join(map(str, members))
    for m in members:
        pg.python(f"{group}{m}", "llft.tools.streamdemo", "--key", key_path, "--group", group,
                  "--me", str(m), "--members", ids, "--addresses", addresses, *extra)
    if not pg.wait(lambda: all(pg.procs[f"{group}{m}"].find("ready") for m in members), 30):
        raise RuntimeError(f"llft group {group} did not start")


def start_baseline(pg: ProcGroup, name: str, kind: str, *extra: str) -> int:
    proc = pg.python(name, "llft.bench.baselines", kind, *extra)
    if not pg.wait(lambda: proc.find("ready"), 20):
        raise RuntimeError(f"{kind} did not start: {pg.stderr(name)}")
    return proc.find("ready")["port"]


def measure_latency(args, tmp: str, key_path: str, key: bytes):
    sizes = [int(s) for s in args.sizes.split(",")]
    replicas = [int(r) for r in args.replicas.split(",")]
    table = report.Table("messaging_latency", "Round-trip latency (us): median [p99]",
                         ["size_B", "tcp", "udp"] + [f"llft_{r}r" for r in replicas]
                         + [f"llft_{r}r/tcp" for r in replicas])
    pg = ProcGroup(tmp)
    try:
        tcp_port = start_baseline(pg, "tcp-echo", "tcp-echo")
        udp_port = start_baseline(pg, "udp-echo", "udp-echo")
        rows = {s: {"size_B": s} for s in sizes}
        raw = {}
        for s in sizes:
            t = report.summarize_us(asyncio.run(rtt_tcp(tcp_port, s, args.rounds, args.warmup)))
            u = report.summarize_us(asyncio.run(rtt_udp(udp_port, s, args.rounds, args.warmup)))
            rows[s]["tcp"] = f"{t['median_us']:.0f} [{t['p99_us']:.0f}]"
            rows[s]["udp"] = f"{u['median_us']:.0f} [{u['p99_us']:.0f}]"
            raw[("tcp", s)], raw[("udp", s)] = t, u
        for r in replicas:
            addresses = random_group_addresses(["C", "S"])
            members = [100 * r + i for i in range(1, r + 1)]
            sub = ProcGroup(tmp)
            try:
                start_llft_group(sub, key_path, addresses, "S", members, "--echo")
                samples = asyncio.run(rtt_llft(key, addresses, sizes, args.rounds, args.warmup))
                for s in sizes:
                    ll = report.summarize_us(samples[s])
                    raw[(f"llft_{r}r", s)] = ll
                    rows[s][f"llft_{r}r"] = f"{ll['median_us']:.0f} [{ll['p99_us']:.0f}]"
                    rows[s][f"llft_{r}r/tcp"] = ll["median_us"] / raw[("tcp", s)]["median_us"]
            finally:
                sub.stop_all()
        for s in sizes:
            table.add(**rows[s])
    finally:
        pg.stop_all()
    return table, raw, sizes, replicas


# -------------------------------------------------------------------- throughput ---
def measure_throughput(args, tmp: str, key_path: str, replicas: list[int]):
    total = int(args.stream_mb * 1e6)
    table = report.Table("messaging_throughput", f"Streaming throughput, {args.stream_mb:g} MB one way",
                         ["transport", "MB_per_s", "delivered_pct", "vs_tcp"])
    pg = ProcGroup(tmp)
    results = {}
    try:
        port = start_baseline(pg, "tcp-sink", "tcp-sink", "--expect-bytes", str(total))
        with socket.create_connection(("127.0.0.1", port)) as s:
            chunk = b"y" * (1 << 16)
            left = total
            while left:
                left -= s.send(chunk[:min(left, len(chunk))])
            s.recv(1)
        r = pg.procs["tcp-sink"]
        pg.wait(lambda: r.find("received"), 60)
        ev = r.find("received")
        results["tcp"] = (ev["bytes"] / max(ev["seconds"], 1e-9) / 1e6, 100.0)

        port = start_baseline(pg, "udp-sink", "udp-sink", "--expect-bytes", str(total))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            dg = b"z" * 1300
            for _ in range(total // len(dg)):
                s.sendto(dg, ("127.0.0.1", port))
            s.sendto(END_MARKER, ("127.0.0.1", port))
        r = pg.procs["udp-sink"]
        pg.wait(lambda: r.find("received"), 60)
        ev = r.find("received")
        results["udp (no recovery)"] = (ev["bytes"] / max(ev["seconds"], 1e-9) / 1e6,
                                        100.0 * ev["bytes"] / total)
    finally:
        pg.stop_all()
    for rep in replicas:
        addresses = random_group_addresses(["A", "B"])
        sub = ProcGroup(tmp)
        try:
            bs = [200 + i for i in range(1, rep + 1)]
            start_llft_group(sub, key_path, addresses, "B", bs, "--expect-bytes", str(total))
            start_llft_group(sub, key_path, addresses, "A", [300 + i for i in range(1, rep + 1)],
                             "--send-to", "B", "--send-bytes", str(total))
            recv = [sub.procs[f"B{b}"] for b in bs]
            if not sub.wait(lambda: all(p.find("received") for p in recv), 120 + total / 100_000):
                raise RuntimeError("llft stream did not complete")
            evs = [p.find("received") for p in recv]
            slowest = max(e["active_seconds"] for e in evs)
            results[f"llft {rep} replicas"] = (total / max(slowest, 1e-9) / 1e6,
                                               100.0 * min(e["bytes"] for e in evs) / total)
        finally:
            sub.stop_all()
    tcp = results["tcp"][0]
    for name, (mbps, pct) in results.items():
        table.add(transport=name, MB_per_s=mbps, delivered_pct=pct, vs_tcp=mbps / tcp)
    return table


def long_table(raw: dict, sizes: list[int], replicas: list[int], rounds: int) -> report.Table:
    """The latency table with numbers only, one row per size and transport (CSV)."""
    t = report.Table("messaging", f"Round-trip latency ({rounds} round trips)",
                     ["size_B", "transport", "replicas", "n", "median_us", "p90_us", "p99_us",
                      "median_vs_tcp", "p99_vs_tcp"])
    for s in sizes:
        tcp = raw[("tcp", s)]
        for name, reps in [("tcp", 0), ("udp", 0)] + [(f"llft_{r}r", r) for r in replicas]:
            v = raw[(name, s)]
            t.add(size_B=s, transport=name, replicas=reps, n=v["n"], median_us=v["median_us"],
                  p90_us=v["p90_us"], p99_us=v["p99_us"],
                  median_vs_tcp=v["median_us"] / tcp["median_us"],
                  p99_vs_tcp=v["p99_us"] / tcp["p99_us"])
    return t


def run(args) -> int:
    command = report.command_of(args, add_arguments, "messaging")
    if getattr(args, "quick", False):
        args.sizes, args.rounds, args.warmup, args.stream_mb = "64,1024", 100, 10, 1.0
    with tempfile.TemporaryDirectory(prefix="llft-bench-") as tmp:
        key_path = os.path.join(tmp, "cluster.key")
        key = keys.write_key(key_path)
        lat, raw, sizes, replicas = measure_latency(args, tmp, key_path, key)
        lat.print()
        thr = measure_throughput(args, tmp, key_path, replicas)
        thr.print()
    long_table(raw, sizes, replicas, args.rounds).write_csv(args.results)
    thr.write_csv(args.results)
    series = {name: (sizes, [raw[(name, s)]["median_us"] for s in sizes])
              for name in ["tcp", "udp"] + [f"llft_{r}r" for r in replicas]}
    png = report.plot(args.results, "messaging_latency", "Round-trip latency vs message size",
                      "message size (bytes)", "median RTT (us)", series, logx=True, logy=True,
                      xticks=sizes)
    png_thr = report.bars(args.results, "messaging_throughput", f"Streaming throughput "
                          f"({args.stream_mb:g} MB one way)", "MB/s",
                          [r["transport"] for r in thr.rows],
                          {"MB/s": [r["MB_per_s"] for r in thr.rows]}, logy=True)
    md = report.write_markdown(args.results, "messaging", [lat.markdown(), thr.markdown()],
                               plots=[png, png_thr], command=command,
                               notes="llft columns: a one-member client group against a server "
                               "group of N replicas (semi-active: backups log their replies).")
    print(f"wrote {md}")
    return 0
