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

Scenario lines (llft/sim/campaign.py has the format): `set replicas N`, `set faults loss P
dup P reorder P corrupt P` (during fault phases), `seed sim N` (the kernel: datagram fates,
birth ids, checkpoints, phase-2 delays); then per round `round K [after GAPus]` (a later
round starts GAP after the last converged) and its events, times relative to the round:
`start nK`, `crash nK`, `restart nK` (a new incarnation, new birth id), `partition nA nB |
nC`, `heal`, `faults on` (a later round's faults begin), `quiet [restart nK]` (faults
stop, the network heals, unstarted replicas start; the end of the fault phase).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from llft.protocol.messages import MsgType
from llft.sim.campaign import (Campaign, Outcome, Script, ScenarioError, run_until_done,
                               sides, us)
from llft.sim.kernel import NetConfig, Sim
from membership.core import (BeginPhase2, Config, Membership, MembershipChanged, Reset,
                             Send, StateRestored, Status, ViewEntered)
from membership.rules import Key

KIND = "membership"
GROUP = "g"
STATE_BYTES_MAX = 40_000           # random checkpoint sizes exercise State chunking
SIM_CONFIG = Config(group=GROUP, state_chunk_bytes=4_096, state_window_chunks=4)


def bound_us(cfg: Config, n: int) -> int:
    """Time from "faults stop" to a full primary view, worst case, no faults:
    a primary view change whose proposals lose every dead member (the last rank's
    detector, then two proposal ack timeouts), phase 2, the pruning of a side branch
    (one heartbeat interval), a joiner that may have to found the group (the
    refound timeout: every member may have been reset, say the primary crashed before
    its backups had their state) and n admissions, each at most a ProposeBackup retry
    period, a backup-removal round and a state transfer (a few retransmit periods)."""
    detect = cfg.fault_timeout_us(n) + 2 * cfg.ack_timeout_us
    admit = cfg.join_retry_us + cfg.ack_timeout_us + cfg.backup_timeout_us + 4 * cfg.retransmit_us
    return detect + cfg.refound_us + cfg.heartbeat_interval_us + n * admit + PHASE2_MAX_US


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
    """Runs one schedule: drawn from a seed (`generate`), or read from a script. Either way
    every fault takes effect through `_do`, which records it in `self.script`."""

    def __init__(self, source: Script, *, quiet_check_us: int = 1_000, trace=None):
        self.source = source               # the script read (a seed's: events come later)
        self.trace = trace                 # print-like callable: a readable event log
        self.n = int(source.get("set", "replicas")[0])
        f = source.pairs("set", "faults")
        self.faults = NetConfig(loss=float(f["loss"]), dup=float(f["dup"]),
                                reorder=float(f["reorder"]), corrupt=float(f["corrupt"]))
        self.sim = Sim(source.seed("sim"), self.faults)
        self.cfg = SIM_CONFIG
        self.rec = _Record()
        self.quiet_check_us = quiet_check_us
        self.nodes = list(range(self.n))
        self.started: set[int] = set()
        self.wiped_out = False
        self.rng: random.Random | None = None     # the generator's, when drawn from a seed
        self.round_start_us = 0
        # what ran: the parameters, then every round and event as it took effect
        self.script = Script(KIND, [line for line in source.lines
                                    if line[0] in ("set", "seed")])

    @classmethod
    def generate(cls, seed: int, **kw) -> "_Harness":
        """The schedule of `seed`: its parameters now, its faults as it runs."""
        r = random.Random(seed)
        script = Script(KIND)
        script.add("set", "replicas", r.choice([2, 3, 3, 4, 4, 5]))
        script.add("set", "faults", "loss", r.choice([0, 0.01, 0.05, 0.15]),
                   "dup", r.choice([0, 0.02, 0.1]), "reorder", r.choice([0, 0.05, 0.2]),
                   "corrupt", r.choice([0, 0, 0.01]))
        script.add("seed", "sim", r.getrandbits(64))
        h = cls(script, **kw)
        h.rng = r
        return h

    # -- events: the one way a fault takes effect ----------------------------------------
    def _do(self, *words) -> None:
        """Apply one event of the schedule now and record it (time relative to the round)."""
        words = tuple(str(w) for w in words)
        self.script.at(self.sim.now_us - self.round_start_us, *words)
        sim, verb, args = self.sim, words[0], words[1:]
        if verb == "start":
            self._start(_node(args[0]), restart=False)
        elif verb == "restart":
            node = _node(args[0])
            if node in self.started and not sim.alive(node):
                self._log(f"restart n{node}")
                self._start(node, restart=True)
        elif verb == "crash":
            victim = _node(args[0])
            if victim in self.started and sim.alive(victim):
                status = sim.core(victim).status
                if status in (Status.PROPOSING, Status.PRIMARY_PHASE2):
                    self.rec.stats[f"crashes while {status.value}"] += 1
                sim.crash(victim)
                self._log(f"crash n{victim}")
                if not self._live():
                    self.wiped_out = True       # the group's history starts over
        elif verb == "partition":
            comps = [[_node(w) for w in side] for side in sides(args)]
            sim.partition(*comps)
            self._log("partition " + " | ".join(str(c) for c in comps))
        elif verb == "heal":
            sim.heal()
            self._log("heal")
        elif verb == "faults":              # faults on: a later round's fault phase begins
            sim.set_faults(self.faults)
        elif verb == "quiet":               # [restart nK]: faults stop, everyone starts
            sim.heal()
            sim.set_faults(NetConfig(delay_us_min=self.faults.delay_us_min,
                                     delay_us_max=self.faults.delay_us_max))
            for node in self.nodes:
                if node not in self.started:
                    self._start(node, restart=False)
            if args[:1] == ("restart",):
                self._log(f"restart n{_node(args[1])}")
                self._start(_node(args[1]), restart=True)
        else:
            raise ScenarioError(f"membership: unknown event {' '.join(words)!r}")

    # -- the adapter: cores on the kernel ---------------------------------------------
    def _new_core(self, node: int) -> Membership:
        cfg = self.cfg
        core = Membership(Config(**{**cfg.__dict__, "host": "sim", "pid": node}),
                          random.Random(self.sim.rng.getrandbits(64)),
                          StateBlob(random.Random(self.sim.rng.getrandbits(64))))
        core.wall_ms_of = lambda: self.sim.now_us // 1000      # (names lineages)
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

    # -- the generator: decisions drawn from the seed, taken as the schedule runs --------
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
            else:
                victim = None
            if victim is None:
                victim = self.rng.choice(sorted(live))
            self._do("crash", f"n{victim}")
        return act

    def _dead(self) -> list[int]:
        return sorted(n for n in self.nodes if n in self.started and not self.sim.alive(n))

    def _restart_one(self, sim) -> None:
        dead = self._dead()
        if dead:
            self._do("restart", f"n{self.rng.choice(dead)}")

    def _partition(self, sim) -> None:
        nodes = sorted(self.started)
        if len(nodes) < 2:
            return
        self.rng.shuffle(nodes)
        if len(nodes) >= 3 and self.rng.random() < 0.3:
            a, b = sorted(self.rng.sample(range(1, len(nodes)), 2))
            comps = [nodes[:a], nodes[a:b], nodes[b:]]
        else:
            cut = self.rng.randrange(1, len(nodes))
            comps = [nodes[:cut], nodes[cut:]]
        self._do("partition", *" | ".join(" ".join(f"n{x}" for x in c) for c in comps).split())

    def _quiet(self, sim) -> None:
        # the generator restarts a replica when all are dead (after the unstarted start)
        if any(n not in self.started for n in self.nodes) or self._live() or not self._dead():
            self._do("quiet")
        else:
            self._do("quiet", "restart", f"n{self.rng.choice(self._dead())}")

    def build(self, start_us: int) -> int:
        """Schedule one fault phase from `start_us`; return when it ends (us)."""
        r, sim = self.rng, self.sim
        if start_us == 0:
            fault_us = r.randint(300_000, 900_000)
            for node in self.nodes:
                t = 0 if node == 0 else r.randint(0, 150_000)
                sim.at(t, lambda s, node=node: self._do("start", f"n{node}"))
            t = r.randint(100_000, 250_000)
        else:
            fault_us = start_us + r.randint(100_000, 500_000)
            sim.at(start_us, lambda s: self._do("faults", "on"))
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
                sim.at(min(fault_us, t + r.randint(20_000, 200_000)), lambda s: self._do("heal"))
            else:
                sim.at(t, self._crash("primary"))
                # the successor detects the crash one base timeout after the last
                # heartbeat, then runs phase 1 (longer under loss) and phase 2
                base = self.cfg.timeout_base_us
                sim.at(min(fault_us, t + r.randint(base - 3_000, base + 12_000)),
                       self._crash("successor"))
            t += r.randint(30_000, 200_000)
        sim.at(fault_us, self._quiet)
        return fault_us

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

    def run(self) -> Outcome:
        """Run the schedule: 1-3 rounds of a fault phase then a quiet phase, checking
        convergence and pruning at the end of each. Drawn from a seed, each round is
        generated when it starts; read from a script, its events come from there."""
        worst = 0
        took: int | None = 0
        if self.rng is not None:
            start = 0
            for k in range(1, self.rng.choice([1, 1, 2, 3]) + 1):
                self._begin_round(k, start)
                took = self._quiet_phase(self.build(start))
                if took is None:
                    break
                worst = max(worst, took)
                start = self.sim.now_us + self.rng.randint(0, 100_000)
        else:
            for k, gap_us, events in self._rounds():
                start = self.sim.now_us + gap_us
                self._begin_round(k, start)
                for t_us, words in events:
                    self.sim.at(start + t_us, lambda s, w=words: self._do(*w))
                ends = [start + t for t, w in events if w[0] == "quiet"]
                if len(ends) != 1:
                    raise ScenarioError(f"membership: round {k} needs one `quiet` event")
                took = self._quiet_phase(ends[0])
                if took is None:
                    break
                worst = max(worst, took)
        self.check_one_primary_per_history()
        return Outcome(self.rec.violations, self.script, self.rec.stats,
                       worst if took is not None else None)

    def _begin_round(self, k: int, start_us: int) -> None:
        self.round_start_us = start_us
        self.script.add("round", k, *(("after", f"{start_us - self.sim.now_us}us")
                                      if k > 1 else ()))

    def _rounds(self) -> list[tuple[int, int, list[tuple[int, tuple[str, ...]]]]]:
        """The source's rounds: (number, gap after the last one converged, its events)."""
        rounds: list = []
        for line in self.source.lines:
            if line[0] == "round":
                rounds.append((int(line[1]), us(line[3]) if len(line) > 3 else 0, []))
            elif line[0] == "at":
                if not rounds:
                    raise ScenarioError("membership: `at` before the first `round`")
                rounds[-1][2].append((us(line[1]), line[2:]))
        return rounds

    def _quiet_phase(self, fault_end: int) -> int | None:
        """Run to the end of the fault phase, then until converged (or the bound passes);
        return how long convergence took."""
        sim = self.sim
        sim.run_until(fault_end)
        bound = bound_us(self.cfg, self.n)
        # checked every quiet_check_us; the check one step past the bound still counts
        took = run_until_done(sim, lambda: self.converged() is None,
                              bound + self.quiet_check_us, self.quiet_check_us)
        if took is None:
            self.rec.violations.append(
                f"convergence: no full primary view {bound} us after faults stopped "
                f"at {fault_end} us ({self.converged()})")
        else:
            self.check_pruning()
        return took


