"""`llft bench corpus`: a CPython test module recorded and replayed, the table written."""
from __future__ import annotations

import csv
import subprocess
import sys


def test_corpus_records_and_replays_a_cpython_test_module(tmp_path):
    results = tmp_path / "results"
    p = subprocess.run([sys.executable, "-m", "llft", "bench", "corpus", "--modules", "test_sched",
                        "--replays", "2", "--results", str(results)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = list(csv.DictReader(open(results / "corpus.csv")))
    assert [r["module"] for r in rows] == ["test_sched"]
    row = rows[0]
    assert row["plain_exit"] == row["record_exit"] == "0"
    assert int(row["entries"]) > 100            # its threads, locks and clocks were ordered
    assert row["identical"] == "2/2" and row["first_failure"] == ""
    assert "llft bench corpus" in (results / "corpus.md").read_text()
