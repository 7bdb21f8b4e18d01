"""`llft bench corpus`: CPython's own test modules, recorded once and replayed N times.

    llft bench corpus [--modules test_thread,test_queue] [--replays 3] [--results results]

The determinizer's own test programs were written by us; programs nobody here wrote are the
real check. For each module of CPython's test suite (`python -m test -u network MODULE`,
the interpreter's own threading, networking and asyncio tests) this runs:

1. the module plainly (the baseline: its wall time and exit status);
2. the module under `llft record` (as a primary would run it): wall time, the record
   overhead against the plain run, order-info entries and trace size;
3. `--replays` replays of the trace (as a backup would run it): each is identical when it
   exits like the recorded run and prints the same bytes; otherwise the first line of the
   divergence or stall report (or the exit status) is the reason.

It prints a table and writes `<results>/corpus.csv` and `corpus.md`. The default module list
is the threading/networking/asyncio kind that real servers are made of (see DEFAULT_MODULES);
the README's compatibility table is made from this command's output.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from determinizer import orderinfo
from llft.bench import report
from determinizer.recordreplay import EXIT_DIVERGED, TRACE_FILE

# The four failing modules, three that replayed, and more of the same kinds
# (test_concurrent_futures is not installed with this interpreter; test_socket's basic
# TCP and UDP cases only: the whole module runs for many minutes).
DEFAULT_MODULES = [
    "test_thread", "test_sched", "test_xmlrpc",
    "test_threading", "test_queue", "test_selectors", "test_httpservers",
    "test_socketserver", "test_logging", "test_threading_local", "test_select", "test_poll",
    "test_epoll", "test_asyncio.test_server", "test_asyncio.test_streams",
    "test_asyncio.test_locks", "test_asyncio.test_queues", "test_asyncio.test_sock_lowlevel",
    "test_asyncio.test_taskgroups", "test_asyncio.test_pep492",
    "test_socket:BasicTCPTest:BasicUDPTest", "test_urllib2_localnet", "test_wsgiref",
    "test_contextlib",
]
DEFAULT_TIMEOUT_S = 900


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modules", default=",".join(DEFAULT_MODULES),
                   help="comma-separated CPython test modules, MODULE or MODULE:PATTERN:... "
                        "(test cases matching a pattern only) (default: %(default)s)")
    p.add_argument("--replays", type=int, default=3, help="replays of each recording")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds for one run of one module")
    p.add_argument("--stall-ms", type=int, default=30000,
                   help="a replay with no progress for this long is reported as a stall")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR,
                   help="folder for corpus.csv and corpus.md")
    p.add_argument("--keep", action="store_true", help="keep traces and outputs (printed)")


def _test_cmd(spec: str) -> list[str]:
    """`MODULE` or `MODULE:PATTERN:PATTERN...`: the patterns select test cases (regrtest's
    -m), for modules too big to run whole (test_socket)."""
    module, *patterns = spec.split(":")
    cmd = [sys.executable, "-m", "test", "-u", "network", "--timeout", "0", module]
    for pattern in patterns:
        cmd += ["-m", pattern]
    return cmd


def _run(cmd: list[str], work: str, name: str, timeout: float) -> tuple[int, bytes, str, float]:
    """Run one command in `work`, its output kept in NAME.out/.err there (a pipe could fill up
    and block the program); (status, stdout, stderr, seconds). Every phase goes through here,
    each bounded by `timeout` (subprocess.TimeoutExpired past it).

    Every run starts in the same empty working folder with the same empty temporary folder
    (TMPDIR), one path each for all runs: replicas are on different hosts, each with its own
    /tmp, but these runs share one. Without it a replay diverged when its own pid's regrtest
    work folder (/tmp/test_python_worker_PID, pids are each replica's own) was left in /tmp by
    an earlier killed run and the recorded run's was not: mkdir failed only on one side, which
    warned (CI, test_sched 1/2). And regrtest lists its working folder before and after each
    test (a directory listing is not an input the shim records): when that folder held this
    command's own outputs (record.out, then replay0.out...), a replay allocated other objects
    than the recording, its thread pool's workers sat at other addresses, and shutdown joined
    them in another order (test_asyncio.test_streams, 1 replay in 3 diverged)."""
    out_path, err_path = os.path.join(work, name + ".out"), os.path.join(work, name + ".err")
    tmp, cwd = os.path.join(work, "tmp"), os.path.join(work, "cwd")
    for folder in (tmp, cwd):
        shutil.rmtree(folder, ignore_errors=True)
        os.mkdir(folder)
    env = dict(os.environ, TMPDIR=tmp)
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        rc = subprocess.run(cmd, stdout=out, stderr=err, cwd=cwd, env=env,
                            timeout=timeout).returncode
    seconds = time.monotonic() - t0
    with open(out_path, "rb") as f:
        stdout = f.read()
    with open(err_path, "rb") as f:
        stderr = f.read().decode(errors="replace")
    return rc, stdout, stderr, seconds


def _reason(rc: int, stdout: bytes, stderr: str, want_rc: int, want_out: bytes) -> str:
    """'' when the replay is identical, else why not, in one line."""
    for line in stderr.splitlines():
        if "DIVERGED" in line or "stall" in line.lower():
            return line.strip()[:300]
    if rc == EXIT_DIVERGED:
        return "diverged (exit 86)"
    if rc != want_rc:
        return f"exit {rc}, recorded {want_rc}"
    if stdout != want_out:
        n = next((i for i, (a, b) in enumerate(zip(stdout, want_out)) if a != b),
                 min(len(stdout), len(want_out)))
        return f"stdout differs at byte {n}"
    return ""


def measure(module: str, replays: int, work: str, timeout: float, stall_ms: int) -> dict:
    cmd = _test_cmd(module)
    trace = os.path.join(work, "trace")
    llft = [sys.executable, "-m", "llft"]
    row: dict = {"module": module}
    phase = "plain run"
    try:
        rc, _, _, plain_s = _run(cmd, work, "plain", timeout)
        row.update(plain_s=round(plain_s, 2), plain_exit=rc)
        phase = "record"
        rec_rc, rec_out, _, rec_s = _run(llft + ["record", "-q", "--trace", trace, "--"] + cmd,
                                         work, "record", timeout)
        with open(os.path.join(trace, TRACE_FILE), "rb") as f:
            entries, nbytes = orderinfo.split(f.read())
        row.update(record_s=round(rec_s, 2), record_exit=rec_rc,
                   overhead=round(rec_s / plain_s, 2) if plain_s else float("nan"),
                   entries=entries, trace_kb=round(nbytes / 1024))
        identical, reasons = 0, []
        for i in range(replays):
            phase = f"replay {i}"
            rc, out, err, _ = _run(llft + ["replay", "--stall-ms", str(stall_ms), "--trace", trace],
                                   work, f"replay{i}", timeout)
            why = _reason(rc, out, err, rec_rc, rec_out)
            identical += not why
            if why:
                reasons.append(why)
        row.update(identical=f"{identical}/{replays}", first_failure=reasons[0] if reasons else "")
    except subprocess.TimeoutExpired:
        row.update(first_failure=f"{phase} over {timeout:.0f} s")
    return row


COLUMNS = ["module", "plain_s", "plain_exit", "record_s", "record_exit", "overhead", "entries",
           "trace_kb", "identical", "first_failure"]


def run(args) -> int:
    modules = [m for m in args.modules.split(",") if m]
    table = report.Table("corpus", "CPython test modules: record once, replay "
                         f"{args.replays} times", COLUMNS)
    keep = tempfile.mkdtemp(prefix="llft-corpus-") if args.keep else None
    for module in modules:
        work = os.path.join(keep, module) if keep else tempfile.mkdtemp(prefix="llft-corpus-")
        os.makedirs(work, exist_ok=True)
        try:
            row = measure(module, args.replays, work, args.timeout, args.stall_ms)
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
        print(" | ".join(str(row.get(c, "")) for c in COLUMNS), flush=True)
        table.add(**{c: row.get(c, "") for c in COLUMNS})
    table.print()
    table.write_csv(args.results)
    report.write_markdown(
        args.results, "corpus", [table.markdown()],
        notes="identical: replays that exited like the recorded run and printed the same "
              "bytes; overhead: record wall time / plain wall time, measured in the same run.",
        command=report.command_of(args, add_arguments, "corpus"))
    if keep:
        print(f"traces and outputs kept in {keep}")
    ok = all(r.get("identical") == f"{args.replays}/{args.replays}" for r in table.rows)
    return 0 if ok else 1
