"""A UDP server in a thread of the same process (logging's DatagramHandler tests, the
datagram servers of test_socketserver): the client's datagrams must really be sent at a
backup too, where the server is its own. Prints the replies and when they came."""
import socket
import threading
import time

srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
srv.bind(("127.0.0.1", 0))


def serve():
    for _ in range(3):
        data, peer = srv.recvfrom(100)
        srv.sendto(data.upper(), peer)


t = threading.Thread(target=serve)
t.start()
cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(3):
    cli.sendto(b"ping %d" % i, srv.getsockname())
    print(cli.recvfrom(100)[0], round(time.time() % 1000, 3))
t.join()
