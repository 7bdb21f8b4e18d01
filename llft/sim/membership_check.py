"""`llft simulate membership`: seeded fault schedules against the real membership core.

Theory of operation
-------------------
Each schedule (one seed) runs 2-5 replicas of one group on the simulator kernel
(`llft/sim/kernel.py`, reused as is: real wire codec, loss, duplication, reordering,
corruption, partitions, crashes). The only adapter on our side is `_Harness`: it feeds
`BeginPhase2` back as `phase2_complete` after a random simulated delay (the messaging
layer's NewPrimaryView round, absent here) and records what every replica installs.

A schedule has one to three rounds, each a *fault phase* (replicas start at random
times; crashes of primaries and backups, including a second crash while the primary
change is in progress; restarts with new cores, i.e. new birth ids; 2- and 3-way
partitions that heal; per-datagram loss, duplication, reordering, corruption) then a
*quiet phase* (no more faults, the network healed, at least one replica alive) at whose
end convergence and pruning are checked.

Checks, on every schedule:
  agreement      every replica that installs membership (pvn, primary, change) installs
                 the same members, in the same rank order, and is itself one of them.
  one primary    for each primary view number, no replica enters the views of two
                 different primaries (a replica "enters" a view once it knows phase 1
                 of that view completed); and in schedules without partitions, each
                 history of the group (views rooted at one founding) has exactly one
                 primary per view number. Two primaries of one number exist only in
                 disjoint branches of a partition, as theorem 1 allows.
  pruning        at the end, every live replica's history of entered views lies on the
                 lineage of the surviving primary view (a replica of a side branch must
                 have reset and rejoined under a new birth id to be there), and no
                 precedence is assigned twice along that lineage.
  convergence    once faults stop, within `bound_us` (printed), one primary view forms
                 that contains every live replica, all of them restored and agreeing on
                 pvn, change, members and primary.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from llft.protocol.messages import MsgType
from llft.sim.kernel import NetConfig, Sim
from membership.core import (BeginPhase2, Config, Membership, MembershipChanged, Reset,
                             Send, StateRestored, Status, ViewEntered)
from membership.rules import Key

GROUP = "g"
STATE_BYTES_MAX = 40_000           # random checkpoint sizes exercise State chunking
SIM_CONFIG = Config(group=GROUP, state_chunk_bytes=4_096, state_window_chunks=4)


def bound_us(cfg: Config, n: int) -> int:
    """Time from "faults stop" to a full primary view, worst case, no faults:
    a primary view change whose proposals lose every dead member (the last rank's
    detector, then two proposal ack timeouts), phase 2, the pruning of a side branch
    (one heartbeat interval), a joiner that may have to found the group
    (found_timeout) and n admissions, each at most a ProposeBackup retry period, a
    backup-removal round and a state transfer (a few retransmit periods)."""
    detect = cfg.fault_timeout_us(n) + 2 * cfg.ack_timeout_us
    admit = cfg.join_retry_us + cfg.ack_timeout_us + cfg.backup_timeout_us + 4 * cfg.retransmit_us
    return detect + cfg.found_timeout_us + cfg.heartbeat_interval_us + n * admit + PHASE2_MAX_US


PHASE2_MAX_US = 10_000            # the NewPrimaryView round of the messaging layer


class StateBlob:
    """A checkpoint whose integrity the joining backup can verify."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.restored: list[bytes] = []

    def checkpoint(self) -> bytes:
        n = self.rng.randrange(STATE_BYTES_MAX)
        body = self.rng.randbytes(n)
        return len(body).to_bytes(4, "big") + body

    def restore(self, data: bytes) -> None:
        if int.from_bytes(data[:4], "big") != len(data) - 4:
            raise AssertionError(f"restored state of {len(data)} bytes is corrupt")
        self.restored.append(data)


