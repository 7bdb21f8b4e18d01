"""`llft bench priority --quick`: one group, its backups' autogroup nice alternated.

Counts and structure only (every level measured in every repeat, in alternating order,
medians and ratios to the first level written, the backups' nice really set, exit
status 0); timings never decide pass or fail.
"""
from __future__ import annotations

import csv
import os

import pytest

from llft.cli import main


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/proc/self/autogroup"),
                    reason="needs root and a kernel with autogroup scheduling")
def test_priority_quick_measures_each_level_in_each_repeat(tmp_path):
    out = str(tmp_path / "results")
    assert main(["bench", "priority", "--quick", "--results", out]) == 0
    with open(os.path.join(out, "priority.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["repeat"], r["backups_nice"]) for r in rows] == \
        [("1", "-10"), ("1", "-5"), ("2", "-5"), ("2", "-10")]
    for r in rows:
        assert float(r["p50_us"]) > 0 and float(r["rps_16"]) > 0, r
    with open(os.path.join(out, "priority_medians.csv"), newline="") as f:
        med = list(csv.DictReader(f))
    assert [m["backups_nice"] for m in med] == ["-10", "-5"]
    assert float(med[0]["p50_vs_first"]) == 1.0 and float(med[1]["rps_16_vs_first"]) > 0
    md = open(os.path.join(out, "priority.md")).read()
    assert "View changes during the run: 0." in md
