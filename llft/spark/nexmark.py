"""Nexmark-style event generator and result sink for the streaming pipeline example
(examples/nexmark_pipeline.py).

    python -m llft.spark.nexmark gen  --connect HOST:PORT [--seed 7] [--events 20000] [--rate 2000]
    python -m llft.spark.nexmark sink --connect HOST:PORT [--out results.jsonl] [--timeout 120]

Events (one line each, ASCII, comma-separated; the auction-site model of the Nexmark
benchmark: 1 person, 3 auctions and 46 bids in every 50 events). `seq` is the event's
offset in the input stream, `ts` its event time in milliseconds (= seq * spacing, so the
stream is in event-time order):

    P,<seq>,<ts>,<person id>,<name>,<city>,<state>
    A,<seq>,<ts>,<auction id>,<seller person id>,<category>,<initial bid>
    B,<seq>,<ts>,<auction id>,<bidder person id>,<price in cents>

The generator is deterministic in its seed: the same seed gives the same bytes, so a
replicated run and an unreplicated reference run can be compared byte for byte, and a
restarted driver can ask for the stream again from any offset.

Source protocol (generator = client): send `SOURCE\\n`, read `FROM <offset>\\n` (the
pipeline's next needed event; 0 on a fresh start, the checkpointed offset after a
recovery), send events from that offset, then `END\\n` after the last one. If the
connection breaks, reconnect and start over with the handshake (a replayable source,
like a Kafka topic).

Sink protocol (sink = client): send `SINK\\n`, then read result lines: one JSON object per
closed event-time window, `{"w": <window>, "events": [first seq, last seq], ...}`, and a
last line `{"end": ...}`. The sink checks by input-stream offset: windows numbered
0, 1, 2... with no gap, each window's event range starting where the previous one ended;
a window received again (a restarted driver re-emitting what it emitted after its last
checkpoint) is counted as repeated, compared with the first copy, and dropped.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

STATES = ("OR", "ID", "CA", "WA", "AZ", "NV", "UT", "NM")
CITIES = ("Portland", "Boise", "Sacramento", "Seattle", "Phoenix", "Reno", "Ogden", "Taos")
FIRST = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter")
LAST = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
CATEGORIES = 10
RECENT_AUCTIONS = 100  # bids go to one of the newest auctions (Nexmark's "hot" auctions)


def generate(seed: int, count: int, spacing_ms: int = 1) -> list[bytes]:
    """The first `count` event lines (with trailing newline) of the stream of `seed`."""
    rng = random.Random(seed)
    out: list[bytes] = []
    persons = auctions = 0
    for seq in range(count):
        ts = seq * spacing_ms
        k = seq % 50
        if k == 0:
            name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
            i = rng.randrange(len(STATES))
            out.append(f"P,{seq},{ts},{persons},{name},{CITIES[i]},{STATES[i]}\n".encode())
            persons += 1
        elif k <= 3:
            seller = rng.randrange(persons)
            out.append(f"A,{seq},{ts},{auctions},{seller},{rng.randrange(CATEGORIES)},"
                       f"{rng.randrange(100, 5000)}\n".encode())
            auctions += 1
        else:
            auction = rng.randrange(max(0, auctions - RECENT_AUCTIONS), auctions)
            out.append(f"B,{seq},{ts},{auction},{rng.randrange(persons)},"
                       f"{rng.randrange(100, 100000)}\n".encode())
    return out


def parse_hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    return host, int(port)


def _connect(addr: tuple[str, int], deadline: float, stop: threading.Event) -> socket.socket | None:
    """Connect, retrying every 20 ms until `deadline` (the service may be restarting)."""
    while not stop.is_set():
        try:
            s = socket.create_connection(addr, timeout=5)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(None)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            stop.wait(0.02)
    return None


def _readline(sock: socket.socket, limit: int = 1 << 16) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        b = sock.recv(1)
        if not b:
            raise ConnectionError("connection closed during handshake")
        buf += b
        if len(buf) > limit:
            raise ConnectionError("handshake line too long")
    return bytes(buf)


@dataclass
class GeneratorStats:
    sent: int = 0                      # events sent (counting resends)
    connections: int = 0
    resumed_from: list[int] = field(default_factory=list)  # FROM offsets asked for
    done: bool = False
    error: str = ""


def _reconnecting(one_connection, stop: threading.Event, more) -> str:
    """Call one_connection() again after every broken connection (the driver went away
    and may come back), while more() and not stopped. Returns the error that ended it,
    "" if none: a connect timeout, or anything unexpected."""
    try:
        while not stop.is_set() and more():
            try:
                one_connection()
            except (ConnectionError, OSError) as e:
                if isinstance(e, TimeoutError) or stop.is_set():
                    raise
    except Exception as e:  # reported, not raised: the harness reads the error
        return f"{type(e).__name__}: {e}"
    return ""


class Generator:
    """Sends `events` to the pipeline at `rate` events/s (0 = as fast as possible).

    With `keep_serving`, it also serves a driver that connects again after the whole
    stream was sent (until stopped), like a topic a restarted consumer reads again from
    its committed offset: a checkpointed driver restarted while still behind its input
    asks for the events after its checkpoint."""

    def __init__(self, addr: tuple[str, int], events: list[bytes], rate: float = 0.0,
                 connect_timeout_s: float = 120.0, chunk: int = 20, keep_serving: bool = False):
        self.addr, self.events, self.rate = addr, events, rate
        self.connect_timeout_s, self.chunk = connect_timeout_s, chunk
        self.keep_serving = keep_serving
        self.stats = GeneratorStats()
        self.stop = threading.Event()
        self.first_send_t: float | None = None

    def run(self) -> GeneratorStats:
        self.stats.error = _reconnecting(self._serve_once, self.stop,
                                         lambda: self.keep_serving or not self.stats.done)
        return self.stats

    def _serve_once(self) -> None:
        asked = len(self.stats.resumed_from)
        try:
            self._one_connection()
        finally:
            if self.keep_serving and self.stats.resumed_from[asked:] == [len(self.events)]:
                # the driver had everything and closed after END (the pipeline drops a
                # source connection once it has read END): back off before asking
                # again, so that a driver that keeps doing so is not hammered
                self.stop.wait(0.1)

    def _one_connection(self) -> None:
        s = _connect(self.addr, time.monotonic() + self.connect_timeout_s, self.stop)
        if s is None:
            return
        with s:
            self.stats.connections += 1
            s.sendall(b"SOURCE\n")
            line = _readline(s)
            if not line.startswith(b"FROM "):
                raise ConnectionError(f"unexpected handshake reply {line!r}")
            pos = int(line[5:])
            self.stats.resumed_from.append(pos)
            t0, sent0 = time.monotonic(), pos
            if self.first_send_t is None:
                self.first_send_t = t0
            while pos < len(self.events) and not self.stop.is_set():
                if self.rate > 0:
                    due = t0 + (pos - sent0) / self.rate
                    wait = due - time.monotonic()
                    if wait > 0:
                        self.stop.wait(wait)
                n = min(self.chunk, len(self.events) - pos)
                s.sendall(b"".join(self.events[pos:pos + n]))
                pos += n
                self.stats.sent += n
            if not self.stop.is_set():
                s.sendall(b"END\n")
                self.stats.done = True
                # keep the connection open until the pipeline closes it or we are
                # stopped: closing early would look like a failure to a restarted driver
                s.settimeout(0.2)
                while not self.stop.is_set():
                    try:
                        if not s.recv(4096):
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break


@dataclass
class Window:
    w: int
    line: bytes        # the exact bytes received (without the newline)
    t: float           # arrival time (time.monotonic())
    offset: int        # byte offset of the line in its connection's stream
    connection: int


class Sink:
    """Receives the pipeline's results, reconnecting when the driver restarts; checks them.

    `windows` holds the first copy of every window in order; `repeated` counts copies
    received again (equal or not: `conflicts` counts those that differ); `gaps` lists
    missing window numbers or event ranges that do not continue the previous one."""

    def __init__(self, addr: tuple[str, int], connect_timeout_s: float = 120.0):
        self.addr, self.connect_timeout_s = addr, connect_timeout_s
        self.windows: list[Window] = []
        self.end: dict | None = None
        self.end_t: float | None = None
        self.repeated = 0
        self.conflicts = 0
        self.gaps: list[str] = []
        self.arrivals: list[float] = []   # every result line's arrival, repeats included
        self.connections = 0
        self.error = ""
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    # ---- receiving -------------------------------------------------------------------
    def run(self) -> None:
        self.error = _reconnecting(self._one_connection, self.stop, lambda: self.end is None)
        with self.changed:
            self.changed.notify_all()

    def _one_connection(self) -> None:
        s = _connect(self.addr, time.monotonic() + self.connect_timeout_s, self.stop)
        if s is None:
            return
        with s:
            self.connections += 1
            conn = self.connections
            s.sendall(b"SINK\n")
            s.settimeout(0.2)
            buf, offset = b"", 0
            while not self.stop.is_set() and self.end is None:
                try:
                    data = s.recv(1 << 16)
                except TimeoutError:
                    continue
                if not data:
                    raise ConnectionError("sink connection closed")
                now = time.monotonic()
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._accept(line, now, offset, conn)
                    offset += len(line) + 1

    def _accept(self, line: bytes, t: float, offset: int, conn: int) -> None:
        try:
            obj = json.loads(line)
        except ValueError:
            raise ConnectionError(f"sink: not a JSON line at offset {offset}: {line[:80]!r}")
        with self.changed:
            self.arrivals.append(t)
            if "end" in obj:
                self.end, self.end_t = obj, t
            else:
                w = int(obj["w"])
                if w < len(self.windows):
                    self.repeated += 1
                    if self.windows[w].line != line:
                        self.conflicts += 1
                else:
                    if w != len(self.windows):
                        self.gaps.append(f"window {w} after {len(self.windows) - 1}")
                    first, last = obj["events"]
                    prev_last = (json.loads(self.windows[-1].line)["events"][1]
                                 if self.windows else -1)
                    if first != prev_last + 1:
                        self.gaps.append(f"window {w} starts at event {first}, "
                                         f"previous ended at {prev_last}")
                    # windows are stored at their number; a gap leaves no hole in the list
                    # (the check above already reported it)
                    self.windows.append(Window(w, line, t, offset, conn))
            self.changed.notify_all()

    # ---- waiting and reading -----------------------------------------------------------
    def wait(self, predicate, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not predicate(self):
                if self.error and self.end is None:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.2))
            return True

    def received_bytes(self) -> bytes:
        """The de-duplicated result stream (first copy of every window, then the end line),
        the bytes an unreplicated run must reproduce exactly."""
        with self.lock:
            out = b"".join(w.line + b"\n" for w in self.windows)
            if self.end is not None:
                out += json.dumps(self.end, sort_keys=True, separators=(",", ":")).encode() + b"\n"
            return out

    def verdict(self, expected_events: int | None = None) -> list[str]:
        """Problems found ([] = good): gaps, conflicting repeats, missing end, coverage."""
        problems = list(self.gaps)
        if self.conflicts:
            problems.append(f"{self.conflicts} repeated windows differ from their first copy")
        if self.end is None:
            problems.append(f"no end line (received {len(self.windows)} windows)"
                            + (f"; error: {self.error}" if self.error else ""))
        elif expected_events is not None:
            last = json.loads(self.windows[-1].line)["events"][1] if self.windows else -1
            if last != expected_events - 1 or self.end.get("events") != expected_events:
                problems.append(f"results cover events up to {last}, end says "
                                f"{self.end.get('events')}, expected {expected_events}")
        return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llft.spark.nexmark", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="send the event stream")
    g.add_argument("--connect", type=parse_hostport, required=True)
    g.add_argument("--seed", type=int, default=7)
    g.add_argument("--events", type=int, default=20000)
    g.add_argument("--rate", type=float, default=2000, help="events/s (0 = unpaced)")
    s = sub.add_parser("sink", help="receive and check the results")
    s.add_argument("--connect", type=parse_hostport, required=True)
    s.add_argument("--out", help="write the de-duplicated result lines here")
    s.add_argument("--events", type=int, help="expected number of input events")
    s.add_argument("--timeout", type=float, default=300)
    a = p.parse_args(argv)
    if a.cmd == "gen":
        gen = Generator(a.connect, generate(a.seed, a.events), a.rate)
        st = gen.run()
        print(json.dumps({"sent": st.sent, "connections": st.connections,
                          "resumed_from": st.resumed_from, "done": st.done, "error": st.error}))
        return 0 if st.done else 1
    sink = Sink(a.connect)
    t = threading.Thread(target=sink.run, daemon=True)
    t.start()
    ok = sink.wait(lambda k: k.end is not None, a.timeout)
    sink.stop.set()
    if a.out:
        with open(a.out, "wb") as f:
            f.write(sink.received_bytes())
    problems = sink.verdict(a.events) if ok else ["timed out"] + sink.verdict(a.events)
    print(json.dumps({"windows": len(sink.windows), "repeated": sink.repeated,
                      "connections": sink.connections, "problems": problems}))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
