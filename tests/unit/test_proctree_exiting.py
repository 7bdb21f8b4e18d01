"""`proctree.ExitWatch`: a process is dying only once every thread of it is (PF_EXITING).

The agent asks it when its app's sockets end (llft/runtime/agent.py `_app_closed`): a
dying app's ends are its death's, a live app's are closes it made.
"""
from __future__ import annotations

import subprocess
import sys

from llft.runtime import proctree
from polling import wait_for


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
