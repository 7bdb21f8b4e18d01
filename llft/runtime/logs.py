"""One logging set-up for `llft run` and `llft gateway`: every line says when and who.

    2026-11-23T09:12:03.456Z counter/3fa2c1 primary of view 3: application promoted ...
    2026-11-23T09:12:03.502Z gw:counter warning: client 7 (127.0.0.1:5512) does not read

Theory of operation
-------------------
Both commands log through the standard `logging` module with one handler on stderr and
one `Formatter` (`LineFormatter`): the wall-clock time in UTC with milliseconds (so lines
of several replicas and hosts sort into one story), the process's short name, a level
word for warnings and errors, the message, and a traceback when there is one. The name
is the process's, not the logger's: a replica is `<group>/<first 6 hex of its birth
id>` (the birth id changes at a reset, and so does the name: `set_name`), a gateway
`gw:<group>`. `install_loop_handler` routes what asyncio would print on its own (an
unhandled exception in a callback, a task's failure nobody took) through the same
lines, with its context.

Errors before a process has a name (bad configuration, a missing key) stay one plain
line `llft run: ...` / `llft gateway: ...` on stderr, the commands' documented contract.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time

_name = "llft"


def set_name(name: str) -> None:
    """The short name every following line carries."""
    global _name
    _name = name


def replica_name(group: str, birth: int) -> str:
    return f"{group}/{birth:x}"[:len(group) + 7]


class LineFormatter(logging.Formatter):
    def formatTime(self, record, datefmt=None) -> str:   # noqa: N802 (logging's name)
        t = time.gmtime(record.created)
        return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        line = f"{self.formatTime(record)} {_name} {level}{record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(name: str, level: int = logging.INFO, stream=None) -> None:
    """Route every logger of this process to `stream` (stderr) through LineFormatter."""
    set_name(name)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(LineFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)


def install_loop_handler(loop: asyncio.AbstractEventLoop, log: logging.Logger) -> None:
    """asyncio's own reports (exceptions nobody handled) become log lines with their
    context (the task or callback they came from)."""
    def handler(loop, context) -> None:
        exc = context.get("exception")
        where = context.get("task") or context.get("future") or context.get("handle")
        msg = context.get("message", "unhandled error in the event loop")
        log.error("%s%s", msg, f" ({where!r})" if where is not None else "",
                  exc_info=(type(exc), exc, exc.__traceback__) if exc else None)
    loop.set_exception_handler(handler)
