"""`llft chaos`: a seeded fault campaign against a replicated service, every reply checked.

    llft chaos [--workload kv|http|spark|connect] [--faults 20] [--seed 1] [--replicas 3] [--clients 2]
               [--kinds kill_primary,pause_primary,...] [--only 3,7] [--fresh-every N]
               [--keep] [--json FILE]

A LocalCluster (llft/tools/cluster.py: `llft run` replicas + `llft gateway`) runs the
workload's unmodified service (once it answered its first requests); for each fault of the schedule, checking clients
(llft/tools/loadclient.py: exactly once, in order, counters consecutive, clock monotone)
run through the gateway, the fault is injected at a random moment while they run, then
healed, and the campaign waits until the group has settled (a condition on the status
files with a deadline: every replica a member, running its application, one primary
with a promoted application) and the clients got replies again, before the next fault.

Faults are data (`Fault`): the schedule is a pure function of (seed, count, kinds,
replicas), so a campaign that failed is re-run exactly with the same arguments, and one
fault of it alone with `--only INDEX`. Kinds:

  kill_primary    SIGKILL the primary's agent (its application dies with it); healed by
                  starting a new replica, which rejoins as a backup
  kill_backup     the same for a backup
  kill_both       the primary and a backup at once (3 or more replicas)
  pause_primary   SIGSTOP the primary's agent and its whole process tree for 0.2-3 s (a
                  GC-like or VM pause; longer than the detector, so a live primary is
                  replaced and must reset and rejoin when it resumes), then SIGCONT
  pause_backup    the same for a backup
  cpu_hog         cores + 1 busy processes next to the group for 0.5-3 s
  jvm_start       a real JVM with a heavy start-up next to the group (java compiling a
                  source file in memory, then 64 threads allocating and hashing for
                  0.5-3 s): what Spark's JVMs do to the agents' timing
  restart         SIGTERM a member (primary or backup) and start a new one: the clean
                  leave and the start-up of a new replica (interpreter, shim, replay of
                  the group's log) while the clients run
  kill_app        (only when asked for in --kinds) SIGKILL a member's application alone
                  (primary or backup: what the OOM killer picks, the big process); its
                  agent stops with the app's status and says LEAVE (a primary's senior
                  backup takes over at once); healed by starting a new replica
  oom_child       (only when asked for in --kinds; needs root) the first child of a
                  member's application (a PySpark driver's JVM) is put in a memory
                  cgroup that lets it allocate OOM_CHILD_LIMIT_BYTES more, so the kernel's
                  OOM killer takes it at its next allocations; its agent stops (status
                  71) and says LEAVE; healed by starting a new replica
  kill_child      (only when asked for in --kinds) SIGKILL of the first child of a
                  member's application (an operator's `kill -9` of a PySpark driver's
                  JVM); its agent stops (status 71) and says LEAVE; healed by starting
                  a new replica
  term_child      (only when asked for in --kinds) the same with SIGTERM (an operator's
                  plain `kill`: a JVM runs its shutdown hooks and exits with status 143)
  partition       (only when asked for in --kinds; needs root and `ip`) every replica
                  runs in a network namespace of its own on a private bridge
                  (llft/tools/netns.py), the gateway on the bridge in the root
                  namespace; a member's (primary or backup) link is cut for 0.5-3 s,
                  then healed: the side that lost resets and rejoins

Counted per fault and in total (the table at the end): takeovers (applications promoted
at a new primary, from the logs), view changes (the status view number), resets (from
the logs), the longest client-visible pause, lost replies (requests without a correct
reply), duplicated replies (a request executed twice: a key count not advancing by one,
or a global count seen twice), other wrong replies (crossed, malformed, clock going
backwards), divergences (reported by the replicas) and, at the end, leftover processes
(psutil: every process the campaign saw or started must be gone after the cluster
stopped; and after every fault: every process that was in a replica's tree, an agent,
its watchdog, its application and what that started, such as a PySpark driver's JVM and
Python workers, is gone once its replica was killed or its application reset). The
campaign's exit status is 0 only if all of them are zero and every fault settled.

Workloads (examples/): `kv` (kv_counter.py, a threaded line-protocol counter), `http`
(http_counter.py, one connection per request), `spark` (spark_counter.py, a PySpark
driver with its own local Spark session: a Spark job per request, a ticker thread with
a lock running Spark jobs with Python workers; 2 replicas by default, paced clients),
`connect` (spark_counter.py --remote, the same driver as a Spark Connect thin client:
the campaign starts one Connect server, shared by the replicas).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import psutil

from llft import EXAMPLES_DIR
from llft.runtime import proctree
from llft.runtime.config import DEFAULT_HANDOFF_WAIT_S
from llft.tools import memcgroup, netns
from llft.tools.cluster import ClusterError, LocalCluster
from llft.tools.loadclient import LoadResult, run_load
from llft.tools.procs import CPU_HOG_ARGV, free_port

KINDS = ("kill_primary", "kill_backup", "kill_both", "pause_primary", "pause_backup",
         "cpu_hog", "jvm_start", "restart")
# asked for by name only (not in the default mix, so the schedules of existing seeds stay):
# `kill_app` kills an application alone, `oom_child` has the OOM killer take its child,
# `kill_child` kills that child (`term_child`: with SIGTERM); `partition` runs every
# replica in a network namespace of its own (llft/tools/netns.py) and cuts one member's
# link for the hold time
EXTRA_KINDS = ("kill_app", "oom_child", "kill_child", "term_child", "partition")
TERM_STOP_S = 30.0              # restart: a replica stops this soon after SIGTERM (+ a hand-off)
APP_DEATH_EXIT_S = 30.0         # kill_app: the agent stops within this once its app died
OOM_CHILD_LIMIT_BYTES = 16 << 20    # oom_child: what the child may allocate after the move
OOM_CHILD_EXIT_S = 120.0        # ... and how soon it must have done so and its agent stopped
HOLD_S = {"partition": (0.5, 3.0), "pause_primary": (0.2, 3.0), "pause_backup": (0.2, 3.0), "cpu_hog": (0.5, 3.0),
          "jvm_start": (0.5, 3.0)}
DELAY_S = (0.1, 1.5)            # the random moment: after the round's clients got replies
SETTLE_TIMEOUT_S = 120.0        # deadline for the group to settle after a heal
RESUME_REPLIES = 20             # replies after the settle that show the service is back
WARMUP_TIMEOUT_S = 300.0        # the service's first replies after the start
REPLY_TIMEOUT_S = 60.0          # a client waiting longer than this for a reply: lost
STALE_TIMEOUT_S = 30.0          # a killed replica's or reset application's processes (a
                                # JVM running its shutdown hooks) gone within this
STALLED_FAULTS = 3              # the service answered no client after this many faults in a
                                # row: the campaign stops (the group no longer serves)


@dataclass(frozen=True)
class Workload:
    name: str
    script: str                 # examples/<script> PORT
    mode: str                   # llft.tools.loadclient mode
    replicas: int = 3           # the default --replicas
    interval_s: float = 0.0     # each client sends a request at most this often (0: back
                                # to back)
    resume_replies: int = RESUME_REPLIES
    connect_server: bool = False  # the app is a Spark Connect client (--remote): the
                                  # campaign runs one server for it (`llft spark-connect`)


WORKLOADS = {
    "kv": Workload("kv", "kv_counter.py", "counter"),
    "http": Workload("http", "http_counter.py", "http"),
    # a PySpark driver (a Spark job per request, a ticker thread running Spark jobs with
    # Python workers): every replica has its own JVM, so 2 replicas by default, and the
    # clients paced so that Spark alone does not saturate a small machine
    "spark": Workload("spark", "spark_counter.py", "counter", replicas=2, interval_s=0.25,
                      resume_replies=4),
    # the same driver as a Spark Connect thin client: the replicas share one Spark (the
    # campaign's Connect server); only the primary's calls reach it (through its agent's
    # gRPC relay), backups read the answers from the order information
    "connect": Workload("connect", "spark_counter.py", "counter", replicas=2,
                        interval_s=0.25, resume_replies=4, connect_server=True),
}
CONNECT_START_TIMEOUT_S = 240


@dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    delay_s: float              # injected this long after the round's clients got replies
    hold_s: float               # pause / hog / JVM duration (0: kills, restarts)
    pick: int                   # which member, among the candidates in rank order (modulo)


def schedule(seed: int, faults: int, kinds=KINDS, replicas: int = 3) -> list[Fault]:
    """The campaign's faults: a pure function of its arguments."""
    kinds = [k for k in kinds if not (k == "kill_both" and replicas < 3)]
    if not kinds:
        raise ValueError("no fault kind applies (kill_both needs 3 or more replicas)")
    rng = random.Random(seed)
    out = []
    for i in range(faults):
        kind = rng.choice(kinds)
        lo, hi = HOLD_S.get(kind, (0.0, 0.0))
        out.append(Fault(i, kind, round(rng.uniform(*DELAY_S), 3),
                         round(rng.uniform(lo, hi), 3), rng.randrange(1 << 16)))
    return out


