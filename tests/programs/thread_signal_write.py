"""One thread interrupts another's blocking write with a signal (test_socketserver's
test_write in small): the main thread writes 16 MB to a peer in the process; the peer's
thread reads 100 bytes, then pthread_kills the main thread until its handler has run.
How far the write had got is timing, and so is the moment the handler runs: a backup
must write no less and no more before it, and run the handler where the primary did.
Then the main thread signals itself (os.kill of its own pid): that signal comes back at
the same point everywhere and is not an input."""
import os, signal, socket, threading

SIZE = 16 * 1024 * 1024
interrupted = threading.Event()
log = []


def on_usr1(signum, frame):
    log.append("usr1")
    interrupted.set()


def on_usr2(signum, frame):
    log.append("usr2")


signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGUSR2, on_usr2)
server = socket.create_server(("127.0.0.1", 0))
main = threading.get_ident()
got = {}


def client():
    with socket.create_connection(server.getsockname()) as s, s.makefile("rb") as r:
        got["first"] = len(r.read(100))
        while True:
            signal.pthread_kill(main, signal.SIGUSR1)
            if interrupted.wait(timeout=1.0):
                break
        got["rest"] = len(r.read())


t = threading.Thread(target=client)
t.start()
conn, _ = server.accept()
conn.sendall(b"\0" * SIZE)
conn.close()
t.join()
os.kill(os.getpid(), signal.SIGUSR2)
print("received", got["first"] + got["rest"], "of", SIZE, "handlers", log)
