"""`llft simulate messaging`: the messaging protocol's safety and liveness, checked on
seeded random schedules run by the deterministic simulator kernel.

Each schedule builds two or three groups of 1-3 replicas, a few virtual connections
between them, and applications on every replica that write the same byte streams
(semi-active: backups produce what their primary produces, at their own pace and often in
differently sized writes) and, on primaries, order-info chunks. During the fault phase the
network loses, duplicates, reorders and corrupts datagrams, forged and garbage datagrams
are injected, a replica is cut off by a transient partition, and backups crash (this check
plays membership: it removes a crashed replica after DETECT_CRASH_US; with --failover a
crashed primary is replaced by the next backup in a new primary view, phase 2 of
messaging); with --die a whole group dies (every replica crashes, none replaced: a
gateway's host lost for good). Then faults stop, and the checks are:

  * exactly once, in order: every Deliver continues its stream exactly where the last
    one ended, with the bytes the primary's application wrote; at the end every live
    member of the destination group has the whole stream of every connection;
  * stream ends: a stream the application closed (FIN) or aborted (RST) ends with one
    `Closed` at every live member of the other group, exactly once, after its last
    byte, with the right kind; nothing is delivered after it; a connection whose two
    streams ended is freed at every live replica of both groups (`Freed` once, no
    state, no timer left: `MessagingEndpoint.check`), and stays freed;
  * order info: every live backup receives positions 1..n, exactly once, in order, with
    the primary's bytes;
  * flow control: at every action of a replica, no connection has more than
    `window_msgs` messages in flight (sent, not covered by the remote group watermark),
    and every retransmission timeout lies within [retransmit_us, retransmit_max_us]
    (the RTT estimate with its back-off, connection.RtoEstimator);
  * authentication: nothing forged or corrupted is delivered (the byte comparison), and
    the decoders rejected the injected datagrams;
  * buffers: at quiescence sent lists, queues, received lists, placeholders and
    order-info logs are empty and backup logs hold at most a window per connection
    (garbage collection by watermarks worked);
  * a group that died: each of its connections is freed at every live replica of the
    other group within remote_timeout_us (the remote's silence), after the SAME bytes
    at every one of them; a stream of the dead group that had not ended here ends at
    the primary with one `Closed`, abort, right after those bytes (its reset, the same
    point for every replica's application);
  * liveness: all of the above hold within LIVENESS_BOUND_US of simulated time after the
    faults stop (plus remote_timeout_us when a group died).

The generator (`generate`) decides everything before the schedule runs and writes it as a
scenario script (format and runner: llft/sim/campaign.py). Its lines: `set faults loss P
dup P reorder P corrupt P`, `set messaging payload B window N` (optional after them:
`pulse N`, `direct-ack US`, `oi-ack US report US intra US`: the cores' timing for
scenarios recorded before it changed, campaign.TIMING_KEYS), `set lanes` (every lone primary lends its steady connection to a lane,
llft/protocol/messaging/lane.py, and every backup its steady state for its primary's
HEARTBEAT, the remote primaries' data messages, keep-alives and acks and its own
report and NACK timers and its own heartbeat to a backup lane, backup_lane.py; with
`set native` the lanes are the C engines, native/lane/,
each run in lockstep with a copy of the core: a lane that acts or ends up otherwise than
the core fails the schedule), `seed sim N` (the kernel),
`seed app N` (the applications' pacing), `group G BID...` (birth ids in rank order, the
first is the primary), `conn K CLIENT SERVER seq N`, `writes K c2s|s2c SIZE...` (a stream,
cut as its primary's application writes it), `end K c2s|s2c fin|rst` (the application
closes or aborts after its last write), `recut NODE K DIR SIZE...` (a replica that
cuts it differently), `order-info G SIZE...` (chunks G's primary adds); events `app NODE`
(its application starts), `crash NODE`, `die G` (every replica of G crashes for good),
`partition NODE... [| NODE...]` (unlisted nodes
form one more side), `heal`, `inject G forged|garbage|flipped ...` (see `Schedule._inject`)
and `quiet` (faults stop).
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field

from llft.protocol import wire
from llft.protocol.messages import Message, MsgType, Role
from llft.protocol.messaging import (BufferFull, Closed, Deliver, DeliverOrderInfo, Freed,
                                     MessagingConfig, MessagingEndpoint)
from llft.protocol.messaging.backup_lane import BackupLane
from llft.protocol.messaging.lane import LanedEndpoint, LaneDivergence
from llft.protocol.messaging.native_backup_lane import native_backup_engine
from llft.protocol.messaging.native_lane import native_engine
from llft.sim.campaign import (Campaign, Outcome, Param, Script, ScenarioError,
                               messaging_timing, run_until_done, sides, us)
from llft.sim.kernel import NetConfig, Sim

KIND = "messaging"
FAULT_PHASE_US = 150_000            # app traffic and faults
LIVENESS_BOUND_US = 400_000         # after faults stop, everything done within this
CHECK_EVERY_US = 10_000
APP_TICK_US = 2_000                 # an app retries a blocked write this often
DETECT_CRASH_US = 20_000            # "membership" removes a crashed backup after this
MAX_STREAM_BYTES = 24_000           # per direction per connection
GATEWAY_STREAM_BYTES = 96_000       # ... of the gateway's shape (--gateway)
MAX_WRITE_BYTES = 3_000
MAX_ORDER_INFO_CHUNKS = 40
CORRUPT_P = 0.01
PARTITION_P = 0.3                   # chance of one transient partition per schedule
PARTITION_US_MAX = 30_000
FORGED_PER_SCHEDULE = 6
# with lanes, the backups' loans checked in lockstep: one in this many (each copies the
# whole core; tests/sim/test_backup_lane.py checks every one)
BACKUP_SHADOW_EVERY = 4
END_P = 0.85                        # a stream ends (closed by its application) ...
RST_P = 0.2                         # ... by an abort rather than a FIN


def stream_bytes(label: str, n: int) -> bytes:
    """Application bytes: the content is arbitrary and fixed by what they are."""
    return hashlib.shake_256(f"llft-messaging {label}".encode()).digest(n)


def _sizes(rng: random.Random, total: int) -> list[int]:
    """Cut `total` bytes into writes of 1..MAX_WRITE_BYTES."""
    sizes, i = [], 0
    while i < total:
        sizes.append(min(total - i, rng.randint(1, MAX_WRITE_BYTES)))
        i += sizes[-1]
    return sizes


def generate(seed: int, loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0,
             failover: float = 0.0, die: float = 0.0, lanes: float = 1.0,
             gateway: float = 0.0, native: float = 0.0) -> Script:
    """The schedule of `seed`, written out (every decision is made here, before it runs)."""
    rng = random.Random(seed)
    sim_seed = rng.getrandbits(64)
    head = [("set", "faults", "loss", loss, "dup", dup, "reorder", reorder,
             "corrupt", CORRUPT_P),
            ("set", "messaging", "payload", rng.choice([256, 700, 1024, 2000]),
             "window", rng.choice([4, 8, 32])),
            ("seed", "sim", sim_seed)]
    if lanes:       # (no draw: a schedule is the same with and without lanes)
        head.append(("set", "lanes"))
        if native:
            head.append(("set", "native"))
    # the gateway's shape (drawn only when asked: other schedules stay as they were):
    # g0, a lone primary, has one long connection to g1 and no order info of its own
    shaped = bool(gateway) and rng.random() < gateway
    groups: dict[str, list[str]] = {}
    for gi in range(2 if shaped else rng.choice([2, 3])):
        g = f"g{gi}"
        size = 1 if shaped and gi == 0 else rng.randint(1, 3)
        bids = [rng.getrandbits(62) + 1 for _ in range(size)]
        head.append(("group", g, *bids))
        groups[g] = [f"{g}.{i}" for i in range(size)]
    conns, writes, ends = [], [], []
    seqs: dict[str, int] = {}
    for k in range(1, (1 if shaped else rng.randint(1, 4)) + 1):
        a, b = ("g0", "g1") if shaped else rng.sample(sorted(groups), 2)
        seqs[a] = seqs.get(a, 0) + 1
        conns.append((k, a, b))
        head.append(("conn", k, a, b, "seq", seqs[a]))
        for direction in ("c2s", "s2c"):
            most = GATEWAY_STREAM_BYTES if shaped else MAX_STREAM_BYTES
            total = rng.randint(0, most) if rng.random() < 0.9 else 0
            rng.randbytes(total)           # the content is stream_bytes(); keeps the draws
            writes.append(("writes", k, direction, *_sizes(rng, total)))
            if rng.random() < END_P or (direction == "c2s" and total == 0):
                # (the client speaks first: a connection is opened by its first message)
                ends.append(("end", k, direction, "rst" if rng.random() < RST_P else "fin"))
    head += writes + ends
    for g in groups:
        sizes = []
        for _ in range(0 if shaped and g == "g0" else rng.randint(0, MAX_ORDER_INFO_CHUNKS)):
            sizes.append(rng.randint(1, 200))
            rng.randbytes(sizes[-1])
        head.append(("order-info", g, *sizes))
    # a replica writes the same stream as its primary, often cut differently
    totals = {(w[1], w[2]): sum(int(x) for x in w[3:]) for w in writes}
    for g, nodes in groups.items():
        for node in nodes:
            for k, a, b in conns:
                if g in (a, b):
                    direction = "c2s" if g == a else "s2c"
                    if rng.random() < 0.5 and totals[(k, direction)]:
                        head.append(("recut", node, k, direction,
                                     *_sizes(rng, totals[(k, direction)])))
    events: list[tuple[int, tuple]] = []
    for nodes in groups.values():
        for node in nodes:
            events.append((rng.randint(0, 20_000), ("app", node)))
    for nodes in groups.values():
        if len(nodes) > 1 and failover and rng.random() < failover:
            # a change of primary (one survivor at least: no backup crashes here)
            events.append((rng.randint(0, FAULT_PHASE_US), ("crash", nodes[0])))
            continue
        for node in nodes[1:]:
            if rng.random() < 0.25:
                events.append((rng.randint(0, FAULT_PHASE_US), ("crash", node)))
    if rng.random() < PARTITION_P:
        cut = rng.choice(sorted(n for nodes in groups.values() for n in nodes))
        start = rng.randint(0, FAULT_PHASE_US - PARTITION_US_MAX)
        events.append((start, ("partition", cut)))
        events.append((start + rng.randint(1_000, PARTITION_US_MAX), ("heal",)))
    inject_at = [rng.randint(0, FAULT_PHASE_US) for _ in range(FORGED_PER_SCHEDULE)]
    for t in inject_at:
        g = rng.choice(sorted(groups))
        k, a, b = rng.choice(conns)
        sender = rng.getrandbits(62)
        kind = rng.random()
        if kind < 0.5:
            events.append((t, ("inject", g, "forged", k, "sender", sender)))
        elif kind < 0.8:
            junk = rng.randbytes(rng.randint(0, 80)).hex()
            events.append((t, ("inject", g, "garbage", junk or "-")))
        else:
            n = len(wire.encode(_forged(g, a, b, k, sender), bytes(wire.KEY_BYTES))[0])
            events.append((t, ("inject", g, "flipped", k, "sender", sender,
                               "byte", rng.randrange(n), "xor", 1 + rng.randrange(255))))
    head.insert(3, ("seed", "app", rng.getrandbits(64)))
    if die and rng.random() < die:      # (drawn last: schedules without it are unchanged)
        events.append((rng.randint(0, FAULT_PHASE_US), ("die", rng.choice(sorted(groups)))))
    events.append((FAULT_PHASE_US, ("quiet",)))
    script = Script(KIND)
    for line in head:
        script.add(*line)
    for t, words in sorted(events, key=lambda e: e[0]):     # stable: ties keep their order
        script.at(t, *words)
    return script


def _forged(g: str, a: str, b: str, seq: int, sender: int) -> Message:
    """A datagram for connection (a -> b, seq) as group `g` would receive it."""
    src = b if g == a else a
    role = Role.SERVER if g == a else Role.CLIENT
    mtype = MsgType.REPLY if role == Role.SERVER else MsgType.REQUEST
    return Message(mtype, src, g, seq, role, 1, 1, sender, msn=1,
                   body={"offset": 0, "data": b"FORGED" * 10, "flags": 0})


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
    ended: dict = field(default_factory=dict)       # conn id -> abort, from Closed
    freed: dict = field(default_factory=dict)       # conn id -> bytes got when Freed
    closed_own: set = field(default_factory=set)    # conn ids our app closed


class Schedule:
    """One schedule, built from its script."""

    def __init__(self, script: Script, *, trace=None):
        self.script = script
        self.trace = trace                 # print-like callable: the events as they happen
        self.pvn: dict[str, int] = {}
        self.oi_added: dict[tuple[str, int], list[bytes]] = {}   # (group, pvn) -> chunks
        self.violations: list[str] = []
        f = script.pairs("set", "faults")
        net = NetConfig(loss=float(f["loss"]), dup=float(f["dup"]),
                        reorder=float(f["reorder"]), corrupt=float(f["corrupt"]))
        self.sim = Sim(random.Random(script.seed("sim")), net)
        self.app_rng = random.Random(script.seed("app"))     # the applications' pacing
        m = script.pairs("set", "messaging")
        # every group may die whole here (`die`); live ones never fall silent for the
        # remote timeout within a schedule, so the rule is on for all of them
        self.cfg = MessagingConfig(max_payload_bytes=int(m["payload"]),
                                   window_msgs=int(m["window"]), lone_groups=("g",),
                                   **messaging_timing(m))
        # `set lanes on`: every replica's core lends its steady connection to a lane
        # (llft/protocol/messaging/lane.py), a backup its steady state for its primary's
        # HEARTBEAT and for remote data (backup_lane.py), checked in lockstep against a
        # copy of the core
        self.lanes = any(tuple(ln[:2]) == ("set", "lanes") for ln in script.lines)
        # `set native`: the lanes are the C engines (native/lane/), on this schedule's
        # key and MTU, checked the same way
        self.native = any(tuple(ln[:2]) == ("set", "native") for ln in script.lines)
        engine, backup_engine = lane_engines(self.sim, self.native)
        self.groups: dict[str, list[_Replica]] = {}
        self.conns = []             # (client group, server group, conn_seq, streams)
        conn_index: dict[str, int] = {}
        self.order_info: dict[str, list[bytes]] = {}
        recuts = []
        for line in script.lines:
            verb, args = line[0], line[1:]
            if verb == "group":
                g, bids = args[0], [int(w) for w in args[1:]]
                members = [(b, i + 1) for i, b in enumerate(bids)]
                reps = []
                for i, b in enumerate(bids):
                    core = MessagingEndpoint(g, b, self.cfg)
                    core.set_view(1, bids[0], members, b, now_us=0)
                    if self.lanes:
                        core = LanedEndpoint(core, shadow=True, engine=engine,
                                             backup_engine=backup_engine,
                                             backup_shadow_every=BACKUP_SHADOW_EVERY)
                    reps.append(_Replica(f"{g}.{i}", g, b, core, i == 0))
                self.groups[g] = reps
                self.pvn[g] = 1
            elif verb == "conn":
                conn_index[args[0]] = len(self.conns)
                self.conns.append((args[1], args[2], int(args[4]), {}))
            elif verb == "writes":
                k, direction, sizes = args[0], args[1], [int(w) for w in args[2:]]
                data = stream_bytes(f"conn {k} {direction}", sum(sizes))
                self.conns[conn_index[k]][3][direction] = (data, _cut(data, sizes))
            elif verb == "order-info":
                self.order_info[args[0]] = [stream_bytes(f"order-info {args[0]} {i}", int(n))
                                            for i, n in enumerate(args[1:])]
            elif verb == "recut":
                recuts.append(args)
            elif verb == "end":
                self.conns[conn_index[args[0]]][3]["end " + args[1]] = args[2] == "rst"
        self.crashed: set[str] = set()
        self.dead: set[str] = set()         # groups that died whole
        self.lost_at: dict = {}             # (group, conn id) -> a lost stream's reset point
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
        # a replica writes the stream as its primary cut it, unless recut.
        self.cuts: dict[tuple[str, tuple], list[bytes]] = {}
        for rep in self.by_node.values():
            for cid, data, cuts in self._streams(rep):
                self.cuts[(rep.node, cid)] = cuts
        for node, k, direction, *sizes in recuts:
            a, b, seq, streams = self.conns[conn_index[k]]
            cid = (b, seq, Role.CLIENT) if direction == "c2s" else (a, seq, Role.SERVER)
            self.cuts[(node, cid)] = _cut(streams[direction][0], [int(w) for w in sizes])
        self.conn_ids = {k: self.conns[i] for k, i in conn_index.items()}
        self.own_end = {(rep.node, cid): mine for rep in self.by_node.values()
                        for cid, mine, _ in self._ends(rep)}

    # -- expectations ------------------------------------------------------------------
    def _streams(self, rep: _Replica):
        """(conn id, stream, the primary's cuts) for what this replica's app writes."""
        for a, b, seq, streams in self.conns:
            if rep.group == a:
                yield (b, seq, Role.CLIENT), *streams["c2s"]
            elif rep.group == b:
                yield (a, seq, Role.SERVER), *streams["s2c"]

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

    def _ends(self, rep: _Replica):
        """conn id -> (how this replica's app ends its stream, how the remote's ends):
        True for an abort, False for a FIN, None if it does not end."""
        for a, b, seq, streams in self.conns:
            if rep.group == a:
                yield (b, seq, Role.CLIENT), streams.get("end c2s"), streams.get("end s2c")
            elif rep.group == b:
                yield (a, seq, Role.SERVER), streams.get("end s2c"), streams.get("end c2s")

    def _violation(self, what: str) -> None:
        if len(self.violations) < 5:
            self.violations.append(what)

    # -- actions -----------------------------------------------------------------------
    def _on_action(self, node: str, action, now_us: int) -> None:
        rep = self.by_node[node]
        self._check_flow(rep)
        if isinstance(action, (Deliver, Closed)) and (action.conn in rep.ended
                                                      or action.conn in rep.freed):
            self._violation(f"{node} {action.conn}: {type(action).__name__} after the "
                            f"stream's end or the connection's free")
            return
        if isinstance(action, Closed):
            got = len(rep.got.get(action.conn, b""))
            exp = self._expected(rep).get(action.conn)
            want = dict((cid, theirs) for cid, _, theirs in self._ends(rep)).get(action.conn)
            if action.conn[0] in self.dead and action.abort and action.offset == got:
                # the reset of a stream whose group died: where the primary stood
                self.lost_at[(rep.group, action.conn)] = got
            elif exp is None or got != len(exp) or action.offset != got or want is None \
                    or want != action.abort:
                self._violation(f"{node} {action.conn}: end (abort={action.abort}) at "
                                f"{action.offset} after {got} bytes; expected "
                                f"{None if exp is None else len(exp)} bytes, abort={want}")
            rep.ended[action.conn] = action.abort
            return
        if isinstance(action, Freed):
            if action.conn in rep.freed:
                self._violation(f"{node} {action.conn}: freed twice")
            rep.freed[action.conn] = len(rep.got.get(action.conn, b""))
            return
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
                    if self.app_rng.random() < 0.5:
                        busy = busy or idx < len(cuts)
                        break
                rep.progress[cid] = (idx, done)
                if idx >= len(cuts) and cid not in rep.closed_own:
                    mine = self.own_end[(rep.node, cid)]
                    if mine is not None:
                        rep.core.close(cid, abort=mine, now_us=sim.now_us)
                        rep.closed_own.add(cid)
            if rep.primary:
                chunks = self.order_info[rep.group]
                while rep.oi_done < len(chunks):
                    if self.app_rng.random() < 0.5:
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
                delay = self.app_rng.randint(APP_TICK_US // 2, APP_TICK_US * 2)
                sim.at(sim.now_us + delay, tick, rep.node)
        return tick

    def _crash(self, rep: _Replica):
        def crash(sim: Sim) -> None:
            sim.crash(rep.node)
            self.crashed.add(rep.node)
            sim.at(sim.now_us + DETECT_CRASH_US, self._remove(rep))
        return crash

    def _die(self, g: str):
        def die(sim: Sim) -> None:
            self.dead.add(g)
            for rep in self.groups[g]:
                sim.crash(rep.node)
                self.crashed.add(rep.node)
        return die

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

    def _inject(self, g: str, kind: str, *args: str):
        """`forged K sender B`: a datagram of connection K sealed with a wrong key;
        `garbage HEX`: bytes; `flipped K sender B byte I xor X`: a sealed datagram of
        connection K with byte I xor X."""
        def inject(sim: Sim) -> None:
            if kind == "garbage":
                sim.inject(g, bytes.fromhex(args[0].replace("-", "")))
            else:
                a, b, seq, _ = self.conn_ids[args[0]]
                forged = _forged(g, a, b, seq, int(args[2]))
                if kind == "forged":
                    for dg in sim.forge(forged):
                        sim.inject(g, dg)
                elif kind == "flipped":
                    dg = bytearray(wire.encode(forged, sim.key)[0])
                    dg[int(args[4])] ^= int(args[6])
                    sim.inject(g, bytes(dg))
                else:
                    raise ScenarioError(f"messaging: unknown injection {kind!r}")
            if any(r.node not in self.crashed for r in self.groups[g]):
                self.injected += 1          # (a dead group's decoders count nothing)
        return inject

    # -- the run -----------------------------------------------------------------------
    def _traced(self, line: tuple[str, ...], fn):
        if self.trace is None:
            return fn

        def traced(sim: Sim) -> None:
            self.trace(f"{sim.now_us / 1000:10.3f} ms  {' '.join(line[2:])}")
            fn(sim)
        return traced

    def run(self) -> list[str]:
        sim = self.sim
        self.injected = 0
        quiet_us = None
        for line in self.script.lines:
            if line[0] != "at":
                continue
            t, verb, args = us(line[1]), line[2], line[3:]
            if verb == "app":
                sim.at(t, self._traced(line, self._app_tick(self.by_node[args[0]])), args[0])
            elif verb == "crash":
                sim.at(t, self._traced(line, self._crash(self.by_node[args[0]])))
            elif verb == "die":
                sim.at(t, self._traced(line, self._die(args[0])))
            elif verb == "partition":
                sim.at(t, self._traced(line, lambda s, c=sides(args): s.partition(*c)))
            elif verb == "heal":
                sim.at(t, self._traced(line, lambda s: s.heal()))
            elif verb == "inject":
                sim.at(t, self._traced(line, self._inject(*args)))
            elif verb == "quiet":
                quiet_us = t
            else:
                raise ScenarioError(f"messaging: unknown event {' '.join(line[2:])!r}")
        if quiet_us is None:
            raise ScenarioError("messaging: a scenario needs a `quiet` event")
        sim.run_until(quiet_us)
        sim.set_faults(NetConfig())
        problems: list[str] = []

        def done() -> bool:
            self._check_invariants()
            problems[:] = self._pending()
            return not problems or bool(self.violations)
        bound = LIVENESS_BOUND_US + (self.cfg.remote_timeout_us
                                     if any(ln[2] == "die" for ln in self.script.lines
                                            if ln[0] == "at") else 0)
        if run_until_done(sim, done, bound, CHECK_EVERY_US) is None \
                and problems and not self.violations:
            self._violation(f"not done {bound} us after faults stopped: "
                            + "; ".join(problems[:3]))
        self._check_lost()
        # (a replica that rejected them may have crashed since, or its whole group died)
        rejected = sum(sim.decoder(n).rejections.total() for n in self.by_node)
        if self.injected and rejected == 0:
            self._violation("injected datagrams were not rejected")
        return self.violations

    def _check_lost(self) -> None:
        """Every live replica freed each connection of a dead group after the same bytes,
        and the primary's reset of a stream that had not ended stood right there."""
        for g, reps in self.groups.items():
            live = [r for r in reps if r.node not in self.crashed]
            for cid in {cid for r in live for cid in self._expected(r)}:
                if cid[0] not in self.dead:
                    continue
                at = {r.node: r.freed.get(cid) for r in live}
                if len(set(at.values())) > 1:
                    self._violation(f"{cid} of the dead group {cid[0]}: freed after "
                                    f"different bytes {at}")
                lost = self.lost_at.get((g, cid))
                if lost is not None and set(at.values()) != {lost}:
                    self._violation(f"{cid}: reset at {lost} by the primary, freed after "
                                    f"{at}")

    def _check_flow(self, rep: _Replica) -> None:
        cfg = self.cfg
        core = rep.core
        if isinstance(core, LanedEndpoint) and core.lane is not None \
                and core.lane.cid is not None:
            # (read without taking the loan back: the lane holds its sent list)
            loan = core.lane.loan
            rows = [(loan.cid, len(loan.sent), loan.rto[3])]
            rows += [(c.cid, len(c.send.sent), c.send.rto_us)
                     for c in core.endpoint.conns.values() if c.cid != loan.cid]
        else:
            # (a backup's loan holds no send side: read it without taking the loan back)
            ep = core.endpoint if isinstance(core, LanedEndpoint) else core
            rows = [(c.cid, len(c.send.sent), c.send.rto_us) for c in ep.conns.values()]
        for cid, sent, rto_us in rows:
            if sent > cfg.window_msgs:
                self._violation(f"{rep.node} {cid}: {sent} messages in flight "
                                f"> window {cfg.window_msgs}")
            if not cfg.retransmit_us <= rto_us <= cfg.retransmit_max_us:
                self._violation(f"{rep.node} {cid}: retransmission timeout "
                                f"{rto_us} us outside its bounds")

    def _check_invariants(self) -> None:
        """Each live endpoint's own invariants (`MessagingEndpoint.check`: connection state
        machines, timers, order-info log), asserted at every check of the quiet phase."""
        for rep in self.by_node.values():
            if rep.node in self.crashed:
                continue
            try:
                rep.core.check()
            except AssertionError as e:
                self._violation(f"{rep.node}: invariant: {e}")

    def _pending(self) -> list[str]:
        out = []
        for rep in self.by_node.values():
            if rep.node in self.crashed:
                continue
            for cid, exp in self._expected(rep).items():
                got = rep.got.get(cid, b"")
                if cid[0] in self.dead:
                    # its stream stops where the group died; the connection goes
                    if cid in rep.core.conns or cid not in rep.freed:
                        out.append(f"{rep.node} {cid}: of a dead group, not freed")
                elif len(got) != len(exp):
                    out.append(f"{rep.node} {cid}: {len(got)}/{len(exp)} bytes")
            for cid, cuts in self._writes(rep):
                if rep.progress.get(cid, (0, 0))[0] < len(cuts):
                    out.append(f"{rep.node} {cid}: app still writing")
            for cid, mine, theirs in self._ends(rep):
                if cid[0] in self.dead:
                    continue
                if theirs is not None and cid not in rep.ended:
                    out.append(f"{rep.node} {cid}: stream end not delivered")
                if mine is not None and theirs is not None and (
                        cid in rep.core.conns or cid not in rep.freed
                        or cid not in rep.core.closed):
                    out.append(f"{rep.node} {cid}: both streams ended, not freed")
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


def _cut(data: bytes, sizes: list[int]) -> list[bytes]:
    out, i = [], 0
    for n in sizes:
        out.append(data[i:i + n])
        i += n
    if i != len(data):
        raise ScenarioError(f"messaging: writes of {i} bytes for a stream of {len(data)}")
    return out


def lane_engines(sim: Sim, native: bool) -> tuple:
    """What runs the loans of a simulated kernel's cores with lanes on: (a lone
    primary's engine, a backup's) -- the models (None: SteadyLane), or with `native` the
    C engines on the kernel's key and MTU (a codec each, for the whole schedule)."""
    if not native:
        return None, BackupLane
    key, mtu = sim.key, sim.net.mtu_bytes
    return native_engine(key, mtu), native_backup_engine(key, mtu)


def run_seed(seed: int, *, loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0,
             failover: float = 0.0, die: float = 0.0, lanes: float = 1.0,
             gateway: float = 0.0, native: float = 0.0, trace=None) -> Outcome:
    return run_script(generate(seed, loss, dup, reorder, failover, die, lanes, gateway,
                               native), trace=trace)


def gateway_schedules(seeds, **faults):
    """Each gateway-shaped schedule of `seeds` (`--gateway 1`) run, with its violations
    (a lane that diverged from the core is one): (schedule, violations) for tests that
    count what the lanes did."""
    for seed in seeds:
        s = Schedule(generate(seed, gateway=1.0, **faults))
        try:
            violations = s.run()
        except LaneDivergence as e:
            violations = [f"seed {seed}: {e}"]
        yield s, violations


def run_script(script: Script, *, trace=None) -> Outcome:
    s = Schedule(script, trace=trace)
    v = s.run()
    return Outcome(v, script, Counter({k: n for k, n in s.sim.stats.items()}))


CAMPAIGN = Campaign(
    KIND, run_seed, run_script, schedules=100, about=__doc__.split("\n\n")[0], params=(
        Param("loss", 0.0, "chance that a datagram is lost, per receiver"),
        Param("dup", 0.0, "chance that a datagram is duplicated"),
        Param("reorder", 0.0, "chance that a datagram is delayed by up to 3 ms more"),
        Param("failover", 0.0, "per group, chance that its primary crashes and this check "
                               "plays membership (new primary view, phase 2 of messaging)"),
        Param("die", 0.0, "chance that one group dies whole (every replica crashes, none "
                          "replaced: a gateway's host lost for good)"),
        Param("lanes", 1.0, "1: lone primaries lend their steady connection to a lane "
                            "(lane.py), backups their steady state for their primary's "
                            "HEARTBEAT, remote data, keep-alives and acks and their own "
                            "report and NACK timers (backup_lane.py), checked in "
                            "lockstep against a copy of the core; 0: the core alone"),
        Param("gateway", 0.0, "chance that a schedule has the gateway's shape: a lone "
                              "primary with one long connection and no order info "
                              "(what a lane owns)"),
        Param("native", 0.0, "1 (with lanes): the lanes are the C engines (native/lane/: "
                             "a lone primary's and a backup's, on raw datagrams), checked "
                             "in lockstep against a copy of the core as the models are")))
add_arguments, run = CAMPAIGN.add_arguments, CAMPAIGN.run
