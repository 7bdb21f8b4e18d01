"""`llft status` lists the replicas that stopped with a report: one that diverged, and one
that failed while its agent lived (a process of its application killed: the OOM killer,
a `kill -9` from outside); each says why. Ones that stopped cleanly leave nothing."""
from __future__ import annotations

from llft.runtime.status import render
from test_status_lag import B, P, _agent, _status

GONE = {"agent_start": 1.0}         # a start time no live process has: the agent is gone


def test_a_replica_that_failed_here_is_listed_as_departed_with_why(tmp_path):
    why = "SIGKILL from outside the application killed process 123 (java) of the application"
    st = _status(tmp_path, _agent(P, 1), _agent(B, 2, local_failure=why, **GONE))
    assert st["departed"] == [{"birth": B, "host": "h", "diverged": None, "failure": why}]
    assert f"departed {B:x} on h: {why}" in render(st)


def test_a_diverged_replica_says_so_and_a_clean_stop_leaves_nothing(tmp_path):
    div = {"report": "divergence: ...", "conn": 0, "offset": 5}
    st = _status(tmp_path, _agent(P, 1), _agent(B, 2, diverged=div, **GONE))
    assert f"departed {B:x} on h: diverged {div}" in render(st)
    (tmp_path / "clean").mkdir()
    st = _status(tmp_path / "clean", _agent(P, 1), _agent(B, 2, **GONE))
    assert st["departed"] == []
