"""`llft simulate messaging`: the messaging protocol's safety and liveness, checked on
seeded random schedules run by the deterministic simulator kernel.

Each schedule (seed = hash of the campaign seed and the schedule index) builds two or
three groups of 1-3 replicas, a few virtual connections between them, and applications
on every replica that write the same byte streams (semi-active: backups produce what
their primary produces, at their own pace and often in differently sized writes) and, on primaries, order-info chunks. During
the fault phase the network loses, duplicates, reorders and corrupts datagrams, forged
and garbage datagrams are injected, a replica is cut off by a transient partition, and backups crash (this check plays membership for
backup removal; primaries stay alive: changes of primary are membership's simulation).
Then faults stop, and the checks are:

  * exactly once, in order: every Deliver continues its stream exactly where the last
    one ended, with the bytes the primary's application wrote; at the end every live
    member of the destination group has the whole stream of every connection;
  * order info: every live backup receives positions 1..n, exactly once, in order, with
    the primary's bytes;
  * authentication: nothing forged or corrupted is delivered (the byte comparison), and
    the decoders rejected the injected datagrams;
  * buffers: at quiescence sent lists, queues, received lists, placeholders and
    order-info logs are empty and backup logs hold at most a window per connection
    (garbage collection by watermarks worked);
  * liveness: all of the above hold within LIVENESS_BOUND_US of simulated time after the
    faults stop.

A failing schedule prints one line with its seed; the last line is
`N schedules, K violations`; the exit status is non-zero when K > 0.
"""
from __future__ import annotations

import hashlib
import random
import sys
import time
from dataclasses import dataclass, field

from llft.protocol.messages import Message, MsgType, Role
from llft.protocol.messaging import (BufferFull, Deliver, DeliverOrderInfo, MessagingConfig,
                            MessagingEndpoint)
from llft.sim.kernel import NetConfig, Sim

FAULT_PHASE_US = 150_000            # app traffic and faults
LIVENESS_BOUND_US = 400_000         # after faults stop, everything done within this
CHECK_EVERY_US = 10_000
APP_TICK_US = 2_000                 # an app retries a blocked write this often
DETECT_CRASH_US = 20_000            # "membership" removes a crashed backup after this
MAX_STREAM_BYTES = 24_000           # per direction per connection
MAX_WRITE_BYTES = 3_000
MAX_ORDER_INFO_CHUNKS = 40
CORRUPT_P = 0.01
PARTITION_P = 0.3                   # chance of one transient partition per schedule
PARTITION_US_MAX = 30_000
FORGED_PER_SCHEDULE = 6


def schedule_seed(seed: int, index: int) -> int:
    h = hashlib.sha256(f"llft-messaging/{seed}/{index}".encode()).digest()
    return int.from_bytes(h[:8], "big")


@dataclass
class _Replica:
    node: str
    group: str
    bid: int
    core: MessagingEndpoint
    primary: bool
    # per (conn id, direction) write progress: index into the writes list, bytes done
    progress: dict = field(default_factory=dict)
    oi_done: int = 0
    got: dict = field(default_factory=dict)          # conn id -> bytearray delivered
    oi_got: dict = field(default_factory=dict)      # pvn -> chunks delivered


