"""What the messaging core asks its driver to do, or tells it: the whole vocabulary.

`MessagingEndpoint.take_actions()` returns these, in the order they arose. `Send` is the
vocabulary every protocol core shares (defined with the messages); the rest are the
messaging core's own. The replica node (llft/replica/actions.py) passes several on.
"""
from __future__ import annotations

from dataclasses import dataclass

from llft.protocol.messages import Send
from llft.protocol.messaging.config import ConnId


@dataclass(frozen=True, slots=True)
class Deliver:
    """Bytes of the remote application's stream, exactly once and in offset order."""
    conn: ConnId
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Closed:
    """The remote application's stream ended at `offset`, after every byte before it
    (exactly once): a FIN (it closed or shut down its side), or a reset if `abort`."""
    conn: ConnId
    offset: int
    abort: bool


@dataclass(frozen=True, slots=True)
class Freed:
    """Both streams of the connection ended and this replica dropped every piece of
    state it had for it (messages for it are ignored from now on)."""
    conn: ConnId


@dataclass(frozen=True, slots=True)
class DeliverOrderInfo:
    """A backup: the primary's order-info chunk at `pos`, exactly once, in position order."""
    pos: int                # 1, 2, ... within the primary view `pvn`
    chunk: bytes
    pvn: int = 0


@dataclass(frozen=True, slots=True)
class Opened:
    """A remote group opened a connection to us."""
    conn: ConnId


@dataclass(frozen=True, slots=True)
class Resynced:
    """Phase 2 done on a connection: the remote end had `resend_from` bytes of ours."""
    conn: ConnId
    resend_from: int
    remote_sent_to: int


@dataclass(frozen=True, slots=True)
class RecoveredOrderInfo:
    """Phase 2: the last order info of the old primary that the remote primary holds
    (reflected in NEW_PRIMARY_VIEW_ACK), for membership/determinizer to catch up."""
    conn: ConnId
    pvn: int                # the old primary's view
    first_pos: int
    chunks: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Phase2Done:
    """Every connection resynchronised after this replica became primary of `pvn`."""
    pvn: int


MessagingAction = Send | Deliver | Closed | Freed | DeliverOrderInfo | Opened | Resynced \
    | RecoveredOrderInfo | Phase2Done
ACTION_TYPES = (Send, Deliver, Closed, Freed, DeliverOrderInfo, Opened, Resynced,
                RecoveredOrderInfo, Phase2Done)
