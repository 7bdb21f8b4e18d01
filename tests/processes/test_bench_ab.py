"""`llft bench ab`: two trees of llft side by side, measured in interleaved blocks.

Counts and structure only (both trees' groups and the forwarder measured in every
repeat, ratios computed, CSV and markdown written, exit status 0); timings never decide
pass or fail. The base tree is a copy of this one: the tool compares code, not names.
"""
from __future__ import annotations

import csv
import os
import shutil

import pytest

from llft.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def copy_tree(dst) -> str:
    for d in ("llft", "membership", "determinizer", "native"):   # what its groups import
        shutil.copytree(os.path.join(ROOT, d), dst / d,
                        ignore=shutil.ignore_patterns("__pycache__", "build"))
    return str(dst)


@pytest.mark.slow
def test_ab_measures_both_trees_in_each_repeat(tmp_path):
    base = copy_tree(tmp_path / "base")
    out = str(tmp_path / "results")
    assert main(["bench", "ab", "--base", base, "--new", ROOT, "--replicas", "1",
                 "--rounds", "100", "--blocks", "5", "--duration", "1", "--repeat", "2",
                 "--results", out]) == 0
    with open(os.path.join(out, "ab.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["repeat"], r["config"]) for r in rows] == \
        [(rep, c) for rep in ("1", "2") for c in ("forwarder", "base", "new")]
    for r in rows:
        for col in ("p50_us", "p99_us", "rps_16", "conn_16"):
            assert float(r[col]) > 0, r
        if r["config"] != "forwarder":
            for col in ("p50_vs_forwarder", "rps_16_vs_forwarder", "p50_vs_base",
                        "conn_16_vs_base"):
                assert float(r[col]) > 0, r
    with open(os.path.join(out, "ab.md")) as f:
        assert "Reproduce: `llft bench ab --base" in f.read()


def test_a_broken_base_tree_is_reported_not_measured_with_the_new_code(tmp_path):
    """Each group imports its own tree: a base whose agent cannot start fails (at once:
    LocalCluster sees its replicas exit), while the new tree is still measured."""
    base = copy_tree(tmp_path / "base")
    with open(os.path.join(base, "llft", "runtime", "agent.py"), "a") as f:
        f.write('\nraise SystemExit("this base tree is broken on purpose")\n')
    out = str(tmp_path / "results")
    assert main(["bench", "ab", "--base", base, "--new", ROOT, "--replicas", "1",
                 "--rounds", "50", "--blocks", "2", "--duration", "1", "--repeat", "1",
                 "--results", out]) == 1
    with open(os.path.join(out, "ab.csv"), newline="") as f:
        assert [r["config"] for r in csv.DictReader(f)] == ["forwarder", "new"]
    with open(os.path.join(out, "ab.md")) as f:
        md = f.read()
    assert "base: setup" in md and "broken on purpose" in md, md[-600:]


def test_ab_refuses_a_tree_without_llft(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["bench", "ab", "--base", str(tmp_path), "--results", str(tmp_path / "r")])
    assert "holds no llft package" in str(e.value)
