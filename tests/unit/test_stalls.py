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
