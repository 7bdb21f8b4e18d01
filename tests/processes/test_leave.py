"""A primary stopped with SIGTERM hands over: real replicas (`llft run`) of
examples/kv_counter.py behind the gateway, 8 clients checking every reply. The primary's
agent, once its backups hold its order information, says LEAVE; its senior backup takes
over without waiting for its detector (it still asks the gateway, a remote group, for
evidence: one round trip), the other backup follows, and nobody is reset. Then a backup
stopped with SIGTERM says LEAVE too, and its primary removes it by its word, not after
its timeout on it. Counts and log lines only, no timings (docs/DESIGN.md, "A graceful
stop")."""
from __future__ import annotations

import os
import signal
import sys
import threading

from llft import EXAMPLES_DIR
from llft.tools.cluster import LocalCluster
from llft.tools.loadclient import BackgroundLoad

KV = [sys.executable, os.path.join(EXAMPLES_DIR, "kv_counter.py"), "9000"]


def test_a_primary_stopped_with_sigterm_is_replaced_by_its_word_not_its_silence(tmp_path):
    with LocalCluster(str(tmp_path), group="kv") as lc:
        host, port = lc.start_service(("r1", "r2", "r3"), KV)
        lc.wait_ready(3, 120)
        stop = threading.Event()
        load = BackgroundLoad(host, port, after=200, clients=8, requests=10 ** 9,
                              mode="counter", timeout_s=30, stop=stop)
        assert load.under_way.wait(60), "no replies before the stop"
        st = lc.status()
        view = st["view"]
        old = next(m for m in st["members"] if m["rank"] == 1)
        senior = next(m for m in st["members"] if m["rank"] == 2)
        name = lc.name_of(old["agent_pid"])
        # (a founding race at the simultaneous start may have reset one: not ours to judge)
        logged = {n: len(lc.log_tail(n, 10 ** 8)) for n in lc.replicas}
        lc.kill(name, signal.SIGTERM)
        assert lc.procs[name].wait(30) == 0, lc.log_tail(name)
        st = lc.wait_status(lambda st: len(st["members"]) == 2 and any(
            m["rank"] == 1 and m["birth"] == senior["birth"] for m in st["members"]),
            60, "the senior backup is the primary of two")
        before = load.replies()
        lc.wait_status(lambda _st: load.replies() > before + 200, 60, "replies after the stop")
        # a backup stopped with SIGTERM: removed by its word
        other = next(m for m in st["members"] if m["rank"] == 2)
        oname = lc.name_of(other["agent_pid"])
        lc.kill(oname, signal.SIGTERM)
        assert lc.procs[oname].wait(30) == 0, lc.log_tail(oname)
        lc.wait_status(lambda st: len(st["members"]) == 1, 60, "the primary alone")
        before = load.replies()
        lc.wait_status(lambda _st: load.replies() > before + 200, 60,
                       "replies after the backup's stop")
        stop.set()
        r = load.result(60)
        assert r.ok, r.errors[:5]
        log = lc.log_tail(lc.name_of(senior["agent_pid"]), 100_000)
        took = [line for line in log.splitlines() if ": took over: primary" in line]
        assert took and all(" left (it said so" in line for line in took), took
        removed = [line for line in log.splitlines()
                   if f": removed {other['birth_hex'][:6]} (" in line]
        assert removed and all("left (it said so as it stopped)" in line
                               for line in removed), removed
        new = next(m for m in st["members"] if m["birth"] == senior["birth"])
        # it still asked the gateway (a remote group) for evidence, which agreed at once
        assert new["takeover"]["primary_alive_answers"] == 0, new["takeover"]
        assert st["view"] == view + 1
        resets = [line for n in lc.replicas
                  for line in lc.log_tail(n, 10 ** 8)[logged[n]:].splitlines()
                  if " reset (" in line]
        assert not resets, resets
