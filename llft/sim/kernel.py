"""Deterministic simulator kernel: simulated clock, event heap, faulty multicast network.

Theory of operation
-------------------
A `Sim` owns one seeded `random.Random` (`sim.rng`, the *only* source of randomness of a
run), a clock in microseconds (`sim.now_us`) and a heap of events. Every run with the same
seed and the same calls is identical, so any failing schedule is replayed from its seed.

Nodes are sans-IO protocol cores that follow the convention of docs/ARCHITECTURE.md:

    core.handle_message(msg, now_us)   core.handle_timer(now_us)
    core.next_timer_us() -> int|None   core.take_actions() -> list[action]

After every event that touches a node the kernel *pumps* it: it drains `take_actions()`,
multicasts every send action (any action with `dst_group` and `msg` attributes) and hands
every other action to the node's `on_action(node_id, action, now_us)` callback (the check
module records deliveries there), then (re)arms the node's timer from `next_timer_us()`.

The network carries *encoded, authenticated datagrams*: each node has its own
`llft.protocol.wire.Encoder` and `llft.protocol.wire.Decoder` (one cluster key per Sim), so fragmentation,
the HMAC and the strict decoder are exercised on every message; by default in
"differential" mode: the C half of the codec decides, and the Python reference judges every
datagram beside it (a difference raises `wire.WireDivergence`: the schedule fails). A send to group G goes to
every live node listening on G except the sender (no multicast loopback). Per datagram and
per receiver: loss (`loss`), duplication (`dup`, an extra copy with its own delay),
reordering (`reorder`: extra random delay up to `reorder_us_max`), base delay uniform in
[`delay_us_min`, `delay_us_max`], corruption (`corrupt`: one random byte flipped).
A `messages.Pulse` action is sent and its bytes repeated every `every_us` until
`until_us` (a newer Pulse of the node replaces it), as the runtime's pulse thread does.
HEARTBEATs travel on the pulse channel: a node whose core takes copies (`heard_again`)
absorbs a datagram byte-identical to one of the last `PULSE_REFS` it accepted from the
same source, keeping only its arrival time (also while paused: the kernel stamps it),
and the copies are handed to the core before its next event.
Partitions cut node pairs (checked at send and at arrival); crashes stop a node (pending datagrams and timers for it are
dropped); a restart installs a new core under the same node id (a new incarnation).
A pause stops a node without killing it (a SIGSTOP, a long GC or swap stall): until the pause
ends nothing of it runs and nothing reaches it; its datagrams, timers and calls wait (in
their order, its timers after the rest, as the runtime's driver reads every socket before
a late timer) and all run when it resumes, with the clock of the resumption. The node
neither sends nor notices time passing meanwhile, so the others may suspect and replace it
while it still holds its old view: the false suspicion of a live process.
`inject()` puts arbitrary bytes (forged or corrupted datagrams) on the network.

API (small on purpose; every check in llft/sim/ uses it)
-------------------------------------------------------
    sim = Sim(seed, NetConfig(loss=.1, ...))       # or Sim(random.Random(..), ...)
    sim.add_node(node_id, core, groups, on_action=cb)   # groups: addresses it listens on
                                   # cb(node_id, action, now_us) gets every non-send action
    sim.at(t_us, fn, node_id=None)     # call fn(sim) at t_us, then pump node_id (or all);
                                   # that pump drains actions a core queued while its
                                   # owner handled an action, so even an event that does
                                   # nothing is part of a schedule
    sim.crash(node_id) / sim.restart(node_id, core, groups=None, on_action=None)
    sim.pause(node_id, until_us)                   # SIGSTOP until until_us, then SIGCONT
    sim.partition([a, b], [c]) / sim.heal()       # nodes in different sets cannot talk
    sim.set_faults(NetConfig(...))                 # e.g. stop faults for the liveness phase
    sim.inject(group, datagram, delay_us=0)        # raw bytes to every listener of group
    sim.forge(msg) -> list[bytes]                  # msg sealed with a wrong key
    sim.run_until(t_us) / sim.run_for(d_us)        # returns the number of events run
    sim.pump(node_id)                              # after calling a core method directly
    sim.alive(node_id), sim.core(node_id), sim.decoder(node_id), sim.node_ids(),
    sim.now_us, sim.rng, sim.key, sim.stats (Counter: datagrams, lost, rejected, ...)

Bounds: `MAX_EVENTS_PER_RUN` guards against a core that re-arms a timer in the past
forever (the kernel then raises `SimError`, a bug in the core).
"""
from __future__ import annotations

