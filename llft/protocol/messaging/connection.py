"""One connection's state (moved; to be restructured)."""
from __future__ import annotations

from collections import deque

from llft.protocol.messages import Message
from llft.protocol.messaging.config import ConnId


class ReceiveSequence:
    """Receive sequence of one remote primary view on one connection."""
    __slots__ = ("pvn", "upto", "ts", "slots", "nacks", "first_offset", "after_change")

    def __init__(self, pvn: int):
        self.pvn = pvn
        self.upto = 0                       # receiveduptomsn
        self.ts = 0                         # recv_ts (see theory)
        self.slots: dict[int, Message | None] = {}   # msn > upto: message or placeholder
        self.nacks: set[int] = set()
        self.first_offset: int | None = None
        self.after_change = False           # follows a remote change of primary


class Connection:
    def __init__(self, cid: ConnId):
        self.cid = cid
        self.remote, self.seq, self.role = cid
        self.known = False                  # counted in the watermark and digest
        # sending side
        self.out_offset = 0                 # end of the bytes our app produced
        self.queue: deque[tuple[int, bytes]] = deque()    # primary: cut, not yet sent
        self.queue_bytes = 0
        self.next_msn = 1
        self.sent: deque[Message] = deque() # primary: sent list (msn order)
        self.sent_bytes = 0
        self.log: deque[tuple[int, int, bytes]] = deque()  # backup: (msn, offset, data)
        self.log_bytes = 0
        self.remote_ack = 0
        self.remote_gw = 0                  # remotegroupwatermark
        self.rto_us = 0
        self.fa_count = 0                   # FIRST_ACKs seen for our last msn
        self.last_send_us = 0
        self.sent_open = False
        self.resync = False                 # new primary: waiting NEW_PRIMARY_VIEW_ACK
        self.npv_answer: tuple[int, int, int] | None = None   # (remote pvn, low, sent_to)
        self.old_ts: int | None = None      # recv_ts frozen at a remote change of primary
        self.solicit_after = 0              # not again before this time
        self.old_pvn = 0
        # receiving side
        self.rx: ReceiveSequence | None = None
        self.rx_old: ReceiveSequence | None = None
        self.delivered = 0                  # stream offset delivered
        self.received: deque[Message] = deque()   # delivered, kept until ts <= GW
        self.ahead: dict[int, bytes] = {}   # offset -> data beyond `delivered` (view change)
        self.fa_pending = 0                 # FIRST_ACK ack value awaiting SECOND_ACK
        self.fa_tries = 0
        self.declared: tuple[int, int] = (0, 0)   # remote primary's (sent_upto, ts)
        self.to_reflect: list | None = None
        self.last_remote_oi: list | None = None   # newest order info the remote carried
        self.max_data_ts = 0                # highest ts of data received on this conn
        self.ka_urgent = False              # group watermark news for the remote sender
        self.last_back = 0                  # `back` in the last message we sent on it
        self.remote_delivered = 0           # remote primary's delivered offset of our stream

    @property
    def last_msn(self) -> int:
        return self.next_msn - 1


