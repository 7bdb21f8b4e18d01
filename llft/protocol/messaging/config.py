"""The messaging core's bounds and its two exceptions.

Every bound the protocol keeps is a field of `MessagingConfig` (the simulator asserts them
at quiescence through `MessagingEndpoint.buffer_sizes()`); `__post_init__` rejects
combinations under which a member could fall out of the window for good.
"""
from __future__ import annotations

from dataclasses import dataclass

from llft.protocol.messages import Role

ConnId = tuple[str, int, Role]          # (remote_group, conn_seq, my_role)

INTRA_CONN_SEQ = 0                      # conn_seq of the intra-group connection


@dataclass(frozen=True, slots=True)
class MessagingConfig:
    window_msgs: int = 32               # sent, not yet covered by the remote group watermark
    max_payload_bytes: int = 1024       # data bytes per message
    max_queue_bytes: int = 64 << 10     # app bytes accepted, not yet sent (primary) per conn
    max_log_bytes: int = 256 << 10      # app bytes logged, not yet acked (backup) per conn
    max_placeholders: int = 32          # receive gap bound (== window_msgs: nothing beyond)
    max_connections: int = 16384        # open at once (freed ones do not count)
    max_freed_pending: int = 256        # primary: frees its backups have not applied yet
    retransmit_us: int = 4_000          # floor of the estimated retransmission timeout
    retransmit_max_us: int = 250_000    # its ceiling (after back-off)
    first_ack_delay_us: int = 1_000
    first_ack_retry_us: int = 4_000
    first_ack_max_tries: int = 8
    first_ack_slowdown: int = 3         # FIRST_ACKs of our last message before throttling
    throttle_us: int = 20_000
    keepalive_us: int = 15_000
    heartbeat_us: int = 5_000
    # a quiet member's heartbeat is refreshed every this many intervals (the driver
    # repeats it in between while its loop lives: messages.Pulse and its lease); 1: a
    # new one every interval. 50 (1 s at the default 20 ms): an idle loop sleeps that
    # long, its detectors' deadlines being watched by the pulse thread meanwhile
    # (llft/runtime/pulse.py, silence watches); a hung loop still falls silent after
    # the lease (messages.PULSE_LEASE_INTERVALS), not after the refresh
    pulse_intervals: int = 50
    watermark_report_us: int = 2_000    # a backup whose watermark rose reports this soon
    nack_delay_us: int = 500
    nack_retry_us: int = 3_000
    max_nack_msns: int = 64             # msns per NACK
    npv_retry_us: int = 5_000
    max_order_info_bytes: int = 256 << 10   # order info held at the primary
    max_order_info_pending: int = 1024  # out-of-order chunks held at a backup
    max_piggyback_bytes: int = 4096     # order info per message
    order_info_intra_us: int = 6_000    # order info not acked by a backup this long -> ORDER_INFO
    # a backup acks delivered order info this promptly (and its watermark report above):
    # each report wakes the primary and the other backups, and at 500 µs / 1 ms one came
    # about every request at one client, in the middle of the next one's path; at 2 ms
    # p50 fell 13-17 % in four paired runs (docs/BENCHMARKS.md, "Backups report every
    # 2 ms"). intra stays 3x the ack: a reflection plus the ack's delay come before it
    order_info_ack_us: int = 2_000
    # ... and a direct ORDER_INFO (the primary waits for it: output commit, or positions
    # order_info_intra_us old) this promptly: at once (scenarios recorded before: 500)
    order_info_direct_ack_us: int = 0
    accepts_connections: bool = True   # False: a group that only opens them (a gateway)
    # A remote group of one (a gateway: its id starts with one of `lone_groups`) silent
    # this long on a connection is gone (its host died): the primary takes it as the
    # remote's reset after what it delivered. Far above any silence of a live gateway
    # (its backed-off keep-alives: every 480 ms), far below "forever" (the dead
    # connection pins the group watermark, so every other connection's flow control
    # waits for this). A replicated remote group is never taken for gone: a backup takes
    # over, however long it first takes to catch up (a rejoined backup replaying a Spark
    # driver's history: a minute), and its connections must still be there.
    remote_timeout_us: int = 3_000_000
    lone_groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # a member can be at most a window behind the sender: its gaps must fit
        if self.max_placeholders < self.window_msgs:
            raise ValueError("max_placeholders must be >= window_msgs")
        # a backup keeps a window of acked messages: its log must hold more than that
        if self.max_log_bytes < 2 * self.window_msgs * self.max_payload_bytes:
            raise ValueError("max_log_bytes must be >= 2 * window_msgs * max_payload_bytes")
        if min(self.window_msgs, self.max_payload_bytes, self.max_nack_msns,
               self.pulse_intervals) < 1:
            raise ValueError("window, payload and nack bounds must be positive")


class BufferFull(Exception):
    """The application produced more than a bound allows (the caller must wait)."""


class ProtocolError(Exception):
    """A local misuse of the endpoint (e.g. order info from a backup)."""