class Schedule:
    def __init__(self, seed: int, loss: float, dup: float, reorder: float,
                 failover: float = 0.0):
        self.seed = seed
        self.failover = failover
        self.pvn: dict[str, int] = {}
        self.failed_over: set[str] = set()      # groups whose primary changed
        self.oi_added: dict[tuple[str, int], list[bytes]] = {}   # (group, pvn) -> chunks
        self.rng = rng = random.Random(seed)
        self.violations: list[str] = []
        net = NetConfig(loss=loss, dup=dup, reorder=reorder, corrupt=CORRUPT_P)
        self.sim = Sim(random.Random(rng.getrandbits(64)), net)
        self.cfg = MessagingConfig(max_payload_bytes=rng.choice([256, 700, 1024, 2000]),
                                   window_msgs=rng.choice([4, 8, 32]))
        self.groups: dict[str, list[_Replica]] = {}
        n_groups = rng.choice([2, 3])
        for gi in range(n_groups):
            g = f"g{gi}"
            size = rng.randint(1, 3)
            bids = [rng.getrandbits(62) + 1 for _ in range(size)]
            members = [(b, i + 1) for i, b in enumerate(bids)]
            reps = []
            for i, b in enumerate(bids):
                core = MessagingEndpoint(g, b, self.cfg)
                core.set_view(1, bids[0], members, b, now_us=0)
                rep = _Replica(f"{g}.{i}", g, b, core, i == 0)
                reps.append(rep)
            self.groups[g] = reps
            self.pvn[g] = 1
        # connections: (client group, server group, conn_seq) + the two streams
        self.conns = []
        seqs: dict[str, int] = {}
        for _ in range(rng.randint(1, 4)):
            a, b = rng.sample(sorted(self.groups), 2)
            seqs[a] = seqs.get(a, 0) + 1
            streams = {}
            for direction in ("c2s", "s2c"):
                total = rng.randint(0, MAX_STREAM_BYTES) if rng.random() < 0.9 else 0
                data = rng.randbytes(total)
                cuts, i = [], 0
                while i < total:
                    n = rng.randint(1, MAX_WRITE_BYTES)
                    cuts.append(data[i:i + n])
                    i += n
                streams[direction] = (data, cuts)
            self.conns.append((a, b, seqs[a], streams))
        self.order_info = {g: [rng.randbytes(rng.randint(1, 200))
                               for _ in range(rng.randint(0, MAX_ORDER_INFO_CHUNKS))]
                           for g in self.groups}
        self.crashed: set[str] = set()
        for g, reps in self.groups.items():
            for rep in reps:
                self.sim.add_node(rep.node, rep.core, [g], on_action=self._on_action)
                for a, b, seq, _ in self.conns:
                    if g == a:
                        rep.core.open(b, seq, Role.CLIENT)
                    elif g == b:
                        rep.core.open(a, seq, Role.SERVER)
        self.by_node = {r.node: r for reps in self.groups.values() for r in reps}
        # The agent reads an application's bytes in whatever chunks its socket yields:
        # a replica writes the same stream as its primary, often cut differently.
        self.cuts: dict[tuple[str, tuple], list[bytes]] = {}
        for rep in self.by_node.values():
            for cid, data, cuts in self._streams(rep):
                if rng.random() < 0.5:
                    cuts = self._recut(data)
                self.cuts[(rep.node, cid)] = cuts

    # -- expectations ------------------------------------------------------------------
    def _streams(self, rep: _Replica):
        """(conn id, stream, the primary's cuts) for what this replica's app writes."""
        for a, b, seq, streams in self.conns:
            if rep.group == a:
                yield (b, seq, Role.CLIENT), *streams["c2s"]
            elif rep.group == b:
                yield (a, seq, Role.SERVER), *streams["s2c"]

    def _recut(self, data: bytes) -> list[bytes]:
        cuts, i = [], 0
        while i < len(data):
            n = self.rng.randint(1, MAX_WRITE_BYTES)
            cuts.append(data[i:i + n])
            i += n
        return cuts

    def _writes(self, rep: _Replica):
        """(conn id, cuts) this replica's application writes."""
        for cid, _, _ in self._streams(rep):
            yield cid, self.cuts[(rep.node, cid)]

    def _expected(self, rep: _Replica):
        """conn id -> the stream this replica must receive."""
        out = {}
        for a, b, seq, streams in self.conns:
            if rep.group == a:
                out[(b, seq, Role.CLIENT)] = streams["s2c"][0]
            elif rep.group == b:
                out[(a, seq, Role.SERVER)] = streams["c2s"][0]
        return out

    def _violation(self, what: str) -> None:
        if len(self.violations) < 5:
            self.violations.append(what)

    # -- actions -----------------------------------------------------------------------
    def _on_action(self, node: str, action, now_us: int) -> None:
        rep = self.by_node[node]
        if isinstance(action, Deliver):
            buf = rep.got.setdefault(action.conn, bytearray())
            exp = self._expected(rep).get(action.conn)
            if action.offset != len(buf):
                self._violation(f"{node} {action.conn}: delivery at offset {action.offset}, "
                                f"expected {len(buf)} (not exactly once / in order)")
                return
            if exp is None or exp[action.offset:action.offset + len(action.data)] != action.data:
                self._violation(f"{node} {action.conn}: wrong bytes at {action.offset}")
                return
            buf += action.data
        elif isinstance(action, DeliverOrderInfo):
            # positions restart in each primary view: compare with what the primary
            # of that view added
            exp = self.oi_added.get((rep.group, action.pvn), [])
            got = rep.oi_got.setdefault(action.pvn, [])
            pos = len(got) + 1
            if action.pos != pos or pos > len(exp) or exp[pos - 1] != action.chunk:
                self._violation(f"{node}: order info {action.pos} of view {action.pvn} "
                                f"(expected {pos})")
                return
            got.append(action.chunk)

    # -- the application ---------------------------------------------------------------
    def _app_tick(self, rep: _Replica):
        def tick(sim: Sim) -> None:
            if rep.node in self.crashed:
                return
            busy = False
            for cid, cuts in self._writes(rep):
                idx, done = rep.progress.get(cid, (0, 0))
                while idx < len(cuts):
                    chunk = cuts[idx][done:]
                    n = rep.core.send(cid, chunk, now_us=sim.now_us)
                    done += n
                    if done < len(cuts[idx]):
                        busy = True
                        break
                    idx, done = idx + 1, 0
                    if self.rng.random() < 0.5:
                        busy = busy or idx < len(cuts)
                        break
                rep.progress[cid] = (idx, done)
            if rep.primary:
                chunks = self.order_info[rep.group]
                while rep.oi_done < len(chunks):
                    if self.rng.random() < 0.5:
                        busy = True
                        break
                    try:
                        rep.core.add_order_info(chunks[rep.oi_done], now_us=sim.now_us)
                        self.oi_added.setdefault((rep.group, rep.core.pvn), []).append(
                            chunks[rep.oi_done])
                    except BufferFull:
                        busy = True
                        break
                    rep.oi_done += 1
            if busy:
                delay = self.rng.randint(APP_TICK_US // 2, APP_TICK_US * 2)
                sim.at(sim.now_us + delay, tick, rep.node)
        return tick

    def _crash(self, rep: _Replica):
        def crash(sim: Sim) -> None:
            sim.crash(rep.node)
            self.crashed.add(rep.node)
            sim.at(sim.now_us + DETECT_CRASH_US, self._remove(rep))
        return crash

    def _remove(self, rep: _Replica):
        """Play membership: drop the crashed replica; a crashed primary is replaced by
        the surviving backup of lowest precedence in a new primary view."""
        def remove(sim: Sim) -> None:
            g = rep.group
            reps = self.groups[g]
            alive = [(i, r) for i, r in enumerate(reps) if r.node not in self.crashed]
            if not alive:
                return
            members = [(r.bid, i + 1) for i, r in alive]
            if rep.primary:
                self.pvn[g] += 1
                self.failed_over.add(g)
                rep.primary = False
                alive[0][1].primary = True
            primary = next(r for _, r in alive if r.primary)
            if rep.node != primary.node and not primary.core.is_primary:
                # the new primary's application carries on after what it replayed
                primary.oi_done = max(primary.oi_done, primary.core.oi_delivered)
                sim.at(sim.now_us, self._app_tick(primary), primary.node)
            for _, r in alive:
                r.core.set_view(self.pvn[g], primary.bid, members, r.bid, now_us=sim.now_us)
        return remove

    def _inject(self, sim: Sim) -> None:
        rng = self.rng
        g = rng.choice(sorted(self.groups))
        a, b, seq, _ = rng.choice(self.conns)
        src = b if g == a else a
        role = Role.SERVER if g == a else Role.CLIENT
        mtype = MsgType.REPLY if role == Role.SERVER else MsgType.REQUEST
        forged = Message(mtype, src, g, seq, role, 1, 1, rng.getrandbits(62), msn=1,
                         body={"offset": 0, "data": b"FORGED" * 10, "flags": 0})
        kind = rng.random()
        if kind < 0.5:
            for dg in sim.forge(forged):
                sim.inject(g, dg)
        elif kind < 0.8:
            sim.inject(g, rng.randbytes(rng.randint(0, 80)))
        else:
            from llft.protocol import wire
            dg = bytearray(wire.encode(forged, sim.key)[0])
            i = rng.randrange(len(dg))
            dg[i] ^= 1 + rng.randrange(255)
            sim.inject(g, bytes(dg))
        self.injected += 1

    # -- the run -----------------------------------------------------------------------
    def run(self) -> list[str]:
        sim, rng = self.sim, self.rng
        self.injected = 0
        for rep in self.by_node.values():
            sim.at(rng.randint(0, 20_000), self._app_tick(rep), rep.node)
        for reps in self.groups.values():
            if len(reps) > 1 and self.failover and rng.random() < self.failover:
                # a change of primary (one survivor at least: no backup crashes here)
                sim.at(rng.randint(0, FAULT_PHASE_US), self._crash(reps[0]))
                continue
            for rep in reps[1:]:
                if rng.random() < 0.25:
                    sim.at(rng.randint(0, FAULT_PHASE_US), self._crash(rep))
        if rng.random() < PARTITION_P:
            cut = rng.choice(sorted(self.by_node))
            start = rng.randint(0, FAULT_PHASE_US - PARTITION_US_MAX)
            sim.at(start, lambda s: s.partition([cut]))
            sim.at(start + rng.randint(1_000, PARTITION_US_MAX), lambda s: s.heal())
        for _ in range(FORGED_PER_SCHEDULE):
            sim.at(rng.randint(0, FAULT_PHASE_US), self._inject)
        sim.run_until(FAULT_PHASE_US)
        sim.set_faults(NetConfig())
        deadline = FAULT_PHASE_US + LIVENESS_BOUND_US
        problems: list[str] = []
        while sim.now_us < deadline:
            sim.run_for(CHECK_EVERY_US)
            problems = self._pending()
            if not problems or self.violations:
                break
        if problems and not self.violations:
            self._violation(f"not done {LIVENESS_BOUND_US} us after faults stopped: "
                            + "; ".join(problems[:3]))
        rejected = sum(sim.decoder(n).rejections.total() for n in self.by_node
                       if n not in self.crashed)
        if self.injected and rejected == 0:
            self._violation("injected datagrams were not rejected")
        return self.violations

    def _pending(self) -> list[str]:
        out = []
        for rep in self.by_node.values():
            if rep.node in self.crashed:
                continue
            for cid, exp in self._expected(rep).items():
                got = rep.got.get(cid, b"")
                if len(got) != len(exp):
                    out.append(f"{rep.node} {cid}: {len(got)}/{len(exp)} bytes")
            for cid, cuts in self._writes(rep):
                if rep.progress.get(cid, (0, 0))[0] < len(cuts):
                    out.append(f"{rep.node} {cid}: app still writing")
            if not rep.primary:
                pvn = rep.core.pvn
                want = len(self.oi_added.get((rep.group, pvn), []))
                if len(rep.oi_got.get(pvn, [])) != want:
                    out.append(f"{rep.node}: order info {len(rep.oi_got.get(pvn, []))}/"
                               f"{want} of view {pvn}")
            sizes = rep.core.buffer_sizes()
            # a backup keeps up to a window of acked bytes in its log (messaging.py)
            log_bound = ((self.cfg.window_msgs + 1) * self.cfg.max_payload_bytes
                         * len(rep.core.conns))
            if sizes.pop("log_bytes") <= log_bound:
                sizes.pop("log")
            held = {k: v for k, v in sizes.items() if v}
            if held:
                out.append(f"{rep.node} holds {held}")
        return out


def run_schedule(seed: int, loss: float = 0.0, dup: float = 0.0,
                 reorder: float = 0.0, failover: float = 0.0) -> list[str]:
    return Schedule(seed, loss, dup, reorder, failover).run()


def add_arguments(parser) -> None:
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--dup", type=float, default=0.0)
    parser.add_argument("--reorder", type=float, default=0.0)
    parser.add_argument("--failover", type=float, default=0.0,
                        help="per group, chance that its primary crashes and this check "
                             "plays membership (new primary view, phase 2 of messaging)")
    parser.add_argument("--one", type=int, default=None,
                        help="run only this schedule seed (as printed) and show its problems")


def run(args) -> int:
    if args.one is not None:
        v = run_schedule(args.one, args.loss, args.dup, args.reorder, args.failover)
        for line in v:
            print(line)
        print(f"1 schedules, {1 if v else 0} violations")
        return 1 if v else 0
    bad = 0
    t0 = time.monotonic()
    for i in range(args.schedules):
        s = schedule_seed(args.seed, i)
        v = run_schedule(s, args.loss, args.dup, args.reorder, args.failover)
        if v:
            bad += 1
            print(f"schedule {i} seed {s} loss {args.loss} dup {args.dup} "
                  f"reorder {args.reorder} failover {args.failover}: {v[0]}", flush=True)
    print(f"{args.schedules} schedules, {bad} violations")
    print(f"({time.monotonic() - t0:.1f} s)", file=sys.stderr)
    return 1 if bad else 0
