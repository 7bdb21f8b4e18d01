"""Runs one replica's membership core on asyncio over a real transport (llft/runtime/transport.py).

Theory of operation
-------------------
The generic `llft.runtime.driver.Driver` pumps one sans-IO core over a transport
`Endpoint`: it feeds datagrams and timer expiries in and multicasts `Send` actions out.
This module adds what membership alone needs from the runtime:

  * phase 2 of a primary change: `BeginPhase2` is handed to `phase2` (the runtime wires
    the messaging layer's NewPrimaryView round there); without messaging, as in the
    demo, phase 2 completes at once, which is right for a group with no inter-group
    connections;
  * `status()`: a snapshot (birth id, status, pvn, change, members, rank) that the demo
    prints whenever it changes, so tests wait on observable state.

The endpoint gets no birth id: a reset changes the replica's birth id, and the core
itself drops its own echoes (multicast loop is on: replicas share the host). It never
calls `set_view` on the decoder: membership messages from any view must reach the core
(competing branches are detected by them), and heartbeats are control messages the
decoder would otherwise filter by view.
"""
from __future__ import annotations

import random
from typing import Any, Callable

from llft.runtime.driver import Driver
from llft.runtime.transport import Endpoint, GroupMap
from membership.core import (BeginPhase2, Config, Membership, MembershipChanged, Reset,
                             StateProvider, ViewStarted)


class MembershipDriver:
    def __init__(self, key: bytes, config: Config, *, groups: GroupMap | None = None,
                 rng: random.Random | None = None, state: StateProvider | None = None,
                 on_action: Callable[[Any], None] | None = None,
                 phase2: Callable[[BeginPhase2], None] | None = None, **endpoint_kw):
        self.core = Membership(config, rng or random.Random(), state)
        self.endpoint = Endpoint(key, config.group, lambda m: None, groups=groups,
                                 **endpoint_kw)
        self._user_action = on_action or (lambda a: None)
        self._phase2 = phase2 or self._phase2_at_once
        self.driver = Driver(self.endpoint, self.core, on_action=self._on_action)
        self.log: list[Any] = []            # actions other than sends, bounded below
        self.max_log = 1_000

    async def start(self) -> None:
        await self.endpoint.start()
        self.core.start(self.driver.clock_us())
        self.driver.start()

    def close(self) -> None:
        self.driver.stop()
        self.endpoint.close()

    def status(self) -> dict:
        c = self.core
        return {"birth": c.birth, "status": c.status.value, "pvn": c.pvn, "change": c.change,
                "precedence": c.precedence, "rank": c.rank,
                "members": [[k.birth, k.precedence] for k in c.members]}

    def _on_action(self, action: Any) -> None:
        if len(self.log) >= self.max_log:
            del self.log[: self.max_log // 2]
        self.log.append(action)
        if isinstance(action, BeginPhase2):
            self._phase2(action)
        self._user_action(action)

    def _phase2_at_once(self, action: BeginPhase2) -> None:
        # called from inside the pump: the pump drains what this produces next round
        self.core.phase2_complete(action.pvn, self.driver.clock_us())


__all__ = ["MembershipDriver", "MembershipChanged", "Reset", "ViewStarted"]
