"""`llft bench profile`: where a replicated echo's requests go, process by process.

One group of `--replicas` (examples/echo.py, the default configuration) behind `llft
gateway`, loaded by `--clients` clients for `--duration` seconds, each on a persistent
connection or (`--mode conn`) a connection per request. Per request, for every process
(each agent `rN`, its app `rN.app`, the gateway):

- CPU µs (psutil), and per thread from `/proc/PID/task/*/stat`: the event loop's
  thread (`loop`; an app's main thread), the pulse thread (`llft-pulse`), and the rest
  (`other`: the process's total minus these, so threads that ended count too: the
  drain watcher, the feeder, an app's connection threads);
- for the agents and the gateway, from their status files: datagrams sent and
  received, messages sent and accepted by type, an agent's loop wake-ups;
- with `--cprofile`, the functions of each agent's and the gateway's loop thread (the
  `.prof` files are kept in the results folder):
  cProfile switched on for the middle half of the run (`LLFT_PROFILE_DIR`, SIGUSR1 and
  SIGUSR2: llft/runtime/profiling.py); the top `--top` by own time, µs and calls per
  request (cProfile's own cost makes every µs about twice what it is without it: read
  the shares and the call counts); and the same own time summed by layer (the code's
  folders: messaging core, replica node, agent, asyncio, builtins and system calls...);
- with `--hops` (one client), each hop of a request's path from `perf trace`, and with
  `--marks` (one client) the same path untraced, from the moments the primary's agent
  and the gateway record (`LLFT_MARKS_DIR`, SIGUSR2: llft/runtime/marks.py), each
  datagram's hop split at its kernel arrival stamp (llft/bench/hops.py chains both).

This is the tool the profiles in docs/BENCHMARKS.md were taken with. Its numbers are for
comparisons made in the same run, or alternating runs of two trees (`PYTHONPATH=<a
worktree> llft bench profile ...`): the machine's speed drifts by tens of percent.

Writes `<results>/profile.md` and `profile_cpu.csv` (and `profile_hops.csv`,
`profile_marks.csv`).
"""
from __future__ import annotations

import argparse
import os
import pstats
import shutil
import signal
import tempfile
import threading
import time

from llft.bench import hops, report, wakeup
from llft.bench.echo import SIZE, _agents, _cpu_s, _procs, _wait_status_fresh
from llft.bench.service import Setup, measure_throughput
from llft.runtime import marks, profiling, status


# the loop's waits in its selector: idle, not busy
IDLE = ("<method 'poll' of 'select.epoll' objects>", "<method 'select' of 'select.epoll' objects>")
MARKS_TIMEOUT_S = 10.0      # --marks: for each process to write its marks after SIGUSR2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--mode", choices=("persistent", "conn"), default="persistent",
                   help="persistent connections, or a connection per request")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    p.add_argument("--cprofile", action="store_true",
                   help="also profile each agent's and the gateway's loop (cProfile)")
    p.add_argument("--top", type=int, default=15, help="--cprofile: functions per process")
    p.add_argument("--hops", action="store_true",
                   help="one client: each hop of a request's path, from `perf trace` "
                        "(llft/bench/hops.py; needs perf and root)")
    p.add_argument("--marks", action="store_true",
                   help="one client: each hop of a request's path, untraced, from marks "
                        "the processes record (llft/runtime/marks.py)")
    p.add_argument("--quick", action="store_true", help="--replicas 1 --duration 3")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def _tasks(procs, leaf: str):
    """(process name, its pid, thread id, the text of /proc/PID/task/TID/<leaf>) for
    every live thread of each process (a thread or process gone meanwhile is skipped)."""
    for name, p in procs.items():
        try:
            tids = os.listdir(f"/proc/{p.pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p.pid}/task/{tid}/{leaf}") as f:
                    yield name, p.pid, int(tid), f.read()
            except OSError:
                continue


