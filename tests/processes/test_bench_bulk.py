"""`llft bench bulk --quick`: structure only (timings never decide pass or fail): a
direct row and an llft row, every byte back in order, no view change, the writer held
back while the reader was away (not the whole transfer ahead of it), CSV/markdown (and
the plot when matplotlib is present) written, exit status 0."""
from __future__ import annotations

import csv
import importlib.util
import os

from llft.cli import main

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def test_bench_bulk_quick(tmp_path):
    results = str(tmp_path / "results")
    assert main(["bench", "bulk", "--quick", "--results", results]) == 0
    with open(os.path.join(results, "bulk.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == ["direct", "llft_2r"]
    for r in rows:
        assert r["ok"] == "True" and float(r["mb_per_s"]) > 0
        assert 0 < float(r["ahead_mb"]) <= 32, r
    # 32 MB written, the reader away after 1 MB: with llft the sockets' buffers and a
    # window per direction hold some, the writer waits for the rest. Not asserted of the
    # direct row: what the kernel's own buffers take there is its autotuning's, up to
    # tcp_rmem's maximum per socket (32 MB on this VM): 25 MB once in a CI run.
    assert float(rows[1]["ahead_mb"]) < 24, rows[1]
    assert rows[1]["views"] == "False"
    assert os.path.exists(os.path.join(results, "bulk.md"))
    assert os.path.exists(os.path.join(results, "bulk.png")) == HAVE_MPL
