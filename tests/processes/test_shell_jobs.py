"""`llft run` typed at interactive shells, as a user starts replicas by hand.

Each replica is a job of its own `bash -i` on a pseudo-terminal, so the shell's job
control makes `llft run` a process-group leader, which may not setsid: it forks an agent
that leads a session of its own and stands in for it (application.py `own_session`).
Two replicas started together, counter clients through a gateway; the user kills the
primary's `llft run` with `kill -9` (the pid the shell shows), starts it again in the
same shell, and ends a backup with ^C at its shell. The clients see every reply once and
in order, the shells see the exit statuses a job would have (killed; 0 after ^C), no
agent leaves a boost on its shell's session, and nothing is left behind.

Default configuration; every wait is on a condition with a deadline.
"""
from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time

import psutil
import pytest

from llft import EXAMPLES_DIR
from llft.tools.cluster import LocalCluster
from test_run import Load, check_reply_log, competing_nice

COUNTER = f"{sys.executable} {os.path.join(EXAMPLES_DIR, 'kv_counter.py')} 9000"
BASH = "/bin/bash"


class Shell:
    """An interactive bash on a pseudo-terminal (job control on)."""

    def __init__(self):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(BASH, [BASH, "--norc", "--noprofile", "-i"])
        self.out = ""

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode())

    def wait_output(self, text: str, timeout_s: float = 30) -> None:
        """Until `text` appears in what the terminal printed since the last wait."""
        deadline = time.monotonic() + timeout_s
        while text not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"the shell did not print {text!r}; it printed {self.out[-500:]!r}"
            r, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if r:
                try:
                    self.out += os.read(self.fd, 65536).decode(errors="replace")
                except OSError:
                    break
        self.out = self.out[self.out.index(text) + len(text):]

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        os.close(self.fd)


def _ppid(pid: int) -> int:
    return psutil.Process(pid).ppid()


@pytest.mark.skipif(not os.path.exists(BASH), reason="needs bash")
def test_replicas_typed_at_shells_fail_over_rejoin_and_stop(tmp_path):
    lc = LocalCluster(str(tmp_path))
    shells = [Shell() for _ in range(2)]
    procs: list[psutil.Process] = []
    try:
        for s in shells:
            s.type("echo $((6 * 7))\n")
            s.wait_output("42")                 # bash's answer (the terminal echoes the line
            # as typed, before bash has even started: its session not made yet)
        nices = [competing_nice(s.pid) for s in shells]
        run = (f"{sys.executable} -m llft run --config {lc.config_path} --group {lc.group} "
               f"-- {COUNTER} 2>>{tmp_path}/%s.log; echo exit=$?\n")
        for i, s in enumerate(shells):          # together, as users do
            s.type(run % f"r{i}")

        def members(n):
            return lc.wait_status(lambda st: len(st["members"]) == n and all(
                m["app_pid"] and m["app_mode"] in ("primary", "backup") for m in st["members"]),
                60, f"{n} members with running applications")
        st = members(2)
        for m in st["members"]:
            agent = m["agent_pid"]
            job = _ppid(agent)
            assert _ppid(job) in [s.pid for s in shells], "the agent's parent is the shell's job"
            assert os.getsid(agent) == agent and os.getpgid(job) == job
            procs += [psutil.Process(job), *psutil.Process(job).children(recursive=True)]
        load = Load(lc)
        load.wait_delivered(5_000)

        # kill -9 of the primary's `llft run` (the job): its agent dies with it
        primary = lc.primary()
        job = _ppid(primary["agent_pid"])
        shell = next(s for s in shells if s.pid == _ppid(job))
        os.kill(job, signal.SIGKILL)
        shell.wait_output("exit=137")
        lc.wait_status(lambda st: len(st["members"]) == 1 and st["members"][0]["birth"]
                       != primary["birth"], 30, "the backup took over")
        load.wait_delivered(5_000)

        # started again in the same shell: it rejoins as a backup
        shell.type(run % "again")
        st = members(2)
        backup = next(m for m in st["members"] if m["role"] != "primary")
        procs += [psutil.Process(_ppid(backup["agent_pid"])),
                  *psutil.Process(_ppid(backup["agent_pid"])).children(recursive=True)]
        load.wait_delivered(5_000)

        # ^C at the backup's shell: the agent leaves (status 0), the primary goes on
        bshell = next(s for s in shells if s.pid == _ppid(_ppid(backup["agent_pid"])))
        bshell.type("\x03")
        bshell.wait_output("exit=0")
        lc.wait_status(lambda st: len(st["members"]) == 1, 30, "the backup left")
        load.wait_delivered(5_000)
        r = load.finish()
        check_reply_log(r, at_least=500)

        for s, nice in zip(shells, nices):
            assert competing_nice(s.pid) == nice, "the agents' boost reached the shell's session"
        for s in shells:
            s.type("\x03")                      # the last replica (and nothing elsewhere)
        psutil.wait_procs(procs, timeout=15)
        left = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [(p.pid, p.cmdline()) for p in left]
    finally:
        lc.stop()
        for s in shells:
            s.close()
