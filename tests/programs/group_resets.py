"""Resets on group connections (test_shim_group.py). Run: python group_resets.py HOST PORT
Connection 0: reads until its end and prints how it ended (a reset by the agent must
read as ECONNRESET, as a TCP RST would). Connection 1: reads one line, then closes with
SO_LINGER 0 (the agent must see a reset). Connection 2: reads one line, writes it back,
then reads until its end and prints how it ended. Also prints what the app sees of its
sockets: TCP options taken, TCP addresses."""
import socket
import struct
import sys

host, port = sys.argv[1], int(sys.argv[2])
srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
srv.bind((host, port))
srv.listen(5)
print("listening", srv.getsockname()[:2], flush=True)
conn, peer = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
print("conn 0", conn.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == srv.family,
      peer[0], conn.getsockname()[1], flush=True)
got = b""
try:
    while b := conn.recv(65536):
        got += b
    print("conn 0 read", got, "then EOF", flush=True)
except ConnectionResetError:
    print("conn 0 read", got, "then ECONNRESET", flush=True)
conn.close()
conn, peer = srv.accept()
print("conn 1 read", conn.recv(100), flush=True)
conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
conn.close()
conn, peer = srv.accept()
line = conn.recv(100)
conn.sendall(line)
try:
    end = "EOF" if conn.recv(100) == b"" else "more"
except ConnectionResetError:
    end = "ECONNRESET"
print("conn 2 read", line, "then", end, flush=True)
conn.close()
srv.close()
print("done", flush=True)
