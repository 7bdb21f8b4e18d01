"""The replicated application's life cycle: one unmodified process under the preload shim.

Theory of operation
-------------------
An `Application` is one incarnation of the app an agent runs (llft/runtime/agent.py):
started under the preload shim (determinizer/runner.py) with a shared-memory block
(`determinizer.shm.Shm`), below the agent's CPU priority (APP_NICE). A reset discards
it: the agent makes a new one, and whatever the old one's threads report afterwards
names the old object, so the agent recognises it and drops it.

Modes (`AppMode`, the string values are the status file's `app_mode`):

    NONE       no application runs (the replica holds no group state yet, or was reset)
    PRIMARY    the app runs live; the drain thread takes its order info
    BACKUP     the app replays: the feeder thread gives it the primary's order info
    PROMOTING  its view starts as primary: the app executes the entries it was given

Allowed transitions (`TRANSITIONS`; anything else is a bug and raises):

    NONE      -> PRIMARY     founder: the first member starts the app as the primary
    NONE      -> BACKUP      joiner: the group's state arrived (Restored)
    BACKUP    -> PROMOTING   its view starts as primary
    PROMOTING -> PRIMARY     the app executed every entry it was fed: `Shm.promote()`,
                             the app continues live and draining starts

Threads (two per app, both bounded in their waits on the block):
  drain watcher    native (determinizer.shm.DrainWatcher), no GIL: waits without taking
  (primary)        and wakes the loop through an eventfd when entries stay undrained
                   for DRAIN_COALESCE_US or an external send asks for output commit;
                   it never drains: the loop alone does (`drain()`), so entries stay in
                   the shim's order. One request at a time: after it asked, the watcher
                   waits (bounded) until the loop drained
  feeder (backup)  pushes into the shim what the loop could not (`feed()` pushes what
                   fits at once; `Feeder.push` blocks while an app thread is behind);
                   a failure goes to the loop (`on_feed_failed`)
  wait             one more, only to learn the app's exit status (`on_exit`)

Every callback runs on the event loop (`call_soon_threadsafe`) and gets this object
first. Never join a thread on the event loop: `stop()` marks the object closed, reads
the app's process tree, and leaves the rest to a helper thread: kill the tree, wait
until the drain and feeder threads are gone, unmap the block.

Closed. After `stop()` the object answers without touching the block (it is unmapped
under it soon): `caught_up()` is False, `promote()`, `feed()` and `drain()` do nothing,
the state properties read as if no app ran. A coroutine that held on to it across a
reset (a promotion) sees `closed` and gives up; nothing raises.

Process tree (llft/runtime/proctree.py). The app runs in a session of its own; `stop()`
kills its whole tree (SIGTERM, a grace, SIGKILL): the app, a JVM it started, that JVM's
workers. The app dies with its agent (PR_SET_PDEATHSIG: SIGKILL, which names the thread
that spawned it), so it is spawned from one thread that lives as long as the agent
(`_Spawner`); the rest of the tree dies by the agent's watchdog (`on_spawn` tells the
agent the new session). Never from the event loop: starting a process waits until its
exec, and on a busy machine that took 100-500 ms, heartbeats unsent, long enough for the
group to remove the replica being started. `start_*` return at once; `proc` and `pid`
are None until the spawner is done; `stop()` meanwhile waits for it before it reads the
tree. A command that cannot be started is an exit (`spawn_error`, status 127).

Temporary files. Each run has a folder of its own (`private_tmp`: TMPDIR, Spark's local
dirs, the JVM's java.io.tmpdir), removed once its tree is dead, or by the watchdog if
the agent is killed: what a killed app leaves there does not pile up in /tmp.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import os
import resource
import queue
import shutil
import signal
import tempfile
import threading
from typing import Callable

from llft.lifetime import die_with
from llft.runtime import proctree

log = logging.getLogger("llft.run")

# No stall detection: a backup whose app waits for order info that has not come is
# normal (an idle primary produces none); lag shows in `llft status`.
NO_STALL_MS = 0x7FFF_FFFF
# The app (and what it starts: a Spark JVM) runs below the agent's CPU priority: the
# agent's heartbeats and acknowledgments are the group's fault detector, and an app
# that keeps the cores busy must not get its own replica suspected.
APP_NICE = 5
# And the agent runs above the processes around it when it may (root or CAP_SYS_NICE),
# as membership daemons do (corosync runs real-time): a machine busy with other work at
# the default priority (other services, test runs, JVMs starting) starved agents of a
# 2-core box for 175-250 ms and got live primaries replaced. Nice, not real-time: a
# runaway agent must not be able to freeze the machine. The app keeps the priority it
# would have had (the agent's former nice + APP_NICE).
AGENT_NICE = -10
# A backup's agent gives its session less than the primary's (`role_priority`): on a
# host with more than one replica (tests, the demo, one-host benchmarks) a REQUEST wakes
# every agent at once, and backups at the primary's -10 took the cores from the
# primary, the gateway and the clients: same group, the backups' autogroup alternated
# -10 / -5, 3 replicas, 1 KB echo: p50 533 -> 456 µs (median of 4), 16 clients 5,231 ->
# 5,938 req/s, -5 ahead in each of the 4 pairs; 2 replicas 445 -> 410 µs, 7,219 -> 7,839
# (docs/BENCHMARKS.md, "A backup's agent below its primary's"). -5 still outranks the
# applications and the machine's other work (0) threefold, what the boost is for.
BACKUP_NICE = -5
_app_nice = APP_NICE                 # increment from the agent's nice to the app's
_boosted = False                     # raise_agent_priority set our autogroup's nice
# The agent and the gateway run SCHED_BATCH (same priority and share as SCHED_OTHER, but a
# thread of theirs that wakes does not preempt the one running; it runs at the next
# scheduling point, within a tick). They wake each other and the apps for every datagram
# and every write: preempting on each one cost a context switch per hop and cut each
# loop turn into pieces (cProfile put a third of the gateway's time in `sendto`, woken
# agents running in its place). Six same-run pairs at 3 replicas (docs/BENCHMARKS.md,
# "Batch scheduling"): at the medians p50 -24 %, 16 clients +9 %. The app keeps the
# policy it would have had (`_app_policy`): its own threads' wake-ups are its business.
AGENT_POLICY = os.SCHED_BATCH
_app_policy: int | None = None       # the app's policy when it differs from the agent's


# Each run of the app gets a temporary folder of its own (`private_tmp`), removed once its
# process tree is gone. A killed app removes nothing: SIGKILL runs no shutdown hook, and a
# Spark driver's JVM left `blockmgr-*` and `artifacts-*` folders (tens of MB a day of test
# runs) and PySpark empty `tmpXXXXXXXX` folders in /tmp at every kill.
PRIVATE_TMP_PREFIX = "llft-app-"


def private_tmp(env: dict[str, str]) -> tuple[str | None, dict[str, str]]:
    """A new folder for one run of the app, under the app's TMPDIR (or /tmp), and `env`
    pointing the app and the JVMs it starts there: TMPDIR (Python's tempfile, most C
    programs), SPARK_LOCAL_DIRS (Spark's block manager; an app's own value is kept) and
    `-Djava.io.tmpdir` first in SPARK_SUBMIT_OPTS (Spark's other temporary folders, which
    follow the JVM's tmpdir, not TMPDIR; an app's own -D, later on the line, wins).
    The names have one length on every replica (mkdtemp's), so a path the app passes
    around (PySpark asks its JVM for a folder under the local dirs) reads the same byte
    counts at every replica. (None, env) when the folder cannot be made."""
    base = env.get("TMPDIR") or "/tmp"
    try:
        folder = tempfile.mkdtemp(prefix=PRIVATE_TMP_PREFIX, dir=base)
    except OSError as e:
        log.warning(f"no private temporary folder for the app under {base} ({e}): it "
                    "uses that folder, and what a killed app leaves there stays")
        return None, env
    env = dict(env, TMPDIR=folder)
    env.setdefault("SPARK_LOCAL_DIRS", folder)
    opts = env.get("SPARK_SUBMIT_OPTS")
    env["SPARK_SUBMIT_OPTS"] = f"-Djava.io.tmpdir={folder}" + (f" {opts}" if opts else "")
    return folder, env


def remove_private_tmp(folder: str | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def own_session() -> None:
    """Make this process the leader of a session of its own (setsid), if it is not one
    already: then the autogroup that `raise_agent_priority` boosts holds the agent
    alone. In the session it was started in, everything that shares it got the boost
    too: three CPU hogs started by the same test as the agents, at autogroup nice -10,
    left each application's session ~0.2 % of a core, the backups' replay fell seconds
    behind, the primary held its clients for them, and 4 replies came in 15 s of load
    (with sessions of their own: 40,495, longest gap 43 ms; docs/RELIABILITY.md,
    "Sessions and the CPU"). Call it before `raise_agent_priority`, before any thread
    starts.

    A process-group leader may not setsid: a job of an interactive shell (`llft run ...`
    typed at a prompt, foreground or `&`) is one. Boosting that shell's session would
    boost whatever the user starts from the shell next (a Spark JVM beside the agent),
    and the boost would outlast the agent. So such a process forks (`_stand_in`): the
    child, not a group leader, takes a session of its own and goes on as the agent;
    this process stays the shell's job and only waits for it."""
    if os.getsid(0) == os.getpid():
        return                          # a service manager's child, or done already
    try:
        os.setsid()
    except OSError:                     # EPERM: a process-group leader
        _stand_in()                     # returns in the child only
        os.setsid()


STAND_IN_RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGUSR1, signal.SIGUSR2)


