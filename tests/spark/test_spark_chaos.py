"""`llft chaos --workload spark`: a small fault campaign against a replicated PySpark driver.

examples/spark_counter.py (its own local Spark session per replica, a Spark job per
request, a ticker thread running Spark jobs with Python workers) under `llft run`, 2
replicas with the default configuration, the kv counter's checking clients through the
gateway. A primary kill, a backup kill and a restart (SIGTERM, a new replica with a new
JVM rejoins): no reply executed twice or crossed, no divergence, and after every fault
the killed replica's or reset application's processes (the JVM, PySpark's Python
workers, the watchdog) are gone (psutil); then every fault settled and no request went
unanswered (an xfail with the table while the known liveness bugs stand). No timing is
asserted.

A failure names the command that re-runs the same schedule:
`llft chaos --workload spark --seed S --faults N --kinds ... --only I --keep`.
"""
from __future__ import annotations

import pytest

from llft.tools import chaos

SEED = 1
KINDS = ("kill_primary", "kill_backup", "restart")


@pytest.mark.slow
def test_spark_chaos_kill_primary_kill_backup_restart(tmp_path, soak):
    # 3-6 minutes of JVMs: at --soak=full (CI runs the kv campaign, tests/processes)
    if soak != "full":
        pytest.skip("PySpark chaos campaign: --soak=full")
    wl = chaos.WORKLOADS["spark"]
    # one fault of each kind, in the seeded schedule's order of delays and picks
    faults = [chaos.Fault(i, kind, f.delay_s, f.hold_s, f.pick) for i, (kind, f) in
              enumerate(zip(KINDS, chaos.schedule(SEED, len(KINDS), KINDS, wl.replicas)))]
    lines: list[str] = []
    rep = chaos.campaign(str(tmp_path), wl, faults, replicas=wl.replicas, clients=2,
                         seed=SEED, say=lines.append)
    log = "\n".join(lines) + "\n" + chaos.table(rep)
    t = rep.totals()
    assert rep.outcomes, log                    # the group formed and answered (warm-up)
    # safety: never a reply executed twice, crossed or from a diverged replica, and no
    # process of a killed replica or a reset application left behind
    assert (t["duplicated"], t["wrong"], t["diverged"], t["leftovers"]) == (0, 0, 0, 0), log
    assert rep.leftovers == [], rep.leftovers
    assert t["takeovers"] >= 1, log             # the primary kill promoted the backup
    # liveness: every fault settled, the clients served again, no request unanswered
    # for REPLY_TIMEOUT_S. Known to fail on a loaded 2-core machine (docs/RELIABILITY.md,
    # "The PySpark workload": false takeovers while JVMs start, each reset starting a new
    # JVM; a promotion waits for a rejoined backup's whole replay): reported as xfail
    # with the campaign's table, never hidden as a pass
    live = (not rep.setup_error and len(rep.outcomes) == len(faults)
            and t["settled"] == len(faults) and t["lost"] == 0
            and all(o.resumed for o in rep.outcomes))
    if not live:
        pytest.xfail("liveness under JVM load (docs/RELIABILITY.md, The PySpark workload):\n"
                     + log)
    assert rep.ok, log
