"""llft/bench/hops.py: chaining `perf trace` lines into one request's hops."""
from llft.bench import hops

GW, PRIMARY, APP = 100, 200, 301
SIZE = 1024


def _line(t_ms: float, tid: int, call: str, ret: int, dur_ms: float = 0.01) -> str:
    return f"{t_ms:.3f} ( {dur_ms:.3f} ms): python/{tid} {call}(fd: 5, size: 65536) = {ret}"


def _request(t0: float) -> list[str]:
    """One request's ten calls, 0.1 ms apart, with unrelated calls between them."""
    calls = [(GW, "recvfrom", SIZE), (GW, "sendto", SIZE + 397), (PRIMARY, "recvfrom", SIZE + 397),
             (PRIMARY, "sendto", SIZE), (APP, "recvmsg", SIZE), (APP, "sendmsg", SIZE),
             (PRIMARY, "recvfrom", SIZE), (PRIMARY, "sendto", SIZE + 1001),
             (GW, "recvfrom", SIZE + 1001), (GW, "sendto", SIZE)]
    out = []
    for i, (tid, call, ret) in enumerate(calls):
        out.append(_line(t0 + 0.1 * i, tid, call, ret))
        out.append(_line(t0 + 0.1 * i + 0.02, tid, "recvfrom", 78))      # an ack: not a hop
        out.append(_line(t0 + 0.1 * i + 0.03, 999, "sendto", SIZE))      # another process
    return out


def test_a_request_is_chained_hop_by_hop():
    text = "\n".join(_request(1000.0) + _request(1002.0))
    got = hops.chain(text, SIZE, GW, PRIMARY, {APP})
    assert set(got) == set(hops.HOPS[1:])
    for h, durations in got.items():
        assert len(durations) == 2, h
        assert all(abs(d - 100.0) < 0.5 for d in durations), (h, durations)
    rows = hops.summary(got)
    assert len(rows) == 9 and all(r["requests"] == 2 for r in rows)


def test_a_call_that_ended_later_counts_at_its_end():
    """perf prints a blocked call where it started, `... [continued]:` and its duration:
    the app's read that waited counts when it returned."""
    lines = _request(1000.0)
    i = next(k for k, ln in enumerate(lines) if f"/{APP} recvmsg" in ln)
    lines[i] = (f"999.000 ( 1.410 ms): python/{APP}  ... [continued]: recvmsg())"
                f"   = {SIZE}")          # started long before, returned at 1000.410
    got = hops.chain("\n".join(lines), SIZE, GW, PRIMARY, {APP})
    assert len(got["A_r"]) == 1 and abs(got["A_r"][0] - 100.0) < 0.5


def test_a_request_missing_a_call_is_not_counted():
    lines = [ln for ln in _request(1000.0) if f"/{APP} sendmsg" not in ln]
    got = hops.chain("\n".join(lines + _request(1002.0)), SIZE, GW, PRIMARY, {APP})
    assert all(len(v) == 1 for v in got.values())


# ---- the same path from in-process marks (llft/runtime/marks.py) ------------------------
def _marked(t0_ns: int, arrival: bool = True) -> dict[str, list]:
    """One request's marks, 100 µs apart, the two datagrams' kernel arrivals 10 µs after
    their sends, with acks, heartbeats and a core pass of another message between."""
    us = 1000
    gw = [("client_r", t0_ns, SIZE, 0), ("in", t0_ns + 20 * us, 78, 0),
          ("out", t0_ns + 100 * us, SIZE + 397, 0),
          ("in", t0_ns + 700 * us, SIZE + 1001, t0_ns + 610 * us if arrival else 0),
          ("client_w", t0_ns + 800 * us, SIZE, 0)]
    primary = [("out", t0_ns + 150 * us, 300, 0),                   # a report: no hop
               ("in", t0_ns + 200 * us, SIZE + 397, t0_ns + 110 * us if arrival else 0),
               ("core", t0_ns + 210 * us, 0, 0), ("core_end", t0_ns + 300 * us, 0, 0),
               ("app_w", t0_ns + 400 * us, 0, 0), ("app_r", t0_ns + 500 * us, SIZE, 0),
               ("in", t0_ns + 550 * us, 78, 0), ("core_end", t0_ns + 560 * us, 0, 0),
               ("out", t0_ns + 600 * us, SIZE + 1001, 0)]
    return {"gateway": gw, "primary": primary}


def _joined(*parts: dict) -> dict[str, list]:
    return {r: [m for p in parts for m in p[r]] for r in ("gateway", "primary")}


def test_marks_are_chained_across_processes_and_split_at_the_arrival_stamp():
    got = hops.chain_marks(_joined(_marked(10**9), _marked(2 * 10**9)), SIZE)
    rows = {r["hop"]: r for r in hops.summary_marks(got)}
    assert len(rows) == 8 + 4, sorted(rows)
    for hop, r in rows.items():
        assert r["requests"] == 2, hop
        want = 10.0 if "kernel's part" in hop else 90.0 if "wake-up's part" in hop else 100.0
        assert abs(r["median_us"] - want) < 0.01, (hop, r)


def test_a_request_missing_a_mark_or_a_stamp():
    """A request whose app read was not seen is not counted; one without arrival stamps
    counts, without the kernel/wake-up split."""
    broken = _marked(10**9)
    broken["primary"] = [m for m in broken["primary"] if m[0] != "app_r"]
    got = hops.chain_marks(_joined(broken, _marked(2 * 10**9, arrival=False)), SIZE)
    assert all(len(v) == 1 for h, v in got.items() if "part" not in h)
    assert all(len(v) == 0 for h, v in got.items() if "part" in h)
