"""`llft bench all [--quick] [--results DIR]`: every benchmark kind in turn, one results folder.

Runs, one after the other (never two at once: the machine has 2 shared cores), the
paper-style figures first: latency (vs message size), throughput (vs clients),
ndlatency (vs nondeterministic operations per request), failover (vs replicas),
gateway-loss (another gateway of the group dies for good), bulk (a transfer both ways
with a reader that pauses), then
ndops (cost per determinized operation), codec (the wire codec's two halves), transport
(a short TCP connection on asyncio's transport and on the lean one), core
(the messaging core and codec per request, hot and with the caches evicted) and
messaging (the protocol alone). Each kind
runs with its own defaults (plus `--quick` if given) and writes its CSV, markdown and
PNG files into DIR; a kind that fails or raises is reported and the others still run.
At the end `all.md` lists each kind's command, exit status and duration, and
`summary.md` gathers every section. `spark` (llft against supervisor + checkpoint on a
PySpark driver) starts many Spark JVMs and takes several minutes even with `--quick`, so
it runs only when asked for: `--spark` adds it at the end, or name it in `--kinds`.

Exit status: 0 if every kind returned 0, else 1.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback

from llft.bench import report

# kind -> module (the same as llft/cli.py's BENCHMARKS), in running order
KINDS: dict[str, str] = {
    "latency": "llft.bench.service",
    "throughput": "llft.bench.service",
    "ndlatency": "llft.bench.ndlatency",
    "failover": "llft.bench.failover",
    "gateway-loss": "llft.bench.gateway_loss",
    "bulk": "llft.bench.bulk",
    "ndops": "llft.bench.ndops",
    "codec": "llft.bench.codec",
    "transport": "llft.bench.transport",
    "core": "llft.bench.core",
    "messaging": "llft.bench.messaging",
    "spark": "llft.bench.spark",
}
# not run unless asked for (--spark, or named in --kinds)
OPT_IN = ("spark",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="every kind in its --quick mode")
    p.add_argument("--kinds", default=",".join(k for k in KINDS if k not in OPT_IN),
                   help="which kinds, in this order (default: all of them but "
                   f"{', '.join(OPT_IN)})")
    p.add_argument("--spark", action="store_true",
                   help="also run `spark` (several minutes: Spark JVMs) after the others")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR)


def kind_args(kind: str, quick: bool, results: str) -> argparse.Namespace:
    """The namespace `llft bench KIND [--quick] --results DIR` would give the kind."""
    mod = importlib.import_module(KINDS[kind])
    p = argparse.ArgumentParser(prog=f"llft bench {kind}")
    mod.add_arguments(p)
    argv = (["--quick"] if quick else []) + ["--results", results]
    ns = p.parse_args(argv)
    ns._kind = kind
    return ns


def run(args) -> int:
    command = report.command_of(args, add_arguments, "all")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if getattr(args, "spark", False) and "spark" not in kinds:
        kinds.append("spark")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        print(f"llft bench all: unknown kind {unknown[0]!r} ({', '.join(KINDS)})",
              file=sys.stderr)
        return 2
    table = report.Table("all", f"Kinds run by `{command}`",
                         ["kind", "command", "exit", "seconds", "error"])
    for kind in kinds:
        print(f"=== llft bench {kind}{' --quick' if args.quick else ''}", flush=True)
        t0 = time.monotonic()
        error = ""
        try:
            ns = kind_args(kind, args.quick, args.results)
            sub_command = report.command_of(ns, importlib.import_module(KINDS[kind]).add_arguments,
                                            kind)
            code = int(importlib.import_module(KINDS[kind]).run(ns) or 0)
        except KeyboardInterrupt:
            raise
        except BaseException as e:          # noqa: BLE001 -- one kind's failure is reported
            traceback.print_exc()
            code, error = 1, f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            sub_command = f"llft bench {kind}"
        table.add(kind=kind, command=f"`{sub_command}`", exit=code,
                  seconds=time.monotonic() - t0, error=error)
        print(f"=== llft bench {kind}: exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
    table.print()
    table.write_csv(args.results)
    md = report.write_markdown(args.results, "all", [table.markdown()], command=command, notes=(
        "Each kind ran with its own defaults" + (" in --quick mode" if args.quick else "")
        + "; its section above says its exact command. A non-zero exit means that kind "
        "reported a failed configuration (see its section) or raised (error column)."))
    print(f"wrote {md} and {os.path.join(args.results, 'summary.md')}")
    return 0 if all(r["exit"] == 0 for r in table.rows) else 1
