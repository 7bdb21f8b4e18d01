"""Drives sans-IO protocol cores on an asyncio event loop over a real transport.

Theory of operation
-------------------
This is the production twin of the simulator kernel (llft/sim/kernel.py): the same
cores, the same convention (docs/ARCHITECTURE.md), but the clock is the monotonic clock
and the network is a `transport.Endpoint` of real UDP sockets.

After every event that touches the cores (a datagram, a timer, a call from the
application through `call()`), the driver *pumps*: it drains each core's
`take_actions()`, multicasts every send action (any action with `dst_group` and `msg`)
through the endpoint, hands every other action to `on_action(action)`, and re-arms one
loop timer at the earliest `next_timer_us()` of all cores. Pumping repeats until no core
has actions left, because one core's action may feed another (membership -> messaging).

`route(msg)` picks the core a received message goes to (membership messages to the
membership core, the rest to messaging). `progress` is an asyncio.Event set after each
pump, so an application coroutine waiting for send space or a delivery can wait on it
instead of polling.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Sequence

from llft.protocol.messages import Message
from llft.runtime.transport import Endpoint, wait_for_event

log = logging.getLogger(__name__)

MAX_PUMP_ROUNDS = 64      # cores feeding each other more often than this is a bug


def monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class Driver:
    def __init__(self, endpoint: Endpoint, cores: Sequence[Any],
                 route: Callable[[Message], Any] | None = None,
                 on_action: Callable[[Any], None] | None = None,
                 clock_us: Callable[[], int] = monotonic_us):
        self.endpoint = endpoint
        self.cores = list(cores)
        self.route = route or (lambda msg: self.cores[0])
        self.on_action = on_action or (lambda action: None)
        self.clock_us = clock_us
        self.progress = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_us: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        endpoint.on_message = self._on_message

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.pump()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- events ------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        core = self.route(msg)
        if core is not None:
            core.handle_message(msg, self.clock_us())
        self.pump()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at_us = None
        now = self.clock_us()
        for core in self.cores:
            deadline = core.next_timer_us()
            if deadline is not None and deadline <= now:
                core.handle_timer(now)
        self.pump()

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Call a core method on behalf of the application, then pump its effects."""
        try:
            return fn(*args, **kwargs)
        finally:
            self.pump()

    # -- the pump ----------------------------------------------------------------------
    def pump(self) -> None:
        for _ in range(MAX_PUMP_ROUNDS):
            busy = False
            for core in self.cores:
                for action in core.take_actions():
                    busy = True
                    if hasattr(action, "dst_group") and hasattr(action, "msg"):
                        self.endpoint.send(action.dst_group, action.msg)
                    else:
                        self.on_action(action)
            if not busy:
                break
        else:
            log.error("llft driver: cores kept producing actions for %d rounds",
                      MAX_PUMP_ROUNDS)
        self._arm_timer()
        self.progress.set()

    def _arm_timer(self) -> None:
        deadlines = [d for d in (c.next_timer_us() for c in self.cores) if d is not None]
        if not deadlines or self._loop is None:
            return
        at_us = min(deadlines)
        if self._timer is not None:
            if self._timer_at_us is not None and self._timer_at_us <= at_us:
                return
            self._timer.cancel()
        delay_s = max(0.0, (at_us - self.clock_us()) / 1e6)
        self._timer_at_us = at_us
        self._timer = self._loop.call_later(delay_s, self._on_timer)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `predicate()` holds after some pump; False on timeout."""
        return await wait_for_event(self.progress, predicate, timeout_s)
