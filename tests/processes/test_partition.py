"""Replicas in separate network namespaces; links cut and healed (llft/tools/netns.py).

Three `llft run` replicas of examples/kv_counter.py, each in a namespace of its own on a
private bridge, the default configuration (`interface` = the namespace's address); the
gateway in the root namespace (on the bridge's address); counter clients checking every
reply through it. Cut the primary's link: the two backups exclude it and one takes over;
the clients' replies stay exactly-once and in order. Heal: the old primary, which went on
as primary of its own branch, learns the other branch has precedence, resets (a new birth,
its application restarted) and rejoins as a backup. A backup's link cut: its detector
fires, but no remote group answers its probes, so it holds its takeover (it must not found
a branch of its own); healed, it learns it was removed and rejoins as a backup.
Every wait is on a condition read from the status files, with a deadline.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import pytest

from llft import EXAMPLES_DIR
from llft.runtime.status import read_files, render
from llft.tools import netns
from llft.tools.cluster import ClusterError, LocalCluster
from llft.tools.loadclient import BackgroundLoad

COUNTER = [sys.executable, os.path.join(EXAMPLES_DIR, "kv_counter.py"), "9000"]
NAMES = ("r0", "r1", "r2")
WAIT_S = 120                    # a generous deadline: the machine is shared and loaded

_why_not = netns.available()
pytestmark = pytest.mark.skipif(_why_not is not None, reason=_why_not or "")


def agents(lc: LocalCluster) -> list[dict]:
    """Every live agent's own status (each branch of a partition writes its own view)."""
    return read_files(lc.cfg.status_dir(lc.group))[0]


def wait_for(predicate, what: str, lc: LocalCluster, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate(agents(lc))
        if got:
            return got
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s} s waiting for {what}; agents: "
                               + "; ".join(f"pid {a.get('agent_pid')} {a.get('role')} "
                                           f"pvn {a.get('pvn')} app {a.get('app_mode')} "
                                           f"members {len(a.get('members', []))}"
                                           for a in agents(lc)))
        time.sleep(0.02)        # polling status files, with a deadline


def serving_primary(without_pid: int, size: int):
    """A predicate: the primary (not agent `without_pid`) of a view of `size` members,
    its application promoted, every member of that view running its application."""
    def pred(ags: list[dict]):
        by_birth = {a["birth"]: a for a in ags}
        for a in ags:
            if (a.get("role") != "primary" or a.get("agent_pid") == without_pid
                    or a.get("app_mode") != "primary" or len(a.get("members", [])) != size):
                continue
            ms = [by_birth.get(m["birth"]) for m in a["members"]]
            if all(m and m.get("pvn") == a.get("pvn") and m.get("app_pid")
                   and m.get("app_mode") in ("primary", "backup") for m in ms):
                return a, ms
        return None
    return pred


def wait_replies(load: BackgroundLoad, more: int, what: str) -> None:
    """The clients get `more` correct replies beyond the present count."""
    target = load.replies() + more
    deadline = time.monotonic() + WAIT_S
    while load.replies() < target:
        assert time.monotonic() < deadline, f"no progress {what}: {load.replies()}/{target}"
        time.sleep(0.02)        # polling the clients' count, with a deadline


