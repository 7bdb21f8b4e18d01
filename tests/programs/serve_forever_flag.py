"""socketserver's race in small (test_httpservers): serve_forever polls the flag that
shutdown() sets from another thread without a lock, so how many polls the server makes
is decided by the GIL's hand-offs. Prints what the server saw (differs between plain runs)."""
import random
import socket
import socketserver
import threading


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        self.wfile.write(self.rfile.readline().upper())


class Server(socketserver.ThreadingTCPServer):
    polls = 0

    def service_actions(self):   # called once per serve_forever poll
        Server.polls += 1


server = Server(("127.0.0.1", 0), Handler)
t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.001})
t.start()
replies = []
for i in range(20):
    with socket.create_connection(server.server_address) as c:
        c.sendall(b"hello %d\n" % i)
        replies.append(c.makefile("rb").readline())
    # work between requests while the server polls: a random amount (on an idle machine
    # a fixed amount let plain runs repeat the same poll count; replay fixes the draws),
    # in bytecode, so the GIL can pass to the server meanwhile (`sum(range(n))` is one C
    # call holding it: the server then polled only between requests, 2 per request).
    # The server gets the GIL mid-loop only after CPython's 5 ms switch interval, so the
    # amount spans 5 ms even on a fast machine (10 ns an iteration: 1-20 ms); 50k-250k
    # iterations took under 5 ms on a CI box, and 6 plain runs all printed "polls 39".
    for _ in range(random.randint(100_000, 2_000_000)):
        pass
server.shutdown()
t.join()
server.server_close()
print("replies", len(replies), replies[-1])
print("polls", Server.polls)
