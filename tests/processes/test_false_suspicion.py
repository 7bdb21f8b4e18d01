"""A primary that is only paused, not dead: replaced while it still runs, and no client sees it.

Three `llft run` replicas of the unmodified examples/kv_counter.py (default configuration),
a gateway and 4 counter clients (llft.tools.loadclient checks every reply: answered
exactly once and in order, per-key counters consecutive, global counters never repeated,
clocks never backwards). Mid-load the primary's agent and application are stopped with
SIGSTOP (a GC pause, a swapped-out VM) until a backup has taken over -- so the old
primary still holds its old view -- then continued with SIGCONT. The old primary resumes where it stopped: it sends what it had queued and may
answer requests in its old view before it learns it was excluded.

This once gave clients wrong replies (an empty reply, a request executed twice, a clock
going backwards): receivers took the excluded primary's bytes in its old view, and
backups delivered bytes their own primary never had. The replica simulation now pauses
primaries too (llft/sim/replica_check.py, "one history"). Every wait here is on a
condition with a deadline.
"""
from __future__ import annotations

import os
import re
import signal
import sys

from llft import EXAMPLES_DIR
from llft.tools.cluster import LocalCluster
from llft.tools.loadclient import BackgroundLoad

COUNTER = [sys.executable, os.path.join(EXAMPLES_DIR, "kv_counter.py"), "9000"]
RESET_LINE = re.compile(r"\breset \(")


def test_paused_primary_is_replaced_and_no_reply_is_wrong(tmp_path):
    names = ("r1", "r2", "r3")
    with LocalCluster(str(tmp_path)) as lc:            # the default configuration
        host, port = lc.start_service(names, COUNTER)  # all at the same moment

        load = BackgroundLoad(host, port, after=100, clients=4, requests=600,
                              mode="counter", timeout_s=180)
        assert load.under_way.wait(120), "the clients got no replies"

        old = lc.primary()
        paused = [old["agent_pid"], old["app_pid"]]
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            new = lc.wait_primary(other_than=old["birth"], timeout_s=60)
        finally:
            # resumed only after a backup took over: the old primary wakes in its old view
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        r = load.result(300)
        assert r.ok and r.error_count == 0, r.errors
        assert r.global_repeats == 0
        assert r.replies == r.requests == 4 * 600

        # the paused replica learns it was excluded, resets and rejoins as a backup
        st = lc.wait_ready(3, timeout_s=120)
        assert new["birth"] in {m["birth"] for m in st["members"]}
        assert next(m for m in st["members"] if m["role"] == "primary")["birth"] == new["birth"]
        old_name = lc.name_of(old["agent_pid"])
        others = [n for n in names if n != old_name]
        assert {n: RESET_LINE.findall(lc.log_tail(n, 10**7)) for n in others} == \
            {n: [] for n in others}, "a replica that was not paused was reset"
        print(f"\nprimary {old_name} paused until replaced: {lc.name_of(new['agent_pid'])} took "
              f"over (view {st['view']}), {r.replies} replies correct, longest reply gap "
              f"{r.max_gap_s * 1000:.0f} ms")
