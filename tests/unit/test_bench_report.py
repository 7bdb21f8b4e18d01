"""llft/bench/report.py and `llft bench all`: what every kind writes (fast, no timings).

Structure only: files present, sections in summary.md, commands that reproduce the
run, counts. Timings never decide pass or fail: these machines are shared and noisy.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import os

import pytest

from llft.bench import report
from llft.cli import main

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def _args(argv: list[str]) -> tuple[argparse.Namespace, callable]:
    def add_arguments(p):
        p.add_argument("--sizes", default="64,1024")
        p.add_argument("--rounds", type=int, default=1000)
        p.add_argument("--quick", action="store_true")
        p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv), add_arguments


def test_command_of_names_only_what_differs_from_the_defaults():
    ns, add = _args([])
    assert report.command_of(ns, add, "latency") == "llft bench latency"
    ns, add = _args(["--rounds", "5", "--quick", "--results", "out dir"])
    assert report.command_of(ns, add, "latency") == \
        "llft bench latency --rounds 5 --quick --results 'out dir'"


def test_write_markdown_embeds_plots_and_command_and_orders_the_summary(tmp_path):
    out = str(tmp_path)
    t = report.Table("latency", "T", ["x", "y"])
    t.add(x=1, y=2.5)
    assert os.path.basename(t.write_csv(out)) == "latency.csv"
    png = report.plot(out, "latency", "t", "x", "y", {"a": ([1, 2], [3.0, float("nan")])})
    report.write_markdown(out, "zeta", ["### Z\n"], command="llft bench zeta")
    report.write_markdown(out, "latency", [t.markdown()], notes="n", plots=[png, None],
                          command="llft bench latency --quick")
    with open(os.path.join(out, "latency.md")) as f:
        md = f.read()
    assert "Reproduce: `llft bench latency --quick`" in md and "| 1 | 2.500 |" in md
    if HAVE_MPL:
        assert "![latency.png](latency.png)" in md
        assert os.path.getsize(os.path.join(out, "latency.png")) > 0
    else:
        assert "matplotlib missing" in md
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    # the paper-style figures first, other kinds after them
    assert summary.index("## llft bench latency") < summary.index("## llft bench zeta")


def test_bars_and_fit_slope(tmp_path):
    assert report.fit_slope([0, 10, 100], [5.0, 25.0, 205.0]) == pytest.approx(2.0)
    assert report.fit_slope([1, 1], [1.0, 2.0]) != report.fit_slope([1, 1], [1.0, 2.0])  # nan
    path = report.bars(str(tmp_path), "b", "t", "ns", ["clock", "lock"],
                       {"plain": [1.0, 2.0], "record": [2.0, float("nan")]}, logy=True)
    assert path is None or os.path.getsize(path) > 0


def test_bench_all_runs_the_chosen_kinds_into_one_folder(tmp_path):
    """`llft bench all --kinds ndops --quick`: the kind's files, all.md, summary.md."""
    out = str(tmp_path / "results")
    assert main(["bench", "all", "--quick", "--kinds", "ndops", "--results", out]) == 0
    for name in ("ndops.csv", "ndops.md", "all.csv", "all.md", "summary.md"):
        assert os.path.exists(os.path.join(out, name)), name
    with open(os.path.join(out, "ndops.csv"), newline="") as f:
        assert [r["op"] for r in csv.DictReader(f)] == ["clock", "lock", "recv"]
    with open(os.path.join(out, "all.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["kind"], r["exit"]) for r in rows] == [("ndops", "0")]
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    assert "Reproduce: `llft bench ndops --quick --results" in summary
    assert summary.index("## llft bench ndops") < summary.index("## llft bench all")
    if HAVE_MPL:
        assert "![ndops.png](ndops.png)" in summary


def test_bench_all_rejects_an_unknown_kind(tmp_path, capsys):
    assert main(["bench", "all", "--kinds", "nope", "--results", str(tmp_path)]) == 2
    assert "unknown kind 'nope'" in capsys.readouterr().err
