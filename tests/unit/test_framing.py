"""Every replica frames its application's output into the same byte streams
(llft/replica/framing.py), whatever the order and the cuts in which each replica's agent
reads its app's sockets and whenever the primary's entries arrive; a backup promoted
after a prefix of the entries continues the predecessor's streams exactly; a stream the
remote side reset is framed from its app's bytes like any other (by length only if its app
ended short); the primary's grants (WINDOW frames) stand at the
same place in every replica's streams. Property tests: hypothesis draws the streams, the
app's output, the grants, each replica's interleaving and the moments of promotion and
reset."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llft.protocol.streams import Frame, FrameDecoder, Kind, window_value
from llft.replica.framing import ENTRY, FRAME_FIN, FRAME_WINDOW, Framer


def reads(draw, data: bytes) -> list[bytes]:
    """`data` cut into the pieces one agent's reads return."""
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=4))))
    cuts = [c for c in cuts if 0 < c < len(data)]
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def interleave(draw, per_stream: dict[int, list]) -> list[tuple[int, object]]:
    """One replica's order of read events: each stream's in order, streams mixed."""
    queues = {k: list(v) for k, v in per_stream.items() if v}
    out = []
    while queues:
        k = draw(st.sampled_from(sorted(queues)))
        out.append((k, queues[k].pop(0)))
        if not queues[k]:
            del queues[k]
    return out


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 5))
    streams = {}
    for k in range(n):
        conn = draw(st.sampled_from(["A", "B"]))
        data = draw(st.binary(max_size=60))
        end = draw(st.sampled_from([None, Kind.FIN, Kind.RST]))
        streams[k] = (conn, k + 1, data, end)
    return streams


def grants(draw, events: list) -> list:
    """The agent's grants of the stream's input (increasing counts), anywhere among the
    app's reads of its output, also after its end."""
    values = sorted(draw(st.lists(st.integers(0, 1 << 40), max_size=3, unique=True)))
    out = list(events)
    for v in values:
        out.insert(draw(st.integers(0, len(out))), ("W", v))
    # grants of one stream go out in increasing order
    ws = iter(sorted(e[1] for e in out if isinstance(e, tuple)))
    return [("W", next(ws)) if isinstance(e, tuple) else e for e in out]


def events_of(draw, streams) -> list[tuple[int, object]]:
    per = {k: grants(draw, reads(draw, data) + ([end] if end else []))
           for k, (_, _, data, end) in streams.items()}
    return interleave(draw, per)


def feed(f: Framer, k: int, ev) -> tuple[bytes, list]:
    """One event of a replica's agent: the app's output or end on stream k, or a grant."""
    if isinstance(ev, Kind):
        return f.app_ended(k, ev)
    if isinstance(ev, tuple):
        return f.window(k, ev[1])
    return f.output(k, ev)


def framer_of(streams, primary: bool = False) -> Framer:
    """A replica's framer with the workload's streams registered."""
    f = Framer()
    f.primary = primary
    for k, (conn, sid, _, _) in streams.items():
        f.add(k, conn, sid)
    return f


def run_primary(streams, events):
    f = framer_of(streams, primary=True)
    records, made = bytearray(), []
    for k, ev in events:
        r, m = feed(f, k, ev)
        records += r
        made += m
        f.check()
    return bytes(records), made


def by_conn(made) -> dict[str, bytes]:
    out: dict[str, bytearray] = {}
    for m in made:
        out.setdefault(m.conn, bytearray()).extend(m.frames)
    return {c: bytes(b) for c, b in out.items()}


def demux(raw: bytes) -> dict[int, tuple[bytes, Kind | None]]:
    got: dict[int, list] = {}
    for fr in FrameDecoder().feed(raw):
        if fr.kind is Kind.WINDOW:
            continue                    # a grant of the other direction
        d, e = got.setdefault(fr.stream, [b"", None])
        assert e is None, f"stream {fr.stream}: a frame after its end"
        got[fr.stream] = [d + fr.payload, None] if fr.kind is Kind.DATA else [d, fr.kind]
    return {s: (d, e) for s, (d, e) in got.items()}


