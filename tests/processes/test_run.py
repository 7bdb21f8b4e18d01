"""`llft run` end to end: replicated unmodified services on loopback, primaries SIGKILLed.

Real processes everywhere: agents (`llft run`) with the preload shim in the example
service, the gateway (`llft gateway`), TCP clients (llft.tools.loadclient). The clients check
every reply (exactly once, in order, per-key counters consecutive, global counters never
repeated, clocks never backwards); the test checks membership and divergence through
`llft status`'s reading of the status files.
"""
from __future__ import annotations

import os
import sys
import threading


from llft import EXAMPLES_DIR
from llft.tools.cluster import LocalCluster
from llft.tools.loadclient import run_load

EXAMPLES = EXAMPLES_DIR
COUNTER = [sys.executable, os.path.join(EXAMPLES, "kv_counter.py"), "9000"]


class Load:
    """4 counter clients through a new gateway, in a thread, sending until `finish()`:
    the load outlasts every step of the test however long the steps take (a fixed
    request count raced them: on a busy machine the clients were done before a rejoined
    replica had caught up, and the kill meant for the load then found none)."""

    def __init__(self, lc: LocalCluster):
        host, port = lc.start_gateway()
        self.lc, self.stop, self.result = lc, threading.Event(), {}
        self.thread = threading.Thread(target=lambda: self.result.setdefault(
            "r", run_load(host, port, clients=4, requests=10 ** 9, mode="counter",
                          timeout_s=60, stop=self.stop)), daemon=True)
        self.thread.start()

    def wait_delivered(self, more_bytes: int) -> None:
        """Until the primary has delivered `more_bytes` request bytes beyond what it had
        when called (the primary of that moment, or the one that replaces it)."""
        target = self.lc.primary_delivered_bytes() + more_bytes
        self.lc.wait_status(lambda st: (self.lc.primary_delivered_bytes() >= target
                                        or not self.thread.is_alive()),
                            120, f"{more_bytes} more request bytes delivered at the primary")
        assert self.thread.is_alive(), f"the load ended early: {self.result}"

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=300)
        assert not self.thread.is_alive(), "load did not finish"
        return self.result["r"]


STEP_BYTES = 20_000         # ~800 counter requests
REQUEST_BYTES_MAX = 40      # "INCR <key>\n": a step of N bytes is > N / 40 requests


def run_with_kills(lc: LocalCluster, kills: int, step_bytes: int = STEP_BYTES):
    """Load through the gateway; SIGKILL the primary each time it has delivered the next
    `step_bytes` of requests, and let the last new primary serve another step."""
    load = Load(lc)
    killed = []
    for _ in range(kills):
        load.wait_delivered(step_bytes)
        old = lc.kill_primary()
        killed.append(old)
        lc.wait_primary(other_than=old["birth"])
    load.wait_delivered(step_bytes)
    return load.finish(), killed


def check_reply_log(r, at_least: int) -> None:
    assert r.ok, r.errors
    assert r.replies == r.requests >= at_least
    assert r.global_repeats == 0


def no_divergence(lc: LocalCluster) -> None:
    st = lc.status()
    assert st["departed"] == [], st["departed"]
    for m in st["members"]:
        assert m["diverged"] is None, m


