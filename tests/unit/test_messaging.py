"""Unit tests of the sans-IO messaging core (llft/protocol/messaging/).

Most tests wire endpoints by hand (a tiny router below) so each rule of the paper is
exercised exactly; the phase-2 and GC tests use the simulator kernel.
"""
from __future__ import annotations

import pytest

from llft.protocol.messages import Message, MsgType, Pulse, Role
from llft.protocol.messaging import (RESPONDS_TO_FIRST_ACK, BufferFull, Closed, Deliver,
                                    DeliverOrderInfo, Duty, Freed, MessagingConfig,
                                    MessagingEndpoint,
                                    Opened, Phase2Done, ProtocolError, RecoveredOrderInfo,
                                    Resynced, Send, Timer, pack_trailer, unpack_trailer)
from llft.sim.kernel import NetConfig, Sim

CFG = MessagingConfig(max_payload_bytes=100)


def ep(group, bid, members, primary, cfg=CFG):
    e = MessagingEndpoint(group, bid, cfg)
    e.set_view(1, primary, [(b, i + 1) for i, b in enumerate(members)], bid, now_us=0)
    return e


def sends(actions, mtype=None):
    """The messages sent: by a Send, or by a Pulse (a heartbeat the driver repeats)."""
    return [a.msg for a in actions if isinstance(a, (Send, Pulse)) and a.msg is not None
            and (mtype is None or a.msg.type == mtype)]


def delivered(actions):
    return b"".join(a.data for a in actions if isinstance(a, Deliver))


def advance(e, until_us):
    """Fire e's timers up to until_us; returns the actions (taken before too)."""
    acts = e.take_actions()
    while (t := e.next_timer_us()) is not None and t <= until_us:
        e.handle_timer(t)
        acts += e.take_actions()
    return acts


def heartbeats_both_ways(primary, backup):
    """The backup reports to its primary, the primary's HEARTBEAT answers with its group
    watermark; returns what the backup delivered on it."""
    for m in sends(advance(backup, 10_000), MsgType.HEARTBEAT):
        primary.handle_message(m, 10_000)
    got = b""
    for m in sends(advance(primary, 20_000), MsgType.HEARTBEAT):
        backup.handle_message(m, 20_000)
        got += delivered(backup.take_actions())
    return got


def pair(cfg=CFG, a_members=(1,), b_members=(2,)):
    """Group A (client) and group B (server), one connection A->B."""
    a = {b: ep("A", b, list(a_members), a_members[0], cfg) for b in a_members}
    b = {x: ep("B", x, list(b_members), b_members[0], cfg) for x in b_members}
    for e in a.values():
        e.open("B", 1, Role.CLIENT)
    for e in b.values():
        e.open("A", 1, Role.SERVER)
    return a, b


CONN_A = ("B", 1, Role.CLIENT)
CONN_B = ("A", 1, Role.SERVER)


def test_config_bounds_are_checked():
    with pytest.raises(ValueError):
        MessagingConfig(window_msgs=64, max_placeholders=8)


def test_first_ack_duty_table_matches_paper():
    assert RESPONDS_TO_FIRST_ACK[(False, True)] is Duty.SECOND_ACK   # a backup
    assert RESPONDS_TO_FIRST_ACK[(True, False)] is Duty.SECOND_ACK   # lone primary
    assert RESPONDS_TO_FIRST_ACK[(True, True)] is Duty.NOTHING


def test_data_is_cut_into_messages_with_msn_offset_and_ts():
    a, _ = pair()
    p = a[1]
    assert p.send(CONN_A, b"x" * 250, now_us=0) == 250
    msgs = sends(p.take_actions(), MsgType.REQUEST)
    assert [m.msn for m in msgs] == [1, 2, 3]
    assert [m.body["offset"] for m in msgs] == [0, 100, 200]
    assert msgs[0].body["flags"] == 1 and msgs[1].body["flags"] == 0   # STREAM_OPEN
    assert msgs[0].ts < msgs[1].ts < msgs[2].ts                         # Lamport
    assert unpack_trailer(msgs[2].order_info)[0] == 3                   # sent-up-to


def test_gap_creates_placeholders_and_a_remote_nack_then_in_order_delivery():
    a, b = pair()
    p, q = a[1], b[2]
    p.send(CONN_A, b"0123456789" * 30, now_us=0)
    m1, m2, m3 = sends(p.take_actions(), MsgType.REQUEST)
    q.handle_message(m1, 10)
    q.handle_message(m3, 20)
    acts = q.take_actions()
    assert delivered(acts) == m1.body["data"]
    assert q.buffer_sizes()["placeholders"] == 2          # placeholder for 2, 3 held
    assert any(isinstance(x, Opened) for x in acts) is False   # opened explicitly
    nacks = sends(advance(q, 600), MsgType.NACK)
    assert nacks and nacks[0].body["missing"] == [2] and nacks[0].dst_group == "A"
    q.handle_message(m2, 2_000)
    assert delivered(q.take_actions()) == m2.body["data"] + m3.body["data"]
    assert q.buffer_sizes()["placeholders"] == 0
    # the remote primary answers the nack from its sent list
    p.handle_message(nacks[0], 3_000)
    again = sends(p.take_actions(), MsgType.REQUEST)
    assert [m.msn for m in again] == [2]
    # a retransmission that fills nothing is discarded
    q.handle_message(again[0], 3_100)
    assert delivered(q.take_actions()) == b""


