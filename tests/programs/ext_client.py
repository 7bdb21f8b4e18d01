"""A client of an external TCP server (blocking socket with a timeout, so reads go
through poll): under replay the server is gone and the replies come from the trace."""
import select
import socket
import sys
import time

port = int(sys.argv[1])
sock = socket.create_connection(("127.0.0.1", port), timeout=5)
f = sock.makefile("rwb")
replies = []
for i in range(5):
    f.write(b"request-%d\n" % i)
    f.flush()
    replies.append(f.readline().decode().strip())
    time.sleep(0.001)
sock.sendall(b"bye\n")
ready, _, _ = select.select([sock], [], [], 5)     # select on an external socket
last = sock.recv(100) if ready else b"(nothing)"
f.close()
sock.close()
for r in replies:
    print(r)
print("last", last.decode().strip())
with open("client_out.txt", "w") as out:
    out.write("\n".join(replies) + "\n")
