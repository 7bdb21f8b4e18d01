"""Start an unmodified command under the preload shim, as a primary or as a backup.

The same function serves `llft record`, `llft replay` and the replica runtime:
- LD_PRELOAD=libllft_preload.so, LLFT_SHM, and LLFT_PARENT_PID; the shim's constructor
  in the child sets LLFT_ROOT_PID = its own pid (the shim activates only in that process
  and only once it is a CPython interpreter, so bash wrappers such as pyenv's `python3`
  that exec the interpreter pass it on untouched);
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
_libc.personality.argtypes = [ctypes.c_ulong]
_libc.personality.restype = ctypes.c_int


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


PERSONALITY_QUERY = 0xFFFFFFFF


def spawn(cmd: list[str], env: dict[str, str], cwd: str | None = None,
          death_signal: int = 0, nice: int = 0, policy: int | None = None,
          **popen_kw) -> subprocess.Popen:
    """Popen `cmd` with exactly `env`, ASLR off; with `death_signal`, the child gets that
    signal when the spawning thread dies (the replica agent: the app never outlives its
    agent); `nice` lowers its CPU priority; `policy` (os.SCHED_*) is its scheduling
    policy when not the spawning thread's.

    No Python runs between fork and exec, so Popen vforks: the caller (the agent's event
    loop) waits ~1 ms. With a `preexec_fn` it forked the whole agent and ran Python in
    the child, and on a busy machine that held the loop for 100-500 ms, long enough for
    the group to call the agent dead. The child's part happens elsewhere: ASLR is a
    personality flag of the spawning thread that the child inherits (set around the
    call); the shim's constructor names the child the root process and asks for the
    death signal (native/shim_core.c `root_setup`); the nice value and the policy are
    applied from here once the child exists (its threads start later and inherit them)."""
    env = {**env, "LLFT_PARENT_PID": str(os.getpid())}
    if death_signal:
        env["LLFT_DEATH_SIGNAL"] = str(int(death_signal))
    old = _libc.personality(PERSONALITY_QUERY)
    _libc.personality(old | ADDR_NO_RANDOMIZE)
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, **popen_kw)
    finally:
        _libc.personality(old)
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid,
                           min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
        except ProcessLookupError:
            pass                                  # gone already: its exit status says why
    if policy is not None:
        try:
            os.sched_setscheduler(proc.pid, policy, os.sched_param(0))
        except ProcessLookupError:
            pass
    return proc