def test_backup_nacks_on_the_local_connection_and_primary_remulticasts():
    a, b = pair(b_members=(2, 3))
    p, q, qb = a[1], b[2], b[3]
    p.send(CONN_A, b"z" * 200, now_us=0)
    m1, m2 = sends(p.take_actions(), MsgType.REQUEST)
    for e in (q, qb):
        e.handle_message(m1, 10)
    q.handle_message(m2, 10)            # the backup loses m2
    q.take_actions()
    qb.take_actions()
    # the remote primary's keep-alive states sent-up-to 2: the backup sees the gap
    ka = p._msg(p.conns[CONN_A], MsgType.KEEP_ALIVE, {})
    qb.handle_message(ka, 100)
    local = [m for m in sends(advance(qb, 700), MsgType.NACK)]
    assert local and local[0].dst_group == "B" and local[0].src_group == "B"
    assert local[0].body["missing"] == [["A", 1, int(Role.SERVER), 1, 2]]
    q.handle_message(local[0], 200)
    resent = [a_ for a_ in q.take_actions() if isinstance(a_, Send) and a_.msg.type == MsgType.REQUEST]
    assert resent and resent[0].dst_group == "B" and resent[0].msg.msn == 2
    assert resent[0].msg.sender == 1            # the remote primary's original message
    qb.handle_message(resent[0].msg, 300)
    # received in order, but a backup delivers only what its primary has too: once the
    # primary's group watermark (its HEARTBEAT) covers the messages
    assert delivered(qb.take_actions()) == b""
    q.handle_message(p._msg(p.conns[CONN_A], MsgType.KEEP_ALIVE, {}), 400)
    qb.handle_message(p._msg(p.conns[CONN_A], MsgType.KEEP_ALIVE, {}), 400)
    got = heartbeats_both_ways(q, qb)
    assert got == m1.body["data"] + m2.body["data"]


def test_secondack_from_remote_backup_reveals_missing_message():
    a, b = pair(a_members=(1, 4), b_members=(2, 3))
    p = a[1]
    p.send(CONN_A, b"k" * 50, now_us=0)
    (m1,) = sends(p.take_actions(), MsgType.REQUEST)
    qb = b[3]
    second = Message(MsgType.SECOND_ACK, "A", "B", 1, Role.CLIENT, 1, 2, 4, ack=1,
                     ts=5)
    qb.handle_message(second, 10)               # line 72: ack for a message it lacks
    assert qb.buffer_sizes()["placeholders"] == 1
    assert sends(advance(qb, 600), MsgType.NACK)


def test_retransmission_until_acked_with_backoff():
    a, b = pair()
    p, q = a[1], b[2]
    p.send(CONN_A, b"r" * 10, now_us=0)
    (m1,) = sends(p.take_actions(), MsgType.REQUEST)
    t1 = p.next_timer_us()
    assert t1 is not None and t1 <= CFG.retransmit_us
    p.handle_timer(CFG.retransmit_us)
    (r1,) = sends(p.take_actions(), MsgType.REQUEST)
    assert (r1.msn, r1.ts, r1.body) == (m1.msn, m1.ts, m1.body)
    assert p.conns[CONN_A].send.rto_us == 2 * CFG.retransmit_us      # backoff
    # the remote primary's FIRST_ACK acknowledges: no more retransmission
    q.handle_message(r1, CFG.retransmit_us + 10)
    q.take_actions()
    (fa,) = sends(advance(q, CFG.retransmit_us + 1100), MsgType.FIRST_ACK)
    assert fa.ack == 1 and fa.dst_group == "A"
    p.handle_message(fa, 20_000)
    p.take_actions()
    assert p.timers.due(Timer.RETRANSMIT, CONN_A) is None


def test_a_timeout_resends_the_oldest_and_states_the_rest():
    """A timeout resends the oldest unacked message only, and a KEEP_ALIVE stating our
    sent-up-to: the remote primary NACKs what it lacks and gets it, while what merely
    waited for its ack is not sent again (a burst of the whole window per late ack
    was a fifth of a saturated gateway's REPLYs)."""
    a, b = pair()
    p, q = a[1], b[2]
    p.send(CONN_A, b"w" * 300, now_us=0)
    m1, m2, m3 = sends(p.take_actions(), MsgType.REQUEST)
    q.handle_message(m1, 100)               # m2 and m3 are lost on the way
    q.take_actions()
    p.take_actions()
    t = p.timers.due(Timer.RETRANSMIT, CONN_A)
    p.handle_timer(t)
    out = p.take_actions()
    (r1,) = sends(out, MsgType.REQUEST)
    (ka,) = sends(out, MsgType.KEEP_ALIVE)
    assert r1.msn == 1 and unpack_trailer(ka.order_info)[0] == 3
    assert p.stats["retransmit"] == 1
    q.handle_message(r1, t + 10)            # a duplicate here
    q.handle_message(ka, t + 20)
    (nack,) = sends(advance(q, t + 20 + CFG.nack_delay_us), MsgType.NACK)
    assert nack.body["missing"] == [2, 3]
    p.handle_message(nack, t + 1_000)
    resent = sends(p.take_actions(), MsgType.REQUEST)
    assert [m.msn for m in resent] == [2, 3]
    for m in resent:
        q.handle_message(m, t + 1_100)
    assert delivered(q.take_actions()) == b"w" * 200


def test_first_ack_answered_only_by_backup_that_produced_the_message():
    a, b = pair(a_members=(1, 4), b_members=(2,))
    p, pb, q = a[1], a[4], b[2]
    p.send(CONN_A, b"m" * 10, now_us=0)
    (m1,) = sends(p.take_actions(), MsgType.REQUEST)
    q.handle_message(m1, 100)
    q.take_actions()
    (fa,) = sends(advance(q, 3200), MsgType.FIRST_ACK)
    # the backup's app has not produced message 1 yet: no SECOND_ACK
    pb.handle_message(fa, 2_000)
    assert not sends(pb.take_actions(), MsgType.SECOND_ACK)
    # the primary with a backup does not answer either
    p.handle_message(fa, 2_000)
    assert not sends(p.take_actions(), MsgType.SECOND_ACK)
    pb.send(CONN_A, b"m" * 10, now_us=2_100)        # backups log, never send
    assert not sends(pb.take_actions(), MsgType.REQUEST)
    pb.handle_message(fa, 2_200)
    (sa,) = sends(pb.take_actions(), MsgType.SECOND_ACK)
    assert sa.ack == 1 and sa.dst_group == "B"
    # the SECOND_ACK stops FIRST_ACK retransmission, keep-alives follow
    q.handle_message(sa, 2_300)
    q.take_actions()
    assert (q.timers.due(Timer.FIRST_ACK, CONN_B) is None
            and q.timers.due(Timer.KEEPALIVE, CONN_B) is not None)