def cut_and_heal(seg: netns.Segment, lc: LocalCluster, load: BackgroundLoad,
                 victim: dict, primary_pid: int) -> dict:
    """Cut victim's link, wait for the other two to serve without it and for it to be
    alone in its own branch, heal, wait for it back as a backup of the same primary with
    a new birth; the new view's primary."""
    i = NAMES.index(lc.name_of(victim["agent_pid"]))
    seg.cut(i)
    assert seg.is_cut(i)
    prim, _ = wait_for(serving_primary(victim["agent_pid"], 2),
                       f"a 2-member view without {NAMES[i]}", lc)
    assert victim["birth"] not in [m["birth"] for m in prim["members"]]
    if primary_pid != victim["agent_pid"]:
        assert prim["agent_pid"] == primary_pid      # a backup cut: the primary stays
    wait_replies(load, 50, f"with {NAMES[i]} cut off")
    if victim.get("role") == "primary":
        # the cut-off primary, hearing no one, ends as the primary of a view of itself
        # alone: heal only then, so the heal is a meeting of two primaries
        wait_for(lambda ags: any(a.get("agent_pid") == victim["agent_pid"]
                                 and a.get("role") == "primary"
                                 and len(a.get("members", [])) == 1
                                 for a in ags), f"{NAMES[i]} alone in its own branch", lc)
    else:
        # a cut-off backup's detector fires, but no remote group answers its probes: it
        # must not take over a branch of its own (membership/core.py "Takeover needs
        # evidence"); heal while it holds
        wait_for(lambda ags: any(a.get("agent_pid") == victim["agent_pid"]
                                 and (a.get("takeover") or {}).get("held")
                                 for a in ags), f"{NAMES[i]} holding its takeover", lc)
        me = next(a for a in agents(lc) if a.get("agent_pid") == victim["agent_pid"])
        assert me["role"] == "backup" and me["pvn"] == victim["pvn"], me
        assert "takeover held" in render(lc.status())      # what `llft status` shows
    seg.heal(i)
    prim2, ms = wait_for(serving_primary(-1, 3), f"{NAMES[i]} back as a backup", lc)
    assert prim2["agent_pid"] == prim["agent_pid"]   # the healed branch does not take over
    back = next(m for m in ms if m["agent_pid"] == victim["agent_pid"])
    assert back["role"] == "backup" and back["birth"] != victim["birth"]
    assert "reset (" in lc.log_tail(NAMES[i], 10 ** 7)
    wait_replies(load, 50, f"after {NAMES[i]} healed")
    return prim2


@contextlib.contextmanager
def partitioned_service(tmp_path):
    """3 replicas, each in its own namespace, started together; the gateway in the root
    namespace; 2 counter clients under way. Yields (segment, cluster, load); then checks
    every reply, and that nothing is left behind (processes, namespaces, links)."""
    stop = threading.Event()
    with netns.Segment(len(NAMES)) as seg:
        with LocalCluster(str(tmp_path)) as lc:
            for i, name in enumerate(NAMES):
                lc.start_replica(name, COUNTER, config_path=lc.config_for(seg.addr[i]),
                                 wrap=lambda argv, i=i: seg.argv(i, argv))
            lc.wait_members(len(NAMES), timeout_s=WAIT_S)
            host, port = lc.start_gateway(config_path=lc.config_for(seg.host_addr),
                                          timeout_s=60)
            load = BackgroundLoad(host, port, after=50, clients=2, requests=10 ** 9,
                                  mode="counter", timeout_s=WAIT_S, stop=stop)
            try:
                assert load.under_way.wait(WAIT_S), "the load did not start"
                yield seg, lc, load
            finally:
                stop.set()          # on a failure, stopping the gateway ends the clients
            r = load.result(WAIT_S)
            assert r.ok, (r.error_count, r.errors)
            assert r.replies == r.requests and r.replies >= 150
            assert r.global_repeats == 0
            st = lc.status()
            assert st["departed"] == [], st["departed"]
            assert all(m["diverged"] is None for m in st["members"]), st["members"]
            assert all(lc.alive(n) for n in NAMES)   # partitions reset, never kill, agents
        assert all(p.poll() is not None for p in lc.procs.values())
    assert seg.leftovers() == []


def test_cut_primary_and_heal(tmp_path):
    """The primary cut off: a backup takes over; healed, the old primary (the lower
    precedence of the two primaries that meet) resets and rejoins as a backup."""
    with partitioned_service(tmp_path) as (seg, lc, load):
        first = next(a for a in agents(lc) if a.get("role") == "primary")
        prim = cut_and_heal(seg, lc, load, first, first["agent_pid"])
        assert prim["agent_pid"] != first["agent_pid"]          # a backup took over


def test_cut_backup_and_heal(tmp_path):
    """A backup cut off: the primary goes on without it; the backup's detector fires but
    it holds its takeover (no remote group says the primary is silent there: it hears
    none); healed, it learns it was removed, resets and rejoins as a backup of the same
    primary. (Before "takeover needs evidence" it took over a branch of its own with a
    higher precedence, which won on the heal and rolled back replies the clients had.)"""
    with partitioned_service(tmp_path) as (seg, lc, load):
        prim = next(a for a in agents(lc) if a.get("role") == "primary")
        backup = next(a for a in agents(lc) if a.get("role") == "backup")
        cut_and_heal(seg, lc, load, backup, prim["agent_pid"])
