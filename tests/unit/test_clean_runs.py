"""Clean runs, in one process: a promotion racing a reset is a no-op, background tasks
have an owner, log lines say when and who, membership changes say why, the process-tree
helpers find and kill a tree (here: a shell's children, no shim, no agent)."""
from __future__ import annotations

import asyncio
import io
import logging
import re
import subprocess
import sys
import threading
import time

import psutil
import pytest

from llft.runtime import logs, proctree
from llft.runtime.agent import Agent
from llft.runtime.application import AppMode, Application
from llft.runtime.tasks import TaskSet
from membership.core import describe_change, short_id
from membership.rules import Key


class _FakeShm:
    """Like determinizer.shm.Shm after close(): every accessor of the block raises the
    cffi TypeError the issue saw."""

    def __init__(self):
        self.closed = False
        self.promoted = False
        self.consumed = 0

    def _check(self):
        if self.closed:
            raise TypeError("initializer for ctype 'void *' must be a cdata pointer, "
                            "not NoneType")

    @property
    def diverged(self):
        self._check()
        return False

    @property
    def group_address(self):
        self._check()
        return None

    def promote(self):
        self._check()
        self.promoted = True

    def drain(self, timeout_ms):
        self._check()
        return b""

    def close(self):
        self.closed = True


class _FakeFeeder:
    def __init__(self, shm):
        self.shm, self.fed_entries, self.stopped = shm, 10, False

    @property
    def consumed(self):
        self.shm._check()
        return self.shm.consumed


def _promoting_app(loop) -> tuple[Application, _FakeShm]:
    app = Application(["true"], "/", 0, on_exit=lambda a, rc: None,
                      on_order_info=lambda: None, on_feed_failed=lambda a, why: None)
    app.loop = loop
    app.shm = shm = _FakeShm()
    app._feeder = _FakeFeeder(shm)
    app._enter(AppMode.BACKUP)
    app.begin_promotion()
    return app, shm


def test_closed_application_never_touches_its_block():
    app, shm = _promoting_app(None)
    stopped = app.stop()
    assert stopped.wait(10) and shm.closed and app.closed
    assert app.caught_up() is False
    app.promote()                                 # a no-op, no TypeError
    assert not shm.promoted and app.mode is AppMode.PROMOTING
    assert app.drain() == b"" and not app.diverged and app.group_address is None
    assert app.consumed_entries is None
    app.feed(b"x")
    assert app._feed_queue.empty()
    assert app.stop() is stopped                  # twice is harmless


def test_promotion_after_reset_is_a_no_op():
    """The issue's race, made deterministic: the promotion waits for the app to catch up,
    the replica is reset meanwhile (its app stopped, the block unmapped), the promotion
    wakes up. It must end quietly, never reading the block."""
    async def scenario():
        loop = asyncio.get_running_loop()
        app, shm = _promoting_app(loop)
        agent = Agent.__new__(Agent)              # only what _promote reads
        agent.app, agent.stop_event = app, asyncio.Event()
        failures = []
        tasks = TaskSet(logging.getLogger("test"), lambda name, exc: failures.append(exc))
        task = tasks.spawn(agent._promote(3, app), "promote-view-3")
        await asyncio.sleep(0.01)                 # the promotion is waiting (consumed < fed)
        assert not task.done()
        stopped = app.stop()                      # the reset
        await asyncio.to_thread(stopped.wait, 10)
        assert shm.closed
        shm.consumed = 10                         # would look caught up, if it were read
        await asyncio.wait_for(task, 5)
        assert failures == [] and not shm.promoted and app.mode is AppMode.PROMOTING
    asyncio.run(scenario())


def test_task_set_logs_and_hands_over_failures(caplog):
    async def scenario():
        seen = []
        ts = TaskSet(logging.getLogger("llft.test"), lambda name, exc: seen.append((name, exc)))

        async def boom():
            raise ValueError("bad")

        async def forever():
            await asyncio.Event().wait()
        t1 = ts.spawn(boom(), "boom")
        t2 = ts.spawn(forever(), "forever")
        await asyncio.wait([t1])
        await asyncio.sleep(0)
        ts.cancel_all()
        await asyncio.wait([t2])
        await asyncio.sleep(0)
        return seen, len(ts)
    with caplog.at_level(logging.ERROR):
        seen, left = asyncio.run(scenario())
    assert [(n, type(e)) for n, e in seen] == [("boom", ValueError)]   # cancel: no failure
    assert left == 0
    assert "task boom failed: ValueError: bad" in caplog.text