def _thread_cpu(procs) -> dict[tuple[str, str], float]:
    """(process, thread kind) -> CPU seconds so far; (process, "sys") -> the kernel's
    share of its live threads' time (system calls, softirqs: what no user-space code
    change removes, only fewer calls do)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[tuple[str, str], float] = {}
    for name, pid, tid, stat in _tasks(procs, "stat"):
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        kind = "loop" if tid == pid else comm if comm.startswith("llft-") else None
        out[(name, "sys")] = out.get((name, "sys"), 0.0) + int(fields[12]) / tick
        if kind is not None:        # the rest: the process's total minus these (a
            # thread that ended is gone from /proc, its CPU still in the process's)
            out[(name, kind)] = out.get((name, kind), 0.0) + (
                int(fields[11]) + int(fields[12])) / tick
    return out


def _switches(procs) -> dict[str, tuple[int, int]]:
    """process -> (voluntary, involuntary) context switches of its live threads so far
    (/proc/PID/task/*/status). Voluntary: the thread blocked (a wait for input, a
    futex: the determinized app's threads wait for their turns); involuntary: it was
    preempted. Each costs the machine a switch whatever the process's own CPU says."""
    out: dict[str, tuple[int, int]] = {}
    for name, _, _, status in _tasks(procs, "status"):
        vol, invol = out.get(name, (0, 0))
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol += int(line.split()[1])
        out[name] = (vol, invol)
    return out


def _machine() -> dict[str, float]:
    """The whole machine so far (/proc/stat): CPU seconds by kind and context switches.
    With the processes' own figures it says what the load client and the kernel's
    work outside any of them (softirqs of loopback delivery) cost, and how idle the
    cores were while the load ran."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    with open("/proc/stat") as f:
        for line in f:
            parts = line.split()
            if parts[0] == "cpu":
                # user nice system idle iowait irq softirq steal
                v = [int(x) / tick for x in parts[1:9]]
                out["user"], out["sys"] = v[0] + v[1], v[2] + v[5] + v[6]
                out["idle"], out["steal"] = v[3] + v[4], v[7]
            elif parts[0] == "ctxt":
                out["switches"] = float(parts[1])
    return out


def _mid_load(procs, duration: float, out: dict) -> None:
    """Context switches and the machine's CPU over the middle half of the load: a
    thread's counts leave /proc with it, and an app's connection threads end with the
    load's connections."""
    time.sleep(duration / 4)
    t0, out["sw0"], out["m0"] = time.monotonic(), _switches(procs), _machine()
    time.sleep(duration / 2)
    out["sw1"], out["m1"] = _switches(procs), _machine()
    out["s"] = time.monotonic() - t0


def _counters(target) -> dict[int, tuple[str, dict]]:
    """birth -> (role, transport counters) of every agent and gateway now."""
    lc = target.cluster
    agents, gateways, _ = status.read_files(lc.cfg.status_dir(lc.group))
    out = {a["birth"]: (a.get("role", "?"), a.get("transport", {})) for a in agents}
    out.update({g["birth"]: ("gateway", g.get("transport", {})) for g in gateways})
    return out


def _profile_window(procs, duration: float, window: dict) -> None:
    """Profile the loops for the middle half of the load (signals to the agents and the
    gateway), noting when it started and ended."""
    time.sleep(duration / 4)            # the load's first quarter: warm-up, unprofiled
    pids = [p.pid for n, p in procs.items() if "." not in n]
    window["t0"] = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    time.sleep(duration / 2)            # the profiled half
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    window["t1"] = time.monotonic()


def _hop_threads(target, procs, duration: float, out: dict) -> None:
    """Mid-load: the primary agent's pid and its app's threads (the echo app's thread of
    the client's connection exists only while the load runs)."""
    time.sleep(duration / 2)
    out["primary"] = next((a.get("agent_pid") for a in _agents(target)
                           if a.get("role") == "primary"), None)
    out["gateway"] = procs["gateway"].pid if "gateway" in procs else None
    name = next((n for n, p in procs.items() if p.pid == out["primary"]), None)
    out["app"] = set()
    for n, p in procs.items():
        if name is None or not n.startswith(name + ".app"):
            continue
        try:
            out["app"] |= {int(tid) for tid in os.listdir(f"/proc/{p.pid}/task")}
        except OSError:
            pass


def _marks_table(target, procs, folder: str, load: dict, results: str) -> str:
    """Each process writes its marks at SIGUSR2 (llft/runtime/marks.py); the primary's
    and the gateway's are chained into one request's path (hops.chain_marks)."""
    primary = next((a.get("agent_pid") for a in _agents(target)
                    if a.get("role") == "primary"), None)
    roles = {"primary": primary, "gateway": procs["gateway"].pid if "gateway" in procs
             else None}
    paths = {r: os.path.join(folder, f"{'gateway' if r == 'gateway' else 'agent'}-{pid}.marks")
             for r, pid in roles.items() if pid is not None}
    for r, pid in roles.items():
        if pid is not None:
            os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + MARKS_TIMEOUT_S
    while not all(os.path.exists(p) for p in paths.values()) and time.monotonic() < deadline:
        time.sleep(0.05)        # polling for the files the signal makes them write
    lat = sorted(load["latencies"])
    title = (f"One request's path at 1 client, hop by hop, untraced (marks; the client's "
             f"round trip: p50 {1e6 * lat[len(lat) // 2]:.0f} µs)")
    tb = report.Table("profile_marks", title, ["hop", "median_us", "p90_us", "requests"])
    try:
        got = {r: marks.read(p) for r, p in paths.items()}
    except OSError as e:
        print(f"llft bench profile --marks: {e}")
        got = {}
    if len(got) == 2:
        for row in hops.summary_marks(hops.chain_marks(got, SIZE)):
            tb.add(**row)
        # the machine's own wake-up, same run: a plain asyncio echo (llft/bench/wakeup.py)
        for other, what in ((False, "any CPU"), (True, "pinned to the other CPU")):
            w = wakeup.measure(other)
            if w is not None:
                tb.add(hop=f"baseline: a plain asyncio process's wake-up, {what}",
                       median_us=w["median_us"], p90_us=w["p90_us"], requests=w["n"])
    if not tb.rows:
        print(f"llft bench profile --marks: no request seen whole (primary {primary}, "
              f"files {sorted(paths.values())})")
    tb.print()
    tb.write_csv(results)
    return tb.markdown()


def _hops_table(traced: dict, results: str) -> str:
    tb = report.Table("profile_hops", "One request's path at 1 client, hop by hop (perf "
                      "trace: every traced call is slower; compare the hops, not the sum)",
                      ["hop", "median_us", "p90_us", "requests"])
    if "text" in traced and traced.get("primary") and traced.get("gateway"):
        for row in hops.summary(hops.chain(traced["text"], SIZE, traced["gateway"],
                                           traced["primary"], traced["app"])):
            tb.add(**row)
    if not tb.rows:
        print(f"llft bench profile --hops: no request traced whole (primary "
              f"{traced.get('primary')}, gateway {traced.get('gateway')}, "
              f"{len(traced.get('app', ()))} app threads, "
              f"{traced.get('text', '').count(chr(10))} lines traced)")
    tb.print()
    tb.write_csv(results)
    return tb.markdown()


def _top(path: str, n_req: float, top: int) -> list[dict]:
    st = pstats.Stats(path).stats
    busy_rows = [(k, v) for k, v in st.items() if k[2] not in IDLE]
    busy = sum(v[2] for _, v in busy_rows)
    out = []
    for (fn, line, func), (_cc, calls, tt, ct, _callers) in sorted(
            busy_rows, key=lambda kv: -kv[1][2])[:top]:
        out.append({"function": f"{os.path.basename(fn)}:{line} {func}" if line else func,
                    "own_us_per_req": 1e6 * tt / n_req, "cum_us_per_req": 1e6 * ct / n_req,
                    "calls_per_req": calls / n_req,
                    "own_share_of_busy": tt / busy if busy else float("nan")})
    return out


# `_layers`: a function's layer, by the first of these its file's path contains
LAYERS = (("/llft/protocol/messaging/", "messaging core"),
          ("/llft/protocol/", "wire and messages"),
          ("/llft/replica/", "replica node"),
          ("/membership/", "membership"),
          ("/determinizer/", "determinizer (shm, order info)"),
          ("/native/", "native adapters"),
          ("/llft/runtime/", "agent, driver, transport"),
          ("/asyncio/", "asyncio"),
          ("/selectors.py", "asyncio"))


def _layer_of(fn: str) -> str:
    if fn == "~":
        return "builtins and system calls"
    return next((name for part, name in LAYERS if part in fn), "other Python")


def _layers(path: str, n_req: float) -> list[dict]:
    """The loop thread's own time by layer (the code's folders), per request: where a
    process's Python goes, a level above its functions."""
    st = pstats.Stats(path).stats
    busy: dict[str, float] = {}
    calls: dict[str, int] = {}
    for (fn, _line, func), (_cc, nc, tt, _ct, _callers) in st.items():
        if func in IDLE:
            continue
        layer = _layer_of(fn)
        busy[layer] = busy.get(layer, 0.0) + tt
        calls[layer] = calls.get(layer, 0) + nc
    total = sum(busy.values())
    return [{"layer": k, "own_us_per_req": 1e6 * v / n_req,
             "calls_per_req": calls[k] / n_req,
             "own_share_of_busy": v / total if total else float("nan")}
            for k, v in sorted(busy.items(), key=lambda kv: -kv[1])]


def run(args) -> int:
    command = report.command_of(args, add_arguments, "profile")
    if args.quick:
        args.replicas, args.duration = 1, 3.0
    if args.hops:
        why = hops.available()
        if why is not None:
            print(f"llft bench profile --hops: {why}")
            return 2
        args.clients, args.mode = 1, "persistent"
    if args.marks:
        if args.cprofile:       # one SIGUSR2 each; and cProfile's cost would be in the marks
            print("llft bench profile: --marks and --cprofile are measured in separate runs")
            return 2
        args.clients, args.mode = 1, "persistent"
    mode = "echo_conn" if args.mode == "conn" else "echo"
    with tempfile.TemporaryDirectory(prefix="llft-bench-profile-") as tmp:
        prof_dir = os.path.join(tmp, "profiles")
        os.makedirs(prof_dir)
        marks_dir = os.path.join(tmp, "marks")
        os.makedirs(marks_dir)
        if args.cprofile:
            os.environ[profiling.ENV] = prof_dir     # inherited by the cluster's processes
        if args.marks:
            os.environ[marks.ENV] = marks_dir
        try:
            setup = Setup(tmp, proxy=False)
            t = setup.add_cluster(args.replicas)
        finally:
            os.environ.pop(profiling.ENV, None)
            os.environ.pop(marks.ENV, None)
        recording = None
        try:
            if t.error is not None:
                print(f"llft bench profile: {t.error}")
                return 1
            procs = _procs(setup, t)
            time.sleep(1.0)             # settle: the group just finished its set-up
            window: dict = {}
            prof = None
            if args.cprofile:
                prof = threading.Thread(target=_profile_window,
                                        args=(procs, args.duration, window), daemon=True)
                prof.start()
            traced: dict = {}
            if args.hops:
                try:
                    recording = hops.Recording.start()
                except (OSError, RuntimeError) as e:
                    print(f"llft bench profile --hops: {e}")
                    return 1
                prof = threading.Thread(target=_hop_threads, args=(t, procs, args.duration,
                                                                   traced), daemon=True)
                prof.start()
            _wait_status_fresh(t, time.monotonic(), gateways=True)
            m0, c0, th0 = _counters(t), _cpu_s(procs), _thread_cpu(procs)
            mid: dict = {}
            sampler = threading.Thread(target=_mid_load, args=(procs, args.duration, mid),
                                       daemon=True)
            sampler.start()
            acc: dict = {}
            measure_throughput([t], [args.clients], SIZE, args.duration, 1, 0, acc, mode=mode)
            c1, th1 = _cpu_s(procs), _thread_cpu(procs)
            sampler.join()
            if recording is not None:
                traced["text"], recording = recording.stop(), None
            if prof is not None:
                prof.join()
            _wait_status_fresh(t, time.monotonic(), gateways=True)
            m1 = _counters(t)
            a = acc.get((0, t.name, args.clients))
            n = a["replies"] if a else 0
            if not n:
                print(f"llft bench profile: no reply ({t.error or 'the load failed'})")
                return 1
            rps = n / a["elapsed_s"]
            sections = [f"{args.replicas} replicas, {args.clients} clients, {args.mode} "
                        f"connections, {args.duration:g} s: {n} replies, {rps:.0f} req/s\n"]
            print(sections[0])
            cpu = report.Table("profile_cpu", "CPU µs per request, by process and thread; "
                               "context switches per request (voluntary / involuntary)",
                               ["process", "cpu_us_per_req", "sys", "loop", "llft_pulse",
                                "other", "switches_vol", "switches_invol"])
            for name in procs:
                per = {k: 1e6 * (th1.get((name, k), 0) - th0.get((name, k), 0)) / n
                       for (pn, k) in th1 if pn == name}
                sys_us = per.pop("sys", 0.0)
                total = 1e6 * (c1[name] - c0[name]) / n
                n_mid = rps * mid["s"]          # requests in the middle half
                v0, i0 = mid["sw0"].get(name, (0, 0))
                v1, i1 = mid["sw1"].get(name, (v0, i0))
                cpu.add(process=name, cpu_us_per_req=total, sys=sys_us,
                        loop=per.get("loop", 0.0),
                        llft_pulse=per.get("llft-pulse", 0.0),
                        other=max(0.0, total - sum(per.values())),
                        switches_vol=(v1 - v0) / n_mid, switches_invol=(i1 - i0) / n_mid)
            # the machine: everything above, the load client, the kernel's own work
            mc0, mc1 = mid["m0"], mid["m1"]
            busy = {k: mc1[k] - mc0[k] for k in ("user", "sys", "idle", "steal")}
            cpu.add(process="machine (all cores; idle not counted)",
                    cpu_us_per_req=1e6 * (busy["user"] + busy["sys"]) / n_mid,
                    sys=1e6 * busy["sys"] / n_mid,
                    switches_vol=(mc1["switches"] - mc0["switches"]) / n_mid)
            cores_s = sum(busy.values())
            idle_note = (f"Switches and the machine's row: the middle half of the load. The "
                         f"cores were idle {100 * busy['idle'] / cores_s:.0f} % of it (steal "
                         f"{100 * busy['steal'] / cores_s:.0f} %); the machine's switches "
                         "are all of them.\n" if cores_s else "")
            cpu.print()
            print(idle_note)
            cpu.write_csv(args.results)
            sections.append(cpu.markdown() + "\n" + idle_note)
            keys = sorted({k for b in m1 for k in m1[b][1]
                           if isinstance(m1[b][1][k], (int, float))
                           and (k.startswith(("sent_", "accepted_", "loop_waits",
                                              "received_datagrams", "pulse_")))})
            msgs = report.Table("profile_messages",
                                "Per request, each agent and the gateway: loop wake-ups, "
                                "datagrams, messages",
                                ["counter"] + [f"{m1[b][0]}_{b:x}"[:18] for b in sorted(m1)])
            for k in keys:
                row = {"counter": k}
                for b in sorted(m1):
                    before = m0.get(b, ("", {}))[1].get(k, 0)
                    row[f"{m1[b][0]}_{b:x}"[:18]] = (m1[b][1].get(k, 0) - before) / n
                if any(isinstance(v, float) and v for v in row.values()):
                    msgs.add(**row)
            msgs.print()
            sections.append(msgs.markdown())
            if args.hops:
                sections.append(_hops_table(traced, args.results))
            if args.marks:
                sections.append(_marks_table(t, procs, marks_dir, a, args.results))
            if args.cprofile and window:
                n_win = rps * (window["t1"] - window["t0"])     # requests in the window
                for f in sorted(os.listdir(prof_dir)):
                    # kept beside the report, for `python -m pstats` on the whole tree
                    shutil.copy(os.path.join(prof_dir, f), args.results)
                    tops = _top(os.path.join(prof_dir, f), n_win, args.top)
                    tb = report.Table("profile_top", f"{f}: top {args.top} functions of "
                                      "the loop thread by own time, per request "
                                      "(cProfile-inflated)",
                                      ["function", "own_us_per_req", "cum_us_per_req",
                                       "calls_per_req", "own_share_of_busy"])
                    for r in tops:
                        tb.add(**r)
                    tb.print()
                    sections.append(tb.markdown())
                    tb = report.Table("profile_layers", f"{f}: the loop thread's own time "
                                      "by layer, per request (cProfile-inflated)",
                                      ["layer", "own_us_per_req", "calls_per_req",
                                       "own_share_of_busy"])
                    for r in _layers(os.path.join(prof_dir, f), n_win):
                        tb.add(**r)
                    tb.print()
                    sections.append(tb.markdown())
            md = report.write_markdown(args.results, "profile", sections, command=command)
            print(f"wrote {md}")
            return 0
        finally:
            if recording is not None:
                recording.stop()
            setup.stop()
