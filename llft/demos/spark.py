"""`llft demo spark`: a replicated PySpark streaming driver survives the loss of its
primary.

Two `llft run` replicas of the unmodified Nexmark pipeline (examples/nexmark_pipeline.py,
each replica with its own local Spark session), `llft gateway` in front, the event
generator and the result sink connected through it. Mid-stream the primary's agent is
SIGKILLed (its driver and JVM die with it); the backup driver takes over with the state
its own Spark session built. Then the same input runs through one plain, unreplicated
driver, and the sink's results of both runs are compared byte for byte.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from llft.spark import sparkrun


def run(args) -> int:
    wl = sparkrun.Workload(events=args.events, seed=args.seed, rate=args.rate)
    kill_after = [max(1, round(wl.windows * (k + 1) / (args.kills + 1))) for k in range(args.kills)]
    work = tempfile.mkdtemp(prefix="llft-demo-spark-")
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.2f}s] {text}", flush=True)

    say(f"{args.replicas} replicas of examples/nexmark_pipeline.py under llft run; "
        f"{wl.events} events, {wl.windows} event-time windows of {wl.window_ms} ms; "
        f"kill the primary after window(s) {', '.join(str(k - 1) for k in kill_after)}")
    try:
        rep = sparkrun.replicated(os.path.join(work, "replicated"), wl, replicas=args.replicas,
                                  kill_after=kill_after, on_event=say)
    except Exception as e:  # one clear line; logs are kept
        print(f"llft demo spark: replicated run failed: {e}\n(logs in {work})")
        return 1
    say("replicated run done; now the same input through one unreplicated driver")
    ref = sparkrun.reference(os.path.join(work, "reference"), wl)
    say("reference run done")
    print()
    _timeline(rep, t0)
    sink = rep.sink
    problems = sink.verdict(wl.events)
    identical = sink.received_bytes() == ref.sink.received_bytes()
    diverged = [m for m in rep.status["members"] if m["diverged"]] + rep.status.get("departed", [])
    print()
    print(f"windows received: {len(sink.windows)} of {wl.windows}; repeated: {sink.repeated}; "
          f"gaps: {len(sink.gaps)}; sink connections: {sink.connections}")
    print(f"byte-identical to the unreplicated run: {'yes' if identical else 'NO'} "
          f"({len(ref.sink.received_bytes())} bytes)")
    print(f"throughput: replicated {rep.streams.throughput():.0f} events/s, "
          f"unreplicated {ref.streams.throughput():.0f} events/s "
          f"(generator paced at {wl.rate:g}/s)")
    print(f"divergence reported by the replicas: {'none' if not diverged else diverged}")
    ok = not problems and identical and not diverged and len(rep.kills) == len(kill_after)
    for p in problems:
        print(f"  problem: {p}")
    print("RESULT: " + ("OK — the sink saw every window exactly once, identical to an "
                        "unreplicated run" if ok else "FAILED"))
    if args.keep:
        print(f"work folder kept: {work}")
    else:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def _timeline(rep: sparkrun.Result, t0: float) -> None:
    """One line per window as the sink received it, with the kills between them."""
    kills = sorted(rep.kills, key=lambda k: k["t_kill"])
    print(f"{'time':>8}  {'window':>6}  {'events':>13}  {'bids':>5}  event")
    prev_t = None
    for w in rep.sink.windows:
        for k in [k for k in kills if (prev_t or 0) < k["t_kill"] <= w.t]:
            print(f"{k['t_kill'] - t0:7.2f}s  {'':>6}  {'':>13}  {'':>5}  SIGKILL primary "
                  f"{k['killed']}; {k['new_primary']} promoted after {k['promoted_ms']:.0f} ms")
        obj = json.loads(w.line)
        ev = f"{obj['events'][0]}-{obj['events'][1]}"
        print(f"{w.t - t0:7.2f}s  {obj['w']:>6}  {ev:>13}  {obj['bids']:>5}")
        prev_t = w.t
    for k in kills:
        before = max((w.t for w in rep.sink.windows if w.t <= k["t_kill"]), default=None)
        after = k["next_result_ms"]
        gap = f"; gap between results around it {1000 * (k['t_kill'] - before) + after:.0f} ms" \
            if before is not None and after is not None else ""
        print(f"pause at the kill of {k['killed']}: next result {after:.0f} ms after the kill"
              f"{gap}")