def test_lone_primary_answers_first_ack_itself():
    a, b = pair()
    p, q = a[1], b[2]
    p.send(CONN_A, b"m", now_us=0)
    (m1,) = sends(p.take_actions(), MsgType.REQUEST)
    q.handle_message(m1, 10)
    (fa,) = sends(advance(q, 1100), MsgType.FIRST_ACK)
    p.handle_message(fa, 2_000)
    assert sends(p.take_actions(), MsgType.SECOND_ACK)


def test_too_many_first_acks_throttle_the_primary_until_keepalive():
    a, b = pair(a_members=(1, 4))
    p, q = a[1], b[2]
    p.send(CONN_A, b"t" * 10, now_us=0)
    (m1,) = sends(p.take_actions(), MsgType.REQUEST)
    q.handle_message(m1, 10)
    q.take_actions()
    for i in range(CFG.first_ack_slowdown):
        t = 10 + CFG.first_ack_delay_us + i * CFG.first_ack_retry_us + 50
        (fa,) = sends(advance(q, t), MsgType.FIRST_ACK)
        p.handle_message(fa, t + 1)
        p.take_actions()
    assert p.timers.due(Timer.THROTTLE_END, CONN_A) is not None
    assert p.conns[CONN_A].state.name == "THROTTLED"
    p.send(CONN_A, b"held", now_us=t + 2)
    assert not sends(p.take_actions(), MsgType.REQUEST)     # slowed down
    ka = q._msg(q.conns[CONN_B], MsgType.KEEP_ALIVE, {})
    p.handle_message(ka, t + 3)
    (m2,) = sends(p.take_actions(), MsgType.REQUEST)
    assert m2.body["data"] == b"held"


def test_flow_control_window_follows_the_remote_group_watermark():
    cfg = MessagingConfig(max_payload_bytes=10, window_msgs=4, max_placeholders=4)
    a, b = pair(cfg)
    p, q = a[1], b[2]
    p.send(CONN_A, b"w" * 100, now_us=0)
    msgs = sends(p.take_actions(), MsgType.REQUEST)
    assert len(msgs) == 4 and p.buffer_sizes()["queue"] == 6
    # the remote primary received them all, but only a group watermark frees the window
    for m in msgs:
        q.handle_message(m, 10)
    q.take_actions()
    ack_only = Message(MsgType.KEEP_ALIVE, "B", "A", 1, Role.SERVER, 1, 1, 2, ack=4,
                       back=0, ts=100)
    p.handle_message(ack_only, 20)
    assert not sends(p.take_actions(), MsgType.REQUEST)
    covered = Message(MsgType.KEEP_ALIVE, "B", "A", 1, Role.SERVER, 1, 1, 2, ack=4,
                      back=msgs[1].ts, ts=101)
    p.handle_message(covered, 30)
    nxt = sends(p.take_actions(), MsgType.REQUEST)
    assert [m.msn for m in nxt] == [5, 6]        # two freed slots
    assert p.buffer_sizes()["sent"] == 4


def test_receiver_drops_beyond_placeholder_bound():
    cfg = MessagingConfig(max_payload_bytes=1, window_msgs=4, max_placeholders=4)
    a, b = pair(cfg)
    p, q = a[1], b[2]
    far = Message(MsgType.REQUEST, "A", "B", 1, Role.CLIENT, 1, 1, 1, msn=50, ts=3,
                  body={"offset": 49, "data": b"x", "flags": 0})
    q.handle_message(far, 10)
    assert q.buffer_sizes()["placeholders"] == 0 and q.stats["beyond_window"] == 1


def test_watermarks_and_digest_guard():
    _, b = pair(b_members=(2, 3))
    q, qb = b[2], b[3]
    data = Message(MsgType.REQUEST, "A", "B", 1, Role.CLIENT, 1, 1, 1, msn=1, ts=7,
                   body={"offset": 0, "data": b"d", "flags": 1})
    for e in (q, qb):
        e.handle_message(data, 10)
        e.take_actions()
    assert q.timestamp_watermark() == 7 == qb.timestamp_watermark()
    assert q.group_watermark() == 0                 # no report from the backup yet
    hb = qb._intra(MsgType.HEARTBEAT, {"rank": 2, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0}, back=qb.timestamp_watermark(),
                   ack=qb.digest())
    q.handle_message(hb, 20)
    assert q.group_watermark() == 7
    assert q.buffer_sizes()["received"] == 0       # ts 7 <= mygroupwatermark: collected
    # a report made with another set of connections does not count
    stale = qb._intra(MsgType.HEARTBEAT, {"rank": 2, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0}, back=99, ack=qb.digest() ^ 1)
    q.handle_message(stale, 30)
    assert q.group_watermark() == 0


def test_order_info_piggybacked_reflected_and_delivered_once_in_order():
    a, b = pair(a_members=(1, 4))
    p, pb, q = a[1], a[4], b[2]
    assert p.add_order_info(b"oi-1") == 1
    assert p.add_order_info(b"oi-2") == 2
    with pytest.raises(ProtocolError):
        pb.add_order_info(b"x")
    p.send(CONN_A, b"data", now_us=0)
    (m1,) = sends(p.take_actions(), MsgType.REQUEST)
    _, own, refl, _, _ = unpack_trailer(m1.order_info)
    assert own == [1, 1, [b"oi-1", b"oi-2"]] and refl is None      # [pvn, first, chunks]
    q.handle_message(m1, 10)
    q.take_actions()
    (fa,) = sends(advance(q, 1100), MsgType.FIRST_ACK)
    assert unpack_trailer(fa.order_info)[2] == [1, 1, [b"oi-1", b"oi-2"]]    # reflected
    for _ in range(2):                              # a duplicate changes nothing
        pb.handle_message(fa, 20)
    acts = pb.take_actions()
    oi = [(x.pos, x.chunk) for x in acts if isinstance(x, DeliverOrderInfo)]
    assert oi == [(1, b"oi-1"), (2, b"oi-2")]
    p.handle_message(fa, 20)
    p.send(CONN_A, b"more", now_us=30)
    (m2,) = sends(p.take_actions(), MsgType.REQUEST)
    # reflected, but not yet held by the backup: still carried (the remote keeps only
    # the last section per connection for a new primary's phase 2)
    assert unpack_trailer(m2.order_info)[1] == [1, 1, [b"oi-1", b"oi-2"]]
    # the backup acks; the primary's order-info buffer is collected, nothing carried
    for m in sends(advance(pb, 20 + CFG.order_info_ack_us), MsgType.ORDER_INFO):
        p.handle_message(m, 40)
    assert p.buffer_sizes()["order_info"] == 0
    p.send(CONN_A, b"again", now_us=50)
    (m3,) = sends(p.take_actions(), MsgType.REQUEST)
    assert unpack_trailer(m3.order_info)[1] is None