def _stand_in() -> None:
    """Fork; return in the child. The parent stays what the shell knows as its job and
    stands in for the child until it exits: it passes on the signals a terminal or a
    `kill` sends the job (STAND_IN_RELAYED, those it does not ignore: ^C and SIGTERM
    reach the agent as they would have; ^Z stops the stand-in alone, a replica does not
    pause), and exits with the child's status (a signal's death as the same signal),
    relaying nothing once the child is reaped (its pid may be reused). The child dies with it
    (`die_with`: SIGKILL of `llft run` is still a crash of the replica, as if its
    machine died). Signals are blocked across the fork, so one that comes before the
    parent relays is delivered after, and the child starts with the dispositions and
    mask this process had."""
    parent = os.getpid()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STAND_IN_RELAYED)
    pid = os.fork()
    if pid == 0:
        die_with(parent, 1)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return
    for sig in STAND_IN_RELAYED:
        if signal.getsignal(sig) != signal.SIG_IGN:     # `nohup llft run ... &`: not HUP
            signal.signal(sig, lambda s, _frame: os.kill(pid, s))
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    status = os.waitpid(pid, 0)[1]      # retried after a relayed signal (PEP 475)
    for sig in STAND_IN_RELAYED:
        signal.signal(sig, signal.SIG_IGN)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:                        # killed by a signal: so is the stand-in
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(parent, -code)
        code = 128 - code
    os._exit(code)


