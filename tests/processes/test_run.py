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


def start_load(lc: LocalCluster, requests_per_client: int):
    """4 counter clients through a new gateway, in a thread; finish_load() joins it."""
    host, port = lc.start_gateway()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "r", run_load(host, port, clients=4, requests=requests_per_client, mode="counter",
                      timeout_s=60)), daemon=True)
    t.start()
    return t, result


def finish_load(t: threading.Thread, result: dict):
    t.join(timeout=300)
    assert not t.is_alive(), "load did not finish"
    return result["r"]


def wait_delivered(lc: LocalCluster, t: threading.Thread, threshold: int) -> None:
    """Until the primary has delivered `threshold` request bytes (the load still on)."""
    lc.wait_status(lambda st: lc.primary_delivered_bytes() >= threshold or not t.is_alive(),
                   120, f"{threshold} bytes delivered at the primary")
    assert t.is_alive(), "the load finished before the kill: raise the request count"


def run_with_kills(lc: LocalCluster, requests_per_client: int, kill_at_bytes: list[int]):
    """Load through the gateway; SIGKILL the primary each time it has delivered the next
    threshold of request bytes."""
    t, result = start_load(lc, requests_per_client)
    killed = []
    for threshold in kill_at_bytes:
        wait_delivered(lc, t, threshold)
        old = lc.kill_primary()
        killed.append(old)
        lc.wait_primary(other_than=old["birth"])
    return finish_load(t, result), killed


def check_reply_log(r, total: int) -> None:
    assert r.ok, r.errors
    assert r.replies == r.requests == total
    assert r.global_repeats == 0


def no_divergence(lc: LocalCluster) -> None:
    st = lc.status()
    assert st["departed"] == [], st["departed"]
    for m in st["members"]:
        assert m["diverged"] is None, m


def test_three_replicas_two_primary_kills(tmp_path, soak):
    per_client = 1250 if soak == "off" else 2500          # 4 clients: >= 5,000 requests
    with LocalCluster(str(tmp_path)) as lc:
        for name in ("r1", "r2", "r3"):
            lc.start_replica(name, COUNTER)
            lc.wait_members(int(name[1]))
        total_bytes = per_client * 4 * 20                  # ~20 request bytes each
        r, killed = run_with_kills(lc, per_client, [total_bytes // 4, total_bytes // 2])
        check_reply_log(r, per_client * 4)
        st = lc.wait_members(1)
        no_divergence(lc)
        assert len(killed) == 2 and st["view"] >= 3


def test_two_replicas_kill_and_rejoin_then_takeover(tmp_path):
    """A killed replica restarted with `llft run` rejoins as a backup, catches up (replays
    the group's log), then takes over when the current primary is killed."""
    per_client = 600
    with LocalCluster(str(tmp_path)) as lc:
        lc.start_replica("r1", COUNTER)
        lc.wait_members(1)
        lc.start_replica("r2", COUNTER)
        lc.wait_members(2)
        total_bytes = per_client * 4 * 20
        t, result = start_load(lc, per_client)
        wait_delivered(lc, t, total_bytes // 5)
        old = lc.kill_primary()
        lc.wait_primary(other_than=old["birth"])
        lc.start_replica(old["name"] + "b", COUNTER)
        lc.wait_members(2)
        wait_delivered(lc, t, total_bytes // 2)
        old2 = lc.kill_primary()
        new = lc.wait_primary(other_than=old2["birth"])
        assert new["agent_pid"] == lc.procs[old["name"] + "b"].pid   # the rejoined one
        r = finish_load(t, result)
        check_reply_log(r, per_client * 4)
        no_divergence(lc)


def _competing_nice(pid: int) -> tuple[str, int] | None:
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
    session gets AGENT_NICE, each application (its own session) keeps 0, so a busy
    application (a Spark JVM) cannot starve its agent's heartbeats. Whatever the
    arrangement the kernel made (both in autogroups, or one of them in the root group), the
    entity the agent competes as outranks the application's."""
    import pytest
    from llft.runtime.application import AGENT_NICE
    if os.geteuid() != 0 or not os.path.exists(f"/proc/{os.getpid()}/autogroup"):
        pytest.skip("needs root and a kernel with autogroup scheduling")
    with LocalCluster(str(tmp_path)) as lc:
        lc.start_replica("r1", COUNTER)
        st = lc.wait_members(1)
        m = st["members"][0]
        agent, app = _competing_nice(m["agent_pid"]), _competing_nice(m["app_pid"])
        assert agent is not None and app is not None
        assert agent[1] == AGENT_NICE, (agent, app)
        assert app[0] != agent[0], (agent, app)     # the app runs in a session of its own
        if app[0] != "root":
            assert app[1] == 0, (agent, app)        # its session keeps the share it had
        assert agent[1] < app[1], (agent, app)


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
