"""Waiting on a condition in tests: poll it with a deadline (never a bare sleep as
synchronisation)."""
from __future__ import annotations

import time


def wait_for(cond, what: str, timeout_s: float = 10.0, poll_s: float = 0.005):
    """Polls `cond()` every `poll_s` until it is truthy and returns its value; fails
    (AssertionError naming `what`) after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(poll_s)          # polling a condition, with a deadline
