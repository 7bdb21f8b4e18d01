"""The native heartbeat thread (native._llft_pulse, native/pulse/llft_pulse.c): it repeats
the agent's heartbeat datagrams byte for byte, absorbs byte-identical copies of what
Python already accepted from a source (keeping only their arrival times) and forwards
everything else to Python through a queue and an eventfd; with a lease it repeats only
while the loop shows it is alive (set, park), and it signals Python when a silence
watch's deadline, moved by the copies absorbed since, passes. Real UDP sockets on
127.0.0.1. No fixed sleep synchronises anything: the tests wait for counts with
deadlines; the only sleeps are the observation windows of "nothing more happens"."""
from __future__ import annotations

import os
import select
import socket
import sys
import time

import pytest

from native._llft_pulse import ffi, lib
from polling import wait_for

pytestmark = pytest.mark.timeout(60)

DEADLINE = 10.0   # seconds: generous (2 cores, maybe busy), only reached on failure
FAR = 1 << 62     # until_us: never


def now_us() -> int:
    return time.monotonic_ns() // 1000


def ip_be(host: str) -> int:
    """sin_addr.s_addr as the C side reads it: the network-order bytes as a native int."""
    return int.from_bytes(socket.inet_aton(host), sys.byteorder)


def src_of(addr: tuple[str, int]) -> int:
    return (ip_be(addr[0]) << 16) | addr[1]


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


class Pulse:
    """One pulse thread with its own receive and send sockets and Python's eventfd."""

    def __init__(self):
        self.rx, self.tx = udp(), udp()
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.p = lib.llft_pulse_new(self.rx.fileno(), self.tx.fileno(), self.efd)
        assert self.p != ffi.NULL
        self.buf = ffi.new("uint8_t[]", 65536)
        self.src = ffi.new("uint64_t *")
        self.at = ffi.new("int64_t *")

    @property
    def addr(self):
        return self.rx.getsockname()

    @property
    def me(self) -> int:
        """The source others see this pulse's repeats come from."""
        return src_of(self.tx.getsockname())

    def set(self, datagrams, dst, every_us=20_000, until_us=FAR, lease_us=0) -> int:
        lens = ffi.new("uint32_t[]", [len(d) for d in datagrams] or [0])
        data = b"".join(datagrams)
        return lib.llft_pulse_set(self.p, ffi.from_buffer(data), lens, len(datagrams),
                                  ip_be(dst[0]), dst[1], every_us, until_us, lease_us)

    def park(self, parked: bool):
        lib.llft_pulse_park(self.p, int(parked))

    def watch(self, watches) -> int:
        """watches: [(src, heard_us, deadline_us)], replacing the set."""
        cols = list(zip(*watches)) or [(), (), ()]
        return lib.llft_pulse_watch(self.p, ffi.new("uint64_t[]", list(cols[0]) or [0]),
                                    ffi.new("int64_t[]", list(cols[1]) or [0]),
                                    ffi.new("int64_t[]", list(cols[2]) or [0]), len(watches))

    def watch_fired(self) -> int:
        return lib.llft_pulse_watch_fired(self.p)

    def take(self, cap=65536):
        """(data, src, at_us), None if the queue is empty, -1 if cap is too small."""
        n = lib.llft_pulse_take(self.p, self.buf, cap, self.src, self.at)
        if n <= 0:
            return None if n == 0 else -1
        return ffi.buffer(self.buf, n)[:], self.src[0], self.at[0]

    def accept(self, src: int, data: bytes):
        lib.llft_pulse_accept(self.p, src, data, len(data))


    def arrivals(self, cap=1024):
        srcs, ats = ffi.new("uint64_t[]", cap), ffi.new("int64_t[]", cap)
        n = lib.llft_pulse_arrivals(self.p, srcs, ats, cap)
        return [(srcs[i], ats[i]) for i in range(n)]

    def stats(self) -> dict[str, int]:
        out = ffi.new("uint64_t[10]")
        lib.llft_pulse_stats(self.p, out)
        return dict(zip(("sent", "received", "absorbed", "forwarded", "fwd_dropped",
                         "arr_dropped", "send_errors", "recv_errors", "lease_skipped",
                         "watch_fired"), out))

    def wait_event(self):
        """Blocks until the eventfd is signalled (the queue became non-empty, or a watch
        fired); resets it."""
        assert self.event_within(DEADLINE), "eventfd never signalled"
        os.eventfd_read(self.efd)

    def event_within(self, timeout_s: float) -> bool:
        """Whether the eventfd is signalled within timeout_s (left as it is)."""
        return bool(select.select([self.efd], [], [], timeout_s)[0])

    def close(self):
        lib.llft_pulse_free(self.p)
        self.p = ffi.NULL
        self.rx.close()
        self.tx.close()
        os.close(self.efd)


