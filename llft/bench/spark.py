"""`llft bench spark`: a PySpark streaming driver protected by llft (classic and Spark
Connect) against the way Spark users protect it today (a supervisor restarting it from
its checkpoint), on one workload and the same kill points, in one run.

The driver is examples/nexmark_pipeline.py, unmodified, on one Workload (same seed, same
generated input). Setups:

  reference          plain python, no llft, its own local Spark: the expected output and
                     the baseline of every overhead
  llft_2r            2 x `llft run` of the driver behind `llft gateway`, each replica with
                     its own local Spark (classic mode)
  connect_reference  plain python as a thin client of a Spark Connect server (one server
                     for the whole bench, `llft spark-connect`): Connect's own cost
  llft_connect_2r    2 x `llft run` of the driver as thin clients of that server: only the
                     primary's calls reach it (its agent's gRPC relay)
  checkpoint         the driver with `--checkpoint DIR` under a restart-always supervisor
                     (llft.spark.supervisor), generator and sink connected straight to it

Every setup runs once without a failure (its output timeline: when each window reached
the sink). The three protected setups then run `--kills` times, each SIGKILLed once at a
kill point (the sink holds k windows; k cycles over the stream's windows from
`--kill-after`, the same points for every setup, runs interleaved): llft_* kill the
primary's agent (its driver dies by PR_SET_PDEATHSIG; the backup takes over),
checkpoint kills the driver's Python process (the supervisor restarts it, it restores its
checkpoint and replays the input after it).

What a failure cost is the delay it adds to the output timeline against the same setup's
run without one: `added_ms` = (kill run: first event sent -> the end line) - (the same in
the failure-free run), p50/p99 over the kills; also kill -> next result, kill -> first
new window, windows lost and repeated, and whether the de-duplicated output equals the
reference's. Steady state (the failure-free runs): throughput (input events of windows
1..W-1 over the time between the arrivals of windows 0 and W-1: window 0 carries the
warm-up) and window latency (arrival at the sink - when the generator, paced at
`--rate`, sent the window's last event), each against the reference's.

With `--pin` (the default on 2+ cores) every driver runs on one core of its own
(taskset), so that throughput ratios mean something on a small machine: the reference,
the checkpoint driver, the Connect server and replica 1 on CPU 0, replica 2 on CPU 1
(a restarted replica takes its slot's CPU); each driver's own JVM inherits its core.

Writes spark.csv (one row per setup), spark_runs.csv (every run), spark.md, spark.png
(added delay per kill), spark_throughput.png and spark_timeline.png (windows at the sink
over time: each setup's failure-free run and its first kill run, the kill marked).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import traceback

from llft.bench import report
from llft.spark import sparkrun, supervisor
from llft.spark.connect import Server
from llft.tools.procs import free_port

SETUPS = ("reference", "llft_2r", "connect_reference", "llft_connect_2r", "checkpoint")
KILLED = ("llft_2r", "llft_connect_2r", "checkpoint")
CONNECT = ("connect_reference", "llft_connect_2r")


def add_arguments(p: argparse.ArgumentParser) -> None:
    wl = sparkrun.Workload()
    p.add_argument("--events", type=int, default=wl.events, help="input events per run")
    p.add_argument("--rate", type=float, default=wl.rate,
                   help="events/s sent by the generator (0 = unpaced)")
    p.add_argument("--seed", type=int, default=wl.seed)
    p.add_argument("--window-ms", type=int, default=wl.window_ms,
                   help="event-time window (1 ms per event: events per window)")
    p.add_argument("--kill-after", type=int, default=1,
                   help="the first kill point (windows at the sink); the next runs' points "
                   "cycle over the stream's windows")
    p.add_argument("--kills", type=int, default=10, help="killed runs per protected setup")
    p.add_argument("--setups", default=",".join(SETUPS),
                   help=f"a subset of {','.join(SETUPS)} (the reference always runs)")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction,
                   default=(os.cpu_count() or 1) >= 2,
                   help="one core per driver (taskset); default: on with 2+ cores")
    p.add_argument("--fault-timeout-ms", type=float, default=None,
                   help="fault_timeout_ms of the llft groups (default: the configuration's)")
    p.add_argument("--run-timeout", type=float, default=400,
                   help="seconds per run before it is reported as failed")
    p.add_argument("--quick", action="store_true",
                   help="smoke size: 1000 events, 250-event windows, 1 kill per setup")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


# ---- what one run's sink saw --------------------------------------------------------------
def _windows(sink) -> list[dict]:
    return [json.loads(w.line) for w in sink.windows]


def steady_throughput(sink) -> float:
    """Input events/s of windows 1..W-1 over the time between the arrivals of window 0
    and the last window (window 0 carries the warm-up); nan with fewer than 2 windows."""
    if len(sink.windows) < 2:
        return float("nan")
    ws = _windows(sink)
    events = sum(w["events"][1] - w["events"][0] + 1 for w in ws[1:])
    dt = sink.windows[-1].t - sink.windows[0].t
    return events / dt if dt > 0 else float("nan")


def window_latency_ms(res: sparkrun.Result, rate: float) -> float:
    """Median over windows 1.. of arrival at the sink - when the paced generator sent the
    window's last event (first_send + seq / rate); nan if unpaced or never sent."""
    first = res.streams.gen.first_send_t
    if not rate or first is None or len(res.sink.windows) < 2:
        return float("nan")
    lat = [1000 * (w.t - (first + d["events"][1] / rate))
           for w, d in list(zip(res.sink.windows, _windows(res.sink)))[1:]]
    return statistics.median(lat)


