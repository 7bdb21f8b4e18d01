"""`llft bench priority`: one group, its backups' CPU priority changed between measurements.

A backup's agent gives its session autogroup nice BACKUP_NICE, the primary's AGENT_NICE
(llft/runtime/application.py `role_priority`). This measures what that choice is worth
where it matters, replicas sharing a host's cores: ONE echo group (`--replicas`, the
default configuration, examples/echo.py behind `llft gateway`), whose backups' agents
get each of `--levels` in turn (their /proc/PID/autogroup written: root), measured
alternately so that every level sees the machine's moods (`--repeat`, the levels'
order reversed each time):

  latency   one client, `--rounds` 1 KB round trips: p50 and p90
  rps_16    16 clients on persistent connections for `--duration` s

The primary's agent keeps its own nice throughout. Writes `<results>/priority.csv` (one
row per repeat and level) and `priority.md` (also the medians per level, and each as a
ratio to the first level's median: the baseline of the same run).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile

from llft.bench import report
from llft.bench.service import Setup, measure_latency, measure_throughput
from llft.runtime.application import set_autogroup_nice

SIZE = 1024
CLIENTS = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, default=3, help="replicas in the group (>= 2)")
    p.add_argument("--levels", default="-10,-5,0",
                   help="the backups' autogroup nice values, the first the baseline")
    p.add_argument("--rounds", type=int, default=1500, help="latency: round trips a level")
    p.add_argument("--duration", type=float, default=3.0,
                   help="throughput: seconds a level, 16 clients")
    p.add_argument("--repeat", type=int, default=4, help="alternations of the levels")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 replicas, levels -10,-5, 200 rounds, 1 s, 2 repeats")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def run(args) -> int:
    command = report.command_of(args, add_arguments, "priority")
    if args.quick:
        args.replicas, args.levels, args.rounds = 2, "-10,-5", 200
        args.duration, args.repeat = 1.0, 2
    levels = [int(x) for x in args.levels.split(",")]
    if args.replicas < 2 or len(levels) < 2:
        print("llft bench priority: needs --replicas >= 2 and two --levels or more")
        return 2
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="llft-bench-priority-") as tmp:
        setup = Setup(tmp, proxy=False, group_prefix="prio")
        try:
            t = setup.add_cluster(args.replicas)
            if t.error is not None:
                print(f"llft bench priority: the group did not start: {t.error}")
                return 1
            st = t.cluster.status()
            backups = [m["agent_pid"] for m in st["members"] if m["role"] != "primary"]
            view = st["view"]
            for rep in range(args.repeat):
                for nice in (levels if rep % 2 == 0 else levels[::-1]):
                    if not all([set_autogroup_nice(nice, pid) for pid in backups]):
                        print(f"llft bench priority: cannot set the backups' autogroup nice "
                              f"to {nice}: run as root, on a kernel with autogroups")
                        return 2
                    lat: dict = {}
                    measure_latency([t], [SIZE], args.rounds, args.rounds // 10, 1, rep, lat)
                    acc: dict = {}
                    measure_throughput([t], [CLIENTS], SIZE, args.duration, 1, rep, acc)
                    if t.error is not None:
                        print(f"llft bench priority: {t.error}")
                        return 1
                    s = report.summarize_us(lat[(rep, t.name, SIZE)])
                    a = acc[(rep, t.name, CLIENTS)]
                    rows.append({"repeat": rep + 1, "backups_nice": nice,
                                 "p50_us": s["median_us"], "p90_us": s["p90_us"],
                                 f"rps_{CLIENTS}": a["replies"] / a["elapsed_s"]})
            st = t.cluster.status()
            view_changes = st["view"] - view
        finally:
            setup.stop()
    table = report.Table("priority", f"{args.replicas} replicas, the backups' autogroup nice "
                         f"alternated ({args.rounds} round trips, {args.duration:g} s of "
                         f"{CLIENTS} clients a level)",
                         ["repeat", "backups_nice", "p50_us", "p90_us", f"rps_{CLIENTS}"])
    for row in rows:
        table.add(**row)
    med_cols = ["backups_nice", "p50_us", "p50_vs_first", f"rps_{CLIENTS}",
                f"rps_{CLIENTS}_vs_first"]
    medians = report.Table("priority_medians", "Medians per level; ratios to the first "
                           "level's (the baseline of the same run)", med_cols)
    first = None
    for nice in levels:
        mine = [r for r in rows if r["backups_nice"] == nice]
        m = {"p50_us": statistics.median(r["p50_us"] for r in mine),
             f"rps_{CLIENTS}": statistics.median(r[f"rps_{CLIENTS}"] for r in mine)}
        first = first or m
        medians.add(backups_nice=nice, **m, p50_vs_first=m["p50_us"] / first["p50_us"],
                    **{f"rps_{CLIENTS}_vs_first": m[f"rps_{CLIENTS}"] / first[f"rps_{CLIENTS}"]})
    for tb in (table, medians):
        tb.print()
        tb.write_csv(args.results)
    notes = (f"One group of {args.replicas} (examples/echo.py, default configuration, behind "
             "`llft gateway`); between measurements its backups' agents' autogroup nice is "
             "rewritten; the primary's keeps its own. Levels alternate, their order "
             f"reversed each repeat. View changes during the run: {view_changes}.")
    md = report.write_markdown(args.results, "priority", [table.markdown(), medians.markdown()],
                               notes=notes, command=command)
    print(f"wrote {md}")
    return 0
