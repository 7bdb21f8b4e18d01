"""Membership across real OS processes on loopback multicast (llft/tools/membership_demo.py).

Each replica is `python -m llft.tools.membership_demo`; the test waits on the JSON status lines
they print (never on fixed sleeps). Timing is loosened (heartbeat 10 ms, base timeout
100 ms) because the test machine is shared; the protocol is the same.
"""
from __future__ import annotations

import signal

import pytest

from llft.runtime import keys
from llft.tools.procs import ProcGroup, random_group_addresses

WAIT_S = 20


@pytest.fixture
def group(tmp_path):
    key = tmp_path / "cluster.key"
    keys.write_key(str(key))
    pg = ProcGroup(str(tmp_path))
    args = ["--group", "G", "--key", str(key), "--addresses", random_group_addresses(["G"]),
            "--heartbeat-ms", "10", "--timeout-ms", "100"]

    class Replicas:
        def start(self, name):
            pg.python(name, "llft.tools.membership_demo", *args)

        def last(self, name) -> dict:
            ev = [e for e in pg.procs[name].events if e.get("event") == "status"]
            return ev[-1] if ev else {}

        def wait(self, pred, what):
            assert pg.wait(pred, WAIT_S), (what, {n: self.last(n) for n in pg.procs},
                                           {n: pg.stderr(n)[-800:] for n in pg.procs})

        def kill(self, name):
            pg.signal(name, signal.SIGKILL)
            pg.procs[name].popen.wait()

        def agreed(self, names, n_members):
            snaps = [self.last(n) for n in names]
            return (all(s.get("status") in ("primary", "backup") for s in snaps)
                    and sum(s["status"] == "primary" for s in snaps) == 1
                    and len({(s["pvn"], s["change"], str(s["members"])) for s in snaps}) == 1
                    and len(snaps[0]["members"]) == n_members)

    try:
        yield Replicas()
    finally:
        pg.stop_all()


def test_three_processes_elect_fail_over_remove_and_readmit(group):
    group.start("a")
    group.wait(lambda: group.last("a").get("status") == "primary", "a founds the group")
    group.start("b")
    group.start("c")
    group.wait(lambda: group.agreed("abc", 3), "b and c join")
    assert group.last("a")["status"] == "primary"
    old_pvn = group.last("a")["pvn"]
    successor = min("bc", key=lambda n: group.last(n)["precedence"])

    group.kill("a")                                       # the primary dies
    group.wait(lambda: group.agreed("bc", 2) and group.last("b")["pvn"] > old_pvn,
               "survivors agree on a new primary")
    assert group.last(successor)["status"] == "primary"   # rank 2 succeeds

    backup = "c" if successor == "b" else "b"
    group.kill(backup)                                    # a backup dies
    group.wait(lambda: group.agreed(successor, 1), "the primary removes it")
    highest = max(p for _, p in group.last(successor)["members"])

    group.start("d")                                      # a restarted replica rejoins
    group.wait(lambda: group.agreed([successor, "d"], 2), "d joins")
    assert group.last("d")["status"] == "backup"
    assert group.last("d")["precedence"] > max(highest, 3)   # precedences never reused


def test_two_processes_fail_over(group):
    group.start("a")
    group.wait(lambda: group.last("a").get("status") == "primary", "a founds the group")
    group.start("b")
    group.wait(lambda: group.agreed("ab", 2), "b joins")
    group.kill("a")
    group.wait(lambda: group.agreed("b", 1) and group.last("b")["pvn"] == 2,
               "b takes over alone")
