"""`llft bench spark --quick`: llft against supervisor + checkpoint on the Nexmark PySpark
driver, structure and counts only (timings never decide pass or fail).

Both setups recover from the kill with nothing lost and the reference's bytes; llft
repeats nothing (the sink sees one stream through the gateway); the checkpoint setup
may repeat windows emitted after its last checkpoint (at-least-once), and restarts its
driver once. A few minutes: 5 Spark JVMs on a 2-core machine.
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
def test_bench_spark_quick(tmp_path):
    out = str(tmp_path / "results")
    assert main(["bench", "spark", "--quick", "--results", out]) == 0
    kills = read_csv(os.path.join(out, "spark_kills.csv"))
    assert [(r["setup"], r["run"]) for r in kills] == \
        [("reference", "1"), ("llft_2r", "1"), ("checkpoint", "1")]
    for r in kills:
        assert r["error"] == "" and r["lost"] == "0", r
        assert float(r["throughput_ev_s"]) > 0, r
    for r in kills[1:]:
        assert r["identical"] == "yes", r
        assert float(r["next_result_ms"]) > 0 and float(r["new_window_ms"]) > 0, r
        assert float(r["new_window_ms"]) >= float(r["next_result_ms"]), r
    llft, ckpt = kills[1], kills[2]
    assert llft["repeated"] == "0" and float(llft["promoted_ms"]) > 0
    assert int(ckpt["repeated"]) >= 0 and float(ckpt["restarted_ms"]) >= 0
    assert ckpt["jvm_gone_ms"] != "", "the killed driver's JVM did not exit"
    summary = read_csv(os.path.join(out, "spark.csv"))
    assert [r["setup"] for r in summary] == ["reference", "llft_2r", "checkpoint"]
    assert float(summary[2]["recovery_vs_llft"]) > 0
    with open(os.path.join(out, "summary.md")) as f:
        text = f.read()
    assert "Reproduce: `llft bench spark --quick --results" in text
    assert "Recovery (kill -> next result), checkpoint / llft" in text
    if HAVE_MPL:
        for png in ("spark.png", "spark_throughput.png"):
            assert os.path.getsize(os.path.join(out, png)) > 0
