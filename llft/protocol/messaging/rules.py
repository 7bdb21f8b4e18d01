"""The messaging protocol's rules that are data rather than code.

RESPONDS_TO_FIRST_ACK: who answers a FIRST_ACK with a SECOND_ACK (the paper's lines 60-68).
PRIMARY_ONLY_TYPES: the inter-group messages only a remote *primary* sends; their timestamp
and sent-up-to advance recv_ts, and they tell a member of a change of remote primary.
news_of_primary: whether such a message is later word of a remote group's primary than
what `primary_heard` holds (a PROBE's answer: "when did you last hear our primary?").
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


def news_of_primary(heard: tuple[int, int, int, int] | None, pvn: int, sender: int,
                    ts: int) -> bool:
    """A remote primary's message (view `pvn`, birth `sender`, Lamport `ts`) is news
    against `heard` (pvn, sender, when, ts): of a later view, of another primary of the
    same view, or of the same primary with a later timestamp. Its timestamps only rise,
    so an older one is a copy: reordered, or relayed by our primary, which re-multicasts
    the remote data its backups may lack as the remote sent it. Counted as heard, a
    relayed copy made a remote primary that had crashed 34 ms before look alive, and
    its group's backup, told so by every one of our members, never took over
    (replica_relayed_copy_is_no_word_of_a_crashed_primary)."""
    return (heard is None or pvn > heard[0]
            or pvn == heard[0] and (sender != heard[1] or ts > heard[3]))