@pytest.fixture
def pulses():
    made = []

    def make():
        made.append(Pulse())
        return made[-1]
    yield make
    for p in made:
        if p.p != ffi.NULL:
            p.close()


def recv_all(s: socket.socket) -> list[bytes]:
    out = []
    while select.select([s], [], [], 0)[0]:
        out.append(s.recv(65536))
    return out


def test_set_sends_at_once_then_repeats_until_stopped(pulses):
    a, rcv = pulses(), udp()
    hb = [b"heartbeat-one:" + bytes(range(200)), b"heartbeat-two:" + b"x" * 150]
    assert a.set(hb, rcv.getsockname()) == 0
    # the first copies leave from the caller's thread, before set returns
    assert a.stats()["sent"] >= 2
    got = []

    def three_copies_each():
        got.extend(recv_all(rcv))
        return all(got.count(d) >= 3 for d in hb)
    wait_for(three_copies_each, "3 copies of each heartbeat")
    assert set(got) == set(hb)   # byte for byte, nothing else
    # n == 0 stops repeating
    assert a.set([], rcv.getsockname()) == 0
    sent = a.stats()["sent"]
    select.select([], [], [], 0.1)   # 5 intervals
    assert a.stats()["sent"] == sent
    assert a.stats()["send_errors"] == 0
    rcv.close()


def test_until_in_the_past_sends_once(pulses):
    a, rcv = pulses(), udp()
    assert a.set([b"once"], rcv.getsockname(), every_us=5_000, until_us=now_us() - 1) == 0
    assert a.stats()["sent"] == 1
    select.select([], [], [], 0.1)   # 20 intervals
    assert a.stats()["sent"] == 1
    assert wait_for(lambda: recv_all(rcv), "the one copy") == [b"once"]
    rcv.close()


def test_repeats_end_at_until_without_bursts(pulses):
    a, rcv = pulses(), udp()
    t0 = now_us()
    until = t0 + 100_000
    a.set([b"short-lived"], rcv.getsockname(), every_us=10_000, until_us=until)
    wait_for(lambda: now_us() > until + 20_000, "until_us to pass")
    sent = a.stats()["sent"]
    # the first copy, then at most one per interval up to until_us (no catch-up burst)
    assert 1 <= sent <= 1 + (until - t0) // 10_000 + 1
    select.select([], [], [], 0.05)
    assert a.stats()["sent"] == sent
    rcv.close()


def test_bad_arguments(pulses):
    a = pulses()
    dst = ("127.0.0.1", 9)
    assert a.set([b"x"] * 9, dst) == -1
    assert a.set([b"x"], dst, every_us=0) == -1
    assert a.stats()["sent"] == 0


LEASE_US = 150_000


