"""`llft bench join --quick`: structure only (timings never decide pass or fail): a row
per age with the joiner's history, transfer, replay and join times, CSV/markdown (and
the plot when matplotlib is present) written, exit status 0."""
from __future__ import annotations

import csv
import importlib.util
import os

from llft.cli import main

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def test_bench_join_quick(tmp_path):
    results = str(tmp_path / "results")
    assert main(["bench", "join", "--quick", "--results", results]) == 0
    with open(os.path.join(results, "join.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        assert int(r["history_entries"]) > 0
        assert float(r["join_s"]) >= float(r["transfer_s"]) >= 0
        assert float(r["replay_s"]) >= 0
    # the older group has the longer history
    assert int(rows[1]["history_entries"]) > int(rows[0]["history_entries"])
    assert os.path.exists(os.path.join(results, "join.md"))
    assert os.path.exists(os.path.join(results, "join.png")) == HAVE_MPL
