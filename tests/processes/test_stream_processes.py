"""Messaging end to end on real sockets: separate OS processes, loopback multicast.

Two groups of 3 members (primary + 2 backups each) stream bytes over one LLFT connection
while every member's transport drops 10% of the datagrams it receives (fault-injection
hook). Every member of the destination group must get every byte once, in order: the
test compares SHA-256 digests with the digest of the stream the sender's app produced.
"""
import hashlib

import pytest

from llft.runtime import keys
from llft.tools.streamdemo import stream_bytes
from llft.tools.procs import ProcGroup, random_group_addresses

SIZES = {"off": 2_000_000, "small": 8_000_000, "full": 50_000_000}


def expected_digest(seed: int, total: int) -> str:
    h = hashlib.sha256()
    for chunk in stream_bytes(seed, total):
        h.update(chunk)
    return h.hexdigest()


def run_stream(tmp_path, total: int, drop: float, seed: int = 5):
    key = tmp_path / "cluster.key"
    keys.write_key(str(key))
    addrs = random_group_addresses(["A", "B"])
    pg = ProcGroup(str(tmp_path))
    common = ["--key", str(key), "--addresses", addrs, "--drop", str(drop), "--seed", str(seed)]
    try:
        for m in (11, 12, 13):
            pg.python(f"b{m}", "llft.tools.streamdemo", "--group", "B", "--me", str(m),
                      "--members", "11,12,13", "--expect-bytes", str(total), *common)
        assert pg.wait(lambda: all(p.find("ready") for p in pg.procs.values()), 30)
        for m in (1, 2, 3):
            pg.python(f"a{m}", "llft.tools.streamdemo", "--group", "A", "--me", str(m),
                      "--members", "1,2,3", "--send-to", "B", "--send-bytes", str(total), *common)
        receivers = [pg.procs[f"b{m}"] for m in (11, 12, 13)]
        timeout_s = 60 + total / 200_000       # generous: 2 shared cores, 6 processes
        ok = pg.wait(lambda: all(r.find("received") for r in receivers), timeout_s)
        assert ok, "not every receiver got the stream:\n" + "\n".join(
            f"{r.name}: {r.events[-2:]} {pg.stderr(r.name)}" for r in receivers)
        return [r.find("received") for r in receivers], pg
    finally:
        pg.stop_all()


@pytest.mark.parametrize("drop", [0.1])
def test_three_member_groups_stream_with_loss(tmp_path, drop):
    total = SIZES["off"]
    results, pg = run_stream(tmp_path, total, drop)
    want = expected_digest(5, total)
    for r in results:
        assert r["errors"] == []
        assert r["bytes"] == total
        assert r["sha256"] == want
    # the fault-injection hook really dropped traffic at every receiver
    for name in ("b11", "b12", "b13"):
        stats = pg.procs[name].find("stats")
        assert stats is not None and stats["transport"]["dropped_recv"] > 0
        assert stats["core"]["placeholders"] == 0


@pytest.mark.slow
def test_three_member_groups_stream_50mb(tmp_path, soak):
    total = SIZES[soak]
    results, _ = run_stream(tmp_path, total, 0.1, seed=9)
    want = expected_digest(9, total)
    assert all(r["sha256"] == want and r["bytes"] == total and not r["errors"] for r in results)
