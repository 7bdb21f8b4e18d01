"""llft/tools/netns.py alone: group multicast crosses the private bridge from each
namespace to the root namespace; a cut link delivers nothing, a healed one delivers again;
nothing of the segment remains after the `with`."""
from __future__ import annotations

import random
import socket
import subprocess
import sys
import time

import pytest

from llft.tools import netns

_why_not = netns.available()
pytestmark = pytest.mark.skipif(_why_not is not None, reason=_why_not or "")

# sends one datagram "<name> <token>" to the group for each line read on stdin
SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(sys.argv[1]))
for line in sys.stdin:
    s.sendto(f"{sys.argv[3]} {line.strip()}".encode(), (sys.argv[2], int(sys.argv[4])))
"""


def test_multicast_crosses_cut_and_heal():
    group, port = f"239.255.{random.randrange(1, 255)}.{random.randrange(1, 255)}", \
        random.randrange(20000, 60000)
    with netns.Segment(2) as seg:
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rx.bind((group, port))
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                      socket.inet_aton(group) + socket.inet_aton(seg.host_addr))
        rx.settimeout(0.05)
        senders = [subprocess.Popen(seg.argv(i, [sys.executable, "-c", SENDER, seg.addr[i],
                                                 group, f"ns{i}", str(port)]),
                                    stdin=subprocess.PIPE, text=True) for i in range(2)]
        got: list[str] = []

        def send(i: int, token: str) -> None:
            senders[i].stdin.write(token + "\n")
            senders[i].stdin.flush()

        def until(what: str, i: int, token: str) -> None:
            """Send `token` from namespace i until it arrives (a deadline)."""
            deadline = time.monotonic() + 30
            while f"ns{i} {token}" not in got:
                assert time.monotonic() < deadline, f"{what}: received {got[-10:]}"
                send(i, token)
                try:
                    got.append(rx.recv(100).decode())
                except TimeoutError:
                    pass
        try:
            until("namespace 0 before the cut", 0, "a")
            until("namespace 1 before the cut", 1, "a")
            seg.cut(0)
            assert seg.is_cut(0) and not seg.is_cut(1)
            send(0, "cut")
            for k in range(20):                 # namespace 1 still delivers, 0 does not
                until("namespace 1 with 0 cut", 1, f"b{k}")
            assert "ns0 cut" not in got
            seg.heal(0)
            until("namespace 0 healed", 0, "healed")
        finally:
            for p in senders:
                p.stdin.close()
                p.wait(timeout=30)
            rx.close()
    assert seg.leftovers() == []
