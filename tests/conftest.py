"""Shared pytest set-up.

Tests are grouped by kind, one folder each, and each folder's tests carry its marker:
  tests/unit/       `unit`       one process, no shim, seconds
  tests/sim/        `sim`        seeded simulator campaigns of the protocol cores
  tests/processes/  `processes`  real processes: UDP multicast, the preload shim, `llft run`
  tests/spark/      `spark`      start Spark JVMs (one reference run per module, reused)
Select with `-m`, e.g. `scripts/test.sh -m "unit or sim"`.

Slow campaigns (soaks, chaos, big transfers) are marked `slow` and skipped unless
`--soak=small` (CI) or `--soak=full` is given; the `soak` fixture tells a test which size.
"""
import os
import signal

import pytest

from llft.protocol.messaging import endpoint as messaging_endpoint

# the messaging core's incremental timestamp watermark is compared with its definition
# on every call in every in-process test (the simulator campaigns above all)
messaging_endpoint.CHECK_WATERMARK = True

KINDS = ("unit", "sim", "processes", "spark")


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # a run stopped with SIGTERM (`timeout`, a CI job cancelled) unwinds like Ctrl-C: the
    # running test's clusters, loads and hogs are stopped on the way out, not orphaned
    signal.signal(signal.SIGTERM, _terminated)
    # a run started as a background job of a shell without job control (`cmd &` in a
    # script) inherits SIGINT and SIGQUIT ignored, and so would every process a test
    # starts (an ignored signal stays ignored across exec): a recorded program's Ctrl-C
    # then stopped nothing. The tests' processes start as a terminal's foreground job's do.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_addoption(parser):
    parser.addoption("--soak", choices=["off", "small", "full"], default="off",
                     help="run slow campaigns: small (CI) or full size")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        kind = os.path.relpath(str(item.path), here).split(os.sep)[0]
        if kind not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of tests/{{{','.join(KINDS)}}}/")
        item.add_marker(getattr(pytest.mark, kind))
    if config.getoption("--soak") != "off":
        return
    skip = pytest.mark.skip(reason="slow campaign: run with --soak=small or --soak=full")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def soak(request) -> str:
    """'off', 'small' or 'full': how big a slow campaign should be."""
    return request.config.getoption("--soak")
