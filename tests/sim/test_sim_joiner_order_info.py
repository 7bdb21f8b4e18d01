"""Order info before the state (llft/replica/node.py): a joiner whose state is on its way
keeps the order info its primary sends the backups and acknowledges it (JOINER_OI_ACK),
so the primary's output commit does not wait for the whole transfer; restored, the joiner
delivers what it kept past its checkpoint, every position once and in order.

Whole replicas in the simulator: A primary making order info all along (1 KB a
millisecond, beyond a piggyback's 16 KB in 16 ms), B its backup, then C joins with a
24 MB state (its transfer takes tens of milliseconds of simulated time). Counts in
simulated time only."""
from __future__ import annotations

import random

from llft.replica import actions
from llft.replica.node import ReplicaNode
from llft.sim.kernel import Sim
from membership import core as mb

MS = 1000
STATE_BYTES = 24 << 20


class BigState:
    """The application's part of a checkpoint: large, so the transfer takes a while."""
    def checkpoint(self) -> bytes:
        return bytes(STATE_BYTES)

    def restore(self, data: bytes) -> None:
        assert len(data) == STATE_BYTES


def test_a_joiner_acknowledges_order_info_while_its_state_comes():
    sim = Sim(7)
    nodes = {n: ReplicaNode("g", random.Random(i), app_state=BigState())
             for i, n in enumerate("ABC")}
    got: dict[str, list] = {"C": []}

    def c_action(node_id, a, now_us) -> None:
        if isinstance(a, actions.Restored):
            got["C"].append(("restored", dict(a.log_upto)))
        elif isinstance(a, (actions.OrderInfo, actions.ViewSwitch)):
            got["C"].append((a.pvn, a.pos))

    a, b, c = nodes["A"], nodes["B"], nodes["C"]
    a.start(0)
    sim.add_node("A", a, ["g"])
    sim.run_for(300 * MS)
    b.start(sim.now_us)
    sim.add_node("B", b, ["g"])
    sim.run_for(300 * MS)
    assert a.membership.status is mb.Status.PRIMARY and b.membership.status is mb.Status.BACKUP

    def tick(_sim) -> None:
        if a.membership.status is mb.Status.PRIMARY:
            a.add_order_info(b"e" * 1000, sim.now_us)
        if c.membership.status is mb.Status.AWAITING_STATE:
            samples.append(a.output_commit_holds())

    samples: list[bool] = []
    end = sim.now_us + 1_500 * MS
    for t in range(sim.now_us + MS, end, MS):
        sim.at(t, tick, "A")
    sim.run_for(200 * MS)
    c.start(sim.now_us)
    sim.add_node("C", c, ["g"], on_action=c_action)
    sim.run_until(end)

    assert c.membership.status is mb.Status.BACKUP and c.live
    assert len(samples) > 20, "the transfer took too little simulated time to show anything"
    held = sum(samples)
    # before: held from ~16 ms after the admission until the transfer ended (every sample
    # but the first few); now only while an acknowledgment is on its way
    assert held < len(samples) // 4, (held, len(samples))
    assert c.stats.get("early_oi_delivered", 0) > 0
    assert a.messaging.stats.get("joiner_oi_acks", 0) > 0
    # C's application got every position once, in order, from the end of its state on
    (_, upto), *rest = got["C"]
    pvn = a.messaging.pvn
    assert [p for p in rest] == [(pvn, q) for q in range(upto[pvn] + 1, upto[pvn] + 1 + len(rest))]
    assert upto[pvn] + len(rest) == c.messaging.order_info.delivered
    assert c.messaging.order_info.delivered >= a.messaging.order_info.last_pos - 50
