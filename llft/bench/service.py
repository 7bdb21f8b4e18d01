"""`llft bench latency` and `llft bench throughput`: a replicated service against itself, plain.

The service is examples/echo.py, unmodified, reached in these configurations, all set up
at once and measured in ONE run, interleaved in blocks (same machine, same moment):

  tcp        the plain echo.py process, reached directly over TCP (the baseline)
  proxy      the same echo.py process through a plain TCP proxy (asyncio, another
             process): the cost of one extra hop, without llft (`--no-proxy` drops it)
  llft_Nr    a LocalCluster of N replicas (`llft run -- python examples/echo.py PORT`),
             reached through `llft gateway` (N from `--replicas`, default 1,2,3)

latency: this process is the client; one persistent TCP connection per configuration;
for each size (`--sizes`), `--rounds` request/reply round trips per configuration, taken
in `--blocks` interleaved blocks after `--warmup` untimed ones. Median, p90, p99, and the
ratios to tcp (median and p99).

throughput: requests per second of 1, 4, 16 concurrent request/reply clients
(`--clients`; llft.loadclient echo mode, one thread and connection each, every reply
checked) sending `--size` bytes (default 1 KB), for `--duration` seconds per
configuration and client count, also in interleaved blocks. Ratio to tcp.

One cluster per replica count serves every size and client count. A configuration that
cannot be set up or fails mid-run (timeout, wrong bytes) is reported as failed, with the
reason, in the table; the others are still measured; the exit status is then 1.

Writes `<results>/<kind>.csv`, `<kind>.md` (and summary.md) and `<kind>*.png`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from llft.bench import report

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")
ECHO = os.path.join(EXAMPLES, "echo.py")
SERVICE_PORT = 9000            # what the app binds under llft run (the shim redirects it)
SETUP_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 10.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="64,1024,16384", help="latency: message sizes in bytes")
    p.add_argument("--rounds", type=int, default=1000,
                   help="latency: timed round trips per size and configuration")
    p.add_argument("--warmup", type=int, default=50, help="latency: untimed round trips first")
    p.add_argument("--clients", default="1,4,16", help="throughput: concurrent client counts")
    p.add_argument("--size", type=int, default=1024, help="throughput: bytes per request")
    p.add_argument("--duration", type=float, default=3.0,
                   help="throughput: seconds per configuration and client count")
    p.add_argument("--blocks", type=int, default=5,
                   help="interleave the configurations in this many blocks")
    p.add_argument("--replicas", default="1,2,3", help="llft group sizes to measure")
    p.add_argument("--no-proxy", action="store_true", help="leave out the plain TCP proxy")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: sizes 64,1024, 50 rounds, clients 1,4, 0.5 s, 2 blocks")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


# ---------------------------------------------------------------- targets -----------
class Target:
    """One configuration: where to connect, and why it failed if it did."""

    def __init__(self, name: str, replicas: int = 0):
        self.name, self.replicas = name, replicas
        self.host, self.port = "127.0.0.1", 0
        self.error: str | None = None
        self.sock: socket.socket | None = None      # latency: the persistent connection

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = why.strip().replace("\n", " ")[:300]
            print(f"llft bench: {self.name} failed: {self.error}", file=sys.stderr)
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_ready(p: subprocess.Popen, timeout_s: float) -> dict | None:
    """The child's first JSON line on stdout, with a deadline."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    buf, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline and p.poll() is None:
        if sel.select(0.2):
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                try:
                    return json.loads(buf.split(b"\n", 1)[0])
                except ValueError:
                    return None
    return None


