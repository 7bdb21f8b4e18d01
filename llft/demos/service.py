"""`llft demo`: the main job — a replicated service survives two primary kills.

    llft demo                 # three replicas of examples/kv_counter.py behind a gateway
    llft demo messaging       # the messaging protocol alone, under 10% datagram loss
    llft demo spark           # a replicated PySpark streaming driver (llft/demos/spark.py)

Scenario (default, `service`): three `llft run` replicas of the unmodified threaded
counter service (examples/kv_counter.py: locks, clocks, random numbers), `llft gateway`
in front, four TCP clients sending INCR requests. On a schedule the primary's agent is
SIGKILLed (its application dies with it); a backup takes over, and the killed replica is
restarted with `llft run`: it rejoins as a backup by replaying the group's log. Then the
new primary is killed too. The timeline shows who is primary, replies per second, the
client-visible pause at each failover, and at the end the clients' verdict: every
request answered exactly once and in order, per-key counters consecutive, global counters
never repeated, clock values never backwards; and the survivors' divergence detectors.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

from llft import EXAMPLES_DIR

KINDS = ("service", "messaging", "spark")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", default="service", choices=KINDS)
    p.add_argument("--replicas", type=int, help="replicas, 2 or more (service: 3, spark: 2)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=2000, help="service: requests per client")
    p.add_argument("--kills", type=int, help="primary kills (service: 2, spark: 1)")
    p.add_argument("--events", type=int, default=4000, help="spark: input events")
    p.add_argument("--rate", type=float, default=500, help="spark: generator events/s")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, status)")
    p.add_argument("--mb", type=float, default=8.0, help="messaging: megabytes to stream")
    p.add_argument("--drop", type=float, default=0.1,
                   help="messaging: datagram loss injected at each receiver")
    p.add_argument("--seed", type=int, default=42)


def run(args) -> int:
    if args.kind == "messaging":
        from llft.demos import messaging as demo_messaging
        return demo_messaging.run(args)
    spark = args.kind == "spark"
    args.replicas = args.replicas or (2 if spark else 3)
    args.kills = args.kills if args.kills is not None else (1 if spark else 2)
    if args.replicas < 2:
        print("llft demo: --replicas must be at least 2 (a backup must take over)",
              file=sys.stderr)
        return 2
    if spark:
        from llft.demos import spark as demo_spark
        return demo_spark.run(args)
    if args.keep:
        work = tempfile.mkdtemp(prefix="llft-demo-")
        return service_demo(args, work)
    with tempfile.TemporaryDirectory(prefix="llft-demo-") as work:
        return service_demo(args, work)


def service_demo(args, work: str) -> int:
    from llft.tools.cluster import ClusterError, LocalCluster
    from llft.tools.loadclient import run_load

    app = [sys.executable, os.path.join(EXAMPLES_DIR, "kv_counter.py"), "9000"]
    t0 = time.monotonic()
    marks: list[tuple[float, str]] = []

    def say(text: str) -> None:
        now = time.monotonic() - t0
        marks.append((now, text))
        print(f"[{now:6.2f}s] {text}", flush=True)

    def short(m: dict) -> str:
        return f"{m.get('name') or lc.name_of(m['agent_pid'])} ({m['birth_hex'][:6]})"

    lc = LocalCluster(work)
    ok = False
    try:
        say(f"starting {args.replicas} replicas of examples/kv_counter.py "
            f"(config {lc.config_path})")
        for i in range(1, args.replicas + 1):
            lc.start_replica(f"r{i}", app)
            lc.wait_members(i)
        st = lc.status()
        say("group up: " + ", ".join(f"{short(m)} {m['role']}" for m in st["members"]))
        host, port = lc.start_gateway()
        say(f"gateway listening on {host}:{port}; {args.clients} clients x "
            f"{args.requests} INCR requests")
        result: dict = {}
        load = threading.Thread(target=lambda: result.setdefault("r", run_load(
            host, port, clients=args.clients, requests=args.requests, mode="counter",
            timeout_s=60)), daemon=True)
        load_t0 = time.monotonic()
        load.start()
        kills = []
        expected = args.requests * args.clients
        for k in range(args.kills):
            # kill when the group has served a share of the load (primary's input bytes)
            share = (k + 1) / (args.kills + 1)
            lc.wait_status(lambda st: lc.primary_delivered_bytes() >= share * expected * 20
                           or not load.is_alive(), 300, "load progress")
            if not load.is_alive():
                say("the load ended before the scheduled kill (raise --requests)")
                break
            victim = lc.kill_primary()
            kt = time.monotonic()
            say(f"SIGKILL primary {short(victim)}")
            new = lc.wait_primary(other_than=victim["birth"])
            promoted = time.monotonic()
            say(f"new primary {short(new)} (detected and promoted "
                f"{(promoted - kt) * 1000:.0f} ms after the kill, as seen by polling)")
            kills.append((kt, victim, new))
            name = victim["name"] + "'"
            lc.start_replica(name, app)
            lc.wait_members(args.replicas)
            say(f"restarted the killed replica as {name}: rejoined as a backup "
                f"(replayed the group's log)")
        load.join()
        r = result["r"]
        print()
        _timeline(r, load_t0, kills, t0)
        print()
        st = lc.status()
        diverged = [m for m in st["members"] if m["diverged"]] + st["departed"]
        print(f"replies: {r.replies} of {r.requests} requests; errors: {r.error_count}; "
              f"repeated global counters: {r.global_repeats}")
        for e in r.errors[:5]:
            print(f"  error: {e}")
        print("lost replies: {}, duplicated replies: {}, out of order: {}".format(
            r.requests - r.replies, r.global_repeats,
            sum(1 for e in r.errors if "order" in e)))
        print(f"divergence reported by the replicas: {'none' if not diverged else diverged}")
        ok = r.ok and r.replies == expected and not diverged and len(kills) == args.kills
        print("RESULT: " + ("OK — no client saw a lost, repeated or reordered reply"
                            if ok else "FAILED"))
    except ClusterError as e:
        print(f"llft demo: {e}", file=sys.stderr)
        for name in lc.procs:
            print(f"--- {name} log ---\n{lc.log_tail(name, 1500)}", file=sys.stderr)
    finally:
        lc.stop()
        if args.keep:
            print(f"work folder kept: {work}")
    return 0 if ok else 1


def _timeline(r, load_t0: float, kills, t0: float, bucket_s: float = 0.5) -> None:
    """Replies per second per half second, with the kills and the pause each caused."""
    times = sorted(recv for tr in r.reply_times for _, recv in tr)
    if not times:
        return
    end = times[-1]
    print(f"{'time':>8}  {'replies/s':>9}  event")
    i, t = 0, load_t0
    while t < end:
        n = 0
        while i < len(times) and times[i] < t + bucket_s:
            n += 1
            i += 1
        ev = "; ".join(f"primary {v['name']} killed, {nw.get('name') or 'backup'} takes over"
                       for kt, v, nw in kills if t <= kt < t + bucket_s)
        print(f"{t - t0:7.2f}s  {n / bucket_s:9.0f}  {ev}")
        t += bucket_s
    for k, (kt, v, nw) in enumerate(kills):
        until = kills[k + 1][0] if k + 1 < len(kills) else end
        print(f"client-visible pause at the kill of {v['name']} (t={kt - t0:.2f}s): "
              f"{pause_at(times, kt, until) * 1000:.0f} ms without a reply (any client)")


def pause_at(times: list[float], kill_t: float, until: float) -> float:
    """The longest wait for a reply (any client's; `times` sorted) from the last reply
    before `kill_t` until `until` (the next kill, or the end): replies the primary sent
    just before it died still arrive after the kill, and the first of them is not the
    end of the outage."""
    start = max((x for x in times if x <= kill_t), default=kill_t)
    window = [start] + [x for x in times if start < x <= until]
    return max((b - a for a, b in zip(window, window[1:])), default=0.0)
