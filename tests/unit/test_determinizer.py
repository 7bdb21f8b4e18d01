"""Order-information codec and the shared-memory Feeder/drain API (no app process)."""
import random
import struct

import pytest

from determinizer.orderinfo import (CALL_IDS, HEADER, Call, CodecError, Entry, _spans, decode,
                                   encode, op_name, pieces, split)
from determinizer.shm import CtlWord, Shm, Stat


def _entries():
    clock = (1 << 56) | 1
    lock = (2 << 56) | (0 << 32) | 7
    return [
        Entry(tid=0, call=CALL_IDS["clock_gettime"], op=clock, n=0, ret=123456789),
        Entry(tid=1, call=CALL_IDS["sem_trywait"], op=lock, n=0, ret=-1, err=11),
        Entry(tid=0, call=CALL_IDS["getrandom"], op=(4 << 56), n=1, ret=5, data=b"\x01\x02\x03\x04\x05"),
        Entry(tid=1, call=CALL_IDS["sem_wait"], op=lock, n=1, ret=0),
    ]


def test_codec_round_trip_and_alignment():
    es = _entries()
    buf = encode(es)
    assert len(buf) % 8 == 0
    assert decode(buf) == es
    assert split(buf) == (4, len(buf))
    assert split(buf[:-3]) == (3, len(encode(es[:3])))


def test_pieces_keep_entries_whole_within_the_limit():
    es = _entries()
    buf = encode(es)
    sizes = [len(encode([e])) for e in es]            # 56, 64, 56, 56
    assert pieces(buf, 1 << 20) == [buf]
    assert pieces(buf, 120) == [encode(es[:2]), encode(es[2:])]
    assert pieces(buf, 10) == [encode([e]) for e in es]   # a too-large entry is its own piece
    assert [len(p) for p in pieces(buf, 10)] == sizes
    assert pieces(b"", 100) == []
    with pytest.raises(CodecError):
        pieces(buf[:-8], 1 << 20)                    # ends inside an entry
    assert split(buf, max_entries=2) == (2, len(encode(es[:2])))


def _reference_split(buf, max_entries=None):
    count = end = 0
    for off, length in _spans(buf, max_entries):
        count, end = count + 1, off + length
    return count, end


def _reference_pieces(buf, limit):
    out, start, end = [], 0, 0
    for off, length in _spans(buf):
        if off + length - start > limit and off > start:
            out.append(buf[start:off])
            start = off
        end = off + length
    if end != len(buf):
        raise CodecError(f"order information ends inside an entry (offset {end} of {len(buf)})")
    if end > start:
        out.append(buf[start:end])
    return out


def _outcome(fn, *args):
    try:
        return fn(*args)
    except CodecError as e:
        return ("CodecError", str(e))


def test_the_native_walk_matches_the_python_framing():
    """split and pieces walk entries in C (`llft_oi_walk`); `_spans` is the reference:
    the same results and the same errors on whole, cut, corrupted and random buffers."""
    rng = random.Random(7)
    tried = 0
    for _ in range(3000):
        es = [Entry(tid=rng.randrange(4), call=CALL_IDS["clock_gettime"], op=rng.randrange(1 << 60),
                    n=rng.randrange(100), ret=rng.randrange(1 << 30),
                    data=rng.randbytes(rng.choice([0, 0, 1, 7, 8, 100, 300])))
              for _ in range(rng.randrange(0, 8))]
        buf = bytearray(encode(es))
        shape = rng.randrange(5)
        if shape == 1 and buf:
            del buf[rng.randrange(len(buf)):]                    # cut anywhere
        elif shape == 2 and buf:
            at = rng.randrange(0, len(buf) - 3, 8) if len(buf) > 8 else 0
            struct.pack_into("<I", buf, at, rng.choice([0, 3, 55, 57, 64, 1 << 31, 2**32 - 8]))
        elif shape == 3:
            buf = bytearray(rng.randbytes(rng.randrange(0, 200)))
        elif shape == 4 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        b = bytes(buf)
        for m in (None, 0, 1, 2, 5):
            assert _outcome(split, b, m) == _outcome(_reference_split, b, m)
        assert _outcome(split, buf) == _outcome(_reference_split, b)        # a bytearray
        assert _outcome(split, memoryview(b)) == _outcome(_reference_split, b)
        for limit in (0, 56, 100, 200, 1 << 20):
            assert _outcome(pieces, b, limit) == _outcome(_reference_pieces, b, limit)
        tried += 1
    assert tried == 3000


