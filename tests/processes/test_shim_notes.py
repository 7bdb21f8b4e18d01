"""The shim notes what the app does to other processes (native/shim_process.c): every
signal it sends with kill/killpg, before it is sent, and every child it reaps with
waitpid, with the child's real wait status; and the programs the app starts (given
libllft_notes.so by the shim's exec hooks) note the signals they send. The agent reads
them when a child of the app dies (llft/runtime/proctree.py ChildWatch.failure): a child
the app killed, itself or through a program it ran, is its own doing; one killed from
outside is this machine's failure. A signal a program's handler received is noted too
(a JVM exits with status 143 after its shutdown on SIGTERM)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from determinizer.runner import shim_env, spawn
from determinizer.shm import Shm


@contextlib.contextmanager
def _run_noted(code: str, tmp_path):
    """`code` run to its end as an app under the shim, with a shared block drained as
    an agent does (the ring must not fill): the block, and the app's output lines."""
    shm = Shm.create(Shm.PRIMARY)
    try:
        env = shim_env({k: v for k, v in os.environ.items() if not k.startswith("LLFT_")},
                       shm.env())
        proc = spawn([sys.executable, "-c", code], env, cwd=str(tmp_path),
                     stdout=subprocess.PIPE)
        while proc.poll() is None:
            shm.drain(timeout_ms=50)
        lines = proc.stdout.read().decode().splitlines()
        assert proc.returncode == 0, lines
        yield shm, lines
    finally:
        shm.close()


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
# through the programs it runs: a shell's kill, a child that kills itself (started with
# a copy of os.environ, as a PySpark driver starts its JVM), one that raises a signal,
# one that kills a process group
d = subprocess.Popen(sleeper)
subprocess.run(["sh", "-c", f"kill -TERM {d.pid}"], check=True); d.wait()
e = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"],
                     env=dict(os.environ)); e.wait()
f = subprocess.Popen([sys.executable, "-c", "import signal; signal.raise_signal(15)"]); f.wait()
g = subprocess.Popen(sleeper, start_new_session=True)
subprocess.run([sys.executable, "-c", f"import os; os.killpg({g.pid}, 10)"], check=True)
g.wait()
print(d.pid, e.pid, f.pid, g.pid, d.returncode, e.returncode, f.returncode, g.returncode,
      flush=True)
print(sorted(k for k in os.environ if k.startswith("LLFT_") or "libllft" in os.environ[k]))
# parent-death signals asked for: by a fork of the app before its exec, by a program
import ctypes
h = subprocess.Popen(sleeper, preexec_fn=lambda: ctypes.CDLL(None).prctl(1, 15))
i = subprocess.Popen([sys.executable, "-c", "import ctypes; ctypes.CDLL(None).prctl(1, 12)"])
i.wait(); h.kill(); h.wait()
print(h.pid, i.pid, flush=True)
# a program that handles SIGTERM (a JVM's shutdown): what its handler received is noted
j = subprocess.Popen([sys.executable, "-c", "import os, signal, sys\n"
                      "signal.signal(15, lambda *a: os._exit(143))\n"
                      "print(flush=True); sys.stdin.readline()"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
j.stdout.readline(); j.terminate()
print(j.pid, j.wait(), flush=True)
"""


def test_the_shim_notes_the_signals_sent_and_the_children_reaped(tmp_path):
    with _run_noted(APP, tmp_path) as (shm, lines):
        assert shm.active_pid, "the shim did not activate"
        a, b, c, me = map(int, lines[0].split())
        d, e, f, g, *codes = map(int, lines[1].split())
        assert codes == [-signal.SIGTERM, -signal.SIGKILL, -signal.SIGTERM, -signal.SIGUSR1]
        assert lines[2] == "[]", "the app's own environment shows llft"
        h, i = map(int, lines[3].split())
        j, status = map(int, lines[4].split())
        assert sorted(shm.signals_sent()) == sorted(
            [(a, signal.SIGKILL), (-b, signal.SIGTERM), (c, signal.SIGTERM),
             (d, signal.SIGTERM), (e, signal.SIGKILL), (f, signal.SIGTERM),
             (-g, signal.SIGUSR1), (h, signal.SIGTERM), (i, signal.SIGUSR2),
             (h, signal.SIGKILL), (j, signal.SIGTERM)])
        assert status == 143 and shm.signals_received() == [(j, signal.SIGTERM)]
        assert all(t != me for t, _ in shm.signals_sent())
        assert shm.signals_sent_count == len(shm.signals_sent()) < Shm.NOTE_SLOTS
        # the reaps after the first `seen` only: the latest one, then none
        n, all_reaped = shm.reaped_since(0)
        assert shm.reaped_since(n - 1) == (n, all_reaped[-1:]) and shm.reaped_since(n) == (n, [])
        reaped = shm.children_reaped()
        assert {k: v & 0x7F for k, v in reaped.items() if k in (a, b, c)} == {
            a: signal.SIGKILL, b: signal.SIGTERM, c: signal.SIGTERM}



# The other ways to start a program and to signal one: system(), the execl family (glibc
# calls its execve internally, past the hooks), a program that starts its own with a clean
# environment (`env -i`), pidfd_send_signal (CPython makes the system call through
# syscall()), tgkill and a raw tkill of a thread other than the process's first.
OTHER_WAYS = r"""
import ctypes, os, signal, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
def sh_kill(pid):
    return f"kill -TERM {pid}".encode()
k = subprocess.Popen(sleeper)
assert os.system(sh_kill(k.pid).decode()) == 0; k.wait()
l = subprocess.Popen(sleeper)
subprocess.run(["env", "-i", "/bin/sh", "-c", sh_kill(l.pid).decode()], check=True); l.wait()
# a fork of the app that execs with execle and an empty environment (a preexec_fn that
# never returns: Popen takes the exec as its own)
m = subprocess.Popen(sleeper)
empty = (ctypes.c_char_p * 1)(None)
subprocess.Popen(["true"], preexec_fn=lambda: libc.execle(
    b"/bin/sh", b"sh", b"-c", sh_kill(m.pid), None, empty)).wait()
m.wait()
# a program that does the same with execl and execlp
n = subprocess.Popen(sleeper)
o = subprocess.Popen(sleeper)
subprocess.run([sys.executable, "-c", "import ctypes; l = ctypes.CDLL(None)\n"
                f"if l.fork() == 0: l.execlp(b'sh', b'sh', b'-c', {sh_kill(o.pid)!r}, None)\n"
                f"l.execl(b'/bin/sh', b'sh', b'-c', {sh_kill(n.pid)!r}, None)"], check=True)
n.wait(); o.wait()
# the app's own pidfd_send_signal, a program's tgkill and a raw tkill of a second thread
p = subprocess.Popen(sleeper)
signal.pidfd_send_signal(os.pidfd_open(p.pid), signal.SIGTERM); p.wait()
q = subprocess.Popen(sleeper)
subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL(None).tgkill({q.pid}, {q.pid}, 15)"],
               check=True); q.wait()
r = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                      "t = threading.Thread(target=time.sleep, args=(60,), daemon=True); t.start()\n"
                      "print(t.native_id, flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
tid = int(r.stdout.readline())
subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL(None).syscall(200, {tid}, 15)"],
               check=True); r.wait()
