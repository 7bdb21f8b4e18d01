"""Ports the kernel chooses (bind to port 0) reach the program's output: ftplib's PASV
reply and PORT command carry them between its own threads (test_ftplib). A backup binds
to the primary's port, so it prints and sends the same digits."""
import socket, threading

tcp = socket.create_server(("127.0.0.1", 0))
anyaddr = socket.create_server(("", 0))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
ports = [s.getsockname()[1] for s in (tcp, anyaddr, udp)]


def serve():
    conn, _ = tcp.accept()
    with conn:
        conn.sendall(b"227 entering passive mode (127,0,0,1,%d,%d)\r\n" % divmod(ports[1], 256))


t = threading.Thread(target=serve)
t.start()
with socket.create_connection(tcp.getsockname()) as c:
    reply = c.makefile("rb").readline()
t.join()
print("ports", ports, "reply", reply)