def raise_agent_priority() -> str | None:
    """Give this process AGENT_NICE, if permitted. Call it before any thread starts
    (Linux nice is per thread; threads inherit their creator's). None, or why not."""
    global _app_nice, _boosted
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base <= AGENT_NICE:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)
    except PermissionError:
        return (f"the agent keeps nice {base} (nice {AGENT_NICE} needs root or "
                "CAP_SYS_NICE): a busy machine may get it suspected")
    _app_nice = base + APP_NICE - AGENT_NICE
    _boosted = set_autogroup_nice(AGENT_NICE)
    return None


def role_priority(primary: bool) -> None:
    """Our session's autogroup nice for our role: AGENT_NICE as the primary (and while
    joining), BACKUP_NICE as a backup; nothing unless `raise_agent_priority` set it.
    Without autogroup scheduling the agent's threads keep AGENT_NICE whatever the role."""
    if _boosted:
        set_autogroup_nice(AGENT_NICE if primary else BACKUP_NICE)


def batch_scheduling() -> None:
    """Run this process's threads under AGENT_POLICY (call before any thread starts:
    threads inherit their creator's); the app spawned later gets the policy this
    process had. Unprivileged; a kernel that refuses leaves things as they were."""
    global _app_policy
    own = os.sched_getscheduler(0)
    if own == AGENT_POLICY:
        return
    try:
        os.sched_setscheduler(0, AGENT_POLICY, os.sched_param(0))
    except OSError:
        return
    _app_policy = own


