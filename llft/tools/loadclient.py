"""Load generator and checker for the example services (counter and echo).

Used by the demo, the tests and the benchmarks as a library, and on its own:

    python -m llft.tools.loadclient --connect HOST:PORT --clients 4 --requests 5000 \
        [--mode counter|echo] [--size BYTES] [--timeout-s 30] [--json]

One thread and one TCP connection per client; each client sends one request at a time
and waits for its reply (request/reply), recording `time.monotonic()` at send and at
receive. `--requests` is per client.

counter mode (examples/kv_counter.py): client i sends `INCR <prefix>c<i>`; the prefix is
random per run, so the per-key counts start at 1 even against a long-running service.
Checked for every reply: exactly one reply per request, in order (the key echoed back);
per-key counts strictly consecutive 1, 2, 3...; global counts unique across all clients
(repeats reported) and increasing per client; the service's clock never going backwards
per client. http mode (examples/http_counter.py): the same counter checks, each request
`GET /incr/<key>` on a new connection (one connection per request). echo mode (examples/echo.py, or a group of `llft.tools.streamdemo --echo`): sends
`--size` random bytes per request and expects exactly them back.

A connection failure, a reply timeout (`timeout_s`, default 30 s) or a wrong reply ends
that client with an error in the result; the run never hangs. The result (`LoadResult`)
holds every reply's send/receive times, so callers can compute throughput over time and
the longest gap between replies (`max_gap_s`: the client-visible pause at a failover).

Library:
    r = run_load("127.0.0.1", 9000, clients=4, requests=1000, mode="counter")
    r.ok, r.errors, r.replies, r.latencies, r.reply_times, r.max_gap_s, r.max_gap_at_s
    wait_listening("127.0.0.1", 9000, timeout_s=10)   # until something accepts there
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

MAX_ERRORS = 20
MODES = ("counter", "echo", "echo_conn", "http")


@dataclass
class ClientTrace:
    """What one client did: (send, receive) monotonic times of each answered request."""
    index: int
    sent: int = 0
    replies: int = 0
    times: list[tuple[float, float]] = field(default_factory=list)
    globals_: list[int] = field(default_factory=list)     # counter mode: global counts
    error: str | None = None
    on_reply: Callable[[int, int], None] | None = None

    def replied(self, t0: float, t1: float) -> None:
        self.replies += 1
        self.times.append((t0, t1))
        if self.on_reply is not None:
            self.on_reply(self.index, self.replies)


@dataclass
class LoadResult:
    mode: str
    clients: int
    requests: int                   # requests sent, all clients
    replies: int                    # correct replies received, all clients
    errors: list[str]               # the first MAX_ERRORS problems
    error_count: int                # all problems
    latencies: list[float]          # seconds, every reply, client order then request order
    reply_times: list[list[tuple[float, float]]]   # per client: (send, receive) monotonic
    started: float                  # monotonic time the run started
    elapsed_s: float
    max_gap_s: float                # longest gap between two replies of one client
    max_gap_at_s: float             # when that gap ended, seconds since `started`
    max_gap_client: int
    global_repeats: int = 0         # counter mode: global counts seen more than once
    size: int = 0                   # echo mode: bytes per request

    @property
    def ok(self) -> bool:
        return self.error_count == 0 and self.replies == self.requests

    @property
    def throughput_rps(self) -> float:
        return self.replies / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def latency_percentile(self, p: float) -> float:
        if not self.latencies:
            return 0.0
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(p / 100.0 * len(s)))]

    def summary(self) -> dict:
        return {"mode": self.mode, "clients": self.clients, "requests": self.requests,
                "replies": self.replies, "ok": self.ok, "error_count": self.error_count,
                "errors": self.errors, "global_repeats": self.global_repeats,
                "elapsed_s": round(self.elapsed_s, 6),
                "throughput_rps": round(self.throughput_rps, 1),
                "latency_p50_s": round(self.latency_percentile(50), 6),
                "latency_p99_s": round(self.latency_percentile(99), 6),
                "max_gap_s": round(self.max_gap_s, 6),
                "max_gap_at_s": round(self.max_gap_at_s, 6),
                "max_gap_client": self.max_gap_client, "size": self.size}

    def to_dict(self, samples: bool = True) -> dict:
        d = self.summary()
        if samples:
            d["latencies"] = [round(x, 6) for x in self.latencies]
            d["reply_times"] = [[[round(s - self.started, 6), round(r - self.started, 6)]
                                 for s, r in times] for times in self.reply_times]
        return d


class _Fail(Exception):
    pass


class _Conn:
    """A blocking TCP connection with a receive buffer and a per-reply timeout."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def _fill(self, what: str) -> None:
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise _Fail(f"no reply to {what} within the timeout") from None
        except OSError as e:
            raise _Fail(f"connection failed waiting for {what}: {e}") from None
        if not data:
            raise _Fail(f"connection closed by the service waiting for {what}")
        self.buf += data

    def readline(self, what: str) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 1]
                return line
            self._fill(what)

    def readexactly(self, n: int, what: str) -> bytes:
        while len(self.buf) < n:
            self._fill(what)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def send(self, data: bytes, what: str) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise _Fail(f"connection failed sending {what}: {e}") from None

    def pending_extra(self) -> int:
        """Bytes already received beyond what was asked for (non-blocking look)."""
        try:
            self.sock.setblocking(False)
            try:
                data = self.sock.recv(65536)
                if data:
                    self.buf += data
            except (BlockingIOError, InterruptedError):
                pass
        except OSError:
            pass
        return len(self.buf)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def wait_listening(host: str, port: int, timeout_s: float = 10.0) -> bool:
    """Wait until a TCP connect to host:port succeeds (a service started in the
    background is ready); False at the deadline."""
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, timeout_s)).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
        # back off between refused connects (a condition wait with a deadline)
        threading.Event().wait(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.2)


