"""The heartbeat channel (llft/runtime/pulse.py) between two real endpoints on loopback
multicast: a Pulse is repeated by the native thread, the receiver's thread absorbs the
byte-identical copies of what its loop authenticated and keeps their arrival times,
anything else (a new heartbeat, a forgery) goes to the loop, and nothing forged is ever
delivered or absorbed. Waiting is on conditions with deadlines; the one fixed wait is
the observation window of "no more copies are sent" after a stop.
"""
import asyncio
import contextlib
import os
import random
import time

import pytest

from llft.protocol.messages import Message, MsgType, Role
from llft.protocol.wire import Reject, encode
from llft.runtime import pulse
from llft.runtime.pulse import native_available
from llft.runtime.transport import Endpoint, GroupAddress, GroupMap, pulse_address

KEY = os.urandom(32)
pytestmark = pytest.mark.timeout(60)
MS = 1000


def group_map() -> GroupMap:
    r = random.SystemRandom()
    addr = GroupAddress(f"239.{r.choice([100, 102, 104])}.{r.randint(0, 255)}."
                        f"{r.randint(1, 254)}", r.randrange(20000, 60000, 2))
    return GroupMap({"g": addr})


def heartbeat(sender: int, ts: int) -> Message:
    return Message(MsgType.HEARTBEAT, "g", "g", 0, Role.CLIENT, pvn=1, precedence=1,
                   sender=sender, ts=ts, body={"rank": 2, "served": 0, "lineage": 1,
                                               "change": 1, "wait": 0, "replay": 0, "rm": 0, "done": 0})


def now_us() -> int:
    return time.monotonic_ns() // 1000


async def until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)      # polling a condition, bounded by the deadline
    return True


@contextlib.asynccontextmanager
async def sender_and_receiver(got: list[Message]):
    """Members 1 (the sender) and 2 (its loop appends what it gets to `got`) of a new group
    on loopback multicast, each with the native pulse thread: (groups, 1, 2)."""
    gm = group_map()
    async with Endpoint(KEY, "g", lambda m: None, groups=gm, pulse=True, birth_id=1) as a, \
            Endpoint(KEY, "g", got.append, groups=gm, pulse=True, birth_id=2) as b:
        yield gm, a, b


@pytest.mark.skipif(not native_available(), reason="native pulse module not built")
def test_copies_are_absorbed_with_their_times_and_forgeries_never_count():
    async def main():
        got: list[Message] = []
        async with sender_and_receiver(got) as (gm, a, b):
            t0 = now_us()
            hb = heartbeat(1, 5)
            a.pulse("g", hb, 5 * MS, t0 + 60_000_000)
            assert await until(lambda: got), "the first heartbeat never reached the loop"
            assert got[0] == hb
            absorbed: list[tuple[Message, list[int]]] = []

            def copies() -> list[tuple[Message, list[int]]]:
                absorbed.extend(b.take_absorbed())
                return absorbed
            assert await until(lambda: sum(len(t) for _, t in copies()) >= 5)
            times = [t for m, ts in absorbed for t in ts]
            assert all(m == hb for m, _ in absorbed)
            assert times == sorted(times) and t0 <= times[0] and times[-1] <= now_us()
            # only copies sent before its loop accepted the first reach the loop
            assert len(got) <= 3 and b.stats()["pulse_absorbed"] >= 5
            # a forgery of the same heartbeat (another key) is refused every time
            paddr = pulse_address(gm.address("g"))
            forged = encode(heartbeat(1, 6), bytes(x ^ 0x5A for x in KEY))[0]
            for _ in range(3):
                a._pulse.ssock.sendto(forged, (paddr.mcast_addr, paddr.port))
            assert await until(lambda: b.rejections[Reject.BAD_MAC] >= 3)
            assert all(m.ts == 5 for m in got)
            # a heartbeat that says something new reaches the loop, then is absorbed
            hb2 = heartbeat(1, 7)
            a.pulse("g", hb2, 5 * MS, now_us() + 60_000_000)
            assert await until(lambda: got[-1] == hb2)
            absorbed.clear()
            assert await until(lambda: any(m == hb2 for m, _ in copies()))
            # stopped: no copy is sent after the stop
            a.pulse("g", None, 0, 0)
            sent = a.stats()["pulse_sent"]
            await asyncio.sleep(0.1)    # observation window: 20 intervals
            assert a.stats()["pulse_sent"] == sent
    asyncio.run(main())


