"""A server for EXTERNAL clients (accept on a non-loopback bind): under replay no client
connects; the accepted connection and everything read from it come from the trace."""
import socket
import sys
import time

port = int(sys.argv[1])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port))
srv.listen(1)
conn, peer = srv.accept()
print("client from", peer[0])
f = conn.makefile("rwb")
for line in f:
    line = line.strip()
    if line == b"quit":
        break
    f.write(b"got %s at %.6f\n" % (line, time.time()))
    f.flush()
    print("request", line.decode())
conn.close()
srv.close()
print("served at", time.time())
