"""`llft record` and `llft replay`: local record and replay of an unmodified program.

    llft record --trace DIR [--external-port P]... -- CMD...
        runs CMD as a primary would: every determinized call's order information is
        drained from the shim and stored in DIR/orderinfo.bin, with DIR/meta.json
        (command, environment, cwd, exit status). Data read from external
        connections is part of the order information.
    llft replay --trace DIR [-- CMD...]
        runs CMD (default: the recorded one) as a backup would, with the recorded
        environment, fed from DIR through the same Feeder a backup uses when fed from
        the network. External connections are never opened: their results come from
        the trace. A call the trace does not have next is reported as a divergence
        naming the first differing call (exit status 86); a wait with no progress is
        reported as a stall, never a hang.

A trace is one source of order information; the network is another. The only code
specific to traces here is reading and writing files.

Stopping a recording. The recorder waits for CMD the way `time` does: Ctrl-C (SIGINT, and
SIGQUIT) reaches CMD from the terminal and CMD decides; the recorder ignores them, so it
goes on draining until CMD has exited and then completes the trace. SIGTERM and SIGHUP
sent to the recorder are passed on to CMD, with the same ending. (Until 2026-11-30 Ctrl-C
stopped the recorder with CMD, exit 130, and the trace had no meta.json: `llft replay`
failed on it with a traceback.) meta.json is written when CMD starts (`complete`: false)
and again when it exits: a recorder that was killed leaves a trace that replays up to
where it was drained (then a stall is reported, or `--promote` continues live).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from determinizer.grpcrelay import Relay, relay_env
from determinizer.orderinfo import split
from determinizer.runner import shim_env, spawn
from determinizer.shm import Shm
from native import _llft_shm

EXIT_DIVERGED = _llft_shm.lib.LLFT_EXIT_DIVERGED
TRACE_FILE = "orderinfo.bin"
META_FILE = "meta.json"
FEED_CHUNK_BYTES = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace directory")
    parser.add_argument("--external-port", type=int, action="append", default=[],
                        help="(record) a loopback port whose server is outside the replica")
    parser.add_argument("--stall-ms", type=int, default=10000,
                        help="(replay) report a stall after this long without progress")
    parser.add_argument("--promote", action="store_true",
                        help="(replay) when the trace is consumed, continue as a primary")
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD...")


def run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args._command == "record":
        if not cmd:
            print("llft record: no command (use: llft record --trace DIR -- CMD...)", file=sys.stderr)
            return 2
        return record(cmd, args.trace, external_ports=args.external_port, quiet=args.quiet)
    try:
        return replay(cmd or None, args.trace, stall_ms=args.stall_ms, promote=args.promote,
                      quiet=args.quiet)
    except TraceError as e:
        print(f"llft replay: {e}", file=sys.stderr)
        return 2


def record(cmd: list[str], trace: str, external_ports=(), env=None, cwd=None, quiet=False,
           **popen_kw) -> int:
    os.makedirs(trace, exist_ok=True)
    env = dict(os.environ if env is None else env)
    cwd = cwd or os.getcwd()
    shm = Shm.create(Shm.PRIMARY)
    relay = Relay()                 # the app's gRPC channels (grpcrelay/): the primary's calls
    env = relay_env(env, relay.address)
    t0 = time.monotonic()
    nbytes = 0
    meta = {"cmd": cmd, "env": env, "cwd": cwd, "returncode": None, "complete": False,
            "external_ports": list(external_ports)}
    write_meta(trace, meta)             # a killed recorder's trace still replays
    old_handlers = {}
    try:
        with open(os.path.join(trace, TRACE_FILE), "wb") as out:
            proc = spawn(cmd, shim_env(env, shm.env(), external_ports), cwd=cwd, **popen_kw)
            old_handlers = _wait_like_time(proc)
            # The drainer: the recorder's version of the agent's order-info pump.
            while proc.poll() is None:
                data = shm.drain(timeout_ms=50)
                if data:
                    out.write(data)
                    nbytes += len(data)
            while data := shm.drain(timeout_ms=0):
                out.write(data)
                nbytes += len(data)
        meta.update(returncode=proc.returncode, complete=True, bytes=nbytes,
                    stats=shm.stats(), active_pid=shm.active_pid,
                    seconds=round(time.monotonic() - t0, 3))
        write_meta(trace, meta)
        if not quiet:
            print(f"llft record: {meta['stats']['records']} entries, {nbytes} bytes, exit "
                  f"{proc.returncode}, shim {'active' if shm.active_pid else 'INACTIVE'}",
                  file=sys.stderr)
        return proc.returncode
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        relay.stop()
        shm.close()


def _wait_like_time(proc) -> dict:
    """While `proc` runs: SIGINT and SIGQUIT ignored (the terminal's reach `proc` too),
    SIGTERM and SIGHUP passed on to it. The handlers replaced, to restore after."""
    def pass_on(sig, _frame):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass                                    # exited meanwhile
    if threading.current_thread() is not threading.main_thread():
        return {}                                   # (a test's thread: signals are not ours)
    old = {}
    for sig, handler in ((signal.SIGINT, signal.SIG_IGN), (signal.SIGQUIT, signal.SIG_IGN),
                         (signal.SIGTERM, pass_on), (signal.SIGHUP, pass_on)):
        old[sig] = signal.signal(sig, handler)
    return old


def write_meta(trace: str, meta: dict) -> None:
    path = os.path.join(trace, META_FILE)
    with open(path + ".new", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(path + ".new", path)


class TraceError(Exception):
    """Not a trace `llft replay` can use (one line: what is wrong, what to do)."""


def load_meta(trace: str) -> dict:
    path = os.path.join(trace, META_FILE)
    try:
        with open(path) as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or not isinstance(meta.get("cmd"), list):
            raise ValueError("no command in it")
    except FileNotFoundError:
        what = "no such folder" if not os.path.isdir(trace) else f"no {META_FILE} in it"
        raise TraceError(f"{trace} is not a trace of `llft record` ({what})") from None
    except (OSError, ValueError) as e:
        raise TraceError(f"{path} is unreadable ({e}): record the trace again") from None
    if not os.path.exists(os.path.join(trace, TRACE_FILE)):
        raise TraceError(f"{trace} has no {TRACE_FILE}: record the trace again")
    return meta


def replay(cmd: list[str] | None, trace: str, stall_ms: int = 10000, promote: bool = False,
           quiet: bool = False, limit_entries: int | None = None,
           continued: bytearray | None = None, **popen_kw) -> int:
    """Run `cmd` (default: the recorded one) as a backup fed from `trace`; with
    `promote`, take over as a primary once the trace (or its first `limit_entries`) is
    consumed; the new primary's order info is appended to `continued` if given."""
    meta = load_meta(trace)
    cmd = cmd or meta["cmd"]
    shm = Shm.create(Shm.BACKUP, stall_ms=stall_ms)
    feeder = shm.feeder()
    feed_error: list[BaseException] = []

    def feed():
        try:
            with open(os.path.join(trace, TRACE_FILE), "rb") as f:
                if limit_entries is not None:
                    buf = f.read()
                    feeder.push(buf[:split(buf, max_entries=limit_entries)[1]])
                else:
                    while (chunk := f.read(FEED_CHUNK_BYTES)) and not feeder.stopped:
                        feeder.push(chunk)
            if promote:
                # a backup takes over only once it has consumed all it was given
                while feeder.consumed < feeder.fed_entries and not feeder.stopped:
                    time.sleep(0.002)
                shm.promote()
            else:
                feeder.done()
        except BaseException as e:  # reported by the main thread
            feed_error.append(e)

    try:
        proc = spawn(cmd, shim_env(meta["env"], shm.env()), cwd=meta["cwd"], **popen_kw)
        th = threading.Thread(target=feed, name="llft-feeder", daemon=True)
        th.start()
        if continued is None:
            continued = bytearray()
        while proc.poll() is None:
            if promote and shm.mode == Shm.PRIMARY:
                continued += shm.drain(timeout_ms=50)   # a new primary's order info
            else:
                time.sleep(0.01)
        if promote and shm.mode == Shm.PRIMARY:
            while chunk := shm.drain(timeout_ms=0):   # what it appended before it exited
                continued += chunk
        feeder.stopped = True
        th.join(timeout=5)
        if shm.diverged:
            if not quiet:
                print(f"llft replay: DIVERGED: {shm.report}", file=sys.stderr)
            return EXIT_DIVERGED
        if feed_error:
            print(f"llft replay: feeder failed: {feed_error[0]}", file=sys.stderr)
            return 1
        if not quiet:
            st = shm.stats()
            print(f"llft replay: {st['records']} entries replayed ({st['waits']} waits for a turn, "
                  f"{st['gil_drops']} with the GIL released), exit {proc.returncode} "
                  + (f"(recorded {meta['returncode']})" if meta.get("complete", True)
                     else "(the recording was cut short: its recorder was killed)"),
                  file=sys.stderr)
        return proc.returncode
    finally:
        shm.close()
