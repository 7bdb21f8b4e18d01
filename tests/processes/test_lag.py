"""Bounded backup lag with real replicas (docs/LOG.md): `llft run` agents over UDP
multicast, the preload shim in examples/ticker.py (a process that makes order
information on its own, every 2 ms), a backup's application slowed by SIGSTOP.

What is checked (counts and bounds read from `llft status`, no timings):
  * a stopped backup's lag is reported by the primary and crosses the bound; the primary
    then holds its application (backpressure): its order info stops growing while held;
  * the primary killed while held: the backup takes over after replaying only the
    backlog it had when the hold began (nothing the held primary made meanwhile);
  * a backup that stays beyond the bound past the give-up time is released (a log line
    says why): the primary runs on without it; once back within the bound it is ready
    again, the same member (a busy machine is not a dead peer: no reset);
  * a joiner whose application still replays the history it joined with says so in its
    heartbeats, and its primary then waits longest on it (floor + cap): a 300 ms pause of
    its agent, longer than the floor (200 ms), does not get it removed;
  * the mechanism itself: a primary's application under the shim makes no entry while
    its block is held (`Shm.hold`), and continues once released.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

import pytest

from llft import EXAMPLES_DIR
from llft.replica.node import LAG_BOUND_US
from llft.runtime.agent import HANDOFF_STALL_S
from llft.tools.cluster import LocalCluster

DEADLINE_S = 60.0

TICKER = [sys.executable, os.path.join(EXAMPLES_DIR, "ticker.py"), "2"]
BOUND_MS = LAG_BOUND_US / 1000


def by_rank(st: dict, rank: int) -> dict | None:
    return next((m for m in st["members"] if m["rank"] == rank), None)


def ready_backup(st: dict) -> bool:
    b = by_rank(st, 2)
    return bool(b and b["sync"] == "ready" and b["lag_ready"]
                and b["lag_ms"] < BOUND_MS)


def events(lc: LocalCluster, birth: int) -> list[dict]:
    path = os.path.join(lc.cfg.status_dir(lc.group), f"{birth:x}.json")
    with open(path) as f:
        return json.load(f)["events"]


def two_replicas(lc: LocalCluster) -> dict:
    lc.start_replica("r1", TICKER)
    lc.wait_members(1)
    lc.start_replica("r2", TICKER)
    lc.wait_members(2)
    return lc.wait_status(ready_backup, 60, "a ready backup within the lag bound")


@contextlib.contextmanager
def a_stopped_backup(lc: LocalCluster):
    """Two replicas, the backup ready; its application SIGSTOPped inside the block
    (SIGCONT at its end). Yields the backup's status line."""
    backup = by_rank(two_replicas(lc), 2)
    os.kill(backup["app_pid"], signal.SIGSTOP)
    try:
        yield backup
    finally:
        os.kill(backup["app_pid"], signal.SIGCONT)


def test_a_stopped_backup_holds_the_primary_and_takes_over_with_only_its_backlog(tmp_path):
    with LocalCluster(str(tmp_path), group="ticker") as lc:
        with a_stopped_backup(lc) as backup:
            st = lc.wait_status(lambda s: by_rank(s, 1)["lag_held"], 60, "backpressure")
            prim, b = by_rank(st, 1), by_rank(st, 2)
            assert prim["counters"]["lag_holds"] >= 1
            assert b["lag_ms"] >= BOUND_MS
            out_at_hold = prim["counters"]["oi_chunks_out"]
            # the backup stays stopped for another bound's worth of its lag; the held
            # primary makes (almost) nothing meanwhile: at most the pieces that were in
            # its shim's ring when the hold began
            st = lc.wait_status(lambda s: (by_rank(s, 2)["lag_ms"] or 0) >= 2 * BOUND_MS
                                and by_rank(s, 1)["lag_held"], 60, "a longer lag")
            prim, b = by_rank(st, 1), by_rank(st, 2)
            assert prim["counters"]["oi_chunks_out"] - out_at_hold <= 2
            fed_at_kill = b["counters"].get("oi_entries_in", 0)
            backlog = b["app_lag_entries"]
            assert backlog is not None and backlog > 0
            old = lc.kill_primary()
        new = lc.wait_primary(other_than=old["birth"])
        assert new["birth"] == backup["birth"]
        promoted = [e for e in events(lc, new["birth"]) if e["event"] == "promoted"][-1]
        # what it replayed after the view change is at most the backlog it had at the
        # kill: nothing arrived from the held primary (and it fed nothing new)
        assert promoted["replayed"] <= backlog
        st = lc.status()
        assert by_rank(st, 1)["counters"].get("oi_entries_in", 0) == fed_at_kill
        # the line names the backup held for
        assert f"backpressure: backup {backup['birth_hex']} is" in lc.log_tail(old["name"], 20000)