def _node(word: str) -> int:
    """'n2' -> 2."""
    if not word.startswith("n"):
        raise ScenarioError(f"membership: a replica is written n0, n1, ..., not {word!r}")
    return int(word[1:])


def run_seed(seed: int, trace=None) -> Outcome:
    h = _Harness.generate(seed, trace=trace)
    if trace is not None:
        trace(f"{h.n} replicas, {h.faults}")
    o = h.run()
    _coverage(h, o.stats)
    return o


def run_script(script: Script, trace=None) -> Outcome:
    h = _Harness(script, trace=trace)
    o = h.run()
    _coverage(h, o.stats)
    return o


def _coverage(h: _Harness, stats: Counter) -> None:
    if not h.sim.stats["partitions"] and not h.wiped_out:
        stats["schedules without partitions or total crashes"] += 1
        stats["  ... with 2+ primaries for one view number"] += any(
            len(p) > 1 for p in h.rec.primaries.values())
    stats.update({k: v for k, v in h.sim.stats.items()
                  if k in ("crashes", "restarts", "partitions", "lost", "corrupted")})


def _header(params: dict) -> list[str]:
    return [f"convergence bound after faults stop: {bound_us(SIM_CONFIG, 2) / 1000:.0f} ms "
            f"(2 replicas) .. {bound_us(SIM_CONFIG, 5) / 1000:.0f} ms (5 replicas)"]


def _worst(outcomes: list[Outcome]) -> list[str]:
    worst = max((o.took_us or 0 for o in outcomes), default=0)
    return [f"worst convergence {worst / 1000:.1f} ms"]


CAMPAIGN = Campaign(
    KIND, run_seed, run_script, schedules=1000, header=_header, summary=_worst,
    verbose_line=lambda o: f"ok, converged in {(o.took_us or 0) / 1000:.1f} ms",
    about=__doc__.split("\n\n")[0])
add_arguments, run = CAMPAIGN.add_arguments, CAMPAIGN.run
