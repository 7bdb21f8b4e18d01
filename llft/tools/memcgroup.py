"""A memory cgroup around one process, so that the kernel's real OOM killer takes it.

For `llft chaos --kinds oom_child` and the tests of an app's child taken by the OOM
killer (tests/processes/test_app_death.py). Made under the caller's own memory cgroup
(v1 `memory.limit_in_bytes`, or v2 `memory.max` where the unified hierarchy has the
memory controller), removed at close. A process moved in keeps its memory charged where
it was: the limit counts what it allocates from then on. Needs root (or a delegated
cgroup); `why_not()` says why it cannot be made here.
"""
from __future__ import annotations

import os
import time


def _mounts() -> list[tuple[str, str, str]]:
    with open("/proc/self/mounts") as f:
        return [tuple(line.split()[1:4]) for line in f]      # (mount point, type, options)


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of `controller` ("" for v2)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller in ctrls.split(","):
                return path
    return None


def _base() -> tuple[str, str] | None:
    """(the folder new cgroups go in, the limit file's name)."""
    for point, kind, opts in _mounts():
        if kind == "cgroup" and "memory" in opts.split(","):
            path = _own_path("memory")
            if path is not None:
                return os.path.join(point, path.lstrip("/")), "memory.limit_in_bytes"
    for point, kind, _ in _mounts():
        if kind == "cgroup2":
            try:
                with open(os.path.join(point, "cgroup.controllers")) as f:
                    if "memory" not in f.read().split():
                        continue
            except OSError:
                continue
            path = _own_path("")
            if path is not None:
                return os.path.join(point, path.lstrip("/")), "memory.max"
    return None


_why_not: list = []     # the probe's answer, once asked


def why_not() -> str | None:
    """Why no limited memory cgroup can be made here (None: it can). Found by making
    one and removing it (a read-only cgroup file system, a cgroup v2 whose memory
    controller is not delegated to ours), once."""
    if not _why_not:
        _why_not.append(_probe())
    return _why_not[0]


def _probe() -> str | None:
    base = _base()
    if base is None:
        return "no memory cgroup controller is mounted"
    path = os.path.join(base[0], f"llft-probe-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
    except OSError as e:
        return f"cannot make a cgroup in {base[0]}: {e.strerror}"
    try:
        if not os.path.exists(os.path.join(path, base[1])):
            return f"a cgroup made in {base[0]} has no {base[1]}"
        return None
    finally:
        os.rmdir(path)


class MemoryCgroup:
    def __init__(self, limit_bytes: int):
        base, self._limit_file = _base()
        self.path = os.path.join(base, f"llft-test-oom-{os.getpid()}-{time.monotonic_ns()}")
        os.mkdir(self.path)
        with open(os.path.join(self.path, self._limit_file), "w") as f:
            f.write(str(limit_bytes))

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def close(self, timeout_s: float = 30) -> None:
        """Removed once empty (its processes were killed; the caller made sure)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)            # polling its emptiness, with a deadline

    def __enter__(self) -> "MemoryCgroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