def test_order_info_intra_group_path_without_connections():
    p = ep("A", 1, [1, 4], 1)
    pb = ep("A", 4, [1, 4], 1)
    p.add_order_info(b"alone", now_us=0)
    p.handle_timer(CFG.order_info_intra_us)
    (oi,) = sends(p.take_actions(), MsgType.ORDER_INFO)
    assert oi.dst_group == "A" and oi.body["upto"] == 1
    pb.handle_message(oi, CFG.order_info_intra_us + 10)
    assert [x.chunk for x in pb.take_actions() if isinstance(x, DeliverOrderInfo)] == [b"alone"]


def test_an_external_send_wants_the_order_info_at_once_and_the_backup_acks_it_at_once():
    """Output commit of an external send (`want_order_info`): the entries go to the backups
    now, not once order_info_intra_us old, and a backup acks a direct ORDER_INFO at once;
    after the ack nothing more is wanted (no resends)."""
    p = ep("A", 1, [1, 4], 1)
    pb = ep("A", 4, [1, 4], 1)
    p.add_order_info(b"e1", now_us=100)
    assert not sends(advance(p, 200), MsgType.ORDER_INFO)       # nobody waits: it ages
    p.want_order_info(now_us=200)
    (oi,) = sends(advance(p, 200), MsgType.ORDER_INFO)
    pb.handle_message(oi, 300)
    acts = pb.take_actions()
    assert [x.chunk for x in acts if isinstance(x, DeliverOrderInfo)] == [b"e1"]
    (ack,) = sends(acts, MsgType.ORDER_INFO)                    # not after order_info_ack_us
    assert ack.body["upto"] == 1
    assert p.order_info_unprotected_bytes() > 0
    p.handle_message(ack, 400)
    assert p.order_info_unprotected_bytes() == 0 and p.order_info_held() == 0
    p.add_order_info(b"e2", now_us=500)                          # wanted no more: it ages
    assert not sends(advance(p, 500 + CFG.order_info_intra_us - 1), MsgType.ORDER_INFO)
    assert sends(advance(p, 500 + CFG.order_info_intra_us), MsgType.ORDER_INFO)


def test_a_lost_lag_report_is_made_good_by_the_backups_heartbeat():
    """The backup acks a direct ORDER_INFO before its app executed the entries; the report
    of their execution (an ORDER_INFO within order_info_ack_us) is lost; the heartbeat says
    `done` too, so the primary's lag for it goes to 0."""
    p = ep("A", 1, [1, 4], 1)
    pb = ep("A", 4, [1, 4], 1)
    p.add_order_info(b"e1", now_us=100)
    p.want_order_info(now_us=100)
    (oi,) = sends(advance(p, 100), MsgType.ORDER_INFO)
    pb.handle_message(oi, 200)
    (ack,) = sends(pb.take_actions(), MsgType.ORDER_INFO)
    p.handle_message(ack, 300)
    assert p.order_info.lag(4, 300)[0] == 1                 # delivered, not executed
    pb.set_executed(1, now_us=400)
    report = sends(advance(pb, 400 + CFG.order_info_ack_us), MsgType.ORDER_INFO)
    assert report and report[-1].body["done"] == 1           # ... and lost
    hb = sends(advance(pb, 100_000), MsgType.HEARTBEAT)
    assert hb and hb[-1].body["done"] == 1
    p.handle_message(hb[-1], 100_000)
    assert p.order_info.lag(4, 100_000)[0] == 0


def test_order_info_bound():
    p = ep("A", 1, [1, 4], 1, MessagingConfig(max_order_info_bytes=10))
    p.add_order_info(b"x" * 10)
    with pytest.raises(BufferFull):
        p.add_order_info(b"y")


def test_send_space_bounds_the_application():
    cfg = MessagingConfig(max_queue_bytes=50, max_log_bytes=30, max_payload_bytes=10,
                          window_msgs=1, max_placeholders=1)
    a, _ = pair(cfg, a_members=(1, 4))
    p, pb = a[1], a[4]
    assert p.send(CONN_A, b"a" * 100, now_us=0) == 50      # queue bound
    assert p.send_space(CONN_A) == 10                       # one message went out
    assert pb.send(CONN_A, b"a" * 100, now_us=0) == 30     # backup log bound
    assert pb.send_space(CONN_A) == 0