@dataclass
class _Record:
    installs: dict[tuple[int, int, int], tuple[Key, ...]] = field(default_factory=dict)
    entered: dict[int, dict[int, int]] = field(default_factory=dict)    # birth -> pvn -> primary
    # (pvn, primary) -> (pvn, primary, change) of the parent view at the fork, or None
    parent: dict[tuple[int, int], tuple[int, int, int] | None] = field(default_factory=dict)
    last_install: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)       # coverage: what the run exercised
    primaries: dict[int, set[int]] = field(default_factory=dict)  # pvn -> primaries formed
    proposers: dict[int, set[int]] = field(default_factory=dict)  # old pvn -> proposers


class _Harness:
    def __init__(self, seed: int, *, quiet_check_us: int = 1_000, trace=None):
        self.seed = seed
        self.trace = trace                 # print-like callable: a readable event log
        self.rng = random.Random(seed)
        r = self.rng
        self.n = r.choice([2, 3, 3, 4, 4, 5])
        self.faults = NetConfig(loss=r.choice([0, 0.01, 0.05, 0.15]),
                                dup=r.choice([0, 0.02, 0.1]),
                                reorder=r.choice([0, 0.05, 0.2]),
                                corrupt=r.choice([0, 0, 0.01]))
        self.sim = Sim(r.getrandbits(64), self.faults)
        self.cfg = SIM_CONFIG
        self.rec = _Record()
        self.quiet_check_us = quiet_check_us
        self.nodes = list(range(self.n))
        self.started: set[int] = set()
        self.wiped_out = False

    # -- the adapter: cores on the kernel ---------------------------------------------
    def _new_core(self, node: int) -> Membership:
        cfg = self.cfg
        core = Membership(Config(**{**cfg.__dict__, "host": "sim", "pid": node}),
                          random.Random(self.sim.rng.getrandbits(64)),
                          StateBlob(random.Random(self.sim.rng.getrandbits(64))))
        take, rec = core.take_actions, self.rec

        def counted():                   # sends go to the kernel: count proposals here
            acts = take()
            for a in acts:
                if isinstance(a, Send) and a.msg.type is MsgType.PROPOSE_PRIMARY:
                    who = rec.proposers.setdefault(a.msg.body["old_pvn"], set())
                    if a.msg.sender not in who:
                        who.add(a.msg.sender)
                        rec.stats["proposals"] += 1
                        if len(who) == 2:
                            rec.stats["view numbers with competing proposals"] += 1
            return acts
        core.take_actions = counted
        return core

    def _start(self, node: int, restart: bool) -> None:
        core = self._new_core(node)
        core.start(self.sim.now_us)
        if restart:
            self.sim.restart(node, core)
        else:
            self.sim.add_node(node, core, [GROUP], on_action=self._on_action)
        self.started.add(node)

    def _log(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"{self.sim.now_us / 1000:10.3f} ms  {text}")

    def _on_action(self, node: int, action, now_us: int) -> None:
        rec = self.rec
        if self.trace is not None:
            self._log(f"n{node} {action}")
        if isinstance(action, MembershipChanged):
            key = (action.pvn, action.members[0].birth, action.change)
            rank = [k.birth for k in action.members].index(action.birth) + 1 \
                if any(k.birth == action.birth for k in action.members) else 0
            if rank == 0 or rank != action.my_rank:
                rec.violations.append(f"agreement: {action.birth} installed {key} "
                                      f"with rank {action.my_rank}, not as member {rank}")
            prev = rec.installs.setdefault(key, action.members)
            if prev != action.members:
                rec.violations.append(f"agreement: membership {key} is {prev} at one "
                                      f"replica and {action.members} at {action.birth}")
            view = (action.pvn, action.members[0].birth)
            prev = rec.last_install.get(action.birth)
            if view not in rec.parent and (prev is None or prev[:2] != view):
                # the first replica to install a view is its primary (founding, phase 1)
                # or an acceptor of its proposal: either way it forked from `prev`
                rec.parent[view] = prev
            rec.last_install[action.birth] = key
        elif isinstance(action, ViewEntered):
            seen = rec.entered.setdefault(action.birth, {})
            other = seen.setdefault(action.pvn, action.primary)
            if other != action.primary:
                rec.violations.append(f"one primary: replica {action.birth} entered view "
                                      f"{action.pvn} of primary {other} and of {action.primary}")
        elif isinstance(action, Reset):
            rec.stats["reset: " + action.reason.split(" ")[0]] += 1
        elif isinstance(action, StateRestored):
            rec.stats["state transfers"] += 1
        elif isinstance(action, BeginPhase2):
            rec.stats["views formed"] += 1
            prims = rec.primaries.setdefault(action.pvn, set())
            prims.add(action.members[0].birth)
            if len(prims) == 2:
                rec.stats["view numbers with 2+ primaries (disjoint branches)"] += 1
            core = self.sim.core(node)
            delay = self.sim.rng.randint(0, PHASE2_MAX_US)

            def complete(sim, core=core, pvn=action.pvn):
                if sim.alive(node) and sim.core(node) is core:
                    core.phase2_complete(pvn, sim.now_us)
            self.sim.at(self.sim.now_us + delay, complete, node_id=node)

    # -- the schedule -----------------------------------------------------------------
    def _live(self) -> list[int]:
        return [n for n in self.started if self.sim.alive(n)]

    def _primary_node(self) -> int | None:
        best = None
        for n in self._live():
            c = self.sim.core(n)
            if c.status in (Status.PRIMARY, Status.PRIMARY_PHASE2):
                if best is None or c.key > self.sim.core(best).key:
                    best = n
        return best

    def _crash(self, pick: str):
        def act(sim):
            live = self._live()
            if not live:
                return
            if pick == "primary":
                victim = self._primary_node()
            elif pick == "successor":
                # the replica changing the primary right now, else the next in line
                busy = [n for n in live if sim.core(n).status in
                        (Status.PROPOSING, Status.PRIMARY_PHASE2)]
                ranked = sorted((sim.core(n).rank, n) for n in live
                                if sim.core(n).status is Status.BACKUP)
                victim = busy[0] if busy else (ranked[0][1] if ranked else None)
                if busy:
                    self.rec.stats[f"crashes while {sim.core(busy[0]).status.value}"] += 1
            else:
                victim = None
            if victim is None:
                victim = self.rng.choice(sorted(live))
            sim.crash(victim)
            self._log(f"crash n{victim} ({pick})")
            if not self._live():
                self.wiped_out = True       # the group's history starts over
        return act

    def _restart_one(self, sim) -> None:
        dead = sorted(n for n in self.nodes if n in self.started and not sim.alive(n))
        if dead:
            node = self.rng.choice(dead)
            self._log(f"restart n{node}")
            self._start(node, restart=True)

    def _partition(self, sim) -> None:
        nodes = sorted(self.started)
        if len(nodes) < 2:
            return
        self.rng.shuffle(nodes)
        if len(nodes) >= 3 and self.rng.random() < 0.3:
            a, b = sorted(self.rng.sample(range(1, len(nodes)), 2))
            sim.partition(nodes[:a], nodes[a:b], nodes[b:])
            self._log(f"partition {nodes[:a]} | {nodes[a:b]} | {nodes[b:]}")
        else:
            cut = self.rng.randrange(1, len(nodes))
            sim.partition(nodes[:cut], nodes[cut:])
            self._log(f"partition {nodes[:cut]} | {nodes[cut:]}")

    def build(self, start_us: int) -> int:
        """Schedule one fault phase from `start_us`; return when it ends (us)."""
        r, sim = self.rng, self.sim
        if start_us == 0:
            fault_us = r.randint(300_000, 900_000)
            for node in self.nodes:
                t = 0 if node == 0 else r.randint(0, 150_000)
                sim.at(t, lambda s, node=node: self._start(node, restart=False))
            t = r.randint(100_000, 250_000)
        else:
            fault_us = start_us + r.randint(100_000, 500_000)
            sim.at(start_us, lambda s: s.set_faults(self.faults))
            t = start_us + r.randint(0, 50_000)
        while t < fault_us:
            kind = r.choices(["crash_primary", "crash_backup", "restart", "partition",
                              "crash_during_change"], [3, 2, 3, 2, 2])[0]
            if kind == "crash_primary":
                sim.at(t, self._crash("primary"))
            elif kind == "crash_backup":
                sim.at(t, self._crash("any"))
            elif kind == "restart":
                sim.at(t, self._restart_one)
            elif kind == "partition":
                sim.at(t, self._partition)
                sim.at(min(fault_us, t + r.randint(20_000, 200_000)), self._heal)
            else:
                sim.at(t, self._crash("primary"))
                # the successor detects the crash one base timeout after the last
                # heartbeat, then runs phase 1 (longer under loss) and phase 2
                base = self.cfg.timeout_base_us
                sim.at(min(fault_us, t + r.randint(base - 3_000, base + 12_000)),
                       self._crash("successor"))
            t += r.randint(30_000, 200_000)
        return fault_us

    def _heal(self, sim) -> None:
        sim.heal()
        self._log("heal")

    def converged(self) -> str | None:
        """None when one primary view holds every live replica, else why not."""
        live = self._live()
        if not live:
            return "no live replica"
        cores = [self.sim.core(n) for n in live]
        prim = [c for c in cores if c.status is Status.PRIMARY]
        if len(prim) != 1:
            return f"{len(prim)} primaries in status PRIMARY"
        p = prim[0]
        births = {c.birth for c in cores}
        if {k.birth for k in p.members} != births:
            return f"primary's members {p.members} != live {sorted(births)}"
        for c in cores:
            if c is not p and c.status is not Status.BACKUP:
                return f"replica {c.birth} is {c.status.value}"
            if (c.pvn, c.change, c.members) != (p.pvn, p.change, p.members):
                return f"replica {c.birth} holds {(c.pvn, c.change)} not {(p.pvn, p.change)}"
        return None

    def check_pruning(self) -> None:
        p = self.sim.core(self._primary_node())
        # lineage: (pvn, primary) -> last change of that view before the branch forked
        lineage: dict[tuple[int, int], int] = {}
        at: tuple[int, int, int] | None = (p.pvn, p.birth, p.change)
        while at is not None and at[:2] not in lineage:
            lineage[at[:2]] = at[2]
            at = self.rec.parent.get(at[:2])
        owner: dict[int, int] = {}
        for (pvn, primary, change), members in self.rec.installs.items():
            if change <= lineage.get((pvn, primary), -1):
                for k in members:
                    if owner.setdefault(k.precedence, k.birth) != k.birth:
                        self.rec.violations.append(
                            f"precedence {k.precedence} assigned to {owner[k.precedence]} "
                            f"and to {k.birth} in the surviving lineage")
        for n in self._live():
            b = self.sim.core(n).birth
            for pvn, primary in self.rec.entered.get(b, {}).items():
                if (pvn, primary) not in lineage:
                    self.rec.violations.append(
                        f"pruning: live replica {b} entered view {pvn} of {primary}, "
                        f"which is not on the surviving lineage")

    def check_one_primary_per_history(self) -> None:
        """Without partitions, each history of the group (a tree of views rooted at a
        founding) has one primary per view number: competing proposals never both form.
        (With partitions theorem 1 allows disjoint branches until the heal.)"""
        if self.sim.stats["partitions"]:
            return
        def root(view):
            seen = set()
            while view in self.rec.parent and self.rec.parent[view] is not None \
                    and view not in seen:
                seen.add(view)
                view = self.rec.parent[view][:2]
            return view
        by: dict[tuple[tuple[int, int], int], int] = {}
        for pvn, prims in self.rec.primaries.items():
            for primary in prims:
                r = root((pvn, primary))
                other = by.setdefault((r, pvn), primary)
                if other != primary:
                    self.rec.violations.append(
                        f"one primary: view {pvn} formed by {other} and by {primary} "
                        f"in one history, without a partition")

    def run(self) -> tuple[list[str], int | None]:
        """Run the schedule: 1-3 rounds of a fault phase then a quiet phase, checking
        convergence and pruning at the end of each; return (violations, the longest
        convergence time after faults stopped)."""
        worst = 0
        start = 0
        for _ in range(self.rng.choice([1, 1, 2, 3])):
            took = self._round(start)
            if took is None:
                break
            worst = max(worst, took)
            start = self.sim.now_us + self.rng.randint(0, 100_000)
        self.check_one_primary_per_history()
        return self.rec.violations, (worst if took is not None else None)

    def _round(self, start_us: int) -> int | None:
        sim = self.sim
        fault_end = self.build(start_us)

        def quiet(s):
            s.heal()
            s.set_faults(NetConfig(delay_us_min=self.faults.delay_us_min,
                                   delay_us_max=self.faults.delay_us_max))
            for node in self.nodes:
                if node not in self.started:
                    self._start(node, restart=False)
            if not self._live():
                self._restart_one(s)
        sim.at(fault_end, quiet)
        sim.run_until(fault_end)
        bound = bound_us(self.cfg, self.n)
        t = fault_end
        took = None
        while t <= fault_end + bound:
            t += self.quiet_check_us
            sim.run_until(t)
            if self.converged() is None:
                took = t - fault_end
                break
        if took is None:
            self.rec.violations.append(
                f"convergence: no full primary view {bound} us after faults stopped "
                f"at {fault_end} us ({self.converged()})")
        else:
            self.check_pruning()
        return took


