"""A server that reads slowly on purpose: it accepts an upload connection, then reads
nothing of it until a second connection says "go"; then it reads the whole upload and
answers its size and sha256 on it. Run under `llft run` by tests/processes/test_flow.py
(a large upload queued at the agents of a replicated group while its app does not read).
"""
import hashlib
import socket
import sys

port = int(sys.argv[1])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(8)
while True:
    upload, _ = srv.accept()
    go, _ = srv.accept()
    go.recv(16)
    h, n = hashlib.sha256(), 0
    while True:
        d = upload.recv(1 << 16)
        if not d:
            break
        h.update(d)
        n += len(d)
    upload.sendall(f"{n} {h.hexdigest()}\n".encode())
    upload.close()
    go.close()
