"""The application's whole process tree: found, reaped and killed, also when the agent dies.

Theory of operation
-------------------
An app may start processes of its own: PySpark's driver starts a JVM, the JVM starts
Python worker daemons, those fork workers. When a replica is reset or stops, all of
them must go, and none may outlive `llft run`. Four Linux facts make that work:

  sessions      the app is spawned in a new session (setsid): its session id is its
                pid, and everything it starts stays in that session unless it calls
                setsid itself (changing only the process group does not leave it:
                PySpark's worker daemon calls setpgid, so killing the process group
                would miss it, a session scan does not)
  subreaper     the agent is a child subreaper (PR_SET_CHILD_SUBREAPER): a process
                whose parent dies is reparented to the agent, not to pid 1, so it is
                still among the agent's descendants (a daemon that double-forked into
                a new session included); the agent reaps those orphans (`reap_orphans`)
  snapshot      a killed parent's children are reparented at once, so the tree is
                read before anything is killed (`tree`)
  watchdog      SIGKILL of the agent runs no code of the agent's; the app itself dies
                by PR_SET_PDEATHSIG, and its descendants are orphaned to pid 1. A tiny
                process (`Watchdog`, `python -m llft.runtime.proctree`), in a session of
                its own so a terminal's signals miss it, reads commands on a pipe from
                the agent; when the pipe closes (the agent is gone, however) it kills
                every process of the sessions it was told about, and the processes it
                was told about one by one (escapees: descendants in other sessions,
                identified by pid and start time so a reused pid is never killed);
                then it removes the private temporary folder of each session it
                killed (llft/runtime/application.py `private_tmp`) and the shim's
                shared-memory file in /dev/shm (determinizer/shm.py)

Killing a tree (`kill_tree`): SIGTERM to every process of it, a grace of up to
KILL_GRACE_S for them to exit (a JVM runs its shutdown hooks), then SIGKILL to what is
left, then the sessions are read again and killed until empty (a fork between the
snapshot and the kill leaves a child in the session). Runs in a helper thread, never on
the agent's event loop.

Covered: descendants in the app's session (JVMs, worker daemons, shells, whatever keeps
the session); descendants that left the session while their parent still lived or were
orphaned to the agent (at a reset or shutdown: the snapshot and the agent's own
descendants; at SIGKILL of the agent: those the agent reported to the watchdog, which
it does every ORPHAN_CHECK_S). Not covered: a process that leaves the session and is
orphaned within one ORPHAN_CHECK_S before the agent is SIGKILLed; a process that
escapes through something other than fork (a systemd-run or at job, a container);
SIGKILL of the agent and the watchdog together (a process group kill that includes the
watchdog, an OOM kill of both).
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import select
import signal
import shutil
import subprocess
import sys
import threading
import time

import psutil

log = logging.getLogger("llft.run")

PR_SET_CHILD_SUBREAPER = 36
KILL_GRACE_S = 1.0            # SIGTERM -> SIGKILL
KILL_POLL_S = 0.01            # how often a kill checks which processes are gone
SESSION_SWEEPS = 20           # rounds of session re-reads after the kill (forks)
ORPHAN_CHECK_S = 1.0          # the agent reaps orphans and reports escapees this often

_libc = ctypes.CDLL(None, use_errno=True)
_owned: set[int] = set()      # children a Popen object waits for: never reaped here
_owned_lock = threading.Lock()
_spawning = 0                 # spawns under way (`spawning`): reap nothing meanwhile


def become_subreaper() -> None:
    """Orphaned descendants are reparented to this process instead of pid 1."""
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(e)}")


@contextlib.contextmanager
def spawning():
    """A child is being started (not yet `own`ed): `reap_orphans` leaves every child
    alone meanwhile, or it could take the new one's exit status from its Popen."""
    global _spawning
    with _owned_lock:
        _spawning += 1
    try:
        yield
    finally:
        with _owned_lock:
            _spawning -= 1


def own(pid: int) -> None:
    """`pid` is a child some Popen waits for: `reap_orphans` leaves its status alone."""
    with _owned_lock:
        _owned.add(pid)


def disown(pid: int) -> None:
    with _owned_lock:
        _owned.discard(pid)