def run_schedule(seed: int, stats: Counter | None = None) -> tuple[list[str], int | None]:
    h = _Harness(seed)
    result = h.run()
    if stats is not None:
        stats.update(h.rec.stats)
        if not h.sim.stats["partitions"] and not h.wiped_out:
            stats["schedules without partitions or total crashes"] += 1
            stats["  ... with 2+ primaries for one view number"] += any(
                len(p) > 1 for p in h.rec.primaries.values())
        stats.update({k: v for k, v in h.sim.stats.items()
                      if k in ("crashes", "restarts", "partitions", "lost", "corrupted")})
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1,
                        help="first seed; schedule i runs seed S*1_000_003 + i")
    parser.add_argument("--verbose", action="store_true",
                        help="one line per schedule, and coverage counters")
    parser.add_argument("--replay", type=int, metavar="SEED",
                        help="run one schedule seed (as printed) with a trace of its events")


def schedule_seed(seed: int, i: int) -> int:
    return seed * 1_000_003 + i


def run(args: argparse.Namespace) -> int:
    if args.replay is not None:
        h = _Harness(args.replay, trace=print)
        print(f"{h.n} replicas, {h.faults}")
        violations, took = h.run()
        for v in violations:
            print(f"VIOLATION {v}")
        print(f"1 schedules, {1 if violations else 0} violations")
        return 1 if violations else 0
    print(f"convergence bound after faults stop: {bound_us(SIM_CONFIG, 2) / 1000:.0f} ms "
          f"(2 replicas) .. {bound_us(SIM_CONFIG, 5) / 1000:.0f} ms (5 replicas)")
    bad = 0
    worst = 0
    stats: Counter = Counter()
    t0 = time.monotonic()
    for i in range(args.schedules):
        s = schedule_seed(args.seed, i)
        try:
            violations, took = run_schedule(s, stats)
        except Exception as e:                          # a crash is a violation too
            violations, took = [f"exception: {type(e).__name__}: {e}"], None
        if took is not None:
            worst = max(worst, took)
        if violations:
            bad += 1
            print(f"seed {s}: {violations[0]}" + (f" (+{len(violations) - 1} more)"
                                                    if len(violations) > 1 else ""))
            sys.stdout.flush()
        elif args.verbose:
            print(f"seed {s}: ok, converged in {took / 1000:.1f} ms")
    if args.verbose:
        for k, v in sorted(stats.items()):
            print(f"  {k}: {v}")
        print(f"worst convergence {worst / 1000:.1f} ms, {time.monotonic() - t0:.1f} s wall")
    print(f"{args.schedules} schedules, {bad} violations")
    return 1 if bad else 0
