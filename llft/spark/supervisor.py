"""How Spark users protect a driver today: a supervisor that restarts it when it dies,
and the driver's own checkpoint to resume from (the baseline `llft bench spark`
compares llft with).

    python -m llft.spark.supervisor [--log FILE] -- CMD ARGS...

`Supervisor` is `spark-submit --supervise` / systemd `Restart=always` in a few lines:
it starts the command (in its own process group), waits for it, and starts it again at
once whenever it exits, until stopped. It knows nothing about the program; recovery is
the program's business (examples/nexmark_pipeline.py `--checkpoint DIR` resumes from
its last checkpoint and asks the source to replay from the checkpointed offset; results
emitted after that checkpoint are emitted again: at-least-once).

`supervised(workdir, wl, kill_after=[k, ...])` runs the Nexmark pipeline that way on a
fixed port, the generator and sink of llft.spark.sparkrun connected straight to it (they
reconnect when the driver restarts), and SIGKILLs the driver's Python process once the
sink holds each k windows. Its JVM is not killed: PySpark's gateway JVM exits when its
stdin (a pipe from the driver) reaches EOF, which is also what happens to a replica's
JVM under `llft run` (the driver gets SIGKILL through PR_SET_PDEATHSIG when its agent
dies); each kill records when that JVM was gone (`jvm_gone_ms`), and stop() kills any
process group left behind.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from llft.runtime import proctree
from llft.spark import sparkrun
from llft.tools.procs import free_port


@dataclass
class Life:
    """One start of the supervised command."""
    pid: int
    started: float                 # time.monotonic()
    exited: float | None = None
    code: int | None = None


class Supervisor:
    """Restart=always for one command. `lives` lists every start, oldest first."""

    def __init__(self, argv: list[str], cwd: str | None = None, log_path: str | None = None,
                 restart_delay_s: float = 0.0, on_event=None):
        self.argv, self.cwd, self.log_path = argv, cwd, log_path
        self.restart_delay_s = restart_delay_s
        self.say = on_event or (lambda _text: None)
        self.lives: list[Life] = []
        self._procs: list[subprocess.Popen] = []
        self._stopping = threading.Event()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    # ---- running -----------------------------------------------------------------------
    def start(self) -> "Supervisor":
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._thread.start()
        self.wait_lives(1, 30)
        return self

    def _spawn(self) -> subprocess.Popen:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            # its own process group: stop() can take the driver's JVM along
            p = subprocess.Popen(self.argv, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=log, start_new_session=True)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        with self._lock:
            self._procs.append(p)
            self.lives.append(Life(p.pid, time.monotonic()))
            self._lock.notify_all()
        return p

    def _loop(self) -> None:
        while not self._stopping.is_set():
            p = self._spawn()
            self.say(f"supervisor: started pid {p.pid} (start {len(self.lives)})")
            code = p.wait()
            with self._lock:
                life = self.lives[-1]
                life.exited, life.code = time.monotonic(), code
                self._lock.notify_all()
            if self._stopping.is_set():
                break
            self.say(f"supervisor: pid {p.pid} exited with {code}; restarting")
            if self.restart_delay_s and self._stopping.wait(self.restart_delay_s):
                break

    # ---- observing ---------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        with self._lock:
            return self.lives[-1].pid if self.lives else None

    def wait_lives(self, n: int, timeout_s: float) -> bool:
        """Wait until the command has been started n times."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while len(self.lives) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    # ---- stopping ----------------------------------------------------------------------
    def stop(self, timeout_s: float = 20) -> None:
        self._stopping.set()
        with self._lock:
            procs = list(self._procs)
        for p in procs:                      # the live one, and any group left behind
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.pid, signal.SIGKILL)
            if p.poll() is None:
                p.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ---- process helpers -------------------------------------------------------------------
def alive(pid: int) -> bool:
    return proctree.running(pid) is not None        # (a zombie is gone)


def wait_gone(pids: list[int], timeout_s: float, poll_s: float = 0.01) -> float | None:
    """Poll until none of pids is alive (a zombie counts as gone); the monotonic time it
    happened, or None at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not any(alive(p) for p in pids):
            return time.monotonic()
        if time.monotonic() > deadline:
            return None
        time.sleep(poll_s)


# ---- the Nexmark pipeline under a supervisor ----------------------------------------------
def supervised(workdir: str, wl: sparkrun.Workload, kill_after: list[int] = (),
               timeout_s: float = 900, on_event=None, wrap=None) -> sparkrun.Result:
    """The pipeline with `--checkpoint <workdir>/checkpoint` on a fixed port under a
    Supervisor; generator and sink connect to it directly. For each k of `kill_after`,
    once the sink holds k windows the driver's Python process is SIGKILLed and the
    supervisor restarts it. Per kill: t_kill, restarted_ms (new driver process started),
    jvm_gone_ms (the killed driver's JVM exited, None if it outlived 30 s),
    next_result_ms (first result line of any kind after the kill, repeats included) and
    windows_before. wrap(argv) -> argv: e.g. a taskset prefix for the driver."""
    say = on_event or (lambda _text: None)
    os.makedirs(workdir, exist_ok=True)
    t0 = time.monotonic()
    port = free_port()
    ckpt = os.path.join(workdir, "checkpoint")
    argv = sparkrun.pipeline_argv(port, wl, checkpoint=ckpt)
    sup = Supervisor(wrap(argv) if wrap else argv, cwd=workdir,
                     log_path=os.path.join(workdir, "supervised.log"), on_event=say).start()
    st = None
    try:
        st = sparkrun.Streams.start(("127.0.0.1", port), wl, keep_serving=True)
        res = sparkrun.Result(st)
        deadline = t0 + timeout_s

        def kill(k: int) -> tuple[float, dict]:
            pid, lives = sup.pid, len(sup.lives)
            jvm = proctree.descendant_pids(pid)     # its gateway JVM
            os.kill(pid, signal.SIGKILL)
            t_kill = time.monotonic()
            say(f"SIGKILL driver pid {pid} after window {k - 1} (its JVM: {jvm})")
            if not sup.wait_lives(lives + 1, 30):
                raise sparkrun.RunError("the supervisor did not restart the driver")
            t_restart = sup.lives[-1].started
            t_gone = wait_gone(jvm, 30)
            return t_kill, {"killed": pid, "jvm": jvm,
                            "restarted_ms": 1000 * (t_restart - t_kill),
                            "jvm_gone_ms": 1000 * (t_gone - t_kill) if t_gone else None}

        res.kills = sparkrun.kill_at_windows(st, kill_after, kill, deadline, say,
                                             lambda: _tail(sup.log_path))
        if not st.wait_end(max(1, deadline - time.monotonic())):
            raise sparkrun.RunError(f"no end line ({len(st.sink.windows)} windows): "
                                    f"{st.sink.error} {st.gen.stats} {_tail(sup.log_path)}")
        res.status = {"lives": [vars(x) for x in sup.lives]}
        res.elapsed_s = time.monotonic() - t0
        return res
    finally:
        if st is not None:
            st.stop()
        sup.stop()


def _tail(path: str | None, n: int = 800) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")
    except (OSError, TypeError):
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llft.spark.supervisor",
                                description="restart a command whenever it exits")
    p.add_argument("--log", help="append the command's output here")
    p.add_argument("--restart-delay", type=float, default=0.0, help="seconds (default 0)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("no command")
    sup = Supervisor(cmd, log_path=a.log, restart_delay_s=a.restart_delay,
                     on_event=lambda t: print(t, file=sys.stderr, flush=True))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sup.start()
    stop.wait()
    sup.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
