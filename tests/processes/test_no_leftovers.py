"""`llft run` leaves no process behind: the application's whole tree dies with it.

The application (tests/processes/tree_app.py) starts `sleep 1000` as its child and a
daemon that leaves its session and is orphaned at once (`setsid sleep 1001`, reparented
to the agent, a child subreaper). Each test reads the tree (every descendant of the
agent: the app, both sleeps, the agent's watchdog), ends it one way, and checks, with a
bounded wait, that no process of it remains (a zombie counts as gone: it no longer
runs):

  SIGTERM of the agent      the agent kills the tree, then exits
  SIGKILL of the agent      no code of the agent runs: the app dies by PR_SET_PDEATHSIG,
                            the rest by the watchdog (the escaped daemon once the agent
                            has named it to the watchdog: `escapees_watched`)
  the app exits by itself   the agent stops and kills what the app left
  a reset                   a backup frozen (SIGSTOP) until the primary removed it, then
                            thawed: it learns it was removed, resets, and the old app's
                            tree dies while the replica rejoins with a new one

and that no temporary file is left either: each run of the app has a private temporary
folder (its TMPDIR, Spark's local dirs, the JVM's java.io.tmpdir), where the app leaves a
`blockmgr-*` folder as a killed Spark driver's JVM does; it is removed with the tree (by
the watchdog when the agent was SIGKILLed). The agents run with a TMPDIR of the test's
own, so the count is exact.

Default configuration; every wait is on a condition with a deadline.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from determinizer.shm import Shm
from llft.runtime.application import PRIVATE_TMP_PREFIX
from llft.tools.cluster import LocalCluster
from polling import wait_for
from test_run import competing_nice

TREE_APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tree_app.py")
POLL_S = 0.02


def app_cmd(*extra: str) -> list[str]:
    return [sys.executable, TREE_APP, "9000", *extra]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tree(agent_pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(agent_pid).children(recursive=True) if _running(p)]
    except psutil.Error:
        return []


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return "?"


def full_tree(agent_pid: int, timeout_s: float = 60) -> list[psutil.Process]:
    """The agent's descendants once the app has started both sleeps."""
    def ready():
        t = tree(agent_pid)
        lines = [cmdline(p) for p in t]
        return t if ("sleep 1000" in lines and "sleep 1001" in lines
                     and any("llft.runtime.proctree" in s for s in lines)) else None
    return wait_for(ready, f"the app's tree under agent {agent_pid}", timeout_s, POLL_S)