print(k.pid, l.pid, m.pid, n.pid, o.pid, p.pid, q.pid, r.pid, tid, flush=True)
print(k.returncode, l.returncode, m.returncode, n.returncode, o.returncode, p.returncode,
      q.returncode, r.returncode, flush=True)
print(sorted(k for k in os.environ if k.startswith("LLFT_") or "libllft" in os.environ[k]))
"""


def test_the_other_ways_to_start_a_program_or_signal_one_are_noted(tmp_path):
    with _run_noted(OTHER_WAYS, tmp_path) as (shm, lines):
        pids = list(map(int, lines[0].split()))
        *targets, tid = pids
        assert tid != targets[-1], "the thread signalled is the process's first"
        assert list(map(int, lines[1].split())) == [-signal.SIGTERM] * len(targets)
        assert lines[2] == "[]", "the app's own environment shows llft"
        sent = shm.signals_sent()
        assert [t for t in targets if (t, signal.SIGTERM) not in sent] == [], sent
        assert all(t != tid for t, _ in sent), "a thread's id noted, not its process's"



# The processes the app's programs reap, each way a program reaps: a shell's `wait` of a
# job killed the moment it started, os.wait, os.waitid and os.wait4 in a Python program.
PROGRAMS_REAP = r"""
import os, subprocess, sys
a = int(subprocess.run(["sh", "-c", "sleep 60 & echo $!; kill -KILL $!; wait $!; true"],
                       check=True, capture_output=True).stdout)
REAPER = '''
import os, signal, sys
b = os.fork()
if b == 0: os._exit(3)
assert os.wait() == (b, 3 << 8)
c = os.fork()
if c == 0: signal.pause()
os.kill(c, signal.SIGTERM)
assert os.waitid(os.P_PID, c, os.WEXITED).si_status == signal.SIGTERM
d = os.fork()
if d == 0: os._exit(5)
assert os.wait4(d, 0)[:2] == (d, 5 << 8)
print(b, c, d)
'''
b, c, d = map(int, subprocess.run([sys.executable, "-c", REAPER], check=True,
                                  capture_output=True).stdout.split())
print(a, b, c, d, flush=True)
"""


def test_the_processes_the_apps_programs_reap_are_noted(tmp_path):
    """The agent watches the app's grandchildren too (a program behind a shell or a
    launcher); the one its parent reaped the moment it died is known from the note."""
    with _run_noted(PROGRAMS_REAP, tmp_path) as (shm, lines):
        a, b, c, d = map(int, lines[0].split())
        reaped = shm.children_reaped()
        assert {k: reaped.get(k) for k in (a, b, c, d)} == {
            a: signal.SIGKILL, b: 3 << 8, c: signal.SIGTERM, d: 5 << 8}, reaped