class _CounterCheck:
    """The checks of one counter client's replies (module doc), request after request."""

    def __init__(self, tr: ClientTrace, key: str, expect_first: int | None, problems: list):
        self.tr, self.key, self.problems = tr, key, problems
        self.last_count = None if expect_first is None else expect_first - 1
        self.last_global = 0
        self.last_clock = float("-inf")

    def reply(self, what: str, line: bytes, t0: float, t1: float) -> None:
        tr, key, problems = self.tr, self.key, self.problems
        parts = line.decode("utf-8", "replace").split()
        if len(parts) != 6 or parts[0] != "OK":
            raise _Fail(f"{what}: unexpected reply {line[:100]!r}")
        if parts[1] != key:
            raise _Fail(f"{what}: reply for key {parts[1]!r}, expected {key!r} "
                        "(replies out of order or crossed)")
        try:
            count, gcount, clock = int(parts[2]), int(parts[3]), float(parts[4])
            int(parts[5], 16)
        except ValueError:
            raise _Fail(f"{what}: malformed reply {line[:100]!r}") from None
        tr.globals_.append(gcount)
        tr.replied(t0, t1)
        if self.last_count is not None and count != self.last_count + 1:
            problems.append(f"client {tr.index}: {what}: key count {count}, expected "
                            f"{self.last_count + 1} (a request executed "
                            f"{'twice' if count <= self.last_count else 'never'}?)")
        self.last_count = count
        if gcount <= self.last_global:
            problems.append(f"client {tr.index}: {what}: global count {gcount} not above "
                            f"the previous {self.last_global}")
        self.last_global = gcount
        if clock < self.last_clock:
            problems.append(f"client {tr.index}: {what}: service clock went backwards "
                            f"({self.last_clock!r} -> {clock!r})")
        self.last_clock = clock