def test_loop_handler_logs_what_asyncio_would_print(caplog):
    def boom():
        raise KeyError("lost")

    async def scenario():
        loop = asyncio.get_running_loop()
        logs.install_loop_handler(loop, logging.getLogger("llft.test"))
        loop.call_soon(boom)
        await asyncio.sleep(0.01)
    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    rec = next(r for r in caplog.records if r.name == "llft.test")
    assert "Exception in callback" in rec.getMessage() and "boom" in rec.getMessage()
    assert rec.exc_info and rec.exc_info[0] is KeyError


def test_log_lines_carry_utc_time_and_name():
    out = io.StringIO()
    logs.setup("counter/3fa2c1", stream=out)
    try:
        log = logging.getLogger("llft.run")
        log.info("view 2.0: primary")
        logs.set_name(logs.replica_name("counter", 0xabcdef0123))
        log.warning("late")
        try:
            raise RuntimeError("x")
        except RuntimeError:
            log.exception("failed")
    finally:
        logging.getLogger().handlers.clear()
    lines = out.getvalue().splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.fullmatch(stamp + r" counter/3fa2c1 view 2\.0: primary", lines[0]), lines[0]
    assert re.fullmatch(stamp + r" counter/abcdef warning: late", lines[1]), lines[1]
    assert re.fullmatch(stamp + r" counter/abcdef error: failed", lines[2]), lines[2]
    assert lines[3].startswith("Traceback") and lines[-1] == "RuntimeError: x"


def test_membership_changes_say_who_came_and_went():
    a, b, c = Key(1, 0xaaaaaa11), Key(2, 0xbbbbbb22), Key(3, 0xcccccc33)
    assert short_id(0xaaaaaa11) == "aaaaaa"
    assert describe_change([a, b], [a, b, c]) == "admitted cccccc"
    assert describe_change([a, b, c], [a, c]) == "removed bbbbbb"
    assert describe_change([a], [a]) == "changed nothing"


def test_kill_tree_takes_the_session_and_the_escapees():
    """A shell in its own session with a child in the session and one that escaped into a
    session of its own: the snapshot plus the session scan kill both."""
    sh = subprocess.Popen(["sh", "-c", "sleep 1002 & setsid sleep 1003 & wait"],
                          start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(kids := proctree.descendants(sh.pid)) < 2:
            assert time.monotonic() < deadline, "the shell's children did not start"
            time.sleep(0.01)            # polling a condition, with a deadline
        victims = proctree.tree(sh.pid, sh.pid)
        assert {p.pid for p in victims} >= {sh.pid} | {k.pid for k in kids}
        left = proctree.kill_tree(victims, [sh.pid], grace_s=0.5)
        sh.wait(5)
        assert left == [] and proctree.session_members([sh.pid]) == []
        assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)
    finally:
        if sh.poll() is None:
            sh.kill()
            sh.wait()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_a_stopped_app_drops_its_feed_queue_at_once():
    """A backup's app reset while the agent still queued thousands of chunks for it: the
    feed thread must not push each into the dead app's full rings (each push waits out the
    ring's timeout: SIGTERM of a catching-up agent took minutes)."""
    from determinizer.orderinfo import CALL_IDS, Entry, encode
    from determinizer.shm import Shm
    clock = (1 << 56) | 1
    app = Application(["true"], "/", 0, on_exit=lambda a, rc: None,
                      on_order_info=lambda: None, on_feed_failed=lambda a, why: None)
    app.shm = Shm.create(Shm.BACKUP)
    app._feeder = app.shm.feeder()
    n = 0
    while True:                                   # thread 0's ring full: nobody consumes
        try:
            app._feeder.push(encode([Entry(tid=0, call=CALL_IDS["clock_gettime"], op=clock,
                                           n=n, ret=n)]), timeout_s=0.3)
            n += 1
        except TimeoutError:
            break
    app._enter(AppMode.BACKUP)
    app._feed_thread = threading.Thread(target=app._feed_loop, daemon=True)
    app._feed_thread.start()
    chunk = encode([Entry(tid=0, call=CALL_IDS["clock_gettime"], op=clock, n=0, ret=0)])
    for _ in range(2000):                         # >= 200 s of ring timeouts without the fix
        app.feed(chunk)
    stopped = app.stop()
    assert stopped.wait(30) and not app._feed_thread.is_alive()