def first_new_window_ms(sink, t_kill: float) -> float | None:
    """Kill -> arrival of the first window the sink did not hold at the kill."""
    before = sum(1 for w in sink.windows if w.t <= t_kill)
    if len(sink.windows) <= before:
        return None
    return 1000 * (sink.windows[before].t - t_kill)


def timeline(res: sparkrun.Result) -> tuple[list[float], list[int]]:
    """(seconds since the first event was sent, windows held) at each arrival."""
    t0 = res.streams.gen.first_send_t or 0.0
    return [0.0] + [w.t - t0 for w in res.sink.windows], list(range(len(res.sink.windows) + 1))


def kill_points(n: int, first: int, windows: int) -> list[int]:
    """n kill points cycling over 1..windows-2 from `first` (a kill needs a window after
    it to be measured)."""
    span = max(1, windows - 2)
    return [1 + (first - 1 + i) % span for i in range(n)]


def _med(xs: list) -> float:
    xs = [x for x in xs if isinstance(x, (int, float)) and x == x]
    return statistics.median(xs) if xs else float("nan")


def _pct(xs: list, q: float) -> float:
    return report.percentile([x for x in xs if isinstance(x, (int, float)) and x == x], q)


# ---- the run ----------------------------------------------------------------------------
class Pinning:
    """taskset prefixes: one core per driver (see the module docstring)."""

    def __init__(self, on: bool):
        self.cpus = sorted(os.sched_getaffinity(0)) if on else []

    def cpu(self, slot: int) -> int | None:
        return self.cpus[slot % len(self.cpus)] if self.cpus else None

    def argv(self, slot: int, argv: list[str]) -> list[str]:
        c = self.cpu(slot)
        return argv if c is None else ["taskset", "-c", str(c)] + argv