def test_lease_stops_copies_of_a_loop_that_never_parks_and_parking_resumes_them(pulses):
    """With a lease, copies need a live loop: a set() or a park(0) at most lease_us before,
    or the loop blocked in its selector now. The cadence goes on while they are
    skipped, so parking again resumes them without any set()."""
    a, rcv = pulses(), udp()
    t_set = now_us()
    assert a.set([b"leased"], rcv.getsockname(), every_us=10_000, lease_us=LEASE_US) == 0
    wait_for(lambda: a.stats()["lease_skipped"] >= 1, "a copy skipped, the lease lapsed")
    assert now_us() >= t_set + LEASE_US   # not before the lease ran out
    st = a.stats()
    # the copy at set, then at most one per interval within the lease; the first the
    # thread repeats is due well within it, even if the thread ran late
    assert 2 <= st["sent"] <= 1 + LEASE_US // 10_000 + 1
    # until_us is far, but no copy goes out any more: 5 more skipped, none sent
    skipped = st["lease_skipped"]
    wait_for(lambda: a.stats()["lease_skipped"] >= skipped + 5, "5 more copies skipped")
    assert a.stats()["sent"] == st["sent"]
    # the loop blocks in its selector: it is idle, not hung; its heartbeat is repeated
    a.park(True)
    wait_for(lambda: a.stats()["sent"] >= st["sent"] + 3, "copies resumed while parked")
    # it leaves its selector and never comes back: copies stop lease_us later
    t_left = now_us()
    a.park(False)
    st = a.stats()
    wait_for(lambda: a.stats()["lease_skipped"] > st["lease_skipped"],
             "a copy skipped after leaving the selector")
    assert now_us() >= t_left + LEASE_US
    sent = a.stats()["sent"]
    skipped = a.stats()["lease_skipped"]
    wait_for(lambda: a.stats()["lease_skipped"] >= skipped + 5, "5 more copies skipped")
    assert a.stats()["sent"] == sent
    got = recv_all(rcv)
    assert set(got) == {b"leased"} and len(got) == sent   # byte for byte, all of them
    assert a.stats()["send_errors"] == 0
    rcv.close()


def test_a_refresh_renews_the_lease(pulses):
    """The same datagrams set again (only until_us moves, the cadence kept) is the loop's
    sign of life as much as a new heartbeat."""
    a, rcv = pulses(), udp()
    dst = rcv.getsockname()
    a.set([b"quiet"], dst, every_us=10_000, until_us=now_us() + 60_000_000, lease_us=LEASE_US)
    wait_for(lambda: a.stats()["lease_skipped"] >= 3, "the lease lapsed")
    st = a.stats()
    t_refresh = now_us()
    assert a.set([b"quiet"], dst, every_us=10_000, until_us=now_us() + 60_000_000,
                 lease_us=LEASE_US) == 0
    wait_for(lambda: a.stats()["sent"] >= st["sent"] + 3, "copies resumed by the refresh")
    skipped = a.stats()["lease_skipped"]
    wait_for(lambda: a.stats()["lease_skipped"] > skipped, "the renewed lease lapsed")
    assert now_us() >= t_refresh + LEASE_US
    assert set(recv_all(rcv)) == {b"quiet"}
    rcv.close()


@pytest.mark.parametrize("lease_us", [0, -1])
def test_no_lease_repeats_without_park(pulses, lease_us):
    a, rcv = pulses(), udp()
    t0 = now_us()
    a.set([b"unleased"], rcv.getsockname(), every_us=10_000, lease_us=lease_us)
    # well past where a lease of LEASE_US would have stopped it: still repeating
    wait_for(lambda: now_us() > t0 + 2 * LEASE_US, "twice a lease to pass")
    sent = a.stats()["sent"]
    wait_for(lambda: a.stats()["sent"] >= sent + 3, "3 more copies")
    assert a.stats()["lease_skipped"] == 0
    rcv.close()


def test_unaccepted_datagram_is_forwarded(pulses):
    a, tx = pulses(), udp()
    assert a.take() is None
    t0 = now_us()
    tx.sendto(b"hello from a stranger", a.addr)
    a.wait_event()
    data, src, at = a.take()
    t1 = now_us()
    assert data == b"hello from a stranger"
    assert src == src_of(tx.getsockname())
    assert t0 <= at <= t1
    assert a.take() is None
    st = a.stats()
    assert (st["received"], st["forwarded"], st["absorbed"]) == (1, 1, 0)
    tx.close()


