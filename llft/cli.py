"""The `llft` command.

Each subcommand lives in the module of its concern and is imported only when used, so
that `llft keygen` does not pay for Spark or the simulator. A command module provides
`add_arguments(parser)` and `run(args) -> int`. Commands with sub-kinds (`simulate X`,
`bench X`) name one module per kind.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("llft.demos.service", "run the local replicated demo (the main job)"),
    "chaos": ("llft.tools.chaos", "a seeded fault campaign against a replicated service, every reply checked"),
    "run": ("llft.runtime.agent", "run one replica of a group: llft run --config F --group G -- CMD..."),
    "gateway": ("llft.runtime.gateway", "carry plain TCP clients into a group"),
    "status": ("llft.runtime.status", "show a group's members, primary, view, lag and counters"),
    "keygen": ("llft.runtime.keys", "write a new cluster key file (mode 0600)"),
    "sniff": ("llft.tools.sniff", "decode live llft traffic (scapy)"),
    "record": ("determinizer.recordreplay", "run a command as a primary and store its trace"),
    "replay": ("determinizer.recordreplay", "run a command as a backup, fed from a trace"),
    "spark-connect": ("llft.spark.connect", "start, stop or show a Spark Connect server "
                      "from the pyspark wheel (loopback by default)"),
}

# kind -> module, for `llft simulate KIND` and `llft bench KIND`
SIMULATIONS: dict[str, str] = {
    "messaging": "llft.sim.messaging_check",
    "membership": "llft.sim.membership_check",
    "replica": "llft.sim.replica_check",
}
BENCHMARKS: dict[str, str] = {
    "messaging": "llft.bench.messaging",
    "failover": "llft.bench.failover",
    "ndops": "llft.bench.ndops",
    "codec": "llft.bench.codec",
    "core": "llft.bench.core",
    "transport": "llft.bench.transport",
    "latency": "llft.bench.service",
    "throughput": "llft.bench.service",
    "echo": "llft.bench.echo",
    "ndlatency": "llft.bench.ndlatency",
    "spark": "llft.bench.spark",
    "corpus": "llft.bench.corpus",
    "join": "llft.bench.join",
    "gateway-loss": "llft.bench.gateway_loss",
    "bulk": "llft.bench.bulk",
    "profile": "llft.bench.profile",
    "ab": "llft.bench.ab",
    "priority": "llft.bench.priority",
    "all": "llft.bench.all",
}


def _add_kinds(sub, name: str, kinds: dict[str, str], help_: str) -> None:
    p = sub.add_parser(name, help=help_)
    kind_sub = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind, module in kinds.items():
        kp = kind_sub.add_parser(kind)
        kp.set_defaults(_module=module, _kind=kind)
        _lazy_arguments(kp, module)


def _lazy_arguments(parser: argparse.ArgumentParser, module: str) -> None:
    importlib.import_module(module).add_arguments(parser)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llft", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Only the chosen command's module is imported (argparse needs its arguments).
    chosen = argv[0] if argv else None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        p.set_defaults(_module=module, _command=name)
        if name == chosen:
            _lazy_arguments(p, module)
    for name, kinds, help_ in (("simulate", SIMULATIONS, "run seeded simulations of a protocol"),
                               ("bench", BENCHMARKS, "run a benchmark (tables, CSV, plots)")):
        if name == chosen:
            _add_kinds(sub, name, kinds, help_)
        else:
            sub.add_parser(name, help=help_)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    from llft.protocol import wire
    try:
        wire.default_codec()    # LLFT_WIRE is read by every process: one clear line here
    except ValueError as e:
        print(f"llft: {e}", file=sys.stderr)
        return 2
    mod = importlib.import_module(args._module)
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
