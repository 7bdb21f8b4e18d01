"""A UDP echo thread and a non-blocking client in the same process (asyncio's
sock_recvfrom right after sock_sendto, test_asyncio.test_sock_lowlevel): whether the echo
is already there when the client reads is timing. Prints how often it was."""
import socket
import threading

srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
srv.bind(("127.0.0.1", 0))


def echo():
    while True:
        data, peer = srv.recvfrom(100)
        if data == b"STOP":
            break
        srv.sendto(data, peer)


t = threading.Thread(target=echo)
t.start()
cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
cli.setblocking(False)
retries = 0
for i in range(50):
    cli.sendto(b"ping %d" % i, srv.getsockname())
    while True:
        try:
            data, _ = cli.recvfrom(100)
            break
        except BlockingIOError:   # not there yet: a little work, then again
            retries += 1
            socket.socket().close()
    assert data == b"ping %d" % i
cli.sendto(b"STOP", srv.getsockname())
t.join()
print("50 echoes;", retries, "reads found nothing yet")