def raise_fd_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; the new soft limit.
    An agent holds a connection to its app per open stream, and a backup catching
    up opens a whole history's worth at once (the app's accept queue holds them): at the
    common default of 1024 a joiner after ~1,000 short connections failed with EMFILE. The
    app inherits the raised limit (as services started with a raised LimitNOFILE do)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError):
            pass
    return soft


def set_autogroup_nice(nice: int, pid: int | str = "self") -> bool:
    """Give the autogroup of process `pid` (this one by default) `nice`. With autogroup
    scheduling (Linux's sched_autogroup_enabled, on by default in the common
    distributions' kernels) the CPU is shared fairly between *sessions* first, and a
    thread's nice counts only inside its session: every application runs in a session of
    its own (start_new_session), so a Spark JVM's session got as much CPU as the session
    of the agents at nice -10, and on a 2-core box with three JVMs the agents went
    unscheduled for 100-400 ms (live primaries replaced, backups removed; their CPU use
    was ~10%). The autogroup's nice is what ranks sessions. It is the session's: the
    agent takes a session of its own first (`own_session`; a shell's job forks an agent
    that can). The applications' sessions keep autogroup nice 0, what they would have
    had without llft (an autogroup nice of APP_NICE starved a Spark driver against the
    machine's other sessions at load 28). False where there is no autogroup or no
    permission."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
        return True
    except OSError:
        return False
DRAIN_WAIT_MS = 100              # the drain watcher's bounded waits (it checks its stop flag)
DRAIN_COALESCE_US = 500          # entries not drained by output this long wake the loop


class AppMode(enum.Enum):
    NONE = "none"
    PRIMARY = "primary"
    BACKUP = "backup"
    PROMOTING = "promoting"


TRANSITIONS: dict[AppMode, frozenset[AppMode]] = {
    AppMode.NONE: frozenset({AppMode.PRIMARY, AppMode.BACKUP}),
    AppMode.BACKUP: frozenset({AppMode.PROMOTING}),
    AppMode.PROMOTING: frozenset({AppMode.PRIMARY}),
    AppMode.PRIMARY: frozenset(),
}
FED_MODES = frozenset({AppMode.BACKUP, AppMode.PROMOTING})   # the feeder thread runs


class _Spawner:
    """The thread that starts this agent's apps, one at a time, off the event loop. It
    runs until the process exits: an app's death signal is tied to its spawning thread."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="llft-spawner",
                                                daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            self._jobs.get()()


_spawner = _Spawner()


def _finish(read_tree, shm, threads, tmp: str | None,
            done: Callable[[int | None], None]) -> None:
    """Helper thread of `stop()`: read the tree (`read_tree()`: victims and the app's
    session, once a spawn under way is done), kill it, remove its temporary folder once
    nothing of it runs (else the watchdog does, when the agent ends), then unmap the block
    once the threads that wait on it are gone."""
    victims, sid = read_tree()
    left = victims
    try:
        left = proctree.kill_tree(victims, [sid] if sid else [])
        if not left:
            remove_private_tmp(tmp)
    finally:
        try:
            for t in threads:
                t.join()
            if shm is not None:
                shm.close()
        finally:
            done(None if left else sid)       # a session still populated stays watched


