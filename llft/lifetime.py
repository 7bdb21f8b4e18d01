"""A child process that dies with its parent (layer 0: any layer may use it).

`die_with(parent_pid)`: the kernel sends this process SIGKILL when the thread that
started it exits (PR_SET_PDEATHSIG, <linux/prctl.h>), so a helper never outlives
what started it: simulator workers of a campaign killed with SIGTERM, a gRPC relay
whose agent died. The prctl comes after the fork, so a parent that died in between
is caught by comparing getppid() with the pid the parent passed down.
"""
from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int, exit_code: int = 0) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:       # it died before the prctl
        os._exit(exit_code)