def test_a_backup_beyond_the_bound_too_long_is_released_and_ready_again_later(tmp_path):
    with LocalCluster(str(tmp_path), group="ticker") as lc:
        with a_stopped_backup(lc) as backup:
            st = lc.wait_status(
                lambda s: by_rank(s, 1)["counters"].get("node_lag_released", 0) >= 1
                and not by_rank(s, 1)["lag_held"], 120, "the slow backup released")
            out = by_rank(st, 1)["counters"]["oi_chunks_out"]
            # no longer held for: the primary runs on while the backup is still stopped
            st = lc.wait_status(lambda s: by_rank(s, 1)["counters"]["oi_chunks_out"]
                                > out + 10, 60, "the primary running on")
            assert by_rank(st, 2)["lag_ready"] is False
        # it catches up and is ready (held for) again: the same member, never reset
        st = lc.wait_status(ready_backup, 120, "the released backup ready again")
        assert by_rank(st, 2)["birth"] == backup["birth"]
        primary_log = lc.log_tail(lc.name_of(by_rank(st, 1)["agent_pid"]), 20000)
        assert "is no longer held for: its application stayed more than" in primary_log
        assert "reset (" not in lc.log_tail(lc.name_of(backup["agent_pid"]), 20000)


@contextlib.contextmanager
def a_joiner_stopped_replaying(lc: LocalCluster):
    """r1 with a history, then r2 joining it, stopped while it replays that history
    (`a_joiner_stopped`). Each tick does work a replaying backup redoes, so the replay
    lasts seconds: long enough to be seen "catching-up" and stopped there."""
    ticker = [*TICKER, "30000"]
    lc.start_replica("r1", ticker)
    lc.wait_members(1)
    lc.wait_status(lambda s: by_rank(s, 1)["counters"].get("oi_chunks_out", 0) >= 300,
                   60, "a history to replay")
    with a_joiner_stopped(lc, "r2", ticker) as (st, joiner):
        yield st, joiner


@contextlib.contextmanager
def a_joiner_stopped(lc: LocalCluster, name: str, cmd: list[str]):
    """Replica `name` joining the group (rank 2), its application SIGSTOPped while it
    replays the history it joined with (SIGCONT at the block's end), once its primary
    has heard it replay for a second. Yields the status then and the joiner's line."""
    lc.start_replica(name, cmd)
    st = lc.wait_status(lambda s: (b := by_rank(s, 2)) is not None and b["app_pid"]
                        and b["sync"] != "none", 60, "the joiner's application")
    joiner = by_rank(st, 2)
    assert joiner["sync"] == "catching-up", joiner
    os.kill(joiner["app_pid"], signal.SIGSTOP)      # it replays nothing meanwhile
    try:
        # the primary heard it say so, and its state transfer's settling is long over
        st = lc.wait_status(lambda s: (b := by_rank(s, 2)) is not None and b["replaying"]
                            and (b["lag_ms"] or 0) >= 1000, 60,
                            "the primary hearing the joiner replay")
        assert by_rank(st, 2)["birth"] == joiner["birth"]
        yield st, joiner
    finally:
        os.kill(joiner["app_pid"], signal.SIGCONT)


