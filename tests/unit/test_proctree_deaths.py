"""How the agent tells a death from an app's own doing (llft/runtime/proctree.py).

`ExitWatch`: a process is dying only once every thread of it is (PF_EXITING); the agent
asks it when its app's sockets end (`_app_closed`): a dying app's ends are its death's,
a live app's are closes it made. `ChildWatch`: a child of the app taken by the kernel's
OOM killer (a real one: a memory cgroup around it) or killed from outside the app is told
from one that exited, crashed or that the app killed itself.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from llft.tools import memcgroup
from llft.runtime import proctree
from polling import wait_for

SLEEPER = [sys.executable, "-c", "import sys; sys.stdin.readline()"]


def test_a_running_process_is_not_exiting():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        w = proctree.ExitWatch(p.pid)
        assert not w.exiting() and not w.exiting()      # (read again on its descriptor)
        w.close()
    finally:
        p.kill()
        p.wait()


def test_an_exited_process_is_exiting_until_reaped_and_after():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    w = proctree.ExitWatch(p.pid)
    w.exiting()                             # its stat file opened while it may run
    # not reaped yet: a zombie, its exit done (what the agent sees between the kernel
    # closing the app's sockets and its wait thread reaping it)
    wait_for(lambda: open(f"/proc/{p.pid}/stat").read().rpartition(")")[2].split()[0] == "Z",
             "the child is a zombie", 30, 0.01)
    assert w.exiting()
    p.wait()
    assert w.exiting()                      # reaped: its descriptor reads nothing now
    assert proctree.ExitWatch(p.pid).exiting()      # and its pid names nothing


def test_a_main_thread_that_ended_alone_leaves_a_live_process():
    """A C program's main thread may end (pthread_exit) while others run on: the process
    lives, and its sockets' ends are still closes it makes."""
    code = ("import ctypes, threading, time\n"
            "threading.Thread(target=lambda: time.sleep(60)).start()\n"
            "print('started', flush=True)\n"
            "ctypes.CDLL(None).pthread_exit(None)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"started"
        wait_for(lambda: proctree._task_exiting(f"/proc/{p.pid}/stat"),
                 "the main thread ended", 30, 0.01)
        assert not proctree.ExitWatch(p.pid).exiting()
    finally:
        p.kill()
        p.wait()


def test_no_descriptor_left_says_nothing():
    """An agent out of descriptors (a joiner under a low open-files limit, connecting a
    history's streams) cannot open the stat file: that is no news of a death (taken as
    one, the joiner's connector stopped and it never caught up)."""
    code = ("import os, resource\n"
            "from llft.runtime import proctree\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
            "fds = []\n"
            "try:\n"
            "    while True:\n"
            "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
            "except OSError:\n"
            "    pass\n"
            "print(proctree.ExitWatch(os.getpid()).exiting(),\n"
            "      proctree.ExitWatch(os.getppid()).exiting())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def _parent_of(child_argv: list[str], reap: bool = False) -> tuple[subprocess.Popen, int]:
    """A process (the app) that starts `child_argv`, then at each line it reads: tells
    the child to go on, then (`reap`) reaps it and prints its wait status. (The
    child's pid.)"""
    code = ("import os, subprocess, sys\n"
            f"c = subprocess.Popen({child_argv!r}, stdin=subprocess.PIPE)\n"
            "print(c.pid, flush=True)\n"
            "sys.stdin.readline()\n"
            "try:\n"
            "    c.stdin.write(b'go\\n'); c.stdin.flush()\n"
            "except BrokenPipeError:\n"
            "    pass\n"
            "sys.stdin.readline()\n"
            "print(os.waitpid(c.pid, 0)[1], flush=True)\n"
            "sys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    return p, int(p.stdout.readline())


class _Notes:
    """What the shim and the notes library would have noted (determinizer/shm.py Shm's
    readers), in rings of NOTE_SLOTS: `lost` signals sent were written over."""
    NOTE_SLOTS = 4

    def __init__(self, sent: list[tuple[int, int]], received=()):
        self.sent, self.reaped, self.received = sent, {}, list(received)
        self.lost = 0

    @property
    def signals_sent_count(self) -> int:
        return self.lost + len(self.sent)

    def signals_received(self) -> list[tuple[int, int]]:
        return self.received

    def received_since(self, seen: int) -> tuple[int, list[tuple[int, int]]]:
        return len(self.received), self.received[seen:]

    def signals_sent(self) -> list[tuple[int, int]]:
        return self.sent

    def children_reaped(self) -> dict[int, int]:
        return self.reaped

    def reaped_since(self, seen: int) -> tuple[int, list[tuple[int, int]]]:
        return len(self.reaped), list(self.reaped.items())[seen:]


def _judge(child_argv, act, sent=(), reap: bool = False, received=()) -> str | None:
    """Watch the parent's children, `act(child)`, wait for the exit: the verdict, the
    app having sent the signals `sent` ((target, signal); None: unknown), the child's
    handler having received `received` (signals), and (`reap`) after the parent reaped
    the child, its status told as the shim tells it."""
    parent, child = _parent_of(child_argv)
    notes = None if sent is None else _Notes(
        [(child if t == "child" else t, s) for t, s in sent], [(child, s) for s in received])
    w = proctree.ChildWatch(parent.pid, notes)
    try:
        assert [c for c, _ in w.scan()] == [child] and w.scan() == []
        assert w.dying() == [] and w.exited() == []
        act(child)
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        w.wait_exit(child, 30)
        assert w.exited() == [child] == w.dying()
        if reap:
            parent.stdin.write(b"reap\n")
            parent.stdin.flush()
            status = int(parent.stdout.readline())
            assert proctree._exit_status(child) is None     # (it is gone from /proc)
            if notes is not None:
                notes.reaped[child] = status
                assert w.may_fail(child) == (w._ended_by(child, status)
                                             in proctree.SENT_SIGNALS)
        return w.failure(child)
    finally:
        w.close()
        parent.kill()
        parent.wait()


def test_a_child_that_exits_is_no_failure():
    assert _judge(SLEEPER, lambda child: None) is None
    assert _judge(SLEEPER, lambda child: None, reap=True) is None


def test_a_child_killed_from_outside_the_app_is_a_failure():
    """An operator's `kill -9` of a driver's JVM, a supervisor's SIGTERM: not the app's
    doing, and only this replica's. Told also once the app reaped the child."""
    kill9 = lambda child: os.kill(child, signal.SIGKILL)    # noqa: E731
    assert _judge(SLEEPER, kill9) == "SIGKILL from outside the application"
    assert _judge(SLEEPER, kill9, reap=True) == "SIGKILL from outside the application"
    assert _judge(SLEEPER, lambda child: os.kill(child, signal.SIGTERM),
                  sent=[("child", signal.SIGKILL)]) == "SIGTERM from outside the application"


# a program that handles SIGTERM as a JVM does: its shutdown, then exit status 143
TERM_HANDLER = [sys.executable, "-c", "import os, signal, sys\n"
                "signal.signal(signal.SIGTERM, lambda *a: os._exit(143))\n"
                "sys.stdin.readline(); sys.stdin.readline()"]


def _term_when_handled(child: int) -> None:
    """SIGTERM to `child` once its handler is installed (SigCgt)."""
    def handles() -> bool:
        with open(f"/proc/{child}/status") as f:
            cgt = next(ln for ln in f if ln.startswith("SigCgt:")).split()[1]
        return bool(int(cgt, 16) & (1 << (signal.SIGTERM - 1)))
    wait_for(handles, "the child's SIGTERM handler", 30, 0.01)
    os.kill(child, signal.SIGTERM)


def test_a_child_that_handles_a_sigterm_from_outside_and_exits_is_a_failure():
    """A JVM given SIGTERM by an operator runs its shutdown hooks and exits with status
    143: its notes library saw the handler receive the signal, and the app did not send
    it. Without that note an exit with 143 is an exit; sent by the app, its own doing."""
    assert _judge(TERM_HANDLER, _term_when_handled,
                  received=[signal.SIGTERM]) == "SIGTERM from outside the application"
    assert _judge(TERM_HANDLER, _term_when_handled, received=[signal.SIGTERM],
                  reap=True) == "SIGTERM from outside the application"
    assert _judge(TERM_HANDLER, _term_when_handled) is None
    assert _judge(TERM_HANDLER, _term_when_handled, received=[signal.SIGTERM],
                  sent=[("child", signal.SIGTERM)]) is None


def test_children_told_to_stop_from_outside_are_judged_as_told():
    """The primary acts on SIGTERM or SIGINT from outside as the child's handler gets it
    (a JVM stops its SparkContext before it exits, and the app would see that first):
    a watched child's, once; not one the app sent, not SIGHUP (a reload, as often)."""
    parent, child = _parent_of(SLEEPER)
    notes = _Notes([(-4242, signal.SIGINT)])
    w = proctree.ChildWatch(parent.pid, notes)
    try:
        w.scan()
        notes.received += [(child, signal.SIGHUP), (31337, signal.SIGTERM)]
        assert w.stopped_from_outside() == []
        notes.received.append((child, signal.SIGTERM))
        assert w.stopped_from_outside() == [(child, "SIGTERM from outside the application")]
        assert w.stopped_from_outside() == []
        notes.sent.append((child, signal.SIGINT))
        notes.received.append((child, signal.SIGINT))
        assert w.stopped_from_outside() == []
    finally:
        w.close()
        parent.kill()
        parent.wait()


def test_a_child_the_app_killed_is_no_failure():
    """The app may kill its children itself (`subprocess.run(timeout=...)`): every
    replica does the same, and a takeover would not help. Its kill reaches the child,
    its process group or the app's own group (the shim notes each before it is sent)."""
    kill9 = lambda child: os.kill(child, signal.SIGKILL)    # noqa: E731
    assert _judge(SLEEPER, kill9, sent=[(123, 15), ("child", signal.SIGKILL)]) is None
    assert _judge(SLEEPER, kill9, sent=[(0, signal.SIGKILL)], reap=True) is None
    assert _judge(SLEEPER, kill9, sent=None) is None        # (no shim: only the OOM killer)


def test_children_reaped_before_they_were_watched_are_judged_from_the_notes():
    """A child younger than the agent's scan, reaped by the app at once (`subprocess.run`):
    only the shim's note of the reap says how it died. Each is judged once."""
    notes = _Notes([(0, signal.SIGTERM)])
    w = proctree.ChildWatch(os.getpid(), notes)
    notes.reaped.update({101: 0, 102: signal.SIGKILL, 103: 3 << 8, 104: signal.SIGTERM,
                         105: signal.SIGSEGV})
    assert w.reaped_unwatched() == [(102, "SIGKILL from outside the application")]
    assert w.reaped_unwatched() == []
    notes.reaped[106] = signal.SIGKILL
    assert w.reaped_unwatched() == [(106, "SIGKILL from outside the application")]
    w.close()


def test_a_kill_whose_note_may_be_written_over_is_taken_as_the_apps():
    """The shim keeps the app's latest NOTE_SLOTS signals sent: a kill not among them,
    with more sent since the child was first seen, may be the app's own (written
    over), and is taken as such and counted; with fewer, it is a failure."""
    notes = _Notes([])
    w = proctree.ChildWatch(os.getpid(), notes)
    try:
        notes.sent += [(999999, signal.SIGTERM)] * 4
        notes.reaped[101] = signal.SIGKILL                  # 4 sent since the scan: all kept
        assert w.reaped_unwatched() == [(101, "SIGKILL from outside the application")]
        notes.lost += 1                                     # 5 since the scan
        notes.reaped[102] = signal.SIGKILL
        assert w.reaped_unwatched() == [] and w.unsure == 1
        w.scan()                                            # counted from here again
        notes.reaped[103] = signal.SIGKILL
        assert w.reaped_unwatched() == [(103, "SIGKILL from outside the application")]
    finally:
        w.close()


def test_a_child_reaped_before_its_note_is_judged_again_from_the_note():
    """The app's waitpid returns a moment before the shim notes the reap: a watched
    child judged in that moment has no known end, and is judged once the note is there."""
    notes = _Notes([])
    parent, child = _parent_of(SLEEPER)
    w = proctree.ChildWatch(parent.pid, notes)
    try:
        w.scan()
        os.kill(child, signal.SIGKILL)
        parent.stdin.write(b"go\nreap\n")
        parent.stdin.flush()
        status = int(parent.stdout.readline())
        assert w.exited() == [child] and w.failure(child) is None     # no note yet
        notes.reaped[child] = status
        assert w.reaped_unwatched() == [(child, "SIGKILL from outside the application")]
    finally:
        w.close()
        parent.kill()
        parent.wait()


def test_a_child_that_crashes_is_no_failure():
    """A crash (SIGSEGV, SIGABRT) may be the app's input's doing at every replica: the
    app sees it, as it would without llft."""
    crash = [sys.executable, "-c", "import os, sys; sys.stdin.readline(); os.abort()"]
    assert _judge(crash, lambda child: None) is None


@pytest.mark.skipif(memcgroup.why_not() is not None, reason=str(memcgroup.why_not()))
def test_a_child_the_oom_killer_took_is_a_failure():
    hog = [sys.executable, "-c", "import sys; sys.stdin.readline(); kept = b'1' * (200 << 20)"]
    for reap in (False, True):
        with memcgroup.MemoryCgroup(64 << 20) as cg:
            assert _judge(hog, cg.add, reap=reap) == "the kernel's OOM killer"


def test_a_child_judged_and_not_reaped_is_not_watched_again():
    """A child the app has not reaped is a zombie its parent's children file still
    lists: judged once, not watched (and judged) again at every scan."""
    parent, child = _parent_of(SLEEPER)
    w = proctree.ChildWatch(parent.pid, _Notes([]))
    try:
        assert [c for c, _ in w.scan()] == [child]
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        w.wait_exit(child, 30)
        assert w.exited() == [child] and w.failure(child) is None
        assert child in (proctree.child_pids(parent.pid) or [])     # a zombie
        assert w.scan() == [] and w.fds == {}
    finally:
        w.close()
        parent.kill()
        parent.wait()


def test_grandchildren_are_watched_and_judged_as_children_are():
    """A program the app runs behind a launcher (a shell, a wrapper script that does not
    exec) is the app's grandchild: watched too, after the children, and its kill from
    outside is a failure whether the launcher reaped it or not yet (from the note of
    its reap: the notes library, native/notes/)."""
    launcher = [sys.executable, "-c", "import subprocess, sys\n"
                f"g = subprocess.Popen({SLEEPER!r})\n"
                "print(g.pid, flush=True)\n"
                "sys.stdin.readline()\n"
                "print(g.wait(), flush=True)\n"]
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                               f"c = subprocess.Popen({launcher!r}, stdin=subprocess.PIPE)\n"
                               "print(c.pid, flush=True)\n"
                               "sys.stdin.readline()\n"
                               "c.stdin.write(b'reap\\n'); c.stdin.flush()\n"
                               "sys.stdin.readline()\n"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())
    grandchild = int(parent.stdout.readline())      # (the launcher's stdout is the parent's)
    notes = _Notes([(child, signal.SIGTERM)])
    w = proctree.ChildWatch(parent.pid, notes)
    try:
        assert [c for c, _ in w.scan()] == [child, grandchild] and w.scan() == []
        os.kill(grandchild, signal.SIGKILL)
        w.wait_exit(grandchild, 30)
        assert w.exited() == [grandchild]
        parent.stdin.write(b"reap\n")               # the launcher reaps it
        parent.stdin.flush()
        assert int(parent.stdout.readline()) == -signal.SIGKILL
        assert w.failure(grandchild) is None        # (its end not known yet)
        notes.reaped[grandchild] = signal.SIGKILL   # the launcher's reap, noted
        assert w.reaped_unwatched() == [(grandchild, "SIGKILL from outside the application")]
    finally:
        w.close()
        parent.kill()
        parent.wait()
