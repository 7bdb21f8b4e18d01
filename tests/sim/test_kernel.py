"""The simulator kernel's own semantics (llft/sim/kernel.py) that the campaigns rely on."""
from __future__ import annotations

from llft.protocol.messages import Message, MsgType, Role, Send
from llft.sim.kernel import Sim

G = "k"


class Toy:
    """A core that sends one message at `send_at_us` (node "a") or records what it
    handles, in order (node "b", whose timer is due at `timer_us`)."""

    def __init__(self, birth: int, send_at_us: int | None = None,
                 timer_us: int | None = None):
        self.birth, self.send_at_us, self.timer_us = birth, send_at_us, timer_us
        self.log: list[tuple[str, int]] = []
        self._out: list = []

    def take_actions(self) -> list:
        out, self._out = self._out, []
        return out

    def next_timer_us(self) -> int | None:
        return self.send_at_us if self.send_at_us is not None else self.timer_us

    def handle_timer(self, now_us: int) -> None:
        if self.send_at_us is not None and now_us >= self.send_at_us:
            self.send_at_us = None
            msg = Message(type=MsgType.HEARTBEAT, src_group=G, dst_group=G, conn_seq=0,
                          role=Role.CLIENT, pvn=1, precedence=1, sender=self.birth,
                          body={"rank": 1, "served": 0, "lineage": 1, "change": 0,
                                "wait": 0, "replay": 0, "rm": 0, "done": 0})
            self._out.append(Send(G, msg))
        elif self.timer_us is not None and now_us >= self.timer_us:
            self.timer_us = None
            self.log.append(("timer", now_us))

    def handle_message(self, msg: Message, now_us: int) -> None:
        if msg.sender != self.birth:
            self.log.append(("message", now_us))


def test_a_resumed_node_reads_what_waited_before_its_late_timer():
    # b's timer falls due during its pause, before a's message arrives: when b resumes,
    # the message is handled first, as the runtime's driver reads every socket before a
    # late timer (a timer judges silence; the simulator once ran it on stale input).
    # The message is handed over with its arrival time, as the runtime's kernel
    # timestamps give it (what a core stamps with it -- a remote primary last heard --
    # is then when it came, not when the node woke)
    sim = Sim(1)
    b = Toy(2, timer_us=10_000)
    sim.add_node("a", Toy(1, send_at_us=20_000), [G])
    sim.add_node("b", b, [G])
    sim.pause("b", 50_000)
    sim.run_until(100_000)
    [(kind, came), timer] = b.log
    assert kind == "message" and 20_000 < came < 21_000 and timer == ("timer", 50_000)


def test_an_unpaused_node_handles_events_in_time_order():
    sim = Sim(1)
    b = Toy(2, timer_us=10_000)
    sim.add_node("a", Toy(1, send_at_us=20_000), [G])
    sim.add_node("b", b, [G])
    sim.run_until(100_000)
    assert [kind for kind, _ in b.log] == ["timer", "message"]
    assert b.log[0][1] == 10_000 and 20_000 < b.log[1][1] < 21_000