def _counter_loop(tr: ClientTrace, check: _CounterCheck, requests: int, name: str,
                  exchange: Callable[[str], bytes], stop: threading.Event,
                  deadline: float | None, interval_s: float = 0.0) -> None:
    """Request after request: `exchange(what)` sends one (counting it in tr.sent) and
    returns its reply line, which `check` judges. `interval_s`: a request starts no
    sooner than this long after the previous one started (the load's rate, not a wait
    for anything)."""
    t0 = float("-inf")
    for n in range(requests):
        if interval_s > 0:
            stop.wait(max(0.0, t0 + interval_s - time.monotonic()))
        if not _going_on(stop, deadline):
            return
        what = f"{name} #{n + 1}"
        t0 = time.monotonic()
        line = exchange(what)
        check.reply(what, line, t0, time.monotonic())


def _counter_client(tr: ClientTrace, conn: _Conn, key: str, requests: int,
                    expect_first: int | None, problems: list, stop: threading.Event,
                    deadline: float | None, interval_s: float = 0.0) -> None:
    req = f"INCR {key}\n".encode()

    def exchange(what: str) -> bytes:
        conn.send(req, what)
        tr.sent += 1
        return conn.readline(what)

    _counter_loop(tr, _CounterCheck(tr, key, expect_first, problems), requests, "INCR",
                  exchange, stop, deadline, interval_s)


def _http_client(tr: ClientTrace, host: str, port: int, timeout_s: float, key: str,
                 requests: int, expect_first: int | None, problems: list,
                 stop: threading.Event, deadline: float | None,
                 interval_s: float = 0.0) -> None:
    """examples/http_counter.py: one new connection per request (HTTP/1.0 style: the
    server closes it after the reply); the reply body is a counter line."""

    def exchange(what: str) -> bytes:
        c = http.client.HTTPConnection(host, port, timeout=timeout_s)
        try:
            c.request("GET", f"/incr/{key}")
            tr.sent += 1
            resp = c.getresponse()
            body = resp.read()
        except socket.timeout:
            raise _Fail(f"no reply to {what} within the timeout") from None
        except (OSError, http.client.HTTPException) as e:
            raise _Fail(f"connection failed during {what}: {type(e).__name__}: {e}") from None
        finally:
            c.close()
        if resp.status != 200:
            raise _Fail(f"{what}: HTTP {resp.status} {body[:100]!r}")
        return body.rstrip(b"\n")

    _counter_loop(tr, _CounterCheck(tr, key, expect_first, problems), requests,
                  f"GET /incr/{key}", exchange, stop, deadline, interval_s)


def _going_on(stop: threading.Event, deadline: float | None) -> bool:
    """Whether a client starts another request: not stopped, not past the deadline."""
    return not stop.is_set() and (deadline is None or time.monotonic() < deadline)


def _echo_client(tr: ClientTrace, conn: _Conn, size: int, requests: int,
                 problems: list, stop: threading.Event, deadline: float | None) -> None:
    for n in range(requests):
        if not _going_on(stop, deadline):
            break
        what = f"echo #{n + 1}"
        payload = os.urandom(size)
        t0 = time.monotonic()
        conn.send(payload, what)
        tr.sent += 1
        back = conn.readexactly(size, what)
        t1 = time.monotonic()
        if back != payload:
            i = next(k for k in range(size) if back[k] != payload[k])
            raise _Fail(f"{what}: echoed bytes differ from byte {i} on "
                        "(lost, repeated or reordered bytes)")
        tr.replied(t0, t1)
    extra = conn.pending_extra()
    if extra:
        problems.append(f"client {tr.index}: {extra} unexpected bytes after the last echo "
                        "(repeated bytes?)")