def test_accepted_copies_are_absorbed(pulses):
    a, b = pulses(), pulses()
    d, d2 = b"hb:seq=1:" + b"\x01" * 180, b"hb:seq=2:" + b"\x02" * 180
    t0 = now_us()
    b.set([d], a.addr, every_us=10_000)
    a.wait_event()
    data, src, _ = a.take()
    assert (data, src) == (d, b.me)
    a.accept(src, d)
    # copies read before accept were queued: all are d; none comes after the drain
    while (t := a.take()) is not None:
        assert t[:2] == (d, b.me)
    fwd = a.stats()["forwarded"]
    wait_for(lambda: a.stats()["absorbed"] >= 3, "3 absorbed copies")
    # stop b and let a read everything b sent: then the counts are final
    b.set([], a.addr)
    total = b.stats()["sent"]
    wait_for(lambda: a.stats()["received"] == total, "everything b sent read")
    arr = a.arrivals()
    t1 = now_us()
    assert {s for s, _ in arr} == {b.me}
    times = [t for _, t in arr]
    assert times == sorted(times) and t0 <= times[0] and times[-1] <= t1
    assert a.take() is None and a.arrivals() == []
    st = a.stats()
    assert st["forwarded"] == fwd
    assert st["absorbed"] == len(arr) >= 3   # every absorbed copy has its time
    # a different datagram from the same source is still forwarded
    b.set([d2], a.addr, every_us=10_000)

    def take_d2():
        t = a.take()
        return t if t and t[0] == d2 else None
    data, src, _ = wait_for(take_d2, "d2 forwarded")
    assert src == b.me
    # d, still among the source's last 8 accepted, is absorbed again once b repeats it
    b.set([d], a.addr, every_us=10_000)
    n = a.stats()["absorbed"]
    wait_for(lambda: a.stats()["absorbed"] > n, "d absorbed again")


def test_poll_reads_what_the_thread_leaves_until_its_sends(pulses):
    """Repeating, the thread reads its socket only at its sends (here: a minute apart); a
    caller about to judge a silence reads it itself (llft_pulse_poll): when that returns,
    whatever the kernel held is queued or absorbed, in the kernel's order (the thread may
    have read some of it meanwhile: one reader at a time, so none is missed)."""
    a, peer = pulses(), udp()
    assert a.set([b"mine"], peer.getsockname(), every_us=60_000_000) == 0
    d = b"hb:seq=7:" + b"\x07" * 100
    me = src_of(peer.getsockname())
    peer.sendto(d, a.addr)        # loopback: queued at a's socket when sendto returns
    assert lib.llft_pulse_poll(a.p) in (0, 1)
    data, src, at = a.take()
    assert (data, src) == (d, me) and at <= now_us()
    a.accept(src, d)
    t0 = now_us()
    for _ in range(3):
        peer.sendto(d, a.addr)
    lib.llft_pulse_poll(a.p)
    arr = a.arrivals()
    assert [s for s, _ in arr] == [me] * 3
    times = [t for _, t in arr]
    assert times == sorted(times) and t0 <= times[0] and times[-1] <= now_us()
    assert lib.llft_pulse_poll(a.p) == 0 and a.stats()["absorbed"] == 3
    peer.close()


ALLOWANCE_US = 100_000


def test_watch_fires_at_its_deadline_without_absorbed_copies(pulses):
    a, silent = pulses(), udp()
    me = src_of(silent.getsockname())
    assert a.watch_fired() == 0
    heard = now_us()
    deadline = heard + 200_000
    # two watches: the earlier fires, and clears both
    far = (src_of(("127.0.0.2", 1)), heard, heard + 60_000_000)
    assert a.watch([(me, heard, deadline), far]) == 0
    a.wait_event()
    assert now_us() >= deadline   # not before its deadline
    assert a.watch_fired() == 1
    assert a.watch_fired() == 0
    assert a.take() is None   # the event was the watch, nothing was forwarded
    assert a.stats()["watch_fired"] == 1
    # the set was cleared: nothing fires again (the far watch with it)
    assert not a.event_within(0.3)
    assert a.watch_fired() == 0 and a.stats()["watch_fired"] == 1
    silent.close()