def test_names_come_from_the_header():
    assert HEADER.size == 56
    assert Call.CLOCK_GETTIME == 1 and Call.PRIVATE_RECV == 63
    assert CALL_IDS["read(/dev/urandom)"] is Call.READ_RANDOM
    assert CALL_IDS["recv(private)"] is Call.PRIVATE_RECV
    assert [s.name for s in Stat] == ["RECORDS", "WAITS", "GIL_DROPS", "RING_FULL", "HELD",
                                      "INPUT_WAIT", "COMMITS", "STRAY_CONNS"]
    assert CtlWord.GROUP_ID == 6 and CtlWord.DIV_CONN == 8 and CtlWord.COMMIT_DONE == 11


def test_codec_rejects_malformed():
    buf = bytearray(encode(_entries()))
    buf[0] = 3  # length not a multiple of 8, shorter than a header
    with pytest.raises(CodecError):
        decode(bytes(buf))
    with pytest.raises(CodecError):
        decode(encode(_entries())[:60])


def test_op_names():
    assert op_name((2 << 56) | (3 << 32) | 9) == "lock 3:9"
    assert op_name((1 << 56) | 1) == "clock 1"
    assert Entry(0, 21, (2 << 56) | 5, 4, -1, 11).describe() == \
        "thread 0 call #4: sem_trywait(lock 0:5) -> -1 errno 11"


def test_feeder_accepts_whole_entries_and_keeps_partial_tail():
    shm = Shm.create(Shm.BACKUP)
    try:
        f = shm.feeder()
        buf = encode(_entries())
        f.push(buf[:100])            # one whole entry (56) + a partial one
        assert f.fed_entries == 1
        f.push(buf[100:])
        assert f.fed_entries == 4 and f.fed_bytes == len(buf)
        f.done()
        assert not shm.diverged and shm.active_pid == 0
    finally:
        shm.close()


def test_feeder_rejects_garbage():
    shm = Shm.create(Shm.BACKUP)
    try:
        with pytest.raises(ValueError):
            shm.feeder().push(b"\x07" * 64)
    finally:
        shm.close()


def test_drain_of_an_idle_primary_is_empty_and_bounded():
    shm = Shm.create(Shm.PRIMARY)
    try:
        assert shm.drain(timeout_ms=10) == b""
        assert shm.mode == Shm.PRIMARY
        shm.promote()
        assert shm.mode == Shm.PRIMARY
    finally:
        shm.close()


def test_the_agents_reset_marks_stay_for_the_app_and_the_oldest_go():
    """ctl.resets: the agent's mark of a reset stays until the app takes it (at its read
    of the end, however late, or its close); the agent lets its oldest go once more than
    half the table holds them (an app that closed before the reset never takes one), so
    the app's own marks (a close after SO_LINGER 0) always find room."""
    from determinizer.shm import AGENT_RESET_MARKS, lib
    shm = Shm.create(Shm.PRIMARY)
    base = shm._base

    def app_takes(conn: int) -> bool:            # the shim's read of the end
        return bool(lib.llft_conn_reset_take(base, lib.LLFT_RESET_BY_AGENT, conn))
    try:
        n = AGENT_RESET_MARKS + 10
        assert all(shm.reset_conn(k) for k in range(n))
        shm.forget_app_reset(n - 1)              # the agent let it go: its mark stays
        assert [app_takes(k) for k in range(n)] == [False] * 10 + [True] * AGENT_RESET_MARKS
        # the app's marks find room beside as many of the agent's as it keeps
        assert all(shm.reset_conn(k) for k in range(n, n + AGENT_RESET_MARKS))
        for k in range(lib.LLFT_RESET_SLOTS - AGENT_RESET_MARKS):
            assert lib.llft_conn_reset_mark(base, lib.LLFT_RESET_BY_APP, 1000 + k)
        assert shm.app_reset(1000) and not shm.app_reset(1000)       # taken once
        shm.forget_app_reset(1001)
        assert not shm.app_reset(1001)
    finally:
        shm.close()
