"""A threaded TCP counter server on the group's service port (group connection tests).
Run: python group_counter.py HOST PORT NCONNS
Accepts NCONNS connections, one thread each; every request line gets a reply with the
connection number, a shared counter and random.random() (both under a threading.Lock)
and time.time(): plain runs differ, replicas must not. A request `file:NAME` also echoes NAME's
content (a test changes it at a backup to provoke a divergence). Ends when every
connection is closed by its peer."""
import random
import socket
import sys
import threading
import time

host, port, nconns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((host, port))
srv.listen(16)
print("listening", srv.getsockname()[:2], flush=True)
lock = threading.Lock()
counter = 0


def serve(conn, idx):
    global counter
    f = conn.makefile("rwb")
    for line in f:
        req = line.strip().decode()
        with lock:   # random's generator is shared state too: drawn under the lock (an
            counter += 1   # unlocked race between threads is arbitrated by the GIL alone,
            c = counter    # which the determinizer does not order)
            r = random.random()
        extra = ""
        if req.startswith("file:"):
            with open(req[5:]) as fh:
                extra = fh.read().strip()
        f.write(f"{idx} {req} n={c} t={time.time():.6f} r={r:.6f} {extra}\n".encode())
        f.flush()
    f.close()
    conn.close()


threads = []
for i in range(nconns):
    conn, peer = srv.accept()
    print("accepted", i, peer[:2], conn.getpeername()[:2], conn.getsockname()[1], flush=True)
    t = threading.Thread(target=serve, args=(conn, i))
    t.start()
    threads.append(t)
for t in threads:
    t.join()
srv.close()
print("done", counter, flush=True)
