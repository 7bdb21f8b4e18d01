"""More short threads than the shim has logical thread ids (LLFT_MAX_THREADS, 1024): ids
of ended threads are reused (native/shim_threads.c). Waves of threads that read the clock,
draw random bytes and take a lock, all joined; plus daemon threads never joined (they end
on their own, or are still running at exit). Prints what the threads saw in the order
they logged it (differs between plain runs; identical under replay).

    python many_threads.py [THREADS]      # default 3000
"""
import hashlib
import os
import sys
import threading
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
WAVE = 7
log = []
log_lock = threading.Lock()
forever = threading.Event()


def short(i):
    t = time.monotonic_ns()
    r = os.urandom(4).hex()
    with log_lock:
        log.append(f"{i}:{r}:{t % 1000}")


def daemon(i, blocks):
    short(i)
    if blocks:
        forever.wait()   # still blocked when the process ends


daemons = 0
for w in range(0, N, WAVE):
    wave = [threading.Thread(target=short, args=(i,)) for i in range(w, min(N, w + WAVE))]
    for t in wave:
        t.start()
    if w % (WAVE * 50) == 0:
        threading.Thread(target=daemon, args=(-w - 1, daemons % 2), daemon=True).start()
        daemons += 1
    for t in wave:
        t.join()
with log_lock:
    lines = list(log)
print("threads", N, "daemons", daemons, "logged", len(lines))
print("order", hashlib.sha256(" ".join(lines).encode()).hexdigest()[:16])
print("first", " ".join(lines[:12]))
print("last", " ".join(lines[-12:]))
sys.stdout.flush()
