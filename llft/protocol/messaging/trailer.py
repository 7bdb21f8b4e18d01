"""The trailer: what the messaging core itself carries in a message's `order_info` field.

msgpack [sent_upto, own | None, reflected | None, others, delivered]:
  sent_upto  the sender's last msn on this connection (0 while it resynchronises)
  own        order info of the sending primary, piggybacked for the receiving group to
             reflect back (a section, below)
  reflected  the receiving group's primary's order info, reflected back to its backups
  others     [conn_seq, role, sent_upto] of the sender's other connections to the same
             group, so that their recv_ts advance too
  delivered  how far the sending primary has delivered the receiver's stream on this
             connection (stream offset)
A section is [pvn, first_pos, [chunk, ...]]; the chunks stay opaque (the determinizer's
codec). The last two fields are optional (older senders); anything malformed is ignored.
"""
from __future__ import annotations

from typing import Any

import msgpack

Section = list          # [pvn, first_pos, [chunk, ...]]


def pack_trailer(sent_upto: int, own: Section | None, refl: Section | None,
                 others: list | None = None, delivered: int | None = None) -> bytes:
    t = [sent_upto, own, refl]
    if others or delivered is not None:
        t.append(others or [])
    if delivered is not None:
        t.append(delivered)
    return msgpack.packb(t, use_bin_type=True)


def unpack_trailer(raw: bytes) -> tuple[int, Section | None, Section | None, list,
                                        int | None] | None:
    """The trailer, or None when absent or malformed (a remote bug: ignored)."""
    if not raw:
        return None
    try:
        t = msgpack.unpackb(raw, raw=False, use_list=True)
    except Exception:   # noqa: BLE001 -- authenticated but malformed: ignore
        return None
    if type(t) is not list or len(t) not in (3, 4, 5) or type(t[0]) is not int:
        return None
    own, refl = (checked_section(s) for s in t[1:3])
    others: list = []
    if len(t) >= 4 and type(t[3]) is list:
        others = [e for e in t[3] if type(e) is list and len(e) == 3
                  and all(type(x) is int for x in e) and e[1] in (0, 1)]
    delivered = t[4] if len(t) == 5 and type(t[4]) is int and t[4] >= 0 else None
    return t[0], own, refl, others, delivered


# Order-info positions count chunks from 1; a section ending past this is malformed. (A
# section ending at 2**64 once made the reflection of the next one start beyond what
# msgpack packs: our next message to that group raised OverflowError.)
MAX_POSITION = (1 << 63) - 1


def checked_section(s: Any) -> Section | None:
    """An order-info section [pvn, first_pos, [chunk, ...]], or None."""
    if (type(s) is list and len(s) == 3 and type(s[0]) is int and type(s[1]) is int
            and 0 < s[1] and type(s[2]) is list and all(type(c) is bytes for c in s[2])
            and s[1] + len(s[2]) - 1 <= MAX_POSITION):
        return s
    return None


def unreflected(sec: Section, reflected: tuple[int, int] | None) -> Section | None:
    """The part of a remote primary's section `sec` past `reflected` (the section_end
    of what was reflected to its group already), or None if nothing is new."""
    rpvn, rpos = reflected or (0, 0)
    pvn, first, chunks = sec
    if pvn == rpvn and first <= rpos:
        chunks = chunks[rpos - first + 1:]
        if not chunks:
            return None
        return [pvn, rpos + 1, chunks]
    if pvn < rpvn:
        return None
    return sec


def section_end(s: Section) -> tuple[int, int]:
    """(pvn, last position) of a section: newer sections compare greater."""
    return s[0], s[1] + len(s[2]) - 1
