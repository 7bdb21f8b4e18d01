"""`llft bench ab`: two source trees of llft, side by side, in interleaved blocks.

This machine's speed drifts by a third within minutes, so two benchmark runs one after
the other (a tree, then the other) compare the machine's moods as much as the code.
Here one echo group per tree runs at once (`--replicas` each, the default configuration,
examples/echo.py behind its own `llft gateway`), next to the plain forwarder, and every
measurement alternates between them in short blocks, so both see the same machine:

  latency   one client, `--rounds` 1 KB round trips in `--blocks` blocks per target
  rps_16    16 clients on persistent connections, `--duration` s per target in blocks
  conn_16   16 clients, each request on a connection of its own, likewise

A tree is a directory holding the `llft` package (a `git worktree` of a commit, or a
copy of the working tree); its groups' processes run with PYTHONPATH set to it, so
its agents and gateway run its code (the native modules are the ones in its `native/`;
copy them in if the tree has none built). The idle group of one tree costs the other
~1 % of a core per agent while it is measured. `--repeat` runs the whole comparison
again with the trees started in the other order (the first started has no advantage
that the repeat does not give the other).

Writes `<results>/ab.csv` and `ab.md`: per repeat and tree, p50 / p90 / p99 at one
client, the two throughputs, each also as a ratio to the forwarder of the same blocks
and to the first tree (`--base`).
"""
from __future__ import annotations

import argparse
import os
import tempfile

from llft.bench import report
from llft.bench.service import (Setup, measure_latency, measure_throughput,
                                pooled_samples)

SIZE = 1024
CLIENTS = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", required=True, help="the tree compared against (a directory)")
    p.add_argument("--new", default=".", help="the tree under test (default: this one)")
    p.add_argument("--replicas", type=int, default=3, help="replicas of each tree's group")
    p.add_argument("--rounds", type=int, default=3000, help="latency: round trips per tree")
    p.add_argument("--blocks", type=int, default=30,
                   help="latency: interleaved blocks (throughput: a fifth of them)")
    p.add_argument("--duration", type=float, default=12.0,
                   help="throughput: seconds per tree and load, over its blocks")
    p.add_argument("--repeat", type=int, default=2,
                   help="comparisons, the trees' start order swapped each time")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def _tree(path: str) -> str:
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "llft", "__init__.py")):
        raise SystemExit(f"llft bench ab: {path} holds no llft package (a tree of this "
                         "repository, e.g. `git worktree add /tmp/base HEAD~1`)")
    return path


def compare(trees: dict[str, str], order: list[str], replicas: int, rounds: int,
            blocks: int, duration_s: float, tmp: str) -> tuple[dict, dict]:
    """One comparison: {name: row} for the forwarder and each tree, and {name: error}."""
    setup = Setup(tmp, proxy=True, group_prefix="ab")
    saved = os.environ.get("PYTHONPATH")
    try:
        targets = []
        for name in order:
            os.environ["PYTHONPATH"] = trees[name]     # what its group's processes import
            targets.append(setup.add_cluster(replicas, name))
        proxy = next(t for t in setup.baselines if t.name == "proxy")
        proxy.name = "forwarder"
        every = [proxy] + [t for t in targets if t.error is None]
        rows = {t.name: {"config": t.name} for t in every}
        samples: dict = {}
        measure_latency(every, [SIZE], rounds, warmup=200, blocks=blocks, phase=0,
                        samples=samples)
        for t in every:
            s = report.summarize_us(pooled_samples(samples, t.name, SIZE))
            rows[t.name].update(p50_us=s["median_us"], p90_us=s["p90_us"],
                                p99_us=s["p99_us"])
        for mode, col in (("echo", f"rps_{CLIENTS}"), ("echo_conn", f"conn_{CLIENTS}")):
            acc: dict = {}
            measure_throughput(every, [CLIENTS], SIZE, duration_s, max(1, blocks // 5), 0,
                               acc, mode=mode)
            for t in every:
                a = acc.get((0, t.name, CLIENTS))
                if a and a["elapsed_s"]:
                    rows[t.name][col] = a["replies"] / a["elapsed_s"]
        return rows, {t.name: t.error for t in targets if t.error is not None}
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        setup.stop()


def run(args) -> int:
    command = report.command_of(args, add_arguments, "ab")
    trees = {"base": _tree(args.base), "new": _tree(args.new)}
    if trees["base"] == trees["new"]:
        print("llft bench ab: --base and --new are the same tree")
        return 2
    cols = ["repeat", "config", "p50_us", "p90_us", "p99_us", "p50_vs_forwarder",
            f"rps_{CLIENTS}", f"rps_{CLIENTS}_vs_forwarder", f"conn_{CLIENTS}",
            f"conn_{CLIENTS}_vs_forwarder", "p50_vs_base", f"rps_{CLIENTS}_vs_base",
            f"conn_{CLIENTS}_vs_base"]
    table = report.Table("ab", f"base and new side by side, {args.replicas} replicas each, "
                         "in interleaved blocks; ratios to the forwarder and to base of "
                         "the same repeat", cols)
    failed = []
    for rep in range(args.repeat):
        order = ["base", "new"] if rep % 2 == 0 else ["new", "base"]
        with tempfile.TemporaryDirectory(prefix="llft-bench-ab-") as tmp:
            rows, errors = compare(trees, order, args.replicas, args.rounds, args.blocks,
                                   args.duration, tmp)
        failed += [f"repeat {rep + 1}, {n}: {e}" for n, e in errors.items()]
        fw, base = rows["forwarder"], rows.get("base", {})
        for name in ("forwarder", "base", "new"):
            row = rows.get(name)
            if row is None:
                continue
            for k in ("p50_us", f"rps_{CLIENTS}", f"conn_{CLIENTS}"):
                short = k.replace("_us", "")
                if row.get(k) and fw.get(k):
                    row[f"{short}_vs_forwarder"] = row[k] / fw[k]
                if name != "forwarder" and row.get(k) and base.get(k):
                    row[f"{short}_vs_base"] = row[k] / base[k]
            table.add(repeat=rep + 1, **row)
        table.print()
    table.write_csv(args.results)
    notes = ("Each tree's group runs its own code (PYTHONPATH); the forwarder and both "
             "groups are measured in the same interleaved blocks. p50_vs_base below 1 and "
             "the throughput ratios above 1: new is faster. Read the repeats together: "
             "one repeat is one sample of a noisy machine.")
    if failed:
        notes += "\n\nFailed: " + "; ".join(failed)
    md = report.write_markdown(args.results, "ab", [table.markdown()], notes=notes,
                               command=command)
    print(f"wrote {md}")
    return 1 if failed else 0