@settings(max_examples=300, deadline=None)
@given(data=st.data(), streams=workloads())
def test_a_backup_frames_what_its_primary_framed(data, streams):
    records, made = run_primary(streams, events_of(data.draw, streams))
    # the backup reads its own app in its own order and cuts; the entries arrive in
    # chunks of whole entries, at moments of their own among its reads
    mine = events_of(data.draw, streams)
    n_entries = len(records) // ENTRY.size
    cuts = sorted(set(data.draw(st.lists(st.integers(0, n_entries), max_size=4))))
    chunks = [records[a * ENTRY.size:b * ENTRY.size]
              for a, b in zip([0, *cuts], [*cuts, n_entries]) if b > a]
    order = interleave(data.draw, {0: [("read", e) for e in mine],
                                   1: [("entries", c) for c in chunks]})
    b = framer_of(streams)
    got = []
    for _, (what, ev) in order:
        if what == "entries":
            r, m = b.entries(ev)
        else:
            r, m = feed(b, *ev)
        assert r == b"", "a backup adds no entries"
        got += m
        b.check()
    assert by_conn(got) == by_conn(made)
    assert not b.pending


@settings(max_examples=300, deadline=None)
@given(data=st.data(), streams=workloads())
def test_a_promoted_backup_continues_the_streams(data, streams):
    """The primary dies after the backups got a prefix of its entries (output commit: no
    frame beyond them reached the remote group). The promoted backup's byte streams
    start with exactly the frames of that prefix, then carry every stream's whole
    output and end, each once."""
    records, made = run_primary(streams, events_of(data.draw, streams))
    n_entries = len(records) // ENTRY.size
    p = data.draw(st.integers(0, n_entries))
    mine = events_of(data.draw, streams)
    split = data.draw(st.integers(0, len(mine)))     # reads before the promotion
    b = framer_of(streams)
    got, new_records = [], bytearray()

    def apply(ev):
        r, m = feed(b, *ev)
        new_records.extend(r)
        got.extend(m)
    for ev in mine[:split]:
        apply(ev)
    _, m = b.entries(records[:p * ENTRY.size])
    got += m
    r, m = b.promote()
    new_records += r
    got += m
    for ev in mine[split:]:
        apply(ev)
        b.check()
    assert not b.pending
    prefix = by_conn(made[:p])
    streams_out = by_conn(got)
    for conn, raw in prefix.items():
        assert streams_out.get(conn, b"").startswith(raw), conn
    for conn in {c for c, *_ in streams.values()}:
        seen = demux(streams_out.get(conn, b""))
        for k, (c, sid, out, end) in streams.items():
            if c == conn and (out or end):
                assert seen[sid] == (out, end), (k, seen.get(sid))
    # the new primary's own entries describe exactly what it framed beyond the prefix
    assert len(new_records) // ENTRY.size == len(got) - sum(
        1 for m in made[:p])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), streams=workloads())
def test_a_reset_stream_is_framed_from_its_apps_bytes(data, streams):
    """The remote side resets stream 0 at any moment of a backup's reads, also before
    its app wrote bytes its primary framed before the reset reached the primary (the
    remote may have read them, then reset): the backup's socket to its app stays until
    the app closes it, the app writes what it wrote at the primary, and the backup frames
    exactly its primary's bytes. (Framed by length, a lagging backup promoted there
    resent zeros where the remote's primary read the real bytes: the simulator's
    replica_recent_joiner_takes_over_at_a_leave_wrong_bytes.)"""
    records, made = run_primary(streams, events_of(data.draw, streams))
    mine = events_of(data.draw, streams)
    at = data.draw(st.integers(0, len(mine)))       # the reset is delivered here
    order = interleave(data.draw, {0: [("read", e) for e in mine[:at]] + [("reset", None)]
                                   + [("read", e) for e in mine[at:]],
                                   1: [("entries", records)]})
    b = framer_of(streams)
    got = []
    for _, (what, ev) in order:
        if what == "entries":
            got += b.entries(ev)[1]
        elif what == "reset":
            got += b.remote_reset(0)[1]
        else:
            got += feed(b, *ev)[1]
        b.check()
    assert not b.pending
    assert by_conn(got) == by_conn(made)
    assert "void_frame_bytes" not in b.stats


