"""Shared pytest set-up.

Slow campaigns (soaks, chaos, big transfers) are marked `slow` and skipped unless
`--soak=small` (CI) or `--soak=full` is given; the `soak` fixture tells a test which size.
"""
import pytest


def pytest_addoption(parser):
    parser.addoption("--soak", choices=["off", "small", "full"], default="off",
                     help="run slow campaigns: small (CI) or full size")


def pytest_collection_modifyitems(config, items):
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
