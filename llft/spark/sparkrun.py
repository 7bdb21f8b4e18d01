"""Running the Nexmark pipeline (examples/nexmark_pipeline.py) end to end: an
unreplicated reference run, and a replicated run under `llft run` with primary kills.

`llft demo spark`, `llft bench spark` and tests/spark/test_spark_pipeline.py all go through
here, so they measure exactly the same thing:

    wl = Workload(events=3000)
    ref = reference(workdir, wl)                          # plain python, one JVM
    rep = replicated(workdir, wl, replicas=2, kill_after=[2])
    assert rep.sink.received_bytes() == ref.sink.received_bytes()

Kills are placed by progress, not time: `kill_after=[k, ...]` SIGKILLs the current
primary's agent (its driver and JVM die with it) once the sink holds k windows.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from llft import EXAMPLES_DIR
from llft.spark import nexmark
from llft.tools.cluster import LocalCluster
from llft.tools.procs import free_port

PIPELINE = os.path.join(EXAMPLES_DIR, "nexmark_pipeline.py")


@dataclass
class Workload:
    events: int = 3000
    seed: int = 7
    rate: float = 600.0          # events/s sent by the generator (0 = unpaced)
    window_ms: int = 500         # event time: 1 ms per event, so 500 events per window
    batch_events: int = 250
    batch_ms: int = 200

    @property
    def windows(self) -> int:
        return -(-self.events // self.window_ms)


def pipeline_argv(port: int, wl: Workload, checkpoint: str | None = None,
                  remote: str | None = None) -> list[str]:
    """remote: a Spark Connect server's URL (the driver as its thin client)."""
    argv = [sys.executable, PIPELINE, "--port", str(port), "--window-ms", str(wl.window_ms),
            "--batch-events", str(wl.batch_events), "--batch-ms", str(wl.batch_ms)]
    return (argv + (["--checkpoint", checkpoint] if checkpoint else [])
            + (["--remote", remote] if remote else []))


@dataclass
class Streams:
    """A generator and a sink running against one address, in threads."""
    sink: nexmark.Sink
    gen: nexmark.Generator
    threads: list = field(default_factory=list)

    @classmethod
    def start(cls, addr: tuple[str, int], wl: Workload, connect_timeout_s: float = 180,
              keep_serving: bool = False) -> "Streams":
        """keep_serving: the generator also serves a driver that reconnects after the
        whole stream was sent (a restarted driver; see nexmark.Generator)."""
        st = cls(nexmark.Sink(addr, connect_timeout_s),
                 nexmark.Generator(addr, nexmark.generate(wl.seed, wl.events), wl.rate,
                                   connect_timeout_s, keep_serving=keep_serving))
        for target in (st.sink.run, st.gen.run):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            st.threads.append(t)
        return st

    def wait_windows(self, n: int, timeout_s: float) -> bool:
        return self.sink.wait(lambda k: len(k.windows) >= n, timeout_s)

    def wait_end(self, timeout_s: float) -> bool:
        return self.sink.wait(lambda k: k.end is not None, timeout_s)

    def next_arrival_after(self, t: float) -> float | None:
        with self.sink.lock:
            return next((a for a in self.sink.arrivals if a > t), None)

    def stop(self) -> None:
        self.sink.stop.set()
        self.gen.stop.set()
        for t in self.threads:
            t.join(timeout=5)

    def span_s(self) -> float | None:
        """First event sent -> the end line at the sink (None before both)."""
        if self.sink.end_t is None or self.gen.first_send_t is None:
            return None
        return self.sink.end_t - self.gen.first_send_t

    def throughput(self) -> float:
        """Input events per second from the first event sent to the end line."""
        span = self.span_s()
        return float("nan") if span is None else self.sink.end.get("events", 0) / max(1e-9, span)


class RunError(RuntimeError):
    pass


def kill_at_windows(st: Streams, kill_after, kill, deadline: float, say, log_tail) -> list[dict]:
    """For each k of kill_after: once the sink holds k windows, kill(k) -> (t_kill, record)
    kills the driver its own way; then wait for the next window. Each record gets t_kill,
    next_result_ms (first result line of any kind after the kill, repeats included) and
    windows_before. log_tail() says why, if the sink never gets there."""
    kills = []
    for k in kill_after:
        if not st.wait_windows(k, max(1, deadline - time.monotonic())):
            raise RunError(f"sink did not reach {k} windows: {st.sink.error} {log_tail()}")
        t_kill, rec = kill(k)
        st.wait_windows(len(st.sink.windows) + 1, max(1, deadline - time.monotonic()))
        t_next = st.next_arrival_after(t_kill)
        rec.update(t_kill=t_kill, windows_before=k,
                   next_result_ms=1000 * (t_next - t_kill) if t_next else None)
        kills.append(rec)
        if t_next:
            say(f"next result at the sink {1000 * (t_next - t_kill):.0f} ms after the kill")
    return kills