@dataclass
class Outcome:
    """What one fault did, as the clients, the status files and the logs saw it."""
    fault: Fault
    target: str = ""
    settled: bool = False
    resumed: bool = False       # the clients got replies again after the settle
    settle_s: float = 0.0
    takeovers: int = 0
    views: int = 0
    resets: int = 0
    replies: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    diverged: int = 0
    pause_s: float = 0.0
    leftovers: int = 0          # processes of a killed replica or a reset application
                                # (its JVM, its Python workers...) still alive after the fault
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.settled and self.resumed and not self.lost and not self.duplicated and not self.wrong
                and not self.diverged and not self.leftovers)


def classify(r: LoadResult) -> tuple[int, int, int]:
    """(lost, duplicated, wrong) replies of one round of clients. A wrong reply that
    ended its client (unreadable, crossed) is wrong, not lost as well."""
    dup = r.global_repeats + sum(1 for e in r.errors if "twice" in e)
    fatal = sum(1 for e in r.errors
                if any(w in e for w in ("unexpected reply", "malformed", "crossed", "differ")))
    wrong = fatal + sum(1 for e in r.errors
                        if any(w in e for w in ("backwards", "not above", "never?")))
    return max(0, r.requests - r.replies - fatal), dup, wrong


class Campaign:
    def __init__(self, workdir: str, workload: Workload, replicas: int, clients: int,
                 say=print, namespaces: bool = False):
        self.workdir, self.wl, self.n, self.clients, self.say = (
            workdir, workload, replicas, clients, say)
        self.lc = LocalCluster(workdir, group="chaos", service_port=free_port())
        self.app = [sys.executable, os.path.join(EXAMPLES_DIR, workload.script),
                    str(self.lc.cfg.group("chaos").service_port)]
        self.replicas: list[str] = []           # names of the replicas we run now
        self.started = 0
        self.seen: dict[int, float] = {}        # pid -> create time, for the leftover check
        self.tree_seen: dict[int, float] = {}   # the same for the replicas' process trees
        self.extra: list[subprocess.Popen] = []  # hogs and JVMs the campaign started
        self.term_failures = 0               # replicas that did not stop when told (SIGTERM)
                                             # or when their app died
        self.departed: set[int] = set()
        self.exits = 0
        self.host, self.port = "", 0
        self.namespaces = namespaces
        self.seg: netns.Segment | None = None   # with namespaces: one slot per replica
        self.slot: dict[str, int] = {}          # replica name -> its namespace
        self.connect_port = 0                   # the Spark Connect server's, if one runs

    def _spark_connect(self, verb: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "llft", "spark-connect", verb, "--port",
             str(self.connect_port), "--dir", os.path.join(self.workdir, "spark-connect"),
             *extra], capture_output=True, text=True, timeout=CONNECT_START_TIMEOUT_S)

    # ---- the cluster ---------------------------------------------------------------------
    def start(self) -> None:
        if self.namespaces:
            self.seg = netns.Segment(self.n)
        if self.wl.connect_server:
            self.connect_port = free_port()
            r = self._spark_connect("start", "--master", "local[1]")
            if r.returncode != 0:
                raise ClusterError(f"the Spark Connect server did not start: "
                                   f"{_last_line(r.stderr or r.stdout)}")
            self.app += ["--remote", f"sc://127.0.0.1:{self.connect_port}"]
        for _ in range(self.n):
            self._new_replica()
            self.lc.wait_members(len(self.replicas), timeout_s=SETTLE_TIMEOUT_S)
        self.host, self.port = self.lc.start_gateway(
            config_path=self.lc.config_for(self.seg.host_addr) if self.seg else None)
        self._remember(self.lc.procs["gateway"].pid)
        # the first requests of a service can be slow (a PySpark driver's JVM compiles
        # its first query plans for tens of seconds on a busy machine): they are the
        # start-up's, not a fault's, so they are waited for here, with their own deadline
        r = run_load(self.host, self.port, clients=self.clients, requests=2,
                     mode=self.wl.mode, timeout_s=WARMUP_TIMEOUT_S)
        if not r.ok:
            raise ClusterError(f"the service did not answer its first requests within "
                               f"{WARMUP_TIMEOUT_S:.0f} s: {'; '.join(r.errors[:3])}")

    def _new_replica(self) -> str:
        self.started += 1
        name = f"r{self.started}"
        if self.seg is None:
            p = self.lc.start_replica(name, self.app)
        else:                                   # the namespace a gone replica left free
            i = min(set(range(self.n)) - {self.slot[r] for r in self.replicas})
            self.slot[name] = i
            p = self.lc.start_replica(name, self.app,
                                      config_path=self.lc.config_for(self.seg.addr[i]),
                                      wrap=lambda argv: self.seg.argv(i, argv))
        self._remember(p.pid)
        self.replicas.append(name)
        return name

    def _remember(self, pid) -> None:
        if not pid:
            return
        try:
            self.seen.setdefault(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            pass

    def _remember_trees(self) -> None:
        """Every process of every replica now: agents, their watchdogs, applications and
        what those started (a PySpark driver's JVM, its Python worker daemon...)."""
        for pid in self._tree_pids():
            try:
                t = psutil.Process(pid).create_time()
            except psutil.Error:
                continue
            self.seen.setdefault(pid, t)
            self.tree_seen.setdefault(pid, t)

    def _tree_pids(self) -> set[int]:
        out = set()
        for name in self.replicas:
            pid = self.lc.procs[name].pid
            out |= {pid, *(p.pid for p in proctree.descendants(pid))}
        return out

    def stale_processes(self, timeout_s: float = STALE_TIMEOUT_S) -> list[str]:
        """Processes once in a replica's tree that are in none now (their replica was
        killed or stopped, or their application reset) and still alive after timeout_s."""
        def left() -> list[psutil.Process]:
            current = self._tree_pids()
            return _alive({pid: t for pid, t in self.tree_seen.items() if pid not in current})
        return _describe(_until_gone(left, timeout_s))

    def _status(self) -> dict:
        st = self.lc.status()
        for m in st["members"] + st["joining"]:
            self._remember(m.get("agent_pid"))
            self._remember(m.get("app_pid"))
        for d in st["departed"]:
            if d["diverged"]:               # (not one that failed here: `failure`)
                self.departed.add(d["birth"])
        return st

    def _settled(self) -> bool:
        # a replica that stopped on its own (its app exited, a fatal error) is replaced
        for name in list(self.replicas):
            if not self.lc.alive(name):
                self.exits += 1
                self.replicas.remove(name)
                self.say(f"  {name} exited by itself (status {self.lc.procs[name].returncode})"
                         f": {_last_line(self.lc.log_tail(name, 400))}; starting a new one")
                self._new_replica()
        st = self._status()
        pids = {self.lc.procs[n].pid for n in self.replicas}
        ms = st["members"]
        return (len(ms) == self.n and {m["agent_pid"] for m in ms} == pids
                and not st["joining"]
                and all(m["app_pid"] and m["app_mode"] in ("primary", "backup") for m in ms)
                and sum(m["role"] == "primary" and m["app_mode"] == "primary"
                        for m in ms) == 1)

    def members(self) -> list[dict]:
        ms = self._status()["members"]
        for m in ms:
            m["name"] = self.lc.name_of(m["agent_pid"])
        return [m for m in ms if m["name"] in self.replicas]

    def log_counts(self) -> tuple[int, int]:
        """(resets, promotions) in every replica log so far."""
        resets = promoted = 0
        for name in self.lc.logs:
            if name.startswith("r"):
                text = self.lc.log_tail(name, 1 << 30)
                resets += text.count(" reset (")
                promoted += text.count(": application promoted after")
        return resets, promoted

    # ---- faults ----------------------------------------------------------------------------
    def inject(self, f: Fault) -> str:
        """Apply fault f and heal it; returns what it hit."""
        ms = self.members()
        primary = [m for m in ms if m["role"] == "primary"]
        backups = [m for m in ms if m["role"] != "primary"]
        if f.kind in ("kill_primary", "kill_backup", "kill_both"):
            victims = []
            if f.kind != "kill_backup":
                victims += primary[:1]
            if f.kind != "kill_primary" and backups:
                victims.append(backups[f.pick % len(backups)])
            for m in victims:                   # all signals first: "at once"
                os.kill(m["agent_pid"], signal.SIGKILL)
            for m in victims:
                self.lc.kill(m["name"])         # reaps it
                self.replicas.remove(m["name"])
            new = [self._new_replica() for _ in victims]
            return ", ".join(f"{m['name']} ({m['role']})" for m in victims) + \
                f" killed; started {', '.join(new)}"
        if f.kind in ("pause_primary", "pause_backup"):
            pool = primary if f.kind == "pause_primary" else backups
            if not pool:
                return "no such member"
            m = pool[f.pick % len(pool)]
            procs = [psutil.Process(m["agent_pid"])] + proctree.descendants(m["agent_pid"])
            for p in procs:
                self._remember(p.pid)
                _signal(p, signal.SIGSTOP)
            _hold(f.hold_s)                     # the fault itself: the pause lasts this long
            for p in reversed(procs):
                _signal(p, signal.SIGCONT)
            return f"{m['name']} ({m['role']}) stopped {f.hold_s:.2f} s"
        if f.kind == "cpu_hog":
            n = (os.cpu_count() or 1) + 1
            hogs = [self._spawn(CPU_HOG_ARGV) for _ in range(n)]
            _hold(f.hold_s)                     # the fault itself: the hog runs this long
            for p in hogs:
                _stop(p)
            return f"{n} busy processes for {f.hold_s:.2f} s"
        if f.kind == "jvm_start":
            p = self._spawn(["java", "-Xms256m", _jvm_source(self.workdir), str(f.hold_s)])
            try:
                p.wait(timeout=f.hold_s + 60)
            except subprocess.TimeoutExpired:
                pass
            _stop(p)
            return f"JVM start-up + 64 threads for {f.hold_s:.2f} s"
        if f.kind == "kill_app":
            if not ms:
                return "no member"
            m = ms[f.pick % len(ms)]
            os.kill(m["app_pid"], signal.SIGKILL)
            how = self._stops_by_itself(m["name"], APP_DEATH_EXIT_S)
            return (f"{m['name']} ({m['role']}): application killed, {how}; "
                    f"started {self._new_replica()}")
        if f.kind in ("oom_child", "kill_child", "term_child"):
            if not ms:
                return "no member"
            why = memcgroup.why_not() if f.kind == "oom_child" else None
            if why:
                return f"no memory cgroup ({why})"
            m = ms[f.pick % len(ms)]
            kids = proctree.child_pids(m["app_pid"]) or []
            if not kids:
                return f"{m['name']} ({m['role']}): its application has no child"
            name = proctree.comm(kids[0])
            if f.kind in ("kill_child", "term_child"):
                sig = signal.SIGKILL if f.kind == "kill_child" else signal.SIGTERM
                os.kill(kids[0], sig)
                how = self._stops_by_itself(m["name"], APP_DEATH_EXIT_S)
                done = f"killed ({sig.name})"
            else:
                with memcgroup.MemoryCgroup(OOM_CHILD_LIMIT_BYTES) as cg:
                    cg.add(kids[0])
                    how = self._stops_by_itself(m["name"], OOM_CHILD_EXIT_S)
                done = f"limited to {OOM_CHILD_LIMIT_BYTES >> 20} MB more"
            return (f"{m['name']} ({m['role']}): its application's child {kids[0]} ({name}) "
                    f"{done}, {how}; started {self._new_replica()}")
        if f.kind == "restart":
            if not ms:
                return "no member"
            m = ms[f.pick % len(ms)]
            how = "stopped (SIGTERM)"
            # (a primary whose successor is still catching up serves on at most
            # handoff_wait_s first: docs/DESIGN.md, "A graceful stop")
            limit_s = DEFAULT_HANDOFF_WAIT_S + TERM_STOP_S
            try:
                self.lc.kill(m["name"], signal.SIGTERM, timeout_s=limit_s)
            except subprocess.TimeoutExpired:
                # a replica must leave on SIGTERM: a failure of this fault, not the end of
                # the campaign
                self.lc.kill(m["name"], signal.SIGKILL)
                how = f"did NOT stop on SIGTERM in {limit_s:g} s (SIGKILLed)"
                self.term_failures += 1
            self.replicas.remove(m["name"])
            return f"{m['name']} ({m['role']}) {how}; started {self._new_replica()}"
        if f.kind == "partition":
            if not ms or self.seg is None:
                return "no member" if ms else "no namespaces"
            m = ms[f.pick % len(ms)]
            i = self.slot[m["name"]]
            self.seg.cut(i)
            try:
                _hold(f.hold_s)                 # the fault itself: the link is cut this long
            finally:
                self.seg.heal(i)
            return f"{m['name']} ({m['role']}) cut off {f.hold_s:.2f} s"
        raise ValueError(f"unknown fault kind {f.kind!r}")

    def _stops_by_itself(self, name: str, timeout_s: float) -> str:
        """Replica `name`'s agent must stop by itself (its app, or a child of it, died):
        how it did; SIGKILLed after `timeout_s` (a failure of the fault). It is gone
        from the campaign's replicas either way."""
        try:
            how = f"its agent stopped (status {self.lc.procs[name].wait(timeout=timeout_s)})"
        except subprocess.TimeoutExpired:
            self.lc.kill(name, signal.SIGKILL)
            how = f"its agent did NOT stop in {timeout_s:g} s (SIGKILLed)"
            self.term_failures += 1
        self.replicas.remove(name)
        return how

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        """A fault's own program (CPU hogs, a JVM): another program on the machine, in a
        session of its own as a user's would be (autogroup scheduling ranks sessions)."""
        with open(os.path.join(self.workdir, "faults.log"), "ab") as log:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 cwd=self.workdir, start_new_session=True)
        self.extra.append(p)
        self._remember(p.pid)
        return p

    def run_fault(self, f: Fault) -> Outcome:
        out = Outcome(f)
        view0 = self._status()["view"] or 0
        departed0 = set(self.departed)
        resets0, promoted0 = self.log_counts()
        self._remember_trees()
        replies = [0]
        got = threading.Condition()

        def on_reply(_client: int, _n: int) -> None:
            with got:
                replies[0] += 1
                got.notify_all()

        def wait_replies(n: int, timeout_s: float) -> bool:
            with got:
                return got.wait_for(lambda: replies[0] >= n or not load.is_alive(),
                                    timeout_s) and replies[0] >= n

        stop = threading.Event()
        res: dict = {}
        load = threading.Thread(target=lambda: res.setdefault("r", run_load(
            self.host, self.port, clients=self.clients, requests=1 << 30,
            mode=self.wl.mode, timeout_s=REPLY_TIMEOUT_S, stop=stop, on_reply=on_reply,
            interval_s=self.wl.interval_s)),
            daemon=True)
        load.start()
        try:
            if not wait_replies(self.clients, SETTLE_TIMEOUT_S):
                out.errors.append("the clients got no replies before the fault")
            _hold(f.delay_s)                    # the random moment of the schedule
            term_failures = self.term_failures
            self._remember_trees()              # what the fault may kill or reset
            out.target = self.inject(f)
            if self.term_failures > term_failures:
                out.errors.append(f"{out.target}: a replica did not stop")
            t0 = time.monotonic()
            deadline = t0 + SETTLE_TIMEOUT_S
            while not self._settled():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)                # polling status files, with a deadline
            out.settled = time.monotonic() <= deadline
            out.settle_s = time.monotonic() - t0
            if not out.settled:
                st = self.lc.status()
                # what `_settled` compares: the members' agents against ours, and who else
                # claims to be joining (a stale status file once stood there for 120 s)
                brief = [{k: m.get(k) for k in ("birth_hex", "role", "agent_pid", "app_pid",
                                                "app_mode", "sync")}
                         for m in st["members"] + st["joining"]]
                out.errors.append(f"not settled in {SETTLE_TIMEOUT_S:.0f} s: ours "
                                  f"{sorted(self.lc.procs[n].pid for n in self.replicas)}, "
                                  f"{len(st['members'])} members + {len(st['joining'])} "
                                  f"joining: {json.dumps(brief)[:900]}")
            with got:
                base = replies[0]
            out.resumed = wait_replies(base + self.wl.resume_replies, REPLY_TIMEOUT_S)
            if not out.resumed:
                out.errors.append("the clients got no replies after the group settled")
        finally:
            stop.set()
            load.join(REPLY_TIMEOUT_S + 10)
        r: LoadResult | None = res.get("r")
        if r is None:
            out.errors.append("the clients did not finish")
        else:
            out.replies = r.replies
            out.lost, out.duplicated, out.wrong = classify(r)
            out.pause_s = r.max_gap_s
            out.errors += r.errors[:5]
        st = self._status()
        out.views = (st["view"] or 0) - view0
        resets, promoted = self.log_counts()
        out.resets, out.takeovers = resets - resets0, promoted - promoted0
        out.diverged = (sum(1 for m in st["members"] if m["diverged"])
                        + len(self.departed - departed0))
        stale = self.stale_processes()
        out.leftovers = len(stale)
        out.errors += [f"left behind: {x}" for x in stale[:5]]
        self._remember_trees()                  # the new replicas' and applications' trees
        return out

    # ---- the end ---------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop everything; the processes still alive afterwards (should be none)."""
        for p in self.extra:
            _stop(p)
        for m in self.lc.status()["members"]:
            self._remember(m.get("agent_pid"))
            self._remember(m.get("app_pid"))
            for p in proctree.descendants(m.get("agent_pid") or 0):
                self._remember(p.pid)
        self.lc.stop(timeout_s=30)
        out_stop = []
        if self.connect_port and (r := self._spark_connect("stop")).returncode != 0:
            out_stop.append(f"spark-connect stop: {_last_line(r.stderr or r.stdout)}")
        left = _until_gone(lambda: [p for p in self._alive_seen() if p.pid != os.getpid()], 15)
        out = out_stop + _describe(left)
        for p in left:
            _signal(p, signal.SIGKILL)
        if self.seg is not None:
            try:
                self.seg.close()
            except netns.NetnsError as e:
                out.append(str(e))
            out += [f"network namespace or link {x}" for x in self.seg.leftovers()]
        return out

    def _alive_seen(self) -> list[psutil.Process]:
        alive = _alive(self.seen)
        # and anything running from the campaign's folder that we never saw
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid not in self.seen and any(self.workdir in a for a in
                                                  (p.info["cmdline"] or [])):
                    alive.append(p)
            except psutil.Error:
                pass
        return alive


