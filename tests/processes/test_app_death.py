"""An application that dies while its agent lives: the OOM killer's SIGKILL, a crash.

The app is the replica's big process (a JVM beside it, a Python heap): the kernel's OOM
killer takes it, not the agent. Its death must look to the clients like its machine's:
a backup takes over and every connection goes on. Until 2026-12-03 the primary's agent
read the ends of its app's sockets (the kernel closes a dying process's descriptors)
before the app's exit status, took them for closes the app made, and framed a FIN or
RST on every stream: all 16 clients of a 3-replica echo group lost their connections
at once, and the backups, which follow the primary's entries, could not undo it.

Real processes: 3 `llft run` replicas of examples/echo.py started together (default
configuration), the gateway, 8 clients on persistent connections and 8 making a
connection per request, every reply checked. SIGKILL of the primary's app, then of a
backup's app.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading

import psutil
import pytest

from llft.tools import memcgroup
from llft import EXAMPLES_DIR
from llft.tools.cluster import LocalCluster
from llft.tools.loadclient import run_load
from membership.core import short_id
from polling import wait_for
from test_no_leftovers import assert_all_gone, tree

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "programs")

ECHO = [sys.executable, os.path.join(EXAMPLES_DIR, "echo.py"), "9000"]
STEP_BYTES = 200_000        # request bytes the primary delivers between the steps


def _load(host: str, port: int, mode: str, stop: threading.Event, out: dict):
    t = threading.Thread(target=lambda: out.setdefault(mode, run_load(
        host, port, clients=8 if mode != "counter" else 4, requests=10 ** 9, mode=mode,
        size=1024, timeout_s=60, stop=stop)), daemon=True)
    t.start()
    return t


def _wait_delivered(lc: LocalCluster, more: int, loads) -> None:
    target = lc.primary_delivered_bytes() + more
    lc.wait_status(lambda st: lc.primary_delivered_bytes() >= target
                   or not all(t.is_alive() for t in loads), 120,
                   f"{more} more request bytes delivered at the primary")
    assert all(t.is_alive() for t in loads), "a load ended early"


def _kill_app(lc: LocalCluster, member: dict) -> tuple[str, list[psutil.Process]]:
    """SIGKILL of `member`'s application alone; its agent's name and whole tree."""
    name = lc.name_of(member["agent_pid"])
    procs = [psutil.Process(member["agent_pid"])] + tree(member["agent_pid"])
    os.kill(member["app_pid"], signal.SIGKILL)
    return name, procs


def test_an_application_killed_alone_is_a_failover_no_client_sees(tmp_path):
    with LocalCluster(str(tmp_path)) as lc:
        host, port = lc.start_service(("r1", "r2", "r3"), ECHO)
        stop, results = threading.Event(), {}
        loads = [_load(host, port, mode, stop, results) for mode in ("echo", "echo_conn")]
        _wait_delivered(lc, STEP_BYTES, loads)

        # the primary's app: its agent stops with the app's status and says LEAVE, so
        # the senior backup takes over at once (not after its detector); the streams
        # go on there
        old = lc.primary()
        name, procs = _kill_app(lc, old)
        assert lc.procs[name].wait(timeout=60) == 128 + signal.SIGKILL, lc.log_tail(name)
        new = lc.wait_primary(other_than=old["birth"])
        assert f"took over: primary {short_id(old['birth'])} of view {old['pvn']} left" \
            in lc.log_tail(lc.name_of(new["agent_pid"]), 100_000)
        assert_all_gone(procs)
        _wait_delivered(lc, STEP_BYTES, loads)

        # a backup's app: its primary removes it at once and serves on alone
        backup = next(m for m in lc.status()["members"] if m["role"] == "backup")
        name, procs = _kill_app(lc, backup)
        assert lc.procs[name].wait(timeout=60) == 128 + signal.SIGKILL, lc.log_tail(name)
        st = lc.wait_members(1)
        assert st["primary"] == new["birth"], "the primary was not replaced"
        assert_all_gone(procs)
        _wait_delivered(lc, STEP_BYTES, loads)

        stop.set()
        for t in loads:
            t.join(timeout=120)
        for mode in ("echo", "echo_conn"):
            r = results[mode]
            assert r.ok and not r.errors, (mode, r.errors[:5])
            assert r.replies == r.requests > 0, mode
        st = lc.status()
        # one change of primary (the backup's removal keeps the primary's view)
        assert st["view"] == new["pvn"] == old["pvn"] + 1
        assert all(m["diverged"] is None for m in st["members"])


ENGINE_APP = [sys.executable, os.path.join(PROGRAMS, "engine_app.py"), "9000"]
ENGINE_LIMIT_BYTES = 96 << 20       # the primary's engine: ~10 MB now, OOM-killed at LEAK


def _ask(addr: tuple[str, int], line: str, timeout_s: float = 60) -> str:
    with socket.create_connection(addr, timeout=timeout_s) as s:
        s.sendall(line.encode() + b"\n")
        return s.makefile("rb").readline().decode().strip()


def _check_child_failover(lc: LocalCluster, old: dict, procs: list[psutil.Process], why: str,
                          loads, stop: threading.Event, results: dict) -> dict:
    """`old`'s agent stopped (71) for the death of its app's child, saying `why`, and
    left nothing behind; its backup took over at its LEAVE and served on; every reply
    of the counter load right, no member diverged. The group's status after."""
    name = lc.name_of(old["agent_pid"])
    assert lc.procs[name].wait(timeout=60) == 71, lc.log_tail(name)
    assert_all_gone(procs)
    assert f"{why}: this replica stops" in lc.log_tail(name, 100_000), lc.log_tail(name)
    new = lc.wait_primary(other_than=old["birth"])
    assert f"took over: primary {short_id(old['birth'])} of view {old['pvn']} left" \
        in lc.log_tail(lc.name_of(new["agent_pid"]), 100_000)
    _wait_delivered(lc, STEP_BYTES // 10, loads)
    stop.set()
    loads[0].join(timeout=120)
    r = results["counter"]
    assert r.ok and not r.errors, r.errors[:5]
    assert r.replies == r.requests > 0 and r.global_repeats == 0
    st = lc.status()
    assert all(m["diverged"] is None for m in st["members"])
    # `llft status` lists it as departed, with why
    assert [d["failure"] for d in st["departed"] if d["birth"] == old["birth"]] == [why]
    return st


def _failover_after(lc: LocalCluster, addr, old: dict, procs: list[psutil.Process],
                    engine: int, sig: int, why: str) -> dict:
    """`sig` to the primary's `engine` from outside, 4 counter clients started right
    after: `_check_child_failover`'s checks, `why` said."""
    os.kill(engine, sig)
    stop, results = threading.Event(), {}
    loads = [_load(addr[0], addr[1], "counter", stop, results)]
    return _check_child_failover(lc, old, procs, why, loads, stop, results)


@pytest.mark.skipif(memcgroup.why_not() is not None, reason=str(memcgroup.why_not()))
def test_a_process_of_the_application_taken_by_the_oom_killer_is_a_failover(tmp_path):
    """A PySpark driver's JVM is the replica's biggest process: the OOM killer's pick.
    Its app sees the death first (its private connection to it ends) and would fail its
    requests and close its clients' connections; every replica would repeat that after a
    takeover. The agent watches the app's children (pidfds) and tells the OOM killer's
    kill from the app's own (the kernel's count rose), stops the app before anything
    it made of the death is drained or sent, and leaves: the backup takes over, and the
    very request that made the primary's engine run out of memory is answered there."""
    with LocalCluster(str(tmp_path)) as lc:
        addr = lc.start_service(("r1", "r2", "r3"), ENGINE_APP)
        stop, results = threading.Event(), {}
        loads = [_load(addr[0], addr[1], "counter", stop, results)]
        lc.wait_status(lambda st: all(m["sync"] in ("primary", "ready")
                                      for m in st["members"]), 120, "backups ready")
        _wait_delivered(lc, STEP_BYTES // 10, loads)
        old = lc.primary()
        name = lc.name_of(old["agent_pid"])
        engine = wait_for(lambda: [p.pid for p in psutil.Process(old["app_pid"]).children()],
                          "the primary's engine", 60)[0]
        lc.wait_status(lambda st: any(m["birth"] == old["birth"] and m["counters"].get(
            "children_watched") for m in st["members"]), 30, "the engine watched")
        procs = [psutil.Process(old["agent_pid"])] + tree(old["agent_pid"])
        with memcgroup.MemoryCgroup(ENGINE_LIMIT_BYTES) as cg:
            cg.add(engine)
            # every replica's engine takes 200 MB more; the primary's cannot
            assert _ask(addr, "LEAK 200") == "OK leaked 200"
            assert lc.procs[name].wait(timeout=60) == 71, lc.log_tail(name)
            assert_all_gone(procs)
        _check_child_failover(lc, old, procs, f"the kernel's OOM killer killed process "
                              f"{engine} (python) of the application", loads, stop, results)


def test_a_process_of_the_application_killed_from_outside_is_a_failover(tmp_path):
    """An operator's `kill -9` of a driver's JVM (or a supervisor's, a container's) is
    this replica's failure, as the OOM killer's is; the app's own kill of its engine
    (`RESTART`: SIGKILL and a new engine, as a program does a child that hangs) is every
    replica's doing and changes nothing in the group. The shim notes the signals the app
    sends and the children it reaps; the agent tells the two apart by them. The engine
    killed is one just started, younger than the agent's scan of the app's children
    (once a second): the app's first request meets its end, and the agent, told so by
    the shim, looks for it before anything the app made of it is drained."""
    with LocalCluster(str(tmp_path)) as lc:
        addr = lc.start_service(("r1", "r2", "r3"), ENGINE_APP)
        lc.wait_status(lambda st: len(st["members"]) == 3 and all(
            m["sync"] in ("primary", "ready") and m["counters"].get("children_watched")
            for m in st["members"]), 120, "backups ready, every engine watched")
        view = lc.status()["view"]
        # every replica's app killed its engine: itself, through a shell it ran, by
        # having the engine kill itself; every agent saw each engine end (and watched
        # the next one before the next kill); nobody failed
        for ended, how in enumerate(("", " helper", " self", " term"), 1):
            status = 143 if how == " term" else -9
            assert _ask(addr, "RESTART" + how) == \
                f"OK restarted (the old engine's status {status})"
            st = lc.wait_status(lambda st: len(st["members"]) == 3 and all(
                m["counters"].get("children_ended", 0) >= ended
                and m["counters"].get("children_watched") for m in st["members"]), 60,
                f"every replica's engine {ended} ended, the next one watched")
        assert st["view"] == view and all(p.poll() is None for p in lc.procs.values())

        old = lc.primary()
        procs = [psutil.Process(old["agent_pid"])] + tree(old["agent_pid"])
        assert _ask(addr, "RESTART") == "OK restarted (the old engine's status -9)"
        engine = psutil.Process(old["app_pid"]).children()[0].pid
        st = _failover_after(lc, addr, old, procs, engine, signal.SIGKILL,
                             f"SIGKILL from outside the application killed process {engine} "
                             "(python) of the application")
        assert st["view"] == view + 1 and len(st["members"]) == 2


def test_a_process_of_the_application_told_to_stop_from_outside_is_a_failover(tmp_path):
    """An operator's plain `kill` of a driver's JVM sends SIGTERM: the JVM runs its
    shutdown hooks (it stops the SparkContext, which the driver sees) and exits with
    status 143, which looks like an exit. The engine here handles SIGTERM that way (half
    a second of errors, then 143). Its notes library (native/notes/) notes what its
    handler received, and the primary's agent acts on it at its next drain, before the
    app's reaction to the shutdown is drained: the group fails over as for a kill -9 and
    no client sees the engine's errors."""
    with LocalCluster(str(tmp_path)) as lc:
        addr = lc.start_service(("r1", "r2", "r3"), ENGINE_APP)
        lc.wait_status(lambda st: len(st["members"]) == 3 and all(
            m["sync"] in ("primary", "ready") and m["counters"].get("children_watched")
            for m in st["members"]), 120, "backups ready, every engine watched")
        old = lc.primary()
        procs = [psutil.Process(old["agent_pid"])] + tree(old["agent_pid"])
        engine = psutil.Process(old["app_pid"]).children()[0].pid
        wait_for(lambda: _handles(engine, signal.SIGTERM), "the engine's SIGTERM handler", 60)
        st = _failover_after(lc, addr, old, procs, engine, signal.SIGTERM,
                             f"SIGTERM from outside the application stopped process {engine} "
                             "(python) of the application")
        assert len(st["members"]) == 2


def test_a_grandchild_of_the_application_killed_from_outside_is_a_failover(tmp_path):
    """A program the app runs behind a launcher (a wrapper that waits for it) is the app's
    grandchild; its `kill -9` from outside is this replica's failure as a child's is:
    the agent watches the app's descendants, and the launcher's reap of it is noted
    (native/notes/). (Watching children only, the agent saw the launcher's exit, which
    is no failure; with the reap's note alone it judged the kill a moment later, from
    the note, and could not name the process.)"""
    with LocalCluster(str(tmp_path)) as lc:
        addr = lc.start_service(("r1", "r2", "r3"), ENGINE_APP + ["--launcher"])
        lc.wait_status(lambda st: len(st["members"]) == 3 and all(
            m["sync"] in ("primary", "ready") and m["counters"].get("children_watched") == 2
            for m in st["members"]), 120, "backups ready, every launcher and engine watched")
        old = lc.primary()
        procs = [psutil.Process(old["agent_pid"])] + tree(old["agent_pid"])
        launcher, = psutil.Process(old["app_pid"]).children()
        engine = launcher.children()[0].pid
        st = _failover_after(lc, addr, old, procs, engine, signal.SIGKILL,
                             f"SIGKILL from outside the application killed process {engine} "
                             "(python) of the application")
        assert len(st["members"]) == 2


def _handles(pid: int, sig: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        cgt = next(ln for ln in f if ln.startswith("SigCgt:")).split()[1]
    return bool(int(cgt, 16) & (1 << (sig - 1)))