@pytest.mark.parametrize("repeating", [False, True], ids=["idle", "repeating"])
def test_absorbed_copies_move_a_watch(pulses, repeating):
    """Copies of an accepted heartbeat keep the watch on their source from firing while
    they come, and it fires allowance after the newest. Repeating (here a minute apart),
    the thread does not watch its socket: the watch reads it when due."""
    a, peer, rcv = pulses(), udp(), udp()
    if repeating:
        a.set([b"mine"], rcv.getsockname(), every_us=60_000_000)
    me = src_of(peer.getsockname())
    d = b"hb:seq=3:" + b"\x03" * 120
    a.accept(me, d)
    sent, arrivals, fired_before = 0, [], 0
    for _ in range(3):
        heard = now_us()
        assert a.watch([(me, heard, heard + ALLOWANCE_US)]) == 0
        # a copy every 20 ms for 0.5 s. A fire seen at o is fair only if no copy started
        # within the allowance before it (a copy arrives after its sendto starts, and is
        # in the kernel when sendto returns): a loaded machine may stall this sender
        fired, stalled, started = False, False, heard
        while not fired and now_us() < heard + 500_000:
            t = now_us()
            peer.sendto(d, a.addr)
            sent += 1
            arrivals += a.arrivals()   # popping the arrivals keeps the source's newest
            fired = a.event_within(0.02)
            stalled |= now_us() - started >= ALLOWANCE_US
            started = t
        if not fired:
            break
        assert stalled, "a watch fired while its source's copies kept coming"
        a.wait_event()                 # a fair fire: start a new round
        assert a.watch_fired() == 1
        fired_before += 1
    else:
        pytest.skip("this machine stalled the sender in every round")
    assert a.stats()["watch_fired"] == fired_before
    a.wait_event()
    t_fire = now_us()
    lib.llft_pulse_poll(a.p)
    arrivals += a.arrivals()
    assert len(arrivals) == sent == a.stats()["absorbed"] and a.take() is None
    newest = max(t for _, t in arrivals)
    assert t_fire >= newest + ALLOWANCE_US   # not before the moved deadline
    assert a.watch_fired() == 1 and a.stats()["watch_fired"] == fired_before + 1
    peer.close()
    rcv.close()


def test_watch_bad_arguments_and_clearing(pulses):
    a = pulses()
    other = src_of(("127.0.0.2", 1))
    past = now_us() - 1
    assert a.watch([(other, past, past)] * 16) == 0   # 16 allowed; due already
    a.wait_event()
    assert a.watch_fired() == 1
    # refused calls leave the set as it is (here: empty, so nothing fires)
    assert a.watch([(other, past, past)] * 17) == -1
    srcs, times = ffi.new("uint64_t[]", [other]), ffi.new("int64_t[]", [past])
    assert lib.llft_pulse_watch(a.p, srcs, times, times, -1) == -1
    assert lib.llft_pulse_watch(a.p, ffi.NULL, times, times, 1) == -1
    assert lib.llft_pulse_watch(a.p, srcs, ffi.NULL, times, 1) == -1
    assert lib.llft_pulse_watch(a.p, srcs, times, ffi.NULL, 1) == -1
    assert lib.llft_pulse_watch(a.p, ffi.NULL, ffi.NULL, ffi.NULL, 0) == 0
    # a watch cleared (n == 0) before its deadline never fires
    deadline = now_us() + 1_000_000
    assert a.watch([(other, past, deadline)]) == 0
    assert a.watch([]) == 0
    wait_for(lambda: now_us() > deadline + 300_000, "well past the cleared deadline",
             timeout_s=DEADLINE)
    assert not a.event_within(0)
    assert a.watch_fired() == 0 and a.stats()["watch_fired"] == 1
    # and the set is not stuck: a new watch still fires
    assert a.watch([(other, past, past)]) == 0
    a.wait_event()
    assert a.watch_fired() == 1 and a.stats()["watch_fired"] == 2


