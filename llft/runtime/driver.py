"""Drives sans-IO protocol cores on an asyncio event loop over a real transport.

Theory of operation
-------------------
This is the production twin of the simulator kernel (llft/sim/kernel.py): the same
cores, the same convention (docs/ARCHITECTURE.md), but the clock is the monotonic clock
and the network is a `transport.Endpoint` of real UDP sockets.

A driver drives one core: a whole replica (`ReplicaNode`, which routes messages to its
own membership and messaging cores), a bare membership core, or a bare messaging
endpoint (the gateway, demos, benchmarks). Every received message goes to that core.

After every event that touches the core (a datagram, a timer, a call from the
application through `call()`), the driver *pumps*: it drains the core's
`take_actions()`, multicasts every `Send` through the endpoint, hands every other action
to `on_action(action)`, and re-arms one loop timer at the core's `next_timer_us()`.
Pumping repeats until the core has no actions left (an action handler may call the core
again).

Silence watches. A core that has them (`silence_watches()`: the deadlines at which it
would suspect a silent peer) gets its loop timer armed at `next_timer_us(watched=False)`
only, while the endpoint's pulse thread watches the rest, moving each by the peer's
heartbeat copies it absorbs (llft/runtime/pulse.py); when one passes the driver judges
as for a late timer (`_on_watch`). An idle replica's loop thus sleeps through its peers'
heartbeats instead of waking each time a detector deadline they postponed comes due.
The simulator wakes at every deadline, which is what a watch approximates from the
early side.

`progress` is an asyncio.Event set after each pump that follows a message or a timer, or
that carried out an action, so an application coroutine waiting for send space or a
delivery can wait on it instead of polling. A call that changed nothing visible does not
set it: with many coroutines waiting (64 connections held by output commit), each one's
retry woke all the others, whose retries woke it again -- a busy loop that starved the
datagrams the waiters were waiting for.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from llft.protocol.messages import Message, Pulse, Send, SendDatagrams
from llft.runtime.transport import Endpoint, wait_for_event

log = logging.getLogger(__name__)

MAX_PUMP_ROUNDS = 64      # a core still producing actions after this many rounds is a bug
ON_TIME_US = 2_000          # a timer this late or less found the loop idle (`_on_timer`)


def monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class Driver:
    def __init__(self, endpoint: Endpoint, core: Any,
                 on_action: Callable[[Any], None] | None = None,
                 clock_us: Callable[[], int] = monotonic_us):
        self.endpoint = endpoint
        self.core = core
        self.on_action = on_action or (lambda action: None)
        self.clock_us = clock_us
        self.progress = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_us: int | None = None
        self._arm_handle: asyncio.Handle | None = None  # _arm_timer scheduled this turn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch = False                 # silence watches go to the pulse thread
        self._watches_handed: Any = None    # the core's watches list handed last ...
        self._watch_rest: int | None = None  # ... and what of it the thread cannot watch
        endpoint.on_message = self._on_message
        endpoint.on_message_at = self._on_message_at
        endpoint.on_watch = self._on_watch
        if getattr(core, "takes_datagrams", False):
            endpoint.on_datagram = self._on_datagram

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watch = (self.endpoint.watches_silence
                       and hasattr(self.core, "silence_watches"))
        self.pump()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._arm_handle is not None:
            self._arm_handle.cancel()
            self._arm_handle = None

    # -- events ------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        self._on_message_at(msg, self.clock_us())

    def _on_message_at(self, msg: Message, at_us: int) -> None:
        """`msg` came at `at_us`: now, or for a heartbeat the pulse thread read up to an
        interval after it came, then (its detector's arrival history stays the peer's).
        While the core holds a takeover, any message may be the evidence that decides it
        (a PROBE answer): the pulse socket is read first, as before a timer, so that it
        is judged with every heartbeat that came."""
        if getattr(self.core, "takeover_held", False):
            self.endpoint.read_pulse()
        self._absorbed()
        self.core.handle_message(msg, min(at_us, self.clock_us()))
        self.pump(event=True)

    def _on_datagram(self, data: bytes, at_us: int | None = None) -> bool:
        """A whole datagram, offered to a core that handles steady ones raw (a native
        lane, `LanedEndpoint.handle_datagram`), at its arrival time if known (as
        `_on_message_at`); False: decode it and call as usual."""
        self._absorbed()                # (heartbeat copies first, as before any event)
        now = self.clock_us()
        if not self.core.handle_datagram(data, now if at_us is None else min(at_us, now)):
            return False
        self.pump(event=True)
        return True

    def _absorbed(self) -> None:
        """Heartbeat copies the pulse thread absorbed (llft/runtime/pulse.py), to the core
        with their arrival times, before the event they preceded."""
        for msg, times in self.endpoint.take_absorbed():
            self.core.heard_again(msg, times)

    def _on_timer(self) -> None:
        due_us = self._timer_at_us
        late = due_us is None or self.clock_us() - due_us > ON_TIME_US
        self._timer = None
        self._timer_at_us = None
        # A timer on time ran in the loop turn whose selector just found no input
        # (asyncio runs that turn's readers first): the sockets need no read (at idle,
        # ~16 timers a second each spent 60-75 us on reads that found nothing)
        self._judge(read_sockets=late)

    def _on_watch(self) -> None:
        """A silence watch passed in the pulse thread: judged as a late timer is. The
        thread dropped its watches: they are handed again after (`_arm_timer`)."""
        self._watches_handed = None
        self._judge(read_sockets=True)

    def _judge(self, read_sockets: bool) -> None:
        # input first: a timer judges silence, and after a busy spell what was heard
        # may still sit in the socket (transport.Endpoint.drain_input)
        self.endpoint.drain_input(sockets=read_sockets)
        self._absorbed()
        now = self.clock_us()
        deadline = self.core.next_timer_us()
        if deadline is not None and deadline <= now:
            self.core.handle_timer(now)
        self.pump(event=True)

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Call a core method on behalf of the application, then pump its effects."""
        try:
            return fn(*args, **kwargs)
        finally:
            self.pump()

    # -- the pump ----------------------------------------------------------------------
    def pump(self, event: bool = False) -> None:
        """Carry out the core's actions; `event`: after a message or a timer (progress is
        set even if the core had nothing to do)."""
        acted = event
        for _ in range(MAX_PUMP_ROUNDS):
            actions = self.core.take_actions()
            if not actions:
                break
            acted = True
            for action in actions:
                if isinstance(action, Send):
                    self.endpoint.send(action.dst_group, action.msg)
                elif isinstance(action, SendDatagrams):
                    self.endpoint.send_datagrams(action.dst_group, action.datagrams)
                elif isinstance(action, Pulse):
                    self.endpoint.pulse(action.dst_group, action.msg, action.every_us,
                                        action.until_us, action.lease_us)
                else:
                    self.on_action(action)
        else:
            log.error("llft driver: the core kept producing actions for %d rounds",
                      MAX_PUMP_ROUNDS)
        self._arm_soon()
        if acted:
            self.progress.set()

    def _arm_soon(self) -> None:
        """Arm the timer (and hand the silence watches) once per loop turn, before the
        loop next waits, however many pumps the turn made: under load a turn pumps after
        every message, app read and send, and the next deadline is only needed before
        the selector sleeps (a callback scheduled now runs before that)."""
        if self._arm_handle is None and self._loop is not None:
            self._arm_handle = self._loop.call_soon(self._arm_timer)

    def _arm_timer(self) -> None:
        self._arm_handle = None
        if self._watch:
            at_us = self.core.next_timer_us(watched=False)
            # the same list object: the core did not change since (a replica node keeps
            # it until membership changes; most pumps under load are messaging's)
            watches = self.core.silence_watches()
            if watches is not self._watches_handed:
                self._watches_handed = watches
                self._watch_rest = self.endpoint.watch(watches)
            rest = self._watch_rest
            if rest is not None and (at_us is None or rest < at_us):
                at_us = rest
        else:
            at_us = self.core.next_timer_us()
        if at_us is None or self._loop is None:
            return
        if self._timer is not None:
            if self._timer_at_us == at_us:
                return
            # earlier or later than the core's deadline now: a timer left armed for a
            # deadline since moved later (an ack came, a keep-alive was sent) woke the
            # loop to find nothing due -- 40-60 % of the primary's and the gateway's
            # timer turns at one client; cancelling one is a flag, re-arming a heap push
            self._timer.cancel()
        delay_s = max(0.0, (at_us - self.clock_us()) / 1e6)
        self._timer_at_us = at_us
        self._timer = self._loop.call_later(delay_s, self._on_timer)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `predicate()` holds after some pump; False on timeout."""
        return await wait_for_event(self.progress, predicate, timeout_s)