def run(args) -> int:
    command = report.command_of(args, add_arguments, "spark")
    if args.quick:
        args.events, args.window_ms, args.kills = 1000, 250, 1
    wl = sparkrun.Workload(events=args.events, seed=args.seed, rate=args.rate,
                           window_ms=args.window_ms)
    setups = [s for s in SETUPS if s == "reference" or s in args.setups.split(",")]
    unknown = set(args.setups.split(",")) - set(SETUPS)
    if unknown or wl.windows < 3 or not 1 <= args.kill_after <= wl.windows - 2:
        print(f"llft bench spark: setups are {','.join(SETUPS)}; --kill-after must be in "
              f"1..{wl.windows - 2} ({wl.windows} windows of {wl.window_ms} events)",
              file=sys.stderr)
        return 2
    points = kill_points(args.kills, args.kill_after, wl.windows)
    pin = Pinning(args.pin)
    say = (lambda text: print(f"  {text}", flush=True))
    runs = report.Table("spark_runs", f"Every run ({wl.events} events at {wl.rate:g}/s, "
                        f"{wl.windows} windows)",
                        ["setup", "run", "kill_after", "added_ms", "next_result_ms",
                         "new_window_ms", "promoted_ms", "restarted_ms", "lost", "repeated",
                         "identical", "throughput_ev_s", "latency_ms", "end_s", "elapsed_s",
                         "error"])
    ref_bytes: bytes | None = None
    free: dict[str, sparkrun.Result] = {}
    first_kill: dict[str, sparkrun.Result] = {}
    with tempfile.TemporaryDirectory(prefix="llft-bench-spark-") as tmp:
        server = None
        try:
            if any(s in CONNECT for s in setups):
                server = _start_connect(tmp, pin)
                print(f"Spark Connect server {server.url()} (pinned: {pin.cpu(0)})", flush=True)
            for setup in setups:                        # the failure-free runs
                print(f"{setup}: no failure", flush=True)
                row, res = _one(setup, "free", None, os.path.join(tmp, f"{setup}-free"), wl,
                                args, ref_bytes, None, server, pin, say)
                runs.add(**row)
                if res is not None:
                    free[setup] = res
                    if setup == "reference" and not row.get("error"):
                        ref_bytes = res.sink.received_bytes()
            for i, k in enumerate(points, 1):             # the kills, interleaved
                for setup in [s for s in setups if s in KILLED]:
                    print(f"{setup} kill {i}/{len(points)}: once the sink holds {k} windows",
                          flush=True)
                    row, res = _one(setup, str(i), k, os.path.join(tmp, f"{setup}-{i}"), wl,
                                    args, ref_bytes, free.get(setup), server, pin, say)
                    runs.add(**row)
                    if res is not None and setup not in first_kill:
                        first_kill[setup] = res
        finally:
            if server is not None:
                server.stop()
    summary = _summary(runs, setups)
    runs.print()
    summary.print()
    summary.write_csv(args.results)
    runs.write_csv(args.results)
    plots = _plots(args.results, summary, setups, free, first_kill)
    failed = [r for r in runs.rows if r.get("error")]
    md = report.write_markdown(args.results, "spark", [summary.markdown(), runs.markdown()],
                               notes=_notes(args, wl, points, summary, failed, pin),
                               plots=plots, command=command)
    print(f"wrote {md}")
    return 1 if failed else 0


def _start_connect(tmp: str, pin: Pinning) -> Server:
    port = free_port()
    server = Server(port, state_dir=os.path.join(tmp, "spark-connect"))
    cmd = [sys.executable, "-m", "llft", "spark-connect", "start", "--port", str(port),
           "--dir", server.state_dir, "--master", "local[1]",
           "--conf", "spark.sql.shuffle.partitions=1", "--conf", "spark.default.parallelism=1",
           "--conf", "spark.ui.enabled=false"]
    r = subprocess.run(pin.argv(0, cmd), capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"the Spark Connect server did not start: {r.stderr.strip()[-500:]}")
    return server


