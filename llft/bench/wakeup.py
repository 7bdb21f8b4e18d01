"""What a wake-up costs on this machine: the baseline `llft bench profile --marks` reads
its hops against, measured in the same run.

A plain asyncio process (no llft) echoes 1 KB UDP datagrams on loopback; its callback
compares its clock with the kernel's arrival stamp of each (SO_TIMESTAMPNS), as the
marks compare a loop's read with the stamp. This process sends them one at a time, each
after a short pause (so that CPUs go idle between, as they do between a lone client's
requests). Two arrangements:

- `any CPU`: the sender blocks in its read right after sending, and the scheduler may
  run the echo on the sender's CPU (what a plain client/forwarder chain gets);
- `other CPU`: the echo pinned to one CPU and the sender to another, so each datagram
  wakes an idle CPU (what a hop of llft's path pays when its sender keeps running after
  the send, as an agent finishing its loop turn does).

On the VM of docs/BENCHMARKS.md ("Where a lone request's time goes") the two differed 4-5
times (11-16 µs against 54-58).
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time

from llft.bench.report import summarize_us

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
ROUNDS = 1000
PAUSE_S = 0.0005                # between two round trips: the CPUs go idle
TIMEOUT_S = 30.0


def _echo(cpu: int | None) -> None:
    """The child: echo each datagram, note its wake-up; at b"stop" print them all."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    loop = asyncio.new_event_loop()
    waits: list[float] = []

    def readable() -> None:
        data, anc, _, addr = s.recvmsg(65536, 64)
        now = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if anc and data != b"stop":
            sec, nsec = struct.unpack("qq", anc[0][2][:16])
            waits.append((now - (sec * 1_000_000_000 + nsec)) / 1000)
        if data == b"stop":
            print(json.dumps({"waits_us": waits}), flush=True)
            loop.stop()
            return
        s.sendto(data, addr)

    loop.add_reader(s.fileno(), readable)
    print(json.dumps({"port": s.getsockname()[1]}), flush=True)
    loop.run_forever()


def measure(other_cpu: bool, rounds: int = ROUNDS) -> dict | None:
    """One arrangement: the echo's wake-ups summarized (report.summarize_us: "n",
    "median_us", "p90_us", ...), or None (fewer than two CPUs for `other_cpu`, or the
    echo did not answer)."""
    mine = os.sched_getaffinity(0)
    cpus = sorted(mine)
    if other_cpu and len(cpus) < 2:
        return None
    child_cpu = cpus[1] if other_cpu else None
    p = subprocess.Popen([sys.executable, "-m", "llft.bench.wakeup", "--echo",
                          str(child_cpu if child_cpu is not None else -1)],
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        port = json.loads(p.stdout.readline())["port"]
        if other_cpu:
            os.sched_setaffinity(0, {cpus[0]})      # this thread only
        c.settimeout(TIMEOUT_S)
        payload = b"x" * 1024
        for _ in range(rounds):
            c.sendto(payload, ("127.0.0.1", port))
            c.recv(65536)
            time.sleep(PAUSE_S)                     # the pause the arrangement needs
        c.sendto(b"stop", ("127.0.0.1", port))
        waits = json.loads(p.stdout.readline())["waits_us"]
        p.wait(timeout=TIMEOUT_S)
        return summarize_us(waits) if waits else None
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return None
    finally:
        os.sched_setaffinity(0, mine)
        c.close()
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--echo"]:
        cpu = int(sys.argv[2])
        _echo(cpu if cpu >= 0 else None)
