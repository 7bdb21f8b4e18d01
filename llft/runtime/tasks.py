"""Background tasks with an owner: none fails unseen, none is lost mid-flight.

Theory of operation
-------------------
asyncio keeps only a weak reference to a task, and a task that raises and is never
awaited is reported, late and without context, as "Task exception was never retrieved".
A `TaskSet` holds a strong reference to every task it started until it ends; a done
callback logs a failure with the task's name and traceback and hands it to the owner's
`on_failure` (the agent and the gateway stop: a coroutine of theirs that died leaves the
process in a state nobody designed). Cancellation is not a failure. `call` does the same
for a callback the loop makes for us (a protocol's), which asyncio would otherwise take
as the end of that one connection.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Coroutine


class TaskSet:
    def __init__(self, log: logging.Logger,
                 on_failure: Callable[[str, BaseException], None] = lambda name, exc: None):
        self.log = log
        self.on_failure = on_failure
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def call(self, name: str, fn: Callable, *args):
        """`fn(*args)`; a failure is logged and handed to `on_failure` as a task's."""
        try:
            return fn(*args)
        except Exception as exc:    # noqa: BLE001 -- handed to the owner, as a task's
            self.log.error("callback %s failed: %s: %s", name, type(exc).__name__, exc,
                           exc_info=(type(exc), exc, exc.__traceback__))
            self.on_failure(name, exc)
            return None

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self.log.error("task %s failed: %s: %s", task.get_name(), type(exc).__name__, exc,
                       exc_info=(type(exc), exc, exc.__traceback__))
        self.on_failure(task.get_name(), exc)

    def cancel_all(self) -> None:
        for t in list(self.tasks):
            t.cancel()

    def __len__(self) -> int:
        return len(self.tasks)