def _one(setup: str, name: str, k: int | None, workdir: str, wl: sparkrun.Workload, args,
         ref_bytes: bytes | None, free: sparkrun.Result | None, server: Server | None,
         pin: Pinning, say) -> tuple[dict, sparkrun.Result | None]:
    row = dict(setup=setup, run=name, kill_after=k if k is not None else "")
    kill_after = [k] if k is not None else []
    remote = server.url() if setup in CONNECT else None
    try:
        if setup in ("reference", "connect_reference"):
            res = sparkrun.reference(workdir, wl, timeout_s=args.run_timeout, remote=remote,
                                     name=setup, wrap=lambda argv: pin.argv(0, argv))
        elif setup in ("llft_2r", "llft_connect_2r"):
            res = sparkrun.replicated(workdir, wl, replicas=2, kill_after=kill_after,
                                      fault_timeout_ms=args.fault_timeout_ms, on_event=say,
                                      timeout_s=args.run_timeout, remote=remote,
                                      restart=False, wrap=pin.argv)
        else:
            res = supervisor.supervised(workdir, wl, kill_after=kill_after, on_event=say,
                                        timeout_s=args.run_timeout,
                                        wrap=lambda argv: pin.argv(0, argv))
    except Exception as e:                  # noqa: BLE001 -- one failed run is a row
        traceback.print_exc()
        kept = _keep_logs(workdir, os.path.join(args.results, f"spark_failed_{setup}_{name}"))
        row["error"] = (f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                        + (f" (logs: {kept})" if kept else ""))
        return row, None
    sink = res.sink
    problems = sink.verdict(wl.events)
    e, e_free = res.streams.span_s(), free.streams.span_s() if free is not None else None
    row.update(lost=len(sink.gaps), repeated=sink.repeated,
               identical=("n/a" if ref_bytes is None else
                          "yes" if sink.received_bytes() == ref_bytes else "no"),
               throughput_ev_s=steady_throughput(sink),
               latency_ms=window_latency_ms(res, wl.rate), end_s=e, elapsed_s=res.elapsed_s,
               error="; ".join(problems))
    if res.kills:
        kill = res.kills[0]
        row.update(next_result_ms=kill.get("next_result_ms"),
                   new_window_ms=first_new_window_ms(sink, kill["t_kill"]),
                   promoted_ms=kill.get("promoted_ms", ""),
                   restarted_ms=kill.get("restarted_ms", ""),
                   added_ms=1000 * (e - e_free) if e is not None and e_free is not None else "")
        if setup == "checkpoint" and kill.get("jvm_gone_ms") is None:
            row["error"] = (row["error"] + "; " if row["error"] else "") + \
                "the killed driver's JVM outlived it by 30 s"
    return row, res


def _keep_logs(workdir: str, dest: str) -> str:
    """Copy a failed run's logs (the run's folder is temporary) into the results."""
    import shutil
    logs = [os.path.join(d, f) for d, _, fs in os.walk(workdir) for f in fs
            if f.endswith(".log")]
    if not logs:
        return ""
    os.makedirs(dest, exist_ok=True)
    for p in logs:
        shutil.copy(p, os.path.join(dest, os.path.relpath(p, workdir).replace(os.sep, "_")))
    return dest


def _summary(runs: report.Table, setups: list[str]) -> report.Table:
    t = report.Table("spark", "Four ways to run the driver (failure-free run: steady state; "
                     "kill runs: what a SIGKILL added to the output timeline)",
                     ["setup", "throughput_ev_s", "throughput_vs_reference", "latency_ms",
                      "latency_vs_reference", "kills", "added_ms_p50", "added_ms_p99",
                      "next_result_ms_p50", "next_result_ms_p99", "new_window_ms_p50",
                      "lost", "repeated", "identical", "failed_runs"])
    free = {r["setup"]: r for r in runs.rows if r["run"] == "free"}
    ref = free.get("reference", {})

    def vs(row: dict, col: str):
        a, b = row.get(col), ref.get(col)
        ok = all(isinstance(x, float) and x == x for x in (a, b)) and b
        return a / b if ok else ""
    for s in setups:
        rs = [r for r in runs.rows if r["setup"] == s]
        kills = [r for r in rs if r["run"] != "free"]
        f = free.get(s, {})
        row = dict(setup=s, throughput_ev_s=f.get("throughput_ev_s", ""),
                   throughput_vs_reference=vs(f, "throughput_ev_s"),
                   latency_ms=f.get("latency_ms", ""), latency_vs_reference=vs(f, "latency_ms"),
                   lost=sum(r.get("lost") or 0 for r in rs),
                   repeated=sum(r.get("repeated") or 0 for r in rs),
                   failed_runs=sum(1 for r in rs if r.get("error")))
        if s in KILLED:
            added = [r.get("added_ms") for r in kills]
            nxt = [r.get("next_result_ms") for r in kills]
            row.update(kills=len(kills), added_ms_p50=_med(added), added_ms_p99=_pct(added, 99),
                       next_result_ms_p50=_med(nxt), next_result_ms_p99=_pct(nxt, 99),
                       new_window_ms_p50=_med([r.get("new_window_ms") for r in kills]),
                       identical=f"{sum(r.get('identical') == 'yes' for r in kills)}/{len(kills)}")
        t.add(**row)
    return t


