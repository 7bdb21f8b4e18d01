"""The shim notes what the app does to other processes (native/shim_process.c): every
signal it sends with kill/killpg, before it is sent, and every child it reaps with
waitpid, with the child's real wait status. The agent reads them when a child of the
app dies (llft/runtime/proctree.py ChildWatch.failure): a child the app killed is its
own doing, one killed from outside is this machine's failure."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from determinizer.runner import shim_env, spawn
from determinizer.shm import Shm

APP = r"""
import os, signal, subprocess, sys
sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
a = subprocess.Popen(sleeper)
b = subprocess.Popen(sleeper, start_new_session=True)
c = subprocess.Popen(sleeper)
a.kill(); a.wait()                          # kill(a, SIGKILL), then waitpid
os.killpg(b.pid, signal.SIGTERM); b.wait()  # killpg: kill(-b, SIGTERM)
os.kill(c.pid, 0)                           # a probe: no signal sent
os.kill(os.getpid(), 0)
c.terminate(); c.wait()
print(a.pid, b.pid, c.pid, os.getpid(), flush=True)
"""


def test_the_shim_notes_the_signals_sent_and_the_children_reaped(tmp_path):
    shm = Shm.create(Shm.PRIMARY)
    try:
        env = shim_env({k: v for k, v in os.environ.items() if not k.startswith("LLFT_")},
                       shm.env())
        proc = spawn([sys.executable, "-c", APP], env, cwd=str(tmp_path),
                     stdout=subprocess.PIPE)
        while proc.poll() is None:          # the agent's drain (the ring must not fill)
            shm.drain(timeout_ms=50)
        out = proc.stdout.read().decode().split()
        assert proc.returncode == 0, out
        assert shm.active_pid, "the shim did not activate"
        a, b, c, me = map(int, out)
        assert sorted(shm.signals_sent()) == sorted(
            [(a, signal.SIGKILL), (-b, signal.SIGTERM), (c, signal.SIGTERM)])
        assert all(t != me for t, _ in shm.signals_sent())
        reaped = shm.children_reaped()
        assert {k: v & 0x7F for k, v in reaped.items() if k in (a, b, c)} == {
            a: signal.SIGKILL, b: signal.SIGTERM, c: signal.SIGTERM}
    finally:
        shm.close()