def cluster(tmp_path) -> LocalCluster:
    """A cluster whose processes have the test's own TMPDIR (`tmp_path/tmp`)."""
    (tmp_path / "tmp").mkdir()
    return LocalCluster(str(tmp_path), env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")))


def app_tmp_folders(tmp_path) -> list[str]:
    """The private temporary folders of app runs, each with what the app left in it."""
    base = tmp_path / "tmp"
    return sorted(f"{d.name}/{'+'.join(sorted(x.name.split('-')[0] for x in d.iterdir()))}"
                  for d in base.iterdir() if d.name.startswith(PRIVATE_TMP_PREFIX))


def wait_app_tmp(tmp_path, n: int) -> None:
    """`n` runs' folders, each holding the app's `blockmgr-*` (the app used its own)."""
    wait_for(lambda: len(app_tmp_folders(tmp_path)) == n and all(
        f.endswith("/blockmgr") for f in app_tmp_folders(tmp_path)),
        f"{n} private temporary folders with the app's files", 30, POLL_S)


def assert_no_tmp_left(tmp_path, timeout_s: float = 15) -> None:
    """Nothing of any app run is left in the test's TMPDIR (the watchdog removes the
    folders after its kill: a bounded wait)."""
    base = tmp_path / "tmp"
    deadline = time.monotonic() + timeout_s
    while any(base.iterdir()):
        if time.monotonic() > deadline:
            raise AssertionError(f"left in TMPDIR: {sorted(x.name for x in base.iterdir())}")
        time.sleep(POLL_S)


def assert_all_gone(procs: list[psutil.Process], timeout_s: float = 15) -> None:
    def gone():
        return not any(_running(p) for p in procs)
    deadline = time.monotonic() + timeout_s
    while not gone():
        if time.monotonic() > deadline:
            left = [(p.pid, cmdline(p), p.status()) for p in procs if _running(p)]
            for p in procs:                      # do not leave them to the next test
                try:
                    p.kill()
                except psutil.Error:
                    pass
            raise AssertionError(f"processes left behind: {left}")
        time.sleep(POLL_S)


def shm_files(agent_pid: int) -> list[str]:
    """The shared-memory files an agent made for its apps' shims."""
    return Shm.paths_of(agent_pid)


def assert_no_shm_left(agent_pid: int, timeout_s: float = 15) -> None:
    wait_for(lambda: not shm_files(agent_pid),
             f"no /dev/shm/llft-{agent_pid}-* file left", timeout_s, POLL_S)


def test_sigterm_of_the_agent_leaves_no_process(tmp_path):
    with cluster(tmp_path) as lc:
        agent = lc.start_replica("r1", app_cmd())
        lc.wait_members(1)
        procs = full_tree(agent.pid)
        wait_app_tmp(tmp_path, 1)
        assert len(shm_files(agent.pid)) == 1
        lc.kill("r1", signal.SIGTERM)
        assert agent.returncode == 0, lc.log_tail("r1")
        assert_all_gone(procs)
        assert_no_tmp_left(tmp_path)
        assert_no_shm_left(agent.pid)


def test_sigkill_of_the_agent_leaves_no_process(tmp_path):
    with cluster(tmp_path) as lc:
        agent = lc.start_replica("r1", app_cmd())
        lc.wait_members(1)
        procs = full_tree(agent.pid)
        wait_app_tmp(tmp_path, 1)
        # the daemon left the app's session: the watchdog kills it by pid once told
        lc.wait_status(lambda st: st["members"] and st["members"][0]["counters"].get(
            "escapees_watched", 0) >= 1, 30, "the escaped daemon named to the watchdog")
        assert len(shm_files(agent.pid)) == 1
        lc.kill("r1", signal.SIGKILL)
        assert_all_gone(procs)
        assert_no_tmp_left(tmp_path)
        assert_no_shm_left(agent.pid)       # the watchdog unlinks it too


def test_app_exit_leaves_no_process(tmp_path):
    trigger = tmp_path / "exit-now"
    with cluster(tmp_path) as lc:
        agent = lc.start_replica("r1", app_cmd(str(trigger)))
        lc.wait_members(1)
        procs = full_tree(agent.pid)
        wait_app_tmp(tmp_path, 1)
        trigger.write_text("")
        assert agent.wait(timeout=30) == 0, lc.log_tail("r1")
        assert_all_gone(procs)
        assert_no_tmp_left(tmp_path)


def test_reset_kills_the_old_tree(tmp_path):
    with cluster(tmp_path) as lc:
        r1 = lc.start_replica("r1", app_cmd())
        lc.wait_members(1)
        r2 = lc.start_replica("r2", app_cmd())
        st = lc.wait_members(2)
        wait_app_tmp(tmp_path, 2)
        old_tmp = set(app_tmp_folders(tmp_path))
        old_birth = next(m["birth"] for m in st["members"] if m["agent_pid"] == r2.pid)
        old = [p for p in full_tree(r2.pid) if "llft.runtime.proctree" not in cmdline(p)]
        watchdog = [p for p in tree(r2.pid) if "llft.runtime.proctree" in cmdline(p)]
        os.kill(r2.pid, signal.SIGSTOP)           # r2's agent falls silent
        try:
            lc.wait_status(lambda st: [m["birth"] for m in st["members"]]
                           and old_birth not in [m["birth"] for m in st["members"]],
                           30, "the primary removed the silent backup")
        finally:
            os.kill(r2.pid, signal.SIGCONT)
        # thawed, r2 learns it was removed: a reset kills its app's tree ...
        assert_all_gone(old)
        # ... and it rejoins under a new birth id with a new application, in a new
        # temporary folder (the old run's is gone, r1's stays)
        st = lc.wait_status(lambda st: len(st["members"]) == 2 and all(
            m["app_pid"] and m["app_mode"] in ("primary", "backup") for m in st["members"]),
            60, "the reset replica rejoined with a running application")
        wait_app_tmp(tmp_path, 2)
        assert len(old_tmp & set(app_tmp_folders(tmp_path))) == 1
        new = next(m for m in st["members"] if m["agent_pid"] == r2.pid)
        assert new["birth"] != old_birth
        assert psutil.pid_exists(new["app_pid"])
        assert all(_running(p) for p in watchdog)  # one watchdog per agent, for its life
        assert "reset (" in lc.log_tail("r2", 100_000)
        procs = full_tree(r2.pid) + full_tree(r1.pid)
        lc.kill("r2", signal.SIGTERM)
        lc.kill("r1", signal.SIGTERM)
        assert_all_gone(procs)
        assert_no_tmp_left(tmp_path)


# `llft run` typed at an interactive shell: the shell makes each job a process group of
# its own, so `llft run` leads its group (and may not setsid). Here: the same exec.
SHELL_JOB = [sys.executable, "-c",
             "import os, sys; os.setpgid(0, 0); os.execvp(sys.argv[1], sys.argv[1:])"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_shell_jobs_agent_has_a_session_of_its_own_and_dies_with_the_job(tmp_path, sig):
    """A process-group leader cannot setsid, so `llft run` forks (application.py
    `own_session`): the agent, its child, leads a session of its own and the CPU boost
    it gives that session leaves the shell's session (here: the test's) as it was; the
    job stands in for the agent: SIGTERM reaches the agent (exit status 0, as without
    the fork), SIGKILL of the job kills the agent (PR_SET_PDEATHSIG), and in both cases
    the whole tree goes."""
    ours = competing_nice(os.getpid())
    with cluster(tmp_path) as lc:
        job = lc.start_replica("r1", app_cmd(), wrap=lambda argv: SHELL_JOB + argv)
        agent = lc.wait_members(1)["members"][0]["agent_pid"]
        assert agent != job.pid and psutil.Process(agent).ppid() == job.pid
        assert os.getsid(agent) == agent, "the agent leads a session of its own"
        assert os.getsid(job.pid) == os.getsid(0) and os.getpgid(job.pid) == job.pid
        assert competing_nice(os.getpid()) == ours, "the shell's session kept its nice"
        procs = full_tree(job.pid)
        assert any(p.pid == agent for p in procs)
        wait_app_tmp(tmp_path, 1)
        if sig == signal.SIGKILL:
            lc.wait_status(lambda st: st["members"] and st["members"][0]["counters"].get(
                "escapees_watched", 0) >= 1, 30, "the escaped daemon named to the watchdog")
        lc.kill("r1", sig)
        assert job.returncode == (0 if sig == signal.SIGTERM else -signal.SIGKILL), \
            lc.log_tail("r1")
        assert_all_gone(procs)
        assert_no_tmp_left(tmp_path)
        assert_no_shm_left(agent)
