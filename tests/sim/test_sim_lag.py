"""Bounded backup lag and the group log's cap (docs/LOG.md), on whole replicas in the
simulator: a backup's executed position reaches the primary on its ORDER_INFO acks, the
primary holds (backpressure) while a ready backup is beyond the bound, releases one that
stays beyond it (no longer held for, not removed), and a group whose log reached its cap admits no new replica."""
from __future__ import annotations

import random

from llft.replica import actions
from llft.replica.node import LAG_BOUND_US, LAG_GIVE_UP_US, ReplicaNode
from llft.sim.kernel import Sim
from membership import core as mb

MS = 1000


class Group:
    """Two replicas of group "g" in a simulator; B's "application" executes the order
    info it is given while `executing` (the test's stand-in for the shim's progress)."""

    def __init__(self, seed: int, **node_kw):
        self.sim = Sim(seed)
        self.node_kw = node_kw
        self.executing = True
        self.given: list[tuple[int, int]] = []     # B: (pvn, pos) delivered, in order
        self.a = self._node(1)
        self.a.start(0)
        self.sim.add_node("A", self.a, ["g"])
        self.sim.run_for(2_000 * MS)
        assert self.a.status is mb.Status.PRIMARY
        self.b = None
        self.b_actions: list = []

    def _node(self, n: int) -> ReplicaNode:
        return ReplicaNode("g", random.Random(n), **self.node_kw)

    def add_b(self) -> None:
        self.b = self._node(2)
        self.b.start(self.sim.now_us)
        self.sim.add_node("B", self.b, ["g"], on_action=self._b_action)

    def _b_action(self, node_id, a, now_us) -> None:
        self.b_actions.append(a)
        if isinstance(a, actions.RestartApp):
            self.given.clear()
        elif isinstance(a, (actions.OrderInfo, actions.ViewSwitch)):
            self.given.append((a.pvn, a.pos))
        elif isinstance(a, actions.Restored):
            self.given.extend((p, q) for p, q, _ in a.order_info)

    def tick(self, sim) -> None:
        """Every 10 ms: A's app makes an entry; B's app executes what it was given."""
        if self.a.status is mb.Status.PRIMARY:
            self.a.add_order_info(b"e" * 40, sim.now_us)
        if self.b is not None and self.executing and self.given:
            pvn, pos = self.given[-1]
            self.b.set_executed(pvn, pos)
        self.hold = self.a.lag_hold(sim.now_us)
        self.holds.append(self.hold)

    def run(self, duration_us: int) -> None:
        self.holds: list[bool] = []
        end = self.sim.now_us + duration_us
        t = self.sim.now_us
        while t < end:
            t += 10 * MS
            self.sim.at(t, self.tick, "A")
        self.sim.run_until(end)

    def lag(self) -> dict:
        return self.a.backup_lag(self.sim.now_us).get(self.b.birth)


def test_a_backup_that_keeps_up_is_ready_and_never_holds_the_primary():
    g = Group(1)
    g.add_b()
    g.run(3_000 * MS)
    lag = g.lag()
    assert lag["ready"] and lag["ms"] < LAG_BOUND_US / 1000
    assert not any(g.holds[-100:])
    assert g.b.messaging.order_info.executed > 0


def test_a_stopped_backup_holds_the_primary_until_it_catches_up():
    g = Group(2)
    g.add_b()
    g.run(2_000 * MS)
    assert g.lag()["ready"]
    g.executing = False
    g.run(3_000 * MS)
    assert g.hold and g.lag()["ms"] > LAG_BOUND_US / 1000
    # not before the bound: ~1 s of ticks pass before the first hold
    assert not any(g.holds[:int(LAG_BOUND_US / 10 / MS) - 5])
    assert g.a.lag_held_for == (g.b.birth,)
    g.executing = True
    g.run(500 * MS)
    assert not g.hold and g.lag()["entries"] <= 2 and g.a.lag_held_for == ()
    assert len(g.a.membership.members) == 2