import heapq
import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

from llft.protocol import wire
from llft.protocol.messages import MsgType, Pulse, stands_for_copies

MAX_EVENTS_PER_RUN = 5_000_000
TIMER_MIN_STEP_US = 1          # a timer asked for "now or earlier" after firing runs 1 us later

_TIMER = 0
_DGRAM = 1
_CALL = 2
_PULSE = 3
LATE_TIMER_SEQ = 1 << 48       # a resumed node's timers sort after its waiting datagrams
PULSE_REFS = 8                 # a receiver absorbs copies of its source's last 8 datagrams


class SimError(RuntimeError):
    """The simulation itself went wrong (a core that never lets time advance)."""


@dataclass(frozen=True, slots=True)
class NetConfig:
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    delay_us_min: int = 50
    delay_us_max: int = 300
    reorder_us_max: int = 3_000
    mtu_bytes: int = wire.DEFAULT_MTU_BYTES


class _Node:
    __slots__ = ("node_id", "core", "groups", "on_action", "incarnation", "alive",
                 "armed_us", "encoder", "decoder", "paused_until", "pulse", "pulse_gen",
                 "pulse_ref", "pulse_msg", "absorbed")

    def __init__(self, node_id, core, groups, on_action, incarnation, key, mtu_bytes, rng,
                 codec):
        self.node_id = node_id
        self.core = core
        self.groups = set(groups)
        self.on_action = on_action
        self.incarnation = incarnation
        self.alive = True
        self.armed_us: int | None = None
        self.paused_until = 0
        self.encoder = wire.Encoder(key, mtu_bytes=mtu_bytes,
                                    first_frag_id=rng.getrandbits(32), codec=codec)
        self.decoder = wire.make_decoder(key, self.groups, codec=codec)
        # the pulse (messages.Pulse): what this node repeats ([dst, datagrams, every,
        # until], None: nothing) and its generation (a repeat of an older one is void);
        # as a receiver, per source, the datagrams it accepted and copies absorbed since
        self.pulse: list | None = None
        self.pulse_gen = 0
        self.pulse_ref: dict[Hashable, deque[bytes]] = {}
        self.pulse_msg: dict[Hashable, Any] = {}
        self.absorbed: dict[Hashable, list[int]] = {}


