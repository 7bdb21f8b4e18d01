"""A service in front of an engine process it starts, like a PySpark driver and its JVM.

The counter service of examples/kv_counter.py (INCR only), but the counts live in a child
process (the "engine") that the app starts at start-up and talks to over one private
loopback TCP connection under a lock, as py4j does with a JVM; the engine's port comes
back on a pipe. `LEAK <MB>` makes the engine take that much more memory and keep it (a
leak), so that a test can have the kernel's OOM killer take one replica's engine (a
memory cgroup around it alone). `RESTART` makes the app kill its engine itself (SIGKILL)
and start another, as a program does a child that hangs: its own doing, at every replica.
`RESTART helper` has a shell the app runs kill it (`sh -c "kill -9 PID"`), `RESTART self`
has the engine kill itself, `RESTART term` has the app send it SIGTERM: the app's doing
too. The engine handles SIGTERM as a JVM does: a shutdown of half a second in which it
answers every request with an error, then exit status 143. With `--launcher` the engine
runs behind a launcher process that waits for it (a wrapper script that does not exec):
it is the app's grandchild.

    python tests/programs/engine_app.py PORT [--launcher]
"""
import os
import random
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples"))
import kv_counter  # noqa: E402  (its connection loop)

ENGINE = r"""
import os, signal, socket, sys, threading
stopping = []
def shutdown(*_):
    # a JVM's on SIGTERM: its shutdown hooks run (a SparkContext stops, and every call
    # fails meanwhile), then it exits with status 143
    stopping.append(1)
    threading.Timer(0.5, os._exit, (143,)).start()
signal.signal(signal.SIGTERM, shutdown)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
f = conn.makefile("rwb")
counts, total, kept = {}, 0, []
for line in f:
    cmd, _, arg = line.decode().strip().partition(" ")
    if stopping:
        f.write(b"ERR shutting down\n")
    elif cmd == "INCR":
        counts[arg] = counts.get(arg, 0) + 1
        total += 1
        f.write(f"{counts[arg]} {total}\n".encode())
    elif cmd == "LEAK":
        kept.append(b"\1" * (int(arg) << 20))          # written: resident
        f.write(f"leaked {arg}\n".encode())
    elif cmd == "DIE":
        f.flush()
        os.kill(os.getpid(), 9)
    f.flush()
"""

lock = threading.Lock()


LAUNCHER = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1]]))"


def start_engine():
    argv = [sys.executable, "-c", ENGINE]
    if "--launcher" in sys.argv:
        argv = [sys.executable, "-c", LAUNCHER, ENGINE]
    engine = subprocess.Popen(argv, stdout=subprocess.PIPE)
    port = int(engine.stdout.readline())
    conn = socket.create_connection(("127.0.0.1", port))
    return {"engine": engine, "conn": conn, "f": conn.makefile("rwb")}


def main() -> int:
    state = start_engine()

    def ask(request: str) -> str:
        f = state["f"]
        f.write(request.encode() + b"\n")
        f.flush()
        answer = f.readline().decode().strip()
        if not answer:
            raise ConnectionError("the engine is gone")
        return answer

    def restart(how: str) -> str:
        """The app kills its own engine (as `subprocess.run(timeout=...)` does a child
        that hangs) and starts another: the counts start again. `how`: "" (the app's
        kill), "helper" (a shell's), "self" (the engine's own), "term" (the app's
        SIGTERM, which the engine handles)."""
        if how == "helper":
            subprocess.run(["sh", "-c", f"kill -9 {state['engine'].pid}"], check=True)
        elif how == "self":
            state["f"].write(b"DIE\n")
            state["f"].flush()
        elif how == "term":
            state["engine"].terminate()
        else:
            state["engine"].kill()
        status = state["engine"].wait()
        state["f"].close()
        state["conn"].close()
        state["engine"].stdout.close()
        state.update(start_engine())
        return f"restarted (the old engine's status {status})"

    def handle(line: str) -> str:
        cmd, _, arg = line.partition(" ")
        with lock:
            if cmd == "INCR" and arg:
                answer = ask(f"INCR {arg}")
                if answer.startswith("ERR"):
                    return f"ERR the engine said {answer!r}"
                n, g = answer.split()
                return f"OK {arg} {n} {g} {time.time()!r} {random.getrandbits(32):08x}"
            if cmd == "LEAK" and arg.isdigit():
                return "OK " + ask(f"LEAK {arg}")
            if cmd == "RESTART" and arg in ("", "helper", "self", "term"):
                return "OK " + restart(arg)
        return (f"ERR unknown request {line[:80]!r} "
                "(INCR key | LEAK MB | RESTART [helper|self|term])")

    kv_counter.serve_forever(int(sys.argv[1]), handle, name="engine_app")
    return 0


if __name__ == "__main__":
    sys.exit(main())
