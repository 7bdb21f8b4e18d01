"""The LLFT low-latency messaging protocol, sans-IO (placeholder map)."""
from llft.protocol.messaging.actions import (ACTION_TYPES, Deliver, DeliverOrderInfo,
                                             MessagingAction, Opened, Phase2Done,
                                             RecoveredOrderInfo, Resynced, Send)
from llft.protocol.messaging.config import (INTRA_CONN_SEQ, BufferFull, ConnId,
                                            MessagingConfig, ProtocolError)
from llft.protocol.messaging.endpoint import MessagingEndpoint
from llft.protocol.messaging.rules import PRIMARY_ONLY_TYPES, RESPONDS_TO_FIRST_ACK, Duty
from llft.protocol.messaging.timers import Timer
from llft.protocol.messaging.trailer import pack_trailer, unpack_trailer

__all__ = ["ACTION_TYPES", "BufferFull", "ConnId", "Deliver", "DeliverOrderInfo", "Duty",
           "INTRA_CONN_SEQ", "MessagingAction", "MessagingConfig", "MessagingEndpoint",
           "Opened", "PRIMARY_ONLY_TYPES", "Phase2Done", "ProtocolError", "RESPONDS_TO_FIRST_ACK",
           "RecoveredOrderInfo", "Resynced", "Send", "Timer", "pack_trailer", "unpack_trailer"]
