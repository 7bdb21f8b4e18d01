"""Reads each connection's end late (test_streams.py). Run: python late_end_reader.py PORT

Per connection: read one line (the client's label), write it back, wait LATE_S, then read
until the end and print how the connection ended, "<label> EOF" or "<label> ECONNRESET",
to stderr (the replica's log).
A client that resets after it got its line back must read as ECONNRESET here however
late the app reads, as after a TCP RST (the reset went to the app before its read)."""
import socket
import sys
import threading
import time

LATE_S = 0.3


def serve(conn: socket.socket) -> None:
    with conn:
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(100)
            if not chunk:
                print("short line", line, file=sys.stderr, flush=True)
                return
            line += chunk
        conn.sendall(line)
        time.sleep(LATE_S)
        try:
            while conn.recv(100):
                pass
            end = "EOF"
        except ConnectionResetError:
            end = "ECONNRESET"
        print(line.decode().strip(), end, file=sys.stderr, flush=True)


def main() -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(sys.argv[1])))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
