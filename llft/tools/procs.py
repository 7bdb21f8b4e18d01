"""Child processes that speak JSON lines: start, read events, wait, stop (tests, benches, demos).

Waiting is on the processes' own output (a selector with a deadline), never on sleeps.
Addresses: loopback only; multicast groups are joined on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (the kernel's pick)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A process that keeps one core busy (a co-located heavy job: chaos's `cpu_hog`, the busy
# machine tests) and exits once orphaned: a harness killed before it could stop its hogs
# (pytest interrupted mid-campaign) once left three of them burning every core for half
# an hour, under every measurement after it. (The check costs a syscall per ~20 ms.)
CPU_HOG_ARGV = [sys.executable, "-c",
                "import os\np = os.getppid()\n"
                "while os.getppid() == p:\n    for _ in range(500_000): pass"]


def random_group_addresses(groups: list[str]) -> str:
    """Fresh multicast address:port per group, so concurrent test runs do not collide."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    base = rng.randrange(20000, 60000)
    return ",".join(f"{g}=239.255.{rng.randrange(1, 255)}.{rng.randrange(1, 255)}:{base + i}"
                    for i, g in enumerate(groups))


def read_event(popen: subprocess.Popen, event: str, timeout_s: float) -> dict | None:
    """The first JSON line `{"event": event, ...}` a child prints on its stdout (a pipe),
    or None if it exits or the deadline passes first."""
    sel = selectors.DefaultSelector()
    sel.register(popen.stdout, selectors.EVENT_READ)
    buf, deadline = b"", time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and popen.poll() is None:
            if not sel.select(0.2):
                continue
            chunk = os.read(popen.stdout.fileno(), 4096)
            if not chunk:
                return None
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict) and ev.get("event") == event:
                    return ev
        return None
    finally:
        sel.close()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    events: list[dict] = field(default_factory=list)
    _buf: bytes = b""

    def feed(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.events.append({"event": "text", "line": line.decode(errors="replace")})

    def find(self, event: str) -> dict | None:
        return next((e for e in self.events if e.get("event") == event), None)


class ProcGroup:
    """A set of child processes whose stdout is JSON lines; stderr goes to a file."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs: dict[str, Proc] = {}
        self.sel = selectors.DefaultSelector()

    def start(self, name: str, argv: list[str], env: dict | None = None) -> Proc:
        err = open(os.path.join(self.logdir, f"{name}.stderr"), "wb")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})})
        os.set_blocking(p.stdout.fileno(), False)
        proc = Proc(name, p)
        self.procs[name] = proc
        self.sel.register(p.stdout, selectors.EVENT_READ, proc)
        return proc

    def python(self, name: str, module: str, *args: str, env: dict | None = None) -> Proc:
        return self.start(name, [sys.executable, "-m", module, *args], env)

    def wait(self, predicate, timeout_s: float) -> bool:
        """Read output until predicate() holds or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in self.sel.select(min(left, 1.0)):
                proc: Proc = key.data
                try:
                    data = os.read(key.fileobj.fileno(), 65536)
                except BlockingIOError:
                    continue
                if data:
                    proc.feed(data)
                else:
                    self.sel.unregister(key.fileobj)
        return True

    def stderr(self, name: str) -> str:
        with open(os.path.join(self.logdir, f"{name}.stderr"), "rb") as f:
            return f.read().decode(errors="replace")[-3000:]

    def signal(self, name: str, sig=signal.SIGTERM) -> None:
        p = self.procs[name].popen
        if p.poll() is None:
            p.send_signal(sig)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        for name in self.procs:
            self.signal(name, signal.SIGTERM)
        self.wait(lambda: all(p.popen.poll() is not None for p in self.procs.values()),
                  timeout_s)
        for p in self.procs.values():
            if p.popen.poll() is None:
                p.popen.kill()
            p.popen.wait()