class Sim:
    def __init__(self, seed: int | random.Random, net: NetConfig | None = None,
                 *, key: bytes | None = None, codec: str | None = None):
        """`codec`: the nodes' wire codec (wire.CODECS); default "differential" when the
        native half is built (every datagram judged by it and by the reference, the
        first difference raising wire.WireDivergence), else "python"."""
        self.codec = codec or ("differential" if wire.native_available() else "python")
        self.rng = seed if isinstance(seed, random.Random) else random.Random(seed)
        self.net = net or NetConfig()
        self.key = key if key is not None else self.rng.randbytes(wire.KEY_BYTES)
        self.now_us = 0
        self.stats: Counter[str] = Counter()
        self._heap: list[tuple] = []
        self._seq = 0
        self._nodes: dict[Hashable, _Node] = {}
        self._listeners: dict[str, list[_Node]] = {}
        self._component: dict[Hashable, int] = {}   # node -> partition component

    # -- nodes ---------------------------------------------------------------------------
    def add_node(self, node_id: Hashable, core: Any, groups: Iterable[str],
                 on_action: Callable[[Hashable, Any, int], None] | None = None) -> None:
        if node_id in self._nodes:
            raise ValueError(f"node {node_id!r} exists (use restart)")
        self._install(node_id, core, groups, on_action, 0)

    def _install(self, node_id, core, groups, on_action, incarnation) -> None:
        node = _Node(node_id, core, groups, on_action, incarnation, self.key,
                     self.net.mtu_bytes, self.rng, self.codec)
        self._nodes[node_id] = node
        self._rebuild_listeners()
        self.pump(node_id)

    def _rebuild_listeners(self) -> None:
        self._listeners = {}
        for node in self._nodes.values():
            if node.alive:
                for g in node.groups:
                    self._listeners.setdefault(g, []).append(node)

    def crash(self, node_id: Hashable) -> None:
        node = self._nodes[node_id]
        node.alive = False
        self._rebuild_listeners()
        self.stats["crashes"] += 1

    def restart(self, node_id: Hashable, core: Any, groups: Iterable[str] | None = None,
                on_action: Callable | None = None) -> None:
        old = self._nodes[node_id]
        old.alive = False
        self._install(node_id, core, old.groups if groups is None else groups,
                      on_action or old.on_action, old.incarnation + 1)
        self.stats["restarts"] += 1

    def pause(self, node_id: Hashable, until_us: int) -> None:
        """Stop `node_id` until `until_us` (see the module docstring)."""
        node = self._nodes[node_id]
        node.paused_until = max(node.paused_until, until_us)
        self.stats["pauses"] += 1

    def paused(self, node_id: Hashable) -> bool:
        return self._nodes[node_id].paused_until > self.now_us

    def alive(self, node_id: Hashable) -> bool:
        return self._nodes[node_id].alive

    def core(self, node_id: Hashable) -> Any:
        return self._nodes[node_id].core

    def decoder(self, node_id: Hashable) -> wire.Decoder:
        return self._nodes[node_id].decoder

    def node_ids(self) -> list[Hashable]:
        return list(self._nodes)

    # -- faults --------------------------------------------------------------------------
    def set_faults(self, net: NetConfig) -> None:
        self.net = net

    def partition(self, *components: Iterable[Hashable]) -> None:
        """Nodes in different listed sets cannot reach each other; unlisted nodes form one
        more set of their own."""
        self._component = {}
        for i, comp in enumerate(components, start=1):
            for n in comp:
                self._component[n] = i
        self.stats["partitions"] += 1

    def components(self) -> dict:
        """The partition now: node -> the number of its side (unlisted: no side, 0)."""
        return dict(self._component)

    def heal(self) -> None:
        self._component = {}

    def connected(self, a: Hashable, b: Hashable) -> bool:
        """No partition separates `a` and `b` now."""
        return self._component.get(a, 0) == self._component.get(b, 0)

    def inject(self, group: str, datagram: bytes, delay_us: int = 0) -> None:
        for node in self._listeners.get(group, ()):
            self._push(self.now_us + delay_us, _DGRAM, node,
                       (datagram, None, None, self.now_us + delay_us))
        self.stats["injected"] += 1

    def forge(self, msg: Any) -> list[bytes]:
        """`msg` encoded and sealed with a key that is not the cluster's."""
        wrong = bytes(b ^ 0x5A for b in self.key)
        return wire.encode(msg, wrong)

    # -- scheduling ----------------------------------------------------------------------
    def _push(self, at_us: int, kind: int, node: _Node | None, payload: Any) -> None:
        self._seq += 1
        inc = node.incarnation if node is not None else 0
        heapq.heappush(self._heap, (at_us, self._seq, kind, node, inc, payload))

    def at(self, at_us: int, fn: Callable[["Sim"], Any], node_id: Hashable = None) -> None:
        """Call `fn(sim)` at `at_us`; afterwards pump `node_id` (all nodes if None)."""
        node = self._nodes[node_id] if node_id is not None else None
        self._push(max(at_us, self.now_us), _CALL, node, (fn, node_id))

    def pump(self, node_id: Hashable) -> None:
        node = self._nodes[node_id]
        if node.alive:
            self._pump(node)

    def _pump(self, node: _Node) -> None:
        core = node.core
        for action in core.take_actions():
            if isinstance(action, Pulse):
                self._pulse(node, action)
                continue
            dst = getattr(action, "dst_group", None)
            msg = getattr(action, "msg", None)
            if dst is not None and msg is not None:
                self._send(node, dst, msg)
            elif node.on_action is not None:
                node.on_action(node.node_id, action, self.now_us)
        t = core.next_timer_us()
        if t is not None and (node.armed_us is None or t < node.armed_us):
            t = max(t, self.now_us)
            node.armed_us = t
            self._push(t, _TIMER, node, None)

    def _pulse(self, src: _Node, p: Pulse) -> None:
        """Send `p.msg` now and repeat the same bytes every `p.every_us` until
        `p.until_us`, as the runtime's pulse thread does (a newer Pulse replaces it;
        the same bytes still being repeated only move the end: llft_pulse_set)."""
        if p.msg is None:
            src.pulse_gen += 1
            src.pulse = None
            return
        datagrams = src.encoder.encode(p.msg)
        self.stats["sent_msgs"] += 1
        cur = src.pulse
        if cur is not None and cur[:3] == [p.dst_group, datagrams, p.every_us]:
            cur[3] = max(cur[3], p.until_us)
            return
        src.pulse_gen += 1
        src.pulse = [p.dst_group, datagrams, p.every_us, p.until_us]
        self._send_datagrams(src, p.dst_group, datagrams, True)
        self._repeat(src)

    def _repeat(self, src: _Node) -> None:
        _, _, every, until = src.pulse
        if every > 0 and self.now_us + every <= until:
            self._push(self.now_us + every, _PULSE, src, src.pulse_gen)
        else:
            src.pulse = None                # over: the next Pulse starts afresh

    def _send(self, src: _Node, dst_group: str, msg: Any) -> None:
        datagrams = src.encoder.encode(msg)
        self.stats["sent_msgs"] += 1
        # heartbeats travel on the pulse channel: receivers absorb copies of accepted ones
        self._send_datagrams(src, dst_group, datagrams,
                             getattr(msg, "type", None) is MsgType.HEARTBEAT)

    def _send_datagrams(self, src: _Node, dst_group: str, datagrams: list[bytes],
                        pulse: bool) -> None:
        net = self.net
        rng = self.rng
        comp = self._component
        src_comp = comp.get(src.node_id, 0)
        for node in self._listeners.get(dst_group, ()):
            if node is src:
                continue
            if comp and comp.get(node.node_id, 0) != src_comp:
                self.stats["partitioned"] += len(datagrams)
                continue
            for dg in datagrams:
                copies = 2 if (net.dup and rng.random() < net.dup) else 1
                for _ in range(copies):
                    if net.loss and rng.random() < net.loss:
                        self.stats["lost"] += 1
                        continue
                    delay = rng.randint(net.delay_us_min, net.delay_us_max)
                    if net.reorder and rng.random() < net.reorder:
                        delay += rng.randint(0, net.reorder_us_max)
                    data = dg
                    if net.corrupt and rng.random() < net.corrupt:
                        i = rng.randrange(len(dg))
                        data = dg[:i] + bytes([dg[i] ^ (1 + rng.randrange(255))]) + dg[i + 1:]
                        self.stats["corrupted"] += 1
                    self._push(self.now_us + delay, _DGRAM, node,
                               (data, src.node_id,
                                (src.node_id, src.incarnation) if pulse else None,
                                self.now_us + delay))
                    self.stats["datagrams"] += 1

    def _feed_absorbed(self, node: _Node) -> None:
        """Before any event of `node`: the copies its pulse absorbed, with their times."""
        if not node.absorbed:
            return
        absorbed, node.absorbed = node.absorbed, {}
        heard_again = getattr(node.core, "heard_again", None)
        for src_id, times in absorbed.items():
            msg = node.pulse_msg.get(src_id)
            if msg is not None and heard_again is not None:
                heard_again(msg, sorted(times))

    # -- running -------------------------------------------------------------------------
    def run_for(self, duration_us: int) -> int:
        return self.run_until(self.now_us + duration_us)

    def run_until(self, end_us: int) -> int:
        heap = self._heap
        events = 0
        while heap and heap[0][0] <= end_us:
            at_us, _, kind, node, inc, payload = heapq.heappop(heap)
            self.now_us = at_us
            events += 1
            if events > MAX_EVENTS_PER_RUN:
                raise SimError(f"more than {MAX_EVENTS_PER_RUN} events before {end_us} us")
            if node is not None and node.paused_until > at_us and node.incarnation == inc:
                # stopped: its events wait, in their order, for the resumption; a timer
                # after every datagram that waited with it (the runtime's driver reads
                # every socket before a late timer: a proposer paused through a heal
                # hears the primary that went on before its proposal's timer resends)
                self._seq += 1
                seq = self._seq
                if kind == _TIMER:
                    node.armed_us = node.paused_until
                    seq += LATE_TIMER_SEQ
                heapq.heappush(heap, (node.paused_until, seq, kind, node, inc, payload))
                continue
            if kind == _CALL:
                fn, node_id = payload
                if node is not None and node.alive and node.incarnation == inc:
                    self._feed_absorbed(node)
                fn(self)
                if node is not None:
                    if node.alive and node.incarnation == inc:
                        self._pump(node)
                else:
                    for n in list(self._nodes.values()):
                        if n.alive and n.paused_until <= at_us:
                            self._pump(n)
                continue
            if not node.alive or node.incarnation != inc or self._nodes[node.node_id] is not node:
                continue
            if kind == _PULSE:
                if payload == node.pulse_gen and node.pulse is not None:
                    self._send_datagrams(node, node.pulse[0], node.pulse[1], True)
                    self._repeat(node)
                continue
            if kind == _DGRAM:
                # pulse: the sending incarnation (a restarted process has a new pulse
                # socket: a new source), or None off the pulse channel
                data, src_id, pulse, arrived_us = payload
                # (a core that cannot take copies, `heard_again`, gets every one)
                if not hasattr(node.core, "heard_again"):
                    pulse = None
                comp = self._component
                if comp and src_id is not None and \
                        comp.get(src_id, 0) != comp.get(node.node_id, 0):
                    self.stats["partitioned"] += 1      # cut while in flight
                    continue
                if pulse and data in node.pulse_ref.get(pulse, ()):
                    # absorbed: only its (kernel) arrival time is kept, for the next event
                    node.absorbed.setdefault(pulse, []).append(arrived_us)
                    self.stats["absorbed"] += 1
                    continue
                self._feed_absorbed(node)
                rejected = node.decoder.rejected_total()
                msg = node.decoder.decode(data, at_us)
                if pulse and node.decoder.rejected_total() == rejected \
                        and stands_for_copies(msg, node.pulse_msg.get(pulse)):
                    node.pulse_ref.setdefault(pulse, deque(maxlen=PULSE_REFS)).append(data)
                    if msg is not None:
                        node.pulse_msg[pulse] = msg
                if msg is None:
                    self.stats["rejected"] += 1
                    continue
                # at its (kernel) arrival time, as the runtime hands it over (SO_TIMESTAMPNS,
                # llft/runtime/transport.py): the same but for a node that was paused, which
                # handles what queued meanwhile when it wakes (the cores keep their clocks
                # monotonic; what they stamp with it -- a remote primary last heard -- is
                # then when it came: replica_paused_member_stamps_queued_words_as_fresh)
                node.core.handle_message(msg, arrived_us)
                self._pump(node)
                continue
            # _TIMER (input first, as the runtime's driver does: a timer judges silence)
            self._feed_absorbed(node)
            if node.armed_us == at_us:
                node.armed_us = None
            t = node.core.next_timer_us()
            if t is not None and t <= at_us:
                node.core.handle_timer(at_us)
                t2 = node.core.next_timer_us()
                if t2 is not None and t2 <= at_us:
                    # the core did not move its deadline: run it again a step later
                    node.armed_us = at_us + TIMER_MIN_STEP_US
                    self._push(node.armed_us, _TIMER, node, None)
            self._pump(node)
        self.now_us = max(self.now_us, end_us)
        return events
