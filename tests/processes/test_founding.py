"""One founder per group, also when the only member is paused while a new replica starts.

A lone primary of examples/kv_counter.py (default configuration) serves some requests, then
its agent and application are stopped with SIGSTOP (a GC pause, a swapped-out VM) and a
second replica starts. The newcomer hears nobody; before the founding guard it founded the
group anew after the founding timeout, and when the paused primary resumed one of the two
lineages was reset: with the newcomer's winning, the counter's state was lost. Now a joiner
does not found while an agent of its host is a live member of the group
(llft/runtime/agent.py, `_guard_founding`): it keeps asking to join, and joins the paused
primary once it resumes. Every wait is on a condition with a deadline.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time

from llft import EXAMPLES_DIR
from llft.tools.cluster import LocalCluster
from llft.tools.loadclient import run_load

COUNTER = [sys.executable, os.path.join(EXAMPLES_DIR, "kv_counter.py"), "9000"]
PAUSE_S = 1.5                 # 15 founding timeouts (membership found_timeout_us: 100 ms)


def _global_count(host: str, port: int) -> int:
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall(b"STATS\n")
        line = s.makefile("rb").readline().decode()
    assert line.startswith("OK "), line
    return int(line.split()[1])


def test_a_replica_started_while_the_only_member_is_paused_joins_it(tmp_path):
    with LocalCluster(str(tmp_path)) as lc:
        host, port = lc.start_service(("r1",), COUNTER)
        r = run_load(host, port, clients=2, requests=50, mode="counter", timeout_s=60)
        assert r.ok, r.errors
        before = _global_count(host, port)
        assert before == 100

        old = lc.primary()
        paused = [old["agent_pid"], old["app_pid"]]
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            lc.start_replica("r2", COUNTER)
            deadline = time.monotonic() + 60
            while "not founding the group" not in lc.log_tail("r2", 10**6):
                assert time.monotonic() < deadline, lc.log_tail("r2")
                assert lc.alive("r2"), lc.log_tail("r2")
                time.sleep(0.02)
            # the window in which it would have founded: it must not
            end = time.monotonic() + PAUSE_S
            while time.monotonic() < end:
                assert "founder" not in lc.log_tail("r2", 10**6), lc.log_tail("r2")
                time.sleep(0.05)
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)

        st = lc.wait_members(2, timeout_s=120)
        assert st["primary"] == old["birth"], st
        assert _global_count(host, port) == before          # the state was kept
        r = run_load(host, port, clients=2, requests=20, mode="counter", timeout_s=60)
        assert r.ok, r.errors
        assert _global_count(host, port) == before + 40
        assert not re.search(r"\breset \(", lc.log_tail("r1", 10**7)), lc.log_tail("r1")
        assert "founder" not in lc.log_tail("r2", 10**7)
