"""Reads a child's stdout and stderr through pipes, the way subprocess.communicate and
test.support.script_helper do: which pipe is ready first and how much one read returns
are timing. Prints the sequence of reads (which pipe, how many bytes)."""
import os
import selectors
import subprocess
import sys
import time

CHILD = r"""
import sys, time
for i in range(40):
    f = sys.stdout if i % 3 else sys.stderr
    f.write("line %d\n" % i)
    f.flush()
    time.sleep(0.001)
"""
p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
sel = selectors.DefaultSelector()
sel.register(p.stdout, selectors.EVENT_READ, "out")
sel.register(p.stderr, selectors.EVENT_READ, "err")
reads, total = [], 0
while sel.get_map():
    for key, _ in sel.select():
        data = os.read(key.fd, 65536)
        if not data:
            sel.unregister(key.fileobj)
            continue
        reads.append("%s:%d" % (key.data, len(data)))
        sum(range(30000))   # some work: the child writes meanwhile
        total += len(data)
p.wait()
print(total, "bytes in", len(reads), "reads:", " ".join(reads))
out, err = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE).communicate()
print("communicate:", len(out), len(err), "at", time.time())
# system(): the shim starts the shell itself (native/notes/notes_hooks.h), as glibc would
print("system:", os.system("echo from-a-shell >/dev/null; exit 3"), "at", time.time())