def _getsid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def session_members(sids) -> list[psutil.Process]:
    """Every live process (not a zombie) whose session is one of `sids`."""
    sids = set(sids)
    out = []
    if not sids:
        return out
    for pid in psutil.pids():
        if _getsid(pid) in sids:
            try:
                p = psutil.Process(pid)
            except psutil.Error:
                continue
            if not _gone(p):
                out.append(p)
    return out


def descendants(pid: int) -> list[psutil.Process]:
    """Every descendant of `pid` (psutil: a scan of every process on the machine; the
    kill paths use it, for an exact snapshot)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def child_pids(pid: int) -> list[int] | None:
    """The direct children of `pid` from /proc/PID/task/*/children (only its own
    threads' files are read, not every process on the machine); None where the kernel
    has no such file. A child being reparented right now may be missing: the periodic
    checks catch it next time."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue                    # the thread ended meanwhile
            return None                     # no children files in this kernel
        except (OSError, ValueError):
            continue
    return out


def descendant_pids(pid: int) -> list[int]:
    """Descendants of `pid`, cheaply (child_pids, breadth first); the psutil scan where
    the kernel lacks the children files. For the agent's once-a-second checks."""
    first = child_pids(pid)
    if first is None:
        return [p.pid for p in descendants(pid)]
    out, todo = [], list(first)
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(child_pids(c) or [])
    return out


# the agent's periodic scans (reap_orphans, report_escapees): how many, how long in total
SCAN_STATS = {"proctree_scans": 0, "proctree_scan_us": 0}


def tree(root: int | None, sid: int | None, exclude=()) -> list[psutil.Process]:
    """A snapshot of an app's tree: its root, its descendants and its session."""
    found: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            found[root] = psutil.Process(root)
        except psutil.Error:
            pass
        for p in descendants(root):
            found[p.pid] = p
    for p in session_members([sid] if sid else []):
        found.setdefault(p.pid, p)
    for pid in exclude:
        found.pop(pid, None)
    found.pop(os.getpid(), None)
    return list(found.values())


def running(pid: int, created: float | None = None) -> psutil.Process | None:
    """Process `pid` if it runs (a zombie does not) and, when `created` is given, is the
    one created then (psutil's create_time: a pid soon names another process, or a
    thread); None otherwise. A pid with its create time is how a process is named."""
    try:
        p = psutil.Process(pid)
        if (created is None or p.create_time() == created) and \
                p.status() != psutil.STATUS_ZOMBIE:
            return p
    except psutil.Error:
        pass
    return None


PF_EXITING = 0x4            # include/linux/sched.h: the task has begun its exit


def _stat_fields(stat: bytes) -> list[bytes]:
    """A stat line's fields from the 3rd (state) on: what follows the command name's
    closing parenthesis (the name itself may hold spaces and parentheses)."""
    return stat.rpartition(b")")[2].split()


def _flag_exiting(stat: bytes) -> bool:
    """PF_EXITING from a task's stat line (its 9th field)."""
    return bool(int(_stat_fields(stat)[6]) & PF_EXITING)


def _task_exiting(stat_path: str) -> bool | None:
    """A task's PF_EXITING flag from its stat file; None: the task is gone. A file that
    cannot be read otherwise (no descriptor left: EMFILE) says nothing: not exiting."""
    try:
        with open(stat_path, "rb") as f:
            return _flag_exiting(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (OSError, IndexError, ValueError):
        return False


def _all_threads_exiting(pid: int) -> bool:
    """Every thread of `pid` has begun its exit or is gone (its main thread did)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False
    return all(_task_exiting(f"/proc/{pid}/task/{t}/stat") is not False for t in tids)


class ExitWatch:
    """Whether one process is dying: every thread of it has begun its exit (or is gone),
    or the process is. The kernel closes a dying process's descriptors inside its exit,
    after every thread set PF_EXITING and before anybody can wait for it, so a socket's
    end read from such a process was its death, not a close it made. Asked at each such
    end: the main thread's stat file is kept open and read again (pread, ~5 µs against
    ~12 for an open; and the descriptor names this process: once it is reaped, a read
    fails, whoever has its pid since). The other threads are read only when the main
    one is exiting (a C program's main thread may end alone)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._fd: int | None = None

    def exiting(self) -> bool:
        try:
            if self._fd is None:
                self._fd = os.open(f"/proc/{self.pid}/stat", os.O_RDONLY)
            main = _flag_exiting(os.pread(self._fd, 4096, 0))
        except (FileNotFoundError, ProcessLookupError):
            return True
        except (OSError, IndexError, ValueError):
            return False                    # (no descriptor left: no news of a death)
        return main and _all_threads_exiting(self.pid)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def oom_kills() -> int | None:
    """The kernel's OOM kills so far (/proc/vmstat `oom_kill`: Linux 4.13 and later, a
    memory cgroup's own kills included); None where it is not counted."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def comm(pid: int) -> str | None:
    """The command name of `pid` (a zombie's too: what it last exec'd)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _zombie(pid: int) -> bool:
    """`pid` exited and its parent has not reaped it (or it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return _stat_fields(f.read())[0] == b"Z"
    except (OSError, IndexError):
        return True


def _exit_status(pid: int) -> int | None:
    """`pid`'s wait status, read from its stat file (the 52nd field, its exit code) once
    its exit has begun (the kernel sets the code before it releases the process's memory
    and descriptors) or while it is a zombie; 0 also while it runs; None: not known (it
    was reaped already)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(_stat_fields(f.read())[49])
    except (OSError, IndexError, ValueError):
        return None


COMPANIONS = 2             # ChildWatch.dying: the children whose exit is seen as it begins
JUDGED_KEPT = 256          # ChildWatch: the latest children judged, not judged again
WATCHED_MAX = 256          # ChildWatch: descendants watched at most (the first found)
# Signals only a process sends (kill), never the kernel for a process's own doing (a
# fault, a broken pipe, its own alarm): a child ended by one that the app did not send
# was killed from outside. (SIGKILL is the OOM killer's too, and a hard CPU limit's.)
SENT_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                          signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2})
# Signals a program may handle and then exit for with status 128 + the signal (a JVM runs
# its shutdown hooks): such an exit is the signal's kill when its handler received it
# (native/notes/, `Shm.signals_received`). TERM and INT mean "stop" at once, and the
# primary acts when they are received, before the program's shutdown reaches the app;
# HUP (a daemon's reload, as often) only once the program exited for it.
HANDLED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


class ChildWatch:
    """The descendants of one process (an application's: a PySpark driver's JVM, a
    helper it runs, a program it runs through a shell or a launcher; the first
    WATCHED_MAX found, children first), each by a pidfd, which is readable once the
    process has exited. ("Child" below: any of them.) Tells a
    child taken by this machine (a failure, which a takeover masks) from one that ended
    or that the application killed itself (its own doing, which every replica repeats):
    `failure`. Taken by the machine: the kernel's OOM killer's SIGKILL (its kill count
    rose meanwhile), or a signal only a process sends that the application did not send
    it (an operator's `kill -9`, a container's or a supervisor's kill).

    `notes`: what the app's shim and its programs' notes library noted
    (determinizer/shm.py `Shm`: `signals_sent()`, (target, signal) pairs;
    `children_reaped()`, pid -> wait status, by the app or a program); None without a
    shim: then the app's own kills cannot be told from others, and only the OOM killer
    counts."""

    def __init__(self, pid: int, notes=None):
        self.pid = pid
        self.notes = notes
        self.fds: dict[int, int] = {}           # child pid -> its pidfd
        self.names: dict[int, str] = {}         # ... its command name
        self.groups: dict[int, int] = {}        # ... its process group (at `scan`)
        self._exit: dict[int, ExitWatch] = {}   # ... its exit's start (`dying`)
        self._poll = select.poll()              # every pidfd
        self._oom = oom_kills()
        self._judged: dict[int, None] = {}      # the latest children judged (`failure`)
        self._reaped_seen = 0                   # the app's reaps looked at (`reaped_unwatched`)
        self._received_seen = 0                 # ... signals received (`stopped_from_outside`)
        self._sent_at: dict[int, int] = {}      # child pid -> the app's signals sent by its watch
        self._sent_at_scan = 0                  # ... by the last `scan` (a child never watched)
        self.unsure = 0                         # kills taken as the app's with their note lost
        try:
            self.own_group = os.getpgid(pid)
        except OSError:
            self.own_group = pid

    def scan(self, deep: bool = True) -> list[tuple[int, int]]:
        """The descendants (not `deep`: the children) not watched yet, now watched:
        (pid, pidfd) of each. (Each process's children are read from a file per thread
        of it: ~1 ms for a JVM's hundred, so only the children at a drain.)"""
        new = []
        if self.notes is not None:
            self._sent_at_scan = self.notes.signals_sent_count
        todo = collections.deque(child_pids(self.pid) or [])
        while todo:                             # breadth first: children, then theirs
            c = todo.popleft()
            if c in self._judged and _zombie(c):
                continue                        # (judged, not reaped by its parent yet)
            if deep:
                todo.extend(child_pids(c) or [])
            if c in self.fds or len(self.fds) >= WATCHED_MAX:
                continue
            try:
                fd = os.pidfd_open(c)
                self.groups[c] = os.getpgid(c)
            except OSError:
                continue                        # gone meanwhile
            self.fds[c] = fd
            self._poll.register(fd, select.POLLIN)
            self.names[c] = comm(c) or "?"
            self._sent_at[c] = self._sent_at_scan
            new.append((c, fd))
        if not self.fds:
            self._oom = oom_kills()             # (no child: no death to explain by it)
        return new

    def exited(self) -> list[int]:
        """The watched children that have exited (one poll, no wait)."""
        if not self.fds:
            return []
        ready = {fd for fd, _ in self._poll.poll(0)}
        return [c for c, fd in self.fds.items() if fd in ready] if ready else []

    def dying(self) -> list[int]:
        """The watched children that exited, and those of the first COMPANIONS (the
        longest watched: a driver's JVM, a helper daemon) whose exit has begun: a dying
        process's sockets close ~0.1-0.2 ms before its pidfd is readable (the rest of
        its exit), time enough for the app to read the end and act on it. (~5 µs a
        companion; the others' exits are seen once done.)"""
        gone = self.exited()
        for c in list(self.fds)[:COMPANIONS]:
            if c not in gone:
                if c not in self._exit:
                    self._exit[c] = ExitWatch(c)
                if self._exit[c].exiting():
                    gone.append(c)
        return gone

    def may_fail(self, child: int) -> bool:
        """`child`, dying, may be a failure (`failure`): it is ending by a signal only a
        process sends, or the OOM kill count rose. (Its other ends -- an exit, a crash
        -- are no failure and need not be waited for: a big heap's release takes long.)"""
        return self._signal(child) in SENT_SIGNALS or self._rose(oom_kills())

    def _signal(self, child: int) -> int | None:
        """The signal ending `child` (0: none, an exit): from /proc while it exits or is
        a zombie, else from the shim's note of the app's reap of it; None: not known."""
        status = _exit_status(child)
        if status is None and self.notes is not None:
            status = self.notes.children_reaped().get(child)
        return None if status is None else self._ended_by(child, status)

    def _ended_by(self, child: int, status: int) -> int:
        """The signal `child` ended by, from its wait status: the one that killed it, or
        one that its handler received and that it exited for (status 128 + it); 0: an
        exit."""
        sig = status & 0x7F
        code = (status >> 8) & 0xFF
        if sig or self.notes is None or code - 128 not in HANDLED_SIGNALS:
            return sig
        return code - 128 if (child, code - 128) in self.notes.signals_received() else 0

    def wait_exit(self, child: int, timeout_s: float) -> None:
        """Until `child`'s pidfd is readable (its exit done), at most `timeout_s`."""
        select.select([self.fds[child]], [], [], timeout_s)

    def _rose(self, now: int | None) -> bool:
        return now is not None and self._oom is not None and now > self._oom

    def failure(self, child: int) -> str | None:
        """`child` exited (its pidfd is readable; it is watched no more): what took it,
        if this machine did ("the kernel's OOM killer", "SIGKILL from outside the
        application"), else None."""
        fd = self.fds.pop(child)
        self._poll.unregister(fd)
        os.close(fd)
        self.names.pop(child, None)
        group = self.groups.pop(child, None)
        x = self._exit.pop(child, None)
        if x is not None:
            x.close()
        try:
            return self._judge(child, self._signal(child), group)
        finally:
            self._sent_at.pop(child, None)

    def reaped_unwatched(self) -> list[tuple[int, str]]:
        """The children the app reaped since the last look that were never watched
        (younger than the last `scan`) and that this machine took: (pid, what took it).
        Their death is known from the shim's note of the app's reap alone."""
        if self.notes is None:
            return []
        self._reaped_seen, reaped = self.notes.reaped_since(self._reaped_seen)
        return [(pid, why) for pid, status in reaped
                if pid not in self.fds and pid not in self._judged
                and (why := self._judge(pid, self._ended_by(pid, status), None))]

    def stopped_from_outside(self) -> list[tuple[int, str]]:
        """The watched children told to stop (SIGTERM, SIGINT) by a process outside the
        app since the last look, whose handler received it: (pid, who told it). The
        program is on its way out (a JVM's shutdown hooks stop its SparkContext first,
        and the app would see that before the exit); judged as they are received."""
        if self.notes is None:
            return []
        self._received_seen, received = self.notes.received_since(self._received_seen)
        return [(pid, f"{signal.Signals(sig).name} from outside the application")
                for pid, sig in received
                if pid in self.fds and sig in STOP_SIGNALS
                and not self._sent_by_app(pid, self.groups.get(pid), sig)]

    def _judge(self, child: int, sig: int | None, group: int | None) -> str | None:
        """What took `child`, ended by `sig` (0: an exit; None: not known), if this
        machine did. (An unknown end counts as the OOM killer's if its count rose; it
        is judged again once the shim notes the app's reap of it, `reaped_unwatched`:
        the app's waitpid returns a moment before its note is written.)"""
        if sig is not None:
            self._judged[child] = None
            if len(self._judged) > JUDGED_KEPT:
                del self._judged[next(iter(self._judged))]
        now = oom_kills()
        rose = self._rose(now)
        self._oom = now
        if rose and sig in (signal.SIGKILL, None):
            return "the kernel's OOM killer"
        if self.notes is not None and sig in SENT_SIGNALS and not self._sent_by_app(
                child, group, sig):
            return f"{signal.Signals(sig).name} from outside the application"
        return None

    def _sent_by_app(self, child: int, group: int | None, sig: int) -> bool:
        """The app sent `sig` to `child`: to it, to its process group, to the app's own
        group with it in it, or to every process it may signal. (`group` None: not
        known, any of those groups counts.)"""
        def reaches(t: int) -> bool:
            if t in (child, -1):
                return True
            if group is None:
                return t <= 0
            return t == -group or (t == 0 and group == self.own_group)
        if any(s == sig and reaches(t) for t, s in self.notes.signals_sent()):
            return True
        # More signals sent since the child was first seen than the ring keeps: the
        # app's may be among those written over. Taken as the app's (an app sending
        # hundreds of signals most likely sent this one too; judging it a failure
        # would stop every replica), and counted.
        if self.notes.signals_sent_count - self._sent_at.get(
                child, self._sent_at_scan) > self.notes.NOTE_SLOTS:
            self.unsure += 1
            log.warning(f"{signal.Signals(sig).name} ended or stopped process {child} of "
                        f"the application; its note may be lost (more than "
                        f"{self.notes.NOTE_SLOTS} signals sent since): taken as the "
                        f"application's own")
            return True
        return False

    def close(self) -> None:
        for fd in self.fds.values():
            self._poll.unregister(fd)
            os.close(fd)
        for x in self._exit.values():
            x.close()
        self.fds.clear()
        self.names.clear()
        self.groups.clear()
        self._exit.clear()


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _signal(procs, sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)      # checks the start time: a reused pid is left alone
        except psutil.Error:
            pass


def kill_tree(procs: list[psutil.Process], sids=(), grace_s: float = KILL_GRACE_S,
              exclude=()) -> list[psutil.Process]:
    """SIGTERM, up to `grace_s` for them to exit, SIGKILL; then the sessions until empty.
    Blocks (a helper thread's job). Returns what is still alive (should be nothing)."""
    procs = [p for p in procs if not _gone(p)]
    _signal(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while procs:
        reap_orphans()
        procs = [p for p in procs if not _gone(p)]
        if not procs or time.monotonic() >= deadline:
            break
        time.sleep(KILL_POLL_S)     # polling exits, with a deadline
    _signal(procs, signal.SIGKILL)
    skip = set(exclude) | {os.getpid()}
    for _ in range(SESSION_SWEEPS):
        late = [p for p in session_members(sids) if p.pid not in skip and not _gone(p)]
        _signal(late, signal.SIGKILL)
        procs = [p for p in procs + late if not _gone(p)]
        reap_orphans()
        if not procs:
            break
        time.sleep(KILL_POLL_S)     # SIGKILLed processes disappear within a few ms
    return procs


def reap_orphans() -> int:
    """Collect the exit status of this process's dead children that no Popen waits for
    (orphans reparented here as subreaper). Returns how many were reaped."""
    n = 0
    t0 = time.monotonic_ns()
    children = child_pids(os.getpid())
    if children is None:
        try:
            children = [p.pid for p in psutil.Process().children()]
        except psutil.Error:
            children = []
    for pid in children:
        with _owned_lock:
            if pid in _owned or _spawning:
                continue
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                n += 1
        except ChildProcessError:
            pass
    _scanned(t0)
    return n


def _scanned(t0_ns: int) -> None:
    SCAN_STATS["proctree_scans"] += 1
    SCAN_STATS["proctree_scan_us"] += (time.monotonic_ns() - t0_ns) // 1000


# ---- the watchdog ---------------------------------------------------------------------------
class Watchdog:
    """The agent's side: start the watchdog, tell it what to kill if the agent dies."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llft.runtime.proctree"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, start_new_session=True)
        own(self.proc.pid)
        self._lock = threading.Lock()      # the loop and helper threads both write
        self.reported: dict[int, float] = {}   # escapee pid -> start time

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, line: str) -> None:
        with self._lock:
            try:
                self.proc.stdin.write(line.encode() + b"\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass                       # the watchdog is gone: nothing to tell

    def track_session(self, sid: int, *paths: str | None) -> None:
        """Kill session `sid` if the agent dies, then remove `paths`: the app's private
        temporary folder and the shared-memory file of its shim, which a SIGKILLed agent
        cannot unlink (one per kill, in /dev/shm: memory). The rest of the line, split
        by tabs: any path but one with a tab or a newline."""
        said = [p for p in paths if p and "\t" not in p and "\n" not in p]
        self._send(f"s {sid}" + (" " + "\t".join(said) if said else ""))

    def untrack_session(self, sid: int) -> None:
        self._send(f"u {sid}")

    def track_process(self, p: psutil.Process) -> None:
        try:
            ct = p.create_time()
        except psutil.Error:
            return
        if self.reported.get(p.pid) != ct:
            self.reported[p.pid] = ct
            self._send(f"p {p.pid} {ct!r}")

    def report_escapees(self, sids) -> None:
        """Descendants of the agent outside the tracked sessions (daemons that called
        setsid): the watchdog kills them by pid if the agent dies."""
        t0 = time.monotonic_ns()
        sids = set(sids)
        for pid in descendant_pids(os.getpid()):
            if pid != self.proc.pid and _getsid(pid) not in sids:
                try:
                    self.track_process(psutil.Process(pid))
                except psutil.Error:
                    pass
        for pid in [pid for pid in self.reported if not psutil.pid_exists(pid)]:
            del self.reported[pid]
        _scanned(t0)

    def close(self, timeout_s: float = 5.0) -> None:
        """Normal exit: the pipe closes, the watchdog sweeps what it knows and exits."""
        with self._lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        disown(self.proc.pid)


def watch(stream) -> None:
    """The watchdog process: read commands until EOF, then kill what it was told about and
    remove the folders and files of the sessions it killed."""
    sids: dict[int, list[bytes]] = {}       # session -> its folder and files
    pids: dict[int, float] = {}
    for raw in stream:
        parts = raw.rstrip(b"\n").split(b" ", 2)
        try:
            if parts[0] == b"s":
                sids[int(parts[1])] = parts[2].split(b"\t") if len(parts) > 2 else []
            elif parts[0] == b"u":
                sids.pop(int(parts[1]), None)
            elif parts[0] == b"p":
                pids[int(parts[1])] = float(parts[2])
        except (IndexError, ValueError):
            continue
    procs = []
    for pid, ct in pids.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == ct:
                procs.append(p)
        except psutil.Error:
            pass
    procs += session_members(sids)
    _signal(procs, signal.SIGKILL)
    kill_tree(procs, list(sids), grace_s=0)    # (waits until they are gone)
    for path in (p for paths in sids.values() for p in paths):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def main() -> None:
    # The watchdog outlives the agent only to do its job; a terminal's ^C must not end
    # it early (it is in a session of its own, but a direct signal is ignored too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch(sys.stdin.buffer)


if __name__ == "__main__":
    main()
