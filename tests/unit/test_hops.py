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
