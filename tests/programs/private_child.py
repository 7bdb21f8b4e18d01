"""A private connection: a child process (part of the replica's process tree, like the
Spark JVM) serves on loopback; the program talks to it. Private sockets are real at
every replica and never recorded: under replay the child runs again for real."""
import socket, subprocess, sys, time, os
srv_code = r'''
import socket, sys, os
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
f = c.makefile("rwb")
for line in f:
    f.write(b"echo " + line); f.flush()
'''
p = subprocess.Popen([sys.executable, "-c", srv_code], stdout=subprocess.PIPE)
port = int(p.stdout.readline())
sock = socket.create_connection(("127.0.0.1", port), timeout=15)
f = sock.makefile("rwb", 65536)
out = []
for i in range(3):
    f.write(b"hello %d\n" % i); f.flush()
    out.append(f.readline())
f.close(); sock.close()
p.wait()
print(out, p.returncode, time.time())
