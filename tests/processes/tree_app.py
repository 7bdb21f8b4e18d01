"""An application that starts a process tree, for tests/processes/test_no_leftovers.py.

    tree_app.py PORT [EXIT_WHEN_EXISTS]

It listens on PORT (the group's service port, as any replicated service does), starts
`sleep 1000` as its child, and a daemon that leaves its session and is orphaned at once
(`sh -c 'setsid sleep 1001 &'`: the shell exits, its setsid child lives on). It leaves a
temporary folder with a file in it (in its TMPDIR), as a killed Spark driver's JVM does
(`blockmgr-*`). With a path argument it exits (status 0) once that path exists;
otherwise it runs until killed.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen()
left = os.path.join(tempfile.mkdtemp(prefix="blockmgr-"), "shuffle_0_0.data")
with open(left, "w") as f:
    f.write("x" * 1000)
child = subprocess.Popen(["sleep", "1000"])
subprocess.run(["sh", "-c", "setsid sleep 1001 >/dev/null 2>&1 &"], check=True)
trigger = sys.argv[2] if len(sys.argv) > 2 else None
while trigger is None or not os.path.exists(trigger):
    time.sleep(0.05)                  # an app waiting for its end
sys.exit(0)