def _alive(seen: dict[int, float]) -> list[psutil.Process]:
    """The processes of {pid: create time} still running (a reused pid is another)."""
    return [p for p in (proctree.running(pid, created) for pid, created in seen.items())
            if p is not None]


def _until_gone(alive, timeout_s: float) -> list[psutil.Process]:
    """Poll alive() (processes expected to exit) until it is empty or timeout_s passed;
    what is still alive then."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = alive()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)                        # polling exits, with a deadline


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"pid {p.pid}: {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return out


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)          # psutil checks the start time: a reused pid is spared
    except psutil.Error:
        pass


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


def _hold(seconds: float) -> None:
    """A duration that is part of the fault (a pause, a hog, the random moment of
    injection), never a stand-in for waiting on something."""
    threading.Event().wait(seconds)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


JVM_SOURCE = """
import java.security.MessageDigest;
import java.util.ArrayList;
public class ChaosJvm {
    public static void main(String[] a) throws Exception {
        long end = System.nanoTime() + (long) (Double.parseDouble(a[0]) * 1e9);
        ArrayList<Thread> ts = new ArrayList<>();
        for (int i = 0; i < 64; i++) {
            Thread t = new Thread(() -> {
                try {
                    MessageDigest md = MessageDigest.getInstance("SHA-256");
                    ArrayList<byte[]> keep = new ArrayList<>();
                    while (System.nanoTime() < end) {
                        byte[] b = new byte[4096];
                        keep.add(md.digest(b));
                        if (keep.size() > 10000) keep.clear();
                    }
                } catch (Exception e) { throw new RuntimeException(e); }
            });
            t.start();
            ts.add(t);
        }
        for (Thread t : ts) t.join();
    }
}
"""


def _jvm_source(workdir: str) -> str:
    path = os.path.join(workdir, "ChaosJvm.java")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(JVM_SOURCE)
    return path


# ---- the command ---------------------------------------------------------------------------
@dataclass
class Report:
    seed: int
    workload: str
    replicas: int
    outcomes: list[Outcome]
    leftovers: list[str]
    exits: int
    setup_error: str = ""

    def totals(self) -> dict:
        o = self.outcomes
        return {"faults": len(o), "settled": sum(x.settled for x in o),
                "takeovers": sum(x.takeovers for x in o), "views": sum(x.views for x in o),
                "resets": sum(x.resets for x in o), "exits": self.exits,
                "replies": sum(x.replies for x in o),
                "max_pause_s": max((x.pause_s for x in o), default=0.0),
                "lost": sum(x.lost for x in o), "duplicated": sum(x.duplicated for x in o),
                "wrong": sum(x.wrong for x in o), "diverged": sum(x.diverged for x in o),
                "leftovers": len(self.leftovers) + sum(x.leftovers for x in o)}

    @property
    def ok(self) -> bool:
        return not self.setup_error and not self.leftovers and all(x.ok for x in self.outcomes)

    def to_dict(self) -> dict:
        return {"seed": self.seed, "workload": self.workload, "replicas": self.replicas,
                "ok": self.ok, "totals": self.totals(), "leftovers": self.leftovers,
                "setup_error": self.setup_error,
                "faults": [{**asdict(x.fault), **{k: v for k, v in asdict(x).items()
                                                  if k != "fault"}, "ok": x.ok}
                           for x in self.outcomes]}


def table(rep: Report) -> str:
    by_kind: dict[str, list[Outcome]] = {}
    for o in rep.outcomes:
        by_kind.setdefault(o.fault.kind, []).append(o)
    cols = ("kind", "faults", "settled", "takeovers", "views", "resets", "max pause ms",
            "lost", "dup", "wrong", "diverged", "left")
    rows = []
    for kind, os_ in sorted(by_kind.items()):
        rows.append((kind, len(os_), sum(o.settled for o in os_), sum(o.takeovers for o in os_),
                     sum(o.views for o in os_), sum(o.resets for o in os_),
                     f"{max(o.pause_s for o in os_) * 1000:.0f}", sum(o.lost for o in os_),
                     sum(o.duplicated for o in os_), sum(o.wrong for o in os_),
                     sum(o.diverged for o in os_), sum(o.leftovers for o in os_)))
    t = rep.totals()
    rows.append(("total", t["faults"], t["settled"], t["takeovers"], t["views"], t["resets"],
                 f"{t['max_pause_s'] * 1000:.0f}", t["lost"], t["duplicated"], t["wrong"],
                 t["diverged"], sum(o.leftovers for o in rep.outcomes)))
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(cols)]
    line = lambda r: "  ".join(str(v).rjust(w) if i else str(v).ljust(w)  # noqa: E731
                               for i, (v, w) in enumerate(zip(r, widths)))
    out = [line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out.append(f"replies checked: {t['replies']}; replicas that exited by themselves: "
               f"{t['exits']}; leftover processes: {t['leftovers']} (left: after a fault, "
               f"a gone replica's or reset application's)")
    return "\n".join(out)


def campaign(workdir: str, wl: Workload, faults: list[Fault], replicas: int, clients: int,
             seed: int, say=print, fresh_every: int = 0) -> Report:
    """Run `faults` against one cluster, or with `fresh_every` N against a fresh cluster
    for every N faults (the group's log, which every joiner replays, grows with the
    campaign: open item 3 of docs/ARCHITECTURE.md). A cluster that stops serving ends
    its share of the faults; the next share gets a fresh cluster."""
    size = fresh_every if fresh_every > 0 else max(1, len(faults))
    shares = [faults[i:i + size] for i in range(0, len(faults), size)] or [[]]
    rep = Report(seed, wl.name, replicas, [], [], 0)
    stops = []
    namespaces = any(f.kind == "partition" for f in faults)
    for k, share in enumerate(shares):
        folder = workdir if len(shares) == 1 else os.path.join(workdir, f"cluster{k}")
        stop, interrupted = _one_cluster(folder, wl, share, replicas, clients, seed, say, rep,
                                         namespaces)
        if stop:
            stops.append(stop)
        if interrupted:
            break
    rep.setup_error = "; ".join(stops)
    return rep


def _one_cluster(workdir: str, wl: Workload, faults: list[Fault], replicas: int,
                 clients: int, seed: int, say, rep: Report,
                 namespaces: bool = False) -> tuple[str, bool]:
    """Faults against one new cluster, into `rep`; (why it stopped early, interrupted)."""
    os.makedirs(workdir, exist_ok=True)
    c = Campaign(workdir, wl, replicas, clients, say, namespaces)
    stop, interrupted, stalled, done = "", False, 0, 0
    try:
        c.start()
        say(f"{replicas} replicas of examples/{wl.script} and a gateway on "
            f"{c.host}:{c.port}; {clients} {wl.mode} clients; {len(faults)} faults "
            f"(seed {seed})")
        for f in faults:
            o = c.run_fault(f)
            rep.outcomes.append(o)
            done += 1
            say(f"[{f.index:3d}] {f.kind:13s} {o.target}: settled "
                f"{'in %.1f s' % o.settle_s if o.settled else 'NO'}, takeovers {o.takeovers},"
                f" resets {o.resets}, pause {o.pause_s * 1000:.0f} ms, replies {o.replies},"
                f" lost {o.lost}, dup {o.duplicated}, wrong {o.wrong}, diverged {o.diverged}"
                f"{', left %d' % o.leftovers if o.leftovers else ''}"
                + ("" if o.ok else "  <-- FAILED"))
            for e in o.errors[:3]:
                say(f"        {e}")
            stalled = 0 if o.resumed else stalled + 1
            if not o.settled or stalled >= STALLED_FAULTS:
                # the group is in no state for more faults: say so, keep its logs
                stop = (f"fault {f.index}: " + ("the group did not settle" if not o.settled
                        else f"no replies after {stalled} faults in a row")
                        + f" ({len(faults) - done} faults of this cluster skipped)")
                break
    except (ClusterError, netns.NetnsError, OSError) as e:
        stop = f"{type(e).__name__}: {e}"
        say(f"llft chaos: {stop}")
    except KeyboardInterrupt:
        stop, interrupted = f"interrupted after {len(rep.outcomes)} faults", True
        say(f"llft chaos: {stop}; stopping the cluster")
    finally:
        rep.leftovers += c.stop()
        rep.exits += c.exits
    return stop, interrupted


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="kv")
    p.add_argument("--faults", type=int, default=20, help="faults in the campaign")
    p.add_argument("--seed", type=int, default=1, help="the schedule's seed")
    p.add_argument("--replicas", type=int, default=None,
                   help="replicas in the group (default: 3; 2 for the spark workload, whose "
                        "every replica runs a JVM)")
    p.add_argument("--clients", type=int, default=2, help="concurrent checking clients")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated fault kinds (default: all: {','.join(KINDS)}; "
                        f"also {','.join(EXTRA_KINDS)}: replicas in network namespaces, "
                        "needs root)")
    p.add_argument("--only", default="",
                   help="run only these fault indexes of the schedule (e.g. 3,7)")
    p.add_argument("--fresh-every", type=int, default=0, metavar="N",
                   help="a fresh cluster for every N faults (default: one cluster)")
    p.add_argument("--keep", action="store_true",
                   help="keep the work folder (logs, status) also when the campaign "
                        "passes (a failing one always keeps it)")
    p.add_argument("--json", default="", help="also write the report as JSON to this file")


def run(args) -> int:
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS + EXTRA_KINDS]
    if bad:
        print(f"llft chaos: unknown fault kinds {','.join(bad)} "
              f"(known: {','.join(KINDS + EXTRA_KINDS)})", file=sys.stderr)
        return 2
    why_not = netns.available() if "partition" in kinds else None
    if why_not:
        print(f"llft chaos: partition faults need network namespaces: {why_not}",
              file=sys.stderr)
        return 2
    wl = WORKLOADS[args.workload]
    replicas = args.replicas if args.replicas is not None else wl.replicas
    if replicas < 2 or args.faults < 0 or args.clients < 1 or args.fresh_every < 0:
        print("llft chaos: needs --replicas >= 2, --faults >= 0, --clients >= 1, "
              "--fresh-every >= 0", file=sys.stderr)
        return 2
    try:
        only = {int(x) for x in args.only.split(",") if x}
    except ValueError:
        print(f"llft chaos: --only {args.only!r}: expected fault indexes such as 3,7",
              file=sys.stderr)
        return 2
    try:
        faults = schedule(args.seed, args.faults, kinds, replicas)
    except ValueError as e:
        print(f"llft chaos: {e}", file=sys.stderr)
        return 2
    if only:
        faults = [f for f in faults if f.index in only]
    work = tempfile.mkdtemp(prefix="llft-chaos-")
    rep = None
    try:
        rep = campaign(work, wl, faults, replicas, args.clients,
                       args.seed, say=lambda s: print(s, flush=True),
                       fresh_every=args.fresh_every)
    finally:
        # a failing campaign keeps its logs whatever was asked: a rare failure may not
        # come back when re-run with --keep (one took forty runs)
        keep = args.keep or rep is None or not rep.ok
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rep))
    for x in rep.leftovers:
        print(f"leftover: {x}")
    if rep.setup_error:
        print(f"campaign stopped: {rep.setup_error}")
    failed = [o.fault.index for o in rep.outcomes if not o.ok]
    argv = (f"llft chaos --workload {args.workload} --seed {args.seed} --faults {args.faults}"
            f" --replicas {replicas} --clients {args.clients}"
            + (f" --kinds {args.kinds}" if args.kinds != ",".join(KINDS) else "")
            + (f" --fresh-every {args.fresh_every}" if args.fresh_every else ""))
    if failed:
        print(f"failed faults: {failed}; re-run one: {argv} --only {failed[0]} --keep")
    print("RESULT: " + ("OK" if rep.ok else "FAILED") + f"  ({argv})")
    if keep:
        print(f"work folder kept: {work}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep.to_dict(), f, indent=1)
    return 0 if rep.ok else 1