def test_a_joiner_still_replaying_is_not_removed_for_a_pause_longer_than_the_floor(tmp_path):
    # A restarted Spark replica replaying 36,000 entries with a cold JVM had its loop
    # wake 208 ms late; its primary removed it as silent, and it started over with a
    # longer log. Here the joiner's application is stopped during its replay (it stays
    # "catching-up"), then its agent is stopped for 300 ms: past the primary's floor on a
    # backup (2 x fault_timeout_ms), within floor + cap (5 x).
    with LocalCluster(str(tmp_path), group="ticker") as lc:
        with a_joiner_stopped_replaying(lc) as (st, joiner):
            os.kill(joiner["agent_pid"], signal.SIGSTOP)
            try:
                time.sleep(0.3)             # the pause itself (a starved loop), not a wait
            finally:
                os.kill(joiner["agent_pid"], signal.SIGCONT)
        st = lc.wait_status(ready_backup, 120, "the joiner caught up")
        assert by_rank(st, 2)["birth"] == joiner["birth"]
        assert not by_rank(st, 2)["replaying"]
        primary_log = lc.log_tail(lc.name_of(by_rank(st, 1)["agent_pid"]), 20000)
        assert "removed" not in primary_log, primary_log[-2000:]
        assert "reset (" not in lc.log_tail(lc.name_of(joiner["agent_pid"]), 20000)


@pytest.mark.parametrize("resumed", [True, False])
def test_a_primary_asked_to_stop_serves_on_until_its_successor_has_caught_up(tmp_path, resumed):
    """A rolling restart: a backup restarted a moment ago still replays the group's
    history when its primary gets SIGTERM. Leaving at once made the clients wait for
    that replay (`llft chaos --kinds restart`); the primary serves on until its
    successor has caught up, then leaves (status 0) and the successor takes over. Here
    the joiner's application is stopped mid-replay, so the primary must still be
    serving when it is let go (`resumed`); left stopped, its lag does not shrink, and the
    primary gives up on it after HANDOFF_STALL_S and leaves all the same."""
    with LocalCluster(str(tmp_path), group="ticker") as lc:
        with a_joiner_stopped_replaying(lc) as (st, joiner):
            old = by_rank(st, 1)
            lc.procs["r1"].send_signal(signal.SIGTERM)
            _until(lambda: "serves on until backup" in lc.log_tail("r1"),
                   "the primary saying it serves on")
            # `llft status` says so too
            lc.wait_status(lambda s: by_rank(s, 1)["handing_off"] == f"{joiner['birth']:x}",
                           60, "the primary's status saying it hands off")
            # (promptly: a successor whose lag does not shrink for HANDOFF_STALL_S is
            # given up on, as this one would be, stopped)
            made = by_rank(lc.status(), 1)["counters"]["oi_chunks_out"]
            st = lc.wait_status(lambda s: by_rank(s, 1)["counters"]["oi_chunks_out"]
                                >= made + 10, 60, "the primary serving on")
            assert lc.alive("r1") and by_rank(st, 1)["birth"] == old["birth"]
            if not resumed:
                assert lc.procs["r1"].wait(timeout=60) == 0, lc.log_tail("r1")
                assert "hand-off: the successor is not catching up" in lc.log_tail("r1", 20000)
        assert lc.procs["r1"].wait(timeout=60) == 0, lc.log_tail("r1")
        if resumed:
            assert "hand-off: the successor caught up after" in lc.log_tail("r1", 20000)
        new = lc.wait_primary(other_than=old["birth"])
        assert new["birth"] == joiner["birth"]


