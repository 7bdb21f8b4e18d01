"""`llft bench latency` and `llft bench throughput`: a replicated service against itself, plain.

The service is examples/echo.py, unmodified, reached in these configurations, measured
in ONE run, interleaved in blocks (same machine, same moment):

  tcp        the plain echo.py process, reached directly over TCP (the baseline)
  proxy      the same echo.py process through a plain TCP proxy (asyncio, another
             process): the cost of one extra hop, without llft (`--no-proxy` drops it)
  llft_Nr    a LocalCluster of N replicas (`llft run -- python examples/echo.py PORT`),
             reached through `llft gateway` (N from `--replicas`, default 1,2,3)

Phases: one per replica count. The group is started (`llft run` replicas, then the
gateway, then one echo through it), measured interleaved with tcp and proxy, and
stopped, so no idle group loads the machine (2 cores) while another is measured. llft
ratios are to the tcp samples of the same phase; the tcp and proxy rows pool all phases.
The llft clusters run with the configuration's default detector unless
`--fault-timeout-ms` is given.

latency: this process is the client; one persistent TCP connection per configuration;
for each size (`--sizes`), `--rounds` request/reply round trips per configuration, taken
in `--blocks` interleaved blocks after `--warmup` untimed ones. Median, p90, p99, and the
ratios to tcp (median and p99).

throughput: requests per second of 1, 4, 16 concurrent request/reply clients
(`--clients`; llft.tools.loadclient echo mode, one thread and connection each, every reply
checked) sending `--size` bytes (default 1 KB), for `--duration` seconds per
configuration and client count, back to back (`--blocks` to interleave: each block
opens new connections, which llft's gateway cannot close at the servers yet). Ratio to
tcp.

One cluster per replica count serves every size and client count of its phase. A configuration that
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

from llft import EXAMPLES_DIR
from llft.bench import report
from llft.tools.procs import free_port, read_event

ECHO = os.path.join(EXAMPLES_DIR, "echo.py")
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
    p.add_argument("--blocks", type=int, default=None,
                   help="interleave the configurations in this many blocks (default: latency "
                   "5; throughput 1, since every block opens new connections and the gateway "
                   "cannot close a connection at the servers yet)")
    p.add_argument("--replicas", default="1,2,3", help="llft group sizes to measure")
    p.add_argument("--fault-timeout-ms", type=float, default=None,
                   help="fault_timeout_ms of the llft clusters (default: the "
                   "configuration's default)")
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
        self.diag = None                            # () -> str: log tails, for a failure
        self.detail = ""
        self.failed_at = None                       # the size / client count that failed
        self.cluster = None                         # llft: its LocalCluster
        self.sock: socket.socket | None = None      # latency: the persistent connection

    def fail(self, why: str, at=None) -> None:
        """Stop measuring this configuration. `at`: the size or client count that
        failed (earlier ones stay reported; None: nothing was measured)."""
        if self.error is None:
            self.failed_at = at
            self.error = why.strip().replace("\n", " ")[:300]
            detail = ""
            if self.diag is not None:
                try:
                    detail = f" [{self.diag()}]"
                except Exception:           # noqa: BLE001 -- a diagnostic only
                    pass
            self.detail = why.strip().replace("\n", " ") + detail
            print(f"llft bench: {self.name} failed: {self.detail}", file=sys.stderr)
        self.close()

    def measured(self, key, keys: list) -> bool:
        """Whether `key` (a size or client count, measured in the order of `keys`) was
        measured completely."""
        if self.error is None:
            return True
        return self.failed_at in keys and keys.index(key) < keys.index(self.failed_at)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None


def cluster_settings(**settings: float | None) -> str:
    """[cluster] lines for the settings given (None: the configuration's default)."""
    return "\n".join(f"{k} = {v:g}" for k, v in settings.items() if v is not None)


class Setup:
    """The configurations' processes: echo.py and the proxy for the whole run, and one
    LocalCluster per replica count, started for its phase (`add_cluster`) and stopped
    after it (`stop_cluster`), so idle groups do not load the 2 cores meanwhile."""

    def __init__(self, tmp: str, proxy: bool, fault_timeout_ms: float | None = None,
                 app: str = ECHO, probe: tuple[bytes, bytes] = (b"ping\n", b"ping\n"),
                 group_prefix: str = "echo", heartbeat_ms: float | None = None,
                 proxy_chain: bool = False):
        """`app`: the service program (run as `python APP PORT`); `probe`: one request
        and its exact reply, sent through each new group's whole path first;
        `fault_timeout_ms`, `heartbeat_ms` None: the configuration's defaults;
        `proxy_chain` (with `proxy`): also `proxy_x2`, a second forwarder in front of the
        first: client, forwarder, forwarder, server, the process hops of llft's path
        (client, gateway, primary's agent, app) with no protocol work in them."""
        self.tmp = tmp
        self.fault_timeout_ms = fault_timeout_ms
        self.heartbeat_ms = heartbeat_ms
        self.app, self.probe, self.group_prefix = app, probe, group_prefix
        app_name = os.path.relpath(app, os.path.dirname(EXAMPLES_DIR))
        self.procs: list[subprocess.Popen] = []
        self.clusters = []
        self.baselines: list[Target] = []
        self.llft: list[Target] = []
        tcp = Target("tcp")
        self.baselines.append(tcp)
        tcp.port = free_port()
        self._spawn([sys.executable, app, str(tcp.port)], "app")
        from llft.tools.loadclient import wait_listening
        if not wait_listening(tcp.host, tcp.port, 20):
            tcp.fail(f"{app_name} did not listen on {tcp.port}")
        if proxy:
            px = self._proxy("proxy", tcp)
            if proxy_chain and px.error is None:
                self._proxy("proxy_x2", px)

    def _proxy(self, name: str, to: Target) -> Target:
        """A baseline: a plain TCP forwarder to `to`, started as a child."""
        px = Target(name)
        self.baselines.append(px)
        p = self._spawn([sys.executable, "-m", "llft.bench.service", "--proxy-to",
                         f"{to.host}:{to.port}"], name, stdout=subprocess.PIPE)
        ev = read_event(p, "ready", 20)
        if ev is None:
            px.fail(f"the TCP forwarder {name} did not start")
        else:
            px.port = int(ev["port"])
        return px

    @property
    def targets(self) -> list[Target]:
        return self.baselines + self.llft

    def add_cluster(self, r: int, name: str | None = None) -> Target:
        """A group of `r` replicas; `name` tells apart groups of the same size (its
        target's name, and part of its group id and folder)."""
        t = Target(name or f"llft_{r}r", r)
        self.llft.append(t)
        try:
            t.host, t.port = self._cluster(r, t, name or "")
        except Exception as e:              # noqa: BLE001 -- reported per configuration
            t.fail(f"setup: {type(e).__name__}: {e}")
        return t

    def stop_cluster(self, t: Target) -> None:
        t.close()
        if t.cluster is not None:
            t.cluster.stop()

    def _spawn(self, argv: list[str], name: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
        with open(os.path.join(self.tmp, f"{name}.log"), "ab") as err:
            p = subprocess.Popen(argv, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def _cluster(self, n: int, t: Target, tag: str) -> tuple[str, int]:
        from llft.tools.cluster import LocalCluster
        lc = LocalCluster(os.path.join(self.tmp, f"llft{n}{tag}"),
                          group=f"{self.group_prefix}{n}{tag}",
                          service_port=SERVICE_PORT,
                          extra_cluster=cluster_settings(fault_timeout_ms=self.fault_timeout_ms,
                                                         heartbeat_ms=self.heartbeat_ms))
        self.clusters.append(lc)
        t.cluster = lc
        t.diag = lambda: "; ".join(f"{name}.log: {_last_lines(lc.log_tail(name))}"
                                   for name in lc.logs)
        for i in range(1, n + 1):
            lc.start_replica(f"r{i}", [sys.executable, self.app, str(SERVICE_PORT)])
            try:
                lc.wait_members(i, timeout_s=SETUP_TIMEOUT_S)
            except Exception as e:
                raise RuntimeError(f"r{i} not a member: {str(e)[:200]}") from None
        host, port = lc.start_gateway(timeout_s=SETUP_TIMEOUT_S)
        # one request through the whole path, so a broken path fails here, plainly
        request, reply = self.probe
        try:
            with socket.create_connection((host, port), timeout=REPLY_TIMEOUT_S) as s:
                s.sendall(request)
                got = _recv_exactly(s, len(reply))
            if got != reply:
                raise RuntimeError(f"first request {request!r} returned {got!r}")
        except OSError as e:
            raise RuntimeError(f"first request through the gateway: {e}") from None
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
def _round_trips(t: Target, request: bytes, count: int, out: list[float] | None,
                 reply_ok) -> None:
    """`count` round trips of `request` on t's connection; every reply has the request's
    length and must satisfy reply_ok(reply, request)."""
    if t.sock is None:
        t.sock = socket.create_connection((t.host, t.port), timeout=REPLY_TIMEOUT_S)
        t.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s, n = t.sock, len(request)
    buf = bytearray(n)
    view = memoryview(buf)
    for _ in range(count):
        t0 = time.perf_counter_ns()
        s.sendall(request)
        got = 0
        while got < n:
            k = s.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionError(f"connection closed after {got} of {n} bytes")
            got += k
        t1 = time.perf_counter_ns()
        if not reply_ok(buf, request):
            raise RuntimeError(f"reply of {n} B not as expected: {bytes(buf[:60])!r}...")
        if out is not None:
            out.append((t1 - t0) / 1000)


def measure_round_trips(targets: list[Target], keys: list, request_of, reply_ok, label,
                        rounds: int, warmup: int, blocks: int, phase: int,
                        samples: dict) -> None:
    """Into samples[(phase, config, key)]: round-trip times (us) of request_of(key), the
    configurations interleaved in `blocks` blocks per key; a configuration that fails is
    marked failed (t.fail) with label(key) and skipped from then on."""
    blocks = max(1, min(blocks, rounds))
    for key in keys:
        request = request_of(key)
        for t in targets:
            samples[(phase, t.name, key)] = []
            if t.error is not None:
                continue
            try:
                _round_trips(t, request, warmup, None, reply_ok)
            except Exception as e:          # noqa: BLE001 -- reported per configuration
                t.fail(f"{label(key)} warm-up: {type(e).__name__}: {e}", key)
        for b in range(blocks):
            per = rounds // blocks + (1 if b < rounds % blocks else 0)
            for t in targets:
                if t.error is not None:
                    continue
                try:
                    _round_trips(t, request, per, samples[(phase, t.name, key)], reply_ok)
                except Exception as e:      # noqa: BLE001
                    t.fail(f"{label(key)} round trips: {type(e).__name__}: {e}", key)


def measure_latency(targets: list[Target], sizes: list[int], rounds: int, warmup: int,
                    blocks: int, phase: int, samples: dict) -> None:
    """Into samples[(phase, config, size)]: round-trip times (us) of random payloads
    echoed back unchanged."""
    measure_round_trips(targets, sizes, os.urandom, lambda reply, req: reply == req,
                        lambda size: f"{size} B", rounds, warmup, blocks, phase, samples)


def pooled_samples(samples: dict, name: str, key) -> list:
    return [x for (ph, n, k), v in samples.items() if n == name and k == key for x in v]


def phase_of(samples: dict, name: str) -> int | None:
    return next((ph for (ph, n, _), _v in samples.items() if n == name), None)


def latency_table(setup: Setup, sizes, samples, rounds) -> report.Table:
    """tcp and proxy: every phase's samples pooled; llft_Nr: its phase, and its ratios
    to the tcp samples of that phase."""
    table = report.Table("latency", f"Request/reply latency, echo service (us; {rounds} "
                         "round trips per size and configuration and phase)",
                         ["size_B", "config", "replicas", "n", "median_us", "p90_us", "p99_us",
                          "median_vs_tcp", "p99_vs_tcp", "error"])
    for size in sizes:
        base = report.summarize_us(pooled_samples(samples, "tcp", size))
        for t in setup.targets:
            if t.replicas:
                ph = phase_of(samples, t.name)
                mine = samples.get((ph, t.name, size), [])
                ref = report.summarize_us(samples.get((ph, "tcp", size), []))
            else:
                mine, ref = pooled_samples(samples, t.name, size), base
            s = report.summarize_us(mine)
            good = t.measured(size, sizes)
            row = dict(size_B=size, config=t.name, replicas=t.replicas, n=s["n"],
                       error="" if good else t.error)
            if good and s["n"] > 0:
                row.update(median_us=s["median_us"], p90_us=s["p90_us"], p99_us=s["p99_us"])
                if ref["n"]:
                    row.update(median_vs_tcp=s["median_us"] / ref["median_us"],
                               p99_vs_tcp=s["p99_us"] / ref["p99_us"])
            table.add(**row)
    return table


# ------------------------------------------------------------- throughput -----------
def measure_throughput(targets: list[Target], clients: list[int], size: int,
                       duration_s: float, blocks: int, phase: int, acc: dict,
                       mode: str = "echo") -> None:
    """Into acc[(phase, config, clients)]: replies, seconds and latencies (s). `mode`
    "echo_conn": every request on a connection of its own."""
    from llft.tools.loadclient import run_load
    for c in clients:
        for t in targets:
            acc[(phase, t.name, c)] = {"replies": 0, "elapsed_s": 0.0, "latencies": []}
        for _ in range(max(1, blocks)):
            for t in targets:
                if t.error is not None:
                    continue
                r = run_load(t.host, t.port, clients=c, requests=10 ** 9, mode=mode,
                             size=size, timeout_s=REPLY_TIMEOUT_S,
                             duration_s=duration_s / max(1, blocks))
                if r.error_count:
                    t.fail(f"{c} clients: {r.errors[0] if r.errors else 'errors'}", c)
                    continue
                a = acc[(phase, t.name, c)]
                a["replies"] += r.replies
                a["elapsed_s"] += r.elapsed_s
                a["latencies"] += r.latencies


def _sum_acc(parts: list[dict]) -> dict:
    return {"replies": sum(p["replies"] for p in parts),
            "elapsed_s": sum(p["elapsed_s"] for p in parts),
            "latencies": [x for p in parts for x in p["latencies"]]}


def throughput_table(setup: Setup, clients, acc, size, duration_s) -> report.Table:
    table = report.Table("throughput", f"Throughput, {size} B echo requests (request/reply "
                         f"clients, {duration_s:g} s per configuration, client count and phase)",
                         ["clients", "config", "replicas", "replies", "req_per_s",
                          "median_us", "p99_us", "vs_tcp", "error"])

    def rps(a):
        return a["replies"] / a["elapsed_s"] if a and a["elapsed_s"] > 0 else 0.0
    for c in clients:
        base = _sum_acc([v for (ph, n, k), v in acc.items() if n == "tcp" and k == c])
        for t in setup.targets:
            if t.replicas:
                ph = phase_of(acc, t.name)
                a = acc.get((ph, t.name, c), _sum_acc([]))
                ref = acc.get((ph, "tcp", c))
            else:
                a = _sum_acc([v for (ph, n, k), v in acc.items() if n == t.name and k == c])
                ref = base
            good = t.measured(c, clients)
            row = dict(clients=c, config=t.name, replicas=t.replicas, replies=a["replies"],
                       error="" if good else t.error)
            if good and a["elapsed_s"] > 0:
                lat = report.summarize_us([x * 1e6 for x in a["latencies"]])
                row.update(req_per_s=rps(a), median_us=lat["median_us"], p99_us=lat["p99_us"])
                if rps(ref):
                    row["vs_tcp"] = rps(a) / rps(ref)
            table.add(**row)
    return table


# ---------------------------------------------------------------- command -----------
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run(args) -> int:
    kind = getattr(args, "_kind", "latency")
    command = report.command_of(args, add_arguments, kind)
    if args.quick:
        args.sizes, args.rounds, args.warmup = "64,1024", 50, 10
        args.clients, args.duration = "1,4", 0.5
        args.blocks = args.blocks or 2
    if args.blocks is None:
        args.blocks = 5 if kind == "latency" else 1
    sizes, clients, replicas = _ints(args.sizes), _ints(args.clients), _ints(args.replicas)
    with tempfile.TemporaryDirectory(prefix=f"llft-bench-{kind}-") as tmp:
        setup = Setup(tmp, proxy=not args.no_proxy, fault_timeout_ms=args.fault_timeout_ms)
        data: dict = {}
        try:
            # one phase per replica count: its cluster, measured interleaved with the
            # baselines, then stopped (no phase with llft: the baselines alone)
            for phase, r in enumerate(replicas or [0]):
                cluster = setup.add_cluster(r) if r else None
                targets = setup.baselines + ([cluster] if cluster else [])
                if kind == "latency":
                    measure_latency(targets, sizes, args.rounds, args.warmup, args.blocks,
                                    phase, data)
                else:
                    measure_throughput(targets, clients, args.size, args.duration,
                                       args.blocks, phase, data)
                if cluster is not None:
                    setup.stop_cluster(cluster)
        finally:
            setup.stop()
        targets = setup.targets
        if kind == "latency":
            table = latency_table(setup, sizes, data, args.rounds)
        else:
            table = throughput_table(setup, clients, data, args.size, args.duration)
    table.print()
    table.write_csv(args.results)
    def series(xcol: str, ycol: str) -> dict:
        out = {}
        for t in targets:
            pts = [(r[xcol], r[ycol]) for r in table.rows
                   if r["config"] == t.name and isinstance(r.get(ycol), float)]
            if pts:
                out[t.name] = ([x for x, _ in pts], [y for _, y in pts])
        return out
    if kind == "latency":
        png = report.plot(args.results, "latency", "Request/reply latency vs message size "
                          "(echo)", "message size (bytes)", "median latency (us)",
                          series("size_B", "median_us"), logx=True, logy=True, xticks=sizes)
        png99 = report.plot(args.results, "latency_p99", "p99 latency vs message size (echo)",
                            "message size (bytes)", "p99 latency (us)",
                            series("size_B", "p99_us"), logx=True, logy=True, xticks=sizes)
        plots = [png, png99]
    else:
        thr_series = series("clients", "req_per_s")
        png = report.plot(args.results, "throughput", f"Throughput vs clients ({args.size} B "
                          "echo)", "concurrent clients", "requests per second", thr_series,
                          logx=True, logy=True, xticks=clients)
        plots = [png]
    failed = [t for t in targets if t.error is not None]
    notes = ("Service: examples/echo.py, unmodified. tcp: the plain process reached directly; "
             "proxy: the same process through a plain asyncio TCP proxy (one extra hop, no "
             "llft); llft_Nr: N replicas under `llft run`, reached through `llft gateway` "
             "(client -> gateway over TCP, gateway -> group over LLFT multicast, the "
             "primary's agent -> app over a UNIX socket), with fault_timeout_ms = "
             f"{report.detector_ms(args.fault_timeout_ms)} (failure-free path; `llft bench failover` measures "
             "failures). One phase per replica count: that group is started, measured "
             "interleaved in blocks with tcp and proxy, and stopped (no idle group loads the "
             "2 cores meanwhile); llft ratios are to the tcp samples of the same phase; the "
             "tcp and proxy rows pool every phase.")
    if failed:
        notes += "\n\nFailed configurations: " + "; ".join(f"{t.name}: {t.detail}"
                                                         for t in failed)
    md = report.write_markdown(args.results, kind, [table.markdown()], notes=notes,
                               plots=plots, command=command)
    print(f"wrote {md}")
    return 1 if failed else 0


# ------------------------------------------------- the plain TCP proxy (a child) ----
async def _proxy(target_host: str, target_port: int) -> None:
    async def pipe(reader, writer):
        """One direction; its end is passed on as a half-close (FIN), like TCP itself
        and the gateway: the other direction keeps flowing until it ends too."""
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            writer.close()

    handlers: set[asyncio.Task] = set()

    async def handle(creader, cwriter):
        # held here: asyncio drops its reference to a connection's handler once the client
        # transport is closed both ways, and a pending handler would be collected mid-way
        task = asyncio.current_task()
        handlers.add(task)
        task.add_done_callback(handlers.discard)
        cwriter.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sreader, swriter = await asyncio.open_connection(target_host, target_port)
        except OSError:
            cwriter.close()
            return
        swriter.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(creader, swriter), pipe(sreader, cwriter))
        swriter.close()
        cwriter.close()

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