def test_change_of_primary_resets_msns_and_resends_exactly_the_missing_bytes():
    """Phase 2, messaging side: A = {p, b}; p dies mid-stream; b becomes primary of
    view 2, NEW_PRIMARY_VIEW / _ACK with B's primary, then b re-sends from its log the
    bytes B lacks with msns from 1 and continuing offsets; B delivers every byte once."""
    sim = Sim(5, NetConfig())
    p = ep("A", 1, [1, 4, 6], 1)
    b = ep("A", 4, [1, 4, 6], 1)
    b2 = ep("A", 6, [1, 4, 6], 1)               # stays a backup
    q = ep("B", 2, [2], 2)
    got = bytearray()
    events = []

    def on_action(node, action, now):
        events.append((node, action))
        if node == "q" and isinstance(action, Deliver):
            assert action.offset == len(got)
            got.extend(action.data)

    b_sent = []
    b_take = b.take_actions

    def b_take_recording():
        acts = b_take()
        b_sent.extend(a_.msg for a_ in acts if isinstance(a_, Send))
        return acts

    b.take_actions = b_take_recording
    sim.add_node("p", p, ["A"], on_action)
    sim.add_node("b", b, ["A"], on_action)
    sim.add_node("b2", b2, ["A"], on_action)
    sim.add_node("q", q, ["B"], on_action)
    for e in (p, b, b2):
        e.open("B", 1, Role.CLIENT)
    q.open("A", 1, Role.SERVER)
    data = bytes(range(256)) * 8                # 2048 bytes = 21 messages of 100
    b.send(CONN_A, data, now_us=0)              # the backups' apps produced it all
    b2.send(CONN_A, data, now_us=0)
    p.add_order_info(b"oi-last", now_us=0)      # piggybacked to q, recovered in phase 2
    p.send(CONN_A, data[:1000], now_us=0)       # the primary sent 10 messages, then dies
    sim.pump("p")
    sim.pump("b")
    sim.run_until(300)                          # some arrive
    sim.crash("p")
    sim.run_until(5_000)
    assert 0 < len(got) <= 1000
    sent_before = len(got)
    for e, n in ((b, "b"), (b2, "b2")):
        e.set_view(2, 4, [(4, 2), (6, 3)], e.birth_id, now_us=sim.now_us)
        sim.pump(n)
    sim.run_until(200_000)
    assert bytes(got) == data
    resyncs = [a_ for n, a_ in events if n == "b" and isinstance(a_, Resynced)]
    assert resyncs and resyncs[0].resend_from >= sent_before
    assert any(isinstance(a_, Phase2Done) and a_.pvn == 2 for n, a_ in events if n == "b")
    rec = [a_ for n, a_ in events if n == "b" and isinstance(a_, RecoveredOrderInfo)]
    assert rec and rec[0].chunks == (b"oi-last",) and (rec[0].pvn, rec[0].first_pos) == (1, 1)
    assert b.conns[CONN_A].send.next_msn - 1 <= len(data) // 100 + 1
    assert q.conns[CONN_B].recv.view.pvn == 2
    # the remaining backup renumbered its log as the new primary re-sent it
    resent = {m.msn: m.body["offset"] for m in b_sent
              if m.type == MsgType.REQUEST and m.pvn == 2}
    assert min(resent) == 1 and resent[1] == resyncs[0].resend_from
    # the remaining backup trimmed its log by stream offset (its own cuts do not matter)
    c2 = b2.conns[CONN_A]
    assert c2.send.log_bytes <= (CFG.window_msgs + 1) * CFG.max_payload_bytes
    assert c2.remote_view.delivered == len(data)
    # buffers shrink back once acknowledged
    for e in (b, q):
        sizes = e.buffer_sizes()
        assert sizes["sent"] == sizes["queue"] == sizes["placeholders"] == 0, sizes


def test_new_view_msns_restart_at_one_with_offsets_continuing():
    p = ep("A", 1, [1, 4], 1)
    b = ep("A", 4, [1, 4], 1)
    b.open("B", 1, Role.CLIENT)
    b.send(CONN_A, b"x" * 300, now_us=0)
    b.set_view(2, 4, [(4, 2)], 4, now_us=10)
    (npv,) = sends(b.take_actions() + (b.handle_timer(10) or b.take_actions()),
                   MsgType.NEW_PRIMARY_VIEW)
    assert npv.body == {"old_pvn": 1, "last_delivered": 0} and npv.pvn == 2
    ack = Message(MsgType.NEW_PRIMARY_VIEW_ACK, "B", "A", 1, Role.SERVER, 1, 1, 2, ts=50,
                  body={"last_delivered_from": 150, "last_sent_to": 0})
    b.handle_message(ack, 20)
    msgs = sends(b.take_actions(), MsgType.REQUEST)
    assert [m.msn for m in msgs] == [1, 2, 3]           # msn 1: empty resend marker
    assert [m.body["offset"] for m in msgs] == [150, 150, 200]
    assert msgs[0].body["data"] == b""
    assert b"".join(m.body["data"] for m in msgs) == b"x" * 150


def test_stale_view_messages_are_ignored_and_new_view_flushes():
    _, b = pair()
    q = b[2]
    m = lambda pvn, msn, off, data: Message(  # noqa: E731
        MsgType.REQUEST, "A", "B", 1, Role.CLIENT, pvn, 1, 1, msn=msn, ts=msn,
        body={"offset": off, "data": data, "flags": 0})
    q.handle_message(m(1, 1, 0, b"ab"), 1)
    q.handle_message(m(1, 3, 4, b"ef"), 2)          # gap at 2 in view 1
    q.handle_message(m(2, 1, 2, b"cdef"), 3)        # new view re-sends from offset 2
    q.handle_message(m(1, 2, 2, b"cd"), 4)          # old view: ignored
    assert delivered(q.take_actions()) == b"abcdef"
    assert q.stats["stale_view"] == 1


def test_gc_and_exactly_once_over_a_lossy_simulated_network():
    sim = Sim(11, NetConfig(loss=0.3, dup=0.2, reorder=0.3))
    a, b = pair(a_members=(1, 4), b_members=(2, 3, 5))
    got = {x: bytearray() for x in b}

    def on_action(node, action, now):
        if isinstance(action, Deliver) and node in got:
            assert action.offset == len(got[node])
            got[node].extend(action.data)

    for x, e in {**a, **b}.items():
        sim.add_node(x, e, ["A" if x in a else "B"], on_action)
    data = bytes(range(256)) * 20
    for x, e in a.items():
        sim.at(0, lambda s, e=e: e.send(CONN_A, data, now_us=s.now_us), x)
    sim.run_until(100_000)
    sim.set_faults(NetConfig())
    sim.run_until(400_000)
    for x in b:
        assert bytes(got[x]) == data
    for e in list(a.values()) + list(b.values()):
        sizes = e.buffer_sizes()
        sizes.pop("log")
        assert sizes.pop("log_bytes") <= (CFG.window_msgs + 1) * CFG.max_payload_bytes
        assert all(v == 0 for v in sizes.values()), (e.birth_id, sizes)
    assert a[4].buffer_sizes()["log"] > 0 and a[4].conns[CONN_A].send.log[0][1] > 0  # trimmed