def _echo_conn_client(tr: ClientTrace, host: str, port: int, timeout_s: float, size: int,
                      requests: int, stop: threading.Event, deadline: float | None) -> None:
    """One connection per request: connect, send `size` bytes, half-close (FIN), read
    the echo until the server closes (examples/echo.py echoes until the client's FIN)."""
    for n in range(requests):
        if not _going_on(stop, deadline):
            break
        what = f"echo #{n + 1} (own connection)"
        payload = os.urandom(size)
        t0 = time.monotonic()
        conn = _Conn(host, port, timeout_s)
        try:
            conn.send(payload, what)
            tr.sent += 1
            conn.sock.shutdown(socket.SHUT_WR)
            back = conn.readexactly(size, what)
            try:
                rest = conn.sock.recv(65536)     # the server's close (blocking, timeout)
            except socket.timeout:
                raise _Fail(f"{what}: the server did not close after the echo") from None
            if conn.buf or rest:
                raise _Fail(f"{what}: bytes after the echo (repeated bytes?)")
        finally:
            conn.close()
        t1 = time.monotonic()
        if back != payload:
            raise _Fail(f"{what}: echoed bytes differ (lost, repeated or reordered bytes)")
        tr.replied(t0, t1)


def run_load(host: str, port: int, *, clients: int = 4, requests: int = 1000,
             mode: str = "counter", size: int = 1024, timeout_s: float = 30.0,
             prefix: str | None = None, duration_s: float | None = None,
             stop: threading.Event | None = None,
             on_reply: Callable[[int, int], None] | None = None,
             interval_s: float = 0.0) -> LoadResult:
    """Run `clients` concurrent request/reply clients, `requests` each (or until
    `duration_s` or `stop`), against host:port; check every reply (see module doc).
    `on_reply(client, replies_so_far)` is called from the client's thread after each
    correct reply (live progress, or a test's trigger). counter and http modes:
    `interval_s` paces each client (a request at most every interval_s)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    if clients < 1 or requests < 0 or size < 1:
        raise ValueError("clients >= 1, requests >= 0, size >= 1")
    stop = stop or threading.Event()
    run_prefix = prefix if prefix is not None else f"r{secrets.token_hex(4)}-"
    expect_first = 1 if prefix is None else None
    traces = [ClientTrace(i, on_reply=on_reply) for i in range(clients)]
    problems: list[str] = []
    lock = threading.Lock()
    started = time.monotonic()
    deadline = None if duration_s is None else started + duration_s

    def client(tr: ClientTrace) -> None:
        local: list[str] = []
        conn = None
        try:
            key = f"{run_prefix}c{tr.index}"
            if mode == "http":
                _http_client(tr, host, port, timeout_s, key, requests, expect_first, local,
                             stop, deadline, interval_s)
            elif mode == "echo_conn":
                _echo_conn_client(tr, host, port, timeout_s, size, requests, stop, deadline)
            elif mode == "counter":
                conn = _Conn(host, port, timeout_s)
                _counter_client(tr, conn, key, requests, expect_first, local, stop, deadline,
                                interval_s)
            else:
                conn = _Conn(host, port, timeout_s)
                _echo_client(tr, conn, size, requests, local, stop, deadline)
        except _Fail as e:
            tr.error = f"client {tr.index}: {e}"
        except OSError as e:
            tr.error = f"client {tr.index}: cannot connect to {host}:{port}: {e}"
        except Exception as e:          # noqa: BLE001 -- reported, never a hang
            tr.error = f"client {tr.index}: {type(e).__name__}: {e}"
        finally:
            if conn is not None:
                conn.close()
            with lock:
                problems.extend(local)
                if tr.error:
                    problems.append(tr.error)

    threads = [threading.Thread(target=client, args=(tr,), daemon=True) for tr in traces]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started

    repeats = 0
    if mode in ("counter", "http"):
        seen = Counter(g for tr in traces for g in tr.globals_)
        repeats = sum(1 for n in seen.values() if n > 1)
        if repeats:
            dup = sorted(g for g, n in seen.items() if n > 1)[:5]
            problems.append(f"{repeats} global counts seen more than once, e.g. {dup} "
                            "(a request executed twice?)")
    sent = sum(tr.sent for tr in traces)
    replies = sum(tr.replies for tr in traces)
    unanswered = sent - replies
    if unanswered and not any(tr.error for tr in traces):
        problems.append(f"{unanswered} requests without a correct reply")
    gap, gap_at, gap_client = 0.0, 0.0, -1
    for tr in traces:
        prev = started
        for _, recv in tr.times:
            if recv - prev > gap:
                gap, gap_at, gap_client = recv - prev, recv - started, tr.index
            prev = recv
    return LoadResult(
        mode=mode, clients=clients, requests=sent, replies=replies,
        errors=problems[:MAX_ERRORS], error_count=len(problems),
        latencies=[r - s for tr in traces for s, r in tr.times],
        reply_times=[tr.times for tr in traces], started=started, elapsed_s=elapsed,
        max_gap_s=gap, max_gap_at_s=gap_at, max_gap_client=gap_client,
        global_repeats=repeats, size=size if mode.startswith("echo") else 0)


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llft.tools.loadclient",
                                description=__doc__.splitlines()[0])
    p.add_argument("--connect", type=_hostport, required=True, metavar="HOST:PORT")
    p.add_argument("--clients", type=int, default=4, help="concurrent connections")
    p.add_argument("--requests", type=int, default=1000, help="requests per client")
    p.add_argument("--mode", choices=MODES, default="counter")
    p.add_argument("--size", type=int, default=1024, help="echo mode: bytes per request")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-reply timeout")
    p.add_argument("--duration-s", type=float, default=None,
                   help="stop each client after this long (even before --requests)")
    p.add_argument("--prefix", default=None,
                   help="counter mode: fixed key prefix (default: random per run)")
    p.add_argument("--wait-s", type=float, default=0.0,
                   help="first wait up to this long for the service to accept connections")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--no-samples", action="store_true",
                   help="with --json: leave out per-reply latencies and times")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    host, port = args.connect
    if args.wait_s > 0 and not wait_listening(host, port, args.wait_s):
        print(f"loadclient: nothing accepts connections at {host}:{port}", file=sys.stderr)
        return 2
    try:
        r = run_load(host, port, clients=args.clients, requests=args.requests,
                     mode=args.mode, size=args.size, timeout_s=args.timeout_s,
                     prefix=args.prefix, duration_s=args.duration_s)
    except ValueError as e:
        print(f"loadclient: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r.to_dict(samples=not args.no_samples)), flush=True)
    else:
        s = r.summary()
        print(f"{s['mode']}: {s['clients']} clients, {s['replies']}/{s['requests']} replies "
              f"in {s['elapsed_s']:.3f} s ({s['throughput_rps']:.0f}/s), latency p50 "
              f"{s['latency_p50_s'] * 1e3:.3f} ms p99 {s['latency_p99_s'] * 1e3:.3f} ms, "
              f"longest gap {s['max_gap_s'] * 1e3:.1f} ms at {s['max_gap_at_s']:.3f} s")
        print("OK" if r.ok else f"FAILED: {r.error_count} problem(s)")
        for e in r.errors:
            print(f"  {e}")
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())


class BackgroundLoad:
    """`run_load` in a thread, for a test or demo that injects a fault mid-load:
    `under_way.wait(t)` once some client has `after` correct replies, then `result(t)`."""

    def __init__(self, host: str, port: int, *, after: int = 50, **kw) -> None:
        self.under_way = threading.Event()
        self._out: list[LoadResult] = []
        self._replied: dict[int, int] = {}

        def progress(client: int, n: int) -> None:
            self._replied[client] = n
            if n >= after:
                self.under_way.set()
        self._thread = threading.Thread(
            target=lambda: self._out.append(run_load(host, port, on_reply=progress, **kw)),
            daemon=True)
        self._thread.start()

    def replies(self) -> int:
        """Correct replies so far, all clients (progress while the load runs)."""
        return sum(list(self._replied.values()))

    def result(self, timeout_s: float) -> LoadResult:
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive() or not self._out:
            raise TimeoutError(f"the load did not finish in {timeout_s} s")
        return self._out[0]