def test_three_replicas_two_primary_kills(tmp_path, soak):
    step = 2 * STEP_BYTES if soak == "off" else 4 * STEP_BYTES
    with LocalCluster(str(tmp_path)) as lc:
        for name in ("r1", "r2", "r3"):
            lc.start_replica(name, COUNTER)
            lc.wait_members(int(name[1]))
        r, killed = run_with_kills(lc, 2, step)
        check_reply_log(r, 3 * step // REQUEST_BYTES_MAX)
        st = lc.wait_members(1)
        no_divergence(lc)
        assert len(killed) == 2 and st["view"] >= 3


def test_two_replicas_kill_and_rejoin_then_takeover(tmp_path):
    """A killed replica restarted with `llft run` rejoins as a backup, catches up (replays
    the group's log), then takes over when the current primary is killed."""
    with LocalCluster(str(tmp_path)) as lc:
        lc.start_replica("r1", COUNTER)
        lc.wait_members(1)
        lc.start_replica("r2", COUNTER)
        lc.wait_members(2)
        load = Load(lc)
        load.wait_delivered(STEP_BYTES // 4)
        old = lc.kill_primary()
        lc.wait_primary(other_than=old["birth"])
        lc.start_replica(old["name"] + "b", COUNTER)
        lc.wait_members(2)
        load.wait_delivered(STEP_BYTES // 4)
        old2 = lc.kill_primary()
        new = lc.wait_primary(other_than=old2["birth"])
        assert new["agent_pid"] == lc.procs[old["name"] + "b"].pid   # the rejoined one
        load.wait_delivered(STEP_BYTES // 4)
        r = load.finish()
        check_reply_log(r, 3 * (STEP_BYTES // 4) // REQUEST_BYTES_MAX)
        no_divergence(lc)


def competing_nice(pid: int) -> tuple[str, int] | None:
    """The scheduling entity `pid` competes with at the top level, and its nice. In an
    autogroup of its own session ("/autogroup-N nice K") that is the autogroup, weighted
    by K. Where the file is empty (newer kernels print nothing for the default autogroup,
    and a setsid whose group could not be created leaves the process there) the process
    competes as itself in the root group, weighted by its own nice. None if it is gone."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            fields = f.read().split()
        if len(fields) == 3:
            return fields[0], int(fields[2])
        return "root", os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


def test_agents_outrank_their_applications_sessions(tmp_path):
    """With autogroup scheduling the CPU is shared between sessions first: the agent's
    session gets AGENT_NICE as the primary and BACKUP_NICE as a backup, each application
    (its own session) keeps 0, so a busy application (a Spark JVM) cannot starve its
    agent's heartbeats. Whatever the arrangement the kernel made (both in autogroups, or
    one of them in the root group), the entity the agent competes as outranks the
    application's. A backup that takes over gets the primary's nice."""
    import pytest
    from llft.runtime.application import AGENT_NICE, BACKUP_NICE
    if os.geteuid() != 0 or not os.path.exists(f"/proc/{os.getpid()}/autogroup"):
        pytest.skip("needs root and a kernel with autogroup scheduling")
    ours = competing_nice(os.getpid())
    with LocalCluster(str(tmp_path)) as lc:
        lc.start_replica("r1", COUNTER)
        lc.wait_members(1)
        lc.start_replica("r2", COUNTER)
        st = lc.wait_members(2)
        for m in st["members"]:
            agent, app = competing_nice(m["agent_pid"]), competing_nice(m["app_pid"])
            assert agent is not None and app is not None
            want = AGENT_NICE if m["role"] == "primary" else BACKUP_NICE
            assert agent[1] == want, (m["role"], agent, app)
            assert app[0] != agent[0], (agent, app)     # the app runs in a session of its own
            # started by a program, the agent leads a session of its own (own_session): its
            # boost stays its own, not its starter's (CPU hogs started by the same test got it)
            assert os.getsid(m["agent_pid"]) == m["agent_pid"]
            if ours is not None and ours[0] != "root":
                assert agent[0] != ours[0] and competing_nice(os.getpid()) == ours, (agent, ours)
            if app[0] != "root":
                assert app[1] == 0, (agent, app)        # its session keeps the share it had
            assert agent[1] < app[1], (agent, app)
        old = lc.kill_primary()
        new = lc.wait_primary(other_than=old["birth"])
        assert competing_nice(new["agent_pid"])[1] == AGENT_NICE


def test_agents_run_batch_and_their_applications_keep_their_policy(tmp_path):
    """The agent's threads run SCHED_BATCH (a wake-up does not preempt: application.py
    AGENT_POLICY); the application keeps the policy it would have had (SCHED_OTHER here),
    its threads too."""
    from llft.runtime.application import AGENT_POLICY
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    with LocalCluster(str(tmp_path)) as lc:
        lc.start_replica("r1", COUNTER)
        m = lc.wait_members(1)["members"][0]
        for pid, want in ((m["agent_pid"], AGENT_POLICY), (m["app_pid"], os.SCHED_OTHER)):
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            assert len(tids) > 1 or pid == m["app_pid"]
            assert {os.sched_getscheduler(t) for t in tids} == {want}, (pid, want)


def test_a_command_that_cannot_start_is_one_clear_line(tmp_path):
    """A command not found is refused before the replica joins (one line, status 2); one
    that exists but cannot be executed (no interpreter line, wrong format) founds, fails to
    start, and the replica stops with one error line naming the command (status 127),
    leaving no process behind."""
    import subprocess
    lc = LocalCluster(str(tmp_path))
    argv = lc.llft_argv("run", "--config", lc.config_path, "--group", lc.group, "--")
    r = subprocess.run(argv + [str(tmp_path / "no-such-command")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"llft run: {tmp_path / 'no-such-command'}: command not found (not on PATH, or not "
        "an executable file)"]

    bad = tmp_path / "not-a-program"
    bad.write_bytes(b"\x00\x01\x02")
    bad.chmod(0o755)
    r = subprocess.run(argv + [str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 127, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and f"cannot start the application {bad}: [Errno 8]" in errors[0], \
        r.stderr
    assert "Traceback" not in r.stderr


def test_an_unknown_lane_setting_is_one_clear_line(tmp_path):
    """`LLFT_LANE` (what runs a backup's steady events) with a value it does not know:
    one line naming it, status 2, before the replica joins."""
    import subprocess
    lc = LocalCluster(str(tmp_path))
    argv = lc.llft_argv("run", "--config", lc.config_path, "--group", lc.group, "--",
                        "true")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "LLFT_LANE": "fast"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "llft run: LLFT_LANE='fast': use native, python or off"], r.stderr
