"""`llft bench spark --quick`: the Nexmark PySpark driver plain, replicated (classic and
Spark Connect) and under supervisor + checkpoint, structure and counts only (timings
never decide pass or fail).

Every setup produces the reference's bytes with nothing lost, without a failure and with
one kill; the llft setups repeat nothing (the sink sees one stream through the gateway);
the checkpoint setup may repeat windows emitted after its last checkpoint (at-least-once).
A few minutes: about 9 Spark JVMs (one Connect server) on a 2-core machine.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import os

import pytest

from llft.bench import all as bench_all
from llft.cli import main

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bench_all_leaves_spark_out_unless_asked():
    p = argparse.ArgumentParser()
    bench_all.add_arguments(p)
    assert "spark" not in p.parse_args(["--quick"]).kinds.split(",")
    assert p.parse_args(["--spark"]).spark


@pytest.mark.slow
def test_bench_spark_quick(tmp_path, soak):
    # 6 minutes and ~9 JVMs on a 2-core machine, the largest single part of a CI run:
    # at --soak=full. What it drives is covered at every size by the replicated
    # pipeline (tests/spark/test_spark_pipeline.py) and Connect driver
    # (tests/spark/test_spark_connect.py) tests; this one adds the bench's tables, plots
    # and its checkpoint baseline.
    if soak != "full":
        pytest.skip("llft bench spark --quick: --soak=full")
    out = str(tmp_path / "results")
    assert main(["bench", "spark", "--quick", "--results", out]) == 0
    runs = read_csv(os.path.join(out, "spark_runs.csv"))
    setups = ["reference", "llft_2r", "connect_reference", "llft_connect_2r", "checkpoint"]
    assert [(r["setup"], r["run"]) for r in runs] == \
        [(s, "free") for s in setups] + [("llft_2r", "1"), ("llft_connect_2r", "1"),
                                         ("checkpoint", "1")]
    for r in runs:
        assert r["error"] == "" and r["lost"] == "0", r
        assert float(r["throughput_ev_s"]) > 0 and float(r["end_s"]) > 0, r
        assert r["identical"] == "yes" or r["setup"] == "reference", r
    kills = {r["setup"]: r for r in runs if r["run"] == "1"}
    for r in kills.values():
        assert r["kill_after"] == "1", r
        assert float(r["next_result_ms"]) > 0 and float(r["new_window_ms"]) > 0, r
        assert float(r["new_window_ms"]) >= float(r["next_result_ms"]), r
        float(r["added_ms"])                         # measured (its sign is the machine's)
    for s in ("llft_2r", "llft_connect_2r"):         # one stream through the gateway
        assert kills[s]["repeated"] == "0" and float(kills[s]["promoted_ms"]) > 0
    assert float(kills["checkpoint"]["restarted_ms"]) >= 0
    summary = read_csv(os.path.join(out, "spark.csv"))
    assert [r["setup"] for r in summary] == setups
    assert float(summary[0]["throughput_vs_reference"]) == 1.0
    with open(os.path.join(out, "summary.md")) as f:
        text = f.read()
    assert "Reproduce: `llft bench spark --quick --results" in text
    assert "Added delay p50, checkpoint / llft_2r" in text
    if HAVE_MPL:
        for png in ("spark.png", "spark_throughput.png", "spark_timeline.png"):
            assert os.path.getsize(os.path.join(out, png)) > 0
