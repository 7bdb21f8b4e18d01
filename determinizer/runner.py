"""Start an unmodified command under the preload shim, as a primary or as a backup.

The same function serves `llft record`, `llft replay` and the replica runtime:
- LD_PRELOAD=libllft_preload.so, LLFT_SHM, and LLFT_ROOT_PID = the child's own pid
  (set in the child between fork and exec; the shim activates only in that process
  and only once it is a CPython interpreter, so bash wrappers such as pyenv's
  `python3` that exec the interpreter pass it on untouched);
- ASLR off (personality ADDR_NO_RANDOMIZE): ids and addresses the app may print are
  the same at every replica;
- an environment given explicitly (a backup uses the primary's, recorded), so that the
  app's os.environ is identical everywhere: the shim removes its own variables before
  the interpreter copies `environ`.
"""
from __future__ import annotations

import ctypes
import os
import subprocess

from native import shim_path

ADDR_NO_RANDOMIZE = 0x0040000
_libc = ctypes.CDLL(None, use_errno=True)


def shim_env(base: dict[str, str], shm_env: dict[str, str], external_ports=()) -> dict[str, str]:
    env = dict(base)
    pre = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = shim_path() + (":" + pre if pre else "")
    env.update(shm_env)
    # PySpark's default (pinned-thread) py4j ClientServer frees Java objects from a
    # FinalizerWorker thread that polls a deque the main thread appends to without a
    # lock: whether a poll finds work is decided by GIL hand-offs, which no replica can
    # replay. The classic py4j gateway frees them synchronously in the thread that drops
    # the last reference (deterministic). An app that sets the variable itself keeps it.
    env.setdefault("PYSPARK_PIN_THREAD", "false")
    if external_ports:
        env["LLFT_EXTERNAL_PORTS"] = ",".join(str(p) for p in external_ports)
    return env


PR_SET_PDEATHSIG = 1


def spawn(cmd: list[str], env: dict[str, str], cwd: str | None = None,
          death_signal: int = 0, nice: int = 0, **popen_kw) -> subprocess.Popen:
    """Popen `cmd` with exactly `env` plus LLFT_ROOT_PID=<its pid>, ASLR off; with
    `death_signal`, the child gets that signal when the spawning thread dies (the
    replica agent: the app never outlives its agent); `nice` lowers its CPU priority."""
    items = [(k.encode(), v.encode()) for k, v in env.items()]

    def child_setup():  # runs in the child, between fork and exec
        _libc.personality(ADDR_NO_RANDOMIZE)
        if nice:
            os.nice(nice)
        if death_signal:
            _libc.prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        os.environ.clear()                       # unsetenv each: the C environ is emptied
        for k, v in items:
            os.putenv(k, v)
        os.putenv(b"LLFT_ROOT_PID", str(os.getpid()).encode())

    return subprocess.Popen(cmd, cwd=cwd, preexec_fn=child_setup, **popen_kw)