def test_each_source_keeps_its_last_8_accepted(pulses):
    a, tx = pulses(), udp()
    me = src_of(tx.getsockname())
    ds = [b"accepted-%d" % i for i in range(9)]
    for d in ds:
        a.accept(me, d)
    a.accept(me, ds[8])   # a repeat accept takes no second slot
    a.accept(src_of(("127.0.0.2", 1)), ds[0])   # another source's acceptance is not ours
    for d in ds:
        tx.sendto(d, a.addr)
    wait_for(lambda: a.stats()["received"] == 9, "9 datagrams received")
    assert a.take()[0] == ds[0] and a.take() is None
    assert a.stats()["absorbed"] == 8
    tx.close()


def test_take_with_too_small_buffer_keeps_the_datagram(pulses):
    a, tx = pulses(), udp()
    d = bytes(range(100))
    tx.sendto(d, a.addr)
    a.wait_event()
    assert a.take(cap=10) == -1
    assert a.take(cap=99) == -1
    assert a.take(cap=100)[0] == d
    assert a.take() is None
    tx.close()


def test_forward_queue_and_arrival_lists_are_bounded(pulses):
    a, tx = pulses(), udp()
    me = src_of(tx.getsockname())
    # batches small enough for the socket buffer: the thread reads each before the next
    sent = 0
    for batch in range(18):   # 1152 > 1024 distinct datagrams
        for i in range(64):
            tx.sendto(b"q%d" % sent, a.addr)
            sent += 1
        wait_for(lambda: a.stats()["received"] == sent, "a batch received")
    st = a.stats()
    assert (st["forwarded"], st["fwd_dropped"]) == (1024, sent - 1024)
    taken = 0
    while (t := a.take()) is not None:
        assert t[0] == b"q%d" % taken   # FIFO, the first 1024 kept
        taken += 1
    assert taken == 1024
    # 300 copies of one accepted datagram: the oldest 44 arrivals are dropped
    a.accept(me, b"hb")
    for batch in range(5):
        for i in range(60):
            tx.sendto(b"hb", a.addr)
            sent += 1
        wait_for(lambda: a.stats()["received"] == sent, "a batch received")
    arr = a.arrivals(cap=1000)
    assert len(arr) == 256 and a.stats()["arr_dropped"] == 300 - 256
    assert a.stats()["absorbed"] == 300
    tx.close()


def tasks() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_free_joins_the_thread_and_cycles_leak_nothing():
    base_tasks, base_fds = tasks(), fds()
    p = Pulse()
    new = tasks() - base_tasks
    assert len(new) == 1
    with open(f"/proc/self/task/{new.pop()}/comm") as f:
        assert f.read().strip() == "llft-pulse"
    p.close()
    wait_for(lambda: tasks() == base_tasks, "the thread gone")
    rcv = udp()
    for i in range(200):
        p = Pulse()
        p.set([b"cycle"], rcv.getsockname(), every_us=1_000)
        p.tx.sendto(b"to self", p.addr)   # something left in the queue at free
        p.accept(p.me, b"x")
        p.close()
    rcv.close()
    wait_for(lambda: tasks() == base_tasks, "all threads gone")
    assert fds() == base_fds


def cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def test_idle_thread_blocks(pulses):
    before = tasks()
    a = pulses()
    (tid,) = tasks() - before
    c0 = cpu_ns(tid)
    select.select([], [], [], 0.3)
    assert cpu_ns(tid) - c0 < 5_000_000   # a spinning thread would take ~300 ms
    # a watch a minute off: one timeout, no wake-up before it
    assert a.watch([(src_of(("127.0.0.2", 1)), now_us(), now_us() + 60_000_000)]) == 0
    c0 = cpu_ns(tid)
    select.select([], [], [], 0.3)
    assert cpu_ns(tid) - c0 < 5_000_000
    # repeating every 20 ms costs a wake-up per interval, not a busy loop
    rcv = udp()
    a.set([b"hb"], rcv.getsockname(), every_us=20_000)
    c0 = cpu_ns(tid)
    select.select([], [], [], 0.3)
    assert cpu_ns(tid) - c0 < 30_000_000
    rcv.close()
