"""Bulk transfers through `llft gateway` with a slow reader at one end: what a user who
downloads a large file over a slow link, or uploads one to an app that reads it later,
gets from a replicated group.

Real processes: 2 agents (`llft run`) with the preload shim, the gateway, plain socket
clients; the default configuration. Every byte is compared with what it must be, and the
group must keep its view (no false suspicion of a primary that is busy moving bytes).
"""
from __future__ import annotations

import hashlib
import os
import random
import socket
import sys

from llft.tools.cluster import LocalCluster

HERE = os.path.dirname(os.path.abspath(__file__))
GATED_SINK = os.path.join(HERE, "..", "programs", "gated_sink.py")
TIMEOUT_S = 120


def views(st: dict) -> set[tuple[int, int]]:
    return {(m["birth"], m["pvn"]) for m in st["members"]}


def test_a_client_that_reads_slowly_gets_a_large_download_whole(tmp_path):
    """Group -> client credit (streams.py, "Flow control per stream"): the client reads
    nothing until the group holds its reply back; the gateway keeps about a window of
    it, not the whole file, and drops no one. Before the credit, the gateway buffered the
    reply until its 32 MB guard and dropped the client: a truncated download."""
    www = tmp_path / "www"
    www.mkdir()
    body = random.Random(5).randbytes(48 << 20)
    (www / "big.bin").write_bytes(body)
    with LocalCluster(str(tmp_path / "c"), group="dl", service_port=9000) as lc:
        addr = lc.start_service(("r1", "r2"), [
            sys.executable, "-m", "http.server", "9000", "--bind", "127.0.0.1",
            "--directory", str(www)])
        before = views(lc.wait_ready(2))
        with socket.create_connection(addr, timeout=TIMEOUT_S) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            s.sendall(b"GET /big.bin HTTP/1.0\r\nHost: llft\r\n\r\n")
            # the reader is away until the group's primary waits for its grant
            lc.wait_status(lambda st: any(
                m["role"] == "primary" and m["counters"].get("stream_credit_waits", 0) > 0
                for m in st["members"]), TIMEOUT_S, "the primary holding the reply back")
            buf = bytearray()
            while d := s.recv(1 << 20):
                buf += d
        head, _, got = bytes(buf).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200"), head[:200]
        assert len(got) == len(body) and got == body
        st = lc.wait_status(lambda st: st["gateways"] and st["gateways"][0]["streams"]["open"] == 0,
                            TIMEOUT_S, "the download's stream freed at the gateway")
        g = st["gateways"][0]["counters"]
        assert g.get("windows_out", 0) > 0 and not g.get("clients_dropped_slow"), g
        assert views(st) == before, "the group changed its view during the download"


def test_a_large_upload_to_an_app_that_reads_later_keeps_the_view(tmp_path):
    """300 MB queued at the agents for an app that reads none of it yet. The agents hand
    it to the app's socket a bounded piece at a time: with all of it in the socket's
    transport buffer, the buffer's copy when the app read it down held the primary's
    loop past the fault timeout, and the backup took over from a live primary (every
    run on this 2-core box, before the fix)."""
    total, chunk = 300 << 20, random.Random(9).randbytes(1 << 20)
    want = hashlib.sha256()
    for _ in range(total // len(chunk)):
        want.update(chunk)
    with LocalCluster(str(tmp_path / "c"), group="ul", service_port=9000) as lc:
        addr = lc.start_service(("r1", "r2"), [sys.executable, GATED_SINK, "9000"])
        before = views(lc.wait_ready(2))
        with socket.create_connection(addr, timeout=TIMEOUT_S) as up:
            for _ in range(total // len(chunk)):
                up.sendall(chunk)
            up.shutdown(socket.SHUT_WR)
            with socket.create_connection(addr, timeout=TIMEOUT_S) as go:
                go.sendall(b"go")
                reply = up.recv(200)
        assert reply == f"{total} {want.hexdigest()}\n".encode(), reply
        assert views(lc.status()) == before, "the group changed its view during the upload"
