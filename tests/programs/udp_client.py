"""A UDP client of an external server (sendto/recvfrom on an unconnected socket, with a
timeout so reads go through poll): under replay no datagram is sent or received."""
import socket
import sys

port = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
for i in range(4):
    s.sendto(b"ping-%d" % i, ("127.0.0.1", port))
    data, addr = s.recvfrom(1024)
    print(data.decode(), addr[0])
s.close()