def test_a_primary_promoted_a_moment_ago_serves_on_until_a_joiner_replaying_older_views_caught_up(tmp_path):
    """The rolling restart right after a failover, the group idle: the new primary's
    view holds only its promotion's position, so its successor's lag (this view's
    positions) stands still while that joiner replays the older view's history. Giving up
    on it as "not catching up" after HANDOFF_STALL_S made the clients wait for the rest
    of that replay; the primary serves on until it has caught up (handoff_wait_s at most)."""
    ticker = [*TICKER, "30000", "600"]          # 600 ticks of work, then idle
    with LocalCluster(str(tmp_path), group="ticker") as lc:
        lc.start_replica("r1", ticker)
        lc.wait_members(1)
        lc.start_replica("r2", ticker)
        lc.wait_members(2)
        for name in ("r1", "r2"):               # r2's app replayed every tick r1 made
            _until(lambda: "ticker: 600 ticks done" in lc.log_tail(name, 20000),
                   f"{name}'s ticks")
        old = lc.wait_status(ready_backup, 60, "a ready backup")
        lc.kill_primary()
        new = lc.wait_primary(other_than=by_rank(old, 1)["birth"])
        # r3 replays the old view's history
        with a_joiner_stopped(lc, "r3", ticker) as (st, joiner):
            made = by_rank(st, 1)["counters"].get("oi_chunks_out", 0)
            lc.procs["r2"].send_signal(signal.SIGTERM)
            _until(lambda: "serves on until backup" in lc.log_tail("r2"),
                   "the new primary saying it serves on")
            assert "replays older views' history first" in lc.log_tail("r2")
            def past_the_stall_time(s):     # its lag (this view's positions) unchanged
                assert lc.alive("r2"), "left before its successor caught up: " \
                    + lc.log_tail("r2")
                b = by_rank(s, 2)
                return b is not None and (b["lag_ms"] or 0) >= (HANDOFF_STALL_S + 1) * 1000
            st = lc.wait_status(past_the_stall_time, 60, "the joiner's lag growing past "
                                "the stall time")
            assert by_rank(st, 1)["birth"] == new["birth"]
            assert by_rank(st, 1)["handing_off"] == f"{joiner['birth']:x}"
            assert by_rank(st, 1)["counters"].get("oi_chunks_out", 0) == made
        assert lc.procs["r2"].wait(timeout=60) == 0, lc.log_tail("r2")
        assert "hand-off: the successor caught up after" in lc.log_tail("r2", 20000)
        assert lc.wait_primary(other_than=new["birth"])["birth"] == joiner["birth"]
        # r2 again, joining the view the joiner began: once it has replayed its state,
        # its primary sees it behind in nothing (the view's only position is a marker
        # it got as part of the state)
        lc.start_replica("r2", ticker)
        lc.wait_status(lambda s: (b := by_rank(s, 2)) is not None and b["sync"] == "ready"
                       and b["lag_entries"] == 0, 60, "the rejoined replica caught up")


def _until(predicate, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)             # polling the block's counters, with a deadline


def test_a_replica_refused_for_a_full_log_stops_with_one_clear_line(tmp_path):
    """Two replicas started together with a small log cap (docs/LOG.md, "The log's cap"):
    once the group's log is full, a third replica is refused; it stops by itself with the
    primary's reason as one line and exit status 69, instead of applying for ever. The
    group runs on with its two members."""
    from llft.runtime.agent import EXIT_JOIN_REFUSED
    with LocalCluster(str(tmp_path), extra_cluster="log_cap_entries = 500") as lc:
        lc.start_replica("r1", TICKER)
        lc.start_replica("r2", TICKER)
        lc.wait_members(2)
        st = lc.wait_status(lambda st: ((by_rank(st, 1) or {}).get("log") or {}).get("full"),
                            DEADLINE_S, "the primary's log full")
        primary = by_rank(st, 1)["birth"]
        r3 = lc.start_replica("r3", TICKER)
        assert r3.wait(DEADLINE_S) == EXIT_JOIN_REFUSED, lc.log_tail("r3")
        refused = [line for line in lc.log_tail("r3").splitlines() if "refuses" in line]
        assert len(refused) == 1 and "log reached its cap" in refused[0], lc.log_tail("r3")
        st = lc.status()
        assert len(st["members"]) == 2 and by_rank(st, 1)["birth"] == primary
        assert lc.alive("r1") and lc.alive("r2")


