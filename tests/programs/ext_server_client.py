"""The external client of ext_server.py (run by the test harness, outside the replica)."""
import socket, sys, time
port = int(sys.argv[1])
for _ in range(200):
    try:
        s = socket.create_connection(("127.0.0.1", port)); break
    except OSError:
        time.sleep(0.02)
f = s.makefile("rwb")
for i in range(3):
    f.write(b"hello-%d\n" % i); f.flush(); print(f.readline())
f.write(b"quit\n"); f.flush()
