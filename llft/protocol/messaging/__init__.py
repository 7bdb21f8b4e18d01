"""The LLFT low-latency messaging protocol, sans-IO.

One `MessagingEndpoint` per replica owns the replica's end of every virtual connection of
its group, identified as in the paper by (source group, destination group, connection
sequence number, role); locally a connection is `ConnId = (remote_group, conn_seq,
my_role)`. The group's *intra-group connection* (src_group == dst_group) carries
heartbeats, order info and the backups' local nacks. No clock, no I/O, no randomness:
drivers (llft/runtime, llft/sim) feed messages and time in and perform the actions.

The parts (each module opens with its own theory of operation):
    endpoint.py       MessagingEndpoint: sending, receiving, acks, watermarks, phase 2;
                      dispatch tables of primary and backup duties
    connection.py     one connection: SendState machine (STREAMING/THROTTLED/RESYNC),
                      send / recv / remote_view state, invariants (`check()`)
    timers.py         the one timer registry: Timer kinds, deadlines by (kind, connection)
    orderinfo_log.py  the order-info log: the primary's chunks until backups hold them,
                      piggyback sections, a backup's in-order delivery
    trailer.py        what the messaging core carries in a message's `order_info` field
    closed.py         ClosedSeqs: the connections this replica freed, as merged ranges
    rules.py          protocol rules as tables (who answers a FIRST_ACK, primary-only types)
    actions.py        what the endpoint asks of its driver (Send, Deliver, ...)
    config.py         MessagingConfig (every bound), BufferFull, ProtocolError, ConnId

API (the driver, the replica node and membership use only this)
    e = MessagingEndpoint(group, birth_id, MessagingConfig(...))
    e.set_view(pvn, primary_birth_id, [(birth_id, precedence), ...], my_birth_id, now_us)
    cid = e.open(remote_group, conn_seq, Role.CLIENT)   # remote-opened: Opened(cid)
    e.send(cid, data, now_us) -> bytes accepted;  e.send_space(cid);  e.in_flight(cid)
    e.close(cid, abort=False, now_us)   # our stream ends (FIN, or RST if abort)
    e.add_order_info(chunk, now_us) -> position   (primary; BufferFull at the bound)
    e.order_info_unprotected_bytes(), e.order_info_held(), e.order_info_produced()
    e.handle_message(msg, now_us); e.handle_timer(now_us); e.next_timer_us();
    e.take_actions() -> [Send | Deliver | Closed | Freed | DeliverOrderInfo | Opened |
                         Resynced | RecoveredOrderInfo | Phase2Done]
    e.snapshot() -> dict;  e.restore(snapshot) -> {cid: our stream's end}   (a joiner)
    e.buffer_sizes(), e.stats, e.last_heard_us (intra-group liveness, for membership),
    e.check() (invariants, for the simulator)
"""
from llft.protocol.messaging.actions import (ACTION_TYPES, Closed, Deliver, DeliverOrderInfo,
                                             Freed, MessagingAction, Opened, Phase2Done,
                                             RecoveredOrderInfo, Resynced, Send)
from llft.protocol.messaging.config import (INTRA_CONN_SEQ, BufferFull, ConnId,
                                            MessagingConfig, ProtocolError)
from llft.protocol.messaging.endpoint import MessagingEndpoint
from llft.protocol.messaging.rules import PRIMARY_ONLY_TYPES, RESPONDS_TO_FIRST_ACK, Duty
from llft.protocol.messaging.timers import Timer
from llft.protocol.messaging.trailer import pack_trailer, unpack_trailer

__all__ = ["ACTION_TYPES", "BufferFull", "Closed", "ConnId", "Deliver", "Freed", "DeliverOrderInfo", "Duty",
           "INTRA_CONN_SEQ", "MessagingAction", "MessagingConfig", "MessagingEndpoint",
           "Opened", "PRIMARY_ONLY_TYPES", "Phase2Done", "ProtocolError", "RESPONDS_TO_FIRST_ACK",
           "RecoveredOrderInfo", "Resynced", "Send", "Timer", "pack_trailer", "unpack_trailer"]