def test_remote_change_of_primary_caps_watermark_and_fills_gaps_by_offset():
    """A backup that never heard of an old-view message must neither let the group
    collect it nor stay stuck: its watermark stays at the old view's until it has the
    bytes up to the new stream start, which it asks its primary for by offset."""
    _, b = pair(b_members=(2, 3))
    q, qb = b[2], b[3]

    def data(pvn, msn, off, payload, ts):
        return Message(MsgType.REQUEST, "A", "B", 1, Role.CLIENT, pvn, 1, 1, msn=msn, ts=ts,
                       body={"offset": off, "data": payload, "flags": 0})

    m1, m2 = data(1, 1, 0, b"a" * 100, 10), data(1, 2, 100, b"b" * 100, 11)
    q.handle_message(m1, 1)
    q.handle_message(m2, 2)
    qb.handle_message(m1, 1)                    # qb never hears of m2
    npv = Message(MsgType.NEW_PRIMARY_VIEW, "A", "B", 1, Role.CLIENT, 2, 2, 9, ts=50,
                  body={"old_pvn": 1, "last_delivered": 0},
                  order_info=pack_trailer(0, None, None))     # sent-up-to 0 in view 2
    qb.handle_message(npv, 3)
    assert qb.timestamp_watermark() == 10       # not 50: m2 (ts 11) may exist
    q.handle_message(npv, 3)
    (ack,) = sends(q.take_actions(), MsgType.NEW_PRIMARY_VIEW_ACK)
    assert ack.body["last_delivered_from"] == 0     # lowest offset a member may lack
    # the new primary's stream arrives at offset 200 (say): qb has a gap [100, 200)
    qb.handle_message(data(2, 1, 200, b"c" * 10, 60), 4)
    assert qb.timestamp_watermark() == 0
    local = [m for m in sends(advance(qb, 1_000), MsgType.NACK) if m.dst_group == "B"]
    assert local and [["A", 1, int(Role.SERVER), 0, 100, 200]] == [
        e for e in local[-1].body["missing"] if len(e) == 6]
    q.take_actions()
    q.handle_message(local[-1], 1_100)
    resent = [m for m in sends(q.take_actions(), MsgType.REQUEST)]
    assert [m.msn for m in resent] == [2] and resent[0].pvn == 1
    qb.take_actions()
    qb.handle_message(resent[0], 1_200)
    # the old view's bytes below the new primary's start: our primary delivered them
    assert delivered(qb.take_actions()) == b"b" * 100
    # the new primary's: once our primary's group watermark says it has them too
    q.handle_message(data(2, 1, 200, b"c" * 10, 60), 1_300)
    got = heartbeats_both_ways(q, qb)
    assert got == b"c" * 10
    assert qb.conns[CONN_B].recv.delivered == 210 and qb.timestamp_watermark() == 60


# --- the connection state machine, its invariants, snapshot/restore -----------------------
def test_connection_transitions_are_the_written_ones():
    from llft.protocol.messaging.connection import Connection, SendState
    c = Connection(CONN_A, CFG.retransmit_us)
    assert c.state is SendState.STREAMING and c.mark_known() and not c.mark_known()
    c.throttle()
    assert c.state is SendState.THROTTLED
    with pytest.raises(AssertionError):
        c.throttle()                                # THROTTLED -> THROTTLED is not one
    c.unthrottle()
    c.send.log.extend([(1, 0, b"ab"), (2, 2, b"cd")])
    c.send.log_bytes = 4
    c.begin_resync(old_pvn=1)
    assert c.resyncing and c.send.next_msn == 1 and c.send.old_pvn == 1
    c.check()
    assert not c.end_resync(resend_from=3)          # the log had byte 3: no gap
    assert c.state is SendState.STREAMING and list(c.send.queue) == [(3, b""), (3, b"d")]
    c.check()


def test_snapshot_restores_connections_at_a_joining_backup():
    p = ep("A", 1, [1], 1)
    p.open("B", 1, Role.CLIENT)
    p.send(CONN_A, b"x" * 250, 0)                   # three messages sent (window allows)
    snap = p.snapshot()
    assert snap["pvn"] == p.pvn and snap["oi_upto"] == 0
    (s,) = snap["conns"]
    assert (s["remote"], s["seq"], s["role"]) == ("B", 1, int(Role.CLIENT))
    assert [m[:2] for m in s["log"]] == [[1, 0], [2, 100], [3, 200]]
    assert s["out_offset"] == 250 and s["next_msn"] == 4
    j = ep("A", 2, [1, 2], 1)
    produced = j.restore(snap)
    assert produced == {CONN_A: 250}
    c = j.conns[CONN_A]
    assert c.known and c.send.next_msn == 4 and c.send.log_bytes == 250
    assert [d for _, _, d in c.send.log] == [b"x" * 100, b"x" * 100, b"x" * 50]
    c.check()


def test_timer_registry():
    from llft.protocol.messaging.timers import CONNECTION_TIMERS, ENDPOINT_TIMERS, Timers
    assert set(ENDPOINT_TIMERS) | set(CONNECTION_TIMERS) == set(Timer)
    t = Timers()
    assert t.next_us() is None
    t.arm(Timer.NACK, CONN_A, 50)
    t.arm(Timer.NACK, CONN_A, 10)                   # armed already: unchanged
    assert t.due(Timer.NACK, CONN_A) == 50
    t.arm_earlier(Timer.NACK, CONN_A, 20)
    t.arm_earlier(Timer.NACK, CONN_A, 30)           # later: unchanged
    t.set(Timer.HEARTBEAT, None, 40)
    assert t.due(Timer.NACK, CONN_A) == 20 and t.next_us() == 20
    assert t.expired(Timer.NACK, CONN_A, 20) and not t.expired(Timer.HEARTBEAT, None, 20)
    t.clear(Timer.NACK, CONN_A)
    t.set(Timer.HEARTBEAT, None, None)
    assert t.next_us() is None and len(t) == 0


