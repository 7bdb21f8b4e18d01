"""`llft simulate replica`: whole replicas (membership + messaging, llft/replica/node.py) of a
client group and a server group, with deterministic applications, under faults.

Theory of operation
-------------------
Each schedule (one seed) runs a client group "c" and a server group "s" of 2-3
`ReplicaNode`s each on the simulator kernel. Every replica runs the same deterministic
application as the rest of its group (semi-active replication):

  server  for every byte delivered on a connection, writes XFORM(byte) back;
          its primary adds an order-info chunk per delivery.
  client  opens 1-2 connections to "s" and writes a fixed request stream on each,
          at most PIPELINE_BYTES ahead of the replies it has read (so its output is a
          function of its input); its primary adds an order-info chunk per write.

Replicas start at random times (the first founds each group, the others join with a
state transfer). During the fault phase the network loses, duplicates and reorders
datagrams, primaries and backups crash (also a successor during phase 1/2), and dead
replicas restart as new members (new birth id, state transfer, replay). A crash never
leaves a group without a live replica holding its state. Then faults stop.

Checks on every schedule:
  streams      every Deliver a replica's application sees continues its connection's
               stream exactly where the last ended, with the bytes the remote group's
               application wrote (so live members of a group are prefix-consistent, the
               client sees each reply byte exactly once and in order across server
               failovers); after faults stop, every live member has the whole stream;
  one primary  per group, one primary per primary view number (no partitions here);
  order info   every backup delivers order info of each view exactly once, in position
               order, with the bytes its primary added (the view marker first); after
               faults stop every live backup has all of its current view;
  liveness     all of the above within LIVENESS_BOUND_US after the faults stop.

A failing schedule prints one line with its seed; the last line is
`N schedules, K violations`; the exit status is non-zero when K > 0.
"""
from __future__ import annotations

import hashlib
import random
import sys
import time
from collections import Counter

from llft.protocol import messaging as mg
from llft.protocol.messages import Role
from llft.replica.node import (Deliver, NotReady, OrderInfo, ReplicaNode, Restored, RestartApp,
                          ViewSwitch)
from llft.sim.kernel import NetConfig, Sim
from membership import core as mb

GROUPS = ("c", "s")
STARTUP_US = 250_000                # founding (found_timeout 100 ms) and first joins
FAULT_PHASE_US = 500_000            # after start-up
LIVENESS_BOUND_US = 1_500_000       # after faults stop
CHECK_EVERY_US = 20_000
APP_TICK_US = 3_000
PIPELINE_BYTES = 4_000
MAX_REQUEST_BYTES = 20_000
MAX_WRITE_BYTES = 1_500
MCFG = dict(found_timeout_us=100_000)

XFORM = bytes((b ^ 0xA5) for b in range(256))


def schedule_seed(seed: int, index: int) -> int:
    h = hashlib.sha256(f"llft-replica/{seed}/{index}".encode()).digest()
    return int.from_bytes(h[:8], "big")


