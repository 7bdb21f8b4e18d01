"""Where one request's time goes, untraced: an opt-in recorder of moments ("marks").

With `LLFT_MARKS_DIR=<folder>` in the environment, `llft run` and `llft gateway` wrap
the few methods a request crosses on its way (below, `POINTS`) so that each call
records `(tag, CLOCK_MONOTONIC ns, size, kernel arrival ns)` in memory, and write what
they recorded to `<folder>/<name>-<pid>.marks` at SIGUSR2 (`llft bench profile --marks`
sends it after the load and chains the marks of all processes into one request's path:
llft/bench/hops.py). Off by default: without the variable nothing is wrapped and the
signal keeps its default action.

Why not `perf trace` (`--hops`): tracing every system call made each one tens of µs
slower, so its hops could only be read against each other. A mark costs a Python call
(~0.4 µs), and every process reads the same monotonic clock (`time.perf_counter_ns`),
so a datagram's hop from its sender's `sendto` to the receiver's loop is measured
directly, split by the kernel's own arrival stamp (the one the transport already reads
for the failure detector) into delivery and wake-up.
"""
from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import os
import signal
import time

from llft.runtime import profiling

ENV = "LLFT_MARKS_DIR"
MAX_MARKS = 500_000         # kept between two writes (~50 MB); later ones are not recorded

# (module, class, method) -> (tag at entry, tag at return, the size it records)
#   size: "data" -- len() of the argument named so; None -- 0
POINTS: dict[tuple[str, str, str], tuple[str | None, str | None, str | None]] = {
    # a datagram read (and its kernel arrival, `at_us`) / a datagram sent
    ("llft.runtime.transport", "Endpoint", "_process"): ("in", None, "data"),
    ("llft.runtime.transport", "Endpoint", "_sendto"): ("out", None, "data"),
    # a replica's protocol cores on one message
    ("llft.replica.node", "ReplicaNode", "handle_message"): ("core", "core_end", None),
    # the agent: bytes written to its app, the app's output read
    ("llft.runtime.agent", "Agent", "_feed_app"): (None, "app_w", None),
    ("llft.runtime.agent", "Agent", "_app_output"): ("app_r", None, "data"),
    # the gateway: a client's bytes read, bytes written to a client
    ("llft.runtime.gateway", "ClientSocket", "data"): ("client_r", None, "data"),
    ("llft.runtime.gateway", "Gateway", "_to_client"): (None, "client_w", "data"),
}

_marks: list[tuple[str, int, int, int]] = []


def _wrap(fn, enter: str | None, leave: str | None, size_arg: str | None):
    """`fn` recording `enter` before and `leave` after each call (its size from the
    argument `size_arg`, its kernel arrival from `at_us`, where it has them)."""
    params = list(inspect.signature(fn).parameters)
    si = params.index(size_arg) if size_arg in params else None
    ai = params.index("at_us") if "at_us" in params else None
    add, now = _marks.append, time.perf_counter_ns

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if len(_marks) >= MAX_MARKS:
            return fn(*args, **kwargs)
        size = len(args[si]) if si is not None and si < len(args) else 0
        if enter is not None:
            at = args[ai] if ai is not None and ai < len(args) else kwargs.get("at_us")
            add((enter, now(), size, at * 1000 if at else 0))
        try:
            return fn(*args, **kwargs)
        finally:
            if leave is not None:
                add((leave, now(), size, 0))
    return wrapper


def install(points=POINTS) -> None:
    for (mod, cls, meth), (enter, leave, size_arg) in points.items():
        owner = getattr(importlib.import_module(mod), cls)
        setattr(owner, meth, _wrap(getattr(owner, meth), enter, leave, size_arg))


def dump(path: str) -> None:
    """Append what was recorded to `path` (a line per mark) and forget it."""
    lines = "".join(f"{t} {ns} {size} {at}\n" for t, ns, size, at in _marks)
    _marks.clear()
    with open(path, "a") as f:
        f.write(lines)


def start_from_env(loop: asyncio.AbstractEventLoop, log: logging.Logger, name: str) -> bool:
    """Wrap `POINTS` and install the SIGUSR2 handler if LLFT_MARKS_DIR is set; True if
    so. Called before the process handles its first message."""
    folder = profiling.folder_from_env(ENV, log, "marks")
    if folder is None:
        return False
    install()
    path = os.path.join(folder, f"{name}-{os.getpid()}.marks")

    def write() -> None:
        try:
            dump(path)
        except OSError as e:
            log.warning(f"cannot write the marks {path}: {e}")

    loop.add_signal_handler(signal.SIGUSR2, write)
    return True


def read(path: str) -> list[tuple[str, int, int, int]]:
    """The marks a process wrote: (tag, ns, size, kernel arrival ns or 0)."""
    out = []
    with open(path) as f:
        for line in f:
            t, ns, size, at = line.split()
            out.append((t, int(ns), int(size), int(at)))
    return out
