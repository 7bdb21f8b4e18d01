"""`Outbox` (llft/runtime/outbox.py): when framed output goes to messaging.

The rule the agents and the gateway rely on: output put on an idle connection goes at
once; output put while something is in flight (a backup's output: always, see
`Agent._output_in_flight`) waits for the end of the loop turn, so that the puts of one
turn reach messaging in one call; output messaging does not take yet waits for the
driver's progress; producers wait above the high-water mark."""
from __future__ import annotations

import asyncio

from llft.runtime import outbox as ob


class Driver:
    def __init__(self):
        self.progress = asyncio.Event()


class Messaging:
    """Takes up to `room` bytes a call; records each call."""

    def __init__(self, room: int = 1 << 30):
        self.room = room
        self.calls: list[bytes] = []

    def send(self, view: memoryview) -> int:
        n = min(len(view), self.room)
        if n:
            self.calls.append(bytes(view[:n]))
        self.room -= n
        return n


def run(coro):
    return asyncio.run(coro)


def outbox(room: int = 1 << 30, **kw) -> tuple[Messaging, Driver, ob.Outbox]:
    m, d = Messaging(room), Driver()
    return m, d, ob.Outbox(d, m.send, **kw)


async def progress(d: Driver, m: Messaging, room: int) -> None:
    """Messaging has room for `room` bytes again and the driver pumped (after the
    outbox's waiter began waiting), then the waiter's turns."""
    await asyncio.sleep(0)                      # the waiter starts waiting
    m.room = room
    d.progress.set()
    for _ in range(3):
        await asyncio.sleep(0)


def test_an_idle_connection_pushes_each_put_at_once():
    async def main():
        m, _, box = outbox()
        box.put(b"a")
        assert m.calls == [b"a"]
        box.put(b"b")
        assert m.calls == [b"a", b"b"]
    run(main())


def test_output_while_in_flight_goes_in_one_call_at_the_end_of_the_turn():
    async def main():
        m, _, box = outbox(in_flight=lambda: 1)     # a backup's rule
        for part in (b"a", b"b", b"c"):
            box.put(part)
        assert m.calls == []                    # nothing within the turn
        await asyncio.sleep(0)                  # the turn ends
        assert m.calls == [b"abc"] and box.empty
    run(main())


def test_output_messaging_does_not_take_waits_for_progress():
    async def main():
        m, d, box = outbox(room=2)
        box.put(b"abcd")
        assert m.calls == [b"ab"] and not box.empty
        await progress(d, m, 10)
        assert m.calls == [b"ab", b"cd"] and box.empty and box.waits == 1
    run(main())


def test_producers_wait_above_the_high_water_mark_until_below_the_low():
    async def main():
        m, d, box = outbox(room=0)
        box.put(b"x" * ob.HIGH_BYTES)
        assert not box.has_room
        await progress(d, m, ob.HIGH_BYTES - ob.LOW_BYTES + 1)  # leaves LOW_BYTES - 1
        await asyncio.wait_for(box.room(), 1)
        assert box.has_room and len(box.buf) == ob.LOW_BYTES - 1
        box.close()
    run(main())


def test_finish_calls_back_once_every_byte_went_out():
    async def main():
        m, d, box = outbox(room=1)
        done = []
        box.put(b"ab")
        box.finish(lambda: done.append(True))
        assert done == []
        await progress(d, m, 10)
        assert done == [True] and m.calls == [b"a", b"b"]
    run(main())


def test_an_agent_takes_a_backups_output_as_in_flight_and_asks_messaging_at_a_primary():
    """The rule a backup's outbox follows (`Agent._output_in_flight`): its output only
    goes to its log, so it always waits for the end of the turn."""
    from types import SimpleNamespace
    from llft.runtime.agent import Agent, AppMode

    node = SimpleNamespace(in_flight=lambda cid: 0)
    for mode in AppMode:
        agent = SimpleNamespace(mode=mode, node=node)
        expect = 0 if mode is AppMode.PRIMARY else 1
        assert Agent._output_in_flight(agent, ("g", 1, 0)) == expect, mode
