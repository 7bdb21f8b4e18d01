"""`llft bench join --quick`: structure only (timings never decide pass or fail): a row
per age with the joiner's history, transfer, replay and join times, CSV/markdown (and
the plot when matplotlib is present) written, exit status 0."""
from __future__ import annotations

import csv
import importlib.util
import os

import pytest

from llft.cli import main

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


@pytest.mark.parametrize("workload", ["ticker", "http"])
def test_bench_join_quick(tmp_path, workload):
    """http: the group serves one connection per request all along, so the joiner's
    history is short connections (each a stream its agent connects to its app)."""
    results = str(tmp_path / "results")
    assert main(["bench", "join", "--quick", "--workload", workload,
                 "--results", results]) == 0
    name = "join" if workload == "ticker" else f"join_{workload}"
    with open(os.path.join(results, f"{name}.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        assert int(r["history_entries"]) > 0
        assert float(r["join_s"]) >= float(r["transfer_s"]) >= 0
        assert float(r["replay_s"]) >= 0
        if workload == "http":
            assert int(r["requests"]) > 0
    # the older group has the longer history
    assert int(rows[1]["history_entries"]) > int(rows[0]["history_entries"])
    assert os.path.exists(os.path.join(results, f"{name}.md"))
    assert os.path.exists(os.path.join(results, f"{name}.png")) == HAVE_MPL
