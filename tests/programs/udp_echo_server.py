"""An EXTERNAL UDP server for udp_client.py: answers each datagram with it and a random
token. Run: python udp_echo_server.py PORTFILE."""
import os
import socket
import sys

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    data, addr = s.recvfrom(2048)
    s.sendto(data + b" " + os.urandom(4).hex().encode(), addr)
