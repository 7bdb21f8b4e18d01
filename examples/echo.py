"""A threaded TCP echo service: writes back every byte it receives, as received.

Nothing here knows about llft: it runs the same plainly and under `llft run`.

    python examples/echo.py [PORT]              (default 9000, listens on 0.0.0.0)
"""
import socket
import sys
import threading


def serve_connection(conn: socket.socket) -> None:
    with conn:
        while True:
            try:
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)
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