def test_order_info_log_delivers_in_order_once():
    from llft.protocol.messaging.orderinfo_log import OrderInfoLog
    log = OrderInfoLog(MessagingConfig(max_order_info_pending=3))
    assert log.accept(2, [b"b", b"c"]) == []        # a gap at 1: held
    assert log.accept(1, [b"a"]) == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert log.accept(1, [b"a", b"b"]) == []        # delivered already
    assert log.accept(8, [b"h"]) == [] and not log.pending    # beyond the pending bound
    log.check()
    p = OrderInfoLog(MessagingConfig(max_piggyback_bytes=2))
    p.set_backups([2, 3])
    assert [p.append(x) for x in (b"x", b"y", b"z")] == [1, 2, 3]
    assert p.piggyback(pvn=1) == [1, 1, [b"x", b"y"]] and p.unprotected_bytes() == 3
    assert p.on_ack(2, 2) and not p.on_ack(2, 1)
    p.gc()
    assert len(p.log) == 3                          # backup 3 acked nothing yet
    assert p.on_ack(3, 9) and p.acks[3] == 3        # never beyond the last position
    p.gc()
    assert [pos for pos, _ in p.log] == [3] and p.unprotected_bytes() == 1
    p.check()


def test_order_info_ages_from_the_oldest_unacked_position():
    """What the primary's direct ORDER_INFO waits for (`MessagingEndpoint._intra_due`): the
    age of the oldest position not every backup acked -- and, when a joiner holds the
    floor below the stamps its peers' execution trimmed, "old" (0), not the younger
    oldest stamp left, which would put the send off while the peers execute."""
    from llft.protocol.messaging.orderinfo_log import OrderInfoLog
    p = OrderInfoLog(MessagingConfig())
    p.set_backups([2])
    for t in (100, 200, 300):
        p.append(b"e", now_us=t)
    assert p.unacked_since() == 100
    p.on_ack(2, 1)
    p.gc()
    assert p.unacked_since() == 200                 # the floor moved: a younger position
    p.set_backups([2, 3])                           # 3 joins at position 3
    p.on_ack(2, 3)
    p.on_done(2, 3)                                 # 2 executed all: stamps trimmed
    for t in (400, 500):
        p.append(b"e", now_us=t)
    p.on_done(2, 5)
    assert p.floor() == 0 and p.unacked_since() == 0
    p.on_ack(3, 4)
    assert p.floor() == 3 and p.unacked_since() == 400      # position 4


# ---- stream ends (FIN / RST) and freeing ------------------------------------------------
def _request_reply_close(sim, a, b, request, reply, client_abort=False, server_abort=False):
    """Every replica's app: the client sends `request` then ends its stream; the server
    replies `reply` once it saw the request's end, then ends its own."""
    events = {x: [] for x in {**a, **b}}

    def on_action(node, action, now):
        events[node].append(action)
        if node in b and isinstance(action, Closed):
            e = b[node]
            e.send(CONN_B, reply, now_us=now)
            e.close(CONN_B, abort=server_abort, now_us=now)

    for x, e in {**a, **b}.items():
        sim.add_node(x, e, ["A" if x in a else "B"], on_action)
    for x, e in a.items():
        def start(s, e=e):
            e.send(CONN_A, request, now_us=s.now_us)
            e.close(CONN_A, abort=client_abort, now_us=s.now_us)
        sim.at(0, start, x)
    return events


@pytest.mark.parametrize("client_abort,server_abort", [(False, False), (True, False),
                                                        (False, True)])
def test_stream_end_is_delivered_once_after_the_data_and_state_is_freed(client_abort,
                                                                        server_abort):
    sim = Sim(3, NetConfig(loss=0.2, dup=0.1, reorder=0.2))
    a, b = pair(a_members=(1, 4), b_members=(2, 3))
    request, reply = b"GET /" * 70, b"200 OK " * 90
    events = _request_reply_close(sim, a, b, request, reply, client_abort, server_abort)
    sim.run_until(100_000)
    sim.set_faults(NetConfig())
    sim.run_until(400_000)
    for x, evs in events.items():
        conn, data, abort = (CONN_B, request, client_abort) if x in b else \
            (CONN_A, reply, server_abort)
        ends = [i for i, ev in enumerate(evs) if isinstance(ev, Closed)]
        assert len(ends) == 1, (x, evs)
        end = evs[ends[0]]
        assert (end.conn, end.offset, end.abort) == (conn, len(data), abort)
        assert b"".join(ev.data for ev in evs[:ends[0]] if isinstance(ev, Deliver)) == data
        assert not any(isinstance(ev, Deliver) for ev in evs[ends[0]:])
        assert [ev.conn for ev in evs if isinstance(ev, Freed)] == [conn]
    for e in {**a, **b}.values():
        assert not e.conns and all(k is None for _, k in e.timers.keys())
        assert (CONN_A if e.group == "A" else CONN_B) in e.closed
        e.check()


def test_a_message_for_a_freed_connection_is_answered_closed_and_never_reopens():
    sim = Sim(4, NetConfig())
    a, b = pair()
    _request_reply_close(sim, a, b, b"q", b"r")
    sim.run_until(200_000)
    q = b[2]
    assert not q.conns and CONN_B in q.closed
    late = Message(MsgType.KEEP_ALIVE, "A", "B", 1, Role.CLIENT, 1, 1, 1, ts=10**6)
    q.handle_message(late, 300_000)
    acts = q.take_actions()
    assert [m.type for m in sends(acts)] == [MsgType.CLOSED]
    assert not q.conns and not any(isinstance(x, Opened) for x in acts)
    assert q.send(CONN_B, b"after", now_us=300_000) == 5 and not q.conns   # discarded
    with pytest.raises(ProtocolError):
        q.open("A", 1, Role.SERVER)


def test_closed_sets_stay_a_few_ranges():
    from llft.protocol.messaging.closed import ClosedSeqs
    c = ClosedSeqs()
    for seq in [5, 3, 4, 9, 7, 8, 6, 10]:
        c.add(("G", seq, Role.SERVER))
    assert c.ranges() == 1
    assert ("G", 2, Role.SERVER) not in c and ("G", 11, Role.SERVER) not in c
    assert all(("G", s, Role.SERVER) in c for s in range(3, 11))
    assert ("G", 5, Role.CLIENT) not in c


