"""A thread-per-connection server (socketserver.ThreadingTCPServer) whose requests start
threads of their own: far more threads in the process's lifetime than the shim has
logical thread ids (LLFT_MAX_THREADS, 1024; ids of ended threads are reused).

    python thread_burst_server.py PORT

A request is one line "K": the connection's thread starts K short threads (each reads the
clock, draws random bytes, takes a lock) and joins them, then replies one line: the
number of threads started so far, and a digest of what the K threads saw in the order
they logged it (differs between plain runs; a replica's replies must be the primary's).
"""
import hashlib
import os
import socketserver
import sys
import threading
import time

lock = threading.Lock()
started = 0


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        global started
        for line in self.rfile:
            k = int(line)
            seen = []

            def short(i):
                r = f"{i}:{os.urandom(4).hex()}:{time.monotonic_ns() % 1000}"
                with lock:
                    seen.append(r)
            ts = [threading.Thread(target=short, args=(i,)) for i in range(k)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            with lock:
                started += k
                total = started
            digest = hashlib.sha256(" ".join(seen).encode()).hexdigest()[:16]
            self.wfile.write(f"{total} {digest}\n".encode())
            self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


with Server(("127.0.0.1", int(sys.argv[1])), Handler) as srv:
    print("listening", flush=True)
    srv.serve_forever()
