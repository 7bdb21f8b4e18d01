"""An EXTERNAL server for the socket programs (not part of the replica): answers each
line with the line, a random token and the time, so plain runs of a client differ.
Run: python echo_server.py PORTFILE  (writes the port it listens on)."""
import os
import socket
import sys
import threading
import time


def serve(conn):
    with conn:
        f = conn.makefile("rwb")
        for line in f:
            reply = b"%s %s %.6f\n" % (line.strip(), os.urandom(4).hex().encode(), time.time())
            f.write(reply)
            f.flush()


def main():
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
