"""The messages of the LLFT protocols, as values (no encoding here: see llft/protocol/wire.py).

Theory of operation
-------------------
Every datagram carries one `Message`: the header fields of the LLFT paper (figure
"message types and message headers") plus our own `version`, `sender` (the sending
replica's birth id, which the paper's heartbeats and acknowledgments imply) and a typed
`body`. A connection is identified, as in the paper, by the quadruple
(src_group, dst_group, conn_seq, role); the intra-group connection of a group is the one
whose src_group == dst_group.

The body of each message type is a dict whose keys and value types are fixed by
`BODY_FIELDS` below: the protocol cores build bodies from it, the wire decoder rejects
any body that does not match it exactly, and the scapy layer and fuzz tests read it too.
One table, so the protocol's vocabulary can be read (and checked) in one place.

`order_info` is the opaque piggybacked order-information section (the determinizer's
codec fills it); the messaging protocol carries and reflects it without looking inside.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# the wire format: a datagram of another version is rejected as such (2: HEARTBEAT
# gained `replay`; 3: HEARTBEAT gained `rm`, PROPOSE_PRIMARY `evidenced`, PROBE answers
# `listen`; native/lane/llft_lane.h says the same)
WIRE_VERSION = 3


class MsgType(enum.IntEnum):
    # application data (message sequence number > 0); "request" on a client-role
    # connection, "reply" on a server-role one, as in the paper
    REQUEST = 1
    REPLY = 2
    # messaging control
    FIRST_ACK = 3
    SECOND_ACK = 4
    KEEP_ALIVE = 5
    NACK = 6
    HEARTBEAT = 7
    ORDER_INFO = 8          # intra-group path for order info with no outgoing message to ride on
    CLOSED = 9              # a primary's answer on a connection it freed: both streams ended
                            # and every member of its group has the remote's whole stream
    JOINER_OI_ACK = 10      # a joiner still receiving its state holds the primary's order
                            # info from position `from` to `upto` (intra-group; node.py)
    # membership (multicast on the intra-group connection, except NEW_PRIMARY_VIEW*);
    # numbered from FIRST_MEMBERSHIP_TYPE
    PROPOSE_PRIMARY = 20
    PROPOSE_PRIMARY_ACK = 21
    PROPOSE_BACKUP = 22
    ACCEPT_BACKUP = 23
    ACCEPT_BACKUP_ACK = 24
    REMOVE_BACKUP = 25
    REMOVE_BACKUP_ACK = 26
    STATE = 27
    STATE_ACK = 28
    NEW_PRIMARY_VIEW = 29   # on each inter-group connection, phase 2 of a primary change
    NEW_PRIMARY_VIEW_ACK = 30
    # a backup whose fault detector fired asks each remote group it has connections with
    # "when did you last hear our primary?"; every member of that group answers
    # (`answer` 1, with what it last heard of the asking group's primary). A takeover
    # needs an answer that our primary is silent there too (membership/core.py,
    # "Takeover needs evidence"). Between groups, off any connection (conn_seq 0).
    PROBE = 31
    # a primary's answer to an application it will not admit (its group's log reached its
    # cap, docs/LOG.md): `to` the applicant's birth id, `why` one line for its operator
    REFUSE_BACKUP = 32
    # a primary stopping for good (SIGTERM, its backups holding its order info): the
    # senior backup's detector fires at once (the evidence is still asked for)
    LEAVE = 33


# Kinds of message type, each written once. Membership's types are numbered from 20: they
# carry their own view rules (the wire codec's old-view check skips them). The pair of
# phase 2 of a primary change is numbered with them but handled by the messaging core,
# on each inter-group connection.
FIRST_MEMBERSHIP_TYPE = 20
DATA_TYPES = frozenset({MsgType.REQUEST, MsgType.REPLY})
MEMBERSHIP_TYPES = frozenset(t for t in MsgType if t >= FIRST_MEMBERSHIP_TYPE)
PHASE2_TYPES = frozenset({MsgType.NEW_PRIMARY_VIEW, MsgType.NEW_PRIMARY_VIEW_ACK})
# what membership's core handles (a PROBE is answered by the messaging core: the
# gateway, which has no membership, answers too)
MEMBERSHIP_CORE_TYPES = MEMBERSHIP_TYPES - PHASE2_TYPES - {MsgType.PROBE}


class Role(enum.IntEnum):
    CLIENT = 0
    SERVER = 1


ROLES = (Role.CLIENT, Role.SERVER)  # by value: an index, not Enum's call (Python code)


# Body schema per message type: field name -> accepted Python type(s) after msgpack
# decoding. `list` fields hold msgpack arrays whose elements the owning core validates.
BODY_FIELDS: dict[MsgType, dict[str, type | tuple[type, ...]]] = {
    # offset: stream offset of data[0] (survives primary changes); flags: STREAM_* bits
    MsgType.REQUEST: {"offset": int, "data": bytes, "flags": int},
    MsgType.REPLY: {"offset": int, "data": bytes, "flags": int},
    MsgType.FIRST_ACK: {},
    MsgType.SECOND_ACK: {},
    MsgType.KEEP_ALIVE: {},
    MsgType.NACK: {"missing": list},                 # message sequence numbers wanted
    # served: 1 from a primary with connections to remote groups (or that had data from
    # one in this view): a branch some client may have seen; lineage: as in ACCEPT_BACKUP
    # (both for membership/rules.py `competing_primary_wins`); change: the sender's
    # membership change in its view (a backup that hears a later one from its primary is
    # behind: maybe removed; membership/core.py `probe_answered`)
    # wait: ms beyond its floor the sender's detector on its primary waits (0 but for a
    # backup: membership/core.py `detector_wait_ms`; a junior backup waits as long)
    # replay: 1 from a backup whose application still replays the history it joined with
    # (its runtime's "catching-up"): its primary's timeouts on it are the longest then
    # (membership/core.py `_receiving_state`)
    # done: a backup's executed order-info position in its view, as in its ORDER_INFO
    # report; repeated with every heartbeat copy, so a lost report is made good (0 from a
    # primary and in membership's own heartbeat)
    # rm: a primary's shortest removal timeout on any of its backups, in ms (0 from a
    # backup; membership/core.py `removal_wait_ms`)
    MsgType.HEARTBEAT: {"rank": int, "served": int, "lineage": int, "change": int,
                        "wait": int, "replay": int, "rm": int, "done": int},
    # upto: order-info position carried (primary) / delivered (backup's ack); done: the
    # position the backup's application has executed (its lag report; 0 from a primary)
    MsgType.ORDER_INFO: {"upto": int, "done": int},
    MsgType.CLOSED: {},
    MsgType.JOINER_OI_ACK: {"upto": int, "from": int},
    # membership: "change" numbers the versions of one proposal / the changes inside a view;
    # "max_precedence" is the highest precedence ever assigned, so a new primary continues
    # above it; "old_primary" (birth id) names, with old_pvn, the view a proposal replaces
    # (added by the membership core, additively); a member is [birth_id, precedence]
    # (ranks are derived: primary 1, backups 2..n by precedence, never carried);
    # "evidenced": 1 if the proposer took a remote group's word that the primary is silent
    # (0: it knew no remote group, the paper's takeover; membership/core.py)
    MsgType.PROPOSE_PRIMARY: {"members": list, "old_pvn": int, "old_primary": int,
                              "change": int, "max_precedence": int, "evidenced": int},
    MsgType.PROPOSE_PRIMARY_ACK: {"proposer": int, "change": int, "max_precedence": int},
    MsgType.PROPOSE_BACKUP: {"host": str, "pid": int},
    # lineage: the view number at which the group's lineage was founded and when, in one
    # int (membership/rules.py `lineage_of`; a joiner takes it from its primary;
    # `competing_primary_wins`)
    MsgType.ACCEPT_BACKUP: {"members": list, "old_members": list, "change": int,
                            "max_precedence": int, "lineage": int},
    MsgType.ACCEPT_BACKUP_ACK: {"change": int},
    MsgType.REFUSE_BACKUP: {"to": int, "why": str},
    MsgType.LEAVE: {},
    MsgType.REMOVE_BACKUP: {"members": list, "old_members": list, "change": int,
                            "max_precedence": int, "lineage": int},
    MsgType.REMOVE_BACKUP_ACK: {"change": int},
    MsgType.STATE: {"to": int, "chunk": int, "chunks": int, "data": bytes},
    MsgType.STATE_ACK: {"chunk": int},
    MsgType.NEW_PRIMARY_VIEW: {"old_pvn": int, "last_delivered": int},
    MsgType.NEW_PRIMARY_VIEW_ACK: {"last_delivered_from": int, "last_sent_to": int},
    # answer 1: pvn/primary (birth id, 0: none) of the asking group's primary last heard
    # (its messages only a primary sends), `ago` microseconds before this answer; quiet:
    # microseconds since the answerer last heard a majority of its own group's view of
    # `size` members (membership/core.py `probe_state`, `_answer_is_lost`); listen:
    # microseconds the answerer has listened (since its messaging started)
    MsgType.PROBE: {"answer": int, "pvn": int, "primary": int, "ago": int, "quiet": int,
                    "size": int, "listen": int},
}


# flags of a data message's stream
STREAM_OPEN = 1   # first message of a connection's stream
# The end of a stream is one unit of its offset space (like TCP's FIN): the last byte of
# the message that carries one of these flags is not application data but the end marker,
# so the end is ordered, retransmitted, de-duplicated and resent after a change of
# primary exactly like data.
STREAM_FIN = 2    # the application closed its side (shutdown(SHUT_WR) or close)
STREAM_RST = 4    # the application aborted the connection (a TCP reset)
STREAM_END = STREAM_FIN | STREAM_RST


@dataclass(slots=True)
class Message:
    type: MsgType
    src_group: str
    dst_group: str
    conn_seq: int            # connection sequence number
    role: Role               # role of the *sender's* end of the connection
    pvn: int                 # sender's primary view number
    precedence: int          # sender's precedence (0 while not yet a member)
    sender: int              # sender's birth id
    msn: int = 0             # message sequence number (> 0 only for data messages)
    ack: int = 0             # last msn received without a gap from the remote primary
    back: int = 0            # group watermark (primary) / timestamp watermark (backup)
    ts: int = 0              # Lamport timestamp
    body: dict[str, Any] = field(default_factory=dict)
    order_info: bytes = b""  # opaque, piggybacked (determinizer codec)
    version: int = WIRE_VERSION


def probe(src_group: str, dst_group: str, *, pvn: int, precedence: int, sender: int,
          answer: dict | None = None) -> Message:
    """A PROBE (between groups, off any connection); `answer` is the body of an answer
    (None: the question)."""
    return Message(type=MsgType.PROBE, src_group=src_group, dst_group=dst_group,
                   conn_seq=0, role=Role.CLIENT, pvn=pvn, precedence=precedence,
                   sender=sender,
                   body=answer or {"answer": 0, "pvn": 0, "primary": 0, "ago": 0,
                                   "quiet": 0, "size": 0, "listen": 0})


@dataclass(frozen=True, slots=True)
class Send:
    """The action every protocol core emits to multicast `msg` to `dst_group`'s virtual
    port (docs/ARCHITECTURE.md); drivers and the simulator perform it."""
    dst_group: str
    msg: Message


@dataclass(frozen=True, slots=True)
class SendDatagrams:
    """A `Send` whose message is already encoded and sealed (a native steady lane,
    llft/protocol/messaging/native_lane.py): the driver multicasts the bytes as they
    are."""
    dst_group: str
    datagrams: list


@dataclass(frozen=True, slots=True)
class Pulse:
    """A `Send` of a HEARTBEAT that the driver goes on repeating, byte for byte, every
    `every_us` while its clock is <= `until_us` (or until the next Pulse replaces it).

    An idle member's heartbeats then cost its event loop nothing between two of the
    core's refreshes: a native thread repeats them (llft/runtime/pulse.py), and the
    receivers' threads absorb the copies, recording only when they arrived
    (`heard_again`). The core refreshes before `until_us`. The simulator kernel repeats
    it the same way.

    `lease_us` (0: none) is how long a *hung* driver goes on being announced: a copy is
    repeated only while the driver's loop is alive -- within `lease_us` of this Pulse,
    or of the last time the loop waited for events, or waiting now. A loop that sits
    in its selector is not hung, so a quiet member refreshes rarely (its loop sleeps),
    while a loop stuck in a handler falls silent `lease_us` after it last waited, and
    is announced again as soon as it waits again. A driver that cannot tell (no native
    thread: the loop repeats the copies itself, which a hung loop does not) ignores it;
    the simulator has no hung loop (a paused node stops whole).
    `msg` None: stop repeating (a reset replica's old incarnation falls silent at once)."""
    dst_group: str
    msg: Message | None
    every_us: int
    until_us: int
    lease_us: int = 0


# A driver whose loop has not waited for events for this many intervals (+ 1.5) is hung:
# its Pulse stops being repeated (`Pulse.lease_us`; the 90 ms that a refresh every 3
# intervals gave before the lease: `pulse_until_us(PULSE_LEASE_INTERVALS, interval)`).
PULSE_LEASE_INTERVALS = 3


def pulse_lease_us(interval_us: int) -> int:
    """A Pulse's lease (`Pulse.lease_us`) at heartbeat interval `interval_us`."""
    return pulse_until_us(PULSE_LEASE_INTERVALS, interval_us)


def pulse_until_us(refresh_intervals: int, interval_us: int) -> int:
    """How long after a refresh a quiet member's Pulse is repeated: past the copy that
    follows the next refresh, so that a refresh a little late finds the repetition still
    running (it only moves the end: no extra copy, no gap). A hung loop is announced
    this long at most."""
    return (refresh_intervals + 1) * interval_us + interval_us // 2


def stands_for_copies(msg: "Message | None", last: "Message | None") -> bool:
    """Whether an accepted pulse datagram (decoded as `msg`, None for a fragment) may
    stand for its source's absorbed copies from now on, in place of `last`: not an older
    heartbeat delayed past a newer one (a sender's messages rise in Lamport ts; a
    repeated one keeps its ts). An older one stood for the newer one's copies, which were
    then handed to the core as the older message again and again (the primary re-applied
    a backup's stale report for ever: scenario messaging_reordered_heartbeat_stale_report).
    The runtime's transport and the simulator's kernel both ask it."""
    return msg is None or last is None or msg.ts >= last.ts