def test_a_held_primary_application_makes_no_entry_until_released():
    from determinizer.runner import shim_env, spawn
    from determinizer.shm import Shm
    shm = Shm.create(Shm.PRIMARY)
    proc = spawn(TICKER, shim_env(dict(os.environ), shm.env()))
    try:
        drained = []

        def drain() -> int:
            drained.append(shm.drain(0))
            return shm.stats()["records"]
        _until(lambda: drain() > 10, "the app's first entries")
        shm.hold(True)
        _until(lambda: drain() and shm.stats()["held"] >= 1, "the app held")
        held_at = drain()
        # however long it stays held, it records nothing (its threads wait in the shim)
        assert shm.drain(300) == b""
        assert shm.stats()["records"] == held_at and proc.poll() is None
        shm.hold(False)
        _until(lambda: drain() > held_at, "the app running again")
    finally:
        proc.kill()
        proc.wait()
        shm.close()


def test_the_drain_watcher_wakes_the_loop_for_undrained_entries_and_commit_requests():
    """The primary's native drain watcher (determinizer.shm.DrainWatcher): entries nobody
    drains make its eventfd readable (once per request: after the next drain it may ask
    again), so does an external send that waits for output commit; stopped and joined,
    its thread is gone before the block is unmapped."""
    import select
    from determinizer.runner import shim_env, spawn
    from determinizer.shm import Shm
    from llft.runtime.application import DRAIN_COALESCE_US, DRAIN_WAIT_MS

    def signalled(w) -> tuple[bool, bool]:
        ready, _, _ = select.select([w.fd], [], [], DEADLINE_S)
        assert ready, "the drain watcher never signalled"
        return w.take()

    shm = Shm.create(Shm.PRIMARY)
    w = shm.drain_watcher(DRAIN_COALESCE_US, DRAIN_WAIT_MS)
    proc = spawn(TICKER, shim_env(dict(os.environ), shm.env()))
    try:
        for _ in range(3):                  # asked, drained, asked again
            order_info, commit = signalled(w)
            if order_info:
                assert shm.drain(0)
                w.drained()
        assert order_info and not commit
    finally:
        proc.kill()
        proc.wait()
    # an external send of the primary's app waits for output commit: the watcher says so
    try:
        with _external_client(shm):
            deadline = time.monotonic() + DEADLINE_S
            while True:
                order_info, commit = signalled(w)
                if order_info:
                    shm.drain(0)
                    w.drained()
                if commit:
                    break
                assert time.monotonic() < deadline, "no commit request signalled"
            assert shm.commit_req >= 1
            shm.set_commit(False)           # every waiting send goes on
    finally:
        w.stop()
        w.join()
        shm.close()


@contextlib.contextmanager
def _external_client(shm):
    """tests/programs/ext_client.py under the shim of `shm` with output commit on,
    connected to a server of ours (an external connection: its sends wait for commit)."""
    import socket
    from determinizer.runner import shim_env, spawn
    srv = socket.create_server(("127.0.0.1", 0))
    shm.set_commit(True)
    client = os.path.join(os.path.dirname(__file__), "..", "programs", "ext_client.py")
    proc = spawn([sys.executable, client, str(srv.getsockname()[1])],
                 shim_env(dict(os.environ), shm.env()))
    conn = None
    try:
        conn, _ = srv.accept()              # its connect (kept open while it sends)
        yield
    finally:
        proc.kill()
        proc.wait()
        if conn is not None:
            conn.close()
        srv.close()


COMMIT_DEADLINE_S = 15.0


def test_a_commit_request_cuts_the_drain_watchers_coalescing_short():
    """An external send's commit request is signalled at once even while the watcher
    coalesces entries recorded before it (it naps on the commit word, which the shim
    wakes): here the coalescing interval is far longer than the deadline, so a watcher
    that sat it out (as it did: ~1.5 ms of each external round trip) fails."""
    import select
    from determinizer.shm import Shm

    shm = Shm.create(Shm.PRIMARY)
    w = shm.drain_watcher(2 * COMMIT_DEADLINE_S * 1_000_000, 100)
    try:
        with _external_client(shm):         # its connect is recorded: the watcher naps
            ready, _, _ = select.select([w.fd], [], [], COMMIT_DEADLINE_S)
            assert ready, "the commit request waited for the coalescing interval"
            order_info, commit = w.take()
            assert commit and shm.commit_req >= 1
            shm.set_commit(False)
    finally:
        w.stop()
        w.join()
        shm.close()

