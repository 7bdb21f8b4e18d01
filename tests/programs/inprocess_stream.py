"""A TCP server thread and an asyncio client in the same process stream 1 MB through each
other (test_asyncio.test_sock_lowlevel's huge-content tests): the server reads with a
BufferedReader (its lock is taken once per refill, so the number of ordered calls follows
how the kernel chunked the stream) and echoes; the client's non-blocking sends and receives
return whatever the socket buffers allow. Prints how many pieces each side saw.
`inprocess_stream.py unix`: the same over a unix socket (asyncio's open_unix_connection
to a server thread: its peer is in the process just the same)."""
import asyncio
import os
import socket
import sys
import tempfile
import threading
import time

SIZE = 1_000_000
UNIX = sys.argv[1:] == ["unix"]
srv = socket.socket(socket.AF_UNIX if UNIX else socket.AF_INET)
srv.bind(os.path.join(tempfile.mkdtemp(), "s") if UNIX else ("127.0.0.1", 0))
srv.listen()
raw_reads = []


def serve():
    conn, _ = srv.accept()
    conn.settimeout(30)           # a socket with a timeout polls before each call
    rfile = conn.makefile("rb")
    size = SIZE
    while size:
        data = rfile.read(min(size, 0x10000))
        raw_reads.append(len(data))
        conn.sendall(data)
        size -= len(data)
    conn.close()


async def client():
    loop = asyncio.get_running_loop()
    sock = socket.socket(srv.family)
    sock.setblocking(False)
    await loop.sock_connect(sock, srv.getsockname())
    task = asyncio.create_task(loop.sock_sendall(sock, b"0123456789" * (SIZE // 10)))
    got, pieces = 0, 0
    while True:
        data = await loop.sock_recv(sock, SIZE)
        if not data:
            break
        got += len(data)
        pieces += 1
    await task
    sock.close()
    return got, pieces


t = threading.Thread(target=serve)
t.start()
got, pieces = asyncio.run(client())
t.join()
if UNIX:
    os.unlink(srv.getsockname())
# the clock makes plain runs differ even when the kernel chunks two runs alike (a loaded
# machine); the piece counts are what the replay must reproduce
print("echoed", got, "in", pieces, "client reads;", len(raw_reads), "server reads; at",
      time.time())
