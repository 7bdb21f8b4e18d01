"""`llft bench gateway-loss --quick`: structure only (timings never decide pass or fail):
one row, B's clients served before and after the other gateway's death with no error
and no view change, the dead gateway's connection freed at every replica, CSV/markdown
(and the plot when matplotlib is present) written, exit status 0."""
from __future__ import annotations

import csv
import importlib.util
import math
import os

from llft.cli import main

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def test_bench_gateway_loss_quick(tmp_path):
    results = str(tmp_path / "results")
    assert main(["bench", "gateway-loss", "--quick", "--results", results]) == 0
    with open(os.path.join(results, "gateway_loss.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1
    r = rows[0]
    assert float(r["before_rps"]) > 0 and float(r["after_rps"]) > 0
    assert r["views"] == "False" and r["errors"] == "0"
    assert not math.isnan(float(r["freed_ms"]))
    assert os.path.exists(os.path.join(results, "gateway_loss.md"))
    assert os.path.exists(os.path.join(results, "gateway_loss.png")) == HAVE_MPL
