"""The event loop the agent and the gateway run on.

uvloop (libuv, in C) when it is installed and LLFT_EVENT_LOOP is not "asyncio": every
datagram and every socket read of the data path is one loop callback, and uvloop's
dispatch and transports cost less per event than asyncio's pure-Python selector loop
(measured in `llft bench echo`: docs/BENCHMARKS.md). The code uses only the asyncio API;
both loops run it (the tests run with whichever is installed: `pip install -e .[dev]`
installs uvloop).
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Coroutine


def kind() -> str:
    """"uvloop" or "asyncio": the loop `run` will use."""
    if os.environ.get("LLFT_EVENT_LOOP", "") == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, Any]) -> Any:
    if kind() == "uvloop":
        import uvloop
        return uvloop.run(main)
    return asyncio.run(main)
