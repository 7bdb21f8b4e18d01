"""Sample messages of every type, for the wire codec's tests (both halves)."""
from llft.protocol.messages import BODY_FIELDS, DATA_TYPES, Message, MsgType, Role

KEY = bytes(range(32))
SAMPLE_VALUES = {int: 7, bytes: b"payload", str: "host-1", list: [[123, 1], [456, 2]]}


def sample_body(mtype):
    return {name: SAMPLE_VALUES[t if not isinstance(t, tuple) else t[0]]
            for name, t in BODY_FIELDS[mtype].items()}


def make(mtype=MsgType.REQUEST, src="client", dst="server", **kw):
    fields = dict(type=mtype, src_group=src, dst_group=dst, conn_seq=1, role=Role.CLIENT,
                  pvn=3, precedence=2, sender=0x1234_5678_9ABC, msn=5 if mtype in DATA_TYPES
                  else 0, ack=4, back=2, ts=99, body=sample_body(mtype),
                  order_info=b"\x01\x02")
    fields.update(kw)
    return Message(**fields)