class App:
    """One incarnation of a replica's application (sim side)."""

    def __init__(self, sched: "Schedule", node_id: str, node: ReplicaNode):
        self.s = sched
        self.node_id = node_id
        self.node = node
        self.group = node.group
        self.birth = node.birth
        self.started = False
        self.seen: dict = {}                  # conn -> bytearray the app read
        self.written: dict = {}               # client: conn -> request bytes written
        self.out_done: dict = {}              # server: conn -> output bytes written
        self.tick_armed = False
        self.oi_next: dict[int, int] = {}     # pvn -> next order-info position expected

    def start(self, restored: Restored | None) -> None:
        self.started = True
        node = self.node
        if restored is not None:
            for cid, data in restored.streams:
                self.seen[cid] = bytearray()
                self._input(cid, 0, data)
        for p, q, _ in node.order_info_log:
            self.oi_next[p] = max(self.oi_next.get(p, 1), q + 1)
        if self.group == "c":
            for seq in range(1, self.s.n_conns + 1):
                cid = node.open("s", seq, Role.CLIENT)
                self.written.setdefault(cid, 0)
                self.seen.setdefault(cid, bytearray())
        self.work()

    # -- inputs ---------------------------------------------------------------------------
    def _input(self, cid, offset: int, data: bytes) -> None:
        buf = self.seen.setdefault(cid, bytearray())
        if offset != len(buf):
            self.s.violation(f"{self.node_id}/{self.birth} {cid}: delivery at {offset}, "
                             f"expected {len(buf)} (not exactly once / in order)")
            return
        exp = self.s.expected_input(self.group, cid)
        if exp[offset:offset + len(data)] != data:
            self.s.violation(f"{self.node_id}/{self.birth} {cid}: wrong bytes at {offset}")
            return
        buf += data
        if self.group == "s":
            self.out_done.setdefault(cid, 0)
            self._order_info(b"s%d:%d" % (cid[1], offset + len(data)))

    def deliver(self, a: Deliver) -> None:
        if self.started:
            self._input(a.conn, a.offset, a.data)
            self.work()

    def _order_info(self, chunk: bytes) -> None:
        node = self.node
        if node.status is mb.Status.PRIMARY and node.live:
            try:
                pos = node.add_order_info(chunk, self.s.sim.now_us)
            except (NotReady, mg.BufferFull):
                return
            self.s.record_order_info(self.group, node.messaging.pvn, pos, chunk)

    # -- outputs --------------------------------------------------------------------------
    def work(self) -> None:
        if not self.started or not self.s.sim.alive(self.node_id) \
                or self.s.sim.core(self.node_id) is not self.node:
            return
        now = self.s.sim.now_us
        blocked = False
        if self.group == "s":
            # transforms its input in blocks, the same cuts at every replica (unless
            # random_cuts), each written whole
            block = self.s.server_block
            for cid, done in list(self.out_done.items()):
                seen = self.seen[cid]
                total = len(self.s.requests.get(cid[1], b""))
                while done < len(seen):
                    end = len(seen) if self.s.random_cuts else done + block
                    if end > len(seen) and len(seen) < total:
                        break               # a partial block waits for its input
                    out = bytes(seen[done:end]).translate(XFORM)
                    if self.node.send_space(cid) < len(out):
                        blocked = True
                        break
                    n = self.node.send(cid, out, now)
                    assert n == len(out)
                    done += n
                self.out_done[cid] = done
        else:
            rng = self.s.app_rng
            for cid in list(self.written):
                req = self.s.requests[cid[1]]
                cuts = self.s.request_cuts[cid[1]]
                w = self.written[cid]
                # paced over the fault phase (timing only: the content is the request)
                paced = len(req) * max(0, now - STARTUP_US // 2) // FAULT_PHASE_US
                limit = min(len(req), len(self.seen.get(cid, b"")) + PIPELINE_BYTES, paced)
                if w < limit:
                    if self.s.random_cuts:
                        k = min(limit - w, rng.randint(1, MAX_WRITE_BYTES))
                        n = self.node.send(cid, req[w:w + k], now)
                    else:       # the next fixed chunk, whole
                        k = cuts.get(w, len(req) - w)
                        n = 0
                        if w + k <= limit and self.node.send_space(cid) >= k:
                            n = self.node.send(cid, req[w:w + k], now)
                            assert n == k
                    self.written[cid] = w + n
                    if n:
                        self._order_info(b"c%d:%d" % (cid[1], w + n))
                blocked |= self.written[cid] < len(req)
        if blocked and not self.tick_armed:
            self.tick_armed = True

            def tick(sim, app=self):
                app.tick_armed = False
                app.work()
            self.s.sim.at(now + self.s.app_rng.randint(APP_TICK_US // 2, APP_TICK_US * 2),
                          tick, self.node_id)

    def done(self) -> str | None:
        for cid, exp in self.s.all_expected(self.group).items():
            if len(self.seen.get(cid, b"")) != len(exp):
                return f"{self.node_id} {cid}: read {len(self.seen.get(cid, b''))}/{len(exp)}"
        return None


class Schedule:
    def __init__(self, seed: int, *, loss: float | None = None, trace=None,
                 random_cuts: bool = False):
        self.seed = seed
        self.random_cuts = random_cuts
        self.trace = trace
        self.rng = rng = random.Random(seed)
        self.faults = NetConfig(loss=rng.choice([0, 0.01, 0.05]) if loss is None else loss,
                                dup=rng.choice([0, 0.02, 0.05]),
                                reorder=rng.choice([0, 0.05, 0.1]))
        self.sim = Sim(random.Random(rng.getrandbits(64)), self.faults)
        self.app_rng = random.Random(rng.getrandbits(64))
        self.mcfg = mg.MessagingConfig(max_payload_bytes=rng.choice([256, 1024]),
                                       window_msgs=rng.choice([8, 32]))
        self.sizes = {g: rng.choice([2, 3]) for g in GROUPS}
        self.n_conns = rng.choice([1, 2])
        self.requests = {seq: rng.randbytes(rng.randint(2_000, MAX_REQUEST_BYTES))
                         for seq in range(1, self.n_conns + 1)}
        # offset -> length of the client's write there (the same cuts at every replica)
        self.request_cuts: dict[int, dict[int, int]] = {}
        for seq, req in self.requests.items():
            cuts, i = {}, 0
            while i < len(req):
                cuts[i] = min(len(req) - i, rng.randint(1, MAX_WRITE_BYTES))
                i += cuts[i]
            self.request_cuts[seq] = cuts
        self.server_block = rng.choice([100, 512, 1024, 1500])
        self.violations: list[str] = []
        self.apps: dict[str, App] = {}
        self.primaries: dict[tuple[str, int], int] = {}      # (group, pvn) -> birth
        self.oi_added: dict[tuple[str, int], dict[int, bytes | None]] = {}
        self.stats: Counter = Counter()
        self.started: set[str] = set()

    # -- expectations -----------------------------------------------------------------------
    def expected_input(self, group: str, cid) -> bytes:
        req = self.requests.get(cid[1], b"")
        return req if group == "s" else req.translate(XFORM)

    def all_expected(self, group: str) -> dict:
        role = Role.SERVER if group == "s" else Role.CLIENT
        other = "c" if group == "s" else "s"
        return {(other, seq, role): self.expected_input(group, (other, seq, role))
                for seq in self.requests}

    def violation(self, what: str) -> None:
        if self.trace is not None:
            self._log(f"VIOLATION {what}")
        if len(self.violations) < 5:
            self.violations.append(f"{self.sim.now_us / 1000:.1f} ms: {what}")

    def record_order_info(self, group: str, pvn: int, pos: int, chunk: bytes | None) -> None:
        d = self.oi_added.setdefault((group, pvn), {})
        if pos in d:
            self.violation(f"{group}: order-info position {pos} of view {pvn} added twice")
        d[pos] = chunk

    def _log(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"{self.sim.now_us / 1000:10.3f} ms  {text}")

    # -- nodes ------------------------------------------------------------------------------
    def _start(self, node_id: str, restart: bool) -> None:
        g = node_id[0]
        node = ReplicaNode(g, random.Random(self.sim.rng.getrandbits(64)),
                           membership_config=mb.Config(group=g, **MCFG),
                           messaging_config=self.mcfg)
        node.start(self.sim.now_us)
        self.apps[node_id] = App(self, node_id, node)
        if restart:
            self.sim.restart(node_id, node)
            self.stats["restarts"] += 1
        else:
            self.sim.add_node(node_id, node, [g], on_action=self._on_action)
        self.started.add(node_id)
        self._log(f"start {node_id} birth {node.birth}")

    def _on_action(self, node_id: str, a, now_us: int) -> None:
        node = self.sim.core(node_id)
        app = self.apps[node_id]
        g = node.group
        if self.trace is not None and not isinstance(a, (Deliver, OrderInfo)):
            if isinstance(a, Restored):
                self._log(f"{node_id} Restored {[(c, len(b)) for c, b in a.streams]}, "
                          f"{len(a.order_info)} order-info entries")
            else:
                self._log(f"{node_id} {a}")
        if isinstance(a, Deliver):
            app.deliver(a)
        elif isinstance(a, mb.BeginPhase2):
            other = self.primaries.setdefault((g, a.pvn), a.members[0].birth)
            if other != a.members[0].birth:
                self.violation(f"{g}: two primaries of view {a.pvn}: {other} and "
                               f"{a.members[0].birth}")
            self.stats["views formed"] += 1
        elif isinstance(a, ViewSwitch):
            if a.primary:
                self.record_order_info(g, a.pvn, a.pos, None)
                if not app.started:
                    app.start(None)         # a founder
                else:
                    app.work()
            else:
                self._check_oi(node_id, app, a.pvn, a.pos, None)
        elif isinstance(a, OrderInfo):
            self._check_oi(node_id, app, a.pvn, a.pos, a.chunk)
        elif isinstance(a, Restored):
            self.stats["state transfers"] += 1
            app.start(a)
        elif isinstance(a, mg.Resynced):
            self.stats["connections resynced"] += 1
        elif isinstance(a, RestartApp):
            self.stats["resets"] += 1
            self.apps[node_id] = App(self, node_id, node)

    def _check_oi(self, node_id: str, app: App, pvn: int, pos: int, chunk) -> None:
        want = app.oi_next.get(pvn, 1)
        exp = self.oi_added.get((app.group, pvn), {})
        if pos != want:
            self.violation(f"{node_id}: order info {pos} of view {pvn}, expected {want}")
        elif pos not in exp or exp[pos] != chunk:
            self.violation(f"{node_id}: order info {pos} of view {pvn} is not the primary's")
        app.oi_next[pvn] = pos + 1

    # -- faults -----------------------------------------------------------------------------
    def _live(self, g: str) -> list[str]:
        return [n for n in sorted(self.started) if n[0] == g and self.sim.alive(n)]

    def _stateful(self, g: str) -> list[str]:
        return [n for n in self._live(g) if self.sim.core(n).live]

    def _crash(self, g: str, pick: str):
        def act(sim):
            live = self._live(g)
            if pick == "primary":
                cand = [n for n in live if sim.core(n).is_primary]
            elif pick == "successor":
                cand = [n for n in live if sim.core(n).status in
                        (mb.Status.PROPOSING, mb.Status.PRIMARY_PHASE2)]
                if cand:
                    self.stats[f"crash while {sim.core(cand[0]).status.value}"] += 1
            else:
                cand = [n for n in live if not sim.core(n).is_primary]
            if not cand:
                return
            victim = self.rng.choice(cand)
            if not [n for n in self._stateful(g) if n != victim]:
                return              # the group's state would be lost with it
            sim.crash(victim)
            self.stats["crashes"] += 1
            self._log(f"crash {victim} ({pick})")
        return act

    def _restart(self, g: str):
        def act(sim):
            dead = [n for n in sorted(self.started) if n[0] == g and not sim.alive(n)]
            if dead:
                self._start(self.rng.choice(dead), restart=True)
        return act

    def run(self) -> list[str]:
        sim, rng = self.sim, self.rng
        for g in GROUPS:
            for i in range(self.sizes[g]):
                t = 0 if i == 0 else rng.randint(0, STARTUP_US // 2)
                sim.at(t, lambda s, n=f"{g}{i}": self._start(n, restart=False))
        t = STARTUP_US
        end = STARTUP_US + FAULT_PHASE_US
        base = mb.Config(group="x").timeout_base_us
        while t < end:
            g = rng.choice(GROUPS)
            kind = rng.choices(["primary", "backup", "restart", "during_change"],
                               [3, 2, 3, 2])[0]
            if kind == "restart":
                sim.at(t, self._restart(g))
            elif kind == "during_change":
                sim.at(t, self._crash(g, "primary"))
                sim.at(min(end, t + rng.randint(base - 3_000, base + 12_000)),
                       self._crash(g, "successor"))
            else:
                sim.at(t, self._crash(g, kind))
            t += rng.randint(40_000, 200_000)

        def quiet(s):
            s.set_faults(NetConfig())
            for g in GROUPS:
                if rng.random() < 0.5:
                    self._restart(g)(s)
        sim.at(end, quiet)
        sim.run_until(end)
        problems: list[str] = []
        while sim.now_us < end + LIVENESS_BOUND_US:
            sim.run_for(CHECK_EVERY_US)
            problems = self._pending()
            if not problems or self.violations:
                break
        if problems and not self.violations:
            self.violation(f"not done {LIVENESS_BOUND_US} us after faults stopped: "
                           + "; ".join(problems[:3]))
        return self.violations

    def _pending(self) -> list[str]:
        out = []
        for g in GROUPS:
            live = self._live(g)
            nodes = {n: self.sim.core(n) for n in live}
            prim = [n for n, c in nodes.items() if c.status is mb.Status.PRIMARY]
            if len(prim) != 1:
                out.append(f"{g}: {len(prim)} primaries")
                continue
            p = nodes[prim[0]]
            for n, c in nodes.items():
                if c.status not in (mb.Status.PRIMARY, mb.Status.BACKUP) or not c.live:
                    out.append(f"{n}: {c.status.value}, live {c.live}")
                    continue
                if (c.pvn, c.membership.change) != (p.pvn, p.membership.change):
                    out.append(f"{n}: view {c.pvn} change {c.membership.change}")
                app = self.apps[n]
                why = app.done() if app.started else f"{n}: app not started"
                if why:
                    out.append(why)
                if c is not p:
                    want = len(self.oi_added.get((g, c.pvn), {}))
                    got = app.oi_next.get(c.pvn, 1) - 1
                    if got != want:
                        out.append(f"{n}: order info {got}/{want} of view {c.pvn}")
        return out


def run_schedule(seed: int, stats: Counter | None = None, trace=None,
                 random_cuts: bool = False) -> list[str]:
    s = Schedule(seed, trace=trace, random_cuts=random_cuts)
    try:
        v = s.run()
    except Exception as e:                      # a crash of a core is a violation too
        if trace is not None:
            raise
        v = [f"exception: {type(e).__name__}: {e}"]
    if stats is not None:
        stats.update(s.stats)
    return v


def add_arguments(parser) -> None:
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--random-cuts", action="store_true",
                        help="applications write in sizes that differ between replicas "
                             "(messaging's msn <-> bytes map then differs: see the report)")
    parser.add_argument("--verbose", action="store_true", help="coverage counters")
    parser.add_argument("--replay", type=int, metavar="SEED",
                        help="run one schedule seed (as printed) with a trace of its events")


def run(args) -> int:
    if args.replay is not None:
        v = run_schedule(args.replay, trace=print, random_cuts=args.random_cuts)
        for line in v:
            print(f"VIOLATION {line}")
        print(f"1 schedules, {1 if v else 0} violations")
        return 1 if v else 0
    bad = 0
    stats: Counter = Counter()
    t0 = time.monotonic()
    for i in range(args.schedules):
        s = schedule_seed(args.seed, i)
        v = run_schedule(s, stats, random_cuts=args.random_cuts)
        if v:
            bad += 1
            print(f"schedule {i} seed {s}: {v[0]}" + (f" (+{len(v) - 1} more)"
                                                      if len(v) > 1 else ""), flush=True)
    if args.verbose:
        for k, n in sorted(stats.items()):
            print(f"  {k}: {n}")
    print(f"({time.monotonic() - t0:.1f} s)", file=sys.stderr)
    print(f"{args.schedules} schedules, {bad} violations")
    return 1 if bad else 0
