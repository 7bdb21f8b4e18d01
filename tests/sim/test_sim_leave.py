"""A primary stopping for good says LEAVE (`llft run` at SIGTERM, once its backups hold its
order info): its senior backup proposes at once, without its detector's wait and without
evidence from remote groups, and the group's other backup follows; nobody is reset.
A backup stopping for good says LEAVE too: its primary removes it at once, without
waiting out its timeout on it (floor + cap for one still replaying its history).
Whole replicas in the simulator (simulated time only). The campaigns run it too:
`llft simulate replica --leave 0.7`."""
from __future__ import annotations

import random

from llft.replica import actions
from llft.replica.node import ReplicaNode
from llft.sim.kernel import Sim
from membership import core as mb

MS = 1000


def group_of_three(seed: int) -> tuple[Sim, dict[str, ReplicaNode], list]:
    sim = Sim(seed)
    nodes = {n: ReplicaNode("g", random.Random(seed * 10 + i)) for i, n in enumerate("ABC")}
    changes: list = []
    for i, (name, node) in enumerate(nodes.items()):
        node.start(sim.now_us)
        sim.add_node(name, node, ["g"], on_action=lambda nid, a, now: changes.append(
            (nid, now, a)) if isinstance(a, (actions.MembershipChanged, actions.RestartApp))
            else None)
        sim.run_for(300 * MS)
    assert [n.membership.status for n in nodes.values()] == [
        mb.Status.PRIMARY, mb.Status.BACKUP, mb.Status.BACKUP]
    return sim, nodes, changes


def views_since(changes, since_us: int, why: str):
    """The membership changes since `since_us` whose reason starts with `why`."""
    return [(nid, now, a) for nid, now, a in changes
            if now >= since_us and isinstance(a, actions.MembershipChanged)
            and a.reason.startswith(why)]


def took_over(changes, since_us: int):
    return views_since(changes, since_us, "took over")


def test_a_primary_that_leaves_is_replaced_at_once_by_its_senior_backup():
    sim, nodes, changes = group_of_three(3)
    a, b, c = nodes["A"], nodes["B"], nodes["C"]
    senior = b if b.membership.rank == 2 else c
    t0 = sim.now_us
    assert a.leave(t0)
    sim.pump("A")
    sim.crash("A")
    sim.run_for(500 * MS)
    takeovers = took_over(changes, t0)
    assert len(takeovers) == 1, takeovers
    nid, at_us, change = takeovers[0]
    assert nodes[nid] is senior and "left" in change.reason, change.reason
    floor_us = senior.membership.cfg.timeout_base_us
    assert at_us - t0 < floor_us // 5, (at_us - t0, floor_us)
    assert b.membership.pvn == c.membership.pvn == a.membership.pvn + 1
    assert not [x for x in changes if x[1] >= t0 and isinstance(x[2], actions.RestartApp)]


def test_a_crashed_primary_is_replaced_after_the_detector_as_before():
    """The same group, the primary crashed without a word: the detector's floor first."""
    sim, nodes, changes = group_of_three(3)
    t0 = sim.now_us
    sim.crash("A")
    sim.run_for(500 * MS)
    (nid, at_us, change), = took_over(changes, t0)
    assert "silent" in change.reason
    cfg = nodes[nid].membership.cfg
    # (measured from the last heartbeat heard, at most an interval before the crash)
    assert at_us - t0 >= cfg.timeout_base_us - cfg.heartbeat_interval_us, (at_us - t0)


def test_a_backup_that_leaves_is_removed_at_once_even_while_replaying():
    sim, nodes, changes = group_of_three(3)
    a = nodes["A"]
    junior = next(n for n, node in nodes.items() if node.membership.rank == 3)
    nodes[junior].set_catching_up(True)       # its primary would wait floor + cap on it
    sim.run_for(50 * MS)
    assert a.membership.backups_replaying() == {nodes[junior].birth}
    t0 = sim.now_us
    assert nodes[junior].leave(t0)
    sim.pump(junior)
    sim.crash(junior)
    sim.run_for(500 * MS)
    (nid, at_us, change), = views_since(changes, t0, "removed")[:1]
    assert nid == "A" and "left" in change.reason, change.reason
    assert at_us - t0 < a.membership.cfg.heartbeat_interval_us, (at_us - t0)
    assert len(a.membership.members) == 2 and nodes[junior].birth not in {
        k.birth for k in a.membership.members}
    assert not [x for x in changes if x[1] >= t0 and isinstance(x[2], actions.RestartApp)]


def test_a_crashed_replaying_backup_is_removed_after_floor_plus_cap():
    """The same backup crashed without a word: its primary waits floor + cap on it."""
    sim, nodes, changes = group_of_three(3)
    a = nodes["A"]
    junior = next(n for n, node in nodes.items() if node.membership.rank == 3)
    nodes[junior].set_catching_up(True)
    sim.run_for(50 * MS)
    t0 = sim.now_us
    sim.crash(junior)
    sim.run_for(500 * MS)
    (nid, at_us, change), = views_since(changes, t0, "removed")[:1]
    assert nid == "A" and "silent" in change.reason, change.reason
    cfg = a.membership.cfg
    assert at_us - t0 >= cfg.backup_timeout_us + cfg.extension_cap_us - cfg.heartbeat_interval_us
