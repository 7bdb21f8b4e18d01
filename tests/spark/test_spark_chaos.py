"""`llft chaos --workload spark`: a small fault campaign against a replicated PySpark driver.

examples/spark_counter.py (its own local Spark session per replica, a Spark job per
request, a ticker thread running Spark jobs with Python workers) under `llft run`, 2
replicas with the default configuration, the kv counter's checking clients through the
gateway. A primary kill, a backup kill and a restart (SIGTERM, a new replica with a new
JVM rejoins): every reply exactly once and in order, no divergence, and after every fault
the killed replica's or reset application's processes (the JVM, PySpark's Python
workers, the watchdog) are gone (psutil). No timing is asserted.

A failure names the command that re-runs the same schedule:
`llft chaos --workload spark --seed S --faults N --kinds ... --only I --keep`.
"""
from __future__ import annotations

from llft.tools import chaos

SEED = 1
KINDS = ("kill_primary", "kill_backup", "restart")


def test_spark_chaos_kill_primary_kill_backup_restart(tmp_path):
    wl = chaos.WORKLOADS["spark"]
    # one fault of each kind, in the seeded schedule's order of delays and picks
    faults = [chaos.Fault(i, kind, f.delay_s, f.hold_s, f.pick) for i, (kind, f) in
              enumerate(zip(KINDS, chaos.schedule(SEED, len(KINDS), KINDS, wl.replicas)))]
    lines: list[str] = []
    rep = chaos.campaign(str(tmp_path), wl, faults, replicas=wl.replicas, clients=2,
                         seed=SEED, say=lines.append)
    log = "\n".join(lines) + "\n" + chaos.table(rep)
    assert not rep.setup_error, log
    assert len(rep.outcomes) == len(faults), log
    assert rep.leftovers == [], rep.leftovers
    t = rep.totals()
    assert t["settled"] == len(faults), log
    assert (t["lost"], t["duplicated"], t["wrong"], t["diverged"], t["leftovers"]) == \
        (0, 0, 0, 0, 0), log
    assert all(o.resumed for o in rep.outcomes), log
    assert rep.ok, log
    # the faults did something: the primary kill promoted the backup
    assert t["takeovers"] >= 1 and t["replies"] > 0, log