@dataclass
class Result:
    streams: Streams
    kills: list[dict] = field(default_factory=list)   # per kill: times and who
    status: dict = field(default_factory=dict)         # `llft status` at the end
    elapsed_s: float = 0.0

    @property
    def sink(self) -> nexmark.Sink:
        return self.streams.sink


def reference(workdir: str, wl: Workload, timeout_s: float = 600,
              remote: str | None = None, name: str = "reference", wrap=None) -> Result:
    """The unreplicated run: plain python, no shim, no llft (against `remote`, a Spark
    Connect server, if given). wrap(argv) -> argv: e.g. a taskset prefix."""
    os.makedirs(workdir, exist_ok=True)
    port = free_port()
    log = open(os.path.join(workdir, f"{name}.log"), "wb")
    argv = pipeline_argv(port, wl, remote=remote)
    p = subprocess.Popen(wrap(argv) if wrap else argv, cwd=workdir, stdout=log, stderr=log,
                         stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    st = Streams.start(("127.0.0.1", port), wl)
    try:
        if not st.wait_end(timeout_s):
            raise RunError(f"reference run: no end line in {timeout_s} s "
                           f"({len(st.sink.windows)} windows; {st.sink.error or st.gen.stats.error})")
        return Result(st, elapsed_s=time.monotonic() - t0)
    finally:
        st.stop()
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


def replicated(workdir: str, wl: Workload, replicas: int = 2, kill_after: list[int] = (),
               fault_timeout_ms: float | None = None, timeout_s: float = 600, on_event=None,
               group: str = "nexmark", restart: bool = False, remote: str | None = None,
               wrap=None) -> Result:
    """`replicas` x `llft run` of the pipeline, started in the same instant (as users
    do), a gateway, the generator and the sink through it; the primary is SIGKILLed once
    the sink holds each of `kill_after` windows. With `restart`, each killed replica is
    started again and rejoins (replaying the group's history) before the next kill:
    kill -> restart/rejoin -> kill. on_event(text) reports progress (the demo prints it).
    remote: the drivers are thin clients of that Spark Connect server. wrap(i, argv) ->
    argv for the i-th replica started (0-based): e.g. a taskset prefix."""
    say = on_event or (lambda _text: None)
    t0 = time.monotonic()
    port = free_port()
    lc = LocalCluster(workdir, group=group, service_port=port,
                      # None: the configuration's default detector (what tests use)
                      extra_cluster="" if fault_timeout_ms is None
                      else f"fault_timeout_ms = {fault_timeout_ms:g}")
    st = None
    try:
        app = pipeline_argv(port, wl, remote=remote)

        def start(i: int) -> None:
            lc.start_replica(f"r{i + 1}", app,
                             wrap=(lambda argv: wrap(i, argv)) if wrap else (lambda argv: argv))
        for i in range(replicas):
            start(i)
        st0 = lc.wait_members(replicas, timeout_s=300)
        say(f"{replicas} replicas started together formed view {st0['view']}")
        started = replicas          # replicas started so far (names r1, r2, ...)
        host, gport = lc.start_gateway()
        say(f"gateway on {host}:{gport}; generator ({wl.events} events at {wl.rate:g}/s) "
            f"and sink connected through it")
        st = Streams.start((host, gport), wl)
        res = Result(st)
        deadline = t0 + timeout_s

        def kill(k: int) -> tuple[float, dict]:
            old = lc.kill_primary()
            t_kill = time.monotonic()
            say(f"SIGKILL primary {old['name']} (agent {old['agent_pid']}) after window {k - 1}")
            new = lc.wait_primary(other_than=old["birth"], timeout_s=120)
            t_prom = time.monotonic()
            name = lc.name_of(new["agent_pid"])
            say(f"{name} promoted {1000 * (t_prom - t_kill):.0f} ms after the kill")
            rec = {"killed": old["name"], "new_primary": name,
                   "promoted_ms": 1000 * (t_prom - t_kill)}
            if restart:
                nonlocal started
                start(started)
                started += 1
                lc.wait_members(replicas, timeout_s=max(1, deadline - time.monotonic()))
                rec["rejoined_s"] = time.monotonic() - t_prom
                say(f"r{started} started and rejoined in {rec['rejoined_s']:.1f} s")
            return t_kill, rec

        res.kills = kill_at_windows(st, kill_after, kill, deadline, say,
                                    lambda: lc.log_tail("r1", 800))
        if not st.wait_end(max(1, deadline - time.monotonic())):
            raise RunError(f"no end line ({len(st.sink.windows)} windows): {st.sink.error} "
                           f"{st.gen.stats}")
        res.status = lc.status()
        res.elapsed_s = time.monotonic() - t0
        return res
    finally:
        if st is not None:
            st.stop()
        lc.stop()
