"""The messaging protocol's rules that are data rather than code.

RESPONDS_TO_FIRST_ACK: who answers a FIRST_ACK with a SECOND_ACK (the paper's lines 60-68).
PRIMARY_ONLY_TYPES: the inter-group messages only a remote *primary* sends; their timestamp
and sent-up-to advance recv_ts, and they tell a member of a change of remote primary.
"""
from __future__ import annotations

import enum

from llft.protocol.messages import MsgType


class Duty(enum.Enum):
    SECOND_ACK = "second_ack"
    NOTHING = "nothing"


# (am_primary, group_has_backups) -> duty
RESPONDS_TO_FIRST_ACK: dict[tuple[bool, bool], Duty] = {
    (False, True): Duty.SECOND_ACK,     # a backup, if its app produced the acked message
    (True, False): Duty.SECOND_ACK,     # no backup: the primary carries the duty
    (True, True): Duty.NOTHING,
    (False, False): Duty.NOTHING,       # impossible (a backup implies backups)
}

PRIMARY_ONLY_TYPES = frozenset({MsgType.REQUEST, MsgType.REPLY, MsgType.FIRST_ACK,
                                MsgType.KEEP_ALIVE, MsgType.NACK, MsgType.NEW_PRIMARY_VIEW,
                                MsgType.NEW_PRIMARY_VIEW_ACK})
