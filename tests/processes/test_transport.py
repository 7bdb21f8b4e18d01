"""The UDP transport on real loopback sockets, between separate OS processes.

Addresses: multicast 239.x joined on 127.0.0.1, unicast only in 127.0.0.0/8; ports and
groups are random so concurrent test runs do not hear each other.
"""
import asyncio
import json
import os
import random
import sys
import time

import pytest

from llft.protocol.messages import Message, MsgType, Role
from llft.runtime.transport import (Endpoint, Faults, GroupAddress, GroupMap, default_address)
from llft.protocol.wire import Reject, encode

KEY = os.urandom(32)
pytestmark = pytest.mark.timeout(60)

# A receiver in its own process: listens to one group, reports READY, then the msn of
# every message it accepts (as one JSON line) once it has `expect` of them.
PEER = r"""
import asyncio, json, sys
from llft.runtime.transport import Endpoint, GroupAddress, GroupMap
key, group, mcast, port, expect, ubind = sys.argv[1:7]
async def main():
    peers = json.loads(sys.argv[7]) if len(sys.argv) > 7 else []
    gm = GroupMap({group: GroupAddress(mcast, int(port), tuple(map(tuple, peers)))})
    got = []
    ub = None if ubind == "-" else (ubind.split(":")[0], int(ubind.split(":")[1]))
    async with Endpoint(bytes.fromhex(key), group, got.append, groups=gm,
                        unicast_bind=ub) as ep:
        print("READY", flush=True)
        ok = await ep.wait_until(lambda: len(got) >= int(expect), 30)
        print(json.dumps({"ok": ok, "msns": [m.msn for m in got],
                          "sizes": [len(m.body["data"]) for m in got],
                          "stats": ep.stats()}), flush=True)
asyncio.run(main())
"""


def rand_group_address(peers=()):
    r = random.SystemRandom()
    return GroupAddress(f"239.{r.randint(64, 250)}.{r.randint(0, 255)}.{r.randint(1, 254)}",
                        r.randint(20000, 60000), tuple(peers))


def data_msg(msn, dst="svc", size=16):
    return Message(MsgType.REQUEST, "cli", dst, 1, Role.CLIENT, pvn=1, precedence=1,
                   sender=99, msn=msn, body={"offset": 0, "data": bytes([msn % 256]) * size,
                                             "flags": 0})


