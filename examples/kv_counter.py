"""A small key-value counter service: an ordinary threaded TCP server.

Nothing here knows about llft: it runs the same plainly and under `llft run`. It is
deliberately full of what replication must make deterministic: one thread per
connection, a lock around shared state, wall-clock and monotonic time, randomness.

    python examples/kv_counter.py [PORT]        (default 9000, listens on 0.0.0.0)

Line protocol (one request per line, one reply line per request):

    INCR <key>          -> OK <key> <key_count> <global_count> <time.time()!r> <8 hex digits>
    GET <key>           -> OK <key> <value>        | ERR no such key <key>
    SET <key> <value>   -> OK <key> <value>
    STATS               -> OK <global_count> <keys> <uptime_s> <busy_s>
    anything else       -> ERR ...

`global_count` counts INCRs over all keys. INCR of a key SET to a non-integer is an ERR.
"""
import random
import socket
import sys
import threading
import time

MAX_LINE_BYTES = 64 << 10

lock = threading.Lock()
values: dict[str, int | str] = {}
state = {"global": 0, "busy_s": 0.0}
started = time.monotonic()


def handle(line: str) -> str:
    t0 = time.monotonic()
    parts = line.split(" ", 2)
    cmd = parts[0].upper()
    with lock:
        try:
            if cmd == "INCR" and len(parts) == 2 and parts[1]:
                key = parts[1]
                old = values.get(key, 0)
                if not isinstance(old, int):
                    return f"ERR value of {key} is not an integer"
                values[key] = old + 1
                state["global"] += 1
                return (f"OK {key} {old + 1} {state['global']} {time.time()!r} "
                        f"{random.getrandbits(32):08x}")
            if cmd == "GET" and len(parts) == 2 and parts[1]:
                if parts[1] not in values:
                    return f"ERR no such key {parts[1]}"
                return f"OK {parts[1]} {values[parts[1]]}"
            if cmd == "SET" and len(parts) == 3 and parts[1]:
                value: int | str = parts[2]
                if parts[2].lstrip("-").isdigit():
                    value = int(parts[2])
                values[parts[1]] = value
                return f"OK {parts[1]} {value}"
            if cmd == "STATS" and len(parts) == 1:
                return (f"OK {state['global']} {len(values)} "
                        f"{time.monotonic() - started:.3f} {state['busy_s']:.6f}")
            return f"ERR unknown request {line[:80]!r} (INCR key | GET key | SET key value)"
        finally:
            state["busy_s"] += time.monotonic() - t0


def serve_connection(conn: socket.socket, handle=handle) -> None:
    """One reply line per request line, until the client closes (`handle`: line -> reply)."""
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
            replies = []
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode("utf-8", "replace").rstrip("\r")
                replies.append(handle(line) + "\n")
            if len(buf) > MAX_LINE_BYTES:
                replies.append("ERR line too long\n")
                buf = b""
            if replies:
                try:
                    conn.sendall("".join(replies).encode())
                except OSError:
                    return


def serve_forever(port: int, handle=handle, name: str | None = None) -> None:
    """Listen on 0.0.0.0:port, a thread per connection (`serve_connection`); with `name`,
    say so on stderr once listening (examples/spark_counter.py serves its own `handle`
    this way)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(128)
    if name:
        print(f"{name}: listening on {port}", file=sys.stderr, flush=True)
    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve_connection, args=(conn, handle), daemon=True).start()


def main() -> int:
    serve_forever(int(sys.argv[1]) if len(sys.argv) > 1 else 9000)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