@pytest.mark.skipif(not native_available(), reason="native pulse module not built")
def test_an_older_heartbeat_delayed_past_a_newer_one_never_stands_for_its_copies():
    # the copies the thread absorbs are handed to the core as their source's last message;
    # an older heartbeat arriving late (reordered) once took that place, and every copy of
    # the newer one reached the core as the older (a primary re-applied a backup's stale
    # watermark report for ever: scenario messaging_reordered_heartbeat_stale_report)
    async def main():
        got: list[Message] = []
        async with sender_and_receiver(got) as (gm, a, b):
            hb = heartbeat(1, 7)
            a.pulse("g", hb, 5 * MS, now_us() + 60_000_000)
            assert await until(lambda: hb in got)
            older = encode(heartbeat(1, 5), KEY)[0]
            paddr = pulse_address(gm.address("g"))
            a._pulse.ssock.sendto(older, (paddr.mcast_addr, paddr.port))
            assert await until(lambda: any(m.ts == 5 for m in got))     # handled once
            b.take_absorbed()
            absorbed: list[tuple[Message, list[int]]] = []
            assert await until(lambda: absorbed.extend(b.take_absorbed()) or
                               sum(len(t) for _, t in absorbed) >= 3)
            assert all(m == hb for m, _ in absorbed)
            assert sum(m.ts == 5 for m in got) == 1
    asyncio.run(main())


def test_without_the_native_thread_the_loop_repeats_and_gets_every_copy():
    async def main():
        gm = group_map()
        got: list[Message] = []
        async with Endpoint(KEY, "g", lambda m: None, groups=gm, pulse=True, birth_id=1,
                            pulse_native=False) as a, \
                Endpoint(KEY, "g", got.append, groups=gm, pulse=True, birth_id=2,
                         pulse_native=False) as b:
            hb = heartbeat(1, 5)
            a.pulse("g", hb, 5 * MS, now_us() + 60_000_000)
            assert await until(lambda: len(got) >= 5)
            assert all(m == hb for m in got) and b.take_absorbed() == []
            a.pulse("g", None, 0, 0)
            n = a.stats()["pulse_sent"]
            await asyncio.sleep(0.1)    # observation window: 20 intervals
            assert a.stats()["pulse_sent"] == n
    asyncio.run(main())


@pytest.mark.skipif(not native_available(), reason="native pulse module not built")
def test_the_lease_silences_a_stuck_loop_and_its_return_resumes_the_copies():
    """On a loop made by `pulse.new_loop` (the agent's) a Pulse with a
    lease is repeated while the loop waits in its selector however far its end is, stops
    while the loop is stuck in a handler (a hung agent must look dead), and resumes once
    the loop waits again, without a refresh."""
    async def main():
        gm = group_map()
        async with Endpoint(KEY, "g", lambda m: None, groups=gm, pulse=True, birth_id=1) as a, \
                Endpoint(KEY, "g", lambda m: None, groups=gm, pulse=True, birth_id=2) as b:
            lease = 60 * MS
            a.pulse("g", heartbeat(1, 5), 5 * MS, now_us() + 60_000_000, lease)
            seen = lambda: b.stats()["pulse_received"]      # noqa: E731
            # the loop sleeps (parked) far beyond the lease: the copies go on
            await asyncio.sleep(0.4)
            n0 = seen()
            assert n0 >= 20, n0
            # stuck: the thread stops within the lease (plus an interval), and nothing
            # more comes while the loop stays stuck
            time.sleep(0.25)                # blocks the loop on purpose
            n1 = seen()
            time.sleep(0.3)                 # observation window: 60 intervals
            n2 = seen()
            assert n2 == n1, (n1, n2)
            assert a.stats()["pulse_lease_skipped"] > 0
            # waiting again: the copies resume with no new Pulse
            assert await until(lambda: seen() >= n2 + 10)
    pulse.run(main())


@pytest.mark.skipif(not native_available(), reason="native pulse module not built")
def test_a_silence_watch_follows_the_copies_and_fires_once_they_stop():
    """`Endpoint.watch`: a deadline on a peer's silence, held by the pulse thread, moves
    with the copies of the peer's heartbeat it absorbs (the loop is not woken while they
    come) and passes, signalling `on_watch` once, only after they stop."""
    async def main():
        gm = group_map()
        got: list[Message] = []
        async with Endpoint(KEY, "g", lambda m: None, groups=gm, pulse=True, birth_id=1) as a, \
                Endpoint(KEY, "g", got.append, groups=gm, pulse=True, birth_id=2) as b:
            fired: list[int] = []
            b.on_watch = lambda: fired.append(now_us())
            assert b.watches_silence
            a.pulse("g", heartbeat(1, 5), 5 * MS, now_us() + 60_000_000)
            assert await until(lambda: got)             # accepted: its copies absorbed
            # a sender it has no source for is not watched: its deadline comes back
            t0 = now_us()
            assert b.watch([(1, t0, t0 + 100 * MS), (99, t0, t0 + 5 * MS)]) == t0 + 5 * MS
            await asyncio.sleep(0.5)        # observation window: 5 allowances of copies
            assert fired == [] and b.stats()["pulse_watch_fired"] == 0
            a.pulse("g", None, 0, 0)
            stopped = now_us()
            assert await until(lambda: fired)
            arrivals = [t for _, ts in b.take_absorbed() for t in ts]
            assert fired[0] >= max(arrivals) + 100 * MS and fired[0] >= stopped
            assert b.stats()["pulse_watch_fired"] == 1
            await asyncio.sleep(0.2)        # dropped once fired: no second signal
            assert len(fired) == 1
    pulse.run(main())