def test_a_backup_beyond_the_bound_for_the_give_up_time_is_released_not_removed():
    g = Group(3)
    g.add_b()
    g.run(2_000 * MS)
    g.executing = False
    slow = g.b.birth
    g.run(LAG_BOUND_US + LAG_GIVE_UP_US + 500 * MS)
    assert g.a.stats.get("lag_released") == 1 and g.a.last_lag_release[0] == slow
    assert not g.hold and not g.lag()["ready"]      # the group runs on
    assert slow in [k.birth for k in g.a.membership.members]   # a busy peer stays
    assert not any(g.holds[-40:])             # not held for since (the last 400 ms)
    # back within the bound for the give-up time, it is ready (held for) again
    g.executing = True
    g.run(LAG_GIVE_UP_US // 2)
    assert not g.lag()["ready"]
    g.run(LAG_GIVE_UP_US // 2 + 500 * MS)
    assert g.lag()["ready"] and g.b.birth == slow


def test_a_joiner_replaying_its_history_is_not_held_for():
    """B joins a group with history but executes nothing: not ready, so no hold."""
    g = Group(4)
    g.run(1_000 * MS)
    g.executing = False
    g.add_b()
    g.run(3_000 * MS)
    lag = g.lag()
    assert lag is not None and not lag["ready"] and lag["entries"] > 0
    assert not any(g.holds)


def test_a_hold_names_the_backup_it_is_for_not_a_joiner_further_behind():
    """A joiner C that executes nothing is further behind than B, a ready backup that
    stopped; the primary holds for B alone, and says so (`lag_held_for`: the agent's
    log line names it; it named the replica furthest behind, here the joiner)."""
    g = Group(5)
    g.run(500 * MS)
    c = g._node(3)
    c.start(g.sim.now_us)
    g.sim.add_node("C", c, ["g"])              # its "application" executes nothing
    g.run(500 * MS)
    g.add_b()
    g.run(1_000 * MS)
    assert g.lag()["ready"] and g.a.backup_lag(g.sim.now_us)[c.birth]["ready"] is False
    g.executing = False
    g.run(1_500 * MS)
    lags = g.a.backup_lag(g.sim.now_us)
    assert g.hold and lags[c.birth]["ms"] > lags[g.b.birth]["ms"] > LAG_BOUND_US / 1000
    assert g.a.lag_held_for == (g.b.birth,)


def test_a_group_whose_log_reached_its_cap_admits_no_new_replica():
    g = Group(5, log_cap_entries=50)
    g.run(1_000 * MS)                    # ~100 entries: beyond the cap
    assert g.a.log_full and "cap" in g.a.log_full
    assert g.a.join_refusal().startswith(g.a.log_full) and len(g.a.order_info_log) == 0
    assert g.a.checkpoint() is None
    g.add_b()
    g.run(3_000 * MS)
    assert [k.birth for k in g.a.membership.members] == [g.a.birth]
    assert g.b.status is not mb.Status.BACKUP
    # the applicant is told why, once, so that its runtime stops with that line
    refused = [a for a in g.b_actions if isinstance(a, actions.JoinRefused)]
    assert [(a.primary, a.why) for a in refused] == [(g.a.birth, g.a.join_refusal())]
    assert g.a.status_snapshot()["log"]["full"] == g.a.log_full


def test_a_new_primary_does_not_hold_for_a_backup_still_replaying_its_history():
    """A takes entries, B keeps up, C joins and replays (executes nothing); A dies and B
    takes over. B's view starts its positions at 1, and C executes none of them before it
    has replayed the last view's history: B must not hold its application for C. (A chaos
    campaign, fault 11 of `llft chaos --workload http --seed 11`: the new primary took C as
    caught up from position 0 and held its clients 8 s until the give-up.)"""
    sim = Sim(6)
    given: dict[str, list[tuple[int, int]]] = {"A": [], "B": [], "C": []}

    def on_action(node_id, a, now_us) -> None:
        if isinstance(a, actions.RestartApp):
            given[node_id].clear()
        elif isinstance(a, (actions.OrderInfo, actions.ViewSwitch)):
            given[node_id].append((a.pvn, a.pos))
        elif isinstance(a, actions.Restored):
            given[node_id].extend((p, q) for p, q, _ in a.order_info)

    nodes = {name: ReplicaNode("g", random.Random(i + 1)) for i, name in enumerate("ABC")}
    executing = {"B": True, "C": False}
    holds: list[bool] = []
    crashed: set[str] = set()

    def tick(sim) -> None:
        for name, node in nodes.items():
            if name in crashed:
                continue
            if node.status is mb.Status.PRIMARY:
                node.add_order_info(b"e" * 40, sim.now_us)
                holds.append(node.lag_hold(sim.now_us))
            elif name in executing and executing[name] and given[name]:
                node.set_executed(*given[name][-1])

    def run(duration_us: int) -> None:
        end, t = sim.now_us + duration_us, sim.now_us
        while t < end:
            t += 10 * MS
            sim.at(t, tick, "A")
        sim.run_until(end)

    def start(name: str) -> None:
        nodes[name].start(sim.now_us)
        sim.add_node(name, nodes[name], ["g"], on_action=on_action)

    start("A")
    sim.run_for(2_000 * MS)
    start("B")
    run(1_000 * MS)
    start("C")
    run(1_000 * MS)
    a, b, c = (nodes[n] for n in "ABC")
    assert [k.birth for k in a.membership.members] == [a.birth, b.birth, c.birth]
    assert a.backup_lag(sim.now_us)[b.birth]["ready"]
    assert not a.backup_lag(sim.now_us)[c.birth]["ready"]
    sim.crash("A")
    crashed.add("A")
    holds.clear()
    run(LAG_BOUND_US + 2_000 * MS)
    assert b.status is mb.Status.PRIMARY
    assert [k.birth for k in b.membership.members] == [b.birth, c.birth]
    lag = b.backup_lag(sim.now_us)[c.birth]
    assert lag["entries"] > 0 and lag["ms"] > LAG_BOUND_US / 1000 and not lag["ready"]
    assert not any(holds)
    # its replay done, C executes B's positions: ready, held for from then on
    executing["C"] = True
    run(500 * MS)
    assert b.backup_lag(sim.now_us)[c.birth]["ready"]
