"""Threads contending on Lock, RLock, Condition, Semaphore, queue.Queue and Event, with
timeouts. The interleaving (who got the lock when, which waits timed out) is printed,
so it differs between plain runs and must be identical under replay.

As in the LLFT threading model, every data item shared by threads is protected by a
lock (here `log_lock` for the log): a race that only the GIL arbitrates is not
something a replica can reproduce (see the determinizer's limitations)."""
import queue
import sys
import threading
import time

N_WORKERS = 4
ROUNDS = 40

lock = threading.Lock()
rlock = threading.RLock()
cond = threading.Condition()
sem = threading.Semaphore(2)
q = queue.Queue(maxsize=3)
ev = threading.Event()
log = []
log_lock = threading.Lock()
shared = {"turn": 0, "items": 0}


def note(s):
    with log_lock:
        log.append(s)


def worker(i):
    for r in range(ROUNDS):
        with lock:
            with log_lock:
                log.append(f"L{i}")
        with rlock:
            with rlock:
                shared["items"] += i
        if sem.acquire(timeout=0.0005):
            note(f"S{i}")
            time.sleep(0.0001)
            sem.release()
        else:
            note(f"s{i}")
        try:
            q.put(f"{i}.{r}", timeout=0.001)
        except queue.Full:
            note(f"F{i}")
        with cond:
            if not cond.wait_for(lambda: shared["turn"] % N_WORKERS == i, timeout=0.0005):
                note(f"T{i}")
            shared["turn"] += 1
            cond.notify_all()
        if lock.acquire(blocking=False):
            note(f"t{i}")
            lock.release()


def consumer():
    got = 0
    while True:
        try:
            item = q.get(timeout=0.002)
        except queue.Empty:
            note("e")
            continue
        if item is None:
            break
        got += 1
        note("g" + item)
    note(f"consumed {got}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(N_WORKERS)]
c = threading.Thread(target=consumer)
c.start()
for t in threads:
    t.start()
for t in threads:
    t.join()
q.put(None)
c.join(timeout=5)
print("event", ev.wait(timeout=0.001))
print("items", shared["items"], "turn", shared["turn"])
print(" ".join(log))
print("log length", len(log))
sys.stdout.flush()