@settings(max_examples=200, deadline=None)
@given(data=st.data(), streams=workloads())
def test_a_reset_stream_whose_app_ended_short_is_framed_by_length(data, streams):
    """A reset stream whose app closed its side before writing all its primary framed
    (not what a determinized app does: the fallback, counted): the rest of those frames
    go by length, so the streams of the connection stay in step."""
    records, made = run_primary(streams, events_of(data.draw, streams))
    mine = events_of(data.draw, streams)
    lost = data.draw(st.integers(0, len(mine)))     # stream 0's app stops here
    mine = mine[:lost] + [e for e in mine[lost:] if e[0] != 0]
    b = framer_of(streams)
    got = []
    for i, (k, x) in enumerate(mine):
        if i == lost:
            got += b.remote_reset(0)[1] + b.app_ended(0, Kind.FIN)[1]
        got += feed(b, k, x)[1]
    if lost >= len(mine):
        got += b.remote_reset(0)[1] + b.app_ended(0, Kind.FIN)[1]
    got += b.entries(records)[1]
    assert not b.pending

    def shape(raw):
        return [(f.kind, f.stream, len(f.payload) if f.stream == 1 else f.payload)
                for f in FrameDecoder().feed(raw)]
    assert {c: shape(r) for c, r in by_conn(got).items()} == \
        {c: shape(r) for c, r in by_conn(made).items()}


def test_a_reset_stream_waits_for_its_apps_bytes():
    """The unit form of the wrong-bytes failure: the primary framed 3 bytes of stream 0,
    then the remote's reset came; at the backup the reset arrives before its app wrote
    them. The frame waits for them (not zeros), and its end follows."""
    p = Framer()
    p.primary = True
    p.add(0, "A", 1)
    r1, m1 = p.output(0, b"abc")
    p.remote_reset(0)
    r2, m2 = p.app_ended(0, Kind.FIN)
    b = Framer()
    b.add(0, "A", 1)
    assert b.entries(r1 + r2) == (b"", [])
    assert b.remote_reset(0) == (b"", [])
    _, made = b.output(0, b"abc")
    assert by_conn(made) == by_conn(m1 + m2)
    assert b.owes(0) is False and "void_frame_bytes" not in b.stats


def test_entries_name_the_end():
    f = Framer()
    f.primary = True
    f.add(0, "A", 1)
    r, m = f.app_ended(0, Kind.FIN)
    assert ENTRY.unpack(r) == (0, FRAME_FIN) and m[0].end is Kind.FIN
    assert FrameDecoder().feed(m[0].frames) == [Frame(Kind.FIN, 1)]
    assert f.output(0, b"late") == (b"", []) and f.stats["output_after_end"] == 4


def test_a_grant_is_an_entry_and_a_frame_and_waits_for_a_promotion():
    f = Framer()
    f.primary = True
    f.add(0, "A", 1)
    r, m = f.window(0, 300_000)
    assert ENTRY.unpack(r) == (0, FRAME_WINDOW - 300_000)
    [fr] = FrameDecoder().feed(m[0].frames)
    assert fr.kind is Kind.WINDOW and window_value(fr) == 300_000
    b = Framer()
    b.add(0, "A", 1)
    assert b.window(0, 5) == (b"", [])              # a backup's own reading grants nothing
    b.entries(ENTRY.pack(0, 3))                     # the predecessor framed 3 bytes ...
    b.promote()
    assert b.window(0, 9) == (b"", [])              # ... which its app has not written yet
    r, m = b.output(0, b"abc")
    assert [ENTRY.unpack(r[i:i + ENTRY.size]) for i in range(0, len(r), ENTRY.size)] == \
        [(0, FRAME_WINDOW - 9)]
    assert [f.kind for x in m for f in FrameDecoder().feed(x.frames)] == [Kind.DATA, Kind.WINDOW]
