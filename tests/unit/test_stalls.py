"""The opt-in stall tracer (llft/runtime/stalls.py): a loop turn longer than the threshold
gets the loop thread's Python stack logged, once per stall; a bad value is one warning."""
from __future__ import annotations

import asyncio
import logging
import time

from llft.runtime import stalls


def _blocking_step():
    time.sleep(1.0)           # stands for a call that waits on the machine


def test_a_long_loop_turn_is_logged_with_where_it_stood(monkeypatch, caplog):
    monkeypatch.setenv(stalls.ENV, "50")
    log = logging.getLogger("test-stalls")

    async def main():
        assert stalls.start_from_env(asyncio.get_running_loop(), log)
        await asyncio.sleep(0.1)
        _blocking_step()
        await asyncio.sleep(0.1)   # the tracer's marker runs: the stall is over

    with caplog.at_level(logging.INFO, logger="test-stalls"):
        asyncio.run(main())
    reports = [r.getMessage() for r in caplog.records
               if "event loop busy for more than 50 ms" in r.getMessage()]
    assert len(reports) == 1, reports          # one report for one stall
    assert "_blocking_step" in reports[0]


def test_off_by_default_and_a_bad_value_is_one_warning(monkeypatch, caplog):
    log = logging.getLogger("test-stalls")
    loop = asyncio.new_event_loop()
    try:
        monkeypatch.delenv(stalls.ENV, raising=False)
        assert not stalls.start_from_env(loop, log)
        monkeypatch.setenv(stalls.ENV, "soon")
        with caplog.at_level(logging.WARNING, logger="test-stalls"):
            assert not stalls.start_from_env(loop, log)
        assert [r.getMessage() for r in caplog.records] == [
            "LLFT_STALL_TRACE='soon' is not a number of milliseconds: no stall tracing"]
    finally:
        loop.close()


def test_a_late_wake_up_says_whether_the_thread_ran_waited_or_was_off_a_cpu():
    """`stood_still` splits a stall into the loop thread's CPU time, its wait for a CPU
    and the rest: a busy turn shows as ran, a blocking call as off a CPU."""
    before = stalls.thread_times()
    if before is None:
        import pytest
        pytest.skip("no /proc/thread-self/schedstat on this kernel")
    t = time.monotonic()
    end = t + 0.15
    while time.monotonic() < end:      # a busy loop turn
        pass
    time.sleep(0.15)                   # a call that waits on the machine
    elapsed = time.monotonic() - t
    text = stalls.stood_still(elapsed, before, stalls.thread_times())
    ms = [float(x) for x in __import__("re").findall(r"(\d+) ms", text)]
    total, ran, waited, rest = ms[0], ms[1], ms[2], ms[3]
    assert ran + waited >= 140, text   # the busy part: on a CPU or waiting for one
    assert rest >= 140, text           # the sleep: off a CPU
    assert abs(ran + waited + rest - total) <= 2, text
    assert stalls.stood_still(1.0, None, before) == ""
