"""Where the event loop stood still: an opt-in tracer for the agent and the gateway.

A replica whose event loop stops for longer than its peers' detector timeout (100 ms by
default) is declared dead while it is alive. `event loop woke N ms late` in the log says
that it happened; with `LLFT_STALL_TRACE=<ms>` in the environment a helper thread also
says where: it asks the loop to run a marker every few milliseconds, and when the marker
has not run after <ms> it logs the loop thread's Python stack (once per stall). Off by
default: the marker wakes the loop ~50 times a second.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback

ENV = "LLFT_STALL_TRACE"
PERIOD_S = 0.02


def start_from_env(loop: asyncio.AbstractEventLoop, log: logging.Logger) -> bool:
    """Start the tracer if LLFT_STALL_TRACE names a threshold in ms; True if started."""
    raw = os.environ.get(ENV, "")
    try:
        threshold_ms = float(raw) if raw else 0.0
    except ValueError:
        log.warning(f"{ENV}={raw!r} is not a number of milliseconds: no stall tracing")
        return False
    if threshold_ms <= 0:
        return False
    tid = threading.get_ident()                 # called on the loop's thread
    threading.Thread(target=_trace, args=(loop, tid, threshold_ms / 1000, log),
                     name="llft-stall-trace", daemon=True).start()
    return True


def _trace(loop, tid: int, threshold_s: float, log: logging.Logger) -> None:
    while not loop.is_closed():
        ran = threading.Event()
        try:
            loop.call_soon_threadsafe(ran.set)
        except RuntimeError:
            return                              # the loop closed
        if not ran.wait(threshold_s):
            frame = sys._current_frames().get(tid)
            where = "".join(traceback.format_stack(frame)) if frame else "(no frame)\n"
            log.info(f"event loop busy for more than {threshold_s * 1000:.0f} ms, in:\n"
                     + where.rstrip())
            ran.wait()
        time.sleep(PERIOD_S)


def thread_times() -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for one) of the calling thread since it
    started (/proc/thread-self/schedstat); None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run_ns, wait_ns = f.read().split()[:2]
        return int(run_ns), int(wait_ns)
    except (OSError, ValueError):
        return None


def stood_still(elapsed_s: float, before: tuple[int, int] | None,
                after: tuple[int, int] | None) -> str:
    """What the loop's thread did over `elapsed_s` between two `thread_times` readings:
    ran, waited for a CPU (a busy machine, or the VM's CPU taken away), or neither
    (blocked: a disk, a page fault, a lock; or simply asleep, as a loop between events
    is). An agent that stood still 1.5 s, every thread of it, left only "woke 1495 ms
    late" to go by (docs/RELIABILITY.md, "Sessions and the CPU"); "" without readings."""
    if before is None or after is None:
        return ""
    ran = max(0, after[0] - before[0]) / 1e6
    waited = max(0, after[1] - before[1]) / 1e6
    rest = max(0.0, elapsed_s * 1000 - ran - waited)
    return (f"in the last {elapsed_s * 1000:.0f} ms the loop's thread ran {ran:.0f} ms, "
            f"waited {waited:.0f} ms for a CPU and was off a CPU otherwise {rest:.0f} ms "
            "(asleep, or blocked on a disk, a page fault or a lock)")
