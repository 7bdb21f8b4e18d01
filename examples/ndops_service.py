"""A TCP service whose every request performs K nondeterministic operations.

Nothing here knows about llft: it runs the same plainly and under `llft run`. It is the
benchmark application of the LLFT paper's "latency against nondeterministic operations
per request" figure: the request says which operation and how many times, and the
reply carries a digest of every value obtained, so a replica that got different values
would write different bytes.

    python examples/ndops_service.py [PORT]     (default 9000, listens on 0.0.0.0)

Line protocol (one request per line, one reply line per request, thread per connection):

    OPS <op> <K> [padding]  -> OK <op> <K> <16 hex digits> [padding]
    PING                    -> PONG
    anything else           -> ERR ...

The reply to OPS is exactly as long as the request (padded with spaces, newline last),
so a client sending 1 KB requests gets 1 KB replies. <op>, done K times:

    clock   time.time()                                (a clock read: clock_gettime)
    random  os.urandom(8)                              (a random draw: getrandom)
    lock    shared threading.Lock acquire + release    (a lock acquisition)
    mixed   the three in turn
    external  an 8-byte round trip to an external echo server    (output commit)

`external` talks to a TCP echo server outside the service (on 127.0.0.1, port from the
environment variable NDOPS_EXTERNAL_PORT), one connection per service thread: under llft
every send to it waits until the backups hold the order information recorded before it.
"""
import os
import socket
import sys
import threading
import time

MAX_LINE_BYTES = 64 << 10
MAX_OPS = 1_000_000
MASK = (1 << 64) - 1

shared_lock = threading.Lock()
external = threading.local()       # this thread's connection to the external server


def _external() -> socket.socket:
    sock = getattr(external, "sock", None)
    if sock is None:
        port = int(os.environ.get("NDOPS_EXTERNAL_PORT") or 0)
        if not port:
            raise ValueError("external: set NDOPS_EXTERNAL_PORT to an echo server's port")
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        external.sock = sock
    return sock


def _drop_external() -> None:
    sock, external.sock = getattr(external, "sock", None), None
    if sock is not None:
        sock.close()


def _round_trip(sock: socket.socket, value: int) -> int:
    sock.sendall(value.to_bytes(8, "little"))
    got = b""
    while len(got) < 8:
        chunk = sock.recv(8 - len(got))
        if not chunk:
            _drop_external()
            raise ValueError("external: the echo server closed the connection")
        got += chunk
    return int.from_bytes(got, "little")


def _mix(acc: int, value: int) -> int:
    return ((acc ^ value) * 0x100000001B3) & MASK          # FNV-1a style, 64 bits


def do_ops(op: str, k: int) -> int:
    acc = 0xCBF29CE484222325
    if op == "clock":
        for _ in range(k):
            acc = _mix(acc, int(time.time() * 1e6))
    elif op == "random":
        for _ in range(k):
            acc = _mix(acc, int.from_bytes(os.urandom(8), "little"))
    elif op == "lock":
        for i in range(k):
            with shared_lock:
                acc = _mix(acc, i)
    elif op == "mixed":
        for i in range(k):
            if i % 3 == 0:
                acc = _mix(acc, int(time.time() * 1e6))
            elif i % 3 == 1:
                acc = _mix(acc, int.from_bytes(os.urandom(8), "little"))
            else:
                with shared_lock:
                    acc = _mix(acc, i)
    elif op == "external":
        sock = _external() if k else None
        for i in range(k):
            acc = _mix(acc, _round_trip(sock, i))
    else:
        raise ValueError(f"unknown op {op!r} (clock | random | lock | mixed | external)")
    return acc


def handle(line: bytes) -> bytes:
    parts = line.split()
    if parts[:1] == [b"PING"] and len(parts) == 1:
        return b"PONG\n"
    if parts[:1] == [b"OPS"] and len(parts) >= 3 and parts[2].isdigit():
        op, k = parts[1].decode("ascii", "replace"), int(parts[2])
        if k > MAX_OPS:
            return b"ERR at most %d operations\n" % MAX_OPS
        try:
            digest = do_ops(op, k)
        except ValueError as e:
            return f"ERR {e}\n".encode()
        except OSError as e:                # the external server refused or went away
            _drop_external()
            return f"ERR external: {e}\n".encode()
        reply = f"OK {op} {k} {digest:016x}".encode()
        return reply + b" " * max(0, len(line) - len(reply)) + b"\n"
    return b"ERR unknown request (OPS <clock|random|lock|mixed|external> <K> [padding] | PING)\n"


def serve_connection(conn: socket.socket) -> None:
    buf = b""
    with conn:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            out = []
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                out.append(handle(line.rstrip(b"\r")))
            if len(buf) > MAX_LINE_BYTES:
                out.append(b"ERR line too long\n")
                buf = b""
            if out:
                try:
                    conn.sendall(b"".join(out))
                except OSError:
                    return


def main() -> int:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(128)
    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve_connection, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
