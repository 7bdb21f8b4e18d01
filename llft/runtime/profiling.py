"""Where a loaded agent's or gateway's event loop spends its time: an opt-in profiler.

With `LLFT_PROFILE_DIR=<folder>` in the environment, `llft run` and `llft gateway` start
cProfile on their event loop's thread at SIGUSR1 and write what it saw at SIGUSR2 to
`<folder>/<name>-<pid>.prof` (pstats format; `llft bench profile` sends the signals
around a steady load and reads the files). Off by default; without the variable the
signals keep their default action. Only the loop's thread is profiled (cProfile's way):
the native threads (pulse, drain watcher) hold no Python, and their CPU shows in
`/proc/PID/task/*/stat`, which the bench reads too.
"""
from __future__ import annotations

import asyncio
import cProfile
import logging
import os
import signal

ENV = "LLFT_PROFILE_DIR"


def folder_from_env(env: str, log: logging.Logger, what: str) -> str | None:
    """The folder a diagnostic writes to (`env` names it), or None: unset, or not a
    folder (said once in the log)."""
    folder = os.environ.get(env, "")
    if folder and not os.path.isdir(folder):
        log.warning(f"{env}={folder!r} is not a folder: no {what}")
        return None
    return folder or None


def start_from_env(loop: asyncio.AbstractEventLoop, log: logging.Logger, name: str) -> bool:
    """Install the SIGUSR1/SIGUSR2 handlers if LLFT_PROFILE_DIR is set; True if so."""
    folder = folder_from_env(ENV, log, "profiling")
    if folder is None:
        return False
    prof = cProfile.Profile()
    path = os.path.join(folder, f"{name}-{os.getpid()}.prof")

    def start() -> None:
        prof.enable()

    def stop() -> None:
        prof.disable()
        try:
            prof.dump_stats(path)
        except OSError as e:
            log.warning(f"cannot write the profile {path}: {e}")

    loop.add_signal_handler(signal.SIGUSR1, start)
    loop.add_signal_handler(signal.SIGUSR2, stop)
    return True
