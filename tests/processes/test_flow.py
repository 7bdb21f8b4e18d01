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
import threading

from llft import EXAMPLES_DIR
from llft.tools.cluster import LocalCluster

HERE = os.path.dirname(os.path.abspath(__file__))
ECHO = os.path.join(EXAMPLES_DIR, "echo.py")
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


def test_an_upload_to_an_app_that_reads_later_waits_in_the_client(tmp_path):
    """Client -> group credit: the app reads nothing of a 256 MB upload until a second
    connection says "go". The group's primary grants only what its app took, so the
    gateway stops reading the client about a window in (its TCP backs up, as with a
    plain server) instead of the agents queueing the upload in memory. Then every byte
    arrives, in order, and the group keeps its view. Before the credit, all of it sat
    in the app socket's transport buffer, whose copy when the app read it down held the
    primary's loop past the fault timeout: the backup took over from a live primary
    (every run on this 2-core box)."""
    total, chunk = 256 << 20, random.Random(9).randbytes(1 << 20)
    want = hashlib.sha256()
    for _ in range(total // len(chunk)):
        want.update(chunk)
    with LocalCluster(str(tmp_path / "c"), group="ul", service_port=9000) as lc:
        addr = lc.start_service(("r1", "r2"), [sys.executable, GATED_SINK, "9000"])
        before = views(lc.wait_ready(2))
        result: dict = {}

        def upload(up: socket.socket) -> None:
            try:
                for _ in range(total // len(chunk)):
                    up.sendall(chunk)
                up.shutdown(socket.SHUT_WR)
                result["reply"] = up.recv(200)
            except OSError as e:
                result["error"] = repr(e)
        with socket.create_connection(addr, timeout=TIMEOUT_S) as up:
            t = threading.Thread(target=upload, args=(up,), daemon=True)
            t.start()
            st = lc.wait_status(lambda st: st["gateways"] and st["gateways"][0]["counters"].get(
                "client_credit_waits", 0) > 0, TIMEOUT_S, "the gateway holding the client back")
            held = st["gateways"][0]["bytes_in"]
            assert held < 8 << 20, f"the gateway read {held} bytes of an upload nobody read"
            with socket.create_connection(addr, timeout=TIMEOUT_S) as go:
                go.sendall(b"go")
                t.join(TIMEOUT_S)
        assert result.get("reply") == f"{total} {want.hexdigest()}\n".encode(), result
        st = lc.status()
        assert views(st) == before, "the group changed its view during the upload"
        primary = next(m for m in st["members"] if m["role"] == "primary")
        assert primary["counters"].get("windows_out", 0) > 0, primary["counters"]


def test_a_backup_replays_large_reads_as_its_bytes_come(tmp_path):
    """40 MB echoed through 2 replicas (examples/echo.py reads 64 KB at a time). The
    primary's app, reading fast, got large reads from a socket its kernel had grown; a
    backup replays each read's count, and its own socket, grown less, may never hold
    that many bytes at once. The shim waited for all of them at once: the backup stopped,
    fell a second behind, the primary was held at the lag bound until the hold gave up
    10 s later (every run before the fix). Now the replayed read takes the bytes as they
    come: the primary is never held, every byte comes back."""
    from llft.bench.bulk import transfer
    with LocalCluster(str(tmp_path / "c"), group="bk", service_port=9000) as lc:
        addr = lc.start_service(("r1", "r2"), [sys.executable, ECHO, "9000"])
        before = views(lc.wait_ready(2))
        r = transfer(addr, 40, 0.0)
        assert r["ok"], r["error"]
        st = lc.status()
        assert views(st) == before
        primary = next(m for m in st["members"] if m["role"] == "primary")
        assert not primary["counters"].get("lag_holds"), primary["counters"]
