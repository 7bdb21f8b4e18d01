"""Heartbeats repeated by the driver and absorbed by the receivers (messages.Pulse,
llft/runtime/pulse.py), on whole replicas in the simulator, whose kernel repeats a Pulse
and absorbs byte-identical copies as the runtime's native thread does.

What a quiet group must show: its members' cores are woken far less often than once per
heartbeat (the cost of an idle agent is its wake-ups), yet a crashed primary is replaced
as soon as before, and a live one is never suspected. Counts are of simulated events:
they do not depend on the machine."""
from __future__ import annotations

import dataclasses
import random

from llft.protocol.messages import Pulse
from llft.protocol.messaging import MessagingConfig
from llft.replica.node import ReplicaNode
from llft.sim.kernel import Sim
from membership import core as mb

MS = 1000


class Counted:
    """A replica whose core calls (events that wake a runtime's loop) are counted."""

    def __init__(self, node: ReplicaNode):
        self.node = node
        self.events = 0
        self.pulses: list[Pulse] = []

    def handle_message(self, msg, now_us):
        self.events += 1
        self.node.handle_message(msg, now_us)

    def handle_timer(self, now_us):
        self.events += 1
        self.node.handle_timer(now_us)

    def heard_again(self, msg, times_us):
        self.node.heard_again(msg, times_us)     # runs with the next event: no wake-up

    def take_actions(self):
        out = self.node.take_actions()
        self.pulses += [a for a in out if isinstance(a, Pulse)]
        return out

    def __getattr__(self, name):
        return getattr(self.node, name)


def quiet_group(pulse_intervals: int, seed: int = 7, n: int = 3) -> tuple[Sim, list[Counted]]:
    sim = Sim(seed)
    mcfg = dataclasses.replace(MessagingConfig(), heartbeat_us=20_000,
                               pulse_intervals=pulse_intervals)
    bcfg = mb.Config(group="g", heartbeat_interval_us=20_000, timeout_base_us=100_000)
    nodes = []
    for i in range(n):
        node = Counted(ReplicaNode("g", random.Random(seed * 10 + i), membership_config=bcfg,
                                   messaging_config=mcfg))
        node.start(sim.now_us)
        sim.add_node(i, node, ["g"])
        nodes.append(node)
        sim.run_for(1_500 * MS)
    sim.run_for(3_000 * MS)
    primary = nodes[0].membership
    assert primary.status is mb.Status.PRIMARY and len(primary.members) == n
    assert all(x.membership.pvn == primary.pvn for x in nodes)
    return sim, nodes


def events_per_s(sim: Sim, nodes: list[Counted], window_us: int) -> list[float]:
    before = [x.events for x in nodes]
    sim.run_for(window_us)
    return [(x.events - b) * 1e6 / window_us for x, b in zip(nodes, before)]


def test_a_quiet_group_wakes_its_members_a_fraction_as_often():
    sim1, every = quiet_group(1)
    sim5, pulsed = quiet_group(5)
    base = events_per_s(sim1, every, 2_000 * MS)
    now = events_per_s(sim5, pulsed, 2_000 * MS)
    # a new heartbeat every 20 ms, one from each of two peers: ~100 events a second
    assert min(base) > 80
    # refreshes every 100 ms, and the detectors' deadlines (the copies in between are
    # absorbed, and handed in with the next event)
    assert max(now) <= 0.2 * min(base), (base, now)
    assert sim5.stats["absorbed"] > 0
    # nobody was suspected on the way: one view, nobody reset
    assert all(x.membership.resets == 0 for x in pulsed)
    assert len({x.membership.pvn for x in pulsed}) == 1


def test_at_the_defaults_a_quiet_member_wakes_about_once_a_second():
    """The defaults refresh a quiet member's Pulse once a second (its lease keeps the
    copies going while its loop lives: messages.Pulse). Its detectors' deadlines move
    with the copies absorbed (the kernel hands them in before a timer, and a deadline
    they moved runs no core: the runtime's silence watches, llft/runtime/pulse.py), so
    while the peers live nothing else wakes it."""
    k = MessagingConfig().pulse_intervals
    assert k == mb.Config(group="g").pulse_intervals and k * 20 * MS >= 500 * MS
    sim, nodes = quiet_group(k)
    now = events_per_s(sim, nodes, 5_000 * MS)
    assert max(now) <= 2 * 1e6 / (k * 20 * MS), now
    assert all(x.membership.resets == 0 for x in nodes)
    assert len({x.membership.pvn for x in nodes}) == 1


def takeover_us(pulse_intervals: int, seed: int) -> int:
    sim, nodes = quiet_group(pulse_intervals, seed)
    pvn = nodes[1].membership.pvn
    crash_at = sim.now_us + 7 * MS         # somewhere between two refreshes
    sim.run_until(crash_at)
    sim.crash(0)
    while nodes[1].membership.status is not mb.Status.PRIMARY:
        assert sim.now_us - crash_at < 2_000 * MS, "no takeover"
        sim.run_for(1 * MS)
    assert nodes[1].membership.pvn > pvn
    return sim.now_us - crash_at


def test_a_crashed_primary_of_a_quiet_group_is_replaced_as_soon_as_before():
    for seed in (3, 4, 5):
        base = takeover_us(1, seed)
        now = max(takeover_us(5, seed), takeover_us(MessagingConfig().pulse_intervals, seed))
        # the detector fires at the base timeout after the last copy heard, as before
        # (copies stop with the process): within a heartbeat and a few ms of the base
        assert now <= base + 25 * MS, (seed, base, now)
        assert now < 200 * MS, (seed, now)


def test_a_reset_replica_stops_its_old_incarnations_pulse_at_once():
    sim, nodes = quiet_group(3)
    births = [x.membership.birth for x in nodes]
    sim.partition([0, 1], [2])
    sim.run_for(600 * MS)       # 2 is removed; alone (no remote group to ask) it takes over
    sim.heal()
    sim.run_for(3_000 * MS)     # one branch wins; the other side's replicas reset, rejoin
    reset = [(x, b) for x, b in zip(nodes, births) if x.membership.resets]
    assert reset
    for x, old in reset:
        assert x.membership.birth != old
        # its Pulses: the old birth's, then a stop, then only the new birth's
        i = next(i for i, p in enumerate(x.pulses) if p.msg is None)
        assert i > 0 and all(p.msg.sender == old for p in x.pulses[:i])
        assert all(p.msg is None or p.msg.sender != old for p in x.pulses[i:])
    sizes = {len(x.membership.members) for x in nodes}
    assert sizes == {3} and len({x.membership.pvn for x in nodes}) == 1