async def start_peer(addr, expect, ubind="-", peers=()):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PEER, KEY.hex(), "svc", addr.mcast_addr, str(addr.port),
        str(expect), ubind, json.dumps(list(peers)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    if line.strip() != b"READY":
        raise AssertionError(line + await proc.stderr.read())
    return proc


async def finish_peer(proc):
    out = await asyncio.wait_for(proc.stdout.readline(), 40)
    await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == 0, await proc.stderr.read()
    return json.loads(out)


def test_multicast_between_processes_reaches_every_member():
    """Two member processes of group svc each get all messages, big ones fragmented
    (at an Ethernet-sized MTU: on loopback the interface's would carry them whole)."""
    addr = rand_group_address()

    async def main():
        n = 200
        peers = [await start_peer(addr, n) for _ in range(2)]
        async with Endpoint(KEY, "cli", lambda m: None, groups=GroupMap({"svc": addr}),
                            mtu_bytes=1400) as sender:
            for msn in range(1, n + 1):
                sender.send("svc", data_msg(msn, size=5000 if msn % 10 == 0 else 16))
                if msn % 50 == 0:
                    await asyncio.sleep(0)     # let the loop flush; not synchronisation
            results = [await finish_peer(p) for p in peers]
        for r in results:
            assert r["ok"], r["stats"]
            assert sorted(r["msns"]) == list(range(1, n + 1))
            assert {s for s in r["sizes"]} == {16, 5000}
            assert r["stats"]["accepted_messages"] == n
        return sender.counters

    counters = asyncio.run(main())
    assert counters["sent_messages"] == 200
    assert counters["sent_datagrams"] > 200          # fragments


def test_unicast_fallback_sends_to_each_peer():
    r = random.SystemRandom()
    ports = [r.randint(20000, 60000) for _ in range(2)]
    peers = [("127.0.0.1", ports[0]), ("127.0.0.2", ports[1])]
    addr = rand_group_address(peers)

    async def main():
        procs = [await start_peer(addr, 20, f"{h}:{p}", peers) for h, p in peers]
        async with Endpoint(KEY, "cli", lambda m: None,
                            groups=GroupMap({"svc": addr})) as sender:
            for msn in range(1, 21):
                sender.send("svc", data_msg(msn))
            results = [await finish_peer(p) for p in procs]
        for res in results:
            assert res["ok"] and sorted(res["msns"]) == list(range(1, 21))
        assert sender.counters["sent_datagrams"] == 40     # 20 messages x 2 peers

    asyncio.run(main())


def test_rejections_counted_and_callback_errors_contained():
    addr = rand_group_address()

    async def main():
        got = []

        def handler(m):
            got.append(m)
            if m.msn == 2:
                raise RuntimeError("a buggy handler")

        gm = GroupMap({"svc": addr})
        async with Endpoint(KEY, "svc", handler, groups=gm) as rx, \
                Endpoint(KEY, "cli", lambda m: None, groups=gm) as tx:
            tx.send_datagram("svc", b"not llft at all")
            tx.send_datagram("svc", encode(data_msg(1), os.urandom(32))[0])   # wrong key
            tx.send_datagram("svc", encode(data_msg(1, dst="other"), KEY)[0])
            for msn in (1, 2, 3):
                tx.send("svc", data_msg(msn))
            ok = await rx.wait_until(lambda: rx.counters["processed_datagrams"] >= 6, 10)
            assert ok, rx.stats()
            assert [m.msn for m in got] == [1, 2, 3]
            assert rx.counters["callback_errors"] == 1
            assert rx.rejections == {Reject.BAD_MAGIC: 1, Reject.BAD_MAC: 1,
                                     Reject.WRONG_GROUP: 1}
            stats = rx.stats()
            assert stats["rejected_bad_mac"] == 1 and stats["accepted_messages"] == 3
            rx.set_view("cli", 2)
            tx.send("svc", data_msg(4))                       # pvn 1 < 2: replay
            assert await rx.wait_until(lambda: rx.rejections[Reject.OLD_VIEW] == 1, 10)

    asyncio.run(main())


def test_a_message_comes_with_the_kernels_arrival_time():
    """A message that waited in the socket while the process did not run (here: its
    loop blocked 200 ms) is handed over with when it came, not when it is handled
    (`on_message_at`, SIOCGSTAMPNS): what the cores stamp with it -- a remote primary
    last heard, which PROBE answers report -- must not make a stopped member say that a
    primary that crashed meanwhile spoke "0 ms ago"
    (tests/sim/regressions/replica_paused_member_stamps_queued_words_as_fresh)."""
    addr = rand_group_address()

    async def main():
        got = []
        gm = GroupMap({"svc": addr})
        async with Endpoint(KEY, "svc", lambda m: got.append((m.msn, None, None)),
                            groups=gm) as rx, \
                Endpoint(KEY, "cli", lambda m: None, groups=gm) as tx:
            rx.on_message_at = lambda m, at: got.append((m.msn, at, rx.clock_us()))
            sent_us = rx.clock_us()
            tx.send("svc", data_msg(1))
            time.sleep(0.2)                 # the loop does not run: it waits in the socket
            assert await rx.wait_until(lambda: got, 10)
            [(msn, at_us, handled_us)] = got
            assert msn == 1 and at_us is not None, got
            assert sent_us <= at_us <= sent_us + 100_000 < handled_us - 100_000, got

    asyncio.run(main())


def test_own_multicasts_are_dropped():
    """With multicast loop on, our multicasts come back to our own socket: the kernel drops
    them (a socket filter on our send socket's address), and a message with our birth id
    that arrives anyway (from another socket) is dropped by the endpoint."""
    addr = rand_group_address()

    async def main():
        got_a, got_b = [], []
        gm = GroupMap({"svc": addr})
        async with Endpoint(KEY, "svc", got_a.append, groups=gm, birth_id=99) as a, \
                Endpoint(KEY, "svc", got_b.append, groups=gm, birth_id=7) as b:
            assert a.own_filtered and b.own_filtered
            a.send("svc", data_msg(1))                        # sender 99: a's echo
            assert await b.wait_until(lambda: len(got_b) == 1, 10)
            b.send("svc", data_msg(2))                        # sender 99 from b's socket
            hb = Message(MsgType.HEARTBEAT, "svc", "svc", 0, Role.CLIENT, 1, 1, 7,
                         body={"rank": 2, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0})
            b.send("svc", hb)
            assert await a.wait_until(lambda: len(got_a) == 1, 10)
            assert got_a[0].sender == 7 and a.counters["own_messages"] == 1
            # a heard b's two datagrams and never its own; b only a's
            assert a.counters["received_datagrams"] == 2, a.stats()
            assert b.counters["received_datagrams"] == 1, b.stats()
            assert [m.msn for m in got_b] == [1]

    asyncio.run(main())


def run_with_faults(seed, faults_on_send):
    addr = rand_group_address()
    n = 400

    async def main():
        got = []
        gm = GroupMap({"svc": addr})
        f = Faults(drop=0.2, duplicate=0.2, delay=0.2, delay_us=(100, 2000), seed=seed)
        kw_rx = {} if faults_on_send else {"recv_faults": f}
        kw_tx = {"send_faults": f} if faults_on_send else {}
        async with Endpoint(KEY, "svc", got.append, groups=gm, **kw_rx) as rx, \
                Endpoint(KEY, "cli", lambda m: None, groups=gm, **kw_tx) as tx:
            for msn in range(1, n + 1):
                tx.send("svc", data_msg(msn))
            faulty = tx if faults_on_send else rx
            dropped = lambda: faulty.counters["dropped_send" if faults_on_send  # noqa: E731
                                              else "dropped_recv"]
            copies = lambda: (n - dropped() + faulty.counters[                  # noqa: E731
                "duplicated_send" if faults_on_send else "duplicated_recv"])
            # wait until every copy that should arrive has arrived (or been processed)
            assert await rx.wait_until(
                lambda: faulty.counters["received_datagrams" if not faults_on_send
                                        else "sent_datagrams"] >= (n if not faults_on_send
                                                                   else copies())
                and rx.counters["processed_datagrams"] >= copies(), 20), rx.stats()
            return [m.msn for m in got], dict(faulty.counters)

    return asyncio.run(main())


@pytest.mark.parametrize("on_send", [True, False])
def test_fault_injection_is_seeded(on_send):
    msns_a, counters_a = run_with_faults(7, on_send)
    msns_b, counters_b = run_with_faults(7, on_send)
    side = "send" if on_send else "recv"
    assert 40 < counters_a[f"dropped_{side}"] < 130
    assert 40 < counters_a[f"duplicated_{side}"] < 130
    assert counters_a[f"delayed_{side}"] > 40
    # the same seed makes the same decisions (arrival order may differ: delays are real)
    assert sorted(msns_a) == sorted(msns_b)
    assert counters_a[f"dropped_{side}"] == counters_b[f"dropped_{side}"]
    assert len(set(msns_a)) < 400 and len(msns_a) > len(set(msns_a))


def test_faults_plan_shapes():
    assert Faults().plan() == [0.0]
    assert Faults(drop=1.0).plan() == []
    assert len(Faults(duplicate=1.0).plan()) == 2
    assert all(0.001 <= d <= 0.002 for d in Faults(delay=1.0, delay_us=(1000, 2000)).plan())


def test_default_addresses_are_stable_multicast():
    a = default_address("counter")
    assert a == default_address("counter") and a.mcast_addr.startswith("239.255.")
    assert GroupMap().address("counter") == a
    with pytest.raises(ValueError):
        GroupAddress("127.0.0.1", 5000)


def test_llft_sniff_decodes_live_traffic(tmp_path):
    """`llft sniff` on lo (root) prints one line per datagram, with tag status."""
    from llft.runtime.keys import write_key
    key_path = str(tmp_path / "k")
    write_key(key_path, KEY)
    addr = rand_group_address()

    async def main():
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llft", "sniff", "--iface", "lo", "--port",
            str(addr.port), "--count", "5", "--key", key_path, "--timeout", "30",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        started = await asyncio.wait_for(proc.stderr.readline(), 20)
        assert b"capturing on lo" in started, started + await proc.stderr.read()
        async with Endpoint(KEY, "cli", lambda m: None, groups=GroupMap({"svc": addr}),
                            mtu_bytes=1400) as tx:
            tx.send("svc", data_msg(1))
            tx.send("svc", data_msg(2, size=2000))           # two fragments
            tx.send_datagram("svc", encode(data_msg(3), os.urandom(32))[0])
            tx.send_datagram("svc", b"junk")
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err
        return out.decode().splitlines()

    lines = asyncio.run(main())
    assert len(lines) == 5, lines
    assert "REQUEST cli>svc conn=1/client pvn=1 msn=1" in lines[0] and "mac=ok" in lines[0]
    assert "FRAGMENT" in lines[1] and "1/2" in lines[1]
    assert "2/2" in lines[2] and "-> REQUEST cli>svc" in lines[2] and "msn=2" in lines[2]
    assert "msn=3" in lines[3] and "mac=bad" in lines[3]
    assert "not llft" in lines[4]
    assert all(f"> {addr.mcast_addr}:{addr.port} " in ln for ln in lines)


def test_llft_sniff_bad_key_is_one_line(tmp_path):
    r = subprocess_run([sys.executable, "-m", "llft", "sniff", "--key",
                        str(tmp_path / "missing")])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def subprocess_run(argv):
    import subprocess
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_unicast_listener_needs_its_own_address():
    addr = rand_group_address([("127.0.0.1", 40000)])
    with pytest.raises(ValueError, match="unicast_bind"):
        Endpoint(KEY, "svc", lambda m: None, groups=GroupMap({"svc": addr}))


def test_delayed_copies_after_close_are_ignored():
    addr = rand_group_address()

    async def main():
        gm = GroupMap({"svc": addr})
        rx = await Endpoint(KEY, "svc", lambda m: None, groups=gm,
                            recv_faults=Faults(delay=1.0, delay_us=(1000, 1000))).start()
        tx = await Endpoint(KEY, "cli", lambda m: None, groups=gm).start()
        tx.send("svc", data_msg(1))
        assert await rx.wait_until(lambda: rx.counters["received_datagrams"] == 1, 10)
        rx.close()
        tx.close()
        # let the delayed copy fire; the closed endpoint must ignore it quietly
        await asyncio.sleep(0.01)
        assert rx.counters["processed_datagrams"] == 0

    asyncio.run(main())


def test_one_endpoint_listens_to_several_groups():
    a, b, c = rand_group_address(), rand_group_address(), rand_group_address()

    async def main():
        got = []
        gm = GroupMap({"svc": a, "gw": b, "third": c})
        async with Endpoint(KEY, ["svc", "gw"], got.append, groups=gm) as rx, \
                Endpoint(KEY, "cli", lambda m: None, groups=gm) as tx:
            tx.send("third", data_msg(9, dst="third"))     # not joined: never arrives
            tx.send("svc", data_msg(1, dst="svc"))
            tx.send("gw", data_msg(2, dst="gw"))
            assert await rx.wait_until(lambda: len(got) == 2, 10)
            assert sorted((m.dst_group, m.msn) for m in got) == [("gw", 2), ("svc", 1)]
            assert rx.counters["received_datagrams"] == 2 and not rx.rejections

    asyncio.run(main())


def test_socket_options_interface_ttl_loop_buffers():
    import socket as so

    async def main():
        async with Endpoint(KEY, "svc", lambda m: None, ttl=3, multicast_loop=False,
                            groups=GroupMap({"svc": rand_group_address()})) as ep:
            s = ep._send_transport.get_extra_info("socket")
            assert s.getsockopt(so.IPPROTO_IP, so.IP_MULTICAST_TTL) == 3
            assert s.getsockopt(so.IPPROTO_IP, so.IP_MULTICAST_LOOP) == 0
            assert so.inet_ntoa(s.getsockopt(so.IPPROTO_IP, so.IP_MULTICAST_IF, 4)) \
                == "127.0.0.1"
            assert s.getsockopt(so.SOL_SOCKET, so.SO_SNDBUF) >= 1 << 20
            assert ep.rcvbuf_actual_bytes >= 1 << 20       # root: FORCE beats rmem_max

    asyncio.run(main())