def test_the_server_end_speaks_after_the_openers_first_message():
    """So every message on a connection is above the opener's first ts, and a connection
    the opener never heard back on counts at that ts, not 0, in its watermark."""
    a, b = pair()
    p, q = a[1], b[2]
    assert q.send(CONN_B, b"early", now_us=0) == 5
    assert not sends(q.take_actions(), MsgType.REPLY)          # queued, not sent
    p.send(CONN_A, b"hello", now_us=0)
    first = sends(p.take_actions(), MsgType.REQUEST)[0]
    assert p.timestamp_watermark() == first.ts                 # not pinned at 0
    q.handle_message(first, 10)
    replies = sends(q.take_actions(), MsgType.REPLY)
    assert [r.body["data"] for r in replies] == [b"early"] and replies[0].ts > first.ts


def test_rto_estimator_jacobson_karels_karn_backoff():
    from llft.protocol.messaging.connection import RtoEstimator, SendSide
    r = RtoEstimator(4_000, 250_000)
    assert r.rto_us == 4_000                        # no sample yet: the floor
    r.sample(20_000)                                # first: SRTT = R, RTTVAR = R/2
    assert (r.srtt_us, r.rttvar_us, r.rto_us) == (20_000, 10_000, 60_000)
    r.timed_out()
    r.timed_out()
    assert r.rto_us == 240_000                      # doubled twice
    r.timed_out()
    assert r.rto_us == 250_000                      # the ceiling
    r.sample(20_000)                                # a fresh sample ends the back-off
    assert r.backoff == 0 and r.rto_us < 60_000
    for _ in range(50):
        r.sample(100)
    assert r.rto_us == 4_000                        # never below the floor
    # Karn's rule: a retransmitted message's ack gives no sample
    s = SendSide(4_000, 250_000)
    s.sent_at.update({1: 0, 2: 0})
    s.sent_at.pop(2)                                # msn 2 was retransmitted
    s.on_acked(2, 50_000)
    assert s.rto.srtt_us is None and not s.sent_at
    s.sent_at[3] = 60_000
    s.on_acked(3, 61_000)
    assert s.rto.srtt_us == 1_000


def test_an_idle_connection_of_a_lone_primary_backs_off_its_keep_alives():
    """A gateway is a primary without backups; its group connection stays open while it
    runs. Idle, it backs its keep-alives off (nobody takes its keep-alives as evidence),
    while the server primary, whose keep-alives a probing backup's evidence rests on,
    keeps the interval; data after the idle time still goes at once."""
    sim = Sim(5, NetConfig())
    a, b = pair(a_members=(1,), b_members=(2, 3))
    kas = {x: [] for x in (1, 2)}
    got = bytearray()

    def on_action(node, action, now):
        if node == 2 and isinstance(action, Deliver):
            got.extend(action.data)

    for x, e in {**a, **b}.items():
        take = e.take_actions

        def counted(x=x, take=take, e=e):
            acts = take()
            if x in kas:
                kas[x] += [e._now for m in sends(acts, MsgType.KEEP_ALIVE)]
            return acts
        e.take_actions = counted
        sim.add_node(x, e, ["A" if x in a else "B"], on_action)
    sim.at(0, lambda s: a[1].send(CONN_A, b"hello", now_us=s.now_us), 1)
    sim.run_until(200_000)
    assert bytes(got) == b"hello"
    idle_from, idle_to = 200_000, 2_200_000
    sim.run_until(idle_to)
    ka = CFG.keepalive_us
    lone = [t for t in kas[1] if t >= idle_from]
    served = [t for t in kas[2] if t >= idle_from]
    # backed off to keepalive_us << LONE_IDLE_BACKOFF: a handful in 2 s, not 2 s / 15 ms
    assert len(lone) <= (idle_to - idle_from) // (ka << 4) + 2, lone
    assert len(served) >= (idle_to - idle_from) // ka // 2, len(served)
    sim.at(idle_to, lambda s: a[1].send(CONN_A, b" again", now_us=s.now_us), 1)
    sim.run_until(idle_to + 20_000)        # well within one backed-off interval
    assert bytes(got) == b"hello again"


def test_a_section_past_the_position_range_is_malformed():
    """A remote section whose last position passes 2**63 - 1 is not order info (it was
    taken, and the reflection of the next one started beyond what msgpack packs: the
    next message to that group raised OverflowError). Found by the C lane's fuzzing."""
    top = (1 << 63) - 1
    assert unpack_trailer(pack_trailer(1, [1, top, [b"a"]], None))[1] == [1, top, [b"a"]]
    assert unpack_trailer(pack_trailer(1, [1, top, [b"a", b"b"]], None))[1] is None
    assert unpack_trailer(pack_trailer(1, None, [1, (1 << 64) - 1, [b"a"]]))[2] is None


def test_a_joiners_order_info_ack_counts_only_without_a_hole_past_where_it_joined():
    """JOINER_OI_ACK (a joiner still receiving its state, llft/replica/node.py): its
    checkpoint holds every position up to where it joined, so a run it kept from at or
    below the next position makes it hold everything up to `upto`. A run starting later
    leaves a hole: ignored (output commit then waits for it, as before)."""
    p = ep("g", 1, [1, 2], primary=1)
    for i in range(10):
        p.add_order_info(b"x%d" % i, now_us=i)
    p.set_view(1, 1, [(1, 1), (2, 2), (3, 3)], 1, now_us=20)      # 3 joins at position 10
    assert p.order_info.joined_at[3] == 10
    for i in range(10, 12):
        p.add_order_info(b"y%d" % i, now_us=30 + i)
    p.order_info.on_ack(2, 12)

    def joiner_ack(upto, first):
        p.handle_message(Message(type=MsgType.JOINER_OI_ACK, src_group="g", dst_group="g",
                                 conn_seq=0, role=Role.CLIENT, pvn=1, precedence=3, sender=3,
                                 body={"upto": upto, "from": first}), now_us=50)

    joiner_ack(12, 12)              # positions 11 missing: a hole past its checkpoint
    assert p.order_info.acks.get(3, 0) == 0 and p.stats["joiner_oi_ack_ignored"] == 1
    joiner_ack(12, 11)              # from the first position past where it joined
    assert p.order_info.acks[3] == 12 and p.order_info.floor() == 12
    assert p.order_info_unprotected_bytes() == 0
