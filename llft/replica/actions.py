"""The actions a `ReplicaNode` emits: one vocabulary from the replica to its runtime.

Theory of operation
-------------------
After every event the node hands out, through `take_actions()`, exactly the types
listed here, nothing else (`ReplicaNode._emit` checks it):

    Send                a datagram for the network (both cores' sends, unchanged);
                        the driver multicasts it, the agent never sees one
    Pulse               messaging's HEARTBEAT, which the driver repeats (messages.Pulse)
    Deliver             bytes for the application, exactly once, in offset order per
                        connection (messaging's own type, after the node's de-duplication)
    OrderInfo           an application order-info chunk, in order, at a backup (and at a
                        new primary, those phase 2 recovered)
    ViewSwitch          the entry that starts primary view `pvn` was reached
    Restored            a joining backup holds the group's state: replay it
    RestartApp          the replica was reset: kill the application

and, passed through for status and checks (the node already acted on them):

    from membership     MembershipChanged, ViewEntered, BeginPhase2, ViewStarted,
                        StateRestored, Reset
    from messaging      Closed (a remote stream ended after its last Deliver), Freed
                        (the connection is gone), Opened, Resynced, Phase2Done,
                        RecoveredOrderInfo

A runtime dispatches on these types (a `match` or a table of handlers) and treats any
other object as a bug.
"""
from __future__ import annotations

from dataclasses import dataclass

from llft.protocol import messaging as mg
from llft.protocol.messages import Pulse, Send
from membership import core as mb

# The node's deliveries are messaging's Deliver, emitted after the node's own
# de-duplication and the trimming a joining backup needs.
Deliver = mg.Deliver


@dataclass(frozen=True, slots=True)
class OrderInfo:
    pvn: int
    pos: int
    chunk: bytes


@dataclass(frozen=True, slots=True)
class ViewSwitch:
    """The order-info entry that starts primary view `pvn` (position `pos`) was reached:
    at the primary when its view starts, at a backup when it delivers the marker."""
    pvn: int
    pos: int
    primary: bool


@dataclass(frozen=True, slots=True)
class Restored:
    """A joining backup got the group's state: the application replays `streams`
    (conn -> bytes delivered so far) and `order_info` ((pvn, pos, chunk) app entries),
    then runs on ordinary deliveries. `log_upto`: per view, the last position the
    state held, of any kind (markers and catch-ups too); what follows comes as
    OrderInfo / ViewSwitch actions, possibly in the same batch of actions."""
    streams: tuple[tuple[mg.ConnId, bytes], ...]
    order_info: tuple[tuple[int, int, bytes], ...]
    app_state: bytes
    ends: tuple[tuple[mg.ConnId, bool], ...] = ()   # streams that ended there (abort?)
    log_upto: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RestartApp:
    """The replica was reset: kill the application; a new one starts after Restored."""
    old_birth: int
    new_birth: int
    reason: str


# Passed through: the cores' own types, named here so that a runtime finds the whole
# vocabulary in this module.
MembershipChanged, ViewEntered = mb.MembershipChanged, mb.ViewEntered
BeginPhase2, ViewStarted = mb.BeginPhase2, mb.ViewStarted
StateRestored, Reset, JoinRefused = mb.StateRestored, mb.Reset, mb.JoinRefused
Closed, Freed = mg.Closed, mg.Freed
Opened, Resynced = mg.Opened, mg.Resynced
Phase2Done, RecoveredOrderInfo = mg.Phase2Done, mg.RecoveredOrderInfo

NODE_OWN = (Deliver, OrderInfo, ViewSwitch, Restored, RestartApp)
FROM_MEMBERSHIP = (MembershipChanged, ViewEntered, BeginPhase2, ViewStarted, StateRestored,
                   Reset, JoinRefused)
FROM_MESSAGING = (Closed, Freed, Opened, Resynced, Phase2Done, RecoveredOrderInfo)
ACTION_TYPES = (Send, Pulse) + NODE_OWN + FROM_MEMBERSHIP + FROM_MESSAGING

NodeAction = (Send | Pulse | Deliver | OrderInfo | ViewSwitch | Restored | RestartApp
              | MembershipChanged | ViewEntered | BeginPhase2 | ViewStarted | StateRestored
              | Reset | JoinRefused | Closed | Freed | Opened | Resynced | Phase2Done | RecoveredOrderInfo)
