"""`llft bench spark`: a PySpark streaming driver protected by llft against the way Spark
users protect it today (a supervisor restarting it from its checkpoint).

The driver is examples/nexmark_pipeline.py, unmodified, on one Workload (same seed, same
generated input) in three setups, all in one run:

  reference    plain python, no llft, no checkpoint (sparkrun.reference): the expected
               output and the baseline throughput
  llft_2r      2 x `llft run` of the driver behind `llft gateway`
               (sparkrun.replicated(replicas=2, kill_after=[k])): the primary's agent is
               SIGKILLed once the sink holds k windows (its driver gets SIGKILL through
               PR_SET_PDEATHSIG, the driver's JVM exits on stdin EOF); the backup takes over
  checkpoint   the driver with `--checkpoint DIR` on a fixed port under a restart-always
               supervisor (llft.spark.supervisor.supervised(kill_after=[k])), generator and sink
               connected straight to it; the driver's Python process is SIGKILLed once the
               sink holds k windows (its JVM exits on stdin EOF; the kill row says when it
               was gone); the supervisor restarts it at once, it restores its last
               checkpoint and asks the source to replay from the checkpointed offset

`--repeat N` runs of each replicated setup (one kill each, interleaved llft, checkpoint,
llft, ...). Per kill: kill -> next result line at the sink (any line, a repeat counts),
kill -> first new window (a window the sink did not hold before the kill), kill ->
promoted (llft) or restarted (checkpoint: a new driver process started), results lost
(the sink's gaps) and repeated (windows received again, dropped by the sink), and
whether the de-duplicated output is byte-identical to the reference's.

Throughput is measured on the part of every run before its kill (the reference on the
same windows): input events of windows 1..k-1 divided by the time between the arrivals
of window 0 and window k-1 at the sink (window 0 is left out: it carries the Spark
session's warm-up). With `--rate` above what the driver can process (the default on a
small machine) this is the driver's processing rate; the markdown says so when the
measured rate comes near `--rate` (input-bound).

Writes spark.csv (one row per setup), spark_kills.csv (every kill), spark.md,
spark.png (kill -> next result and kill -> first new window, both setups) and
spark_throughput.png. Every run starts Spark JVMs (2 for llft_2r): a few minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import traceback

from llft.spark import sparkrun, supervisor
from llft.bench import report

SETUPS = ("reference", "llft_2r", "checkpoint")


def add_arguments(p: argparse.ArgumentParser) -> None:
    wl = sparkrun.Workload()
    p.add_argument("--events", type=int, default=wl.events, help="input events per run")
    p.add_argument("--rate", type=float, default=wl.rate,
                   help="events/s sent by the generator (0 = unpaced)")
    p.add_argument("--seed", type=int, default=wl.seed)
    p.add_argument("--window-ms", type=int, default=wl.window_ms,
                   help="event-time window (1 ms per event: events per window)")
    p.add_argument("--kill-after", type=int, default=3,
                   help="kill once the sink holds this many windows")
    p.add_argument("--repeat", type=int, default=2, help="kills (runs) per setup")
    p.add_argument("--fault-timeout-ms", type=float, default=None,
                   help="fault_timeout_ms of the llft group (default: the configuration's "
                   "default)")
    p.add_argument("--run-timeout", type=float, default=400,
                   help="seconds per run before it is reported as failed")
    p.add_argument("--quick", action="store_true",
                   help="smoke size: 1000 events, 250-event windows, kill after 2 windows, "
                   "1 kill per setup")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def _windows(sink) -> list[dict]:
    return [json.loads(w.line) for w in sink.windows]


def pre_kill_throughput(sink, k: int) -> float:
    """Input events/s between the arrivals of window 0 and window k-1 (events of windows
    1..k-1); nan with fewer than 2 windows or no time between them."""
    if k < 2 or len(sink.windows) < k:
        return float("nan")
    ws = _windows(sink)
    events = sum(w["events"][1] - w["events"][0] + 1 for w in ws[1:k])
    dt = sink.windows[k - 1].t - sink.windows[0].t
    return events / dt if dt > 0 else float("nan")


def window_gap_ms(sink, k: int) -> float:
    """Median time between consecutive window arrivals among windows 0..k-1 (how long
    the sink waits for a window when nothing fails); nan with fewer than 2 windows."""
    ts = [w.t for w in sink.windows[:k]]
    gaps = [1000 * (b - a) for a, b in zip(ts, ts[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def first_new_window_ms(sink, t_kill: float) -> float | None:
    """Kill -> arrival of the first window the sink did not hold at the kill."""
    before = sum(1 for w in sink.windows if w.t <= t_kill)
    if len(sink.windows) <= before:
        return None
    return 1000 * (sink.windows[before].t - t_kill)


def _med(xs: list) -> float:
    xs = [x for x in xs if isinstance(x, (int, float)) and x == x]
    return statistics.median(xs) if xs else float("nan")


def _span(xs: list) -> str:
    xs = [x for x in xs if isinstance(x, (int, float)) and x == x]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.0f}"
    return f"{statistics.median(xs):.0f} [{min(xs):.0f}-{max(xs):.0f}]"


def run(args) -> int:
    command = report.command_of(args, add_arguments, "spark")
    if args.quick:
        args.events, args.window_ms, args.kill_after, args.repeat = 1000, 250, 2, 1
    wl = sparkrun.Workload(events=args.events, seed=args.seed, rate=args.rate,
                           window_ms=args.window_ms)
    k = args.kill_after
    if not 1 <= k < wl.windows:
        print(f"llft bench spark: --kill-after {k} must be in 1..{wl.windows - 1} "
              f"({wl.windows} windows of {wl.window_ms} events)", file=sys.stderr)
        return 2
    say = (lambda text: print(f"  {text}", flush=True))
    kills = report.Table("spark_kills", f"Every kill ({wl.events} events at "
                         f"{wl.rate:g}/s, SIGKILL once the sink holds {k} windows)",
                         ["setup", "run", "next_result_ms", "new_window_ms", "window_gap_ms",
                          "promoted_ms",
                          "restarted_ms", "jvm_gone_ms", "lost", "repeated", "identical",
                          "throughput_ev_s", "whole_run_ev_s", "elapsed_s", "error"])
    ref_bytes, ref_row = None, {}
    with tempfile.TemporaryDirectory(prefix="llft-bench-spark-") as tmp:
        print(f"reference: {wl.events} events, seed {wl.seed}, rate {wl.rate:g}/s", flush=True)
        try:
            ref = sparkrun.reference(os.path.join(tmp, "reference"), wl,
                                     timeout_s=args.run_timeout)
            problems = ref.sink.verdict(wl.events)
            ref_bytes = ref.sink.received_bytes() if not problems else None
            ref_row = dict(setup="reference", run=1, lost=len(ref.sink.gaps),
                           repeated=ref.sink.repeated,
                           throughput_ev_s=pre_kill_throughput(ref.sink, k),
                           window_gap_ms=window_gap_ms(ref.sink, k),
                           whole_run_ev_s=ref.streams.throughput(),
                           elapsed_s=ref.elapsed_s, error="; ".join(problems))
        except Exception as e:              # noqa: BLE001 -- reported in the table
            traceback.print_exc()
            ref_row = dict(setup="reference", run=1, error=f"{type(e).__name__}: {e}"[:300])
        kills.add(**ref_row)
        for i in range(1, args.repeat + 1):
            for setup in SETUPS[1:]:
                print(f"{setup} run {i}/{args.repeat}: kill after {k} windows", flush=True)
                kills.add(**_one(setup, i, os.path.join(tmp, f"{setup}-{i}"), wl, k, args,
                                 ref_bytes, say))
    summary = _summary(kills, k)
    kills.print()
    summary.print()
    summary.write_csv(args.results)
    kills.write_csv(args.results)
    rows = {r["setup"]: r for r in summary.rows}
    plots = [
        report.bars(args.results, "spark", f"Driver killed after {k} windows: time to results "
                    "(median)", "seconds after the kill",
                    ["kill -> next result", "kill -> first new window"],
                    {s: [rows.get(s, {}).get("next_result_ms", float("nan")) / 1000,
                         rows.get(s, {}).get("new_window_ms", float("nan")) / 1000]
                     for s in SETUPS[1:]}),
        report.bars(args.results, "spark_throughput", "Steady-state throughput before the "
                    "kill (median)", "input events/s", ["throughput"],
                    {s: [rows.get(s, {}).get("throughput_ev_s", float("nan"))] for s in SETUPS}),
    ]
    failed = [r for r in kills.rows if r.get("error")]
    md = report.write_markdown(args.results, "spark", [summary.markdown(), kills.markdown()],
                               notes=_notes(args, wl, k, rows, kills, failed), plots=plots,
                               command=command)
    print(f"wrote {md}")
    return 1 if failed else 0


def _one(setup: str, i: int, workdir: str, wl: sparkrun.Workload, k: int, args,
         ref_bytes: bytes | None, say) -> dict:
    row = dict(setup=setup, run=i)
    try:
        if setup == "llft_2r":
            res = sparkrun.replicated(workdir, wl, replicas=2, kill_after=[k],
                                      fault_timeout_ms=args.fault_timeout_ms, on_event=say,
                                      timeout_s=args.run_timeout)
        else:
            res = supervisor.supervised(workdir, wl, kill_after=[k], on_event=say,
                                        timeout_s=args.run_timeout)
    except Exception as e:                  # noqa: BLE001 -- one failed run is a row
        traceback.print_exc()
        kept = _keep_logs(workdir, os.path.join(args.results, f"spark_failed_{setup}_{i}"))
        row["error"] = (f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                        + (f" (logs: {kept})" if kept else ""))
        return row
    kill = res.kills[0]
    sink = res.sink
    problems = sink.verdict(wl.events)
    row.update(next_result_ms=kill.get("next_result_ms"),
               new_window_ms=first_new_window_ms(sink, kill["t_kill"]),
               window_gap_ms=window_gap_ms(sink, k),
               promoted_ms=kill.get("promoted_ms", ""), restarted_ms=kill.get("restarted_ms", ""),
               jvm_gone_ms=kill.get("jvm_gone_ms", ""), lost=len(sink.gaps),
               repeated=sink.repeated,
               identical=("n/a" if ref_bytes is None else
                          "yes" if sink.received_bytes() == ref_bytes else "no"),
               throughput_ev_s=pre_kill_throughput(sink, k),
               whole_run_ev_s=res.streams.throughput(), elapsed_s=res.elapsed_s,
               error="; ".join(problems))
    if setup == "checkpoint" and kill.get("jvm_gone_ms") is None:
        row["error"] = (row["error"] + "; " if row["error"] else "") + \
            "the killed driver's JVM outlived it by 30 s"
    return row


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


def _summary(kills: report.Table, k: int) -> report.Table:
    t = report.Table("spark", f"llft against supervisor + checkpoint (driver SIGKILLed once "
                     f"the sink holds {k} windows; medians over runs, [min-max])",
                     ["setup", "runs", "kill_to_next_result_ms", "kill_to_new_window_ms",
                      "recovery_vs_llft", "lost", "repeated", "identical", "throughput_ev_s",
                      "throughput_vs_reference", "window_gap_ms", "next_result_ms",
                      "new_window_ms",
                      "failed_runs"])
    ref_thr = _med([r.get("throughput_ev_s") for r in kills.rows if r["setup"] == "reference"])
    llft_next = _med([r.get("next_result_ms") for r in kills.rows if r["setup"] == "llft_2r"])
    for s in SETUPS:
        rs = [r for r in kills.rows if r["setup"] == s]
        good = [r for r in rs if not r.get("error")]
        thr = _med([r.get("throughput_ev_s") for r in rs])
        row = dict(setup=s, runs=len(rs), failed_runs=len(rs) - len(good),
                   lost=sum(r.get("lost") or 0 for r in rs),
                   repeated=sum(r.get("repeated") or 0 for r in rs),
                   window_gap_ms=_med([r.get("window_gap_ms") for r in rs]),
                   throughput_ev_s=thr, throughput_vs_reference=thr / ref_thr if ref_thr else "")
        if s != "reference":
            nxt = [r.get("next_result_ms") for r in rs]
            new = [r.get("new_window_ms") for r in rs]
            row.update(kill_to_next_result_ms=_span(nxt), kill_to_new_window_ms=_span(new),
                       next_result_ms=_med(nxt), new_window_ms=_med(new),
                       recovery_vs_llft=_med(nxt) / llft_next if llft_next else "",
                       identical=f"{sum(r.get('identical') == 'yes' for r in rs)}/{len(rs)}")
        t.add(**row)
    return t


def _notes(args, wl: sparkrun.Workload, k: int, rows: dict, kills: report.Table,
           failed: list) -> str:
    llft, ck = rows.get("llft_2r", {}), rows.get("checkpoint", {})
    def ratio(col: str) -> float:
        a, b = ck.get(col, float("nan")), llft.get(col, float("nan"))
        return a / b if isinstance(a, float) and isinstance(b, float) and b else float("nan")
    lines = [
        f"Workload: examples/nexmark_pipeline.py, {wl.events} events (seed {wl.seed}), "
        f"generator at {wl.rate:g} events/s, {wl.window_ms}-event windows ({wl.windows} "
        f"windows), micro-batches of {wl.batch_events} events or {wl.batch_ms} ms; the driver "
        f"is SIGKILLed once the sink holds {k} windows; {args.repeat} run(s) per setup.",
        "",
        "- **llft_2r**: 2 replicas under `llft run` behind `llft gateway` "
        f"(fault_timeout_ms = {report.detector_ms(args.fault_timeout_ms)}); SIGKILL of the primary's agent (its "
        "driver dies by PR_SET_PDEATHSIG, the driver's JVM on stdin EOF). promoted_ms: the "
        "backup is primary.",
        "- **checkpoint**: the driver with `--checkpoint DIR` on a fixed port under "
        "`llft.spark.supervisor` (restart at once, like `spark-submit --supervise` or systemd "
        "`Restart=always`), generator and sink connected straight to it and reconnecting; "
        "SIGKILL of the driver's Python process. restarted_ms: the new driver process "
        "started; jvm_gone_ms: the killed driver's JVM had exited (stdin EOF). The new "
        "driver starts a JVM, restores its last checkpoint (parquet) and replays the input "
        "from the checkpointed offset: windows emitted after that checkpoint are emitted "
        "again (repeated; the sink drops them).",
        "- next_result_ms: kill -> the next result line at the sink (a repeat counts); "
        "new_window_ms: kill -> the first window the sink did not hold at the kill; "
        "lost: gaps in the sink's window numbers or event ranges; identical: the "
        "de-duplicated output equals the reference run's byte for byte; recovery_vs_llft: "
        "median next_result_ms over llft_2r's; window_gap_ms: the median time between "
        f"window arrivals before the kill (windows 0..{k - 1}), i.e. how long the sink "
        "waits for the next window when nothing fails: a kill -> new window close to it "
        "means the kill cost little beyond the normal wait.",
        "- All replicas and JVMs run on this one machine: with llft_2r the backup's driver "
        "and JVM do the same Spark work as the primary's on the same cores (on separate "
        "machines they would not compete), which is most of its lower throughput here.",
        f"- throughput_ev_s: measured on the part of each run before its kill (the reference: "
        f"the same windows): input events of windows 1..{k - 1} over the time between the "
        f"arrivals of windows 0 and {k - 1} (window 0 carries the Spark warm-up). whole_run_ev_s "
        "(every kill row): all input events over first event sent -> end line, the recovery "
        "included.",
        "",
        f"Recovery (kill -> next result), checkpoint / llft: **{ratio('next_result_ms'):.1f}x**; "
        f"kill -> first new window: **{ratio('new_window_ms'):.1f}x**.",
    ]
    thr = [r.get("throughput_ev_s") for r in rows.values()]
    if wl.rate and any(isinstance(x, float) and x == x and x > 0.8 * wl.rate for x in thr):
        lines.append(f"\nNote: some throughput comes near the generator's rate ({wl.rate:g}/s): "
                     "those runs were input-bound; use a higher --rate or --rate 0.")
    if failed:
        lines.append("\nFailed runs: " + "; ".join(f"{r['setup']} {r['run']}: {r['error']}"
                                                   for r in failed))
    return "\n".join(lines)