class Setup:
    """Every configuration's processes: echo.py, the proxy, one LocalCluster per size."""

    def __init__(self, tmp: str, replicas: list[int], proxy: bool):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.clusters = []
        self.targets: list[Target] = []
        tcp = Target("tcp")
        self.targets.append(tcp)
        tcp.port = _free_port()
        self._spawn([sys.executable, ECHO, str(tcp.port)], "echo")
        from llft.loadclient import wait_listening
        if not wait_listening(tcp.host, tcp.port, 20):
            tcp.fail(f"examples/echo.py did not listen on {tcp.port}")
        if proxy:
            px = Target("proxy")
            self.targets.append(px)
            p = self._spawn([sys.executable, "-m", "llft.bench.service", "--proxy-to",
                             f"{tcp.host}:{tcp.port}"], "proxy", stdout=subprocess.PIPE)
            ev = _read_ready(p, 20)
            if not ev or ev.get("event") != "ready":
                px.fail("the TCP proxy did not start")
            else:
                px.port = int(ev["port"])
        for r in replicas:
            t = Target(f"llft_{r}r", r)
            self.targets.append(t)
            try:
                t.host, t.port = self._cluster(r)
            except Exception as e:          # noqa: BLE001 -- reported per configuration
                t.fail(f"setup: {type(e).__name__}: {e}")

    def _spawn(self, argv: list[str], name: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
        with open(os.path.join(self.tmp, f"{name}.log"), "ab") as err:
            p = subprocess.Popen(argv, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def _cluster(self, n: int) -> tuple[str, int]:
        from llft.cluster import LocalCluster
        lc = LocalCluster(os.path.join(self.tmp, f"llft{n}"), group=f"echo{n}",
                          service_port=SERVICE_PORT)
        self.clusters.append(lc)
        for i in range(1, n + 1):
            lc.start_replica(f"r{i}", [sys.executable, ECHO, str(SERVICE_PORT)])
            try:
                lc.wait_members(i, timeout_s=SETUP_TIMEOUT_S)
            except Exception as e:
                raise RuntimeError(f"{e}; r{i} log: {_last_lines(lc.log_tail(f'r{i}'))}") \
                    from None
        host, port = lc.start_gateway(timeout_s=SETUP_TIMEOUT_S)
        # one echo through the whole path, so a broken path fails here, plainly
        try:
            with socket.create_connection((host, port), timeout=REPLY_TIMEOUT_S) as s:
                s.sendall(b"ping\n")
                got = _recv_exactly(s, 5)
            if got != b"ping\n":
                raise RuntimeError(f"first echo returned {got!r}")
        except OSError as e:
            raise RuntimeError(f"first echo through the gateway: {e}; r1 log: "
                               f"{_last_lines(lc.log_tail('r1'))}; gateway log: "
                               f"{_last_lines(lc.log_tail('gateway'))}") from None
        return host, port

    def stop(self) -> None:
        for t in self.targets:
            t.close()
        for lc in self.clusters:
            lc.stop()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(empty)"


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


# ---------------------------------------------------------------- latency -----------
def _round_trips(t: Target, payload: bytes, count: int, out: list[float] | None) -> None:
    if t.sock is None:
        t.sock = socket.create_connection((t.host, t.port), timeout=REPLY_TIMEOUT_S)
        t.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s, n = t.sock, len(payload)
    buf = bytearray(n)
    view = memoryview(buf)
    for _ in range(count):
        t0 = time.perf_counter_ns()
        s.sendall(payload)
        got = 0
        while got < n:
            k = s.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionError(f"connection closed after {got} of {n} bytes")
            got += k
        t1 = time.perf_counter_ns()
        if buf != payload:
            raise RuntimeError(f"echo of {n} B came back different")
        if out is not None:
            out.append((t1 - t0) / 1000)


def measure_latency(targets: list[Target], sizes: list[int], rounds: int, warmup: int,
                    blocks: int) -> dict[tuple[str, int], list[float]]:
    samples: dict[tuple[str, int], list[float]] = {}
    blocks = max(1, min(blocks, rounds))
    for size in sizes:
        payload = os.urandom(size)
        live = [t for t in targets if t.error is None]
        for t in live:
            samples[(t.name, size)] = []
            try:
                _round_trips(t, payload, warmup, None)
            except Exception as e:          # noqa: BLE001
                t.fail(f"{size} B warm-up: {type(e).__name__}: {e}")
        for b in range(blocks):
            per = rounds // blocks + (1 if b < rounds % blocks else 0)
            for t in targets:
                if t.error is not None:
                    continue
                try:
                    _round_trips(t, payload, per, samples[(t.name, size)])
                except Exception as e:      # noqa: BLE001
                    t.fail(f"{size} B round trips: {type(e).__name__}: {e}")
    return samples


def latency_table(targets, sizes, samples, rounds) -> report.Table:
    table = report.Table("latency", f"Request/reply latency, echo service (us; {rounds} "
                         "round trips per size and configuration)",
                         ["size_B", "config", "replicas", "n", "median_us", "p90_us", "p99_us",
                          "median_vs_tcp", "p99_vs_tcp", "error"])
    for size in sizes:
        base = report.summarize_us(samples.get(("tcp", size), []))
        for t in targets:
            s = report.summarize_us(samples.get((t.name, size), []))
            ok = t.error is None and s["n"] > 0
            row = dict(size_B=size, config=t.name, replicas=t.replicas, n=s["n"],
                       error=t.error or "")
            if ok:
                row.update(median_us=s["median_us"], p90_us=s["p90_us"], p99_us=s["p99_us"])
                if base["n"]:
                    row.update(median_vs_tcp=s["median_us"] / base["median_us"],
                               p99_vs_tcp=s["p99_us"] / base["p99_us"])
            table.add(**row)
    return table


# ------------------------------------------------------------- throughput -----------
def measure_throughput(targets: list[Target], clients: list[int], size: int,
                       duration_s: float, blocks: int) -> dict[tuple[str, int], dict]:
    from llft.loadclient import run_load
    acc: dict[tuple[str, int], dict] = {}
    for c in clients:
        for t in targets:
            acc[(t.name, c)] = {"replies": 0, "elapsed_s": 0.0, "latencies": []}
        for _ in range(max(1, blocks)):
            for t in targets:
                if t.error is not None:
                    continue
                r = run_load(t.host, t.port, clients=c, requests=10 ** 9, mode="echo",
                             size=size, timeout_s=REPLY_TIMEOUT_S,
                             duration_s=duration_s / max(1, blocks))
                if r.error_count:
                    t.fail(f"{c} clients: {r.errors[0] if r.errors else 'errors'}")
                    continue
                a = acc[(t.name, c)]
                a["replies"] += r.replies
                a["elapsed_s"] += r.elapsed_s
                a["latencies"] += r.latencies
    return acc


def throughput_table(targets, clients, acc, size, duration_s) -> report.Table:
    table = report.Table("throughput", f"Throughput, {size} B echo requests (request/reply "
                         f"clients, {duration_s:g} s per configuration and client count)",
                         ["clients", "config", "replicas", "replies", "req_per_s",
                          "median_us", "p99_us", "vs_tcp", "error"])
    for c in clients:
        base = acc.get(("tcp", c))
        base_rps = base["replies"] / base["elapsed_s"] if base and base["elapsed_s"] else 0.0
        for t in targets:
            a = acc.get((t.name, c), {"replies": 0, "elapsed_s": 0.0, "latencies": []})
            row = dict(clients=c, config=t.name, replicas=t.replicas, replies=a["replies"],
                       error=t.error or "")
            if t.error is None and a["elapsed_s"] > 0:
                rps = a["replies"] / a["elapsed_s"]
                lat = report.summarize_us([x * 1e6 for x in a["latencies"]])
                row.update(req_per_s=rps, median_us=lat["median_us"], p99_us=lat["p99_us"])
                if base_rps:
                    row["vs_tcp"] = rps / base_rps
            table.add(**row)
    return table


# ---------------------------------------------------------------- command -----------
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run(args) -> int:
    kind = getattr(args, "_kind", "latency")
    if args.quick:
        args.sizes, args.rounds, args.warmup = "64,1024", 50, 10
        args.clients, args.duration, args.blocks = "1,4", 0.5, 2
    sizes, clients, replicas = _ints(args.sizes), _ints(args.clients), _ints(args.replicas)
    with tempfile.TemporaryDirectory(prefix=f"llft-bench-{kind}-") as tmp:
        setup = Setup(tmp, replicas, proxy=not args.no_proxy)
        try:
            targets = setup.targets
            if kind == "latency":
                samples = measure_latency(targets, sizes, args.rounds, args.warmup, args.blocks)
                table = latency_table(targets, sizes, samples, args.rounds)
            else:
                acc = measure_throughput(targets, clients, args.size, args.duration, args.blocks)
                table = throughput_table(targets, clients, acc, args.size, args.duration)
        finally:
            setup.stop()
    table.print()
    table.write_csv(args.results)
    ok_names = [t.name for t in targets if t.error is None]
    if kind == "latency":
        series = {n: (sizes, [r["median_us"] for r in table.rows if r["config"] == n])
                  for n in ok_names}
        png = report.plot(args.results, "latency", "Request/reply latency vs message size "
                          "(echo)", "message size (bytes)", "median latency (us)", series,
                          logx=True)
        png99 = report.plot(args.results, "latency_p99", "p99 latency vs message size (echo)",
                            "message size (bytes)", "p99 latency (us)",
                            {n: (sizes, [r["p99_us"] for r in table.rows if r["config"] == n])
                             for n in ok_names}, logx=True)
        plots = [png, png99]
    else:
        series = {n: (clients, [r["req_per_s"] for r in table.rows if r["config"] == n])
                  for n in ok_names}
        png = report.plot(args.results, "throughput", f"Throughput vs clients ({args.size} B "
                          "echo)", "concurrent clients", "requests per second", series,
                          logx=True)
        plots = [png]
    failed = [t for t in targets if t.error is not None]
    notes = (f"Plots: {', '.join(os.path.basename(p) for p in plots if p) or 'matplotlib missing'}. "
             "Service: examples/echo.py, unmodified. tcp: the plain process reached directly; "
             "proxy: the same process through a plain asyncio TCP proxy (one extra hop, no "
             "llft); llft_Nr: N replicas under `llft run`, reached through `llft gateway` "
             "(client -> gateway over TCP, gateway -> group over LLFT multicast, the "
             "primary's agent -> app over loopback TCP). All configurations were set up at "
             "once and measured interleaved in blocks, so ratios compare the same moment.")
    if failed:
        notes += "\n\nFailed configurations: " + "; ".join(f"{t.name}: {t.error}" for t in failed)
    md = report.write_markdown(args.results, kind, [table.markdown()], notes=notes)
    print(f"wrote {md}")
    return 1 if failed else 0


# ------------------------------------------------- the plain TCP proxy (a child) ----
async def _proxy(target_host: str, target_port: int) -> None:
    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(creader, cwriter):
        cwriter.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sreader, swriter = await asyncio.open_connection(target_host, target_port)
        except OSError:
            cwriter.close()
            return
        swriter.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(creader, swriter), pipe(sreader, cwriter))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(json.dumps({"event": "ready", "port": server.sockets[0].getsockname()[1]}), flush=True)
    await server.serve_forever()


def _proxy_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m llft.bench.service",
                                description="a plain TCP proxy (the hop baseline)")
    p.add_argument("--proxy-to", required=True, metavar="HOST:PORT")
    a = p.parse_args(argv)
    host, _, port = a.proxy_to.rpartition(":")
    try:
        asyncio.run(_proxy(host, int(port)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(_proxy_main(sys.argv[1:]))