class Application:
    """One incarnation of the app (see the module docstring)."""

    def __init__(self, cmd: list[str], cwd: str, service_port: int, *,
                 on_exit: Callable[["Application", int], None],
                 on_order_info: Callable[[], None],
                 on_feed_failed: Callable[["Application", str], None],
                 on_spawn: Callable[["Application"], None] = lambda app: None,
                 on_stopped: Callable[[int | None], None] = lambda sid: None,
                 on_commit_wanted: Callable[[], None] = lambda: None):
        self.loop: asyncio.AbstractEventLoop | None = None   # the one that spawns it
        self.cmd, self.cwd, self.service_port = cmd, cwd, service_port
        self._on_exit, self._on_order_info = on_exit, on_order_info
        self._on_feed_failed = on_feed_failed
        self._on_spawn, self._on_stopped = on_spawn, on_stopped
        self._on_commit_wanted = on_commit_wanted   # an external send waits (loop thread)
        self.mode = AppMode.NONE
        self.closed = False                   # stop() was called (see the docstring)
        self.stopped: threading.Event = threading.Event()   # the tree is gone
        self.shm = None
        self.tmp: str | None = None           # its private temporary folder
        self.proc = None                      # set by the spawner thread
        self._exit_watch: proctree.ExitWatch | None = None   # `dying`, once asked
        self.spawn_error: Exception | None = None   # why the spawner could not start it
        self._spawn_done = threading.Event()  # no spawn under way
        self._spawn_done.set()
        self.divergence: dict | None = None
        self._watcher = None                  # the primary's DrainWatcher
        self.drain_wakeups = 0                # times the drain watcher woke the loop
        self._owed = 0                        # ring bytes to drain before output goes
        self._feed_queue: queue.Queue = queue.Queue()
        self._feeder = None
        self._feed_thread: threading.Thread | None = None
        self._feed_busy = [0]                 # chunks queued or being pushed
        self._feed_lock = threading.Lock()

    def _enter(self, mode: AppMode) -> None:
        if mode not in TRANSITIONS[self.mode]:
            raise RuntimeError(f"application mode {self.mode.value} -> {mode.value} "
                               "is not a transition")
        self.mode = mode

    # ---- starting ------------------------------------------------------------------------
    def start_primary(self, env: dict[str, str]) -> None:
        """Founder: the app starts live."""
        from determinizer.shm import Shm
        self._spawn(Shm.PRIMARY, env)
        self._enter(AppMode.PRIMARY)
        self.shm.set_commit(True)
        self._start_drain()

    def start_backup(self, env: dict[str, str]) -> None:
        """Joiner: the app starts replaying; `feed()` gives it the order info."""
        from determinizer.shm import Shm
        self._spawn(Shm.BACKUP, env)
        self._enter(AppMode.BACKUP)
        self._feeder = self.shm.feeder()
        self._feed_thread = threading.Thread(target=self._feed_loop, daemon=True)
        self._feed_thread.start()

    def _spawn(self, shm_mode: int, env: dict[str, str]) -> None:
        from determinizer.runner import shim_env
        from determinizer.shm import Shm
        self.loop = asyncio.get_running_loop()
        self.shm = Shm.create(shm_mode, stall_ms=NO_STALL_MS)
        senv = self.shm.env(service_port=self.service_port)
        self.tmp, env = private_tmp(env)
        self._spawn_done.clear()
        full_env = shim_env(env, senv)
        _spawner.submit(lambda: self._spawn_now(full_env))

    def _spawn_now(self, env: dict[str, str]) -> None:
        """The spawner thread: start the process, then tell the loop."""
        from determinizer.runner import spawn
        try:
            with proctree.spawning():         # owned before anybody may reap it
                proc = spawn(self.cmd, env, cwd=self.cwd, death_signal=signal.SIGKILL,
                             nice=_app_nice, policy=_app_policy, start_new_session=True)
                proctree.own(proc.pid)        # its exit status is _wait's
        except (OSError, ValueError) as e:   # not found, not executable, bad argument
            self.spawn_error = e
            self._spawn_done.set()
            self.loop.call_soon_threadsafe(self._on_exit, self, 127)
            return
        self.proc = proc
        # the session is announced before stop() may read the tree (and forget it)
        self.loop.call_soon_threadsafe(self._on_spawn, self)
        self._spawn_done.set()
        threading.Thread(target=self._wait, args=(proc,), daemon=True).start()

    @property
    def session(self) -> int | None:
        """The app's session id (its pid: it was spawned as a session leader)."""
        return self.proc.pid if self.proc is not None else None

    def _wait(self, proc) -> None:
        rc = proc.wait()
        proctree.disown(proc.pid)
        self.loop.call_soon_threadsafe(self._on_exit, self, rc)

    # ---- promotion (backup -> primary) -----------------------------------------------------
    def begin_promotion(self) -> None:
        self._enter(AppMode.PROMOTING)

    def caught_up(self) -> bool:
        """The app has executed every entry it was fed (none queued, none in a push);
        never once closed."""
        f = self._feeder
        if self.closed or f is None:
            return False
        return self._feed_busy[0] == 0 and f.consumed >= f.fed_entries

    def hold(self, on: bool) -> None:
        """Primary: backpressure (a backup beyond the lag bound): the app's threads wait
        at their next ordered call while on."""
        if self._mapped and self.mode is AppMode.PRIMARY:
            self.shm.hold(on)

    def promote(self) -> None:
        if self.closed:
            return                            # reset or stopped meanwhile: nothing to do
        self.shm.set_commit(True)
        self.shm.promote()
        self._enter(AppMode.PRIMARY)
        self._start_drain()

    # ---- order info: the drain watcher (primary) ------------------------------------------
    def _start_drain(self) -> None:
        """The native watcher (determinizer.shm.DrainWatcher) wakes the loop through an
        eventfd: entries not drained by output within DRAIN_COALESCE_US, or an external
        send waiting for output commit. Loop thread."""
        self._watcher = self.shm.drain_watcher(DRAIN_COALESCE_US, DRAIN_WAIT_MS)
        self.loop.add_reader(self._watcher.fd, self._on_watcher, self._watcher)

    def _on_watcher(self, watcher) -> None:
        order_info, commit = watcher.take()
        if watcher is not self._watcher or self.closed:
            return
        if commit:
            # an external send waits for output commit: the agent drains, then answers
            # when the backups hold it all
            self._on_commit_wanted()
        if order_info:
            self.drain_wakeups += 1
            self._on_order_info()

    def stop_draining(self) -> None:
        """No more wake-ups from the watcher (loop thread); `stop()` joins it."""
        w = self._watcher
        if w is not None:
            w.stop()
            self.loop.remove_reader(w.fd)

    def owe_drain(self) -> None:
        """Output of the app was just read (loop thread): every shim entry it may depend
        on was *reserved* in the ring before the app wrote it, but a record is reserved,
        written, then committed, and a drain stops at the first one not committed yet: a
        thread descheduled between the two holds up the entries other threads committed
        after it, those the output depends on among them. So the output may go only once
        the ring is drained up to what was reserved now (`owed_drained`)."""
        if self.shm is not None and not self.closed:
            self._owed = max(self._owed, self.shm.out_reserved)

    def owed_drained(self) -> bool:
        """Everything reserved in the ring when output was last read is drained."""
        return self.shm is None or self.closed or self.shm.out_drained >= self._owed

    def drain(self) -> bytes:
        """Whole entries the shim recorded since the last drain (loop thread)."""
        data = self.shm.drain(0) if not self.closed else b""
        if self._watcher is not None:
            self._watcher.drained()
        return data

    # ---- order info: the feeder thread (backup) ---------------------------------------------
    def feed(self, entries: bytes) -> None:
        """Queue shim entries for a replaying app (a primary, or no app, takes none)."""
        if self.mode not in FED_MODES or self.closed:
            return
        with self._feed_lock:
            idle = self._feed_busy[0] == 0
            self._feed_busy[0] += 1
        if idle:
            # The feeder thread is idle (nothing queued, no push under way): push here
            # what fits in the rings now. Waking the thread for every chunk cost a
            # backup a futex wake-up and GIL hand-offs per ORDER_INFO (on a loaded
            # 2-core box ~230 us of its loop's wall time per short connection); it
            # is woken only when an app thread is behind and its ring is full.
            try:
                done = self._feeder.push(entries, wait=False)
            except Exception as e:       # diverged, malformed: the loop decides
                # as when the thread fails: nothing more is fed, and the chunk stays
                # counted (never caught up)
                self._feeder.stopped = True
                self.loop.call_soon(self._on_feed_failed, self, str(e))
                return
            if done:
                with self._feed_lock:
                    self._feed_busy[0] -= 1
                return
            entries = b""                # the feeder kept the rest: the thread goes on
        self._feed_queue.put(entries)

    def _feed_loop(self) -> None:
        f, q, lock, busy = self._feeder, self._feed_queue, self._feed_lock, self._feed_busy
        while True:
            data = q.get()
            # once stopped, what is still queued is dropped at once: each push into the
            # rings of a dead app waits out llft_feed's timeout, and a catching-up
            # backup's queue held thousands of chunks (SIGTERM took minutes to honour)
            if data is None or f.stopped:
                return
            try:
                f.push(data)
            except Exception as e:       # diverged, malformed: the loop decides
                self.loop.call_soon_threadsafe(self._on_feed_failed, self, str(e))
                return
            finally:
                with lock:
                    busy[0] -= 1

    # ---- state ---------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The app's pid while it runs."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def _mapped(self) -> bool:
        return self.shm is not None and not self.closed

    @property
    def diverged(self) -> bool:
        return self._mapped and self.shm.diverged

    @property
    def group_address(self) -> bytes | None:
        """Where its group listener accepts connections (an abstract AF_UNIX address);
        None before it listens."""
        return self.shm.group_address if self._mapped else None

    @property
    def stray_connections(self) -> int:
        """Connections to its group listener from another process than the agent, which
        the shim closed (LLFT_ST_STRAY_CONNS)."""
        return self.shm.stats()["stray_conns"] if self._mapped else 0

    # a group connection's reset, each way (UNIX sockets have none: native/shim_group.c)
    def reset_conn(self, conn: int) -> None:
        if self._mapped:
            self.shm.reset_conn(conn)

    def app_reset(self, conn: int) -> bool:
        return self._mapped and self.shm.app_reset(conn)

    def forget_app_reset(self, conn: int) -> None:
        if self._mapped:
            self.shm.forget_app_reset(conn)

    @property
    def main_pid(self) -> int:
        """The process holding the app's group connections: the one the shim activated
        in (`llft run -- sh -c ...` wraps it), or the one spawned; 0 before either."""
        return (self.shm.active_pid if self._mapped else 0) or (
            self.proc.pid if self.proc is not None else 0)

    def dying(self) -> bool:
        """Whether the app's main process is exiting. Its connections' ends are then its
        death's (the OOM killer's SIGKILL, a crash), read before its exit status can be,
        not closes the app made (proctree.ExitWatch)."""
        if self._exit_watch is None:
            if self.main_pid <= 0:
                return False
            self._exit_watch = proctree.ExitWatch(self.main_pid)
        return self._exit_watch.exiting()

    @property
    def fed_entries(self) -> int | None:
        return self._feeder.fed_entries if self._feeder else None

    @property
    def consumed_entries(self) -> int | None:
        f = self._feeder
        return f.consumed if f and self._mapped else None

    @property
    def waiting_for_input(self) -> bool:
        """A thread of the app waits now for bytes the agent has not written to a group
        connection: its replay can go no further until they are delivered."""
        return bool(self._mapped and self.shm.stats().get("input_wait", 0))

    def record_divergence(self) -> dict:
        """What the shim reported of the divergence (kept in `divergence`)."""
        d = getattr(self.shm, "divergence", None)
        self.divergence = {"report": self.shm.report,
                           "conn": d[0] if d else None, "offset": d[1] if d else None}
        return self.divergence

    # ---- stopping --------------------------------------------------------------------------
    def stop(self, exclude=(), also=()) -> threading.Event:
        """Close this object, kill the app's whole process tree and end its threads (a
        helper thread does: the block is unmapped once they are gone). Returns `stopped`,
        set when all that is done. `exclude`: pids never to kill (the watchdog); `also`:
        more processes to kill with the tree (the agent's orphans: one app lives at a
        time, so they were this app's)."""
        if self.closed:
            return self.stopped
        self.closed = True
        if self._exit_watch is not None:
            self._exit_watch.close()
        self.stop_draining()
        if self._feeder is not None:
            self._feeder.stopped = True
        if self._feed_thread is not None:
            self._feed_queue.put(None)
        # Read the tree before killing anything: a killed process's children are
        # reparented at once and would no longer descend from it.
        def read_tree():
            self._spawn_done.wait()           # a spawn under way: its process is ours
            victims = (proctree.tree(self.proc.pid, self.session, exclude)
                       if self.proc is not None else [])
            victims += [p for p in also if p.pid not in exclude
                        and p.pid not in {v.pid for v in victims}]
            return victims, self.session
        # The drain watcher and the feeder thread may still be inside a (bounded) wait on
        # this block: it is unmapped once they are gone, not under them (never join on
        # the loop).
        threads = [t for t in (self._watcher, self._feed_thread) if t is not None]
        stopped = self.stopped

        def done(sid):
            try:
                self._on_stopped(sid)
            finally:
                stopped.set()
        threading.Thread(target=_finish, args=(read_tree, self.shm, threads, self.tmp, done),
                         daemon=True).start()
        return stopped
