"""Streams inside a group connection (llft/protocol/streams.py): the frames survive any
cut of the byte stream, and each end's table keeps the stream rules (opened once, in
order; each side ends once; freed when both ended; nothing after an end)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llft.protocol.streams import (GRANT_STEP_BYTES, HEADER, MAX_FRAME_PAYLOAD,
                                   STREAM_WINDOW_BYTES, WINDOW_VALUE, Credit, Frame,
                                   FrameDecoder, FrameError, Kind, StreamTable, data_frames,
                                   frame, window_frame, window_value)

frames_st = st.lists(st.one_of(
    st.tuples(st.just(Kind.DATA), st.integers(1, 2 ** 64 - 1), st.binary(max_size=300)),
    st.tuples(st.sampled_from([Kind.FIN, Kind.RST]), st.integers(1, 2 ** 64 - 1),
              st.just(b"")),
    st.tuples(st.just(Kind.WINDOW), st.integers(1, 2 ** 64 - 1),
              st.integers(0, 2 ** 64 - 1).map(WINDOW_VALUE.pack))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(frames=frames_st, cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_any_cut_of_the_byte_stream_gives_the_same_frames(frames, cuts):
    raw = b"".join(frame(k, s, p) for k, s, p in frames)
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    dec, got = FrameDecoder(), []
    for a, b in zip(points, points[1:]):
        got += dec.feed(raw[a:b])
    assert got == [Frame(k, s, p) for k, s, p in frames]
    assert dec.partial_bytes == 0 and dec.offset == len(raw)


def test_malformed_frames_are_errors_not_guesses():
    with pytest.raises(FrameError, match="unknown frame kind"):
        FrameDecoder().feed(HEADER.pack(9, 1, 0))
    with pytest.raises(FrameError):
        FrameDecoder().feed(HEADER.pack(Kind.DATA, 0, 0))          # stream 0
    with pytest.raises(FrameError):
        FrameDecoder().feed(HEADER.pack(Kind.DATA, 1, MAX_FRAME_PAYLOAD + 1))
    with pytest.raises(FrameError, match="payload"):
        FrameDecoder().feed(HEADER.pack(Kind.FIN, 1, 3) + b"abc")
    with pytest.raises(ValueError):
        frame(Kind.RST, 1, b"x")
    with pytest.raises(FrameError, match="WINDOW"):
        FrameDecoder().feed(HEADER.pack(Kind.WINDOW, 1, 3) + b"abc")   # not one u64
    with pytest.raises(ValueError):
        frame(Kind.WINDOW, 1, b"abc")


def test_large_output_is_cut_into_frames_and_empty_output_opens():
    big = bytes(MAX_FRAME_PAYLOAD + 10)
    fs = FrameDecoder().feed(b"".join(data_frames(3, big)))
    assert [len(f.payload) for f in fs] == [MAX_FRAME_PAYLOAD, 10]
    assert FrameDecoder().feed(b"".join(data_frames(3, b""))) == [Frame(Kind.DATA, 3, b"")]


def test_a_server_side_table_opens_frees_and_refuses():
    t = StreamTable(remote_opens=True)
    st1, new = t.on_frame(Frame(Kind.DATA, 1, b"hi"))
    assert new and st1.id == 1
    assert t.on_frame(Frame(Kind.DATA, 1, b"more")) == (st1, False)
    t.on_frame(Frame(Kind.DATA, 3))                 # ids may skip, never go back
    with pytest.raises(FrameError, match="not open"):
        t.on_frame(Frame(Kind.DATA, 2))
    t.on_frame(Frame(Kind.FIN, 1))
    with pytest.raises(FrameError, match="after its end"):
        t.on_frame(Frame(Kind.DATA, 1, b"late"))
    assert not st1.done
    t.ended_out(1, Kind.FIN)
    with pytest.raises(FrameError, match="twice"):
        t.ended_out(1, Kind.RST)
    assert st1.done
    t.free(1)
    assert 1 not in t.open and t.freed == 1
    with pytest.raises(FrameError, match="not open"):
        t.on_frame(Frame(Kind.DATA, 1))             # a freed stream never comes back
    # the remote ends the whole connection: the rest count as reset there
    assert [s.id for s in t.end_all_in()] == [3] and t.open[3].end_in is Kind.RST


def test_a_backup_learns_a_stream_before_its_first_frame():
    t = StreamTable(remote_opens=True)
    assert t.learn(4).id == 4
    assert t.on_frame(Frame(Kind.DATA, 4, b"x"))[1] is False    # not new: known already
    assert t.learn(4) is t.open[4]
    t.on_frame(Frame(Kind.RST, 4))
    t.ended_out(4, Kind.FIN)
    t.free(4)
    assert t.learn(4) is None                       # freed: not opened again


def test_the_opener_numbers_its_streams():
    t = StreamTable(remote_opens=False)
    assert [t.open_next().id for _ in range(3)] == [1, 2, 3]
    with pytest.raises(FrameError):
        t.on_frame(Frame(Kind.DATA, 9))             # the group may not open streams
    with pytest.raises(FrameError):
        StreamTable(remote_opens=True).open_next()


def test_a_grant_may_follow_its_senders_end_and_cross_the_streams_free():
    """WINDOW paces the other direction: a client that half-closed still reads its
    reply, and a grant sent before it learned of the free is nothing to do, not an error."""
    t = StreamTable(remote_opens=True)
    t.on_frame(Frame(Kind.DATA, 1, b"GET"))
    t.on_frame(Frame(Kind.FIN, 1))                  # the client's side ended ...
    [f] = FrameDecoder().feed(window_frame(1, 300_000))
    assert f.kind is Kind.WINDOW and window_value(f) == 300_000
    assert t.on_frame(f) == (t.open[1], False)      # ... and it still grants
    t.ended_out(1, Kind.FIN)
    t.free(1)
    assert t.on_frame(f) == (None, False)           # crossed the free
    with pytest.raises(FrameError, match="never opened"):
        t.on_frame(Frame(Kind.WINDOW, 7, WINDOW_VALUE.pack(1)))   # cannot open a stream


def test_credit_blocks_a_window_past_the_grant_and_grants_by_steps():
    c = Credit()
    c.sent = STREAM_WINDOW_BYTES - 1
    assert not c.blocked
    c.sent += 1
    assert c.blocked                                # a window past the last grant (0)
    c.on_window(10)
    c.on_window(5)                                  # grants only ever rise
    assert c.granted == 10 and not c.blocked
    c.handed = GRANT_STEP_BYTES - 1
    assert not c.grant_due
    c.handed = 3 * GRANT_STEP_BYTES
    assert c.grant_due
    assert c.grant(buffered=2 * GRANT_STEP_BYTES + 1) is None   # taken: one byte short
    assert c.grant(buffered=GRANT_STEP_BYTES) == 2 * GRANT_STEP_BYTES
    assert c.told == 2 * GRANT_STEP_BYTES
    assert c.grant(buffered=GRANT_STEP_BYTES) is None           # nothing more taken since