def _plots(results: str, summary: report.Table, setups: list[str],
           free: dict[str, sparkrun.Result], first_kill: dict[str, sparkrun.Result]) -> list:
    rows = {r["setup"]: r for r in summary.rows}
    killed = [s for s in setups if s in KILLED]
    series: dict[str, tuple[list, list, str]] = {}
    marks: dict[str, list[float]] = {}
    for s in killed:
        if s in free:
            xs, ys = timeline(free[s])
            series[f"{s} (no failure)"] = (xs, ys, "--")
        if s in first_kill:
            res = first_kill[s]
            xs, ys = timeline(res)
            series[f"{s} (killed)"] = (xs, ys, "-")
            t0 = res.streams.gen.first_send_t or 0.0
            marks[f"{s} kill"] = [k["t_kill"] - t0 for k in res.kills]
    if "reference" in free:
        xs, ys = timeline(free["reference"])
        series["reference"] = (xs, ys, ":")
    return [
        report.bars(results, "spark", "What a driver kill added to the output timeline",
                    "ms (p50, p99 over the kills)", ["p50", "p99"],
                    {s: [rows.get(s, {}).get("added_ms_p50", float("nan")),
                         rows.get(s, {}).get("added_ms_p99", float("nan"))] for s in killed}),
        report.bars(results, "spark_throughput", "Steady-state throughput (failure-free run)",
                    "input events/s", ["throughput"],
                    {s: [rows.get(s, {}).get("throughput_ev_s") or float("nan")] for s in setups}),
        report.timelines(results, "spark_timeline", "Windows at the sink over time (first kill "
                         "run of each setup, dotted: its kill)", "seconds since the first event",
                         "windows received", series, marks),
    ]


def _notes(args, wl: sparkrun.Workload, points: list[int], summary: report.Table,
           failed: list, pin: Pinning) -> str:
    rows = {r["setup"]: r for r in summary.rows}

    def ratio(a: str, b: str, col: str) -> str:
        x, y = rows.get(a, {}).get(col), rows.get(b, {}).get(col)
        ok = all(isinstance(v, float) and v == v for v in (x, y)) and y
        return f"{x / y:.1f}x" if ok else "n/a"
    lines = [
        f"Workload: examples/nexmark_pipeline.py, {wl.events} events (seed {wl.seed}), "
        f"generator at {wl.rate:g} events/s, {wl.window_ms}-event windows ({wl.windows} "
        f"windows), micro-batches of {wl.batch_events} events or {wl.batch_ms} ms. Kill "
        f"points (windows at the sink): {points}, the same for every protected setup. "
        f"llft groups: fault_timeout_ms = {report.detector_ms(args.fault_timeout_ms)}. "
        + (f"Pinned: drivers (and their JVMs) one core each, CPUs {pin.cpus}."
           if pin.cpus else "Not pinned."),
        "",
        "- added_ms: (first event sent -> end line) of the kill run minus the same in the "
        "setup's failure-free run: the delay the failure added to the output; p99 over "
        f"{len(points)} kills is their maximum. next_result_ms: kill -> the next result line "
        "(a repeat counts); new_window_ms: kill -> the first window the sink did not hold.",
        "- throughput_ev_s: input events of windows 1..W-1 over the time between the "
        "arrivals of windows 0 and W-1 (failure-free run); latency_ms: the median over "
        "windows of arrival - the paced send of the window's last event (it includes the "
        "queue when the driver is slower than the generator).",
        "- llft_2r: every replica runs its own local Spark and does all the Spark work; "
        "llft_connect_2r: the replicas share one Connect server, only the primary's calls "
        "reach it (its agent's gRPC relay), the backup replays the answers; checkpoint: "
        "the supervisor restarts the driver, which starts a JVM, restores its last "
        "checkpoint and replays the input after it (windows after it come twice: repeated).",
        "",
        f"Added delay p50, checkpoint / llft_2r: **{ratio('checkpoint', 'llft_2r', 'added_ms_p50')}**; "
        f"checkpoint / llft_connect_2r: **{ratio('checkpoint', 'llft_connect_2r', 'added_ms_p50')}**.",
    ]
    if failed:
        lines.append("\nFailed runs: " + "; ".join(f"{r['setup']} {r['run']}: {r['error']}"
                                                   for r in failed))
    return "\n".join(lines)
